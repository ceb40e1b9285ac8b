"""BlockedFloatLayout (passes/lower/nchwc.py): the regions it builds (blocked
convolutions, pools and the agnostic operators between them, reorders only at the
edges), the outputs on the reference target before and after (exact but for the
convolutions' summation order, eq. (FG1)), the verifier after it, and one test per
refusal, asserting the reason.

Graphs written by hand: odd channel counts (3, 17, 60, 120), non-square images, strides,
asymmetric pads, distinct per-channel constants.
"""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.kernels.reference import nchwc as ref
from quanta.passes.lower.nchwc import BlockedFloatLayout
from quanta.passes.rules.eliminate_dead import EliminateDead
from quanta.passes.rules.fuse_activation import FuseFloatActivation
from quanta.passes.rules.fuse_float_gate import FuseFloatGate
from quanta.runtime.compile import blocked_layout_enabled
from tests.passes.helpers import run_passes, run_ref

RNG = np.random.default_rng(11)


class Builder:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []

    def const(self, name: str, a: np.ndarray) -> str:
        self.inits.append(numpy_helper.from_array(a, name))
        return name

    def node(self, op: str, ins: list[str], out: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def conv(
        self, x: str, cin: int, cout: int, k: tuple[int, int], name: str, *, group: int = 1, **attrs
    ) -> str:
        w = (RNG.standard_normal((cout, cin // group, *k)) / np.sqrt(cin // group * k[0] * k[1])).astype(
            np.float32
        )
        b = RNG.standard_normal(cout).astype(np.float32) * 0.1
        return self.node(
            "Conv", [x, self.const(f"{name}_w", w), self.const(f"{name}_b", b)], name, group=group, **attrs
        )

    def model(self, inputs: dict[str, list[int]], outputs: list[str]) -> onnx.ModelProto:
        g = helper.make_graph(
            self.nodes,
            "g",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
            self.inits,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        return onnx.shape_inference.infer_shapes(m)


def _blocked(proto: onnx.ModelProto) -> tuple[BlockedFloatLayout, object, dict[str, int]]:
    model = load(proto)
    layout = BlockedFloatLayout(enabled=True)
    run_passes(model, [FuseFloatActivation(), FuseFloatGate(), EliminateDead(), layout])
    counts = collections.Counter(n.op_type for n in model.graph.nodes)
    return layout, model, counts


def _check_outputs(proto: onnx.ModelProto, model, feeds: dict[str, np.ndarray]) -> None:
    before = run_ref(proto, feeds)
    after = run_ref(model, feeds)
    for b, a in zip(before, after):
        assert a.shape == b.shape and a.dtype == b.dtype
        # the padded convolutions sum in another order: eq. (FG1)-sized differences
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=2e-5)


def test_a_detector_chain_runs_blocked_with_reorders_only_at_its_edges():
    b = Builder()
    y = b.conv("x", 3, 16, (3, 3), "stem", strides=[2, 2], pads=[1, 0, 1, 2])
    y = b.node("Mul", [y, b.node("Sigmoid", [y], "stem_sig")], "stem_silu")
    y = b.conv(y, 16, 32, (3, 3), "c1", pads=[1, 1, 1, 1])
    y = b.node("Relu", [y], "c1_relu")
    b.nodes.append(
        helper.make_node("Split", [y, b.const("sizes", np.array([16, 16], np.int64))], ["p0", "p1"], axis=1)
    )
    z = b.conv("p1", 16, 16, (1, 1), "c2")
    z = b.node("Add", ["p0", z], "res")
    y = b.node("Concat", ["p0", z, "p1"], "cat", axis=1)
    y = b.node("MaxPool", [y], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    y = b.node("Resize", [y, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))], "up", mode="nearest")
    y = b.conv(y, 48, 120, (3, 1), "c3", pads=[1, 0, 1, 0])  # 8 pad lanes in its last block
    y = b.node("Mul", [y, b.const("gain", RNG.uniform(0.5, 2, (120, 1, 1)).astype(np.float32))], "scaled")
    y = b.node("Add", [y, b.const("shift", np.array(0.25, np.float32))], "shifted")
    y = b.node(
        "Clip", [y, b.const("lo", np.array(-1, np.float32)), b.const("hi", np.array(1.5, np.float32))], "clip"
    )
    gap = b.node("GlobalAveragePool", [y], "gap")
    flat = b.node("Flatten", [y], "flat")
    proto = b.model({"x": [1, 3, 21, 18]}, [gap, flat])
    layout, model, counts = _blocked(proto)
    assert counts["ConvNchwc"] == 4 and counts["Conv"] == 0, (counts, [n.name for n in model.graph.nodes])
    assert counts["MaxPoolNchwc"] == 1 and counts["GlobalAveragePoolNchwc"] == 1
    # the stem reads the NCHW input; one reorder out for the Flatten, one for gap's output
    assert counts["ReorderNchwc"] == 0 and counts["ReorderNchw"] == 2, counts
    stem = next(n for n in model.graph.nodes if n.op_type == "ConvNchwc")
    assert stem.attrs["input_nchw"] == 1 and stem.attrs["pads"] == [1, 0, 1, 2]
    assert stem.attrs["activation"] == "SiLU"
    for v in model.graph.values():
        if v.producer is not None and v.producer.op_type in ("ConvNchwc", "MaxPoolNchwc", "Concat", "Split"):
            assert v.shape is not None and len(v.shape) == 5 and v.shape[-1] == ref.BLOCK
    assert layout.refused == [("'flat' (Flatten)", "Flatten has no blocked form")]
    _check_outputs(proto, model, {"x": RNG.standard_normal((1, 3, 21, 18)).astype(np.float32)})


def test_a_bilinear_upsample_stays_blocked():
    """A feature pyramid's linear 2x Resize (a TFLite UpSampling2D, half_pixel) between
    blocked convolutions joins the region: no reorder on either side of it, and the
    quanta session's output equals the graph's (the convolutions within (FG1))."""
    b = Builder()
    y = b.conv("x", 3, 32, (3, 3), "c0", pads=[1, 1, 1, 1])
    y = b.node("Relu", [y], "c0_relu")
    y = b.node(
        "Resize",
        [y, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))],
        "up",
        mode="linear",
        coordinate_transformation_mode="half_pixel",
    )
    y = b.conv(y, 32, 48, (1, 1), "c1")
    proto = b.model({"x": [1, 3, 7, 5]}, [y])
    layout, model, counts = _blocked(proto)
    assert counts["ConvNchwc"] == 2 and counts["ReorderNchw"] == 1 and counts["ReorderNchwc"] == 0, counts
    up = next(n for n in model.graph.nodes if n.op_type == "Resize")
    assert up.inputs[0].shape is not None and len(up.inputs[0].shape) == 5
    assert not [r for r in layout.refused if "Resize" in r[0]], layout.refused
    feeds = {"x": RNG.standard_normal((1, 3, 7, 5)).astype(np.float32)}
    _check_outputs(proto, model, feeds)
    got = quanta.InferenceSession(proto.SerializeToString()).run(None, feeds)[0]
    np.testing.assert_allclose(got, run_ref(proto, feeds)[0], rtol=2e-5, atol=2e-5)


def test_depthwise_and_squeeze_excitation_stay_blocked_with_padded_channels():
    b = Builder()
    y = b.conv("x", 60, 60, (3, 3), "dw", group=60, pads=[1, 1, 1, 1], strides=[2, 1])
    y = b.node("HardSwish", [y], "dw_act")
    s = b.node("GlobalAveragePool", [y], "se_gap")
    s = b.node("Relu", [b.conv(s, 60, 16, (1, 1), "se_reduce")], "se_relu")
    s = b.node("HardSigmoid", [b.conv(s, 16, 60, (1, 1), "se_expand")], "se_gate")
    y = b.node("Mul", [y, s], "se_mul")
    y = b.conv(y, 60, 48, (1, 1), "project")
    proto = b.model({"x": [1, 60, 13, 9]}, [y])
    _, model, counts = _blocked(proto)
    assert counts["ConvNchwc"] == 4 and counts["ReorderNchwc"] == 1 and counts["ReorderNchw"] == 1
    assert counts["GlobalAveragePoolNchwc"] == 1
    dw = next(n for n in model.graph.nodes if n.op_type == "ConvNchwc")
    assert dw.attrs["group"] == 60 and dw.attrs["activation"] == "HardSwish"
    out = model.graph.outputs[0]
    assert out.producer.op_type == "ReorderNchw" and out.producer.attrs["channels"] == 48
    _check_outputs(proto, model, {"x": RNG.standard_normal((1, 60, 13, 9)).astype(np.float32)})


def test_a_region_output_read_twice_and_valid_padding():
    b = Builder()
    y = b.conv("x", 17, 32, (3, 3), "c0", auto_pad="VALID", strides=[2, 2])
    p = b.node("MaxPool", [y], "pool", kernel_shape=[2, 3], pads=[0, 1, 1, 1])
    t = b.node("Transpose", [y], "tr", perm=[0, 2, 3, 1])
    proto = b.model({"x": [1, 17, 11, 14]}, [p, t, y])
    layout, model, counts = _blocked(proto)
    conv = next(n for n in model.graph.nodes if n.op_type == "ConvNchwc")
    assert conv.attrs["pads"] == [0, 0, 0, 0]
    # one ReorderNchw serves the Transpose and the graph output alike
    assert counts["ReorderNchwc"] == 1 and counts["ReorderNchw"] == 2
    assert [r for r in layout.refused if "Transpose" in r[1]]
    _check_outputs(proto, model, {"x": RNG.standard_normal((1, 17, 11, 14)).astype(np.float32)})


def test_residual_adds_become_sum_operands_with_their_clamps():
    """ResNet's bottleneck ends: Add(conv, shortcut) -> Relu, and Add(conv, projection conv)
    -> Clip(0, 6): each Add (and its Relu / Clip) becomes the later Conv's sum operand and
    clamp. An Add whose Conv output is read elsewhere, or after a Conv with an
    activation, stays."""
    b = Builder()
    x = b.node("Relu", [b.conv("x", 3, 32, (3, 3), "stem", pads=[1, 1, 1, 1])], "stem_relu")
    y = b.conv(x, 32, 32, (3, 3), "a", pads=[1, 1, 1, 1])
    y = b.node("Relu", [b.node("Add", [y, x], "res1")], "res1_relu")
    p = b.conv(y, 32, 48, (1, 1), "proj", strides=[2, 2])
    z = b.conv(y, 32, 48, (3, 3), "b", strides=[2, 2], pads=[1, 1, 1, 1])
    lo, hi = b.const("lo", np.array(0, np.float32)), b.const("hi", np.array(6, np.float32))
    z = b.node("Clip", [b.node("Add", [p, z], "res2"), lo, hi], "res2_clip")
    q = b.conv(z, 48, 48, (1, 1), "c")
    tap = b.node("Sigmoid", [q], "tap")  # q read twice: its Add stays
    w = b.node("Add", [q, z], "res3")
    r = b.node("Relu", [b.conv(w, 48, 48, (1, 1), "d")], "d_relu")  # an activation before the Add
    v = b.node("Add", [r, w], "res4")
    proto = b.model({"x": [1, 3, 11, 9]}, [v, tap])
    _, model, counts = _blocked(proto)
    assert counts["Add"] == 2 and counts["Relu"] == 0 and counts["Clip"] == 0, counts
    sums = {n.name: n for n in model.graph.nodes if n.op_type == "ConvNchwc" and n.input(3) is not None}
    assert set(sums) == {"a", "b"}, sorted(sums)
    assert sums["a"].attrs["activation"] == "Relu" and "activation_params" not in sums["a"].attrs
    assert sums["b"].attrs["activation"] == "Clip" and sums["b"].attrs["activation_params"] == [0.0, 6.0]
    assert sums["b"].input(3).producer.name == "proj"  # the later Conv takes the earlier's output
    assert sums["a"].outputs[0].name.startswith("res1_relu")
    feeds = {"x": RNG.standard_normal((1, 3, 11, 9)).astype(np.float32)}
    _check_outputs(proto, model, feeds)
    if blocked_layout_enabled():  # the native kernels with their sum operands, in a session
        import quanta

        sess = quanta.InferenceSession(proto.SerializeToString())
        assert sum("_sum_" in st.kernel.name for st in sess.plan.steps) == 2
        for want, got in zip(run_ref(proto, feeds), sess.run(None, feeds)):
            np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(not blocked_layout_enabled(), reason="the native blocked kernels are not built")
def test_blocked_convolutions_take_direct_calls_with_the_generic_bytes(monkeypatch: pytest.MonkeyPatch):
    """Every blocked step (convolutions: the stem, a depthwise one with a gate, one with a
    sum operand and a clamp; the reorders in and out, MaxPool, GlobalAveragePool) is
    specialized to a direct call, and gives the generic wrappers' bytes."""
    import quanta
    from quanta.passes import pipelines
    from quanta.targets.native import nchwc as native_nchwc

    # a 13 x 10 image: every region is small enough to stay NCHW by default
    monkeypatch.setattr(pipelines, "SMALL_BLOCKED_REGION_MACS", 0)
    b = Builder()
    x = b.conv("x", 3, 32, (3, 3), "stem", pads=[1, 1, 1, 1], strides=[2, 2])
    d = b.node("HardSwish", [b.conv(x, 32, 32, (3, 3), "dw", group=32, pads=[1, 1, 1, 1])], "dw_act")
    y = b.node("Relu", [b.node("Add", [b.conv(d, 32, 32, (1, 1), "pw"), x], "res")], "res_relu")
    y = b.node("MaxPool", [y], "pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    z = b.conv(b.node("Abs", ["x"], "x_abs"), 3, 17, (3, 3), "side", pads=[1, 1, 1, 1], group=1)
    z = b.conv(z, 17, 32, (1, 1), "side2", strides=[4, 4])  # its NCHW input is reordered in
    y = b.node("GlobalAveragePool", [b.node("Add", [y, z], "join")], "gap")
    proto = b.model({"x": [1, 3, 13, 10]}, [y])
    feeds = {"x": RNG.standard_normal((1, 3, 13, 10)).astype(np.float32)}
    sess = quanta.InferenceSession(proto.SerializeToString())
    got = [sess.run(None, feeds)[0] for _ in range(3)]
    from quanta.runtime.profile import Profiler

    sess.executor.profiler = Profiler(sess.plan)  # the instrumented loop calls the guarded form
    got.append(sess.run(None, feeds)[0])
    sess.executor.profiler = None
    (bound,) = sess.executor.bound_runs().values()
    convs = {st.index for st in sess.plan.steps if st.op_type == "ConvNchwc"}
    assert len(convs) == 4  # "side" (17 output channels) stays NCHW
    assert all(getattr(t[1], "direct", None) is not None for t in bound.steps if t[0] in convs)
    blocked_ops = {"ReorderNchwc", "ReorderNchw", "MaxPoolNchwc", "GlobalAveragePoolNchwc"}
    others = {st.index for st in sess.plan.steps if st.op_type in blocked_ops}
    assert {sess.plan.steps[k].op_type for k in others} == blocked_ops
    assert all(getattr(t[1], "direct", None) is not None for t in bound.steps if t[0] in others)
    for fn in ("conv_nchwc", "reorder_nchwc", "reorder_nchw", "max_pool_nchwc", "gap_nchwc"):
        monkeypatch.setattr(native_nchwc, f"_{fn}_specialized", lambda sig, **attrs: None)
    generic = quanta.InferenceSession(proto.SerializeToString())
    want = generic.run(None, feeds)[0]
    (bound,) = generic.executor.bound_runs().values()
    assert not any(getattr(t[1], "direct", None) for t in bound.steps if t[0] in convs | others)
    assert all(g.tobytes() == want.tobytes() for g in got)


def test_a_constant_pad_of_h_and_w_stays_blocked():
    """Pad by constant amounts on H and W with a fill of 0.5 (opset 17: inputs), between
    two blocked convolutions of 17 -> 32 -> 48 channels: one 5-D Pad, no reorder inside."""
    b = Builder()
    y = b.conv("x", 17, 32, (3, 3), "c0", pads=[1, 1, 1, 1])
    y = b.node("Relu", [y], "c0_relu")
    pads = b.const("pads", np.array([0, 0, 2, 1, 0, 0, 0, 3], np.int64))
    y = b.node("Pad", [y, pads, b.const("fill", np.array(0.5, np.float32))], "padded")
    y = b.conv(y, 32, 48, (3, 3), "c1", strides=[2, 1])
    proto = b.model({"x": [1, 17, 9, 11]}, [y])
    layout, model, counts = _blocked(proto)
    assert counts["ConvNchwc"] == 2 and counts["Pad"] == 1, counts
    assert counts["ReorderNchwc"] == 1 and counts["ReorderNchw"] == 1
    pad = model.graph.find_nodes("Pad")[0]
    assert pad.input(1).const.tolist() == [0, 0, 2, 1, 0, 0, 0, 0, 3, 0]
    assert pad.outputs[0].shape == (1, 2, 11, 15, 16)
    assert not [r for r in layout.refused if "Pad" in r[0]]
    _check_outputs(proto, model, {"x": RNG.standard_normal((1, 17, 9, 11)).astype(np.float32)})


@pytest.mark.parametrize(
    ("case", "reason"),
    [
        ("head", "4 output channels: fewer than one block"),
        ("waste", "24 output channels: more than 1/8 of 32 lanes would be padding"),
        ("grouped", "group 2: only group 1 or depthwise"),
        ("div", "Div has no blocked form"),
        ("nchw_operand", "input 1 'den2' is computed NCHW and is not a constant"),
        ("concat", "input 1 of 120 channels: not whole blocks"),
        ("split", "not whole blocks"),
        ("cubic", "Resize mode cubic"),
        ("percol", "does not broadcast per channel"),
        ("pad_channels", "of the batch or channel axis"),
        ("pad_reflect", "Pad mode reflect"),
        ("pad_inf", "Pad value that is not finite"),
    ],
)
def test_refusals_name_the_reason(case: str, reason: str):
    b = Builder()
    y = b.conv("x", 16, 32, (3, 3), "c0", pads=[1, 1, 1, 1])
    if case == "head":
        out = b.conv(y, 32, 4, (1, 1), "head")
    elif case == "waste":
        out = b.conv(y, 32, 24, (3, 3), "c24", pads=[1, 1, 1, 1])
    elif case == "grouped":
        out = b.conv(y, 32, 32, (3, 3), "grouped", group=2, pads=[1, 1, 1, 1])
    elif case == "div":
        out = b.node("Div", [y, b.conv(y, 32, 32, (1, 1), "den")], "ratio")
    elif case == "nchw_operand":
        den = b.node("Abs", ["x"], "den")
        out = b.node(
            "Add",
            [y, b.node("Tile", [den, b.const("reps", np.array([1, 2, 1, 1], np.int64))], "den2")],
            "sum",
        )
    elif case == "concat":
        z = b.conv(y, 32, 120, (1, 1), "c120")
        out = b.node("Concat", [y, z], "cat", axis=1)
    elif case == "split":
        b.nodes.append(
            helper.make_node(
                "Split", [y, b.const("sizes", np.array([8, 24], np.int64))], ["s0", "s1"], axis=1
            )
        )
        out = b.node("Add", ["s0", "s0"], "out")
    elif case == "cubic":
        out = b.node(
            "Resize", [y, "", b.const("scales", np.array([1, 1, 2, 2], np.float32))], "up", mode="cubic"
        )
    elif case.startswith("pad"):
        amounts = [0, 1, 0, 0, 0, 0, 0, 0] if case == "pad_channels" else [0, 0, 1, 1, 0, 0, 1, 1]
        fill = -np.inf if case == "pad_inf" else 0.0
        out = b.node(
            "Pad",
            [y, b.const("pads", np.array(amounts, np.int64)), b.const("fill", np.array(fill, np.float32))],
            "padded",
            mode="reflect" if case == "pad_reflect" else "constant",
        )
    else:
        out = b.node(
            "Mul", [y, b.const("cols", RNG.standard_normal((2, 1, 1, 1, 1)).astype(np.float32))], "m"
        )
    outputs = [out, "s1"] if case == "split" else [out]
    proto = b.model({"x": [1, 16, 5, 7]}, outputs)
    layout, model, _ = _blocked(proto)
    assert any(reason in why for _, why in layout.refused), layout.refused
    _check_outputs(proto, model, {"x": RNG.standard_normal((1, 16, 5, 7)).astype(np.float32)})


@pytest.mark.parametrize("env", [None, "0", "1"])
def test_the_layout_is_on_unless_switched_off(monkeypatch: pytest.MonkeyPatch, env: str | None):
    """Where the native kernels exist the layout is on unless QUANTA_NCHWC=0 (A/B
    measurements, a user who wants the NCHW GEMM). A pass built without ``enabled``
    leaves the graph as it is."""
    if env is None:
        monkeypatch.delenv("QUANTA_NCHWC", raising=False)
    else:
        monkeypatch.setenv("QUANTA_NCHWC", env)
    from quanta.kernels import _native

    assert blocked_layout_enabled() == (env != "0" and hasattr(_native, "conv_nchwc_f32"))
    b = Builder()
    y = b.conv("x", 16, 32, (3, 3), "c0", pads=[1, 1, 1, 1])
    model = load(b.model({"x": [1, 16, 5, 7]}, [y]))
    result = BlockedFloatLayout()(model.graph)
    assert not result.modified and [n.op_type for n in model.graph.nodes] == ["Conv"]


@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_same_padding_becomes_explicit_pads(mode: str):
    """A TF export's "same" windows run blocked: at stride 1 the pads follow from the
    kernel alone (the input's H and W symbolic here), at stride 2 from the static input
    size; the odd pad goes to the end (UPPER) or the start (LOWER)."""
    b = Builder()
    y = b.conv("x", 17, 32, (1, 3), "c0", auto_pad=mode)
    y = b.node("LeakyRelu", [y], "c0_act", alpha=0.2)
    y = b.conv(y, 32, 48, (4, 1), "c1", auto_pad=mode, dilations=[2, 1])
    y = b.node("MaxPool", [y], "pool", kernel_shape=[1, 2], strides=[1, 1], auto_pad=mode)
    proto = b.model({"x": [1, 17, "h", "w"]}, [y])
    _, model, counts = _blocked(proto)
    assert counts["ConvNchwc"] == 2 and counts["MaxPoolNchwc"] == 1 and counts["Conv"] == 0, counts
    pads = {n.name: n.attrs["pads"] for n in model.graph.nodes if "pads" in n.attrs}
    assert pads["c0"] == [0, 1, 0, 1]  # (1 - 1) and (3 - 1) split evenly
    # (4 - 1) * 2 = 6 rows split evenly; a 1 x 2 pool pads one column at the odd end
    assert pads["c1"] == [3, 0, 3, 0]
    assert pads["pool"] == ([0, 0, 0, 1] if mode == "SAME_UPPER" else [0, 1, 0, 0])
    assert all("auto_pad" not in n.attrs for n in model.graph.nodes if n.domain == "quanta")
    _check_outputs(proto, model, {"x": RNG.standard_normal((1, 17, 7, 13)).astype(np.float32)})

    b = Builder()
    y = b.conv("x", 17, 32, (3, 3), "c0", auto_pad=mode, strides=[2, 2])
    proto = b.model({"x": [1, 17, 11, 14]}, [y])
    _, model, counts = _blocked(proto)
    assert counts["ConvNchwc"] == 1, counts
    conv = next(n for n in model.graph.nodes if n.op_type == "ConvNchwc")
    # H 11 -> 6 rows needs 2 pad rows, W 14 -> 7 columns needs 1: the odd one at the end
    # (UPPER) or the start (LOWER)
    assert conv.attrs["pads"] == ([1, 0, 1, 1] if mode == "SAME_UPPER" else [1, 1, 1, 0])
    _check_outputs(proto, model, {"x": RNG.standard_normal((1, 17, 11, 14)).astype(np.float32)})


def test_same_padding_at_a_stride_over_an_unknown_size_stays_nchw():
    b = Builder()
    y = b.conv("x", 17, 32, (3, 3), "c0", auto_pad="SAME_UPPER", strides=[2, 2])
    layout, _, counts = _blocked(b.model({"x": [1, 17, "h", "w"]}, [y]))
    assert counts["Conv"] == 1, counts
    assert (
        "'c0' (Conv)",
        "auto_pad SAME_UPPER at a stride over an input size the graph does not fix",
    ) in layout.refused


def test_twins_reorder_exactly_and_pad_lanes_are_zero():
    x = RNG.standard_normal((2, 17, 3, 5)).astype(np.float32)
    x5 = ref.to_nchwc(x)
    assert x5.shape == (2, 2, 3, 5, 16)
    assert not x5[:, 1, ..., 1:].any()
    np.testing.assert_array_equal(ref.from_nchwc(x5, 17), x)
    with pytest.raises(Exception, match="does not fit"):
        ref.from_nchwc(x5, 40)


@pytest.mark.skipif(not blocked_layout_enabled(), reason="the native blocked kernels are not built")
@pytest.mark.parametrize("mode", ["SAME_UPPER", "SAME_LOWER"])
def test_same_padding_runs_blocked_natively_as_onnxruntime_runs_it(mode: str):
    """The session's plan keeps the SAME windows blocked (a 7-channel stem at stride 2
    over 17 x 23, a 1 x 3 convolution, a 2 x 2 pool at stride 2) and computes what ONNX
    Runtime computes within the convolutions' summation order."""
    ort = pytest.importorskip("onnxruntime")
    import quanta

    b = Builder()
    y = b.conv("x", 7, 32, (3, 3), "c1", auto_pad=mode, strides=[2, 2])
    y = b.conv(y, 32, 48, (1, 3), "c2", auto_pad=mode)
    y = b.node("MaxPool", [y], "pool", kernel_shape=[2, 2], strides=[2, 2], auto_pad=mode)
    proto = b.model({"x": [1, 7, 17, 23]}, [y])
    x = RNG.standard_normal((1, 7, 17, 23)).astype(np.float32)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    sess = quanta.InferenceSession(proto.SerializeToString())
    got = sess.run(None, {"x": x})[0]
    assert [s.op_type for s in sess.plan.steps] == ["ConvNchwc", "ConvNchwc", "MaxPoolNchwc", "ReorderNchw"]
    assert got.shape == want.shape == (1, 48, 5, 6)
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


@pytest.mark.skipif(not blocked_layout_enabled(), reason="the native blocked kernels are not built")
@pytest.mark.parametrize("opset", [17, 20])
def test_a_written_out_gelu_between_convolutions_fuses_and_stays_blocked(opset: int):
    """A float model's erf GELU (Div, Erf, Add, Mul, Mul: a PyTorch export's nn.GELU) after
    a convolution becomes one Gelu (com.microsoft below opset 20, ai.onnx from 20) inside
    the blocked region: no reorder between the two convolutions; native, the reference
    target and ONNX Runtime agree within the float GEMM family's bound (eq. (FG1): the
    convolutions' summation order is not pinned)."""
    ort = pytest.importorskip("onnxruntime")
    import quanta

    b = Builder()
    y = b.conv("x", 7, 32, (3, 3), "c1", pads=[1, 1, 1, 1])
    d = b.node("Div", [y, b.const("sqrt2", np.array(np.sqrt(2.0), np.float32))], "gelu_div")
    e = b.node("Erf", [d], "gelu_erf")
    a = b.node("Add", [e, b.const("one", np.array(1.0, np.float32))], "gelu_add")
    m = b.node("Mul", [y, a], "gelu_mul")
    g = b.node("Mul", [m, b.const("half", np.array(0.5, np.float32))], "gelu")
    y = b.conv(g, 32, 48, (3, 1), "c2", pads=[1, 0, 1, 0])
    proto = b.model({"x": [1, 7, 13, 11]}, [y])
    proto.opset_import[0].version = opset
    x = RNG.standard_normal((1, 7, 13, 11)).astype(np.float32)
    sess = quanta.InferenceSession(proto.SerializeToString())
    assert [s.op_type for s in sess.plan.steps] == ["ConvNchwc", "Gelu", "ConvNchwc", "ReorderNchw"]
    got = sess.run(None, {"x": x})[0]
    golden = quanta.InferenceSession(proto.SerializeToString(), backend="reference").run(None, {"x": x})[0]
    np.testing.assert_allclose(got, golden, rtol=2e-5, atol=2e-5)
    want = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x}
    )[0]
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-5)


def test_regions_below_min_region_macs_stay_nchw_and_larger_ones_are_blocked():
    """GTCRN's decoder block on a 3 x 33 plane (a 1x1 and a depthwise 3x3: ~43 k
    multiply-adds) stays NCHW under min_region_macs; a separate region of the same
    graph above it is blocked. The refusal names the reason; the graph computes the same."""
    b = Builder()
    y = b.conv("x", 24, 16, (1, 1), "pw1")
    y = b.node("PRelu", [y, b.const("slope", np.array([[[0.25]]], np.float32))], "act")
    y = b.conv(y, 16, 16, (3, 3), "dw", group=16, pads=[0, 1, 0, 1], dilations=[1, 1])
    small = b.conv(y, 16, 17, (1, 1), "pw2")
    big = b.conv("z", 32, 32, (3, 3), "big", pads=[1, 1, 1, 1])  # 32·32·9·17·19 ≈ 3.0 M
    proto = b.model({"x": [1, 24, 3, 33], "z": [1, 32, 17, 19]}, [small, big])
    model = load(proto)
    macs = 16 * 24 * 99 + 16 * 9 * 33  # pw2's 17 channels keep it out of any region
    layout = BlockedFloatLayout(enabled=True, min_region_macs=macs + 1)
    run_passes(model, [layout])
    counts = collections.Counter(n.op_type for n in model.graph.nodes)
    assert counts["ConvNchwc"] == 1 and counts["Conv"] == 3, counts
    reasons = {label: r for label, r in layout.refused}
    assert "multiply-adds" in reasons["'pw1' (Conv)"] and "multiply-adds" in reasons["'dw' (Conv)"]
    feeds = {
        "x": RNG.standard_normal((1, 24, 3, 33)).astype(np.float32),
        "z": RNG.standard_normal((1, 32, 17, 19)).astype(np.float32),
    }
    _check_outputs(proto, model, feeds)
    at_bound = load(proto)
    run_passes(at_bound, [BlockedFloatLayout(enabled=True, min_region_macs=macs)])
    assert collections.Counter(n.op_type for n in at_bound.graph.nodes)["ConvNchwc"] == 3
