"""compare_tensors: per-tensor local and accumulated SQNR of a QDQ file against FP32."""

from __future__ import annotations

import numpy as np
import onnx

import quanta
from quanta.debug.tensors import compare_tensors, format_tensors
from tests.quantize.test_weighted_ranges import feeds, wide_channel_then_depthwise


def test_rows_follow_the_graph_and_a_fixed_range_shows_as_clipping(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(), src)
    out = tmp_path / "q.onnx"
    # y's range is cut to [0, 1]: most of it clips (local SQNR poor, clipped share high)
    quanta.quantize_static(
        src, out, feeds(4, 1), method="minmax", overrides={"y": {"range": [0.0, 1.0]}}, verbose=False
    )
    rows = compare_tensors(src, out, feeds(2, 5))
    assert [r.name for r in rows] == ["x", "y"]
    x, y = rows
    assert x.local_db > 35.0 and x.total_db == x.local_db  # the graph input: nothing upstream
    assert x.clipped < 0.05
    assert y.clipped > 0.3 and y.local_db < 10.0
    assert y.scale == float(np.float32(1.0 / 255)) and y.zero_point == 0
    assert y.total_db is not None and y.total_db <= y.local_db + 1.0
    text = format_tensors(rows)
    assert text.splitlines()[0].startswith("tensor") and "y " in text


def test_a_tensor_the_float_model_does_not_have_has_no_total(tmp_path):
    src = tmp_path / "m.onnx"
    onnx.save(wide_channel_then_depthwise(), src)
    out = tmp_path / "q.onnx"
    quanta.quantize_static(src, out, feeds(4, 1), verbose=False)
    other = wide_channel_then_depthwise()
    for n in other.graph.node:  # rename y in the float model
        n.output[:] = ["y2" if o == "y" else o for o in n.output]
        n.input[:] = ["y2" if i == "y" else i for i in n.input]
    rows = {r.name: r for r in compare_tensors(other, out, feeds(1, 5))}
    assert rows["y"].total_db is None and rows["x"].total_db is not None
