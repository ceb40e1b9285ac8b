"""``quantize_static`` on a file that is already quantized (ONNX Runtime's QDQ, QOperator
or dynamic formats, NNCF, a QAT export): quantize what can be, keep what the file chose.

ONNX Runtime's ``quantize_static`` warns on such a file and goes on, keeping weights that
are already behind a DequantizeLinear; a QAT file's parameters are the training's result.
quanta does the same through the file's float view (quanta.quantize.float_view):

1. derive the float model the file stands for (weights dequantized, activation Q/DQ
   dropped, QOperator and dynamic integer operators as their float operators);
2. quantize it as any float model, calibrating on the data, except that every activation
   the file quantized keeps the file's grid: a fixed range ``[(qmin - zp) * s,
   (qmax - zp) * s]`` in the file's storage type (a recipe override; the parameters
   computed from it are the file's to float rounding). Weights are quantized again from
   their dequantized values with nearest rounding and no bias correction, so a weight
   on the file's grid keeps its integers where the grids agree (symmetric, same
   granularity);
3. the regions the file left float are quantized with calibrated ranges, and the
   summary says which of the file's tensors were kept, which were calibrated, and what
   the view replaced (a dynamic operator becomes a statically quantized one: static
   quantization is what was asked for).

``keep_parameters=False`` ignores the file's activation grids and calibrates every tensor.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import numpy as np
import onnx

from quanta.quantize.float_view import FloatView, derive_float_view, quantized_ops
from quanta.quantize.recipe import Recipe, RecurrentMode, TensorOverride

__all__ = [
    "file_overrides",
    "guard_input",
    "in_view",
    "prepare_prequantized",
    "prepare_prequantized_dynamic",
    "quantizing_view",
]

# True while a file's float view is being quantized. The view keeps the nodes that have
# no float form as the file has them (FloatView.kept: a DequantizeLinear of an integer
# graph input, an operator with no float twin), so it may still hold quantized
# operators: it is quantized as the float model it is, never sent through the view again.
_IN_VIEW: ContextVar[bool] = ContextVar("quanta_quantizing_float_view", default=False)


def in_view() -> bool:
    """Whether a file's float view is being quantized (its kept nodes may be quantized)."""
    return _IN_VIEW.get()


@contextlib.contextmanager
def quantizing_view() -> Iterator[None]:
    """Within: :func:`load_if_quantized` takes every model for a float one."""
    token = _IN_VIEW.set(True)
    try:
        yield
    finally:
        _IN_VIEW.reset(token)


def file_overrides(view: FloatView) -> dict[str, TensorOverride]:
    """The file's activation grids as fixed-range overrides of the view's tensors."""
    out: dict[str, TensorOverride] = {}
    for name, (scale, zp, dtype) in view.activation_params.items():
        info = np.iinfo(np.dtype(dtype))
        if not (scale > 0 and np.isfinite(scale)) or dtype not in ("uint8", "int8", "uint16", "int16"):
            continue
        out[name] = TensorOverride(range=((info.min - zp) * scale, (info.max - zp) * scale), dtype=dtype)
    return out


def prepare_prequantized(
    proto: onnx.ModelProto, recipe: Recipe, keep_parameters: bool = True
) -> tuple[onnx.ModelProto, Recipe, list[str]] | None:
    """(the float view to quantize, the recipe to quantize it with, the notes for the
    summary), or None for a float model."""
    found = _view_of(proto, "")
    if found is None:
        return None
    view, notes = found
    overrides: dict[str, TensorOverride] = {}
    if keep_parameters:
        present = {o for n in view.model.graph.node for o in n.output} | {
            i.name for i in view.model.graph.input
        }
        overrides = {k: v for k, v in file_overrides(view).items() if k in present}
        notes.append(
            f"the file's own scale and zero point (its tool's or its training's choice) for its "
            f"{len(overrides)} quantized activation tensor(s), wherever quanta quantizes them too; "
            "the tensors it left float are calibrated"
        )
    else:
        notes.append(
            "the file's activation parameters were ignored (keep_parameters=False): every tensor is calibrated"
        )
    dynamic = sorted(
        {
            op
            for op in view.mapped
            if op
            in (
                "MatMulInteger",
                "ConvInteger",
                "DynamicQuantizeLSTM",
                "DynamicQuantizeGRU",
                "DynamicQuantizeMatMul",
                "MatMulIntegerToFloat",
            )
        }
    )
    if dynamic:
        notes.append(
            f"the file's dynamic operators ({', '.join(dynamic)}) are quantized again as quanta "
            "quantizes their float forms: statically with calibrated ranges (an LSTM as "
            "DynamicQuantizeLSTM and a GRU as DynamicQuantizeGRU by default, Recipe.recurrent)"
        )
    # the user's own overrides win over the file's
    rec = dataclasses.replace(
        recipe,
        overrides={**overrides, **recipe.overrides},
        weight_rounding="nearest",
        bias_correction=False,
        pool_bias_correction=False,  # the file's biases, as its weights: no eq. (28) either
        # the file's recurrent layers as quanta writes them, unmeasured (no eq. (30)): a file
        # made with dynamic LSTMs keeps them, as it keeps its own 8-bit grids (no eq. (27))
        recurrent=RecurrentMode.DYNAMIC if recipe.recurrent is RecurrentMode.AUTO else recipe.recurrent,
    )
    notes.append(
        "weights quantized again from their dequantized values (nearest rounding, no bias correction)"
    )
    return view.model, rec, notes


def prepare_prequantized_dynamic(proto: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]] | None:
    """``quantize_dynamic`` on an already-quantized file: (the float view to quantize,
    the notes for the summary), or None for a float model. Dynamic quantization keeps no
    activation grid (each run computes its own), so the file's activation parameters
    are dropped; its weights are quantized again from their dequantized values, which
    keeps their integers where the grids agree (symmetric int8, the same granularity)."""
    found = _view_of(proto, " dynamically")
    if found is None:
        return None
    view, notes = found
    if view.activation_params:
        notes.insert(
            1,
            f"the file's {len(view.activation_params)} activation grid(s) are not kept: dynamic "
            "quantization computes each activation's scale per run",
        )
    return view.model, notes


def _view_of(proto: onnx.ModelProto, how: str) -> tuple[FloatView, list[str]] | None:
    """The float view of a quantized ``proto`` and the summary's notes on it (what the
    file was, the nodes the view keeps as the file has them), or None for a float model;
    ``how``: the words after "quantized the float model it stands for (...)"."""
    ops = quantized_ops(proto)
    if not ops:
        return None
    view = derive_float_view(proto)
    notes = [
        f"the input is already quantized ({', '.join(ops)}): quanta quantized the float model it "
        f"stands for ({view.format()}){how}"
    ]
    if view.kept:
        notes.append(
            f"{len(view.kept)} node(s) of the file have no float form here and stay as the file has them: "
            + ", ".join(f"{n or '<unnamed>'} ({op})" for n, op, _ in view.kept[:8])
        )
    return view, notes


def guard_input(model_input: Any, model_output: str | os.PathLike) -> None:
    """Refuses ``model_output`` when it is the file ``model_input`` names: quantizing a
    file's float view writes from a proto that no longer knows its source path, so
    the save cannot see the clash itself."""
    if isinstance(model_input, (bytes, onnx.ModelProto)):
        return
    src, dest = os.fspath(model_input), os.fspath(model_output)
    if os.path.exists(src) and os.path.exists(dest) and os.path.samefile(src, dest):
        raise FileExistsError(f"{dest}: refusing to overwrite the input model; choose another output path")


def load_if_quantized(model_input: Any) -> onnx.ModelProto | None:
    """The model as a proto when it is already quantized (None for a float model: its
    file is then read once more by the caller, its external data not at all here)."""
    from quanta.ir.onnx_io import load_proto

    if _IN_VIEW.get():
        return None
    if isinstance(model_input, onnx.ModelProto):
        head = model_input
    elif isinstance(model_input, bytes):
        head = onnx.load_from_string(model_input)
    else:
        try:
            head = onnx.load(os.fspath(model_input), load_external_data=False)
        except Exception:  # the caller's loader says what is wrong with the file
            return None
    if not quantized_ops(head):
        return None
    return load_proto(model_input)[0]
