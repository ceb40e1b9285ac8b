"""Which of ONNX Runtime's CPU kernels this host runs, from its CPU flags: what decides
whether a twin of quanta.kernels.reference (MLAS's saturating int8 pairs, its FMA3 SGEMM
order, its FMA3 or AVX-512F Softmax) is ONNX Runtime's arithmetic here. The kernels layer
reads it (the Softmax twin follows the host's order); quanta.quantize.ort_saturation
re-exports it for the quantizers' advice.
"""

from __future__ import annotations

import platform

__all__ = [
    "onnxruntime_float_orders_modelled",
    "onnxruntime_int8_saturates",
    "onnxruntime_softmax_avx512f",
    "onnxruntime_softmax_modelled",
]

_X86 = ("x86_64", "amd64", "i386", "i686", "x86")


def _cpu_flags() -> set[str] | None:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.partition(":")[2].split())
    except OSError:
        return None
    return None


def _x86_flags(flags: set[str] | None, machine: str | None) -> set[str] | None:
    """The CPU flags of an x86 host (``flags`` when given), None on another machine or
    where /proc/cpuinfo cannot be read: no advice rather than a wrong one."""
    if (machine or platform.machine()).lower() not in _X86:
        return None
    return _cpu_flags() if flags is None else flags


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
    flags = _x86_flags(flags, machine)
    return flags is not None and "avx2" in flags and not ({"avx512_vnni", "avx_vnni"} & flags)


def onnxruntime_float_orders_modelled(flags: set[str] | None = None, machine: str | None = None) -> bool:
    """True when ONNX Runtime's float SGEMM on this CPU is MLAS's FMA3 kernel family (x86
    with AVX2 and FMA, no AVX-512F), the one whose order reference/mlas_conv.py and
    mlas_matmul.py model bit for bit; an AVX-512F host runs MLAS's AVX-512 SGEMM kernels,
    another order. False where the CPU's flags cannot be read. The default session takes
    ORT's float orders (session.AUTO_FLOAT_ORDERS) only on such a host.

    >>> onnxruntime_float_orders_modelled({"avx2", "fma"}, "x86_64")
    True
    >>> onnxruntime_float_orders_modelled({"avx2", "fma", "avx512f"}, "x86_64")
    False
    >>> onnxruntime_float_orders_modelled({"asimd"}, "aarch64")
    False
    """
    flags = _x86_flags(flags, machine)
    return flags is not None and {"avx2", "fma"} <= flags and "avx512f" not in flags


def _native_softmax_avx512f() -> bool | None:
    """The native library's answer (``_native.host_runs_ort_avx512f``: CPUID and XCR0, as
    MLAS reads them, and the order ``mlas_softmax_f32`` takes by default); None where the
    library is not built."""
    try:
        from quanta.kernels import _native
    except ImportError:
        return None
    return bool(_native.host_runs_ort_avx512f())


def onnxruntime_softmax_avx512f(flags: set[str] | None = None, machine: str | None = None) -> bool:
    """True when ONNX Runtime's float Softmax on this CPU runs MLAS's AVX-512F sum-exp kernel
    (``MlasComputeSumExpF32KernelAvx512F``: docs/float-ops.md (SX1), (SX2)): MLAS's
    platform table takes it on x86 with AVX2, FMA and AVX-512F usable (the OS saves the
    AVX-512 state). False elsewhere and where the flags cannot be read.

    This host (no ``flags``, no ``machine``): the native library's CPUID probe when it is
    built, so the twin and the native kernel take one order; /proc/cpuinfo's flags
    without it. The two can differ: an emulator's CPU model (QEMU's ``-cpu Haswell``)
    answers CPUID without AVX-512F while /proc/cpuinfo shows the real host's flags, and
    ONNX Runtime, like the native library, follows CPUID.

    >>> onnxruntime_softmax_avx512f({"avx2", "fma", "avx512f"}, "x86_64")
    True
    >>> onnxruntime_softmax_avx512f({"avx2", "fma"}, "x86_64")
    False
    >>> onnxruntime_softmax_avx512f({"avx512f"}, "x86_64")
    False
    >>> onnxruntime_softmax_avx512f({"asimd"}, "aarch64")
    False
    """
    if flags is None and machine is None:
        native = _native_softmax_avx512f()
        if native is not None:
            return native
    flags = _x86_flags(flags, machine)
    return flags is not None and {"avx2", "fma", "avx512f"} <= flags


def onnxruntime_softmax_modelled(flags: set[str] | None = None, machine: str | None = None) -> bool:
    """True when reference/ort_float.mlas_softmax_rows is ONNX Runtime's float Softmax on
    this CPU bit for bit: x86 with AVX2 and FMA, where MLAS runs its FMA3 sum-exp kernel
    or, with AVX-512F, its AVX-512F one (:func:`onnxruntime_softmax_avx512f`).

    >>> onnxruntime_softmax_modelled({"avx2", "fma", "avx512f"}, "x86_64")
    True
    >>> onnxruntime_softmax_modelled({"avx", "sse4_1"}, "x86_64")
    False
    """
    flags = _x86_flags(flags, machine)
    return flags is not None and {"avx2", "fma"} <= flags
