"""``Recipe.learned``: a quantized file's integer weights trained after calibration.

``quantize_static`` writes the QDQ file as always, then :func:`learn` turns it into a
:class:`~quanta.qat.module.QatModel` (every activation fake-quantized with the file's own
scales, zero points and formats, 16-bit ones included; the forward is the deployed
arithmetic, docs/qat.md), distils it against the FP32 model's outputs on the
calibration feeds (:func:`quanta.qat.train.distill`: KL of the logits, or the
normalised MSE), keeps the state best on a held-out part of those feeds, and writes the
weight and int32 bias codes back into the same file. Nothing else in the file changes:
the Q/DQ placement, every scale and zero point, which tensors are 16-bit, which nodes
stay float, so the integer MAC shares are those of the file before training.

Method "qad" (quantization-aware distillation): the weights are trained as floats
through the straight-through estimator, the codes are their rounding on the file's
grid; Adam's step is ``lr`` of each tensor's quantization step (train.distill).

Determinism: the held-out split, the batches and PyTorch are seeded by the spec's
``seed``; the steps are a count, not a time budget; so the same FP32 model, feeds,
recipe and ``torch.get_num_threads()`` give the same bytes (PyTorch's CPU reductions
split by thread, so another thread count may move a code near a rounding boundary).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch

from quanta.qat.module import QatModel
from quanta.qat.train import distill
from quanta.qat.write import export_proto

__all__ = ["learn", "trainable"]


def trainable(path: str | os.PathLike) -> str:
    """ "" when quanta.qat can train the QDQ file at ``path``, else why not."""
    try:
        QatModel(onnx.load(os.fspath(path)))
    except Exception as e:  # an op or a pattern the module does not model
        return f"{type(e).__name__}: {e}"
    return ""


def learn(
    fp32_model: Any, path: str | os.PathLike, feeds: Sequence[dict[str, np.ndarray]], spec: dict[str, Any]
) -> dict[str, Any]:
    """Train the QDQ file at ``path`` in place per ``spec`` (Recipe.learned, completed
    by quanta.quantize.recipe.learned_spec); ``fp32_model``: the float model as an ONNX
    path, bytes or ModelProto (the teacher). Returns what the run did: steps, the step
    whose state was kept, the held-out loss before and after, CPU seconds."""
    c0, t0 = time.process_time(), time.perf_counter()
    proto = onnx.load(os.fspath(path))
    model = QatModel(proto)
    names = set(model.input_names)
    data = [{k: np.asarray(v) for k, v in f.items() if k in names} for f in feeds]
    res = distill(
        model,
        fp32_model,
        data,
        steps=int(spec["steps"]),
        batch_size=int(spec["batch_size"]),
        lr=float(spec["lr"]),
        holdout=float(spec["holdout"]),
        eval_every=int(spec["eval_every"]),
        patience=int(spec["patience"]),
        augment=spec["augment"],
        schedule="cosine",
        warmup=float(spec["warmup"]),
        seed=int(spec["seed"]),
        progress=False,
    )
    out = export_proto(model)
    onnx.checker.check_model(out)
    onnx.save(out, os.fspath(path))
    return {
        "method": spec["method"],
        "steps": res.steps,
        "best_step": res.best_step,
        "holdout_loss": (res.initial_holdout_loss, res.best_holdout_loss),
        "cpu_seconds": time.process_time() - c0,
        "seconds": time.perf_counter() - t0,
        "threads": torch.get_num_threads(),
    }
