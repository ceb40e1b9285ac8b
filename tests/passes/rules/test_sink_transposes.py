"""SinkTransposes (passes/rules/sink_transposes.py): the Transposes a TF export writes
around every convolution sink through the elementwise operators between them and cancel;
the four parts of docs/passes.md (fired, structure, numerics bit for bit on the
reference target, verify) and the cases that must stay."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.ir.verify import Stage, verify
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fold_pad import FoldPad
from quanta.passes.rules.sink_transposes import SinkTransposes
from tests.passes.helpers import run_passes, run_ref

F32 = np.float32
C, H, W = 7, 5, 9
NCHW, NHWC = [0, 3, 1, 2], [0, 2, 3, 1]


def _init(name: str, a) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(a), name)


def tf_block(*, residual: bool = False, extra_reader: bool = False, pad: bool = False) -> onnx.ModelProto:
    """x [1, H, W, 3] NHWC -> (Pad) -> T -> Conv -> T -> Sub / Mul / Add per channel -> Relu
    -> Clip -> T -> Conv -> T -> (+ the first block's NHWC output) -> y NHWC."""
    rng = np.random.default_rng(12)
    inits = [
        _init("w1", rng.uniform(-0.5, 0.5, (C, 3, 3, 3)).astype(F32)),
        _init("w2", rng.uniform(-0.5, 0.5, (C, C, 3, 3)).astype(F32)),
        _init("mean", rng.uniform(-0.2, 0.2, C).astype(F32)),
        _init("g", rng.uniform(0.5, 1.5, C).astype(F32)),
        _init("beta", rng.uniform(-0.3, 0.3, (1, 1, C)).astype(F32)),
        _init("lo", F32(0.0)),
        _init("hi", F32(6.0)),
        _init("pads", np.array([0, 1, 1, 0, 0, 1, 1, 0], np.int64)),
    ]
    conv1_pads = [0, 0, 0, 0] if pad else [1, 1, 1, 1]
    nodes = []
    src = "x"
    if pad:
        nodes.append(helper.make_node("Pad", ["x", "pads"], ["xp"], mode="constant"))
        src = "xp"
    nodes += [
        helper.make_node("Transpose", [src], ["x_t"], perm=NCHW),
        helper.make_node("Conv", ["x_t", "w1"], ["c1"], pads=conv1_pads),
        helper.make_node("Transpose", ["c1"], ["c1_t"], perm=NHWC),
        helper.make_node("Sub", ["c1_t", "mean"], ["s"]),
        helper.make_node("Mul", ["s", "g"], ["m"]),
        helper.make_node("Add", ["beta", "m"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Clip", ["r", "lo", "hi"], ["k"]),
        helper.make_node("Transpose", ["k"], ["k_t"], perm=NCHW),
        helper.make_node("Conv", ["k_t", "w2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Transpose", ["c2"], ["c2_t"], perm=NHWC),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, H, W, C])]
    if residual:
        nodes.append(helper.make_node("Add", ["c2_t", "k"], ["y"]))
    else:
        nodes.append(helper.make_node("Identity", ["c2_t"], ["y"]))
    if extra_reader:  # the first Transpose's output is also a graph output
        outputs.append(helper.make_tensor_value_info("c1_t", TensorProto.FLOAT, [1, H, W, C]))
    graph = helper.make_graph(
        nodes,
        "tf_block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, H, W, 3])],
        outputs,
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _feeds():
    return {"x": np.random.default_rng(3).normal(0.0, 1.5, (1, H, W, 3)).astype(F32)}


def _run(proto, passes):
    model = load(proto)
    result = run_passes(model, passes)
    return model, result


def test_transposes_around_convolutions_cancel_and_the_outputs_are_the_same_bytes():
    for residual in (False, True):
        proto = tf_block(residual=residual)
        model, result = _run(proto, [SinkTransposes(), EliminateDead()])
        assert result.fired("moved") >= 6 and result.fired("cancelled") >= 1, result.records[0].stats
        counts = model.graph.op_counts()
        # the input's and the output's Transposes stay at the graph's edges
        assert counts["Transpose"] == 2, counts
        convs = model.graph.find_nodes("Conv")
        assert convs[0].outputs[0].consumers()[0].op_type == "Sub"  # the epilogue follows the Conv now
        verify(model.graph, Stage.FLOAT)
        want, got = run_ref(proto, _feeds()), run_ref(model, _feeds())
        assert [a.tobytes() for a in got] == [a.tobytes() for a in want]


def test_epilogue_then_folds_and_the_session_has_no_inner_transpose():
    proto = tf_block(residual=True)
    sess = quanta.InferenceSession(proto.SerializeToString())
    ops = [s.op_type for s in sess.plan.steps]
    assert ops.count("Transpose") == 2 and "Sub" not in ops and "Mul" not in ops, ops
    ref = quanta.InferenceSession(proto.SerializeToString(), backend="reference")
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    written = quanta.InferenceSession(proto.SerializeToString(), sess_options=off, backend="reference")
    x = _feeds()
    # native and reference run the same graph; their float convolutions agree within the
    # float GEMM family's bound (FG1, docs/float-ops.md), not bit for bit
    np.testing.assert_allclose(sess.run(None, x)[0], ref.run(None, x)[0], rtol=1e-5, atol=1e-5)
    # the folded BatchNormalization rounds once (fold_conv_affine.py), not bit for bit
    np.testing.assert_allclose(sess.run(None, x)[0], written.run(None, x)[0], rtol=1e-5, atol=1e-5)


def test_pad_before_the_transpose_moves_after_it_and_folds_into_the_conv():
    proto = tf_block(pad=True)
    model, _ = _run(proto, [SinkTransposes(), EliminateDead(), FoldPad()])
    assert "Pad" not in model.graph.op_counts()
    assert model.graph.find_nodes("Conv")[0].attrs["pads"] == [1, 1, 1, 1]
    want, got = run_ref(proto, _feeds()), run_ref(model, _feeds())
    assert [a.tobytes() for a in got] == [a.tobytes() for a in want]


def test_a_transpose_read_elsewhere_stays_where_it_is():
    proto = tf_block(extra_reader=True)
    model, _ = _run(proto, [SinkTransposes(), EliminateDead()])
    c1_t = next(v for v in model.graph.outputs if v.name == "c1_t")
    assert c1_t.producer.op_type == "Transpose"
    assert c1_t.consumers()[0].op_type == "Sub"  # not moved: its reader outside would need it too
    want, got = run_ref(proto, _feeds()), run_ref(model, _feeds())
    assert [a.tobytes() for a in got] == [a.tobytes() for a in want]


def test_mixed_perms_and_computed_operands_stay():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4, 5])
    z = helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4, 5, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    for second in ("other_perm", "computed"):
        nodes = [helper.make_node("Transpose", ["x"], ["a"], perm=NHWC)]
        if second == "other_perm":
            nodes.append(helper.make_node("Transpose", ["x"], ["b"], perm=[0, 2, 1, 3]))
            nodes.append(helper.make_node("Relu", ["b"], ["b2"]))
            nodes.append(helper.make_node("Reshape", ["b2", "shp"], ["b3"]))
            inits = [_init("shp", np.array([2, 4, 5, 3], np.int64))]
            nodes.append(helper.make_node("Add", ["a", "b3"], ["y"]))
        else:
            inits = []
            nodes.append(helper.make_node("Add", ["a", "z"], ["y"]))
        graph = helper.make_graph(nodes, "g", [x, z], [y], inits)
        proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model, _ = _run(proto, [SinkTransposes(), EliminateDead()])
        add = model.graph.find_nodes("Add")[0]
        assert add.inputs[0].producer.op_type == "Transpose", second  # the Add still reads it


def test_a_mean_over_nhwc_spatial_axes_reads_the_nchw_tensor():
    # ReduceMean(Transpose(c, NHWC), axes=[1, 2]): over x's [2, 3] directly; keepdims=0
    # needs no Transpose after it, keepdims=1 one on the [N, C, 1, 1] result
    for keepdims, opset in ((0, 17), (1, 17), (0, 18)):
        x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, C, H, W])
        y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
        inits = []
        if opset >= 18:
            inits = [_init("axes", np.array([1, 2], np.int64))]
            mean = helper.make_node("ReduceMean", ["t", "axes"], ["y"], keepdims=keepdims)
        else:
            mean = helper.make_node("ReduceMean", ["t"], ["y"], axes=[1, 2], keepdims=keepdims)
        nodes = [
            helper.make_node("Relu", ["x"], ["r"]),
            helper.make_node("Transpose", ["r"], ["t"], perm=NHWC),
            mean,
        ]
        proto = helper.make_model(
            helper.make_graph(nodes, "g", [x], [y], inits), opset_imports=[helper.make_opsetid("", opset)]
        )
        model, result = _run(proto, [SinkTransposes(), EliminateDead()])
        assert result.fired("moved") == 1
        assert model.graph.op_counts().get("Transpose", 0) == keepdims, (keepdims, opset)
        feeds = {"x": np.random.default_rng(5).normal(0, 1, (2, C, H, W)).astype(F32)}
        assert run_ref(model, feeds)[0].tobytes() == run_ref(proto, feeds)[0].tobytes(), (keepdims, opset)


# --------------------------------------------------------------------------------------
# Squeeze and Unsqueeze between the Transposes (a TF Conv1D export: madmom, onsets CNN)
# --------------------------------------------------------------------------------------


def _axes(name: str, axes: list[int], opset: int, op: str, src: str, out: str):
    """A Squeeze / Unsqueeze of ``axes``: an attribute before opset 13, a constant input after."""
    if opset >= 13:
        return helper.make_node(op, [src, name], [out]), [_init(name, np.array(axes, np.int64))]
    return helper.make_node(op, [src], [out], axes=axes), []


def conv1d_block(c: int, opset: int, *, read_twice: bool = False) -> onnx.ModelProto:
    """madmom's TCN block as tf2onnx writes it: x [1, 1, L, c0] NHWC -> T -> Conv 1x3 ->
    T(0,2,3,1) -> Squeeze(0) -> Elu -> Unsqueeze(0) -> T(0,3,1,2) -> MaxPool 1x3 -> y."""
    rng = np.random.default_rng(c)
    inits = [_init("w", rng.uniform(-0.5, 0.5, (c, 3, 1, 3)).astype(F32))]
    sq, i1 = _axes("sq_axes", [0], opset, "Squeeze", "c_t", "s")
    un, i2 = _axes("un_axes", [-4], opset, "Unsqueeze", "e", "u")
    nodes = [
        helper.make_node("Transpose", ["x"], ["x_t"], perm=NCHW),
        helper.make_node("Conv", ["x_t", "w"], ["c1"], pads=[0, 1, 0, 1]),
        helper.make_node("Transpose", ["c1"], ["c_t"], perm=NHWC),
        sq,
        helper.make_node("Elu", ["s"], ["e"], alpha=1.0),
        un,
        helper.make_node("Transpose", ["u"], ["u_t"], perm=NCHW),
        helper.make_node("MaxPool", ["u_t"], ["y"], kernel_shape=[1, 3], strides=[1, 3]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if read_twice:  # the first Transpose is also read by a Relu whose output leaves the graph
        nodes.append(helper.make_node("Relu", ["c_t"], ["r"]))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "conv1d",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 17, 3])],
        outputs,
        inits + i1 + i2,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _conv1d_feeds():
    return {"x": np.random.default_rng(4).normal(0.0, 1.5, (1, 1, 17, 3)).astype(F32)}


def test_transposes_around_a_squeezed_activation_cancel():
    for c in (3, 7, 17):
        for opset in (11, 17):
            proto = conv1d_block(c, opset)
            model, result = _run(proto, [SinkTransposes(), EliminateDead()])
            # the Transposes cancel, then the Squeeze sinks below the Elu and meets the Unsqueeze
            assert result.fired("cancelled") == 2, (c, opset, result.records[0].stats)
            counts = model.graph.op_counts()
            assert counts == {"Transpose": 1, "Conv": 1, "Elu": 1, "MaxPool": 1}, (c, opset, counts)
            elu = model.graph.find_nodes("Elu")[0]
            assert elu.inputs[0].producer.op_type == "Conv"
            assert model.graph.find_nodes("MaxPool")[0].inputs[0].producer is elu
            verify(model.graph, Stage.FLOAT)
            want, got = run_ref(proto, _conv1d_feeds()), run_ref(model, _conv1d_feeds())
            assert [a.tobytes() for a in got] == [a.tobytes() for a in want], (c, opset)


def test_a_transpose_read_twice_stays_before_the_squeeze():
    for opset in (11, 17):
        proto = conv1d_block(7, opset, read_twice=True)
        model, _ = _run(proto, [SinkTransposes(), EliminateDead()])
        # the Transpose stays for the Relu; the Squeeze / Unsqueeze pair around the Elu still cancels
        relu = model.graph.find_nodes("Relu")[0]
        t = relu.inputs[0].producer
        assert t.op_type == "Transpose" and {c.op_type for c in t.outputs[0].consumers()} == {"Relu", "Elu"}
        assert model.graph.op_counts()["Transpose"] == 3, opset
        want, got = run_ref(proto, _conv1d_feeds()), run_ref(model, _conv1d_feeds())
        assert [a.tobytes() for a in got] == [a.tobytes() for a in want], opset


def _view_after_transpose(op: str, shape, perm, axes, opset: int) -> onnx.ModelProto:
    node, inits = _axes("axes", axes, opset, op, "t", "y")
    graph = helper.make_graph(
        [helper.make_node("Transpose", ["x"], ["t"], perm=perm), node],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_squeeze_and_unsqueeze_re_index_the_perm():
    # (op, x shape, perm, axes, Transposes left): each the same bytes as written
    cases = [
        ("Squeeze", (1, 7, 1, 17), [0, 2, 3, 1], [0], 1),  # [1, 1, 17, 7] -> [1, 17, 7]
        ("Squeeze", (1, 7, 1, 17), [0, 2, 3, 1], [0, 1], 1),  # -> [17, 7]
        ("Squeeze", (3, 1, 17, 1), [2, 1, 3, 0], [1, -2], 1),  # [17, 1, 1, 3] -> [17, 3]
        ("Squeeze", (7, 1, 3), [1, 0, 2], [0], 0),  # only a 1 moved: no Transpose after
        ("Unsqueeze", (7, 17, 3), [1, 2, 0], [0], 1),  # -> [1, 17, 3, 7]
        ("Unsqueeze", (7, 17, 3), [2, 0, 1], [1, -1], 1),  # -> [3, 1, 7, 17, 1]
        ("Unsqueeze", (3, 1, 17, 7), [0, 3, 1, 2], [2, 4], 1),
    ]
    rng = np.random.default_rng(9)
    for op, shape, perm, axes, left in cases:
        for opset in (11, 17):
            proto = _view_after_transpose(op, shape, perm, axes, opset)
            model, result = _run(proto, [SinkTransposes(), EliminateDead()])
            assert result.fired("moved") == 1, (op, perm, axes, opset)
            view = model.graph.find_nodes(op)[0]
            assert view.inputs[0].name == "x", (op, perm, axes)
            assert model.graph.op_counts().get("Transpose", 0) == left, (op, perm, axes)
            feeds = {"x": rng.normal(0.0, 1.0, shape).astype(F32)}
            want, got = run_ref(proto, feeds), run_ref(model, feeds)
            assert got[0].shape == want[0].shape and got[0].tobytes() == want[0].tobytes(), (op, perm, axes)


def test_a_squeeze_without_axes_stays():
    graph = helper.make_graph(
        [
            helper.make_node("Transpose", ["x"], ["t"], perm=[0, 2, 1]),
            helper.make_node("Squeeze", ["t"], ["y"]),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model, result = _run(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), [SinkTransposes()]
    )
    assert result.fired("moved") == 0
    assert model.graph.find_nodes("Squeeze")[0].inputs[0].producer.op_type == "Transpose"


def test_the_session_runs_the_conv1d_block_without_inner_transposes():
    proto = conv1d_block(17, 17)
    sess = quanta.InferenceSession(proto.SerializeToString())
    assert [s.op_type for s in sess.plan.steps].count("Transpose") == 1  # the input's
    off = quanta.SessionOptions()
    off.graph_optimization_level = quanta.GraphOptimizationLevel.ORT_DISABLE_ALL
    written = quanta.InferenceSession(proto.SerializeToString(), sess_options=off, backend="reference")
    x = _conv1d_feeds()
    # the native float convolution is within the float GEMM bound (FG1) of the
    # reference's, not bit for bit; the Transposes, Squeeze, Elu and MaxPool are exact
    np.testing.assert_allclose(sess.run(None, x)[0], written.run(None, x)[0], rtol=1e-5, atol=1e-5)


def _squeeze_chain(opset: int, *, un_axes: list[int], read_twice: bool = False) -> onnx.ModelProto:
    """x [1, 7, 1, 17] -> Squeeze(0, 2) -> Clip(-1, 1) -> Sigmoid -> Unsqueeze(un_axes) -> Neg -> y."""
    sq, i1 = _axes("sq_axes", [0, -2], opset, "Squeeze", "x", "s")
    un, i2 = _axes("un_axes", un_axes, opset, "Unsqueeze", "g", "u")
    nodes = [
        sq,
        helper.make_node("Clip", ["s", "lo", "hi"], ["k"]),
        helper.make_node("Sigmoid", ["k"], ["g"]),
        un,
        helper.make_node("Neg", ["u"], ["y"]),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if read_twice:
        outputs.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, None))
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 1, 17])],
        outputs,
        [_init("lo", F32(-1.0)), _init("hi", F32(1.0)), *i1, *i2],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_a_squeeze_sinks_through_unary_operators_and_cancels_its_unsqueeze():
    feeds = {"x": np.random.default_rng(6).normal(0.0, 2.0, (1, 7, 1, 17)).astype(F32)}
    for opset in (11, 17):
        for un_axes, cancels in (([0, 2], True), ([-2, -4], True), ([0, 1], False)):
            proto = _squeeze_chain(opset, un_axes=un_axes)
            model, result = _run(proto, [SinkTransposes(), EliminateDead()])
            counts = model.graph.op_counts()
            assert result.fired("moved") == 2, (opset, un_axes)  # below the Clip, then the Sigmoid
            if cancels:
                assert counts == {"Clip": 1, "Sigmoid": 1, "Neg": 1}, (opset, un_axes, counts)
            else:  # other axes: the Squeeze waits before the Unsqueeze
                assert model.graph.find_nodes("Unsqueeze")[0].inputs[0].producer.op_type == "Squeeze"
            want, got = run_ref(proto, feeds), run_ref(model, feeds)
            assert got[0].shape == want[0].shape and got[0].tobytes() == want[0].tobytes(), (opset, un_axes)


def test_a_squeeze_read_twice_stays():
    for opset in (11, 17):
        model, result = _run(_squeeze_chain(opset, un_axes=[0, 2], read_twice=True), [SinkTransposes()])
        assert result.fired("moved") == 0 and result.fired("cancelled") == 0
        assert model.graph.find_nodes("Clip")[0].inputs[0].producer.op_type == "Squeeze"
