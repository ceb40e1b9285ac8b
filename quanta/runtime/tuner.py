"""The autotuner: cache blockings of the int8 GEMM measured on the CPU that runs them.

The int8 GEMM (``qgemm``, quanta/kernels/cpp/qgemm/qgemm.h ``Blocking``) takes its cache
blocking at run time: ``mc`` rows per A block, ``nc`` N panels per B block, ``kc`` per K
chunk, the B prefetch distance of the AVX-512 tile. Every value gives the same bytes (the
int32 sums wrap, so the grouping and order of the K chunks do not change them, and the
output stage is per element), so the choice changes speed only. The built-in heuristics
were tuned on one CPU; this module measures, per distinct GEMM shape of a model, the
candidates of :func:`candidates` on the machine itself and installs the fastest into the
kernel library's table (``_native.qgemm_set_tuned``), which every qgemm call consults:
matrix multiplications, the convolution paths built on qgemm, batched and recurrent GEMMs.

Steps (:func:`tune_session`, called by ``InferenceSession``):

1. one run of the model with the library recording the shapes of its qgemm calls
   (``_native.qgemm_record_shapes``); shapes under :data:`MIN_MACS` multiply-adds are left
   to the heuristics (a few microseconds: timing noise exceeds what blocking can gain);
2. each shape's choice is looked up in the cache, keyed by CPU model, quanta version and
   (ISA, M, N, K, threads);
3. the shapes the cache does not know are measured, largest first, within the time
   budget: the candidates of one shape run round-robin on synthetic operands in C++
   (``_native.qgemm_time_blockings``), repeated; a candidate replaces the heuristic
   blocking only when the median of its speed-ups over the heuristic one, each measured
   in the same round-robin, is at least :data:`MIN_GAIN` (else noise would pick), and not
   at all when the heuristic blocking's own times spread by more than :data:`MAX_SPREAD`
   (a loaded machine: nothing is chosen or cached, the next session measures again);
4. the choices go into the library's table and into the cache.

The cache is one JSON file, ``tuner-v{FORMAT}.json`` in the user cache folder
(``$QUANTA_CACHE_DIR``, else ``$XDG_CACHE_HOME/quanta``, else ``~/.cache/quanta``).
Writers merge their entries into what is on disk and replace the file atomically (a
temporary file in the same folder, then ``os.replace``), so concurrent sessions never
leave a torn file; a lost update only costs a re-measurement. A file that does not parse,
or holds another format, is ignored with a warning (and replaced on the next write).

Switches: ``SessionOptions.enable_tuning`` / ``tuning_budget_s``; the environment
variable ``QUANTA_TUNE=0`` turns tuning off everywhere (the cache is then neither read
nor written and the heuristics apply).
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DEFAULT_BUDGET_S",
    "FORMAT",
    "MIN_GAIN",
    "MIN_MACS",
    "Choice",
    "GemmShape",
    "TuneReport",
    "apply_cached",
    "cache_path",
    "candidates",
    "cpu_model",
    "load_cache",
    "save_choices",
    "tune_session",
    "tune_shapes",
    "tuning_enabled",
]

#: Version of the cache file's layout (in its name and its "format" field).
FORMAT = 1
#: Default measuring time per model, seconds.
DEFAULT_BUDGET_S = 3.0
#: Shapes with fewer multiply-adds are not tuned.
MIN_MACS = 1 << 21
#: A candidate must run this much faster than the heuristic blocking to replace it.
MIN_GAIN = 1.03
#: The baseline's median time over its best, above which a measurement is not trusted.
MAX_SPREAD = 1.10
#: Measuring time per shape, seconds: at least, and at most.
SHAPE_MIN_S, SHAPE_MAX_S = 0.12, 0.6

ENV_SWITCH = "QUANTA_TUNE"
ENV_CACHE_DIR = "QUANTA_CACHE_DIR"
BLOCKING_FIELDS = ("mc", "nc", "kc", "prefetch", "prefetch_a")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("quanta")
    except PackageNotFoundError:
        return "0+unknown"


@dataclass(frozen=True, order=True)
class GemmShape:
    """What a qgemm call's blocking depends on."""

    isa: str
    M: int
    N: int
    K: int
    threads: int

    @property
    def macs(self) -> int:
        return self.M * self.N * self.K

    def key(self) -> str:
        return f"{self.isa}:{self.M}x{self.N}x{self.K}:t{self.threads}"

    def __str__(self) -> str:
        return f"{self.M}x{self.N}x{self.K} ({self.isa}, {self.threads} thread{'s' if self.threads != 1 else ''})"


@dataclass
class Choice:
    """The blocking one shape runs with and where it came from."""

    shape: GemmShape
    blocking: dict[str, int]  # the fields that differ from the heuristics ({}: heuristics)
    heuristic: dict[str, int]  # the heuristic blocking, resolved (qgemm_blocking)
    gain: float  # heuristic time / chosen time (1.0: the heuristics kept)
    source: str  # "measured", "cache", or "noisy" (measured on a loaded machine: heuristics kept, not cached)
    calls: int = 0  # calls per run of the model


@dataclass
class TuneReport:
    """What :func:`tune_session` did, for ``sess.tuning`` and ``quanta bench``."""

    choices: list[Choice] = field(default_factory=list)
    untuned: list[GemmShape] = field(default_factory=list)  # over budget or too small
    seconds: float = 0.0
    cache: str = ""
    note: str = ""

    def __str__(self) -> str:
        lines = [
            f"tuner: {len(self.choices)} GEMM shapes tuned in {self.seconds:.2f} s"
            + (f", {len(self.untuned)} left to the heuristics" if self.untuned else "")
            + (f" ({self.note})" if self.note else "")
        ]
        for c in self.choices:
            what = ", ".join(f"{k} {v}" for k, v in c.blocking.items()) or "heuristics kept"
            base = ", ".join(f"{k} {c.heuristic[k]}" for k in BLOCKING_FIELDS if k in c.heuristic)
            lines.append(f"  {c.shape}: {what} [{c.source}, {c.gain:.3f}x vs {base}; {c.calls} calls/run]")
        return "\n".join(lines)


# --------------------------------------------------------------------------------------
# switches, CPU identity, cache
# --------------------------------------------------------------------------------------


def tuning_enabled(option: bool = True) -> bool:
    """``option`` (SessionOptions.enable_tuning) unless ``QUANTA_TUNE`` says 0 / off / false."""
    env = os.environ.get(ENV_SWITCH, "").strip().lower()
    if env in ("0", "off", "false", "no"):
        return False
    return option


def cpu_model() -> str:
    """The CPU's model name with its family / model / stepping (Linux), else the platform's
    processor string: choices measured on one CPU model are reused only on it."""
    try:
        info: dict[str, str] = {}
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
        name = info.get("model name", "")
        if name:
            return f"{name} (family {info.get('cpu family', '?')} model {info.get('model', '?')} stepping {info.get('stepping', '?')})"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def cache_path() -> Path:
    root = os.environ.get(ENV_CACHE_DIR)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = (
            os.path.join(xdg, "quanta") if xdg else os.path.join(os.path.expanduser("~"), ".cache", "quanta")
        )
    return Path(root) / f"tuner-v{FORMAT}.json"


def _prefix() -> str:
    return f"{cpu_model()}|{_version()}|"


def load_cache(path: Path | None = None) -> dict[str, dict[str, Any]]:
    """Every entry of the cache file (key -> entry); {} with a warning when the file
    cannot be read as this format, {} silently when there is none."""
    path = cache_path() if path is None else path
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return {}
    except OSError as e:
        warnings.warn(
            f"quanta tuner: cannot read the cache {path}: {e}; using the built-in blockings", stacklevel=2
        )
        return {}
    try:
        data = json.loads(text)
    except ValueError as e:
        warnings.warn(f"quanta tuner: ignoring the cache {path}: not valid JSON ({e})", stacklevel=2)
        return {}
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or not isinstance(data.get("entries"), dict)
    ):
        found = (
            f"format {data.get('format')!r}" if isinstance(data, dict) else f"a JSON {type(data).__name__}"
        )
        warnings.warn(
            f"quanta tuner: ignoring the cache {path}: {found}, expected format {FORMAT} with an 'entries' object",
            stacklevel=2,
        )
        return {}
    out = {}
    for k, v in data["entries"].items():
        if isinstance(k, str) and _valid_entry(v):
            out[k] = v
    return out


def _valid_entry(v: object) -> bool:
    if not isinstance(v, dict) or not isinstance(v.get("blocking"), dict):
        return False
    b = v["blocking"]
    return all(k in BLOCKING_FIELDS and isinstance(x, int) and not isinstance(x, bool) for k, x in b.items())


def save_choices(choices: Iterable[Choice], path: Path | None = None) -> None:
    """Merge ``choices`` into the cache file: read, update, write a temporary file in the
    same folder, ``os.replace`` it over the cache (atomic on POSIX and Windows)."""
    path = cache_path() if path is None else path
    new = {
        _prefix() + c.shape.key(): {
            "blocking": dict(c.blocking),
            "gain": round(c.gain, 4),
            "time": int(time.time()),
        }
        for c in choices
        if c.source == "measured"
    }
    if not new:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a bad file was reported when it was read
            entries = load_cache(path)
        entries.update(new)
        fd, tmp = tempfile.mkstemp(prefix=".tuner-", suffix=".json", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump({"format": FORMAT, "entries": entries}, f, indent=1, sort_keys=True)
            os.replace(tmp, path)
        except BaseException:
            with _suppress():
                os.unlink(tmp)
            raise
    except OSError as e:
        warnings.warn(f"quanta tuner: cannot write the cache {path}: {e}", stacklevel=2)


class _suppress:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> bool:
        return True


# --------------------------------------------------------------------------------------
# candidates and measurement
# --------------------------------------------------------------------------------------


def _native() -> Any:
    from quanta.kernels import _native

    return _native


def _tunables(isa: str) -> set[str]:
    for row in _native().kernel_table():
        if row["op"] == "qgemm" and row["isa"] == isa:
            return set(row["tunables"])
    return set()


def candidates(shape: GemmShape, heuristic: dict[str, int]) -> list[dict[str, int]]:
    """The blockings measured for ``shape``: the heuristic one first ({}), then one
    parameter changed at a time, and the row-tiles-outer order with B blocks that fit
    the L2 of smaller cores. Only the tunables the dispatch table lists for the ISA."""
    tun = _tunables(shape.isa)
    mr = {"avx512vnni": 12}.get(shape.isa, 4)
    nr = {"avx512vnni": 32}.get(shape.isa, 16)
    n_panels = -(-shape.N // nr)
    out: list[dict[str, int]] = [{}]

    def add(c: dict[str, int]) -> None:
        c = {k: v for k, v in c.items() if k in tun and heuristic.get(k) != v}
        if c and c not in out:
            out.append(c)

    if "mc" in tun:
        for mc in (mr, 4 * mr, 8 * mr, 16 * mr):
            if mc < shape.M + mr:
                add({"mc": mc})
    if "nc" in tun:
        for nc in (4, 8, 16):
            if nc < n_panels:
                add({"nc": nc})
                add({"mc": mr, "nc": nc})
    if "kc" in tun and shape.K > 512:
        add({"kc": 512})
    if "prefetch" in tun:
        for pf in (0, 4096):
            add({"prefetch": pf})
    if "prefetch_a" in tun and shape.M > 2 * mr:
        add({"prefetch_a": 1})
    return out


def _measure(
    s: GemmShape, timed: list[dict[str, int]], seconds: float, clock: Callable[[], float]
) -> tuple[list[float], bool]:
    """Gain of each candidate over the first (the heuristic blocking): the median, over
    repeated short round-robin measurements, of baseline time / candidate time in the same
    measurement, so that a disturbance hits the compared pair alike and a lucky batch
    cannot pick a winner. ``noisy``: the baseline's own times spread by more than
    :data:`MAX_SPREAD` (a loaded machine), when no choice is trusted or cached."""
    nat = _native()
    samples: list[list[float]] = []
    end = clock() + seconds
    while len(samples) < 3 or clock() < end:
        samples.append(list(nat.qgemm_time_blockings(s.isa, s.M, s.N, s.K, s.threads, timed, 0.0)))
    gains = [statistics.median(t[0] / t[j] for t in samples) for j in range(len(timed))]
    base = sorted(t[0] for t in samples)
    noisy = base[len(base) // 2] / base[0] > MAX_SPREAD
    return gains, noisy


def _heuristic(s: GemmShape) -> dict[str, int]:
    """The heuristic blocking of ``s`` (its table entry, if any, is removed first: the
    caller installs the new choice)."""
    nat = _native()
    nat.qgemm_set_tuned(s.isa, s.M, s.N, s.K, s.threads, None)
    return dict(nat.qgemm_blocking(s.isa, s.M, s.N, s.K, s.threads))


def tune_shapes(
    shapes: dict[GemmShape, int],
    budget_s: float = DEFAULT_BUDGET_S,
    *,
    use_cache: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> TuneReport:
    """Choose and install a blocking for each shape (calls per run as the values), from
    the cache or measured within ``budget_s``; see the module docstring."""
    nat = _native()
    t0 = clock()
    report = TuneReport(cache=str(cache_path()) if use_cache else "")
    cached = load_cache() if use_cache else {}
    prefix = _prefix()
    todo = sorted(shapes, key=lambda s: (-s.macs * shapes[s], s))
    measure: list[GemmShape] = []
    for s in todo:
        if s.macs < MIN_MACS:
            report.untuned.append(s)
            continue
        heuristic = _heuristic(s)
        hit = cached.get(prefix + s.key())
        if hit is not None:
            b = hit["blocking"]
            nat.qgemm_set_tuned(s.isa, s.M, s.N, s.K, s.threads, b)
            report.choices.append(
                Choice(s, dict(b), heuristic, float(hit.get("gain", 1.0)), "cache", shapes[s])
            )
        else:
            measure.append(s)
    for i, s in enumerate(measure):
        left = budget_s - (clock() - t0)
        per_shape = min(SHAPE_MAX_S, left / (len(measure) - i)) if left > 0 else 0.0
        if per_shape < SHAPE_MIN_S:
            report.untuned += measure[i:]
            report.note = f"budget {budget_s:g} s spent"
            break
        heuristic = _heuristic(s)
        cands = candidates(s, heuristic)
        base = {k: heuristic[k] for k in BLOCKING_FIELDS}
        timed = [dict(base)] + [{**base, **c} for c in cands[1:]]
        gains, noisy = _measure(s, timed, per_shape, clock)
        best = max(range(len(gains)), key=lambda j: gains[j])
        gain = gains[best]
        chosen = cands[best] if best and gain >= MIN_GAIN and not noisy else {}
        if not chosen:
            gain = 1.0
        nat.qgemm_set_tuned(s.isa, s.M, s.N, s.K, s.threads, chosen or None)
        report.choices.append(
            Choice(s, dict(chosen), heuristic, gain, "noisy" if noisy else "measured", shapes[s])
        )
    if use_cache:
        save_choices(report.choices)
    report.seconds = clock() - t0
    return report


def apply_cached(shapes: Iterable[GemmShape]) -> int:
    """Install the cached choices of ``shapes`` without measuring; how many were found."""
    nat = _native()
    cached = load_cache()
    prefix = _prefix()
    n = 0
    for s in shapes:
        hit = cached.get(prefix + s.key())
        if hit is not None:
            nat.qgemm_set_tuned(s.isa, s.M, s.N, s.K, s.threads, hit["blocking"])
            n += 1
    return n


def recorded_shapes(run: Callable[[], object]) -> dict[GemmShape, int]:
    """The qgemm shapes (with calls per run) of one call of ``run``."""
    nat = _native()
    nat.qgemm_record_shapes(True)
    try:
        run()
    finally:
        nat.qgemm_record_shapes(False)
    return {GemmShape(isa, M, N, K, t): calls for isa, M, N, K, t, calls in nat.qgemm_recorded_shapes()}


def tune_session(run: Callable[[], object], budget_s: float = DEFAULT_BUDGET_S) -> TuneReport:
    """Record the GEMM shapes of one ``run()`` of a model, then :func:`tune_shapes`. A run
    that fails leaves the heuristics in place, with a warning and the reason in the report."""
    t0 = time.perf_counter()
    try:
        shapes = recorded_shapes(run)
    except Exception as e:  # a model that cannot run on the generated inputs
        warnings.warn(
            f"quanta tuner: the tuning run failed ({e}); using the built-in blockings", stacklevel=2
        )
        return TuneReport(note=f"tuning run failed: {e}", seconds=time.perf_counter() - t0)
    report = tune_shapes(shapes, budget_s)
    report.seconds = time.perf_counter() - t0
    return report
