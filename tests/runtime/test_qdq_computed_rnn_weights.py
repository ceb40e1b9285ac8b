"""A QDQ file whose GRU weights are computed in the graph from quantized constants.

torch's dynamo exporter builds a GRU's W and R from the parameters (Slice the gate
blocks, Concat them in ONNX's order, Unsqueeze the direction axis); ONNX Runtime's
``quantize_static`` then puts Q / DQ around every one of those steps, as for
activations. The lowering selects integer Slice / Concat over quantized constants, and
the GRU reads a DequantizeLinear of a run-time value: the native GRU needs W and R as
constants, so it ran on the NumPy twin. Folding the integer steps over constants after
the lowering leaves DequantizeLinear(const), which FoldFloatWeights makes a float weight.
"""

from __future__ import annotations

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

import quanta

H, IN, T, B = 7, 17, 5, 3


def _qdq(nodes: list, inits: list, x: str, name: str, scale: float, zp: int) -> str:
    inits += [
        numpy_helper.from_array(np.float32(scale), f"{name}_s"),
        numpy_helper.from_array(np.int8(zp), f"{name}_z"),
    ]
    nodes.append(
        helper.make_node("QuantizeLinear", [x, f"{name}_s", f"{name}_z"], [f"{name}_q"], name=f"q_{name}")
    )
    nodes.append(
        helper.make_node(
            "DequantizeLinear", [f"{name}_q", f"{name}_s", f"{name}_z"], [f"{name}_dq"], name=f"dq_{name}"
        )
    )
    return f"{name}_dq"


def _weight(nodes: list, inits: list, rng: np.random.Generator, tag: str, cols: int, scale: float) -> str:
    """DQ(int8 parameter) -> three gate Slices (r, z, h reordered to z, r, h) -> Concat
    -> Unsqueeze, each result between Q / DQ with its own scale and zero point."""
    inits += [
        numpy_helper.from_array(rng.integers(-127, 128, (3 * H, cols)).astype(np.int8), f"{tag}_p"),
        numpy_helper.from_array(np.float32(scale), f"{tag}_ps"),
        numpy_helper.from_array(np.int8(0), f"{tag}_pz"),
    ]
    nodes.append(
        helper.make_node(
            "DequantizeLinear", [f"{tag}_p", f"{tag}_ps", f"{tag}_pz"], [f"{tag}_f"], name=f"dq_{tag}"
        )
    )
    parts = []
    for k, (lo, hi) in enumerate(((H, 2 * H), (0, H), (2 * H, 3 * H))):
        inits += [
            numpy_helper.from_array(np.array([lo], np.int64), f"{tag}_lo{k}"),
            numpy_helper.from_array(np.array([hi], np.int64), f"{tag}_hi{k}"),
        ]
        nodes.append(
            helper.make_node(
                "Slice", [f"{tag}_f", f"{tag}_lo{k}", f"{tag}_hi{k}"], [f"{tag}_s{k}"], name=f"sl_{tag}{k}"
            )
        )
        parts.append(_qdq(nodes, inits, f"{tag}_s{k}", f"{tag}_s{k}", scale * (1.01 + 0.02 * k), 2 - k))
    nodes.append(helper.make_node("Concat", parts, [f"{tag}_c"], axis=0, name=f"cat_{tag}"))
    c = _qdq(nodes, inits, f"{tag}_c", f"{tag}_c", scale * 1.07, 2)
    inits.append(numpy_helper.from_array(np.array([0], np.int64), f"{tag}_ax"))
    nodes.append(helper.make_node("Unsqueeze", [c, f"{tag}_ax"], [f"{tag}_u"], name=f"unsq_{tag}"))
    return _qdq(nodes, inits, f"{tag}_u", f"{tag}_u", scale * 1.07, 2)


def _model():
    rng = np.random.default_rng(23)
    nodes: list = []
    inits: list = []
    w = _weight(nodes, inits, rng, "w", IN, 0.0031)
    r = _weight(nodes, inits, rng, "r", H, 0.0047)
    inits.append(numpy_helper.from_array(rng.standard_normal((1, 6 * H)).astype(np.float32) * 0.1, "bias"))
    x = _qdq(nodes, inits, "x", "xin", 0.021, -3)
    nodes.append(
        helper.make_node(
            "GRU", [x, w, r, "bias"], ["y", "yh"], hidden_size=H, linear_before_reset=1, name="gru"
        )
    )
    g = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, B, IN])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [T, 1, B, H])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 21)])


def test_gru_weights_built_from_quantized_constants_run_natively():
    proto = _model()
    x = np.random.default_rng(5).standard_normal((T, B, IN)).astype(np.float32)
    native = quanta.InferenceSession(proto)
    assert native.fallbacks == []
    got = native.run(None, {"x": x})[0]
    want = quanta.InferenceSession(proto, backend="reference").run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    so = ort.SessionOptions()
    so.log_severity_level = 3
    theirs = ort.InferenceSession(proto.SerializeToString(), so, providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(got, theirs.run(None, {"x": x})[0], rtol=0, atol=1e-6)
