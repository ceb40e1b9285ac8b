"""ai.onnx.ml::LabelEncoder, CategoryMapper and ZipMap (quanta/kernels/reference/ml_ops.py)
against ONNX Runtime, every version's attribute forms, hits, misses and defaults; string
feeds as numpy builds them (fixed-width unicode, bytes), which ONNX Runtime accepts; and
a scikit-learn style classifier (Scaler -> MatMul -> Softmax -> ZipMap) quantized."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from tests.ort_int8 import WEIGHT_BITS  # 7-bit weights where ORT saturates full-range ones

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


@pytest.mark.parametrize("case", sorted(CASES))
def test_label_encoder_bound_step_is_the_encoder_and_fresh(case: str) -> None:
    """The native step of a bound signature calls the encoder of its input dtype
    directly (``fresh``: a new array every call, so no arena-sharing checks), with ORT's
    values on two different feeds; an input of another layout (non-contiguous) too."""
    in_type, out_type, opset, attrs, x = CASES[case]
    model = _model(in_type, out_type, opset, **attrs)
    o = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    sess = quanta.InferenceSession(model)
    feeds = [x[::-1].copy(), x, np.concatenate([x, x[:, ::-1]], axis=1)[:, ::2]]
    for i, feed in enumerate(feeds):
        got, want = sess.run(None, {"x": feed})[0], o.run(None, {"x": np.ascontiguousarray(feed)})[0]
        assert got.shape == want.shape
        if want.dtype.kind == "O":
            assert got.dtype.kind == "O" and got.tolist() == want.tolist()
        else:
            assert got.dtype == want.dtype and np.array_equal(got, want)
        if i == 1:
            (bound,) = sess.executor.bound_runs().values()
            plain = {t[0]: t[1] for t in sess.executor._plain}
            (step,) = bound.steps
            assert step[1] is not plain[step[0]] and step[1].fresh


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


def _tail_model(labels: dict, ml_opset: int = 1, input_shape=("N", 7)):
    """Z = ZipMap(probabilities): a scikit-learn classifier's tail as skl2onnx writes it
    by default."""
    key = onnx.TensorProto.STRING if "classlabels_strings" in labels else onnx.TensorProto.INT64
    zt = helper.make_sequence_type_proto(
        helper.make_map_type_proto(key, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    )
    g = helper.make_graph(
        [helper.make_node("ZipMap", ["x"], ["z"], domain=ML, name="zipmap", **labels)],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_value_info("z", zt)],
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, ml_opset)], ir_version=9
    )


ZIP_LABELS = {
    "int64 labels": {"classlabels_int64s": [3, -1, 40, 0, 7, 11, 2]},
    "string labels": {"classlabels_strings": ["cat", "", "dog", "c7", "é", "x y", "z"]},
}


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize("labels", sorted(ZIP_LABELS))
def test_zipmap_matches_onnxruntime(labels: str, backend: str) -> None:
    model = _tail_model(ZIP_LABELS[labels])
    x = np.random.default_rng(3).standard_normal((5, 7)).astype(np.float32) * 3
    x[1, 2] = np.nan
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = quanta.InferenceSession(model, backend=backend).run(None, {"x": x})[0]
    assert isinstance(got, list) and len(got) == 5
    assert [sorted(r) for r in got] == [sorted(r) for r in want]
    np.testing.assert_array_equal(
        [[r[k] for k in sorted(r)] for r in got], [[r[k] for k in sorted(r)] for r in want]
    )


def test_zipmap_of_one_row_and_a_wrong_width_names_itself() -> None:
    model = _tail_model(ZIP_LABELS["int64 labels"], input_shape=(7,))
    x = np.linspace(-2, 3, 7, dtype=np.float32)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert quanta.InferenceSession(model).run(None, {"x": x})[0] == want  # one row
    wide = _tail_model(ZIP_LABELS["int64 labels"], input_shape=("N", 9))
    with pytest.raises(Exception, match=r"ZipMap expects a \[N, 7\].*got shape \[2, 9\]"):
        quanta.InferenceSession(wide).run(None, {"x": np.zeros((2, 9), np.float32)})


@pytest.mark.parametrize("direction", ["string -> int64", "int64 -> string"])
def test_category_mapper_matches_onnxruntime(direction: str) -> None:
    attrs = {
        "cats_strings": ["low", "mid", "high", "mid", "top"],  # duplicates: the last pair wins
        "cats_int64s": [10, 20, 30, 40, 20],
        "default_int64": -7,
        "default_string": "unknown",
    }
    to_int = direction == "string -> int64"
    node = helper.make_node("CategoryMapper", ["x"], ["y"], domain=ML, **attrs)
    t_in, t_out = (
        (TensorProto.STRING, TensorProto.INT64) if to_int else (TensorProto.INT64, TensorProto.STRING)
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", t_in, [2, 3])],
        [helper.make_tensor_value_info("y", t_out, [2, 3])],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)], ir_version=9
    )
    x = (
        np.array([["mid", "high", "none"], ["", "low", "mid"]], dtype=object)
        if to_int
        else np.array([[20, 40, 5], [10, -1, 30]], np.int64)
    )
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    got = quanta.InferenceSession(model).run(None, {"x": x})[0]
    assert got.tolist() == want.tolist()


def test_a_classifier_ending_in_zipmap_quantizes_and_both_runtimes_run_it(tmp_path) -> None:
    """x -> Scaler (ai.onnx.ml: no shape inference, so the MatMul's input has no shape in
    the file) -> MatMul -> Softmax -> ZipMap: skl2onnx's default classifier. The file
    quanta writes runs in ONNX Runtime and quanta alike, and the MatMul's MACs are
    counted from the calibration shapes and the weight (17 classes, K 7)."""
    rng = np.random.default_rng(5)
    labels = list(range(100, 117))
    zt = helper.make_sequence_type_proto(
        helper.make_map_type_proto(TensorProto.INT64, helper.make_tensor_type_proto(TensorProto.FLOAT, None))
    )
    g = helper.make_graph(
        [
            helper.make_node(
                "Scaler", ["x"], ["xs"], domain=ML, offset=[0.5] * 7, scale=[1.0, 2, 3, 0.5, 1, 1, 4]
            ),
            helper.make_node("MatMul", ["xs", "w"], ["logits"]),
            helper.make_node("Softmax", ["logits"], ["p"], axis=-1),
            helper.make_node("ZipMap", ["p"], ["z"], domain=ML, classlabels_int64s=labels),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 7])],
        [helper.make_value_info("z", zt)],
        [numpy_helper.from_array(rng.standard_normal((7, 17)).astype(np.float32), "w")],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)], ir_version=9
    )
    src, out = tmp_path / "clf.onnx", tmp_path / "clf.q.onnx"
    onnx.save(model, src)
    feeds = [{"x": rng.standard_normal((13, 7)).astype(np.float32)} for _ in range(6)]
    summary = quanta.quantize_static(str(src), str(out), feeds, verbose=False, weight_bits=WEIGHT_BITS)
    assert summary.coverage.total_macs == 13 * 7 * 17
    assert summary.coverage.integer_macs == 13 * 7 * 17
    ours = quanta.InferenceSession(str(out)).run(None, feeds[0])[0]
    theirs = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, feeds[0])[0]
    assert [sorted(r) for r in ours] == [labels] * 13 == [sorted(r) for r in theirs]
    np.testing.assert_allclose(
        [[r[k] for k in labels] for r in ours], [[r[k] for k in labels] for r in theirs], atol=2e-3
    )


def test_strings_between_native_steps_stay_out_of_the_arena() -> None:
    """A Gather of a string column before OneHotEncoder (scikit-learn's ColumnTransformer):
    the native target places intermediate values in one byte arena, which cannot hold
    numpy's object arrays of str."""
    g = helper.make_graph(
        [
            helper.make_node("Gather", ["c", "col"], ["c1"], axis=1),
            helper.make_node("OneHotEncoder", ["c1"], ["hot"], domain=ML, cats_strings=["a", "b", "z"]),
            helper.make_node("ReduceSum", ["hot", "axes"], ["y"], keepdims=0),
        ],
        "g",
        [helper.make_tensor_value_info("c", TensorProto.STRING, [None, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([2], np.int64), "col"),
            numpy_helper.from_array(np.array([1], np.int64), "axes"),
        ],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ML, 1)], ir_version=9
    )
    x = np.array([["q", "w", "b"], ["e", "r", "z"], ["t", "y", "a"], ["u", "i", "none"]], dtype=object)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"c": x}
    )[0]
    sess = quanta.InferenceSession(model, backend="native")
    for _ in range(3):  # the first runs measure, a later one runs the bound plan
        got = sess.run(None, {"c": x})[0]
        np.testing.assert_array_equal(got, want)
