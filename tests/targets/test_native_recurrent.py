"""Native com.microsoft DynamicQuantizeLSTM (quanta/targets/native/recurrent.py on
``_native.dq_lstm``) against its NumPy twin (reference/ms_lstm.py).

Tolerance 0 (bit-exact): both quantize the same blocks with the same float32 operations,
the GEMMs are exact int32 sums with the same two float32 roundings after them, and the
gate math is the same float32 operations in the same order, the MLAS Horner steps fused
multiply-adds in both (recurrent.h). Every ISA the CPU supports runs (the weights are
packed at bind time with the active ISA, so the ISA is set before binding), with 1 and 2
threads, which must give identical bytes.

Shapes with reasons: hidden sizes 7, 13, 17, 37 (odd: tails of the 8- and 16-lane gate
loops and of the qgemm panels), input sizes 1 (shallow), 5, 300 (a reduction past the
float32-exact 258 terms), 1 or 5 steps, batch 1-3 with sequence lengths that end early,
are 0 or full; weights int8 (zero point 0, as ORT's per-channel files) and uint8 with a
non-zero zero point per direction or repeated per column (ORT's per-tensor files);
per-direction and per-column scales that differ.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from onnx import helper

import quanta
from quanta.ir.graph import Graph, Model, Node, Value
from quanta.ir.types import TensorType, elem_from_numpy
from quanta.kernels import _native
from quanta.kernels.reference.ms_lstm import dynamic_quantize_lstm
from quanta.kernels.reference.registry import MS_DOMAIN, OpError
from quanta.targets.base import KernelContext, Specialization
from quanta.targets.native import native_kernel_for, recurrent

ISAS: list[str] = list(_native.supported_isas())
THREADS = (1, 2)
F32 = np.float32
OP = "DynamicQuantizeLSTM"
INPUT_NAMES = (
    "X",
    "W",
    "R",
    "B",
    "sequence_lens",
    "initial_h",
    "initial_c",
    "P",
    "W_scale",
    "W_zero_point",
    "R_scale",
    "R_zero_point",
)


def _bind(inputs: list[np.ndarray | None], attrs: dict, const: frozenset = frozenset(range(1, 12))):
    """Bind a one-node IR graph with the native binder: (kernel, reason)."""
    g = Graph()
    values: list[Value | None] = []
    for i, a in enumerate(inputs):
        if a is None:
            values.append(None)
        elif i in const:
            values.append(g.add_initializer(INPUT_NAMES[i], a))
        else:
            values.append(g.add_input(INPUT_NAMES[i], TensorType(elem_from_numpy(a.dtype), tuple(a.shape))))
    node = Node(OP, values, [Value("Y"), Value("Y_h"), Value("Y_c")], attrs, name="lstm", domain=MS_DOMAIN)
    g.add_node(node)
    return native_kernel_for(Model(g, opset_imports={"": 21, MS_DOMAIN: 1}), node)


def _ctx(threads: int, want_y: bool) -> KernelContext:
    onnx_node = helper.make_node(OP, ["X"], ["Y" if want_y else "", "Y_h", "Y_c"], domain=MS_DOMAIN)
    return KernelContext(
        opset=1,
        op_type=OP,
        domain=MS_DOMAIN,
        node_name="lstm",
        num_threads=threads,
        n_outputs=3,
        onnx_node=onnx_node,
    )


class TwinCalls:
    """Counts the calls the native kernel hands to the twin at run time (a test whose fast
    path silently fell back would compare the twin with itself)."""

    def __enter__(self) -> TwinCalls:
        self.count = 0
        self._original = recurrent.dynamic_quantize_lstm_op

        def counting(*args, **kwargs):
            self.count += 1
            return self._original(*args, **kwargs)

        recurrent.dynamic_quantize_lstm_op = counting
        return self

    def __exit__(self, *exc) -> None:
        recurrent.dynamic_quantize_lstm_op = self._original


def _assert_same(expected, got, label: str) -> None:
    assert len(expected) == len(got), f"{label}: {len(got)} outputs, expected {len(expected)}"
    for name, e, a in zip(("Y", "Y_h", "Y_c")[: len(expected)], expected, got, strict=True):
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


def _check(inputs: list[np.ndarray | None], attrs: dict, want_y: bool = True) -> None:
    """Native == twin on every ISA and thread count; the native path must have run."""
    expected = dynamic_quantize_lstm(*inputs, want_y=want_y, **attrs)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            kernel, reason = _bind(inputs, attrs)
            assert kernel is not None and kernel.impl == "native", reason
            for threads in THREADS:
                with TwinCalls() as twin:
                    got = kernel.fn(_ctx(threads, want_y), *inputs, **attrs, **kernel.params)
                assert twin.count == 0, "the native kernel ran the twin"
                _assert_same(expected, got, f"{isa}, {threads} threads")
                # the call specialized for this X shape (B, sequence_lens, P constants)
                ctx = _ctx(threads, want_y)
                sig = Specialization(
                    shapes=tuple(None if a is None else a.shape for a in inputs),
                    dtypes=tuple(None if a is None else a.dtype for a in inputs),
                    consts=tuple(None if a is None or k in (0, 5, 6) else a for k, a in enumerate(inputs)),
                    out_shape=None,
                    out_dtype=None,
                    out=None,
                    num_threads=threads,
                    ctx=ctx,
                )
                fast = kernel.specialize(sig, **attrs, **kernel.params)
                assert fast is not None
                with TwinCalls() as twin:
                    got = fast(ctx, *inputs)
                assert twin.count == 0, "the specialized call ran the twin"
                _assert_same(expected, got, f"specialized, {isa}, {threads} threads")
                _check_recorded(kernel, sig, inputs, attrs, want_y, f"{isa}, {threads} threads")
    finally:
        _native.clear_isa()


def _check_recorded(kernel, sig: Specialization, inputs, attrs: dict, want_y: bool, label: str) -> None:
    """The call specialized into planned places (``Kernel.out_all``: Y, Y_h, Y_c in the
    arena) writes the twin's bytes there, and, recorded once into a native program, reads
    X at run time: each run of the program on another X (ranges 0.01x-40x: the block's
    scale and zero point move) equals the twin on that X. The places start as NaN, so an
    element the call does not write shows."""
    import dataclasses

    ctx = sig.ctx
    x = inputs[0].copy()
    ins = [x, *inputs[1:]]
    expected = dynamic_quantize_lstm(*ins, want_y=want_y, **attrs)
    places = tuple(np.full(e.shape, np.nan, F32) for e in expected)
    fast = kernel.specialize(dataclasses.replace(sig, out=places), **attrs, **kernel.params)
    assert fast is not None
    assert getattr(fast, "recordable", False), "the call into places is not recordable"
    with TwinCalls() as twin:
        got = fast(ctx, *ins)
    assert twin.count == 0, "the call into places ran the twin"
    assert all(g is p for g, p in zip(got, places, strict=True)), "the outputs are not the places"
    _assert_same(expected, got, f"into places, {label}")
    # the generic kernel with out= writes the same places
    for p in places:
        p.fill(np.nan)
    got = kernel.fn(ctx, *ins, **attrs, **kernel.params, out=places)
    _assert_same(expected, got, f"generic into places, {label}")
    program = _native.Program()
    assert program.record(fast.direct, *(ins[k] for k in fast.reads)), "the call was not recorded"
    for scale, shift in ((40.0, -3.0), (0.01, 0.25), (1.0, 0.0)):
        np.copyto(x, inputs[0] * F32(scale) + F32(shift))
        for p in places:
            p.fill(np.nan)
        program.run()
        want = dynamic_quantize_lstm(x.copy(), *inputs[1:], want_y=want_y, **attrs)
        _assert_same(want, places, f"recorded, x * {scale} + {shift}, {label}")


def _lstm_inputs(rng, *, T, B, n_in, H, D, weights, scales, bias, lens, h0, c0, peephole):
    """The node's 12 inputs (None where omitted)."""
    x = (rng.standard_normal((T, B, n_in)) * 1.5 + 0.3).astype(F32)
    if weights == "int8":
        w = rng.integers(-128, 128, (D, n_in, 4 * H)).astype(np.int8)
        r = rng.integers(-128, 128, (D, H, 4 * H)).astype(np.int8)
        wz, rz = np.zeros(D, np.int8), np.zeros((D, 4 * H), np.int8)
    else:
        w = rng.integers(0, 256, (D, n_in, 4 * H)).astype(np.uint8)
        r = rng.integers(0, 256, (D, H, 4 * H)).astype(np.uint8)
        wz = rng.integers(1, 256, D).astype(np.uint8)
        rz = rng.integers(1, 256, D).astype(np.uint8)
        if weights == "uint8_columns":  # per-column zero points, all equal within a direction
            wz = np.repeat(wz[:, None], 4 * H, axis=1)
            rz = np.repeat(rz[:, None], 4 * H, axis=1)
    if scales == "column":
        ws = (rng.random((D, 4 * H)) * 0.02 + 0.002).astype(F32)
        rs = (rng.random((D, 4 * H)) * 0.02 + 0.002).astype(F32)
    else:
        ws = (rng.random(D) * 0.02 + 0.002).astype(F32)
        rs = (rng.random(D) * 0.02 + 0.002).astype(F32)
    return [
        x,
        w,
        r,
        (rng.standard_normal((D, 8 * H)) * 0.5).astype(F32) if bias else None,
        None if lens is None else np.asarray(lens, np.int32),
        rng.standard_normal((D, B, H)).astype(F32) if h0 else None,
        rng.standard_normal((D, B, H)).astype(F32) if c0 else None,
        (rng.standard_normal((D, 3 * H)) * 0.5).astype(F32) if peephole else None,
        ws,
        wz,
        rs,
        rz,
    ]


@settings(max_examples=30, deadline=None)
@given(
    H=st.sampled_from([7, 13, 17, 37]),
    n_in=st.sampled_from([1, 5, 300]),
    T=st.sampled_from([1, 5]),
    B=st.integers(1, 3),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    weights=st.sampled_from(["int8", "uint8", "uint8_columns"]),
    scales=st.sampled_from(["direction", "column"]),
    bias=st.booleans(),
    lens_kind=st.sampled_from(["none", "full", "ragged"]),
    h0=st.booleans(),
    c0=st.booleans(),
    peephole=st.booleans(),
    want_y=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_dynamic_quantize_lstm_native_equals_twin(
    H, n_in, T, B, direction, weights, scales, bias, lens_kind, h0, c0, peephole, want_y, seed
):
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    lens = {"none": None, "full": [T] * B, "ragged": rng.integers(0, T + 1, B).tolist()}[lens_kind]
    inputs = _lstm_inputs(
        rng,
        T=T,
        B=B,
        n_in=n_in,
        H=H,
        D=D,
        weights=weights,
        scales=scales,
        bias=bias,
        lens=lens,
        h0=h0,
        c0=c0,
        peephole=peephole,
    )
    _check(inputs, {"hidden_size": H, "direction": direction}, want_y)


@pytest.mark.parametrize(
    "attrs",
    [
        {"clip": 0.75},  # the clip binds on most gates
        {"input_forget": 1},  # f = 1 − i
        {"clip": 2.5, "input_forget": 1, "activations": ["Sigmoid", "Tanh", "Tanh"]},
    ],
)
def test_dynamic_quantize_lstm_attributes(attrs):
    rng = np.random.default_rng(7)
    inputs = _lstm_inputs(
        rng,
        T=5,
        B=3,
        n_in=5,
        H=13,
        D=1,
        weights="uint8",
        scales="column",
        bias=True,
        lens=[5, 3, 1],
        h0=True,
        c0=True,
        peephole=True,
    )
    _check(inputs, {"hidden_size": 13, "direction": "reverse", **attrs})


def test_dynamic_quantize_lstm_large_gates_saturate_the_mlas_clamps():
    """Scales large enough that gate arguments pass MLAS's ±18 / ±9 clamps (the logistic's
    exact 0 far left) and a long X block (T·B·I = 2400 values in one quantization)."""
    rng = np.random.default_rng(11)
    inputs = _lstm_inputs(
        rng,
        T=40,
        B=2,
        n_in=30,
        H=17,
        D=2,
        weights="int8",
        scales="column",
        bias=True,
        lens=[40, 33],
        h0=True,
        c0=True,
        peephole=False,
    )
    inputs[8] = inputs[8] * F32(40)
    inputs[10] = inputs[10] * F32(40)
    y = dynamic_quantize_lstm(*inputs, hidden_size=17, direction="bidirectional")[0]
    assert np.any(y == 0) and np.any(np.abs(y) > 0.99)  # saturated gates did occur
    _check(inputs, {"hidden_size": 17, "direction": "bidirectional"})


def test_empty_batch_and_zero_lengths():
    rng = np.random.default_rng(3)
    inputs = _lstm_inputs(
        rng,
        T=3,
        B=2,
        n_in=5,
        H=7,
        D=2,
        weights="int8",
        scales="direction",
        bias=True,
        lens=[0, 0],
        h0=True,
        c0=True,
        peephole=False,
    )
    _check(inputs, {"hidden_size": 7, "direction": "bidirectional"})


@pytest.mark.parametrize(
    "attrs, constant, expected",
    [
        ({"activations": ["Relu", "Tanh", "Tanh"]}, True, "default sigmoid, tanh, tanh only"),
        ({"layout": 1}, True, "layout = 1"),
        ({}, False, "must be constants"),
    ],
)
def test_binder_refuses_with_a_reason(attrs, constant, expected):
    rng = np.random.default_rng(1)
    inputs = _lstm_inputs(
        rng,
        T=2,
        B=1,
        n_in=3,
        H=7,
        D=1,
        weights="int8",
        scales="direction",
        bias=False,
        lens=None,
        h0=False,
        c0=False,
        peephole=False,
    )
    const = frozenset(range(1, 12)) if constant else frozenset(range(3, 12))
    kernel, reason = _bind(inputs, {"hidden_size": 7, **attrs}, const)
    assert kernel is None and expected in reason


def test_binder_refuses_unequal_zero_points_as_the_twin_does():
    rng = np.random.default_rng(2)
    inputs = _lstm_inputs(
        rng,
        T=2,
        B=1,
        n_in=3,
        H=7,
        D=1,
        weights="uint8_columns",
        scales="direction",
        bias=False,
        lens=None,
        h0=False,
        c0=False,
        peephole=False,
    )
    inputs[9] = inputs[9].copy()
    inputs[9][0, 3] ^= 1
    kernel, reason = _bind(inputs, {"hidden_size": 7})
    assert kernel is None and "zero points must all be equal" in reason
    with pytest.raises(OpError, match="zero points must all be equal"):
        dynamic_quantize_lstm(*inputs, hidden_size=7)


def test_bad_sequence_lens_raise_naming_the_op():
    rng = np.random.default_rng(4)
    inputs = _lstm_inputs(
        rng,
        T=2,
        B=2,
        n_in=3,
        H=7,
        D=1,
        weights="int8",
        scales="direction",
        bias=False,
        lens=[1, 3],
        h0=False,
        c0=False,
        peephole=False,
    )
    kernel, reason = _bind(inputs, {"hidden_size": 7})
    assert kernel is not None, reason
    with pytest.raises(OpError, match=r"sequence_lens.*\[0, 2\]"):
        kernel.fn(_ctx(1, True), *inputs, hidden_size=7, **kernel.params)


ZOO = Path(os.path.expanduser("~/.cache/quanta-zoo/models"))


@pytest.mark.skipif(
    not (ZOO / "ddddocr.ort_dynamic.onnx").exists(), reason="the model zoo is not on this machine"
)
def test_ddddocr_ort_file_native_equals_reference():
    """The captcha reader quantized by ONNX Runtime's quantize_dynamic (a bidirectional
    DynamicQuantizeLSTM, H = 512, uint8 weights per tensor): the whole model's outputs are
    the same bytes on the native and the reference backend, and the LSTM ran natively."""
    path = str(ZOO / "ddddocr.ort_dynamic.onnx")
    assert any(n.op_type == OP for n in onnx.load(path).graph.node)
    feed = {"input1": np.random.default_rng(0).random((1, 1, 64, 120), dtype=F32)}
    native = quanta.InferenceSession(path)
    assert not [f for f in native.fallbacks if f[1] == OP]
    got = native.run(None, feed)
    expected = quanta.InferenceSession(path, backend="reference").run(None, feed)
    for e, a in zip(expected, got, strict=True):
        np.testing.assert_array_equal(a, e)


# --------------------------------------------------------------------------------------
# ai.onnx LSTM and GRU (float32): native == twin (reference/rnn.py), bit for bit; the twin
# against ONNX's node tests and against float64 within (RNN1)'s bound
# --------------------------------------------------------------------------------------


def _rnn_model(op: str, inputs: list[np.ndarray | None], attrs: dict, domain: str = "") -> tuple[Model, Node]:
    """A one-node model of the recurrent ``op``: W and R (inputs 1, 2) constants, the
    others graph inputs; outputs Y, Y_h (and Y_c for the LSTMs)."""
    g = Graph()
    values: list[Value | None] = []
    for i, a in enumerate(inputs):
        if a is None:
            values.append(None)
        elif i in (1, 2):
            values.append(g.add_initializer(f"in{i}", a))
        else:
            values.append(g.add_input(f"in{i}", TensorType(elem_from_numpy(a.dtype), tuple(a.shape))))
    outs = [Value("Y"), Value("Y_h")] + ([Value("Y_c")] if "LSTM" in op else [])
    node = Node(op, values, outs, attrs, name="rnn", domain=domain)
    g.add_node(node)
    return Model(g, opset_imports={"": 21, **({domain: 1} if domain else {})}), node


def _bind_float(op: str, inputs: list[np.ndarray | None], attrs: dict):
    return native_kernel_for(*_rnn_model(op, inputs, attrs))


def _float_inputs(rng, op, *, T, B, n_in, H, D, bias, lens, h0, c0, peephole, layout=0):
    G = 4 if op == "LSTM" else 3
    x = (rng.standard_normal((T, B, n_in)) * 1.2).astype(F32)
    w = (rng.standard_normal((D, G * H, n_in)) / np.sqrt(n_in)).astype(F32)
    r = (rng.standard_normal((D, G * H, H)) / np.sqrt(H)).astype(F32)
    state = (D, B, H) if layout == 0 else (B, D, H)
    ins = [
        x.transpose(1, 0, 2).copy() if layout else x,
        w,
        r,
        (rng.standard_normal((D, 2 * G * H)) * 0.5).astype(F32) if bias else None,
        None if lens is None else np.asarray(lens, np.int32),
        rng.standard_normal(state).astype(F32) if h0 else None,
    ]
    if op == "LSTM":
        ins += [
            rng.standard_normal(state).astype(F32) if c0 else None,
            (rng.standard_normal((D, 3 * H)) * 0.5).astype(F32) if peephole else None,
        ]
    return ins


class FloatTwinCalls:
    def __enter__(self) -> FloatTwinCalls:
        from quanta.kernels.reference import rnn

        self.count = 0
        self._mod = rnn
        self._orig = (rnn.lstm_op, rnn.gru_op)

        def wrap(fn):
            def counting(*args, **kwargs):
                self.count += 1
                return fn(*args, **kwargs)

            return counting

        rnn.lstm_op, rnn.gru_op = wrap(rnn.lstm_op), wrap(rnn.gru_op)
        return self

    def __exit__(self, *exc) -> None:
        self._mod.lstm_op, self._mod.gru_op = self._orig


def _direct_call(fast, inputs: list[np.ndarray | None]):
    """``fast``'s direct call as the executor's fast loop makes it: the inputs at the
    positions ``fast.reads`` names (x and the initial states the node has)."""
    assert fast.reads[0] == 0 and all(inputs[p] is not None for p in fast.reads)
    assert {p for p in (5, 6) if p < len(inputs) and inputs[p] is not None} == set(fast.reads[1:])
    return fast.direct(*[inputs[p] for p in fast.reads])


def _check_float(op: str, inputs: list[np.ndarray | None], attrs: dict, same=None) -> None:
    from quanta.kernels.reference.rnn import gru_op, lstm_op

    same = same or _assert_same
    n_out = 3 if op == "LSTM" else 2
    ctx1 = KernelContext(opset=21, op_type=op, node_name="rnn", n_outputs=n_out)
    expected = (lstm_op if op == "LSTM" else gru_op)(ctx1, *inputs, **attrs)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            kernel, reason = _bind_float(op, inputs, attrs)
            assert kernel is not None and kernel.impl == "native", reason
            for threads in THREADS:
                ctx = KernelContext(
                    opset=21, op_type=op, node_name="rnn", n_outputs=n_out, num_threads=threads
                )
                with FloatTwinCalls() as twin:
                    got = kernel.fn(ctx, *inputs, **attrs, **kernel.params)
                assert twin.count == 0, "the native kernel ran the twin"
                same(expected, got, f"{op} {isa}, {threads} threads")
                # the call specialized for this X shape (B, sequence_lens, P constants;
                # layout 1 keeps the generic call)
                states = (0, 5, 6)
                sig = Specialization(
                    shapes=tuple(None if a is None else a.shape for a in inputs),
                    dtypes=tuple(None if a is None else a.dtype for a in inputs),
                    consts=tuple(None if a is None or k in states else a for k, a in enumerate(inputs)),
                    out_shape=None,
                    out_dtype=None,
                    out=None,
                    num_threads=threads,
                    ctx=ctx,
                )
                fast = kernel.specialize(sig, **attrs, **kernel.params)
                assert (fast is None) == bool(attrs.get("layout", 0))
                if fast is not None:
                    with FloatTwinCalls() as twin:
                        got = fast(ctx, *inputs)
                    assert twin.count == 0, "the specialized call ran the twin"
                    same(expected, got, f"specialized {op} {isa}, {threads} threads")
                    same(expected, _direct_call(fast, inputs), f"direct {op} {isa}, {threads} threads")
    finally:
        _native.clear_isa()


@settings(max_examples=30, deadline=None)
@given(
    op=st.sampled_from(["LSTM", "GRU"]),
    H=st.sampled_from([7, 13, 17, 37]),
    n_in=st.sampled_from([1, 5, 300]),
    T=st.sampled_from([1, 5]),
    B=st.integers(1, 3),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    bias=st.booleans(),
    lens_kind=st.sampled_from(["none", "full", "ragged"]),
    h0=st.booleans(),
    c0=st.booleans(),
    peephole=st.booleans(),
    variant=st.booleans(),  # LSTM: input_forget; GRU: linear_before_reset
    clip=st.sampled_from([None, 0.9]),
    layout=st.sampled_from([0, 1]),
    seed=st.integers(0, 2**16),
)
def test_float_rnn_native_equals_twin(
    op, H, n_in, T, B, direction, bias, lens_kind, h0, c0, peephole, variant, clip, layout, seed
):
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    lens = {"none": None, "full": [T] * B, "ragged": rng.integers(0, T + 1, B).tolist()}[lens_kind]
    inputs = _float_inputs(
        rng,
        op,
        T=T,
        B=B,
        n_in=n_in,
        H=H,
        D=D,
        bias=bias,
        lens=lens,
        h0=h0,
        c0=c0,
        peephole=peephole,
        layout=layout,
    )
    attrs = {"hidden_size": H, "direction": direction, "layout": layout}
    if clip is not None:
        attrs["clip"] = clip
    if variant:
        attrs["input_forget" if op == "LSTM" else "linear_before_reset"] = 1
    _check_float(op, inputs, attrs)


@pytest.mark.parametrize(("H", "n_in"), [(7, 3), (17, 3), (33, 5)])
@pytest.mark.parametrize(("peephole", "input_forget"), [(False, 0), (True, 0), (True, 1)])
@pytest.mark.parametrize("clip", [None, 2.5])
def test_float_lstm_gate_rows_saturate_and_keep_nan_as_the_twin(H, n_in, peephole, input_forget, clip):
    """The float LSTM's gates (recurrent.h Kernels::onnx_lstm_row: (RNN3)-(RNN5) a vector
    of lanes at a time with ONNX's sigmoid and tanh, masked tails on AVX-512, scalar ones
    on AVX2 at H 7, 17, 33): gates far into saturation (tanh's exp branch, sigmoid of
    large negative inputs), ±inf and NaN in X, peepholes, input_forget, the clip, two
    directions, a row that ends early: the twin's bytes, NaN where the twin has NaN."""
    rng = np.random.default_rng(H * 100 + 10 * peephole + input_forget)
    inputs = _float_inputs(
        rng,
        "LSTM",
        T=4,
        B=2,
        n_in=n_in,
        H=H,
        D=2,
        bias=True,
        lens=[4, 2],
        h0=True,
        c0=True,
        peephole=peephole,
    )
    inputs[1] = (inputs[1] * 40).astype(F32)
    inputs[0][0, 1, 0] = np.inf
    inputs[0][1, 1, 2] = -np.inf
    inputs[0][3, 0, 1] = np.nan
    attrs = {"hidden_size": H, "direction": "bidirectional", "input_forget": input_forget}
    if clip is not None:
        attrs["clip"] = clip
    _check_float("LSTM", inputs, attrs, _assert_same_nan_positions)


@pytest.mark.parametrize(("H", "n_in"), [(7, 3), (17, 3), (33, 5)])
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize(("bias", "clip"), [(True, None), (False, None), (True, 2.5)])
def test_float_gru_gate_rows_saturate_and_keep_nan_as_the_twin(H, n_in, lbr, bias, clip):
    """The float GRU's gates (recurrent.h Kernels::onnx_gru_zr / onnx_gru_h: (RNN6)-(RNN9)
    a vector of lanes at a time with ONNX's sigmoid and tanh, masked or scalar tails at H
    7, 17, 33), both linear_before_reset forms, with and without a bias, gates far into
    saturation, ±inf and NaN in X, the clip, two directions, a row that ends early: the
    twin's bytes, NaN where the twin has NaN."""
    rng = np.random.default_rng(H * 100 + 10 * lbr + bias)
    inputs = _float_inputs(
        rng, "GRU", T=4, B=2, n_in=n_in, H=H, D=2, bias=bias, lens=[4, 2], h0=True, c0=False, peephole=False
    )
    inputs[1] = (inputs[1] * 40).astype(F32)
    inputs[0][0, 1, 0] = np.inf
    inputs[0][1, 1, 2] = -np.inf
    inputs[0][3, 0, 1] = np.nan
    attrs = {"hidden_size": H, "direction": "bidirectional", "linear_before_reset": lbr}
    if clip is not None:
        attrs["clip"] = clip
    _check_float("GRU", inputs, attrs, _assert_same_nan_positions)


@pytest.mark.parametrize(
    ("op", "H", "lbr"),
    [("LSTM", 200, 0), ("GRU", 300, 1), ("GRU", 300, 0), ("OrtGRU", 300, 1), ("OrtLSTM", 200, 0)],
)
@pytest.mark.parametrize("lens", [None, [13, 16]])
def test_float_rnn_input_projection_split_over_threads_gives_the_twin_bytes(op, H, lbr, lens):
    """An input projection past float_rnn.cc's kSplitMacs (16 steps × 2 rows × 100 inputs ×
    800 / 900 gate columns) runs its 32 rows in blocks of four on the pool at 2 threads
    (with sequence lengths 13 and 16 too): the twin's bytes on every ISA, 1 and 2 threads;
    LSTM, GRU both linear_before_reset forms, OrtGRU, OrtLSTM."""
    rng = np.random.default_rng(H + lbr)
    base = "LSTM" if op.endswith("LSTM") else "GRU"
    inputs = _float_inputs(
        rng,
        base,
        T=16,
        B=2,
        n_in=100,
        H=H,
        D=1,
        bias=True,
        lens=lens,
        h0=True,
        c0=True,
        peephole=base == "LSTM",
    )
    attrs = {"hidden_size": H, "direction": "forward"}
    if base == "GRU":
        attrs["linear_before_reset"] = lbr
    if op == "OrtGRU":
        _check_ort_gru(inputs, attrs, _assert_same)
        return
    if op == "LSTM" or op == "GRU":
        _check_float(op, inputs, attrs)
        return
    _check_ort_lstm(inputs, attrs)


@pytest.mark.parametrize(
    ("op", "H", "direction", "variant"),
    [
        ("LSTM", 67, "bidirectional", False),
        ("GRU", 131, "forward", False),
        ("GRU", 131, "reverse", True),
        ("GRU", 200, "forward", True),
        ("LSTM", 100, "reverse", False),
        ("GRU", 4, "bidirectional", True),
        ("GRU", 3, "forward", False),
        ("LSTM", 17, "bidirectional", False),
    ],
)
def test_float_rnn_batch_one_streams_panel_pairs_with_the_twin_bytes(op, H, direction, variant):
    """Batch 1 with 4H (LSTM) or 2H (GRU's z, r columns) past two 128-column panels: the
    recurrence's GEMV streams every vector of a chunk of whole panels in one k loop
    (seq_gemm_simd.h seq_row_panels: up to 24 vectors), the twin's chains; the chunks
    (4·67 = 268 columns: 17 vectors; 2·131 = 262: 17; 2·200 = 400 and 4·100: 25 vectors,
    16 + 9; GRU 200's h columns: 13; 3·4, 2·3: one short vector; 4·17 = 68: four full
    vectors and a short one)."""
    rng = np.random.default_rng(H)
    D = 2 if direction == "bidirectional" else 1
    inputs = _float_inputs(
        rng,
        op,
        T=5,
        B=1,
        n_in=300,
        H=H,
        D=D,
        bias=True,
        lens=None,
        h0=True,
        c0=True,
        peephole=False,
        layout=0,
    )
    attrs = {"hidden_size": H, "direction": direction, "layout": 0}
    if variant:
        attrs["input_forget" if op == "LSTM" else "linear_before_reset"] = 1
    _check_float(op, inputs, attrs)


@pytest.mark.parametrize(
    ("op", "H", "T", "B", "direction"),
    [
        ("LSTM", 67, 7, 3, "bidirectional"),
        ("LSTM", 67, 2, 5, "forward"),
        ("GRU", 131, 3, 7, "reverse"),
        ("LSTM", 25, 40, 1, "forward"),
        ("LSTM", 7, 3, 2, "bidirectional"),
        ("LSTM", 25, 1, 1, "reverse"),
        ("GRU", 25, 40, 1, "reverse"),
        ("LSTM", 67, 5, 2, "bidirectional"),
        ("LSTM", 17, 4, 3, "reverse"),
        ("GRU", 67, 5, 2, "forward"),
        ("GRU", 17, 3, 6, "bidirectional"),
        ("LSTM", 7, 2, 6, "forward"),
        ("GRU", 67, 4, 3, "bidirectional"),
    ],
)
def test_float_rnn_row_blocks_give_the_twin_bytes(op, H, T, B, direction):
    """Products of 4+ rows run four rows at a time (seq_gemm_simd.h seq_rows4: the input
    projection of all T·B rows, and the recurrence of a batch of 5 or 7), pairs of rows
    or three over a whole panel on AVX-512 (seq_rows2_panel: a batch of 2, 3, 6 or the
    three rows a batch of 7 leaves), the rest a row at a time; the tail panel (4·67 = 268, 3·67 = 201, 3·131 = 393 columns) and a narrow
    one (4·25 = 100: 4 + 3 vectors; 4·7 = 28: 2; 3·25 = 75: 4 + 1; 3·17 = 51, 4·17 = 68)
    masked, ragged lengths shrinking the batch mid-sequence: each output the twin's chain,
    on every ISA."""
    rng = np.random.default_rng(H * T + B)
    D = 2 if direction == "bidirectional" else 1
    inputs = _float_inputs(
        rng,
        op,
        T=T,
        B=B,
        n_in=300,
        H=H,
        D=D,
        bias=True,
        lens=[T, T - 1, T, 0, 1, T, 2][:B],
        h0=True,
        c0=True,
        peephole=op == "LSTM",
        layout=0,
    )
    _check_float(op, inputs, {"hidden_size": H, "direction": direction, "layout": 0})


@pytest.mark.parametrize(
    ("op", "H", "B", "direction", "variant", "lens"),
    [
        ("LSTM", 256, 6, "forward", False, None),
        ("LSTM", 185, 1, "reverse", False, None),
        ("LSTM", 73, 7, "forward", True, [5, 4, 5, 0, 1, 5, 2]),
        ("LSTM", 129, 3, "reverse", False, [5, 3, 1]),
        ("GRU", 211, 1, "forward", True, None),
        ("GRU", 211, 1, "reverse", False, None),
        ("GRU", 129, 3, "forward", False, [2, 5, 4]),
        ("GRU", 256, 6, "reverse", True, [5, 5, 1, 0, 5, 3]),
        ("OrtLSTM", 190, 3, "forward", False, [5, 2, 4]),
    ],
)
@pytest.mark.parametrize("solo", [False, True])
def test_float_rnn_step_team_gives_the_twin_bytes(op, H, B, direction, variant, lens, solo):
    """A recurrence step of float_rnn.cc's kTeamMacs multiply-adds or more (B·H·G·H >=
    2^17) at 2 threads runs on a StepTeam: its products split by whole panels (pairs at
    batch 1), its gates by rows, claimed by the caller and a helper: the twin's bytes on
    every ISA at 1 and 2 threads, with tail panels (4·185 = 740, 4·73 = 292, 2·211 = 422
    columns), ragged lengths, both GRU forms, OrtLSTM's accumulate-onto-X·Wᵀ products; and
    with the pool's jobs on the caller alone (``solo``: the driver, then a helper that finds
    the work done)."""
    rng = np.random.default_rng(H * B + len(op))
    base = "LSTM" if op.endswith("LSTM") else "GRU"
    inputs = _float_inputs(
        rng,
        base,
        T=5,
        B=B,
        n_in=37,
        H=H,
        D=1,
        bias=True,
        lens=lens,
        h0=True,
        c0=True,
        peephole=base == "LSTM",
        layout=0,
    )
    attrs = {"hidden_size": H, "direction": direction, "layout": 0}
    if variant:
        attrs["input_forget" if base == "LSTM" else "linear_before_reset"] = 1
    _native.pool_solo_for(60_000_000 if solo else 0)
    try:
        if op != "OrtLSTM":
            _check_float(op, inputs, attrs)
            return
        _check_ort_lstm(inputs, attrs)
    finally:
        _native.pool_solo_for(0)


@pytest.mark.parametrize(
    ("op", "H", "n_in", "T", "B"),
    [
        ("LSTM", 250, 257, 31, 31),  # X·Wᵀ: 961 rows, 1000 columns, K 257; H·Rᵀ: 31 rows
        ("GRU", 17, 40, 7, 1),  # X·Wᵀ: 7 rows (a six-row block and one), h columns: 17
        ("GRU", 17, 300, 1, 7),  # a batch of 7: a six-row block and one, 34 and 17 columns
        ("LSTM", 7, 300, 5, 1),  # 5 rows: a four-row block and one
        ("LSTM", 67, 40, 1, 1),  # one row
        ("GRU", 100, 257, 13, 6),  # 78 rows, K 257 / 100, a tail panel of 44 columns
        ("LSTM", 20, 5, 3, 6),  # K 5: the prefetch distance (4 k steps) past the first step
        ("LSTM", 20, 3, 3, 6),  # K 3: every step within the prefetch distance of K
        # 64+ steps at batch 6+: the recurrence on R's strips (seq_gemm_strips_simd)
        ("LSTM", 67, 40, 64, 7),  # 268 columns: 4 strips and 12 columns; rows 6 + 1
        ("LSTM", 37, 17, 64, 9),  # 148 columns: 2 strips and 20; rows 6 + 2 + 1
        ("LSTM", 20, 5, 65, 10),  # 80 columns: a strip and 16; rows 6 + 4; K 20
        ("LSTM", 100, 300, 70, 13),  # 400 columns: 6 strips and 16; StepTeam at 2 threads
    ],
)
def test_float_rnn_six_row_blocks_with_prefetch_give_the_twin_bytes(op, H, n_in, T, B):
    """The six-row blocks of seq_gemm_simd.h seq_rows (AVX-512: the input projection of
    T·B rows and a batch-6+ recurrence) prefetch their weight lines kRowsPrefetch k steps
    ahead: row counts that are not a multiple of six (1, 5, 7, 78, 961 input rows; 7 and 31
    batch rows), column counts 17 to 1000 with tail panels, K of 3, 5, 40, 257, 300 (every
    k step, some or none inside the prefetch distance of K); an LSTM of 64+ steps at batch
    6+ runs its recurrence on R repacked into 64-column strips (float_rnn.cc
    kStripMinSteps), with tail strips of 12, 16, 20 columns and 1, 2+1, 4 rows after the
    six-row blocks: each output the twin's chain on every ISA, 1 and 2 threads."""
    rng = np.random.default_rng(H * 1000 + n_in * 10 + B)
    inputs = _float_inputs(
        rng,
        op,
        T=T,
        B=B,
        n_in=n_in,
        H=H,
        D=1,
        bias=True,
        lens=None,
        h0=True,
        c0=True,
        peephole=op == "LSTM",
        layout=0,
    )
    _check_float(op, inputs, {"hidden_size": H, "direction": "forward", "layout": 0})


def _float64_lstm_forward(x, w, r, b):
    """An LSTM (forward, default activations) in float64: the exact-math yardstick."""
    T, B, _ = x.shape
    H = r.shape[2]
    h = np.zeros((B, H))
    c = np.zeros((B, H))
    ys = []
    bb = b[0, : 4 * H] + b[0, 4 * H :]
    for t in range(T):
        a = x[t] @ w[0].T + h @ r[0].T + bb
        i, o, f, g = (
            1 / (1 + np.exp(-a[:, :H])),
            1 / (1 + np.exp(-a[:, H : 2 * H])),
            1 / (1 + np.exp(-a[:, 2 * H : 3 * H])),
            np.tanh(a[:, 3 * H :]),
        )
        c = f * c + i * g
        h = o * np.tanh(c)
        ys.append(h)
    return np.stack(ys)


@pytest.mark.parametrize(
    ("op", "H", "n_in", "T", "B", "direction", "lens"),
    [
        # X·Wᵀ rows T·B: 5 (a five-row tile), 21 (6+6+6+3), 27 (two row tiles: 24 + 3);
        # K = 259: eight 32-step chunks and 3, and MLAS's second 256-step block
        ("LSTM", 65, 259, 21, 1, "bidirectional", None),  # 260 columns: two panels and 4
        ("LSTM", 7, 3, 9, 3, "reverse", [9, 4, 0]),  # 28 columns, K 3: one partial chunk
        ("LSTM", 17, 259, 5, 1, "forward", None),  # 68 columns: 8 + 1 vectors, R = 5
        ("GRU", 65, 259, 9, 3, "bidirectional", [9, 2, 7]),  # 130 + 65 columns
        ("GRU", 17, 3, 4, 5, "reverse", [4, 4, 1, 0, 3]),  # a four-row recurrence
        ("OrtLSTM", 65, 259, 27, 1, "bidirectional", None),
        ("OrtLSTM", 17, 259, 3, 6, "forward", [3, 1, 3, 2, 0, 3]),  # a six-row recurrence
        ("OrtGRU", 65, 259, 7, 3, "reverse", [7, 5, 1]),
        ("OrtGRU", 7, 3, 5, 2, "bidirectional", None),
    ],
)
@pytest.mark.parametrize("variant", [False, True])
def test_float_rnn_avx2_tiles_give_the_twin_bytes(op, H, n_in, T, B, direction, lens, variant):
    """AVX2's products (seq_gemm_simd.h seq_gemm_tiled: each panel in chunks of kTileK k
    steps, up to kTileRows rows a tile in blocks of 6 × 2, 5 × 2, 4 × 2, 3 × 4, 2 × 4 and
    1 × 8 vectors, the chains held in a tile buffer between chunks; for OrtLSTM / OrtGRU the
    FMA chains of MLAS's 256-step blocks added onto y at each block's end): every row count
    of a block, a partial chunk, a second MLAS block, partial panels, ragged lengths and
    initial states (``variant``: input_forget for an LSTM, linear_before_reset for a GRU),
    the twin's bytes on every ISA at 1 and 2 threads."""
    _check_float_kind(op, H, n_in, T, B, direction, lens, variant)


@pytest.mark.parametrize(
    ("op", "H", "n_in", "T", "B", "direction", "lens"),
    [
        # columns per step product: strips of 32 in pairs, a pair whose second strip is
        # partial, a partial strip alone; L >= kRowStripMinSteps (4) on the strips, 3 not
        ("LSTM", 25, 259, 9, 1, "forward", None),  # 100 columns: a pair, then 32 + 4
        ("LSTM", 7, 3, 5, 1, "reverse", [5]),  # 28 columns: one partial strip
        ("LSTM", 65, 3, 6, 1, "bidirectional", [4]),  # 260: four pairs and 4; L = 4 of T = 6
        ("LSTM", 17, 259, 3, 1, "bidirectional", None),  # L = 3: the panels
        ("LSTM", 259, 3, 4, 1, "forward", None),  # K = 259; two threads: the step team
        ("GRU", 17, 259, 7, 1, "forward", None),  # z, r 34 columns (32 + 2), h 17
        ("GRU", 65, 3, 8, 1, "bidirectional", [6]),  # 130 (2 pairs + 2) and 65 (a pair + 1)
        ("GRU", 25, 3, 4, 1, "reverse", None),
        ("GRU", 7, 259, 3, 1, "reverse", None),  # L = 3: the panels
        ("GRU", 259, 3, 4, 1, "forward", None),  # the step team
        ("OrtLSTM", 25, 259, 6, 1, "bidirectional", None),
        ("OrtLSTM", 65, 3, 5, 1, "forward", [4]),
        ("OrtLSTM", 259, 3, 4, 1, "reverse", None),  # K = 259: MLAS's second block
        ("OrtGRU", 17, 259, 6, 1, "bidirectional", None),
        ("OrtGRU", 65, 3, 5, 1, "reverse", [5]),
        ("OrtGRU", 259, 3, 4, 1, "forward", None),  # MLAS's second block
    ],
)
@pytest.mark.parametrize("variant", [False, True])
def test_float_rnn_batch_one_row_strips_give_the_twin_bytes(op, H, n_in, T, B, direction, lens, variant):
    """A batch-1 recurrence of 4 steps or more on AVX2 runs its step products on R (and a
    GRU's R_h) repacked into strips of 32 columns, two strips a pass (seq_gemm_simd.h
    seq_row_strips; float_rnn.h kSeqRowStrip), each lane's chain as on the panels: (RNN1)
    for LSTM / GRU, MLAS's 256-step FMA blocks added onto y for OrtLSTM / OrtGRU. Pairs,
    partial strips, ragged lengths, initial states, both directions, both variants, and the
    two-thread step team: the twin's bytes on every ISA at 1 and 2 threads."""
    _check_float_kind(op, H, n_in, T, B, direction, lens, variant)


@pytest.mark.parametrize(
    ("op", "H", "n_in", "T", "B", "direction", "lens"),
    [
        ("LSTM", 7, 3, 3, 1, "forward", None),  # L = 3 < 4: on the bound strips all the same
        ("LSTM", 25, 259, 6, 1, "bidirectional", None),
        ("LSTM", 17, 259, 5, 3, "reverse", [5, 2, 4]),  # odd batch: the panels, repacked
        ("LSTM", 65, 3, 6, 1, "reverse", [4]),
        ("GRU", 17, 3, 5, 1, "forward", None),
        ("GRU", 65, 259, 4, 3, "bidirectional", [4, 0, 3]),
        ("GRU", 25, 3, 3, 1, "reverse", None),
        ("OrtLSTM", 25, 259, 5, 1, "forward", None),
        ("OrtLSTM", 7, 3, 4, 3, "bidirectional", [4, 1, 3]),
        ("OrtGRU", 17, 259, 6, 1, "bidirectional", [5]),
        ("OrtGRU", 65, 3, 3, 3, "forward", None),
    ],
)
@pytest.mark.parametrize("variant", [False, True])
def test_float_rnn_weights_packed_at_bind_time_serve_every_isa_batch_and_call(
    op, H, n_in, T, B, direction, lens, variant
):
    """The binder packs W and R (and a GRU's R_h) once, in the blocks the bind-time ISA's
    kernels read (``_native.float_rnn_layout()``: on AVX2 W in strips of 16 columns and R
    in row strips of 32, panels of 128 elsewhere), and keeps no second copy; a call whose
    path needs the other layout (a batch > 1, another ISA set after binding) repacks for
    itself. Kernels
    bound on every ISA, run on every ISA at 1 and 2 threads, twice with different inputs
    (the packed R is reused, not stale): the twin's bytes."""
    from quanta.kernels.reference.ort_float import ort_gru_op, ort_lstm_op
    from quanta.kernels.reference.rnn import gru_op, lstm_op

    base = "LSTM" if op.endswith("LSTM") else "GRU"
    twin = {"LSTM": lstm_op, "GRU": gru_op, "OrtLSTM": ort_lstm_op, "OrtGRU": ort_gru_op}[op]
    D = 2 if direction == "bidirectional" else 1
    n_out = 3 if base == "LSTM" else 2
    attrs = {"hidden_size": H, "direction": direction, "layout": 0}
    if variant:
        attrs["input_forget" if base == "LSTM" else "linear_before_reset"] = 1
    rng = np.random.default_rng(H * T + B)
    kw = dict(T=T, B=B, n_in=n_in, H=H, D=D, bias=True, lens=lens, h0=True, c0=True)
    first = _float_inputs(rng, base, **kw, peephole=op == "LSTM")
    second = list(first)
    second[0] = (rng.standard_normal(first[0].shape) * 1.2).astype(F32)
    second[5] = rng.standard_normal(first[5].shape).astype(F32)
    model, node = _rnn_model(op, first, attrs, domain="quanta" if op.startswith("Ort") else "")
    try:
        kernels = {}
        for isa in ISAS:
            _native.set_isa(isa)
            kernel, reason = native_kernel_for(model, node)
            assert kernel is not None and kernel.impl == "native", reason
            wc, rc = _native.float_rnn_layout()
            assert (wc, rc) == ((16, 32) if isa == "avx2" else (128, 128))
            for r in kernel.params["r_t"] + kernel.params["r_h"]:
                assert r.shape[1:] == (H, rc)
            assert all(w.shape[1:] == (n_in, wc) for w in kernel.params["w_t"])
            kernels[isa] = kernel
        for bound, kernel in kernels.items():
            for isa in ISAS:
                _native.set_isa(isa)
                for threads in THREADS:
                    ctx = KernelContext(
                        opset=21, op_type=op, node_name="rnn", n_outputs=n_out, num_threads=threads
                    )
                    for run, inputs in enumerate((first, second, first)):
                        expected = twin(
                            KernelContext(opset=21, op_type=op, n_outputs=n_out), *inputs, **attrs
                        )
                        got = kernel.fn(ctx, *inputs, **attrs, **kernel.params)
                        _assert_same(
                            expected, got, f"bound on {bound}, run {run} on {isa}, {threads} threads"
                        )
    finally:
        _native.clear_isa()


def _check_float_kind(op, H, n_in, T, B, direction, lens, variant) -> None:
    """LSTM, GRU, OrtLSTM or OrtGRU on random inputs with bias, initial states (and
    peepholes for LSTM): the twin's bytes on every ISA and thread count."""
    rng = np.random.default_rng(H * T + B + n_in)
    base = "LSTM" if op.endswith("LSTM") else "GRU"
    D = 2 if direction == "bidirectional" else 1
    inputs = _float_inputs(
        rng,
        base,
        T=T,
        B=B,
        n_in=n_in,
        H=H,
        D=D,
        bias=True,
        lens=lens,
        h0=True,
        c0=True,
        peephole=base == "LSTM" and not op.startswith("Ort"),
        layout=0,
    )
    attrs = {"hidden_size": H, "direction": direction, "layout": 0}
    if variant:
        attrs["input_forget" if base == "LSTM" else "linear_before_reset"] = 1
    if op == "OrtGRU":
        _check_ort_gru(inputs, attrs, _assert_same)
        return
    if op != "OrtLSTM":
        _check_float(op, inputs, attrs)
        return
    _check_ort_lstm(inputs, attrs)


def test_float_lstm_twin_within_its_error_bound_of_float64():
    """(RNN1) is recursive summation: |err| <= γ_K Σ|a w| per product; the gates then
    add a few ulps (sigmoid_f32, tanh_f32 <= 1.1 ulp). With K = 300 inputs and unit-scale
    weights the float32 LSTM stays within 1e-4 of float64 over 6 steps: γ_300 ≈ 1.8e-5
    times Σ|a w| <= 15 bounds a pre-activation's error by 2.7e-4, the gates' derivatives
    (<= 1) do not grow it, and the bound is far from attained (measured 3.2e-7)."""
    from quanta.kernels.reference.rnn import lstm

    rng = np.random.default_rng(5)
    x, w, r, b = _float_inputs(
        rng, "LSTM", T=6, B=2, n_in=300, H=17, D=1, bias=True, lens=None, h0=False, c0=False, peephole=False
    )[:4]
    got = lstm(x, w, r, b, hidden_size=17)[0][:, 0]
    exact = _float64_lstm_forward(
        x.astype(np.float64), w.astype(np.float64), r.astype(np.float64), b.astype(np.float64)
    )
    err = float(np.abs(got - exact).max())
    assert 0 < err < 1e-4, err


@pytest.mark.parametrize(
    "op, attrs, expected",
    [
        ("LSTM", {"activations": ["Sigmoid", "Relu", "Tanh"]}, "defaults only"),
        ("GRU", {"activations": ["HardSigmoid", "Tanh"]}, "defaults only"),
    ],
)
def test_float_binder_refuses_other_activations(op, attrs, expected):
    rng = np.random.default_rng(0)
    inputs = _float_inputs(
        rng, op, T=2, B=1, n_in=3, H=7, D=1, bias=False, lens=None, h0=False, c0=False, peephole=False
    )
    kernel, reason = _bind_float(op, inputs, {"hidden_size": 7, **attrs})
    assert kernel is None and expected in reason


def test_onnx_node_tests_pass_on_the_twin_and_native():
    """ONNX's LSTM / GRU node tests (onnx.reference's outputs, its own order) hold for the
    twin within their tolerances, on both backends."""
    from tests.onnx_node import cases_for, run_case

    cases = cases_for({"LSTM", "GRU"})
    assert len(cases) >= 6
    for case in cases:
        run_case(case)
        model = case.model
        names = [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]
        for inputs, _ in case.data_sets:
            feeds = dict(zip(names, inputs, strict=False))
            ref = quanta.InferenceSession(model.SerializeToString(), backend="reference").run(None, feeds)
            nat = quanta.InferenceSession(model.SerializeToString()).run(None, feeds)
            for e, a in zip(ref, nat, strict=True):
                np.testing.assert_array_equal(a, e, err_msg=case.name)


def test_float_lstm_matches_onnxruntime_closely(tmp_path):
    """A bidirectional LSTM with ragged sequence lengths and initial states through
    InferenceSession: native == reference, and within 1e-5 of ONNX Runtime (same
    semantics for ended rows and Y_h / Y_c)."""
    import onnxruntime as ort

    rng = np.random.default_rng(9)
    x, w, r, b, lens, h0, c0, p = _float_inputs(
        rng, "LSTM", T=6, B=3, n_in=11, H=13, D=2, bias=True, lens=[6, 2, 0], h0=True, c0=True, peephole=True
    )
    names = ["X", "W", "R", "B", "L", "H0", "C0", "P"]
    vals = dict(zip(names, (x, w, r, b, lens, h0, c0, p), strict=True))
    node = helper.make_node("LSTM", names, ["Y", "Yh", "Yc"], hidden_size=13, direction="bidirectional")
    graph = helper.make_graph(
        [node],
        "g",
        [
            helper.make_tensor_value_info(
                n, onnx.TensorProto.INT32 if n == "L" else onnx.TensorProto.FLOAT, vals[n].shape
            )
            for n in names
            if n not in ("W", "R")
        ],
        [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in ("Y", "Yh", "Yc")],
        [onnx.numpy_helper.from_array(w, "W"), onnx.numpy_helper.from_array(r, "R")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    feeds = {n: v for n, v in vals.items() if n not in ("W", "R")}
    native = quanta.InferenceSession(model)
    assert not [f for f in native.fallbacks if f[1] == "LSTM"]
    got = native.run(None, feeds)
    ref = quanta.InferenceSession(model, backend="reference").run(None, feeds)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    expected = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )
    for a, e, o in zip(got, ref, expected, strict=True):
        np.testing.assert_array_equal(a, e)
        np.testing.assert_allclose(a, o, atol=1e-5, rtol=0)


@settings(max_examples=25, deadline=None)
@given(
    H=st.sampled_from([3, 7, 17, 130]),
    n_in=st.sampled_from([1, 7, 300]),
    T=st.sampled_from([1, 5]),
    B=st.integers(1, 3),
    direction=st.sampled_from(["forward", "reverse", "bidirectional"]),
    bias=st.booleans(),
    lens_kind=st.sampled_from(["none", "full", "ragged"]),
    h0=st.booleans(),
    lbr=st.booleans(),
    clip=st.sampled_from([None, 0.9]),
    layout=st.sampled_from([0, 1]),
    seed=st.integers(0, 2**16),
)
# batch 1 (seq_row_panels): one row's X·Wᵀ over two MLAS k blocks and 390 columns (25
# vectors: chunks of 16 and 9), the recurrence's 260 and 130 columns (17 and 9 vectors, one
# chunk each), K = 130 or 3
@example(
    H=130,
    n_in=300,
    T=1,
    B=1,
    direction="bidirectional",
    bias=True,
    lens_kind="none",
    h0=True,
    lbr=True,
    clip=None,
    layout=0,
    seed=1,
)
@example(
    H=130,
    n_in=7,
    T=5,
    B=1,
    direction="reverse",
    bias=False,
    lens_kind="full",
    h0=False,
    lbr=False,
    clip=0.9,
    layout=0,
    seed=2,
)
@example(
    H=3,
    n_in=300,
    T=5,
    B=1,
    direction="forward",
    bias=True,
    lens_kind="none",
    h0=True,
    lbr=False,
    clip=None,
    layout=0,
    seed=3,
)
def test_ort_gru_native_equals_twin(H, n_in, T, B, direction, bias, lens_kind, h0, lbr, clip, layout, seed):
    """quanta::OrtGRU (ONNX Runtime's float GRU, docs/float-ops.md (RNN-ORT-GRU)): the
    native kernel and its specialized call give the twin's bytes on every ISA and thread
    count (H 130: R's z, r columns past two 128-column panels; n_in 300: two MLAS blocks)."""
    rng = np.random.default_rng(seed)
    D = 2 if direction == "bidirectional" else 1
    lens = {"none": None, "full": [T] * B, "ragged": rng.integers(0, T + 1, B).tolist()}[lens_kind]
    inputs = _float_inputs(
        rng,
        "GRU",
        T=T,
        B=B,
        n_in=n_in,
        H=H,
        D=D,
        bias=bias,
        lens=lens,
        h0=h0,
        c0=False,
        peephole=False,
        layout=layout,
    )
    attrs = {"hidden_size": H, "direction": direction, "layout": layout, "linear_before_reset": int(lbr)}
    if clip is not None:
        attrs["clip"] = clip
    _check_ort_gru(inputs, attrs, _assert_same)


def _assert_same_nan_positions(expected, got, label: str) -> None:
    """Bytes equal where the twin is not NaN, NaN where it is (the float kernels' contract
    compares NaN positions, not payloads)."""
    assert len(expected) == len(got), label
    for name, e, a in zip(("Y", "Y_h", "Y_c")[: len(expected)], expected, got, strict=True):
        assert e.shape == a.shape and e.dtype == a.dtype, f"{label} {name}"
        nan = np.isnan(e)
        assert np.array_equal(nan, np.isnan(a)), f"{label} {name}: NaN positions differ"
        bad = (e.view(np.uint32) != a.view(np.uint32)) & ~nan
        assert not bad.any(), f"{label} {name}: {int(bad.sum())} of {e.size} differ"


def _check_ort_lstm(inputs: list, attrs: dict) -> None:
    """OrtLSTM's native kernel = the twin on every ISA and thread count."""
    from quanta.kernels.reference.ort_float import ort_lstm_op

    expected = ort_lstm_op(KernelContext(opset=21, op_type="OrtLSTM", n_outputs=3), *inputs, **attrs)
    model, node = _rnn_model("OrtLSTM", inputs, attrs, domain="quanta")
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            kernel, reason = native_kernel_for(model, node)
            assert kernel is not None and kernel.name == "native:ort_lstm_f32", reason
            for threads in THREADS:
                ctx = KernelContext(
                    opset=21, op_type="OrtLSTM", node_name="rnn", n_outputs=3, num_threads=threads
                )
                _assert_same(expected, kernel.fn(ctx, *inputs, **attrs, **kernel.params), f"{isa}, {threads}")
    finally:
        _native.clear_isa()


def _check_ort_gru(inputs: list, attrs: dict, same) -> None:
    """OrtGRU's native kernel, its specialized and direct calls = the twin on every ISA and
    thread count (``same(expected, got, label)`` compares)."""
    from quanta.kernels.reference.ort_float import ort_gru_op

    layout = attrs.get("layout", 0)
    expected = ort_gru_op(KernelContext(opset=21, op_type="OrtGRU", n_outputs=2), *inputs, **attrs)
    model, node = _rnn_model("OrtGRU", inputs, attrs, domain="quanta")
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            kernel, reason = native_kernel_for(model, node)
            assert kernel is not None and kernel.impl == "native" and kernel.name == "native:ort_gru_f32", (
                reason
            )
            for threads in THREADS:
                ctx = KernelContext(
                    opset=21, op_type="OrtGRU", node_name="rnn", n_outputs=2, num_threads=threads
                )
                same(expected, kernel.fn(ctx, *inputs, **attrs, **kernel.params), f"{isa}, {threads}")
                sig = Specialization(
                    shapes=tuple(None if a is None else a.shape for a in inputs),
                    dtypes=tuple(None if a is None else a.dtype for a in inputs),
                    consts=tuple(None if a is None or k in (0, 5) else a for k, a in enumerate(inputs)),
                    out_shape=None,
                    out_dtype=None,
                    out=None,
                    num_threads=threads,
                    ctx=ctx,
                )
                fast = kernel.specialize(sig, **attrs, **kernel.params)
                assert (fast is None) == bool(layout)
                if fast is not None:
                    same(expected, fast(ctx, *inputs), f"specialized, {isa}, {threads}")
                    same(expected, _direct_call(fast, inputs), f"direct, {isa}, {threads}")
    finally:
        _native.clear_isa()


@pytest.mark.parametrize(("H", "n_in"), [(7, 3), (17, 3), (33, 5)])
@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize(("bias", "clip"), [(True, None), (False, None), (True, 2.5), (False, 2.5)])
def test_ort_gru_gate_rows_saturate_and_keep_nan_as_the_twin(H, n_in, lbr, bias, clip):
    """OrtGRU's gate rows (recurrent.h Kernels::ort_gru_reset / ort_gru_update, a vector of
    lanes at a time, scalar or masked tails at H 7, 17, 33): pre-activations far past ORT's
    clamps (±20 in Rσ, ±10 in Rt, ±18 in MLAS's logistic) and the clip, ±inf and NaN in X
    (with a bias the clip turns NaN into clip, without one it stays), two directions,
    a sequence that ends early: the twin's bytes, NaN where the twin has NaN, on every ISA
    and thread count."""
    rng = np.random.default_rng(H * 10 + lbr)
    inputs = _float_inputs(
        rng, "GRU", T=4, B=2, n_in=n_in, H=H, D=2, bias=bias, lens=[4, 2], h0=True, c0=False, peephole=False
    )
    inputs[1] = (inputs[1] * 40).astype(F32)  # gates well past the clamps
    inputs[0][0, 1, 0] = np.inf
    inputs[0][1, 1, 2] = -np.inf
    inputs[0][3, 0, 1] = np.nan  # the last step of the row that runs 4 steps
    attrs = {"hidden_size": H, "direction": "bidirectional", "linear_before_reset": lbr}
    if clip is not None:
        attrs["clip"] = clip
    _check_ort_gru(inputs, attrs, _assert_same_nan_positions)
