"""Calibration and batch inference past one process: shard the samples, run each shard
where a worker is (another process, a Ray cluster), merge the observer states exactly.

    from quanta.scale import RayEngine, calibrate_sharded
    quanta.quantize_static("m.onnx", "m.int8.onnx", "calib/", engine="ray", workers=8)
    outs = run_dataset(ds, functools.partial(quanta.InferenceSession, "m.int8.onnx"))

Every observer state merges bit for bit (docs/scale.md), so the quantized file is the
one a single process writes, for any number of workers, shards and completion order.
Ray is optional (``pip install quanta[ray]``); the in-process and local-process engines
need nothing beyond quanta.
"""

from __future__ import annotations

from quanta.scale.calibrate import (
    MIN_SHARD_SAMPLES,
    SHARDS_PER_WORKER,
    ShardFold,
    ShardState,
    calibrate_sharded,
    default_shards,
    merge_into,
    merge_pair,
    merge_states,
    split,
)
from quanta.scale.engines import Engine, InProcessEngine, LocalEngine, RayEngine, make_engine, tree_reduce
from quanta.scale.inference import run_dataset, run_folder

__all__ = [
    "MIN_SHARD_SAMPLES",
    "SHARDS_PER_WORKER",
    "Engine",
    "InProcessEngine",
    "LocalEngine",
    "RayEngine",
    "ShardFold",
    "ShardState",
    "calibrate_sharded",
    "default_shards",
    "make_engine",
    "merge_into",
    "merge_pair",
    "merge_states",
    "run_dataset",
    "run_folder",
    "split",
    "tree_reduce",
]
