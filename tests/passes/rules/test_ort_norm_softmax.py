"""ONNX Runtime's Softmax, LayerNorm family and FastGelu (passes/rules/ort_float_functions.py,
reference/ort_float.py, docs/float-ops.md (SM1)-(SM5), (OL1)-(OL9), (FG1)).

- Twins: onnxruntime's kernels bit for bit (Softmax, LayerNormalization, ORT's contrib
  SimplifiedLayerNormalization and SkipLayerNormalization, FastGelu) on odd rows, rows on
  both sides of ORT's kernel switches (8 for LayerNormalization, 16 for the simplified
  kernel) and rows past 1024; quanta's own algorithms are not.
- Native (``mlas_softmax_f32``, ``ort_layer_norm_f32``, ``unary_f32("fast_gelu_ort")``):
  the twin on every ISA and thread count.
- Rules: under ``float_functions="ort"`` the session writes the ORT ops and runs ORT's bits
  on both backends; the written-out norms ORT fuses (LayerNorm with scale and bias, RMS
  norm with a scale) too; ``"onnx"`` keeps ONNX's operators.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.kernels import _native
from quanta.kernels.reference.float_ops import layer_norm_rows, softmax_rows
from quanta.kernels.reference.ort_float import (
    mlas_softmax_rows,
    ort_fast_gelu,
    ort_layer_norm_rows,
)
from quanta.quantize.ort_saturation import onnxruntime_softmax_avx512f, onnxruntime_softmax_modelled
from quanta.session import InferenceSession, SessionOptions

ISAS = list(_native.supported_isas())
# odd rows, ORT's switches (8, 16), one packet, rows past 1024
LENGTHS = [1, 3, 7, 8, 9, 15, 16, 17, 24, 259, 768, 1031]
F32 = np.float32


def data(shape, seed=0, spread=3.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * spread + rng.standard_normal((*shape[:-1], 1)) * 3).astype(F32)


def ort_run(nodes, inputs, inits, opset=17, producer=""):
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in inputs],
        [helper.make_tensor_value_info(nodes[-1].output[0], TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in inits],
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 8
    m.producer_name = producer
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    sess = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return m, sess.run(None, dict(inputs))[0]


def bits_equal(a, b):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint32), np.asarray(b).view(np.uint32))


#: the Softmax twin is MLAS's FMA3 kernel family on an AVX2 host and its AVX-512F one on an
#: AVX-512F host ((SX1), (SX2)), chosen by the host; another x86 host (no AVX2 / FMA)
#: runs MLAS's SSE or AVX kernels, not modelled (docs/float-ops.md (SM1)-(SM5))
SOFTMAX_TWIN_IS_HOSTS_ORT = onnxruntime_softmax_modelled()
#: Softmax rows of the differential tests: odd, one zmm (16) and around it, past the 48 of
#: MLAS's AVX-512F main loop, past 258 and 1024
SOFTMAX_LENGTHS = [1, 7, 15, 16, 17, 31, 33, 49, 259, 768, 1031]


def softmax_equal(got, want):
    """Bits where the twin models this host's ORT Softmax kernels; else normal outputs
    within 4 ulps (rtol 5e-7) and subnormal ones within the smallest normal float32."""
    if SOFTMAX_TWIN_IS_HOSTS_ORT:
        bits_equal(got, want)
    else:
        np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=5e-7, atol=np.finfo(F32).tiny)


@pytest.mark.parametrize("n", LENGTHS)
def test_twins_are_onnxruntime_bit_for_bit(n):
    x = data((11, n), seed=n)
    rng = np.random.default_rng(n + 1)
    sc, bi, sk = rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32), data((11, n), seed=7)
    ln = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)
    bits_equal(
        ort_layer_norm_rows(x, sc, bi, 1e-5, "layer_norm"),
        ort_run([ln], [("x", x)], [("s", sc), ("b", bi)])[1],
    )
    ln = helper.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-5)
    bits_equal(
        ort_layer_norm_rows(x, sc, None, 1e-5, "layer_norm"), ort_run([ln], [("x", x)], [("s", sc)])[1]
    )
    sln = helper.make_node("SimplifiedLayerNormalization", ["x", "s"], ["y"], axis=-1, epsilon=1e-6)
    bits_equal(
        ort_layer_norm_rows(x, sc, None, 1e-6, "simplified"), ort_run([sln], [("x", x)], [("s", sc)])[1]
    )
    skip = helper.make_node(
        "SkipLayerNormalization", ["x", "k", "s", "b", "bb"], ["y"], domain="com.microsoft", epsilon=1e-12
    )
    want = ort_run([skip], [("x", x), ("k", sk)], [("s", sc), ("b", bi), ("bb", bi[::-1].copy())])[1]
    bits_equal(ort_layer_norm_rows((x + sk) + bi[::-1], sc, bi, 1e-12, "skip"), want)
    sm = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    softmax_equal(mlas_softmax_rows(x * 5), ort_run([sm], [("x", x * 5)], [], opset=13)[1])
    fg = helper.make_node("FastGelu", ["x"], ["y"], domain="com.microsoft")
    bits_equal(ort_fast_gelu(x), ort_run([fg], [("x", x)], [])[1])


def test_quantas_own_algorithms_are_not_orts():
    x = data((64, 768), seed=3)
    sc, bi = np.ones(768, F32), np.zeros(768, F32)
    ln = helper.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)
    want = ort_run([ln], [("x", x)], [("s", sc), ("b", bi)])[1]
    d, _, inv = layer_norm_rows(x, F32(1e-5))
    assert np.count_nonzero((d * inv[:, None]) != want) > 100
    sm = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    assert np.count_nonzero(softmax_rows(x * 5) != ort_run([sm], [("x", x * 5)], [], opset=13)[1]) > 100


@pytest.mark.parametrize("n", LENGTHS)
def test_native_kernels_are_the_twins_on_every_isa_and_thread_count(n):
    x = data((13, n), seed=2 * n)
    rng = np.random.default_rng(n)
    sc, bi = rng.standard_normal(n).astype(F32), rng.standard_normal(n).astype(F32)
    wants = {
        "layer_norm": ort_layer_norm_rows(x, sc, bi, 1e-5, "layer_norm"),
        "skip": ort_layer_norm_rows(x, sc, bi, 1e-5, "skip"),
        "simplified": ort_layer_norm_rows(x, sc, None, 1e-5, "simplified"),
    }
    no_bias = ort_layer_norm_rows(x, sc, None, 1e-5, "layer_norm")
    soft, gelu = mlas_softmax_rows(x * 7), ort_fast_gelu(x)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                for kernel, want in wants.items():
                    b = None if kernel == "simplified" else bi
                    bits_equal(_native.ort_layer_norm_f32(x, sc, b, -1, 1e-5, kernel, threads), want)
                bits_equal(_native.ort_layer_norm_f32(x, sc, None, -1, 1e-5, "layer_norm", threads), no_bias)
                bits_equal(_native.mlas_softmax_f32(x * 7, threads), soft)
                bits_equal(_native.unary_f32("fast_gelu_ort", x, threads), gelu)
    finally:
        _native.clear_isa()


def subnormal_rows(d, seed):
    """Rows [9, d] spread over ~200 (every third element 60 lower), so that many of the
    exps fall below the smallest normal float32 and both lower clamps (-88.38 and -103.97)
    are reached."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((9, d)) * 30 + rng.standard_normal((9, 1)) * 5).astype(F32)
    x[:, ::3] -= 60
    return x


def subnormals(y):
    return int(np.count_nonzero((y > 0) & (y < np.finfo(F32).tiny)))


@pytest.mark.parametrize("n", SOFTMAX_LENGTHS)
def test_softmax_twin_is_this_hosts_onnxruntime_with_subnormals(n):
    """The host's order bit for bit, and the other host's order is not (it differs in the
    subnormal outputs, where only vscalefps rounds p · 2^m once, and in the lane sum)."""
    x = subnormal_rows(n, seed=n)
    sm = helper.make_node("Softmax", ["x"], ["y"], axis=-1)
    want = ort_run([sm], [("x", x)], [], opset=13)[1]
    host = mlas_softmax_rows(x)
    softmax_equal(host, want)
    bits_equal(host, mlas_softmax_rows(x, onnxruntime_softmax_avx512f()))
    if n > 1:
        assert subnormals(want) > 0
        other = mlas_softmax_rows(x, not onnxruntime_softmax_avx512f())
        assert np.count_nonzero(other.view(np.uint32) != host.view(np.uint32)) > 0


@pytest.mark.parametrize("n", SOFTMAX_LENGTHS)
def test_native_softmax_is_both_hosts_twin_on_every_isa_and_thread_count(n):
    """mlas_softmax_f32(avx512f=0 / 1): the AVX2 / AVX-512F host's twin on every ISA (the
    AVX-512F order in AVX-512 on avx512vnni, in scalar code elsewhere); avx512f=-1 (the
    default): this host's, as the twin's default."""
    x = subnormal_rows(n, seed=3 * n + 1)
    wants = {a: mlas_softmax_rows(x, bool(a)) for a in (0, 1)}
    host = mlas_softmax_rows(x)
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for threads in (1, 2):
                for a, want in wants.items():
                    bits_equal(_native.mlas_softmax_f32(x, threads, avx512f=a), want)
                bits_equal(_native.mlas_softmax_f32(x, threads), host)
    finally:
        _native.clear_isa()


def test_native_softmax_keeps_nan_and_inf_rows_as_the_twin():
    x = data((6, 19), seed=5)
    x[1, 3] = np.nan
    x[2, :] = -np.inf
    x[3, 7] = np.inf
    x[4, :] = 100.0
    try:
        for isa in ISAS:
            _native.set_isa(isa)
            for a in (0, 1):
                np.testing.assert_array_equal(
                    _native.mlas_softmax_f32(x, 1, avx512f=a), mlas_softmax_rows(x, bool(a))
                )
    finally:
        _native.clear_isa()


def transformer_block(opset=17, skip=True):
    """x -> SkipLayerNormalization(x, r) -> FastGelu -> LayerNormalization -> Softmax, and a
    written-out LayerNorm (scale, bias) and RMS norm (scale) of the result."""
    n = 40
    rng = np.random.default_rng(4)
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, F32), name)  # noqa: E731
    nodes = [
        helper.make_node(
            "SkipLayerNormalization", ["x", "r", "g1", "b1"], ["s"], domain="com.microsoft", epsilon=1e-12
        )
        if skip
        else helper.make_node("Add", ["x", "r"], ["s"]),
        helper.make_node("FastGelu", ["s"], ["f"], domain="com.microsoft"),
        helper.make_node("LayerNormalization", ["f", "g2", "b2"], ["l"], axis=-1, epsilon=1e-5),
        helper.make_node("Softmax", ["l"], ["p"], axis=-1),
        helper.make_node("ReduceMean", ["p"], ["mu"], axes=[-1]),
        helper.make_node("Sub", ["p", "mu"], ["d"]),
        helper.make_node("Pow", ["d", "two"], ["d2"]),
        helper.make_node("ReduceMean", ["d2"], ["var"], axes=[-1]),
        helper.make_node("Add", ["var", "eps"], ["ve"]),
        helper.make_node("Sqrt", ["ve"], ["sd"]),
        helper.make_node("Div", ["d", "sd"], ["n0"]),
        helper.make_node("Mul", ["n0", "g3"], ["n1"]),
        helper.make_node("Add", ["n1", "b3"], ["n2"]),
        helper.make_node("Pow", ["n2", "two"], ["q2"]),
        helper.make_node("ReduceMean", ["q2"], ["ms"], axes=[-1]),
        helper.make_node("Add", ["ms", "eps"], ["me"]),
        helper.make_node("Sqrt", ["me"], ["rms"]),
        helper.make_node("Div", ["n2", "rms"], ["r0"]),
        helper.make_node("Mul", ["g4", "r0"], ["y"]),
    ]
    inits = [c("two", 2.0), c("eps", 1e-6)]
    inits += [c(f"g{k}", rng.standard_normal(n)) for k in (1, 2, 3, 4)]
    inits += [c(f"b{k}", rng.standard_normal(n)) for k in (1, 2, 3)]
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info(v, TensorProto.FLOAT, [2, 5, n]) for v in ("x", "r")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid("com.microsoft", 1)]
    )
    m.ir_version = 8
    return m


@pytest.mark.parametrize("backend", ["native", "reference"])
def test_session_runs_orts_kernels_with_ort_float_functions(backend):
    proto = transformer_block()
    feeds = {"x": data((2, 5, 40), seed=1), "r": data((2, 5, 40), seed=2)}
    so = ort.SessionOptions()
    so.log_severity_level = 3
    want = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(
        None, feeds
    )[0]
    for threads in (1, 2):
        opts = SessionOptions(float_functions="ort")
        opts.intra_op_num_threads = threads
        sess = InferenceSession(proto, opts, backend=backend)
        ops = [n.op_type for n in sess.model.graph.nodes]
        assert {"OrtLayerNorm", "MlasSoftmax", "OrtFastGelu"} <= set(ops), ops
        assert ops.count("OrtLayerNorm") == 4, ops
        assert sess.fallbacks == [] or backend == "reference"
        got = sess.run(None, feeds)[0]
        if SOFTMAX_TWIN_IS_HOSTS_ORT:
            bits_equal(got, want)
        else:  # the Softmax's ulps pass through the two norms after it: a float32 bound
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
            bits_equal(got, InferenceSession(proto, opts, backend="reference").run(None, feeds)[0])
    plain = InferenceSession(proto, SessionOptions(float_functions="onnx"), backend=backend)
    ops = {n.op_type for n in plain.model.graph.nodes}
    assert not ops & {"OrtLayerNorm", "MlasSoftmax", "OrtFastGelu"}, ops
    assert np.count_nonzero(plain.run(None, feeds)[0] != want) > 0


def test_a_norm_ort_does_not_fuse_is_left_with_its_reason():
    """A LayerNorm written out without its affine tail: ORT runs the ops as written."""
    from quanta.ir.onnx_io import load
    from quanta.passes.rules.ort_float_functions import OrtFloatFunctions
    from tests.passes.helpers import run_passes
    from tests.passes.rules.test_ort_reduce import layer_norm_proto

    p = OrtFloatFunctions()
    run_passes(load(layer_norm_proto()), [p])
    assert "no constant scale (and bias) after the norm: ORT does not fuse it" in [
        r.reason for r in p.why_not("WrittenLayerNormToOrtLayerNorm")
    ]


def test_profiled_session_runs_the_specialized_ort_kernels():
    """A profiled run calls each step's guarded wrapper, not its direct call: the
    wrapper passes a specialization that reads x alone (OrtLayerNorm's) x alone, as the
    fast loop does (it passed every input, a TypeError)."""
    proto = transformer_block()
    feeds = {"x": data((2, 5, 40), seed=1), "r": data((2, 5, 40), seed=2)}
    fast = SessionOptions(float_functions="ort")
    fast.intra_op_num_threads = 1
    want = InferenceSession(proto, fast).run(None, feeds)[0]
    opts = SessionOptions(float_functions="ort", enable_profiling=True)
    opts.intra_op_num_threads = 1
    sess = InferenceSession(proto, opts)
    assert "OrtLayerNorm" in {n.op_type for n in sess.model.graph.nodes}
    for _ in range(3):  # the first run sees the signature, the next ones run its specialization
        bits_equal(sess.run(None, feeds)[0], want)
    assert any(s.op_type == "OrtLayerNorm" for s in sess.profile_summary(100).steps)
