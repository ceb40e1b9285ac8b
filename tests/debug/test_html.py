"""The debugger's HTML report: one self-contained file, every section and chart present,
parsed as HTML (and loaded by headless Chromium when it is installed)."""

from __future__ import annotations

from html.parser import HTMLParser

import pytest

from quanta.debug.compare import compare
from quanta.debug.html import render_html, write_html
from tests.debug.test_compare import _quantized, chain, chain_feeds


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[str] = []
        self.ids: set[str] = set()
        self.external: list[str] = []
        self.open: list[str] = []
        self.unbalanced: list[str] = []
        self.text: list[str] = []

    VOID = frozenset({"meta", "br", "img", "hr", "link", "input"})

    def handle_starttag(self, tag, attrs):
        self.tags.append(tag)
        a = dict(attrs)
        if "id" in a:
            self.ids.add(a["id"])
        for k in ("src", "href", "xlink:href"):
            v = a.get(k)
            if v and not v.startswith("#"):
                self.external.append(v)
        if tag not in self.VOID:
            self.open.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.tags.append(tag)

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if not self.open or self.open[-1] != tag:
            self.unbalanced.append(tag)
        else:
            self.open.pop()

    def handle_data(self, data):
        self.text.append(data)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("html")
    src, out = _quantized(tmp, chain())
    return compare(src, out, chain_feeds(2, 9))


def test_the_report_is_self_contained_and_has_every_section(result, tmp_path):
    path = tmp_path / "r.html"
    write_html(result, path, title="chain")
    page = _Page()
    page.feed(path.read_text())
    assert not page.external, f"the report fetches {page.external}"
    assert "script" not in page.tags
    assert not page.unbalanced and not page.open
    assert {"summary", "worst", "layers", "saturation", "recommendations", "float"} <= page.ids
    text = " ".join(page.text)
    for node in ("b", "c"):
        assert f"{node}" in text
    assert "suggested fix" in text and "integer MAC share" in text
    # the worst-layers table lists the worst layer first
    rows = path.read_text().split("<table class='worst'>", 1)[1].split("</table>", 1)[0]
    first = rows.split("<tr", 2)[2]
    assert result.worst(1)[0].name in first.split("</tr>", 1)[0]


def test_charts_are_drawn_by_matplotlib(result):
    pytest.importorskip("matplotlib")
    page = _Page()
    page.feed(render_html(result))
    assert {"chart-sqnr", "chart-contribution", "chart-hist-0"} <= page.ids
    assert page.tags.count("svg") >= 3
    assert "path" in page.tags  # the plotted lines and bars


def test_without_matplotlib_the_tables_remain(result, monkeypatch):
    import quanta.debug.html as h

    monkeypatch.setattr(h, "_matplotlib", lambda: None)
    text = render_html(result)
    assert "pip install quanta[report]" in text and "<svg" not in text
    assert "suggested fix" in text


# per chart: its box on the page, whether it holds a rendered SVG, and how many of its
# drawn elements (paths, lines, rectangles, text) have a non-empty box
_CHART_PROBE = """
Array.from(document.querySelectorAll('div.chart')).map(div => {
  const svg = div.querySelector('svg');
  const r = div.getBoundingClientRect();
  const drawn = svg ? Array.from(svg.querySelectorAll('path, line, rect, polyline, text')).filter(e => {
    const b = e.getBBox(); return b.width > 0 || b.height > 0; }).length : 0;
  return {id: div.id, svg: svg instanceof SVGSVGElement, drawn: drawn,
          x: r.left + window.scrollX, y: r.top + window.scrollY, w: r.width, h: r.height};
})
"""


def test_the_report_loads_in_headless_chromium(result, tmp_path):
    """The report in a real browser: no console error, no exception, nothing fetched from
    the network, every chart laid out with drawn elements and visible in the screenshot
    (its box holds pixels of more than the background's one colour)."""
    from PIL import Image

    from tests.debug.chromium import chromium_path, load_page

    if chromium_path() is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium); the browser check needs it"
        )
    path = tmp_path / "r.html"
    write_html(result, path, title="chain")
    page = load_page(path, _CHART_PROBE)
    assert not page.errors, page.errors
    assert not page.requests, f"the report fetches {page.requests}"
    charts = page.value
    ids = {c["id"] for c in charts}
    assert {"chart-sqnr", "chart-contribution", "chart-hist-0"} <= ids
    assert len(charts) == render_html(result).count("<div class='chart'")
    shot = tmp_path / "shot.png"
    shot.write_bytes(page.screenshot)
    img = Image.open(shot).convert("RGB")
    assert img.width >= 1000 and img.height >= max(c["y"] + c["h"] for c in charts) - 1
    for c in charts:
        assert c["svg"] and c["drawn"] >= 5, c
        assert c["w"] > 200 and c["h"] > 100, c
        box = img.crop((int(c["x"]), int(c["y"]), int(c["x"] + c["w"]), int(c["y"] + c["h"])))
        colours = box.getcolors(maxcolors=1 << 16)
        assert colours is None or len(colours) > 8, f"{c['id']}: the chart's box is blank in the screenshot"
        dark = sum(n for n, rgb in (colours or []) if sum(rgb) < 600)
        assert colours is None or dark > 100, f"{c['id']}: nothing drawn in the chart's box"


def test_the_browser_check_catches_a_broken_page(tmp_path):
    """The browser check is not vacuous: a page that throws, logs an error and fetches
    from the network is reported."""
    from tests.debug.chromium import chromium_path, load_page

    if chromium_path() is None:
        pytest.skip(
            "chromium is not installed (Debian: apt-get install chromium); the browser check needs it"
        )
    path = tmp_path / "bad.html"
    path.write_text(
        "<!DOCTYPE html><html><body><div class='chart' id='c'></div>"
        "<img src='http://127.0.0.1:9/x.png'>"
        "<script>console.error('broken chart'); null.x;</script></body></html>"
    )
    page = load_page(path, _CHART_PROBE)
    text = " ".join(page.errors)
    assert "broken chart" in text and "TypeError" in text
    assert page.requests == ["http://127.0.0.1:9/x.png"]
    assert [(c["id"], c["svg"], c["drawn"]) for c in page.value] == [("c", False, 0)]
