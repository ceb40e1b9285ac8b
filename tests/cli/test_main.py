"""The quanta command: inspect, run, demo; user errors are one line and exit status 2."""

from __future__ import annotations

import json

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
    assert (
        main(["run", str(qdq_path), "--inputs", str(tmp_path / "x.npz"), "-o", str(tmp_path / "y.npz")]) == 0
    )
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
    assert "ops by type:" in out and "top-1 agreement with FP32" in out
    rows = {line.split()[0]: line.split() for line in out.splitlines() if line.startswith(("FP32", "int8"))}
    acc32, acc8 = float(rows["FP32"][1].rstrip("%")), float(rows["int8"][2].rstrip("%"))
    assert acc32 >= 95.0 and acc8 >= acc32 - 1.0  # int8 within one point of FP32


def test_quantize_command_static_and_dynamic(tmp_path, capsys):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    calib = tmp_path / "calib"
    calib.mkdir()
    rng = np.random.default_rng(0)
    for k in range(3):
        np.savez(calib / f"{k}.npz", x=rng.standard_normal((2, 3, 8, 6)).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--method", "percentile"]) == 0
    text = capsys.readouterr().out
    assert "percentile calibration on 3 feed(s) of the data" in text and f"wrote {out}" in text
    # GPTQ is the default; --weight-rounding nearest rounds each weight on its own
    near = tmp_path / "near.onnx"
    assert (
        main(["quantize", str(src), "-o", str(near), "--calib", str(calib), "--weight-rounding", "nearest"])
        == 0
    )
    recipes = [json.loads(onnx.load(p).metadata_props[0].value)["weight_rounding"] for p in (out, near)]
    assert recipes == ["gptq", "nearest"]
    capsys.readouterr()
    recipe = tmp_path / "r.json"
    recipe.write_text('{"per_channel": false, "exclude": ["fc"]}')
    assert (
        main(["quantize", str(src), "-o", str(tmp_path / "d.onnx"), "--dynamic", "--recipe", str(recipe)])
        == 0
    )
    assert "fc (Gemm): excluded by the recipe" in capsys.readouterr().out


def test_quantize_command_user_errors(tmp_path, capsys):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    assert main(["quantize", str(src), "-o", str(tmp_path / "q.onnx")]) == 2
    assert "static quantization needs --calib DATA" in capsys.readouterr().err
    assert (
        main(["quantize", str(src), "-o", str(tmp_path / "q.onnx"), "--calib", str(tmp_path / "nope")]) == 2
    )
    assert capsys.readouterr().err == f"quanta: error: {tmp_path / 'nope'}: no such file or folder\n"
    assert main(["quantize", str(src), "-o", str(src), "--dynamic"]) == 2
    assert "refusing to overwrite the input model" in capsys.readouterr().err


def test_inspect_lowered_prints_graph_and_fusion_coverage(qdq_path, tmp_path, capsys):
    assert main(["inspect", "--lowered", str(qdq_path)]) == 0
    out = capsys.readouterr().out
    # one convolution alone is no channels-last region: it runs NCHW, no Transposes
    assert "= QLinearConv(%xq, %xs, %xz, %wq, %ws, " in out
    assert (
        "fusion coverage: 1 of 1 compute nodes run as integer kernels; 100.0 % of 8,505 multiply-accumulates"
        in out
    )
    assert "channels-last:" not in out
    chained = tmp_path / "chained.onnx"
    onnx.save(models.qdq_conv(chained=True), chained)
    assert main(["inspect", "--lowered", str(chained)]) == 0
    out = capsys.readouterr().out
    assert "= com.microsoft::QLinearConv(%xq_nhwc, %xs, %xz, %wq, %ws, " in out
    assert "channels_last=1" in out
    assert "channels-last: 2 operators exchange NHWC tensors; 2 Transposes at the regions' edges" in out


def test_inspect_why_not_and_dump_after(tmp_path, capsys):
    from tests.passes.lower.test_qdq_to_qlinear import qdq_conv_proto

    p = tmp_path / "m.onnx"
    onnx.save(qdq_conv_proto(w_const=False), p)
    assert main(["inspect", "--why-not", "LowerConv", "--dump-after", "lower_qdq_to_qlinear", str(p)]) == 0
    out = capsys.readouterr().out
    assert "LowerConv at 'qc' (QuantizeLinear) -> %cq: weight 'w_in' (a graph input) is not a constant" in out
    assert "after step" in out and "lower_qdq_to_qlinear" in out
    assert main(["inspect", "--dump-after", "no_such_pass", str(p)]) == 2
    assert "--dump-after: unknown pass 'no_such_pass'" in capsys.readouterr().err


def test_quantize_output_errors_are_one_line_and_leave_nothing(tmp_path, capsys):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    assert main(["quantize", str(src), "-o", str(tmp_path / "no" / "q.onnx"), "--dynamic"]) == 2
    assert (
        capsys.readouterr().err
        == f"quanta: error: {tmp_path / 'no' / 'q.onnx'}: folder {tmp_path / 'no'} does not exist\n"
    )
    (tmp_path / "d.onnx").mkdir()
    assert main(["quantize", str(src), "-o", str(tmp_path / "d.onnx"), "--dynamic"]) == 2
    err = capsys.readouterr().err
    assert (
        err
        == f"quanta: error: {tmp_path / 'd.onnx'}: is a folder; expected the path of the .onnx file to write\n"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cnn.onnx", "d.onnx"]  # no temporary left behind


def _attention_scores_model():
    """x [1, seq, 17] -> Q/DQ -> MatMul by a constant [17, 13] -> y, and the scores
    y·yᵀ [1, seq, seq]: MACs grow with seq (13·17·seq + 13·seq²)."""
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(2)
    inits = [
        numpy_helper.from_array(np.float32(0.05), "s"),
        numpy_helper.from_array(np.uint8(128), "z"),
        numpy_helper.from_array(rng.integers(-127, 128, (17, 13)).astype(np.int8), "wq"),
        numpy_helper.from_array(np.float32(0.01), "sw"),
        numpy_helper.from_array(np.int8(0), "zw"),
        numpy_helper.from_array(np.array([0, 2, 1], np.int64), "perm"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
        helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["w"]),
        helper.make_node("MatMul", ["xd", "w"], ["y"], name="proj"),
        helper.make_node("Transpose", ["y"], ["yt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["y", "yt"], ["scores"], name="scores"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 17])],
        [helper.make_tensor_value_info("scores", TensorProto.FLOAT, [1, "seq", "seq"])],
        inits[:-1],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_inspect_dim_counts_macs_at_that_size(tmp_path, capsys):
    p = tmp_path / "attn.onnx"
    onnx.save(_attention_scores_model(), p)
    assert main(["inspect", str(p)]) == 0
    out = capsys.readouterr().out
    assert f"integer MACs: {100 * 221 / (221 + 13):.1f} % of {221 + 13:,}" in out  # seq counted as 1
    assert "symbolic or unknown dimensions, counted as 1" in out
    assert main(["inspect", str(p), "--dim", "seq=19"]) == 0
    out = capsys.readouterr().out
    integer, total = 221 * 19, 221 * 19 + 13 * 19 * 19
    assert f"integer MACs: {100 * integer / total:.1f} % of {total:,} ({integer:,} in integer)" in out
    assert "counted as 1" not in out


def _image_model(h: int, w: int) -> onnx.ModelProto:
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    node = helper.make_node("Conv", ["img", "w"], ["y"], pads=[1, 1, 1, 1])
    graph = helper.make_graph(
        [node],
        "image_model",
        [helper.make_tensor_value_info("img", TensorProto.FLOAT, [1, 3, h, w])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, h, w])],
        [numpy_helper.from_array(rng.normal(0, 0.3, (7, 3, 3, 3)).astype(np.float32), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _model_and_images(tmp_path, size: tuple[int, int], n: int, image: tuple[int, int]):
    """A one-Conv model of input [1, 3, *size] and a folder of ``n`` random RGB images."""
    Image = pytest.importorskip("PIL.Image")
    src = tmp_path / "m.onnx"
    onnx.save(_image_model(*size), src)
    folder = tmp_path / "imgs"
    folder.mkdir()
    rng = np.random.default_rng(n)
    for k in range(n):
        Image.fromarray(rng.integers(0, 256, (*image, 3), dtype=np.uint8)).save(folder / f"{k}.png")
    return src, folder


def test_quantize_image_folder_names_the_input_and_takes_height_x_width(tmp_path, capsys):
    """A folder of images without --image-size: one line naming the model's input and
    its shape, with options that fit it; HEIGHTxWIDTH crops a non-square input."""
    src, folder = _model_and_images(tmp_path, (7, 11), 3, (17, 23))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(folder)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "the model's input 'img' is [1, 3, 7, 11]" in err and "--image-size 7x11 --image-resize 11" in err
    assert not out.exists()
    argv = ["quantize", str(src), "-o", str(out), "--calib", str(folder), "--image-size", "7x11"]
    assert main([*argv, "--image-resize", "11"]) == 0
    assert "on 3 feed(s) of the data" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        main(["quantize", str(src), "-o", str(out), "--calib", str(folder), "--image-size", "7x"])
    assert exit_.value.code == 2
    assert "expected SIZE or HEIGHTxWIDTH" in capsys.readouterr().err


@pytest.mark.parametrize("text, size", [("224", (224, 224)), ("480x800", (480, 800)), ("3X17", (3, 17))])
def test_image_size_option(text, size):
    from quanta.cli.images import image_size

    assert image_size(text) == size


def test_debug_reads_a_folder_of_images(tmp_path, capsys):
    src, folder = _model_and_images(tmp_path, (9, 5), 4, (12, 13))
    assert main(["debug", str(src), "--data", str(folder)]) == 2
    assert "--image-size 9x5" in capsys.readouterr().err
    argv = [
        "debug",
        str(src),
        "--data",
        str(folder),
        "--image-size",
        "9x5",
        "--image-mean",
        "0.5",
        "--image-std",
        "0.25",
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("4 feed(s); outputs: SQNR")


def test_python_dash_m_quanta_is_the_quanta_command(qdq_path):
    """``python -m quanta`` runs the same command as the console script (a venv whose
    scripts folder is not on PATH); its user errors exit with status 2 as well."""
    import subprocess
    import sys

    ok = subprocess.run(
        [sys.executable, "-m", "quanta", "inspect", str(qdq_path)], capture_output=True, text=True
    )
    assert ok.returncode == 0, ok.stderr
    assert "quantized tensors: 3 (1 weights, 2 activations)" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "quanta", "quantize", str(qdq_path), "-o", str(qdq_path.with_name("o.onnx"))],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "quanta" in bad.stderr
