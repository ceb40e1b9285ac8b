"""``quanta bench``: the structure of its report (never its timings: speed is measured
in benchmarks/, not asserted in unit tests)."""

from __future__ import annotations

import re

import onnx
import pytest

from quanta.cli.bench import bench_model, format_result
from quanta.cli.main import main
from tests.ir import models

pytest.importorskip("onnxruntime")


def ort_int8_is_exact() -> bool:
    """ONNX Runtime's int8 convolution is exact on CPUs with AVX-512 or AVX-VNNI; on an
    AVX2-only core its ``vpmaddubsw`` kernel saturates int16 pair sums."""
    from quanta.kernels import _native

    return "avx512vnni" in _native.supported_isas()


@pytest.fixture(params=["float_cnn", "qdq_conv", "qoperator", "encoder_block"])
def model_path(request, tmp_path):
    p = tmp_path / f"{request.param}.onnx"
    onnx.save(getattr(models, request.param)(), p)
    return p


def test_bench_vs_ort_reports_both_engines_the_ratio_and_the_slowest_steps(model_path, capsys, monkeypatch):
    from quanta.quantize import ort_saturation

    # the line layout of a CPU where ORT's int8 is exact (the saturation note:
    # tests/quantize/test_ort_saturation.py)
    monkeypatch.setattr(ort_saturation, "onnxruntime_int8_saturates", lambda: False)
    assert main(["bench", str(model_path), "--vs-ort", "--threads", "1", "--warmup", "1", "--runs", "3"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == (
        f"quanta bench {model_path}: batch 1, 1 thread, 1 warm-up + 3 timed runs (interleaved with onnxruntime)"
    )
    assert out[1].startswith("inputs: ")
    assert out[2].split() == ["median", "ms", "p90", "ms"]
    number = r"\d+\.\d{3}"
    assert re.fullmatch(rf"  quanta \(native\) +{number} +{number}", out[3])
    assert re.fullmatch(rf"  onnxruntime [\d.]+ +{number} +{number}", out[4])
    assert re.fullmatch(r"  ratio quanta/onnxruntime +\d+\.\d\dx +\d+\.\d\dx", out[5])
    assert out[6].startswith("outputs: max |quanta - onnxruntime| ")
    assert re.fullmatch(r"fallbacks: \d+ of \d+ steps ran on reference kernels", out[7])
    listed = 0
    while out[8 + listed].startswith("  reference:"):
        assert re.fullmatch(r"  reference:\w+ \S+: .+", out[8 + listed])
        listed += 1
    r = bench_model(model_path, threads=1, warmup=0, runs=1)
    assert listed == len(r.reference_steps)
    out = out[listed:]
    assert re.match(r"slowest \d+ of \d+ steps over 3 profiled runs: run ", out[8])
    assert out[9].split() == ["step", "node", "op", "kernel", "mean", "ms", "share"]
    n_steps = int(re.search(r"of (\d+) steps", out[8]).group(1))
    assert len(out) == 11 + min(10, n_steps)
    assert out[-1] == "tuner: off (SessionOptions.enable_tuning, QUANTA_TUNE=0)"  # tests/conftest.py


def with_static_fallback(m: onnx.ModelProto) -> onnx.ModelProto:
    """``m`` plus ReduceMean(Shape(x)) as an output: shape math on the twin (int64
    ReduceMean has no native kernel) whose value the input shapes fix; and
    ReduceMean(NonZero(x > t)), the same twin on data the input shapes do not fix, so it
    runs in every run."""
    m.graph.node.append(
        onnx.helper.make_node("ReduceMean", ["sh"], ["mean_dim"], name="mean_dim", keepdims=0)
    )
    m.graph.node.append(onnx.helper.make_node("ReduceMean", ["nz"], ["mean_nz"], name="mean_nz", keepdims=0))
    for name in ("mean_dim", "mean_nz"):
        m.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.INT64, None))
    return m


def test_bench_counts_the_fallbacks_that_run_once_per_input_shape(tmp_path, capsys):
    from tests.runtime.test_static_steps import reshape_by_shape_model

    p = tmp_path / "heads.onnx"
    onnx.save(with_static_fallback(reshape_by_shape_model()), p)
    dims = ["--dim", "B=2", "--dim", "S=5"]
    assert main(["bench", str(p), *dims, "--threads", "1", "--warmup", "1", "--runs", "2"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("fallbacks"))
    m = re.fullmatch(
        r"fallbacks: (\d+) of \d+ steps ran on reference kernels \((\d+) of them once per input shape: "
        r"signature-static\)",
        line,
    )
    assert m and 0 < int(m.group(2)) < int(m.group(1)), line  # the NonZero branch's keeps running


def test_bench_lists_the_reference_steps_of_every_timed_run_with_their_reasons(tmp_path):
    # a signature-static fallback runs once per input shape and is not listed; the
    # others (the ReduceMean after the NonZero) run in every timed run and are, with the plan's reason
    from tests.runtime.test_static_steps import reshape_by_shape_model

    p = tmp_path / "heads.onnx"
    onnx.save(with_static_fallback(reshape_by_shape_model()), p)
    r = bench_model(p, threads=1, warmup=0, runs=1, dims={"B": 2, "S": 5})
    listed = {name for _, name, _ in r.reference_steps}
    fallbacks = {name: reason for name, _, reason in r.fallbacks}
    assert listed and len(listed) == len(fallbacks) - r.static_fallbacks
    assert all(reason == fallbacks[name] for _, name, reason in r.reference_steps)
    assert "mean_nz" in listed and "mean_dim" not in listed
    text = format_result(r)
    for op, name, reason in r.reference_steps:
        assert f"  reference:{op} {name}: {reason}" in text.splitlines()


def test_bench_batch_sets_the_symbolic_first_dimension(tmp_path, capsys):
    p = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), p)
    assert (
        main(["bench", str(p), "--batch", "3", "--runs", "2", "--warmup", "0", "--backend", "reference"]) == 0
    )
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "inputs: x[3, 3, 8, 6] float32"
    assert not any(line.startswith("  onnxruntime") or line.startswith("fallbacks") for line in out)


def test_bench_result_holds_every_timing_and_output_agreement(tmp_path):
    p = tmp_path / "q.onnx"
    onnx.save(models.qdq_conv(), p)
    r = bench_model(p, threads=2, warmup=1, runs=4, vs_ort=True)
    assert r.threads == 2 and len(r.quanta.times_ms) == 4 and len(r.ort.times_ms) == 4
    assert r.quanta.p90 >= r.quanta.median > 0
    if ort_int8_is_exact():
        # quanta and ORT agree within one output quantization step (0.07): requantization
        # rounding may differ by 1 LSB where ORT's fused kernels round differently
        assert r.agreement["y"] <= 0.07 * 1.0001
    else:
        # ORT's AVX2 u8s8 kernel (vpmaddubsw) saturates on this model's full-range weights
        # (docs/kernels.md "AVX2"): the agreement is reported as measured, not bounded
        assert r.agreement["y"] > 0.07
    # the session lowers Q -> Conv -> Q into one QLinearConv (alone: NCHW, no Transposes)
    assert [s.op_type for s in sorted(r.profile.steps, key=lambda s: s.step)] == [
        "QuantizeLinear",
        "QLinearConv",
        "DequantizeLinear",
    ]


def test_bench_user_errors_are_one_line(tmp_path, capsys):
    assert main(["bench", str(tmp_path / "missing.onnx")]) == 2
    assert capsys.readouterr().err == f"quanta: error: {tmp_path / 'missing.onnx'}: no such file\n"
    p = tmp_path / "q.onnx"
    onnx.save(models.qdq_conv(), p)
    assert main(["bench", str(p), "--runs", "0"]) == 2
    assert capsys.readouterr().err == "quanta: error: --runs: expected >= 1, got 0\n"


def test_bench_dim_names_a_symbolic_dimension_and_integer_inputs_are_ones(tmp_path, capsys):
    # the encoder block's x is [N, S, 384] with symbolic N and S, and an int64 mask
    p = tmp_path / "enc.onnx"
    onnx.save(models.encoder_block(), p)
    import quanta
    from quanta.cli.main import random_feeds

    sess = quanta.InferenceSession(str(p))
    names = [str(d) for d in sess.get_inputs()[0].shape]
    feeds = random_feeds(sess, batch=2, dims={names[1]: 37})
    assert feeds["x"].shape[:2] == (2, 37)
    assert feeds["mask"].dtype.kind == "i" and (feeds["mask"] == 1).all()  # ones: a valid mask / token id
    assert (
        main(["bench", str(p), "--threads", "1", "--warmup", "0", "--runs", "1", "--dim", f"{names[1]}=37"])
        == 0
    )
    assert "x[1, 37, " in capsys.readouterr().out


def test_bench_dim_and_feeds_errors_are_one_line(tmp_path, capsys):
    p = tmp_path / "q.onnx"
    onnx.save(models.qdq_conv(), p)
    assert main(["bench", str(p), "--dim", "sequence"]) == 2
    assert capsys.readouterr().err == (
        "quanta: error: --dim sequence: expected NAME=SIZE with SIZE >= 1, e.g. --dim sequence=128\n"
    )
    assert main(["bench", str(p), "--feeds", str(tmp_path / "none.npz")]) == 2
    assert capsys.readouterr().err == f"quanta: error: {tmp_path / 'none.npz'}: no such file\n"


def test_bench_names_the_symbolic_dimensions_it_set_to_1_when_the_model_cannot_run_there(tmp_path, capsys):
    """An image model with symbolic height and width: generated inputs of 1 x 1 do not
    fit its 3 x 3 pooling window; the one-line error names the dimensions and the option
    (and with --dim the same model runs)."""
    from onnx import TensorProto, helper

    node = helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3])
    g = helper.make_graph(
        [node],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, "height", "width"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    p = tmp_path / "pool.onnx"
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), p)
    assert main(["bench", str(p), "--warmup", "0", "--runs", "1"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert "height, width to 1" in err[0] and "--dim height=SIZE --dim width=SIZE" in err[0]
    assert (
        main(["bench", str(p), "--warmup", "0", "--runs", "1", "--dim", "height=9", "--dim", "width=11"]) == 0
    )
