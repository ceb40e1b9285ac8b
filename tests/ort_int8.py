"""Where ONNX Runtime's int8 GEMM is exact on this CPU, and the int8 range it is exact for.

ORT's MLAS multiplies uint8 x int8 on x86 cores without VNNI (AVX2, AVX-512BW) with
VPMADDUBSW, which adds the two products of adjacent reduction steps into a *saturated*
int16: with full-range int8 weights ``a0*b0 + a1*b1`` reaches 2 * 255 * 128 = 65280 and is
clipped to 32767, so ORT's QLinearConv / QLinearMatMul / MatMulInteger / QGemm /
DynamicQuantizeLSTM results are not the ONNX spec's there. ORT documents this and its
quantizer offers ``reduce_range`` (7-bit weights, [-64, 64]) for such CPUs. On cores with
VNNI (VPDPBUSD sums four products into int32) and on uint8 x uint8 the kernels are exact.

quanta's kernels are exact on every core. A test that compares quanta with ORT bit for bit
passes its int8 operands through ``fit_s8`` (the full range where ORT is exact, halved to
7 bits where it saturates), asks ORT's quantizer for ``REDUCE_RANGE``, quanta's quantizers
for ``WEIGHT_BITS``, or, for a file whose weights it does not choose, runs ORT with its
int8 fusions off (``ort_session_options``), so the comparison stays exact on every machine
instead of being skipped.
"""

from __future__ import annotations

import numpy as np

from quanta.quantize.ort_saturation import onnxruntime_int8_saturates

#: True where ORT's uint8 x int8 kernels compute the exact int32 sums.
ORT_INT8_EXACT: bool = not onnxruntime_int8_saturates()

#: What to pass as ORT's quantizer ``reduce_range`` so its files run exactly in ORT here.
REDUCE_RANGE: bool = not ORT_INT8_EXACT

#: What to pass as quanta's ``weight_bits`` (quantize_static / quantize_dynamic) so that
#: ORT runs the written file exactly here: 8 where ORT is exact, else ORT's 7-bit grid.
WEIGHT_BITS: int = 8 if ORT_INT8_EXACT else 7


def ort_session_options(*, fused_int8: bool | None = None):
    """Session options for comparing a quantized file's ORT output with quanta's.

    With ``fused_int8`` False (the default where ORT's int8 kernels saturate) ORT runs the
    file unoptimized: DequantizeLinear -> float op -> QuantizeLinear, the arithmetic the
    QDQ file states, instead of its fused uint8 x int8 kernels.
    """
    import onnxruntime as ort

    so = ort.SessionOptions()
    if fused_int8 is None:
        fused_int8 = ORT_INT8_EXACT
    if not fused_int8:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return so


def fit_s8(a: np.ndarray) -> np.ndarray:
    """``a`` where ORT is exact, else an int8 ``a`` halved (arithmetic shift: [-128, 127]
    -> [-64, 63], the distribution's shape kept) so ORT's kernels compute it exactly:
    2 * 255 * 64 = 32640 fits int16."""
    a = np.asarray(a)
    if ORT_INT8_EXACT or a.dtype != np.int8:
        return a
    return (a >> 1).astype(np.int8)


def ort_functions_differ_from_exact(proto, feed: dict, expected: np.ndarray, *, exact_backend: str) -> int:
    """Asserts that ``proto``'s first output under ``float_functions="ort"`` is
    ``expected`` (ONNX Runtime's) on the native and the reference backend, and returns
    how many elements quanta's exact sum (``"onnx"`` on ``exact_backend``: "auto" on a file
    ORT's quantizer wrote takes ORT's saturating pairs too where this CPU's ORT has them) gives
    differently: a test of ORT's arithmetic needs that count above 0, else the exact sum
    could pass it too."""
    from quanta.session import InferenceSession, SessionOptions

    for backend in ("native", "reference"):
        got = InferenceSession(proto, SessionOptions(float_functions="ort"), backend=backend).run(None, feed)[
            0
        ]
        np.testing.assert_array_equal(got, expected, err_msg=f"float_functions='ort', {backend}")
    exact = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend=exact_backend).run(
        None, feed
    )[0]
    return int(np.count_nonzero(exact != expected))
