"""Shared helpers for pass tests: load a model built by code, run passes with the
verifier on, run the reference target, and the derived tolerances.

The four parts of a pass test (docs/style.md §6.7) use them as::

    model = load(proto)
    result = run_passes(model, [FoldBatchNorm()])          # verifier after every pass
    assert result.fired("FoldBatchNormIntoConv") == 1      # 1. it fired N times
    assert model.graph.op_counts() == {"Conv": 1}          # 2. structure after
    assert_close(run_ref(proto, feeds), run_ref(model, feeds), tol)   # 3. numerics
    verify(model.graph, Stage.FLOAT)                       # 4. (also done by the manager)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnx

from quanta.ir.graph import Model
from quanta.ir.onnx_io import to_proto
from quanta.ir.verify import Stage
from quanta.passes.manager import Pass, PassManager, PipelineResult
from quanta.runtime.compile import reference_evaluator  # noqa: F401  (the evaluator sessions inject)
from quanta.session import GraphOptimizationLevel, InferenceSession, SessionOptions

F32_EPS = float(np.finfo(np.float32).eps)  # 2^-23: unit roundoff u = eps/2


def run_passes(model: Model, passes: Sequence[Pass], stage: Stage | None = None) -> PipelineResult:
    """Run ``passes`` with the verifier after each one (as every test does)."""
    return PassManager(passes, verify=True, stage=stage).run(model)


def run_ref(model: Model | onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs on the reference target, with no further optimization: the graph runs as
    written (``ORT_DISABLE_ALL``), not through the compiler's default pipeline, which
    would lower both sides of a comparison alike."""
    proto = to_proto(model) if isinstance(model, Model) else model
    options = SessionOptions(graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL)
    return InferenceSession(proto, options, backend="reference").run(None, dict(feeds))


def run_ref_ir(model: Model, feeds: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of an IR model on the reference target without exporting it (for graphs
    onnx's checker would refuse on reload, e.g. the deprecated GroupNormalization-18)."""
    from quanta.targets.reference import ReferenceTarget

    exe = ReferenceTarget().prepare(model)
    return exe.run(dict(feeds), [v.name for v in model.graph.outputs])


def dot_tolerance(k: int, magnitude: np.ndarray | float) -> np.ndarray | float:
    """Bound on |folded - original| for results that are length-k float32 dot products
    (plus a few affine ops) of magnitude ``Σ|x_i·w_i|``: each side is within
    γ_{k+4}·Σ|x_i·w_i| of the exact value (Higham, γ_n = n·u/(1 - n·u), u = 2^-24),
    so the two differ by at most twice that."""
    u = F32_EPS / 2
    n = k + 4
    return 2 * (n * u / (1 - n * u)) * np.asarray(magnitude, np.float64)


def assert_close(expected: Sequence[np.ndarray], actual: Sequence[np.ndarray], tol) -> None:
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.shape == a.shape and e.dtype == a.dtype, (e.shape, e.dtype, a.shape, a.dtype)
        err = np.abs(e.astype(np.float64) - a.astype(np.float64))
        bound = np.broadcast_to(np.asarray(tol, np.float64), err.shape)
        worst = np.unravel_index(np.argmax(err - bound), err.shape) if err.size else ()
        assert np.all(err <= bound), (
            f"max error {err.max()} exceeds the bound at {worst}: |{e[worst]} - {a[worst]}| = {err[worst]} > {bound[worst]}"
        )


def out_info(name: str, rank: int, elem: int = onnx.TensorProto.FLOAT) -> onnx.ValueInfoProto:
    """A graph output of known rank and unknown dimensions (shape inference fills them)."""
    return onnx.helper.make_tensor_value_info(name, elem, [None] * rank)


def rng_data(shape, seed: int, low: float = -2.0, high: float = 2.0) -> np.ndarray:
    return np.random.default_rng(seed).uniform(low, high, shape).astype(np.float32)
