"""``export``: a trained :class:`~quanta.qat.module.QatModel` back to a QDQ ONNX file.

The file is the QDQ model the module was built from, with three kinds of initializers
replaced: weight codes (the forward's ``sat(rne(w/s) + z)``, in the original storage
type), int32 bias codes (``quantize_bias`` at ``f32(sx·sw)`` of the current scales, and
that scale), and, with learned scales, the scales. Nothing else changes, so every node
the lowering turned into an integer kernel before training does so after it.
"""

from __future__ import annotations

import os

import numpy as np
import onnx
import torch
from onnx import numpy_helper

__all__ = ["export", "export_proto"]


def _replace(proto: onnx.ModelProto, values: dict[str, np.ndarray]) -> None:
    for t in proto.graph.initializer:
        if t.name in values:
            arr = values.pop(t.name).astype(numpy_helper.to_array(t).dtype)
            t.CopyFrom(numpy_helper.from_array(arr.reshape(tuple(t.dims)), t.name))
    for n in proto.graph.node:
        if n.op_type == "Constant" and n.output[0] in values:
            for a in n.attribute:
                if a.name == "value":
                    arr = values.pop(n.output[0]).astype(numpy_helper.to_array(a.t).dtype)
                    a.t.CopyFrom(numpy_helper.from_array(arr.reshape(tuple(a.t.dims)), n.output[0]))


@torch.no_grad()
def export_proto(model) -> onnx.ModelProto:
    """The QDQ ModelProto of ``model`` (a QatModel) with its current parameters."""
    proto = onnx.ModelProto()
    proto.CopyFrom(model.template)
    values: dict[str, np.ndarray] = {}
    codes: dict = {}
    env: dict = {}
    producer = model._producer
    for out, w in model._weights.items():
        model._dequantize(producer[out], env, codes)
        values[w["codes"]] = codes[out][0].numpy().astype(np.int64)
    for out, b in model._biases.items():
        model._dequantize(producer[out], env, codes)
        q, sb, _ = codes[out]
        values[b["codes"]] = q.numpy().astype(np.int64)
        if b["tied"]:
            values[b["scale"]] = sb.float().numpy().reshape(model._tensor(b["scale"]).shape)
    if model.learn_scales:
        for name, key in model._slots.items():
            if key in model._params and name not in values:
                values[name] = model._params[key].detach().float().numpy()
    _replace(proto, values)
    return proto


def export(model, path: str | os.PathLike) -> onnx.ModelProto:
    """Write ``model``'s QDQ ONNX file to ``path`` (checked with ``onnx.checker``)."""
    proto = export_proto(model)
    onnx.checker.check_model(proto)
    onnx.save(proto, os.fspath(path))
    return proto
