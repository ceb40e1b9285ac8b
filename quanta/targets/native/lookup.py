"""Native quanta QLinearLookup: ``y = table[bits(x)]`` on the ``lut8`` kernel (a table per
channel: ``lut8_channels``, the same gathers run by run).

The table is the node's constant input, computed by lowering from the float group it
replaces (quanta/passes/lower/lookup.py); the kernel gathers from it
(quanta/kernels/cpp/elementwise: AVX-512 VBMI ``vpermi2b`` over four 64-byte quarters of
the table, AVX-512 / AVX2 ``vpgatherdd``, a portable loop), bit-exact with the twin
``reference.lookup.qlinear_lookup`` by construction: every variant returns the table's
entry. x and the table (the output's type) may differ in storage: the kernel indexes by
the input's byte. A table that is not a constant of 256 uint8/int8 entries runs on the
twin, which raises the op's own error.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.lookup import QUANTA_DOMAIN, qlinear_lookup
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded, step_threads

__all__ = ["bind_qlinear_lookup"]

_EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))
_SHORT = {np.dtype(np.uint8): "u8", np.dtype(np.int8): "s8"}
_SHORT16 = {np.dtype(np.uint16): "u16", np.dtype(np.int16): "s16"}


def _qlinear_lookup_native(
    ctx: Any,
    x: Any,
    x_scale: Any,
    x_zero_point: Any,
    y_scale: Any,
    y_zero_point: Any,
    table: Any,
    *,
    out: np.ndarray | None = None,
    function: str = "",
    axis: int | None = None,
) -> np.ndarray:
    """``y = table[bits(x)]``, or with ``axis`` ``table[c, bits(x)]`` for the elements of
    index c along it (the scales describe the types; the table holds the values)."""
    del x_scale, x_zero_point, y_scale, y_zero_point, function  # the table holds them
    from quanta.kernels import _native

    x = np.asarray(x)
    table = np.asarray(table)
    if axis is not None and -x.ndim <= axis < x.ndim:
        axis %= x.ndim
    want = (256,) if axis is None else (x.shape[axis] if 0 <= axis < x.ndim else -1, 256)
    if x.dtype not in _EIGHT_BIT or table.dtype not in _EIGHT_BIT or table.shape != want:
        y = qlinear_lookup(x, table, axis)  # raises the op's error for a bad table or x
        if out is None:
            return y
        np.copyto(out, y)
        return out
    if x.dtype != table.dtype:
        x = x.view(table.dtype)  # the kernel gathers by byte: the same bytes, the output's type
    threads = max(1, int(getattr(ctx, "num_threads", 1)))
    if axis is None:
        return _native.lut8(np.ascontiguousarray(x), np.ascontiguousarray(table), threads, out)
    return _native.lut8_channels(np.ascontiguousarray(x), np.ascontiguousarray(table), axis, threads, out)


def _lookup_specialized(sig: Specialization, *, axis: int | None = None, **attrs: Any) -> Any:
    """A constant 8-bit table and an 8-bit x of known rank: one kernel call per run, the
    generic call's checks done here once. The same kernels, so the same bytes."""
    from quanta.kernels import _native

    table = sig.consts[5] if len(sig.consts) > 5 else None
    dt, shape = sig.dtypes[0], sig.shapes[0]
    if table is None or shape is None or dt not in _EIGHT_BIT or table.dtype not in _EIGHT_BIT:
        return None
    table = np.ascontiguousarray(table)
    rank, out, threads = len(shape), sig.out, step_threads(sig)
    view = None if dt == table.dtype else table.dtype
    generic = functools.partial(_qlinear_lookup_native, axis=axis)
    if axis is None:
        if table.shape != (256,):
            return None
        lut = _native.lut8
        if view is None:
            return guarded(
                lambda x, *rest: lut(x, table, threads, out), generic, attrs, out, reads=1, recordable=True
            )
        return guarded(
            lambda x, *rest: lut(x.view(view), table, threads, out),
            generic,
            attrs,
            out,
            reads=1,
            recordable=True,
        )
    if not -rank <= axis < rank or table.shape != (shape[axis % rank], 256):
        return None
    a = axis % rank
    lutc = _native.lut8_channels
    if view is None:
        return guarded(
            lambda x, *rest: lutc(x, table, a, threads, out), generic, attrs, out, reads=1, recordable=True
        )
    return guarded(
        lambda x, *rest: lutc(x.view(view), table, a, threads, out),
        generic,
        attrs,
        out,
        reads=1,
        recordable=True,
    )


_SIXTEEN_BIT = (np.dtype(np.uint16), np.dtype(np.int16))


def _qlinear_lookup16_native(
    ctx: Any, x: Any, *rest: Any, out: np.ndarray | None = None, **attrs: Any
) -> np.ndarray:
    """``y = table[16 bits of x]`` (a16w8_lut16); x of another type runs on the twin."""
    del ctx
    from quanta.kernels import _native

    x = np.asarray(x)
    table = np.asarray(rest[4])
    if x.dtype in _SIXTEEN_BIT and attrs.get("axis") is None and x.flags.c_contiguous:
        return _native.a16w8_lut16(x, table, out)
    y = qlinear_lookup(x, table, attrs.get("axis"))  # raises the op's error
    if out is None:
        return y
    np.copyto(out, y)
    return out


def _lookup16_specialized(sig: Specialization, **attrs: Any) -> Any:
    """A 16-bit x and a constant 65536-entry table, per tensor: the kernel call with the
    table bound, recordable."""
    from quanta.kernels import _native

    table = sig.consts[5] if len(sig.consts) > 5 else None
    if table is None or sig.dtypes[0] not in _SIXTEEN_BIT or attrs.get("axis") is not None:
        return None
    table = np.ascontiguousarray(table)
    lut, out = _native.a16w8_lut16, sig.out
    return guarded(
        lambda x, *rest: lut(x, table, out), _qlinear_lookup16_native, attrs, out, reads=1, recordable=True
    )


@register_binder("QLinearLookup", QUANTA_DOMAIN)
def bind_qlinear_lookup(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """uint8/int8 x with a constant 256-entry uint8/int8 table (a [C, 256] one with ``axis``);
    16-bit x with a 65536-entry 16-bit table (a16w8_lut16)."""
    del model  # unused: the choice depends on the node only
    table = node.input(5)
    if table is None or table.const is None:
        return None, "native QLinearLookup takes a constant table (lowering computes one)"
    t = np.asarray(table.const)
    per_axis = node.attrs.get("axis") is not None
    if t.dtype in _SIXTEEN_BIT and t.shape == (65536,) and not per_axis:
        return Kernel(
            _qlinear_lookup16_native,
            "native",
            f"native:qlinear_lookup16_{_SHORT16[t.dtype]}",
            out=True,
            specialize=_lookup16_specialized,
        ), ""
    if t.dtype not in _EIGHT_BIT or (t.shape[-1:] != (256,) or t.ndim != (2 if per_axis else 1)):
        want = "[C, 256]" if per_axis else "256"
        return (
            None,
            f"native QLinearLookup: the table is {t.dtype} of shape {t.shape}, expected {want} uint8/int8",
        )
    # any 8-bit x: the kernel gathers by byte, the table holds the output's codes
    name = f"native:qlinear_lookup_{'channels_' if per_axis else ''}{_SHORT[t.dtype]}"
    return Kernel(_qlinear_lookup_native, "native", name, out=True, specialize=_lookup_specialized), ""
