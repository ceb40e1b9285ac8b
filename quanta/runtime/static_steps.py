"""Steps whose results are fixed by the input-shape signature (the executor's cache key).

An exported transformer computes its reshape targets at run time: ``Shape`` of a value,
then ``Gather``, ``Unsqueeze``, ``Concat``, ``Cast``, ``Range``, ... on the int64 result
(all-MiniLM-L6-v2: about 120 of its 331 steps, most of them on NumPy twins at a few
microseconds each). For a given signature those values never change, so the executor
computes them in the signature's measuring run and, from then on, puts the recorded
values in place instead of running the steps (``docs/runtime.md`` "Signature-static
steps").

A value is *value-static* when it is fixed by the signature: a constant, ``Shape`` or
``Size`` of a *shape-stable* value, or the output of a deterministic operator whose
inputs are all value-static. A value is *shape-stable* when its shape is fixed by the
signature: a graph input or constant, a value-static value, or the output of an
operator whose output shape follows from its inputs' shapes and attributes
(:data:`SHAPE_ONLY_OPS`), or from them and some value-static inputs
(:data:`SHAPE_ARGS`: Reshape's target, Slice's starts, ...). Operators outside these
lists (NonZero, Unique, control flow, unknown domains, ...) end both properties: the
analysis is conservative, a missed skip only costs time.
"""

from __future__ import annotations

from quanta.ir.op_facts import QUANTA, derive
from quanta.runtime.plan import NONE_SLOT, Plan, SlotKind

__all__ = [
    "DATA_SHAPED_OPS",
    "QUANTA_SHAPE_ONLY_OPS",
    "SHAPE_ARGS",
    "SHAPE_ONLY_OPS",
    "root_shape_args",
    "signature_shape_roots",
    "signature_shape_unstable",
    "signature_static_steps",
]

#: Output shapes determined by the input shapes and the attributes alone.
SHAPE_ONLY_OPS = derive("quanta.runtime.static_steps.SHAPE_ONLY_OPS", lambda t: t.ops_where(shape_only=True))

#: The quanta-domain operators of SHAPE_ONLY_OPS (fused Conv, AccumulatorToQuant, ...):
#: they keep a value shape-stable (a YOLO head's anchor grid is computed from the shape
#: of a fused Conv's output); their values are never recorded.
QUANTA_SHAPE_ONLY_OPS = derive(
    "quanta.runtime.static_steps.QUANTA_SHAPE_ONLY_OPS",
    lambda t: frozenset(r.op_type for r in t.where(shape_only=True, domain=QUANTA)),
)

#: Output shapes that also follow from these inputs' values (index in the node's inputs).
SHAPE_ARGS: dict[str, tuple[int, ...]] = {
    "Reshape": (1,),
    "Expand": (1,),
    "Tile": (1,),
    "Slice": (1, 2, 3, 4),
    "ConstantOfShape": (0,),
    "Range": (0, 1, 2),
    "Pad": (1, 2, 3),
    "Unsqueeze": (1,),
    "Squeeze": (1,),
    "Split": (1,),
    "TopK": (1,),
    "OneHot": (1,),
    "Resize": (1, 2, 3),
    "Upsample": (1,),
    "ReduceSum": (1,),
    "ReduceMean": (1,),
    "ReduceMax": (1,),
    "ReduceMin": (1,),
    "ReduceProd": (1,),
    "ReduceL1": (1,),
    "ReduceL2": (1,),
    "ReduceLogSum": (1,),
    "ReduceLogSumExp": (1,),
    "ReduceSumSquare": (1,),
}

#: Operators whose values are not a function of their inputs: the random ones, and
#: Dropout, whose training_mode may be set at run time (op facts' random column).
NONDETERMINISTIC = derive("quanta.runtime.static_steps.NONDETERMINISTIC", lambda t: t.ops_where(random=True))

_DOMAINS = ("", "ai.onnx", "com.microsoft")
_CONTROL_FLOW = frozenset({"If", "Loop", "Scan", "SequenceMap"})


def signature_static_steps(plan: Plan, checked_roots: frozenset[int] = frozenset()) -> frozenset[int]:
    """Indices of the steps whose every output is value-static (module docstring).

    ``checked_roots``: root steps (:func:`signature_shape_roots`) whose output shapes a
    speculative bind checks on every run; their outputs count as shape-stable, so the
    ``Shape`` of a value after a NonZero, and the arithmetic on it, is fixed for as long
    as the checks hold (the executor skips those steps only in such a bind)."""
    value_static: set[int] = {NONE_SLOT}
    shape_stable: set[int] = {NONE_SLOT}
    for slot in plan.slots:
        if slot.kind is SlotKind.CONSTANT:
            value_static.add(slot.index)
            shape_stable.add(slot.index)
        elif slot.kind is SlotKind.INPUT:
            shape_stable.add(slot.index)
    for k in plan.constants:
        value_static.add(k)
        shape_stable.add(k)
    # an overridable initializer is a graph input: its value may change between runs
    value_static.difference_update(plan.inputs.values())

    static_steps: set[int] = set()
    for step in plan.steps:
        node = step.node
        op = node.op_type
        known = node.domain in _DOMAINS and op not in _CONTROL_FLOW
        ins = step.inputs
        outs = [o for o in step.outputs if o is not None]
        if node.domain == QUANTA:
            if op in QUANTA_SHAPE_ONLY_OPS and all(i in shape_stable for i in ins):
                shape_stable.update(outs)
            continue
        if known and op in ("Shape", "Size") and ins and ins[0] in shape_stable:
            is_static = True
        else:
            is_static = (
                known and op not in NONDETERMINISTIC and bool(ins) and all(i in value_static for i in ins)
            )
        if is_static:
            value_static.update(outs)
            shape_stable.update(outs)
            static_steps.add(step.index)
            continue
        if step.index in checked_roots:
            shape_stable.update(outs)
            continue
        if not known:
            continue
        args = SHAPE_ARGS.get(op, ())
        if op not in SHAPE_ONLY_OPS and op not in SHAPE_ARGS:
            continue
        if all((i in value_static) if j in args else (i in shape_stable) for j, i in enumerate(ins)):
            shape_stable.update(outs)
    return frozenset(static_steps)


#: Operators whose output shape depends on their input *values* beyond SHAPE_ARGS (the
#: count of non-zeros, of unique elements, of kept boxes, the branch an If takes, a
#: Loop's trip count), or on a value argument listed here by position.
DATA_SHAPED_OPS = frozenset(
    {
        "NonZero",
        "Unique",
        "Compress",
        "NonMaxSuppression",
        "StringSplit",
        "StringNormalizer",
        "If",
        "Loop",
        "Scan",
        "SequenceMap",
        "SplitToSequence",
        "SequenceAt",
        "SequenceConstruct",
        "ConcatFromSequence",
    }
)

#: More value arguments that size an output (index in the node's inputs), next to
#: SHAPE_ARGS.
_MORE_SHAPE_ARGS: dict[str, tuple[int, ...]] = {
    "DFT": (1, 2),
    "STFT": (1, 3),
    "HannWindow": (0,),
    "HammingWindow": (0,),
    "BlackmanWindow": (0,),
    "MelWeightMatrix": (0, 1),
    "MaxUnpool": (2,),
    "CenterCropPad": (1,),
    "EyeLike": (),
}


def signature_shape_unstable(plan: Plan) -> frozenset[int]:
    """Slots whose shape the input-shape signature does not fix: outputs of
    :data:`DATA_SHAPED_OPS`, of an operator sized by a value argument (SHAPE_ARGS,
    ``_MORE_SHAPE_ARGS``) that is not value-static, and everything computed from those.

    The measuring run's shapes of these slots hold for that run only, so the executor
    gives them no arena place and no kernel specialized to their shape unless it checks
    them (:func:`signature_shape_roots`). This is the permissive complement of
    :func:`signature_static_steps`' analysis: an operator neither list names (an LSTM, a
    fused quanta op) keeps its output as stable as its inputs, since its output shape
    follows from theirs."""
    return _shape_unstable(plan)[0]


def signature_shape_roots(plan: Plan) -> frozenset[int]:
    """Indices of the steps where shape instability starts: steps with an unstable
    output (:func:`signature_shape_unstable`) whose output shapes do not follow from their
    input shapes and value-static arguments alone: :data:`DATA_SHAPED_OPS`, operators
    sized by a value argument that is not value-static, and, conservatively, any
    operator with an unstable input that :data:`SHAPE_ONLY_OPS` / :data:`SHAPE_ARGS`
    (or the quanta domain's list) does not name.

    Every other unstable value has the shape its inputs' shapes give it; so when each
    root's outputs have the shapes of one run, every unstable value has that run's shape.
    The executor's speculative binding (docs/runtime.md §3, "Data-dependent shapes")
    checks the roots' outputs on each run and specializes the rest to those shapes."""
    return _shape_unstable(plan)[1]


def _shape_unstable(plan: Plan) -> tuple[frozenset[int], frozenset[int]]:
    """(unstable slots, root steps): see the two functions above."""
    static = signature_static_steps(plan)
    value_static: set[int] = {NONE_SLOT, *plan.constants}
    for slot in plan.slots:
        if slot.kind is SlotKind.CONSTANT:
            value_static.add(slot.index)
    value_static.difference_update(plan.inputs.values())
    unstable: set[int] = set()
    roots: set[int] = set()
    for step in plan.steps:
        outs = [o for o in step.outputs if o is not None]
        if step.index in static:
            value_static.update(outs)
            continue
        op = step.node.op_type
        ins = step.inputs
        domain = step.node.domain
        known = domain in _DOMAINS and op not in _CONTROL_FLOW
        if known and op in ("Shape", "Size"):
            if ins and ins[0] not in unstable:  # the shape of a tensor the signature sizes
                value_static.update(outs)
            continue  # its own shape is [rank] either way
        if known and op not in NONDETERMINISTIC and ins and all(i in value_static for i in ins):
            value_static.update(outs)
            continue
        args = SHAPE_ARGS.get(op, _MORE_SHAPE_ARGS.get(op, ()))
        data_shaped = domain in _DOMAINS and op in DATA_SHAPED_OPS
        sized_by_value = any(
            j < len(ins) and ins[j] != NONE_SLOT and ins[j] not in value_static for j in args
        )
        if data_shaped or sized_by_value or any(i in unstable for i in ins):
            unstable.update(outs)
            follows_shapes = (
                known and (op in SHAPE_ONLY_OPS or op in SHAPE_ARGS or op in _MORE_SHAPE_ARGS)
            ) or (domain == QUANTA and op in QUANTA_SHAPE_ONLY_OPS)
            if data_shaped or sized_by_value or not follows_shapes:
                roots.add(step.index)
    return frozenset(unstable), frozenset(roots)


def root_shape_args(plan: Plan) -> dict[int, tuple[int, ...]]:
    """Root step -> the positions of its value arguments that size its outputs, for the
    roots whose output shapes follow from their input shapes and those values alone
    (Reshape's target, Tile's repeats, Range's operands, ...; not a NonZero, not an
    operator the shape tables do not name). With its inputs' shapes checked upstream, a
    root whose arguments at these positions hold the measuring run's values gives the
    measuring run's output shapes: the executor compares those few values instead of
    running the generic kernel and comparing its result (docs/runtime.md §3)."""
    out: dict[int, tuple[int, ...]] = {}
    for k in signature_shape_roots(plan):
        step = plan.steps[k]
        node = step.node
        op = node.op_type
        if node.domain not in _DOMAINS or op in DATA_SHAPED_OPS or op in _CONTROL_FLOW:
            continue
        if op not in SHAPE_ONLY_OPS and op not in SHAPE_ARGS and op not in _MORE_SHAPE_ARGS:
            continue
        args = SHAPE_ARGS.get(op, _MORE_SHAPE_ARGS.get(op, ()))
        out[k] = tuple(j for j in args if j < len(step.inputs) and step.inputs[j] != NONE_SLOT)
    return out
