"""Native quanta::QLinearMatMul16 / QLinearConv16 on the a16w8 kernels
(quanta/kernels/cpp/a16w8; docs/quantization-math.md eqs. (A1)-(A4)).

Compile time (the binders): the constant weight becomes ``W' = w − ow`` (``ow`` = 32768
for uint16 weights, else 0), split into a high and a low byte plane when it does not fit
in [−255, 255] (16-bit weights, eq. (A2)), and packed into the micro-kernel's layout
(:func:`pack_weight`; a convolution's as rows, :func:`pack_rows`); the per-column terms ``dw = ow − zw`` and ``cw = Σ_k W'`` of
eq. (A3) and the int64 bias are computed once; the float32 multipliers ``f32(f32(sa·sb)/sy)``
are the ones the lowering carries on the node (``node.requant``, derived once by
quanta/passes/lower/requant_params.py). Run time: one kernel call per node; the reference twin (same numbers) takes inputs
outside the fast path (another dtype than compiled for, a 3-D convolution).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.a16w8 import QUANTA_DOMAIN, WIDE_TYPES, bias64, matmul16_output
from quanta.kernels.reference.conv_geometry import conv_attrs
from quanta.kernels.reference.integer_ops import b_param
from quanta.kernels.reference.requant import requant_multiplier, storage_range
from quanta.passes.lower.requant_params import requant_params
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache
from quanta.targets.native._specialize import SMALL_MACS, guarded, step_threads
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import run_twin
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = ["bind_qlinear_conv16", "bind_qlinear_matmul16", "pack_rows", "pack_weight", "weight_terms"]

F32 = np.float32
_SHORT = {
    np.dtype(np.uint8): "u8",
    np.dtype(np.int8): "i8",
    np.dtype(np.uint16): "u16",
    np.dtype(np.int16): "i16",
}
KNR = 32  # columns per micro-kernel call (a16w8.h kNR)


def _offset(dtype: np.dtype) -> int:
    return 32768 if dtype == np.uint16 else 0


def _planes(wk: np.ndarray, split: bool = False) -> list[np.ndarray]:
    """``W'`` as one plane when ``|W'| ≤ 255`` (and not ``split``), else the planes
    ``hi = W' >> 8`` (scaled by 256 in the kernel) and ``lo = W' & 255`` (eq. (A2))."""
    if not split and (wk.size == 0 or (wk.min() >= -255 and wk.max() <= 255)):
        return [wk]
    return [wk >> 8, wk & 255]


def pack_rows(wk: np.ndarray, split: bool = False) -> np.ndarray:
    """``W' [K, N]`` (int64 values) -> int16 ``[planes, N, 2·k2]``: the convolution's weight
    rows (a16w8.h ``conv2d``), K padded to even with zeros; planes as :func:`_planes`."""
    wk = np.asarray(wk, np.int64)
    k, n = wk.shape
    planes = _planes(wk, split)
    out = np.zeros((len(planes), n, 2 * ((k + 1) // 2)), np.int16)
    for i, p in enumerate(planes):
        out[i, :, :k] = p.T
    return out


def pack_weight(wk: np.ndarray) -> np.ndarray:
    """``W' [K, N]`` (int64 values) -> int16 ``[planes, blocks, k2, 32]`` (a16w8.h layout):
    one plane when ``|W'| ≤ 255``, else the planes ``hi = W' >> 8`` (scaled by 256 in the
    kernel) and ``lo = W' & 255`` (eq. (A2))."""
    wk = np.asarray(wk, np.int64)
    k, n = wk.shape
    planes = _planes(wk)
    k2 = (k + 1) // 2
    blocks = 2 * ((n + KNR - 1) // KNR)
    out = np.zeros((len(planes), blocks, k2, 32), np.int16)
    for i, p in enumerate(planes):
        padded = np.zeros((2 * k2, blocks * 16), np.int64)
        padded[:k, :n] = p
        # [k2, 2, blocks, 16] -> [blocks, k2, 16, 2]: pairs of k interleaved per column
        out[i] = padded.reshape(k2, 2, blocks, 16).transpose(2, 0, 3, 1).reshape(blocks, k2, 32)
    return out


def weight_terms(wk: np.ndarray, w_dtype: np.dtype, zw: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``dw[n] = ow − zw[n]`` and ``cw[n] = Σ_k W'[k, n]`` (eq. (A3)), int64 [N]."""
    dw = np.ascontiguousarray(np.broadcast_to(_offset(w_dtype) - np.asarray(zw, np.int64).reshape(-1), (n,)))
    cw = np.ascontiguousarray(np.asarray(wk, np.int64).sum(axis=0).reshape(n))
    return dw.astype(np.int64), cw.astype(np.int64)


def _per_column(v: np.ndarray | None, n: int) -> np.ndarray | None:
    if v is None:
        return None
    v = np.asarray(v)
    if v.size == 1:
        return np.full(n, v.reshape(()), v.dtype)
    if v.size == n:
        return np.ascontiguousarray(v.reshape(n))
    return None


def _common(node: Node, n: int, op: str) -> tuple[dict[str, Any] | None, str]:
    """The shared compile-time part: dtypes, constant scalar parameters, per-column weight
    parameters, the multipliers and the bias."""
    ins = [node.input(i) for i in range(9)]
    x, sx, zx, w, sw, zw, sy, zy, bias = ins
    for name, v in (("the activation", x), ("the weight", w), ("y_zero_point", zy)):
        dt = _dtype(v)
        if dt is None or dt not in WIDE_TYPES:
            return None, f"native {op}: {name} is {dt}, expected uint8, int8, uint16 or int16"
    consts = {
        name: _const(v)
        for name, v in (("sx", sx), ("zx", zx), ("sw", sw), ("zw", zw), ("sy", sy), ("zy", zy))
    }
    missing = [k for k, v in consts.items() if v is None]
    if missing:
        return None, f"native {op} takes constant scales and zero points ({', '.join(missing)} not constant)"
    for k in ("sx", "zx", "sy", "zy"):
        if consts[k].size != 1:
            return None, f"native {op}: {k} is not a scalar"
    for k in ("sx", "sw", "sy"):
        if consts[k].dtype != F32:
            return None, f"native {op} takes float32 scales, {k} is {consts[k].dtype}"
    s_w = _per_column(consts["sw"], n)
    z_w = _per_column(consts["zw"], n)
    if s_w is None or z_w is None:
        return (
            None,
            f"native {op}: the weight's scale / zero point is neither per tensor nor per output channel ({n})",
        )
    # the multiplier the lowering carries on the node (passes/lower/requant_params.py)
    rq = requant_params(node)
    if rq is None:
        return None, f"native {op}: no requantization multiplier for its scales"
    mult = _per_column(np.asarray(rq.multiplier, F32), n)
    if mult is None:
        return None, f"native {op}: the requantization multiplier is neither per tensor nor per column ({n})"
    mult = np.ascontiguousarray(mult, F32)
    b64 = None
    if bias is not None:
        cb = _const(bias)
        if cb is None or cb.dtype != np.int32 or cb.size != n:
            return None, f"native {op}: the bias is not a constant int32 of {n} values"
        b64 = np.ascontiguousarray(cb.reshape(n), np.int64)
    params = {
        "x_dtype": _dtype(x),
        "zx": int(consts["zx"].reshape(())),
        "zy": int(consts["zy"].reshape(())),
        "out_dtype": _SHORT[np.dtype(consts["zy"].dtype)],
        "mult": mult,
        "bias64": b64,
    }
    return params, z_w


def _matmul16_native(
    ctx: Any, a: np.ndarray, *rest: np.ndarray, out: np.ndarray | None = None, **p: Any
) -> np.ndarray:
    if a.dtype == p["x_dtype"] and a.flags.c_contiguous and a.ndim >= 1:
        return _native.a16w8_matmul(
            a,
            p["packed"],
            p["k"],
            p["n"],
            p["dw"],
            p["cw"],
            p["bias64"],
            p["mult"],
            p["zx"],
            p["zy"],
            p["out_dtype"],
            num_threads=_threads(ctx),
            out=out,
        )
    return run_twin("QLinearMatMul16", QUANTA_DOMAIN, ctx, (a, *rest), {}, out)


def _matmul16_specialized(sig: Specialization, **p: Any) -> Any:
    """a of the compiled type and known shape: the kernel's arguments bound once, one
    recordable call into the step's output (the same kernel, so the same bytes)."""
    shape, out = sig.shapes[0], sig.out
    if sig.dtypes[0] != p["x_dtype"] or shape is None or len(shape) < 1 or out is None:
        return None
    threads = step_threads(sig, work=int(np.prod(out.shape)) * int(p["k"]), small=SMALL_MACS)
    mm, packed, k, n, dw, cw = _native.a16w8_matmul, p["packed"], p["k"], p["n"], p["dw"], p["cw"]
    bias, mult, zx, zy, od = p["bias64"], p["mult"], p["zx"], p["zy"], p["out_dtype"]
    return guarded(
        lambda a, *rest: mm(a, packed, k, n, dw, cw, bias, mult, zx, zy, od, threads, out),
        _matmul16_native,
        p,
        out,
        reads=1,
        recordable=True,
    )


#: largest K for which float64 sums of 16 x 16-bit products are exact: each product is
#: below 2^32 in magnitude, so every partial sum of K of them stays below 2^53
EXACT_F64_K = 1 << 21


@functools.cache
def _blas() -> ThreadpoolController:
    """One controller for the process (building one scans the loaded libraries)."""
    return ThreadpoolController()


def _matmul16_runtime_b(
    ctx: Any,
    a: np.ndarray,
    sa: np.ndarray,
    za: np.ndarray,
    b: np.ndarray,
    sb: np.ndarray,
    zb: np.ndarray,
    sy: np.ndarray,
    zy: np.ndarray,
    bias: np.ndarray | None = None,
    *,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """A run-time b (attention scores, ``x @ xᵀ``): eq. (A1) as one float64 BLAS product of
    the zero-point-shifted operands. Every operand, product and partial sum is an integer
    below 2^53 when K < EXACT_F64_K, so the sums are the twin's int64 ones whatever the
    summation order; eq. (A4) is the twin's own code (``matmul16_output``). NumPy's int64
    matmul (the twin's) has no BLAS. Eq. (A5) of docs/quantization-math.md."""
    if (
        a.dtype not in WIDE_TYPES
        or b.dtype not in WIDE_TYPES
        or a.ndim < 1
        or b.ndim < 2
        or a.shape[-1] != b.shape[-2]
        or a.shape[-1] >= EXACT_F64_K
        or np.asarray(za).size != 1
    ):
        args = (a, sa, za, b, sb, zb, sy, zy) + (() if bias is None else (bias,))
        return run_twin("QLinearMatMul16", QUANTA_DOMAIN, ctx, args, {}, out)
    # the sums are exact in any order, so any BLAS thread count gives the same bytes. One
    # thread: BLAS's own pool spins beside the session's workers (on a busy 2-core machine
    # the product took 4-6x its one-thread time, 3x at a 2-thread session)
    zb64 = b_param(np.asarray(zb), b.shape, "b_zero_point").astype(np.float64)
    with _blas().limit(limits=1, user_api="blas"):
        acc = np.matmul(a.astype(np.float64) - float(np.asarray(za).reshape(())), b.astype(np.float64) - zb64)
    dtype = np.asarray(zy).dtype
    m = requant_multiplier(
        np.asarray(sa, F32).reshape(()),
        b_param(np.asarray(sb, F32), b.shape, "b_scale"),
        np.asarray(sy, F32).reshape(()),
    )
    if np.asarray(zy).size != 1 or not np.all(np.isfinite(m)):
        y = matmul16_output(acc.astype(np.int64), sa, sb, b.shape, sy, zy, bias, dtype)
    else:
        if bias is not None:
            # |acc + bias| < K·2^32 + 2^31 < 2^53: still exact in float64
            acc += bias64(bias, b.shape[-1], "QLinearMatMul16").astype(np.float64)
        y = _requantize_exact_sums(acc, m, int(np.asarray(zy).reshape(())), dtype)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _requantize_exact_sums(acc: np.ndarray, m: np.ndarray, zy: int, dtype: np.dtype) -> np.ndarray:
    """Eq. (A4) on float64 sums that hold exact integers, in float32 arrays updated in place:
    the operations of ``reference.requant.requantize`` (the twin's) without its int64
    passes. ``f32(acc)`` rounds the exact integer once, as the int64 -> float32 cast does;
    the clamp to ``[qmin − zy, qmax − zy]`` comes before the rounding, so ``rint + zy`` is an
    integer of the output type, exact in float32 (|v| ≤ 65535). A finite ``m`` (the caller
    checks) keeps NaN out."""
    qmin, qmax = storage_range(dtype)
    v = acc.astype(F32)
    with np.errstate(over="ignore"):  # an infinite product saturates in the clamp, as the twin's
        np.multiply(v, m, out=v)
    np.clip(v, F32(qmin - zy), F32(qmax - zy), out=v)
    np.rint(v, out=v)
    v += F32(zy)
    return v.astype(dtype)


@register_binder("QLinearMatMul16", QUANTA_DOMAIN)
def bind_qlinear_matmul16(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """A constant rank-2 b (per tensor or per column), constant per-tensor a and y; or a
    run-time b (:func:`_matmul16_runtime_b`)."""
    del model  # unused: the choice depends on the node only
    if node.input(3) is not None and _const(node.input(3)) is None:
        return Kernel(_matmul16_runtime_b, "native", "native:qlinear_matmul16_runtime_b", out=True), ""
    b = _const(node.input(3))
    if b is None or b.ndim != 2:
        return None, "native QLinearMatMul16 takes a constant rank-2 b"
    k, n = b.shape
    params, z_w = _common(node, n, "QLinearMatMul16")
    if params is None:
        return None, z_w
    wk = b.astype(np.int64) - _offset(b.dtype)
    params["dw"], params["cw"] = weight_terms(wk, b.dtype, z_w, n)
    params.update(packed=pack_weight(wk), k=k, n=n)
    name = f"native:qlinear_matmul16_{_SHORT[params['x_dtype']]}{_SHORT[b.dtype]}"
    return Kernel(
        _matmul16_native, "native", name, params=params, out=True, specialize=_matmul16_specialized
    ), ""


def _conv16_geometry(shape: tuple[int, ...], kernel: list[int], attrs: dict) -> tuple:
    """The kernel's 2-D geometry of one input shape (a 1-D convolution as one row):
    kernel, strides, dilations, (top, left) pads, output (h, w) and the output's spatial
    shape. Cached per input shape in the kernel's params: conv_attrs costs more than the
    kernel call of a small layer (SE blocks' 1×1 convolutions)."""
    g = conv_attrs(shape, kernel, **attrs)
    if len(shape) == 4:
        return (
            tuple(g.kernel_shape),
            tuple(g.strides),
            tuple(g.dilations),
            (g.pads[0], g.pads[1]),
            tuple(g.out_shape),
            tuple(g.out_shape),
        )
    return (
        (1, g.kernel_shape[0]),
        (1, g.strides[0]),
        (1, g.dilations[0]),
        (0, g.pads[0]),
        (1, g.out_shape[0]),
        tuple(g.out_shape),
    )


def _conv16_native(
    ctx: Any, x: np.ndarray, *rest: np.ndarray, out: np.ndarray | None = None, attrs: dict, **p: Any
) -> np.ndarray:
    if x.dtype == p["x_dtype"] and x.flags.c_contiguous and x.ndim in (3, 4):
        kernel, strides, dil, pads, out_hw, out_shape = p["geometry"].get(
            x.shape, lambda: _conv16_geometry(x.shape, p["kernel"], attrs)
        )
        x4 = x if x.ndim == 4 else x.reshape(x.shape[0], x.shape[1], 1, x.shape[2])
        y4 = None if out is None else out.reshape(x.shape[0], p["m"], *out_hw)
        if p["depthwise"]:
            y = _native.a16w8_conv2d_depthwise(
                x4,
                p["zx"],
                p["wd"],
                kernel,
                strides,
                dil,
                pads,
                out_hw,
                p["bias64"],
                p["mult"],
                p["zy"],
                p["out_dtype"],
                num_threads=_threads(ctx),
                out=y4,
            )
        else:
            y = _native.a16w8_conv2d(
                x4,
                p["zx"],
                p["packed"],
                p["m"],
                kernel,
                strides,
                dil,
                pads,
                out_hw,
                p["group"],
                p["dw"],
                p["cw"],
                p["bias64"],
                p["mult"],
                p["zy"],
                p["out_dtype"],
                num_threads=_threads(ctx),
                out=y4,
            )
        return y.reshape(x.shape[0], p["m"], *out_shape) if out is None else out
    return run_twin("QLinearConv16", QUANTA_DOMAIN, ctx, (x, *rest), attrs, out)


def _conv16_specialized(sig: Specialization, **p: Any) -> Any:
    """x of the compiled type and a known 3-D / 4-D shape: the geometry, the 4-D views and
    the kernel's arguments bound once; one recordable kernel call into the step's output."""
    shape, out = sig.shapes[0], sig.out
    if sig.dtypes[0] != p["x_dtype"] or shape is None or len(shape) not in (3, 4) or out is None:
        return None
    kernel, strides, dil, pads, out_hw, _ = _conv16_geometry(shape, p["kernel"], p["attrs"])
    y4 = out.reshape(shape[0], p["m"], *out_hw)
    x4_shape = None if len(shape) == 4 else (shape[0], shape[1], 1, shape[2])
    macs = int(np.prod(out.shape)) * int(np.prod(kernel)) * max(1, shape[1] // p["group"])
    threads = step_threads(sig, work=macs, small=SMALL_MACS)
    bias, mult, zx, zy, od = p["bias64"], p["mult"], p["zx"], p["zy"], p["out_dtype"]
    if p["depthwise"]:
        dwc, wd = _native.a16w8_conv2d_depthwise, p["wd"]

        def call(x: np.ndarray, *rest: Any) -> np.ndarray:
            dwc(
                x if x4_shape is None else x.reshape(x4_shape),
                zx,
                wd,
                kernel,
                strides,
                dil,
                pads,
                out_hw,
                bias,
                mult,
                zy,
                od,
                threads,
                y4,
            )
            return out

    else:
        conv, packed, m, group, dw, cw = (
            _native.a16w8_conv2d,
            p["packed"],
            p["m"],
            p["group"],
            p["dw"],
            p["cw"],
        )

        def call(x: np.ndarray, *rest: Any) -> np.ndarray:
            conv(
                x if x4_shape is None else x.reshape(x4_shape),
                zx,
                packed,
                m,
                kernel,
                strides,
                dil,
                pads,
                out_hw,
                group,
                dw,
                cw,
                bias,
                mult,
                zy,
                od,
                threads,
                y4,
            )
            return out

    return guarded(call, _conv16_native, p, out, reads=1, recordable=True)


@register_binder("QLinearConv16", QUANTA_DOMAIN)
def bind_qlinear_conv16(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """1-D and 2-D convolutions with a constant weight; depthwise (C/group = M/group = 1)
    on the direct kernel, the rest on the a16w8 GEMM per group."""
    del model  # unused
    w = _const(node.input(3))
    if w is None or w.ndim not in (3, 4):
        return None, "native QLinearConv16 takes a constant 1-D or 2-D convolution weight"
    m_out = w.shape[0]
    group = int(node.attrs.get("group", 1))
    if group < 1 or m_out % group:
        return None, f"native QLinearConv16: group {group} does not divide M={m_out}"
    params, z_w = _common(node, m_out, "QLinearConv16")
    if params is None:
        return None, z_w
    attrs = {
        k: node.attrs[k]
        for k in ("auto_pad", "dilations", "kernel_shape", "pads", "strides")
        if k in node.attrs
    }
    cg, mg = w.shape[1], m_out // group
    kk = int(np.prod(w.shape[2:]))
    zw_col = np.asarray(z_w, np.int64).reshape(m_out)
    params.update(kernel=list(w.shape[2:]), m=m_out, group=group, attrs=attrs, geometry=BoundedCache())
    # the direct kernel's float64 sums are exact below 2^20 taps (a16w8.h kMaxDepthwiseTaps)
    params["depthwise"] = group > 1 and cg == 1 and mg == 1 and kk < 2**20
    if params["depthwise"]:
        params["wd"] = np.ascontiguousarray(w.reshape(m_out, kk).astype(np.int64) - zw_col[:, None]).astype(
            np.int32
        )
        name = f"native:qlinear_conv16_dw_{_SHORT[params['x_dtype']]}{_SHORT[w.dtype]}"
        return Kernel(
            _conv16_native, "native", name, params=params, out=True, specialize=_conv16_specialized
        ), ""
    # W'[k, n] per group: k over (c, kh, kw) as the kernel's im2col rows, n the group's channels
    wk = (w.astype(np.int64) - _offset(w.dtype)).reshape(group, mg, cg * kk).transpose(0, 2, 1)
    # one plane count for every group: split them all when one needs two
    split = any(len(_planes(wk[g])) == 2 for g in range(group))
    params["packed"] = np.ascontiguousarray(np.stack([pack_rows(wk[g], split) for g in range(group)]))
    params["dw"], params["cw"] = weight_terms(
        wk.transpose(1, 0, 2).reshape(cg * kk, m_out), w.dtype, zw_col, m_out
    )
    name = f"native:qlinear_conv16_{_SHORT[params['x_dtype']]}{_SHORT[w.dtype]}"
    return Kernel(_conv16_native, "native", name, params=params, out=True, specialize=_conv16_specialized), ""
