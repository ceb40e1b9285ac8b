"""Native elementwise and pooling kernels (quanta/kernels/cpp/elementwise, .../pool).

Each operator below runs one ``_native`` call whose arithmetic is its NumPy twin's, step
for step (the C++ contracts are in ``elementwise.h`` and ``pool.h``; bit-exact, tested in
tests/kernels/test_elementwise_native.py and tests/targets/test_native_elementwise.py):

=========================  ==============================================  ==========================
operator                   native call                                     twin
=========================  ==============================================  ==========================
DequantizeLinear (ai.onnx  ``dequantize_linear``: ``f32(f32(x − zp)·s)``,  quantize.dequantize_linear
and com.microsoft)         per tensor or per axis, u8/i8 -> f32
DynamicQuantizeLinear      ``dynamic_quantize_linear``: vector min/max,    quantize.dynamic_quantize_
                           eq. (10), QuantizeLinear                        linear
QLinearAdd / QLinearMul    ``qlinear_add`` (ORT's x86 FMA form) /          ms_qlinear.qlinear_add /
                           ``qlinear_mul``, numpy broadcasting             qlinear_mul
QLinearGlobalAveragePool   ``qlinear_global_average_pool`` (NCHW or        ms_qlinear.qlinear_global_
                           channels_last), integer sum + eq. (6)           average_pool
QLinearAveragePool         ``qlinear_average_pool_2d`` (1-D and 2-D; ORT's ms_qlinear.qlinear_average_
                           geometry; the global case as the twin)          pool
MaxPool (uint8 / int8,     ``max_pool_2d`` (float32: ``max_pool_2d_f32``)  nn_pool.max_pool
float32)                   (1-D and 2-D, dilations, no Indices output;
                           ONNX geometry)
QLinearSigmoid,            ``lut8``: a 256-entry table, the twin           ms_qlinear.qlinear_sigmoid
QLinearLeakyRelu           evaluated on every code                         / qlinear_leaky_relu
QLinearSoftmax             ``qlinear_softmax_rows`` with the twin's         ms_qops.qlinear_softmax
                           exponential table
QLinearConcat              ``qlinear_concat``: copy, or the twin's          ms_qlinear.qlinear_concat
                           requantization as a 256-entry table per input
=========================  ==============================================  ==========================

Tables (lookup activations, concat requantization, softmax exponentials) are built by
calling the twin itself on all 256 codes, so the gather is bit-exact by construction. They
are built at compile time when the node's scales and zero points are constants, and at
run time (cached per parameter set) when they are not.

What runs on the reference twin instead (same numbers, slower):

- at compile time, a binder refuses what its kernel can never run (storage types, blocked
  or float8 quantization, float16 scales, MaxPool's Indices output, pools of rank > 2)
  and says why; the plan records it as a fallback;
- at run time, a kernel hands the call to the twin when the inputs fall outside the fast
  path (a per-axis parameter with the wrong shape, shapes that do not broadcast, a
  geometry the kernel does not take), so that the twin computes it or raises the
  operator's own error. :data:`RUNTIME_FALLBACKS` counts those hand-overs per operator.

Threads: ``ctx.num_threads`` is handed to every kernel; results are identical for any
count (each output element is computed by the same instructions whichever thread runs it).

Length: one module for the elementwise and the pooling binders (about 1000 lines) because
they share the run-time parameter checks, the tables and the hand-over to the twin; the
pooling half can move to ``pool.py`` when either grows.
"""

from __future__ import annotations

import collections
import functools
import math
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from quanta.ir.graph import Model, Node, Value
from quanta.kernels.reference.conv_geometry import conv_attrs
from quanta.kernels.reference.ms_qlinear import (
    _ort_pool_geometry,
    qlinear_concat,
    qlinear_leaky_relu,
    qlinear_sigmoid,
)
from quanta.kernels.reference.ms_qops import softmax_exp_table
from quanta.kernels.reference.registry import MS_DOMAIN, get_op
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache
from quanta.targets.native._specialize import guarded, into_places, shape_free, step_threads
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import threads as _threads
from quanta.targets.native._values import value_dtype as _dtype
from quanta.targets.native.conv3d import depth_windows

__all__ = [
    "RUNTIME_FALLBACKS",
    "bind_dequantize_linear",
    "bind_dynamic_quantize_linear",
    "bind_max_pool",
    "bind_ms_dequantize_linear",
    "bind_qlinear_add",
    "bind_qlinear_average_pool",
    "bind_qlinear_concat",
    "bind_qlinear_global_average_pool",
    "bind_qlinear_leaky_relu",
    "bind_qlinear_mul",
    "bind_qlinear_sigmoid",
    "bind_qlinear_softmax",
]

F32 = np.float32
_U8, _I8 = np.dtype(np.uint8), np.dtype(np.int8)
_EIGHT_BIT = (_U8, _I8)
#: DequantizeLinear's codes also come in 16 bits (ORT's QUInt16 / QInt16 activations)
_DQ_CODES = (_U8, _I8, np.dtype(np.uint16), np.dtype(np.int16))
_SHORT = {_U8: "u8", _I8: "s8", np.dtype(np.uint16): "u16", np.dtype(np.int16): "s16"}
_ONNX_FLOAT = 1  # TensorProto.FLOAT

#: (domain, op_type) -> how many calls a native kernel handed to the reference twin at run
#: time (inputs outside the fast path). Tests assert it stays 0 on supported inputs.
RUNTIME_FALLBACKS: collections.Counter[tuple[str, str]] = collections.Counter()


class _Unsupported(Exception):
    """A run-time input outside the native fast path: the call goes to the reference twin."""


_NATIVE: Any = None


def _native() -> Any:
    """quanta.kernels._native, imported on first use (binders run only when it is built)."""
    global _NATIVE
    if _NATIVE is None:
        from quanta.kernels import _native as module

        _NATIVE = module
    return _NATIVE


def _with_fallback(op_type: str, domain: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Wrap a fast kernel ``fast(ctx, *inputs, prepared=..., out=..., **attrs)``: when it
    raises :class:`_Unsupported` (or the binding refuses the arguments with ValueError),
    the reference twin runs the call (and writes into ``out`` when given: a tuple of
    places for a kernel of several outputs, ``Kernel.out_all``)."""

    def deco(fast: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fast)
        def kernel(ctx: Any, *inputs: Any, prepared: Any = None, out: Any = None, **attrs: Any):
            try:
                return fast(ctx, *inputs, prepared=prepared, out=out, **attrs)
            except (_Unsupported, ValueError):
                pass
            RUNTIME_FALLBACKS[(domain, op_type)] += 1
            y = get_op(op_type, domain)(ctx, *inputs, **attrs)
            if out is None:
                return y
            if isinstance(out, tuple):
                return into_places(out, y)
            np.copyto(out, y)
            return out

        return kernel

    return deco


_Tables = BoundedCache  # per-node tables and derived constants (targets/native/_cache.py)


# --------------------------------------------------------------------------------------
# Run-time parameter helpers (mirror the twins' checks; anything else -> _Unsupported)
# --------------------------------------------------------------------------------------


def _f32_scalar(v: Any) -> np.float32:
    """A per-tensor float32 scale as the twins read it (``np.asarray(v, float32)``, one element)."""
    if v is None:
        raise _Unsupported
    a = np.asarray(v, F32)
    if a.size != 1:
        raise _Unsupported
    return F32(a.reshape(()))


def _zp_scalar(v: Any, dtype: np.dtype) -> int:
    """A per-tensor zero point of ``dtype`` (None: 0), as the twins read it."""
    if v is None:
        return 0
    a = np.asarray(v)
    if a.size != 1 or a.dtype != dtype:
        raise _Unsupported
    return int(a.reshape(()))


def _eight_bit(x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype not in _EIGHT_BIT:
        raise _Unsupported
    return np.ascontiguousarray(x)


def _positive_finite(*scales: np.float32) -> None:
    for s in scales:
        if not (np.isfinite(s) and s > 0):
            raise _Unsupported


def _all_codes(dtype: np.dtype) -> np.ndarray:
    """Every code of an 8-bit type, at the index of its bits (int8 -1 at entry 255)."""
    return np.arange(256, dtype=np.uint8).view(dtype)


def _key(*parts: Any) -> tuple:
    """A hashable key of scales (by their float32 bits) and zero points."""
    out = []
    for p in parts:
        if isinstance(p, np.floating):
            out.append(("f", np.asarray(p, F32).tobytes()))
        else:
            out.append(p)
    return tuple(out)


# --------------------------------------------------------------------------------------
# Compile-time helpers (binders)
# --------------------------------------------------------------------------------------


def _size(v: Value | None) -> int | None:
    """Number of elements when the shape is known (constants always), else None."""
    if v is None:
        return None
    if v.const is not None:
        return int(v.const.size)
    shape = v.shape
    if shape is None or any(not isinstance(d, int) for d in shape):
        return None
    return math.prod(shape)


def _check_eight_bit(op: str, *named: tuple[str, Value | None], codes: tuple = _EIGHT_BIT) -> str:
    """The reason a named value is not of ``codes`` (uint8/int8) and the common type, or ""
    (unknown types pass: the kernel checks at run time)."""
    seen = None
    for name, v in named:
        dt = _dtype(v)
        if dt is None:
            continue
        if dt not in codes:
            return f"native {op} takes {'/'.join(map(str, codes))} {name}, got {dt}"
        if seen is not None and dt != seen:
            return f"native {op}: {name} is {dt}, expected {seen} as the other operands"
        seen = dt
    return ""


def _check_per_tensor(op: str, *named: tuple[str, Value | None]) -> str:
    for name, v in named:
        n = _size(v)
        if n is not None and n != 1:
            return f"native {op} takes a per-tensor {name}, got {n} elements"
    return ""


def _check_f32(op: str, *named: tuple[str, Value | None]) -> str:
    for name, v in named:
        dt = _dtype(v)
        if dt is not None and dt != np.float32:
            return f"native {op} takes a float32 {name}, got {dt}"
    return ""


def _kernel(
    fn: Callable[..., Any], name: str, prepared: Any = None, specialize: Callable[..., Any] | None = None
) -> tuple[Kernel, str]:
    return Kernel(
        fn, "native", f"native:{name}", params={"prepared": prepared}, out=True, specialize=specialize
    ), ""


def _name_suffix(*values: Value | None) -> str:
    dt = next((d for d in (_dtype(v) for v in values) if d is not None), None)
    return _SHORT.get(dt, "8bit")


# --------------------------------------------------------------------------------------
# DequantizeLinear (ai.onnx, com.microsoft), DynamicQuantizeLinear
# --------------------------------------------------------------------------------------


def _dequantize(
    ctx: Any, x: Any, scale: Any, zero_point: Any, axis: int, per_tensor: bool, out: Any
) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype not in _DQ_CODES:
        raise _Unsupported
    x = np.ascontiguousarray(x)
    s, z = _dequantize_params(x.dtype, x.ndim, scale, zero_point, per_tensor)
    return _native().dequantize_linear(x, s, z, int(axis), _threads(ctx), out)


def _dequantize_params(
    x_dtype: np.dtype, x_ndim: int, scale: Any, zero_point: Any, per_tensor: bool
) -> tuple[np.ndarray, np.ndarray]:
    """The scale (float32) and zero point (int32) vectors the binding takes, or _Unsupported."""
    if not isinstance(scale, np.ndarray) or scale.dtype != np.float32:
        raise _Unsupported
    if zero_point is not None and (not isinstance(zero_point, np.ndarray) or zero_point.dtype != x_dtype):
        raise _Unsupported
    if per_tensor:
        s = np.ascontiguousarray(scale.reshape(1))
        if zero_point is not None and zero_point.size != 1:
            raise _Unsupported
    else:
        if x_ndim == 0 or scale.ndim != 1:
            raise _Unsupported
        s = np.ascontiguousarray(scale)
    if zero_point is None:
        z = np.zeros(s.shape, np.int32)
    elif zero_point.size == 1:
        z = np.full(s.shape, int(zero_point.reshape(())), np.int32)
    elif zero_point.ndim == 1 and zero_point.size == s.size:
        z = zero_point.astype(np.int32)
    else:
        raise _Unsupported
    return s, z


def _dequantize_specializer(fn: Callable[..., Any], onnx_domain: bool) -> Callable[..., Any]:
    """DequantizeLinear with a constant scale and zero point: the vectors the binding
    takes, and the thread count, found once (the generic call's checks and conversions
    cost three times the kernel on a [1, 16, 96] input)."""

    def specialize(sig: Specialization, **attrs: Any) -> Any:
        x_dtype, shape = sig.dtypes[0], sig.shapes[0]
        scale = sig.consts[1] if len(sig.consts) > 1 else None
        zp = sig.consts[2] if len(sig.consts) > 2 else None
        has_zp = len(sig.shapes) > 2 and sig.shapes[2] is not None
        if x_dtype not in _DQ_CODES or shape is None or scale is None or (has_zp and zp is None):
            return None
        if onnx_domain:
            if attrs.get("block_size") or attrs.get("output_dtype", 0) not in (0, _ONNX_FLOAT):
                return None
            per_tensor = scale.size == 1
            if not per_tensor and sig.ctx.opset < 13:
                return None
        else:
            if zp is not None and zp.shape != scale.shape:
                return None
            per_tensor = scale.size == 1
        try:
            s, z = _dequantize_params(x_dtype, len(shape), scale, zp, per_tensor)
        except _Unsupported:
            return None
        dq, axis, threads, out = (
            _native().dequantize_linear,
            int(attrs.get("axis", 1)),
            step_threads(sig),
            sig.out,
        )
        return guarded(
            lambda x, *rest: dq(x, s, z, axis, threads, out), fn, attrs, out, reads=1, recordable=True
        )

    return specialize


@_with_fallback("DequantizeLinear")
def _dequantize_linear_native(
    ctx: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any = None,
    *,
    prepared: Any,
    out: Any,
    axis: int = 1,
    block_size: int = 0,
    output_dtype: int = 0,
) -> np.ndarray:
    """ai.onnx DequantizeLinear, u8/i8 -> f32 (quantize.dequantize_linear_op)."""
    del prepared  # unused: nothing to precompute
    if block_size or output_dtype not in (0, _ONNX_FLOAT):
        raise _Unsupported
    per_tensor = np.asarray(x_scale).size == 1  # the twin: any one-element scale
    if not per_tensor and ctx.opset < 13:
        raise _Unsupported  # the twin raises (per-axis needs opset 13)
    return _dequantize(ctx, x, x_scale, x_zero_point, axis, per_tensor, out)


@_with_fallback("DequantizeLinear", MS_DOMAIN)
def _ms_dequantize_linear_native(
    ctx: Any, x: Any, x_scale: Any, x_zero_point: Any = None, *, prepared: Any, out: Any, axis: int = 1
) -> np.ndarray:
    """com.microsoft DequantizeLinear, u8/i8 -> f32 (ms_qops.ms_dequantize_linear)."""
    del prepared  # unused: nothing to precompute
    scale = np.asarray(x_scale)
    if x_zero_point is not None and np.shape(x_zero_point) != scale.shape:
        raise _Unsupported  # the twin raises
    per_tensor = scale.ndim == 0 or (scale.ndim == 1 and scale.shape[0] == 1) or scale.size == 1
    return _dequantize(ctx, x, x_scale, x_zero_point, axis, per_tensor, out)


def _bind_dequantize(node: Node, op: str, *, onnx_domain: bool) -> tuple[Kernel | None, str]:
    x, scale, zp = node.input(0), node.input(1), node.input(2)
    if onnx_domain:
        if node.attrs.get("block_size"):
            return None, "blocked DequantizeLinear has no native kernel yet"
        if node.attrs.get("output_dtype", 0) not in (0, _ONNX_FLOAT):
            return None, "native DequantizeLinear writes float32 only"
    reason = _check_eight_bit(op, ("x", x), ("x_zero_point", zp), codes=_DQ_CODES) or _check_f32(
        op, ("x_scale", scale)
    )
    if reason:
        return None, reason
    if scale is not None and scale.shape is not None and len(scale.shape) > 1:
        return None, "native DequantizeLinear takes a scalar or 1-D scale (blocked scales fall back)"
    fn = _dequantize_linear_native if onnx_domain else _ms_dequantize_linear_native
    return _kernel(
        fn, f"dequantize_linear_{_name_suffix(x)}", specialize=_dequantize_specializer(fn, onnx_domain)
    )


@register_binder("DequantizeLinear")
def bind_dequantize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8 -> float32, per tensor or per axis; blocked and other storages fall back."""
    del model  # unused: the choice depends on the node's types only
    return _bind_dequantize(node, "DequantizeLinear", onnx_domain=True)


@register_binder("DequantizeLinear", MS_DOMAIN)
def bind_ms_dequantize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """com.microsoft DequantizeLinear: uint8/int8 with a float32 scale."""
    del model  # unused: the choice depends on the node's types only
    return _bind_dequantize(node, "DequantizeLinear", onnx_domain=False)


def _dql_places(out: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The three planned outputs of a DynamicQuantizeLinear (``Kernel.out_all``), or None."""
    if not isinstance(out, tuple) or len(out) != 3 or any(o is None for o in out):
        return None
    return out


@_with_fallback("DynamicQuantizeLinear")
def _dynamic_quantize_linear_native(ctx: Any, x: Any, *, prepared: Any, out: Any) -> tuple:
    """DynamicQuantizeLinear: (y u8, scale f32 0-d, zero point u8 0-d), eq. (10); ``out``:
    None or the three outputs' places (Kernel.out_all), written in place."""
    del prepared  # unused: nothing to precompute
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise _Unsupported
    x = np.ascontiguousarray(x)
    places = _dql_places(out)
    if places is not None:
        return tuple(_native().dynamic_quantize_linear_into(x, *places, _threads(ctx)))
    res = tuple(_native().dynamic_quantize_linear(x, _threads(ctx)))
    return res if out is None else into_places(out, res)


@register_binder("DynamicQuantizeLinear")
def bind_dynamic_quantize_linear(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 -> uint8 with a run-time scale and zero point; its three outputs are
    planned in the arena (``out_all``), so the steps that read the scale and zero point
    (MatMulIntegerToFloat, ConvInteger's scale product) can be recorded into a native
    program with it."""
    del model  # unused: the choice depends on the node's types only
    reason = _check_f32("DynamicQuantizeLinear", ("x", node.input(0)))
    if reason:
        return None, reason
    fn = _dynamic_quantize_linear_native
    return Kernel(
        fn,
        "native",
        "native:dynamic_quantize_linear_u8",
        params={"prepared": None},
        out=True,
        out_all=True,
        specialize=_dynamic_quantize_linear_specialized,
    ), ""


@shape_free
def _dynamic_quantize_linear_specialized(
    sig: Specialization, prepared: Any = None
) -> Callable[..., Any] | None:
    """DynamicQuantizeLinear of a float32 x: with its three outputs planned in the arena,
    one recordable ``dynamic_quantize_linear_into`` call (the scale and zero point are
    computed inside it on every run); else the kernel called positionally, its three new
    arrays handed on unchecked (ONNX Runtime's quantize_dynamic puts one before every
    MatMulInteger, on rows of a few hundred floats: the generic call and the arena checks
    cost three times the kernel)."""
    if sig.dtypes[0] != np.float32:
        return None
    shape = sig.shapes[0]
    threads = sig.num_threads if shape is None else step_threads(sig, math.prod(shape))
    places = _dql_places(sig.out)
    dql = _native().dynamic_quantize_linear
    if places is not None:
        into = _native().dynamic_quantize_linear_into
        y, scale, zero_point = places

        def planned(x: np.ndarray) -> tuple:
            return into(x, y, scale, zero_point, threads)

        return guarded(
            planned, _dynamic_quantize_linear_native, {"prepared": prepared}, places, recordable=True
        )
    return guarded(
        lambda x: dql(x, threads),
        _dynamic_quantize_linear_native,
        {"prepared": prepared},
        None,
        fresh=True,
    )


# --------------------------------------------------------------------------------------
# QLinearAdd / QLinearMul
# --------------------------------------------------------------------------------------


def _binary_operands(a: Any, b: Any) -> tuple[np.ndarray, np.ndarray]:
    a = _eight_bit(a)
    b = _eight_bit(b)
    if b.dtype != a.dtype:
        raise _Unsupported
    return a, b


def _binary_scalars(op: str, dt: np.dtype, sa: Any, za: Any, sb: Any, zb: Any, sc: Any, zc: Any) -> tuple:
    """The scalars the C++ call takes after (a, b), converted as the twins read them:
    QLinearAdd (sa, za, sb, zb, sc, zc) (ms_qlinear.qlinear_add; the kernel computes
    ``ra``, ``rb``, ``k`` in the twin's order); QLinearMul (r, za, zb, zc) with
    ``r = f32(f32(sa · sb) / sc)``, the twin's expression in float32 scalars
    (ms_qlinear.qlinear_mul). A parameter of another form raises _Unsupported."""
    fa, fb, fc = _f32_scalar(sa), _f32_scalar(sb), _f32_scalar(sc)
    ia, ib, ic = _zp_scalar(za, dt), _zp_scalar(zb, dt), _zp_scalar(zc, dt)
    if op == "QLinearAdd":
        return (float(fa), ia, float(fb), ib, float(fc), ic)
    return (float(F32(F32(fa * fb) / fc)), ia, ib, ic)


def _binary_native(op: str, native_name: str) -> Callable[..., Any]:
    """QLinearAdd / QLinearMul on ``_native.<native_name>``. ``prepared``: (dtype, *the
    scalars) converted at compile time when every parameter is a constant, else None."""

    def kernel(
        ctx: Any,
        a: Any,
        a_scale: Any,
        a_zero_point: Any,
        b: Any,
        b_scale: Any,
        b_zero_point: Any = None,
        c_scale: Any = None,
        c_zero_point: Any = None,
        *,
        prepared: Any,
        out: Any,
    ) -> np.ndarray:
        a, b = _binary_operands(a, b)
        if prepared is not None and prepared[0] == a.dtype:
            scalars = prepared[1:]
        else:
            scalars = _binary_scalars(
                op, a.dtype, a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point
            )
        return getattr(_native(), native_name)(a, b, *scalars, _threads(ctx), out)

    kernel.__name__ = kernel.__qualname__ = f"_{native_name}_native"
    return _with_fallback(op, MS_DOMAIN)(kernel)


_qlinear_add_native = _binary_native("QLinearAdd", "qlinear_add")
_qlinear_mul_native = _binary_native("QLinearMul", "qlinear_mul")


#: A broadcast run shorter than this many elements is a short run (docs/kernels.md
#: (V9.1)): the AVX-512 loop takes 64 elements a step, so a run of 12 pays a call and a
#: masked tail for 12 bytes.
SHORT_RUN = 64

#: The largest constant operand (elements) a bound QLinearAdd / QLinearMul expands over
#: the trailing dimensions (V9.1): it stays in L1 / L2 beside the streamed operand.
EXPANDED_CONSTANT_MAX = 1 << 16


def _inner_run(a_shape: tuple[int, ...], b_shape: tuple[int, ...], out_shape: tuple[int, ...]) -> int:
    """The length of the inner run the native broadcast iteration makes of these shapes
    (``broadcast::make_plan``, broadcast.h: size-1 output dimensions dropped, neighbours
    that both operands walk contiguously, or both repeat, merged)."""
    r = len(out_shape)
    a = (1,) * (r - len(a_shape)) + tuple(a_shape)
    b = (1,) * (r - len(b_shape)) + tuple(b_shape)
    a_str, b_str = [0] * r, [0] * r
    a_acc = b_acc = 1
    for d in range(r - 1, -1, -1):
        a_str[d] = 0 if a[d] == 1 else a_acc
        b_str[d] = 0 if b[d] == 1 else b_acc
        a_acc *= a[d]
        b_acc *= b[d]
    kept: list[list[int]] = []  # [n, a stride, b stride]
    for d in range(r):
        if out_shape[d] == 1:
            continue
        if kept and kept[-1][1] == a_str[d] * out_shape[d] and kept[-1][2] == b_str[d] * out_shape[d]:
            kept[-1] = [kept[-1][0] * out_shape[d], a_str[d], b_str[d]]
            continue
        kept.append([out_shape[d], a_str[d], b_str[d]])
    return kept[-1][0] if kept else 1


def expanded_constant_shape(
    const_shape: tuple[int, ...], var_shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> tuple[int, ...] | None:
    """The shape a constant operand of a QLinearAdd / QLinearMul is expanded to (V9.1), or
    None to keep it: when the native broadcast would walk short runs (< SHORT_RUN) because
    the constant repeats along trailing dimensions the other operand walks (a bias [1, C,
    1] against [N, C, L]), the constant over the longest suffix of output dimensions that
    the other operand walks in full, at most EXPANDED_CONSTANT_MAX elements, its own
    dimensions before it. None when that does not lengthen the runs."""
    r = len(out_shape)
    if len(const_shape) > r or len(var_shape) > r or 0 in out_shape:
        return None
    c = (1,) * (r - len(const_shape)) + tuple(const_shape)
    v = (1,) * (r - len(var_shape)) + tuple(var_shape)
    before = _inner_run(c, v, out_shape)
    if before >= SHORT_RUN:
        return None
    j = r
    while (
        j > 0
        and v[j - 1] == out_shape[j - 1]
        and math.prod(c[: j - 1]) * math.prod(out_shape[j - 1 :]) <= EXPANDED_CONSTANT_MAX
    ):
        j -= 1
    shape = c[:j] + tuple(out_shape[j:])
    if shape == c or _inner_run(shape, v, out_shape) <= before:
        return None
    return shape


def _expanded_constants(sig: Specialization) -> tuple[np.ndarray | None, np.ndarray | None]:
    """(a, b) of a bound QLinearAdd / QLinearMul: the constant operand expanded by
    :func:`expanded_constant_shape` (a contiguous copy, read by every run), None for the
    other operand or when nothing is expanded."""
    a_shape, b_shape, out_shape = sig.shapes[0], sig.shapes[3], sig.out_shape
    if a_shape is None or b_shape is None or out_shape is None:
        return None, None
    const_a, const_b = sig.consts[0], sig.consts[3]
    if (const_a is None) == (const_b is None):  # both run-time values (or both constant)
        return None, None
    const, var_shape = (const_a, b_shape) if const_a is not None else (const_b, a_shape)
    shape = expanded_constant_shape(tuple(const.shape), tuple(var_shape), tuple(out_shape))
    if shape is None:
        return None, None
    full = np.ascontiguousarray(np.broadcast_to(np.asarray(const), shape))
    return (full, None) if const_a is not None else (None, full)


def _binary_specializer(native_name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    """QLinearAdd / QLinearMul whose scalars were prepared at compile time, for operands of
    the prepared dtype: the C++ call with them; a constant operand that would make the
    broadcast's runs short is read expanded over the trailing dimensions (V9.1)."""

    def specialize(sig: Specialization, *, prepared: Any, **attrs: Any) -> Callable[..., Any] | None:
        dt = sig.dtypes[0]
        if prepared is None or dt not in _EIGHT_BIT or sig.dtypes[3] != dt or prepared[0] != dt:
            return None
        scalars = prepared[1:]
        native, threads, out = getattr(_native(), native_name), step_threads(sig), sig.out
        full_a, full_b = _expanded_constants(sig)
        call: Callable[..., Any]
        if full_a is not None:
            call = lambda a, sa, za, b, *p: native(full_a, b, *scalars, threads, out)  # noqa: E731
        elif full_b is not None:
            call = lambda a, sa, za, b, *p: native(a, full_b, *scalars, threads, out)  # noqa: E731
        else:
            call = lambda a, sa, za, b, *p: native(a, b, *scalars, threads, out)  # noqa: E731
        run = guarded(call, fn, {"prepared": prepared, **attrs}, out, reads=4, recordable=True)
        run.expanded = next((x.shape for x in (full_a, full_b) if x is not None), None)  # type: ignore[attr-defined]
        return run

    return specialize


def _bind_binary(node: Node, op: str, fn: Callable[..., Any], stem: str) -> tuple[Kernel | None, str]:
    a, sa, za, b, sb, zb, sc, zc = (node.input(i) for i in range(8))
    reason = (
        _check_eight_bit(
            op, ("A", a), ("A_zero_point", za), ("B", b), ("B_zero_point", zb), ("C_zero_point", zc)
        )
        or _check_f32(op, ("A_scale", sa), ("B_scale", sb), ("C_scale", sc))
        or _check_per_tensor(op, ("A_scale", sa), ("B_scale", sb), ("C_scale", sc))
        or _check_per_tensor(op, ("A_zero_point", za), ("B_zero_point", zb), ("C_zero_point", zc))
    )
    if reason:
        return None, reason
    if sc is None:
        return None, f"{op} without C_scale (the twin raises)"
    specialize = _binary_specializer(stem, fn)
    return _kernel(
        fn, f"{stem}_{_name_suffix(a, b)}", _constant_binary_params(op, sa, za, sb, zb, sc, zc), specialize
    )


def _constant_binary_params(op: str, *params: Value | None) -> tuple | None:
    """The per-call scalars of QLinearAdd / QLinearMul, converted once, when every
    scale and zero point is a constant of the twins' accepted form (else None: the
    kernel reads them per call and the twin's checks apply)."""
    if any(v is not None and not v.is_const for v in params):
        return None
    dts = {np.asarray(z.const).dtype for z in params[1::2] if z is not None}  # the zero points
    if len(dts) != 1:
        return None
    dt = dts.pop()
    try:
        return (dt, *_binary_scalars(op, dt, *(None if v is None else v.const for v in params)))
    except _Unsupported:
        return None


@register_binder("QLinearAdd", MS_DOMAIN)
def bind_qlinear_add(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor parameters, any numpy broadcast."""
    del model  # unused: the choice depends on the node's types only
    return _bind_binary(node, "QLinearAdd", _qlinear_add_native, "qlinear_add")


@register_binder("QLinearMul", MS_DOMAIN)
def bind_qlinear_mul(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor parameters, any numpy broadcast."""
    del model  # unused: the choice depends on the node's types only
    return _bind_binary(node, "QLinearMul", _qlinear_mul_native, "qlinear_mul")


# --------------------------------------------------------------------------------------
# Lookup-table activations: QLinearSigmoid, QLinearLeakyRelu
# --------------------------------------------------------------------------------------


def _unary_params(x_scale: Any, x_zero_point: Any, y_scale: Any, y_zero_point: Any, dt: np.dtype) -> tuple:
    return (
        _f32_scalar(x_scale),
        _zp_scalar(x_zero_point, dt),
        _f32_scalar(y_scale),
        _zp_scalar(y_zero_point, dt),
    )


def _lut_call(ctx: Any, x: np.ndarray, table: np.ndarray, out: Any) -> np.ndarray:
    return _native().lut8(x, table, _threads(ctx), out)


def _sigmoid_table(dt: np.dtype, sx: np.float32, zx: int, sy: np.float32, zy: int) -> np.ndarray:
    return qlinear_sigmoid(_all_codes(dt), sx, np.array(zx, dt), sy, np.array(zy, dt))


def _leaky_relu_table(
    dt: np.dtype, sx: np.float32, zx: int, sy: np.float32, zy: int, alpha: float
) -> np.ndarray:
    return qlinear_leaky_relu(_all_codes(dt), sx, np.array(zx, dt), sy, np.array(zy, dt), alpha)


@_with_fallback("QLinearSigmoid", MS_DOMAIN)
def _qlinear_sigmoid_native(
    ctx: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any = None,
    *,
    prepared: _Tables,
    out: Any,
) -> np.ndarray:
    """``y = table[x]``, the table the twin's ``q(sigmoid(dq(code)))`` for every code."""
    x = _eight_bit(x)
    p = _unary_params(x_scale, x_zero_point, y_scale, y_zero_point, x.dtype)
    table = prepared.get(_key(x.dtype.char, *p), lambda: _sigmoid_table(x.dtype, *p))
    return _lut_call(ctx, x, table, out)


@_with_fallback("QLinearLeakyRelu", MS_DOMAIN)
def _qlinear_leaky_relu_native(
    ctx: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any = None,
    *,
    prepared: _Tables,
    out: Any,
    alpha: float = 0.01,
) -> np.ndarray:
    """``y = table[x]``, the table the twin's ``q(leaky_relu(dq(code)))`` for every code."""
    x = _eight_bit(x)
    p = _unary_params(x_scale, x_zero_point, y_scale, y_zero_point, x.dtype)
    table = prepared.get(_key(x.dtype.char, *p, float(alpha)), lambda: _leaky_relu_table(x.dtype, *p, alpha))
    return _lut_call(ctx, x, table, out)


def _bind_lut(
    node: Node, op: str, fn: Callable[..., Any], stem: str, build: Callable[..., np.ndarray] | None
):
    x, sx, zx, sy, zy = (node.input(i) for i in range(5))
    reason = (
        _check_eight_bit(op, ("X", x), ("X_zero_point", zx), ("Y_zero_point", zy))
        or _check_f32(op, ("X_scale", sx), ("Y_scale", sy))
        or _check_per_tensor(op, ("X_scale", sx), ("Y_scale", sy), ("X_zero_point", zx), ("Y_zero_point", zy))
    )
    if reason:
        return None, reason
    tables = _Tables()
    dt = _dtype(x)
    consts = [_const(v) for v in (sx, zx, sy, zy)]
    if (
        dt is not None
        and consts[0] is not None
        and consts[2] is not None
        and all(c is not None or v is None for c, v in zip(consts, (sx, zx, sy, zy), strict=True))
    ):
        # Compile time: the table of the node's constant parameters.
        try:
            p = _unary_params(*consts, dt)
            tables.get(_key(dt.char, *p, *build.keys), lambda: build(dt, *p))
        except _Unsupported:
            pass
    return _kernel(fn, f"{stem}_{_name_suffix(x)}", tables, specialize=_lut_specializer(fn, build))


def _lut_specializer(fn: Callable[..., Any], build: _Build) -> Callable[..., Any]:
    """A table activation whose scales and zero points are constants: its table found
    once, so a run is one ``lut8`` call (the generic call's parameter checks cost ~3x
    the lookup of an LSTM gate's few hundred codes). The table the generic call would
    use, so the same bytes."""

    def specialize(sig: Specialization, **attrs: Any) -> Any:
        dt, consts = sig.dtypes[0], sig.consts
        prepared = attrs.get("prepared")
        if dt not in _EIGHT_BIT or prepared is None or len(consts) < 4:
            return None
        zy = consts[4] if len(consts) > 4 else None
        omitted_or_const = all(
            k >= len(sig.shapes) or sig.shapes[k] is None or consts[k] is not None for k in (2, 4)
        )
        if consts[1] is None or consts[3] is None or not omitted_or_const:
            return None
        try:
            p = _unary_params(consts[1], consts[2], consts[3], zy, dt)
        except _Unsupported:
            return None
        table = prepared.get(_key(dt.char, *p, *build.keys), lambda: build(dt, *p))
        lut, threads, out = _native().lut8, step_threads(sig), sig.out
        return guarded(lambda x, *rest: lut(x, table, threads, out), fn, attrs, out, reads=1, recordable=True)

    return specialize


class _Build:
    """A table builder with the extra key parts (LeakyRelu's alpha) it depends on."""

    def __init__(self, fn: Callable[..., np.ndarray], *extra: Any) -> None:
        self.fn = fn
        self.keys = extra

    def __call__(self, dt: np.dtype, *p: Any) -> np.ndarray:
        return self.fn(dt, *p, *self.keys)


@register_binder("QLinearSigmoid", MS_DOMAIN)
def bind_qlinear_sigmoid(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor parameters: a 256-entry table (built here when the
    parameters are constants)."""
    del model  # unused: the choice depends on the node only
    return _bind_lut(
        node, "QLinearSigmoid", _qlinear_sigmoid_native, "qlinear_sigmoid", _Build(_sigmoid_table)
    )


@register_binder("QLinearLeakyRelu", MS_DOMAIN)
def bind_qlinear_leaky_relu(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor parameters: a 256-entry table (built here when the
    parameters are constants)."""
    del model  # unused: the choice depends on the node only
    alpha = float(node.attrs.get("alpha", 0.01))
    build = _Build(_leaky_relu_table, alpha)
    return _bind_lut(node, "QLinearLeakyRelu", _qlinear_leaky_relu_native, "qlinear_leaky_relu", build)


# --------------------------------------------------------------------------------------
# QLinearSoftmax
# --------------------------------------------------------------------------------------


@_with_fallback("QLinearSoftmax", MS_DOMAIN)
def _qlinear_softmax_native(
    ctx: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any = None,
    y_scale: Any = None,
    y_zero_point: Any = None,
    *,
    prepared: _Tables,
    out: Any,
    opset: int | None = None,
    axis: int = -1,
) -> np.ndarray:
    """ms_qops.qlinear_softmax: rows along ``axis`` (opset < 13: the input coerced to 2-D),
    the twin's exponential table for the row length, the row kernel."""
    x = _eight_bit(x)
    if opset is None or x.ndim == 0 or x.size == 0:
        raise _Unsupported
    for s in (x_scale, y_scale):  # the twin: float32, rank 0 or shape [1]
        if s is None or np.asarray(s).dtype != np.float32 or np.ndim(s) > 1 or np.size(s) != 1:
            raise _Unsupported
    if x_zero_point is not None:
        if np.ndim(x_zero_point) > 1:
            raise _Unsupported
        _zp_scalar(x_zero_point, x.dtype)  # checked by the twin, not used
    if y_zero_point is not None and np.ndim(y_zero_point) > 1:
        raise _Unsupported
    sx, sy, zy = _f32_scalar(x_scale), _f32_scalar(y_scale), _zp_scalar(y_zero_point, x.dtype)
    _positive_finite(sx, sy)
    rank = x.ndim
    if not -rank <= axis < rank:
        raise _Unsupported
    axis %= rank
    if opset < 13:
        rows = x.reshape(math.prod(x.shape[:axis]), -1)
        moved = None
    elif axis == rank - 1:
        rows = x.reshape(-1, x.shape[-1])
        moved = None
    else:
        moved = np.moveaxis(x, axis, -1)
        rows = np.ascontiguousarray(moved).reshape(-1, x.shape[axis])
    d = rows.shape[1]
    table = prepared.get(_key(sx, d), lambda: softmax_exp_table(sx, d))
    ys = F32(np.floor(np.divide(F32(1.0), sy, dtype=F32)))
    if moved is None:
        y_rows = None if out is None else out.reshape(rows.shape)
        y = _native().qlinear_softmax_rows(rows, table, float(ys), zy, _threads(ctx), y_rows)
        return y.reshape(x.shape) if out is None else out
    y = np.moveaxis(
        _native().qlinear_softmax_rows(rows, table, float(ys), zy, _threads(ctx)).reshape(moved.shape),
        -1,
        axis,
    )
    if out is None:
        return np.ascontiguousarray(y)
    np.copyto(out, y)
    return out


@register_binder("QLinearSoftmax", MS_DOMAIN)
def bind_qlinear_softmax(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor scales; the exponential table per row length (built at
    compile time when x_scale is a constant and the row length is known)."""
    del model  # unused: the choice depends on the node only
    op = "QLinearSoftmax"
    x, sx, zx, sy, zy = (node.input(i) for i in range(5))
    if "opset" not in node.attrs:
        return None, "QLinearSoftmax without its opset attribute (the twin raises)"
    reason = (
        _check_eight_bit(op, ("X", x), ("x_zero_point", zx), ("y_zero_point", zy))
        or _check_f32(op, ("X_scale", sx), ("y_scale", sy))
        or _check_per_tensor(op, ("X_scale", sx), ("y_scale", sy), ("y_zero_point", zy))
    )
    if reason:
        return None, reason
    tables = _Tables()
    c = _const(sx)
    shape = x.shape if x is not None else None
    opset = int(node.attrs["opset"])
    axis = int(node.attrs.get("axis", -1))
    if c is not None and c.size == 1 and shape is not None and shape:
        rank = len(shape)
        if -rank <= axis < rank:
            ax = axis % rank
            dims = shape[ax:] if opset < 13 else (shape[ax],)
            if all(isinstance(v, int) for v in dims):
                d = math.prod(dims)
                sx32 = F32(np.asarray(c, F32).reshape(()))
                if d >= 1 and np.isfinite(sx32) and sx32 > 0:
                    tables.get(_key(sx32, d), lambda: softmax_exp_table(sx32, d))
    return _kernel(_qlinear_softmax_native, f"qlinear_softmax_{_name_suffix(x)}", tables)


# --------------------------------------------------------------------------------------
# QLinearConcat
# --------------------------------------------------------------------------------------


@_with_fallback("QLinearConcat", MS_DOMAIN)
def _qlinear_concat_native(
    ctx: Any,
    y_scale: Any,
    y_zero_point: Any,
    *rest: Any,
    prepared: _Tables,
    out: Any,
    axis: int | None = None,
) -> np.ndarray:
    """ms_qlinear.qlinear_concat: each input copied when its (scale, zero point) equal the
    output's, else mapped through the twin's requantization evaluated on all 256 codes."""
    del ctx  # unused: a copy per input (memory-bound, one thread)
    if axis is None or not rest or len(rest) % 3:
        raise _Unsupported
    zy_arr = np.asarray(y_zero_point)
    dt = zy_arr.dtype
    if dt not in _EIGHT_BIT:
        raise _Unsupported
    sy, zy = _f32_scalar(y_scale), _zp_scalar(zy_arr, dt)
    inputs, tables = [], []
    for i in range(0, len(rest), 3):
        x, sx_in, zx_in = rest[i : i + 3]
        x = _eight_bit(x)
        if x.dtype != dt:
            raise _Unsupported
        # the twin takes these as given: float32 and the storage type, never omitted
        if sx_in is None or zx_in is None or np.asarray(sx_in).dtype != np.float32:
            raise _Unsupported
        sx, zx = _f32_scalar(sx_in), _zp_scalar(zx_in, dt)
        inputs.append(x)
        if sx == sy and zx == zy:
            tables.append(None)
        else:
            key = _key(dt.char, sx, zx, sy, zy)
            tables.append(prepared.get(key, functools.partial(_concat_table, dt, sx, zx, sy, zy)))
    return _native().qlinear_concat(inputs, tables, int(axis), out)


def _concat_table(dt: np.dtype, sx: np.float32, zx: int, sy: np.float32, zy: int) -> np.ndarray:
    """The twin's ``q_y(dq_x(code))`` for every code (a requantizing concat of the codes)."""
    return qlinear_concat(sy, np.array(zy, dt), [(_all_codes(dt), sx, np.array(zx, dt))], 0)


@register_binder("QLinearConcat", MS_DOMAIN)
def bind_qlinear_concat(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor parameters: copies, or 256-entry requantization tables
    (built here for constant parameters)."""
    del model  # unused: the choice depends on the node only
    op = "QLinearConcat"
    if "axis" not in node.attrs:
        return None, "QLinearConcat without its axis attribute (the twin raises)"
    ins = node.inputs
    if len(ins) < 5 or (len(ins) - 2) % 3:
        expected = "Y_scale, Y_zero_point and (X, X_scale, X_zero_point) triples"
        return None, f"QLinearConcat expects {expected}, got {len(ins)} inputs"
    named = [("Y_zero_point", ins[1])]
    scales = [("Y_scale", ins[0])]
    for j, i in enumerate(range(2, len(ins), 3)):
        named += [(f"input {j}", ins[i]), (f"zero point of input {j}", ins[i + 2])]
        scales.append((f"scale of input {j}", ins[i + 1]))
    reason = (
        _check_eight_bit(op, *named)
        or _check_f32(op, *scales)
        or _check_per_tensor(op, *scales, *(nv for nv in named if nv[0].startswith(("zero", "Y_zero"))))
    )
    if reason:
        return None, reason
    tables = _Tables()
    sy_c, zy_c = _const(ins[0]), _const(ins[1])
    if (
        sy_c is not None
        and zy_c is not None
        and zy_c.dtype in _EIGHT_BIT
        and sy_c.size == 1
        and zy_c.size == 1
    ):
        dt = zy_c.dtype
        sy, zy = F32(np.asarray(sy_c, F32).reshape(())), int(zy_c.reshape(()))
        for i in range(2, len(ins), 3):
            sx_c, zx_c = _const(ins[i + 1]), _const(ins[i + 2])
            if sx_c is None or zx_c is None or sx_c.size != 1 or zx_c.size != 1 or zx_c.dtype != dt:
                continue
            sx, zx = F32(np.asarray(sx_c, F32).reshape(())), int(zx_c.reshape(()))
            if not (sx == sy and zx == zy):
                tables.get(
                    _key(dt.char, sx, zx, sy, zy), functools.partial(_concat_table, dt, sx, zx, sy, zy)
                )
    return _kernel(
        _qlinear_concat_native,
        f"qlinear_concat_{_name_suffix(ins[1])}",
        tables,
        specialize=_qlinear_concat_specialized,
    )


def _qlinear_concat_specialized(sig: Specialization, **attrs: Any) -> Any:
    """QLinearConcat whose scales and zero points are constants: the copy-or-table
    choice per input made once, so a run is one native call on the inputs (the generic
    call's per-input checks cost ~10x the copy of a streaming model's few hundred codes).
    The same choices and tables as the generic call, so the same bytes."""
    axis, prepared = attrs.get("axis"), attrs.get("prepared")
    consts, dtypes = sig.consts, sig.dtypes
    n = len(consts)
    if axis is None or prepared is None or n < 5 or (n - 2) % 3 or consts[0] is None or consts[1] is None:
        return None
    dt = np.asarray(consts[1]).dtype
    if dt not in _EIGHT_BIT:
        return None
    try:
        sy, zy = _f32_scalar(consts[0]), _zp_scalar(consts[1], dt)
        tables = []
        for i in range(2, n, 3):
            sx_c, zx_c = consts[i + 1], consts[i + 2]
            if dtypes[i] != dt or sx_c is None or zx_c is None or np.asarray(sx_c).dtype != np.float32:
                return None
            sx, zx = _f32_scalar(sx_c), _zp_scalar(zx_c, dt)
            if sx == sy and zx == zy:
                tables.append(None)
            else:
                key = _key(dt.char, sx, zx, sy, zy)
                tables.append(prepared.get(key, functools.partial(_concat_table, dt, sx, zx, sy, zy)))
    except _Unsupported:
        return None
    concat, ax, out = _native().qlinear_concat, int(axis), sig.out

    def call(ys: Any, yz: Any, *rest: Any) -> Any:
        return concat(list(rest[0::3]), tables, ax, out)

    # one kernel call (run_or_record) into out: a streaming model's concats of its cache
    # and the new frame run inside the native program around them
    return guarded(call, _qlinear_concat_native, attrs, out, recordable=True)


# --------------------------------------------------------------------------------------
# Pooling: QLinearGlobalAveragePool, QLinearAveragePool, MaxPool (uint8/int8)
# --------------------------------------------------------------------------------------


def _gap(
    ctx: Any, x: np.ndarray, sx: np.float32, zx: int, sy: np.float32, zy: int, channels_last: bool, out: Any
):
    """ms_qlinear.qlinear_global_average_pool: ``m = f32(sx / f32(sy · f32(HW)))``."""
    spatial = x.shape[1:-1] if channels_last else x.shape[2:]
    image_size = math.prod(spatial)
    m = F32(sx / F32(sy * F32(image_size)))  # the twin's expression, float32 scalars
    return _native().qlinear_global_average_pool(x, float(m), zx, zy, channels_last, _threads(ctx), out)


@_with_fallback("QLinearGlobalAveragePool", MS_DOMAIN)
def _qlinear_global_average_pool_native(
    ctx: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    prepared: Any,
    out: Any,
    channels_last: int = 0,
) -> np.ndarray:
    del prepared  # unused: the multiplier depends on the run-time image size
    x = _eight_bit(x)
    if x.ndim < 3:
        raise _Unsupported
    sx, sy = _f32_scalar(x_scale), _f32_scalar(y_scale)
    zx, zy = _zp_scalar(x_zero_point, x.dtype), _zp_scalar(y_zero_point, x.dtype)
    return _gap(ctx, x, sx, zx, sy, zy, bool(channels_last), out)


def _gap_specialized(
    sig: Specialization, *, prepared: Any, channels_last: int = 0, **attrs: Any
) -> Callable[..., Any] | None:
    """QLinearGlobalAveragePool with constant parameters, for one x shape: the multiplier
    of ``_gap`` computed once."""
    shape, dt = sig.shapes[0], sig.dtypes[0]
    if shape is None or len(shape) < 3 or dt not in _EIGHT_BIT or any(c is None for c in sig.consts[1:5]):
        return None
    try:
        sx, sy = _f32_scalar(sig.consts[1]), _f32_scalar(sig.consts[3])
        zx, zy = _zp_scalar(sig.consts[2], dt), _zp_scalar(sig.consts[4], dt)
    except _Unsupported:
        return None
    cl = bool(channels_last)
    image_size = math.prod(shape[1:-1] if cl else shape[2:])
    m = float(F32(sx / F32(sy * F32(image_size))))  # _gap's expression
    gap, threads, out = _native().qlinear_global_average_pool, step_threads(sig, math.prod(shape)), sig.out
    generic_attrs = {"prepared": prepared, "channels_last": channels_last, **attrs}
    return guarded(
        lambda x, *p: gap(x, m, zx, zy, cl, threads, out),
        _qlinear_global_average_pool_native,
        generic_attrs,
        out,
        reads=1,
    )


def _check_pool_params(op: str, node: Node) -> str:
    """Why the inputs (X, x_scale, x_zero_point, y_scale, y_zero_point) of a quantized
    average pool cannot run natively ("" when they can): uint8/int8, float32 per-tensor scales."""
    x, sx, zx, sy, zy = (node.input(i) for i in range(5))
    return (
        _check_eight_bit(op, ("X", x), ("x_zero_point", zx), ("y_zero_point", zy))
        or _check_f32(op, ("x_scale", sx), ("y_scale", sy))
        or _check_per_tensor(op, ("x_scale", sx), ("y_scale", sy), ("x_zero_point", zx), ("y_zero_point", zy))
    )


@register_binder("QLinearGlobalAveragePool", MS_DOMAIN)
def bind_qlinear_global_average_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor parameters, NCHW or channels_last, any number of spatial axes."""
    del model  # unused: the choice depends on the node only
    op = "QLinearGlobalAveragePool"
    x = node.input(0)
    reason = _check_pool_params(op, node)
    if reason:
        return None, reason
    if x is not None and x.shape is not None and len(x.shape) < 3:
        return None, f"{op} takes rank >= 3, got rank {len(x.shape)}"
    return _kernel(
        _qlinear_global_average_pool_native,
        f"qlinear_global_average_pool_{_name_suffix(x)}",
        specialize=_gap_specialized,
    )


def _as_2d(x: np.ndarray) -> np.ndarray:
    """(N, C, L) -> (N, C, 1, L): a 1-D pool is a 2-D pool over one row."""
    return x.reshape(x.shape[0], x.shape[1], 1, x.shape[2]) if x.ndim == 3 else x


def _pair(values: list[int] | tuple[int, ...], one_d_fill: int) -> tuple[int, int]:
    return (one_d_fill, int(values[0])) if len(values) == 1 else (int(values[0]), int(values[1]))


class _PoolGeometry(NamedTuple):
    """A QLinearAveragePool's geometry on one input: the 2-D kernel's window arguments
    (``(kernel, strides, leading pads, out_spatial)``, a 1-D pool as one row), the output's
    spatial shape, and whether it is the twin's global case (kernel = input, no pads), which
    the twin (as ORT) computes as the integer global average."""

    window: tuple[tuple[int, int], tuple[int, int], tuple[int, int], tuple[int, int]]
    out_spatial: tuple[int, ...]
    is_global: bool


def _average_pool_geometry(
    in_spatial: tuple[int, ...],
    kernel_shape: list[int],
    strides: list[int] | None,
    pads: list[int] | None,
    auto_pad: str,
    ceil_mode: int,
) -> _PoolGeometry | None:
    """ORT's geometry of a QLinearAveragePool over ``in_spatial``, or None when the native
    kernel does not take it: a kernel, strides or pads of another rank than the input's, a
    stride or kernel below 1, or negative pads (the twin's ``np.pad`` raises)."""
    n_sp = len(in_spatial)
    kernel = [int(k) for k in kernel_shape]
    st = [int(s) for s in strides] if strides else [1] * n_sp
    pd = [int(p) for p in pads] if pads else [0] * (2 * n_sp)
    if len(kernel) != n_sp or len(st) != n_sp or len(pd) != 2 * n_sp or any(v < 1 for v in st + kernel):
        return None
    pd, out_spatial = _ort_pool_geometry(in_spatial, kernel, st, pd, auto_pad, bool(ceil_mode))
    if any(p < 0 for p in pd):
        return None
    window = (_pair(kernel, 1), _pair(st, 1), _pair(pd[:n_sp], 0), _pair(out_spatial, 1))
    return _PoolGeometry(window, tuple(out_spatial), list(in_spatial) == kernel and not any(pd))


@_with_fallback("QLinearAveragePool", MS_DOMAIN)
def _qlinear_average_pool_native(
    ctx: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any = None,
    *,
    prepared: Any,
    out: Any,
    kernel_shape: list[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    channels_last: int = 0,
    count_include_pad: int = 0,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> np.ndarray:
    """ms_qlinear.qlinear_average_pool, 1-D and 2-D, with ORT's geometry; the twin's
    global case (kernel == input, no pads) on the global-average kernel."""
    del prepared  # unused: the geometry depends on the run-time shape
    x = _eight_bit(x)
    if kernel_shape is None or x.ndim not in (3, 4):
        raise _Unsupported
    dt = x.dtype
    xc = np.ascontiguousarray(np.moveaxis(x, -1, 1)) if channels_last else x
    geometry = _average_pool_geometry(tuple(xc.shape[2:]), kernel_shape, strides, pads, auto_pad, ceil_mode)
    if geometry is None:
        raise _Unsupported
    sx, sy = _f32_scalar(x_scale), _f32_scalar(y_scale)
    zx, zy = _zp_scalar(x_zero_point, dt), _zp_scalar(y_zero_point, dt)
    direct_out = out if not channels_last else None
    if geometry.is_global:
        y = _gap(ctx, xc, sx, zx, sy, zy, False, direct_out)
    else:
        y4_out = None if direct_out is None else _as_2d(direct_out)
        y = _native().qlinear_average_pool_2d(
            _as_2d(xc),
            *geometry.window,
            float(sx),
            zx,
            float(sy),
            zy,
            bool(count_include_pad),
            _threads(ctx),
            y4_out,
        )
        y = y.reshape(xc.shape[:2] + geometry.out_spatial) if y4_out is None else direct_out
    if not channels_last:
        return y
    y = np.moveaxis(y, 1, -1)
    if out is None:
        return np.ascontiguousarray(y)
    np.copyto(out, y)
    return out


def _qlinear_average_pool_specialized(
    sig: Specialization,
    *,
    prepared: Any,
    kernel_shape: list[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    channels_last: int = 0,
    count_include_pad: int = 0,
    pads: list[int] | None = None,
    strides: list[int] | None = None,
) -> Callable[..., Any] | None:
    """QLinearAveragePool with constant parameters, for one x shape: ORT's geometry and
    the scalars once, and for channels_last the generic call's axis moves as the native
    batched transpose (NHWC -> NCHW, the pool, NCHW -> NHWC: the same bytes in the same
    places as ``moveaxis`` + copy). A selector's pool over 1 KiB spent its step in the
    generic call's NumPy work (svtr_selector: ~50-160 us a run). The global case (kernel
    = input, no pads) stays on the generic call, which switches to the global kernel."""
    shape, dt = sig.shapes[0], sig.dtypes[0]
    if (
        shape is None
        or len(shape) not in (3, 4)
        or dt not in _EIGHT_BIT
        or kernel_shape is None
        or any(c is None for c in sig.consts[1:5])
    ):
        return None
    cl = bool(channels_last)
    n, c = shape[0], shape[-1] if cl else shape[1]
    in_spatial = tuple(shape[1:-1] if cl else shape[2:])
    g = _average_pool_geometry(in_spatial, kernel_shape, strides, pads, auto_pad, ceil_mode)
    if g is None or g.is_global:
        return None
    try:
        sx, sy = float(_f32_scalar(sig.consts[1])), float(_f32_scalar(sig.consts[3]))
        zx, zy = _zp_scalar(sig.consts[2], dt), _zp_scalar(sig.consts[4], dt)
    except _Unsupported:
        return None
    geometry, out_spatial = g.window, g.out_spatial
    pool, transpose = _native().qlinear_average_pool_2d, _native().transpose_batched
    threads, out, include = step_threads(sig, math.prod(shape)), sig.out, bool(count_include_pad)
    nchw, s_in, s_out = (n, c, *in_spatial), math.prod(in_spatial), math.prod(out_spatial)
    out_nchw = (n, c, *out_spatial)
    generic_attrs = {
        "prepared": prepared,
        "kernel_shape": kernel_shape,
        "auto_pad": auto_pad,
        "ceil_mode": ceil_mode,
        "channels_last": channels_last,
        "count_include_pad": count_include_pad,
        "pads": pads,
        "strides": strides,
    }
    if not cl:

        def call(x: np.ndarray, *rest: Any) -> np.ndarray:
            y4 = pool(
                _as_2d(x), *geometry, sx, zx, sy, zy, include, threads, None if out is None else _as_2d(out)
            )
            return out if out is not None else y4.reshape(out_nchw)

    elif out is not None:
        # A call with a planned output runs under its BoundRun's arena lock, one run at a
        # time (quanta.runtime.execute), so its NCHW scratch (the input and the pooled
        # output) is allocated once, here
        xc, y4 = np.empty(nchw, dt), np.empty(out_nchw, dt)
        xc4, y44 = _as_2d(xc), _as_2d(y4)

        def call(x: np.ndarray, *rest: Any) -> np.ndarray:
            transpose(x, n, s_in, c, threads, xc)  # [N, S, C] -> [N, C, S]
            pool(xc4, *geometry, sx, zx, sy, zy, include, threads, y44)
            transpose(y44, n, c, s_out, threads, out)  # [N, C, S'] -> [N, S', C]
            return out

    else:
        # Without a planned output, runs of an arena-free BoundRun may call this at once
        # from several threads: each call has its own scratch
        out_nhwc = (n, *out_spatial, c)

        def call(x: np.ndarray, *rest: Any) -> np.ndarray:
            xc = np.empty(nchw, dt)
            transpose(x, n, s_in, c, threads, xc)  # [N, S, C] -> [N, C, S]
            y4 = pool(_as_2d(xc), *geometry, sx, zx, sy, zy, include, threads, None)
            y = np.empty(out_nhwc, dt)
            transpose(y4, n, c, s_out, threads, y)  # [N, C, S'] -> [N, S', C]
            return y

    return guarded(call, _qlinear_average_pool_native, generic_attrs, out, reads=1)


@register_binder("QLinearAveragePool", MS_DOMAIN)
def bind_qlinear_average_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8, per-tensor parameters, 1-D or 2-D windows (NCHW or channels_last)."""
    del model  # unused: the choice depends on the node only
    op = "QLinearAveragePool"
    x = node.input(0)
    reason = _check_pool_params(op, node)
    if reason:
        return None, reason
    kernel_shape = node.attrs.get("kernel_shape")
    if kernel_shape is None:
        return None, f"{op} without kernel_shape (the twin raises)"
    if len(kernel_shape) not in (1, 2):
        return None, f"native {op} takes 1-D and 2-D windows, got {len(kernel_shape)}-D"
    return _kernel(
        _qlinear_average_pool_native,
        f"qlinear_average_pool_2d_{_name_suffix(x)}",
        specialize=_qlinear_average_pool_specialized,
    )


def _float32(x: Any) -> np.ndarray:
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        raise _Unsupported
    return np.ascontiguousarray(x)


def _max_pool(
    ctx: Any,
    x: Any,
    *,
    prepared: _Tables,
    out: Any,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    dilations: list[int] | None = None,
    kernel_shape: list[int] | None = None,
    pads: list[int] | None = None,
    storage_order: int = 0,
    strides: list[int] | None = None,
    float_input: bool = False,
) -> np.ndarray:
    """nn_pool.max_pool on uint8/int8 (pool.h max_pool_2d) or, with ``float_input``, float32
    (max_pool_2d_f32), no Indices output; ONNX geometry (conv_attrs, cached per input shape
    in ``prepared``: the node's attributes are fixed)."""
    del storage_order  # unused: no Indices output
    x = _float32(x) if float_input else _eight_bit(x)
    if ctx.n_outputs != 1 or kernel_shape is None or x.ndim not in (3, 4, 5):
        raise _Unsupported
    geom = prepared.get(
        x.shape,
        lambda: conv_attrs(
            x.shape,
            None,
            kernel_shape=kernel_shape,
            strides=strides,
            dilations=dilations,
            pads=pads,
            auto_pad=auto_pad,
            ceil_mode=bool(ceil_mode),
        ),
    )
    n_sp = x.ndim - 2
    pool = _native().max_pool_2d_f32 if float_input else _native().max_pool_2d
    if n_sp == 3:
        return _max_pool_3d(ctx, x, geom, pool, out)
    y = pool(
        _as_2d(x),
        _pair(geom.kernel_shape, 1),
        _pair(geom.strides, 1),
        _pair(geom.dilations, 1),
        _pair(geom.pads[:n_sp], 0),
        _pair(geom.out_shape, 1),
        _threads(ctx),
        None if out is None else _as_2d(out),
    )
    return y.reshape(x.shape[:2] + tuple(geom.out_shape)) if out is None else out


def _max_pool_3d(ctx: Any, x: np.ndarray, geom: Any, pool: Callable[..., Any], out: Any) -> np.ndarray:
    """A 3-D MaxPool as the 2-D kernel over its depth windows (conv3d.depth_windows: for
    each output depth the KD planes it reads, as channels), then the maximum over the KD
    results: max only selects, so any grouping of a window's positions gives the twin's
    values; depths outside x are planes of the twin's fill (−inf, the integer minimum),
    which never win, and a NaN anywhere in a window stays NaN (np.max)."""
    n, c = x.shape[:2]
    kd, od, (oh, ow) = geom.kernel_shape[0], geom.out_shape[0], geom.out_shape[1:]
    fill = -np.inf if x.dtype == np.float32 else np.iinfo(x.dtype).min
    planes = depth_windows(x, geom, 1, fill)
    y4 = pool(
        planes,
        list(geom.kernel_shape[1:]),
        list(geom.strides[1:]),
        list(geom.dilations[1:]),
        [geom.pads[1], geom.pads[2]],
        [oh, ow],
        _threads(ctx),
        None,
    )
    y = y4.reshape(n, od, kd, c, oh, ow).max(axis=2).transpose(0, 2, 1, 3, 4)
    if out is None:
        return np.ascontiguousarray(y)
    np.copyto(out, y)
    return out


# one wrapped kernel per input kind: ``float_input`` is not an attribute the reference twin
# takes when a call falls back to it
@_with_fallback("MaxPool")
def _max_pool_native(ctx: Any, x: Any, **kw: Any) -> np.ndarray:
    return _max_pool(ctx, x, **kw)


@_with_fallback("MaxPool")
def _max_pool_native_f32(ctx: Any, x: Any, **kw: Any) -> np.ndarray:
    return _max_pool(ctx, x, float_input=True, **kw)


@register_binder("MaxPool")
def bind_max_pool(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8 and float32 MaxPool, 1-D, 2-D or 3-D windows (3-D: the 2-D kernel over
    depth windows), without the Indices output."""
    del model  # unused: the choice depends on the node only
    dt = _dtype(node.input(0))
    if dt != np.float32 and dt not in _EIGHT_BIT:
        got = "unknown" if dt is None else dt
        return None, f"native MaxPool takes uint8/int8/float32 x, got {got}"
    if len(node.outputs) > 1:
        return None, "native MaxPool has no Indices output"
    kernel_shape = node.attrs.get("kernel_shape")
    if kernel_shape is None:
        return None, "MaxPool without kernel_shape (the twin raises)"
    if len(kernel_shape) not in (1, 2, 3):
        return None, f"native MaxPool takes 1-D, 2-D and 3-D windows, got {len(kernel_shape)}-D"
    if dt == np.float32:
        return _kernel(_max_pool_native_f32, "max_pool_2d_f32", _Tables())
    return _kernel(_max_pool_native, f"max_pool_2d_{_SHORT[dt]}", _Tables())
