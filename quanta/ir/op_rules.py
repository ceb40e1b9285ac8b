"""Per-op type rules: one table, op -> rule, used by :mod:`quanta.ir.verify`.

A rule receives the node and the stage and returns a list of error messages (empty when
the node is well typed). Every message names the op, the node and the value, and says
what was expected. Each rule's docstring gives an Incorrect / Correct example.

Stages (a rule set per stage, as tinygrad's spec):

- ``FLOAT``: a float model, possibly with calibrated ranges. No quantized types and no
  quantization operators.
- ``QDQ``: a float model with QuantizeLinear/DequantizeLinear pairs. Quantized values are
  produced by QuantizeLinear (or are constants) and consumed only by DequantizeLinear and
  by views, which keep their input's element type.
- ``LOWERED``: integer operators (QLinear*, *Integer, com.microsoft QLinear*), whose
  quantized operands must agree with their scale / zero-point inputs; any op may carry
  quantized types (an integer kernel for it was selected), and the graph signature and
  the consumers' parameters hold it to its contract.
"""

from __future__ import annotations

from collections.abc import Callable

from quanta.ir.graph import Node, Value
from quanta.ir.onnx_io import (
    VIEW_OPS_KEEPING_TYPE,
    mx_type_of_quantize_mx,
    quant_operands,
    quant_type_from_params,
)
from quanta.ir.op_facts import Stage, derive
from quanta.ir.types import E8M0, MX_ELEMENTS, CalibratedType, FloatType, IntType, MXType, QuantType

__all__ = ["OP_RULES", "QUANT_OPS", "VIEW_OPS", "Stage", "rules_for"]


#: Ops that only move or select elements: their output keeps the input's element type
#: (docs/design.md: pure views keep the element type of their input). One set, in onnx_io.
VIEW_OPS = VIEW_OPS_KEEPING_TYPE

#: Operators that exist only in quantized graphs.
QUANT_OPS = derive("quanta.ir.op_rules.QUANT_OPS", lambda t: t.ops_where(quant=True))

#: Which quantization operators each stage admits.
STAGE_QUANT_OPS = derive(
    "quanta.ir.op_rules.STAGE_QUANT_OPS",
    lambda t: {s: frozenset(r.op_type for r in t if r.quant and s in r.stages) for s in Stage},
)

Rule = Callable[[Node, Stage], list[str]]


def _elem(v: Value | None):
    return None if v is None or v.type is None else v.type.elem


def rule_quant_operands(node: Node, stage: Stage) -> list[str]:
    """Quantized operands agree with the constant scale / zero point that describe them.

    Incorrect::

        %q: Q(i8:f32, 0.02, 0) = QuantizeLinear(%x, 0.08, 0)

    Correct::

        %q: Q(i8:f32, 0.08, 0) = QuantizeLinear(%x, 0.08, 0)
    """
    del stage  # the same in every stage that admits the op
    errors = []
    for (kind, i), si, zi in quant_operands(node):
        v = node.input(i) if kind == "in" else (node.outputs[i] if i < len(node.outputs) else None)
        if v is None:
            continue
        want = quant_type_from_params(node, v, node.input(si), node.input(zi))
        got = _elem(v)
        if want is None or got is None:
            continue
        role = "input" if kind == "in" else "output"
        if not isinstance(got, (QuantType, MXType)):
            errors.append(
                f"{node.op_type} {node.label}: {role} '{v.name}' has type {got} "
                f"but its scale/zero point inputs give {want}"
            )
        elif got != want and not (
            isinstance(got, QuantType) and isinstance(want, QuantType) and _same_up_to_axis_sign(got, want, v)
        ):
            errors.append(
                f"{node.op_type} {node.label}: {role} '{v.name}' has type {got} "
                f"but its scale/zero point inputs give {want}"
            )
    return errors


def _same_up_to_axis_sign(a: QuantType, b: QuantType, v: Value) -> bool:
    """Per-axis types equal except that one writes the axis negatively."""
    if a.axis is None or b.axis is None or v.shape is None:
        return False
    rank = len(v.shape)
    return a.axis % rank == b.axis % rank and (a.storage, a.expressed, a.scale, a.zero_point, a.block) == (
        b.storage,
        b.expressed,
        b.scale,
        b.zero_point,
        b.block,
    )


def rule_dequantize_output(node: Node, stage: Stage) -> list[str]:
    """DequantizeLinear produces the expressed float type of its input's quantized type.

    Incorrect::

        %y: Q(i8:f32, 0.08, 0) = DequantizeLinear(%q: Q(i8:f32, 0.08, 0), 0.08, 0)

    Correct::

        %y: f32 = DequantizeLinear(%q: Q(i8:f32, 0.08, 0), 0.08, 0)
    """
    errors = rule_quant_operands(node, stage)
    errors += _rule_dequantize_mx(node)
    out = _elem(node.outputs[0])
    if out is not None and not isinstance(out, (FloatType, CalibratedType)):
        errors.append(
            f"DequantizeLinear {node.label}: output '{node.outputs[0].name}' has type {out}, expected a float type"
        )
    return errors


def _rule_dequantize_mx(node: Node) -> list[str]:
    """A DequantizeLinear with a float8e8m0 scale is an MX dequantization: a block size, an
    MX element type, and a scale of the input's shape with ``ceil(dim / block)`` along the
    axis.

    Incorrect::

        %y: f32 = DequantizeLinear(%w: u8 [64, 3], %s: e8m0 [2, 3]) {axis=0}

    Correct::

        %y: f32 = DequantizeLinear(%w: f8e4m3fn [64, 3], %s: e8m0 [2, 3]) {axis=0, block_size=32}
    """
    x, s = node.input(0), node.input(1)
    se = _elem(s)
    if se is None and s is not None and s.is_const and s.const.dtype == E8M0.numpy:
        se = E8M0
    if se != E8M0:
        return []
    errors = []
    block = int(node.attrs.get("block_size") or 0)
    if block <= 0:
        errors.append(f"DequantizeLinear {node.label}: a float8e8m0 (MX) scale needs a positive block_size")
    xe = _elem(x)
    elem = xe.element if isinstance(xe, MXType) else xe
    if elem is not None and str(elem) not in MX_ELEMENTS.values():
        errors.append(
            f"DequantizeLinear {node.label}: input '{x.name}' has element type {elem}, expected an MX element "
            f"type ({', '.join(MX_ELEMENTS.values())}) under a float8e8m0 scale"
        )
    if block > 0 and x is not None and s is not None and x.shape is not None and s.shape is not None:
        rank = len(x.shape)
        ax = int(node.attrs.get("axis", 1))
        if -rank <= ax < rank and len(s.shape) == rank and all(isinstance(d, int) for d in x.shape):
            want = tuple(-(-d // block) if i == ax % rank else d for i, d in enumerate(x.shape))
            if all(isinstance(d, int) for d in s.shape) and tuple(s.shape) != want:
                errors.append(
                    f"DequantizeLinear {node.label}: scale '{s.name}' has shape {tuple(s.shape)}, expected {want} "
                    f"(input {tuple(x.shape)} in blocks of {block} along axis {ax})"
                )
    return errors


def rule_quantize_mx(node: Node, stage: Stage) -> list[str]:
    """quanta::QuantizeMX's element output has the MX type its attributes name.

    Incorrect::

        %y: MX(i8:f32, axis=1, block=32), %s = quanta::QuantizeMX(%x) {axis=1, block_size=16}

    Correct::

        %y: MX(i8:f32, axis=1, block=16), %s = quanta::QuantizeMX(%x) {axis=1, block_size=16}
    """
    del stage
    want = mx_type_of_quantize_mx(node)
    if want is None:
        return [
            f"QuantizeMX {node.label}: attributes output_dtype={node.attrs.get('output_dtype')}, "
            f"block_size={node.attrs.get('block_size')} name no MX type (an MX element type and a positive block)"
        ]
    got = _elem(node.outputs[0]) if node.outputs else None
    if got is not None and isinstance(got, (QuantType, MXType)) and got != want:
        return [
            f"QuantizeMX {node.label}: output '{node.outputs[0].name}' has type {got}, its attributes give {want}"
        ]
    return []


def rule_view(node: Node, stage: Stage) -> list[str]:
    """A view keeps the element type of its (data) input.

    Incorrect::

        %r: Q(i8:f32, 0.08, 0) = Reshape(%q: Q(i8:f32, 0.02, 0), %shape)

    Correct::

        %r: Q(i8:f32, 0.02, 0) = Reshape(%q: Q(i8:f32, 0.02, 0), %shape)
    """
    del stage
    src = _elem(node.input(0))
    errors = []
    for out in node.outputs[:1] if node.op_type in ("MaxPool", "NhwcMaxPool") else node.outputs:
        got = _elem(out)
        if src is None or got is None:
            continue
        if isinstance(src, QuantType) or isinstance(got, QuantType):
            if not _view_keeps(src, got):
                errors.append(
                    f"{node.op_type} {node.label}: output '{out.name}' has type {got} "
                    f"but a view keeps its input's type {src}"
                )
    return errors


def _view_keeps(src, got) -> bool:
    if not (isinstance(src, QuantType) and isinstance(got, QuantType)):
        return False
    if src.axis is None:
        return src == got
    # a per-axis view may move the axis (Transpose, Reshape); the parameters must stay
    return (src.storage, src.expressed, src.scale, src.zero_point, src.block) == (
        got.storage,
        got.expressed,
        got.scale,
        got.zero_point,
        got.block,
    )


def rule_no_quantized_compute(node: Node, stage: Stage) -> list[str]:
    """Before lowering, a computing op sees only float values: quantized tensors reach it
    through DequantizeLinear.

    Incorrect (QDQ stage)::

        %y = Conv(%q: Q(u8:f32, 0.02, 128), %w)

    Correct::

        %xf: f32 = DequantizeLinear(%q, 0.02, 128)
        %y = Conv(%xf, %w)
    """
    if stage is Stage.LOWERED:
        return []
    errors = []
    for k, v in enumerate(node.inputs):
        e = _elem(v)
        if isinstance(e, (QuantType, MXType)):
            errors.append(
                f"{node.op_type} {node.label}: input {k} '{v.name}' is quantized ({e}); in the {stage.value} "
                "stage only DequantizeLinear and views consume quantized values"
            )
    for v in node.outputs:
        e = _elem(v)
        if isinstance(e, (QuantType, MXType)):
            errors.append(
                f"{node.op_type} {node.label}: output '{v.name}' is quantized ({e}); in the {stage.value} "
                "stage only QuantizeLinear and views produce quantized values"
            )
    return errors


#: the integer ops whose epilogue takes an ``output_clamp`` (passes/lower/fold_code_clamp.py)
OUTPUT_CLAMP_OPS = frozenset({"QLinearConv"})


def rule_output_clamp(node: Node, stage: Stage) -> list[str]:
    """An ``output_clamp`` attribute is two codes of the output's storage, ``lo <= hi``,
    on a lowered integer op whose epilogue clamps (docs/quantization-math.md eq. (6c)).

    Incorrect::

        %y: Q(u8:f32, 0.05, 128) = QLinearConv(...) {output_clamp=[224, 128]}

    Correct::

        %y: Q(u8:f32, 0.05, 128) = QLinearConv(...) {output_clamp=[128, 224]}
    """
    errors = rule_quant_operands(node, stage)
    clamp = node.attrs.get("output_clamp")
    if clamp is None:
        return errors
    where = f"{node.op_type} {node.label}: output_clamp {clamp!r}"
    if stage is not Stage.LOWERED:
        return [*errors, f"{where}: only lowered integer ops carry an output clamp (stage {stage.value})"]
    elem = _elem(node.outputs[0]) if node.outputs else None
    storage = elem.storage if isinstance(elem, QuantType) else None
    if not isinstance(storage, IntType):
        return [*errors, f"{where}: the output's type {elem} is not quantized to integers"]
    ok = (
        isinstance(clamp, (list, tuple))
        and len(clamp) == 2
        and all(isinstance(v, int) for v in clamp)
        and storage.qmin <= clamp[0] <= clamp[1] <= storage.qmax
    )
    if not ok:
        errors.append(
            f"{where}: expected [lo, hi] with {storage.qmin} <= lo <= hi <= {storage.qmax} (codes of {storage})"
        )
    return errors


def rule_relabel_codes(node: Node, stage: Stage) -> list[str]:
    """RelabelCodes gives its input's codes another per-tensor (scale, zero point): input
    and output quantized to the same integer storage, neither per axis, lowered stage.

    Incorrect::

        %y: Q(i8:f32, 0.1, 0) = quanta::RelabelCodes(%x: Q(u8:f32, 0.05, 128))

    Correct::

        %y: Q(u8:f32, 0.1, 128) = quanta::RelabelCodes(%x: Q(u8:f32, 0.05, 128))
    """
    where = f"{node.op_type} {node.label}"
    if stage is not Stage.LOWERED:
        return [f"{where}: only the lowered stage relabels codes (stage {stage.value})"]
    src = _elem(node.input(0))
    got = _elem(node.outputs[0]) if node.outputs else None
    if not (isinstance(src, QuantType) and isinstance(got, QuantType)):
        return [f"{where}: expected a quantized input and output, got {src} -> {got}"]
    if src.storage != got.storage or src.axis is not None or got.axis is not None:
        return [f"{where}: expected one per-tensor storage type on both sides, got {src} -> {got}"]
    return []


OP_RULES: dict[str, Rule] = {
    "QuantizeLinear": rule_quant_operands,
    "DequantizeLinear": rule_dequantize_output,
    **{op: rule_view for op in VIEW_OPS},
    **{op: rule_quant_operands for op in QUANT_OPS - {"QuantizeLinear", "DequantizeLinear", "QuantizeMX"}},
    "QuantizeMX": rule_quantize_mx,
    **{op: rule_output_clamp for op in OUTPUT_CLAMP_OPS},
    "RelabelCodes": rule_relabel_codes,
}


def rules_for(node: Node) -> Rule:
    """The rule for ``node``; ops without an entry are computing ops."""
    return OP_RULES.get(node.op_type, rule_no_quantized_compute)
