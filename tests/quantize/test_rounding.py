"""GPTQ-style weight rounding (quanta.quantize.rounding): fewer output errors on held-out
data than nearest rounding, the file format unchanged, the im2col rows in the weight's
order."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.quantize.recipe import RecipeError
from quanta.quantize.rounding import HessianAccumulator, RoundedLayer, gptq_round


def _correlated(n: int, k: int, seed: int) -> np.ndarray:
    """Samples of one distribution (the mixing matrix is fixed; ``seed`` draws the samples)."""
    mix = np.random.default_rng(1234 + k).standard_normal((k, k)) * 0.4
    return np.random.default_rng(seed).standard_normal((n, k)) @ mix + 0.3


def test_gptq_beats_nearest_rounding_on_held_out_inputs():
    rng = np.random.default_rng(1)
    k, rows = 67, 13
    w = rng.standard_normal((rows, k))
    s = np.abs(w).max(1) / 127
    acc = HessianAccumulator(k)
    acc.add(_correlated(1500, k, 2)[:700])
    acc.add(_correlated(1500, k, 2)[700:])  # streamed in two parts
    assert acc.rows == 1500
    q = gptq_round(w, s, acc.h, -127, 127)
    assert q.min() >= -127 and q.max() <= 127 and np.all(q == np.rint(q))
    nearest = np.clip(np.rint(w / s[:, None]), -127, 127)
    assert np.mean(q != nearest) > 0.05  # it does change integers
    x = _correlated(1000, k, 3)  # other inputs of the same distribution
    ref = x @ w.T

    def err(codes):
        return float(np.sum((ref - x @ (codes * s[:, None]).T) ** 2))

    assert err(q) < 0.8 * err(nearest)


def test_a_conv_sees_its_inputs_as_im2col_rows_in_the_weight_order():
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 5)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 2)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 0, 1, 1], strides=[2, 1])
    from quanta.ir.onnx_io import from_proto

    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    m = from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    n = m.graph.nodes[0]
    assert RoundedLayer.eligible(n, w) is None
    layer = RoundedLayer(n, "x", "w", w)
    rows = []
    layer.acc.add = lambda r: rows.append(np.asarray(r))  # capture the rows
    layer.observe(x)
    r = np.concatenate(rows)
    # rows @ W2dᵀ is the convolution itself (ONNX Runtime computes the reference)
    import onnxruntime as ort

    sess = ort.InferenceSession(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
        providers=["CPUExecutionProvider"],
    )
    y = sess.run(None, {"x": x})[0]  # [N, Cout, Ho, Wo]
    got = (r @ layer.rows_2d(w).T).reshape(2, y.shape[2], y.shape[3], 4).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(got, y, rtol=1e-4, atol=1e-4)
    dw = helper.make_node("Conv", ["x", "w"], ["y"], group=3)
    assert (
        RoundedLayer.eligible(
            from_proto(
                helper.make_model(
                    helper.make_graph([dw], "g", g.input, g.output, g.initializer),
                    opset_imports=[helper.make_opsetid("", 17)],
                )
            ).graph.nodes[0],
            w,
        )
        == "grouped / depthwise convolution"
    )


def _mlp(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    w1 = rng.standard_normal((37, 29)).astype(np.float32) * 0.2
    w2 = rng.standard_normal((29, 17)).astype(np.float32) * 0.2
    b2 = rng.standard_normal(17).astype(np.float32) * 0.1
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"], name="m1"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Gemm", ["r", "w2", "b2"], ["y"], name="g2"),
    ]
    g = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 37])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 17])],
        [numpy_helper.from_array(a, n) for n, a in (("w1", w1), ("w2", w2), ("b2", b2))],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int, seed: int):
    return [{"x": _correlated(64, 37, seed + i).astype(np.float32)} for i in range(n)]


def test_quantize_static_with_gptq_rounding(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(_mlp(), src)
    outs = {}
    for mode in ("nearest", "gptq"):
        out = tmp_path / f"{mode}.onnx"
        quanta.quantize_static(
            src,
            out,
            _feeds(4, 10),
            weight_rounding=mode,
            weight_type="int8",
            verbose=False,
            per_channel=False,
        )
        outs[mode] = out
    ref = quanta.InferenceSession(str(src), backend="reference")
    x = _feeds(3, 50)

    def noise(path):
        sess = quanta.InferenceSession(str(path), backend="reference")
        return sum(float(np.sum((ref.run(None, f)[0] - sess.run(None, f)[0]) ** 2)) for f in x)

    assert noise(outs["gptq"]) < noise(outs["nearest"])
    # the same file format: only weight integers differ
    a, b = onnx.load(outs["nearest"]), onnx.load(outs["gptq"])
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]
    with pytest.raises(RecipeError, match="weight_rounding"):
        quanta.Recipe(weight_rounding="adaround")
