"""Which range set the tensors outside eq. (22) get: MinMax or MSE, measured (eq. (24)).

The weighted-MSE default gives a tensor read only by constant-weight layers the range
that minimises the error those layers see (calibrate/weighted_mse.py). Every other
tensor (residual Adds, the Muls of a written-out HardSwish or a gate, views, inputs of
Sub / Concat / pooling...) has no such model of where its error goes, and neither
per-tensor rule is right everywhere:

- MinMax keeps every tail, so a deep residual stack (an SVTR recognizer: ~200 tensors
  whose extremes are 1.3-2x their MSE range) pays a 1.5-2x coarser step on every one;
- MSE (eq. (21)) clips, and a clipping error is coherent: in a Siamese network whose two
  embeddings meet in a Sub, or a detector's score map, the clipped tails are the signal.

Both range sets come from one calibration pass (an MSE observer's extrema are MinMax),
so the choice is measured where it matters, at the model's outputs. Ranges measured on
the feeds that made them favour the set fitted to those feeds (MSE's clipping is tuned
to their tails: on ppocr_cls, MSE 42 dB against MinMax 16 dB in-sample, 22.3 against
25.4 dB on held-out images), so the candidates take their ranges from the even
calibration feeds and run on ``FEEDS`` odd ones::

    (24) choice = argmax_{R in {MinMax, MSE}} (1/|O|) Σ_o min(SQNR_o(R), CAP_DB),
         SQNR_o(R) = 10 log10(Σ r_o² / Σ (r_o - q_o(R))²)

with r_o the float model's output o and q_o(R) the output of the model quantized with
range set R, run by quanta's session (o over the float outputs; each output counts
alike, so a detector's box coordinates do not drown its scores). MinMax wins ties. With
fewer than ``MIN_FEEDS`` held-out feeds nothing is measured and MinMax, which clips
nothing, is kept: one image is one draw, and a set whose clipping fits the calibration
images' tails is the one that loses on images unlike them (nucseg_czann, three
calibration crops of one micrograph: MSE 16.9 dB against MinMax 15.0 dB on the held-out
crop, nucleus IoU 33.7 % against 41.3 % on brighter and flipped evaluation crops;
benchmarks/results/2026-12-04e-rangefeeds.md). The written recipe records the choice
(``Recipe.other_ranges``), so re-running it reproduces the file without measuring.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "CAP_DB",
    "FEEDS",
    "MIN_FEEDS",
    "RECURRENT_BAR_DB",
    "RECURRENT_LOSS_DB",
    "WIDE_TRY_SQNR_DB",
    "RangeChoice",
    "RecurrentChoice",
    "SplitObserver",
    "best_8bit_sqnr",
    "choose",
    "half_ranges",
    "mean_sqnr_db",
    "measure_recurrent",
    "output_sqnrs_db",
    "recurrent_decision",
    "reiterable",
    "split_observers",
    "unsplit",
    "wide_candidate",
    "wide_decision",
]

#: held-out (odd) calibration feeds the candidates run on (a bound on the cost)
FEEDS = 8
#: SQNR of one output is capped here, so an exact output does not outvote the others
CAP_DB = 100.0
#: fewer held-out feeds than this: no measurement, MinMax (the docstring above)
MIN_FEEDS = 2


#: below this output SQNR (dB) on the calibration feeds the summary warns that the file is
#: far from FP32 (a diffusion UNet's 8-bit file at -1.4 dB printed its SQNR on one line
#: among others and nothing else)
FAR_SQNR_DB = 10.0


#: eq. (27): a 16-bit activation file replaces the 8-bit one only when its output SQNR on
#: the held-out calibration feeds is at least this much higher (a measurement on a few
#: feeds, and 16-bit groups cost time: a near tie keeps the 8-bit file)
WIDE_MARGIN_DB = 3.0


#: eq. (27): an 8-bit file whose best eq. (24) candidate is under this output SQNR (dB) is
#: measured against a 16-bit-activation one: the summary's "far from FP32" bar. A higher
#: bar (15 dB) was measured: it keeps the Keras anomaly U-Net's A16W8 file once its
#: BatchNorm scales fold through the Relus (12.1 dB at 8 bits on the calibration feeds,
#: 11.5 dB on held-out images, ORT MinMax 9.1 dB, A16W8 29 dB), but it also turns the zoo's
#: SFace 16-bit (13.0 dB at 8 bits; 17.4 -> 22.6 dB on its evaluation set at 3.3x the CPU
#: time, where its 8-bit file runs at 0.44x ONNX Runtime's): a fidelity the user did not
#: ask for, paid in speed. An accuracy target (quanta.accuracy) reaches for 16 bits where
#: the user asks for it. benchmarks/results/2026-12-07-fid17.md
WIDE_TRY_SQNR_DB = FAR_SQNR_DB


def best_8bit_sqnr(*choices: RangeChoice | None) -> float | None:
    """Eq. (27)'s best8: the best output SQNR measured for any 8-bit configuration the file
    could take (eq. (24)'s range sets, eq. (29b)'s depthwise grids), None when none was
    measured. Eq. (29b) runs after eq. (24) on eq. (24)'s winner: when its per-tensor
    candidate beats the per-channel one the file keeps it, so a low eq. (24) score that
    comes from per-channel depthwise grids (fitted on half the feeds, then overflowed by the
    other half: EfficientNet-Lite0 on 16 crops, 6.2 dB against 20.2 dB per tensor) is not
    the 8-bit file's."""
    scores = [v for c in choices if c is not None for v in c.scores.values()]
    return max(scores) if scores else None


def wide_candidate(recipe: Any, choice: RangeChoice | None, *also: RangeChoice | None) -> bool:
    """Eq. (27): whether the 8-bit file just written is worth a 16-bit-activation try: the
    best 8-bit configuration measured (eq. (24)'s ``choice`` and the other measurements in
    ``also``, :func:`best_8bit_sqnr`) is under WIDE_TRY_SQNR_DB. Only for 8-bit activations
    and weights and no device profile (a device fixes its types)."""
    if choice is None or not choice.scores or getattr(recipe, "target", None) is not None:
        return False
    if recipe.activation_storage.bits != 8 or recipe.weight_storage.bits != 8:
        return False
    best = best_8bit_sqnr(choice, *also)
    return best is not None and best < WIDE_TRY_SQNR_DB


def wide_decision(best8: float, feeds: int, eight: float | None, sixteen: float | None) -> tuple[bool, str]:
    """Eq. (27): keep the 16-bit file (True) or the 8-bit one, and the note that says why.
    ``best8``: the candidates' score that started the try (:func:`best_8bit_sqnr`) on
    ``feeds`` held-out calibration feeds; ``eight`` / ``sixteen``: the two final files'
    output SQNR (mean_sqnr_db) on the same feeds (None: not measured; ``sixteen`` None
    also when the 16-bit file was not built because the 8-bit one reached the bar)."""
    head = f"eq. (27): the 8-bit candidates' output SQNR on {feeds} held-out calibration feed(s) is {best8:.1f} dB (< {WIDE_TRY_SQNR_DB:.0f} dB)"
    if eight is not None and eight >= WIDE_TRY_SQNR_DB:
        # the candidates round weights to nearest and take half the feeds' ranges; the file
        # has its final weights and ranges: when it is not far from FP32 there is nothing to fix
        return False, head + f"; the final 8-bit file measures {eight:.1f} dB on those feeds, so it is kept"
    if eight is None or sixteen is None:
        return False, head + "; the 16-bit-activation file could not be measured, so the 8-bit file is kept"
    measured = (
        f"; the final files on those feeds: 8-bit {eight:.1f} dB, 16-bit activations (A16W8) {sixteen:.1f} dB"
    )
    if sixteen >= eight + WIDE_MARGIN_DB:
        return True, head + measured + ", so this file has 16-bit activations"
    return False, head + measured + f", less than {WIDE_MARGIN_DB:.0f} dB better, so the 8-bit file is kept"


#: eq. (30): the loss (dB of the worst float output's SQNR on the held-out calibration
#: feeds) past which recurrent layers quantized per step stay float: they add at least 4x
#: the error of the rest of the file. The zoo's LSTM files under the bar that measure fine
#: lose 0.3-4.4 dB, beats_blstm 10.2 dB (benchmarks/results/2026-12-07e-zoo11d.md)
RECURRENT_LOSS_DB = 7.0
#: eq. (30): a file whose worst output is at least this close to FP32 (dB) with the recurrent
#: layers quantized keeps them quantized whatever the float file measures
RECURRENT_BAR_DB = 40.0


@dataclass
class RecurrentChoice:
    """Eq. (30)'s measurement: the worst float output's SQNR (dB) on ``feeds`` held-out
    calibration feeds with the LSTMs / GRUs quantized per step (``dynamic``) and float
    (``float_``), and whether the file keeps them float; ``reason``: why nothing was
    measured."""

    keep_float: bool
    dynamic: float | None = None
    float_: float | None = None
    feeds: int = 0
    reason: str = ""

    def note(self) -> str:
        head = "recurrent layers (eq. (30)): "
        if self.dynamic is None or self.float_ is None:
            return head + f"dynamic, not measured ({self.reason})"
        measured = (
            f"worst output SQNR on {self.feeds} held-out calibration feed(s) {self.dynamic:.1f} dB "
            f"with them dynamic, {self.float_:.1f} dB with them float"
        )
        if self.keep_float:
            return head + f"float: {measured}"
        return (
            head
            + f"dynamic: {measured} (float when it loses more than {RECURRENT_LOSS_DB:.0f} dB below {RECURRENT_BAR_DB:.0f} dB)"
        )

    def node_reason(self) -> str:
        """Why eq. (30) keeps an LSTM / GRU float (the summary's reason for each node)."""
        assert self.dynamic is not None and self.float_ is not None
        return (
            f"eq. (30): quantized per step, the recurrent layers take the worst output to "
            f"{self.dynamic:.1f} dB SQNR against {self.float_:.1f} dB float on {self.feeds} held-out "
            f"calibration feed(s) (a loss of more than {RECURRENT_LOSS_DB:.0f} dB, below {RECURRENT_BAR_DB:.0f} dB)"
        )


def recurrent_decision(dynamic: float, float_: float) -> bool:
    """Eq. (30): keep the recurrent layers float, given the worst float output's SQNR (dB)
    of the file with them dynamic and with them float."""
    return dynamic < RECURRENT_BAR_DB and float_ - dynamic > RECURRENT_LOSS_DB


def measure_recurrent(
    reference: str,
    dynamic: Any,
    float_: Any,
    feeds: Sequence[dict[str, np.ndarray]],
    save: Callable[[Any, str], None],
    outputs: Callable[[str, Sequence[dict[str, np.ndarray]]], list[list[np.ndarray]]],
) -> RecurrentChoice:
    """Eq. (30) on ``feeds``: the float model in the file ``reference``, the quantized
    candidates ``dynamic`` and ``float_`` (models, written by ``save(model, path)`` and run
    by ``outputs(path, feeds)``). A candidate that fails to run keeps the layers dynamic:
    a measurement never makes quantization fail."""
    if len(feeds) < MIN_FEEDS:
        return RecurrentChoice(
            False,
            feeds=len(feeds),
            reason=f"{len(feeds)} held-out calibration feed(s), fewer than {MIN_FEEDS}",
        )
    ref = outputs(reference, feeds)
    worst: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="quanta-recurrent-") as tmp:
        for name, model in (("dynamic", dynamic), ("float", float_)):
            path = os.path.join(tmp, f"{name}.onnx")
            try:
                save(model, path)
                scores = output_sqnrs_db(ref, outputs(path, feeds))
            except Exception as e:
                return RecurrentChoice(
                    False, feeds=len(feeds), reason=f"{name} did not run: {type(e).__name__}: {e}"[:200]
                )
            if not scores:
                return RecurrentChoice(
                    False, feeds=len(feeds), reason="the model has no float output to measure"
                )
            worst[name] = min(scores)
    d, f = worst["dynamic"], worst["float"]
    return RecurrentChoice(recurrent_decision(d, f), d, f, len(feeds))


@dataclass
class RangeChoice:
    """What eq. (24) chose and measured (dB per candidate), or why it did not measure."""

    choice: str
    scores: dict[str, float]
    feeds: int
    reason: str = ""

    def format(self) -> str:
        if not self.scores:
            return f"ranges outside eq. (22): {self.choice} ({self.reason})"
        measured = ", ".join(f"{k} {v:.1f} dB" for k, v in self.scores.items())
        line = f"ranges outside eq. (22): {self.choice} (output SQNR on {self.feeds} calibration feed(s): {measured})"
        best = self.scores.get(self.choice, max(self.scores.values()))
        if best < FAR_SQNR_DB:
            line += (
                f"\nwarning: the quantized outputs are far from FP32 on the calibration data ({best:.1f} dB "
                "output SQNR): `quanta debug FP32 QUANTIZED --data D` shows which layers lose it, and an "
                "accuracy target (`--target-sqnr`, quanta.AccuracyTarget) widens or keeps float what it must"
            )
        return line


class SplitObserver:
    """One tensor's observer (``full``) and a second one (``half``) that sees only the
    observations of every other feed: eq. (24)'s candidates take their ranges from the
    even feeds and are measured on the odd ones. Calibration talks to ``full`` through
    this wrapper and calls :meth:`next_feed` after each feed (a value inside a Loop body
    is observed many times in one feed; the sharded engine calibrates the even feeds)."""

    def __init__(self, full: Any, half: Any) -> None:
        self.full, self.half, self.feed = full, half, 0

    def observe(self, x: np.ndarray) -> None:
        self.full.observe(x)
        if self.feed % 2 == 0:
            self.half.observe(x)

    def next_feed(self) -> None:
        self.feed += 1

    def __getattr__(self, name: str) -> Any:
        return getattr(self.full, name)


def split_observers(make: Callable[[str], Any]) -> Callable[[str], SplitObserver]:
    """An observer factory whose observers also keep the even observations apart."""
    return lambda name: SplitObserver(make(name), make(name))


def unsplit(observers: Any) -> dict[str, Any]:
    """Replace each SplitObserver of the calibration result by its ``full`` observer, in
    place; returns the ``half`` observers by name (empty when there were none)."""
    halves = {}
    for name in list(observers):
        obs = observers[name]
        if isinstance(obs, SplitObserver):
            observers[name], halves[name] = obs.full, obs.half
    return halves


def half_ranges(
    halves: Mapping[str, Any], ranges: Mapping[str, Any], minmax: Mapping[str, Any]
) -> tuple[dict, dict]:
    """The ranges of the even feeds for every calibrated tensor (``ranges``) and the MinMax
    of those in ``minmax``; a tensor the even feeds leave degenerate (or never reach)
    keeps its range from all feeds."""
    even, even_minmax = {}, {}
    for name, full in ranges.items():
        h = halves.get(name)
        ok = h is not None and h.degenerate() is None
        even[name] = h.range() if ok else full
        if name in minmax:
            even_minmax[name] = h.extrema() if ok else minmax[name]
    return even, even_minmax


def reiterable(data: Any) -> bool:
    """Calibration data that :func:`quanta.calibrate.readers.iter_feeds` can read again
    from its start (a one-shot iterator cannot: its feeds are kept while calibrating)."""
    if isinstance(data, (list, tuple, str, os.PathLike, Mapping)):
        return True
    return hasattr(data, "get_next") and hasattr(data, "rewind")


def output_sqnrs_db(ref: Sequence[Sequence[np.ndarray]], got: Sequence[Sequence[np.ndarray]]) -> list[float]:
    """Per float output, SQNR over all feeds (dB, capped at ±CAP_DB): eq. (24)'s terms.

    >>> r = [[np.array([1.0, 2.0]), np.array([10.0, 0.0])]]
    >>> [round(v, 2) for v in output_sqnrs_db(r, [[np.array([1.0, 2.1]), np.array([10.0, 0.0])]])]
    [26.99, 100.0]
    """
    n_out = min((len(r) for r in ref), default=0)
    scores = []
    for o in range(n_out):
        sig = noise = 0.0
        is_float = False
        for r_outs, g_outs in zip(ref, got):
            r = np.asarray(r_outs[o])
            if r.dtype.kind != "f" or r.size == 0:
                continue
            is_float = True
            r64, g64 = r.astype(np.float64), np.asarray(g_outs[o], np.float64).reshape(r.shape)
            finite = np.isfinite(r64)
            sig += float(np.sum(r64[finite] ** 2))
            diff = r64[finite] - g64[finite]
            noise += float(np.sum(np.where(np.isfinite(diff), diff, np.inf) ** 2))
        if not is_float:
            continue
        if noise == 0.0:
            scores.append(CAP_DB)
        elif sig == 0.0 or not math.isfinite(noise):
            scores.append(-CAP_DB)
        else:
            scores.append(min(10.0 * math.log10(sig / noise), CAP_DB))
    return scores


def mean_sqnr_db(ref: Sequence[Sequence[np.ndarray]], got: Sequence[Sequence[np.ndarray]]) -> float | None:
    """Eq. (24)'s score: per float output, SQNR over all feeds (capped at CAP_DB), then the
    mean over outputs; None when no output is float.

    >>> r = [[np.array([1.0, 2.0]), np.array([10.0, 0.0])]]
    >>> round(mean_sqnr_db(r, [[np.array([1.0, 2.1]), np.array([10.0, 0.0])]]), 2)  # (26.99 + 100) / 2
    63.49
    """
    scores = output_sqnrs_db(ref, got)
    return float(np.mean(scores)) if scores else None


def too_few_feeds(first: str, n: int) -> RangeChoice:
    """The choice without a measurement when ``n`` < MIN_FEEDS held-out feeds remain."""
    return RangeChoice(
        first,
        {},
        n,
        f"{n} held-out calibration feed(s), fewer than {MIN_FEEDS}: too few to measure, "
        "so the ranges that clip nothing (give more calibration data to measure)",
    )


def choose(
    reference: str,
    candidates: Mapping[str, Any],
    feeds: Sequence[dict[str, np.ndarray]],
    save: Callable[[Any, str], None],
    outputs: Callable[[str, Sequence[dict[str, np.ndarray]]], list[list[np.ndarray]]],
) -> RangeChoice:
    """Eq. (24) over ``candidates`` (name -> quantized model; the first wins ties) against
    the float model in the file ``reference``.

    ``save(model, path)`` writes a model, ``outputs(path, feeds)`` runs a file (quanta's
    session). A candidate that fails to run keeps the first candidate, so a measurement
    never makes quantization fail."""
    names = list(candidates)
    if not feeds:
        return RangeChoice(names[0], {}, 0, "no calibration feed could be read again to measure")
    if len(feeds) < MIN_FEEDS:
        return too_few_feeds(names[0], len(feeds))
    ref = outputs(reference, feeds)
    scores: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="quanta-ranges-") as tmp:
        for name in names:
            path = os.path.join(tmp, f"{name}.onnx")
            try:
                save(candidates[name], path)
                s = mean_sqnr_db(ref, outputs(path, feeds))
            except Exception as e:
                return RangeChoice(
                    names[0], {}, len(feeds), f"{name} did not run: {type(e).__name__}: {e}"[:200]
                )
            if s is None:
                return RangeChoice(names[0], {}, len(feeds), "the model has no float output to measure")
            scores[name] = s
    best = names[0]
    for name in names[1:]:
        if scores[name] > scores[best]:
            best = name
    return RangeChoice(best, scores, len(feeds))
