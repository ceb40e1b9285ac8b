"""Fixtures the ORT-order rule tests share."""

from __future__ import annotations

import pytest

import quanta.quantize.ort_saturation as ort_saturation

#: CPU flags of a host whose ONNX Runtime saturates u8·s8 pairs (AVX2, no VNNI) and of one
#: whose sums are exact (AVX-512 VNNI)
HOSTS = {"avx2": {"avx2", "fma"}, "vnni": {"avx2", "fma", "avx512f", "avx512_vnni"}}


@pytest.fixture(params=sorted(HOSTS))
def host(request, monkeypatch):
    """The session sees the named host: (name, whether ORT saturates there)."""
    real = ort_saturation.onnxruntime_int8_saturates
    saturates = real(HOSTS[request.param], "x86_64")
    monkeypatch.setattr(ort_saturation, "onnxruntime_int8_saturates", lambda *a, **k: saturates)
    return request.param, saturates
