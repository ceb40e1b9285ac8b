"""Native kernels for the non-quantized tensor steps of quantized models
(kernels/cpp/tensor_ops): Clip, Cast, unary float functions, Pow, HardSigmoid,
BatchNormalization (inference), comparisons and logic, Where, and the data movement
of Slice, Concat, Split, Gather, Expand, Tile, Transpose, Shape, Size and Constant.

=====================  =============================================  ==========================
operator               native call                                    twin (bit-identical)
=====================  =============================================  ==========================
Clip                   ``unary_f32_ex("clip")``, ``clip_int``         nn.clip (np.maximum, then
                                                                      np.minimum)
Cast                   ``cast`` (float32/64, (u)int8, int32/64, bool)  math_ops.cast_to (astype)
                       float32 <-> float16: ``cast_half`` (F16C, NumPy's NaN bits)
Sqrt Neg Abs           ``unary_f32_ex``                               math_ops (one IEEE op)
Reciprocal
Exp                    ``exp_f32``                                    math_ops.exp: (E1)-(E6)
Pow (exponent 1, 2,    ``unary_f32_ex`` square / cube / sqrt, a copy  math_ops.POW_EXACT_FORMS
3, 0.5)
Pow (another finite    ``unary_f32("log")``, ``exp_f32``, NumPy's     float_ops.pow_f32:
float32 exponent)      abs / multiply / where between them            (PW1)-(PW3)
HardSigmoid            ``unary_f32_ex("hard_sigmoid")``               nn.hard_sigmoid
LeakyRelu              ``unary_f32_ex("leaky_relu")``                 nn.leaky_relu
HardSwish              ``unary_f32_ex("hard_swish")``                 nn.hard_swish
BatchNormalization     ``batch_norm_f32`` (per-channel m, d, g, b)    nn_norm.batch_normalization
                                                                      (float32 steps)
Equal Less LessOrEqual ``broadcast_op``                               math_ops (numpy compare)
Greater GreaterOrEqual
And Or Xor Not
IsNaN                  NumPy's isnan ufunc into the arena             math_ops (np.isnan)
IsInf                  NumPy's isinf / isposinf / isneginf into the   math_ops.isinf (the same
                       arena (by detect_positive / detect_negative)   tests, OR-ed)
Floor Ceil Round Sign  NumPy's floor / ceil / rint / sign ufunc       math_ops (the same ufunc)
                       (float32, float64) into the arena
Where                  ``copy_strided`` of y, then of x where cond    math_ops.where
Gather                 ``take_axis``                                  tensor_ops.gather
GatherND               ``take_axis`` of the rows the index tuples     tensor_ops.gather_nd
                       name (data seen as [rows, slice])
Transpose (any perm)   ``copy_strided`` of the transposed view        tensor_ops.transpose
DepthToSpace,          ``copy_strided`` of the twin's reshaped,       nn.depth_to_space /
SpaceToDepth           transposed view                                space_to_depth
Slice, Expand          ``copy_strided`` of the sliced / broadcast     tensor_ops.slice_ / expand
                       view
ScatterElements        ``scatter_f32`` in the updates' order          tensor_ops.scatter_elements
(add, mul; float32)                                                   (scatter_in_order), (SC1)
ScatterElements        ``scatter_nd`` over the flat data, the         tensor_ops.scatter_elements
(none; float32/64,     positions as rows: in order, the last          (fancy assignment)
int32/64)              duplicate wins
Pad                    ``take_axis`` per padded axis (reflect, edge,  nn.pad
                       wrap); constant: border fill, one copy
=====================  =============================================  ==========================

Pure data movement where C++ buys nothing, stated as such: Concat is one
``np.concatenate(..., out=)``; Split returns the twin's views (the executor copies a
view only where it must); Tile one ``np.copyto`` into a broadcast view; Range one ``np.arange``;
ConstantOfShape one ``np.full``; Shape and Size build a tiny int64 array from the
input's shape; Constant returns its attribute value, decoded once at compile time. None
of these does per-element work in Python.

A kernel whose run-time inputs fall outside its fast path (a dtype without a kernel, a
non-scalar Clip bound) hands the call to the twin, which computes it or raises the
operator's error (float_ops.RUNTIME_FALLBACKS counts those hand-overs).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.accumulator import (
    accumulator_to_float,
    accumulator_to_quant,
    mul_quant,
    softmax_quant,
)
from quanta.kernels.reference.float_ops import pow_f32
from quanta.kernels.reference.math_ops import onnx_dtype, pow_exponent, pow_general_exponent
from quanta.kernels.reference.registry import OpContext
from quanta.kernels.reference.tensor_ops import _indices, slice_bounds
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._cache import BoundedCache
from quanta.targets.native._specialize import SMALL_WORK, guarded, shape_free, step_threads
from quanta.targets.native.float_ops import (
    RUNTIME_FALLBACKS,
    _dtype,
    _f32,
    _native,
    _threads,
    _Unsupported,
    _with_fallback,
)
from quanta.targets.reference import reference_kernel

__all__ = ["NATIVE_DTYPES"]

F32 = np.dtype(np.float32)
F16 = np.dtype(np.float16)

#: element types the tensor_ops kernels take (Cast between any two, comparisons of any)
NATIVE_DTYPES = frozenset(
    np.dtype(t) for t in (np.float32, np.float64, np.int8, np.uint8, np.int32, np.int64, np.bool_)
)
_INT_CLIP = frozenset(np.dtype(t) for t in (np.int8, np.uint8, np.int32, np.int64))


def _c(a: Any) -> np.ndarray:
    """``a`` as a C-contiguous array (rank 0 stays rank 0), or _Unsupported."""
    if not isinstance(a, np.ndarray) or a.dtype not in NATIVE_DTYPES:
        raise _Unsupported
    return np.asarray(a, order="C")


def _kernel(
    fn: Callable[..., Any],
    name: str,
    *,
    out: bool = True,
    specialize: Callable[..., Any] | None = None,
    **params: Any,
) -> tuple[Kernel, str]:
    return Kernel(fn, "native", f"native:{name}", params=params, out=out, specialize=specialize), ""


def _known_dtype_reason(op: str, node: Node, index: int, allowed: frozenset[np.dtype], what: str) -> str:
    dt = _dtype(node.input(index))
    if dt is not None and dt not in allowed:
        return f"native {op} takes {what}, got {dt}"
    return ""


# --------------------------------------------------------------------------------------
# Clip
# --------------------------------------------------------------------------------------


def _bound(v: Any, dtype: np.dtype) -> Any:
    """A Clip bound as the twin reads it (cast to x's type), or None."""
    if v is None:
        return None
    a = np.asarray(v)
    if a.size != 1:
        raise _Unsupported  # the twin raises the operator's error
    return a.astype(dtype).reshape(()).item()


@_with_fallback("Clip")
def _clip_native(
    ctx: Any, x: Any, lo: Any = None, hi: Any = None, *, out: Any, min: Any = None, max: Any = None
):
    """Clip: y = np.minimum(np.maximum(x, lo), hi), each bound only when given (nn.clip)."""
    if ctx.opset < 11:
        lo, hi = min, max
    x = _c(x)
    lo_v, hi_v = _bound(lo, x.dtype), _bound(hi, x.dtype)
    if x.dtype == F32:
        return _native().unary_f32_ex("clip", x, _threads(ctx), out, lo_v, hi_v)
    if x.dtype in _INT_CLIP:
        return _native().clip_int(x, lo_v, hi_v, _threads(ctx), out)
    raise _Unsupported


def _clip_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Clip with bounds that are constants (or omitted): cast once."""
    dtype = sig.dtypes[0]
    if sig.shapes[0] is None or not isinstance(dtype, np.dtype):
        return None
    consts = list(sig.consts[1:3]) + [None] * (3 - len(sig.consts))
    if sig.ctx.opset < 11:
        if len(sig.shapes) > 1:
            return None
        lo_v, hi_v = _bound(attrs.get("min"), dtype), _bound(attrs.get("max"), dtype)
    else:
        for k in (1, 2):
            if k < len(sig.shapes) and sig.shapes[k] is not None and consts[k - 1] is None:
                return None  # a bound computed at run time
        try:
            lo_v, hi_v = _bound(consts[0], dtype), _bound(consts[1], dtype)
        except _Unsupported:
            return None
    threads, out = step_threads(sig), sig.out
    if dtype == F32:
        unary = _native().unary_f32_ex
        return guarded(
            lambda x, *b: unary("clip", x, threads, out, lo_v, hi_v),
            _clip_native,
            attrs,
            out,
            reads=1,
            recordable=True,
        )
    if dtype in _INT_CLIP:
        clip_int = _native().clip_int
        return guarded(lambda x, *b: clip_int(x, lo_v, hi_v, threads, out), _clip_native, attrs, out, reads=1)
    return None


@register_binder("Clip")
def bind_clip(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Clip of float32 or int8 / uint8 / int32 / int64."""
    del model  # unused: the choice depends on the node's types only
    reason = _known_dtype_reason("Clip", node, 0, _INT_CLIP | {F32}, "float32 or an 8/32/64-bit integer")
    if reason:
        return None, reason
    return _kernel(_clip_native, "clip", specialize=_clip_specialized)


# --------------------------------------------------------------------------------------
# Cast
# --------------------------------------------------------------------------------------


@_with_fallback("Cast")
def _cast_native(ctx: Any, x: Any, *, out: Any, to: int, saturate: int = 1, round_mode: str = "up"):
    """Cast between float32/64, (u)int8, int32/64 and bool: numpy's astype (math_ops.cast_to)."""
    del saturate, round_mode  # unused: they only apply to float8 / e8m0 targets (the twin's)
    x = _c(x)
    dtype = onnx_dtype(to)
    if dtype not in NATIVE_DTYPES:
        raise _Unsupported
    return _native().cast(x, dtype, _threads(ctx), out)


#: float32 <-> float16: the Casts at the edges of a float16 island computed in float32
#: (passes/rules/widen_half_islands.py)
_HALF_CASTS = frozenset({(F32, F16), (F16, F32)})


@_with_fallback("Cast")
def _cast_half(ctx: Any, x: Any, *, out: Any, to: int, saturate: int = 1, round_mode: str = "up"):
    """Cast float32 -> float16 (round to nearest even, overflow to ±inf) or float16 ->
    float32 (exact) by vcvtps2ph / vcvtph2ps: the bits of the twin's astype, NaN payloads
    as NumPy keeps them (float_ops.h "half")."""
    del saturate, round_mode  # they apply to float8 / e8m0 targets only
    dtype = onnx_dtype(to)
    if not isinstance(x, np.ndarray) or (x.dtype, dtype) not in _HALF_CASTS:
        raise _Unsupported
    return _native().cast_half(np.asarray(x, order="C"), _threads(ctx), out)


@shape_free
def _cast_half_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The binding with the thread count and the output bound."""
    if (sig.dtypes[0], onnx_dtype(attrs.get("to", -1))) not in _HALF_CASTS:
        return None
    cast_half, threads, out = _native().cast_half, step_threads(sig), sig.out
    return guarded(lambda x: cast_half(x, threads, out), _cast_half, attrs, out, recordable=True)


#: (u)int16 -> float32: the native DequantizeLinear with scale 1 and zero point 0, whose
#: f32((x − 0) · 1) is the exact float32 value of every 16-bit integer, as astype is (int16
#: audio read by a Cast: MarbleNet's input)
_WIDE_INT_CASTS = frozenset({(np.dtype(np.int16), F32), (np.dtype(np.uint16), F32)})
_UNIT_SCALE, _ZERO_POINT = np.ones(1, np.float32), np.zeros(1, np.int32)


@_with_fallback("Cast")
def _cast_wide_int(ctx: Any, x: Any, *, out: Any, to: int, saturate: int = 1, round_mode: str = "up"):
    """Cast int16 / uint16 -> float32, exact (_WIDE_INT_CASTS)."""
    del saturate, round_mode  # they apply to float8 / e8m0 targets only
    if not isinstance(x, np.ndarray) or (x.dtype, onnx_dtype(to)) not in _WIDE_INT_CASTS or x.ndim == 0:
        raise _Unsupported  # a scalar: the binding writes [1]
    x = np.ascontiguousarray(x)
    return _native().dequantize_linear(x, _UNIT_SCALE, _ZERO_POINT, 0, _threads(ctx), out)


@shape_free
def _cast_wide_int_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The binding with the unit scale, the thread count and the output bound."""
    if (sig.dtypes[0], onnx_dtype(attrs.get("to", -1))) not in _WIDE_INT_CASTS:
        return None
    dq, threads, out = _native().dequantize_linear, step_threads(sig), sig.out

    def call(x: np.ndarray) -> np.ndarray:
        if x.ndim == 0:  # the binding writes [1]: the generic kernel hands it to the twin
            raise ValueError("cast: a scalar")
        return dq(x, _UNIT_SCALE, _ZERO_POINT, 0, threads, out)

    return guarded(call, _cast_wide_int, attrs, out, recordable=True)


@register_binder("Cast")
def bind_cast(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Cast between float32/64, (u)int8, int32/64 and bool, float32 <-> float16, and
    (u)int16 -> float32."""
    del model  # unused
    try:
        dtype = onnx_dtype(node.attrs.get("to", -1))
    except Exception:
        return None, f"Cast to {node.attrs.get('to')!r} has no native kernel"
    if (_dtype(node.input(0)), dtype) in _HALF_CASTS:
        return _kernel(_cast_half, f"cast_{dtype}", specialize=_cast_half_specialized)
    if (_dtype(node.input(0)), dtype) in _WIDE_INT_CASTS:
        return _kernel(_cast_wide_int, f"cast_{dtype}", specialize=_cast_wide_int_specialized)
    if dtype not in NATIVE_DTYPES:
        return None, (
            f"native Cast writes float32/64, (u)int8, int32/64 or bool (float16 from float32 only), not {dtype}"
        )
    reason = _known_dtype_reason("Cast", node, 0, NATIVE_DTYPES, "float32/64, (u)int8, int32/64 or bool")
    if reason:
        return None, reason
    return _kernel(_cast_native, f"cast_{dtype}", specialize=_cast_specialized)


@shape_free
def _cast_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """The binding's ``cast`` with the target dtype and output bound: exported graphs
    cast every index and length (a duration net has 56 Casts among 336 steps), where the
    generic kernel's dtype lookup and checks cost as much as the copy."""
    dtype = onnx_dtype(attrs["to"])
    if sig.dtypes[0] not in NATIVE_DTYPES or dtype not in NATIVE_DTYPES:
        return None
    cast, threads, out = _native().cast, step_threads(sig), sig.out
    return guarded(lambda x: cast(x, dtype, threads, out), _cast_native, attrs, out, recordable=True)


# --------------------------------------------------------------------------------------
# unary float32: Sqrt, Neg, Abs, Reciprocal, Exp, Pow, HardSigmoid; Neg and Abs of int32 / int64
# --------------------------------------------------------------------------------------

_INT_UNARY = frozenset({np.dtype(np.int32), np.dtype(np.int64)})
_F64 = np.dtype(np.float64)


def _int_neg_abs(op: str, x: np.ndarray, threads: int, out: np.ndarray | None) -> np.ndarray:
    """np.negative / np.absolute of an int32 / int64 array: 0 − x (wrapping, so −MIN =
    MIN) and max(x, 0 − x) (|MIN| = MIN, as NumPy's), on broadcast_op."""
    n = _native()
    zero = np.zeros((), x.dtype)
    if op == "neg":
        return n.broadcast_op("sub", zero, x, threads, out)
    return n.broadcast_op("max", x, n.broadcast_op("sub", zero, x, threads), threads, out)


def _bind_unary(op_type: str, op: str) -> None:
    takes_int = op in ("neg", "abs")

    @_with_fallback(op_type)
    def run(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
        if takes_int and isinstance(x, np.ndarray) and x.dtype in _INT_UNARY:
            return _int_neg_abs(op, np.asarray(x, order="C"), _threads(ctx), out)
        if op == "neg" and isinstance(x, np.ndarray) and x.dtype == _F64:
            return _native().negate(np.asarray(x, order="C"), out)  # the sign bit flipped
        return _native().unary_f32_ex(op, _f32(x), _threads(ctx), out)

    run.__name__ = run.__qualname__ = f"_{op}_native"

    @shape_free
    def specialize(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
        if sig.dtypes != (F32,):
            return None
        unary, threads, out = _native().unary_f32_ex, step_threads(sig), sig.out
        return guarded(lambda x: unary(op, x, threads, out), run, attrs, out, recordable=True)

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        if takes_int and _dtype(node.input(0)) in _INT_UNARY:
            return _kernel(run, f"{op}_int")
        if op == "neg" and _dtype(node.input(0)) == _F64:
            return _kernel(run, "neg_f64")
        what = "float32, int32 or int64" if takes_int else "float32"
        reason = _known_dtype_reason(op_type, node, 0, frozenset({F32}), what)
        if reason:
            return None, reason
        return _kernel(run, f"{op}_f32", specialize=specialize)

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    register_binder(op_type)(binder)


for _op_type, _op in (
    ("Sqrt", "sqrt"),
    ("Neg", "neg"),
    ("Abs", "abs"),
    ("Reciprocal", "reciprocal"),
    ("HardSwish", "hard_swish"),
):
    _bind_unary(_op_type, _op)


def _bind_rounding(op_type: str, ufunc: np.ufunc) -> None:
    """Floor, Ceil, Round (half to even), Sign: NumPy's ufunc, the twin's own (math_ops),
    written into the arena: one vectorized pass, exact, for float32 and float64 (ORT's
    quantize_dynamic files of opset 10 floor a scalar per scale; tf2onnx writes Atan2 with
    two Signs)."""

    @_with_fallback(op_type)
    def run(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
        del ctx  # memory-bound: one thread
        if not isinstance(x, np.ndarray) or x.dtype not in (F32, _F64):
            raise _Unsupported
        return ufunc(x) if out is None else ufunc(x, out=out)

    run.__name__ = run.__qualname__ = f"_{op_type.lower()}_native"

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        reason = _known_dtype_reason(op_type, node, 0, frozenset({F32, _F64}), "float32 or float64")
        if reason:
            return None, reason
        return _kernel(run, op_type.lower())

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    register_binder(op_type)(binder)


for _op_type, _ufunc in (("Floor", np.floor), ("Ceil", np.ceil), ("Round", np.rint), ("Sign", np.sign)):
    _bind_rounding(_op_type, _ufunc)


@_with_fallback("Exp")
def _exp_native(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    """Exp, float32: eqs. (E1)-(E6) (math_ops.exp)."""
    return _native().exp_f32(_f32(x), _threads(ctx), out)


@register_binder("Exp")
def bind_exp(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 Exp by quanta's exp (E1)-(E6)."""
    del model  # unused
    reason = _known_dtype_reason("Exp", node, 0, frozenset({F32}), "float32")
    if reason:
        return None, reason
    return _kernel(_exp_native, "exp_f32")


_POW_OPS = {2.0: "square", 3.0: "cube", 0.5: "sqrt"}


def _pow_general(x: np.ndarray, e: float, threads: int, out: Any) -> np.ndarray:
    """x^e by (PW1)-(PW3) (float_ops.pow_f32) on the native log (LN1)-(LN6) and exp
    (E1)-(E6); the glue between them is the twin's own NumPy calls."""
    n = _native()
    y = pow_f32(x, e, lambda v: n.unary_f32("log", v, threads), lambda t: n.exp_f32(t, threads))
    if out is None:
        return y
    np.copyto(out, y)
    return out


@_with_fallback("Pow")
def _pow_native(ctx: Any, x: Any, y: Any, *, out: Any) -> np.ndarray:
    """Pow, float32 base, one exponent: 1, 2, 3 or 0.5 by math_ops.POW_EXACT_FORMS,
    another finite float32 value by (PW1)-(PW3)."""
    x = _f32(x)
    if not isinstance(y, np.ndarray) or y.ndim > x.ndim:
        raise _Unsupported
    e = pow_exponent(y)
    if e is None:
        g = pow_general_exponent(y)
        if g is None:
            raise _Unsupported
        return _pow_general(x, g, _threads(ctx), out)
    if e == 1.0:
        if out is None:
            return x.copy()
        np.copyto(out, x)
        return out
    return _native().unary_f32_ex(_POW_OPS[e], x, _threads(ctx), out)


def _pow_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Pow with a constant exponent of an exact form other than 1: the form found once."""
    y = sig.consts[1] if len(sig.consts) > 1 else None
    if sig.dtypes[0] != F32 or y is None or sig.shapes[0] is None or y.ndim > len(sig.shapes[0]):
        return None
    e = pow_exponent(y)
    if e is None or e == 1.0:
        return None
    unary, form, threads, out = _native().unary_f32_ex, _POW_OPS[e], step_threads(sig), sig.out
    return guarded(
        lambda x, *p: unary(form, x, threads, out), _pow_native, attrs, out, reads=1, recordable=True
    )


@register_binder("Pow")
def bind_pow(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 Pow with one finite float32 exponent (a constant, or checked per call)."""
    del model  # unused
    reason = _known_dtype_reason("Pow", node, 0, frozenset({F32}), "a float32 base")
    if reason:
        return None, reason
    y = node.input(1)
    if y is not None and y.const is not None:
        c = np.asarray(y.const)
        if pow_exponent(c) is None and pow_general_exponent(c) is None:
            if c.size != 1:
                got = f"an exponent of shape {list(c.shape)}"
            elif c.dtype.kind in "fiu" and not np.isfinite(float(c.reshape(()))):
                got = f"the exponent {float(c.reshape(()))}, not finite"
            else:
                got = f"the {c.dtype} exponent {c.reshape(()).item()!r}, which float32 does not hold"
            return None, (
                "native Pow takes one finite float32 exponent (the exact forms or quanta's pow "
                f"(PW1)-(PW3)); got {got}"
            )
    return _kernel(_pow_native, "pow_f32", specialize=_pow_specialized)


@_with_fallback("HardSigmoid")
def _hard_sigmoid_native(ctx: Any, x: Any, *, out: Any, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    """HardSigmoid, float32: min(max(f32(f32(alpha · x) + beta), 0), 1) (nn.hard_sigmoid;
    NumPy rounds the Python floats alpha and beta to float32 first, NEP 50)."""
    return _native().unary_f32_ex(
        "hard_sigmoid",
        _f32(x),
        _threads(ctx),
        out,
        alpha=float(np.float32(alpha)),
        beta=float(np.float32(beta)),
    )


@register_binder("HardSigmoid")
def bind_hard_sigmoid(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 HardSigmoid."""
    del model  # unused
    reason = _known_dtype_reason("HardSigmoid", node, 0, frozenset({F32}), "float32")
    if reason:
        return None, reason
    return _kernel(_hard_sigmoid_native, "hard_sigmoid_f32")


@_with_fallback("LeakyRelu")
def _leaky_relu_native(ctx: Any, x: Any, *, out: Any, alpha: float = 0.01) -> np.ndarray:
    """LeakyRelu, float32: x < 0 ? f32(x · alpha) : x (nn.leaky_relu, alpha rounded to
    float32 as the twin's ``v.dtype.type(alpha)``)."""
    return _native().unary_f32_ex("leaky_relu", _f32(x), _threads(ctx), out, alpha=float(np.float32(alpha)))


@register_binder("LeakyRelu")
def bind_leaky_relu(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 LeakyRelu (TensorFlow converters write Keras' LeakyReLU as this op)."""
    del model  # unused
    reason = _known_dtype_reason("LeakyRelu", node, 0, frozenset({F32}), "float32")
    if reason:
        return None, reason
    return _kernel(_leaky_relu_native, "leaky_relu_f32")


# --------------------------------------------------------------------------------------
# BatchNormalization (inference, float32)
# --------------------------------------------------------------------------------------


@_with_fallback("BatchNormalization")
def _batch_norm_native(
    ctx: Any,
    x: Any,
    scale: Any,
    bias: Any,
    mean: Any,
    var: Any,
    *,
    out: Any,
    epsilon: float = 1e-5,
    **attrs: Any,
) -> np.ndarray:
    """BatchNormalization, inference, float32: f32(f32(f32(f32(x − m) / d) · g) + b) per
    channel, d = f32(sqrt(f32(var + eps))): the float32 steps of
    nn_norm.batch_normalization, in its order (d computed here as the twin does)."""
    training = bool(attrs.get("training_mode", 0)) if ctx.opset >= 14 else ctx.n_outputs > 1
    x = _f32(x)
    if training or x.ndim < 2 or not attrs.get("spatial", 1):
        raise _Unsupported
    c = x.shape[1]
    params = [np.asarray(v, order="C") for v in (mean, var, scale, bias)]
    if any(v.shape != (c,) or v.dtype != F32 for v in params):
        raise _Unsupported
    m, var32, g, b = params
    d = np.sqrt(var32 + F32.type(epsilon))
    return _native().batch_norm_f32(x, m, d, g, b, _threads(ctx), out)


@register_binder("BatchNormalization")
def bind_batch_normalization(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 BatchNormalization in inference form (one output)."""
    del model  # unused
    if len([o for o in node.outputs if o is not None]) > 1:
        return None, "native BatchNormalization runs the inference form (one output)"
    reason = _known_dtype_reason("BatchNormalization", node, 0, frozenset({F32}), "float32")
    if reason:
        return None, reason
    return _kernel(_batch_norm_native, "batch_norm_f32", specialize=_batch_norm_specialized)


@shape_free
def _batch_norm_specialized(
    sig: Specialization, epsilon: float = 1e-5, **attrs: Any
) -> Callable[..., Any] | None:
    """BatchNormalization with constant statistics, scale and bias (every inference
    export): the per-channel parameters and d = f32(sqrt(f32(var + eps))) made once, as
    _batch_norm_native makes them each call; any x shape (the binding checks the channel
    count; a mismatch, a non-contiguous or training-mode call goes to the generic kernel)."""
    training = bool(attrs.get("training_mode", 0)) if getattr(sig.ctx, "opset", 0) >= 14 else False
    if (
        training
        or not attrs.get("spatial", 1)
        or sig.dtypes[0] != F32
        or any(v is None for v in sig.consts[1:5])
    ):
        return None
    scale, bias, mean, var = (np.asarray(v) for v in sig.consts[1:5])
    if any(v.ndim != 1 or v.dtype != F32 or v.shape != scale.shape for v in (scale, bias, mean, var)):
        return None
    m, g, b = (np.ascontiguousarray(v) for v in (mean, scale, bias))
    d = np.sqrt(np.ascontiguousarray(var) + F32.type(epsilon))
    bn, threads, out = _native().batch_norm_f32, step_threads(sig), sig.out
    generic_attrs = {"epsilon": epsilon, **attrs}
    return guarded(
        lambda x, *params: bn(x, m, d, g, b, threads, out),
        _batch_norm_native,
        generic_attrs,
        out,
        reads=1,
        recordable=True,
    )


# --------------------------------------------------------------------------------------
# comparisons, logic, Where
# --------------------------------------------------------------------------------------

_COMPARE = {
    "Equal": "equal",
    "Less": "less",
    "LessOrEqual": "less_equal",
    "Greater": "greater",
    "GreaterOrEqual": "greater_equal",
    "And": "and",
    "Or": "or",
    "Xor": "xor",
}
_BOOL = np.dtype(np.bool_)


def _bind_compare(op_type: str, op: str) -> None:
    logic = op in ("and", "or", "xor")

    @_with_fallback(op_type)
    def run(ctx: Any, a: Any, b: Any, *, out: Any) -> np.ndarray:
        a, b = _c(a), _c(b)
        if a.dtype != b.dtype or (logic and a.dtype != _BOOL):
            raise _Unsupported  # numpy's type promotion: the twin's
        return _native().broadcast_op(op, a, b, _threads(ctx), out)

    run.__name__ = run.__qualname__ = f"_{op}_native"

    @shape_free
    def specialize(sig: Specialization) -> Callable[..., Any] | None:
        """Both operands of one dtype the binding takes: the op, thread count and output
        bound once (a model's threshold test on one probability cost 2 us generic)."""
        a, b = sig.dtypes[0], sig.dtypes[1]
        if a is None or a != b or a not in NATIVE_DTYPES or (logic and a != _BOOL):
            return None
        # np.asarray, not np.ascontiguousarray, which makes a rank-0 constant (1,): the
        # broadcast would then refuse the rank-0 out every run and send it to the guard
        consts = [None if c is None else np.asarray(c, order="C") for c in sig.consts[:2]]
        bop, threads, out = _native().broadcast_op, step_threads(sig), sig.out
        if consts[1] is not None:
            cb = consts[1]
            return guarded(
                lambda x, *rest: bop(op, x, cb, threads, out), run, {}, out, reads=1, recordable=True
            )
        return guarded(lambda x, y, *rest: bop(op, x, y, threads, out), run, {}, out, recordable=True)

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        allowed = frozenset({_BOOL}) if logic else NATIVE_DTYPES
        for i in (0, 1):
            reason = _known_dtype_reason(op_type, node, i, allowed, "bool" if logic else "a numeric type")
            if reason:
                return None, reason
        return _kernel(run, op, specialize=specialize)

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    register_binder(op_type)(binder)


for _op_type, _op in _COMPARE.items():
    _bind_compare(_op_type, _op)

_TRUE = np.array(True)


@_with_fallback("Not")
def _not_native(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    """Not: x xor True (math_ops: np.logical_not)."""
    x = _c(x)
    if x.dtype != _BOOL:
        raise _Unsupported
    return _native().broadcast_op("xor", x, _TRUE, _threads(ctx), out)


@register_binder("Not")
def bind_not(model: Model, node: Node) -> tuple[Kernel | None, str]:
    del model  # unused
    reason = _known_dtype_reason("Not", node, 0, frozenset({_BOOL}), "bool")
    if reason:
        return None, reason
    return _kernel(_not_native, "not", specialize=_not_specialized)


@shape_free
def _not_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """x xor True with the thread count and output bound once (a mask's negation)."""
    if sig.dtypes[0] != _BOOL:
        return None
    bop, threads, out = _native().broadcast_op, step_threads(sig), sig.out
    return guarded(lambda x: bop("xor", x, _TRUE, threads, out), _not_native, attrs, out, recordable=True)


@_with_fallback("IsNaN")
def _isnan_native(ctx: Any, x: Any, *, out: Any) -> np.ndarray:
    """IsNaN: NumPy's isnan ufunc (the twin's own, math_ops: np.isnan) written into the
    arena: one vectorized pass that reads 4 bytes and writes 1 per element, where the
    C++ broadcast ops took two (x == x, then its negation): 73 -> ~40 us on a
    [1, 6, 128, 128] score tensor (PyTorch's opset-18 attention guards every Softmax
    with Where(IsNaN(p), 0, p))."""
    del ctx  # memory-bound: one thread
    x = _c(x)
    if x.dtype.kind != "f":
        raise _Unsupported
    if out is None:
        return np.isnan(x)
    return np.isnan(x, out=out)


@register_binder("IsNaN")
def bind_isnan(model: Model, node: Node) -> tuple[Kernel | None, str]:
    del model  # unused
    reason = _known_dtype_reason(
        "IsNaN", node, 0, frozenset({F32, np.dtype(np.float64)}), "float32 or float64"
    )
    if reason:
        return None, reason
    return _kernel(_isnan_native, "isnan")


@_with_fallback("IsInf")
def _isinf_native(
    ctx: Any, x: Any, *, out: Any, detect_negative: int = 1, detect_positive: int = 1
) -> np.ndarray:
    """IsInf: one NumPy test into the arena (math_ops.isinf ORs the sign tests into a
    fresh array). torch's dynamo exporter writes ``nan_to_num`` as IsInf / IsNaN /
    Where over whole inputs, so a float model meets it on every run."""
    del ctx  # memory-bound: one thread
    x = _c(x)
    if x.dtype.kind != "f":
        raise _Unsupported
    if out is None:
        out = np.empty(x.shape, _BOOL)
    if detect_positive and detect_negative:
        return np.isinf(x, out=out)
    if detect_positive:
        return np.isposinf(x, out=out)
    if detect_negative:
        return np.isneginf(x, out=out)
    out[...] = False
    return out


@register_binder("IsInf")
def bind_isinf(model: Model, node: Node) -> tuple[Kernel | None, str]:
    del model  # unused
    reason = _known_dtype_reason(
        "IsInf", node, 0, frozenset({F32, np.dtype(np.float64)}), "float32 or float64"
    )
    if reason:
        return None, reason
    return _kernel(_isinf_native, "isinf")


@_with_fallback("Where")
def _where_native(ctx: Any, cond: Any, x: Any, y: Any, *, out: Any) -> np.ndarray:
    """Where: y broadcast to the output, then x where cond (math_ops.where; np.copyto
    with ``where=`` moves elements, it computes nothing)."""
    cond, x, y = _c(cond), _c(x), _c(y)
    if cond.dtype != _BOOL or x.dtype != y.dtype:
        raise _Unsupported
    try:
        shape = np.broadcast_shapes(cond.shape, x.shape, y.shape)
    except ValueError:
        raise _Unsupported from None
    if out is None:
        out = np.empty(shape, x.dtype)
    elif out.shape != shape:
        raise _Unsupported
    t = _threads(ctx)
    _native().copy_strided(np.broadcast_to(y, shape), t, out)
    np.copyto(out, x, where=cond)
    return out


def _where_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Known shapes: the broadcast shape and the thread count found once, the two moves
    of ``_where_native`` per call (an attention mask's Where spent most of its time in
    the checks)."""
    del attrs  # Where has none
    if len(sig.shapes) != 3 or any(sh is None for sh in sig.shapes):
        return None
    if sig.dtypes[0] != _BOOL or sig.dtypes[1] not in NATIVE_DTYPES or sig.dtypes[1] != sig.dtypes[2]:
        return None
    try:
        shape = np.broadcast_shapes(*sig.shapes)  # type: ignore[arg-type]
    except ValueError:
        return None
    out, threads, dtype = sig.out, step_threads(sig), sig.dtypes[1]
    copy = _native().copy_strided

    def call(cond: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
        o = np.empty(shape, dtype) if out is None else out
        copy(np.broadcast_to(y, shape), threads, o)
        np.copyto(o, x, where=cond)
        return o

    return guarded(call, _where_native, {}, out)


@register_binder("Where")
def bind_where(model: Model, node: Node) -> tuple[Kernel | None, str]:
    del model  # unused
    reason = _known_dtype_reason("Where", node, 0, frozenset({_BOOL}), "a bool condition")
    if reason:
        return None, reason
    return _kernel(_where_native, "where", specialize=_where_specialized)


# --------------------------------------------------------------------------------------
# data movement: Gather, Transpose, Slice, Expand (C++ copies); Concat, Split, Tile,
# Shape, Size, Constant (one NumPy call or a precomputed value, module docstring)
# --------------------------------------------------------------------------------------


def _copy_view(ctx: Any, view: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``view`` (any strides) copied into ``out`` or a new C-contiguous array by copy_strided."""
    if view.dtype.kind == "O":  # strings: Python objects, not bytes to move
        if out is None:
            return np.ascontiguousarray(view)
        np.copyto(out, view)
        return out
    return _native().copy_strided(view, _threads(ctx), out)


@_with_fallback("Gather")
def _gather_native(ctx: Any, data: Any, indices: Any, *, out: Any, axis: int = 0) -> np.ndarray:
    """Gather: np.take along axis (tensor_ops.gather) by take_axis (rows of whole bytes)."""
    if not isinstance(data, np.ndarray) or data.ndim == 0 or data.dtype.kind == "O":
        raise _Unsupported
    if not -data.ndim <= axis < data.ndim:
        raise _Unsupported
    axis %= data.ndim
    idx = _indices(np.asarray(indices), data.shape[axis], "Gather")  # raises the twin's error
    flat = np.ascontiguousarray(idx, np.int64).reshape(-1)
    shape = data.shape[:axis] + idx.shape + data.shape[axis + 1 :]
    x = np.asarray(data, order="C")
    if out is not None:
        _native().take_axis(
            x,
            axis,
            flat,
            _threads(ctx),
            out.reshape((*data.shape[:axis], flat.size, *data.shape[axis + 1 :])),
        )
        return out
    return _native().take_axis(x, axis, flat, _threads(ctx)).reshape(shape)


def _gather_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Gather with constant indices: checked and flattened once; with indices computed
    at run time (an embedding lookup of token ids), int64 of a known shape: the output
    shape found once, the indices' bounds checked by take_axis (which counts a negative
    index from the end), whose ValueError (an index out of range) hands the call to the
    generic kernel, which raises the operator's error."""
    shape, indices = sig.shapes[0], sig.consts[1]
    if shape is None or not shape:
        return None
    axis = attrs.get("axis", 0)
    if not -len(shape) <= axis < len(shape):
        return None
    axis %= len(shape)
    if sig.dtypes[0].kind == "O":
        return _gather_objects(axis, attrs) if sig.out is None else None
    if indices is None:
        return _gather_by_ids(sig, shape, axis, attrs)
    idx = _indices(np.asarray(indices), shape[axis], "Gather")
    flat = np.ascontiguousarray(idx, np.int64).reshape(-1)
    out_shape = shape[:axis] + idx.shape + shape[axis + 1 :]
    take, threads, out = _native().take_axis, step_threads(sig), sig.out
    if out is not None:
        target = out.reshape((*shape[:axis], flat.size, *shape[axis + 1 :]))

        def call(data: Any, *i: Any) -> Any:
            take(data, axis, flat, threads, target)
            return out
    else:

        def call(data: Any, *i: Any) -> Any:
            return take(data, axis, flat, threads).reshape(out_shape)

    # constant indices: the bounds take_axis checks when a program records the call hold
    # on every run
    return guarded(call, _gather_native, attrs, out, recordable=True)


def _gather_objects(axis: int, attrs: dict[str, Any]) -> Callable[..., Any]:
    """Gather from a table of Python objects (a g2p model's phoneme strings): np.take, the
    twin's own call (a negative index counts from the end in both); an index out of range
    hands the call to the generic kernel, which raises the operator's error."""

    def call(data: Any, ids: Any) -> Any:
        try:
            return np.take(data, ids, axis=axis)
        except IndexError as e:
            raise ValueError(str(e)) from e

    return guarded(call, _gather_native, attrs, None)


def _gather_by_ids(
    sig: Specialization, shape: tuple[int, ...], axis: int, attrs: dict[str, Any]
) -> Callable[..., Any] | None:
    """:func:`_gather_specialized` for indices that are not constant (int64, or int32 as
    Keras and Paddle exports cast token ids: take_axis widens them)."""
    id_shape = sig.shapes[1]
    if id_shape is None or sig.dtypes[1] not in (np.int64, np.int32):
        return None
    count = math.prod(id_shape)
    out_shape = shape[:axis] + tuple(id_shape) + shape[axis + 1 :]
    take, threads, out = _native().take_axis, step_threads(sig), sig.out
    if out is not None:
        target = out.reshape((*shape[:axis], count, *shape[axis + 1 :]))

        def call(data: Any, ids: Any) -> Any:
            take(data, axis, ids.reshape(-1), threads, target)
            return out
    else:

        def call(data: Any, ids: Any) -> Any:
            return take(data, axis, ids.reshape(-1), threads).reshape(out_shape)

    return guarded(call, _gather_native, attrs, out)


@register_binder("Gather")
def bind_gather(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Gather of any fixed-size dtype."""
    del model  # unused
    return _kernel(_gather_native, "gather", specialize=_gather_specialized)


@_with_fallback("Transpose")
def _transpose_any(ctx: Any, data: Any, *, out: Any = None, perm: list | None = None) -> np.ndarray:
    """Transpose of any rank and perm: the transposed view copied by copy_strided
    (tensor_ops.transpose returns the same contiguous bytes); a bad perm goes to the twin,
    which raises the operator's error."""
    if not isinstance(data, np.ndarray):
        raise _Unsupported
    p = list(range(data.ndim))[::-1] if perm is None else [int(v) for v in perm]
    if sorted(p) != list(range(data.ndim)):
        raise _Unsupported
    return _copy_view(ctx, np.transpose(data, p), out)


def _transpose_any_specialized(sig: Specialization, *, perm: list | None = None) -> Callable[..., Any] | None:
    """The copy of one input shape's transposed view (an attention's [1, T, 3, H, D] ->
    [3, 1, H, T, D]): the perm checked and the thread count found once, the view copied
    by copy_strided into the planned output."""
    shape = sig.shapes[0]
    if shape is None or sig.dtypes[0].kind == "O":
        return None
    p = list(range(len(shape)))[::-1] if perm is None else [int(v) for v in perm]
    if sorted(p) != list(range(len(shape))):
        return None
    axes, copy, threads, out = tuple(p), _native().copy_strided, step_threads(sig), sig.out

    def call(x: np.ndarray) -> np.ndarray:
        return copy(x.transpose(axes), threads, out)

    return guarded(call, _transpose_any, {"perm": perm}, out, recordable=True)


def _depth_space_view(x: np.ndarray, b: int, mode: str, to_space: bool) -> tuple[np.ndarray, tuple[int, ...]]:
    """The twin's reshape and transpose (nn.depth_to_space / nn.space_to_depth) as a view,
    and the output shape; _Unsupported where the twin raises its error."""
    if x.ndim != 4 or x.dtype.kind == "O" or b < 1 or mode not in ("DCR", "CRD"):
        raise _Unsupported
    n, c, h, w = x.shape
    if to_space:
        if c % (b * b):
            raise _Unsupported
        cq = c // (b * b)
        if mode == "DCR":
            view = x.reshape(n, b, b, cq, h, w).transpose(0, 3, 4, 1, 5, 2)
        else:
            view = x.reshape(n, cq, b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
        return view, (n, cq, h * b, w * b)
    if h % b or w % b:
        raise _Unsupported
    t = x.reshape(n, c, h // b, b, w // b, b)
    view = t.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else t.transpose(0, 1, 3, 5, 2, 4)
    return view, (n, c * b * b, h // b, w // b)


def _depth_space_kernel(op_type: str, to_space: bool) -> Callable[..., Any]:
    @_with_fallback(op_type)
    def run(ctx: Any, x: Any, *, out: Any, blocksize: int, mode: str = "DCR") -> np.ndarray:
        if not isinstance(x, np.ndarray):
            raise _Unsupported
        view, shape = _depth_space_view(np.asarray(x, order="C"), int(blocksize), mode, to_space)
        if out is not None:
            if not out.flags.c_contiguous:  # a reshape would copy: the bytes must land in out
                raise _Unsupported
            _copy_view(ctx, view, out.reshape(view.shape))
            return out
        return _copy_view(ctx, view, None).reshape(shape)

    run.__name__ = run.__qualname__ = f"_{op_type.lower()}_native"
    run.__doc__ = (
        f"{op_type}: the twin's transposed view copied by copy_strided (bytes moved, none computed)."
    )
    return run


_depth_to_space_native = _depth_space_kernel("DepthToSpace", True)
_space_to_depth_native = _depth_space_kernel("SpaceToDepth", False)


@register_binder("DepthToSpace")
def bind_depth_to_space(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """DepthToSpace of any element type (PP-OCR's and SegFormer-style detectors' upsampling heads)."""
    del model, node  # unused: every input the twin takes
    return _kernel(_depth_to_space_native, "depth_to_space")


@register_binder("SpaceToDepth")
def bind_space_to_depth(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """SpaceToDepth of any element type."""
    del model, node  # unused: every input the twin takes
    return _kernel(_space_to_depth_native, "space_to_depth")


@_with_fallback("Slice")
def _slice_native(
    ctx: Any,
    data: Any,
    starts: Any,
    ends: Any,
    axes: Any = None,
    steps: Any = None,
    *,
    out: Any,
    plans: BoundedCache,
) -> np.ndarray:
    """Slice: the twin's view (tensor_ops.slice_, bounds per input shape cached) copied by
    copy_strided."""
    if not isinstance(data, np.ndarray):
        raise _Unsupported
    index = _plain_slice_index(data.shape, starts, ends, axes, steps)
    if index is None:
        key = (data.shape, _key(starts), _key(ends), _key(axes), _key(steps))
        index = plans.get(key, lambda: _slice_index(data.shape, starts, ends, axes, steps))
    return _copy_view(ctx, data[index], out)


def _int_list(v: Any) -> list[int] | None:
    """A 1-D integer array's values (``tolist``: no per-element conversion), else None."""
    if isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "iu":
        return v.tolist()
    return None


def _plain_slice_index(
    shape: tuple[int, ...], starts: Any, ends: Any, axes: Any, steps: Any
) -> tuple[slice, ...] | None:
    """The index tuple of a Slice whose bounds are 1-D integer arrays of one length, with
    distinct axes in range and non-zero steps (tensor_ops.slice_'s, by slice_bounds), or
    None for anything else (the checked path then builds it, or raises the twin's error).
    A Slice whose bounds change every call (a decoder Loop reading step i, a duration net's
    frames) pays this, not a probe array and the twin's checks (~17 µs)."""
    s, e = _int_list(starts), _int_list(ends)
    if s is None or e is None or len(s) != len(e):
        return None
    rank = len(shape)
    if axes is None:
        a = list(range(len(s)))
    else:
        a = _int_list(axes)
        if a is None or len(a) != len(s):
            return None
    if steps is None:
        st = [1] * len(s)
    else:
        st = _int_list(steps)
        if st is None or len(st) != len(s):
            return None
    index = [slice(None)] * rank
    seen = set()
    for start, end, axis, step in zip(s, e, a, st):
        if not -rank <= axis < rank or step == 0:
            return None
        ax = axis % rank
        if ax in seen:
            return None
        seen.add(ax)
        index[ax] = slice_bounds(start, end, step, shape[ax])
    return tuple(index)


def _key(v: Any) -> Any:
    return None if v is None else tuple(int(i) for i in np.asarray(v).ravel())


def _slice_index(shape: tuple[int, ...], starts: Any, ends: Any, axes: Any, steps: Any) -> tuple[slice, ...]:
    """The index tuple tensor_ops.slice_ builds (it raises on bad arguments first)."""
    from quanta.kernels.reference.tensor_ops import slice_

    probe = np.empty(shape, np.uint8)  # checks starts / ends / axes / steps as the twin does
    slice_(None, probe, starts, ends, axes, steps)
    s, e = _key(starts), _key(ends)
    a = list(_key(axes)) if axes is not None else list(range(len(s)))
    st = list(_key(steps)) if steps is not None else [1] * len(s)
    index = [slice(None)] * len(shape)
    for start, end, axis, step in zip(s, e, a, st):
        ax = axis % len(shape)
        index[ax] = slice_bounds(start, end, step, shape[ax])
    return tuple(index)


@_with_fallback("GatherND")
def _gather_nd_native(ctx: Any, data: Any, indices: Any, *, out: Any, batch_dims: int = 0) -> np.ndarray:
    """GatherND: the index tuples become row numbers of ``data`` seen as [rows, slice]
    (batch b, coordinates c: row = (b·D_b + c_0)·D_1 + c_1 ..., int64 arithmetic on the
    indices only) and take_axis copies those rows (tensor_ops.gather_nd's elements)."""
    if not isinstance(data, np.ndarray) or data.dtype.kind == "O" or not isinstance(indices, np.ndarray):
        raise _Unsupported
    b = int(batch_dims)
    if indices.ndim < 1 or b < 0 or b >= indices.ndim:
        raise _Unsupported
    m = indices.shape[-1]
    if data.shape[:b] != indices.shape[:b] or b + m > data.ndim:
        raise _Unsupported  # the twin raises the operator's error
    batch = math.prod(data.shape[:b])
    idx = np.asarray(indices, np.int64).reshape(batch, -1, m)
    rows = np.arange(batch, dtype=np.int64)[:, None]
    for k in range(m):
        rows = rows * data.shape[b + k] + _indices(idx[..., k], data.shape[b + k], "GatherND")
    inner = data.shape[b + m :]
    flat = np.ascontiguousarray(data).reshape(batch * math.prod(data.shape[b : b + m]), *inner)
    shape = indices.shape[:-1] + inner
    rows = rows.reshape(-1)
    if out is not None:
        _native().take_axis(flat, 0, rows, _threads(ctx), out.reshape(rows.size, *inner))
        return out
    return _native().take_axis(flat, 0, rows, _threads(ctx)).reshape(shape)


def _gather_nd_specialized(sig: Specialization, *, batch_dims: int = 0) -> Callable[..., Any] | None:
    """Indices the same on every run (a mask's coordinates computed from shapes): the row
    numbers of ``_gather_nd_native`` found once, a run is the one take_axis copy."""
    shape, idx_c = sig.shapes[0], sig.consts[1] if len(sig.consts) > 1 else None
    if shape is None or idx_c is None or sig.dtypes[0] is None or sig.dtypes[0].kind == "O":
        return None
    b = int(batch_dims)
    if idx_c.ndim < 1 or b < 0 or b >= idx_c.ndim:
        return None
    m = idx_c.shape[-1]
    if tuple(shape[:b]) != idx_c.shape[:b] or b + m > len(shape):
        return None
    batch = math.prod(shape[:b])
    idx = np.asarray(idx_c, np.int64).reshape(batch, -1, m)
    rows = np.arange(batch, dtype=np.int64)[:, None]
    try:
        for k in range(m):
            rows = rows * shape[b + k] + _indices(idx[..., k], shape[b + k], "GatherND")
    except Exception:
        return None  # the generic kernel raises the operator's error on every run
    rows = np.ascontiguousarray(rows.reshape(-1))
    inner = tuple(shape[b + m :])
    flat_shape = (batch * math.prod(shape[b : b + m]), *inner)
    y_shape = idx_c.shape[:-1] + inner
    out, threads = sig.out, step_threads(sig)
    out_rows = None if out is None else out.reshape(rows.size, *inner)
    take = _native().take_axis

    def call(data: np.ndarray, *rest: Any) -> np.ndarray:
        flat = data.reshape(flat_shape)
        if out_rows is not None:
            take(flat, 0, rows, threads, out_rows)
            return out
        return take(flat, 0, rows, threads).reshape(y_shape)

    return guarded(call, _gather_nd_native, {"batch_dims": batch_dims}, out, reads=1)


@register_binder("GatherND")
def bind_gather_nd(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """GatherND of any fixed-size dtype, any batch_dims."""
    del model  # unused
    return _kernel(_gather_nd_native, "gather_nd", specialize=_gather_nd_specialized)


def _slice_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Slice with constant bounds (inputs, or Slice-1's attributes): the index tuple built once."""
    shape = sig.shapes[0]
    if shape is None or sig.dtypes[0].kind == "O":
        return None
    if "starts" in attrs:
        index = _slice_index(shape, attrs["starts"], attrs.get("ends"), attrs.get("axes"), None)
        copy, threads, out = _native().copy_strided, step_threads(sig), sig.out
        return guarded(
            lambda data: copy(data[index], threads, out), _slice_native, attrs, out, recordable=True
        )
    bounds = list(sig.consts[1:]) + [None] * (5 - len(sig.consts))
    for k in range(1, 5):
        if k < len(sig.shapes) and sig.shapes[k] is not None and bounds[k - 1] is None:
            return None
    index = _slice_index(shape, *bounds)
    copy, threads, out = _native().copy_strided, step_threads(sig), sig.out
    return guarded(
        lambda data, *b: copy(data[index], threads, out), _slice_native, attrs, out, reads=1, recordable=True
    )


@register_binder("Slice")
def bind_slice(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Slice of any dtype, its bounds as inputs (opset >= 10) or attributes (Slice-1, which
    the kernel takes as keyword arguments of the same names)."""
    del model  # unused
    if "starts" in node.attrs and "ends" not in node.attrs:
        return None, "Slice-1 without ends (the twin raises)"
    return _kernel(_slice_native, "slice", plans=BoundedCache(), specialize=_slice_specialized)


@_with_fallback("Expand")
def _expand_native(ctx: Any, x: Any, shape: Any, *, out: Any) -> np.ndarray:
    """Expand: the broadcast view copied by copy_strided (tensor_ops.expand)."""
    if not isinstance(x, np.ndarray):
        raise _Unsupported
    target = _expanded_shape(x.shape, shape)
    if target is None:
        try:
            target = np.broadcast_shapes(x.shape, tuple(int(v) for v in np.asarray(shape).ravel()))
        except ValueError:
            raise _Unsupported from None
    elif math.prod(target) < SMALL_WORK and x.dtype.kind != "O":
        # a small result: np.copyto broadcasts in C (np.broadcast_to builds its view in
        # Python, ~4 µs); the same elements either way
        y = np.empty(target, x.dtype) if out is None else out
        np.copyto(y, x)
        return y
    return _copy_view(ctx, np.broadcast_to(x, target), out)


def _expanded_shape(have: tuple[int, ...], shape: Any) -> tuple[int, ...] | None:
    """np.broadcast_shapes(have, shape) for a 1-D integer ``shape`` of non-negative sizes
    (numpy's rule, written out: np.broadcast_shapes costs ~5 µs a call, a run-time
    Expand's whole budget), else None (the checked path, which raises on a mismatch)."""
    want = _int_list(shape)
    if want is None:
        return None
    n = max(len(have), len(want))
    a = (1,) * (n - len(have)) + tuple(have)
    b = [1] * (n - len(want)) + want
    out = []
    for p, q in zip(a, b):
        if q < 0:
            return None
        if p == q or q == 1:
            out.append(p)
        elif p == 1:
            out.append(q)
        else:
            return None
    return tuple(out)


def _expand_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """A shape operand fixed for the signature (a constant, or computed from shapes):
    the broadcast shape found once (a grouped-query attention's key and value repeats
    spent most of their time finding it); the copy per call."""
    del attrs  # Expand has none
    shape, wanted = sig.shapes[0], sig.consts[1] if len(sig.consts) > 1 else None
    if shape is None or wanted is None or sig.dtypes[0] is None or sig.dtypes[0].kind == "O":
        return None
    try:
        target = np.broadcast_shapes(shape, tuple(int(v) for v in np.asarray(wanted).ravel()))
    except ValueError:
        return None  # the generic kernel raises the operator's error
    out, threads = sig.out, step_threads(sig)
    copy, broadcast = _native().copy_strided, np.broadcast_to

    def call(x: np.ndarray, _shape: Any = None) -> np.ndarray:
        return copy(broadcast(x, target), threads, out)

    return guarded(call, _expand_native, {}, out, reads=1, recordable=True)


@register_binder("Expand")
def bind_expand(model: Model, node: Node) -> tuple[Kernel | None, str]:
    del model  # unused
    return _kernel(_expand_native, "expand", specialize=_expand_specialized)


class _PadPlan:
    """One Pad call's copy pattern for an input shape (nn.pad): ``index`` is the crop of
    x (negative pads) as a view; constant mode fills ``shape`` and copies that view into
    ``inner``; reflect, edge and wrap gather along each padded or cropped axis by the index
    vector ``np.pad(np.arange(n), widths, mode)`` shifted by the crop (the twin's own
    np.pad applied to positions; np.pad pads axis by axis, each axis an index map of the
    one before, so the gathers compose)."""

    def __init__(self, shape: tuple[int, ...], pads: list[int], axes: list[int] | None, mode: str) -> None:
        rank = len(shape)
        axis_list = list(range(rank)) if axes is None else [int(a) % rank for a in axes]
        if len(pads) != 2 * len(axis_list) or len(set(axis_list)) != len(axis_list):
            raise _Unsupported  # the twin raises the operator's error
        begin, end = [0] * rank, [0] * rank
        for i, a in enumerate(axis_list):
            begin[a], end[a] = pads[i], pads[len(axis_list) + i]
        lo = [max(-b, 0) for b in begin]
        hi = [n - max(-e, 0) for n, e in zip(shape, end)]
        if any(h < lo_ for lo_, h in zip(lo, hi)):
            raise _Unsupported  # cropped below zero: the twin's error
        widths = [(max(b, 0), max(e, 0)) for b, e in zip(begin, end)]
        self.index = tuple(slice(a, b) for a, b in zip(lo, hi))
        self.shape = tuple(h - a + w0 + w1 for a, h, (w0, w1) in zip(lo, hi, widths))
        self.inner = tuple(slice(w0, w0 + h - a) for a, h, (w0, _) in zip(lo, hi, widths))
        self.constant = mode == "constant"
        self.crops = any(a > 0 or h < n for a, h, n in zip(lo, hi, shape))
        # constant mode fills the border only: two slabs per padded axis (corners twice)
        self.border = [
            tuple(slice(None) if b != a else part for b in range(rank))
            for a, (w0, w1) in enumerate(widths)
            for part in (slice(0, w0), slice(self.shape[a] - w1, self.shape[a]))
            if part.stop > part.start
        ]
        self.gathers: list[tuple[int, np.ndarray]] = []
        if not self.constant:
            cropped = [h - a for a, h in zip(lo, hi)]
            if any(n == 0 for n in cropped) and any(w != (0, 0) for w in widths):
                raise _Unsupported  # the twin's error: nothing to reflect
            for a in range(rank):
                if widths[a] != (0, 0) or cropped[a] != shape[a]:
                    idx = np.pad(np.arange(cropped[a], dtype=np.int64), widths[a], mode=mode) + lo[a]
                    self.gathers.append((a, idx))

    def run(self, ctx: Any, x: np.ndarray, fill: Any, out: np.ndarray | None) -> np.ndarray:
        if self.constant:
            y = np.empty(self.shape, x.dtype) if out is None else out
            for slab in self.border:
                y[slab] = fill
            np.copyto(y[self.inner] if self.border else y, x[self.index] if self.crops else x)
            return y
        if not self.gathers:
            return _copy_view(ctx, x, out)
        take, t = _native().take_axis, _threads(ctx)
        y = np.asarray(x, order="C")
        for k, (axis, idx) in enumerate(self.gathers):
            y = take(y, axis, idx, t, out if k == len(self.gathers) - 1 else None)
        return y


_PAD_MODES = ("constant", "reflect", "edge", "wrap")


@_with_fallback("Pad")
def _pad_native(
    ctx: Any,
    x: Any,
    pads_in: Any = None,
    constant_value: Any = None,
    axes_in: Any = None,
    *,
    out: Any,
    plans: BoundedCache,
    mode: str = "constant",
    pads: list[int] | None = None,
    paddings: list[int] | None = None,
    value: float = 0.0,
) -> np.ndarray:
    """Pad (nn.pad): constant mode one fill and one copy of the cropped x (NumPy's own C
    loops, module docstring); reflect, edge and wrap one take_axis per padded axis. Pads
    as inputs (opset >= 11) or attributes, negative pads (crops), any axes."""
    if not isinstance(x, np.ndarray) or x.dtype.kind == "O" or x.ndim == 0 or mode not in _PAD_MODES:
        raise _Unsupported
    if ctx.opset < 11:
        pad_list, fill, axes = list(pads if pads is not None else paddings or []), value, None
    else:
        if pads_in is None:
            raise _Unsupported  # the twin's error
        pad_list = [int(p) for p in np.asarray(pads_in).reshape(-1)]
        fill = 0 if constant_value is None or np.size(constant_value) == 0 else constant_value
        axes = None if axes_in is None else [int(a) for a in np.asarray(axes_in).reshape(-1)]
    key = (x.shape, tuple(pad_list), None if axes is None else tuple(axes), mode)
    plan = plans.get(key, lambda: _PadPlan(x.shape, pad_list, axes, mode))
    fill_value = np.asarray(fill).astype(x.dtype).reshape(()) if mode == "constant" else None
    return plan.run(ctx, x, fill_value, out)


def _pad_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Pad with constant pads, fill and axes (opset >= 11): the plan and the fill value
    built once."""
    shape, dtype, mode = sig.shapes[0], sig.dtypes[0], attrs.get("mode", "constant")
    if sig.ctx is None or sig.ctx.opset < 11 or shape is None or dtype is None or dtype.kind == "O":
        return None
    if not shape or mode not in _PAD_MODES or len(sig.consts) < 2 or sig.consts[1] is None:
        return None
    for k in (2, 3):  # constant_value and axes: constants or omitted
        if k < len(sig.shapes) and sig.shapes[k] is not None and sig.consts[k] is None:
            return None
    fill_c = sig.consts[2] if len(sig.consts) > 2 else None
    axes_c = sig.consts[3] if len(sig.consts) > 3 else None
    try:
        plan = _PadPlan(
            shape,
            [int(p) for p in np.asarray(sig.consts[1]).reshape(-1)],
            None if axes_c is None else [int(a) for a in np.asarray(axes_c).reshape(-1)],
            mode,
        )
    except _Unsupported:
        return None  # the generic kernel hands the call to the twin, which raises
    if sig.out_shape is not None and tuple(sig.out_shape) != plan.shape:
        return None
    fill = np.asarray(0 if fill_c is None or np.size(fill_c) == 0 else fill_c).astype(dtype).reshape(())
    ctx, out = sig.ctx, sig.out
    return guarded(lambda x, *rest: plan.run(ctx, x, fill, out), _pad_native, attrs, out, reads=1)


@register_binder("Pad")
def bind_pad(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Pad of any fixed-size dtype, every mode (silero-vad's reflect padding, the zero
    padding TensorFlow and PyTorch exports write before a convolution that does not absorb it)."""
    del model, node  # unused: every input the twin takes
    return _kernel(_pad_native, "pad", plans=BoundedCache(), specialize=_pad_specialized)


#: data types of ScatterElements with reduction none: those the native scatter_nd takes
_ASSIGNABLE: frozenset[np.dtype] = frozenset(
    np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64)
)


def _scatter_base(data_shape: tuple[int, ...], shape: tuple[int, ...], axis: int) -> np.ndarray:
    """The flat position in data of every update's own coordinates with the one along
    ``axis`` set to 0 (int64, C order): (SC1)'s p_i is this plus index_i · stride(axis)."""
    where = list(np.indices(shape, sparse=True))
    where[axis] = np.zeros((1,) * len(shape), np.int64)
    grids = tuple(np.broadcast_to(w, shape) for w in where)
    return np.ravel_multi_index(grids, data_shape).astype(np.int64).reshape(-1)


@_with_fallback("ScatterElements")
def _scatter_elements_native(
    ctx: Any,
    data: Any,
    indices: Any,
    updates: Any,
    *,
    out: Any,
    plans: BoundedCache,
    axis: int = 0,
    reduction: str = "none",
) -> np.ndarray:
    """ScatterElements (tensor_ops.scatter_elements): the twin's target positions
    (scatter_positions) as a base per shape, cached, plus index · stride; then, for
    float32 reduction add / mul, one in-order scatter_f32 into a copy of data ((SC1)),
    and for reduction none (the step buffers a decoder Loop writes into, as Paddle2ONNX
    exports SLANet's), the native ScatterND over the flat data with the positions as
    rows: applied in index order, so of duplicate positions the last update wins, as in
    the twin's fancy assignment (float32/64, int32/64)."""
    del ctx  # unused: one thread (scatter.h says why)
    if reduction not in ("add", "mul", "none", "max", "min") or not all(
        isinstance(v, np.ndarray) for v in (data, indices, updates)
    ):
        raise _Unsupported
    types = (F32,) if reduction in ("add", "mul") else _ASSIGNABLE
    if (
        data.dtype not in types
        or updates.dtype != data.dtype
        or indices.dtype.kind not in "iu"
        or indices.size == 0
    ):
        raise _Unsupported
    if data.ndim == 0 or indices.ndim != data.ndim or indices.shape != updates.shape:
        raise _Unsupported  # the twin raises the operator's error
    if not -data.ndim <= axis < data.ndim:
        raise _Unsupported
    axis %= data.ndim
    n = data.shape[axis]
    lo, hi = int(indices.min()), int(indices.max())
    if (
        lo < -n
        or hi >= n
        or any(s > d for a, (s, d) in enumerate(zip(indices.shape, data.shape)) if a != axis)
    ):
        raise _Unsupported  # an index or a coordinate outside data: the twin's error
    idx = indices.astype(np.int64, copy=False).reshape(-1)
    if lo < 0:
        idx = np.where(idx < 0, idx + n, idx)
    base = plans.get(
        (data.shape, indices.shape, axis), lambda: _scatter_base(data.shape, indices.shape, axis)
    )
    positions = idx * math.prod(data.shape[axis + 1 :])
    positions += base
    if reduction == "none":
        flat_out = out.reshape(-1) if out is not None and out.flags.c_contiguous else None
        y_flat = _native().scatter_nd(
            np.ascontiguousarray(data).reshape(-1),
            positions[:, None],
            np.ascontiguousarray(updates).reshape(-1),
            "none",
            flat_out,
        )
        if flat_out is not None:
            return out
        y_none = np.asarray(y_flat).reshape(data.shape)
        if out is not None:
            np.copyto(out, y_none)
            return out
        return y_none
    y = np.array(data, order="C") if out is None or not out.flags.c_contiguous else out
    if y is out:
        np.copyto(out, data)
    if reduction in ("max", "min"):
        # ufunc.at applies the updates one at a time in the positions' order (the
        # indices' C order), as the twin's ufunc.at over the same coordinates does;
        # max / min round nothing, so the result is the twin's bit for bit
        _MAX_MIN[reduction].at(y.reshape(-1), positions, np.ascontiguousarray(updates).reshape(-1))
    else:
        _native().scatter_f32(reduction, y, positions, np.ascontiguousarray(updates).reshape(-1))
    if out is not None and y is not out:
        np.copyto(out, y)
        return out
    return y


_MAX_MIN = {"max": np.maximum, "min": np.minimum}


@register_binder("ScatterElements")
def bind_scatter_elements(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """ScatterElements: float32 with reduction add or mul (a GNN's edge-to-node sums);
    float32/64 or int32/64 with reduction none (a decoder Loop's per-step writes) or max /
    min (a GNN's max aggregation, MiniMol's torch.scatter_reduce)."""
    del model  # unused
    reduction = node.attrs.get("reduction", "none")
    if reduction not in ("add", "mul", "none", "max", "min"):
        return None, f"native ScatterElements takes reduction none, add, mul, max or min, got {reduction!r}"
    if reduction in ("none", "max", "min"):
        reason = _known_dtype_reason(
            "ScatterElements", node, 0, _ASSIGNABLE, f"float32/64 or int32/64 data with reduction {reduction}"
        )
    else:
        reason = _known_dtype_reason("ScatterElements", node, 0, frozenset({F32}), "float32 data")
    if reason:
        return None, reason
    return _kernel(_scatter_elements_native, "scatter_f32", plans=BoundedCache())


@_with_fallback("Concat")
def _concat_native(ctx: Any, *inputs: Any, out: Any, axis: int | None = None) -> np.ndarray:
    """Concat: one np.concatenate into ``out`` (pure data movement, module docstring)."""
    del ctx  # unused: one memcpy per input run
    if axis is None or not inputs or not all(isinstance(a, np.ndarray) for a in inputs):
        raise _Unsupported
    rank = inputs[0].ndim
    if not -rank <= axis < rank:
        raise _Unsupported
    return np.concatenate(inputs, axis=axis % rank, out=out)


def _concat_specialized(sig: Specialization, *, axis: int | None = None) -> Callable[..., Any] | None:
    """Concat of one signature: the axis normalized once, np.concatenate called directly
    (the generic step's wrapper, checks and keyword dict were ~1.5 us around a ~1 us copy
    of an LSTM state's two rows)."""
    shapes = sig.shapes
    if axis is None or not shapes or any(sh is None for sh in shapes):
        return None
    rank = len(shapes[0])  # type: ignore[arg-type]
    if not -rank <= axis < rank:
        return None
    ax, out, cat = axis % rank, sig.out, np.concatenate
    if out is None:

        def call(*inputs: Any) -> np.ndarray:
            return cat(inputs, ax)

        return guarded(call, _concat_native, {"axis": axis}, out)
    if any(dt is None or dt.kind == "O" or dt != out.dtype for dt in sig.dtypes):
        return guarded(lambda *inputs: cat(inputs, ax, out=out), _concat_native, {"axis": axis}, out)
    into = _native().concat_into

    def copy_rows(*inputs: Any) -> np.ndarray:
        # each input's rows of bytes in turn (np.concatenate's bytes); a non-contiguous
        # input: concat_into's ValueError hands the call to the generic kernel
        into(list(inputs), ax, out)
        return out

    return guarded(copy_rows, _concat_native, {"axis": axis}, out, recordable=True)


@register_binder("Concat")
def bind_concat(model: Model, node: Node) -> tuple[Kernel | None, str]:
    del model  # unused
    kernel, reason = _kernel(_concat_native, "concat")
    kernel.specialize = _concat_specialized
    return kernel, reason


def _bind_twin_as_native(op_type: str, name: str, why: str) -> None:
    """Bind the twin itself as the native kernel: ``why`` says what it does (one NumPy
    call or a view; no per-element Python work)."""

    def binder(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model  # unused
        k = reference_kernel(node)
        return Kernel(k.fn, "native", f"native:{name}"), ""

    binder.__name__ = binder.__qualname__ = f"bind_{op_type.lower()}"
    binder.__doc__ = f"{op_type}: {why}"
    register_binder(op_type)(binder)


def _split_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Split of one x shape with constant sizes: the parts' index tuples found once (by
    the twin on a probe); a part that is contiguous in x (x's axes before ``axis`` all 1,
    as a batch-1 channel split) is a view of x, no bytes moved (the memory planner keeps
    x's buffer while any part is read: op facts ``alias_parts``), the others are copied
    into arrays of their own, so a consumer's fast path sees contiguous operands."""
    from quanta.kernels.reference.tensor_ops import split as split_twin

    shape = sig.shapes[0]
    if (
        shape is None
        or sig.dtypes[0].kind == "O"
        or (len(sig.shapes) > 1 and sig.shapes[1] is not None and sig.consts[1] is None)
    ):
        return None
    probe = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    parts = split_twin(sig.ctx, probe, sig.consts[1] if len(sig.consts) > 1 else None, **attrs)
    axis = attrs.get("axis", 0) % len(shape)
    whole = math.prod(shape[:axis]) <= 1
    index = []
    for part in parts:
        start = int(part.reshape(-1)[0] // math.prod(shape[axis + 1 :]) % shape[axis]) if part.size else 0
        index.append(
            (
                (slice(None),) * axis + (slice(start, start + part.shape[axis]),),
                not whole and part.shape[axis] != shape[axis],
            )
        )

    def split(ctx: Any, x: np.ndarray, *rest: Any) -> tuple[np.ndarray, ...]:
        return tuple([x[i].copy() if copy else x[i] for i, copy in index])

    return split


def _bind_split(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Split: views of the input (np.split; op facts ``alias_parts``: the planner keeps
    the input's buffer while a part is read); specialized: index tuples found once, the
    parts that are not contiguous copied."""
    del model  # unused
    k = reference_kernel(node)
    return Kernel(k.fn, "native", "native:split", specialize=_split_specialized), ""


register_binder("Split")(_bind_split)


def _tile_geometry(
    shape: tuple[int, ...], reps: list[int] | None
) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]] | None:
    """Tile as a broadcast copy: y = tile(x, r) is x seen as [1, d0, 1, d1, ...]
    broadcast to [r0, d0, r1, d1, ...] and read as [r0·d0, r1·d1, ...] (element (a, j)
    of axis i lands at a·di + j, np.tile's order). (x's view shape, the broadcast shape,
    y's shape), or None when the twin must decide (a repeat count per axis is missing,
    negative, or x is a scalar)."""
    if reps is None or len(reps) != len(shape) or not shape or any(r < 0 for r in reps):
        return None
    inter = tuple(v for d in shape for v in (1, d))
    target = tuple(v for r, d in zip(reps, shape) for v in (r, d))
    return inter, target, tuple(r * d for r, d in zip(reps, shape))


@_with_fallback("Tile")
def _tile_native(ctx: Any, x: Any, repeats: Any, *, out: Any) -> np.ndarray:
    """Tile (tensor_ops.tile, np.tile): one np.copyto of x's view into y's broadcast view
    (_tile_geometry; bytes moved, none computed)."""
    del ctx  # unused: small copies
    if not isinstance(x, np.ndarray):
        raise _Unsupported
    geometry = _tile_geometry(x.shape, _int_list(repeats))
    if geometry is None:
        raise _Unsupported
    inter, target, shape = geometry
    y = np.empty(shape, x.dtype) if out is None else out
    np.copyto(y.reshape(target), x.reshape(inter))
    return y


def _tile_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """Repeats fixed for the signature: the views' shapes found once, the output's
    broadcast view made once; one np.copyto per call."""
    del attrs  # Tile has none
    shape, reps = sig.shapes[0], sig.consts[1] if len(sig.consts) > 1 else None
    if shape is None or sig.dtypes[0] is None:
        return None
    geometry = _tile_geometry(shape, _int_list(reps))
    if geometry is None:
        return None
    inter, target, y_shape = geometry
    out = sig.out
    copyto = np.copyto
    if out is None:
        dtype = sig.dtypes[0]

        def fresh(x: np.ndarray, _reps: Any = None) -> np.ndarray:
            y = np.empty(y_shape, dtype)
            copyto(y.reshape(target), x.reshape(inter))
            return y

        return guarded(fresh, _tile_native, {}, None, reads=1, fresh=True)
    dst = out.reshape(target)

    def into(x: np.ndarray, _reps: Any = None) -> np.ndarray:
        copyto(dst, x.reshape(inter))
        return out

    return guarded(into, _tile_native, {}, out, reads=1, fresh=True)


@register_binder("Tile")
def bind_tile(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Tile: one broadcast copy (_tile_native), specialized when the repeats are fixed."""
    del model  # unused
    return _kernel(_tile_native, "tile", specialize=_tile_specialized)


@_with_fallback("Range")
def _range_native(ctx: Any, start: Any, limit: Any, delta: Any, *, out: Any) -> np.ndarray:
    """Range of one integer dtype (tensor_ops.range_): n = max(ceil((limit − start) /
    delta), 0) in integers, then start + i · delta in the element type (wrapping), as the
    twin computes it; floats and mixed dtypes go to the twin (its float rounding)."""
    if not (
        isinstance(start, np.ndarray) and isinstance(limit, np.ndarray) and isinstance(delta, np.ndarray)
    ):
        raise _Unsupported
    dt = start.dtype
    if dt.kind not in "iu" or limit.dtype != dt or delta.dtype != dt or start.size != 1 or limit.size != 1:
        raise _Unsupported
    if delta.size != 1:
        raise _Unsupported
    s, lim, d = start.item(), limit.item(), delta.item()
    if d == 0:
        raise _Unsupported  # the twin raises the operator's error
    n = max(-((s - lim) // d), 0)
    y = np.arange(n, dtype=dt)
    y *= delta.reshape(())
    y += start.reshape(())
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register_binder("Range")
def bind_range(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Range: integer ranges directly, float ones by the twin (bound as it when the dtype
    is known to be a float one)."""
    del model  # unused
    dt = _dtype(node.input(0))
    if dt is not None and dt.kind == "f":
        return Kernel(reference_kernel(node).fn, "native", "native:range"), ""
    return _kernel(_range_native, "range")


_bind_twin_as_native("Shape", "shape", "a tiny int64 array of the input's dimensions")
_bind_twin_as_native("Size", "size", "an int64 scalar of the input's element count")
_bind_twin_as_native("ConstantOfShape", "constant_of_shape", "one np.full of the given shape")


def _constant_native(ctx: Any, *, decoded: np.ndarray, out: Any = None, **attrs: Any) -> np.ndarray:
    """Constant: the value decoded at compile time (copied: a kernel never hands out a
    buffer it keeps)."""
    del ctx, attrs  # unused: the value is fixed
    if out is None:
        return decoded.copy()
    np.copyto(out, decoded)
    return out


@register_binder("Constant")
def bind_constant(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Constant, its value decoded once at compile time."""
    del model  # unused
    from quanta.kernels.reference.tensor_ops import constant

    try:
        value = np.asarray(constant(OpContext(opset=0), **node.attrs))
    except Exception as e:
        return None, f"Constant: {e}"
    if value.dtype.kind == "O":
        return None, "a string Constant runs on the twin"
    return Kernel(_constant_native, "native", "native:constant", params={"decoded": value}, out=False), ""


# --------------------------------------------------------------------------------------
# quanta::AccumulatorToFloat (the float output stage of LowerConvFloatOutput)
# --------------------------------------------------------------------------------------


def _per_channel(v: Any, channels: int, rank: int, dtype: np.dtype) -> np.ndarray | None:
    """``v`` as [channels] when it broadcasts as [1, M, 1, ...] (or one value), else _Unsupported."""
    if v is None:
        return None
    a = np.asarray(v)
    if a.dtype != dtype:
        raise _Unsupported
    if a.size == 1 and a.ndim <= rank:
        return np.full(channels, a.reshape(()), dtype)
    shape = (1,) * (rank - a.ndim) + a.shape
    if len(shape) != rank or shape[1] != channels or math.prod(shape) != channels:
        raise _Unsupported
    return np.ascontiguousarray(a.reshape(channels))


def _acc_to_float_native(
    ctx: Any, acc: Any, bias: Any, scale: Any, float_bias: Any = None, *, out: Any = None
) -> np.ndarray:
    """AccumulatorToFloat (reference/accumulator.py): one pass over the int32 accumulators
    [N, M, ...] with per-channel bias, scale and float bias; other shapes go to the twin."""
    try:
        if not isinstance(acc, np.ndarray) or acc.dtype != np.int32 or acc.ndim < 2:
            raise _Unsupported
        m = acc.shape[1]
        b = _per_channel(bias, m, acc.ndim, np.dtype(np.int32))
        s = _per_channel(scale, m, acc.ndim, F32)
        fb = _per_channel(float_bias, m, acc.ndim, F32)
        return _native().acc_to_float(np.asarray(acc, order="C"), b, s, fb, _threads(ctx), out)
    except (_Unsupported, ValueError):
        pass
    RUNTIME_FALLBACKS["AccumulatorToFloat"] += 1
    y = accumulator_to_float(ctx, acc, bias, scale, float_bias)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _acc_to_float_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """AccumulatorToFloat with constant bias, scale and float bias: per-channel once."""
    shape = sig.shapes[0]
    if shape is None or sig.dtypes[0] != np.int32 or len(shape) < 2:
        return None
    consts = list(sig.consts[1:]) + [None] * (4 - len(sig.consts))
    for k in (1, 2, 3):
        if k < len(sig.shapes) and sig.shapes[k] is not None and consts[k - 1] is None:
            return None
    m, rank = shape[1], len(shape)
    try:
        b = _per_channel(consts[0], m, rank, np.dtype(np.int32))
        sc = _per_channel(consts[1], m, rank, F32)
        fb = _per_channel(consts[2], m, rank, F32)
    except _Unsupported:
        return None
    acc_to_float, threads, out = _native().acc_to_float, step_threads(sig), sig.out
    return guarded(
        lambda acc, *p: acc_to_float(acc, b, sc, fb, threads, out),
        _acc_to_float_native,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


@register_binder("AccumulatorToFloat", "quanta")
def bind_accumulator_to_float(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::AccumulatorToFloat with per-channel (or one) bias, scale and float bias."""
    del model  # unused
    return _kernel(_acc_to_float_native, "acc_to_float", specialize=_acc_to_float_specialized)


# quanta::AccumulatorToQuant (lower/accumulator_to_quant.py): the same stage, a float gate
# and a per-tensor QuantizeLinear in one pass (tensor_ops.h acc_to_quant)

#: sgemm.h PostOp kinds of the gates (float_gemm.POST_KINDS; 0: none)
_ACC_POST_KINDS = {"": 0, "SiLU": 1, "HardSwish": 2, "HardSigmoid": 3, "ClipMulDiv": 4}


def _acc_quant_params(
    acc_shape: tuple, bias: Any, scale: Any, float_bias: Any, y_scale: Any, y_zero_point: Any
) -> tuple:
    """The kernel's per-channel arrays and output parameters, or _Unsupported."""
    m, rank = acc_shape[1], len(acc_shape)
    b = _per_channel(bias, m, rank, np.dtype(np.int32))
    s = _per_channel(scale, m, rank, F32)
    fb = _per_channel(float_bias, m, rank, F32)
    return (b, s, fb, *_quant_output(y_scale, y_zero_point))


def _quant_output(y_scale: Any, y_zero_point: Any) -> tuple[float, int, bool]:
    """(scale, zero point, signed) of a per-tensor 8-bit output the native kernels take
    (a float32 scale > 0, finite), or _Unsupported."""
    ys, yz = np.asarray(y_scale), np.asarray(y_zero_point)
    if ys.size != 1 or ys.dtype != F32 or yz.size != 1 or yz.dtype not in (np.uint8, np.int8):
        raise _Unsupported
    sy = float(ys.reshape(()))
    if not (math.isfinite(sy) and sy > 0.0):
        raise _Unsupported
    return sy, int(yz.reshape(())), yz.dtype == np.int8


def _acc_to_quant_native(
    ctx: Any,
    acc: Any,
    bias: Any,
    scale: Any,
    float_bias: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    out: Any = None,
    activation: str = "",
    activation_params: Any = None,
) -> np.ndarray:
    """AccumulatorToQuant (reference/accumulator.py) through the native pass; other
    shapes and parameters go to the twin."""
    try:
        if not isinstance(acc, np.ndarray) or acc.dtype != np.int32 or acc.ndim < 2:
            raise _Unsupported
        kind = _ACC_POST_KINDS.get(activation)
        if kind is None:
            raise _Unsupported
        b, s, fb, sy, zy, signed = _acc_quant_params(
            acc.shape, bias, scale, float_bias, y_scale, y_zero_point
        )
        params = [float(p) for p in (activation_params or [])]
        return _native().acc_to_quant(
            np.asarray(acc, order="C"), b, s, fb, kind, params, sy, zy, signed, _threads(ctx), out
        )
    except (_Unsupported, ValueError):
        pass
    RUNTIME_FALLBACKS["AccumulatorToQuant"] += 1
    y = accumulator_to_quant(
        ctx,
        acc,
        bias,
        scale,
        float_bias,
        y_scale,
        y_zero_point,
        activation=activation,
        activation_params=activation_params,
    )
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _acc_to_quant_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """AccumulatorToQuant with constant parameters: converted once."""
    shape = sig.shapes[0]
    if shape is None or sig.dtypes[0] != np.int32 or len(shape) < 2:
        return None
    consts = list(sig.consts[1:]) + [None] * (6 - len(sig.consts))
    for k in range(1, 6):
        if k < len(sig.shapes) and sig.shapes[k] is not None and consts[k - 1] is None:
            return None
    kind = _ACC_POST_KINDS.get(attrs.get("activation", ""))
    if kind is None:
        return None
    try:
        b, sc, fb, sy, zy, signed = _acc_quant_params(shape, *consts[:5])
    except _Unsupported:
        return None
    params = [float(p) for p in (attrs.get("activation_params") or [])]
    run, threads, out = _native().acc_to_quant, step_threads(sig), sig.out
    return guarded(
        lambda acc, *p: run(acc, b, sc, fb, kind, params, sy, zy, signed, threads, out),
        _acc_to_quant_native,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


@register_binder("AccumulatorToQuant", "quanta")
def bind_accumulator_to_quant(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::AccumulatorToQuant with per-channel (or one) bias, scale and float bias,
    a per-tensor 8-bit output and one of the float gates the native post-op runs."""
    del model  # unused
    if node.attrs.get("activation", "") not in _ACC_POST_KINDS:
        return None, f"activation {node.attrs.get('activation')!r} has no native post-op"
    return _kernel(_acc_to_quant_native, "acc_to_quant", specialize=_acc_to_quant_specialized)


# quanta::SoftmaxQuant (lower/accumulator_to_quant.py): an attention score's Mul, mask Add,
# Softmax and QuantizeLinear in one pass over each row (tensor_ops.h softmax_quant)

#: (x shape, mask shape) -> the mask row of each x row (the mask's broadcast over the rows)
_MASK_ROWS = BoundedCache()


def _mask_rows(x_shape: tuple, mask_shape: tuple) -> np.ndarray:
    def build() -> np.ndarray:
        lead = mask_shape[:-1]
        idx = np.arange(int(np.prod(lead, dtype=np.int64)), dtype=np.int64).reshape(lead)
        return np.ascontiguousarray(np.broadcast_to(idx, x_shape[:-1]).reshape(-1))

    rows: np.ndarray = _MASK_ROWS.get((x_shape, mask_shape), build)
    return rows


def _softmax_quant_native(
    ctx: Any,
    x: Any,
    scale: Any,
    mask: Any,
    y_scale: Any,
    y_zero_point: Any,
    *,
    out: Any = None,
) -> np.ndarray:
    """SoftmaxQuant (reference/accumulator.py) through the native pass; other shapes and
    parameters go to the twin."""
    try:
        if not isinstance(x, np.ndarray) or x.dtype != F32 or x.ndim < 1 or not 1 <= x.shape[-1] <= 4096:
            raise _Unsupported
        if scale is not None and (
            np.asarray(scale).dtype != F32 or np.asarray(scale).size != 1 or np.ndim(scale) > x.ndim
        ):
            raise _Unsupported  # a scale of higher rank broadcasts x to another shape: the twin
        rows = None
        if mask is not None:
            if (
                not isinstance(mask, np.ndarray)
                or mask.dtype != F32
                or mask.ndim < 1
                or mask.ndim > x.ndim
                or mask.shape[-1] != x.shape[-1]
                or np.broadcast_shapes(mask.shape, x.shape) != x.shape
            ):
                raise _Unsupported
            mask = np.asarray(mask, order="C")
            rows = _mask_rows(x.shape, mask.shape)
        sy, zy, signed = _quant_output(y_scale, y_zero_point)
        sc = None if scale is None else np.asarray(scale, F32).reshape(1)
        return _native().softmax_quant(
            np.asarray(x, order="C"), sc, mask, rows, sy, zy, signed, _threads(ctx), out
        )
    except (_Unsupported, ValueError):
        pass
    RUNTIME_FALLBACKS["SoftmaxQuant"] += 1
    y = softmax_quant(ctx, x, scale, mask, y_scale, y_zero_point)
    if out is None:
        return y
    np.copyto(out, y)
    return out


# quanta::MulQuant (lower/mul_quant.py): a per-column float32 factor and QuantizeLinear in
# one pass (tensor_ops.h mul_quant)


# MulQuant's activation attribute -> mul_quant's gelu flag
_MUL_QUANT_ACT = {"none": False, "gelu": True}


def _mul_quant_native(
    ctx: Any, x: Any, c: Any, y_scale: Any, y_zero_point: Any, *, out: Any = None, activation: str = "none"
) -> np.ndarray:
    """MulQuant (reference/accumulator.py) through the native pass; c that broadcasts along
    other axes than the last, and other parameters, go to the twin."""
    try:
        if not isinstance(x, np.ndarray) or x.dtype != F32 or x.ndim < 1 or activation not in _MUL_QUANT_ACT:
            raise _Unsupported
        cc = np.asarray(c)
        if (
            cc.dtype != F32
            or cc.ndim > x.ndim
            or any(d != 1 for d in cc.shape[:-1])
            or cc.size not in (1, x.shape[-1])
        ):
            raise _Unsupported
        sy, zy, signed = _quant_output(y_scale, y_zero_point)
        return _native().mul_quant(
            np.asarray(x, order="C"),
            np.ascontiguousarray(cc.reshape(-1)),
            sy,
            zy,
            signed,
            _threads(ctx),
            out,
            _MUL_QUANT_ACT[activation],
        )
    except (_Unsupported, ValueError):
        pass
    RUNTIME_FALLBACKS["MulQuant"] += 1
    y = mul_quant(ctx, x, c, y_scale, y_zero_point, activation=activation)
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _mul_quant_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """MulQuant with a constant factor, y_scale and y_zero_point: converted once, the
    binding called by position (a recordable step)."""
    shape = sig.shapes[0]
    if shape is None or not shape or sig.dtypes[0] != F32 or len(sig.consts) < 4:
        return None
    c, ys, yz = sig.consts[1:4]
    if c is None or ys is None or yz is None:
        return None
    cc = np.asarray(c)
    if cc.dtype != F32 or cc.ndim > len(shape) or any(d != 1 for d in cc.shape[:-1]):
        return None
    if cc.size not in (1, shape[-1]):
        return None
    try:
        sy, zy, signed = _quant_output(ys, yz)
    except _Unsupported:
        return None
    act = attrs.get("activation", "none")
    if act not in _MUL_QUANT_ACT:
        return None
    gelu = _MUL_QUANT_ACT[act]
    cv = np.ascontiguousarray(cc.reshape(-1))
    run, threads, out = _native().mul_quant, step_threads(sig), sig.out
    return guarded(
        lambda x, *p: run(x, cv, sy, zy, signed, threads, out, gelu),
        _mul_quant_native,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


@register_binder("MulQuant", "quanta")
def bind_mul_quant(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::MulQuant on float32 x, c one value or one per element of the last axis, a
    per-tensor 8-bit output; activation "none" or "gelu" (G1)."""
    del model  # unused
    act = node.attrs.get("activation", "none")
    if act not in _MUL_QUANT_ACT:
        return None, f"native MulQuant takes activation 'none' or 'gelu', got {act!r}"
    name = "gelu_mul_quant" if act == "gelu" else "mul_quant"
    return _kernel(_mul_quant_native, name, specialize=_mul_quant_specialized)


def _softmax_quant_specialized(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
    """SoftmaxQuant with a constant scale (or none), y_scale and y_zero_point and a mask
    of a fixed shape (or none): the generic kernel's checks and the mask's row map made
    once, the binding called by position (a recordable step; the mask is read where it
    lies on every run)."""
    shape = sig.shapes[0]
    if (
        shape is None
        or not shape
        or sig.dtypes[0] != F32
        or not 1 <= shape[-1] <= 4096
        or len(sig.consts) < 5
    ):
        return None
    sc = None
    if sig.dtypes[1] is not None:
        c = sig.consts[1]
        if c is None or c.dtype != F32 or c.size != 1 or c.ndim > len(shape):
            return None
        sc = np.asarray(c, F32).reshape(1)
    rows = None
    has_mask = sig.dtypes[2] is not None
    if has_mask:
        m_shape = sig.shapes[2]
        if m_shape is None or sig.dtypes[2] != F32 or not 1 <= len(m_shape) <= len(shape):
            return None
        if m_shape[-1] != shape[-1]:
            return None
        try:
            if np.broadcast_shapes(m_shape, shape) != tuple(shape):
                return None
        except ValueError:
            return None
        rows = _mask_rows(tuple(shape), tuple(m_shape))
    ys, yz = sig.consts[3], sig.consts[4]
    if ys is None or yz is None:
        return None
    try:
        sy, zy, signed = _quant_output(ys, yz)
    except _Unsupported:
        return None
    run, threads, out = _native().softmax_quant, step_threads(sig), sig.out
    if has_mask:
        return guarded(
            lambda x, mask: run(x, sc, mask, rows, sy, zy, signed, threads, out),
            _softmax_quant_native,
            attrs,
            out,
            reads=(0, 2),
            recordable=True,
        )
    return guarded(
        lambda x, *p: run(x, sc, None, None, sy, zy, signed, threads, out),
        _softmax_quant_native,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


@register_binder("SoftmaxQuant", "quanta")
def bind_softmax_quant(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::SoftmaxQuant on float32 rows of at most 4096 values, a per-tensor 8-bit
    output; the mask broadcasts over the rows."""
    del model, node  # unused
    return _kernel(_softmax_quant_native, "softmax_quant", specialize=_softmax_quant_specialized)
