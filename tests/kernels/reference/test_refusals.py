"""Attribute values and optional inputs a twin does not implement are refused when the
session is built, naming the node (registry.REFUSALS), never on the first run."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.kernels.reference.registry import refusal
from quanta.targets.base import TargetError


def test_batch_norm_with_per_element_statistics_is_refused_at_load() -> None:
    c = 7
    inits = [
        numpy_helper.from_array(np.linspace(0.5, 2.0, c * 9, dtype=np.float32).reshape(c, 3, 3), n)
        for n in "sbmv"
    ]
    node = helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], ["y"], name="bn3", spatial=0)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, c, 3, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, c, 3, 3])],
        inits,
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 7)])
    m.ir_version = 3
    m.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits)
    for backend in ("reference", "native"):
        with pytest.raises(TargetError, match=r"bn3.*spatial=0"):
            quanta.InferenceSession(m.SerializeToString(), backend=backend)


def test_matmul_nbits_with_act_order_is_refused_at_load() -> None:
    k, n, block = 32, 3, 16
    b = np.arange(n * (k // block) * block // 2, dtype=np.uint8).reshape(n, k // block, block // 2)
    inits = [
        numpy_helper.from_array(b, "b"),
        numpy_helper.from_array(np.full(n * (k // block), 0.25, np.float32), "s"),
        numpy_helper.from_array(np.arange(k, dtype=np.int32) // block, "g"),
    ]
    node = helper.make_node(
        "MatMulNBits",
        ["a", "b", "s", "", "g"],
        ["y"],
        name="mm5",
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
    )
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, [5, k])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, n])],
        inits,
    )
    m = helper.make_model(
        g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    with pytest.raises(TargetError, match=r"mm5.*g_idx"):
        quanta.InferenceSession(m.SerializeToString())


def test_the_rules_on_their_own() -> None:
    assert refusal("DynamicQuantizeLSTM", "com.microsoft", {"layout": 1}, [True] * 3) is not None
    assert refusal("DynamicQuantizeLSTM", "com.microsoft", {"layout": 0}, [True] * 3) is None
    assert refusal("MatMulNBits", "com.microsoft", {}, [True, True, True, False, False, True]) is None
    assert refusal("BatchNormalization", "ai.onnx", {"spatial": 1}, [True] * 5) is None
    assert refusal("Conv", "", {"group": 3}, [True, True]) is None  # no rule: nothing refused
