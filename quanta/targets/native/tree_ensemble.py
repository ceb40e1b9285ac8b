"""TreeEnsembleClassifier / TreeEnsembleRegressor (``ai.onnx.ml``) on the native target:
the twin's functions (reference/tree_ensemble.py) on a :class:`Forest` built once per
node instead of on every call. The node table, the children as indices and the leaves'
weight entries are array passes over every attribute list, done once; what a run does
is the row-parallel descent and the weight sums, as the twin's."""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.registry import ML_DOMAIN
from quanta.kernels.reference.tree_ensemble import Forest, classify, regress
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder


def _bind(prefix: str, fn: Any, name: str):
    def bind(model: Model, node: Node) -> tuple[Kernel | None, str]:
        del model, node  # the node's attributes arrive with each call
        kept: list[Forest] = []

        def run(ctx: Any, x: np.ndarray, *, out: Any = None, **attrs: Any) -> Any:
            del ctx, out  # outputs of data-dependent type (string labels): no planned buffer
            if not kept:  # the twin's checks (OpError) run here, once
                kept.append(Forest(attrs, prefix))
            return fn(kept[0], attrs, x)

        return Kernel(run, "native", f"native:{name}", out=False), ""

    return bind


register_binder("TreeEnsembleRegressor", ML_DOMAIN)(_bind("target", regress, "tree_ensemble_regressor"))
register_binder("TreeEnsembleClassifier", ML_DOMAIN)(_bind("class", classify, "tree_ensemble_classifier"))
