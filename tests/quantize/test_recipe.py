"""Recipes: defaults, validation with messages that name the option, file round trips."""

from __future__ import annotations

import json

import pytest

from quanta.ir.types import I8, U8
from quanta.quantize.recipe import CalibrationMethod, Recipe, RecipeError, TensorOverride


def test_recipe_defaults_are_the_documented_ones():
    r = Recipe()
    assert r.method is CalibrationMethod.WEIGHTED_MSE and r.per_channel
    assert r.activation_storage == U8 and r.weight_storage == I8
    assert not r.symmetric_activations and r.symmetric_weights and not r.quantize_outputs


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            dict(method="kl"),
            "method: unknown calibration method 'kl'; expected one of minmax, moving_average, entropy, percentile, mse, weighted_mse",
        ),
        (
            dict(activation_type="int32"),
            "activation_type: unknown type 'int32'; expected one of int8, uint8, int16, uint16, int4, uint4",
        ),
        (
            dict(activation_type="int4"),
            "activation_type: 4-bit activations are not supported; use int8 or uint8",
        ),
        (
            dict(exclude=["conv[1"]),
            "exclude: 'conv[1' is not a valid regular expression (unterminated character set at position 4)",
        ),
        (dict(percentile=0.0), "percentile: expected a value in (0, 100], got 0.0"),
        (
            dict(overrides={"x": {"range": [2, 1]}}),
            "overrides['x']: range must be [min, max] with min <= max, got [2, 1]",
        ),
        (
            dict(overrides={"x": {"scale": 1}}),
            "overrides['x']: unknown key(s) ['scale']; expected range, dtype, symmetric",
        ),
        (dict(weight_bits=6), "weight_bits: expected 7 or 8, got 6"),
        (
            dict(weight_bits=7, weight_type="int4"),
            "weight_bits: 7 applies to int8/uint8 weights, got weight_type 'int4'",
        ),
    ],
)
def test_recipe_rejects_bad_options(kwargs, message):
    with pytest.raises(RecipeError) as e:
        Recipe(**kwargs)
    assert str(e.value) == message


def test_recipe_json_and_yaml_files_round_trip(tmp_path):
    r = Recipe(
        method="percentile",
        per_channel=False,
        exclude=("head.*", "fc"),
        overrides={"logits": TensorOverride(range=(-8.0, 8.0), dtype="int8", symmetric=True)},
        calibration_samples=64,
    )
    (tmp_path / "r.json").write_text(r.to_json())
    assert Recipe.from_file(tmp_path / "r.json") == r
    yaml = pytest.importorskip("yaml")
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(r.to_dict()))
    assert Recipe.from_file(tmp_path / "r.yaml") == r


def test_recipe_file_with_unknown_option_names_the_file(tmp_path):
    p = tmp_path / "r.json"
    p.write_text(json.dumps({"methd": "entropy"}))
    with pytest.raises(RecipeError) as e:
        Recipe.from_file(p)
    assert str(e.value).startswith(f"{p}: unknown option(s) ['methd']; known options: ")


def test_recipe_exclude_matches_names_and_regexes():
    from quanta.ir.graph import Node

    r = Recipe(exclude=("fc", "block2\\..*"))
    assert r.excludes(Node("Gemm", [], [], name="fc"))
    assert r.excludes(Node("Conv", [], [], name="block2.dw"))
    assert not r.excludes(Node("Conv", [], [], name="block1.dw"))
    assert not r.excludes(Node("Conv", [], [], name="fc2"))  # full match, not prefix


def test_quantized_model_records_the_recipe_it_was_made_with(tmp_path):
    # a run is reproducible from its output: the recipe travels in the file's metadata
    import numpy as np
    import onnx

    import quanta
    from quanta.quantize.static import recipe_of
    from tests.ir import models

    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    feeds = [{"x": np.random.default_rng(0).standard_normal((2, 3, 8, 6)).astype(np.float32)}]
    quanta.quantize_static(
        src, tmp_path / "q.onnx", feeds, method="percentile", exclude=["fc"], verbose=False
    )
    r = recipe_of(tmp_path / "q.onnx")
    # recurrent "auto" (eq. (30)) is recorded as what the file did: no LSTM kept float
    assert r == Recipe(method="percentile", exclude=("fc",), recurrent="dynamic")
    with pytest.raises(ValueError, match="not quantized by quanta"):
        recipe_of(src)


def test_seven_bit_weights_run_the_exact_vpmaddubsw_family_on_avx2(tmp_path):
    """weight_bits=7: every quantized weight in [-64, 64] (scale absmax/64 per channel),
    activations still uint8 [0, 255]; on avx2 the compiled Conv/MatMul weights pack for
    the vpmaddubsw family, and the session's outputs are the reference backend's bytes."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    import quanta
    from quanta.kernels import _native
    from tests.ir import models

    src = tmp_path / "enc.onnx"
    onnx.save(models.encoder_block(), src)
    feeds = models.encoder_feeds()
    dst = tmp_path / "q7.onnx"
    quanta.quantize_static(src, dst, feeds, weight_bits=7, verbose=False, progress=False)
    q = onnx.load(dst)
    inits = {t.name: numpy_helper.to_array(t) for t in q.graph.initializer}
    weights = [v for v in inits.values() if v.dtype == np.int8 and v.ndim >= 2]
    assert weights and all(int(v.min()) >= -64 and int(v.max()) <= 64 for v in weights)
    assert max(int(np.abs(v).max()) for v in weights) == 64  # the grid is used to its end
    act_zps = [v for v in inits.values() if v.dtype == np.uint8 and v.ndim == 0]
    assert act_zps  # activations stay uint8

    if "avx2" not in _native.supported_isas():
        pytest.skip("this CPU does not run avx2")
    _native.set_isa("avx2")
    try:
        sess = quanta.InferenceSession(str(dst))
    finally:
        _native.clear_isa()
    ref = quanta.InferenceSession(str(dst), backend="reference")
    packed = [
        p for s in sess.plan.steps for p in s.kernel.params.values() if isinstance(p, _native.PackedWeights)
    ]
    assert packed and {p.kernel for p in packed} == {"qgemm_u8s8p_s32_5x16c4__avx2"}
    for feed in feeds[:2]:
        got, want = sess.run(None, feed), ref.run(None, feed)
        for a, b in zip(got, want, strict=True):
            assert np.asarray(a).tobytes() == np.asarray(b).tobytes()
