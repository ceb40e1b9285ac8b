"""FoldPad (passes/rules/fold_pad.py): a zero constant Pad before a Conv (or an
AveragePool whose divisor counts the padding) becomes the op's own padding. Four parts (fired; structure and the summed pads; bit-exact
numerics on the reference target, since the Conv reads the same padded tensor; the
verifier, run by run_passes) for 2-D, 1-D, the opset-18 ``axes`` input and auto_pad
VALID; one negative test per NoMatch reason, each asserting the reason and that the
graph is unchanged. Plus quantize_static on an EfficientNet-style block (ReLU6, then a
"same" Pad whose pads come from a ConstantOfShape/Slice(step -1)/Concat subgraph, then a
depthwise Conv): every convolution lowers to an integer kernel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.passes.rules.fold_pad import FoldPad
from tests.passes.helpers import rng_data, run_passes, run_ref


def pad_conv_proto(
    *,
    x_shape=(2, 3, 9, 7),
    pads=(0, 0, 0, 1, 0, 0, 2, 1),
    value: float | None = 0.0,
    mode: str = "constant",
    conv_pads=(1, 0, 0, 2),
    auto_pad: str | None = None,
    axes=None,
    group: int = 1,
    strides=(2, 1),
    opset: int = 17,
    pads_as_input: bool = False,
    value_as_input: bool = False,
    extra_pad_user: bool = False,
):
    c = x_shape[1]
    n = len(x_shape) - 2
    m_out = 4 if group == 1 else c
    w = rng_data((m_out, c // group, *([3] * n)), seed=1)
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(rng_data((m_out,), seed=2), "B")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))]
    pad_inputs = ["x", "pads"]
    if pads_as_input:
        inputs.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [len(pads)]))
    else:
        inits.append(numpy_helper.from_array(np.asarray(pads, np.int64), "pads"))
    if value is not None or value_as_input:
        pad_inputs.append("v")
        if value_as_input:
            inputs.append(helper.make_tensor_value_info("v", TensorProto.FLOAT, []))
        else:
            inits.append(numpy_helper.from_array(np.asarray(value, np.float32), "v"))
    if axes is not None:
        if len(pad_inputs) == 2:
            pad_inputs.append("")
        pad_inputs.append("axes")
        inits.append(numpy_helper.from_array(np.asarray(axes, np.int64), "axes"))
    conv_attrs = {"kernel_shape": [3] * n, "strides": list(strides), "group": group}
    if auto_pad is not None:
        conv_attrs["auto_pad"] = auto_pad
    else:
        conv_attrs["pads"] = list(conv_pads)
    nodes = [
        helper.make_node("Pad", pad_inputs, ["p"], mode=mode, name="pad"),
        helper.make_node("Conv", ["p", "W", "B"], ["y"], name="conv", **conv_attrs),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if extra_pad_user:
        nodes.append(helper.make_node("Relu", ["p"], ["r"], name="relu"))
        outputs.append(helper.make_tensor_value_info("r", TensorProto.FLOAT, None))
    g = helper.make_graph(nodes, "pad_conv", inputs, outputs, inits)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(proto)


def feeds_for(proto, seed: int = 3):
    out = {}
    for i in proto.graph.input:
        if i.name == "x":
            out["x"] = rng_data([d.dim_value for d in i.type.tensor_type.shape.dim], seed=seed)
    return out


def fold(proto):
    model = load(proto)
    p = FoldPad()
    result = run_passes(model, [p])
    return model, p, result


def conv_node(model):
    (conv,) = [n for n in model.graph.nodes if n.op_type == "Conv"]
    return conv


@pytest.mark.parametrize(
    ("x_shape", "pads", "conv_pads", "strides", "group"),
    [
        ((2, 3, 9, 7), (0, 0, 0, 1, 0, 0, 2, 1), (1, 0, 0, 2), (2, 1), 1),  # asymmetric, stride 2 (TF "same")
        ((1, 5, 8, 8), (0, 0, 1, 1, 0, 0, 1, 1), (0, 0, 0, 0), (1, 1), 5),  # depthwise, symmetric
        ((2, 3, 11), (0, 0, 2, 0, 0, 1), (0, 3), (3,), 1),  # 1-D
    ],
)
def test_fold_pad_into_conv_sums_the_pads_bit_exact(x_shape, pads, conv_pads, strides, group):
    proto = pad_conv_proto(x_shape=x_shape, pads=pads, conv_pads=conv_pads, strides=strides, group=group)
    model, _, result = fold(proto)
    assert result.fired("FoldPadIntoConv") == 1
    assert model.graph.op_counts() == {"Conv": 1}
    n, r = len(x_shape) - 2, len(x_shape)
    want = [conv_pads[i] + pads[2 + i] for i in range(n)] + [
        conv_pads[n + i] + pads[r + 2 + i] for i in range(n)
    ]
    assert conv_node(model).attrs["pads"] == want
    f = feeds_for(proto)
    # 0: the Conv reads the same zero-padded tensor either way (same values, same order)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_fold_pad_omitted_value_and_opset18_axes():
    proto = pad_conv_proto(value=None, axes=[2, 3], pads=(1, 0, 2, 1), opset=18)
    model, _, result = fold(proto)
    assert result.fired("FoldPadIntoConv") == 1
    assert conv_node(model).attrs["pads"] == [1 + 1, 0 + 0, 0 + 2, 2 + 1]
    f = feeds_for(proto)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


def test_fold_pad_auto_pad_valid_becomes_explicit_pads():
    proto = pad_conv_proto(auto_pad="VALID")
    model, _, result = fold(proto)
    assert result.fired("FoldPadIntoConv") == 1
    conv = conv_node(model)
    assert "auto_pad" not in conv.attrs and conv.attrs["pads"] == [0, 1, 2, 1]
    f = feeds_for(proto)
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"mode": "reflect"}, "Pad mode is 'reflect': only constant padding is what a Conv pads with"),
        ({"value": 1.5}, "the pad value is [1.5] (not +0.0): a Conv pads with zeros"),
        ({"value": -0.0}, "the pad value is [-0.0] (not +0.0): a Conv pads with zeros"),
        ({"value_as_input": True}, "the pad value 'v' (a graph input) is not a constant"),
        ({"pads_as_input": True}, "pads 'pads' (a graph input) are not a constant"),
        ({"auto_pad": "SAME_UPPER"}, "Conv auto_pad is SAME_UPPER: its pads depend on the input size"),
        (
            {"pads": (0, 1, 0, 0, 0, 0, 0, 0)},
            "Pad pads the batch or channel axis (begin [0, 1], end [0, 0])",
        ),
        (
            {"pads": (0, 0, -1, 0, 0, 0, 1, 0)},
            "a negative pad (begin [0, 0, -1, 0], end [0, 0, 1, 0]) crops: no Conv padding expresses it",
        ),
        ({"axes": [2, 3], "opset": 18}, "8 pads for 2 axes"),
    ],
)
def test_fold_pad_refuses_with_its_reason(kw, reason):
    proto = pad_conv_proto(**kw)
    model = load(proto)
    before = format_graph(model.graph)
    p = FoldPad()
    result = run_passes(model, [p])
    assert not result.records[0].modified
    assert [r.reason for r in p.why_not("FoldPadIntoConv")] == [reason]
    assert format_graph(model.graph) == before


def test_fold_pad_refuses_a_pad_read_by_another_node():
    proto = pad_conv_proto(extra_pad_user=True)
    model = load(proto)
    before = format_graph(model.graph)
    p = FoldPad()
    run_passes(model, [p])
    (r,) = p.why_not("FoldPadIntoConv")
    assert r.kind == "shared" and "also used by 'relu' (Relu)" in r.reason
    assert format_graph(model.graph) == before


def same_padding_block_proto():
    """Clip(0, 6) -> Pad (pads from ConstantOfShape / Slice step -1 / Concat, as the
    EfficientNet-Lite export writes "same" padding) -> depthwise Conv stride 2 -> Clip
    -> pointwise Conv; batch symbolic."""
    c, hw = 8, 12
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array((rng.standard_normal((c, 3, 1, 1)) * 0.5).astype(np.float32), "w0"),
        numpy_helper.from_array((rng.standard_normal((c, 1, 3, 3)) * 0.5).astype(np.float32), "w1"),
        numpy_helper.from_array((rng.standard_normal((4, c, 1, 1)) * 0.5).astype(np.float32), "w2"),
        numpy_helper.from_array(np.array(0.0, np.float32), "lo"),
        numpy_helper.from_array(np.array(6.0, np.float32), "hi"),
        # [pad_w_begin, pad_w_end, pad_h_begin, pad_h_end] as torch.nn.functional.pad takes them
        numpy_helper.from_array(np.array([0, 1, 0, 1], np.int64), "torch_pads"),
        numpy_helper.from_array(np.array([4], np.int64), "n_zero"),
        numpy_helper.from_array(np.array([-1, 2], np.int64), "pairs"),
        numpy_helper.from_array(np.array([-1], np.int64), "start"),
        numpy_helper.from_array(np.array([-(2**63) + 1], np.int64), "stop"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
        numpy_helper.from_array(np.array([-1], np.int64), "step"),
        numpy_helper.from_array(np.array([-1], np.int64), "flat"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["e"], kernel_shape=[1, 1], name="expand"),
        helper.make_node("Clip", ["e", "lo", "hi"], ["a"], name="relu6"),
        helper.make_node(
            "ConstantOfShape", ["n_zero"], ["zeros"], value=numpy_helper.from_array(np.array([0], np.int64))
        ),
        helper.make_node("Concat", ["torch_pads", "zeros"], ["cat"], axis=0),
        helper.make_node("Reshape", ["cat", "pairs"], ["pairs2"]),
        helper.make_node("Slice", ["pairs2", "start", "stop", "axis0", "step"], ["rev"]),
        helper.make_node("Transpose", ["rev"], ["t"], perm=[1, 0]),
        helper.make_node("Reshape", ["t", "flat"], ["flat_pads"]),
        helper.make_node("Cast", ["flat_pads"], ["pads"], to=TensorProto.INT64),
        helper.make_node("Pad", ["a", "pads", "zero"], ["p"], mode="constant", name="same_pad"),
        helper.make_node("Conv", ["p", "w1"], ["d"], kernel_shape=[3, 3], strides=[2, 2], group=c, name="dw"),
        helper.make_node("Clip", ["d", "lo", "hi"], ["a2"], name="relu6_2"),
        helper.make_node("Conv", ["a2", "w2"], ["y"], kernel_shape=[1, 1], name="project"),
    ]
    g = helper.make_graph(
        nodes,
        "same_padding",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, hw, hw])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4, hw // 2, hw // 2])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_same_padding_block_quantizes_every_convolution(tmp_path):
    """Failure signature: the expand Conv and its ReLU6 stayed float ("its output feeds
    only float ops") because the float Pad sat between them and the depthwise Conv."""
    import quanta

    proto = same_padding_block_proto()
    src, out = tmp_path / "same.onnx", tmp_path / "same.int8.onnx"
    onnx.save(proto, src)
    rng = np.random.default_rng(6)
    calib = [{"x": rng.standard_normal((2, 3, 12, 12)).astype(np.float32)} for _ in range(3)]
    quanta.quantize_static(src, out, calib, verbose=False)
    written = onnx.load(out)
    assert "Pad" not in {n.op_type for n in written.graph.node}
    ops = [s.op_type for s in quanta.InferenceSession(str(out)).plan.steps]
    # the last Conv's output is the float graph output: ConvInteger, then a float rescale
    assert ops.count("QLinearConv") == 2 and ops.count("ConvInteger") == 1 and "Conv" not in ops, ops


def pad_pool_proto(*, pool_pads=(0, 0, 0, 0), count_include_pad=None, ceil_mode=None):
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": list(pool_pads)}
    if count_include_pad is not None:
        attrs["count_include_pad"] = count_include_pad
    if ceil_mode is not None:
        attrs["ceil_mode"] = ceil_mode
    g = helper.make_graph(
        [
            helper.make_node("Pad", ["x", "pads"], ["p"], mode="constant", name="pad"),
            helper.make_node("AveragePool", ["p"], ["y"], name="pool", **attrs),
        ],
        "pad_pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 9, 7])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64), "pads")],
    )
    return onnx.shape_inference.infer_shapes(
        helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    )


@pytest.mark.parametrize(
    ("kw", "want_pads"),
    [
        ({}, [1, 0, 2, 1]),  # no pads of its own: count_include_pad=0 counted every cell it saw
        ({"pool_pads": (1, 1, 0, 1), "count_include_pad": 1}, [2, 1, 2, 2]),
    ],
)
def test_fold_pad_into_average_pool_bit_exact(kw, want_pads):
    proto = pad_pool_proto(**kw)
    model, _, result = fold(proto)
    assert result.fired("FoldPadIntoAveragePool") == 1
    (pool,) = model.graph.nodes
    assert (
        pool.op_type == "AveragePool"
        and pool.attrs["pads"] == want_pads
        and pool.attrs["count_include_pad"] == 1
    )
    f = feeds_for(proto)
    # 0: the same windows of the same zero-padded tensor, divided by the kernel size
    np.testing.assert_array_equal(run_ref(proto, f)[0], run_ref(model, f)[0])


@pytest.mark.parametrize(
    ("kw", "reason"),
    [
        ({"ceil_mode": 1}, "AveragePool has ceil_mode=1: a window past the padding would count differently"),
        (
            {"pool_pads": (1, 0, 1, 0), "count_include_pad": 0},
            "AveragePool has pads of its own and count_include_pad=0: its divisor excludes them, the Pad's cells count",
        ),
    ],
)
def test_fold_pad_into_average_pool_refuses_with_its_reason(kw, reason):
    proto = pad_pool_proto(**kw)
    model = load(proto)
    before = format_graph(model.graph)
    p = FoldPad()
    run_passes(model, [p])
    assert [r.reason for r in p.why_not("FoldPadIntoAveragePool")] == [reason]
    assert format_graph(model.graph) == before


def pad_maxpool_proto(*, mode="edge", relu=False, value=0.0, dilations=(1, 1), pads=(0, 0, 0, 1, 0, 0, 1, 1)):
    """x [1, 7, 9, 11] -> (Relu) -> Pad -> MaxPool 3x3 stride 2: TF's "same" MaxPool."""
    inits = [numpy_helper.from_array(np.asarray(pads, np.int64), "pads")]
    pad_inputs = ["r" if relu else "x", "pads"]
    if mode == "constant":
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), "v"))
        pad_inputs.append("v")
    nodes = [helper.make_node("Relu", ["x"], ["r"])] if relu else []
    nodes += [
        helper.make_node("Pad", pad_inputs, ["p"], mode=mode),
        helper.make_node(
            "MaxPool", ["p"], ["y"], kernel_shape=[3, 3], strides=[2, 2], dilations=list(dilations)
        ),
    ]
    graph = helper.make_graph(
        nodes,
        "pad_maxpool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 7, 9, 11])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(("mode", "relu"), [("edge", False), ("edge", True), ("constant", True)])
def test_pad_folds_into_maxpool_when_the_maxima_are_the_same(mode, relu):
    proto = pad_maxpool_proto(mode=mode, relu=relu)
    model = load(proto)
    result = run_passes(model, [FoldPad()])
    assert result.fired("FoldPadIntoMaxPool") == 1
    assert "Pad" not in model.graph.op_counts()
    assert model.graph.find_nodes("MaxPool")[0].attrs["pads"] == [0, 1, 1, 1]
    # negative inputs included: an edge pad repeats a cell of the window, a zero pad
    # follows a Relu
    x = {"x": np.random.default_rng(4).normal(-0.5, 1.0, (1, 7, 9, 11)).astype(np.float32)}
    assert run_ref(model, x)[0].tobytes() == run_ref(proto, x)[0].tobytes()


@pytest.mark.parametrize(
    ("kwargs", "reason"),
    [
        (dict(mode="constant"), "may be negative: a zero pad is not a -inf pad for it"),
        (dict(dilations=(2, 1)), "an edge Pad before a dilated MaxPool: a window may skip the border cell"),
        (dict(mode="constant", relu=True, value=-1.0), "the pad value is [-1.0] (not +0.0)"),
    ],
)
def test_maxpool_fold_refusals_leave_the_graph_unchanged(kwargs, reason):
    model = load(pad_maxpool_proto(**kwargs))
    before = model.graph.op_counts()
    result = run_passes(model, [FoldPad()])
    assert result.fired("FoldPadIntoMaxPool") == 0
    assert any(reason in r.reason for r in result.why_not("FoldPadIntoMaxPool")), result.why_not(
        "FoldPadIntoMaxPool"
    )
    assert model.graph.op_counts() == before
