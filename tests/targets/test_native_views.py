"""Shape-only ops run their zero-copy NumPy twin on the native target and are not
reported as fallbacks; Transpose runs the native batched transpose
(tests/targets/test_native_layout.py)."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import quanta


def test_shape_only_ops_are_not_fallbacks_and_stay_views():
    g = helper.make_graph(
        [
            helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
            helper.make_node("Unsqueeze", ["r", "axes"], ["u"], name="unsqueeze"),
            helper.make_node("Flatten", ["u"], ["f"], name="flatten"),
            helper.make_node("Transpose", ["f"], ["y"], name="transpose", perm=[1, 0]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [
            numpy_helper.from_array(np.array([7, 3], np.int64), "shape"),
            numpy_helper.from_array(np.array([0], np.int64), "axes"),
        ],
    )
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    # as written: the default pipeline would collapse the chain into one Reshape
    # (passes/rules/collapse_views.py)
    options = quanta.SessionOptions(graph_optimization_level=quanta.GraphOptimizationLevel.ORT_DISABLE_ALL)
    sess = quanta.InferenceSession(m, options, backend="native")
    assert sess.fallbacks == []
    kernels = {s.name: s.kernel.name for s in sess.plan.steps}
    assert kernels["transpose"] == "native:transpose_batched"
    assert kernels["reshape"] == "native:view(Reshape)" and kernels["flatten"] == "native:view(Flatten)"
    x = np.arange(21, dtype=np.float32).reshape(3, 7)
    ref = quanta.InferenceSession(m, backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], ref)
