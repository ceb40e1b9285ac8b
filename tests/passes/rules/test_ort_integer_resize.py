"""ResizeIntegerAsOrt (passes/rules/ort_integer_resize.py): a linear Resize of 8-bit
codes in a file ORT's quantizer wrote runs as ONNX Runtime computes it (float32 taps,
truncated toward zero), not with ONNX's reference rounding (half to even), which quanta
keeps everywhere else. Graphs built by code: the bare integer Resize, and the codes
between a QuantizeLinear and a DequantizeLinear (a QOperator file's form, where the
loader types the codes as quantized)."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.ort_integer_resize import OrtIntegerResize
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes

ORT_PRODUCER = "onnx.quantize"


def resize_proto(
    elem: int,
    shape: tuple[int, ...],
    *,
    scales: list[float] | None = None,
    sizes: list[int] | None = None,
    mode: str = "linear",
    ctm: str = "half_pixel",
    codes: bool = False,
    producer: str = ORT_PRODUCER,
):
    """y = Resize(x) on 8-bit x; ``codes``: x = QuantizeLinear(float input), y dequantized."""
    inits = [helper.make_tensor("roi", TensorProto.FLOAT, [0], [])]
    if scales is not None:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [len(scales)], scales))
        ins = ["xq", "roi", "scales"]
    else:
        inits.append(helper.make_tensor("scales", TensorProto.FLOAT, [0], []))
        inits.append(helper.make_tensor("sizes", TensorProto.INT64, [len(sizes)], sizes))
        ins = ["xq", "roi", "scales", "sizes"]
    nodes = [
        helper.make_node("Resize", ins, ["yq"], name="up", mode=mode, coordinate_transformation_mode=ctm)
    ]
    io_elem = TensorProto.FLOAT if codes else elem
    if codes:
        zp = 3 if elem == TensorProto.UINT8 else -5
        inits += [
            helper.make_tensor("s", TensorProto.FLOAT, [], [0.037]),
            helper.make_tensor("z", elem, [], [zp]),
        ]
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
            *nodes,
            helper.make_node("DequantizeLinear", ["yq", "s", "z"], ["y"], name="dq"),
        ]
    else:
        nodes = [
            helper.make_node("Identity", ["x"], ["xq"], name="id"),
            *nodes,
            helper.make_node("Identity", ["yq"], ["y"], name="out"),
        ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", io_elem, list(shape))],
        [helper.make_tensor_value_info("y", io_elem, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name=producer)
    m.ir_version = 8
    return m


def _input(elem: int, shape: tuple[int, ...], codes: bool, seed: int = 7) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if codes:
        return (rng.standard_normal(shape) * 3).astype(np.float32)
    if elem == TensorProto.UINT8:
        return rng.integers(0, 256, shape).astype(np.uint8)
    return rng.integers(-128, 128, shape).astype(np.int8)


def _ort(proto, feeds):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]


ELEMS = [TensorProto.UINT8, TensorProto.INT8]

# dyadic tap weights (1/8 ... 7/8), whose float32 sums are exact in either order
EXACT = [
    dict(scales=[1.0, 1.0, 2.0, 2.0]),
    dict(scales=[1.0, 1.0, 0.5, 0.5]),
    dict(scales=[1.0, 1.0, 2.0, 2.0], ctm="asymmetric"),
    dict(scales=[1.0, 1.0, 4.0, 2.0]),
]


@pytest.mark.parametrize("elem", ELEMS, ids=["u8", "i8"])
@pytest.mark.parametrize("codes", [False, True], ids=["integer", "q_codes"])
@pytest.mark.parametrize("case", EXACT, ids=["x2", "x0.5", "x2_asymmetric", "x4x2"])
def test_ort_file_resize_equals_onnxruntime(elem, codes, case) -> None:
    shape = (2, 3, 5, 7)
    proto = resize_proto(elem, shape, codes=codes, **case)
    feeds = {"x": _input(elem, shape, codes)}
    model = load(proto)
    result = run_passes(model, [OrtIntegerResize()])
    assert result.fired("ResizeIntegerAsOrt") == 1
    assert model.graph.op_counts()["Cast"] == 2
    # dyadic taps: exact in float32 in any order, so quanta's native (Z1) Resize stays
    assert "quanta::OrtResizeLinear" not in model.graph.op_counts()
    got = InferenceSession(proto).run(None, feeds)[0]
    np.testing.assert_array_equal(got, _ort(proto, feeds))


# tap weights that are not dyadic (thirds, 1.5x, align_corners' (n - 1) / (m - 1)), whose
# float32 sums depend on the order: ORT's (RB1)-(RB3) order through quanta::OrtResizeLinear
ORDERED = [
    dict(scales=[1.0, 1.0, 3.0, 3.0]),
    dict(scales=[1.0, 1.0, 3.0, 1.5], ctm="align_corners"),
    dict(sizes=[2, 3, 12, 10], ctm="pytorch_half_pixel"),
]


@pytest.mark.parametrize("elem", ELEMS, ids=["u8", "i8"])
@pytest.mark.parametrize("codes", [False, True], ids=["integer", "q_codes"])
@pytest.mark.parametrize("case", ORDERED, ids=["x3", "x3x1.5_align_corners", "sizes_pytorch"])
def test_ort_file_resize_in_orts_float_order_equals_onnxruntime(elem, codes, case) -> None:
    shape = (2, 3, 5, 7)
    proto = resize_proto(elem, shape, codes=codes, **case)
    feeds = {"x": _input(elem, (2, 3, 5, 7), codes)}
    model = load(proto)
    result = run_passes(model, [OrtIntegerResize()])
    assert result.fired("ResizeIntegerAsOrt") == 1
    assert model.graph.op_counts()["quanta::OrtResizeLinear"] == 1
    want = _ort(proto, feeds)
    for backend in ("native", "reference"):
        got = InferenceSession(proto, backend=backend).run(None, feeds)[0]
        np.testing.assert_array_equal(got, want, err_msg=backend)


@pytest.mark.parametrize("elem", ELEMS, ids=["u8", "i8"])
def test_onnx_rounding_kept_outside_ort_files(elem) -> None:
    # another producer (or float_functions="onnx"): ONNX's reference rounding, half to
    # even, which is one code above ORT's truncation where a tap sum ends in .25 / .5 / .75
    shape = (1, 3, 5, 7)
    feeds = {"x": _input(elem, shape, False)}
    proto = resize_proto(elem, shape, scales=[1.0, 1.0, 2.0, 2.0], producer="tf2onnx")
    got = InferenceSession(proto).run(None, feeds)[0]
    ref = _ort(proto, feeds).astype(np.int64)
    diff = got.astype(np.int64) - ref
    assert diff.max() == 1 and diff.min() == (-1 if elem == TensorProto.INT8 else 0)
    proto_ort = resize_proto(elem, shape, scales=[1.0, 1.0, 2.0, 2.0])
    as_onnx = InferenceSession(proto_ort, SessionOptions(float_functions="onnx")).run(None, feeds)[0]
    np.testing.assert_array_equal(as_onnx, got)


@pytest.mark.parametrize(
    ("elem", "mode", "reason"),
    [
        (TensorProto.UINT8, "nearest", "mode nearest"),
        (TensorProto.UINT8, "cubic", "mode cubic"),
        (TensorProto.FLOAT, "linear", "is f32, not u8 / i8"),
    ],
    ids=["nearest", "cubic", "float"],
)
def test_refused(elem, mode, reason) -> None:
    proto = resize_proto(elem, (1, 3, 5, 7), scales=[1.0, 1.0, 2.0, 2.0], mode=mode)
    model = load(proto)
    p = OrtIntegerResize()
    result = run_passes(model, [p])
    assert result.fired("ResizeIntegerAsOrt") == 0
    assert "Cast" not in model.graph.op_counts()
    assert any(reason in r.reason for r in p.no_matches())
