"""TensorFlow sweep: Keras models converted to ONNX by tf2onnx, quantized by quanta and by
ONNX Runtime's tool side by side, run by both runtimes.

``arch_sweep.py`` covers PyTorch's exporters; files converted from TensorFlow look
different (NHWC inputs behind a Transpose, BatchNormalization already folded or written
as Mul + Add, ``unk__`` batch dimensions, Keras' recurrent layers as ONNX LSTM / GRU or
as a Loop, attention as Einsum or MatMul chains), and issue 11 asks that any valid file
quantize. The models are keras.applications architectures (``weights=None``: nothing is
downloaded) at small input sizes and small hand-built Keras models (LSTM and GRU text
classifiers, a Conv1D audio model, a transformer block), seeded random initialisation,
each converted by ``tf2onnx.convert.from_keras`` at opsets 13 and 17 with a dynamic batch
dimension. As in ``arch_sweep.py`` the fidelity columns compare the two quantizers on the
same graphs and data, not a trained model's accuracy.

The columns and the JSON rows are ``arch_sweep.py``'s (its ``measure``), with
``exporter`` set to ``tf2onnx-opsetN``.

Setup (not a project dependency; the sweep keeps the installed onnx / onnxruntime)::

    pip install tensorflow-cpu tf2onnx
    python benchmarks/tf_sweep.py                            # every model, opsets 13 and 17
    python benchmarks/tf_sweep.py --models lstm_text,transformer --opsets 17

Results: ``benchmarks/results/``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE / "zoo"))

import arch_sweep as A  # noqa: E402  (benchmarks/ is not a package)
import zoo as Z  # noqa: E402
import zoodata  # noqa: E402

Feed = dict[str, np.ndarray]
# TensorFlow's C++ logging and oneDNN notes would bury the JSON rows
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


# --- data -----------------------------------------------------------------------------

#: keras.applications' ``preprocess_input`` modes, applied here so the converted file
#: sees the range its architecture was built for ("raw": the model rescales itself)
PREPROCESS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "raw": lambda img: img.astype(np.float32),
    "tf": lambda img: img.astype(np.float32) / 127.5 - 1.0,
    "torch": lambda img: (
        (img.astype(np.float32) / 255 - np.float32([0.485, 0.456, 0.406])) / np.float32([0.229, 0.224, 0.225])
    ),
    "caffe": lambda img: img[..., ::-1].astype(np.float32) - np.float32([103.939, 116.779, 123.68]),
}


def nhwc_feeds(mode: str, hw: tuple[int, int]) -> Callable[[int, int], list[Feed]]:
    """Random crops of scikit-image's sample photos, NHWC, preprocessed by ``mode``."""

    def feeds(seed: int, n: int) -> list[Feed]:
        rng = np.random.default_rng(seed)
        plist = zoodata.photos()
        out = []
        for _ in range(n):
            img = zoodata.random_crop(rng, plist[rng.integers(len(plist))], hw)
            out.append({"x": np.ascontiguousarray(PREPROCESS[mode](img)[None], np.float32)})
        return out

    return feeds


def id_feeds(seq: int, vocab: int) -> Callable[[int, int], list[Feed]]:
    """Random token ids, int32 (Keras' Embedding input), with trailing padding 0s of
    random length (the masked recurrent path when the model masks zeros)."""

    def feeds(seed: int, n: int) -> list[Feed]:
        rng = np.random.default_rng(seed)
        out = []
        for _ in range(n):
            ids = rng.integers(1, vocab, (1, seq)).astype(np.int32)
            ids[:, int(rng.integers(seq // 2, seq + 1)) :] = 0
            out.append({"x": ids})
        return out

    return feeds


def wave_feeds(samples: int) -> Callable[[int, int], list[Feed]]:
    """The zoo's synthetic speech-like audio at 16 kHz, [1, samples, 1] (channels last)."""

    def feeds(seed: int, n: int) -> list[Feed]:
        rng = np.random.default_rng(seed)
        return [
            {"x": zoodata.speech_like(rng, samples / 16000 + 0.1)[0][None, :samples, None].astype(np.float32)}
            for _ in range(n)
        ]

    return feeds


# --- models ---------------------------------------------------------------------------


def app(cls: str, hw: tuple[int, int], **kw: Any) -> Callable[[], Any]:
    def make():
        import keras

        return getattr(keras.applications, cls)(input_shape=(*hw, 3), weights=None, classes=100, **kw)

    return make


def recurrent_text(kind: str) -> Callable[[], Any]:
    """Embedding -> bidirectional LSTM / GRU -> last-step classifier, the shape of a
    Keras text classifier (``mask_zero`` is left off: tf2onnx does not convert the
    masked loop into an ONNX LSTM)."""

    def make():
        import keras
        from keras import layers

        cell = {"lstm": layers.LSTM, "gru": layers.GRU}[kind]
        x = keras.Input((32,), dtype="int32", name="x")
        h = layers.Embedding(1000, 48)(x)
        h = layers.Bidirectional(cell(40, return_sequences=True))(h)
        h = cell(40)(h)
        return keras.Model(x, layers.Dense(5)(h))

    return make


def conv1d_audio():
    """A keyword-spotting-like Conv1D stack over a raw waveform (channels last)."""
    import keras
    from keras import layers

    x = keras.Input((8000, 1), name="x")
    h = layers.Conv1D(17, 80, strides=4, padding="same", activation="relu")(x)
    h = layers.MaxPooling1D(4)(h)
    for width in (24, 32, 48):
        h = layers.Conv1D(width, 3, padding="same", use_bias=False)(h)
        h = layers.BatchNormalization()(h)
        h = layers.Activation("swish")(h)
        h = layers.SeparableConv1D(width, 5, padding="same", activation="relu")(h)
        h = layers.MaxPooling1D(2)(h)
    h = layers.GlobalAveragePooling1D()(h)
    return keras.Model(x, layers.Dense(12)(h))


def transformer(approximate: bool) -> Callable[[], Any]:
    """Token + position embedding, two post-norm encoder blocks (MultiHeadAttention,
    LayerNormalization, GELU feed-forward), mean pooling, classifier. Keras' default GELU
    is the exact (erf) one; TensorFlow 2.21 computes it with Erfc, which tf2onnx 1.17
    writes as an "Erfc" node ONNX does not define, so that file fails to load anywhere
    (the ``transformer_erf`` row); ``transformer`` uses the tanh form."""
    return lambda: _transformer(approximate)


def _transformer(approximate: bool):
    import keras
    from keras import layers, ops

    seq, dim = 24, 64
    x = keras.Input((seq,), dtype="int32", name="x")
    h = layers.Embedding(1000, dim)(x) + layers.Embedding(seq, dim)(ops.arange(seq))
    for _ in range(2):
        a = layers.MultiHeadAttention(num_heads=4, key_dim=dim // 4)(h, h)
        h = layers.LayerNormalization(epsilon=1e-6)(h + a)
        f = layers.Dense(dim * 2, activation=lambda t: keras.activations.gelu(t, approximate=approximate))(h)
        h = layers.LayerNormalization(epsilon=1e-6)(h + layers.Dense(dim)(f))
    h = layers.GlobalAveragePooling1D()(h)
    return keras.Model(x, layers.Dense(5)(h))


IMG = (128, 128)
MODELS: dict[str, tuple[Callable[[], Any], Callable[[int, int], list[Feed]], str]] = {
    "mobilenet_v2": (app("MobileNetV2", IMG), nhwc_feeds("tf", IMG), "float32"),
    "mobilenet_v3_small": (app("MobileNetV3Small", IMG), nhwc_feeds("raw", IMG), "float32"),
    "efficientnet_b0": (app("EfficientNetB0", IMG), nhwc_feeds("raw", IMG), "float32"),
    "resnet50": (app("ResNet50", (96, 96)), nhwc_feeds("caffe", (96, 96)), "float32"),
    "resnet50_v2": (app("ResNet50V2", (96, 96)), nhwc_feeds("tf", (96, 96)), "float32"),
    "densenet121": (app("DenseNet121", (96, 96)), nhwc_feeds("torch", (96, 96)), "float32"),
    "nasnet_mobile": (app("NASNetMobile", (96, 96)), nhwc_feeds("tf", (96, 96)), "float32"),
    "xception": (app("Xception", (96, 96)), nhwc_feeds("tf", (96, 96)), "float32"),
    "lstm_text": (recurrent_text("lstm"), id_feeds(32, 1000), "int32"),
    "gru_text": (recurrent_text("gru"), id_feeds(32, 1000), "int32"),
    "conv1d_audio": (conv1d_audio, wave_feeds(8000), "float32"),
    "transformer": (transformer(approximate=True), id_feeds(24, 1000), "int32"),
    "transformer_erf": (transformer(approximate=False), id_feeds(24, 1000), "int32"),
}


def live_statistics(model: Any, batch: np.ndarray, seed: int = 0) -> None:
    """Give every BatchNormalization the second moment of ``batch`` and a random affine.

    With ``weights=None`` the moving statistics are (0, 1) and glorot-initialised
    convolutions halve the signal's power at each ReLU: a deep Keras model's logits come
    out near zero, its softmax constant, and both quantizers look perfect. One
    training-mode pass with momentum 0 records each layer's batch mean and variance; the
    variance then becomes the second moment and the mean zero, so each layer scales its
    input to unit power without centring it. Centring too (the batch's own statistics)
    puts a random network in its chaotic phase: each layer then amplifies the difference
    between two inputs, so 30 dB of local error per layer leaves 1-4 dB at the output
    for both quantizers alike, and the column compares nothing. Gamma in [0.5, 1.5],
    beta ~ N(0, 0.1) give folded convolutions the per-channel scale spread of trained
    weights."""
    from keras import layers

    rng = np.random.default_rng(seed)
    bns = [layer for layer in model._flatten_layers() if isinstance(layer, layers.BatchNormalization)]
    for bn in bns:
        bn.momentum = 0.0
    if not bns:
        return
    model(batch, training=True)
    for bn in bns:
        mean, var = np.asarray(bn.moving_mean), np.asarray(bn.moving_variance)
        bn.moving_variance.assign((var + mean * mean).astype(np.float32))
        bn.moving_mean.assign(np.zeros_like(mean))
        if bn.gamma is not None:
            bn.gamma.assign(rng.uniform(0.5, 1.5, bn.gamma.shape).astype(np.float32))
        if bn.beta is not None:
            bn.beta.assign(rng.normal(0.0, 0.1, bn.beta.shape).astype(np.float32))


def export(name: str, opset: int, out: Path) -> Path:
    """tf2onnx's conversion of the seeded Keras model, batch dimension dynamic as a
    converted serving model has it; cached by name and opset."""
    path = out / f"{name}.tf2onnx-opset{opset}.onnx"
    if path.exists():
        return path
    import keras
    import tensorflow as tf
    import tf2onnx

    keras.utils.set_random_seed(0)
    make, _, dtype = MODELS[name]
    model = make()
    if dtype == "float32":
        live_statistics(model, np.concatenate([f["x"] for f in MODELS[name][1](99, 8)]))
    shape = (None, *model.inputs[0].shape[1:])
    spec = (tf.TensorSpec(shape, getattr(tf, dtype), name="x"),)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        tf2onnx.convert.from_keras(model, input_signature=spec, opset=opset, output_path=str(path))
    return path


def run_one(name: str, opset: int, out: Path) -> dict[str, Any]:
    row: dict[str, Any] = {"model": name, "exporter": f"tf2onnx-opset{opset}"}
    t0 = time.time()
    try:
        src = export(name, opset, out)
    except Exception as e:  # a converter failure is the converter's, reported and skipped
        row["export"] = Z.first_line(e)
        Z.log_failure(f"{name} export")
        return row
    feeds = MODELS[name][1]
    A.measure(row, name, src, feeds(1, 8), feeds(2, 4), with_latency=False)
    row["secs"] = round(time.time() - t0, 1)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--opsets", default="13,17", help="tf2onnx target opsets, comma-separated")

    def rows(args: argparse.Namespace, names: list[str]) -> Iterable[dict[str, Any]]:
        for name in names:
            for opset in (int(o) for o in args.opsets.split(",")):
                yield run_one(name, opset, args.out)

    return A.sweep_main(ap, MODELS, argv, A.SWEEP_CACHE / "tf", rows)


if __name__ == "__main__":
    raise SystemExit(main())
