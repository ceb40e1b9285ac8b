"""npu-sim's lowering pipeline: the passes the target declares (docs/passes.md
"Integer-only stage"); :mod:`quanta.runtime.npu_sim` runs and reports on it."""

from __future__ import annotations

from quanta.ir.graph import Model
from quanta.passes.lower.integer_only import IntegerOnly
from quanta.passes.manager import Pass

__all__ = ["npu_pipeline"]


def npu_pipeline(model: Model, rounding: str = "double") -> list[Pass]:
    """``lower_qdq`` without ChannelsLast (the device's convolutions are NCHW),
    FoldFloatWeights (the weights of a group left for IntegerOnly stay integers) and
    FoldCodeClampPass (the device's IntConv has no output clamp: a clamp stays its table),
    then IntegerOnly and dead code."""
    from quanta.passes.lower.qdq_to_qlinear import LowerQdqToQLinear
    from quanta.passes.pipelines import lower_qdq
    from quanta.passes.rules.eliminate_dead import EliminateDead
    from quanta.targets.reference import reference_evaluator

    evaluator = reference_evaluator(model.opset_imports)
    passes = [
        # the host's 16-bit / 4-bit kernels are not the device's: IntegerOnly lowers those
        # groups itself
        LowerQdqToQLinear(model.opset(), evaluator, wide=False) if isinstance(p, LowerQdqToQLinear) else p
        for p in lower_qdq(opset=model.opset(), evaluator=evaluator)
        if type(p).__name__ not in ("ChannelsLast", "EliminateDead", "FoldFloatWeights", "FoldCodeClampPass")
    ]
    return [*passes, IntegerOnly(rounding), EliminateDead()]
