"""Make the zoo's files "quantized by another tool" with ONNX Runtime's quantizer, into the
cache (``models/<name>.onnx``) and its manifest. ``fetch.py`` calls this after fetching
the source models; run it alone to (re)make only these files::

    python benchmarks/zoo/other_tools.py                 # the missing ones
    python benchmarks/zoo/other_tools.py --force         # all of them again
    python benchmarks/zoo/other_tools.py --only ppocr_cls.ort_qop

Each file is one of ORT's tool's settings a user picks (the zoo's calibration feeds for
the static ones); model files never go into the repository.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import zoodata  # noqa: E402  (this folder is not a package)

#: name, source model, what the manifest says, the quantizer's keyword arguments
OTHER_TOOL: list[tuple[str, str, str, dict[str, Any]]] = [
    # the tool's default for a model with an LSTM: DynamicQuantizeLSTM, ConvInteger, MatMulInteger
    ("ddddocr.ort_dynamic", "ddddocr", "onnxruntime.quantization.quantize_dynamic", {"dynamic": True}),
    ("nudenet_320n.ort_qdq", "nudenet_320n", "onnxruntime.quantization.quantize_static (QDQ)", {}),
    ("ppocr_cls.ort_qdq", "ppocr_cls", "onnxruntime.quantization.quantize_static (QDQ)", {}),
    # QOperator format: QLinearConv, QLinearAdd, QLinearGlobalAveragePool ... (com.microsoft ones too)
    (
        "ppocr_cls.ort_qop",
        "ppocr_cls",
        "onnxruntime.quantization.quantize_static (QOperator)",
        {"quant_format": "QOperator"},
    ),
    # per-channel weights, symmetric activations (zero points 0)
    (
        "nudenet_320n.ort_qdq_pc_sym",
        "nudenet_320n",
        "onnxruntime.quantization.quantize_static (QDQ, per_channel, ActivationSymmetric)",
        {"per_channel": True, "extra_options": {"ActivationSymmetric": True}},
    ),
    # 16-bit activations as com.microsoft Q/DQ (the tool's route below opset 21)
    (
        "ppocr_cls.ort_qdq_u16",
        "ppocr_cls",
        "onnxruntime.quantization.quantize_static (QDQ, QUInt16 activations, UseQDQContribOps)",
        {"activation_type": "QUInt16", "extra_options": {"UseQDQContribOps": True}},
    ),
    # a transformer (SVTR blocks: MatMul, LayerNormalization, Softmax) quantized dynamically;
    # its weights sit in Constant nodes, which quantize_dynamic refuses ("Expected
    # conv2d_157.w_0 to be an initializer") until the tool's quant_pre_process folds them
    (
        "ppocr_rec.ort_dynamic",
        "ppocr_rec",
        "onnxruntime.quantization.quant_pre_process + quantize_dynamic",
        {"dynamic": True, "preprocess": True},
    ),
    # a float LSTM between Q/DQ: ORT's float LSTM (MLAS GEMM, MLAS gates) decides the codes
    # of every LSTM output (docs/float-ops.md (RNN-ORT))
    ("beats_blstm.ort_qdq", "beats_blstm", "onnxruntime.quantization.quantize_static (QDQ)", {}),
    # NNCF's placement with its defaults (int8 symmetric per-channel weights, asymmetric or
    # symmetric activations chosen by NNCF, Q/DQ pairs where NNCF puts them); needs the
    # `bench` extra (nncf)
    ("ppocr_cls.nncf", "ppocr_cls", "nncf.quantize (defaults)", {"nncf": True}),
    # NNCF on TensorFlow exports: a tf2onnx Conv1d stack over float character ids (Cast,
    # Gather), and a torch 2.11 dilated Conv1d segmenter over int64 ids
    ("deepcut.nncf", "deepcut", "nncf.quantize (defaults)", {"nncf": True}),
    ("attacut_c.nncf", "attacut_c", "nncf.quantize (defaults)", {"nncf": True}),
    # a torch 1.2 face detector whose 59 BatchNormalizations the exporter left unfused,
    # as QOperator (ORT keeps the BatchNormalizations float between DequantizeLinear /
    # QuantizeLinear); NNCF refuses its opset 9
    (
        "centerface.ort_qop",
        "centerface",
        "onnxruntime.quantization.quantize_static (QOperator)",
        {"quant_format": "QOperator"},
    ),
    # a tf2onnx BERT (LayerNorm written out with GlobalAveragePool) quantized dynamically
    # (NNCF 3.4 fails on it: IndexError in its graph builder); the unrolled seq2seq
    # decoder dynamically (18 readers of each decoder weight)
    ("g2pid_bert.ort_dynamic", "g2pid_bert", "onnxruntime.quantization.quantize_dynamic", {"dynamic": True}),
    ("g2pid_tiny.ort_dynamic", "g2pid_tiny", "onnxruntime.quantization.quantize_dynamic", {"dynamic": True}),
    # Paddle 3's exporter (output declared rank 0: ORT's QDQ file copies it and fails
    # onnx.checker), QOperator with HardSwish and HardSigmoid left float
    (
        "ppocrv5_textline_ori.ort_qop",
        "ppocrv5_textline_ori",
        "onnxruntime.quantization.quantize_static (QOperator)",
        {"quant_format": "QOperator"},
    ),
    ("ppocrv5_textline_ori.nncf", "ppocrv5_textline_ori", "nncf.quantize (defaults)", {"nncf": True}),
    # a sentence encoder whose graph pools (ReduceSum / Clip / Div) and passes its inputs on
    ("minilm_l3.ort_dynamic", "minilm_l3", "onnxruntime.quantization.quantize_dynamic", {"dynamic": True}),
    ("minilm_l3.nncf", "minilm_l3", "nncf.quantize (defaults)", {"nncf": True}),
    # weight-only int8 (NNCF's default INT8_ASYM: uint8 weights per output channel with zero
    # points, DequantizeLinear before each float MatMul), which ONNX Runtime 1.32 runs as
    # MatMulNBits with int8 activations (docs/quantization-math.md (NB8-2))
    ("minilm_l3.nncf_w8", "minilm_l3", "nncf.compress_weights (defaults: INT8_ASYM)", {"nncf_weights": True}),
    # 4-bit weights of a transformer: com.microsoft MatMulNBits (block 32, zero points), and
    # the same blocks written as opset-21 int4 DequantizeLinear with block_size before MatMul
    (
        "rxnmap.ort_nbits4",
        "rxnmap",
        "onnxruntime.quantization.MatMulNBitsQuantizer (4 bits, block 32, asymmetric)",
        {"nbits": 4, "block_size": 32},
    ),
    (
        "rxnmap.ort_int4_qdq",
        "rxnmap",
        "onnxruntime.quantization.MatMulNBitsQuantizer (QDQ: int4 DequantizeLinear, block 32)",
        {"nbits": 4, "block_size": 32, "quant_format": "QDQ"},
    ),
    # the transformer as a float16 file (onnxconverter-common, float32 inputs and outputs kept)
    ("rxnmap.fp16", "rxnmap", "onnxconverter_common.float16.convert_float_to_float16", {"float16": True}),
]


class Reader:
    """ONNX Runtime's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds):
        self.feeds, self.i = feeds, 0

    def get_next(self):
        self.i += 1
        return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None

    def rewind(self):
        self.i = 0


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def make(source: str, src: Path, dst: Path, options: dict[str, Any]) -> None:
    """Quantize ``src`` into ``dst`` with ORT's tool and ``options`` (OTHER_TOOL)."""
    from onnxruntime.quantization import QuantFormat, QuantType, quantize_dynamic, quantize_static

    kw = dict(options)
    n_calib = zoodata.sizes(source, zoodata.BY_NAME[source].kind)[0]
    if kw.pop("nncf_weights", False):
        import nncf
        import onnx

        onnx.save(nncf.compress_weights(onnx.load(str(src))), str(dst))
        return
    if kw.pop("nncf", False):
        import nncf
        import onnx

        cache = next(d for d in src.parents if d.name == "models").parent  # the audio and text feeds read it
        calib = zoodata.feeds(source, "calib", n_calib, cache)
        onnx.save(nncf.quantize(onnx.load(str(src)), nncf.Dataset(calib), subset_size=len(calib)), str(dst))
        return
    if kw.pop("nbits", None):
        import onnx
        from onnxruntime.quantization import matmul_nbits_quantizer

        fmt = getattr(QuantFormat, kw.pop("quant_format", "QOperator"))
        q = matmul_nbits_quantizer.MatMulNBitsQuantizer(
            onnx.load(str(src)), block_size=kw["block_size"], is_symmetric=False, quant_format=fmt
        )
        q.process()
        q.model.save_model_to_file(str(dst), False)
        return
    if kw.pop("float16", False):
        import onnx
        from onnxconverter_common import float16

        onnx.save(float16.convert_float_to_float16(onnx.load(str(src)), keep_io_types=True), str(dst))
        return
    if kw.pop("preprocess", False):
        from onnxruntime.quantization.shape_inference import quant_pre_process

        pre = dst.with_suffix(".pre.onnx")
        quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)  # needs sympy otherwise
        try:
            make(source, pre, dst, kw)
        finally:
            pre.unlink(missing_ok=True)
        return
    if kw.pop("dynamic", False):
        quantize_dynamic(str(src), str(dst), **kw)
        return
    if "quant_format" in kw:
        kw["quant_format"] = getattr(QuantFormat, kw["quant_format"])
    for key in ("activation_type", "weight_type"):
        if key in kw:
            kw[key] = getattr(QuantType, kw[key])
    cache = next(d for d in src.parents if d.name == "models").parent  # the audio and text feeds read it
    quantize_static(str(src), str(dst), Reader(zoodata.feeds(source, "calib", n_calib, cache)), **kw)


def make_all(
    cache: Path, entries: list[dict], *, force: bool = False, only: set[str] | None = None
) -> list[dict]:
    """The manifest ``entries`` with every OTHER_TOOL file made (missing ones, or all with
    ``force``) and listed once; a file the tool cannot make is reported and left out."""
    from fetch import signature  # the manifest's input signature, as for the source models

    by_name = {e["name"]: e for e in entries}
    for name, source, how, options in OTHER_TOOL:
        if only is not None and name not in only:
            continue
        dst = cache / "models" / f"{name}.onnx"
        if force or not dst.exists() or name not in by_name:
            tmp = dst.with_suffix(f".tmp{os.getpid()}.onnx")
            try:
                make(source, cache / by_name[source]["path"], tmp, options)
            except Exception as e:  # one setting the tool refuses does not stop the others
                print(f"{name:28s} not made: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
                tmp.unlink(missing_ok=True)
                continue
            os.replace(tmp, dst)
        src_entry = by_name[source]
        by_name[name] = {
            "name": name,
            "kind": src_entry["kind"],
            "package": src_entry["package"],
            "member": src_entry["member"],
            "path": str(dst.relative_to(cache)),
            "sha256": sha256(dst),
            "note": f"{source} quantized by {how}",
            "made_by": how,
            "options": options,
            "source": source,
            "inputs": signature(dst),
        }
        print(f"{name:28s} {how}")
    return list(by_name.values())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cache", help="cache folder (default $QUANTA_ZOO_CACHE or ~/.cache/quanta-zoo)")
    ap.add_argument("--force", action="store_true", help="make every file again")
    ap.add_argument("--only", help="comma-separated names of OTHER_TOOL to make")
    args = ap.parse_args(argv)
    cache = zoodata.cache_dir(args.cache)
    manifest = cache / "manifest.json"
    entries = json.loads(manifest.read_text())["models"]
    only = set(args.only.split(",")) if args.only else None
    entries = make_all(cache, entries, force=args.force, only=only)
    tmp = manifest.with_suffix(f".tmp{os.getpid()}")
    tmp.write_text(json.dumps({"models": entries}, indent=1) + "\n")
    os.replace(tmp, manifest)  # readers see the old or the new manifest, never half of one
    print(f"wrote {manifest} ({len(entries)} entries)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
