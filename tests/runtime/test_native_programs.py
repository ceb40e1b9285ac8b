"""Native programs (quanta.runtime.execute ``_native_programs``, docs/runtime.md "Native
programs"): runs of recordable steps recorded once per signature and run as one C++ call.
They must give the bytes of the same steps run one by one from the Python loop (and of
the reference target), whatever reads their values: a Python step after them, a graph
output, a view step between them, another thread."""

from __future__ import annotations

import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels import native_available
from quanta.runtime.execute import _PROGRAM

pytestmark = pytest.mark.skipif(not native_available(), reason="the native extension is not built")


def _const(name: str, value: np.ndarray):
    return numpy_helper.from_array(np.asarray(value), name)


def _block_model():
    """x [3, 7, 17]: a MatMul by a constant [17, 13] (it reads the feed's staged copy),
    Add of a per-column bias, Relu, a Reshape to [3, 91] (a view of the arena, also a
    graph output), a Gemm by a constant [91, 11] with a bias, Sigmoid, a Transpose and
    Erf (seven recorded steps), then a Mul by a constant into the graph output y (outputs
    are the caller's arrays, not the arena's: a Python step)."""
    rng = np.random.default_rng(0)
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["m1"], name="mm"),
        helper.make_node("Add", ["m1", "b1"], ["a1"], name="add"),
        helper.make_node("Relu", ["a1"], ["r1"], name="relu"),
        helper.make_node("Reshape", ["r1", "shape"], ["v"], name="view"),
        helper.make_node("Gemm", ["v", "w2", "b2"], ["g"], name="gemm"),
        helper.make_node("Sigmoid", ["g"], ["s"], name="sigmoid"),
        helper.make_node("Transpose", ["s"], ["t"], name="transpose", perm=[1, 0]),
        helper.make_node("Erf", ["t"], ["e"], name="erf"),
        helper.make_node("Mul", ["e", "half"], ["y"], name="mul"),
    ]
    g = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("v", TensorProto.FLOAT, None),
        ],
        [
            _const("w1", rng.normal(0, 0.3, (17, 13)).astype(np.float32)),
            _const("b1", rng.normal(0, 0.3, 13).astype(np.float32)),
            _const("shape", np.array([3, 91], np.int64)),
            _const("w2", rng.normal(0, 0.2, (91, 11)).astype(np.float32)),
            _const("b2", rng.normal(0, 0.2, 11).astype(np.float32)),
            _const("half", np.float32(0.5)),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _sessions(
    threads: int,
) -> tuple[quanta.InferenceSession, quanta.InferenceSession, quanta.InferenceSession]:
    p = _block_model().SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    with_programs = quanta.InferenceSession(p, opts)
    without = quanta.InferenceSession(p, opts)
    without.executor.native_programs = False
    return with_programs, without, quanta.InferenceSession(p, backend="reference")


@pytest.mark.parametrize("threads", [1, 2])
def test_programs_give_the_bytes_of_the_python_loop_and_the_reference(threads: int) -> None:
    sess, plain, ref = _sessions(threads)
    rng = np.random.default_rng(threads)
    for _ in range(4):
        feeds = {"x": rng.normal(0, 2, (3, 7, 17)).astype(np.float32)}
        got, loop, want = sess.run(None, feeds), plain.run(None, feeds), ref.run(None, feeds)
        for a, b, c in zip(got, loop, want, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    (bound,) = sess.executor.bound_runs().values()
    recorded, steps = bound.program_steps
    assert recorded == 7 and steps == len(sess.plan.steps)
    names = {sess.plan.steps[t[0]].op_type for t in bound.fast_steps}
    assert "Reshape" not in names  # the view of the arena is made once and dropped


def test_an_output_that_views_a_programs_value_is_the_callers_own_copy() -> None:
    """v, the Reshape of a value a program writes, is made once as a view of the arena;
    the caller gets a copy it may write into."""
    sess, plain, _ = _sessions(1)
    rng = np.random.default_rng(5)
    feeds = {"x": rng.normal(0, 2, (3, 7, 17)).astype(np.float32)}
    for _ in range(2):
        sess.run(None, feeds)
    _, v = sess.run(None, feeds)
    kept = v.copy()
    v[...] = -7.0  # the caller writes into what it got
    other = {"x": rng.normal(0, 2, (3, 7, 17)).astype(np.float32)}
    np.testing.assert_array_equal(sess.run(None, other)[1], plain.run(None, other)[1])
    np.testing.assert_array_equal(sess.run(None, feeds)[1], kept)


def test_threads_running_one_session_get_their_own_results() -> None:
    """A concurrent run of the same signature runs without the arena (and so without its
    programs); every thread's outputs are those of its own feeds."""
    sess, plain, _ = _sessions(1)
    rng = np.random.default_rng(9)
    feeds = [{"x": rng.normal(0, 2, (3, 7, 17)).astype(np.float32)} for _ in range(4)]
    expected = [plain.run(None, f) for f in feeds]
    sess.run(None, feeds[0])
    errors: list[str] = []

    def work(k: int) -> None:
        for _ in range(30):
            for a, b in zip(sess.run(None, feeds[k]), expected[k], strict=True):
                if not np.array_equal(a, b):
                    errors.append(f"thread {k}")
                    return

    workers = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert not errors


def test_a_new_signature_records_its_own_programs() -> None:
    """Programs point at one signature's arena: another batch size binds, and records,
    its own."""
    p = _block_model()
    p.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    p.graph.initializer[2].CopyFrom(_const("shape", np.array([-1, 91], np.int64)))
    model = p.SerializeToString()
    sess = quanta.InferenceSession(model)
    ref = quanta.InferenceSession(model, backend="reference")
    rng = np.random.default_rng(2)
    for n in (3, 5, 3, 1, 5):
        feeds = {"x": rng.normal(0, 2, (n, 7, 17)).astype(np.float32)}
        for a, c in zip(sess.run(None, feeds), ref.run(None, feeds), strict=True):
            np.testing.assert_allclose(a, c, rtol=1e-5, atol=1e-6)
    assert len(sess.executor.bound_runs()) == 3
    assert all(b.program_steps[0] > 0 for b in sess.executor.bound_runs().values())


def test_the_recorder_comes_from_the_target_that_chose_the_kernels() -> None:
    """The native target records with ``_native.Program``; the reference target records
    nothing (its steps run from the loop); a device target's host partitions use its
    host target's recorder."""
    from quanta.kernels._native import Program

    from quanta.runtime.execute import _program_factory
    from quanta.targets.registry import get_target

    assert get_target("native").program_factory() is Program
    assert get_target("reference").program_factory() is None
    assert _program_factory("npu-sim") is Program
    assert _program_factory("reference") is None
    ref = quanta.InferenceSession(_block_model().SerializeToString(), backend="reference")
    ref.run(None, {"x": np.ones((3, 7, 17), np.float32)})
    assert all(b.program_steps[0] == 0 for b in ref.executor.bound_runs().values())


def test_program_record_keeps_exactly_one_kernel_call() -> None:
    """Program.record keeps a callable that made one kernel call through run_or_record
    into an output it was given; one that raised, made none, made two, or had the binding
    make its own output (a wrapper's temporary) is refused and leaves nothing behind."""
    from quanta.kernels import _native

    a = np.arange(17, dtype=np.float32)
    out = np.zeros(17, np.float32)
    prog = _native.Program()
    assert prog.record(lambda x: _native.unary_f32("relu", x, 1, out), a - 8)
    assert not prog.record(lambda x: x + 1, a)  # NumPy: no kernel call
    assert not prog.record(lambda x: _native.unary_f32("relu", x, 1, None), a)  # its own output
    assert not prog.record(lambda x: _native.unary_f32("nope", x, 1, out), a)  # raises
    twice = np.zeros(17, np.float32)

    def two(x):
        _native.unary_f32("relu", x, 1, twice)
        _native.unary_f32("relu", x, 1, out)

    assert not prog.record(two, a)
    assert len(prog) == 1
    out[:] = 0
    prog.run()
    np.testing.assert_array_equal(out, np.maximum(a - 8, 0))
    np.testing.assert_array_equal(twice, 0)  # the refused recording ran nothing


def test_a_signature_static_value_is_read_from_its_recorded_copy() -> None:
    """A value fixed by the signature (a Gather of the Cast of a Shape: its step does not
    run after the measuring run, though its kernel has a place in the arena) is read by a
    recorded Add from the recorded copy, not from the arena place no step writes."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="relu"),
        helper.make_node("Shape", ["a"], ["s"], name="shape"),
        helper.make_node("Cast", ["s"], ["f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Gather", ["f", "last"], ["fl"], name="last_dim"),
        helper.make_node("Add", ["a", "fl"], ["y"], name="add"),
        helper.make_node("Mul", ["y", "y"], ["z"], name="square"),
    ]
    g = helper.make_graph(
        nodes,
        "static",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 7, "w"])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [_const("last", np.array(2, np.int64))],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the Shape steps
    sess, ref = quanta.InferenceSession(p, opts), quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(4)
    for _ in range(4):
        feeds = {"x": rng.normal(0, 2, (3, 7, 17)).astype(np.float32)}
        np.testing.assert_array_equal(sess.run(None, feeds)[0], ref.run(None, feeds)[0])
    (bound,) = sess.executor.bound_runs().values()
    assert bound.program_steps[0] >= 1


@pytest.mark.parametrize("kind", [0, 1, 2, 3, 4])
def test_a_recorded_call_gives_the_same_bytes_on_every_run(kind: int) -> None:
    """A kept AccumulatorToQuant with each fused float gate (none, SiLU, HardSwish,
    HardSigmoid, Clip·x/d), run three times, writes what the direct call writes every
    time (a kept call is run many times: nothing it reads may change between runs)."""
    from quanta.kernels import _native

    rng = np.random.default_rng(0)
    acc = rng.integers(-5000, 5000, (1, 8, 24, 96)).astype(np.int32)
    bias = rng.integers(-100, 100, 8).astype(np.int32)
    scale = rng.uniform(1e-3, 2e-3, 8).astype(np.float32)
    fbias = rng.normal(0, 0.1, 8).astype(np.float32)
    params = {0: [], 1: [], 2: [], 3: [0.2, 0.5], 4: [3.0, 0.0, 6.0, 6.0]}[kind]
    want = np.empty(acc.shape, np.uint8)
    _native.acc_to_quant(acc, bias, scale, fbias, kind, params, 0.05, 3, False, 1, want)
    got = np.empty_like(want)
    prog = _native.Program()
    assert prog.record(
        lambda a: _native.acc_to_quant(a, bias, scale, fbias, kind, params, 0.05, 3, False, 1, got), acc
    )
    for _ in range(3):
        got[...] = 0
        prog.run()
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("include", [False, True])
def test_recorded_pools_give_the_bytes_of_the_direct_call(include: bool) -> None:
    """Failure signature: a specialized AveragePool said it was recordable while its
    binding ran the kernel at once, so Program.record saw no call and the step stayed in
    the Python loop; or a kept pool call read a stale geometry. The kept calls run three
    times and write what the direct calls write (pads on both sides, 7 channels, odd
    sizes)."""
    from quanta.kernels import _native

    rng = np.random.default_rng(5)
    x = rng.normal(0, 2, (2, 7, 13, 17)).astype(np.float32)
    args = ((3, 2), (2, 1), (1, 1), (1, 0), (1, 1))
    out_hw = ((13 + 1 + 1 - 3) // 2 + 1, (17 + 0 + 1 - 2) // 1 + 1)
    want = _native.average_pool_2d_f32(x, *args, out_hw, include, 1)
    want_max = _native.max_pool_2d_f32(x, (3, 2), (2, 1), (1, 1), (1, 0), out_hw, 1)
    got = np.empty_like(want)
    got_max = np.empty_like(want_max)
    prog = _native.Program()
    assert prog.record(lambda a: _native.average_pool_2d_f32(a, *args, out_hw, include, 1, got), x)
    assert prog.record(
        lambda a: _native.max_pool_2d_f32(a, (3, 2), (2, 1), (1, 1), (1, 0), out_hw, 1, got_max), x
    )
    for _ in range(3):
        got[...] = 0
        got_max[...] = 0
        prog.run()
        np.testing.assert_array_equal(got, want)
        np.testing.assert_array_equal(got_max, want_max)


def test_an_average_pool_between_recorded_steps_runs_in_the_program() -> None:
    """Relu -> AveragePool -> Relu -> Mul: the pool is recorded with its neighbours, and
    the bytes are those of the Python loop (and close to the reference)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("AveragePool", ["r"], ["p"], name="pool", kernel_shape=[2, 3], pads=[1, 0, 0, 1]),
        helper.make_node("Relu", ["p"], ["q"], name="relu2"),
        helper.make_node("Mul", ["q", "half"], ["y"], name="mul"),
    ]
    g = helper.make_graph(
        nodes,
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 17, 5, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("half", np.float32(0.5))],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, plain = quanta.InferenceSession(p, opts), quanta.InferenceSession(p, opts)
    plain.executor.native_programs = False
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(7)
    for _ in range(3):
        feeds = {"x": rng.normal(0, 2, (1, 17, 5, 9)).astype(np.float32)}
        got, loop, want = sess.run(None, feeds)[0], plain.run(None, feeds)[0], ref.run(None, feeds)[0]
        np.testing.assert_array_equal(got, loop)
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)  # float sums of 6: a few ulps
    (bound,) = sess.executor.bound_runs().values()
    # the Relus (the first reads the staged feed) and the pool; Mul writes y
    assert bound.program_steps[0] == 3


def test_a_requantizing_concat_runs_in_the_program() -> None:
    """Three uint8 inputs ([1, 3, 5], [1, 7, 5], [1, 17, 5]; two with their own scale and
    zero point: tables, one with the output's: a copy) concatenated on axis 1 and requantized:
    the QLinearConcat is recorded with the feeds' Q (they read the staged feeds) and
    gives the bytes of the Python loop and of the reference."""
    params = [(0.02, 128), (0.013, 3), (0.031, 250)]
    nodes, inits, inputs = [], [], []
    for i, ((s, z), c) in enumerate(zip(params, (3, 7, 17), strict=True)):
        inputs.append(helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, [1, c, 5]))
        inits += [_const(f"s{i}", np.float32(s)), _const(f"z{i}", np.uint8(z))]
        nodes.append(helper.make_node("QuantizeLinear", [f"x{i}", f"s{i}", f"z{i}"], [f"q{i}"]))
        nodes.append(helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"]))
    nodes.append(helper.make_node("Concat", ["d0", "d1", "d2"], ["c"], axis=1))
    nodes.append(helper.make_node("QuantizeLinear", ["c", "s2", "z2"], ["cq"]))
    nodes.append(helper.make_node("DequantizeLinear", ["cq", "s2", "z2"], ["y"]))
    g = helper.make_graph(
        nodes, "concat", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    sess, plain = quanta.InferenceSession(p), quanta.InferenceSession(p)
    plain.executor.native_programs = False
    ref = quanta.InferenceSession(p, backend="reference")
    assert "QLinearConcat" in [s.op_type for s in sess.plan.steps]
    rng = np.random.default_rng(11)
    for _ in range(3):
        feeds = {f"x{i}": rng.normal(0, 2, (1, c, 5)).astype(np.float32) for i, c in enumerate((3, 7, 17))}
        got, loop, want = sess.run(None, feeds)[0], plain.run(None, feeds)[0], ref.run(None, feeds)[0]
        assert got.tobytes() == loop.tobytes() == want.tobytes()
    (bound,) = sess.executor.bound_runs().values()
    assert bound.program_steps[0] == 4  # the three Q and the concat (the DQ writes y)


def _dynamic_attention_model(path) -> None:
    """A float block that ONNX Runtime's quantize_dynamic turns into DynamicQuantizeLinear
    before each of its three MatMuls by constants (x [7, 300] · [300, 17], then [17, 33]
    and [33, 17]: K > 258 once, odd N), with LayerNormalizations, a Softmax and a
    run-time Q·Kᵀ between them, in the written order of a tiny encoder layer. The first
    norm and the last Relu keep the feed and the graph output (the caller's arrays,
    read and written from the Python loop) away from the quantized chain."""
    rng = np.random.default_rng(41)
    nodes = [
        helper.make_node("LayerNormalization", ["x", "g0", "beta0"], ["x0"], name="norm0", axis=-1),
        helper.make_node("MatMul", ["x0", "w1"], ["h"], name="proj"),
        helper.make_node("LayerNormalization", ["h", "g", "beta"], ["n"], name="norm", axis=-1),
        helper.make_node("MatMul", ["n", "w2"], ["u"], name="up"),
        helper.make_node("Transpose", ["u"], ["ut"], name="t", perm=[1, 0]),
        helper.make_node("MatMul", ["u", "ut"], ["scores"], name="qk"),
        helper.make_node("Softmax", ["scores"], ["p"], name="softmax", axis=-1),
        helper.make_node("MatMul", ["p", "u"], ["c"], name="pv"),
        helper.make_node("MatMul", ["c", "w3"], ["d"], name="down"),
        helper.make_node("Relu", ["d"], ["y"], name="relu"),
    ]
    g = helper.make_graph(
        nodes,
        "dynamic_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [7, 300])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 17])],
        [
            _const("g0", rng.uniform(0.5, 1.5, 300).astype(np.float32)),
            _const("beta0", rng.normal(0, 0.2, 300).astype(np.float32)),
            _const("w1", rng.normal(0, 0.1, (300, 17)).astype(np.float32)),
            _const("g", rng.uniform(0.5, 1.5, 17).astype(np.float32)),
            _const("beta", rng.normal(0, 0.2, 17).astype(np.float32)),
            _const("w2", rng.normal(0, 0.3, (17, 33)).astype(np.float32)),
            _const("w3", rng.normal(0, 0.3, (33, 17)).astype(np.float32)),
        ],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("threads", [1, 2])
def test_onnxruntimes_dynamic_quantization_runs_inside_the_program(tmp_path, threads: int) -> None:
    """ONNX Runtime's quantize_dynamic file: every DynamicQuantizeLinear writes its codes,
    scale and zero point into the arena inside the program, and the GEMMs that read them
    (MatMulIntegerToFloat) compute their multipliers from those values on each run. So no
    step of the chain is left in the Python loop, and each run equals the loop's and the
    reference's bytes for inputs whose ranges differ run to run.

    Failure signature: a recorded GEMM that keeps the scale of the run it was recorded
    on (right once, then off by the ratio of two ranges)."""
    from onnxruntime.quantization import quantize_dynamic

    src, dyn = tmp_path / "block.onnx", tmp_path / "block.dyn.onnx"
    _dynamic_attention_model(src)
    quantize_dynamic(src, dyn)
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(str(dyn), opts)
    plain = quanta.InferenceSession(str(dyn), opts)
    plain.executor.native_programs = False
    ref = quanta.InferenceSession(str(dyn), backend="reference")
    rng = np.random.default_rng(threads)
    for scale in (1.0, 3.0, 0.01, 40.0, 0.5):
        feeds = {"x": (rng.normal(0.2, 1, (7, 300)) * scale).astype(np.float32)}
        got, loop, want = sess.run(None, feeds)[0], plain.run(None, feeds)[0], ref.run(None, feeds)[0]
        np.testing.assert_array_equal(got, loop)
        np.testing.assert_array_equal(got, want)
    (bound,) = sess.executor.bound_runs().values()
    ops = [s.op_type for s in sess.plan.steps]
    assert ops.count("DynamicQuantizeLinear") >= 3
    assert ops.count("MatMulIntegerToFloat") >= 3
    assert {"MlasSoftmax", "OrtLayerNorm"} <= set(ops)  # ORT's float orders on ORT's file
    # only the step that writes the graph output is left (the first reads the staged feed)
    left = {sess.plan.steps[t[0]].node.name for t in bound.fast_steps if t[2] is not _PROGRAM}
    assert left == {"relu"}
    assert bound.program_steps[0] == len(sess.plan.steps) - 1


def _lstm_stack_model(path) -> None:
    """Two bidirectional LSTMs (I = 300 then 34: a reduction past 258 terms; H = 17) with
    the Transpose / Reshape between them that PyTorch exports, in tashkeel's shape: the
    first Relu and the last Relu keep the feed and the graph output away from the chain.
    ONNX Runtime's quantize_dynamic makes each LSTM a DynamicQuantizeLSTM."""
    rng = np.random.default_rng(43)
    H, T, n_in = 17, 5, 300
    nodes = [
        helper.make_node("Relu", ["x"], ["x0"], name="relu_in"),
        helper.make_node(
            "LSTM", ["x0", "w1", "r1", "b1"], ["y1"], name="lstm1", hidden_size=H, direction="bidirectional"
        ),
        helper.make_node("Transpose", ["y1"], ["t1"], name="t1", perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["t1", "shape"], ["x1"], name="r1"),
        helper.make_node(
            "LSTM", ["x1", "w2", "r2", "b2"], ["y2"], name="lstm2", hidden_size=H, direction="bidirectional"
        ),
        helper.make_node("Relu", ["y2"], ["y"], name="relu"),
    ]

    def w(*shape):
        return rng.normal(0, 1 / np.sqrt(shape[-1]), shape).astype(np.float32)

    g = helper.make_graph(
        nodes,
        "lstm_stack",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, 1, n_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, 2, 1, H])],
        [
            _const("w1", w(2, 4 * H, n_in)),
            _const("r1", w(2, 4 * H, H)),
            _const("b1", rng.normal(0, 0.3, (2, 8 * H)).astype(np.float32)),
            _const("shape", np.array([T, 1, 2 * H], np.int64)),
            _const("w2", w(2, 4 * H, 2 * H)),
            _const("r2", w(2, 4 * H, H)),
            _const("b2", rng.normal(0, 0.3, (2, 8 * H)).astype(np.float32)),
        ],
    )
    onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), path)


@pytest.mark.parametrize("threads", [1, 2])
def test_dynamic_quantize_lstm_runs_inside_the_program(tmp_path, threads: int) -> None:
    """ONNX Runtime's quantize_dynamic file of two stacked LSTMs: each DynamicQuantizeLSTM
    writes Y, Y_h and Y_c into the arena from one recorded call, so the LSTMs and the
    Transpose between them run in one native program, and every run equals the Python
    loop's and the reference's bytes for inputs whose ranges differ run to run (the
    recorded call quantizes the X of its run)."""
    from onnxruntime.quantization import quantize_dynamic

    src, dyn = tmp_path / "lstm.onnx", tmp_path / "lstm.dyn.onnx"
    _lstm_stack_model(src)
    quantize_dynamic(src, dyn)
    assert [n.op_type for n in onnx.load(dyn).graph.node].count("DynamicQuantizeLSTM") == 2
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = quanta.InferenceSession(str(dyn), opts)
    plain = quanta.InferenceSession(str(dyn), opts)
    plain.executor.native_programs = False
    ref = quanta.InferenceSession(str(dyn), backend="reference")
    rng = np.random.default_rng(threads)
    for scale in (1.0, 3.0, 0.01, 40.0, 0.5):
        feeds = {"x": (rng.normal(0.2, 1, (5, 1, 300)) * scale).astype(np.float32)}
        got, loop, want = sess.run(None, feeds)[0], plain.run(None, feeds)[0], ref.run(None, feeds)[0]
        np.testing.assert_array_equal(got, loop)
        np.testing.assert_array_equal(got, want)
    (bound,) = sess.executor.bound_runs().values()
    left = {sess.plan.steps[t[0]].node.name for t in bound.fast_steps if t[2] is not _PROGRAM}
    assert not any(
        sess.plan.steps[t[0]].op_type == "DynamicQuantizeLSTM"
        for t in bound.fast_steps
        if t[2] is not _PROGRAM
    ), left
    assert left <= {"relu_in", "relu"}, left


def test_float16_casts_between_recorded_steps_run_in_the_program() -> None:
    """Relu -> Cast(float16) -> Cast(float32) -> Sigmoid -> Mul: the round trip through
    float16 (an exported model's float16 island, run in float32 between Casts) is
    recorded with the Relu and Sigmoid around it, so the island does not split the program; the
    bytes are those of the Python loop and of the reference (NumPy's astype: overflow to
    inf, float16 subnormals, ties to even)."""
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["h"], name="to_half", to=TensorProto.FLOAT16),
        helper.make_node("Cast", ["h"], ["f"], name="to_float", to=TensorProto.FLOAT),
        helper.make_node("Sigmoid", ["f"], ["s"], name="sigmoid"),
        helper.make_node("Mul", ["s", "scale"], ["y"], name="mul"),
    ]
    g = helper.make_graph(
        nodes,
        "half_island",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [_const("scale", np.linspace(0.25, 3.0, 17, dtype=np.float32))],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, plain = quanta.InferenceSession(p, opts), quanta.InferenceSession(p, opts)
    plain.executor.native_programs = False
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(11)
    for run in range(3):
        x = rng.normal(0, 4, (3, 7, 17)).astype(np.float32)
        x[0, 0, :4] = [7e4, 1e5, 6e-8, 3e-5]  # past float16's range; float16 subnormals
        x[1, 2, :3] = [2049.0, 2051.0, 1 + 2**-11]  # ties to even in float16
        feeds = {"x": x * (run + 1)}
        got, loop, want = sess.run(None, feeds)[0], plain.run(None, feeds)[0], ref.run(None, feeds)[0]
        np.testing.assert_array_equal(got, loop)
        np.testing.assert_array_equal(got, want)
    (bound,) = sess.executor.bound_runs().values()
    assert bound.program_steps[0] == 4  # Relu, both Casts and the Sigmoid (Mul writes y)
    python_steps = {sess.plan.steps[t[0]].op_type for t in bound.fast_steps if t[2] is not _PROGRAM}
    assert python_steps == {"Mul"}


def test_small_feeds_are_staged_so_the_steps_that_read_them_are_recorded() -> None:
    """x [3, 7, 17] (small: staged) feeds a Transpose, a Reshape (a view made once of the
    staged buffer, read by a Relu) and an Identity that is a graph output; big [130, 130]
    (past STAGED_INPUT_MAX_BYTES) feeds a Sigmoid from the loop. Every run copies its
    feeds (contiguous or not) into the buffers: the bytes of the Python loop and of the
    reference, outputs the caller's own (writeable, unchanged by later runs, never the
    staged buffer)."""
    from quanta.runtime.execute import STAGED_INPUT_MAX_BYTES

    assert 130 * 130 * 4 > STAGED_INPUT_MAX_BYTES >= 3 * 7 * 17 * 4
    nodes = [
        helper.make_node("Transpose", ["x"], ["t"], name="transpose", perm=[2, 0, 1]),
        helper.make_node("Mul", ["t", "three"], ["yt"], name="mul"),
        helper.make_node("Reshape", ["x", "shape"], ["v"], name="view"),
        helper.make_node("Relu", ["v"], ["r"], name="relu"),
        helper.make_node("Add", ["r", "bias"], ["yr"], name="add"),
        helper.make_node("Identity", ["x"], ["xi"], name="same"),
        helper.make_node("Sigmoid", ["big"], ["s"], name="sigmoid"),
        helper.make_node("Neg", ["s"], ["yb"], name="neg"),
    ]
    g = helper.make_graph(
        nodes,
        "staged",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7, 17]),
            helper.make_tensor_value_info("big", TensorProto.FLOAT, [130, 130]),
        ],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("yt", "yr", "xi", "yb")],
        [
            _const("three", np.float32(3.0)),
            _const("shape", np.array([21, 17], np.int64)),
            _const("bias", np.linspace(-1.0, 1.0, 17, dtype=np.float32)),
        ],
    )
    p = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()
    opts = quanta.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess, plain = quanta.InferenceSession(p, opts), quanta.InferenceSession(p, opts)
    plain.executor.native_programs = False
    ref = quanta.InferenceSession(p, backend="reference")
    rng = np.random.default_rng(13)
    kept = []
    for run in range(4):
        wide = rng.normal(0, 2, (3, 7, 34)).astype(np.float32)
        x = wide[:, :, ::2] if run % 2 else np.ascontiguousarray(wide[:, :, :17])  # strided, then not
        feeds = {"x": x, "big": rng.normal(0, 2, (130, 130)).astype(np.float32)}
        got, loop, want = sess.run(None, feeds), plain.run(None, feeds), ref.run(None, feeds)
        for a, b, c in zip(got, loop, want, strict=True):
            np.testing.assert_array_equal(a, b)
            np.testing.assert_allclose(a, c, rtol=1e-6, atol=1e-6)
        np.testing.assert_array_equal(got[2], x)
        assert all(a.flags.writeable for a in got)
        kept.append((got, [a.copy() for a in got]))
        got[2][...] = -7.0  # the caller's own array: the next run does not see it
    for got, copies in kept[:-1]:
        for a, c in zip(got[:2] + got[3:], copies[:2] + copies[3:], strict=True):
            np.testing.assert_array_equal(a, c)  # not overwritten by later runs
    (bound,) = sess.executor.bound_runs().values()
    plan = sess.plan
    assert [k for k, _, _ in bound.staged] == [plan.inputs["x"]]  # big is past the limit
    python_steps = {plan.steps[t[0]].node.name for t in bound.fast_steps if t[2] is not _PROGRAM}
    assert {"transpose", "relu"}.isdisjoint(python_steps)
    assert "sigmoid" in python_steps  # it reads big's feed, not a staged copy
