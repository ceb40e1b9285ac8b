"""Block-wise learned rounding (quanta.quantize.blocks, docs/debugger.md eqs. (12p)-(12t))
on inverted-residual blocks built by code."""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.graph import Node
from quanta.quantize.blocks import (
    Block,
    BlockOptions,
    _conv,
    _conv_backward,
    _Weight,
    learn_block_rounding,
    partition_blocks,
    run_block,
)


def _inverted_residual(seed: int = 0, c: int = 7, e: int = 17) -> onnx.ModelProto:
    """x [N, c, 13, 13] -> expand 1x1 (c -> e) -> Clip(0, 6) -> depthwise 3x3 -> Clip(0, 6)
    -> project 1x1 (e -> c) -> + x -> Conv 3x3 stride 2 (c -> 3): two blocks, odd sizes."""
    rng = np.random.default_rng(seed)

    def w(*shape: int, k: float) -> np.ndarray:
        return (rng.standard_normal(shape) * k).astype(np.float32)

    inits = [
        numpy_helper.from_array(w(e, c, 1, 1, k=0.5), "w_expand"),
        numpy_helper.from_array(w(e, k=0.1), "b_expand"),
        numpy_helper.from_array(w(e, 1, 3, 3, k=0.4), "w_dw"),
        numpy_helper.from_array(w(e, k=0.1), "b_dw"),
        numpy_helper.from_array(w(c, e, 1, 1, k=0.3), "w_project"),
        numpy_helper.from_array(w(c, k=0.1), "b_project"),
        numpy_helper.from_array(w(3, c, 3, 3, k=0.2), "w_head"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w_expand", "b_expand"], ["e"], name="expand"),
        helper.make_node("Clip", ["e", "lo", "hi"], ["e6"], name="expand_clip"),
        helper.make_node("Conv", ["e6", "w_dw", "b_dw"], ["d"], name="dw", group=e, pads=[1, 1, 1, 1]),
        helper.make_node("Clip", ["d", "lo", "hi"], ["d6"], name="dw_clip"),
        helper.make_node("Conv", ["d6", "w_project", "b_project"], ["p"], name="project"),
        helper.make_node("Add", ["p", "x"], ["r"], name="residual"),
        helper.make_node("Conv", ["r", "w_head"], ["y"], name="head", strides=[2, 2], pads=[1, 0, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "inverted_residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", c, 13, 13])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds(n: int, seed: int, c: int = 7) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((4, c, 13, 13)) * 1.5 + 0.3).astype(np.float32)} for _ in range(n)]


@pytest.mark.parametrize(
    ("c", "o", "group", "k", "strides", "pads"),
    [
        (7, 17, 1, 1, (1, 1), (0, 0, 0, 0)),  # pointwise
        (17, 17, 17, 3, (1, 1), (1, 1, 1, 1)),  # depthwise
        (3, 7, 1, 3, (2, 2), (1, 0, 1, 1)),  # a stem: stride 2, uneven padding
        (6, 9, 3, 3, (2, 1), (0, 1, 2, 1)),  # grouped, unequal strides
    ],
)
def test_conv_backward_matches_finite_differences(c, o, group, k, strides, pads):
    """Failure signature: a tap's slice off by one or a transposed group product gives the
    learned rounding a gradient of the wrong weight, and the loss does not fall."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, c, 9, 11)).astype(np.float64)
    w = rng.standard_normal((o, c // group, k, k)).astype(np.float64)
    node = Node("Conv", [], [], {"strides": list(strides), "pads": list(pads), "group": group})
    y = _conv(x.astype(np.float32), w.astype(np.float32), None, node)
    g = rng.standard_normal(y.shape).astype(np.float32)
    dx, dw = _conv_backward(x.astype(np.float32), w.astype(np.float32), g, node, True)
    assert dx is not None

    # the loss <g, conv(x, w)> is linear in each of x and w: central differences are exact
    # up to float32 rounding of a sum of ~c·k²·|y| terms (relative 1e-3 is 100x that)
    def loss(xx: np.ndarray, ww: np.ndarray) -> float:
        return float(
            (g.astype(np.float64) * _conv(xx.astype(np.float32), ww.astype(np.float32), None, node)).sum()
        )

    for arr, grad in ((w, dw), (x, dx)):
        for idx in [tuple(rng.integers(0, s) for s in arr.shape) for _ in range(6)]:
            step = np.zeros_like(arr)
            step[idx] = 0.5
            plus = loss(x + step, w) if arr is x else loss(x, w + step)
            minus = loss(x - step, w) if arr is x else loss(x, w - step)
            assert (plus - minus) / 1.0 == pytest.approx(float(grad[idx]), rel=1e-3, abs=1e-3)


def test_the_graph_is_cut_into_an_inverted_residual_block_and_the_head():
    from quanta.ir.onnx_io import from_proto

    model = from_proto(_inverted_residual())
    nodes = list(model.graph.nodes)
    weighted = {id(n) for n in nodes if n.op_type == "Conv"}
    blocks = partition_blocks(nodes, ["x"], weighted)
    assert [(src, dst, [n.name for n in ns]) for src, dst, ns in blocks] == [
        ("x", "r", ["expand", "expand_clip", "dw", "dw_clip", "project", "residual"]),
        ("r", "y", ["head"]),
    ]


def _block_of(model: str, out: str, feeds, **qkw):
    """The first block of the model quantized by quantize_static's plan, with its learned
    weights at nearest rounding, and the block input in FP32 and as the quantized model
    sees it."""
    import quanta.quantize.blocks as B

    got: dict = {}
    original = B.learn_block_rounding

    def spy(block, x_q, x_fp, start, options, seed):
        got.setdefault("args", (block, x_q, x_fp, start))
        return original(block, x_q, x_fp, start, dataclasses_replace(options, iterations=0), seed)

    B.learn_block_rounding = spy
    try:
        quanta.quantize_static(model, out, feeds, weight_rounding="brecq", verbose=False, **qkw)
    finally:
        B.learn_block_rounding = original
    return got["args"]


def dataclasses_replace(options: BlockOptions, **kw) -> BlockOptions:
    import dataclasses

    return dataclasses.replace(options, **kw)


def _nearest(block: Block) -> dict[int, np.ndarray]:
    return {k: np.clip(np.rint(w.w / w.scale), w.qmin, w.qmax) for k, w in block.weights.items()}


def test_learned_rounding_lowers_the_held_out_block_error_and_stays_on_the_grid(tmp_path):
    """Eqs. (12p)-(12t) on the inverted-residual block: against nearest rounding of the same
    weights, the learned integers err less on the odd-numbered (held-out) samples, each is
    ⌊W/s⌋ or ⌊W/s⌋ + 1 inside [qmin, qmax], and the same call gives the same integers."""
    model = _inverted_residual()
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    block, x_q, x_fp, _ = _block_of(str(path), str(tmp_path / "q.onnx"), _feeds(6, 2))
    assert len(block.weights) == 3
    start = _nearest(block)
    options = BlockOptions(iterations=150, batch=4, patch=9, lr=0.02)
    codes, before, after = learn_block_rounding(block, x_q, x_fp, start, options, 0)
    assert codes is not start and after < before
    # the held-out error recomputed here from the integers
    target = run_block(block, x_fp[1::2], "fp", {})
    again = run_block(block, x_q[1::2], "q", {k: block.weights[k].hard(c) for k, c in codes.items()})
    d = (again - target).astype(np.float64)
    assert float((d * d).sum() / (d.size / d.shape[1])) == after
    for k, c in codes.items():
        w: _Weight = block.weights[k]
        assert np.array_equal(c, np.rint(c))
        assert c.min() >= w.qmin and c.max() <= w.qmax
        assert np.all((c == w.floor) | (c == w.floor + 1) | (c == w.qmin) | (c == w.qmax))
    moved = sum(int(np.sum(codes[k] != start[k])) for k in codes)
    assert moved > 0
    codes2, _, after2 = learn_block_rounding(block, x_q, x_fp, start, options, 0)
    assert after2 == after and all(np.array_equal(codes[k], codes2[k]) for k in codes)


def test_a_block_keeps_its_start_where_learning_does_not_win_held_out(tmp_path):
    """Eq. (12t): with no steps the learned integers are AdaRound's start, nearest rounding
    up to ties; starting from integers that already are nearest, the block keeps them (the
    start object itself)."""
    path = tmp_path / "m.onnx"
    onnx.save(_inverted_residual(), path)
    block, x_q, x_fp, _ = _block_of(str(path), str(tmp_path / "q.onnx"), _feeds(4, 3))
    start = _nearest(block)
    codes, before, after = learn_block_rounding(block, x_q, x_fp, start, BlockOptions(iterations=0), 0)
    assert codes is start and after >= before


def test_brecq_writes_the_same_file_twice_and_changes_only_weight_integers(tmp_path, monkeypatch):
    import quanta.quantize.blocks as B

    # fewer steps than the default's 2000: the same code path, a test-sized cost
    monkeypatch.setattr(B, "DEFAULT_OPTIONS", BlockOptions(iterations=400, batch=8, patch=13))
    model = _inverted_residual(seed=4)
    src = tmp_path / "m.onnx"
    onnx.save(model, src)
    feeds = _feeds(6, 5)
    paths = [tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "g.onnx"]
    for p in paths[:2]:
        quanta.quantize_static(str(src), str(p), feeds, weight_rounding="brecq")
    quanta.quantize_static(str(src), str(paths[2]), feeds, weight_rounding="gptq")
    digest = [hashlib.sha1(p.read_bytes()).hexdigest() for p in paths]
    assert digest[0] == digest[1]
    a, g = onnx.load(paths[0]), onnx.load(paths[2])
    assert [n.op_type for n in a.graph.node] == [n.op_type for n in g.graph.node]
    ia = {t.name: numpy_helper.to_array(t) for t in a.graph.initializer}
    ig = {t.name: numpy_helper.to_array(t) for t in g.graph.initializer}
    assert ia.keys() == ig.keys()
    differ = [k for k in ia if not np.array_equal(ia[k], ig[k])]
    assert differ, "the learned rounding changed no integer"
    for k in differ:
        assert ia[k].dtype == np.int8  # weight integers only: scales, zero points, biases as GPTQ's
