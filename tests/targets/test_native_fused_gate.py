"""Gated activations fused into the float Conv (passes/rules/fuse_float_gate.py,
sgemm.h PostOp, nn_conv.fused_gate).

1. the kernel, every ISA, every convolution path (pointwise, implicit GEMM, depthwise
   rows, depthwise 16-channel blocks, the one-column GEMV), 1 and 2 threads: the fused
   output is, bit for bit, the reference twins of the replaced nodes applied to the
   unfused native convolution's output (the post-op is exact, only the Conv has a bound);
2. the rule: which graphs fuse, which do not (a second reader, a computed or non-scalar
   constant), and the reference target's fused graph equals the graph as written bit for
   bit;
3. a native session: optimized (fused) and as written (Conv, then the nodes on their own
   native kernels) give the same bytes.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels import _native
from quanta.kernels.reference.nn_conv import fused_gate

F32 = np.float32
ISAS = list(_native.supported_isas())
POST = {
    "SiLU": (1, []),
    "HardSwish": (2, []),
    "HardSigmoid": (3, [0.2, 0.45]),
    "ClipMulDiv": (4, [3.0, 0.0, 6.0, 6.0]),
    # bounds the vector loop leaves to the scalar one (-0, NaN) and crossed ones
    "ClipMulDiv-0": (4, [-0.0, -0.0, 6.0, 6.0]),
    "ClipMulDiv-nan": (4, [3.0, float("nan"), 6.0, 7.0]),
    "ClipMulDiv-crossed": (4, [0.5, 2.0, -1.0, 3.0]),
    # LeakyRelu alone (floor -inf), and followed by a Max of a scalar (openWakeWord's)
    "LeakyRelu": (5, [0.2, float("-inf")]),
    "LeakyRelu-max": (5, [0.2, -0.4]),
    "LeakyRelu-max-above": (5, [0.01, 1.5]),
}

# (x shape, w shape, group, strides, pads): the paths of sgemm.h conv_path
SHAPES = [
    ((1, 7, 9, 11), (17, 7, 1, 1), 1, [1, 1], [0, 0, 0, 0]),  # pointwise, odd tile edges
    ((2, 3, 15, 16), (7, 3, 3, 3), 1, [2, 2], [1, 1, 1, 0]),  # implicit GEMM
    ((1, 300, 5, 6), (9, 300, 3, 3), 1, [1, 1], [1, 1, 1, 1]),  # K > 258: two K blocks
    ((1, 17, 12, 40), (17, 1, 3, 3), 17, [1, 1], [1, 1, 1, 1]),  # depthwise rows (ow > 16)
    ((1, 17, 9, 11), (17, 1, 5, 5), 17, [2, 2], [2, 2, 2, 2]),  # depthwise blocks (ow <= 16)
    ((1, 40, 1, 1), (33, 40, 1, 1), 1, [1, 1], [0, 0, 0, 0]),  # one column: the GEMV
]


def run_conv(x, w, b, group, strides, pads, post=(0, []), threads=1) -> np.ndarray:
    packed = _native.conv_pack_f32(w, group)
    return _native.conv_f32(
        x,
        packed,
        b,
        w.shape[0],
        w.shape[2],
        w.shape[3],
        strides,
        [1, 1],
        pads,
        group,
        num_threads=threads,
        post=post[0],
        post_params=post[1],
    )


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s[1])) + f"g{s[2]}")
@pytest.mark.parametrize("activation", list(POST))
def test_post_op_is_the_replaced_nodes_on_the_conv_output(shape, activation) -> None:
    xs, ws, group, strides, pads = shape
    rng = np.random.default_rng(sum(ws) + len(activation))
    x = (3 * rng.standard_normal(xs)).astype(F32)
    # outputs of a few units whatever the fan-in, so every branch of the gates is reached
    w = (2 * rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(F32)
    b = rng.standard_normal(ws[0]).astype(F32)
    kind, params = POST[activation]
    activation = activation.split("-")[0]
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            plain = run_conv(x, w, b, group, strides, pads)
            want = fused_gate(plain, activation, params)
            # the data reaches both sides of every branch (sigmoid's sign split, the clips)
            assert (plain < -3).any() and (plain > 3).any() and (np.abs(plain) < 1).any(), isa
            for threads in (1, 2):
                got = run_conv(x, w, b, group, strides, pads, (kind, params), threads)
                assert got.dtype == F32 and got.shape == want.shape
                assert got.tobytes() == want.tobytes(), (isa, threads, float(np.abs(got - want).max()))
    finally:
        _native.clear_isa()


def test_post_op_rejects_an_unknown_kind() -> None:
    x, w = np.ones((1, 2, 3, 3), F32), np.ones((3, 2, 1, 1), F32)
    with pytest.raises(ValueError, match="post"):
        run_conv(x, w, None, 1, [1, 1], [0, 0, 0, 0], (9, []))


# --------------------------------------------------------------------------------------
# the rule and whole graphs
# --------------------------------------------------------------------------------------


def _const(name: str, v) -> TensorProto:
    return numpy_helper.from_array(np.asarray(v, F32), name)


def gated_model(rng: np.random.Generator) -> tuple:
    """Every fusable form once (both operand orders), plus three that must stay."""

    def w(name, *shape):
        return numpy_helper.from_array(rng.uniform(-0.6, 0.6, shape).astype(F32), name)

    nodes = [
        # SiLU, Conv first and Sigmoid first
        helper.make_node("Conv", ["x", "w0", "b0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c0"], ["s0"]),
        helper.make_node("Mul", ["c0", "s0"], ["a0"]),
        helper.make_node("Conv", ["a0", "w1"], ["c1"], group=7, pads=[1, 1, 1, 1]),
        helper.make_node("Sigmoid", ["c1"], ["s1"]),
        helper.make_node("Mul", ["s1", "c1"], ["a1"]),
        # Paddle's hardswish: Add(x, 3), Clip(0, 6), Mul(x, .), Div(6); then Add(3, x), Mul(., x)
        helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"]),
        helper.make_node("Add", ["c2", "three"], ["p2"]),
        helper.make_node("Clip", ["p2", "zero", "six"], ["q2"]),
        helper.make_node("Mul", ["c2", "q2"], ["m2"]),
        helper.make_node("Div", ["m2", "six"], ["a2"]),
        helper.make_node("Conv", ["a2", "w3"], ["c3"], pads=[0, 1, 2, 1]),
        helper.make_node("Add", ["three", "c3"], ["p3"]),
        helper.make_node("Clip", ["p3", "zero", "six"], ["q3"]),
        helper.make_node("Mul", ["q3", "c3"], ["m3"]),
        helper.make_node("Div", ["m3", "six"], ["a3"]),
        # HardSwish, HardSigmoid
        helper.make_node("Conv", ["a3", "w4"], ["c4"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("HardSwish", ["c4"], ["a4"]),
        helper.make_node("Conv", ["a4", "w5", "b5"], ["c5"]),
        helper.make_node("HardSigmoid", ["c5"], ["a5"], alpha=0.2, beta=0.45),
        # LeakyRelu; LeakyRelu then Max of a scalar (constant first)
        helper.make_node("Conv", ["a5", "w9"], ["c9"], pads=[1, 1, 1, 1]),
        helper.make_node("LeakyRelu", ["c9"], ["a9"], alpha=0.2),
        helper.make_node("Conv", ["a9", "w10", "b10"], ["c10"]),
        helper.make_node("LeakyRelu", ["c10"], ["l10"], alpha=0.3),
        helper.make_node("Max", ["floor", "l10"], ["a10"]),
        # stays: the Conv's output also read by the Add after the gate
        helper.make_node("Conv", ["a10", "w6"], ["c6"]),
        helper.make_node("Sigmoid", ["c6"], ["s6"]),
        helper.make_node("Mul", ["c6", "s6"], ["g6"]),
        helper.make_node("Add", ["g6", "c6"], ["a6"]),
        # stays: a per-channel Add (not a scalar) in the hardswish
        helper.make_node("Conv", ["a6", "w7"], ["c7"]),
        helper.make_node("Add", ["c7", "per_channel"], ["p7"]),
        helper.make_node("Clip", ["p7", "zero", "six"], ["q7"]),
        helper.make_node("Mul", ["c7", "q7"], ["m7"]),
        helper.make_node("Div", ["m7", "six"], ["a7"]),
        # stays: the Sigmoid of another value
        helper.make_node("Conv", ["a7", "w8"], ["c8"]),
        helper.make_node("Sigmoid", ["a7"], ["s8"]),
        helper.make_node("Mul", ["c8", "s8"], ["y"]),
    ]
    inits = [
        w("w0", 7, 3, 3, 3),
        w("b0", 7),
        w("w1", 7, 1, 3, 3),
        w("w2", 17, 7, 1, 1),
        w("b2", 17),
        w("w3", 5, 17, 3, 3),
        w("w4", 9, 5, 3, 3),
        w("w5", 7, 9, 1, 1),
        w("b5", 7),
        w("w9", 7, 7, 3, 3),
        w("w10", 7, 7, 1, 1),
        w("b10", 7),
        numpy_helper.from_array(np.full((1, 1, 1, 1), -0.1, F32), "floor"),
        w("w6", 7, 7, 1, 1),
        w("w7", 3, 7, 1, 1),
        w("w8", 3, 3, 1, 1),
        _const("three", 3.0),
        _const("zero", 0.0),
        _const("six", 6.0),
        numpy_helper.from_array(rng.uniform(2, 4, (1, 3, 1, 1)).astype(F32), "per_channel"),
    ]
    graph = helper.make_graph(
        nodes,
        "gates",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 13, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = (4 * rng.standard_normal((1, 3, 13, 11))).astype(F32)
    return model, x


def test_gates_after_float_convs_fuse_and_keep_the_bytes() -> None:
    """On both targets the eight gates fuse and the three others stay; the reference of the
    fused graph is bit for bit the graph as written, and so is the native one (the
    unfused native graph runs the same Conv kernels, then the nodes' own kernels)."""
    model, x = gated_model(np.random.default_rng(11))
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    for backend in ("reference", "native"):
        fused = quanta.InferenceSession(model, backend=backend)
        steps = [(s.node.domain, s.op_type, s.node.attrs.get("activation")) for s in fused.plan.steps]
        acts = [a for d, op, a in steps if d == "quanta" and op == "Conv"]
        assert acts == [
            "SiLU",
            "SiLU",
            "ClipMulDiv",
            "ClipMulDiv",
            "HardSwish",
            "HardSigmoid",
            "LeakyRelu",
            "LeakyRelu",
        ], steps
        assert [op for d, op, _ in steps if not d].count("Conv") == 3, steps
        if backend == "native":
            names = [s.kernel.name for s in fused.plan.steps if s.node.domain == "quanta"]
            assert (
                names[0] == "native:conv_f32_im2col_3x3_silu" and names[1] == "native:conv_f32_dw_3x3_silu"
            ), names
            assert not fused.fallbacks, fused.fallbacks
        as_written = quanta.InferenceSession(model, sess_options=off, backend=backend)
        got = fused.run(None, {"x": x})[0]
        want = as_written.run(None, {"x": x})[0]
        assert got.tobytes() == want.tobytes(), (backend, float(np.abs(got - want).max()))


def test_fused_gate_names_a_bad_parameter_count() -> None:
    with pytest.raises(Exception, match="HardSigmoid takes 2"):
        fused_gate(np.zeros(3, F32), "HardSigmoid", [0.2], "node7")


def test_unpickled_feeds_take_the_native_kernels_and_a_refused_call_the_fused_twin() -> None:
    """An array that crossed a process boundary (a process pool's, a Ray worker's) has a
    float32 dtype object of its own: the bindings compare dtypes by equivalence, not
    identity, so it runs the native kernels (no fallback counted) with the same bytes.
    A call the native kernel refuses (float64 here) goes to the fused node's reference
    twin, which applies the gate from the node's attributes (the binder's packed weights
    and post-op code are not passed on)."""
    import pickle

    from quanta.targets.native.float_gemm import RUNTIME_FALLBACKS

    model, x = gated_model(np.random.default_rng(12))
    sess = quanta.InferenceSession(model, backend="native")
    want = sess.run(None, {"x": x})[0]
    moved = pickle.loads(pickle.dumps(x))
    assert moved.dtype is not np.dtype(F32)  # what makes identity checks refuse it
    before = sum(RUNTIME_FALLBACKS.values())
    got = sess.run(None, {"x": moved})[0]
    assert sum(RUNTIME_FALLBACKS.values()) == before, dict(RUNTIME_FALLBACKS)
    assert got.tobytes() == want.tobytes()
    step = next(s for s in sess.plan.steps if s.node.domain == "quanta" and s.op_type == "Conv")
    assert step.node.attrs.get("activation") == "SiLU" and step.kernel.params.get("post")
    consts = [v.const for v in step.node.inputs[1:]]

    def call(feed: np.ndarray) -> np.ndarray:
        kw = {**step.kernel.params, **step.node.attrs}
        return np.asarray(step.kernel.fn(step.ctx, feed, *consts, out=None, **kw), np.float64)

    native = call(x)
    refused = call(x.astype(np.float64))  # the reference twin: conv, then SiLU
    assert sum(RUNTIME_FALLBACKS.values()) == before + 1
    assert (native < -0.1).any() and (native > 1).any()  # both sides of the gate
    np.testing.assert_allclose(refused, native, rtol=1e-4, atol=1e-5)
