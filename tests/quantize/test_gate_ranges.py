"""gate_ranges (quantize/gate_ranges.py): the input range of a gated activation (SiLU,
HardSwish, Mish) ends where its output codes stop changing, eq. (G1)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.quantize import gate_ranges
from quanta.quantize.gate_ranges import _gate_function, trimmed_low
from tests.ort_int8 import WEIGHT_BITS

SILU = _gate_function(("Sigmoid",), {})
HARDSWISH = _gate_function(("HardSigmoid",), {"alpha": 1 / 6, "beta": 0.5})
MISH = _gate_function(("Tanh", "Softplus"), {})


@pytest.mark.parametrize(
    ("f", "lo", "hi", "y_lo", "y_hi"),
    [
        (SILU, -18.57, 6.055, -0.2785, 6.03),  # YOLO26n's /model.16/cv2 (isbnx)
        (SILU, -41.7, 42.7, -0.2785, 42.7),
        (HARDSWISH, -11.3, 7.9, -0.375, 7.9),
        (MISH, -23.0, 5.1, -0.309, 5.1),
    ],
)
def test_the_dropped_tail_quantizes_to_one_output_code(f, lo, hi, y_lo, y_hi):
    """Every input of the dropped tail [lo, lo'] gives the output code f(lo') gives, with
    the output's uint8 parameters; the kept range is shorter."""
    scale = (y_hi - y_lo) / 255
    zp = round(-y_lo / scale)
    new_lo = trimmed_low(f, lo, hi, scale)
    assert lo < new_lo < 0
    tail = np.linspace(lo, new_lo, 20001)
    codes = np.clip(np.rint(f(tail) / scale) + zp, 0, 255)
    assert np.all(codes == codes[-1]) and codes[-1] == zp
    # the next grid point up is no longer flat: the bound is tight to the grid
    assert abs(f(new_lo + (min(hi, 0.0) - lo) / 4096 * 2)) > scale / 4


def test_a_tail_that_is_not_flat_is_kept():
    assert trimmed_low(SILU, -3.0, 5.0, 0.02) == -3.0  # |silu(-3)| = 0.14 > 0.005


def _conv_silu_conv(shift: float, other_reader: bool = False) -> onnx.ModelProto:
    """x[1, 3, 9, 11] -> Conv 3->7 (biases shifted down by ``shift``: a long negative
    pre-activation tail) -> SiLU (Sigmoid, Mul) -> Conv 7->17 -> y."""
    rng = np.random.default_rng(3)
    w1 = rng.standard_normal((7, 3, 3, 3)).astype(np.float32)
    b1 = (rng.standard_normal(7) - shift).astype(np.float32)
    w2 = (rng.standard_normal((17, 7, 1, 1)) * 0.3).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1], name="conv1"),
        helper.make_node("Sigmoid", ["c"], ["s"], name="gate"),
        helper.make_node("Mul", ["c", "s"], ["a"], name="silu"),
        helper.make_node("Conv", ["a", "w2"], ["y"], name="conv2"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if other_reader:
        nodes.append(helper.make_node("Relu", ["c"], ["r"], name="other"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 11])],
        outputs,
        [
            numpy_helper.from_array(w1, "w1"),
            numpy_helper.from_array(b1, "b1"),
            numpy_helper.from_array(w2, "w2"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])


def _feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 3, 9, 11)) * 2.5).astype(np.float32)} for _ in range(n)]


def _pre_activation_scale(path) -> float:
    m = onnx.load(str(path))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.input[0] == "c")
    return float(inits[q.input[1]])


def _sqnr(path, p: onnx.ModelProto, feeds) -> float:
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(p.SerializeToString(), providers=["CPUExecutionProvider"])
    got = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    r = np.concatenate([ref.run(["y"], f)[0].ravel() for f in feeds]).astype(np.float64)
    q = np.concatenate([got.run(["y"], f)[0].ravel() for f in feeds]).astype(np.float64)
    return 10 * np.log10(np.sum(r**2) / np.sum((r - q) ** 2))


def test_quantize_static_trims_a_silu_input_and_gains_on_held_out_data(tmp_path, monkeypatch):
    """A pre-activation tail reaching about -20: the trimmed file's input step is at
    least 1.5x finer and its output SQNR on held-out feeds higher than without the trim
    (the identity in its place), both run by ORT and by quanta within a step."""
    p = _conv_silu_conv(shift=8.0)
    src = tmp_path / "m.onnx"
    src.write_bytes(p.SerializeToString())
    calib, held = _feeds(8, 1), _feeds(6, 2)
    trimmed, untrimmed = tmp_path / "trim.onnx", tmp_path / "plain.onnx"
    # 7-bit weights where ORT's u8 x s8 kernels saturate full-range ones (tests/ort_int8.py):
    # there ORT measures its own overflow (18 dB for both files), not the trim
    bits = {"weight_bits": WEIGHT_BITS}
    quanta.quantize_static(str(src), str(trimmed), calib, verbose=False, progress=False, **bits)
    monkeypatch.setattr("quanta.quantize.static.trim_gate_inputs", lambda graph, plan, ranges: ranges)
    quanta.quantize_static(str(src), str(untrimmed), calib, verbose=False, progress=False, **bits)
    assert _pre_activation_scale(untrimmed) > 1.5 * _pre_activation_scale(trimmed)
    assert _sqnr(trimmed, p, held) > _sqnr(untrimmed, p, held) + 1.0
    sess = quanta.InferenceSession(str(trimmed))
    assert sess.fallbacks == []


def test_an_input_another_op_reads_keeps_its_range():
    """The Conv output is read by a Relu too: its tail may matter there, so no trim."""
    p = _conv_silu_conv(shift=8.0, other_reader=True)
    from quanta.ir.onnx_io import load
    from quanta.ir.types import F32, CalibratedType
    from quanta.quantize.qdq import plan_qdq
    from quanta.quantize.recipe import Recipe

    model = load(p)
    plan = plan_qdq(model.graph, Recipe())
    f32 = F32
    ranges = {
        "c": CalibratedType(f32, -20.0, 6.0),
        "a": CalibratedType(f32, -0.2785, 6.0),
        "r": CalibratedType(f32, 0.0, 6.0),
    }
    assert gate_ranges.trim_gate_inputs(model.graph, plan, ranges)["c"] == ranges["c"]
