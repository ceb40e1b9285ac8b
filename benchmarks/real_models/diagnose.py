"""Where a quantized model's error comes from: the experiments behind docs/accuracy.md's
findings, on a QDQ file written by ``accuracy.py`` (``<cache>/quantized/<model>.<config>.onnx``,
``<cache>/quantized`` pointing to its latest run; ``--dir`` names another run folder).

    python benchmarks/real_models/diagnose.py tensors efficientnet_lite0 quanta_default
    python benchmarks/real_models/diagnose.py split efficientnet_lite0 quanta_default
    python benchmarks/real_models/diagnose.py bias-correction efficientnet_lite0 quanta_default
    python benchmarks/real_models/diagnose.py entropy all_minilm_l6_v2 --tensor NAME [--tensor NAME ...]

- ``tensors``: each quantized activation alone — the SQNR of quantize-dequantize with the
  file's (scale, zero point) on the FP32 model's evaluation activations, and the fraction
  clipped — then each quantized weight alone. Lowest first.
- ``split``: the file with float weights (activations quantized as the file says), and the
  file with every activation Q/DQ pair removed (weights quantized): which half costs the
  accuracy. Run by ONNX Runtime with graph optimisations off, so the edited graphs run as
  written.
- ``bias-correction``: first-order empirical bias correction (Nagel et al. 2019, "Data-free
  quantization", eq. for E[ΔW·x]): each Conv/Gemm bias minus ΔW·E[x], E[x] per input
  channel from the calibration data, requantized with the file's bias scale. Shows what
  the algorithm would gain.
- ``entropy``: quanta's EntropyObserver on the named FP32 activations (calibration data),
  with and without the exact zeros that the histogram counts separately: the KL threshold
  each way, and how much of the tensor the chosen range clips.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import accuracy as A  # noqa: E402  (this folder is not a package)
from export import DEFAULT_CACHE, EFFICIENTNET, MINILM, model_paths  # noqa: E402


def _data(model: str) -> tuple[list[A.Feed], list[A.Feed]]:
    if model == EFFICIENTNET:
        return A.image_data(100, 200, 10)
    return A.sentence_data(100, 8)


def _float_activations(fp32: Path, names: list[str], feeds: list[A.Feed]) -> list[list[np.ndarray]]:
    """Every named tensor of the FP32 model, for each feed."""
    import onnx
    import onnxruntime as ort

    m = onnx.load(str(fp32))
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=n))
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return [sess.run(names, f) for f in feeds]


def _initializers(proto: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    return {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}


def _dequantized_weight(node: Any, init: dict[str, np.ndarray]) -> np.ndarray:
    w = init[node.input[0]].astype(np.float64)
    s = init[node.input[1]].astype(np.float64)
    z = init[node.input[2]].astype(np.float64) if len(node.input) > 2 else np.zeros_like(s)
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    if s.ndim == 1 and s.size > 1:
        shape = [1] * w.ndim
        shape[axis] = -1
        s, z = s.reshape(shape), z.reshape(shape)
    return (w - z) * s


def _float_name(quantized: str, orig: dict[str, np.ndarray]) -> str | None:
    """The FP32 initializer a quantized one was made from (quanta and ORT append a suffix)."""
    for suffix in ("_quantized", "_q"):
        if quantized.endswith(suffix) and quantized[: -len(suffix)] in orig:
            return quantized[: -len(suffix)]
    return None


def cmd_tensors(model: str, qfile: Path, fp32: Path, top: int) -> None:
    import onnx

    _, evals = _data(model)
    evals = evals[:6] if model == MINILM else evals[:3]
    q = onnx.load(str(qfile))
    init = _initializers(q)
    qs = [
        (n.input[0], init[n.input[1]], init[n.input[2]])
        for n in q.graph.node
        if n.op_type == "QuantizeLinear" and n.input[0] not in init
    ]
    acts = _float_activations(fp32, [t for t, _, _ in qs], evals)
    rows = []
    for k, (name, scale, zp) in enumerate(qs):
        x = np.concatenate([a[k].ravel() for a in acts]).astype(np.float64)
        info = np.iinfo(zp.dtype)
        z = int(zp)
        xq = (np.clip(np.rint(x / scale) + z, info.min, info.max) - z) * float(scale)
        lo, hi = (info.min - z) * float(scale), (info.max - z) * float(scale)
        rows.append(
            (A.sqnr_db(x, xq), name, float(scale), z, x.min(), x.max(), np.mean((x < lo) | (x > hi)), x.std())
        )
    rows.sort()
    print(f"{len(rows)} quantized activations of {qfile.name}, each alone (lowest SQNR first):")
    for r in rows[:top]:
        print(
            f"{r[0]:6.1f} dB  {r[1][:72]:72s} scale {r[2]:.4g} zp {r[3]:4d} "
            f"data [{r[4]:.3g}, {r[5]:.3g}] std {r[7]:.3g} clipped {r[6]:.1e}"
        )
    orig = _initializers(onnx.load(str(fp32)))
    weights = []
    for n in q.graph.node:
        base = (
            _float_name(n.input[0], orig) if n.op_type == "DequantizeLinear" and n.input[0] in init else None
        )
        if base is not None and init[n.input[0]].dtype != np.int32:  # int32: biases
            w = orig[base].astype(np.float64)
            weights.append((A.sqnr_db(w, _dequantized_weight(n, init)), base, w.shape))
    weights.sort(key=lambda r: r[0])
    print(f"\n{len(weights)} quantized weights, each alone (lowest SQNR first):")
    for sq, name, shape in weights[: max(1, top // 2)]:
        print(f"{sq:6.1f} dB  {name} {list(shape)}")


def _edit(
    qfile: Path, fp32: Path, *, float_weights: bool, float_activations: bool, weight_dtype: Any = None
) -> bytes:
    import onnx
    from onnx import numpy_helper

    q = onnx.load(str(qfile))
    g = q.graph
    init = _initializers(q)
    orig = _initializers(onnx.load(str(fp32)))
    producer = {o: n for n in g.node for o in n.output}
    rename: dict[str, str] = {}
    drop: set[int] = set()
    for n in g.node:
        if n.op_type != "DequantizeLinear":
            continue
        src = n.input[0]
        if src in init and float_weights:
            base = _float_name(src, orig)
            if base is None or (weight_dtype is not None and init[src].dtype != weight_dtype):
                continue
            t = numpy_helper.from_array(orig[base], n.output[0] + "_float")
            g.initializer.append(t)
            rename[n.output[0]] = t.name
            drop.add(id(n))
        elif src not in init and float_activations:
            qn = producer.get(src)
            if qn is not None and qn.op_type == "QuantizeLinear":
                rename[n.output[0]] = qn.input[0]
                drop.update((id(n), id(qn)))
    nodes = [n for n in g.node if id(n) not in drop]
    for n in nodes:
        for i, x in enumerate(n.input):
            n.input[i] = rename.get(x, x)
    for o in g.output:
        o.name = rename.get(o.name, o.name)
    del g.node[:]
    g.node.extend(nodes)
    return q.SerializeToString()


def _run_as_written(model_bytes: bytes, feeds: list[A.Feed]) -> np.ndarray:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    return np.concatenate([sess.run(None, f)[0] for f in feeds])


def _fmt(m: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.4f}" for k, v in m.items())


def cmd_split(model: str, qfile: Path, fp32: Path) -> None:
    _, evals = _data(model)
    ref = A.run_ort(fp32, evals)
    variants = {
        "as quantized": qfile.read_bytes(),
        "float weights and biases": _edit(qfile, fp32, float_weights=True, float_activations=False),
        "float weights (int8 only), quantized biases": _edit(
            qfile, fp32, float_weights=True, float_activations=False, weight_dtype=np.int8
        ),
        "float activations (weights quantized)": _edit(
            qfile, fp32, float_weights=False, float_activations=True
        ),
    }
    for name, b in variants.items():
        print(f"{name:45s} {_fmt(A.metrics_for(model, ref, _run_as_written(b, evals)))}", flush=True)


def cmd_bias_correction(model: str, qfile: Path, fp32: Path) -> None:
    import onnx
    from onnx import numpy_helper

    calib, evals = _data(model)
    ref = A.run_ort(fp32, evals)
    q = onnx.load(str(qfile))
    g = q.graph
    init = _initializers(q)
    inits = {i.name: i for i in g.initializer}
    orig = _initializers(onnx.load(str(fp32)))
    producer = {o: n for n in g.node for o in n.output}

    def float_source(name: str) -> str:
        dq = producer.get(name)
        if dq is not None and dq.op_type == "DequantizeLinear":
            qn = producer.get(dq.input[0])
            if qn is not None and qn.op_type == "QuantizeLinear":
                return qn.input[0]
        return name

    layers = []
    for n in g.node:
        if n.op_type not in ("Conv", "Gemm", "MatMul") or len(n.input) < 2:
            continue
        wdq = producer.get(n.input[1])
        if wdq is None or wdq.op_type != "DequantizeLinear" or wdq.input[0] not in init:
            continue
        bias_dq = None
        if n.op_type in ("Conv", "Gemm") and len(n.input) > 2:
            bias_dq = producer.get(n.input[2])
        if bias_dq is None or bias_dq.op_type != "DequantizeLinear" or bias_dq.input[0] not in init:
            continue  # MatMul + Add(bias) graphs: not handled here
        base = _float_name(wdq.input[0], orig)
        if base is not None:
            layers.append((n, wdq, bias_dq, orig[base].astype(np.float64), float_source(n.input[0])))
    sources = sorted({s for *_, s in layers})
    sums: dict[str, np.ndarray] = {}
    counts: dict[str, int] = {}
    for outs in _float_activations(fp32, sources, calib):
        for name, a in zip(sources, outs):
            per_channel = a.reshape(a.shape[0], a.shape[1], -1).transpose(1, 0, 2) if a.ndim > 2 else a.T
            per_channel = per_channel.reshape(per_channel.shape[0], -1).astype(np.float64)
            sums[name] = sums.get(name, 0) + per_channel.sum(axis=1)
            counts[name] = counts.get(name, 0) + per_channel.shape[1]
    for n, wdq, bias_dq, w, src in layers:
        ex = sums[src] / counts[src]
        dw = _dequantized_weight(wdq, init) - w
        if n.op_type == "Conv":
            group = next((a.i for a in n.attribute if a.name == "group"), 1)
            dws = dw.sum(axis=tuple(range(2, dw.ndim)))  # (cout, cin/group); borders ignored
            cout, cin_g = dws.shape
            per = cout // group
            err = np.array([dws[o] @ ex[(o // per) * cin_g : (o // per + 1) * cin_g] for o in range(cout)])
        else:
            trans_b = next((a.i for a in n.attribute if a.name == "transB"), 0)
            err = dw @ ex if trans_b else dw.T @ ex
        scale = init[bias_dq.input[1]].astype(np.float64)
        b = init[bias_dq.input[0]].astype(np.float64) * scale
        corrected = np.rint((b - err) / scale).astype(init[bias_dq.input[0]].dtype)
        inits[bias_dq.input[0]].CopyFrom(numpy_helper.from_array(corrected, bias_dq.input[0]))
    before = A.metrics_for(model, ref, A.run_ort(qfile, evals))
    out = qfile.with_name(qfile.stem + ".biascorr.onnx")
    onnx.save(q, str(out))
    after = A.metrics_for(model, ref, A.run_ort(out, evals))
    print(f"{len(layers)} Conv/Gemm biases corrected with E[x] from the calibration data")
    print(f"before: {_fmt(before)}\nafter:  {_fmt(after)}   ({out})")


def cmd_entropy(model: str, fp32: Path, tensors: list[str]) -> None:
    from quanta.calibrate.entropy import EntropyObserver, kl_divergences

    calib, _ = _data(model)
    outs = _float_activations(fp32, tensors, calib)
    for k, name in enumerate(tensors):
        obs = EntropyObserver()
        for o in outs:
            obs.observe(o[k])
        x = np.concatenate([o[k].ravel() for o in outs])
        view = obs.view(0)
        a = view.abs_counts()
        levels = obs.levels(view)
        kl = kl_divergences(a, levels)
        t = (int(np.flatnonzero(kl == kl.min())[-1]) + levels) * view.width
        a_nz = a.copy()
        a_nz[0] -= view.zeros
        kl_nz = kl_divergences(a_nz, levels)
        t_nz = (int(np.flatnonzero(kl_nz == kl_nz.min())[-1]) + levels) * view.width
        print(
            f"{name}\n    data [{x.min():.4g}, {x.max():.4g}], exact zeros {view.zeros / x.size:.1%}; "
            f"entropy range {obs.range()} clips {np.mean(np.abs(x) > t):.1e} of the values; "
            f"KL threshold without the exact zeros: {t_nz:.4g}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", choices=["tensors", "split", "bias-correction", "entropy"])
    ap.add_argument("model", choices=[EFFICIENTNET, MINILM])
    ap.add_argument("config", nargs="?", default="quanta_default", help="configuration name in accuracy.py")
    ap.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ap.add_argument("--dir", type=Path, help="folder of the quantized files (default <cache>/quantized)")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--tensor", action="append", default=[], help="FP32 tensor name (entropy)")
    args = ap.parse_args(argv)
    cache = args.cache.expanduser()
    _, fp32 = model_paths(cache, args.model)
    qfile = (args.dir or cache / "quantized") / f"{args.model}.{args.config}.onnx"
    if args.command != "entropy" and not qfile.exists():
        ap.error(f"{qfile} is missing: run accuracy.py --configs {args.config} first")
    if args.command == "tensors":
        cmd_tensors(args.model, qfile, fp32, args.top)
    elif args.command == "split":
        cmd_split(args.model, qfile, fp32)
    elif args.command == "bias-correction":
        cmd_bias_correction(args.model, qfile, fp32)
    else:
        if not args.tensor or any(not re.fullmatch(r"\S+", t) for t in args.tensor):
            ap.error("entropy: name one or more FP32 tensors with --tensor")
        cmd_entropy(args.model, fp32, args.tensor)
    return 0


if __name__ == "__main__":
    sys.exit(main())
