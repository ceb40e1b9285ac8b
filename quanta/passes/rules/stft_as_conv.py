"""A real STFT with constant frame parameters is a strided 1-D convolution by the windowed
DFT basis, and a real forward DFT a product by the DFT basis: rewritten so, they run on
the native float convolution and MatMul (GEMMs) instead of onnx.reference's transforms.

DftAsMatMul (signal ``x[..., N, 1]`` real, transformed along the axis before the last,
forward; dft_length L >= N a constant or absent)::

    %y = DFT(%x, %L?, %axis?) {onesided}
      -> %y = Reshape(MatMul(Reshape(%x, [0.., -1]), %basis'), [0.., K, 2])
    basis'[n, 2k] = cos(2π k n / L), basis'[n, 2k + 1] = −sin(2π k n / L)   n < N, k < K

(the samples past N are zeros: they add nothing), K = L / 2 + 1 when onesided, else L.

StftAsConv (signal ``x[B, L, 1]`` or ``x[B, L]`` real; frame_step, window and
frame_length constants)::

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

A signal ``[B, L]`` is a real one: ONNX's STFT asks for ``[B, L, 1]``, ONNX Runtime's kernel
takes a rank-2 signal as real (torch.stft exported at opset 17 writes one: Kokoro-82M's
iSTFT generator), and onnx.reference's STFT fails on it. StftAsConv reads it as ``[B, L, 1]``
(its Reshape to [B, 1, L] is the same); an STFT it refuses otherwise gets the signal
unsqueezed to ``[B, L, 1]`` (StftRealSignal), so the reference STFT runs it as ORT does.

Refused (STFT): a complex signal (last dimension 2), a signal of another rank, frame
parameters that are not constants, a window whose length disagrees with frame_length, a
frame longer than the signal when the signal's length is known. (DFT): a complex or
unknown-length signal, an inverse transform, another axis, a dft_length shorter than the
signal or not a constant.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import result_type
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule

__all__ = ["DftAsMatMul", "StftAsConv", "StftAsConvPass", "StftRealSignal", "stft_basis"]


def stft_basis(window: np.ndarray, bins: int, length: int | None = None) -> np.ndarray:
    """(ST1): [2·bins, 1, N] float32, rows cos and −sin of each bin, times the window;
    ``length`` (default N) is the transform's length L >= N (a signal zero-padded to L:
    the padded samples add nothing, so the basis keeps N columns of the L-point grid)."""
    n = window.shape[0]
    size = n if length is None else length
    k = np.arange(bins, dtype=np.float64)[:, None]
    t = np.arange(n, dtype=np.float64)[None, :]
    angle = 2.0 * np.pi * ((k * t) % size) / size  # k·n mod L keeps the angle in [0, 2π)
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
        if x.shape is None or not (len(x.shape) == 2 or (len(x.shape) == 3 and x.shape[2] == 1)):
            return NoMatch("not a real signal [B, L, 1] or [B, L] of known rank")
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


class StftRealSignal(Rule):
    """%y = STFT(x[B, L], ...) -> %y = STFT(Unsqueeze(x, [2]), ...): ONNX's layout of a real
    signal, for the STFTs StftAsConv leaves (it runs first on each node)."""

    pattern = "y = STFT(x, step, w?, length?)"

    def check(self, m: Match) -> Match | NoMatch:
        x = m["x"]
        if x.shape is None or len(x.shape) != 2:
            return NoMatch("not a signal [B, L] of known rank")
        return m

    def rewrite(self, m: Match, b: Builder) -> object:
        x, y = m["x"], m["y"]
        name = m.root.name or "stft"
        signal = b.op(
            "Unsqueeze",
            [x, b.const("stft_real_axis", np.asarray([2], np.int64))],
            types=result_type(shape_from=(*x.shape, 1), elem_from=x),
            name=f"{name}/real",
        )
        return b.op(
            "STFT",
            [signal, m["step"], m["w"], m["length"]],
            dict(m.root.attrs),
            types=result_type(shape_from=y, elem_from=y),
            name=m.root.name or None,
        )


class DftAsMatMul(Rule):
    """%y = DFT(x, length?, axis?) real, forward, along the axis before the last ->
    Reshape(MatMul(Reshape(x), basis), [..., K, 2])"""

    pattern = "y = DFT(x, length?, axis?)"

    def __init__(self, opset: int | None = None) -> None:
        self.opset = opset

    def check(self, m: Match) -> Match | NoMatch:
        x = m["x"]
        if x.shape is None or len(x.shape) < 2 or x.shape[-1] != 1 or not isinstance(x.shape[-2], int):
            return NoMatch("not a real signal [..., N, 1] of known length")
        if x.type is None or x.type.elem.onnx != 1:
            return NoMatch("not a float32 signal")
        if int(m.root.attrs.get("inverse", 0)):
            return NoMatch("an inverse DFT")
        rank = len(x.shape)
        if m["axis"] is not None:  # DFT-20: an input, default -2
            if not m["axis"].is_const:
                return NoMatch("axis is not a constant")
            axis = int(np.asarray(m["axis"].const).reshape(-1)[0])
        else:
            axis = int(m.root.attrs.get("axis", -2 if (self.opset or 0) >= 20 else 1))
        if axis % rank != rank - 2:
            return NoMatch(f"the transform runs along axis {axis}, not the one before the last")
        n = x.shape[-2]
        if m["length"] is not None and not m["length"].is_const:
            return NoMatch("dft_length is not a constant")
        size = n if m["length"] is None else int(np.asarray(m["length"].const).reshape(-1)[0])
        if size < n or n < 1:
            return NoMatch(f"dft_length {size} below the signal's {n} samples")
        bins = size // 2 + 1 if int(m.root.attrs.get("onesided", 0)) else size
        basis = stft_basis(np.ones(n, np.float32), bins, size)  # [2K, 1, N]
        m.data.update(bins=bins, basis=np.ascontiguousarray(basis[:, 0, :].T))  # [N, 2K]
        return m

    def rewrite(self, m: Match, b: Builder) -> object:
        x, y = m["x"], m["y"]
        lead = [0] * (len(x.shape) - 2)
        name = m.root.name or "dft"
        bins = m.data["bins"]
        flat = b.op(
            "Reshape",
            [x, b.const("dft_signal_shape", np.asarray([*lead, -1], np.int64))],
            types=result_type(shape_from=(*x.shape[:-2], x.shape[-2]), elem_from=x),
            name=f"{name}/signal",
        )
        product = b.op(
            "MatMul",
            [flat, b.const("dft_basis", m.data["basis"])],
            types=result_type(shape_from=(*x.shape[:-2], 2 * bins), elem_from=x),
            name=f"{name}/dft",
        )
        return b.op(
            "Reshape",
            [product, b.const("dft_bins_shape", np.asarray([*lead, bins, 2], np.int64))],
            types=result_type(shape_from=y, elem_from=y),
            name=m.root.name or None,
        )


class StftAsConvPass(RewritePass):
    name = "stft_as_conv"

    def __init__(self, opset: int | None = None) -> None:
        super().__init__([StftAsConv(), StftRealSignal(), DftAsMatMul(opset)])
