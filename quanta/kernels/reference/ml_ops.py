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

``CategoryMapper`` is the version-1 LabelEncoder with its table in two lists
(``cats_strings`` / ``cats_int64s``): strings to int64 (``default_int64``, -1) or back
(``default_string``, ``"_Unused"``); of duplicate keys the last pair wins, as in ONNX
Runtime.

``ZipMap`` ends every scikit-learn classifier that skl2onnx writes with its defaults: the
[N, C] probabilities become a sequence of N maps, class label (``classlabels_int64s`` or
``classlabels_strings``) -> probability, one per row; a [C] input is one row. A sequence
is a list and a map a dict, as ONNX Runtime returns them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["category_mapper", "encoder", "label_encoder", "zip_map"]

ML_DOMAIN = "ai.onnx.ml"


def _strings(a: np.ndarray) -> np.ndarray:
    """A string tensor as numpy ``object`` of ``str`` (bytes decoded as UTF-8)."""
    if a.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8", errors="replace"), otypes=[object])(a)
    if a.dtype.kind in "UO":
        return a.astype(object)
    raise OpError(f"expected a string tensor, got {a.dtype}")


def _table(keys: list[Any]) -> dict[Any, int]:
    return {k: i for i, k in reversed(list(enumerate(keys)))}  # the first of duplicates wins


def _mapper(keys: list[Any], values: np.ndarray, default: Any) -> Callable[[np.ndarray], np.ndarray]:
    """Each element of x through the key -> value table (the first of duplicate keys
    wins), ``default`` for a miss; the values as ``values.dtype``. One dictionary lookup
    an element and one array built: a tokenizer's few symbols cost ~1 us, not the
    masks and fancy indexing of an index array."""
    vals = values.tolist()
    table = {k: vals[i] for k, i in _table(keys).items()}
    get, dtype = table.get, values.dtype
    if dtype.kind == "O":

        def objects(x: np.ndarray) -> np.ndarray:
            out = np.empty(x.size, dtype=object)
            out[:] = [get(k, default) for k in x.reshape(-1).tolist()]
            return out.reshape(x.shape)

        return objects

    def numbers(x: np.ndarray) -> np.ndarray:
        flat = x.reshape(-1).tolist()
        return np.fromiter((get(k, default) for k in flat), dtype=dtype, count=len(flat)).reshape(x.shape)

    return numbers


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
    return encoder(attrs, x.dtype)(x)


def encoder(attrs: dict[str, Any], dtype: np.dtype) -> Callable[[np.ndarray], np.ndarray]:
    """The LabelEncoder of ``attrs`` for inputs of ``dtype``: its table built once, so a
    caller that keeps it (the native target, per node) maps each call's elements only."""
    string_in = dtype.kind in "SUO"
    if "classes_strings" in attrs:  # version 1
        classes = list(attrs["classes_strings"])
        if string_in:
            to_ids = _mapper(classes, np.arange(len(classes), dtype=np.int64), attrs.get("default_int64", -1))
            return lambda x: to_ids(_strings(x))
        if dtype != np.int64:
            raise OpError(f"LabelEncoder (version 1) maps string <-> int64, got input {dtype}")
        default = attrs.get("default_string", "_Unused")

        def to_strings(x: np.ndarray) -> np.ndarray:
            flat = x.reshape(-1)
            out = np.array(
                [classes[i] if 0 <= i < len(classes) else default for i in flat.tolist()], dtype=object
            )
            return out.reshape(x.shape)

        return to_strings
    keys = _pairs(attrs, "keys")
    values = _pairs(attrs, "values")
    if keys is None or values is None:
        raise OpError("LabelEncoder sets no keys_* / values_* attribute (nor classes_strings)")
    if len(keys[0]) != len(values[0]):
        raise OpError(f"LabelEncoder has {len(keys[0])} keys but {len(values[0])} values")
    vdtype = values[1].dtype
    miss: Any
    if "default_tensor" in attrs:
        d = np.asarray(attrs["default_tensor"]).reshape(-1)
        miss = (_strings(d) if d.dtype.kind in "SUO" else d)[0]
    elif vdtype.kind == "O":
        miss = attrs.get("default_string", "_Unused")
    elif vdtype.kind == "f":
        miss = attrs.get("default_float", -0.0)
    else:
        miss = attrs.get("default_int64", -1)
    if string_in:
        from_strings = _mapper(keys[0], values[1], miss)
        return lambda x: from_strings(_strings(x))
    kd = keys[1].dtype
    if kd.kind == "O":
        raise OpError(f"LabelEncoder has string keys but a {dtype} input")
    from_numbers = _mapper(keys[1].tolist(), values[1], miss)
    return lambda x: from_numbers(x.astype(kd, copy=False))


@register("CategoryMapper", ML_DOMAIN)
def category_mapper(ctx: OpContext, x: np.ndarray, **attrs: Any) -> np.ndarray:
    strings = [str(v) for v in attrs.get("cats_strings", [])]
    ids = [int(i) for i in attrs.get("cats_int64s", [])]
    if len(strings) != len(ids):
        raise OpError(f"CategoryMapper has {len(strings)} cats_strings but {len(ids)} cats_int64s")
    # of duplicate keys the last pair wins (ONNX Runtime fills its map pair by pair)
    if x.dtype.kind in "SUO":
        table: dict[Any, Any] = dict(zip(strings, ids))
        to_ids = _mapper(
            list(table), np.array(list(table.values()), dtype=np.int64), int(attrs.get("default_int64", -1))
        )
        return to_ids(_strings(x))
    if x.dtype != np.int64:
        raise OpError(f"CategoryMapper maps string <-> int64, got input {x.dtype}")
    table = dict(zip(ids, strings))
    values = np.empty(len(table), dtype=object)
    values[:] = list(table.values())
    to_strings = _mapper(list(table), values, attrs.get("default_string", "_Unused"))
    return to_strings(x)


@register("ZipMap", ML_DOMAIN)
def zip_map(ctx: OpContext, x: np.ndarray, **attrs: Any) -> tuple[list[dict[Any, float]]]:
    labels: list[Any]
    if "classlabels_strings" in attrs:
        labels = [str(v) for v in attrs["classlabels_strings"]]
    elif "classlabels_int64s" in attrs:
        labels = [int(v) for v in attrs["classlabels_int64s"]]
    else:
        raise OpError("ZipMap sets neither classlabels_strings nor classlabels_int64s")
    rows = np.asarray(x, dtype=np.float32)
    if rows.ndim == 1:
        rows = rows[None, :]
    if rows.ndim != 2 or rows.shape[1] != len(labels):
        raise OpError(
            f"ZipMap expects a [N, {len(labels)}] (or [{len(labels)}]) float input for its "
            f"{len(labels)} class labels, got shape {list(np.shape(x))}"
        )
    # a one-tuple: the executor reads a returned list as one value per output
    return ([dict(zip(labels, row)) for row in rows.tolist()],)
