"""quanta::DynamicQuantizeGRU as files carry it: its ONNX function (quantize/dq_gru_function.py)
run by ONNX Runtime gives the twin's bytes (reference/dq_gru.py), and quantize_static /
quantize_dynamic write GRUs in that form, which ONNX Runtime and quanta both run.

Why the body is bit-exact in ONNX Runtime: DynamicQuantizeLinear is (DQG1) (ORT's
GetQuantizationParameter and MlasQuantizeLinear), MatMulInteger an exact int32 sum,
Cast and Mul the two float32 roundings of (DQG2), ORT's Sigmoid and Tanh are MLAS's
logistic and tanh (the twin's), and the gates are float32 Add / Mul / Sub in the twin's
order. ORT runs with one intra-op thread (its DynamicQuantizeLinear's min / max does not
depend on threads either, but one thread is the configuration this pins).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels.reference.dq_gru import QUANTA_DOMAIN, dynamic_quantize_gru
from quanta.kernels.reference.rnn import gru as float_gru
from quanta.quantize.dq_gru_function import FUNCTION_INPUTS, OP_TYPE, GruForm, gru_function, overload_name
from quanta.quantize.recipe import RecipeError
from tests.ort_int8 import WEIGHT_BITS  # 7-bit weights where ORT saturates full-range ones
from tests.targets.test_native_dq_gru import assert_same, gru_inputs

F32 = np.float32


def _ort(model: onnx.ModelProto | str) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    data = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])


def _one_node_model(inputs, attrs, form: GruForm, opset: int) -> tuple[onnx.ModelProto, dict]:
    feeds = {n: a for n, a in zip(FUNCTION_INPUTS, inputs, strict=True) if a is not None}
    names = [n if n in feeds else "" for n in FUNCTION_INPUTS]
    fn = gru_function(form, opset)
    node = helper.make_node(OP_TYPE, names, ["Y", "Y_h"], domain=QUANTA_DOMAIN, overload=fn.overload, **attrs)
    graph = helper.make_graph(
        [node],
        "gru",
        [
            helper.make_tensor_value_info(k, helper.np_dtype_to_tensor_dtype(v.dtype), list(v.shape))
            for k, v in feeds.items()
        ],
        [
            helper.make_tensor_value_info("Y", TensorProto.FLOAT, [None] * 4),
            helper.make_tensor_value_info("Y_h", TensorProto.FLOAT, [None] * 3),
        ],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(QUANTA_DOMAIN, 1)],
        functions=[fn],
        ir_version=10,
    )
    onnx.checker.check_model(model, full_check=True)
    return model, feeds


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize(
    ("every_input", "weights", "scales", "B", "H", "clip", "opset"),
    [
        (True, "uint8", "column", 3, 17, None, 21),
        (False, "int8", "direction", 1, 7, None, 11),
        (True, "uint8_columns", "direction", 3, 7, 0.9, 13),
    ],
)
def test_ort_runs_the_function_with_the_twin_bytes(
    direction, lbr, every_input, weights, scales, B, H, clip, opset
):
    """B, sequence_lens (lengths 4, 0, 2: early ends and an empty row) and initial_h all
    given or all omitted; input size 300 (> 258); odd hidden sizes; clip binding."""
    rng = np.random.default_rng(7 + lbr)
    D = 2 if direction == "bidirectional" else 1
    lens = ([4, 0, 2][:B] if B == 3 else [3]) if every_input else None
    inputs = gru_inputs(
        rng,
        T=4,
        B=B,
        n_in=300,
        H=H,
        D=D,
        weights=weights,
        scales=scales,
        bias=every_input,
        lens=lens,
        h0=every_input,
        # int8 weights on the 7-bit grid: ONNX Runtime's MatMulInteger (u8 x s8) on a CPU
        # without VNNI sums product pairs in saturating int16 (docs/kernels.md "AVX2")
        int8_bits=7,
    )
    if clip is not None:
        inputs[3] = inputs[3] * F32(6)
    attrs = {"hidden_size": H, "direction": direction, "linear_before_reset": lbr}
    if clip is not None:
        attrs["clip"] = clip
    form = GruForm(H, direction, bool(lbr), clip, every_input, every_input, every_input)
    model, feeds = _one_node_model(inputs, attrs, form, opset)
    got = _ort(model).run(None, feeds)
    expected = dynamic_quantize_gru(*inputs, **attrs)
    assert np.abs(expected[1]).max() > 0.01
    assert_same(expected, tuple(got), f"ORT {direction} lbr={lbr}")


def test_overload_names_every_field_that_changes_the_body():
    base = GruForm(16)
    names = {
        overload_name(f)
        for f in (
            base,
            GruForm(17),
            GruForm(16, "reverse"),
            GruForm(16, linear_before_reset=True),
            GruForm(16, clip=1.5),
            GruForm(16, clip=1.25),
            GruForm(16, has_bias=True),
            GruForm(16, has_lens=True),
            GruForm(16, has_initial_h=True),
        )
    }
    assert len(names) == 9
    with pytest.raises(ValueError, match="opset >= 11"):
        gru_function(base, 10)


@pytest.mark.parametrize("lbr", [0, 1])
def test_twin_stays_close_to_the_float_gru(lbr):
    """The dynamic int8 GRU approximates the float GRU whose weights it quantized (a
    semantics check: gates, order z r h, both linear_before_reset, the bias split): h
    within 0.05 of the float h over 12 steps, errors far below the signal."""
    rng = np.random.default_rng(3)
    T, B, n_in, H = 12, 3, 40, 17
    x = rng.standard_normal((T, B, n_in)).astype(F32)
    w = (rng.standard_normal((1, 3 * H, n_in)) * 0.2).astype(F32)
    r = (rng.standard_normal((1, 3 * H, H)) * 0.3).astype(F32)
    b = (rng.standard_normal((1, 6 * H)) * 0.3).astype(F32)
    h0 = (rng.standard_normal((1, B, H)) * 0.5).astype(F32)
    lens = np.array([12, 5, 9], np.int32)

    def quantized(a):  # per gate column, symmetric int8: [1, 3H, K] -> [1, K, 3H] and scales [1, 3H]
        s = (np.abs(a).max(axis=2) / 127).astype(F32)
        q = np.clip(np.rint(a / s[:, :, None]), -127, 127).astype(np.int8)
        return np.ascontiguousarray(q.transpose(0, 2, 1)), s

    wq, ws = quantized(w)
    rq, rs = quantized(r)
    z = np.zeros((1, 3 * H), np.int8)
    got = dynamic_quantize_gru(x, wq, rq, b, lens, h0, ws, z, rs, z, hidden_size=H, linear_before_reset=lbr)
    want = float_gru(x, w, r, b, lens, h0, hidden_size=H, linear_before_reset=lbr)
    err = np.abs(got[0] - want[0]).max()
    assert err < 0.05 and np.abs(want[0]).max() > 0.5, err
    np.testing.assert_allclose(got[1], want[1], atol=0.05)
    assert not got[0][5:, 0, 1].any() and not got[0][9:, 0, 2].any()  # ended rows are 0 in Y


def gru_model(seed: int = 0, *, direction: str = "forward", lbr: int = 1, H: int = 17) -> onnx.ModelProto:
    """MatMul -> GRU (with B, initial_h) -> Y_h -> MatMul: a noise-suppression block at
    toy size (input 41 features, odd hidden size)."""
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    feat, n_in = 41, 23
    inits = [
        numpy_helper.from_array((rng.standard_normal((feat, n_in)) * 0.3).astype(F32), "fc_in"),
        numpy_helper.from_array((rng.standard_normal((D, 3 * H, n_in)) * 0.3).astype(F32), "W"),
        numpy_helper.from_array((rng.standard_normal((D, 3 * H, H)) * 0.3).astype(F32), "R"),
        numpy_helper.from_array((rng.standard_normal((D, 6 * H)) * 0.2).astype(F32), "B"),
        numpy_helper.from_array((rng.standard_normal((D * H, 7)) * 0.3).astype(F32), "fc_out"),
        numpy_helper.from_array(np.array([0, -1], np.int64), "flat"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "fc_in"], ["e"], name="fc_in"),
        helper.make_node(
            "GRU",
            ["e", "W", "R", "B", "", "h0"],
            ["y", "y_h"],
            name="gru",
            hidden_size=H,
            direction=direction,
            linear_before_reset=lbr,
        ),
        helper.make_node("Transpose", ["y_h"], ["yt"], perm=[1, 0, 2], name="batch_major"),
        helper.make_node("Reshape", ["yt", "flat"], ["yf"], name="flatten"),
        helper.make_node("MatMul", ["yf", "fc_out"], ["out"], name="fc_out"),
    ]
    graph = helper.make_graph(
        nodes,
        "gru_block",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [9, 1, feat]),
            helper.make_tensor_value_info("h0", TensorProto.FLOAT, [D, 1, H]),
        ],
        [
            helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 7]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [9, D, 1, H]),
        ],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int, seed: int, D: int = 1, H: int = 17):
    rng = np.random.default_rng(seed)
    return [
        {
            "x": rng.standard_normal((9, 1, 41)).astype(F32),
            "h0": (rng.standard_normal((D, 1, H)) * 0.3).astype(F32),
        }
        for _ in range(n)
    ]


@pytest.mark.parametrize(("direction", "lbr"), [("forward", 1), ("bidirectional", 0)])
def test_quantize_dynamic_writes_gru_as_dynamic_quantize_gru_that_ort_and_quanta_run(
    tmp_path, direction, lbr
):
    """The GRU becomes quanta::DynamicQuantizeGRU with int8 weights [D, K, 3H], per gate
    column scales, its overload and the function of that form in the file (IR 10); every
    MAC is integer; ONNX Runtime (the function body) and quanta (the native kernel) give
    the GRU's outputs bit for bit equal."""
    D = 2 if direction == "bidirectional" else 1
    src, out = tmp_path / "gru.onnx", tmp_path / "gru_dyn.onnx"
    onnx.save(gru_model(direction=direction, lbr=lbr), src)
    summary = quanta.quantize_dynamic(src, out, verbose=False, gru_min_step_macs=0, weight_bits=WEIGHT_BITS)
    assert ("gru", "GRU") in summary.quantized and summary.integer_share == 1.0
    proto = onnx.load(str(out))
    onnx.checker.check_model(proto, full_check=True)
    (node,) = [n for n in proto.graph.node if n.op_type == OP_TYPE]
    assert node.domain == QUANTA_DOMAIN and node.overload and proto.ir_version >= 10
    assert [(f.name, f.overload) for f in proto.functions] == [(OP_TYPE, node.overload)]
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    assert inits[node.input[1]].dtype == np.int8 and inits[node.input[1]].shape == (D, 23, 51)
    assert inits[node.input[6]].shape == (D, 51)
    sess = _ort(str(out))
    native = quanta.InferenceSession(str(out), backend="native")
    assert not [f for f in native.fallbacks if f[1] == OP_TYPE]  # the native kernel, not the body or twin
    for feeds in _feeds(3, seed=4, D=D):
        got = native.run(None, feeds)
        expected = sess.run(None, feeds)
        np.testing.assert_array_equal(got[1], expected[1])  # y: the GRU's own output
        np.testing.assert_allclose(got[0], expected[0], rtol=1e-5, atol=1e-5)


def test_quantize_static_writes_gru_dynamic_and_recurrent_float_keeps_it(tmp_path):
    src = tmp_path / "gru.onnx"
    onnx.save(gru_model(), src)
    dyn = quanta.quantize_static(
        src, tmp_path / "q.onnx", _feeds(4, seed=1), verbose=False, progress=False, gru_min_step_macs=0
    )
    assert ("gru", "GRU") in dyn.quantized and dyn.integer_share == 1.0
    assert OP_TYPE in {n.op_type for n in onnx.load(str(tmp_path / "q.onnx")).graph.node}
    kept = quanta.quantize_static(
        src, tmp_path / "f.onnx", _feeds(4, seed=1), verbose=False, progress=False, recurrent="float"
    )
    assert ("gru", "GRU", "the recipe keeps recurrent ops float (recurrent: float)") in kept.float_nodes
    assert kept.integer_share < 0.9
    assert not onnx.load(str(tmp_path / "f.onnx")).functions


def test_gru_with_other_activations_or_layout_stays_float_with_reason(tmp_path):
    model = gru_model()
    gru_node = next(n for n in model.graph.node if n.op_type == "GRU")
    gru_node.attribute.append(helper.make_attribute("activations", ["HardSigmoid", "Tanh"]))
    src = tmp_path / "gru_hs.onnx"
    onnx.save(model, src)
    s = quanta.quantize_dynamic(src, tmp_path / "o.onnx", verbose=False, gru_min_step_macs=0)
    (reason,) = [r for name, op, r in s.float_nodes if op == "GRU"]
    assert "activations" in reason and "Sigmoid, Tanh only" in reason


def test_a_gru_below_gru_min_step_macs_stays_float_with_its_size(tmp_path):
    """The default keeps a GRU whose step is under 2^19 multiply-adds float (its int8 form
    is slower there); its step size is the threshold's unit: 3H·(I + H) = 3·17·40 = 2040."""
    src = tmp_path / "gru.onnx"
    onnx.save(gru_model(), src)
    s = quanta.quantize_dynamic(src, tmp_path / "o.onnx", verbose=False)
    (reason,) = [r for name, op, r in s.float_nodes if op == "GRU"]
    assert "GRU step of 2040 multiply-adds (H = 17) is below gru_min_step_macs = 524288" in reason
    assert not onnx.load(str(tmp_path / "o.onnx")).functions
    at = quanta.quantize_dynamic(src, tmp_path / "o2.onnx", verbose=False, gru_min_step_macs=2040)
    assert ("gru", "GRU") in at.quantized
    with pytest.raises(RecipeError, match="gru_min_step_macs: expected an integer >= 0"):
        quanta.quantize_dynamic(src, tmp_path / "o3.onnx", verbose=False, gru_min_step_macs=-1)


def test_quanta_gru_file_quantized_again_goes_through_its_float_view(tmp_path):
    """A file with DynamicQuantizeGRU given to quantize_dynamic again: its float view has a
    GRU with the dequantized weights, which becomes DynamicQuantizeGRU once more; the
    result runs in ONNX Runtime."""
    src, once, twice = tmp_path / "gru.onnx", tmp_path / "once.onnx", tmp_path / "twice.onnx"
    onnx.save(gru_model(), src)
    quanta.quantize_dynamic(src, once, verbose=False, gru_min_step_macs=0)
    s = quanta.quantize_dynamic(once, twice, verbose=False, gru_min_step_macs=0)
    assert ("gru_quant", "GRU") in s.quantized and any("DynamicQuantizeGRU" in n for n in s.notes)
    proto = onnx.load(str(twice))
    assert [n.op_type for n in proto.graph.node].count(OP_TYPE) == 1 and len(proto.functions) == 1
    kept = quanta.quantize_dynamic(once, tmp_path / "kept.onnx", verbose=False, recurrent="float")
    assert ("gru_quant", "GRU", "the recipe keeps recurrent ops float (recurrent: float)") in kept.float_nodes
    assert not onnx.load(str(tmp_path / "kept.onnx")).functions  # the float GRU needs no body
    feeds = _feeds(1, seed=9)[0]
    np.testing.assert_allclose(
        _ort(str(twice)).run(None, feeds)[1], _ort(str(once)).run(None, feeds)[1], atol=0.02
    )


@pytest.mark.parametrize("lbr", [0, 1])
def test_ort_with_two_threads_and_large_blocks_gives_the_twin_bytes(lbr):
    """ORT's threaded min / max and products do not change a byte: a block's (lo, hi) do
    not depend on the order, the integer sums are exact, the rest is elementwise. H = 257,
    I = 400, 20 steps, bidirectional, lengths 20, 7, 13."""
    rng = np.random.default_rng(5 + lbr)
    H = 257
    inputs = gru_inputs(
        rng,
        T=20,
        B=3,
        n_in=400,
        H=H,
        D=2,
        weights="int8",
        scales="column",
        bias=True,
        lens=[20, 7, 13],
        h0=True,
        int8_bits=7,  # ORT's u8 x s8 products are exact on every CPU only there (docs/kernels.md "AVX2")
    )
    attrs = {"hidden_size": H, "direction": "bidirectional", "linear_before_reset": lbr}
    model, feeds = _one_node_model(
        inputs, attrs, GruForm(H, "bidirectional", bool(lbr), None, True, True, True), 17
    )
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    got = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    assert_same(dynamic_quantize_gru(*inputs, **attrs), tuple(got), "ORT, 2 threads")


def test_batch_first_gru_is_written_time_major_between_transposes(tmp_path):
    """layout = 1: the node is the time-major op between Transposes of X, initial_h, Y and
    Y_h; quanta and ONNX Runtime give the bytes of the same GRU written time-major."""
    m0, m1 = gru_model(direction="bidirectional", lbr=0), gru_model(direction="bidirectional", lbr=0)
    g = m1.graph
    gru_node = next(n for n in g.node if n.op_type == "GRU")
    gru_node.attribute.append(helper.make_attribute("layout", 1))
    gru_node.input[0], gru_node.input[5], gru_node.output[0], gru_node.output[1] = (
        "e_bf",
        "h0_bf",
        "y_bf",
        "y_h_bf",
    )
    at = list(g.node).index(gru_node)
    g.node.insert(at + 1, helper.make_node("Transpose", ["y_bf"], ["y"], perm=[1, 2, 0, 3]))
    g.node.insert(at + 1, helper.make_node("Transpose", ["y_h_bf"], ["y_h"], perm=[1, 0, 2]))
    g.node.insert(at, helper.make_node("Transpose", ["h0"], ["h0_bf"], perm=[1, 0, 2]))
    g.node.insert(at, helper.make_node("Transpose", ["e"], ["e_bf"], perm=[1, 0, 2]))
    outs = {}
    for name, m in (("tm", m0), ("bf", m1)):
        onnx.save(m, tmp_path / f"{name}.onnx")
        s = quanta.quantize_dynamic(
            tmp_path / f"{name}.onnx",
            tmp_path / f"{name}_q.onnx",
            verbose=False,
            gru_min_step_macs=0,
            weight_bits=WEIGHT_BITS,  # tests/ort_int8.py
        )
        assert s.integer_share == 1.0
        outs[name] = tmp_path / f"{name}_q.onnx"
    assert OP_TYPE in {n.op_type for n in onnx.load(str(outs["bf"])).graph.node}
    feeds = _feeds(1, seed=6, D=2)[0]
    want = quanta.InferenceSession(str(outs["tm"]), backend="native").run(None, feeds)
    got = quanta.InferenceSession(str(outs["bf"]), backend="native").run(None, feeds)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(_ort(str(outs["bf"])).run(None, feeds)[1], want[1])
