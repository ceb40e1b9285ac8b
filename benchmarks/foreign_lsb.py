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

    python benchmarks/foreign_lsb.py tables nudenet_320n --file /tmp/f/nudenet_320n.nncf.onnx
    python benchmarks/foreign_lsb.py ties efficientnet_lite0 --file /tmp/f/efficientnet_lite0.trt.onnx

``tables``: the groups ``Conv -> act -> QuantizeLinear`` with no quantization between the
Conv and its activation (NNCF's placement; act SiLU or HardSwish), and how many of their
codes an integer requantization to an intermediate grid followed by a code table would
change against ``Q_y(act(v))`` (docs/passes.md (AQ1)-(AQ4)): the grid over the Conv
outputs' observed range (8 bits), over the window outside which the codes are constant
(8 and 16 bits); v is ORT's float Conv output, both sides in float64.

``ties``: the groups ``DQ -> Conv -> [Relu | Clip | SiLU] -> QuantizeLinear``, ORT's float Conv
(graph optimizations off: every group unfused, as ORT runs the ones it leaves float)
against the exact sum (float64 from the same codes): how many codes differ, the largest
|v_ORT − v_exact| in output steps, and the share of outputs within 1, 4 and 16 times a
group's largest deviation of a rounding boundary, and within the a-priori bound (OT1)
(what a form that sums exactly and recomputes only the outputs the bound cannot decide,
in ORT's order, would recompute; docs/float-ops.md (OT1)-(OT2)).
Both run on the model's first ``--feeds`` calibration feeds (``foreign_qdq.model_and_feeds``:
zoo models and EfficientNet-Lite0).

    python benchmarks/foreign_lsb.py valleys /tmp/f/nudenet_320n.nncf.onnx

``valleys``: for every channel of every ``DQ -> Conv -> SiLU -> QuantizeLinear`` group, the
native ``acc_to_quant`` (bit-exact with the AccumulatorToQuant twin) on every integer
accumulator of the channel's window (v from −40 to where the top code is certain): whether
the codes fall then rise with no other non-monotone step (the premise of the exact
threshold form, docs/passes.md (AQ5)), the thresholds per channel and the smallest gap
between two of them (the width of a bucket holding at most one).

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


def _act(kind: str, v: np.ndarray) -> np.ndarray:
    """The activation in float64: SiLU, HardSwish (ONNX's alpha 1/6, beta 1/2), Relu, or
    "Clip:lo:hi"; "" is the identity."""
    if kind == "SiLU":
        return v / (1.0 + np.exp(-v))
    if kind == "HardSwish":
        return v * np.clip(v / 6.0 + 0.5, 0.0, 1.0)
    if kind == "Relu":
        return np.maximum(v, 0.0)
    if kind.startswith("Clip:"):
        _, lo, hi = kind.split(":")
        return np.clip(v, float(lo), float(hi))
    return v


def _activation_groups(
    m: onnx.ModelProto, kinds: tuple[str, ...]
) -> list[tuple[onnx.NodeProto, str, onnx.NodeProto]]:
    """(Conv, activation, QuantizeLinear) for each Conv whose only readers are one of
    ``kinds`` ("" for none: Conv -> QuantizeLinear) and whose activation's only reader is a
    QuantizeLinear."""
    from onnx import numpy_helper

    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    cons: dict[str, list[onnx.NodeProto]] = defaultdict(list)
    for n in m.graph.node:
        for i in n.input:
            cons[i].append(n)
    out = []
    for n in m.graph.node:
        if n.op_type != "Conv":
            continue
        readers = cons[n.output[0]]
        ops = sorted(r.op_type for r in readers)
        kind, last = None, None
        if ops == ["Mul", "Sigmoid"]:
            mul = next(r for r in readers if r.op_type == "Mul")
            sig = next(r for r in readers if r.op_type == "Sigmoid")
            if set(mul.input) == {n.output[0], sig.output[0]}:
                kind, last = "SiLU", mul
        elif ops == ["HardSwish"]:
            kind, last = "HardSwish", readers[0]
        elif ops == ["Relu"]:
            kind, last = "Relu", readers[0]
        elif ops == ["Clip"] and all(i in consts for i in readers[0].input[1:] if i):
            c = readers[0]
            lo = float(consts[c.input[1]]) if len(c.input) > 1 and c.input[1] else -np.inf
            hi = float(consts[c.input[2]]) if len(c.input) > 2 and c.input[2] else np.inf
            kind, last = f"Clip:{lo}:{hi}", c
        elif ops == ["QuantizeLinear"]:
            kind, last = "", n
        if kind is None or last is None or kind.split(":")[0] not in kinds:
            continue
        q = cons[last.output[0]] if last is not n else readers
        if len(q) == 1 and q[0].op_type == "QuantizeLinear":
            out.append((n, kind, q[0]))
    return out


def _q_params(q: onnx.NodeProto, consts: dict[str, np.ndarray]) -> tuple[float, int, int, int]:
    """A per-tensor QuantizeLinear's (scale, zero point, lowest code, highest code)."""
    zq = consts[q.input[2]] if len(q.input) > 2 and q.input[2] else np.zeros((), np.uint8)
    info = np.iinfo(zq.dtype)
    return float(consts[q.input[1]]), int(zq), int(info.min), int(info.max)


def _feeds_and_values(
    name: str, path: Path, names: list[str], n_feeds: int
) -> tuple[onnx.ModelProto, dict[str, np.ndarray], list[dict[str, np.ndarray]]]:
    """The file, its constants (initializers and Constant nodes) and, per feed, ORT's
    values of ``names`` with graph optimizations off (every Conv runs as ORT's float Conv)."""
    import foreign_qdq
    import onnxruntime as ort
    from onnx import numpy_helper

    _, calib, _, _ = foreign_qdq.model_and_feeds(name)
    m = onnx.load(str(path))
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    for n in m.graph.node:
        if n.op_type == "Constant" and n.attribute and n.attribute[0].name == "value":
            consts[n.output[0]] = numpy_helper.to_array(n.attribute[0].t)
    m2 = onnx.ModelProto()
    m2.CopyFrom(m)
    del m2.graph.output[:]
    for v in names:
        m2.graph.output.append(onnx.ValueInfoProto(name=v))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(m2.SerializeToString(), so, providers=["CPUExecutionProvider"])
    runs = [dict(zip(names, sess.run(names, f), strict=True)) for f in calib[:n_feeds]]
    return m, consts, runs


def tables(name: str, path: Path, n_feeds: int) -> dict[str, list[int]]:
    """Codes changed by ``T[Q_t(v)]`` against ``Q_y(act(v))`` (docs/passes.md (AQ3)), per grid."""
    m0 = onnx.load(str(path))
    grp = _activation_groups(m0, ("SiLU", "HardSwish"))
    names = [n.output[0] for n, _, _ in grp]
    _, consts, runs = _feeds_and_values(name, path, names, n_feeds)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for conv, kind, q in grp:
        sy, zy, lo, hi = _q_params(q, consts)

        def code(
            v: np.ndarray, kind: str = kind, sy: float = sy, zy: int = zy, lo: int = lo, hi: int = hi
        ) -> np.ndarray:
            return np.clip(np.rint(_act(kind, v) / sy) + zy, lo, hi)

        # (AQ4): the window [v_lo, v_hi] outside which the code is constant; both
        # activations are within 2x of the identity above 0 (f(v) >= v/2) and below half
        # a step of 0 beyond v = -64, so the probe spans both ends at 1/16 of a step
        v_top = 2.0 * sy * (hi - zy + 1) + 8.0
        probe = np.linspace(-64.0, v_top, min(int((v_top + 64.0) / (sy / 16)) + 2, 20_000_001))
        pc = code(probe)
        moving = np.nonzero(pc != pc[0])[0]
        settled = np.nonzero(pc == pc[-1])[0]
        v_lo, v_hi = float(probe[max(moving[0] - 1, 0)]), float(probe[settled[0]])
        for run in runs:
            v = np.asarray(run[conv.output[0]], np.float64)
            y = code(v)
            for label, bits, a, b in (
                ("8-bit grid, observed range", 8, float(v.min()), float(v.max())),
                ("8-bit grid, (AQ4) window", 8, v_lo, v_hi),
                ("16-bit grid, (AQ4) window", 16, v_lo, v_hi),
            ):
                top = 2**bits - 1
                st = (b - a) / top
                t = np.clip(np.rint((v - a) / st), 0, top).astype(np.int64)
                table = code(a + st * np.arange(top + 1))
                d = np.abs(table[t] - y)
                e = totals[label]
                e[0] += int(np.count_nonzero(d))
                e[1] += d.size
                e[2] = max(e[2], int(d.max(initial=0)))
    return dict(totals)


def _conv_f64(x: np.ndarray, w: np.ndarray, b: np.ndarray | None, attrs: dict[str, Any]) -> np.ndarray:
    """A 2-D Conv in float64 (exact for products of float32 values and sums far below
    2^53 ulps: the exact sum of the dequantized values to ~1e-16 relative)."""
    pads = attrs.get("pads", [0, 0, 0, 0])
    sh, sw = attrs.get("strides", [1, 1])
    dh, dw = attrs.get("dilations", [1, 1])
    g = attrs.get("group", 1)
    xp = np.pad(x, ((0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])))
    n, _, hp, wp = xp.shape
    m, cg, kh, kw = w.shape
    oh = (hp - dh * (kh - 1) - 1) // sh + 1
    ow = (wp - dw * (kw - 1) - 1) // sw + 1
    y = np.zeros((n, m, oh, ow))
    mg = m // g
    for gi in range(g):
        xs = xp[:, gi * cg : (gi + 1) * cg]
        ws = w[gi * mg : (gi + 1) * mg]
        for i in range(kh):
            for j in range(kw):
                patch = xs[:, :, i * dh : i * dh + sh * oh : sh, j * dw : j * dw + sw * ow : sw]
                y[:, gi * mg : (gi + 1) * mg] += np.einsum("nchw,mc->nmhw", patch, ws[:, :, i, j])
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y


def ties(name: str, path: Path, n_feeds: int) -> dict[str, float]:
    """ORT's float Conv against the exact sum, per output code (docs/float-ops.md (OT1))."""
    m0 = onnx.load(str(path))
    prod = {o: n for n in m0.graph.node for o in n.output}
    grp = [
        (c, k, q)
        for c, k, q in _activation_groups(m0, ("", "Relu", "Clip", "SiLU"))
        if len(c.input) > 1
        and all(i in prod and prod[i].op_type == "DequantizeLinear" for i in c.input[:2])
        and len(next(a.ints for a in c.attribute if a.name == "kernel_shape") or [1, 1]) == 2
    ]
    names = list(dict.fromkeys(v for c, _, _ in grp for v in (c.output[0], prod[c.input[0]].input[0])))
    _, consts, runs = _feeds_and_values(name, path, names, n_feeds)
    res = {
        "groups": float(len(grp)),
        "outputs": 0.0,
        "codes_differ": 0.0,
        "max_dev_steps": 0.0,
        "within_bound": 0.0,
        "max_bound_steps": 0.0,
    }
    near = dict.fromkeys((1, 4, 16), 0)

    def deq(node: onnx.NodeProto, codes: np.ndarray, axis_len: int) -> np.ndarray:
        s = np.asarray(consts[node.input[1]], np.float32)
        z = consts[node.input[2]] if len(node.input) > 2 and node.input[2] else np.zeros((), np.int32)
        shape = (-1,) + (1,) * (codes.ndim - 1) if s.size == axis_len and s.size > 1 else ()
        diff = (codes.astype(np.int64) - np.asarray(z, np.int64).reshape(shape or np.shape(z))).astype(
            np.float32
        )
        return np.multiply(diff, s.reshape(shape) if shape else s, dtype=np.float32)

    def centred(node: onnx.NodeProto, codes: np.ndarray) -> np.ndarray:
        """codes − zero point (float64, exact), the zero point per axis-0 slice if per channel."""
        z = np.asarray(consts[node.input[2]] if len(node.input) > 2 and node.input[2] else 0, np.int64)
        z = z.reshape((-1,) + (1,) * (codes.ndim - 1)) if z.size > 1 else z
        return (codes.astype(np.int64) - z).astype(np.float64)

    for conv, kind, q in grp:
        attrs = {a.name: helper.get_attribute_value(a) for a in conv.attribute}
        dqx, dqw = prod[conv.input[0]], prod[conv.input[1]]
        wq = consts[dqw.input[0]]
        wi = centred(dqw, wq)
        sxw = np.float64(np.asarray(consts[dqx.input[1]], np.float32)) * np.asarray(
            consts[dqw.input[1]], np.float32
        ).astype(np.float64).reshape(
            1, -1, 1, 1
        )  # sx·sw[c] without rounding: the scale of the exact integer sum
        b = None
        if len(conv.input) > 2 and conv.input[2]:
            bn = conv.input[2]
            if bn in prod:
                bq = consts[prod[bn].input[0]]
                b = deq(prod[bn], bq, bq.shape[0]).astype(np.float64)
            else:
                b = consts[bn].astype(np.float64)
        bb = 0.0 if b is None else b.reshape(1, -1, 1, 1)
        sy, zy, lo, hi = _q_params(q, consts)
        for run in runs:
            xi = centred(dqx, np.asarray(run[dqx.input[0]]))
            v = _conv_f64(xi, wi, None, attrs) * sxw + bb  # the exact sum (integers below 2^53)
            vo = np.asarray(run[conv.output[0]], np.float64)
            # (OT1)'s bound: gamma_n · (Σ|x·w| + |b|), n = K + 4 roundings (the two
            # dequantizations, the products and sums, the bias)
            k = wq[0].size + 4
            gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
            mag = _conv_f64(np.abs(xi), np.abs(wi), None, attrs) * sxw + np.abs(bb)
            slope = 1.1 if kind == "SiLU" else 1.0  # max |f'|: SiLU 1.0998, Relu and Clip 1
            bound = gamma * mag * slope / sy
            fy, fo = _act(kind, v) / sy, _act(kind, vo) / sy
            dev = float(np.max(np.abs(fo - fy)))
            yc = np.clip(np.rint(fy) + zy, lo, hi)
            oc = np.clip(np.rint(np.float32(_act(kind, vo)) / np.float32(sy)) + zy, lo, hi)
            res["outputs"] += v.size
            res["codes_differ"] += int(np.count_nonzero(yc != oc))
            res["max_dev_steps"] = max(res["max_dev_steps"], dev)
            dist = np.abs(fy - np.floor(fy) - 0.5)
            for m in near:
                near[m] += int(np.count_nonzero(dist < m * dev))
            res["within_bound"] += int(np.count_nonzero(dist <= bound))
            res["max_bound_steps"] = max(res["max_bound_steps"], float(bound.max(initial=0.0)))
    for m, c in near.items():
        res[f"share_within_{m}x"] = c / max(res["outputs"], 1.0)
    res["share_within_bound"] = res["within_bound"] / max(res["outputs"], 1.0)
    return res


def valleys(path: Path) -> dict[str, float]:
    """(AQ5)'s premise on every SiLU channel of a file (docs/passes.md)."""
    from onnx import numpy_helper

    from quanta.kernels import _native

    m = onnx.load(str(path))
    consts = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    prod = {o: n for n in m.graph.node for o in n.output}
    res = {"channels": 0.0, "values": 0.0, "other_steps": 0.0}
    thresholds: list[int] = []
    gaps: list[int] = []
    for conv, _, q in _activation_groups(m, ("SiLU",)):
        dqx, dqw = prod.get(conv.input[0]), prod.get(conv.input[1])
        if (
            dqx is None
            or dqw is None
            or dqx.op_type != "DequantizeLinear"
            or dqw.op_type != "DequantizeLinear"
        ):
            continue
        sx = np.float32(consts[dqx.input[1]])
        sw = np.asarray(consts[dqw.input[1]], np.float32).ravel()
        b = (
            np.asarray(consts[conv.input[2]], np.float32).ravel()
            if len(conv.input) > 2 and conv.input[2] in consts
            else np.zeros_like(sw)
        )
        sy, zy, lo, hi = _q_params(q, consts)
        v_hi = 2.0 * sy * (hi - zy + 1) + 8.0  # SiLU(v) >= v / 2 above 0: the top code is certain
        for c in range(sw.size):
            s = np.float32(sx * sw[c])  # AccumulatorToQuant's scale, f32(sx·sw[c])
            a0 = int(np.floor((-40.0 - float(b[c])) / float(s)))
            a1 = int(np.ceil((v_hi - float(b[c])) / float(s)))
            acc = np.arange(a0, a1 + 1, dtype=np.int32).reshape(1, 1, -1)
            y = np.empty(acc.shape, np.int8 if lo < 0 else np.uint8)
            _native.acc_to_quant(acc, None, np.array([s]), np.array([b[c]]), 1, [], sy, zy, lo < 0, 1, y)
            codes = y.ravel().astype(np.int32)
            d = np.diff(codes)
            k = int(np.argmin(codes))
            res["other_steps"] += int(np.count_nonzero(d[:k] > 0) + np.count_nonzero(d[k:] < 0))
            steps = np.nonzero(d)[0]
            thresholds.append(steps.size)
            if steps.size > 1:
                gaps.append(int(np.diff(steps).min()))
            res["channels"] += 1
            res["values"] += acc.size
    if thresholds:
        res["thresholds_median"] = float(np.median(thresholds))
    if gaps:
        res["smallest_gap_median"] = float(np.median(gaps))
        res["smallest_gap_min"] = float(min(gaps))
    return res


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
    tb = sub.add_parser("tables", help="intermediate grid + code table against act-after-quantizer groups")
    tb.add_argument("model")
    tb.add_argument("--file", type=Path, required=True)
    tb.add_argument("--feeds", type=int, default=2)
    ti = sub.add_parser("ties", help="ORT's float Conv against the exact sum, near-tie shares")
    ti.add_argument("model")
    ti.add_argument("--file", type=Path, required=True)
    ti.add_argument("--feeds", type=int, default=2)
    va = sub.add_parser("valleys", help="(AQ5): one valley per SiLU channel, thresholds and gaps")
    va.add_argument("file", type=Path)
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
    elif args.cmd == "tables":
        for label, (n, size, worst) in tables(args.model, args.file, args.feeds).items():
            print(f"{label}: {n} of {size} codes change ({n / max(size, 1):.2e}), max {worst}")
    elif args.cmd == "ties":
        print(json.dumps(ties(args.model, args.file, args.feeds)))
    elif args.cmd == "valleys":
        print(json.dumps(valleys(args.file)))
    else:
        files(args.folder, args.json, args.feeds)


if __name__ == "__main__":
    main()
