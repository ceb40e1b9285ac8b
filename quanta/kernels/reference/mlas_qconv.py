"""quanta MlasQLinearConv: ONNX Runtime's QLinearConv with uint8 activations and int8 weights
as its x86 kernels without VNNI compute it (normative).

ORT fuses a QDQ Conv group with uint8 activations (or int8 ones its QDQS8ToU8Transformer
makes uint8) and int8 weights into QLinearConv. On x86-64 without AVX-VNNI / AVX512-VNNI,
MLAS forms the u8·s8 products with ``vpmaddubsw`` (``MlasGemmU8S8KernelAvx2``; the
AVX512BW kernel alike): two adjacent products of raw codes summed into a **saturating**
int16, so a pair beyond [−32768, 32767] is clipped; the zero points are corrected
afterwards from row and column sums, exactly. quanta's integer Conv sums exactly, so
codes differ wherever a pair saturates: ppocr_cls's first Conv group (an image at zero
point 128, asymmetric int8 weights) on 10,114 of 18,432 codes, by up to 24 steps.
docs/float-ops.md (QC1)-(QC4)::

    (QC1) x'[p, k], w[f, k]: raw uint8 codes (an int8 x as x + 128, zx + 128) and raw int8
          weights, k = (kh, kw, c) in that order (ORT's NHWC im2col; padding holds zx);
          K padded with zeros to a multiple of 4
    (QC2) acc[p, f] = Σ_j sat16(x'[p, 2j]·w[f, 2j] + x'[p, 2j+1]·w[f, 2j+1])
    (QC3) acc −= zx·Σ_k w[f, k] + zw[f]·Σ_k x'[p, k] − K·zx·zw[f];  acc += B[f]
    (QC4) m[f] = f32(f32(sx · sw[f]) / sy);  y = sat(rne(f32(f32(acc) · m[f])) + zy)

Checked against onnxruntime 1.32 on this CPU (Zen 3, AVX2) bit for bit: 12 geometries
(C = 1 ... 12, kernels 1, 3, 5, 7, strides 1 / 2, symmetric and asymmetric weights, 1 and
2 threads), where the exact sum differs on most codes; (kh, kw, c) is the order: the (c,
kh, kw) pairing differs. A grouped Conv is one such GEMM per group (checked: groups of 2,
3 and 4 input channels). Not this op: depthwise Convs (one input channel and one filter
per group: ORT's depthwise kernel is exact, as quanta's own path), and CPUs with VNNI,
where ORT's kernels do not saturate (the session asks for this op only where they do).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from quanta.kernels.reference.conv_geometry import conv_attrs, im2col
from quanta.kernels.reference.registry import OpContext, OpError, register

__all__ = ["mlas_qlinear_conv", "mlas_qlinear_conv_op", "saturation_correction"]

QUANTA_DOMAIN = "quanta"

I16_MIN, I16_MAX = -32768, 32767


#: candidate (row, pair) entries formed at once (each a row of F products)
CHUNK = 1 << 14


def saturation_correction(a: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ_j (sat16(p_j) − p_j) of (QC2) for rows ``a`` [P, K] (raw uint8 codes, any real
    dtype) and weights ``w`` [F, K] (raw int8), as int64 [P, F]: what MLAS's saturating
    pairs take from the exact sum. A pair leaves int16 only when a[p, 2j]·|w[f, 2j]| +
    a[p, 2j+1]·|w[f, 2j+1]| passes 32767 (255·128 < 32768 keeps a single product inside),
    so the pairs are formed only for the (row, pair) entries whose bound with the largest
    weights of that pair passes it; a pair that stays inside contributes 0. Every product
    and pair sum is an integer below 2^17: exact in float32."""
    p_count, k = a.shape
    f_count = w.shape[0]
    out = np.zeros((p_count, f_count), np.int64)
    if k % 2:
        a = np.pad(a, ((0, 0), (0, 1)))
        w = np.pad(w, ((0, 0), (0, 1)))
    a = a.astype(np.float32, copy=False)
    w0, w1 = w[:, 0::2].astype(np.float32), w[:, 1::2].astype(np.float32)
    a0, a1 = a[:, 0::2], a[:, 1::2]
    bound = a0 * np.abs(w0).max(axis=0) + a1 * np.abs(w1).max(axis=0)  # [P, J]
    rows, pairs = np.nonzero(bound > I16_MAX)  # rows in increasing order
    for c in range(0, rows.size, CHUNK):
        r, j = rows[c : c + CHUNK], pairs[c : c + CHUNK]
        prod = a0[r, j][:, None] * w0[:, j].T + a1[r, j][:, None] * w1[:, j].T  # [candidates, F]
        lost = (np.clip(prod, I16_MIN, I16_MAX) - prod).astype(np.float64)
        starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
        out[r[starts]] += np.add.reduceat(lost, starts, axis=0).astype(np.int64)
    return out


#: k per float32 GEMM: every partial sum of K products of codes (|x'·w| <= 255·128) is an
#: integer below 2^24, so float32 is exact
EXACT_F32_K = (1 << 24) // (255 * 128)


def mlas_qlinear_conv(
    x: np.ndarray,
    sx: np.ndarray,
    zx: np.ndarray,
    w: np.ndarray,
    sw: np.ndarray,
    zw: np.ndarray,
    sy: np.ndarray,
    zy: np.ndarray,
    b: np.ndarray | None = None,
    *,
    strides: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
) -> np.ndarray:
    """(QC1)-(QC4) (module docstring) for x [N, C, spatial...] (uint8 or int8 codes), w
    [F, C, kernel...] int8, per-tensor sx, zx, sy, zy, per-tensor or per-output-channel sw,
    zw, B int32 [F] or None; y has zy's type."""
    if w.dtype != np.int8 or x.dtype not in (np.uint8, np.int8):
        raise OpError(f"MlasQLinearConv: x {x.dtype}, w {w.dtype}; expected uint8 / int8 x and int8 w")
    zxv = int(np.asarray(zx).reshape(-1)[0])
    xu = x.astype(np.float32)  # codes are exact in float32
    if x.dtype == np.int8:  # QDQS8ToU8Transformer's view: the same values, codes + 128
        xu, zxv = xu + np.float32(128), zxv + 128
    geom = conv_attrs(x.shape, w.shape[2:], strides=strides, pads=pads, dilations=dilations)
    n, c = x.shape[:2]
    f = w.shape[0]
    if w.shape[1] != c:
        raise OpError(f"MlasQLinearConv: w has {w.shape[1]} input channels, x {c} (one group here)")
    r = len(geom.kernel_shape)
    p_shape = tuple(geom.out_shape)
    if all(v == 1 for v in (*geom.kernel_shape, *geom.strides)) and not any(geom.pads):
        a = xu.reshape(n, c, -1).transpose(0, 2, 1).reshape(-1, c)  # a pointwise Conv: x itself
    else:
        cols = im2col(xu, geom, pad_value=float(zxv))  # (N, C, *kernel, *out)
        # (QC1): rows p = (n, out...), k = (kernel..., c)
        a = cols.transpose(0, *range(2 + r, 2 + 2 * r), *range(2, 2 + r), 1).reshape(
            -1, c * int(np.prod(geom.kernel_shape))
        )
    wk = w.transpose(0, *range(2, 2 + r), 1).reshape(f, -1).astype(np.int64)
    k = a.shape[1]
    # (QC2): the exact sum, in float32 GEMMs of EXACT_F32_K terms, plus what the
    # saturating pairs take from it
    wt = wk.T.astype(np.float32)
    acc = np.zeros((a.shape[0], f), np.int64)
    for k0 in range(0, k, EXACT_F32_K):
        acc += (a[:, k0 : k0 + EXACT_F32_K] @ wt[k0 : k0 + EXACT_F32_K]).astype(np.int64)
    acc += saturation_correction(a, wk)
    zwv = np.broadcast_to(np.asarray(zw).astype(np.int64).reshape(-1), (f,))
    row_sums = a.sum(axis=1, dtype=np.float64).astype(np.int64)  # integers below 2^53: exact
    acc -= zxv * wk.sum(axis=1)[None, :] + zwv[None, :] * row_sums[:, None] - k * zxv * zwv[None, :]  # (QC3)
    if b is not None:
        acc += np.asarray(b).astype(np.int64).reshape(1, f)
    m = (np.float32(np.asarray(sx).reshape(-1)[0]) * np.asarray(sw, np.float32).reshape(-1)) / np.float32(
        np.asarray(sy).reshape(-1)[0]
    )  # (QC4)
    v = acc.astype(np.float32) * np.broadcast_to(m.astype(np.float32), (f,))[None, :]
    zy_arr = np.asarray(zy)
    info = np.iinfo(zy_arr.dtype)
    q = np.clip(np.rint(v).astype(np.float64) + int(zy_arr.reshape(-1)[0]), info.min, info.max).astype(
        zy_arr.dtype
    )
    return np.ascontiguousarray(q.reshape(n, *p_shape, f).transpose(0, r + 1, *range(1, r + 1)))


@register("MlasQLinearConv", QUANTA_DOMAIN)
def mlas_qlinear_conv_op(
    ctx: OpContext,
    x: np.ndarray,
    sx: np.ndarray,
    zx: np.ndarray,
    w: np.ndarray,
    sw: np.ndarray,
    zw: np.ndarray,
    sy: np.ndarray,
    zy: np.ndarray,
    b: np.ndarray | None = None,
    *,
    strides: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    group: int = 1,
    channels_last: int = 0,
) -> np.ndarray:
    """quanta MlasQLinearConv-1: QLinearConv's inputs and attributes (explicit pads; a
    group is one GEMM, depthwise refused), computed as ORT's u8·s8 kernels without VNNI
    do, (QC1)-(QC4) (module docstring). ``channels_last=1``: x is [N, *spatial, C] and y
    [N, *out, F] (what the channels-last pass writes between convolutions): the channel
    axis moved to 1 and back around the same computation, so the same codes."""
    del ctx  # unused
    if channels_last not in (0, 1):
        raise OpError(f"MlasQLinearConv: channels_last: expected 0 or 1, got {channels_last}")
    if channels_last:
        if x.ndim < 3:
            raise OpError(f"MlasQLinearConv: x of rank {x.ndim}: channels_last takes [N, *spatial, C]")
        y = mlas_qlinear_conv_op(
            OpContext(),
            np.moveaxis(x, -1, 1),
            sx,
            zx,
            w,
            sw,
            zw,
            sy,
            zy,
            b,
            strides=strides,
            pads=pads,
            dilations=dilations,
            group=group,
        )
        return np.ascontiguousarray(np.moveaxis(y, 1, -1))
    g = int(group)
    if g == 1:
        return mlas_qlinear_conv(
            x, sx, zx, w, sw, zw, sy, zy, b, strides=strides, pads=pads, dilations=dilations
        )
    # one GEMM per group (ORT's grouped QLinearConv), each in (QC1)-(QC4)
    c, f = x.shape[1], w.shape[0]
    if c % g or f % g or w.shape[1] != c // g:
        raise OpError(f"MlasQLinearConv: group {g} does not divide x's {c} channels and w's {f} filters")
    cg, fg = c // g, f // g
    if cg == 1 and fg == 1:
        raise OpError("MlasQLinearConv: a depthwise Conv (ORT's depthwise kernel is exact: quanta's own)")
    sw_a, zw_a = np.asarray(sw), np.asarray(zw)

    def part(v: np.ndarray, k: int) -> np.ndarray:
        return v if v.size == 1 else v.reshape(-1)[k * fg : (k + 1) * fg]

    ys = [
        mlas_qlinear_conv(
            x[:, k * cg : (k + 1) * cg],
            sx,
            zx,
            w[k * fg : (k + 1) * fg],
            part(sw_a, k),
            part(zw_a, k),
            sy,
            zy,
            None if b is None else np.asarray(b)[k * fg : (k + 1) * fg],
            strides=strides,
            pads=pads,
            dilations=dilations,
        )
        for k in range(g)
    ]
    return np.concatenate(ys, axis=1)
