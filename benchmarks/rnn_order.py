"""One LSTM / GRU node in both float orders against ONNX Runtime, in one run.

quanta with ``float_functions="onnx"`` ((RNN1)-(RNN9): a multiply, then an add, per
multiply-add) and ``"ort"`` ((RNN-ORT): MLAS's fused multiply-add chains, the default's
order, docs/float-ops.md (RO1)) and ONNX Runtime, interleaved rounds of ``--reps`` runs,
medians; one thread compares the calling thread's CPU time, more threads wall time. The
shapes are the zoo's recurrent layers (oskut_ws, madmom's beat tracker, pyfrspell's
encoder, nsnet2, Resemblyzer); each line also says whether the ORT-order output is ORT's
bytes.

    python benchmarks/rnn_order.py --threads 1 [--cases 0,3] [--isa avx2]

``--isa`` sets quanta's kernel ISA (``_native.set_isa``) before the sessions bind: the
AVX2 kernels on an AVX-512 host, to compare the two paths on the same machine.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta

#: (op, T, B, inputs, H, bidirectional)
CASES = (
    ("LSTM", 21, 42, 61, 192, True),  # oskut_ws
    ("LSTM", 600, 1, 50, 25, True),  # beats_blstm's later layers
    ("LSTM", 600, 1, 266, 25, True),  # beats_blstm's first layer
    ("GRU", 10, 1, 160, 160, True),  # pyfrspell's encoder
    ("GRU", 100, 1, 400, 400, False),  # nsnet2-like
    ("LSTM", 160, 6, 40, 256, False),  # Resemblyzer-like: a long batch-6 LSTM (R's strips)
)


def model(op: str, T: int, B: int, n_in: int, H: int, bidir: bool) -> tuple[bytes, np.ndarray]:
    D, G = (2 if bidir else 1), (4 if op == "LSTM" else 3)
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, G * H, n_in)) * 0.1).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((D, G * H, H)) * 0.1).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((D, 2 * G * H)) * 0.1).astype(np.float32), "B"),
    ]
    node = helper.make_node(
        op, ["x", "W", "R", "B"], ["y"], hidden_size=H, direction="bidirectional" if bidir else "forward"
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)])
    m.ir_version = 8
    return m.SerializeToString(), rng.standard_normal((T, B, n_in)).astype(np.float32)


def run(case: tuple, threads: int, rounds: int, reps: int) -> str:
    op, T, B, n_in, H, bidir = case
    mb, x = model(op, T, B, n_in, H, bidir)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    ref = ort.InferenceSession(mb, so, providers=["CPUExecutionProvider"])
    sess = {}
    for ff in ("onnx", "ort"):
        o = quanta.SessionOptions(float_functions=ff)
        o.intra_op_num_threads = threads
        sess[ff] = quanta.InferenceSession(mb, o)
    fns = {"ORT": ref, **sess}
    for s in fns.values():
        for _ in range(3):
            s.run(None, {"x": x})
    clock = time.thread_time if threads == 1 else time.perf_counter
    t: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, s in fns.items():
            t0 = clock()
            for _ in range(reps):
                s.run(None, {"x": x})
            t[k].append((clock() - t0) / reps * 1e3)
    med = {k: float(np.median(v)) for k, v in t.items()}
    same = np.array_equal(sess["ort"].run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    return (
        f"{op} T{T} B{B} I{n_in} H{H} {'bi' if bidir else 'fw'} {threads}t: onnx-order {med['onnx']:.3f} ms, "
        f"ort-order {med['ort']:.3f}, ORT {med['ORT']:.3f}; onnx/ORT {med['onnx'] / med['ORT']:.2f}, "
        f"ort/ORT {med['ort'] / med['ORT']:.2f}, ort/onnx {med['ort'] / med['onnx']:.2f}; ort-order bytes == ORT: {same}"
    )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--cases", help="comma-separated indices into CASES (default: all)")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--isa", help="quanta's kernel ISA (e.g. avx2); default: the host's best")
    a = ap.parse_args(argv)
    if a.isa:
        from quanta.kernels import _native

        _native.set_isa(a.isa)
    picked = [int(c) for c in a.cases.split(",")] if a.cases else range(len(CASES))
    for i in picked:
        print(run(CASES[i], a.threads, a.rounds, a.reps), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
