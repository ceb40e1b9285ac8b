"""Reference ops of the ``ai.onnx.ml`` domain that models carry next to their network.

``LabelEncoder`` maps each element through a table: the string tokens a TensorFlow
export turns into ids before its embedding (tf2onnx writes it for a lookup table), or
the ids a classifier turns back into labels. Every version is one dictionary lookup:

- version 1: ``classes_strings`` is the table; a string input becomes its index there
  (``default_int64``, -1 by default, when absent), an int64 input becomes the string at
  that index (``default_string``, ``"_Unused"`` by default, when out of range);
- version 2: ``keys_*`` and ``values_*`` (floats, int64s or strings) are the pairs,
  ``default_*`` of the value type the miss;
- version 4: the same from ``keys_tensor`` / ``values_tensor`` / ``default_tensor`` as
  well (any of the numeric types or strings).

A float key matches by value (ONNX Runtime's rule; NaN matches no key). String tensors
are numpy arrays of ``str`` (``object``, or numpy's fixed-width unicode on the way in).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["label_encoder"]

ML_DOMAIN = "ai.onnx.ml"


def _strings(a: np.ndarray) -> np.ndarray:
    """A string tensor as numpy ``object`` of ``str`` (bytes decoded as UTF-8)."""
    if a.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8", errors="replace"), otypes=[object])(a)
    if a.dtype.kind in "UO":
        return a.astype(object)
    raise OpError(f"expected a string tensor, got {a.dtype}")


def _lookup(x: np.ndarray, keys: list[Any], values: np.ndarray, default: Any) -> np.ndarray:
    table = {k: i for i, k in reversed(list(enumerate(keys)))}  # the first of duplicates wins
    flat = x.reshape(-1)
    idx = np.fromiter((table.get(k, -1) for k in flat.tolist()), dtype=np.int64, count=flat.size)
    out = np.empty(flat.size, dtype=values.dtype)
    hit = idx >= 0
    out[hit] = values[idx[hit]]
    out[~hit] = default
    return out.reshape(x.shape)


def _pairs(attrs: dict[str, Any], side: str) -> tuple[list[Any], np.ndarray] | None:
    """(python values, numpy array) of ``keys`` / ``values`` from whichever attribute is
    set; None when none is."""
    if f"{side}_tensor" in attrs:
        t = np.asarray(attrs[f"{side}_tensor"])
        arr = _strings(t) if t.dtype.kind in "SUO" else t.reshape(-1)
        return [*arr.reshape(-1).tolist()], arr.reshape(-1)
    for suffix, dtype in (("strings", object), ("int64s", np.int64), ("floats", np.float32)):
        if f"{side}_{suffix}" in attrs:
            vals = list(attrs[f"{side}_{suffix}"])
            arr = np.array(vals, dtype=dtype)
            if dtype is np.float32:
                vals = arr.tolist()  # float keys compare as float32 values
            return vals, arr
    return None


@register("LabelEncoder", ML_DOMAIN)
def label_encoder(ctx: OpContext, x: np.ndarray, **attrs: Any) -> np.ndarray:
    string_in = x.dtype.kind in "SUO"
    if string_in:
        x = _strings(x)
    if "classes_strings" in attrs:  # version 1
        classes = list(attrs["classes_strings"])
        if string_in:
            return _lookup(
                x, classes, np.arange(len(classes), dtype=np.int64), attrs.get("default_int64", -1)
            )
        if x.dtype != np.int64:
            raise OpError(f"LabelEncoder (version 1) maps string <-> int64, got input {x.dtype}")
        default = attrs.get("default_string", "_Unused")
        flat = x.reshape(-1)
        out = np.array(
            [classes[i] if 0 <= i < len(classes) else default for i in flat.tolist()], dtype=object
        )
        return out.reshape(x.shape)
    keys = _pairs(attrs, "keys")
    values = _pairs(attrs, "values")
    if keys is None or values is None:
        raise OpError("LabelEncoder sets no keys_* / values_* attribute (nor classes_strings)")
    if len(keys[0]) != len(values[0]):
        raise OpError(f"LabelEncoder has {len(keys[0])} keys but {len(values[0])} values")
    vdtype = values[1].dtype
    if "default_tensor" in attrs:
        d = np.asarray(attrs["default_tensor"]).reshape(-1)
        default: Any = (_strings(d) if d.dtype.kind in "SUO" else d)[0]
    elif vdtype.kind == "O":
        default = attrs.get("default_string", "_Unused")
    elif vdtype.kind == "f":
        default = attrs.get("default_float", -0.0)
    else:
        default = attrs.get("default_int64", -1)
    key_vals = keys[0]
    if not string_in:
        kd = keys[1].dtype
        if kd.kind == "O":
            raise OpError(f"LabelEncoder has string keys but a {x.dtype} input")
        x = x.astype(kd, copy=False)
        key_vals = keys[1].tolist()
    return _lookup(x, key_vals, values[1], default)
