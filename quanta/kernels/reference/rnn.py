"""ai.onnx LSTM and GRU in float32, every operation in a fixed order (normative reference;
the native twin is kernels/cpp/recurrent/float_rnn.h, bit for bit).

The ONNX spec defines the math, not the order of a float32 computation; this module fixes
one (docs/float-ops.md (RNN1)-(RNN9)), which the C++ kernel follows on every ISA:

(RNN1) matrix products ``y[m, n] = Σ_k a[m, k] · w[k, n]`` (w: the ONNX weight transposed)
       accumulate from +0 in increasing k, one rounding per product and one per sum:
       ``acc = f32(acc + f32(a[m, k] · w[k, n]))``. No FMA, no pairwise or blocked sum:
       the error is the recursive-summation bound ``|err| <= γ_K Σ_k |a[m, k] w[k, n]|``.
(RNN2) per step and row, the gate pre-activation ``a = f32(xw + hr)`` (xw: X·Wᵀ of the
       row's time step, hr: H·Rᵀ), then the terms below in the order written, the bias
       being ``f32(Wb + Rb)`` (Wb and Rb of the gate's column).
LSTM (gates i, o, f, c in W's rows; P = peephole i, o, f):
(RNN3) ``i = σ(clip(f32(f32(a_i + f32(p_i · c)) + b_i)))``, f likewise with p_f (or
       ``f32(1 − i)`` with input_forget), ``g = tanh(clip(f32(a_c + b_c)))``
       (terms absent when P or B is)
(RNN4) ``c' = f32(f32(f · c) + f32(i · g))``
(RNN5) ``o = σ(clip(f32(f32(a_o + f32(p_o · c')) + b_o)))``, ``h' = f32(o · tanh(c'))``
GRU (gates z, r, h):
(RNN6) ``z = σ(clip(f32(a_z + b_z)))``, r likewise
(RNN7) linear_before_reset = 0: ``h~ = tanh(clip(f32(f32(xw_h + f32((r ⊙ h)·R_hᵀ)) + b_h)))``,
       the product by (RNN1) over the row ``f32(r · h)``
(RNN8) linear_before_reset = 1: ``h~ = tanh(clip(f32(f32(xw_h + f32(r · f32(hr_h + Rb_h))) + Wb_h)))``
(RNN9) ``h' = f32(f32(f32(1 − z) · h~) + f32(z · h))``

``clip(v) = min(max(v, −clip), clip)`` (none by default), σ and tanh the float-ops
family's ``sigmoid_f32`` and ``tanh_f32`` (docs/float-ops.md (Σ1)-(Σ2), (T1)-(T4)).

Directions run on their own (reverse: a row's steps from its last valid one down); a row
past its sequence length is not computed: its Y rows are 0 and its state is kept; Y_h
(and Y_c) hold the state after step ``len[b] − 1``, and 0 for ``len[b] = 0`` (ONNX Runtime's
DeepCPU kernels; the spec leaves it open). ``layout = 1`` transposes X, the initial states
and the outputs around the same computation.

Activations other than the defaults (LSTM sigmoid, tanh, tanh; GRU sigmoid, tanh) are
computed by ``onnx.reference`` (delegate.py), whose order is its own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from quanta.kernels.reference.delegate import delegate_to_onnx_reference
from quanta.kernels.reference.float_ops import fma_f32, sigmoid_f32, tanh_f32
from quanta.kernels.reference.ms_lstm import TANH_P, TANH_Q, mlas_logistic, mlas_tanh
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = [
    "MLAS_SGEMM_STRIDEK",
    "deepcpu_sigmoid",
    "deepcpu_tanh",
    "default_activations",
    "gru",
    "gru_gates",
    "lstm",
    "lstm_gates",
    "mlas_sgemm_blocks",
    "seq_matmul",
]

F32 = np.float32
_FLT_MAX = float(np.finfo(np.float32).max)


def seq_matmul(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """(RNN1): ``a [M, K] · w [K, N]`` accumulated in increasing k from +0, float32.

    >>> seq_matmul(np.array([[1e8, 1.0, -1e8]], np.float32), np.ones((3, 1), np.float32)).tolist()
    [[0.0]]"""
    a = np.asarray(a, F32)
    w = np.asarray(w, F32)
    acc = np.zeros((a.shape[0], w.shape[1]), F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(a.shape[1]):
            acc = acc + a[:, k : k + 1] * w[k]
    return acc


#: K columns per block of MLAS's float GEMM on packed weights (ONNX Runtime's float LSTM
#: prepacks W and R; measured bit for bit against ORT 1.32 on x86-64 with FMA).
MLAS_SGEMM_STRIDEK = 256


def mlas_sgemm_blocks(a: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    """``a [M, K] · w [K, N]`` as ONNX Runtime's MLAS float GEMM forms it (x86-64, FMA
    kernels): per block of :data:`MLAS_SGEMM_STRIDEK` k, one fused multiply-add chain from
    +0 in increasing k (``acc = fma(a[m, k], w[k, n], acc)``); the partial sums, in order,
    are what the kernel adds to its output one float32 addition each (docs/float-ops.md
    (RNN-ORT))."""
    a = np.asarray(a, F32)
    w = np.asarray(w, F32)
    parts = []
    with np.errstate(over="ignore", invalid="ignore"):
        for k0 in range(0, max(1, a.shape[1]), MLAS_SGEMM_STRIDEK):
            acc = np.zeros((a.shape[0], w.shape[1]), F32)
            for k in range(k0, min(a.shape[1], k0 + MLAS_SGEMM_STRIDEK)):
                acc = fma_f32(a[:, k : k + 1], w[k][None, :], acc)
            parts.append(acc)
    return parts


def default_activations(op: str, activations: Sequence[Any] | None, directions: int) -> bool:
    """Whether a node's ``activations`` are the op's defaults (the functions this module
    computes in its fixed order)."""
    if not activations:
        return True
    names = [a.decode() if isinstance(a, bytes) else str(a) for a in activations]
    want = ["sigmoid", "tanh", "tanh"] if op == "LSTM" else ["sigmoid", "tanh"]
    return [n.lower() for n in names] == want * directions


def _clip(v: np.ndarray, clip: np.float32 | None) -> np.ndarray:
    if clip is None:
        return v
    return np.minimum(np.maximum(v, -clip), clip)


def _lens(sequence_lens: np.ndarray | None, T: int, B: int, op: str) -> np.ndarray:
    if sequence_lens is None:
        return np.full(B, T, np.int64)
    lens = np.asarray(sequence_lens).astype(np.int64).reshape(-1)
    if lens.shape != (B,) or np.any(lens < 0) or np.any(lens > T):
        raise OpError(f"{op}: sequence_lens must be {B} values in [0, {T}], got {lens.tolist()}")
    return lens


def _step_rows(lens: np.ndarray, s: int, reverse: bool) -> tuple[np.ndarray, np.ndarray]:
    """Rows active at step s and the time index each reads and writes."""
    rows = np.flatnonzero(s < lens)
    ts = lens[rows] - 1 - s if reverse else np.full(rows.size, s, np.int64)
    return rows, ts


def _one_block(a: np.ndarray, w: np.ndarray) -> list[np.ndarray]:
    """(RNN1) as the single partial sum :func:`_lstm_direction` adds."""
    return [seq_matmul(a, w)]


def _lstm_direction(
    x, w, r, bias, peep, h, c, lens, reverse, clip, input_forget, blocks=_one_block, sig=None, th=None
):
    """One direction of an LSTM. ``blocks(a, w)`` gives the product ``a · w`` as partial
    sums that are added in order (to zero for X·W, to the step's X·W row for H·R);
    ``sig`` / ``th`` are the gate functions (default ``sigmoid_f32`` / ``tanh_f32``)."""
    sig = sigmoid_f32 if sig is None else sig
    th = tanh_f32 if th is None else th
    T, B, _ = x.shape
    H = r.shape[1]
    L = int(lens.max()) if B else 0
    y = np.zeros((T, B, H), F32)
    yh = np.zeros((B, H), F32)
    yc = np.zeros((B, H), F32)
    if L == 0:
        return y, yh, yc
    parts = blocks(x[:L].reshape(L * B, -1), np.ascontiguousarray(w.T))
    xw = parts[0]
    for part in parts[1:]:
        xw = xw + part
    xw = xw.reshape(L, B, 4 * H)
    rt = np.ascontiguousarray(r.T)
    b = None if bias is None else (bias[: 4 * H] + bias[4 * H :]).astype(F32)
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(L):
            hr = blocks(h, rt)
            rows, ts = _step_rows(lens, s, reverse)
            a = xw[ts, rows]
            for part in hr:
                a = a + part[rows]  # (RNN2)
            cp = c[rows]
            ai, ao, af, ac = a[:, :H], a[:, H : 2 * H], a[:, 2 * H : 3 * H], a[:, 3 * H :]
            if peep is not None:
                ai = ai + peep[:H] * cp
                af = af + peep[2 * H :] * cp
            if b is not None:
                ai, af, ac = ai + b[:H], af + b[2 * H : 3 * H], ac + b[3 * H :]
            i = sig(_clip(ai, clip))  # (RNN3)
            f = F32(1) - i if input_forget else sig(_clip(af, clip))
            g = th(_clip(ac, clip))
            cn = f * cp + i * g  # (RNN4)
            if peep is not None:
                ao = ao + peep[H : 2 * H] * cn
            if b is not None:
                ao = ao + b[H : 2 * H]
            o = sig(_clip(ao, clip))  # (RNN5)
            hn = o * th(cn)
            c[rows] = cn
            h[rows] = hn
            y[ts, rows] = hn
            done = lens[rows] == s + 1
            yh[rows[done]] = hn[done]
            yc[rows[done]] = cn[done]
    return y, yh, yc


def _gru_direction(x, w, r, bias, h, lens, reverse, clip, linear_before_reset):
    T, B, _ = x.shape
    H = r.shape[1]
    L = int(lens.max()) if B else 0
    y = np.zeros((T, B, H), F32)
    yh = np.zeros((B, H), F32)
    if L == 0:
        return y, yh
    xw = seq_matmul(x[:L].reshape(L * B, -1), np.ascontiguousarray(w.T)).reshape(L, B, 3 * H)
    rt = np.ascontiguousarray(r.T)
    b = rb_h = None
    if bias is not None:
        b = (bias[: 3 * H] + bias[3 * H :]).astype(F32)
        if linear_before_reset:
            b[2 * H :] = bias[2 * H : 3 * H]
            rb_h = bias[5 * H :]
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(L):
            hr = seq_matmul(h, rt if linear_before_reset else rt[:, : 2 * H])
            rows, ts = _step_rows(lens, s, reverse)
            xg = xw[ts, rows]
            azr = xg[:, : 2 * H] + hr[rows, : 2 * H]  # (RNN2)
            if b is not None:
                azr = azr + b[: 2 * H]
            zr = sigmoid_f32(_clip(azr, clip))  # (RNN6)
            z, rg = zr[:, :H], zr[:, H:]
            hp = h[rows]
            if linear_before_reset:  # (RNN8)
                u = hr[rows, 2 * H :]
                if rb_h is not None:
                    u = u + rb_h
                ah = xg[:, 2 * H :] + rg * u
            else:  # (RNN7)
                ah = xg[:, 2 * H :] + seq_matmul(rg * hp, rt[:, 2 * H :])
            if b is not None:
                ah = ah + b[2 * H :]
            hh = tanh_f32(_clip(ah, clip))
            hn = (F32(1) - z) * hh + z * hp  # (RNN9)
            h[rows] = hn
            y[ts, rows] = hn
            done = lens[rows] == s + 1
            yh[rows[done]] = hn[done]
    return y, yh


def _deepcpu_rational(x: np.ndarray) -> np.ndarray:
    """x·P(x²) / Q(x²) with every Horner step an f32 product then an f32 sum (ORT compiles
    that file for baseline x86-64: no FMA contraction); P, Q are MLAS's tanh constants
    (``deepcpu`` in rnn_helpers.cc has the same)."""
    x2 = x * x
    p = x2 * TANH_P[0] + TANH_P[1]
    for c in TANH_P[2:]:
        p = x2 * p + c
    p = x * p
    q = x2 * TANH_Q[0] + TANH_Q[1]
    for c in TANH_Q[2:]:
        q = x2 * q + c
    return p / q


def _clamp_keep_nan(x: np.ndarray, b: np.float32) -> np.ndarray:
    return np.where(x < -b, -b, np.where(x > b, b, x)).astype(F32)


def deepcpu_sigmoid(x: np.ndarray) -> np.ndarray:
    """ORT's GRU reset gate (``gru_reset_gate_sigmoid``): x clamped to [−20, 20],
    f32(0.5 · f32(1 + rational(f32(0.5 · x))))."""
    with np.errstate(over="ignore", invalid="ignore"):
        v = F32(0.5) * _clamp_keep_nan(np.asarray(x, F32), F32(20.0))
        return (F32(0.5) * (F32(1.0) + _deepcpu_rational(v))).astype(F32)


def deepcpu_tanh(x: np.ndarray) -> np.ndarray:
    """ORT's GRU output gate (``gru_output_gate_tanh``): rational(x clamped to [−10, 10])."""
    with np.errstate(over="ignore", invalid="ignore"):
        return _deepcpu_rational(_clamp_keep_nan(np.asarray(x, F32), F32(10.0))).astype(F32)


def _ort_clip(x: np.ndarray, bias: np.ndarray | None, clip: np.float32) -> np.ndarray:
    """ORT's ``clip_add_bias`` (x + b, then std::min(clip, ·), std::max(−clip, ·): a NaN
    becomes clip) or, without a bias, ``clip_ignore_bias`` (a NaN stays)."""
    if bias is None:
        return _clamp_keep_nan(x, clip)
    v = x + bias
    v = np.where(v < clip, v, clip)
    return np.where(-clip < v, v, -clip).astype(F32)


def _sum_blocks(parts: list[np.ndarray], y: np.ndarray | None = None) -> np.ndarray:
    """MLAS's output of a GEMM by blocks: the first block's sum itself (beta 0, y None) or
    added onto y (beta 1), then every later block added, one f32 addition each."""
    for part in parts:
        y = part if y is None else part + y
    assert y is not None
    return y


def _ort_gru_direction(x, w, r, bias, h, lens, reverse, clip, linear_before_reset):
    """One direction of ONNX Runtime's CPU GRU (deep_cpu_gru.cc, UniDirectionalGru) in
    float32 (docs/float-ops.md (RNN-ORT-GRU)). ``clip`` is ORT's: FLT_MAX when unset."""
    T, B, _ = x.shape
    H = r.shape[1]
    L = int(lens.max()) if B else 0
    y = np.zeros((T, B, H), F32)
    yh = np.zeros((B, H), F32)
    if L == 0:
        return y, yh
    xw = _sum_blocks(mlas_sgemm_blocks(x[:L].reshape(L * B, -1), np.ascontiguousarray(w.T)))
    xw = xw.reshape(L, B, 3 * H)
    r_zr = np.ascontiguousarray(r[: 2 * H].T)
    r_h = np.ascontiguousarray(r[2 * H :].T)
    b_z = b_r = b_h = rb_h = None
    if bias is not None:
        b_z = bias[:H] + bias[3 * H : 4 * H]
        b_r = bias[H : 2 * H] + bias[4 * H : 5 * H]
        b_h = bias[2 * H : 3 * H] if linear_before_reset else bias[2 * H : 3 * H] + bias[5 * H :]
        rb_h = bias[5 * H :]
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(L):
            rows, ts = _step_rows(lens, s, reverse)
            a = xw[ts, rows]
            hp = h[rows]
            zr = _sum_blocks([p[rows] for p in mlas_sgemm_blocks(h, r_zr)], a[:, : 2 * H])
            rg = deepcpu_sigmoid(_ort_clip(zr[:, H:], b_r, clip))
            if linear_before_reset:  # rt ⊙ (H·Rhᵀ + Rbh), added onto X·Whᵀ
                parts = [p[rows] for p in mlas_sgemm_blocks(h, r_h)]
                lin = _sum_blocks(parts, None if rb_h is None else np.broadcast_to(rb_h, (rows.size, H)))
                ah = a[:, 2 * H :] + lin * rg
            else:  # (rt ⊙ H)·Rhᵀ by MLAS's GEMM onto X·Whᵀ
                ah = _sum_blocks(mlas_sgemm_blocks(hp * rg, r_h), a[:, 2 * H :])
            z = mlas_logistic(_ort_clip(zr[:, :H], b_z, clip))
            hh = deepcpu_tanh(_ort_clip(ah, b_h, clip))
            hn = (F32(1) - z) * hh + z * hp
            h[rows] = hn
            y[ts, rows] = hn
            done = lens[rows] == s + 1
            yh[rows[done]] = hn[done]
    return y, yh


def _prepare(op: str, x, w, r, gates: int, hidden_size: int, direction: str, layout: int, states):
    if direction not in ("forward", "reverse", "bidirectional"):
        raise OpError(f"{op}: direction must be forward, reverse or bidirectional, got {direction!r}")
    D = 2 if direction == "bidirectional" else 1
    x = np.asarray(x, F32)
    if x.ndim != 3:
        raise OpError(f"{op}: X must have rank 3, got shape {list(x.shape)}")
    if layout == 1:
        x = x.transpose(1, 0, 2)
        states = [None if s is None else np.asarray(s, F32).transpose(1, 0, 2) for s in states]
    H = int(hidden_size)
    n_in = x.shape[2]
    for name, t, k in (("W", w, n_in), ("R", r, H)):
        if np.shape(t) != (D, gates * H, k):
            raise OpError(f"{op}: {name} must have shape [{D}, {gates * H}, {k}], got {list(np.shape(t))}")
    return D, H, np.ascontiguousarray(x), [None if s is None else np.asarray(s, F32) for s in states]


def _finish(layout: int, y: np.ndarray, *states: np.ndarray) -> tuple[np.ndarray, ...]:
    if layout == 1:
        return (
            np.ascontiguousarray(y.transpose(2, 0, 1, 3)),
            *(np.ascontiguousarray(s.transpose(1, 0, 2)) for s in states),
        )
    return (y, *states)


def lstm(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    initial_c=None,
    p=None,
    *,
    hidden_size: int,
    direction: str = "forward",
    clip: float | None = None,
    input_forget: int = 0,
    layout: int = 0,
    functions: str = "onnx",
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Y, Y_h, Y_c) of an ONNX LSTM with the default activations, by (RNN1)-(RNN5);
    ``functions="ort"``: ONNX Runtime's float LSTM instead (:func:`mlas_sgemm_blocks` for
    the products, MLAS's logistic and tanh for the gates; docs/float-ops.md (RNN-ORT))."""
    if functions not in ("onnx", "ort"):
        raise OpError(f"LSTM: functions must be 'onnx' or 'ort', got {functions!r}")
    extra: dict[str, Any] = {}
    if functions == "ort":
        extra = {"blocks": mlas_sgemm_blocks, "sig": mlas_logistic, "th": mlas_tanh}
    D, H, x, (h0, c0) = _prepare("LSTM", x, w, r, 4, hidden_size, direction, layout, [initial_h, initial_c])
    T, B, _ = x.shape
    lens = _lens(sequence_lens, T, B, "LSTM")
    clip_v = None if clip is None else F32(clip)
    y = np.zeros((T, D, B, H), F32)
    yh = np.zeros((D, B, H), F32)
    yc = np.zeros((D, B, H), F32)
    for d in range(D):
        h = np.zeros((B, H), F32) if h0 is None else h0[d].copy()
        c = np.zeros((B, H), F32) if c0 is None else c0[d].copy()
        y[:, d], yh[d], yc[d] = _lstm_direction(
            x,
            np.asarray(w[d], F32),
            np.asarray(r[d], F32),
            None if b is None else np.asarray(b, F32)[d],
            None if p is None else np.asarray(p, F32)[d],
            h,
            c,
            lens,
            direction == "reverse" or d == 1,
            clip_v,
            input_forget,
            **extra,
        )
    return _finish(layout, y, yh, yc)


def gru(
    x,
    w,
    r,
    b=None,
    sequence_lens=None,
    initial_h=None,
    *,
    hidden_size: int,
    direction: str = "forward",
    clip: float | None = None,
    linear_before_reset: int = 0,
    layout: int = 0,
    functions: str = "onnx",
) -> tuple[np.ndarray, np.ndarray]:
    """(Y, Y_h) of an ONNX GRU with the default activations, by (RNN1), (RNN2), (RNN6)-(RNN9);
    ``functions="ort"``: ONNX Runtime's float GRU instead (:func:`mlas_sgemm_blocks` for the
    products, MLAS's logistic for z, ORT's own rational sigmoid and tanh for r and h;
    docs/float-ops.md (RNN-ORT-GRU))."""
    if functions not in ("onnx", "ort"):
        raise OpError(f"GRU: functions must be 'onnx' or 'ort', got {functions!r}")
    D, H, x, (h0,) = _prepare("GRU", x, w, r, 3, hidden_size, direction, layout, [initial_h])
    T, B, _ = x.shape
    lens = _lens(sequence_lens, T, B, "GRU")
    clip_v = None if clip is None else F32(clip)
    step = _gru_direction
    if functions == "ort":
        step = _ort_gru_direction
        clip_v = F32(_FLT_MAX) if clip is None else F32(clip)
    y = np.zeros((T, D, B, H), F32)
    yh = np.zeros((D, B, H), F32)
    for d in range(D):
        h = np.zeros((B, H), F32) if h0 is None else h0[d].copy()
        y[:, d], yh[d] = step(
            x,
            np.asarray(w[d], F32),
            np.asarray(r[d], F32),
            None if b is None else np.asarray(b, F32)[d],
            h,
            lens,
            direction == "reverse" or d == 1,
            clip_v,
            linear_before_reset,
        )
    return _finish(layout, y, yh)


def _check_clip(op: str, clip: float | None) -> None:
    if clip is not None and not float(clip) > 0:
        raise OpError(f"{op}: clip must be > 0, got {clip}")


def _float32(op: str, *arrays: np.ndarray | None) -> bool:
    return all(a is None or np.asarray(a).dtype == F32 for a in arrays)


def _rnn_op(op: str, fn: Callable[..., tuple[np.ndarray, ...]]) -> Callable[..., tuple[np.ndarray, ...]]:
    """The ai.onnx ``op`` (LSTM, GRU) on ``fn`` (lstm, gru: ``attrs`` are its keywords):
    float32 with the default activations runs ``fn``; anything else is delegated to
    onnx.reference."""

    def op_fn(
        ctx: OpContext,
        *inputs: np.ndarray | None,
        activations: Sequence[str] | None = None,
        activation_alpha: Sequence[float] = (),
        activation_beta: Sequence[float] = (),
        **attrs: Any,
    ) -> tuple[np.ndarray, ...]:
        D = 2 if attrs.get("direction", "forward") == "bidirectional" else 1
        # every input but sequence_lens (input 4, int32) is float
        floats = [v for k, v in enumerate(inputs) if k != 4]
        if not default_activations(op, activations, D) or not _float32(op, *floats):
            acts = {
                "activations": activations,
                "activation_alpha": activation_alpha,
                "activation_beta": activation_beta,
            }
            given = {k: v for k, v in {**attrs, **acts}.items() if v not in (None, (), [])}
            return delegate_to_onnx_reference(ctx, inputs, given)
        _check_clip(op, attrs.get("clip"))
        return fn(*inputs, **attrs)[: max(1, ctx.n_outputs)]

    op_fn.__name__ = op_fn.__qualname__ = f"{fn.__name__}_op"
    return register(op)(op_fn)


lstm_op = _rnn_op("LSTM", lstm)
gru_op = _rnn_op("GRU", gru)


@register("LSTMGates", "quanta")
def lstm_gates(
    ctx: OpContext, gates: np.ndarray, c: np.ndarray, *, order: Sequence[int] = (0, 1, 2, 3)
) -> tuple[np.ndarray, np.ndarray]:
    """The elementwise half of an LSTM cell that an exporter wrote as Split -> 3 Sigmoid,
    Tanh -> Mul, Mul, Add, Tanh, Mul (torch's ``LSTMCell``; optimize_float fuses it,
    passes/rules/fuse_lstm_gates.py). ``gates [B, 4H]`` holds the pre-activations in four
    H-wide chunks; chunk ``order[0]`` is the input gate, ``order[1]`` the forget gate,
    ``order[2]`` the cell candidate, ``order[3]`` the output gate (torch: 0, 1, 2, 3):

    (LG1) ``i = σ(a_i)``, ``f = σ(a_f)``, ``g = tanh(a_g)``, ``o = σ(a_o)``
    (LG2) ``c' = f32(f32(f · c) + f32(i · g))``, ``h' = f32(o · tanh(c'))``

    σ and tanh are ``sigmoid_f32`` / ``tanh_f32``, the float Sigmoid and Tanh operators'
    own, so the fused node gives the bytes of the nodes it replaces. Returns (h', c')."""
    del ctx  # unused
    if gates.dtype != F32 or c.dtype != F32:
        raise OpError(f"LSTMGates: float32 gates and c expected, got {gates.dtype} / {c.dtype}")
    if gates.ndim != 2 or gates.shape[1] % 4:
        raise OpError(f"LSTMGates: gates must be [B, 4H], got shape {gates.shape}")
    h = gates.shape[1] // 4
    if c.shape != (gates.shape[0], h):
        raise OpError(f"LSTMGates: c must be [{gates.shape[0]}, {h}] like the gates' rows, got {c.shape}")
    if sorted(int(k) for k in order) != [0, 1, 2, 3]:
        raise OpError(f"LSTMGates: order must be a permutation of 0..3, got {list(order)}")
    chunk = [gates[:, int(k) * h : (int(k) + 1) * h] for k in order]
    i, f, o = sigmoid_f32(chunk[0]), sigmoid_f32(chunk[1]), sigmoid_f32(chunk[3])
    g = tanh_f32(chunk[2])
    c_new = (f * c + i * g).astype(F32)  # (LG2): each product and the sum rounded to float32
    return (o * tanh_f32(c_new)).astype(F32), c_new


@register("GRUGates", "quanta")
def gru_gates(
    ctx: OpContext, gx: np.ndarray, gh: np.ndarray, h: np.ndarray, *, order: Sequence[int] = (0, 1, 2)
) -> np.ndarray:
    """The elementwise half of a GRU cell that an exporter wrote as two Splits -> Add,
    Sigmoid, Add, Sigmoid, Mul, Add, Tanh, Sub, Mul, Add (torch's ``GRUCell``; optimize_float
    fuses it, passes/rules/fuse_gru_gates.py). ``gx [B, 3H]`` and ``gh [B, 3H]`` hold the
    input's and the state's products in three H-wide chunks; chunk ``order[0]`` is the
    reset gate, ``order[1]`` the update gate, ``order[2]`` the candidate, in both (torch:
    0, 1, 2):

    (GG1) ``r = σ(f32(gh_r + gx_r))``, ``z = σ(f32(gh_z + gx_z))``
    (GG2) ``n = tanh(f32(gx_n + f32(r · gh_n)))``
    (GG3) ``h' = f32(f32(f32(h − n) · z) + n)``

    σ and tanh are ``sigmoid_f32`` / ``tanh_f32``, the float Sigmoid and Tanh operators'
    own, so the fused node gives the bytes of the nodes it replaces. A row count of 1 in
    any input broadcasts, as in the replaced nodes. Returns h' [B, H]."""
    del ctx  # unused
    if gx.dtype != F32 or gh.dtype != F32 or h.dtype != F32:
        raise OpError(f"GRUGates: float32 gx, gh and h expected, got {gx.dtype} / {gh.dtype} / {h.dtype}")
    if gx.ndim != 2 or gx.shape[1] % 3:
        raise OpError(f"GRUGates: gx must be [B, 3H], got shape {gx.shape}")
    hs = gx.shape[1] // 3
    if gh.ndim != 2 or gh.shape[1] != gx.shape[1]:
        raise OpError(f"GRUGates: gh must be [B, {gx.shape[1]}] like gx, got {list(gh.shape)}")
    if h.ndim != 2 or h.shape[1] != hs:
        raise OpError(f"GRUGates: h must be [B, {hs}] like the gates' rows, got {list(h.shape)}")
    rows = {gx.shape[0], gh.shape[0], h.shape[0]}
    if len(rows - {1}) > 1:
        # the replaced Add / Mul / Sub broadcast a row of 1, and refuse other mismatches
        raise OpError(
            f"GRUGates: the rows of gx, gh and h ({gx.shape[0]}, {gh.shape[0]}, {h.shape[0]}) do not broadcast"
        )
    if sorted(int(k) for k in order) != [0, 1, 2]:
        raise OpError(f"GRUGates: order must be a permutation of 0..2, got {list(order)}")
    xs = [gx[:, int(k) * hs : (int(k) + 1) * hs] for k in order]
    ys = [gh[:, int(k) * hs : (int(k) + 1) * hs] for k in order]
    r = sigmoid_f32((ys[0] + xs[0]).astype(F32))  # (GG1)
    z = sigmoid_f32((ys[1] + xs[1]).astype(F32))
    n = tanh_f32((xs[2] + (r * ys[2]).astype(F32)).astype(F32))  # (GG2)
    return (((h - n).astype(F32) * z).astype(F32) + n).astype(F32)  # (GG3)
