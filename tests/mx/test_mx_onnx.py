"""MX models in ONNX (quanta/quantize/mx.py): the direct cast writes DequantizeLinear
with float8e8m0 scales and quanta::QuantizeMX (opset 24), or float32 scales and a
standard-operator QuantizeMX subgraph that ONNX Runtime runs (opset 21); quanta imports
both, types them (MX types), runs them, and writes them back."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import from_proto, to_proto
from quanta.ir.printer import format_graph
from quanta.ir.types import MXType, parse_elem
from quanta.ir.verify import Stage, VerifyError, verify
from quanta.kernels.reference import mx
from quanta.quantize.mx import quantize_mx_model


def _model(rng) -> onnx.ModelProto:
    """x [2, 5, 6, 6] -> Conv 5->7 (3x3, pad 1) -> depthwise Conv -> Flatten -> Gemm (transB)
    -> MatMul; every weight with odd sizes, reductions 45, 252 and 40 (short blocks)."""
    w1 = rng.standard_normal((7, 5, 3, 3)).astype(np.float32)
    dw = rng.standard_normal((7, 1, 3, 3)).astype(np.float32)
    g = rng.standard_normal((40, 252)).astype(np.float32) * 0.1
    m = rng.standard_normal((40, 9)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Conv", ["c1", "dw"], ["c2"], pads=[1, 1, 1, 1], group=7, name="dw"),
        helper.make_node("Flatten", ["c2"], ["f"]),
        helper.make_node("Gemm", ["f", "g", "gb"], ["h"], transB=1, name="gemm"),
        helper.make_node("MatMul", ["h", "m"], ["y"], name="mm"),
    ]
    graph = helper.make_graph(
        nodes,
        "mxnet",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 9])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(dw, "dw"),
            numpy_helper.from_array(g, "g"),
            numpy_helper.from_array(rng.standard_normal(40).astype(np.float32), "gb"),
            numpy_helper.from_array(m, "m"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize(
    "wt,at",
    [("mxint8", "mxint8"), ("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp4", "mxfp8_e4m3"), ("mxfp8_e5m2", None)],
)
def test_e8m0_form_is_valid_onnx_and_round_trips(wt, at):
    rng = np.random.default_rng(1)
    src = _model(rng)
    out, summary = quantize_mx_model(src, wt, at)
    onnx.checker.check_model(out, full_check=True)
    assert summary.quantized == ["conv1", "gemm", "mm"] and "dw" in summary.skipped
    model = from_proto(out)
    verify(model.graph, Stage.QDQ)
    text = format_graph(model.graph)
    w_elem = mx.mx_format(wt).name
    assert f"MX({w_elem}:f32, axis=1, block=32)" in text  # the Gemm's transposed weight
    assert f"MX({w_elem}:f32, axis=0, block=32)" in text  # the MatMul's
    if at is not None:
        assert "quanta::QuantizeMX" in text
    back = to_proto(model)
    onnx.checker.check_model(back, full_check=True)
    a = {t.name: numpy_helper.to_array(t) for t in out.graph.initializer}
    b = {t.name: numpy_helper.to_array(t) for t in back.graph.initializer}
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and np.array_equal(a[k].view(np.uint8), b[k].view(np.uint8)), k


def _fake_quant(src: onnx.ModelProto, wt: str | None, at: str | None, x: np.ndarray) -> np.ndarray:
    """The same network in float64 NumPy on golden-quantized operands."""
    W = {t.name: numpy_helper.to_array(t) for t in src.graph.initializer}

    def qd(v, fmt, axis):
        if fmt is None:
            return v.astype(np.float64)
        el, sc = mx.quantize_mx(v.astype(np.float32), fmt, axis=axis)
        return mx.dequantize_mx(el, sc, axis=axis).astype(np.float64)

    def conv(x, w, groups=1):
        N, C, H, Wd = x.shape
        n_out = w.shape[0]
        xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        y = np.zeros((N, n_out, H, Wd))
        cg = C // groups
        og = n_out // groups
        for gi in range(groups):
            for oy in range(H):
                for ox in range(Wd):
                    patch = xp[:, gi * cg : (gi + 1) * cg, oy : oy + 3, ox : ox + 3]
                    y[:, gi * og : (gi + 1) * og, oy, ox] = np.einsum(
                        "nchw,ochw->no", patch, w[gi * og : (gi + 1) * og]
                    )
        return y

    c1 = conv(qd(x, at, 1), qd(W["w1"], wt, 1)).astype(np.float32)
    c2 = conv(c1.astype(np.float64), W["dw"].astype(np.float64), groups=7).astype(np.float32)
    f = c2.reshape(2, -1)
    h = (qd(f, at, 1) @ qd(W["g"], wt, 1).T + W["gb"]).astype(np.float32)
    return qd(h, at, -1) @ qd(W["m"], wt, 0)


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("wt,at", [("mxint8", "mxint8"), ("mxfp8_e4m3", "mxfp8_e4m3"), ("mxfp4", "mxint8")])
def test_quanta_runs_the_e8m0_form(backend, wt, at):
    rng = np.random.default_rng(2)
    src = _model(rng)
    out, _ = quantize_mx_model(src, wt, at)
    x = rng.standard_normal((2, 5, 6, 6)).astype(np.float32)
    got = quanta.InferenceSession(out, backend=backend).run(None, {"x": x})[0]
    want = _fake_quant(src, wt, at, x)
    assert np.allclose(got, want, rtol=1e-4, atol=1e-3 * np.abs(want).max())


@pytest.mark.parametrize("mode", ["ocp", "ceil"])
@pytest.mark.parametrize("fmt", ["mxint8", "mxfp8_e4m3", "mxfp8_e5m2"])
@pytest.mark.parametrize("shape,axis_op", [((3, 77), "MatMul"), ((2, 35, 4, 3), "Conv")])
def test_float_scale_subgraph_is_bit_exact_in_onnxruntime_and_quanta(fmt, shape, axis_op, mode):
    # a model whose output is the dequantized activation: ORT and quanta both give the
    # golden dequantize(quantize(x)) exactly, ties and extremes included
    rng = np.random.default_rng(3)
    K = shape[-1] if axis_op == "MatMul" else shape[1]
    if axis_op == "MatMul":
        node = helper.make_node("MatMul", ["x", "w"], ["y"], name="op")
        w = numpy_helper.from_array(np.eye(K, dtype=np.float32), "w")
    else:
        node = helper.make_node("Conv", ["x", "w"], ["y"], name="op")
        w = numpy_helper.from_array(np.eye(K, dtype=np.float32).reshape(K, K, 1, 1), "w")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))],
        [w],
    )
    src = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    src.ir_version = 10
    out, _ = quantize_mx_model(src, None, fmt, form="float-scale", mode=mode)
    onnx.checker.check_model(out, full_check=True)
    # expose the dequantized activation as the output
    act = next(n for n in out.graph.node if n.name == "op").input[0]
    out.graph.output[0].name = act
    del out.graph.node[next(i for i, n in enumerate(out.graph.node) if n.name == "op")]
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-20, 20, shape))).astype(np.float32)
    f = mx.mx_format(fmt)
    xm = np.moveaxis(x, 1 if axis_op == "Conv" else -1, -1).copy()
    xm[..., :32] = 0.0  # an all-zero block (per row)
    top = min(K, 64)
    rows = xm.reshape(-1, K)
    rows[0, 33:top] = np.float32(2.0 ** (f.emax - 5)) * (np.arange(top - 33) + 0.5)  # ties under scale 2^0
    rows[0, 32] = np.float32(2.0**f.emax)
    x = np.ascontiguousarray(np.moveaxis(xm, -1, 1 if axis_op == "Conv" else -1))
    axis = 1 if axis_op == "Conv" else -1
    if mode == "ceil":  # blocks whose maximum lies past max_elem · 2^(e − emax) (eq. (MX3c))
        rows = np.moveaxis(x, axis, -1).reshape(-1, K)
        lim = np.float32(f.max_norm * 2.0**3)
        rows[1, :32] = lim * np.linspace(-1.0, 1.07, 32, dtype=np.float32)  # past the limit
        rows[2, :32] = lim * np.linspace(-1.0, 0.5, 32, dtype=np.float32)  # at it: no step
        x = np.ascontiguousarray(np.moveaxis(rows.reshape(np.moveaxis(x, axis, -1).shape), -1, axis))
    want = mx.dequantize_mx(*mx.quantize_mx(x, f, axis=axis, mode=mode), axis=axis)
    theirs = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert np.array_equal(theirs, want)
    ours = quanta.InferenceSession(out, backend="reference").run(None, {"x": x})[0]
    assert np.array_equal(ours, want)


def test_onnxruntime_runs_the_float_scale_form_of_a_network():
    rng = np.random.default_rng(4)
    src = _model(rng)
    out, _ = quantize_mx_model(src, "mxint8", "mxint8", form="float-scale")
    onnx.checker.check_model(out, full_check=True)
    x = rng.standard_normal((2, 5, 6, 6)).astype(np.float32)
    # ORT 1.32's graph optimizations (EXTENDED and above) run a blocked int8
    # DequantizeLinear along axis 0 feeding MatMul as MatMulNBits with int8 activations
    # (docs/quantization-math.md "MX in ONNX", (NB8-2)); BASIC runs every node as written,
    # ONNX's semantics, which a quanta session keeps under float_functions="onnx"
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    theirs = ort.InferenceSession(out.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    onnx_opts = quanta.SessionOptions(float_functions="onnx")
    ours = quanta.InferenceSession(out, onnx_opts, backend="native").run(None, {"x": x})[0]
    want = _fake_quant(src, "mxint8", "mxint8", x)
    scale = np.abs(want).max()
    assert np.allclose(theirs, want, rtol=1e-4, atol=1e-5 * scale)
    assert np.allclose(ours, want, rtol=1e-4, atol=1e-5 * scale)
    # the default session follows ONNX Runtime's rewrite: near ORT's own result, far from ONNX's
    ort_ext = ort.InferenceSession(out.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    ours_ort = quanta.InferenceSession(out, backend="native").run(None, {"x": x})[0]
    assert np.max(np.abs(ours_ort - ort_ext)) < 1e-6 * scale < 1e-3 * np.max(np.abs(ort_ext - want))


def test_quantize_static_takes_mx_types_without_calibration(tmp_path):
    rng = np.random.default_rng(5)
    src = _model(rng)
    path = tmp_path / "f.onnx"
    onnx.save(src, path)
    dst = tmp_path / "q.onnx"
    summary = quanta.quantize_static(
        path, dst, None, weight_type="mxfp8_e4m3", activation_type="mxfp8_e4m3", verbose=False
    )
    assert summary.quantized == ["conv1", "gemm", "mm"]
    q = onnx.load(dst)
    ops = [(n.domain, n.op_type) for n in q.graph.node]
    assert ("quanta", "QuantizeMX") in ops
    assert any(t.data_type == TensorProto.FLOAT8E8M0 for t in q.graph.initializer)


def test_types_parse_print_and_refuse():
    t = parse_elem("MX(f4e2m1fn:f32, axis=-1, block=32)")
    assert isinstance(t, MXType) and str(t) == "MX(f4e2m1fn:f32, axis=-1, block=32)"
    assert t.scale_shape((3, 70)) == (3, 3) and t.format == "mxfp4"
    with pytest.raises(ValueError, match="element type u8 is not an MX element type"):
        parse_elem("MX(u8:f32, axis=1, block=32)")
    with pytest.raises(ValueError, match="block size must be a positive integer, got 0"):
        parse_elem("MX(f8e4m3fn:f32, axis=1, block=0)")


def test_verifier_names_a_bad_mx_dequantize():
    w = np.zeros((64, 3), np.uint8)
    s = np.zeros((3, 3), np.uint8).view(ml_dtypes.float8_e8m0fnu)
    graph = helper.make_graph(
        [
            helper.make_node(
                "DequantizeLinear", ["w", "s"], ["y"], axis=0, block_size=32, output_dtype=1, name="dq"
            )
        ],
        "g",
        [],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 3])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(s, "s")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 24)])
    m = from_proto(model)
    with pytest.raises(VerifyError) as e:
        verify(m.graph, Stage.QDQ)
    msg = str(e.value)
    assert "input 'w' has element type u8, expected an MX element type" in msg
    assert "scale 's' has shape (3, 3), expected (2, 3)" in msg


def test_weights_held_by_constant_nodes_are_quantized():
    rng = np.random.default_rng(6)
    w = rng.standard_normal((40, 3)).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(w, "w")),
            helper.make_node("MatMul", ["x", "w"], ["y"], name="mm"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 40])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
    )
    src = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    src.ir_version = 10
    out, summary = quantize_mx_model(src, "mxint8", "mxint8")
    assert summary.quantized == ["mm"]
    onnx.checker.check_model(out, full_check=True)
    x = rng.standard_normal((2, 40)).astype(np.float32)
    got = quanta.InferenceSession(out, backend="reference").run(None, {"x": x})[0]
    wd = mx.dequantize_mx(*mx.quantize_mx(w, "i8", axis=0), axis=0).astype(np.float64)
    xd = mx.dequantize_mx(*mx.quantize_mx(x, "i8", axis=-1), axis=-1).astype(np.float64)
    assert np.allclose(got, xd @ wd, rtol=1e-5, atol=1e-5)


def test_overrides_give_chosen_nodes_their_own_mx_types():
    # MXINT8 islands in an MXFP8 model: conv1 MXINT8 w + a, mm float (None, None), the
    # Gemm keeps the defaults; both forms carry the same types, and quanta (e8m0 form)
    # and ONNX Runtime (float-scale form) compute the same values from them
    rng = np.random.default_rng(8)
    src = _model(rng)
    over = {"conv.*": ("mxint8", "mxint8"), "mm": (None, None)}
    outs = {}
    for form in ("e8m0", "float-scale"):
        out, summary = quantize_mx_model(src, "mxfp8_e4m3", "mxfp8_e4m3", form=form, overrides=over)
        assert summary.quantized == ["conv1", "gemm"]
        assert summary.skipped["mm"] == "float by overrides"
        onnx.checker.check_model(out, full_check=True)
        inits = {t.name: t for t in out.graph.initializer}
        by_out = {o: n for n in out.graph.node for o in n.output}
        nodes = {n.name: n for n in out.graph.node}
        w_elem = {k: inits[by_out[nodes[k].input[1]].input[0]].data_type for k in ("conv1", "gemm")}
        assert w_elem == {"conv1": TensorProto.INT8, "gemm": TensorProto.FLOAT8E4M3FN}
        assert list(nodes["mm"].input) == ["h", "m"]
        outs[form] = out
    x = rng.standard_normal((2, 5, 6, 6)).astype(np.float32)
    ours = quanta.InferenceSession(outs["e8m0"], backend="reference").run(None, {"x": x})[0]
    theirs = ort.InferenceSession(
        outs["float-scale"].SerializeToString(), providers=["CPUExecutionProvider"]
    ).run(None, {"x": x})[0]
    assert np.allclose(ours, theirs, rtol=1e-4, atol=1e-4 * np.abs(theirs).max())
    with pytest.raises(ValueError, match="MX type: unknown 'int3'"):
        quantize_mx_model(src, "mxint8", "mxint8", overrides={"mm": ("int3", None)})
