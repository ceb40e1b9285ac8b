"""Element and tensor types of the quanta IR.

A value's type carries its whole numerical contract (docs/design.md, "The quantized type
contract"). Types are frozen dataclasses compared *by value*: two int8 tensors with
different scales are different types.

Element types
-------------
- :class:`FloatType`      f64, f32, f16, bf16 and the float8/float4 formats (ml_dtypes)
- :class:`IntType`        plain integers i2..i64, u2..u64, and bool
- :class:`QuantType`      ``Q(storage, expressed, scale, zero_point, axis, block)``: the
                          affine map ``real = (q - zero_point) * scale`` (docs eq. (1))
- :class:`MXType`         ``MX(element:expressed, axis=k, block=B)``: an OCP Microscaling
                          block type (docs/quantization-math.md eq. (MX1)-(MX3)): every B
                          consecutive elements along axis k share one power-of-two E8M0
                          scale; the scales are a tensor of their own (a DequantizeLinear
                          input, or QuantizeMX's second output), not part of the type
- :class:`CalibratedType` ``Cal(expressed, min, max)``: an observed real range, not yet
                          turned into quantization parameters
- :class:`OtherType`      anything else ONNX can hold (string, complex): carried, never computed

Printed forms (also what :func:`parse_elem` reads back)::

    f32    i8    u4    f8e4m3fn
    Q(i8:f32, 0.02, 0)                     per-tensor
    Q(u8:f32, axis=0, [0.5, 0.25], [3, 7]) per-axis
    Q(i4:f32, axis=1, block=32, ...)       per-block: scale/zero_point hold the full
                                           (flattened, row-major) scale tensor
    MX(f8e4m3fn:f32, axis=1, block=32)     MXFP8 E4M3, shared E8M0 scale per 32 along axis 1
    Cal(f32, -1.5, 3.25)

Incorrect / Correct (checked by :meth:`QuantType.__post_init__`)::

    Q(i8:f32, axis=0, [0.5, 0.25], [3])   # Incorrect: 2 scales but 1 zero point
    Q(i8:f32, axis=0, [0.5, 0.25], [3, 0])  # Correct

Incorrect / Correct (checked by :meth:`MXType.__post_init__`)::

    MX(u8:f32, axis=1, block=32)          # Incorrect: u8 is no MX element type
    MX(f8e4m3fn:f16, axis=1, block=0)     # Incorrect: the block size must be positive
    MX(f4e2m1fn:f32, axis=-1, block=32)   # Correct (MXFP4, along the last axis)
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
from onnx import TensorProto

__all__ = [
    "BF16",
    "BOOL",
    "E8M0",
    "F4E2M1",
    "F6E2M3",
    "F6E3M2",
    "F8E4M3FN",
    "F8E5M2",
    "F16",
    "F32",
    "F64",
    "I4",
    "I8",
    "I16",
    "I32",
    "I64",
    "MX_ELEMENTS",
    "U4",
    "U8",
    "U16",
    "U32",
    "U64",
    "CalibratedType",
    "ElemType",
    "FloatType",
    "IntType",
    "MXType",
    "OtherType",
    "QuantType",
    "TensorType",
    "as_string_feed",
    "elem_from_numpy",
    "elem_from_onnx",
    "parse_elem",
]


@dataclass(frozen=True)
class FloatType:
    """A floating-point element type, named as in the printer: f32, f16, bf16, f8e4m3fn…"""

    name: str

    def __str__(self) -> str:
        return self.name

    @property
    def numpy(self) -> np.dtype:
        return _FLOAT_NUMPY[self.name]

    @property
    def onnx(self) -> int:
        return _FLOAT_ONNX[self.name]

    @property
    def storage(self) -> FloatType:
        return self


@dataclass(frozen=True)
class IntType:
    """A plain integer element type (``bits`` = 1 and ``signed`` = False is bool)."""

    bits: int
    signed: bool

    def __str__(self) -> str:
        if self.bits == 1:
            return "bool"
        return f"{'i' if self.signed else 'u'}{self.bits}"

    @property
    def qmin(self) -> int:
        return -(1 << (self.bits - 1)) if self.signed else 0

    @property
    def qmax(self) -> int:
        return (1 << (self.bits - 1)) - 1 if self.signed else (1 << self.bits) - 1

    @property
    def numpy(self) -> np.dtype:
        return _INT_NUMPY[str(self)]

    @property
    def onnx(self) -> int:
        return _INT_ONNX[str(self)]

    @property
    def storage(self) -> IntType:
        return self


@dataclass(frozen=True)
class OtherType:
    """An ONNX element type quanta carries but never computes with (string, complex…)."""

    name: str
    onnx_code: int

    def __str__(self) -> str:
        return self.name

    @property
    def onnx(self) -> int:
        return self.onnx_code

    @property
    def numpy(self) -> np.dtype:
        from onnx import helper

        return np.dtype(helper.tensor_dtype_to_np_dtype(self.onnx_code))

    @property
    def storage(self) -> OtherType:
        return self


StorageType = IntType | FloatType


#: dtypes whose ``tolist()`` already gives Python floats / ints (no per-element cast)
_TOLIST_FLOAT = frozenset(np.dtype(t) for t in (np.float16, np.float32, np.float64))
_TOLIST_INT = frozenset(
    np.dtype(t) for t in (np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64)
)


def _as_tuple(v: object, cast: type) -> tuple:
    arr = np.asarray(v).reshape(-1)
    values = arr.tolist()
    # a per-channel type holds thousands of entries: skip the cast where tolist() has done it
    if (cast is float and arr.dtype in _TOLIST_FLOAT) or (cast is int and arr.dtype in _TOLIST_INT):
        return tuple(values)
    return tuple(cast(x) for x in values)


@dataclass(frozen=True)
class QuantType:
    """``Q(storage, expressed, scale, zero_point, axis, block)``.

    The affine map is ``real = (q - zero_point) * scale`` (docs/quantization-math.md
    eq. (1)); ``q = saturate(round_half_even(real / scale) + zero_point)`` (eq. (2)).

    - per-tensor: ``axis is None``, one scale and one zero point;
    - per-axis: ``axis = k``, as many scales/zero points as dimension k has;
    - per-block: ``axis = k`` and ``block = B``; ``scale``/``zero_point`` hold the whole
      scale tensor flattened row-major, ``scale_shape`` its shape (dimension k is
      ``ceil(dim_k / B)``).

    Scales are stored as Python floats of the *float32* values (ONNX stores scales as
    the expressed type), so equality is exact and printing round-trips.
    ``storage`` is an :class:`IntType` or a float8 :class:`FloatType` (zero point then 0).
    """

    storage: StorageType
    expressed: FloatType
    scale: tuple[float, ...]
    zero_point: tuple[int | float, ...]
    axis: int | None = None
    block: int | None = None
    scale_shape: tuple[int, ...] | None = field(default=None, compare=True)

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", _as_tuple(np.asarray(self.scale, np.float32), float))
        zp_cast = int if isinstance(self.storage, IntType) else float
        object.__setattr__(self, "zero_point", _as_tuple(self.zero_point, zp_cast))
        if len(self.scale) != len(self.zero_point):
            raise ValueError(
                f"quantized type: {len(self.scale)} scales but {len(self.zero_point)} zero points"
            )
        if not self.scale:
            raise ValueError("quantized type: at least one scale is required")
        if self.axis is None and len(self.scale) != 1:
            raise ValueError(f"quantized type: per-tensor type has {len(self.scale)} scales (expected 1)")
        if self.block is not None and self.axis is None:
            raise ValueError("quantized type: block size given without an axis")
        if self.block is not None and self.block <= 0:
            raise ValueError(f"quantized type: block size must be positive, got {self.block}")
        if len(self.scale) == 1:  # per tensor, most types: no array for one float
            bad = not (self.scale[0] > 0.0 and math.isfinite(self.scale[0]))
        else:
            scales = np.asarray(self.scale, np.float64)
            bad = not bool(np.all(scales > 0.0) & np.all(np.isfinite(scales)))
        if bad:
            for s in self.scale:
                if not (s > 0.0 and math.isfinite(s)):
                    raise ValueError(f"quantized type: scale must be positive and finite, got {s}")
        if isinstance(self.storage, IntType):
            qmin, qmax = self.storage.qmin, self.storage.qmax
            if not (qmin <= min(self.zero_point) and max(self.zero_point) <= qmax):
                for z in self.zero_point:
                    if not (qmin <= z <= qmax):
                        raise ValueError(
                            f"quantized type: zero point {z} outside [{qmin}, {qmax}] of {self.storage}"
                        )
        if self.scale_shape is not None:
            object.__setattr__(self, "scale_shape", tuple(int(d) for d in self.scale_shape))
            if int(np.prod(self.scale_shape)) != len(self.scale):
                raise ValueError(
                    f"quantized type: scale_shape {self.scale_shape} does not hold {len(self.scale)} scales"
                )

    @property
    def per_tensor(self) -> bool:
        return self.axis is None

    @property
    def qmin(self) -> int:
        assert isinstance(self.storage, IntType)
        return self.storage.qmin

    @property
    def qmax(self) -> int:
        assert isinstance(self.storage, IntType)
        return self.storage.qmax

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype of the stored integers."""
        return self.storage.numpy

    @property
    def onnx(self) -> int:
        return self.storage.onnx

    def scale_array(self) -> np.ndarray:
        """Scales as a float32 array (scalar for per-tensor, 1-D per-axis, N-D per-block)."""
        a = np.asarray(self.scale, dtype=self.expressed.numpy)
        if self.axis is None:
            return a.reshape(())
        if self.scale_shape is not None:
            return a.reshape(self.scale_shape)
        return a

    def zero_point_array(self) -> np.ndarray:
        a = np.asarray(self.zero_point).astype(self.storage.numpy)
        if self.axis is None:
            return a.reshape(())
        if self.scale_shape is not None:
            return a.reshape(self.scale_shape)
        return a

    def __str__(self) -> str:
        head = f"Q({self.storage}:{self.expressed}"
        if self.axis is None:
            return f"{head}, {_fmt(self.scale[0])}, {_fmt(self.zero_point[0])})"
        extra = f", axis={self.axis}"
        if self.block is not None:
            extra += f", block={self.block}"
        if self.scale_shape is not None:
            extra += f", shape={list(self.scale_shape)}"
        scales = "[" + ", ".join(_fmt(s) for s in self.scale) + "]"
        zps = "[" + ", ".join(_fmt(z) for z in self.zero_point) + "]"
        return f"{head}{extra}, {scales}, {zps})"


#: The element types of the OCP MX v1.0 formats (Table 1 of the specification), by the
#: names the quantizer options use: MXFP8 E4M3 / E5M2, MXFP6 E3M2 / E2M3, MXFP4, MXINT8.
MX_ELEMENTS: dict[str, str] = {
    "mxfp8_e4m3": "f8e4m3fn",
    "mxfp8_e5m2": "f8e5m2",
    "mxfp6_e3m2": "f6e3m2fn",
    "mxfp6_e2m3": "f6e2m3fn",
    "mxfp4": "f4e2m1fn",
    "mxint8": "i8",
}


@dataclass(frozen=True)
class MXType:
    """``MX(element:expressed, axis=k, block=B)``: an OCP Microscaling block type.

    ``real = 2^(e_b - 127) · decode(element)`` for element i of block b, where ``e_b`` is
    the block's stored E8M0 scale (docs/quantization-math.md eq. (MX1)); MXINT8's decode
    is ``q · 2^-6`` (eq. (MX2)). Blocks are ``B`` consecutive elements along ``axis`` (the
    reduction axis of the consuming GEMM or convolution); the last block of a dimension
    that ``B`` does not divide is short. The scale tensor has the value's shape with
    dimension ``axis`` replaced by ``ceil(dim / B)``, element type E8M0 (:data:`E8M0`).

    The scales are data (computed from each block's own maximum, at run time for
    activations), so the type carries no scale values: two MX tensors of one format,
    axis and block size have the same type.
    """

    element: FloatType | IntType
    expressed: FloatType
    axis: int = -1
    block: int = 32

    def __post_init__(self) -> None:
        if str(self.element) not in MX_ELEMENTS.values():
            raise ValueError(
                f"MX type: element type {self.element} is not an MX element type "
                f"(expected one of {', '.join(MX_ELEMENTS.values())})"
            )
        if not isinstance(self.expressed, FloatType) or self.expressed.name not in ("f32", "f16", "bf16"):
            raise ValueError(f"MX type: expressed type {self.expressed} is not f32, f16 or bf16")
        if not isinstance(self.block, int) or self.block <= 0:
            raise ValueError(f"MX type: block size must be a positive integer, got {self.block}")

    @property
    def storage(self) -> FloatType | IntType:
        return self.element

    @property
    def scale_type(self) -> FloatType:
        return E8M0

    @property
    def format(self) -> str:
        """The quantizer option name: mxfp8_e4m3, mxint8, ..."""
        return {v: k for k, v in MX_ELEMENTS.items()}[str(self.element)]

    @property
    def numpy(self) -> np.dtype:
        return self.element.numpy

    @property
    def onnx(self) -> int:
        return self.element.onnx

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The shape of the E8M0 scale tensor of a value of ``shape``."""
        ax = self.axis % len(shape)
        return tuple(-(-d // self.block) if i == ax else d for i, d in enumerate(shape))

    def __str__(self) -> str:
        return f"MX({self.element}:{self.expressed}, axis={self.axis}, block={self.block})"


@dataclass(frozen=True)
class CalibratedType:
    """``Cal(expressed, min, max)``: an observed range of real values (per-tensor), or
    per-channel ranges along ``axis`` (``min``/``max`` tuples)."""

    expressed: FloatType
    min: float | tuple[float, ...]
    max: float | tuple[float, ...]
    axis: int | None = None

    def __post_init__(self) -> None:
        if self.axis is None:
            object.__setattr__(self, "min", float(self.min))  # type: ignore[arg-type]
            object.__setattr__(self, "max", float(self.max))  # type: ignore[arg-type]
            if self.min > self.max:
                raise ValueError(f"calibrated type: min {self.min} > max {self.max}")
        else:
            mins, maxs = _as_tuple(self.min, float), _as_tuple(self.max, float)
            if len(mins) != len(maxs):
                raise ValueError(f"calibrated type: {len(mins)} minima but {len(maxs)} maxima")
            if any(a > b for a, b in zip(mins, maxs)):
                raise ValueError("calibrated type: some min > max")
            object.__setattr__(self, "min", mins)
            object.__setattr__(self, "max", maxs)

    @property
    def numpy(self) -> np.dtype:
        return self.expressed.numpy

    @property
    def onnx(self) -> int:
        return self.expressed.onnx

    @property
    def storage(self) -> FloatType:
        return self.expressed

    def __str__(self) -> str:
        if self.axis is None:
            return f"Cal({self.expressed}, {_fmt(self.min)}, {_fmt(self.max)})"
        lo = "[" + ", ".join(_fmt(v) for v in self.min) + "]"  # type: ignore[union-attr]
        hi = "[" + ", ".join(_fmt(v) for v in self.max) + "]"  # type: ignore[union-attr]
        return f"Cal({self.expressed}, axis={self.axis}, {lo}, {hi})"


ElemType = FloatType | IntType | QuantType | MXType | CalibratedType | OtherType

Dim = int | str | None


@dataclass(frozen=True)
class TensorType:
    """Shape plus element type. ``shape is None`` means unknown rank; a dimension is an
    int, a symbolic name, or None (unknown)."""

    elem: ElemType
    shape: tuple[Dim, ...] | None = None

    def __post_init__(self) -> None:
        if self.shape is not None:
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def rank(self) -> int | None:
        return None if self.shape is None else len(self.shape)

    def with_elem(self, elem: ElemType) -> TensorType:
        return TensorType(elem, self.shape)

    def __str__(self) -> str:
        if self.shape is None:
            return f"tensor<?, {self.elem}>"
        dims = "x".join("?" if d is None else str(d) for d in self.shape)
        return f"tensor<{dims}, {self.elem}>" if dims else f"tensor<{self.elem}>"


def _fmt(v: float | int) -> str:
    if isinstance(v, int):
        return str(v)
    # Shortest decimal that reads back as the same float32 (scales are float32 values).
    f32 = np.float32(v)
    if float(f32) == float(v) and math.isfinite(v):
        return (
            np.format_float_positional(f32, unique=True, trim="-")
            if 1e-4 <= abs(v) < 1e6 or v == 0
            else (np.format_float_scientific(f32, unique=True, trim="-"))
        )
    return repr(float(v))


F64, F32, F16, BF16 = FloatType("f64"), FloatType("f32"), FloatType("f16"), FloatType("bf16")
F8E4M3FN, F8E5M2 = FloatType("f8e4m3fn"), FloatType("f8e5m2")
F6E3M2, F6E2M3, F4E2M1 = FloatType("f6e3m2fn"), FloatType("f6e2m3fn"), FloatType("f4e2m1fn")
#: The MX shared-scale type: 8 exponent bits, no sign, no mantissa, 0xFF = NaN.
E8M0 = FloatType("e8m0")
I4, I8, I16, I32, I64 = (
    IntType(4, True),
    IntType(8, True),
    IntType(16, True),
    IntType(32, True),
    IntType(64, True),
)
U4, U8, U16, U32, U64 = (
    IntType(4, False),
    IntType(8, False),
    IntType(16, False),
    IntType(32, False),
    IntType(64, False),
)
BOOL = IntType(1, False)

_FLOAT_NUMPY: dict[str, np.dtype] = {
    "f64": np.dtype(np.float64),
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f8e4m3fn": np.dtype(ml_dtypes.float8_e4m3fn),
    "f8e4m3fnuz": np.dtype(ml_dtypes.float8_e4m3fnuz),
    "f8e5m2": np.dtype(ml_dtypes.float8_e5m2),
    "f8e5m2fnuz": np.dtype(ml_dtypes.float8_e5m2fnuz),
    "f4e2m1fn": np.dtype(ml_dtypes.float4_e2m1fn),
    "f6e3m2fn": np.dtype(ml_dtypes.float6_e3m2fn),
    "f6e2m3fn": np.dtype(ml_dtypes.float6_e2m3fn),
    "e8m0": np.dtype(ml_dtypes.float8_e8m0fnu),
}
_FLOAT_ONNX: dict[str, int] = {
    "f64": TensorProto.DOUBLE,
    "f32": TensorProto.FLOAT,
    "f16": TensorProto.FLOAT16,
    "bf16": TensorProto.BFLOAT16,
    "f8e4m3fn": TensorProto.FLOAT8E4M3FN,
    "f8e4m3fnuz": TensorProto.FLOAT8E4M3FNUZ,
    "f8e5m2": TensorProto.FLOAT8E5M2,
    "f8e5m2fnuz": TensorProto.FLOAT8E5M2FNUZ,
    "f4e2m1fn": TensorProto.FLOAT4E2M1,
    "f6e3m2fn": TensorProto.FLOAT6E3M2,
    "f6e2m3fn": TensorProto.FLOAT6E2M3,
    "e8m0": TensorProto.FLOAT8E8M0,
}
_INT_NUMPY: dict[str, np.dtype] = {
    "bool": np.dtype(np.bool_),
    "i2": np.dtype(ml_dtypes.int2),
    "u2": np.dtype(ml_dtypes.uint2),
    "i4": np.dtype(ml_dtypes.int4),
    "u4": np.dtype(ml_dtypes.uint4),
    "i8": np.dtype(np.int8),
    "u8": np.dtype(np.uint8),
    "i16": np.dtype(np.int16),
    "u16": np.dtype(np.uint16),
    "i32": np.dtype(np.int32),
    "u32": np.dtype(np.uint32),
    "i64": np.dtype(np.int64),
    "u64": np.dtype(np.uint64),
}
_INT_ONNX: dict[str, int] = {
    "bool": TensorProto.BOOL,
    "i2": getattr(TensorProto, "INT2", -2),
    "u2": getattr(TensorProto, "UINT2", -3),
    "i4": TensorProto.INT4,
    "u4": TensorProto.UINT4,
    "i8": TensorProto.INT8,
    "u8": TensorProto.UINT8,
    "i16": TensorProto.INT16,
    "u16": TensorProto.UINT16,
    "i32": TensorProto.INT32,
    "u32": TensorProto.UINT32,
    "i64": TensorProto.INT64,
    "u64": TensorProto.UINT64,
}


def _int_from_name(name: str) -> IntType:
    if name == "bool":
        return BOOL
    return IntType(int(name[1:]), name[0] == "i")


_BY_ONNX: dict[int, FloatType | IntType] = {}
for _n, _c in _FLOAT_ONNX.items():
    _BY_ONNX[_c] = FloatType(_n)
for _n, _c in _INT_ONNX.items():
    if _c >= 0:
        _BY_ONNX[_c] = _int_from_name(_n)
_BY_NUMPY: dict[np.dtype, FloatType | IntType] = {}
for _n, _d in _FLOAT_NUMPY.items():
    _BY_NUMPY[_d] = FloatType(_n)
for _n, _d in _INT_NUMPY.items():
    _BY_NUMPY[_d] = _int_from_name(_n)


def elem_from_onnx(code: int) -> FloatType | IntType | OtherType:
    """Element type for an ONNX ``TensorProto.DataType`` code."""
    if code in _BY_ONNX:
        return _BY_ONNX[code]
    return OtherType(TensorProto.DataType.Name(code).lower(), code)


def as_string_feed(arr: np.ndarray) -> np.ndarray:
    """A feed for a ``tensor(string)`` input as the runtimes hold one (numpy ``object`` of
    ``str``). numpy's fixed-width unicode (``np.array(["ab", "c"])``) and bytes arrays are
    what users build and what ONNX Runtime accepts, so they convert (bytes as UTF-8);
    any other dtype comes back unchanged for the caller's dtype check to name."""
    if arr.dtype.kind == "U":
        return arr.astype(object)
    if arr.dtype.kind == "S":
        return np.vectorize(lambda b: b.decode("utf-8", errors="replace"), otypes=[object])(arr)
    return arr


def elem_from_numpy(dtype: np.dtype | type) -> FloatType | IntType | OtherType:
    """Element type for a numpy dtype (including ml_dtypes' int4/float8/bfloat16)."""
    d = np.dtype(dtype)
    if d in _BY_NUMPY:
        return _BY_NUMPY[d]
    from onnx import helper

    return elem_from_onnx(helper.np_dtype_to_tensor_dtype(d))


_NUM = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan)"


def parse_elem(text: str) -> ElemType:
    """Parse the printed form of an element type (inverse of ``str``)."""
    text = text.strip()
    if text in _FLOAT_NUMPY:
        return FloatType(text)
    if text in _INT_NUMPY:
        return _int_from_name(text)
    m = re.fullmatch(r"Q\((\w+):(\w+)(.*)\)", text)
    if m:
        storage = parse_elem(m.group(1))
        expressed = parse_elem(m.group(2))
        assert isinstance(expressed, FloatType) and isinstance(storage, (IntType, FloatType))
        rest = m.group(3)
        axis = _kw(rest, "axis")
        block = _kw(rest, "block")
        shape_m = re.search(r"shape=\[([^\]]*)\]", rest)
        scale_shape = tuple(int(v) for v in shape_m.group(1).split(",")) if shape_m else None
        lists = re.findall(r"\[([^\]]*)\]", re.sub(r"shape=\[[^\]]*\]", "", rest))
        if axis is None:
            nums = re.findall(_NUM, re.sub(r"\w+=\S+", "", rest))
            scale, zp = [float(nums[0])], [nums[1]]
        else:
            scale = [float(v) for v in lists[0].split(",")]
            zp = [v.strip() for v in lists[1].split(",")]
        zp_vals = [int(z) if isinstance(storage, IntType) else float(z) for z in zp]
        return QuantType(storage, expressed, tuple(scale), tuple(zp_vals), axis, block, scale_shape)
    m = re.fullmatch(r"MX\((\w+):(\w+), axis=(-?\d+), block=(\d+)\)", text)
    if m:
        element, expressed = parse_elem(m.group(1)), parse_elem(m.group(2))
        assert isinstance(element, (IntType, FloatType)) and isinstance(expressed, FloatType)
        return MXType(element, expressed, int(m.group(3)), int(m.group(4)))
    m = re.fullmatch(r"Cal\((\w+),(.*)\)", text)
    if m:
        expressed = parse_elem(m.group(1))
        assert isinstance(expressed, FloatType)
        rest = m.group(2)
        axis = _kw(rest, "axis")
        if axis is None:
            lo, hi = re.findall(_NUM, rest)
            return CalibratedType(expressed, float(lo), float(hi))
        lists = re.findall(r"\[([^\]]*)\]", rest)
        return CalibratedType(
            expressed,
            tuple(float(v) for v in lists[0].split(",")),
            tuple(float(v) for v in lists[1].split(",")),
            axis,
        )
    raise ValueError(f"cannot parse element type {text!r}")


def _kw(text: str, key: str) -> int | None:
    m = re.search(rf"{key}=(-?\d+)", text)
    return int(m.group(1)) if m else None
