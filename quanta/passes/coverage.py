"""Fusion coverage: what the compiler turned into integer kernels, what stayed float, why.

Users' most common complaint about int8 models is that they are *slower* than FP32
because some Q/DQ groups silently stayed float. ``coverage(before, after, result)``
compares the graph before and after the lowering pipeline and reports:

- every compute node (Conv, MatMul, Gemm, Add, …) of the original graph: lowered to an
  integer operator, or left float with the reasons each lowering rule gave
  (``PipelineResult.no_matches``);
- the share of multiply-accumulates that run in integer: MACs of Conv/ConvTranspose/
  MatMul/Gemm/LSTM/GRU/RNN/Einsum from the static shapes (a symbolic dimension counts as 1).

A node that is already an integer operator in the file (a QOperator or dynamically
quantized model: QLinearConv, MatMulInteger, DynamicQuantizeLSTM, ...) counts as integer.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from quanta.ir.graph import Graph, Node
from quanta.ir.op_facts import MacKind, derive

__all__ = ["CoverageReport", "NodeCoverage", "counted_with_symbolic_dims", "coverage", "macs"]

#: compute nodes of the original graph that the report accounts for
COMPUTE_OPS = derive("quanta.passes.coverage.COMPUTE_OPS", lambda t: t.ops_where(compute=True))
#: op -> the integer operators it may become
INTEGER_OF = derive("quanta.passes.coverage.INTEGER_OF", lambda t: t.column("integer"))
#: integer operators a file may hold before lowering: each counts as integer compute
INTEGER_OPS = derive("quanta.passes.coverage.INTEGER_OPS", lambda t: t.ops_where(integer_op=True))
#: op -> the formula its MACs are counted with (the rest of COMPUTE_OPS is elementwise: no MACs)
MAC_KIND = derive("quanta.passes.coverage.MAC_KIND", lambda t: t.column("macs"))
_RECURRENT = frozenset(op for op, kind in MAC_KIND.items() if kind is MacKind.RECURRENT)
#: a convolution's weight input (QLinearConv: 3), whose shape its MAC formula reads
_CONV_WEIGHT = derive(
    "quanta.passes.coverage._CONV_WEIGHT",
    lambda t: {r.op_type: r.weights[0] for r in t if r.macs is MacKind.CONV},
)
#: op -> the lowering rule whose refusals explain a float instance
LOWER_RULE_OF = derive("quanta.passes.coverage.LOWER_RULE_OF", lambda t: t.column("lower_rule"))


def _dims(shape) -> list[int]:
    return [d if isinstance(d, int) and d > 0 else 1 for d in (shape or ())]


def macs(node: Node, shapes: Mapping[str, tuple[int, ...]] | None = None) -> int:
    """Multiply-accumulates of one Conv/ConvTranspose/MatMul/Gemm/LSTM/GRU/RNN/Einsum (float or
    integer form). ``shapes`` (value name -> observed shape) stands in for shapes the
    file leaves unknown or symbolic."""

    def shape_of(v):
        if v is None:
            return None
        seen = (shapes or {}).get(v.name)
        static = v.shape
        if seen is not None and (static is None or not all(isinstance(d, int) for d in static)):
            return tuple(seen)
        return static

    op = node.op_type
    out = shape_of(node.outputs[0]) if node.outputs else None
    kind = MAC_KIND.get(op)
    if kind is MacKind.CONV:
        w = node.input(_CONV_WEIGHT[op])
        if w is None or shape_of(w) is None or out is None:
            return 0
        ws = _dims(shape_of(w))
        return int(np.prod(_dims(out), dtype=np.int64) * np.prod(ws[1:], dtype=np.int64))
    if kind is MacKind.CONV_TRANSPOSE:
        x, w = node.input(0), node.input(1)
        if x is None or w is None or shape_of(x) is None or shape_of(w) is None:
            return 0
        ws = _dims(shape_of(w))
        return int(np.prod(_dims(shape_of(x)), dtype=np.int64) * np.prod(ws[1:], dtype=np.int64))
    if kind is MacKind.RECURRENT:
        # seq·batch steps of every direction's W·x and R·h: the product of W's dims and of
        # R's dims, whatever their layout ([dirs, gates·h, in] or ORT's [dirs, in, gates·h])
        x, w, r = node.input(0), node.input(1), node.input(2)
        if (
            x is None
            or w is None
            or r is None
            or shape_of(x) is None
            or shape_of(w) is None
            or shape_of(r) is None
        ):
            return 0
        steps = int(np.prod(_dims(shape_of(x))[:2], dtype=np.int64))
        return steps * int(
            np.prod(_dims(shape_of(w)), dtype=np.int64) + np.prod(_dims(shape_of(r)), dtype=np.int64)
        )
    if kind is MacKind.EINSUM:
        sizes = _einsum_label_sizes(node, shape_of)
        return 0 if sizes is None else int(np.prod(list(sizes.values()), dtype=np.int64))
    if kind in (MacKind.MATMUL, MacKind.GEMM):
        if out is None:
            return 0
        sa, sb = shape_of(node.input(0)), shape_of(node.input(1))
        src = _k_axis(node, bool(sa), sb)
        if src is None:
            return 0
        operand, axis = src
        return int(np.prod(_dims(out), dtype=np.int64) * _dims(sa if operand == 0 else sb)[axis])
    return 0


def _k_axis(node: Node, a_has_shape: bool, b_shape) -> tuple[int, int] | None:
    """(input, axis) a MatMul / Gemm's reduction length K is read from: a's last axis (its
    first under Gemm's transA); when a has no shape (a DequantizeLinear output after an
    op that shape inference does not know, e.g. an ai.onnx.ml Scaler), the weight's
    [K, N] axis ([N, K] under Gemm's transB); None when neither has a shape."""
    gemm = node.op_type == "Gemm"
    if a_has_shape:
        return 0, 0 if gemm and node.attrs.get("transA", 0) else -1
    if not b_shape:
        return None
    if gemm:
        return 1, 1 if node.attrs.get("transB", 0) else 0
    return 1, -2 if len(b_shape) >= 2 else 0


def _einsum_label_sizes(node: Node, shape_of) -> dict[str, int] | None:
    """Each label of an Einsum's equation and its size (a symbolic or unknown one as 1):
    the multiply-accumulates are their product, every combination of labels being one
    term of one sum. None for an equation with an ellipsis or operands of unknown rank."""
    from quanta.passes.rules.canonicalize_einsum import parse_equation

    parsed = parse_equation(str(node.attrs.get("equation", "")), len(node.inputs))
    if isinstance(parsed, str):
        return None
    sizes: dict[str, int] = {}
    for sub, v in zip(parsed[0], node.inputs):
        shape = shape_of(v)
        if shape is None or len(shape) != len(sub):
            return None
        for c, d in zip(sub, _dims(shape)):
            sizes[c] = max(sizes.get(c, 1), d)  # a 1 may be a broadcast
    return sizes


def counted_with_symbolic_dims(node: Node, shapes: Mapping[str, tuple[int, ...]] | None = None) -> bool:
    """Whether :func:`macs` of ``node`` took a symbolic or unknown dimension as 1: one of
    the dimensions its formula reads is not a number in the file and ``shapes`` does not
    give the value."""

    def unknown(v, dims: slice) -> bool:
        if v is None or v.is_const or (shapes and v.name in shapes):
            return False
        return v.shape is None or not all(isinstance(d, int) and d > 0 for d in v.shape[dims])

    kind = MAC_KIND.get(node.op_type)
    out = node.outputs[0] if node.outputs else None
    every = slice(None)
    if kind is MacKind.CONV:
        return unknown(node.input(_CONV_WEIGHT[node.op_type]), slice(1, None)) or unknown(out, every)
    if kind is MacKind.CONV_TRANSPOSE:
        return unknown(node.input(0), every) or unknown(node.input(1), slice(1, None))
    if kind is MacKind.RECURRENT:
        return (
            unknown(node.input(0), slice(0, 2))
            or unknown(node.input(1), every)
            or unknown(node.input(2), every)
        )
    if kind is MacKind.EINSUM:
        return any(unknown(v, every) for v in node.inputs)
    if kind in (MacKind.MATMUL, MacKind.GEMM):
        if unknown(out, every):
            return True
        a, b = node.input(0), node.input(1)

        def seen(v) -> tuple | None:  # a shape of v's rank as macs' shape_of finds one
            if v is None:
                return None
            if shapes and v.name in shapes:
                return tuple(shapes[v.name])
            return v.shape

        src = _k_axis(node, bool(seen(a)), seen(b))
        if src is None:
            return True
        operand, axis = src
        return unknown(node.input(operand), slice(axis, axis + 1 or None))
    return False


@dataclass
class NodeCoverage:
    name: str
    op: str
    integer_op: str | None  # what it became, None when it stayed float
    macs: int
    reasons: list[str] = field(default_factory=list)
    #: its MACs took a symbolic or unknown dimension as 1 (counted_with_symbolic_dims)
    symbolic: bool = False


#: ops that neither compute on quantized integers nor move data: what runs as a float
#: island between DequantizeLinear / QuantizeLinear bridges after lowering
_NOT_ISLANDS = derive("quanta.passes.coverage._NOT_ISLANDS", lambda t: t.ops_where(island=False))


@dataclass
class CoverageReport:
    nodes: list[NodeCoverage]
    float_islands: dict[str, int] = field(default_factory=dict)  # op -> count after lowering
    channels_last_ops: int = 0  # operators running channels-last (passes/lower/channels_last.py)
    layout_transposes: int = 0  # Transposes that pass inserted at region edges
    #: how If / Loop / Scan bodies were counted (which branch, how many iterations)
    notes: list[str] = field(default_factory=list)

    @property
    def total_macs(self) -> int:
        return sum(n.macs for n in self.nodes)

    @property
    def integer_macs(self) -> int:
        return sum(n.macs for n in self.nodes if n.integer_op)

    @property
    def integer_share(self) -> float:
        return self.integer_macs / self.total_macs if self.total_macs else 1.0

    def largest_float(self, n: int = 5) -> list[NodeCoverage]:
        """The float compute nodes with the most MACs, largest first (ties by name)."""
        stayed = [c for c in self.nodes if not c.integer_op and c.macs]
        return sorted(stayed, key=lambda c: (-c.macs, c.name))[:n]

    def format_share(self, *, rows: int = 5) -> str:
        """Two or more lines: the integer share and the largest float compute nodes."""
        if not self.total_macs and self.nodes:
            # compute nodes whose shapes neither the file nor a calibration run gave
            # (quantize_dynamic after an operator shape inference does not know)
            lowered = sum(1 for n in self.nodes if n.integer_op)
            return (
                f"integer MACs: not counted, the file gives no shapes for its {len(self.nodes)} compute "
                f"node(s) ({lowered} of them run as integer kernels); quanta inspect --dim NAME=SIZE "
                "counts them at an input's sizes"
            )
        lines = [
            f"integer MACs: {self.integer_share * 100:.1f} % of {self.total_macs:,} "
            f"({self.integer_macs:,} in integer)"
        ]
        symbolic = sum(1 for n in self.nodes if n.symbolic and n.macs)
        if symbolic:
            lines.append(
                f"  ({symbolic} compute node(s) have symbolic or unknown dimensions, counted as 1: "
                "at a real input's sizes the share differs; quanta inspect --dim NAME=SIZE counts them there)"
            )
        lines.extend(f"subgraph: {note}" for note in self.notes[:3])
        if len(self.notes) > 3:
            lines.append(f"subgraph: ... and {len(self.notes) - 3} more (CoverageReport.notes)")
        big = self.largest_float(rows)
        if big:
            lines.append("largest float compute:")
            for c in big:
                share = c.macs / self.total_macs * 100 if self.total_macs else 0.0
                why = "; ".join(c.reasons) if c.reasons else "no lowering rule applies"
                lines.append(f"  {c.name or '<unnamed>'} ({c.op}, {c.macs:,} MACs, {share:.1f} %): {why}")
        return "\n".join(lines)

    def format(self, *, max_rows: int = 60) -> str:
        lowered = [n for n in self.nodes if n.integer_op]
        stayed = [n for n in self.nodes if not n.integer_op]
        lines = [
            f"fusion coverage: {len(lowered)} of {len(self.nodes)} compute nodes run as integer kernels; "
            f"{self.integer_share * 100:.1f} % of {self.total_macs:,} multiply-accumulates in integer",
        ]
        by_op: dict[tuple[str, str], int] = {}
        for n in lowered:
            by_op[(n.op, n.integer_op or "")] = by_op.get((n.op, n.integer_op or ""), 0) + 1
        for (op, iop), k in sorted(by_op.items()):
            lines.append(f"  {op} -> {iop}: {k}")
        if self.channels_last_ops:
            lines.append(
                f"channels-last: {self.channels_last_ops} operators exchange NHWC tensors; "
                f"{self.layout_transposes} Transposes at the regions' edges"
            )
        if self.float_islands:
            lines.append(
                "float islands: " + ", ".join(f"{op} {k}" for op, k in sorted(self.float_islands.items()))
            )
        for note in self.notes:
            lines.append(f"subgraph: {note}")
        if stayed:
            lines.append("stayed float:")
            for n in stayed[:max_rows]:
                mac = f", {n.macs:,} MACs" if n.macs else ""
                lines.append(f"  {n.name or '<unnamed>'} ({n.op}{mac})")
                for r in n.reasons or ["no lowering rule applies (no Q/DQ around it)"]:
                    lines.append(f"      {r}")
            if len(stayed) > max_rows:
                lines.append(f"  ... and {len(stayed) - max_rows} more")
        return "\n".join(lines)


#: integer ops that absorb a float neighbour (FuseMatMulFloatBias: the bias Add)
_FUSED_INTO = frozenset({"MatMulIntegerToFloat"})


def coverage(
    before: Graph, after: Graph, no_matches: list, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> CoverageReport:
    """Compare the compute nodes of ``before`` (by name) with ``after`` (what became of
    them); ``no_matches`` are the lowering pipeline's NoMatch records, keyed by the
    rule's root node: the QuantizeLinear after the op, or the op itself. ``shapes``: see
    :func:`macs`."""
    after_by_name = {n.name: n for n in after.nodes if n.name}
    # a node fused into its producer (a bias Add into MatMulIntegerToFloat) is gone by
    # name; the fused op took over its output value
    after_by_output = {o.name: n for n in after.nodes for o in n.outputs}
    by_root: dict[str, list[str]] = {}
    for rec in no_matches:
        if rec.kind == "pattern":
            continue
        root = rec.node.split(" -> ")[0]
        by_root.setdefault(root, []).append(f"{rec.rule}: {rec.reason}")
    report = []
    for node in before.nodes:
        if node.op_type in INTEGER_OPS:
            report.append(
                NodeCoverage(
                    node.name,
                    node.op_type,
                    node.op_type,
                    macs(node, shapes),
                    symbolic=counted_with_symbolic_dims(node, shapes),
                )
            )
            continue
        if node.op_type not in COMPUTE_OPS or node.domain:
            continue
        new = after_by_name.get(node.name) if node.name else None
        integer = None
        if new is not None and new.op_type in INTEGER_OF.get(node.op_type, ()):
            integer = new.op_type
        elif new is None and node.outputs:
            fused = after_by_output.get(node.outputs[0].name)
            if fused is not None and fused.name != node.name and fused.op_type in _FUSED_INTO:
                integer = fused.op_type
        if integer is None:
            integer = _table_holding(node, after_by_name)
        if integer is None:
            integer = _int_stage_holding(node, after_by_name)
        if integer is None and new is None:
            integer = _bias_add_holding(node, after_by_name)
        mine: list[str] = []
        if integer is None:
            out = node.outputs[0] if node.outputs else None
            roots = [node.label] + [c.label for c in (out.consumers() if out is not None else [])]
            rule = LOWER_RULE_OF.get(node.op_type)
            for root in roots if rule else ():
                mine += [r for r in by_root.get(root, []) if r.startswith(rule + ":")]
            if not mine:
                mine = _structural_reasons(node)
        report.append(
            NodeCoverage(
                node.name,
                node.op_type,
                integer,
                macs(node, shapes),
                mine,
                symbolic=counted_with_symbolic_dims(node, shapes),
            )
        )
    islands: dict[str, int] = {}
    for n in after.nodes:
        if not n.domain and not n.op_type.startswith("QLinear") and n.op_type not in _NOT_ISLANDS:
            if not n.op_type.endswith("Integer"):
                islands[n.op_type] = islands.get(n.op_type, 0) + 1
    # the pass names every channels-last result "<original>_nhwc"
    nhwc = sum(
        1
        for n in after.nodes
        if n.op_type != "Transpose" and any(o.name.endswith("_nhwc") for o in n.outputs)
    )
    transposes = sum(
        1 for n in after.nodes if n.op_type == "Transpose" and n.name.startswith("channels_last/")
    )
    return CoverageReport(report, islands, nhwc, transposes)


#: integer ops that hold a whole group of elementwise ops (quanta QLinearLookup, a
#: 256-entry table: passes/lower/lookup.py); the table op takes the group's last op's name
TABLE_OPS = frozenset({"QLinearLookup"})


def _int_stage_holding(node: Node, after_by_name: Mapping[str, Node]) -> str | None:
    """The ``quanta.int`` operator (the integer-only stage of npu-sim,
    passes/lower/integer_only.py) that computes ``node``: it takes the name of the op or of
    the QuantizeLinear that read the op's output. None when there is none."""
    names = [node.name] + [c.name for o in node.outputs[:1] for c in o.consumers()]
    for name in names:
        new = after_by_name.get(name) if name else None
        if new is not None and new.domain == "quanta.int":
            return new.op_type
    return None


def _bias_add_holding(node: Node, after_by_name: Mapping[str, Node]) -> str | None:
    """The QLinearMatMulAdd that computes the bias Add ``node`` (FuseQLinearMatMulAdd names
    the fused node after the MatMul): an operand of the Add that is the MatMul's output,
    through its Q / DQ pair, whose name now holds a QLinearMatMulAdd."""
    if node.op_type != "Add":
        return None
    for v in node.inputs:
        p = v.producer if v is not None else None
        for _ in range(2):  # DequantizeLinear <- QuantizeLinear <- MatMul
            if p is not None and p.op_type in ("DequantizeLinear", "QuantizeLinear") and p.inputs:
                p = p.inputs[0].producer if p.inputs[0] is not None else None
        new = after_by_name.get(p.name) if p is not None and p.name else None
        if new is not None and new.op_type == "QLinearMatMulAdd":
            return new.op_type
    return None


def _table_holding(node: Node, after_by_name: Mapping[str, Node]) -> str | None:
    """The table op that now computes ``node``: its own name's, or, when ``node`` is gone,
    that of a later op its output reached through other gone ops (the table replaced the
    whole group, e.g. the Sigmoid of x·Sigmoid(x)). None when there is none."""
    stack, seen = [node], set()
    while stack and len(seen) < 64:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        new = after_by_name.get(n.name) if n.name else None
        if new is not None:
            if new.op_type in TABLE_OPS:
                return new.op_type
            continue  # this path reached an op that survived as itself
        for o in n.outputs:
            stack.extend(o.consumers())
    return None


def _structural_reasons(node: Node) -> list[str]:
    """Why no lowering rule was even a candidate: no Q after it, inputs not dequantized."""
    if node.op_type == "LSTM":
        return [
            "LSTM left float (quantize_static and quantize_dynamic write it as DynamicQuantizeLSTM "
            "unless the recipe says recurrent: float)"
        ]
    if node.op_type in _RECURRENT:
        return [f"{node.op_type} has no integer form (ONNX Runtime's is DynamicQuantizeLSTM, for LSTM only)"]
    reasons = []
    out = node.outputs[0] if node.outputs else None
    if out is not None and not any(c.op_type == "QuantizeLinear" for c in out.consumers()):
        if node.op_type != "Gemm":
            reasons.append("its output is not quantized (no QuantizeLinear after it)")
    for k, v in enumerate(node.inputs):
        if v is None or (k >= 2 and node.op_type in ("Conv", "Gemm", "ConvTranspose")):
            continue
        if v.producer is None or v.producer.op_type != "DequantizeLinear":
            reasons.append(f"input {k} '{v.name}' is not dequantized (float input)")
    if node.op_type not in LOWER_RULE_OF:
        reasons.append(f"no integer kernel for {node.op_type} yet")
    return reasons or ["no lowering rule applies"]
