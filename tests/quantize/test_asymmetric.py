"""Weight rounding against the FP32 outputs from the quantized inputs
(``weight_rounding="gptaq"``, quanta.quantize.asymmetric, docs/debugger.md eqs.
(12g)-(12j)): the least-squares targets, the im2col rows, a second layer that makes up
for its input's error, the same file twice."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.quantize.asymmetric import PairedLayer, _loss, asymmetric_targets
from quanta.quantize.rounding import gptq_round_groups


def _correlated(n: int, k: int, seed: int, mix_seed: int = 7) -> np.ndarray:
    mix = np.random.default_rng(mix_seed + k).standard_normal((k, k)) * 0.4
    return np.random.default_rng(seed).standard_normal((n, k)) @ mix + 0.3


@pytest.mark.parametrize("k, rows", [(3, 7), (17, 5), (29, 17)])
def test_the_targets_solve_the_least_squares_problem(k, rows):
    """Eq. (12h) at λ → 0 is the least-squares solution of (12g) and makes the cross term
    vanish: ‖W X_fp − Ŵ X_q‖² = ‖(W* − Ŵ) X_q‖² + ‖W X_fp − W* X_q‖² for any Ŵ."""
    rng = np.random.default_rng(k)
    x_fp = _correlated(400, k, 1).T  # [K, P]
    x_q = x_fp + 0.2 * np.tanh(x_fp[::-1]) + 0.05 * rng.standard_normal(x_fp.shape)  # a systematic error
    w = rng.standard_normal((rows, k))
    h, c = x_q @ x_q.T, x_fp @ x_q.T
    star = asymmetric_targets(w[None], h[None], c[None], damp=0.0)[0]
    lstsq = np.linalg.lstsq(x_q.T, (w @ x_fp).T, rcond=None)[0].T
    np.testing.assert_allclose(star, lstsq, rtol=1e-7, atol=1e-9)
    w_hat = w + 0.1 * rng.standard_normal(w.shape)
    lhs = np.sum((w @ x_fp - w_hat @ x_q) ** 2)
    rhs = np.sum(((star - w_hat) @ x_q) ** 2) + np.sum((w @ x_fp - star @ x_q) ** 2)
    np.testing.assert_allclose(lhs, rhs, rtol=1e-9)
    # _loss is (12g) less its constant ‖W X_fp‖²
    const = np.sum((w @ x_fp) ** 2)
    np.testing.assert_allclose(_loss(w[None], w_hat[None], h[None], c[None]).sum() + const, lhs, rtol=1e-9)


def test_gptq_on_the_targets_beats_gptq_on_the_weights_for_the_asymmetric_loss():
    """Rounded on the grid, the integers from W* err less by (12g) on new samples of the
    same distribution than GPTQ's from W (which fits ‖(W − Ŵ) X_q‖²)."""
    rng = np.random.default_rng(3)
    k, rows = 37, 13

    def pair(seed):
        f = _correlated(2000, k, seed).T
        return f, np.clip(f, -1.5, 1.5)  # a clipped input grid: a systematic error

    w = rng.standard_normal((1, rows, k))
    s = np.abs(w).max(axis=2) / 127
    f, q = pair(1)
    h, c = (q @ q.T)[None], (f @ q.T)[None]
    sym = gptq_round_groups(w, s, h, -127, 127)
    # 2000 rows for K = 37: GPTQ's damping (the default ridge is for fewer rows per K)
    asym = gptq_round_groups(asymmetric_targets(w, h, c, damp=0.01), s, h, -127, 127)
    f2, q2 = pair(2)

    def err(codes):
        return float(np.sum((w[0] @ f2 - (s[0][:, None] * codes[0]) @ q2) ** 2))

    assert err(asym) < 0.5 * err(sym)


@pytest.mark.parametrize(
    "group, cin, cout, kernel, conv",
    [
        (1, 3, 7, (3, 2), {"pads": [1, 0, 0, 1], "strides": [2, 1]}),
        (7, 7, 7, (3, 2), {"pads": [1, 0, 0, 1], "strides": [2, 1]}),
        (1, 7, 17, (3, 2), {"pads": [1, 0, 0, 1], "strides": [2, 1]}),
        (1, 7, 17, (1, 1), {}),  # pointwise: the rows without a copy
        (7, 7, 17 - 3, (1, 1), {}),  # pointwise, grouped
    ],
)
def test_paired_rows_are_the_convolutions_im2col_rows(group, cin, cout, kernel, conv):
    """W_g · rows_g is group g's part of a strided, padded Conv's output (ONNX Runtime
    computes it), for the FP32 and the quantized input alike."""
    import onnxruntime as ort

    from quanta.ir.onnx_io import from_proto

    w = np.random.default_rng(4).standard_normal((cout, cin // group, *kernel)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=group, name="c", **conv)
    g = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", cin, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(w, "w")],
    )
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    n = from_proto(proto).graph.nodes[0]
    layer = PairedLayer(n, w, "x", "x_q")
    x = np.random.default_rng(5).standard_normal((2, cin, 7, 6)).astype(np.float32)
    y = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    cols = layer.cols(x)  # [G, K, P]
    w2 = layer.shape.rows_2d(w).astype(np.float64)
    per = cout // group
    got = np.concatenate([w2[i * per : (i + 1) * per] @ cols[i] for i in range(group)])
    want = y.transpose(1, 0, 2, 3).reshape(cout, -1)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    layer.observe(x, np.round(x * 4) / 4)
    layer.observe(x, x)
    assert layer.calls == 2 and layer.rows == 2 * cols.shape[2]
    np.testing.assert_allclose(layer.h[1], np.matmul(cols, cols.transpose(0, 2, 1)))


def _chain(seed: int = 0) -> onnx.ModelProto:
    """x -> Conv (3 -> 7, padded, strided) -> Relu -> depthwise Conv (7 groups) -> Relu ->
    Conv (7 -> 17, bias): three quantized layers, each reading the one before."""
    rng = np.random.default_rng(seed)
    inits = {
        "w1": rng.standard_normal((7, 3, 3, 3)).astype(np.float32) * 0.4,
        "b1": rng.standard_normal(7).astype(np.float32) * 0.1,
        "w2": rng.standard_normal((7, 1, 3, 3)).astype(np.float32) * 0.4,
        "b2": rng.standard_normal(7).astype(np.float32) * 0.1,
        "w3": rng.standard_normal((17, 7, 1, 1)).astype(np.float32) * 0.4,
        "b3": rng.standard_normal(17).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["h1"], pads=[1, 1, 1, 1], strides=[2, 2], name="c1"),
        helper.make_node("Relu", ["h1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["h2"], group=7, pads=[1, 1, 1, 1], name="dw"),
        helper.make_node("Relu", ["h2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["y"], name="c3"),
    ]
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, 13, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _images(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(seed)
    return [{"x": (r.standard_normal((2, 3, 13, 11)) + 0.2).astype(np.float32)} for _ in range(n)]


def test_a_layer_after_a_coarse_grid_errs_less(tmp_path):
    """A coarse, clipping grid on the first layer's output (a fixed range far under its
    values): the layers after it, fitted for the FP32 outputs from the inputs they get,
    make up for part of that error, so the last layer's output errs less on held-out
    images than with GPTQ (which fits each layer on its own input, eq. (12d))."""
    src = tmp_path / "chain.onnx"
    onnx.save(_chain(), src)
    outs = {}
    for mode in ("gptq", "gptaq"):
        outs[mode] = tmp_path / f"{mode}.onnx"
        quanta.quantize_static(
            src,
            outs[mode],
            _images(8, 1),
            weight_rounding=mode,
            overrides={"r1": {"range": (0.0, 0.8)}},
            verbose=False,
        )
    ref = quanta.InferenceSession(str(src), backend="reference")
    held = _images(4, 9)

    def noise(path):
        sess = quanta.InferenceSession(str(path), backend="reference")
        return sum(float(np.sum((ref.run(None, f)[0] - sess.run(None, f)[0]) ** 2)) for f in held)

    assert noise(outs["gptaq"]) < 0.9 * noise(outs["gptq"])  # 0.80 measured
    # the same file format: only weight integers and biases differ
    a, b = onnx.load(outs["gptq"]), onnx.load(outs["gptaq"])
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in b.graph.node]


def test_the_same_data_gives_the_same_file(tmp_path):
    src = tmp_path / "chain.onnx"
    onnx.save(_chain(1), src)
    digests = []
    for i in range(2):
        out = tmp_path / f"q{i}.onnx"
        quanta.quantize_static(src, out, _images(5, 2), weight_rounding="gptaq", verbose=False)
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert digests[0] == digests[1]
    assert quanta.Recipe(weight_rounding="gptaq").weight_rounding == "gptaq"
