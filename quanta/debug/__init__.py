"""The quantization debugger: :func:`compare` (layer-wise error of a QDQ model against
its FP32 original, quanta.debug.compare) and its HTML report (quanta.debug.html)."""

from quanta.debug.compare import DebugResult, compare

__all__ = ["DebugResult", "compare"]
