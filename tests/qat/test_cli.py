"""``quanta qat``: FP32 ONNX + unlabelled .npz data -> a trained QDQ file."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

import quanta  # noqa: E402
from quanta.cli.main import main  # noqa: E402
from quanta.ir.onnx_io import from_proto  # noqa: E402
from quanta.qat import to_onnx  # noqa: E402
from quanta.runtime.coverage import lowered_coverage  # noqa: E402

from .models import SmallCnn  # noqa: E402


def test_qat_command_writes_an_integer_model(tmp_path, capsys):
    torch.manual_seed(3)
    src = tmp_path / "fp.onnx"
    onnx.save(to_onnx(SmallCnn(), torch.randn(1, 3, 11, 9)), src)
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(4)
    for i in range(6):
        np.savez(data / f"{i:02d}.npz", input0=rng.standard_normal((1, 3, 11, 9)).astype(np.float32))
    out = tmp_path / "qat.onnx"
    rc = main(
        ["qat", str(src), "--data", str(data), "-o", str(out), "--steps", "2", "--batch-size", "2", "--quiet"]
    )
    assert rc == 0
    assert "distilled 2 step(s)" in capsys.readouterr().out
    proto = onnx.load(out)
    assert lowered_coverage(from_proto(proto), {}).integer_share == 1.0
    y = quanta.InferenceSession(str(out)).run(
        None, {"input0": rng.standard_normal((1, 3, 11, 9)).astype(np.float32)}
    )
    assert y[0].shape == (1, 5)


def test_qat_command_refuses_to_overwrite_its_input(tmp_path):
    src = tmp_path / "fp.onnx"
    onnx.save(to_onnx(SmallCnn(), torch.randn(1, 3, 11, 9)), src)
    with pytest.raises(SystemExit, match="must not be the input"):
        main(["qat", str(src), "--data", str(tmp_path), "-o", str(src)])
