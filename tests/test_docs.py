"""docs/design.md and docs/extending.md stay true of the code they describe.

Failure signature this guards against: an architecture page that describes the plan
instead of the code (a layer rule the import check does not enforce, a test that was
renamed, a file that moved), or a README that points outside the repository. The checks:

- the "may import" column of design.md's layer table is ``tests/test_layers.py``'s
  ``ALLOWED``, the rule the import check enforces;
- every test function the two pages name exists under tests/;
- every repository path they name in backquotes exists (a ``*`` must match a file;
  paths with a ``<placeholder>`` are templates and are skipped); a source file named
  without its folder (``conv/conv.cc``, ``compile.py``) must exist somewhere under
  quanta/;
- every relative Markdown link of README.md and docs/*.md resolves inside the
  repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.test_layers import ALLOWED

REPO = Path(__file__).resolve().parent.parent
PAGES = ("docs/design.md", "docs/extending.md")
TOP_FOLDERS = ("quanta/", "tests/", "docs/", "benchmarks/", ".ci/")


def _text(rel: str) -> str:
    return (REPO / rel).read_text()


def _layer_table() -> dict[str, set[str]]:
    """design.md's "Layers and imports" table: layer -> the layers it may import."""
    section = _text("docs/design.md").split("## Layers and imports", 1)[1].split("\n## ", 1)[0]
    table: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        layer = cells[0].split("`")[1]
        may = cells[2]
        if may == "every layer":
            table[layer] = set(ALLOWED) - {layer}
        elif may == "nothing from quanta":
            table[layer] = set()
        else:
            table[layer] = {name.strip() for name in may.split(",")}
    return table


def test_design_layer_table_is_the_enforced_import_rule():
    assert _layer_table() == ALLOWED


def _defined_tests() -> set[str]:
    names: set[str] = set()
    for path in (REPO / "tests").rglob("*.py"):
        names.update(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(), re.M))
    return names


# a test function's name: not part of a path, a file name or a template
_TEST_NAME = re.compile(r"(?<![\w/*<])(test_[a-z0-9_]*[a-z0-9])(?![\w.*<>])")


@pytest.mark.parametrize("page", PAGES)
def test_every_test_a_page_names_exists(page):
    named = set(_TEST_NAME.findall(_text(page)))
    assert named, f"{page} names no test"
    missing = sorted(named - _defined_tests())
    assert not missing, f"{page} names tests that do not exist: {missing}"


def _named_paths(text: str) -> tuple[set[str], set[str]]:
    """(paths from the repository root, source files named without their folder)."""
    rooted, short = set(), set()
    for quoted in re.findall(r"`([^`\n]+)`", text):
        for word in quoted.split():
            word = word.split("::")[0].rstrip(",;)")
            if word.startswith(TOP_FOLDERS) or word in ("README.md", "CMakeLists.txt"):
                rooted.add(word)
            elif re.fullmatch(r"[a-z][\w/]*\.(py|h|cc)", word):
                short.add(word)
    return rooted, short


@pytest.mark.parametrize("page", PAGES)
def test_every_path_a_page_names_exists(page):
    rooted, short = _named_paths(_text(page))
    assert rooted and short, f"{page} names no paths"
    missing = []
    for rel in sorted(rooted):
        if "<" in rel:
            continue  # a template: `tests/kernels/test_<family>_native.py`
        found = list(REPO.glob(rel)) if "*" in rel else [REPO / rel] if (REPO / rel).exists() else []
        if not found:
            missing.append(rel)
    missing += [rel for rel in sorted(short) if not any((REPO / "quanta").glob(f"**/{rel}"))]
    assert not missing, f"{page} names paths that do not exist: {missing}"


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(str(p.relative_to(REPO)) for p in (REPO / "docs").glob("*.md"))]
)
def test_relative_links_stay_inside_the_repository(page):
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", _text(page)):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        resolved = ((REPO / page).parent / target.split("#")[0]).resolve()
        if not resolved.is_relative_to(REPO) or not resolved.exists():
            bad.append(target)
    assert not bad, f"{page} links outside the repository or to nothing: {bad}"


# The design and the house style live in docs/design.md and docs/style.md; a citation of
# the planning copies (DESIGN.md, STYLE.md) or of a path above the checkout names a file
# a reader of the repository does not have.
_OUTSIDE = re.compile(r"(?<![\w/])(?:DESIGN|STYLE)\.md|\.\./shared/")


def test_no_code_or_doc_cites_a_file_outside_the_repository():
    cited = []
    # .ci/run calls the shared dependency check by design: CI provides it next to the clone.
    for top in ("quanta", "tests", "docs", "benchmarks"):
        for path in sorted((REPO / top).rglob("*")):
            if path.suffix not in {".py", ".md", ".cc", ".h", ".sh", ".toml", ""} or not path.is_file():
                continue
            if "build" in path.relative_to(REPO).parts:
                continue
            for lineno, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
                if _OUTSIDE.search(line) and path.name != "test_docs.py":
                    cited.append(f"{path.relative_to(REPO)}:{lineno}")
    cited += [
        f"README.md:{n}" for n, line in enumerate(_text("README.md").splitlines(), 1) if _OUTSIDE.search(line)
    ]
    assert not cited, f"these lines cite a file outside the repository: {cited}"


def test_calibration_method_table_is_the_registry():
    """docs/calibration.md §2 lists exactly the rows of quantize/methods.py METHODS."""
    from quanta.quantize.methods import METHODS
    from quanta.quantize.recipe import Recipe

    text = _text("docs/calibration.md")
    section = text[text.index("| method | range | Recipe options |") :].split("\n\n")[0]
    rows = {}
    for line in section.splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        options = tuple(re.findall(r"`(\w+)`", cells[2]))
        rows[cells[0].strip("`")] = (cells[1], options)
    assert rows == {m.value: (spec.summary, spec.options) for m, spec in METHODS.items()}
    fields = set(Recipe.__dataclass_fields__)
    assert all(set(spec.options) <= fields for spec in METHODS.values())
    readme = re.search(r'method="\w+",\s*#\s*([\w| ]+)', _text("README.md"))
    assert readme and {s.strip() for s in readme.group(1).split("|")} == {m.value for m in METHODS}
