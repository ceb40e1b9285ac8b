"""FuseMatMulFloatBias / FuseMatMulFloatBiasFirst (passes/lower/qdq_to_qlinear.py): a float
bias Add after MatMulIntegerToFloat becomes the op's bias input. The four parts (fired
once per Add; the structure; bit-exact numerics on the reference target, because the op
adds the bias after the multiply exactly as the Add did; the verifier in the lowered
stage) and one negative test per NoMatch reason."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage
from quanta.passes.lower.qdq_to_qlinear import FuseMatMulFloatBias, FuseMatMulFloatBiasFirst
from quanta.passes.pattern import RewritePass
from tests.passes.helpers import run_passes, run_ref

MS = "com.microsoft"
K, N = 263, 17  # K > 258: int32 accumulation; odd N


def mm_bias_proto(*, bias_first=False, bias=None, a_scale=None, extra_use=False, b_scale=None):
    rng = np.random.default_rng(5)
    bias = rng.standard_normal((1, N)).astype(np.float32) if bias is None else bias
    a_scale = np.float32(0.031) if a_scale is None else a_scale
    b_scale = (rng.random(N) * 0.01 + 0.001).astype(np.float32) if b_scale is None else b_scale
    inits = [
        numpy_helper.from_array(rng.integers(-127, 128, (K, N)).astype(np.int8), "w"),
        numpy_helper.from_array(np.asarray(a_scale, np.float32), "sa"),
        numpy_helper.from_array(b_scale, "sb"),
        numpy_helper.from_array(np.uint8(131), "za"),
        # non-zero, per-column weight zero points: the row-sum term of the GEMM is exercised
        numpy_helper.from_array(rng.integers(-9, 10, b_scale.shape).astype(np.int8), "zb"),
    ]
    if isinstance(bias, np.ndarray):
        inits.append(numpy_helper.from_array(bias, "bias"))
    nodes = [
        helper.make_node(
            "MatMulIntegerToFloat", ["a", "w", "sa", "sb", "za", "zb"], ["p"], name="mm", domain=MS
        ),
        helper.make_node("Add", ["bias", "p"] if bias_first else ["p", "bias"], ["y"], name="add"),
    ]
    inputs = [helper.make_tensor_value_info("a", TensorProto.UINT8, [2, 5, K])]
    if not isinstance(bias, np.ndarray):
        inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [N]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, N])]
    if extra_use:
        outputs.append(helper.make_tensor_value_info("p", TensorProto.FLOAT, [2, 5, N]))
    g = helper.make_graph(nodes, "g", inputs, outputs, inits)
    for name in ("p",):
        g.value_info.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, [2, 5, N]))
    return helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid(MS, 1)], ir_version=10
    )


def fuse(model):
    p = RewritePass([FuseMatMulFloatBias(), FuseMatMulFloatBiasFirst()])
    return p, run_passes(model, [p], stage=Stage.LOWERED)


def feeds(proto):
    rng = np.random.default_rng(9)
    out = {"a": rng.integers(0, 256, (2, 5, K)).astype(np.uint8)}
    if any(i.name == "bias" for i in proto.graph.input):
        out["bias"] = rng.standard_normal(N).astype(np.float32)
    return out


@pytest.mark.parametrize("bias_first", [False, True])
def test_bias_add_becomes_the_ops_bias_bit_exact(bias_first):
    proto = mm_bias_proto(bias_first=bias_first)
    model = load(proto)
    _, result = fuse(model)
    rule = "FuseMatMulFloatBiasFirst" if bias_first else "FuseMatMulFloatBias"
    assert result.fired(rule) == 1  # 1. fired once
    nodes = model.graph.nodes  # 2. one node, the bias as its 7th input, one value per column
    assert [(n.op_type, n.name) for n in nodes] == [("MatMulIntegerToFloat", "mm")]
    assert nodes[0].inputs[6].const.shape == (N,)
    assert model.graph.outputs[0].name == "y"
    f = feeds(proto)  # 3. bit-exact (4. the verifier ran after the pass)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        ({"bias": "input"}, "bias 'bias' (a graph input) is not a constant"),
        ({"bias": np.ones((N,), np.float16)}, "bias or product is not float32"),
        (
            {"bias": np.ones((2, 1, N), np.float32)},
            "bias of shape [2, 1, 17] is not one value per output column (17)",
        ),
        (
            {"bias": np.ones((5, 1), np.float32)},
            "bias of shape [5, 1] is not one value per output column (17)",
        ),
        ({"a_scale": np.full((2, 5, 1), 0.03, np.float32)}, "a_scale is not one value"),
    ],
)
def test_no_match_reasons(kwargs, reason):
    proto = mm_bias_proto(**kwargs)
    model = load(proto)
    p, result = fuse(model)
    assert result.fired("FuseMatMulFloatBias") == 0
    reasons = [r.reason for r in p.why_not("FuseMatMulFloatBias")]
    assert any(r.startswith(reason) for r in reasons), reasons


def test_product_with_another_user_is_left_alone():
    proto = mm_bias_proto(extra_use=True)
    model = load(proto)
    p, result = fuse(model)
    assert result.fired("FuseMatMulFloatBias") == 0
    assert [n.op_type for n in model.graph.nodes] == ["MatMulIntegerToFloat", "Add"]
    assert any(
        "'p'" in r.reason for r in p.why_not("FuseMatMulFloatBias")
    )  # the engine names the shared value
