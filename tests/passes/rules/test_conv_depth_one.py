"""ConvDepthOne (passes/rules/conv_depth_one.py): a 3-D Conv of kernel depth 1 over an
input of depth 1 (RivaGAN's frames [N, 3, 1, H, W]) becomes Squeeze -> 2-D Conv ->
Unsqueeze. Fired and structure; bit-equal to the 3-D Conv on the reference target; the
refusals; the float session runs it on the native 2-D kernel with no copy (a deeper 3-D
Conv takes the depth-window fold instead); a QDQ file's 3-D Conv (per-channel int8
weight, uint8 activations with non-zero zero points) lowers to an integer Conv within
1 LSB of ONNX Runtime; and quantize_static makes it an integer Conv."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.conv_depth_one import ConvDepthOneAs2d
from tests.passes.helpers import dot_tolerance, run_passes, run_ref

CI, CO, H, W = 7, 17, 9, 11


def proto(
    *,
    ci: int = CI,
    co: int = CO,
    group: int = 1,
    kernel=(1, 3, 5),
    depth: int = 1,
    h: object = H,
    w: object = W,
    opset: int = 13,
    bias: bool = True,
    **attrs,
):
    rng = np.random.default_rng(7)
    wt = rng.standard_normal((co, ci // group, *kernel)).astype(np.float32)
    inits = [numpy_helper.from_array(wt, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "b"))
        ins.append("b")
    node = helper.make_node(
        "Conv", ins, ["y"], name="conv3d", group=group, kernel_shape=list(kernel), **attrs
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, ci, depth, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def feeds(ci: int = CI, depth: int = 1, seed: int = 5):
    return {"x": np.random.default_rng(seed).standard_normal((2, ci, depth, H, W)).astype(np.float32)}


CASES = [  # (ci, co, group, kernel, attrs)
    (CI, CO, 1, (1, 3, 5), {"pads": [0, 1, 2, 0, 2, 1]}),
    (CI, CO, 1, (1, 1, 1), {}),
    (CI, CI, CI, (1, 3, 3), {"pads": [0, 2, 2, 0, 2, 2], "dilations": [3, 2, 2], "strides": [2, 1, 2]}),
    (6, 9, 3, (1, 3, 2), {"strides": [1, 2, 1], "pads": [0, 0, 1, 0, 1, 0]}),
    (CI, CO, 1, (1, 3, 3), {"auto_pad": "SAME_UPPER", "strides": [1, 2, 2]}),
]


@pytest.mark.parametrize(("ci", "co", "group", "kernel", "attrs"), CASES)
@pytest.mark.parametrize("opset", [11, 13])
@pytest.mark.parametrize("dims", [(H, W), ("h", "w")])
def test_depth_one_conv_becomes_a_2d_conv(ci, co, group, kernel, attrs, opset, dims):
    p = proto(ci=ci, co=co, group=group, kernel=kernel, opset=opset, h=dims[0], w=dims[1], **attrs)
    model = load(p)
    result = run_passes(model, [ConvDepthOneAs2d(opset)])
    assert result.fired("ConvDepthOne") == 1
    assert model.graph.op_counts() == {"Squeeze": 1, "Conv": 1, "Unsqueeze": 1}
    conv = next(n for n in model.graph.nodes if n.op_type == "Conv")
    assert list(conv.attrs["kernel_shape"]) == list(kernel[1:])
    squeeze = next(n for n in model.graph.nodes if n.op_type == "Squeeze")
    assert ("axes" in squeeze.attrs) == (opset < 13)  # the form the opset takes
    f = feeds(ci)
    want = run_ref(p, f)[0]
    got = run_ref(model, f)[0]
    assert got.shape == want.shape and got.shape[2] == 1
    # the same products in the same order: bit for bit on the reference target
    assert np.array_equal(got, want)


def _abs_model(p):
    """The same Conv with |w| and |b|: its output over |x| bounds Σ|x·w| + |b|."""
    q = type(p)()
    q.CopyFrom(p)
    for i, init in enumerate(q.graph.initializer):
        q.graph.initializer[i].CopyFrom(
            numpy_helper.from_array(np.abs(numpy_helper.to_array(init)), init.name)
        )
    return q


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"depth": 3}, "input depth is 3"),
        ({"kernel": (3, 3, 3), "pads": [1, 1, 1, 1, 1, 1]}, "not of depth 1"),
        ({"pads": [1, 1, 1, 0, 1, 1]}, "depth pads"),
    ],
)
def test_refusals_name_the_reason_and_leave_the_graph(kw, reason):
    model = load(proto(**kw))
    rw = ConvDepthOneAs2d()
    result = run_passes(model, [rw])
    assert result.fired("ConvDepthOne") == 0
    assert model.graph.op_counts() == {"Conv": 1}
    assert any(reason in r.reason for r in rw.no_matches())


def test_float_session_runs_it_natively():
    import quanta

    p = proto(pads=[0, 1, 2, 0, 1, 2], h="h", w="w", opset=10)
    f = feeds()
    sess = quanta.InferenceSession(p.SerializeToString())
    assert sess.fallbacks == []
    got = sess.run(None, f)[0]
    want = run_ref(p, f)[0]
    mag = run_ref(_abs_model(p), {"x": np.abs(f["x"])})[0].astype(np.float64)
    assert np.all(np.abs(got.astype(np.float64) - want) <= 2 * dot_tolerance(CI * 15 + 1, mag))


def qdq_proto():
    """DQ(x: uint8, zero point 131) -> Conv3D(DQ(w: int8 per output channel), b) -> Q (uint8,
    zero point 119) -> DQ: what ONNX Runtime's quantize_static writes for a 3-D Conv."""
    rng = np.random.default_rng(3)
    wf = rng.standard_normal((CO, CI, 1, 3, 5)).astype(np.float32)
    # weights on the 7-bit grid: ONNX Runtime's u8 x s8 kernel on a CPU without VNNI sums
    # product pairs in saturating int16 (docs/kernels.md "AVX2") and would not be the
    # reference this file's comparison uses there
    ws = (np.abs(wf).reshape(CO, -1).max(1) / 64).astype(np.float32)
    wq = np.clip(np.round(wf / ws[:, None, None, None, None]), -64, 64).astype(np.int8)
    xs, xz, ys, yz = np.float32(0.023), np.uint8(131), np.float32(0.171), np.uint8(119)
    bq = np.round(rng.standard_normal(CO) / (xs * ws)).astype(np.int32)
    inits = [
        numpy_helper.from_array(wq, "wq"),
        numpy_helper.from_array(ws, "ws"),
        numpy_helper.from_array(np.zeros(CO, np.int8), "wz"),
        numpy_helper.from_array(bq, "bq"),
        numpy_helper.from_array((xs * ws).astype(np.float32), "bs"),
        numpy_helper.from_array(np.array(xs), "xs"),
        numpy_helper.from_array(np.array(xz), "xz"),
        numpy_helper.from_array(np.array(ys), "ys"),
        numpy_helper.from_array(np.array(yz), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], axis=0),
        helper.make_node("DequantizeLinear", ["bq", "bs"], ["bd"], axis=0),
        helper.make_node("Conv", ["xd", "wd", "bd"], ["c"], kernel_shape=[1, 3, 5], pads=[0, 1, 2, 0, 1, 2]),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, CI, 1, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def test_qdq_depth_one_conv_lowers_to_an_integer_conv():
    import quanta
    from quanta.runtime.coverage import lowered_coverage

    p = qdq_proto()
    f = feeds()
    f["x"] *= 1.3
    sess = quanta.InferenceSession(p.SerializeToString())
    assert sess.fallbacks == []
    report = lowered_coverage(load(p), {"x": f["x"].shape})
    assert report.integer_share == 1.0
    got = sess.run(None, f)[0]
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)[0]
    assert got.shape == want.shape == (2, CO, 1, H, W)
    assert np.max(np.abs(got - want)) <= 0.171 * 1.0001  # within 1 LSB of the output


def test_quantize_static_makes_it_an_integer_conv(tmp_path):
    import quanta
    from quanta.ir.onnx_io import load as load_file
    from quanta.runtime.coverage import lowered_coverage

    p = proto(pads=[0, 1, 2, 0, 1, 2], opset=10)
    calib = [feeds(seed=s) for s in range(4)]
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    src.write_bytes(p.SerializeToString())
    quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False)
    report = lowered_coverage(load_file(str(dst)))
    assert report.integer_share == 1.0
    f = feeds(seed=9)
    sess = quanta.InferenceSession(str(dst))
    assert sess.fallbacks == []
    y = sess.run(None, f)[0]
    exact = run_ref(p, f)[0]
    assert y.shape == exact.shape == (2, CO, 1, H, W)
    assert np.corrcoef(exact.ravel(), y.ravel())[0, 1] > 0.99
    ort = pytest.importorskip("onnxruntime")
    y_ort = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, f)[0]
    assert np.corrcoef(exact.ravel(), y_ort.ravel())[0, 1] > 0.99


def test_ort_dynamic_conv_integer_of_depth_one_runs_natively(tmp_path):
    """ONNX Runtime's quantize_dynamic writes a 3-D Conv as a 3-D ConvInteger behind its
    dynamic input quantization (ReduceMin / ReduceMax / Floor ... Cast): it runs natively,
    every MAC integer, within float ulps of ORT."""
    ort = pytest.importorskip("onnxruntime")
    from onnxruntime.quantization import quantize_dynamic

    import quanta
    from quanta.runtime.coverage import lowered_coverage

    src, dst = tmp_path / "m.onnx", tmp_path / "d.onnx"
    src.write_bytes(proto(pads=[0, 1, 2, 0, 1, 2]).SerializeToString())
    quantize_dynamic(str(src), str(dst))
    f = feeds(seed=4)
    sess = quanta.InferenceSession(str(dst))
    assert sess.fallbacks == []
    assert lowered_coverage(load(str(dst)), {"x": f["x"].shape}).integer_share == 1.0
    got = sess.run(None, f)[0]
    want = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, f)[0]
    assert got.shape == want.shape == (2, CO, 1, H, W)
    # the same integer sums, scaled in float32: a few ulps of the largest output
    assert np.max(np.abs(got - want)) <= 1e-5 * np.max(np.abs(want))
