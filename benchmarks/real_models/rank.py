"""The debugger's ranking against ablation on EfficientNet-Lite0 / all-MiniLM-L6-v2
(benchmarks/results/2026-12-04-rank.md; docs/debugger.md eqs. (5), (5e), (6), (6b)).

    python benchmarks/real_models/rank.py quantize MODEL OUT/      # defaults, once
    python benchmarks/real_models/rank.py ablate MODEL OUT/        # both modes, every node
    python benchmarks/real_models/rank.py estimate MODEL OUT/ N    # compare() on N feeds
    python benchmarks/real_models/rank.py report MODEL OUT/ N

``ablate`` runs every quantized node with a local row in both ablation modes on ONNX
Runtime with graph optimisations off (every Q/DQ and op as written, in float: the QDQ
semantics of eq. (4), and minutes where quanta's reference target takes hours), over
the whole evaluation split, and keeps each row's (sample's) output noise so that
``report`` gives standard errors paired over samples. ``estimate`` runs
``quanta.debug.compare`` (quanta's reference target) and keeps eq. (5) and eq. (5e).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import levers as L  # noqa: E402
from export import DEFAULT_CACHE, model_paths  # noqa: E402


def _session(proto):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])


def _rows(a) -> np.ndarray:
    a = np.asarray(a, np.float64)
    return a.reshape(-1, a.shape[-1]) if a.ndim >= 2 else a.reshape(1, -1)


def ablate(model: str, out: Path) -> None:
    import onnx

    from quanta.debug.compare import _bypass, _isolate, _load, _Plan

    _, fp32 = model_paths(DEFAULT_CACHE, model)
    qpath = out / f"{model}.default.onnx"
    _, feeds = L.data(model)
    fproto, qproto = onnx.load(str(fp32)), onnx.load(str(qpath))
    plan = _Plan(_load(str(fp32), "fp32"), _load(str(qpath), "quantized"), False, gains=False)
    name = fproto.graph.output[0].name
    ref = [_rows(_session(fproto).run([name], f)[0]) for f in feeds]
    signal = np.concatenate([np.sum(r * r, 1) for r in ref])

    def noise(proto) -> np.ndarray:
        s = _session(proto)
        o = proto.graph.output[0].name
        return np.concatenate([np.sum((_rows(s.run([o], f)[0]) - r) ** 2, 1) for f, r in zip(feeds, ref)])

    t0 = time.process_time()
    res = {"signal": signal, "full": noise(qproto)}
    names = []
    for t, row in zip(plan.targets, plan.rows):
        if row.local is None or t.prefix:
            continue
        k = len(names)
        res[f"only/{k}"] = noise(_isolate(fproto, qproto, t, plan.derived))
        res[f"float/{k}"] = noise(_bypass(qproto, t.node.name))
        names.append(row.name)
    np.savez(out / f"abl_{model}_eval.npz", names=np.array(names), **res)
    print(f"{model}: {len(names)} nodes x 2 modes x {len(feeds)} feeds, {time.process_time() - t0:.0f} s CPU")


def estimate(model: str, out: Path, n: int) -> None:
    from quanta.debug.compare import compare

    _, fp32 = model_paths(DEFAULT_CACHE, model)
    _, feeds = L.data(model)
    t0 = time.process_time()
    res = compare(str(fp32), str(out / f"{model}.default.onnx"), feeds[:n], histograms=False)
    cpu = time.process_time() - t0
    rows = [r for r in res.nodes if r.local is not None]
    tot = sum(r.local.nsr for r in rows if np.isfinite(r.local.nsr))
    doc = {
        "cpu_s": cpu,
        "feeds": n,
        "output_sqnr_db": res.output_sqnr_db,
        "nodes": [
            {
                "name": r.name,
                "op": r.op,
                "local_nsr": r.local.nsr,
                "gain": r.gain,
                "share": r.contribution,
                "eq5": r.local.nsr / tot,
            }
            for r in rows
        ],
    }
    (out / f"est_{model}_{n}.json").write_text(json.dumps(doc, indent=1))
    print(f"{model}: compare on {n} feeds, {cpu:.0f} s CPU, output {res.output_sqnr_db:.2f} dB")


def _ratio(n: np.ndarray, signal: np.ndarray) -> tuple[float, float]:
    """Σn / Σsignal over the rows and its standard error (the delta method over rows)."""
    total, rows = signal.sum(), signal.size
    r = n.sum() / total
    return r, float(np.sqrt(np.sum((n - r * signal) ** 2) * rows / (rows - 1)) / total)


def report(model: str, out: Path, n: int) -> None:
    from scipy.stats import spearmanr

    a = np.load(out / f"abl_{model}_eval.npz")
    est = {r["name"]: r for r in json.loads((out / f"est_{model}_{n}.json").read_text())["nodes"]}
    names = [str(x) for x in a["names"] if str(x) in est]
    index = {str(x): k for k, x in enumerate(a["names"])}
    signal, full = a["signal"], a["full"]
    r_full, se_full = _ratio(full, signal)
    only = np.array([a[f"only/{index[m]}"] for m in names])  # per node, per row: output noise
    flt = np.array([full - a[f"float/{index[m]}"] for m in names])  # per row: what float wins
    o = np.array([_ratio(x, signal) for x in only])
    d = np.array([_ratio(x, signal) for x in flt])
    eq5 = np.array([est[m]["eq5"] for m in names])
    new = np.array([est[m]["share"] for m in names])
    print(
        f"{model}: {len(names)} nodes, {signal.size} rows; full model NSR {r_full:.3e} "
        f"({-10 * np.log10(r_full):.2f} dB) ± {se_full / r_full * 100:.1f} %"
    )
    print(
        f"  Σ only-this-quantized = {o[:, 0].sum() / r_full:.2f} x the full model's NSR; "
        f"Σ only-this-float = {d[:, 0].sum() / r_full:.2f} x"
    )

    def top(v: np.ndarray, k: int) -> set[int]:
        return set(np.argsort(-v, kind="stable")[:k].tolist())

    for label, v in (("eq. (5)", eq5), ("eq. (5e)", new), ("only (6b)", o[:, 0]), ("float (6)", d[:, 0])):
        cells = []
        for ref_label, ref in (("only", o[:, 0]), ("float", d[:, 0])):
            cells.append(
                f"vs {ref_label}: top-5 {len(top(v, 5) & top(ref, 5))}/5, top-10 {len(top(v, 10) & top(ref, 10))}/10,"
                f" Spearman {spearmanr(v, ref)[0]:.2f}"
            )
        print(f"  {label:10s} " + "; ".join(cells))
    for label, (v, per_row) in (("only (6b)", (o, only)), ("float (6)", (d, flt))):
        idx = np.argsort(-v[:, 0], kind="stable")[:8]
        print(
            f"  worst by {label}: value ± se in units of the full model's NSR; eq. (5) / eq. (5e) shares; gap to the next"
        )
        for rank, i in enumerate(idx):
            gap = ""
            if rank + 1 < len(idx):
                g, se = _ratio(per_row[i] - per_row[idx[rank + 1]], signal)
                gap = f"  {g / se:+.1f} se"
            print(
                f"    {names[i][-58:]:58s} {v[i, 0] / r_full:7.4f} ± {v[i, 1] / r_full:.4f}"
                f"  {eq5[i] * 100:5.1f} % / {new[i] * 100:5.1f} %{gap}"
            )
    print("  worst by eq. (5e): share, gain, only (6b), float (6) in units of the full model's NSR")
    for i in np.argsort(-new, kind="stable")[:8]:
        print(
            f"    {names[i][-58:]:58s} {new[i] * 100:5.1f} %  g {est[names[i]]['gain'] or 0:.3g}"
            f"  {o[i, 0] / r_full:.4f}  {d[i, 0] / r_full:.4f}"
        )


if __name__ == "__main__":
    cmd, model, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    out.mkdir(parents=True, exist_ok=True)
    if cmd == "quantize":
        import quanta

        _, fp32 = model_paths(DEFAULT_CACHE, model)
        calib, _ = L.data(model)
        quanta.quantize_static(
            str(fp32), str(out / f"{model}.default.onnx"), calib, verbose=False, progress=False
        )
    elif cmd == "ablate":
        ablate(model, out)
    elif cmd == "estimate":
        estimate(model, out, int(sys.argv[4]))
    elif cmd == "report":
        report(model, out, int(sys.argv[4]))
    else:
        sys.exit(f"unknown command {cmd!r}: quantize | ablate | estimate | report")
