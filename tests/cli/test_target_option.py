"""``quanta inspect --lowered --target`` shows a device target's partitions, and
``quanta run --backend`` takes every registered target."""

from __future__ import annotations

import numpy as np
import onnx

from quanta.cli.main import main
from tests.ir import models


def test_inspect_lowered_target_shows_partitions_transfers_and_reasons(tmp_path, capsys):
    path = tmp_path / "q.onnx"
    onnx.save(models.qoperator(), path)
    assert main(["inspect", "--lowered", "--target", "npu-sim", str(path)]) == 0
    out = capsys.readouterr().out.split("target npu-sim:\n", 1)[1]
    assert "partitions: " in out and "transfers per run: " in out
    assert "device memory: " in out
    assert "operator ai.onnx::QuantizeLinear is not among npu-sim's operators" in out
    assert main(["inspect", "--lowered", "--target", "native", str(path)]) == 0
    assert "every node on the host" in capsys.readouterr().out


def test_run_on_npu_sim(tmp_path, capsys):
    path = tmp_path / "q.onnx"
    onnx.save(models.qdq_conv(), path)
    out = tmp_path / "y.npz"
    assert main(["run", str(path), "--backend", "npu-sim", "-o", str(out)]) == 0
    assert "backend npu-sim" in capsys.readouterr().out
    with np.load(out, allow_pickle=False) as d:
        assert d["y"].shape == (1, 7, 9, 5)


def test_inspect_lowered_of_an_npu_sim_file_uses_the_npu_sim_pipeline(tmp_path, capsys):
    import quanta
    from quanta.ir.onnx_io import load
    from quanta.runtime.coverage import file_target, lowered_coverage

    src, dst = tmp_path / "cnn.onnx", tmp_path / "cnn.npu.onnx"
    onnx.save(models.float_cnn(), src)
    rng = np.random.default_rng(0)
    calib = [{"x": rng.standard_normal((2, 3, 8, 6)).astype(np.float32)} for _ in range(2)]
    quanta.quantize_static(str(src), str(dst), calib, target="npu-sim", verbose=False, progress=False)
    m = load(str(dst))
    assert file_target(m) == "npu-sim"
    # the recipe's target decides; the host pipeline would leave QLinearConv
    device = lowered_coverage(m)
    host = lowered_coverage(m, target="reference")
    assert {r.integer_op for r in device.nodes} >= {"IntConv", "IntMatMul"}
    assert "QLinearConv" in {r.integer_op for r in host.nodes}
    assert main(["inspect", "--lowered", str(dst)]) == 0
    out = capsys.readouterr().out
    assert "quanta.int::IntConv" in out and "QLinearConv(" not in out
    # a file without a recipe lowers for the host
    plain = tmp_path / "q.onnx"
    onnx.save(models.qdq_conv(), plain)
    assert file_target(load(str(plain))) == "reference"
