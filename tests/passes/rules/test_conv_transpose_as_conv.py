"""ConvTransposeAsConv (passes/rules/conv_transpose_as_conv.py): a ConvTranspose with
stride = kernel becomes a 1x1 Conv and a DepthToSpace. Four parts (fired; structure;
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


def float64_reference(p, x):
    inits = {i.name: numpy_helper.to_array(i).astype(np.float64) for i in p.graph.initializer}
    w = inits["w"]
    k = w.shape[2]
    y = np.einsum("nchw,coij->nohiwj", x.astype(np.float64), w)
    n, co, h, _, v, _ = y.shape
    y = y.reshape(n, co, h * k, v * k)
    if "b" in inits:
        y += inits["b"][None, :, None, None]
    return y


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dims", [(5, 7), ("H", "W")])
def test_stride_equal_kernel_becomes_conv1x1_and_depth_to_space(k, bias, dims):
    p = proto(k=k, bias=bias, h=dims[0], w=dims[1])
    model = load(p)
    result = run_passes(model, [ConvTransposeAsConvs()])
    assert result.fired("ConvTransposeAsConv") == 1
    assert model.graph.op_counts() == {"Conv": 1, "DepthToSpace": 1}
    f = feeds()
    got = run_ref(model, f)[0]
    exact = float64_reference(p, f["x"])
    inits = {i.name: numpy_helper.to_array(i) for i in p.graph.initializer}
    mag = np.einsum(
        "nchw,coij->nohiwj", np.abs(f["x"]).astype(np.float64), np.abs(inits["w"]).astype(np.float64)
    )
    mag = mag.reshape(exact.shape) + (np.abs(inits["b"])[None, :, None, None] if bias else 0)
    tol = dot_tolerance(CI, mag)
    assert np.all(np.abs(got - exact) <= tol)
    assert_close(run_ref(p, f), [got], 2 * tol)


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"stride": 1}, "are not the square kernel"),
        ({"pads": [1, 1, 1, 1]}, "pads or output_padding"),
        ({"output_padding": [1, 1]}, "pads or output_padding"),
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


def test_quantize_static_runs_the_upsampling_in_integer(tmp_path):
    import quanta
    from quanta.ir.onnx_io import load as load_file
    from quanta.runtime.coverage import lowered_coverage

    p = proto()
    rng = np.random.default_rng(2)
    calib = [{"x": rng.standard_normal((2, CI, 5, 7)).astype(np.float32)} for _ in range(4)]
    src, dst = tmp_path / "m.onnx", tmp_path / "q.onnx"
    src.write_bytes(p.SerializeToString())
    quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False)
    report = lowered_coverage(load_file(str(dst)))
    assert report.integer_share == 1.0
    f = feeds()
    y = quanta.InferenceSession(str(dst)).run(None, f)[0]
    assert y.shape == (2, CO, 10, 14)
    exact = float64_reference(p, f["x"])
    assert np.corrcoef(exact.ravel(), y.ravel())[0, 1] > 0.99
