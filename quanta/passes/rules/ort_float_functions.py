"""ONNX Runtime's float functions in place of ONNX's: Sigmoid and Tanh as ORT computes them.

Rules (each replaces the ONNX function by ORT's computation of it)::

    %y = Sigmoid(%x: f32) -> %y = quanta::MlasLogistic(%x)      SigmoidToMlasLogistic
    %y = Tanh(%x: f32)    -> %y = quanta::MlasTanh(%x)          TanhToMlasTanh
    %y.. = LSTM(%x: f32, ...) -> %y.. = quanta::OrtLSTM(...)    LstmToOrtLstm
    %y.. = GRU(%x: f32, ...)  -> %y.. = quanta::OrtGRU(...)     GruToOrtGru
    %y = Conv(DQ(%x), DQ(w), b?)   (a group ORT does not fuse)   ConvToMlasConv
                          -> %y = quanta::MlasConv(DQ(%x), DQ(w), b?, threads=T)
    %y = Conv(%x: f32, w: f32 constant, b?)   (1-D, eq. (HB1))  ConvToMlasConv
                          -> %y = quanta::MlasConv(%x, w, b?, threads=T)
    %y = ReduceMean|ReduceSum(%x: f32, axes?)                    ReduceToOrtReduce
                          -> %y = quanta::OrtReduceMean|OrtReduceSum(%x)   axes: the trailing ones
    %y = Q(Conv(DQ(%xq), DQ(wq: i8), DQ(b)?))   (a group ORT fuses)   QdqConvToMlasQLinearConv
                          -> %y = quanta::MlasQLinearConv(%xq, sx, zx, wq, sw, zw, sy, zy, b?)
    %y.. = MatMulInteger | com.microsoft::MatMulIntegerToFloat | DynamicQuantizeMatMul
           | DynamicQuantizeLSTM  (uint8 A, int8 weights)         MatMulIntegerSaturatingPairs, ..
                          -> the same node with saturating_pairs = 1
    %y = GlobalAveragePool(DQ(%x))                                GlobalAveragePoolToMlasPool
                          -> %y = quanta::MlasGlobalAveragePool(DQ(%x))
    %y = Softmax(%x: f32)  (not a QDQ group)                      SoftmaxToMlasSoftmax
                          -> %y = quanta::MlasSoftmax(%x, axis, coerce_2d)
    %y = LayerNormalization(%x: f32, scale, bias?)                LayerNormToOrtLayerNorm
                          -> %y = quanta::OrtLayerNorm(%x, scale, bias?, kernel="layer_norm" | "skip")
    FuseLayerNorm's pattern with scale and bias                   WrittenLayerNormToOrtLayerNorm
    FuseRMSNorm's pattern with a scale, no bias                   WrittenRmsNormToOrtLayerNorm
                          -> %y = quanta::OrtLayerNorm(%x, scale, bias?, kernel=...)
    the (FG1) chain ir/ms_contrib.py writes for FastGelu          FastGeluToOrtFastGelu
                          -> %y = quanta::OrtFastGelu(%v)
    %y = Resize(%x: f32, ...) {linear, the last two axes}       ResizeToOrtResizeLinear
                          -> %y = quanta::OrtResizeLinear(%x, scales, sizes)
    %y = BatchNormalization(%x: f32, s, b, mean, var)             BatchNormToOrtAffine
                          -> %y = Add(Mul(%x, a), c)   a = f32(f32(1 / f32(sqrt(f32(var + eps)))) · s)
                                                       c = f32(b − f32(mean · a))   ([C, 1, ...])
                          (s, b, mean, var: constants, or DequantizeLinear of constant codes)

Why: ONNX defines Sigmoid and Tanh as the exact functions, and quanta computes them within
2.4 and 2 ulp (docs/float-ops.md (Σ1)-(Σ2), (T1)-(T4)). ONNX Runtime computes MLAS's
rational approximations (``MlasComputeLogistic``, ``MlasComputeTanh``), which are not
what ONNX says in the last bits (a few ulp near 0.5; for x < 0 the logistic is a
multiple of 2^−25, exactly 0 from x = −18 down where ONNX's sigmoid is 1.5e−8). A file ORT's quantizer wrote was calibrated and is deployed with
ORT's functions, and its float islands feed quantizations (every DynamicQuantizeLinear
rounds its input anew), so a last-bit difference flips codes downstream: the
ddddocr captcha reader quantized by ``quantize_dynamic`` ends 0.44 (in logits) from ORT
with ONNX's sigmoid and bit-identical with ORT's. The replacement is exact against ORT
(its twins, :mod:`quanta.kernels.reference.ort_float`, are MLAS's kernels operation by
operation), not against ONNX: the session runs this pass only when asked
(``SessionOptions.float_functions = "ort"``, or ``"auto"`` on a file ORT's quantizer
wrote), never inside quantization. Under ``"auto"`` on any other file the session runs
``OrtRecurrentOrder`` (the LSTM and GRU rules alone: ORT's recurrent order is exact and
faster than ONNX's multiply-then-add, docs/float-ops.md (RO1)).

LSTM: ONNX Runtime's float LSTM forms its products with MLAS's float GEMM (fused
multiply-add chains, blocks of 256 k) and its gates with MLAS's logistic and tanh, where
quanta's LSTM sums without FMA and uses ONNX's functions (docs/float-ops.md (RNN1) and
(RNN-ORT)). ORT's ``quantize_static`` keeps an LSTM float between a DequantizeLinear and a
QuantizeLinear, so the last bits of Y choose codes: madmom's beat tracker quantized by
ORT (6 LSTMs) ran 1 code from ORT at every LSTM output and 3 output steps after the final
Sigmoid with quanta's LSTM, 0 with ORT's. Only an LSTM with the default activations is
rewritten (the others are not ORT's MLAS path either); the result is ORT's bit for bit on
x86-64 with FMA (``quanta::OrtLSTM``, :mod:`quanta.kernels.reference.ort_float`).

GRU: ONNX Runtime's float GRU (deep_cpu_gru.cc) forms its products with the same MLAS
GEMM blocks, z with MLAS's logistic, and r and the candidate state with rational
approximations of its own (rnn_helpers.cc ``gru_reset_gate_sigmoid``,
``gru_output_gate_tanh``). ORT's ``quantize_dynamic`` keeps a GRU float and re-quantizes
its Y: pyfrspell's derived-form file ran 1 code from ORT at the decoder's
DynamicQuantizeLinear (39 output steps) with quanta's GRU, 0 with ORT's. Only a GRU with
the default activations is rewritten (``quanta::OrtGRU``, docs/float-ops.md (RNN-ORT-GRU)).

Conv: ONNX Runtime fuses a QDQ Conv group (``DQ(x), DQ(w), DQ(b: int32)? -> Conv -> Q``,
the Conv's only use) into QLinearConv only when x and y are uint8 (on x86 without
``session.qdqisint8allowed``; 16-bit activations never), after its QDQS8ToU8Transformer
made uint8 every int8 Q -> DQ pair whose codes only that DequantizeLinear reads (same
per-tensor zero point): such int8 groups are fused too. Every other Conv fed by
DequantizeLinears runs as MLAS's float Conv on the dequantized values, whose FMA chains,
K blocks and M = 1 kernel (:mod:`quanta.kernels.reference.mlas_conv`, docs/float-ops.md
(MC1)-(MC6)) are not the exact sum quanta's integer path rounds once: codes then differ
by 1 on 1e-6..2e-4 of a group's outputs, which deep networks grow (nudenet_320n's
per-channel symmetric file: 16 output steps). ``quanta::MlasConv`` computes that float
Conv bit for bit; its ``threads`` attribute is ORT's intra-op thread count, which chooses
MLAS's schedule (the session's own). A Conv whose x and w both come from
DequantizeLinear is rewritten, and a float 1-D Conv with a constant float32 weight
(eq. (HB1): ORT's NCHWc rewrite takes 4-D Convs only, so ORT runs it as MlasConv; hibari's
TTS, quantized by ``quantize_dynamic``, keeps a depthwise Conv1d float before each
DynamicQuantizeLinear, and quanta's exact sums there moved its duration codes until its
output had 776 frames where ORT's had 778). A float 2-D Conv with a constant weight is
ORT's NCHWc Conv (another order, not modelled).

Refused: an input whose element type is known and not float32 (MLAS computes float32
only; ORT's double Sigmoid is Eigen's, which this does not model).

ReduceMean / ReduceSum over the trailing axes: ONNX Runtime's CPU kernel sums each row
[R, N] with Eigen's ``.sum()`` (reduction_ops.h ``FastReduceKR``): packets of 4 from the
row's first 16-byte boundary, two packet accumulators, a horizontal add, then the
elements outside the packets (docs/float-ops.md (ER1)-(ER4)); quanta's sums 16 lanes
(R1)-(R3). ``table_obj_q`` (rapid-table-det's detector as ORT's ``quantize_dynamic``
shipped it) feeds a squeeze-excite ReduceMean over H·W into DynamicQuantizeLinear: the
two orders differ in 60 of 64 channels, and the codes differ from there on. Refused:
other axes (ORT reduces them as KRK / RK, by MLAS's SGEMM or column loops: not modelled),
axes that are not constants, an input that is not float32, and the reductions of a norm
written out (a ReduceMean whose output is subtracted from its own input, the difference
read in float, or whose input is Pow(a, 2) or Mul(a, a)): those stay for FuseLayerNorm /
FuseRMSNorm, whose row kernels sum with (R1)-(R3), and ORT fuses such norms into its own
kernels too. A mean whose difference only a QuantizeLinear reads (a norm ORT's quantizer
split into groups) is no norm's: ORT runs it as a plain ReduceMean, and so does this.

BatchNormalization: ONNX Runtime's CPU kernel (batch_norm.h, inference) folds the
statistics into one scale and shift per channel in float32 and computes
``f32(f32(x · a) + c)``; quanta's (nn_norm.batch_normalization) computes
``((x − mean) / sqrt(var + eps)) · s + b`` as written. They differ in the last bits, and
a BatchNormalization between a DequantizeLinear and a QuantizeLinear (ORT's QOperator
files leave it float when its Conv is quantized first) re-rounds them: ppocr_cls in
QOperator format ends 21 output steps from ORT with quanta's formula, 0 with ORT's.
Only an inference BatchNormalization (no training outputs used, spatial, constant
parameters, x of known rank >= 2) is rewritten; its Mul and Add are float32 IEEE
operations on every target, so the result is ORT's bit for bit. A parameter may be a
DequantizeLinear of constant codes (ORT's 16-bit files quantize the BatchNormalization
scale: ``Q(scale) -> DQ``), computed as ORT's kernels compute them. There ORT keeps the
16-bit group ``DQ -> BatchNormalization -> Q`` float, where quanta's exact affine map
(QLinearAffine16) rounds the exact value once: ppocr_cls's 16-bit file differed on 13 of
36,864 codes of its first such group.

QLinearConv: the Conv groups ONNX Runtime fuses (uint8 activations, int8 weights) run on
MLAS's u8·s8 kernels, which on x86 without VNNI sum two adjacent products of raw codes
into a saturating int16 (``vpmaddubsw``; :mod:`quanta.kernels.reference.mlas_qconv`,
docs/float-ops.md (QC1)-(QC4)); quanta's integer Conv sums exactly. ppocr_cls quantized
by ORT's default QDQ recipe (an image at zero point 128, asymmetric weights) differs on
10,114 of 18,432 codes of its first Conv group. The session asks for this rule with
``float_functions`` "ort" (or "auto" on a file ORT's quantizer wrote) on a CPU where
ORT's kernels saturate.

MatMul and Gemm groups: ORT fuses ``Q(MatMul(DQ(a: u8), DQ(b: int8 constant)))`` into
QLinearMatMul and the Gemm group into QGemm, on the same kernels; under the same condition
they are written here as the lowering writes them (LowerMatMul's, LowerGemm's check and
rewrite) with ``saturating_pairs = 1`` (docs/float-ops.md (QM1)). pipecat's smart-turn
Whisper encoder as ORT's quantizer shipped it: its MatMul groups differed on up to 2,876
of 153,600 codes from identical inputs with the exact sum, 0 with the pairs.

Dynamic int8 GEMMs: the same u8·s8 kernels compute ORT's MatMulInteger (fused by ORT into
MatMulIntegerToFloat / DynamicQuantizeMatMul) and DynamicQuantizeLSTM when the weights are
int8: pairs of raw-code products saturate there too (docs/float-ops.md (QM1)). The
voicefilter embedder quantized by ``quantize_dynamic`` (3 DynamicQuantizeLSTMs) ends up to
1.0 from ORT on 13 of 24 feeds with the exact sum. Under the same condition as QLinearConv
these nodes take ``saturating_pairs = 1``, which their twins and native binders compute.

Softmax, LayerNorm family, FastGelu: ORT computes Softmax with MLAS's FMA3 sum-exp kernel
(its own exp polynomial, 8 lane sums, a product by the reciprocal), LayerNormalization
with an AVX2 kernel (a float64 mean, FMA lanes for the variance) or Welford's sums (rows
shorter than 8, and every SkipLayerNormalization), SimplifiedLayerNormalization (which its
graph optimizer makes of T5's written-out RMS norm) with the same kernel's FMA lanes, and
FastGelu as x·(C'·x·x + B) around MLAS's tanh (docs/float-ops.md (SM1)-(SM5), (OL1)-(OL9),
(FG1)). Kokoro-82M as ORT's ``quantize_dynamic`` shipped it differs from ORT from its
first ALBERT layer with quanta's LayerNorm, Softmax and GELU (held23); g2pid_bert and
tashkeel at their attention Softmax. ORT fuses a written-out norm only with its affine
tail (LayerNorm: scale and bias; RMS norm: a scale): the written-out rules ask for it.
A SkipLayerNormalization's norm comes from ir/ms_contrib.py with its last node's
``doc_string`` naming the Skip kernel (Welford's, whatever the row length).

GlobalAveragePool: ONNX Runtime's CPU kernel is ``MlasPool`` (pooling.cpp
``MlasPoolGlobalKernel``): four lane sums of a row, a two-step horizontal add, the elements
past the last vector, then ``/ f32(N)`` (docs/float-ops.md (GP1)-(GP3)); quanta's sums 16
lanes. ORT keeps a 16-bit (or int8) group ``DQ -> GlobalAveragePool -> Q`` float, and its
last bits choose codes (ppocr_cls's 16-bit file: 1 of 88 codes at its third squeeze-excite
mean). Only a GlobalAveragePool fed by a DequantizeLinear, or of a 1-D or 3-D pool
(rank 3 or 5), is rewritten: after a float op ORT's NCHWc transformer may run a 2-D pool
in its blocked layout (another order, not modelled); 8-bit groups ORT fuses
(QLinearGlobalAveragePool) are integer in both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.ms_contrib import SKIP_LAYER_NORM_DOC, SKIP_SIMPLIFIED_LAYER_NORM_DOC
from quanta.ir.types import F32, IntType, QuantType
from quanta.passes.lower.qdq_to_qlinear import (
    LowerGemm,
    LowerMatMul,
    matmul_check,
    matmul_rewrite,
    storage_8bit,
)
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe
from quanta.passes.rules.fuse_gelu_tanh import GELU_C, GELU_K
from quanta.passes.rules.fuse_layer_norm import FuseLayerNorm, _f32_const, _internal
from quanta.passes.rules.fuse_rms_norm import FuseRMSNorm

__all__ = [
    "QUANTA_DOMAIN",
    "AveragePoolToMlasPool",
    "BatchNormToOrtAffine",
    "ConvToMlasConv",
    "DynamicQuantizeLstmSaturatingPairs",
    "DynamicQuantizeMatMulSaturatingPairs",
    "FastGeluToOrtFastGelu",
    "GlobalAveragePoolToMlasPool",
    "GruToOrtGru",
    "LayerNormToOrtLayerNorm",
    "LstmToOrtLstm",
    "MatMulIntegerSaturatingPairs",
    "MatMulIntegerToFloatSaturatingPairs",
    "MatMulToMlasMatMul",
    "OrtFloatFunctions",
    "QdqConvToMlasQLinearConv",
    "ReduceToOrtReduce",
    "ResizeToOrtResizeLinear",
    "SigmoidToMlasLogistic",
    "SoftmaxToMlasSoftmax",
    "TanhToMlasTanh",
    "WrittenGeluTanhToOrtFastGelu",
    "WrittenLayerNormToOrtLayerNorm",
    "WrittenRmsNormToOrtLayerNorm",
    "ort_batchnorm_affine",
    "ort_resize_linear_attrs",
]

QUANTA_DOMAIN = "quanta"  # quanta.kernels.reference.ort_float (kernels sit below passes)
# FastGelu's constants in ORT's kernel (bias_gelu.cc; ir/ms_contrib.py writes them, (FG1))
ORT_FAST_GELU_B = np.float32(0.7978845608028654)
ORT_FAST_GELU_C = np.float32(0.035677408136300125)


class _ToMlas(Rule):
    op_type = ""
    mlas_op = ""

    def check(self, m: Match) -> Match | NoMatch:
        x = m["x"]
        if x.type is not None and x.type.elem != F32:
            return NoMatch(f"input {describe(x)} is {x.type.elem}, not f32 (MLAS computes float32 only)")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            self.mlas_op,
            [m.value("x")],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )


class SigmoidToMlasLogistic(_ToMlas):
    """%y = Sigmoid(%x: f32) -> %y = quanta::MlasLogistic(%x)"""

    pattern = "y = Sigmoid(x)"
    mlas_op = "MlasLogistic"


class TanhToMlasTanh(_ToMlas):
    """%y = Tanh(%x: f32) -> %y = quanta::MlasTanh(%x)"""

    pattern = "y = Tanh(x)"
    mlas_op = "MlasTanh"


def _constant(v: Value | None) -> np.ndarray | None:
    """The value of an initializer or of a ``Constant`` node's ``value`` (the session runs
    this pass before constant folding, and Paddle exports hold weights in Constant nodes)."""
    if v is None:
        return None
    if v.is_const:
        return np.asarray(v.const)
    p = v.producer
    if p is not None and p.op_type == "Constant" and not p.domain and "value" in p.attrs:
        return np.asarray(p.attrs["value"])
    return None


def _qdq_constants(p: Node, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray] | None:
    """(scale as float32, zero point as int64) of a Q / DQ node with constant parameters,
    shaped to broadcast against ``shape`` (per tensor or along ``axis``), else None."""
    scale = _constant(p.inputs[1]) if len(p.inputs) > 1 else None
    given = len(p.inputs) > 2 and p.inputs[2] is not None
    zp = _constant(p.inputs[2]) if given else None
    if scale is None or scale.dtype != np.float32 or (given and zp is None) or "block_size" in p.attrs:
        return None
    z = np.zeros((), np.int64) if zp is None else zp.astype(np.int64)
    if scale.size == 1:
        return scale.reshape(()), z.reshape(())
    dims = [1] * len(shape)
    dims[int(p.attrs.get("axis", 1)) % max(len(shape), 1)] = scale.size
    return scale.reshape(dims), z.reshape(dims) if z.size > 1 else z.reshape(())


def _constant_codes(v: Value | None) -> np.ndarray | None:
    """Constant integer codes: an initializer or Constant, or a QuantizeLinear of one as
    ORT computes it (float32 division, round half to even, saturated), else None."""
    c = _constant(v)
    if c is not None:
        return c if c.dtype.kind in "iu" else None
    p = v.producer if v is not None else None
    if p is None or p.op_type != "QuantizeLinear" or len(p.inputs) < 3 or p.inputs[2] is None:
        return None
    x, zp = _constant(p.inputs[0]), _constant(p.inputs[2])
    if x is None or x.dtype != np.float32 or zp is None or zp.dtype.kind not in "iu":
        return None
    params = _qdq_constants(p, x.shape)
    if params is None:
        return None
    scale, z = params
    info = np.iinfo(zp.dtype)
    q = np.rint(x / scale).astype(np.float64) + z
    return np.clip(q, info.min, info.max).astype(zp.dtype)


def _dequantized_constant(v: Value | None) -> np.ndarray | None:
    """The float32 value of ``DequantizeLinear(codes, scale, zero_point?)`` of constants
    (codes: :func:`_constant_codes`) as ORT's kernel computes it, ``f32(codes − zp) · scale``,
    else None. ORT's quantizer stores a BatchNormalization's scale this way (16-bit files:
    ``Q(scale) -> DQ``), and ORT runs that DequantizeLinear (its constant folding skips them)."""
    p = v.producer if v is not None else None
    if p is None or p.op_type != "DequantizeLinear" or len(p.inputs) < 2:
        return None
    codes = _constant_codes(p.inputs[0])
    params = None if codes is None else _qdq_constants(p, codes.shape)
    if codes is None or params is None:
        return None
    scale, z = params
    return ((codes.astype(np.int64) - z).astype(np.float32) * scale).astype(np.float32)


def ort_batchnorm_affine(
    scale: np.ndarray, bias: np.ndarray, mean: np.ndarray, var: np.ndarray, epsilon: float
) -> tuple[np.ndarray, np.ndarray]:
    """(a, c) of ORT's inference BatchNormalization, every step one float32 operation:
    a = f32(f32(1 / f32(sqrt(f32(var + eps)))) · s), c = f32(b − f32(mean · a))."""
    f = np.float32
    inv_std = f(1) / np.sqrt(np.asarray(var, f) + f(epsilon))
    a = inv_std * np.asarray(scale, f)
    return a, np.asarray(bias, f) - np.asarray(mean, f) * a


class BatchNormToOrtAffine(Rule):
    """%y = BatchNormalization(%x: f32, s, b, mean, var) -> %y = Add(Mul(%x, a), c)
    (module docstring: ONNX Runtime's per-channel scale and shift)"""

    pattern = "y = BatchNormalization(x, s, b, mean, var, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        bn, x = m.root, m["x"]
        if int(bn.attrs.get("training_mode", 0)):
            return NoMatch("BatchNormalization is in training mode (batch statistics)")
        if any(o.uses or any(o is g for g in m.graph.outputs) for o in bn.outputs[1:]):
            return NoMatch("a running-statistics output of BatchNormalization is used")
        if not int(bn.attrs.get("spatial", 1)):
            return NoMatch("BatchNormalization has spatial=0 (per-element statistics)")
        params = [
            c if (c := _constant(m[name])) is not None else _dequantized_constant(m[name])
            for name in ("s", "b", "mean", "var")
        ]
        if any(v is None for v in params):
            return NoMatch("a BatchNormalization parameter is not a constant")
        if x.type is None or x.type.elem != F32 or x.type.shape is None or len(x.type.shape) < 2:
            return NoMatch(f"input {describe(x)} is not float32 of known rank >= 2")
        channels = x.type.shape[1]
        for name, value in zip(("s", "b", "mean", "var"), params):
            shape = np.shape(value)
            if len(shape) != 1 or (isinstance(channels, int) and shape[0] != channels):
                return NoMatch(f"parameter {describe(m[name])} has shape {shape}, expected ({channels},)")
        m.data["params"] = params
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        a, c = ort_batchnorm_affine(*m.data["params"], float(m.root.attrs.get("epsilon", 1e-5)))
        trailing = (1,) * (len(m["x"].type.shape) - 2)  # per channel: axis 1
        y = m["y"]
        name = m.root.name or y.name
        scaled = b.op(
            "Mul",
            [m.value("x"), b.const(f"{name}_ort_scale", a.reshape(-1, *trailing))],
            types=result_type(shape_from=y, elem_from=y),
            name=f"{name}_ort_scale",
        )
        return b.op(
            "Add",
            [scaled, b.const(f"{name}_ort_shift", c.reshape(-1, *trailing))],
            types=result_type(shape_from=y, elem_from=y),
            name=name,
        )


#: ops through which ORT's NCHWc transformer keeps a float Conv's output blocked (fused
#: activations, elementwise ops of blocked inputs, pools, Concat, BatchNormalization)
_NCHWC_KEEPS = frozenset(
    {
        "Relu",
        "Clip",
        "Sigmoid",
        "HardSigmoid",
        "HardSwish",
        "LeakyRelu",
        "Tanh",
        "Add",
        "Sum",
        "Mul",
        "Concat",
        "MaxPool",
        "AveragePool",
        "BatchNormalization",
        "Resize",
        "Upsample",
    }
)
_NCHWC_DEPTH = 16


def _nchwc_source(v: Value, graph: Graph, depth: int) -> bool:
    """Whether ``v`` may be a tensor ORT's NCHWc transformer runs blocked: a float Conv's
    output, possibly through ops it keeps blocked (within ``depth`` steps); a graph input
    or a constant seen through such ops is not (measured: Mul or Add of a graph input then
    GlobalAveragePool is MlasPool's order, a Conv or a graph input pooled directly is not)."""
    p = v.producer
    if p is None or depth <= 0:
        return depth <= 0
    if p.domain:
        return p.op_type in ("FusedConv", "NchwcConv")
    if p.op_type == "Conv":
        return True
    if p.op_type in _NCHWC_KEEPS:
        return any(i is not None and _nchwc_source(i, graph, depth - 1) for i in p.inputs)
    return False


class GlobalAveragePoolToMlasPool(Rule):
    """%y = GlobalAveragePool(DQ(%x)) -> %y = quanta::MlasGlobalAveragePool(DQ(%x))
    (module docstring: ONNX Runtime's MlasPool order)"""

    pattern = "y = GlobalAveragePool(x)"

    def check(self, m: Match) -> Match | NoMatch:
        x = m["x"]
        if x.type is None or x.type.elem != F32 or x.type.shape is None or not 3 <= len(x.type.shape) <= 5:
            return NoMatch(f"input {describe(x)} is not float32 of rank 3 to 5 (MlasPool's 1-3 spatial axes)")
        if len(x.type.shape) == 4 and (
            any(x is i for i in m.graph.inputs) or _nchwc_source(x, m.graph, _NCHWC_DEPTH)
        ):
            # ORT's NCHWc transformer takes 2-D pools of a graph input or of a blocked tensor
            return NoMatch("a 2-D pool of a graph input or after a float Conv (ORT pools it in NCHWc)")
        sx, y = _dq_storage(x), m["y"]
        q = y.uses[0][0] if len(y.uses) == 1 and not any(o is y for o in m.graph.outputs) else None
        if sx is not None and sx.bits == 8 and q is not None and q.op_type == "QuantizeLinear":
            sy = _q_storage(q.outputs[0])
            if sy == sx:
                return NoMatch(
                    "ONNX Runtime fuses this 8-bit group into QLinearGlobalAveragePool: integer arithmetic"
                )
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "MlasGlobalAveragePool",
            [m.value("x")],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )


class AveragePoolToMlasPool(Rule):
    """%y = AveragePool(%x: f32) -> %y = quanta::MlasAveragePool(%x, nchwc)
    (reference/mlas_pool.py: MlasPool's kernels; a 2-D pool of C % 8 = 0 channels ORT's
    NCHWc transformer runs blocked, in the generic kernel's order)"""

    pattern = "y = AveragePool(x)"

    def check(self, m: Match) -> Match | NoMatch:
        x, node = m["x"], m.root
        if x.type is None or x.type.elem != F32 or x.type.shape is None or not 3 <= len(x.type.shape) <= 4:
            return NoMatch(f"input {describe(x)} is not float32 of rank 3 or 4 (1-D and 2-D pools only)")
        if any(int(d) != 1 for d in node.attrs.get("dilations", [])) or int(node.attrs.get("ceil_mode", 0)):
            return NoMatch("dilations or ceil_mode (not MlasPool's modelled forms)")
        auto = node.attrs.get("auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto not in ("NOTSET", "VALID", ""):
            return NoMatch(f"auto_pad {auto} (explicit pads only)")
        sx, y = _dq_storage(x), m["y"]
        q = y.uses[0][0] if len(y.uses) == 1 and not any(o is y for o in m.graph.outputs) else None
        if sx is not None and sx.bits == 8 and q is not None and q.op_type == "QuantizeLinear":
            if _q_storage(q.outputs[0]) == sx:
                return NoMatch(
                    "ONNX Runtime may fuse this 8-bit group into QLinearAveragePool: integer arithmetic"
                )
        c = x.type.shape[1]
        m.data["nchwc"] = int(len(x.type.shape) == 4 and isinstance(c, int) and c % 8 == 0)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        node = m.root
        d = len(m["x"].type.shape) - 2
        auto = node.attrs.get("auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        pads = [0] * 2 * d if auto == "VALID" else [int(p) for p in node.attrs.get("pads", [0] * 2 * d)]
        attrs = {
            "kernel_shape": [int(k) for k in node.attrs["kernel_shape"]],
            "strides": [int(s) for s in node.attrs.get("strides", [1] * d)],
            "pads": pads,
            "count_include_pad": int(node.attrs.get("count_include_pad", 0)),
            "nchwc": m.data["nchwc"],
        }
        return b.op(
            "MlasAveragePool",
            [m.value("x")],
            attrs,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=node.name or None,
        )


#: the coordinate_transformation_mode values reference/ort_resize.py models (its
#: ORT_RESIZE_MODES; kernels sit below passes)
ORT_RESIZE_MODES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")


def ort_resize_linear_attrs(node: Node, x: Value) -> dict[str, Any] | str:
    """quanta::OrtResizeLinear's attributes for ``node`` (a Resize of ``x``), or why ORT's
    bilinear kernel (RB1)-(RB3) is not modelled for it: linear, the last two axes only,
    constant scales or sizes, a modelled coordinate mode, no antialias / axes /
    keep_aspect_ratio_policy, opset 11 or later (scales as the third input)."""

    def text(key: str, default: str) -> str:
        v = node.attrs.get(key, default)
        return v.decode() if isinstance(v, bytes) else str(v)

    if node.domain or node.op_type != "Resize":
        return f"{node.op_type} of domain {node.domain!r} (Resize only)"
    if x.type is None or x.type.shape is None or len(x.type.shape) < 2:
        return f"input {describe(x)} of unknown rank or rank < 2"
    if text("mode", "nearest") not in ("linear", "bilinear"):
        return "not linear"
    coord = text("coordinate_transformation_mode", "half_pixel")
    if coord not in ORT_RESIZE_MODES:
        return f"coordinate_transformation_mode {coord} (not modelled)"
    if int(node.attrs.get("antialias", 0)) or "axes" in node.attrs:
        return "antialias or axes (not modelled)"
    if text("keep_aspect_ratio_policy", "stretch") != "stretch":
        return "keep_aspect_ratio_policy (not modelled)"
    ins = list(node.inputs)
    if len(ins) < 3:
        return "Resize-10's scales (not modelled)"
    rank = len(x.type.shape)
    scales = _constant(ins[2]) if ins[2] is not None else None
    sizes = _constant(ins[3]) if len(ins) > 3 and ins[3] is not None else None
    attrs: dict[str, Any] = {"coordinate_transformation_mode": coord}
    if scales is not None and scales.size == rank:
        if any(float(v) != 1.0 for v in scales.reshape(-1)[:-2]):
            return "a leading axis resized (ORT's bilinear kernel: the last two only)"
        return attrs | {"scales": [float(v) for v in scales.reshape(-1)[-2:]], "sizes": [0, 0]}
    if sizes is not None and sizes.size == rank:
        dims = x.type.shape[:-2]
        if any(
            not isinstance(d, int) or int(v) != d for v, d in zip(sizes.reshape(-1)[:-2], dims, strict=True)
        ):
            return "a leading axis resized, or of unknown size"
        return attrs | {"scales": [1.0, 1.0], "sizes": [int(v) for v in sizes.reshape(-1)[-2:]]}
    return "scales / sizes not constant"


class ResizeToOrtResizeLinear(Rule):
    """%y = Resize(%x: f32, roi, scales | sizes) {mode: linear}, only the last two axes
    resized -> %y = quanta::OrtResizeLinear(%x) (reference/ort_resize.py: ORT's
    UpsampleBilinear in float32, (RB1)-(RB3); :func:`ort_resize_linear_attrs`). Refused
    where the input is dequantized: ORT may run such a QDQ Resize on the codes."""

    pattern = "y = Resize(x, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        node, x = m.root, m["x"]
        if x.type is None or x.type.elem != F32:
            return NoMatch(f"input {describe(x)} is not float32")
        if x.producer is not None and x.producer.op_type == "DequantizeLinear":
            return NoMatch("a dequantized input: ONNX Runtime may resize the codes (a QDQ Resize)")
        attrs = ort_resize_linear_attrs(node, x)
        if isinstance(attrs, str):
            return NoMatch(attrs)
        m.data["attrs"] = attrs
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "OrtResizeLinear",
            [m.value("x")],
            m.data["attrs"],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )


def _is_square(v: Value) -> bool:
    """``v`` is Pow(a, 2) or Mul(a, a): a written-out norm's squares."""
    p = v.producer
    if p is None or p.domain:
        return False
    if p.op_type == "Mul" and len(p.inputs) == 2:
        return p.inputs[0] is p.inputs[1]
    if p.op_type == "Pow" and len(p.inputs) == 2:
        e = _constant(p.inputs[1])
        return e is not None and e.size == 1 and float(e.reshape(-1)[0]) == 2.0
    return False


def _is_centred(node: Node) -> bool:
    """The output of ReduceMean ``node`` is subtracted from its own input (a LayerNorm's mean)
    and the difference goes on in float. When every reader of the difference is a
    QuantizeLinear, ORT's quantizer has split the norm into quantized groups (Conv-TasNet's
    global LayerNorms): no norm fusion takes it, and the mean is a plain reduction."""
    x = node.inputs[0]
    return any(
        c.op_type == "Sub"
        and not c.domain
        and c.inputs[0] is x
        and c.inputs[1] is node.outputs[0]
        and any(u.op_type != "QuantizeLinear" for u in c.outputs[0].consumers())
        for c in node.outputs[0].consumers()
    )


class ReduceToOrtReduce(Rule):
    """%y = ReduceMean|ReduceSum(%x: f32, axes?) -> %y = quanta::OrtReduceMean|OrtReduceSum(%x)
    (module docstring: ONNX Runtime's order of a reduction over the trailing axes)"""

    pattern = "y = ReduceMean|ReduceSum(x, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        node, x = m.root, m["x"]
        if node.domain:
            return NoMatch(f"{node.op_type} is in domain {node.domain!r}")
        if x.type is None or x.type.elem != F32 or x.type.shape is None:
            return NoMatch(f"input {describe(x)} is not float32 of known rank")
        rank = len(x.type.shape)
        if len(node.inputs) > 1 and node.inputs[1] is not None:
            axes = _constant(node.inputs[1])
            if axes is None:
                return NoMatch(f"axes {describe(node.inputs[1])} are not a constant")
            values = [int(a) for a in axes.reshape(-1)]
        else:
            values = [int(a) for a in node.attrs.get("axes") or ()]
        if not values and int(node.attrs.get("noop_with_empty_axes", 0)):
            return NoMatch(f"{node.op_type} has no axes and noop_with_empty_axes=1 (an identity)")
        if any(not -rank <= a < max(rank, 1) for a in values):
            return NoMatch(f"axes {values} are out of range for rank {rank}")
        chosen = sorted({a % max(rank, 1) for a in values}) if values else list(range(rank))
        if rank == 0 or chosen != list(range(rank - len(chosen), rank)):
            return NoMatch(
                f"axes {values} are not the trailing axes of rank {rank} (ORT: KRK / RK, not modelled)"
            )
        if node.op_type == "ReduceMean" and (_is_square(x) or _is_centred(node)):
            return NoMatch("the ReduceMean belongs to a written-out norm (FuseLayerNorm / FuseRMSNorm)")
        m.data["axes"] = chosen
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        node = m.root
        return b.op(
            "Ort" + node.op_type,
            [m.value("x")],
            {"axes": list(m.data["axes"]), "keepdims": int(node.attrs.get("keepdims", 1))},
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=node.name or None,
        )


class LstmToOrtLstm(Rule):
    """%y.. = LSTM(%x: f32, w, r, ...) -> %y.. = quanta::OrtLSTM(%x, w, r, ...)
    (module docstring: ONNX Runtime's float LSTM)"""

    pattern = "y = LSTM(x, w, r, ...)"
    op = "LSTM"
    target = "OrtLSTM"
    default_names: tuple[str, ...] = ("sigmoid", "tanh", "tanh")

    def check(self, m: Match) -> Match | NoMatch:
        node = m.root
        directions = 2 if node.attrs.get("direction", "forward") == "bidirectional" else 1
        acts = node.attrs.get("activations")
        names = [a.decode() if isinstance(a, bytes) else str(a) for a in acts or ()]
        if names and [n.lower() for n in names] != list(self.default_names) * directions:
            return NoMatch(f"{self.op} has activations {names}, not ORT's MLAS defaults")
        floats = [v for k, v in enumerate(node.inputs) if k != 4 and v is not None]
        for v in floats:
            if v.type is not None and v.type.elem is not None and v.type.elem != F32:
                return NoMatch(f"input {describe(v)} is {v.type.elem}, not f32 (MLAS computes float32 only)")
        if any(o is None or not o.name for o in node.outputs):
            return NoMatch(f"{self.op} leaves an output between two others unnamed")
        return m

    def rewrite(self, m: Match, b: Builder) -> Sequence[Value] | Value:
        node = m.root
        outs = b.op(
            self.target,
            list(node.inputs),
            dict(node.attrs),
            # an output the file omits (the importer's private name) has no type: the op's
            # outputs are f32, as check() found its inputs
            types=[
                result_type(shape_from=o, elem_from=o if o.type is not None else F32) for o in node.outputs
            ],
            domain=QUANTA_DOMAIN,
            name=node.name or None,
            out_names=[o.name for o in node.outputs],
            n_outputs=len(node.outputs),
            attr_types=getattr(node, "attr_types", None),
        )
        return outs


class GruToOrtGru(LstmToOrtLstm):
    """%y.. = GRU(%x: f32, w, r, ...) -> %y.. = quanta::OrtGRU(%x, w, r, ...)
    (module docstring: ONNX Runtime's float GRU)"""

    pattern = "y = GRU(x, w, r, ...)"
    op = "GRU"
    target = "OrtGRU"
    default_names = ("sigmoid", "tanh")


def _dq_storage(v: Value | None) -> IntType | None:
    """The integer storage type a DequantizeLinear producing ``v`` reads, else None."""
    p = v.producer if v is not None else None
    if p is None or p.op_type != "DequantizeLinear" or not p.inputs or p.inputs[0] is None:
        return None
    t = p.inputs[0].type
    elem = t.elem if t is not None else None
    if isinstance(elem, QuantType):
        elem = elem.storage
    return elem if isinstance(elem, IntType) else None


def _q_storage(v: Value) -> IntType | None:
    t = v.type
    elem = t.elem if t is not None else None
    if isinstance(elem, QuantType):
        elem = elem.storage
    return elem if isinstance(elem, IntType) else None


def _shape(v: Value | None) -> tuple | None:
    if v is None:
        return None
    if v.type is not None and v.type.shape is not None:
        return tuple(v.type.shape)
    c = _constant(v)
    return None if c is None else tuple(np.shape(c))


U8, I8 = IntType(8, False), IntType(8, True)


def _s8_pair_to_u8(v: Value | None, m: Match) -> bool:
    """Whether ORT's QDQS8ToU8Transformer makes the int8 codes ``v`` uint8: ``v`` is a
    QuantizeLinear's output read by one DequantizeLinear and nothing else (not a graph
    output), that DequantizeLinear read by one node, both with the same constant
    per-tensor zero point (qdq_s8_to_u8.cc, after EnsureUniqueDQForNodeUnit)."""
    # a group QdqConvToMlasQLinearConv already wrote produces the codes of its QuantizeLinear
    # (ORT decides on the graph as written): its y_zero_point is input 7
    fused = v is not None and v.producer is not None and v.producer.op_type == "MlasQLinearConv"
    if v is None or v.producer is None or (v.producer.op_type != "QuantizeLinear" and not fused):
        return False
    if len(v.uses) != 1 or any(o is v for o in m.graph.outputs):
        return False
    dq, slot = v.uses[0]
    # a reader QdqConvToMlasQLinearConv already wrote absorbed the DequantizeLinear, which
    # only that Conv read (a DequantizeLinear with other readers stays for them, and v then
    # has two uses): the pair as written, its zero point now the group's x_zero_point (input
    # 2). Without this, a group's decision would depend on whether its reader was rewritten
    # first (yunet's depthwise groups between fused 1x1 ones went to float MlasConv, which
    # ORT fuses).
    absorbed = dq.op_type == "MlasQLinearConv" and slot == 0
    if not (absorbed or dq.op_type == "DequantizeLinear") or len(dq.inputs) < 3 or dq.inputs[2] is None:
        return False
    if len(v.producer.inputs) < (8 if fused else 3):
        return False
    # EnsureUniqueDQForNodeUnit runs first: a DequantizeLinear read twice becomes one per
    # reader, and the Q then has more than one output edge
    out = dq.outputs[0]
    if not absorbed and (len(out.uses) != 1 or any(o is out for o in m.graph.outputs)):
        return False
    zq, zd = _constant(v.producer.inputs[7 if fused else 2]), _constant(dq.inputs[2])
    if zq is None or zd is None or zq.size != 1 or zd.size != 1:
        return False
    return int(zq.reshape(-1)[0]) == int(zd.reshape(-1)[0])


class ConvToMlasConv(Rule):
    """%y = Conv(DQ(%x), DQ(w), b?) -> %y = quanta::MlasConv(DQ(%x), DQ(w), b?, threads=T)
    (module docstring: the Conv groups ONNX Runtime runs in float)"""

    pattern = "y = Conv(x, w, ...)"

    def __init__(self, threads: int = 1) -> None:
        super().__init__()
        self.threads = max(1, int(threads))

    def check(self, m: Match) -> Match | NoMatch:
        conv, x, w, y = m.root, m["x"], m["w"], m["y"]
        sx, sw = _dq_storage(x), _dq_storage(w)
        # a float 1-D Conv with a constant weight is ORT's MlasConv too (eq. (HB1))
        wc = _constant(w) if sx is None and sw is None else None
        float_conv = wc is not None and wc.dtype == np.float32 and wc.ndim == 3 and _is_f32(x)
        if (sx is None or sw is None) and not float_conv:
            return NoMatch(
                "x or w does not come from a DequantizeLinear (not a QDQ Conv group), and it is "
                "not a float 1-D Conv with a constant float32 weight"
            )
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        uses = list(y.uses)
        q = uses[0][0] if len(uses) == 1 else None
        graph_output = any(o is y for o in m.graph.outputs)
        if not float_conv and q is not None and q.op_type == "QuantizeLinear" and not graph_output:
            sy = _q_storage(q.outputs[0])
            sb = _dq_storage(bias) if bias is not None else IntType(32, True)
            # QDQS8ToU8Transformer first turns a lone int8 Q -> DQ pair into uint8
            ux = sx == U8 or (sx == I8 and x.producer is not None and _s8_pair_to_u8(x.producer.inputs[0], m))
            uy = sy == U8 or (sy == I8 and _s8_pair_to_u8(q.outputs[0], m))
            if ux and uy and sw.bits == 8 and sb == IntType(32, True):
                return NoMatch(
                    "ONNX Runtime fuses this group into QLinearConv (uint8 activations): integer arithmetic"
                )
        auto = conv.attrs.get("auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto not in ("NOTSET", "VALID", ""):
            return NoMatch(f"auto_pad {auto} (explicit pads only)")
        ws = _shape(w)
        v = w
        while (
            ws is None
            and v.producer is not None
            and v.producer.op_type in ("DequantizeLinear", "QuantizeLinear")
        ):
            # a contrib DequantizeLinear's output may be untyped; Paddle's weights are
            # Constant -> QuantizeLinear -> DequantizeLinear
            v = v.producer.inputs[0]
            ws = _shape(v)
        if ws is None or len(ws) not in (3, 4) or not all(isinstance(d, int) for d in ws):
            return NoMatch("w has no known rank 3 or 4 (1-D and 2-D Convs only)")
        rank = len(ws) - 2
        strides = [int(v) for v in conv.attrs.get("strides", [1] * rank)]
        dil = [int(v) for v in conv.attrs.get("dilations", [1] * rank)]
        pads = (
            [int(v) for v in conv.attrs.get("pads", [0] * 2 * rank)]
            if auto in ("NOTSET", "")
            else [0] * 2 * rank
        )
        kernel = [1] * (2 - rank) + list(ws[2:])
        if ws[1] == 1 and all(v == 1 for v in (*strides, *dil)) and not any(pads) and kernel != [1, 1]:
            # MlasConvPrepare's GEMM-direct TransB forms (a kernel spanning the input's
            # width, or its height with width 1) are not modelled: only a known smaller input
            xs = x.type.shape if x.type is not None else None
            hw = [1] * (2 - rank) + list(xs[2:]) if xs is not None and len(xs) == rank + 2 else None
            if hw is None or not all(isinstance(d, int) for d in hw):
                return NoMatch(
                    "a one-channel stride-1 unpadded Conv of unknown input size (MLAS may take a GEMM-direct form)"
                )
            if kernel[1] == hw[1] or (kernel[0] == hw[0] and kernel[1] == 1):
                return NoMatch(
                    "the kernel spans the input's width or height (MLAS's GEMM-direct form, not modelled)"
                )
        m.data["pads"] = pads
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        conv = m.root
        attrs = {k: v for k, v in conv.attrs.items() if k not in ("auto_pad", "pads")}
        attrs["pads"] = m.data["pads"]
        attrs["threads"] = self.threads
        return b.op(
            "MlasConv",
            list(conv.inputs),
            attrs,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=conv.name or None,
        )


class QdqConvToMlasQLinearConv(Rule):
    """Q(Conv(DQ(xq), DQ(wq: int8), DQ(b: int32)?)) (a group ORT fuses into QLinearConv)
    -> quanta::MlasQLinearConv(xq, sx, zx, wq, sw, zw, sy, zy, b?)
    (module docstring: ORT's u8·s8 kernels without VNNI saturate pairs of products)"""

    pattern = (
        "y = QuantizeLinear(c = Conv(xf = DequantizeLinear(xq, sx, zx?), "
        "wf = DequantizeLinear(wq, sw, zw?), ...), sy, zy?)"
    )
    shared_ok = frozenset({"xf", "wf"})

    def check(self, m: Match) -> Match | NoMatch:
        conv = m.node("c")
        sx, sw = _dq_storage(m["xf"]), _dq_storage(m["wf"])
        sy = _q_storage(m["y"])
        bias = conv.inputs[2] if len(conv.inputs) > 2 else None
        sb = _dq_storage(bias) if bias is not None else IntType(32, True)
        # ORT's QDQS8ToU8Transformer makes a lone int8 Q -> DQ pair uint8 first
        ux = sx == U8 or (sx == I8 and _s8_pair_to_u8(m["xq"], m))
        uy = sy == U8 or (sy == I8 and _s8_pair_to_u8(m["y"], m))
        if not (ux and uy and sb == IntType(32, True)):
            return NoMatch("ONNX Runtime does not fuse this group into QLinearConv (ConvToMlasConv's case)")
        if sw != I8:
            return NoMatch(f"weights are {sw}, not int8 (ORT's u8·u8 kernel widens to int16: exact)")
        wq = _constant_codes(m["wq"])
        consts = [_constant(m[k]) for k in ("sx", "sw", "sy")]
        zps = [_constant(m[k]) if m[k] is not None else None for k in ("zx", "zw", "zy")]
        if (
            wq is None
            or any(c is None for c in consts)
            or any(m[k] is not None and z is None for k, z in zip(("zx", "zw", "zy"), zps, strict=True))
        ):
            return NoMatch("weights, scales or zero points are not constants")
        if wq.ndim not in (3, 4):
            return NoMatch(f"w of rank {wq.ndim} (1-D and 2-D Convs only)")
        group = int(conv.attrs.get("group", 1))
        if group > 1 and wq.shape[1] == 1 and wq.shape[0] == group:
            return NoMatch("a depthwise Conv: ORT's depthwise kernel is exact (quanta's own path)")
        auto = conv.attrs.get("auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        if auto not in ("NOTSET", "VALID", ""):
            return NoMatch(f"auto_pad {auto} (explicit pads only)")
        codes_b = None
        if bias is not None:
            codes_b = _constant_codes(bias.producer.inputs[0]) if bias.producer is not None else None
            if codes_b is None:
                return NoMatch("the bias codes are not a constant")
        if any(c.size != 1 for c in (consts[0], consts[2])):
            return NoMatch("x or y is not quantized per tensor")
        m.data.update(wq=wq, b=codes_b)
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        conv = m.node("c")
        auto = conv.attrs.get("auto_pad", "NOTSET")
        auto = auto.decode() if isinstance(auto, bytes) else auto
        attrs = {k: v for k, v in conv.attrs.items() if k in ("strides", "dilations", "group")}
        rank = m.data["wq"].ndim - 2
        attrs["pads"] = (
            [int(v) for v in conv.attrs.get("pads", [0] * 2 * rank)]
            if auto in ("NOTSET", "")
            else [0] * 2 * rank
        )
        name = conv.name or m["y"].name
        zeros = {}
        for k in ("zx", "zw", "zy"):
            if m[k] is None:
                t = _dq_storage(m["xf"] if k == "zx" else m["wf"]) if k != "zy" else _q_storage(m["y"])
                assert t is not None
                zeros[k] = b.const(f"{name}_{k}", np.zeros((), t.numpy))
        inputs = [
            m.value("xq"),
            m.value("sx"),
            zeros.get("zx") or m.value("zx"),
            b.const(f"{name}_w_codes", m.data["wq"]),
            m.value("sw"),
            zeros.get("zw") or m.value("zw"),
            m.value("sy"),
            zeros.get("zy") or m.value("zy"),
        ]
        if m.data["b"] is not None:
            inputs.append(b.const(f"{name}_b_codes", m.data["b"]))
        return b.op(
            "MlasQLinearConv",
            inputs,
            attrs,
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=conv.name or None,
        )


def _prepacked_int8_b(m: Match, sb: object) -> NoMatch | None:
    """None when b (storage ``sb``) is the constant int8 matrix ORT prepacks for its
    saturating u8·s8 kernels, else why not (QLinearMatMul and QGemm groups alike)."""
    if sb != I8:
        return NoMatch(f"b is {sb}, not int8 (ORT's u8·u8 kernel widens to int16: exact)")
    wq = _constant_codes(m["bq"])
    if wq is None or wq.ndim != 2:
        return NoMatch("b is not a constant matrix (ORT prepacks only a constant 2-D b)")
    return None


class QdqMatMulToSaturatingQLinearMatMul(Rule):
    """Q(MatMul(DQ(a: u8), DQ(b: int8 constant))) (a group ORT fuses into QLinearMatMul)
    -> QLinearMatMul(a, sa, za, b, sb, zb, sy, zy) with ``saturating_pairs = 1``
    (module docstring: ORT's u8·s8 kernels without VNNI saturate pairs of products;
    docs/float-ops.md (QM1)). LowerMatMul would write the same node with the exact sum."""

    pattern = LowerMatMul.pattern
    shared_ok = LowerMatMul.shared_ok

    def check(self, m: Match) -> Match | NoMatch:
        sa, sb, sy = _dq_storage(m["af"]), _dq_storage(m["bf"]), _q_storage(m["y"])
        # ORT on x86 fuses uint8 a (int8 only with session.qdqisint8allowed) with a uint8 or
        # int8 y (measured, ORT 1.32)
        if sa != U8 or sy not in (U8, I8):
            return NoMatch(f"a is {sa} and y {sy}: not a group ORT fuses into its u8·s8 QLinearMatMul")
        bad = _prepacked_int8_b(m, sb)
        if bad is not None:
            return bad
        return matmul_check(m, storage_8bit)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return matmul_rewrite(m, b, "QLinearMatMul", attrs={"saturating_pairs": 1})


class QdqGemmToSaturatingQGemm(Rule):
    """Q(Gemm(DQ(a: u8), DQ(b: int8 constant), c?)) (a group ORT fuses into QGemm)
    -> com.microsoft::QGemm(a, sa, za, b, sb, zb, cq?, sy, zy) with ``saturating_pairs = 1``
    (as QdqMatMulToSaturatingQLinearMatMul; LowerGemm would write the exact sum)."""

    pattern = LowerGemm.pattern
    shared_ok = LowerGemm.shared_ok

    def check(self, m: Match) -> Match | NoMatch:
        sa, sb, sy = _dq_storage(m["af"]), _dq_storage(m["bf"]), _q_storage(m["y"])
        # ORT fuses an int8 y too, but quanta's QGemm writes A's type (LowerGemm): such a
        # group keeps LowerGemm's exact sum
        if sa != U8 or sy != U8:
            return NoMatch(f"a is {sa} and y {sy}: not uint8 a and y (QGemm's Y has A's type)")
        bad = _prepacked_int8_b(m, sb)
        if bad is not None:
            return bad
        return LowerGemm().check(m)

    def rewrite(self, m: Match, b: Builder) -> Value:
        return LowerGemm().rewrite_with(m, b, {"saturating_pairs": 1})


def _elem(v: Value | None) -> IntType | None:
    """An integer element type (a QuantType's storage), else None."""
    return None if v is None else _q_storage(v)


class MatMulIntegerSaturatingPairs(Rule):
    """%y = MatMulInteger(%a: u8, %b: i8, ...) -> the same node with ``saturating_pairs = 1``
    (module docstring: ORT's u8·s8 kernels without VNNI; docs/float-ops.md (QM1))"""

    pattern = "y = MatMulInteger(a, b, ...)"
    # the uint8 codes' input (None: the op quantizes a float input to uint8 itself)
    a_index: int | None = 0
    weight_indices: tuple[int, ...] = (1,)

    def check(self, m: Match) -> Match | NoMatch:
        node = m.root
        if node.attrs.get("saturating_pairs"):
            return NoMatch("already computed with saturating pairs")
        if self.a_index is not None and _elem(node.inputs[self.a_index]) != U8:
            elem = _elem(node.inputs[self.a_index])
            return NoMatch(f"A is {elem}, not uint8 (ORT's u8·u8 / s8·s8 kernels widen to int16: exact)")
        weights = [node.inputs[i] for i in self.weight_indices if i < len(node.inputs)]
        if not any(_elem(w) == I8 for w in weights):
            return NoMatch("no int8 weight (ORT's u8·u8 kernel widens to int16: exact)")
        if any(o is None or not o.name for o in node.outputs):
            return NoMatch(f"{node.op_type} leaves an output between two others unnamed")
        return m

    def rewrite(self, m: Match, b: Builder) -> Sequence[Value] | Value:
        node = m.root
        new = b.op(
            node.op_type,
            list(node.inputs),
            {**node.attrs, "saturating_pairs": 1},
            # an output the file omits has no type (an LSTM's Y): it keeps none
            types=[None if o.type is None else result_type(shape_from=o, elem_from=o) for o in node.outputs],
            domain=node.domain,
            name=node.name or None,
            out_names=[o.name for o in node.outputs],
            n_outputs=len(node.outputs),
            attr_types=getattr(node, "attr_types", None),
        )
        # and stays omitted: DynamicQuantizeLSTM without Y computes its H block otherwise
        for old, v in zip(node.outputs, new if isinstance(new, Sequence) else [new], strict=True):
            v.doc = old.doc
        return new


class MatMulIntegerToFloatSaturatingPairs(MatMulIntegerSaturatingPairs):
    """com.microsoft MatMulIntegerToFloat(%a: u8, %b: i8, ...): see MatMulIntegerSaturatingPairs."""

    pattern = "y = com.microsoft::MatMulIntegerToFloat(a, b, ...)"


class DynamicQuantizeMatMulSaturatingPairs(MatMulIntegerSaturatingPairs):
    """com.microsoft DynamicQuantizeMatMul(%a: f32, %b: i8, ...) (a quantized to uint8):
    see MatMulIntegerSaturatingPairs."""

    pattern = "y = com.microsoft::DynamicQuantizeMatMul(a, b, ...)"
    a_index = None


class DynamicQuantizeLstmSaturatingPairs(MatMulIntegerSaturatingPairs):
    """com.microsoft DynamicQuantizeLSTM(%x: f32, %w: i8, %r: i8, ...) (x and h quantized to
    uint8): see MatMulIntegerSaturatingPairs."""

    pattern = "y = com.microsoft::DynamicQuantizeLSTM(x, w, r, ...)"
    a_index = None
    weight_indices = (1, 2)


class SoftmaxToMlasSoftmax(Rule):
    """%y = Softmax(%x: f32) -> %y = quanta::MlasSoftmax(%x)
    (module docstring: MLAS's softmax on an AVX2 host)"""

    pattern = "y = Softmax(x)"

    def __init__(self, opset: int = 21) -> None:
        super().__init__()
        self.opset = int(opset)

    def check(self, m: Match) -> Match | NoMatch:
        x = m["x"]
        if m.root.domain:
            return NoMatch(f"Softmax is in domain {m.root.domain!r}")
        if x.type is None or x.type.elem != F32:
            return NoMatch(f"input {describe(x)} is not known to be float32 (MLAS computes float32 only)")
        y = m["y"]
        if (x.producer is not None and x.producer.op_type == "DequantizeLinear") or any(
            c.op_type == "QuantizeLinear" for c in y.consumers()
        ):
            return NoMatch("a QDQ Softmax group (ORT may fuse it into QLinearSoftmax; quanta lowers it)")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        coerce = self.opset < 13
        axis = int(m.root.attrs.get("axis", 1 if coerce else -1))
        return b.op(
            "MlasSoftmax",
            [m.value("x")],
            {"axis": axis, "coerce_2d": int(coerce)},
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )


def _ln_kernel(doc: str) -> str | None:
    """OrtLayerNorm's kernel for a norm whose last node carries ``doc`` (ms_contrib marks
    the norms it writes for ORT's Skip kernels), None: a kernel not modelled."""
    if doc == SKIP_LAYER_NORM_DOC:
        return "skip"
    if doc == SKIP_SIMPLIFIED_LAYER_NORM_DOC:
        return None
    return "layer_norm"


def _skip_fused(x: Value, graph: Graph, norm: set[Node], axis: int) -> bool:
    """Whether ORT's SkipLayerNormFusion turns the norm of ``x`` (read only by the nodes
    ``norm``) into SkipLayerNormalization, whose kernel is Welford's (OL8)-(OL9): x is an
    Add of two rank-3 tensors of one known shape that only the norm reads, the norm over
    the last axis (measured on ORT 1.32: rank 2, or the sum read elsewhere too, stays
    LayerNormalization)."""
    p = x.producer
    if p is None or p.domain or p.op_type != "Add" or len(p.inputs) != 2 or axis not in (-1, 2):
        return False
    if any(o is x for o in graph.outputs) or any(c not in norm for c in x.consumers()):
        return False
    shapes = [v.type.shape if v is not None and v.type is not None else None for v in p.inputs]
    # a dimension ORT knows: a size, or a named one; onnx's "unk__" names are quanta's own
    # inference where the file states none (PaddleOCR's computed Reshapes), which ORT's
    # fusion does not see
    if any(sh is None or len(sh) != 3 or any(not _known_dim(d) for d in sh) for sh in shapes):
        return False
    return tuple(shapes[0]) == tuple(shapes[1])


def _known_dim(d: object) -> bool:
    return isinstance(d, int) or (isinstance(d, str) and not d.startswith("unk__"))


class LayerNormToOrtLayerNorm(Rule):
    """%y = LayerNormalization(%x: f32, scale, bias?) -> %y = quanta::OrtLayerNorm(%x, scale, bias?)
    (module docstring: ORT's LayerNormalization / SkipLayerNormalization kernels)"""

    pattern = "y = LayerNormalization(x, scale, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        node, _x = m.root, m["x"]
        if node.domain:
            return NoMatch(f"LayerNormalization is in domain {node.domain!r}")
        if any(o is not None and (o.uses or any(o is g for g in m.graph.outputs)) for o in node.outputs[1:]):
            return NoMatch("its Mean or InvStdDev output is read")
        if int(node.attrs.get("stash_type", 1)) != 1:
            return NoMatch("stash_type is not float32")
        for v in node.inputs:
            if v is not None and (v.type is None or v.type.elem != F32):
                return NoMatch(f"input {describe(v)} is not known to be float32")
        kernel = _ln_kernel(node.doc)
        if kernel is None:
            return NoMatch("ORT's SkipSimplifiedLayerNormalization kernel is not modelled")
        if kernel == "layer_norm" and _skip_fused(_x, m.graph, {node}, int(node.attrs.get("axis", -1))):
            kernel = "skip"
        m.data["kernel"] = kernel
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        node = m.root
        return b.op(
            "OrtLayerNorm",
            [v for v in node.inputs if v is not None],
            {
                "axis": int(node.attrs.get("axis", -1)),
                "epsilon": float(node.attrs.get("epsilon", 1e-5)),
                "kernel": m.data["kernel"],
            },
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=node.name or None,
        )


def _row_affine(
    y: Value, graph: Graph, op: str, x: Value, axis: int
) -> tuple[Node, np.ndarray, Value] | None:
    """fuse_layer_norm's affine step (the Mul / Add by a constant that is ``y``'s only
    reader) for a norm over x's last axis whose length shape inference does not know: a
    constant of one row, as LayerNormFusion takes it."""
    shape = x.shape
    if (
        shape is None
        or axis % len(shape) != len(shape) - 1
        or isinstance(shape[-1], int)
        or not _internal(y, graph)
    ):
        return None
    node = y.consumers()[0]
    if node.domain or node.op_type != op or len(node.inputs) != 2:
        return None
    c = node.inputs[1] if node.inputs[0] is y else node.inputs[0]
    arr = _f32_const(c)
    if arr is None or c is y or arr.ndim < 1 or arr.size != arr.shape[-1] or arr.size < 2:
        return None
    return node, arr, c


class _WrittenNormToOrtLayerNorm:
    """The rewrite of a written-out norm ORT's graph optimizer fuses (LayerNormFusion,
    SimplifiedLayerNormFusion): both need the affine scale (and LayerNorm its bias)."""

    kernel = "layer_norm"

    def _accept(self, m: Match) -> Match | NoMatch:
        scale, bias = m.data.get("scale"), m.data.get("bias")
        if scale is None or (self.kernel == "layer_norm" and bias is None):
            return NoMatch("no constant scale (and bias) after the norm: ORT does not fuse it")
        if self.kernel == "simplified" and bias is not None:
            return NoMatch("a bias after an RMS norm: ORT's fused kernel has none")
        last = (bias or scale)[0]
        kernel = self.kernel if self.kernel == "simplified" else _ln_kernel(last.doc)
        if kernel == "layer_norm" and _skip_fused(m.data["x"], m.graph, set(m.matched), int(m.data["axis"])):
            kernel = "skip"
        if self.kernel == "simplified" and last.doc == SKIP_SIMPLIFIED_LAYER_NORM_DOC:
            kernel = None
        if kernel is None:
            return NoMatch("ORT's SkipSimplifiedLayerNormalization kernel is not modelled")
        for name, t in (("scale", scale), ("bias", bias)):
            if (
                t is not None
                and np.asarray(t[1]).ndim > 1
                and np.asarray(t[1]).size != np.asarray(t[1]).shape[-1]
            ):
                return NoMatch(f"the {name} is not one row (ORT's kernel reads one per element of a row)")
        m.data["kernel"] = kernel
        return m

    def rewrite(self, m: Match, b: Builder) -> None:
        x, scale, bias = m.data["x"], m.data["scale"], m.data["bias"]
        inputs = [x, scale[2]] + ([bias[2]] if bias is not None else [])
        last = (bias or scale)[0]
        old = last.outputs[0]
        attrs = {"axis": int(m.data["axis"]), "epsilon": m.data["eps"], "kernel": m.data["kernel"]}
        new = b.op(
            "OrtLayerNorm",
            inputs,
            attrs,
            types=result_type(shape_from=old, elem_from=old),
            domain=QUANTA_DOMAIN,
        )
        b.replace(old, new)


class WrittenLayerNormToOrtLayerNorm(_WrittenNormToOrtLayerNorm, FuseLayerNorm):
    """Div(Sub(x, ReduceMean(x)), Sqrt(...)) · scale + bias -> quanta::OrtLayerNorm(x, scale, bias)
    (module docstring: ORT fuses a written-out LayerNorm into its LayerNormalization kernel)"""

    def check(self, m: Match) -> Match | NoMatch:
        found = FuseLayerNorm.check(self, m)
        if isinstance(found, NoMatch):
            return found
        if found.data.get("scale") is None:
            # x's row length unknown to shape inference (PaddleOCR's Reshape of a computed
            # shape): ORT still fuses a one-row scale and bias over the last axis
            x, y = found.data["x"], m.value("y")
            scale = _row_affine(y, m.graph, "Mul", x, found.data["axis"])
            bias = _row_affine(scale[0].outputs[0], m.graph, "Add", x, found.data["axis"]) if scale else None
            found.data.update(scale=scale, bias=bias)
            # the nodes the engine removes once unread: the affine tail first (FuseLayerNorm's order)
            found.matched = [*(a[0] for a in (bias, scale) if a is not None), *found.matched]
        return self._accept(found)


class WrittenRmsNormToOrtLayerNorm(_WrittenNormToOrtLayerNorm, FuseRMSNorm):
    """x / Sqrt(ReduceMean(x²) + eps) · scale (or x · 1/Sqrt(..)) -> quanta::OrtLayerNorm(x, scale,
    kernel="simplified") (module docstring: ORT's SimplifiedLayerNormalization kernel)"""

    kernel = "simplified"

    def check(self, m: Match) -> Match | NoMatch:
        found = FuseRMSNorm.check(self, m)
        return found if isinstance(found, NoMatch) else self._accept(found)


def _const_scalar(v: Value | None, want: float) -> bool:
    c = _constant(v)
    return c is not None and c.dtype == np.float32 and c.size == 1 and float(c.reshape(-1)[0]) == want


def _mul_operands(v: Value | None) -> tuple[Value, Value] | None:
    p = v.producer if v is not None else None
    if p is None or p.domain or p.op_type != "Mul" or len(p.inputs) != 2:
        return None
    return p.inputs[0], p.inputs[1]


def _other(pair: tuple[Value, Value], constant: float) -> Value | None:
    """The operand of a Mul / Add pair that is not the float32 scalar ``constant``."""
    a, c = pair
    if _const_scalar(c, constant):
        return a
    if _const_scalar(a, constant):
        return c
    return None


class FastGeluToOrtFastGelu(Rule):
    """Mul(Mul(0.5, v), Add(Tanh(Mul(v, Add(Mul(Mul(C', v), v), B))), 1)) -> quanta::OrtFastGelu(v)
    (module docstring: the chain ms_contrib writes for com.microsoft FastGelu, (FG1))"""

    pattern = "y = Mul(h, p)"

    def check(self, m: Match) -> Match | NoMatch:
        g = m.graph
        for h, p in ((m["h"], m["p"]), (m["p"], m["h"])):
            pair = _mul_operands(h)
            v = _other(pair, 0.5) if pair else None
            add = p.producer if p is not None else None
            if v is None or add is None or add.domain or add.op_type != "Add" or len(add.inputs) != 2:
                continue
            t = _other((add.inputs[0], add.inputs[1]), 1.0)
            tanh = t.producer if t is not None else None
            if tanh is None or (tanh.op_type, tanh.domain) not in (("Tanh", ""), ("MlasTanh", QUANTA_DOMAIN)):
                continue
            arg = _mul_operands(tanh.inputs[0])
            if arg is None or v not in arg:
                continue
            inner = arg[1] if arg[0] is v else arg[0]
            ip = inner.producer
            if ip is None or ip.domain or ip.op_type != "Add" or len(ip.inputs) != 2:
                continue
            if not (
                _const_scalar(ip.inputs[1], float(ORT_FAST_GELU_B))
                or _const_scalar(ip.inputs[0], float(ORT_FAST_GELU_B))
            ):
                continue
            cvv = ip.inputs[0] if _const_scalar(ip.inputs[1], float(ORT_FAST_GELU_B)) else ip.inputs[1]
            outer = _mul_operands(cvv)
            if outer is None or v not in outer:
                continue
            cv = _mul_operands(outer[1] if outer[0] is v else outer[0])
            if cv is None or _other(cv, float(ORT_FAST_GELU_C)) is not v:
                continue
            chain = [h.producer, add, tanh, tanh.inputs[0].producer, ip, cvv.producer]
            chain.append((outer[1] if outer[0] is v else outer[0]).producer)
            if any(not _only_use(n.outputs[0], g) for n in chain):
                continue
            if v.type is None or v.type.elem != F32:
                return NoMatch(f"input {describe(v)} is not known to be float32")
            m.data["v"] = v
            m.matched = [m.root, *chain]
            return m
        return NoMatch("not the chain ms_contrib writes for FastGelu (FG1)")

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "OrtFastGelu",
            [m.data["v"]],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )


def _scalar_op(v: Value | None, op: str, value: float) -> tuple[Node, Value] | None:
    """``v = op(w, value)`` (either order) with ``value`` a float32 scalar initializer or
    Constant node: (node, w)."""
    node = v.producer if v is not None else None
    if node is None or node.domain or node.op_type != op or len(node.inputs) != 2:
        return None
    for c, w in ((node.inputs[1], node.inputs[0]), (node.inputs[0], node.inputs[1])):
        if w is not None and _const_scalar(c, value):
            return node, w
    return None


class WrittenGeluTanhToOrtFastGelu(Rule):
    """Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3), C)), K)), 1)) -> quanta::OrtFastGelu(x)
    (ORT's FastGeluFusion, its second formula, turns the written-out tanh GELU, T5's
    ``gelu_new``, into its FastGelu kernel, eq. (FG1)): every node's output read once and
    none a graph output (fast_gelu_fusion.cc CheckNode; the last Mul too), the constants
    f32 3, 0.044715, √(2/π), 1 and 0.5 as initializers (or Constant nodes: this pass runs
    before constant folding)."""

    pattern = "y = Mul(p, q)"

    def check(self, m: Match) -> Match | NoMatch:
        y = m.value("y")
        if m.root.domain or not _is_f32(y):
            return NoMatch("not a float32 Mul")
        if any(o is y for o in m.graph.outputs):
            return NoMatch("the GELU's output is a graph output: ORT's FastGeluFusion leaves it")
        found = self._match(m.value("p"), m.value("q")) or self._match(m.value("q"), m.value("p"))
        if found is None:
            return NoMatch(
                "not a tanh GELU: Mul(Mul(x, 0.5), Add(Tanh(Mul(Add(x, Mul(Pow(x, 3), C)), K)), 1))"
            )
        x, inner = found
        for node in inner:
            out = node.outputs[0]
            if len(out.consumers()) != 1 or any(o is out for o in m.graph.outputs):
                return NoMatch(f"the intermediate '{out.name}' has other users (ORT does not fuse it)")
        m.data["x"] = x
        m.matched = [m.root, *inner]
        return m

    @staticmethod
    def _match(half_x: Value, t1: Value) -> tuple[Value, list[Node]] | None:
        half = _scalar_op(half_x, "Mul", 0.5)
        plus1 = _scalar_op(t1, "Add", 1.0)
        if half is None or plus1 is None:
            return None
        x = half[1]
        tp = plus1[1].producer
        if tp is None or (tp.op_type, tp.domain) not in (("Tanh", ""), ("MlasTanh", QUANTA_DOMAIN)):
            return None
        scaled = _scalar_op(tp.inputs[0], "Mul", float(GELU_K))
        add = scaled[1].producer if scaled is not None else None
        if scaled is None or add is None or add.domain or add.op_type != "Add" or len(add.inputs) != 2:
            return None
        c = add.inputs[1] if add.inputs[0] is x else add.inputs[0] if add.inputs[1] is x else None
        times_c = _scalar_op(c, "Mul", float(GELU_C))
        cube = _scalar_op(times_c[1], "Pow", 3.0) if times_c is not None else None
        if times_c is None or cube is None or cube[1] is not x or cube[0].inputs[0] is not x:
            return None
        return x, [half[0], plus1[0], tp, scaled[0], add, times_c[0], cube[0]]

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            "OrtFastGelu",
            [m.data["x"]],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )


def _only_use(v: Value, graph: Graph) -> bool:
    return len(v.uses) == 1 and not any(o is v for o in graph.outputs)


def _scale_of(node: Node | None) -> tuple[np.float32, Value] | None:
    """(scale, the scaled value) of a Mul or Div by a scalar constant, as ORT's
    MatMulScaleFusion reads it (GetScaleFromNode: Div's divisor becomes f32(1 / divisor);
    Mul's first scalar operand, then its second); else None."""
    if node is None or node.domain or node.op_type not in ("Mul", "Div") or len(node.inputs) != 2:
        return None
    if node.op_type == "Div":
        c = _constant(node.inputs[1])
        if c is None or c.size != 1 or node.inputs[0] is None:
            return None
        return np.float32(1) / np.float32(c.reshape(-1)[0]), node.inputs[0]
    for i in (0, 1):
        c = _constant(node.inputs[i])
        other = node.inputs[1 - i]
        if c is not None and c.size == 1 and other is not None:
            return np.float32(c.reshape(-1)[0]), other
    return None


def _is_f32(v: Value | None) -> bool:
    return v is not None and v.type is not None and v.type.elem == F32


class MatMulToMlasMatMul(Rule):
    """%y = MatMul(%a: f32, %b: f32)  (B not a constant), with ORT's scale fusion:
    a scalar Mul / Div of an input or of the only use of y folds into alpha
    -> %y = quanta::MlasMatMul(%a', %b', alpha, threads=T, trans_b)
    (module docstring: ORT's float MatMul / FusedMatMul in MLAS's order)"""

    pattern = "y = MatMul(a, b)"

    def __init__(self, threads: int = 1) -> None:
        super().__init__()
        self.threads = max(1, int(threads))

    def check(self, m: Match) -> Match | NoMatch:
        a, b, y = m["a"], m["b"], m["y"]
        if m.root.domain:
            return NoMatch(f"MatMul is in domain {m.root.domain!r}")
        if not (_is_f32(a) and _is_f32(b)):
            return NoMatch("an input is not known to be float32 (MLAS's SGEMM is float32)")
        if b.is_const or _constant(b) is not None:
            # ORT packs a constant B at load and may fuse MatMul + Add into Gemm (bias first)
            return NoMatch("B is a constant (ORT's packed weight / Gemm fusions are not modelled here)")
        for v in (a, b):
            if v.type.shape is None or len(v.type.shape) < 2:
                return NoMatch(f"{describe(v)} has no known rank >= 2 (MatMul of vectors not modelled)")
        if any(p is not None and p.op_type in ("DequantizeLinear",) for p in (a.producer, b.producer)):
            return NoMatch("a QDQ MatMul group (ORT may run it as an integer kernel)")
        alpha = np.float32(1)
        inputs = [a, b]
        for i, v in enumerate((a, b)):
            sc = _scale_of(v.producer)
            if sc is not None:
                alpha = np.float32(alpha * sc[0])
                inputs[i] = sc[1]
        out = y
        if _only_use(y, m.graph):
            sc = _scale_of(y.uses[0][0])
            if sc is not None and sc[1] is y:
                alpha = np.float32(alpha * sc[0])
                out = y.uses[0][0].outputs[0]
        if not all(_is_f32(v) for v in inputs):
            return NoMatch("a scaled input is not known to be float32")
        bp = inputs[1].producer
        perm = bp.attrs.get("perm") if bp is not None and bp.op_type == "Transpose" else None
        rank = len(b.type.shape)
        # MatMulTransposeFusion folds a Transpose of B's last two axes (or, rank 3, (1, 2, 0):
        # transBatchB with transB; g2pid_tiny's keys) and the GEMM then reads B transposed,
        # which only changes MLAS's kernel for one row; t5's rank-4 (0, 2, 3, 1) stays a
        # Transpose in ORT's optimized graph
        p = tuple(int(i) for i in perm) if perm is not None else ()
        swap = (*range(rank - 2), rank - 1, rank - 2)
        m.data["trans_b"] = int(len(p) == rank and (p == swap or p == (1, 2, 0)))
        m.data["alpha"] = float(alpha)
        m.data["inputs"] = inputs
        m.data["out"] = out
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        out = m.data["out"]
        node = b.op(
            "MlasMatMul",
            m.data["inputs"],
            {"alpha": m.data["alpha"], "threads": self.threads, "trans_b": m.data["trans_b"]},
            types=result_type(shape_from=out, elem_from=out),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )
        if out is not m["y"]:
            b.replace(out, node)  # the trailing Mul / Div is then dead
        return node


class OrtRecurrentOrder(RewritePass):
    """LstmToOrtLstm and GruToOrtGru alone: the float LSTM / GRU order a session with
    ``float_functions="auto"`` takes on every file (docs/float-ops.md (RO1)). ORT's order
    is exact (twin ``reference/rnn.py`` ``functions="ort"``, bit for bit with ONNX
    Runtime) and faster than (RNN1): its products are fused multiply-add chains, one
    vector uop a multiply-add where (RNN1)'s multiply then add takes two (oskut_ws's
    LSTM, 21 steps x 42 rows, H 192: 0.75 of (RNN1)'s time, one thread)."""

    name = "ort_recurrent_order"
    rules = (LstmToOrtLstm(), GruToOrtGru())

    def __init__(self) -> None:
        super().__init__(list(type(self).rules))


#: ONNX Runtime's float orders a session may take, each a set of rules that need ORT's
#: thread count (OrtFloatFunctions ``orders``)
FLOAT_ORDERS = frozenset({"conv", "matmul", "pool"})


class OrtFloatFunctions(RewritePass):
    name = "ort_float_functions"
    rules = (
        FastGeluToOrtFastGelu(),
        WrittenGeluTanhToOrtFastGelu(),
        SigmoidToMlasLogistic(),
        TanhToMlasTanh(),
        BatchNormToOrtAffine(),
        ReduceToOrtReduce(),
        LstmToOrtLstm(),
        GruToOrtGru(),
        LayerNormToOrtLayerNorm(),
        WrittenLayerNormToOrtLayerNorm(),
        WrittenRmsNormToOrtLayerNorm(),
        ResizeToOrtResizeLinear(),
    )

    def __init__(
        self,
        threads: int | None = None,
        *,
        u8s8_saturates: bool = False,
        opset: int = 21,
        orders: frozenset[str] = FLOAT_ORDERS,
    ) -> None:
        """``threads``: ONNX Runtime's intra-op thread count the float Convs and MatMuls
        follow (None: none of ORT's float orders is taken; Conv groups keep quanta's exact
        arithmetic).
        ``orders``: which of ORT's float orders (FLOAT_ORDERS) are taken when ``threads``
        is given: "conv" (ConvToMlasConv), "matmul" (MatMulToMlasMatMul), "pool"
        (GlobalAveragePoolToMlasPool, AveragePoolToMlasPool).
        ``u8s8_saturates``: ORT's u8·s8 kernels on this CPU saturate pairs of products (x86
        without VNNI): the Conv groups ORT fuses become MlasQLinearConv, its fused MatMul
        and Gemm groups QLinearMatMul and QGemm with ``saturating_pairs``, and the u8·s8
        integer GEMMs (MatMulInteger, MatMulIntegerToFloat, DynamicQuantizeMatMul,
        DynamicQuantizeLSTM) take ``saturating_pairs``."""
        unknown = set(orders) - set(FLOAT_ORDERS)
        if unknown:
            raise ValueError(
                f"OrtFloatFunctions: unknown float orders {sorted(unknown)}; expected {sorted(FLOAT_ORDERS)}"
            )
        rules = [*type(self).rules, SoftmaxToMlasSoftmax(opset)]
        if threads is not None:
            if "pool" in orders:
                rules.append(GlobalAveragePoolToMlasPool())
            if "conv" in orders:
                rules.append(ConvToMlasConv(threads))
            if "matmul" in orders:
                rules.append(MatMulToMlasMatMul(threads))
            if "pool" in orders:
                rules.append(AveragePoolToMlasPool())
        if u8s8_saturates:
            rules.insert(0, QdqConvToMlasQLinearConv())
            rules.insert(1, QdqMatMulToSaturatingQLinearMatMul())
            rules.insert(2, QdqGemmToSaturatingQGemm())
            rules += [
                MatMulIntegerSaturatingPairs(),
                MatMulIntegerToFloatSaturatingPairs(),
                DynamicQuantizeMatMulSaturatingPairs(),
                DynamicQuantizeLstmSaturatingPairs(),
            ]
        super().__init__(rules)
