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

in blocks of columns (GPTQ's "lazy batch" updates: inside a block only the block's
columns are updated, the rest of W once per block by one matrix product; the same
integers, fewer passes over W). The code runs the same recursion in its feedback form
(docs/debugger.md eq. (12f)), which needs the Cholesky factor of H, not of H⁻¹. The scales s (one per row) are fixed beforehand (the
recipe's weight parameters); only the integers change, so the quantized model's format
is unchanged.

H is taken over the inputs *as the quantized model sees them*: x quantized with its own
activation parameters, in integers (eq. (12d)), x_int = clamp(round(x/s_x) + z_x) − z_x.
The integer Gram matrices are exact (the native integer GEMM for 8-bit inputs; float64
products of integers below 2^53 otherwise, exact whatever the BLAS summation order), and summed over samples as int64, so the statistics
after any split of the samples into shards, merged in any order, are the same integers
(sharded calibration writes the same file: docs/scale.md).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

import numpy as np
from threadpoolctl import threadpool_limits

from quanta.kernels.reference.conv_geometry import is_depthwise
from quanta.quantize.ort_pairs import PAIR_LIMIT, pair_bounds, pair_partners, project_pairs

if TYPE_CHECKING:
    from quanta.quantize.recipe import Recipe

__all__ = [
    "HessianAccumulator",
    "RoundedLayer",
    "apply_rounding",
    "gptq_round",
    "gram_u8_into",
    "plan_rounding",
    "refine_held_out",
    "refine_rounding",
]

# columns per lazy-batch block (GPTQ uses 128)
BLOCK = 128
# entries of a block the column loop updates at a time (groups x rows x BLOCK: 512 KB)
ROUND_CHUNK = 1 << 16


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
    w = np.asarray(w, np.float64)
    s = np.asarray(scale, np.float64).reshape(-1)
    return gptq_round_groups(w[None], s[None], np.asarray(h, np.float64)[None], qmin, qmax, damp=damp)[0]


def gptq_round_groups(
    w: np.ndarray,
    s: np.ndarray,
    h: np.ndarray,
    qmin: int,
    qmax: int,
    *,
    damp: float = 0.01,
    native: bool = True,
    partners: np.ndarray | None = None,
) -> np.ndarray:
    """:func:`gptq_round` for G independent groups at once (a grouped or depthwise Conv:
    ``w`` [G, rows, K], ``s`` [G, rows], ``h`` [G, K, K]); the column loop runs once for
    all groups. A group whose damped H is not positive definite gets nearest rounding.

    GPTQ's updates in their feedback form (docs/debugger.md eq. (12f)): column k is
    rounded from w_k + Σ_{i<k} d_i V_ik, where d_i = w_i − s·q_i is the error of an
    earlier column against its *original* weight and V the unit upper factor of
    H = V D Vᵀ, which one Cholesky factorization gives without inverting anything.

    The column loop of each block runs natively when the module is built (``native=False``:
    the NumPy loop below, which computes the same integers).

    ``partners`` (ort_pairs.pair_partners, [K]): ONNX Runtime's pair of each column; a
    column rounded after its partner is clamped to the range eq. (12m) leaves it
    (docs/debugger.md), and its clamp error is fed forward as any rounding error. The
    bound differs per entry, so these layers take the NumPy loop."""
    w = np.array(w, np.float64)
    s = np.asarray(s, np.float64)
    v = _unit_upper_factors(np.array(h, np.float64), damp)
    g, rows, k = w.shape
    q = np.empty_like(w)
    d = np.empty_like(w)
    pairs = partners is not None and bool(np.any(partners >= 0))
    column_loop = _native_column_loop() if native and not pairs else None
    s_c = np.ascontiguousarray(s)
    # the rows are independent inside a block: they run in chunks whose part of the block
    # stays in cache (an 8210-row CTC head's block is 8 MB), and the rank-1 products go
    # into one buffer instead of a new array per column (the same operations per entry)
    rc = max(1, min(rows, ROUND_CHUNK // (g * BLOCK)))
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        # the block's columns with the feedback of every earlier block: one product
        wb = w[:, :, b0:b1] + np.matmul(d[:, :, :b0], v[:, :b0, b0:b1]) if b0 else w[:, :, b0:b1].copy()
        vb = v[:, b0:b1, b0:b1]
        n = b1 - b0
        if column_loop is not None:
            qb, db = np.empty_like(wb), np.empty_like(wb)
            w0 = np.ascontiguousarray(w[:, :, b0:b1])
            column_loop(
                np.ascontiguousarray(wb), w0, s_c, np.ascontiguousarray(vb), qb, db, float(qmin), float(qmax)
            )
            q[:, :, b0:b1] = qb
            d[:, :, b0:b1] = db
            continue
        for r0 in range(0, rows, rc):
            r1 = min(rows, r0 + rc)
            wr, sr = wb[:, r0:r1], s[:, r0:r1]
            tmp = np.empty((g, r1 - r0, n), np.float64)
            for j in range(n):
                # the clip ufuncs directly: np.clip's wrappers cost more than the
                # arithmetic of a column (a 4608-wide layer: as many calls)
                p = int(partners[b0 + j]) if pairs else -1  # type: ignore[index]
                if 0 <= p < b0 + j:  # eq. (12m): the partner is already rounded
                    lo, hi = pair_bounds(q[:, r0:r1, p], qmin, qmax)
                    qj = np.minimum(np.maximum(np.rint(wr[:, :, j] / sr), lo), hi)
                else:
                    qj = np.minimum(np.maximum(np.rint(wr[:, :, j] / sr), qmin), qmax)
                q[:, r0:r1, b0 + j] = qj
                dj = w[:, r0:r1, b0 + j] - sr * qj
                d[:, r0:r1, b0 + j] = dj
                if j + 1 < n:
                    t = tmp[:, :, : n - j - 1]
                    np.multiply(dj[:, :, None], vb[:, j, None, j + 1 :], out=t)
                    wr[:, :, j + 1 :] += t
    return q


#: cyclic sweeps of eq. (12k) at most (each costs about one product W·H; the sweeps stop
#: early once one changes no integer)
SWEEPS = 8


def refine_rounding(
    w: np.ndarray,
    s: np.ndarray,
    h: np.ndarray,
    q: np.ndarray,
    qmin: int,
    qmax: int,
    *,
    damp: float = 0.01,
    sweeps: int = SWEEPS,
    partners: np.ndarray | None = None,
) -> np.ndarray:
    """Eq. (12k): cyclic coordinate descent from the integers ``q`` on GPTQ's objective
    ‖(W − s·Q) x‖² + λ‖W − s·Q‖² (docs/debugger.md; arrays as in
    :func:`gptq_round_groups`: ``w``, ``q`` [G, rows, K], ``s`` [G, rows], ``h``
    [G, K, K], λ as GPTQ damps). With E = W − s·Q and R = E (H + λI), moving q_j of a
    row by t changes the row's objective by s² t² H_jj − 2 s t R_j, whose integer
    minimiser is t = round(R_j / (s H_jj)) (a convex parabola in t), clamped to the
    grid; then R −= s t H_j. Every step lowers the objective or leaves it, so the result
    is never worse than ``q`` on the data of ``h``; the columns run in order, the rows
    and groups at once, all in float64 elementwise operations after one product per
    sweep (the same integers on every run). With ``partners`` (:func:`gptq_round_groups`)
    a move keeps eq. (12m): t is clamped to the range the partner's current code leaves,
    so ``q``, pair-safe, stays pair-safe."""
    w = np.asarray(w, np.float64)
    s3 = np.asarray(s, np.float64)[..., None]
    hd = np.array(h, np.float64)
    k = hd.shape[-1]
    diag = np.diagonal(hd, axis1=1, axis2=2).copy()
    diag[diag == 0] = 1.0  # an input that never varies: λ alone holds its weights
    idx = np.arange(k)
    hd[:, idx, idx] = diag + damp * diag.mean(axis=1, keepdims=True)
    q = np.array(q, np.float64)
    for _ in range(sweeps):
        # R recomputed once per sweep (no drift from the updates below accumulates)
        r = np.matmul(w - s3 * q, hd)
        changed = False
        for j in range(k):
            hjj = hd[:, j, j][:, None]  # [G, 1]
            t = np.rint(r[:, :, j] / (s3[..., 0] * hjj))
            if partners is not None and partners[j] >= 0:  # eq. (12m) against the partner's code
                lo, hi = pair_bounds(q[:, :, partners[j]], qmin, qmax)
            else:
                lo, hi = qmin, qmax
            t = np.minimum(np.maximum(t, lo - q[:, :, j]), hi - q[:, :, j])
            moved = t != 0
            if not moved.any():
                continue
            changed = True
            q[:, :, j] += t
            # only the rows that moved: their R rows lose s·t·H_j
            gi, ri = np.nonzero(moved)
            r[gi, ri] -= (s3[gi, ri, 0] * t[gi, ri])[:, None] * hd[gi, j]
        if not changed:
            break
    return q


def refine_held_out(
    w: np.ndarray,
    s: np.ndarray,
    h_full: np.ndarray,
    h_val: np.ndarray,
    codes: np.ndarray,
    qmin: int,
    qmax: int,
    partners: np.ndarray | None = None,
) -> np.ndarray:
    """Eq. (12l): per output row, eq. (12k)'s refinement of ``codes`` (fitted on every
    sample) where it carries over to samples it did not see, else ``codes``. The check
    repeats the row's rounding on the other half alone (H_fit = H_full − H_val): its
    start is GPTQ fitted on H_fit for a row whose ``codes`` are not nearest rounding
    (eq. (12c) kept GPTQ there), nearest rounding for the others; the row is refined
    where the refinement of that start, fitted on H_fit, errs less than the start on the
    half ``h_val``, d H_val dᵀ. Neither side of the comparison saw ``h_val``. Arrays as in
    :func:`gptq_round_groups`."""
    w = np.asarray(w, np.float64)
    s = np.asarray(s, np.float64)
    codes = np.asarray(codes, np.float64)
    h_fit = h_full - h_val

    def loss(q: np.ndarray) -> np.ndarray:
        d = w - s[..., None] * q
        return np.einsum("grk,grk->gr", np.matmul(d, h_val), d)

    near = nearest_codes(w, s, qmin, qmax, partners)
    from_near = np.all(codes == near, axis=-1, keepdims=True)
    start = np.where(from_near, near, gptq_round_groups(w, s, h_fit, qmin, qmax, partners=partners))
    wins = loss(refine_rounding(w, s, h_fit, start, qmin, qmax, partners=partners)) < loss(start)
    if not wins.any():
        return codes
    refined = refine_rounding(w, s, h_full, codes, qmin, qmax, partners=partners)
    return np.where(wins[..., None], refined, codes)


def nearest_codes(
    w: np.ndarray, s: np.ndarray, qmin: int, qmax: int, partners: np.ndarray | None = None
) -> np.ndarray:
    """Nearest rounding of ``w`` [G, rows, K] with per-row ``s`` [G, rows]; with
    ``partners`` (:func:`gptq_round_groups`) every pair that breaks eq. (12m) is moved to
    the nearest pair that keeps it (ort_pairs.project_pairs)."""
    u = w / s[..., None]
    near = np.clip(np.rint(u), qmin, qmax)
    if partners is None:
        return near
    return project_pairs(u, near, partners, qmin, qmax)[0].astype(np.float64)


def _native_column_loop():
    """The native column loop of one block (quantize/gptq.h: the loop below, the same
    float64 operations in the same order, so the same integers), or None without the
    native module."""
    try:
        from quanta.kernels import _native
    except ImportError:  # a build without the extension: the NumPy loop
        return None
    return getattr(_native, "gptq_block_f64", None)


def _native_conv_gram():
    """The native Gram of a convolution's narrow 8-bit rows (quantize/conv_gram.h: the
    exact sums :meth:`RoundedLayer.observe` otherwise forms from im2col in float64), or
    None without the native module."""
    try:
        from quanta.kernels import _native
    except ImportError:  # a build without the extension: the NumPy path
        return None
    return getattr(_native, "conv_gram_u8", None)


def _unit_upper_factors(h: np.ndarray, damp: float) -> np.ndarray:
    """V, unit upper triangular, with H + λI = V D Vᵀ (D diagonal) for each [K, K] in
    ``h`` [G, K, K] (modified in place: the damped diagonal); the identity (no feedback:
    nearest rounding) where the damped H is not positive definite.

    With J the reversal of the K indices and L the lower Cholesky factor of J H J,
    T = J L J is upper triangular with H = T Tᵀ, and V = T diag(T)⁻¹ (eq. (12f)): one
    Cholesky, ~K³/3 operations (a 4608-wide 3x3 layer's H: the largest share of
    quantize_static on a ResNet)."""
    k = h.shape[-1]
    diag = np.diagonal(h, axis1=1, axis2=2).copy()
    dead = diag == 0
    diag[dead] = 1.0
    lam = damp * diag.mean(axis=1, keepdims=True)
    idx = np.arange(k)
    h[:, idx, idx] = diag + lam
    try:
        return _unit_upper(h)
    except np.linalg.LinAlgError:
        pass
    out = np.empty_like(h)
    for i in range(len(h)):  # find the groups that fail
        try:
            out[i] = _unit_upper(h[i : i + 1])[0]
        except np.linalg.LinAlgError:  # not positive definite even damped
            out[i] = np.eye(k)
    return out


def _unit_upper(h: np.ndarray) -> np.ndarray:
    # one contiguous copy of the factor, divided in place (not a reversed-layout quotient
    # copied once more: a 4608-wide H is 170 MB)
    t = np.ascontiguousarray(np.linalg.cholesky(h[:, ::-1, ::-1])[:, ::-1, ::-1])
    t /= np.diagonal(t, axis1=1, axis2=2).copy()[:, None, :]
    return t


# ------------------------------------------------------------------------------ in quantize_static

_SCRATCH = threading.local()
#: positions per int32 product of 8-bit codes: 255² each, the sums stay below 2^31
_GRAM_STEP = (2**31 - 1) // (255 * 255)
#: bytes of 8-bit codes a layer's half holds back for one Gram product (:meth:`RoundedLayer._queue`)
PENDING_BYTES = 1 << 22
#: bytes every layer's queues may hold together (in this process; a memory bound only:
#: the sums do not depend on when the codes are added)
PENDING_TOTAL_BYTES = 1 << 28
_PENDING_TOTAL = [0]
#: eq. (12o): the Gram products Σ K² one call of one layer (one sample, every group) takes
#: before its positions are subsampled. A Conv's Gram costs K/C_out times its own forward
#: MACs: RivaGAN's 11x11 convolutions over 32 channels (K = 3872, C_out = 32) at 267x280
#: positions spend 1.1e12 products a sample on H, 121x their forward pass.
GRAM_MACS = 1 << 37


def position_step(groups: int, k: int, positions: int) -> int:
    """Eq. (12o): every how many positions (im2col rows / input rows) of one call enter
    the layer's Gram matrix, each weighted by the step: 1 while G·K²·P stays within
    :data:`GRAM_MACS`, else the smallest step that brings it there."""
    cost = groups * k * k * positions
    return max(1, -(-cost // GRAM_MACS))


#: eq. (12o2): columns of H a native Gram product computes at a time. Only the blocks on
#: and above the diagonal are computed (H is symmetric); below GRAM_BLOCK * 2 columns the
#: whole product is one call (the saving would not pay for the extra packing).
GRAM_BLOCK = 256


def gram_u8_into(acc: np.ndarray, x: np.ndarray, o: int) -> np.ndarray:
    """Eq. (12o2): acc [K, K] int32 = (x − o)(x − o)ᵀ for 8-bit codes x [K, n] (n at most
    ``_GRAM_STEP``: no int32 sum overflows), by the native integer GEMM. For K of at least
    2·GRAM_BLOCK, column block [c0, c1) takes only rows [0, c1) (the blocks on and above
    the diagonal) and the blocks below the diagonal are copied from their transposes: the
    same integers as the whole product (integer sums are exact, and H_ij = H_ji), in about
    (K + GRAM_BLOCK) / (2·K) of its products."""
    from quanta.kernels import _native

    k, n = x.shape
    x = np.ascontiguousarray(x)
    # the transposes go through the native blocked transpose (NumPy's strided uint8 copy
    # is 3-10x slower)
    xt = _native.transpose_batched(x, 1, k, n).reshape(n, k)
    if k < 2 * GRAM_BLOCK:
        return _native.qgemm(x, _native.pack_weights_u8(xt, o), o, out=acc)
    for c0 in range(0, k, GRAM_BLOCK):
        c1 = min(k, c0 + GRAM_BLOCK)
        packed = _native.pack_weights_u8(np.ascontiguousarray(xt[:, c0:c1]), o)
        acc[:c1, c0:c1] = _native.qgemm(x[:c1], packed, o)
    for c0 in range(0, k - GRAM_BLOCK, GRAM_BLOCK):
        c1 = min(k, c0 + GRAM_BLOCK)
        acc[c1:, c0:c1] = acc[c0:c1, c1:].T
    return acc


def _scratch_i32(n: int) -> np.ndarray:
    """A flat int32 buffer of ``n`` entries, reused by the calls of one thread (grown to
    the largest asked for)."""
    buf = getattr(_SCRATCH, "buf", None)
    if buf is None or buf.size < n:
        buf = _SCRATCH.buf = np.empty(n, np.int32)
    return buf[:n]


def conv_rows(
    sample: np.ndarray,
    kernel: tuple[int, int],
    strides: tuple[int, int],
    pads: list[int],
    pad_value: float = 0,
) -> np.ndarray:
    """One sample's im2col [C, kh·kw, ho, wo] (in ``sample``'s dtype), padded with
    ``pad_value``: kh·kw strided slices (a copy each, not a gather of windows),
    cols[c, i·kw + j, p] = x_pad[c, i + sh·p_h, j + sw·p_w]."""
    (kh, kw), (sh, sw) = kernel, strides
    xp = np.pad(sample, ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])), constant_values=pad_value)
    ho = (xp.shape[1] - kh) // sh + 1
    wo = (xp.shape[2] - kw) // sw + 1
    cols = np.empty((xp.shape[0], kh * kw, ho, wo), xp.dtype)
    for i in range(kh):
        for j in range(kw):
            cols[:, i * kw + j] = xp[:, i : i + sh * (ho - 1) + 1 : sh, j : j + sw * (wo - 1) + 1 : sw]
    return cols


class RoundedLayer:
    """One Conv / Gemm / MatMul with a constant weight whose integers GPTQ chooses: the
    integer Gram matrix of its quantized input's rows as the layer sees them (im2col for a
    Conv; eq. (12d)), summed separately over the even- and odd-numbered samples (the
    held-out check of eq. (12c) fits on one and checks on the other). A grouped or
    depthwise Conv keeps one per group (the output channels of a group read only that
    group's input channels), [groups, K_g, K_g].

    The state is exactly mergeable (:meth:`merge`): integer sums. ``calls`` is the index
    of the next sample in the data (a shard sets it to its first sample's)."""

    def __init__(self, node, x_name: str, w_key: str, w: np.ndarray, x_key: str | None = None) -> None:
        # the node's op and attributes, not the node: the state travels to shard workers
        self.op = node.op_type
        self.name = node.name
        self.attrs = dict(node.attrs)
        self.x_name = x_name
        self.x_key = x_key if x_key is not None else x_name
        self.w_key = w_key
        op = self.op
        self.kernel = tuple(int(k) for k in w.shape[2:4]) if op == "Conv" else (1, 1)
        self.groups, k = self.gram_shape(node, w)
        self.k = k
        self._even = np.zeros((self.groups, k, k), np.int64)
        self._odd = np.zeros((self.groups, k, k), np.int64)
        # per half (even, odd): 8-bit codes [G, K, P] of samples whose Gram is not yet
        # added (:meth:`_queue`), with their zero point o
        self._pending: tuple[list[np.ndarray], list[np.ndarray]] = ([], [])
        self._pending_o = 0
        self.rows = 0
        self.odd_rows = 0
        self.calls = 0
        self.bound = 0  # an upper bound of |every sum|: int64 until it passes 2^62
        # the input's quantization (set from the plan once the ranges are known)
        self.x_scale = 1.0
        self.x_zero = 0
        self.x_range = (-(2**15), 2**15 - 1)

    @property
    def even(self) -> np.ndarray:
        """Σ x_int x_intᵀ over the even-numbered samples, int64 [G, K, K] (or Python
        integers past 2^62)."""
        self._flush(0)
        return self._even

    @even.setter
    def even(self, value: np.ndarray) -> None:
        self._flush(0)
        self._even = value

    @property
    def odd(self) -> np.ndarray:
        """:attr:`even` over the odd-numbered samples."""
        self._flush(1)
        return self._odd

    @odd.setter
    def odd(self, value: np.ndarray) -> None:
        self._flush(1)
        self._odd = value

    def set_input(self, scale: float, zero_point: int, qmin: int, qmax: int) -> None:
        self.x_scale, self.x_zero, self.x_range = float(scale), int(zero_point), (int(qmin), int(qmax))

    def _codes(self, x: np.ndarray) -> tuple[np.ndarray, int]:
        """Eq. (12d): x as the quantized model's integers, as (c, o) with x_int = c − o:
        for an 8-bit input c = q − qmin in uint8 (o = z − qmin), else c = q in float64
        (o = z)."""
        qmin, qmax = self.x_range
        # the quantized model's QuantizeLinear divides in float32 (eq. (2)): a float64
        # quotient rounds differently where the float32 one lands on a tie. In place on
        # one float32 copy (an activation of millions of entries); the codes, zero point
        # and bounds are integers float32 holds exactly.
        q = np.divide(x, np.float32(self.x_scale), dtype=np.float32)
        np.rint(q, out=q)
        q += np.float32(self.x_zero)
        np.clip(q, qmin, qmax, out=q)
        if qmax - qmin <= 255:
            q -= np.float32(qmin)
            return q.astype(np.uint8), self.x_zero - qmin
        return q.astype(np.float64), self.x_zero

    def _half(self, rows: int, bound: int) -> int:
        """Count one call of ``rows`` rows whose Gram entries are at most ``bound`` and
        return the half (eq. (12c), 0 even, 1 odd) its Gram matrix is added into."""
        self.bound += bound
        if self.bound >= 2**62 and self._even.dtype != object:  # Python integers from here on
            self.even, self.odd = self.even.astype(object), self.odd.astype(object)
        odd = self.calls % 2
        if odd:
            self.odd_rows += rows
        self.rows += rows
        self.calls += 1
        return odd

    def _queue(self, odd: int, c: np.ndarray, o: int) -> None:
        """Add the Gram matrix of 8-bit codes ``c`` [G, K, P] (zero point ``o``) into half
        ``odd``, possibly later: the codes of samples with few positions wait until a
        chunk of positions fills (one product, one int64 accumulation of [G, K, K] per
        chunk instead of per sample: a 2304-wide layer of 400 positions spends as long
        adding its int32 products into the int64 sums as computing them). The sums are
        the same integers in any grouping of the positions."""
        p = c.shape[2]
        if p > _GRAM_STEP // 2 or c.nbytes > PENDING_BYTES // 2:
            self._gram_into(self._writable(odd), c, o)
            return
        queue = self._pending[odd]
        if queue and (
            o != self._pending_o
            or sum(a.shape[2] for a in queue) + p > _GRAM_STEP
            or sum(a.nbytes for a in queue) + c.nbytes > PENDING_BYTES
        ):
            self._flush(odd)
        if _PENDING_TOTAL[0] + c.nbytes > PENDING_TOTAL_BYTES:  # every layer's queues together
            self._flush(odd)
            self._gram_into(self._writable(odd), c, o)
            return
        queue.append(c)
        _PENDING_TOTAL[0] += c.nbytes
        self._pending_o = o

    def drop_queued(self) -> None:
        """Forget the codes still waiting (a layer whose statistics are not read): they
        leave the all-layer bound of :data:`PENDING_TOTAL_BYTES`."""
        for queue in self._pending:
            _PENDING_TOTAL[0] = max(0, _PENDING_TOTAL[0] - sum(a.nbytes for a in queue))
            queue.clear()

    def _flush(self, odd: int) -> None:
        """Add the waiting codes of half ``odd`` (:meth:`_queue`) into its sums."""
        queue = self._pending[odd]
        if not queue:
            return
        c = queue[0] if len(queue) == 1 else np.concatenate(queue, axis=2)
        _PENDING_TOTAL[0] = max(0, _PENDING_TOTAL[0] - sum(a.nbytes for a in queue))
        queue.clear()
        self._gram_into(self._writable(odd), c, self._pending_o)

    def _writable(self, odd: int) -> np.ndarray:
        """Half ``odd``'s sums, copied first when they are read-only (a state received
        from another process, zero-copy), so that sums can be added into them in place."""
        half = self._odd if odd else self._even
        if isinstance(half, np.ndarray) and not half.flags.writeable:
            half = half.copy()
            if odd:
                self._odd = half
            else:
                self._even = half
        return half

    def __getstate__(self) -> dict:
        # a state leaves this process (a shard's result, a copy) with every sum added:
        # the sums, not the codes, travel
        self._flush(0)
        self._flush(1)
        return self.__dict__.copy()

    def _gram_into(self, out: np.ndarray, c: np.ndarray, o: int, weight: int = 1) -> None:
        """Add ``weight`` · Σ (c − o)(c − o)ᵀ over the last axis of ``c`` [G, K, P] (codes as
        :meth:`_codes` gives them; ``weight`` the step of eq. (12o)) into ``out`` [G, K, K], exactly. Codes of an 8-bit input
        and K >= 32: the native integer GEMM, uint8 x uint8 with zero points, int32 sums
        over chunks of positions short enough not to overflow (255² per product);
        otherwise float64 products of the integers in chunks whose sums stay below 2^53
        (exact whatever the BLAS's summation order)."""
        g, k, p = c.shape
        if self._native_gram(c.dtype, k):
            step = _GRAM_STEP
            # the int32 products land in one reused buffer: a fresh [K, K] array per call
            # costs its page faults, as long as the product itself for a K = 2304 layer
            # of 400 positions
            acc = _scratch_i32(k * k).reshape(k, k)
            for i in range(g):
                for a in range(0, p, step):
                    prod = gram_u8_into(acc, c[i, :, a : a + step], o)  # eq. (12o2)
                    if weight != 1:
                        prod = prod.astype(np.int64) * weight
                    np.add(out[i], prod, out=out[i])
            return
        self._gram_float_into(out, np.asarray(c, np.float64) - o, weight)

    @staticmethod
    def _native_gram(dtype: np.dtype, k: int) -> bool:
        """Whether :meth:`_gram_into` takes codes of ``dtype``, K rows, to the native integer GEMM."""
        return dtype == np.uint8 and k >= 32

    def _gram_float_into(self, out: np.ndarray, r: np.ndarray, weight: int = 1) -> None:
        """Add ``weight`` · Σ r rᵀ over the last axis of ``r`` [G, K, P] (float64 integers
        x_int) into ``out``, in chunks whose sums stay below 2^53 (exact in any summation order)."""
        step = max(1, (2**53 - 1) // (self._code_bound() ** 2))
        for a in range(0, r.shape[2], step):
            ch = r[:, :, a : a + step]
            out += np.matmul(ch, ch.transpose(0, 2, 1)).astype(np.int64) * weight

    def _code_bound(self) -> int:
        """The largest |x_int| of the input's range."""
        return int(max(abs(self.x_range[0] - self.x_zero), abs(self.x_range[1] - self.x_zero), 1))

    def observe(self, x: np.ndarray) -> None:
        codes, o = self._codes(x)
        m2 = self._code_bound() ** 2
        if self.op != "Conv":
            x2 = codes.reshape(-1, self.k)
            n = x2.shape[0]
            step = position_step(1, self.k, n)
            if step > 1:  # eq. (12o): every step-th row, weighted by the step
                x2 = x2[::step]
                odd = self._half(n, x2.shape[0] * step * m2)
                self._gram_into(self._writable(odd), x2.T[None], o, step)
                return
            odd = self._half(n, n * m2)
            if self._native_gram(codes.dtype, self.k):
                self._queue(odd, x2.T[None], o)
            else:
                self._gram_into(self._writable(odd), x2.T[None], o)
            return
        kh, kw = self.kernel
        sh, sw = [*self.attrs.get("strides", [1, 1]), 1, 1][:2]
        pads = list(self.attrs.get("pads", [0, 0, 0, 0]))
        g, k = self.groups, self.k
        ho = (codes.shape[2] + pads[0] + pads[2] - kh) // sh + 1
        wo = (codes.shape[3] + pads[1] + pads[3] - kw) // sw + 1
        rows = len(codes) * ho * wo
        # eq. (12o): every step-th output position of a sample, weighted by the step
        step = position_step(g, k, ho * wo)
        kept = -(-(ho * wo) // step)
        odd = self._half(rows, len(codes) * kept * step * m2)
        half = self._writable(odd)
        native = self._native_gram(codes.dtype, k)
        if step == 1 and not native and codes.dtype == np.uint8 and half.dtype == np.int64:
            conv_gram = _native_conv_gram()
            if conv_gram is not None:  # narrow 8-bit Grams (depthwise, a stem): summed natively
                conv_gram(np.ascontiguousarray(codes), o, g, (kh, kw), (sh, sw), pads, half)
                return
        # a 1x1 convolution of stride 1 without padding reads each position once: its
        # im2col is the sample itself
        plain = (kh, kw, sh, sw) == (1, 1, 1, 1) and not any(pads)
        # codes the native GEMM does not take: im2col straight in float64 x_int = c − o
        # (a depthwise layer's K = 9), not in codes converted after the 9x copy
        for sample in codes:  # one sample at a time: the im2col copy stays small
            # zero padding: a real 0 is the zero point, the code o (x_int 0)
            if not native:
                sample = np.asarray(sample, np.float64) - o
            pad = o if native else 0
            cols = sample if plain else conv_rows(sample, (kh, kw), (sh, sw), pads, pad)
            # rows of group g are its C/g channels × taps, in W.reshape(Cout, -1)'s order
            rows_g = cols.reshape(g, k, ho * wo)
            if step > 1:
                self._gram_into(half, rows_g[:, :, ::step], o if native else 0, step)
            elif native:  # cols is this sample's own array: it may wait in the queue
                self._queue(odd, rows_g, o)
            else:
                self._gram_float_into(half, rows_g)

    def merge(self, other: RoundedLayer) -> RoundedLayer:
        """Add ``other``'s statistics (other samples of the same data) into this one."""
        self.bound += other.bound
        if self.bound >= 2**62 or other.even.dtype == object:
            self.even, self.odd = self.even.astype(object), self.odd.astype(object)
        self.even += other.even
        self.odd += other.odd
        self.rows += other.rows
        self.odd_rows += other.odd_rows
        self.calls = max(self.calls, other.calls)
        return self

    def hessians(self) -> tuple[np.ndarray, np.ndarray]:
        """(H over every sample, H over the odd-numbered ones), float64 [G, K, K], in
        units of s_x² (GPTQ and the check of eq. (12c) do not depend on H's scale)."""
        full = (self.even + self.odd).astype(np.float64)
        return full, self.odd.astype(np.float64)

    def rows_2d(self, w: np.ndarray) -> np.ndarray:
        """W as [output channels, K] in the order of the input rows."""
        if self.op == "Conv":
            return w.reshape(w.shape[0], -1)
        if self.op == "Gemm" and self.attrs.get("transB", 0):
            return w
        return w.T

    def from_2d(self, q: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        if self.op == "Conv":
            return q.reshape(shape)
        if self.op == "Gemm" and self.attrs.get("transB", 0):
            return q
        return q.T

    @staticmethod
    def gram_shape(node, w: np.ndarray) -> tuple[int, int]:
        """(G, K) of the layer's Gram matrices [G, K, K]: a Conv's groups and the input
        taps one output reads (C_in / G · kH · kW), else 1 and the weight's K."""
        if node.op_type == "Conv":
            return int(node.attrs.get("group", 1)), int(np.prod(w.shape[1:]))
        if node.op_type == "Gemm" and node.attrs.get("transB", 0):
            return 1, int(w.shape[1])
        return 1, int(w.shape[0])  # MatMul / Gemm without transB: W [K, N]

    @classmethod
    def state_bytes(cls, node, w: np.ndarray) -> int:
        """The bytes of the two int64 [G, K, K] halves the layer holds (before allocating
        them: CREPE's 64-tap convolutions over 1024 channels have K = 65536, 32 GiB each)."""
        g, k = cls.gram_shape(node, w)
        return 2 * g * k * k * np.dtype(np.int64).itemsize

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


#: Memory the statistics of all layers may take together (two int64 [G, K, K] halves per
#: layer, held during the whole pass): layers past it, in graph order, keep nearest
#: rounding (a VGG-16's 3x3x512 convolutions take 340 MB each)
STATS_BUDGET = 1 << 30


def plan_rounding(graph, plan, budget: int | None = None) -> list[RoundedLayer]:
    """The quantized layers GPTQ applies to (int8 weights without a block size, zero
    point 0 is checked when the integers are chosen), in graph order while their
    statistics fit ``budget`` bytes (default :data:`STATS_BUDGET`)."""
    budget = STATS_BUDGET if budget is None else budget
    by_name = {v.name: v for v in graph.values()}
    out: list[RoundedLayer] = []
    used = 0
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
        size = RoundedLayer.state_bytes(d.node, np.asarray(w))
        if used + size > budget:
            continue  # sized before the layer allocates its statistics
        used += size
        out.append(RoundedLayer(d.node, x.name, roles[1], np.asarray(w), x_key=roles[0]))
    return out


def quantized_inputs(plan, layers: list[RoundedLayer]) -> list[RoundedLayer]:
    """The layers whose input is quantized with one scale (after resolve_params), each
    told its input's parameters; the others keep nearest rounding."""
    out = []
    for layer in layers:
        t = plan.tensors.get(layer.x_key)
        q = None if t is None else t.qtype
        if q is None or len(q.scale) != 1 or not hasattr(q.storage, "qmin"):
            continue
        layer.set_input(q.scale[0], int(q.zero_point[0]), q.storage.qmin, q.storage.qmax)
        out.append(layer)
    return out


def apply_rounding(graph, plan, layers: list[RoundedLayer], recipe: Recipe) -> int:
    """Choose the integers of every layer's weight with GPTQ (after resolve_params: the
    scales are final); they go into ``TensorPlan.codes``. Returns the number of weights
    rounded."""
    # One BLAS thread for the factorizations and products: on a machine whose cores other
    # processes share, OpenBLAS's spinning threads made EfficientNet-Lite0's Cholesky
    # factorizations 22x slower (14.3 s against 0.64 s), and one thread keeps the
    # integers from depending on how many cores split a product.
    with threadpool_limits(limits=1, user_api="blas"):
        return _apply_rounding(graph, plan, layers, recipe)


def _apply_rounding(graph, plan, layers: list[RoundedLayer], recipe: Recipe) -> int:
    from quanta.quantize.params import quant_range
    from quanta.quantize.qdq import seven_bit

    by_name = {v.name: v for v in graph.values()}
    n = 0
    for keys, readers, steps in _shared_weights(plan, layers):
        layer = readers[0]
        t = plan.tensors[keys[0]]
        q = t.qtype
        if q is None or q.block is not None or any(r.rows == 0 for r in readers):
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
        # the grid resolve_params chose the scale on (qdq.seven_bit)
        qmin, qmax = quant_range(q.storage, symmetric=True, reduce_range=seven_bit(t, recipe))
        g = layer.groups
        wg = w2.reshape(g, w2.shape[0] // g, w2.shape[1])
        full, half = _summed_hessians(readers, steps)
        odd_rows, rows = sum(r.odd_rows for r in readers), sum(r.rows for r in readers)
        sg = scale.reshape(g, -1)
        pairs = _ort_pairs(readers, w.shape, q.storage, qmax, recipe)
        codes = gptq_round_groups(wg, sg, full, qmin, qmax, partners=pairs)
        if 0 < odd_rows < rows:
            codes = _held_out(wg, sg, full - half, half, codes, qmin, qmax, pairs)
        if recipe.weight_rounding == "gptq_cd":
            # eqs. (12k)-(12l): coordinate descent from GPTQ's integers, per row where
            # it carries over to the held-out half
            if 0 < odd_rows < rows:
                codes = refine_held_out(wg, sg, full, half, codes, qmin, qmax, pairs)
            else:
                codes = refine_rounding(wg, sg, full, codes, qmin, qmax, partners=pairs)
        if pairs is not None and recipe.weight_pairs == "ort_rows" and len(q.scale) == w2.shape[0]:
            # eq. (12n): per row, the 7-bit grid where the pair constraint costs more
            held = 0 < odd_rows < rows
            codes, s_rows = _narrow_rows(wg, sg, full, half if held else None, codes, qmax, pairs)
            _set_weight_scales(plan, keys, q, s_rows.reshape(-1))
        chosen = layer.from_2d(codes.reshape(w2.shape), w.shape).astype(q.storage.numpy)
        for key in keys:
            plan.tensors[key].codes = chosen
        n += 1
    for layer in layers:
        layer.drop_queued()
    return n


#: the narrower grids eq. (12n) offers each row besides the full one: 64, every pair
#: inside eq. (12m) (the 7-bit grid). A grid m > 64 would stay under eq. (12m)'s
#: constraint, which binds less there (at 96 a largest code leaves its partner 32);
#: offering 96 too lost 3.8 dB on capspot_sim's held-out pairs and 0.01 F1 on
#: ddddocr_det for +0.5 dB on EfficientNet-Lite0 (benchmarks/results/2026-12-07c-pairsafe11.md)
NARROW_GRIDS: tuple[int, ...] = (64,)


def chosen_weights(model, plan, recipe: Recipe) -> list[tuple]:
    """The top-level layers whose weight integers were chosen (``TensorPlan.codes`` set),
    a constant weight only that layer reads, symmetric (zero points 0), not per block, in
    the plan's order: ``(decision, weight plan, weight value, (qmin, qmax))``. What GPTAQ
    (eqs. (12g)-(12j)) and the block reconstruction (eqs. (12p)-(12t)) may choose again: a
    weight several layers read keeps GPTQ's integers."""
    from quanta.quantize.params import quant_range
    from quanta.quantize.qdq import seven_bit

    graph = model.graph
    by_name = {v.name: v for v in graph.values()}
    top = {id(n) for n in graph.nodes}
    out = []
    for d in plan.decisions:
        roles = dict(d.inputs)
        if not d.quantize or 0 not in roles or 1 not in roles or id(d.node) not in top:
            continue
        t = plan.tensors[roles[1]]
        q = t.qtype
        w_v = by_name.get(t.name)
        if t.codes is None or q is None or q.block is not None or w_v is None or w_v.const is None:
            continue
        if len(list(w_v.consumers())) != 1 or np.any(np.asarray(q.zero_point_array()) != 0):
            continue
        out.append((d, t, w_v, quant_range(q.storage, symmetric=True, reduce_range=seven_bit(t, recipe))))
    return out


def _narrow_rows(
    w: np.ndarray,
    s: np.ndarray,
    h_full: np.ndarray,
    h_val: np.ndarray | None,
    codes: np.ndarray,
    qmax: int,
    partners: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Eq. (12n): per output row, the pair-constrained 8-bit ``codes`` (scale ``s``) or
    GPTQ on a narrower grid [−m, m] of the same range (scale s·qmax/m, m in
    :data:`NARROW_GRIDS`; under eq. (12m) with ``partners`` where m > 64, every pair
    inside it at m = 64), whichever errs least on the layer's objective d H dᵀ (with
    ``h_val``, the held-out check of eq. (12c) for each grid's codes too). Returns
    (codes, scales) [G, rows, K], [G, rows]."""

    def loss(q: np.ndarray, sc: np.ndarray) -> np.ndarray:
        d = w - sc[..., None] * q
        return np.einsum("grk,grk->gr", np.matmul(d, h_full), d)

    best_q, best_s, best = codes, s, loss(codes, s)
    for m in NARROW_GRIDS:
        sm = (s * (qmax / m)).astype(np.float32).astype(np.float64)
        p = partners if m > PAIR_LIMIT // 2 else None
        cm = gptq_round_groups(w, sm, h_full, -m, m, partners=p)
        if h_val is not None:
            cm = _held_out(w, sm, h_full - h_val, h_val, cm, -m, m, p)
        lm = loss(cm, sm)
        better = lm < best
        best_q = np.where(better[..., None], cm, best_q)
        best_s = np.where(better, sm, best_s)
        best = np.where(better, lm, best)
    return best_q, best_s


def _set_weight_scales(plan, keys: list[str], q, scales: np.ndarray) -> None:
    """The weight ``keys`` take per-row ``scales`` (float32 values) in place of ``q``'s; the
    biases of their layers follow (eq. (6): s_b = s_x·s_w)."""
    from dataclasses import replace

    from quanta.quantize.params import bias_params

    new = replace(q, scale=tuple(float(v) for v in scales.astype(np.float32)))
    for key in keys:
        plan.tensors[key].qtype = new
    for t in plan.tensors.values():
        if t.role == "bias" and t.bias_of is not None and t.bias_of[1] in keys and t.qtype is not None:
            x_t = plan.tensors.get(t.bias_of[0])
            if x_t is not None and x_t.qtype is not None:
                t.qtype = bias_params(x_t.qtype, new)


def _ort_pairs(
    readers: list[RoundedLayer], shape: tuple[int, ...], storage, qmax: int, recipe: Recipe
) -> np.ndarray | None:
    """ONNX Runtime's pair partners of the weight's columns (ort_pairs.pair_partners)
    when ``recipe.weight_pairs`` is "ort" / "ort_rows" and some reader meets ORT's saturating u8·s8
    GEMM: int8 codes that can pass 64, a uint8 input, not a depthwise Conv; else None."""
    if (
        recipe.weight_pairs not in ("ort", "ort_rows")
        or not storage.signed
        or storage.bits != 8
        or qmax <= PAIR_LIMIT // 2
    ):
        return None
    layer = readers[0]
    for r in readers:
        u8_input = r.x_range[0] >= 0 and r.x_range[1] <= 255
        if u8_input and not (r.op == "Conv" and is_depthwise(r.groups, shape)):
            return pair_partners(layer.op, shape, trans_b=bool(layer.attrs.get("transB", 0)))
    return None


def _summed_hessians(readers: list[RoundedLayer], steps: list[float | None]) -> tuple[np.ndarray, np.ndarray]:
    """(H, H over the odd samples) of one weight for all its readers, [G, K, K]: one
    reader's own; for several, each reader's in units of its output's quantization step,
    H·(s_x / s_y)², summed: the one rounding minimises the readers' output errors
    counted in their own LSBs, the grid each output is stored on next. In real units
    the sum would favour the reader with the largest outputs (a CQT's filter bank reads
    octaves whose output energies differ 200-fold, each on a scale of its own); in
    units of each output's energy, the quiet readers whose outputs the step already
    blurs. A reader whose output is not quantized counts in real units (s_y = 1)."""
    full, half = readers[0].hessians()
    if len(readers) == 1:
        return full, half
    full, half = np.zeros_like(full), np.zeros_like(half)
    for r, step in zip(readers, steps, strict=True):
        f, h = r.hessians()
        weight = (r.x_scale / (step or 1.0)) ** 2
        full, half = full + weight * f, half + weight * h
    return full, half


def _shared_weights(
    plan, layers: list[RoundedLayer]
) -> list[tuple[list[str], list[RoundedLayer], list[float | None]]]:
    """The weights GPTQ rounds, each once for all its readers: (the plan keys of one
    constant's readers with equal parameters, their layers, the step of each one's
    output where it is quantized with one scale).

    A constant several nodes read (a CQT's filter bank applied to each octave, a siamese
    net's branches) is planned once per reader (``w@node``); rounded per reader, each
    copy comes out different and the file stores every one. One rounding on the readers'
    summed Hessians (each in real units: :func:`apply_rounding`) minimises the total
    output error and leaves one integer tensor. Readers that need different integers
    anyway (another scale, zero point or axis: a bias raised the scale) form groups of
    their own. A group where some reader has no statistics (GPTQ does not apply to it,
    its input is not quantized with one scale) or whose readers see the weight in
    different layouts (another op, group count or transB) is left out: every reader
    keeps nearest rounding, which is the same for all of them."""
    by_key: dict[str, RoundedLayer] = {layer.w_key: layer for layer in layers}
    groups: dict[tuple, list[str]] = {}
    step: dict[str, float | None] = {}
    for d in plan.decisions:
        if not d.quantize:
            continue
        y = plan.tensors.get(d.output) if d.output else None
        y_scale = None if y is None or y.qtype is None else np.asarray(y.qtype.scale_array()).reshape(-1)
        for idx, key in d.inputs:
            t = plan.tensors[key]
            if idx != 1 or t.role != "weight" or t.qtype is None:
                continue
            q = t.qtype
            sig = (
                t.name,
                np.asarray(q.scale_array(), np.float64).tobytes(),
                np.asarray(q.zero_point_array(), np.int64).tobytes(),
                q.axis,
                q.block,
                q.storage,
            )
            groups.setdefault(sig, []).append(key)
            step[key] = float(y_scale[0]) if y_scale is not None and y_scale.size == 1 else None
    out = []
    for keys in groups.values():
        keys = list(dict.fromkeys(keys))
        readers = [by_key[k] for k in keys if k in by_key]
        if len(readers) != len(keys):
            continue
        layout = {(r.op, r.groups, r.k, bool(r.attrs.get("transB", 0))) for r in readers}
        if len(layout) == 1:
            out.append((keys, readers, [step[k] for k in keys]))
    return out


def _held_out(
    w: np.ndarray,
    s: np.ndarray,
    h_fit: np.ndarray,
    h_val: np.ndarray,
    codes: np.ndarray,
    qmin: int,
    qmax: int,
    partners: np.ndarray | None = None,
) -> np.ndarray:
    """Eq. (12c): per output row, GPTQ's ``codes`` (fitted on every sample) where GPTQ
    fitted on the even samples alone beats nearest rounding on the odd samples' rows,
    ‖(w − s·q) x‖² = d H_val dᵀ; nearest rounding elsewhere (where the calibration data
    is too small for the rows' second-order statistics to carry over). Arrays as in
    :func:`gptq_round_groups` ([G, rows, K], [G, rows], [G, K, K]); a single group may
    drop the leading axis."""
    single = w.ndim == 2
    if single:
        w, s, h_fit, h_val, codes = w[None], s[None], h_fit[None], h_val[None], codes[None]
    near = nearest_codes(w, s, qmin, qmax, partners)

    def loss(q: np.ndarray) -> np.ndarray:
        # d H dᵀ per row as a batched matmul, then the row dot: a three-operand einsum
        # runs as one scalar loop over g, r, k, l (0.3 s per 1x1 convolution of K = 1152,
        # a quarter of EfficientNet-Lite0's quantization; 4 s per VGG16 layer of K = 4608)
        d = w - s[..., None] * q
        return np.einsum("grk,grk->gr", np.matmul(d, h_val), d)

    fit = gptq_round_groups(w, s, h_fit, qmin, qmax, partners=partners)
    out = np.where((loss(fit) < loss(near))[..., None], codes, near)
    return out[0] if single else out
