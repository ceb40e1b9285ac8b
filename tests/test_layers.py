"""The import direction of docs/design.md's layer table ("Layers and imports"), enforced on the source.

Failure signature this guards against: a kernel importing the IR, or the IR importing
passes ("TODO: symbolic shouldn't be importing from codegen"). An import may only point
down the list: api/cli > debug > quantize > scale > calibrate > runtime > passes > targets >
hal > kernels; ir is below everything except kernels, which imports nothing from quanta.
"""

from __future__ import annotations

import ast
from pathlib import Path

import quanta

ROOT = Path(quanta.__file__).parent

# layer -> layers it may import (besides itself)
ALLOWED: dict[str, set[str]] = {
    "api": {
        "cli",
        "debug",
        "quantize",
        "scale",
        "calibrate",
        "runtime",
        "passes",
        "targets",
        "hal",
        "kernels",
        "ir",
    },
    "cli": {
        "api",
        "debug",
        "quantize",
        "scale",
        "calibrate",
        "runtime",
        "passes",
        "targets",
        "hal",
        "kernels",
        "ir",
    },
    "debug": {"runtime", "quantize", "scale", "calibrate", "passes", "targets", "hal", "kernels", "ir"},
    "quantize": {"scale", "calibrate", "runtime", "passes", "targets", "hal", "kernels", "ir"},
    "scale": {"calibrate", "runtime", "passes", "targets", "hal", "kernels", "ir"},
    "calibrate": {"runtime", "passes", "targets", "hal", "kernels", "ir"},
    "runtime": {"targets", "hal", "passes", "kernels", "ir"},
    "passes": {"ir"},
    "targets": {"passes", "hal", "kernels", "ir"},
    "hal": set(),
    "kernels": set(),
    "ir": set(),
}


def layer_of(module: str) -> str:
    parts = module.split(".")
    if parts[0] != "quanta":
        return "external"
    if len(parts) == 1:
        return "api"
    return parts[1] if parts[1] in ALLOWED else "api"


def imports_of(path: Path, module: str) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                out.append((".".join([*base, node.module or ""]).rstrip("."), node.lineno))
            elif node.module:
                out.append((node.module, node.lineno))
    return out


def test_layers_import_only_downwards():
    violations = []
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parent).with_suffix("")
        module = ".".join(rel.parts).removesuffix(".__init__")
        src = layer_of(module)
        for target, line in imports_of(path, module):
            dst = layer_of(target)
            if dst in ("external", src):
                continue
            if dst not in ALLOWED[src]:
                violations.append(
                    f"{path.relative_to(ROOT.parent)}:{line}: layer '{src}' imports '{target}' ({dst})"
                )
    assert not violations, "imports pointing up the layer list:\n" + "\n".join(violations)


def test_layer_check_catches_an_upward_import(tmp_path):
    # The checker itself must see a violation when one exists.
    f = tmp_path / "bad.py"
    f.write_text("from quanta.ir.graph import Graph\n")
    (imp,) = imports_of(f, "quanta.kernels.bad")
    assert layer_of(imp[0]) == "ir" and "ir" not in ALLOWED["kernels"]
