"""Named pipelines: plain lists of passes, in the order they run.

Run one with :class:`quanta.passes.manager.PassManager`::

    PassManager(simplify(opset=model.opset(), evaluator=ev), dump_after={"fold_batchnorm"}).run(model)

- :func:`prepare_for_quantization`: float rewrites before calibration (quantize_static);
- :func:`simplify`: the exact graph-level clean-up of a float or QDQ graph;
- :func:`lower_qdq`: what the runtime compiles a QDQ graph with (clean-up, then
  instruction selection into integer operators);
- :func:`optimize_float`: what the runtime compiles a float graph with (constants,
  no-ops, BatchNormalization folded into the producing Conv / ConvTranspose / Gemm);
- :func:`prepare_for_lowering`: ``simplify`` plus fused activations (``quanta`` domain).

``SIMPLIFY`` and ``PREPARE_FOR_LOWERING`` are ready-made lists for opset 21 without an
evaluator (constant folding then covers shape subgraphs only; see
:mod:`.rules.fold_constants`). Rule-based passes keep the refusals of their last run, so
call the functions for a fresh list when pipelines run concurrently.
"""

from __future__ import annotations

from quanta.passes.manager import Pass
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.align_scales import AlignScales
from quanta.passes.rules.canonicalize import Canonicalize, CastLikeToCast
from quanta.passes.rules.canonicalize_activations import CanonicalizeActivations
from quanta.passes.rules.canonicalize_einsum import CanonicalizeActivationEinsum, CanonicalizeEinsum
from quanta.passes.rules.collapse_views import CollapseViews
from quanta.passes.rules.conv_depth_one import ConvDepthOneAs2d
from quanta.passes.rules.conv_transpose_as_conv import (
    ConvTransposeAs2d,
    ConvTransposeAsConvs,
    ConvTransposeUnitStrides,
    QdqConvTransposesAsConvs,
)
from quanta.passes.rules.eliminate_common import EliminateCommon
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fold_batchnorm import FoldBatchNorm
from quanta.passes.rules.fold_constants import Evaluator, FoldConstants
from quanta.passes.rules.fold_groupnorm import FoldGroupNorm
from quanta.passes.rules.fold_pad import FoldPad
from quanta.passes.rules.fold_reshape_dims import FoldReshapeDims
from quanta.passes.rules.fold_static_dims import FoldStaticDims
from quanta.passes.rules.fold_zero_product import FoldZeroProduct
from quanta.passes.rules.fuse_activation import (
    DropImpliedActivation,
    FuseActivation,
    FuseFloatActivation,
    QuantizeBeforeActivationPass,
)
from quanta.passes.rules.hoist_loop_invariants import HoistLoopInvariants
from quanta.passes.rules.inline_if import InlineIf
from quanta.passes.rules.peel_loop_iteration import PeelLoopIteration
from quanta.passes.rules.propagate_views import PropagateViews
from quanta.passes.rules.qat_exports import QatExports
from quanta.passes.rules.remove_noops import RemoveNoops
from quanta.passes.rules.stft_as_conv import StftAsConvPass

__all__ = [
    "PREPARE_FOR_LOWERING",
    "SIMPLIFY",
    "lower_qdq",
    "optimize_float",
    "prepare_for_lowering",
    "prepare_for_quantization",
    "simplify",
    "simplify_control_flow",
]


def _fold_groupnorm(opset: int) -> list[Pass]:
    # GroupNormalization-18 (per-group scale) is deprecated, and onnx's checker rejects
    # it, so a model that is saved again must not gain one: pipelines fold it from opset
    # 21 on (FoldGroupNorm itself also handles 18-20 for callers that ask).
    return [FoldGroupNorm(opset)] if opset >= 21 else []


def prepare_for_quantization(
    *, opset: int = 21, evaluator: Evaluator | None = None, opset_imports: dict[str, int] | None = None
) -> list[Pass]:
    """Float-graph rewrites before calibration and QDQ insertion: constants folded
    (weights computed by subgraphs become initializers, and shape subgraphs for the
    dimensions the inputs fix, with a symbolic batch too), no-ops removed, zero Pads
    folded into the Conv that reads them, activations written out as arithmetic made the
    one operator they compute (hardsigmoid, softplus), BatchNormalization folded into the weights (so the folded weights are what gets
    quantized), and so a constant per-channel Mul / Add after a Conv (tf2onnx writes the
    BatchNormalization after a depthwise Conv as Mul + Add: left as written, the Conv's
    output is quantized before the per-channel factors, at the widest channel's step), a strided ConvTranspose made a Conv over its output phases and a
    DepthToSpace, a stride-1 one a Conv (integer convolutions then), GroupNorm recognised, an unrolled RNN's
    per-step input Gemms made one MatMul over the sequence (one weight to quantize and
    one activation range, not one per step), duplicates merged. Transposes of a TF
    export sink through the elementwise operators after each Conv and cancel first, so
    that its BatchNormalization folds and its Pads meet their Convs.

    Constant folding here may produce large results (weights computed by a
    ConstantOfShape or a subgraph must become initializers to be quantized; the int8
    model stores them in a quarter of the bytes anyway), up to 2^24 elements."""
    from quanta.passes.rules.fold_conv_affine import FoldConvAffine, ScaleThroughRelu
    from quanta.passes.rules.hoist_gathered_gemm import HoistGatheredGemm
    from quanta.passes.rules.refine_shapes import RefineShapes
    from quanta.passes.rules.sink_transposes import SinkTransposes
    from quanta.passes.rules.widen_half_islands import WidenHalfIslands

    return [
        FoldConstants(evaluator, max_output_elements=1 << 24),
        FoldStaticDims(),  # Gather/Slice of a Shape whose read dimensions are static ...
        FoldConstants(evaluator, max_output_elements=1 << 24),  # ... and the arithmetic on them
        FoldReshapeDims(),  # x.view(x.size(0), -1) with a symbolic batch -> Reshape(x, [0, -1])
        # the shapes behind those targets, inferred anew: onnx's inference at load time saw
        # no value through their Concats (the MAC counts and the rules below read them)
        RefineShapes(opset_imports or {"": opset}),
        Canonicalize(opset),  # Sum -> Adds (residuals of older exports), Upsample -> Resize
        # Clip(x+3, 0, 6)/6 -> HardSigmoid, Log(1+Exp) -> Softplus; written-out hardswish
        # stays as written: quantizing its input cost Paddle's OCR models accuracy
        CanonicalizeActivations(opset, hardswish=False),
        RemoveNoops(),
        # float16 islands as the float32 graph every runtime computes them in (Casts at
        # the edges): the Q/DQ go in float32 around float32 weights (float16 widens
        # exactly), so the integer lowering sees the groups a float32 model has
        WidenHalfIslands(),
        # a TF export's NHWC epilogues between Transposes: the pairs cancel, the Conv's
        # BatchNormalization (Sub, Mul, Add) and Pad land next to it for the folds below
        SinkTransposes(),
        EliminateDead(),
        FoldPad(),  # "same"-padding Pads (pads folded to constants above) into their Convs
        FoldBatchNorm(),
        FoldConvAffine(),  # tf2onnx's BatchNorm after a depthwise Conv: Mul + Add, into its weights
        # a Keras BatchNorm after the Relu (Mul + Add): the positive scale through the Relu
        # into the weights, per channel; the shift stays an Add
        ScaleThroughRelu(),
        FoldZeroProduct(),  # an unrolled RNN's zero initial state times W_hh: only the bias is left
        ConvTransposeAsConvs(),  # strided: a Conv over the output phases + DepthToSpace; stride 1: a Conv
        ConvDepthOneAs2d(opset),  # a 3-D Conv of depth 1 over a depth of 1: a 2-D Conv (integer kernel)
        *_fold_groupnorm(opset),
        HoistGatheredGemm(),
        # an Einsum of two run-time operands (MaxViT's attention "BGHID,BGHJD->BGHIJ"): the
        # MatMul it computes, which the quantizer plans as attention's MatMuls
        CanonicalizeActivationEinsum(),
        EliminateCommon(),
        EliminateDead(),
    ]


#: a blocked (NCHW16c) region below this many multiply-adds stays NCHW: streaming audio
#: models' convolutions on planes of 33-65 pixels (GTCRN: 5-50 k each) gain less from
#: blocking than the reorder steps around them cost
SMALL_BLOCKED_REGION_MACS = 1 << 18


def optimize_float(
    *,
    opset: int = 21,
    evaluator: Evaluator | None = None,
    blocked_layout: bool = False,
    opset_imports: dict[str, int] | None = None,
) -> list[Pass]:
    """What the runtime compiles a float graph (no quantization operator) with: ONNX
    Runtime's basic level for a CNN. CastLike becomes the Cast it is (ONNX's function
    bodies hold it), static dimensions and ranks of symbolic shapes fold
    (:mod:`.rules.fold_static_dims`). Constant nodes and constant subgraphs become
    constants (Paddle exports hold every weight in a Constant node, which the native
    float kernels pack at compile time), shapes the folded constants fix are inferred
    anew and the shape subgraphs that read them fold too (:mod:`.rules.refine_shapes`:
    a TF export's computed "same" pads), no-ops go, float16 islands compute in float32
    between Casts (the native float kernels are float32; ONNX Runtime's CPU provider
    does the same; docs/float-ops.md "float16 models"), the Transposes a TF export writes
    around every Conv sink through the elementwise operators between them and cancel
    (exact; its Pads then fold into the Convs), a constant bias Add after a MatMulNBits
    becomes its bias input (:mod:`.rules.fuse_nbits_bias`: exact), and an inference
    BatchNormalization folds into the Conv / ConvTranspose / Gemm before it (one pass over the output
    instead of two; the folded weights are computed in float64 and rounded once, as ORT
    folds them in float32), and a Relu / Clip after a float Conv becomes the
    ``quanta::Conv`` output clamp (the float GEMM family clamps in its store instead of
    a second pass over the output; the reference twin is the Conv, then the clamp, bit
    for bit the two nodes); a constant per-channel Mul / Add after a float Conv folds
    into its weights (as ONNX Runtime's ConvMulFusion / ConvAddFusion), and a SiLU,
    HardSwish, HardSigmoid or Paddle's written-out hardswish after it becomes the
    ``quanta::Conv`` gate, applied to each finished block (exact: the chain of the nodes
    it replaces); a LayerNorm written out as ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt,
    Div (and its Mul / Add by constants) becomes one ``quanta::LayerNormDiv``, T5's RMS
    norm (Pow, ReduceMean, Add, Sqrt, Div or Mul by the reciprocal) one
    ``quanta::RMSNormDiv`` (exact: the same float32 operations in the same order); a GELU
    written out (Div, Erf, Add, Mul, Mul; or the eight tanh-form nodes) becomes one Gelu
    (:mod:`.rules.fuse_gelu`: the same operations, the power-of-two 0.5 moved, so exact
    but where a product is subnormal or overflows); a two-operand Einsum becomes the MatMul it
    computes between Transposes / Reshapes (the float GEMM family's bound instead of
    np.einsum's unstated order); a constant bias Add after a MatMul by a constant becomes
    one ``quanta::MatMulBias`` (:mod:`.rules.fuse_matmul_bias`: the GEMM's store adds it;
    exact); a constant per-channel Add after a ConvTranspose becomes its bias (exact
    without one; :mod:`.rules.fold_conv_affine`) and a BatchNormalization after it folds; with ``blocked_layout``, chains of float convolutions and
    the pools, elementwise operators, Concats, Splits and nearest Resizes between them
    exchange NCHW16c tensors (:mod:`.lower.nchwc`: ONNX Runtime's NchwcTransformer;
    direct convolutions over channel blocks, no layout change inside a chain). A MatMul whose
    weight a file stores as 8-bit integers times a per-column scale (``Cast`` -> ``Mul``) becomes ``quanta::MatMulW8`` before the
    constants fold: the file's float semantics (the weight is the same float32 values, as
    ONNX Runtime runs it), with the weight kept 8-bit for the kernel to stream;
    ``SessionOptions.dynamic_weight_only`` runs it as ``DynamicQuantizeMatMul`` instead
    (:mod:`.lower.weight_only_matmul`). Every target runs the folded graph, so the
    reference stays the golden of what the native target computes."""
    from quanta.passes.lower.nchwc import BlockedFloatLayout
    from quanta.passes.lower.weight_only_matmul import WeightOnlyMatMuls
    from quanta.passes.rules.fold_conv_affine import FoldConvAffine, FoldConvTransposeAffine
    from quanta.passes.rules.fuse_float_gate import FuseFloatGate
    from quanta.passes.rules.fuse_gelu import FuseGeluPass
    from quanta.passes.rules.fuse_gru_gates import FuseGRUGates
    from quanta.passes.rules.fuse_layer_norm import FuseLayerNormPass
    from quanta.passes.rules.fuse_lstm_gates import FuseLSTMGates
    from quanta.passes.rules.fuse_matmul_bias import FuseMatMulBias
    from quanta.passes.rules.fuse_nbits_bias import FuseNBitsBias
    from quanta.passes.rules.hoist_gathered_gemm import HoistGatheredGemm
    from quanta.passes.rules.refine_shapes import RefineShapes

    refine = RefineShapes(opset_imports)
    from quanta.passes.rules.sink_transposes import SinkTransposes
    from quanta.passes.rules.widen_half_islands import WidenHalfIslands

    return [
        WeightOnlyMatMuls(),  # before the fold: an 8-bit weight stays 8-bit (quanta::MatMulW8)
        # CastLike -> Cast (ONNX function bodies): folds below, runs natively; n-ary Sum /
        # Max / Min / Mean as binary steps, Upsample as Resize: native kernels
        Canonicalize(opset),
        FoldConstants(evaluator),
        FoldStaticDims(),  # the static dimensions (and the rank) a symbolic shape's readers take
        # Reshape(x, Concat(.., Gather(Shape(x), j), ..)) -> a constant target with 0 at j:
        # its result's shape is then known (a grouped linear's Einsum after it needs it)
        FoldReshapeDims(),
        refine,  # shapes behind the folded constants (a Pad's computed amounts) ...
        FoldConstants(evaluator),  # ... and the Shape subgraphs that read them
        RefineShapes(opset_imports, after=refine),  # a second round when the first found some
        FoldConstants(evaluator),
        StftAsConvPass(opset),  # a real STFT / DFT: a Conv / MatMul by the (windowed) DFT basis
        RemoveNoops(),
        # equal constants merged before the rules that group nodes by their weight: a
        # file that stores a shared weight once per reader (NVIDIA ModelOpt writes an
        # unrolled LSTM's input weight once per step) is then the graph its export was
        EliminateCommon(),
        WidenHalfIslands(),  # float16 islands in float32 between Casts: the rules below see float32
        # a TF export's NHWC epilogues between Transposes: the pairs cancel, the affine
        # epilogue and activation land right after each Conv for the folds below
        SinkTransposes(),
        EliminateDead(),
        FoldPad(),  # a "same" padding Pad (now right before its Conv) into the Conv's pads
        FoldBatchNorm(),
        ConvDepthOneAs2d(opset),  # a 3-D Conv of depth 1 over a depth of 1: the native 2-D Conv
        FoldConvAffine(),  # a constant per-channel Mul / Add after a float Conv: into its weights
        # a bias Add after a ConvTranspose: its bias; a BatchNormalization after it then folds
        FoldConvTransposeAffine(),
        FoldBatchNorm(),
        FuseNBitsBias(),  # a constant bias Add after a MatMulNBits: its bias input (exact)
        ConvTransposeUnitStrides(),  # a stride-1 ConvTranspose: the Conv it is (native Conv paths)
        ConvTransposeAs2d(opset),  # a strided 1-D ConvTranspose: the 2-D one over a unit height (native)
        FuseFloatActivation(),  # Relu / Clip after a float Conv: the GEMM's store clamps
        FuseFloatGate(),  # SiLU / hardswish / HardSigmoid / LeakyRelu after a float Conv: per finished block
        HoistGatheredGemm(),  # an unrolled RNN's input projections: one product over all steps
        # duplicates merged: a Keras LayerNorm computes x - mean twice, which hides it from FuseLayerNorm
        EliminateCommon(),
        FuseLSTMGates(),  # an exported LSTM cell's ten elementwise nodes: one quanta::LSTMGates
        FuseGRUGates(),  # an exported GRU cell's two Splits and ten elementwise nodes: one quanta::GRUGates
        FuseLayerNormPass(),  # a written-out LayerNorm / RMS norm: one quanta::LayerNormDiv / RMSNormDiv
        FuseGeluPass(opset),  # a GELU written out (erf: five ops, tanh: eight): one Gelu / MlasGeluTanh
        CanonicalizeEinsum(),  # a two-operand Einsum: the MatMul it computes (native float GEMM)
        FuseMatMulBias(),  # a constant bias Add after a MatMul by a constant: the GEMM's store adds it
        CollapseViews(),  # views of views, unit-axis Transposes, Concat / Split of one: fewer steps
        BlockedFloatLayout(
            enabled=blocked_layout, min_region_macs=SMALL_BLOCKED_REGION_MACS
        ),  # chains of float convolutions exchange NCHW16c tensors
        EliminateDead(),
    ]


def simplify(*, opset: int = 21, evaluator: Evaluator | None = None) -> list[Pass]:
    """Graph-level clean-up that keeps every op runnable on the reference target.
    Every step is exact (bit for bit) on the reference target; AlignScales runs with
    Concat only (its Add alignment is not exact and is opt-in)."""
    return [
        FoldConstants(evaluator),  # first: shape subgraphs become the constants later rules read
        RemoveNoops(),  # Identity, Dropout, Reshape to the same shape, DQ -> Q with one type
        FoldBatchNorm(),  # into float weights (a QDQ weight is not foldable: NoMatch)
        *_fold_groupnorm(opset),  # Reshape -> InstanceNormalization -> Reshape
        PropagateViews(),  # views onto quantized values ...
        RemoveNoops(),  # ... which leaves DQ -> Q pairs with one type to remove
        FoldConstants(evaluator),  # ... and Q(constant) where a view moved above a Q
        DropImpliedActivation(),  # Relu/Clip that the output quantization already implies
        AlignScales(),  # Concat inputs requantized to the output type
        EliminateCommon(),
        EliminateDead(),  # last: collects what the rewrites left behind
    ]


def lower_qdq(
    *, opset: int = 21, evaluator: Evaluator | None = None, opset_imports: dict[str, int] | None = None
) -> list[Pass]:
    """What the runtime compiles a QDQ graph with: the exact clean-up, then instruction
    selection (Q -> op -> DQ groups become integer operators), then dead code.
    Pads between one quantized type and the same one run on the integers after it.

    AlignScales is left out: the integer Concat takes inputs of different scales, while
    an aligned graph would keep its DQ -> Q requantizations as float nodes.
    FuseActivation is left out: instruction selection matches the plain ops."""
    from quanta.passes.lower.accumulator_to_quant import FuseAccumulatorToQuant
    from quanta.passes.lower.channels_last import ChannelsLast
    from quanta.passes.lower.code_maps8 import ComposeCodeMaps8Pass
    from quanta.passes.lower.fold_code_clamp import FoldCodeClampPass
    from quanta.passes.lower.fold_float_weights import FoldFloatWeights, FoldRequantizedConstants
    from quanta.passes.lower.lookup import ComposeCodeMaps16Pass, ComposeLookupsPass
    from quanta.passes.lower.mul_quant import FuseMulQuantPass
    from quanta.passes.lower.qdq_to_qlinear import LowerQdqToQLinear
    from quanta.passes.lower.qlinear_matmul_add import FuseQLinearMatMulAddPass
    from quanta.passes.lower.relabel_codes import RelabelCodesPass
    from quanta.passes.lower.requant_params import CarryRequantization
    from quanta.passes.lower.softmax_quant import FuseSoftmaxQuantPass
    from quanta.passes.lower.transpose_view import TransposeAsViewPass
    from quanta.passes.lower.w4 import WidenFourBitWeightsPass
    from quanta.passes.lower.wide import MsQdqToOnnxPass
    from quanta.passes.rules.fuse_gelu import FuseGeluPass
    from quanta.passes.rules.fuse_layer_norm import FuseLayerNormPass
    from quanta.passes.rules.quantize_pad import QuantizePad
    from quanta.passes.rules.refine_shapes import RefineShapes
    from quanta.passes.rules.widen_half_islands import WidenHalfIslands

    refine = RefineShapes(opset_imports or {"": opset})
    return [
        MsQdqToOnnxPass(),  # ORT's 16-bit contrib Q/DQ -> ai.onnx (the QLinear*16 groups)
        # int4 / uint4 weights per tensor or channel -> int8 codes (the 8-bit groups, eq. (W10))
        WidenFourBitWeightsPass(),
        # CastLike -> Cast: ONNX's function bodies (Attention-23, written out) keep their
        # CastLikes in a quantized file's float part; Cast runs natively and folds below
        RewritePass([CastLikeToCast()]),
        FoldConstants(evaluator),
        InlineIf(),  # an If on a condition folded to a constant: its branch's nodes
        FoldConstants(evaluator),
        # Reshape(x, Concat(.., Gather(Shape(x), j), ..)) -> a constant target with 0 at j,
        # and the shapes behind it inferred again: a float Einsum between DQ and Q (ORT's
        # file of a grouped linear layer) becomes a MatMul below only with its shapes known
        FoldStaticDims(),
        FoldReshapeDims(),
        refine,
        FoldConstants(evaluator),
        RefineShapes(opset_imports or {"": opset}, after=refine),  # a second round when the first found some
        FoldConstants(evaluator),
        HoistLoopInvariants(),  # loop variables a body passes through: read from the enclosing scope
        RemoveNoops(),
        StftAsConvPass(opset),  # a float STFT / DFT: the native Conv / MatMul by its DFT basis
        # float16 islands and their Q/DQ in float32 (a TensorRT-style file: the groups
        # then lower as a float32 model's; the float ops run on the native kernels)
        WidenHalfIslands(),
        QatExports(),  # one-element Q/DQ scales; ConvBn QAT's per-channel Div/Add -> BN
        FoldBatchNorm(),
        *_fold_groupnorm(opset),
        ConvDepthOneAs2d(opset),  # a 3-D Conv of depth 1: a 2-D one between views (integer kernel)
        # DQ -> strided ConvTranspose -> Q: Q(Conv over the output phases) -> DepthToSpace
        QdqConvTransposesAsConvs(),
        PropagateViews(),  # views onto quantized values: Q(Conv) groups become visible
        RemoveNoops(),
        DropImpliedActivation(),
        # a clamp the output quantization does not imply (Quark's zero point 128): the
        # producer's group and the clamp's table, both integer, instead of a float group
        QuantizeBeforeActivationPass(),
        EliminateCommon(),
        LowerQdqToQLinear(
            opset, evaluator
        ),  # opset: Softmax's axis (LowerSoftmax); evaluator: tables (LowerLookup)
        EliminateDead(),  # the DQs the lowering left unread: a table read by the next alone
        # requantized constants, then the integer ops over them alone (ORT's QDQ file of a
        # dynamo export: the GRU's W built by Slice / Concat / Unsqueeze of the weights, each
        # between Q / DQ) -> quantized constants, which FoldFloatWeights below turns into
        # the float weights a float op needs as constants
        FoldConstants(evaluator),
        *([FoldRequantizedConstants(evaluator), FoldConstants(evaluator)] if evaluator is not None else []),
        # a group of ops on one tensor's 8-bit codes (PP-OCR's w0 · x + w1 of learnt scalars): one table
        *([ComposeCodeMaps8Pass(evaluator)] if evaluator is not None else []),
        ComposeLookupsPass(),  # tables in a row (a BatchNorm as Sub / Mul / Add, each between Q / DQ): one
        # a table that only clamps a QLinearConv's codes (Quark's Relu6 at zero point 128):
        # the convolution's output clamp, in its epilogue
        FoldCodeClampPass(),
        # a group of ops on one tensor's 16-bit codes (HardSwish's x + 3, x · (x + 3), / 6): one table
        *([ComposeCodeMaps16Pass(evaluator)] if evaluator is not None else []),
        QuantizePad(),  # DQ -> Pad -> Q of one type: the Pad runs on the integers
        *([FoldFloatWeights(evaluator)] if evaluator is not None else []),  # DQ(const) read by float ops
        ConvTransposeAs2d(opset),  # a float strided 1-D ConvTranspose left: the 2-D one (native float kernel)
        FuseGeluPass(opset),  # a float-island GELU (erf: five ops, tanh: eight) -> one Gelu / MlasGeluTanh
        FuseLayerNormPass(),  # a written-out LayerNorm / RMS norm island -> quanta::LayerNormDiv / RMSNormDiv
        # a float Einsum left by the lowering -> MatMul (after it: an Einsum between Q / DQ
        # stays the float product the file asks for, not an integer MatMul)
        CanonicalizeEinsum(),
        # ConvInteger's float output stage, a float gate and QuantizeLinear -> one node
        FuseAccumulatorToQuant(),
        # an attention score's scale, mask Add, Softmax and QuantizeLinear -> one node
        FuseSoftmaxQuantPass(opset),
        # a per-column (SmoothQuant) factor and QuantizeLinear -> one node
        FuseMulQuantPass(),
        ChannelsLast(),  # convolutions exchange NHWC; transposes only at region edges
        CollapseViews(),  # views of views, unit-axis Transposes, Concat / Split of one: fewer steps
        # a QLinearMatMul and the QLinearAdd of its bias -> one node (the GEMM's output stage)
        FuseQLinearMatMulAddPass(),
        # attention's head Transposes read by run-time-b GEMMs alone -> strided views
        TransposeAsViewPass(),
        # a table that maps every code to itself (PP-OCR's w0 · x + w1 on exact scales) ->
        # the same bytes under the lookup's output type, an alias (after ChannelsLast,
        # which moves lookups across layouts)
        RelabelCodesPass(),
        EliminateDead(),
        CarryRequantization(),  # the requantization multipliers, once, on the nodes
    ]


def simplify_control_flow(*, evaluator: Evaluator | None = None) -> list[Pass]:
    """What the runtime compiles a float graph with If / Loop / Scan nodes (or a float
    If branch, Loop or Scan body) with: constants folded (Constant nodes, the shapes a
    static graph fixes), an If whose condition became a constant inlined, and what
    that leaves folded (the Identity branches of an exporter's optional Squeeze) and
    dead code removed; a written-out LayerNorm becomes one ``quanta::LayerNormDiv``, an RMS
    norm one ``quanta::RMSNormDiv``. Every step is exact."""
    from quanta.passes.rules.fuse_layer_norm import FuseLayerNormPass

    return [
        FoldConstants(evaluator),
        InlineIf(),
        FoldConstants(evaluator),
        # a loop variable whose update is idempotent (Paddle's features as x + 0):
        # iteration 0 before the Loop, the variable passed through after it
        PeelLoopIteration(),
        # loop variables a body passes through: enclosing-scope values of the body
        # (Paddle's weights: its Transposes of them fold and its GEMMs pack them once),
        # and the body's nodes on those alone computed once, before the Loop
        HoistLoopInvariants(nodes=True),
        RemoveNoops(),
        FuseLayerNormPass(),
        CollapseViews(),  # a Loop body's steps run once per iteration: fewer of them
        EliminateDead(),
    ]


def prepare_for_lowering(*, opset: int = 21, evaluator: Evaluator | None = None) -> list[Pass]:
    """``simplify`` then the remaining activations fused into their producers as output
    clamps (``quanta`` domain ops: the runtime needs kernels for them)."""
    return [*simplify(opset=opset, evaluator=evaluator), FuseActivation(), EliminateDead()]


SIMPLIFY: list[Pass] = simplify()
PREPARE_FOR_LOWERING: list[Pass] = prepare_for_lowering()
