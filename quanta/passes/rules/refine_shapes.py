"""Shapes inferred anew after constant folding exposed them.

onnx's shape inference at load time stops at the first operator whose output shape
depends on a value it cannot see: a TF export's "same" padding computes its ``Pad``
amounts from constants through ConstantOfShape / Concat / Reshape / Slice / Transpose,
so every tensor after that Pad loads with an unknown shape, and the ``Shape -> Gather``
subgraphs that read H and W further on cannot fold. Once :class:`FoldConstants` has made
those amounts constants, inference sees them: this pass writes the graph out, infers
again (the declared value_info dropped, the weights given to inference as typed inputs),
and gives
every value whose shape is unknown or less specific the inferred one, keeping its
element type (a value of another element type keeps its own: the IR's types are the
contract, inference only fills in dimensions).

It runs only when a ``Shape`` node reads a value whose dimensions are not all static (the
case the fold below needs); a model whose shapes are known pays nothing. A second round
(``after=`` the first) runs when the first refined a shape, whatever the Shapes left: the
folds between them may have fixed the next computed Pad (open_nsfw's pool padding: its
amounts come from the Shape subgraph the first round let fold). A model onnx cannot infer
is left as it is.

    %p = Pad(%x: [1,224,224,3], const [0,3,3,0,0,3,3,0]) -> %p: [1,230,230,3]
    %t = Transpose(%p) -> %t: [1,3,230,230];  Shape(%t) -> foldable
"""

from __future__ import annotations

from quanta.ir.graph import Graph, Model
from quanta.ir.types import TensorType
from quanta.passes.manager import Pass, PassResult

__all__ = ["RefineShapes"]


def _static(shape: tuple | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d >= 0 for d in shape)


def _more_specific(new: tuple | None, old: tuple | None) -> bool:
    """``new`` knows the rank where ``old`` does not, or fixes a dimension ``old`` leaves
    open, and contradicts none of ``old``'s fixed dimensions."""
    if new is None:
        return False
    if old is None:
        return True
    if len(new) != len(old):
        return False
    gained = False
    for a, b in zip(new, old):
        if isinstance(b, int) and b >= 0:
            if a != b:
                return False
        elif isinstance(a, int) and a >= 0:
            gained = True
    return gained


#: constants of more elements than this reach inference as typed inputs, not as data
#: (``to_proto(data_limit=)``): a shape tensor is smaller, and writing the weights (97 MB
#: in a ViT) would cost most of the time
_DATA_LIMIT = 1024


def _inferred_types(graph: Graph, opset_imports: dict[str, int]) -> dict[str, TensorType] | None:
    """The types onnx infers for ``graph`` written out without its declared value_info and
    with its large constants as typed inputs; None when it cannot."""
    from quanta.ir.onnx_io import to_proto, value_info_types
    from quanta.ir.stand_ins import infer_through

    try:
        proto = to_proto(Model(graph=graph, opset_imports=opset_imports), data_limit=_DATA_LIMIT)
        del proto.graph.value_info[:]
        inferred = infer_through(proto, strict_mode=False, data_prop=True)
    except Exception:
        return None
    return value_info_types(inferred.graph)


class RefineShapes(Pass):
    """Re-infer shapes when a ``Shape`` reads a value of unknown dimensions (module
    docstring). ``opset_imports``: the model's, for the written copy."""

    name = "refine_shapes"

    def __init__(
        self, opset_imports: dict[str, int] | None = None, *, after: RefineShapes | None = None
    ) -> None:
        self.opset_imports = dict(opset_imports or {"": 21})
        #: a second round runs only when the first refined something (its folds may
        #: have made the next Pad's amounts constant: open_nsfw's pool padding)
        self.after = after
        self.refined = 0

    def call(self, graph: Graph) -> PassResult:
        self.refined = 0
        if self.after is not None:
            if not self.after.refined:
                return PassResult(graph, False, {})
        elif not any(
            n.op_type == "Shape" and not _static(n.inputs[0].shape) for n in graph.nodes if n.inputs
        ):
            return PassResult(graph, False, {})
        types = _inferred_types(graph, self.opset_imports)
        if types is None:  # a graph onnx cannot write or infer: the shapes stay as they are
            return PassResult(graph, False, {})
        refined = 0
        for v in graph.values():
            if v.is_const:
                continue
            t = types.get(v.name)
            if t is None or not isinstance(t, TensorType):
                continue
            if v.type is not None and v.elem is not None and t.elem != v.elem:
                continue
            if v.type is None or _more_specific(t.shape, v.shape):
                v.type = TensorType(v.elem if v.elem is not None else t.elem, t.shape)
                refined += 1
        self.refined = refined
        return PassResult(graph, refined > 0, {"refined": refined})
