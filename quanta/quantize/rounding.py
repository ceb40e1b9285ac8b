"""Rounding-aware weight quantization: GPTQ-style second-order rounding (Frantar et al.,
2023, "GPTQ", alg. 1; docs/debugger.md eq. (12)).

Rounding each weight to the nearest grid point minimises the weight error, not the
layer's output error on the data. With H = Σ x xᵀ over the calibration inputs of a layer
(y = W x, W [rows, K]), GPTQ quantizes the columns of W one at a time and spreads each
column's rounding error over the columns not yet quantized, in the direction that keeps
W x closest to its float value::

    q_k     = clamp(round(w_k / s), qmin, qmax)                  (per row: w_k is column k)
    e_k     = (w_k − s·q_k) / U_kk                               U = chol(H⁻¹)ᵀ (upper)
    w_j    ← w_j − e_k · U_kj            for j > k

The scales s (one per row) are fixed beforehand (the recipe's weight parameters); only
the integers change, so the quantized model's format is unchanged.
"""

from __future__ import annotations

import numpy as np

__all__ = ["HessianAccumulator", "gptq_round"]


class HessianAccumulator:
    """Streaming H = Σ x xᵀ of a layer's input rows (float64, [K, K]); constant memory."""

    def __init__(self, k: int) -> None:
        self.h = np.zeros((k, k), np.float64)
        self.rows = 0

    def add(self, x: np.ndarray) -> None:
        x = np.asarray(x, np.float64).reshape(-1, self.h.shape[0])
        self.h += x.T @ x
        self.rows += x.shape[0]


def gptq_round(
    w: np.ndarray, scale: np.ndarray, h: np.ndarray, qmin: int, qmax: int, *, damp: float = 0.01
) -> np.ndarray:
    """The integers of ``w`` [rows, K] with per-row ``scale`` [rows] that minimise
    ‖(W − s·Q) x‖² on the inputs summarised by ``h`` [K, K] (GPTQ, module docstring).
    ``damp``: the share of the mean diagonal added to H (keeps it invertible; inputs
    that never vary get plain rounding)."""
    w = np.array(w, np.float64)
    s = np.asarray(scale, np.float64).reshape(-1, 1)
    h = np.array(h, np.float64)
    if ACT_ORDER:
        # the columns whose inputs carry the most energy first (GPTQ's "act-order"): their
        # errors get the most columns left to absorb them; stable, so deterministic
        perm = np.argsort(-np.diag(h), kind="stable")
        q = gptq_round_ordered(w[:, perm], s, h[np.ix_(perm, perm)], qmin, qmax, damp)
        out = np.empty_like(q)
        out[:, perm] = q
        return out
    return gptq_round_ordered(w, s, h, qmin, qmax, damp)


ACT_ORDER = False


def gptq_round_ordered(
    w: np.ndarray, s: np.ndarray, h: np.ndarray, qmin: int, qmax: int, damp: float
) -> np.ndarray:
    """:func:`gptq_round` in the columns' given order (``w`` float64 [rows, K], ``s`` [rows, 1])."""
    w = np.array(w, np.float64)
    h = np.array(h, np.float64)
    k = w.shape[1]
    dead = np.diag(h) == 0
    h[dead, dead] = 1.0
    lam = damp * float(np.mean(np.diag(h)))
    h[np.diag_indices(k)] += lam
    try:
        hinv = np.linalg.inv(h)
        u = np.linalg.cholesky(hinv).T  # upper triangular, H⁻¹ = Uᵀ U
    except np.linalg.LinAlgError:  # not positive definite even damped: nearest rounding
        return np.clip(np.rint(w / s), qmin, qmax)
    q = np.empty_like(w)
    for j in range(k):
        col = w[:, j]
        qj = np.clip(np.rint(col / s[:, 0]), qmin, qmax)
        q[:, j] = qj
        err = (col - s[:, 0] * qj) / u[j, j]
        if j + 1 < k:
            w[:, j + 1 :] -= np.outer(err, u[j, j + 1 :])
    return q


# ------------------------------------------------------------------------------ in quantize_static


class RoundedLayer:
    """One Conv / Gemm / MatMul with a constant weight whose integers GPTQ chooses: its
    input's rows as the layer sees them (im2col for a Conv), accumulated. A grouped or
    depthwise Conv keeps one H per group (eq. (12) per group: the output channels of a
    group read only that group's input channels), [groups, K_g, K_g]."""

    def __init__(self, node, x_name: str, w_key: str, w: np.ndarray) -> None:
        self.node = node
        self.x_name = x_name
        self.w_key = w_key
        op = node.op_type
        self.kernel = tuple(int(k) for k in w.shape[2:4]) if op == "Conv" else (1, 1)
        self.groups = int(node.attrs.get("group", 1)) if op == "Conv" else 1
        if op == "Conv":
            k = int(np.prod(w.shape[1:]))
        elif op == "Gemm" and node.attrs.get("transB", 0):
            k = w.shape[1]
        else:  # MatMul / Gemm without transB: W [K, N]
            k = w.shape[0]
        self.acc = HessianAccumulator(k)
        # the odd-numbered calls' share of acc: GPTQ fitted on the even calls is checked
        # against nearest rounding on these rows (eq. (12c)), then refitted on all
        self.half = HessianAccumulator(k)
        if self.groups > 1:
            self.acc.h = np.zeros((self.groups, k, k), np.float64)
            self.half.h = np.zeros((self.groups, k, k), np.float64)
        self.calls = 0

    def _add(self, h: np.ndarray, rows: int) -> None:
        self.acc.h += h
        self.acc.rows += rows
        if self.calls % 2:
            self.half.h += h
            self.half.rows += rows
        self.calls += 1

    def rows_2d(self, w: np.ndarray) -> np.ndarray:
        """W as [output channels, K] in the order of the input rows."""
        if self.node.op_type == "Conv":
            return w.reshape(w.shape[0], -1)
        if self.node.op_type == "Gemm" and self.node.attrs.get("transB", 0):
            return w
        return w.T

    def from_2d(self, q: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        if self.node.op_type == "Conv":
            return q.reshape(shape)
        if self.node.op_type == "Gemm" and self.node.attrs.get("transB", 0):
            return q
        return q.T

    def observe(self, x: np.ndarray) -> None:
        node = self.node
        if node.op_type != "Conv":
            x2 = np.asarray(x, np.float64).reshape(-1, self.acc.h.shape[0])
            self._add(x2.T @ x2, x2.shape[0])
            return
        kh, kw = self.kernel
        sh, sw = [*node.attrs.get("strides", [1, 1]), 1, 1][:2]
        pads = list(node.attrs.get("pads", [0, 0, 0, 0]))
        g = self.groups
        k = self.acc.h.shape[-1]
        total = np.zeros_like(self.acc.h)
        rows = 0
        for sample in x:  # one sample at a time: the im2col copy stays small
            xp = np.pad(sample, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
            c = xp.shape[0]
            ho = (xp.shape[1] - kh) // sh + 1
            wo = (xp.shape[2] - kw) // sw + 1
            # im2col as kh·kw strided slices (a copy each, not a gather of windows):
            # cols[c, i·kw + j, p] = xp[c, i + sh·p_h, j + sw·p_w], float64
            cols = np.empty((c, kh * kw, ho, wo), np.float64)
            for i in range(kh):
                for j in range(kw):
                    cols[:, i * kw + j] = xp[
                        :, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw
                    ]
            # rows of group g are its C/g channels × taps, in W.reshape(Cout, -1)'s order
            r = cols.reshape(g, k, ho * wo)
            h = np.matmul(r, r.transpose(0, 2, 1))
            total += h[0] if g == 1 else h
            rows += ho * wo
        self._add(total, rows)

    @classmethod
    def eligible(cls, node, w: np.ndarray) -> str | None:
        """Why GPTQ does not apply to this node (None: it does)."""
        op = node.op_type
        if op == "Conv":
            if w.ndim != 4:
                return "not a 2-D convolution"
            if w.shape[0] % int(node.attrs.get("group", 1)) != 0:
                return "output channels not a multiple of the groups"
            if any(d != 1 for d in node.attrs.get("dilations", [1, 1])):
                return "dilated convolution"
            if node.attrs.get("auto_pad", "NOTSET") not in ("NOTSET", b"NOTSET"):
                return "auto_pad"
            return None
        if op == "Gemm":
            return (
                "transposed input"
                if node.attrs.get("transA", 0)
                else (None if w.ndim == 2 else "weight rank")
            )
        if op == "MatMul":
            return None if w.ndim == 2 else "weight rank"
        return "op"


def plan_rounding(graph, plan) -> list[RoundedLayer]:
    """The quantized layers GPTQ applies to (int8 weights without a block size, zero
    point 0 is checked when the integers are chosen)."""
    by_name = {v.name: v for v in graph.values()}
    out: list[RoundedLayer] = []
    for d in plan.decisions:
        roles = dict(d.inputs)
        if not d.quantize or 0 not in roles or 1 not in roles:
            continue
        w_t = plan.tensors.get(roles[1])
        if w_t is None or w_t.role != "weight" or w_t.block is not None:
            continue
        w = by_name[w_t.name].const
        if w is None or RoundedLayer.eligible(d.node, np.asarray(w)) is not None:
            continue
        x = d.node.inputs[0]
        if x is None or x.is_const:
            continue
        out.append(RoundedLayer(d.node, x.name, roles[1], np.asarray(w)))
    return out


def apply_rounding(graph, plan, layers: list[RoundedLayer], *, reduce_range: bool = False) -> int:
    """Choose the integers of every layer's weight with :func:`gptq_round` (after
    resolve_params: the scales are final); they go into ``TensorPlan.codes``. Returns
    the number of weights rounded."""
    from quanta.quantize.params import quant_range

    by_name = {v.name: v for v in graph.values()}
    n = 0
    for layer in layers:
        t = plan.tensors[layer.w_key]
        q = t.qtype
        if q is None or layer.acc.rows == 0 or q.block is not None:
            continue
        zp = np.asarray(q.zero_point_array())
        if np.any(zp != 0):
            continue
        w = np.asarray(by_name[t.name].const, np.float64)
        w2 = layer.rows_2d(w)
        scale = np.asarray(q.scale_array(), np.float64).reshape(-1)
        if scale.size == 1:
            scale = np.full(w2.shape[0], scale[0])
        elif scale.size != w2.shape[0]:
            continue  # per-axis along something other than the output channels
        qmin, qmax = quant_range(q.storage, symmetric=True, reduce_range=reduce_range)
        full, half = layer.acc.h, layer.half.h
        checked = 0 < layer.half.rows < layer.acc.rows
        if layer.groups == 1:
            full, half = full[None], half[None]
        per = w2.shape[0] // len(full)
        parts = []
        for i in range(len(full)):
            rows = slice(i * per, (i + 1) * per)
            wg, sg = w2[rows], scale[rows]
            codes = gptq_round(wg, sg, full[i], qmin, qmax)
            if checked:
                codes = _held_out(wg, sg, full[i] - half[i], half[i], codes, qmin, qmax)
            parts.append(codes)
        codes = np.concatenate(parts)
        t.codes = layer.from_2d(codes, w.shape).astype(q.storage.numpy)
        n += 1
    return n


def _held_out(
    w: np.ndarray,
    s: np.ndarray,
    h_fit: np.ndarray,
    h_val: np.ndarray,
    codes: np.ndarray,
    qmin: int,
    qmax: int,
) -> np.ndarray:
    """Eq. (12c): per output row, GPTQ's ``codes`` (fitted on every call) where GPTQ
    fitted on the even calls alone beats nearest rounding on the odd calls' rows,
    ‖(w − s·q) x‖² = d H_val dᵀ; nearest rounding elsewhere (where the calibration data
    is too small for the rows' second-order statistics to carry over)."""
    near = np.clip(np.rint(w / s[:, None]), qmin, qmax)

    def loss(q: np.ndarray) -> np.ndarray:
        d = w - s[:, None] * q
        return np.einsum("rk,kl,rl->r", d, h_val, d)

    fit = gptq_round(w, s, h_fit, qmin, qmax)
    return np.where((loss(fit) < loss(near))[:, None], codes, near)
