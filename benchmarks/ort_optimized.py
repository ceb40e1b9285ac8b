"""A BERT as users bring it after ONNX Runtime's transformer optimizer: quanta runs the
optimized file and ORT's ``quantize_dynamic`` of it (Attention, SkipLayerNormalization,
EmbedLayerNormalization, BiasGelu; QAttention, QEmbedLayerNormalization), and quantizes
the optimized file itself; fidelity against the plain FP32 export, distance from ORT on
the same file, and 1-thread latency against ORT (thread CPU time, interleaved).

    python benchmarks/real_models/export.py          # all-MiniLM-L6-v2 into ~/.cache/quanta-bench
    python benchmarks/ort_optimized.py [--cache ~/.cache/quanta-bench] [--tokens 128]

The optimized and quantized files are written to ``--out`` (default a temporary folder).
Inputs: token ids drawn from the middle of the vocabulary (1000-3000), no padding, and
for fidelity eight more feeds with padded rows.
"""

from __future__ import annotations

import argparse
import collections
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic
from onnxruntime.transformers.optimizer import optimize_model

import quanta


def feeds(n: int, tokens: int, seed: int, padded: bool) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        mask = np.ones((1, tokens), np.int64)
        if padded:
            mask[0, rng.integers(tokens // 4, tokens) :] = 0
        ids = rng.integers(1000, 3000, (1, tokens)).astype(np.int64)
        out.append({"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)})
    return out


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def latency(path: str, feed: dict[str, np.ndarray], rounds: int) -> tuple[float, float]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    o = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    qo = quanta.SessionOptions()
    qo.intra_op_num_threads = 1
    q = quanta.InferenceSession(path, sess_options=qo)
    for _ in range(3):
        o.run(None, feed)
        q.run(None, feed)
    tq: list[float] = []
    to: list[float] = []
    for _ in range(rounds):
        for run, acc in ((q.run, tq), (o.run, to)):
            t = time.thread_time()
            run(None, feed)
            acc.append(time.thread_time() - t)
    return float(np.median(tq)) * 1e3, float(np.median(to)) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", default=str(Path.home() / ".cache" / "quanta-bench"))
    ap.add_argument("--out", help="folder for the optimized and quantized files (default: a temporary one)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=15)
    args = ap.parse_args(argv)
    src = Path(args.cache).expanduser() / "all_minilm_l6_v2.onnx"
    out = Path(args.out or tempfile.mkdtemp(prefix="ort_optimized_"))
    out.mkdir(parents=True, exist_ok=True)
    opt, dyn = out / "minilm.ort_optimized.onnx", out / "minilm.ort_optimized.ort_dynamic.onnx"
    optimize_model(str(src), model_type="bert", num_heads=12, hidden_size=384).save_model_to_file(str(opt))
    ort_quantize_dynamic(str(opt), str(dyn), extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT})
    calib = feeds(8, args.tokens, 1, padded=True)
    mine_static, mine_dyn = (
        out / "minilm.ort_optimized.quanta.onnx",
        out / "minilm.ort_optimized.quanta_dynamic.onnx",
    )
    s = quanta.quantize_static(str(opt), str(mine_static), calib, verbose=False)
    d = quanta.quantize_dynamic(str(opt), str(mine_dyn), verbose=False)
    print(f"source {src}")
    for path in (opt, dyn):
        ops = collections.Counter(
            n.op_type for n in onnx.load(str(path)).graph.node if n.domain == "com.microsoft"
        )
        print(f"{path.name}: {dict(ops)}")
    print(f"quanta static of the optimized file: integer MACs {s.coverage.integer_share:.1%}")
    print(f"quanta dynamic of the optimized file: integer MACs {d.coverage.integer_share:.1%}")
    ref = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    evals = feeds(8, args.tokens, 7, padded=True) + feeds(4, args.tokens, 8, padded=False)
    print(
        "| file | cos min vs FP32 (ORT runs it) | max abs quanta - ORT (same file) | quanta ms | ORT ms | q/ORT |"
    )
    print("|---|---|---|---|---|---|")
    for path in (opt, dyn, mine_static, mine_dyn):
        o = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        q = quanta.InferenceSession(str(path))
        cos, dist = [], []
        for f in evals:
            want = ref.run(None, f)[0]
            a = o.run(None, f)[0]
            cos.append(cosine(a, want))
            dist.append(float(np.abs(q.run(None, f)[0] - a).max()))
        qms, oms = latency(str(path), evals[-1], args.rounds)
        print(f"| {path.name} | {min(cos):.4f} | {max(dist):.2e} | {qms:.2f} | {oms:.2f} | {qms / oms:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
