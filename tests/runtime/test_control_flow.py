"""If / Loop / Scan with bodies compiled into plans (quanta.runtime.control_flow).

Failure signatures guarded against: a body reading an enclosing-scope value gets the
wrong one (positions of the outer values mixed up), a Loop runs once too often or
returns a scan output of the wrong shape after zero iterations, a reverse Scan keeps
forward order, the native and reference targets disagree, and a body op without a
kernel makes the node unrunnable instead of falling back to onnx.reference.

Tolerances: 0 between quanta's targets and against the hand-written NumPy result
(the same float32 operations in the same order); against ONNX Runtime, float32 sums of
at most 17 terms of magnitude < 10: 1e-5 (a few ulps of the sums, different
summation orders).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels.reference.float_ops import sum16
from quanta.session import InferenceSession

F = TensorProto.FLOAT
I64 = TensorProto.INT64
B = TensorProto.BOOL


def _model(nodes, inputs, outputs, inits=(), opset=21) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "cf", inputs, outputs, list(inits))
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    onnx.checker.check_model(m)
    return m


def _run(proto, feeds, backend):
    return InferenceSession(proto.SerializeToString(), backend=backend).run(None, feeds)


def _ort(proto, feeds):
    ort = pytest.importorskip("onnxruntime")
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feeds
    )


def if_model() -> onnx.ModelProto:
    """y = If(sum(x) > 0): then x @ W + b (W, b of the outer graph), else Neg(x) * s."""
    then_g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["t0"]), helper.make_node("Add", ["t0", "b"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F, [3, 7])],
    )
    else_g = helper.make_graph(
        [
            helper.make_node("Neg", ["x"], ["e0"]),
            helper.make_node("Mul", ["e0", "s"], ["e1"]),
            helper.make_node("ReduceSum", ["e1", "axes"], ["e_out"], keepdims=1),
        ],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", F, [3, 1])],
        [numpy_helper.from_array(np.array([1], np.int64), "axes")],
    )
    rng = np.random.default_rng(3)
    inits = [
        numpy_helper.from_array(rng.standard_normal((5, 7)).astype(np.float32), "W"),
        numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "b"),
        numpy_helper.from_array(np.float32(1.75), "s"),
        numpy_helper.from_array(np.float32(0.0), "zero"),
    ]
    nodes = [
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [3, 5])],
        [helper.make_tensor_value_info("y", F, [3, "k"])],
        inits,
    )


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_if_branches_read_outer_scope_values(backend):
    proto = if_model()
    rng = np.random.default_rng(0)
    x = np.abs(rng.standard_normal((3, 5)).astype(np.float32))
    inits = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    (y,) = _run(proto, {"x": x}, backend)
    # the float GEMM family's contract is a bound against float64 (docs/float-ops.md)
    want = x.astype(np.float64) @ inits["W"].astype(np.float64) + inits["b"]
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5)
    (y,) = _run(proto, {"x": -x}, backend)
    # ReduceSum sums float32 rows in the lane order (R1)-(R3)
    np.testing.assert_array_equal(y, sum16(x * np.float32(1.75))[:, None])


def test_if_runs_compiled_bodies_not_onnx_reference():
    sess = InferenceSession(if_model().SerializeToString(), backend="reference")
    (step,) = [s for s in sess.plan.steps if s.op_type == "If"]
    assert step.kernel.name == "reference:If(compiled bodies)"
    assert sorted(step.kernel.bodies) == ["else_branch", "then_branch"]
    # the body is compiled by the float pipeline: its MatMul and bias Add are one MatMulBias
    assert [s.op_type for s in step.kernel.bodies["then_branch"].plan.steps] == ["MatMulBias"]


def loop_model(nested_if: bool = True) -> onnx.ModelProto:
    """Loop(M, cond): carried acc += x * (i + 1) (x outer), stop when acc's sum > limit;
    scan output: acc each iteration; inside, an If on i being even picks Relu or Neg of
    acc (a nested If reading a body value and an outer-scope value)."""
    if nested_if:
        even = helper.make_graph(
            [helper.make_node("Mul", ["acc_new", "k"], ["even_out"])],
            "even",
            [],
            [helper.make_tensor_value_info("even_out", F, None)],
        )
        odd = helper.make_graph(
            [helper.make_node("Neg", ["acc_new"], ["odd_out"])],
            "odd",
            [],
            [helper.make_tensor_value_info("odd_out", F, None)],
        )
        pick = [
            helper.make_node("Mod", ["i", "two"], ["parity"]),
            helper.make_node("Equal", ["parity", "zero_i"], ["is_even"]),
            helper.make_node(
                "If", ["is_even"], ["scan_out"], name="inner_if", then_branch=even, else_branch=odd
            ),
        ]
    else:
        pick = [helper.make_node("Identity", ["acc_new"], ["scan_out"])]
    body = helper.make_graph(
        [
            helper.make_node("Add", ["i", "one_i"], ["i1"]),
            helper.make_node("Cast", ["i1"], ["i1f"], to=F),
            helper.make_node("Mul", ["x", "i1f"], ["step"]),
            helper.make_node("Add", ["acc_in", "step"], ["acc_new"]),
            helper.make_node("ReduceSum", ["acc_new"], ["total"], keepdims=0),
            helper.make_node("Less", ["total", "limit"], ["cond_out"]),
            *pick,
        ],
        "body",
        [
            helper.make_tensor_value_info("i", I64, []),
            helper.make_tensor_value_info("cond_in", B, []),
            helper.make_tensor_value_info("acc_in", F, [2, 3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", B, []),
            helper.make_tensor_value_info("acc_new", F, [2, 3]),
            helper.make_tensor_value_info("scan_out", F, [2, 3]),
        ],
    )
    inits = [
        numpy_helper.from_array(np.array(1, np.int64), "one_i"),
        numpy_helper.from_array(np.array(2, np.int64), "two"),
        numpy_helper.from_array(np.array(0, np.int64), "zero_i"),
        numpy_helper.from_array(np.float32(-0.5), "k"),
        numpy_helper.from_array(np.zeros((2, 3), np.float32), "acc0"),
    ]
    return _model(
        [helper.make_node("Loop", ["M", "cond", "acc0"], ["acc", "scans"], name="loop", body=body)],
        [
            helper.make_tensor_value_info("M", I64, []),
            helper.make_tensor_value_info("cond", B, []),
            helper.make_tensor_value_info("x", F, [2, 3]),
            helper.make_tensor_value_info("limit", F, []),
        ],
        [
            helper.make_tensor_value_info("acc", F, [2, 3]),
            helper.make_tensor_value_info("scans", F, ["T", 2, 3]),
        ],
        inits,
    )


def _loop_expected(m, cond, x, limit):
    acc = np.zeros((2, 3), np.float32)
    scans = []
    i = 0
    while cond and i < m:
        acc = acc + x * np.float32(i + 1)
        cond = acc.sum(dtype=np.float32) < limit
        scans.append(acc * np.float32(-0.5) if i % 2 == 0 else -acc)
        i += 1
    return acc, np.stack(scans) if scans else np.zeros((0, 2, 3), np.float32)


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize(
    ("m", "cond", "limit"), [(5, True, 1e9), (7, True, 9.0), (3, False, 1e9), (0, True, 1e9)]
)
def test_loop_carried_scan_outputs_and_nested_if(backend, m, cond, limit):
    proto = loop_model()
    x = (np.arange(6, dtype=np.float32).reshape(2, 3) - 1.5) * np.float32(0.75) + 1
    feeds = {"M": np.array(m, np.int64), "cond": np.array(cond), "x": x, "limit": np.array(limit, np.float32)}
    acc, scans = _run(proto, feeds, backend)
    want_acc, want_scans = _loop_expected(m, cond, x, np.float32(limit))
    np.testing.assert_array_equal(acc, want_acc)
    assert scans.shape == want_scans.shape and scans.dtype == np.float32
    np.testing.assert_array_equal(scans, want_scans)
    ort_acc, ort_scans = _ort(proto, feeds)
    np.testing.assert_allclose(acc, ort_acc, rtol=0, atol=1e-5)
    assert ort_scans.shape == scans.shape  # zero iterations: (0, 2, 3), as ONNX Runtime


def test_loop_without_condition_ignores_the_body_condition():
    """With M and no condition input the body's cond output is ignored (ONNX's
    ``for (i = 0; i < M; ++i)``): the loop runs M times even after cond_out is false."""
    proto = loop_model(nested_if=False)
    proto.graph.node[0].input[1] = ""
    x = np.ones((2, 3), np.float32)
    feeds = {"M": np.array(4, np.int64), "cond": np.array(True), "x": x, "limit": np.array(1.0, np.float32)}
    acc, scans = _run(proto, feeds, "reference")
    np.testing.assert_array_equal(acc, x * np.float32(1 + 2 + 3 + 4))
    assert scans.shape == (4, 2, 3)


def scan_model(reverse_in: int, reverse_out: int, in_axis: int, out_axis: int) -> onnx.ModelProto:
    """Scan: state s (outer bias c added each step) accumulates x_t; scan output s * w."""
    body = helper.make_graph(
        [
            helper.make_node("Add", ["s_in", "x_t"], ["s_a"]),
            helper.make_node("Add", ["s_a", "c"], ["s_out"]),
            helper.make_node("Mul", ["s_out", "w"], ["y_t"]),
        ],
        "scan_body",
        [helper.make_tensor_value_info("s_in", F, [4]), helper.make_tensor_value_info("x_t", F, [4])],
        [helper.make_tensor_value_info("s_out", F, [4]), helper.make_tensor_value_info("y_t", F, [4])],
    )
    node = helper.make_node(
        "Scan",
        ["s0", "xs"],
        ["s_final", "ys"],
        name="scan",
        body=body,
        num_scan_inputs=1,
        scan_input_directions=[reverse_in],
        scan_output_directions=[reverse_out],
        scan_input_axes=[in_axis],
        scan_output_axes=[out_axis],
    )
    inits = [
        numpy_helper.from_array(np.array([0.5, -1.0, 2.0, 0.25], np.float32), "c"),
        numpy_helper.from_array(np.array([1.5, 3.0, -2.0, 0.5], np.float32), "w"),
    ]
    xs_shape = [5, 4] if in_axis == 0 else [4, 5]
    return _model(
        [node],
        [helper.make_tensor_value_info("s0", F, [4]), helper.make_tensor_value_info("xs", F, xs_shape)],
        [
            helper.make_tensor_value_info("s_final", F, [4]),
            helper.make_tensor_value_info("ys", F, ["a", "b"]),
        ],
        inits,
    )


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize(
    ("reverse_in", "reverse_out", "in_axis", "out_axis"),
    [(0, 0, 0, 0), (1, 0, 0, 0), (0, 1, 0, 1), (1, 1, 1, 0)],
)
def test_scan_directions_and_axes(backend, reverse_in, reverse_out, in_axis, out_axis):
    proto = scan_model(reverse_in, reverse_out, in_axis, out_axis)
    rng = np.random.default_rng(5)
    s0 = rng.standard_normal(4).astype(np.float32)
    xs = rng.standard_normal((5, 4) if in_axis == 0 else (4, 5)).astype(np.float32)
    s_final, ys = _run(proto, {"s0": s0, "xs": xs}, backend)
    c = np.array([0.5, -1.0, 2.0, 0.25], np.float32)
    w = np.array([1.5, 3.0, -2.0, 0.5], np.float32)
    rows = np.moveaxis(xs, in_axis, 0)
    order = range(4, -1, -1) if reverse_in else range(5)
    s = s0
    outs = []
    for t in order:
        s = (s + rows[t]) + c
        outs.append(s * w)
    if reverse_out:
        outs = outs[::-1]
    np.testing.assert_array_equal(s_final, s)
    np.testing.assert_array_equal(ys, np.stack(outs, axis=out_axis))
    ort_s, ort_ys = _ort(proto, {"s0": s0, "xs": xs})
    np.testing.assert_allclose(ys, ort_ys, rtol=0, atol=1e-5)
    np.testing.assert_allclose(s_final, ort_s, rtol=0, atol=1e-5)


def scan8_model(with_lens: bool) -> onnx.ModelProto:
    """Scan-8 (opset 8): batch axis 0 on the state and both scan inputs, scan axis 1, the
    second input read in reverse; state s accumulates a_t * b_t, scan output s - a_t."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["a_t", "b_t"], ["p"]),
            helper.make_node("Add", ["s_in", "p"], ["s_out"]),
            helper.make_node("Sub", ["s_out", "a_t"], ["y_t"]),
        ],
        "scan8_body",
        [helper.make_tensor_value_info(n, F, [3]) for n in ("s_in", "a_t", "b_t")],
        [helper.make_tensor_value_info("s_out", F, [3]), helper.make_tensor_value_info("y_t", F, [3])],
    )
    node = helper.make_node(
        "Scan",
        ["lens" if with_lens else "", "s0", "a", "b"],
        ["s_final", "ys"],
        name="scan8",
        body=body,
        num_scan_inputs=2,
        directions=[0, 1],
    )
    inputs = [helper.make_tensor_value_info("lens", I64, [4])] if with_lens else []
    inputs += [
        helper.make_tensor_value_info("s0", F, [4, 3]),
        helper.make_tensor_value_info("a", F, [4, 7, 3]),
        helper.make_tensor_value_info("b", F, [4, 7, 3]),
    ]
    outputs = [
        helper.make_tensor_value_info("s_final", F, [4, 3]),
        helper.make_tensor_value_info("ys", F, [4, 7, 3]),
    ]
    return _model([node], inputs, outputs, opset=8)


@pytest.mark.parametrize("backend", ["reference", "native"])
@pytest.mark.parametrize("lens", [None, [7, 2, 1, 5]])
def test_scan8_batch_axis_sequence_lens_and_reverse_input(backend, lens):
    """Scan-8 runs its body per batch row for that row's length; the reverse input is read
    from the end of the row's own length, not of the padded axis; the rows of a scan output
    past a row's length are zero (undefined in ONNX, zero in ONNX Runtime)."""
    proto = scan8_model(lens is not None)
    rng = np.random.default_rng(8)
    s0 = rng.standard_normal((4, 3)).astype(np.float32)
    a = rng.standard_normal((4, 7, 3)).astype(np.float32)
    b = rng.standard_normal((4, 7, 3)).astype(np.float32)
    feeds = {"s0": s0, "a": a, "b": b}
    if lens is not None:
        feeds["lens"] = np.array(lens, np.int64)
    s_final, ys = _run(proto, feeds, backend)
    want_s = np.empty_like(s0)
    want_y = np.zeros_like(a)
    for r in range(4):
        n = 7 if lens is None else lens[r]
        s = s0[r]
        for t in range(n):
            s = s + a[r, t] * b[r, n - 1 - t]
            want_y[r, t] = s - a[r, t]
        want_s[r] = s
    np.testing.assert_array_equal(s_final, want_s)
    np.testing.assert_array_equal(ys, want_y)
    ort_s, ort_ys = _ort(proto, feeds)
    np.testing.assert_allclose(s_final, ort_s, rtol=0, atol=1e-5)
    np.testing.assert_allclose(ys, ort_ys, rtol=0, atol=1e-5)


def test_body_op_without_kernel_falls_back_to_onnx_reference(monkeypatch):
    """A body whose op has no reference twin still runs: the node is evaluated by
    onnx.reference, recorded as a fallback naming the reason. (MeanVarianceNormalization,
    a function op, runs on its own through onnx.reference's expansion of its body; the
    test takes that away so that nothing can run it but the whole node's evaluation.)"""
    from quanta.kernels.reference import registry

    monkeypatch.setattr(registry, "_onnx_reference_has", lambda op_type, domain="": False)
    then_g = helper.make_graph(
        [helper.make_node("MeanVarianceNormalization", ["x"], ["t_out"], axes=[1])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F, [3, 4])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["x"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", F, [3, 4])],
    )
    proto = _model(
        [helper.make_node("If", ["c"], ["y"], name="branch", then_branch=then_g, else_branch=else_g)],
        [helper.make_tensor_value_info("c", B, []), helper.make_tensor_value_info("x", F, [3, 4])],
        [helper.make_tensor_value_info("y", F, [3, 4])],
    )
    assert registry.get_op("MeanVarianceNormalization") is None
    sess = InferenceSession(proto.SerializeToString(), backend="reference")
    ((name, op, reason),) = sess.fallbacks
    assert (name, op) == ("branch", "If") and "onnx.reference runs the node" in reason
    x = np.arange(12, dtype=np.float32).reshape(3, 4) * np.float32(0.5) - 2
    (y,) = sess.run(None, {"c": np.array(False), "x": x})
    np.testing.assert_array_equal(y, -x)
    (y,) = sess.run(None, {"c": np.array(True), "x": x})
    # float32 mean/variance of 4 values of magnitude < 4: 1e-5 covers the ulps of the two
    # reductions and the square root
    want = (x - x.mean(axis=1, keepdims=True)) / np.sqrt(x.var(axis=1, keepdims=True) + np.float32(1e-9))
    np.testing.assert_allclose(y, want, rtol=0, atol=1e-5)


ZOO = Path.home() / ".cache" / "quanta-zoo" / "models"


@pytest.mark.parametrize("name", ["silero_vad", "silero_vad_ifless"])
def test_silero_files_equal_onnx_runtime(name):
    """The zoo's voice-activity models, whose compute is all inside If branches (nested
    Ifs, an LSTM, convolutions), through both sample rates and a carried state."""
    path = ZOO / f"{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not on this machine (benchmarks/zoo/fetch.py)")
    ort = pytest.importorskip("onnxruntime")
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    sess = InferenceSession(str(path))
    assert not [f for f in sess.fallbacks if "onnx.reference runs the node" in f[2]]
    rng = np.random.default_rng(1)
    for sr, n in ((16000, 576), (8000, 288), (16000, 576)):
        state_q = state_o = (rng.standard_normal((2, 1, 128)) * 0.3).astype(np.float32)
        for _ in range(3):
            x = (rng.standard_normal((1, n)) * 0.2).astype(np.float32)
            feed = {"input": x, "sr": np.array(sr, np.int64)}
            yq, state_q = sess.run(None, {**feed, "state": state_q})
            yo, state_o = ref.run(None, {**feed, "state": state_o})
            # float32 convolutions and an LSTM of 128 units, two implementations, three
            # windows of carried state: 1e-5 absolute on a probability and on the state
            np.testing.assert_allclose(yq, yo, rtol=0, atol=1e-5)
            np.testing.assert_allclose(state_q, state_o, rtol=0, atol=1e-5)


def shape_guarded_model() -> onnx.ModelProto:
    """An exporter's ``x.squeeze(0)`` inside a branch: If(Shape(x)[0] == 1) {Squeeze}
    else {Identity}, then Relu; the outer If on the input ``c``. ``x`` is [N, 3]."""
    sq_then = helper.make_graph(
        [helper.make_node("Squeeze", ["a", "zero_axis"], ["sq"])],
        "sq_then",
        [],
        [helper.make_tensor_value_info("sq", F, None)],
    )
    sq_else = helper.make_graph(
        [helper.make_node("Identity", ["a"], ["id"])],
        "sq_else",
        [],
        [helper.make_tensor_value_info("id", F, None)],
    )
    then_g = helper.make_graph(
        [
            helper.make_node("Neg", ["x"], ["a"]),
            helper.make_node("Shape", ["a"], ["shp"]),
            helper.make_node("Gather", ["shp", "zero_i"], ["n"], axis=0),
            helper.make_node("Equal", ["n", "one_i"], ["is_one"]),
            helper.make_node(
                "If", ["is_one"], ["s"], name="squeeze_if", then_branch=sq_then, else_branch=sq_else
            ),
            helper.make_node("Relu", ["s"], ["t_out"]),
        ],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F, None)],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", F, None)],
    )
    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "zero_axis"),
        numpy_helper.from_array(np.array(0, np.int64), "zero_i"),
        numpy_helper.from_array(np.array(1, np.int64), "one_i"),
    ]
    return _model(
        [helper.make_node("If", ["c"], ["y"], name="outer", then_branch=then_g, else_branch=else_g)],
        [helper.make_tensor_value_info("c", B, []), helper.make_tensor_value_info("x", F, ["N", 3])],
        [helper.make_tensor_value_info("y", F, ["A", "B"])],
        inits,
    )


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_if_branch_specialized_per_signature_inlines_shape_guarded_ifs(backend):
    """The branch compiled for the shapes of a call: Shape(x)[0] == 1 folds and the
    nested If is inlined; another signature gets its own plan, and past
    MAX_SPECIALIZED signatures the generic plan (with the nested If) runs."""
    from quanta.runtime import control_flow

    sess = InferenceSession(shape_guarded_model().SerializeToString(), backend=backend)
    (step,) = [s for s in sess.plan.steps if s.op_type == "If"]
    then_body = step.kernel.bodies["then_branch"]
    assert "If" in [s.op_type for s in then_body.plan.steps]  # the generic plan keeps it
    c = np.array(True)
    for n in (1, 2, 1, 5, 7, 9, 11):
        x = (np.arange(n * 3, dtype=np.float32).reshape(n, 3) - 4) * np.float32(0.5)
        (y,) = sess.run(None, {"c": c, "x": x})
        want = np.maximum(-x, 0)
        np.testing.assert_array_equal(y, want[0] if n == 1 else want)
    assert len(then_body.specialized) == control_flow.MAX_SPECIALIZED
    one = then_body.specialized[(((1, 3), np.dtype(np.float32)),)]
    # the inlined Squeeze sinks below the Relu (SinkTransposes: a view after an elementwise op)
    assert [s.op_type for s in one.plan.steps] == ["Neg", "Relu", "Squeeze"]
    two = then_body.specialized[(((2, 3), np.dtype(np.float32)),)]
    assert [s.op_type for s in two.plan.steps] == ["Neg", "Relu"]


def test_plan_counts_and_names_the_steps_of_bodies():
    """plan.fallbacks and plan.total_steps reach into compiled bodies (what `quanta
    bench` reports as "N of M steps ran on reference kernels")."""
    sess = InferenceSession(if_model().SerializeToString(), backend="reference")
    # main graph, then branch (MatMul + bias Add: one MatMulBias), else branch
    assert sess.plan.total_steps == 3 + 1 + 3
    (step,) = [s for s in sess.plan.steps if s.op_type == "If"]
    assert step.kernel.bodies["then_branch"].plan.total_steps == 1


def passthrough_if_model() -> onnx.ModelProto:
    """y = If(sum(x) > 0) {Neg(x)} else {Identity(x)}: the else branch only passes an
    outer value through (a classifier's "verify only above the threshold" head)."""
    then_g = helper.make_graph(
        [helper.make_node("Neg", ["r"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F, [3, 5])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["r"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", F, [3, 5])],
    )
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
        helper.make_node("Greater", ["total", "zero"], ["cond"]),
        helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
    ]
    return _model(
        nodes,
        [helper.make_tensor_value_info("x", F, [3, 5])],
        [helper.make_tensor_value_info("y", F, [3, 5])],
        [numpy_helper.from_array(np.float32(0.0), "zero")],
    )


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_a_passthrough_branch_returns_its_argument_without_a_plan_run(backend):
    proto = passthrough_if_model()
    sess = InferenceSession(proto.SerializeToString(), backend=backend)
    bodies = sess.plan.steps[-1].kernel.bodies
    assert bodies["else_branch"].passthrough == (0,)
    assert bodies["then_branch"].passthrough is None
    x = np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)
    for sign in (1, -1, 1):  # the measuring run, then bound runs; both branches
        feed = {"x": np.abs(x) * sign}
        (y,) = sess.run(None, feed)
        want = -np.maximum(feed["x"], 0) if sign > 0 else np.maximum(feed["x"], 0)
        np.testing.assert_array_equal(y, want)
    seen: dict[str, np.ndarray] = {}
    (y,) = sess.executor.run({"x": -np.abs(x)}, ["y"], on_value=lambda n, a: seen.setdefault(n, a.copy()))
    assert "branch/else_branch/e_out" in seen  # an observed run still runs the body's plan
    np.testing.assert_array_equal(y, np.zeros_like(x))


def _if_step(sess):
    """The If's step in the fast loop of the session's one bound signature."""
    (bound,) = sess.executor.bound_runs().values()
    (k,) = [s.index for s in sess.plan.steps if s.op_type == "If"]
    steps = bound.direct_steps if bound.direct_steps is not None else bound.make_direct()
    (step,) = [t for t in steps if t[0] == k]
    return sess.plan.steps[k], step, bound


@pytest.mark.parametrize("backend", ["reference", "native"])
def test_if_binds_its_constant_outer_values_into_a_direct_call(backend):
    """The If passes W, b (then) and s (else) from the outer graph on every run; bound per
    signature (control_flow._if_specializer), the fast loop's call reads the condition and
    x only, and either branch gives the bytes of the generic call (a fresh session's
    measuring run)."""
    proto = if_model()
    sess = InferenceSession(proto.SerializeToString(), backend=backend)
    rng = np.random.default_rng(11)
    x = np.abs(rng.standard_normal((3, 5)).astype(np.float32))
    for sign in (1, -1, -1, 1, -1):  # the measuring run, then bound runs of both branches
        feed = {"x": x * sign}
        (want,) = _run(proto, feed, backend)
        (got,) = sess.run(None, feed)
        assert got.tobytes() == want.tobytes() and got.shape == want.shape, sign
        x = x + np.float32(0.25)
    plan_step, step, _ = _if_step(sess)
    _, _, _, ins, n_in, *_ = step
    cond, x_slot = plan_step.inputs[0], sess.plan.inputs["x"]
    assert n_in == -2 and ins == (cond, x_slot), (n_in, ins, plan_step.inputs)


def test_a_branch_returning_an_arena_value_hands_out_a_copy():
    """else returns r = Relu(x), which lives in the outer arena; the If reads r, so its
    results are copied out of the arena when they share it, and that check stays on its
    direct call: a result kept from one run is not overwritten by the next."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["r", "s"], ["t_out"])],
        "then",
        [],
        [helper.make_tensor_value_info("t_out", F, [3, 5])],
    )
    else_g = helper.make_graph(
        [helper.make_node("Identity", ["r"], ["e_out"])],
        "else",
        [],
        [helper.make_tensor_value_info("e_out", F, [3, 5])],
    )
    proto = _model(
        [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("ReduceSum", ["x"], ["total"], keepdims=0),
            helper.make_node("Greater", ["total", "zero"], ["cond"]),
            helper.make_node("If", ["cond"], ["y"], name="branch", then_branch=then_g, else_branch=else_g),
        ],
        [helper.make_tensor_value_info("x", F, [3, 5])],
        [helper.make_tensor_value_info("y", F, [3, 5])],
        [numpy_helper.from_array(np.float32(0.0), "zero"), numpy_helper.from_array(np.float32(3.0), "s")],
    )
    sess = InferenceSession(proto.SerializeToString(), backend="native")
    x = np.random.default_rng(2).standard_normal((3, 5)).astype(np.float32)
    x[0] = -9.0  # a negative sum: the else branch
    sess.run(None, {"x": x})  # the measuring run
    kept = [sess.run(None, {"x": x + np.float32(k)})[0] for k in (0, -1)]
    sess.run(None, {"x": x - np.float32(2)})
    for k, y in zip((0, -1), kept):
        np.testing.assert_array_equal(y, np.maximum(x + np.float32(k), 0))
    _, step, bound = _if_step(sess)
    assert step[4] < 0, "the If's call is direct"
    assert bound.arena is not None and not any(np.may_share_memory(y, bound.arena) for y in kept)
