"""The native tensor-op binders (quanta/targets/native/tensor_ops.py, reduce.py,
resize.py; kernels/cpp/tensor_ops) against their reference twins.

Every bound kernel is called as the runtime calls it, on every ISA the CPU runs
(``_native.set_isa``), with 1 and 2 threads, with and without ``out=``, and compared
byte for byte (the signs of zeros included) with the registered reference op; a
run-time hand-over to the twin (``RUNTIME_FALLBACKS``) fails the test. Tolerance 0
throughout: the kernels perform the twin's IEEE operations in the twin's order.
Shapes are odd (3, 7, 17, 65, rows longer than 258) and broadcast.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import ModelProto, TensorProto, helper

import quanta
from quanta.ir.graph import Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels import _native
from quanta.kernels.reference.registry import get_op
from quanta.targets.base import KernelContext, Specialization
from quanta.targets.native import BINDERS, _load_families
from quanta.targets.native.float_ops import RUNTIME_FALLBACKS
from tests.onnx_node import cases_for

F32 = np.float32
ISAS = list(_native.supported_isas())
_load_families()

SPECIALS = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3e38, -3e38, 1.0, -1.0, 0.5], F32)


def floats(rng: np.random.Generator, shape: tuple, scale: float = 3.0) -> np.ndarray:
    """Normal values with IEEE specials (NaN, ±inf, ±0, subnormals) sprinkled in."""
    x = np.array(rng.standard_normal(shape) * scale, F32)
    flat = x.reshape(-1)
    if flat.size:
        k = rng.integers(0, flat.size, size=max(1, flat.size // 5))
        flat[k] = rng.choice(SPECIALS, size=k.size)
    return x


def bind(op_type: str, inputs: list, attrs: dict | None = None, n_outputs: int = 1):
    values = []
    for i, a in enumerate(inputs):
        t = None if a is None else TensorType(elem_from_numpy(np.asarray(a).dtype))
        values.append(Value(f"in{i}", type=t))
    node = Node(op_type, values, [Value(f"out{i}") for i in range(n_outputs)], attrs or {})
    return BINDERS[("", op_type)](None, node)


def assert_bit_exact(expected, got, what: str = "") -> None:
    expected, got = np.asarray(expected), np.asarray(got)
    assert expected.dtype == got.dtype and expected.shape == got.shape, (
        what,
        expected.shape,
        got.shape,
        got.dtype,
    )
    if expected.dtype.kind == "f":
        np.testing.assert_array_equal(got, expected, err_msg=what)  # NaN at the same places
        finite = ~np.isnan(expected)
        assert expected[finite].tobytes() == got[finite].tobytes(), what  # and the signs of zeros
    else:
        assert expected.tobytes() == got.tobytes(), what


def run_both(op_type: str, inputs: list, attrs: dict | None = None, opset: int = 21) -> np.ndarray:
    """The bound kernel on every ISA, 1 and 2 threads, with and without out=, vs the twin."""
    attrs = attrs or {}
    kernel, reason = bind(op_type, inputs, attrs)
    assert kernel is not None, reason
    before = RUNTIME_FALLBACKS[op_type]
    expected = np.asarray(get_op(op_type)(KernelContext(opset=opset), *inputs, **attrs))
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                ctx = KernelContext(opset=opset, num_threads=threads)
                got = kernel.fn(ctx, *inputs, **attrs, **kernel.params)
                assert_bit_exact(expected, got, f"{op_type} {isa} {threads}t")
                if kernel.out:
                    out = np.empty(expected.shape, expected.dtype)
                    assert kernel.fn(ctx, *inputs, **attrs, **kernel.params, out=out) is out
                    assert_bit_exact(expected, out, f"{op_type} {isa} {threads}t out=")
    finally:
        _native.clear_isa()
    assert RUNTIME_FALLBACKS[op_type] == before, "the kernel handed a supported call to the twin"
    return expected


# --------------------------------------------------------------------------------------
# Clip, unary float ops, Pow, HardSigmoid, Exp
# --------------------------------------------------------------------------------------

SHAPES = [(), (17,), (3, 65), (2, 7, 33), (1, 3, 131, 97)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize(
    "bounds", [(0.0, 6.0), (-0.0, 0.0), (None, 1.5), (-2.0, None), (None, None), (3.0, -1.0)]
)
def test_clip_float_matches_twin_zeros_nan_and_crossed_bounds(shape, bounds):
    # -0 against a +0 bound: np.maximum returns its second operand on a tie, so Clip(-0, 0)
    # is +0 (a kernel written x < lo ? lo : x gives -0); crossed bounds give hi everywhere
    x = floats(np.random.default_rng(len(shape)), shape)
    lo, hi = (None if b is None else np.array(b, F32) for b in bounds)
    run_both("Clip", [x, lo, hi])


def test_clip_opset_6_attributes():
    x = floats(np.random.default_rng(1), (5, 17))
    run_both("Clip", [x], {"min": -1.0, "max": 2.0}, opset=6)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8, np.int32, np.int64])
def test_clip_integers(dtype):
    info = np.iinfo(dtype)
    x = np.random.default_rng(3).integers(info.min, info.max, (3, 67), endpoint=True).astype(dtype)
    run_both("Clip", [x, np.array(-5 if info.min < 0 else 7, dtype), np.array(100, dtype)])
    run_both("Clip", [x, None, np.array(9, dtype)])


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op_type", ["Neg", "Abs"])
@pytest.mark.parametrize("shape", [(), (17,), (3, 65)])
def test_integer_neg_and_abs_wrap_as_numpy(op_type, dtype, shape):
    """int32 / int64 Neg and Abs (T5's and SVTRv2's shape arithmetic): NumPy's wrapping
    results, −MIN = MIN and |MIN| = MIN included."""
    info = np.iinfo(dtype)
    rng = np.random.default_rng(len(shape))
    x = np.array(rng.integers(-1000, 1000, shape), dtype)
    flat = x.reshape(-1)
    flat[: min(flat.size, 4)] = np.array([info.min, info.max, 0, -1], dtype)[: min(flat.size, 4)]
    with np.errstate(over="ignore"):
        run_both(op_type, [x])


@pytest.mark.parametrize("op_type", ["Sqrt", "Neg", "Abs", "Reciprocal", "Exp"])
@pytest.mark.parametrize("shape", SHAPES)
def test_unary_float_ops_match_twin(op_type, shape):
    run_both(op_type, [floats(np.random.default_rng(7), shape)])


@pytest.mark.parametrize(
    ("exponent", "exp_dtype"),
    [
        (1.0, np.float32),
        (2.0, np.float32),
        (3.0, np.float32),
        (0.5, np.float32),
        (1, np.int64),
        (2, np.int64),
        (3, np.int64),
    ],
)
def test_pow_exact_exponents(exponent, exp_dtype):
    x = floats(np.random.default_rng(11), (3, 7, 65))
    run_both("Pow", [x, np.array(exponent, exp_dtype)])
    run_both("Pow", [x, np.array([exponent], exp_dtype)])


def test_pow_exact_forms_are_the_specified_operations():
    # (x·x)·x, not powf's correctly-rounded-or-not x³; sqrt(-0) = -0 and sqrt(-inf) = NaN
    # where pow(-0, 0.5) = +0 and pow(-inf, 0.5) = +inf (docs/float-ops.md "Pow")
    pow_ = get_op("Pow")
    x = np.array([1.0000001, -0.0, -np.inf, 3.3], F32)
    ctx = KernelContext()
    assert_bit_exact(pow_(ctx, x, np.array(3.0, F32)), (x * x) * x)
    y = pow_(ctx, x, np.array(0.5, F32))
    assert np.signbit(y[1]) and np.isnan(y[2])


GENERAL_EXPONENTS = [
    (1 / 3, np.float32),  # GeM pooling's 1 / p
    (-0.5, np.float32),
    (2.5, np.float32),
    (1.7, np.float32),
    (4.0, np.float32),  # even integer: a positive result for a negative base
    (5.0, np.float32),  # odd integer: the base's sign
    (-3.0, np.float32),
    (0.0, np.float32),  # 1 everywhere, NaN included
    (4, np.int64),
    (-1, np.int64),
]


@pytest.mark.parametrize(("exponent", "exp_dtype"), GENERAL_EXPONENTS)
def test_pow_general_exponents_match_twin(exponent, exp_dtype):
    """Any other finite float32 exponent: (PW1)-(PW3) on the native log and exp, bit for
    bit the twin's, IEEE specials and subnormals included."""
    x = floats(np.random.default_rng(13), (3, 7, 65))
    got = run_both("Pow", [x, np.array(exponent, exp_dtype)])
    run_both("Pow", [x, np.array([exponent], exp_dtype)])
    assert not np.array_equal(got, x)  # the exponent was applied


@pytest.mark.parametrize("exponent", [1 / 3, -0.5, 2.5, 5.0, -3.0, 0.25, 1.7])
def test_pow_general_twin_within_its_bound_of_float64(exponent):
    """(PW2)'s error grows with |t| = |e · ln|x||: log's ulp of ln|x|, scaled by e, then
    exp's 1 ulp; bound 2^-23 · (|t| + 2) relative for normal results (docs/float-ops.md
    "Pow and Exp")."""
    rng = np.random.default_rng(17)
    x = np.concatenate(
        [rng.standard_normal(4099) * 7, np.exp(rng.uniform(-80, 80, 4099)), rng.uniform(0, 1e-3, 517)]
    ).astype(F32)
    e = F32(exponent)
    got = np.asarray(get_op("Pow")(KernelContext(), x, np.array(e)), np.float64)
    with np.errstate(all="ignore"):
        exact = np.power(x.astype(np.float64), np.float64(e))
        t = np.abs(np.float64(e) * np.log(np.abs(x.astype(np.float64))))
    normal = np.isfinite(exact) & (np.abs(exact) > 2.0**-120) & (np.abs(exact) < 2.0**120)
    assert normal.sum() > 4000
    rel = np.abs(got[normal] - exact[normal]) / np.abs(exact[normal])
    assert np.all(rel <= 2.0**-23 * (t[normal] + 2)), float(np.max(rel / (t[normal] + 2)) * 2**23)
    neg = (x < 0) & np.isfinite(x)
    if float(e).is_integer():
        assert not np.any(np.isnan(got[np.isfinite(x)]))
    else:
        assert np.all(np.isnan(got[neg]))


def test_pow_general_special_values_follow_c_pow():
    pow_ = get_op("Pow")
    ctx = KernelContext()
    x = np.array([0.0, -0.0, np.inf, -np.inf, 1.0, -2.0, np.nan], F32)
    with np.errstate(all="ignore"):
        for e in (F32(1 / 3), F32(-0.5), F32(5.0), F32(-1.0), F32(4.0)):
            got = pow_(ctx, x, np.array(e))
            want = np.power(x.astype(np.float64), np.float64(e)).astype(F32)
            np.testing.assert_array_equal(got[[0, 1, 2, 3, 4, 6]], want[[0, 1, 2, 3, 4, 6]], err_msg=str(e))
            assert np.signbit(got[:4]).tolist() == np.signbit(want[:4]).tolist(), e
    assert np.isnan(pow_(ctx, x, np.array(F32(1 / 3)))[5])
    np.testing.assert_array_equal(pow_(ctx, x, np.array(F32(0.0))), np.ones(7, F32))


@pytest.mark.parametrize(
    ("const", "words"),
    [
        (np.array([2.5, 3.0], F32), "shape [2]"),
        (np.array(np.nan, F32), "nan, not finite"),
        (np.array(0.1, np.float64), "float32 does not hold"),
    ],
)
def test_pow_binder_names_the_exponent_it_refuses(const, words):
    x = Value("x", type=TensorType(elem_from_numpy(np.dtype(F32))))
    e = Value("e", const=const)
    kernel, reason = BINDERS[("", "Pow")](None, Node("Pow", [x, e], [Value("y")], {}))
    assert kernel is None and words in reason, reason


def test_gem_pooling_session_runs_pow_natively():
    """GeM pooling as retrieval models export it (Clip(eps), Pow 3, GlobalAveragePool,
    Pow 1/3): no twin step, and within (PW2)'s bound of ONNX Runtime."""
    import onnxruntime as ort

    p = helper.make_tensor("p", TensorProto.FLOAT, [], [3.0])
    inv = helper.make_tensor("inv", TensorProto.FLOAT, [], [float(F32(1 / 3))])
    eps = helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-6])
    graph = helper.make_graph(
        [
            helper.make_node("Clip", ["x", "eps", ""], ["c"]),
            helper.make_node("Pow", ["c", "p"], ["c3"]),
            helper.make_node("GlobalAveragePool", ["c3"], ["m"]),
            helper.make_node("Pow", ["m", "inv"], ["y"]),
        ],
        "gem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 17, 7, 9])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 17, 1, 1])],
        [p, inv, eps],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(model.SerializeToString())
    assert sess.fallbacks == []
    x = np.random.default_rng(19).standard_normal((2, 17, 7, 9)).astype(F32) * 2
    got = sess.run(None, {"x": x})[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    t = np.abs(np.log(want.astype(np.float64)) / 3) + 2
    assert np.all(np.abs(got - want) <= 2.0**-23 * t * np.abs(want) + 1e-7 * np.abs(want))


def test_hard_swish_matches_twin():
    run_both("HardSwish", [floats(np.random.default_rng(71), (2, 17, 33), scale=5)])


def test_hard_swish_gives_onnx_runtime_and_onnx_reference_bytes():
    """alpha = f32(1/6) multiplied, as ONNX defines HardSwish (HardSigmoid's alpha · x +
    beta) and as ONNX Runtime and onnx.reference compute it: x / 6 rounds differently for
    about one x in ten of this sample."""
    import onnxruntime as ort
    from onnx.reference import ReferenceEvaluator

    x = np.concatenate(
        [floats(np.random.default_rng(5), (20011,), scale=4), np.arange(-7, 7.01, 0.125, dtype=F32)]
    )
    graph = helper.make_graph(
        [helper.make_node("HardSwish", ["x"], ["y"])],
        "hs",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None])],
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    assert_bit_exact(want, ReferenceEvaluator(proto).run(None, {"x": x})[0], "onnx.reference")
    assert_bit_exact(want, get_op("HardSwish")(KernelContext(), x), "twin")
    with np.errstate(invalid="ignore"):  # inf · 0 in the specials
        divided = x * np.clip(x / F32(6) + F32(0.5), 0, 1)
    assert np.count_nonzero(want != divided) > 100  # the sample tells them apart
    assert_bit_exact(
        want, quanta.InferenceSession(proto.SerializeToString()).run(None, {"x": x})[0], "session"
    )


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int8, np.int64])
@pytest.mark.parametrize("mode", ["DCR", "CRD"])
@pytest.mark.parametrize(
    ("op_type", "shape", "b"),
    [
        ("DepthToSpace", (2, 12, 3, 5), 2),
        ("DepthToSpace", (1, 27, 7, 3), 3),
        ("SpaceToDepth", (2, 7, 6, 10), 2),
    ],
)
def test_depth_space_match_twin(op_type, shape, b, mode, dtype):
    x = np.random.default_rng(sum(shape)).integers(-100, 100, size=shape).astype(dtype)
    run_both(op_type, [x], {"blocksize": b, "mode": mode})


def test_depth_to_space_bad_channels_raise_the_twins_error():
    kernel, _ = bind("DepthToSpace", [np.zeros((1, 6, 2, 2), F32)], {"blocksize": 2})
    with pytest.raises(Exception, match="multiple of blocksize"):
        kernel.fn(KernelContext(), np.zeros((1, 6, 2, 2), F32), blocksize=2, **kernel.params)


@pytest.mark.parametrize("op_type", ["Max", "Min"])
@pytest.mark.parametrize(
    ("sa", "sb"), [((3, 17, 7), (3, 17, 7)), ((2, 7, 17), (17,)), ((1,), (5, 259)), ((3, 1, 7), (1, 17, 1))]
)
def test_max_min_match_twin(op_type, sa, sb):
    # specials in both operands, ±0 ties in both orders (np.maximum returns the second)
    rng = np.random.default_rng(len(sa) * 7 + len(sb))
    a, b = floats(rng, sa), floats(rng, sb)
    a.reshape(-1)[:2] = [0.0, -0.0][: a.size]
    b.reshape(-1)[:2] = [-0.0, 0.0][: b.size]
    run_both(op_type, [a, b])


def test_max_of_three_inputs_falls_back_with_reason():
    values = [Value(f"in{i}", type=TensorType(elem_from_numpy(np.dtype(F32)))) for i in range(3)]
    kernel, reason = BINDERS[("", "Max")](None, Node("Max", values, [Value("y")], {}))
    assert kernel is None and "two inputs" in reason


@pytest.mark.parametrize("alpha", [0.01, 0.2, 1 / 3, -0.5])
def test_leaky_relu_matches_twin(alpha):
    run_both("LeakyRelu", [floats(np.random.default_rng(29), (3, 17, 7), scale=4)], {"alpha": alpha})


@pytest.mark.parametrize(
    ("alpha", "beta"), [(0.2, 0.5), (1 / 6, 0.5), (0.3, -0.1), (0.25, 0.0), (0.25, -0.0)]
)
def test_hard_sigmoid_matches_twin(alpha, beta):
    x = floats(np.random.default_rng(13), (2, 17, 33), scale=5)
    run_both("HardSigmoid", [x], {"alpha": alpha, "beta": beta})


# --------------------------------------------------------------------------------------
# Cast
# --------------------------------------------------------------------------------------

CAST_TYPES = {
    TensorProto.FLOAT: np.float32,
    TensorProto.DOUBLE: np.float64,
    TensorProto.INT8: np.int8,
    TensorProto.UINT8: np.uint8,
    TensorProto.INT32: np.int32,
    TensorProto.INT64: np.int64,
    TensorProto.BOOL: np.bool_,
}


def cast_source(dtype, rng) -> np.ndarray:
    """Values every target type holds after the ONNX rule (float -> integer out of range
    is undefined in ONNX and not pinned: the floats stay inside int8 / uint8 ranges)."""
    if dtype is np.bool_:
        return rng.integers(0, 2, (3, 67)).astype(bool)
    if np.dtype(dtype).kind == "f":
        x = (rng.standard_normal((3, 67)) * 50).astype(dtype)
        x.reshape(-1)[:6] = [0.5, -0.5, 1.5, -127.9, 0.0, -0.0]
        return np.clip(x, 0 if False else -128, 127)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -(2**40)), min(info.max, 2**40), (3, 67)).astype(dtype)


@pytest.mark.parametrize("src", list(CAST_TYPES.values()))
@pytest.mark.parametrize("to", list(CAST_TYPES))
def test_cast_between_native_types(src, to):
    # truncation toward zero (-127.9 -> -127), the low bits of a narrowing integer cast,
    # x != 0 to bool; floats to uint8 only from non-negative values (the rest undefined)
    x = cast_source(src, np.random.default_rng(17))
    if np.dtype(src).kind == "f" and CAST_TYPES[to] is np.uint8:
        x = np.abs(x)
    run_both("Cast", [x], {"to": to})


@pytest.mark.parametrize("to", [TensorProto.FLOAT, TensorProto.INT32, TensorProto.UINT8, TensorProto.INT64])
def test_cast_from_bool_reads_any_nonzero_byte_as_one(to):
    # a bool array made from bytes (np.frombuffer) may hold 2 or 255: NumPy's astype gives
    # 1 for any non-zero byte, and so does the vectorized byte compare
    x = np.frombuffer(bytes([0, 1, 2, 255] * 33), dtype=bool).reshape(4, 33)
    y = run_both("Cast", [x], {"to": to})
    assert y.reshape(-1)[:4].tolist() == [0, 1, 1, 1]


def test_cast_nan_to_bool_is_true():
    x = np.array([np.nan, 0.0, -0.0, 1e-45], F32)
    assert run_both("Cast", [x], {"to": TensorProto.BOOL}).tolist() == [True, False, False, True]


def test_cast_between_float32_and_float16_is_numpys_conversion():
    # float32 -> float16 rounds to nearest even: 1 + 2^-11 is a tie (-> 1), 65520 rounds
    # up to inf, 2^-25 ties to 0 and 3·2^-26 rounds to the smallest subnormal; NaN, ±inf,
    # ±0 and subnormals pass; float16 -> float32 is exact
    x = floats(np.random.default_rng(23), (3, 67), scale=2.0**-14)
    x.reshape(-1)[:8] = [1 + 2.0**-11, 65519.0, 65520.0, -1e9, 2.0**-25, 3 * 2.0**-26, 2.0**-24, -0.0]
    y = run_both("Cast", [x], {"to": TensorProto.FLOAT16})
    assert y.dtype == np.float16 and y.reshape(-1)[:8].tolist()[:4] == [1.0, 65504.0, np.inf, -np.inf]
    assert y.reshape(-1)[4] == 0 and y.reshape(-1)[5] == y.reshape(-1)[6] == np.float16(2.0**-24)
    run_both("Cast", [y], {"to": TensorProto.FLOAT})


@pytest.mark.parametrize("dtype", [np.int16, np.uint16])
@pytest.mark.parametrize("shape", [(17,), (3, 67), (1, 1, 48001)])
def test_cast_of_16bit_integers_to_float32_is_exact(dtype, shape):
    # int16 audio read by a Cast (MarbleNet's input): every code, the extremes included,
    # is its exact float32 value, as astype gives it
    info = np.iinfo(dtype)
    x = np.random.default_rng(29).integers(info.min, info.max + 1, shape).astype(dtype)
    x.reshape(-1)[:3] = [info.min, info.max, 0]
    y = run_both("Cast", [x], {"to": TensorProto.FLOAT})
    assert y.reshape(-1)[:2].tolist() == [info.min, info.max]


def test_cast_of_a_16bit_scalar_hands_it_to_the_twin():
    # the binding writes a [1] array for a rank-0 input: the kernel hands a scalar to the
    # twin instead, which keeps its rank
    kernel, _ = bind("Cast", [np.zeros((), np.int16)], {"to": TensorProto.FLOAT})
    got = kernel.fn(KernelContext(opset=21), np.array(-7, np.int16), to=TensorProto.FLOAT, **kernel.params)
    assert got.shape == () and got.dtype == F32 and float(got) == -7.0


def test_session_runs_an_int16_audio_cast_natively():
    """Failure signature: MarbleNet's ``Cast(audio: int16)`` ran its NumPy twin in every
    run (``quanta bench`` listed one reference step: "native Cast takes float32/64,
    (u)int8, int32/64 or bool, got int16")."""
    from quanta.cli.bench import reference_steps

    g = helper.make_graph(
        [
            helper.make_node("Cast", ["audio"], ["f"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["f", "k"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("audio", TensorProto.INT16, [1, 1, "n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [helper.make_tensor("k", TensorProto.FLOAT, [], [1 / 32768])],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    sess = quanta.InferenceSession(proto.SerializeToString())
    x = np.random.default_rng(3).integers(-32768, 32768, (1, 1, 4001)).astype(np.int16)
    for _ in range(2):  # the second run takes the specialized call
        np.testing.assert_array_equal(sess.run(None, {"audio": x})[0], x.astype(F32) * F32(1 / 32768))
    assert reference_steps(sess.plan) == []


def test_cast_to_float16_from_another_type_falls_back_with_reason():
    # float64 -> float16 must round once (float64 -> float32 -> float16 may round twice)
    kernel, reason = bind("Cast", [np.zeros(2, np.float64)], {"to": TensorProto.FLOAT16})
    assert kernel is None and "float16 from float32 only" in reason


# --------------------------------------------------------------------------------------
# integer arithmetic, comparisons, logic, Where, BatchNormalization
# --------------------------------------------------------------------------------------

BROADCASTS = [
    ((3, 65), (3, 65)),
    ((1, 34, 9, 9), (1, 34, 1, 1)),
    ((), (2, 7)),
    ((2, 7), ()),
    ((3, 1), (1, 17)),
]


@pytest.mark.parametrize("op_type", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCASTS)
def test_integer_binary_wraps_and_broadcasts(op_type, dtype, a_shape, b_shape):
    # the int32 bias Add of LowerConvFloatOutput ([1, M, H, W] + [1, M, 1, 1]); values near
    # the type's limits so that the sums and products wrap
    rng = np.random.default_rng(19)
    info = np.iinfo(dtype)
    a = np.array(rng.integers(info.min, info.max, a_shape, endpoint=True), dtype)
    b = np.array(rng.integers(info.min, info.max, b_shape, endpoint=True), dtype)
    run_both(op_type, [a, b])


@pytest.mark.parametrize("op_type", ["Div", "Max", "Min"])
@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_integer_div_truncates_and_its_edges_follow_the_twin(op_type, dtype):
    """Signs of every combination, remainders and none, x / 0 = 0 and MIN / −1 = MIN (the
    twin's int_div_trunc; C's division traps on both), shape arithmetic's scalars."""
    info = np.iinfo(dtype)
    a = np.array([-7, 7, -7, 7, 6, -6, 0, 5, -5, info.min, info.min, info.max, info.min, 3], dtype)
    b = np.array([2, -2, -2, 2, 3, 3, 7, 0, 0, -1, 1, -1, info.min, info.max], dtype)
    with np.errstate(all="ignore"):
        run_both(op_type, [a, b])
        run_both(op_type, [a, np.array(2, dtype)])  # a dimension halved
        run_both(op_type, [np.array(577, dtype), np.array(-3, dtype)])


@pytest.mark.parametrize("op_type", ["Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32, np.uint8])
@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCASTS)
def test_comparisons_match_twin(op_type, dtype, a_shape, b_shape):
    rng = np.random.default_rng(23)
    if dtype is np.float32:
        a, b = floats(rng, a_shape, 1), floats(rng, b_shape, 1)
        a, b = np.asarray(np.round(a), F32), np.asarray(np.round(b), F32)  # ties, ±0 and NaN
    else:
        a = np.array(rng.integers(0, 4, a_shape), dtype)
        b = np.array(rng.integers(0, 4, b_shape), dtype)
    run_both(op_type, [a, b])


def test_a_comparison_with_a_rank_0_constant_keeps_its_specialized_call():
    """silero_vad's ``Equal(sr, 16000)``: a rank-0 constant stays rank 0 in the
    specialization (np.ascontiguousarray made it (1,), so the broadcast refused the rank-0
    output on every run and the step ran through its guard)."""
    from onnx import numpy_helper

    from quanta.runtime import execute

    g = helper.make_graph(
        [helper.make_node("Equal", ["sr", "k"], ["is16k"], name="is16k")],
        "g",
        [helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("is16k", TensorProto.BOOL, [])],
        [numpy_helper.from_array(np.array(16000, np.int64), "k")],
    )
    sess = quanta.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    guarded = []
    original = execute.Executor._guarded_step
    execute.Executor._guarded_step = lambda self, *a: guarded.append(a[2]) or original(self, *a)
    try:
        for sr in (16000, 8000, 16000):
            y = sess.run(None, {"sr": np.array(sr, np.int64)})[0]
            assert y.shape == () and bool(y) == (sr == 16000)
    finally:
        execute.Executor._guarded_step = original
    assert not guarded


@pytest.mark.parametrize("op_type", ["And", "Or", "Xor"])
@pytest.mark.parametrize(("a_shape", "b_shape"), BROADCASTS)
def test_logic_matches_twin(op_type, a_shape, b_shape):
    rng = np.random.default_rng(29)
    run_both(op_type, [np.array(rng.random(a_shape) < 0.5), np.array(rng.random(b_shape) < 0.5)])


def test_not_and_where():
    rng = np.random.default_rng(31)
    cond = rng.random((3, 1, 17)) < 0.5
    run_both("Not", [cond])
    run_both("Where", [cond, floats(rng, (7, 1)), floats(rng, (3, 7, 17))])
    run_both("Where", [cond, np.array(5, np.int64), np.arange(17, dtype=np.int64)])


@pytest.mark.parametrize("shape", [(1, 3), (2, 7, 5, 3), (1, 17, 33), (1, 3, 4, 5, 2)])
def test_batch_normalization_inference_matches_twin(shape):
    rng = np.random.default_rng(37)
    c = shape[1]
    x = floats(rng, shape)
    scale, bias, mean = (np.array(rng.standard_normal(c), F32) for _ in range(3))
    var = np.array(rng.random(c) + 0.1, F32)
    run_both("BatchNormalization", [x, scale, bias, mean, var], {"epsilon": 1e-3})


# --------------------------------------------------------------------------------------
# reductions
# --------------------------------------------------------------------------------------

REDUCE = [
    "ReduceSum",
    "ReduceMean",
    "ReduceSumSquare",
    "ReduceL1",
    "ReduceL2",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceLogSum",
    "ReduceLogSumExp",
]
INT_REDUCE = ["ReduceSum", "ReduceSumSquare", "ReduceL1", "ReduceProd", "ReduceMax", "ReduceMin"]


def _native_session_equals_reference(model: ModelProto, op_type: str, shape: tuple, threads: int) -> None:
    """The native session of ``model`` (input "x" of ``shape``) gives the reference
    target's bytes on two feeds (the first run binds, the second takes the specialized
    call), and ``op_type`` gained no runtime fallback."""
    options = quanta.SessionOptions()
    options.intra_op_num_threads = threads
    native = quanta.InferenceSession(model, sess_options=options)
    reference = quanta.InferenceSession(model, backend="reference")
    before = RUNTIME_FALLBACKS[op_type]
    for seed in (1, 2):
        x = np.array(np.random.default_rng(seed).standard_normal(shape) * 3 + 1, F32)
        want = reference.run(None, {"x": x})[0]
        assert_bit_exact(want, native.run(None, {"x": x})[0], f"{op_type} {shape} {threads}t")
    assert RUNTIME_FALLBACKS[op_type] == before


@pytest.mark.parametrize("op_type", REDUCE)
@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ((3, 301), [1]),
        ((2, 17, 9, 7), [2, 3]),
        ((2, 17, 9, 7), [1]),
        ((5, 7, 3), [0, 2]),
        ((4, 33), None),
        ((65,), [0]),
    ],
)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_match_twin(op_type, shape, axes, keepdims):
    # rows longer than 258 (3 x 301), the global average of NCHW ([2, 3]: the rows are the
    # input itself), the channel axis (a transposed copy), axes that are not adjacent
    x = floats(np.random.default_rng(41), shape, 1)
    x[np.isinf(x)] = 2.0  # keep the sums finite so that the order shows in the bits
    x[np.isnan(x)] = 0.25
    attrs = {"keepdims": keepdims}
    inputs = [x] if axes is None else [x, np.array(axes, np.int64)]
    run_both(op_type, inputs, attrs, opset=18)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("shape", [(1, 3, 7, 9), (2, 17, 301), (1, 5, 2, 3, 4)])
def test_global_pools_are_the_reductions_over_space(op_type, shape):
    # float32 GlobalAveragePool = ReduceMean over the spatial axes by (R1)-(R3) (the twin
    # changed from NumPy's pairwise mean), GlobalMaxPool = ReduceMax by (M1)-(M3)
    x = np.array(np.random.default_rng(73).standard_normal(shape), F32)
    got = run_both(op_type, [x])
    red = "ReduceMean" if op_type == "GlobalAveragePool" else "ReduceMax"
    axes = np.arange(2, len(shape), dtype=np.int64)
    assert_bit_exact(get_op(red)(KernelContext(opset=18), x, axes, keepdims=1), got)


@pytest.mark.parametrize("op_type", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("threads", [1, 2])
def test_global_pools_specialized_in_a_session_keep_the_bytes(op_type, threads):
    """A session binds the global pools once per shape (rows, divisor and output found
    then, the rows reduced into the planned output): the reference target's bytes, for
    a squeeze-excitation block's 7x7, rows longer than 258 and a 3-D input, the pooled
    value read by a next node (so the output is an arena buffer, not a graph output)."""
    from onnx import TensorProto, helper

    for shape in [(1, 17, 7, 7), (2, 3, 19, 17), (1, 7, 301)]:
        graph = helper.make_graph(
            [helper.make_node(op_type, ["x"], ["p"]), helper.make_node("Neg", ["p"], ["y"])],
            "pool",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        _native_session_equals_reference(model, op_type, shape, threads)


@pytest.mark.parametrize("op_type", REDUCE)
@pytest.mark.parametrize(
    ("shape", "axes"),
    [
        ((300, 1, 16), [0]),  # the beats TCN's time mean
        ((2, 301, 17), [1]),  # reduced length > 258, 17 columns
        ((3, 7, 3), [-2]),  # a negative axis, 3 columns
        ((2, 5, 3, 7), [1, 2]),  # two adjacent axes, 7 columns
        ((2, 33, 300), [1]),  # columns past one 256-column tile
        ((1, 20, 513), [-2]),  # one slab, tiles split between two threads
        ((17, 2, 3, 5), [0, 1, 2]),  # every axis but the last
        ((4, 301, 1), [1]),  # a mask [N, T, 1] summed over T: rows once the 1 is gone
        ((3, 1, 17, 1, 5), [1, 2, 3]),  # size-1 axes among the reduced ones
        ((2, 7, 1, 3), [1]),  # a size-1 axis between the reduced axis and the columns
    ],
)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reductions_over_middle_axes_match_twin(op_type, shape, axes, keepdims):
    """Adjacent reduced axes that are not the last (x as [outer, D, inner]): the columns
    reduced in place by reduce_middle_f32, each in the twin's lane order — the bytes of
    the twin's transposed rows."""
    x = floats(np.random.default_rng(43), shape, 1)
    if op_type not in ("ReduceMax", "ReduceMin"):
        x[np.isinf(x)] = 2.0  # keep the sums finite so that the order shows in the bits
        x[np.isnan(x)] = 0.25
    run_both(op_type, [x, np.array(axes, np.int64)], {"keepdims": keepdims}, opset=18)


@pytest.mark.parametrize("op", ["sum", "sum_square", "max", "min", "prod"])
@pytest.mark.parametrize(
    "shape", [(1, 300, 3), (2, 17, 7), (3, 259, 17), (1, 40, 600), (2, 1, 5), (4, 16, 16)]
)
def test_reduce_middle_kernel_is_the_rows_kernel_of_the_transpose(op, shape):
    """reduce_middle_f32(x) = reduce_rows_f32 of x's columns as rows, byte for byte, on
    every ISA and thread count, with NaN, ±inf, ±0 and subnormals in the columns (max /
    min keep a NaN; a NaN anywhere in a sum's column gives NaN in both)."""
    x = floats(np.random.default_rng(len(shape) * 3 + shape[1]), shape, 0.9 if op == "prod" else 3.0)
    outer, d, inner = shape
    rows = np.ascontiguousarray(x.transpose(0, 2, 1)).reshape(outer * inner, d)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            want = _native.reduce_rows_f32(op, rows).reshape(outer, inner)
            for threads in (1, 2):
                assert_bit_exact(want, _native.reduce_middle_f32(op, x, threads), f"{op} {isa} {threads}t")
                out = np.empty((outer, inner), F32)
                assert _native.reduce_middle_f32(op, x, threads, out) is out
                assert_bit_exact(want, out, f"{op} {isa} {threads}t out=")
    finally:
        _native.clear_isa()
    with pytest.raises(ValueError, match="reduce_middle_f32: x: expected \\[outer, d, inner\\]"):
        _native.reduce_middle_f32(op, rows)


def test_row_max_with_nan_and_inf_rows_every_isa():
    """Max / min rows go through whole vectors and redo a row holding a NaN or an
    infinity with the scalar loop: rows of GlobalMaxPool length 508 with a NaN at the
    start, in the vector part, in the tail, ±inf, a row of −inf and one of −0 / +0."""
    x = np.array(np.random.default_rng(9).standard_normal((9, 508)), F32)
    x[0, 0] = np.nan
    x[1, 250] = np.nan
    x[2, 507] = np.nan
    x[3, 17] = np.inf
    x[4, 3] = -np.inf
    x[5] = -np.inf
    x[6] = -0.0
    x[7, ::2] = 0.0
    x[7, 1::2] = -0.0
    for op_type in ("ReduceMax", "ReduceMin", "GlobalMaxPool"):
        if op_type == "GlobalMaxPool":
            got = run_both(op_type, [x.reshape(1, 9, 508)])
            assert np.isnan(got.reshape(-1)[:3]).all()
        else:
            run_both(op_type, [x, np.array([1], np.int64)], {"keepdims": 0}, opset=18)


@pytest.mark.parametrize("threads", [1, 2])
def test_middle_reductions_specialized_in_a_session_keep_the_bytes(threads):
    """A session binds a reduction over a middle axis once per shape (reduce_middle_f32
    straight into the planned output): the reference target's bytes for all-MiniLM's mean
    pooling ([1, 128, 384] over axis 1), magika's LayerNorm sum ([2, 512, 256] over axis
    1, keepdims 0) and a max over [T, 1, 16]'s axis 0, each read by a next node."""
    cases = [
        ("ReduceMean", (1, 128, 384), [1], 1),
        ("ReduceSum", (2, 512, 256), [1], 0),
        ("ReduceMax", (301, 1, 16), [0], 0),
        ("ReduceL2", (3, 17, 7), [-2], 1),
        ("ReduceSum", (4, 301, 1), [1], 0),  # a mask's count: rows, no transposed copy
    ]
    for op_type, shape, axes, keepdims in cases:
        graph = helper.make_graph(
            [
                helper.make_node(op_type, ["x", "axes"], ["r"], keepdims=keepdims),
                helper.make_node("Neg", ["r"], ["y"]),
            ],
            "reduce",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
            [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
            [helper.make_tensor("axes", TensorProto.INT64, [len(axes)], axes)],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
        _native_session_equals_reference(model, op_type, shape, threads)


@st.composite
def reduce_cases(draw):
    """A shape of rank 1-4 (sizes 1, 2, 3, 7, 17), a non-empty set of axes written with
    negative and positive indices, keepdims 0 / 1."""
    shape = tuple(draw(st.lists(st.sampled_from([1, 2, 3, 7, 17]), min_size=1, max_size=4)))
    rank = len(shape)
    axes = draw(st.lists(st.integers(0, rank - 1), min_size=1, max_size=rank, unique=True))
    written = [a - rank if draw(st.booleans()) else a for a in axes]
    return shape, written, draw(st.sampled_from([0, 1]))


@given(case=reduce_cases(), op_type=st.sampled_from(["ReduceLogSumExp", "ReduceProd", "ReduceLogSum"]))
def test_new_float_reductions_match_twin_any_axes(case, op_type):
    shape, axes, keepdims = case
    rng = np.random.default_rng(len(shape) * 7 + len(axes))
    x = np.array(
        rng.standard_normal(shape) * (0.05 if op_type == "ReduceProd" else 4.0)
        + (1 if op_type != "ReduceLogSumExp" else 0),
        F32,
    )
    run_both(op_type, [x, np.array(axes, np.int64)], {"keepdims": keepdims}, opset=18)


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("op_type", INT_REDUCE)
@given(case=reduce_cases())
def test_integer_reductions_match_twin_and_wrap(dtype, op_type, case):
    """int32 / int64 rows as NumPy reduces them in the type: sums and products wrap (the
    values include the type's extremes, so they do), |MIN| = MIN."""
    shape, axes, keepdims = case
    info = np.iinfo(dtype)
    rng = np.random.default_rng(len(shape) * 5 + len(axes))
    x = rng.integers(-50, 50, shape).astype(dtype)
    flat = x.reshape(-1)
    k = rng.integers(0, flat.size, size=max(1, flat.size // 4))
    flat[k] = rng.choice(np.array([info.min, info.max, info.max // 3, -7, 0], dtype), size=k.size)
    with np.errstate(over="ignore"):
        run_both(op_type, [x, np.array(axes, np.int64)], {"keepdims": keepdims}, opset=18)


def test_integer_reduce_sum_of_a_mask_as_tesseranet_counts():
    """TesseraNet's Cast(Greater(...), int64) -> ReduceSum(axes=[-1], keepdims=1)."""
    x = (np.random.default_rng(5).standard_normal((2, 17, 16)) > 0).astype(np.int64)
    got = run_both("ReduceSum", [x, np.array([-1], np.int64)], {"keepdims": 1}, opset=18)
    assert got.tolist() == x.sum(axis=-1, keepdims=True).tolist()


def test_reduce_log_sum_exp_specials_rows():
    """(LSE2): a row of −inf gives −inf (shift 0), a row with +inf +inf, a row with NaN
    NaN, huge values do not overflow (the shift), a single element is itself."""
    x = np.array(
        [
            [-np.inf] * 19,
            [1.0] * 18 + [np.inf],
            [1.0] * 18 + [np.nan],
            [3e38] * 19,
            [-3e38] * 18 + [7.0],
        ],
        F32,
    )
    got = run_both("ReduceLogSumExp", [x, np.array([-1], np.int64)], {"keepdims": 0}, opset=18)
    assert got[0] == -np.inf and got[1] == np.inf and np.isnan(got[2])
    assert np.isfinite(got[3]) and got[4] == F32(7.0)


@pytest.mark.parametrize(
    ("op_type", "dtype"),
    [(op, np.float32) for op in ("ReduceLogSumExp", "ReduceSum", "ReduceProd", "ReduceMax")]
    + [(op, np.int64) for op in ("ReduceSum", "ReduceProd", "ReduceMax")],
)
def test_empty_reductions_are_the_identities_from_the_twin(op_type, dtype):
    """A reduction over zero elements gives its identity (−inf for LogSumExp and Max,
    0 for Sum, 1 for Prod); the native kernel hands such a call to the twin."""
    kernel, reason = bind(op_type, [np.zeros((3, 0), dtype), np.array([1], np.int64)], {"keepdims": 0})
    assert kernel is not None, reason
    x = np.zeros((3, 0), dtype)
    got = kernel.fn(KernelContext(opset=18), x, np.array([1], np.int64), keepdims=0, **kernel.params)
    want = get_op(op_type)(KernelContext(opset=18), x, np.array([1], np.int64), keepdims=0)
    assert_bit_exact(want, got)
    ident = {"ReduceLogSumExp": -np.inf, "ReduceSum": 0, "ReduceProd": 1, "ReduceMax": None}[op_type]
    if ident is not None:
        assert (got == ident).all()


def test_reduce_log_sum_exp_twin_accuracy_against_float64():
    """(LSE1)-(LSE4) against float64 log Σ e^x of the same float32 rows, first order in u:
    |ŷ − y| <= u·(τ̄ + B + 8 + 2|l| + |y|), t = x − c, l = log Σ e^t, τ̄ = Σ_j p_j |t_j|,
    B = ⌈D/16⌉ (docs/float-ops.md "ReduceLogSumExp")."""
    from quanta.kernels.reference.reduce_ops import log_sum_exp_rows

    u = 2.0**-24
    rng = np.random.default_rng(11)
    for sigma in (1.0, 3.0, 8.0, 30.0):
        for d in (1, 16, 17, 128, 1000):
            x = np.array(rng.standard_normal((64, d)) * sigma + rng.standard_normal((64, 1)) * 50, F32)
            got = log_sum_exp_rows(x).astype(np.float64)
            x64 = x.astype(np.float64)
            c = x64.max(axis=1, keepdims=True)
            t = x64 - c
            e = np.exp(t)
            s = e.sum(axis=1)
            log_s = np.log(s)
            y = log_s + c[:, 0]
            tau = (e / s[:, None] * np.abs(t)).sum(axis=1)
            bound = u * (tau + -(-d // 16) + 8 + 2 * np.abs(log_s) + np.abs(y))
            assert (np.abs(got - y) <= bound).all(), (sigma, d, (np.abs(got - y) / bound).max())


def test_reduce_binders_name_the_types_they_take():
    for op_type, dtype, reason in [
        ("ReduceMean", np.int64, "native ReduceMean takes float32, got int64"),
        ("ReduceSum", np.float64, "native ReduceSum takes float32 or int32 or int64, got float64"),
        ("ReduceLogSumExp", np.int32, "native ReduceLogSumExp takes float32, got int32"),
    ]:
        kernel, why = bind(op_type, [np.zeros((2, 3), dtype)])
        assert kernel is None and why == reason


def test_reduce_max_nan_and_signed_zero_ties():
    x = np.array([[0.0, -0.0] * 20, [-0.0, 0.0] * 20, [1.0, np.nan] * 20], F32)
    for op_type in ("ReduceMax", "ReduceMin"):
        run_both(op_type, [x, np.array([1], np.int64)], {"keepdims": 0}, opset=18)


@pytest.mark.parametrize("d", [1, 2, 3, 5, 8, 9, 12, 13, 16, 17])
def test_reduce_max_min_of_short_rows_with_specials(d):
    """Rows of at most 12 elements (a max over a stack of 3 branches) take the lanes that
    hold elements only: the twin's bytes with NaNs of two payloads, ±inf, ±0 and
    subnormals in every position, many rows (both threads' chunks); 13 on is the plain path."""
    rng = np.random.default_rng(d)
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-40, -1e-40, 3.0, -3.0], F32)
    specials[1] = np.uint32(0x7FC00123).view(F32)  # a second NaN payload
    x = rng.choice(specials, size=(4099, d)).astype(F32)
    x[::3] = rng.standard_normal((len(x[::3]), d)).astype(F32)
    for op_type in ("ReduceMax", "ReduceMin"):
        run_both(op_type, [x, np.array([1], np.int64)], {"keepdims": 0}, opset=18)


def test_reduce_sum_is_the_lane_order_not_pairwise():
    # 1 + 2^-24 · k: the lane order (R1)-(R3) and np.sum's pairwise order give different
    # float32 sums; the twin follows (R1)-(R3), so the native kernel can match it
    from quanta.kernels.reference.float_ops import sum16

    x = np.array([[1.0] + [2.0**-24] * 300], F32)
    got = get_op("ReduceSum")(KernelContext(opset=18), x, np.array([1], np.int64), keepdims=0)
    assert got.tobytes() == sum16(x).tobytes()


# --------------------------------------------------------------------------------------
# Resize
# --------------------------------------------------------------------------------------

COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]
NEAREST = ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]


@given(
    coord=st.sampled_from(COORDS),
    nearest=st.sampled_from(NEAREST),
    dtype=st.sampled_from([np.float32, np.uint8, np.int8, np.int32]),
    scales=st.sampled_from([(2.0, 2.0), (0.5, 1.5), (1.0, 3.0), (0.7, 0.3)]),
)
def test_resize_nearest_every_mode(coord, nearest, dtype, scales):
    rng = np.random.default_rng(43)
    x = (
        np.array(rng.integers(-100, 100, (1, 3, 7, 9)), dtype)
        if dtype is not np.float32
        else floats(rng, (1, 3, 7, 9))
    )
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
    run_both("Resize", [x, None, np.array((1.0, 1.0, *scales), F32)], attrs, opset=19)


@given(
    coord=st.sampled_from(COORDS),
    mode=st.sampled_from(["linear", "cubic"]),
    dtype=st.sampled_from([np.float32, np.uint8]),
    sizes=st.sampled_from([(14, 18), (5, 9), (7, 4), (17, 3)]),
    antialias=st.sampled_from([0, 1]),
)
def test_resize_linear_and_cubic(coord, mode, dtype, sizes, antialias):
    rng = np.random.default_rng(47)
    x = (
        np.array(rng.integers(0, 256, (2, 3, 7, 9)), dtype)
        if dtype is np.uint8
        else floats(rng, (2, 3, 7, 9), 1)
    )
    if dtype is np.float32:
        x[~np.isfinite(x)] = -0.0
    attrs = {"mode": mode, "coordinate_transformation_mode": coord, "antialias": antialias}
    run_both("Resize", [x, None, None, np.array((2, 3, *sizes), np.int64)], attrs, opset=19)


@pytest.mark.parametrize("rows_first", [True, False])
@pytest.mark.parametrize("shape", [(3, 7, 9), (2, 7, 5, 11), (17, 1, 4)])
def test_resize_2d_is_the_two_axis_steps_in_float64(rows_first, shape):
    """resize_2d_f32 (tensor_ops.h): the bytes of cast -> resize_axis_f64 (the first axis)
    -> resize_axis_f64 (the other) -> cast, plane by plane; 2- and 4-tap tables with
    weights that do not sum to 1, both step orders, 3 / 14 / 17 planes, 1 and 2 threads,
    out=; taps out of range are refused by name."""
    rng = np.random.default_rng(len(shape) * 7 + rows_first)
    x = rng.normal(0, 30, shape).astype(F32)
    h, w = shape[-2:]

    def table(n: int, o: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.integers(0, n, (o, t)).astype(np.int64), rng.uniform(-0.6, 1.3, (o, t))

    oh, ow = 2 * h + 1, 3 * w - 1
    (ta, wa), (tb, wb) = (
        (table(h, oh, 2), table(w, ow, 4)) if rows_first else (table(w, ow, 4), table(h, oh, 2))
    )
    lead = int(np.prod(shape[:-2]))
    d = _native.cast(x, np.dtype(np.float64)).reshape(lead, h, w)
    if rows_first:
        d = _native.resize_axis_f64(d, ta, wa)
        d = _native.resize_axis_f64(d.reshape(lead * oh, w, 1), tb, wb).reshape(lead, oh, ow)
    else:
        d = _native.resize_axis_f64(d.reshape(lead * h, w, 1), ta, wa).reshape(lead, h, ow)
        d = _native.resize_axis_f64(d, tb, wb)
    expected = d.astype(F32).reshape(*shape[:-2], oh, ow)
    for threads in (1, 2):
        got = _native.resize_2d_f32(x, rows_first, ta, wa, tb, wb, threads)
        assert_bit_exact(expected, got, f"resize_2d {shape} rows_first={rows_first} {threads}t")
        out = np.empty(expected.shape, F32)
        assert _native.resize_2d_f32(x, rows_first, ta, wa, tb, wb, threads, out) is out
        assert_bit_exact(expected, out, f"resize_2d {shape} out=")
    bad = ta.copy()
    bad[0, 0] = 10**6
    with pytest.raises(ValueError, match="resize_2d_f32: taps_a: expected indices in"):
        _native.resize_2d_f32(x, rows_first, bad, wa, tb, wb)


@pytest.mark.parametrize("rows_first", [True, False])
@pytest.mark.parametrize("shape", [(2, 3, 7, 9, 16), (1, 5, 4, 3), (17, 1, 6, 3)])
def test_resize_2d_lanes_are_planes(rows_first, shape):
    """resize_2d_f32 with lanes (an NCHW16c tensor [..., H, W, 16]): each lane of the last
    axis gives the bytes of the same steps on it as a plane of its own (the lanes moved in
    front of H, W, resized with lanes=1, moved back); 16, 3 and 3 lanes, both step orders,
    1 and 2 threads, out=; a last axis other than lanes is refused by name."""
    rng = np.random.default_rng(sum(shape) + 5 * rows_first)
    x = rng.normal(0, 30, shape).astype(F32)
    h, w, lanes = shape[-3:]

    def table(n: int, o: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        return rng.integers(0, n, (o, t)).astype(np.int64), rng.uniform(-0.6, 1.3, (o, t))

    oh, ow = 2 * h + 1, 2 * w - 1
    (ta, wa), (tb, wb) = (
        (table(h, oh, 2), table(w, ow, 4)) if rows_first else (table(w, ow, 4), table(h, oh, 2))
    )
    planes = np.ascontiguousarray(np.moveaxis(x, -1, -3))
    expected = np.moveaxis(_native.resize_2d_f32(planes, rows_first, ta, wa, tb, wb), -3, -1)
    assert expected.shape == (*shape[:-3], oh, ow, lanes)
    for threads in (1, 2):
        got = _native.resize_2d_f32(x, rows_first, ta, wa, tb, wb, threads, None, lanes)
        assert_bit_exact(expected, got, f"resize_2d lanes {shape} rows_first={rows_first} {threads}t")
        out = np.empty(expected.shape, F32)
        assert _native.resize_2d_f32(x, rows_first, ta, wa, tb, wb, threads, out, lanes) is out
        assert_bit_exact(expected, out, f"resize_2d lanes {shape} out=")
    with pytest.raises(ValueError, match="resize_2d_f32: x: expected rank >= 3 with a last axis of 8"):
        _native.resize_2d_f32(x, rows_first, ta, wa, tb, wb, 1, None, 8)


@given(
    coord=st.sampled_from(COORDS),
    sizes=st.sampled_from([(14, 18), (5, 9), (13, 4)]),
)
def test_resize_linear_of_a_blocked_tensor(coord, sizes):
    """The blocked lowering's linear Resize ([N, Cb, H, W, 16] along H and W, the lanes
    axis kept) against the twin, bit for bit."""
    rng = np.random.default_rng(53)
    x = floats(rng, (1, 3, 7, 9, 16), 1)
    x[~np.isfinite(x)] = -0.0
    attrs = {"mode": "linear", "coordinate_transformation_mode": coord}
    run_both("Resize", [x, None, None, np.array((1, 3, *sizes, 16), np.int64)], attrs, opset=19)


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.int64])
@pytest.mark.parametrize("factors", [(2, 2), (1, 3), (3, 1), (4, 2), (1, 1)])
def test_repeat_2d_is_np_repeat_on_both_axes(dtype, factors):
    """repeat_2d (tensor_ops.h): each element sw times along its row, each row sh times;
    1-, 2-, 4- and 8-byte elements (the widening loop is typed per size), rows of 1, odd
    and 17 elements, planes 3 / 7 / 17, 1 and 2 threads, out=."""
    sh, sw = factors
    rng = np.random.default_rng(sh * 10 + sw)
    for shape in [(1, 3, 1, 1), (2, 7, 5, 9), (1, 17, 10, 17), (13, 4)]:
        x = rng.integers(0, 250, shape).astype(dtype)
        expected = np.repeat(np.repeat(x, sh, axis=-2), sw, axis=-1)
        for threads in (1, 2):
            assert_bit_exact(expected, _native.repeat_2d(x, sh, sw, threads), f"repeat_2d {shape} {threads}t")
            out = np.empty(expected.shape, expected.dtype)
            assert _native.repeat_2d(x, sh, sw, threads, out) is out
            assert_bit_exact(expected, out, f"repeat_2d {shape} {threads}t out=")
    with pytest.raises(ValueError, match="repeat_2d: x: expected rank >= 2"):
        _native.repeat_2d(np.zeros(3, F32), 2, 2)
    # lanes: the last axis moves with each element (an NCHW16c pixel: 16 floats)
    for lanes_shape, dtype_l in (
        ((2, 3, 5, 16), np.float32),
        ((3, 4, 2, 4), np.float64),
        ((2, 3, 4), np.uint8),
    ):
        x = rng.integers(0, 250, lanes_shape).astype(dtype_l)
        expected = np.repeat(np.repeat(x, sh, axis=-3), sw, axis=-2)
        for threads in (1, 2):
            assert_bit_exact(
                expected, _native.repeat_2d(x, sh, sw, threads, None, True), f"lanes {lanes_shape}"
            )
    with pytest.raises(ValueError, match="elements of 1, 2, 4, 8, 16, 32 or 64 bytes"):
        _native.repeat_2d(np.zeros((2, 3, 5), F32), 2, 2, 1, None, True)
    with pytest.raises(ValueError, match="repeat_2d: expected factors >= 1, got 0, 2"):
        _native.repeat_2d(np.zeros((3, 3), F32), 0, 2)


@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize(
    "scales, sizes",
    [
        ((1.0, 1.0, 2.0, 2.0), None),
        ((1.0, 1.0, 1.0, 3.0), None),
        (None, (1, 17, 20, 33)),
        ((1.0, 2.0, 2.0, 2.0), None),
    ],
)
def test_resize_integer_upsample_session_is_the_twin(coord, scales, sizes):
    """A nearest Resize with constant scales / sizes is specialized per shape; where the
    twin's source indices are q // s on the last two axes (2x, 1 x 3, 2 x 3 by sizes) the
    step is one repeat_2d, elsewhere (align_corners, a resized channel axis) the gathers:
    the twin's bytes either way, every nearest mode, sessions on the reference and native
    targets (1 and 2 threads)."""
    f = TensorProto.FLOAT
    x = floats(np.random.default_rng(71), (1, 17, 10, 11))
    for nearest in NEAREST:
        attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
        if scales is not None:
            inputs = ["x", "", "scales"]
            init = [helper.make_tensor("scales", f, [4], list(scales))]
        else:
            inputs = ["x", "", "", "sizes"]
            init = [helper.make_tensor("sizes", TensorProto.INT64, [4], list(sizes))]
        g = helper.make_graph(
            [helper.make_node("Resize", inputs, ["y"], **attrs)],
            "resize",
            [helper.make_tensor_value_info("x", f, list(x.shape))],
            [helper.make_tensor_value_info("y", f, None)],
            init,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
        ref = quanta.InferenceSession(m, backend="reference").run(None, {"x": x})[0]
        for threads in (1, 2):
            options = quanta.SessionOptions()
            options.intra_op_num_threads = threads
            sess = quanta.InferenceSession(m, options, backend="native")
            assert sess.fallbacks == []
            assert_bit_exact(ref, sess.run(None, {"x": x})[0], f"{coord} {nearest} {threads}t")


def test_resize_repeat_factors_only_for_q_div_s_indices():
    """The repeat path is taken only where the twin's indices are q // s on the last two
    axes (read from the indices, not from the mode): a 2x half_pixel upsample is,
    align_corners' 2x with floor, asymmetric 3x rounding to the nearest and a resized
    channel axis are not."""
    from quanta.targets.native.resize import _repeat_factors, _tables

    def factors(shape, scales, coord, nearest="round_prefer_floor"):
        attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": nearest}
        plan = _tables(KernelContext(opset=19), shape, None, np.array(scales, F32), None, attrs)
        return _repeat_factors(plan[1], shape)

    assert factors((1, 3, 10, 10), (1, 1, 2, 2), "half_pixel") == (2, 2, False)
    assert factors((1, 3, 10, 10), (1, 1, 1, 3), "asymmetric", "floor") == (1, 3, False)
    # an NCHW16c tensor: H and W before the 16 lanes (64 bytes of float32), which move together
    assert factors((1, 2, 10, 9, 16), (1, 1, 2, 3, 1), "half_pixel") == (2, 3, True)
    assert factors((1, 2, 10, 9, 16), (1, 1, 1, 1, 2), "half_pixel") == (1, 2, False)
    assert factors((1, 2, 10, 9, 5), (1, 1, 2, 2, 1), "half_pixel") is None  # 20-byte elements
    assert factors((1, 3, 10, 10), (1, 1, 1, 3), "asymmetric") is None  # q = 2 rounds to 1
    assert factors((1, 3, 10, 10), (1, 1, 2, 2), "align_corners", "floor") is None  # q = 2 floors to 0
    assert factors((1, 3, 10, 10), (1, 2, 2, 2), "half_pixel") is None
    assert factors((1, 3, 10, 10), (1, 1, 0.5, 2), "half_pixel") is None


@pytest.mark.parametrize(
    "scales", [(1.0, 1.0, 2.0, 2.0, 1.0), (1.0, 1.0, 3.0, 1.0, 1.0), (1.0, 1.0, 1.0, 2.0, 1.0)]
)
def test_resize_of_a_blocked_tensor_repeats_whole_pixels(scales):
    """A nearest Resize of H and W of an NCHW16c tensor [N, Cb, H, W, 16] (the blocked
    float layout's upsample) runs as one repeat_2d whose elements are a pixel's 16 floats:
    the twin's bytes, 1 and 2 threads."""
    f = TensorProto.FLOAT
    x = floats(np.random.default_rng(72), (1, 3, 7, 5, 16))
    g = helper.make_graph(
        [helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="nearest")],
        "resize",
        [helper.make_tensor_value_info("x", f, list(x.shape))],
        [helper.make_tensor_value_info("y", f, None)],
        [helper.make_tensor("scales", f, [5], list(scales))],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 19)])
    ref = quanta.InferenceSession(m, backend="reference").run(None, {"x": x})[0]
    for threads in (1, 2):
        options = quanta.SessionOptions()
        options.intra_op_num_threads = threads
        sess = quanta.InferenceSession(m, options, backend="native")
        assert sess.fallbacks == []
        assert_bit_exact(ref, sess.run(None, {"x": x})[0], f"{scales} {threads}t")


def test_resize_tf_crop_and_resize_falls_back_with_reason():
    kernel, reason = bind(
        "Resize", [np.zeros((1, 1, 2, 2), F32)], {"coordinate_transformation_mode": "tf_crop_and_resize"}
    )
    assert kernel is None and "extrapolate" in reason


# --------------------------------------------------------------------------------------
# data movement
# --------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.float16])
def test_gather_slice_expand_concat_tile(dtype):
    rng = np.random.default_rng(53)
    x = np.array(rng.integers(-50, 50, (3, 7, 17)), dtype)
    run_both("Gather", [x, np.array([[2, -1], [0, 6]], np.int64)], {"axis": 1})
    run_both("Gather", [x, np.array(-2, np.int64)], {"axis": 2})
    run_both("Gather", [x, np.array([0, 2, 2, 1], np.int32)], {"axis": 0})
    starts, ends = np.array([1, 15], np.int64), np.array([3, 2], np.int64)
    run_both("Slice", [x, starts, ends, np.array([0, 2], np.int64), np.array([1, -3], np.int64)])
    run_both("Slice", [x, np.array([-5], np.int64), np.array([2**62], np.int64)])
    run_both("Expand", [x[:, :1], np.array([2, 3, 5, 17], np.int64)])
    run_both("Concat", [x, x[:, :2], x[:, 3:4]], {"axis": -2})
    run_both("Tile", [x, np.array([1, 2, 3], np.int64)])


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.float32])
@pytest.mark.parametrize(
    ("start", "limit", "delta"), [(0, 17, 1), (3, -20, -3), (-7, 125, 2), (5, 5, 1), (9, 2, 4)]
)
def test_range_matches_twin(dtype, start, limit, delta):
    """Integer ranges are computed directly (start + i · delta in the element type), float
    ones by the twin; empty ranges and one-element [1] operands too."""
    if dtype == np.uint8 and min(start, limit) < 0:
        start, limit, delta = abs(start), abs(limit), abs(delta)
    args = [np.array(start, dtype), np.array(limit, dtype), np.array(delta, dtype)]
    run_both("Range", args)
    run_both("Range", [args[0].reshape(1), *args[1:]])


def test_range_of_a_zero_delta_is_the_operators_error():
    kernel, _ = bind("Range", [np.array(0, np.int64), np.array(4, np.int64), np.array(0, np.int64)])
    with pytest.raises(Exception, match="Range"):
        kernel.fn(KernelContext(), np.array(0, np.int64), np.array(4, np.int64), np.array(0, np.int64))


@given(
    shape=st.lists(st.integers(0, 6), min_size=1, max_size=4),
    data=st.data(),
)
def test_slice_and_expand_with_run_time_operands_match_the_twin(shape, data):
    """Slice bounds and Expand shapes that change from call to call (a decoder Loop's
    step, a duration net's frames) take the direct paths (_plain_slice_index,
    _expanded_shape): the twin's bytes, or its error for bad arguments (repeated or
    out-of-range axes, a zero step, unequal lengths, a shape that does not broadcast)."""
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    x = np.array(rng.integers(-50, 50, shape), np.float32)
    rank = len(shape)
    ints = st.integers(-9, 9) | st.sampled_from([2**62, -(2**62)])
    k = data.draw(st.integers(1, rank + 1))
    starts = np.array(data.draw(st.lists(ints, min_size=k, max_size=k)), np.int64)
    ends = np.array(data.draw(st.lists(ints, min_size=k, max_size=k)), np.int64)
    axes = np.array(data.draw(st.lists(st.integers(-rank - 1, rank), min_size=k, max_size=k)), np.int64)
    steps = np.array(
        data.draw(st.lists(st.sampled_from([-3, -1, 0, 1, 2]), min_size=k, max_size=k)), np.int32
    )
    kernel, _ = bind("Slice", [x, starts, ends, axes, steps])
    for args in ([x, starts, ends, axes, steps], [x, starts, ends, axes], [x, starts, ends]):
        try:
            want = get_op("Slice")(KernelContext(), *args)
        except Exception:
            with pytest.raises(Exception, match="Slice"):
                kernel.fn(KernelContext(), *args, **kernel.params)
            continue
        assert_bit_exact(want, kernel.fn(KernelContext(), *args, **kernel.params), "Slice")
    target = np.array(data.draw(st.lists(st.integers(0, 3), max_size=5)), np.int64)
    kernel, _ = bind("Expand", [x, target])
    try:
        want = get_op("Expand")(KernelContext(), x, target)
    except Exception:
        with pytest.raises(Exception, match="Expand"):
            kernel.fn(KernelContext(), x, target, **kernel.params)
        return
    assert_bit_exact(want, kernel.fn(KernelContext(), x, target, **kernel.params), "Expand")
    out = np.empty(want.shape, want.dtype)
    assert kernel.fn(KernelContext(), x, target, **kernel.params, out=out) is out
    assert_bit_exact(want, out, "Expand out=")


@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.uint8, np.bool_])
@pytest.mark.parametrize(
    ("data_shape", "index_shape", "batch_dims"),
    [
        ((3, 7, 17), (5, 2), 0),  # pairs of coordinates: rows of 17
        ((3, 7, 17), (2, 4, 3), 0),  # full coordinates: scalars
        ((3, 7, 17), (3, 1), 0),  # one coordinate: whole [7, 17] planes
        ((3, 7, 17), (3, 5, 1), 1),  # per batch, a row each
        ((2, 3, 7, 5), (2, 3, 2, 1), 2),  # two batch dims (all-MiniLM's token picking is this shape)
        ((3, 7, 17), (3, 0, 2), 1),  # no index tuples
    ],
)
def test_gather_nd_matches_twin(dtype, data_shape, index_shape, batch_dims):
    rng = np.random.default_rng(57)
    x = np.array(rng.integers(-50, 50, data_shape), dtype)
    m, b = index_shape[-1], batch_dims
    dims = np.array(data_shape[b : b + m])
    idx = rng.integers(-dims, dims, index_shape).astype(np.int64)  # negative indices count from the end
    run_both("GatherND", [x, idx], {"batch_dims": b})


@pytest.mark.parametrize("idx_dtype", [np.int64, np.int32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_run_time_indices_stay_native(idx_dtype, axis):
    """Failure signature: a run-time index of -1 (an unknown label's id) made take_axis
    refuse the call, so every run left the fast path for the generic kernel; or a
    negative index wrapped to the wrong row."""
    rng = np.random.default_rng(61)
    x = np.array(rng.normal(size=(3, 7, 17)), F32)
    n = x.shape[axis]
    idx = np.array(rng.integers(-n, n, (2, 5)), idx_dtype)
    idx.flat[0], idx.flat[1] = -1, -n  # the ends, both signs
    expected = run_both("Gather", [x, idx], {"axis": axis})
    got = _native.take_axis(x, axis % 3, idx.reshape(-1))
    assert_bit_exact(np.take(x, idx.reshape(-1), axis=axis), got, f"take_axis axis {axis}")
    # the specialized call for run-time indices: its direct call takes them (no ValueError)
    kernel, _ = bind("Gather", [x, idx], {"axis": axis})
    out = np.empty(expected.shape, F32)
    sig = Specialization(
        shapes=(x.shape, idx.shape),
        dtypes=(x.dtype, idx.dtype),
        consts=(None, None),
        out_shape=expected.shape,
        out_dtype=expected.dtype,
        out=out,
        num_threads=1,
        ctx=KernelContext(),
    )
    fast = kernel.specialize(sig, axis=axis)
    assert fast.direct(x, idx) is out
    assert_bit_exact(expected, out, f"specialized Gather axis {axis}")


@pytest.mark.parametrize(
    ("shape", "reps"),
    [
        ((3, 7, 17), (1, 2, 3)),
        ((7, 1), (3, 17)),
        ((2, 3, 5), (2, 0, 1)),
        ((17,), (7,)),
        ((1, 1, 3, 7), (1, 3, 1, 2)),
    ],
)
def test_tile_broadcast_copy_and_its_specialization_match_np_tile(shape, reps):
    """Failure signature: Tile as one copy into y seen as [r0, d0, r1, d1, ...] put a
    repeat's block in the wrong order (np.tile's is repeat-major per axis), or the
    specialized call wrote another shape's layout; a strided x and a zero repeat too."""
    rng = np.random.default_rng(67)
    base = np.array(rng.normal(size=tuple(2 * d for d in shape)), F32)
    for x in (
        np.ascontiguousarray(base[tuple(slice(0, d) for d in shape)]),
        base[tuple(slice(0, 2 * d, 2) for d in shape)],
    ):
        r = np.array(reps, np.int64)
        expected = run_both("Tile", [x, r])
        assert_bit_exact(np.tile(x, reps), expected, "twin")
        kernel, _ = bind("Tile", [x, r])
        for out in (None, np.empty(expected.shape, F32)):
            sig = Specialization(
                shapes=(x.shape, r.shape),
                dtypes=(x.dtype, r.dtype),
                consts=(None, r),
                out_shape=expected.shape,
                out_dtype=expected.dtype,
                out=out,
                num_threads=1,
                ctx=KernelContext(),
            )
            fast = kernel.specialize(sig)
            got = fast(KernelContext(), x, r)
            assert out is None or got is out
            assert_bit_exact(expected, got, f"specialized Tile {shape} x {reps}")


def test_gather_nd_bad_index_is_the_operators_error():
    kernel, _ = bind("GatherND", [np.zeros((3, 4), F32), np.zeros((1, 2), np.int64)])
    with pytest.raises(Exception, match="GatherND"):
        kernel.fn(KernelContext(), np.zeros((3, 4), F32), np.array([[1, 4]], np.int64), **kernel.params)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (17,), (3, 7, 65)])
def test_isnan_matches_twin(dtype, shape):
    x = floats(np.random.default_rng(59), shape).astype(dtype)
    run_both("IsNaN", [x])


@pytest.mark.parametrize("detect", [(1, 1), (1, 0), (0, 1), (0, 0)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (17,), (3, 7, 65)])
def test_isinf_matches_twin(detect, dtype, shape):
    """Both infinities, NaN, the largest finite values and denormals in every sign mode."""
    x = floats(np.random.default_rng(67), shape).astype(dtype)
    if x.size:
        flat = x.reshape(-1)
        edges = np.array([np.inf, -np.inf, np.nan, np.finfo(dtype).max, -np.finfo(dtype).max, -0.0, 1e-40])
        flat[: min(flat.size, 7)] = edges[: min(flat.size, 7)].astype(dtype)
    neg, pos = detect
    got = run_both("IsInf", [x], {"detect_negative": neg, "detect_positive": pos})
    if x.size >= 7:
        assert got.reshape(-1)[:3].tolist() == [bool(pos), bool(neg), False]


def test_isinf_of_integers_falls_back_with_reason():
    kernel, reason = bind("IsInf", [np.zeros(3, np.int64)])
    assert kernel is None and reason == "native IsInf takes float32 or float64, got int64"


@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(), (17,), (3, 7, 65)])
def test_rounding_matches_twin(op, dtype, shape):
    """Halves (Round: to even), negative zeros, huge and tiny values, IEEE specials."""
    x = floats(np.random.default_rng(61), shape).astype(dtype)
    if x.size:
        flat = x.reshape(-1)
        edges = np.array([2.5, -2.5, 0.5, -0.5, -0.0, 1.5, 3e9, -1e-30])
        flat[: min(flat.size, 8)] = edges[: min(flat.size, 8)]
    run_both(op, [x])
    assert bind(op, [np.zeros(3, np.int32)])[0] is None


def test_isnan_of_integers_falls_back_with_reason():
    kernel, reason = bind("IsNaN", [np.zeros(3, np.int32)])
    assert kernel is None and reason == "native IsNaN takes float32 or float64, got int32"


@given(
    perm=st.permutations(range(5)),
    shape=st.lists(st.sampled_from([1, 2, 3, 7, 17]), min_size=5, max_size=5),
    dtype=st.sampled_from([np.uint8, np.float32, np.int64]),
)
def test_transpose_any_rank_and_perm(perm, shape, dtype):
    # the attention transpose of ppocr_rec is [2, 0, 3, 1, 4] on [N, T, 3, heads, d]
    x = np.array(np.random.default_rng(59).integers(-100, 100, shape), dtype)
    kernel, reason = BINDERS[("", "Transpose")](
        None,
        Node(
            "Transpose",
            [Value("x", type=TensorType(elem_from_numpy(x.dtype), tuple(shape)))],
            [Value("y")],
            {"perm": list(perm)},
        ),
    )
    assert kernel is not None, reason
    want = get_op("Transpose")(KernelContext(), x, perm=list(perm))
    for threads in (1, 2):
        ctx = KernelContext(num_threads=threads)
        assert_bit_exact(want, kernel.fn(ctx, x, perm=list(perm), **kernel.params))


def test_copy_strided_large_view_splits_over_threads_identically():
    x = np.random.default_rng(61).integers(0, 256, (4, 3, 131, 97, 5)).astype(np.uint8)
    view = x.transpose(2, 0, 3, 1, 4)[::-2]
    one, two = _native.copy_strided(view, 1), _native.copy_strided(view, 2)
    assert one.tobytes() == two.tobytes() == np.ascontiguousarray(view).tobytes()


def test_copy_strided_overlap_check_spans_the_view_not_its_nbytes():
    # failure signature: a reversed view's data pointer is its LAST element in memory, so
    # a check of [data, data + nbytes) reached past the view into a neighbouring out
    # buffer and refused it (a hand-over to the twin that depended on where NumPy
    # happened to allocate out)
    buf = np.arange(40, dtype=np.int64)
    x, out = buf[:20], buf[20:]
    assert _native.copy_strided(x[::-1], 1, out) is not None
    assert out.tolist() == list(range(19, -1, -1))
    with pytest.raises(ValueError, match="copy_strided: out: expected a buffer that does not overlap"):
        _native.copy_strided(buf[::-2], 1, buf[5:25])


def test_shape_size_constant_are_native():
    x = np.zeros((2, 3, 5), F32)
    run_both("Shape", [x], {"start": 1})
    run_both("Size", [x])
    value = np.arange(6, dtype=np.int64).reshape(2, 3)
    kernel, reason = bind("Constant", [], {"value": value})
    assert kernel is not None, reason
    assert_bit_exact(value, kernel.fn(KernelContext(), value=value, **kernel.params))


# --------------------------------------------------------------------------------------
# bindings: bad arguments are ValueErrors naming the argument
# --------------------------------------------------------------------------------------


def test_bindings_reject_bad_arguments():
    x = np.zeros((4, 6), F32)
    with pytest.raises(ValueError, match="unary_f32_ex: op: unknown operation 'tan'"):
        _native.unary_f32_ex("tan", x)
    with pytest.raises(ValueError, match="cast: dtype: expected"):
        _native.cast(x, np.float16)
    with pytest.raises(ValueError, match="broadcast_op: expected broadcastable shapes"):
        _native.broadcast_op("less", x, np.zeros((5,), F32))
    with pytest.raises(ValueError, match="broadcast_op: add: no kernel for dtype float32"):
        _native.broadcast_op("add", x, x)
    with pytest.raises(ValueError, match=r"take_axis: idx: expected indices in \[-6, 6\), got 6"):
        _native.take_axis(x, 1, np.array([6], np.int64))
    with pytest.raises(ValueError, match=r"take_axis: idx: expected indices in \[-6, 6\), got -7"):
        _native.take_axis(x, 1, np.array([-7], np.int32))
    with pytest.raises(ValueError, match="reduce_rows_f32: x: expected \\[rows, d\\]"):
        _native.reduce_rows_f32("sum", np.zeros(3, F32))
    with pytest.raises(ValueError, match="out: expected a buffer that does not overlap"):
        _native.unary_f32_ex("neg", x, 1, x)


# --------------------------------------------------------------------------------------
# whole graphs: no reference kernel runs
# --------------------------------------------------------------------------------------


def test_float_head_graph_runs_without_a_reference_kernel():
    # the float ops of the zoo's heads in one graph: native == reference, no fallback
    f = TensorProto.FLOAT
    nodes = [
        helper.make_node("Clip", ["x", "lo", "hi"], ["c"]),
        helper.make_node("HardSigmoid", ["c"], ["h"], alpha=0.2, beta=0.5),
        helper.make_node("Pow", ["h", "two"], ["p"]),
        helper.make_node("ReduceMean", ["p", "axes"], ["m"], keepdims=1),
        helper.make_node("Sqrt", ["m"], ["s"]),
        helper.make_node("Resize", ["s", "", "scales"], ["r"], mode="nearest"),
        helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
        helper.make_node("Greater", ["t", "half"], ["g"]),
        helper.make_node("Cast", ["g"], ["gf"], to=f),
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Cast", ["shp"], ["shpf"], to=f),
        helper.make_node("ReduceSum", ["shpf"], ["n"], keepdims=0),
        helper.make_node("Mul", ["gf", "n"], ["y"]),
    ]
    init = [
        helper.make_tensor("lo", f, [], [-1.0]),
        helper.make_tensor("hi", f, [], [4.0]),
        helper.make_tensor("two", f, [], [2.0]),
        helper.make_tensor("axes", TensorProto.INT64, [1], [1]),
        helper.make_tensor("scales", f, [4], [1, 1, 2, 2]),
        helper.make_tensor("half", f, [], [0.3]),
    ]
    g = helper.make_graph(
        nodes,
        "head",
        [helper.make_tensor_value_info("x", f, [1, 7, 5, 9])],
        [helper.make_tensor_value_info("y", f, None)],
        init,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    x = floats(np.random.default_rng(67), (1, 7, 5, 9))
    ref = quanta.InferenceSession(m, backend="reference").run(None, {"x": x})[0]
    sess = quanta.InferenceSession(m, backend="native")
    assert sess.fallbacks == []
    assert_bit_exact(ref, sess.run(None, {"x": x})[0])


# --------------------------------------------------------------------------------------
# Pad, AveragePool, Slice-1
# --------------------------------------------------------------------------------------

PAD_CASES = [
    # (shape, pads, axes): all axes, some axes (negative ones too), crops and pads mixed
    ((3, 7, 17), [0, 1, 2, 0, 3, 1], None),
    ((1, 3, 576), [0, 0, 64, 0, 0, 64], None),  # silero-vad's reflect padding
    ((2, 17, 9, 7), [1, 1, 2, 2], [2, -1]),
    ((2, 7, 5, 3), [-1, 2, 0, 1, -2, 0], [1, 2, 3]),
    ((3, 17), [0, -2, 0, -3], None),  # crops only
    ((7,), [0, 0], None),  # nothing to do
]


@pytest.mark.parametrize("dtype", [np.float32, np.uint8, np.int64])
@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize(("shape", "pads", "axes"), PAD_CASES)
def test_pad_matches_twin(shape, pads, axes, mode, dtype):
    rng = np.random.default_rng(len(shape) + sum(map(abs, pads)))
    x = floats(rng, shape) if dtype == np.float32 else rng.integers(0, 100, size=shape).astype(dtype)
    inputs = [x, np.array(pads, np.int64), np.array(7, dtype) if mode == "constant" else None]
    if axes is not None:
        inputs.append(np.array(axes, np.int64))
    run_both("Pad", inputs, {"mode": mode})
    if mode == "constant" and dtype == np.float32:
        run_both("Pad", [x, inputs[1], None, *inputs[3:]], {"mode": mode})  # no constant: zeros
        run_both("Pad", [x, inputs[1], np.array(-0.0, F32), *inputs[3:]], {"mode": mode})  # −0 fill


def test_pad_attributes_of_opset_2():
    x = floats(np.random.default_rng(2), (3, 7, 5))
    run_both("Pad", [x], {"mode": "constant", "pads": [0, 1, 2, 0, 2, 1], "value": 1.5}, opset=2)
    run_both("Pad", [x], {"mode": "edge", "pads": [0, 1, 2, 0, 2, 1]}, opset=2)


@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4),
    pads=st.lists(st.integers(-2, 5), min_size=8, max_size=8),
    mode=st.sampled_from(["constant", "reflect", "edge", "wrap"]),
)
def test_pad_any_pads_match_twin(shape, pads, mode):
    rank = len(shape)
    pads = pads[:rank] + pads[4 : 4 + rank]
    if any(n + min(b, 0) + min(e, 0) < 1 for n, b, e in zip(shape, pads[:rank], pads[rank:])):
        pads = [max(p, 0) for p in pads]  # the twin's own result on over-cropping is NumPy's slicing
    x = np.arange(np.prod(shape), dtype=F32).reshape(shape)
    run_both("Pad", [x, np.array(pads, np.int64)], {"mode": mode})


def test_pad_reflect_of_an_empty_axis_raises_the_twins_error():
    kernel, _ = bind("Pad", [np.zeros((0, 3), F32), np.array([1, 0, 1, 0])], {"mode": "reflect"})
    with pytest.raises(Exception, match="non-empty input"):
        kernel.fn(
            KernelContext(opset=21),
            np.zeros((0, 3), F32),
            np.array([1, 0, 1, 0]),
            mode="reflect",
            **kernel.params,
        )


def pad_session(pads: list[int], mode: str, shape: tuple) -> quanta.InferenceSession:
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode), helper.make_node("Relu", ["y"], ["z"])],
        "pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, None)],
        [helper.make_tensor("pads", TensorProto.INT64, [len(pads)], pads)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    return quanta.InferenceSession(model.SerializeToString(), backend="native")


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge"])
def test_pad_in_a_session_is_native_and_specialized_like_the_twin(mode):
    """Constant pads: the specialized call (plan built once, written into the arena)."""
    shape, pads = (1, 3, 17), [0, 0, 3, 0, 0, 2]
    sess = pad_session(pads, mode, shape)
    assert not sess.fallbacks
    x = floats(np.random.default_rng(5), shape)
    expected = np.maximum(get_op("Pad")(KernelContext(opset=21), x, np.array(pads), mode=mode), F32(0))
    for _ in range(3):
        assert_bit_exact(expected, sess.run(None, {"x": x})[0], mode)


AVG_CASES = [
    # (x shape, attributes)
    ((1, 17, 3, 40), {"kernel_shape": [3, 2], "strides": [3, 2]}),  # the PP-OCR recognizers'
    ((2, 7, 9, 11), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
    ((2, 7, 9, 11), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
    ((1, 3, 10, 11), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1, "pads": [0, 1, 1, 0]}),
    ((1, 3, 10, 11), {"kernel_shape": [3, 2], "strides": [2, 3], "ceil_mode": 1, "count_include_pad": 1}),
    ((1, 3, 12, 9), {"kernel_shape": [2, 3], "dilations": [2, 2], "pads": [1, 2, 0, 1]}),
    ((1, 3, 7, 8), {"kernel_shape": [3, 3], "auto_pad": "SAME_UPPER", "strides": [2, 2]}),
    ((1, 3, 7, 8), {"kernel_shape": [2, 3], "auto_pad": "SAME_LOWER", "count_include_pad": 1}),
    ((2, 7, 33), {"kernel_shape": [5], "strides": [3], "pads": [2, 2]}),  # 1-D
    ((1, 3, 4, 5, 6), {"kernel_shape": [2, 3, 2], "pads": [0, 1, 1, 1, 0, 1]}),  # 3-D
    ((1, 3, 19, 19), {"kernel_shape": [17, 17]}),  # 289 > 258 elements per window: many blocks of 16
    ((1, 3, 19, 19), {"kernel_shape": [17, 17], "pads": [3, 3, 3, 3], "strides": [5, 5]}),
]


@pytest.mark.parametrize(("shape", "attrs"), AVG_CASES, ids=[str(i) for i in range(len(AVG_CASES))])
def test_average_pool_matches_twin(shape, attrs):
    x = floats(np.random.default_rng(len(shape) + len(attrs)), shape)
    run_both("AveragePool", [x], attrs)


@given(
    spatial=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    kernel=st.lists(st.integers(1, 4), min_size=3, max_size=3),
    strides=st.lists(st.integers(1, 3), min_size=3, max_size=3),
    pads=st.lists(st.integers(0, 3), min_size=6, max_size=6),
    dilation=st.integers(1, 2),
    ceil_mode=st.integers(0, 1),
    count_include_pad=st.integers(0, 1),
    channels=st.sampled_from([1, 3, 7, 17]),
)
def test_average_pool_any_geometry_matches_twin(
    spatial, kernel, strides, pads, dilation, ceil_mode, count_include_pad, channels
):
    n = len(spatial)
    kernel = [min(k, s) for k, s in zip(kernel[:n], spatial)]
    pads = [min(p, k - 1) for p, k in zip(pads[:n] + pads[3 : 3 + n], kernel + kernel)]  # a pad < the window
    attrs = {
        "kernel_shape": kernel,
        "strides": strides[:n],
        "pads": pads,
        "ceil_mode": ceil_mode,
        "count_include_pad": count_include_pad,
    }
    if dilation > 1:
        attrs["dilations"] = [dilation] * n
    shape = (2, channels, *[s + (dilation - 1) * (k - 1) for s, k in zip(spatial, kernel)])
    x = floats(np.random.default_rng(sum(shape)), shape)
    run_both("AveragePool", [x], attrs, opset=19)


def test_average_pool_sums_by_sum16_not_in_window_order():
    """(AP2): a window whose sequential and lane-order sums differ (the large terms cancel
    in lanes 0 and 1 first under sum16)."""
    row = np.zeros(17, F32)
    row[0], row[1], row[16] = F32(1e8), F32(1.0), F32(-1e8)
    x = row.reshape(1, 1, 1, 17)
    y = get_op("AveragePool")(KernelContext(opset=21), x, kernel_shape=[1, 17])
    assert y.reshape(()) == F32(1.0) / F32(17)  # sequential: (1e8 + 1) − 1e8 = 0
    run_both("AveragePool", [x], {"kernel_shape": [1, 17]})


def test_average_pool_binder_refuses_other_types():
    assert bind("AveragePool", [np.zeros((1, 1, 2, 2), np.float16)], {"kernel_shape": [2, 2]}) == (
        None,
        "native AveragePool takes float32, got float16",
    )


@pytest.mark.parametrize(
    "attrs",
    [
        {"starts": [1], "ends": [-1]},
        {"starts": [0, 5], "ends": [2, 1000], "axes": [0, -1]},
        {"starts": [3], "ends": [4], "axes": [0]},
    ],
)
def test_slice_1_attributes_match_twin(attrs):
    x = floats(np.random.default_rng(3), (3, 7, 17))
    run_both("Slice", [x], attrs, opset=7)


NODE_CASES = [
    pytest.param(c, id=c.name)
    for c in cases_for(frozenset({"Pad", "AveragePool", "Slice", "ScatterElements", "Div", "Max", "Min"}))
]


@pytest.mark.parametrize("case", NODE_CASES)
def test_onnx_node_cases_native(case) -> None:
    """The ONNX backend node tests through the native backend, at each case's tolerance
    (the reference runs them in tests/kernels/reference)."""
    model = case.model
    names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
    sess = quanta.InferenceSession(model.SerializeToString(), backend="native")
    for inputs, expected in case.data_sets:
        for g, e in zip(sess.run(None, dict(zip(names, inputs, strict=True))), expected, strict=True):
            e = np.asarray(e)
            assert g.shape == e.shape and g.dtype == e.dtype
            if e.dtype.kind == "f":
                np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
            else:
                np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("reduction", ["add", "mul"])
@pytest.mark.parametrize(
    ("data_shape", "idx_shape", "axis"),
    [((17, 7), (300, 7), 0), ((3, 17, 5), (3, 40, 5), 1), ((7, 3), (7, 2), -1), ((17,), (259,), 0)],
)
def test_scatter_elements_add_mul_match_twin(data_shape, idx_shape, axis, reduction):
    """Many updates per position (a GNN's edges into nodes), negative indices."""
    rng = np.random.default_rng(sum(idx_shape))
    n = data_shape[axis]
    data = floats(rng, data_shape)
    indices = rng.integers(-n, n, idx_shape).astype(np.int64)
    scale = 0.5 if reduction == "mul" else 3.0
    updates = floats(rng, idx_shape, scale) + (F32(1) if reduction == "mul" else F32(0))
    run_both("ScatterElements", [data, indices, updates], {"axis": axis, "reduction": reduction}, opset=18)


def test_scatter_elements_twin_combines_in_the_indices_order():
    """(SC1): one position's updates summed one after the other in the indices' C order."""
    data = np.zeros((2,), F32)
    updates = np.array([1e8, 1.0, -1e8, 1.0, 3.0], F32)
    indices = np.array([0, 0, 0, 0, 1])
    y = get_op("ScatterElements")(KernelContext(opset=18), data, indices, updates, reduction="add")
    expected = F32(0)
    for u in updates[:4]:
        expected = F32(expected + u)
    assert y[0] == expected == F32(1.0) and y[1] == F32(3.0)  # (((0 + 1e8) + 1) − 1e8) + 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize(
    ("data_shape", "idx_shape", "axis"),
    [
        ((1, 501, 30), (1, 1, 30), 1),  # SLANet's decoder Loop: step t's row into its buffer
        ((3, 17, 5), (3, 40, 5), 1),  # duplicates: the last update of a position wins
        ((7, 3), (7, 2), -1),
        ((17,), (259,), 0),
    ],
)
def test_scatter_elements_none_matches_twin(data_shape, idx_shape, axis, dtype):
    """Reduction none through the native ScatterND over the flat data: bit-equal to the
    twin's fancy assignment, duplicate and negative indices included."""
    rng = np.random.default_rng(sum(idx_shape) + 7)
    n = data_shape[axis % len(data_shape)]
    data = (rng.standard_normal(data_shape) * 100).astype(dtype)
    indices = rng.integers(-n, n, idx_shape).astype(np.int64)
    updates = (rng.standard_normal(idx_shape) * 100).astype(dtype)
    run_both("ScatterElements", [data, indices, updates], {"axis": axis, "reduction": "none"}, opset=18)
    flat = indices.reshape(-1)
    assert len(set(flat.tolist())) < flat.size or idx_shape == (1, 1, 30)  # duplicates tested


def test_scatter_elements_none_in_a_session_runs_natively():
    """A step buffer written by ScatterElements (reduction none): no fallback to the twin."""
    from onnx import TensorProto, helper

    node = helper.make_node("ScatterElements", ["buf", "idx", "row"], ["y"], axis=1)
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("buf", TensorProto.FLOAT, [1, 7, 17]),
            helper.make_tensor_value_info("idx", TensorProto.INT64, [1, 1, 17]),
            helper.make_tensor_value_info("row", TensorProto.FLOAT, [1, 1, 17]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 7, 17])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    sess = quanta.InferenceSession(model.SerializeToString(), backend="native")
    assert sess.fallbacks == []
    rng = np.random.default_rng(4)
    buf, row = floats(rng, (1, 7, 17)), floats(rng, (1, 1, 17))
    y = sess.run(None, {"buf": buf, "idx": np.full((1, 1, 17), 3, np.int64), "row": row})[0]
    expected = buf.copy()
    expected[:, 3] = row[:, 0]
    assert_bit_exact(expected, y)


@pytest.mark.parametrize("reduction", ["max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64])
@pytest.mark.parametrize(
    ("data_shape", "idx_shape", "axis"),
    [((17, 7), (300, 7), 0), ((3, 17, 5), (3, 40, 5), 1), ((7, 3), (7, 2), -1), ((17,), (259,), 0)],
)
def test_scatter_elements_max_min_match_twin(data_shape, idx_shape, axis, dtype, reduction):
    """A GNN's max aggregation of edges into nodes (MiniMol's scatter_reduce "amax"):
    many updates per position, negative indices, NaN and signed zeros among the float
    updates; bit-equal to the twin."""
    rng = np.random.default_rng(sum(idx_shape) + 3)
    n = data_shape[axis % len(data_shape)]
    data = (rng.standard_normal(data_shape) * 100).astype(dtype)
    indices = rng.integers(-n, n, idx_shape).astype(np.int64)
    updates = (rng.standard_normal(idx_shape) * 100).astype(dtype)
    if np.dtype(dtype).kind == "f":
        flat = updates.reshape(-1)
        flat[::37] = np.nan
        flat[5::41] = -0.0
        data.reshape(-1)[1::5] = 0.0
    run_both("ScatterElements", [data, indices, updates], {"axis": axis, "reduction": reduction}, opset=18)


def test_scatter_elements_max_in_a_session_runs_natively():
    """Before, the binder refused reduction max and the session fell back to the twin."""
    from onnx import TensorProto, helper

    node = helper.make_node("ScatterElements", ["nodes", "dst", "msg"], ["y"], axis=0, reduction="max")
    g = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info("nodes", TensorProto.FLOAT, [7, 17]),
            helper.make_tensor_value_info("dst", TensorProto.INT64, [40, 17]),
            helper.make_tensor_value_info("msg", TensorProto.FLOAT, [40, 17]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [7, 17])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 18)])
    sess = quanta.InferenceSession(model.SerializeToString(), backend="native")
    assert sess.fallbacks == []
    rng = np.random.default_rng(6)
    nodes, msg = floats(rng, (7, 17)), floats(rng, (40, 17), 3.0)
    dst = np.repeat(rng.integers(0, 7, (40, 1)), 17, axis=1).astype(np.int64)
    y = sess.run(None, {"nodes": nodes, "dst": dst, "msg": msg})[0]
    expected = nodes.copy()
    for e in range(40):
        expected[dst[e, 0]] = np.maximum(expected[dst[e, 0]], msg[e])
    assert_bit_exact(expected, y)


def test_scatter_elements_binder_refuses_other_reductions_and_out_of_range_raises_the_twins_error():
    inputs = [np.zeros((3,), F32), np.array([0]), np.ones((1,), F32)]
    assert bind("ScatterElements", inputs, {"reduction": "mean"}) == (
        None,
        "native ScatterElements takes reduction none, add, mul, max or min, got 'mean'",
    )
    half = [np.zeros((3,), np.float16), np.array([0]), np.ones((1,), np.float16)]
    kernel, reason = bind("ScatterElements", half, {"reduction": "none"})
    assert kernel is None and "float32/64 or int32/64 data with reduction none" in reason
    kernel, _ = bind("ScatterElements", inputs, {"reduction": "add"})
    with pytest.raises(Exception, match="ScatterElements"):
        kernel.fn(
            KernelContext(opset=18, op_type="ScatterElements"),
            np.zeros((3,), F32),
            np.array([5]),
            np.ones((1,), F32),
            reduction="add",
            **kernel.params,
        )


@given(
    dtype=st.sampled_from([np.uint8, np.int16, np.float32, np.int64, np.dtype("V3")]),
    step=st.sampled_from([2, 3, -1, -2]),
    shape=st.sampled_from([(3, 7, 17), (1, 3, 16, 33), (2, 1, 5)]),
    outer=st.booleans(),
)
def test_copy_strided_innermost_step_is_numpy_bytes(dtype, step, shape, outer):
    """A view with a step in its innermost axis (YOLOv5's Focus slices every other
    column) copies each row by a typed strided loop (1, 2, 4, 8-byte elements; others
    element by element), the bytes of np.ascontiguousarray, at 1 and 2 threads."""
    rng = np.random.default_rng(67)
    raw = rng.integers(0, 256, (*shape, np.dtype(dtype).itemsize), dtype=np.uint8)
    x = raw.view(dtype).reshape(shape)
    view = x[..., ::step]
    if outer:
        view = view[::2]  # and a step in an outer axis
    want = np.ascontiguousarray(view).tobytes()
    for threads in (1, 2):
        assert _native.copy_strided(view, threads).tobytes() == want
    # a broadcast (stride 0) innermost axis stays an element-by-element copy
    b = np.broadcast_to(x[..., :1], shape)
    assert _native.copy_strided(b, 1).tobytes() == np.ascontiguousarray(b).tobytes()


@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.float32, np.int64])
@pytest.mark.parametrize("run", [2, 3, 8, 9])
def test_copy_strided_short_strided_run_over_a_contiguous_axis_is_numpy_bytes(dtype, run):
    """A DepthToSpace-like view: a short innermost axis (the block of one output pixel)
    whose values lie a plane apart, under an axis the view walks contiguously. Runs of at
    most 8 copy as interleaved rows (copy_strided's block form), 9 as strided runs; the
    bytes of np.ascontiguousarray at 1 and 2 threads, with an outer axis of 3 and 17."""
    rng = np.random.default_rng(run)
    for outer in (3, 17):
        x = rng.integers(-100, 100, (run, outer, 5, 13)).astype(dtype)
        view = x.transpose(1, 2, 3, 0)  # [outer, 5, 13, run]: run values a plane apart
        want = np.ascontiguousarray(view).tobytes()
        for threads in (1, 2):
            assert _native.copy_strided(view, threads).tobytes() == want


@pytest.mark.parametrize("dtype", [np.uint8, np.float16, np.float32, np.int64])
@pytest.mark.parametrize("n", [3, 7])
def test_concat_into_one_element_a_row_interleaves_like_numpy(dtype, n):
    """concat_into with every input one element a row (a stack along a new last axis)
    interleaves the inputs by a typed loop; an input of two elements a row keeps the
    per-row copies; both the bytes of np.concatenate, and a second call into the same
    out overwrites all of it."""
    rng = np.random.default_rng(n)
    xs = [rng.integers(0, 100, (2, 17, 13, 1)).astype(dtype) for _ in range(n)]
    out = np.full((2, 17, 13, n), 7, dtype)
    _native.concat_into(xs, 3, out)
    assert out.tobytes() == np.concatenate(xs, axis=3).tobytes()
    xs = [x + 1 for x in xs]
    _native.concat_into(xs, 3, out)
    assert out.tobytes() == np.concatenate(xs, axis=3).tobytes()
    mixed = [xs[0], np.concatenate(xs[:2], axis=3)]
    out2 = np.empty((2, 17, 13, 3), dtype)
    _native.concat_into(mixed, 3, out2)
    assert out2.tobytes() == np.concatenate(mixed, axis=3).tobytes()


def test_tf2onnx_atan2_session_runs_natively():
    """TensorFlow's Atan2 as tf2onnx writes it (Atan of y / x, corrected by Sign(x) and
    Sign(y) times π): every step native, within 3 ulp of π of ONNX Runtime."""
    import onnxruntime as ort

    pi = helper.make_tensor("pi", TensorProto.FLOAT, [], [float(np.pi)])
    half = helper.make_tensor("half", TensorProto.FLOAT, [], [0.5])
    graph = helper.make_graph(
        [
            helper.make_node("Div", ["y", "x"], ["q"]),
            helper.make_node("Atan", ["q"], ["a"]),
            helper.make_node("Sign", ["x"], ["sx"]),
            helper.make_node("Sign", ["y"], ["sy"]),
            helper.make_node("Sub", ["sx", "half"], ["t"]),  # -1.5 for x < 0, else >= -0.5
            helper.make_node("Relu", ["t"], ["pos"]),
            helper.make_node("Sub", ["pos", "t"], ["negx"]),  # 1.5 for x < 0, else 0 or 0.5
            helper.make_node("Mul", ["sy", "pi"], ["spi"]),
            helper.make_node("Mul", ["negx", "spi"], ["corr"]),
            helper.make_node("Add", ["a", "corr"], ["out"]),
        ],
        "atan2",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [3, 7, 17]) for n in ("x", "y")],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [3, 7, 17])],
        [pi, half],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = quanta.InferenceSession(model.SerializeToString())
    assert sess.fallbacks == []
    rng = np.random.default_rng(23)
    feed = {n: rng.standard_normal((3, 7, 17)).astype(F32) for n in ("x", "y")}
    got = sess.run(None, feed)[0]
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, feed
    )[0]
    assert np.max(np.abs(got - want)) <= 3 * np.spacing(F32(np.pi))
