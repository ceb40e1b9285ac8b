"""Whether ONNX Runtime computes this file's int8 products exactly on the host CPU.

ONNX Runtime's MLAS multiplies uint8 activations by int8 weights on x86 cores without
VNNI (AVX2, AVX-512BW) with VPMADDUBSW, which adds the products of two adjacent reduction
steps into a *saturated* int16: |x0*w0 + x1*w1| reaches 2 * 255 * 128 = 65280 with
full-range weights and is clipped to 32767 (docs/kernels.md "AVX2"). Its fused
QLinearConv / QLinearMatMul / MatMulInteger / QGemm / DynamicQuantizeLSTM are then not the
file's arithmetic; measured on such a core (benchmarks/results/2026-12-02d-ort-avx2.md),
quanta's default EfficientNet-Lite0 file gives top-1 agreement 0.945 in quanta and 0.695
in ONNX Runtime as users run it, all-MiniLM-L6-v2's 22.5 dB and 20.3 dB. Weights on the
7-bit grid (``weight_bits=7``, ORT's ``reduce_range``) keep every pair sum within
2 * 255 * 64 = 32640, exact there (0.93 / 24.2 dB and 19.05 dB, the same in both
runtimes), at the cost of one bit on every layer. ``weight_pairs="ort"``
(quanta.quantize.ort_pairs, docs/debugger.md eq. (12m)) keeps the 8-bit grid and
constrains only the pairs ORT adds: in ORT's order, no two same-sign codes whose
magnitudes add past 128, which no uint8 input can overflow; alone it costs more than the
bit (EfficientNet-Lite0 0.69), and ``weight_pairs="ort_rows"`` (eq. (12n)) puts each
output row where the constraint costs more on the 7-bit grid instead: 0.935 / 25.5 dB
in both runtimes against weight_bits=7's 0.925 / 24.1 dB
(benchmarks/results/2026-12-07c-pairsafe11.md). quanta's kernels are exact either way.

One mechanism serves every caller: :func:`saturating_weights` reads a written file and
names the int8 weights ORT's saturating kernels would meet: those with a pair, in ORT's
order for the op that reads them, that a uint8 input can push past int16. The quantizers put
:func:`file_note` in their summary (the written file is the same on every machine, only
the advice depends on the host); ``quanta bench --vs-ort`` says the same of any file.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from quanta.kernels.reference.conv_geometry import is_depthwise
from quanta.kernels.reference.ort_host import (
    onnxruntime_float_orders_modelled,
    onnxruntime_int8_saturates,
    onnxruntime_softmax_avx512f,
    onnxruntime_softmax_modelled,
)
from quanta.quantize.ort_pairs import pair_excess, pair_partners

__all__ = [
    "file_note",
    "onnxruntime_float_orders_modelled",
    "onnxruntime_int8_saturates",
    "onnxruntime_softmax_avx512f",
    "onnxruntime_softmax_modelled",
    "saturating_weights",
    "saturation_note",
]


def saturation_note(n_weights: int) -> str:
    """The advice for a file with ``n_weights`` weight tensors that ONNX Runtime's int8
    kernels saturate on this host (:func:`saturating_weights`)."""
    return (
        f"this CPU has no VNNI: ONNX Runtime here adds pairs of uint8 x int8 products in "
        f"saturating int16 (MLAS vpmaddubsw), which {n_weights} full-range int8 weight "
        "tensor(s) of this file can overflow, so ONNX Runtime's results on it can be worse "
        "than quanta's, whose kernels are exact (EfficientNet-Lite0: top-1 agreement 0.70 "
        "instead of 0.945; all-MiniLM-L6-v2: 20.3 dB instead of 22.5). weight_bits=7 "
        "(--weight-bits 7, ORT's reduce_range grid) makes ONNX Runtime exact here, and quanta's "
        "int8 GEMMs about 1.25x faster (exact vpmaddubsw instead of vpmaddwd pairs), at the cost "
        "of one weight bit; weight_pairs='ort_rows' (--weight-pairs ort_rows) keeps 8 bits on "
        "the output rows whose pairs allow it and puts the others on the 7-bit grid, which makes "
        "ONNX Runtime exact too (EfficientNet-Lite0: 0.935 in both, 0.925 with weight_bits=7) "
        "and runs quanta's GEMMs on the same vpmaddubsw pairs: compare them on your data"
    )


def file_note(path: str | os.PathLike) -> str | None:
    """:func:`saturation_note` for the file at ``path`` when this host's ONNX Runtime
    saturates some of its weights, else None. The file is read only on such hosts."""
    if not onnxruntime_int8_saturates():
        return None
    names = saturating_weights(onnx.load(os.fspath(path), load_external_data=False))
    return saturation_note(len(names)) if names else None


# (op type, input index of the int8 weight) of ONNX Runtime's integer ops whose CPU kernel
# is the u8 x s8 GEMM (QLinearConv: unless depthwise, checked below)
_INTEGER_WEIGHT_INPUTS = {
    "QLinearConv": (3,),
    "QLinearMatMul": (3,),
    "QGemm": (3,),
    "MatMulInteger": (1,),
    "MatMulIntegerToFloat": (1,),
    "DynamicQuantizeMatMul": (1,),
    "DynamicQuantizeLSTM": (1, 2),
}
# float ops that ORT's QDQ fusion turns into those kernels when their weight is a DQ output
_QDQ_GEMM_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm"})
# the readers whose depthwise form ORT runs on its exact int16 depthwise kernels
_CONV_OPS = frozenset({"Conv", "QLinearConv"})


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def _pairs_overflow(op: onnx.NodeProto, w: np.ndarray) -> bool:
    """Whether some pair of ``w``'s codes, in the order ``op``'s u8 x s8 GEMM pairs them
    (ort_pairs.pair_partners), breaks eq. (12m): a uint8 input can saturate it. A
    ConvTranspose's pairing is not modelled: any |w| > 64 counts."""
    t = op.op_type
    trans_b = next((a.i for a in op.attribute if a.name == "transB"), 0)
    if t in _CONV_OPS and w.ndim >= 3:
        rows, partners = w.reshape(w.shape[0], -1), pair_partners("Conv", w.shape)
    elif t == "DynamicQuantizeLSTM" and w.ndim == 3:  # W / R [D, K, 4H]
        rows = np.moveaxis(w, 1, 2).reshape(-1, w.shape[1])
        partners = pair_partners("LSTM", rows.shape)
    elif t in ("MatMul", "Gemm", "QGemm", *_MATMUL_OPS) and w.ndim == 2:
        rows = w if trans_b else w.T
        partners = pair_partners(t, w.shape, trans_b=bool(trans_b))
    else:
        return True
    return bool(pair_excess(rows, partners).any())


# integer ops whose weight is [K, N]
_MATMUL_OPS = ("QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul")


def saturating_weights(model: onnx.ModelProto) -> list[str]:
    """Names of the constant int8 weights of ``model`` (an onnx.ModelProto, main graph)
    that ONNX Runtime's u8 x s8 GEMM can saturate on a CPU without VNNI: a pair of codes
    in the reader's order whose same-sign magnitudes add past 128 (eq. (12m), any |w| > 64
    for a ConvTranspose), read by an integer GEMM op or by a DequantizeLinear whose output is a Conv / MatMul /
    Gemm weight (which ORT fuses). Depthwise Conv weights are left out: ORT's depthwise
    kernels widen them to int16. Weights in external data not loaded are left out (no
    claim without the values)."""
    g = model.graph
    consts = {t.name: t for t in g.initializer if t.data_type == TensorProto.INT8}
    for n in g.node:  # weights in Constant nodes too
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            t = n.attribute[0].t
            if t.data_type == TensorProto.INT8:
                consts[n.output[0]] = t
    consumers: dict[str, list] = {}
    for n in g.node:
        for i, name in enumerate(n.input):
            consumers.setdefault(name, []).append((n, i))

    found: list[str] = []
    for name, t in consts.items():
        readers = []  # the GEMM-like ops the weight reaches: directly, or through one DQ
        for node, i in consumers.get(name, []):
            if i in _INTEGER_WEIGHT_INPUTS.get(node.op_type, ()):
                readers.append(node)
            elif node.op_type == "DequantizeLinear" and i == 0:
                readers += [
                    op
                    for op, j in consumers.get(node.output[0], [])
                    if j == 1 and op.op_type in _QDQ_GEMM_OPS
                ]
        if not readers or t.data_location == TensorProto.EXTERNAL:
            continue
        w = numpy_helper.to_array(t)
        if not w.size or int(np.abs(w.astype(np.int32)).max()) <= 64:
            continue
        if any(
            not (op.op_type in _CONV_OPS and is_depthwise(_group(op), w.shape)) and _pairs_overflow(op, w)
            for op in readers
        ):
            found.append(name)
    return found
