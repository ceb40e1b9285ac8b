"""Where quanta and ONNX Runtime part on a file another tool quantized.

    python benchmarks/foreign_lsb.py groups ppocr_cls.nncf [--file F] [--feeds 2] [--as-written]
    python benchmarks/foreign_lsb.py tensor smart_turn_int8 linear_28_QuantizeLinear_Output [--step T]
    python benchmarks/foreign_lsb.py files /tmp/zoo/run --json out.json [--feeds 3]

``groups``: every QuantizeLinear of activations exposed as a graph output, both engines
run on the zoo's evaluation feeds; a group (the float ops between the QuantizeLinear and
the DequantizeLinears it reads) whose input codes are identical in both engines is
compared on its own output codes: the local differences, summed per kind of group. A
difference anywhere else is one carried from upstream. ORT runs optimized unless
``--as-written``.

``tensor``: max |quanta − ORT| at one named tensor in units of its step: the codes of a
QuantizeLinear output, or a float tensor divided by the value of ``--step`` (the scale
tensor of a dynamically quantized accumulator); ORT optimized and as written, and the
first graph output's max |quanta − ORT| beside it. For files whose output is a float
function of the last quantized tensor (Sigmoid, Softmax), where ``zoo.output_step`` gives
no LSB.

``files``: ``zoo.lsb_distance`` of every ``*.ort_*.onnx`` in a folder (the files zoo.py
writes for ORT's methods), on the first ``--feeds`` evaluation feeds of its model.

Models and feeds come from the zoo's manifest (``benchmarks/zoo/README.md``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo

CACHE = Path.home() / ".cache" / "quanta-zoo"


def model_of(name: str) -> zoo.Model:
    manifest = json.loads((CACHE / "manifest.json").read_text())["models"]
    entry = next(e for e in manifest if e["name"] == name)
    return zoo.Model(entry, CACHE)


def with_outputs(path: Path, names: list[str], feed: dict, tmp: Path) -> tuple[onnx.ModelProto, Path]:
    """``path`` with ``names`` as extra graph outputs, typed from one ORT run (contrib
    QuantizeLinear outputs get no type from shape inference, and quanta needs one)."""
    m = onnx.load(str(path))
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=n))
    onnx.save(m, str(tmp))
    got = zoo.ort_session(tmp).run(None, feed)
    for o, arr in zip(m.graph.output, got, strict=True):
        if not o.type.HasField("tensor_type"):
            o.CopyFrom(
                helper.make_tensor_value_info(o.name, helper.np_dtype_to_tensor_dtype(arr.dtype), None)
            )
    onnx.save(m, str(tmp))
    return m, tmp


def groups(name: str, path: Path, n_feeds: int, optimize: bool, tmp: Path) -> dict[str, list[int]]:
    model = model_of(name)
    m = onnx.load(str(path))
    inits = {i.name for i in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}

    def group(q: onnx.NodeProto) -> tuple[set[str], list[str]]:
        codes: set[str] = set()
        ops: list[str] = []
        stack, seen = [q.input[0]], set()
        while stack:
            v = stack.pop()
            if not v or v in seen or v in inits:  # "": an omitted optional input
                continue
            seen.add(v)
            n = prod.get(v)
            if n is None:
                codes.add(v)  # a graph input
            elif n.op_type == "DequantizeLinear":
                if n.input[0] not in inits:
                    codes.add(n.input[0])
            elif n.op_type != "Constant":
                ops.append(n.op_type)
                stack.extend(n.input)
        return codes, ops

    qs = {n.output[0]: n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] not in inits}
    parts = {q: group(n) for q, n in qs.items()}
    names = sorted(set(qs) | {c for codes, _ in parts.values() for c in codes if c in prod})
    m2, file = with_outputs(path, names, model.eval[0], tmp)
    ort_s = zoo.ort_session(file, optimize=optimize)
    q_s = zoo.quanta_session(file)
    outs = [o.name for o in m2.graph.output]
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for feed in model.eval[:n_feeds]:
        a = {**feed, **dict(zip(outs, ort_s.run(None, feed), strict=True))}
        c = {**feed, **dict(zip(outs, q_s.run(None, feed), strict=True))}
        for q, (codes, ops) in parts.items():
            if any(not np.array_equal(a[k], c[k]) for k in codes):
                continue  # the inputs differ already: not this group's own difference
            d = np.abs(np.asarray(a[q]).astype(np.int64) - np.asarray(c[q]).astype(np.int64))
            key = "+".join(sorted(set(ops))) or "(requantize only)"
            totals[key][0] += int(np.count_nonzero(d))
            totals[key][1] += d.size
            totals[key][2] = max(totals[key][2], int(d.max(initial=0)))
            if d.any():
                print(f"  {q}: {ops} {int(np.count_nonzero(d))} of {d.size} codes, max {int(d.max())}")
    return dict(totals)


def tensor(name: str, path: Path, t: str, step: str | None, tmp: Path) -> dict[str, Any]:
    model = model_of(name)
    m, file = with_outputs(path, [t] + ([step] if step else []), model.eval[0], tmp)
    outs = [o.name for o in m.graph.output]
    sessions = (zoo.ort_session(file), zoo.ort_session(file, optimize=False), zoo.quanta_session(file))
    res: dict[str, Any] = dict.fromkeys(("q_vs_ort", "q_vs_ort_as_written", "ort_vs_ort"), 0.0)
    res.update(output_q_vs_ort=0.0, output_ort_vs_ort=0.0, feeds=0, feeds_equal=0)
    for feed in model.eval:
        a, b, c = (dict(zip(outs, s.run(None, feed), strict=True)) for s in sessions)
        unit = float(np.max(np.abs(a[step]))) if step else 1.0
        x, y, z = (np.asarray(d[t]).astype(np.float64) / unit for d in (a, b, c))
        for key, u, v in (("q_vs_ort", z, x), ("q_vs_ort_as_written", z, y), ("ort_vs_ort", x, y)):
            res[key] = max(res[key], float(np.max(np.abs(u - v))))
        o = outs[0]
        res["output_q_vs_ort"] = max(res["output_q_vs_ort"], float(np.max(np.abs(np.float64(a[o]) - c[o]))))
        res["output_ort_vs_ort"] = max(
            res["output_ort_vs_ort"], float(np.max(np.abs(np.float64(a[o]) - b[o])))
        )
        res["feeds"] += 1
        res["feeds_equal"] += int(np.array_equal(x, z))
    return res


def files(folder: Path, out: Path, n_feeds: int) -> dict[str, Any]:
    manifest = {e["name"]: e for e in json.loads((CACHE / "manifest.json").read_text())["models"]}
    res: dict[str, Any] = json.loads(out.read_text()) if out.exists() else {}
    for p in sorted(folder.glob("*.ort_*.onnx")):
        base = p.name.split(".")[0]
        if p.name in res or base not in manifest or manifest[base]["kind"] == "vad":
            continue
        try:
            model = model_of(base)
            model.eval = model.eval[:n_feeds]
            got_ort = zoo.run_all(zoo.ort_session(p), model.eval)
            got_q = zoo.run_all(zoo.quanta_session(p), model.eval)
            row: dict[str, Any] = zoo.lsb_distance(model, p, got_ort, got_q)
            row["max_abs"] = float(
                max(
                    np.max(np.abs(a[0].astype(np.float64) - b[0]))
                    for a, b in zip(got_ort, got_q, strict=True)
                )
            )
        except Exception as e:  # a failing file is a row
            row = {"error": zoo.first_line(e)}
        res[p.name] = row
        print(p.name, row, flush=True)
        out.write_text(json.dumps(res, indent=1))
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("groups", help="local differences per QDQ group")
    g.add_argument("model")
    g.add_argument("--file", type=Path, help="the quantized file (default: the manifest's)")
    g.add_argument("--feeds", type=int, default=2)
    g.add_argument("--as-written", action="store_true", help="ORT with graph optimizations off")
    t = sub.add_parser("tensor", help="LSB distance at one named tensor")
    t.add_argument("model")
    t.add_argument("tensor")
    t.add_argument("--file", type=Path)
    t.add_argument("--step", help="a tensor holding the step (dynamic quantization)")
    f = sub.add_parser("files", help="zoo.lsb_distance of every *.ort_*.onnx in a folder")
    f.add_argument("folder", type=Path)
    f.add_argument("--json", type=Path, required=True)
    f.add_argument("--feeds", type=int, default=3)
    args = ap.parse_args()
    tmp = Path("/tmp") / f"foreign_lsb_{args.cmd}.onnx"
    if args.cmd == "groups":
        path = args.file or model_of(args.model).path
        for key, (n, size, worst) in sorted(
            groups(args.model, path, args.feeds, not args.as_written, tmp).items()
        ):
            print(f"{key}: {n} of {size} codes differ, max {worst}")
    elif args.cmd == "tensor":
        path = args.file or model_of(args.model).path
        print(json.dumps(tensor(args.model, path, args.tensor, args.step, tmp)))
    else:
        files(args.folder, args.json, args.feeds)


if __name__ == "__main__":
    main()
