"""The verifier: structural checks, then the per-op type rules of a stage.

``verify(graph, stage)`` raises :class:`VerifyError` with every problem found (one per
line, the first line first); ``check(graph, stage)`` returns the list. The pass manager
runs it after every pass in tests and debug mode.

Structural checks, each with its Incorrect / Correct example:

1. Every node input is defined before use.
   Incorrect: ``%b = Relu(%a); %a = Neg(%x)``  Correct: ``%a = Neg(%x); %b = Relu(%a)``
2. Every value has one producer, and the producer/uses bookkeeping matches the nodes.
3. Every graph output is a graph input, an initializer or a node output.
4. The graph outputs keep the types the graph's signature promised.
   Incorrect: signature ``y: Q(i8:f32, 0.08, 0)``, after a rewrite ``y: Q(i8:f32, 0.02, 0)``
   Correct:   the rewrite builds ``y``'s type from the output it replaced (0.08).
5. Quantization operators appear only in the stages that admit them.
"""

from __future__ import annotations

from quanta.ir.graph import Graph
from quanta.ir.op_rules import QUANT_OPS, STAGE_QUANT_OPS, Stage, rules_for
from quanta.ir.types import MXType, QuantType

__all__ = ["Stage", "VerifyError", "check", "verify"]


class VerifyError(ValueError):
    """The graph breaks a structural or type rule; ``errors`` lists every problem."""

    def __init__(self, errors: list[str]):
        self.errors = list(errors)
        more = f"\n  (+{len(errors) - 1} more)\n  " + "\n  ".join(errors[1:]) if len(errors) > 1 else ""
        super().__init__(errors[0] + more)


def check(graph: Graph, stage: Stage, *, kept: frozenset[str] = frozenset()) -> list[str]:
    """Every problem of ``graph`` in ``stage``, as messages (empty when it verifies).
    ``kept``: quantized op types the graph came with and keeps as written (a file's float
    view, quanta.quantize.prequantized), admitted in any stage."""
    errors: list[str] = []
    defined: set[int] = {id(v) for v in graph.inputs} | {id(v) for v in graph.initializers.values()}
    produced: dict[int, str] = {}
    for node in graph.nodes:
        for k, v in enumerate(node.inputs):
            if v is None:
                continue
            if id(v) not in defined:
                where = "is used before it is produced" if v.producer is not None else "is not defined"
                errors.append(f"{node.op_type} {node.label}: input {k} '{v.name}' {where}")
            if (node, k) not in [(n, i) for n, i in v.uses if n is node]:
                errors.append(
                    f"{node.op_type} {node.label}: input {k} '{v.name}' is missing from its uses list"
                )
        for v in node.outputs:
            if id(v) in produced:
                errors.append(f"value '{v.name}' is produced twice ({produced[id(v)]} and {node.label})")
            produced[id(v)] = node.label
            if v.producer is not node:
                errors.append(f"{node.op_type} {node.label}: output '{v.name}' does not name it as producer")
            defined.add(id(v))
    for v in graph.outputs:
        if id(v) not in defined:
            errors.append(f"graph output '{v.name}' is not produced by any node")
    if graph.output_signature:
        if len(graph.output_signature) != len(graph.outputs):
            errors.append(
                f"graph has {len(graph.outputs)} outputs but its signature promises {len(graph.output_signature)}"
            )
        for v, promised in zip(graph.outputs, graph.output_signature):
            if promised is None or v.type is None:
                continue
            if v.type.elem != promised.elem:
                errors.append(
                    f"graph output '{v.name}' has type {v.type.elem} but the graph's signature promises {promised.elem}"
                )
    allowed = STAGE_QUANT_OPS[stage] | kept
    for node in graph.nodes:
        if node.op_type in QUANT_OPS and node.op_type not in allowed:
            errors.append(f"{node.op_type} {node.label}: not allowed in the {stage.value} stage")
            continue
        errors.extend(rules_for(node)(node, stage))
    if stage is Stage.FLOAT:
        for v in graph.values():
            if v.type is not None and isinstance(v.type.elem, (QuantType, MXType)):
                errors.append(f"value '{v.name}' has quantized type {v.type.elem} in the float stage")
    return errors


def verify(graph: Graph, stage: Stage, *, kept: frozenset[str] = frozenset()) -> None:
    """Raise :class:`VerifyError` unless ``graph`` is well formed for ``stage`` (``kept``:
    as :func:`check`)."""
    errors = check(graph, stage, kept=kept)
    if errors:
        raise VerifyError(errors)
