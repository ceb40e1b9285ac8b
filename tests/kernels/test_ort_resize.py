"""quanta::OrtResizeLinear (reference/ort_resize.py): ONNX Runtime's float32 bilinear
Resize, eqs. (RB1)-(RB3) of docs/float-ops.md.

Failure signature this guards against: a float Resize before a DynamicQuantizeLinear in a
file ORT's quantize_dynamic wrote (MediaPipe's selfie segmenter converted by tf2onnx:
three 2x bilinear upsamples) computed as ONNX's value rounded once, an ulp from ORT's on
some elements, so the DynamicQuantizeLinear after it picks another scale and every code
moves (0.17 on the output probability; 0 after).

Tolerance 0: the twin is ORT's kernel operation by operation."""

from __future__ import annotations

import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels.reference.ort_resize import ORT_RESIZE_MODES, ort_resize_linear
from quanta.passes.rules.ort_float_functions import ORT_RESIZE_MODES as RULE_MODES

F32 = np.float32

# (input shape, scales of H and W): odd sizes, 2x / 3x / 1.5x / 2.5x up, 0.5x / 0.75x down,
# a single row (i1 = i2: weights 0.5)
CASES = [
    ((1, 7, 17, 13), (2.0, 2.0)),
    ((2, 3, 9, 11), (3.0, 1.5)),
    ((1, 17, 20, 30), (0.5, 0.75)),
    ((1, 3, 1, 5), (2.0, 2.5)),
]


def _data(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape))).astype(F32)


def _resize_model(shape, mode, *, scales=None, sizes=None, dynamic_q=False, producer="onnx.quantize"):
    roi = numpy_helper.from_array(np.array([], F32), "roi")
    inits = [roi, numpy_helper.from_array(np.array([1.7], F32), "k")]
    if scales is not None:
        inits.append(numpy_helper.from_array(np.array([1, 1, *scales], F32), "s"))
        r_in = ["xk", "roi", "s"]
    else:
        inits.append(numpy_helper.from_array(np.array([], F32), "s"))
        inits.append(numpy_helper.from_array(np.array([*shape[:2], *sizes], np.int64), "n"))
        r_in = ["xk", "roi", "s", "n"]
    nodes = [
        helper.make_node("Mul", ["x", "k"], ["xk"]),  # a float input, as in ORT's dynamic file
        helper.make_node("Resize", r_in, ["y"], mode="linear", coordinate_transformation_mode=mode),
    ]
    outs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if dynamic_q:
        nodes.append(helper.make_node("DynamicQuantizeLinear", ["y"], ["q", "qs", "qz"]))
        outs = [
            helper.make_tensor_value_info("q", TensorProto.UINT8, None),
            helper.make_tensor_value_info("qs", TensorProto.FLOAT, None),
        ]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))], outs, inits
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)], producer_name=producer)
    m.ir_version = 8
    return m


def _ort(m, feed: dict, threads: int = 1) -> list[np.ndarray]:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    return ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, feed)


def test_the_rule_and_the_twin_model_the_same_modes():
    assert tuple(RULE_MODES) == tuple(ORT_RESIZE_MODES)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mode", ORT_RESIZE_MODES)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_ort_resize_linear_twin_is_onnxruntime(case, mode, threads):
    shape, (sh, sw) = case
    x = _data(shape, sum(shape))
    want = _ort(_resize_model(shape, mode, scales=(sh, sw)), {"x": x}, threads)[0]
    xk = np.multiply(x, F32(1.7), dtype=F32)
    got = ort_resize_linear(xk, sh, sw, want.shape[2], want.shape[3], mode)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize(
    ("mode", "given"), list(itertools.product(("half_pixel", "align_corners"), ("scales", "sizes")))
)
def test_resize_before_dynamic_quantization_in_an_ort_file_is_onnxruntime(mode, given, backend):
    """A session of a file ORT's quantizer wrote (producer onnx.quantize) runs the float
    Resize as ORT does, so the DynamicQuantizeLinear after it picks ORT's scale and codes;
    quanta's own Resize ("onnx") does not on this data."""
    shape = (1, 17, 23, 19)
    kw = {"scales": (2.0, 2.0)} if given == "scales" else {"sizes": (46, 41)}
    m = _resize_model(shape, mode, dynamic_q=True, **kw)
    x = _data(shape, 5)
    want = _ort(m, {"x": x})
    path = m.SerializeToString()
    for ff, equal in (("auto", True), ("onnx", False)):
        sess = quanta.InferenceSession(path, quanta.SessionOptions(float_functions=ff), backend=backend)
        if ff == "auto":
            assert [s.op_type for s in sess.plan.steps if "Resize" in s.op_type] == ["OrtResizeLinear"]
            assert backend == "reference" or sess.fallbacks == []
        got = sess.run(None, {"x": x})
        same = all(np.array_equal(np.asarray(g), w) for g, w in zip(got, want, strict=True))
        assert same is equal, f"float_functions={ff}"
