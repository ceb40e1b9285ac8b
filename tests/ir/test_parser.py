"""The printer's text reads back into the same graph (quanta.ir.parser): the test
models, a quantized model with per-channel and calibrated types, names with ':' and '/',
omitted optional inputs; errors name the line."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import quanta
from quanta.ir.graph import Model
from quanta.ir.onnx_io import from_proto, to_proto
from quanta.ir.parser import IRParseError, parse_graph, parse_type
from quanta.ir.printer import format_graph
from quanta.ir.types import CalibratedType, FloatType, TensorType
from tests.ir import models
from tests.passes.helpers import run_ref_ir


def consts_of(graph) -> dict[str, np.ndarray]:
    return {name: v.const for name, v in graph.initializers.items()}


@pytest.mark.parametrize(
    "build",
    [models.float_cnn, models.qdq_conv, models.qoperator, models.encoder_block, models.concat_branches],
)
def test_printed_models_read_back_to_the_same_text_and_outputs(build):
    model = from_proto(build(), "test")
    text = format_graph(model.graph)
    back = parse_graph(text, consts_of(model.graph))
    assert format_graph(back) == text
    model.graph = back
    onnx.checker.check_model(to_proto(model))


def test_a_parsed_graph_runs_like_the_original():
    model = from_proto(models.float_cnn(), "test")
    parsed = parse_graph(format_graph(model.graph), consts_of(model.graph))
    x = np.random.default_rng(3).standard_normal((2, 3, 8, 6)).astype(np.float32)
    want = run_ref_ir(model, {"x": x})
    got = run_ref_ir(Model(parsed, dict(model.opset_imports)), {"x": x})
    assert all(np.array_equal(a, b) for a, b in zip(want, got, strict=True))


def test_a_quantized_model_with_per_channel_types_reads_back(tmp_path):
    src, out = tmp_path / "m.onnx", tmp_path / "m.q.onnx"
    onnx.save(models.float_cnn(), src)
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal((1, 3, 8, 6)).astype(np.float32)} for _ in range(4)]
    quanta.quantize_static(str(src), str(out), feeds, verbose=False)
    graph = from_proto(onnx.load(out), "q").graph
    text = format_graph(graph)
    assert "Q(" in text
    assert format_graph(parse_graph(text, consts_of(graph))) == text


def test_text_written_by_hand():
    text = """
    # a pass test's input, written as text
    graph g(%in/0: tensor<Nx4, f32>, %onnx::b: tensor<4, f32>) {
      %w = const tensor<4x3, f32> = [[1, 2, 3], [4, 5, 6], [7, 8, 9], [1, 0, -1]]
      %a:0: tensor<Nx4, f32> = Add(%in/0, %onnx::b)  # add/1
      %m = MatMul(%a:0, %w)
      %c = Clip(%m, _, _)
      return %c
    }
    """
    g = parse_graph(text)
    assert [n.op_type for n in g.nodes] == ["Add", "MatMul", "Clip"]
    assert g.nodes[0].name == "add/1" and g.nodes[2].inputs[1:] == [None, None]
    assert g.initializers["w"].const.dtype == np.float32 and g.initializers["w"].const.shape == (4, 3)
    x, b = np.ones((2, 4), np.float32), np.arange(4, dtype=np.float32)
    (y,) = run_ref_ir(Model(g, {"": 17}), {"in/0": x, "onnx::b": b})
    assert np.array_equal(y, (x + b) @ g.initializers["w"].const)


def test_types_read_back():
    cal = TensorType(CalibratedType(FloatType("f32"), -1.5, 2.25), ("N", 7))
    assert parse_type(str(cal)) == cal
    assert parse_type("tensor<?, f32>").shape is None
    assert parse_type("tensor<f32>").shape == ()
    assert parse_type("tensor<Nx?x3, i8>").shape == ("N", None, 3)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "empty text"),
        (
            "graph g(%x: tensor<3, f32>) {\n  %y = Relu(%z)\n  return %y\n}",
            "line 2: '%z' is used before it is defined",
        ),
        ("graph g(%x: tensor<3, f32>) {\n  %w = const tensor<40, f32>\n}", "give them as consts['w']"),
        ("graph g(%x: tensor<3, f32>) {\n  %x = Relu(%x)\n}", "'%x' is defined twice"),
        ("graph g(%x: tensor<3, f32>) {\n  %y = Relu(%x)", "not closed"),
        ("graph g(%x: tensor<3, f32>) {\n  Relu(%x)\n}", "line 2: expected 'return ...'"),
        ("graph g(%x: tensor<3, q9>) {\n}", "line 1: cannot parse element type 'q9'"),
    ],
)
def test_errors_name_the_line(text, says):
    with pytest.raises(IRParseError, match=None) as err:
        parse_graph(text)
    assert says in str(err.value)
