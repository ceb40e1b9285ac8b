"""The advice for ONNX Runtime on x86 CPUs without VNNI (quanta/quantize/ort_saturation.py):
its int8 kernels saturate full-range int8 weights there; 7-bit weights run exactly."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

import quanta
from quanta.cli.main import main
from quanta.quantize import ort_saturation
from quanta.quantize.ort_saturation import saturation_note
from tests.ir import models
from tests.quantize.test_static import assert_reference_matches_ort_on_quantized_tensors, cnn_feeds

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize(
    ("options", "saturates", "advised"),
    [
        ({}, True, True),
        ({}, False, False),  # VNNI, or not x86
        ({"weight_bits": 7}, True, False),
        ({"reduce_range": True}, True, False),
        ({"weight_type": "uint8"}, True, False),  # u8 x u8 widens: exact
        ({"op_types": ["Relu"]}, True, False),  # no product with a weight
    ],
)
def test_the_note_follows_the_written_weights(tmp_path, monkeypatch, options, saturates, advised):
    """The summary's note is read from the written file (saturating_weights), the same
    mechanism quanta bench uses: it names how many weight tensors ORT would saturate."""
    summary, out = _quantize(tmp_path, "q", monkeypatch, saturates, **options)
    assert bool(summary.notes) == advised
    if advised:
        (note,) = summary.notes
        wide = ort_saturation.saturating_weights(onnx.load(str(out)))
        assert wide and note == saturation_note(len(wide))
        assert "--weight-bits 7" in note and "no VNNI" in note


def _quantize(tmp_path, name, monkeypatch, saturates, **options):
    monkeypatch.setattr(ort_saturation, "onnxruntime_int8_saturates", lambda: saturates)
    src, out = tmp_path / "cnn.onnx", tmp_path / f"{name}.onnx"
    onnx.save(models.float_cnn(), src)
    return quanta.quantize_static(src, out, cnn_feeds(), verbose=False, **options), out


def test_the_summary_advises_and_the_file_does_not_change(tmp_path, monkeypatch):
    """The advice depends on the host, the file does not: byte-identical either way."""
    advised, a = _quantize(tmp_path, "a", monkeypatch, True)
    quiet, b = _quantize(tmp_path, "b", monkeypatch, False)
    assert len(advised.notes) == 1 and not quiet.notes
    assert f"note: {advised.notes[0]}" in advised.format()
    assert advised.to_dict()["notes"] == advised.notes
    assert a.read_bytes() == b.read_bytes()
    seven, _ = _quantize(tmp_path, "c", monkeypatch, True, weight_bits=7)
    assert not seven.notes


def test_dynamic_summary_advises_too(tmp_path, monkeypatch):
    monkeypatch.setattr(ort_saturation, "onnxruntime_int8_saturates", lambda: True)
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    summary = quanta.quantize_dynamic(src, tmp_path / "d.onnx", verbose=False)
    assert len(summary.notes) == 1


def test_seven_bit_weights_run_in_onnxruntime_fused_exactly(tmp_path, monkeypatch):
    """The advice works: with weight_bits=7 ONNX Runtime's fused kernels (QLinearConv,
    the Gemm's) agree with quanta's reference within 1 LSB on every quantized tensor, on
    any CPU, VNNI or not; every int8 weight is in ORT's reduce_range table [-64, 64]."""
    _, out = _quantize(tmp_path, "w7", monkeypatch, True, weight_bits=7)
    proto = onnx.load(str(out))
    weights = [
        numpy_helper.to_array(t) for t in proto.graph.initializer if t.data_type == onnx.TensorProto.INT8
    ]
    assert weights and all(int(np.abs(w.astype(np.int32)).max()) <= 64 for w in weights)
    assert max(int(np.abs(w.astype(np.int32)).max()) for w in weights) == 64  # the grid is used
    assert_reference_matches_ort_on_quantized_tensors(out, cnn_feeds(1, seed=4)[0], fused_int8=True)


def test_cli_weight_bits(tmp_path, capsys):
    src = tmp_path / "cnn.onnx"
    onnx.save(models.float_cnn(), src)
    calib = tmp_path / "calib.npz"
    np.savez(calib, x=np.random.default_rng(2).standard_normal((2, 3, 8, 6)).astype(np.float32))
    out = tmp_path / "q.onnx"
    assert main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--weight-bits", "7"]) == 0
    recipe = json.loads(onnx.load(str(out)).metadata_props[0].value)
    assert recipe["weight_bits"] == 7
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["quantize", str(src), "-o", str(out), "--calib", str(calib), "--weight-bits", "6"])
    assert "invalid choice" in capsys.readouterr().err


@pytest.mark.parametrize("rounding", ["gptq", "nearest"])
def test_seven_bits_leave_a_depthwise_conv_on_eight(tmp_path, rounding):
    """A depthwise Conv's taps are widened to int16 in ORT's and quanta's AVX2 kernels
    (exact at 8 bits; scratch probe: full-range depthwise weights at x = 255 fused within
    1 LSB of ORT unfused, pointwise 22 LSB off): weight_bits=7 narrows the pointwise
    Conv's weights only, for GPTQ's grid as for nearest rounding."""
    from tests.quantize.test_weighted_ranges import feeds, wide_channel_then_depthwise

    src, out = tmp_path / "m.onnx", tmp_path / "q.onnx"
    onnx.save(wide_channel_then_depthwise(), src)
    quanta.quantize_static(src, out, feeds(4, 1), verbose=False, weight_bits=7, weight_rounding=rounding)
    proto = onnx.load(str(out))
    dq_of = {n.input[0]: n for n in proto.graph.node if n.op_type == "DequantizeLinear"}
    conv_w = {n.name: n.input[1] for n in proto.graph.node if n.op_type == "Conv"}
    producer = {o: n for n in proto.graph.node for o in n.output}
    codes = {}
    for name, w in conv_w.items():
        q = producer[w].input[0]
        assert q in dq_of
        codes[name] = int(
            np.abs(
                numpy_helper.to_array(next(t for t in proto.graph.initializer if t.name == q)).astype(
                    np.int32
                )
            ).max()
        )
    assert codes == {"pw": 64, "dw": 127}
    assert_reference_matches_ort_on_quantized_tensors(out, feeds(1, 3)[0], fused_int8=True)


def _qdq_conv(w: np.ndarray, group: int = 1) -> onnx.ModelProto:
    """x -Q-DQ-> Conv(DQ(w: int8 per channel), group) -Q-DQ-> y."""
    from onnx import TensorProto, helper

    cout, cin_g = w.shape[:2]
    cin = cin_g * group
    inits = [
        numpy_helper.from_array(np.float32(0.02), "sx"),
        numpy_helper.from_array(np.uint8(3), "zx"),
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.linspace(0.004, 0.013, cout).astype(np.float32), "sw"),
        numpy_helper.from_array(np.zeros(cout, np.int8), "zw"),
        numpy_helper.from_array(np.float32(0.5), "sy"),
        numpy_helper.from_array(np.uint8(128), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w", "sw", "zw"], ["wd"], axis=0),
        helper.make_node("Conv", ["xd", "wd"], ["c"], group=group, pads=[1, 1, 1, 1]),
        helper.make_node("QuantizeLinear", ["c", "sy", "zy"], ["cq"]),
        helper.make_node("DequantizeLinear", ["cq", "sy", "zy"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, cin, 9, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_saturating_weights_finds_the_wide_gemm_weights_only():
    from quanta.quantize.ort_saturation import saturating_weights

    rng = np.random.default_rng(7)
    wide = rng.integers(-127, 128, (17, 3, 3, 3)).astype(np.int8)
    wide[4, 0, 0, 0] = -128
    assert saturating_weights(_qdq_conv(wide)) == ["w"]
    narrow = np.clip(wide, -64, 64).astype(np.int8)  # ORT's reduce_range grid
    assert saturating_weights(_qdq_conv(narrow)) == []
    depthwise = rng.integers(-127, 128, (7, 1, 3, 3)).astype(np.int8)  # exact in ORT
    assert saturating_weights(_qdq_conv(depthwise, group=7)) == []
    # a QOperator file: QLinearConv's weight input (|w| up to 99), and the same halved
    qop = models.qoperator()
    assert saturating_weights(qop) == ["w"]
    (w,) = [t for t in qop.graph.initializer if t.name == "w"]
    w.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(w) >> 1).astype(np.int8), "w"))
    assert saturating_weights(qop) == []


def test_bench_says_when_the_agreement_includes_onnxruntimes_saturation(tmp_path, monkeypatch):
    from quanta.cli.bench import bench_model, format_result

    monkeypatch.setattr(ort_saturation, "onnxruntime_int8_saturates", lambda: True)
    rng = np.random.default_rng(8)
    path = tmp_path / "conv.onnx"
    onnx.save(_qdq_conv(rng.integers(-127, 128, (17, 3, 3, 3)).astype(np.int8)), path)
    r = bench_model(path, threads=1, warmup=0, runs=1, vs_ort=True)
    assert r.ort_note == saturation_note(1)
    assert f"  note: {saturation_note(1)}" in format_result(r).splitlines()
    monkeypatch.setattr(ort_saturation, "onnxruntime_int8_saturates", lambda: False)
    r = bench_model(path, threads=1, warmup=0, runs=1, vs_ort=True)
    assert r.ort_note is None and "no VNNI" not in format_result(r)
