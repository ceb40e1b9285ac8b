"""The layer-wise quantization debugger: where a QDQ model loses accuracy, and why.

``compare(fp32, quantized, data)`` runs both models on the same feeds, one feed at a
time (statistics are streamed: memory is one feed's tensors plus fixed-size sums and
histograms, whatever the number of samples), and returns a :class:`DebugResult`:

- one :class:`NodeRow` per quantized node of the QDQ model (a node with at least one
  input from a DequantizeLinear), named by its ONNX node name, in graph order:
  *inherited* error (the quantized model's output tensor vs the FP32 model's tensor of
  the same name: everything upstream plus this node), *local* error (this node's FP32
  inputs quantized with its own Q/DQ parameters, the node run, its output quantized,
  vs the FP32 output: what this node adds when its inputs are exact) and the estimated
  share of the end-to-end error it causes; docs/debugger.md eqs. (1)-(6b);
- one :class:`TensorRow` per activation Q/DQ pair: clipped share (eq. (7)), levels used,
  and calibration diagnostics from a streaming histogram of the FP32 tensor: the range
  each calibration method would choose and the SQNR it gives on this data (eq. (8)), the
  outlier ratio (eq. (9)) and a recommended action;
- one :class:`WeightRow` per quantized weight: per-channel scale spread and outlier
  channels (eq. (10));
- the model outputs against FP32: SQNR, cosine, top-1 agreement.

Local error is measured with the QDQ semantics (Q/DQ of the inputs, the op in float on
the dequantized values, Q/DQ of the output): the integer kernels compute the same
products and sums exactly, so it differs from them only by the output requantization's
rounding of an already-rounded accumulator (at most one LSB, docs/quantization-math.md).

Tensors are matched by name. A node whose inputs or output the FP32 model lacks gets no
local / inherited row (``unmatched`` says which), never an error.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx

from quanta.calibrate.runner import _FIXED
from quanta.ir.graph import Model, Node, Value
from quanta.quantize.accuracy import class_rows

__all__ = [
    "DebugResult",
    "ErrorStats",
    "MethodChoice",
    "NodeRow",
    "TensorRow",
    "WeightRow",
    "ablate",
    "compare",
    "ranking_overlap",
]

QUANT_OPS = ("QuantizeLinear", "DequantizeLinear")


# ------------------------------------------------------------------------------ statistics


class ErrorStats:
    """Streaming sums of a reference r and an approximation q: eqs. (1)-(3) of
    docs/debugger.md.

    Each sample's sums are taken in float64 (a function of that sample alone); the sums
    across samples are exact (Python integers in units of 2^-1074, as the calibration's
    channel means), so the state after any split of the samples into shards, merged in
    any order, is the same, and each sum is read as one correctly rounded float64."""

    __slots__ = ("_totals", "count", "max_abs")

    def __init__(self) -> None:
        self._totals: list[Any] = [0, 0, 0, 0]  # Σ r², Σ (r − q)², Σ r·q, Σ q²
        self.max_abs = 0.0  # max |r − q|
        self.count = 0

    def add(self, r: np.ndarray, q: np.ndarray) -> None:
        from quanta.calibrate.runner import _to_fixed

        if np.asarray(r).dtype.kind in "OUS" or np.asarray(q).dtype.kind in "OUS":
            # strings (a lookup table's output): equal or not, no error power; a string
            # that differs counts as an error of 1
            same = np.asarray(r) == np.asarray(q)
            self.count += int(np.size(same))
            if not np.all(same):
                self.max_abs = max(self.max_abs, 1.0)
            return
        r = np.asarray(r, np.float64)
        q = np.asarray(q, np.float64)
        if r.shape != q.shape:
            r, q = np.broadcast_arrays(r, q)
        with np.errstate(invalid="ignore"):  # -inf - -inf (a mask in both): dropped below
            d = r - q
        finite = np.isfinite(d)
        if not finite.all():
            r, q, d = r[finite], q[finite], d[finite]
        sums = np.array([np.sum(r * r), np.sum(d * d), np.sum(r * q), np.sum(q * q)], np.float64)
        self._totals = [a + b for a, b in zip(self._totals, _to_fixed(sums).tolist())]
        if d.size:
            self.max_abs = max(self.max_abs, float(np.max(np.abs(d))))
        self.count += int(d.size)

    def merge_in_place(self, other: ErrorStats) -> ErrorStats:
        """Add ``other``'s samples (exact: integer sums, a maximum, a count)."""
        self._totals = [a + b for a, b in zip(self._totals, other._totals)]
        self.max_abs = max(self.max_abs, other.max_abs)
        self.count += other.count
        return self

    def __getstate__(self) -> tuple[list[Any], float, int]:
        return self._totals, self.max_abs, self.count

    def __setstate__(self, state: tuple[list[Any], float, int]) -> None:
        self._totals, self.max_abs, self.count = list(state[0]), state[1], state[2]

    def _read(self, i: int) -> float:
        t = self._totals[i]
        return t / (1 << _FIXED) if isinstance(t, int) else float(t)  # int / int: correctly rounded

    @property
    def signal(self) -> float:
        return self._read(0)

    @property
    def noise(self) -> float:
        return self._read(1)

    @property
    def dot(self) -> float:
        return self._read(2)

    @property
    def qsq(self) -> float:
        return self._read(3)

    @property
    def sqnr_db(self) -> float:
        """Eq. (1): 10·log10(Σ r² / Σ (r − q)²)."""
        return db(self.signal, self.noise)

    @property
    def nsr(self) -> float:
        """Noise-to-signal ratio Σ (r − q)² / Σ r² (eq. (4)); 0 when exact."""
        if self.noise == 0.0:
            return 0.0
        return self.noise / self.signal if self.signal > 0 else math.inf

    @property
    def cosine(self) -> float:
        """Eq. (2): Σ r·q / (‖r‖·‖q‖) over the whole tensor."""
        den = math.sqrt(self.signal * self.qsq)
        return 1.0 if den == 0.0 and self.noise == 0.0 else (self.dot / den if den > 0 else 0.0)

    def to_dict(self) -> dict[str, float | str]:
        return {
            "sqnr_db": _finite(self.sqnr_db),
            "cosine": self.cosine,
            "max_abs": self.max_abs,
            "count": self.count,
        }


def db(signal: float, noise: float) -> float:
    if noise == 0.0:
        return math.inf
    return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else ("inf" if x > 0 else "-inf")


# ------------------------------------------------------------------------------ rows


@dataclass
class MethodChoice:
    """The range one calibration method picks for a tensor and the SQNR of that range on
    the observed data (eq. (8))."""

    method: str
    lo: float
    hi: float
    sqnr_db: float


@dataclass
class TensorRow:
    """One activation Q/DQ pair: ``name`` is the float tensor QuantizeLinear reads."""

    name: str
    producer: str  # the ONNX node that writes it ("" for a graph input)
    scale: float
    zero_point: int
    qmin: int
    qmax: int
    clipped: float = 0.0  # eq. (7): share of the quantized model's values outside the grid
    levels_used: int = 0  # distinct codes seen, out of qmax − qmin + 1
    outlier_ratio: float = 1.0  # eq. (9)
    observed: tuple[float, float] = (0.0, 0.0)  # FP32 min, max on the data
    chosen_sqnr_db: float = math.inf  # eq. (8) for the range the model uses
    methods: list[MethodChoice] = field(default_factory=list)
    int16_sqnr_db: float = math.inf  # eq. (8) with the observed range on a 16-bit grid
    recommendation: str = ""
    histogram: tuple[list[float], list[float]] | None = None  # (edges, counts) of the FP32 values

    @property
    def chosen(self) -> tuple[float, float]:
        return ((self.qmin - self.zero_point) * self.scale, (self.qmax - self.zero_point) * self.scale)

    def best_method(self) -> MethodChoice | None:
        return max(self.methods, key=lambda m: m.sqnr_db, default=None)


@dataclass
class WeightRow:
    """One quantized weight (a DequantizeLinear of a constant)."""

    name: str
    consumer: str
    channels: int  # 1 for per-tensor
    scale_spread: float  # eq. (10): max / median of the per-channel scales
    outlier_channels: list[int] = field(default_factory=list)  # scale > 4x the median


@dataclass
class NodeRow:
    """One quantized node (ONNX node name, op type) and its output tensor."""

    name: str
    op: str
    output: str
    inputs: list[str]  # the float tensors its quantized inputs come from
    local: ErrorStats | None = None
    inherited: ErrorStats | None = None
    contribution: float = 0.0  # eq. (5e): estimated share of the output error
    gain: float | None = None  # eq. (5e): output NSR per unit of local NSR (None: not measured, taken as 1)
    ablation_sqnr_db: float | None = (
        None  # eq. (6b) / (6): output SQNR with this node alone quantized / float
    )
    scale: float | None = None  # of the output's Q/DQ (None: a float output)
    recommendation: str = ""

    @property
    def local_db(self) -> float:
        return math.inf if self.local is None else self.local.sqnr_db

    @property
    def inherited_db(self) -> float:
        return math.inf if self.inherited is None else self.inherited.sqnr_db

    @property
    def max_lsb(self) -> float | None:
        """Eq. (3): the largest inherited error in LSBs of the output's scale."""
        if self.inherited is None or not self.scale:
            return None
        return self.inherited.max_abs / self.scale


@dataclass
class DebugResult:
    nodes: list[NodeRow]
    tensors: list[TensorRow]
    weights: list[WeightRow]
    outputs: dict[str, ErrorStats]
    top1_agreement: float | None
    samples: int
    unmatched: list[str] = field(default_factory=list)
    ablation_passes: int = 0
    ablation_mode: str = "only"  # eq. (6b) "only" this node quantized, or eq. (6) "float"
    float_nodes: list[tuple[str, str]] = field(default_factory=list)  # (node, op) compute left float
    integer_share: float | None = None
    # how the FP32 reference was made when none was given: the quantized file's own float
    # view (quanta.quantize.float_view); "" for a reference the user gave
    reference: str = ""

    @property
    def output_sqnr_db(self) -> float:
        signal = noise = 0.0
        for s in self.outputs.values():
            signal += s.signal
            noise += s.noise
        return db(signal, noise)

    @property
    def output_cosine(self) -> float:
        vals = [s.cosine for s in self.outputs.values()]
        return min(vals) if vals else 1.0

    def worst(self, k: int = 10) -> list[NodeRow]:
        """The ``k`` nodes with the largest estimated contribution (eq. (5e))."""
        rows = [r for r in self.nodes if r.local is not None]
        return sorted(rows, key=lambda r: (-r.contribution, r.name))[:k]

    def tensor(self, name: str) -> TensorRow | None:
        return next((t for t in self.tensors if t.name == name), None)

    def format(self, k: int = 10) -> str:
        lines = [
            f"{self.samples} feed(s); outputs: SQNR {self.output_sqnr_db:.1f} dB, cosine {self.output_cosine:.5f}"
            + ("" if self.top1_agreement is None else f", top-1 agreement {self.top1_agreement:.3f}")
        ]
        if self.reference:
            lines.append(f"reference: {self.reference}")
        if self.integer_share is not None:
            lines.append(f"integer MAC share: {self.integer_share * 100:.1f} %")
        worst = self.worst(k)
        if worst:
            width = max(len(r.name) for r in worst)
            lines.append(f"the {len(worst)} layers that add the most error (eq. (5e)):")
            lines.append(
                f"  {'node':{width}s}  {'op':12s} local dB  inher dB  share   "
                + ("abl dB  " if any(r.ablation_sqnr_db is not None for r in worst) else "")
                + "suggested fix"
            )
            for r in worst:
                abl = ""
                if any(w.ablation_sqnr_db is not None for w in worst):
                    abl = "       -  " if r.ablation_sqnr_db is None else f"{r.ablation_sqnr_db:8.1f}  "
                lines.append(
                    f"  {r.name:{width}s}  {r.op:12s}{r.local_db:8.1f}  {r.inherited_db:8.1f}  "
                    f"{r.contribution * 100:5.1f}%  {abl}{r.recommendation}"
                )
        sat = [t for t in self.tensors if t.clipped > 1e-4]
        if sat:
            lines.append(
                f"{len(sat)} tensor(s) clip more than 0.01 % of their values: "
                + ", ".join(
                    f"{t.name} ({t.clipped * 100:.2f} %)" for t in sorted(sat, key=lambda t: -t.clipped)[:5]
                )
            )
        if self.unmatched:
            lines.append(
                f"{len(self.unmatched)} quantized tensor(s) have no FP32 tensor of the same name: "
                + ", ".join(self.unmatched[:8])
                + (" ..." if len(self.unmatched) > 8 else "")
            )
        if self.ablation_passes:
            lines.append(f"ablation: {self.ablation_passes} extra pass(es) over the data")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        def node(r: NodeRow) -> dict[str, Any]:
            return {
                "name": r.name,
                "op": r.op,
                "output": r.output,
                "inputs": r.inputs,
                "local": None if r.local is None else r.local.to_dict(),
                "inherited": None if r.inherited is None else r.inherited.to_dict(),
                "max_lsb": r.max_lsb,
                "contribution": r.contribution,
                "gain": r.gain,
                "ablation_sqnr_db": None if r.ablation_sqnr_db is None else _finite(r.ablation_sqnr_db),
                "recommendation": r.recommendation,
            }

        def tensor(t: TensorRow) -> dict[str, Any]:
            return {
                "name": t.name,
                "producer": t.producer,
                "scale": t.scale,
                "zero_point": t.zero_point,
                "range": list(t.chosen),
                "observed": list(t.observed),
                "clipped": t.clipped,
                "levels_used": t.levels_used,
                "levels": t.qmax - t.qmin + 1,
                "outlier_ratio": t.outlier_ratio,
                "chosen_sqnr_db": _finite(t.chosen_sqnr_db),
                "int16_sqnr_db": _finite(t.int16_sqnr_db),
                "methods": [
                    {"method": m.method, "range": [m.lo, m.hi], "sqnr_db": _finite(m.sqnr_db)}
                    for m in t.methods
                ],
                "recommendation": t.recommendation,
            }

        return {
            "samples": self.samples,
            "outputs": {k: v.to_dict() for k, v in self.outputs.items()},
            "output_sqnr_db": _finite(self.output_sqnr_db),
            "top1_agreement": self.top1_agreement,
            "integer_share": self.integer_share,
            "nodes": [node(r) for r in self.nodes],
            "tensors": [tensor(t) for t in self.tensors],
            "weights": [
                {
                    "name": w.name,
                    "consumer": w.consumer,
                    "channels": w.channels,
                    "scale_spread": w.scale_spread,
                    "outlier_channels": w.outlier_channels,
                }
                for w in self.weights
            ],
            "unmatched": self.unmatched,
            "float_nodes": [list(f) for f in self.float_nodes],
            "ablation_passes": self.ablation_passes,
            "ablation_mode": self.ablation_mode,
            "reference": self.reference,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, sort_keys=True)


# ------------------------------------------------------------------------------ the graph


@dataclass
class _Pair:
    """An activation QuantizeLinear -> DequantizeLinear pair."""

    x: str  # float input of Q (scoped: ``prefix`` + its name in its body)
    q: Node
    dq: Node
    scale: float
    zero_point: int
    qmin: int
    qmax: int
    prefix: str = ""  # the body it sits in ("" for the main graph)
    producer: str = ""  # the node that writes x

    def name(self, v) -> str:
        """The scoped name of one of its nodes' values (what the runs report)."""
        return self.prefix + v.name


@dataclass
class _Target:
    """A quantized node and how to rebuild its local computation."""

    node: Node
    # per input: ("act", pair) | ("const", array) | ("float", name) | ("none", None)
    sources: list[tuple[str, Any]]
    out_pair: _Pair | None
    float_inputs: list[str]
    prefix: str = ""

    @property
    def output(self) -> str:
        return self.prefix + self.node.outputs[0].name

    @property
    def q_output(self) -> str:
        """The value of the quantized model that stands for the output."""
        return self.out_pair.name(self.out_pair.dq.outputs[0]) if self.out_pair else self.output


def _load(m: str | os.PathLike | onnx.ModelProto | Model, what: str) -> Model:
    from quanta.ir.onnx_io import from_proto, load_proto

    if isinstance(m, Model):
        return m
    proto, path = load_proto(m)
    model = from_proto(proto, path or what)
    model.path = path
    return model


def _const(v) -> np.ndarray | None:
    return None if v is None or v.const is None else np.asarray(v.const)


def _scopes(model: Model, prefix: str = "") -> list[tuple[str, Model]]:
    """The main graph ("") and every If / Loop / Scan body as a model of its own, with the
    scope prefix the runs report its values under (``{node}/{attribute}/``, nested
    scopes chained: quanta.runtime.control_flow.scoped_name)."""
    from quanta.quantize.bodies import _body_model, _control_flow_nodes, _graphs
    from quanta.runtime.control_flow import node_scope

    out = [(prefix, model)]
    for k, node in _control_flow_nodes(model):
        for attribute, graph in _graphs(node):
            try:
                sub = _body_model(model, node, graph)[0]
            except Exception:  # a body that cannot stand alone: its values are not compared
                continue
            out += _scopes(sub, f"{prefix}{node_scope(node, k)}/{attribute}/")
    return out


def _pairs(model: Model, prefix: str = "") -> dict[str, _Pair]:
    """DQ output name -> its activation pair (a Q of a non-constant, then a DQ); names
    scoped by ``prefix``."""
    out: dict[str, _Pair] = {}
    for dq in model.graph.nodes:
        if dq.op_type != "DequantizeLinear" or dq.inputs[0] is None:
            continue
        q = dq.inputs[0].producer
        if q is None or q.op_type != "QuantizeLinear" or q.inputs[0] is None or q.inputs[0].is_const:
            continue
        w = q.inputs[0].producer
        if w is not None and w.op_type == "Constant":  # a weight held in a Constant node
            continue
        s = _const(q.input(1))
        if s is None or s.size != 1:
            continue
        zp_arr = _const(q.input(2))
        zp_arr = np.zeros((), np.uint8) if zp_arr is None else zp_arr
        info = np.iinfo(zp_arr.dtype) if zp_arr.dtype.kind in "iu" else np.iinfo(np.int8)
        prod = q.inputs[0].producer
        out[prefix + dq.outputs[0].name] = _Pair(
            prefix + q.inputs[0].name,
            q,
            dq,
            float(s.reshape(-1)[0]),
            int(zp_arr.reshape(-1)[0]),
            int(info.min),
            int(info.max),
            prefix,
            "" if prod is None else prefix + prod.name,
        )
    return out


def _targets(
    model: Model, pairs: dict[str, _Pair], prefix: str = ""
) -> tuple[list[_Target], list[WeightRow]]:
    targets: list[_Target] = []
    weights: list[WeightRow] = []
    by_q_input: dict[str, _Pair] = {}
    for p in pairs.values():
        by_q_input.setdefault(p.x, p)
    for n in model.graph.nodes:
        if n.op_type in QUANT_OPS:
            continue
        sources: list[tuple[str, Any]] = []
        quantized = False
        for v in n.inputs:
            if v is None:
                sources.append(("none", None))
            elif prefix + v.name in pairs:
                sources.append(("act", pairs[prefix + v.name]))
                quantized = True
            elif (
                v.producer is not None
                and v.producer.op_type == "DequantizeLinear"
                and v.producer.inputs[0] is not None
                and v.producer.inputs[0].is_const
            ):
                sources.append(("wdq", v.producer))
                quantized = True
                scale = _const(v.producer.input(1))
                if scale is not None:
                    sc = np.abs(scale.reshape(-1).astype(np.float64))
                    med = float(np.median(sc)) if sc.size else 0.0
                    spread = float(sc.max() / med) if med > 0 else 1.0
                    outl = [int(i) for i in np.flatnonzero(sc > 4 * med)] if med > 0 else []
                    weights.append(
                        WeightRow(
                            prefix + v.producer.inputs[0].name,
                            prefix + n.name,
                            int(sc.size),
                            spread,
                            outl[:32],
                        )
                    )
            elif v.is_const:
                sources.append(("const", np.asarray(v.const)))
            else:
                sources.append(("float", prefix + v.name))
        if not quantized or not n.outputs:
            continue
        y = n.outputs[0]
        out_pair = by_q_input.get(prefix + y.name)
        float_inputs = [s[1].x if s[0] == "act" else s[1] for s in sources if s[0] in ("act", "float")]
        targets.append(_Target(n, sources, out_pair, float_inputs, prefix))
    return targets, weights


#: Operators of files quantized in ONNX Runtime's QOperator format: where their output's
#: scale and zero point are among their inputs (positions), to read the output as reals
QLINEAR_OUT: dict[str, tuple[int, int]] = {
    "QLinearConv": (6, 7),
    "QLinearMatMul": (6, 7),
    "QLinearAdd": (6, 7),
    "QLinearMul": (6, 7),
    "QGemm": (7, 8),
    "QLinearSigmoid": (3, 4),
    "QLinearLeakyRelu": (3, 4),
    "QLinearSoftmax": (3, 4),
    "QLinearAveragePool": (3, 4),
    "QLinearGlobalAveragePool": (3, 4),
    "QLinearReduceMean": (3, 4),
    "QLinearConcat": (0, 1),
    "QuantizeLinear": (1, 2),
}

#: Integer operators of dynamically quantized files: their float result is a few float
#: ops further (Cast, Mul by the scales, Add of the bias) under the original name
INTEGER_FLOAT_OPS = frozenset({"MatMulInteger", "ConvInteger"})
_DYNAMIC_TAIL = frozenset({"Cast", "Mul", "Add"})
#: ... and those that write the float result themselves, under the original name
DYNAMIC_FLOAT_OPS = frozenset(
    {"DynamicQuantizeLSTM", "DynamicQuantizeGRU", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"}
)

#: Suffixes ONNX Runtime's quantizer gives the quantized copies of float tensors
_ORT_SUFFIXES = ("_output_quantized", "_quantized", "_QuantizeLinear_Output")


@dataclass
class _Foreign:
    """A node of a file in another quantized format (QOperator, dynamic): its output read
    as reals and compared with the FP32 tensor it stands for (inherited error only)."""

    node: Node
    value: str  # scoped name of the value read from the quantized run
    fp32: str  # scoped name of the FP32 tensor it stands for
    scale: np.ndarray | None = None  # None: the value is already float
    zero_point: np.ndarray | None = None


def _foreign(
    model: Model, prefix: str, fnames: set[str], taken: set[int], fused: Mapping[str, str]
) -> list[_Foreign]:
    """The QOperator / dynamic-quantization nodes of ``model`` whose output can be matched
    with an FP32 tensor (by name, or by name without ONNX Runtime's suffixes). ``fused``:
    FP32 tensor -> the output of the Relu / Clip that alone reads it, where the quantized
    model has no such output (ONNX Runtime folds the activation into the layer's output
    range: the layer's output stands for the activation's)."""

    def match(name: str) -> str | None:
        for cand in [name] + [name[: -len(x)] for x in _ORT_SUFFIXES if name.endswith(x)]:
            if prefix + cand in fnames:
                return prefix + cand
        return None

    out: list[_Foreign] = []
    for n in model.graph.nodes:
        if id(n) in taken or not n.outputs or n.outputs[0] is None:
            continue
        y = n.outputs[0]
        if n.op_type in QLINEAR_OUT and n.op_type != "QuantizeLinear":
            si, zi = QLINEAR_OUT[n.op_type]
            scale, zp = _const(n.input(si)), _const(n.input(zi))
            ref = match(y.name)
            ref = fused.get(ref, ref) if ref is not None else None
            if scale is not None and ref is not None:
                zp = np.zeros((), np.float64) if zp is None else zp
                out.append(_Foreign(n, prefix + y.name, ref, scale.astype(np.float64), zp.astype(np.float64)))
        elif n.op_type in DYNAMIC_FLOAT_OPS:
            # the first output the FP32 model has (an LSTM's Y may be unused, Y_h read)
            found = [(o, r) for o in n.outputs if o is not None and (r := match(o.name)) is not None]
            if found:
                out.append(_Foreign(n, prefix + found[0][0].name, found[0][1]))
        elif n.op_type in INTEGER_FLOAT_OPS:
            v: Value | None = y
            hops = 0
            while v is not None and hops < 4:  # follow Cast / Mul / Add to the float result
                ref = match(v.name)
                if ref is not None and hops > 0:
                    out.append(_Foreign(n, prefix + v.name, ref))
                    break
                users = [u for u in v.consumers() if u.op_type in _DYNAMIC_TAIL]
                v = users[0].outputs[0] if len(users) == 1 and users[0].outputs else None
                hops += 1
    return out


def _derived(
    qscopes: list[tuple[str, Model]], fnames: set[str]
) -> dict[str, tuple[Node, list[tuple[str, Any]]]]:
    """Float tensors of the quantized model that the FP32 model lacks but computes one
    float node away: scoped name -> (the quantized model's node that writes it, its
    arguments as ("float", FP32 tensor) | ("const", array) | ("none", None)).

    SmoothQuant (docs/debugger.md eq. (13)) writes x / s under the name ``x_smooth``,
    by a float Mul of an FP32 tensor and a constant; the layers that read it are
    the ones with most of the weights' error, and their local error (eq. (4)) needs
    the FP32 value of what they read: that Mul run on the FP32 tensor."""
    out: dict[str, tuple[Node, list[tuple[str, Any]]]] = {}
    for prefix, m in qscopes:
        for n in m.graph.nodes:
            if n.op_type in QUANT_OPS or len(n.outputs) != 1 or n.outputs[0] is None:
                continue
            name = prefix + n.outputs[0].name
            if name in fnames:
                continue
            args: list[tuple[str, Any]] = []
            for v in n.inputs:
                if v is None:
                    args.append(("none", None))
                elif v.is_const:
                    args.append(("const", np.asarray(v.const)))
                elif prefix + v.name in fnames:
                    args.append(("float", prefix + v.name))
                else:
                    break
            else:
                if any(k == "float" for k, _ in args):
                    out[name] = (n, args)
    return out


# ------------------------------------------------------------------------------ runs


def _executor(model: Model):
    from quanta.runtime.compile import compile as compile_model
    from quanta.runtime.execute import BoundRun, Executor

    class _Unplanned(Executor):
        """The reference steps bound without an arena: none of them writes into one, and
        planning it (quadratic in the live values of a graph as written, Q/DQ pairs
        included) took longer than the runs it served (14 s per signature on a 700-node
        graph)."""

        def _bind(self, specs, captured=None, *, speculate=False, root_values=None):
            if any(s.kernel.out for s in self.plan.steps):
                return super()._bind(specs, captured, speculate=speculate, root_values=root_values)
            # bound unspeculatively whatever ``speculate`` says: no values fixed only
            # while roots are checked
            steps = list(self._plain)
            self._specialize(steps, specs, self._static_only(captured or {}), {})
            return BoundRun(steps, specs, None)

    return _Unplanned(compile_model(model, "reference", passes=[]))


def _along(param: np.ndarray, x: np.ndarray) -> np.ndarray:
    """A per-tensor or per-channel (axis 1, as QLinearConv's channels) parameter shaped to
    broadcast against ``x``."""
    if param.size <= 1 or x.ndim < 2:
        return param.reshape(()) if param.size == 1 else param
    return param.reshape((1, -1) + (1,) * (x.ndim - 2))


def _run(
    exe,
    model: Model,
    feed: Mapping[str, np.ndarray],
    wanted: set[str],
    shapes: dict[str, tuple[int, ...]] | None = None,
) -> tuple[dict[str, np.ndarray], list]:
    """Run ``exe`` on ``feed``: the ``wanted`` values and the outputs; ``shapes`` (when
    given) takes the shape of every value the run produces (:func:`_widest`)."""
    got: dict[str, np.ndarray] = {k: np.asarray(v) for k, v in feed.items() if k in wanted}
    if shapes is not None:
        for k, v in feed.items():
            _widest(shapes, k, np.shape(v))

    def keep(name: str, arr: Any) -> None:
        if shapes is not None and isinstance(arr, np.ndarray):
            _widest(shapes, name, arr.shape)
        if name in wanted and isinstance(arr, np.ndarray):
            got[name] = arr

    outs = exe.run(dict(feed), [v.name for v in model.graph.outputs], on_value=keep)
    return got, outs


def _widest(shapes: dict[str, tuple[int, ...]], name: str, shape: tuple[int, ...]) -> None:
    """Keep the elementwise largest shape seen for ``name`` (of one rank: a value whose
    rank changes keeps its first): the same whatever the order of the feeds or shards."""
    mine = shapes.get(name)
    if mine is None:
        shapes[name] = tuple(int(d) for d in shape)
    elif len(mine) == len(shape):
        shapes[name] = tuple(max(int(a), int(b)) for a, b in zip(mine, shape))


def _local(
    target: _Target, fvals: Mapping[str, np.ndarray], evaluate: Callable, wcache: dict
) -> np.ndarray | None:
    """Eq. (4)'s q for one node: its FP32 inputs through its own Q/DQ, the op, the output Q/DQ."""
    args: list[np.ndarray | None] = []
    for kind, src in target.sources:
        if kind == "none":
            args.append(None)
        elif kind == "const":
            args.append(src)
        elif kind == "float":
            if src not in fvals:
                return None
            args.append(fvals[src])
        elif kind == "wdq":
            key = id(src)
            if key not in wcache:
                wcache[key] = evaluate(src, [None if v is None else np.asarray(v.const) for v in src.inputs])[
                    0
                ]
            args.append(wcache[key])
        else:
            args.append(_qdq(src, fvals.get(src.x), evaluate))
            if args[-1] is None:
                return None
    y = evaluate(target.node, args)[0]
    if target.out_pair is not None:
        y = _qdq(target.out_pair, y, evaluate)
    return y


def _qdq(p: _Pair, x: np.ndarray | None, evaluate: Callable) -> np.ndarray | None:
    if x is None:
        return None
    qargs = [x] + [np.asarray(v.const) if v is not None else None for v in p.q.inputs[1:]]
    code = evaluate(p.q, qargs)[0]
    dargs = [code] + [np.asarray(v.const) if v is not None else None for v in p.dq.inputs[1:]]
    return evaluate(p.dq, dargs)[0]


# ------------------------------------------------------------------------------ calibration diagnostics


#: eq. (5c): RMS of a tensor over RMS of the white-noise probe where the quantized model
#: has no error of that tensor to probe with (36 dB: an 8-bit tensor's inherited error)
PROBE_RATIO = 64.0

#: eq. (8) SQNR above which a tensor's entropy range is not computed
GOOD_DB = 40.0


def _diagnose(t: TensorRow, hist) -> None:
    """Fill ``t``'s calibration diagnostics from a streaming histogram of the FP32 values
    (eqs. (8), (9)) and pick the recommendation."""
    from quanta.calibrate.entropy import EntropyObserver
    from quanta.calibrate.mse import MSEObserver, QuantizationErrorModel
    from quanta.calibrate.percentile import PercentileObserver

    if hist is None or hist._min is None:
        return
    view = hist.view(0)
    if view.counts.size == 0:
        return
    t.observed = (view.lo, view.hi)
    model = QuantizationErrorModel(view)
    signal = float(model.c2[-1])
    levels = t.qmax - t.qmin

    def sqnr(lo: float, hi: float, steps: int = levels) -> float:
        lo, hi = min(lo, 0.0), max(hi, 0.0)
        s = (hi - lo) / steps if hi > lo else 1.0
        return db(signal, float(model.error(lo, hi, s)))

    t.chosen_sqnr_db = db(signal, float(model.error(t.chosen[0], t.chosen[1], t.scale)))
    choices = {"minmax": (view.lo, view.hi)}
    methods: list[tuple[str, type, dict[str, Any]]] = [
        ("percentile", PercentileObserver, {"percentile": 99.99}),
        ("entropy", EntropyObserver, {}),
        ("mse", MSEObserver, {"qmin": t.qmin, "qmax": t.qmax, "symmetric": False}),
    ]
    if t.chosen_sqnr_db >= GOOD_DB:
        # the KL search costs ~0.1 s per tensor; a tensor this good is not what a
        # better range would fix
        methods = [m for m in methods if m[0] != "entropy"]
    for name, cls, cfg in methods:
        try:
            r = hist.convert(cls, **cfg).range()
            choices[name] = (float(r.min), float(r.max))
        except Exception:  # a method that cannot read this histogram (e.g. too few values)
            continue
    t.methods = [MethodChoice(k, lo, hi, sqnr(lo, hi)) for k, (lo, hi) in choices.items()]
    t.int16_sqnr_db = sqnr(view.lo, view.hi, 65535)
    try:
        r = hist.convert(PercentileObserver, percentile=99.9).range()
        pct = (float(r.min), float(r.max))
    except Exception:  # too few values for a percentile: no outlier measure
        pct = (view.lo, view.hi)
    big = max(abs(view.lo), abs(view.hi))
    mid = max(abs(pct[0]), abs(pct[1]))
    t.outlier_ratio = big / mid if mid > 0 else 1.0
    edges = view.edges()
    counts = view.counts
    if counts.size > 128:  # a coarser copy for the report (the full grid has up to 4096 bins)
        f = -(-counts.size // 128)
        pad = (-counts.size) % f
        counts = np.concatenate([counts, np.zeros(pad)]).reshape(-1, f).sum(1)
        edges = np.concatenate([edges[:-1:f], [edges[-1] + pad * view.width]])
    t.histogram = (edges.tolist(), counts.tolist())
    best = t.best_method()
    if best is not None and best.sqnr_db > t.chosen_sqnr_db + 1.0:
        t.recommendation = (
            f"calibrate with {best.method}: range [{best.lo:.4g}, {best.hi:.4g}] gives {best.sqnr_db:.1f} dB "
            f"on this data (now {t.chosen_sqnr_db:.1f} dB)"
        )
    elif t.clipped > 1e-3:
        t.recommendation = f"widen the range: {t.clipped * 100:.2f} % of the values clip"
    elif t.chosen_sqnr_db < 30.0 and t.int16_sqnr_db > t.chosen_sqnr_db + 10:
        t.recommendation = (
            f"int16 activations: {t.int16_sqnr_db:.1f} dB on this data (int8: {t.chosen_sqnr_db:.1f} dB; "
            f"outliers {t.outlier_ratio:.1f}x the 99.9th percentile)"
        )


# ------------------------------------------------------------------------------ compare


#: What the report says of a reference derived from the quantized file itself
DERIVED_REFERENCE = (
    "derived from the quantized file itself (no FP32 model given): its weights dequantized, "
    "its activation quantization removed, its integer operators replaced by their float "
    "forms; the error shown is the activation quantization's (and the dynamic "
    "quantization's), the weights' rounding is in both models"
)


def derived_reference(quantized: str | os.PathLike | onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """The float view of ``quantized`` as the FP32 reference, and the sentence the report
    carries about it."""
    from quanta.quantize.float_view import derive_float_view

    view = derive_float_view(quantized)
    return view.model, f"{DERIVED_REFERENCE} ({view.format()})"


def compare(
    fp32: str | os.PathLike | onnx.ModelProto | Model | None,
    quantized: str | os.PathLike | onnx.ModelProto | Model,
    data: Any,
    *,
    limit: int | None = None,
    ablation: int = 0,
    ablation_mode: str = "only",
    histograms: bool = True,
    engine: Any = None,
    workers: int | None = None,
    address: str | None = None,
) -> DebugResult:
    """Layer-wise error of ``quantized`` (a QDQ model) against ``fp32`` on ``data`` (any
    form calibration accepts). ``ablation``: also measure, for the ``ablation`` nodes of
    largest estimated contribution (eq. (5e)), the output SQNR with that node alone
    quantized (``ablation_mode="only"``, eq. (6b): its measured contribution) or alone
    float (``"float"``, eq. (6): what keeping it float wins); one extra pass over the
    data per node.

    ``engine`` ("local", "ray", an engine of :mod:`quanta.scale`; ``workers``,
    ``address`` as for calibration): the samples are split into contiguous shards, each
    shard's statistics gathered where the engine runs it and merged here in shard order
    (:class:`_Stats`: exact sums, counts, maxima, histograms), so the result is the
    single process's, bit for bit. The ablation passes run here.

    ``fp32`` None: the reference is the quantized file's own float view
    (:func:`derived_reference`), for a file shipped without its float original; the
    result's ``reference`` says so."""
    if ablation_mode not in ABLATION_MODES:
        raise ValueError(f"ablation_mode must be one of {ABLATION_MODES}, not {ablation_mode!r}")
    reference = ""
    if fp32 is None:
        if isinstance(quantized, Model):
            from quanta.ir.onnx_io import to_proto

            quantized = to_proto(quantized)
        fp32, reference = derived_reference(quantized)
    fmodel = _load(fp32, "fp32")
    qmodel = _load(quantized, "quantized")
    plan = _Plan(fmodel, qmodel, histograms)
    if engine is None or engine == "inprocess":
        from quanta.calibrate.readers import iter_feeds

        stats = plan.stats()
        for feed in iter_feeds(data, fmodel.graph.inputs, limit=limit):
            plan.observe(stats, feed)
    else:
        from quanta.calibrate.readers import sample_refs
        from quanta.scale.calibrate import split
        from quanta.scale.engines import make_engine

        eng = make_engine(engine, workers, address)
        refs = sample_refs(data, fmodel.graph.inputs, limit=limit)
        items = [(i, [refs[k] for k in r]) for i, r in enumerate(split(len(refs), eng.workers))]
        shards = eng.map(_stats_of_shard, _CompareJob(fmodel, qmodel, histograms), items)
        stats = shards[0] if shards else plan.stats()
        for other in shards[1:]:
            stats.merge_in_place(other)
    if stats.samples == 0:
        from quanta.calibrate.readers import CalibrationDataError

        raise CalibrationDataError("debug data is empty: no sample was read")
    result = plan.finish(stats)
    result.reference = reference
    if ablation > 0:
        _ablate(result, plan, data, limit, result.worst(ablation), ablation_mode)
    return result


@dataclass
class _Stats:
    """Everything :func:`compare` gathers over the samples, mergeable exactly: per node
    its local / inherited :class:`ErrorStats`, per output its ErrorStats, the top-1
    agreement counts, per activation pair its clipped / total counts, the codes it used
    and a histogram of its FP32 values, the sample count. ``a.merge_in_place(b)`` is the
    state of a's samples then b's (sums, counts, maxima, unions, histogram merges: none
    depends on the order)."""

    local: list[ErrorStats | None]
    inherited: list[ErrorStats | None]
    foreign: list[ErrorStats]
    outputs: dict[str, ErrorStats]
    agree: list[int]
    clipped: dict[str, list[int]]
    codes: dict[str, np.ndarray]
    hists: dict[str, Any]
    gains: dict[tuple[int, int, int], tuple[ErrorStats, ErrorStats]]
    samples: int = 0
    # the widest shape of every value of the quantized model seen on the feeds: the MACs
    # of dimensions the file leaves symbolic (coverage counts them as 1 without it)
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)

    def merge_in_place(self, other: _Stats) -> _Stats:
        for mine, theirs in ((self.local, other.local), (self.inherited, other.inherited)):
            for a, b in zip(mine, theirs, strict=True):
                if a is not None and b is not None:
                    a.merge_in_place(b)
        for a, b in zip(self.foreign, other.foreign, strict=True):
            a.merge_in_place(b)
        for name, st in other.outputs.items():
            self.outputs[name].merge_in_place(st)
        self.agree = [a + b for a, b in zip(self.agree, other.agree)]
        for name, (c, t) in other.clipped.items():
            self.clipped[name] = [self.clipped[name][0] + c, self.clipped[name][1] + t]
        for name, used in other.codes.items():
            self.codes[name] = self.codes[name] | used
        for name, h in other.hists.items():
            mine = self.hists[name]
            self.hists[name] = mine.merge_in_place(h) if mine.can_merge_in_place() else mine.merge(h)
        for key, (out_st, in_st) in other.gains.items():
            if key in self.gains:
                self.gains[key][0].merge_in_place(out_st)
                self.gains[key][1].merge_in_place(in_st)
            else:
                self.gains[key] = (out_st, in_st)
        self.samples += other.samples
        for name, shape in sorted(other.shapes.items()):
            _widest(self.shapes, name, shape)
        return self


class _Plan:
    """What :func:`compare` measures, built from the two models alone (so every shard
    builds the same one): the quantized nodes and activation pairs, the tensors each
    run must hand back, the executors."""

    def __init__(self, fmodel: Model, qmodel: Model, histograms: bool, gains: bool = True) -> None:
        from quanta.runtime.compile import reference_evaluator

        self.fmodel, self.qmodel, self.histograms = fmodel, qmodel, histograms
        pairs: dict[str, _Pair] = {}
        self.targets: list[_Target] = []
        self.weights: list[WeightRow] = []
        # the bodies of If / Loop / Scan nodes too: the runs report their values scoped
        fnames = {prefix + v.name for prefix, m in _scopes(fmodel) for v in m.graph.values()}
        qscopes = _scopes(qmodel)
        qnames = {prefix + v.name for prefix, m in qscopes for v in m.graph.values()}
        fused = {
            prefix + v.name: prefix + v.consumers()[0].outputs[0].name
            for prefix, m in _scopes(fmodel)
            for v in m.graph.values()
            if len(v.consumers()) == 1
            and v.consumers()[0].op_type in ("Relu", "Clip")
            and prefix + v.consumers()[0].outputs[0].name not in qnames
        }
        self.foreign: list[_Foreign] = []
        for prefix, m in qscopes:
            scope_pairs = _pairs(m, prefix)
            pairs.update(scope_pairs)
            scope_targets, scope_weights = _targets(m, scope_pairs, prefix)
            self.targets += scope_targets
            self.weights += scope_weights
            taken = {id(x.node) for x in scope_targets} | {
                id(n) for p in scope_pairs.values() for n in (p.q, p.dq)
            }
            self.foreign += _foreign(m, prefix, fnames, taken, fused)
        self.fnames = fnames
        needed = {n for t in self.targets for n in t.float_inputs if n not in fnames}
        self.derived = {k: v for k, v in _derived(qscopes, fnames).items() if k in needed}
        self.evaluate = reference_evaluator(qmodel.opset_imports)
        self.wcache: dict = {}
        # what each run must hand back, per feed
        self.q_wanted: set[str] = set()
        self.f_wanted: set[str] = set()
        self.unmatched: list[str] = []
        self.rows: list[NodeRow] = []
        for t in self.targets:
            y = t.output
            self.q_wanted.add(t.q_output)
            self.f_wanted.add(y)
            for name in t.float_inputs:
                if name in self.derived:
                    self.f_wanted.update(a for k, a in self.derived[name][1] if k == "float")
                else:
                    self.f_wanted.add(name)
            missing = [n for n in [y, *t.float_inputs] if n not in fnames and n not in self.derived]
            self.unmatched.extend(m for m in missing if m not in self.unmatched)
            self.rows.append(
                NodeRow(
                    t.prefix + t.node.name if t.node.name else f"{t.node.op_type}:{y}",
                    t.node.op_type,
                    y,
                    t.float_inputs,
                    local=None if missing else ErrorStats(),
                    inherited=None if y not in fnames else ErrorStats(),
                    scale=t.out_pair.scale if t.out_pair else None,
                )
            )
        self.foreign_rows: list[NodeRow] = []
        for fo in self.foreign:
            self.q_wanted.add(fo.value)
            self.f_wanted.add(fo.fp32)
            name = fo.node.name or f"{fo.node.op_type}:{fo.value}"
            self.foreign_rows.append(NodeRow(name, fo.node.op_type, fo.fp32, [], inherited=ErrorStats()))
        self.tensors: dict[str, TensorRow] = {}
        self.hist_names: list[str] = []
        for p in pairs.values():
            if p.x in self.tensors:
                continue
            self.tensors[p.x] = TensorRow(p.x, p.producer, p.scale, p.zero_point, p.qmin, p.qmax)
            self.q_wanted.update({p.x, p.name(p.q.outputs[0])})
            if p.x in fnames and histograms:
                self.hist_names.append(p.x)
                self.f_wanted.add(p.x)
        self.pair_of: dict[str, _Pair] = {}
        for p in pairs.values():
            self.pair_of.setdefault(p.x, p)
        self.output_names = [v.name for v in qmodel.graph.outputs if v.name in fnames]
        self.fexe, self.qexe = _executor(fmodel), _executor(qmodel)
        self.gains = gains
        self.fevaluate = reference_evaluator(fmodel.opset_imports)
        # eq. (5c): every non-constant input of every FP32 node is an edge whose gain is
        # measured with the quantized model's error of that tensor as the probe
        self.probe_of: dict[str, str] = {}
        self.edges: list[tuple[int, int]] = []
        if gains:
            for j, n in enumerate(fmodel.graph.nodes):
                for k, v in enumerate(n.inputs):
                    if v is None or v.is_const:
                        continue
                    self.edges.append((j, k))
                    self.f_wanted.add(v.name)
                    self.f_wanted.update(o.name for o in n.outputs if o is not None)
                    pair = self.pair_of.get(v.name)
                    if pair is not None and not pair.prefix:
                        self.probe_of[v.name] = pair.name(pair.dq.outputs[0])
                    elif v.name in qnames:
                        self.probe_of[v.name] = v.name
            self.q_wanted.update(self.probe_of.values())

    def stats(self) -> _Stats:
        """An empty state."""
        from quanta.calibrate.histogram import HistogramObserver

        return _Stats(
            local=[None if r.local is None else ErrorStats() for r in self.rows],
            inherited=[None if r.inherited is None else ErrorStats() for r in self.rows],
            foreign=[ErrorStats() for _ in self.foreign_rows],
            outputs={name: ErrorStats() for name in self.output_names},
            agree=[0, 0],
            clipped={k: [0, 0] for k in self.tensors},
            codes={p.x: np.zeros(p.qmax - p.qmin + 1, bool) for p in self.pair_of.values()},
            hists={name: HistogramObserver() for name in self.hist_names},
            gains={},
        )

    def observe(self, st: _Stats, feed: Mapping[str, np.ndarray]) -> None:
        """Both models on one feed, its statistics added to ``st``."""
        fmodel, qmodel = self.fmodel, self.qmodel
        fvals, fouts = _run(self.fexe, fmodel, feed, self.f_wanted)
        for name, (node, args) in self.derived.items():
            if all(k != "float" or a in fvals for k, a in args):
                fvals[name] = self.evaluate(node, [fvals[a] if k == "float" else a for k, a in args])[0]
        qvals, qouts = _run(self.qexe, qmodel, feed, self.q_wanted, st.shapes)
        fout = dict(zip([v.name for v in fmodel.graph.outputs], fouts))
        qout = dict(zip([v.name for v in qmodel.graph.outputs], qouts))
        for name, es in st.outputs.items():
            r, q = np.asarray(fout[name]), np.asarray(qout[name])
            es.add(r, q)
            rr = class_rows(r) if name == next(iter(st.outputs)) and r.ndim >= 2 else None
            qr = class_rows(q.reshape(r.shape)) if rr is not None else None
            if rr is not None and qr is not None:  # only outputs with a class axis
                a, b = rr.argmax(-1), qr.argmax(-1)
                st.agree[0] += int(np.sum(a == b))
                st.agree[1] += int(a.size)
        for t, row, loc_st, inh_st in zip(self.targets, self.rows, st.local, st.inherited):
            y = row.output
            if inh_st is not None:
                qy = qvals.get(t.q_output)
                if qy is not None and y in fvals:
                    inh_st.add(fvals[y], qy)
            if loc_st is not None and y in fvals:
                loc = _local(t, fvals, self.evaluate, self.wcache)
                if loc is not None:
                    loc_st.add(fvals[y], loc)
        if self.gains:
            self._observe_gains(st, fvals, qvals)
        for fo, fst in zip(self.foreign, st.foreign):
            qv, fv = qvals.get(fo.value), fvals.get(fo.fp32)
            if qv is None or fv is None:
                continue
            qv = np.asarray(qv, np.float64)
            if fo.scale is not None:
                zp = np.zeros((), np.float64) if fo.zero_point is None else fo.zero_point
                qv = (qv - _along(zp, qv)) * _along(fo.scale, qv)
            if qv.shape == np.shape(fv):
                fst.add(fv, qv)
        for name, p in self.pair_of.items():
            x = qvals.get(name)
            if x is not None:
                x = np.asarray(x, np.float64)
                lo, hi = (p.qmin - p.zero_point - 0.5) * p.scale, (p.qmax - p.zero_point + 0.5) * p.scale
                st.clipped[name][0] += int(np.sum((x < lo) | (x > hi)))
                st.clipped[name][1] += int(x.size)
            c = qvals.get(p.name(p.q.outputs[0]))
            if c is not None:
                st.codes[name][np.unique(np.asarray(c).astype(np.int64)) - p.qmin] = True
            if name in st.hists and name in fvals:
                st.hists[name].observe(np.asarray(fvals[name], np.float32))
        st.samples += 1

    def _observe_gains(
        self, st: _Stats, fvals: Mapping[str, np.ndarray], qvals: Mapping[str, np.ndarray]
    ) -> None:
        """Eq. (5c)'s sums for one feed: per edge (node j, input k, output o) of the FP32
        graph, Σ ‖f_j(x_k + e_k) − f_j(x_k)‖²_o and Σ ‖e_k‖², e_k the quantized model's
        error of x_k (what reaches j when the model runs quantized)."""
        nodes = self.fmodel.graph.nodes
        for j, k in self.edges:
            n = nodes[j]
            v = n.inputs[k]
            name = "" if v is None else v.name
            x, probe = fvals.get(name), self.probe_of.get(name)
            if x is None or x.dtype.kind != "f" or x.size == 0:
                continue
            xq = None if probe is None else qvals.get(probe)
            if xq is None or np.shape(xq) != x.shape:
                # a tensor the quantized model has under another name (x_smooth holds
                # x / s) or not at all: white noise at 1/64 of its RMS, the same
                # pattern for every feed (seeded by the edge), so shards agree
                # over the finite values: a -inf attention mask stays the mask it is
                finite = np.isfinite(x)
                rms = float(np.sqrt(np.mean(np.square(x[finite], dtype=np.float64)))) if finite.any() else 0.0
                if rms == 0.0:
                    continue
                noise = np.random.default_rng((j, k)).standard_normal(x.shape) * (rms / PROBE_RATIO)
                xq = np.where(finite, x + noise, x).astype(x.dtype)
            # no error where both are the same infinity (a mask both models carry)
            with np.errstate(invalid="ignore"):
                e = np.asarray(xq, x.dtype) - x
            e = np.where(np.isnan(e) & (np.asarray(xq) == x), 0, e).astype(x.dtype)
            if not np.any(e):
                continue
            args = [
                None if v is None else (np.asarray(v.const) if v.is_const else fvals.get(v.name))
                for v in n.inputs
            ]
            if any(a is None and v is not None for a, v in zip(args, n.inputs)):
                continue
            args[k] = np.asarray(xq, x.dtype)
            try:
                outs = self.fevaluate(n, args)
            except Exception:  # an op the reference evaluator cannot run alone (a body): no edge
                continue
            for o, (v, y) in enumerate(zip(n.outputs, outs)):
                r = None if v is None else fvals.get(v.name)
                if r is None or not isinstance(y, np.ndarray) or r.dtype.kind != "f" or y.shape != r.shape:
                    continue
                out_st, in_st = st.gains.setdefault((j, k, o), (ErrorStats(), ErrorStats()))
                out_st.add(r, y)
                in_st.add(x, xq)

    def finish(self, st: _Stats) -> DebugResult:
        """The result from the statistics of all samples."""
        for row, loc, inh in zip(self.rows, st.local, st.inherited):
            row.local, row.inherited = loc, inh
        for row, inh in zip(self.foreign_rows, st.foreign):
            row.inherited = inh
        for name, trow in self.tensors.items():
            trow.clipped = st.clipped[name][0] / max(st.clipped[name][1], 1)
            trow.levels_used = int(st.codes[name].sum())
            _diagnose(trow, st.hists.get(name))
        gamma = _downstream_gains(self.fmodel, st.gains, self.output_names) if self.gains else None
        out_signal = sum(es.signal for es in st.outputs.values())
        _attribute(self.rows, gamma, out_signal)
        result = DebugResult(
            nodes=self.rows + [r for r in self.foreign_rows if r.inherited is not None and r.inherited.count],
            tensors=list(self.tensors.values()),
            weights=self.weights,
            outputs=st.outputs,
            top1_agreement=st.agree[0] / st.agree[1] if st.agree[1] else None,
            samples=st.samples,
            unmatched=self.unmatched,
        )
        _recommend(result, self.qmodel)
        _coverage(result, self.qmodel, st.shapes)
        return result


@dataclass(frozen=True)
class _CompareJob:
    """What every debugger shard shares: the two models, sent as ONNX bytes (the IR's
    linked Values and Nodes pickle recursively)."""

    fmodel: Model
    qmodel: Model
    histograms: bool

    def __getstate__(self) -> dict[str, Any]:
        from quanta.ir.onnx_io import to_proto

        return {
            "fmodel": to_proto(self.fmodel).SerializeToString(),
            "qmodel": to_proto(self.qmodel).SerializeToString(),
            "histograms": self.histograms,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        from quanta.ir.onnx_io import from_proto

        for key in ("fmodel", "qmodel"):
            proto = onnx.ModelProto()
            proto.ParseFromString(state[key])
            object.__setattr__(self, key, from_proto(proto, f"debug job ({key})"))
        object.__setattr__(self, "histograms", state["histograms"])


def _stats_of_shard(job: _CompareJob, shard: tuple[int, list]) -> _Stats:
    """One shard's statistics (what a worker of :func:`compare` runs)."""
    from quanta.calibrate.readers import load_sample

    _, refs = shard
    plan = _Plan(job.fmodel, job.qmodel, job.histograms)
    names = [v.name for v in job.fmodel.graph.inputs]
    st = plan.stats()
    for ref in refs:
        plan.observe(st, load_sample(ref, names, None))
    return st


def _downstream_gains(
    model: Model, gains: Mapping[tuple[int, int, int], tuple[ErrorStats, ErrorStats]], outputs: list[str]
) -> dict[str, float]:
    """Eq. (5d): Γ(t) per FP32 tensor, the output error energy per unit of error energy
    at t, from the edge gains of eq. (5c) summed backwards over the graph."""
    gamma: dict[str, float] = {name: 1.0 for name in outputs}
    nodes = model.graph.nodes
    for j in range(len(nodes) - 1, -1, -1):
        n = nodes[j]
        for k, v in enumerate(n.inputs):
            if v is None or v.is_const:
                continue
            acc = 0.0
            for o, y in enumerate(n.outputs):
                g = gains.get((j, k, o))
                if y is None or g is None or y.name not in gamma or g[1].noise <= 0.0:
                    continue
                acc += g[0].noise / g[1].noise * gamma[y.name]
            if acc > 0.0:
                gamma[v.name] = gamma.get(v.name, 0.0) + acc
    return gamma


def _attribute(
    rows: list[NodeRow], gamma: Mapping[str, float] | None = None, out_signal: float = 0.0
) -> None:
    """Each node's share of the estimated output error: eq. (5e) where the node's output
    has a downstream gain Γ (eq. (5d)), else eq. (5) (the relative error passed on as it is)."""
    energy = []
    for r in rows:
        loc = r.local
        if loc is None or not math.isfinite(loc.nsr) or loc.nsr == 0.0:
            energy.append(0.0)
            r.gain = None
            continue
        g = None if gamma is None else gamma.get(r.output)
        if g is not None and out_signal > 0.0:
            r.gain = g * loc.signal / out_signal
        else:
            r.gain = None if gamma is not None else 1.0
        # eq. (5e): Γ(y)·Σ(r − q_local)², as output NSR: g·NSR_local
        energy.append(loc.nsr * (1.0 if r.gain is None else r.gain))
    total = sum(energy)
    for r, v in zip(rows, energy):
        r.contribution = v / total if total > 0 else 0.0


def _recommend(result: DebugResult, qmodel: Model) -> None:
    """A suggested fix per node, from the diagnostics of the tensors it reads and writes."""
    by_name = {t.name: t for t in result.tensors}
    wspread = {w.consumer: w for w in result.weights}
    for r in result.nodes:
        out_t = by_name.get(r.output)
        in_t = [by_name[i] for i in r.inputs if i in by_name]
        recs = [t for t in [out_t, *in_t] if t is not None and t.recommendation]
        w = wspread.get(r.name)
        if recs:
            worst = min(recs, key=lambda t: t.chosen_sqnr_db)
            r.recommendation = f"{worst.name}: {worst.recommendation}"
        elif w is not None and w.channels == 1:
            r.recommendation = "per-channel weights (per_channel=True)"
        elif r.local is not None and r.local.sqnr_db < 20.0:
            r.recommendation = f"keep float: exclude=['{r.name}']"


def _coverage(
    result: DebugResult, qmodel: Model, shapes: Mapping[str, tuple[int, ...]] | None = None
) -> None:
    try:
        from quanta.runtime.coverage import lowered_coverage

        rep = lowered_coverage(qmodel, dict(shapes) if shapes else None)
    except Exception:  # coverage is a summary; a model it cannot lower still gets its rows
        return
    result.integer_share = rep.integer_share
    result.float_nodes = [(c.name, c.op) for c in rep.nodes if not c.integer_op and c.macs]


def _bypass(proto: onnx.ModelProto, node_name: str) -> onnx.ModelProto:
    """A copy of ``proto`` where node ``node_name`` reads its activations before their
    Q/DQ and its output skips its Q/DQ: that node alone runs in float (its weights keep
    their rounding)."""
    p = onnx.ModelProto()
    p.CopyFrom(proto)
    g = p.graph
    prod = {o: n for n in g.node for o in n.output}
    inits = {i.name for i in g.initializer}
    target = next((n for n in g.node if n.name == node_name), None)
    if target is None:
        return p
    for i, name in enumerate(target.input):
        dq = prod.get(name)
        if dq is None or dq.op_type != "DequantizeLinear":
            continue
        q = prod.get(dq.input[0])
        if q is not None and q.op_type == "QuantizeLinear" and q.input[0] not in inits:
            target.input[i] = q.input[0]
    y = target.output[0]
    for q in [n for n in g.node if n.op_type == "QuantizeLinear" and n.input[0] == y]:
        for dq in [n for n in g.node if n.op_type == "DequantizeLinear" and n.input[0] == q.output[0]]:
            for n in g.node:
                for k, name in enumerate(n.input):
                    if name == dq.output[0]:
                        n.input[k] = y
            for o in g.output:
                if o.name == dq.output[0]:
                    o.name = y
    return p


def _isolate(
    fproto: onnx.ModelProto,
    qproto: onnx.ModelProto,
    target: _Target,
    derived: Mapping[str, tuple[Node, list[tuple[str, Any]]]],
) -> onnx.ModelProto:
    """The FP32 model with node ``target`` alone quantized (eq. (6b)): its output computed
    as in eq. (4) (its FP32 inputs through the quantized model's Q/DQ, its quantized
    weights, the op, its output's Q/DQ) and everything else in float."""
    p = onnx.ModelProto()
    p.CopyFrom(fproto)
    g = p.graph
    y = target.output
    producers = [k for k, n in enumerate(g.node) if y in n.output]
    if len(producers) != 1:
        raise ValueError(
            f"ablation: node '{target.node.name}': the FP32 model has no single producer of '{y}'"
        )
    del g.node[producers[0]]
    by_output = {n.output[0]: n for n in qproto.graph.node if n.output}
    pfx = f"__ablate_{target.node.name}__/"
    new: list[onnx.NodeProto] = []
    inits: dict[str, onnx.TensorProto] = {}

    def const(name: str, arr: Any) -> str:
        inits.setdefault(pfx + name, onnx.numpy_helper.from_array(np.asarray(arr), pfx + name))
        return pfx + name

    def copy(node: Node, ins: list[str], outs: list[str]) -> str:
        n = onnx.NodeProto()
        n.CopyFrom(by_output[node.outputs[0].name])
        del n.input[:], n.output[:]
        n.input.extend(ins)
        n.output.extend(outs)
        n.name = pfx + n.name
        new.append(n)
        return outs[0]

    def params(node: Node) -> list[str]:
        return [const(v.name, v.const) if v is not None else "" for v in node.inputs[1:]]

    args: list[str] = []
    for kind, src in target.sources:
        if kind == "none":
            args.append("")
        elif kind == "const":
            args.append(const(f"const{len(args)}", src))
        elif kind == "float":
            args.append(src)
        elif kind == "wdq":
            w = src.inputs[0]
            args.append(copy(src, [const(w.name, w.const), *params(src)], [pfx + src.outputs[0].name]))
        else:
            x = src.x
            if x in derived:  # SmoothQuant's x / s: its float node, run on the FP32 tensor
                node, dargs = derived[x]
                ins = [
                    a if k == "float" else (const(f"{j}/{x}", a) if k == "const" else "")
                    for j, (k, a) in enumerate(dargs)
                ]
                x = copy(node, ins, [pfx + x])
            code = copy(src.q, [x, *params(src.q)], [pfx + src.q.outputs[0].name])
            args.append(copy(src.dq, [code, *params(src.dq)], [pfx + src.dq.outputs[0].name]))
    outs = [pfx + y if target.out_pair is not None else y] + [pfx + o.name for o in target.node.outputs[1:]]
    copy(target.node, args, outs)
    if target.out_pair is not None:
        q, dq = target.out_pair.q, target.out_pair.dq
        code = copy(q, [outs[0], *params(q)], [pfx + q.outputs[0].name])
        copy(dq, [code, *params(dq)], [y])
    g.initializer.extend(inits.values())
    # the new nodes go where their inputs are ready (the graph stays topologically sorted)
    ready = {i.name for i in g.input} | {i.name for i in g.initializer} | {""}
    order: list[onnx.NodeProto] = []
    pending = [*g.node, *new]
    while pending:
        rest = [n for n in pending if not all(i in ready for i in n.input)]
        for n in pending:
            if all(i in ready for i in n.input):
                order.append(n)
                ready.update(n.output)
        if len(rest) == len(pending):
            raise ValueError(f"ablation: node '{target.node.name}': cannot order the isolated graph")
        pending = [n for n in pending if n not in order]
    del g.node[:]
    g.node.extend(order)
    return p


#: ablation modes: eq. (6) "float" (only this node float), eq. (6b) "only" (only this node quantized)
ABLATION_MODES = ("only", "float")


def ablate(
    result: DebugResult,
    fp32: str | os.PathLike | onnx.ModelProto | Model,
    quantized: str | os.PathLike | onnx.ModelProto | Model,
    data: Any,
    nodes: Sequence[str],
    *,
    mode: str = "only",
    limit: int | None = None,
) -> None:
    """Eq. (6b) (``mode="only"``) or eq. (6) (``"float"``) for the rows of ``result``
    named in ``nodes`` (``compare(..., ablation=K)`` takes the K worst by eq. (5e); this
    takes any set, e.g. the union of several rankings' candidates): one pass each."""
    rows = {r.name: r for r in result.nodes}
    unknown = [n for n in nodes if n not in rows]
    if unknown:
        raise ValueError(f"ablate: no debugger row for node(s) {unknown[:5]}")
    plan = _Plan(_load(fp32, "fp32"), _load(quantized, "quantized"), False, gains=False)
    _ablate(result, plan, data, limit, [rows[n] for n in nodes], mode)


def _ablate(
    result: DebugResult,
    plan: _Plan,
    data: Any,
    limit: int | None,
    rows: Sequence[NodeRow],
    mode: str = "only",
) -> None:
    """Eq. (6b) (``mode="only"``) or eq. (6) (``"float"``) for ``rows``: one pass over
    the data each."""
    from quanta.calibrate.readers import iter_feeds
    from quanta.ir.onnx_io import from_proto, to_proto

    if mode not in ABLATION_MODES:
        raise ValueError(f"ablation mode must be one of {ABLATION_MODES}, not {mode!r}")
    fmodel, qmodel = plan.fmodel, plan.qmodel
    fproto, qproto = to_proto(fmodel), to_proto(qmodel)
    fexe = _executor(fmodel)
    target_of = {row.name: t for t, row in zip(plan.targets, plan.rows)}
    for r in rows:
        t = target_of.get(r.name)
        if mode == "only":
            if t is None or t.prefix or r.local is None:
                continue  # a node inside a body, or one whose inputs the FP32 model lacks
            m = from_proto(_isolate(fproto, qproto, t, plan.derived), "ablation")
        else:
            m = from_proto(_bypass(qproto, r.name), "ablation")
        exe = _executor(m)
        st = ErrorStats()
        # the FP32 outputs are recomputed each pass: memory stays one feed's
        for feed in iter_feeds(data, fmodel.graph.inputs, limit=limit):
            ref = fexe.run(dict(feed), [v.name for v in fmodel.graph.outputs])
            got = exe.run(dict(feed), [v.name for v in m.graph.outputs])
            for a, b in zip(ref, got):
                if np.asarray(a).dtype.kind == "f":
                    st.add(a, b)
        r.ablation_sqnr_db = st.sqnr_db
        result.ablation_passes += 1
    result.ablation_mode = mode


def ranking_overlap(result: DebugResult, k: int = 5) -> int:
    """How many of the ``k`` worst nodes by eq. (5e) are among the ``k`` worst by the
    ablation, over the nodes ablated: the lowest output SQNR with the node alone
    quantized (eq. (6b)) or the highest with it alone float (eq. (6)).

    The ablated nodes are the ones eq. (5e) ranks worst (``compare(..., ablation=K)``), so
    with K <= k both lists are every ablated node and the overlap is k by construction:
    the check needs more nodes ablated than ``k`` (every node, for the strict test)."""
    abl = [(r, r.ablation_sqnr_db) for r in result.nodes if r.ablation_sqnr_db is not None]
    if len(abl) <= k:
        raise ValueError(
            f"ranking_overlap: {len(abl)} node(s) ablated, top-{k} overlap needs more than {k} "
            "(compare(..., ablation=K) with K > k)"
        )
    by_est = [r.name for r, _ in sorted(abl, key=lambda p: -p[0].contribution)[:k]]
    sign = 1.0 if result.ablation_mode == "only" else -1.0
    by_abl = [r.name for r, _ in sorted(abl, key=lambda p: sign * p[1])[:k]]
    return len(set(by_est) & set(by_abl))
