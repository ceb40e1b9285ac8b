"""Kernels specialized per input signature (Kernel.specialize, quanta.targets.base
Specialization): the executor binds them when it binds a signature and they compute
exactly what the generic kernels compute, for any thread count, with or without the
arena, and hand a call they cannot take (a non-contiguous view) to the generic kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="the native extension is not built")


def _const(name: str, value: np.ndarray):
    return numpy_helper.from_array(np.asarray(value), name)


def small_ops_model():
    """x [3, 7, 17] float: a hardswish written out (Add, Clip, Mul, Div), a Slice with
    steps, a Gather of constant indices, Unsqueeze / Squeeze, a Transpose, Abs, Sqrt, a
    square, and a QuantizeLinear with a non-zero zero point; z = x2 + x (two run-time operands)."""
    nodes = [
        helper.make_node("Add", ["x", "three"], ["a"], name="add3"),
        helper.make_node("Clip", ["a", "zero", "six"], ["c"], name="clip"),
        helper.make_node("Mul", ["x", "c"], ["m"], name="mul"),
        helper.make_node("Div", ["m", "six"], ["hs"], name="div"),
        helper.make_node("Slice", ["hs", "starts", "ends", "axes", "steps"], ["sl"], name="slice"),
        helper.make_node("Gather", ["sl", "idx"], ["ga"], name="gather", axis=2),
        helper.make_node("Unsqueeze", ["ga", "ax0"], ["un"], name="unsq"),
        helper.make_node("Transpose", ["un"], ["tr"], name="transpose", perm=[0, 1, 2, 4, 3]),
        helper.make_node("Squeeze", ["tr", "ax0"], ["sq"], name="sq"),
        helper.make_node("Abs", ["sq"], ["ab"], name="abs"),
        helper.make_node("Sqrt", ["ab"], ["rt"], name="sqrt"),
        helper.make_node("Pow", ["rt", "two"], ["pw"], name="pow"),
        helper.make_node("QuantizeLinear", ["pw", "qs", "qz"], ["q"], name="quant"),
        helper.make_node("Relu", ["x2"], ["r2"], name="relu"),
        helper.make_node("Add", ["r2", "x"], ["z"], name="add_xx"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, [3, 7, 17]),
        ],
        [
            helper.make_tensor_value_info("q", TensorProto.UINT8, None),
            helper.make_tensor_value_info("sl", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
        [
            _const("three", np.float32(3)),
            _const("zero", np.float32(0)),
            _const("two", np.float32(2)),
            _const("six", np.float32(6)),
            _const("starts", np.array([1, 16], np.int64)),
            _const("ends", np.array([7, 0], np.int64)),
            _const("axes", np.array([1, 2], np.int64)),
            _const("steps", np.array([2, -3], np.int64)),
            _const("idx", np.array([[0, 4], [2, -1]], np.int64)),
            _const("ax0", np.array([0], np.int64)),
            _const("qs", np.float32(0.0137)),
            _const("qz", np.uint8(37)),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _session(backend: str, threads: int) -> quanta.InferenceSession:
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    return quanta.InferenceSession(small_ops_model().SerializeToString(), opts, backend=backend)


def _feeds(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "x": rng.normal(0, 4, (3, 7, 17)).astype(np.float32),
        "x2": rng.normal(0, 4, (3, 7, 17)).astype(np.float32),
    }


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_specialized_steps_match_the_reference(threads: int) -> None:
    rng = np.random.default_rng(threads)
    ref = _session("reference", 1)
    sess = _session("native", threads)
    for _ in range(3):  # the measuring run, then the bound (specialized) runs
        feeds = _feeds(rng)
        want = ref.run(None, feeds)
        got = sess.run(None, feeds)
        for w, g in zip(want, got, strict=True):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_array_equal(g, w)
    specialized = _specialized_names(sess)
    # every step took its specialization
    assert specialized == {s.node.name for s in sess.plan.steps}


def test_a_view_the_specialized_call_refuses_runs_the_generic_kernel() -> None:
    """The same signature fed a non-contiguous view: the C++ call refuses it and the
    generic kernel (which makes it contiguous) computes the same bytes."""
    rng = np.random.default_rng(7)
    ref = _session("reference", 1)
    sess = _session("native", 2)
    feeds = _feeds(rng)
    sess.run(None, feeds)
    wide = rng.normal(0, 4, (3, 7, 34)).astype(np.float32)
    strided = {"x": wide[:, :, ::2], "x2": np.asfortranarray(feeds["x2"])}
    assert not strided["x"].flags.c_contiguous and not strided["x2"].flags.c_contiguous
    for w, g in zip(ref.run(None, strided), sess.run(None, strided), strict=True):
        np.testing.assert_array_equal(g, w)


def test_thread_count_never_changes_the_bytes_of_a_large_step() -> None:
    """Above the small-step threshold a specialized step keeps the session's threads;
    the bytes are the same as one thread's."""
    rng = np.random.default_rng(3)
    n = 1 << 16
    g = helper.make_graph(
        [
            helper.make_node("Mul", ["x", "x"], ["m"], name="mul"),
            helper.make_node("Clip", ["m", "lo", "hi"], ["y"], name="clip"),
        ],
        "big",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n + 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("lo", np.float32(-1.5)), _const("hi", np.float32(2.25))],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    x = rng.normal(0, 2, (1, n + 5)).astype(np.float32)
    outs = []
    for threads in (1, 2):
        opts = quanta.SessionOptions()
        opts.intra_op_num_threads = threads
        sess = quanta.InferenceSession(proto, opts)
        sess.run(None, {"x": x})
        outs.append(sess.run(None, {"x": x})[0])
    np.testing.assert_array_equal(outs[0], outs[1])
    np.testing.assert_array_equal(outs[0], np.minimum(np.maximum(x * x, np.float32(-1.5)), np.float32(2.25)))


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize(
    ("pads", "axes"),
    [
        ([0, 2, 3, 1, 0, 4], None),  # two axes padded, one not
        ([5, 7], [-1]),  # one axis; reflect wider than the axis (np.pad reflects repeatedly)
        ([1, -2, 0, 3, 2, 1], None),  # cropping too
    ],
)
def test_pad_specialized_is_the_twin(mode: str, pads: list[int], axes: list[int] | None) -> None:
    rng = np.random.default_rng(len(pads))
    inputs = ["x", "pads", "value"] + (["axes"] if axes is not None else [])
    inits = [_const("pads", np.array(pads, np.int64)), _const("value", np.float32(-2.5))]
    if axes is not None:
        inits.append(_const("axes", np.array(axes, np.int64)))
    g = helper.make_graph(
        [helper.make_node("Pad", inputs, ["y"], name="pad", mode=mode)],
        "pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()
    ref = quanta.InferenceSession(proto, backend="reference")
    sess = quanta.InferenceSession(proto)
    for _ in range(3):
        x = rng.normal(0, 3, (3, 4, 5)).astype(np.float32)
        want = ref.run(None, {"x": x})[0]
        got = sess.run(None, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    (bound,) = sess.executor.bound_runs().values()
    specialized = bound.steps[0][1] is not sess.executor._plain[0][1]
    assert specialized and not sess.fallbacks  # the native Pad's plan, built once


@pytest.mark.parametrize(
    ("op", "axes", "keepdims", "specialized"),
    [
        ("ReduceMean", [1, 2], 0, True),  # trailing axes: the rows are x itself
        ("ReduceL2", [-1], 1, True),
        ("ReduceSum", [-1], 0, True),  # no post-step
        ("ReduceLogSumExp", [1, 2], 1, True),  # a row op of its own (not the rows kernel alone)
        ("ReduceSum", [0, 2], 1, False),  # a transposed copy first: the generic call
        ("ReduceL1", [2], 1, False),  # a pre-step (|x|): the generic call
    ],
)
def test_reduce_specialized_is_the_twin(op: str, axes: list[int], keepdims: int, specialized: bool) -> None:
    rng = np.random.default_rng(11)
    g = helper.make_graph(
        [helper.make_node(op, ["x", "axes"], ["y"], name="red", keepdims=keepdims)],
        "red",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("axes", np.array(axes, np.int64))],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    ref = quanta.InferenceSession(proto, backend="reference")
    sess = quanta.InferenceSession(proto)
    for _ in range(3):
        x = rng.normal(0, 3, (3, 7, 300)).astype(np.float32)
        want, got = ref.run(None, {"x": x})[0], sess.run(None, {"x": x})[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
    (bound,) = sess.executor.bound_runs().values()
    assert (bound.steps[0][1] is not sess.executor._plain[0][1]) == specialized


@pytest.mark.parametrize("threads", [1, 2])
def test_float_conv_specialized_is_the_generic_kernel(threads: int) -> None:
    """The float GEMM family is not bit-exact with its twin (docs/float-ops.md), so the
    specialized call is held to the generic native call: the measuring run's bytes."""
    rng = np.random.default_rng(5)
    g = helper.make_graph(
        [
            helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1d", pads=[1, 2], strides=[2]),
            helper.make_node("Unsqueeze", ["c1", "ax"], ["c2"], name="unsq"),
            helper.make_node("Conv", ["c2", "w2"], ["y"], name="conv2d", group=7, pads=[0, 1, 0, 1]),
        ],
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 301])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("w1", rng.normal(0, 1, (7, 3, 5)).astype(np.float32)),
            _const("b1", rng.normal(0, 1, (7,)).astype(np.float32)),
            _const("ax", np.array([2], np.int64)),
            _const("w2", rng.normal(0, 1, (14, 1, 1, 3)).astype(np.float32)),
        ],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(proto, opts)
    x = rng.normal(0, 1, (1, 3, 301)).astype(np.float32)
    first = sess.run(None, {"x": x})[0]  # the measuring run: generic calls
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], first)
    (bound,) = sess.executor.bound_runs().values()
    plain = {t[0]: t[1] for t in sess.executor._plain}
    assert all(t[1] is not plain[t[0]] for t in bound.steps)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize(
    ("m", "c_shape", "attrs", "specialized"),
    [
        (1, (45,), {"alpha": 0.7, "beta": 1.3, "transB": 1}, True),  # an LSTM cell's row
        (5, (), {"beta": -0.25}, True),  # a scalar C broadcast to every column
        (3, None, {"transB": 1}, True),  # no C
        (5, (1, 45), {}, True),  # C [1, N]: still a column bias
        (3, (3, 45), {"beta": 0.5}, False),  # a full C: added after, the generic call
        (3, (45,), {"transA": 1}, False),  # A transposed: the generic call copies it
    ],
)
def test_float_gemm_specialized_is_the_generic_kernel(m, c_shape, attrs, specialized, relu, threads) -> None:
    """A Gemm with a packed constant B is specialized to one positional matmul_f32 call
    (float_gemm._gemm_specialized) that gives the generic native call's bytes, into the
    arena when a Relu follows it and into a fresh array when it is the graph's output;
    a full C or a transposed A keep the generic call."""
    rng = np.random.default_rng(m * 7 + len(attrs))
    k, n = 37, 45
    a_shape = (k, m) if attrs.get("transA") else (m, k)
    b_shape = (n, k) if attrs.get("transB") else (k, n)
    inputs = ["a", "b"] if c_shape is None else ["a", "b", "c"]
    inits = [_const("b", rng.normal(0, 1, b_shape).astype(np.float32))]
    if c_shape is not None:
        inits.append(_const("c", np.asarray(rng.normal(0, 1, c_shape), np.float32)))
    nodes = [helper.make_node("Gemm", inputs, ["g" if relu else "y"], name="gemm", **attrs)]
    if relu:
        nodes.append(helper.make_node("Relu", ["g"], ["y"], name="relu"))
    g = helper.make_graph(
        nodes,
        "gemm",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, list(a_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(proto, opts)
    a, a2 = (rng.normal(0, 1, a_shape).astype(np.float32) for _ in range(2))
    first = sess.run(None, {"a": a})[0]  # the measuring run: generic calls
    # a fresh session's measuring run on a2: the generic call's bytes for it
    want = quanta.InferenceSession(proto, opts).run(None, {"a": a2})[0]
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"a": a})[0], first)
        np.testing.assert_array_equal(sess.run(None, {"a": a2})[0], want)
    (bound,) = sess.executor.bound_runs().values()
    plain = {t[0]: t[1] for t in sess.executor._plain}
    assert (bound.steps[0][1] is not plain[0]) == specialized


@pytest.mark.parametrize("relu", [False, True])
@pytest.mark.parametrize(
    ("shapes", "axis"), [([(1, 1, 5), (1, 1, 5)], 0), ([(3, 2, 7), (3, 5, 7), (3, 1, 7)], -2)]
)
def test_concat_specialized_is_the_twin(shapes: list[tuple[int, ...]], axis: int, relu: bool) -> None:
    """Concat of one signature calls np.concatenate directly: the twin's bytes, into the
    arena when a Relu reads it and into a fresh array when it is the graph's output (an
    LSTM state's two rows stacked)."""
    rng = np.random.default_rng(len(shapes) + axis)
    names = [f"x{k}" for k in range(len(shapes))]
    nodes = [helper.make_node("Concat", names, ["c" if relu else "y"], name="cat", axis=axis)]
    if relu:
        nodes.append(helper.make_node("Relu", ["c"], ["y"], name="relu"))
    g = helper.make_graph(
        nodes,
        "cat",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(sh)) for n, sh in zip(names, shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    ref = quanta.InferenceSession(proto, backend="reference")
    sess = quanta.InferenceSession(proto)
    kept = []
    for _ in range(3):
        feeds = {n: rng.normal(0, 3, sh).astype(np.float32) for n, sh in zip(names, shapes)}
        want, got = ref.run(None, feeds)[0], sess.run(None, feeds)[0]
        assert got.shape == want.shape
        np.testing.assert_array_equal(got, want)
        kept.append((got, want))
    for got, want in kept:  # a later run did not write into an earlier result
        np.testing.assert_array_equal(got, want)
    (bound,) = sess.executor.bound_runs().values()
    assert bound.steps[0][1] is not sess.executor._plain[0][1]


@pytest.mark.parametrize(
    ("shape", "sizes", "axis"),
    [((3, 7, 17), [2, 0, 5], 1), ((3, 7, 17), None, -1), ((1, 7, 17), [2, 0, 5], 1), ((1, 7, 17), None, 2)],
)
def test_split_parts_of_an_arena_value_stay_valid_while_read(
    shape: tuple[int, ...], sizes: list[int] | None, axis: int
) -> None:
    """Split of an arena-resident value (the Add writes into the arena) into parts that
    later steps read one by one: a contiguous part (batch 1, a middle axis) is a view of
    the input, and the planner keeps the input's bytes until the last part is read; a
    strided part is a copy. Three runs with new data give the reference's results."""
    rng = np.random.default_rng(9)
    ins = ["s", "sizes"] if sizes is not None else ["s"]
    n_out = 3
    nodes = [
        helper.make_node("Add", ["x", "x"], ["s"], name="add"),
        helper.make_node(
            "Split",
            ins,
            [f"p{k}" for k in range(n_out)],
            name="split",
            axis=axis,
            **({} if sizes is not None else {"num_outputs": n_out}),
        ),
        helper.make_node("Neg", ["p0"], ["n0"], name="neg0"),
        helper.make_node("Mul", ["n0", "n0"], ["m0"], name="mul0"),
        *[helper.make_node("Neg", [f"p{k}"], [f"n{k}"], name=f"neg{k}") for k in range(1, n_out)],
        helper.make_node("Concat", ["m0", *[f"n{k}" for k in range(1, n_out)]], ["y"], name="cat", axis=axis),
    ]
    inits = [_const("sizes", np.array(sizes, np.int64))] if sizes is not None else []
    g = helper.make_graph(
        nodes,
        "split",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)]).SerializeToString()
    ref = quanta.InferenceSession(proto, backend="reference")
    sess = quanta.InferenceSession(proto)
    for _ in range(3):
        x = rng.normal(0, 3, shape).astype(np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    (bound,) = sess.executor.bound_runs().values()
    slots = sess.plan.slots
    parts = {slots[k].name for k, root in bound.memory.aliases.items() if slots[root].name == "s"}
    assert parts == {"p0", "p1", "p2"}


def test_an_overridden_initializer_is_not_a_constant_of_the_signature() -> None:
    """An input with an initializer (its default) may be fed another value of the same
    shape: a specialization must not have frozen the default."""
    g = helper.make_graph(
        [
            helper.make_node("Clip", ["x", "lo", "hi"], ["c"], name="clip"),
            helper.make_node("Gather", ["c", "idx"], ["y"], name="gather", axis=1),
        ],
        "overridable",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 9]),
            helper.make_tensor_value_info("hi", TensorProto.FLOAT, []),
            helper.make_tensor_value_info("idx", TensorProto.INT64, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("lo", np.float32(-1)),
            _const("hi", np.float32(1)),
            _const("idx", np.array([0, 4, 8], np.int64)),
        ],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess = quanta.InferenceSession(proto)
    x = np.linspace(-5, 5, 18, dtype=np.float32).reshape(2, 9)
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], np.clip(x, -1, 1)[:, [0, 4, 8]])
    fed = {"x": x, "hi": np.float32(3), "idx": np.array([8, 1, 2], np.int64)}
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, fed)[0], np.clip(x, -1, 3)[:, [8, 1, 2]])


def qgemm_model(m: int, k: int, n: int, *, float_out: bool, trans_b: int):
    """x [m, k] uint8 -> com.microsoft QGemm (prepacked int8 B, per-column scales, an int32
    C, non-zero zero points) -> QLinearMatMul (prepacked, per-column) when the QGemm output
    is 8-bit."""
    rng = np.random.default_rng(m * 1000 + n)
    b = rng.integers(-128, 128, (n, k) if trans_b else (k, n)).astype(np.int8)
    w2 = rng.integers(-128, 128, (n, 7)).astype(np.int8)
    ms = "com.microsoft"
    qgemm_in = ["x", "sa", "za", "b", "sb", "zb", "c"] + ([] if float_out else ["sy", "zy"])
    nodes = [helper.make_node("QGemm", qgemm_in, ["y"], name="qgemm", domain=ms, transB=trans_b, alpha=0.75)]
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.FLOAT if float_out else TensorProto.UINT8, None)
    ]
    inits = [
        _const("sa", np.float32(0.021)),
        _const("za", np.uint8(131)),
        _const("b", b),
        _const("sb", rng.uniform(0.002, 0.01, n).astype(np.float32)),
        _const("zb", np.zeros(n, np.int8)),
        _const("c", rng.integers(-3000, 3000, n).astype(np.int32)),
        _const("sy", np.float32(0.37)),
        _const("zy", np.uint8(17)),
        _const("w2", w2),
        _const("s2", rng.uniform(0.002, 0.01, 7).astype(np.float32)),
        _const("z2", np.zeros(7, np.int8)),
        _const("so", np.float32(0.11)),
        _const("zo", np.uint8(121)),
    ]
    if not float_out:
        nodes.append(
            helper.make_node(
                "QLinearMatMul", ["y", "sy", "zy", "w2", "s2", "z2", "so", "zo"], ["o"], name="qmm"
            )
        )
        outputs = [helper.make_tensor_value_info("o", TensorProto.UINT8, None)]
    g = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.UINT8, [m, k])], outputs, inits
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(ms, 1)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    "m,k,n,float_out,trans_b", [(1, 259, 17, False, 1), (3, 1536, 128, True, 0), (70, 300, 130, False, 0)]
)
def test_qgemm_and_qlinear_matmul_specialized(m, k, n, float_out, trans_b, threads) -> None:
    """Failure signature: the specialized call dropping C, alpha, the output zero point or
    the float output (a QGemm without y_scale), or a small product sent to the pool with
    different bytes. The steps must have taken the specialization (not the generic path)."""
    proto = qgemm_model(m, k, n, float_out=float_out, trans_b=trans_b)
    rng = np.random.default_rng(threads)
    so = quanta.SessionOptions()
    so.intra_op_num_threads = threads
    ref = quanta.InferenceSession(proto.SerializeToString(), backend="reference")
    sess = quanta.InferenceSession(proto.SerializeToString(), so)
    for _ in range(3):
        feeds = {"x": rng.integers(0, 256, (m, k)).astype(np.uint8)}
        (want,), (got,) = ref.run(None, feeds), sess.run(None, feeds)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    specialized = _specialized_names(sess)
    assert specialized == {s.node.name for s in sess.plan.steps}


def test_the_fast_loop_calls_specialized_kernels_directly() -> None:
    """Every guarded specialization runs as a direct call in the fast loop (no ctx, the
    inputs it reads), with its guarded call kept for a refused argument."""
    from quanta.runtime.execute import _direct

    sess = _session("native", 1)
    sess.executor.native_programs = False  # every step in the Python loop (no programs)
    feeds = _feeds(np.random.default_rng(3))
    for _ in range(2):  # the measuring run binds, the next one makes the direct steps
        sess.run(None, feeds)
    (bound,) = sess.executor.bound_runs().values()
    assert bound.direct_steps is not None
    direct = {t[0]: t for t in bound.direct_steps}
    for t in bound.steps:
        if getattr(t[1], "direct", None) is None or t[0] not in direct:
            continue
        d = direct[t[0]]
        assert d == _direct(t) and d[4] < 0 and d[1] is t[1].direct
        assert bound.guards[t[0]] is t[1]
        reads = t[1].reads
        assert len(d[3]) == (
            len(t[3]) if reads is None else len(reads) if isinstance(reads, tuple) else reads
        )
    quant = next(s.index for s in sess.plan.steps if s.op_type == "QuantizeLinear")
    assert direct[quant][4] == -1  # scale and zero point are bound in: x alone
    assert len(bound.guards) >= 10


def _specialized_names(sess: quanta.InferenceSession) -> set[str]:
    """The nodes whose step in the session's one bound run is not the plain kernel call."""
    (bound,) = sess.executor.bound_runs().values()
    plain = {t[0]: t[1] for t in sess.executor._plain}
    return {sess.plan.steps[t[0]].node.name for t in bound.steps if t[1] is not plain[t[0]]}


def _specialized_and_generic_equal_the_reference(
    model,
    threads: int,
    seed: int,
    sigma: float = 1.0,
    level: object = None,
    *,
    shape: tuple[int, ...] = (3, 7, 17),
    draw=None,
) -> set[str]:
    """Runs ``model`` (input "x" of ``shape``) natively three times (the measuring run,
    then the bound, specialized runs) and once on a non-contiguous x (every other element
    of a last axis twice as long: the generic kernels), each equal to the reference
    target's bytes (every output); the specialized nodes' names. ``draw(rng, shape)``: the values of x
    (default: float32 normal of deviation ``sigma``); ``threads`` 0: the session's
    default."""
    if draw is None:

        def draw(rng, dims):
            return rng.normal(0, sigma, dims).astype(np.float32)

    p = model.SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    if level is not None:
        opts.graph_optimization_level = level
    sess = quanta.InferenceSession(p, opts)
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(seed)
    for _ in range(3):
        feeds = {"x": draw(rng, shape)}
        for got, want in zip(sess.run(None, feeds), ref.run(None, feeds), strict=True):
            np.testing.assert_array_equal(got, want)
    specialized = _specialized_names(sess)
    strided = {"x": draw(rng, (*shape[:-1], 2 * shape[-1]))[..., ::2]}
    for got, want in zip(sess.run(None, strided), ref.run(None, strided), strict=True):
        np.testing.assert_array_equal(got, want)
    return specialized


def _codes_of(dtype):
    """A ``draw`` of :func:`_specialized_and_generic_equal_the_reference`: every code of
    the integer ``dtype``."""
    info = np.iinfo(dtype)

    def draw(rng, dims):
        return rng.integers(info.min, info.max + 1, dims).astype(dtype)

    return draw


def _norm_where_model():
    """x [3, 7, 17]: LayerNormalization with constant scale [17] and bias [1] (broadcast
    to the normalized shape), then Where(x > 0.5, ln, fill [7, 1]): a run-time
    condition and a broadcast y; a Softmax along the last axis."""
    rng = np.random.default_rng(11)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g", "b"], ["ln"], name="ln", axis=-1, epsilon=1e-3),
        helper.make_node("Greater", ["x", "half"], ["cond"], name="gt"),
        helper.make_node("Where", ["cond", "ln", "fill"], ["w"], name="where"),
        helper.make_node("Softmax", ["w"], ["y"], name="softmax", axis=-1),
    ]
    g = helper.make_graph(
        nodes,
        "norm_where",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("g", rng.normal(1, 0.3, 17).astype(np.float32)),
            _const("b", rng.normal(0, 0.3, (1,)).astype(np.float32)),
            _const("half", np.float32(0.5)),
            _const("fill", rng.normal(0, 1, (7, 1)).astype(np.float32)),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_layer_normalization_where_softmax_specialized_are_the_generic_kernels(threads: int) -> None:
    """The specialized LayerNormalization (scale and bias broadcast once), Where (the
    broadcast shape found once) and Softmax give the reference's bytes, and a
    non-contiguous x goes to the generic kernels with the same result."""
    specialized = _specialized_and_generic_equal_the_reference(_norm_where_model(), threads, 5, 2.0)
    assert {"ln", "where", "softmax"} <= specialized


@pytest.mark.parametrize(
    ("indices", "batch_dims"),
    [
        (np.array([[0, 6], [2, -1], [-3, 0]], np.int64), 0),  # rows of x [3, 7, 17], negative too
        (np.array([[[1], [5]], [[0], [0]], [[6], [-7]]], np.int64), 1),  # per batch
        (np.array([[1, 2, 16], [0, 0, -17]], np.int64), 0),  # single elements
    ],
)
def test_gather_nd_specialized_with_constant_indices_is_the_generic_kernel(indices, batch_dims) -> None:
    g = helper.make_graph(
        [helper.make_node("GatherND", ["x", "idx"], ["y"], name="gnd", batch_dims=batch_dims)],
        "gnd",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("idx", indices)],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess = quanta.InferenceSession(p)
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(2)
    for _ in range(3):
        feeds = {"x": rng.normal(0, 2, (3, 7, 17)).astype(np.float32)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    (bound,) = sess.executor.bound_runs().values()
    plain = {t[0]: t[1] for t in sess.executor._plain}
    assert all(t[1] is not plain[t[0]] for t in bound.steps)
    wide = rng.normal(0, 2, (3, 7, 34)).astype(np.float32)
    strided = {"x": wide[:, :, ::2]}
    np.testing.assert_array_equal(sess.run(None, strided)[0], ref.run(None, strided)[0])


@pytest.mark.parametrize(
    ("dtype", "scales", "sizes"),
    [
        (np.float32, [1.0, 1.0, 2.0, 2.0], None),  # a YOLO / FPN 2x upsample
        (np.uint8, [1.0, 1.5, 2.0, 0.5], None),  # three axes, one shrinking
        (np.float32, None, [2, 5, 9, 4]),  # sizes
    ],
)
def test_nearest_resize_specialized_gives_the_twin_bytes(dtype, scales, sizes) -> None:
    """Nearest Resize with constant scales / sizes: the specialized call (the gathers found
    once, the least-growing axis first) gives the reference's bytes on later runs."""
    rng = np.random.default_rng(5)
    inits = []
    ins = ["x", "", "scales"] if scales is not None else ["x", "", "", "sizes"]
    if scales is not None:
        inits.append(_const("scales", np.array(scales, np.float32)))
    else:
        inits.append(_const("sizes", np.array(sizes, np.int64)))
    elem = TensorProto.FLOAT if dtype is np.float32 else TensorProto.UINT8
    g = helper.make_graph(
        [
            helper.make_node(
                "Resize",
                ins,
                ["y"],
                mode="nearest",
                coordinate_transformation_mode="asymmetric",
                nearest_mode="floor",
                name="resize",
            )
        ],
        "resize",
        [helper.make_tensor_value_info("x", elem, [2, 4, 7, 9])],
        [helper.make_tensor_value_info("y", elem, None)],
        inits,
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)]).SerializeToString()
    ref = quanta.InferenceSession(proto, backend="reference")
    sess = quanta.InferenceSession(proto)
    for _ in range(3):
        x = (
            rng.integers(0, 255, (2, 4, 7, 9)).astype(dtype)
            if dtype is np.uint8
            else rng.normal(0, 3, (2, 4, 7, 9))
        )
        x = x.astype(dtype)
        assert sess.run(None, {"x": x})[0].tobytes() == ref.run(None, {"x": x})[0].tobytes()
    (bound,) = sess.executor.bound_runs().values()
    plain = {t[0]: t[1] for t in sess.executor._plain}
    assert all(t[1] is not plain[t[0]] for t in bound.steps)


def _elu_half_model():
    """x [3, 7, 17] float: Elu (alpha 0.37), Elu (alpha 1) of its result's negation, a Cast
    to float16 and back (widen_half_islands' edges, here written in the file)."""
    nodes = [
        helper.make_node("Elu", ["x"], ["e1"], name="elu_a", alpha=0.37),
        helper.make_node("Neg", ["e1"], ["n"], name="neg"),
        helper.make_node("Elu", ["n"], ["e2"], name="elu_1"),
        helper.make_node("Cast", ["e2"], ["h"], name="to_f16", to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["h"], ["y"], name="to_f32", to=TensorProto.FLOAT),
    ]
    g = helper.make_graph(
        nodes,
        "elu_half",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
def test_elu_and_half_casts_specialized_are_the_generic_kernels(threads: int) -> None:
    """The specialized Elu (alpha bound) and float32 <-> float16 Casts give the reference's
    bytes, and a non-contiguous x goes to the generic kernels with the same result."""
    specialized = _specialized_and_generic_equal_the_reference(
        _elu_half_model(), threads, 9, 3.0, level=quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    assert {"elu_a", "elu_1", "to_f16", "to_f32"} <= specialized


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("id_type", [np.int64, np.int32])
def test_gather_of_run_time_ids_specialized_is_the_generic_kernel(threads: int, axis: int, id_type) -> None:
    """An embedding lookup (token ids fed at run time, int64 or int32 as Keras and Paddle
    cast them) takes the specialized call; a negative id goes to the generic kernel (which
    wraps it), one out of range raises the reference's error, and a value of another shape
    binds its own signature."""
    table = np.random.default_rng(4).normal(0, 1, (17, 23)).astype(np.float32)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(id_type))
    g = helper.make_graph(
        [
            helper.make_node("Gather", ["table", "ids"], ["e"], name="embed", axis=axis),
            helper.make_node("Relu", ["e"], ["y"], name="relu"),  # e lives in the arena
        ],
        "emb",
        [helper.make_tensor_value_info("ids", elem, ["b", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("table", table)],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(p, opts)
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(5)
    n = table.shape[axis]
    for shape in ((2, 11), (2, 11), (3, 5)):
        feeds = {"ids": rng.integers(0, n, shape).astype(id_type)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    (bound, _) = sess.executor.bound_runs().values()
    assert any(getattr(t[1], "direct", None) is not None for t in bound.steps)
    negative = {"ids": np.array([[-1, 3, -n]], id_type)}
    np.testing.assert_array_equal(sess.run(None, negative)[0], ref.run(None, negative)[0])
    with pytest.raises(Exception, match="Gather"):
        sess.run(None, {"ids": np.array([[0, n]], id_type)})


def test_gather_from_a_string_table_specialized_is_the_reference() -> None:
    """A g2p head's Gather of phoneme strings by run-time ids takes the specialized call
    (np.take, the twin's): the same strings, negative ids counted from the end, an id out
    of range the reference's error."""
    words = np.array([f"ph{k}" * (k % 3 + 1) for k in range(17)], dtype=object)
    g = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["y"], name="names")],
        "names",
        [helper.make_tensor_value_info("ids", TensorProto.INT64, ["b", "t"])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, None)],
        [numpy_helper.from_array(words, "table")],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess = quanta.InferenceSession(p)
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(8)
    for ids in (rng.integers(0, 17, (3, 7)), rng.integers(0, 17, (3, 7)), np.array([[-1, 4, -17]])):
        feeds = {"ids": ids.astype(np.int64)}
        got, want = sess.run(None, feeds)[0], ref.run(None, feeds)[0]
        assert got.dtype == want.dtype and got.shape == want.shape and got.tolist() == want.tolist()
    assert "names" in _specialized_names_any(sess)
    with pytest.raises(Exception, match="Gather"):
        sess.run(None, {"ids": np.array([[0, 17]], np.int64)})


def _specialized_names_any(sess: quanta.InferenceSession) -> set[str]:
    """:func:`_specialized_names` over every bound run of the session."""
    plain = {t[0]: t[1] for t in sess.executor._plain}
    return {
        sess.plan.steps[t[0]].node.name
        for bound in sess.executor.bound_runs().values()
        for t in bound.steps
        if t[1] is not plain[t[0]]
    }


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("opset", [11, 13])
def test_softmax_of_any_opset_and_arg_extremes_specialized_are_the_generic_kernels(
    threads: int, opset: int
) -> None:
    """Softmax before opset 13 (the rows of the 2-D coercion at axis 1: 7 x 17 values a
    row) and from 13 (the last axis), ArgMax and ArgMin (keepdims either way, the last
    index of ties from opset 12) take specialized calls with the reference's bytes; a
    non-contiguous x runs the generic kernels with the same results."""
    last = {"select_last_index": 1} if opset >= 12 else {}
    nodes = [
        helper.make_node("Softmax", ["x"], ["s"], name="softmax"),
        helper.make_node("ArgMax", ["s"], ["am"], name="argmax", axis=1, keepdims=0),
        helper.make_node("Floor", ["x"], ["fl"], name="floor"),  # ties for ArgMin
        helper.make_node("ArgMin", ["fl"], ["an"], name="argmin", axis=-1, keepdims=1, **last),
    ]
    g = helper.make_graph(
        nodes,
        "heads",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [
            helper.make_tensor_value_info("s", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("am", TensorProto.INT64, None),
            helper.make_tensor_value_info("an", TensorProto.INT64, None),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    names = _specialized_and_generic_equal_the_reference(model, threads, opset, 2.0)
    assert {"softmax", "argmax", "argmin"} <= names


@pytest.mark.parametrize("threads", [1, 2])
def test_expand_specialized_is_the_generic_kernel(threads: int) -> None:
    """A grouped-query repeat (Unsqueeze, Expand to a shape computed from the input's
    shape, Reshape) and an Expand to a constant shape take the specialized copy, with the
    reference's bytes, for two signatures and a non-contiguous input."""
    nodes = [
        helper.make_node("Shape", ["k"], ["ks"], name="shape"),
        helper.make_node("Gather", ["ks", "i0"], ["b"], name="g0", axis=0),
        helper.make_node("Gather", ["ks", "i2"], ["s"], name="g2", axis=0),
        helper.make_node("Concat", ["b", "h", "rep", "s", "d"], ["target"], name="cat", axis=0),
        helper.make_node("Unsqueeze", ["k", "ax2"], ["ku"], name="unsq"),
        helper.make_node("Expand", ["ku", "target"], ["ke"], name="expand"),
        helper.make_node("Expand", ["bias", "wide"], ["bw"], name="expand_const"),
        helper.make_node("Add", ["ke", "bw"], ["y"], name="add"),
    ]
    g = helper.make_graph(
        nodes,
        "gqa",
        [
            helper.make_tensor_value_info("k", TensorProto.FLOAT, ["b", 3, "s", 7]),
            helper.make_tensor_value_info("bias", TensorProto.FLOAT, [3, 1, 1, 7]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("i0", np.array([0], np.int64)),
            _const("i2", np.array([2], np.int64)),
            _const("h", np.array([3], np.int64)),
            _const("rep", np.array([2], np.int64)),
            _const("d", np.array([7], np.int64)),
            _const("ax2", np.array([2], np.int64)),
            _const("wide", np.array([3, 2, 1, 7], np.int64)),
        ],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(p, opts)
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(7)
    bias = rng.normal(0, 1, (3, 1, 1, 7)).astype(np.float32)
    for shape in ((2, 3, 5, 7), (1, 3, 4, 7)):
        feeds = {"k": rng.normal(0, 1, shape).astype(np.float32), "bias": bias}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    bound = next(iter(sess.executor.bound_runs().values()))
    names = {s.index: s.name for s in sess.executor.plan.steps}
    direct = {names[t[0]] for t in bound.steps if getattr(t[1], "direct", None) is not None}
    assert {"expand", "expand_const"} <= direct, direct
    wide = rng.normal(0, 1, (2, 3, 5, 14)).astype(np.float32)
    strided = {"k": wide[..., ::2], "bias": bias}
    np.testing.assert_array_equal(sess.run(None, strided)[0], ref.run(None, strided)[0])


@pytest.mark.parametrize("threads", [1, 2])
def test_qlinear_concat_specialized_with_constant_parameters_is_the_twin(threads: int) -> None:
    """GTCRN's int8 caches: QLinearConcat of inputs at the output's scale (copied) and at
    other scales and zero points (requantized by table), uint8, axis 1, odd sizes; the
    specialized call and the generic one on a strided input give the twin's bytes."""
    u8 = TensorProto.UINT8
    names = ("a", "b", "c")
    chans = (7, 2, 5)
    params = [(0.05, 128), (0.031, 3), (0.17, 250)]
    inits = [_const("sy", np.float32(0.05)), _const("zy", np.uint8(128))]
    ins = ["sy", "zy"]
    for n, (s, z) in zip(names, params, strict=True):
        inits += [_const(f"s_{n}", np.float32(s)), _const(f"z_{n}", np.uint8(z))]
        ins += [n, f"s_{n}", f"z_{n}"]
    g = helper.make_graph(
        [helper.make_node("QLinearConcat", ins, ["y"], name="cat", domain="com.microsoft", axis=1)],
        "qcat",
        [helper.make_tensor_value_info(n, u8, [3, c, 17]) for n, c in zip(names, chans, strict=True)],
        [helper.make_tensor_value_info("y", u8, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    p = helper.make_model(g, opset_imports=opsets).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(p, opts)
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(13)
    for _ in range(3):
        feeds = {
            n: rng.integers(0, 256, (3, c, 17), dtype=np.uint8) for n, c in zip(names, chans, strict=True)
        }
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    assert _specialized_names(sess) == {"cat"}
    strided = {
        n: rng.integers(0, 256, (3, c, 34), dtype=np.uint8)[:, :, ::2]
        for n, c in zip(names, chans, strict=True)
    }
    np.testing.assert_array_equal(sess.run(None, strided)[0], ref.run(None, strided)[0])


@pytest.mark.parametrize("op", ["QLinearSigmoid", "QLinearLeakyRelu"])
@pytest.mark.parametrize("zero_point", [True, False])
def test_table_activations_specialized_with_constant_parameters_are_the_twin(
    op: str, zero_point: bool
) -> None:
    """DTLN's int8 LSTM gates: QLinearSigmoid on a few hundred codes (and LeakyRelu, the
    other table activation), int8, with and without an input zero point; specialized,
    and generic on a strided input, the twin's bytes."""
    i8 = TensorProto.INT8
    inits = [_const("sx", np.float32(0.043)), _const("sy", np.float32(1 / 255)), _const("zy", np.int8(-128))]
    ins = ["x", "sx", "zx" if zero_point else "", "sy", "zy"]
    if zero_point:
        inits.append(_const("zx", np.int8(-9)))
    attrs = {"alpha": 0.07} if op == "QLinearLeakyRelu" else {}
    g = helper.make_graph(
        [helper.make_node(op, ins, ["y"], name="gate", domain="com.microsoft", **attrs)],
        "lut",
        [helper.make_tensor_value_info("x", i8, [3, 7, 17])],
        [helper.make_tensor_value_info("y", i8, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(g, opset_imports=opsets)
    codes = _codes_of(np.int8)
    assert _specialized_and_generic_equal_the_reference(model, 0, 17, draw=codes) == {"gate"}


@pytest.mark.parametrize(
    ("shape", "axis", "x_type", "t_type"),
    [
        ((3, 7, 17), None, np.uint8, np.uint8),  # one table
        ((3, 7, 17), 1, np.int8, np.int8),  # a table per channel
        ((1, 1, 257), 2, np.int8, np.int8),  # DTLN's gains: a table per element of the last axis
        ((3, 7, 17), -1, np.uint8, np.int8),  # the last axis, negative; x and table of other storage
        ((3, 7, 17), None, np.int8, np.uint8),
    ],
)
def test_qlinear_lookup_specialized_is_the_twin(shape, axis, x_type, t_type) -> None:
    """quanta QLinearLookup with its constant table: specialized (a few rows along the
    last axis: lut8_channels' element loop), and generic on a strided input, the twin's
    bytes."""
    rng = np.random.default_rng(len(shape) + (axis or 0))
    channels = shape[axis] if axis is not None else None
    table = rng.integers(0, 256, (256,) if axis is None else (channels, 256)).astype(np.uint8).view(t_type)
    xt = helper.np_dtype_to_tensor_dtype(np.dtype(x_type))
    tt = helper.np_dtype_to_tensor_dtype(np.dtype(t_type))
    inits = [
        _const("sx", np.float32(0.02)),
        _const("zx", np.array(3, x_type)),
        _const("sy", np.float32(0.05)),
        _const("zy", np.array(-5 if t_type == np.int8 else 5).astype(t_type)),
        _const("t", table),
    ]
    attrs = {} if axis is None else {"axis": axis}
    g = helper.make_graph(
        [
            helper.make_node(
                "QLinearLookup",
                ["x", "sx", "zx", "sy", "zy", "t"],
                ["y"],
                name="lut",
                domain="quanta",
                **attrs,
            )
        ],
        "lut",
        [helper.make_tensor_value_info("x", xt, list(shape))],
        [helper.make_tensor_value_info("y", tt, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("quanta", 1)]
    model = helper.make_model(g, opset_imports=opsets)
    seed = len(shape) + (axis or 0) + 1
    found = _specialized_and_generic_equal_the_reference(model, 0, seed, shape=shape, draw=_codes_of(x_type))
    assert found == {"lut"}


def _box_rows(lo: tuple[int, ...], lengths: tuple[int, ...]) -> np.ndarray:
    """ScatterND indices listing every position of one box in row-major order (what
    ``cache[:, a:b] = u`` exports as)."""
    grid = np.indices(lengths).reshape(len(lengths), -1).T + np.asarray(lo)
    return grid.reshape(*lengths, len(lengths)).astype(np.int64)


@pytest.mark.parametrize("threads", [1, 2])
def test_scatter_nd_box_specialized_is_the_generic_kernel(threads: int) -> None:
    """x [3, 7, 17]: a box of rows [1:3, 2:6] of x + 1 (an arena value) overwritten by a
    Slice of x, then a box of single elements [0:2, 4:5, 3:10] of that by x's own
    elements, then a whole-first-axis box of a graph input's copy: each a specialized
    step, the reference's bytes, NaN payloads and signed zeros kept (a copy moves
    bytes)."""
    rows = _box_rows((1, 2), (2, 4))
    elems = _box_rows((0, 4, 3), (2, 1, 7))
    g = helper.make_graph(
        [
            helper.make_node("Add", ["x", "one"], ["d"], name="add"),
            helper.make_node("Slice", ["x", "s0", "s1", "sax"], ["u"], name="upd"),
            helper.make_node("ScatterND", ["d", "rows", "u"], ["y0"], name="scatter_rows"),
            helper.make_node("Slice", ["x", "e0", "e1", "eax"], ["ue"], name="upd_elems"),
            helper.make_node("Reshape", ["ue", "eshape"], ["ue2"], name="upd_shape"),
            helper.make_node("ScatterND", ["y0", "elems", "ue2"], ["y1"], name="scatter_elems"),
            helper.make_node("ScatterND", ["x", "first", "y1"], ["y"], name="scatter_all"),
        ],
        "scatter",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("one", np.float32(1)),
            _const("rows", rows),
            _const("elems", elems),
            _const("first", _box_rows((0,), (3,))),
            _const("s0", np.array([0, 3], np.int64)),
            _const("s1", np.array([2, 7], np.int64)),
            _const("sax", np.array([0, 1], np.int64)),
            _const("e0", np.array([1, 0, 5], np.int64)),
            _const("e1", np.array([3, 1, 12], np.int64)),
            _const("eax", np.array([0, 1, 2], np.int64)),
            _const("eshape", np.array([2, 1, 7], np.int64)),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])

    def draw(rng, dims):
        x = rng.normal(0, 3, dims).astype(np.float32)
        x.reshape(-1)[:3] = [np.float32("nan"), -0.0, np.float32("-inf")]
        return x

    specialized = _specialized_and_generic_equal_the_reference(model, threads, 11, draw=draw)
    assert {"scatter_rows", "scatter_elems", "scatter_all"} <= specialized


def _specialized_is_the_generic_kernel(model, shape: tuple[int, ...], threads: int, seed: int) -> set[str]:
    """Runs ``model`` (input "x" of ``shape``): the measuring run's generic calls and the
    bound runs' specialized calls give the same bytes, for two draws of x (the second's
    generic bytes from a fresh session), and a non-contiguous x (every other element of a
    last axis twice as long: the generic kernels) the first draw's; the specialized
    nodes' names. For kernels whose contract is a bound against float64, not the
    reference's bytes ((FG1))."""
    proto = model.SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(proto, opts)
    rng = np.random.default_rng(seed)
    x, x2 = (rng.normal(0, 1, shape).astype(np.float32) for _ in range(2))
    first = sess.run(None, {"x": x})[0]  # the measuring run: generic calls
    want = quanta.InferenceSession(proto, opts).run(None, {"x": x2})[0]
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], first)
        np.testing.assert_array_equal(sess.run(None, {"x": x2})[0], want)
    wide = np.zeros((*shape[:-1], 2 * shape[-1]), np.float32)
    wide[..., ::2] = x
    np.testing.assert_array_equal(sess.run(None, {"x": wide[..., ::2]})[0], first)
    return _specialized_names(sess)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [(3, 7, 17), (7, 17), (1, 1, 17)])
def test_matmul_of_a_packed_b_specialized_is_the_generic_kernel(threads: int, shape: tuple[int, ...]) -> None:
    """x @ B (a constant [17, 5] B, packed once) for rank-2 and rank-3 x, then a second
    product of that result (an arena value) by a [5, 3] B: specialized steps
    (float_gemm._matmul_specialized) with the generic native call's bytes."""
    rng = np.random.default_rng(5)
    g = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "b"], ["m"], name="mm1"),
            helper.make_node("MatMul", ["m", "b2"], ["y"], name="mm2"),
        ],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("b", rng.normal(0, 1, (17, 5)).astype(np.float32)),
            _const("b2", rng.normal(0, 1, (5, 3)).astype(np.float32)),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert _specialized_is_the_generic_kernel(model, shape, threads, 5) == {"mm1", "mm2"}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("c", "m", "kernel", "attrs", "bias"),
    [
        (16, 8, (1, 5), {"group": 2, "strides": [1, 2], "pads": [0, 2, 0, 2]}, True),  # gtcrn's upsampling
        (7, 3, (3, 3), {"strides": [2, 2], "pads": [1, 0, 1, 2], "output_padding": [1, 1]}, False),
        (3, 17, (2, 3), {"dilations": [2, 1], "strides": [1, 3]}, True),
    ],
)
def test_conv_transpose_specialized_is_the_generic_kernel(threads, c, m, kernel, attrs, bias) -> None:
    """x [1, C, 3, 11] ConvTranspose (strides, groups, pads, dilations, output padding;
    constant bias or none) followed by a Relu: the specialized step
    (float_gemm._conv_transpose_specialized) gives the generic call's bytes."""
    rng = np.random.default_rng(c * m)
    group = attrs.get("group", 1)
    inputs = ["x", "w", "b"] if bias else ["x", "w"]
    inits = [_const("w", rng.normal(0, 1, (c, m // group, *kernel)).astype(np.float32))]
    if bias:
        inits.append(_const("b", rng.normal(0, 1, (m // group * group,)).astype(np.float32)))
    g = helper.make_graph(
        [
            helper.make_node("ConvTranspose", inputs, ["t"], name="convt", **attrs),
            helper.make_node("Relu", ["t"], ["y"], name="relu"),
        ],
        "convt",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, c, 3, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert "convt" in _specialized_is_the_generic_kernel(model, (1, c, 3, 11), threads, 9)


def _encoder_block_model(opset: int):
    """x [3, 7, 17]: a Transpose of a perm no batched 2-D transpose covers, the product
    of two run-time operands (attention's Q·Kᵀ), Gelu (ai.onnx from opset 20, else
    com.microsoft) and BatchNormalization with constant statistics of 7 channels."""
    rng = np.random.default_rng(opset)
    ms = opset < 20
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="perm", perm=[2, 0, 1]),
        helper.make_node("Transpose", ["t"], ["tt"], name="swap", perm=[0, 2, 1]),
        helper.make_node("MatMul", ["t", "tt"], ["qk"], name="qk"),
        helper.make_node("Gelu", ["x"], ["ge"], name="gelu", **({"domain": "com.microsoft"} if ms else {})),
        helper.make_node("BatchNormalization", ["x", "g", "b", "m", "v"], ["bn"], name="bn", epsilon=1e-3),
    ]
    g = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("t", "qk", "ge", "bn")],
        [
            _const("g", rng.normal(1, 0.3, 7).astype(np.float32)),
            _const("b", rng.normal(0, 0.3, 7).astype(np.float32)),
            _const("m", rng.normal(0, 0.5, 7).astype(np.float32)),
            _const("v", rng.uniform(0.2, 2.0, 7).astype(np.float32)),
        ],
    )
    imports = [helper.make_opsetid("", opset)] + ([helper.make_opsetid("com.microsoft", 1)] if ms else [])
    return helper.make_model(g, opset_imports=imports)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("opset", [17, 20])
def test_transpose_runtime_matmul_gelu_batch_norm_specialized_are_the_generic_kernels(
    threads: int, opset: int
) -> None:
    """Any-perm Transpose, the MatMul of two run-time operands, Gelu and BatchNormalization
    with constant statistics take specialized calls with the reference's bytes; a
    non-contiguous x runs the generic kernels with the same results."""
    names = _specialized_and_generic_equal_the_reference(
        _encoder_block_model(opset), threads, threads, 2.0, quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    )
    assert {"perm", "qk", "gelu", "bn"} <= names


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("per_column", [False, True])
def test_dynamic_quantize_and_matmul_integer_to_float_specialized_are_the_twin(
    threads: int, per_column: bool
) -> None:
    """ONNX Runtime's quantize_dynamic chain (DynamicQuantizeLinear feeding a_scale and
    a_zero_point of a MatMulIntegerToFloat on a constant int8 B of 17 columns, a bias,
    per-tensor or per-column b scales and zero points): both steps take specialized
    calls, DynamicQuantizeLinear's three outputs written into their arena places (where
    the GEMM's recorded call reads them), with the reference's bytes, also for an x whose
    values are all zero."""
    rng = np.random.default_rng(31 + per_column)
    n = 17
    shape = (n,) if per_column else ()
    nodes = [
        helper.make_node("DynamicQuantizeLinear", ["x"], ["q", "s", "z"], name="dql"),
        helper.make_node(
            "MatMulIntegerToFloat",
            ["q", "w", "s", "sb", "z", "zb", "bias"],
            ["y"],
            name="mm",
            domain="com.microsoft",
        ),
        helper.make_node("Relu", ["y"], ["r"], name="relu"),
    ]
    g = helper.make_graph(
        nodes,
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["m", 300])],
        [helper.make_tensor_value_info("r", TensorProto.FLOAT, None)],
        [
            _const("w", rng.integers(-128, 128, (300, n)).astype(np.int8)),
            _const("sb", rng.uniform(0.002, 0.02, shape).astype(np.float32)),
            _const("zb", rng.integers(-5, 6, shape).astype(np.int8)),
            _const("bias", rng.normal(0, 1, n).astype(np.float32)),
        ],
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    p = model.SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(p, opts)
    ref = quanta.InferenceSession(p, backend="reference")
    for rows in (3, 3, 1):
        feeds = {"x": rng.normal(0.3, 2, (rows, 300)).astype(np.float32)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    assert {"dql", "mm"} <= _specialized_names_any(sess)
    dql = [
        (bound, t)
        for bound in sess.executor.bound_runs().values()
        for t in bound.steps
        if sess.plan.steps[t[0]].node.name == "dql"
    ]
    assert dql
    for bound, t in dql:
        outs = sess.plan.steps[t[0]].outputs
        # planned in the arena: the specialized call writes the places it returns
        assert all(o in bound.slot_views for o in outs) and not getattr(t[1], "fresh", False)
    zeros = {"x": np.zeros((3, 300), np.float32)}
    np.testing.assert_array_equal(sess.run(None, zeros)[0], ref.run(None, zeros)[0])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "axis"), [((3, 17, 1), 1), ((2, 259, 1, 1), -3), ((1, 7, 1), -2)])
def test_softmax_along_an_axis_followed_by_ones_is_specialized_and_the_generic_kernel(
    threads: int, shape: tuple[int, ...], axis: int
) -> None:
    """A Softmax along an axis that only 1s follow (a decoder's attention weights [1, T,
    1] along T) runs the rows as they lie, with the bytes of the generic moveaxis path
    and of the reference; a non-contiguous x too."""
    g = helper.make_graph(
        [helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=axis)],
        "softmax_mid",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert "softmax" in _specialized_and_generic_equal_the_reference(model, threads, 3, 4.0, shape=shape)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("shape", "axis"),
    [((8, 27, 16), 1), ((2, 3, 7, 17), -3), ((3, 259, 5), 1), ((2, 17, 3, 7), 2), ((7, 3, 1, 2), 0)],
)
@pytest.mark.parametrize("inner", [False, True])
def test_softmax_along_a_middle_axis_is_specialized_and_the_generic_kernel(
    threads: int, shape: tuple[int, ...], axis: int, inner: bool
) -> None:
    """A Softmax along an axis with more than 1s after it (a tagger's classes of [N, C,
    L], axis 1; rows of 259) runs its rows through the native batched transpose and back,
    with the bytes of the generic moveaxis path and of the reference; a non-contiguous x
    (the transpose refuses it) the generic kernel's. ``inner``: a Relu reads the
    Softmax, whose output is then a planned place of the arena, not a graph output."""
    nodes = [helper.make_node("Softmax", ["x"], ["s" if inner else "y"], name="softmax", axis=axis)]
    if inner:
        nodes.append(helper.make_node("Relu", ["s"], ["y"], name="relu"))
    g = helper.make_graph(
        nodes,
        "softmax_middle",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert "softmax" in _specialized_and_generic_equal_the_reference(model, threads, 5, 4.0, shape=shape)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((1, 2, 8, 64), {"kernel_shape": [2, 1], "strides": [2, 1], "channels_last": 1}),  # svtr_selector's
        ((2, 9, 7, 3), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "channels_last": 1}),
        (
            (2, 3, 9, 7),
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        ),
        ((1, 17, 259), {"kernel_shape": [5], "strides": [3], "pads": [2, 1], "ceil_mode": 1}),
        ((1, 259, 17), {"kernel_shape": [5], "strides": [3], "channels_last": 1}),
    ],
)
def test_qlinear_average_pool_specialized_is_the_generic_kernel(threads: int, dtype, shape, attrs) -> None:
    """com.microsoft QLinearAveragePool with constant scales and zero points takes the
    specialized call (geometry and scalars once; channels_last through the native batched
    transpose), with the reference's bytes on every code of x, 1-D and 2-D, NCHW and
    channels_last, and a non-contiguous x the generic call's."""
    info = np.iinfo(dtype)
    zx, zy = (3, -5) if dtype == np.int8 else (131, 7)
    inits = [
        numpy_helper.from_array(np.array(0.037, np.float32), "sx"),
        numpy_helper.from_array(np.array(zx, dtype), "zx"),
        numpy_helper.from_array(np.array(0.029, np.float32), "sy"),
        numpy_helper.from_array(np.array(zy, dtype), "zy"),
    ]
    g = helper.make_graph(
        [
            helper.make_node(
                "QLinearAveragePool",
                ["x", "sx", "zx", "sy", "zy"],
                ["y"],
                name="pool",
                domain="com.microsoft",
                **attrs,
            )
        ],
        "qpool",
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))],
        [helper.make_tensor_value_info("y", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), None)],
        inits,
    )
    model = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    assert info.min < zx < info.max
    names = _specialized_and_generic_equal_the_reference(
        model, threads, 11, shape=shape, draw=_codes_of(dtype)
    )
    assert "pool" in names


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(
    ("shape", "attrs"),
    [
        ((1, 7, 2, 17), {"kernel_shape": [2, 1], "strides": [2, 1]}),  # a selector's height pool
        (
            (2, 3, 9, 7),
            {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
        ),
        ((1, 17, 259), {"kernel_shape": [5], "strides": [3], "pads": [2, 1], "ceil_mode": 1}),
    ],
)
def test_average_pool_specialized_is_the_generic_kernel(threads: int, shape, attrs) -> None:
    """1-D and 2-D AveragePool take the specialized call (the plan made once), with the
    reference's bytes; a non-contiguous x runs the generic kernel with the same result."""
    g = helper.make_graph(
        [helper.make_node("AveragePool", ["x"], ["y"], name="pool", **attrs)],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    assert "pool" in _specialized_and_generic_equal_the_reference(model, threads, 7, 2.0, shape=shape)


def _attention_products_model(b_type: int, a_batch: tuple[int, ...], b_batch: tuple[int, ...]):
    """x [*a_batch, 19, 33] and x2 [*b_batch, 17, 33] float, quantized (uint8 a with zero
    point 131; b of ``b_type`` with zero point 9 or -7) and b transposed to [..., 33, 17]
    (attention's Kᵀ): MatMulIntegerToFloat(a, b) with a bias of 17 and QLinearMatMul(a, b)
    to uint8 (zero point 77), both products of two run-time operands, then a Relu and a
    DequantizeLinear so that their outputs are arena values."""
    rng = np.random.default_rng(len(a_batch) + 3 * len(b_batch) + b_type)
    zb = np.int8(-7) if b_type == TensorProto.INT8 else np.uint8(9)
    rank = len(a_batch) + 2
    perm = [*range(rank - 2), rank - 1, rank - 2]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sa", "za"], ["a"], name="qa"),
        helper.make_node("QuantizeLinear", ["x2", "sb", "zb"], ["bt"], name="qb"),
        helper.make_node("Transpose", ["bt"], ["b"], name="kt", perm=perm),
        helper.make_node(
            "MatMulIntegerToFloat",
            ["a", "b", "sa", "sb", "za", "zb", "bias"],
            ["f"],
            name="mitf",
            domain="com.microsoft",
        ),
        helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["q"], name="qlmm"),
        helper.make_node("Relu", ["f"], ["fr"], name="relu"),
        helper.make_node("DequantizeLinear", ["q", "sy", "zy"], ["qd"], name="dq"),
    ]
    g = helper.make_graph(
        nodes,
        "attn",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [*a_batch, 19, 33]),
            helper.make_tensor_value_info("x2", TensorProto.FLOAT, [*b_batch, 17, 33]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("fr", "qd")],
        [
            _const("sa", np.float32(0.0213)),
            _const("za", np.uint8(131)),
            _const("sb", np.float32(0.0177)),
            _const("zb", zb),
            _const("bias", rng.normal(0, 0.5, 17).astype(np.float32)),
            _const("sy", np.float32(0.61)),
            _const("zy", np.uint8(77)),
        ],
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("b_type", [TensorProto.UINT8, TensorProto.INT8])
@pytest.mark.parametrize(
    ("a_batch", "b_batch", "specialized"),
    [((2, 3), (2, 3), True), ((5,), (5,), True), ((2, 3), (1, 3), False), ((1, 1), (1, 1), True)],
)
def test_run_time_b_products_specialized_and_recorded_are_the_twin(
    threads: int, b_type: int, a_batch: tuple[int, ...], b_batch: tuple[int, ...], specialized: bool
) -> None:
    """MatMulIntegerToFloat and QLinearMatMul whose b is an activation (attention's Q·Kᵀ
    and P·V; gemm._runtime_b_call): with equal batch dimensions both take the batched call
    alone, recorded into the native program, with the reference's bytes on every run and
    with and without programs; a b whose batch broadcasts against a's keeps the generic
    kernel (same bytes)."""
    p = _attention_products_model(b_type, a_batch, b_batch).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(p, opts)
    loop = quanta.InferenceSession(p, opts)
    loop.executor.native_programs = False
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(threads + 5 * b_type)
    for _ in range(4):
        feeds = {
            "x": rng.normal(0, 1.5, (*a_batch, 19, 33)).astype(np.float32),
            "x2": rng.normal(0, 1.5, (*b_batch, 17, 33)).astype(np.float32),
        }
        want = ref.run(None, feeds)
        for got in (sess.run(None, feeds), loop.run(None, feeds)):
            for g_, w_ in zip(got, want, strict=True):
                np.testing.assert_array_equal(g_, w_)
    assert bool({"mitf", "qlmm"} & _specialized_names(sess)) == specialized
    if specialized:
        assert {"mitf", "qlmm"} <= _specialized_names(sess)
        from quanta.runtime.execute import _PROGRAM

        (bound,) = sess.executor.bound_runs().values()
        in_loop = {t[0] for t in bound.fast_steps if t[2] is not _PROGRAM}
        products = {s.index for s in sess.plan.steps if s.node.name in ("mitf", "qlmm")}
        assert len(products) == 2 and not products & in_loop  # recorded into a program


def _softmax_quant_model(mask_shape: tuple[int, ...] | None, scale: bool, signed: bool):
    """x0 [2, 3, 5, 17] − 0.25 -> Mul(0.1767767)? -> Add(−mask0)? -> Softmax -> Q (zero
    point 3, or -100 int8) -> DQ: FuseSoftmaxQuant's pattern on arena values (the Sub and
    the mask's Neg are steps of their own), so the fused step can be recorded."""
    x_shape = (2, 3, 5, 17)
    nodes = [helper.make_node("Sub", ["x0", "quarter"], ["x"], name="shift")]
    v = "x"
    if scale:
        nodes.append(helper.make_node("Mul", [v, "c"], ["v"], name="mul"))
        v = "v"
    inputs = [helper.make_tensor_value_info("x0", TensorProto.FLOAT, list(x_shape))]
    if mask_shape is not None:
        inputs.append(helper.make_tensor_value_info("mask0", TensorProto.FLOAT, list(mask_shape)))
        nodes.append(helper.make_node("Neg", ["mask0"], ["mask"], name="mask_neg"))
        nodes.append(helper.make_node("Add", [v, "mask"], ["w"], name="add"))
        v = "w"
    zy = np.int8(-100) if signed else np.uint8(3)
    nodes += [
        helper.make_node("Softmax", [v], ["s"], name="softmax", axis=-1),
        helper.make_node("QuantizeLinear", ["s", "sy", "zy"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "sy", "zy"], ["y"], name="dq"),
    ]
    g = helper.make_graph(
        nodes,
        "attention",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            _const("quarter", np.float32(0.25)),
            _const("c", np.float32(0.1767767)),
            _const("sy", np.float32(1 / 255)),
            _const("zy", zy),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mask_shape", [(1, 1, 5, 17), (2, 1, 1, 17), (17,), None])
@pytest.mark.parametrize(("scale", "signed"), [(True, False), (False, True), (True, True)])
def test_softmax_quant_specialized_and_recorded_is_the_twin(
    threads: int, mask_shape: tuple[int, ...] | None, scale: bool, signed: bool
) -> None:
    """quanta::SoftmaxQuant with constant parameters takes the binding alone (the mask's
    row map made once), recorded into the native program with its run-time mask, with the
    reference's bytes on every run, with and without programs (masked entries -2e4, and
    -inf, with fully masked rows)."""
    p = _softmax_quant_model(mask_shape, scale, signed).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(p, opts)
    loop = quanta.InferenceSession(p, opts)
    loop.executor.native_programs = False
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(threads + 7 * len(mask_shape or ()))
    for i in range(4):
        feeds = {"x0": (rng.standard_normal((2, 3, 5, 17)) * 9).astype(np.float32)}
        if mask_shape is not None:
            masked = np.float32(np.inf) if i == 3 else np.float32(2e4)
            m = np.where(rng.random(mask_shape) < 0.3, masked, np.float32(0)).astype(np.float32)
            if i == 3:
                m.reshape(-1, 17)[0] = masked  # a fully masked row
            feeds["mask0"] = m
        want = ref.run(None, feeds)[0]
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
        np.testing.assert_array_equal(loop.run(None, feeds)[0], want)
    from quanta.runtime.execute import _PROGRAM

    (step,) = [s for s in sess.plan.steps if s.op_type == "SoftmaxQuant"]
    assert step.kernel.name == "native:softmax_quant"
    assert step.node.name in _specialized_names(sess)
    (bound,) = sess.executor.bound_runs().values()
    assert step.index not in {t[0] for t in bound.fast_steps if t[2] is not _PROGRAM}


def _qlinear_binary_model(op: str, dtype, shape, const, const_first: bool):
    """com.microsoft QLinearAdd / QLinearMul of x (``shape``, codes of ``dtype``) and the
    constant ``const`` (its first operand when ``const_first``), distinct scales and
    non-zero zero points, the output read by a DequantizeLinear (an arena place)."""
    zx, zk, zy = (-5, 9, 3) if dtype == np.int8 else (131, 7, 200)
    operands = (
        [("k", "sk", "zk"), ("x", "sx", "zx")] if const_first else [("x", "sx", "zx"), ("k", "sk", "zk")]
    )
    inits = [
        numpy_helper.from_array(np.array(0.037, np.float32), "sx"),
        numpy_helper.from_array(np.array(zx, dtype), "zx"),
        numpy_helper.from_array(np.array(0.021, np.float32), "sk"),
        numpy_helper.from_array(np.array(zk, dtype), "zk"),
        numpy_helper.from_array(np.array(0.043, np.float32), "sy"),
        numpy_helper.from_array(np.array(zy, dtype), "zy"),
        numpy_helper.from_array(const, "k"),
    ]
    nodes = [
        helper.make_node(
            op, [*operands[0], *operands[1], "sy", "zy"], ["q"], name="binary", domain="com.microsoft"
        ),
        helper.make_node("DequantizeLinear", ["q", "sy", "zy"], ["y"], name="dq"),
    ]
    g = helper.make_graph(
        nodes,
        "qbinary",
        [helper.make_tensor_value_info("x", helper.np_dtype_to_tensor_dtype(np.dtype(dtype)), list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("op", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", [np.uint8, np.int8])
@pytest.mark.parametrize("const_first", [False, True])
@pytest.mark.parametrize(
    ("shape", "const_shape", "expanded"),
    [
        ((37, 150, 12), (1, 150, 1), (1, 150, 12)),  # deepcut's conv bias: 37 x 1800 > the cap
        ((5, 7, 3), (7, 1), (5, 7, 3)),  # the whole output (105 codes)
        ((3, 21, 17), (17,), (3, 21, 17)),  # a trailing vector: runs of 17
        ((2, 3, 7, 17), (1, 1, 7, 1), (2, 3, 7, 17)),
        ((2, 17, 259), (17, 1), None),  # runs of 259: kept
        ((3, 7, 64), (64,), None),  # runs of 64 (a channels-last bias): kept
    ],
)
def test_qlinear_binary_with_a_short_run_constant_is_expanded_and_exact(
    threads: int, op: str, dtype, const_first: bool, shape, const_shape, expanded
) -> None:
    """A bound QLinearAdd / QLinearMul whose constant operand repeats along trailing
    dimensions (runs shorter than SHORT_RUN) reads it expanded over them (docs/kernels.md
    (V9.1)), with the reference's bytes on every code of x, either operand constant, 1
    and 2 threads; runs already long keep the constant as it is; a non-contiguous x runs
    the generic kernel with the same bytes."""
    info = np.iinfo(dtype)
    const = np.random.default_rng(len(shape) + sum(const_shape)).integers(
        info.min, info.max + 1, const_shape, dtype=dtype
    )
    model = _qlinear_binary_model(op, dtype, shape, const, const_first)
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(model.SerializeToString(), opts)
    ref = quanta.InferenceSession(model.SerializeToString(), backend="reference")
    rng = np.random.default_rng(13)
    draw = _codes_of(dtype)
    for _ in range(3):
        feeds = {"x": draw(rng, shape)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    (bound,) = sess.executor.bound_runs().values()
    (step,) = [t for t in bound.steps if sess.plan.steps[t[0]].node.name == "binary"]
    assert getattr(step[1], "expanded", "plain") == expanded
    strided = {"x": draw(rng, (*shape[:-1], 2 * shape[-1]))[..., ::2]}
    np.testing.assert_array_equal(sess.run(None, strided)[0], ref.run(None, strided)[0])
