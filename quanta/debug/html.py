"""The debugger's HTML report: one self-contained file (inline CSS and SVG charts, no
script, nothing fetched), readable offline.

Sections: summary metrics; the layers that break the model, ranked by eq. (5e) of
docs/debugger.md, each with its suggested fix; per-layer local and inherited SQNR in
graph order (chart); histograms of the worst tensors with the range the model uses and
the ranges other calibration methods would choose; the saturation table; the
per-tensor calibration recommendations; what stayed float and the integer MAC share.

Charts are drawn by matplotlib (the ``report`` extra: ``pip install quanta[report]``)
as inline SVG; without it the report has every table and says the charts are missing.
"""

from __future__ import annotations

import html
import io
import math
import os
from collections.abc import Sequence

from quanta.debug.compare import DebugResult, NodeRow, TensorRow

__all__ = ["render_html", "write_html"]

_CSS = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:1em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:left}
th{background:#f0f0f0} td.num{text-align:right;font-variant-numeric:tabular-nums}
.bad{background:#fde0dc} .chart{margin:1em 0} h2{border-bottom:1px solid #ddd;padding-bottom:4px}
code{background:#f6f6f6;padding:0 3px}
"""


def _fmt(x: float | None, spec: str = ".1f") -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "∞" if x > 0 else "-∞"
    return format(x, spec)


def _esc(s: object) -> str:
    return html.escape(str(s))


def _svg(fig) -> str:
    """A matplotlib figure as inline SVG (text kept as text: small and searchable)."""
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog and DOCTYPE: inline SVG


def _matplotlib():
    try:
        import matplotlib

        matplotlib.use("Agg", force=False)
        import matplotlib.pyplot as plt

        plt.rcParams["svg.fonttype"] = "none"
        return plt
    except ImportError:
        return None


def _sqnr_chart(plt, rows: Sequence[NodeRow]) -> str:
    xs = list(range(len(rows)))
    cap = 80.0

    def clip(v: float) -> float:
        return cap if not math.isfinite(v) or v > cap else v

    fig, ax = plt.subplots(figsize=(12, 3.6))
    ax.plot(xs, [clip(r.local_db) for r in rows], "o-", ms=3, lw=1, label="local SQNR (eq. 4)")
    ax.plot(xs, [clip(r.inherited_db) for r in rows], "s-", ms=3, lw=1, label="inherited SQNR (eq. 1)")
    ax.set_xlabel("quantized node, graph order")
    ax.set_ylabel("dB")
    ax.grid(alpha=0.3)
    ax.legend(loc="lower left")
    if len(rows) <= 40:
        ax.set_xticks(xs)
        ax.set_xticklabels([r.name for r in rows], rotation=90, fontsize=7)
    ax.set_title("per-layer SQNR against FP32")
    return _svg(fig)


def _contribution_chart(plt, rows: Sequence[NodeRow]) -> str:
    fig, ax = plt.subplots(figsize=(8, 0.35 * len(rows) + 1))
    names = [r.name for r in rows][::-1]
    ax.barh(names, [r.contribution * 100 for r in rows][::-1], color="#c0392b")
    ax.set_xlabel("estimated share of the output error, % (eq. 5)")
    ax.tick_params(axis="y", labelsize=8)
    ax.grid(axis="x", alpha=0.3)
    return _svg(fig)


def _histogram_chart(plt, t: TensorRow) -> str:
    assert t.histogram is not None
    edges, counts = t.histogram
    fig, ax = plt.subplots(figsize=(6, 2.6))
    # a log axis from a baseline of 0.5 counts: filled down to 0, the autoscale spans
    # hundreds of decades and matplotlib spends seconds on their ticks
    ax.stairs(counts, edges, fill=True, alpha=0.5, color="#2c7fb8", baseline=0.5)
    ax.set_yscale("log")
    ax.set_ylim(0.5, max(2.0, 2.0 * max(counts, default=1.0)))
    lo, hi = t.chosen
    ax.axvline(lo, color="k", lw=1.5, label=f"range used [{lo:.3g}, {hi:.3g}]")
    ax.axvline(hi, color="k", lw=1.5)
    colors = {"minmax": "#999999", "percentile": "#e6550d", "entropy": "#31a354", "mse": "#756bb1"}
    for m in t.methods:
        if m.method == "minmax":
            continue
        c = colors.get(m.method, "#444444")
        ax.axvline(m.hi, color=c, ls="--", lw=1, label=f"{m.method} ({_fmt(m.sqnr_db)} dB)")
        ax.axvline(m.lo, color=c, ls="--", lw=1)
    ax.set_title(f"{t.name}: {_fmt(t.chosen_sqnr_db)} dB, clipped {t.clipped * 100:.2f} %", fontsize=9)
    ax.legend(fontsize=7, loc="upper right")
    return _svg(fig)


def render_html(result: DebugResult, *, title: str = "model", worst: int = 10, histograms: int = 6) -> str:
    """The report as one HTML string."""
    plt = _matplotlib()
    out: list[str] = [
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>quanta debug: {_esc(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>quanta debug: {_esc(title)}</h1>",
    ]
    # summary
    out.append("<h2 id='summary'>Summary</h2><table>")
    summary = [
        ("feeds compared", str(result.samples)),
        ("output SQNR (dB)", _fmt(result.output_sqnr_db)),
        ("output cosine (worst output)", _fmt(result.output_cosine, ".5f")),
        ("top-1 agreement", _fmt(result.top1_agreement, ".3f")),
        ("quantized nodes", str(len(result.nodes))),
        ("integer MAC share", "-" if result.integer_share is None else f"{result.integer_share * 100:.1f} %"),
    ]
    for k, v in summary:
        out.append(f"<tr><th>{_esc(k)}</th><td class='num'>{_esc(v)}</td></tr>")
    out.append("</table>")
    if result.reference:
        out.append(f"<p><strong>FP32 reference:</strong> {_esc(result.reference)}</p>")
    if plt is None:
        out.append("<p><em>charts need matplotlib: <code>pip install quanta[report]</code></em></p>")

    # worst layers
    ranked = result.worst(worst)
    out.append("<h2 id='worst'>The layers that break the model</h2>")
    out.append(
        "<p>Ranked by their estimated share of the output error (docs/debugger.md eq. (5e)); "
        "<em>local</em>: the error the node adds with exact inputs; <em>inherited</em>: its output "
        "in the quantized model against FP32.</p>"
    )
    abl = any(r.ablation_sqnr_db is not None for r in ranked)
    out.append(
        "<table class='worst'><tr><th>#</th><th>node</th><th>op</th><th>local dB</th><th>inherited dB</th>"
        "<th>max err (LSB)</th><th>share</th>"
        + ("<th>output dB with it float</th>" if abl else "")
        + "<th>suggested fix</th></tr>"
    )
    for i, r in enumerate(ranked, 1):
        cls = " class='bad'" if r.local_db < 20 else ""
        out.append(
            f"<tr{cls}><td>{i}</td><td>{_esc(r.name)}</td><td>{_esc(r.op)}</td>"
            f"<td class='num'>{_fmt(r.local_db)}</td><td class='num'>{_fmt(r.inherited_db)}</td>"
            f"<td class='num'>{_fmt(r.max_lsb)}</td><td class='num'>{r.contribution * 100:.1f} %</td>"
            + (f"<td class='num'>{_fmt(r.ablation_sqnr_db)}</td>" if abl else "")
            + f"<td>{_esc(r.recommendation or '-')}</td></tr>"
        )
    out.append("</table>")
    if plt is not None and ranked:
        out.append(f"<div class='chart' id='chart-contribution'>{_contribution_chart(plt, ranked)}</div>")

    # per-layer SQNR in graph order
    out.append("<h2 id='layers'>Per-layer SQNR in graph order</h2>")
    if plt is not None and result.nodes:
        out.append(f"<div class='chart' id='chart-sqnr'>{_sqnr_chart(plt, result.nodes)}</div>")
    out.append(
        "<details><summary>every quantized node</summary><table><tr><th>node</th><th>op</th>"
        "<th>output</th><th>local dB</th><th>inherited dB</th><th>cosine</th></tr>"
    )
    for r in result.nodes:
        cos = None if r.inherited is None else r.inherited.cosine
        out.append(
            f"<tr><td>{_esc(r.name)}</td><td>{_esc(r.op)}</td><td>{_esc(r.output)}</td>"
            f"<td class='num'>{_fmt(r.local_db)}</td><td class='num'>{_fmt(r.inherited_db)}</td>"
            f"<td class='num'>{_fmt(cos, '.5f')}</td></tr>"
        )
    out.append("</table></details>")

    # histograms of the worst tensors
    worst_tensors: list[TensorRow] = []
    seen: set[str] = set()
    by_name = {t.name: t for t in result.tensors}
    for r in ranked:
        for name in [r.output, *r.inputs]:
            t = by_name.get(name)
            if t is not None and t.histogram is not None and name not in seen:
                seen.add(name)
                worst_tensors.append(t)
    worst_tensors = worst_tensors[:histograms]
    if plt is not None and worst_tensors:
        out.append("<h2 id='histograms'>Distributions of the worst tensors</h2>")
        out.append(
            "<p>FP32 values on the data (log scale); solid: the range the model uses; dashed: what "
            "other calibration methods choose, with the SQNR they give on this data (eq. (8)).</p>"
        )
        for k, t in enumerate(worst_tensors):
            out.append(f"<div class='chart' id='chart-hist-{k}'>{_histogram_chart(plt, t)}</div>")

    # saturation
    out.append(
        "<h2 id='saturation'>Saturation</h2><table><tr><th>tensor</th><th>range used</th>"
        "<th>observed</th><th>clipped</th><th>levels used</th><th>outlier ratio</th></tr>"
    )
    for t in sorted(result.tensors, key=lambda t: (-t.clipped, t.levels_used))[:40]:
        lo, hi = t.chosen
        out.append(
            f"<tr><td>{_esc(t.name)}</td><td>[{lo:.4g}, {hi:.4g}]</td><td>[{t.observed[0]:.4g}, {t.observed[1]:.4g}]</td>"
            f"<td class='num'>{t.clipped * 100:.3f} %</td><td class='num'>{t.levels_used} / {t.qmax - t.qmin + 1}</td>"
            f"<td class='num'>{t.outlier_ratio:.1f}</td></tr>"
        )
    out.append("</table>")
    spread = [w for w in result.weights if w.channels > 1 and w.scale_spread > 4]
    if spread:
        out.append(
            "<p>Weights whose per-channel scales spread more than 4x (eq. (10)):</p><table>"
            "<tr><th>weight</th><th>node</th><th>channels</th><th>max / median scale</th>"
            "<th>outlier channels</th></tr>"
        )
        for w in sorted(spread, key=lambda w: -w.scale_spread)[:20]:
            out.append(
                f"<tr><td>{_esc(w.name)}</td><td>{_esc(w.consumer)}</td><td class='num'>{w.channels}</td>"
                f"<td class='num'>{w.scale_spread:.1f}</td><td>{_esc(w.outlier_channels[:10])}</td></tr>"
            )
        out.append("</table>")

    # recommendations
    recs = [t for t in result.tensors if t.recommendation]
    out.append("<h2 id='recommendations'>Calibration recommendations</h2>")
    if recs:
        out.append(
            "<table><tr><th>tensor</th><th>now (dB)</th><th>recommendation (SQNR measured on this data)</th></tr>"
        )
        for t in sorted(recs, key=lambda t: t.chosen_sqnr_db):
            out.append(
                f"<tr><td>{_esc(t.name)}</td><td class='num'>{_fmt(t.chosen_sqnr_db)}</td>"
                f"<td>{_esc(t.recommendation)}</td></tr>"
            )
        out.append("</table>")
    else:
        out.append("<p>Every tensor's range is within 1 dB of the best method on this data.</p>")

    # float
    out.append("<h2 id='float'>What stayed float</h2>")
    if result.integer_share is not None:
        out.append(f"<p>{result.integer_share * 100:.1f} % of the MACs run in integer.</p>")
    if result.float_nodes:
        out.append("<table><tr><th>node</th><th>op</th></tr>")
        for name, op in result.float_nodes[:50]:
            out.append(f"<tr><td>{_esc(name)}</td><td>{_esc(op)}</td></tr>")
        out.append("</table>")
    else:
        out.append("<p>No compute node (Conv, MatMul, Gemm...) stayed float.</p>")
    if result.unmatched:
        out.append(
            "<p>Quantized tensors with no FP32 tensor of the same name (not compared): "
            + _esc(", ".join(result.unmatched[:30]))
            + "</p>"
        )
    out.append("</body></html>")
    return "\n".join(out)


def write_html(result: DebugResult, path: str | os.PathLike, **kw) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(render_html(result, **kw))
