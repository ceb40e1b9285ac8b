"""com.microsoft DynamicQuantizeLSTM (reference/ms_lstm.py) against ONNX Runtime itself.

Models are float LSTMs built with onnx.helper at odd sizes (input 7, hidden 17, seq 5,
batch 3), quantized by ONNX Runtime's own ``quantize_dynamic`` (which writes
DynamicQuantizeLSTM with int8 weights, per direction or per column), then run by ONNX Runtime
(CPU, one intra-op thread) and by quanta on the same file; hypothesis adds single-node
DynamicQuantizeLSTM models with random int8 / uint8 weights over shapes.

Tolerance: 0 (bit-identical Y, Y_h, Y_c). The reference performs ORT's float32 operations in
ORT's order (module docstring: the input GEMM's one quantization block, the per-step H block,
the two roundings of the accumulate step, peephole before bias, MLAS's FMA3 sigmoid and tanh).
Any reordering shows up at once: the per-step quantization turns one float32 ulp into a
different uint8 code of H, which the recurrence then carries forward. The MLAS activations
are checked bit for bit against ORT's Sigmoid and Tanh ops on 1.3 million inputs.
"""

from __future__ import annotations

import logging
from fractions import Fraction

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import quantize_dynamic as ort_quantize_dynamic

import quanta
from quanta.kernels.reference.ms_lstm import dynamic_quantize_lstm, fma_f32, mlas_logistic, mlas_tanh
from quanta.kernels.reference.registry import MS_DOMAIN, OpError, get_op
from tests.ort_int8 import REDUCE_RANGE, fit_s8

F32 = np.float32
SEQ, BATCH, INPUT, HIDDEN = 5, 3, 7, 17


def _float_lstm(
    direction="forward",
    *,
    bias=True,
    initial=False,
    seq_lens=False,
    peephole=False,
    outputs=("Y", "Y_h", "Y_c"),
    attrs=None,
    seed=0,
):
    nd = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(seed)
    inits = [
        numpy_helper.from_array((rng.standard_normal((nd, 4 * HIDDEN, INPUT)) * 0.4).astype(F32), "W"),
        numpy_helper.from_array((rng.standard_normal((nd, 4 * HIDDEN, HIDDEN)) * 0.3).astype(F32), "R"),
    ]
    ins = ["X", "W", "R"]
    infos = [helper.make_tensor_value_info("X", TensorProto.FLOAT, [SEQ, BATCH, INPUT])]
    if bias:
        inits.append(numpy_helper.from_array((rng.standard_normal((nd, 8 * HIDDEN)) * 0.2).astype(F32), "B"))
    ins.append("B" if bias else "")
    if seq_lens:
        infos.append(helper.make_tensor_value_info("seq_lens", TensorProto.INT32, [BATCH]))
    ins.append("seq_lens" if seq_lens else "")
    if initial:
        infos += [
            helper.make_tensor_value_info(n, TensorProto.FLOAT, [nd, BATCH, HIDDEN]) for n in ("h0", "c0")
        ]
    ins += ["h0", "c0"] if initial else ["", ""]
    if peephole:
        inits.append(numpy_helper.from_array((rng.standard_normal((nd, 3 * HIDDEN)) * 0.2).astype(F32), "P"))
        ins.append("P")
    while ins[-1] == "":
        ins.pop()
    node = helper.make_node(
        "LSTM", ins, list(outputs), name="lstm", hidden_size=HIDDEN, direction=direction, **(attrs or {})
    )
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs if n]
    graph = helper.make_graph([node], "lstm", infos, outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(model, seed=5):
    rng = np.random.default_rng(seed)
    feeds = {}
    for vi in model.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        if vi.name == "seq_lens":
            feeds[vi.name] = np.array([SEQ, 2, 4], np.int32)
        elif vi.name == "h0":
            feeds[vi.name] = (rng.standard_normal(shape) * 0.5).astype(F32)
        else:
            feeds[vi.name] = rng.standard_normal(shape).astype(F32)
    return feeds


def _ort(path_or_bytes, feeds, threads=1):
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    return ort.InferenceSession(path_or_bytes, so, providers=["CPUExecutionProvider"]).run(None, feeds)


def _ort_quantized(tmp_path, model, per_channel):
    src, dst = tmp_path / "lstm.onnx", tmp_path / "lstm.dyn.onnx"
    onnx.save(model, src)
    logging.disable(logging.WARNING)  # ORT's "consider pre-processing" advice
    try:
        # 7-bit weights where ORT's u8 x s8 kernels saturate (tests/ort_int8.py).
        ort_quantize_dynamic(str(src), str(dst), per_channel=per_channel, reduce_range=REDUCE_RANGE)
    finally:
        logging.disable(logging.NOTSET)
    assert any(n.op_type == "DynamicQuantizeLSTM" for n in onnx.load(dst).graph.node)
    return dst


def _assert_same(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape, (g.dtype, g.shape, e.shape)
        np.testing.assert_array_equal(g, e)


CASES = [
    # direction, bias, initial states, sequence_lens, peephole, per-channel weights
    ("forward", True, False, False, False, False),
    ("forward", False, True, True, False, True),
    ("forward", True, True, True, True, True),
    ("reverse", True, False, True, False, False),
    ("reverse", False, True, False, True, True),
    ("bidirectional", True, True, True, False, False),
    ("bidirectional", True, False, True, True, True),
    ("bidirectional", False, False, False, False, True),
]


@pytest.mark.parametrize(("direction", "bias", "initial", "seq_lens", "peephole", "per_channel"), CASES)
def test_ort_quantized_lstm_matches_onnxruntime_exactly(
    tmp_path, direction, bias, initial, seq_lens, peephole, per_channel
):
    model = _float_lstm(direction, bias=bias, initial=initial, seq_lens=seq_lens, peephole=peephole)
    path = _ort_quantized(tmp_path, model, per_channel)
    feeds = _feeds(model)
    expected = _ort(str(path), feeds)
    got = quanta.InferenceSession(str(path), backend="reference").run(None, feeds)
    _assert_same(got, expected)


def test_ort_quantized_lstm_loads_and_runs_on_the_native_backend(tmp_path):
    """A native target has no LSTM kernel of its own: the node falls back to the reference,
    at load time and at run time, with the same bits."""
    model = _float_lstm("bidirectional", initial=True, seq_lens=True)
    path = _ort_quantized(tmp_path, model, per_channel=True)
    feeds = _feeds(model)
    got = quanta.InferenceSession(str(path)).run(None, feeds)
    _assert_same(got, _ort(str(path), feeds))


def test_y_not_requested_keeps_ended_rows_in_the_h_block(tmp_path):
    """Without Y, ORT's previous H is its running Y_h buffer: rows whose sequence ended keep
    their last h there, and it stays in the next steps' quantization range (with Y those rows
    are zeros). Sequence lengths 5, 2, 4 make the two paths differ."""
    model = _float_lstm("bidirectional", seq_lens=True, initial=True, outputs=("", "Y_h", "Y_c"))
    path = _ort_quantized(tmp_path, model, per_channel=False)
    feeds = _feeds(model)
    expected = _ort(str(path), feeds)
    got = quanta.InferenceSession(str(path), backend="reference").run(None, feeds)
    _assert_same(got, expected)
    with_y = _float_lstm("bidirectional", seq_lens=True, initial=True)
    other = _ort(str(_ort_quantized(tmp_path, with_y, per_channel=False)), feeds)[1:]
    assert not all(np.array_equal(a, b) for a, b in zip(other, expected)), (
        "the test no longer separates the paths"
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {"clip": 0.7},
        {"input_forget": 1},
        {"activations": ["sigmoid", "relu", "tanh"]},
        {
            "activations": ["hardsigmoid", "tanh", "relu"],
            "activation_alpha": [0.25],
            "activation_beta": [0.4],
        },
    ],
    ids=["clip", "input_forget", "relu_g", "hardsigmoid_f"],
)
def test_attributes_match_onnxruntime_exactly(tmp_path, attrs):
    model = _float_lstm("forward", initial=True, seq_lens=True, attrs=attrs)
    path = _ort_quantized(tmp_path, model, per_channel=True)
    feeds = _feeds(model)
    _assert_same(
        quanta.InferenceSession(str(path), backend="reference").run(None, feeds), _ort(str(path), feeds)
    )


def _inputs_of(path, feeds):
    m = onnx.load(path)
    node = next(n for n in m.graph.node if n.op_type == "DynamicQuantizeLSTM")
    values = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer} | feeds
    args = [values[i] if i else None for i in node.input]
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    attrs["direction"] = attrs["direction"].decode()
    return args, attrs


def test_rows_per_block_is_multithreaded_onnxruntime(tmp_path):
    """With 2 intra-op threads ORT quantizes H in blocks of ceil(3 / 2) = 2 rows; the
    registered op (one block) is ORT with one thread, ``rows_per_block = 2`` is ORT with two."""
    model = _float_lstm("bidirectional", initial=True)
    path = _ort_quantized(tmp_path, model, per_channel=True)
    feeds = _feeds(model)
    args, attrs = _inputs_of(path, feeds)
    two_threads = _ort(str(path), feeds, threads=2)
    _assert_same(list(dynamic_quantize_lstm(*args, **attrs, rows_per_block=2)), two_threads)
    _assert_same(list(dynamic_quantize_lstm(*args, **attrs)), _ort(str(path), feeds, threads=1))
    assert not np.array_equal(two_threads[0], _ort(str(path), feeds, threads=1)[0])


def _single_node(x, w, r, b, lens, h0, c0, w_scale, w_zp, r_scale, r_zp, attrs):
    inputs = {
        "X": x,
        "W": w,
        "R": r,
        "B": b,
        "seq_lens": lens,
        "h0": h0,
        "c0": c0,
        "P": None,
        "W_scale": w_scale,
        "W_zero_point": w_zp,
        "R_scale": r_scale,
        "R_zero_point": r_zp,
    }
    consts = {"W", "R", "B", "W_scale", "W_zero_point", "R_scale", "R_zero_point"}
    names, infos, inits, feeds = [], [], [], {}
    for name, v in inputs.items():
        if v is None:
            names.append("")
            continue
        names.append(name)
        if name in consts:
            inits.append(numpy_helper.from_array(np.asarray(v), name))
        else:
            feeds[name] = v
            infos.append(
                helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
            )
    node = helper.make_node("DynamicQuantizeLSTM", names, ["Y", "Y_h", "Y_c"], domain=MS_DOMAIN, **attrs)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("Y", "Y_h", "Y_c")]
    model = helper.make_model(
        helper.make_graph([node], "g", infos, outs, inits),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS_DOMAIN, 1)],
    )
    return model.SerializeToString(), feeds


@settings(max_examples=25)
@given(
    shape=st.tuples(st.integers(1, 6), st.integers(1, 5), st.integers(1, 12), st.integers(1, 20)),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    w_type=st.sampled_from([np.int8, np.uint8]),
    per_column=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
)
def test_random_single_node_models_match_onnxruntime_exactly(shape, direction, w_type, per_column, seed):
    T, B, n_in, H = shape
    nd = 2 if direction == "bidirectional" else 1
    rng = np.random.default_rng(seed)
    info = np.iinfo(w_type)
    # int8 halved where ORT's u8 x s8 kernels saturate (tests/ort_int8.py)
    w = fit_s8(rng.integers(info.min, info.max, (nd, n_in, 4 * H), endpoint=True).astype(w_type))
    r = fit_s8(rng.integers(info.min, info.max, (nd, H, 4 * H), endpoint=True).astype(w_type))
    scale_shape = (nd, 4 * H) if per_column else (nd,)
    w_scale = rng.uniform(1e-3, 2e-2, scale_shape).astype(F32)
    r_scale = rng.uniform(1e-3, 2e-2, scale_shape).astype(F32)
    zp_value = 0 if w_type == np.int8 else int(rng.integers(100, 156))
    w_zp, r_zp = (np.full(scale_shape, zp_value, w_type) for _ in range(2))
    x = (rng.standard_normal((T, B, n_in)) * rng.uniform(0.1, 3)).astype(F32)
    b = (rng.standard_normal((nd, 8 * H)) * 0.3).astype(F32)
    lens = rng.integers(0, T, B, endpoint=True).astype(np.int32)
    h0 = (rng.standard_normal((nd, B, H)) * 0.5).astype(F32)
    c0 = rng.standard_normal((nd, B, H)).astype(F32)
    model, feeds = _single_node(
        x, w, r, b, lens, h0, c0, w_scale, w_zp, r_scale, r_zp, {"hidden_size": H, "direction": direction}
    )
    expected = _ort(model, feeds)
    got = quanta.InferenceSession(model, backend="reference").run(None, feeds)
    _assert_same(got, expected)


def _ort_unary(op, x):
    node = helper.make_node(op, ["x"], ["y"])
    io = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [x.size]) for n in ("x", "y")]
    model = helper.make_model(
        helper.make_graph([node], "g", io[:1], io[1:]), opset_imports=[helper.make_opsetid("", 17)]
    )
    return _ort(model.SerializeToString(), {"x": x})[0]


@pytest.mark.parametrize(("op", "fn"), [("Sigmoid", mlas_logistic), ("Tanh", mlas_tanh)])
def test_mlas_activations_are_onnxruntime_bit_for_bit(op, fn):
    """ORT's Sigmoid and Tanh ops call the same MLAS kernels as its LSTM gates."""
    rng = np.random.default_rng(1)
    x = np.concatenate(
        [
            rng.standard_normal(1 << 20) * 4,
            rng.uniform(-25, 25, 1 << 18),
            rng.standard_normal(1 << 16) * 1e-3,
            [0.0, -0.0, 9.0, -9.0, 18.0, -18.0, 1e30, -1e30],
        ]
    ).astype(F32)
    expected = _ort_unary(op, x)
    np.testing.assert_array_equal(fn(x).view(np.uint32), expected.view(np.uint32))


def test_fma_f32_rounds_once_where_float64_would_round_twice():
    """a·a = 1 + 2^-11 + 2^-24 lies exactly halfway between two float32 values; a tiny c
    decides the side. The float64 sum absorbs c (a second rounding) and would tie to even."""
    a = F32(1 + 2.0**-12)
    lo, hi = F32(1 + 2.0**-11), F32(1 + 2.0**-11 + 2.0**-23)
    assert fma_f32(a, a, F32(2.0**-80)) == hi
    assert fma_f32(a, a, F32(-(2.0**-80))) == lo
    assert fma_f32(a, a, F32(0)) == lo  # an exact tie: to even
    assert F32(float(a) * float(a) + 2.0**-80) == lo  # the double rounding avoided above
    rng = np.random.default_rng(3)
    u, v, w = (rng.standard_normal(2000).astype(F32) for _ in range(3))
    got = fma_f32(u, v, w)
    for k in range(0, 2000, 50):
        exact = Fraction(float(u[k])) * Fraction(float(v[k])) + Fraction(float(w[k]))
        assert got[k] == F32(float(exact)) or abs(Fraction(float(got[k])) - exact) <= abs(
            Fraction(float(np.nextafter(got[k], np.inf))) - exact
        )


def test_registered_and_errors_name_the_contract():
    assert get_op("DynamicQuantizeLSTM", MS_DOMAIN) is not None
    x = np.zeros((2, 1, 3), F32)
    w = np.zeros((1, 3, 8), np.int8)
    r = np.zeros((1, 2, 8), np.int8)
    s, z = np.ones(1, F32), np.zeros(1, np.int8)
    with pytest.raises(OpError, match=r"R must be int8/uint8 of shape \[1, 2, 8\]"):
        dynamic_quantize_lstm(x, w, r[:, :1], None, None, None, None, None, s, z, s, z, hidden_size=2)
    with pytest.raises(OpError, match="expected 3 activations"):
        dynamic_quantize_lstm(
            x, w, r, None, None, None, None, None, s, z, s, z, hidden_size=2, activations=["sigmoid", "tanh"]
        )
    with pytest.raises(OpError, match="int8 weight's zero point must be zero"):
        dynamic_quantize_lstm(
            x, w, r, None, None, None, None, None, s, np.ones(1, np.int8), s, z, hidden_size=2
        )
