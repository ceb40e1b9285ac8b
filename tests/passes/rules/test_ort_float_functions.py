"""OrtFloatFunctions (passes/rules/ort_float_functions.py): Sigmoid and Tanh become ONNX
Runtime's MLAS functions. Four parts (fired; structure; numerics: the rewritten graph is
ORT's computation bit for bit, and the original graph is not; the verifier, on in every
run_passes), the refusal for float64, and the session's ``float_functions`` choice: on a
file ORT's quantizer wrote (``auto``), by request (``ort``), never otherwise; a
quantized Sigmoid group's table is then built from ORT's function too."""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.passes.rules.ort_float_functions import OrtFloatFunctions
from quanta.session import GraphOptimizationLevel, InferenceSession, SessionOptions
from tests.passes.helpers import run_passes, run_ref

SHAPE = [3, 7, 17]


def gated_proto(elem: int = TensorProto.FLOAT, producer: str = ""):
    """y = x·sigmoid(x) + tanh(x): a SiLU (ORT fuses it into QuickGelu, same MLAS logistic)
    and a Tanh."""
    nodes = [
        helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
        helper.make_node("Mul", ["x", "s"], ["g"], name="mul"),
        helper.make_node("Tanh", ["x"], ["t"], name="tanh"),
        helper.make_node("Add", ["g", "t"], ["y"], name="add"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", elem, SHAPE)],
        [helper.make_tensor_value_info("y", elem, SHAPE)],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.producer_name = producer
    return m


def feeds(dtype=np.float32):
    rng = np.random.default_rng(11)
    x = (rng.standard_normal(SHAPE) * 7.0).astype(dtype)
    x.flat[:4] = [-18.5, 18.0, -9.0, 0.0]  # the clamps and the centre
    return {"x": x}


def ort_run(proto, f):
    so = ort.SessionOptions()
    so.log_severity_level = 3
    return ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, f
    )


def test_sigmoid_and_tanh_become_ort_functions_bit_exact_with_onnxruntime():
    proto = gated_proto()
    model = load(proto)
    result = run_passes(model, [OrtFloatFunctions()])
    assert result.fired("SigmoidToMlasLogistic") == 1
    assert result.fired("TanhToMlasTanh") == 1
    assert [(n.domain, n.op_type, n.name) for n in model.graph.nodes] == [
        ("quanta", "MlasLogistic", "sig"),
        ("", "Mul", "mul"),
        ("quanta", "MlasTanh", "tanh"),
        ("", "Add", "add"),
    ]
    f = feeds()
    expected = ort_run(proto, f)[0]
    np.testing.assert_array_equal(run_ref(model, f)[0], expected)
    # the rule changes results: ONNX's functions (quanta's kernels) differ from ORT's here
    assert np.any(run_ref(proto, f)[0] != expected)


def test_float64_is_left_with_its_reason():
    model = load(gated_proto(TensorProto.DOUBLE))
    p = OrtFloatFunctions()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("SigmoidToMlasLogistic")] == [
        "input 'x' (a graph input) is f64, not f32 (MLAS computes float32 only)"
    ]


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize(
    ("producer", "option", "ort_functions"),
    [
        ("onnx.quantize", "auto", True),  # ORT's quantizer wrote it
        ("pytorch", "auto", False),
        ("pytorch", "ort", True),
        ("onnx.quantize", "onnx", False),
    ],
)
def test_session_float_functions(backend, producer, option, ort_functions):
    proto = gated_proto(producer=producer)
    sess = InferenceSession(proto, SessionOptions(float_functions=option), backend=backend)
    ops = {n.op_type for n in sess.model.graph.nodes}
    assert ("MlasLogistic" in ops) == ort_functions and ("Sigmoid" in ops) != ort_functions
    assert sess.fallbacks == [] or backend == "reference"
    f = feeds()
    same = np.array_equal(sess.run(None, f)[0], ort_run(proto, f)[0])
    assert same == ort_functions


def test_session_rejects_an_unknown_choice():
    with pytest.raises(ValueError, match="float_functions: expected one of auto, onnx, ort, got 'mlas'"):
        InferenceSession(gated_proto(), SessionOptions(float_functions="mlas"))


def qdq_silu_proto(sx: float, zx: int, sy: float, zy: int):
    """Q(x·Sigmoid(x)) on x = DQ(q) with the given parameters, as ORT's quantizer writes a
    SiLU (ORT runs the group in float: DQ, QuickGelu, Q)."""
    inits = [
        numpy_helper.from_array(np.array(sx, np.float32), "sx"),
        numpy_helper.from_array(np.array(zx, np.uint8), "zx"),
        numpy_helper.from_array(np.array(sy, np.float32), "sy"),
        numpy_helper.from_array(np.array(zy, np.uint8), "zy"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], name="dqx"),
        helper.make_node("Sigmoid", ["xf"], ["s"], name="sig"),
        helper.make_node("Mul", ["xf", "s"], ["g"], name="mul"),
        helper.make_node("QuantizeLinear", ["g", "sy", "zy"], ["sq"], name="qs"),
        helper.make_node("DequantizeLinear", ["sq", "sy", "zy"], ["y"], name="dqs"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, SHAPE)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, SHAPE)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.producer_name = "onnx.quantize"
    return m


@pytest.mark.parametrize(
    ("sx", "zx", "sy", "zy", "onnx_differs"),
    [
        (0.0371, 131, 0.0217, 13, None),  # a usual range: 8-bit steps may hide the last bits
        # x in [-25.5, 0] and steps of 2e-8 around zero: ORT's σ(-17) is 8.9e-8 where the
        # exact one is 4.1e-8 (x·σ(x) 76 and 35 steps below zero), and 0 from -18 down
        (0.1, 255, 2e-8, 255, True),
    ],
)
def test_quantized_silu_table_follows_ort_function(sx, zx, sy, zy, onnx_differs):
    """Every code of x (each reaches the table): quanta's table lookup equals ORT's
    float group (DQ, x·MLAS logistic, Q) when the session uses ORT's functions. (A lone
    Sigmoid group lowers to QLinearSigmoid, which is ORT's function in any mode.)"""
    proto = qdq_silu_proto(sx, zx, sy, zy)
    codes = (np.arange(256, dtype=np.float32) - zx) * np.float32(sx)
    x = np.concatenate([codes, np.linspace(codes.min(), codes.max(), 3 * 7 * 17 - 256)]).astype(np.float32)
    f = {"x": x.reshape(SHAPE)}
    expected = ort_run(proto, f)[0]
    sess = InferenceSession(proto)
    ops = {n.op_type for n in sess.model.graph.nodes}
    assert "QLinearLookup" in ops and "MlasLogistic" not in ops
    np.testing.assert_array_equal(sess.run(None, f)[0], expected)
    onnx_sess = InferenceSession(proto, SessionOptions(float_functions="onnx"))
    if onnx_differs is not None:
        assert np.any(onnx_sess.run(None, f)[0] != expected) == onnx_differs


def batchnorm_proto(params_as_constant_nodes: bool, producer: str = "onnx.quantize"):
    """Relu(BatchNormalization(x)) over 7 channels, parameters as initializers or as
    Constant nodes (Paddle's exports), variances from 0.01 to 2."""
    rng = np.random.default_rng(5)
    c = 7
    values = {
        "s": rng.standard_normal(c).astype(np.float32),
        "b": rng.standard_normal(c).astype(np.float32),
        "m": rng.standard_normal(c).astype(np.float32),
        "v": (rng.random(c) * 2 + 0.01).astype(np.float32),
    }
    nodes, inits = [], []
    for name, v in values.items():
        if params_as_constant_nodes:
            nodes.append(helper.make_node("Constant", [], [name], value=numpy_helper.from_array(v, name)))
        else:
            inits.append(numpy_helper.from_array(v, name))
    nodes += [
        helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["n"], name="bn", epsilon=1e-3),
        helper.make_node("Relu", ["n"], ["y"], name="relu"),
    ]
    shape = [2, c, 9, 11]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        initializer=inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 15)])
    m.producer_name = producer
    return m


@pytest.mark.parametrize("constant_nodes", [False, True])
def test_batchnorm_becomes_ort_affine_bit_exact_with_onnxruntime(constant_nodes):
    proto = batchnorm_proto(constant_nodes)
    model = load(proto)
    result = run_passes(model, [OrtFloatFunctions()])
    assert result.fired("BatchNormToOrtAffine") == 1
    assert [(n.op_type, n.name) for n in model.graph.nodes if n.op_type != "Constant"] == [
        ("Mul", "bn_ort_scale"),
        ("Add", "bn"),
        ("Relu", "relu"),
    ]
    rng = np.random.default_rng(6)
    f = {"x": (rng.standard_normal([2, 7, 9, 11]) * 3).astype(np.float32)}
    expected = ort_run(proto, f)[0]
    np.testing.assert_array_equal(run_ref(model, f)[0], expected)
    as_onnx = SessionOptions(
        graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL, float_functions="onnx"
    )
    onnx_y = InferenceSession(proto, as_onnx, backend="reference").run(None, f)[0]
    assert np.any(onnx_y != expected)  # ONNX's formula as written differs
    for backend in ("native", "reference"):  # the session does it for ORT's files
        np.testing.assert_array_equal(InferenceSession(proto, backend=backend).run(None, f)[0], expected)


def test_batchnorm_with_a_computed_parameter_is_left_with_its_reason():
    proto = batchnorm_proto(False)
    proto.graph.node.insert(0, helper.make_node("Abs", ["v_in"], ["v2"]))
    proto.graph.input.append(helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [7]))
    proto.graph.node[1].input[4] = "v2"
    model = load(proto)
    p = OrtFloatFunctions()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("BatchNormToOrtAffine")] == [
        "a BatchNormalization parameter is not a constant"
    ]


# --- LSTM: ONNX Runtime's float LSTM (LstmToOrtLstm, quanta::OrtLSTM) ---------------------


def lstm_proto(n_in: int, H: int, direction: str, producer: str = "onnx.quantize", activations=None):
    """One LSTM with every optional input: bias, sequence_lens (a row of length 0, a short
    one, a full one), initial states, peepholes; Y, Y_h and Y_c all graph outputs. n_in = 300
    makes X·Wᵀ two blocks of MLAS's 256 k; H = 260 makes H·Rᵀ two blocks too."""
    rng = np.random.default_rng(n_in + H)
    D = 2 if direction == "bidirectional" else 1
    T, B = 5, 3
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, 4 * H, n_in)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((D, 4 * H, H)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((D, 8 * H)) * 0.5).astype(np.float32), "Bias"),
        numpy_helper.from_array(np.array([0, 3, T], np.int32), "lens"),
        numpy_helper.from_array((rng.standard_normal((D, 3 * H)) * 0.5).astype(np.float32), "P"),
    ]
    attrs = {"hidden_size": H, "direction": direction}
    if activations:
        attrs["activations"] = activations
    node = helper.make_node(
        "LSTM", ["x", "W", "R", "Bias", "lens", "h0", "c0", "P"], ["y", "yh", "yc"], name="lstm", **attrs
    )
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, n_in]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [D, B, H]),
            helper.make_tensor_value_info("c0", TensorProto.FLOAT, [D, B, H]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, D, B, H]),
            helper.make_tensor_value_info("yh", TensorProto.FLOAT, [D, B, H]),
            helper.make_tensor_value_info("yc", TensorProto.FLOAT, [D, B, H]),
        ],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.producer_name = producer
    return m


def lstm_feeds(proto):
    rng = np.random.default_rng(5)
    out = {}
    for v in proto.graph.input:
        shape = [d.dim_value for d in v.type.tensor_type.shape.dim]
        out[v.name] = (rng.standard_normal(shape) * 2.0).astype(np.float32)
    return out


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize(
    ("n_in", "H", "direction"),
    [(7, 17, "forward"), (300, 3, "reverse"), (17, 260, "bidirectional"), (300, 17, "bidirectional")],
)
def test_lstm_becomes_ort_lstm_bit_exact_with_onnxruntime(backend, n_in, H, direction):
    proto = lstm_proto(n_in, H, direction)
    f = lstm_feeds(proto)
    want = ort_run(proto, f)
    sess = InferenceSession(proto, backend=backend)  # float_functions "auto": ORT's quantizer wrote it
    assert [n.op_type for n in sess.model.graph.nodes] == ["OrtLSTM"]
    assert sess.fallbacks == [] or backend == "reference"
    got = sess.run(None, f)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w, g)
    # the row of length 0 keeps zeros and its initial state is not its Y_h
    assert not got[0][:, :, 0].any() and not got[1][:, 0].any()
    # quanta's own LSTM (ONNX's functions, no FMA) is not ORT's computation in the last bits
    plain = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend=backend).run(None, f)
    assert any(not np.array_equal(w, g) for w, g in zip(want, plain, strict=True))
    assert max(float(np.abs(w - g).max()) for w, g in zip(want, plain, strict=True)) < 1e-4


def test_lstm_with_other_activations_is_left_with_its_reason():
    proto = lstm_proto(7, 5, "forward", activations=["Sigmoid", "Tanh", "Relu"])
    model = load(proto)
    p = OrtFloatFunctions()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("LstmToOrtLstm")] == [
        "LSTM has activations ['Sigmoid', 'Tanh', 'Relu'], not ORT's MLAS defaults"
    ]


def test_ort_lstm_native_kernel_matches_its_twin_at_every_thread_count():
    from quanta.kernels.reference.ort_float import ort_lstm_op
    from quanta.kernels.reference.registry import OpContext

    proto = lstm_proto(300, 17, "bidirectional")
    f = lstm_feeds(proto)
    inits = {i.name: numpy_helper.to_array(i) for i in proto.graph.initializer}
    ctx = OpContext(op_type="OrtLSTM", n_outputs=3)
    want = ort_lstm_op(
        ctx,
        f["x"],
        inits["W"],
        inits["R"],
        inits["Bias"],
        inits["lens"],
        f["h0"],
        f["c0"],
        inits["P"],
        hidden_size=17,
        direction="bidirectional",
    )
    for threads in (1, 2):
        so = SessionOptions()
        so.intra_op_num_threads = threads
        got = InferenceSession(proto, so).run(None, f)
        for w, g in zip(want, got, strict=True):
            assert np.array_equal(w, g)


def small_lstm_proto(n_in: int, H: int, T: int, B: int, direction: str, lens: bool):
    """One LSTM at the sizes of madmom's beat tracker (H = 25, 266 or 50 inputs, hundreds of
    steps) and around them: bias, peepholes and initial states; sequence_lens (lengths T,
    1 and in between) when ``lens``. n_in = 266 makes X·Wᵀ two blocks of MLAS's 256 k;
    T·B >= 4 runs X·Wᵀ in the four-row blocks of seq_gemm_mlas, the rest row by row."""
    rng = np.random.default_rng(n_in * 1000 + H * 10 + T)
    D = 2 if direction == "bidirectional" else 1
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, 4 * H, n_in)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((D, 4 * H, H)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((D, 8 * H)) * 0.5).astype(np.float32), "Bias"),
        numpy_helper.from_array((rng.standard_normal((D, 3 * H)) * 0.5).astype(np.float32), "P"),
    ]
    seq = ""
    if lens:
        inits.append(numpy_helper.from_array(np.array([T, 1, max(1, T // 2)][:B], np.int32), "lens"))
        seq = "lens"
    node = helper.make_node(
        "LSTM",
        ["x", "W", "R", "Bias", seq, "h0", "c0", "P"],
        ["y", "yh", "yc"],
        hidden_size=H,
        direction=direction,
    )
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, n_in]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [D, B, H]),
            helper.make_tensor_value_info("c0", TensorProto.FLOAT, [D, B, H]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, D, B, H]),
            helper.make_tensor_value_info("yh", TensorProto.FLOAT, [D, B, H]),
            helper.make_tensor_value_info("yc", TensorProto.FLOAT, [D, B, H]),
        ],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("n_in", "H", "T", "B", "direction", "lens"),
    [
        (266, 25, 40, 1, "forward", False),
        (50, 25, 40, 1, "reverse", False),
        (266, 7, 3, 1, "bidirectional", False),
        (13, 67, 1, 1, "forward", False),
        (266, 25, 3, 3, "bidirectional", True),
        (50, 67, 40, 2, "bidirectional", True),
        (5, 7, 9, 3, "reverse", True),
        # batch 1 past two panels (seq_row_panels): X·Wᵀ of one row over 300 inputs (two
        # MLAS k blocks), the recurrence's 520 columns (33 vectors: chunks of 24 and 9)
        (300, 130, 2, 1, "bidirectional", False),
    ],
)
def test_ort_lstm_at_small_sizes_is_onnxruntime_bit_for_bit_on_every_isa(n_in, H, T, B, direction, lens):
    from quanta.kernels import _native

    proto = small_lstm_proto(n_in, H, T, B, direction, lens)
    f = lstm_feeds(proto)
    want = ort_run(proto, f)
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                so = SessionOptions(float_functions="ort")
                so.intra_op_num_threads = threads
                sess = InferenceSession(proto, so)
                assert [n.op_type for n in sess.model.graph.nodes] == ["OrtLSTM"] and sess.fallbacks == []
                got = sess.run(None, f)
                for name, w, g in zip(("Y", "Y_h", "Y_c"), want, got, strict=True):
                    assert np.array_equal(w.view(np.uint32), g.view(np.uint32)), (
                        f"{isa}, {threads} threads: {name}"
                    )
    finally:
        _native.clear_isa()
    ref = InferenceSession(proto, SessionOptions(float_functions="ort"), backend="reference").run(None, f)
    for w, g in zip(want, ref, strict=True):
        assert np.array_equal(w.view(np.uint32), g.view(np.uint32))


def rnn_rows_proto(op: str, n_in: int, H: int, T: int, B: int, direction: str, lbr: int):
    """One LSTM / GRU with bias, initial states and ragged sequence_lens (0, 1, T and in
    between when B > 1) for the AVX-512 product blocks of seq_gemm_simd.h."""
    rng = np.random.default_rng(n_in * 7919 + H * 31 + T * 7 + B)
    D = 2 if direction == "bidirectional" else 1
    G = 4 if op == "LSTM" else 3
    lens = [T] if B == 1 else [(T, 0, 1, T - 1, max(1, T // 2))[b % 5] for b in range(B)]
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, G * H, n_in)) * 0.2).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((D, G * H, H)) * 0.2).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((D, 2 * G * H)) * 0.5).astype(np.float32), "Bias"),
        numpy_helper.from_array(np.array(lens, np.int32), "lens"),
    ]
    states = [helper.make_tensor_value_info("h0", TensorProto.FLOAT, [D, B, H])]
    outs = ["y", "yh"]
    attrs: dict = {"hidden_size": H, "direction": direction}
    ins = ["x", "W", "R", "Bias", "lens", "h0"]
    if op == "LSTM":
        states.append(helper.make_tensor_value_info("c0", TensorProto.FLOAT, [D, B, H]))
        ins.append("c0")
        outs.append("yc")
    else:
        attrs["linear_before_reset"] = lbr
    node = helper.make_node(op, ins, outs, **attrs)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, n_in]), *states],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("op", "n_in", "H", "T", "B", "direction", "lbr"),
    [
        # batch 1 (seq_row_panels: every vector of a product in one k loop, chunks of whole
        # panels): pyfrspell's encoder, z r 320 columns (20 vectors), h 160 (10)
        ("GRU", 80, 160, 9, 1, "bidirectional", 1),
        # z r 400 columns: 25 vectors, a chunk of 16 and one of 9; X·Wᵀ two MLAS k blocks
        ("GRU", 300, 200, 3, 1, "forward", 0),
        # 4·260 = 1040 columns: 65 vectors (24 + 24 + 17), H·Rᵀ two MLAS k blocks
        ("LSTM", 266, 260, 2, 1, "reverse", 0),
        # 4·7 = 28 columns: one short chunk of 2 vectors
        ("LSTM", 5, 7, 4, 1, "forward", 0),
        # six rows and more (rows_mlas: blocks of 12 rows or fewer, equal to a row, × 32
        # columns): batch 13 (7 + 6 rows), 4·17 = 68 columns (32 + 32 + 4: one vector)
        ("LSTM", 61, 17, 4, 13, "bidirectional", 0),
        # oskut_ws's batch 42 (four blocks of 10-11 rows), z r 50 columns (32 + 18)
        ("GRU", 7, 25, 3, 42, "forward", 1),
        # batch 6, H·Rᵀ over 260 k (two MLAS blocks); 3·260 = 780 columns (24 blocks + 12)
        ("GRU", 13, 260, 2, 6, "reverse", 0),
        # batch 6 exactly (rows_mlas' smallest), 4·7 = 28 columns (two vectors, the second
        # short); X·Wᵀ over 300 k
        ("LSTM", 300, 7, 3, 6, "forward", 0),
    ],
)
def test_ort_rnn_product_blocks_are_onnxruntime_bit_for_bit_on_every_isa(op, n_in, H, T, B, direction, lbr):
    """OrtLSTM / OrtGRU at the shapes of the AVX-512 product blocks (batch 1: one k loop
    over up to 24 vectors of the panels; six rows and more: 12-row × 32-column blocks) and
    around them: ONNX Runtime's bytes on every ISA at 1 and 2 threads, and the twin's."""
    from quanta.kernels import _native

    proto = rnn_rows_proto(op, n_in, H, T, B, direction, lbr)
    f = lstm_feeds(proto)
    want = ort_run(proto, f)
    kind = "OrtLSTM" if op == "LSTM" else "OrtGRU"
    try:
        for isa in _native.supported_isas():
            _native.set_isa(isa)
            for threads in (1, 2):
                so = SessionOptions(float_functions="ort")
                so.intra_op_num_threads = threads
                sess = InferenceSession(proto, so)
                assert [n.op_type for n in sess.model.graph.nodes] == [kind] and sess.fallbacks == []
                got = sess.run(None, f)
                assert len(got) == len(want)
                for name, w, g in zip(("Y", "Y_h", "Y_c"), want, got, strict=False):
                    assert np.array_equal(w.view(np.uint32), g.view(np.uint32)), (
                        f"{isa}, {threads} threads: {name}"
                    )
    finally:
        _native.clear_isa()
    ref = InferenceSession(proto, SessionOptions(float_functions="ort"), backend="reference").run(None, f)
    for w, g in zip(want, ref, strict=True):
        assert np.array_equal(w.view(np.uint32), g.view(np.uint32))


# --- GRU: ONNX Runtime's float GRU (GruToOrtGru, quanta::OrtGRU) -------------------------


def gru_proto(n_in: int, H: int, direction: str, lbr: int, bias: bool = True, activations=None):
    """One GRU as ORT's quantize_dynamic leaves it (producer onnx.quantize): sequence_lens
    with a row of length 0, a short one and a full one, an initial state, Y and Y_h graph
    outputs. n_in = 300 makes X·Wᵀ two blocks of MLAS's 256 k, H = 260 makes H·Rᵀ two."""
    rng = np.random.default_rng(n_in + H + lbr)
    D = 2 if direction == "bidirectional" else 1
    T, B = 5, 3
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, 3 * H, n_in)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((D, 3 * H, H)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array(np.array([0, 3, T], np.int32), "lens"),
    ]
    if bias:
        inits.append(
            numpy_helper.from_array((rng.standard_normal((D, 6 * H)) * 0.5).astype(np.float32), "Bias")
        )
    attrs = {"hidden_size": H, "direction": direction, "linear_before_reset": lbr}
    if activations:
        attrs["activations"] = activations
    node = helper.make_node(
        "GRU", ["x", "W", "R", "Bias" if bias else "", "lens", "h0"], ["y", "yh"], name="gru", **attrs
    )
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, n_in]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [D, B, H]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, D, B, H]),
            helper.make_tensor_value_info("yh", TensorProto.FLOAT, [D, B, H]),
        ],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.producer_name = "onnx.quantize"
    return m


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize(
    ("n_in", "H", "direction", "lbr", "bias"),
    [
        (7, 17, "forward", 1, True),
        (7, 17, "forward", 0, True),
        (300, 3, "reverse", 1, True),
        (17, 260, "bidirectional", 0, True),
        (300, 17, "bidirectional", 1, False),
        (9, 7, "forward", 0, False),
    ],
)
def test_gru_becomes_ort_gru_bit_exact_with_onnxruntime(backend, n_in, H, direction, lbr, bias):
    proto = gru_proto(n_in, H, direction, lbr, bias)
    f = lstm_feeds(proto)
    want = ort_run(proto, f)
    sess = InferenceSession(proto, backend=backend)  # float_functions "auto": ORT's quantizer wrote it
    assert [n.op_type for n in sess.model.graph.nodes] == ["OrtGRU"]
    assert sess.fallbacks == [] or backend == "reference"
    got = sess.run(None, f)
    for w, g in zip(want, got, strict=True):
        assert np.array_equal(w, g)
    assert not got[0][:, :, 0].any() and not got[1][:, 0].any()  # the row of length 0
    # quanta's own GRU (ONNX's functions, no FMA) is not ORT's computation in the last bits
    plain = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend=backend).run(None, f)
    assert any(not np.array_equal(w, g) for w, g in zip(want, plain, strict=True))
    assert max(float(np.abs(w - g).max()) for w, g in zip(want, plain, strict=True)) < 1e-4


def test_gru_with_other_activations_is_left_with_its_reason():
    proto = gru_proto(7, 5, "forward", 1, activations=["Sigmoid", "Relu"])
    model = load(proto)
    p = OrtFloatFunctions()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("GruToOrtGru")] == [
        "GRU has activations ['Sigmoid', 'Relu'], not ORT's MLAS defaults"
    ]


def test_ort_gates_of_the_gru_are_orts_rational_functions():
    """deepcpu_sigmoid / deepcpu_tanh at their clamps, at 0 and on NaN (kept, as ORT's
    clamp keeps it)."""
    from quanta.kernels.reference.rnn import deepcpu_sigmoid, deepcpu_tanh

    x = np.array([-40.0, -20.0, 0.0, 1e-3, 10.0, 40.0, np.nan], np.float32)
    s, t = deepcpu_sigmoid(x), deepcpu_tanh(x)
    assert s[2] == 0.5 and t[2] == 0.0
    assert s[0] == s[1] and s[-2] == deepcpu_sigmoid(np.float32([20.0]))[0]
    assert t[-2] == t[-3] and abs(float(t[-2]) - 1.0) < 1e-6
    assert np.isnan(s[-1]) and np.isnan(t[-1])
    xs = np.linspace(-8, 8, 1001, dtype=np.float32)
    assert np.max(np.abs(deepcpu_tanh(xs) - np.tanh(xs.astype(np.float64)))) < 1e-5


def qdq_conv_proto(x_type: int, *, bn: bool = False, producer: str = "onnx.quantize"):
    """DQ(x) -> Conv(DQ(w), DQ(b)) [-> Mul -> Add] -> Q -> DQ -> Conv -> Q: two Conv groups
    with 17 input channels, K = 153 (two K blocks at N >= K), distinct scales, nonzero
    activation zero points."""
    rng = np.random.default_rng(3)
    np_x = np.int8 if x_type == TensorProto.INT8 else np.uint8
    zx = np.array(5 if np_x is np.int8 else 131, np_x)
    # 7-bit weights (ORT's reduce_range): its fused u8 x s8 kernel on AVX2 sums pairs of
    # products in int16 (vpmaddubsw), which full-range weights can saturate
    w1 = rng.integers(-63, 64, (24, 17, 3, 3)).astype(np.int8)
    w2 = rng.integers(-127, 128, (7, 24, 3, 3)).astype(np.int8)
    sw1 = rng.uniform(0.002, 0.004, 24).astype(np.float32)
    inits = [
        numpy_helper.from_array(np.array(0.0213, np.float32), "sx"),
        numpy_helper.from_array(zx, "zx"),
        numpy_helper.from_array(w1, "w1q"),
        numpy_helper.from_array(sw1, "sw1"),
        numpy_helper.from_array(np.zeros(24, np.int8), "zw1"),
        numpy_helper.from_array(w2, "w2q"),
        numpy_helper.from_array(np.array(0.0031, np.float32), "sw2"),
        numpy_helper.from_array(np.array(0, np.int8), "zw2"),
        numpy_helper.from_array(rng.integers(-900, 900, 24).astype(np.int32), "b1q"),
        # the bias scale sx·sw in float32, as ORT's quantizer writes it (ORT refuses to fuse
        # a bias whose scale is far from it)
        numpy_helper.from_array(np.float32(0.0213) * sw1, "sb1"),
        numpy_helper.from_array(np.array(0.047, np.float32), "sy"),
        numpy_helper.from_array(np.array(-3 if np_x is np.int8 else 121, np_x), "zy"),
        numpy_helper.from_array(np.array(0.19, np.float32), "sz"),
        numpy_helper.from_array(np.array(2 if np_x is np.int8 else 128, np_x), "zz"),
        numpy_helper.from_array(rng.uniform(0.5, 1.5, (1, 24, 1, 1)).astype(np.float32), "a"),
        numpy_helper.from_array(rng.uniform(-0.5, 0.5, (1, 24, 1, 1)).astype(np.float32), "c"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"]),
        helper.make_node("DequantizeLinear", ["w1q", "sw1", "zw1"], ["w1"], axis=0),
        helper.make_node("DequantizeLinear", ["b1q", "sb1"], ["b1"], axis=0),
        helper.make_node("Conv", ["xd", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1], name="conv1"),
    ]
    if bn:
        nodes += [helper.make_node("Mul", ["c1", "a"], ["m1"]), helper.make_node("Add", ["m1", "c"], ["y1"])]
    nodes += [
        helper.make_node("QuantizeLinear", ["y1" if bn else "c1", "sy", "zy"], ["y1q"]),
        helper.make_node("DequantizeLinear", ["y1q", "sy", "zy"], ["y1d"]),
        helper.make_node("DequantizeLinear", ["w2q", "sw2", "zw2"], ["w2"]),
        helper.make_node("Conv", ["y1d", "w2"], ["c2"], strides=[2, 2], name="conv2"),
        helper.make_node("QuantizeLinear", ["c2", "sz", "zz"], ["y"]),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 17, 61, 53])],
        [helper.make_tensor_value_info("y", x_type, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    m.producer_name = producer
    return m


def conv_feed():
    return {"x": (np.random.default_rng(8).standard_normal((1, 17, 61, 53)) * 1.3).astype(np.float32)}


@pytest.mark.parametrize("bn", [False, True])
def test_int8_conv_groups_become_mlas_conv_and_match_onnxruntime_codes(bn):
    """ORT leaves int8-activation Conv groups (and a Conv followed by a per-channel
    Mul / Add, a folded BatchNormalization) float on x86 unless their Q -> DQ pairs are
    lone ones it makes uint8: with float_functions="ort" the file's codes are ORT's, every
    one."""
    proto = qdq_conv_proto(TensorProto.INT8, bn=bn)
    model = load(proto)
    p = OrtFloatFunctions(threads=2)
    run_passes(model, [p])
    ops = [n.op_type for n in model.graph.nodes]
    # conv1 without the Mul / Add: its int8 pairs are lone Q -> DQ pairs, which ORT's
    # QDQS8ToU8Transformer makes uint8, so ORT fuses it; conv2's codes are the graph output
    assert ops.count("MlasConv") == (2 if bn else 1)
    assert ops.count("Conv") == (0 if bn else 1)
    want = ort_run(proto, conv_feed())[0]
    so = SessionOptions(float_functions="ort")
    so.intra_op_num_threads = 2
    got = InferenceSession(proto.SerializeToString(), so).run(None, conv_feed())[0]
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("modelled_host", [True, False], ids=["fma3-host", "other-host"])
@pytest.mark.parametrize("producer", ["onnx.quantize", "quanta"])
def test_auto_takes_orts_float_conv_order_only_on_onnxruntimes_file(producer, modelled_host, monkeypatch):
    """Failure signature: the default session on a file ORT's quantizer wrote rounds its
    float Conv groups' exact sums where ORT rounds MLAS's FMA chains (nudenet_320n's ORT
    files: 12-16 output steps from ORT), or takes ORT's order on a file ORT did not write,
    or on a host whose ORT runs another SGEMM (AVX-512F), where the twin is not ORT.
    "auto" runs the groups ORT leaves float as MlasConv exactly when the file is ORT's, the
    host's ORT SGEMM is the modelled one and session.AUTO_FLOAT_ORDERS has "conv"; its
    codes then equal ORT's (on this host); otherwise it keeps the exact integer sum, the
    reference target's codes."""
    from quanta.quantize import ort_saturation
    from quanta.session import AUTO_FLOAT_ORDERS

    if not modelled_host:  # what an AVX-512F host reports
        monkeypatch.setattr(ort_saturation, "onnxruntime_float_orders_modelled", lambda: False)
    elif not ort_saturation.onnxruntime_float_orders_modelled():
        pytest.skip("this host's ORT SGEMM is not MLAS's FMA3 kernel the twins model")
    proto = qdq_conv_proto(TensorProto.INT8, bn=True, producer=producer).SerializeToString()

    def session(option, backend="native"):
        so = SessionOptions(float_functions=option, enable_profiling=True)
        so.intra_op_num_threads = 2
        return InferenceSession(proto, so, backend=backend)

    auto, ort = session("auto"), session("ort")
    got = auto.run(None, conv_feed())[0]
    ort.run(None, conv_feed())
    ops = {
        name: [st.op_type for st in s.profile_summary(top=1000).steps]
        for name, s in (("auto", auto), ("ort", ort))
    }
    assert ops["ort"].count("MlasConv") == 2
    takes = producer == "onnx.quantize" and modelled_host and "conv" in AUTO_FLOAT_ORDERS
    assert ops["auto"].count("MlasConv") == (2 if takes else 0)
    if takes:
        np.testing.assert_array_equal(got, ort_run(qdq_conv_proto(TensorProto.INT8, bn=True), conv_feed())[0])
    else:
        ref = session("auto", backend="reference").run(None, conv_feed())[0]
        np.testing.assert_array_equal(got, ref)


def test_orders_choose_which_of_orts_float_orders_the_pass_takes():
    """``orders`` without "conv" leaves the float Conv groups to quanta's exact arithmetic
    (the other orders still run); an unknown order is an error naming it and the known
    ones. Incorrect: ``orders={"gemm"}``; correct: ``orders={"matmul"}``."""
    model = load(qdq_conv_proto(TensorProto.INT8, bn=True))
    run_passes(model, [OrtFloatFunctions(threads=2, orders=frozenset({"matmul", "pool"}))])
    assert [n.op_type for n in model.graph.nodes].count("MlasConv") == 0
    model = load(qdq_conv_proto(TensorProto.INT8, bn=True))
    run_passes(model, [OrtFloatFunctions(threads=2, orders=frozenset({"conv"}))])
    assert [n.op_type for n in model.graph.nodes].count("MlasConv") == 2
    with pytest.raises(ValueError) as e:
        OrtFloatFunctions(threads=2, orders=frozenset({"gemm"}))
    assert str(e.value) == (
        "OrtFloatFunctions: unknown float orders ['gemm']; expected ['conv', 'matmul', 'pool']"
    )


@pytest.mark.parametrize("option", ["auto", "ort"])
def test_session_ort_float_orders_without_conv_keeps_exact_sums_and_orts_integer_groups(option):
    """Failure signature: ``SessionOptions.ort_float_orders`` without "conv" still runs the
    Conv groups ORT leaves float as MlasConv (a TensorRT-style file stays at the float
    Conv's cost), or drops ORT's other arithmetic with it (its saturating u8·s8 groups:
    EfficientNet-Lite0's TensorRT-style file 42 output steps from ORT instead of 3), or the
    native target's codes leave the reference target's. The file: an int8 group ORT fuses
    (conv1, lone Q -> DQ pairs, 24 channels, K = 153) and one it leaves float (conv2, whose
    codes are the graph output, 7 channels, K = 216), distinct scales, nonzero zero points."""
    from quanta.quantize.ort_saturation import onnxruntime_float_orders_modelled, onnxruntime_int8_saturates

    if option == "auto" and not onnxruntime_float_orders_modelled():
        pytest.skip("'auto' takes no float order on this host: the option is moot")
    proto = qdq_conv_proto(TensorProto.INT8).SerializeToString()

    def session(orders, backend="native"):
        so = SessionOptions(float_functions=option, ort_float_orders=orders, enable_profiling=True)
        so.intra_op_num_threads = 2
        return InferenceSession(proto, so, backend=backend)

    mixed, full = session(frozenset({"matmul", "pool"})), session(None)
    got = mixed.run(None, conv_feed())[0]
    full.run(None, conv_feed())
    ops = {
        name: [st.op_type for st in s.profile_summary(top=1000).steps]
        for name, s in (("mixed", mixed), ("full", full))
    }
    assert ops["full"].count("MlasConv") == 1 and ops["mixed"].count("MlasConv") == 0
    if onnxruntime_int8_saturates():  # ORT's fused int8 group keeps its saturating pairs
        assert "MlasQLinearConv" in ops["mixed"]
    ref = session(frozenset({"matmul", "pool"}), backend="reference").run(None, conv_feed())[0]
    np.testing.assert_array_equal(got, ref)
    # the float group's exact sum, what float_functions="onnx" computes (conv1's 7-bit
    # weights keep ORT's int16 pairs exact, so the fused group agrees too)
    onnx_codes = InferenceSession(proto, SessionOptions(float_functions="onnx")).run(None, conv_feed())[0]
    np.testing.assert_array_equal(got, onnx_codes)


def test_session_rejects_an_unknown_ort_float_order():
    """An unknown order is an error naming it and the known ones, on every file and host.
    Incorrect: ``ort_float_orders={"gemm"}``; correct: ``{"matmul"}``."""
    proto = qdq_conv_proto(TensorProto.INT8, producer="quanta").SerializeToString()
    with pytest.raises(ValueError) as e:
        InferenceSession(proto, SessionOptions(ort_float_orders=frozenset({"gemm", "conv"})))
    assert str(e.value) == (
        "SessionOptions.ort_float_orders: unknown orders ['gemm']; expected a subset of ['conv', 'matmul', 'pool']"
    )


def test_uint8_conv_group_that_onnxruntime_fuses_keeps_integer_arithmetic():
    """x and y uint8, int8 weights, int32 bias, the Conv's only use a QuantizeLinear: ORT
    runs QLinearConv, which quanta's exact integer path equals."""
    model = load(qdq_conv_proto(TensorProto.UINT8))
    p = OrtFloatFunctions(threads=2)
    run_passes(model, [p])
    assert [n.op_type for n in model.graph.nodes].count("MlasConv") == 0
    reasons = {r.reason for r in p.why_not("ConvToMlasConv")}
    assert reasons == {
        "ONNX Runtime fuses this group into QLinearConv (uint8 activations): integer arithmetic"
    }


def test_conv_rule_runs_only_with_a_thread_count():
    """OrtFloatFunctions() (no thread count) leaves Conv groups to quanta's exact path."""
    model = load(qdq_conv_proto(TensorProto.INT8))
    run_passes(model, [OrtFloatFunctions()])
    assert "MlasConv" not in [n.op_type for n in model.graph.nodes]


def float_conv1d_proto(rank: int = 1, producer: str = "onnx.quantize"):
    """The float front of a transformer block as ORT's ``quantize_dynamic`` leaves it (a
    TTS text encoder: Transpose -> depthwise Conv1d -> Conv1d), weights float32 constants:
    x [1, 301, 17] -> a depthwise Conv (group 17, kernel 5, pads 2, bias) -> a Conv of 7
    filters over 17 channels x 17 taps (K = 289), stride 2, pads 8. ``rank=2``: the same
    as 2-D Convs over [1, 17, 1, 301]."""
    rng = np.random.default_rng(29)
    lead = [1] * (rank - 1)
    inits = [
        numpy_helper.from_array(rng.standard_normal([17, 1, *lead, 5]).astype(np.float32) * 0.4, "w1"),
        numpy_helper.from_array(rng.uniform(-0.3, 0.3, 17).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.standard_normal([7, 17, *lead, 17]).astype(np.float32) * 0.1, "w2"),
    ]
    pad1, pad2 = [0] * (rank - 1) + [2], [0] * (rank - 1) + [8]
    nodes = [
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 2, 1]),
        helper.make_node("Reshape", ["xt", "shape"], ["xr"]) if rank == 2 else None,
        helper.make_node(
            "Conv", ["xr" if rank == 2 else "xt", "w1", "b1"], ["dw"], group=17, pads=pad1 * 2, name="dw"
        ),
        helper.make_node(
            "Conv", ["dw", "w2"], ["y"], strides=[1] * (rank - 1) + [2], pads=pad2 * 2, name="pw"
        ),
    ]
    if rank == 2:
        inits.append(numpy_helper.from_array(np.array([1, 17, 1, 301], np.int64), "shape"))
    g = helper.make_graph(
        [n for n in nodes if n is not None],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 301, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.producer_name = producer
    return m


def conv1d_feed():
    return {"x": (np.random.default_rng(30).standard_normal((1, 301, 17)) * 2.1).astype(np.float32)}


@pytest.mark.parametrize("threads", [1, 2])
def test_float_conv1d_with_constant_weight_becomes_mlas_conv_bit_exact_with_onnxruntime(threads):
    """Failure signature: a file ORT's ``quantize_dynamic`` wrote keeps its 1-D Convs float
    (float32 weights), and a DynamicQuantizeLinear after them picks its scale from their
    last bits: hibari's TTS (a depthwise Conv1d in each text-encoder block) ran with
    quanta's exact sums to 776 spectral frames where ORT made 778 (every output shape
    differed). ORT runs a 1-D float Conv as MlasConv in every optimization level (its NCHWc
    rewrite takes 4-D Convs only); the rule now rewrites such a Conv too, and the session
    equals ORT bit for bit, where ONNX's exact sum does not."""
    from quanta.quantize.ort_saturation import onnxruntime_float_orders_modelled

    proto = float_conv1d_proto()
    model = load(proto)
    run_passes(model, [OrtFloatFunctions(threads=threads)])
    assert [n.op_type for n in model.graph.nodes].count("MlasConv") == 2
    if not onnxruntime_float_orders_modelled():
        pytest.skip("this host's ORT SGEMM is not MLAS's FMA3 kernel the twins model")
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    want = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, conv1d_feed()
    )[0]
    for backend in ("native", "reference"):
        qso = SessionOptions(float_functions="auto")
        qso.intra_op_num_threads = threads
        got = InferenceSession(proto.SerializeToString(), qso, backend=backend).run(None, conv1d_feed())[0]
        np.testing.assert_array_equal(got, want)
    exact = InferenceSession(proto.SerializeToString(), SessionOptions(float_functions="onnx")).run(
        None, conv1d_feed()
    )[0]
    assert np.count_nonzero(exact != want) > 0  # the rewrite is what makes them equal


def test_float_2d_conv_is_left_with_its_reason():
    """A float 2-D Conv with a constant weight is ORT's NCHWc Conv after its optimizer
    (another order, not modelled): it keeps quanta's arithmetic, with the reason."""
    p = OrtFloatFunctions(threads=2)
    model = load(float_conv1d_proto(rank=2))
    run_passes(model, [p])
    assert "MlasConv" not in [n.op_type for n in model.graph.nodes]
    reasons = {r.reason for r in p.why_not("ConvToMlasConv")}
    assert reasons == {
        "x or w does not come from a DequantizeLinear (not a QDQ Conv group), and it is not a float "
        "1-D Conv with a constant float32 weight"
    }


def own_rnn_proto(op: str, n_in: int, H: int, direction: str, omit_y: bool):
    """A file ORT's quantizer did not write (producer "quanta-test"): an LSTM or GRU with
    bias and sequence lengths (0, 3, T), then a Sigmoid of its last output, which must
    keep ONNX's function; with omit_y the node's Y is "" (the importer's untyped private
    name)."""
    rng = np.random.default_rng(n_in * 31 + H)
    D = 2 if direction == "bidirectional" else 1
    G = 4 if op == "LSTM" else 3
    T, B = 7, 3
    inits = [
        numpy_helper.from_array((rng.standard_normal((D, G * H, n_in)) * 0.3).astype(np.float32), "W"),
        numpy_helper.from_array((rng.standard_normal((D, G * H, H)) * 0.3).astype(np.float32), "R"),
        numpy_helper.from_array((rng.standard_normal((D, 2 * G * H)) * 0.5).astype(np.float32), "Bias"),
        numpy_helper.from_array(np.array([0, 3, T], np.int32), "lens"),
    ]
    outs = ["" if omit_y else "y", "yh"]
    node = helper.make_node(
        op, ["x", "W", "R", "Bias", "lens"], outs, name="rnn", hidden_size=H, direction=direction
    )
    sig = helper.make_node("Sigmoid", ["yh"], ["s"], name="sig")
    outputs = [
        helper.make_tensor_value_info("yh", TensorProto.FLOAT, [D, B, H]),
        helper.make_tensor_value_info("s", TensorProto.FLOAT, [D, B, H]),
    ]
    if not omit_y:
        outputs.insert(0, helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, D, B, H]))
    g = helper.make_graph(
        [node, sig],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, n_in])],
        outputs,
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    m.producer_name = "quanta-test"
    return m


@pytest.mark.parametrize("backend", ["native", "reference"])
@pytest.mark.parametrize(
    ("op", "n_in", "H", "direction", "omit_y"),
    [
        ("LSTM", 7, 17, "forward", False),
        ("LSTM", 300, 3, "bidirectional", True),
        ("GRU", 17, 7, "reverse", False),
        ("GRU", 300, 17, "bidirectional", True),
    ],
)
def test_auto_runs_every_files_lstm_and_gru_in_orts_order(backend, op, n_in, H, direction, omit_y):
    """docs/float-ops.md (RO1): "auto" on any file takes ORT's recurrent order (ORT's bytes)
    and leaves ONNX's other functions; "onnx" keeps (RNN1)-(RNN9), a few ulp away."""
    proto = own_rnn_proto(op, n_in, H, direction, omit_y)
    f = lstm_feeds(proto)
    ort_out = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, f)
    for threads in (1, 2):
        so = SessionOptions()
        so.intra_op_num_threads = threads
        sess = InferenceSession(proto, so, backend=backend)
        assert [n.op_type for n in sess.model.graph.nodes] == [f"Ort{op}", "Sigmoid"]
        assert sess.fallbacks == [] or backend == "reference"
        got = sess.run(None, f)
        rnn_outputs = got[:-1]
        for w, g in zip(ort_out[:-1], rnn_outputs, strict=True):
            assert np.array_equal(w, g)
    plain_sess = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend=backend)
    assert [n.op_type for n in plain_sess.model.graph.nodes] == [op, "Sigmoid"]
    plain = plain_sess.run(None, f)
    # (RNN1) is not ORT's order in the last bits, and a few ulp from it
    assert any(not np.array_equal(p, g) for p, g in zip(plain[:-1], got[:-1], strict=True))
    assert max(float(np.abs(p - g).max()) for p, g in zip(plain, got, strict=True)) < 1e-4
    # the Sigmoid stays ONNX's (SigmoidToMlasLogistic is not run): quanta's sigmoid of the
    # ORT-order Y_h, through the "onnx" session's Sigmoid on the same values
    sig_only = helper.make_model(
        helper.make_graph(
            [helper.make_node("Sigmoid", ["v"], ["s"])],
            "s",
            [helper.make_tensor_value_info("v", TensorProto.FLOAT, list(got[-2].shape))],
            [helper.make_tensor_value_info("s", TensorProto.FLOAT, list(got[-2].shape))],
        ),
        opset_imports=[helper.make_opsetid("", 17)],
    )
    want_s = InferenceSession(sig_only, SessionOptions(float_functions="onnx"), backend=backend).run(
        None, {"v": got[-2]}
    )
    assert np.array_equal(want_s[0], got[-1])
