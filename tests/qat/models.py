"""Small float models for the QAT tests, built by code (odd channel counts 3 / 7 / 17)."""

from __future__ import annotations

import torch
import torch.nn as nn


class SmallCnn(nn.Module):
    """Conv-BN-Relu, depthwise Conv-Clip(0, 6), 1x1 Conv, residual Add, GAP, Gemm."""

    def __init__(self) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(3, 7, 3, padding=1)
        self.bn = nn.BatchNorm2d(7)
        self.dw = nn.Conv2d(7, 7, 3, padding=1, groups=7)
        self.bn2 = nn.BatchNorm2d(7)
        self.pw = nn.Conv2d(7, 17, 1)
        self.pw2 = nn.Conv2d(17, 7, 1, bias=False)
        self.c3 = nn.Conv2d(7, 17, 3, stride=2, padding=(0, 1))
        self.fc = nn.Linear(17, 5)
        with torch.no_grad():
            for bn in (self.bn, self.bn2):
                bn.running_mean.uniform_(-0.5, 0.5)
                bn.running_var.uniform_(0.5, 2.0)
                bn.weight.uniform_(0.5, 1.5)
                bn.bias.uniform_(-0.2, 0.2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn(self.c1(x)))
        z = torch.clamp(self.bn2(self.dw(y)), 0.0, 6.0)
        z = self.pw2(torch.relu(self.pw(z)))
        y = y + z
        y = torch.relu(self.c3(y))
        y = torch.nn.functional.adaptive_avg_pool2d(y, 1).flatten(1)
        return self.fc(y)


class TinyTransformerBlock(nn.Module):
    """Single-head attention with a residual, LayerNorm, GELU MLP: MatMuls on weights and
    on two activations, Softmax, LayerNorm, Erf."""

    def __init__(self, d: int = 17, hidden: int = 7) -> None:
        super().__init__()
        self.q = nn.Linear(d, d)
        self.k = nn.Linear(d, d)
        self.v = nn.Linear(d, d)
        self.o = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d)
        self.f1 = nn.Linear(d, hidden)
        self.f2 = nn.Linear(hidden, d)
        self.scale = d**-0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = torch.softmax(self.q(x) @ self.k(x).transpose(1, 2) * self.scale, dim=-1)
        x = self.ln(x + self.o(a @ self.v(x)))
        return x + self.f2(torch.nn.functional.gelu(self.f1(x)))
