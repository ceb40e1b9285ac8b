"""``compile(model, target) -> Plan``: passes, kernel binding, slots, memory plan.

The stages, in order (each a function below)::

    1. run_passes      the pass pipeline rewrites the graph (``default_pipeline``: a
                       quantized graph is lowered to integer ops, a float one gets
                       ``optimize_float``)
    2. bind_kernels    the target picks one kernel per node (native, or its reference
                       twin recorded as a fallback with the reason); If / Loop / Scan
                       get their bodies compiled (quanta.runtime.control_flow). A
                       device target (``Target.host`` set) takes the nodes its
                       capabilities allow; its host target takes the others, each with
                       the reason
    3. assign_slots    one slot per value; constants, inputs, outputs, intermediates
    4. plan_memory     liveness of intermediates -> offsets in one arena (static shapes;
                       symbolic shapes are planned by the executor at the first run of
                       each input-shape signature)
    5. partition       device targets only: consecutive steps on one device form a
                       partition, crossings are transfers (quanta.targets.partition)

The result prints itself (``print(plan)``, see :mod:`quanta.runtime.plan`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from quanta.ir.graph import Model
from quanta.runtime.memory import MemoryPlan, liveness, plan_arena
from quanta.runtime.plan import NONE_SLOT, Plan, PlanStep, Slot, SlotKind, static_nbytes
from quanta.targets import get_target
from quanta.targets.base import Kernel, Target, TargetError, check_supported, kernel_context
from quanta.targets.partition import PartitionStep, partition_steps
from quanta.targets.reference import reference_evaluator
from quanta.targets.registry import target_info

if TYPE_CHECKING:
    from quanta.passes.manager import Pass, PipelineResult

__all__ = [
    "DEFAULT_PIPELINE",
    "compile",
    "default_pipeline",
    "partition_plan",
    "plan_static_memory",
    "reference_evaluator",
    "run_passes",
    "target_pipeline",
]

#: A fixed pipeline for float graphs (a plain list of Pass instances), used instead of
#: ``optimize_float`` when set; empty by default.
DEFAULT_PIPELINE: tuple[Pass, ...] = ()


def compile(
    model: Model,
    target: Target | str,
    *,
    num_threads: int = 1,
    passes: Sequence[Pass] | None = None,
) -> Plan:
    """Compile ``model`` for ``target`` ("native", "reference" or a Target).

    ``passes``: the pipeline to run first (None: :func:`default_pipeline`). Passes
    rewrite ``model.graph`` in place. ``num_threads``: intra-op threads handed to every
    kernel through ``ctx.num_threads``. Raises TargetError naming the first node the
    target cannot run.
    """
    t0 = time.perf_counter()
    if isinstance(target, str):
        target = get_target(target)
    if num_threads < 1:
        raise ValueError(f"num_threads: expected >= 1, got {num_threads}")
    if passes is None:
        passes = target_pipeline(target, model)
        as_written = False
    else:
        as_written = not passes
    pipeline_result = run_passes(model, passes)
    # an explicit empty pipeline (ORT_DISABLE_ALL, calibration) runs the bodies as written too
    reasons: dict[int, str] = {}
    kernels = bind_kernels(model, target, num_threads, as_written=as_written, host_reasons=reasons)
    plan = assign_slots(model, target, kernels, num_threads)
    plan.passes = pipeline_result
    plan.memory = plan_static_memory(plan)
    if target.host is not None:
        plan.partitions = partition_plan(plan, reasons)
        for p in plan.partitions:
            if p.on_host:
                continue
            problems = target.verify_partition([plan.steps[k].node for k in p.steps])
            if problems:
                more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
                raise TargetError(f"device partition #{p.index} on {target.name}: {problems[0]}{more}")
        plan.device_memory = estimate_device_memory(plan, target)
    plan.compile_seconds = time.perf_counter() - t0
    return plan


def target_pipeline(target: Target, model: Model) -> list[Pass]:
    """The passes ``target`` declares in the registry (``TargetInfo.pipeline``), or
    :func:`default_pipeline`."""
    try:
        info = target_info(target.name)
    except ValueError:  # an unregistered Target object
        info = None
    if info is not None and info.pipeline is not None:
        passes = info.pipeline(model)
        if passes is not None:
            return list(passes)
    return default_pipeline(target, model)


def estimate_device_memory(plan: Plan, target: Target):
    """The device memory plan of ``plan``'s device partitions with every symbolic
    dimension 1 (what ``print(plan)`` and ``quanta inspect --lowered --target`` show
    before a session exists); None when there is no device partition or it does not
    fit (the session then says why)."""
    from quanta.runtime.hetero import plan_device_memory

    caps = getattr(target, "capabilities", None)
    if caps is None or not caps.memory_bytes or all(p.on_host for p in plan.partitions or []):
        return None
    symbols = {
        d
        for v in plan.model.graph.inputs
        if v.type is not None and v.type.shape is not None
        for d in v.type.shape
        if isinstance(d, str)
    }
    try:
        return plan_device_memory(plan, caps.memory_bytes, caps.alignment, dict.fromkeys(symbols, 1))
    except TargetError:
        return None


def partition_plan(plan: Plan, reasons: Mapping[int, str]) -> list:
    """The partitions of ``plan``'s steps by device (quanta.targets.partition)."""
    steps = [
        PartitionStep(
            s.index,
            s.kernel.device,
            tuple(s.inputs),
            tuple(o for o in s.outputs if o is not None),
            reasons.get(s.index, ""),
        )
        for s in plan.steps
    ]
    return partition_steps(steps, plan.constants.keys(), plan.outputs.values())


def blocked_layout_enabled() -> bool:
    """Whether float graphs run in the blocked layout NCHW16c (passes/lower/nchwc.py):
    the native kernels are in the built extension and ``QUANTA_NCHWC`` is not ``0`` (every
    target runs the graph the pipeline builds, so the choice is made once, here)."""
    if os.environ.get("QUANTA_NCHWC", "1") == "0":
        return False
    try:
        from quanta.kernels import _native
    except ImportError:
        return False
    return hasattr(_native, "conv_nchwc_f32")


def default_pipeline(target: Target, model: Model) -> list[Pass]:
    """The passes compile() runs when not told, for every target (so "native" and
    "reference" execute the same graph, and "reference" is the golden of the *same*
    integer arithmetic): a quantized graph (QDQ, QOperator or dynamically quantized: any
    quantization operator) has its Q -> op -> DQ groups lowered to integer operators, its
    convolutions run channels-last and its float islands fused; a float graph has its
    constants and BatchNormalizations folded (``pipelines.optimize_float``, or
    DEFAULT_PIPELINE when one is set), after ``simplify_control_flow`` (Ifs on constants
    inlined) when it holds If / Loop / Scan nodes. A fresh list per call (rule passes keep
    the refusals of their last run). Sessions with ``graph_optimization_level =
    ORT_DISABLE_ALL`` pass ``passes=[]``."""
    del target  # the same pipeline for every target
    from quanta.ir.op_rules import QUANT_OPS
    from quanta.passes.pipelines import lower_qdq, optimize_float, simplify_control_flow
    from quanta.runtime.control_flow import CONTROL_FLOW_OPS

    if not any(n.op_type in QUANT_OPS for n in model.graph.nodes):
        if DEFAULT_PIPELINE:
            return list(DEFAULT_PIPELINE)
        evaluator = reference_evaluator(model.opset_imports)
        passes = optimize_float(
            opset=model.opset_imports.get("", 21),
            evaluator=evaluator,
            blocked_layout=blocked_layout_enabled(),
            opset_imports=model.opset_imports,
        )
        if any(n.op_type in CONTROL_FLOW_OPS for n in model.graph.nodes):
            return [*simplify_control_flow(evaluator=evaluator), *passes]
        return passes
    return lower_qdq(
        opset=model.opset_imports.get("", 21),
        evaluator=reference_evaluator(model.opset_imports),
        opset_imports=model.opset_imports,
    )


def run_passes(model: Model, passes: Sequence[Pass]) -> PipelineResult | None:
    """Hook for the compiler's pass pipeline: run ``passes`` on ``model`` in place
    (verifier per the pass manager's default). No passes: nothing runs, None."""
    if not passes:
        return None
    from quanta.passes.manager import PassManager

    return PassManager(passes).run(model)


def bind_kernels(
    model: Model,
    target: Target,
    num_threads: int = 1,
    *,
    as_written: bool = False,
    host_reasons: dict[int, str] | None = None,
) -> list[Kernel]:
    """One kernel per node, in graph order. If / Loop / Scan get the runtime's kernel
    over their bodies compiled for ``target`` (:mod:`quanta.runtime.control_flow`; with
    ``as_written`` no pass runs on the bodies). A device target (``target.host`` set)
    hands each node it cannot run to its host target, and records why in
    ``host_reasons`` (step index -> reason)."""
    from quanta.runtime.control_flow import CONTROL_FLOW_OPS, control_flow_kernel, node_scope

    if target.host is not None:
        host = get_target(target.host)
        kernels = []
        for k, node in enumerate(model.graph.nodes):
            why = target.unsupported(model, node)
            if why is None:
                kernels.append(target.select_kernel(model, node))
                continue
            if host_reasons is not None:
                host_reasons[k] = why
            if node.op_type in CONTROL_FLOW_OPS and node.domain == "":
                kernels.append(
                    control_flow_kernel(
                        model, node, host, num_threads, node_scope(node, k), as_written=as_written
                    )
                )
                continue
            host_why = host.unsupported(model, node)
            if host_why is not None:
                raise TargetError(
                    f"node {node.label}: {host_why} (on {host.name}; not on {target.name}: {why})"
                )
            kernels.append(host.select_kernel(model, node))
        return kernels
    check_supported(target, model)
    kernels = []
    for k, node in enumerate(model.graph.nodes):
        if node.op_type in CONTROL_FLOW_OPS and node.domain == "":
            kernels.append(
                control_flow_kernel(
                    model, node, target, num_threads, node_scope(node, k), as_written=as_written
                )
            )
        else:
            kernels.append(target.select_kernel(model, node))
    return kernels


def assign_slots(model: Model, target: Target, kernels: list[Kernel], num_threads: int) -> Plan:
    graph = model.graph
    slots: list[Slot] = [Slot(NONE_SLOT, "", SlotKind.NONE, None, 0)]
    slot_of_value: dict[int, int] = {}
    output_ids = {id(v) for v in graph.outputs}

    def add(v, kind: SlotKind) -> int:
        k = slot_of_value.get(id(v))
        if k is None:
            k = len(slots)
            if id(v) in output_ids and kind is SlotKind.INTERMEDIATE:
                kind = SlotKind.OUTPUT
            slots.append(Slot(k, v.name, kind, v.type, static_nbytes(v.type)))
            slot_of_value[id(v)] = k
        return k

    constants = {}
    for v in graph.initializers.values():
        constants[add(v, SlotKind.CONSTANT)] = v.const
    inputs = {v.name: add(v, SlotKind.INPUT) for v in graph.inputs}
    steps: list[PlanStep] = []
    for k, (node, kernel) in enumerate(zip(graph.nodes, kernels)):
        ins = []
        for v in node.inputs:
            if v is None:
                ins.append(NONE_SLOT)
            elif id(v) in slot_of_value:
                ins.append(slot_of_value[id(v)])
            else:
                raise TargetError(
                    f"node {node.label}: input '{v.name}' is neither a graph input, an initializer "
                    f"nor the output of an earlier node"
                )
        outs = [None if not v.name else add(v, SlotKind.INTERMEDIATE) for v in node.outputs]
        if kernel.out and not kernel.out_all and len(node.outputs) != 1:
            raise TargetError(
                f"node {node.label}: kernel {kernel.name} takes out= but the node has {len(outs)} outputs"
            )
        ctx = kernel_context(model, node, num_threads=num_threads)
        # a control-flow kernel took its attributes (the subgraphs) when it was compiled:
        # no keyword arguments per call, so the executor takes its unrolled call
        attrs = {} if kernel.bodies else {**node.attrs, **kernel.params}
        steps.append(PlanStep(k, node, kernel, ctx, attrs, tuple(ins), tuple(outs), ()))
    for v in graph.outputs:
        if id(v) not in slot_of_value:
            raise TargetError(
                f"graph output '{v.name}' is not computed by any node, nor an input or initializer"
            )
    outputs = {v.name: slot_of_value[id(v)] for v in graph.outputs}
    _set_frees(steps, slots, set(outputs.values()))
    return Plan(
        model,
        target.name,
        steps,
        slots,
        constants,
        inputs,
        outputs,
        memory=None,
        num_threads=num_threads,
        slot_of={s.name: s.index for s in slots[1:]},
    )


def _set_frees(steps: list[PlanStep], slots: list[Slot], keep: set[int]) -> None:
    """free_after: intermediates and inputs after their last reader (intermediates
    nobody reads: right after the step); graph outputs (``keep``) are never freed."""
    last: dict[int, int] = {}
    for step in steps:
        for o in step.outputs:
            if o is not None:
                last[o] = step.index
        for i in step.inputs:
            if i != NONE_SLOT:
                last[i] = step.index
    frees: dict[int, list[int]] = {}
    for k, t in last.items():
        if slots[k].kind is SlotKind.INTERMEDIATE or (slots[k].kind is SlotKind.INPUT and k not in keep):
            frees.setdefault(t, []).append(k)
    for step in steps:
        step.free_after = tuple(sorted(frees.get(step.index, [])))


def plan_static_memory(plan: Plan, nbytes: dict[int, int] | None = None) -> MemoryPlan | None:
    """Arena plan of the intermediates of ``plan`` (``nbytes``: bytes per slot; default
    the static types). None when an intermediate's size is unknown."""
    if nbytes is None:
        nbytes = {}
        for s in plan.slots:
            if s.kind is SlotKind.INTERMEDIATE:
                if s.nbytes is None:
                    return None
                nbytes[s.index] = s.nbytes
    steps = [(s.op_type, [None if i == NONE_SLOT else i for i in s.inputs], s.outputs) for s in plan.steps]
    intervals, aliases = liveness(steps, nbytes, outputs=plan.outputs.values())
    mem = plan_arena(intervals)
    mem.aliases = aliases
    return mem
