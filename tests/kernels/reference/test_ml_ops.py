"""ai.onnx.ml::LabelEncoder (quanta/kernels/reference/ml_ops.py) against ONNX Runtime,
every version's attribute forms, hits, misses and defaults; and string feeds as numpy
builds them (fixed-width unicode, bytes), which ONNX Runtime accepts."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta

ML = "ai.onnx.ml"


def _model(in_type: int, out_type: int, ml_opset: int, **attrs):
    node = helper.make_node("LabelEncoder", ["x"], ["y"], domain=ML, name="enc", **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", in_type, ["N", 3])],
        [helper.make_tensor_value_info("y", out_type, ["N", 3])],
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)], ir_version=9
    )


CASES = {
    "v1 string -> index": (
        TensorProto.STRING,
        TensorProto.INT64,
        1,
        {"classes_strings": ["", "man:a", "man:b", "yue:c"], "default_int64": 7},
        np.array([["man:b", "", "zz"], ["yue:c", "man:a", "man:a"]], dtype=object),
    ),
    "v1 index -> string": (
        TensorProto.INT64,
        TensorProto.STRING,
        1,
        {"classes_strings": ["q", "w", "e"], "default_string": "?"},
        np.array([[2, 0, 5], [-1, 1, 1]], np.int64),
    ),
    "v2 string -> float": (
        TensorProto.STRING,
        TensorProto.FLOAT,
        2,
        {"keys_strings": ["a", "bb", "a"], "values_floats": [0.5, -3.25, 9.0], "default_float": 17.0},
        np.array([["a", "bb", "c"], ["", "bb", "a"]], dtype=object),
    ),
    "v2 int -> string": (
        TensorProto.INT64,
        TensorProto.STRING,
        2,
        {"keys_int64s": [3, 7, -17], "values_strings": ["three", "seven", "minus"]},
        np.array([[3, 7, -17], [0, 3, 8]], np.int64),
    ),
    "v2 float -> int": (
        TensorProto.FLOAT,
        TensorProto.INT64,
        2,
        {"keys_floats": [0.1, 2.5, -7.0], "values_int64s": [11, 22, 33], "default_int64": -3},
        np.array([[0.1, 2.5, 2.4], [-7.0, np.nan, 0.1]], np.float32),
    ),
    "v4 tensors int -> float": (
        TensorProto.INT64,
        TensorProto.FLOAT,
        4,
        {
            "keys_tensor": numpy_helper.from_array(np.array([1, 3, 17], np.int64), "k"),
            "values_tensor": numpy_helper.from_array(np.array([0.25, 7.5, -1.0], np.float32), "v"),
            "default_tensor": numpy_helper.from_array(np.array([42.0], np.float32), "d"),
        },
        np.array([[1, 2, 3], [17, 17, 0]], np.int64),
    ),
}


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_label_encoder_matches_onnxruntime(case: str, backend: str) -> None:
    in_type, out_type, opset, attrs, x = CASES[case]
    model = _model(in_type, out_type, opset, **attrs)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    sess = quanta.InferenceSession(model, backend=backend)
    if backend == "native":  # the twin's encoder, its table kept per node: no fallback
        assert not sess.fallbacks
        sess.run(None, {"x": x[::-1].copy()})  # a first call on other data builds the table
    got = sess.run(None, {"x": x})[0]
    assert got.shape == want.shape
    if want.dtype.kind == "O":
        assert got.dtype.kind == "O" and got.tolist() == want.tolist()
    else:
        assert got.dtype == want.dtype and np.array_equal(got, want)


def test_label_encoder_without_a_table_names_itself() -> None:
    model = _model(TensorProto.STRING, TensorProto.INT64, 2, default_int64=0)
    with pytest.raises(Exception, match="LabelEncoder sets no keys"):
        quanta.InferenceSession(model).run(None, {"x": np.array([["a", "b", "c"]], dtype=object)})


def _string_to_float_model():
    """ids = LabelEncoder(tokens); y = Gather(table, ids) @ w: a token embedding a tf2onnx
    export writes, with a MatMul to quantize."""
    enc = helper.make_node(
        "LabelEncoder", ["x"], ["ids"], domain=ML, classes_strings=["", "a", "b", "c", "d"], default_int64=0
    )
    g = helper.make_graph(
        [
            enc,
            helper.make_node("Gather", ["table", "ids"], ["e"], axis=0),
            helper.make_node("MatMul", ["e", "w"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.STRING, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3, 17])],
        [
            numpy_helper.from_array(
                np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32), "table"
            ),
            numpy_helper.from_array(
                np.random.default_rng(1).standard_normal((7, 17)).astype(np.float32), "w"
            ),
        ],
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)], ir_version=9
    )


def test_string_inputs_take_numpy_unicode_and_bytes_feeds(tmp_path) -> None:
    model = _string_to_float_model()
    sess = quanta.InferenceSession(model)
    as_object = np.array([["a", "b", "zz"], ["d", "", "c"]], dtype=object)
    want = sess.run(None, {"x": as_object})[0]
    for feed in (as_object.astype(str), np.array([[b"a", b"b", b"zz"], [b"d", b"", b"c"]])):
        assert feed.dtype.kind in "US"
        assert np.array_equal(sess.run(None, {"x": feed})[0], want)
    # calibration data as users write it for ONNX Runtime
    rng = np.random.default_rng(2)
    calib = [{"x": rng.choice(["a", "b", "c", "d", ""], size=(4, 3))} for _ in range(4)]
    out = tmp_path / "q.onnx"
    quanta.quantize_static(model, out, calib, verbose=False, progress=False)
    got = quanta.InferenceSession(str(out)).run(None, {"x": as_object.astype(str)})[0]
    assert got.shape == want.shape and np.max(np.abs(got - want)) < 0.1 * np.max(np.abs(want))


def test_a_numeric_feed_for_a_string_input_is_still_refused() -> None:
    sess = quanta.InferenceSession(_string_to_float_model())
    with pytest.raises(Exception, match="dtype float32, expected tensor\\(string\\)"):
        sess.run(None, {"x": np.zeros((1, 3), np.float32)})
