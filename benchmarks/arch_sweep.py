"""Architecture sweep: PyTorch models exported to ONNX as users export them, quantized by
quanta and by ONNX Runtime's tool side by side, run by both runtimes.

The public zoo (``benchmarks/zoo``) holds real weights; this sweep holds real
*architectures* the zoo lacks (ResNet, MobileNet v2/v3, EfficientNet, ShuffleNet, RegNet,
ConvNeXt, Swin, ViT, LR-ASPP and DeepLabV3 segmenters, BERT, DistilBERT, GPT-2, T5,
wav2vec 2.0, Whisper's encoder), each exported twice: by the TorchScript exporter
(``dynamo=False``, opset 17) and by the dynamo exporter (``dynamo=True``, the default of
current PyTorch, with onnxscript's optimizer). No weights are downloaded: the models are
built from their configurations with seeded random initialisation, so the fidelity
columns compare the two quantizers on the same graphs and data but say nothing about a
trained model's accuracy; what the sweep finds is files that fail to quantize, load or
run, compute left float, and exporter forms that lower badly.

Per model and exporter (one JSON line each, ``--json`` collects them):

- ``quanta_q`` / ``ort_q``: quantization error, if any (quanta's defaults; ORT's
  ``quantize_static`` defaults, MinMax, QDQ);
- ``*_sqnr``: median SQNR of the first output against FP32 (ONNX Runtime running the
  FP32 file) over 4 evaluation samples, with quanta running the file (``*_sqnr``) and ONNX
  Runtime running it (``*_sqnr_ortrun``); the file must pass ``onnx.checker`` (full check);
- ``*_int``: the share of MACs that runs in integer when quanta compiles the file;
- ``--latency``: quanta / ORT median latency ratio on the same file, 1 thread, interleaved
  (``fp32_lat``, ``quanta_lat``, ``ort_lat``) and the ops that ran on reference kernels.

Setup (PyTorch's CPU wheel; torchvision's compiled ops need not load, see ``_torchvision``)::

    pip install -e ".[bench,sweep]"
    python benchmarks/arch_sweep.py                          # every model, both exporters
    python benchmarks/arch_sweep.py --models bert,gpt2 --exporter dynamo --latency

Results: ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "zoo"))

import zoo as Z  # noqa: E402  (benchmarks/ is not a package)
import zoodata  # noqa: E402

Feed = dict[str, np.ndarray]
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def _torchvision():
    """torchvision's model definitions are plain Python, but its import registers fake
    kernels for its compiled ops (``torchvision::nms``), which fails when its wheel's C++
    library does not match the installed CPU build of torch. The sweep needs no compiled
    op, so the registration is skipped during the import."""
    import torch.library

    real = torch.library.register_fake
    torch.library.register_fake = lambda *a, **k: lambda f: f
    try:
        import torchvision
    finally:
        torch.library.register_fake = real
    return torchvision


# --- data -----------------------------------------------------------------------------


def photo_feeds(seed: int, n: int, hw: tuple[int, int]) -> list[Feed]:
    """Random crops of scikit-image's sample photos, ImageNet normalisation."""
    rng = np.random.default_rng(seed)
    plist = zoodata.photos()
    out = []
    for _ in range(n):
        img = zoodata.random_crop(rng, plist[rng.integers(len(plist))], hw)
        out.append({"x": zoodata.nchw(img, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))})
    return out


def token_feeds(seed: int, n: int, seq: int = 24, vocab: int = 1000) -> list[Feed]:
    """Random token ids with a padding mask of random length (the masked attention path)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        length = int(rng.integers(seq // 2, seq + 1))
        mask = np.zeros((1, seq), np.int64)
        mask[:, :length] = 1
        out.append({"ids": rng.integers(1, vocab, (1, seq)).astype(np.int64), "mask": mask})
    return out


def audio_feeds(seed: int, n: int, samples: int = 16000) -> list[Feed]:
    """One second of the zoo's synthetic speech-like audio at 16 kHz."""
    rng = np.random.default_rng(seed)
    return [
        {"x": zoodata.speech_like(rng, samples / 16000 + 0.1)[0][None, :samples].astype(np.float32)}
        for _ in range(n)
    ]


def mel_feeds(seed: int, n: int) -> list[Feed]:
    """Log-mel-like features [1, 80, 3000] (Whisper's encoder input)."""
    rng = np.random.default_rng(seed)
    return [{"x": (rng.standard_normal((1, 80, 3000)) * 0.5).astype(np.float32)} for _ in range(n)]


# --- models ---------------------------------------------------------------------------


def tv(name: str, **kw: Any) -> Callable[[], Any]:
    def make():
        mod = _torchvision().models
        *pkg, fn = name.split(".")
        for p in pkg:
            mod = getattr(mod, p)
        return getattr(mod, fn)(**kw).eval()

    return make


def vit_small():
    from torchvision.models.vision_transformer import VisionTransformer

    _torchvision()
    return VisionTransformer(
        image_size=96, patch_size=16, num_layers=3, num_heads=4, hidden_dim=192, mlp_dim=384, num_classes=100
    ).eval()


def hf(cls_name: str, cfg_name: str, **cfg: Any) -> Callable[[], Any]:
    def make():
        # This script's folder is on sys.path and holds benchmarks/kernels.py, which
        # transformers would take for Hugging Face's optional `kernels` package (found by
        # find_spec, then imported by name): a None entry makes it absent.
        sys.modules.setdefault("kernels", None)  # type: ignore[arg-type]
        import transformers

        return getattr(transformers, cls_name)(getattr(transformers, cfg_name)(**cfg)).eval()

    return make


def images(hw: tuple[int, int]) -> Callable[[int, int], list[Feed]]:
    return lambda seed, n: photo_feeds(seed, n, hw)


TOKENS, AUDIO, MEL = token_feeds, audio_feeds, mel_feeds
TINY_BERT = dict(vocab_size=1000, num_attention_heads=4)
MODELS: dict[str, tuple[Callable[[], Any], Callable[[int, int], list[Feed]], str]] = {
    "resnet18": (tv("resnet18"), images((160, 160)), "image"),
    "mobilenet_v2": (tv("mobilenet_v2"), images((224, 224)), "image"),
    "mobilenet_v3_large": (tv("mobilenet_v3_large"), images((224, 224)), "image"),
    "efficientnet_b0": (tv("efficientnet_b0"), images((224, 224)), "image"),
    "shufflenet_v2": (tv("shufflenet_v2_x1_0"), images((224, 224)), "image"),
    "squeezenet": (tv("squeezenet1_1"), images((224, 224)), "image"),
    "regnet_y_400mf": (tv("regnet_y_400mf"), images((224, 224)), "image"),
    "mnasnet": (tv("mnasnet0_5"), images((224, 224)), "image"),
    "googlenet": (tv("googlenet", aux_logits=False, init_weights=True), images((224, 224)), "image"),
    "convnext_tiny": (tv("convnext_tiny"), images((128, 128)), "image"),
    "swin_t": (tv("swin_t"), images((224, 224)), "image"),
    "vit_small": (vit_small, images((96, 96)), "image"),
    "lraspp": (
        tv("segmentation.lraspp_mobilenet_v3_large", weights_backbone=None, num_classes=21),
        images((256, 256)),
        "segmentation",
    ),
    "deeplabv3_mbv3": (
        tv("segmentation.deeplabv3_mobilenet_v3_large", weights_backbone=None, num_classes=21),
        images((256, 256)),
        "segmentation",
    ),
    "bert": (
        hf(
            "BertModel",
            "BertConfig",
            hidden_size=128,
            num_hidden_layers=2,
            intermediate_size=256,
            **TINY_BERT,
        ),
        TOKENS,
        "tokens",
    ),
    "distilbert": (
        hf(
            "DistilBertModel",
            "DistilBertConfig",
            vocab_size=1000,
            dim=128,
            n_layers=2,
            n_heads=4,
            hidden_dim=256,
        ),
        TOKENS,
        "tokens",
    ),
    "gpt2": (
        hf("GPT2Model", "GPT2Config", vocab_size=1000, n_embd=128, n_layer=2, n_head=4),
        TOKENS,
        "tokens",
    ),
    "t5_enc": (
        hf(
            "T5EncoderModel",
            "T5Config",
            vocab_size=1000,
            d_model=128,
            d_kv=32,
            d_ff=256,
            num_layers=2,
            num_heads=4,
        ),
        TOKENS,
        "tokens",
    ),
    "wav2vec2": (
        hf(
            "Wav2Vec2Model",
            "Wav2Vec2Config",
            hidden_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=192,
            conv_dim=(64,) * 7,
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
        ),
        AUDIO,
        "audio",
    ),
    "whisper_enc": (
        hf(
            "WhisperModel",
            "WhisperConfig",
            d_model=96,
            encoder_layers=2,
            decoder_layers=1,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=192,
            decoder_ffn_dim=192,
            vocab_size=1000,
            pad_token_id=0,
            bos_token_id=1,
            eos_token_id=2,
            decoder_start_token_id=1,
            max_source_positions=1500,
        ),
        MEL,
        "mel",
    ),
}


def wrapped(name: str, model: Any) -> tuple[Any, tuple[str, ...]]:
    """The module to export and its input names: the transformers' outputs become one
    tensor (last hidden state), the segmenters' dict its ``out`` entry."""
    import torch

    kind = MODELS[name][2]
    if kind == "tokens":

        class Tokens(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, ids, mask):
                return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

        return Tokens(model), ("ids", "mask")
    if kind in ("audio", "mel"):

        class Audio(torch.nn.Module):
            def __init__(self, m, key):
                super().__init__()
                self.m, self.key = m, key

            def forward(self, x):
                return self.m(**{self.key: x}).last_hidden_state

        return (
            Audio(model, "input_values") if kind == "audio" else Audio(model.encoder, "input_features")
        ), ("x",)
    if kind == "segmentation":

        class Segmenter(torch.nn.Module):
            def __init__(self, m):
                super().__init__()
                self.m = m

            def forward(self, x):
                return self.m(x)["out"]

        return Segmenter(model), ("x",)
    return model, ("x",)


def export(name: str, dynamo: bool, out: Path) -> Path:
    import torch

    path = out / f"{name}.{'dynamo' if dynamo else 'torchscript'}.onnx"
    if path.exists():
        return path
    torch.manual_seed(0)
    module, names = wrapped(name, MODELS[name][0]())
    feed = MODELS[name][1](0, 1)[0]
    args = tuple(torch.from_numpy(feed[k]) for k in names)
    with torch.no_grad(), warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        if dynamo:
            torch.onnx.export(module, args, str(path), input_names=list(names), dynamo=True, optimize=True)
        else:
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=list(names),
                opset_version=17,
                dynamo=False,
                dynamic_axes={k: {0: "batch"} for k in names},
            )
    return path


# --- measurements ----------------------------------------------------------------------


def latency_ratio(path: Path, feed: Feed, rounds: int = 5, per_round: int = 3) -> tuple[float, list[str]]:
    """quanta / ORT median latency on one thread, the two sessions alternating; and the
    ops that ran on reference kernels."""
    q, r = Z.quanta_session(path, threads=1), Z.ort_session(path, threads=1)
    for _ in range(2):
        q.run(None, feed)
        r.run(None, feed)
    tq, tr = [], []
    for _ in range(rounds):
        for sess, acc in ((q, tq), (r, tr)):
            t = time.perf_counter()
            for _ in range(per_round):
                sess.run(None, feed)
            acc.append((time.perf_counter() - t) / per_round)
    on_numpy = sorted({f[1] for f in getattr(q, "fallbacks", []) if f[1] != "Constant"})
    return float(np.median(tq) / np.median(tr)), on_numpy


def median_sqnr(ref: list[np.ndarray], sess: Any, feeds: list[Feed]) -> float:
    return float(np.median([Z.sqnr_db(a, np.asarray(sess.run(None, f)[0])) for a, f in zip(ref, feeds)]))


def run_one(name: str, dynamo: bool, out: Path, with_latency: bool) -> dict[str, Any]:

    row: dict[str, Any] = {"model": name, "exporter": "dynamo" if dynamo else "torchscript"}
    t0 = time.time()
    try:
        src = export(name, dynamo, out)
    except Exception as e:  # an exporter failure is the exporter's, reported and skipped
        row["export"] = Z.first_line(e)
        return row
    calib, evals = MODELS[name][1](1, 8), MODELS[name][1](2, 4)
    measure(row, name, src, calib, evals, with_latency)
    row["secs"] = round(time.time() - t0, 1)
    return row


def measure(
    row: dict[str, Any], name: str, src: Path, calib: list[Feed], evals: list[Feed], with_latency: bool
) -> None:
    """The row's quantize / check / run / SQNR / integer-share columns for one exported
    file (shared with ``tf_sweep.py``); failures are recorded, never raised."""
    import onnx

    try:
        ref = [Z.ort_session(src).run(None, f)[0] for f in evals]
    except Exception as e:  # an exported file ONNX Runtime rejects is the exporter's
        row["fp32_ortrun"] = Z.first_line(e)
        Z.log_failure(f"{name} fp32 ORT run")
        return
    try:
        row["fp32_sqnr"] = median_sqnr(ref, Z.quanta_session(src), evals)
        if with_latency:
            row["fp32_lat"], row["fp32_on_numpy"] = latency_ratio(src, evals[0])
    except Exception as e:
        row["fp32_run"] = Z.first_line(e)
        Z.log_failure(f"{name} fp32")
    for tool in ("quanta", "ort"):
        dst = src.with_suffix(f".{tool}.onnx")
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                if tool == "quanta":
                    Z.quantize_quanta(src, dst, calib)
                else:
                    Z.quantize_ort(src, dst, calib, "MinMax")
        except Exception as e:
            row[f"{tool}_q"] = Z.first_line(e)
            Z.log_failure(f"{name} {tool} quantize")
            continue
        try:
            onnx.checker.check_model(onnx.load(str(dst)), full_check=True)
            row[f"{tool}_sqnr_ortrun"] = median_sqnr(ref, Z.ort_session(dst), evals)
        except Exception as e:
            row[f"{tool}_ortrun"] = Z.first_line(e)
            Z.log_failure(f"{name} {tool} ORT run")
        try:
            row[f"{tool}_sqnr"] = median_sqnr(ref, Z.quanta_session(dst), evals)
            row[f"{tool}_int"] = Z.integer_share(dst, evals[0])[0]
            if with_latency:
                row[f"{tool}_lat"], row[f"{tool}_on_numpy"] = latency_ratio(dst, evals[0])
        except Exception as e:
            row[f"{tool}_run"] = Z.first_line(e)
            Z.log_failure(f"{name} {tool} quanta run")


#: where the sweeps write the exported and quantized files
SWEEP_CACHE = Path(os.environ.get("QUANTA_SWEEP_CACHE", Path.home() / ".cache" / "quanta-sweep"))


def sweep_main(
    ap: argparse.ArgumentParser,
    models: Mapping[str, Any],
    argv: list[str] | None,
    out: Path,
    rows: Callable[[argparse.Namespace, list[str]], Iterable[dict[str, Any]]],
) -> int:
    """The sweeps' command line (this file's and tf_sweep.py's): ``--models`` (checked
    against ``models``), ``--out`` (default ``out``), ``--json``, ``--log`` on top of the
    sweep's own options in ``ap``; each row of ``rows(args, names)`` is printed as one JSON
    line and appended to ``--json``."""
    ap.add_argument(
        "--models", default="all", help="comma-separated names (default: all): " + ", ".join(models)
    )
    ap.add_argument("--out", type=Path, default=out)
    ap.add_argument("--json", type=Path, help="append the rows here, one JSON object a line")
    ap.add_argument("--log", type=Path, help="tracebacks of every failure")
    args = ap.parse_args(argv)
    names = list(models) if args.models == "all" else args.models.split(",")
    unknown = [n for n in names if n not in models]
    if unknown:
        ap.error(f"unknown model(s) {unknown}; expected some of {list(models)}")
    args.out.mkdir(parents=True, exist_ok=True)
    for row in rows(args, names):
        line = json.dumps(row, default=str)
        print(line, flush=True)
        if args.json:
            with args.json.open("a") as f:
                f.write(line + "\n")
    if args.log:
        args.log.write_text("\n".join(Z.LOG))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--exporter", choices=("both", "torchscript", "dynamo"), default="both")
    ap.add_argument("--latency", action="store_true", help="also time quanta against ONNX Runtime (1 thread)")

    def rows(args: argparse.Namespace, names: list[str]) -> Iterable[dict[str, Any]]:
        exporters = {"both": (False, True), "torchscript": (False,), "dynamo": (True,)}[args.exporter]
        for name in names:
            for dynamo in exporters:
                yield run_one(name, dynamo, args.out, args.latency)

    return sweep_main(ap, MODELS, argv, SWEEP_CACHE, rows)


if __name__ == "__main__":
    raise SystemExit(main())
