"""Calibration does not depend on how many threads NumPy's BLAS uses: the ranges (and
so the quantized file) are the same on a machine with more cores, and the same in this
process as in a one-thread Ray worker. The float products of the reference kernels go
through BLAS, whose sums depend on its thread split; calibration pins it to one thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import hashlib, json
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper
    from quanta.calibrate import HistogramObserver
    from quanta.calibrate.runner import calibrate
    from quanta.ir.onnx_io import from_proto

    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((384, 320)).astype(np.float32), "w")
    g = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [96, 384])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [96, 320])], [w])
    model = from_proto(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), "m")
    feeds = [{"x": rng.standard_normal((96, 384)).astype(np.float32)} for _ in range(3)]
    r = calibrate(model, ["y"], feeds, lambda n: HistogramObserver(bins=4096, axis=1), progress=False)
    print(hashlib.sha256(json.dumps(r["y"].to_dict(), sort_keys=True).encode()).hexdigest())
    """
)


def _run(threads: int) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def test_calibration_is_the_same_with_one_or_several_blas_threads():
    assert _run(1) == _run(4)
