"""Native integer GEMMs on the qgemm core (quanta/kernels/cpp/qgemm): QLinearMatMul,
MatMulInteger, com.microsoft QGemm, MatMulIntegerToFloat and DynamicQuantizeMatMul.

Every operator here is one call of ``_native.qgemm`` (a prepacked b) or of
``_native.qgemm_batched`` (a run-time b, quanta/kernels/cpp/gemm) per node::

    acc[.., m, n] = Σ_k (a[.., m, k] − za[m]) · (b[.., k, n] − zb[n])  (+ bias[n])   eq. (4)
    y             = output_stage(acc)                     (qgemm.h; reference/qgemm.py)

with the output stage's multiplier the lowering derived and carries on the node
(``node.requant``, quanta/passes/lower/requant_params.py; the same float32 operations as
the operator's NumPy twin, so bit-exact: tests/targets/test_native_gemm.py):

    QLinearMatMul         m[n] = f32(f32(sa · sb[n]) / sy)          requant_params.float_multiplier
                          y    = requantize(acc, m, zy)            eq. (6), uint8/int8 out
    MatMulInteger         y    = acc                               int32 out
    QGemm, y_scale        m[n] = f32(f32(f32(alpha · sa) · sb[n]) / sy), requantized by eq. (6)
    QGemm, no y_scale     m[n] = f32(f32(alpha · sa) · sb[n]),   y = f32(f32(acc) · m[n])
    MatMulIntegerToFloat  m[n] = f32(sa · sb[n]),   y = f32(f32(f32(acc) · m[n]) + bias[n])
    DynamicQuantizeMatMul (qa, sa, za) = DynamicQuantizeLinear(a) (the reference's NumPy),
                          then MatMulIntegerToFloat

Compile time (the binders): a constant rank-2 ``b`` is packed once into the micro-kernel's
layout (``_native.pack_weights_s8/u8``, active ISA) with its per-column zero point folded
into the column sums; the multiplier is read from the node and QGemm's int32 bias ``C``
converted once when their inputs are constants (run-time scales: ``float_multiplier``
per call). Kernel names say which: ``native:qlinear_matmul_u8s8`` (b
prepacked) vs ``native:qlinear_matmul_u8s8_runtime_b``.

Run time: a ``b`` that is an activation (attention scores Q·Kᵀ and context P·V) is packed
per call, once per batch matrix (K·N bytes against M·K·N multiply-adds), by
``qgemm_batched`` straight from the strided views the Transposes leave (Kᵀ, the heads of a
[S, heads, dh] tensor): one call per node, the batch dimensions merged into one, the batch
matrices split over the threads. A batched ``a [..., M, K]`` with a shared rank-2 ``b`` is
one GEMM over ``batch·M`` rows, nothing copied per batch. Batch layouts that do not merge
(a ``b`` broadcast over a leading axis), per-batch zero points or multipliers, and per-row
``a_zero_point`` with a run-time ``b`` take a per-batch loop of ``qgemm`` calls. With
constant per-tensor scales and zero points and a and b of the same batch dimensions, the
step's specialization (``_runtime_b_call``) makes that one ``qgemm_batched_call`` alone,
recordable into a native program: the generic path's per-call checks and conversions
cost all-MiniLM's Q·Kᵀ and P·V steps ~35 and ~15 µs of Python each (122 -> 88 and
83 -> 67 µs of thread CPU time a step, 0.3-0.4 ms a run).

What runs on the reference twin instead (same numbers, slower):
- at compile time, the binders refuse what their kernel can never run (dtypes, per-row
  ``a_scale``, a per-row QGemm bias ``C``, float16 scales) with the reason, which the
  plan records as a fallback;
- at run time, a kernel hands a call to the reference twin when the run-time inputs fall
  outside the fast path (a multiplier that is not finite and > 0, parameters that
  broadcast beyond the batch, a 1-D operand with a run-time ``b``, shapes that do not
  match, so that the twin raises the operator's own error message).
"""

from __future__ import annotations

import itertools
import math
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node, Value, const_fingerprint
from quanta.kernels.reference.integer_ops import a_param, b_param
from quanta.kernels.reference.qlinear_matmul_add import QUANTA_DOMAIN, post_stage_constants
from quanta.kernels.reference.registry import MS_DOMAIN, OpError
from quanta.passes.lower.requant_params import float_multiplier, requant_params
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import SMALL_MACS, guarded, step_threads
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import run_twin
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype

try:
    from quanta.kernels import _native
except ImportError:  # the binders only run when the extension is built
    _native = None

__all__ = [
    "bind_dynamic_quantize_matmul",
    "bind_matmul_integer",
    "bind_matmul_integer_to_float",
    "bind_qgemm",
    "bind_qlinear_matmul",
    "bind_qlinear_matmul_add",
]

F32 = np.float32
_U8, _I8 = np.dtype(np.uint8), np.dtype(np.int8)
_EIGHT_BIT = (_U8, _I8)
_SHORT = {_U8: "u8", _I8: "s8"}
_NAME = {_U8: "uint8", _I8: "int8"}


class _Unsupported(Exception):
    """A run-time input outside the native fast path: the call goes to the reference twin."""


# --------------------------------------------------------------------------------------
# Helpers shared by the kernels
# --------------------------------------------------------------------------------------

_tls = threading.local()


def _workspace() -> Any:
    """This thread's qgemm scratch (grown once, reused; one call at a time per thread)."""
    ws = getattr(_tls, "workspace", None)
    if ws is None:
        ws = _tls.workspace = _native.QGemmWorkspace()
    return ws


def _is_scalar(t: np.ndarray) -> bool:
    """Rank 0 or shape [1] (ORT's ``IsScalarOr1ElementVector``)."""
    return t.ndim == 0 or (t.ndim == 1 and t.shape[0] == 1)


def _columns(p: np.ndarray, n: int, dtype: type) -> np.ndarray | None:
    """A per-tensor or per-column parameter as a scalar (0-d) or contiguous [n] array;
    None when it is neither (per batch, per row)."""
    p = np.asarray(p)
    if p.size == 1:
        return np.asarray(p.reshape(()), dtype=dtype)
    if p.size == n and p.shape[-1] == n:
        return np.ascontiguousarray(p.reshape(n), dtype=dtype)
    return None


def _zero_point_arg(z: np.ndarray) -> int | np.ndarray:
    """A zero point as qgemm takes it: an int, or int32[n]."""
    return int(z) if z.ndim == 0 else z


def _valid_multiplier(m: np.ndarray) -> bool:
    """qgemm requires every multiplier finite and > 0 (a zero or negative scale product
    goes to the reference)."""
    if m.ndim == 0:
        v = float(m)
        return math.isfinite(v) and v > 0
    return bool(np.all(np.isfinite(m)) and np.all(m > 0))


def _pack(b: np.ndarray, zb: int | np.ndarray, saturating: bool = False) -> Any:
    if saturating:  # (QM1): the avx2 vpmaddubsw family, int8 b only (pack_weights_s8)
        return _native.pack_weights_s8(np.ascontiguousarray(b), zb, saturating=True)
    fn = _native.pack_weights_s8 if b.dtype == _I8 else _native.pack_weights_u8
    return fn(np.ascontiguousarray(b), zb)


def _rows(za: np.ndarray, a: np.ndarray) -> int | np.ndarray:
    """``za`` (from :func:`a_param`: 0-d, ``[M, 1]`` or ``[..., M, 1]``) as qgemm's zx for
    x = a: an int, or int32 of shape a.shape[:-1]."""
    if za.ndim == 0:
        return int(za)
    try:
        rows = np.broadcast_to(za[..., 0], a.shape[:-1])
    except ValueError:  # za has batch dimensions a does not: the output is broadcast
        raise _Unsupported from None
    return np.ascontiguousarray(rows, dtype=np.int32)


def _per_batch(p: np.ndarray | None, batch: tuple[int, ...], tail: tuple[int, ...]) -> np.ndarray | None:
    """A parameter with batch dimensions broadcast to ``batch + tail``; None for a
    per-tensor/per-column one (ndim <= 1)."""
    if p is None or p.ndim <= 1:
        return None
    try:
        return np.broadcast_to(p, batch + tail)
    except ValueError:
        raise _Unsupported from None


def _scratch() -> Any:
    """This thread's scratch for ``qgemm_batched`` (packed panels and workspaces)."""
    sc = getattr(_tls, "batched", None)
    if sc is None:
        sc = _tls.batched = _native.BatchedQGemmScratch()
    return sc


def _as_3d(arr: np.ndarray) -> np.ndarray | None:
    """``arr [..., r, c]`` as a ``[B, r, c]`` view (batch dimensions merged, no copy), or
    None when its batch strides cannot be merged (a broadcast over a non-trailing axis)."""
    if arr.ndim == 3:
        return arr
    lead = arr.shape[:-2]
    dims = [(n, st) for n, st in zip(lead, arr.strides[:-2], strict=True) if n != 1]
    for (_, outer), (n_inner, inner) in itertools.pairwise(dims):
        if outer != inner * n_inner:
            return None
    return arr.reshape(math.prod(lead), *arr.shape[-2:])  # a view: the strides merge


def _gemm_batched(
    a: np.ndarray,
    b: np.ndarray,
    batch: tuple[int, ...],
    zx: int,
    zb: np.ndarray,
    out_dtype: str,
    *,
    multiplier: np.ndarray | None,
    kw: dict[str, Any],
    out: np.ndarray | None,
) -> np.ndarray | None:
    """A run-time b (zero points and multiplier per tensor or per column) through one
    ``qgemm_batched`` call over strided views; None when the views cannot be merged."""
    M, K = a.shape[-2:]
    N = b.shape[-1]
    if math.prod(b.shape[:-2]) == 1:
        # One matrix b for the whole batch: a single GEMM over batch·M rows.
        x3 = np.ascontiguousarray(a).reshape(1, -1, K)
        w3 = _as_3d(b)
    else:
        x3 = _as_3d(a if a.shape[:-2] == batch else np.broadcast_to(a, (*batch, M, K)))
        w3 = _as_3d(b if b.shape[:-2] == batch else np.broadcast_to(b, (*batch, K, N)))
    if x3 is None or w3 is None:
        return None
    if K > 1 and (x3.strides[2] != 1 or (x3.shape[1] > 1 and x3.strides[1] < K)):
        x3 = np.ascontiguousarray(x3)
    y3 = None if out is None else out.reshape(x3.shape[0], x3.shape[1], N)
    y = _native.qgemm_batched(
        x3,
        w3,
        zx,
        _zero_point_arg(np.asarray(zb, np.int32)),
        out_dtype,
        bias=kw["bias"],
        float_bias=kw["float_bias"],
        multiplier=None if multiplier is None else np.asarray(multiplier, F32),
        zy=kw["zy"],
        num_threads=kw["num_threads"],
        scratch=_scratch(),
        out=y3,
    )
    return y.reshape((*batch, M, N)) if out is None else out


def _gemm(
    a: np.ndarray,
    b: np.ndarray | None,
    za: np.ndarray,
    zb: np.ndarray,
    out_dtype: str,
    *,
    packed: Any = None,
    multiplier: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    float_bias: np.ndarray | None = None,
    zy: int = 0,
    num_threads: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``output_stage(Σ_k (a − za)(b − zb))`` with numpy.matmul broadcasting, on qgemm.

    ``za`` as :func:`a_param` returns it; ``zb`` and ``multiplier`` 0-d, ``[N]`` or
    ``[..., 1, N]`` (per batch and column, run-time b only); ``packed``: b prepacked
    (rank 2, its zero point folded), or None to pack ``b`` here, per batch matrix."""
    kw = {
        "bias": bias,
        "float_bias": float_bias,
        "zy": zy,
        "num_threads": num_threads,
        "workspace": _workspace(),
    }
    if packed is not None:
        x = np.ascontiguousarray(a)
        return _native.qgemm(x, packed, _rows(za, x), out_dtype, multiplier=multiplier, out=out, **kw)
    assert b is not None
    if a.ndim < 2 or b.ndim < 2 or a.shape[-1] != b.shape[-2]:
        raise _Unsupported
    K, N = b.shape[-2:]
    M = a.shape[-2]
    batch = a.shape[:-2]
    if b.shape[:-2] != batch:
        try:
            batch = np.broadcast_shapes(batch, b.shape[:-2])
        except ValueError:
            raise _Unsupported from None
    zb_b = _per_batch(zb, batch, (1, N))
    m_b = _per_batch(multiplier, batch, (1, N))
    out_shape = (*batch, M, N)
    if out is not None and out.shape != out_shape:
        raise _Unsupported
    if zb_b is None and m_b is None and za.ndim == 0:
        y = _gemm_batched(a, b, batch, int(za), zb, out_dtype, multiplier=multiplier, kw=kw, out=out)
        if y is not None:
            return y
    za_b = _per_batch(za, batch, (M, 1))
    y = np.empty(out_shape, np.dtype(out_dtype)) if out is None else out
    a_b = np.broadcast_to(a, (*batch, M, K))
    b_b = np.broadcast_to(b, (*batch, K, N))
    zb0 = None if zb_b is not None else _zero_point_arg(np.asarray(zb, np.int32))
    m0 = None if m_b is not None else multiplier
    for idx in np.ndindex(*batch):
        zb_i = zb0 if zb_b is None else np.ascontiguousarray(zb_b[idx].reshape(N), np.int32)
        m_i = m0 if m_b is None else np.ascontiguousarray(m_b[idx].reshape(N), F32)
        zx_i = _rows(za, a_b[idx]) if za_b is None else np.ascontiguousarray(za_b[idx].reshape(M), np.int32)
        pk = _pack(b_b[idx], zb_i)
        _native.qgemm(np.ascontiguousarray(a_b[idx]), pk, zx_i, out_dtype, multiplier=m_i, out=y[idx], **kw)
    return y


def _call(
    op_type: str, domain: str, ctx: Any, inputs: tuple, attrs: dict, out: np.ndarray | None, fast
) -> Any:
    """``fast()``, or the reference twin when it raises :class:`_Unsupported` (or a
    parameter check raised OpError); errors of the binding (ValueError) become OpError."""
    try:
        return fast()
    except (_Unsupported, OpError):  # OpError: the twin raises its own message (or copes)
        return run_twin(op_type, domain, ctx, inputs, attrs, out)
    except ValueError as e:
        raise OpError(str(e)) from None


# --------------------------------------------------------------------------------------
# Compile-time helpers (binders)
# --------------------------------------------------------------------------------------


def _dtype_name(dt: np.dtype | None) -> str:
    return "unknown" if dt is None else str(dt)


def _check_eight_bit(op: str, names_values: tuple[tuple[str, Value | None], ...]) -> str:
    for name, v in names_values:
        dt = _dtype(v)
        if dt not in _EIGHT_BIT:
            return f"native {op} takes uint8/int8 {name}, got {_dtype_name(dt)}"
    return ""


def _check_zero_points(op: str, triples: tuple[tuple[str, Value | None, Value | None], ...]) -> str:
    """A zero point (when present and its type known) has its operand's dtype."""
    for name, z, v in triples:
        zt, vt = _dtype(z), _dtype(v)
        if z is not None and zt is not None and zt != vt:
            return f"native {op}: {name} is {zt}, expected its operand's {_dtype_name(vt)}"
    return ""


#: packed weights by (id of the constant, transposed, zero point, saturating, ISA): the
#: steps that read one constant share its packing (an LSTM unrolled into integer ops, as
#: ORT's QDQ files have it, reads each weight at every time step: captcha_crnn's held 20
#: packs of each of its four weights, 67 MB). An entry lives as long as its constant.
_PACKED: dict[tuple[int, bool, bytes, bool, str], tuple[weakref.ref, bytes, Any]] = {}


def _forget(key: tuple[int, bool, bytes, bool, str], ref: weakref.ref) -> None:
    if _PACKED.get(key, (None,))[0] is ref:  # not a later constant that took the same id
        del _PACKED[key]


def _prepack(
    b: Value | None, zb: Value | None, *, transpose: bool = False, saturating: bool = False
) -> tuple[Any, int]:
    """Pack a constant rank-2 b (transposed first for QGemm's transB) with its constant
    per-tensor or per-column zero point folded in; (None, N) when b or zb is not constant
    or the zero point is neither. ``saturating``: int8 b for (QM1)'s pairs (_pack). Steps
    that read the same constant share one packing."""
    const = _const(b)
    if const is None or const.ndim != 2:
        return None, 0
    w = np.ascontiguousarray(const.T) if transpose else const
    n = w.shape[1]
    if zb is None:
        z = np.zeros((), np.int32)
    else:
        zc = _const(zb)
        if zc is None:
            return None, n
        z = _columns(zc, n, np.int32)
        if z is None:
            return None, n
    key = (id(const), transpose, z.tobytes() + str(z.shape).encode(), saturating, _native.active_isa())
    sample = const_fingerprint(const)  # a constant changed in place since is packed again
    hit = _PACKED.get(key)
    if hit is not None and hit[0]() is const and hit[1] == sample:
        return hit[2], n
    packed = _pack(w, _zero_point_arg(z), saturating)
    try:
        ref = weakref.ref(const, lambda r, k=key: _forget(k, r))
    except TypeError:  # a constant that cannot be referenced weakly: not shared
        return packed, n
    _PACKED[key] = (ref, sample, packed)
    return packed, n


def _saturating(node: Node, a: Value | None, b_index: int = 1) -> bool:
    """Whether ``node`` computes uint8 A times int8 B (input ``b_index``) with (QM1)'s
    saturating pairs (the session's ``saturating_pairs``, rules/ort_float_functions.py);
    ``a`` None: the op quantizes A to uint8 itself."""
    b_dt = _dtype(node.input(b_index))
    return bool(node.attrs.get("saturating_pairs")) and b_dt == _I8 and (a is None or _dtype(a) == _U8)


def _prepack_saturating(
    b: Value | None, zb: Value | None, *, transpose: bool = False
) -> tuple[Any, str, int]:
    """(packed b, "", N) for (QM1), or (None, the reason the twin computes the node, 0)."""
    try:
        packed, n = _prepack(b, zb, transpose=transpose, saturating=True)
    except ValueError as e:  # a CPU without AVX2
        return None, f"saturating pairs: {e}", 0
    if packed is None:
        return (
            None,
            "saturating pairs (QM1) are prepacked: B and b_zero_point must be constants, B of rank 2",
            0,
        )
    return packed, "", n


def _kernel_name(
    base: str, a: np.dtype | None, b: np.dtype | None, prepacked: bool, saturating: bool = False
) -> str:
    pair = f"{_SHORT.get(a, 'f32')}{_SHORT.get(b, '')}"
    return (
        f"native:{base}_{pair}" + ("" if prepacked else "_runtime_b") + ("_saturating" if saturating else "")
    )


# --------------------------------------------------------------------------------------
# QLinearMatMul
# --------------------------------------------------------------------------------------


def _qlinear_matmul_native(
    ctx: Any,
    a: np.ndarray,
    a_scale: np.ndarray,
    a_zero_point: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray,
    y_scale: np.ndarray,
    y_zero_point: np.ndarray,
    *,
    packed: Any = None,
    multiplier: np.ndarray | None = None,
    direct: tuple | None = None,
    saturating_pairs: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """QLinearMatMul on qgemm (module docstring); per-row a goes to the reference.
    ``direct``: (a dtype, za, zy, output dtype name) when b is prepacked and every scale
    and zero point is a constant: the call goes straight to the kernel.
    ``saturating_pairs``: ``packed`` is (QM1)'s (the binder's), and the twin is told."""
    if direct is not None and a.dtype == direct[0] and a.ndim >= 1 and a.flags.c_contiguous:
        try:
            return _native.qgemm(
                a,
                packed,
                direct[1],
                direct[3],
                multiplier=multiplier,
                zy=direct[2],
                num_threads=_threads(ctx),
                workspace=_workspace(),
                out=out,
            )
        except ValueError:
            pass  # a shape the kernel refuses: the checked path below (or the twin) reports it
    inputs = (a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point)

    def fast() -> np.ndarray:
        if a.dtype not in _EIGHT_BIT or b.dtype not in _EIGHT_BIT or y_zero_point.dtype not in _EIGHT_BIT:
            raise _Unsupported
        if a_zero_point.dtype != a.dtype or b_zero_point.dtype != b.dtype:
            raise _Unsupported
        if a_scale.size != 1 or a_zero_point.size != 1 or y_scale.size != 1 or y_zero_point.size != 1:
            raise _Unsupported  # per-row a: the multiplier would vary along M
        if b_scale.size != b_zero_point.size:
            raise _Unsupported
        m = multiplier
        if m is not None and packed is None and m.ndim and (b.ndim < 2 or m.shape[-1] != b.shape[-1]):
            raise _Unsupported  # b_scale does not fit b: the twin raises its error
        if m is None:
            if b.ndim < 2:
                raise _Unsupported
            sb = b_param(np.asarray(b_scale, F32), b.shape, "b_scale")
            m = float_multiplier(a_scale, sb, y_scale)  # run-time scales: no node.requant
            if not _valid_multiplier(m):
                raise _Unsupported
        zb = np.zeros((), np.int64) if packed is not None else b_param(b_zero_point, b.shape, "b_zero_point")
        return _gemm(
            a,
            b,
            np.asarray(a_zero_point.reshape(())),
            zb,
            _NAME[y_zero_point.dtype],
            packed=packed,
            multiplier=m,
            zy=int(y_zero_point.reshape(())),
            num_threads=_threads(ctx),
            out=out,
        )

    attrs = {"saturating_pairs": saturating_pairs} if saturating_pairs else {}
    return _call("QLinearMatMul", "", ctx, inputs, attrs, out, fast)


@register_binder("QLinearMatMul")
def bind_qlinear_matmul(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8 a and b, per-tensor a and y, per-tensor or per-column b; a constant
    rank-2 b is prepacked with its zero point, the multiplier precomputed."""
    del model  # unused: the choice depends on the node only
    a, sa, za, b, sb, zb, sy, zy = (node.input(i) for i in range(8))
    reason = _check_eight_bit("QLinearMatMul", (("a", a), ("b", b), ("y_zero_point", zy)))
    if reason:
        return None, reason
    reason = _check_zero_points("QLinearMatMul", (("a_zero_point", za, a), ("b_zero_point", zb, b)))
    if reason:
        return None, reason
    for name, v in (("a_scale", sa), ("a_zero_point", za)):
        c = _const(v)
        if c is not None and c.size != 1:
            return None, f"{name} per row of a: the native GEMM requantizes per column only"
    for name, v in (("a_scale", sa), ("b_scale", sb), ("y_scale", sy)):
        dt = _dtype(v)
        if dt is not None and dt != F32:
            return None, f"native QLinearMatMul takes float32 scales, {name} is {dt}"
    params: dict[str, Any] = {}
    saturating = _saturating(node, a, 3)
    if saturating:  # (QM1): only on b prepacked for the vpmaddubsw family
        packed, reason, n = _prepack_saturating(b, zb)
        if packed is None:
            return None, reason
        params["saturating_pairs"] = 1
    else:
        packed, n = _prepack(b, zb)
    if packed is not None:
        params["packed"] = packed
    scales = [_const(v) for v in (sa, sb, sy)]
    if all(s is not None for s in scales):
        _, s_b, s_y = (s.astype(F32) for s in scales)  # the multiplier is the node's (below)
        if s_y.size != 1:
            return None, f"y_scale: expected a scalar (per tensor), got shape {list(s_y.shape)}"
        if packed is not None:
            s_b = _columns(s_b, n, F32)
            if s_b is None:
                shape = list(scales[1].shape)
                return None, f"b_scale: expected a scalar or one scale per column ({n}), got shape {shape}"
        elif s_b.size == 1:
            s_b = s_b.reshape(())  # per column or per batch and column keep their shape
        # the multiplier the lowering carries on the node (passes/lower/requant_params.py)
        rq = requant_params(node)
        m = None if rq is None else rq.multiplier
        if m is not None and packed is not None:
            m = _columns(m, n, F32)
        if m is None or not _valid_multiplier(m):
            return None, "requantization multiplier sa·sb/sy is not finite and > 0 for every column"
        params["multiplier"] = m
        c_za, c_zy = _const(za), _const(zy)
        if packed is not None and c_za is not None and c_zy is not None and c_za.size == 1 and c_zy.size == 1:
            params["direct"] = (c_za.dtype, int(c_za.reshape(())), int(c_zy.reshape(())), _NAME[c_zy.dtype])
    name = _kernel_name("qlinear_matmul", _dtype(a), _dtype(b), packed is not None, saturating)
    return Kernel(
        _qlinear_matmul_native,
        "native",
        name,
        params=params,
        out=True,
        specialize=_qlinear_matmul_specialized,
    ), ""


def _direct_call_plan(sig: Specialization, direct: tuple) -> tuple[int, Any] | None:
    """The threads and output of a prepacked requantizing GEMM's direct call for ``sig``
    (None: a shape or dtype the direct call does not take): one thread when the product
    is small (SMALL_MACS)."""
    if not sig.shapes or sig.shapes[0] is None or sig.dtypes[0] != direct[0]:
        return None
    shape = sig.shapes[0]
    if len(shape) < 1 or not sig.out_shape:
        return None
    macs = math.prod(shape) * sig.out_shape[-1]
    return step_threads(sig, macs, SMALL_MACS), sig.out


def _qlinear_matmul_specialized(
    sig: Specialization,
    *,
    packed: Any = None,
    multiplier: np.ndarray | None = None,
    direct: tuple | None = None,
    saturating_pairs: int = 0,
) -> Any:
    """QLinearMatMul on a prepacked b with constant parameters (``direct``): the kernel
    call alone, on one thread when the product is small (SMALL_MACS). With a run-time b
    and constant scales and zero points (attention's P·V), the batched call alone
    (_runtime_b_call)."""
    if packed is None and multiplier is not None:
        return _qlinear_matmul_runtime_b(sig, multiplier)
    if direct is None or packed is None:
        return None
    plan = _direct_call_plan(sig, direct)
    if plan is None:
        return None
    threads, out = plan
    zx, zy, out_dtype = direct[1], direct[2], direct[3]
    attrs = {
        "packed": packed,
        "multiplier": multiplier,
        "direct": direct,
        "saturating_pairs": saturating_pairs,
    }

    return guarded(
        _prepared_qgemm(packed, zx, out_dtype, multiplier, None, zy, threads, out),
        _qlinear_matmul_native,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


def _qlinear_matmul_runtime_b(sig: Specialization, multiplier: np.ndarray) -> Any:
    """QLinearMatMul with a run-time b whose zero points are constants of one value (the
    generic kernel's checks made here once): _runtime_b_call, recordable."""
    za, zb, zy = sig.consts[2], sig.consts[5], sig.consts[7]
    a_dt, b_dt = sig.dtypes[0], sig.dtypes[3]
    if za is None or zb is None or zy is None or a_dt not in _EIGHT_BIT or b_dt not in _EIGHT_BIT:
        return None
    if za.dtype != a_dt or zb.dtype != b_dt or zy.dtype not in _EIGHT_BIT:
        return None
    if za.size != 1 or zb.size != 1 or zy.size != 1:
        return None
    s_shapes = (sig.shapes[1], sig.shapes[4], sig.shapes[6])  # per tensor: a per-column b goes generic
    if any(sh is None or math.prod(sh) != 1 for sh in s_shapes):
        return None
    call = _runtime_b_call(
        sig,
        3,
        int(za.reshape(())),
        int(zb.reshape(())),
        _NAME[zy.dtype],
        None,
        multiplier,
        int(zy.reshape(())),
    )
    if call is None:
        return None
    run = guarded(
        call, _qlinear_matmul_native, {"multiplier": multiplier}, sig.out, reads=(0, 3), recordable=True
    )
    run.strided = True  # type: ignore[attr-defined]  # records strided views (_runtime_b_call)
    return run


def _prepared_qgemm(
    packed: Any, zx: Any, out_dtype: Any, multiplier: Any, bias: Any, zy: Any, threads: int, out: Any
) -> Callable[..., np.ndarray]:
    """The call of a QLinearMatMul / QGemm whose shapes, packed B and parameters are fixed
    at compile time: input A goes straight to the kernel, no per-call checks, every
    argument by position (``qgemm_call``: keywords cost a name lookup per parameter)."""
    qgemm_call = _native.qgemm_call

    def call(a: np.ndarray, *rest: Any) -> np.ndarray:
        return qgemm_call(a, packed, zx, out_dtype, bias, multiplier, zy, threads, _workspace(), out)

    return call


def _runtime_b_call(
    sig: Specialization,
    b_index: int,
    zx: Any,
    zw: Any,
    out_dtype: str,
    float_bias: np.ndarray | None,
    multiplier: np.ndarray,
    zy: int,
) -> Callable[..., np.ndarray] | None:
    """The call of a GEMM with a run-time b (attention's Q·Kᵀ and P·V) whose shapes and
    parameters are fixed for the signature: a [..., M, K] and b [..., K, N] of the same
    batch dimensions merged into one (views of contiguous inputs), ``qgemm_batched_call``
    into the planned output, every argument by position; None when the signature does
    not fit (broadcast batches, rank 2, no planned output, an empty product), which
    leaves the step to the generic kernel. The bytes are _gemm_batched's: the same
    binding on the same views (a non-contiguous input is reshaped to a copy, or refused
    by the binding with a ValueError that hands the call to the generic kernel)."""
    a_shape, b_shape, out = sig.shapes[0], sig.shapes[b_index], sig.out
    if a_shape is None or b_shape is None or out is None or not out.flags.c_contiguous:
        return None
    if len(a_shape) < 3 or len(b_shape) != len(a_shape) or a_shape[:-2] != b_shape[:-2]:
        return None
    (M, K), N = a_shape[-2:], b_shape[-1]
    B = math.prod(a_shape[:-2])
    if b_shape[-2] != K or out.shape != (*a_shape[:-1], N) or 0 in (B, M, K, N):
        return None
    m = np.asarray(multiplier, F32)
    if not (m.ndim == 0 or (m.ndim == 1 and m.shape[0] in (1, N))) or not _valid_multiplier(m):
        return None
    y3 = out.reshape(B, M, N)
    if not np.shares_memory(y3, out):
        return None
    threads = step_threads(sig, B * M * K * N, SMALL_MACS)
    x_shape, w_shape = (B, M, K), (B, K, N)
    batched_call = _native.qgemm_batched_call

    def call(a: np.ndarray, b: np.ndarray) -> np.ndarray:
        x3, w3 = a.reshape(x_shape), b.reshape(w_shape)
        # a strided view (TransposeView) whose batch axes do not merge reshapes to a copy:
        # refused here (the generic kernel loops over the batch), so that a recorded call
        # never reads a copy made once
        if not (a.flags.c_contiguous or np.may_share_memory(x3, a)) or not (
            b.flags.c_contiguous or np.may_share_memory(w3, b)
        ):
            raise ValueError("qgemm_batched: a batch of strided views that do not merge")
        batched_call(
            x3,
            w3,
            zx,
            zw,
            out_dtype,
            float_bias,
            m,
            zy,
            threads,
            _scratch(),
            y3,
        )
        return out

    return call


# --------------------------------------------------------------------------------------
# MatMulInteger
# --------------------------------------------------------------------------------------


def _matmul_integer_native(
    ctx: Any,
    a: np.ndarray,
    b: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    *,
    packed: Any = None,
    saturating_pairs: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """MatMulInteger (int32 out) on qgemm: per-row a_zero_point, per-column b_zero_point;
    ``saturating_pairs``: ``packed`` is (QM1)'s (the binder's)."""
    inputs = (a, b, a_zero_point, b_zero_point)
    attrs = {"saturating_pairs": saturating_pairs} if saturating_pairs else {}

    def fast() -> np.ndarray:
        if a.dtype not in _EIGHT_BIT or b.dtype not in _EIGHT_BIT:
            raise _Unsupported
        for zp, v in ((a_zero_point, a), (b_zero_point, b)):
            if zp is not None and zp.dtype != v.dtype:
                raise _Unsupported
        if a.ndim == 0 or (packed is None and b.ndim == 0):
            raise _Unsupported
        za = a_param(a_zero_point, a.shape, "a_zero_point")
        zb = np.zeros((), np.int64) if packed is not None else b_param(b_zero_point, b.shape, "b_zero_point")
        if saturating_pairs and a.dtype != _U8:
            raise _Unsupported
        return _gemm(a, b, za, zb, "int32", packed=packed, num_threads=_threads(ctx), out=out)

    return _call("MatMulInteger", "", ctx, inputs, attrs, out, fast)


@register_binder("MatMulInteger")
def bind_matmul_integer(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8 a and b in any pairing; a constant rank-2 b is prepacked with its
    per-tensor or per-column zero point."""
    del model  # unused
    a, b, za, zb = (node.input(i) for i in range(4))
    reason = _check_eight_bit("MatMulInteger", (("A", a), ("B", b)))
    if reason:
        return None, reason
    reason = _check_zero_points("MatMulInteger", (("a_zero_point", za, a), ("b_zero_point", zb, b)))
    if reason:
        return None, reason
    if _saturating(node, a):
        packed, reason, _ = _prepack_saturating(b, zb)
        if packed is None:
            return None, reason
    else:
        packed, _ = _prepack(b, zb)
    params = {} if packed is None else {"packed": packed}
    name = _kernel_name("matmul_integer", _dtype(a), _dtype(b), packed is not None, _saturating(node, a))
    return Kernel(_matmul_integer_native, "native", name, params=params, out=True), ""


# --------------------------------------------------------------------------------------
# com.microsoft QGemm
# --------------------------------------------------------------------------------------


def _qgemm_multiplier(m: np.ndarray) -> np.ndarray:
    """A QGemm multiplier (:func:`float_multiplier`: (1)/(2) of reference/ms_qgemm.py) as
    qgemm takes it: 0-d, or one per column."""
    return m.reshape(()) if m.size == 1 else m.reshape(-1)


def _qgemm_bias(c: np.ndarray, n: int) -> np.ndarray | None:
    """QGemm's C as a per-column int32 bias [n], or None when it varies per row."""
    if c.dtype != np.int32 or c.ndim > 2:
        return None
    if c.size == 1:
        return np.full(n, c.reshape(()), np.int32)
    if c.size == n and c.shape[-1] == n:
        return np.ascontiguousarray(c.reshape(n))
    return None


def _qgemm_ms_native(
    ctx: Any,
    *given: np.ndarray | None,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    packed: Any = None,
    multiplier: np.ndarray | None = None,
    bias_n: np.ndarray | None = None,
    saturating_pairs: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """com.microsoft QGemm on qgemm (module docstring): the operator's nine inputs
    (a, a_scale, a_zero_point, b, b_scale, b_zero_point, c?, y_scale?, y_zero_point?).
    ``saturating_pairs``: ``packed`` is (QM1)'s (the binder's), and the twin is told."""
    inputs = (*given, *([None] * (9 - len(given))))
    a, a_scale, a_zero_point, b, b_scale, b_zero_point, c, y_scale, y_zero_point = inputs
    attrs = {"alpha": alpha, "transA": transA, "transB": transB}
    if saturating_pairs:
        attrs["saturating_pairs"] = saturating_pairs

    def fast() -> np.ndarray:
        if a.ndim != 2 or b.ndim != 2 or a.dtype not in _EIGHT_BIT or b.dtype not in _EIGHT_BIT:
            raise _Unsupported
        if a.dtype == _I8 and b.dtype != _I8:
            raise _Unsupported  # ORT has no int8 x uint8 QGemm: the twin raises its error
        x = np.ascontiguousarray(a.T) if transA else a
        K = x.shape[1]
        N = b.shape[0] if transB else b.shape[1]
        if (b.shape[1] if transB else b.shape[0]) != K:
            raise _Unsupported
        if a_zero_point.dtype != a.dtype or not _is_scalar(a_zero_point) or b_zero_point.dtype != b.dtype:
            raise _Unsupported
        scales = (a_scale, b_scale) + (() if y_scale is None else (y_scale,))
        if any(s.dtype != F32 for s in scales) or not _is_scalar(a_scale):
            raise _Unsupported
        if b_scale.shape != b_zero_point.shape or _columns(b_scale, N, F32) is None:
            raise _Unsupported
        if not (b_scale.ndim == 0 or (b_scale.ndim == 1 and b_scale.shape[0] in (1, N))):
            raise _Unsupported
        if y_scale is None:
            if y_zero_point is not None:
                raise _Unsupported
            out_dtype, zy = "float32", 0
        else:
            zy_arr = np.zeros((), a.dtype) if y_zero_point is None else y_zero_point
            if not _is_scalar(y_scale) or zy_arr.dtype != a.dtype or not _is_scalar(zy_arr):
                raise _Unsupported
            out_dtype, zy = _NAME[a.dtype], int(zy_arr.reshape(()))
        bias = bias_n
        if bias is None and c is not None:
            bias = _qgemm_bias(c, N)
            if bias is None:
                raise _Unsupported  # a per-row C, or a wrong one: the twin adds or refuses it
        m = multiplier
        if m is None:
            m = _qgemm_multiplier(float_multiplier(a_scale, b_scale, y_scale, alpha))  # run-time scales
            if not _valid_multiplier(m):
                raise _Unsupported
        pk = packed
        if pk is None:
            if saturating_pairs:
                raise _Unsupported  # (QM1) runs on b prepacked at bind time only: the twin
            zb = _columns(b_zero_point, N, np.int32)
            pk = _pack(b.T if transB else b, _zero_point_arg(zb))
        return _gemm(
            x,
            None,
            np.asarray(a_zero_point.reshape(())),
            np.zeros((), np.int64),
            out_dtype,
            packed=pk,
            multiplier=m,
            bias=bias,
            zy=zy,
            num_threads=_threads(ctx),
            out=out,
        )

    return _call("QGemm", MS_DOMAIN, ctx, inputs, attrs, out, fast)


@register_binder("QGemm", MS_DOMAIN)
def bind_qgemm(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8 A and B (not int8 × uint8, as ORT), per-column b, per-column int32 C;
    float32 output without y_scale. A constant B is prepacked (transposed for transB)."""
    del model  # unused
    a, sa, za, b, sb, zb, c, sy, zy = (node.input(i) for i in range(9))
    reason = _check_eight_bit("QGemm", (("A", a), ("B", b)))
    if reason:
        return None, reason
    if _dtype(a) == _I8 and _dtype(b) != _I8:
        return None, "QGemm with int8 A takes int8 B (ONNX Runtime has no int8 x uint8 kernel)"
    reason = _check_zero_points(
        "QGemm", (("a_zero_point", za, a), ("b_zero_point", zb, b), ("y_zero_point", zy, a))
    )
    if reason:
        return None, reason
    for name, v in (("a_scale", sa), ("b_scale", sb), ("y_scale", sy)):
        dt = _dtype(v)
        if v is not None and dt is not None and dt != F32:
            return None, f"native QGemm takes float32 scales, {name} is {dt}"
    trans_b = bool(node.attrs.get("transB", 0))
    params: dict[str, Any] = {}
    saturating = _saturating(node, a, 3)
    if saturating:  # (QM1): only on b prepacked for the vpmaddubsw family
        packed, reason, n = _prepack_saturating(b, zb, transpose=trans_b)
        if packed is None:
            return None, reason
        params["saturating_pairs"] = 1
    else:
        packed, n = _prepack(b, zb, transpose=trans_b)
    if packed is not None:
        params["packed"] = packed
        cc = _const(c)
        if cc is not None:
            bias = _qgemm_bias(cc, n)
            if bias is None:
                return (
                    None,
                    f"C of shape {list(cc.shape)} adds per row: the native GEMM takes a per-column int32 bias",
                )
            params["bias_n"] = bias
        s_a, s_b = _const(sa), _const(sb)
        s_y = None if sy is None else _const(sy)
        if s_a is not None and s_b is not None and (sy is None or s_y is not None):
            if _is_scalar(s_a) and s_b.size in (1, n) and (s_y is None or _is_scalar(s_y)):
                rq = requant_params(node)  # the multiplier the lowering carries on the node
                m = None if rq is None else _qgemm_multiplier(rq.multiplier)
                if m is None or not _valid_multiplier(m):
                    return None, "output multiplier alpha·sa·sb[/sy] is not finite and > 0 for every column"
                params["multiplier"] = m
    name = _kernel_name("qgemm", _dtype(a), _dtype(b), packed is not None, saturating)
    return Kernel(
        _qgemm_ms_native, "native", name, params=params, out=True, specialize=_qgemm_specialized
    ), ""


def _qgemm_specialized(
    sig: Specialization,
    *,
    alpha: float = 1.0,
    transA: int = 0,
    transB: int = 0,
    packed: Any = None,
    multiplier: np.ndarray | None = None,
    bias_n: np.ndarray | None = None,
    saturating_pairs: int = 0,
) -> Any:
    """QGemm with B prepacked and every scale and zero point constant: the checks of
    ``fast()`` made once per signature, a run is the qgemm call alone (a wake-word head's
    three GEMVs spent more time in those checks than in the kernel)."""
    attrs = {"alpha": alpha, "transA": transA, "transB": transB, "packed": packed}
    attrs.update(multiplier=multiplier, bias_n=bias_n, saturating_pairs=saturating_pairs)
    if packed is None or multiplier is None or transA or not sig.shapes or sig.shapes[0] is None:
        return None
    inputs = (*sig.consts, *([None] * (9 - len(sig.consts))))
    shapes = (*sig.shapes, *([None] * (9 - len(sig.shapes))))
    a_dt, za, zy_c = sig.dtypes[0], inputs[2], inputs[8]
    if (
        a_dt not in _EIGHT_BIT
        or len(sig.shapes[0]) != 2
        or za is None
        or za.dtype != a_dt
        or not _is_scalar(za)
    ):
        return None
    if shapes[6] is not None and bias_n is None:
        return None  # a run-time C: the generic kernel reads it per call
    if shapes[7] is None:
        if shapes[8] is not None:
            return None
        out_dtype, zy = "float32", 0
    else:
        if inputs[7] is None or (shapes[8] is not None and zy_c is None):
            return None
        zy_arr = np.zeros((), a_dt) if shapes[8] is None else zy_c
        if zy_arr.dtype != a_dt or not _is_scalar(zy_arr):
            return None
        out_dtype, zy = _NAME[a_dt], int(zy_arr.reshape(()))
    m_rows, k = sig.shapes[0]
    n = sig.out_shape[-1] if sig.out_shape else 1
    threads, out, zx = step_threads(sig, m_rows * k * n, SMALL_MACS), sig.out, int(za.reshape(()))

    return guarded(
        _prepared_qgemm(packed, zx, out_dtype, multiplier, bias_n, zy, threads, out),
        _qgemm_ms_native,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


# --------------------------------------------------------------------------------------
# com.microsoft MatMulIntegerToFloat, DynamicQuantizeMatMul
# --------------------------------------------------------------------------------------


def _integer_to_float(
    qa: np.ndarray,
    b: np.ndarray,
    sa: np.ndarray,
    sb: np.ndarray,
    za: np.ndarray | None,
    zb: np.ndarray | None,
    bias: np.ndarray | None,
    *,
    packed: Any,
    multiplier: np.ndarray | None,
    num_threads: int,
    out: np.ndarray | None,
) -> np.ndarray:
    """``f32(f32(f32(acc) · f32(sa·sb[n])) + bias[n])`` (reference/ms_qgemm.py (3)) for a
    scalar sa and za, per-tensor or per-column (rank-2 b) sb and zb."""
    if qa.dtype not in _EIGHT_BIT or b.dtype not in _EIGHT_BIT or (qa.dtype == _I8 and b.dtype != _I8):
        raise _Unsupported
    if b.ndim < 2 or qa.ndim < 1:
        raise _Unsupported
    N = b.shape[-1]
    if sa.dtype != F32 or sb.dtype != F32 or not _is_scalar(sa):
        raise _Unsupported
    per_column_ok = b.ndim == 2
    if not (_is_scalar(sb) or (per_column_ok and sb.shape == (N,))):
        raise _Unsupported
    if za is not None and (za.dtype != qa.dtype or not _is_scalar(za)):
        raise _Unsupported
    if zb is not None and (
        zb.dtype != b.dtype or not (_is_scalar(zb) or (per_column_ok and zb.shape == (N,)))
    ):
        raise _Unsupported
    if bias is not None and (bias.dtype != F32 or bias.shape != (N,)):
        raise _Unsupported
    m = multiplier
    if m is None:
        m = np.multiply(sa.reshape(()), sb.reshape(()) if _is_scalar(sb) else sb, dtype=F32)
        if not _valid_multiplier(m):
            raise _Unsupported
    zb_cols = np.zeros((), np.int64) if zb is None or packed is not None else _columns(zb, N, np.int64)
    za0 = np.zeros((), np.int64) if za is None else np.asarray(za.reshape(()))
    return _gemm(
        qa,
        b,
        za0,
        zb_cols,
        "float32",
        packed=packed,
        multiplier=np.asarray(m, F32),
        float_bias=None if bias is None else np.ascontiguousarray(bias),
        num_threads=num_threads,
        out=out,
    )


def _matmul_integer_to_float_native(
    ctx: Any,
    a: np.ndarray,
    b: np.ndarray,
    a_scale: np.ndarray,
    b_scale: np.ndarray,
    a_zero_point: np.ndarray | None = None,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    packed: Any = None,
    multiplier: np.ndarray | None = None,
    direct: tuple | None = None,
    saturating_pairs: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """com.microsoft MatMulIntegerToFloat (float32) on qgemm (``saturating_pairs``: the
    binder packed b for (QM1), and a uint8 a is checked). ``direct``: (a dtype, za,
    float bias or None, None) when b is prepacked and the scales, zero points and bias are
    constants, or (a dtype, None, float bias or None, b_scale) when only a_scale and
    a_zero_point come at run time: the call goes straight to the kernel."""
    if direct is not None and a.dtype == direct[0] and a.ndim >= 1 and a.flags.c_contiguous:
        za0, m = direct[1], multiplier
        if m is None:
            # run-time a_scale / a_zero_point (DynamicQuantizeLinear's): scalars of the
            # right types give the multiplier sa·sb[n] of _integer_to_float, else the
            # checked path below decides
            if a_scale.dtype != F32 or not _is_scalar(a_scale):
                za0 = None
            elif a_zero_point is None:
                za0 = 0
            elif a_zero_point.dtype == a.dtype and _is_scalar(a_zero_point):
                za0 = int(a_zero_point.reshape(()))
            else:
                za0 = None
            if za0 is not None:
                m = np.multiply(a_scale.reshape(()), direct[3], dtype=F32)
                if not _valid_multiplier(m):
                    za0 = None
        if za0 is not None:
            try:
                return _native.qgemm(
                    a,
                    packed,
                    za0,
                    "float32",
                    multiplier=m,
                    float_bias=direct[2],
                    num_threads=_threads(ctx),
                    workspace=_workspace(),
                    out=out,
                )
            except ValueError:
                pass  # a shape the kernel refuses: the checked path below (or the twin) reports it
    inputs = (a, b, a_scale, b_scale, a_zero_point, b_zero_point, bias)
    attrs = {"saturating_pairs": saturating_pairs} if saturating_pairs else {}

    def fast() -> np.ndarray:
        if saturating_pairs and a.dtype != _U8:
            raise _Unsupported
        return _integer_to_float(
            a,
            b,
            a_scale,
            b_scale,
            a_zero_point,
            b_zero_point,
            bias,
            packed=packed,
            multiplier=multiplier,
            num_threads=_threads(ctx),
            out=out,
        )

    return _call("MatMulIntegerToFloat", MS_DOMAIN, ctx, inputs, attrs, out, fast)


def _dynamic_quantize_matmul_native(
    ctx: Any,
    a: np.ndarray,
    b: np.ndarray,
    b_scale: np.ndarray,
    b_zero_point: np.ndarray | None = None,
    bias: np.ndarray | None = None,
    *,
    packed: Any = None,
    saturating_pairs: int = 0,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """com.microsoft DynamicQuantizeMatMul: a quantized by the native DynamicQuantizeLinear
    (the reference's bytes, eq. (10); NumPy's five passes cost twice the GEMM at the few
    rows of a transformer's tokens), the GEMM on qgemm (``saturating_pairs``: the binder
    packed b for (QM1))."""
    inputs = (a, b, b_scale, b_zero_point, bias)
    attrs = {"saturating_pairs": saturating_pairs} if saturating_pairs else {}

    def fast() -> np.ndarray:
        if a.dtype != F32:
            raise _Unsupported
        qa, sa, za = _native.dynamic_quantize_linear(np.ascontiguousarray(a), _threads(ctx))
        return _integer_to_float(
            qa,
            b,
            np.asarray(sa),
            b_scale,
            np.asarray(za),
            b_zero_point,
            bias,
            packed=packed,
            multiplier=None,
            num_threads=_threads(ctx),
            out=out,
        )

    return _call("DynamicQuantizeMatMul", MS_DOMAIN, ctx, inputs, attrs, out, fast)


def _bind_integer_to_float(
    op: str, b: Value | None, zb: Value | None, scales: tuple, saturating: bool = False
) -> tuple[Any, str]:
    """Shared checks; (packed b or None, refusal reason or ""); ``saturating``: b packed for
    (QM1), refused when it cannot be."""
    b_dt = _dtype(b)
    if b_dt not in _EIGHT_BIT:
        return None, f"native {op} takes uint8/int8 B, got {_dtype_name(b_dt)}"
    for name, v in scales:
        dt = _dtype(v)
        if dt is not None and dt != F32:
            return None, f"native {op} takes float32 scales and bias, {name} is {dt}"
    if saturating:
        packed, reason, _ = _prepack_saturating(b, zb)
        return packed, reason
    packed = None
    w, z = _const(b), _const(zb)
    if (
        w is not None
        and w.ndim == 2
        and (zb is None or (z is not None and (_is_scalar(z) or z.shape == (w.shape[1],))))
    ):
        packed, _ = _prepack(b, zb)
    return packed, ""


@register_binder("MatMulIntegerToFloat", MS_DOMAIN)
def bind_matmul_integer_to_float(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 scales and bias, scalar a_scale/a_zero_point, per-tensor or per-column b
    (rank 2 to prepack); float16 runs on the reference."""
    del model  # unused
    a, b, sa, sb, za, zb, bias = (node.input(i) for i in range(7))
    a_dt = _dtype(a)
    if a_dt not in _EIGHT_BIT:
        return None, f"native MatMulIntegerToFloat takes uint8/int8 A, got {_dtype_name(a_dt)}"
    if a_dt == _I8 and _dtype(b) != _I8:
        return None, "MatMulIntegerToFloat with int8 A takes int8 B (ONNX Runtime has no int8 x uint8 kernel)"
    c = _const(sa)
    if c is not None and not _is_scalar(c):
        return None, "a_scale per row: the native GEMM scales per column only"
    reason = _check_zero_points("MatMulIntegerToFloat", (("a_zero_point", za, a), ("b_zero_point", zb, b)))
    if reason:
        return None, reason
    packed, reason = _bind_integer_to_float(
        "MatMulIntegerToFloat",
        b,
        zb,
        (("a_scale", sa), ("b_scale", sb), ("bias", bias)),
        _saturating(node, a),
    )
    if reason:
        return None, reason
    params: dict[str, Any] = {} if packed is None else {"packed": packed}
    s_a, s_b = _const(sa), _const(sb)
    if s_a is not None and s_b is not None and s_a.dtype == F32 and s_b.dtype == F32:
        # constant scales: the multiplier once here (a run-time b takes it when both are
        # per tensor; per-column needs the packed b's N to be checked against)
        if _is_scalar(s_b) or (packed is not None and s_b.shape == (packed.N,)):
            m = np.multiply(s_a.reshape(()), s_b.reshape(()) if _is_scalar(s_b) else s_b, dtype=F32)
            if _valid_multiplier(m):
                params["multiplier"] = m
    c_za, c_bias = _const(za), _const(bias)
    if (
        packed is not None
        and "multiplier" in params
        and (za is None or (c_za is not None and _is_scalar(c_za)))
        and (bias is None or (c_bias is not None and c_bias.dtype == F32 and c_bias.shape == (packed.N,)))
    ):
        za0 = 0 if za is None else int(c_za.reshape(()))
        fb = None if bias is None else np.ascontiguousarray(c_bias)
        params["direct"] = (a_dt, za0, fb, None)
    elif (
        packed is not None
        and s_a is None
        and s_b is not None
        and s_b.dtype == F32
        and (_is_scalar(s_b) or s_b.shape == (packed.N,))
        and (za is None or c_za is None)
        and (bias is None or (c_bias is not None and c_bias.dtype == F32 and c_bias.shape == (packed.N,)))
    ):
        # run-time a_scale and a_zero_point (ORT's quantize_dynamic: DynamicQuantizeLinear
        # feeds them): checked per call in _matmul_integer_to_float_native, without the
        # generic path's conversions (about 4 us of a 10-40 us call at t5's shapes)
        sb_arg = s_b.reshape(()) if _is_scalar(s_b) else np.ascontiguousarray(s_b)
        fb = None if bias is None else np.ascontiguousarray(c_bias)
        params["direct"] = (a_dt, None, fb, sb_arg)
    name = _kernel_name("matmul_integer_to_float", a_dt, _dtype(b), packed is not None, _saturating(node, a))
    specialize = None
    if "direct" in params:
        specialize = _matmul_integer_to_float_specialized
    elif packed is None and "multiplier" in params:
        specialize = _matmul_integer_to_float_runtime_b
    return Kernel(
        _matmul_integer_to_float_native, "native", name, params=params, out=True, specialize=specialize
    ), ""


def _matmul_integer_to_float_specialized(
    sig: Specialization,
    *,
    packed: Any,
    direct: tuple,
    multiplier: np.ndarray | None = None,
    saturating_pairs: int = 0,
) -> Callable[..., Any] | None:
    """MatMulIntegerToFloat on a prepacked b (``direct`` set by the binder) for one A
    shape: qgemm called by position. With constant scales the multiplier is the binder's;
    with a_scale and a_zero_point from a DynamicQuantizeLinear (ONNX Runtime's
    quantize_dynamic), it is _matmul_integer_to_float_native's f32(sa · sb[n]) per call,
    made with its checks in qgemm_scaled_float, which a native program's recorded call
    makes again from the arrays' current values on every run. A value the call cannot take (a
    non-contiguous A, a non-scalar or non-float a_scale, an a_zero_point of another
    type, a product not finite and > 0) goes to the generic kernel (ValueError)."""
    shape = sig.shapes[0]
    a_dt, za0, fb, sb = direct
    if shape is None or not shape or sig.dtypes[0] != a_dt:
        return None
    params = {
        "packed": packed,
        "direct": direct,
        "multiplier": multiplier,
        "saturating_pairs": saturating_pairs,
    }
    threads = step_threads(sig, math.prod(shape) * packed.N, SMALL_MACS)
    qcall, out = _native.qgemm_call_float, sig.out
    if multiplier is not None:

        def constant_scales(a: np.ndarray, *rest: Any) -> np.ndarray:
            return qcall(a, packed, za0, fb, multiplier, threads, _workspace(), out)

        return guarded(
            constant_scales, _matmul_integer_to_float_native, params, out, reads=1, recordable=True
        )
    n_in = len(sig.shapes)
    has_za = n_in > 4 and sig.dtypes[4] is not None
    if has_za and sig.dtypes[4] != a_dt:
        return None
    qscaled, sb_arr = _native.qgemm_scaled_float, np.ascontiguousarray(sb, dtype=F32)

    def run_time_scale(a: np.ndarray, sa: np.ndarray, za: np.ndarray | None = None) -> np.ndarray:
        return qscaled(a, packed, sa, za, sb_arr, fb, threads, _workspace(), out)

    return guarded(
        run_time_scale,
        _matmul_integer_to_float_native,
        params,
        out,
        reads=(0, 2, 4) if has_za else (0, 2),
        recordable=True,
    )


def _matmul_integer_to_float_runtime_b(
    sig: Specialization, *, multiplier: np.ndarray, saturating_pairs: int = 0
) -> Any:
    """MatMulIntegerToFloat with a run-time b (attention's Q·Kᵀ), constant scalar scales
    (the binder's multiplier) and zero points and bias that are constants or omitted: the
    generic kernel's checks (_integer_to_float) made here once, then _runtime_b_call,
    recordable."""
    n_in = len(sig.shapes)
    a_dt, b_dt = sig.dtypes[0], sig.dtypes[1]
    if a_dt not in _EIGHT_BIT or b_dt not in _EIGHT_BIT or (a_dt == _I8 and b_dt != _I8):
        return None
    zs: list[int] = []
    for i, dt in ((4, a_dt), (5, b_dt)):
        if i >= n_in or sig.dtypes[i] is None:
            zs.append(0)
            continue
        c = sig.consts[i]
        if c is None or c.dtype != dt or not _is_scalar(c):
            return None
        zs.append(int(c.reshape(())))
    fb = None
    if n_in > 6 and sig.dtypes[6] is not None:
        c, b_shape = sig.consts[6], sig.shapes[1]
        if c is None or c.dtype != F32 or b_shape is None or c.shape != (b_shape[-1],):
            return None
        fb = np.ascontiguousarray(c)
    if saturating_pairs:
        return None  # (QM1) needs a prepacked b: the binder refuses such a node
    call = _runtime_b_call(sig, 1, zs[0], zs[1], "float32", fb, multiplier, 0)
    if call is None:
        return None
    run = guarded(
        call,
        _matmul_integer_to_float_native,
        {"multiplier": multiplier},
        sig.out,
        reads=(0, 1),
        recordable=True,
    )
    run.strided = True  # type: ignore[attr-defined]  # records strided views (_runtime_b_call)
    return run


@register_binder("DynamicQuantizeMatMul", MS_DOMAIN)
def bind_dynamic_quantize_matmul(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 A quantized per tensor (NumPy DynamicQuantizeLinear), uint8/int8 B
    (rank 2 to prepack), per-tensor or per-column b_scale / b_zero_point."""
    del model  # unused
    a, b, sb, zb, bias = (node.input(i) for i in range(5))
    a_dt = _dtype(a)
    if a_dt is not None and a_dt != F32:
        return None, f"native DynamicQuantizeMatMul takes float32 A, got {a_dt}"
    packed, reason = _bind_integer_to_float(
        "DynamicQuantizeMatMul", b, zb, (("b_scale", sb), ("bias", bias)), _saturating(node, None)
    )
    if reason:
        return None, reason
    params = {} if packed is None else {"packed": packed}
    name = _kernel_name(
        "dynamic_quantize_matmul", a_dt, _dtype(b), packed is not None, _saturating(node, None)
    )
    return Kernel(_dynamic_quantize_matmul_native, "native", name, params=params, out=True), ""


# --------------------------------------------------------------------------------------
# quanta::QLinearMatMulAdd (passes/lower/qlinear_matmul_add.py)
# --------------------------------------------------------------------------------------


def _qlinear_matmul_add_native(
    ctx: Any,
    *inputs: np.ndarray,
    packed: Any = None,
    multiplier: np.ndarray | None = None,
    direct: tuple | None = None,
    post: tuple | None = None,
    c_first: int = 1,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """QLinearMatMul with QLinearAdd's (QA1)-(QA3) as the second affine stage of qgemm's
    output stage (``post``: k, u, r1, r2 of reference/qlinear_matmul_add.py
    post_stage_constants); an ``a`` of another type or layout goes to the twin."""
    a = inputs[0]
    if direct is not None and a.dtype == direct[0] and a.ndim >= 1 and a.flags.c_contiguous:
        try:
            return _native.qgemm_call_post(
                a, packed, direct[1], direct[3], multiplier, direct[2], post, _threads(ctx), _workspace(), out
            )
        except ValueError:
            pass  # a shape the kernel refuses: the twin raises the operator's error
    return run_twin("QLinearMatMulAdd", QUANTA_DOMAIN, ctx, inputs, {"c_first": c_first}, out)


@register_binder("QLinearMatMulAdd", QUANTA_DOMAIN)
def bind_qlinear_matmul_add(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """The fusion's conditions hold by construction (constant rank-2 b, constant per-tensor
    parameters but b's); refused when the product's kernel would be (QLinearMatMul's
    binder's reasons) or b is not prepacked."""
    del model  # unused: the choice depends on the node only
    a, za, b, zb, zy = (node.input(i) for i in (0, 2, 3, 5, 7))
    reason = _check_eight_bit("QLinearMatMulAdd", (("a", a), ("b", b), ("y_zero_point", zy)))
    if reason:
        return None, reason
    reason = _check_zero_points("QLinearMatMulAdd", (("a_zero_point", za, a), ("b_zero_point", zb, b)))
    if reason:
        return None, reason
    consts = [_const(node.input(i)) for i in range(13)]
    missing = [i for i in (1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12) if consts[i] is None]
    if missing:
        return None, f"inputs {missing} are not constants: the fused output stage is built at compile time"
    packed, n = _prepack(b, zb)
    if packed is None:
        return None, "b is not a constant rank-2 matrix with a per-tensor or per-column zero point"
    c_za, c_zy = consts[2], consts[7]
    assert c_za is not None and c_zy is not None
    if c_za.size != 1 or c_zy.size != 1 or np.asarray(consts[1]).size != 1:
        return (
            None,
            "a_scale, a_zero_point or y_zero_point per row: the native GEMM requantizes per column only",
        )
    rq = requant_params(node)
    m = None if rq is None else _columns(rq.multiplier, n, F32)
    if m is None or not _valid_multiplier(m):
        return None, "requantization multiplier sa·sb/sy is not finite and > 0 for every column"
    c_first = int(node.attrs.get("c_first", 1))
    with np.errstate(all="ignore"):
        k, u, r1, r2 = post_stage_constants(
            consts[8], consts[9], consts[10], consts[6], consts[7], consts[11], consts[12], n, bool(c_first)
        )
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(u)) and math.isfinite(r1) and math.isfinite(r2)):
        return None, "the QLinearAdd's ratios or fixed part are not finite"
    params: dict[str, Any] = {
        "packed": packed,
        "multiplier": m,
        "direct": (c_za.dtype, int(c_za.reshape(())), int(c_zy.reshape(())), _NAME[c_zy.dtype]),
        "post": (k, u, float(r1), float(r2)),
    }  # c_first: the node's attribute, passed by the runtime
    name = _kernel_name("qlinear_matmul_add", _dtype(a), _dtype(b), True)
    return Kernel(
        _qlinear_matmul_add_native,
        "native",
        name,
        params=params,
        out=True,
        specialize=_qlinear_matmul_add_specialized,
    ), ""


def _qlinear_matmul_add_specialized(
    sig: Specialization,
    *,
    packed: Any,
    multiplier: np.ndarray,
    direct: tuple,
    post: tuple,
    c_first: int = 1,
) -> Any:
    """The kernel call alone (as QLinearMatMul's), on one thread when the product is small."""
    plan = _direct_call_plan(sig, direct)
    if plan is None:
        return None
    threads, out = plan
    zx, zy, out_dtype = direct[1], direct[2], direct[3]
    attrs = {"packed": packed, "multiplier": multiplier, "direct": direct, "post": post, "c_first": c_first}
    call_post = _native.qgemm_call_post

    def call(a: np.ndarray, *rest: Any) -> np.ndarray:
        return call_post(a, packed, zx, out_dtype, multiplier, zy, post, threads, _workspace(), out)

    return guarded(call, _qlinear_matmul_add_native, attrs, out, reads=1, recordable=True)
