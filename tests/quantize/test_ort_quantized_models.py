"""Models quantized by ONNX Runtime's own tool run in quanta's reference backend.

The demo CNN (quanta/cli/assets/digits_cnn.onnx, calibrated on digits_data.npz 'calib_x')
and tests/ir/models.py's encoder_block are quantized once per configuration (module-scope
fixture) with ``onnxruntime.quantization.quantize_static`` in QOperator and QDQ format,
uint8 and int8 activations, per tensor and per channel, and with ``quantize_dynamic``. Each
model, and the graph ORT's own optimizer makes of it (saved at ORT_ENABLE_EXTENDED: QGemm,
QLinearSoftmax, DynamicQuantizeMatMul, MatMulIntegerToFloat), runs in ONNX Runtime (graph as
written, optimizations off) and in ``quanta.InferenceSession(backend="reference")``, with
every intermediate tensor exposed as an extra graph output.

Tolerances (``_check``):
- every 8-bit (quantized) tensor, intermediate or output: within 1 LSB. The integer kernels
  are bit-exact (test_ms_qops.py, test_ms_qlinear.py); ±1 comes from the documented float32
  paths (QLinearAdd's AVX2 kernel, QLinearSoftmax's SIMD sums, MLAS's logistic) and from a
  float op (BatchNormalization, LayerNormalization, float Conv) rounding differently before
  a quantization.
- every float and int32 tensor: within the change its node's *observed* input differences
  can cause (``_LocalBound``, one rule per op with its derivation), plus 64 float32 ulps of
  its magnitude for the op's own rounding order. Checking each node against its own inputs
  localizes a fault to one op instead of compounding worst cases across layers; identical
  inputs therefore demand identical outputs up to rounding.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper, shape_inference
from onnxruntime.quantization import (
    CalibrationDataReader,
    QuantFormat,
    QuantType,
    quantize_dynamic,
    quantize_static,
)

import quanta
from tests.ir import models
from tests.ort_int8 import REDUCE_RANGE

ASSETS = Path(__file__).resolve().parents[2] / "quanta" / "cli" / "assets"
EIGHT_BIT = (onnx.TensorProto.UINT8, onnx.TensorProto.INT8)
EPS32 = float(np.finfo(np.float32).eps)


class _Reader(CalibrationDataReader):
    def __init__(self, feeds):
        self._it = iter(feeds)

    def get_next(self):
        return next(self._it, None)


def _digits_feeds():
    data = np.load(ASSETS / "digits_data.npz")
    name = onnx.load(ASSETS / "digits_cnn.onnx").graph.input[0].name
    calib = [{name: data["calib_x"][i : i + 40]} for i in range(0, 200, 40)]
    return calib, [{name: data["test_x"][:150]}]


STATIC_CONFIGS = [
    (fmt, act, per_channel)
    for fmt in (QuantFormat.QOperator, QuantFormat.QDQ)
    for act in (QuantType.QUInt8, QuantType.QInt8)
    for per_channel in (False, True)
]
# ORT fusions to a float contrib op quanta has no reference for (FusedMatMul,
# SkipLayerNormalization) are turned off when saving the optimized graph.
DISABLED_FUSIONS = ["MatMulScaleFusion", "SkipLayerNormFusion"]


@pytest.fixture(scope="module")
def quantized(tmp_path_factory) -> dict[str, tuple[Path, list[dict[str, np.ndarray]]]]:
    """name -> (model path, test feeds), each configuration quantized once."""
    tmp = tmp_path_factory.mktemp("ort_quantized")
    enc = tmp / "encoder.onnx"
    onnx.save(models.encoder_block(), enc)
    digits_calib, digits_test = _digits_feeds()
    sources = {
        "digits": (ASSETS / "digits_cnn.onnx", digits_calib, digits_test),
        "encoder": (enc, models.encoder_feeds(), models.encoder_feeds(n_samples=3, seed=11)),
    }
    out = {}
    for src, (path, calib, test) in sources.items():
        for fmt, act, per_channel in STATIC_CONFIGS:
            name = f"{src}-{fmt.name}-{act.name}-{'per_channel' if per_channel else 'per_tensor'}"
            quantize_static(
                path,
                tmp / f"{name}.onnx",
                _Reader(calib),
                quant_format=fmt,
                activation_type=act,
                weight_type=QuantType.QInt8,
                per_channel=per_channel,
                reduce_range=REDUCE_RANGE,  # tests/ort_int8.py
            )
            out[name] = (tmp / f"{name}.onnx", test)
        quantize_dynamic(path, tmp / f"{src}-dynamic.onnx", reduce_range=REDUCE_RANGE)
        out[f"{src}-dynamic"] = (tmp / f"{src}-dynamic.onnx", test)
    for name in [
        n for n in out if n.endswith(("dynamic", "QOperator-QUInt8-per_channel", "QDQ-QInt8-per_tensor"))
    ]:
        path, test = out[name]
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
        so.optimized_model_filepath = str(tmp / f"{name}-ort_optimized.onnx")
        ort.InferenceSession(
            str(path), so, providers=["CPUExecutionProvider"], disabled_optimizers=DISABLED_FUSIONS
        )
        out[f"{name}-ort_optimized"] = (tmp / f"{name}-ort_optimized.onnx", test)
    return out


ALL_NAMES = [
    f"{src}-{fmt.name}-{act.name}-{'per_channel' if pc else 'per_tensor'}"
    for src in ("digits", "encoder")
    for fmt, act, pc in STATIC_CONFIGS
] + [f"{src}-dynamic" for src in ("digits", "encoder")]
OPTIMIZED_NAMES = [
    f"{n}-ort_optimized"
    for n in ALL_NAMES
    if n.endswith(("dynamic", "QOperator-QUInt8-per_channel", "QDQ-QInt8-per_tensor"))
]


def _expose_everything(model: onnx.ModelProto) -> onnx.ModelProto:
    """Every node output with an inferred type and shape becomes a graph output."""
    model = shape_inference.infer_shapes(model)
    known = {o.name for o in model.graph.output}
    typed = {vi.name: vi for vi in model.graph.value_info if vi.type.tensor_type.HasField("shape")}
    for node in model.graph.node:
        for name in node.output:
            if name and name not in known and name in typed:
                model.graph.output.append(typed[name])
                known.add(name)
    return model


def _run_both(path: Path, feeds: dict[str, np.ndarray]):
    model = _expose_everything(onnx.load(path))
    data = model.SerializeToString()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort_sess = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    feeds = {i.name: feeds[i.name] for i in ort_sess.get_inputs()}
    names = [o.name for o in model.graph.output]
    expected = dict(zip(names, ort_sess.run(None, feeds), strict=True))
    got = dict(zip(names, quanta.InferenceSession(data, backend="reference").run(None, feeds), strict=True))
    return model, feeds, expected, got


# --------------------------------------------------------------------------------------
# Local bounds: each node's output difference explained by its inputs' observed differences
# --------------------------------------------------------------------------------------


class _LocalBound:
    """``bound(v)``: the largest |quanta − ORT| of value v that the *observed* differences of
    its node's inputs can cause, by one rule per op type (derivations inline). Checking every
    node against its own inputs localizes a fault to one op and does not compound bounds
    across layers. ORT's values and quanta's come from runs with every tensor exposed."""

    def __init__(self, model: onnx.ModelProto, feeds, expected, got):
        self.producer = {o: n for n in model.graph.node for o in n.output}
        self.consts = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
        for n in model.graph.node:
            if n.op_type == "Constant":
                self.consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
        self.expected = {**feeds, **expected, **self.consts}
        self.got = {**feeds, **got, **self.consts}

    def val(self, name: str) -> np.ndarray:
        return np.asarray(self.expected[name]).astype(np.float64)

    def delta(self, name: str) -> float:
        """Observed max |quanta − ORT| of an input (codes for integer tensors)."""
        if not name or name not in self.got:
            return 0.0
        g, e = np.asarray(self.got[name]), np.asarray(self.expected[name])
        return float(np.abs(g.astype(np.float64) - e.astype(np.float64)).max(initial=0))

    def _acc_bound(
        self, a: str, za: str, b: np.ndarray, zb: np.ndarray | None, trans_a: bool = False
    ) -> float:
        """max |Δacc| of Σ_k (a − za)(b − zb) from the observed per-element |Δa| (codes)."""
        da = np.abs(self.got[a].astype(np.float64) - self.expected[a].astype(np.float64))
        da = da.T if trans_a else da
        return float(((da + self.delta(za)) @ np.abs(b - (0 if zb is None else zb))).max(initial=0))

    @staticmethod
    def _col_abs_sum(b: np.ndarray, zb: np.ndarray | None) -> float:
        """max_n Σ_k |b[k, n] − zb[n]|: the accumulator change per unit change of every code
        in a row of A."""
        d = b - (0 if zb is None else zb)
        return float(np.abs(d).sum(axis=-2).max())

    def __call__(self, name: str) -> float:
        n = self.producer[name]
        ins = list(n.input) + [""] * 9
        op = n.op_type
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
        dx = self.delta(ins[0])
        if op == "DequantizeLinear":  # (q − z)·s: Δq codes
            return dx * float(np.abs(self.val(ins[1])).max())
        if op == "DynamicQuantizeLinear":  # y_scale = (max − min)/255: max, min move by Δx
            return 2 * dx / 255
        if op == "MatMulInteger":  # Σ_k (a − za)(b − zb): per output, |Δa| @ |b − zb|
            zb = self.val(ins[3]) if ins[3] else None
            return self._acc_bound(ins[0], ins[2], self.val(ins[1]), zb)
        if op == "ConvInteger":  # as MatMulInteger, over each output channel's window
            w = self.val(ins[1])
            zw = self.val(ins[3]).reshape(-1, *([1] * (w.ndim - 1))) if ins[3] else 0
            colsum = float(np.abs(w - zw).reshape(w.shape[0], -1).sum(axis=1).max())
            return (dx + self.delta(ins[2])) * colsum
        if op == "QGemm":  # float output y = m·acc: m·Δacc, m = |alpha·sa·sb|
            m = abs(attrs.get("alpha", 1.0)) * np.abs(self.val(ins[1])).max() * np.abs(self.val(ins[4])).max()
            b = self.val(ins[3]).T if attrs.get("transB", 0) else self.val(ins[3])
            trans_a = bool(attrs.get("transA", 0))
            return float(m) * self._acc_bound(ins[0], ins[2], b, self.val(ins[5]), trans_a)
        if op == "MatMulIntegerToFloat":  # y = m·acc + bias: m·Δacc
            zb = self.val(ins[5]) if ins[5] else None
            m = np.abs(self.val(ins[2])).max() * np.abs(self.val(ins[3])).max()
            return float(m) * self._acc_bound(ins[0], ins[4], self.val(ins[1]), zb)
        if op == "DynamicQuantizeMatMul":
            # A code can change only where a/sa lies within the observed input change (plus
            # the scale's relative change 2Δa/255/sa) of a rounding boundary, and by at most
            # 1 + Δa/sa there; every product also scales by the relative change of sa.
            if dx == 0:
                return 0.0
            a, b, sb = self.val(ins[0]), self.val(ins[1]), np.abs(self.val(ins[2])).max()
            zb = self.val(ins[3]) if ins[3] else None
            sa = (max(a.max(), 0) - min(a.min(), 0)) / 255
            rel = 2 * dx / 255 / sa
            u = a / sa
            margin = dx / sa + np.abs(u) * rel + 1e-6
            zp_moves = abs(abs(-min(a.min(), 0) / sa % 1 - 0.5)) <= margin.max()
            near = np.abs(u - np.floor(u) - 0.5) <= margin
            dcode = np.where(near | zp_moves, 1.0, 0.0) + dx / sa
            dacc = float((dcode @ np.abs(b - (0 if zb is None else zb))).max())
            return float(sa * sb * dacc + rel * np.abs(self.val(name)).max())
        if op in ("Cast", "Relu", "Flatten", "Reshape", "Transpose", "Unsqueeze", "Squeeze", "MaxPool"):
            return dx  # views and 1-Lipschitz maps
        if op == "GlobalAveragePool":  # a mean moves by at most the largest change
            return dx
        if op in ("Add", "Sub"):
            return dx + self.delta(ins[1])
        if op == "Mul":  # |Δ(ab)| <= |Δa|·|b| + |a|·|Δb| + |Δa|·|Δb|
            db = self.delta(ins[1])
            a, b = np.abs(self.val(ins[0])).max(), np.abs(self.val(ins[1])).max()
            return float(dx * b + a * db + dx * db)
        if op == "MatMul":  # K terms of the product rule, + K·eps of Σ|a·b| (summation order)
            db = self.delta(ins[1])
            a, b = np.abs(self.val(ins[0])), np.abs(self.val(ins[1]))
            k = a.shape[-1]
            return float(k * (dx * b.max() + a.max() * db + dx * db) + k * EPS32 * k * a.max() * b.max())
        if op in ("Conv", "Gemm"):
            # Σ_k x·w over K terms with constant w: Δx·max Σ|w| per output, + K·eps·max|x|·Σ|w|
            # for the summation order (ORT's im2col GEMM vs the reference's loops).
            w = np.abs(self.val(ins[1]))
            if op == "Gemm":
                w = w.T if attrs.get("transB", 0) else w
                colsum, k = float(w.sum(axis=0).max()), w.shape[0]
            else:
                colsum, k = float(w.reshape(w.shape[0], -1).sum(axis=1).max()), w[0].size
            assert self.delta(ins[1]) == 0, f"{name}: weights differ"
            return (dx + k * EPS32 * float(np.abs(self.val(ins[0])).max())) * colsum
        if op == "Softmax":  # |Δp_i| <= p_i·(|Δx_i| + Σ_j p_j·|Δx_j|) <= 2·max|Δx|
            return 2 * dx
        if op == "BatchNormalization":  # γ·(x − μ)/√(σ² + ε) + β: gain max|γ|/√(σ² + ε)
            eps = attrs.get("epsilon", 1e-5)
            return dx * float(np.abs(self.val(ins[1]) / np.sqrt(self.val(ins[4]) + eps)).max())
        if op == "LayerNormalization":
            # Δ(x − μ) <= 2t, Δσ <= t (σ is 1-Lipschitz in the max norm), |x̂| <= √(d − 1):
            # |Δy| <= max|γ|·t·(2 + √d)/σ_min, σ over the normalized axes of ORT's input.
            x = self.val(ins[0])
            axes = tuple(range(attrs.get("axis", -1) % x.ndim, x.ndim))
            d = math.prod(x.shape[a] for a in axes)
            sigma = float(np.sqrt(x.var(axis=axes) + attrs.get("epsilon", 1e-5)).min())
            return dx * float(np.abs(self.val(ins[1])).max()) * (2 + math.sqrt(d)) / sigma
        raise AssertionError(f"no bound rule for {op} (node {n.name!r}, value {name!r})")


def _check(model, feeds, expected, got):
    """8-bit (quantized) tensors within 1 LSB; every float and int32 tensor within the local
    bound of its node plus 64 float32 ulps of its magnitude (the op's own rounding in another
    order: reductions of at most 64 terms)."""
    bound = _LocalBound(model, feeds, expected, got)
    for name, e in expected.items():
        g = got[name]
        assert g.dtype == e.dtype and g.shape == e.shape, f"{name}: {g.dtype}{g.shape} vs {e.dtype}{e.shape}"
        d = bound.delta(name)
        if e.dtype in (np.uint8, np.int8):
            assert d <= 1, f"{name}: quantized values differ by {d} LSB"
        elif e.dtype.kind in "fi" and d > 0:
            tol = bound(name) + 64 * EPS32 * float(np.abs(e).max(initial=0))
            assert d <= tol, f"{name} ({bound.producer[name].op_type}): max |diff| {d} > local bound {tol}"


@pytest.mark.parametrize("name", ALL_NAMES + OPTIMIZED_NAMES)
def test_ort_quantized_model_runs_in_reference_backend(quantized, name):
    path, feeds_list = quantized[name]
    for feeds in feeds_list:
        _check(*_run_both(path, feeds))


def test_ort_optimized_graphs_contain_the_contrib_ops(quantized):
    """The optimized graphs exercise what this suite is for: ORT's own com.microsoft ops."""
    seen = set()
    for name in OPTIMIZED_NAMES + [n for n in ALL_NAMES if "QOperator" in n]:
        seen |= {n.op_type for n in onnx.load(quantized[name][0]).graph.node if n.domain == "com.microsoft"}
    assert {"QGemm", "QLinearSoftmax", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"} <= seen, seen
