"""Cross-layer equalization of the activations between two convolutions (Nagel et al.,
2019, "Data-Free Quantization Through Weight Equalization and Bias Correction", sec. 4.1;
docs/debugger.md eq. (14)).

An activation y = act(A(x)) read only by a convolution B is quantized per tensor: one
step for every channel, so a channel whose values stay far below the tensor's largest
gets few levels. With act positively homogeneous on the channel's range (Relu; a Clip
at [0, H] on the values it passes), a factor k_c > 0 per channel leaves the layer pair
unchanged::

    A'[c] = k_c · A[c]  (weights and bias of output channel c)
    B'[:, c] = B[:, c] / k_c  (the weights that read input channel c)

and y'_c = k_c · y_c. With m_c the channel's largest value on the calibration data and
M the tensor's::

    k_c = clip(M / (MARGIN · m_c), 1, K_MAX) ** alpha                       (14)

brings every channel to at least 1/MARGIN of the tensor's range: the per-tensor grid
then serves each channel nearly as a per-channel grid would (the quantization noise of
channel c, in the original units, falls by k_c). A Clip's upper bound H stays: it clips
k_c·z at H, which is z at H / k_c >= MARGIN·m_c·H / M >= MARGIN·m_c, so no calibration
value is clipped, and a value on other data only past MARGIN times its channel's
calibration maximum.

alpha per pair: A is quantized per output channel, so scaling its rows costs nothing;
B costs nothing either when it is depthwise (each input channel has its own output
channels, quantized per channel): alpha 1. When B mixes channels (a 1x1 projection), the
columns c with k_c > 1 shrink under the same per-row step, so their weight rounding
error grows by k_c while the activation's falls by k_c: alpha 1/2 splits the range
between the two, Nagel et al.'s balance point.

Channels whose maxima differ more than UNSTABLE_RATIO between the even and the odd
calibration feeds, or that are 0, keep k_c = 1: a maximum that the data does not
reproduce is no range (docs/debugger.md eq. (13c), as SmoothQuant checks its sites).
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Graph, Node, Value

__all__ = ["EqualizeSite", "apply_equalization", "plan_equalization"]

#: the largest factor of eq. (14): a channel 16x below the tensor's maximum gets 4 bits more
K_MAX = 16.0
#: eq. (14) aims each channel at 1/MARGIN of the tensor's maximum, not all of it: a channel
#: exceeds its calibration maximum on other data, and the Clip above (or the top of the
#: grid) then cuts it at MARGIN times that maximum instead of at once. EfficientNet-Lite0,
#: factors from 5 images, 95 others: the float model moved to 32.2 dB at 1, 46.6 dB at 2
MARGIN = 2.0
#: a channel whose even- and odd-feed maxima differ by more than this keeps k = 1
UNSTABLE_RATIO = 2.0
#: a site whose factors would cut the activation's mean quantization noise power, in the
#: original units (mean of 1 / k_c², equal noise per channel on the grid), by less than
#: this many dB is left alone: its per-tensor grid already serves most channels
MIN_GAIN_DB = 1.0


class EqualizeSite:
    """A Conv ``a`` whose output feeds, through an optional Relu / Clip(0, H) ``act``, only
    Convs ``consumers`` (as their data input, constant weights); ``absmax`` collects the
    per-channel max |y| of the activation y they read (axis 1) during calibration."""

    def __init__(self, a: Node, act: Node | None, y: Value, consumers: list[Node]) -> None:
        self.a = a
        self.act = act
        self.y = y
        self.consumers = consumers
        self.absmax: np.ndarray | None = None
        self.halves: list[np.ndarray | None] = [None, None]
        self.seen = 0

    def observe(self, arr: np.ndarray) -> None:
        x = np.abs(np.asarray(arr, np.float64))
        if x.ndim < 2:
            return
        m = np.moveaxis(x, 1, 0).reshape(x.shape[1], -1)
        a = m.max(axis=1) if m.shape[1] else np.zeros(x.shape[1])
        self.absmax = a if self.absmax is None else np.maximum(self.absmax, a)
        h = self.halves[self.seen % 2]
        self.halves[self.seen % 2] = a if h is None else np.maximum(h, a)
        self.seen += 1

    def depthwise(self) -> bool:
        """Every consumer gives each input channel output channels of its own."""
        c = self.channels()
        return all(_groups(u) == c and _weight(u).shape[1] == 1 for u in self.consumers)

    def channels(self) -> int:
        return int(_weight(self.a).shape[0])


def _weight(node: Node) -> np.ndarray:
    return np.asarray(node.inputs[1].const)


def _groups(node: Node) -> int:
    return int(node.attrs.get("group", 1))


def _const_scalar(v: Value | None) -> float | None:
    if v is None or not v.is_const or np.asarray(v.const).size != 1:
        return None
    return float(np.asarray(v.const).reshape(()))


def _conv_with_weights(node: Node) -> bool:
    return (
        node.op_type == "Conv"
        and node.domain in ("", "ai.onnx")
        and len(node.inputs) >= 2
        and node.inputs[1] is not None
        and node.inputs[1].is_const
        and np.asarray(node.inputs[1].const).dtype.kind == "f"
        and np.asarray(node.inputs[1].const).ndim >= 3
        and (len(node.inputs) < 3 or node.inputs[2] is None or node.inputs[2].is_const)
    )


def _homogeneous(act: Node) -> bool:
    """Relu, or a Clip whose lower bound is 0 and whose upper bound is a positive
    constant (or absent): act(k·z) = k·act'(z) with the bound divided by k."""
    if act.op_type == "Relu":
        return True
    if act.op_type != "Clip" or act.attrs.get("min") is not None or act.attrs.get("max") is not None:
        return False  # (opset < 11 keeps the bounds as attributes: left alone)
    lo = _const_scalar(act.input(1))
    hi_v = act.input(2)
    hi = _const_scalar(hi_v)
    return lo == 0.0 and (hi_v is None or (hi is not None and hi > 0.0))


def plan_equalization(graph: Graph, op_types: frozenset[str], excluded=None) -> list[EqualizeSite]:
    """The activations eq. (14) can even out (module docstring): Conv -> [Relu | Clip(0, H)]
    -> Convs, each tensor between with no other reader and no graph output, every
    weight constant, ``op_types`` holding Conv. ``excluded(node)``: nodes the recipe
    keeps float are not scaled (their weights are not quantized per channel)."""
    if "Conv" not in op_types:
        return []
    outputs = {id(v) for v in graph.outputs}
    sites: list[EqualizeSite] = []
    for a in graph.nodes:
        if not _conv_with_weights(a) or id(a.outputs[0]) in outputs:
            continue
        if excluded is not None and excluded(a):
            continue
        z = a.outputs[0]
        users = z.consumers()
        act: Node | None = None
        y = z
        if len(users) == 1 and users[0].op_type in ("Relu", "Clip") and users[0].inputs[0] is z:
            act = users[0]
            if not _homogeneous(act) or id(act.outputs[0]) in outputs:
                continue
            y = act.outputs[0]
            users = y.consumers()
        if not users or any(
            not _conv_with_weights(u) or u.inputs[0] is not y or (excluded is not None and excluded(u))
            for u in users
        ):
            continue
        c = _weight(a).shape[0]
        if any(_weight(u).shape[1] * _groups(u) != c for u in users):
            continue
        sites.append(EqualizeSite(a, act, y, users))
    return sites


def factors(site: EqualizeSite) -> np.ndarray | None:
    """Eq. (14)'s k per channel of the site, or None when the site is left alone."""
    m = site.absmax
    if m is None or m.size != site.channels():
        return None
    even, odd = site.halves
    ok = m > 0
    if even is not None and odd is not None:
        lo, hi = np.minimum(even, odd), np.maximum(even, odd)
        ok &= hi <= UNSTABLE_RATIO * lo
    if not ok.any():
        return None
    top = float(m.max())
    alpha = 1.0 if site.depthwise() else 0.5
    k = np.ones_like(m)
    k[ok] = np.clip(top / (MARGIN * m[ok]), 1.0, K_MAX) ** alpha
    if -10.0 * np.log10(np.mean(k**-2.0)) < MIN_GAIN_DB:
        return None
    return k


def _input_channel_of(w_shape: tuple[int, ...], groups: int) -> np.ndarray:
    """For a Conv weight [O, C/g, ...]: the input channel each [o, j] slot reads."""
    o, cpg = w_shape[0], w_shape[1]
    opg = o // groups
    return (np.arange(o)[:, None] // opg) * cpg + np.arange(cpg)[None, :]


def apply_equalization(graph: Graph, sites: list[EqualizeSite]) -> list[str]:
    """Fold eq. (14)'s factors into each site's weights (new initializers: constants shared
    with other nodes keep their values). The scaled tensors get new names (they hold
    k·y, not the float model's y), so that nothing that matches tensors by name compares
    them with the FP32 model's. Returns the names of the tensors equalized."""
    done: list[str] = []
    for site in sites:
        k = factors(site)
        if k is None:
            continue
        a = site.a
        wv = a.inputs[1]
        w = np.asarray(wv.const)
        a.replace_input(
            1,
            graph.add_initializer(
                graph.fresh_name(f"{wv.name}_equalized"),
                (w * k.reshape(-1, *([1] * (w.ndim - 1)))).astype(w.dtype),
            ),
        )
        bv = a.input(2)
        if bv is not None:
            b = np.asarray(bv.const)
            a.replace_input(
                2, graph.add_initializer(graph.fresh_name(f"{bv.name}_equalized"), (b * k).astype(b.dtype))
            )
        for u in site.consumers:
            uv = u.inputs[1]
            wu = np.asarray(uv.const)
            idx = _input_channel_of(wu.shape, _groups(u))
            scale = (1.0 / k)[idx].reshape(*idx.shape, *([1] * (wu.ndim - 2)))
            u.replace_input(
                1,
                graph.add_initializer(
                    graph.fresh_name(f"{uv.name}_equalized"), (wu * scale).astype(wu.dtype)
                ),
            )
        done.append(site.y.name)
        for v in {id(x): x for x in [a.outputs[0], site.y]}.values():
            v.name = graph.fresh_name(f"{v.name}_equalized")
    graph.remove_unused_initializers()
    return done
