"""reference/ort_host.py: the host's ORT Softmax order has one source, the native
library's CPU probe (``_native.host_runs_ort_avx512f``), and /proc/cpuinfo's flags only
without the library (docs/float-ops.md, after (SX2))."""

from __future__ import annotations

import builtins
import platform

import numpy as np
import pytest

from quanta.kernels import native_available
from quanta.kernels.reference import ort_host
from quanta.kernels.reference.ort_float import mlas_softmax_rows

F32 = np.float32

needs_native = pytest.mark.skipif(not native_available(), reason="the native library is not built")


def subnormal_rows(d: int, seed: int) -> np.ndarray:
    """Rows [7, d] spread over ~200, every third element 60 lower: exps below the smallest
    normal float32, where the two orders' results differ ((SM2) wraps or flushes 2^m,
    (SX1) rounds p · 2^m once)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((7, d)) * 30 + rng.standard_normal((7, 1)) * 5).astype(F32)
    x[:, ::3] -= 60
    return x


@needs_native
@pytest.mark.parametrize("d", [17, 259])
def test_the_host_order_is_the_native_probe_and_the_native_default(d: int) -> None:
    """The twin's default order is the native probe's answer, and the native kernel's
    default (avx512f=-1) gives the twin's bytes; the rows are ones where the two orders
    differ, so an agreement is not a coincidence."""
    from quanta.kernels import _native

    host = bool(_native.host_runs_ort_avx512f())
    assert ort_host.onnxruntime_softmax_avx512f() is host
    x = subnormal_rows(d, seed=d)
    mine, other = mlas_softmax_rows(x, host), mlas_softmax_rows(x, not host)
    assert np.count_nonzero(mine.view(np.uint32) != other.view(np.uint32)) > 0
    np.testing.assert_array_equal(mlas_softmax_rows(x).view(np.uint32), mine.view(np.uint32))
    np.testing.assert_array_equal(_native.mlas_softmax_f32(x).view(np.uint32), mine.view(np.uint32))


def test_the_native_probe_wins_over_proc_cpuinfo(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the two disagree (QEMU's Haswell model: CPUID without AVX-512F, the real
    host's /proc/cpuinfo with it), the answer is the native probe's, in both directions."""
    for native in (False, True):
        monkeypatch.setattr(ort_host, "_native_softmax_avx512f", lambda native=native: native)
        assert ort_host.onnxruntime_softmax_avx512f() is native
        # flags given: the flags decide, not the host
        assert ort_host.onnxruntime_softmax_avx512f({"avx2", "fma", "avx512f"}, "x86_64") is True
        assert ort_host.onnxruntime_softmax_avx512f({"avx2", "fma"}, "x86_64") is False


def test_without_the_native_library_proc_cpuinfo_decides(monkeypatch: pytest.MonkeyPatch) -> None:
    """No native library (its import fails): the order is /proc/cpuinfo's flags' answer."""
    real_import = builtins.__import__

    def no_native(name, globals=None, locals=None, fromlist=(), level=0):
        if name == "quanta.kernels" and fromlist and "_native" in fromlist:
            raise ImportError("no native library (test)")
        return real_import(name, globals, locals, fromlist, level)

    monkeypatch.setattr(builtins, "__import__", no_native)
    assert ort_host._native_softmax_avx512f() is None
    flags = ort_host._cpu_flags()
    x86 = platform.machine().lower() in ort_host._X86
    want = x86 and flags is not None and {"avx2", "fma", "avx512f"} <= flags
    assert ort_host.onnxruntime_softmax_avx512f() is want
