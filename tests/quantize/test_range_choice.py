"""Eq. (24): the tensors outside eq. (22) get MinMax or MSE ranges, whichever set brings
the quantized model's outputs closer to FP32 on the first calibration feeds."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.calibrate.minmax import MinMaxObserver
from quanta.ir.onnx_io import load
from quanta.ir.types import F32, CalibratedType
from quanta.quantize.range_choice import (
    CAP_DB,
    SplitObserver,
    choose,
    half_ranges,
    mean_sqnr_db,
    reiterable,
    split_observers,
    unsplit,
)
from quanta.quantize.recipe import Recipe, RecipeError

ort = pytest.importorskip("onnxruntime")

C, H, W = 7, 9, 13


def residual(square: bool) -> onnx.ModelProto:
    """x -> 1x1 Conv -> a; s = a + x. ``square`` False: s is the output (an affine map of
    x and a, the tensors outside eq. (22): their MSE ranges' finer step wins). True:
    Conv(s * s) is: the clipped tails of s are what the square is made of, MinMax wins."""
    rng = np.random.default_rng(5)
    w1 = (rng.standard_normal((C, C, 1, 1)) * 0.4).astype(np.float32)
    w2 = (rng.standard_normal((5, C, 1, 1)) * 0.4).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
        helper.make_node("Add", ["a", "x"], ["s"], name="add"),
    ]
    out = "s"
    if square:
        nodes.append(helper.make_node("Mul", ["s", "s"], ["p"], name="square"))
        nodes.append(helper.make_node("Conv", ["p", "w2"], ["y"], name="c2"))
        out = "y"
    g = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, H, W])],
        [helper.make_tensor_value_info(out, TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.laplace(size=(2, C, H, W)).astype(np.float32)} for _ in range(n)]


def recorded(path) -> dict:
    return json.loads(load(path).metadata["quanta.recipe"])


def output_sqnr(src, out, data) -> float:
    ref = [ort.InferenceSession(str(src)).run(None, f) for f in data]
    got = [quanta.InferenceSession(str(out)).run(None, f) for f in data]
    score = mean_sqnr_db(ref, got)
    assert score is not None
    return score


@pytest.mark.parametrize("square", [False, True])
def test_auto_keeps_the_range_set_whose_outputs_are_closer(tmp_path, square):
    src = tmp_path / "m.onnx"
    onnx.save(residual(square), src)
    calib = feeds(6, 1)
    paths = {k: tmp_path / f"{k}.onnx" for k in ("auto", "minmax", "mse")}
    s = quanta.quantize_static(src, paths["auto"], calib, verbose=False)
    for k in ("minmax", "mse"):
        quanta.quantize_static(src, paths[k], calib, other_ranges=k, verbose=False)
    assert s.range_choice is not None
    # the candidates take the ranges of feeds 0, 2, 4 and run on feeds 1, 3, 5
    assert set(s.range_choice.scores) == {"minmax", "mse"} and s.range_choice.feeds == 3
    scores = s.range_choice.scores
    expected = "mse" if scores["mse"] > scores["minmax"] else "minmax"
    if square:  # the square is made of the tails: MinMax by ~0.5 dB
        assert expected == "minmax" and scores["minmax"] > scores["mse"] + 0.2
    other = "minmax" if expected == "mse" else "mse"
    assert s.range_choice.choice == expected
    # the file is the chosen set's, built from all the feeds, and its recipe says which
    assert paths["auto"].read_bytes() == paths[expected].read_bytes()
    assert paths["auto"].read_bytes() != paths[other].read_bytes()
    assert recorded(paths["auto"])["other_ranges"] == expected
    assert recorded(paths[expected]) == recorded(paths["auto"])
    if square:  # on data none of the feeds had, the choice is the better one too
        held = feeds(4, 9)
        assert output_sqnr(src, paths[expected], held) > output_sqnr(src, paths[other], held)
    assert "ranges outside eq. (22): " + expected in s.format()


@pytest.mark.parametrize("n", [2, 3])
def test_one_held_out_feed_is_not_measured_and_keeps_minmax(tmp_path, n):
    # n feeds: ranges from feed 0 (and 2), one odd feed left to measure on, one draw
    src = tmp_path / "m.onnx"
    onnx.save(residual(False), src)
    calib = feeds(n, 4)
    s = quanta.quantize_static(src, tmp_path / "auto.onnx", calib, verbose=False)
    quanta.quantize_static(src, tmp_path / "minmax.onnx", calib, other_ranges="minmax", verbose=False)
    assert s.range_choice is not None
    assert s.range_choice.choice == "minmax" and s.range_choice.scores == {} and s.range_choice.feeds == 1
    assert "too few to measure" in s.format()
    assert (tmp_path / "auto.onnx").read_bytes() == (tmp_path / "minmax.onnx").read_bytes()
    assert recorded(tmp_path / "auto.onnx")["other_ranges"] == "minmax"
    # two held-out feeds are measured
    four = quanta.quantize_static(src, tmp_path / "four.onnx", feeds(4, 4), verbose=False)
    assert four.range_choice is not None and four.range_choice.feeds == 2
    assert set(four.range_choice.scores) == {"minmax", "mse"}


def test_the_recorded_recipe_reproduces_the_file_without_measuring(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(residual(True), src)
    calib = feeds(5, 2)
    quanta.quantize_static(src, tmp_path / "a.onnx", calib, verbose=False)
    rec = Recipe.from_dict(recorded(tmp_path / "a.onnx"))
    s = quanta.quantize_static(src, tmp_path / "b.onnx", calib, rec, verbose=False)
    assert s.range_choice is None  # nothing measured: the recipe fixes the choice
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_a_one_shot_iterator_is_measured_on_its_first_feeds(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(residual(False), src)
    calib = feeds(11, 3)
    assert not reiterable(iter(calib)) and reiterable(calib)
    a = quanta.quantize_static(src, tmp_path / "a.onnx", iter(calib), verbose=False)
    b = quanta.quantize_static(src, tmp_path / "b.onnx", calib, verbose=False)
    assert a.range_choice.feeds == b.range_choice.feeds == 5  # the odd ones of 11
    assert a.range_choice.scores == b.range_choice.scores
    assert (tmp_path / "a.onnx").read_bytes() == (tmp_path / "b.onnx").read_bytes()


def test_no_measurement_when_every_tensor_is_under_eq_22(tmp_path):
    # x -> Conv -> Conv: both activations are read only by constant-weight layers
    rng = np.random.default_rng(0)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1"], ["a"], name="c1"),
            helper.make_node("Conv", ["a", "w2"], ["y"], name="c2"),
        ],
        "convs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, H, W])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(rng.standard_normal((C, C, 1, 1)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.standard_normal((3, C, 1, 1)).astype(np.float32), "w2"),
        ],
    )
    src = tmp_path / "m.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), src)
    s = quanta.quantize_static(src, tmp_path / "q.onnx", feeds(3, 1), verbose=False)
    assert s.range_choice is None
    assert recorded(tmp_path / "q.onnx")["other_ranges"] == "auto"


def test_other_methods_do_not_measure(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(residual(False), src)
    s = quanta.quantize_static(src, tmp_path / "q.onnx", feeds(3, 1), method="minmax", verbose=False)
    assert s.range_choice is None


def test_recipe_refuses_an_unknown_choice():
    with pytest.raises(RecipeError, match="other_ranges: expected one of auto, minmax, mse, got 'best'"):
        Recipe(other_ranges="best")


def test_mean_sqnr_counts_each_float_output_alike_and_skips_integer_ones():
    ref = [[np.array([3.0, 4.0]), np.array([1000.0, 0.0]), np.array([1, 2], np.int64)]]
    got = [[np.array([3.0, 4.5]), np.array([1000.0, 10.0]), np.array([5, 5], np.int64)]]
    # 10 log10(25 / 0.25) = 20 dB and 10 log10(1e6 / 100) = 40 dB: the mean, not the pooled 39.9
    assert mean_sqnr_db(ref, got) == pytest.approx(30.0)
    assert mean_sqnr_db(ref, ref) == CAP_DB
    assert mean_sqnr_db([[np.array([1, 2])]], [[np.array([1, 2])]]) is None
    assert mean_sqnr_db([[np.array([1.0])]], [[np.array([np.nan])]]) == -CAP_DB


def test_a_candidate_that_fails_to_run_keeps_the_first(tmp_path):
    def save(model, path):
        with open(path, "w") as f:
            f.write(model)

    def outputs(path, feeds):
        text = open(path).read()
        if text == "broken":
            raise RuntimeError("kernel missing")
        return [[np.array([1.0, 2.0]) if text == "float" else np.array([1.0, 2.5])]]

    ref = str(tmp_path / "float")
    save("float", ref)
    r = choose(ref, {"minmax": "ok", "mse": "broken"}, [{}, {}], save, outputs)
    assert (
        r.choice == "minmax"
        and r.scores == {}
        and "mse did not run: RuntimeError: kernel missing" in r.reason
    )
    r = choose(ref, {"minmax": "ok", "mse": "float"}, [{}, {}], save, outputs)
    assert r.choice == "mse" and r.scores == {"minmax": pytest.approx(10 * np.log10(5 / 0.25)), "mse": CAP_DB}
    r = choose(ref, {"minmax": "ok", "mse": "ok"}, [{}, {}], save, outputs)
    assert r.choice == "minmax" and r.scores["minmax"] == r.scores["mse"]  # a tie keeps the first
    r = choose(ref, {"minmax": "ok"}, [], save, outputs)
    assert r.choice == "minmax" and "no calibration feed" in r.reason


def test_the_half_observer_sees_the_even_feeds_only():
    make = split_observers(lambda name: MinMaxObserver())
    obs = make("t")
    for k, v in enumerate([1.0, 50.0, 2.0, 60.0, -3.0]):
        obs.observe(np.array([v, k], np.float32))
        obs.next_feed()  # the calibration runner's call after each feed
    assert (obs.range().min, obs.range().max) == (-3.0, 60.0)  # the wrapper is the full observer
    assert (obs.half.range().min, obs.half.range().max) == (-3.0, 4.0)  # feeds 0, 2, 4
    result = {"t": obs, "u": MinMaxObserver()}
    halves = unsplit(result)
    assert isinstance(result["t"], MinMaxObserver) and not isinstance(result["t"], SplitObserver)
    assert set(halves) == {"t"}


def test_a_tensor_the_even_feeds_leave_degenerate_keeps_its_full_range():
    seen, never = MinMaxObserver(), MinMaxObserver()
    seen.observe(np.array([-1.0, 2.0], np.float32))
    full = {"a": CalibratedType(F32, -1.0, 5.0), "b": CalibratedType(F32, 0.0, 7.0)}
    even, even_mm = half_ranges({"a": seen, "b": never}, full, {"b": CalibratedType(F32, -0.5, 7.0)})
    assert (even["a"].min, even["a"].max) == (-1.0, 2.0)
    assert even["b"] == full["b"] and (even_mm["b"].min, even_mm["b"].max) == (-0.5, 7.0)


def test_a_file_far_from_fp32_is_flagged_in_the_summary() -> None:
    from quanta.quantize.range_choice import FAR_SQNR_DB, RangeChoice

    near = RangeChoice("mse", {"minmax": 31.5, "mse": 33.0}, 8).format()
    assert "warning" not in near
    far = RangeChoice("mse", {"minmax": -3.0, "mse": FAR_SQNR_DB - 11.4}, 8).format()
    first, second = far.splitlines()
    assert first.startswith("ranges outside eq. (22): mse (output SQNR on 8 calibration feed(s)")
    assert second.startswith("warning: the quantized outputs are far from FP32") and "(-1.4 dB" in second
    assert "quanta debug" in second and "--target-sqnr" in second
