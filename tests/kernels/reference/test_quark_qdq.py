"""AMD Quark's MXQuantizeDequantize / BFPQuantizeDequantize (kernels/reference/quark_qdq.py)
against a line-by-line Python transliteration of Quark's CPU kernels (mx_kernel.cc,
funcs.cuh, bfp_kernel.cc: one element at a time, Python integers and float32 via struct),
on single-node models run by both backends. Quark's own library is not a test dependency;
the note benchmarks/results/2026-12-05d-lead.md records the comparison with it (252
cases, every bit equal)."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from onnx import TensorProto, helper

import quanta
from quanta.kernels.reference import quark_qdq
from quanta.kernels.reference.quark_qdq import QUARK_DOMAIN
from quanta.targets.base import TargetError


def f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def from_bits(u: int) -> float:
    return struct.unpack("<f", struct.pack("<I", u & 0xFFFFFFFF))[0]


def exponent(v: float) -> int:
    return (bits(v) >> 23) & 0xFF


def _c(f, v: float) -> float:
    """C's floor / ceil / trunc on a float: a zero result keeps v's sign (Python's are ints)."""
    r = float(f(v))
    return math.copysign(r, v) if r == 0 else r


def c_round(v: float) -> float:  # std::round: half away from zero
    t = _c(math.trunc, v)
    return t + math.copysign(1.0, v) if abs(v - t) >= 0.5 else t


def dpu_round(v: float) -> float:
    return _c(math.ceil, v) if v < 0 and v - _c(math.floor, v) == 0.5 else c_round(v)


def py3_round(v: float) -> float:
    fl = _c(math.floor, v)
    d = v - fl
    if d > 0.5:
        return fl + 1
    if d == 0.5:
        return fl + 1 if int(fl) % 2 in (1, -1) else fl
    return fl


ROUND = {0: c_round, 1: dpu_round, 2: py3_round}


def fake_quantize_element(element: float, max_norm: float, ebits: int, mbits: int) -> float:
    exp = exponent(element)
    if exp == 255:
        return element
    new_bias = (1 << (ebits - 1)) - 1
    mantissa = bits(element) & 0x7FFFFF
    mantissa_bits = 23
    if exp != 0:
        mantissa |= 1 << 23
        mantissa_bits += 1
    new_exp = exp - 127 + new_bias
    exp_shift = 0 if new_exp > 0 else 1 - new_exp
    tail_bits = 23 - mbits + exp_shift
    if tail_bits > 25:
        mantissa = 0
    else:
        half = 1 << (tail_bits - 1)
        tail = mantissa & ((1 << tail_bits) - 1)
        ret = mantissa >> tail_bits
        mantissa = ret if tail < half else ret + 1 if tail > half else ret + (ret % 2)
    if mantissa == 0:
        return 0.0
    mantissa <<= tail_bits
    if mantissa >= 1 << mantissa_bits:
        if exp != 0:
            mantissa >>= 1
        exp += 1
    absolute = from_bits((exp << 23) + (mantissa & 0x7FFFFF))
    if absolute > max_norm:
        absolute = f32(max_norm)
    return from_bits(bits(absolute) + ((bits(element) >> 31) << 31))


ELEMENTS = {  # custom_op_mx.cc ParseElementDataTypeString
    "fp8_e5m2": (5, 2, 15, 57344.0, -57344.0),
    "fp8_e4m3": (4, 3, 8, 448.0, -448.0),
    "fp6_e3m2": (3, 2, 4, 28.0, -28.0),
    "fp6_e2m3": (2, 3, 2, 7.5, -7.5),
    "fp4_e2m1": (2, 1, 2, 6.0, -6.0),
    "int8": (0, 8, 0, 127.0, -128.0),
}


def mx_block(block: list[float], name: str, mode: int) -> list[float]:
    ebits, mbits, emax, max_norm, min_norm = ELEMENTS[name]
    shared = max((0 if exponent(v) == 255 else exponent(v)) for v in block)
    scale = f32(2.0 ** (shared - 127 - emax))
    out = []
    for v in block:
        if exponent(v) == 255:
            out.append(v)
            continue
        element = f32(v / scale)
        if ebits > 0:
            element = fake_quantize_element(element, max_norm, ebits, mbits)
        else:
            lsb = 2.0**-6
            element = ROUND[mode](f32(element / lsb))
            element = f32(max(min_norm, min(element, max_norm)) * lsb)
        out.append(f32(scale * element))
    return out


def bfp_block(block: list[float], bit_width: int, mode: int) -> list[float]:
    shared = max((0 if exponent(v) == 255 else exponent(v)) for v in block) - 127
    m = bit_width - 9
    scale = f32(2.0 ** (shared - (m - 1)))
    top = f32(2.0 ** (shared + 1) - scale)
    out = []
    for v in block:
        if exponent(v) == 255:
            out.append(v)
            continue
        x = f32(ROUND[mode](f32(v / scale)) * scale)
        out.append(max(-top, min(x, top)))
    return out


def transliterated(x: np.ndarray, axis: int, block: int, per_block) -> np.ndarray:
    """custom_op_mx.cc / custom_op_bfp.cc: one element passes, rank 1 blocks axis 0, else
    the axis moved last, padded with zeros, blocks, sliced, moved back."""
    xf = x.astype(np.float32)
    if xf.size == 1:
        return x.copy()
    axis = 0 if xf.ndim == 1 else axis % xf.ndim
    moved = np.moveaxis(xf, axis, -1)
    rows = moved.reshape(-1, moved.shape[-1])
    out = np.empty_like(rows)
    for r, row in enumerate(rows):
        vals = [float(v) for v in row] + [0.0] * (-len(row) % block)
        done: list[float] = []
        for k in range(0, len(vals), block):
            done += per_block(vals[k : k + block])
        out[r] = np.array(done[: len(row)], np.float32)
    y = np.moveaxis(out.reshape(moved.shape), -1, axis)
    return y.astype(x.dtype)


def data(rng: np.random.Generator, shape: tuple[int, ...], dtype) -> np.ndarray:
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-7, 7, shape))).astype(np.float32)
    flat = x.reshape(-1)
    specials = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-40, -3e-39, 2.5, 0.5 * 2**-6, -2.5 * 2**-6, 896.0]
    flat[: min(flat.size, len(specials))] = specials[: flat.size]
    return x.astype(dtype)


def run(op: str, x: np.ndarray, backend: str, **attrs) -> np.ndarray:
    code = TensorProto.FLOAT if x.dtype == np.float32 else TensorProto.FLOAT16
    node = helper.make_node(op, ["x"], ["y"], name="q0", domain=QUARK_DOMAIN, **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", code, list(x.shape))],
        [helper.make_tensor_value_info("y", code, list(x.shape))],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(QUARK_DOMAIN, 1)]
    )
    return quanta.InferenceSession(m.SerializeToString(), backend=backend).run(None, {"x": x})[0]


def same_bits(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    view = np.uint16 if got.dtype == np.float16 else np.uint32
    assert np.array_equal(got.view(view), want.view(view)), (got, want)


SHAPES = [
    ((3, 70), 1, 32),
    ((70,), 0, 32),
    ((2, 7, 5), 1, 4),
    ((2, 9, 3), -1, 8),
    ((1, 1), 0, 8),
    ((4, 33), 0, 16),
]


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("name", list(ELEMENTS))
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_mx_quantize_dequantize_is_quarks_kernel(backend, name, mode, dtype):
    rng = np.random.default_rng([mode, *name.encode()])
    for shape, axis, block in SHAPES:
        x = data(rng, shape, dtype)
        if rng.random() < 0.5:
            x = (x * np.float32(1e-38)).astype(dtype)  # subnormal blocks
        want = transliterated(x, axis, block, lambda b: mx_block(b, name, mode))
        got = run(
            "MXQuantizeDequantize",
            x,
            backend,
            element_dtype=name,
            axis=axis,
            block_size=block,
            rounding_mode=mode,
        )
        same_bits(got, want)


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("mode", [0, 1, 2])
@pytest.mark.parametrize("bit_width", [16, 13])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bfp_quantize_dequantize_is_quarks_kernel(backend, mode, bit_width, dtype):
    rng = np.random.default_rng(mode * 31 + bit_width)
    for shape, axis, block in SHAPES:
        x = data(rng, shape, dtype)
        want = transliterated(x, axis, block, lambda b: bfp_block(b, bit_width, mode))
        got = run(
            "BFPQuantizeDequantize",
            x,
            backend,
            bfp_method="to_bfp",
            axis=axis,
            bit_width=bit_width,
            block_size=block,
            rounding_mode=mode,
        )
        same_bits(got, want)


def test_rounding_modes_on_ties_and_the_sign_of_zero():
    v = np.array([2.5, -2.5, 3.5, -3.5, -0.2, 0.5, -0.5], np.float32)
    for mode, f in ROUND.items():
        want = np.array([f(float(t)) for t in v], np.float32)
        same_bits(quark_qdq._round(v, mode), want)


def test_bfp_prime_is_refused_with_its_name():
    with pytest.raises(quark_qdq.OpError, match="to_bfp_prime"):
        quark_qdq.bfp_quantize_dequantize(np.ones(8, np.float32), bfp_method="to_bfp_prime")


def session(op: str, **attrs) -> quanta.InferenceSession:
    node = helper.make_node(op, ["x"], ["y"], name="q7", domain=QUARK_DOMAIN, **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3, 17])],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(QUARK_DOMAIN, 1)]
    )
    return quanta.InferenceSession(m.SerializeToString())


@pytest.mark.parametrize(
    ("op", "attrs", "why"),
    [
        ("BFPQuantizeDequantize", {"bfp_method": "to_bfp_prime"}, "only 'to_bfp'"),
        ("BFPQuantizeDequantize", {"convert_to_bfloat_before_bfp": 1}, "convert_to_bfloat_before_bfp"),
        ("BFPQuantizeDequantize", {"use_compiler_version_cpu_kernel": 1}, "use_compiler_version"),
        ("BFPQuantizeDequantize", {"bit_width": 9}, "bit_width 9"),
        ("MXQuantizeDequantize", {"element_dtype": "fp3"}, "element_dtype 'fp3'"),
        ("MXQuantizeDequantize", {"rounding_mode": 5}, "rounding_mode 5"),
    ],
)
def test_what_the_kernels_leave_out_is_refused_when_the_session_is_built(op, attrs, why):
    """Not on the first run: the session names the node and the attribute."""
    with pytest.raises(TargetError, match=rf"q7.*{why}|{why}.*q7") as e:
        session(op, **attrs)
    assert "q7" in str(e.value) and why.split()[0] in str(e.value)


def test_the_implemented_attributes_build_a_session():
    x = np.linspace(-3.0, 5.0, 51, dtype=np.float32).reshape(3, 17)
    y = session("BFPQuantizeDequantize", bit_width=13, block_size=8, axis=1).run(None, {"x": x})[0]
    same_bits(y, quark_qdq.bfp_quantize_dequantize(x, 13, 1, 8, 0, "to_bfp"))
