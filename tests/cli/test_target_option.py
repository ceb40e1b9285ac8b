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
