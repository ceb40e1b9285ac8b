"""ONNX backend node tests for every quantization op, on the reference kernels.

Integer outputs must match exactly (tests/onnx_node.py); float outputs use the case's own
tolerance. Each case runs twice: through ``quanta.InferenceSession(backend="reference")``
when the session exists, and directly through the registered op (``registry.get_op``),
which pins the kernel itself independently of the interpreter.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from onnx import helper, numpy_helper

from quanta.kernels.reference import registry
from tests.onnx_node import cases_for, run_case

QUANT_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "QLinearMatMul",
        "QLinearConv",
        "MatMulInteger",
        "ConvInteger",
    }
)
CASES = cases_for(QUANT_OPS)


def _as_array(v) -> np.ndarray:
    if hasattr(v, "SerializeToString"):  # TensorProto (float8, int4 ... data sets)
        return numpy_helper.to_array(v)
    return np.asarray(v)


def _attr_value(a):
    v = helper.get_attribute_value(a)
    if isinstance(v, bytes):
        return v.decode()
    if hasattr(v, "SerializeToString"):
        return numpy_helper.to_array(v)
    if isinstance(v, list) and v and isinstance(v[0], bytes):
        return [s.decode() for s in v]
    return v


def _run_direct(case) -> None:
    model = case.model
    (node,) = model.graph.node
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    op = registry.get_op(node.op_type, node.domain)
    assert op is not None, f"no reference op for {node.op_type}"
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    input_names = [i.name for i in model.graph.input if i.name not in inits]
    attrs = {a.name: _attr_value(a) for a in node.attribute}
    for inputs, expected in case.data_sets:
        values = dict(inits)
        values.update({n: _as_array(v) for n, v in zip(input_names, inputs)})
        args = [values[n] if n else None for n in node.input]
        ctx = registry.OpContext(opset=opset, n_outputs=len(node.output), op_type=node.op_type)
        got = op(ctx, *args, **attrs)
        got = got if isinstance(got, tuple) else (got,)
        assert len(got) == len(expected)
        for k, (g, e) in enumerate(zip(got, expected)):
            e = _as_array(e)
            assert g.shape == e.shape, f"{case.name} output {k}: shape {g.shape}, expected {e.shape}"
            assert g.dtype == e.dtype, f"{case.name} output {k}: dtype {g.dtype}, expected {e.dtype}"
            if e.dtype.kind in "iub" or e.dtype.kind == "V":
                # Exact: integer outputs, and float8/int4 storage compared bit for bit.
                np.testing.assert_array_equal(
                    g.view(np.uint8) if e.dtype.kind == "V" else g,
                    e.view(np.uint8) if e.dtype.kind == "V" else e,
                    err_msg=f"{case.name} output {k}",
                )
            else:
                np.testing.assert_allclose(
                    g, e, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name} output {k}"
                )


def test_node_cases_cover_every_quantization_op():
    """Missing-coverage signature: an op silently dropped from the node-test list."""
    covered = {n.op_type for c in CASES for n in c.model.graph.node}
    assert covered == QUANT_OPS


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_node_quant_direct(case):
    _run_direct(case)


def _has_session() -> bool:
    try:
        import quanta
    except ImportError:
        return False
    return hasattr(quanta, "InferenceSession")


def _with_arrays(case):
    """The case with TensorProto data (float8, int4, int2 ... data sets) as numpy arrays."""
    data = [([_as_array(v) for v in ins], [_as_array(v) for v in outs]) for ins, outs in case.data_sets]
    return dataclasses.replace(case, data_sets=data)


@pytest.mark.skipif(not _has_session(), reason="quanta.InferenceSession not available yet")
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_onnx_node_quant_session(case):
    run_case(_with_arrays(case))
