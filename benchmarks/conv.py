"""Convolution benchmark: quanta's QLinearConv / ConvInteger vs ONNX Runtime's, same run.

Run: ``python benchmarks/conv.py`` (``--quick`` for a short run, ``--threads 1``,
``--json FILE`` to keep the numbers). A ratio table from ONE run; nothing here is a timed
test. The machine is shared and noisy, so the only meaningful numbers are ratios measured
in the same run: the libraries are timed in alternating blocks (benchmarks/_timing.py
``time_alternating``) and the best batch of each is kept.

GOPS counts 2·N·M·(C/group)·kh·kw·OH·OW operations. Both sides compute the same thing on
the same data: x uint8 NCHW with a run-time zero point, constant int8 weights with
per-channel scales (zero point 0, as quantize_static produces), an int32 bias,
uint8 output (QLinearConv) or the int32 accumulator (ConvInteger, which takes no bias).
quanta is called through its binding with a preallocated output, ONNX Runtime through a
one-node session (its per-call overhead is included; quanta's Python binding overhead
is too).

Layouts: QLinearConv is timed NCHW (the ai.onnx op: quanta transposes inside the call,
ONNX Runtime's NhwcTransformer wraps its NHWC kernel in Transposes) and NHWC (the
com.microsoft op with channels_last=1, what an NHWC graph pass leaves between
convolutions: quanta's channels_last mode, ONNX Runtime's contrib kernel; no transposes
on either side). ConvInteger is NCHW only (ONNX Runtime has no NHWC ConvInteger).

Shapes: ResNet-50 layers (3x3 64 at 56², 1x1 256->64 at 56², 1x1 512->128 at 28², 3x3
stride 2 128 at 28²), MobileNet-V2 layers (depthwise 3x3 32 at 112², pointwise 96->24
at 56², depthwise 3x3 stride 2 144 at 28², depthwise 3x3 960 at 7²), the depthwise layers
of benchmarks/runtime.py mobilenet_like(224) and small channel counts around them ("mnet
dw C": 3x3, C = 8 .. 960; few channels leave most of a channels-as-lanes vector empty
unless output pixels share it), the stem of a MobileNet-style CNN (3 -> 16 channels,
3x3 stride 2 at 224², and 3 -> 32), and "narrow" layers with 8 or 16 output channels at
large resolutions (a detector's neck: the qgemm's narrow-panel tiles).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import time_alternating  # the timing loop shared with the GEMM benchmark

from quanta.kernels import _native
from quanta.passes.lower.requant_params import float_multiplier

# (name, N, C, H, W, M, k, stride, group)
SHAPES: tuple[tuple[str, int, int, int, int, int, int, int, int], ...] = (
    ("resnet50 3x3", 1, 64, 56, 56, 64, 3, 1, 1),
    ("resnet50 1x1", 1, 256, 56, 56, 64, 1, 1, 1),
    ("resnet50 1x1", 1, 512, 28, 28, 128, 1, 1, 1),
    ("resnet50 3x3 s2", 1, 128, 56, 56, 128, 3, 2, 1),
    ("mobilenet dw", 1, 32, 112, 112, 32, 3, 1, 32),
    ("mobilenet pw", 1, 96, 56, 56, 24, 1, 1, 1),
    ("mobilenet dw s2", 1, 144, 28, 28, 144, 3, 2, 144),
    ("mobilenet dw 7x7", 1, 960, 7, 7, 960, 3, 1, 960),
    ("mnet dw 8", 1, 8, 112, 112, 8, 3, 1, 8),
    ("mnet dw 16", 1, 16, 112, 112, 16, 3, 1, 16),
    ("mnet dw 24", 1, 24, 56, 56, 24, 3, 1, 24),
    ("mnet dw 32", 1, 32, 112, 112, 32, 3, 1, 32),
    ("mnet dw 48", 1, 48, 56, 56, 48, 3, 1, 48),
    ("mnet dw 64 s2", 1, 64, 112, 112, 64, 3, 2, 64),
    ("mnet dw 96", 1, 96, 56, 56, 96, 3, 1, 96),
    ("mnet dw 96 s2", 1, 96, 56, 56, 96, 3, 2, 96),
    ("mnet dw 128", 1, 128, 28, 28, 128, 3, 1, 128),
    ("mnet dw 960", 1, 960, 7, 7, 960, 3, 1, 960),
    ("stem 3->16 s2", 1, 3, 224, 224, 16, 3, 2, 1),
    ("stem 3->32 s2", 1, 3, 224, 224, 32, 3, 2, 1),
    ("narrow pw 16->16", 1, 16, 320, 320, 16, 1, 1, 1),
    ("narrow pw 32->16", 1, 32, 192, 224, 16, 1, 1, 1),
    ("narrow pw 64->8", 1, 64, 112, 112, 8, 1, 1, 1),
    ("narrow 3x3 16->16", 1, 16, 160, 160, 16, 3, 1, 1),
)


class Problem:
    """One layer's data and parameters, shared by both libraries."""

    def __init__(
        self, N: int, C: int, H: int, W: int, M: int, k: int, stride: int, group: int, seed: int = 0
    ):
        rng = np.random.default_rng(seed)
        self.x = rng.integers(0, 256, (N, C, H, W), dtype=np.uint8)
        self.w = rng.integers(-127, 128, (M, C // group, k, k), dtype=np.int8)
        self.zx = np.array(131, np.uint8)
        self.sx = np.array(0.02, np.float32)
        self.sw = rng.uniform(0.001, 0.004, M).astype(np.float32)
        self.zw = np.array(0, np.int8)
        self.sy = np.array(0.09, np.float32)
        self.zy = np.array(117, np.uint8)
        self.bias = rng.integers(-2000, 2000, M, dtype=np.int32)
        self.attrs = {
            "kernel_shape": [k, k],
            "strides": [stride, stride],
            "pads": [k // 2] * 4,
            "group": group,
        }
        oh = (H + 2 * (k // 2) - k) // stride + 1
        ow = (W + 2 * (k // 2) - k) // stride + 1
        self.y_shape = (N, M, oh, ow)
        self.x_nhwc = np.ascontiguousarray(self.x.transpose(0, 2, 3, 1))
        self.y_shape_nhwc = (N, oh, ow, M)
        self.ops = 2 * N * M * (C // group) * k * k * oh * ow


def _ort_session(p: Problem, op: str, threads: int, nhwc: bool = False) -> Callable[[], object]:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    if op == "QLinearConv":
        names = ["x", "sx", "zx", "w", "sw", "zw", "sy", "zy", "b"]
        values = [p.sx, p.zx, p.w, p.sw, p.zw, p.sy, p.zy, p.bias]
        y_type = TensorProto.UINT8
    else:
        names = ["x", "w", "zx"]
        values = [p.w, p.zx]
        y_type = TensorProto.INT32
    inits = [numpy_helper.from_array(v, n) for n, v in zip(names[1:], values)]
    opsets = [helper.make_opsetid("", 13)]
    if nhwc:  # the contrib op ONNX Runtime's own NhwcTransformer produces
        node = helper.make_node(op, names, ["y"], domain="com.microsoft", channels_last=1, **p.attrs)
        opsets.append(helper.make_opsetid("com.microsoft", 1))
    else:
        node = helper.make_node(op, names, ["y"], **p.attrs)
    x, y_shape = (p.x_nhwc, p.y_shape_nhwc) if nhwc else (p.x, p.y_shape)
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", y_type, list(y_shape))],
        inits,
    )
    model = helper.make_model(graph, opset_imports=opsets)
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    feed = {"x": x}
    return lambda: sess.run(None, feed)


def _quanta(p: Problem, op: str, threads: int, nhwc: bool = False) -> tuple[Callable[[], object], str]:
    conv = _native.QConv(p.w, p.zw, **p.attrs)
    x = p.x_nhwc if nhwc else p.x
    y_shape = p.y_shape_nhwc if nhwc else p.y_shape
    if op == "QLinearConv":
        out = np.empty(y_shape, np.uint8)
        m = float_multiplier(p.sx, p.sw, p.sy)
        fn = lambda: conv.qlinear(  # noqa: E731
            x, p.zx, m, p.zy, p.bias, num_threads=threads, out=out, channels_last=nhwc
        )
    else:
        out32 = np.empty(y_shape, np.int32)
        fn = lambda: conv.integer(x, p.zx, num_threads=threads, out=out32, channels_last=nhwc)  # noqa: E731
    return fn, conv.kernel_channels_last if nhwc else conv.kernel


def measure(
    threads: list[int],
    budget: float,
    ops: list[str] | None = None,
    layouts: list[str] | None = None,
    only: str | None = None,
    ort: bool = True,
) -> list[dict]:
    """Time every layer of SHAPES (whose name contains ``only``) for each op, layout and
    thread count; one row per measurement, GOPS per library."""
    ops = ops or ["QLinearConv", "ConvInteger"]
    layouts = layouts or ["NCHW", "NHWC"]
    rows = []
    for name, *shape in SHAPES:
        if only and only not in name:
            continue
        p = Problem(*shape)
        for op in ops:
            for layout in layouts if op == "QLinearConv" else ["NCHW"]:
                nhwc = layout == "NHWC"
                for t in threads:
                    q, kernel = _quanta(p, op, t, nhwc)
                    fns: dict[str, Callable[[], object]] = {"quanta": q}
                    if ort:
                        fns["ort"] = _ort_session(p, op, t, nhwc)
                    gops = time_alternating(fns, p.ops, budget)
                    rows.append(
                        {
                            "layer": name,
                            "shape": shape,
                            "op": op,
                            "layout": layout,
                            "threads": t,
                            "kernel": kernel,
                            "ms": {k: p.ops / v / 1e6 for k, v in gops.items()},
                            **gops,
                        }
                    )
                    print(".", end="", flush=True)
    print()
    return rows


def print_table(rows: list[dict], peak: float | None = None) -> None:
    """The ratio table; with ``peak`` (the single-thread vpdpbusd GOPS) also each side's
    share of threads x peak (depthwise layers are memory bound: far below it)."""
    header = (
        f"{'layer':<17} {'N,C,H,W -> M, k, s, g':<27} {'op':<11} {'lay':<4} {'thr':>3} "
        f"{'quanta':>7} {'ORT':>7} {'q/ORT':>6} {'q ms':>7}"
    )
    if peak:
        header += f" {'q/peak':>6} {'ORT/pk':>6}"
    header += "  kernel"
    print(header)
    print("-" * len(header))
    for r in rows:
        N, C, H, W, M, k, s, g = r["shape"]
        ort_g = r.get("ort")
        cells = [
            f"{r['layer']:<17}",
            f"{f'{N},{C},{H},{W} -> {M}, {k}, {s}, {g}':<27}",
            f"{r['op']:<11}",
            f"{r['layout']:<4}",
            f"{r['threads']:>3}",
            f"{r['quanta']:7.1f}",
            f"{ort_g:7.1f}" if ort_g else f"{'-':>7}",
            f"{r['quanta'] / ort_g:6.2f}" if ort_g else f"{'-':>6}",
            f"{r['ms']['quanta']:7.3f}",
        ]
        if peak:
            thr_peak = peak * r["threads"]
            cells.append(f"{r['quanta'] / thr_peak:6.1%}")
            cells.append(f"{ort_g / thr_peak:6.1%}" if ort_g else f"{'-':>6}")
        cells.append(f" {r['kernel']}")
        print(" ".join(cells))
    print("# GOPS = 2·N·M·(C/g)·kh·kw·OH·OW / time; q/ORT > 1: quanta faster; q ms: quanta's time per call.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="0.5 s per measurement instead of 1.5 s")
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--only", metavar="TEXT", help="only the layers whose name contains TEXT")
    ap.add_argument(
        "--layout",
        choices=["NCHW", "NHWC"],
        nargs="+",
        default=["NCHW", "NHWC"],
        help="QLinearConv layouts to time (ConvInteger is NCHW only)",
    )
    ap.add_argument(
        "--op", choices=["QLinearConv", "ConvInteger"], nargs="+", default=["QLinearConv", "ConvInteger"]
    )
    args = ap.parse_args(argv)
    try:
        import onnxruntime

        ort_version: str | None = onnxruntime.__version__
    except ImportError:
        ort_version = None

    rows = measure(
        args.threads, 0.5 if args.quick else 1.5, args.op, args.layout, args.only, ort_version is not None
    )
    print(
        f"# {platform.processor() or platform.machine()}, active ISA {_native.active_isa()}, "
        f"onnxruntime {ort_version or 'absent'}"
    )
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ort": ort_version, "isa": _native.active_isa(), "rows": rows}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
