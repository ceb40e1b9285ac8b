"""``prepare``: a float model (ONNX or ``torch.nn.Module``) -> a trainable
:class:`~quanta.qat.module.QatModel` whose fake quantization is the file
``quantize_static`` writes for it.

quanta's own quantizer decides everything: where Q/DQ go (its operator rules, Relu/Clip
absorbed into ranges, BatchNorm folded into the weights first), the calibrated ranges
and so the scales and zero points (its observers and ``params_from_range``), the
per-channel symmetric weights, the int32 biases. ``prepare`` runs it and turns the
resulting QDQ graph into PyTorch operations; it never re-derives a parameter.
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from quanta.qat.module import QatModel

__all__ = ["prepare", "to_onnx"]


def to_onnx(
    module: torch.nn.Module, example_inputs: Sequence[torch.Tensor] | torch.Tensor, *, opset: int = 17
) -> onnx.ModelProto:
    """``module`` exported with the TorchScript exporter (``dynamo=False``: it needs no
    onnxscript and keeps every op as one ONNX node), inputs ``input0``, ``input1``, ...
    with a dynamic batch dimension."""
    if isinstance(example_inputs, torch.Tensor):
        example_inputs = (example_inputs,)
    names = [f"input{i}" for i in range(len(example_inputs))]
    buf = io.BytesIO()
    module = module.eval()
    torch.onnx.export(
        module,
        tuple(example_inputs),
        buf,
        dynamo=False,
        opset_version=opset,
        input_names=names,
        dynamic_axes={n: {0: "batch"} for n in names},
    )
    return onnx.load_from_string(buf.getvalue())


def prepare(
    model: torch.nn.Module | onnx.ModelProto | str | os.PathLike,
    example_inputs: Any = None,
    recipe: Any = None,
    *,
    calibration_data: Any = None,
    learn_scales: bool = False,
    **options: Any,
) -> QatModel:
    """A fake-quantized, trainable copy of ``model``.

    ``model``: an ONNX file / ModelProto, or an ``nn.Module`` (exported with
    :func:`to_onnx` on ``example_inputs``). ``calibration_data``: anything
    ``quantize_static`` accepts (for a module: tensors or feed dicts keyed ``input0``...);
    when omitted, ``example_inputs`` is the one calibration sample. ``recipe`` and
    ``options`` go to ``quantize_static`` unchanged. ``learn_scales``: LSQ step sizes.
    """
    from quanta.quantize.static import quantize_static

    if isinstance(model, torch.nn.Module):
        if example_inputs is None:
            raise ValueError("prepare: an nn.Module needs example_inputs (a tensor or a tuple of tensors)")
        proto = to_onnx(model, example_inputs)
        source: Any = proto.SerializeToString()
        names = [i.name for i in proto.graph.input]
        if calibration_data is None:
            ex = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
            calibration_data = [{n: t.detach().numpy() for n, t in zip(names, ex)}]
        else:
            calibration_data = [_feed(d, names) for d in calibration_data]
    else:
        source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else model
        if calibration_data is None:
            calibration_data = example_inputs
        if calibration_data is None:
            raise ValueError("prepare: an ONNX model needs calibration_data (as quantize_static takes)")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "qdq.onnx"
        quantize_static(source, out, calibration_data, recipe, verbose=False, **options)
        qdq = onnx.load(out)
    return QatModel(qdq, learn_scales=learn_scales)


def _feed(d: Any, names: list[str]) -> dict[str, np.ndarray]:
    if isinstance(d, dict):
        return {k: np.asarray(v.detach().numpy() if isinstance(v, torch.Tensor) else v) for k, v in d.items()}
    if isinstance(d, torch.Tensor):
        d = (d,)
    return {
        n: (t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)) for n, t in zip(names, d)
    }
