"""The debugger's HTML report: one self-contained file, every section and chart present,
parsed as HTML (and loaded by headless Chromium when it is installed)."""

from __future__ import annotations

import shutil
import subprocess
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


def test_the_report_loads_in_headless_chromium(result, tmp_path):
    exe = shutil.which("chromium") or shutil.which("chromium-browser")
    if exe is None:
        pytest.skip("chromium is not installed")
    path = tmp_path / "r.html"
    write_html(result, path)
    shot = tmp_path / "shot.png"
    proc = subprocess.run(
        [
            exe,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            f"--screenshot={shot}",
            "--window-size=1200,2400",
            path.as_uri(),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.exists() and shot.stat().st_size > 10_000
    assert "Uncaught" not in proc.stderr and "CONSOLE" not in proc.stderr.upper().replace("CONSOLE_", "")
