"""Batch inference over Ray Data: one session per actor, outputs in input order.

``run_folder`` (``quanta run MODEL --inputs DIR -o OUT --engine ray``) does the same for a
folder of ``.npz`` feeds, writing one ``.npz`` of outputs per input under the same name
(written to a temporary name, then renamed): a run that fails part-way is resumed by
running it again, which skips every input whose output exists.

    import functools, quanta, ray
    ds = ray.data.from_items([{"x": x} for x in inputs])           # one row per sample
    out = run_dataset(ds, functools.partial(quanta.InferenceSession, "m.int8.onnx"), concurrency=2)
    out.take_all()   # rows {"x": ..., "y": ...}: the model's outputs next to the inputs

A row is one feed: a column per model input holding the array ``session.run`` takes
(batch dimension included). Each actor builds its session once (``session_factory()``,
compiled once per actor) and runs the rows of a batch one by one, so every output is
what ``session.run`` returns for that row alone, bit for bit; ``preserve_order`` keeps
the rows in input order. Ray Data re-runs a failed batch on another actor (a batch is a
pure function of its rows). ``session_factory`` is passed in because sessions live in
the API layer (docs/design.md); ``functools.partial(InferenceSession, path,
sess_options=...)`` is the usual one (``intra_op_num_threads`` per actor there).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

__all__ = ["SessionBatchRunner", "run_dataset", "run_folder"]


class SessionBatchRunner:
    """The per-actor callable of ``map_batches``: a session built once, then rows."""

    def __init__(self, session_factory: Callable[[], Any], output_names: Sequence[str] | None = None) -> None:
        self.session = session_factory()
        self.inputs = [a.name for a in self.session.get_inputs()]
        self.outputs = list(output_names or [o.name for o in self.session.get_outputs()])

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        n = len(next(iter(batch.values())))
        results: dict[str, list[np.ndarray]] = {name: [] for name in self.outputs}
        for i in range(n):
            feed = {name: np.asarray(batch[name][i]) for name in self.inputs}
            for name, arr in zip(self.outputs, self.session.run(self.outputs, feed)):
                results[name].append(np.asarray(arr))
        out = {k: v for k, v in batch.items()}
        for name, arrs in results.items():
            out[name] = _column(arrs)
        return out


def _column(arrs: list[np.ndarray]) -> Any:
    """Stack equal shapes into one tensor column; otherwise an object column of arrays
    (variable output shapes, e.g. sequence lengths)."""
    if arrs and all(a.shape == arrs[0].shape and a.dtype == arrs[0].dtype for a in arrs):
        return np.stack(arrs)
    col = np.empty(len(arrs), dtype=object)
    col[:] = arrs
    return col


def run_dataset(
    dataset: Any,
    session_factory: Callable[[], Any],
    *,
    concurrency: int = 2,
    batch_size: int = 16,
    num_cpus: float = 1,
    output_names: Sequence[str] | None = None,
) -> Any:
    """``dataset`` (a Ray Dataset of feed rows) with the model's outputs as new columns,
    in input order: ``map_batches`` over an actor pool of ``concurrency`` sessions."""
    import ray.data

    # the dataset carries the context it was made with (a copy of the global one at that
    # time): setting the global one alone left a dataset made before unordered
    ray.data.DataContext.get_current().execution_options.preserve_order = True
    context = getattr(dataset, "context", None)
    if context is not None:
        context.execution_options.preserve_order = True
    return dataset.map_batches(
        SessionBatchRunner,
        fn_constructor_args=(session_factory, output_names),
        batch_size=batch_size,
        batch_format="numpy",
        concurrency=concurrency,
        num_cpus=num_cpus,
    )


class _FileRunner:
    """The per-actor callable of :func:`run_folder`: reads a feed file, writes its outputs."""

    def __init__(self, session_factory: Callable[[], Any], out_dir: str) -> None:
        self.session = session_factory()
        self.out_dir = out_dir
        self.outputs = [o.name for o in self.session.get_outputs()]

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        import os

        written = []
        for path in batch["path"]:
            with np.load(str(path), allow_pickle=False) as d:
                feed = {k: d[k] for k in d.files}
            outs = self.session.run(self.outputs, feed)
            target = os.path.join(self.out_dir, os.path.basename(str(path)))
            tmp = target + ".tmp.npz"
            np.savez(tmp, **dict(zip(self.outputs, outs)))
            os.replace(tmp, target)
            written.append(target)
        return {"path": batch["path"], "output": np.asarray(written)}


def run_folder(
    inputs: str,
    out_dir: str,
    session_factory: Callable[[], Any],
    *,
    concurrency: int = 2,
    num_cpus: float = 1,
) -> tuple[int, int]:
    """Run every ``inputs/*.npz`` feed, writing ``out_dir/<same name>.npz``; inputs whose
    output exists are skipped (resume). Returns (run now, skipped)."""
    import os

    import ray.data

    os.makedirs(out_dir, exist_ok=True)
    files = sorted(f for f in os.listdir(inputs) if f.endswith(".npz"))
    todo = [os.path.join(inputs, f) for f in files if not os.path.exists(os.path.join(out_dir, f))]
    if todo:
        ds = ray.data.from_items([{"path": p} for p in todo])
        ds.map_batches(
            _FileRunner,
            fn_constructor_args=(session_factory, out_dir),
            batch_size=8,
            batch_format="numpy",
            concurrency=concurrency,
            num_cpus=num_cpus,
        ).materialize()
    return len(todo), len(files) - len(todo)
