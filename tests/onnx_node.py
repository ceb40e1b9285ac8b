"""ONNX backend node test cases, collected from the installed ``onnx`` package.

``onnx.backend.test.case.node.collect_testcases`` builds each case in memory (model +
input/output data sets), so nothing has to be generated on disk. ``run_case`` executes
a case through quanta and compares with the expected outputs:

- integer (and bool) outputs must be exact;
- float outputs use the tolerance the case itself declares (``case.rtol``/``case.atol``,
  the ONNX backend-test defaults 1e-3 / 1e-7 unless a case widens them).
"""

from __future__ import annotations

import functools
import warnings

import numpy as np

__all__ = ["cases_for", "run_case"]


@functools.cache
def _all_cases() -> tuple:
    from onnx.backend.test.case import node

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return tuple(node.collect_testcases())


def cases_for(op_types: set[str] | frozenset[str], *, name_filter=None) -> list:
    """Node test cases whose graph uses only ops from ``op_types`` (expanded function
    bodies included when all their ops are listed)."""
    out = []
    for case in _all_cases():
        ops = {n.op_type for n in case.model.graph.node}
        if ops and ops <= set(op_types) and (name_filter is None or name_filter(case.name)):
            out.append(case)
    return out


def _array(value):
    """Node-test data stores float8/int4/bfloat16 values as TensorProto: convert."""
    from onnx import TensorProto, numpy_helper

    return numpy_helper.to_array(value) if isinstance(value, TensorProto) else value


def _run(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    import quanta

    sess = quanta.InferenceSession(model.SerializeToString(), backend="reference")
    return sess.run(None, feeds)


def run_case(case) -> None:
    """Run every data set of ``case`` and assert outputs match (exact for integers)."""
    model = case.model
    input_names = [
        i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}
    ]
    for inputs, expected in case.data_sets:
        feeds = {name: _array(x) for name, x in zip(input_names, inputs)}
        got = _run(model, feeds)
        assert len(got) == len(expected), f"{case.name}: {len(got)} outputs, expected {len(expected)}"
        for k, (g, e) in enumerate(zip(got, expected)):
            if isinstance(e, list):  # a sequence: its tensors may differ in shape
                # (a sequence fed in as equal-shape tensors may come back stacked)
                assert len(g) == len(e), f"{case.name} output {k}: {len(g)} tensors, expected {len(e)}"
                for gi, ei in zip(g, e):
                    np.testing.assert_allclose(gi, ei, rtol=case.rtol, atol=case.atol, err_msg=case.name)
                continue
            e = np.asarray(_array(e))
            g = np.asarray(g)
            assert g.shape == e.shape, f"{case.name} output {k}: shape {g.shape}, expected {e.shape}"
            assert g.dtype == e.dtype, f"{case.name} output {k}: dtype {g.dtype}, expected {e.dtype}"
            if e.dtype.itemsize == 1 and e.dtype.kind == "V":
                # ml_dtypes 1-byte floats/ints: compare the bits (NaN == NaN bitwise)
                np.testing.assert_array_equal(
                    g.view(np.uint8), e.view(np.uint8), err_msg=f"{case.name} output {k}"
                )
            elif e.dtype.kind in "OU":  # strings
                assert g.tolist() == e.tolist(), f"{case.name} output {k}: {g.tolist()} != {e.tolist()}"
            elif e.dtype.kind in "iub":
                np.testing.assert_array_equal(g, e, err_msg=f"{case.name} output {k}")
            elif e.dtype.kind in "fc":
                np.testing.assert_allclose(
                    g, e, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} output {k}"
                )
            else:  # ml_dtypes (float8, int4, bfloat16) and others: compare as float32 bitwise
                np.testing.assert_array_equal(
                    g.astype(np.float32), e.astype(np.float32), err_msg=f"{case.name} output {k}"
                )
