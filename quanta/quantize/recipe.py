"""The quantization recipe: every decision of a quantization run, in one object.

A :class:`Recipe` is what ``quantize_static`` / ``quantize_dynamic`` take as options and
what ``--recipe FILE`` (YAML or JSON) loads, so a run can be reproduced: the output
model records the recipe it was made with in its metadata (``quanta.recipe``).

Defaults are the general-purpose settings most users should run:

- activations ``uint8`` asymmetric: the u8 x s8 form that VNNI runs natively, and what
  ONNX Runtime's CPU kernels prefer. Ranges from ``weighted_mse`` calibration: tensors
  read only by Conv/Gemm/MatMul with constant weights get the range that minimises the
  error those layers see (calibrate/weighted_mse.py, docs/calibration.md eqs.
  (22)-(23)); every other tensor MinMax or its MSE range, whichever set brings the
  quantized model's outputs closer to FP32 on the first calibration feeds (eq. (24),
  ``other_ranges``): MinMax loses a deep residual stack (an SVTR recognizer), MSE a
  Siamese network whose two branches meet in a Sub;
- weights ``int8`` symmetric **per channel** (one scale per output channel): per-tensor
  weight scales lose most of the accuracy of depthwise convolutions;
- bias ``int32`` with scale ``sx·sw`` (docs/quantization-math.md);
- Relu/Clip absorbed into the producer's range; graph outputs stay float (the last
  layer dequantizes), LayerNormalization, Gelu and Softmax's input stay float;
- LSTMs run as ONNX Runtime's DynamicQuantizeLSTM and GRUs as quanta::DynamicQuantizeGRU
  (int8 weights, X and H quantized per step at run time; quanta.quantize.recurrent) in
  both static and dynamic quantization; ``quantize_static`` keeps them float when they
  lose more than RECURRENT_LOSS_DB at the outputs (docs/calibration.md eq. (30)).
"""

from __future__ import annotations

import enum
import json
import os
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from quanta.ir.graph import Node
from quanta.ir.types import I4, I8, I16, U4, U8, U16, IntType

__all__ = [
    "DEFAULT_OP_TYPES",
    "CalibrationMethod",
    "Recipe",
    "RecipeError",
    "RecurrentMode",
    "SubgraphMode",
    "TensorOverride",
    "storage_from_name",
]


class RecipeError(ValueError):
    """An option or recipe file that quanta cannot use; names the option."""


class CalibrationMethod(enum.Enum):
    """The calibration methods by name; each has its row (observer factory, the Recipe
    fields it reads) in quantize/methods.py ``METHODS``."""

    MINMAX = "minmax"
    MOVING_AVERAGE = "moving_average"
    ENTROPY = "entropy"
    PERCENTILE = "percentile"
    MSE = "mse"
    # tensors read only by Conv/Gemm/MatMul with constant weights: the range that
    # minimises the error those layers see (calibrate/weighted_mse.py, eq. (22)); every
    # other tensor as Recipe.other_ranges says
    WEIGHTED_MSE = "weighted_mse"


#: Recipe.other_ranges: how the tensors outside eq. (22) get their range
OTHER_RANGES = ("auto", "minmax", "mse")
WEIGHT_ROUNDING = ("gptq", "gptq_cd", "gptaq", "brecq", "nearest")
#: Recipe.weight_pairs: "ort" keeps every pair of int8 codes ONNX Runtime's saturating
#: u8·s8 kernels add in int16 inside it (quanta.quantize.ort_pairs, eq. (12m)); "ort_rows"
#: also lets each GPTQ-rounded output row take the 7-bit grid where that errs less (eq. (12n));
#: "off" does neither
WEIGHT_PAIRS = ("ort", "ort_rows", "off")


class RecurrentMode(enum.Enum):
    """What quantization does with LSTM and GRU nodes (RNN has no integer form)."""

    #: com.microsoft DynamicQuantizeLSTM / quanta::DynamicQuantizeGRU: int8 weights,
    #: per-step activations
    DYNAMIC = "dynamic"
    FLOAT = "float"  # left as they are
    #: quantize_static: "dynamic" unless the file with them float is measured closer to
    #: FP32 by more than RECURRENT_LOSS_DB on held-out calibration feeds (docs/calibration.md
    #: eq. (30)); the file's recipe records "dynamic" or "float". quantize_dynamic: "dynamic"
    AUTO = "auto"


#: Ops quantized by default (issue 3's list). Views keep their input's type.
DEFAULT_OP_TYPES: frozenset[str] = frozenset(
    {
        "Conv",
        "ConvTranspose",
        "Gemm",
        "MatMul",
        "Add",
        "Mul",
        "Concat",
        "MaxPool",
        "AveragePool",
        "GlobalAveragePool",
        "Relu",
        "Clip",
        "Resize",
        "Sigmoid",
        "HardSwish",
        "HardSigmoid",  # the SE-block gate (its Mul reads it quantized: a [0, 1] range)
        "Tanh",
        "Softplus",
        "Elu",
        "Selu",
        "Celu",
        "Softsign",
        "Gelu",
        "Mish",  # these activations lower to one 256-entry table each (passes/lower/lookup.py)
        "LeakyRelu",
        "Softmax",
        "Reshape",
        "Transpose",
        "Flatten",
        "Squeeze",
        "Unsqueeze",
        "Slice",
        "Split",
        "Gather",
        "Pad",  # neutral as a view: an integer Pad fills with Q(value) (quantize/qdq.py)
    }
)

#: Devices a recipe can be made for, and what each fixes (data the npu-sim rules restate:
#: quanta.targets.npu_sim.rules.CAPABILITIES): int8 per-tensor activations, int8
#: symmetric per-channel weights, quantized graph outputs (the last device op is integer),
#: and the operators its integer kernels implement.
TARGETS: dict[str, dict[str, Any]] = {
    "npu-sim": {
        "integer_only": True,
        "recipe": {
            "activation_type": "int8",
            "weight_type": "int8",
            "symmetric_weights": True,
            "per_channel": True,
            "weight_bits": 8,
            "quantize_outputs": True,
            "op_types": ("LayerNormalization", "Div"),
            # SmoothQuant may insert a float Mul before a MatMul (where the activation
            # has other readers), which the device cannot run; the int16 residual
            # stream below is how this target keeps the outliers instead
            "smooth_quant": None,
        },
        # int16 (symmetric) activations for the residual stream (the inputs of every
        # LayerNormalization, back through the Adds that build them), GELU inputs and
        # outputs, the attention scores (Softmax inputs back through their scale and
        # mask) and weights (Softmax outputs) and the graph outputs: 8 bits lose the
        # outliers there (docs/accuracy.md, MiniLM) and tie close logits; the device's
        # int16 profile option (quanta.targets.npu_sim.rules.CAPABILITIES), whose 16-bit
        # Softmax and GELU are I-BERT's integer polynomials
        "wide_activations": ("residual", "gelu", "gelu_input", "softmax", "softmax_output", "outputs"),
    },
}

_STORAGE = {"int8": I8, "uint8": U8, "int4": I4, "uint4": U4, "i8": I8, "u8": U8, "i4": I4, "u4": U4}
# 16-bit activations (and weights): the A16W8 fallback of an accuracy search; the groups
# lower to quanta::QLinearConv16 / QLinearMatMul16 (exact int64 accumulation) and ONNX
# Runtime runs the same file as float DQ -> op -> Q (docs/quantization-math.md §A16W8)
_STORAGE.update({"int16": I16, "uint16": U16, "i16": I16, "u16": U16})


def _is_mx(name: object) -> bool:
    from quanta.ir.types import MX_ELEMENTS

    return isinstance(name, str) and name.lower() in MX_ELEMENTS


def storage_from_name(name: str | IntType, what: str) -> IntType:
    if isinstance(name, IntType):
        return name
    key = str(name).lower().replace("qint", "int").replace("quint", "uint")
    if key not in _STORAGE:
        raise RecipeError(
            f"{what}: unknown type {name!r}; expected one of int8, uint8, int16, uint16, int4, uint4"
        )
    return _STORAGE[key]


class SubgraphMode(enum.Enum):
    """What quantize_static does inside If branches and Loop / Scan bodies."""

    QUANTIZE = "quantize"  # calibrated and quantized by the main graph's rules
    #: only the forms that quantize activations at run time: LSTM -> DynamicQuantizeLSTM
    #: (int8 weights); the rest stays float. A body's activations are calibrated only on
    #: the runs that took it, and bodies are typically per-step code whose errors are
    #: carried through state (silero-vad's If branches: static quantization of their
    #: convolutions moves 2.5 % of the voice/no-voice frames, DynamicQuantizeLSTM none)
    DYNAMIC = "dynamic"
    FLOAT = "float"  # left as they are (their compute counted as float, with this reason)


@dataclass(frozen=True)
class TensorOverride:
    """Per-tensor choices that win over the recipe's: a fixed range, a storage type,
    symmetry."""

    range: tuple[float, float] | None = None
    dtype: str | None = None
    symmetric: bool | None = None


@dataclass
class Recipe:
    """Every option of a quantization run (see the module docstring for defaults)."""

    method: CalibrationMethod = CalibrationMethod.WEIGHTED_MSE
    per_channel: bool = True
    activation_type: str = "uint8"
    weight_type: str = "int8"
    symmetric_activations: bool = False
    symmetric_weights: bool = True
    reduce_range: bool = False
    # 7: int8/uint8 weights on ORT's 7-bit grid (int8 [-64, 64], the reduce_range table,
    # activations untouched), for CPUs without VNNI: every u8·s8 pair sum fits int16, so the
    # avx2 kernels use vpmaddubsw exactly, and so does ONNX Runtime there (docs/kernels.md
    # "AVX2"); a depthwise Conv's weights stay on 8 bits (qdq.seven_bit). 8: the full range.
    weight_bits: int = 8
    # "ort": int8 weights of full range whose pairs, in ONNX Runtime's order, no uint8
    # input can overflow in its saturating int16 (vpmaddubsw on CPUs without VNNI): the
    # rounding (nearest, GPTQ, gptq_cd) clamps the second code of each same-sign pair
    # whose magnitudes would add past 128 (quanta.quantize.ort_pairs, docs/debugger.md
    # eq. (12m)); the file is then exact in ORT on every CPU, one bit kept against
    # weight_bits = 7. "ort_rows": "ort", and each output row of a GPTQ-rounded layer takes
    # the 7-bit grid of the same range where that errs less on GPTQ's objective (eq. (12n)).
    # "off": each code on the full grid
    weight_pairs: str = "off"
    weight_block_size: int = 32  # used when weight_type is int4/uint4 (per-block along K)
    op_types: frozenset[str] = DEFAULT_OP_TYPES
    exclude: tuple[str, ...] = ()  # node names, or regular expressions matched in full
    overrides: dict[str, TensorOverride] = field(default_factory=dict)
    quantize_outputs: bool = False  # Q/DQ on the graph outputs too
    bias_correction: bool = True  # Conv/Gemm biases absorb the mean weight-rounding error
    # eq. (28) (quanta.quantize.pool_bias): a Conv / Gemm reading a global average pool
    # absorbs the mean error of its pooled input, measured on the calibration feeds
    pool_bias_correction: bool = True
    # "gptq": second-order rounding of Conv / Gemm / MatMul weights on the calibration
    # inputs, kept per output row only where it beats nearest rounding on held-out
    # samples (quanta.quantize.rounding); "gptq_cd": GPTQ's integers refined by coordinate
    # descent on the same objective, per row where that carries over to held-out samples
    # (docs/debugger.md eqs. (12k)-(12l)); "gptaq": GPTQ, then each layer's integers fitted
    # for the FP32 layer output from the inputs the quantized layers before it produce
    # (quanta.quantize.asymmetric); "brecq": GPTQ, then the integers of each block of Convs
    # learned together against the FP32 block output (quanta.quantize.blocks, eqs.
    # (12p)-(12t)); "nearest": round each weight on its own
    weight_rounding: str = "gptq"
    # SmoothQuant's alpha: balance the activation channels of MatMul/Gemm inputs whose
    # channel maxima spread (quanta.quantize.smooth, docs/debugger.md eq. (13)); None: off
    smooth_quant: float | None = 0.8
    # cross-layer equalization of the activations between two Convs (Conv -> Relu /
    # Clip(0, H) -> Conv): per-channel factors folded into both layers' weights so the
    # per-tensor grid serves every channel (quanta.quantize.equalize, docs/debugger.md
    # eq. (14)); needs per-channel weights
    equalize: bool = False
    calibration_samples: int | None = None  # at most this many samples (None: all)
    percentile: float = 99.999
    num_bins: int | None = None  # histogram bins (None: the observer's default, 4096)
    momentum: float = 0.01  # moving-average MinMax (ORT averaging_constant)
    progress: bool = True
    # fail, writing nothing, when a smaller share of the MACs would run in integer
    min_integer_share: float | None = None
    recurrent: RecurrentMode = RecurrentMode.AUTO
    # under recurrent "dynamic" (or "auto"), a GRU becomes DynamicQuantizeGRU when one step of one
    # direction has at least this many multiply-adds, 3H·(I + H); a smaller GRU stays float:
    # its per-step quantization and integer product calls cost more than the int8 product
    # saves, in quanta and in ONNX Runtime's Loop body of the op (docs/kernels.md "Dynamic
    # int8 GRU", measured: H = 256, I = 256 break even, nsnet2's H = 400 gains 1.7x). 0: every GRU
    gru_min_step_macs: int = 1 << 19
    subgraphs: SubgraphMode = SubgraphMode.DYNAMIC
    # the device the file is for: None (any CPU) or a key of TARGETS ("npu-sim": integer
    # only, every op quantized, the device's granularity rules; see TARGETS)
    target: str | None = None
    # with method "weighted_mse", the range of every tensor eq. (22) does not cover (read
    # by an Add, a Mul, a view, a graph output...): "minmax", "mse" (eq. (21)), or "auto":
    # both, and the one whose quantized model is closer to FP32 at the outputs on the
    # first calibration feeds (docs/calibration.md eq. (24)); the file's recipe records
    # the choice, so re-running it reproduces the file without measuring again
    other_ranges: str = "auto"
    # a tensor that only depthwise Convs read (group = C), under method "weighted_mse":
    # "auto": one grid per channel (axis 1) where eq. (29) rates it at least twice as good
    # as the per-tensor range (docs/calibration.md; quanta lowers it to its integer
    # kernels, passes/lower/per_channel_activation.py); "off": per tensor. The file's
    # recipe records the choice as the list of tensors that took per-channel grids, which
    # re-running takes as they are (the others stay per tensor)
    depthwise_input_per_channel: str | tuple[str, ...] = "auto"
    # training after calibration (quanta.qat.learned): None, or LEARNED's fields, e.g.
    # {"method": "qad", "steps": 600, "seed": 0}: the written file's weight and bias codes
    # distilled against the FP32 model's outputs on the calibration feeds, with every
    # activation fake-quantized as the file computes it (scales, zero points, formats and
    # placement unchanged); seeded, so the recipe reproduces the file (same threads)
    learned: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.method, str):
            try:
                self.method = CalibrationMethod(self.method.lower())
            except ValueError:
                choices = ", ".join(m.value for m in CalibrationMethod)
                raise RecipeError(
                    f"method: unknown calibration method {self.method!r}; expected one of {choices}"
                ) from None
        if isinstance(self.recurrent, str):
            try:
                self.recurrent = RecurrentMode(self.recurrent.lower())
            except ValueError:
                choices = ", ".join(m.value for m in RecurrentMode)
                raise RecipeError(
                    f"recurrent: unknown mode {self.recurrent!r}; expected one of {choices}"
                ) from None
        if not isinstance(self.gru_min_step_macs, int) or self.gru_min_step_macs < 0:
            raise RecipeError(f"gru_min_step_macs: expected an integer >= 0, got {self.gru_min_step_macs!r}")
        if isinstance(self.subgraphs, str):
            try:
                self.subgraphs = SubgraphMode(self.subgraphs.lower())
            except ValueError:
                choices = ", ".join(m.value for m in SubgraphMode)
                raise RecipeError(
                    f"subgraphs: unknown mode {self.subgraphs!r}; expected one of {choices}"
                ) from None
        # MX formats (mxint8, mxfp8_e4m3, ...) are direct casts: quanta.quantize.mx
        if not _is_mx(self.activation_type):
            storage_from_name(self.activation_type, "activation_type")
        if not _is_mx(self.weight_type):
            storage_from_name(self.weight_type, "weight_type")
        if self.activation_type.lower() in ("int4", "uint4"):
            raise RecipeError("activation_type: 4-bit activations are not supported; use int8 or uint8")
        self.op_types = frozenset(self.op_types)
        if isinstance(self.exclude, str):
            self.exclude = (self.exclude,)
        self.exclude = tuple(self.exclude)
        for pat in self.exclude:
            try:
                re.compile(pat)
            except re.error as e:
                raise RecipeError(f"exclude: {pat!r} is not a valid regular expression ({e})") from None
        self.overrides = {
            k: v if isinstance(v, TensorOverride) else _override_from(k, v)
            for k, v in dict(self.overrides).items()
        }
        if not 0.0 < self.percentile <= 100.0:
            raise RecipeError(f"percentile: expected a value in (0, 100], got {self.percentile}")
        if self.min_integer_share is not None and not 0.0 <= float(self.min_integer_share) <= 1.0:
            raise RecipeError(f"min_integer_share: expected a share in [0, 1], got {self.min_integer_share}")
        if self.weight_bits not in (7, 8):
            raise RecipeError(f"weight_bits: expected 7 or 8, got {self.weight_bits!r}")
        if self.weight_bits == 7 and self.weight_type.lower() not in ("int8", "uint8"):
            raise RecipeError(
                f"weight_bits: 7 applies to int8/uint8 weights, got weight_type {self.weight_type!r}"
            )
        if self.weight_pairs not in WEIGHT_PAIRS:
            raise RecipeError(
                f"weight_pairs: expected one of {', '.join(WEIGHT_PAIRS)}, got {self.weight_pairs!r}"
            )
        if self.weight_rounding not in WEIGHT_ROUNDING:
            raise RecipeError(
                f"weight_rounding: expected one of {', '.join(WEIGHT_ROUNDING)}, got {self.weight_rounding!r}"
            )
        if self.smooth_quant is not None and not 0.0 < float(self.smooth_quant) < 1.0:
            raise RecipeError(f"smooth_quant: expected an alpha in (0, 1) or None, got {self.smooth_quant}")
        if self.target is not None and self.target not in TARGETS:
            raise RecipeError(
                f"target: unknown target {self.target!r}; expected None or one of {sorted(TARGETS)}"
            )
        if self.other_ranges not in OTHER_RANGES:
            raise RecipeError(
                f"other_ranges: expected one of {', '.join(OTHER_RANGES)}, got {self.other_ranges!r}"
            )
        if isinstance(self.depthwise_input_per_channel, str):
            if self.depthwise_input_per_channel not in ("auto", "off"):
                raise RecipeError(
                    "depthwise_input_per_channel: expected 'auto', 'off' or a list of tensor names, "
                    f"got {self.depthwise_input_per_channel!r}"
                )
        elif isinstance(self.depthwise_input_per_channel, (list, tuple)) and all(
            isinstance(n, str) for n in self.depthwise_input_per_channel
        ):
            self.depthwise_input_per_channel = tuple(self.depthwise_input_per_channel)
        else:
            raise RecipeError(
                "depthwise_input_per_channel: expected 'auto', 'off' or a list of tensor names, "
                f"got {self.depthwise_input_per_channel!r}"
            )
        if self.learned is not None:
            self.learned = learned_spec(self.learned)
        if self.weight_block_size <= 0:
            raise RecipeError(
                f"weight_block_size: expected a positive block size, got {self.weight_block_size}"
            )

    @property
    def integer_only(self) -> bool:
        """Every operator between the graph's inputs and outputs is quantized (a device
        without float units): Softmax, LayerNormalization and divisions by constants read
        quantized inputs, and nothing is skipped as unprofitable."""
        return self.target is not None and bool(TARGETS[self.target].get("integer_only"))

    def for_target(self) -> Recipe:
        """This recipe with its target's fixed choices applied (TARGETS)."""
        if self.target is None:
            return self
        fixed = dict(TARGETS[self.target]["recipe"])
        fixed["op_types"] = frozenset(self.op_types) | frozenset(fixed.get("op_types", ()))
        return replace(self, **fixed)

    @property
    def activation_storage(self) -> IntType:
        return storage_from_name(self.activation_type, "activation_type")

    @property
    def weight_storage(self) -> IntType:
        return storage_from_name(self.weight_type, "weight_type")

    @property
    def needs_opset21(self) -> bool:
        """4-bit or 16-bit storage anywhere (the types, an override): ai.onnx Q/DQ take
        them from opset 21 on, so quantize_static upgrades the model to it."""
        types = [self.activation_storage, self.weight_storage]
        types += [storage_from_name(o.dtype, k) for k, o in self.overrides.items() if o.dtype]
        return any(t.bits in (4, 16) for t in types)

    def excludes(self, node: Node) -> bool:
        return any(node.name == pat or (node.name and re.fullmatch(pat, node.name)) for pat in self.exclude)

    # -- files ------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["method"] = self.method.value
        d["recurrent"] = self.recurrent.value
        d["subgraphs"] = self.subgraphs.value
        d["op_types"] = sorted(self.op_types)
        d["exclude"] = list(self.exclude)
        if isinstance(self.depthwise_input_per_channel, tuple):
            d["depthwise_input_per_channel"] = list(self.depthwise_input_per_channel)
        d["overrides"] = {
            k: {
                kk: (list(vv) if isinstance(vv, tuple) else vv)
                for kk, vv in asdict(v).items()
                if vv is not None
            }
            for k, v in sorted(self.overrides.items())
        }
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], *, where: str = "recipe") -> Recipe:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise RecipeError(f"{where}: unknown option(s) {unknown}; known options: {sorted(known)}")
        kwargs = dict(d)
        if "op_types" in kwargs:
            kwargs["op_types"] = frozenset(kwargs["op_types"])
        if "exclude" in kwargs:
            kwargs["exclude"] = tuple(kwargs["exclude"] or ())
        try:
            return cls(**kwargs)
        except RecipeError as e:
            raise RecipeError(f"{where}: {e}") from None
        except TypeError as e:
            raise RecipeError(f"{where}: {e}") from None

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> Recipe:
        p = Path(path)
        if not p.is_file():
            raise RecipeError(f"{p}: no such recipe file")
        text = p.read_text()
        if p.suffix in (".yaml", ".yml"):
            try:
                import yaml
            except ImportError:
                raise RecipeError(
                    f"{p}: YAML recipes need PyYAML (pip install pyyaml), or use JSON"
                ) from None
            try:
                data = yaml.safe_load(text)
            except yaml.YAMLError as e:
                raise RecipeError(f"{p}: invalid YAML ({e})") from None
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise RecipeError(f"{p}: invalid JSON ({e})") from None
        if not isinstance(data, Mapping):
            raise RecipeError(f"{p}: expected a mapping of option -> value at the top level")
        return cls.from_dict(data, where=str(p))


#: Recipe.learned's fields and their defaults (quanta.qat.learned.learn reads them):
#: "method" "qad" trains the weights and int32 biases through the straight-through
#: estimator; "steps" optimizer steps of "batch_size" feeds; Adam's "lr" in units of each
#: tensor's quantization step, decayed by a cosine after a "warmup" share of the steps;
#: "holdout" of the feeds (chosen by "seed") measure the loss every "eval_every" steps,
#: and the state best on them is the one written ("patience" evaluations without gain
#: stop early); "augment" "hflip": the training feeds also enter mirrored (image inputs)
LEARNED: dict[str, Any] = {
    "method": "qad",
    "steps": 600,
    "batch_size": 8,
    "lr": 0.003,
    "warmup": 0.05,
    "holdout": 0.2,
    "eval_every": 20,
    "patience": 1000,
    "augment": None,
    "seed": 0,
}
LEARNED_METHODS = ("qad",)


def learned_spec(v: Any) -> dict[str, Any]:
    """``Recipe.learned`` completed with LEARNED's defaults, checked."""
    if not isinstance(v, Mapping):
        raise RecipeError(f"learned: expected a mapping of {sorted(LEARNED)} or None, got {v!r}")
    unknown = sorted(set(v) - set(LEARNED))
    if unknown:
        raise RecipeError(f"learned: unknown key(s) {unknown}; expected some of {sorted(LEARNED)}")
    spec = {**LEARNED, **v}
    if spec["method"] not in LEARNED_METHODS:
        raise RecipeError(f"learned: method expected one of {LEARNED_METHODS}, got {spec['method']!r}")
    for k in ("steps", "batch_size", "eval_every", "patience", "seed"):
        if not isinstance(spec[k], int) or spec[k] < (0 if k in ("steps", "seed") else 1):
            raise RecipeError(f"learned: {k} expected a non-negative integer, got {spec[k]!r}")
    if not 0.0 <= float(spec["holdout"]) < 1.0:
        raise RecipeError(f"learned: holdout expected a share in [0, 1), got {spec['holdout']!r}")
    if spec["augment"] not in (None, "hflip"):
        raise RecipeError(f"learned: augment expected None or 'hflip', got {spec['augment']!r}")
    return spec


def _override_from(name: str, v: Any) -> TensorOverride:
    if not isinstance(v, Mapping):
        raise RecipeError(f"overrides['{name}']: expected a mapping with range/dtype/symmetric")
    unknown = set(v) - {"range", "dtype", "symmetric"}
    if unknown:
        raise RecipeError(
            f"overrides['{name}']: unknown key(s) {sorted(unknown)}; expected range, dtype, symmetric"
        )
    rng = v.get("range")
    if rng is not None:
        if len(rng) != 2 or not float(rng[0]) <= float(rng[1]):
            raise RecipeError(f"overrides['{name}']: range must be [min, max] with min <= max, got {rng}")
        rng = (float(rng[0]), float(rng[1]))
    dtype = v.get("dtype")
    if dtype is not None:
        storage_from_name(dtype, f"overrides['{name}'].dtype")
    return TensorOverride(rng, dtype, v.get("symmetric"))
