"""quanta: quantization backend for ONNX models.

Public API (mirrors ONNX Runtime where it has an equivalent)::

    sess = quanta.InferenceSession("model.int8.onnx")   # backend="native" | "reference"
    outs = sess.run(None, {"input": x})
    quanta.quantize_static("model.onnx", "model.int8.onnx", calibration_data)
    quanta.quantize_dynamic("model.onnx", "model.dyn.onnx")
"""

from __future__ import annotations

from quanta.calibrate.readers import CalibrationDataReader, ImagePreprocess
from quanta.quantize.accuracy import AccuracyTarget
from quanta.quantize.dynamic import quantize_dynamic
from quanta.quantize.recipe import CalibrationMethod, Recipe
from quanta.quantize.static import QuantizationSummary, quantize_static
from quanta.session import GraphOptimizationLevel, InferenceSession, InvalidArgument, NodeArg, SessionOptions

__all__ = [
    "AccuracyTarget",
    "CalibrationDataReader",
    "CalibrationMethod",
    "GraphOptimizationLevel",
    "ImagePreprocess",
    "InferenceSession",
    "InvalidArgument",
    "NodeArg",
    "QuantizationSummary",
    "Recipe",
    "SessionOptions",
    "__version__",
    "quantize_dynamic",
    "quantize_static",
]

__version__ = "0.1.0"


def _session_outputs(path, feeds, engine=None):
    """Per feed, the outputs of ``path`` run by an InferenceSession (the accuracy search's
    trials); with a quanta.scale ``engine``, contiguous shards of the feeds run where it
    runs them (the model sent as bytes) and the outputs come back in feed order."""
    if engine is None:
        return _session_outputs_shard(path, feeds)
    from pathlib import Path

    from quanta.scale import split

    model = Path(path).read_bytes()
    shards = [list(feeds[r.start : r.stop]) for r in split(len(feeds), engine.workers)] if feeds else []
    return [out for part in engine.map(_session_outputs_shard, model, shards) for out in part]


def _session_outputs_shard(model, feeds):
    # No GEMM autotuning: a measurement runs each file once on a few feeds, and the
    # blocking changes speed only, never a byte (quanta/runtime/tuner.py), while tuning
    # costs a run of the model and up to its budget of measuring (every session when
    # the machine is loaded: nothing is cached then)
    sess = InferenceSession(model, SessionOptions(enable_tuning=False))
    names = {i.name for i in sess.get_inputs()}
    return [sess.run(None, {k: v for k, v in f.items() if k in names}) for f in feeds]


def _install_accuracy_hooks() -> None:
    import importlib.util

    from quanta.debug.compare import compare
    from quanta.quantize import accuracy

    if importlib.util.find_spec("torch") is None:  # quanta.qat (Recipe.learned) needs it
        accuracy.install(compare=compare, outputs=_session_outputs)
        return
    accuracy.install(compare=compare, outputs=_session_outputs, learn=_learn, trainable=_trainable)


def _learn(fp32, path, feeds, spec):
    from quanta.qat.learned import learn

    return learn(fp32, path, feeds, spec)


def _trainable(path) -> str:
    from quanta.qat.learned import trainable

    return trainable(path)


_install_accuracy_hooks()
