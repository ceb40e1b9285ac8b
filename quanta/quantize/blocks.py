"""Block-wise learned weight rounding (``weight_rounding="brecq"``; docs/debugger.md eqs.
(12p)-(12t)).

GPTQ (eq. (12)) and GPTAQ (eq. (12g)) choose one layer's integers at a time. In an
inverted-residual block (expand 1x1 -> depthwise 3x3 -> project 1x1, + the block input)
the three layers' rounding errors and the 8-bit activations between them meet only at
the block's output. BRECQ (Li et al., 2021) learns the rounding of every weight of a
block together against the FP32 block output, from the block input the quantized model
before it produces, with AdaRound's soft rounding variable (Nagel et al., 2020) per
weight::

    h(V)   = clip(σ(V)·(ζ − γ) + γ, 0, 1)                 ζ = 1.1, γ = −0.1      (12p)
    Ŵ(V)   = s · clip(⌊W/s⌋ + h(V), qmin, qmax)                                   (12q)
    L(V)   = mean_{n,y,x} Σ_c (f(x_q; Ŵ(V)) − f_fp(x_fp))²
             + λ Σ_w (1 − |2 h(V) − 1|^β)                                          (12r)

minimised by Adam over V, with β annealed from 20 to 2 after a warm-up without the
regularizer (which pushes every h to 0 or 1). The integers are ⌊W/s⌋ + [V ≥ 0],
clamped: on the file's grid, with the scales and zero points unchanged. Inside the block
every activation Q/DQ of the file is applied as fake quantization, rounding half to
even as QuantizeLinear does, with the straight-through gradient inside the clamp range;
QDrop (Wei et al., 2022) replaces each element of a fake-quantized activation by its
float value with probability ``drop`` (a fresh mask every step)::

    x̃ = x                                           with probability p
    x̃ = (clamp(round(x/s) + z, lo, hi) − z)·s        otherwise                    (12s)

The block's data are random spatial patches of its input maps (a convolution is local;
the target is the FP32 block run on the same patch, so both sides see the same zero
padding at the patch's border), drawn from the even-numbered calibration images.

A block keeps its learned integers only where they beat the integers it started from
(GPTQ's) on the odd-numbered calibration images, whole maps, by the first term of
(12r) (eq. (12t), the held-out check of (12c) per block). The blocks are solved in graph
order; a block's input in the quantized model is propagated by this module's own block
interpreter with the integers already chosen (fake quantization in float32: the file's
integer arithmetic up to float rounding), its FP32 input by the same interpreter with
the float weights.

Blocks: the graph is cut where a single tensor carries everything later nodes read (a
residual block is cut at its Add, the block input is alive until then); consecutive
pieces form a block until it ends in a residual Add or holds three weighted layers (an
activation after a Conv is often only its output range by then, so a project layer
does not show); what is left before the first piece the interpreter cannot run is the
last block. The interpreter runs Conv (2-D,
no dilation), Clip, Relu, Add, Sub, Mul, Div, Sigmoid, HardSigmoid, HardSwish,
GlobalAveragePool, Identity and the activations' Q/DQ; at the first
piece with another operator the pass stops, and the rest keeps GPTQ's integers.

Deterministic: fixed seeds (one generator per block), one BLAS thread, float32 math in a
fixed order; the same model, data and recipe give the same integers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import numpy as np
from threadpoolctl import threadpool_limits

if TYPE_CHECKING:
    from quanta.ir.graph import Model, Node
    from quanta.quantize.qdq import QdqPlan, TensorPlan
    from quanta.quantize.recipe import Recipe

__all__ = ["Block", "BlockOptions", "learn_block_rounding", "partition_blocks", "reconstruct_blocks"]

#: eq. (12p)'s stretch of the sigmoid (AdaRound): h reaches 0 and 1 at finite V
ZETA, GAMMA = 1.1, -0.1
#: the operators the block interpreter runs (besides the activations' Q/DQ)
FLOAT_OPS = (
    "Conv",
    "Clip",
    "Relu",
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Sigmoid",
    "HardSigmoid",
    "HardSwish",
    "GlobalAveragePool",
    "Identity",
)


@dataclasses.dataclass(frozen=True)
class BlockOptions:
    """Eq. (12r)'s optimisation. ``iterations`` Adam steps per block on ``batch`` patches
    of side ``patch`` (input pixels) each, learning rate ``lr``, regularizer weight
    ``reg`` (λ), no regularizer for the first ``warmup`` share of the steps, then β from
    ``beta[0]`` to ``beta[1]``; ``drop``: QDrop's probability of keeping an activation
    element float (eq. (12s); 0: every activation quantized); ``seed``: the patches' and
    masks' generator; ``init``: "float" starts at h = the fractional part of W/s
    (AdaRound), "start" moves that h at least ``margin`` across 0.5 to the side of the
    integers the block starts from (GPTQ's) where they are ⌊W/s⌋ or ⌊W/s⌋ + 1."""

    # 2000: the fewest measured to beat GPTQ's integers on a block (400 never did on
    # EfficientNet-Lite0; benchmarks/results/2026-12-07e-brecq13.md)
    iterations: int = 2000
    batch: int = 8
    patch: int = 24
    lr: float = 0.01
    reg: float = 0.01
    warmup: float = 0.2
    beta: tuple[float, float] = (20.0, 2.0)
    drop: float = 0.5
    seed: int = 0
    init: str = "float"
    margin: float = 0.01


#: the options quantize_static's ``weight_rounding="brecq"`` runs with
DEFAULT_OPTIONS = BlockOptions()


@dataclasses.dataclass
class _Weight:
    """One learnable Conv weight of a block: the plan's tensor, the float weight, its
    per-output-channel scale (broadcast shape) and the grid."""

    tensor: TensorPlan
    w: np.ndarray  # float32 [O, C/G, kh, kw]
    scale: np.ndarray  # float32 [O, 1, 1, 1]
    qmin: int
    qmax: int

    @property
    def floor(self) -> np.ndarray:
        return np.floor(self.w / self.scale)

    def hard(self, codes: np.ndarray) -> np.ndarray:
        return (codes.astype(np.float32) * self.scale).astype(np.float32)


@dataclasses.dataclass
class Block:
    """A run of the QDQ clone's nodes from value ``input`` to value ``output`` (names shared
    with the float graph), the float graph's weight and bias of each of its Convs (float32
    copies, by the clone Conv's id), and the learnable weights by the same ids."""

    input: str
    output: str
    nodes: list[Node]
    float_params: dict[int, tuple[np.ndarray, np.ndarray | None]]
    weights: dict[int, _Weight]


def partition_blocks(
    nodes: list[Node], inputs: list[str], weighted: set[int]
) -> list[tuple[str, str, list[Node]]]:
    """The float graph's ``nodes`` (topological order, reading the single non-constant
    graph input ``inputs``) cut into blocks (module docstring): (input value, output value,
    nodes) each. ``weighted``: the ids of the nodes whose weights are learned. Stops at
    the first piece holding an operator outside :data:`FLOAT_OPS`."""
    if len(inputs) != 1:
        return []
    last_use: dict[str, int] = {}
    for i, n in enumerate(nodes):
        for v in n.inputs:
            if v is not None and not v.is_const:
                last_use[v.name] = i
    live = {inputs[0]}
    pieces: list[tuple[str, str, list[Node]]] = []
    start, begin = inputs[0], 0
    for i, n in enumerate(nodes):
        live |= {v.name for v in n.outputs}
        live = {name for name in live if last_use.get(name, len(nodes)) > i}
        if len(live) == 1:
            (cut,) = live
            pieces.append((start, cut, nodes[begin : i + 1]))
            start, begin = cut, i + 1
    blocks: list[tuple[str, str, list[Node]]] = []
    cur: list[Node] = []
    cur_in = inputs[0]
    cur_out = cur_in
    for src, dst, piece in pieces:
        if any(n.op_type not in FLOAT_OPS for n in piece):
            break
        if not cur:
            cur_in = src
        cur += piece
        cur_out = dst
        layers = sum(1 for n in cur if id(n) in weighted)
        if layers and (piece[-1].op_type == "Add" or layers >= 3):
            blocks.append((cur_in, dst, cur))
            cur = []
    if any(id(n) in weighted for n in cur):
        blocks.append((cur_in, cur_out, cur))
    return blocks


# --- the block interpreter --------------------------------------------------------------


def _conv_geometry(node: Node, w: np.ndarray) -> tuple[tuple[int, int], tuple[int, int, int, int], int]:
    strides = tuple(node.attrs.get("strides", [1, 1]))
    pads = tuple(node.attrs.get("pads", [0, 0, 0, 0]))
    return (int(strides[0]), int(strides[1])), tuple(int(p) for p in pads), int(node.attrs.get("group", 1))  # type: ignore[return-value]


def _conv(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, node: Node) -> np.ndarray:
    """Conv 2-D (ONNX semantics, zero padding), as kh·kw tap products."""
    (sh, sw), (pt, pl, pb, pr), g = _conv_geometry(node, w)
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // g
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if pt or pl or pb or pr else x
    ho = (h + pt + pb - kh) // sh + 1
    wo = (wd + pl + pr - kw) // sw + 1
    xg = xp.reshape(n, g, cg, xp.shape[2], xp.shape[3])
    wg = w.reshape(g, og, cg, kh, kw)
    y = np.zeros((n, g, og, ho, wo), np.float32)
    for i in range(kh):
        for j in range(kw):
            xs = xg[:, :, :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw]
            if cg == 1 and og == 1:
                y += xs * wg[None, :, :, :, i, j, None, None].reshape(1, g, 1, 1, 1)
            else:
                y += np.matmul(wg[None, :, :, :, i, j], xs.reshape(n, g, cg, ho * wo)).reshape(y.shape)
    y = y.reshape(n, o, ho, wo)
    if b is not None:
        y += b.reshape(1, o, 1, 1)
    return y


def _conv_backward(
    x: np.ndarray, w: np.ndarray, dy: np.ndarray, node: Node, need_dx: bool
) -> tuple[np.ndarray | None, np.ndarray]:
    """(dL/dx, dL/dw) of :func:`_conv` for dL/dy ``dy``."""
    (sh, sw), (pt, pl, pb, pr), g = _conv_geometry(node, w)
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    og = o // g
    xp = np.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr))) if pt or pl or pb or pr else x
    ho, wo = dy.shape[2], dy.shape[3]
    xg = xp.reshape(n, g, cg, xp.shape[2], xp.shape[3])
    wg = w.reshape(g, og, cg, kh, kw)
    dyg = dy.reshape(n, g, og, ho * wo)
    dw = np.zeros((g, og, cg, kh, kw), np.float32)
    dxp = np.zeros(xg.shape, np.float32) if need_dx else None
    for i in range(kh):
        for j in range(kw):
            sl = (
                slice(None),
                slice(None),
                slice(None),
                slice(i, i + sh * (ho - 1) + 1, sh),
                slice(j, j + sw * (wo - 1) + 1, sw),
            )
            xs = xg[sl]
            if cg == 1 and og == 1:
                dw[:, 0, 0, i, j] = np.einsum("ngp,ngp->g", dyg[:, :, 0], xs.reshape(n, g, ho * wo))
                if dxp is not None:
                    dxp[sl] += (dyg * wg[None, :, :, 0, i, j, None]).reshape(n, g, 1, ho, wo)
            else:
                dw[:, :, :, i, j] = np.matmul(dyg, xs.reshape(n, g, cg, ho * wo).transpose(0, 1, 3, 2)).sum(0)
                if dxp is not None:
                    wt = wg[:, :, :, i, j].transpose(0, 2, 1)[None]  # [1, g, cg, og]
                    dxp[sl] += np.matmul(wt, dyg).reshape(n, g, cg, ho, wo)
    dx = None
    if dxp is not None:
        dx = dxp.reshape(n, c, xp.shape[2], xp.shape[3])[:, :, pt : pt + h, pl : pl + wd]
    return dx, dw.reshape(w.shape)


def _qparams(node: Node, rank: int) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Scale and zero point of a Q/DQ node shaped to broadcast over a rank-``rank`` tensor
    (per-tensor, or along ``axis``), and the storage's range."""
    s_v = node.inputs[1]
    assert s_v is not None
    s = np.asarray(s_v.const, np.float32)
    z_v = node.inputs[2] if len(node.inputs) > 2 else None
    z = np.zeros((), np.uint8) if z_v is None else np.asarray(z_v.const)
    info = np.iinfo(z.dtype)
    if s.size > 1:
        axis = int(node.attrs.get("axis", 1)) % rank
        shape = [1] * rank
        shape[axis] = s.size
        s, z = s.reshape(shape), z.reshape(shape)
    return s, z.astype(np.float32), int(info.min), int(info.max)


def _broadcast_back(g: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """Sum ``g`` down to ``shape`` (the reverse of NumPy broadcasting)."""
    while g.ndim > len(shape):
        g = g.sum(0)
    for k, d in enumerate(shape):
        if d == 1 and g.shape[k] != 1:
            g = g.sum(k, keepdims=True)
    return g


class _Run:
    """One forward run of a block: ``mode`` "fp" (Q/DQ as identity, the float graph's
    weights and biases) or "q" (fake quantization, ``weights`` for the learned Convs, the
    clone's constants otherwise); ``rng``: QDrop's masks (eq. (12s)), None for none."""

    def __init__(
        self, block: Block, mode: str, weights: dict[int, np.ndarray], rng: Any, drop: float
    ) -> None:
        self.block, self.mode, self.weights, self.rng, self.drop = block, mode, weights, rng, drop
        self.tape: list[tuple[Node, Any]] = []

    def const(self, v: Any) -> np.ndarray:
        return np.asarray(v.const, np.float32)

    def forward(self, x: np.ndarray) -> np.ndarray:
        env: dict[str, np.ndarray] = {self.block.input: x}
        for node in self.block.nodes:
            args = [
                None if v is None else (env[v.name] if v.name in env else self.const(v)) for v in node.inputs
            ]
            env[node.outputs[0].name] = self._op(node, args)
        return env[self.block.output]

    def _op(self, node: Node, args: list[Any]) -> np.ndarray:
        op = node.op_type
        if op == "QuantizeLinear":
            x = args[0]
            if self.mode == "fp":
                self.tape.append((node, None))
                return x
            s, z, lo, hi = _qparams(node, x.ndim)
            t = np.rint(x / s) + z
            inside = (t >= lo) & (t <= hi)
            q = np.clip(t, lo, hi)
            keep = None
            if self.rng is not None and self.drop > 0:
                keep = self.rng.random(x.shape, dtype=np.float32) < self.drop
                q = np.where(keep, x / s + z, q)  # DQ gives x back (eq. (12s))
            self.tape.append((node, (s, inside, keep)))
            return q.astype(np.float32)
        if op == "DequantizeLinear":
            x = args[0]
            if self.mode == "fp":
                self.tape.append((node, None))
                return x
            s, z, _, _ = _qparams(node, x.ndim)
            self.tape.append((node, s))
            return ((x - z) * s).astype(np.float32)
        if op == "Conv":
            if self.mode == "fp":
                w, b = self.block.float_params[id(node)]
            else:
                w = self.weights[id(node)] if id(node) in self.weights else args[1]
                b = args[2] if len(args) > 2 else None
            self.tape.append((node, (args[0], w, b is not None)))
            return _conv(args[0], w, b, node)
        if op in ("Clip", "Relu"):
            x = args[0]
            c_lo, c_hi = -np.inf, np.inf
            if op == "Relu":
                c_lo = 0.0
            else:
                c_lo = (
                    float(args[1])
                    if len(args) > 1 and args[1] is not None
                    else float(node.attrs.get("min", -np.inf))
                )
                c_hi = (
                    float(args[2])
                    if len(args) > 2 and args[2] is not None
                    else float(node.attrs.get("max", np.inf))
                )
            self.tape.append((node, (x >= c_lo) & (x <= c_hi)))
            return np.clip(x, c_lo, c_hi).astype(np.float32)
        if op in ("Add", "Sub", "Mul", "Div"):
            a, b = args[0], args[1]
            self.tape.append((node, (a, b)))
            out = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op](a, b)
            return out.astype(np.float32)
        if op == "Sigmoid":
            y = (1.0 / (1.0 + np.exp(-args[0]))).astype(np.float32)
            self.tape.append((node, y * (1 - y)))
            return y
        if op in ("HardSigmoid", "HardSwish"):
            x = args[0]
            alpha = float(node.attrs.get("alpha", 0.2)) if op == "HardSigmoid" else 1.0 / 6
            beta = float(node.attrs.get("beta", 0.5)) if op == "HardSigmoid" else 0.5
            t = alpha * x + beta
            inside = (t > 0) & (t < 1)
            hs = np.clip(t, 0.0, 1.0).astype(np.float32)
            if op == "HardSigmoid":
                self.tape.append((node, alpha * inside))
                return hs
            self.tape.append((node, hs + x * alpha * inside))
            return (x * hs).astype(np.float32)
        if op == "GlobalAveragePool":
            x = args[0]
            self.tape.append((node, x.shape))
            return x.mean(axis=tuple(range(2, x.ndim)), keepdims=True, dtype=np.float32)
        if op == "Identity":
            self.tape.append((node, None))
            return args[0]
        raise NotImplementedError(f"block interpreter: {op} ({node.name})")

    def backward(self, dy: np.ndarray) -> dict[int, np.ndarray]:
        """dL/dŴ of every learned Conv for dL/d(output) ``dy`` (straight-through Q)."""
        grads: dict[str, np.ndarray] = {self.block.output: dy}
        dws: dict[int, np.ndarray] = {}
        for node, saved in reversed(self.tape):
            g = grads.pop(node.outputs[0].name, None)
            if g is None:
                continue
            ins = node.inputs
            op = node.op_type
            outs: list[tuple[Any, np.ndarray]] = []
            if op in ("QuantizeLinear", "DequantizeLinear", "Identity"):
                if saved is None:
                    outs.append((ins[0], g))
                elif op == "QuantizeLinear":
                    s, inside, keep = saved
                    mask = inside if keep is None else (inside | keep)
                    outs.append((ins[0], g * mask / s))
                else:
                    outs.append((ins[0], g * saved))
            elif op == "Conv":
                x, w, _ = saved
                need_dx = not ins[0].is_const and ins[0].name != ""
                dx, dw = _conv_backward(x, w, g, node, need_dx)
                if id(node) in self.weights:
                    dws[id(node)] = dw
                if dx is not None:
                    outs.append((ins[0], dx))
            elif op in ("Clip", "Relu", "Sigmoid", "HardSigmoid", "HardSwish"):
                outs.append((ins[0], g * saved))
            elif op == "GlobalAveragePool":
                spatial = int(np.prod(saved[2:]))
                outs.append((ins[0], np.broadcast_to(g / spatial, saved).astype(np.float32)))
            elif op in ("Add", "Sub", "Mul", "Div"):
                a, b = saved
                if op in ("Add", "Sub"):
                    ga, gb = g, (g if op == "Add" else -g)
                elif op == "Mul":
                    ga, gb = g * b, g * a
                else:
                    ga, gb = g / b, -g * a / (b * b)
                outs.append((ins[0], _broadcast_back(ga, a.shape)))
                outs.append((ins[1], _broadcast_back(gb, b.shape)))
            for v, gv in outs:
                if v is None or v.is_const:
                    continue
                grads[v.name] = grads[v.name] + gv if v.name in grads else gv
        return dws


def run_block(
    block: Block, x: np.ndarray, mode: str, weights: dict[int, np.ndarray], chunk: int = 8
) -> np.ndarray:
    """The block on ``x`` in chunks of ``chunk`` samples, no QDrop."""
    parts = [_Run(block, mode, weights, None, 0.0).forward(x[i : i + chunk]) for i in range(0, len(x), chunk)]
    return np.concatenate(parts)


def _rec_error(y: np.ndarray, t: np.ndarray) -> float:
    """Eq. (12r)'s first term: the squared error summed over channels, mean over the rest."""
    d = (y - t).astype(np.float64)
    return float((d * d).sum() / (d.size / d.shape[1]))


# --- eq. (12r) ----------------------------------------------------------------------------


def _h(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (12p): h(V) and dh/dV."""
    sig = 1.0 / (1.0 + np.exp(-v))
    raw = sig * (ZETA - GAMMA) + GAMMA
    h = np.clip(raw, 0.0, 1.0)
    dh = np.where((raw > 0) & (raw < 1), (ZETA - GAMMA) * sig * (1 - sig), 0.0)
    return h.astype(np.float32), dh.astype(np.float32)


def _init_v(w: _Weight, codes: np.ndarray | None = None, margin: float = 0.01) -> np.ndarray:
    """V with h(V) = W/s − ⌊W/s⌋ (AdaRound's start: Ŵ(V) = W inside the grid); with
    ``codes``, h at least ``margin`` above 0.5 where they are ⌊W/s⌋ + 1, below where they
    are ⌊W/s⌋."""
    rest = np.clip(w.w / w.scale - w.floor, 0.0, 1.0)
    if codes is not None:
        up = codes == w.floor + 1
        down = codes == w.floor
        rest = np.where(
            up, np.maximum(rest, 0.5 + margin), np.where(down, np.minimum(rest, 0.5 - margin), rest)
        )
    sig = np.clip((rest - GAMMA) / (ZETA - GAMMA), 1e-6, 1 - 1e-6)
    return np.log(sig / (1 - sig)).astype(np.float32)


def learn_block_rounding(
    block: Block,
    x_q: np.ndarray,
    x_fp: np.ndarray,
    start: dict[int, np.ndarray],
    options: BlockOptions,
    seed: int,
) -> tuple[dict[int, np.ndarray], float, float]:
    """Eqs. (12r)-(12t) for one block: the integers of each learned Conv (by clone node id),
    and the held-out errors (12t) of the ``start`` integers and of the learned ones. The
    even-numbered samples of ``x_q`` / ``x_fp`` (the block input in the quantized and the
    FP32 model) train, the odd-numbered ones judge; the result is ``start`` where it wins."""
    rng = np.random.default_rng([options.seed, seed])
    train = np.arange(0, len(x_q), 2)
    judge = np.arange(1, len(x_q), 2) if len(x_q) > 1 else train
    ws = block.weights
    vs = {k: _init_v(w, start[k] if options.init == "start" else None, options.margin) for k, w in ws.items()}
    floors = {k: w.floor for k, w in ws.items()}
    m = {k: np.zeros_like(v) for k, v in vs.items()}
    s2 = {k: np.zeros_like(v) for k, v in vs.items()}
    h_in, w_in = x_q.shape[2], x_q.shape[3]
    probe = run_block(block, x_fp[:1], "fp", {})
    stride = max(1, h_in // probe.shape[2])
    side_h = min(h_in, max(stride, options.patch // stride * stride))
    side_w = min(w_in, max(stride, options.patch // stride * stride))
    warm = int(options.warmup * options.iterations)
    b1, b2, eps = 0.9, 0.999, 1e-8
    for it in range(options.iterations):
        pick = train[rng.integers(0, len(train), options.batch)]
        oy = rng.integers(0, (h_in - side_h) // stride + 1, options.batch) * stride
        ox = rng.integers(0, (w_in - side_w) // stride + 1, options.batch) * stride
        xq = np.stack([x_q[p, :, a : a + side_h, c : c + side_w] for p, a, c in zip(pick, oy, ox)])
        xf = np.stack([x_fp[p, :, a : a + side_h, c : c + side_w] for p, a, c in zip(pick, oy, ox)])
        target = _Run(block, "fp", {}, None, 0.0).forward(xf)
        hs = {k: _h(v) for k, v in vs.items()}
        soft = {
            k: (np.clip(floors[k] + hs[k][0], w.qmin, w.qmax) * w.scale).astype(np.float32)
            for k, w in ws.items()
        }
        run = _Run(block, "q", soft, rng, options.drop)
        y = run.forward(xq)
        dy = (2.0 / (y.size / y.shape[1]) * (y - target)).astype(np.float32)
        dws = run.backward(dy)
        if it < warm:
            beta, lam = options.beta[0], 0.0
        else:
            frac = (it - warm) / max(1, options.iterations - warm)
            beta, lam = options.beta[0] + (options.beta[1] - options.beta[0]) * frac, options.reg
        t = it + 1
        for k, w in ws.items():
            h, dh = hs[k]
            inside = (floors[k] + h >= w.qmin) & (floors[k] + h <= w.qmax)
            grad = dws[k] * w.scale * dh * inside
            if lam:
                u = 2 * h - 1
                grad = grad - lam * beta * np.abs(u) ** (beta - 1) * np.sign(u) * 2 * dh
            m[k] = b1 * m[k] + (1 - b1) * grad
            s2[k] = b2 * s2[k] + (1 - b2) * grad * grad
            vs[k] -= (options.lr * (m[k] / (1 - b1**t)) / (np.sqrt(s2[k] / (1 - b2**t)) + eps)).astype(
                np.float32
            )
    learned = {k: np.clip(floors[k] + (vs[k] >= 0), w.qmin, w.qmax) for k, w in ws.items()}
    target = run_block(block, x_fp[judge], "fp", {})
    before = _rec_error(
        run_block(block, x_q[judge], "q", {k: ws[k].hard(c) for k, c in start.items()}), target
    )
    after = _rec_error(
        run_block(block, x_q[judge], "q", {k: ws[k].hard(c) for k, c in learned.items()}), target
    )
    return (learned if after < before else start), before, after


# --- the pass -------------------------------------------------------------------------------


def _weights(model: Model, plan: QdqPlan, recipe: Recipe) -> dict[int, tuple[TensorPlan, int, int]]:
    """The Convs among ``rounding.chosen_weights`` that the block forward and backward
    take: a 4-d integer weight, per output channel (axis 0) or per tensor, no dilation;
    ``(weight plan, qmin, qmax)`` by node id."""
    from quanta.ir.types import IntType
    from quanta.quantize.rounding import chosen_weights

    out: dict[int, tuple[TensorPlan, int, int]] = {}
    for d, t, w_v, (qmin, qmax) in chosen_weights(model, plan, recipe):
        q = t.qtype
        if d.node.op_type != "Conv" or np.asarray(w_v.const).ndim != 4 or q.axis not in (None, 0):
            continue
        if any(int(d_) != 1 for d_ in d.node.attrs.get("dilations", [1, 1])):
            continue
        if isinstance(q.storage, IntType):
            out[id(d.node)] = (t, qmin, qmax)
    return out


def _cone(graph: Any, src: str, dst: str) -> list[Node] | None:
    """The clone's nodes that compute value ``dst`` from value ``src`` and constants, in graph
    order; None when ``dst`` also needs another non-constant value."""
    by_out = {v.name: n for n in graph.nodes for v in n.outputs}
    need, seen = [dst], set()
    keep: set[int] = set()
    while need:
        name = need.pop()
        if name == src or name in seen:
            continue
        seen.add(name)
        node = by_out.get(name)
        if node is None:
            return None
        keep.add(id(node))
        need += [v.name for v in node.inputs if v is not None and not v.is_const]
    return [n for n in graph.nodes if id(n) in keep]


def reconstruct_blocks(
    model: Model,
    plan: QdqPlan,
    recipe: Recipe,
    feeds: Callable[[], Iterable[dict[str, np.ndarray]]],
    options: BlockOptions | None = None,
    log: Callable[[str], None] | None = None,
) -> int:
    """Eqs. (12p)-(12t) for the blocks of ``model`` (after resolve_params, GPTQ and bias
    correction, before insert_qdq): each learned Conv's integers go into
    ``TensorPlan.codes``. ``feeds()`` iterates the calibration feeds (complete). Returns
    the number of blocks whose learned integers were kept."""
    from quanta.quantize.asymmetric import clone_with_qdq

    options = options or DEFAULT_OPTIONS
    graph = model.graph
    inputs = [v.name for v in graph.inputs if not v.is_const]
    layers = _weights(model, plan, recipe)
    parts = partition_blocks(list(graph.nodes), inputs, set(layers))
    if not parts:
        return 0
    alt, where = clone_with_qdq(model, plan)
    back = {id(n2): n for n in graph.nodes for n2 in [where.get(id(n))] if n2 is not None}
    blocks: list[Block] = []
    for src, dst, _ in parts:
        nodes = _cone(alt.graph, src, dst)
        if nodes is None or any(
            n.op_type not in (*FLOAT_OPS, "QuantizeLinear", "DequantizeLinear") for n in nodes
        ):
            break
        float_conv = {id(n): back[id(n)] for n in nodes if n.op_type == "Conv"}
        if any(n.inputs[1] is None or not n.inputs[1].is_const for n in nodes if n.op_type == "Conv"):
            break
        float_params = {}
        for k, fp in float_conv.items():
            w_v = fp.inputs[1]
            b_v = fp.inputs[2] if len(fp.inputs) > 2 else None
            if w_v is None or not w_v.is_const or (b_v is not None and not b_v.is_const):
                break
            b = None if b_v is None else np.asarray(b_v.const, np.float32).copy()
            float_params[k] = (np.asarray(w_v.const, np.float32).copy(), b)
        if len(float_params) != len(float_conv):
            break
        ws: dict[int, _Weight] = {}
        for n in nodes:
            if n.op_type != "Conv" or id(float_conv[id(n)]) not in layers:
                continue
            t, qmin, qmax = layers[id(float_conv[id(n)])]
            w = float_params[id(n)][0]
            per_row = np.asarray(t.qtype.scale_array(), np.float32).reshape(-1)  # type: ignore[union-attr]
            scale = np.broadcast_to(per_row, (w.shape[0],)).reshape(-1, 1, 1, 1).astype(np.float32)
            ws[id(n)] = _Weight(t, w, scale, qmin, qmax)
        blocks.append(Block(src, dst, nodes, float_params, ws))
    if not blocks:
        return 0
    samples = [np.asarray(f[inputs[0]], np.float32) for f in feeds()]
    if not samples or any(a.ndim != 4 or a.shape[1:] != samples[0].shape[1:] for a in samples):
        return 0  # the patches and the held-out maps need one image size
    x = np.concatenate(samples)
    x_q, x_fp = x, x
    kept = 0
    with threadpool_limits(limits=1, user_api="blas"):
        for i, block in enumerate(blocks):
            start = {k: np.asarray(w.tensor.codes).reshape(w.w.shape) for k, w in block.weights.items()}
            if block.weights:
                cpu = time.process_time()
                codes, before, after = learn_block_rounding(block, x_q, x_fp, start, options, i)
                if log is not None:
                    log(
                        f"block {i} ({block.input} -> {block.output}): held-out error {before:.6g} -> {after:.6g}"
                        f" ({'learned' if codes is not start else 'GPTQ'} kept; {time.process_time() - cpu:.1f} s CPU)"
                    )
                if codes is not start:
                    kept += 1
                    for k, c in codes.items():
                        t = block.weights[k].tensor
                        t.codes = c.reshape(np.asarray(t.codes).shape).astype(np.asarray(t.codes).dtype)
                start = codes
            hard = {k: block.weights[k].hard(c) for k, c in start.items()}
            x_q = run_block(block, x_q, "q", hard)
            x_fp = run_block(block, x_fp, "fp", {})
    return kept
