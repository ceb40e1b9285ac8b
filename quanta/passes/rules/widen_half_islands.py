"""float16 islands of a float graph computed in float32, between Casts.

    graph main(%x: tensor<Nx3x9x7, f16>) {
      %w = const tensor<7x3x3x3, f16>
      %c = Conv(%x, %w)
      %y = Relu(%c)
      return %y
    }
  ->
    graph main(%x: tensor<Nx3x9x7, f16>) {
      %w/f32 = const tensor<7x3x3x3, f32>              w widened (exact)
      %x/f32 = Cast(%x) {to=1}                          at the island's entry
      %c/f32 = Conv(%x/f32, %w/f32)
      %y/f32 = Relu(%c/f32)
      %y = Cast(%y/f32) {to=10}                         at its exit: rounded once
      return %y
    }

An *island* is a connected set of nodes that compute on float16 values and whose
operator is in :data:`HALF_IN_FLOAT_OPS`. Every float16 value the island produces is
float32 instead; a float16 value it reads is widened on entry (a constant at compile
time, exactly; anything else by a ``Cast(to=FLOAT)`` placed before its first island
reader); where an island value leaves the island (a graph output, a reader outside the
island) a ``Cast(to=FLOAT16)`` makes the original value, under its original name, so
the graph's inputs and outputs keep their names and float16 types.

Why: the native target's float kernels take float32 only, so a float16 model (a Keras
``mixed_float16`` export, a model converted with onnxconverter-common) ran every node on
its NumPy twin (slovorez: 3.5x ONNX Runtime's latency). ONNX Runtime's CPU provider,
which has no float16 kernels for most operators either, does the same: its
InsertCastTransformer puts Casts around them and RemoveDuplicateCastTransformer removes
the float32 -> float16 -> float32 pairs between two of them, so it computes the island
in float32 and rounds at its exits.

A ``Cast(to=FLOAT)`` of an island value is the island value itself (no rounding to
float16 first, as ONNX Runtime removes that pair too). A ``Cast(to=FLOAT16)`` into the
island is kept (the file asks for that rounding; ONNX Runtime keeps it), and ``Shape`` /
``Size`` read whichever of the two values exists (they read no elements).

Numerics (docs/float-ops.md "float16 models"): not bit-exact with the graph as written.
Inside the island every operator is its float32 form, so a value is not rounded to
float16 between two operators; each island output is the float32 result rounded once
to float16 (round to nearest even).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from quanta.ir.graph import Graph, Node, Value, result_type
from quanta.ir.types import F16, F32, TensorType
from quanta.passes.manager import Pass, PassResult, PostconditionError

__all__ = ["HALF_IN_FLOAT_OPS", "WidenHalfIslands"]

#: ai.onnx operators an island computes in float32. Each has one type variable for its
#: float operands and results (so float32 in, float32 out) and no attribute that names
#: an element type; their float16 and float32 forms compute the same real function and
#: differ only in rounding. QuantizeLinear / DequantizeLinear with float16 scales (a
#: TensorRT-style file: NVIDIA ModelOpt's int8 mode keeps what it does not quantize in
#: half precision) join the island with their scales widened (exact): QuantizeLinear
#: divides in float32 for a float16 input already (eq. (2), as ONNX Runtime does), so
#: its codes are the same from the island's float32 value; DequantizeLinear's product is
#: not rounded to float16. Their integer values then carry a float32 expressed type, and
#: the groups lower to the integer kernels of a float32 model (:func:`_requantized`).
#: Left out on purpose: Cast / CastLike (they name the type:
#: handled above), the *Like / random / EyeLike / ConstantOfShape ops (a ``dtype`` or
#: ``value`` attribute sets the output type), If / Loop / Scan (their bodies' types are the file's),
#: sequence ops, other domains (their type rules are not ONNX's). An operator outside
#: the list reads and writes float16 as written and ends the island.
HALF_IN_FLOAT_OPS = frozenset(
    {
        # the float GEMM family, normalization, pooling
        "Conv",
        "ConvTranspose",
        "MatMul",
        "Gemm",
        "Einsum",
        "BatchNormalization",
        "InstanceNormalization",
        "LayerNormalization",
        "GroupNormalization",
        "LpNormalization",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "GlobalMaxPool",
        "LSTM",
        "GRU",
        "RNN",
        # elementwise and activations
        "Add",
        "Sub",
        "Mul",
        "Div",
        "Pow",
        "Mod",
        "Min",
        "Max",
        "Mean",
        "Sum",
        "Abs",
        "Neg",
        "Sign",
        "Reciprocal",
        "Sqrt",
        "Exp",
        "Log",
        "Floor",
        "Ceil",
        "Round",
        "Sin",
        "Cos",
        "Atan",
        "Erf",
        "Tanh",
        "Sigmoid",
        "Relu",
        "LeakyRelu",
        "PRelu",
        "Elu",
        "Selu",
        "Celu",
        "Gelu",
        "Mish",
        "Softplus",
        "Softsign",
        "HardSigmoid",
        "HardSwish",
        "ThresholdedRelu",
        "Clip",
        "Softmax",
        "LogSoftmax",
        "Where",
        # reductions
        "ReduceSum",
        "ReduceMean",
        "ReduceMax",
        "ReduceMin",
        "ReduceProd",
        "ReduceL1",
        "ReduceL2",
        "ReduceSumSquare",
        "ReduceLogSumExp",
        "CumSum",
        "ArgMax",
        "ArgMin",
        "TopK",
        # comparisons (bool results)
        "Equal",
        "Less",
        "LessOrEqual",
        "Greater",
        "GreaterOrEqual",
        "IsNaN",
        "IsInf",
        # data movement
        "Identity",
        "Dropout",
        "Reshape",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Transpose",
        "Concat",
        "Split",
        "Slice",
        "Gather",
        "GatherND",
        "GatherElements",
        "Expand",
        "Tile",
        "Pad",
        "Resize",
        "DepthToSpace",
        "SpaceToDepth",
        "Trilu",
        # quantization with float16 scales (above)
        "QuantizeLinear",
        "DequantizeLinear",
    }
)

_QDQ = ("QuantizeLinear", "DequantizeLinear")

#: read only the shape of their input: they take the float32 value where one exists and
#: never cause a Cast
SHAPE_READERS = frozenset({"Shape", "Size"})

_FLOAT = 1  # TensorProto.FLOAT
_FLOAT16 = 10  # TensorProto.FLOAT16


def _is_half(v: Value | None) -> bool:
    return v is not None and v.type is not None and v.type.elem == F16


def _typed(values: Iterable[Value | None]) -> bool:
    return all(v is None or (v.type is not None and v.type.elem is not None) for v in values)


def in_island(node: Node) -> bool:
    """Whether ``node`` computes in float32 when it touches float16: an operator of
    :data:`HALF_IN_FLOAT_OPS` whose inputs and outputs all have known types (a value of
    unknown type might be float16 at run time, and its readers outside the island
    would get float32)."""
    if node.domain or node.op_type not in HALF_IN_FLOAT_OPS:
        return False
    if not any(_is_half(v) for v in (*node.inputs, *node.outputs)):
        return False
    if node.op_type in _QDQ and (node.attrs.get("block_size") or not _const_params(node)):
        return False  # blocked or computed scales: left as written
    return _typed(node.inputs) and _typed(node.outputs)


def _const_params(node: Node) -> bool:
    return all(v is None or v.is_const for v in node.inputs[1:3])


def _requantized(node: Node) -> None:
    """The integer value a widened QuantizeLinear writes (or a DequantizeLinear reads)
    carries the float32 expressed type its scale now gives (the same codes and
    parameters)."""
    from quanta.passes.rules._util import node_qtype

    k = node.inputs[0] if node.op_type == "DequantizeLinear" else node.outputs[0]
    q = node_qtype(node, k, node.input(1), node.input(2))
    if q is not None and k is not None and k.type is not None:
        k.type = TensorType(q, k.type.shape)


class WidenHalfIslands(Pass):
    """float16 islands computed in float32 (module docstring)."""

    name = "widen_half_islands"

    def call(self, graph: Graph) -> PassResult:
        wide: dict[int, Value] = {}  # id of a float16 value -> its float32 value
        stats = {"nodes": 0, "casts_in": 0, "constants": 0}
        exits: list[Node] = []
        for node in list(graph.nodes):
            if node.op_type in SHAPE_READERS and not node.domain:
                x = node.input(0)
                if x is not None and id(x) in wide:
                    node.replace_input(0, wide[id(x)])
                continue
            if node.op_type == "Cast" and not node.domain:
                self._cast_of_island_value(graph, node, wide)
                continue
            if not in_island(node):
                continue
            stats["nodes"] += 1
            for i, v in enumerate(node.inputs):
                if v is not None and _is_half(v) and id(v) not in wide:
                    wide[id(v)] = self._entry(graph, v, node, stats)
                if v is not None and id(v) in wide:
                    node.replace_input(i, wide[id(v)])
            for k, v in enumerate(node.outputs):
                if _is_half(v):
                    exits.append(self._exit(graph, node, k, wide))
            if node.op_type in _QDQ:
                _requantized(node)
        # an exit no reader outside the island needs (and that is no graph output) goes
        outputs = {id(v) for v in graph.outputs}
        kept = 0
        for cast in exits:
            if cast.outputs[0].uses or id(cast.outputs[0]) in outputs:
                kept += 1
            else:
                graph.remove_node(cast)
        graph.remove_unused_initializers()
        stats["casts_out"] = kept
        return PassResult(graph, stats["nodes"] > 0, {k: v for k, v in stats.items() if v})

    @staticmethod
    def _entry(graph: Graph, v: Value, reader: Node, stats: dict[str, int]) -> Value:
        """The float32 value of the float16 value ``v`` that the island node ``reader``
        reads first: a float32 constant (float16 -> float32 is exact), or a Cast before
        ``reader``."""
        if v.const is not None and not any(v is i for i in graph.inputs):  # a fed input may override it
            stats["constants"] += 1
            array = np.asarray(v.const, np.float32)
            return graph.add_initializer(
                graph.fresh_name(f"{v.name}/f32"), array, result_type(shape_from=v, elem_from=F32)
            )
        stats["casts_in"] += 1
        out = Value(graph.fresh_name(f"{v.name}/f32"), result_type(shape_from=v, elem_from=F32))
        cast = Node("Cast", [v], [out], {"to": _FLOAT}, name=graph.fresh_name(f"{v.name}/to_f32"))
        graph.add_node(cast, before=reader)
        return out

    @staticmethod
    def _exit(graph: Graph, node: Node, k: int, wide: dict[int, Value]) -> Node:
        """Make ``node``'s output ``k`` float32 and the original float16 value (name,
        type, readers) a Cast of it right after ``node``; returns the Cast."""
        v = node.outputs[k]
        v32 = Value(graph.fresh_name(f"{v.name}/f32"), result_type(shape_from=v, elem_from=F32))
        v.producer = None
        node.outputs[k] = v32
        v32.producer = node
        wide[id(v)] = v32
        cast = Node("Cast", [v32], [v], {"to": _FLOAT16}, name=graph.fresh_name(f"{v.name}/to_f16"))
        after = graph.nodes.index(node) + 1
        graph.add_node(cast, before=graph.nodes[after] if after < len(graph.nodes) else None)
        return cast

    @staticmethod
    def _cast_of_island_value(graph: Graph, node: Node, wide: dict[int, Value]) -> None:
        """``Cast(to=FLOAT)`` of an island value is that float32 value (unless its result
        is a graph output, whose name must stay: then it casts the float16 exit)."""
        x = node.input(0)
        if x is None or id(x) not in wide or node.attrs.get("to") != _FLOAT:
            return
        y = node.outputs[0]
        if any(y is o for o in graph.outputs):
            return
        graph.replace_all_uses(y, wide[id(x)])
        graph.remove_node(node)

    def ensures(self, graph: Graph) -> None:
        for node in graph.nodes:
            if in_island(node):
                raise PostconditionError(f"{node.label} still computes in float16")
