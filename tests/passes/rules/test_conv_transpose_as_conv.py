"""ConvTransposeAsConv (passes/rules/conv_transpose_as_conv.py): a strided ConvTranspose
becomes one Conv over its output phases and a DepthToSpace. Four parts (fired; structure;
equal within the float dot-product bound on the reference target, against the
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
        ({"stride": 1}, "not one stride >= 2"),
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
