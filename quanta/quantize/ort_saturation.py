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
runtimes): which is better depends on the model. quanta's kernels are exact either way.

The quantizers call :func:`saturation_note` and put its text in the summary: the written
file is the same on every machine, only the advice depends on the host.
"""

from __future__ import annotations

import platform

from quanta.quantize.recipe import Recipe

__all__ = ["onnxruntime_int8_saturates", "saturating_weights", "saturation_note"]

_X86 = ("x86_64", "amd64", "i386", "i686", "x86")
# Ops whose integer form in ONNX Runtime multiplies activations by int8 weights.
_GEMM_OPS = frozenset({"Conv", "ConvTranspose", "MatMul", "Gemm", "LSTM", "Attention"})


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def onnxruntime_int8_saturates(flags: set[str] | None = None, machine: str | None = None) -> bool:
    """True when ONNX Runtime's uint8 x int8 GEMM on this CPU is the saturating
    VPMADDUBSW form: x86 with AVX2 and neither AVX-512 VNNI nor AVX-VNNI. False where the
    CPU's flags cannot be read (no /proc/cpuinfo): no advice rather than a wrong one.

    >>> onnxruntime_int8_saturates({"avx2", "fma"}, "x86_64")
    True
    >>> onnxruntime_int8_saturates({"avx2", "avx512f", "avx512_vnni"}, "x86_64")
    False
    >>> onnxruntime_int8_saturates({"asimd"}, "aarch64")
    False
    """
    machine = (machine or platform.machine()).lower()
    if machine not in _X86:
        return False
    if flags is None:
        flags = _cpu_flags()
        if flags is None:
            return False
    return "avx2" in flags and not ({"avx512_vnni", "avx_vnni"} & flags)


def saturation_note(recipe: Recipe, quantized_ops: list[str], *, saturates: bool | None = None) -> str | None:
    """The advice for a file with these quantized op types under ``recipe``, or None when
    ONNX Runtime runs it exactly on this host (VNNI, uint8 weights, 7-bit weights, no
    GEMM-like op quantized)."""
    if saturates is None:
        saturates = onnxruntime_int8_saturates()
    if not saturates or recipe.weight_type != "int8" or recipe.reduce_range or recipe.weight_bits != 8:
        return None
    n = sum(op in _GEMM_OPS for op in quantized_ops)
    if n == 0:
        return None
    return (
        f"this CPU has no VNNI: ONNX Runtime here adds pairs of uint8 x int8 products in "
        f"saturating int16 (MLAS vpmaddubsw), which the full-range int8 weights of {n} "
        "quantized node(s) can overflow, so ONNX Runtime's results on this file can be worse "
        "than quanta's, whose kernels are exact (EfficientNet-Lite0: top-1 agreement 0.70 "
        "instead of 0.945; all-MiniLM-L6-v2: 20.3 dB instead of 22.5). weight_bits=7 "
        "(--weight-bits 7, ORT's reduce_range grid) makes ONNX Runtime exact here at the cost "
        "of one weight bit: compare both on your data"
    )


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


def _depthwise(node, w_shape: tuple[int, ...]) -> bool:
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    return group > 1 and len(w_shape) >= 3 and w_shape[1] == 1 and w_shape[0] == group


def saturating_weights(model) -> list[str]:
    """Names of the constant int8 weights of ``model`` (an onnx.ModelProto, main graph)
    that ONNX Runtime's u8 x s8 GEMM can saturate on a CPU without VNNI: some |w| > 64,
    read by an integer GEMM op or by a DequantizeLinear whose output is a Conv / MatMul /
    Gemm weight (which ORT fuses). Depthwise Conv weights are left out: ORT's depthwise
    kernels widen them to int16."""
    import numpy as np
    from onnx import TensorProto, numpy_helper

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

    def wide(name: str) -> tuple[bool, tuple[int, ...]]:
        t = consts[name]
        if t.data_location == TensorProto.EXTERNAL:
            return False, tuple(t.dims)  # not loaded: no claim
        a = numpy_helper.to_array(t)
        return bool(a.size) and int(np.abs(a.astype(np.int32)).max()) > 64, tuple(a.shape)

    found: list[str] = []
    for name in consts:
        hit = False
        for node, i in consumers.get(name, []):
            if i in _INTEGER_WEIGHT_INPUTS.get(node.op_type, ()):
                big, shape = wide(name)
                hit = big and not (node.op_type == "QLinearConv" and _depthwise(node, shape))
            elif node.op_type == "DequantizeLinear" and i == 0:
                for op, j in consumers.get(node.output[0], []):
                    if op.op_type in _QDQ_GEMM_OPS and j == 1:
                        big, shape = wide(name)
                        hit = big and not (op.op_type == "Conv" and _depthwise(op, shape))
                        if hit:
                            break
            if hit:
                break
        if hit:
            found.append(name)
    return found
