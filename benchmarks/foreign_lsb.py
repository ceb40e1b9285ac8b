"""Where quanta and ONNX Runtime part on a file another tool quantized.

    python benchmarks/foreign_lsb.py groups ppocr_cls.nncf [--file F] [--feeds 2] [--as-written]
    python benchmarks/foreign_lsb.py tensor smart_turn_int8 linear_28_QuantizeLinear_Output [--step T]
    python benchmarks/foreign_lsb.py mlas ddddocr_det 943,946 --file /tmp/zoo/run/ddddocr_det.ort_minmax.onnx
    python benchmarks/foreign_lsb.py files /tmp/zoo/run --json out.json [--feeds 3]
    python benchmarks/foreign_lsb.py --float-functions ort files ...   # ORT's float Conv order too

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

``mlas``: named Conv groups (``DQ -> Conv -> Q``) that ORT runs in float, recomputed from
ORT's own dequantized input in MLAS's SGEMM order (a fused multiply-add chain over k in
blocks of 256, the block sums added in order, then the bias, then QuantizeLinear), with
how many codes that and quanta's exact integer sum differ from ORT's.

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

CACHE = zoo.zoodata.cache_dir()  # $QUANTA_ZOO_CACHE or ~/.cache/quanta-zoo, as zoo.py


def model_of(name: str) -> zoo.Model:
    manifest = json.loads((CACHE / "manifest.json").read_text())["models"]
    entry = next(e for e in manifest if e["name"] == name)
    return zoo.Model(entry, CACHE)


def with_outputs(
    path: Path, names: list[str], feed: dict | list[dict], tmp: Path
) -> tuple[onnx.ModelProto, Path]:
    """``path`` with ``names`` as extra graph outputs, typed from ORT's runs on the first and
    last of ``feed`` (contrib QuantizeLinear outputs get no type from shape inference, and
    quanta needs one): the sizes both runs agree on, the others unknown (a rule that reads
    a weight's shape or builds per-channel constants needs them)."""
    feeds = feed if isinstance(feed, list) else [feed]
    m = onnx.load(str(path))
    have = {o.name for o in m.graph.output}
    for n in names:
        if n not in have:
            m.graph.output.append(onnx.ValueInfoProto(name=n))
    onnx.save(m, str(tmp))
    sess = zoo.ort_session(tmp)
    first = sess.run(None, feeds[0])
    last = sess.run(None, feeds[-1]) if len(feeds) > 1 else first
    for o, arr, other in zip(m.graph.output, first, last, strict=True):
        if not o.type.HasField("tensor_type"):
            dims = (
                [a if a == b else None for a, b in zip(arr.shape, other.shape, strict=True)]
                if arr.ndim == other.ndim
                else None
            )
            o.CopyFrom(
                helper.make_tensor_value_info(o.name, helper.np_dtype_to_tensor_dtype(arr.dtype), dims)
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
    m2, file = with_outputs(path, names, model.eval[:n_feeds], tmp)
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


def _fma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """float32 ``a·b + c`` rounded once (a fused multiply-add): the product is exact in
    float64; the float64 sum's own rounding error (TwoSum) decides the float32 rounding
    where the float64 sum lands on a float32 midpoint."""
    p = a.astype(np.float64) * b.astype(np.float64)
    c64 = c.astype(np.float64)
    s = p + c64
    bb = s - p
    e = (p - (s - bb)) + (c64 - bb)
    r = s.astype(np.float32)
    d = s - r.astype(np.float64)
    toward = np.where(d + e > 0, np.float32(np.inf), np.float32(-np.inf)).astype(np.float32)
    nb = np.nextafter(r, toward)
    half = (nb.astype(np.float64) - r.astype(np.float64)) / 2
    fix = (d != 0) & (np.abs(d) == np.abs(half)) & (e != 0) & (np.sign(e) == np.sign(d))
    return np.where(fix, nb, r)


def mlas_sgemm(a: np.ndarray, b: np.ndarray, block: int = 256) -> np.ndarray:
    """``a @ b`` (float32) in MLAS's SGEMM order: per output a chain of fused
    multiply-adds over k, restarted every ``block`` values of k, the block sums added to
    the result in order."""
    c = None
    for k0 in range(0, a.shape[1], block):
        acc = np.zeros((a.shape[0], b.shape[1]), np.float32)
        for k in range(k0, min(a.shape[1], k0 + block)):
            acc = _fma(a[:, k : k + 1], b[k : k + 1, :], acc)
        c = acc if c is None else np.add(c, acc, dtype=np.float32)
    assert c is not None
    return c


def mlas(name: str, path: Path, convs: list[str], tmp: Path) -> None:
    """Each named Conv output (a group ``DQ -> Conv -> Q``, group 1) recomputed from ORT's
    own DequantizeLinear output as MLAS does (im2col with k = (c, kh, kw), mlas_sgemm,
    + bias, QuantizeLinear ``rne(y / s) + z``), against ORT's codes and quanta's."""
    from onnx import numpy_helper

    model = model_of(name)
    m = onnx.load(str(path))
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}
    q_of = {n.input[0]: n for n in m.graph.node if n.op_type == "QuantizeLinear"}
    names = [v for c in convs for v in (prod[c].input[0], q_of[c].output[0])]
    m2, file = with_outputs(path, names, model.eval[0], tmp)
    outs = [o.name for o in m2.graph.output]
    ort_got = dict(zip(outs, zoo.ort_session(file).run(None, model.eval[0]), strict=True))
    q_got = dict(zip(outs, zoo.quanta_session(file).run(None, model.eval[0]), strict=True))
    for c in convs:
        conv = prod[c]
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        if attrs.get("group", 1) != 1:
            print(f"{c}: group {attrs['group']}, not reproduced")
            continue
        x = np.asarray(ort_got[conv.input[0]], np.float32)
        wdq = prod[conv.input[1]]
        wq, sw = consts[wdq.input[0]], consts[wdq.input[1]]
        zw = consts[wdq.input[2]] if len(wdq.input) > 2 and wdq.input[2] else np.zeros(1, np.int32)
        per = (-1,) + (1,) * (wq.ndim - 1)
        w = np.multiply(
            (wq.astype(np.int32) - np.asarray(zw, np.int32).reshape(per)).astype(np.float32),
            np.asarray(sw, np.float32).reshape(per if np.size(sw) > 1 else ()),
            dtype=np.float32,
        )
        kh, kw = w.shape[2:]
        pads, st = attrs.get("pads", [0, 0, 0, 0]), attrs.get("strides", [1, 1])
        xp = np.pad(x[0], ((0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
        oh = (xp.shape[1] - kh) // st[0] + 1
        ow = (xp.shape[2] - kw) // st[1] + 1
        cols = np.stack(
            [
                xp[:, i : i + st[0] * oh : st[0], j : j + st[1] * ow : st[1]]
                for i in range(kh)
                for j in range(kw)
            ],
            axis=1,
        )  # [C, kh·kw, oh, ow]: k = (c, kh, kw)
        y = mlas_sgemm(w.reshape(w.shape[0], -1), cols.reshape(-1, oh * ow))
        if len(conv.input) > 2 and conv.input[2]:
            bdq = prod[conv.input[2]]
            bias = np.multiply(
                consts[bdq.input[0]].astype(np.float32), consts[bdq.input[1]], dtype=np.float32
            )
            y = np.add(y, bias.reshape(-1, 1), dtype=np.float32)
        qn = q_of[c]
        zy = consts[qn.input[2]]
        lo, hi = np.iinfo(zy.dtype).min, np.iinfo(zy.dtype).max
        codes = np.clip(
            np.rint(np.divide(y, np.float32(consts[qn.input[1]]), dtype=np.float32)) + int(zy), lo, hi
        )
        ort_codes = np.asarray(ort_got[qn.output[0]]).reshape(codes.shape)
        q_codes = np.asarray(q_got[qn.output[0]]).reshape(codes.shape)
        same_in = np.array_equal(ort_got[conv.input[0]], q_got[conv.input[0]])
        print(
            f"{c}: K {w[0].size}, {codes.size} codes; MLAS order vs ORT {int(np.count_nonzero(codes != ort_codes))}, "
            f"quanta vs ORT {int(np.count_nonzero(q_codes != ort_codes))} (quanta's input equal: {same_in})"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--float-functions",
        default="auto",
        choices=("auto", "onnx", "ort"),
        help="quanta's SessionOptions.float_functions ('ort': also ORT's float Conv order, docs/float-ops.md)",
    )
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
    ml = sub.add_parser("mlas", help="Conv groups recomputed in MLAS's float order")
    ml.add_argument("model")
    ml.add_argument("convs", help="comma-separated Conv output names (the QuantizeLinear inputs)")
    ml.add_argument("--file", type=Path)
    f = sub.add_parser("files", help="zoo.lsb_distance of every *.ort_*.onnx in a folder")
    f.add_argument("folder", type=Path)
    f.add_argument("--json", type=Path, required=True)
    f.add_argument("--feeds", type=int, default=3)
    args = ap.parse_args()
    zoo.QUANTA_FLOAT_FUNCTIONS = args.float_functions
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
    elif args.cmd == "mlas":
        mlas(args.model, args.file or model_of(args.model).path, args.convs.split(","), tmp)
    else:
        files(args.folder, args.json, args.feeds)


if __name__ == "__main__":
    main()
