"""Each LSTM / GRU node of a zoo file alone, on the inputs it receives in the file, quanta
against ONNX Runtime in one run: interleaved rounds, 1 thread, calling-thread CPU time,
medians; each line says whether quanta's outputs are ORT's bytes.

    python benchmarks/rnn_nodes.py --models frspell_derive_int8,oskut_ws [--isas avx512vnni,avx2]

Each node becomes a one-node model with the file's weights; its dynamic inputs are the
values ONNX Runtime computes for them on the model's first evaluation feed
(``zoo/zoodata.py``). ``--isas`` binds one quanta session per kernel ISA
(``_native.set_isa``); the ISA is set again before each of that session's runs, because a
float recurrence reads the active ISA at call time (a session bound for AVX-512 and run
with AVX2 active runs AVX2's kernels on AVX-512's layout, repacking the weights every call).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent / "zoo"))

import zoodata

import quanta

CACHE = Path.home() / ".cache" / "quanta-zoo"


def one_node_models(name: str, path: Path) -> list[tuple[str, bytes, dict[str, np.ndarray]]]:
    """(node name, one-node model, its feeds) for every LSTM / GRU node of the file."""
    m = onnx.load(str(path))
    inits = {i.name: i for i in m.graph.initializer}
    rnn = [n for n in m.graph.node if n.op_type in ("LSTM", "GRU")]
    want = sorted({i for n in rnn for i in n.input if i and i not in inits})
    probe = onnx.load(str(path))
    del probe.graph.output[:]
    for w in want:
        probe.graph.output.append(helper.make_tensor_value_info(w, TensorProto.FLOAT, None))
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(probe.SerializeToString(), so, providers=["CPUExecutionProvider"])
    values = dict(zip(want, sess.run(None, zoodata.feeds(name, "eval", 1, CACHE)[0]), strict=True))
    out = []
    for n in rnn:
        used, graph_in, feeds = [], [], {}
        for i in dict.fromkeys(n.input):
            if i in inits:
                used.append(inits[i])
            elif i:
                graph_in.append(helper.make_tensor_value_info(i, TensorProto.FLOAT, list(values[i].shape)))
                feeds[i] = values[i]
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        node = helper.make_node(n.op_type, list(n.input), ["y", "yh"], **attrs)
        outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in ("y", "yh")]
        g = helper.make_graph([node], "g", graph_in, outs, used)
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
        model.ir_version = 8
        out.append((n.name or n.op_type, model.SerializeToString(), feeds))
    return out


def time_node(mb: bytes, feeds: dict[str, np.ndarray], isas: list[str], rounds: int, reps: int) -> str:
    from quanta.kernels import _native

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    sessions: dict[str, Any] = {"ORT": ort.InferenceSession(mb, so, providers=["CPUExecutionProvider"])}
    isa_of = {"ORT": None}
    try:
        for isa in isas:
            _native.set_isa(isa)
            o = quanta.SessionOptions()
            o.intra_op_num_threads = 1
            sessions[f"q {isa}"] = quanta.InferenceSession(mb, o)
            isa_of[f"q {isa}"] = isa
        want = sessions["ORT"].run(None, feeds)
        same = {}
        for k, s in sessions.items():
            if isa_of[k]:
                _native.set_isa(isa_of[k])
            for _ in range(3):
                got = s.run(None, feeds)
            same[k] = all(
                np.array_equal(a.view(np.uint32), b.view(np.uint32)) for a, b in zip(want, got, strict=True)
            )
        t: dict[str, list[float]] = {k: [] for k in sessions}
        for _ in range(rounds):
            for k, s in sessions.items():
                if isa_of[k]:
                    _native.set_isa(isa_of[k])
                t0 = time.thread_time()
                for _ in range(reps):
                    s.run(None, feeds)
                t[k].append((time.thread_time() - t0) / reps * 1e6)
    finally:
        _native.clear_isa()
    med = {k: float(np.median(v)) for k, v in t.items()}
    return ", ".join(
        f"{k} {v:.1f} us" + ("" if k == "ORT" else f" ({v / med['ORT']:.3f} of ORT, ORT's bytes: {same[k]})")
        for k, v in med.items()
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", required=True)
    ap.add_argument("--isas", help="comma-separated kernel ISAs for quanta (default: the host's best)")
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--reps", type=int, default=20)
    a = ap.parse_args(argv)
    from quanta.kernels import _native

    isas = a.isas.split(",") if a.isas else [_native.active_isa()]
    manifest = json.loads((CACHE / "manifest.json").read_text())["models"]
    for name in a.models.split(","):
        entry = next(e for e in manifest if e["name"] == name)
        for label, mb, feeds in one_node_models(name, CACHE / entry["path"]):
            shapes = {k: list(v.shape) for k, v in feeds.items()}
            print(f"{name} {label} {shapes}: {time_node(mb, feeds, isas, a.rounds, a.reps)}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
