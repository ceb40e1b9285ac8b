"""The convolution layers of two zoo ResNets, one QLinearConv each: quanta vs ONNX Runtime,
per layer and weighted by how often the model runs it (the models' conv time without
their other ops).

    python benchmarks/model_conv_layers.py --model open_nsfw [--threads 1] [--layout nhwc]

``open_nsfw`` is a thin ResNet-50 at 224² (a 7x7 stem, 3x3 layers of 32-256 channels at
56²-7², 1x1 layers, stride-2 1x1 projections); ``effword_resnet50`` a ResNet-50 of 61-486
bottleneck channels on a 149 x 64 input, whose late layers have 40 and 10 pixels (few
GEMM rows, large weights). Data as ``benchmarks/conv.py`` (uint8 x, zx = 131, int8
weights in [-127, 127] with per-channel scales, uint8 y): quanta runs its 8-bit family
on avx2. Timing: the fastest of single calls interleaved call by call, in thread CPU time
at one thread (the machine is shared), wall time at more. A ratio table from ONE run;
nothing here is a timed test.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import conv  # benchmarks/conv.py: Problem and both engines' one-node runs
from _timing import fastest_calls

# (name, count in the model, N, C, H, W, M, k, stride[, group]); k = 1 has no pads, k > 1
# pads k // 2
LAYERS: dict[str, list[tuple[int | str, ...]]] = {
    "open_nsfw": [
        ("stem 7x7 3->64 s2 @224", 1, 1, 3, 224, 224, 64, 7, 2),
        ("1x1 64->32 @56", 1, 1, 64, 56, 56, 32, 1, 1),
        ("3x3 32->32 @56", 3, 1, 32, 56, 56, 32, 3, 1),
        ("1x1 32->128 @56", 3, 1, 32, 56, 56, 128, 1, 1),
        ("1x1 64->128 @56", 1, 1, 64, 56, 56, 128, 1, 1),
        ("1x1 128->32 @56", 2, 1, 128, 56, 56, 32, 1, 1),
        ("1x1 128->64 s2 @56", 1, 1, 128, 56, 56, 64, 1, 2),
        ("3x3 64->64 @28", 4, 1, 64, 28, 28, 64, 3, 1),
        ("1x1 64->256 @28", 4, 1, 64, 28, 28, 256, 1, 1),
        ("1x1 128->256 s2 @56", 1, 1, 128, 56, 56, 256, 1, 2),
        ("1x1 256->64 @28", 3, 1, 256, 28, 28, 64, 1, 1),
        ("1x1 256->128 s2 @28", 1, 1, 256, 28, 28, 128, 1, 2),
        ("3x3 128 @14", 6, 1, 128, 14, 14, 128, 3, 1),
        ("1x1 128->512 @14", 6, 1, 128, 14, 14, 512, 1, 1),
        ("1x1 256->512 s2 @28", 1, 1, 256, 28, 28, 512, 1, 2),
        ("1x1 512->128 @14", 5, 1, 512, 14, 14, 128, 1, 1),
        ("1x1 512->256 s2 @14", 1, 1, 512, 14, 14, 256, 1, 2),
        ("3x3 256 @7", 3, 1, 256, 7, 7, 256, 3, 1),
        ("1x1 256->1024 @7", 3, 1, 256, 7, 7, 1024, 1, 1),
        ("1x1 512->1024 s2 @14", 1, 1, 512, 14, 14, 1024, 1, 2),
        ("1x1 1024->256 @7", 2, 1, 1024, 7, 7, 256, 1, 1),
    ],
    "effword_resnet50": [
        ("1x1 61->256 @38x16", 4, 1, 61, 38, 16, 256, 1, 1),
        ("1x1 256->61 @38x16", 2, 1, 256, 38, 16, 61, 1, 1),
        ("3x3 61 @38x16", 3, 1, 61, 38, 16, 61, 3, 1),
        ("1x1 256->122 @38x16", 1, 1, 256, 38, 16, 122, 1, 1),
        ("1x1 512->122 @19x8", 3, 1, 512, 19, 8, 122, 1, 1),
        ("3x3 122 @19x8", 3, 1, 122, 19, 8, 122, 3, 1),
        ("1x1 122->512 @19x8", 4, 1, 122, 19, 8, 512, 1, 1),
        ("1x1 1024->243 @10x4", 5, 1, 1024, 10, 4, 243, 1, 1),
        ("3x3 243 @10x4", 5, 1, 243, 10, 4, 243, 3, 1),
        ("1x1 243->1024 @10x4", 6, 1, 243, 10, 4, 1024, 1, 1),
        ("1x1 2048->486 @5x2", 2, 1, 2048, 5, 2, 486, 1, 1),
        ("3x3 486 @5x2", 2, 1, 486, 5, 2, 486, 3, 1),
        ("1x1 486->2048 @5x2", 3, 1, 486, 5, 2, 2048, 1, 1),
        ("1x1 1024->2048 s2 @10x4", 1, 1, 1024, 10, 4, 2048, 1, 2),
    ],
    # yunet (face detection, 640²): a 3x3 s2 stem, then 1x1 + depthwise 3x3 pairs at
    # 320²-20² of 16-64 channels, and 1x1 heads of 1-10 channels
    "yunet": [
        ("stem 3x3 3->16 s2 @640", 1, 1, 3, 640, 640, 16, 3, 2),
        ("1x1 16->16 @320", 1, 1, 16, 320, 320, 16, 1, 1),
        ("dw 3x3 16 @320", 1, 1, 16, 320, 320, 16, 3, 1, 16),
        ("1x1 16->16 @160", 1, 1, 16, 160, 160, 16, 1, 1),
        ("dw 3x3 16 @160", 1, 1, 16, 160, 160, 16, 3, 1, 16),
        ("1x1 16->32 @160", 1, 1, 16, 160, 160, 32, 1, 1),
        ("dw 3x3 32 @160", 2, 1, 32, 160, 160, 32, 3, 1, 32),
        ("1x1 32->32 @160", 1, 1, 32, 160, 160, 32, 1, 1),
        ("1x1 32->64 @160", 1, 1, 32, 160, 160, 64, 1, 1),
        ("dw 3x3 64 @160", 1, 1, 64, 160, 160, 64, 3, 1, 64),
        ("1x1 64->64 @80", 3, 1, 64, 80, 80, 64, 1, 1),
        ("dw 3x3 64 @80", 3, 1, 64, 80, 80, 64, 3, 1, 64),
        ("1x1 64->64 @40", 3, 1, 64, 40, 40, 64, 1, 1),
        ("dw 3x3 64 @40", 3, 1, 64, 40, 40, 64, 3, 1, 64),
        ("1x1 64->10 @80", 1, 1, 64, 80, 80, 10, 1, 1),
        ("1x1 64->4 @80", 1, 1, 64, 80, 80, 4, 1, 1),
        ("1x1 64->1 @80", 2, 1, 64, 80, 80, 1, 1, 1),
    ],
}


def problem(N: int, C: int, H: int, W: int, M: int, k: int, stride: int, group: int = 1) -> conv.Problem:
    p = conv.Problem(N, C, H, W, M, k, stride, group)
    if k == 1:  # conv.Problem pads k // 2, which is 0 here, but sizes its output for it
        oh, ow = (H - 1) // stride + 1, (W - 1) // stride + 1
        p.attrs["pads"] = [0, 0, 0, 0]
        p.y_shape, p.y_shape_nhwc = (N, M, oh, ow), (N, oh, ow, M)
        p.ops = 2 * N * M * C * oh * ow
    return p


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=sorted(LAYERS), default="open_nsfw")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layout", choices=["nhwc", "nchw"], default="nhwc")
    ap.add_argument("--budget", type=float, default=0.15, help="seconds per layer and engine")
    ap.add_argument("--only", default="", help="layers whose name contains this")
    args = ap.parse_args(argv)
    nhwc = args.layout == "nhwc"
    total_q = total_o = 0.0
    for name, *numbers in LAYERS[args.model]:
        if args.only not in str(name):
            continue
        count, *shape = (int(v) for v in numbers)
        p = problem(*shape)
        q, kernel = conv._quanta(p, "QLinearConv", args.threads, nhwc)
        o = conv._ort_session(p, "QLinearConv", args.threads, nhwc)
        t = fastest_calls({"quanta": q, "ort": o}, args.budget, args.threads)
        total_q += count * t["quanta"]
        total_o += count * t["ort"]
        print(
            f"{name:24} x{count}  {kernel[:42]:42} quanta {t['quanta'] * 1e3:6.3f} ms "
            f"{p.ops / t['quanta'] / 1e9:5.0f} GOPS  ORT {t['ort'] * 1e3:6.3f} ms "
            f"{p.ops / t['ort'] / 1e9:5.0f}  {t['quanta'] / t['ort']:.2f}x",
            flush=True,
        )
    print(f"weighted: quanta {total_q * 1e3:.2f} ms, ORT {total_o * 1e3:.2f} ms, {total_q / total_o:.2f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
