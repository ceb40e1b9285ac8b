"""Native quanta::DynamicQuantizeGRU (quanta/targets/native/recurrent.py on
``_native.dq_gru``) against its NumPy twin (reference/dq_gru.py).

Tolerance 0 (bit-exact): both quantize the same blocks ((DQG1), (DQG3), (DQG5)) with the
same float32 operations, the products are exact int32 sums with the same two float32
roundings after them ((DQG2)), and the gates are the same float32 operations in the same
order, the MLAS Horner steps fused multiply-adds in both. Every ISA the CPU supports runs
(the weights are packed at bind time with the active ISA), with 1 and 2 threads, which must
give identical bytes.

Shapes with reasons: hidden sizes 7, 17, 37 (odd: tails of the 8- and 16-lane gate loops
and of the qgemm panels), input sizes 1, 5 and 300 (a reduction past the float32-exact 258
terms), batch 1 and 3 with sequence lengths that end early, are 0 or full; both
linear_before_reset; weights int8 (zero point 0) and uint8 with a non-zero zero point per
direction or repeated per column; per-direction and per-column scales that differ.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.graph import Graph, Model, Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels import _native
from quanta.kernels.reference.dq_gru import QUANTA_DOMAIN, dynamic_quantize_gru
from quanta.kernels.reference.registry import OpError, refusal
from quanta.quantize.dq_gru_function import FUNCTION_INPUTS
from quanta.targets.base import KernelContext
from quanta.targets.native import native_kernel_for, recurrent

ISAS: list[str] = list(_native.supported_isas())
THREADS = (1, 2)
F32 = np.float32
OP = "DynamicQuantizeGRU"
INPUT_NAMES = tuple(FUNCTION_INPUTS)  # the op's inputs by position (its schema)


def gru_inputs(
    rng, *, T, B, n_in, H, D, weights, scales, bias, lens, h0, int8_bits: int = 8
) -> list[np.ndarray | None]:
    """The node's 10 inputs (None where omitted). ``int8_bits`` 7 draws int8 weights from
    [-64, 64] (for a comparison with ONNX Runtime, whose u8 x s8 products are exact on every
    CPU only there), 8 from the whole int8 range."""
    x = (rng.standard_normal((T, B, n_in)) * 1.5 + 0.3).astype(F32)
    if weights == "int8":
        lo, hi = (-128, 128) if int8_bits == 8 else (-64, 65)
        w = rng.integers(lo, hi, (D, n_in, 3 * H)).astype(np.int8)
        r = rng.integers(lo, hi, (D, H, 3 * H)).astype(np.int8)
        wz, rz = np.zeros(D, np.int8), np.zeros((D, 3 * H), np.int8)
    else:
        w = rng.integers(0, 256, (D, n_in, 3 * H)).astype(np.uint8)
        r = rng.integers(0, 256, (D, H, 3 * H)).astype(np.uint8)
        wz = rng.integers(1, 256, D).astype(np.uint8)
        rz = rng.integers(1, 256, D).astype(np.uint8)
        if weights == "uint8_columns":  # per-column zero points, all equal within a direction
            wz = np.repeat(wz[:, None], 3 * H, axis=1)
            rz = np.repeat(rz[:, None], 3 * H, axis=1)
    shape = (D, 3 * H) if scales == "column" else (D,)
    ws = (rng.random(shape) * 0.02 + 0.002).astype(F32) / np.sqrt(n_in).astype(F32)
    rs = (rng.random(shape) * 0.02 + 0.003).astype(F32)
    return [
        x,
        w,
        r,
        (rng.standard_normal((D, 6 * H)) * 0.5).astype(F32) if bias else None,
        None if lens is None else np.asarray(lens, np.int32),
        rng.standard_normal((D, B, H)).astype(F32) if h0 else None,
        ws,
        wz,
        rs,
        rz,
    ]


def _bind(inputs: list[np.ndarray | None], attrs: dict):
    g = Graph()
    values: list[Value | None] = []
    for i, a in enumerate(inputs):
        if a is None:
            values.append(None)
        elif i in (0, 4, 5):
            values.append(g.add_input(INPUT_NAMES[i], TensorType(elem_from_numpy(a.dtype), tuple(a.shape))))
        else:
            values.append(g.add_initializer(INPUT_NAMES[i], a))
    node = Node(OP, values, [Value("Y"), Value("Y_h")], attrs, name="gru", domain=QUANTA_DOMAIN)
    g.add_node(node)
    return native_kernel_for(Model(g, opset_imports={"": 21, QUANTA_DOMAIN: 1}), node)


def _ctx(threads: int) -> KernelContext:
    return KernelContext(
        opset=1, op_type=OP, domain=QUANTA_DOMAIN, node_name="gru", num_threads=threads, n_outputs=2
    )


class TwinCalls:
    """Counts the calls the native kernel hands to the twin (a test whose fast path fell
    back would compare the twin with itself)."""

    def __enter__(self) -> TwinCalls:
        import quanta.kernels.reference.dq_gru as ref

        self.count = 0
        self._ref = ref
        self._original = ref.dynamic_quantize_gru_op

        def counting(*args, **kwargs):
            self.count += 1
            return self._original(*args, **kwargs)

        ref.dynamic_quantize_gru_op = counting
        return self

    def __exit__(self, *exc) -> None:
        self._ref.dynamic_quantize_gru_op = self._original


def assert_same(expected, got, label: str) -> None:
    assert len(expected) == len(got), f"{label}: {len(got)} outputs, expected {len(expected)}"
    for name, e, a in zip(("Y", "Y_h"), expected, got, strict=True):
        assert e.shape == a.shape and e.dtype == a.dtype, (
            f"{label} {name}: {e.dtype}{e.shape} vs {a.dtype}{a.shape}"
        )
        bad = e.view(np.uint32) != a.view(np.uint32)
        if bad.any():
            first = tuple(int(i) for i in np.argwhere(bad)[0])
            raise AssertionError(
                f"{label} {name}: {int(bad.sum())} of {e.size} differ; first at {first}: "
                f"expected {e[first]!r}, got {a[first]!r}"
            )


def _check(inputs: list[np.ndarray | None], attrs: dict) -> None:
    """Native == twin on every ISA and thread count; the native path must have run."""
    expected = dynamic_quantize_gru(*inputs, **attrs)
    assert np.isfinite(expected[0]).all() and np.abs(expected[1]).max() > 0.01  # a live recurrence
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            kernel, reason = _bind(inputs, attrs)
            assert kernel is not None and kernel.impl == "native", reason
            for threads in THREADS:
                with TwinCalls() as twin:
                    got = kernel.fn(_ctx(threads), *inputs, **attrs, **kernel.params)
                assert twin.count == 0, "the native kernel ran the twin"
                assert_same(expected, got, f"{isa}, {threads} threads")
    finally:
        _native.clear_isa()


@settings(max_examples=40, deadline=None)
@given(
    H=st.sampled_from([7, 17, 37]),
    n_in=st.sampled_from([1, 5, 300]),
    T=st.sampled_from([1, 4]),
    B=st.sampled_from([1, 3]),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    lbr=st.sampled_from([0, 1]),
    weights=st.sampled_from(["int8", "uint8", "uint8_columns"]),
    scales=st.sampled_from(["direction", "column"]),
    bias=st.booleans(),
    lens_kind=st.sampled_from(["none", "full", "ragged"]),
    h0=st.booleans(),
    seed=st.integers(0, 2**16),
)
@example(H=17, n_in=300, T=4, B=3, direction="bidirectional", lbr=0, weights="uint8", scales="column",
         bias=True, lens_kind="ragged", h0=True, seed=3)  # fmt: skip
@example(H=7, n_in=300, T=4, B=3, direction="reverse", lbr=1, weights="int8", scales="column",
         bias=True, lens_kind="ragged", h0=True, seed=5)  # fmt: skip
def test_dynamic_quantize_gru_native_equals_twin(
    H, n_in, T, B, direction, lbr, weights, scales, bias, lens_kind, h0, seed
):
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    lens = {"none": None, "full": [T] * B, "ragged": [T, 0, max(1, T - 2)][:B] if B == 3 else [T]}[lens_kind]
    inputs = gru_inputs(
        rng, T=T, B=B, n_in=n_in, H=H, D=D, weights=weights, scales=scales, bias=bias, lens=lens, h0=h0
    )
    _check(inputs, {"hidden_size": H, "direction": direction, "linear_before_reset": lbr})


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("clip", [0.6, 3.0])
def test_clip_binds_on_the_gates_as_the_twin(lbr, clip):
    """A clip smaller than most pre-activations (large biases): clamped lanes, native ==
    twin."""
    rng = np.random.default_rng(11)
    inputs = gru_inputs(
        rng,
        T=3,
        B=3,
        n_in=17,
        H=17,
        D=2,
        weights="uint8",
        scales="column",
        bias=True,
        lens=[3, 1, 2],
        h0=True,
    )
    inputs[3] = inputs[3] * F32(8)
    _check(
        inputs, {"hidden_size": 17, "direction": "bidirectional", "linear_before_reset": lbr, "clip": clip}
    )


def test_all_lengths_zero_and_empty_batch_give_zeros():
    rng = np.random.default_rng(2)
    inputs = gru_inputs(
        rng, T=3, B=2, n_in=5, H=7, D=1, weights="int8", scales="direction", bias=True, lens=[0, 0], h0=True
    )
    kernel, reason = _bind(inputs, {"hidden_size": 7})
    assert kernel is not None, reason
    y, yh = kernel.fn(_ctx(1), *inputs, hidden_size=7, **kernel.params)
    assert y.shape == (3, 1, 2, 7) and not y.any() and not yh.any()
    ey, eh = dynamic_quantize_gru(*inputs, hidden_size=7)
    assert_same((ey, eh), (y, yh), "zero lengths")


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({"hidden_size": 7, "layout": 1}, "layout = 1"),
        ({"hidden_size": 7, "activations": ["Relu", "Tanh"]}, "Sigmoid, Tanh only"),
        ({"hidden_size": 7, "direction": "sideways"}, "direction 'sideways'"),
        ({"hidden_size": 8}, "must be int8/uint8"),
    ],
)
def test_binder_refuses_with_a_reason(attrs, expected):
    rng = np.random.default_rng(0)
    inputs = gru_inputs(
        rng, T=2, B=1, n_in=5, H=7, D=1, weights="int8", scales="direction", bias=False, lens=None, h0=False
    )
    kernel, reason = _bind(inputs, attrs)
    assert kernel is None and expected in reason


def test_bad_sequence_lens_raise_naming_the_op():
    rng = np.random.default_rng(0)
    inputs = gru_inputs(
        rng, T=2, B=2, n_in=5, H=7, D=1, weights="int8", scales="direction", bias=False, lens=[1, 3], h0=False
    )
    kernel, _ = _bind(inputs, {"hidden_size": 7})
    assert kernel is not None
    with pytest.raises(OpError, match="DynamicQuantizeGRU: dq_gru: sequence_lens"):
        kernel.fn(_ctx(1), *inputs, hidden_size=7, **kernel.params)
    with pytest.raises(OpError, match="sequence_lens must be 2 values"):
        dynamic_quantize_gru(*inputs, hidden_size=7)


def test_unequal_weight_zero_points_are_refused():
    rng = np.random.default_rng(0)
    inputs = gru_inputs(
        rng,
        T=2,
        B=1,
        n_in=5,
        H=7,
        D=1,
        weights="uint8_columns",
        scales="direction",
        bias=False,
        lens=None,
        h0=False,
    )
    inputs[7] = inputs[7].copy()
    inputs[7][0, 3] += 1
    kernel, reason = _bind(inputs, {"hidden_size": 7})
    assert kernel is None and "zero points must all be equal" in reason
    with pytest.raises(OpError, match="W_zero_point"):
        dynamic_quantize_gru(*inputs, hidden_size=7)


def test_recurrent_module_exports_the_binder():
    assert "bind_dynamic_quantize_gru" in recurrent.__all__


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({"hidden_size": 7, "layout": 1}, "layout = 1"),
        ({"hidden_size": 7, "activations": ["Sigmoid", "Relu"]}, "Sigmoid, Tanh only"),
    ],
)
def test_unsupported_forms_are_refused_when_the_session_is_built(attrs, expected):
    """A node the op does not define is refused at load time, named (registry.REFUSALS),
    on both backends; the default form is not."""
    assert refusal(OP, QUANTA_DOMAIN, {"hidden_size": 7}, [True] * 10) is None
    assert expected in (refusal(OP, QUANTA_DOMAIN, attrs, [True] * 10) or "")
    rng = np.random.default_rng(0)
    inputs = gru_inputs(
        rng, T=2, B=1, n_in=5, H=7, D=1, weights="int8", scales="direction", bias=False, lens=None, h0=False
    )
    inits = [numpy_helper.from_array(a, INPUT_NAMES[i]) for i, a in enumerate(inputs) if a is not None and i]
    node = helper.make_node(OP, [n if inputs[i] is not None else "" for i, n in enumerate(INPUT_NAMES)], ["Y", "Y_h"],
                            name="gru9", domain=QUANTA_DOMAIN, **attrs)  # fmt: skip
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 1, 5])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(QUANTA_DOMAIN, 1)]
    )
    for backend in ("reference", "native"):
        with pytest.raises(Exception, match=rf"gru9[\s\S]*{re.escape(expected)}"):
            quanta.InferenceSession(m.SerializeToString(), backend=backend)
