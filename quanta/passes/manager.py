"""Passes and the pass manager.

A pass follows onnx-ir's contract (docs/style.md §2)::

    requires(graph)                 -> None, or raise PreconditionError
    call(graph) -> PassResult(graph, modified, stats)
    ensures(graph)                  -> None, or raise PostconditionError

:class:`PassManager` runs a plain ordered list of passes (a pipeline, see
:mod:`quanta.passes.pipelines`) once, in order:

1. with verification on, the input graph is verified first (a broken input is not
   blamed on the first pass);
2. for each pass: ``requires`` -> ``call`` -> ``ensures`` -> ``verify(graph, stage)``;
   any exception is re-raised as :class:`PassError` naming the pass and its step
   index ("step 3/7 'fold_batchnorm': ...");
3. each step is timed (:class:`PassRecord`: seconds in the pass, seconds verifying);
4. after a pass named in ``dump_after`` the IR is printed with
   :func:`quanta.ir.printer.format_graph` (``"*"`` dumps after every pass).

Verification is on when ``PassManager(verify=True)``, or, when ``verify`` is left at
None, when the process-wide default is on (:func:`set_verify_default`): the test suite
turns it on in ``tests/conftest.py``; the CLI's debug mode may do the same. It is an
explicit option, not an environment variable (docs/style.md §7).

The stage the verifier checks is the manager's ``stage`` argument, or, when None,
:func:`infer_stage` of the input graph. A pass that changes the stage (lowering)
declares it in ``produces_stage``; later steps are verified in that stage.

Rule-based passes (:class:`quanta.passes.pattern.RewritePass`) also leave the reasons
their rules refused to fire in :attr:`PipelineResult.no_matches`; ``why_not(RULE)``
filters them (what ``quanta inspect --why-not RULE`` prints).
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar, TextIO

from quanta.ir.graph import Graph, Model
from quanta.ir.op_rules import QUANT_OPS, VIEW_OPS, Stage
from quanta.ir.printer import format_graph
from quanta.ir.types import QuantType
from quanta.ir.verify import verify

if TYPE_CHECKING:
    from quanta.passes.pattern import NoMatchRecord

__all__ = [
    "Pass",
    "PassError",
    "PassManager",
    "PassRecord",
    "PassResult",
    "PipelineResult",
    "PostconditionError",
    "PreconditionError",
    "infer_stage",
    "set_verify_default",
    "verify_default",
]

_VERIFY_DEFAULT = False


def set_verify_default(on: bool) -> None:
    """Turn the verifier after every pass on or off for managers created with
    ``verify=None`` (tests and debug mode turn it on)."""
    global _VERIFY_DEFAULT
    _VERIFY_DEFAULT = bool(on)


def verify_default() -> bool:
    return _VERIFY_DEFAULT


class PreconditionError(ValueError):
    """``requires`` refused the graph."""


class PostconditionError(ValueError):
    """``ensures`` found the pass did not establish what it promises."""


class PassError(RuntimeError):
    """A pass (or the verifier after it) failed; the message names the pass and step."""

    def __init__(self, message: str, *, pass_name: str, step: int):
        super().__init__(message)
        self.pass_name = pass_name
        self.step = step


@dataclass
class PassResult:
    """What a pass returns: the graph (passes here rewrite in place and return the same
    object), whether anything changed, and counters (e.g. how often each rule fired)."""

    graph: Graph
    modified: bool
    stats: dict[str, int] = field(default_factory=dict)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


class Pass:
    """Base class. Subclasses implement :meth:`call`; ``name`` defaults to the class
    name in snake case (``FoldBatchNorm`` -> ``fold_batch_norm``) and is what
    ``dump_after`` and error messages use."""

    name: ClassVar[str] = ""
    #: the stage the graph is in after this pass, when the pass changes it (lowering)
    produces_stage: ClassVar[Stage | None] = None

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__dict__.get("name"):
            cls.name = _snake(cls.__name__)

    def requires(self, graph: Graph) -> None:
        """Raise :class:`PreconditionError` when the pass cannot run on ``graph``."""
        del graph  # no precondition by default

    def call(self, graph: Graph) -> PassResult:
        raise NotImplementedError

    def ensures(self, graph: Graph) -> None:
        """Raise :class:`PostconditionError` when the pass's promise does not hold."""
        del graph  # no postcondition by default

    def __call__(self, graph: Graph) -> PassResult:
        """Run the pass alone: requires -> call -> ensures (no verification)."""
        self.requires(graph)
        result = self.call(graph)
        self.ensures(result.graph)
        return result

    def no_matches(self) -> list[NoMatchRecord]:
        """Reasons rules refused during the last run (rule-based passes only)."""
        return []

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


@dataclass
class PassRecord:
    """One step of a pipeline run."""

    step: int
    name: str
    seconds: float
    verify_seconds: float
    modified: bool
    stats: dict[str, int]


@dataclass
class PipelineResult:
    graph: Graph
    modified: bool
    records: list[PassRecord]
    no_matches: list[NoMatchRecord]

    def why_not(self, rule: str, *, include_pattern: bool = False) -> list[NoMatchRecord]:
        """Refusals of ``rule`` (class name or snake-case name, case-insensitive).
        Nodes whose surroundings do not have the pattern's structure at all (kind
        "pattern") are left out unless ``include_pattern``."""
        key = rule.replace("_", "").lower()
        return [
            r
            for r in self.no_matches
            if r.rule.replace("_", "").lower() == key and (include_pattern or r.kind != "pattern")
        ]

    def fired(self, rule_or_pass: str) -> int:
        """How often a rule fired (summed over steps), or the total of a pass's counters."""
        total = 0
        for rec in self.records:
            total += rec.stats.get(rule_or_pass, 0)
            if rec.name == rule_or_pass:
                total += sum(rec.stats.values())
        return total

    def format_timings(self) -> str:
        width = max((len(r.name) for r in self.records), default=4)
        lines = [f"{'step':>4}  {'pass':<{width}}  {'ms':>9}  {'verify ms':>9}  changed"]
        for r in self.records:
            changed = "yes" if r.modified else "no"
            lines.append(
                f"{r.step:>4}  {r.name:<{width}}  {r.seconds * 1e3:9.2f}  {r.verify_seconds * 1e3:9.2f}  {changed}"
            )
        return "\n".join(lines)


def infer_stage(graph: Graph) -> Stage:
    """LOWERED when an integer operator appears or a computing op carries a quantized
    type; QDQ when QuantizeLinear/DequantizeLinear or quantized values appear; else FLOAT."""
    qdq = False
    for node in graph.nodes:
        if node.op_type in QUANT_OPS - {"QuantizeLinear", "DequantizeLinear"}:
            return Stage.LOWERED
        if node.op_type in ("QuantizeLinear", "DequantizeLinear"):
            qdq = True
            continue
        if node.op_type not in VIEW_OPS:
            for v in [*node.inputs, *node.outputs]:
                if v is not None and v.type is not None and isinstance(v.type.elem, QuantType):
                    return Stage.LOWERED
    if qdq:
        return Stage.QDQ
    for v in graph.values():
        if v.type is not None and isinstance(v.type.elem, QuantType):
            return Stage.QDQ
    return Stage.FLOAT


class PassManager:
    """Run ``passes`` in order on a graph (or a model's graph).

    ``verify``: run the verifier before the first pass and after every pass (None: the
    process-wide default, see :func:`set_verify_default`). ``stage``: the stage to
    verify in (None: inferred from the input graph). ``dump_after``: pass names after
    which the IR is printed to ``dump_to`` (default stdout); ``"*"`` means every pass.
    """

    def __init__(
        self,
        passes: Sequence[Pass],
        *,
        verify: bool | None = None,
        stage: Stage | None = None,
        dump_after: Iterable[str] = (),
        dump_to: TextIO | None = None,
    ):
        self.passes = list(passes)
        for p in self.passes:
            if not isinstance(p, Pass):
                raise TypeError(f"pipeline entries must be Pass instances, got {p!r}")
        self.verify = verify
        self.stage = stage
        self.dump_after = frozenset(dump_after)
        self.dump_to = dump_to
        known = {p.name for p in self.passes}
        unknown = sorted(self.dump_after - known - {"*"})
        if unknown:
            raise ValueError(
                f"dump_after names unknown passes {unknown}; the pipeline runs: {[p.name for p in self.passes]}"
            )

    def run(self, target: Graph | Model) -> PipelineResult:
        model = target if isinstance(target, Model) else None
        graph = target.graph if isinstance(target, Model) else target
        do_verify = verify_default() if self.verify is None else self.verify
        stage = self.stage if self.stage is not None else infer_stage(graph)
        n = len(self.passes)
        if do_verify:
            try:
                verify(graph, stage)
            except Exception as e:
                raise PassError(
                    f"input graph (before step 1/{n}) does not verify in the {stage.value} stage: {e}",
                    pass_name="<input>",
                    step=0,
                ) from e
        records: list[PassRecord] = []
        no_matches: list[NoMatchRecord] = []
        modified = False
        for k, p in enumerate(self.passes, start=1):
            where = f"step {k}/{n} '{p.name}'"
            t0 = time.perf_counter()
            try:
                p.requires(graph)
                result = p.call(graph)
                graph = result.graph
                p.ensures(graph)
            except Exception as e:
                raise PassError(f"{where}: {type(e).__name__}: {e}", pass_name=p.name, step=k) from e
            t1 = time.perf_counter()
            if p.produces_stage is not None:
                stage = p.produces_stage
            if do_verify:
                try:
                    verify(graph, stage)
                except Exception as e:
                    raise PassError(
                        f"{where}: the graph does not verify in the {stage.value} stage after this pass: {e}",
                        pass_name=p.name,
                        step=k,
                    ) from e
            t2 = time.perf_counter()
            records.append(PassRecord(k, p.name, t1 - t0, t2 - t1, result.modified, dict(result.stats)))
            no_matches.extend(p.no_matches())
            modified |= result.modified
            if "*" in self.dump_after or p.name in self.dump_after:
                out = self.dump_to if self.dump_to is not None else sys.stdout
                print(f"// IR after {where}", file=out)
                print(format_graph(graph), file=out)
        if model is not None:
            model.graph = graph
            _import_new_domains(model)
        return PipelineResult(graph, modified, records, no_matches)


def _import_new_domains(model: Model) -> None:
    """Domains that passes introduced (e.g. ``quanta`` for fused activations) are
    imported at version 1, so the model exports and loads."""
    for node in model.graph.nodes:
        domain = node.domain or ""
        if domain not in model.opset_imports and not (domain == "" and "ai.onnx" in model.opset_imports):
            model.opset_imports[domain] = 1
