"""Op facts: one row per operator, the single place that says what quanta knows about it.

Every pass, planner and report that needs "which ops are views", "which ops compute",
"what does Conv become after lowering" reads it here, as a set derived from the table
(``VIEW_OPS = derive("quanta.runtime.memory.VIEW_OPS", lambda t: t.ops_where(alias=True))``).
Adding an operator is adding a row; ``docs/design.md`` "op facts" lists the columns.

Rows are keyed by ``(domain, op_type)``; the derived sets hold op types, as the call
sites compare ``node.op_type`` (a site that also needs the domain checks it itself, as
onnx_io's view propagation does). Each derivation is recorded in :data:`DERIVED` under
the name of the constant it defines, so a test can re-derive every set from an extended
table (tests/ir/test_op_facts.py).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, replace
from typing import Any, TypeVar

__all__ = [
    "ALL",
    "DERIVED",
    "FACTS",
    "MacKind",
    "Op",
    "OpTable",
    "QdqRole",
    "Stage",
    "derive",
]

MS = "com.microsoft"
QUANTA = "quanta"
INT_ONLY = "quanta.int"  # the integer-only stage's operators


class Stage(enum.Enum):
    """The verifier's stages (quanta.ir.op_rules)."""

    FLOAT = "float"
    QDQ = "qdq"
    LOWERED = "lowered"


class QdqRole(enum.Enum):
    """How quanta.quantize.qdq plans a node of the op."""

    MAC = "mac"  # always kept: activation, weight (per channel) and int32 bias quantized
    NARY = "nary"  # every input is an activation (Add, Mul, Concat)
    UNARY = "unary"  # input 0 is an activation
    VIEW = "view"  # quantized with its input, no range of its own (and Pad, which is neutral)
    ABSORB = "absorb"  # output only, and absorbs its producer's range (Relu, Clip)
    OUTPUT = "output"  # output only, its input stays float (Softmax)


class MacKind(enum.Enum):
    """Which formula quanta.passes.coverage.macs counts the op's multiply-accumulates with."""

    CONV = "conv"  # out elements x prod(W.shape[1:])
    CONV_TRANSPOSE = "conv_transpose"  # in elements x prod(W.shape[1:])
    MATMUL = "matmul"  # out elements x K (last axis of A)
    GEMM = "gemm"  # as MATMUL, K from axis 0 of A when transA
    RECURRENT = "recurrent"  # seq x batch x (prod(W.shape) + prod(R.shape))
    EINSUM = "einsum"  # the product of the sizes of the equation's labels (every term once)


#: every input of the node is an activation operand
ALL = "all"
ALL_STAGES = frozenset(Stage)
QDQ_AND_LOWERED = frozenset({Stage.QDQ, Stage.LOWERED})
LOWERED_ONLY = frozenset({Stage.LOWERED})


@dataclass(frozen=True)
class Op:
    """The facts of one operator; every column but the key has a "nothing special" default."""

    op_type: str
    domain: str = ""
    #: keeps its (data) input's element type, quantized or not (verifier, onnx_io)
    view: bool = False
    #: its output is its first input's memory reshaped: no buffer of its own (memory planner)
    alias: bool = False
    #: its outputs are parts of its first input's memory (Split: views where a part is
    #: contiguous, copies elsewhere): no buffers of their own, and the input's buffer
    #: lives while any part is read (memory planner)
    alias_parts: bool = False
    #: output shape follows from the input shapes and attributes alone (static_steps)
    shape_only: bool = False
    #: how the QDQ quantizer plans it; None: the quantizer leaves it float
    qdq: QdqRole | None = None
    #: quantized operands by input index: activations (or ALL), weights, bias
    activations: tuple[int, ...] | str = ()
    weights: tuple[int, ...] = ()
    bias: tuple[int, ...] = ()
    #: a quantization operator (exists only in quantized graphs)
    quant: bool = False
    #: the verifier stages that admit it (only quantization operators are restricted)
    stages: frozenset[Stage] = ALL_STAGES
    #: a compute node the coverage report accounts for (lowered or left float)
    compute: bool = False
    #: its MAC formula; None: no MACs counted (elementwise, data movement)
    macs: MacKind | None = None
    #: the integer operators lowering (or ORT's quantizers) turn it into
    integer: tuple[str, ...] = ()
    #: an integer operator: counts as integer compute wherever it appears
    integer_op: bool = False
    #: the lowering rule whose refusals explain a float instance (coverage report)
    lower_rule: str | None = None
    #: why an integer form of it takes a fused output clamp (FuseActivationIntoProducer)
    fuse_clamp: str | None = None
    #: its reference twin runs on BLAS, which starts threads of its own (native target)
    blas: bool = False
    #: a float instance left after lowering counts as a float island (False: Q/DQ, data
    #: movement and shape plumbing, which the coverage report does not list)
    island: bool = True
    #: its values may not be a function of its inputs: a random draw, or Dropout, whose
    #: training_mode may be set at run time (never merged, moved out of a loop or computed
    #: once as a static value: eliminate_common, the loop passes, static_steps)
    random: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.domain, self.op_type)


COLUMNS = tuple(f.name for f in fields(Op))


class OpTable:
    """The rows, keyed by ``(domain, op_type)``."""

    def __init__(self, rows: Iterable[Op]):
        self.rows: dict[tuple[str, str], Op] = {}
        for row in rows:
            if row.key in self.rows:
                raise ValueError(f"op facts: two rows for {row.domain or 'ai.onnx'}::{row.op_type}")
            self.rows[row.key] = row

    def __iter__(self):
        return iter(self.rows.values())

    def __len__(self) -> int:
        return len(self.rows)

    def get(self, op_type: str, domain: str = "") -> Op | None:
        return self.rows.get((domain, op_type))

    def where(self, **columns: Any) -> list[Op]:
        """The rows whose columns equal the given values."""
        for name in columns:
            if name not in COLUMNS:
                raise KeyError(f"op facts have no column {name!r} (columns: {', '.join(COLUMNS)})")
        return [r for r in self if all(getattr(r, k) == v for k, v in columns.items())]

    def ops_where(self, **columns: Any) -> frozenset[str]:
        """The op types of the rows whose columns equal the given values."""
        return frozenset(r.op_type for r in self.where(**columns))

    def column(self, column: str) -> dict[str, Any]:
        """op type -> ``column``, for the rows where it is set."""
        return {r.op_type: getattr(r, column) for r in self if getattr(r, column) not in (None, (), False)}

    def with_rows(self, *rows: Op) -> OpTable:
        """This table and ``rows`` (for tests that add an operator)."""
        return OpTable([*self, *rows])


def _unary(op_type: str, integer: str, lower_rule: str) -> Op:
    """A float op of one quantized activation that ``lower_rule`` lowers to ``integer``."""
    return Op(
        op_type,
        shape_only=True,
        qdq=QdqRole.UNARY,
        activations=(0,),
        compute=True,
        integer=(integer,),
        lower_rule=lower_rule,
    )


def _lookup(op_type: str) -> Op:
    """A float unary whose quantized form is a 256-entry table (QLinearLookup, LowerLookup)."""
    return _unary(op_type, "QLinearLookup", "LowerLookup")


def _integer_op(op_type: str, domain: str = "", **facts: Any) -> Op:
    """An operator of the lowered integer graph (the lowering rules emit it)."""
    return Op(op_type, domain, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True, **facts)


FACTS = OpTable(
    [
        Op("Abs", shape_only=True),
        Op("Acos", shape_only=True),
        Op(
            "Add",
            shape_only=True,
            qdq=QdqRole.NARY,
            activations=ALL,
            compute=True,
            integer=("QLinearAdd", "QLinearAdd16", "QLinearAffine16"),
            lower_rule="LowerBinary",
            fuse_clamp="the integer add kernel clamps while requantizing",
        ),
        Op("And", shape_only=True),
        Op("ArgMax", shape_only=True),
        Op("ArgMin", shape_only=True),
        Op("Asin", shape_only=True),
        Op("Atan", shape_only=True),
        Op("Attention", blas=True),
        _unary("AveragePool", "QLinearAveragePool", "LowerPool"),
        Op("BatchNormalization", shape_only=True),
        Op("BitShift", shape_only=True),
        Op("Cast", shape_only=True, island=False),
        Op("CastLike", shape_only=True),
        Op("Ceil", shape_only=True),
        _lookup("Celu"),
        Op("Clip", shape_only=True, qdq=QdqRole.ABSORB),
        Op(
            "Concat",
            shape_only=True,
            qdq=QdqRole.NARY,
            activations=ALL,
            compute=True,
            integer=("QLinearConcat",),
            lower_rule="LowerConcat",
            island=False,
        ),
        Op("Constant", island=False),
        Op(
            "Conv",
            shape_only=True,
            qdq=QdqRole.MAC,
            activations=(0,),
            weights=(1,),
            bias=(2,),
            compute=True,
            macs=MacKind.CONV,
            integer=("QLinearConv", "ConvInteger", "QLinearConv16"),
            lower_rule="LowerConv",
            fuse_clamp="integer conv kernels clamp while requantizing",
            blas=True,
        ),
        # Conv with an output clamp (FuseActivationIntoProducer; optimize_float fuses the
        # Relu / Clip after a float Conv into it, the float GEMM family's epilogue clamps)
        # or a gated activation (FuseFloatGate: SiLU, hardswish, HardSigmoid, LeakyRelu per tile)
        Op("Conv", QUANTA, shape_only=True, compute=True, blas=True),
        # the blocked float layout NCHW16c (passes/lower/nchwc.py, reference/nchwc.py):
        # a float Conv (with its fused activation) and a MaxPool on 5-D [N, Cb, H, W, 16]
        # tensors, and the moves into and out of the layout at a region's edges
        Op("ConvNchwc", QUANTA, shape_only=True, compute=True, blas=True),
        Op("MaxPoolNchwc", QUANTA, shape_only=True),
        Op("GlobalAveragePoolNchwc", QUANTA, shape_only=True),
        Op("ReorderNchwc", QUANTA, shape_only=True, island=False),
        Op("ReorderNchw", QUANTA, shape_only=True, island=False),
        # the elementwise half of an exported LSTM cell (optimize_float's FuseLSTMGates)
        Op("LSTMGates", QUANTA),
        # the elementwise half of an exported GRU cell (optimize_float's FuseGRUGates)
        Op("GRUGates", QUANTA),
        Op(
            "ConvInteger",
            shape_only=True,
            weights=(1,),
            quant=True,
            stages=LOWERED_ONLY,
            macs=MacKind.CONV,
            integer_op=True,
        ),
        Op(
            "ConvTranspose",
            shape_only=True,
            qdq=QdqRole.MAC,
            activations=(0,),
            weights=(1,),
            bias=(2,),
            compute=True,
            macs=MacKind.CONV_TRANSPOSE,
            blas=True,
            # a quantized file's strided one lowers as a QLinearConv over its output
            # phases (rules/conv_transpose_as_conv.py QdqConvTransposeAsConv)
            integer=("QLinearConv",),
        ),
        Op("Cos", shape_only=True),
        Op("Cosh", shape_only=True),
        Op("CumSum", shape_only=True),
        Op("DepthToSpace", view=True, shape_only=True),
        Op("DequantizeLinear", shape_only=True, quant=True, stages=QDQ_AND_LOWERED, island=False),
        # the float output stage of LowerConvFloatOutput's ConvInteger (reference/accumulator.py)
        Op("AccumulatorToFloat", QUANTA, shape_only=True, quant=True, stages=LOWERED_ONLY, island=False),
        # the same stage, a float gate and QuantizeLinear as one node (lower/accumulator_to_quant.py)
        Op("AccumulatorToQuant", QUANTA, shape_only=True, quant=True, stages=LOWERED_ONLY, island=False),
        # Mul, Add of a mask, Softmax and QuantizeLinear as one node (lower/accumulator_to_quant.py)
        Op("SoftmaxQuant", QUANTA, shape_only=True, quant=True, stages=LOWERED_ONLY, island=False),
        # Mul by a per-column constant and QuantizeLinear as one node (lower/mul_quant.py)
        Op("MulQuant", QUANTA, shape_only=True, quant=True, stages=LOWERED_ONLY, island=False),
        Op("Div", shape_only=True),
        Op("DynamicQuantizeLinear", shape_only=True, quant=True, stages=LOWERED_ONLY, island=False),
        Op("DynamicQuantizeLSTM", MS, macs=MacKind.RECURRENT, integer_op=True),
        Op("DynamicQuantizeGRU", QUANTA, macs=MacKind.RECURRENT, integer_op=True),
        Op("DynamicQuantizeMatMul", MS, shape_only=True, macs=MacKind.MATMUL, integer_op=True),
        Op("Einsum", shape_only=True, compute=True, macs=MacKind.EINSUM, blas=True),
        _lookup("Elu"),
        # random draws (and Dropout): see the random column
        Op("Bernoulli", random=True),
        Op("Dropout", random=True),
        Op("Multinomial", random=True),
        Op("RandomNormal", random=True),
        Op("RandomNormalLike", random=True),
        Op("RandomUniform", random=True),
        Op("RandomUniformLike", random=True),
        Op("Equal", shape_only=True),
        _lookup("Erf"),
        _lookup("Exp"),
        Op("Expand", view=True),
        Op("FastGelu", MS, shape_only=True),
        Op(
            "Flatten",
            view=True,
            alias=True,
            shape_only=True,
            qdq=QdqRole.VIEW,
            activations=(0,),
            island=False,
        ),
        Op("Floor", shape_only=True),
        Op("Gather", view=True, shape_only=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        Op("GatherElements", shape_only=True),
        Op("GatherND", shape_only=True),
        _lookup("Gelu"),
        Op(
            "Gemm",
            shape_only=True,
            qdq=QdqRole.MAC,
            activations=(0,),
            weights=(1,),
            bias=(2,),
            compute=True,
            macs=MacKind.GEMM,
            integer=("QGemm", "QLinearMatMul16"),
            lower_rule="LowerGemm",
            fuse_clamp="integer GEMM kernels clamp while requantizing",
            blas=True,
        ),
        _unary("GlobalAveragePool", "QLinearGlobalAveragePool", "LowerPool"),
        Op("GlobalMaxPool", shape_only=True),
        Op("Greater", shape_only=True),
        Op("GreaterOrEqual", shape_only=True),
        Op("GroupNormalization", shape_only=True),
        Op("GRU", compute=True, macs=MacKind.RECURRENT, integer=("DynamicQuantizeGRU",)),
        Op("Hardmax", shape_only=True),
        # 16-bit codes: an affine map with a clip (passes/lower/wide.py LowerAffine16)
        replace(_lookup("HardSigmoid"), integer=("QLinearLookup", "QLinearAffine16")),
        _lookup("HardSwish"),
        Op("Identity", view=True, alias=True, shape_only=True, island=False),
        Op("InstanceNormalization", shape_only=True),
        Op("IsInf", shape_only=True),
        Op("IsNaN", shape_only=True),
        Op("LayerNormalization", shape_only=True),
        # a written-out LayerNorm that divides by the standard deviation (FuseLayerNorm)
        Op("LayerNormDiv", QUANTA, shape_only=True),
        # a written-out RMS norm (T5's), no mean subtracted (FuseRMSNorm)
        Op("RMSNormDiv", QUANTA, shape_only=True),
        _unary("LeakyRelu", "QLinearLeakyRelu", "LowerUnary"),
        Op("Less", shape_only=True),
        Op("LessOrEqual", shape_only=True),
        Op("Log", shape_only=True),
        Op("LogSoftmax", shape_only=True),
        Op("LpNormalization", shape_only=True),
        Op("LpPool", shape_only=True),
        Op("LSTM", compute=True, macs=MacKind.RECURRENT, integer=("DynamicQuantizeLSTM",)),
        Op(
            "MatMul",
            shape_only=True,
            qdq=QdqRole.MAC,
            activations=(0,),
            weights=(1,),
            compute=True,
            macs=MacKind.MATMUL,
            integer=(
                "QLinearMatMul",
                "MatMulInteger",
                "MatMulIntegerToFloat",
                "DynamicQuantizeMatMul",
                "QLinearMatMul16",
                "QLinearMatMulAdd",
                "MatMulW4A8",
            ),
            lower_rule="LowerMatMul",
            fuse_clamp="integer GEMM kernels clamp while requantizing",
            blas=True,
        ),
        _integer_op("MatMulInteger", macs=MacKind.MATMUL),
        Op("MatMulIntegerToFloat", MS, shape_only=True, macs=MacKind.MATMUL, integer_op=True),
        Op("MatMulNBits", MS),  # 4-bit weights per block, float A (reference/w4.py)
        Op("Max", shape_only=True),
        Op("MaxPool", view=True, shape_only=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        Op("Mean", shape_only=True),
        Op("Min", shape_only=True),
        _lookup("Mish"),
        # ONNX Runtime's Sigmoid and Tanh (passes/rules/ort_float_functions.py, reference/ort_float.py)
        Op("MlasLogistic", QUANTA, shape_only=True),
        Op("MlasTanh", QUANTA, shape_only=True),
        # a written-out tanh GELU around ORT's Tanh (FuseGeluTanh)
        Op("MlasGeluTanh", QUANTA, shape_only=True),
        # ONNX Runtime's float LSTM (the same rule file; reference/ort_float.py)
        Op("OrtLSTM", QUANTA, compute=True, macs=MacKind.RECURRENT),
        Op("OrtGRU", QUANTA, compute=True, macs=MacKind.RECURRENT),
        # ONNX Runtime's float Conv in MLAS's order (the same rule file; reference/mlas_conv.py)
        Op("MlasConv", QUANTA, compute=True),
        # ONNX Runtime's float MatMul / FusedMatMul in MLAS's order (reference/mlas_matmul.py)
        Op("MlasMatMul", QUANTA, shape_only=True, compute=True, macs=MacKind.MATMUL),
        # ONNX Runtime's QLinearConv as its u8·s8 kernels without VNNI compute it (the same
        # rule file): written before lowering, so it reads and writes codes in the qdq stage too
        Op(
            "MlasQLinearConv",
            QUANTA,
            shape_only=True,
            weights=(3,),
            quant=True,
            stages=QDQ_AND_LOWERED,
            macs=MacKind.CONV,
            integer_op=True,
        ),
        # ONNX Runtime's ReduceMean / ReduceSum order over the trailing axes (the same rule file)
        Op("OrtReduceMean", QUANTA, shape_only=True),
        Op("OrtReduceSum", QUANTA, shape_only=True),
        # ONNX Runtime's float GlobalAveragePool in MlasPool's order (the same rule file)
        Op("MlasGlobalAveragePool", QUANTA, shape_only=True),
        # ONNX Runtime's float AveragePool in MlasPool's order (reference/mlas_pool.py)
        Op("MlasAveragePool", QUANTA, shape_only=True),
        # ONNX Runtime's float bilinear Resize (reference/ort_resize.py)
        Op("OrtResizeLinear", QUANTA, shape_only=True),
        # ONNX Runtime's Softmax, LayerNorm family and FastGelu kernels (the same rule file)
        Op("MlasSoftmax", QUANTA, shape_only=True),
        Op("OrtLayerNorm", QUANTA, shape_only=True),
        Op("OrtFastGelu", QUANTA, shape_only=True),
        Op("Mod", shape_only=True),
        Op(
            "Mul",
            shape_only=True,
            qdq=QdqRole.NARY,
            activations=ALL,
            compute=True,
            integer=("QLinearMul", "QLinearMul16", "QLinearAffine16"),
            lower_rule="LowerBinary",
        ),
        Op("Neg", shape_only=True),
        Op("NhwcMaxPool", MS, view=True, shape_only=True),
        Op("Not", shape_only=True),
        Op("Or", shape_only=True),
        Op("Pad", qdq=QdqRole.VIEW, activations=(0,)),
        Op("Pow", shape_only=True),
        Op("PRelu", shape_only=True),
        Op("QAttention", MS, integer_op=True),
        # ORT's fused QDQ Gemm / MatMul groups are written before lowering where ORT's u8·s8
        # kernels saturate (QdqGemmToSaturatingQGemm, QdqMatMulToSaturatingQLinearMatMul in
        # passes/rules/ort_float_functions.py), so both read and write codes in the qdq stage too
        Op(
            "QGemm",
            MS,
            shape_only=True,
            macs=MacKind.GEMM,
            quant=True,
            stages=QDQ_AND_LOWERED,
            integer_op=True,
        ),
        Op("QLinearAdd", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op("QLinearAveragePool", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op("QLinearConcat", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op(
            "QLinearConv",
            shape_only=True,
            weights=(3,),
            quant=True,
            stages=LOWERED_ONLY,
            macs=MacKind.CONV,
            integer_op=True,
        ),
        Op("QLinearGlobalAveragePool", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op("QLinearLeakyRelu", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op(
            "QLinearMatMul",
            shape_only=True,
            quant=True,
            stages=QDQ_AND_LOWERED,
            integer_op=True,
            macs=MacKind.MATMUL,
        ),
        # QLinearMatMul and the QLinearAdd of a constant after it (lower/qlinear_matmul_add.py)
        _integer_op("QLinearMatMulAdd", QUANTA, macs=MacKind.MATMUL),
        Op("QLinearLookup", QUANTA, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        # a table that maps every code to itself under new (scale, zero point): the same
        # bytes relabelled, an alias of its input (lower/relabel_codes.py)
        Op(
            "RelabelCodes", QUANTA, alias=True, shape_only=True, quant=True, stages=LOWERED_ONLY, island=False
        ),
        Op(
            "QLinearConv16",
            QUANTA,
            shape_only=True,
            weights=(3,),
            quant=True,
            stages=LOWERED_ONLY,
            macs=MacKind.CONV,
            integer_op=True,
        ),
        Op("MatMulBf16", QUANTA, shape_only=True, macs=MacKind.MATMUL),  # a bf16 float island
        # a float MatMul of an 8-bit weight (reference/w8.py; passes/lower/weight_only_matmul.py)
        Op("MatMulW8", QUANTA, shape_only=True, macs=MacKind.MATMUL),
        # a float MatMul and the constant bias Add after it (passes/rules/fuse_matmul_bias.py)
        Op("MatMulBias", QUANTA, shape_only=True, macs=MacKind.MATMUL),
        Op("MatMulW4A8", QUANTA, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        _integer_op("QLinearMatMul16", QUANTA, macs=MacKind.MATMUL),
        # elementwise groups on 16-bit codes (reference/requant16.py; passes/lower/wide.py)
        _integer_op("QLinearAffine16", QUANTA),
        _integer_op("QLinearAdd16", QUANTA),
        _integer_op("QLinearMul16", QUANTA),
        # run-time MX quantization of an activation (quanta.kernels.reference.mx)
        Op("QuantizeMX", QUANTA, quant=True, stages=QDQ_AND_LOWERED, island=False),
        # MX activations times MX weights, float32 out (passes/lower/mx.py)
        Op(
            "ConvMX",
            QUANTA,
            shape_only=True,
            weights=(1,),
            quant=True,
            stages=LOWERED_ONLY,
            macs=MacKind.CONV,
            integer_op=True,
        ),
        _integer_op("MatMulMX", QUANTA, macs=MacKind.MATMUL),
        # the integer-only stage (passes/lower/integer_only.py; npu-sim's device operators,
        # targets/npu_sim/rules.OPS): integer compute wherever it appears
        Op("IntConv", INT_ONLY, weights=(1,), macs=MacKind.CONV, integer_op=True),
        Op("IntMatMul", INT_ONLY, macs=MacKind.MATMUL, integer_op=True),
        *(
            Op(op, INT_ONLY, integer_op=True)
            for op in (
                "IntRescale",
                "IntAdd",
                "IntMul",
                "IntLookup",
                "IntSoftmax",
                "IntLayerNorm",
                "IntGelu",
                "IntGlobalAveragePool",
            )
        ),
        Op("QLinearMul", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op("QLinearSigmoid", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op("QLinearSoftmax", MS, shape_only=True, quant=True, stages=LOWERED_ONLY, integer_op=True),
        Op("QuantizeLinear", shape_only=True, quant=True, stages=QDQ_AND_LOWERED, island=False),
        Op("Reciprocal", shape_only=True),
        Op("ReduceL1", shape_only=True),
        Op("ReduceL2", shape_only=True),
        Op("ReduceLogSum", shape_only=True),
        Op("ReduceLogSumExp", shape_only=True),
        Op("ReduceMax", shape_only=True),
        Op("ReduceMean", shape_only=True),
        Op("ReduceMin", shape_only=True),
        Op("ReduceProd", shape_only=True),
        Op("ReduceSum", shape_only=True),
        Op("ReduceSumSquare", shape_only=True),
        Op("Relu", shape_only=True, qdq=QdqRole.ABSORB),
        Op("Reshape", view=True, alias=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        Op("Resize", qdq=QdqRole.UNARY, activations=(0,)),
        Op("RNN", compute=True, macs=MacKind.RECURRENT, blas=True),
        Op("Round", shape_only=True),
        Op("ScatterElements", shape_only=True),
        Op("ScatterND", shape_only=True),
        _lookup("Selu"),
        Op("Shape", shape_only=True, island=False),
        Op("Shrink", shape_only=True),
        _unary("Sigmoid", "QLinearSigmoid", "LowerUnary"),
        Op("Sign", shape_only=True),
        Op("Sin", shape_only=True),
        Op("Sinh", shape_only=True),
        Op("Size", shape_only=True),
        Op("Slice", view=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        Op(
            "Softmax",
            shape_only=True,
            qdq=QdqRole.OUTPUT,
            compute=True,
            integer=("QLinearSoftmax",),
            lower_rule="LowerSoftmax",
        ),
        _lookup("Softplus"),
        _lookup("Softsign"),
        Op("SpaceToDepth", view=True, shape_only=True),
        Op("Split", view=True, alias_parts=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        Op("Sqrt", shape_only=True),
        Op("Squeeze", view=True, alias=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        Op("Sub", shape_only=True),
        Op("Sum", shape_only=True),
        Op("Tan", shape_only=True),
        _lookup("Tanh"),
        Op("ThresholdedRelu", shape_only=True),
        Op("Tile", view=True),
        Op("Transpose", view=True, shape_only=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        # a Transpose read by integer GEMMs only, as the strided view (lower/transpose_view.py)
        Op("TransposeView", QUANTA, view=True, alias=True, shape_only=True, island=False),
        Op("Trilu", shape_only=True),
        Op("Unsqueeze", view=True, alias=True, qdq=QdqRole.VIEW, activations=(0,), island=False),
        Op("Where", shape_only=True),
        Op("Xor", shape_only=True),
    ]
)

T = TypeVar("T")

#: every set derived from the table, by the name of the constant it defines
DERIVED: dict[str, Callable[[OpTable], Any]] = {}


def derive(name: str, fn: Callable[[OpTable], T]) -> T:
    """``fn(FACTS)``, recorded under ``name`` ("module.CONSTANT") so tests can re-derive it."""
    DERIVED[name] = fn
    return fn(FACTS)
