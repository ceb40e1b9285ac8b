"""StftAsConv (passes/rules/stft_as_conv.py): a real STFT with constant frame parameters
becomes a strided Conv by the windowed DFT basis (eq. (ST1)). Fired; structure; numerics
within eq. (FG1) of the float64 STFT over the float32 basis (K = the frame length) on the
native target; agreement with onnx.reference's STFT and ONNX Runtime's; the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.passes.rules.stft_as_conv import StftAsConvPass, stft_basis
from tests.passes.helpers import run_passes

U = 2.0**-24


def stft_proto(length: int, n: int, step: int, *, onesided: int = 1, window: str = "hann", batch: int = 1):
    inits = [numpy_helper.from_array(np.array(step, np.int64), "step")]
    inputs = ["x", "step"]
    if window == "none":
        inputs += ["", "len"]
        inits.append(numpy_helper.from_array(np.array(n, np.int64), "len"))
    else:
        w = np.hanning(n) if window == "hann" else np.random.default_rng(n).uniform(0.2, 1.0, n)
        inits.append(numpy_helper.from_array(w.astype(np.float32), "w"))
        inputs.append("w")
    g = helper.make_graph(
        [helper.make_node("STFT", inputs, ["y"], onesided=onesided, name="stft")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, length, 1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def stft64(x: np.ndarray, window: np.ndarray, step: int, bins: int):
    """The float64 STFT over the float32 basis (ST1), and the magnitudes Σ|x|·|basis| of (FG1)."""
    basis = stft_basis(window, bins)[:, 0, :].astype(np.float64)  # [2K, N]
    n = window.shape[0]
    frames = 1 + (x.shape[1] - n) // step
    idx = np.arange(frames)[:, None] * step + np.arange(n)[None, :]
    f = x[:, idx, 0].astype(np.float64)  # [B, F, N]
    y = (f @ basis.T).reshape(x.shape[0], frames, bins, 2)
    mag = (np.abs(f) @ np.abs(basis).T).reshape(x.shape[0], frames, bins, 2)
    return y, mag


@pytest.mark.parametrize(
    "length,n,step,onesided,window,batch",
    [
        (1600, 400, 160, 1, "hann", 1),  # 16 kHz speech framing
        (999, 64, 17, 0, "random", 2),  # two-sided, odd step, two signals
        (300, 25, 7, 1, "none", 1),  # odd frame length, no window (frame_length given)
        (512, 512, 1, 1, "hann", 1),  # one frame
    ],
)
def test_stft_is_a_conv_by_the_dft_basis_within_fg1(length, n, step, onesided, window, batch):
    proto = stft_proto(length, n, step, onesided=onesided, window=window, batch=batch)
    model = load(proto)
    assert run_passes(model, [StftAsConvPass()]).fired("StftAsConv") == 1
    assert [nd.op_type for nd in model.graph.nodes] == ["Reshape", "Conv", "Reshape", "Transpose"]
    x = np.random.default_rng(length).standard_normal((batch, length, 1)).astype(np.float32)
    w = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}.get("w", np.ones(n, np.float32))
    bins = n // 2 + 1 if onesided else n
    want, mag = stft64(x, w, step, bins)
    sess = quanta.InferenceSession(proto.SerializeToString())
    assert sess.fallbacks == []
    got = sess.run(None, {"x": x})[0]
    assert got.shape == want.shape
    assert np.all(np.abs(got - want) <= (n + 3) * U * mag)
    # onnx's own STFT (and ONNX Runtime's) agree to float32 rounding of the sums
    ref = quanta.InferenceSession(proto.SerializeToString(), backend="reference").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-4 * float(np.abs(want).max()))
    ort = pytest.importorskip("onnxruntime")
    y_ort = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(got, y_ort, rtol=0, atol=1e-4 * float(np.abs(want).max()))


def test_stft_refusals():
    proto = stft_proto(100, 16, 4)
    proto.graph.input[0].type.tensor_type.shape.dim[2].dim_value = 2  # a complex signal
    p = StftAsConvPass()
    model = load(proto)
    assert not run_passes(model, [p]).records[0].modified
    assert [r.reason for r in p.why_not("StftAsConv")] == [
        "not a real signal [B, L, 1] or [B, L] of known rank"
    ]
    short = stft_proto(10, 16, 4)  # a frame longer than the signal
    p = StftAsConvPass()
    assert not run_passes(load(short), [p]).records[0].modified
    assert "over a signal of 10" in p.why_not("StftAsConv")[0].reason


def stft_rank2_proto(length: int, n: int, step: int, *, window_input: bool = False):
    """torch.stft's opset-17 export: a real signal [B, L] (no trailing 1), a Hann window
    (an initializer, or a graph input) and frame_length."""
    inits = [
        numpy_helper.from_array(np.array(step, np.int64), "step"),
        numpy_helper.from_array(np.array(n, np.int64), "len"),
    ]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, length])]
    if window_input:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [n]))
    else:
        inits.append(numpy_helper.from_array(np.hanning(n).astype(np.float32), "w"))
    g = helper.make_graph(
        [helper.make_node("STFT", ["x", "step", "w", "len"], ["y"], onesided=1, name="stft")],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("window_input", [False, True])
def test_rank2_real_signal_runs_as_onnxruntime_does(window_input):
    """ONNX Runtime reads STFT(x[B, L]) as the real signal x[B, L, 1]; onnx.reference fails
    on it. A constant window: StftAsConv; a window fed at run time: the signal unsqueezed
    (StftRealSignal) and the reference STFT. Both equal ORT to float32 rounding."""
    length, n, step = 531, 20, 5  # Kokoro's generator: n_fft 20, hop 5
    proto = stft_rank2_proto(length, n, step, window_input=window_input)
    model = load(proto)
    fired = run_passes(model, [StftAsConvPass(17)])
    if window_input:
        assert fired.fired("StftRealSignal") == 1 and fired.fired("StftAsConv") == 0
        assert [nd.op_type for nd in model.graph.nodes] == ["Unsqueeze", "STFT"]
    else:
        assert fired.fired("StftAsConv") == 1
        assert [nd.op_type for nd in model.graph.nodes] == ["Reshape", "Conv", "Reshape", "Transpose"]
    rng = np.random.default_rng(length)
    feed = {"x": rng.standard_normal((2, length)).astype(np.float32)}
    if window_input:
        feed["w"] = rng.uniform(0.2, 1.0, n).astype(np.float32)
    w = feed.get("w", np.hanning(n).astype(np.float32))
    want, mag = stft64(feed["x"][..., None], w, step, n // 2 + 1)
    got = quanta.InferenceSession(proto.SerializeToString()).run(None, feed)[0]
    assert got.shape == want.shape == (2, 1 + (length - n) // step, n // 2 + 1, 2)
    if not window_input:  # the native Conv: eq. (FG1); onnx.reference's FFT has its own order
        assert np.all(np.abs(got - want) <= (n + 3) * U * mag)
    ort = pytest.importorskip("onnxruntime")
    y_ort = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feed
    )[0]
    np.testing.assert_allclose(got, y_ort, rtol=0, atol=1e-5 * float(np.abs(want).max()))


def dft_proto(shape, *, opset: int, onesided: int, length: int | None = None, axis: int | None = None):
    inputs, inits = ["x"], []
    if length is not None:
        inputs.append("L")
        inits.append(numpy_helper.from_array(np.array(length, np.int64), "L"))
    attrs = {"onesided": onesided}
    if opset >= 20:
        if axis is not None:
            inputs += [""] * (2 - len(inputs)) + ["axis"]
            inits.append(numpy_helper.from_array(np.array(axis, np.int64), "axis"))
    elif axis is not None:
        attrs["axis"] = axis
    g = helper.make_graph(
        [helper.make_node("DFT", inputs, ["y"], name="dft", **attrs)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize(
    "shape,opset,onesided,length,axis",
    [
        ((1, 400, 1), 17, 1, None, 1),  # torch.fft.rfft of a frame (DFT-17's default axis 1)
        ((2, 3, 63, 1), 17, 0, None, -2),  # odd length, two-sided, batch dims
        ((5, 100, 1), 20, 1, 128, None),  # DFT-20's axis input absent: -2; zero-padded to 128
        ((5, 100, 1), 20, 0, None, 1),
    ],
)
def test_real_dft_is_a_matmul_by_the_dft_basis(shape, opset, onesided, length, axis):
    proto = dft_proto(shape, opset=opset, onesided=onesided, length=length, axis=axis)
    model = load(proto)
    assert run_passes(model, [StftAsConvPass(opset)]).fired("DftAsMatMul") == 1
    assert [nd.op_type for nd in model.graph.nodes] == ["Reshape", "MatMul", "Reshape"]
    x = np.random.default_rng(sum(shape)).standard_normal(shape).astype(np.float32)
    size = length or shape[-2]
    bins = size // 2 + 1 if onesided else size
    basis = stft_basis(np.ones(shape[-2], np.float32), bins, size)[:, 0, :].astype(np.float64)
    sig = x[..., 0].astype(np.float64)
    want = (sig @ basis.T).reshape(*shape[:-2], bins, 2)
    mag = (np.abs(sig) @ np.abs(basis).T).reshape(*shape[:-2], bins, 2)
    sess = quanta.InferenceSession(proto.SerializeToString())
    assert sess.fallbacks == []
    got = sess.run(None, {"x": x})[0]
    assert got.shape == want.shape and np.all(np.abs(got - want) <= (shape[-2] + 3) * U * mag)
    ort = pytest.importorskip("onnxruntime")
    y_ort = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(got, y_ort, rtol=0, atol=1e-4 * float(np.abs(want).max()))


def test_dft_refusals():
    p = StftAsConvPass(17)
    inverse = dft_proto((1, 8, 1), opset=17, onesided=0)
    inverse.graph.node[0].attribute.append(helper.make_attribute("inverse", 1))
    assert not run_passes(load(inverse), [p]).records[0].modified
    assert [r.reason for r in p.why_not("DftAsMatMul")] == ["an inverse DFT"]
    p = StftAsConvPass(17)
    other_axis = dft_proto((4, 8, 1), opset=17, onesided=0, axis=0)
    assert not run_passes(load(other_axis), [p]).records[0].modified
    assert "not the one before the last" in p.why_not("DftAsMatMul")[0].reason
