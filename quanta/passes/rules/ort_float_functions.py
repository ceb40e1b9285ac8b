"""ONNX Runtime's float functions in place of ONNX's: Sigmoid and Tanh as ORT computes them.

Rules (each replaces the ONNX function by ORT's computation of it)::

    %y = Sigmoid(%x: f32) -> %y = quanta::MlasLogistic(%x)      SigmoidToMlasLogistic
    %y = Tanh(%x: f32)    -> %y = quanta::MlasTanh(%x)          TanhToMlasTanh

Why: ONNX defines Sigmoid and Tanh as the exact functions, and quanta computes them within
2.4 and 2 ulp (docs/float-ops.md (Σ1)-(Σ2), (T1)-(T4)). ONNX Runtime computes MLAS's
rational approximations (``MlasComputeLogistic``, ``MlasComputeTanh``), which are not
what ONNX says in the last bits (a few ulp near 0.5; for x < 0 the logistic is a
multiple of 2^−25, exactly 0 from x = −18 down where ONNX's sigmoid is 1.5e−8). A file ORT's quantizer wrote was calibrated and is deployed with
ORT's functions, and its float islands feed quantizations (every DynamicQuantizeLinear
rounds its input anew), so a last-bit difference flips codes downstream: the
ddddocr captcha reader quantized by ``quantize_dynamic`` ends 0.44 (in logits) from ORT
with ONNX's sigmoid and bit-identical with ORT's. The replacement is exact against ORT
(its twins, :mod:`quanta.kernels.reference.ort_float`, are MLAS's kernels operation by
operation), not against ONNX: the session runs this pass only when asked
(``SessionOptions.float_functions = "ort"``, or ``"auto"`` on a file ORT's quantizer
wrote), never inside quantization.

Refused: an input whose element type is known and not float32 (MLAS computes float32
only; ORT's double Sigmoid is Eigen's, which this does not model).
"""

from __future__ import annotations

from quanta.ir.graph import Value, result_type
from quanta.ir.types import F32
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe

__all__ = ["QUANTA_DOMAIN", "OrtFloatFunctions", "SigmoidToMlasLogistic", "TanhToMlasTanh"]

QUANTA_DOMAIN = "quanta"  # quanta.kernels.reference.ort_float (kernels sit below passes)


class _ToMlas(Rule):
    op_type = ""
    mlas_op = ""

    def check(self, m: Match) -> Match | NoMatch:
        x = m["x"]
        if x.type is not None and x.type.elem != F32:
            return NoMatch(f"input {describe(x)} is {x.type.elem}, not f32 (MLAS computes float32 only)")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        return b.op(
            self.mlas_op,
            [m.value("x")],
            types=result_type(shape_from=m["y"], elem_from=m["y"]),
            domain=QUANTA_DOMAIN,
            name=m.root.name or None,
        )


class SigmoidToMlasLogistic(_ToMlas):
    """%y = Sigmoid(%x: f32) -> %y = quanta::MlasLogistic(%x)"""

    pattern = "y = Sigmoid(x)"
    mlas_op = "MlasLogistic"


class TanhToMlasTanh(_ToMlas):
    """%y = Tanh(%x: f32) -> %y = quanta::MlasTanh(%x)"""

    pattern = "y = Tanh(x)"
    mlas_op = "MlasTanh"


class OrtFloatFunctions(RewritePass):
    name = "ort_float_functions"
    rules = (SigmoidToMlasLogistic(), TanhToMlasTanh())
