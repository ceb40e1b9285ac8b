"""A group of integer elementwise ops on one tensor's 8-bit codes becomes one 256-entry
table (passes/lower/code_maps8.py ComposeCodeMaps8, docs/passes.md (T7)).

The models are QDQ files as quanta's static quantizer writes PP-OCR's recognizer: a
HardSwish-like activation scaled and shifted by learnt one-element weights (``w0 · x +
w1``, each a DequantizeLinear of a uint8 constant), each op between Q / DQ pairs, and
SiLU (``x · Sigmoid(x)``). The composed session must give the bytes of the same session
with the rule refused (the unfused steps) and of the reference backend, on every ISA, at
1 and 2 threads; the feed covers every code of the group's input.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
import quanta.passes.lower.code_maps8 as code_maps8
from quanta.passes.pattern import NoMatch

F32 = np.float32
native = pytest.importorskip("quanta.kernels._native")
ISAS = [i for i in ("portable", "avx2", "avx512vnni") if i in native.supported_isas()]


@pytest.fixture(params=ISAS)
def isa(request):
    native.set_isa(request.param)
    yield request.param
    native.clear_isa()


def _model(
    dt, shape, *, silu: bool = False, leak: bool = False, w0_size: int = 1, two_inputs: bool = False
) -> bytes:
    """x -> Q/DQ -> Mul(DQ(w0), x) -> Q/DQ -> Add(., DQ(w1)) -> Q/DQ [-> x · Sigmoid(x),
    each -> Q/DQ] -> out. ``leak``: the Mul's result is also a graph output; ``w0_size``:
    elements of w0 (along axis 1 when > 1); ``two_inputs``: the Add's other operand is a
    second input."""
    inits, nodes = [], []
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))]
    outputs = [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)]
    signed = dt is np.int8

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def qdq(src, name, scale, zp):
        z = const(f"{name}_z", dt(zp))
        nodes.append(
            helper.make_node("QuantizeLinear", [src, const(f"{name}_s", F32(scale)), z], [f"{name}_q"])
        )
        nodes.append(helper.make_node("DequantizeLinear", [f"{name}_q", f"{name}_s", z], [f"{name}_d"]))
        return f"{name}_d"

    def weight(name, codes, scale, zp):
        nodes.append(
            helper.make_node(
                "DequantizeLinear",
                [
                    const(f"{name}_q", codes.astype(dt)),
                    const(f"{name}_s", F32(scale)),
                    const(f"{name}_z", dt(zp)),
                ],
                [f"{name}_d"],
            )
        )
        return f"{name}_d"

    # distinct scales, non-zero zero points
    zx, zm, za, zs, zy = (-7, 11, -19, -128, 5) if signed else (121, 7, 19, 0, 133)
    h = qdq("x", "x", 0.0231, zx)
    top = 127 if signed else 255  # the weights' codes in x's storage, as the quantizer writes them
    w0 = np.full((w0_size,), top) if w0_size == 1 else np.arange(top - w0_size, top)
    w0d = weight("w0", w0.reshape((w0_size, 1, 1)) if w0_size > 1 else w0, 0.0025601801, 0)
    nodes.append(helper.make_node("Mul", [w0d, h], ["mul"]))
    m = qdq("mul", "mul", 0.01392581, zm)
    if leak:
        nodes.append(helper.make_node("Identity", [m], ["mul_out"]))
        outputs.append(helper.make_tensor_value_info("mul_out", TensorProto.FLOAT, None))
    other = weight("w1", np.array([top]), 0.00028938398, 0)
    if two_inputs:
        inputs.append(helper.make_tensor_value_info("x2", TensorProto.FLOAT, list(shape)))
        other = qdq("x2", "x2", 0.0177, zx + 3)
    nodes.append(helper.make_node("Add", [m, other], ["add"]))
    y = qdq("add", "add", 0.0127144605, za)
    if silu:
        nodes.append(helper.make_node("Sigmoid", [y], ["sig"]))
        s = qdq("sig", "sig", 1.0 / 256, zs)
        nodes.append(helper.make_node("Mul", [y, s], ["silu"]))
        y = qdq("silu", "silu", 0.0093, zy)
    nodes.append(helper.make_node("Identity", [y], ["out"]))
    graph = helper.make_graph(nodes, "affine8", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    model.ir_version = 10
    return model.SerializeToString()


def _refused(monkeypatch):
    monkeypatch.setattr(code_maps8.ComposeCodeMaps8, "check", lambda self, m: NoMatch("refused by the test"))


def _every_code(dt, shape, scale=0.0231, seed=1):
    """x whose codes at x's quantization are the codes of dt in a shuffled order, repeated
    to fill ``shape`` (every code when it has 256 elements or more), plus values beyond
    both ends (saturation)."""
    info = np.iinfo(dt)
    zx = -7 if dt is np.int8 else 121
    n = int(np.prod(shape))
    codes = np.random.default_rng(seed).permutation(np.arange(info.min, info.max + 1, dtype=np.int64))
    codes = np.resize(codes, n)
    x = ((codes - zx) * np.float64(scale)).astype(F32)
    x[:2] = [-1e4, 1e4]
    return x.reshape(shape)


def _steps(sess):
    return [s.node.op_type for s in sess.plan.steps]


def _fired(sess) -> int:
    assert sess.plan.passes is not None
    return sum(r.stats.get("ComposeCodeMaps8", 0) for r in sess.plan.passes.records)


def _opts(threads):
    o = quanta.SessionOptions()
    o.intra_op_num_threads = threads
    return o


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("dt", [np.uint8, np.int8])
@pytest.mark.parametrize("shape", [(1, 7, 5, 3), (2, 17, 9, 4), (1, 259, 3, 2)])
def test_scalar_affine_is_one_table_with_the_unfused_bytes(isa, dt, shape, threads, monkeypatch):
    blob = _model(dt, shape)
    x = {"x": _every_code(dt, shape)}
    sess = quanta.InferenceSession(blob, _opts(threads))
    assert _steps(sess).count("QLinearLookup") == 1, _steps(sess)
    assert not {"QLinearMul", "QLinearAdd"} & set(_steps(sess)), _steps(sess)
    got = sess.run(None, x)[0]
    _refused(monkeypatch)
    plain = quanta.InferenceSession(blob, _opts(threads))
    ref = quanta.InferenceSession(blob, backend="reference")
    if dt is np.uint8:  # int8: LowerLookup already makes the float group one table
        assert {"QLinearMul", "QLinearAdd"} <= set(_steps(plain)), _steps(plain)
        assert "QLinearMul" in _steps(ref)
    want, twin = plain.run(None, x)[0], ref.run(None, x)[0]
    assert got.tobytes() == want.tobytes() == twin.tobytes()
    assert len(np.unique(got)) > 10  # the group is not flat over the codes


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_silu_reading_its_input_twice_composes_with_the_affine(isa, dt, monkeypatch):
    shape = (1, 100, 3, 1)
    blob = _model(dt, shape, silu=True)
    x = {"x": _every_code(dt, shape)}
    sess = quanta.InferenceSession(blob)
    assert _fired(sess) >= 1
    assert not {"QLinearMul", "QLinearAdd", "QLinearSigmoid"} & set(_steps(sess)), _steps(sess)
    assert _steps(sess).count("QLinearLookup") == 1, _steps(sess)
    got = sess.run(None, x)[0]
    _refused(monkeypatch)
    plain = quanta.InferenceSession(blob)
    assert "QLinearSigmoid" in _steps(plain) and "QLinearMul" in _steps(plain), _steps(plain)
    ref = quanta.InferenceSession(blob, backend="reference")
    assert got.tobytes() == plain.run(None, x)[0].tobytes() == ref.run(None, x)[0].tobytes()


def test_an_intermediate_used_outside_stays_materialized(isa, monkeypatch):
    dt, shape = np.uint8, (1, 17, 4, 2)
    blob = _model(dt, shape, leak=True)
    x = {"x": _every_code(dt, shape)}
    sess = quanta.InferenceSession(blob)
    # the Mul's codes are a graph output: it becomes a table of its own, the Add another
    assert _steps(sess).count("QLinearLookup") == 2, _steps(sess)
    got = sess.run(None, x)
    _refused(monkeypatch)
    want = quanta.InferenceSession(blob).run(None, x)
    assert len(got) == len(want) == 2
    assert all(a.tobytes() == b.tobytes() for a, b in zip(got, want, strict=True))


def test_a_per_channel_weight_and_a_second_tensor_are_refused(isa, monkeypatch):
    dt, shape = np.uint8, (1, 7, 5, 3)
    for blob, feed in (
        (_model(dt, shape, w0_size=7), {"x": _every_code(dt, shape)}),
        (
            _model(dt, shape, two_inputs=True),
            {"x": _every_code(dt, shape), "x2": _every_code(dt, shape, seed=2)},
        ),
    ):
        sess = quanta.InferenceSession(blob)
        got = sess.run(None, feed)[0]
        _refused(monkeypatch)
        want = quanta.InferenceSession(blob).run(None, feed)[0]
        monkeypatch.undo()
        assert got.tobytes() == want.tobytes()
    # the per-channel Mul stays; the one-element Add after it is a table
    steps = _steps(quanta.InferenceSession(_model(dt, shape, w0_size=7)))
    assert "QLinearMul" in steps and "QLinearLookup" in steps, steps
    # the Add of two tensors stays; the Mul before it is a table
    steps = _steps(quanta.InferenceSession(_model(dt, shape, two_inputs=True)))
    assert "QLinearAdd" in steps and "QLinearLookup" in steps, steps


# ---- the rule's reasons ----------------------------------------------------------------


def _reasons(blob: bytes, monkeypatch) -> list[str]:
    """The NoMatch reasons ComposeCodeMaps8 gave while a session compiled ``blob``."""
    reasons: list[str] = []
    check = code_maps8.ComposeCodeMaps8.check

    def recording(self, m):
        r = check(self, m)
        if isinstance(r, NoMatch):
            reasons.append(r.reason)
        return r

    monkeypatch.setattr(code_maps8.ComposeCodeMaps8, "check", recording)
    quanta.InferenceSession(blob)
    monkeypatch.undo()
    return reasons


def test_reasons(monkeypatch):
    shape = (1, 7, 5, 3)
    r = _reasons(_model(np.uint8, shape, two_inputs=True), monkeypatch)
    assert any(x.startswith("the group reads two tensors (") for x in r), r
    r = _reasons(_model(np.uint8, shape, w0_size=7), monkeypatch)
    assert any("has more than one element (a table per channel)" in x for x in r), r
    r = _reasons(_model(np.uint8, shape, silu=True), monkeypatch)
    assert "one table op: nothing to compose" in r, r  # the Sigmoid alone, before its Mul joins it


def _qoperator_silu(dt, *, const_rank: int | None = None) -> bytes:
    """ONNX Runtime's QOperator SiLU (YOLOv8 / nudenet_320n.ort_qop): x -> QuantizeLinear ->
    com.microsoft QLinearSigmoid -> QLinearMul(x, sigmoid) -> DequantizeLinear, with x
    declared without a shape, so shape inference leaves every code tensor's shape unknown.
    ``const_rank``: a QLinearMul by a one-element constant of that rank follows."""
    signed = dt is np.int8
    zx, zs, zy, zc = (-7, -128, 5, 3) if signed else (121, 0, 133, 9)
    inits = [
        numpy_helper.from_array(np.asarray(v, t), n)
        for n, v, t in (
            ("sx", 0.0231, F32),
            ("zx", zx, dt),
            ("ss", 1 / 256, F32),
            ("zs", zs, dt),
            ("sy", 0.0173, F32),
            ("zy", zy, dt),
        )
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        helper.make_node("QLinearSigmoid", ["xq", "sx", "zx", "ss", "zs"], ["sq"], domain="com.microsoft"),
        helper.make_node(
            "QLinearMul", ["xq", "sx", "zx", "sq", "ss", "zs", "sy", "zy"], ["yq"], domain="com.microsoft"
        ),
    ]
    out = "yq"
    if const_rank is not None:
        inits += [
            numpy_helper.from_array(np.full((1,) * const_rank, 77, dt), "cq"),
            numpy_helper.from_array(F32(0.011), "sc"),
            numpy_helper.from_array(np.asarray(zc, dt), "zc"),
            numpy_helper.from_array(F32(0.0191), "sz"),
            numpy_helper.from_array(np.asarray(zx, dt), "zz"),
        ]
        nodes.append(
            helper.make_node(
                "QLinearMul", ["yq", "sy", "zy", "cq", "sc", "zc", "sz", "zz"], ["zq"], domain="com.microsoft"
            )
        )
        out = "zq"
    nodes.append(
        helper.make_node(
            "DequantizeLinear",
            [out, "sz" if const_rank is not None else "sy", "zz" if const_rank is not None else "zy"],
            ["out"],
        )
    )
    g = helper.make_graph(
        nodes,
        "qop_silu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        inits,
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(g, opset_imports=opsets).SerializeToString()


@pytest.mark.parametrize("dt", [np.uint8, np.int8])
def test_qoperator_silu_of_unknown_shape_is_one_table(isa, dt, monkeypatch):
    """Failure signature: nudenet_320n.ort_qop ran its 58 SiLUs as QLinearSigmoid +
    QLinearMul (two passes each, 1.17x quanta's own file): "its result is not of the shape
    of ...", the QLinearMul's shape being unknown to shape inference. An elementwise member
    of x and group values has x's shape whatever inference knows."""
    shape = (1, 17, 5, 3)
    blob = _qoperator_silu(dt)
    x = {"x": _every_code(dt, shape)}
    sess = quanta.InferenceSession(blob, _opts(2))
    assert _steps(sess).count("QLinearLookup") == 1 and len(_steps(sess)) <= 3, _steps(sess)
    got = sess.run(None, x)[0]
    _refused(monkeypatch)
    plain = quanta.InferenceSession(blob, _opts(2))
    assert {"QLinearSigmoid", "QLinearMul"} <= set(_steps(plain)), _steps(plain)
    ref = quanta.InferenceSession(blob, backend="reference")
    assert got.tobytes() == plain.run(None, x)[0].tobytes() == ref.run(None, x)[0].tobytes()
    assert len(np.unique(got)) > 10


def test_a_higher_rank_constant_on_an_unknown_shape_is_refused(monkeypatch):
    """A one-element constant of rank 5 broadcasts a tensor of unknown rank (maybe 4) to
    rank 5: the table would keep x's shape, so the group is refused there."""
    r = _reasons(_qoperator_silu(np.uint8, const_rank=5), monkeypatch)
    assert "(QLinearMul): its result is not of the shape of 'xq' (output of (QuantizeLinear))" in r, r
