"""Binds ``quanta.int`` nodes to the C++ ``intonly`` kernels (``_native.intonly_*``).

:func:`run` returns None for a node without a native kernel (or a form the kernel does
not take: a convolution of rank other than 2-D, a MatMul whose operands' batch
dimensions differ); the caller then runs the golden. The binder widens the integer
storage to int32, hands the precomputed requantization parameters over unchanged and
narrows the result (already clamped to the output type's range); every native result is
bit-exact with the golden (tests/intonly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from quanta.ir.graph import Node
from quanta.kernels.reference.conv_geometry import conv_attrs
from quanta.kernels.reference.intonly import ROUNDING_MODES, storage_dtype

__all__ = ["run"]


def _i32(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.int32)


def _params(attrs: dict, key: str) -> np.ndarray:
    return np.ascontiguousarray(np.asarray(attrs[key], np.int64).reshape(-1), dtype=np.int32)


def _range(attrs: dict) -> tuple[np.dtype, int, int]:
    dt = storage_dtype(attrs.get("out_type", "int8"))
    info = np.iinfo(dt)
    lo, hi = int(info.min), int(info.max)
    if attrs.get("act_min") is not None:
        lo = max(lo, int(attrs["act_min"]))
    if attrs.get("act_max") is not None:
        hi = min(hi, int(attrs["act_max"]))
    return dt, lo, hi


def _mode(attrs: dict) -> int:
    return ROUNDING_MODES.index(attrs.get("rounding", "double"))


def run(nat: Any, node: Node, inputs: Sequence[np.ndarray | None]) -> np.ndarray | None:
    """The native kernel's output for ``node``, or None when there is none."""
    fn = _BINDERS.get(node.op_type)
    return None if fn is None else fn(nat, node.attrs, inputs)


def _matmul(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray | None:
    a, b = np.asarray(ins[0]), np.asarray(ins[1])
    c = ins[2] if len(ins) > 2 else None
    if a.ndim < 2 or b.ndim < 2:
        return None
    lead = a.shape[:-2]
    if b.ndim == 2:
        b3 = b.reshape(1, *b.shape)
    elif b.shape[:-2] == lead:
        b3 = b.reshape(-1, *b.shape[-2:])
    else:
        return None
    dt, lo, hi = _range(at)
    y = nat.intonly_matmul(
        _i32(a.reshape(-1, *a.shape[-2:])), _i32(b3), None if c is None else _i32(c),
        int(at["a_zero_point"]), int(at.get("b_zero_point", 0)), int(at["y_zero_point"]),
        _params(at, "multiplier"), _params(at, "shift"), lo, hi, _mode(at),
    )  # fmt: skip
    return y.reshape(*lead, a.shape[-2], b.shape[-1]).astype(dt)


def _conv(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray | None:
    x, w, c = (np.asarray(v) for v in ins[:3])
    if x.ndim != 4 or w.ndim != 4:
        return None
    geo_keys = ("kernel_shape", "strides", "pads", "dilations", "auto_pad")
    geom = conv_attrs(x.shape, w.shape[2:], **{k: at[k] for k in geo_keys if k in at})
    dt, lo, hi = _range(at)
    y = nat.intonly_conv2d(
        _i32(x), _i32(w), _i32(c), int(at["x_zero_point"]), int(at["y_zero_point"]),
        _params(at, "multiplier"), _params(at, "shift"), lo, hi, _mode(at),
        list(geom.strides), list(geom.dilations), list(geom.pads[:2]), list(geom.out_shape),
        int(at.get("group", 1)),
    )  # fmt: skip
    return y.astype(dt)


def _binary(nat: Any, at: dict, ins: Sequence[np.ndarray | None], op: str) -> np.ndarray:
    a, b = np.broadcast_arrays(np.asarray(ins[0]), np.asarray(ins[1]))
    dt, lo, hi = _range(at)
    m, s = int(_params(at, "multiplier")[0]), int(_params(at, "shift")[0])
    if op == "add":
        p = [
            int(at["a_zero_point"]), int(at["b_zero_point"]), int(at["y_zero_point"]),
            int(at["a_multiplier"]), int(at["a_shift"]), int(at["b_multiplier"]), int(at["b_shift"]),
            m, s, int(at.get("left_shift", 20)), lo, hi,
        ]  # fmt: skip
        y = nat.intonly_add(_i32(a), _i32(b), p, _mode(at))
    else:
        y = nat.intonly_mul(
            _i32(a), _i32(b), int(at["a_zero_point"]), int(at["b_zero_point"]), int(at["y_zero_point"]),
            m, s, lo, hi, _mode(at),
        )  # fmt: skip
    return y.reshape(a.shape).astype(dt)


def _softmax(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray | None:
    x = np.asarray(ins[0])
    table = ins[1] if len(ins) > 1 else None
    wide = table is None  # I-BERT's i-exp (exp_x0, exp_b, exp_c, exp_shift)
    kinds = (np.int8, np.uint8, np.int16) if wide else (np.int8, np.uint8)
    if x.ndim == 0 or x.size == 0 or x.dtype not in tuple(np.dtype(k) for k in kinds):
        return None
    axis = int(at.get("axis", -1)) % x.ndim
    moved = np.moveaxis(x, axis, -1)
    dt, lo, hi = _range(at)
    rows = _i32(moved.reshape(-1, moved.shape[-1]))
    y_shift, zy = int(at.get("y_shift", 8)), int(at.get("y_zero_point", -128))
    if wide:
        poly = [int(at[k]) for k in ("exp_x0", "exp_b", "exp_c", "exp_shift")]
        y = nat.intonly_softmax_poly(rows, *poly, y_shift, zy, lo, hi)
    else:
        y = nat.intonly_softmax(rows, _i32(np.asarray(table)), y_shift, zy, lo, hi)
    return np.moveaxis(y.reshape(moved.shape), -1, axis).astype(dt)


def _gelu(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray:
    x = np.asarray(ins[0])
    dt, lo, hi = _range(at)
    y = nat.intonly_gelu(
        _i32(x), int(at["x_zero_point"]), int(at["erf_b"]), int(at["erf_c"]), int(at["pre_shift"]),
        int(at["multiplier"]), int(at["shift"]), int(at["y_zero_point"]), lo, hi, _mode(at),
    )  # fmt: skip
    return y.reshape(x.shape).astype(dt)


def _layer_norm(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray | None:
    x = np.asarray(ins[0])
    if x.ndim == 0:
        return None
    dt, lo, hi = _range(at)
    y = nat.intonly_layer_norm(
        _i32(x.reshape(-1, x.shape[-1])), _i32(ins[1]), _i32(ins[2]), int(at["x_zero_point"]),
        int(at["y_zero_point"]), int(at["eps"]), int(at["gamma_shift"]), lo, hi,
    )  # fmt: skip
    return y.reshape(x.shape).astype(dt)


def _rescale(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray:
    x = np.asarray(ins[0])
    dt, lo, hi = _range(at)
    acc = _i32(x.astype(np.int64) - int(at["input_zero_point"])).reshape(1, 1, -1)
    y = nat.intonly_requantize(
        acc, _params(at, "multiplier"), _params(at, "shift"), int(at["output_zero_point"]), lo, hi, _mode(at)
    )
    return y.reshape(x.shape).astype(dt)


def _gap(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray | None:
    x = np.asarray(ins[0])
    if x.ndim < 3:
        return None
    dt, lo, hi = _range(at)
    s = (x.astype(np.int64) - int(at["x_zero_point"])).sum(axis=tuple(range(2, x.ndim)))
    acc = s.astype(np.int32).reshape(1, 1, -1)  # wraps to int32 as the golden's accumulator
    y = nat.intonly_requantize(
        acc, _params(at, "multiplier"), _params(at, "shift"), int(at["y_zero_point"]), lo, hi, _mode(at)
    )
    return y.reshape(*x.shape[:2], *([1] * (x.ndim - 2))).astype(dt)


def _lookup(nat: Any, at: dict, ins: Sequence[np.ndarray | None]) -> np.ndarray | None:
    del at
    x, table = np.asarray(ins[0]), np.asarray(ins[1])
    if x.dtype != np.int16 or table.shape != (513,) or table.dtype != np.int16:
        return None  # a gather from 256 entries: the golden's table[bits(x)] is the kernel
    return nat.intonly_lookup16(_i32(x), _i32(table)).reshape(x.shape).astype(np.int16)


_BINDERS = {
    "IntMatMul": _matmul,
    "IntConv": _conv,
    "IntAdd": lambda n, a, i: _binary(n, a, i, "add"),
    "IntMul": lambda n, a, i: _binary(n, a, i, "mul"),
    "IntSoftmax": _softmax,
    "IntGelu": _gelu,
    "IntLayerNorm": _layer_norm,
    "IntRescale": _rescale,
    "IntGlobalAveragePool": _gap,
    "IntLookup": _lookup,
}
