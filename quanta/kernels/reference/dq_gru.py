"""quanta::DynamicQuantizeGRU: a GRU with int8 weights whose X and hidden state are
quantized at run time, DynamicQuantizeLSTM's arithmetic applied to the GRU's gates
(normative reference; docs/kernels.md "Dynamic int8 GRU", equations (DQG1)-(DQG6)).

ONNX Runtime has no dynamic GRU operator. The op is written with a model-local ONNX
function (quanta/quantize/dq_gru_function.py) whose body is standard ONNX
(DynamicQuantizeLinear, MatMulInteger, Sigmoid, Tanh, a Loop over time) computing the
operations below in this order, so ONNX Runtime runs the file; quanta runs the node on its
own kernel. Inputs::

    X [T, B, I] float32, W [D, I, 3H] and R [D, H, 3H] int8 or uint8 (the ONNX GRU weights
    transposed, gates in columns, ONNX order z r h), B [D, 6H] (Wb then Rb),
    sequence_lens [B] int32, initial_h [D, B, H], W_scale / W_zero_point and
    R_scale / R_zero_point [D] (per direction) or [D, 3H] (per column)

with D = 2 for ``bidirectional``; ``reverse`` reads row b's first len[b] steps backwards.
The weight zero point is the first element of its direction (the others must be equal;
int8 weights need zero), as DynamicQuantizeLSTM. Per direction, with L the longest
sequence length, every step one float32 operation:

(DQG1) dynamic uint8 quantization of a float block A (ms_lstm.py eq. (1), ONNX's
       DynamicQuantizeLinear): lo = min(0, min A), hi = max(0, max A),
       s = f32(hi − lo) / 255 (1 when hi = lo), z = rne(clamp(−f32(lo / s), 0, 255)),
       q = sat(rne(f32(a / s)) + z).
(DQG2) quantized product of a block with columns n of a weight:
       acc = Σ_k (q − z)(w − zw) exactly, out = f32(f32(acc) · f32(s · w_scale[n])).
       Gx = (DQG2) of the block X[:L] (all L·B rows) with W: all 3H columns.
(DQG3) per step t, the block Hq = the running h with the rows whose sequence has ended
       (t ≥ len[b]) set to 0 (a zero row never moves lo or hi); P = (DQG2) of Hq with R's
       z, r columns (and h columns with linear_before_reset).
(DQG4) z, r = σ(clip(f32(f32(Gx_zr + P_zr) + f32(Wb_zr + Rb_zr))))     (bias term with B only)
(DQG5) linear_before_reset = 0: the block Q = f32(r · Hq) (ended rows 0);
           a = f32(f32(Gx_h + (DQG2) of Q with R_h) + f32(Wb_h + Rb_h))
       linear_before_reset = 1: a = f32(f32(Gx_h + f32(r · f32(P_h + Rb_h))) + Wb_h)
(DQG6) h' = f32(f32(f32(1 − z) · tanh(clip(a))) + f32(z · h)) for t < len[b]; the other
       rows keep h. Y[t] = h' (0 for ended rows and for t ≥ L); Y_h = h at t = len[b] − 1
       (0 for len = 0).

σ and tanh are MLAS's (ms_lstm.mlas_logistic / mlas_tanh: ONNX Runtime's Sigmoid and
Tanh on x86-64, bit for bit); clip(v) = max(−clip, min(clip, v)), absent: none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from quanta.kernels.reference.ms_lstm import (
    _direction_scale,
    _quantize_block,
    _reverse_rows,
    _weight_zero_point,
    mlas_logistic,
    mlas_tanh,
)
from quanta.kernels.reference.registry import OpContext, OpError, refuses, register

__all__ = ["QUANTA_DOMAIN", "DqGruInputs", "dynamic_quantize_gru", "dynamic_quantize_gru_op"]

QUANTA_DOMAIN = "quanta"
F32 = np.float32
_F64 = np.float64


class _Weight:
    """One direction's quantized weight [K, 3H] as exact float64 (w − zw), its scales."""

    def __init__(self, w: np.ndarray, scale: np.ndarray, zp: int):
        self.centered = w.astype(_F64) - zp
        self.scale = scale

    def gemm(self, a: np.ndarray, cols: slice) -> np.ndarray:
        """(DQG1)+(DQG2) of the block ``a`` [M, K] with the columns ``cols``."""
        q, s, z = _quantize_block(a)
        acc = ((q.astype(_F64) - z) @ self.centered[:, cols]).astype(F32)  # exact: |terms| <= 255²
        return acc * (s * self.scale[cols]).astype(F32)


def _clip(v: np.ndarray, clip: float | None) -> np.ndarray:
    if clip is None:
        return v
    c = F32(clip)
    return np.maximum(np.minimum(v, c), -c)


def _one_direction(x, w, r, bias, h0, lens, reverse, lbr, clip):
    T, B, _ = x.shape
    H = r.centered.shape[0]
    L = int(lens.max())
    xs = _reverse_rows(x[:L], lens) if reverse else x[:L]
    gx = w.gemm(xs.reshape(L * B, -1), slice(None)).reshape(L, B, 3 * H)
    zr_cols, h_cols = slice(0, 2 * H), slice(2 * H, 3 * H)
    b_zr = b_h = rb_h = None
    if bias is not None:
        wb, rb = bias[: 3 * H], bias[3 * H :]
        b_zr = (wb[: 2 * H] + rb[: 2 * H]).astype(F32)
        if lbr:
            b_h, rb_h = wb[2 * H :], rb[2 * H :]
        else:
            b_h = (wb[2 * H :] + rb[2 * H :]).astype(F32)
    h = h0.copy()
    y = np.zeros((T, B, H), F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for t in range(L):
            active = (t < lens)[:, None]
            hq = np.where(active, h, F32(0))  # (DQG3)
            p = r.gemm(hq, slice(None) if lbr else zr_cols)
            v = gx[t, :, zr_cols] + p[:, zr_cols]  # (DQG4)
            if b_zr is not None:
                v = v + b_zr
            zr = mlas_logistic(_clip(v, clip))
            z, rr = zr[:, :H], zr[:, H:]
            if lbr:  # (DQG5)
                u = p[:, h_cols]
                if rb_h is not None:
                    u = u + rb_h
                a = gx[t, :, h_cols] + rr * u
            else:
                qb = np.where(active, rr * hq, F32(0))
                a = gx[t, :, h_cols] + r.gemm(qb, h_cols)
            if b_h is not None:
                a = a + b_h
            hn = (F32(1) - z) * mlas_tanh(_clip(a, clip)) + z * h  # (DQG6)
            h = np.where(active, hn, h).astype(F32)
            y[t] = np.where(active, hn, F32(0))
    if reverse:
        y[:L] = _reverse_rows(y[:L], lens)
    yh = np.where((lens > 0)[:, None], h, F32(0)).astype(F32)
    return y, yh


def dynamic_quantize_gru(
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b: np.ndarray | None = None,
    sequence_lens: np.ndarray | None = None,
    initial_h: np.ndarray | None = None,
    w_scale: np.ndarray | None = None,
    w_zero_point: np.ndarray | None = None,
    r_scale: np.ndarray | None = None,
    r_zero_point: np.ndarray | None = None,
    *,
    hidden_size: int,
    direction: str = "forward",
    linear_before_reset: int = 0,
    clip: float | None = None,
    activations: Sequence[str] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(Y [T, D, B, H], Y_h [D, B, H]) by the module docstring's (DQG1)-(DQG6)."""
    if direction not in ("forward", "reverse", "bidirectional"):
        raise OpError(f"direction must be forward, reverse or bidirectional, got {direction!r}")
    D = 2 if direction == "bidirectional" else 1
    H = int(hidden_size)
    if activations and [a.lower() for a in activations] != ["sigmoid", "tanh"] * D:
        raise OpError(f"activations must be Sigmoid, Tanh per direction, got {list(activations)}")
    x = np.asarray(x, F32)
    if x.ndim != 3:
        raise OpError(f"X must have rank 3 [seq, batch, input], got shape {list(x.shape)}")
    T, B, n_in = x.shape
    for name, t, k in (("W", w, n_in), ("R", r, H)):
        if t.ndim != 3 or t.shape != (D, k, 3 * H) or t.dtype not in (np.int8, np.uint8):
            raise OpError(
                f"{name} must be int8/uint8 of shape [{D}, {k}, {3 * H}], got {t.dtype}{list(t.shape)}"
            )
    if w_scale is None or w_zero_point is None or r_scale is None or r_zero_point is None:
        raise OpError("W_scale, W_zero_point, R_scale and R_zero_point are required")
    if clip is not None and not clip > 0:
        raise OpError(f"clip must be > 0, got {clip}")
    if b is not None and np.shape(b) != (D, 6 * H):
        raise OpError(f"B must have shape [{D}, {6 * H}], got {list(np.shape(b))}")
    if sequence_lens is None:
        lens = np.full(B, T, np.int64)
    else:
        lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
        if lens.shape != (B,) or np.any(lens < 0) or np.any(lens > T):
            raise OpError(f"sequence_lens must be {B} values in [0, {T}], got {lens.tolist()}")
    y = np.zeros((T, D, B, H), F32)
    yh = np.zeros((D, B, H), F32)
    if B == 0 or H == 0 or int(lens.max()) == 0:
        return y, yh
    for d in range(D):
        wq = _Weight(
            w[d],
            _direction_scale(w_scale, d, 3 * H, "W_scale"),
            _weight_zero_point(w_zero_point, d, "W_zero_point"),
        )
        rq = _Weight(
            r[d],
            _direction_scale(r_scale, d, 3 * H, "R_scale"),
            _weight_zero_point(r_zero_point, d, "R_zero_point"),
        )
        bias = None if b is None else np.asarray(b, F32)[d]
        h0 = np.zeros((B, H), F32) if initial_h is None else np.asarray(initial_h, F32)[d].copy()
        reverse = direction == "reverse" or d == 1
        y[:, d], yh[d] = _one_direction(x, wq, rq, bias, h0, lens, reverse, bool(linear_before_reset), clip)
    return y, yh


class DqGruInputs(NamedTuple):
    """The node's inputs by ONNX position (an omitted optional input is None)."""

    x: np.ndarray
    w: np.ndarray
    r: np.ndarray
    b: np.ndarray | None = None
    sequence_lens: np.ndarray | None = None
    initial_h: np.ndarray | None = None
    w_scale: np.ndarray | None = None
    w_zero_point: np.ndarray | None = None
    r_scale: np.ndarray | None = None
    r_zero_point: np.ndarray | None = None


@refuses("DynamicQuantizeGRU", QUANTA_DOMAIN)
def _dq_gru_refusal(attrs: dict[str, Any], given: list[bool]) -> str | None:
    """What the op does not define: batch-first layout, activations other than Sigmoid, Tanh."""
    del given
    if int(attrs.get("layout", 0)):
        return "layout = 1 (batch first) is not supported (the quantizer writes the op time-major)"
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in attrs.get("activations", ()) or ()]
    d = 2 if attrs.get("direction", "forward") in ("bidirectional", b"bidirectional") else 1
    if acts and [a.lower() for a in acts] != ["sigmoid", "tanh"] * d:
        return f"activations {acts}: the op computes Sigmoid, Tanh only"
    return None


@register("DynamicQuantizeGRU", QUANTA_DOMAIN)
def dynamic_quantize_gru_op(
    ctx: OpContext, *inputs: np.ndarray | None, layout: int = 0, **attrs: Any
) -> tuple[np.ndarray, ...]:
    """The inputs of :class:`DqGruInputs`; ``attrs`` the keywords of dynamic_quantize_gru
    (``activation_alpha`` / ``activation_beta`` are not used by Sigmoid and Tanh)."""
    if layout != 0:
        raise OpError("layout = 1 (batch first) is not supported")
    attrs.pop("activation_alpha", None)
    attrs.pop("activation_beta", None)
    outs = dynamic_quantize_gru(*DqGruInputs(*inputs), **attrs)
    return outs[: max(1, ctx.n_outputs)]
