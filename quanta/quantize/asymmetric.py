"""Weight rounding against the FP32 layer outputs from the quantized model's own inputs
(``weight_rounding="gptaq"``; docs/debugger.md eqs. (12g)-(12j)).

GPTQ (quanta.quantize.rounding, eq. (12)) chooses a layer's integers for
‖(W − Ŵ) x_int‖², the layer's own error on its quantized input: W and Ŵ see the same
input. In the quantized model a layer's input already carries the error of every
quantized layer and activation before it, x_q = x_fp + ε. Asymmetric calibration
(GPTAQ, Li et al. 2025; QDrop / BRECQ's reconstruction targets) fits the integers for

    ‖W X_fp − Ŵ X_q‖²                                                          (12g)

so the weights compensate part of the error their input arrives with. With
H = X_q X_qᵀ and C = X_fp X_qᵀ, the least-squares weights (ridge-damped towards W)

    W* = (W C + λ W)(H + λ I)⁻¹                                                (12h)

satisfy the normal equations of (12g), so for every Ŵ the cross term vanishes and
‖W X_fp − Ŵ X_q‖² = ‖(W* − Ŵ) X_q‖² + const (exactly at λ = 0): GPTQ on W* with H
minimises (12g). The layers are solved in graph order, one pass over the calibration
data each: the pass runs the FP32 model and the quantized model as it stands (the
integers already solved, GPTQ's for the rest), each only up to the layer's input. Per
output row, the solution is kept only where, fitted on the even-numbered samples, it
beats GPTQ fitted on the same samples on the odd-numbered ones (eq. (12i), (12c)'s check
with (12g) as the loss). With bias correction, each corrected bias takes the output's
mean error against the same target (eq. (12j)).

The statistics are float64 sums over the samples in their order, in this process: the
same data gives the same file (the sharded engines do not run this pass).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from quanta.quantize.rounding import RoundedLayer, chosen_weights, conv_rows, gptq_round_groups

if TYPE_CHECKING:
    from quanta.ir.graph import Model
    from quanta.quantize.qdq import QdqPlan
    from quanta.quantize.recipe import Recipe

__all__ = ["PairedLayer", "asymmetric_targets", "reconstruct"]

#: λ of eq. (12h) as a share of mean(diag H). 1.0, not GPTQ's 0.01: W* is fitted on as
#: many rows as the calibration data has (an FC layer of K = 1280 on 100 images, MiniLM's
#: K = 1536 on ~2000 tokens), and at 0.01 it fits their noise (MiniLM 0.9947 mean cosine
#: against the defaults' 0.9971; EfficientNet-Lite0 0.935 / 27.40 dB against 0.950 /
#: 27.53 at 1.0; benchmarks/results/2026-12-04h-acc13h.md)
RIDGE = 1.0


class PairedLayer:
    """One Conv / Gemm / MatMul's paired statistics over the calibration samples: per half
    (even, odd samples) H = Σ x_q x_qᵀ and C = Σ x_fp x_qᵀ, [G, K, K], and over all samples
    the sums of x_fp and x_q, [G, K] (x: the layer's im2col rows, as RoundedLayer's)."""

    def __init__(self, node: Any, w: np.ndarray, fp_name: str, q_name: str) -> None:
        # RoundedLayer's geometry (im2col order, groups, K) without its integer statistics
        self.shape = RoundedLayer(node, fp_name, "", w)
        self.fp_name, self.q_name = fp_name, q_name
        g, k = self.shape.groups, self.shape.k
        self.h = np.zeros((2, g, k, k))
        self.c = np.zeros((2, g, k, k))
        self.sum_fp = np.zeros((g, k))
        self.sum_q = np.zeros((g, k))
        self.rows = 0
        self.calls = 0

    def cols(self, x: np.ndarray) -> np.ndarray:
        """The layer's input rows, [G, K, P] float64 (im2col of a Conv, zero padding)."""
        s = self.shape
        g, k = s.groups, s.k
        x = np.asarray(x, np.float64)
        if s.op != "Conv":
            return x.reshape(-1, k).T[None]
        kh, kw = s.kernel
        sh, sw = [*s.attrs.get("strides", [1, 1]), 1, 1][:2]
        pads = list(s.attrs.get("pads", [0, 0, 0, 0]))
        if (kh, kw, sh, sw) == (1, 1, 1, 1) and not any(pads):  # a pointwise Conv: no copies
            return x.transpose(1, 0, 2, 3).reshape(g, k, -1)
        out = [conv_rows(sample, (kh, kw), (sh, sw), pads).reshape(g, k, -1) for sample in x]
        return out[0] if len(out) == 1 else np.concatenate(out, axis=2)

    def observe(self, x_fp: np.ndarray, x_q: np.ndarray) -> None:
        f, q = self.cols(x_fp), self.cols(x_q)
        half = self.calls % 2
        qt = q.transpose(0, 2, 1)
        self.h[half] += np.matmul(q, qt)
        self.c[half] += np.matmul(f, qt)
        self.sum_fp += f.sum(axis=2)
        self.sum_q += q.sum(axis=2)
        self.rows += q.shape[2]
        self.calls += 1


def asymmetric_targets(w: np.ndarray, h: np.ndarray, c: np.ndarray, damp: float | None = None) -> np.ndarray:
    """Eq. (12h): W* = (W C + λ W)(H + λ I)⁻¹ per group (``w`` [G, rows, K], ``h`` and ``c``
    [G, K, K]), λ = ``damp``·mean(diag H) (default :data:`RIDGE`); a group whose H is all zero
    (an input that never varies) keeps W."""
    damp = RIDGE if damp is None else damp
    w = np.asarray(w, np.float64)
    out = w.copy()
    k = h.shape[-1]
    for i in range(len(h)):
        diag = np.diagonal(h[i])
        if not np.any(diag > 0):
            continue
        lam = damp * float(np.mean(diag))
        a = h[i] + lam * np.eye(k)
        b = w[i] @ c[i] + lam * w[i]  # [rows, K]
        try:
            out[i] = np.linalg.solve(a, b.T).T  # A is symmetric: W* A = B
        except np.linalg.LinAlgError:
            continue
    return out


def _loss(w: np.ndarray, wq: np.ndarray, h: np.ndarray, c: np.ndarray) -> np.ndarray:
    """Eq. (12g) per row, less its constant ‖W X_fp‖²: Ŵ H Ŵᵀ − 2 W C Ŵᵀ ([G, rows])."""
    return np.einsum("grk,grk->gr", np.matmul(wq, h) - 2 * np.matmul(w, c), wq)


def solve(
    layer: PairedLayer, w2: np.ndarray, s: np.ndarray, codes: np.ndarray, qmin: int, qmax: int
) -> np.ndarray:
    """The layer's integers by eqs. (12h) + GPTQ, kept per row where eq. (12i) says so
    (else ``codes``, the integers it has). ``w2`` [rows, K] float weights, ``s`` [rows]
    scales, ``codes`` [rows, K]."""
    g = layer.shape.groups
    rows, k = w2.shape
    w = w2.reshape(g, rows // g, k)
    sg = s.reshape(g, -1)
    h, c = layer.h.sum(axis=0), layer.c.sum(axis=0)
    new = gptq_round_groups(asymmetric_targets(w, h, c), sg, h, qmin, qmax)
    old = codes.reshape(g, rows // g, k).astype(np.float64)
    if layer.calls < 2:
        return new.reshape(rows, k)
    # eq. (12i): fitted on the even samples, each way; compared on the odd ones
    he, ce, ho, co = layer.h[0], layer.c[0], layer.h[1], layer.c[1]
    fit_asym = gptq_round_groups(asymmetric_targets(w, he, ce), sg, he, qmin, qmax)
    fit_sym = gptq_round_groups(w, sg, he, qmin, qmax)
    s3 = sg[..., None]
    wins = _loss(w, s3 * fit_asym, ho, co) < _loss(w, s3 * fit_sym, ho, co)
    return np.where(wins[..., None], new, old).reshape(rows, k)


def clone_with_qdq(model: Model, plan: QdqPlan) -> tuple[Model, dict[int, Any]]:
    """A copy of the float ``model`` with ``plan``'s Q/DQ inserted as the file will have
    them (the plan's parameters, integers and corrected biases), and the copy's node for
    each of ``model``'s top-level nodes (by id)."""
    from quanta.ir.onnx_io import from_proto, to_proto
    from quanta.quantize.qdq import QdqPlan, insert_qdq

    alt = from_proto(to_proto(model))
    src, dst = model.graph.nodes, alt.graph.nodes
    assert [n.name for n in src] == [n.name for n in dst]
    where = {id(n): dst[i] for i, n in enumerate(src)}
    tensors = {k: dataclasses.replace(t) for k, t in plan.tensors.items()}
    decisions = [
        dataclasses.replace(d, node=where[id(d.node)], inputs=list(d.inputs))
        for d in plan.decisions
        if id(d.node) in where
    ]
    insert_qdq(alt.graph, QdqPlan(tensors, decisions))
    _fold_constant_dq(alt)
    return alt, where


def _prefix(model: Model, name: str) -> Model | None:
    """``model`` cut down to what computes value ``name`` (its only output), in place;
    None when ``name`` is a graph input (the feed has it)."""
    from quanta.passes.rules.eliminate_dead import EliminateDead

    graph = model.graph
    if any(v.name == name for v in graph.inputs):
        return None
    graph.set_outputs([graph.value(name)])
    EliminateDead().call(graph)
    return model


def _fold_constant_dq(model: Model) -> None:
    """Replace every DequantizeLinear of constants (the weights' and biases') by its
    float value, in place: the same float32 numbers, and the layers then run on the float
    kernels for constant weights (with DQ outputs as weights the executor takes the
    reference convolution: 78 s of the passes' 140 s of execution on 10
    EfficientNet-Lite0 images, profiled)."""
    from quanta.kernels.reference.quantize import dequantize_linear

    graph = model.graph
    for node in list(graph.nodes):
        if node.op_type != "DequantizeLinear" or not all(v is None or v.is_const for v in node.inputs):
            continue
        x, s, z = [*node.inputs, None][:3]
        rank = np.asarray(x.const).ndim
        axis = int(node.attrs.get("axis", 1))
        block = int(node.attrs.get("block_size", 0)) or None
        per_axis = np.asarray(s.const).size > 1
        arr = dequantize_linear(
            np.asarray(x.const),
            np.asarray(s.const),
            None if z is None else np.asarray(z.const),
            axis=(axis % rank) if per_axis else None,
            block=block,
        )
        out = node.outputs[0]
        const = graph.add_initializer(graph.fresh_name(out.name), arr.astype(np.asarray(s.const).dtype))
        graph.replace_all_uses(out, const)
        graph.remove_node(node)
    graph.remove_unused_initializers()


def reconstruct(model: Model, plan: QdqPlan, recipe: Recipe, feeds: Callable[[], Any]) -> int:
    """Eqs. (12g)-(12j) for every layer GPTQ rounded (``TensorPlan.codes`` set), after
    resolve_params, GPTQ and bias correction, before insert_qdq: the chosen integers go
    into ``TensorPlan.codes`` and corrected biases into ``TensorPlan.values``. ``feeds()``
    iterates the calibration feeds (complete, with the graph's default inputs). Returns
    the number of layers solved.

    One pass over the data per layer, in graph order: each layer's X_q comes from the
    quantized model with every earlier layer's new integers. (Layers solved together on
    the inputs of one quantized model each make up for the same error and their
    corrections add up: on EfficientNet-Lite0, 8 layers a pass let the activations'
    error grow 3x along the network.) Each pass runs only the part of either model that
    computes the layer's input."""
    from threadpoolctl import threadpool_limits

    from quanta.calibrate.runner import compile_executor
    from quanta.ir.onnx_io import from_proto, to_proto

    graph = model.graph
    by_name = {v.name: v for v in graph.values()}
    jobs = []  # (decision, weight plan, weight, weight [rows, K], scale [rows], grid)
    for d, t, w_v, grid in chosen_weights(model, plan, recipe):
        w = np.asarray(w_v.const, np.float64)
        shape = RoundedLayer(d.node, "", "", w)
        w2 = shape.rows_2d(w)
        scale = np.asarray(t.qtype.scale_array(), np.float64).reshape(-1)
        if scale.size == 1:
            scale = np.full(w2.shape[0], scale[0])
        elif scale.size != w2.shape[0]:
            continue
        jobs.append((d, t, w, w2, scale, grid))
    solved = 0
    for d, t, w, w2, scale, (qmin, qmax) in jobs:
        alt, where = clone_with_qdq(model, plan)
        x_fp = d.node.inputs[0].name
        x_q = where[id(d.node)].inputs[0].name
        layer = PairedLayer(d.node, w, x_fp, x_q)
        fp_model = _prefix(from_proto(to_proto(model)), x_fp)
        q_model = _prefix(alt, x_q)
        fp_exe = None if fp_model is None else compile_executor(fp_model)
        q_exe = None if q_model is None else compile_executor(q_model)
        with threadpool_limits(limits=1, user_api="blas"):
            for feed in feeds():
                a = feed[x_fp] if fp_exe is None else fp_exe.run(feed, [x_fp])[0]
                b = feed[x_q] if q_exe is None else q_exe.run(feed, [x_q])[0]
                layer.observe(a, b)
        if layer.rows == 0:
            continue
        shape = layer.shape
        codes2 = shape.rows_2d(np.asarray(t.codes))
        new = solve(layer, w2, scale, codes2, qmin, qmax)
        t.codes = shape.from_2d(new, w.shape).astype(t.codes.dtype)
        if recipe.bias_correction:
            _correct_bias(d, plan, by_name, layer, w2, scale[:, None] * new)
        solved += 1
    return solved


def _correct_bias(
    d: Any, plan: QdqPlan, by_name: dict, layer: PairedLayer, w2: np.ndarray, wq: np.ndarray
) -> None:
    """Eq. (12j): b' = b + W E[x_fp] − Ŵ E[x_q] per output channel (the means of the
    im2col rows: zero padding counts as it is computed); a Gemm only with alpha = beta = 1."""
    roles = dict(d.inputs)
    node = d.node
    if 2 not in roles or node.op_type not in ("Conv", "Gemm"):
        return
    if node.op_type == "Gemm" and (node.attrs.get("alpha", 1.0) != 1.0 or node.attrs.get("beta", 1.0) != 1.0):
        return
    b_t = plan.tensors[roles[2]]
    b_v = by_name.get(b_t.name)
    if b_t.qtype is None or b_v is None or b_v.const is None:
        return
    b = np.asarray(b_v.const, np.float64)
    g = layer.shape.groups
    rows, k = w2.shape
    m_fp = layer.sum_fp / layer.rows  # [G, K]
    m_q = layer.sum_q / layer.rows
    shift = np.einsum("grk,gk->gr", w2.reshape(g, rows // g, k), m_fp) - np.einsum(
        "grk,gk->gr", wq.reshape(g, rows // g, k), m_q
    )
    if b.shape != (rows,):
        return
    b_t.values = (b + shift.reshape(rows)).astype(b_v.const.dtype)
