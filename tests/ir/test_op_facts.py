"""The op-facts table (quanta.ir.op_facts) and the sets every call site derives from it.

Failure signature guarded against: an operator added to one copy of a set ("views",
"compute ops", "integer forms") and not to the others, so the quantizer plans it, the
verifier rejects it and the coverage report miscounts it.
"""

from __future__ import annotations

import importlib

import pytest

from quanta.ir import op_facts
from quanta.ir.op_facts import ALL, DERIVED, FACTS, MS, MacKind, Op, QdqRole, Stage

#: every module that derives a set from the table (importing it records its derivations)
SITES = (
    "quanta.ir.onnx_io",
    "quanta.ir.op_rules",
    "quanta.passes.coverage",
    "quanta.passes.rules.fuse_activation",
    "quanta.quantize.qdq",
    "quanta.runtime.memory",
    "quanta.runtime.static_steps",
    "quanta.targets.native",
    "quanta.targets.native.views",
)
for _m in SITES:
    importlib.import_module(_m)

_QUANT = {
    "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
    "MatMulInteger", "ConvInteger", "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearGlobalAveragePool",
    "QLinearAveragePool", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "AccumulatorToFloat",
    "AccumulatorToQuant", "SoftmaxQuant", "MulQuant", "QLinearLookup", "QLinearConv16", "QLinearMatMul16", "QLinearMatMulAdd", "MatMulW4A8", "QuantizeMX", "MatMulMX", "ConvMX",
    "QLinearAffine16", "QLinearAdd16", "QLinearMul16", "MlasQLinearConv", "QGemm", "RelabelCodes",
}  # fmt: skip
#: the elementwise activations lowering turns into a 256-entry table (quanta QLinearLookup)
_TABLED = (
    "Celu", "Elu", "Erf", "Exp", "Gelu", "HardSigmoid", "HardSwish", "Mish", "Selu", "Softplus", "Softsign", "Tanh",
)  # fmt: skip
_ALIAS = {"Identity", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "TransposeView", "RelabelCodes"}
_RANDOM = {
    "RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli", "Dropout",
}  # fmt: skip

#: the contents each call site held before the table existed (issue 11 item 6), pinned once
PINNED = {
    "quanta.ir.onnx_io.VIEW_OPS_KEEPING_TYPE": {
        "Reshape", "Transpose", "TransposeView", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Gather", "MaxPool",
        "NhwcMaxPool", "Identity", "Split", "Expand", "DepthToSpace", "SpaceToDepth", "Tile",
    },
    "quanta.ir.op_rules.QUANT_OPS": _QUANT,
    "quanta.ir.op_rules.STAGE_QUANT_OPS": {
        Stage.FLOAT: set(),
        # ORT's fused u8·s8 groups, written before lowering where its kernels saturate
        Stage.QDQ: {"QuantizeLinear", "DequantizeLinear", "QuantizeMX", "MlasQLinearConv", "QLinearMatMul", "QGemm"},
        Stage.LOWERED: _QUANT,
    },
    "quanta.passes.coverage.COMPUTE_OPS": {
        "Conv", "ConvTranspose", "MatMul", "Gemm", "Add", "Mul", "Concat", "AveragePool",
        "GlobalAveragePool", "Sigmoid", "LeakyRelu", "Softmax", "LSTM", "GRU", "RNN", "Einsum", *_TABLED,
        "OrtLSTM", "OrtGRU", "ConvNchwc", "MlasConv", "MlasMatMul",
    },
    "quanta.passes.coverage.INTEGER_OF": {
        "Conv": ("QLinearConv", "ConvInteger", "QLinearConv16"),
        "ConvTranspose": ("QLinearConv",),
        "MatMul": (
            "QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "QLinearMatMul16", "QLinearMatMulAdd",
            "MatMulW4A8",
        ),
        "Gemm": ("QGemm", "QLinearMatMul16"),
        "Add": ("QLinearAdd", "QLinearAdd16", "QLinearAffine16"),
        "Mul": ("QLinearMul", "QLinearMul16", "QLinearAffine16"),
        "Concat": ("QLinearConcat",),
        "AveragePool": ("QLinearAveragePool",),
        "GlobalAveragePool": ("QLinearGlobalAveragePool",),
        "Sigmoid": ("QLinearSigmoid",),
        "LeakyRelu": ("QLinearLeakyRelu",),
        "Softmax": ("QLinearSoftmax",),
        "LSTM": ("DynamicQuantizeLSTM",),
        "GRU": ("DynamicQuantizeGRU",),
        **{op: ("QLinearLookup",) for op in _TABLED},
        "HardSigmoid": ("QLinearLookup", "QLinearAffine16"),
    },
    "quanta.passes.coverage.INTEGER_OPS": {
        "QLinearConv", "ConvInteger", "QLinearMatMul", "MatMulInteger", "MatMulIntegerToFloat",
        "DynamicQuantizeMatMul", "QGemm", "QLinearAdd", "QLinearMul", "QLinearConcat", "QLinearAveragePool",
        "QLinearGlobalAveragePool", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax",
        "DynamicQuantizeLSTM", "DynamicQuantizeGRU", "QAttention", "QLinearLookup", "QLinearConv16", "QLinearMatMul16", "QLinearMatMulAdd", "MatMulW4A8",
        "MatMulMX", "ConvMX", "IntConv", "IntMatMul", "IntRescale", "IntAdd", "IntMul", "IntLookup", "IntSoftmax",
        "IntLayerNorm", "IntGelu", "IntGlobalAveragePool", "QLinearAffine16", "QLinearAdd16", "QLinearMul16", "MlasQLinearConv",
    },
    "quanta.passes.coverage.MAC_KIND": {
        "Conv": MacKind.CONV, "QLinearConv": MacKind.CONV, "ConvInteger": MacKind.CONV,
        "ConvTranspose": MacKind.CONV_TRANSPOSE,
        "MatMul": MacKind.MATMUL, "QLinearMatMul": MacKind.MATMUL, "MatMulInteger": MacKind.MATMUL,
        "MatMulIntegerToFloat": MacKind.MATMUL, "DynamicQuantizeMatMul": MacKind.MATMUL,
        "Gemm": MacKind.GEMM, "QGemm": MacKind.GEMM,
        "LSTM": MacKind.RECURRENT, "GRU": MacKind.RECURRENT, "RNN": MacKind.RECURRENT,
        "Einsum": MacKind.EINSUM,
        "DynamicQuantizeLSTM": MacKind.RECURRENT, "DynamicQuantizeGRU": MacKind.RECURRENT,
        "OrtLSTM": MacKind.RECURRENT,
        "OrtGRU": MacKind.RECURRENT,
        "MlasMatMul": MacKind.MATMUL,
        "QLinearConv16": MacKind.CONV, "MlasQLinearConv": MacKind.CONV, "QLinearMatMul16": MacKind.MATMUL, "QLinearMatMulAdd": MacKind.MATMUL, "MatMulBf16": MacKind.MATMUL,
        "MatMulW8": MacKind.MATMUL,
        "MatMulBias": MacKind.MATMUL,
        "IntConv": MacKind.CONV, "IntMatMul": MacKind.MATMUL, "MatMulMX": MacKind.MATMUL,
        "ConvMX": MacKind.CONV,
    },
    "quanta.passes.coverage._CONV_WEIGHT": {"Conv": 1, "ConvInteger": 1, "QLinearConv": 3, "QLinearConv16": 3, "MlasQLinearConv": 3, "IntConv": 1, "ConvMX": 1},
    "quanta.passes.coverage.LOWER_RULE_OF": {
        "Conv": "LowerConv", "MatMul": "LowerMatMul", "Gemm": "LowerGemm", "Add": "LowerBinary",
        "Mul": "LowerBinary", "Concat": "LowerConcat", "AveragePool": "LowerPool",
        "GlobalAveragePool": "LowerPool", "Sigmoid": "LowerUnary", "LeakyRelu": "LowerUnary",
        "Softmax": "LowerSoftmax",
        **dict.fromkeys(_TABLED, "LowerLookup"),
    },
    "quanta.passes.coverage._NOT_ISLANDS": {
        "QuantizeLinear", "DequantizeLinear", "Reshape", "Transpose", "TransposeView", "Flatten", "Squeeze", "Unsqueeze",
        "Slice", "Gather", "Split", "Concat", "MaxPool", "Identity", "Shape", "Constant", "Cast",
        "DynamicQuantizeLinear", "AccumulatorToFloat", "AccumulatorToQuant", "SoftmaxQuant", "MulQuant", "QuantizeMX",
        "ReorderNchwc", "ReorderNchw", "RelabelCodes",
    },
    "quanta.passes.rules.fuse_activation.FUSABLE_PRODUCERS": {
        "Conv": "integer conv kernels clamp while requantizing",
        "Gemm": "integer GEMM kernels clamp while requantizing",
        "MatMul": "integer GEMM kernels clamp while requantizing",
        "Add": "the integer add kernel clamps while requantizing",
    },
    "quanta.quantize.qdq.VIEW_OPS": {
        "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Slice", "Split", "Gather", "MaxPool", "Pad",
    },
    "quanta.quantize.qdq.ABSORBING_ACTIVATIONS": {"Relu", "Clip"},
    "quanta.quantize.qdq.OUTPUT_ONLY_OPS": {"Relu", "Clip", "Softmax"},
    "quanta.quantize.qdq.UNARY_QUANT_OPS": {
        "AveragePool", "GlobalAveragePool", "Resize", "Sigmoid", "HardSwish", "LeakyRelu", *_TABLED,
    },
    "quanta.quantize.qdq.NARY_QUANT_OPS": {"Add", "Mul", "Concat"},
    "quanta.quantize.qdq.MAC_OPS": {"Conv", "ConvTranspose", "Gemm", "MatMul"},
    "quanta.runtime.memory.VIEW_OPS": _ALIAS | {"Split"},
    "quanta.runtime.static_steps.QUANTA_SHAPE_ONLY_OPS": {
        "AccumulatorToFloat", "AccumulatorToQuant", "SoftmaxQuant", "MulQuant", "Conv", "ConvMX", "LayerNormDiv", "MatMulBf16", "MatMulMX",
        "MatMulW4A8", "MatMulW8", "MatMulBias", "MlasLogistic", "MlasTanh", "QLinearConv16", "QLinearLookup", "QLinearMatMul16", "QLinearMatMulAdd", "TransposeView",
        "RMSNormDiv", "MlasGeluTanh", "OrtReduceMean", "OrtReduceSum", "MlasGlobalAveragePool", "MlasQLinearConv",
        "MlasSoftmax", "OrtLayerNorm", "OrtFastGelu", "MlasMatMul", "MlasAveragePool", "OrtResizeLinear",
        "ConvNchwc", "MaxPoolNchwc", "GlobalAveragePoolNchwc", "ReorderNchwc", "ReorderNchw",
        "QLinearAffine16", "QLinearAdd16", "QLinearMul16", "RelabelCodes",
    },
    "quanta.runtime.static_steps.SHAPE_ONLY_OPS": {
        "Abs", "Acos", "Add", "And", "Asin", "Atan", "BatchNormalization", "BitShift", "Cast", "CastLike",
        "Ceil", "Celu", "Clip", "Cos", "Cosh", "Div", "Elu", "Equal", "Erf", "Exp", "Floor", "Gelu",
        "Greater", "GreaterOrEqual", "HardSigmoid", "HardSwish", "Identity", "InstanceNormalization",
        "IsInf", "IsNaN", "LayerNormalization", "LeakyRelu", "Less", "LessOrEqual", "Log", "LogSoftmax",
        "Max", "Mean", "Min", "Mish", "Mod", "Mul", "Neg", "Not", "Or", "Pow", "PRelu", "Reciprocal",
        "Relu", "Round", "Selu", "Shrink", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus",
        "Softsign", "Sqrt", "Sub", "Sum", "Tan", "Tanh", "ThresholdedRelu", "Where", "Xor",
        "GroupNormalization", "LpNormalization", "Hardmax", "CumSum", "Trilu",
        "QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear",
        "MatMul", "MatMulInteger", "QLinearMatMul", "Gemm", "Einsum", "Conv", "ConvInteger",
        "QLinearConv", "ConvTranspose", "MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
        "LpPool",
        "Transpose", "TransposeView", "RelabelCodes", "Flatten", "Concat", "Gather", "GatherElements", "GatherND",
        "ScatterElements",
        "ScatterND", "DepthToSpace", "SpaceToDepth", "ArgMax", "ArgMin", "Shape", "Size",
        "QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QLinearLookup",
        "QLinearConcat", "QLinearAveragePool", "QLinearGlobalAveragePool", "QGemm",
        "MatMulIntegerToFloat", "DynamicQuantizeMatMul", "NhwcMaxPool", "FastGelu", "AccumulatorToFloat",
        "AccumulatorToQuant", "SoftmaxQuant", "MulQuant", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
        "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "MlasLogistic", "MlasTanh", "LayerNormDiv", "RMSNormDiv",
        "MlasGeluTanh", "OrtReduceMean", "OrtReduceSum", "MlasGlobalAveragePool", "MlasQLinearConv",
        "MlasSoftmax", "OrtLayerNorm", "OrtFastGelu", "MlasMatMul", "MlasAveragePool", "OrtResizeLinear",
        "QLinearConv16", "QLinearMatMul16", "QLinearMatMulAdd", "MatMulW4A8", "MatMulBf16", "MatMulMX", "ConvMX", "MatMulW8", "MatMulBias",
        "ConvNchwc", "MaxPoolNchwc", "GlobalAveragePoolNchwc", "ReorderNchwc", "ReorderNchw",
        "QLinearAffine16", "QLinearAdd16", "QLinearMul16",
    },
    "quanta.targets.native.BLAS_OPS": {
        "Conv", "ConvTranspose", "MatMul", "Gemm", "Einsum", "RNN", "Attention", "ConvNchwc",
    },
    "quanta.targets.native.views.ALIAS_OPS": _ALIAS,
    "quanta.targets.native.views.ALIAS_KEYS": {
        ("", "Reshape"), ("", "Flatten"), ("", "Squeeze"), ("", "Unsqueeze"), ("", "Identity"),
        ("quanta", "TransposeView"), ("quanta", "RelabelCodes"),
    },
    "quanta.passes.rules._util.NONDETERMINISTIC_OPS": _RANDOM,
    "quanta.runtime.static_steps.NONDETERMINISTIC": _RANDOM,
}  # fmt: skip


def _normal(derived):
    """A derived set or mapping in a comparable form (a dict of sets for STAGE_QUANT_OPS)."""
    if isinstance(derived, dict):
        return {k: set(v) if isinstance(v, frozenset) else v for k, v in derived.items()}
    return set(derived)


def _ops(derived) -> set[str]:
    """The op types a derived set names (a stage map: those of every stage)."""
    if isinstance(derived, dict) and all(isinstance(k, Stage) for k in derived):
        return set().union(*derived.values())
    return {d[1] if isinstance(d, tuple) else d for d in derived}  # (domain, op type) keys


def test_op_facts_every_call_site_registers_its_derivation():
    assert set(DERIVED) == set(PINNED)


@pytest.mark.parametrize("name", sorted(PINNED))
def test_op_facts_derived_sets_equal_the_pinned_contents(name):
    assert _normal(DERIVED[name](FACTS)) == PINNED[name]


@pytest.mark.parametrize("name", sorted(PINNED))
def test_op_facts_module_constant_is_the_derivation(name):
    module, attr = name.rsplit(".", 1)
    assert _normal(getattr(importlib.import_module(module), attr)) == _normal(DERIVED[name](FACTS))


@pytest.mark.parametrize("name", sorted(PINNED))
def test_op_facts_every_derived_op_has_a_row(name):
    rows = {r.op_type for r in FACTS}
    assert _ops(DERIVED[name](FACTS)) <= rows


def test_op_facts_integer_forms_are_integer_ops_with_rows():
    for row in FACTS:
        for op in row.integer:
            form = FACTS.get(op) or FACTS.get(op, MS) or FACTS.get(op, "quanta")
            assert form is not None and form.integer_op, f"{row.op_type} -> {op}: no integer_op row"


def test_op_facts_aliases_are_views():
    # a buffer alias is a reshape of its input: it keeps the input's type, but for
    # RelabelCodes, whose point is the same codes under another (scale, zero point)
    assert FACTS.ops_where(alias=True) - FACTS.ops_where(view=True) == {"RelabelCodes"}


def test_op_facts_quantizer_views_are_type_keeping_views_or_pad():
    # Pad keeps the type only with a constant pad value (qdq._pad_reason decides per node),
    # so the verifier does not treat it as a view
    assert FACTS.ops_where(qdq=QdqRole.VIEW) - FACTS.ops_where(view=True) == {"Pad"}


def test_op_facts_operands_follow_the_quantizer_role():
    for row in FACTS:
        if row.qdq is QdqRole.MAC:
            assert row.activations == (0,) and row.weights == (1,), row.op_type
        elif row.qdq is QdqRole.NARY:
            assert row.activations == ALL, row.op_type
        elif row.qdq in (QdqRole.UNARY, QdqRole.VIEW):
            assert row.activations == (0,), row.op_type
        elif row.qdq is None and not row.integer_op:
            assert row.activations == () and row.weights == () and row.bias == (), row.op_type


def test_op_facts_only_quantization_ops_are_stage_restricted():
    for row in FACTS:
        if not row.quant:
            assert row.stages == frozenset(Stage), row.op_type
        assert Stage.FLOAT not in row.stages or not row.quant, row.op_type


def test_op_facts_two_rows_for_one_key_are_refused():
    with pytest.raises(ValueError, match=r"two rows for ai\.onnx::Conv"):
        FACTS.with_rows(Op("Conv"))


def test_op_facts_unknown_column_is_refused():
    with pytest.raises(KeyError, match="no column 'views'"):
        FACTS.ops_where(views=True)


@pytest.fixture
def extended():
    """The table with new operators, one per quantizer role, every other column set."""
    common = dict(
        view=True,
        alias=True,
        shape_only=True,
        quant=True,
        stages=op_facts.ALL_STAGES,
        compute=True,
        macs=MacKind.CONV,
        weights=(1,),
        integer=("QLinearNewOp",),
        lower_rule="LowerNewOp",
        fuse_clamp="its integer kernel clamps while requantizing",
        blas=True,
        island=False,
        random=True,
    )
    rows = [Op(f"NewOp{role.name.title()}", qdq=role, **common) for role in QdqRole]
    rows.append(Op("NewOpQuanta", op_facts.QUANTA, **common))  # a quanta-domain operator
    return FACTS.with_rows(*rows, Op("QLinearNewOp", MS, integer_op=True)), {r.op_type for r in rows}


def test_op_facts_a_new_row_reaches_every_derived_set(extended):
    table, new = extended
    for name, fn in DERIVED.items():
        before, after = _ops(fn(FACTS)), _ops(fn(table))
        assert after > before and after - before <= new | {"QLinearNewOp"}, name
