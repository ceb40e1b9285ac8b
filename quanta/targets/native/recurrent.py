"""Native recurrent kernels: com.microsoft DynamicQuantizeLSTM on ``_native.dq_lstm``
(reference twin: reference/ms_lstm.py), quanta::DynamicQuantizeGRU on ``_native.dq_gru``
(twin: reference/dq_gru.py), ai.onnx LSTM and GRU in float32 on
``_native.float_rnn`` (twin: reference/rnn.py); bit-exact with the twins on every ISA.

The binder prepacks each direction's int8/uint8 W [I, 4H] and R [H, 4H] once, in the
qgemm layout of the active ISA with their column sums and the scalar zero point ONNX
Runtime reads (the first of a direction's), and broadcasts per-direction scales to the
[D, 4H] multipliers' columns. What the kernel does not compute natively — activations
other than the default sigmoid, tanh, tanh, layout = 1, weights that are not constants —
runs on the twin, with the reason in the plan. The float binders transpose each
direction's W and R once to [K, G·H] (docs/float-ops.md (RNN1)) and take the default
activations, layout 0 or 1.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.ms_lstm import (
    DqLstmInputs,
    _direction_scale,
    _weight_zero_point,
    _y_requested,
    dynamic_quantize_lstm_op,
)
from quanta.kernels.reference.registry import MS_DOMAIN, OpError, refusal
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import SMALL_MACS, into_places, step_threads
from quanta.targets.native._values import const_of as _const
from quanta.targets.native._values import threads

__all__ = [
    "bind_dynamic_quantize_gru",
    "bind_dynamic_quantize_lstm",
    "bind_gru",
    "bind_gru_gates",
    "bind_lstm",
    "bind_lstm_gates",
]

F32 = np.float32
_FLT_MAX = float(np.finfo(np.float32).max)
_DEFAULT_ACTS = ("sigmoid", "tanh", "tanh")
_SEQ_PANEL = 128  # float_rnn.h kSeqPanel


def _f32_or_none(a: np.ndarray | None) -> np.ndarray | None:
    return None if a is None else np.ascontiguousarray(a, dtype=F32)


def _dq_lstm_native(
    ctx: Any, *inputs: np.ndarray | None, out: tuple[np.ndarray | None, ...] | None = None, **attrs: Any
) -> tuple[np.ndarray, ...]:
    """The node on ``_native.dq_lstm`` (:func:`_dq_lstm_values`, the same keyword
    parameters); ``out``: None or one place per output of the node (``Kernel.out_all``),
    each written."""
    outs = _dq_lstm_values(ctx, *inputs, **attrs)
    return outs if out is None else into_places(out, outs)


def _dq_lstm_values(
    ctx: Any,
    *inputs: np.ndarray | None,
    packed_w: list[Any],
    packed_r: list[Any],
    w_mult: np.ndarray,
    r_mult: np.ndarray,
    hidden_size: int,
    direction: str = "forward",
    clip: float | None = None,
    input_forget: int = 0,
    **attrs: Any,
) -> tuple[np.ndarray, ...]:
    """The outputs as new arrays: ``_native.dq_lstm``, or the twin."""
    from quanta.kernels import _native

    x, _, _, b, sequence_lens, initial_h, initial_c, p, *_ = DqLstmInputs(*inputs)
    H = int(hidden_size)
    D = len(packed_w)
    ok = (
        isinstance(x, np.ndarray)
        and x.dtype == F32
        and x.ndim == 3
        and x.shape[2] == packed_w[0].K
        and (b is None or np.shape(b) == (D, 8 * H))
        and (sequence_lens is None or np.shape(sequence_lens) == (x.shape[1],))
    )
    if ok:
        bias = None
        if b is not None:
            bb = np.asarray(b, F32)
            bias = np.ascontiguousarray(bb[:, : 4 * H] + bb[:, 4 * H :])  # f32(Wb + Rb)
        lens = None if sequence_lens is None else np.ascontiguousarray(sequence_lens, dtype=np.int32)
        try:
            outs = _native.dq_lstm(
                np.ascontiguousarray(x),
                packed_w,
                packed_r,
                w_mult,
                r_mult,
                bias,
                _f32_or_none(p),
                _f32_or_none(initial_h),
                _f32_or_none(initial_c),
                lens,
                direction=direction,
                clip=_FLT_MAX if clip is None else float(clip),
                input_forget=bool(input_forget),
                want_y=_y_requested(ctx),
                num_threads=threads(ctx),
            )
        except ValueError as e:
            raise OpError(f"DynamicQuantizeLSTM: {e}") from None
        return outs[: max(1, ctx.n_outputs)]
    return dynamic_quantize_lstm_op(
        ctx,
        *inputs,
        hidden_size=hidden_size,
        direction=direction,
        clip=clip,
        input_forget=input_forget,
        **attrs,
    )


def _pack_direction(w: np.ndarray, zp: int, saturating: bool = False) -> Any:
    """``saturating``: int8 codes packed for docs/float-ops.md (QM1)'s saturating pairs (the
    avx2 vpmaddubsw family: ORT's u8·s8 kernel without VNNI); uint8 ones stay exact, as
    ORT's u8·u8 kernel."""
    from quanta.kernels import _native

    if w.dtype == np.int8:
        return _native.pack_weights_s8(np.ascontiguousarray(w), zp, saturating=saturating)
    return _native.pack_weights_u8(np.ascontiguousarray(w), zp)


@register_binder("DynamicQuantizeLSTM", MS_DOMAIN)
def bind_dynamic_quantize_lstm(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Constant int8/uint8 W and R with constant scales and zero points, the default
    activations, layout 0."""
    del model  # unused: the choice depends on the node's constants and attributes
    a = node.attrs
    if int(a.get("layout", 0)) != 0:
        return None, "layout = 1 (batch first) is not supported (ONNX Runtime: neither)"
    direction = a.get("direction", "forward")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("forward", "reverse", "bidirectional"):
        return None, f"direction {direction!r} is not forward, reverse or bidirectional"
    D = 2 if direction == "bidirectional" else 1
    acts = [s.decode() if isinstance(s, bytes) else str(s) for s in a.get("activations", ()) or ()]
    if acts and [s.lower() for s in acts] != list(_DEFAULT_ACTS) * D:
        return None, f"activations {acts}: the native kernel computes the default sigmoid, tanh, tanh only"
    clip = a.get("clip")
    if clip is not None and not float(clip) > 0:
        return None, f"clip must be > 0, got {clip}"
    H = int(a.get("hidden_size", 0))
    w, r = _const(node.input(1)), _const(node.input(2))
    consts = [_const(node.input(i)) for i in (8, 9, 10, 11)]
    if w is None or r is None or any(c is None for c in consts):
        return None, "W, R and their scales and zero points must be constants (they are prepacked once)"
    ws, wz, rs, rz = consts
    for name, t, k in (("W", w, None), ("R", r, H)):
        if t.dtype not in (np.int8, np.uint8) or t.ndim != 3 or t.shape[0] != D or t.shape[2] != 4 * H:
            return None, f"{name} must be int8/uint8 [{D}, K, {4 * H}], got {t.dtype}{list(t.shape)}"
        if k is not None and t.shape[1] != k:
            return None, f"R must be [{D}, {H}, {4 * H}], got {list(t.shape)}"
    packed_w, packed_r, w_mult, r_mult = [], [], [], []
    sat = bool(a.get("saturating_pairs"))  # the session's ORT arithmetic (ms_lstm eq. (2))
    try:
        for d in range(D):
            packed_w.append(_pack_direction(w[d], _weight_zero_point(wz, d, "W_zero_point"), sat))
            packed_r.append(_pack_direction(r[d], _weight_zero_point(rz, d, "R_zero_point"), sat))
            w_mult.append(_direction_scale(ws, d, 4 * H, "W_scale"))
            r_mult.append(_direction_scale(rs, d, 4 * H, "R_scale"))
    except (OpError, IndexError, ValueError) as e:
        return None, str(e)
    params = {
        "packed_w": packed_w,
        "packed_r": packed_r,
        "w_mult": np.ascontiguousarray(np.stack(w_mult), F32),
        "r_mult": np.ascontiguousarray(np.stack(r_mult), F32),
    }
    kind = ("u8" if w.dtype == np.uint8 else "s8") + (
        "_saturating" if sat and np.int8 in (w.dtype, r.dtype) else ""
    )
    # its outputs are planned in the arena (out_all), so the call writes them in place and a
    # native program records it with the steps around it (docs/runtime.md "Native programs")
    return Kernel(
        _dq_lstm_native,
        "native",
        f"native:dq_lstm_{kind}",
        params=params,
        out=True,
        out_all=True,
        specialize=_dq_lstm_specialized,
    ), ""


def _dq_lstm_specialized(
    sig: Specialization,
    *,
    packed_w: list[Any],
    packed_r: list[Any],
    w_mult: np.ndarray,
    r_mult: np.ndarray,
    hidden_size: int,
    direction: str = "forward",
    clip: float | None = None,
    input_forget: int = 0,
    **attrs: Any,
) -> Callable[..., Any] | None:
    """The node for one X shape with constant B, sequence_lens and P: the summed bias and
    the arguments of ``_native.dq_lstm`` prepared once (the states are the run's)."""
    from quanta.kernels import _native

    shapes, consts = sig.shapes, sig.consts
    H, D = int(hidden_size), len(packed_w)
    x_shape = shapes[0]
    if sig.dtypes[0] != F32 or x_shape is None or len(x_shape) != 3 or x_shape[2] != packed_w[0].K:
        return None
    for k in (3, 4, 7):  # B, sequence_lens, P: constants or omitted
        if k < len(shapes) and shapes[k] is not None and consts[k] is None:
            return None
    b = consts[3] if len(consts) > 3 else None
    lens_c = consts[4] if len(consts) > 4 else None
    p = consts[7] if len(consts) > 7 else None
    if (b is not None and np.shape(b) != (D, 8 * H)) or (
        lens_c is not None and np.shape(lens_c) != (x_shape[1],)
    ):
        return None
    bias = None
    if b is not None:
        bb = np.asarray(b, F32)
        bias = np.ascontiguousarray(bb[:, : 4 * H] + bb[:, 4 * H :])  # f32(Wb + Rb), as _dq_lstm_native
    lens = None if lens_c is None else np.ascontiguousarray(lens_c, dtype=np.int32)
    peep = _f32_or_none(p)
    n_out = max(1, sig.ctx.n_outputs)
    kw = {
        "direction": direction,
        "clip": _FLT_MAX if clip is None else float(clip),
        "input_forget": bool(input_forget),
        "want_y": _y_requested(sig.ctx),
        # a step of B rows through the [K + H, 4H] gate GEMMs: on one thread when the whole
        # sequence is under SMALL_MACS (silero-vad's 1 x 128 state: 131K)
        "num_threads": step_threads(sig, x_shape[0] * x_shape[1] * D * 4 * H * (x_shape[2] + H), SMALL_MACS),
    }
    run = _native.dq_lstm
    generic_attrs = {
        "packed_w": packed_w,
        "packed_r": packed_r,
        "w_mult": w_mult,
        "r_mult": r_mult,
        "hidden_size": hidden_size,
        "direction": direction,
        "clip": clip,
        "input_forget": input_forget,
        **attrs,
    }

    places = sig.out if isinstance(sig.out, tuple) and len(sig.out) == n_out else None
    if places is not None:
        # Y, Y_h, Y_c into the arena: one recordable call. An output the node omits (or
        # names but has no place for) gets an array of this signature's own, written by
        # every run and read by nothing.
        B = x_shape[1]
        shapes3 = ((x_shape[0], D, B, H), (D, B, H), (D, B, H))
        full = tuple(
            places[j] if j < len(places) and places[j] is not None else np.empty(shapes3[j], F32)
            for j in range(3)
        )
        kw["out"] = full
        result = tuple(full[:n_out])
        state_pos = tuple(k for k in (5, 6) if k < len(shapes) and shapes[k] is not None)

        def direct(x: Any, *states: Any) -> Any:
            h0 = states[state_pos.index(5)] if 5 in state_pos else None
            c0 = states[state_pos.index(6)] if 6 in state_pos else None
            run(x, packed_w, packed_r, w_mult, r_mult, bias, peep, h0, c0, lens, **kw)
            return result

        def into(ctx: Any, *inputs: Any) -> Any:
            try:
                return direct(inputs[0], *(inputs[k] for k in state_pos))
            except ValueError:
                return _dq_lstm_native(ctx, *inputs, **generic_attrs, out=places)

        # the fast loop's direct call (quanta.runtime.execute): X and the states the node
        # has, by position; one kernel call into the planned outputs, so it is recorded
        into.direct = direct  # type: ignore[attr-defined]
        into.reads = (0, *state_pos)  # type: ignore[attr-defined]
        into.recordable = True  # type: ignore[attr-defined]
        return into

    def call(
        x: np.ndarray,
        w: Any,
        r: Any,
        b: Any = None,
        sl: Any = None,
        h0: Any = None,
        c0: Any = None,
        *rest: Any,
    ):
        outs = run(
            x, packed_w, packed_r, w_mult, r_mult, bias, peep, _f32_or_none(h0), _f32_or_none(c0), lens, **kw
        )
        return outs[:n_out]

    def specialized(ctx: Any, *inputs: Any) -> Any:
        try:
            res = call(*inputs)
        except ValueError:
            return _dq_lstm_native(ctx, *inputs, **generic_attrs, out=sig.out)
        return res if sig.out is None else into_places(sig.out, res)

    return specialized


# --------------------------------------------------------------------------------------
# quanta::DynamicQuantizeGRU: _native.dq_gru, twin reference/dq_gru.py
# --------------------------------------------------------------------------------------


def _dq_gru_native(
    ctx: Any,
    *inputs: np.ndarray | None,
    packed_w: list[Any],
    packed_r: list[Any],
    packed_rh: list[Any],
    w_mult: np.ndarray,
    r_mult: np.ndarray,
    hidden_size: int,
    direction: str = "forward",
    clip: float | None = None,
    linear_before_reset: int = 0,
    **attrs: Any,
) -> tuple[np.ndarray, ...]:
    """The node on ``_native.dq_gru``; inputs the kernel cannot take (a wrongly shaped
    run-time tensor, a non-float32 X) go to the twin, which names what is wrong."""
    from quanta.kernels import _native
    from quanta.kernels.reference.dq_gru import DqGruInputs, dynamic_quantize_gru_op

    x, _, _, b, sequence_lens, initial_h, *_ = DqGruInputs(*inputs)
    H, D = int(hidden_size), len(packed_w)
    ok = (
        isinstance(x, np.ndarray)
        and x.dtype == F32
        and x.ndim == 3
        and x.shape[2] == packed_w[0].K
        and (b is None or np.shape(b) == (D, 6 * H))
        and (sequence_lens is None or np.shape(sequence_lens) == (x.shape[1],))
    )
    if ok:
        lens = None if sequence_lens is None else np.ascontiguousarray(sequence_lens, dtype=np.int32)
        try:
            outs = _native.dq_gru(
                np.ascontiguousarray(x),
                packed_w,
                packed_r,
                packed_rh,
                w_mult,
                r_mult,
                _f32_or_none(b),
                _f32_or_none(initial_h),
                lens,
                direction=direction,
                clip=_FLT_MAX if clip is None else float(clip),
                linear_before_reset=bool(linear_before_reset),
                num_threads=threads(ctx),
            )
        except ValueError as e:
            raise OpError(f"DynamicQuantizeGRU: {e}") from None
        return outs[: max(1, ctx.n_outputs)]
    return dynamic_quantize_gru_op(
        ctx,
        *inputs,
        hidden_size=hidden_size,
        direction=direction,
        clip=clip,
        linear_before_reset=linear_before_reset,
        **attrs,
    )


@register_binder("DynamicQuantizeGRU", "quanta")
def bind_dynamic_quantize_gru(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Constant int8/uint8 W and R with constant scales and zero points, the default
    activations, layout 0. R is packed as its z, r columns [H, 2H] and its h columns
    [H, H] (the two products of a step), or whole with linear_before_reset."""
    del model  # unused: the choice depends on the node's constants and attributes
    a = node.attrs
    # the forms the op does not define (layout 1, other activations): the twin's rule
    why = refusal(node.op_type, node.domain, dict(a), [v is not None for v in node.inputs])
    if why is not None:
        return None, why
    direction = a.get("direction", "forward")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("forward", "reverse", "bidirectional"):
        return None, f"direction {direction!r} is not forward, reverse or bidirectional"
    D = 2 if direction == "bidirectional" else 1
    clip = a.get("clip")
    if clip is not None and not float(clip) > 0:
        return None, f"clip must be > 0, got {clip}"
    H = int(a.get("hidden_size", 0))
    lbr = bool(int(a.get("linear_before_reset", 0)))
    w, r = _const(node.input(1)), _const(node.input(2))
    consts = [_const(node.input(i)) for i in (6, 7, 8, 9)]
    if w is None or r is None or any(c is None for c in consts):
        return None, "W, R and their scales and zero points must be constants (they are prepacked once)"
    ws, wz, rs, rz = consts
    for name, t, k in (("W", w, None), ("R", r, H)):
        if t.dtype not in (np.int8, np.uint8) or t.ndim != 3 or t.shape[0] != D or t.shape[2] != 3 * H:
            return None, f"{name} must be int8/uint8 [{D}, K, {3 * H}], got {t.dtype}{list(t.shape)}"
        if k is not None and t.shape[1] != k:
            return None, f"R must be [{D}, {H}, {3 * H}], got {list(t.shape)}"
    packed_w, packed_r, packed_rh, w_mult, r_mult = [], [], [], [], []
    try:
        for d in range(D):
            rzp = _weight_zero_point(rz, d, "R_zero_point")
            packed_w.append(_pack_direction(w[d], _weight_zero_point(wz, d, "W_zero_point")))
            if lbr:
                packed_r.append(_pack_direction(r[d], rzp))
                packed_rh.append(None)
            else:
                packed_r.append(_pack_direction(r[d][:, : 2 * H], rzp))
                packed_rh.append(_pack_direction(r[d][:, 2 * H :], rzp))
            w_mult.append(_direction_scale(ws, d, 3 * H, "W_scale"))
            r_mult.append(_direction_scale(rs, d, 3 * H, "R_scale"))
    except (OpError, IndexError, ValueError) as e:
        return None, str(e)
    params = {
        "packed_w": packed_w,
        "packed_r": packed_r,
        "packed_rh": packed_rh,
        "w_mult": np.ascontiguousarray(np.stack(w_mult), F32),
        "r_mult": np.ascontiguousarray(np.stack(r_mult), F32),
    }
    kind = "u8" if w.dtype == np.uint8 else "s8"
    return Kernel(_dq_gru_native, "native", f"native:dq_gru_{kind}", params=params), ""


# --------------------------------------------------------------------------------------
# ai.onnx LSTM and GRU (float32): _native.float_rnn, twin reference/rnn.py
# --------------------------------------------------------------------------------------


def _panels(wt: np.ndarray, cols: int = _SEQ_PANEL) -> np.ndarray:
    """``wt [K, N]`` in float_rnn.h's blocks of ``cols`` columns (128: the panels, 32: row
    strips): [ceil(N / cols), K, cols], zero-padded."""
    k, n = wt.shape
    p = -(-n // cols)
    padded = np.zeros((k, p * cols), F32)
    padded[:, :n] = wt
    return np.ascontiguousarray(padded.reshape(k, p, cols).transpose(1, 0, 2))


_OP_NAMES = {"lstm": "LSTM", "gru": "GRU", "ort_lstm": "OrtLSTM", "ort_gru": "OrtGRU"}  # float_rnn's kinds


def _float_rnn_native(
    kind: str,
    ctx: Any,
    x: np.ndarray,
    w: np.ndarray,
    r: np.ndarray,
    b,
    sequence_lens,
    initial_h,
    initial_c,
    p,
    *,
    w_t: list[np.ndarray],
    r_t: list[np.ndarray],
    r_h: list[np.ndarray],
    n_in: int,
    hidden_size: int,
    direction: str,
    clip: float | None,
    input_forget: int,
    linear_before_reset: int,
    layout: int,
    twin: Any,
    twin_args: tuple,
    attrs: dict,
) -> tuple[np.ndarray, ...]:
    from quanta.kernels import _native

    D, H = len(w_t), int(hidden_size)
    G = 3 if kind in ("gru", "ort_gru") else 4
    ok = isinstance(x, np.ndarray) and x.dtype == F32 and x.ndim == 3 and x.shape[2] == n_in
    ok = ok and all(
        a is None or (isinstance(a, np.ndarray) and a.dtype == F32) for a in (b, initial_h, initial_c, p)
    )
    ok = ok and (b is None or b.shape == (D, 2 * G * H)) and (p is None or p.shape == (D, 3 * H))
    if not ok:
        return twin(ctx, x, w, r, *twin_args, **attrs)
    if layout == 1:
        x = x.transpose(1, 0, 2)
        initial_h = None if initial_h is None else initial_h.transpose(1, 0, 2)
        initial_c = None if initial_c is None else initial_c.transpose(1, 0, 2)
    lens = (
        None
        if sequence_lens is None
        else np.ascontiguousarray(np.asarray(sequence_lens).reshape(-1), np.int32)
    )
    try:
        outs = _native.float_rnn(
            kind,
            np.ascontiguousarray(x),
            w_t,
            r_t,
            r_h,
            b,
            p,
            _f32_or_none(initial_h),
            _f32_or_none(initial_c),
            lens,
            direction=direction,
            clip=_FLT_MAX if clip is None else float(clip),
            input_forget=bool(input_forget),
            linear_before_reset=bool(linear_before_reset),
            num_threads=threads(ctx),
        )
    except ValueError as e:
        raise OpError(f"{_OP_NAMES[kind]}: {e}") from None
    if layout == 1:
        outs = (
            np.ascontiguousarray(outs[0].transpose(2, 0, 1, 3)),
            *(np.ascontiguousarray(s.transpose(1, 0, 2)) for s in outs[1:]),
        )
    return tuple(outs[: max(1, ctx.n_outputs)])


def _lstm_kernel(kind: str, twin: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """The float LSTM kernel of one float_rnn kind ("lstm": ONNX's functions, "ort_lstm":
    ONNX Runtime's), ``twin()`` its NumPy twin (imported on first use)."""

    def run(
        ctx: Any,
        x,
        w,
        r,
        b=None,
        sequence_lens=None,
        initial_h=None,
        initial_c=None,
        p=None,
        *,
        w_t,
        r_t,
        r_h,
        n_in,
        hidden_size,
        direction="forward",
        clip=None,
        input_forget=0,
        layout=0,
        **attrs,
    ):
        return _float_rnn_native(
            kind,
            ctx,
            x,
            w,
            r,
            b,
            sequence_lens,
            initial_h,
            initial_c,
            p,
            w_t=w_t,
            r_t=r_t,
            r_h=r_h,
            n_in=n_in,
            hidden_size=hidden_size,
            direction=direction,
            clip=clip,
            input_forget=input_forget,
            linear_before_reset=0,
            layout=layout,
            twin=twin(),
            twin_args=(b, sequence_lens, initial_h, initial_c, p),
            attrs={
                "hidden_size": hidden_size,
                "direction": direction,
                "clip": clip,
                "input_forget": input_forget,
                "layout": layout,
                **attrs,
            },
        )

    return run


def _lstm_twin() -> Callable[..., Any]:
    from quanta.kernels.reference.rnn import lstm_op

    return lstm_op


def _ort_lstm_twin() -> Callable[..., Any]:
    from quanta.kernels.reference.ort_float import ort_lstm_op

    return ort_lstm_op


_lstm_native = _lstm_kernel("lstm", _lstm_twin)
_ort_lstm_native = _lstm_kernel("ort_lstm", _ort_lstm_twin)


def _gru_twin() -> Callable[..., Any]:
    from quanta.kernels.reference.rnn import gru_op

    return gru_op


def _ort_gru_twin() -> Callable[..., Any]:
    from quanta.kernels.reference.ort_float import ort_gru_op

    return ort_gru_op


def _gru_kernel(kind: str, twin: Callable[[], Callable[..., Any]]) -> Callable[..., Any]:
    """The float GRU kernel of one float_rnn kind ("gru": ONNX's functions, "ort_gru":
    ONNX Runtime's), ``twin()`` its NumPy twin (imported on first use)."""

    def run(
        ctx: Any,
        x,
        w,
        r,
        b=None,
        sequence_lens=None,
        initial_h=None,
        *,
        w_t,
        r_t,
        hidden_size,
        r_h,
        n_in,
        direction="forward",
        clip=None,
        linear_before_reset=0,
        layout=0,
        **attrs,
    ):
        return _float_rnn_native(
            kind,
            ctx,
            x,
            w,
            r,
            b,
            sequence_lens,
            initial_h,
            None,
            None,
            w_t=w_t,
            r_t=r_t,
            r_h=r_h,
            n_in=n_in,
            hidden_size=hidden_size,
            direction=direction,
            clip=clip,
            input_forget=0,
            linear_before_reset=linear_before_reset,
            layout=layout,
            twin=twin(),
            twin_args=(b, sequence_lens, initial_h),
            attrs={
                "hidden_size": hidden_size,
                "direction": direction,
                "clip": clip,
                "linear_before_reset": linear_before_reset,
                "layout": layout,
                **attrs,
            },
        )

    return run


_gru_native = _gru_kernel("gru", _gru_twin)
_ort_gru_native = _gru_kernel("ort_gru", _ort_gru_twin)


def _bind_float_rnn(op: str, node: Node, ort: bool = False) -> tuple[Kernel | None, str]:
    from quanta.kernels.reference.rnn import default_activations

    a = node.attrs
    direction = a.get("direction", "forward")
    if isinstance(direction, bytes):
        direction = direction.decode()
    if direction not in ("forward", "reverse", "bidirectional"):
        return None, f"direction {direction!r} is not forward, reverse or bidirectional"
    D = 2 if direction == "bidirectional" else 1
    if not default_activations(op, a.get("activations"), D):
        return None, f"activations {a.get('activations')}: the native kernel computes the defaults only"
    if int(a.get("layout", 0)) not in (0, 1):
        return None, f"layout must be 0 or 1, got {a.get('layout')}"
    clip = a.get("clip")
    if clip is not None and not float(clip) > 0:
        return None, f"clip must be > 0, got {clip}"
    H = int(a.get("hidden_size", 0))
    G = 4 if op == "LSTM" else 3
    w, r = _const(node.input(1)), _const(node.input(2))
    if w is None or r is None:
        return None, "W and R must be constants (they are transposed once)"
    if w.dtype != F32 or r.dtype != F32:
        return None, f"native {op} takes float32 weights, got {w.dtype} / {r.dtype}"
    if w.ndim != 3 or w.shape[:2] != (D, G * H) or r.shape != (D, G * H, H):
        return (
            None,
            f"W / R must be [{D}, {G * H}, I] / [{D}, {G * H}, {H}], got {list(w.shape)} / {list(r.shape)}",
        )
    # each direction's W and R transposed to [K, G·H], in the column blocks float_rnn reads
    # on this ISA (float_rnn.h: panels of 128; on AVX2 W in strips of 16, R in row strips
    # of 32), packed here once, not per call, one copy each (float_rnn repacks for a call
    # whose path needs the other layout); a GRU's R in two parts, its z, r columns and its
    # h columns (the h product waits for r)
    from quanta.kernels import _native

    wc, rc = (int(c) for c in _native.float_rnn_layout())
    w_t = [_panels(w[d].T, wc) for d in range(D)]
    if op == "LSTM":
        r_t, r_h = [_panels(r[d].T, rc) for d in range(D)], []
    else:
        r_t = [_panels(r[d, : 2 * H].T, rc) for d in range(D)]
        r_h = [_panels(r[d, 2 * H :].T, rc) for d in range(D)]
    params = {"w_t": w_t, "r_t": r_t, "r_h": r_h, "n_in": int(w.shape[2])}
    fn, spec = _FLOAT_RNN_KERNELS[op, ort]
    name = f"native:{'ort_' if ort else ''}{op.lower()}_f32"
    return Kernel(fn, "native", name, params=params, specialize=spec), ""


def _float_rnn_specialized(
    kind: str,
    generic: Callable[..., Any],
    sig: Specialization,
    *,
    w_t: list[np.ndarray],
    r_t: list[np.ndarray],
    r_h: list[np.ndarray],
    n_in: int,
    hidden_size: int,
    direction: str = "forward",
    clip: float | None = None,
    input_forget: int = 0,
    linear_before_reset: int = 0,
    layout: int = 0,
    **attrs: Any,
) -> Callable[..., Any] | None:
    """The node for one X shape, layout 0, with B, sequence_lens and P constant or omitted:
    ``_native.float_rnn``'s arguments prepared once, the states the run's (a one-step
    silero-vad LSTM spends longer in the generic wrapper than in the kernel)."""
    from quanta.kernels import _native

    shapes, dtypes, consts = sig.shapes, sig.dtypes, sig.consts
    D, H = len(w_t), int(hidden_size)
    gru = kind in ("gru", "ort_gru")
    G = 3 if gru else 4
    x_shape = shapes[0]
    if layout != 0 or dtypes[0] != F32 or x_shape is None or len(x_shape) != 3 or x_shape[2] != n_in:
        return None
    const_at = (3, 4) if gru else (3, 4, 7)  # B, sequence_lens (, P)
    for k in const_at:
        if k < len(shapes) and shapes[k] is not None and consts[k] is None:
            return None
    for k in (5, 6) if not gru else (5,):  # initial states: float32 [D, B, H] or omitted
        if (
            k < len(shapes)
            and shapes[k] is not None
            and (dtypes[k] != F32 or shapes[k] != (D, x_shape[1], H))
        ):
            return None
    b = consts[3] if len(consts) > 3 else None
    lens_c = consts[4] if len(consts) > 4 else None
    p = consts[7] if not gru and len(consts) > 7 else None
    if b is not None and (b.dtype != F32 or b.shape != (D, 2 * G * H)):
        return None
    if p is not None and (p.dtype != F32 or p.shape != (D, 3 * H)):
        return None
    bias, peep = _f32_or_none(b), _f32_or_none(p)
    lens = None if lens_c is None else np.ascontiguousarray(np.asarray(lens_c).reshape(-1), np.int32)
    n_out = max(1, sig.ctx.n_outputs)
    clip_v = _FLT_MAX if clip is None else float(clip)
    nt = step_threads(sig, x_shape[0] * x_shape[1] * D * G * H * (x_shape[2] + H), SMALL_MACS)
    run = _native.float_rnn
    generic_kw = {
        "w_t": w_t,
        "r_t": r_t,
        "r_h": r_h,
        "n_in": n_in,
        "hidden_size": hidden_size,
        "direction": direction,
        "clip": clip,
        "linear_before_reset": linear_before_reset,
        "layout": layout,
        **attrs,
    }
    if not gru:
        del generic_kw["linear_before_reset"]
        generic_kw["input_forget"] = input_forget
    flags = (direction, clip_v, bool(input_forget), bool(linear_before_reset), nt)

    def specialized(ctx: Any, x: Any, *rest: Any) -> Any:
        h0 = rest[4] if len(rest) > 4 else None
        c0 = rest[5] if len(rest) > 5 else None
        try:
            outs = run(kind, x, w_t, r_t, r_h, bias, peep, h0, c0, lens, *flags)
        except (ValueError, TypeError, RuntimeError):
            return generic(ctx, x, *rest, **generic_kw)
        return outs[:n_out]

    # The fast loop's direct call (quanta.runtime.execute): x and the initial states the
    # node has, by position, no ctx and no Python frame for the constant operands (a
    # streaming model's one-step GRU cell cost ~2.5 us of wrappers around a ~1.5 us
    # call). Arguments the binding refuses raise ValueError, which hands the call to
    # ``specialized`` and from there to the generic kernel.
    state_pos = tuple(k for k in ((5,) if gru else (5, 6)) if k < len(shapes) and shapes[k] is not None)

    def direct(x: Any, *states: Any) -> Any:
        h0, c0 = states if len(state_pos) == 2 else (None, None)
        if len(state_pos) == 1:
            h0, c0 = (states[0], None) if state_pos == (5,) else (None, states[0])
        try:
            outs = run(kind, x, w_t, r_t, r_h, bias, peep, h0, c0, lens, *flags)
        except (TypeError, RuntimeError) as e:
            raise ValueError(str(e)) from e
        return outs[:n_out]

    specialized.direct = direct  # type: ignore[attr-defined]
    specialized.reads = (0, *state_pos)  # type: ignore[attr-defined]
    return specialized


# (op, ONNX Runtime's functions) -> (generic kernel, its specializer): the float_rnn kind
# is "ort_" + op in lower case for ORT's
_FLOAT_RNN_KERNELS = {
    (op, ort): (fn, functools.partial(_float_rnn_specialized, f"{'ort_' if ort else ''}{op.lower()}", fn))
    for (op, ort), fn in {
        ("LSTM", False): _lstm_native,
        ("LSTM", True): _ort_lstm_native,
        ("GRU", False): _gru_native,
        ("GRU", True): _ort_gru_native,
    }.items()
}


@register_binder("LSTM")
def bind_lstm(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 LSTM with constant W and R and the default activations (layout 0 or 1)."""
    del model  # unused
    return _bind_float_rnn("LSTM", node)


@register_binder("OrtLSTM", "quanta")
def bind_ort_lstm(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::OrtLSTM (ONNX Runtime's float32 LSTM, twin reference/ort_float.py): the
    native float LSTM with MLAS's products and gate functions; as LSTM otherwise."""
    del model  # unused
    return _bind_float_rnn("LSTM", node, ort=True)


@register_binder("OrtGRU", "quanta")
def bind_ort_gru(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta::OrtGRU (ONNX Runtime's float32 GRU, twin reference/ort_float.py): the
    native float GRU with MLAS's products and ORT's gate functions; as GRU otherwise."""
    del model  # unused
    return _bind_float_rnn("GRU", node, ort=True)


@register_binder("GRU")
def bind_gru(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """float32 GRU with constant W and R and the default activations (layout 0 or 1)."""
    del model  # unused
    return _bind_float_rnn("GRU", node)


# --------------------------------------------------------------------------------------
# quanta::LSTMGates (float32): _native.lstm_gates_f32, twin reference/rnn.py lstm_gates
# --------------------------------------------------------------------------------------


def _lstm_gates_native(ctx: Any, gates: Any, c: Any, *, order: Any = (0, 1, 2, 3)) -> tuple[np.ndarray, ...]:
    """The fused cell on ``_native.lstm_gates_f32``; inputs outside its form (another
    dtype or rank, a c that does not match the gates' rows) go to the twin, which names
    what is wrong."""
    from quanta.kernels import _native
    from quanta.kernels.reference.rnn import lstm_gates

    if (
        isinstance(gates, np.ndarray)
        and isinstance(c, np.ndarray)
        and gates.dtype == F32
        and c.dtype == F32
        and gates.ndim == 2
        and gates.shape[1] % 4 == 0
        and c.shape == (gates.shape[0], gates.shape[1] // 4)
    ):
        return _native.lstm_gates_f32(gates, c, [int(k) for k in order])
    return lstm_gates(ctx, gates, c, order=order)


def _lstm_gates_specialized(sig: Specialization, *, order: Any = (0, 1, 2, 3)) -> Callable[..., Any] | None:
    """The call with the order list built once (the executor's fast loop)."""
    from quanta.kernels import _native

    g_shape, c_shape = sig.shapes[0], sig.shapes[1]
    if sig.dtypes[0] != F32 or sig.dtypes[1] != F32 or g_shape is None or len(g_shape) != 2:
        return None
    if g_shape[1] % 4 or c_shape != (g_shape[0], g_shape[1] // 4):
        return None
    ordl = [int(k) for k in order]
    run = _native.lstm_gates_f32

    def specialized(ctx: Any, gates: Any, c: Any) -> Any:
        try:
            return run(gates, c, ordl)
        except (ValueError, TypeError, RuntimeError):
            return _lstm_gates_native(ctx, gates, c, order=order)

    return specialized


@register_binder("LSTMGates", "quanta")
def bind_lstm_gates(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """The elementwise half of an exported LSTM cell (optimize_float's FuseLSTMGates)."""
    del model  # unused: the kernel takes any float32 [B, 4H] gates
    order = [int(k) for k in node.attrs.get("order", (0, 1, 2, 3))]
    if sorted(order) != [0, 1, 2, 3]:
        return None, f"order must be a permutation of 0..3, got {order}"
    return Kernel(
        _lstm_gates_native, "native", "native:lstm_gates_f32", specialize=_lstm_gates_specialized
    ), ""


# --------------------------------------------------------------------------------------
# quanta::GRUGates (float32): _native.gru_gates_f32, twin reference/rnn.py gru_gates
# --------------------------------------------------------------------------------------


def _gru_gates_form(gx_shape: Any, gh_shape: Any, h_shape: Any) -> bool:
    return (
        gx_shape is not None
        and len(gx_shape) == 2
        and gx_shape[1] % 3 == 0
        and tuple(gh_shape) == tuple(gx_shape)
        and tuple(h_shape) == (gx_shape[0], gx_shape[1] // 3)
    )


def _gru_gates_native(ctx: Any, gx: Any, gh: Any, h: Any, *, order: Any = (0, 1, 2)) -> np.ndarray:
    """The fused cell on ``_native.gru_gates_f32``; inputs outside its form (another dtype
    or rank, shapes that do not match) go to the twin, which names what is wrong."""
    from quanta.kernels import _native
    from quanta.kernels.reference.rnn import gru_gates

    arrays = [x for x in (gx, gh, h) if isinstance(x, np.ndarray) and x.dtype == F32]
    if len(arrays) == 3 and gx.ndim == 2 and gh.ndim == 2 and h.ndim == 2:
        b = max(gx.shape[0], gh.shape[0], h.shape[0])
        if {gx.shape[0], gh.shape[0], h.shape[0]} <= {1, b} and b > 1:
            # a row of 1 broadcasts, as in the replaced nodes: the kernel takes B rows of each
            gx, gh, h = (np.ascontiguousarray(np.broadcast_to(x, (b, x.shape[1]))) for x in (gx, gh, h))
        if _gru_gates_form(gx.shape, gh.shape, h.shape):
            return _native.gru_gates_f32(gx, gh, h, [int(k) for k in order])
    return gru_gates(ctx, gx, gh, h, order=order)


def _gru_gates_specialized(sig: Specialization, *, order: Any = (0, 1, 2)) -> Callable[..., Any] | None:
    """The call with the order list built once (the executor's fast loop)."""
    from quanta.kernels import _native

    shapes = sig.shapes[:3]
    if any(d != F32 for d in sig.dtypes[:3]) or any(s is None for s in shapes):
        return None
    if not _gru_gates_form(*shapes):
        return None
    ordl = [int(k) for k in order]
    run = _native.gru_gates_f32

    def specialized(ctx: Any, gx: Any, gh: Any, h: Any) -> Any:
        try:
            return run(gx, gh, h, ordl)
        except (ValueError, TypeError, RuntimeError):
            return _gru_gates_native(ctx, gx, gh, h, order=order)

    return specialized


@register_binder("GRUGates", "quanta")
def bind_gru_gates(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """The elementwise half of an exported GRU cell (optimize_float's FuseGRUGates)."""
    del model  # unused: the kernel takes any float32 [B, 3H] products
    order = [int(k) for k in node.attrs.get("order", (0, 1, 2))]
    if sorted(order) != [0, 1, 2]:
        return None, f"order must be a permutation of 0..2, got {order}"
    return Kernel(_gru_gates_native, "native", "native:gru_gates_f32", specialize=_gru_gates_specialized), ""
