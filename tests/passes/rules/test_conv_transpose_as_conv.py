"""ConvTransposeAsConv (passes/rules/conv_transpose_as_conv.py): a strided ConvTranspose
becomes one Conv over its output phases and a DepthToSpace; ConvTransposeUnitStride: a
stride-1 ConvTranspose (groups, dilations) becomes one Conv. Four parts (fired;
structure; equal within the float dot-product bound on the reference target, against the
ConvTranspose and against float64; the verifier), one negative test per NoMatch reason,
and the quantize_static end: the upsampling runs in integer."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.conv_transpose_as_conv import ConvTransposeAsConvs
from tests.passes.helpers import assert_close, dot_tolerance, run_passes, run_ref

CI, CO = 17, 3


def proto(*, k: int = 2, stride: int | None = None, bias: bool = True, h: object = 5, w: object = 7, **attrs):
    rng = np.random.default_rng(11)
    wt = rng.standard_normal((CI, CO, k, k)).astype(np.float32)
    inits = [numpy_helper.from_array(wt, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(CO).astype(np.float32), "b"))
        ins.append("b")
    s = k if stride is None else stride
    node = helper.make_node(
        "ConvTranspose", ins, ["y"], name="up", strides=[s, s], kernel_shape=[k, k], **attrs
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, CI, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def feeds():
    return {"x": np.random.default_rng(5).standard_normal((2, CI, 5, 7)).astype(np.float32)}


def transposed(x, w, s, pads, op):
    """ConvTranspose by its definition (scatter each input pixel through the kernel), in
    float64: y[n, o, h·s + i − p_b, v·s + j − p_b'] += x[n, c, h, v]·w[c, o, i, j]."""
    n, _, h, v = x.shape
    k = w.shape[2]
    full = np.zeros((n, w.shape[1], (h - 1) * s + k + op[0], (v - 1) * s + k + op[1]))
    for i in range(k):
        for j in range(k):
            full[:, :, i : i + (h - 1) * s + 1 : s, j : j + (v - 1) * s + 1 : s] += np.einsum(
                "nchv,co->nohv", x, w[:, :, i, j]
            )
    oh = (h - 1) * s + k - pads[0] - pads[2] + op[0]
    ow = (v - 1) * s + k - pads[1] - pads[3] + op[1]
    return full[:, :, pads[0] : pads[0] + oh, pads[1] : pads[1] + ow]


def float64_reference(p, x, magnitude=False):
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in p.graph.initializer}
    node = p.graph.node[0]
    attrs = {a.name: list(a.ints) for a in node.attribute}
    s = attrs["strides"][0]
    pads, op = attrs.get("pads", [0, 0, 0, 0]), attrs.get("output_padding", [0, 0])
    w = inits["w"]
    if magnitude:
        return transposed(np.abs(x).astype(np.float64), np.abs(w), s, pads, op) + (
            np.abs(inits["b"])[None, :, None, None] if "b" in inits else 0
        )
    y = transposed(x.astype(np.float64), w, s, pads, op)
    if "b" in inits:
        y += inits["b"][None, :, None, None]
    return y


CASES = [  # (k, stride, pads, output_padding, Conv kernel it becomes)
    (2, 2, [0, 0, 0, 0], [0, 0], (1, 1)),  # YOLOv8-seg prototypes, DB heads
    (3, 3, [0, 0, 0, 0], [0, 0], (1, 1)),
    (4, 2, [1, 1, 1, 1], [0, 0], (3, 3)),  # U-Net / ViT dense-head decoders
    (3, 2, [1, 1, 1, 1], [1, 1], (2, 2)),  # "same" upsampling by 2 with output_padding
    (5, 3, [1, 2, 1, 0], [0, 0], (3, 2)),  # odd: pads differ per axis and side
]


@pytest.mark.parametrize(("k", "stride", "pads", "op", "conv_k"), CASES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dims", [(5, 7), ("H", "W")])
def test_strided_conv_transpose_becomes_conv_and_depth_to_space(k, stride, pads, op, conv_k, bias, dims):
    kw = {"pads": pads} if any(pads) else {}
    if any(op):
        kw["output_padding"] = op
    p = proto(k=k, stride=stride, bias=bias, h=dims[0], w=dims[1], **kw)
    model = load(p)
    result = run_passes(model, [ConvTransposeAsConvs()])
    assert result.fired("ConvTransposeAsConv") == 1
    assert model.graph.op_counts() == {"Conv": 1, "DepthToSpace": 1}
    conv = next(n for n in model.graph.nodes if n.op_type == "Conv")
    assert tuple(conv.attrs["kernel_shape"]) == conv_k
    f = feeds()
    got = run_ref(model, f)[0]
    exact = float64_reference(p, f["x"])
    assert got.shape == exact.shape
    tol = dot_tolerance(CI * conv_k[0] * conv_k[1], float64_reference(p, f["x"], magnitude=True))
    assert np.all(np.abs(got - exact) <= tol)
    assert_close(run_ref(p, f), [got], 2 * tol)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"k": 3, "stride": 2, "pads": [1, 1, 1, 1]}, "not a stride multiple"),
        ({"dilations": [2, 2]}, "dilations or groups"),
    ],
)
def test_refusals_name_the_reason_and_leave_the_graph(kw, reason):
    model = load(proto(**kw))
    rw = ConvTransposeAsConvs()
    result = run_passes(model, [rw])
    assert result.fired("ConvTransposeAsConv") == 0
    assert model.graph.op_counts() == {"ConvTranspose": 1}
    assert any(reason in r.reason for r in rw.no_matches())


@pytest.mark.parametrize(("k", "pads"), [(2, None), (4, [1, 1, 1, 1])])
def test_quantize_static_runs_the_upsampling_in_integer(tmp_path, k, pads):
    import quanta
    from quanta.ir.onnx_io import load as load_file
    from quanta.runtime.coverage import lowered_coverage

    p = proto(k=k, stride=2, **({"pads": pads} if pads else {}))
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((2, CI, 5, 7)).astype(np.float32)} for _ in range(4)]
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    src.write_bytes(p.SerializeToString())
    quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False)
    report = lowered_coverage(load_file(str(dst)))
    assert report.integer_share == 1.0
    f = feeds()
    y = quanta.InferenceSession(str(dst)).run(None, f)[0]
    assert y.shape == (2, CO, 10, 14)  # k=2 s=2 p=0 and k=4 s=2 p=1 both double the size
    exact = float64_reference(p, f["x"])
    assert np.corrcoef(exact.ravel(), y.ravel())[0, 1] > 0.99
    ort = pytest.importorskip("onnxruntime")
    y_ort = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, f)[0]
    assert np.corrcoef(exact.ravel(), y_ort.ravel())[0, 1] > 0.99


# --- stride 1: ConvTransposeUnitStride ------------------------------------------------


def grouped_proto(ci, co_g, kernel, group, *, dil=None, pads=None, op=None, bias=True, dims=None):
    """A stride-1 ConvTranspose over x[2, ci, *dims], weight [ci, co_g, *kernel]."""
    rng = np.random.default_rng(13)
    n = len(kernel)
    dims = dims or (6, 9, 5)[:n]
    inits = [numpy_helper.from_array(rng.standard_normal((ci, co_g, *kernel)).astype(np.float32), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(co_g * group).astype(np.float32), "b"))
        ins.append("b")
    attrs = {"strides": [1] * n, "group": group}
    if dil:
        attrs["dilations"] = dil
    if pads:
        attrs["pads"] = pads
    if op:
        attrs["output_padding"] = op
    node = helper.make_node("ConvTranspose", ins, ["y"], name="deconv", **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, ci, *dims])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def transposed_general(x, w, b, group, dil, pads, op, magnitude=False):
    """ConvTranspose at stride 1 by its definition, in float64, any rank, groups and
    dilations: y[n, G·C_o/g + o, Y + d·i − p_b] += x[n, G·C_i/g + c, Y]·w[G·C_i/g + c, o, i]."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    if magnitude:
        x, w, b = np.abs(x), np.abs(w), None if b is None else np.abs(b)
    n_sp = w.ndim - 2
    ci, cog = w.shape[:2]
    cig = ci // group
    kernel, dims = w.shape[2:], x.shape[2:]
    full_dims = [h + d * (k - 1) + o for h, d, k, o in zip(dims, dil, kernel, op, strict=True)]
    full = np.zeros((x.shape[0], cog * group, *full_dims))
    for tap in np.ndindex(*kernel):
        at = tuple(slice(d * i, d * i + h) for d, i, h in zip(dil, tap, dims, strict=True))
        for gi in range(group):
            xs = x[:, gi * cig : (gi + 1) * cig]
            ws = w[(slice(gi * cig, (gi + 1) * cig), slice(None), *tap)]
            full[(slice(None), slice(gi * cog, (gi + 1) * cog), *at)] += np.einsum("nc...,co->no...", xs, ws)
    crop = tuple(slice(pads[i], full_dims[i] - pads[n_sp + i]) for i in range(n_sp))
    y = full[(slice(None), slice(None), *crop)]
    return y if b is None else y + b.reshape(1, -1, *([1] * n_sp))


UNIT_CASES = [  # (C_i, C_o/g, kernel, group, dilations, pads, output_padding)
    (17, 3, (1, 1), 1, None, None, None),  # a 1x1 projection (GTCRN's point convs)
    (17, 1, (3, 3), 17, [5, 1], [6, 1, 6, 1], None),  # GTCRN's dilated depthwise deconv (crops)
    (6, 7, (3, 2), 3, [2, 1], [1, 0, 3, 1], None),  # groups of 2 -> 7, uneven pads
    (7, 3, (3, 3), 1, [2, 2], [0, 1, 2, 0], [1, 1]),  # output_padding (< dilation)
    (7, 3, (5,), 1, [3], [2, 5], None),  # 1-D
]


@pytest.mark.parametrize(("ci", "cog", "kernel", "group", "dil", "pads", "op"), UNIT_CASES)
@pytest.mark.parametrize("bias", [True, False])
def test_unit_stride_conv_transpose_becomes_conv(ci, cog, kernel, group, dil, pads, op, bias):
    p = grouped_proto(ci, cog, kernel, group, dil=dil, pads=pads, op=op, bias=bias)
    model = load(p)
    result = run_passes(model, [ConvTransposeAsConvs()])
    assert result.fired("ConvTransposeUnitStride") == 1
    assert model.graph.op_counts() == {"Conv": 1}
    conv = model.graph.nodes[0]
    assert conv.attrs["group"] == group
    n = len(kernel)
    x = np.random.default_rng(5).standard_normal((2, ci, *(6, 9, 5)[:n])).astype(np.float32)
    got = run_ref(model, {"x": x})[0]
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    args = (inits.get("b"), group, dil or [1] * n, pads or [0] * 2 * n, op or [0] * n)
    exact = transposed_general(x, inits["w"], *args)
    assert got.shape == exact.shape
    tol = dot_tolerance(
        ci // group * int(np.prod(kernel)), transposed_general(x, inits["w"], *args, magnitude=True)
    )
    assert np.all(np.abs(got - exact) <= tol)
    assert_close(run_ref(p, {"x": x}), [got], 2 * tol)


def test_unit_stride_refuses_pads_beyond_the_kernel():
    model = load(grouped_proto(7, 3, (3, 3), 1, pads=[3, 0, 0, 0]))
    rw = ConvTransposeAsConvs()
    result = run_passes(model, [rw])
    assert result.fired("ConvTransposeUnitStride") == 0
    assert model.graph.op_counts() == {"ConvTranspose": 1}
    assert any("the Conv's pads would be negative" in r.reason for r in rw.no_matches())


def test_quantize_static_grouped_conv_transposes(tmp_path):
    """A stride-1 depthwise ConvTranspose runs as an integer Conv; a strided grouped one
    (no rewrite: it stays a ConvTranspose) quantizes with one weight scale, since no
    per-output-channel weight scale exists for its bias (14 bias values against 7 weight
    channels per group)."""
    import quanta
    from quanta.ir.onnx_io import load as load_file
    from quanta.runtime.coverage import lowered_coverage

    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((14, 1, 3, 3)).astype(np.float32)  # depthwise, stride 1, dilated
    w2 = rng.standard_normal((14, 7, 1, 3)).astype(np.float32)  # group 2, strides (1, 2)
    nodes = [
        helper.make_node(
            "ConvTranspose", ["x", "w1", "b1"], ["h"], group=14, dilations=[2, 1], pads=[2, 1, 2, 1]
        ),
        helper.make_node(
            "ConvTranspose", ["h", "w2", "b2"], ["y"], group=2, strides=[1, 2], pads=[0, 1, 0, 1]
        ),
    ]
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(rng.standard_normal(14).astype(np.float32), "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(rng.standard_normal(14).astype(np.float32), "b2"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 14, 5, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    calib = [{"x": rng.standard_normal((1, 14, 5, 9)).astype(np.float32)} for _ in range(4)]
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    src.write_bytes(p.SerializeToString())
    quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False)
    q = load_file(str(dst))
    assert q.graph.op_counts().get("ConvTranspose") == 1
    report = lowered_coverage(q)
    macs_dw = 14 * 9 * 5 * 9  # the depthwise one's MACs, now a Conv's
    assert report.integer_macs == macs_dw
    f = {"x": rng.standard_normal((1, 14, 5, 9)).astype(np.float32)}
    exact = run_ref(p, f)[0]
    y = quanta.InferenceSession(str(dst)).run(None, f)[0]
    assert y.shape == exact.shape == (1, 14, 5, 17)
    assert np.corrcoef(exact.ravel(), y.ravel())[0, 1] > 0.99
    ort = pytest.importorskip("onnxruntime")
    y_ort = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, f)[0]
    assert np.corrcoef(exact.ravel(), y_ort.ravel())[0, 1] > 0.99


@pytest.mark.parametrize(("ci", "cog", "kernel", "group", "dil", "pads", "op"), UNIT_CASES[:4])
def test_float_sessions_run_a_unit_stride_conv_transpose_as_its_conv(ci, cog, kernel, group, dil, pads, op):
    """optimize_float rewrites a stride-1 ConvTranspose (ConvTransposeUnitStrides) and
    leaves a strided one; the session's output (native float Conv paths) is the float64
    ConvTranspose within the dot-product bound."""
    import quanta
    from quanta.passes.pipelines import optimize_float
    from quanta.passes.rules.conv_transpose_as_conv import ConvTransposeUnitStrides

    assert any(isinstance(p, ConvTransposeUnitStrides) for p in optimize_float())
    p = grouped_proto(ci, cog, kernel, group, dil=dil, pads=pads, op=op, bias=True)
    sess = quanta.InferenceSession(p.SerializeToString())
    assert [st.op_type for st in sess.plan.steps if "Conv" in st.op_type] in (["Conv"], ["ConvNchwc"])
    x = np.random.default_rng(9).standard_normal((2, ci, 6, 9)).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    args = (inits.get("b"), group, dil or [1, 1], pads or [0] * 4, op or [0, 0])
    exact = transposed_general(x, inits["w"], *args)
    mag = transposed_general(x, inits["w"], *args, magnitude=True)
    assert got.shape == exact.shape
    assert np.all(np.abs(got - exact) <= dot_tolerance(ci // group * int(np.prod(kernel)), mag))
    strided = quanta.InferenceSession(proto(k=2).SerializeToString())
    assert [st.op_type for st in strided.plan.steps] == ["ConvTranspose"]


def qdq_transpose_proto(k: int, pads: list[int], per_channel: bool, bias: bool, wz: int = 0):
    """DQ(x: uint8, zero point 131) -> ConvTranspose(DQ(w: int8), DQ(b: int32)?) {stride 2}
    -> Q (uint8, zero point 119) -> DQ: what ONNX Runtime's quantize_static writes for an
    upsampling ConvTranspose (per tensor by default, per output channel, axis 1, with
    ``per_channel``)."""
    co = 7
    rng = np.random.default_rng(5)
    wf = rng.standard_normal((CI, co, k, k)).astype(np.float32)
    if per_channel:
        ws = (np.abs(wf).transpose(1, 0, 2, 3).reshape(co, -1).max(1) / 120).astype(np.float32)
        wzs = np.full(co, wz, np.int8)
        wq = np.clip(np.round(wf / ws[None, :, None, None]) + wz, -128, 127).astype(np.int8)
        bs = (0.023 * ws).astype(np.float32)
    else:
        ws = np.float32(np.abs(wf).max() / 120)
        wzs = np.int8(wz)
        wq = np.clip(np.round(wf / ws) + wz, -128, 127).astype(np.int8)
        bs = np.float32(0.023 * ws)
    xs, xz, ys, yz = np.float32(0.023), np.uint8(131), np.float32(0.0917), np.uint8(119)
    inits = [
        numpy_helper.from_array(wq, "wq"),
        numpy_helper.from_array(np.asarray(ws), "ws"),
        numpy_helper.from_array(np.asarray(wzs), "wz"),
        numpy_helper.from_array(np.array(xs), "xs"),
        numpy_helper.from_array(np.array(xz), "xz"),
        numpy_helper.from_array(np.array(ys), "ys"),
        numpy_helper.from_array(np.array(yz), "yz"),
    ]
    axis = {"axis": 1} if per_channel else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], **axis),
    ]
    ins = ["xd", "wd"]
    if bias:
        bq = np.round(rng.standard_normal(co) * 3 / np.maximum(bs, 1e-12)).astype(np.int32).reshape(co)
        inits += [numpy_helper.from_array(bq, "bq"), numpy_helper.from_array(np.asarray(bs), "bs")]
        nodes.append(
            helper.make_node("DequantizeLinear", ["bq", "bs"], ["bd"], **({"axis": 0} if per_channel else {}))
        )
        ins.append("bd")
    nodes += [
        helper.make_node("ConvTranspose", ins, ["c"], strides=[2, 2], pads=pads, name="up"),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, CI, "h", "w"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(
    "k, pads, per_channel, bias, wz",
    [
        (2, [0, 0, 0, 0], False, True, 0),  # CenterFace's / PP-OCR DB's 2x2 upsampling
        (2, [0, 0, 0, 0], True, True, 0),  # per output channel
        (4, [1, 1, 1, 1], True, False, 0),  # a U-Net decoder's 4x4 / pad 1: zero taps
        (4, [1, 1, 1, 1], False, True, -3),  # zero taps at a non-zero weight zero point
    ],
)
def test_qdq_conv_transpose_lowers_to_an_integer_conv(k, pads, per_channel, bias, wz):
    """A quantized file's strided ConvTranspose runs as a QLinearConv over its output
    phases and an integer DepthToSpace: 100 % integer MACs, no fallback, within 1 LSB of
    ONNX Runtime. Before the rule it ran in float (no integer ConvTranspose kernel)."""
    import quanta
    from quanta.runtime.coverage import lowered_coverage

    p = qdq_transpose_proto(k, pads, per_channel, bias, wz)
    x = np.random.default_rng(9).standard_normal((2, CI, 5, 7)).astype(np.float32) * 1.5
    report = lowered_coverage(load(p), {"x": x.shape})
    assert report.integer_share == 1.0
    sess = quanta.InferenceSession(p.SerializeToString())
    assert sess.fallbacks == []
    got = sess.run(None, {"x": x})[0]
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert got.shape == want.shape == (2, 7, 10, 14)
    assert np.abs(want).max() > 10 * 0.0917  # many codes used
    assert np.max(np.abs(got - want)) <= 0.0917 * 1.0001  # within 1 LSB of the output
    ref = quanta.InferenceSession(p.SerializeToString(), backend="reference").run(None, {"x": x})[0]
    assert np.max(np.abs(ref - want)) <= 0.0917 * 1.0001


def test_qdq_conv_transpose_read_by_a_float_op_stays_a_conv_transpose():
    """The output read by something other than one QuantizeLinear: left alone (the
    refusal names why)."""
    p = qdq_transpose_proto(2, [0, 0, 0, 0], False, True)
    g = p.graph
    g.node.append(helper.make_node("Relu", ["c"], ["r"]))
    g.output.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    from quanta.passes.manager import PassManager
    from quanta.passes.rules.conv_transpose_as_conv import QdqConvTransposesAsConvs

    m = load(p)
    res = PassManager([QdqConvTransposesAsConvs()]).run(m)
    assert [n.op_type for n in m.graph.nodes].count("ConvTranspose") == 1
    assert any("one QuantizeLinear alone" in r.reason for r in res.no_matches)


# --- 1-D strided ConvTranspose: phases as channels, moved by Reshape / Transpose --------


def proto_1d(k: int, s: int, *, pads=None, op=None, bias=True, length: object = 23, co: int = 7):
    """A 1-D ConvTranspose over x[2, 17, length], weight [17, co, k], stride s (the
    upsampling necks of 1-D segmentation heads over signals)."""
    rng = np.random.default_rng(17)
    inits = [numpy_helper.from_array(rng.standard_normal((CI, co, k)).astype(np.float32), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "b"))
        ins.append("b")
    attrs = {"strides": [s], "kernel_shape": [k]}
    if pads:
        attrs["pads"] = pads
    if op:
        attrs["output_padding"] = op
    node = helper.make_node("ConvTranspose", ins, ["y"], name="up1d", **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, CI, length])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def transposed_1d(x, w, b, s, pads, op, magnitude=False):
    """1-D ConvTranspose by its definition, in float64: y[n, o, l·s + i − p_b] += x[n, c, l]·w[c, o, i]."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    if magnitude:
        x, w, b = np.abs(x), np.abs(w), None if b is None else np.abs(b)
    n, _, length = x.shape
    k = w.shape[2]
    full = np.zeros((n, w.shape[1], (length - 1) * s + k + op[0]))
    for i in range(k):
        full[:, :, i : i + (length - 1) * s + 1 : s] += np.einsum("ncl,co->nol", x, w[:, :, i])
    out = (length - 1) * s + k - pads[0] - pads[1] + op[0]
    y = full[:, :, pads[0] : pads[0] + out]
    return y if b is None else y + b[None, :, None]


CASES_1D = [  # (k, stride, pads, output_padding, Conv kernel it becomes)
    (5, 5, None, None, 1),  # OpenSpindleNet's segmentation neck: kernel = stride
    (2, 2, None, None, 1),
    (4, 2, [1, 1], None, 3),  # overlapping taps: zero taps in the phase kernel
    (3, 2, [1, 1], [1], 2),  # "same" upsampling by 2 with output_padding
    (7, 3, [3, 1], None, 3),  # odd: pads differ per side
]


@pytest.mark.parametrize(("k", "stride", "pads", "op", "conv_k"), CASES_1D)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("length", [23, "L"])
def test_strided_1d_conv_transpose_becomes_conv_and_moved_phases(k, stride, pads, op, conv_k, bias, length):
    p = proto_1d(k, stride, pads=pads, op=op, bias=bias, length=length)
    model = load(p)
    result = run_passes(model, [ConvTransposeAsConvs()])
    assert result.fired("ConvTransposeAsConv") == 1
    assert model.graph.op_counts() == {"Conv": 1, "Reshape": 2, "Transpose": 1}
    conv = next(n for n in model.graph.nodes if n.op_type == "Conv")
    assert list(conv.attrs["kernel_shape"]) == [conv_k]
    x = np.random.default_rng(5).standard_normal((2, CI, 23)).astype(np.float32)
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    args = (inits["w"], inits.get("b"), stride, pads or [0, 0], op or [0])
    got = run_ref(model, {"x": x})[0]
    exact = transposed_1d(x, *args)
    assert got.shape == exact.shape
    tol = dot_tolerance(CI * conv_k, transposed_1d(x, *args, magnitude=True))
    assert np.all(np.abs(got - exact) <= tol)
    assert_close(run_ref(p, {"x": x}), [got], 2 * tol)


@pytest.mark.parametrize(("k", "pads"), [(5, None), (4, [1, 1])])
def test_quantize_static_runs_the_1d_upsampling_in_integer(tmp_path, k, pads):
    """Before the 1-D form, quantize_static left these ConvTransposes float ("no integer
    kernel for ConvTranspose yet")."""
    import quanta
    from quanta.ir.onnx_io import load as load_file
    from quanta.runtime.coverage import lowered_coverage

    s = 5 if k == 5 else 2
    p = proto_1d(k, s, pads=pads, length="L")
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((2, CI, 23)).astype(np.float32)} for _ in range(4)]
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    src.write_bytes(p.SerializeToString())
    quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False)
    x = np.random.default_rng(6).standard_normal((2, CI, 23)).astype(np.float32)
    report = lowered_coverage(load_file(str(dst)), {"x": x.shape})
    assert report.integer_share == 1.0
    sess = quanta.InferenceSession(str(dst))
    assert sess.fallbacks == []
    y = sess.run(None, {"x": x})[0]
    assert y.shape == (2, 7, 23 * s)
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    exact = transposed_1d(x, inits["w"], inits["b"], s, pads or [0, 0], [0])
    assert np.corrcoef(exact.ravel(), y.ravel())[0, 1] > 0.99
    ort = pytest.importorskip("onnxruntime")
    y_ort = ort.InferenceSession(str(dst), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert np.corrcoef(exact.ravel(), y_ort.ravel())[0, 1] > 0.99


def qdq_transpose_1d_proto(k: int, s: int, pads: list[int], per_channel: bool, bias: bool, wz: int = 0):
    """ONNX Runtime's QDQ form of a 1-D strided ConvTranspose: uint8 activations (zero
    points 131 / 119), int8 weight per tensor or per output channel (axis 1), int32 bias."""
    co = 7
    rng = np.random.default_rng(8)
    wf = rng.standard_normal((CI, co, k)).astype(np.float32)
    if per_channel:
        ws = (np.abs(wf).transpose(1, 0, 2).reshape(co, -1).max(1) / 120).astype(np.float32)
        wzs = np.full(co, wz, np.int8)
        wq = np.clip(np.round(wf / ws[None, :, None]) + wz, -128, 127).astype(np.int8)
        bs = (0.023 * ws).astype(np.float32)
    else:
        ws = np.float32(np.abs(wf).max() / 120)
        wzs = np.int8(wz)
        wq = np.clip(np.round(wf / ws) + wz, -128, 127).astype(np.int8)
        bs = np.float32(0.023 * ws)
    inits = [
        numpy_helper.from_array(wq, "wq"),
        numpy_helper.from_array(np.asarray(ws), "ws"),
        numpy_helper.from_array(np.asarray(wzs), "wz"),
        numpy_helper.from_array(np.array(np.float32(0.023)), "xs"),
        numpy_helper.from_array(np.array(np.uint8(131)), "xz"),
        numpy_helper.from_array(np.array(np.float32(0.0917)), "ys"),
        numpy_helper.from_array(np.array(np.uint8(119)), "yz"),
    ]
    axis = {"axis": 1} if per_channel else {}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["wd"], **axis),
    ]
    ins = ["xd", "wd"]
    if bias:
        bq = np.round(rng.standard_normal(co) * 3 / np.maximum(bs, 1e-12)).astype(np.int32).reshape(co)
        inits += [numpy_helper.from_array(bq, "bq"), numpy_helper.from_array(np.asarray(bs), "bs")]
        nodes.append(
            helper.make_node("DequantizeLinear", ["bq", "bs"], ["bd"], **({"axis": 0} if per_channel else {}))
        )
        ins.append("bd")
    nodes += [
        helper.make_node("ConvTranspose", ins, ["c"], strides=[s], pads=pads, name="up1d"),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, CI, "l"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize(
    "k, s, pads, per_channel, bias, wz",
    [
        (5, 5, [0, 0], False, True, 0),  # kernel = stride, per tensor
        (5, 5, [0, 0], True, True, 0),  # per output channel
        (4, 2, [1, 1], True, False, 0),  # overlapping taps: zero taps
        (4, 2, [1, 1], False, True, -3),  # zero taps at a non-zero weight zero point
    ],
)
def test_qdq_1d_conv_transpose_lowers_to_an_integer_conv(k, s, pads, per_channel, bias, wz):
    """A quantized file's 1-D strided ConvTranspose runs as a QLinearConv over its output
    phases and integer views: 100 % integer MACs, no fallback, within 1 LSB of ONNX
    Runtime. Before the 1-D form it ran in float."""
    import quanta
    from quanta.runtime.coverage import lowered_coverage

    p = qdq_transpose_1d_proto(k, s, pads, per_channel, bias, wz)
    x = np.random.default_rng(9).standard_normal((2, CI, 23)).astype(np.float32) * 1.5
    report = lowered_coverage(load(p), {"x": x.shape})
    assert report.integer_share == 1.0
    sess = quanta.InferenceSession(p.SerializeToString())
    assert sess.fallbacks == []
    got = sess.run(None, {"x": x})[0]
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert got.shape == want.shape == (2, 7, 23 * s)
    assert np.abs(want).max() > 10 * 0.0917  # many codes used
    assert np.max(np.abs(got - want)) <= 0.0917 * 1.0001  # within 1 LSB of the output
    ref = quanta.InferenceSession(p.SerializeToString(), backend="reference").run(None, {"x": x})[0]
    assert np.max(np.abs(ref - want)) <= 0.0917 * 1.0001


# --- a strided 1-D ConvTranspose in a float graph: the 2-D one over a unit height -------


def grouped_1d_proto(
    ci: int, cog: int, k: int, s: int, group: int, *, dil=None, pads=None, op=None, opset=13
):
    """A strided 1-D ConvTranspose over x[2, ci, 'L'], weight [ci, cog, k], bias."""
    rng = np.random.default_rng(19)
    inits = [
        numpy_helper.from_array(rng.standard_normal((ci, cog, k)).astype(np.float32), "w"),
        numpy_helper.from_array(rng.standard_normal(cog * group).astype(np.float32), "b"),
    ]
    attrs = {"strides": [s], "group": group}
    if dil:
        attrs["dilations"] = dil
    if pads:
        attrs["pads"] = pads
    if op:
        attrs["output_padding"] = op
    node = helper.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="deconv1d", **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, ci, "L"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def transposed_strided(x, w, b, s, group, dil, pads, op, magnitude=False):
    """A 1-D ConvTranspose by its definition, in float64, with stride, groups and
    dilations: y[n, G·C_o/g + o, l·s + d·i − p_b] += x[n, G·C_i/g + c, l]·w[G·C_i/g + c, o, i]."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    if magnitude:
        x, w, b = np.abs(x), np.abs(w), np.abs(b)
    n, ci, length = x.shape
    cog, k = w.shape[1], w.shape[2]
    cig = ci // group
    full = np.zeros((n, cog * group, (length - 1) * s + dil * (k - 1) + 1 + op))
    for i in range(k):
        for gi in range(group):
            xs = x[:, gi * cig : (gi + 1) * cig]
            full[:, gi * cog : (gi + 1) * cog, dil * i : dil * i + (length - 1) * s + 1 : s] += np.einsum(
                "ncl,co->nol", xs, w[gi * cig : (gi + 1) * cig, :, i]
            )
    y = full[:, :, pads[0] : full.shape[2] - pads[1]]
    return y + b[None, :, None]


CASES_1D_FLOAT = [  # (C_i, C_o/g, k, stride, group, dilations, pads, output_padding)
    (17, 7, 5, 5, 1, None, None, None),  # OpenSpindleNet's neck: kernel = stride
    (17, 3, 4, 2, 1, None, [1, 2], [1]),  # overlapping taps, uneven pads, output_padding
    (6, 7, 3, 3, 3, [2], [1, 0], None),  # groups of 2 -> 7, dilated
]


@pytest.mark.parametrize(("ci", "cog", "k", "s", "group", "dil", "pads", "op"), CASES_1D_FLOAT)
@pytest.mark.parametrize("opset", [11, 13])
def test_strided_1d_conv_transpose_becomes_2d_over_a_unit_height(ci, cog, k, s, group, dil, pads, op, opset):
    from quanta.passes.rules.conv_transpose_as_conv import ConvTransposeAs2d

    p = grouped_1d_proto(ci, cog, k, s, group, dil=dil, pads=pads, op=op, opset=opset)
    model = load(p)
    result = run_passes(model, [ConvTransposeAs2d(opset)])
    assert result.fired("ConvTranspose1dAs2d") == 1
    assert model.graph.op_counts() == {"ConvTranspose": 1, "Squeeze": 1, "Unsqueeze": 1}
    deconv = next(n for n in model.graph.nodes if n.op_type == "ConvTranspose")
    assert list(deconv.attrs["strides"]) == [1, s]
    x = np.random.default_rng(4).standard_normal((2, ci, 11)).astype(np.float32)
    got = run_ref(model, {"x": x})[0]
    want = run_ref(p, {"x": x})[0]
    assert got.shape == want.shape
    np.testing.assert_array_equal(got, want)  # the same products in the same order


def test_1d_as_2d_refuses_stride_1_and_names_why():
    from quanta.passes.rules.conv_transpose_as_conv import ConvTransposeAs2d

    model = load(grouped_1d_proto(7, 3, 3, 1, 1))
    rw = ConvTransposeAs2d()
    run_passes(model, [rw])
    assert model.graph.op_counts() == {"ConvTranspose": 1}
    assert any("stride 1" in r.reason for r in rw.no_matches())


@pytest.mark.parametrize(("ci", "cog", "k", "s", "group", "dil", "pads", "op"), CASES_1D_FLOAT)
def test_float_sessions_run_a_strided_1d_conv_transpose_natively(ci, cog, k, s, group, dil, pads, op):
    """Before the rule the native float ConvTranspose refused rank-3 weights and the
    session fell back to the reference twin."""
    import quanta

    p = grouped_1d_proto(ci, cog, k, s, group, dil=dil, pads=pads, op=op)
    sess = quanta.InferenceSession(p.SerializeToString())
    assert sess.fallbacks == []
    x = np.random.default_rng(9).standard_normal((2, ci, 29)).astype(np.float32)
    got = sess.run(None, {"x": x})[0]
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    args = (inits["b"], s, group, (dil or [1])[0], pads or [0, 0], (op or [0])[0])
    exact = transposed_strided(x, inits["w"], *args)
    assert got.shape == exact.shape
    mag = transposed_strided(x, inits["w"], *args, magnitude=True)
    assert np.all(np.abs(got - exact) <= dot_tolerance(ci // group * k, mag))


def test_quantized_file_with_a_float_1d_conv_transpose_runs_it_natively():
    """ONNX Runtime's QOperator files keep a ConvTranspose float (float weight between
    DequantizeLinear and QuantizeLinear); lower_qdq gives a strided 1-D one the 2-D form,
    so the session has no fallback, within 1 LSB of ONNX Runtime."""
    import quanta

    rng = np.random.default_rng(12)
    w = rng.standard_normal((CI, 7, 5)).astype(np.float32) * 0.2
    inits = [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "b"),
        numpy_helper.from_array(np.array(np.float32(0.023)), "xs"),
        numpy_helper.from_array(np.array(np.uint8(131)), "xz"),
        numpy_helper.from_array(np.array(np.float32(0.0917)), "ys"),
        numpy_helper.from_array(np.array(np.uint8(119)), "yz"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
        helper.make_node("ConvTranspose", ["xd", "w", "b"], ["c"], strides=[5], name="up1d"),
        helper.make_node("QuantizeLinear", ["c", "ys", "yz"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "ys", "yz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, CI, "l"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    sess = quanta.InferenceSession(p.SerializeToString())
    assert sess.fallbacks == []
    x = np.random.default_rng(9).standard_normal((2, CI, 23)).astype(np.float32) * 1.5
    got = sess.run(None, {"x": x})[0]
    ort = pytest.importorskip("onnxruntime")
    want = ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert got.shape == want.shape == (2, 7, 115)
    assert np.abs(want).max() > 10 * 0.0917
    assert np.max(np.abs(got - want)) <= 0.0917 * 1.0001
