"""TransposeAsView: an attention's head Transposes read only by run-time-b integer GEMMs
become quanta::TransposeView (a strided view, no copy), bit for bit the graph with the
copies (reference twin and native session on every ISA the CPU runs, 1 and 2 threads,
native programs included: several runs of one signature, then another signature); the
refusals with their reasons; and a batch of views that do not merge going to the
generic kernel."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage
from quanta.kernels import _native
from quanta.passes.lower.transpose_view import TransposeAsView, TransposeAsViewPass
from quanta.passes.pattern import RewritePass
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.session import InferenceSession, SessionOptions
from tests.passes.helpers import run_passes, run_ref

H, DH = 3, 17  # heads, head size (odd: no tile-aligned strides)


def attention(
    *, batch: int | str = 1, q_perm=(0, 2, 1, 3), const_k: bool = False, extra_reader: bool = False
):
    """q, k, v [B, S, H, DH] uint8 codes -> Q·Kᵀ (MatMulIntegerToFloat, float scores) and
    P·V (QLinearMatMul of the scores' codes p [B, H, S, S] and V) with the head
    Transposes in between; S is symbolic."""
    seq = "S"
    shape = [batch, seq, H, DH]
    u8 = TensorProto.UINT8
    f32 = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("qf", f32, shape),
        helper.make_tensor_value_info("vf", f32, shape),
        helper.make_tensor_value_info("pf", f32, [batch, H, seq, seq]),
    ]
    inits = [
        numpy_helper.from_array(np.float32(0.0173), "sq"),
        numpy_helper.from_array(np.float32(0.0219), "sk"),
        numpy_helper.from_array(np.array(131, np.uint8), "zq"),
        numpy_helper.from_array(np.array(117, np.uint8), "zk"),
        numpy_helper.from_array(np.float32(1 / 255), "sp"),
        numpy_helper.from_array(np.array(0, np.uint8), "zp"),
        numpy_helper.from_array(np.float32(0.0311), "sv"),
        numpy_helper.from_array(np.array(125, np.uint8), "zv"),
        numpy_helper.from_array(np.float32(0.0297), "so"),
        numpy_helper.from_array(np.array(122, np.uint8), "zo"),
    ]
    # the codes come from QuantizeLinear: quantized values, as a lowered graph's are
    nodes = [
        helper.make_node("QuantizeLinear", [f"{x}f", f"s{x}", f"z{x}"], [x], name=f"quant_{x}") for x in "qvp"
    ]
    nodes.append(helper.make_node("Transpose", ["q"], ["qt"], perm=list(q_perm), name="tq"))
    if const_k:  # Kᵀ a constant: the prepacked GEMM
        kt = np.random.default_rng(1).integers(0, 256, (1, H, DH, 5)).astype(np.uint8)
        inits.append(numpy_helper.from_array(kt, "kt"))
    else:
        inputs.insert(1, helper.make_tensor_value_info("kf", f32, shape))
        nodes.append(helper.make_node("QuantizeLinear", ["kf", "sk", "zk"], ["k"], name="quant_k"))
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 3, 1], name="tk"))
    nodes += [
        helper.make_node("Transpose", ["v"], ["vt"], perm=[0, 2, 1, 3], name="tv"),
        helper.make_node(
            "MatMulIntegerToFloat",
            ["qt", "kt", "sq", "sk", "zq", "zk"],
            ["scores"],
            name="qk",
            domain="com.microsoft",
        ),
        helper.make_node(
            "QLinearMatMul", ["p", "sp", "zp", "vt", "sv", "zv", "so", "zo"], ["ctx"], name="pv"
        ),
    ]
    outputs = [
        helper.make_tensor_value_info("scores", TensorProto.FLOAT, None),
        helper.make_tensor_value_info("ctx", u8, None),
    ]
    if extra_reader:
        nodes.append(helper.make_node("Identity", ["vt"], ["vt_copy"], name="other"))
        outputs.append(helper.make_tensor_value_info("vt_copy", u8, None))
    g = helper.make_graph(nodes, "attn", inputs, outputs, inits)
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )


def feeds(batch: int, seq: int, seed: int = 0) -> dict[str, np.ndarray]:
    """Floats spread over every code of their QuantizeLinear (and past both ends)."""
    rng = np.random.default_rng(seed)
    shape = (batch, seq, H, DH)
    out = {f"{x}f": (rng.standard_normal(shape) * 2.5).astype(np.float32) for x in "qkv"}
    out["pf"] = rng.random((batch, H, seq, seq)).astype(np.float32)
    return out


@pytest.mark.parametrize("batch", [1, 2])
def test_views_are_bit_exact_reference_and_native(batch):
    proto = attention(batch="B")
    model = load(proto)
    result = run_passes(model, [TransposeAsViewPass(), EliminateDead()], stage=Stage.LOWERED)
    assert result.fired("TransposeAsView") == 3
    assert sorted(n.op_type for n in model.graph.nodes).count("TransposeView") == 3
    signatures = [feeds(batch, 7, 1), feeds(batch, 7, 2), feeds(batch, 33, 3), feeds(batch, 7, 4)]
    expected = [run_ref(proto, f) for f in signatures]
    for f, e in zip(signatures, expected, strict=True):
        got = run_ref(model, f)
        for g, x in zip(got, e, strict=True):
            assert g.tobytes() == x.tobytes()
    for isa in _native.supported_isas():
        _native.set_isa(isa)
        try:
            for threads in (1, 2):
                opts = SessionOptions()
                opts.intra_op_num_threads = threads
                sess = InferenceSession(proto, opts, backend="native")
                kernels = [s.kernel.name for s in sess.plan.steps]
                assert kernels.count("native:view(TransposeView)") == 3, kernels
                for _ in range(2):  # a signature's runs after its measuring run: native programs
                    for f, e in zip(signatures, expected, strict=True):
                        got = sess.run(None, f)
                        for g, x in zip(got, e, strict=True):
                            assert g.tobytes() == x.tobytes(), f"{isa} threads={threads} batch={batch}"
        finally:
            _native.clear_isa()


@pytest.mark.parametrize(
    ("kwargs", "node", "reason"),
    [
        ({"q_perm": (0, 2, 3, 1)}, "tq", "reads it as a, and perm [0, 2, 3, 1] moves the last axis"),
        ({"const_k": True}, "tq", "has a constant b: its prepacked GEMM reads a contiguous a"),
        ({"extra_reader": True}, "tv", "'other' (Identity) reads it (not an integer GEMM's a or b)"),
    ],
)
def test_refusals(kwargs, node, reason):
    model = load(attention(**kwargs))
    p = RewritePass([TransposeAsView()])
    run_passes(model, [p], stage=Stage.LOWERED)
    kept = {n.name for n in model.graph.nodes if n.op_type == "Transpose"}
    assert node in kept
    reasons = [r.reason for r in p.why_not("TransposeAsView")]
    assert any(reason in r for r in reasons), reasons
