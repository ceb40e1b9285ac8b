"""Fake quantization in PyTorch with quanta's arithmetic (docs/quantization-math.md).

Every function here works on float32 tensors that hold integer codes ("codes"), so that
the forward value is exactly the integer the deployed kernel stores, and the gradient is
the straight-through estimator (STE): ``round`` passes the gradient unchanged, the
saturation passes it only inside ``[qmin, qmax]`` (``torch.clamp``'s own gradient).

- quantize, eq. (2): ``q = sat(rne(f32(x / s)) + z)``; ``torch.round`` rounds half to
  even and the division is one IEEE float32 division, as quanta's reference does;
- dequantize, eq. (1): ``r = f32(f32(q − z) · s)`` (the difference is exact);
- requantize, eq. (6): ``m = f32(f32(sx·sw) / sy)``, ``y = sat(rne(f32(f32(acc)·m)) + zy)``;
- int32 bias: ``bq = rne(f64(b) / f64(f32(sx·sw)))`` (quanta.quantize.params.quantize_bias).

With ``scale`` a leaf tensor that requires grad, the gradient of dequantize(quantize(x))
with respect to ``s`` is LSQ's (Esser et al. 2020): ``rne(x/s) − x/s`` inside the range,
``qmin − z`` / ``qmax − z`` outside.
"""

from __future__ import annotations

import torch

__all__ = [
    "bias_codes",
    "dequantize",
    "fake_quantize",
    "grad_scale",
    "quantize",
    "requant_multiplier",
    "requantize",
    "round_ste",
]


class _RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return torch.round(x)  # round half to even

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        return g


def round_ste(x: torch.Tensor) -> torch.Tensor:
    """Round half to even forward, identity backward."""
    return _RoundSTE.apply(x)


class _GradScale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, s: torch.Tensor, factor: float) -> torch.Tensor:  # type: ignore[override]
        ctx.factor = factor
        return s.clone()

    @staticmethod
    def backward(ctx, g: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        return g * ctx.factor, None


def grad_scale(s: torch.Tensor, factor: float) -> torch.Tensor:
    """``s`` in the forward, bit for bit, gradient multiplied by ``factor`` (LSQ's step-size
    gradient scale). The usual ``(s - s·f).detach() + s·f`` is not ``s`` in float32 (it
    rounds twice), and the scale the forward uses must be the one the file stores."""
    return _GradScale.apply(s, factor)


def quantize(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int
) -> torch.Tensor:
    """Eq. (2) as float32 codes: ``sat(rne(x / s) + z)``."""
    return torch.clamp(round_ste(x / scale) + zero_point, qmin, qmax)


class _FakeQuant(torch.autograd.Function):
    """``dq(q(x))`` for a fixed per-tensor ``(s, z)`` in one pass of in-place steps: the
    same float32 operations in the same order as :func:`quantize` then
    :func:`dequantize` (so the same values), with a one-byte mask for the STE."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, s: torch.Tensor, z: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:  # type: ignore[override]
        t = torch.div(x, s).round_().add_(z)
        mask = (t >= qmin) & (t <= qmax)
        ctx.save_for_backward(mask)
        return t.clamp_(qmin, qmax).sub_(z).mul_(s)

    @staticmethod
    def backward(ctx, g: torch.Tensor):  # type: ignore[override]
        (mask,) = ctx.saved_tensors
        return g * mask, None, None, None, None


def fake_quantize(
    x: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor, qmin: int, qmax: int
) -> torch.Tensor:
    """``dequantize(quantize(x))`` with the STE; one fused pass when the scale is fixed."""
    if scale.requires_grad or zero_point.requires_grad or not x.requires_grad:
        return dequantize(quantize(x, scale, zero_point, qmin, qmax), scale, zero_point)
    return _FakeQuant.apply(x, scale, zero_point, qmin, qmax)


def dequantize(q: torch.Tensor, scale: torch.Tensor, zero_point: torch.Tensor) -> torch.Tensor:
    """Eq. (1): ``(q − z) · s`` in float32."""
    return (q - zero_point) * scale


def requant_multiplier(sx: torch.Tensor, sw: torch.Tensor, sy: torch.Tensor) -> torch.Tensor:
    """``m = f32(f32(sx · sw) / sy)`` (eq. (6)), every step a float32 operation."""
    return (sx.float() * sw.float()) / sy.float()


def requantize(acc: torch.Tensor, m: torch.Tensor, zy: torch.Tensor, qmin: int, qmax: int) -> torch.Tensor:
    """Eq. (6) on an exact integer accumulator held in float64: the float32 conversion
    rounds it once (as the kernels' int32 → float32 conversion does), the product is a
    float32 multiplication, the clamp before rounding equals saturation after it."""
    prod = acc.to(torch.float32) * m
    return torch.round(torch.clamp(prod, qmin - zy, qmax - zy)) + zy


def bias_codes(b: torch.Tensor, sx: torch.Tensor, sw: torch.Tensor) -> torch.Tensor:
    """int32 bias codes at ``sb = f32(sx · sw)`` (float32 codes, STE): quanta's
    ``quantize_bias`` rounds ``f64(b) / f64(sb)`` half to even and clips to int32."""
    sb = (sx.float() * sw.float()).to(torch.float64)
    q = round_ste(b.to(torch.float64) / sb)
    return torch.clamp(q, -(2.0**31), 2.0**31 - 1)
