"""If, Loop and Scan run their subgraphs as compiled plans of the session's target.

At compile time every If branch and every Loop / Scan body becomes a model of its own
(:func:`quanta.ir.onnx_io.subgraph_model`: its formal inputs, then one input per
enclosing-scope name it reads) and is compiled once, with the same target, thread count
and default pipeline as the main graph (:func:`quanta.runtime.compile.compile`: a
quantized body has its QDQ groups lowered to integer operators; constants fold; an If
whose condition is a constant is inlined). The node's kernel then runs those plans::

    If(cond, *outer)                 -> then_branch(*outer) if cond else else_branch(*outer)
    Loop(M, cond, *v_initial, *outer) ->
        v = v_initial; scans = []; i = 0
        while (M is omitted or i < M) and (cond is omitted or cond):
            cond, *v, *s = body(i, cond, *v, *outer); scans.append(s); i += 1
        -> *v, *stack(scans, axis 0)
    Scan(*initial_state, *scan_inputs, *outer) (opset >= 9) ->
        for t in range(T) (reversed for direction 1):
            *state, *s = body(*state, *[x.take(t, axis) for x in scan_inputs], *outer)
        -> *state, *[stack(s over t, scan_output_axis), reversed for direction 1]

A Loop with zero iterations returns its initial values and scan outputs with no rows:
shape ``(0, *the body output's static shape)`` when the body declares one, else ``(0,)``,
of the declared element type.

A body the target cannot compile (an operator with no kernel at all, a Scan of opset 8
with its batch axis) keeps the ``onnx.reference`` evaluation of the whole node
(:mod:`quanta.kernels.reference.control_flow`), recorded as a fallback with the reason.

Observation: while an executor runs with ``on_value`` (calibration), the bodies report
their values too, under the *scoped name* ``{node}/{attribute}/{value}``
(:func:`scoped_name`; nested bodies add one level per node), so two branches that reuse
a name keep separate ranges. A Loop body reports every iteration.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from quanta.ir.graph import Model, Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.targets.base import Kernel, Specialization, Target, TargetError

if TYPE_CHECKING:
    from quanta.runtime.execute import Executor
    from quanta.runtime.plan import Plan

__all__ = [
    "CONTROL_FLOW_OPS",
    "Body",
    "control_flow_kernel",
    "fold_static_ifs",
    "node_scope",
    "observing",
    "scoped_name",
]

CONTROL_FLOW_OPS = frozenset({"If", "Loop", "Scan", "SequenceMap"})

#: Input signatures an If branch is compiled for, beyond its generic plan (a streaming
#: model calls with one; a model fed many shapes falls back to the generic plan)
MAX_SPECIALIZED = 4

OnValue = Callable[[str, np.ndarray], None]

#: The ``on_value`` callback of the run in progress (set by the executor while it runs
#: with one), so a control-flow kernel reports its bodies' values to it.
_ON_VALUE: contextvars.ContextVar[OnValue | None] = contextvars.ContextVar("quanta_on_value", default=None)


def observing() -> OnValue | None:
    """The callback the current run reports values to, or None."""
    return _ON_VALUE.get()


def set_observer(on_value: OnValue | None) -> contextvars.Token:
    return _ON_VALUE.set(on_value)


def reset_observer(token: contextvars.Token) -> None:
    _ON_VALUE.reset(token)


def node_scope(node: Node, index: int) -> str:
    """The scope prefix of ``node``'s subgraphs: its name, or ``{op}_{index}`` (its
    position in its graph) when it has none."""
    return node.name or f"{node.op_type}_{index}"


def scoped_name(scope: str, attribute: str, value: str) -> str:
    """The name calibration keys a body value by: ``{scope}/{attribute}/{value}``."""
    return f"{scope}/{attribute}/{value}"


@dataclass
class Body:
    """One subgraph compiled into a plan, and the executor that runs it."""

    attribute: str
    proto: onnx.GraphProto
    plan: Plan
    exe: Executor
    n_formal: int  # formal inputs (then: the outer-scope values this body reads)
    outer_index: tuple[int, ...]  # for each outer input: its position in the node's outer values
    input_names: tuple[str, ...]  # formal inputs, then the outer-scope names it reads
    output_names: tuple[str, ...]
    output_types: tuple[Any, ...]  # onnx TypeProto per output (empty scan outputs)
    prefix: str  # the scope of the values it reports: "{scope}/{attribute}/"
    #: how to compile this body for the shapes of one call (If branches only; None:
    #: the generic plan always), and the plans made so far by input signature
    specialize: Callable[[Sequence[Any]], Executor] | None = None
    specialized: dict[tuple, Executor | bool] = field(default_factory=dict)  # False: did not compile
    #: for a body that only passes values through (an If's ``else`` returning an outer
    #: value by Identity): the argument each output is; None for any other body
    passthrough: tuple[int, ...] | None = None

    def run(self, formal: Sequence[Any], outer: Sequence[Any]) -> list[Any]:
        args = (
            [*formal, *[outer[i] for i in self.outer_index]]
            if formal
            else [outer[i] for i in self.outer_index]
        )
        on_value = _ON_VALUE.get()
        if on_value is None:
            if self.passthrough is not None:  # no plan to run: the Identity steps' values
                return [args[k] for k in self.passthrough]
            signature = tuple([(a.shape, a.dtype) if isinstance(a, np.ndarray) else None for a in args])
            if self.specialize is not None:
                exe = self.specialized.get(signature)
                if exe is None and len(self.specialized) < MAX_SPECIALIZED:
                    try:
                        exe = self.specialize(args)
                    except (TargetError, ValueError, KeyError, RuntimeError):
                        exe = False  # an optimization that did not happen: the generic plan runs
                    self.specialized[signature] = exe
                if exe:
                    return exe.call(args, signature=signature)
            return self.exe.call(args, signature=signature)
        prefix = self.prefix

        def scoped(name: str, arr: np.ndarray) -> None:
            on_value(prefix + name, arr)

        for name, arr in zip(self.input_names, args):  # a body's inputs are observed inside it too
            if arr is not None:
                scoped(name, arr)

        return self.exe.call(args, on_value=scoped)


def compile_body(
    model: Model,
    node: Node,
    attribute: str,
    proto: onnx.GraphProto,
    target: Target,
    num_threads: int,
    scope: str,
    *,
    as_written: bool = False,
) -> Body:
    """``proto`` (attribute ``attribute`` of ``node``) compiled for ``target``, with the
    default pipeline (``as_written``: no pass)."""
    from quanta.ir.onnx_io import subgraph_model
    from quanta.passes.pipelines import simplify_control_flow
    from quanta.runtime.compile import compile as compile_model
    from quanta.runtime.compile import default_pipeline, reference_evaluator
    from quanta.runtime.execute import Executor

    n_outer = len(node.outer_names)
    outer_values = node.inputs[len(node.inputs) - n_outer :] if n_outer else []
    output_names = [o.name for o in proto.output]

    def build(outer: Sequence[Value | None], *, static: bool = False) -> tuple[list[str], Executor]:
        sub = subgraph_model(proto, outer, node.outer_names, model, fresh_shapes=static)
        if static:
            sub = fold_static_ifs(sub)
        passes = [] if as_written else default_pipeline(target, sub)
        if not passes and not as_written:  # a float body: constants folded, constant Ifs inlined
            passes = simplify_control_flow(evaluator=reference_evaluator(sub.opset_imports))
        exe = Executor(compile_model(sub, target, num_threads=num_threads, passes=passes))
        names = [v.name for v in sub.graph.inputs]
        exe.bind_positional(names, output_names)
        return names, exe

    names, exe = build(outer_values)
    plan = exe.plan
    n_formal = len(proto.input)
    position = {name: k for k, name in enumerate(node.outer_names)}
    outer_index = tuple(position[name] for name in names[n_formal:])
    specialize = None
    if node.op_type == "If" and not as_written:

        def specialize(args: Sequence[Any]) -> Executor:
            """The branch compiled for the shapes of ``args``: Shape, Size and the shape
            arithmetic on them fold to constants, and so an If on them is inlined (the
            plan serves only calls of exactly these shapes and dtypes)."""
            typed = list(outer_values)
            for k, arr in zip(outer_index, args[n_formal:]):
                v = outer_values[k]
                if isinstance(arr, np.ndarray) and v is not None and v.const is None:
                    typed[k] = Value(v.name, TensorType(elem_from_numpy(arr.dtype), tuple(arr.shape)))
            return build(typed, static=True)[1]

    return Body(
        attribute,
        proto,
        plan,
        exe,
        n_formal,
        outer_index,
        tuple(names),
        tuple(o.name for o in proto.output),
        tuple(o.type for o in proto.output),
        f"{scope}/{attribute}/",
        specialize,
        passthrough=_passthrough(plan, names, output_names),
    )


def _passthrough(
    plan: Plan, input_names: Sequence[str], output_names: Sequence[str]
) -> tuple[int, ...] | None:
    """For a plan whose steps are all Identity (or that has none): the position in
    ``input_names`` of the value each output is; None when a step computes something.
    Such a body costs an executor call (its slot list, signature and loop, ~3 us) to
    return one of its arguments."""
    source = {plan.inputs[n]: k for k, n in enumerate(input_names) if n in plan.inputs}
    for s in plan.steps:
        if s.op_type != "Identity" or s.node.domain or len(s.inputs) != 1 or s.inputs[0] not in source:
            return None
        source[s.outputs[0]] = source[s.inputs[0]]
    found = [source.get(plan.outputs.get(n, -1)) for n in output_names]
    if any(k is None for k in found):
        return None
    return tuple(k for k in found if k is not None)


#: Rounds of folding, inlining and shape inference for a branch compiled for one
#: signature (each round can inline Ifs that the previous one exposed)
MAX_INLINE_ROUNDS = 4


def fold_static_ifs(sub: Model) -> Model:
    """Fold constants and inline the Ifs whose conditions fold, inferring shapes anew
    after each round that inlined one (the inlined nodes carry types inferred for the
    symbolic shapes), until none is left to inline."""
    from quanta.ir.onnx_io import reinferred
    from quanta.passes.manager import PassManager
    from quanta.passes.pipelines import simplify_control_flow
    from quanta.runtime.compile import reference_evaluator

    for _ in range(MAX_INLINE_ROUNDS):
        if not any(n.op_type == "If" for n in sub.graph.nodes):
            break
        result = PassManager(simplify_control_flow(evaluator=reference_evaluator(sub.opset_imports))).run(sub)
        if not result.fired("InlineConstantIf"):
            break
        sub = reinferred(sub)
    return sub


def control_flow_kernel(
    model: Model, node: Node, target: Target, num_threads: int, scope: str, *, as_written: bool = False
) -> Kernel:
    """The kernel of an If / Loop / Scan node: its bodies compiled for ``target``; the
    ``onnx.reference`` evaluation (recorded as a fallback, with the reason) when a body
    does not compile."""
    op = node.op_type
    try:
        graphs = {k: v for k, v in node.attrs.items() if isinstance(v, onnx.GraphProto)}
        bodies = {
            name: compile_body(model, node, name, g, target, num_threads, scope, as_written=as_written)
            for name, g in sorted(graphs.items())
        }
    except (TargetError, ValueError, KeyError) as e:
        from quanta.targets.reference import reference_kernel

        kernel = reference_kernel(node, fallback=f"body not compiled ({e}); onnx.reference runs the node")
        return kernel
    n_own = len(node.inputs) - len(node.outer_names)
    if op == "If":
        fn = _if_kernel(bodies["then_branch"], bodies["else_branch"], n_own)
    elif op == "Loop":
        fn = _loop_kernel(bodies["body"], n_own, len(node.outputs))
    elif op == "SequenceMap":
        fn = _sequence_map_kernel(bodies["body"], n_own)
    elif model.opset_imports.get("", 21) < 9:
        fn = _scan8_kernel(bodies["body"], n_own, node.attrs)
    else:
        fn = _scan_kernel(bodies["body"], n_own, node.attrs)
    impl = "native" if target.name == "native" else target.name
    kernel = Kernel(fn, impl, f"{target.name}:{op}(compiled bodies)")
    kernel.bodies = bodies
    if op == "If":
        kernel.specialize = _if_specializer(fn.branch)  # type: ignore[attr-defined]
    return kernel


# -- If --------------------------------------------------------------------------------


def _if_kernel(then_body: Body, else_body: Body, n_own: int) -> Callable[..., Any]:
    def run_branch(cond: Any, outer: Sequence[Any]) -> tuple[Any, ...]:
        try:
            taken = bool(cond)  # an array of one element, of any rank
        except (TypeError, ValueError):
            raise ValueError(f"If: the condition must hold one element, got {_describe(cond)}") from None
        if cond is None:
            raise ValueError("If: the condition is missing")
        return tuple((then_body if taken else else_body).run((), outer))

    def run_if(ctx: Any, cond: np.ndarray, *outer: Any, **attrs: Any) -> tuple[Any, ...]:
        del ctx, attrs  # unused: the branches are compiled
        return run_branch(cond, outer)

    del n_own  # If has one own input, the condition
    run_if.branch = run_branch  # type: ignore[attr-defined]
    return run_if


def _if_specializer(branch: Callable[[Any, Sequence[Any]], tuple[Any, ...]]) -> Callable[..., Any]:
    """The If's ``Kernel.specialize`` hook (``branch``: its kernel's ``run_branch``)."""

    def specialize(sig: Specialization, **attrs: Any) -> Callable[..., Any] | None:
        """The If of one signature with its constant outer values bound in: a direct
        call (quanta.runtime.execute ``_direct``) that reads the condition and the
        values computed at run time only. An If passes every outer value either branch
        reads (Silero VAD's 16 kHz branch reads the window and the state, its 8 kHz one
        42 weights more), and the generic step gathered all of them into a list and an
        argument tuple per run. Bound: the values that are the same on every run of the
        signature (``sig.consts``), which the generic call would pass."""
        del attrs  # the branches are compiled
        consts = sig.consts
        if not consts or consts[0] is not None:
            return None  # a constant condition: the plan inlines such Ifs
        reads = tuple(i for i, c in enumerate(consts) if c is None)
        if len(reads) == len(consts):
            return None  # nothing to bind: the generic call is as short
        template = list(consts[1:])
        places = tuple(i - 1 for i in reads[1:])

        def call(cond: Any, *values: Any) -> tuple[Any, ...]:
            outer = template.copy()
            for p, v in zip(places, values):
                outer[p] = v
            return branch(cond, outer)

        def run(ctx: Any, *inputs: Any) -> tuple[Any, ...]:
            del ctx  # unused
            return call(*[inputs[i] for i in reads])

        run.direct = call  # type: ignore[attr-defined]
        run.reads = reads  # type: ignore[attr-defined]
        return run

    specialize.shape_free = True  # type: ignore[attr-defined]  # it reads no shape
    return specialize


# -- Loop -------------------------------------------------------------------------------


def _loop_kernel(body: Body, n_own: int, n_outputs: int) -> Callable[..., Any]:
    n_carried = n_own - 2
    n_scan = n_outputs - n_carried
    if len(body.output_names) != 1 + n_carried + n_scan:
        raise TargetError(
            f"Loop body: {len(body.output_names)} outputs, expected 1 + {n_carried} carried + {n_scan} scan outputs"
        )

    def run_loop(ctx: Any, m: Any, cond: Any, *rest: Any, **attrs: Any) -> tuple[Any, ...]:
        del ctx, attrs  # unused: the body is compiled
        carried = list(rest[:n_carried])
        outer = rest[n_carried:]
        trips = None if m is None else int(np.asarray(m).reshape(-1)[0])
        keep_going = True if cond is None else bool(np.asarray(cond).reshape(-1)[0])
        scans: list[list[np.ndarray]] = [[] for _ in range(n_scan)]
        i = 0
        if trips is None and cond is None:
            raise ValueError("Loop: neither a trip count M nor a condition: the loop never ends")
        while keep_going and (trips is None or i < trips):
            out = body.run([np.array(i, np.int64), np.array(keep_going), *carried], outer)
            if cond is not None:  # without a condition input the body's is ignored (ONNX)
                keep_going = bool(np.asarray(out[0]).reshape(-1)[0])
            carried = list(out[1 : 1 + n_carried])
            for k in range(n_scan):
                scans[k].append(out[1 + n_carried + k])
            i += 1
        results = [_value(c) for c in carried]
        for k in range(n_scan):
            if scans[k]:
                results.append(np.stack([np.asarray(s) for s in scans[k]]))
            else:
                results.append(_empty_rows(body.output_types[1 + n_carried + k]))
        return tuple(results)

    return run_loop


def _value(v: Any) -> Any:
    """A carried value as the Loop returns it: a tensor as an array; a sequence (a list)
    or an absent optional (None) as it is."""
    return v if v is None or isinstance(v, list) else np.asarray(v)


def _empty_rows(type_proto: onnx.TypeProto) -> np.ndarray:
    """The scan output of a Loop that ran zero times: no rows, the declared element type
    and, when the body declares a static shape, the rest of that shape."""
    dims: list[int] = []
    dtype = np.dtype(np.float32)
    if type_proto.HasField("tensor_type"):
        tt = type_proto.tensor_type
        if tt.elem_type:
            dtype = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if tt.HasField("shape") and all(d.HasField("dim_value") for d in tt.shape.dim):
            dims = [int(d.dim_value) for d in tt.shape.dim]
    return np.zeros((0, *dims), dtype)


# -- Scan -------------------------------------------------------------------------------


def _scan_kernel(body: Body, n_own: int, attrs: dict[str, Any]) -> Callable[..., Any]:
    n_scan_in = int(attrs["num_scan_inputs"])
    n_state = n_own - n_scan_in
    if n_state < 0:
        raise TargetError(f"Scan: num_scan_inputs = {n_scan_in} but the node has {n_own} inputs")
    n_scan_out = len(body.output_names) - n_state
    in_axes = list(attrs.get("scan_input_axes") or [0] * n_scan_in)
    in_dirs = list(attrs.get("scan_input_directions") or [0] * n_scan_in)
    out_axes = list(attrs.get("scan_output_axes") or [0] * n_scan_out)
    out_dirs = list(attrs.get("scan_output_directions") or [0] * n_scan_out)

    def run_scan(ctx: Any, *values: Any, **kw: Any) -> tuple[Any, ...]:
        del ctx, kw  # unused: the body is compiled
        state = list(values[:n_state])
        xs = [np.asarray(x) for x in values[n_state:n_own]]
        outer = values[n_own:]
        axes = [a + x.ndim if a < 0 else a for a, x in zip(in_axes, xs)]
        lengths = {x.shape[a] for a, x in zip(axes, xs)}
        if len(lengths) != 1:
            raise ValueError(
                f"Scan: the scan inputs have different lengths along their scan axes: {sorted(lengths)}"
            )
        steps = lengths.pop()
        outs: list[list[np.ndarray]] = [[] for _ in range(n_scan_out)]
        for t in range(steps):
            slices = [np.take(x, steps - 1 - t if d else t, axis=a) for x, a, d in zip(xs, axes, in_dirs)]
            res = body.run([*state, *slices], outer)
            state = list(res[:n_state])
            for k in range(n_scan_out):
                outs[k].append(np.asarray(res[n_state + k]))
        results = [np.asarray(s) for s in state]
        for k in range(n_scan_out):
            if not outs[k]:
                results.append(_empty_rows(body.output_types[n_state + k]))
                continue
            rows = outs[k][::-1] if out_dirs[k] else outs[k]
            axis = out_axes[k]
            if axis < 0:
                axis += rows[0].ndim + 1
            results.append(np.stack(rows, axis=axis))
        return tuple(results)

    return run_scan


def _scan8_kernel(body: Body, n_own: int, attrs: dict[str, Any]) -> Callable[..., Any]:
    """Scan-8: every state and scan input has a batch axis 0, the scan axis is 1, and the
    optional first input ``sequence_lens`` gives each batch row its own number of steps.
    The body runs per batch row (the ONNX pseudo-code); a scan output's rows past that
    row's length are undefined in ONNX and zero here, as in ONNX Runtime."""
    n_scan_in = int(attrs["num_scan_inputs"])
    n_state = n_own - 1 - n_scan_in
    if n_state < 0:
        raise TargetError(
            f"Scan-8: num_scan_inputs = {n_scan_in} but the node has {n_own - 1} inputs after sequence_lens"
        )
    n_scan_out = len(body.output_names) - n_state
    in_dirs = list(attrs.get("directions") or [0] * n_scan_in)

    def run_scan8(ctx: Any, lens: Any, *values: Any, **kw: Any) -> tuple[Any, ...]:
        del ctx, kw  # unused: the body is compiled
        states = [np.asarray(s) for s in values[:n_state]]
        xs = [np.asarray(x) for x in values[n_state : n_own - 1]]
        outer = values[n_own - 1 :]
        if not xs:
            raise ValueError("Scan-8: no scan input")
        if any(s.ndim < 1 for s in states) or any(x.ndim < 2 for x in xs):
            raise ValueError(
                "Scan-8: a state needs a batch axis and a scan input a batch and a scan axis, got "
                f"{[_describe(v) for v in (*states, *xs)]}"
            )
        batch, steps = xs[0].shape[0], xs[0].shape[1]
        if any(x.shape[:2] != (batch, steps) for x in xs) or any(s.shape[:1] != (batch,) for s in states):
            raise ValueError(
                "Scan-8: the states and scan inputs must share the batch size and the scan inputs the "
                f"sequence length, got {[_describe(v) for v in (*states, *xs)]}"
            )
        n_steps = [steps] * batch
        if lens is not None:
            lv = np.asarray(lens).reshape(-1)
            if lv.shape[0] != batch or np.any(lv < 0) or np.any(lv > steps):
                raise ValueError(
                    f"Scan-8: sequence_lens {lv.tolist()} must hold {batch} lengths in [0, {steps}]"
                )
            n_steps = [int(v) for v in lv]
        final: list[list[np.ndarray]] = [[] for _ in range(n_state)]
        rows: list[list[list[np.ndarray]]] = [[] for _ in range(n_scan_out)]
        for b in range(batch):
            state = [s[b] for s in states]
            outs: list[list[np.ndarray]] = [[] for _ in range(n_scan_out)]
            n = n_steps[b]
            for t in range(n):
                slices = [x[b, n - 1 - t if d else t] for x, d in zip(xs, in_dirs)]
                res = body.run([*state, *slices], outer)
                state = [np.asarray(r) for r in res[:n_state]]
                for k in range(n_scan_out):
                    outs[k].append(np.asarray(res[n_state + k]))
            for k in range(n_state):
                final[k].append(state[k])
            for k in range(n_scan_out):
                rows[k].append(outs[k])
        results: list[np.ndarray] = [np.stack(f) if f else s[:0] for f, s in zip(final, states)]
        for k in range(n_scan_out):
            shaped = next((r[0] for r in rows[k] if r), None)
            if shaped is None:
                empty = _empty_rows(body.output_types[n_state + k])
                results.append(np.zeros((batch, steps, *empty.shape[1:]), empty.dtype))
                continue
            out = np.zeros((batch, steps, *shaped.shape), shaped.dtype)
            for b, r in enumerate(rows[k]):
                if r:
                    out[b, : len(r)] = np.stack(r)
            results.append(out)
        return tuple(results)

    return run_scan8


# -- SequenceMap ------------------------------------------------------------------------


def _sequence_map_kernel(body: Body, n_own: int) -> Callable[..., Any]:
    """SequenceMap: the body runs once per element of the first input (a sequence); a
    sequence input gives the body its element at that position, a tensor input the whole
    tensor; each body output is collected into an output sequence."""

    def run_sequence_map(ctx: Any, *values: Any, **kw: Any) -> tuple[Any, ...]:
        del ctx, kw  # unused: the body is compiled
        own, outer = values[:n_own], values[n_own:]
        if not isinstance(own[0], list):
            raise ValueError(f"SequenceMap: the first input must be a sequence, got {_describe(own[0])}")
        n = len(own[0])
        seqs = [k for k, v in enumerate(own) if isinstance(v, list)]
        if any(len(own[k]) != n for k in seqs):
            raise ValueError(
                f"SequenceMap: the input sequences differ in length: {[len(own[k]) for k in seqs]}"
            )
        outs: list[list[Any]] = [[] for _ in body.output_names]
        for i in range(n):
            args = [v[i] if isinstance(v, list) else v for v in own]
            for k, r in enumerate(body.run(args, outer)):
                outs[k].append(np.asarray(r))
        return tuple(outs)

    return run_sequence_map


def _describe(x: Any) -> str:
    if isinstance(x, np.ndarray):
        return f"{x.dtype}{list(x.shape)}"
    return repr(x)
