"""Native com.microsoft MatMulNBits (4- and 8-bit weights per block, float activations).

The binder unpacks the nibbles and dequantizes the constant weight once at compile time
by eq. (W1) (``reference/w4.py``, exact in float32: the same float32 values the twin
computes), packs it for the float GEMM (``_native.sgemm_pack_b``) and runs eq. (W2) on
``matmul_f32`` with the bias in its epilogue: the float GEMM family's numerics and bound
(docs/float-ops.md eq. (FG1)), identical for any thread count. The weight then takes
4 bytes per value in memory instead of half a byte: the trade of a CPU without a 4-bit
float path (the speed is the float GEMM's).

``accuracy_level`` 4 with integer zero points runs eqs. (W6)-(W10) instead, ONNX Runtime's
int8 path: the raw 4-bit codes packed once two to a byte (``pack_nibbles``: as many weight
bytes as ONNX Runtime's), A quantized per row and block at run time, integer block dots
with the zero point through the row's code sum, eq. (W10) (``_native.nbits_a8_matmul``,
w4/nbits_a8.h), bit-exact with the twin. 8-bit codes (``bits`` 8, eq. (NB8-1)) take the same
kernel with one code a byte (``pack_bytes``: as many weight bytes as ONNX Runtime's).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.registry import MS_DOMAIN, OpError
from quanta.kernels.reference.w4 import QUANTA_DOMAIN, nbits_codes, weight_of_codes
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import run_twin
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = [
    "bind_matmul_nbits",
    "bind_matmul_w4a8",
    "nbits_block_params",
    "pack_blocks",
    "pack_bytes",
    "pack_nibbles",
]


def _matmul_nbits_native(
    ctx: Any,
    a: np.ndarray,
    *rest: Any,
    out: np.ndarray | None = None,
    packed: Any,
    n: int,
    k: int,
    bias: np.ndarray | None,
    **attrs: Any,
) -> np.ndarray:
    if a.dtype == np.float32 and a.ndim >= 1 and a.shape[-1] == k:
        a2 = np.ascontiguousarray(a).reshape(-1, k)
        o = None if out is None else out.reshape(a2.shape[0], n)
        y = _native.matmul_f32(a2, None, packed, n, bias=bias, num_threads=_threads(ctx), out=o)
        return y.reshape(*a.shape[:-1], n) if out is None else out
    return _twin(ctx, a, rest, attrs, out)


_ATTRS = ("K", "N", "bits", "block_size", "accuracy_level")


def _twin(ctx: Any, a: np.ndarray, rest: tuple, attrs: dict, out: np.ndarray | None) -> Any:
    """MatMulNBits on its twin: what the native wrappers do not take (the node's own
    attributes only; the others are the binder's params)."""
    return run_twin(
        "MatMulNBits", MS_DOMAIN, ctx, (a, *rest), {k: v for k, v in attrs.items() if k in _ATTRS}, out
    )


@register_binder("MatMulNBits", MS_DOMAIN)
def bind_matmul_nbits(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Constant B, scales, zero points and bias; float32 A."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    if _dtype(node.input(0)) not in (None, np.dtype(np.float32)):
        return None, f"native MatMulNBits takes float32 A, got {_dtype(node.input(0))}"
    if node.input(4) is not None:
        return None, "native MatMulNBits: g_idx (act-order) is not supported"
    b, scales, zp, bias = (_const(node.input(i)) for i in (1, 2, 3, 5))
    if b is None or scales is None or (node.input(3) is not None and zp is None):
        return None, "native MatMulNBits takes constant B, scales and zero points"
    if node.input(5) is not None and (bias is None or bias.dtype != np.float32):
        return None, "native MatMulNBits takes a constant float32 bias"
    k, n = int(node.attrs["K"]), int(node.attrs["N"])
    block, bits = int(node.attrs["block_size"]), int(node.attrs.get("bits", 4))
    try:
        q, zpf, s, integer_zp = nbits_codes(b, scales, zp, k=k, n=n, block_size=block, bits=bits)
    except OpError as e:
        return None, f"native MatMulNBits refuses the node: {e}"
    if int(node.attrs.get("accuracy_level", 0)) == 4 and integer_zp:
        if block > 4096:
            return None, f"native MatMulNBits at accuracy_level 4 takes blocks up to 4096, got {block}"
        return _bind_a8(q[:, :k].T, zpf.T.astype(np.int64), s.T, k, n, block, bias, bits)
    w = weight_of_codes(q, zpf, s, k)
    params = {
        "packed": _native.sgemm_pack_b(np.ascontiguousarray(w, np.float32)),
        "n": n,
        "k": k,
        "bias": None if bias is None else np.ascontiguousarray(bias.reshape(n), np.float32),
    }
    return Kernel(_matmul_nbits_native, "native", "native:matmul_nbits_w4_f32", params=params, out=True), ""


def _matmul_nbits_a8_native(
    ctx: Any,
    a: np.ndarray,
    *rest: Any,
    out: np.ndarray | None = None,
    packed: np.ndarray,
    zp: np.ndarray,
    sw: np.ndarray,
    n: int,
    k: int,
    block: int,
    bias: np.ndarray | None,
    bits: int = 4,
    **attrs: Any,
) -> np.ndarray:
    if a.dtype == np.float32 and a.ndim >= 1 and a.shape[-1] == k:
        # positional: pybind11's keyword matching costs half a microsecond a call, a tenth of
        # a decode step's product
        return _native.nbits_a8_matmul(
            np.ascontiguousarray(a), packed, zp, sw, k, n, block, bias, _threads(ctx), out, bits
        )
    return _twin(ctx, a, rest, {**attrs, "bits": bits}, out)


def _bind_a8(
    q: np.ndarray,
    zp: np.ndarray,
    s: np.ndarray,
    k: int,
    n: int,
    block: int,
    bias: np.ndarray | None,
    bits: int = 4,
) -> tuple[Kernel, str]:
    """Eqs. (W6)-(W10): codes ``q [K, N]``, zero points and scales ``[kb, N]``."""
    zpp, sw = nbits_block_params(zp, s, n)
    params = {
        "packed": pack_nibbles(q, block) if bits == 4 else pack_bytes(q, block),
        "bits": bits,
        "zp": zpp,
        "sw": sw,
        "n": n,
        "k": k,
        "block": block,
        "bias": None if bias is None else np.ascontiguousarray(bias.reshape(n), np.float32),
    }
    name = "native:matmul_nbits_w4a8" if bits == 4 else "native:matmul_nbits_w8a8"
    return Kernel(_matmul_nbits_a8_native, "native", name, params=params, out=True), ""


def pack_bytes(q: np.ndarray, block: int) -> np.ndarray:
    """``q [K, N]`` (8-bit codes) -> w4/nbits_a8.h's 8-bit layout, uint8 ``[panels, kb,
    block/4, 128]``: per panel of 32 columns and block, groups of 4 k per column, the first
    tile's 16 columns (4 bytes each) then the second's (0 past K and N)."""
    k, n = q.shape
    kb, panels = -(-k // block), -(-n // 32)
    wp = np.zeros((kb * block, panels * 32), np.uint8)
    wp[:k, :n] = np.asarray(q)
    # [kb, block/4, 4, panels, 2, 16] -> [panels, kb, block/4, 2, 16, 4]
    w = wp.reshape(kb, block // 4, 4, panels, 2, 16).transpose(3, 0, 1, 4, 5, 2)
    return np.ascontiguousarray(w.reshape(panels, kb, block // 4, 128))


def pack_nibbles(q: np.ndarray, block: int) -> np.ndarray:
    """``q [K, N]`` (4-bit codes) -> w4/nbits_a8.h's layout, uint8 ``[panels, kb, block/4,
    64]``: per panel of 32 columns (its whole K one run of bytes) and block, groups of 4 k per
    column, column ``c``'s code in the low nibble and column ``16 + c``'s in the high one (0
    past K and N)."""
    k, n = q.shape
    kb, panels = -(-k // block), -(-n // 32)
    wp = np.zeros((kb * block, panels * 32), np.uint8)
    wp[:k, :n] = np.asarray(q)
    # [kb, block/4, 4, panels, 2, 16] -> [panels, kb, block/4, 2, 16, 4]
    w = wp.reshape(kb, block // 4, 4, panels, 2, 16).transpose(3, 0, 1, 4, 5, 2)
    packed = w[:, :, :, 0] | (w[:, :, :, 1] << np.uint8(4))
    return np.ascontiguousarray(packed.reshape(panels, kb, block // 4, 64))


def nbits_block_params(zp: np.ndarray, s: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Zero points and scales ``[kb, N]`` -> the kernel's uint8 and float32 ``[panels, kb,
    32]`` (0 past N), beside their panel's weights."""
    kb, panels = zp.shape[0], -(-n // 32)
    zpp = np.zeros((kb, panels * 32), np.uint8)
    zpp[:, :n] = zp
    sw = np.zeros((kb, panels * 32), np.float32)
    sw[:, :n] = s
    return (
        np.ascontiguousarray(zpp.reshape(kb, panels, 32).transpose(1, 0, 2)),
        np.ascontiguousarray(sw.reshape(kb, panels, 32).transpose(1, 0, 2)),
    )


# --------------------------------------------------------------------------------------
# quanta::MatMulW4A8 on the w4a8 kernel (quanta/kernels/cpp/w4/w4a8.h)
# --------------------------------------------------------------------------------------


def pack_blocks(w: np.ndarray, zw: np.ndarray | None, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``w [K, N]`` (4-bit values) and ``zw [kb, N]`` -> the kernel's int8 layout of
    ``w' = w − zw`` ([kb, ntiles, block/4, 16·4]: per block and 16-column tile, groups of
    4 k per column) and the block column sums ``Σ_k w'`` (int32 [kb, ntiles·16])."""
    k, n = w.shape
    kb, ntiles = -(-k // block), -(-n // 16)
    wp = np.zeros((kb * block, ntiles * 16), np.int64)
    wp[:k, :n] = np.asarray(w).astype(np.int64)
    if zw is not None:
        z = np.zeros((kb, ntiles * 16), np.int64)
        z[:, :n] = np.asarray(zw).astype(np.int64)
        wp[:k] -= np.repeat(z, block, axis=0)[:k]
    colsum = wp.reshape(kb, block, ntiles * 16).sum(axis=1).astype(np.int32)
    # [kb, block/4, 4, ntiles, 16] -> [kb, ntiles, block/4, 16, 4]
    packed = wp.reshape(kb, block // 4, 4, ntiles, 16).transpose(0, 3, 1, 4, 2)
    return np.ascontiguousarray(packed.reshape(kb, ntiles, block // 4, 64), np.int8), np.ascontiguousarray(
        colsum
    )


def _w4a8_native(
    ctx: Any,
    a: np.ndarray,
    *rest: Any,
    out: np.ndarray | None = None,
    a_dtype: np.dtype,
    packed: np.ndarray,
    colsum: np.ndarray,
    c: np.ndarray,
    k: int,
    n: int,
    k_block: int,
    za: int,
    sy: float | None,
    zy: int,
    out_dtype: str,
) -> np.ndarray:
    if a.dtype == a_dtype and a.ndim >= 1 and a.shape[-1] == k and a.flags.c_contiguous:
        return _native.w4a8_matmul(
            a,
            packed,
            colsum,
            c,
            k,
            n,
            k_block,
            za,
            y_scale=sy,
            zy=zy,
            out_dtype=out_dtype,
            num_threads=_threads(ctx),
            out=out,
        )
    return run_twin("MatMulW4A8", QUANTA_DOMAIN, ctx, (a, *rest), {"k_block": k_block}, out)


@register_binder("MatMulW4A8", "quanta")
def bind_matmul_w4a8(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Constant weights, scales and zero points; uint8/int8 a and y per tensor."""
    del model  # unused
    if _native is None:
        return None, "the native extension is not built"
    a, sa, za, b, sb, zb, sy, zy = (node.input(i) for i in range(8))
    a_dt = _dtype(a)
    if a_dt not in (np.dtype(np.uint8), np.dtype(np.int8)):
        return None, f"native MatMulW4A8 takes uint8/int8 a, got {a_dt}"
    w, s_b, z_b, s_a, z_a = _const(b), _const(sb), _const(zb), _const(sa), _const(za)
    if w is None or s_b is None or s_a is None or z_a is None or (zb is not None and z_b is None):
        return None, "native MatMulW4A8 takes constant weights, scales and zero points"
    if w.ndim != 2 or s_b.dtype != np.float32 or s_a.dtype != np.float32 or s_a.size != 1 or z_a.size != 1:
        return None, "native MatMulW4A8 takes a rank-2 weight, float32 scales and a per-tensor a"
    k, n = w.shape
    block = int(node.attrs["k_block"])
    kb = -(-k // block)
    if s_b.shape != (kb, n) or block % 4 or block > 4096:
        return None, f"native MatMulW4A8: b_scale {list(s_b.shape)} / block {block} do not fit the kernel"
    packed, colsum = pack_blocks(w, z_b, block)
    ntiles = -(-n // 16)
    c = np.zeros((kb, ntiles * 16), np.float32)
    c[:, :n] = np.multiply(np.float32(s_a.reshape(())), s_b, dtype=np.float32)
    params: dict[str, Any] = {
        "a_dtype": a_dt,
        "packed": packed,
        "colsum": colsum,
        "c": c,
        "k": k,
        "n": n,
        "k_block": block,
        "za": int(z_a.reshape(())),
        "sy": None,
        "zy": 0,
        "out_dtype": "f32",
    }
    if sy is not None:
        s_y, z_y = _const(sy), _const(zy)
        if s_y is None or z_y is None or s_y.size != 1 or z_y.size != 1 or s_y.dtype != np.float32:
            return None, "native MatMulW4A8 takes a constant per-tensor float32 y_scale and y_zero_point"
        params.update(
            sy=float(s_y.reshape(())),
            zy=int(z_y.reshape(())),
            out_dtype="u8" if z_y.dtype == np.uint8 else "i8",
        )
    name = f"native:matmul_w4a8_{'u8' if a_dt == np.uint8 else 's8'}{w.dtype.name}"
    return Kernel(_w4a8_native, "native", name, params=params, out=True), ""
