"""FuseGRUGates: an exported GRU cell's two Splits and ten elementwise nodes become one
quanta::GRUGates (passes/rules/fuse_gru_gates.py) that gives the cell's bytes."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage, verify
from quanta.passes.rules.fuse_gru_gates import FuseGRUGates
from tests.passes.helpers import out_info, rng_data, run_passes, run_ref

F32 = np.float32


def cell_model(
    b: int,
    i: int,
    h: int,
    *,
    roles=(0, 1, 2),
    swap: bool = False,
    extra_reader: str | None = None,
    sizes_h=None,
    h_order=None,
    state_shape=None,
):
    """x [B, I], h [B, H] -> torch's GRUCell as the TorchScript exporter writes it: two
    Gemms, two Splits, r, z, n and h' = (h − n)·z + n. ``roles``: the chunks of (r, z, n);
    ``swap``: Add / Mul operands the other way; ``extra_reader``: a value also made a graph
    output; ``sizes_h``: the state Split's sizes; ``h_order``: the state Split's roles if
    they differ; ``state_shape``: the declared shape of h (broadcast otherwise)."""
    r, z, n = roles
    hr, hz, hn = roles if h_order is None else h_order
    rng = np.random.default_rng(7)
    w_ih = (rng.standard_normal((3 * h, i)) * 0.4).astype(F32)
    w_hh = (rng.standard_normal((3 * h, h)) * 0.4).astype(F32)
    b_ih = (rng.standard_normal(3 * h) * 0.3).astype(F32)
    b_hh = (rng.standard_normal(3 * h) * 0.3).astype(F32)

    def two(op, a, c, out):
        return helper.make_node(op, [c, a] if swap else [a, c], [out])

    nodes = [
        helper.make_node("Gemm", ["x", "w_ih", "b_ih"], ["gx"], transB=1),
        helper.make_node("Split", ["gx", "sizes"], ["x0", "x1", "x2"], axis=1),
        helper.make_node("Gemm", ["h", "w_hh", "b_hh"], ["gh"], transB=1),
        helper.make_node("Split", ["gh", "sizes_h"], ["h0", "h1", "h2"], axis=1),
        two("Add", f"h{hr}", f"x{r}", "ar"),
        helper.make_node("Sigmoid", ["ar"], ["r"]),
        two("Add", f"h{hz}", f"x{z}", "az"),
        helper.make_node("Sigmoid", ["az"], ["z"]),
        two("Mul", f"h{hn}", "r", "m"),
        two("Add", f"x{n}", "m", "an"),
        helper.make_node("Tanh", ["an"], ["nn"]),
        helper.make_node("Sub", ["h", "nn"], ["d"]),
        two("Mul", "d", "z", "e"),
        two("Add", "e", "nn", "h_new"),
    ]
    outs = [out_info("h_new", 2)] + ([out_info(extra_reader, 2)] if extra_reader else [])
    graph = helper.make_graph(
        nodes,
        "gru_cell",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [b, i]),
            helper.make_tensor_value_info("h", TensorProto.FLOAT, state_shape or [b, h]),
        ],
        outs,
        [
            numpy_helper.from_array(w_ih, "w_ih"),
            numpy_helper.from_array(w_hh, "w_hh"),
            numpy_helper.from_array(b_ih, "b_ih"),
            numpy_helper.from_array(b_hh, "b_hh"),
            numpy_helper.from_array(np.full(3, h, np.int64), "sizes"),
            numpy_helper.from_array(np.asarray(sizes_h or [h] * 3, np.int64), "sizes_h"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(b: int, i: int, h: int, seed: int = 1) -> dict[str, np.ndarray]:
    return {"x": rng_data((b, i), seed, -3, 3), "h": rng_data((b, h), seed + 1, -1, 1)}


@pytest.mark.parametrize(
    ("roles", "swap", "b", "i", "h"),
    [
        ((0, 1, 2), False, 3, 7, 17),
        ((0, 1, 2), True, 1, 29, 33),
        ((2, 0, 1), False, 6, 5, 3),
        ((1, 2, 0), True, 7, 3, 9),
    ],
)
def test_cell_becomes_one_node_with_the_cells_bytes(roles, swap, b, i, h) -> None:
    proto = cell_model(b, i, h, roles=roles, swap=swap)
    model = load(proto)
    result = run_passes(model, [FuseGRUGates()])
    assert result.fired("fuse_gru_gates") == 1  # 1. fired once
    assert model.graph.op_counts() == {"Gemm": 2, "quanta::GRUGates": 1}  # 2. structure
    node = model.graph.find_nodes("GRUGates")[0]
    assert node.attrs["order"] == list(roles)
    assert [v.name for v in node.inputs] == ["gx", "gh", "h"]
    feeds = _feeds(b, i, h)
    for want, got in zip(run_ref(proto, feeds), run_ref(model, feeds), strict=True):
        assert want.tobytes() == got.tobytes()  # 3. exact: the same float32 operations
    verify(model.graph, Stage.FLOAT)  # 4.


def test_sessions_run_the_fused_node_natively_with_the_cells_bytes() -> None:
    b, i, h = 3, 11, 33
    proto = cell_model(b, i, h, swap=True)
    feeds = _feeds(b, i, h, seed=4)
    plain = quanta.SessionOptions()
    plain.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    for backend in ("reference", "native"):
        # the unfused cell on the same backend: its Gemms are the fused graph's
        unfused = quanta.InferenceSession(proto, plain, backend=backend)
        assert "GRUGates" not in [st.op_type for st in unfused.plan.steps]
        want = unfused.run(None, feeds)
        sess = quanta.InferenceSession(proto, backend=backend)
        assert "GRUGates" in [st.op_type for st in sess.plan.steps], backend
        assert not {"Split", "Sigmoid", "Tanh", "Sub"} & {st.op_type for st in sess.plan.steps}, backend
        got = sess.run(None, feeds)
        assert want[0].tobytes() == got[0].tobytes(), backend


@pytest.mark.parametrize("reader", ["r", "nn", "d", "x1", "ar"])
def test_a_cell_with_another_reader_stays(reader) -> None:
    model = load(cell_model(2, 5, 7, extra_reader=reader))
    before = model.graph.op_counts()
    assert not FuseGRUGates()(model.graph).modified
    assert model.graph.op_counts() == before


def test_unequal_chunks_stay() -> None:
    model = load(cell_model(2, 5, 6, sizes_h=[5, 6, 7]))
    assert not FuseGRUGates()(model.graph).modified
    assert model.graph.op_counts()["Split"] == 2


def test_splits_with_different_roles_stay() -> None:
    model = load(cell_model(2, 5, 6, roles=(0, 1, 2), h_order=(1, 0, 2)))
    assert not FuseGRUGates()(model.graph).modified
    assert model.graph.op_counts()["Sigmoid"] == 2


def test_a_broadcast_state_fuses_with_the_cells_bytes() -> None:
    # h [1, H] against products [3, 3H] (each input's batch named apart, as exporters do):
    # the replaced nodes broadcast the state's row, so does the fused node
    b, i, h = 3, 5, 6
    proto = cell_model(b, i, h, state_shape=[1, h])
    model = load(proto)
    result = run_passes(model, [FuseGRUGates()])
    assert result.fired("fuse_gru_gates") == 1
    assert model.graph.op_counts() == {"Gemm": 2, "quanta::GRUGates": 1}
    feeds = {"x": rng_data((b, i), 3, -3, 3), "h": rng_data((1, h), 4, -1, 1)}
    for want, got in zip(run_ref(proto, feeds), run_ref(model, feeds), strict=True):
        assert want.shape == got.shape == (b, h)
        assert want.tobytes() == got.tobytes()
    verify(model.graph, Stage.FLOAT)
    sess = quanta.InferenceSession(proto, backend="native")
    assert "GRUGates" in [st.op_type for st in sess.plan.steps]
    plain = quanta.SessionOptions()
    plain.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = quanta.InferenceSession(proto, plain, backend="native").run(None, feeds)
    assert want[0].tobytes() == sess.run(None, feeds)[0].tobytes()
