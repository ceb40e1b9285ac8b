"""Float neural-network operators (ai.onnx): activations, Gemm/MatMul/Einsum, the Softmax
family, Dropout (inference, or seeded training), Pad and the depth/space rearrangements.

Convolution lives in nn_conv.py, pooling in nn_pool.py, normalizations in nn_norm.py and
Resize in nn_resize.py; this module also holds the dtype helpers they share
(compute_dtype, to_compute, from_compute) and erf.

Precision: half-precision inputs (float16, bfloat16, float8) are computed in float32 and
rounded once to the input dtype at the end, as the ONNX backend tests generate their
expected outputs; float32 and float64 compute in their own dtype. The output dtype is
always the input dtype.
"""

from __future__ import annotations

import math

import numpy as np

from quanta.kernels.reference.float_ops import log_softmax_rows, softmax_rows
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["compute_dtype", "erf", "from_compute", "to_compute"]


# ----------------------------------------------------------------------------- dtypes


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype arithmetic runs in: float32/float64 themselves, every narrower float
    (float16, bfloat16, float8 from ml_dtypes) float32, integers unchanged."""
    dtype = np.dtype(dtype)
    if dtype in (np.float32, np.float64) or dtype.kind in "iub":
        return dtype
    return np.dtype(np.float32)


def to_compute(x: np.ndarray) -> np.ndarray:
    """``x`` in :func:`compute_dtype` (no copy when it already is)."""
    return np.asarray(x).astype(compute_dtype(x.dtype), copy=False)


def from_compute(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Round a result once to the op's output dtype."""
    return np.asarray(y).astype(dtype, copy=False)


def _unary(x: np.ndarray, fn) -> np.ndarray:
    return from_compute(fn(to_compute(x)), x.dtype)


_ERF: list = []  # the float64 erf, chosen at its first use


def _erf_impl():
    """scipy's erf when scipy is installed, else math.erf (exact to double precision as
    well, only slower). Imported at the first Erf, not with this module: scipy.special
    costs a process ~26 MB and most sessions never evaluate an Erf here."""
    if not _ERF:
        try:
            from scipy.special import erf as impl
        except ImportError:  # pragma: no cover - depends on the environment
            impl = np.frompyfunc(math.erf, 1, 1)
        _ERF.append(impl)
    return _ERF[0]


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise Gauss error function, evaluated in float64, returned in x's dtype."""
    return np.asarray(_erf_impl()(np.asarray(x, dtype=np.float64)), dtype=np.float64).astype(x.dtype)


# ------------------------------------------------------------------------ activations


@register("Relu")
def relu(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    del ctx  # unused
    return np.maximum(x, np.zeros((), x.dtype))  # exact in any dtype, integers included (opset 14)


@register("LeakyRelu")
def leaky_relu(ctx: OpContext, x: np.ndarray, *, alpha: float = 0.01) -> np.ndarray:
    del ctx  # unused
    return _unary(x, lambda v: np.where(v < 0, v * v.dtype.type(alpha), v))


@register("PRelu")
def prelu(ctx: OpContext, x: np.ndarray, slope: np.ndarray) -> np.ndarray:
    """y = slope * x where x < 0 else x; slope broadcasts unidirectionally to x."""
    del ctx  # unused
    try:
        np.broadcast_to(slope, x.shape)
    except ValueError:
        raise OpError(f"PRelu: slope must broadcast to x {x.shape}, got {slope.shape}") from None
    xc, sc = to_compute(x), np.asarray(slope).astype(compute_dtype(x.dtype))
    return from_compute(np.where(xc < 0, sc * xc, xc), x.dtype)


@register("Elu")
def elu(ctx: OpContext, x: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    """float32: quanta's expm1 (float_ops.elu_f32, docs/float-ops.md (EL), (X1)-(X3)); other
    dtypes: NumPy's expm1 in the compute dtype."""
    del ctx  # unused
    if np.asarray(x).dtype == np.float32:
        from quanta.kernels.reference import float_ops

        return float_ops.elu_f32(x, alpha)
    return _unary(x, lambda v: np.where(v < 0, alpha * np.expm1(np.minimum(v, 0)), v))


@register("Selu")
def selu(
    ctx: OpContext,
    x: np.ndarray,
    *,
    alpha: float = 1.67326319217681884765625,
    gamma: float = 1.05070102214813232421875,
) -> np.ndarray:
    """y = gamma * (alpha * e^x - alpha) for x <= 0, gamma * x for x > 0."""
    del ctx  # unused
    return _unary(x, lambda v: gamma * np.where(v > 0, v, alpha * np.expm1(np.minimum(v, 0))))


@register("Celu")
def celu(ctx: OpContext, x: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    """y = max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""
    del ctx  # unused
    return _unary(x, lambda v: np.maximum(v, 0) + np.minimum(0, alpha * np.expm1(v / alpha)))


def _sigmoid(v: np.ndarray) -> np.ndarray:
    # exp of a non-positive argument only, so neither branch overflows.
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1 / (1 + e), e / (1 + e))


@register("Sigmoid")
def sigmoid(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """float32: quanta's sigmoid, eqs. (Σ1)-(Σ2) of docs/float-ops.md (the native kernel's
    twin); other floats as 1 / (1 + e^−|x|) with np.exp."""
    del ctx  # unused
    if x.dtype == np.float32:
        from quanta.kernels.reference import float_ops

        return float_ops.sigmoid_f32(x)
    return _unary(x, _sigmoid)


@register("HardSigmoid")
def hard_sigmoid(ctx: OpContext, x: np.ndarray, *, alpha: float = 0.2, beta: float = 0.5) -> np.ndarray:
    del ctx  # unused
    return _unary(x, lambda v: np.clip(alpha * v + beta, 0, 1))


@register("HardSwish")
def hard_swish(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """y = x * max(0, min(1, alpha * x + 0.5)), alpha = 1/6 in x's type and multiplied:
    ONNX's definition and ONNX Runtime's bytes (a division by 6 rounds differently)."""
    del ctx  # unused
    return _unary(x, lambda v: v * np.clip(v * v.dtype.type(1 / 6) + v.dtype.type(0.5), 0, 1))


def _softplus(v: np.ndarray) -> np.ndarray:
    return np.logaddexp(v.dtype.type(0), v)  # log(1 + e^x) without overflow


@register("Softplus")
def softplus(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """float32: quanta's softplus (float_ops.softplus_f32, docs/float-ops.md (SP1)-(SP3));
    other dtypes: np.logaddexp(0, x) in the compute dtype."""
    del ctx  # unused
    if np.asarray(x).dtype == np.float32:
        from quanta.kernels.reference import float_ops

        return float_ops.softplus_f32(x)
    return _unary(x, _softplus)


@register("Softsign")
def softsign(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    del ctx  # unused
    return _unary(x, lambda v: v / (1 + np.abs(v)))


@register("Tanh")
def tanh(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """float32: quanta's tanh, eqs. (T1)-(T4) of docs/float-ops.md (the native kernel's
    twin); other floats np.tanh."""
    del ctx  # unused
    if x.dtype == np.float32:
        from quanta.kernels.reference import float_ops

        return float_ops.tanh_f32(x)
    return _unary(x, np.tanh)


@register("Erf")
def erf_op(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """float32: quanta's erf, eqs. (F1)-(F5) of docs/float-ops.md (the native kernel's
    twin, within 1.03 ulp); other floats in float64; integers rounded."""
    del ctx  # unused
    if x.dtype == np.float32:
        from quanta.kernels.reference import float_ops

        return float_ops.erf_f32(x)
    if x.dtype.kind in "iu":  # opset 9+ allows integer inputs: erf rounded to the integer type
        return np.rint(erf(x.astype(np.float64))).astype(x.dtype)
    return _unary(x, erf)


@register("Gelu")
def gelu(ctx: OpContext, x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    """none: y = x/2 * (1 + erf(x / sqrt(2)));
    tanh: y = x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))).

    float32 follows eqs. (G1) / (G2) of docs/float-ops.md (quanta's erf and tanh, the
    native kernel's twin); other floats use float64 erf and np.tanh."""
    del ctx  # unused
    if x.dtype == np.float32 and approximate in ("none", "tanh"):
        from quanta.kernels.reference import float_ops

        return float_ops.gelu_f32(x) if approximate == "none" else float_ops.gelu_tanh_f32(x)
    if approximate == "none":
        return _unary(x, lambda v: 0.5 * v * (1 + erf(v / np.sqrt(v.dtype.type(2)))))
    if approximate == "tanh":
        k = math.sqrt(2 / math.pi)
        return _unary(x, lambda v: 0.5 * v * (1 + np.tanh(k * (v + 0.044715 * v**3))))
    raise OpError(f"Gelu: approximate expected 'none' or 'tanh', got {approximate!r}")


@register("Mish")
def mish(ctx: OpContext, x: np.ndarray) -> np.ndarray:
    """y = x * tanh(softplus(x)); float32: quanta's softplus (SP1)-(SP3) and tanh
    (T1)-(T4), then the float32 product, eq. (MI) of docs/float-ops.md (the native
    kernel's twin); other dtypes NumPy's."""
    del ctx  # unused
    if np.asarray(x).dtype == np.float32:
        from quanta.kernels.reference import float_ops

        return np.asarray(x * float_ops.tanh_f32(float_ops.softplus_f32(x)))
    return _unary(x, lambda v: v * np.tanh(_softplus(v)))


@register("ThresholdedRelu")
def thresholded_relu(ctx: OpContext, x: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    del ctx  # unused
    return _unary(x, lambda v: np.where(v > alpha, v, 0))


@register("Swish")
def swish(ctx: OpContext, x: np.ndarray, *, alpha: float = 1.0) -> np.ndarray:
    """y = x * sigmoid(alpha * x) (opset 24)."""
    del ctx  # unused
    return _unary(x, lambda v: v * _sigmoid(alpha * v))


@register("Clip")
def clip(
    ctx: OpContext,
    x: np.ndarray,
    lo: np.ndarray | None = None,
    hi: np.ndarray | None = None,
    *,
    min: float | None = None,  # ONNX attribute names (opset < 11)
    max: float | None = None,
) -> np.ndarray:
    """y = min(max(x, lo), hi): bounds are attributes before opset 11, optional scalar
    inputs from 11 on. When lo > hi every element becomes hi (min applied last)."""
    if ctx.opset < 11:
        lo = None if min is None else np.asarray(min)
        hi = None if max is None else np.asarray(max)
    y = x
    for bound in (lo, hi):
        if bound is not None and np.asarray(bound).size != 1:
            raise OpError(f"Clip: min and max must be scalars, got shape {np.shape(bound)}")
    if lo is not None:
        y = np.maximum(y, np.asarray(lo).astype(x.dtype).reshape(()))
    if hi is not None:
        y = np.minimum(y, np.asarray(hi).astype(x.dtype).reshape(()))
    return x.copy() if y is x else y


# -------------------------------------------------------------- Gemm, MatMul, Einsum


@register("Gemm")
def gemm(
    ctx: OpContext,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray | None = None,
    *,
    alpha: float = 1.0,
    beta: float = 1.0,
    transA: int = 0,  # ONNX attribute names
    transB: int = 0,
) -> np.ndarray:
    """Y = alpha * A' @ B' + beta * C, A' = A.T if transA, B' = B.T if transB; C broadcasts
    unidirectionally to (M, N). Integer inputs accumulate in their own type."""
    del ctx  # unused
    if a.ndim != 2 or b.ndim != 2:
        raise OpError(f"Gemm: expected 2-D A and B, got shapes {a.shape} and {b.shape}")
    ac, bc = to_compute(a), to_compute(b)
    ac = ac.T if transA else ac
    bc = bc.T if transB else bc
    if ac.shape[1] != bc.shape[0]:
        raise OpError(f"Gemm: inner dimensions differ after transposition: {ac.shape} @ {bc.shape}")
    y = ac @ bc
    if alpha != 1.0:
        y = alpha * y
    if c is not None and beta != 0.0:
        cc = to_compute(c)
        y = y + (cc if beta == 1.0 else beta * cc)
    return from_compute(y, a.dtype)


@register("MatMul")
def matmul(ctx: OpContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """numpy.matmul semantics (1-D operands promoted and the added axis removed)."""
    del ctx  # unused
    return from_compute(np.matmul(to_compute(a), to_compute(b)), a.dtype)


@register("Einsum")
def einsum(ctx: OpContext, *inputs: np.ndarray, equation: str) -> np.ndarray:
    del ctx  # unused
    dtype = inputs[0].dtype
    y = np.einsum(equation.replace(" ", ""), *(to_compute(v) for v in inputs))
    return from_compute(y, dtype)


# ------------------------------------------------------------------- Softmax family


def _as_2d_axis(x: np.ndarray, axis: int, opset: int) -> tuple[np.ndarray, int]:
    """Before opset 13 the Softmax family coerces x to 2-D [prod(shape[:axis]),
    prod(shape[axis:])] and works along the second dimension; from 13 on, along ``axis``."""
    if not -x.ndim <= axis < max(x.ndim, 1):
        raise OpError(f"axis: expected in [{-x.ndim}, {x.ndim - 1}], got {axis}")
    if opset >= 13:
        return x, axis
    axis = axis % x.ndim
    return x.reshape(math.prod(x.shape[:axis]), -1), 1


@register("Softmax")
def softmax(ctx: OpContext, x: np.ndarray, *, axis: int | None = None) -> np.ndarray:
    """float32: quanta's algorithm (float_ops.softmax_rows, docs/float-ops.md (S1)-(S4)),
    bit-identical to the native kernel, along ``axis`` (opset >= 13) or along the second
    dimension of the 2-D coercion (opset < 13). Other dtypes: max, np.exp, sum, divide."""
    axis = (-1 if ctx.opset >= 13 else 1) if axis is None else axis
    if x.dtype == np.float32 and x.size and x.ndim:
        v, ax = _as_2d_axis(x, axis, ctx.opset)
        rows = np.moveaxis(v, ax, -1)
        y = softmax_rows(rows.reshape(-1, rows.shape[-1]))
        return np.moveaxis(y.reshape(rows.shape), -1, ax).reshape(x.shape)
    v, ax = _as_2d_axis(to_compute(x), axis, ctx.opset)
    # A row that is all -inf (fully masked attention) gives NaN, as ONNX Runtime: the
    # -inf - -inf is expected there, not a warning.
    with np.errstate(invalid="ignore"):
        e = np.exp(v - v.max(axis=ax, keepdims=True))
        return from_compute((e / e.sum(axis=ax, keepdims=True)).reshape(x.shape), x.dtype)


@register("LogSoftmax")
def log_softmax(ctx: OpContext, x: np.ndarray, *, axis: int | None = None) -> np.ndarray:
    """float32: quanta's algorithm (float_ops.log_softmax_rows, docs/float-ops.md
    (LS1)-(LS5)), bit-identical to the native kernel; other dtypes: max, np.exp, sum,
    np.log."""
    axis = (-1 if ctx.opset >= 13 else 1) if axis is None else axis
    if x.dtype == np.float32 and x.size and x.ndim:
        v, ax = _as_2d_axis(x, axis, ctx.opset)
        rows = np.moveaxis(v, ax, -1)
        y = log_softmax_rows(rows.reshape(-1, rows.shape[-1]))
        return np.moveaxis(y.reshape(rows.shape), -1, ax).reshape(x.shape)
    v, ax = _as_2d_axis(to_compute(x), axis, ctx.opset)
    shifted = v - v.max(axis=ax, keepdims=True)
    y = shifted - np.log(np.exp(shifted).sum(axis=ax, keepdims=True))
    return from_compute(y.reshape(x.shape), x.dtype)


@register("Hardmax")
def hardmax(ctx: OpContext, x: np.ndarray, *, axis: int | None = None) -> np.ndarray:
    """1 at the first maximum along the axis, 0 elsewhere."""
    axis = (-1 if ctx.opset >= 13 else 1) if axis is None else axis
    v, ax = _as_2d_axis(x, axis, ctx.opset)
    first = np.expand_dims(np.argmax(v, axis=ax), ax)
    y = np.zeros(v.shape, dtype=x.dtype)
    np.put_along_axis(y, first, 1, axis=ax)
    return y.reshape(x.shape)


# -------------------------------------------------------------------------- Dropout


@register("Dropout")
def dropout(
    ctx: OpContext,
    x: np.ndarray,
    ratio: np.ndarray | None = None,
    training_mode: np.ndarray | None = None,
    *,
    seed: int | None = None,
    is_test: int = 0,
) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
    """Inference (the default): y = x, mask all True. Training (opset 12+ input
    ``training_mode`` true, ratio r > 0): mask = U[0, 1) >= r, y = mask * x / (1 - r).

    With a ``seed`` the uniform draw is ``numpy.random.RandomState(seed).uniform(0, 1,
    shape)``, the generator the ONNX backend tests use, so seeded runs are reproducible;
    without one it is fresh randomness. Before opset 12 ``ratio`` is an attribute and the op
    never trains (opset 7+ is inference-only in ONNX Runtime and the ONNX reference)."""
    del is_test  # opset < 7 attribute: both values mean inference for a deployed model
    if ctx.opset < 12:
        ratio, training_mode = None, None
    r = 0.5 if ratio is None else float(np.asarray(ratio).reshape(()))
    training = training_mode is not None and bool(np.asarray(training_mode).reshape(()))
    if not training or r == 0:
        y = x.copy()
        mask = np.ones(x.shape, dtype=bool)
    else:
        if not 0 <= r < 1:
            raise OpError(f"Dropout: ratio expected in [0, 1), got {r}")
        rng = np.random.RandomState(seed % 2**32) if seed is not None else np.random.default_rng()
        mask = rng.uniform(0, 1.0, x.shape) >= r
        y = from_compute(mask * to_compute(x) * (1.0 / (1.0 - r)), x.dtype)
    return (y, mask) if ctx.n_outputs >= 2 else y


# ------------------------------------------------------------------------------ Pad


@register("Pad")
def pad(
    ctx: OpContext,
    x: np.ndarray,
    pads_in: np.ndarray | None = None,
    constant_value: np.ndarray | None = None,
    axes: np.ndarray | None = None,
    *,
    mode: str = "constant",
    pads: list[int] | None = None,
    paddings: list[int] | None = None,
    value: float = 0.0,
) -> np.ndarray:
    """Pad ``x`` by ``pads = [begin_0, begin_1, ..., end_0, end_1, ...]`` over ``axes``
    (all axes by default; the ``axes`` input is opset 18+). Modes: constant, reflect,
    edge, wrap (opset 19+). Negative pads crop, and cropping happens before padding.
    Before opset 11 pads and the constant are attributes (``paddings`` in opset 1)."""
    if ctx.opset < 11:
        pads_list = list(pads if pads is not None else paddings or [])
        fill = value
    else:
        if pads_in is None:
            raise OpError("Pad: expected the pads input, got none")
        pads_list = [int(p) for p in np.asarray(pads_in).reshape(-1)]
        fill = 0 if constant_value is None or np.size(constant_value) == 0 else constant_value
    rank = x.ndim
    axis_list = list(range(rank)) if axes is None else [int(a) % rank for a in np.asarray(axes).reshape(-1)]
    if len(pads_list) != 2 * len(axis_list):
        raise OpError(
            f"Pad: expected {2 * len(axis_list)} pads for {len(axis_list)} axes, got {len(pads_list)}"
        )
    if mode not in ("constant", "reflect", "edge", "wrap"):
        raise OpError(f"Pad: mode expected constant, reflect, edge or wrap, got {mode!r}")
    begin = dict.fromkeys(range(rank), 0)
    end = dict.fromkeys(range(rank), 0)
    for i, axis in enumerate(axis_list):
        begin[axis], end[axis] = pads_list[i], pads_list[len(axis_list) + i]
    crop = tuple(slice(max(-begin[a], 0), x.shape[a] - max(-end[a], 0)) for a in range(rank))
    widths = [(max(begin[a], 0), max(end[a], 0)) for a in range(rank)]
    cropped = x[crop]
    if mode == "constant":
        fill_value = np.asarray(fill).astype(x.dtype).reshape(())
        return np.pad(cropped, widths, mode="constant", constant_values=fill_value)
    if cropped.size == 0 and any(w != (0, 0) for w in widths):
        raise OpError(f"Pad: mode {mode!r} needs a non-empty input, got shape {cropped.shape}")
    return np.pad(cropped, widths, mode=mode)


# ---------------------------------------------------------- depth <-> space rearrangement


@register("DepthToSpace")
def depth_to_space(ctx: OpContext, x: np.ndarray, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    """DCR: channel index = (row_offset * b + col_offset) * C' + c';
    CRD: channel index = (c' * b + row_offset) * b + col_offset."""
    del ctx  # unused
    n, c, h, w = x.shape
    b = blocksize
    if c % (b * b):
        raise OpError(f"DepthToSpace: channels must be a multiple of blocksize^2 = {b * b}, got {c}")
    if mode == "DCR":
        t = x.reshape(n, b, b, c // (b * b), h, w).transpose(0, 3, 4, 1, 5, 2)
    elif mode == "CRD":
        t = x.reshape(n, c // (b * b), b, b, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        raise OpError(f"DepthToSpace: mode expected 'DCR' or 'CRD', got {mode!r}")
    return t.reshape(n, c // (b * b), h * b, w * b)


@register("SpaceToDepth")
def space_to_depth(ctx: OpContext, x: np.ndarray, *, blocksize: int, mode: str = "DCR") -> np.ndarray:
    """The inverse of DepthToSpace in the same mode (``mode`` is an opset 28 attribute;
    earlier opsets always use DCR)."""
    del ctx  # unused
    n, c, h, w = x.shape
    b = blocksize
    if h % b or w % b:
        raise OpError(f"SpaceToDepth: H and W must be multiples of blocksize {b}, got {h}x{w}")
    t = x.reshape(n, c, h // b, b, w // b, b)
    if mode == "DCR":
        t = t.transpose(0, 3, 5, 1, 2, 4)
    elif mode == "CRD":
        t = t.transpose(0, 1, 3, 5, 2, 4)
    else:
        raise OpError(f"SpaceToDepth: mode expected 'DCR' or 'CRD', got {mode!r}")
    return t.reshape(n, c * b * b, h // b, w // b)
