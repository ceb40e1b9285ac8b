"""The host stage's requantization parameters, derived once by the lowering and carried
on the nodes the kernels read them from.

A QLinearConv, QLinearMatMul, com.microsoft QGemm or quanta QLinearConv16 / QLinearMatMul16
with constant float32 scales gets its
float requantization multiplier (docs/quantization-math.md eq. (6), docs/passes.md
"Requantization parameters")::

    m[n] = f32(f32(f32(alpha · sa) · sb[n]) / sy)     alpha = 1 but for QGemm; no "/ sy"
                                                      for a QGemm with a float32 output

here, in the pass :class:`CarryRequantization` at the end of the host pipeline, and
stores it in ``node.requant`` (:class:`FloatRequant`; in memory, never written to ONNX).
The native binders (``quanta/targets/native/conv.py``, ``gemm.py``, ``a16w8.py``) and the C++ kernels
behind them take that multiplier as it is: none of them derives one from the scales. A
node whose scales are run-time tensors has no ``node.requant``; its kernel calls
:func:`float_multiplier` per call, the same function. The integer-only stage's fixed-point
multipliers are derived by :mod:`quanta.passes.lower.integer_only` (eqs. (IO1)-(IO3)).

``alpha · sa`` is exact for ``alpha = 1``, so the QLinear operators' ``f32(f32(sa·sb)/sy)``
is the same formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.passes.manager import Pass, PassResult

__all__ = ["REQUANT_OPS", "CarryRequantization", "FloatRequant", "float_multiplier", "requant_params"]

QUANTA_DOMAIN = "quanta"
F32 = np.float32

#: (op_type, domain) -> input positions of (sa, sb, sy) (sy None: optional at that index)
REQUANT_OPS: dict[tuple[str, str], tuple[int, int, int]] = {
    ("QLinearConv", ""): (1, 4, 6),
    ("QLinearConv", MS_DOMAIN): (1, 4, 6),
    ("QLinearMatMul", ""): (1, 4, 6),
    ("QGemm", MS_DOMAIN): (1, 4, 7),
    ("QLinearConv16", QUANTA_DOMAIN): (1, 4, 6),  # 16-bit activations (passes/lower/wide.py)
    ("QLinearMatMul16", QUANTA_DOMAIN): (1, 4, 6),
    ("QLinearMatMulAdd", QUANTA_DOMAIN): (1, 4, 6),  # the product's (passes/lower/qlinear_matmul_add.py)
}


@dataclass(frozen=True)
class FloatRequant:
    """Eq. (6)'s parameter of one node: ``multiplier`` (float32) has the shape of the
    operator's per-column / per-channel scale (a 0-d array when every scale is per
    tensor)."""

    multiplier: np.ndarray


def float_multiplier(
    sa: np.ndarray | float, sb: np.ndarray | float, sy: np.ndarray | float | None, alpha: float = 1.0
) -> np.ndarray:
    """``f32(f32(f32(alpha · sa) · sb) / sy)``, each operation rounded to float32 in that
    order (ONNX Runtime's C++ ``float`` arithmetic); ``sy`` None leaves out the division.
    Size-1 ``sa``, ``sb`` and ``sy`` count as scalars; ``sb`` per column keeps its shape.

    >>> float_multiplier(np.float32(0.5), np.array([0.25, 0.125], np.float32), np.float32(2.0)).tolist()
    [0.0625, 0.03125]
    """

    def scalar_if_one(v: np.ndarray | float) -> np.ndarray:
        a = np.asarray(v, F32)
        return a.reshape(()) if a.size == 1 else a

    with np.errstate(all="ignore"):  # a zero or huge scale gives inf / 0: the kernels name it
        m = np.multiply(np.multiply(F32(alpha), scalar_if_one(sa), dtype=F32), scalar_if_one(sb), dtype=F32)
        if sy is not None:
            m = np.divide(m, scalar_if_one(sy), dtype=F32)
    return np.asarray(m, F32)


def _const_f32(v: Value | None) -> np.ndarray | None:
    if v is None or v.const is None:
        return None
    a = np.asarray(v.const)
    return a if a.dtype == F32 else None


def requant_params(node: Node) -> FloatRequant | None:
    """``node.requant``, derived once (and stored there) when the node is one of
    :data:`REQUANT_OPS` with constant float32 scales, per tensor for ``sa`` and ``sy``;
    None otherwise (the kernel then takes the scales per call)."""
    if node.requant is not None:
        return node.requant
    pos = REQUANT_OPS.get((node.op_type, node.domain))
    if pos is None:
        return None
    sa, sb = _const_f32(node.input(pos[0])), _const_f32(node.input(pos[1]))
    y = node.input(pos[2])
    sy = None if y is None else _const_f32(y)
    if sa is None or sb is None or (y is not None and sy is None):
        return None
    if sa.size != 1 or (sy is not None and sy.size != 1):
        return None
    alpha = float(node.attrs.get("alpha", 1.0)) if node.op_type == "QGemm" else 1.0
    node.requant = FloatRequant(float_multiplier(sa, sb, sy, alpha))
    return node.requant


class CarryRequantization(Pass):
    """Derive :func:`requant_params` for every QLinearConv / QLinearMatMul / QGemm of the
    graph (the last step of the host pipeline: nodes made by ChannelsLast included)."""

    def call(self, graph: Graph) -> PassResult:
        n = 0
        for node in graph.nodes:
            if (node.op_type, node.domain) in REQUANT_OPS and node.requant is None:
                n += requant_params(node) is not None
        return PassResult(graph, False, {"carried": n})
