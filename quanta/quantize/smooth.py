"""SmoothQuant-style activation/weight balancing (Xiao et al., 2023, "SmoothQuant",
eq. (4); docs/debugger.md eq. (13)).

A per-tensor activation scale is set by the channels with the largest values: in a
transformer's FFN down-projection input (the GELU output) a few channels reach ~25
while the rest stay near 0.3, so those get a handful of levels. With a per-channel
factor s_k the layer is unchanged, y = (x / s) · (diag(s) W), and::

    s_k = max|x_k|^α / max_n |W[k, n]|^(1 − α)         (α = ``alpha``, the recipe default 0.8)

evens out the activation channels, moving the range into the weights, which are
quantized per output channel and absorb it. The division is folded into the constant
of the Mul that produces x (the last multiplication of an Erf-form GELU, x·0.5), so the
graph gains no node; its output is renamed ``x_smooth`` (it holds x / s, not x). With ``insert`` every other x read by such layers (a LayerNorm
output that the residual stream also reads, an attention context) gets a float
``Mul(x, 1/s)`` of its own in front of those layers, as NNCF's SmoothQuant does; the
other readers of x keep x. Either Mul stays float in quantize_static (its inputs still
carry the outliers; it is elementwise: no MACs).

The factors are clipped to [q₁₀(s), 100] (q₁₀ the 10th percentile over the channels),
NNCF's rule: channels that never carry large values are not scaled up without limit.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import FloatType

__all__ = ["SmoothSite", "apply_smoothing", "plan_smoothing"]


class SmoothSite:
    """One activation x = Mul(a, c) read only by MatMul / Gemm layers with constant
    weights (``mul`` set), or any float x that such layers read (``mul`` None: a Mul is
    inserted for them); ``absmax`` collects max |x_k| per channel (last axis) during
    calibration."""

    def __init__(self, x: Value, mul: Node | None, const_index: int, consumers: list[Node]) -> None:
        self.x = x
        self.mul = mul
        self.const_index = const_index
        self.consumers = consumers
        self.absmax: np.ndarray | None = None
        # max |x_k| over the even and over the odd calibration feeds (eq. (13c))
        self.halves: list[np.ndarray | None] = [None, None]
        self.seen = 0

    def observe(self, arr: np.ndarray) -> None:
        a = np.abs(np.asarray(arr, np.float64)).reshape(-1, arr.shape[-1]).max(axis=0)
        self.absmax = a if self.absmax is None else np.maximum(self.absmax, a)
        h = self.halves[self.seen % 2]
        self.halves[self.seen % 2] = a if h is None else np.maximum(h, a)
        self.seen += 1

    def unstable_share(self) -> float:
        """Eq. (13c): the share of channels whose maxima over the even and the odd
        calibration feeds differ by more than ``UNSTABLE_RATIO`` (or are 0 in both);
        0 with fewer than two feeds (nothing to compare)."""
        even, odd = self.halves
        if even is None or odd is None:
            return 0.0
        lo, hi = np.minimum(even, odd), np.maximum(even, odd)
        return float(np.mean((hi > UNSTABLE_RATIO * lo) | (hi == 0)))


def _weight_rows(node: Node) -> np.ndarray | None:
    """The consumer's weight as [K, N] (a view for MatMul / Gemm without transB)."""
    w = node.inputs[1].const if len(node.inputs) > 1 and node.inputs[1] is not None else None
    if w is None or np.asarray(w).ndim != 2:
        return None
    w = np.asarray(w)
    return w.T if node.op_type == "Gemm" and node.attrs.get("transB", 0) else w


def _smoothable(u: Node, x: Value, op_types: frozenset[str]) -> bool:
    return (
        u.op_type in ("MatMul", "Gemm")
        and u.op_type in op_types
        and u.inputs[0] is x
        and not (u.op_type == "Gemm" and u.attrs.get("transA", 0))
        and _weight_rows(u) is not None
    )


def plan_smoothing(graph: Graph, op_types: frozenset[str], *, insert: bool = False) -> list[SmoothSite]:
    """The activations SmoothQuant balances: those it can balance without adding a node,
    and with ``insert`` every other float input of MatMul / Gemm layers with constant
    weights (module docstring)."""
    sites: list[SmoothSite] = []
    for mul in graph.nodes:
        if mul.op_type != "Mul" or len(mul.inputs) != 2 or mul.outputs[0] in graph.outputs:
            continue
        consts = [i for i, v in enumerate(mul.inputs) if v is not None and v.is_const]
        if len(consts) != 1:
            continue
        c = np.asarray(mul.inputs[consts[0]].const)
        if c.dtype.kind != "f" or (c.size != 1 and c.ndim != 1):
            continue
        x = mul.outputs[0]
        users = x.consumers()
        if not users or any(
            u.op_type not in ("MatMul", "Gemm")
            or u.op_type not in op_types
            or u.inputs[0] is not x
            or (u.op_type == "Gemm" and u.attrs.get("transA", 0))
            or _weight_rows(u) is None
            for u in users
        ):
            continue
        k = _weight_rows(users[0]).shape[0]
        if any(_weight_rows(u).shape[0] != k for u in users) or (c.size != 1 and c.size != k):
            continue
        sites.append(SmoothSite(x, mul, consts[0], users))
    if not insert:
        return sites
    done = {id(site.x) for site in sites}
    candidates = [*graph.inputs, *(v for n in graph.nodes for v in n.outputs)]
    for x in candidates:
        if id(x) in done or x.is_const or not isinstance(x.elem, FloatType) or x.elem.name != "f32":
            continue
        users = [u for u in x.consumers() if _smoothable(u, x, op_types)]
        if not users:
            continue
        k = _weight_rows(users[0]).shape[0]
        users = [u for u in users if _weight_rows(u).shape[0] == k]
        sites.append(SmoothSite(x, None, -1, users))
    return sites


# a site whose largest channel maximum is under this many times the median one is left
# alone: its per-tensor grid already serves most channels (eq. (13b))
MIN_SPREAD = 4.0
# eq. (13c): a site is balanced only when its channel maxima are reproducible: at most
# MAX_UNSTABLE of the channels have even-feed and odd-feed maxima more than UNSTABLE_RATIO
# apart. A transformer's LayerNorm / GELU outputs: 0.00-0.24 (all-MiniLM-L6-v2, 16
# sentences); a Siamese network's |e1 - e2| and the Relu after it: 0.47 and 0.48, with
# 10-14 % of the channels never non-zero (capspot_sim, 16 pairs), where balancing on
# those maxima cost 17 dB on held-out pairs (47.6 -> 30.0 dB)
UNSTABLE_RATIO = 2.0
MAX_UNSTABLE = 1.0 / 3.0


def apply_smoothing(graph: Graph, sites: list[SmoothSite], alpha: float) -> list[str]:
    """Fold the factors of eq. (13) into each site's Mul constant (or a Mul inserted for
    the site's layers) and its consumers' weights (new initializers: constants shared
    with other nodes stay as they were). Returns the names of the Mul nodes balanced."""
    done: list[str] = []
    for site in sites:
        if site.absmax is None:
            continue
        wmax = np.max([np.abs(_weight_rows(u)).max(axis=1) for u in site.consumers], axis=0)
        amax = site.absmax
        ok = (amax > 0) & (wmax > 0)
        if not ok.any() or amax.max() < MIN_SPREAD * np.median(amax[ok]):
            continue
        if site.unstable_share() > MAX_UNSTABLE:
            continue  # eq. (13c): the maxima are samples of sparse data, not the channels' ranges
        s = np.ones_like(amax)
        s[ok] = amax[ok] ** alpha / wmax[ok] ** (1.0 - alpha)
        if ok.any():
            s[ok] = np.clip(s[ok], np.quantile(s[ok], 0.1), 100.0)
            s[ok] /= np.exp(np.mean(np.log(s[ok])))  # geometric mean 1: ranges stay near
        if not np.all(np.isfinite(s)) or np.allclose(s, 1.0):
            continue
        if site.mul is None:
            mul = _insert_mul(graph, site, s)
        else:
            mul = site.mul
            cv = mul.inputs[site.const_index]
            c = np.asarray(cv.const)
            new_c = (np.broadcast_to(c.reshape(-1), s.shape) / s).astype(c.dtype)
            mul.replace_input(
                site.const_index, graph.add_initializer(graph.fresh_name(f"{cv.name}_smoothed"), new_c)
            )
            # x / s is another tensor than the float model's x: a new name, as the inserted
            # Mul's output has, so that nothing matching tensors by name (quanta debug,
            # docs/debugger.md) compares x / s with x
            site.x.name = graph.fresh_name(f"{site.x.name}_smooth")
        for u in site.consumers:
            wv = u.inputs[1]
            w = np.asarray(wv.const)
            if u.op_type == "Gemm" and u.attrs.get("transB", 0):
                w2 = (w * s[None, :]).astype(w.dtype)
            else:
                w2 = (w * s[:, None]).astype(w.dtype)
            u.replace_input(1, graph.add_initializer(graph.fresh_name(f"{wv.name}_smoothed"), w2))
        done.append(mul.name)
    graph.remove_unused_initializers()
    return done


def _insert_mul(graph: Graph, site: SmoothSite, s: np.ndarray) -> Node:
    """x_smooth = Mul(x, 1/s) in front of the first of the site's layers; the layers read
    x_smooth, every other reader keeps x."""
    x = site.x
    inv = graph.add_initializer(graph.fresh_name(f"{x.name}_smooth_scale"), (1.0 / s).astype(np.float32))
    out = Value(graph.fresh_name(f"{x.name}_smooth"), x.type)
    name = graph.fresh_name(f"{x.name}_smooth_mul")
    first = min(site.consumers, key=graph.nodes.index)
    mul = graph.add_node(Node("Mul", [x, inv], [out], name=name), before=first)
    for u in site.consumers:
        u.replace_input(0, out)
    return mul
