"""The debugger's ranking against ablation on the real models: the five worst layers by
eq. (5e) against the five worst by eq. (6b) (docs/debugger.md).

Minutes of CPU (a quantization and a pass over the data per ablated node), so it runs
only when asked: ``QUANTA_RANK_TEST=1`` and the models benchmarks/real_models/export.py
writes into ``QUANTA_BENCH_CACHE`` (default ~/.cache/quanta-bench)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

import quanta
from quanta.debug.compare import ablate, compare, ranking_overlap

REAL_MODELS = Path(__file__).resolve().parents[2] / "benchmarks" / "real_models"
CACHE = Path(os.environ.get("QUANTA_BENCH_CACHE", "~/.cache/quanta-bench")).expanduser()

pytestmark = pytest.mark.skipif(
    os.environ.get("QUANTA_RANK_TEST") != "1",
    reason="minutes of ablation on the real models: set QUANTA_RANK_TEST=1 to run",
)

#: candidates ablated per ranking: the union of the top CANDIDATES by eq. (5e) and by the
#: local NSR (eq. (5)), so the ablation's top five are not drawn from (5e)'s list alone
CANDIDATES = 10


@pytest.mark.parametrize(("model", "feeds"), [("efficientnet_lite0", 4), ("all_minilm_l6_v2", 8)])
def test_the_estimate_ranks_the_worst_layers_as_ablation_does(tmp_path, model, feeds):
    fp32 = CACHE / f"{model}.prep.onnx"
    if not fp32.exists():
        pytest.skip(f"{fp32} is absent (python benchmarks/real_models/export.py writes it)")
    sys.path.insert(0, str(REAL_MODELS))
    try:
        import levers
    finally:
        sys.path.remove(str(REAL_MODELS))
    calib, evals = levers.data(model)
    q = tmp_path / "q.onnx"
    quanta.quantize_static(str(fp32), str(q), calib, verbose=False, progress=False)
    data = evals[:feeds]
    res = compare(str(fp32), str(q), data, histograms=False)
    rows = [r for r in res.nodes if r.local is not None]
    by_nsr = sorted(rows, key=lambda r: -r.local.nsr)[:CANDIDATES]
    names = list(dict.fromkeys([r.name for r in res.worst(CANDIDATES)] + [r.name for r in by_nsr]))
    ablate(res, str(fp32), str(q), data, names)
    assert ranking_overlap(res, 5) >= 4, res.format()
