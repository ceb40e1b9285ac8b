"""The integer MAC share quantize_static reports, counts recurrent ops and files that are
already integer, and enforces with ``min_integer_share``."""

from __future__ import annotations

import itertools

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import quanta
from quanta.ir.onnx_io import load
from quanta.quantize.static import IntegerShareError
from quanta.runtime.coverage import lowered_coverage


def lstm_model(seq: int | str = 5, batch: int = 3, inp: int = 7, hidden: int = 17) -> onnx.ModelProto:
    rng = np.random.default_rng(3)
    w = numpy_helper.from_array(rng.normal(0, 0.3, (2, 4 * hidden, inp)).astype(np.float32), "W")
    r = numpy_helper.from_array(rng.normal(0, 0.3, (2, 4 * hidden, hidden)).astype(np.float32), "R")
    node = helper.make_node("LSTM", ["x", "W", "R"], ["y"], hidden_size=hidden, direction="bidirectional")
    g = helper.make_graph(
        [node],
        "lstm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, batch, inp])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w, r],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_lstm_macs_are_every_step_of_both_directions():
    report = lowered_coverage(load(lstm_model()))
    (node,) = report.nodes
    assert node.macs == 5 * 3 * (2 * 68 * 7 + 2 * 68 * 17)
    assert node.integer_op is None and report.integer_share == 0.0
    assert "write it as DynamicQuantizeLSTM unless the recipe says recurrent: float" in report.format_share()


def test_observed_shapes_stand_in_for_a_symbolic_sequence():
    model = load(lstm_model(seq="T"))
    blind = lowered_coverage(model)
    assert blind.nodes[0].macs == 1 * 3 * (2 * 68 * 7 + 2 * 68 * 17)
    # the summary says the count took the symbolic sequence as 1 (quantize_dynamic has no
    # data to size it with)
    assert blind.nodes[0].symbolic
    assert "1 compute node(s) have symbolic or unknown dimensions, counted as 1" in blind.format_share()
    seen = lowered_coverage(model, {"x": (41, 3, 7)})
    assert seen.nodes[0].macs == 41 * 3 * (2 * 68 * 7 + 2 * 68 * 17)
    assert not seen.nodes[0].symbolic and "symbolic" not in seen.format_share()


def test_a_matmul_of_unknown_shapes_is_not_counted_as_a_share_of_nothing():
    """quantize_dynamic on a file whose MatMul input and output have no shape (after an
    operator shape inference does not know): no MACs can be counted, and the summary
    says so instead of "100.0 % of 0"; the observed output shape and the weight's K
    count them."""
    w = numpy_helper.from_array(np.ones((7, 17), np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [w],
    )
    model = load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    blind = lowered_coverage(model)
    assert blind.total_macs == 0
    assert blind.format_share().startswith("integer MACs: not counted, the file gives no shapes for its 1")
    seen = lowered_coverage(model, {"y": (5, 3, 17)})
    assert seen.total_macs == 5 * 3 * 17 * 7 and not seen.nodes[0].symbolic


def einsum_model(equation: str, shape_a, shape_b) -> onnx.ModelProto:
    node = helper.make_node("Einsum", ["a", "b"], ["y"], name="einsum", equation=equation)
    g = helper.make_graph(
        [node],
        "einsum",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, shape_a),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, shape_b),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize(
    ("equation", "shape_a", "shape_b", "expected"),
    [
        # DeepFilterNet's grouped linear layer: b·t·g·i·h terms
        ("btgi,gih->btgh", [2, 29, 3, 17], [3, 17, 7], 2 * 29 * 3 * 17 * 7),
        ("bhqd,bhkd->bhqk", [1, 3, 5, 7], [1, 3, 17, 7], 3 * 5 * 7 * 17),  # attention scores
        ("i,i->", [259], [259], 259),  # a dot product
        ("bij,bjk", [1, 3, 7], [5, 7, 17], 5 * 3 * 7 * 17),  # a broadcast batch of 1
    ],
)
def test_einsum_macs_are_one_per_term_and_count_as_float(equation, shape_a, shape_b, expected):
    """An Einsum is compute: its multiply-accumulates (one per combination of its labels)
    count, as float, where they were not counted at all and the share overstated."""
    report = lowered_coverage(load(einsum_model(equation, shape_a, shape_b)))
    (node,) = report.nodes
    assert node.op == "Einsum" and node.macs == expected
    assert node.integer_op is None and report.integer_share == 0.0


def test_einsum_macs_take_observed_shapes_for_symbolic_ones():
    model = load(einsum_model("btgi,gih->btgh", [1, "T", 3, 17], [3, 17, 7]))
    blind = lowered_coverage(model)
    assert blind.nodes[0].macs == 3 * 17 * 7 and blind.nodes[0].symbolic
    seen = lowered_coverage(model, {"a": (1, 41, 3, 17)})
    assert seen.nodes[0].macs == 41 * 3 * 17 * 7 and not seen.nodes[0].symbolic


def conv_chain(channels=(3, 7, 17, 5)) -> onnx.ModelProto:
    rng = np.random.default_rng(5)
    nodes, inits, x = [], [], "x"
    for i, (cin, cout) in enumerate(itertools.pairwise(channels)):
        inits.append(
            numpy_helper.from_array(rng.normal(0, 0.4, (cout, cin, 3, 3)).astype(np.float32), f"w{i}")
        )
        inits.append(numpy_helper.from_array(rng.normal(0, 0.1, cout).astype(np.float32), f"b{i}"))
        nodes.append(
            helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [f"c{i}"], name=f"conv{i}", pads=[1] * 4)
        )
        nodes.append(helper.make_node("Relu", [f"c{i}"], [f"r{i}"], name=f"relu{i}"))
        x = f"r{i}"
    # a pooled head: the last convolution's output is no graph output
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pooled"], name="pool"))
    g = helper.make_graph(
        nodes,
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, channels[0], 11, 13])],
        [helper.make_tensor_value_info("pooled", TensorProto.FLOAT, [1, channels[-1], 1, 1])],
        inits,
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def feeds(n=4):
    rng = np.random.default_rng(9)
    return [{"x": rng.normal(0.2, 1.0, (1, 3, 11, 13)).astype(np.float32)} for _ in range(n)]


def test_summary_reports_the_share_and_the_largest_float_nodes(tmp_path):
    macs = [11 * 13 * 7 * 27, 11 * 13 * 17 * 63, 11 * 13 * 5 * 153]  # out pixels·Cout · Cin·3·3
    s = quanta.quantize_static(conv_chain(), tmp_path / "q.onnx", feeds(), exclude=["conv0"], verbose=False)
    assert s.coverage is not None and s.coverage.total_macs == sum(macs) == 289_575
    # conv2 feeds a float head (its pool stays float: "quantize only what pays"), so it
    # runs as ConvInteger with a float output (LowerConvFloatOutput)
    assert s.integer_share == pytest.approx((macs[1] + macs[2]) / sum(macs))
    assert [(c.name, c.macs) for c in s.coverage.largest_float()] == [("conv0", macs[0])]
    text = s.format()
    assert "integer MACs: 90.7 % of 289,575 (262,548 in integer)" in text
    assert "conv0 (Conv, 27,027 MACs, 9.3 %): its output is not quantized" in text
    d = s.to_dict()
    assert d["integer_share"] == s.integer_share and d["largest_float"][0][:3] == ["conv0", "Conv", macs[0]]


def test_min_integer_share_fails_and_writes_nothing(tmp_path):
    out = tmp_path / "q.onnx"
    with pytest.raises(
        IntegerShareError, match=r"not written: 90\.7 % .* below min_integer_share 95\.0 %"
    ) as e:
        quanta.quantize_static(
            conv_chain(), out, feeds(), exclude=["conv0"], min_integer_share=0.95, verbose=False
        )
    assert "conv0 (Conv, 27,027 MACs, 9.3 %)" in str(e.value)
    assert not out.exists()
    s = quanta.quantize_static(
        conv_chain(), out, feeds(), exclude=["conv0"], min_integer_share=0.9, verbose=False
    )
    assert s.integer_share == pytest.approx(262_548 / 289_575) and out.exists()


def test_min_integer_share_outside_zero_one_is_a_recipe_error(tmp_path):
    with pytest.raises(ValueError, match=r"min_integer_share: expected a share in \[0, 1\], got 99"):
        quanta.quantize_static(
            conv_chain(), tmp_path / "q.onnx", feeds(), min_integer_share=99, verbose=False
        )


def test_a_qoperator_file_counts_as_integer(tmp_path):
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    src = tmp_path / "f.onnx"
    onnx.save(conv_chain(), src)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(feeds())

        def get_next(self):
            return next(self.it, None)

    dst = tmp_path / "qop.onnx"
    quantize_static(str(src), str(dst), Reader(), quant_format=QuantFormat.QOperator)
    report = lowered_coverage(load(dst))
    assert {n.op for n in report.nodes} == {"QLinearConv", "QLinearGlobalAveragePool"}
    assert report.integer_share == 1.0 and report.total_macs == 289_575


def test_unnamed_nodes_are_paired_with_what_they_became(tmp_path):
    proto = conv_chain()
    for n in proto.graph.node:
        n.name = ""
    s = quanta.quantize_static(proto, tmp_path / "q.onnx", feeds(), verbose=False)
    assert s.integer_share == 1.0 and s.coverage.total_macs == 289_575
    names = [c.name for c in s.coverage.nodes if c.op == "Conv"]
    assert len(set(names)) == 3 and all(n.startswith("Conv_") for n in names)
