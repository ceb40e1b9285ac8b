"""Engines: where the shards of a job run. One interface, three implementations.

``progress(done, total)``: an engine that runs the items elsewhere (the local and Ray
engines) also calls ``progress(0, total)`` once every item is submitted, so that a caller
can start its own work then without delaying the submission.

``engine.map(fn, shared, items)`` returns ``[fn(shared, item) for item in items]`` in
the order of ``items``, whatever order the workers finish in. ``shared`` (the model, the
empty observers) is sent once per worker, not once per item. ``fn`` must be a module-level
function (it is pickled by reference). With ``on_result``, each result is handed to
``on_result(index, result)`` as soon as it arrives (the driver merges while the other
workers still run) and the list holds what ``on_result`` returns instead.

- :class:`InProcessEngine`: the loop above (what the tests compare against);
- :class:`LocalEngine`: ``workers`` processes on this machine (``concurrent.futures``);
- :class:`RayEngine`: Ray tasks, one per item, on a running cluster (``address``) or on a
  local one it starts and stops. With more items than workers, Ray hands the items out
  as workers free up (list scheduling, docs/scale.md eq. (S4)). A task whose worker process dies is re-run by Ray
  (``max_retries``); a shard's result is a pure function of its samples, so a re-run
  returns the same state and nothing is counted twice (only a finished task's result is
  ever merged).

``engine.reduce(fn, shared, items, merge)`` is ``merge`` folded over the results in the
order of ``items`` (``merge(a, b)``: ``a``'s items come before ``b``'s; it must be
associative, which is what makes the shape of the fold free). The Ray engine merges on
the workers, in a tree of adjacent pairs (docs/scale.md eq. (S2)) or, with ``split`` /
``join``, by reduce-scatter (eq. (S3): ``merge`` then also takes three adjacent runs,
``merge(a, b, c)``): a merge task runs as soon as its inputs exist, the states go from
worker to worker, and the driver receives merged states instead of one per shard. An engine without ``reduce`` is folded on
the driver by the caller (:class:`quanta.scale.ShardFold`).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = [
    "AdjacentMerges",
    "Engine",
    "InProcessEngine",
    "LocalEngine",
    "RayEngine",
    "make_engine",
    "tree_reduce",
]

Progress = Callable[[int, int], None]  # (items done, items)
OnResult = Callable[[int, Any], Any]  # (item index, result) -> what map keeps


class Engine(Protocol):
    workers: int

    def map(
        self,
        fn: Callable[[Any, Any], Any],
        shared: Any,
        items: Sequence[Any],
        progress: Progress | None = None,
        on_result: OnResult | None = None,
    ) -> list[Any]: ...


def tree_reduce(values: Sequence[Any], combine: Callable[[Any, Any], Any]) -> Any:
    """``combine`` over ``values`` in a tree of adjacent pairs, level by level from the
    left (an odd last value goes up a level unmerged): 8 values take 3 levels, and the
    order of the values is kept at every level, so an associative ``combine`` gives the
    left fold's result. ``combine`` may return a future (the Ray engine's merge tasks)."""
    if not values:
        raise ValueError("reduce: no values")
    level = list(values)
    while len(level) > 1:
        nxt = [combine(level[i], level[i + 1]) for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0]


class InProcessEngine:
    """Runs every item here, in order."""

    def __init__(self, workers: int = 1) -> None:
        self.workers = _check_workers(workers)

    def map(self, fn, shared, items, progress=None, on_result=None):
        out = []
        for i, item in enumerate(items):
            out.append(_hand(on_result, i, fn(shared, item)))
            if progress:
                progress(i + 1, len(items))
        return out


class LocalEngine:
    """``workers`` processes on this machine (spawned: no state inherited by fork)."""

    def __init__(self, workers: int = 2) -> None:
        self.workers = _check_workers(workers)

    def map(self, fn, shared, items, progress=None, on_result=None):
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(max_workers=self.workers, mp_context=ctx) as pool:
            futures = {pool.submit(fn, shared, item): i for i, item in enumerate(items)}
            if progress:
                progress(0, len(items))
            out: list[Any] = [None] * len(items)
            for done, fut in enumerate(as_completed(futures), 1):
                out[futures[fut]] = _hand(on_result, futures[fut], fut.result())
                if progress:
                    progress(done, len(items))
        return out


class RayEngine:
    """Ray tasks (``num_cpus`` each). ``address``: a running cluster ("auto",
    "ray://host:10001", "127.0.0.1:6379"); None starts a local cluster of ``workers``
    CPUs for the job and shuts it down after (unless Ray was already initialised, in
    which case that cluster is used and left running)."""

    def __init__(
        self, workers: int = 2, address: str | None = None, *, max_retries: int = 3, num_cpus: float = 1
    ) -> None:
        self.workers = _check_workers(workers)
        self.address = address
        self.max_retries = int(max_retries)
        self.num_cpus = num_cpus

    def map(self, fn, shared, items, progress=None, on_result=None):
        ray = _import_ray()
        started = False
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            started = True
        try:
            task = ray.remote(num_cpus=self.num_cpus, max_retries=self.max_retries)(_call)
            shared_ref = ray.put(shared)
            pending = [task.remote(fn, shared_ref, item) for item in items]
            if progress:
                progress(0, len(items))
            index = {ref: i for i, ref in enumerate(pending)}
            out: list[Any] = [None] * len(items)
            done = 0
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                for ref in ready:
                    out[index[ref]] = _hand(on_result, index[ref], ray.get(ref))
                    done += 1
                if progress:
                    progress(done, len(items))
            return out
        finally:
            if started:
                ray.shutdown()

    def reduce(
        self,
        fn: Callable[[Any, Any], Any],
        shared: Any,
        items: Sequence[Any],
        merge: Callable[..., Any],
        progress: Progress | None = None,
        *,
        split: Callable[[Any, int], Sequence[Any]] | None = None,
        join: Callable[[Sequence[Any]], Any] | None = None,
        finish: Callable[[Any], Any] | None = None,
    ) -> Any:
        """``merge`` folded over ``fn(shared, item)`` in item order, merged on the workers;
        only merged results come back to the driver.

        With ``split``/``join`` (a result cut into parts that merge independently, and
        put together again): reduce-scatter, docs/scale.md eq. (S3). Each task returns
        its result in ``P = min(workers, items)`` parts (Ray object refs of their own);
        each part is merged over the items by ``merge(a, b)`` or ``merge(a, b, c)`` tasks
        of adjacent runs (in item order), submitted as the items finish (:class:`AdjacentMerges`), so merging overlaps
        with the items still running and every merge handles 1/P of the state; the
        driver joins the P merged parts. Without them: a tree of pairs fixed in advance
        (:func:`tree_reduce`, ``merge(a, b)``, eq. (S2)).

        ``finish``: applied to each fully merged part (to the whole result without
        ``split``) in the task that merges its last item in, so what the driver receives
        and joins is ``finish``'s output (eq. (S7): the results instead of the states);
        ``join`` must accept it."""
        if not items:
            raise ValueError("reduce: no items")
        ray = _import_ray()
        started = False
        if not ray.is_initialized():
            if self.address:
                ray.init(address=self.address, log_to_driver=False)
            else:
                ray.init(num_cpus=self.workers, include_dashboard=False, log_to_driver=False)
            started = True
        try:
            options = dict(num_cpus=self.num_cpus, max_retries=self.max_retries)
            task = ray.remote(**options)(_call)
            shared_ref = ray.put(shared)
            if split is not None and join is not None:
                return self._reduce_scatter(
                    ray, options, fn, shared_ref, items, merge, progress, split, join, finish
                )
            leaves = [task.remote(fn, shared_ref, item) for item in items]
            if progress:
                progress(0, len(items))
            # _call(merge, a, b) = merge(a, b): a task that waits for its two inputs only
            # (object refs as arguments), which Ray moves from worker to worker
            root = tree_reduce(leaves, lambda a, b: task.remote(merge, a, b))
            if finish is not None:
                root = ray.remote(**options)(_call_all).remote(finish, root)
            pending, done = list(leaves), 0
            while pending:  # progress over the shards, without fetching their states here
                ready, pending = ray.wait(pending, num_returns=1, fetch_local=False)
                done += len(ready)
                if progress:
                    progress(done, len(items))
            return ray.get(root)
        finally:
            if started:
                ray.shutdown()

    def _reduce_scatter(self, ray, options, fn, shared_ref, items, merge, progress, split, join, finish):
        """Eq. (S3) of docs/scale.md: every item's result in P parts, each part merged
        over the items by adjacent runs as they finish (:class:`AdjacentMerges`), the P
        merged parts (``finish``ed by the merge that completes them, eq. (S7)) joined
        here."""
        n = len(items)
        parts = max(1, min(self.workers, n))
        leaf = ray.remote(num_returns=parts, **options)(_call_split)
        task_all = ray.remote(**options)(_call_all)
        # one item: its result is the merged result, finished in its own task
        last = finish if n == 1 else None
        outs = [leaf.remote(fn, split, parts, shared_ref, item, last) for item in items]
        if progress:
            progress(0, n)
        columns = [[o] for o in outs] if parts == 1 else outs
        tags = {c[p]: (p, i, i) for i, c in enumerate(columns) for p in range(parts)}
        merges = [AdjacentMerges() for _ in range(parts)]
        roots: list[Any] = [None] * parts
        pending, done = list(tags), 0
        while pending:  # nothing is fetched here until the P roots exist
            ready, pending = ray.wait(pending, num_returns=1, fetch_local=False)
            for ref in ready:
                p, lo, hi = tags.pop(ref)
                if p == 0 and lo == hi:
                    done += 1
                    if progress:
                        progress(done, n)
                if lo == 0 and hi == n - 1:
                    roots[p] = ref
                    continue
                runs = merges[p].add(lo, hi, ref)
                if runs is not None:
                    # a task that waits for its inputs only: Ray moves them to its worker
                    refs = [r for _, _, r in runs]
                    if finish is not None and runs[0][0] == 0 and runs[-1][1] == n - 1:
                        merged = task_all.remote(_merge_finish, merge, finish, *refs)
                    else:
                        merged = task_all.remote(merge, *refs)
                    tags[merged] = (p, runs[0][0], runs[-1][1])
                    pending.append(merged)
        return join(ray.get(roots))


class AdjacentMerges:
    """Which results to merge as they arrive, when ``merge`` is associative but not
    commutative (the moving average's log): a result covers a run of adjacent items
    [lo, hi]; it is merged at once with the waiting neighbours it has (the run ending at
    lo - 1 and the one starting at hi + 1: both in one merge of three runs when both
    wait), or waits for one. Every merge joins adjacent runs in item order, so the
    result is the in-order fold; the merges overlap with the items still running, and
    after the last item finishes one merge remains in the common case (its neighbours
    already merged and waiting on both sides), two at most (a neighbour's own merge
    still running). A merge of three runs reads each input once and writes one result,
    where two pair merges in a row would write and read the middle result once more.

    >>> m = AdjacentMerges()
    >>> m.add(2, 2, "c") is None and m.add(0, 0, "a") is None
    True
    >>> m.add(1, 1, "b")   # both neighbours wait: one merge of the three
    ((0, 0, 'a'), (1, 1, 'b'), (2, 2, 'c'))
    >>> m.add(4, 4, "e") is None
    True
    >>> m.add(3, 3, "d")   # only the run on its right waits
    ((3, 3, 'd'), (4, 4, 'e'))
    """

    def __init__(self) -> None:
        self._by_lo: dict[int, tuple[int, Any]] = {}  # lo -> (hi, value)
        self._by_hi: dict[int, int] = {}  # hi -> lo

    def add(self, lo: int, hi: int, value: Any) -> tuple[tuple[int, int, Any], ...] | None:
        """The runs to merge now, in item order (two or three, ``value``'s among them),
        or None: ``value`` waits."""
        runs = [(lo, hi, value)]
        left = self._by_hi.pop(lo - 1, None)
        if left is not None:
            _, lv = self._by_lo.pop(left)
            runs.insert(0, (left, lo - 1, lv))
        right = self._by_lo.pop(hi + 1, None)
        if right is not None:
            r_hi, rv = right
            del self._by_hi[r_hi]
            runs.append((hi + 1, r_hi, rv))
        if len(runs) > 1:
            return tuple(runs)
        self._by_lo[lo] = (hi, value)
        self._by_hi[hi] = lo
        return None


def _hand(on_result: OnResult | None, index: int, result: Any) -> Any:
    return result if on_result is None else on_result(index, result)


def _call(fn: Callable[[Any, Any], Any], shared: Any, item: Any) -> Any:
    return fn(shared, item)


def _call_all(fn: Callable[..., Any], *args: Any) -> Any:
    return fn(*args)


def _merge_finish(merge: Callable[..., Any], finish: Callable[[Any], Any], *args: Any) -> Any:
    return finish(merge(*args))


def _call_split(
    fn: Callable[[Any, Any], Any],
    split: Callable[[Any, int], Sequence[Any]],
    parts: int,
    shared: Any,
    item: Any,
    finish: Callable[[Any], Any] | None = None,
) -> Any:
    result = fn(shared, item)
    if finish is not None:  # the only item: nothing left to merge
        result = finish(result)
    return result if parts == 1 else tuple(split(result, parts))


def _import_ray():
    try:
        import ray
    except ImportError:
        raise RuntimeError("the Ray engine needs Ray: pip install 'quanta[ray]' (or 'ray[data]')") from None
    return ray


def _check_workers(workers: int) -> int:
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an integer >= 1, got {workers!r}")
    return workers


ENGINES = ("inprocess", "local", "ray")


def make_engine(engine: str | Engine, workers: int | None = None, address: str | None = None) -> Engine:
    """An engine from its name ("inprocess", "local", "ray") or an engine as it is."""
    if not isinstance(engine, str):
        return engine
    if engine == "inprocess":
        return InProcessEngine(1 if workers is None else workers)
    if engine == "local":
        return LocalEngine(2 if workers is None else workers)
    if engine == "ray":
        return RayEngine(2 if workers is None else workers, address)
    raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}")


class ShardProgress:
    """One line on stderr (a terminal only): shards done, elapsed time."""

    def __init__(self, what: str, enabled: bool) -> None:
        self.what = what
        self.enabled = enabled and sys.stderr.isatty()
        self.t0 = time.perf_counter()

    def __call__(self, done: int, total: int) -> None:
        if self.enabled:
            end = "\n" if done == total else ""
            sys.stderr.write(
                f"\r{self.what}: {done}/{total} shards, {time.perf_counter() - self.t0:.1f} s{end}"
            )
            sys.stderr.flush()
