"""ONNX Runtime's quantizer with int4 weights on a model of an ai.onnx opset before 21
writes every Q / DQ of the file as com.microsoft ops (ai.onnx Q / DQ take int4 from 21 on).
ONNX's shape inference has no schema for them: before the stand-ins of ``ir/stand_ins.py``
nothing after the first DQ had a type and the file failed to compile ("has no type to take
the element type from")."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.cli.bench import reference_steps
from quanta.ir.onnx_io import load

F32 = np.float32


def _contrib_int4_model(opset: int = 17) -> tuple[onnx.ModelProto, float]:
    """x (f32) -> Q/DQ u8 -> Conv(int4 per-channel weights, 7 outputs, odd kernel) + int32
    bias -> Q/DQ u8 -> Reshape -> Gemm(int4 weights, transB) -> Q/DQ u16 -> y; every Q / DQ
    in the com.microsoft domain, as ORT writes them."""
    rng = np.random.default_rng(11)
    inits = []

    def const(name, arr, dtype=None):
        if dtype is None:
            inits.append(numpy_helper.from_array(np.asarray(arr), name))
        else:  # 4-bit codes
            inits.append(
                helper.make_tensor(name, dtype, list(np.shape(arr)), np.asarray(arr).ravel().tolist())
            )
        return name

    ms = "com.microsoft"
    sx, zx = F32(5.0 / 255), np.uint8(131)
    wq = rng.integers(-8, 8, (7, 3, 3, 5))
    sw = rng.uniform(0.02, 0.06, 7).astype(F32)
    zw = np.zeros(7, np.int64)
    bias = rng.integers(-900, 900, 7).astype(np.int32)
    sh, zh = F32(9.0 / 255), np.uint8(17)
    gq = rng.integers(-8, 8, (17, 7 * 5 * 3))
    sg = rng.uniform(0.01, 0.03, 17).astype(F32)
    sy, zy = F32(30.0 / 65535), np.uint16(33001)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", const("sx", sx), const("zx", zx)], ["xq"], domain=ms),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], domain=ms),
        helper.make_node(
            "DequantizeLinear",
            [const("wq", wq, TensorProto.INT4), const("sw", sw), const("zw", zw, TensorProto.INT4)],
            ["wd"],
            domain=ms,
            axis=0,
        ),
        helper.make_node(
            "DequantizeLinear",
            [const("bq", bias), const("sb", (sx * sw).astype(F32)), const("zb", np.zeros(7, np.int32))],
            ["bd"],
            domain=ms,
            axis=0,
        ),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], pads=[1, 2, 1, 2]),
        helper.make_node("QuantizeLinear", ["c", const("sh", sh), const("zh", zh)], ["cq"], domain=ms),
        helper.make_node("DequantizeLinear", ["cq", "sh", "zh"], ["cd"], domain=ms),
        helper.make_node("Reshape", ["cd", const("shape", np.array([-1, 7 * 5 * 3], np.int64))], ["r"]),
        helper.make_node(
            "DequantizeLinear",
            [
                const("gq", gq, TensorProto.INT4),
                const("sg", sg),
                const("zg", np.zeros(17, np.int64), TensorProto.INT4),
            ],
            ["gd"],
            domain=ms,
            axis=0,
        ),
        helper.make_node("Gemm", ["r", "gd"], ["g"], transB=1),
        helper.make_node("QuantizeLinear", ["g", const("sy", sy), const("zy", zy)], ["gq16"], domain=ms),
        helper.make_node("DequantizeLinear", ["gq16", "sy", "zy"], ["y"], domain=ms),
    ]
    graph = helper.make_graph(
        nodes,
        "contrib_int4",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 5, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 17])],
        inits,
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(ms, 1)]
    )
    model.ir_version = 10
    return model, float(sy)


def _codes(model: onnx.ModelProto, name: str) -> np.ndarray:
    t = next(t for t in model.graph.initializer if t.name == name)
    return numpy_helper.to_array(t).astype(np.int64)


def test_contrib_qdq_values_get_types_through_the_stand_ins():
    model, _ = _contrib_int4_model()
    m = load(model)
    untyped = [o.name for n in m.graph.nodes for o in n.outputs if o is not None and o.type is None]
    assert untyped == []
    values = {v.name: v for n in m.graph.nodes for v in [*n.inputs, *n.outputs] if v is not None}

    def storage(name):
        e = values[name].type.elem
        return str(getattr(e, "storage", e))

    assert [storage(k) for k in ("cq", "gq16", "y", "wd", "c")] == ["u8", "u16", "f32", "f32", "f32"]
    assert values["cq"].shape == (2, 7, 5, 3) and values["gq16"].shape == (2, 17)
    # the 4-bit constants keep their type and codes (the 8-bit stand-ins live in the shadow only)
    assert storage("wq") == "i4" and values["wq"].shape == (7, 3, 3, 5)
    assert np.array_equal(np.asarray(values["wq"].const).astype(np.int64), _codes(model, "wq"))


def test_contrib_int4_file_compiles_runs_native_and_matches_ort():
    model, step = _contrib_int4_model()
    blob = model.SerializeToString()
    sess = quanta.InferenceSession(blob)
    assert not reference_steps(sess.plan)
    feed = {"x": np.random.default_rng(3).uniform(-2.4, 2.4, (2, 3, 5, 3)).astype(F32)}
    y = sess.run(None, feed)[0]
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(blob, providers=["CPUExecutionProvider"]).run(None, feed)[0]
    assert np.max(np.abs(o - y)) <= step * 1.0001
    assert len(np.unique(y)) > 20  # the output range is used
