"""FoldStaticDims (passes/rules/fold_static_dims.py): Gather / Slice of a Shape fold to
the static dimensions they select while the batch stays symbolic. Four parts (fired;
structure: the constant and the Shape kept for the batch; numerics: the reference's
Shape -> Gather/Slice gives the same integers; the verifier, run by run_passes); one
negative test per NoMatch reason; and quantize_static on a block with run-time "same"
padding (pads computed from the input's H and W, timm's ``pad_same``): the pads fold,
FoldPad folds the Pad, every convolution is integer."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.printer import format_graph
from quanta.passes.rules.fold_static_dims import FoldStaticDims
from tests.passes.helpers import run_passes, run_ref

X_SHAPE = ["batch", 3, 10, 7]


def shape_read_proto(
    op: str,
    *,
    index=(2,),
    starts=(-2,),
    ends=(2**62,),
    steps=None,
    axis=0,
    shape_start=None,
    index_input=False,
):
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, X_SHAPE)]
    inits = []
    shape_attrs = {} if shape_start is None else {"start": shape_start}
    nodes = [helper.make_node("Shape", ["x"], ["s"], name="shape", **shape_attrs)]
    if op == "Gather":
        if index_input:
            inputs.append(helper.make_tensor_value_info("i", TensorProto.INT64, [len(index)]))
        else:
            inits.append(numpy_helper.from_array(np.asarray(index, np.int64), "i"))
        nodes.append(helper.make_node("Gather", ["s", "i"], ["y"], axis=axis, name="read"))
    else:
        inits += [
            numpy_helper.from_array(np.asarray(starts, np.int64), "st"),
            numpy_helper.from_array(np.asarray(ends, np.int64), "en"),
            numpy_helper.from_array(np.zeros(len(starts), np.int64), "ax"),
        ]
        ins = ["s", "st", "en", "ax"]
        if steps is not None:
            inits.append(numpy_helper.from_array(np.asarray(steps, np.int64), "sp"))
            ins.append("sp")
        nodes.append(helper.make_node("Slice", ins, ["y"], name="read"))
    # the batch is read too, so the Shape must stay
    nodes.append(helper.make_node("Gather", ["s", "zero"], ["b"], axis=0, name="batch"))
    inits.append(numpy_helper.from_array(np.array(0, np.int64), "zero"))
    outputs = [
        helper.make_tensor_value_info("y", TensorProto.INT64, None),
        helper.make_tensor_value_info("b", TensorProto.INT64, None),
    ]
    g = helper.make_graph(nodes, "dims", inputs, outputs, inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(proto):
    f = {"x": np.zeros((2, 3, 10, 7), np.float32)}
    if any(i.name == "i" for i in proto.graph.input):
        f["i"] = np.array([2], np.int64)
    return f


@pytest.mark.parametrize(
    ("op", "kw", "want"),
    [
        ("Gather", {"index": (2,)}, [10]),
        ("Gather", {"index": (-1, 2)}, [7, 10]),
        ("Gather", {"index": 3}, 7),  # scalar index: scalar result
        ("Slice", {"starts": (-2,), "ends": (2**62,)}, [10, 7]),
        ("Slice", {"starts": (-1,), "ends": (0,), "steps": (-1,)}, [7, 10, 3]),  # step -1, as torch exports
    ],
)
def test_fold_static_dims_reads_the_static_dimensions(op, kw, want):
    proto = shape_read_proto(op, **kw)
    model = load(proto)
    result = run_passes(model, [FoldStaticDims()])
    assert result.fired("FoldStaticShapeElement") == 1
    (y,) = [v for v in model.graph.outputs if v.name == "y"]
    assert y.is_const and np.asarray(y.const).tolist() == want
    assert model.graph.op_counts() == {"Shape": 1, "Gather": 1}  # the batch's Gather stays
    f = feeds(proto)
    np.testing.assert_array_equal(run_ref(proto, f)[0], np.asarray(want))  # 0: integers


def test_fold_static_dims_counts_positions_from_shape_start():
    """Shape{start=2} returns dimensions 2 and 3: index 1 is dimension 3 (7), and the
    "batch" reader's index 0 is dimension 2 (10), static too."""
    proto = shape_read_proto("Gather", index=(1,), shape_start=2)
    model = load(proto)
    result = run_passes(model, [FoldStaticDims()])
    assert result.fired("FoldStaticShapeElement") == 2
    got = {v.name: np.asarray(v.const).tolist() for v in model.graph.outputs}
    assert got == {"y": [7], "b": 10}
    y, b = run_ref(proto, feeds(proto))
    assert (y.tolist(), b.tolist()) == ([7], 10)  # 0: integers


@pytest.mark.parametrize(
    ("op", "kw", "reason"),
    [
        (
            "Gather",
            {"index": (0, 2)},
            "'x' (a graph input) has symbolic dimension(s) at [0] among those read",
        ),
        ("Gather", {"index_input": True}, "Gather input 'i' (a graph input) is not a constant"),
        ("Gather", {"index": (7,)}, "Gather cannot be evaluated on the shape's positions: "),
    ],
)
def test_fold_static_dims_refuses_with_its_reason(op, kw, reason):
    proto = shape_read_proto(op, **kw)
    model = load(proto)
    before = format_graph(model.graph)
    p = FoldStaticDims()
    run_passes(model, [p])
    reasons = [r.reason for r in p.why_not("FoldStaticShapeElement") if r.node.startswith("'read'")]
    assert len(reasons) == 1 and reasons[0].startswith(reason), reasons
    assert format_graph(model.graph) == before


def test_fold_static_dims_refuses_an_unknown_rank():
    g = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["s"], name="shape"),
            helper.make_node("Gather", ["s", "i"], ["y"], axis=0, name="read"),
        ],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.INT64, None)],
        [numpy_helper.from_array(np.array([1], np.int64), "i")],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    p = FoldStaticDims()
    run_passes(model, [p])
    assert [r.reason for r in p.why_not("FoldStaticShapeElement")] == [
        "'x' (a graph input) has an unknown rank"
    ]


def dynamic_same_pad_proto():
    """x [batch, 4, 12, 12] -> Conv 1x1 -> Clip(0, 6) -> Pad with pads computed from
    Shape (pad = max((ceil(i / s) - 1)·s + k - i, 0), split pad//2 | pad - pad//2) ->
    depthwise Conv 3x3 stride 2 -> Clip -> Conv 1x1."""
    c = 4
    rng = np.random.default_rng(8)
    consts = {
        "w0": (rng.standard_normal((c, c, 1, 1)) * 0.5).astype(np.float32),
        "w1": (rng.standard_normal((c, 1, 3, 3)) * 0.5).astype(np.float32),
        "w2": (rng.standard_normal((3, c, 1, 1)) * 0.5).astype(np.float32),
        "lo": np.array(0.0, np.float32),
        "hi": np.array(6.0, np.float32),
        "hw_idx": np.array([2, 3], np.int64),
        "s": np.array(2, np.int64),
        "k": np.array(3, np.int64),
        "one": np.array(1, np.int64),
        "two": np.array(2, np.int64),
        "zero": np.array(0, np.int64),
        "zeros4": np.zeros(4, np.int64),
    }
    inits = [numpy_helper.from_array(v, k) for k, v in consts.items()]
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["e"], kernel_shape=[1, 1], name="expand"),
        helper.make_node("Clip", ["e", "lo", "hi"], ["a"], name="relu6"),
        helper.make_node("Shape", ["a"], ["sh"]),
        helper.make_node("Gather", ["sh", "hw_idx"], ["hw"], axis=0),
        # ceil(i / s) = (i + s - 1) / s in integers
        helper.make_node("Add", ["hw", "s"], ["t0"]),
        helper.make_node("Sub", ["t0", "one"], ["t1"]),
        helper.make_node("Div", ["t1", "s"], ["oc"]),
        helper.make_node("Sub", ["oc", "one"], ["t2"]),
        helper.make_node("Mul", ["t2", "s"], ["t3"]),
        helper.make_node("Add", ["t3", "k"], ["t4"]),
        helper.make_node("Sub", ["t4", "hw"], ["t5"]),
        helper.make_node("Max", ["t5", "zero"], ["pad"]),
        helper.make_node("Div", ["pad", "two"], ["begin"]),
        helper.make_node("Sub", ["pad", "begin"], ["end"]),
        helper.make_node("Slice", ["zeros4", "zero1", "two1"], ["nc"]),
        helper.make_node("Concat", ["nc", "begin", "nc", "end"], ["pads"], axis=0),
        helper.make_node("Pad", ["a", "pads"], ["p"], mode="constant", name="same_pad"),
        helper.make_node("Conv", ["p", "w1"], ["d"], kernel_shape=[3, 3], strides=[2, 2], group=c, name="dw"),
        helper.make_node("Clip", ["d", "lo", "hi"], ["a2"], name="relu6_2"),
        helper.make_node("Conv", ["a2", "w2"], ["y"], kernel_shape=[1, 1], name="project"),
    ]
    inits += [
        numpy_helper.from_array(np.array([0], np.int64), "zero1"),
        numpy_helper.from_array(np.array([2], np.int64), "two1"),
    ]
    g = helper.make_graph(
        nodes,
        "dynamic_same_pad",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", c, 12, 12])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3, 6, 6])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_run_time_same_padding_folds_and_every_conv_is_integer(tmp_path):
    """Failure signature: "Shape ... has shape ['batch', 4, 12, 12]: the dimensions read
    are not all static", the pads a run-time subgraph, the Pad float between the ReLU6
    and the depthwise Conv."""
    import quanta

    proto = dynamic_same_pad_proto()
    src, out = tmp_path / "dyn.onnx", tmp_path / "dyn.int8.onnx"
    onnx.save(proto, src)
    rng = np.random.default_rng(9)
    calib = [{"x": rng.standard_normal((2, 4, 12, 12)).astype(np.float32)} for _ in range(3)]
    quanta.quantize_static(src, out, calib, verbose=False)
    written = onnx.load(out)
    ops = {n.op_type for n in written.graph.node}
    assert not {"Pad", "Shape", "Gather", "Max"} & ops, ops
    (dw,) = [n for n in written.graph.node if n.name == "dw"]
    assert [a.ints for a in dw.attribute if a.name == "pads"] == [[0, 0, 1, 1]]  # pad 1 at the end: TF "same"
    steps = [s.op_type for s in quanta.InferenceSession(str(out)).plan.steps]
    assert "Conv" not in steps and steps.count("QLinearConv") == 2, steps
    x = rng.standard_normal((3, 4, 12, 12)).astype(np.float32)
    float_y = run_ref(proto, {"x": x})[0]
    assert float_y.shape == quanta.InferenceSession(str(out)).run(None, {"x": x})[0].shape
