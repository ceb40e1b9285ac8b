"""Native quanta::MlasQLinearConv: ONNX Runtime's QLinearConv as its u8·s8 kernels without
VNNI compute it (pairs of products saturate to int16).

=================  ==============================================  ======================
operator           native call                                      twin (bit for bit)
=================  ==============================================  ======================
quanta             the twin's NumPy: the exact sum as one float64   reference/mlas_qconv.py
MlasQLinearConv    GEMM (BLAS; products of codes are exact below    ``mlas_qlinear_conv``,
                   2^53), the saturated pairs' correction formed    eqs. (QC1)-(QC4)
                   only for weight pairs that can leave int16
=================  ==============================================  ======================

No C++ kernel: the op runs only with ``float_functions="ort"`` by name, on files ORT's
tool wrote, to reproduce ORT's codes on CPUs whose ORT kernels saturate.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node
from quanta.kernels.reference.mlas_qconv import QUANTA_DOMAIN, mlas_qlinear_conv_op
from quanta.targets.base import Kernel
from quanta.targets.native import register_binder
from quanta.targets.native.a16w8 import _blas


def _mlas_qlinear_conv(ctx: Any, *inputs: Any, out: Any = None, **attrs: Any) -> np.ndarray:
    # one BLAS thread: the products are small, and a BLAS pool spinning against the
    # session's own threads took 17 ms for a 144 x 88 x 88 product (0.07 ms on one)
    with _blas().limit(limits=1, user_api="blas"):
        y = mlas_qlinear_conv_op(ctx, *inputs, **attrs)
    if out is None:
        return y
    np.copyto(out, y)
    return out


@register_binder("MlasQLinearConv", QUANTA_DOMAIN)
def bind_mlas_qlinear_conv(model: Model, node: Node) -> tuple[Kernel | None, str]:
    """quanta MlasQLinearConv: the twin's vector code (module docstring)."""
    del model, node  # unused
    return Kernel(_mlas_qlinear_conv, "native", "numpy:mlas_qlinear_conv", out=True), ""
