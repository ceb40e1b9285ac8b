"""ONNX Runtime's fused transformer operators, written back as the ONNX operators they
fuse (a canonicalization of real exports, applied when a model is loaded).

ONNX Runtime's transformer optimizer (``onnxruntime.transformers.optimizer``, Hugging
Face Optimum's ``ORTOptimizer``) and its graph optimizer, saved with
``optimized_model_filepath``, fuse a BERT's embedding, attention, residual LayerNorm
and GELU into ``com.microsoft`` operators; ``quantize_dynamic`` on such a file turns
``Attention`` into ``QAttention`` and ``EmbedLayerNormalization`` into
``QEmbedLayerNormalization``. A user who downloads a "model_optimized.onnx" or
"model_quantized.onnx" brings these files. quanta rewrites each such node into the ONNX
operators it stands for, so every stage (the float and the quantized pipelines, the
quantizers, the float view of a quantized file, the debugger) sees ordinary ONNX:

==============================  ====================================================
node                            written as
==============================  ====================================================
BiasGelu(a, b)                  the erf GELU of Add(a, b): in a file ORT's quantizer wrote
                                com.microsoft Gelu (its kernel's bits); else Gelu from
                                opset 20, before it the five nodes of a PyTorch export
                                (Div, Erf, Add, Mul, Mul: what the quantizers know)
FastGelu(x, bias?)              the tanh GELU over x + bias in ORT's kernel's order
                                (FG1), docs/float-ops.md
QuickGelu(x) {alpha}            Mul(x, Sigmoid(Mul(x, alpha)))
BiasAdd(x, bias, skip)          Add(Add(x, bias), skip)
SkipLayerNormalization          s = Add(Add(input, skip), bias); LayerNormalization of s
                                (before opset 17 written out: ReduceMean, Sub, Pow,
                                ReduceMean, Add, Sqrt, Div, Mul gamma, Add beta);
                                outputs 0 and 3 (s)
SkipSimplifiedLayerNormalization  the same s; its RMS norm written out
SimplifiedLayerNormalization    (ai.onnx domain in ORT's registry) the RMS norm
FusedMatMul                     MatMul with transA / transB as Transposes, Mul(alpha)
FusedGemm, FusedConv            Gemm / Conv (+ Z), then the activation node
EmbedLayerNormalization         Gathers of the three tables, their sum, its LayerNorm;
                                mask_index = ReduceSum(mask) per row
QEmbedLayerNormalization        DequantizeLinear of each table, then the above
Attention                       MatMul + bias, Q / K / V by Slice, heads by Reshape and
                                Transpose, Mul(Q·Kᵀ, scale) + mask + attention_bias,
                                Softmax, · V, heads merged
QAttention                      MatMulInteger(input, weight, zero points), Cast, Mul by
                                input_scale · weight_scale, then as Attention
MultiHeadAttention              separate 3-D query, key, value (+ their bias), then as
                                Attention (a key padding mask as Attention's mask)
LayerNormalization below        (ORT's own registration, which its LayerNormFusion
opset 17                        writes into any opset) the LayerNorm written out
ImageScaler, Scale, Affine,     ONNX's experimental operators of opsets 1-9 that ONNX
ScaledTanh, ParametricSoftplus  Runtime still runs (tiny-YOLOv2's ImageScaler): Mul / Add
                                / Tanh / Softplus by their attributes
==============================  ====================================================

Numerics: the float32 operations ONNX Runtime's kernels compute, in their order, except
where a kernel uses another formula: its LayerNorms take the variance as E[x²] − E[x]²
(the written-out form: E[(x − E[x])²]), its FastGelu and QuickGelu use MLAS's tanh and
logistic, its attention multiplies the scale inside the GEMM. The results differ from
ONNX Runtime's in the last bits of float32 (tests: ``tests/ir/test_ms_contrib.py``, each
operator against ONNX Runtime). Masks follow ONNX Runtime's CPU kernels: a masked key
adds ``mask_filter_value`` (default −10000) to its score; a raw mask keeps a key where
the mask is > 0; a 1-D ``[batch]`` mask index keeps the keys before each row's end;
``unidirectional`` adds ``mask_filter_value`` again above the diagonal.

A node in a form this module does not write (an Attention with a past state or a
present output, rotary embeddings, a ``[2·batch]`` or 4-D mask index, ``transBatch``
FusedMatMul, a Skip LayerNorm whose mean or inverse deviation is read) is left as it is,
and the runtime says which node has no implementation.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.graph import unused_name
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.ir.shape_hints import without_weight_data

__all__ = [
    "MS_DOMAIN",
    "ORT_QUANTIZER_PRODUCER",
    "SKIP_LAYER_NORM_DOC",
    "SKIP_SIMPLIFIED_LAYER_NORM_DOC",
    "decompose_contrib_ops",
]

#: the producer_name ONNX Runtime's quantization tool writes into its files (a file that
#: computes ORT's functions: quanta.session's float_functions "auto" reads it too)
ORT_QUANTIZER_PRODUCER = "onnx.quantize"

#: the operators this module writes out (SimplifiedLayerNormalization is in ONNX
#: Runtime's ai.onnx registry, the others in com.microsoft)
HANDLED = frozenset(
    {
        "BiasGelu",
        "FastGelu",
        "QuickGelu",
        "BiasAdd",
        "SkipLayerNormalization",
        "SkipSimplifiedLayerNormalization",
        "FusedMatMul",
        "FusedGemm",
        "FusedConv",
        "EmbedLayerNormalization",
        "QEmbedLayerNormalization",
        "Attention",
        "QAttention",
        "MultiHeadAttention",
    }
)

_GELU_K = np.uint32(0x3F4C422A).view(np.float32)  # f32(√(2/π)), (G2)
_GELU_C = np.uint32(0x3D372713).view(np.float32)  # f32(0.044715)
# FastGelu's constants as ORT's kernel writes them (bias_gelu.cc B and C), eq. (FG1)
_FAST_GELU_B = np.float32(0.7978845608028654)
_FAST_GELU_C = np.float32(0.035677408136300125)

#: the doc_string of the node that ends a SkipLayerNormalization's (resp. Skip
#: Simplified's) norm: ORT computes it with its own kernel (Welford's sums, docs/float-ops.md
#: (OL8)), which OrtFloatFunctions reads from here
SKIP_LAYER_NORM_DOC = "com.microsoft SkipLayerNormalization"
SKIP_SIMPLIFIED_LAYER_NORM_DOC = "com.microsoft SkipSimplifiedLayerNormalization"


class _Unsupported(Exception):
    """A node in a form this module does not write: it stays as it is."""


class _Writer:
    """Emits the replacement nodes of one node, with fresh names and the opset's forms."""

    def __init__(
        self, node: onnx.NodeProto, opset: int, taken: set[str], shapes: dict[str, list], ort_made: bool
    ):
        self.node = node
        self.opset = opset
        self.taken = taken
        #: the inferred shapes of the graph's values (hints: a value may have none)
        self.shapes = shapes
        #: written by ONNX Runtime's quantization tool (ORT_QUANTIZER_PRODUCER)
        self.ort_made = ort_made
        self.base = node.name or (node.output[0] if node.output else node.op_type)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def fresh(self, tag: str) -> str:
        return unused_name(f"{self.base}/{tag}", self.taken)

    def const(self, tag: str, value: np.ndarray) -> str:
        name = self.fresh(tag)
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(
        self, op_type: str, inputs: list[str], tag: str, *, out: str | None = None, domain: str = "", **attrs
    ) -> str:
        y = out if out is not None else self.fresh(tag)
        self.nodes.append(
            helper.make_node(op_type, inputs, [y], name=self.fresh(f"{tag}_node"), domain=domain, **attrs)
        )
        return y

    # -- forms that changed across opsets --------------------------------------------
    def reduce(
        self, op_type: str, x: str, axes: list[int], tag: str, *, keepdims: int = 1, out: str | None = None
    ) -> str:
        since = {"ReduceMean": 18, "ReduceSum": 13}[op_type]
        if self.opset >= since:
            return self.op(
                op_type,
                [x, self.const(f"{tag}_axes", np.array(axes, np.int64))],
                tag,
                out=out,
                keepdims=keepdims,
            )
        return self.op(op_type, [x], tag, out=out, axes=axes, keepdims=keepdims)

    def unsqueeze(self, x: str, axes: list[int], tag: str) -> str:
        if self.opset >= 13:
            return self.op("Unsqueeze", [x, self.const(f"{tag}_axes", np.array(axes, np.int64))], tag)
        return self.op("Unsqueeze", [x], tag, axes=axes)

    def slice_last(self, x: str, start: int, end: int, tag: str) -> str:
        if self.opset < 10:
            raise _Unsupported("Slice with input bounds needs opset 10")
        starts = self.const(f"{tag}_starts", np.array([start], np.int64))
        ends = self.const(f"{tag}_ends", np.array([end], np.int64))
        axes = self.const(f"{tag}_axes", np.array([-1], np.int64))
        return self.op("Slice", [x, starts, ends, axes], tag)

    def rank(self, name: str) -> int | None:
        """The rank shape inference gave ``name``, or None."""
        shape = self.shapes.get(name)
        return None if shape is None else len(shape)

    def positions(self, t: str, tag: str) -> str:
        """Range(0, Shape(t)[1]): the int64 positions along ``t``'s axis 1 (tokens, keys)."""
        if self.opset < 11:
            raise _Unsupported("positions by Range need opset 11")
        shape = self.op("Shape", [t], f"{tag}_shape")
        length = self.op(
            "Gather", [shape, self.const(f"{tag}_axis", np.array(1, np.int64))], f"{tag}_len", axis=0
        )
        start, step = (
            self.const(f"{tag}_start", np.array(0, np.int64)),
            self.const(f"{tag}_step", np.array(1, np.int64)),
        )
        return self.op("Range", [start, length, step], tag)

    def f32(self, tag: str, value: float) -> str:
        return self.const(tag, np.array(value, np.float32))

    # -- shared pieces -----------------------------------------------------------------
    def layer_norm(
        self,
        x: str,
        gamma: str,
        beta: str | None,
        eps: float,
        tag: str,
        out: str | None,
        axes: tuple[int, ...] = (-1,),
    ) -> str:
        """LayerNormalization over the trailing ``axes`` (negative, consecutive, ending at
        -1) from opset 17 (what the quantizers plan as one group); before, the PyTorch
        export's written-out form (FuseLayerNorm fuses it back into one
        quanta::LayerNormDiv at run time)."""
        if self.opset >= 17 and gamma:
            ins = [x, gamma] + ([beta] if beta else [])
            return self.op("LayerNormalization", ins, f"{tag}_layer_norm", out=out, axis=axes[0], epsilon=eps)
        mean = self.reduce("ReduceMean", x, list(axes), f"{tag}_mean")
        d = self.op("Sub", [x, mean], f"{tag}_centered")
        sq = self.op("Pow", [d, self.f32(f"{tag}_two", 2.0)], f"{tag}_squared")
        var = self.reduce("ReduceMean", sq, list(axes), f"{tag}_var")
        std = self.op(
            "Sqrt", [self.op("Add", [var, self.f32(f"{tag}_eps", eps)], f"{tag}_var_eps")], f"{tag}_std"
        )
        y = self.op("Div", [d, std], f"{tag}_normed", out=out if not gamma and not beta else None)
        if gamma:
            y = self.op("Mul", [y, gamma], f"{tag}_scaled", out=out if not beta else None)
        if beta:
            y = self.op("Add", [y, beta], f"{tag}_shifted", out=out)
        return y

    def rms_norm(self, x: str, gamma: str, eps: float, tag: str, out: str | None) -> str:
        sq = self.op("Pow", [x, self.f32(f"{tag}_two", 2.0)], f"{tag}_squared")
        ms = self.reduce("ReduceMean", sq, [-1], f"{tag}_mean_square")
        rms = self.op(
            "Sqrt", [self.op("Add", [ms, self.f32(f"{tag}_eps", eps)], f"{tag}_ms_eps")], f"{tag}_rms"
        )
        y = self.op("Div", [x, rms], f"{tag}_normed")
        return self.op("Mul", [y, gamma], f"{tag}_scaled", out=out)


def _attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _inp(node: onnx.NodeProto, i: int) -> str:
    return node.input[i] if i < len(node.input) else ""


def _outp(node: onnx.NodeProto, i: int) -> str:
    return node.output[i] if i < len(node.output) else ""


def _read(graph_users: dict[str, int], name: str, graph_outputs: set[str]) -> bool:
    return bool(name) and (graph_users.get(name, 0) > 0 or name in graph_outputs)


# -- one writer per operator ------------------------------------------------------------
def _bias_gelu(w: _Writer) -> None:
    n = w.node
    x = w.op("Add", [n.input[0], n.input[1]], "biased")
    if w.ort_made:
        # a file ONNX Runtime's quantizer wrote computes ORT's functions (as
        # SessionOptions.float_functions "auto" reads it): its own Gelu kernel's bits
        w.op("Gelu", [x], "gelu", out=n.output[0], domain=MS_DOMAIN)
        return
    if w.opset >= 20:
        w.op("Gelu", [x], "gelu", out=n.output[0])
        return
    # the PyTorch export's erf GELU (form A of FuseGelu, which makes it one Gelu at run
    # time; the quantizers know this form)
    e = w.op("Erf", [w.op("Div", [x, w.f32("sqrt2", float(np.float32(np.sqrt(2.0))))], "x_sqrt2")], "erf")
    a = w.op("Add", [e, w.f32("one", 1.0)], "one_plus")
    w.op("Mul", [w.op("Mul", [x, a], "x_gate"), w.f32("half", 0.5)], "gelu", out=n.output[0])


def _fast_gelu(w: _Writer) -> None:
    """ORT's FastGelu kernel (bias_gelu.cc) in its own float32 order, eq. (FG1) of
    docs/float-ops.md: v · f32(f32(f32(C' · v) · v) + B), its tanh, then
    f32(0.5 · v) · f32(t + 1), C' = f32(0.044715 · √(2/π)), B = f32(√(2/π)). Tanh is the
    ONNX one; OrtFloatFunctions makes the chain quanta::OrtFastGelu (MLAS's tanh)."""
    n = w.node
    v = n.input[0]
    if _inp(n, 1):
        v = w.op("Add", [v, n.input[1]], "biased")
    cv = w.op("Mul", [w.f32("c", float(_FAST_GELU_C)), v], "c_v")
    inner = w.op("Add", [w.op("Mul", [cv, v], "c_v_v"), w.f32("b", float(_FAST_GELU_B))], "c_v_v_plus_b")
    t = w.op("Tanh", [w.op("Mul", [v, inner], "tanh_arg")], "tanh")
    half = w.op("Mul", [w.f32("half", 0.5), v], "half_v")
    one_plus = w.op("Add", [t, w.f32("one", 1.0)], "one_plus")
    w.op("Mul", [half, one_plus], "gelu", out=n.output[0])


def _quick_gelu(w: _Writer) -> None:
    n = w.node
    alpha = float(_attr(n, "alpha", 1.702))
    gate = w.op("Sigmoid", [w.op("Mul", [n.input[0], w.f32("alpha", alpha)], "scaled")], "gate")
    w.op("Mul", [n.input[0], gate], "quick_gelu", out=n.output[0])


def _bias_add(w: _Writer) -> None:
    n = w.node
    s = w.op("Add", [n.input[0], n.input[1]], "biased")
    w.op("Add", [s, n.input[2]], "sum", out=n.output[0])


def _skip_sum(w: _Writer, bias: str, users: dict[str, int], outputs: set[str]) -> str:
    n = w.node
    if _read(users, _outp(n, 1), outputs) or _read(users, _outp(n, 2), outputs):
        raise _Unsupported("its mean or inverse standard deviation output is read")
    last = bias == "" and _read(users, _outp(n, 3), outputs)
    s = w.op("Add", [n.input[0], n.input[1]], "skip_sum", out=_outp(n, 3) if last else None)
    if bias:
        s = w.op(
            "Add", [s, bias], "bias_sum", out=_outp(n, 3) if _read(users, _outp(n, 3), outputs) else None
        )
    return s


def _skip_layer_norm(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    n = w.node
    s = _skip_sum(w, _inp(n, 4), users, outputs)
    eps = float(_attr(n, "epsilon", 1e-12))
    w.layer_norm(s, n.input[2], _inp(n, 3) or None, eps, "ln", out=n.output[0])
    w.nodes[-1].doc_string = SKIP_LAYER_NORM_DOC


def _skip_simplified_layer_norm(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    n = w.node
    s = _skip_sum(w, _inp(n, 3), users, outputs)
    eps = float(_attr(n, "epsilon", 1e-12))
    w.rms_norm(s, n.input[2], eps, "rms", out=n.output[0])
    w.nodes[-1].doc_string = SKIP_SIMPLIFIED_LAYER_NORM_DOC


def _simplified_layer_norm(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    n = w.node
    if int(_attr(n, "axis", -1)) != -1 or any(_read(users, o, outputs) for o in n.output[1:]):
        raise _Unsupported("an axis other than -1, or its inverse deviation output is read")
    w.rms_norm(n.input[0], n.input[1], float(_attr(n, "epsilon", 1e-5)), "rms", out=n.output[0])


def _onnx_layer_norm(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    """LayerNormalization (ORT's registration below opset 17): normalized over the axes
    from ``axis`` on."""
    n = w.node
    if any(_read(users, o, outputs) for o in n.output[1:]):
        raise _Unsupported("its Mean or InvStdDev output is read")
    axis = int(_attr(n, "axis", -1))
    rank = w.rank(n.input[0])
    if axis < 0:
        axes = list(range(axis, 0))
    elif rank is not None:
        axes = list(range(axis - rank, 0))
    else:
        raise _Unsupported("a non-negative axis on an input of unknown rank")
    eps = float(_attr(n, "epsilon", 1e-5))
    w.layer_norm(n.input[0], n.input[1], _inp(n, 2) or None, eps, "ln", n.output[0], tuple(axes))


def _experimental(w: _Writer) -> None:
    """ONNX's experimental operators of opsets 1-9, by their definitions."""
    n = w.node
    x, y = n.input[0], n.output[0]
    if n.op_type == "ImageScaler":
        bias = np.asarray(_attr(n, "bias", []), np.float32)
        scaled = w.op(
            "Mul", [x, w.f32("scale", float(_attr(n, "scale", 1.0)))], "scaled", out=None if bias.size else y
        )
        if bias.size:
            w.op("Add", [scaled, w.const("bias", bias.reshape(1, -1, 1, 1))], "shifted", out=y)
    elif n.op_type == "Scale":
        w.op("Mul", [x, w.f32("scale", float(_attr(n, "scale", 1.0)))], "scaled", out=y)
    elif n.op_type == "Affine":
        scaled = w.op("Mul", [x, w.f32("alpha", float(_attr(n, "alpha", 1.0)))], "scaled")
        w.op("Add", [scaled, w.f32("beta", float(_attr(n, "beta", 0.0)))], "shifted", out=y)
    elif n.op_type == "ScaledTanh":
        inner = w.op("Mul", [x, w.f32("beta", float(_attr(n, "beta", 1.0)))], "inner")
        w.op(
            "Mul",
            [w.op("Tanh", [inner], "tanh"), w.f32("alpha", float(_attr(n, "alpha", 1.0)))],
            "scaled",
            out=y,
        )
    elif n.op_type == "ParametricSoftplus":
        inner = w.op("Mul", [x, w.f32("beta", float(_attr(n, "beta", 1.0)))], "inner")
        sp = w.op("Softplus", [inner], "softplus")
        w.op("Mul", [sp, w.f32("alpha", float(_attr(n, "alpha", 1.0)))], "scaled", out=y)
    else:
        raise _Unsupported(f"no form for {n.op_type}")


def _fused_matmul(w: _Writer) -> None:
    n = w.node
    if int(_attr(n, "transBatchA", 0)) or int(_attr(n, "transBatchB", 0)):
        raise _Unsupported("transBatchA / transBatchB")
    a, b = n.input[0], n.input[1]
    for flag, name in (("transA", "a"), ("transB", "b")):
        if int(_attr(n, flag, 0)):
            v = a if name == "a" else b
            r = w.rank(v)
            if r is None or r < 2:
                raise _Unsupported(f"{flag} on an input of unknown rank")
            perm = [*range(r - 2), r - 1, r - 2]
            t = w.op("Transpose", [v], f"{name}_t", perm=perm)
            a, b = (t, b) if name == "a" else (a, t)
    alpha = float(_attr(n, "alpha", 1.0))
    if alpha == 1.0:
        w.op("MatMul", [a, b], "matmul", out=n.output[0])
    else:
        w.op("Mul", [w.op("MatMul", [a, b], "matmul"), w.f32("alpha", alpha)], "scaled", out=n.output[0])


def _activation(w: _Writer, x: str, act: str, params: list[float], out: str) -> None:
    if act == "Relu":
        w.op("Relu", [x], "relu", out=out)
    elif act in ("Tanh", "Sigmoid"):
        w.op(act, [x], act.lower(), out=out)
    elif act == "LeakyRelu":
        w.op("LeakyRelu", [x], "leaky_relu", out=out, alpha=float(params[0]) if params else 0.01)
    elif act == "HardSigmoid":
        alpha, beta = (params + [0.2, 0.5][len(params) :])[:2]
        w.op("HardSigmoid", [x], "hard_sigmoid", out=out, alpha=float(alpha), beta=float(beta))
    elif act == "Clip" and len(params) == 2 and w.opset >= 11:
        w.op("Clip", [x, w.f32("min", params[0]), w.f32("max", params[1])], "clip", out=out)
    else:
        raise _Unsupported(f"activation {act!r}")


def _fused_gemm(w: _Writer) -> None:
    n = w.node
    act = _attr(n, "activation")
    act = act.decode() if isinstance(act, bytes) else act
    attrs = {k: _attr(n, k) for k in ("alpha", "beta", "transA", "transB") if _attr(n, k) is not None}
    y = w.op("Gemm", list(n.input), "gemm", **attrs)
    params = [float(v) for v in (_attr(n, "activation_alpha"), _attr(n, "activation_beta")) if v is not None]
    if not act:
        w.op("Identity", [y], "identity", out=n.output[0])
    else:
        _activation(w, y, act, params, n.output[0])


def _fused_conv(w: _Writer) -> None:
    n = w.node
    act = _attr(n, "activation")
    act = act.decode() if isinstance(act, bytes) else act
    attrs = {}
    for a in n.attribute:
        if a.name in ("activation", "activation_params"):
            continue
        attrs[a.name] = helper.get_attribute_value(a)
    y = w.op("Conv", [n.input[0], n.input[1]] + ([n.input[2]] if _inp(n, 2) else []), "conv", **attrs)
    if _inp(n, 3):
        y = w.op("Add", [y, n.input[3]], "sum")
    params = [float(v) for v in (_attr(n, "activation_params") or [])]
    if not act:
        w.op("Identity", [y], "identity", out=n.output[0])
    else:
        _activation(w, y, act, params, n.output[0])


def _embed(
    w: _Writer,
    ids: str,
    seg_ids: str,
    word: str,
    pos: str,
    seg: str,
    gamma: str,
    beta: str,
    mask: str,
    pos_ids: str,
    eps: float,
    out: str,
    mask_out: str,
    sum_out: str,
) -> None:
    x = w.op("Gather", [word, ids], "word")
    if pos_ids:
        p = w.op("Gather", [pos, pos_ids], "position")
    else:
        p = w.op("Gather", [pos, w.positions(ids, "positions")], "position")
    total = w.op("Add", [x, p], "word_position", out=None)
    if seg and seg_ids:
        total = w.op("Add", [total, w.op("Gather", [seg, seg_ids], "segment")], "embedding_sum")
    if sum_out:
        total = w.op("Identity", [total], "embedding_sum_out", out=sum_out)
    w.layer_norm(total, gamma, beta, eps, "ln", out=out)
    if mask_out:
        if mask:
            m = w.op("Cast", [mask], "mask_int", to=TensorProto.INT32)
            w.reduce("ReduceSum", m, [1], "mask_index", keepdims=0, out=mask_out)
        else:
            shape = w.op("Shape", [ids], "ids_shape_mask")
            batch = (
                w.op(
                    "Slice",
                    [shape, w.const("b0", np.array([0], np.int64)), w.const("b1", np.array([1], np.int64))],
                    "batch",
                )
                if w.opset >= 10
                else None
            )
            if batch is None:
                raise _Unsupported("a mask index without a mask needs opset 10")
            w.op(
                "ConstantOfShape",
                [batch],
                "mask_index_zeros",
                out=mask_out,
                value=numpy_helper.from_array(np.zeros(1, np.int32)),
            )


def _embed_layer_norm(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    n = w.node
    eps = float(_attr(n, "epsilon", 1e-12))
    mask_out = _outp(n, 1) if _read(users, _outp(n, 1), outputs) else ""
    sum_out = _outp(n, 2) if _read(users, _outp(n, 2), outputs) else ""
    _embed(
        w,
        n.input[0],
        _inp(n, 1),
        n.input[2],
        n.input[3],
        _inp(n, 4),
        n.input[5],
        n.input[6],
        _inp(n, 7),
        _inp(n, 8),
        eps,
        n.output[0],
        mask_out,
        sum_out,
    )


def _q_embed_layer_norm(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    n = w.node

    def deq(q: int, s: int, z: int, tag: str) -> str:
        if not _inp(n, q):
            return ""
        ins = [n.input[q], n.input[s]] + ([n.input[z]] if _inp(n, z) else [])
        return w.op("DequantizeLinear", ins, tag)

    word = deq(2, 8, 13, "word_table")
    pos = deq(3, 9, 14, "position_table")
    seg = deq(4, 10, 15, "segment_table") if _inp(n, 4) else ""
    gamma = deq(5, 11, 16, "gamma")
    beta = deq(6, 12, 17, "beta")
    eps = float(_attr(n, "epsilon", 1e-12))
    mask_out = _outp(n, 1) if _read(users, _outp(n, 1), outputs) else ""
    _embed(
        w, n.input[0], _inp(n, 1), word, pos, seg, gamma, beta, _inp(n, 7), "", eps, n.output[0], mask_out, ""
    )


def _attention_core(w: _Writer, qkv: str, hidden: list[int], heads: int, mask: str, bias: str) -> None:
    """From the projected [B, S, Hq + Hk + Hv]: Q, K and V, then :func:`_heads_attention`."""
    hq, hk, hv = hidden
    if hq != hk or hq % heads or hv % heads:
        raise _Unsupported(f"hidden sizes {hidden} do not split into {heads} heads")
    q = w.slice_last(qkv, 0, hq, "q")
    k = w.slice_last(qkv, hq, hq + hk, "k")
    v = w.slice_last(qkv, hq + hk, hq + hk + hv, "v")
    _heads_attention(w, q, k, v, hq // heads, heads, mask, bias)


def _heads_attention(w: _Writer, q: str, k: str, v: str, head: int, heads: int, mask: str, bias: str) -> None:
    """Q [B, S, N·h], K [B, L, N·h], V [B, L, N·hv]: heads, scores, mask, softmax, context."""
    n = w.node
    split = w.const("heads_shape", np.array([0, 0, heads, -1], np.int64))
    qh = w.op("Transpose", [w.op("Reshape", [q, split], "q_heads")], "q_t", perm=[0, 2, 1, 3])
    kh = w.op("Transpose", [w.op("Reshape", [k, split], "k_heads")], "k_t", perm=[0, 2, 3, 1])
    vh = w.op("Transpose", [w.op("Reshape", [v, split], "v_heads")], "v_t", perm=[0, 2, 1, 3])
    scale = _attr(n, "scale")
    scale = float(scale) if scale not in (None, 0.0) else float(1.0 / np.sqrt(head))
    scores = w.op("Mul", [w.op("MatMul", [qh, kh], "qk"), w.f32("scale", scale)], "scores")
    filt = float(_attr(n, "mask_filter_value", -10000.0))
    added = ""
    if mask:
        rank = w.rank(mask)
        if rank == 2 or rank == 3:
            keep = w.op("Greater", [mask, w.const("mask_zero", np.array(0, np.int32))], "mask_keep")
            add = w.op("Where", [keep, w.f32("no_filter", 0.0), w.f32("filter", filt)], "mask_add")
            added = w.unsqueeze(add, [1, 2] if rank == 2 else [1], "mask_bias")
        elif rank == 1 and not _two_per_row(w, mask):
            rng = w.positions(k, "key_pos")
            ends = w.unsqueeze(w.op("Cast", [mask], "mask_ends", to=TensorProto.INT64), [1], "ends_col")
            keep = w.op("Less", [w.unsqueeze(rng, [0], "key_row"), ends], "mask_keep")
            add = w.op("Where", [keep, w.f32("no_filter", 0.0), w.f32("filter", filt)], "mask_add")
            added = w.unsqueeze(add, [1, 2], "mask_bias")
        else:
            raise _Unsupported(
                f"a mask index of rank {rank}: only [batch] end positions and raw 2-D / 3-D masks"
            )
    if int(_attr(n, "unidirectional", 0)):
        positions = [w.positions(q, "causal_queries"), w.positions(k, "causal_keys")]
        future = w.op(
            "Greater",
            [
                w.unsqueeze(positions[1], [0], "causal_keys_row"),
                w.unsqueeze(positions[0], [1], "causal_queries_col"),
            ],
            "future",
        )
        causal = w.op(
            "Where", [future, w.f32("causal_filter", filt), w.f32("causal_none", 0.0)], "causal_add"
        )
        added = w.op("Add", [added, causal], "masks") if added else causal
    if added:
        scores = w.op("Add", [scores, added], "masked_scores")
    if bias:
        scores = w.op("Add", [scores, bias], "biased_scores")
    probs = w.op("Softmax", [scores], "probs", axis=-1 if w.opset >= 13 else 3)
    ctx = w.op("Transpose", [w.op("MatMul", [probs, vh], "context_heads")], "context_t", perm=[0, 2, 1, 3])
    w.op("Reshape", [ctx, w.const("merge_shape", np.array([0, 0, -1], np.int64))], "context", out=n.output[0])


def _two_per_row(w: _Writer, mask: str) -> bool:
    """A 1-D mask index of [2·batch] (end and start positions), not [batch]."""
    m, x = w.shapes.get(mask), w.shapes.get(w.node.input[0])
    return bool(m and x and m[0] is not None and x[0] is not None and m[0] == 2 * x[0] != x[0])


def _attention_hidden(w: _Writer, weight: str) -> list[int]:
    n = w.node
    sizes = _attr(n, "qkv_hidden_sizes")
    if sizes:
        return [int(s) for s in sizes]
    wshape = w.shapes.get(weight)
    if wshape is None or len(wshape) != 2 or not isinstance(wshape[1], int) or wshape[1] % 3:
        raise _Unsupported("weights of unknown width")
    return [wshape[1] // 3] * 3


def _attention_checks(w: _Writer, users: dict[str, int], outputs: set[str], past: int) -> None:
    n = w.node
    if _inp(n, past) or _read(users, _outp(n, 1), outputs):
        raise _Unsupported("a past state or a present output")
    if int(_attr(n, "do_rotary", 0)):
        raise _Unsupported("rotary embeddings")


def _attention(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    n = w.node
    _attention_checks(w, users, outputs, 4)
    if _inp(n, 6):
        raise _Unsupported("past_sequence_length")
    hidden = _attention_hidden(w, n.input[1])
    qkv = w.op("MatMul", [n.input[0], n.input[1]], "qkv")
    if _inp(n, 2):
        qkv = w.op("Add", [qkv, n.input[2]], "qkv_bias")
    _attention_core(w, qkv, hidden, int(_attr(n, "num_heads")), _inp(n, 3), _inp(n, 5))


def _q_attention(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    n = w.node
    _attention_checks(w, users, outputs, 8)
    hidden = _attention_hidden(w, n.input[1])
    ins = [n.input[0], n.input[1], _inp(n, 6), _inp(n, 7)]
    while ins and not ins[-1]:
        ins.pop()
    acc = w.op("MatMulInteger", ins, "qkv_int")
    scale = w.op("Mul", [n.input[3], n.input[4]], "qkv_scale")
    qkv = w.op("Mul", [w.op("Cast", [acc], "qkv_acc", to=TensorProto.FLOAT), scale], "qkv_dequantized")
    qkv = w.op("Add", [qkv, n.input[2]], "qkv_bias")
    _attention_core(w, qkv, hidden, int(_attr(n, "num_heads")), _inp(n, 5), "")


def _multi_head_attention(w: _Writer, users: dict[str, int], outputs: set[str]) -> None:
    """MultiHeadAttention of separate 3-D query, key and value (BSNH unpacked), with their
    optional bias [D + D + Dv], key padding mask and attention bias; no past state."""
    n = w.node
    if any(_inp(n, i) for i in (6, 7, 8, 9)) or any(_read(users, o, outputs) for o in n.output[1:]):
        raise _Unsupported("a past state, a present or qk output")
    q, k, v = n.input[0], _inp(n, 1), _inp(n, 2)
    if not (k and v) or any(w.rank(t) != 3 for t in (q, k, v)):
        raise _Unsupported("packed or 4-D query / key / value (only separate 3-D inputs)")
    heads = int(_attr(n, "num_heads"))
    dq, dk, dv = (w.shapes[t][2] for t in (q, k, v))
    if not all(isinstance(d, int) for d in (dq, dk, dv)) or dq != dk or dq % heads or dv % heads:
        raise _Unsupported(f"widths {dq}, {dk}, {dv} do not split into {heads} heads")
    if _inp(n, 3):
        q = w.op("Add", [q, w.slice_last(n.input[3], 0, dq, "q_bias")], "q_biased")
        k = w.op("Add", [k, w.slice_last(n.input[3], dq, 2 * dq, "k_bias")], "k_biased")
        v = w.op("Add", [v, w.slice_last(n.input[3], 2 * dq, 2 * dq + dv, "v_bias")], "v_biased")
    _heads_attention(w, q, k, v, dq // heads, heads, _inp(n, 4), _inp(n, 5))


_SIMPLE = {
    "BiasGelu": _bias_gelu,
    "FastGelu": _fast_gelu,
    "QuickGelu": _quick_gelu,
    "BiasAdd": _bias_add,
    "FusedMatMul": _fused_matmul,
    "FusedGemm": _fused_gemm,
    "FusedConv": _fused_conv,
}
_WITH_USES = {
    "SkipLayerNormalization": _skip_layer_norm,
    "SkipSimplifiedLayerNormalization": _skip_simplified_layer_norm,
    "EmbedLayerNormalization": _embed_layer_norm,
    "QEmbedLayerNormalization": _q_embed_layer_norm,
    "Attention": _attention,
    "QAttention": _q_attention,
    "MultiHeadAttention": _multi_head_attention,
}


#: operators of the ai.onnx domain that ONNX Runtime runs and this module writes out:
#: its own registrations and ONNX's experimental operators (no schema at the opset)
_ONNX_DOMAIN = frozenset(
    {"SimplifiedLayerNormalization", "ImageScaler", "Scale", "Affine", "ScaledTanh", "ParametricSoftplus"}
)


def _is_contrib(node: onnx.NodeProto, opset: int) -> bool:
    if node.domain == MS_DOMAIN:
        return node.op_type in HANDLED
    if node.domain not in ("", "ai.onnx"):
        return False
    return node.op_type in _ONNX_DOMAIN or (node.op_type == "LayerNormalization" and opset < 17)


def decompose_contrib_ops(proto: onnx.ModelProto) -> list[tuple[str, str, str]]:
    """Rewrites, in place, the main graph's ONNX Runtime fused operators listed in the
    module docstring; (node, op, why) for each one left as it is."""
    graph = proto.graph
    opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 1)
    left: list[tuple[str, str, str]] = []
    # rounds: an Attention reads the mask index an EmbedLayerNormalization writes, whose
    # rank is known once that node is written out and shapes are inferred again
    for _ in range(3):
        if not any(_is_contrib(n, opset) for n in graph.node):
            break
        left, changed = _decompose_round(proto, opset)
        if not changed:
            break
    return left


def _value_shapes(proto: onnx.ModelProto) -> dict[str, list]:
    try:
        inferred = onnx.shape_inference.infer_shapes(without_weight_data(proto), strict_mode=False)
    except Exception:  # shapes are hints here: a node that needs one it lacks stays
        inferred = proto
    shapes: dict[str, list] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input) + list(inferred.graph.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else None for d in t.shape.dim]
    for t in proto.graph.initializer:
        shapes[t.name] = list(t.dims)
    return shapes


def _decompose_round(proto: onnx.ModelProto, opset: int) -> tuple[list[tuple[str, str, str]], bool]:
    graph = proto.graph
    shapes = _value_shapes(proto)
    taken = {n.name for n in graph.node} | {o for n in graph.node for o in n.output}
    taken |= {t.name for t in graph.initializer} | {i.name for i in graph.input}
    users: dict[str, int] = {}
    for n in graph.node:
        for i in n.input:
            users[i] = users.get(i, 0) + 1
        for a in n.attribute:  # a subgraph's reads of outer values
            if a.type == onnx.AttributeProto.GRAPH:
                for sub in a.g.node:
                    for i in sub.input:
                        users[i] = users.get(i, 0) + 1
    outputs = {o.name for o in graph.output}
    ort_made = proto.producer_name == ORT_QUANTIZER_PRODUCER
    left: list[tuple[str, str, str]] = []
    new_nodes: list[onnx.NodeProto] = []
    changed = False
    for node in graph.node:
        if not _is_contrib(node, opset):
            new_nodes.append(node)
            continue
        w = _Writer(node, opset, taken, shapes, ort_made)
        try:
            if node.op_type == "SimplifiedLayerNormalization":
                _simplified_layer_norm(w, users, outputs)
            elif node.op_type == "LayerNormalization":
                _onnx_layer_norm(w, users, outputs)
            elif node.domain in ("", "ai.onnx"):
                _experimental(w)
            elif node.op_type in _SIMPLE:
                _SIMPLE[node.op_type](w)
            else:
                _WITH_USES[node.op_type](w, users, outputs)
        except _Unsupported as e:
            left.append((node.name, node.op_type, str(e)))
            new_nodes.append(node)
            continue
        changed = True
        new_nodes.extend(w.nodes)
        graph.initializer.extend(w.inits)
        if proto.ir_version < 4:  # IR 3: every initializer is also a graph input
            graph.input.extend(
                helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in w.inits
            )
    del graph.node[:]
    graph.node.extend(new_nodes)
    return left, changed
