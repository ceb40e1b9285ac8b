"""A copy of an int8 QDQ file whose Conv / Gemm / MatMul weights are pair-safe, for speed
measurements of the avx2 ``vpmaddubsw`` family (docs/kernels.md eq. (K1)-(K2)).

    python benchmarks/pair_safe_copy.py IN.onnx OUT.onnx

Pairs are walked in ONNX Runtime's order, which is also quanta's packed K order
(docs/kernels.md "Which k pair"): a Conv's weights per output channel in (kh, kw, c)
order, k paired from 0; a Gemm / MatMul B along its K axis. Each pair whose same-signed
codes sum past 128 is scaled onto the bound: ``a' = round(128·a / (a + b))``,
``b' = 128 − a'`` (signs kept). Depthwise Conv weights are left alone (their kernels
widen taps to int16), as are weights that are not int8 initializers behind a
DequantizeLinear. The copy stands in for a quantizer that writes pair-safe weights; it does
not choose codes for accuracy. The output is deterministic (no randomness, the graph
order kept).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np
import onnx
from onnx import numpy_helper

BOUND = 128  # docs/kernels.md eq. (K2)


def scale_pairs(rows: np.ndarray) -> tuple[np.ndarray, int]:
    """rows [R, K] of int8 codes, pairs (2j, 2j + 1) along axis 1 -> (pair-safe codes, pairs
    scaled). A lone last code (odd K) pairs with 0 and is always safe."""
    K = rows.shape[1]
    w = np.pad(rows.astype(np.int64), ((0, 0), (0, K % 2)))
    a, b = w[:, 0::2], w[:, 1::2]
    scaled = 0
    for sign in (1, -1):
        pa, pb = sign * a, sign * b
        total = pa + pb
        bad = (pa > 0) & (pb > 0) & (total > BOUND)
        scaled += int(bad.sum())
        na = np.rint(BOUND * pa / np.maximum(total, 1)).astype(np.int64)
        a = np.where(bad, sign * na, a)
        b = np.where(bad, sign * (BOUND - na), b)
    w[:, 0::2], w[:, 1::2] = a, b
    return np.clip(w[:, :K], -128, 127).astype(np.int8), scaled


def pair_safe_weight(op_type: str, attrs: dict[str, int], w: np.ndarray) -> tuple[np.ndarray, int] | None:
    """The pair-safe form of one node's int8 weight, or None when its kernel has no pairs."""
    if op_type == "Conv":
        M, cg = w.shape[:2]
        if cg == 1 and attrs.get("group", 1) == M:
            return None  # depthwise
        rows = np.moveaxis(w, 1, -1).reshape(M, -1)  # (kh, kw, c) per output channel
        safe, n = scale_pairs(rows)
        return np.ascontiguousarray(np.moveaxis(safe.reshape(M, *w.shape[2:], cg), -1, 1)), n
    if op_type == "Gemm" and attrs.get("transB", 0):
        return scale_pairs(w)  # [N, K]
    rows = np.swapaxes(w, -1, -2).reshape(-1, w.shape[-2])  # [.., N, K]
    safe, n = scale_pairs(rows)
    return np.ascontiguousarray(np.swapaxes(safe.reshape(*w.shape[:-2], w.shape[-1], w.shape[-2]), -1, -2)), n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("src")
    ap.add_argument("dst")
    args = ap.parse_args(argv)
    model = onnx.load(args.src)
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    producer = {o: n for n in graph.node for o in n.output}
    tensors = already = scaled = 0
    for node in graph.node:
        if node.op_type not in ("Conv", "Gemm", "MatMul") or len(node.input) < 2:
            continue
        dq = producer.get(node.input[1])
        if dq is None or dq.op_type != "DequantizeLinear" or dq.input[0] not in inits:
            continue
        t = inits[dq.input[0]]
        w = numpy_helper.to_array(t)
        if w.dtype != np.int8:
            print(
                f"{args.src}: node {node.name!r}: weight {t.name!r} is {w.dtype}, left alone", file=sys.stderr
            )
            continue
        attrs = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
        out = pair_safe_weight(node.op_type, attrs, w)
        if out is None:
            continue
        safe, n = out
        tensors += 1
        already += n == 0
        scaled += n
        t.CopyFrom(numpy_helper.from_array(safe, t.name))
    onnx.save(model, args.dst)
    print(
        f"{args.src}: {tensors} weight tensors with pairs, {already} already pair-safe, {scaled} pairs scaled"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
