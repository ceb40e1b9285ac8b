"""ChannelsLast (passes/lower/channels_last.py): the four parts (the regions it built;
the structure after it: channels-last convolutions, Transposes only at region edges;
bit-exact outputs on the reference target, since a Transpose moves bytes and the
channels-last twins compute the same elements with the same arithmetic; the verifier
in the lowered stage) and one negative test per refusal, asserting the reason.

The graphs are QOperator form written by hand: odd channel counts (3, 7, 17), distinct
scales and non-zero zero points everywhere, non-square images.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from quanta.ir.onnx_io import load
from quanta.ir.types import TensorType
from quanta.ir.verify import Stage
from quanta.passes.lower.channels_last import ChannelsLast, to_channels_first, to_channels_last
from quanta.session import GraphOptimizationLevel
from tests.ort_int8 import fit_s8
from tests.passes.helpers import run_passes, run_ref

MS = "com.microsoft"
RNG = np.random.default_rng(7)


class Builder:
    """A QOperator graph on uint8 activations; every tensor gets its own scale and zero
    point (distinct, non-zero)."""

    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def qparams(self, name: str) -> tuple[str, str]:
        self.k += 1
        s, z = f"{name}_scale", f"{name}_zp"
        self.inits.append(numpy_helper.from_array(np.array(0.02 + 0.013 * self.k, np.float32), s))
        self.inits.append(numpy_helper.from_array(np.array(100 + 3 * self.k, np.uint8), z))
        return s, z

    def conv(self, x: str, cin: int, cout: int, k: int, *, stride: int = 1, group: int = 1, name: str) -> str:
        w = fit_s8(RNG.integers(-90, 90, (cout, cin // group, k, k)).astype(np.int8))  # tests/ort_int8.py
        self.inits.append(numpy_helper.from_array(w, f"{name}_w"))
        self.inits.append(
            numpy_helper.from_array((RNG.random(cout) * 0.01 + 0.002).astype(np.float32), f"{name}_ws")
        )
        self.inits.append(numpy_helper.from_array(np.zeros(cout, np.int8), f"{name}_wz"))
        self.inits.append(
            numpy_helper.from_array(RNG.integers(-500, 500, cout).astype(np.int32), f"{name}_b")
        )
        sy, zy = self.qparams(name)
        sx, zx = f"{x}_scale", f"{x}_zp"
        self.nodes.append(
            helper.make_node(
                "QLinearConv",
                [x, sx, zx, f"{name}_w", f"{name}_ws", f"{name}_wz", sy, zy, f"{name}_b"],
                [name],
                name=name,
                kernel_shape=[k, k],
                pads=[k // 2] * 4,
                strides=[stride, stride],
                group=group,
            )
        )
        return name

    def add(self, a: str, b: str, name: str) -> str:
        sy, zy = self.qparams(name)
        self.nodes.append(
            helper.make_node(
                "QLinearAdd",
                [a, f"{a}_scale", f"{a}_zp", b, f"{b}_scale", f"{b}_zp", sy, zy],
                [name],
                name=name,
                domain=MS,
            )
        )
        return name

    def model(self, inputs: list[onnx.ValueInfoProto], outputs: list[str], rank: int = 4) -> onnx.ModelProto:
        outs = [helper.make_tensor_value_info(o, TensorProto.UINT8, [None] * rank) for o in outputs]
        g = helper.make_graph(self.nodes, "g", inputs, outs, self.inits)
        return helper.make_model(
            g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)], ir_version=8
        )


def u8_input(b: Builder, name: str, shape: list[int]) -> onnx.ValueInfoProto:
    b.qparams(name)
    return helper.make_tensor_value_info(name, TensorProto.UINT8, shape)


def feeds_for(proto: onnx.ModelProto) -> dict[str, np.ndarray]:
    out = {}
    for vi in proto.graph.input:
        shape = [d.dim_value for d in vi.type.tensor_type.shape.dim]
        out[vi.name] = RNG.integers(0, 256, shape).astype(np.uint8)
    return out


def residual_cnn() -> onnx.ModelProto:
    """stem 3->7 (stride 2), depthwise 7, project 7->17, a second branch 7->17 summed
    with QLinearAdd, a constant-operand QLinearAdd ([17, 1, 1] bias-like, broadcast),
    QLinearGlobalAveragePool; outputs: the pooled tensor and the sum (an NCHW graph
    output read from inside the region)."""
    b = Builder()
    x = u8_input(b, "x", [1, 3, 13, 10])
    s = b.conv("x", 3, 7, 3, stride=2, name="stem")
    d = b.conv(s, 7, 7, 3, group=7, name="dw")
    p = b.conv(d, 7, 17, 1, name="proj")
    q = b.conv(s, 7, 17, 1, name="side")
    r = b.add(p, q, "sum")
    c = RNG.integers(0, 256, (17, 1, 1)).astype(np.uint8)
    b.inits.append(numpy_helper.from_array(c, "cst"))
    b.qparams("cst")
    r2 = b.add(r, "cst", "sum_c")
    sy, zy = b.qparams("gap")
    b.nodes.append(
        helper.make_node(
            "QLinearGlobalAveragePool",
            [r2, f"{r2}_scale", f"{r2}_zp", sy, zy],
            ["gap"],
            name="gap",
            domain=MS,
        )
    )
    return b.model([x], ["gap", "sum"])


def transposes(model) -> list:
    return [n for n in model.graph.nodes if n.op_type == "Transpose"]


def test_perms_are_inverse() -> None:
    for rank in (3, 4):
        fwd, back = to_channels_last(rank), to_channels_first(rank)
        assert [fwd[p] for p in back] == list(range(rank))
    assert to_channels_last(4) == [0, 2, 3, 1] and to_channels_first(4) == [0, 3, 1, 2]


def test_residual_cnn_one_region() -> None:
    proto = residual_cnn()
    model = load(proto)
    p = ChannelsLast()
    result = run_passes(model, [p], stage=Stage.LOWERED)
    # 1. it fired: 4 convolutions, 2 Adds, the pool
    assert result.records[0].stats == {"nodes": 7, "convolutions": 4, "transposes": 3}
    # 2. structure: every conv is the channels-last contrib op; Transposes only at the edges:
    #    x in, and the two outputs back (the graph's NCHW outputs)
    convs = [n for n in model.graph.nodes if n.op_type == "QLinearConv"]
    assert len(convs) == 4 and all(n.domain == MS and n.attrs["channels_last"] == 1 for n in convs)
    gap = next(n for n in model.graph.nodes if n.op_type == "QLinearGlobalAveragePool")
    assert gap.attrs["channels_last"] == 1
    ts = transposes(model)
    assert sorted(tuple(n.attrs["perm"]) for n in ts) == [(0, 2, 3, 1), (0, 3, 1, 2), (0, 3, 1, 2)]
    assert ts[0].inputs[0].name == "x"
    assert {o.name for o in model.graph.outputs} == {"gap", "sum"}
    assert model.graph.value("sum").producer.op_type == "Transpose"
    # the constant operand was permuted once, broadcast rank made explicit
    assert model.graph.value("cst_nhwc").const.shape == (1, 1, 1, 17)
    assert p.refused == []
    # 3. bit-exact on the reference target
    feeds = feeds_for(proto)
    for e, a in zip(run_ref(proto, feeds), run_ref(model, feeds)):
        assert e.shape == a.shape and np.array_equal(e, a)
    # 4. the manager verified every step in the lowered stage (run_passes verify=True)


def test_second_run_changes_nothing() -> None:
    model = load(residual_cnn())
    run_passes(model, [ChannelsLast()], stage=Stage.LOWERED)
    before = [(n.op_type, n.domain) for n in model.graph.nodes]
    result = run_passes(model, [ChannelsLast()], stage=Stage.LOWERED)
    assert not result.records[0].modified
    assert [(n.op_type, n.domain) for n in model.graph.nodes] == before


def maxpool_cnn(pool_input_float: bool = False) -> onnx.ModelProto:
    """c1 (7 -> 17) -> MaxPool 3x3 s2 pad 1 -> c2 (17 -> 3): a ResNet stem's shape. With
    ``pool_input_float`` the pool reads a dequantized (float) tensor and the result is
    quantized again."""
    b = Builder()
    x = u8_input(b, "x", [1, 7, 9, 11])
    c1 = b.conv("x", 7, 17, 3, name="c1")
    pool_in = c1
    if pool_input_float:
        b.nodes.append(
            helper.make_node("DequantizeLinear", [c1, f"{c1}_scale", f"{c1}_zp"], ["c1f"], name="dq")
        )
        pool_in = "c1f"
    pool_out = "mpf" if pool_input_float else "mp"
    b.nodes.append(
        helper.make_node(
            "MaxPool",
            [pool_in],
            [pool_out],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
            name="mp",
        )
    )
    if pool_input_float:
        b.nodes.append(helper.make_node("QuantizeLinear", ["mpf", "c1_scale", "c1_zp"], ["mp"], name="q"))
    b.inits += [
        numpy_helper.from_array(
            numpy_helper.to_array(next(t for t in b.inits if t.name == "c1_scale")), "mp_scale"
        ),
        numpy_helper.from_array(
            numpy_helper.to_array(next(t for t in b.inits if t.name == "c1_zp")), "mp_zp"
        ),
    ]
    c2 = b.conv("mp", 17, 3, 3, name="c2")
    return b.model([x], [c2])


def test_quantized_maxpool_between_convs_joins_the_region() -> None:
    """An 8-bit MaxPool fed from a region becomes com.microsoft NhwcMaxPool inside it:
    no Transpose pair around the pool (a ResNet stem's 112x112x64 tensor)."""
    proto = maxpool_cnn()
    model = load(proto)
    p = ChannelsLast()
    run_passes(model, [p], stage=Stage.LOWERED)
    assert [tuple(n.attrs["perm"]) for n in transposes(model)] == [(0, 2, 3, 1), (0, 3, 1, 2)]
    pool = next(n for n in model.graph.nodes if n.op_type == "NhwcMaxPool")
    assert pool.domain == MS and pool.inputs[0].producer.op_type == "QLinearConv"
    assert p.refused == []
    feeds = feeds_for(proto)
    assert np.array_equal(run_ref(proto, feeds)[0], run_ref(model, feeds)[0])


def pad_pool_cnn(mode: str, *, runtime_pads: bool = False) -> onnx.ModelProto:
    """c1 (7 -> 17) -> Pad (1, 0 above and left, 2, 1 below and right; constant fill 37)
    -> MaxPool 3x3 s2 -> c2 (17 -> 3): a TensorFlow export's stem (open_nsfw's edge pad
    before its max pool). ``runtime_pads``: the pads are a graph input."""
    b = Builder()
    x = u8_input(b, "x", [1, 7, 9, 11])
    c1 = b.conv("x", 7, 17, 3, name="c1")
    inputs = [x]
    pads = np.array([0, 0, 1, 0, 0, 0, 2, 1], np.int64)
    if runtime_pads:
        inputs.append(helper.make_tensor_value_info("pads", TensorProto.INT64, [8]))
    else:
        b.inits.append(numpy_helper.from_array(pads, "pads"))
    b.inits.append(numpy_helper.from_array(np.array(37, np.uint8), "fill"))
    b.nodes.append(helper.make_node("Pad", [c1, "pads", "fill"], ["padded"], mode=mode, name="pad"))
    b.nodes.append(
        helper.make_node("MaxPool", ["padded"], ["mp"], kernel_shape=[3, 3], strides=[2, 2], name="mp")
    )
    for suffix in ("scale", "zp"):
        c1_param = next(t for t in b.inits if t.name == f"c1_{suffix}")
        b.inits.append(numpy_helper.from_array(numpy_helper.to_array(c1_param), f"mp_{suffix}"))
    c2 = b.conv("mp", 17, 3, 3, name="c2")
    return b.model(inputs, [c2])


def load_pad_pool(proto: onnx.ModelProto):
    """The model with the Pad's output typed as c1's quantized values (as QuantizePad
    leaves a Pad between two values of one quantized type)."""
    model = load(proto)
    pad = next(n for n in model.graph.nodes if n.op_type == "Pad")
    out = pad.outputs[0]
    out.type = TensorType(pad.inputs[0].elem, out.shape)
    return model


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect"])
def test_pad_between_convs_joins_the_region_with_its_pads_permuted(mode: str) -> None:
    """Failure signature: the pads left in NCHW order (the H pads applied to W and the
    channels padded), which changes the output shape or the bytes; the pads differ on
    every side so any misplaced one shows."""
    proto = pad_pool_cnn(mode)
    model = load_pad_pool(proto)
    p = ChannelsLast()
    run_passes(model, [p], stage=Stage.LOWERED)
    assert p.refused == []
    assert [tuple(n.attrs["perm"]) for n in transposes(model)] == [(0, 2, 3, 1), (0, 3, 1, 2)]
    pad = next(n for n in model.graph.nodes if n.op_type == "Pad")
    assert pad.inputs[0].producer.op_type == "QLinearConv"
    assert np.asarray(pad.inputs[1].const).tolist() == [0, 1, 0, 0, 0, 2, 1, 0]
    assert any(n.op_type == "NhwcMaxPool" for n in model.graph.nodes)
    feeds = feeds_for(proto)
    assert np.array_equal(run_ref(proto, feeds)[0], run_ref(model, feeds)[0])


def test_refuses_a_pad_of_runtime_pads() -> None:
    proto = pad_pool_cnn("edge", runtime_pads=True)
    model = load_pad_pool(proto)
    p = ChannelsLast()
    run_passes(model, [p], stage=Stage.LOWERED)
    assert ("'pad' (Pad)", "Pad without constant pads (or with pads as attributes, before opset 11)") in [
        (label, reason) for label, reason in p.refused
    ]
    pad = next(n for n in model.graph.nodes if n.op_type == "Pad")
    assert pad.inputs[1].name == "pads" and not any(n.op_type == "NhwcMaxPool" for n in model.graph.nodes)


def test_float_maxpool_splits_the_region() -> None:
    """A MaxPool on float data has no NhwcMaxPool form: the region would end before it
    (its DequantizeLinear reads NCHW) and a new one start after the QuantizeLinear, each
    a lone convolution, so neither is built: the kernels transpose themselves, and the
    graph has no Transpose steps."""
    proto = maxpool_cnn(pool_input_float=True)
    model = load(proto)
    p = ChannelsLast()
    run_passes(model, [p], stage=Stage.LOWERED)
    assert len(transposes(model)) == 0
    assert [r for _, r in p.refused] == ["a lone convolution: its kernel transposes, no Transpose steps"] * 2
    assert any(n.op_type == "MaxPool" and not n.domain for n in model.graph.nodes)
    feeds = feeds_for(proto)
    assert np.array_equal(run_ref(proto, feeds)[0], run_ref(model, feeds)[0])


def test_concat_axis_renumbered() -> None:
    b = Builder()
    x = u8_input(b, "x", [1, 3, 8, 5])
    c1 = b.conv("x", 3, 7, 3, name="c1")
    c2 = b.conv("x", 3, 17, 1, name="c2")
    sy, zy = b.qparams("cat")
    b.nodes.append(
        helper.make_node(
            "QLinearConcat",
            [sy, zy, c1, f"{c1}_scale", f"{c1}_zp", c2, f"{c2}_scale", f"{c2}_zp"],
            ["cat"],
            axis=1,
            name="cat",
            domain=MS,
        )
    )
    proto = b.model([x], ["cat"])
    model = load(proto)
    run_passes(model, [ChannelsLast()], stage=Stage.LOWERED)
    cat = next(n for n in model.graph.nodes if n.op_type == "QLinearConcat")
    assert cat.attrs["axis"] == 3
    feeds = feeds_for(proto)
    assert np.array_equal(run_ref(proto, feeds)[0], run_ref(model, feeds)[0])


def test_conv1d_rank3() -> None:
    b = Builder()
    x = u8_input(b, "x", [2, 7, 19])
    w = RNG.integers(-90, 90, (3, 7, 5)).astype(np.int8)
    b.inits += [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.float32(0.004), "ws"),
        numpy_helper.from_array(np.int8(0), "wz"),
    ]
    b.inits += [
        numpy_helper.from_array(RNG.integers(-90, 90, (5, 3, 3)).astype(np.int8), "w2"),
        numpy_helper.from_array(np.float32(0.006), "ws2"),
        numpy_helper.from_array(np.int8(0), "wz2"),
    ]
    sy, zy = b.qparams("y")
    sz, zz = b.qparams("z")
    b.nodes.append(
        helper.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "ws", "wz", sy, zy], ["y"], pads=[2, 2])
    )
    b.nodes.append(  # a second one: a lone convolution would not be a region
        helper.make_node("QLinearConv", ["y", sy, zy, "w2", "ws2", "wz2", sz, zz], ["z"], pads=[1, 1])
    )
    proto = b.model([x], ["z"], rank=3)
    model = load(proto)
    run_passes(model, [ChannelsLast()], stage=Stage.LOWERED)
    assert sorted(tuple(n.attrs["perm"]) for n in transposes(model)) == [(0, 2, 1), (0, 2, 1)]
    feeds = feeds_for(proto)
    assert np.array_equal(run_ref(proto, feeds)[0], run_ref(model, feeds)[0])


# -- refusals ---------------------------------------------------------------------


def test_refuses_an_add_with_a_channels_first_runtime_operand() -> None:
    b = Builder()
    x = u8_input(b, "x", [1, 3, 6, 7])
    y_in = u8_input(b, "y", [1, 7, 6, 7])
    c = b.conv("x", 3, 7, 3, name="c")
    b.add(c, "y", "s")
    proto = b.model([x, y_in], ["s"])
    model = load(proto)
    p = ChannelsLast()
    run_passes(model, [p], stage=Stage.LOWERED)
    assert p.refused == [
        ("'s' (QLinearAdd)", "input 3 'y' is computed channels-first and is not a constant"),
        ("'c' (QLinearConv)", "a lone convolution: its kernel transposes, no Transpose steps"),
    ]
    add = next(n for n in model.graph.nodes if n.op_type == "QLinearAdd")
    assert add.inputs[0].producer.op_type == "QLinearConv"  # the conv stayed NCHW
    feeds = feeds_for(proto)
    assert np.array_equal(run_ref(proto, feeds)[0], run_ref(model, feeds)[0])


def test_refuses_an_unknown_rank() -> None:
    b = Builder()
    b.qparams("x")
    x = helper.make_tensor_value_info("x", TensorProto.UINT8, None)
    b.conv("x", 3, 7, 3, name="c")
    model = load(b.model([x], ["c"]), infer_shapes=False)
    p = ChannelsLast()
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert not result.records[0].modified
    assert p.refused == [("'c' (QLinearConv)", "input rank None: channels-last takes rank 3 or 4")]


@pytest.mark.parametrize("rank", [5])
def test_refuses_3d_convolution(rank: int) -> None:
    b = Builder()
    x = u8_input(b, "x", [1, 3, 4, 5, 6])
    w = RNG.integers(-90, 90, (7, 3, 1, 1, 1)).astype(np.int8)
    b.inits += [
        numpy_helper.from_array(w, "w"),
        numpy_helper.from_array(np.float32(0.004), "ws"),
        numpy_helper.from_array(np.int8(0), "wz"),
    ]
    sy, zy = b.qparams("y")
    b.nodes.append(helper.make_node("QLinearConv", ["x", "x_scale", "x_zp", "w", "ws", "wz", sy, zy], ["y"]))
    model = load(b.model([x], ["y"], rank=5))
    p = ChannelsLast()
    run_passes(model, [p], stage=Stage.LOWERED)
    assert p.refused == [("(QLinearConv)", f"input rank {rank}: channels-last takes rank 3 or 4")]


def test_channels_last_model_runs_in_onnxruntime(tmp_path):
    """The rewritten graph is what ONNX Runtime's own NhwcTransformer produces
    (com.microsoft QLinearConv with channels_last=1): ONNX Runtime runs the saved file
    and agrees with the reference bit for bit on the integer outputs."""
    ort = pytest.importorskip("onnxruntime")
    proto = residual_cnn()
    model = load(proto)
    run_passes(model, [ChannelsLast()], stage=Stage.LOWERED)
    path = tmp_path / "nhwc.onnx"
    check_in_ort(ort, model, proto, path)
    pool_proto = maxpool_cnn()
    pool_model = load(pool_proto)
    run_passes(pool_model, [ChannelsLast()], stage=Stage.LOWERED)
    assert any(n.op_type == "NhwcMaxPool" for n in pool_model.graph.nodes)
    check_in_ort(ort, pool_model, pool_proto, tmp_path / "nhwc_pool.onnx")


def check_in_ort(ort, model, proto, path) -> None:
    from quanta.ir.onnx_io import save

    save(model, path)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    f = feeds_for(proto)
    theirs = sess.run(None, f)
    ours = run_ref(model, f)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert (
            np.max(np.abs(a.astype(np.int32) - b.astype(np.int32))) <= 1
        )  # ORT's QLinearAdd rounds its own way


# -- quanta MlasQLinearConv (ORT's saturating QLinearConv on ORT's files) ---------------


def mlas_conv(
    b: Builder, x: str, cin: int, cout: int, k: int, *, stride: int = 1, group: int = 1, name: str
) -> str:
    """One quanta MlasQLinearConv: heavy int8 weights (±127 on most taps, so pairs of
    products saturate), asymmetric pads, per-channel scales and zero points not 0."""
    w = RNG.integers(-128, 128, (cout, cin // group, k, k))
    w = np.where(RNG.random(w.shape) < 0.6, np.where(RNG.random(w.shape) < 0.5, -128, 127), w).astype(np.int8)
    b.inits += [
        numpy_helper.from_array(w, f"{name}_w"),
        numpy_helper.from_array((RNG.random(cout) * 0.002 + 0.0005).astype(np.float32), f"{name}_ws"),
        numpy_helper.from_array(RNG.integers(-3, 4, cout).astype(np.int8), f"{name}_wz"),
        numpy_helper.from_array(RNG.integers(-9000, 9000, cout).astype(np.int32), f"{name}_b"),
    ]
    sy, zy = b.qparams(name)
    p = k // 2
    b.nodes.append(
        helper.make_node(
            "MlasQLinearConv",
            [x, f"{x}_scale", f"{x}_zp", f"{name}_w", f"{name}_ws", f"{name}_wz", sy, zy, f"{name}_b"],
            [name],
            name=name,
            domain="quanta",
            pads=[p, max(p - 1, 0), p, p],
            strides=[stride, stride],
            dilations=[1, 1],
            group=group,
        )
    )
    return name


def mlas_chain() -> onnx.ModelProto:
    """ORT's NhwcTransformer's case on quanta's model of its kernel: stem 3 -> 7 (3x3,
    stride 2) -> 7 -> 17 pointwise -> 17 -> 3 (5x5) -> grouped 3 -> 6 (3 groups), a
    com.microsoft depthwise QLinearConv and an 8-bit MaxPool between them, on an odd
    13 x 19 image; outputs: the last convolution and an NCHW value read inside."""
    b = Builder()
    x = u8_input(b, "x", [2, 3, 13, 19])
    s = mlas_conv(b, "x", 3, 7, 3, stride=2, name="stem")
    p = mlas_conv(b, s, 7, 17, 1, name="pw")
    d = b.conv(p, 17, 17, 3, group=17, name="dw")
    b.nodes.append(helper.make_node("MaxPool", [d], ["mp"], kernel_shape=[2, 2], strides=[1, 1], name="mp"))
    b.inits += [
        numpy_helper.from_array(numpy_helper.to_array(next(t for t in b.inits if t.name == n)), f"mp_{k}")
        for n, k in (("dw_scale", "scale"), ("dw_zp", "zp"))
    ]
    c = mlas_conv(b, "mp", 17, 3, 5, name="c5")
    g = mlas_conv(b, c, 3, 6, 3, group=3, name="grouped")
    proto = b.model([x], [g, p])
    proto.opset_import.append(helper.make_opsetid("quanta", 1))
    return proto


def test_mlas_qlinear_convs_exchange_nhwc_tensors() -> None:
    """MlasQLinearConvs join the region as channels-last operators: one Transpose in (the
    image), one out per NCHW output, none between the convolutions; the outputs are
    bit-identical on the reference target and on the native one (the kernel's
    channels-last mode), at 1 and 2 threads, to the NCHW graph's."""
    from quanta import InferenceSession, SessionOptions
    from quanta.ir.onnx_io import to_proto

    proto = mlas_chain()
    model = load(proto)
    p = ChannelsLast()
    result = run_passes(model, [p], stage=Stage.LOWERED)
    assert result.records[0].stats == {"nodes": 6, "convolutions": 5, "transposes": 3}
    convs = [n for n in model.graph.nodes if n.op_type == "MlasQLinearConv"]
    assert len(convs) == 4 and all(n.domain == "quanta" and n.attrs["channels_last"] == 1 for n in convs)
    assert sorted(tuple(n.attrs["perm"]) for n in transposes(model)) == [
        (0, 2, 3, 1),
        (0, 3, 1, 2),
        (0, 3, 1, 2),
    ]
    assert p.refused == []
    feeds = feeds_for(proto)
    expected = run_ref(proto, feeds)
    for e, a in zip(expected, run_ref(model, feeds)):
        assert e.shape == a.shape and np.array_equal(e, a)
    rewritten = to_proto(model)
    for threads in (1, 2):
        opts = SessionOptions(graph_optimization_level=GraphOptimizationLevel.ORT_DISABLE_ALL)
        opts.intra_op_num_threads = threads
        sess = InferenceSession(rewritten, opts)
        kernels = {s.name: s.kernel.name for s in sess.plan.steps if s.op_type == "MlasQLinearConv"}
        assert set(kernels.values()) == {"native:mlas_qconv"}, kernels
        for e, a in zip(expected, sess.run(None, feeds)):
            assert e.shape == a.shape and np.array_equal(e, a), threads


def test_a_lone_mlas_qlinear_conv_stays_channels_first() -> None:
    b = Builder()
    x = u8_input(b, "x", [1, 7, 9, 5])
    mlas_conv(b, "x", 7, 3, 3, name="lone")
    proto = b.model([x], ["lone"])
    proto.opset_import.append(helper.make_opsetid("quanta", 1))
    model = load(proto)
    p = ChannelsLast()
    run_passes(model, [p], stage=Stage.LOWERED)
    assert p.refused == [
        ("'lone' (MlasQLinearConv)", "a lone convolution: its kernel transposes, no Transpose steps")
    ]
    assert not transposes(model) and "channels_last" not in model.graph.nodes[0].attrs
