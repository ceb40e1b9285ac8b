"""quanta::LSTMGates: optimize_float fuses an exported LSTM cell's ten elementwise nodes
(passes/rules/fuse_lstm_gates.py); the twin (reference/rnn.py lstm_gates) gives the bytes
of the unfused nodes, the native kernel the twin's on every ISA, the specialized call the
generic one's."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.kernels import _native
from quanta.kernels.reference.registry import OpError
from quanta.kernels.reference.rnn import lstm_gates
from quanta.passes.rules.fuse_lstm_gates import FuseLSTMGates
from quanta.targets.base import KernelContext, Specialization
from quanta.targets.native import recurrent

F32 = np.float32
ISAS: list[str] = list(_native.supported_isas())
TORCH = (0, 1, 2, 3)


def _gates(rng, b: int, h: int, scale: float = 4.0) -> tuple[np.ndarray, np.ndarray]:
    g = (rng.standard_normal((b, 4 * h)) * scale).astype(F32)
    g.flat[:: max(1, g.size // 5)] = 0.0  # exact zeros: σ(0) and tanh's sign of zero
    c = (rng.standard_normal((b, h)) * 2).astype(F32)
    return g, c


@settings(max_examples=25, deadline=None)
@given(
    b=st.integers(1, 5),
    h=st.sampled_from([1, 3, 7, 17, 64, 100]),
    order=st.permutations(range(4)),
    seed=st.integers(0, 2**16),
)
def test_native_equals_twin_on_every_isa(b, h, order, seed) -> None:
    rng = np.random.default_rng(seed)
    g, c = _gates(rng, b, h)
    want = lstm_gates(None, g, c, order=order)
    ctx = KernelContext(num_threads=1)
    sig = Specialization(
        shapes=(g.shape, c.shape),
        dtypes=(g.dtype, c.dtype),
        consts=(None, None),
        out_shape=(b, h),
        out_dtype=g.dtype,
        out=None,
        num_threads=1,
        ctx=ctx,
    )
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            generic = recurrent._lstm_gates_native(ctx, g, c, order=order)
            fast = recurrent._lstm_gates_specialized(sig, order=order)(ctx, g, c)
            for got in (generic, fast):
                for x, y in zip(want, got, strict=True):
                    assert x.tobytes() == y.tobytes(), isa
    finally:
        _native.clear_isa()


def test_bad_inputs_are_named() -> None:
    g, c = _gates(np.random.default_rng(0), 2, 3)
    with pytest.raises(OpError, match="c must be"):
        recurrent._lstm_gates_native(None, g, c[:, :2])
    with pytest.raises(OpError, match="gates must be"):
        recurrent._lstm_gates_native(None, g[:, :10], c)
    with pytest.raises(ValueError, match="permutation"):
        _native.lstm_gates_f32(g, c, [0, 1, 1, 3])


def cell_model(b: int, h: int, *, roles=(0, 1, 2, 3), swap: bool = False, extra_reader: bool = False):
    """s [B, 4H], c [B, H] -> Split -> activations -> c', h' as torch writes the cell;
    ``roles``: which chunk is (i, f, g, o); ``swap``: Mul / Add operands the other way."""
    i, f, g, o = roles
    acts = {i: "Sigmoid", f: "Sigmoid", g: "Tanh", o: "Sigmoid"}
    nodes = [helper.make_node("Split", ["s", "sizes"], [f"a{k}" for k in range(4)], axis=1)]
    nodes += [helper.make_node(acts[k], [f"a{k}"], [f"t{k}"]) for k in range(4)]

    def mul(x, y, out):
        return helper.make_node("Mul", [y, x] if swap else [x, y], [out])

    nodes += [
        mul(f"t{f}", "c", "m0"),
        mul(f"t{i}", f"t{g}", "m1"),
        helper.make_node("Add", ["m1", "m0"] if swap else ["m0", "m1"], ["c_new"]),
        helper.make_node("Tanh", ["c_new"], ["tc"]),
        mul(f"t{o}", "tc", "h_new"),
    ]
    outs = ["h_new", "c_new"] + (["t1"] if extra_reader else [])
    graph = helper.make_graph(
        nodes,
        "cell",
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, [b, 4 * h]),
            helper.make_tensor_value_info("c", TensorProto.FLOAT, [b, h]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outs],
        [numpy_helper.from_array(np.full(4, h, np.int64), "sizes")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("roles", "swap"),
    [((0, 1, 2, 3), False), ((0, 1, 2, 3), True), ((2, 0, 3, 1), False), ((3, 2, 1, 0), True)],
)
def test_fused_graph_gives_the_bytes_of_the_cell(roles, swap) -> None:
    b, h = 3, 17
    model = cell_model(b, h, roles=roles, swap=swap)
    s, c = _gates(np.random.default_rng(5), b, h)
    plain = quanta.SessionOptions()
    plain.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    unfused = quanta.InferenceSession(model, plain, backend="reference")
    assert "LSTMGates" not in [st.op_type for st in unfused.plan.steps]
    want = unfused.run(None, {"s": s, "c": c})
    for backend in ("reference", "native"):
        sess = quanta.InferenceSession(model, backend=backend)
        assert [st.op_type for st in sess.plan.steps] == ["LSTMGates"], backend
        assert sess.plan.steps[0].node.attrs["order"] == list(roles)
        got = sess.run(None, {"s": s, "c": c})
        for x, y in zip(want, got, strict=True):
            assert x.tobytes() == y.tobytes(), backend


def test_a_cell_with_another_reader_stays() -> None:
    g = load(cell_model(2, 5, extra_reader=True)).graph
    assert not FuseLSTMGates()(g).modified
    assert g.op_counts()["Sigmoid"] == 3
