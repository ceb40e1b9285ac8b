"""A real STFT with constant frame parameters is a strided 1-D convolution by the windowed
DFT basis: rewritten so, it runs on the native float convolution (a GEMM) instead of
onnx.reference's per-frame transforms.

StftAsConv (signal ``x[B, L, 1]`` real; frame_step, window and frame_length constants)::

    %y = STFT(%x, %step, %window?, %length?) {onesided}
      -> %f = Conv(Reshape(%x, [B|0, 1, L]), %basis) {strides=[step]}          [B, 2K, F]
         %y = Transpose(Reshape(%f, [B|0, K, 2, F]), [0, 3, 1, 2])               [B, F, K, 2]

    basis[2k, 0, n]     =  w[n] · cos(2π k n / N)                              (ST1)
    basis[2k + 1, 0, n] = −w[n] · sin(2π k n / N)

with N the frame length (the window's length, or ``length``), K = N / 2 + 1 bins when
onesided (else N), w the window (ones when absent) and F = 1 + (L − N) / step frames:
ONNX's definition y[b, f, k] = Σ_n x[b, f·step + n] · w[n] · e^(−2πi k n / N) with the
products by the window folded into the basis (computed in float64, rounded once to
float32). The result is the native Conv's: within eq. (FG1) of docs/float-ops.md with
K = N of the float64 sum over the float32 basis (tests/passes/rules/test_stft_as_conv.py
checks the bound and the agreement with onnx.reference and ONNX Runtime).

Refused: a complex signal (last dimension 2), a signal of another rank, frame parameters
that are not constants, a window whose length disagrees with frame_length, a frame
longer than the signal when the signal's length is known.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["StftAsConv", "StftAsConvPass", "stft_basis"]


def stft_basis(window: np.ndarray, bins: int) -> np.ndarray:
    """(ST1): [2·bins, 1, N] float32, rows cos and −sin of each bin, times the window."""
    n = window.shape[0]
    k = np.arange(bins, dtype=np.float64)[:, None]
    t = np.arange(n, dtype=np.float64)[None, :]
    angle = 2.0 * np.pi * ((k * t) % n) / n  # k·n mod N keeps the angle in [0, 2π): exact phases
    w = window.astype(np.float64)[None, :]
    basis = np.empty((bins, 2, n), np.float64)
    basis[:, 0] = w * np.cos(angle)
    basis[:, 1] = -w * np.sin(angle)
    return basis.reshape(2 * bins, 1, n).astype(np.float32)


class StftAsConv(Rule):
    """%y = STFT(x, step, window?, length?) -> Transpose(Reshape(Conv(Reshape(x), basis)))"""

    pattern = "y = STFT(x, step, w?, length?)"

    def check(self, m: Match) -> Match | NoMatch:
        x = m["x"]
        if x.shape is None or len(x.shape) != 3 or x.shape[2] != 1:
            return NoMatch("not a real signal [B, L, 1] of known rank")
        if x.type is None or x.type.elem.onnx != 1:
            return NoMatch("not a float32 signal")
        for name in ("step", "w", "length"):
            if m[name] is not None and not m[name].is_const:
                return NoMatch(f"{name} is not a constant")
        step = int(np.asarray(m["step"].const).reshape(-1)[0])
        window = None if m["w"] is None else np.asarray(m["w"].const)
        length = None if m["length"] is None else int(np.asarray(m["length"].const).reshape(-1)[0])
        if window is None and length is None:
            return NoMatch("neither a window nor a frame length")
        if window is not None and (window.ndim != 1 or (length is not None and window.shape[0] != length)):
            return NoMatch("the window's length disagrees with frame_length")
        n = length if window is None else window.shape[0]
        if step < 1 or n < 1 or (isinstance(x.shape[1], int) and x.shape[1] < n):
            return NoMatch(f"frame_step {step}, frame length {n} over a signal of {x.shape[1]}")
        onesided = int(m.root.attrs.get("onesided", 1))
        bins = n // 2 + 1 if onesided else n
        w = np.ones(n, np.float32) if window is None else window.astype(np.float32)
        m.data.update(step=step, bins=bins, basis=stft_basis(w, bins))
        return m

    def rewrite(self, m: Match, b: Builder) -> object:
        x, y = m["x"], m["y"]
        bins, step = m.data["bins"], m.data["step"]
        batch = x.shape[0] if isinstance(x.shape[0], int) else None
        name = m.root.name or "stft"
        signal = b.op(
            "Reshape",
            [x, b.const("stft_signal_shape", np.asarray([0, 1, -1], np.int64))],
            types=result_type(shape_from=None, elem_from=x),
            name=f"{name}/signal",
        )
        frames = y.shape[1] if y.shape is not None and len(y.shape) == 4 else None
        conv = b.op(
            "Conv",
            [signal, b.const("stft_basis", m.data["basis"])],
            {"strides": [step], "kernel_shape": [int(m.data["basis"].shape[2])]},
            types=result_type(shape_from=(batch, 2 * bins, frames), elem_from=x),
            name=f"{name}/dft",
        )
        split = b.op(
            "Reshape",
            [conv, b.const("stft_bins_shape", np.asarray([0, bins, 2, -1], np.int64))],
            types=result_type(shape_from=(batch, bins, 2, frames), elem_from=x),
            name=f"{name}/bins",
        )
        return b.op(
            "Transpose",
            [split],
            {"perm": [0, 3, 1, 2]},
            types=result_type(shape_from=y, elem_from=y),
            name=m.root.name or None,
        )


class StftAsConvPass(RewritePass):
    name = "stft_as_conv"
    rules = (StftAsConv(),)
