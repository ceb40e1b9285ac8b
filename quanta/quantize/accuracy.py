"""Accuracy-driven quantization: ``quantize_static(..., accuracy=AccuracyTarget(...))``.

Without an evaluation function: the calibration data is split (in order) into the part
that calibrates, a *search* part the metric is measured on while fixes are chosen, and a
*confirm* part the result is finally checked on (docs/debugger.md, "Accuracy target").
The metric compares the quantized model's outputs with the FP32 model's on the same
feeds (eqs. (1), (2), (11)); a callable metric gets the quantized file's path instead.
The search compares trials, and checks the target, by an estimate of the metric on data
it has not seen (``AccuracyTarget.estimate``): for top-1 agreement the expected
agreement of eq. (11b) (the FP32 margins of every feed against the logit noise measured
on the search part), for the mean cosine the mean less one standard error (eq. (2b)). A
count of agreeing rows on a few held-out feeds saturates (every row agrees) and then
neither ranks trials nor predicts the next images; the estimates are continuous. The
verdict is eq. (2c): the point estimate on the confirm part (no trial was picked there,
so no standard error is taken off), for the mean cosine the mean measured there.

The search (deterministic: same model, data and target, same choices):

1. quantize with the recipe; measure the metric on the search part;
2. while below the target: whole-model fixes that keep every MAC in integer, each kept
   when it improves the metric: GPTQ weight rounding (eq. (12)) when the recipe rounds
   to nearest, SmoothQuant (eq. (13)) when the recipe has it off;
2b. while below the target: 16-bit activations (A16W8, every MAC still integer) around
   the fewest worst nodes by eq. (5e) whose shares reach 50 %, 75 %, 90 % of the
   estimated error, one evaluation per batch (WIDE_SHARES, :func:`widenable`);
3. while below the target and within ``max_steps`` fixes: rank the quantized nodes by
   the debugger's eq. (5e) on calibration feeds, and for the worst node not tried yet
   try, cheapest first, (a) for a tensor it reads or writes whose range another
   calibration method makes at least 1 dB better on the data (eq. (8)): that range,
   pinned in the recipe's ``overrides``; (b) keeping the node float (``exclude``).
   A fix is kept when the metric improves; every trial is one full evaluation;
4. confirm the best trial on the confirm part (eq. (2c)), also when the search stopped
   below the target; report the verdict with its margin, what changed and why, the
   integer MAC share, the evaluations used and the search's CPU seconds. The chosen overrides and exclusions are in the recipe the
   output records (metadata ``quanta.recipe``), so re-running with that recipe
   reproduces the file without a search.
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

__all__ = [
    "AccuracyReport",
    "AccuracyTarget",
    "class_rows",
    "estimate_metric",
    "evaluate_metric",
    "expected_agreement",
    "install",
    "int8_share",
    "margin_noise",
    "noise_for_agreement",
    "run_outputs",
    "shown",
    "widenable",
]

# The layer ranking (quanta.debug.compare) and the session that runs the trial files live
# in layers above this one; the package's __init__ installs them (as the runtime injects
# the reference evaluator into the passes).
_HOOKS: dict[str, Callable[..., Any]] = {}


def install(
    *,
    compare: Callable[..., Any],
    outputs: Callable[..., Any],
    learn: Callable[..., Any] | None = None,
    trainable: Callable[..., str] | None = None,
) -> None:
    """``compare(fp32, quantized, feeds, histograms=True, engine=None)`` -> a DebugResult;
    ``outputs(path, feeds, engine=None)`` -> per feed, the model's outputs (``engine``: a
    quanta.scale engine the feeds are sharded over, or None for this process);
    ``learn(fp32, path, feeds, spec)`` trains the QDQ file at ``path`` in place
    (Recipe.learned, quanta.qat.learned) and returns what it did; ``trainable(path)`` ->
    "" when it can, else why not."""
    _HOOKS["compare"] = compare
    _HOOKS["outputs"] = outputs
    if learn is not None and trainable is not None:
        _HOOKS["learn"] = learn
        _HOOKS["trainable"] = trainable


def learn_file(
    fp32: Any, path: Any, feeds: list[dict[str, np.ndarray]], spec: dict[str, Any]
) -> dict[str, Any]:
    """Recipe.learned applied to the written file at ``path`` (quanta.qat.learned.learn)."""
    if "learn" not in _HOOKS:
        raise RuntimeError('recipe.learned needs quanta.qat and PyTorch: pip install "quanta[torch]"')
    return _HOOKS["learn"](fp32, path, feeds, spec)


METRICS = ("sqnr", "cosine", "mean_cosine", "top1_agreement")
DEFAULT_MINIMUM = {"sqnr": 30.0, "cosine": 0.999, "mean_cosine": 0.999, "top1_agreement": 0.98}


@dataclass
class AccuracyTarget:
    """What the quantized model must reach against FP32.

    ``metric``: "sqnr" (dB over every output, eq. (1)), "cosine" (the smallest cosine of
    a sample's output row, eq. (2)), "mean_cosine" (their mean), "top1_agreement" (eq. (11)), or a callable
    ``metric(quantized_path) -> float`` (higher is better). ``minimum``: the value to
    reach (default per metric: 30 dB, 0.999, 0.98). ``eval_data``: feeds to measure on
    instead of a held-out part of the calibration data. ``holdout``: the share of the
    calibration feeds held out (half for the search, half to confirm). ``max_steps``:
    the most fixes tried. ``min_integer_share``: a fix that leaves less of the MACs in
    integer arithmetic is not kept."""

    metric: str | Callable[[str], float] = "top1_agreement"
    minimum: float | None = None
    eval_data: Any = None
    holdout: float = 0.3
    max_steps: int = 12
    debug_feeds: int = 4  # calibration feeds the debugger ranks layers on
    # a fix that leaves a smaller share of the MACs in integer is not kept (None: any)
    min_integer_share: float | None = None
    # the same for the share of MACs in 8-bit integer (16-bit activations lower it)
    min_int8_share: float | None = None
    # try 16-bit activations (A16W8) for the worst layers before keeping any float
    wide_activations: bool = True
    # compare trials and check the target by the estimates of eqs. (11b) / (2b) (what the
    # metric is expected to be on unseen data), not by the plain metric on the held-out feeds
    estimate: bool = True
    # the final file's calibration data: "all" (every feed given, held-out parts too: the
    # chosen recipe with more data for its ranges and GPTQ statistics, the file that
    # quantize_static with the recorded recipe on the same data writes; the held-out parts
    # only choose and confirm the recipe, as a user who gave N samples expects all N to
    # calibrate the file) or "calibration" (the part the trials calibrated on: the very
    # file the confirmation measured)
    final_data: str = "all"
    # the last lever, when the fixes above leave the target unmet: the best file's weight
    # and bias codes trained against FP32 with its activations quantized in the loop
    # (Recipe.learned, quanta.qat.learned; its 16-bit and float choices kept), kept when
    # it measures better. True: Recipe.learned's defaults; a dict: those fields; False
    # (the default: the training costs minutes of CPU where the rest of the search costs
    # a few quantizations): off. Taken only where PyTorch is installed and quanta.qat can
    # train the file
    learned: bool | dict[str, Any] = False

    def __post_init__(self) -> None:
        if isinstance(self.metric, str) and self.metric not in METRICS:
            raise ValueError(
                f"accuracy metric: unknown {self.metric!r}; expected one of {METRICS} or a callable"
            )
        if self.minimum is None:
            if not isinstance(self.metric, str):
                raise ValueError("accuracy: a callable metric needs a minimum")
            self.minimum = DEFAULT_MINIMUM[self.metric]
        if not 0.0 < self.holdout < 1.0:
            raise ValueError(f"accuracy holdout: expected a share in (0, 1), got {self.holdout}")
        if self.final_data not in ("calibration", "all"):
            raise ValueError(f"accuracy final_data: expected 'calibration' or 'all', got {self.final_data!r}")

    @property
    def name(self) -> str:
        return self.metric if isinstance(self.metric, str) else getattr(self.metric, "__name__", "metric")


def shown(value: float, minimum: float) -> str:
    """``value`` with the fewest significant digits (at least 4) that keep its side of
    ``minimum``: 0.99797 against 0.998 prints as 0.99797, not as 0.998."""
    for digits in range(4, 18):
        text = f"{value:.{digits}g}"
        if (float(text) >= minimum) == (value >= minimum):
            return text
    return repr(value)


@dataclass
class AccuracyReport:
    """What the search did. ``met``: the target holds on the confirmation data by eq.
    (2c)'s point estimate there (``confirmed``; the search data chose the trial, the
    confirmation data did not, so they judge it without the standard error the search
    takes off); ``confirmed_se``: that estimate's standard error, the margin's yardstick."""

    target: str
    minimum: float
    before: float
    after: float
    confirmed: float | None
    met: bool
    evaluations: int
    changes: list[str] = field(default_factory=list)
    tried: list[str] = field(default_factory=list)
    reason: str = ""
    integer_share: float | None = None
    int8_share: float | None = None  # of the MACs, in 8-bit integer (not 16-bit)
    # the plain metric (eqs. (1), (2), (11)) of the result on the search / confirmation
    # feeds, where ``after`` is the estimate of eqs. (11b) / (2b) and ``confirmed`` the
    # point estimate of eq. (2c)
    after_measured: float | None = None
    confirmed_measured: float | None = None
    confirmed_se: float | None = None
    # CPU seconds of the search in this process (every trial's quantization, evaluation
    # and debugger pass; an engine's worker processes are not counted)
    cpu_seconds: float | None = None

    def format(self) -> str:
        head = f"accuracy target {self.target} >= {self.minimum:g}: " + ("met" if self.met else "NOT met")
        if self.confirmed is not None:
            gap = self.confirmed - self.minimum
            se = "" if not self.confirmed_se else f"; one standard error {self.confirmed_se:.2g}"
            head += (
                f", {shown(self.confirmed, self.minimum)} on the confirmation data "
                f"({abs(gap):.2g} {'above' if gap >= 0 else 'below'} the target{se})"
            )
        cost = f"{self.evaluations} full evaluation(s)" + (
            "" if self.cpu_seconds is None else f", {self.cpu_seconds:.0f} s CPU"
        )
        lines = [
            head,
            f"search data: {self.before:.4g} -> {shown(self.after, self.minimum)}"
            + (
                " (estimates with one standard error taken off, eqs. (11b) / (2b))"
                if self.after_measured is not None and self.target in ("top1_agreement", "mean_cosine")
                else ""
            )
            + f"; {cost}",
        ]
        if self.after_measured is not None:
            lines.append(
                f"measured {self.target}: {self.after_measured:.4g} on the search data"
                + (
                    ""
                    if self.confirmed_measured is None
                    else f", {self.confirmed_measured:.4g} on the confirmation data"
                )
            )
        if self.integer_share is not None:
            lines.append(
                f"integer MAC share: {self.integer_share * 100:.1f} %"
                + ("" if self.int8_share is None else f" ({self.int8_share * 100:.1f} % in 8-bit)")
            )
        for c in self.changes:
            lines.append(f"  changed: {c}")
        if self.reason:
            lines.append(f"  {self.reason}")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


# ------------------------------------------------------------------------------ metrics


def run_outputs(
    path: Any, feeds: Sequence[dict[str, np.ndarray]], engine: Any = None
) -> list[list[np.ndarray]]:
    """Per feed, the outputs of the model file at ``path`` run by quanta (through the
    installed session hook; ``engine``: a quanta.scale engine the feeds are sharded over,
    or None for this process)."""
    return _HOOKS["outputs"](path, feeds, engine=engine)


def _row_cosines(r: np.ndarray, g: np.ndarray) -> np.ndarray:
    """Eq. (2)'s rows: per sample of a first output (its whole row), the cosine of ``g``
    against ``r`` (1 where either is all zeros), float64."""
    rr = r.reshape(r.shape[0], -1) if r.ndim > 1 else r.reshape(1, -1)
    gg = np.asarray(g, np.float64).reshape(rr.shape)
    den = np.linalg.norm(rr, axis=1) * np.linalg.norm(gg, axis=1)
    return np.where(den > 0, np.sum(rr * gg, 1) / np.where(den > 0, den, 1.0), 1.0)


def class_rows(out: np.ndarray) -> np.ndarray | None:
    """An output as rows [samples, classes] for top-1 agreement (eq. (11)), or None when
    it has no class axis: a vector of more than one score is one row; rank 2 and 3 (a
    classifier's [N, C], a sequence's per-step scores [N, T, C] or [T, N, C]) have their
    classes last; rank 4 and more read as per-pixel scores [N, C, ...] (a segmenter's),
    classes along axis 1. One class (an edge map [N, 1, H, W], a score per sample
    [N, 1]) is no choice, so agreement would count nothing; ``r.size == 0`` neither."""
    r = np.asarray(out)
    if r.size == 0 or r.dtype.kind != "f" or r.ndim == 0:
        return None
    if r.ndim == 1:
        return r.reshape(1, -1) if r.shape[0] > 1 else None
    if r.ndim <= 3:
        return r.reshape(-1, r.shape[-1]) if r.shape[-1] > 1 else None
    return np.moveaxis(r, 1, -1).reshape(-1, r.shape[1]) if r.shape[1] > 1 else None


class NoClassAxis(ValueError):
    """Top-1 agreement asked of an output that has no class axis (:func:`class_rows`)."""


def evaluate_metric(metric: str, ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> float:
    """``metric`` of ``got`` against ``ref`` (per feed, per output): eqs. (1), (2), (11)."""
    sig = noise = 0.0
    cos_min = 1.0
    cos_sum, cos_n = 0.0, 0
    agree = total = 0
    for r_outs, g_outs in zip(ref, got):
        for k, (r, g) in enumerate(zip(r_outs, g_outs)):
            r = np.asarray(r, np.float64)
            g = np.asarray(g, np.float64)
            if r.dtype.kind != "f" or r.size == 0:
                continue
            sig += float(np.sum(r * r))
            noise += float(np.sum((r - g) ** 2))
            if k == 0:
                cos = _row_cosines(r, g)
                cos_min = min(cos_min, float(cos.min()))
                cos_sum += float(cos.sum())
                cos_n += int(cos.size)
                rr, gr = class_rows(r), class_rows(g.reshape(r.shape))
                if rr is not None and gr is not None:
                    a, b = rr.argmax(-1), gr.argmax(-1)
                    agree += int(np.sum(a == b))
                    total += int(a.size)
    if metric == "sqnr":
        return math.inf if noise == 0 else (10 * math.log10(sig / noise) if sig > 0 else -math.inf)
    if metric == "cosine":
        return cos_min
    if metric == "mean_cosine":
        return cos_sum / cos_n if cos_n else 1.0
    if not total and any(r_outs and np.asarray(r_outs[0]).size for r_outs in ref):
        shape = next(list(np.shape(r_outs[0])) for r_outs in ref if r_outs)
        raise NoClassAxis(
            f"top-1 agreement needs class scores, and the first output (shape {shape}) has "
            "no class axis (one channel, or a single score): measure it with metric 'sqnr' "
            "or 'cosine' (--target-sqnr / --target-cosine)"
        )
    return agree / total if total else 1.0


#: FP32 runner-ups per row in eq. (11b): a flip goes to one of the classes closest to the top
AGREEMENT_COMPETITORS = 5


def _rows(outs: list[list[np.ndarray]]) -> list[np.ndarray]:
    """Per feed, its first output as float64 rows [samples, classes] (eq. (11)'s rows)."""
    rows = []
    for o in outs:
        if not o:
            continue
        r = class_rows(np.asarray(o[0]))
        if r is not None:
            rows.append(r.astype(np.float64))
    return rows


def _competitors(r: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """(top class [n], the k next classes by FP32 value [n, k]) of rows ``r``."""
    order = np.argsort(-r, axis=1, kind="stable")
    return order[:, 0], order[:, 1 : 1 + k]


def margin_noise(ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> tuple[float, int]:
    """(σ, rows) of eq. (11b): the root mean square over rows i and their FP32 runner-ups
    j of δ_ij = (g_ij − r_ij) − (g_i,top − r_i,top), how much quantization moves a
    runner-up's logit towards the top's."""
    ss, n_val, n_rows = 0.0, 0, 0
    for r, g in zip(_rows(ref), _rows(got)):
        if r.shape[1] < 2:
            continue
        k = min(AGREEMENT_COMPETITORS, r.shape[1] - 1)
        top, comp = _competitors(r, k)
        e = g.reshape(r.shape) - r
        idx = np.arange(r.shape[0])[:, None]
        d = e[idx, comp] - e[idx, top[:, None]]
        ss += float(np.sum(d * d))
        n_val += d.size
        n_rows += r.shape[0]
    return (math.sqrt(ss / n_val) if n_val else 0.0), n_rows


def _phi(x: np.ndarray) -> np.ndarray:
    """The standard normal distribution function, elementwise."""
    return 0.5 * np.vectorize(math.erfc, otypes=[np.float64])(-np.asarray(x, np.float64) / math.sqrt(2.0))


def expected_agreement(margin_rows: list[list[np.ndarray]], sigma: float) -> float:
    """Eq. (11b): mean over the FP32 rows of ``margin_rows`` of Π_j Φ(m_ij / σ), the
    probability that none of the row's runner-ups j overtakes its top class when the
    margins m_ij = r_i,top − r_ij move by Gaussian noise of the eq. (11b) σ."""
    probs = []
    for r in _rows(margin_rows):
        if r.shape[1] < 2:
            continue
        k = min(AGREEMENT_COMPETITORS, r.shape[1] - 1)
        top, comp = _competitors(r, k)
        idx = np.arange(r.shape[0])[:, None]
        m = r[idx, top[:, None]] - r[idx, comp]
        if sigma <= 0:
            probs.append(np.ones(r.shape[0]))
        else:
            probs.append(np.prod(_phi(m / sigma), axis=1))
    return float(np.mean(np.concatenate(probs))) if probs else 1.0


def noise_for_agreement(margin_rows: list[list[np.ndarray]], minimum: float, rows: int) -> float | None:
    """The largest margin noise σ whose eq. (11b) estimate (σ measured on ``rows`` rows,
    so scaled by 1 + 1/√(2·rows)) still reaches ``minimum``; None when no σ does (a
    minimum above 1). Bisection: (11b) falls as σ grows."""
    widen = 1 + 1 / math.sqrt(2 * max(rows, 1))
    if expected_agreement(margin_rows, 0.0) < minimum:
        return None
    hi = 1.0
    while expected_agreement(margin_rows, hi * widen) >= minimum and hi < 1e12:
        hi *= 2
    lo = 0.0
    for _ in range(60):
        mid = (lo + hi) / 2
        if expected_agreement(margin_rows, mid * widen) >= minimum:
            lo = mid
        else:
            hi = mid
    return lo


def estimate_metric(
    metric: str,
    ref: list[list[np.ndarray]],
    got: list[list[np.ndarray]],
    margin_rows: list[list[np.ndarray]] | None = None,
    *,
    guard: bool = True,
) -> float:
    """What ``metric`` is expected to be on data not seen, from ``got`` against ``ref`` on
    held-out feeds, one standard error on the unfavourable side (``guard=False``: the
    point estimate itself, without that standard error, eq. (2c)):

    - "top1_agreement", eq. (11b): :func:`expected_agreement` over the FP32 rows of
      ``margin_rows`` (every feed with an FP32 output; ``ref`` when None) with the
      :func:`margin_noise` σ of ``got`` scaled by 1 + 1/√(2n) (n rows: the standard
      error of a root mean square of n samples);
    - "mean_cosine", eq. (2b): the mean of the rows' cosines less their standard error
      s/√n (s their standard deviation, n ≥ 2);
    - otherwise the metric itself (the smallest cosine and the SQNR over every output
      are not averages of the rows)."""
    if metric == "top1_agreement":
        sigma, n = margin_noise(ref, got)
        if n == 0:
            return evaluate_metric(metric, ref, got)
        widen = 1 + 1 / math.sqrt(2 * n) if guard else 1.0
        return expected_agreement(margin_rows if margin_rows is not None else ref, sigma * widen)
    if metric == "mean_cosine":
        cos = []
        for r_outs, g_outs in zip(ref, got):
            if not r_outs or np.asarray(r_outs[0]).dtype.kind != "f" or np.asarray(r_outs[0]).size == 0:
                continue
            cos.append(_row_cosines(np.asarray(r_outs[0], np.float64), g_outs[0]))
        c = np.concatenate(cos) if cos else np.ones(1)
        if c.size < 2 or not guard:
            return float(c.mean())
        return float(c.mean() - c.std(ddof=1) / math.sqrt(c.size))
    return evaluate_metric(metric, ref, got)


# ------------------------------------------------------------------------------ search

#: the shares of the estimated output error (eq. (5e)) whose layers get 16-bit
#: activations, one evaluation each, smallest first
WIDE_SHARES = (0.5, 0.75, 0.9)


def int8_share(summary: Any) -> float | None:
    """The share of the MACs that runs in 8-bit integer (16-bit operands excluded)."""
    cov = getattr(summary, "coverage", None)
    if cov is None or not cov.total_macs:
        return None
    wide = sum(n.macs for n in cov.nodes if n.integer_op and n.integer_op.endswith("16"))
    return (cov.integer_macs - wide) / cov.total_macs


def widenable(path: str | os.PathLike) -> set[str]:
    """The activations of the QDQ file ``path`` that can be stored in 16 bits with every
    reader still integer: each Conv / MatMul / Gemm that reads the tensor's
    DequantizeLinear writes a QuantizeLinear (A16W8 ops have an integer output only;
    docs/kernels.md "A16W8"). Elementwise readers have no MACs to lose."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    consumers: dict[str, list[Any]] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    out: set[str] = set()
    for n in g.node:
        if n.op_type != "QuantizeLinear" or n.domain not in ("", "ai.onnx"):
            continue
        ok = True
        for dq in consumers.get(n.output[0], []):
            for c in consumers.get(dq.output[0], []) if dq.op_type == "DequantizeLinear" else []:
                if c.op_type in ("Conv", "MatMul", "Gemm"):
                    readers = consumers.get(c.output[0], [])
                    # a Relu / Clip between is absorbed into the output's range when lowered
                    while len(readers) == 1 and readers[0].op_type in ("Relu", "Clip"):
                        readers = consumers.get(readers[0].output[0], [])
                    ok = ok and bool(readers) and all(r.op_type == "QuantizeLinear" for r in readers)
        if ok:
            out.add(n.input[0])
    return out


def _wide_batches(dbg: Any, recipe, target: AccuracyTarget, allowed: set[str]):
    """(share, node names, recipe) per entry of WIDE_SHARES: the fewest worst nodes whose
    eq. (5e) contributions reach that share, with every activation they read or write
    stored as int16 (``overrides``) where :func:`widenable` (``allowed``) says every reader
    stays integer. Batches that add no tensor are skipped."""
    from quanta.quantize.recipe import TensorOverride

    ranked = [
        r
        for r in dbg.worst(len(dbg.nodes))
        if r.contribution > 0 and any(t in allowed for t in [r.output, *r.inputs])
    ]
    done = 0
    for share in WIDE_SHARES:
        acc, k = 0.0, 0
        while k < len(ranked) and acc < share:
            acc += ranked[k].contribution
            k += 1
        if k <= done:
            continue
        done = k
        ov = dict(recipe.overrides)
        for r in ranked[:k]:
            for t in [r.output, *r.inputs]:
                if t not in allowed or dbg.tensor(t) is None:  # a weight, or a float reader
                    continue
                old = ov.get(t)
                ov[t] = TensorOverride(range=None if old is None else old.range, dtype="int16")
        yield acc, [r.name for r in ranked[:k]], dataclasses.replace(recipe, overrides=ov)


def wide_macs(path: str | os.PathLike, macs: dict[str, int]) -> dict[str, set[str]]:
    """Per activation of the QDQ file ``path``: the Conv / MatMul / Gemm nodes that run
    A16W8 when it is stored in 16 bits, those that read its DequantizeLinear and the one
    that writes it (through a Relu / Clip absorbed into its output range), among the
    nodes of ``macs`` (node name -> MACs, the coverage of the same file). The writer
    counts: a group with a 16-bit output lowers to QLinearConv16 / QLinearMatMul16 as one
    with a 16-bit input does (passes/lower/wide.py checks x, w and y)."""
    import onnx

    g = onnx.load(str(path), load_external_data=False).graph
    consumers: dict[str, list[Any]] = {}
    producer: dict[str, Any] = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
        for o in n.output:
            producer[o] = n
    out: dict[str, set[str]] = {}
    for n in g.node:
        if n.op_type != "QuantizeLinear" or n.domain not in ("", "ai.onnx"):
            continue
        t = n.input[0]
        hit: set[str] = set()
        for dq in consumers.get(n.output[0], []):
            for c in consumers.get(dq.output[0], []) if dq.op_type == "DequantizeLinear" else []:
                if c.name in macs:
                    hit.add(c.name)
        w = producer.get(t)
        while w is not None and w.op_type in ("Relu", "Clip") and w.name not in macs:
            w = producer.get(w.input[0])
        if w is not None and w.name in macs:
            hit.add(w.name)
        out[t] = hit
    return out


def _budget_batch(
    dbg: Any,
    recipe,
    allowed: set[str],
    path: str,
    summary: Any,
    floor: float,
    integer_floor: float | None = None,
):
    """The worst nodes by eq. (5e), in rank order, whose activations fit in 16 bits while
    the 8-bit integer MAC share stays at least ``floor``: a node whose widening would
    pass the budget is skipped and the next tried (a cheap node further down still
    fits). A node with MACs none of whose activations can be 16-bit (a Gemm writing the
    float logits: an A16W8 group needs an integer output) is kept float instead where
    its own MACs fit, and the integer share stays at least ``integer_floor``: its error
    is its weights' and its input's rounding, which no widening reaches (EfficientNet-
    Lite0's classifier: 0.33 % of the MACs, +0.7 dB). Returns (share of eq. (5e), node
    names, the names kept float, recipe), or None when none fits."""
    from quanta.quantize.recipe import TensorOverride

    cov = getattr(summary, "coverage", None)
    if cov is None or not cov.total_macs:
        return None
    macs = {n.name: n.macs for n in cov.nodes if n.macs and n.integer_op}
    wide_now = {n.name for n in cov.nodes if n.integer_op and n.integer_op.endswith("16")}
    int8_now = sum(m for k, m in macs.items() if k not in wide_now)
    budget = int8_now - floor * cov.total_macs
    if budget <= 0:
        return None
    readers = wide_macs(path, macs)
    ov = dict(recipe.overrides)
    spent: set[str] = set(wide_now)
    used, share, names = 0, 0.0, []
    floats: list[str] = []
    int_left = cov.integer_macs - (0.0 if integer_floor is None else integer_floor * cov.total_macs)
    for r in dbg.worst(len(dbg.nodes)):
        if r.contribution <= 0:
            continue
        ts = [t for t in [r.output, *r.inputs] if t in allowed and dbg.tensor(t) is not None]
        if not ts:
            own = macs.get(r.name)
            if own is None or r.name in spent or used + own > budget or own > int_left:
                continue
            used += own
            int_left -= own
            spent.add(r.name)
            share += r.contribution
            names.append(r.name)
            floats.append(r.name)
            continue
        more = set().union(*(readers.get(t, set()) for t in ts)) - spent
        cost = sum(macs[k] for k in more)
        if used + cost > budget:
            continue
        used += cost
        spent |= more
        share += r.contribution
        names.append(r.name)
        for t in ts:
            old = ov.get(t)
            ov[t] = TensorOverride(range=None if old is None else old.range, dtype="int16")
    if not names:
        return None
    exclude = (*recipe.exclude, *(n for n in floats if n not in recipe.exclude))
    return share, names, floats, dataclasses.replace(recipe, overrides=ov, exclude=exclude)


_GLOBAL_FIXES = (
    ("GPTQ weight rounding for every layer (docs/debugger.md eq. (12))", "weight_rounding", "gptq"),
    ("SmoothQuant balancing, alpha 0.8 (eq. (13))", "smooth_quant", 0.8),
)


def _learned_lever(target: AccuracyTarget, recipe: Any, path: str) -> str:
    """ "" when the search's last lever (Recipe.learned) applies to the best trial at
    ``path``, else why not."""
    if not target.learned:
        return "off (AccuracyTarget.learned=False)"
    if recipe.learned is not None:
        return "the recipe trains already"
    if "trainable" not in _HOOKS:
        return 'PyTorch is not installed (pip install "quanta[torch]")'
    return _HOOKS["trainable"](path)


def split_feeds(feeds: list[dict[str, np.ndarray]], target: AccuracyTarget):
    """(calibration, search, confirm) parts of the calibration feeds, in order."""
    n = len(feeds)
    if target.eval_data is not None:
        evals = list(target.eval_data)
        half = max(1, len(evals) // 2)
        return feeds, evals[:half], evals[half:] or evals[:half]
    if n < 3:
        raise ValueError(
            f"accuracy target: {n} calibration feed(s); holding data out needs at least 3 "
            "(or pass AccuracyTarget(eval_data=...))"
        )
    held = max(2, round(n * target.holdout))
    held = min(held, n - 1)
    calib, rest = feeds[: n - held], feeds[n - held :]
    half = max(1, len(rest) // 2)
    return calib, rest[:half], rest[half:] or rest[:half]


def search(
    model_input: Any,
    model_output: str | os.PathLike,
    feeds: list[dict[str, np.ndarray]],
    recipe,
    target: AccuracyTarget,
    quantize: Callable[..., Any],
    *,
    engine: Any = None,
):
    """Run the search (module docstring); ``quantize(src, dst, calib, recipe)`` is
    quantize_static without a target. Returns (summary of the written file, report).
    ``engine`` (a quanta.scale engine): the evaluations and the debugger passes shard
    their feeds over it (their results are the single process's: outputs are per feed,
    the debugger's statistics merge exactly), so the search takes the same steps."""
    from quanta.quantize.recipe import TensorOverride

    compare = _HOOKS["compare"]
    metric = target.metric
    minimum = target.minimum
    if minimum is None:  # __post_init__ fills it in; only a later assignment leaves it None
        raise ValueError("accuracy target: minimum is None; set AccuracyTarget(minimum=...)")

    cpu0 = time.process_time()  # the search's cost, this process's threads (an engine's workers not)
    calib, search_feeds, confirm_feeds = split_feeds(feeds, target)
    src = model_input
    with tempfile.TemporaryDirectory() as tmp:
        if not isinstance(model_input, (str, os.PathLike)):
            import onnx

            from quanta.ir.onnx_io import load_proto

            proto, _ = load_proto(model_input)
            src = os.path.join(tmp, "fp32.onnx")
            onnx.save(proto, src)
        callable_metric = not isinstance(metric, str)
        # a callable metric reads the quantized file, not FP32 outputs: no references
        ref_search = [] if callable_metric else run_outputs(str(src), search_feeds, engine)
        ref_confirm = [] if callable_metric else run_outputs(str(src), confirm_feeds, engine)
        if metric == "top1_agreement":
            evaluate_metric(metric, ref_search, ref_search)  # NoClassAxis before any trial
        # eq. (11b) weighs the noise against the FP32 margins of every feed: the FP32
        # outputs depend on no trial, so the calibration part's count as unseen rows too
        margin_rows: list[list[np.ndarray]] | None = None
        if metric == "top1_agreement" and target.estimate:
            margin_rows = run_outputs(str(src), calib, engine) + ref_search
            if confirm_feeds is not search_feeds:
                margin_rows += ref_confirm
        evaluations = 0
        measured: dict[str, float] = {}  # trial path -> the plain metric on the search feeds
        points: dict[str, float] = {}  # trial path -> eq. (2c)'s point estimate on the search feeds
        noise: dict[str, tuple[float, int]] = {}  # trial path -> eq. (11b)'s (σ, rows)

        def score(ref: list[list[np.ndarray]], got: list[list[np.ndarray]], guard: bool = True) -> float:
            assert isinstance(metric, str)
            if not target.estimate:
                return evaluate_metric(metric, ref, got)
            return estimate_metric(metric, ref, got, margin_rows, guard=guard)

        trial = 0

        def measure(
            rec,
            feeds_ref: list[list[np.ndarray]] | None = None,
            feeds_in: list[dict[str, np.ndarray]] | None = None,
        ) -> tuple[float, str, Any]:
            nonlocal evaluations, trial
            trial += 1
            path = os.path.join(tmp, f"trial{trial}.onnx")
            summary = quantize(src, path, calib, rec)
            evaluations += 1
            if not isinstance(metric, str):
                return float(metric(path)), path, summary
            got = run_outputs(path, feeds_in or search_feeds, engine)
            measured[path] = evaluate_metric(metric, feeds_ref or ref_search, got)
            points[path] = score(feeds_ref or ref_search, got, guard=False)
            if metric == "top1_agreement":
                noise[path] = margin_noise(feeds_ref or ref_search, got)
            return score(feeds_ref or ref_search, got), path, summary

        best_value, best_path, best_summary = measure(recipe)
        before = best_value
        best_recipe = recipe
        changes: list[str] = []
        tried: list[str] = []
        tried_nodes: set[str] = set()
        reason = ""
        steps = 0
        confirmed: float | None = None
        confirmed_measured: float | None = None
        confirmed_se: float | None = None
        confirmed_path: str | None = None

        def confirm(path: str, value: float) -> float:
            """The verdict's value, eq. (2c): the point estimate of the metric on the
            confirmation feeds (no trial was chosen on them, so no standard error is taken
            off); sets the plain metric there and the standard error beside it."""
            nonlocal confirmed_measured, confirmed_se, confirmed_path
            confirmed_path = path
            if not isinstance(metric, str) or confirm_feeds is search_feeds:
                confirmed_measured = measured.get(path)
                point = points.get(path, value)
                confirmed_se = point - value if target.estimate and path in points else None
                return point
            got = run_outputs(path, confirm_feeds, engine)
            confirmed_measured = evaluate_metric(metric, ref_confirm, got)
            point = score(ref_confirm, got, guard=False)
            confirmed_se = point - score(ref_confirm, got) if target.estimate else None
            return point

        # whole-model fixes first, cheapest in MACs (none leaves integer arithmetic):
        # rounding-aware weights (eq. (12)), then activation balancing (eq. (13))
        for text, field_name, value in _GLOBAL_FIXES:
            if best_value >= minimum or steps >= target.max_steps:
                break
            if getattr(best_recipe, field_name) == value or (
                field_name == "weight_rounding" and best_recipe.weight_rounding != "nearest"
            ):
                continue  # (a recipe that rounds by GPTQ already, or by eq. (12g))
            rec = dataclasses.replace(best_recipe, **{field_name: value})
            steps += 1
            v, path, summary = measure(rec)
            tried.append(f"{text}: {best_value:.4g} -> {v:.4g}")
            if v > best_value:
                best_value, best_path, best_summary, best_recipe = v, path, summary, rec
                changes.append(f"{text} ({tried[-1].rsplit(': ', 1)[1]})")
        dbg: Any = None
        dbg_path = None
        if best_value < minimum and steps < target.max_steps and target.wide_activations:
            # 16-bit activations (A16W8: every MAC stays integer) for the layers eq. (5e)
            # ranks worst, in growing batches: one debugger pass ranks them, one evaluation
            # per batch measures, so no per-layer evaluation is needed
            dbg = compare(src, best_path, calib[: target.debug_feeds], histograms=False, engine=engine)
            dbg_path = best_path
            floor8 = target.min_int8_share

            def try_wide(text: str, names: list[str], rec: Any) -> str:
                """Measures one 16-bit batch and keeps it when it measures better within
                the MAC floors; returns the floor it breaks ("int8", "integer") or ""."""
                nonlocal steps, best_value, best_path, best_summary, best_recipe
                steps += 1
                value, path, summary = measure(rec)
                tried.append(f"{text}: {best_value:.4g} -> {value:.4g}")
                int8, share_all = int8_share(summary), summary.integer_share
                if floor8 is not None and int8 is not None and int8 < floor8:
                    tried[-1] += f" (not kept: 8-bit integer MAC share {int8 * 100:.1f} %)"
                    return "int8"
                floor = target.min_integer_share
                if floor is not None and share_all is not None and share_all < floor:
                    tried[-1] += f" (not kept: integer MAC share {share_all * 100:.1f} %)"
                    return "integer"
                if value > best_value:
                    best_value, best_path, best_summary, best_recipe = value, path, summary, rec
                    more = f" and {len(names) - 8} more" if len(names) > 8 else ""
                    changes.append(f"{text} ({tried[-1].rsplit(': ', 1)[1]}): {', '.join(names[:8])}{more}")
                return ""

            over_floor = False
            for share, names, rec in _wide_batches(dbg, best_recipe, target, widenable(best_path)):
                if steps >= target.max_steps:
                    break
                text = (
                    f"16-bit activations around the {len(names)} layer(s) eq. (5e) ranks worst "
                    f"({share * 100:.0f} % of the estimated error)"
                )
                if try_wide(text, names, rec) == "int8":
                    over_floor = True
                    break  # the next batch is larger still
                if best_value >= minimum:
                    break
            budgeted = None
            if over_floor and floor8 is not None and best_value < minimum and steps < target.max_steps:
                budgeted = _budget_batch(
                    dbg,
                    best_recipe,
                    widenable(best_path),
                    best_path,
                    best_summary,
                    floor8,
                    target.min_integer_share,
                )
            if budgeted is not None:
                # the share batches pass the 8-bit floor: the worst nodes that fit under it
                share, names, floats, rec = budgeted
                text = (
                    f"16-bit activations around the {len(names)} worst layer(s) by eq. (5e) that fit the "
                    f"8-bit MAC floor ({share * 100:.0f} % of the estimated error)"
                    + (
                        f", {len(floats)} of them kept float (no activation of theirs can be 16-bit): "
                        + ", ".join(floats)
                        if floats
                        else ""
                    )
                )
                try_wide(text, names, rec)
        while True:
            if best_value >= minimum:
                confirmed = confirm(best_path, best_value)
                if confirmed >= minimum:
                    break
                reason = (
                    f"met on the search data ({shown(best_value, minimum)}) but not on the held-out "
                    f"confirmation data ({shown(confirmed, minimum)}, {minimum - confirmed:.2g} below); "
                    "more calibration data makes the two agree"
                )
            if steps >= target.max_steps:
                reason = reason or (
                    f"stopped after {steps} trial fix(es) (max_steps): the best, "
                    f"{shown(best_value, minimum)}, is below {target.minimum:g}"
                )
                break
            if dbg is None or dbg_path != best_path:  # rank again only after a fix was kept
                dbg = compare(src, best_path, calib[: target.debug_feeds], histograms=True, engine=engine)
                dbg_path = best_path
            candidates = [
                r for r in dbg.worst(len(dbg.nodes)) if r.name not in tried_nodes and r.contribution > 0
            ]
            if not candidates:
                reason = reason or (
                    "every quantized node with a measurable error was tried; the best, "
                    f"{shown(best_value, minimum)}, is below {target.minimum:g} (the rest of the error "
                    "comes from nodes no fix improved)"
                )
                break
            node = candidates[0]
            tried_nodes.add(node.name)
            fixes: list[tuple[str, Any]] = []
            for tname in [node.output, *node.inputs]:
                t = dbg.tensor(tname)
                best = None if t is None else t.best_method()
                if (
                    best is not None
                    and best.sqnr_db > t.chosen_sqnr_db + 1.0
                    and tname not in best_recipe.overrides
                ):
                    ov = dict(best_recipe.overrides)
                    ov[tname] = TensorOverride(range=(float(best.lo), float(best.hi)))
                    fixes.append(
                        (
                            f"{tname}: range [{best.lo:.4g}, {best.hi:.4g}] from {best.method} calibration "
                            f"({t.chosen_sqnr_db:.1f} -> {best.sqnr_db:.1f} dB on the tensor)",
                            dataclasses.replace(best_recipe, overrides=ov),
                        )
                    )
            if not any(node.name == e for e in best_recipe.exclude):
                fixes.append(
                    (
                        f"{node.name} ({node.op}) kept float: local SQNR {node.local_db:.1f} dB, "
                        f"{node.contribution * 100:.0f} % of the estimated output error",
                        dataclasses.replace(best_recipe, exclude=(*best_recipe.exclude, node.name)),
                    )
                )
            for text, rec in fixes:
                steps += 1
                value, path, summary = measure(rec)
                tried.append(f"{text}: {best_value:.4g} -> {value:.4g}")
                share = summary.integer_share
                if (
                    target.min_integer_share is not None
                    and share is not None
                    and share < target.min_integer_share
                ):
                    tried[-1] += f" (not kept: integer MAC share {share * 100:.1f} %)"
                    continue
                int8 = int8_share(summary)
                if target.min_int8_share is not None and int8 is not None and int8 < target.min_int8_share:
                    tried[-1] += f" (not kept: 8-bit integer MAC share {int8 * 100:.1f} %)"
                    continue
                if value > best_value:
                    best_value, best_path, best_summary, best_recipe = value, path, summary, rec
                    changes.append(f"{text} ({tried[-1].rsplit(': ', 1)[1]})")
                    reason = ""
                    break
                if steps >= target.max_steps:
                    break
        # the search's own stop: its best met the target on the search data and was confirmed
        met = confirmed_path == best_path and confirmed is not None and min(best_value, confirmed) >= minimum
        why_not = _learned_lever(target, best_recipe, best_path) if not met else "met"
        if not why_not:
            from quanta.quantize.recipe import learned_spec

            spec = learned_spec({} if target.learned is True else dict(target.learned or {}))
            rec = dataclasses.replace(best_recipe, learned=spec)
            value, path, summary = measure(rec)
            note = next((n for n in summary.notes if n.startswith("learned")), "learned")
            tried.append(f"{note}: {best_value:.4g} -> {value:.4g}")
            if value > best_value:
                best_value, best_path, best_summary, best_recipe = value, path, summary, rec
                changes.append(tried[-1])
                reason = ""
                if best_value >= minimum:
                    confirmed = confirm(best_path, best_value)
                    if confirmed < minimum:
                        reason = (
                            f"met on the search data ({shown(best_value, minimum)}) but not on the held-out "
                            f"confirmation data ({shown(confirmed, minimum)}, {minimum - confirmed:.2g} "
                            "below); more calibration data makes the two agree"
                        )
                else:
                    best = shown(best_value, minimum)
                    reason = f"the best, {best}, is below {target.minimum:g} after every lever"
        elif why_not != "met" and target.learned:
            tried.append(f"learned weights not tried: {why_not}")
        if confirmed_path != best_path:
            # the verdict is the confirmation data's (eq. (2c)): the best trial is measured
            # there also when the search stopped below the target on the search data
            confirmed = confirm(best_path, best_value)
        assert confirmed is not None
        met = confirmed >= minimum
        if met:
            reason = (
                ""
                if best_value >= minimum
                else (
                    f"the search data's estimate ({shown(best_value, minimum)}, one standard error taken "
                    "off) is below the target; the confirmation data, on which no trial was chosen, decide"
                )
            )
        if not met and margin_rows is not None and best_path in noise:
            # how far the search was: the margin noise eq. (11b) allows against the best's
            sigma, n = noise[best_path]
            allowed = noise_for_agreement(margin_rows, minimum, n)
            if allowed is not None and sigma > 0:
                gap = 20 * math.log10(sigma / allowed) if allowed > 0 else math.inf
                reason += (
                    f"; by eq. (11b) {minimum:g} needs the margin noise σ <= {allowed:.3g}, the best "
                    f"trial's is {sigma:.3g} ({gap:.1f} dB too much)"
                )
        # the final file: the best recipe, quantized once more straight to the output path
        if target.final_data == "calibration" and best_recipe.learned is not None:
            # the same recipe on the same feeds writes the same bytes: the trained trial
            # is the file (its training is the costly part of the search)
            shutil.copyfile(best_path, model_output)
            summary = best_summary
        else:
            summary = quantize(src, model_output, feeds if target.final_data == "all" else calib, best_recipe)
    report = AccuracyReport(
        target=target.name,
        minimum=float(minimum),
        before=before,
        after=best_value,
        confirmed=confirmed,
        met=met,
        evaluations=evaluations,
        changes=changes,
        tried=tried,
        reason=reason,
        integer_share=summary.integer_share,
        int8_share=int8_share(summary),
        after_measured=measured.get(best_path) if target.estimate else None,
        confirmed_measured=confirmed_measured if target.estimate else None,
        confirmed_se=confirmed_se,
        cpu_seconds=time.process_time() - cpu0,
    )
    del best_summary
    return summary, report
