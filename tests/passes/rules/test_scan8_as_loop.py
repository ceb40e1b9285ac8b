"""Scan8AsLoop (passes/rules/scan8_as_loop.py): a Scan of opset 8 (batch axis,
``sequence_lens``) that ``upgrade_opset`` kept as ``quanta::Scan8`` becomes a Loop over
the batch rows of a Scan. Two states, two scan inputs (one read backwards), a scan output
of rank 2 a step (the Pad's tail of zeros), a weight the body reads from the main graph,
lengths 5, 1 and 3 of 5: the same bytes as the opset-8 graph on quanta's reference target
and on ONNX Runtime; and ``quantize_static`` / ``quantize_dynamic`` of such a model write
a valid file that both run alike."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import quanta
from quanta.ir.onnx_io import SCAN8_DOMAIN, SCAN8_OP, from_proto, load, upgrade_opset
from quanta.passes.rules.scan8_as_loop import Scan8AsLoop
from tests.passes.helpers import dot_tolerance, run_passes, run_ref

F = TensorProto.FLOAT
B, T, D, N = 3, 5, 7, 17
RNG = np.random.default_rng(8)
W = RNG.normal(size=(D, N)).astype(np.float32)


def scan8_model(*, lens: bool = True, directions: tuple[int, int] = (0, 1)) -> onnx.ModelProto:
    """Scan-8 over x [B, T, D] and z [B, T, D] (z read backwards) with states h [B, D]
    (h' = h + x_t·z_t) and c [B, 2] (c' = c + 1): per step y = [h'·W, h'·W - 1] [2, N]
    and the state h'. W is a main-graph initializer the body reads (an outer name)."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "z"], ["xz"]),
            helper.make_node("Add", ["h", "xz"], ["h2"]),
            helper.make_node("Add", ["c", "one"], ["c2"]),
            helper.make_node("MatMul", ["h2", "W"], ["p"]),
            helper.make_node("Sub", ["p", "one_n"], ["p1"]),
            helper.make_node("Unsqueeze", ["p"], ["pu"], axes=[0]),
            helper.make_node("Unsqueeze", ["p1"], ["p1u"], axes=[0]),
            helper.make_node("Concat", ["pu", "p1u"], ["y"], axis=0),
        ],
        "body",
        [
            helper.make_tensor_value_info("h", F, [D]),
            helper.make_tensor_value_info("c", F, [2]),
            helper.make_tensor_value_info("x", F, [D]),
            helper.make_tensor_value_info("z", F, [D]),
        ],
        [
            helper.make_tensor_value_info("h2", F, [D]),
            helper.make_tensor_value_info("c2", F, [2]),
            helper.make_tensor_value_info("y", F, [2, N]),
            helper.make_tensor_value_info("h2_out", F, [D]),
        ],
        [
            helper.make_tensor("one", F, [1], [1.0]),
            helper.make_tensor("one_n", F, [1], [1.0]),
        ],
    )
    body.node.append(helper.make_node("Identity", ["h2"], ["h2_out"]))
    scan = helper.make_node(
        "Scan",
        ["lens" if lens else "", "h0", "c0", "X", "Z"],
        ["hN", "cN", "Y", "H"],
        name="scan",
        num_scan_inputs=2,
        directions=list(directions),
        body=body,
    )
    inputs = [
        helper.make_tensor_value_info("h0", F, [B, D]),
        helper.make_tensor_value_info("c0", F, [B, 2]),
        helper.make_tensor_value_info("X", F, [B, T, D]),
        helper.make_tensor_value_info("Z", F, [B, T, D]),
    ]
    if lens:
        inputs.insert(0, helper.make_tensor_value_info("lens", TensorProto.INT64, [B]))
    graph = helper.make_graph(
        [scan],
        "g",
        inputs,
        [
            helper.make_tensor_value_info("hN", F, [B, D]),
            helper.make_tensor_value_info("cN", F, [B, 2]),
            helper.make_tensor_value_info("Y", F, [B, T, 2, N]),
            helper.make_tensor_value_info("H", F, [B, T, D]),
        ],
        [helper.make_tensor("W", F, [D, N], W.ravel())],
    )
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 8)])
    m.ir_version = 4
    onnx.checker.check_model(m)
    return m


def feeds(rng: np.random.Generator, lens: bool = True) -> dict[str, np.ndarray]:
    f = {
        "h0": rng.normal(size=(B, D)).astype(np.float32),
        "c0": rng.normal(size=(B, 2)).astype(np.float32),
        "X": rng.normal(size=(B, T, D)).astype(np.float32),
        "Z": rng.normal(size=(B, T, D)).astype(np.float32),
    }
    if lens:
        f["lens"] = np.array([T, 1, 3], np.int64)  # ONNX Runtime refuses a length of 0
    return f


def product_magnitude(h: np.ndarray) -> float:
    """A bound on Σ_i |h_i·W_ij| over the states h the body multiplies by W."""
    return float(np.abs(h).max() * np.abs(W).sum(axis=0).max())


def ort_run(proto: onnx.ModelProto, f: dict[str, np.ndarray]) -> list[np.ndarray]:
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    return sess.run(None, f)


@pytest.mark.parametrize("lens", [True, False])
@pytest.mark.parametrize("directions", [(0, 1), (1, 0), (0, 0)])
def test_scan8_becomes_a_loop_of_scans_with_the_same_bytes(lens: bool, directions: tuple[int, int]) -> None:
    source = scan8_model(lens=lens, directions=directions)
    upgraded = upgrade_opset(source, 13)
    # the converter kept the node (and the graph's batch axes) as they were
    marked = [n for n in upgraded.graph.node if n.domain == SCAN8_DOMAIN]
    assert [n.op_type for n in marked] == [SCAN8_OP]
    assert [d.dim_value for d in upgraded.graph.input[-1].type.tensor_type.shape.dim] == [B, T, D]

    model = load(upgraded)
    result = run_passes(model, [Scan8AsLoop()])
    # 1. fired once
    assert result.fired("Scan8AsLoop") == 1
    # 2. structure: the batch size, then the Loop of a Scan with the Scan-8's body
    assert model.graph.op_counts() == {"Shape": 1, "Gather": 1, "Loop": 1}
    loop = next(n for n in model.graph.nodes if n.op_type == "Loop")
    body_ops = [n.op_type for n in loop.attrs["body"].node]
    assert body_ops.count("Scan") == 1
    assert body_ops.count("Pad") == (2 if lens else 0)  # one per scan output
    scan = next(n for n in loop.attrs["body"].node if n.op_type == "Scan")
    attrs = {a.name: helper.get_attribute_value(a) for a in scan.attribute}
    assert attrs["num_scan_inputs"] == 2
    assert list(attrs.get("scan_input_directions", [0, 0])) == list(directions)
    # the Scan-8's body, converted to opset 13 with the model (Unsqueeze's axes an input)
    marked_body = next(a.g for a in marked[0].attribute if a.name == "body")
    assert attrs["body"].SerializeToString() == marked_body.SerializeToString()
    assert all(len(n.input) == 2 for n in marked_body.node if n.op_type == "Unsqueeze")
    assert {"W"} <= set(loop.outer_names)  # the body's outer weight stays bound
    # 3. numerics: bytes equal to the opset-8 graph, on quanta's reference target and on ORT
    f = feeds(np.random.default_rng(3), lens)
    want = run_ref(source, f)
    got = run_ref(model, f)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    # ONNX Runtime's two forms run the body's length-D products through different MLAS
    # paths (its Scan-8 and its Scan-9 in a Loop): equal within the products' bound
    rewritten = ort_run(quanta.ir.onnx_io.to_proto(model), f)
    tol = dot_tolerance(D, product_magnitude(want[3]))
    for a, b in zip(ort_run(source, f), rewritten, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=tol)
    if lens:  # a row's steps past its length are zeros in both
        assert np.all(got[2][1, 1:] == 0) and np.all(got[3][2, 3:] == 0)
    # 4. verify() ran after the pass (run_passes)


def test_scan9_and_a_model_without_scan8_are_left_alone() -> None:
    """A Scan of opset 9 or newer is not a Scan-8; a model raised from opset 8 without a
    Scan imports no quanta domain."""
    source = scan8_model(lens=False)
    at13 = upgrade_opset(source, 13)
    for n in at13.graph.node:  # the same node as a Scan-9 (no sequence_lens, no batch)
        n.op_type, n.domain = "Scan", ""
        del n.input[0]
    model = from_proto(at13)
    before = [(n.op_type, n.domain) for n in model.graph.nodes]
    result = run_passes(model, [Scan8AsLoop()])
    assert result.fired("Scan8AsLoop") == 0
    assert [(n.op_type, n.domain) for n in model.graph.nodes] == before

    plain = helper.make_model(
        helper.make_graph(
            [helper.make_node("Relu", ["a"], ["b"])],
            "g",
            [helper.make_tensor_value_info("a", F, [2])],
            [helper.make_tensor_value_info("b", F, [2])],
        ),
        opset_imports=[helper.make_opsetid("", 8)],
    )
    assert [o.domain for o in upgrade_opset(plain, 13).opset_import] == [""]


@pytest.mark.parametrize("lens", [True, False])
def test_quantize_static_and_dynamic_of_a_scan8_model_run_alike_in_ort_and_quanta(
    tmp_path, lens: bool
) -> None:
    """Before the rewrite the version converter's Scan-9 read the batch axis as time and
    the graph inputs lost their batch axis; now both quantizers write a valid opset-13
    file whose signature is the source's, ORT and quanta give the same outputs, and the
    body's MatMul (float in a subgraph, by the recipe's default) keeps FP32's values."""
    source = scan8_model(lens=lens)
    src = tmp_path / "scan8.onnx"
    onnx.save(source, str(src))
    rng = np.random.default_rng(5)
    calib = [feeds(rng, lens) for _ in range(4)]
    f = feeds(rng, lens)
    want = ort_run(source, f)
    for name, run in (
        ("static", lambda out: quanta.quantize_static(str(src), str(out), calib)),
        ("dynamic", lambda out: quanta.quantize_dynamic(str(src), str(out))),
    ):
        out = tmp_path / f"{name}.onnx"
        run(out)
        written = onnx.load(str(out))
        onnx.checker.check_model(written, full_check=True)
        assert not any(n.domain == SCAN8_DOMAIN for n in written.graph.node)
        assert [[d.dim_value for d in i.type.tensor_type.shape.dim] for i in written.graph.input] == [
            [d.dim_value for d in i.type.tensor_type.shape.dim] for i in source.graph.input
        ]
        by_ort = ort_run(written, f)
        by_quanta = quanta.InferenceSession(str(out)).run(None, f)
        # float products of length D in either engine's order (dot_tolerance)
        tol = dot_tolerance(D, product_magnitude(want[3]))
        for a, b, w in zip(by_ort, by_quanta, want, strict=True):
            assert a.shape == w.shape
            np.testing.assert_allclose(a, b, rtol=0, atol=tol)
            np.testing.assert_allclose(a, w, rtol=0, atol=tol)
