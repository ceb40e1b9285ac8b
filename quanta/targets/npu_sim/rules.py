"""npu-sim's capabilities as data, the integer-only stage's verifier, NPU constraint profiles.

Three layers, each a table plus one function that reads it:

1. :data:`CAPABILITIES` — what the simulated device runs: the ``quanta.int`` operators
   of the integer-only stage (docs/passes.md "Integer-only stage") and integer data
   movement, the element types of activations (int8 per tensor; int16 with the
   ``int16`` profile), weights (int8, symmetric per output channel) and biases (int32),
   the requantization rounding modes, memory size and alignment.
   :func:`check_node` is the per-node rule set (``supported`` of the kernels).
2. :func:`verify_integer_stage` — the verifier of the stage: every node of a device
   partition passes :func:`check_node` and no value it reads or writes is a float
   tensor. This is the proof that no float operation remains on the device.
3. :data:`PROFILES` — constraint profiles of real NPU families as data. ``ethos-u``
   restates Arm Ethos-U's Vela supported-operator constraints (Vela 3.6
   ``SUPPORTED_OPS.md``, TFLite generic and per-operator constraints) for the
   ``quanta.int`` operators they map onto; :func:`check_profile` reports every
   violation, naming node and rule, before any code is generated.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import IntType, QuantType

__all__ = [
    "CAPABILITIES",
    "PROFILES",
    "Capabilities",
    "ProfileRule",
    "Violation",
    "check_node",
    "check_profile",
    "verify_integer_stage",
]

INT = "quanta.int"
#: the integer-only stage's operators (golden: quanta.kernels.reference.intonly)
OPS = (
    "IntRescale",
    "IntConv",
    "IntMatMul",
    "IntAdd",
    "IntMul",
    "IntLookup",
    "IntSoftmax",
    "IntLayerNorm",
    "IntGelu",
    "IntGlobalAveragePool",
)


@dataclass(frozen=True)
class Capabilities:
    """What a device runs (data the partitioner, the quantizer and the verifier read)."""

    name: str
    #: compute operators (``domain::op``) with integer kernels
    ops: frozenset[str]
    #: data-movement operators that run on any integer tensor (no arithmetic on values)
    movement: frozenset[str]
    #: storage types of activations (per tensor)
    activation_types: tuple[str, ...]
    #: storage of weights (symmetric, per output channel or per tensor)
    weight_types: tuple[str, ...]
    bias_types: tuple[str, ...]
    rounding_modes: tuple[str, ...]
    #: device memory in bytes, and the alignment of every buffer
    memory_bytes: int = 256 << 20
    alignment: int = 64
    notes: dict[str, str] = field(default_factory=dict)


CAPABILITIES = Capabilities(
    name="npu-sim",
    ops=frozenset(f"{INT}::{op}" for op in OPS),
    movement=frozenset(
        (
            "::Reshape",
            "::Transpose",
            "::Flatten",
            "::Squeeze",
            "::Unsqueeze",
            "::Concat",
            "::Slice",
            "::Split",
            "::Gather",
            "::Identity",
            "::MaxPool",
            "::Pad",
            "::Shape",
        )
    ),
    activation_types=("i8", "u8", "i16"),
    weight_types=("i8",),
    bias_types=("i32",),
    rounding_modes=("double", "single", "tosa"),
    notes={
        "weights": "int8, symmetric (zero point 0), per output channel or per tensor",
        "activations": "int8 per tensor (int16 with the int16 profile option)",
        "non-linearities": "8-bit lookup tables; 513-entry interpolated int16 tables (TFLite) for 16-bit "
        "GELU; I-BERT integer polynomials for 16-bit Softmax (i-exp) and GELU to 8 bits (i-GELU); integer "
        "Softmax and LayerNormalization (Newton integer square root)",
    },
)

#: attributes every requantizing operator carries, and the range of each
_REQUANT_ATTRS = {
    "IntConv": ("multiplier", "shift", "rounding", "x_zero_point", "y_zero_point"),
    "IntMatMul": ("multiplier", "shift", "rounding", "a_zero_point", "y_zero_point"),
    "IntAdd": ("multiplier", "shift", "a_multiplier", "a_shift", "b_multiplier", "b_shift", "rounding"),
    "IntMul": ("multiplier", "shift", "rounding"),
    "IntRescale": ("multiplier", "shift", "rounding", "input_zero_point", "output_zero_point"),
    "IntGlobalAveragePool": ("multiplier", "shift", "rounding"),
    "IntSoftmax": ("y_shift", "y_zero_point"),
    "IntLayerNorm": ("eps", "gamma_shift", "x_zero_point", "y_zero_point"),
    "IntLookup": (),
    "IntGelu": (
        "erf_b",
        "erf_c",
        "pre_shift",
        "multiplier",
        "shift",
        "rounding",
        "x_zero_point",
        "y_zero_point",
    ),
}


def _key(node: Node) -> str:
    return f"{node.domain}::{node.op_type}"


def _is_int(v: Value) -> bool:
    if v.type is None:
        return v.const is not None and np.asarray(v.const).dtype.kind in "iub"
    return isinstance(v.type.elem.storage, IntType)


def _multipliers_ok(node: Node) -> str | None:
    for mk, sk in (("multiplier", "shift"), ("a_multiplier", "a_shift"), ("b_multiplier", "b_shift")):
        if mk not in node.attrs:
            continue
        mult = np.asarray(node.attrs[mk], np.int64).reshape(-1)
        sh = np.asarray(node.attrs[sk], np.int64).reshape(-1)
        if mult.shape != sh.shape:
            return f"{mk} and {sk} have {mult.size} and {sh.size} values"
        bad = (mult != 0) & ((mult < (1 << 30)) | (mult >= (1 << 31)))
        if bad.any():
            return f"{mk} {int(mult[bad][0])} is outside [2^30, 2^31) (a normalized int32 multiplier)"
        if ((sh < -31) | (sh > 30)).any():
            return f"{sk} {int(sh[(sh < -31) | (sh > 30)][0])} is outside [-31, 30]"
    return None


def check_node(node: Node, caps: Capabilities = CAPABILITIES) -> str | None:
    """Why the device cannot run ``node`` (rule named in the text), or None."""
    key = _key(node)
    if key not in caps.ops and key not in caps.movement:
        return f"[op] {node.domain or 'ai.onnx'}::{node.op_type} is not a {caps.name} operator"
    for v in [*node.inputs, *node.outputs]:
        if v is not None and not _is_int(v):
            return f"[float-tensor] value '{v.name}' is {v.type.elem if v.type else 'untyped'}: the device holds integer tensors only"
    if key in caps.movement:
        return None
    for v in node.outputs:
        elem = v.type.elem if v.type is not None else None
        if isinstance(elem, QuantType) and elem.axis is not None:
            return f"[granularity] output '{v.name}' is quantized per axis: activations are per tensor"
        if (
            elem is not None
            and str(elem.storage) not in caps.activation_types
            and node.op_type != "IntLookup"
        ):
            return f"[activation-type] output '{v.name}' is {elem.storage}, expected one of {caps.activation_types}"
    for a in _REQUANT_ATTRS[node.op_type]:
        if a not in node.attrs:
            return f"[requant-params] attribute '{a}' is missing"
    if "rounding" in node.attrs and node.attrs["rounding"] not in caps.rounding_modes:
        return f"[rounding] '{node.attrs['rounding']}' is not one of {caps.rounding_modes}"
    bad = _multipliers_ok(node)
    if bad:
        return f"[requant-params] {bad}"
    if node.op_type == "IntConv":
        w = node.inputs[1]
        if w is None or not w.is_const or np.asarray(w.const).dtype != np.int8:
            return "[weights] Conv weights must be a constant int8 tensor (symmetric, no zero point)"
        c = node.inputs[2]
        if c is None or not c.is_const or np.asarray(c.const).dtype != np.int32:
            return "[bias] Conv needs its int32 column-sum constant c = bias - zx·Σw"
    if node.op_type == "IntMatMul" and len(node.inputs) > 2 and node.inputs[2] is not None:
        b = node.inputs[1]
        if b is None or not b.is_const or np.asarray(b.const).dtype != np.int8:
            return "[weights] MatMul with a folded constant c needs constant int8 weights"
    return None


def verify_integer_stage(nodes: Iterable[Node], caps: Capabilities = CAPABILITIES) -> list[str]:
    """Every problem of a device partition (empty: it runs integer-only on the device).

    Each entry names the node and the rule; a float tensor anywhere in the partition is
    one, so an empty list proves that no float operation remains there."""
    problems = []
    for node in nodes:
        reason = check_node(node, caps)
        if reason is not None:
            problems.append(f"node {node.label}: {reason}")
    return problems


# --------------------------------------------------------------------------------------
# Constraint profiles of real NPU families
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Violation:
    node: str
    rule: str
    detail: str

    def __str__(self) -> str:
        return f"node {self.node}: [{self.rule}] {self.detail}"


@dataclass(frozen=True)
class ProfileRule:
    """One documented constraint: an id, the ops it applies to, its text, a check.

    ``check(node, ctx)`` returns None when the node satisfies the rule, else the detail
    (what the node has); ``ctx`` holds the profile's numbers."""

    id: str
    ops: tuple[str, ...]  # quanta.int op types, or "*" for every device op
    text: str
    check: Callable[[Node, dict[str, Any]], str | None]


def _shape(v: Value | None) -> tuple | None:
    if v is None:
        return None
    if v.const is not None:
        return tuple(np.asarray(v.const).shape)
    return v.shape


def _rank_le4(node: Node, ctx: dict[str, Any]) -> str | None:
    for v in [*node.inputs, *node.outputs]:
        s = _shape(v)
        if s is not None and len(s) > ctx["max_rank"]:
            return f"'{v.name}' has rank {len(s)}"
    return None


def _dims_in_range(node: Node, ctx: dict[str, Any]) -> str | None:
    lo, hi = ctx["dim_range"]
    for v in [*node.inputs, *node.outputs]:
        s = _shape(v)
        for d in s or ():
            if isinstance(d, int) and not lo <= d <= hi:
                return f"'{v.name}' has dimension {d}"
    return None


def _shape_defined(node: Node, ctx: dict[str, Any]) -> str | None:
    # a symbolic leading (batch) dimension is bound to 1 when the model is converted, as
    # TFLite files for the NPU have it (ctx "symbolic_batch_ok"); any other must be static
    skip = 1 if ctx.get("symbolic_batch_ok") else 0
    for v in [*node.inputs, *node.outputs]:
        s = _shape(v)
        if v is not None and (s is None or any(not isinstance(d, int) for d in s[skip:])):
            return f"'{v.name}' has shape {s}"
    return None


def _batch_one(node: Node, ctx: dict[str, Any]) -> str | None:
    s = _shape(node.inputs[0])
    if s and isinstance(s[0], int) and s[0] != 1 and len(s) == 4:
        return f"batch {s[0]}"
    return None


def _per_axis_only_conv(node: Node, ctx: dict[str, Any]) -> str | None:
    m = np.asarray(node.attrs.get("multiplier", 0)).reshape(-1)
    if node.op_type not in ("IntConv",) and m.size > 1:
        return f"{m.size} per-channel multipliers on {node.op_type}"
    return None


def _geom(node: Node) -> tuple[list[int], list[int], list[int]]:
    w = _shape(node.inputs[1]) or ()
    k = list(node.attrs.get("kernel_shape", w[2:]))
    return k, list(node.attrs.get("strides", [1] * len(k))), list(node.attrs.get("dilations", [1] * len(k)))


def _is_depthwise(node: Node) -> bool:
    w = _shape(node.inputs[1]) or ()
    return node.attrs.get("group", 1) > 1 and len(w) > 1 and w[1] == 1


def _conv_stride(node: Node, ctx: dict[str, Any]) -> str | None:
    _, s, _ = _geom(node)
    hi = ctx["dw_stride_max"] if _is_depthwise(node) else ctx["conv_stride_max"]
    if any(not 1 <= v <= hi for v in s):
        return f"strides {s} (allowed 1..{hi})"
    return None


def _dilated_kernel(node: Node, ctx: dict[str, Any]) -> str | None:
    k, _, d = _geom(node)
    ext = [dd * (kk - 1) + 1 for kk, dd in zip(k, d)]
    if ext and not 1 <= ext[0] <= ctx["dilated_h_max"]:
        return f"dilated kernel height {ext[0]} (allowed 1..{ctx['dilated_h_max']})"
    if int(np.prod(ext)) > ctx["dilated_area_max"]:
        return f"dilated kernel area {int(np.prod(ext))} (allowed <= {ctx['dilated_area_max']})"
    return None


def _weight_sum(node: Node, ctx: dict[str, Any]) -> str | None:
    w = node.inputs[1]
    if w is None or w.const is None:
        return None  # two activations (BATCH_MATMUL): no weight tensor
    w = np.asarray(w.const).astype(np.int64)
    per_out = (
        np.abs(w.reshape(w.shape[0], -1)).sum(axis=1) if node.op_type == "IntConv" else np.abs(w).sum(axis=0)
    )
    if per_out.max(initial=0) > ctx["weight_sum_max"]:
        return f"sum of |weights| {int(per_out.max())} of one output channel (allowed <= {ctx['weight_sum_max']})"
    return None


def _bias_40bit(node: Node, ctx: dict[str, Any]) -> str | None:
    c = node.inputs[2] if len(node.inputs) > 2 else None
    if c is None or c.const is None:
        return None
    v = np.abs(np.asarray(c.const).astype(np.int64))
    if v.max(initial=0) >= 1 << 39:
        return f"bias {int(v.max())} does not fit 40 bits"
    return None


def _depth_multiplier(node: Node, ctx: dict[str, Any]) -> str | None:
    if not _is_depthwise(node):
        return None
    group = node.attrs.get("group", 1)
    w = _shape(node.inputs[1]) or ()
    mult = w[0] // group if w else 1
    if mult > 1 and group != 1:
        return f"depth multiplier {mult} with {group} input channels"
    return None


def _fc_output_2d(node: Node, ctx: dict[str, Any]) -> str | None:
    if node.inputs[1] is None or node.inputs[1].const is None:
        return None  # an activation x activation MatMul maps to BATCH_MATMUL, not FULLY_CONNECTED
    s = _shape(node.outputs[0])
    if s is not None and len(s) != 2:
        return f"output rank {len(s)}"
    return None


def _gap_area(node: Node, ctx: dict[str, Any]) -> str | None:
    s = _shape(node.inputs[0])
    if s is None or len(s) < 4:
        return None
    area = int(s[2]) * int(s[3])
    if area > ctx["mean_area_max"]:
        return f"H·W = {area} (allowed <= {ctx['mean_area_max']})"
    return None


def _softmax_shapes(node: Node, ctx: dict[str, Any]) -> str | None:
    if _shape(node.inputs[0]) != _shape(node.outputs[0]):
        return f"{_shape(node.inputs[0])} -> {_shape(node.outputs[0])}"
    return None


def _no_layernorm(node: Node, ctx: dict[str, Any]) -> str | None:
    return "Ethos-U (Vela 3.6) has no LAYER_NORM operator"


def _lookup_8bit(node: Node, ctx: dict[str, Any]) -> str | None:
    x = node.inputs[0]
    if x is not None and x.type is not None and str(x.type.elem.storage) not in ("i8", "u8"):
        return f"input is {x.type.elem.storage}"
    return None


ETHOS_U_RULES: tuple[ProfileRule, ...] = (
    ProfileRule("generic.rank", ("*",), "Input(s) and Output tensors must not be greater than 4D", _rank_le4),
    ProfileRule(
        "generic.shape", ("*",), "Input(s) and Output tensors must have a defined shape", _shape_defined
    ),
    ProfileRule("generic.dims", ("*",), "Tensor dimensions must be in the range [1, 65535]", _dims_in_range),
    ProfileRule(
        "generic.batch",
        ("IntConv", "IntGlobalAveragePool", "IntAdd", "IntMul"),
        "IFM Tensor batch size must be 1",
        _batch_one,
    ),
    ProfileRule(
        "generic.per_axis",
        ("*",),
        "Per-axis quantization is only supported for CONV_2D, DEPTHWISE_CONV_2D, TRANSPOSE_CONV",
        _per_axis_only_conv,
    ),
    ProfileRule(
        "conv.stride",
        ("IntConv",),
        "Stride values must be between 1 and 4 (CONV_2D) / 1 and 3 (DEPTHWISE_CONV_2D)",
        _conv_stride,
    ),
    ProfileRule(
        "conv.dilated_kernel",
        ("IntConv",),
        "Dilated kernel height in [1, 64]; product of dilated kernel width and height in [1, 4096]",
        _dilated_kernel,
    ),
    ProfileRule(
        "conv.weight_sum",
        ("IntConv", "IntMatMul"),
        "The sum of the weights cannot exceed 8323072",
        _weight_sum,
    ),
    ProfileRule(
        "conv.bias_40bit",
        ("IntConv", "IntMatMul"),
        "Optional Bias tensor values must fit within 40-bits",
        _bias_40bit,
    ),
    ProfileRule(
        "depthwise.multiplier",
        ("IntConv",),
        "For depth multipliers > 1, IFM channels must be 1 and OFM channels equal to the depth multiplier",
        _depth_multiplier,
    ),
    ProfileRule(
        "fc.output_2d",
        ("IntMatMul",),
        "FULLY_CONNECTED: the output tensor(s) must have 2D shape",
        _fc_output_2d,
    ),
    ProfileRule(
        "mean.area",
        ("IntGlobalAveragePool",),
        "MEAN: product of height and width no greater than 4096 (rescaling)",
        _gap_area,
    ),
    ProfileRule("softmax.shapes", ("IntSoftmax",), "SOFTMAX: IFM and OFM shapes must match", _softmax_shapes),
    ProfileRule(
        "lookup.8bit",
        ("IntLookup",),
        "LUT activations (LOGISTIC, TANH, HARD_SWISH...): IFM int8 or uint8",
        _lookup_8bit,
    ),
    ProfileRule(
        "op.layernorm",
        ("IntLayerNorm",),
        "Operator not in Vela's supported list (runs on the CPU)",
        _no_layernorm,
    ),
)

PROFILES: dict[str, dict[str, Any]] = {
    "npu-sim": {"rules": (), "ctx": {}},
    "ethos-u": {
        "source": "Arm Ethos-U Vela 3.6 SUPPORTED_OPS.md (TFLite generic and per-operator constraints)",
        "rules": ETHOS_U_RULES,
        "ctx": {
            "max_rank": 4,
            "symbolic_batch_ok": True,
            "dim_range": (1, 65535),
            "conv_stride_max": 4,
            "dw_stride_max": 3,
            "dilated_h_max": 64,
            "dilated_area_max": 4096,
            "weight_sum_max": 8323072,
            "mean_area_max": 4096,
        },
    },
}


def check_profile(graph: Graph | Iterable[Node], profile: str = "ethos-u") -> list[Violation]:
    """Every violation of ``profile``'s rules by the device nodes, naming node and rule."""
    if profile not in PROFILES:
        raise ValueError(f"unknown NPU profile '{profile}': expected one of {sorted(PROFILES)}")
    prof = PROFILES[profile]
    nodes = graph.nodes if isinstance(graph, Graph) else graph
    out = []
    for node in nodes:
        if node.domain != INT:
            continue
        for rule in prof["rules"]:
            if "*" not in rule.ops and node.op_type not in rule.ops:
                continue
            detail = rule.check(node, prof["ctx"])
            if detail is not None:
                out.append(Violation(node.label, rule.id, f"{rule.text}: {detail}"))
    return out
