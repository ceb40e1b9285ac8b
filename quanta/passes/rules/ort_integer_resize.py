"""ONNX Runtime's linear Resize of 8-bit integers: interpolated in float32, then truncated.

Rule::

    %y = Resize|Upsample(%x: u8|i8, ...) {mode: linear}               ResizeIntegerAsOrt
        -> %y = Cast(quanta::OrtResizeLinear(Cast(%x) {to: f32})) {to: elem(%x)}
           where ORT's bilinear order is modelled (docs/float-ops.md (RB1)-(RB3): a
           Resize of the last two axes with constant scales or sizes) and matters (tap
           weights not all dyadic: not a power-of-two scale), else
        -> %y = Cast(Resize|Upsample(Cast(%x) {to: f32}, ...)) {to: elem(%x)}

Why: ONNX does not say how an integer Resize rounds its interpolated values. ONNX's
reference evaluator rounds them half to even and saturates (``saturate_cast``), and so
does quanta's Resize (reference/nn_resize.py ``resize_output``). ONNX Runtime's CPU
kernel (upsample.cc) sums the taps of an 8-bit input in float32 and converts the sum with
``static_cast<T>``: it truncates toward zero. A linear interpolation is a convex
combination of its taps, so the float32 sum stays within the input type's range and
``Cast`` (truncation toward zero, quanta's and ORT's) is that conversion. The two
semantics differ by one code on about 4 in 10 outputs of a 2x upsampling (every output
whose weights are 1/4 and 3/4 and whose taps differ), and ORT's QOperator files put
Resize on the codes themselves (``QLinearConv -> Resize(u8) -> QLinearConv``):
mediapipe's palm detector (tf2onnx, ORT ``quantize_static`` QOperator) ran 8 codes from
ORT at the first convolution after its upsampling and 7 output steps at the end with
quanta's rounding, where ORT's own optimized and unoptimized runs agree.

The session runs this pass where it runs ONNX Runtime's float functions
(``SessionOptions.float_functions`` "ort", or "auto" on a file ORT's quantizer wrote:
session.py), never inside quantization: quanta's own files keep ONNX's rounding.

Refused: nearest (it moves codes, no rounding), cubic (its taps overshoot the input
range, and ORT clamps them in its own way: not modelled), antialias (ORT's antialiasing
path for 8-bit inputs is a fixed-point one with its own rounding: not modelled), and any
input type other than uint8 / int8.
"""

from __future__ import annotations

import numpy as np

from quanta.ir.graph import Value, result_type
from quanta.ir.types import F32, I8, U8, QuantType
from quanta.passes.pattern import Builder, Match, NoMatch, RewritePass, Rule
from quanta.passes.rules._util import describe
from quanta.passes.rules.ort_float_functions import QUANTA_DOMAIN, ort_resize_linear_attrs

__all__ = ["OrtIntegerResize", "ResizeIntegerAsOrt"]


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _dyadic_taps(attrs: dict, x: Value) -> bool:
    """Every tap weight k / 2^j (a power-of-two scale, 1/8 to 8, under half_pixel,
    pytorch_half_pixel or asymmetric): products of 8-bit codes and their sums are then exact
    in float32, so ORT's order (RB1)-(RB3) and (Z1) rounded once give the same values and
    the Resize keeps quanta's native (Z1) kernel."""
    if attrs["coordinate_transformation_mode"] not in ("half_pixel", "pytorch_half_pixel", "asymmetric"):
        return False
    if int(attrs["sizes"][0]) > 0:
        dims = None if x.type is None or x.type.shape is None else x.type.shape[-2:]
        if dims is None or not all(isinstance(d, int) and d > 0 for d in dims):
            return False
        ratios = [np.float32(n) / np.float32(d) for n, d in zip(attrs["sizes"], dims, strict=True)]
    else:
        ratios = [np.float32(v) for v in attrs["scales"]]
    return all(float(r) in DYADIC_SCALES for r in ratios)


#: the power-of-two scales whose tap weights are dyadic (:func:`_dyadic_taps`)
DYADIC_SCALES = frozenset(2.0**k for k in range(-3, 4))


class ResizeIntegerAsOrt(Rule):
    """%y = Resize|Upsample(%x: u8|i8, ...) {mode: linear}
    -> %y = Cast(quanta::OrtResizeLinear(Cast(%x) {to: f32})) {to: elem(%x)} where ORT's
    float32 order is modelled and the taps are not dyadic, else
    -> %y = Cast(Resize|Upsample(Cast(%x) {to: f32}, ...)) {to: elem(%x)}"""

    pattern = "y = Resize|Upsample(x, ...)"

    def check(self, m: Match) -> Match | NoMatch:
        node, x, y = m.root, m.value("x"), m.value("y")
        if node.domain:
            return NoMatch(f"{node.op_type} of domain {node.domain!r}")
        elem = None if x.type is None else x.type.elem
        if isinstance(elem, QuantType):  # codes: the loader types a QOperator file's tensors
            elem = elem.storage
        if elem not in (U8, I8):
            return NoMatch(
                f"input {describe(x)} is {'unknown' if x.type is None else x.type.elem}, not u8 / i8"
            )
        if y.type is None:
            return NoMatch(f"output {describe(y)} has no type")
        mode = _text(node.attrs.get("mode", "nearest"))
        if mode not in ("linear", "bilinear", "trilinear"):
            return NoMatch(f"mode {mode} (only linear interpolation rounds differently)")
        if int(node.attrs.get("antialias", 0)):
            return NoMatch("antialias (ORT's 8-bit antialiasing is fixed-point: not modelled)")
        return m

    def rewrite(self, m: Match, b: Builder) -> Value:
        node, x, y = m.root, m.value("x"), m.value("y")
        assert y.type is not None  # check()
        elem = y.type.elem
        storage = elem.storage if isinstance(elem, QuantType) else elem  # Cast writes the codes
        name = node.name or y.name
        widened = b.op(
            "Cast",
            [x],
            {"to": F32.onnx},
            types=result_type(shape_from=x, elem_from=F32),
            name=f"{name}_to_f32",
        )
        attrs = ort_resize_linear_attrs(node, x)
        if isinstance(attrs, dict) and not _dyadic_taps(attrs, x):  # ORT's order, (RB1)-(RB3)
            resized = b.op(
                "OrtResizeLinear",
                [widened],
                attrs,
                types=result_type(shape_from=y, elem_from=F32),
                domain=QUANTA_DOMAIN,
                name=f"{name}_f32",
            )
        else:  # Upsample, Resize-10, other modes: ONNX's value rounded once to float32
            resized = b.op(
                node.op_type,
                [widened, *node.inputs[1:]],
                dict(node.attrs),
                types=result_type(shape_from=y, elem_from=F32),
                name=f"{name}_f32",
                attr_types=node.attr_types,
            )
        return b.op(
            "Cast",
            [resized],
            {"to": storage.onnx},
            types=result_type(shape_from=y, elem_from=y),
            name=name,
        )


class OrtIntegerResize(RewritePass):
    name = "ort_integer_resize"
    rules = (ResizeIntegerAsOrt(),)
