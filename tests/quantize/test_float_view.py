"""The float view of an already-quantized file (quanta.quantize.float_view).

A small float model built here (odd spatial shape, channel counts 3 / 7 / 17, a reduction
of 17 * 9 = 153 and a MatMul over 7 * 5 * 6 = 210 features) is quantized by ONNX Runtime's
tool (QDQ and QOperator, per channel and per tensor, int8 and uint8 weights: non-zero
weight zero points; its activations are uint8, non-zero zero points; and quantize_dynamic)
and by quanta. Its float view must:

- hold every weight within half a quantization step of the original (per channel where the
  file is per channel: a scale applied along the wrong axis fails this);
- compute what the original float model computes with the view's weights, to float32
  rounding (the activation quantization is gone, nothing else changed);
- pass onnx.checker and run in ONNX Runtime and quanta.
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType
from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic
from onnxruntime.quantization import quantize_static as ort_quantize_static

import quanta
from quanta.quantize.float_view import dequantize, derive_float_view, quantize

SHAPE = (2, 3, 11, 13)


def _float_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    # per-channel ranges that differ by 30x: a per-tensor scale would lose the small ones
    w1 = (
        rng.standard_normal((7, 3, 3, 3)).astype(np.float32)
        * np.geomspace(0.05, 1.5, 7).astype(np.float32)[:, None, None, None]
    )
    b1 = rng.standard_normal(7).astype(np.float32) * 0.1
    w2 = rng.standard_normal((17, 7, 3, 3)).astype(np.float32) * 0.2
    b2 = rng.standard_normal(17).astype(np.float32) * 0.1
    w3 = rng.standard_normal((17 * 5 * 6, 9)).astype(np.float32) * np.geomspace(0.01, 0.2, 9).astype(
        np.float32
    )
    b3 = rng.standard_normal(9).astype(np.float32)
    inits = [
        numpy_helper.from_array(w1, "w1"),
        numpy_helper.from_array(b1, "b1"),
        numpy_helper.from_array(w2, "w2"),
        numpy_helper.from_array(b2, "b2"),
        numpy_helper.from_array(w3, "w3"),
        numpy_helper.from_array(b3, "b3"),
        numpy_helper.from_array(np.array([SHAPE[0], -1], np.int64), "flat"),
        numpy_helper.from_array(np.zeros((), np.float32), "zero"),
        numpy_helper.from_array(np.array(6.0, np.float32), "six"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", strides=[2, 2]),
        # a Relu6 that the tools fold into the convolution's output grid
        helper.make_node("Clip", ["c2", "zero", "six"], ["k2"], name="relu6"),
        helper.make_node("Add", ["k2", "k2"], ["a2"], name="add2"),
        helper.make_node("Reshape", ["a2", "flat"], ["f"], name="flatten"),
        helper.make_node("MatMul", ["f", "w3"], ["m"], name="fc"),
        helper.make_node("Add", ["m", "b3"], ["y"], name="fc_bias"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(SHAPE))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [SHAPE[0], 9])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    # shifted: the input range is not symmetric, so zero points are not 128
    return [{"x": (rng.standard_normal(SHAPE) * 0.7 + 0.4).astype(np.float32)} for _ in range(n)]


class _Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def _ort(model: onnx.ModelProto | str, feed) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    src = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"]).run(None, feed)


CASES = {
    "ort_qdq_per_channel_s8": dict(
        quant_format=QuantFormat.QDQ, per_channel=True, weight_type=QuantType.QInt8
    ),
    "ort_qdq_per_tensor_u8": dict(
        quant_format=QuantFormat.QDQ, per_channel=False, weight_type=QuantType.QUInt8
    ),
    "ort_qop_per_channel_s8": dict(
        quant_format=QuantFormat.QOperator, per_channel=True, weight_type=QuantType.QInt8
    ),
    "ort_qop_per_tensor_u8": dict(
        quant_format=QuantFormat.QOperator, per_channel=False, weight_type=QuantType.QUInt8
    ),
    "ort_dynamic_s8": dict(dynamic=True, weight_type=QuantType.QInt8),
    "ort_dynamic_u8": dict(dynamic=True, weight_type=QuantType.QUInt8),
    "quanta": dict(quanta=True),
}


@pytest.fixture(scope="module", params=sorted(CASES))
def quantized(request, tmp_path_factory):
    return _make_quantized(request.param, tmp_path_factory.mktemp(request.param))


def _make_quantized(name: str, d) -> tuple:
    """(name, float model, quantized model, its path) for the tool setting CASES[name]."""
    opts = dict(CASES[name])
    src, out = str(d / "float.onnx"), str(d / "quantized.onnx")
    model = _float_model()
    onnx.save(model, src)
    if opts.pop("quanta", False):
        # nearest rounding: GPTQ moves weights by more than half a step, on purpose
        quanta.quantize_static(src, out, _feeds(8, 1), verbose=False, weight_rounding="nearest")
    elif opts.pop("dynamic", False):
        ort_quantize_dynamic(src, out, op_types_to_quantize=["Conv", "MatMul"], **opts)
    else:
        ort_quantize_static(src, out, _Reader(_feeds(8, 1)), activation_type=QuantType.QUInt8, **opts)
    return name, model, onnx.load(out), out


def _view_weight(view: onnx.ModelProto, node: str, k: int) -> np.ndarray:
    """Input ``k`` of the view's node named ``node`` (or ONNX Runtime's ``node_quant``),
    a constant."""
    inits = {t.name: numpy_helper.to_array(t) for t in view.graph.initializer}
    for n in view.graph.node:
        if n.name in (node, node + "_quant"):
            return inits[n.input[k]]
    raise AssertionError(f"{node} not in the view")


def test_weights_within_half_a_step(quantized):
    name, model, qmodel, _ = quantized
    view = derive_float_view(qmodel).model
    orig = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for node, w, axis in (("conv1", "w1", 0), ("conv2", "w2", 0), ("fc", "w3", 1)):
        got = _view_weight(view, node, 1)
        ref = orig[w]
        assert got.shape == ref.shape and got.dtype == np.float32, (name, node)
        # half a step: max|w| / 127 / 2 for symmetric int8, at most that for asymmetric
        chans = np.abs(np.moveaxis(ref, axis, 0).reshape(ref.shape[axis], -1)).max(axis=1)
        err_c = np.abs(np.moveaxis(got - ref, axis, 0).reshape(ref.shape[axis], -1)).max(axis=1)
        bound_c = chans / 254 * 1.001 + 1e-7
        bound_t = float(chans.max()) / 254 * 1.001 + 1e-7
        if "per_channel" in name or name == "quanta":
            # the small channels keep their own fine steps
            assert (err_c <= bound_c).all(), (name, node, err_c / bound_c)
        assert err_c.max() <= bound_t, (name, node, err_c.max(), bound_t)
        assert err_c.max() > 0, "the view holds the dequantized weight, not the original"


def test_view_computes_the_float_model_with_its_weights(quantized):
    name, model, qmodel, _ = quantized
    fv = derive_float_view(qmodel)
    view = fv.model
    onnx.checker.check_model(view, full_check=True)
    assert not {n.op_type for n in view.graph.node} & {
        "QuantizeLinear",
        "DequantizeLinear",
        "QLinearConv",
        "QLinearMatMul",
        "MatMulInteger",
        "ConvInteger",
        "DynamicQuantizeLinear",
    }, (name, fv.format())
    assert not fv.kept
    # the original float model with the view's weights (and biases)
    ref = onnx.ModelProto()
    ref.CopyFrom(model)
    inits = {t.name: t for t in ref.graph.initializer}
    for node, k, w in (("conv1", 1, "w1"), ("conv2", 1, "w2"), ("fc", 1, "w3")):
        inits[w].CopyFrom(numpy_helper.from_array(_view_weight(view, node, k), w))
    for node, b in (("conv1", "b1"), ("conv2", "b2"), ("fc_bias", "b3")):
        try:
            inits[b].CopyFrom(
                numpy_helper.from_array(_view_weight(view, node, 1 if node == "fc_bias" else 2), b)
            )
        except (AssertionError, IndexError, KeyError):
            pass  # dynamic files add the bias in float: it is the original
    for feed in _feeds(3, 5):
        want = _ort(ref, feed)[0]
        got = _ort(view, feed)[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
        # quanta runs the view and computes the same
        np.testing.assert_allclose(
            quanta.InferenceSession(view.SerializeToString()).run(None, feed)[0],
            want,
            rtol=1e-4,
            atol=1e-4 * float(np.abs(want).max()),
        )


def test_view_is_the_float_model_up_to_weight_rounding(quantized):
    """The view differs from the original float model by the weights' rounding only
    (a few percent of the output range here), and runs like the file in ONNX Runtime."""
    name, model, qmodel, path = quantized
    view = derive_float_view(qmodel).model
    for feed in _feeds(2, 9):
        want = _ort(model, feed)[0]
        q = _ort(path, feed)[0]
        f = _ort(view, feed)[0]
        assert q.shape == f.shape
        assert float(np.abs(f - want).max()) < 0.05 * float(np.abs(want).max()), name


def test_dequantize_per_axis_and_block():
    q = np.arange(-6, 15, dtype=np.int8).reshape(3, 7)
    s = np.array([0.5, 0.25, 2.0], np.float32)
    z = np.array([1, -3, 0], np.int8)
    np.testing.assert_array_equal(
        dequantize(q, s, z, axis=0), (q.astype(np.float32) - z[:, None]) * s[:, None]
    )
    sb = np.array(
        [[0.5, 1.0, 3.0], [2.0, 0.125, 1.0], [1.0, 1.0, 0.25]], np.float32
    )  # blocks of 3 along axis 1
    want = q.astype(np.float32) * np.repeat(sb, 3, axis=1)[:, :7]
    np.testing.assert_array_equal(dequantize(q, sb, None, axis=1, block_size=3), want)
    x = np.array([[-1.0, 0.26, 300.0], [0.74, -0.25, 2.5]], np.float32)
    s2 = np.array([0.5, 0.25, 2.0], np.float32)
    zp = np.array([3, 0, -1], np.int8)
    # round half to even, then saturate to int8
    np.testing.assert_array_equal(quantize(x, s2, zp, axis=1), np.array([[1, 1, 127], [4, -1, 0]], np.int8))


def test_float_model_unchanged():
    model = _float_model()
    fv = derive_float_view(model)
    assert [n.op_type for n in fv.model.graph.node] == [n.op_type for n in model.graph.node]
    assert fv.dequantized_weights == 0 and fv.dropped_pairs == 0 and not fv.mapped


def test_debug_against_the_derived_reference(quantized):
    """``compare(None, quantized, data)``: the file's own float view is the reference;
    every quantized node is matched, and the error measured is the activation
    quantization's alone (the weights' rounding is in both)."""
    from quanta.debug.compare import compare

    name, model, _, path = quantized
    derived = compare(None, path, _feeds(3, 11))
    assert derived.reference.startswith("derived from the quantized file itself"), name
    assert "reference: derived" in derived.format()
    assert not derived.unmatched, (name, derived.unmatched)
    assert derived.nodes, name
    assert 15 < derived.output_sqnr_db < 80, name
    full = compare(model, path, _feeds(3, 11))
    assert full.reference == ""
    assert [r.name for r in full.nodes] == [r.name for r in derived.nodes]


def _activation_params(model: onnx.ModelProto) -> dict[str, tuple[float, int]]:
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    out = {}
    for n in model.graph.node:
        if n.op_type == "QuantizeLinear" and n.input[0] not in inits and n.input[1] in inits:
            zp = int(inits[n.input[2]].reshape(-1)[0]) if len(n.input) > 2 else 0
            out[n.input[0]] = (float(inits[n.input[1]].reshape(-1)[0]), zp)
    return out


def test_quantize_static_on_the_quantized_file(quantized, tmp_path):
    """quantize_static on the file (no refusal): a valid model that ONNX Runtime and quanta
    both run; every activation quanta quantizes that the file quantized keeps the file's
    scale (to float rounding) and zero point; the summary says the input was quantized."""
    name, model, qmodel, path = quantized
    out = tmp_path / "requantized.onnx"
    summary = quanta.quantize_static(path, out, _feeds(6, 2), verbose=False)
    text = summary.format()
    assert "already quantized" in text and "float view" in text, text
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    view = derive_float_view(qmodel)
    mine = _activation_params(written)
    kept = [k for k in view.activation_params if k in mine]
    if "dynamic" not in name:
        assert kept, (name, sorted(view.activation_params), sorted(mine))
    producer = {o: n.op_type for n in view.model.graph.node for o in n.output}
    views = {"Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "Identity"}
    for k in kept:
        if producer.get(k) in views:
            continue  # quanta gives a view its input's grid: one of the two grids the file had
        s, z, _ = view.activation_params[k]
        assert mine[k][1] == z and abs(mine[k][0] - s) <= 1e-6 * s, (name, k, mine[k], (s, z))
    for feed in _feeds(2, 4):
        a = _ort(str(out), feed)[0]
        b = quanta.InferenceSession(str(out)).run(None, feed)[0]
        want = _ort(model, feed)[0]
        np.testing.assert_allclose(b, a, atol=0.02 * float(np.abs(a).max()))
        # the file's grids clip where the file clips: its own error bounds the new file's
        file_err = float(np.abs(_ort(path, feed)[0] - want).max())
        assert float(np.abs(a - want).max()) <= max(2 * file_err, 0.05 * float(np.abs(want).max())), name


def test_quantize_dynamic_on_the_quantized_file(quantized, tmp_path):
    """quantize_dynamic on the file (no refusal): a valid dynamic model that ONNX Runtime
    and quanta both run, with integer weights and DynamicQuantizeLinear (no activation
    grid of the file kept); its error from the float model is of the file's own size;
    the summary says the input was quantized."""
    name, model, _, path = quantized
    out = tmp_path / "dynamic.onnx"
    summary = quanta.quantize_dynamic(path, out, verbose=False)
    text = summary.format()
    assert "already quantized" in text and "dynamically" in text, text
    assert summary.quantized, name
    written = onnx.load(out)
    onnx.checker.check_model(written, full_check=True)
    ops = {n.op_type for n in written.graph.node}
    assert "DynamicQuantizeLinear" in ops and "QuantizeLinear" not in ops, (name, sorted(ops))
    for feed in _feeds(2, 4):
        a = _ort(str(out), feed)[0]
        b = quanta.InferenceSession(str(out)).run(None, feed)[0]
        want = _ort(model, feed)[0]
        scale = float(np.abs(want).max())
        np.testing.assert_allclose(b, a, atol=0.02 * scale)
        file_err = float(np.abs(_ort(path, feed)[0] - want).max())
        assert float(np.abs(a - want).max()) <= max(2 * file_err, 0.05 * scale), name


def test_quantizing_a_quantized_file_never_overwrites_it(tmp_path):
    """The float view no longer knows its source path: both entry points refuse the
    input's own path as the output, and the file is unchanged."""
    _, _, _, path = _make_quantized("ort_qdq_per_tensor_u8", tmp_path)
    before = open(path, "rb").read()
    with pytest.raises(FileExistsError, match="refusing to overwrite the input model"):
        quanta.quantize_dynamic(path, path, verbose=False)
    with pytest.raises(FileExistsError, match="refusing to overwrite the input model"):
        quanta.quantize_static(path, path, _feeds(4, 2), verbose=False)
    assert open(path, "rb").read() == before


def test_quantize_static_can_recalibrate_the_file(tmp_path):
    _, _, _, path = _make_quantized("ort_qdq_per_tensor_u8", tmp_path)
    out = tmp_path / "recalibrated.onnx"
    summary = quanta.quantize_static(path, out, _feeds(6, 2), verbose=False, keep_file_parameters=False)
    assert any("ignored" in n for n in summary.notes)
    onnx.checker.check_model(onnx.load(out), full_check=True)


def _lstm_model() -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    hidden, inp = 7, 5
    # gate columns with ranges that differ: a scale along the wrong axis fails the bound
    w = (
        rng.standard_normal((2, 4 * hidden, inp)) * np.geomspace(0.05, 1.0, 4 * hidden)[None, :, None]
    ).astype(np.float32)
    r = (rng.standard_normal((2, 4 * hidden, hidden)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((2, 8 * hidden)) * 0.1).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node(
                "LSTM",
                ["x", "W", "R", "B"],
                ["y"],
                name="lstm",
                hidden_size=hidden,
                direction="bidirectional",
            )
        ],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [9, 3, inp])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [9, 2, 3, hidden])],
        [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R"), numpy_helper.from_array(b, "B")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("tool", ["ort", "quanta"])
def test_dynamic_lstm_view(tool, tmp_path):
    """DynamicQuantizeLSTM -> LSTM: weights back in ONNX's [D, 4H, I] layout, within half
    a step of the original per gate column; the view computes the float LSTM with them."""
    model = _lstm_model()
    src, out = str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx")
    onnx.save(model, src)
    rng = np.random.default_rng(4)
    feeds = [{"x": rng.standard_normal((9, 3, 5)).astype(np.float32)} for _ in range(3)]
    if tool == "ort":
        ort_quantize_dynamic(src, out, op_types_to_quantize=["LSTM"], per_channel=True)
    else:
        quanta.quantize_static(src, out, feeds, verbose=False)
    q = onnx.load(out)
    assert "DynamicQuantizeLSTM" in {n.op_type for n in q.graph.node}
    fv = derive_float_view(q)
    assert fv.mapped == {"DynamicQuantizeLSTM": 1} and not fv.kept
    onnx.checker.check_model(fv.model, full_check=True)
    lstm = next(n for n in fv.model.graph.node if n.op_type == "LSTM")
    inits = {t.name: numpy_helper.to_array(t) for t in fv.model.graph.initializer}
    orig = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    for k, name in ((1, "W"), (2, "R")):
        got, ref = inits[lstm.input[k]], orig[name]
        assert got.shape == ref.shape
        bound = np.abs(ref).max(axis=2, keepdims=True) / 254 * 1.001 + 1e-7  # per gate column
        assert (np.abs(got - ref) <= bound).all(), name
    ref_model = onnx.ModelProto()
    ref_model.CopyFrom(model)
    for t in ref_model.graph.initializer:
        if t.name in ("W", "R"):
            t.CopyFrom(numpy_helper.from_array(inits[lstm.input[1 if t.name == "W" else 2]], t.name))
    for feed in feeds:
        want = _ort(ref_model, feed)[0]
        np.testing.assert_allclose(_ort(fv.model, feed)[0], want, rtol=1e-5, atol=1e-6)


def test_cli_quantize_on_a_quantized_file(tmp_path, capsys):
    from quanta.cli.main import main

    _, _, _, path = _make_quantized("ort_qop_per_channel_s8", tmp_path)
    data = tmp_path / "calib.npz"
    np.savez(data, x=_feeds(1, 2)[0]["x"])
    for extra in ([], ["--recalibrate"]):
        out = tmp_path / f"out{len(extra)}.onnx"
        assert main(["quantize", path, "-o", str(out), "--calib", str(data), *extra]) == 0
        onnx.checker.check_model(onnx.load(out), full_check=True)
    text = capsys.readouterr().out
    assert "already quantized" in text and "were ignored" in text


def test_a_grid_at_zero_is_a_folded_activation_only_after_a_layer():
    """Conv -> Q(zp = 0) -> DQ: the Relu the tool folded (Clip(0, 6) when the grid ends
    at 6); Sigmoid / graph input -> Q(zp = 0): the file's own clipping, not in the view."""
    rng = np.random.default_rng(5)
    w = rng.integers(-127, 128, (5, 3, 1, 1)).astype(np.int8)

    def qdq(x: str, s: str, z: str) -> list[onnx.NodeProto]:
        return [
            helper.make_node("QuantizeLinear", [x, s, z], [x + "_q"], name=x + "_Q"),
            helper.make_node("DequantizeLinear", [x + "_q", s, z], [x + "_dq"], name=x + "_DQ"),
        ]

    nodes = [
        *qdq("x", "s_in", "z0"),
        helper.make_node("DequantizeLinear", ["w", "ws"], ["wf"], name="w_DQ", axis=0),
        helper.make_node("Conv", ["x_dq", "wf"], ["c"], name="conv"),
        *qdq("c", "s6", "z0"),  # grid [0, 6]: a folded Relu6
        helper.make_node("Conv", ["c_dq", "wf2"], ["d"], name="conv2"),
        *qdq("d", "s_in", "z0"),  # grid [0, 2.55]: a folded Relu
        helper.make_node("Sigmoid", ["d_dq"], ["g"], name="sig"),
        *qdq("g", "s_in", "z0"),  # after a Sigmoid: no clamp
    ]
    inits = [
        numpy_helper.from_array(np.float32(0.01), "s_in"),
        numpy_helper.from_array(np.float32(6.0 / 255), "s6"),
        numpy_helper.from_array(np.uint8(0), "z0"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.float32([0.01, 0.02, 0.03, 0.015, 0.005]), "ws"),
        numpy_helper.from_array(rng.standard_normal((3, 5, 1, 1)).astype(np.float32), "wf2"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 5])],
        [helper.make_tensor_value_info("g_dq", TensorProto.FLOAT, [1, 3, 4, 5])],
        inits,
    )
    fv = derive_float_view(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    onnx.checker.check_model(fv.model, full_check=True)
    ops = [(n.op_type, list(n.input)) for n in fv.model.graph.node]
    assert [op for op, _ in ops] == ["Conv", "Clip", "Conv", "Relu", "Sigmoid", "Identity"], ops
    assert ops[0][1][0] == "x" and fv.clamps == 2 and fv.dropped_pairs == 4
    assert {k: v[1] for k, v in fv.activation_params.items()} == {"x": 0, "c": 0, "d": 0, "g": 0}


def test_pad_on_8_bit_data_pads_the_view_with_the_real_value(tmp_path):
    """ONNX Runtime's QOperator Pad runs on uint8 with the pad value quantized: the view
    pads the float data with that level's real value."""
    rng = np.random.default_rng(6)
    w1 = rng.standard_normal((7, 3, 3, 3)).astype(np.float32) * 0.3
    w2 = rng.standard_normal((5, 7, 3, 3)).astype(np.float32) * 0.2
    graph = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
            helper.make_node("Pad", ["c1", "pads", "pv"], ["p"], name="pad", mode="constant"),
            helper.make_node("Conv", ["p", "w2"], ["y"], name="conv2"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 5, 9, 11])],
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(w2, "w2"),
            numpy_helper.from_array(np.array([0, 0, 2, 2, 0, 0, 2, 2], np.int64), "pads"),
            numpy_helper.from_array(np.array(0.5, np.float32), "pv"),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    src, out = str(tmp_path / "f.onnx"), str(tmp_path / "q.onnx")
    onnx.save(model, src)
    feeds = [{"x": rng.standard_normal((1, 3, 9, 11)).astype(np.float32)} for _ in range(4)]
    ort_quantize_static(src, out, _Reader(feeds), quant_format=QuantFormat.QOperator, per_channel=True)
    q = onnx.load(out)
    fv = derive_float_view(q)
    onnx.checker.check_model(fv.model, full_check=True)
    assert not {n.op_type for n in fv.model.graph.node} & {
        "QLinearConv",
        "QuantizeLinear",
        "DequantizeLinear",
    }
    assert fv.mapped == {"QLinearConv": 2, "Pad on 8-bit data": 1}, fv.format()
    ref = onnx.ModelProto()
    ref.CopyFrom(model)
    inits = {t.name: t for t in ref.graph.initializer}
    for node, w in (("conv1", "w1"), ("conv2", "w2")):
        inits[w].CopyFrom(numpy_helper.from_array(_view_weight(fv.model, node, 1), w))
    pad = next(n for n in fv.model.graph.node if n.op_type == "Pad")
    pv = {t.name: numpy_helper.to_array(t) for t in fv.model.graph.initializer}[pad.input[2]]
    assert pv.dtype == np.float32 and abs(float(pv) - 0.5) < 0.05  # 0.5 on the grid
    inits["pv"].CopyFrom(numpy_helper.from_array(pv, "pv"))
    for feed in feeds[:2]:
        want = _ort(ref, feed)[0]
        np.testing.assert_allclose(
            _ort(fv.model, feed)[0], want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max())
        )


def _int_input_model() -> onnx.ModelProto:
    """An 8-bit image input dequantized in the graph (per channel, non-zero zero points),
    then a float Conv + Relu: the DequantizeLinear of a graph input has no float form."""
    rng = np.random.default_rng(11)
    w = rng.normal(0, 0.3, (7, 3, 3, 3)).astype(np.float32)
    b = rng.normal(0, 0.1, 7).astype(np.float32)
    nodes = [
        helper.make_node("DequantizeLinear", ["img", "s", "zp"], ["x"], axis=1),
        helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "int_input",
        [helper.make_tensor_value_info("img", TensorProto.UINT8, [1, 3, 11, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 11, 9])],
        [
            numpy_helper.from_array(np.array([0.021, 0.017, 0.013], np.float32), "s"),
            numpy_helper.from_array(np.array([121, 130, 97], np.uint8), "zp"),
            numpy_helper.from_array(w, "w"),
            numpy_helper.from_array(b, "b"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("how", ["static", "dynamic"])
def test_a_node_kept_quantized_in_the_view_stays_as_written(how, tmp_path):
    """The view keeps a DequantizeLinear of an integer graph input as the file has it;
    the rest is quantized as a float model (the view is not derived again)."""
    src, dst = tmp_path / "in.onnx", tmp_path / "out.onnx"
    onnx.save(_int_input_model(), src)
    rng = np.random.default_rng(5)
    feeds = [{"img": rng.integers(0, 256, (1, 3, 11, 9), dtype=np.uint8)} for _ in range(6)]
    if how == "static":
        summary = quanta.quantize_static(src, dst, feeds[:4], verbose=False)
        assert summary.integer_share == pytest.approx(1.0)
    else:
        summary = quanta.quantize_dynamic(src, dst, verbose=False)
    assert any("no float form" in n for n in summary.notes)
    out = onnx.load(dst)
    onnx.checker.check_model(out)
    dq = [n for n in out.graph.node if n.op_type == "DequantizeLinear" and "img" in n.input]
    assert len(dq) == 1
    ref = _ort(str(src), feeds[5])[0]
    got = quanta.InferenceSession(str(dst)).run(None, feeds[5])[0]
    # the same file in both runtimes: at most one step of its coarsest activation grid apart
    step = max(
        float(numpy_helper.to_array(t).max())
        for t in out.graph.initializer
        if t.name in {n.input[1] for n in out.graph.node if n.op_type == "DequantizeLinear"}
    )
    np.testing.assert_allclose(got, _ort(str(dst), feeds[5])[0], rtol=0, atol=step * 1.0001)
    sqnr = 10 * np.log10((ref**2).sum() / ((got - ref) ** 2).sum())
    assert sqnr > 25
