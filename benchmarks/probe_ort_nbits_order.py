"""ONNX Runtime's float order for MatMulNBits bits 8, accuracy_level 4, block 32, on an
AVX-512 VNNI host (ORT 1.32): a numpy model of it checked bit for bit against ORT on random
products, what a twin bit-exact with ORT would have to compute (docs/quantization-math.md
(NB8-1); benchmarks/results/2026-12-07h-nbits8.md §1). quanta's twin keeps (W8)'s order.

    python benchmarks/probe_ort_nbits_order.py            # the shapes below, mismatches per case

Modelled (found by probing which partial sums ORT adds in int, in float, or chains by fused
multiply-add): per output, blocks in groups of four; the int8 dot of each 4-byte group L of
a block (a vpdpbusd lane) is added in int to group L + 2's, giving units u_b,g (g in 0, 1,
4, 5); 16 float32 lanes, lane i holds the fused multiply-add chain over the groups of four
of f32(u · f32(sa·s)) in the order ``ORDER``; the lanes fold as ``fold16``; then the bias,
then the zero points through a float GEMM of block sums:
``y = f32(f32(fold + bias) + G)``, ``G`` the fused multiply-add chain over blocks of
``f32(sa·Σqa) · f32(−s·zp)``. Exact for K a multiple of 128 (no leftover block), every row
count (1-3 probed) and the columns of full 4-column tiles (K 100-1536, N up to 64); a
short last block (K = 100) is the zero-padded block it is. Not modelled: the blocks left
over when the block count is not a multiple of 4 (they join the lanes in another layout),
and the last N mod 4 columns (another kernel path: no fold of these lanes matches them;
the model gives ORT's bits on 31 of 49 such outputs probed), block sizes other than 32
(block 64 pairs its blocks: the note).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quanta.kernels.reference.w4 import quantize_rows_a8

F32 = np.float32
#: (block of the group of four, unit g) of each float lane
ORDER = [(0, 0), (1, 0), (0, 1), (1, 1), (2, 0), (3, 0), (2, 1), (3, 1)]
ORDER = ORDER + [(b, g + 4) for b, g in ORDER]


def _add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a + b).astype(F32)


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    # one rounding of the exact a·b + c (float64 holds a float32 product exactly; the sum
    # rounds twice only in ties too rare to meet here)
    return (a.astype(np.float64) * b.astype(np.float64) + c.astype(np.float64)).astype(F32)


def fold16(v: np.ndarray) -> np.ndarray:
    """Lanes 0-7 and 8-15 each (((v0+v1)+(v2+v3))+(v4+v5))+(v6+v7); then the two added."""

    def half(o: int) -> np.ndarray:
        t = _add(_add(v[..., o], v[..., o + 1]), _add(v[..., o + 2], v[..., o + 3]))
        return _add(_add(t, _add(v[..., o + 4], v[..., o + 5])), _add(v[..., o + 6], v[..., o + 7]))

    return _add(half(0), half(8))


def ort_order(
    a: np.ndarray, q: np.ndarray, zp: np.ndarray, s: np.ndarray, bias: np.ndarray | None = None
) -> np.ndarray:
    """``a [M, K]`` float32, codes ``q [N, K]`` uint8, ``zp``, ``s [N, kb]``, block 32,
    kb a multiple of 4 -> ORT's y [M, N] (the model above)."""
    m, k = a.shape
    n = q.shape[0]
    kb = -(-k // 32)
    assert kb % 4 == 0, "groups of four blocks only"
    qa, sa = quantize_rows_a8(a, 32)  # [M, kb, 32], [M, kb]
    qp = np.zeros((n, kb * 32), np.int64)
    qp[:, :k] = q
    lane = (qa.reshape(m, 1, kb * 32) * qp[None]).reshape(m, n, kb, 8, 4).sum(-1)
    acc = np.zeros((m, n, 16), F32)
    for b0 in range(0, kb, 4):
        for i, (bb, g) in enumerate(ORDER):
            c = (sa[:, b0 + bb, None] * s[None, :, b0 + bb]).astype(F32)
            acc[..., i] = _fma(
                (lane[:, :, b0 + bb, g] + lane[:, :, b0 + bb, g + 2]).astype(F32), c, acc[..., i]
            )
    t = fold16(acc)
    if bias is not None:
        t = _add(t, bias[None, :])
    ablk = (sa * qa.sum(-1).astype(F32)).astype(F32)
    bblk = (-s * zp.astype(F32)).astype(F32)
    g_ = np.zeros((m, n), F32)
    for b in range(kb):
        g_ = _fma(ablk[:, b, None], bblk[None, :, b], g_)
    return _add(t, g_)


def ort_run(
    a: np.ndarray, q: np.ndarray, zp: np.ndarray, s: np.ndarray, bias: np.ndarray | None
) -> np.ndarray:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    m, k = a.shape
    n = q.shape[0]
    kb = -(-k // 32)
    qp = np.zeros((n, kb * 32), np.uint8)
    qp[:, :k] = q
    inits = [
        numpy_helper.from_array(qp.reshape(n, kb, 32), "B"),
        numpy_helper.from_array(s.reshape(-1), "s"),
        numpy_helper.from_array(zp.reshape(-1).astype(np.uint8), "z"),
    ]
    ins = ["x", "B", "s", "z"]
    if bias is not None:
        ins += ["", "bias"]
        inits.append(numpy_helper.from_array(bias, "bias"))
    node = helper.make_node(
        "MatMulNBits", ins, ["y"], domain="com.microsoft", K=k, N=n, bits=8, block_size=32, accuracy_level=4
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [m, n])],
        inits,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": a})[0]


def main() -> int:
    cases = [(1, 128, 16), (2, 128, 8), (3, 384, 64), (2, 1536, 16), (1, 384, 17), (2, 100, 9), (2, 128, 7)]
    for m, k, n in cases:
        rng = np.random.default_rng(m * k + n)
        kb = -(-k // 32)
        a = (rng.standard_normal((m, k)) * 2).astype(F32)
        q = rng.integers(0, 256, (n, k)).astype(np.uint8)
        zp = rng.integers(0, 256, (n, kb))
        s = rng.uniform(0.01, 0.05, (n, kb)).astype(F32)
        bias = rng.standard_normal(n).astype(F32)
        want = ort_run(a, q, zp, s, bias)
        got = ort_order(a, q, zp, s, bias)
        bad = np.argwhere(got.view(np.uint32) != want.view(np.uint32))
        cols = sorted({int(c) for _, c in bad})
        print(f"M={m} K={k} N={n}: {len(bad)} of {want.size} outputs differ (columns {cols})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
