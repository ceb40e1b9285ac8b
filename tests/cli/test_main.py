"""The quanta command: inspect, run, demo; user errors are one line and exit status 2."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from quanta.cli.main import main
from tests.ir import models


@pytest.fixture
def qdq_path(tmp_path):
    p = tmp_path / "qdq.onnx"
    onnx.save(models.qdq_conv(), p)
    return p


def test_inspect_lists_ops_quantized_tensors_and_sizes(qdq_path, capsys):
    assert main(["inspect", str(qdq_path)]) == 0
    out = capsys.readouterr().out
    assert "  DequantizeLinear  3\n  QuantizeLinear    2\n  Conv              1\n" in out
    assert "quantized tensors: 3 (1 weights, 2 activations)" in out
    assert "weight     wq: i8 per-axis(axis=0, 7 channels) symmetric, scale 0.004..0.013, zp 0" in out
    assert "activation xq: u8 per-tensor asymmetric, scale 0.02, zp 131" in out
    assert "parameters: 207 (234 B in initializers), nodes: 6" in out


def test_inspect_ir_prints_the_graph(qdq_path, capsys):
    assert main(["inspect", "--ir", str(qdq_path)]) == 0
    out = capsys.readouterr().out
    assert "%xq: tensor<1x3x9x5, Q(u8:f32, 0.02, 131)> = QuantizeLinear(%x, %xs, %xz)  # q_x" in out


def test_run_with_random_inputs_and_npz_output(qdq_path, tmp_path, capsys):
    out = tmp_path / "y.npz"
    assert main(["run", str(qdq_path), "--backend", "reference", "-o", str(out)]) == 0
    text = capsys.readouterr().out
    assert "random inputs x[1, 3, 9, 5] float32" in text
    with np.load(out, allow_pickle=False) as d:
        assert d["y"].shape == (1, 7, 9, 5)


def test_run_with_inputs_file(qdq_path, tmp_path):
    x = np.random.default_rng(0).standard_normal((1, 3, 9, 5)).astype(np.float32)
    np.savez(tmp_path / "x.npz", x=x)
    assert main(["run", str(qdq_path), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]) == 0
    import quanta

    want = quanta.InferenceSession(str(qdq_path), backend="reference").run(None, {"x": x})[0]
    with np.load(tmp_path / "y.npz") as d:
        np.testing.assert_array_equal(d["y"], want)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["inspect", "/no/such/model.onnx"], "quanta: error: /no/such/model.onnx: no such file\n"),
        (["run", "{qdq}", "--inputs", "/no/x.npz"], "quanta: error: /no/x.npz: no such file\n"),
    ],
)
def test_cli_user_errors_are_one_line(argv, message, qdq_path, capsys):
    argv = [a.replace("{qdq}", str(qdq_path)) for a in argv]
    assert main(argv) == 2
    assert capsys.readouterr().err == message


def test_run_wrong_input_shape_is_one_line(qdq_path, tmp_path, capsys):
    np.savez(tmp_path / "x.npz", x=np.zeros((1, 3, 9, 4), np.float32))
    assert main(["run", str(qdq_path), "--inputs", str(tmp_path / "x.npz")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("quanta: error: input 'x': dimension 3 is 4, expected 5") and err.count("\n") == 1


def test_run_refuses_pickled_npz(qdq_path, tmp_path, capsys):
    np.savez(tmp_path / "x.npz", x=np.array([{"a": 1}], dtype=object))
    assert main(["run", str(qdq_path), "--inputs", str(tmp_path / "x.npz")]) == 2
    assert "cannot read as .npz without pickle" in capsys.readouterr().err


def test_demo_runs_end_to_end(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "FP32 test accuracy:" in out and "ops by type:" in out
    acc = float(out.split("FP32 test accuracy:")[1].split("%")[0])
    assert acc >= 95.0
