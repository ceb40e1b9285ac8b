"""com.microsoft DynamicQuantizeLSTM, as ONNX Runtime's CPU kernel computes it (normative
reference).

The op has no ONNX spec; its definition is ONNX Runtime's CPU implementation
(contrib_ops/cpu/quantization/dynamic_quantize_lstm.cc over the DeepCPU LSTM of
providers/cpu/rnn: lstm_base.cc, uni_directional_lstm.cc, rnn_helpers.cc). Inputs::

    X [T, B, I] float32, W [D, I, 4H] and R [D, H, 4H] int8 or uint8 (ORT's layout: the
    ONNX LSTM weights transposed, gates in columns, order i o f c), B [D, 8H] (Wb then Rb),
    sequence_lens [B] int32, initial_h / initial_c [D, B, H], P [D, 3H] (order i o f),
    W_scale / W_zero_point and R_scale / R_zero_point [D] (per direction) or [D, 4H]
    (per column)

with D = 2 for ``bidirectional``. Each direction runs on its own, ``reverse`` on X reversed
within each batch row's sequence length. Per direction, with ``L`` the longest sequence
length and every step one float32 operation in ORT's order:

(1) dynamic uint8 quantization of a float block ``A`` (ORT's ``GetQuantizationParameter``):
    ``lo = min(0, min A)``, ``hi = max(0, max A)``, ``s = f32(hi − lo) / 255`` (1.0 when
    ``hi = lo``; docs eq. (10) takes 1/255 there), ``z = rne(clamp(−f32(lo / s), 0, 255))``,
    ``q = sat(rne(f32(a / s)) + z)``.
(2) quantized GEMM with ``m[n] = f32(s · w_scale[n])`` and ``zw`` the weight zero point's
    first element (ORT requires the others equal, zero for int8)::

        acc[r, n] = Σ_k (q[r, k] − z) · (w[k, n] − zw)                  exact
        G  = f32(f32(acc) · m)                        input GEMM, one block: X[:L] all rows
        G += f32(f32(acc) · m)                        per step, the previous H (B rows)

    Both roundings are separate (MLAS's scale output processor, built without FMA).
    ``saturating_pairs`` (a quanta attribute, set under ``float_functions="ort"`` where
    ORT's u8·s8 kernels saturate): with int8 weights, ``acc`` is docs/float-ops.md (QM1),
    ``Σ_j sat16(q[2j]·w[2j] + q[2j+1]·w[2j+1]) − z·Σ_k w`` of raw codes (MLAS's AVX2
    kernel without VNNI; uint8 weights take ORT's exact u8·u8 kernel).
(3) gates of step t for every row b with t < len[b], p = peephole, bias = f32(Wb + Rb)::

        i = f(clip(f32(f32(G_i + f32(c_prev · p_i)) + bias_i)))       peephole term only with P
        f = f(clip(f32(f32(G_f + f32(c_prev · p_f)) + bias_f)))       input_forget: f32(1 − i)
        g = g(clip(f32(G_c + bias_c)))
        c = f32(f32(c_prev · f) + f32(i · g))
        o = f(clip(f32(f32(G_o + f32(c · p_o)) + bias_o)))            c: the new cell state
        h = f32(h_act(c) · o)                                         no clip of c before h

    ``clip(v) = max(−clip, min(clip, v))`` (default FLT_MAX). f, g, h default to sigmoid,
    tanh, tanh. ORT's sigmoid and tanh are MLAS's rational approximations
    (``MlasComputeLogistic``, ``MlasComputeTanh``; :func:`mlas_logistic`, :func:`mlas_tanh`),
    on x86-64 with FMA their FMA3 kernels, whose fused multiply-adds are emulated here
    exactly (:func:`fma_f32`). Relu is ``max(0, v)``; the other ONNX activations use
    float32 libm-style formulas and are not pinned to ORT's bits.
(4) a row whose sequence has ended (t >= len[b]) is skipped: its Y row is 0 and c keeps its
    value. The previous H that enters the next step's quantization block (1) is what ORT
    reads: the Y rows of the step (zeros for ended rows) when Y is requested, else the
    running Y_h buffer (ended rows keep their last h). Y_h is h at t = len[b] − 1 (0 for
    len 0), Y_c likewise; steps t >= L are zeros in Y.

ORT with more than one intra-op thread quantizes (1) the previous H in blocks of
``ceil(B / threads)`` rows when ``B > 4`` or (``B >= 2`` and ``H <= 256``)
(``UniDirectionalLstm::SetNumThreads``); the registered op quantizes all B rows in one block,
ORT's result with ``intra_op_num_threads = 1``. :func:`dynamic_quantize_lstm` takes
``rows_per_block`` for the other case. Rows with ``sequence_lens = 0`` when Y is not
requested make ORT read its Y_h buffer before writing it (its content is unspecified); this
reference reads zeros there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from quanta.kernels.reference.float_ops import fma_f32
from quanta.kernels.reference.mlas_qconv import saturation_correction
from quanta.kernels.reference.registry import MS_DOMAIN, OpContext, OpError, refuses, register

__all__ = [
    "DqLstmInputs",
    "dynamic_quantize_lstm",
    "dynamic_quantize_lstm_op",
    "fma_f32",
    "mlas_logistic",
    "mlas_tanh",
]

F32 = np.float32
_F64 = np.float64
_FLT_MAX = float(np.finfo(np.float32).max)


# MlasLogisticConstants (logistic.cpp): clamp range, then p = x·P(x²), q = Q(x²).
_LOGISTIC_P = tuple(
    F32(v)
    for v in (
        4.37031012579801e-11,
        1.15627324459942e-07,
        6.08574864600143e-05,
        8.51377133304701e-03,
        2.48287947061529e-01,
    )
)
_LOGISTIC_Q = tuple(
    F32(v)
    for v in (
        6.10247389755681e-13,
        5.76102136993427e-09,
        6.29106785017040e-06,
        1.70198817374094e-03,
        1.16817656904453e-01,
        9.93151921023180e-01,
    )
)
# MlasTanhConstants (tanh.cpp); ORT's CPU GRU's own rational tanh has the same ones
TANH_P = tuple(
    F32(v)
    for v in (
        -2.76076847742355e-16,
        2.00018790482477e-13,
        -8.60467152213735e-11,
        5.12229709037114e-08,
        1.48572235717979e-05,
        6.37261928875436e-04,
        4.89352455891786e-03,
    )
)
TANH_Q = tuple(
    F32(v) for v in (1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03, 4.89352518554385e-03)
)


def _rational(v: np.ndarray, p_coef: tuple, q_coef: tuple) -> np.ndarray:
    s = v * v
    p = fma_f32(s, p_coef[0], p_coef[1])
    for c in p_coef[2:]:
        p = fma_f32(p, s, c)
    p = v * p
    q = fma_f32(s, q_coef[0], q_coef[1])
    for c in q_coef[2:]:
        q = fma_f32(q, s, c)
    return p / q


def mlas_logistic(x: np.ndarray) -> np.ndarray:
    """``MlasLogisticKernelFma3``: v = clamp(x, −18, 18), s = f32(v·v),
    p = v·(((a9·s + a7)·s + a5)·s + a3)·s + a1), q = ((((b10·s + b8)·s + b6)·s + b4)·s + b2)·s + b0
    with every ``·s +`` one FMA, y = max(0, f32(f32(p / q) + 0.5)). Far left the
    rational form dips below 0, so the result is exactly 0 there (the true sigmoid(−18) is 1.5e−8).

    >>> mlas_logistic(np.array([0.0, 1.0, -30.0], np.float32)).tolist()
    [0.5, 0.7310585975646973, 0.0]"""
    x = np.asarray(x, F32)
    v = np.minimum(np.maximum(x, F32(-18.0)), F32(18.0))
    with np.errstate(over="ignore", invalid="ignore"):
        return np.maximum(_rational(v, _LOGISTIC_P, _LOGISTIC_Q) + F32(0.5), F32(0.0))


def mlas_tanh(x: np.ndarray) -> np.ndarray:
    """``MlasTanhKernelFma3``: v = clamp(x, −9, 9), s = f32(v·v), p = v·P(s) and q = Q(s)
    by FMA Horner steps (coefficients a13 .. a1, b6 .. b0), y = f32(p / q).

    >>> mlas_tanh(np.array([0.0, 0.5, 20.0], np.float32)).tolist()
    [0.0, 0.46211716532707214, 1.0]"""
    x = np.asarray(x, F32)
    v = np.minimum(np.maximum(x, F32(-9.0)), F32(9.0))
    with np.errstate(over="ignore", invalid="ignore"):
        return _rational(v, TANH_P, TANH_Q)


# ORT's activation table (rnn_helpers.cc NameToArgUsageMap / NameToArgDefaultsMap): which of
# alpha, beta a function consumes, and their defaults.
_ARG_USAGE = {
    "affine": (True, True),
    "relu": (False, False),
    "leakyrelu": (True, False),
    "thresholdedrelu": (True, False),
    "tanh": (False, False),
    "scaledtanh": (True, True),
    "sigmoid": (False, False),
    "hardsigmoid": (True, True),
    "elu": (True, False),
    "softsign": (False, False),
    "softplus": (False, False),
}
_ARG_DEFAULTS = {"leakyrelu": (0.01, 0.0), "hardsigmoid": (0.2, 0.5), "elu": (1.0, 0.0)}


def _activation_entries(names: Sequence[str], alphas: Sequence[float], betas: Sequence[float]):
    """(name, alpha, beta) per function; alphas and betas are consumed in order by the
    functions that take them (ORT's ``ActivationFuncs``)."""
    ia, ib = iter(alphas), iter(betas)
    out = []
    for raw in names:
        name = raw.lower()
        if name not in _ARG_USAGE:
            raise OpError(f"activation {raw!r} is not one of {sorted(_ARG_USAGE)}")
        need_a, need_b = _ARG_USAGE[name]
        da, db = _ARG_DEFAULTS.get(name, (0.0, 0.0))
        alpha = float(next(ia, da)) if need_a else 0.0
        beta = float(next(ib, db)) if need_b else 0.0
        out.append((name, F32(alpha), F32(beta)))
    return out


def _activate(entry, v: np.ndarray) -> np.ndarray:
    name, a, b = entry
    with np.errstate(over="ignore", invalid="ignore"):
        if name == "sigmoid":
            return mlas_logistic(v)
        if name == "tanh":
            return mlas_tanh(v)
        if name == "relu":
            return np.maximum(v, F32(0))
        if name == "affine":
            return a * v + b
        if name == "leakyrelu":
            return np.where(v >= 0, v, a * v)
        if name == "thresholdedrelu":
            return np.where(v > a, v, F32(0))
        if name == "scaledtanh":
            return a * np.tanh(b * v)
        if name == "hardsigmoid":
            return np.minimum(np.maximum(a * v + b, F32(0)), F32(1))
        if name == "elu":
            return np.where(v >= 0, v, a * (np.exp(v) - F32(1)))
        if name == "softsign":
            return v / (F32(1) + np.abs(v))
        return np.log(F32(1) + np.exp(v))  # softplus


def _quantize_block(a: np.ndarray) -> tuple[np.ndarray, np.float32, int]:
    """Eq. (1) of the module docstring on one block (any shape), all float32."""
    lo = min(F32(0), F32(a.min())) if a.size else F32(0)
    hi = max(F32(0), F32(a.max())) if a.size else F32(0)
    scale = F32(1.0) if hi == lo else F32(F32(hi - lo) / F32(255))
    z0 = np.clip(F32(0) - F32(lo / scale), F32(0), F32(255))
    zp = int(np.rint(z0))
    q = np.clip(np.rint(a / scale) + F32(zp), 0, 255)
    return q, scale, zp


def _weight_zero_point(zp: np.ndarray, d: int, what: str) -> int:
    """The weight zero point ORT uses: the first element (of direction d)."""
    z = np.asarray(zp)
    z = z[d] if z.ndim >= 1 and z.shape[0] > d else z
    flat = np.ravel(z)
    if flat.size > 1 and np.any(flat != flat[0]):
        raise OpError(f"{what}: per-column zero points must all be equal (ORT reads the first)")
    if z.dtype == np.int8 and flat.size and flat[0] != 0:
        raise OpError(f"{what}: an int8 weight's zero point must be zero")
    return int(flat[0]) if flat.size else 0


def _direction_scale(scale: np.ndarray, d: int, n: int, what: str) -> np.ndarray:
    s = np.asarray(scale, F32)
    if s.ndim == 1:
        return np.full(n, s[d], F32)
    if s.ndim == 2 and s.shape[1] == n:
        return s[d]
    raise OpError(f"{what}: expected shape [D] or [D, {n}], got {list(s.shape)}")


class _QWeight:
    """One direction's quantized weight [K, 4H] as exact float64 (w − zw) and its scale;
    ``saturating``: int8 codes whose pairs of products saturate (eq. (2), (QM1))."""

    def __init__(self, w: np.ndarray, scale: np.ndarray, zp: int, saturating: bool = False):
        self.centered = w.astype(_F64) - zp  # |w − zw| <= 255: every product and sum exact
        self.scale = scale
        # the raw codes [4H, K] the saturating pairs read (an int8 weight's zw is 0)
        self.sat_codes = w.T.astype(np.int64) if saturating and w.dtype == np.int8 else None

    def gemm(self, a: np.ndarray) -> np.ndarray:
        """f32(acc) and the multiplier m of eq. (2) for one quantization block of rows ``a``."""
        q, s, z = _quantize_block(a)
        acc = (q.astype(_F64) - z) @ self.centered  # exact: |terms| <= 255·255, K << 2^37
        if self.sat_codes is not None:
            acc = acc + saturation_correction(q.reshape(-1, q.shape[-1]), self.sat_codes).reshape(acc.shape)
        return acc.astype(F32), (s * self.scale).astype(F32)


def _reverse_rows(x: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """ORT's ReverseSequence: row b's first len[b] steps reversed, the rest in place."""
    out = x.copy()
    for b, n in enumerate(lens):
        out[:n, b] = x[:n, b][::-1]
    return out


def _one_direction(
    x, w, r, bias, peep, h0, c0, lens, reverse, acts, clip, input_forget, want_y, rows_per_block
):
    T, B, _ = x.shape
    H = r.centered.shape[0]
    L = int(lens.max())
    lmin = min(T, int(lens.min()))
    xs = _reverse_rows(x, lens) if reverse else x
    acc, m = w.gemm(xs[:L].reshape(L * B, -1))
    gates = (acc * m).reshape(L, B, 4 * H)  # ZeroMode: G = f32(f32(acc) · m)
    f_act, g_act, h_act = acts
    h_prev = h0.copy()
    c = c0.copy()
    y = np.zeros((T, B, H), F32)
    yh = np.zeros((B, H), F32)
    yc = np.zeros((B, H), F32)
    bi = bo = bf = bc = None
    if bias is not None:
        wb, rb = bias[: 4 * H], bias[4 * H :]
        fused = (wb + rb).astype(F32)
        bi, bo, bf, bc = fused[:H], fused[H : 2 * H], fused[2 * H : 3 * H], fused[3 * H :]
    clip_v = F32(clip)

    def pre(v, bterm):
        if bterm is not None:
            v = v + bterm
        return np.maximum(np.minimum(v, clip_v), -clip_v)

    block = B if rows_per_block is None else max(1, int(rows_per_block))
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(L):
            g = gates[t]
            for start in range(0, B, block):
                rows = slice(start, min(B, start + block))
                acc_h, m_h = r.gemm(h_prev[rows])
                g[rows] = acc_h * m_h + g[rows]  # AccumulateMode: two roundings
            gi, go, gf, gc = g[:, :H], g[:, H : 2 * H], g[:, 2 * H : 3 * H], g[:, 3 * H :]
            if peep is not None:
                gi = gi + c * peep[:H]
            i = _activate(f_act, pre(gi, bi))
            if input_forget:
                f = F32(1) - i
            else:
                if peep is not None:
                    gf = gf + c * peep[2 * H :]
                f = _activate(f_act, pre(gf, bf))
            gg = _activate(g_act, pre(gc, bc))
            c_new = c * f + i * gg
            if peep is not None:
                go = go + c_new * peep[H : 2 * H]
            o = _activate(f_act, pre(go, bo))
            h = _activate(h_act, c_new) * o
            active = ((t < lens) | (t < lmin))[:, None]
            c = np.where(active, c_new, c).astype(F32)
            if want_y:
                y[t] = np.where(active, h, F32(0))
                h_prev = y[t]
            else:
                yh = np.where(active, h, yh).astype(F32)
                h_prev = yh
            done = (t + 1) == lens
            yc[done] = c[done]
    if want_y:
        for b, n in enumerate(lens):
            yh[b] = y[n - 1, b] if n > 0 else 0
        if reverse:
            y = _reverse_rows(y, lens)
    yh[lens == 0] = 0
    yc[lens == 0] = 0
    return y, yh, yc


def dynamic_quantize_lstm(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    initial_c: np.ndarray | None = None,
    p: np.ndarray | None = None,
    w_scale: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    r_scale: np.ndarray | None = None,
    r_zero_point: np.ndarray | None = None,
    *,
    hidden_size: int,
    direction: str = "forward",
    activations: Sequence[str] | None = None,
    activation_alpha: Sequence[float] = (),
    activation_beta: Sequence[float] = (),
    clip: float | None = None,
    input_forget: int = 0,
    want_y: bool = True,
    rows_per_block: int | None = None,
    saturating_pairs: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y [T, D, B, H], Y_h [D, B, H], Y_c [D, B, H]) by the module docstring's steps.
    ``want_y = False`` is ORT's path when the node does not ask for Y (step (4));
    ``rows_per_block`` is the H quantization block of a multi-threaded ORT;
    ``saturating_pairs``: step (2)'s int8 products as ORT's u8·s8 kernels without VNNI."""
    if direction not in ("forward", "reverse", "bidirectional"):
        raise OpError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    D = 2 if direction == "bidirectional" else 1
    H = int(hidden_size)
    x = np.asarray(x, F32)
    if x.ndim != 3:
        raise OpError(f"X must have rank 3 [seq, batch, input], got shape {list(x.shape)}")
    T, B, n_in = x.shape
    for name, t, k in (("W", w, n_in), ("R", r, H)):
        if t.ndim != 3 or t.shape != (D, k, 4 * H) or t.dtype not in (np.int8, np.uint8):
            raise OpError(
                f"{name} must be int8/uint8 of shape [{D}, {k}, {4 * H}], got {t.dtype}{list(t.shape)}"
            )
    if w_scale is None or w_zero_point is None or r_scale is None or r_zero_point is None:
        raise OpError("W_scale, W_zero_point, R_scale and R_zero_point are required")
    if clip is None:
        clip = _FLT_MAX
    if not clip > 0:
        raise OpError(f"clip must be > 0, got {clip}")
    if activations is None or len(activations) == 0:
        activations = ["sigmoid", "tanh", "tanh"] * D
    if len(activations) != 3 * D:
        raise OpError(f"expected {3 * D} activations for direction {direction}, got {len(activations)}")
    acts = _activation_entries(activations, activation_alpha, activation_beta)
    if sequence_lens is None:
        lens = np.full(B, T, np.int64)
    else:
        lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
        if lens.shape != (B,) or np.any(lens < 0) or np.any(lens > T):
            raise OpError(f"sequence_lens must be {B} values in [0, {T}], got {lens.tolist()}")
    y = np.zeros((T, D, B, H), F32)
    yh = np.zeros((D, B, H), F32)
    yc = np.zeros((D, B, H), F32)
    if B == 0 or int(lens.max()) == 0:
        return y, yh, yc
    for d in range(D):
        wq = _QWeight(
            w[d],
            _direction_scale(w_scale, d, 4 * H, "W_scale"),
            _weight_zero_point(w_zero_point, d, "W_zero_point"),
            bool(saturating_pairs),
        )
        rq = _QWeight(
            r[d],
            _direction_scale(r_scale, d, 4 * H, "R_scale"),
            _weight_zero_point(r_zero_point, d, "R_zero_point"),
            bool(saturating_pairs),
        )
        bias = None if b is None else np.asarray(b, F32)[d]
        peep = None if p is None else np.asarray(p, F32)[d]
        h0 = np.zeros((B, H), F32) if initial_h is None else np.asarray(initial_h, F32)[d].copy()
        c0 = np.zeros((B, H), F32) if initial_c is None else np.asarray(initial_c, F32)[d].copy()
        reverse = direction == "reverse" or d == 1
        y[:, d], yh[d], yc[d] = _one_direction(
            x,
            wq,
            rq,
            bias,
            peep,
            h0,
            c0,
            lens,
            reverse,
            acts[3 * d : 3 * d + 3],
            clip,
            input_forget,
            want_y,
            rows_per_block,
        )
    return y, yh, yc


def _y_requested(ctx: OpContext) -> bool:
    """Whether the node names its Y output (ORT's two paths of step (4)): the node proto
    a kernel receives writes an omitted output as "", as the file does."""
    outs = getattr(ctx.onnx_node, "output", None)
    if outs is None:
        return ctx.n_outputs >= 1
    return len(outs) > 0 and outs[0] != ""


class DqLstmInputs(NamedTuple):
    """The node's inputs by ONNX position (an omitted optional input is None)."""

    x: np.ndarray
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray | None = None
    sequence_lens: np.ndarray | None = None
    initial_h: np.ndarray | None = None
    initial_c: np.ndarray | None = None
    p: np.ndarray | None = None
    w_scale: np.ndarray | None = None
    w_zero_point: np.ndarray | None = None
    r_scale: np.ndarray | None = None
    r_zero_point: np.ndarray | None = None


@refuses("DynamicQuantizeLSTM", MS_DOMAIN)
def _dq_lstm_refusal(attrs: dict[str, Any], given: list[bool]) -> str | None:
    del given
    return "layout = 1 (batch first) is not supported (ORT: neither)" if int(attrs.get("layout", 0)) else None


@register("DynamicQuantizeLSTM", MS_DOMAIN)
def dynamic_quantize_lstm_op(
    ctx: OpContext, *inputs: np.ndarray | None, layout: int = 0, **attrs: Any
) -> tuple[np.ndarray, ...]:
    """The inputs of :class:`DqLstmInputs`; ``attrs`` the keywords of dynamic_quantize_lstm."""
    if layout != 0:
        raise OpError("layout = 1 (batch first) is not supported (ORT: neither)")
    outs = dynamic_quantize_lstm(*DqLstmInputs(*inputs), want_y=_y_requested(ctx), **attrs)
    return outs[: max(1, ctx.n_outputs)]
