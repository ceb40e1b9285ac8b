"""share_equal_initializers (quanta/ir/onnx_io.py): equal initializers become one, in
every scope that reads them, and the model computes the same bytes."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import share_equal_initializers


def _model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = rng.standard_normal((5, 7)).astype(np.float32)
    out = [helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 7])]
    then_branch = helper.make_graph([helper.make_node("Add", ["x", "w3"], ["b"])], "then", [], out)
    else_branch = helper.make_graph([helper.make_node("Sub", ["x", "w3"], ["b"])], "else", [], out)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["a", "w1"], ["x"]),
            helper.make_node("Add", ["x", "w2"], ["y"]),
            helper.make_node("If", ["flag"], ["z"], then_branch=then_branch, else_branch=else_branch),
            helper.make_node("Add", ["y", "z"], ["s"]),
            helper.make_node("Add", ["s", "w_other"], ["t"]),
        ],
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [3, 5]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, []),
        ],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3, 7])],
        [
            numpy_helper.from_array(w, "w1"),
            numpy_helper.from_array(w[:3], "w2"),  # equal to w3, not to w1 (its shape)
            numpy_helper.from_array(w[:3].copy(), "w3"),
            numpy_helper.from_array(w[:3] + 1, "w_other"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_equal_initializers_become_one_in_every_scope():
    model = _model()
    written = onnx.ModelProto()
    written.CopyFrom(model)
    assert share_equal_initializers(written) == 1
    assert [t.name for t in written.graph.initializer] == ["w1", "w2", "w_other"]
    onnx.checker.check_model(written, full_check=True)
    feeds = {"a": np.random.default_rng(4).standard_normal((3, 5)).astype(np.float32)}
    for flag in (True, False):
        f = {**feeds, "flag": np.array(flag)}
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, f
        )
        got = ort.InferenceSession(written.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, f
        )
        np.testing.assert_array_equal(got[0], want[0])
    assert share_equal_initializers(written) == 0


def test_a_weight_read_by_two_convolutions_is_written_once(tmp_path):
    """Two Convs of one weight on the same input range: their integer weights come out
    equal, and the file holds no two equal initializers."""
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((7, 3, 3, 3)) * 0.3).astype(np.float32)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
            helper.make_node("Conv", ["x", "w"], ["c2"], name="c2", pads=[1, 1, 1, 1], strides=[2, 2]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 17, 11])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("c1", "c2")],
        [numpy_helper.from_array(w, "w")],
    )
    src, out = tmp_path / "two.onnx", tmp_path / "two.int8.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    calib = [{"x": rng.standard_normal((1, 3, 17, 11)).astype(np.float32)} for _ in range(4)]
    quanta.quantize_static(src, out, calib, verbose=False, weight_rounding="nearest")
    inits = onnx.load(str(out)).graph.initializer
    keys = [
        (t.data_type, tuple(t.dims), hashlib.sha256(numpy_helper.to_array(t).tobytes()).digest())
        for t in inits
    ]
    assert len(keys) == len(set(keys))
    int8 = [t for t in inits if t.data_type == TensorProto.INT8 and len(t.dims) == 4]
    assert len(int8) == 1  # both Convs read it
    quanta.InferenceSession(str(out)).run(None, calib[0])
