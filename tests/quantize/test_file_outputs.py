"""quanta.quantize.file_outputs: a file run once per quantize_static call and feeds."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from quanta.quantize import accuracy, file_outputs
from quanta.quantize.file_outputs import remembering_outputs, run_file


def _model(bias: float) -> onnx.ModelProto:
    b = numpy_helper.from_array(np.full((3,), bias, np.float32), "b")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "b"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
        [b],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _counting(monkeypatch) -> list[str]:
    calls: list[str] = []
    real = accuracy._HOOKS["outputs"]

    def outputs(path, feeds, engine=None):
        calls.append(str(path))
        return real(path, feeds, engine=engine)

    monkeypatch.setitem(accuracy._HOOKS, "outputs", outputs)
    return calls


def test_the_same_bytes_and_feeds_run_once_inside_a_call(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    a, b, c = tmp_path / "a.onnx", tmp_path / "b.onnx", tmp_path / "c.onnx"
    onnx.save(_model(1.0), a)
    onnx.save(_model(1.0), b)  # the same bytes under another name
    onnx.save(_model(2.0), c)
    feeds = [{"x": np.arange(3, dtype=np.float32)}, {"x": np.ones(3, np.float32)}]
    same = [{"x": f["x"].copy()} for f in feeds]
    other = [{"x": np.zeros(3, np.float32)}, {"x": np.ones(3, np.float32)}]

    @remembering_outputs
    def measure():
        return run_file(a, feeds), run_file(b, same), run_file(c, feeds), run_file(a, other)

    ra, rb, rc, ro = measure()
    assert len(calls) == 3  # b is a's bytes on a's feeds' contents
    np.testing.assert_array_equal(ra[0][0], np.arange(3) + 1.0)
    assert [o[0].tolist() for o in ra] == [o[0].tolist() for o in rb]
    np.testing.assert_array_equal(rc[1][0], np.full(3, 3.0))
    np.testing.assert_array_equal(ro[0][0], np.ones(3))
    measure()  # a new outermost call: nothing remembered from the last one
    assert len(calls) == 6
    run_file(a, feeds)  # outside any call: always runs
    run_file(a, feeds)
    assert len(calls) == 8


def test_a_file_with_external_data_runs_every_time(tmp_path, monkeypatch):
    calls = _counting(monkeypatch)
    m = _model(1.0)
    path = tmp_path / "ext.onnx"
    onnx.save(
        m,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location="ext.data",
        size_threshold=0,
    )
    feeds = [{"x": np.arange(3, dtype=np.float32)}] * 2

    @remembering_outputs
    def measure():
        return run_file(path, feeds), run_file(path, feeds)

    first, second = measure()
    assert len(calls) == 2
    assert first[0][0].tolist() == second[0][0].tolist() == [1.0, 2.0, 3.0]


def test_the_memory_is_bounded(monkeypatch):
    monkeypatch.setattr(file_outputs, "MAX_BYTES", 100)
    memo = file_outputs._Memo()
    memo.add(("a", "f"), [[np.zeros(10, np.float32)]])  # 40 bytes
    memo.add(("b", "f"), [[np.zeros(10, np.float32)]])
    memo.add(("c", "f"), [[np.zeros(10, np.float32)]])  # the oldest goes
    assert list(memo.entries) == [("b", "f"), ("c", "f")]
    memo.add(("d", "f"), [[np.zeros(100, np.float32)]])  # larger than the bound: not kept
    assert ("d", "f") not in memo.entries
