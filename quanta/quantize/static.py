"""``quantize_static``: FP32 ONNX model + calibration data -> QDQ int8 ONNX model.

Steps (each a function below):

1. load the model (opsets below 13 are converted to 13: per-axis Q/DQ needs it);
2. prepare the float graph (fold BatchNormalization into Conv/Gemm, so the folded
   weights are what gets quantized);
3. plan which tensors get quantized (quanta.quantize.qdq.plan_qdq);
4. calibrate the activations in one streaming pass (quanta.calibrate.runner), also
   measuring the per-channel input means that bias correction needs;
5. ranges -> parameters (quanta.quantize.params, the only place they are computed),
   then bias correction (Conv/Gemm biases absorb the mean weight-rounding error,
   quanta.quantize.qdq.correct_biases);
6. insert Q/DQ; LSTMs become com.microsoft DynamicQuantizeLSTM (int8 weights, their
   float input quantized per step at run time: quanta.quantize.recurrent, as ONNX
   Runtime's static QOperator mode writes them);
7. verify the QDQ graph, save atomically (never over the input), and return a summary
   of what was quantized, what stayed float and why.

The same model, data and recipe give a byte-identical file.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import onnx

from quanta.calibrate.mse import MSEObserver
from quanta.calibrate.observer import WIDE, ObserverBase, observer_type
from quanta.calibrate.readers import ImagePreprocess, iter_feeds
from quanta.calibrate.runner import calibrate, compile_executor
from quanta.ir.graph import Model
from quanta.ir.onnx_io import (
    ModelLoadError,
    from_proto,
    load_proto,
    lower_opset_for_qdq,
    save,
    share_equal_initializers,
    to_proto,
    upgrade_opset,
)
from quanta.ir.shape_hints import infer_shapes
from quanta.ir.verify import Stage, verify
from quanta.passes.coverage import CoverageReport
from quanta.quantize.bodies import BodyScope, plan_bodies, prepare_bodies, quantize_bodies
from quanta.quantize.file_outputs import remembering_outputs, run_file
from quanta.quantize.gate_ranges import trim_gate_inputs
from quanta.quantize.ort_propagation import settle_dq_propagation
from quanta.quantize.ort_saturation import file_note
from quanta.quantize.pool_bias import correct_pooled, pooled_layers
from quanta.quantize.qdq import (
    MAC_OPS,
    VIEW_OPS,
    QdqPlan,
    bias_correction_inputs,
    consumer_channel_weights,
    correct_biases,
    depthwise_only_inputs,
    insert_qdq,
    pair_safe_codes,
    plan_qdq,
    resolve_params,
)
from quanta.quantize.range_choice import (
    FEEDS,
    MIN_FEEDS,
    WIDE_TRY_SQNR_DB,
    best_8bit_sqnr,
    choose,
    half_ranges,
    measure_recurrent,
    reiterable,
    split_observers,
    too_few_feeds,
    unsplit,
    wide_candidate,
    wide_decision,
)
from quanta.quantize.recipe import CalibrationMethod, Recipe, RecurrentMode, SubgraphMode
from quanta.quantize.recurrent import (
    RECURRENT_FLOAT_REASON,
    has_dynamic_recurrent,
    has_recurrent,
    lstm_inputs,
    quantize_lstms,
    spread_reasons,
)
from quanta.quantize.replay import InputReplay
from quanta.runtime.coverage import lowered_coverage

if TYPE_CHECKING:
    from quanta.quantize.mx import MXSummary

__all__ = ["QuantizationSummary", "load_for_quantization", "make_observer_factory", "quantize_static"]

MIN_OPSET = 13
#: QuantizeLinear / DequantizeLinear take a float16 or bfloat16 input and scale from opset
#: 19 on (before it only float32): a model computing in half precision is loaded there.
HALF_OPSET = 19
_HALF = (onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def computes_in_half(proto: onnx.ModelProto) -> bool:
    """Whether the main graph has float16 / bfloat16 values (weights, inputs, outputs,
    a Cast to half, a half Constant): a Keras mixed-precision export (tf2onnx), or a
    model converted to float16. Its Q/DQ scales are half too (params: the scale has the
    tensor's type, as ONNX Runtime writes them), valid only from opset 19."""
    g = proto.graph
    if any(t.data_type in _HALF for t in g.initializer):
        return True
    if any(v.type.tensor_type.elem_type in _HALF for v in (*g.input, *g.output, *g.value_info)):
        return True
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i in _HALF:
                return True
            if a.type == onnx.AttributeProto.TENSOR and a.t.data_type in _HALF:
                return True
    return False


@dataclass
class QuantizationSummary:
    """What a quantization run did, node by node."""

    output: str
    method: str
    samples: int = 0
    seconds: float = 0.0
    quantized: list[tuple[str, str]] = field(default_factory=list)  # (node, op)
    float_nodes: list[tuple[str, str, str]] = field(default_factory=list)  # (node, op, reason)
    float_tensors: list[tuple[str, str]] = field(default_factory=list)  # (tensor, reason)
    input_bytes: int = 0
    output_bytes: int = 0
    # the written file as a session compiles it: the share of MACs in integer and the
    # largest float compute nodes (quanta.passes.coverage); None when not measured
    coverage: CoverageReport | None = None
    # what an accuracy-driven run changed and measured (quanta.quantize.accuracy)
    accuracy: Any = None
    # eq. (24): the range set of the tensors outside eq. (22) (quanta.quantize.range_choice)
    range_choice: Any = None
    # eq. (28): the biases corrected after global average pools (quanta.quantize.pool_bias)
    pool_bias: Any = None
    # advice that depends on the host, not the file (quanta.quantize.ort_saturation)
    notes: list[str] = field(default_factory=list)

    @property
    def integer_share(self) -> float | None:
        return None if self.coverage is None else self.coverage.integer_share

    def format(self, *, max_rows: int = 30) -> str:
        lines = [
            f"quantized {len(self.quantized)} node(s), {len(self.float_nodes)} stayed float "
            f"({self.method} calibration on {self.samples} feed(s) of the data, {self.seconds:.1f} s)",
        ]
        if self.input_bytes and self.output_bytes:
            lines.append(
                f"size: {self.input_bytes / 1024:.1f} KB -> {self.output_bytes / 1024:.1f} KB "
                f"({self.output_bytes / self.input_bytes:.2f}x)"
            )
        if self.coverage is not None:
            lines.extend(self.coverage.format_share().splitlines())
        if self.accuracy is not None:
            lines.extend(self.accuracy.format().splitlines())
        if self.range_choice is not None:
            lines.append(self.range_choice.format())
        if self.pool_bias is not None:
            lines.append(self.pool_bias.format())
        by_op: dict[str, int] = {}
        for _, op in self.quantized:
            by_op[op] = by_op.get(op, 0) + 1
        if by_op:
            lines.append("quantized: " + ", ".join(f"{op} {n}" for op, n in sorted(by_op.items())))
        if self.float_tensors:
            lines.append("tensors left float:")
            for name, reason in self.float_tensors[:max_rows]:
                lines.append(f"  {name}: {reason}")
        interesting = [
            f
            for f in self.float_nodes
            if "not in the quantized op types" not in f[2] and f[2] != SUBGRAPH_STATIC_REASON
        ]
        kept: dict[str, int] = {}
        inside: dict[str, int] = {}
        for _, op, reason in self.float_nodes:
            if "not in the quantized op types" in reason:
                kept[op] = kept.get(op, 0) + 1
            elif reason == SUBGRAPH_STATIC_REASON:
                inside[op] = inside.get(op, 0) + 1
        if kept:
            lines.append("float by design: " + ", ".join(f"{op} {n}" for op, n in sorted(kept.items())))
        if inside:
            lines.append(
                "float inside subgraphs ("
                + SUBGRAPH_STATIC_REASON
                + "): "
                + ", ".join(f"{op} {n}" for op, n in sorted(inside.items()))
            )
        if interesting:
            lines.append("nodes left float:")
            for name, op, reason in interesting[:max_rows]:
                lines.append(f"  {name or '<unnamed>'} ({op}): {reason}")
            if len(interesting) > max_rows:
                lines.append(f"  ... and {len(interesting) - max_rows} more")
        lines.extend(f"note: {n}" for n in self.notes)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {
            "output": self.output,
            "method": self.method,
            "samples": self.samples,
            "quantized": [list(x) for x in self.quantized],
            "float_nodes": [list(x) for x in self.float_nodes],
            "float_tensors": [list(x) for x in self.float_tensors],
            "integer_share": self.integer_share,
            "accuracy": None if self.accuracy is None else self.accuracy.to_dict(),
            "total_macs": None if self.coverage is None else self.coverage.total_macs,
            "largest_float": []
            if self.coverage is None
            else [[c.name, c.op, c.macs, "; ".join(c.reasons)] for c in self.coverage.largest_float(10)],
            "pool_bias": None
            if self.pool_bias is None
            else {
                "layers": dict(self.pool_bias.layers),
                "feeds": self.pool_bias.feeds,
                "reason": self.pool_bias.reason,
            },
            "notes": list(self.notes),
        }


def _mx_recipe(recipe: Recipe) -> bool:
    from quanta.quantize.mx import is_mx_type

    return is_mx_type(recipe.weight_type) or is_mx_type(recipe.activation_type)


def _quantize_mx(
    model_input: Any, model_output: str | os.PathLike, recipe: Recipe, verbose: bool
) -> MXSummary:
    """MX weight_type / activation_type: a direct cast, no calibration
    (quanta.quantize.mx); a non-MX side of the pair stays float."""
    from quanta.quantize.mx import is_mx_type, quantize_mx_model

    proto, _ = load_proto(model_input)
    out, summary = quantize_mx_model(
        proto,
        recipe.weight_type.lower() if is_mx_type(recipe.weight_type) else None,
        recipe.activation_type.lower() if is_mx_type(recipe.activation_type) else None,
        block_size=recipe.weight_block_size,
        op_types=frozenset(recipe.op_types),
        exclude=recipe.exclude,
    )
    onnx.checker.check_model(out)
    tmp = Path(str(model_output) + ".tmp")
    onnx.save(out, str(tmp))
    os.replace(tmp, model_output)
    if verbose:
        print(summary)
    return summary


def _with_default_opset(proto: onnx.ModelProto, version: int) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(proto)
    out.opset_import.append(onnx.helper.make_opsetid("", version))
    return out


def load_for_quantization(
    model_input: str | os.PathLike | bytes | onnx.ModelProto, *, min_opset: int = MIN_OPSET
) -> Model:
    """Load, converting opsets below ``min_opset`` up to it (per-axis Q/DQ needs 13;
    4-bit and per-block Q/DQ need 21; Q/DQ of half-precision tensors need 19)."""
    proto, path = load_proto(model_input)
    if computes_in_half(proto):
        min_opset = max(min_opset, HALF_OPSET)
    proto = upgrade_opset(proto, min_opset, path or "model")
    # a model above the opsets whose Q / DQ ONNX Runtime runs, and meaning the same
    # there, is quantized at that opset (its Q / DQ would be refused at the newer one)
    proto = lower_opset_for_qdq(proto)
    if not any(o.domain in ("", "ai.onnx") for o in proto.opset_import):
        # only other domains (an ai.onnx.ml pipeline): the Q/DQ quantization inserts are
        # ai.onnx ops, and none of the graph's nodes is one, so importing it changes nothing
        proto = _with_default_opset(proto, min_opset)
    try:
        proto = infer_shapes(proto, strict_mode=False, data_prop=True)
    except Exception:  # shapes that cannot be inferred: quantization still works per tensor
        pass
    model = from_proto(proto, path or "model")
    model.path = path
    scan8_as_loops(model)
    from quanta.ir.op_rules import QUANT_OPS
    from quanta.quantize.prequantized import in_view

    already = sorted({n.op_type for n in model.graph.nodes if n.op_type in QUANT_OPS})
    # a float view's kept nodes (FloatView.kept) have no float form: they stay as written
    if already and not in_view():
        raise ModelLoadError(
            f"{path or 'model'}: the model is already quantized (it has {', '.join(already)}); "
            "quantize its float original instead"
        )
    # Weights listed as graph inputs (IR < 4 style "overridable initializers") are
    # constants for quantization: the quantized model lists them as initializers only.
    g = model.graph
    for v in [v for v in g.inputs if v.const is not None]:
        g.inputs.remove(v)
        g.initializers[v.name] = v
    # Q/DQ with per-axis parameters needs opset 13, hence IR version 7 at least.
    ops = [onnx.helper.make_opsetid(d, v) for d, v in model.opset_imports.items()]
    model.ir_version = max(model.ir_version, onnx.helper.find_min_ir_version_for(ops, ignore_unknown=True), 7)
    return model


def scan8_as_loops(model: Model) -> None:
    """The Scan-8 nodes ``upgrade_opset`` kept as ``quanta::Scan8`` written as Loops of
    Scans (passes/rules/scan8_as_loop.py); the ``quanta`` domain's import goes when
    nothing else uses it."""
    from quanta.ir.onnx_io import SCAN8_DOMAIN, SCAN8_OP

    g = model.graph
    if not any(n.op_type == SCAN8_OP and n.domain == SCAN8_DOMAIN for n in g.nodes):
        return
    from quanta.passes.manager import PassManager
    from quanta.passes.rules.scan8_as_loop import Scan8AsLoop

    PassManager([Scan8AsLoop()]).run(model)
    if not any(n.domain == SCAN8_DOMAIN for n in g.nodes):
        model.opset_imports.pop(SCAN8_DOMAIN, None)


class SpreadFor:
    """An observer factory: a SpreadObserver (eq. (26)) for the ``names`` given, the
    wrapped factory's observer for the others (a class, so that it pickles for the
    workers of quanta.scale)."""

    def __init__(self, make: Callable[[str], Any], names: list[str]) -> None:
        self.make, self.names = make, frozenset(names)

    def __call__(self, name: str) -> Any:
        from quanta.calibrate.spread import SpreadObserver

        return SpreadObserver() if name in self.names else self.make(name)


def make_observer_factory(
    recipe: Recipe,
    channel_weights: dict[str, tuple[int, Any]] | None = None,
    per_channel: Collection[str] = (),
):
    """tensor name -> a fresh observer for the recipe's calibration method (its row in
    quantize/methods.py ``METHODS``).

    Histogram observers use ``recipe.num_bins`` when set, else their own default; the
    MSE observers model the grid of the recipe's activation storage (qmin, qmax,
    symmetry), which only quantize/ knows (calibrate/ cannot import it).
    ``channel_weights`` (qdq.consumer_channel_weights): the tensors that the weighted
    MSE method calibrates with their consumers' weights; the others get MinMax when
    ``recipe.other_ranges`` is "minmax", else an MSE observer (its extrema are MinMax).
    ``per_channel`` (qdq.depthwise_only_inputs): the tensors that may take one grid per
    channel (eq. (29))."""
    from quanta.quantize.methods import METHODS, Bins, ObserverRequest
    from quanta.quantize.params import quant_range

    method = METHODS[recipe.method]
    bins: Bins = {} if recipe.num_bins is None else {"bins": recipe.num_bins}

    def make(name: str) -> ObserverBase:
        ov = recipe.overrides.get(name)
        symmetric = (
            ov.symmetric if ov is not None and ov.symmetric is not None else recipe.symmetric_activations
        )

        def grid() -> tuple[int, int]:
            storage = recipe.activation_storage
            if ov is not None and ov.dtype:
                from quanta.quantize.recipe import storage_from_name

                storage = storage_from_name(ov.dtype, name)
            return quant_range(storage, symmetric=symmetric, reduce_range=recipe.reduce_range)

        return method.make(
            ObserverRequest(
                recipe, name, symmetric, bins, grid, channel_weights or {}, frozenset(per_channel)
            )
        )

    return make


def prepare_float_graph(model: Model) -> None:
    """Float-graph rewrites that must happen before quantization: constant folding
    (weights computed by subgraphs become initializers), BatchNormalization folded into
    Conv/Gemm weights (so the folded weights are what gets quantized)."""
    from quanta.passes.manager import PassManager
    from quanta.passes.pipelines import prepare_for_quantization
    from quanta.runtime.compile import reference_evaluator

    passes = prepare_for_quantization(
        opset=model.opset_imports.get("", 21),
        evaluator=reference_evaluator(model.opset_imports),
        opset_imports=model.opset_imports,
    )
    PassManager(passes).run(model)


@remembering_outputs
def quantize_static(
    model_input: str | os.PathLike | bytes | onnx.ModelProto,
    model_output: str | os.PathLike,
    calibration_data: Any,
    recipe: Recipe | str | os.PathLike | None = None,
    *,
    preprocess: ImagePreprocess | None = None,
    verbose: bool = True,
    accuracy: Any = None,
    engine: Any = "inprocess",
    workers: int | None = None,
    address: str | None = None,
    shards: int | None = None,
    keep_file_parameters: bool = True,
    wide_fallback: bool = True,
    **options: Any,
) -> QuantizationSummary | MXSummary:
    """Quantize ``model_input`` with ranges calibrated on ``calibration_data``.

    A ``model_input`` that is already quantized (Q/DQ, QOperator or dynamic operators) is
    quantized through its float view (quanta.quantize.prequantized): the activations it
    quantized keep its own scale and zero point (``keep_file_parameters=False``:
    calibrated anew), the tensors it left float are calibrated, and the summary says so.

    ``calibration_data``: a CalibrationDataReader, an iterable of feed dicts, an ``.npz``
    file, or a folder of ``.npz`` files or images (with ``preprocess``).
    ``recipe``: a :class:`Recipe`, or a path to a YAML/JSON recipe; keyword ``options``
    override single fields (``method="entropy"``, ``per_channel=False``,
    ``exclude=["head.*"]`` …). ``accuracy``: a :class:`quanta.AccuracyTarget`: fix the
    layers that lose the most until the target holds on held-out data
    (quanta.quantize.accuracy); the summary's ``accuracy`` says what changed.
    ``engine``: where calibration runs: "inprocess" (default), "local" (``workers``
    processes) or "ray" (``workers`` Ray tasks; ``address`` of a running cluster), or a
    :mod:`quanta.scale` engine. ``shards``: how many shards the samples are cut into on
    such an engine, handed out as workers free up (default
    :func:`quanta.scale.default_shards`: one per worker, up to four per worker for large
    sample counts). The file is byte-identical whatever the engine and the shards
    (docs/scale.md); they are not part of the recipe. ``wide_fallback``: an 8-bit file far
    from FP32 is measured against one with 16-bit activations (docs/calibration.md eq.
    (27)); the accuracy search's trials turn it off (the search widens tensors itself).
    Returns (and, if ``verbose``, prints) the summary (an MXSummary for an MX type).
    """
    t0 = time.perf_counter()
    recipe = _recipe_from(recipe, options).for_target()  # a device's fixed choices (Recipe.target)
    from quanta.quantize.prequantized import (
        guard_input,
        load_if_quantized,
        prepare_prequantized,
        quantizing_view,
    )

    quantized_input = load_if_quantized(model_input)
    if quantized_input is not None:
        guard_input(model_input, model_output)
        # quanta.quantize.prequantized: the file's float view, quantized with its own grids
        prepared = prepare_prequantized(quantized_input, recipe, keep_parameters=keep_file_parameters)
        assert prepared is not None
        view, view_recipe, notes = prepared
        with quantizing_view():
            summary = quantize_static(
                view,
                model_output,
                calibration_data,
                view_recipe,
                preprocess=preprocess,
                verbose=False,
                accuracy=accuracy,
                engine=engine,
                workers=workers,
                address=address,
                shards=shards,
                wide_fallback=False,  # the file's own 8-bit grids are kept: no eq. (27)
            )
        if isinstance(summary, QuantizationSummary):
            summary.notes[:0] = notes
            summary.input_bytes = quantized_input.ByteSize()
        if verbose:
            print(summary.format() if isinstance(summary, QuantizationSummary) else summary)
        return summary
    if _mx_recipe(recipe):
        return _quantize_mx(model_input, model_output, recipe, verbose)
    if accuracy is not None:
        return _quantize_to_target(
            model_input,
            model_output,
            calibration_data,
            recipe,
            preprocess,
            verbose,
            accuracy,
            engine=(engine, workers, address),
            shards=shards,
        )
    # int4 weights and int16 activations (also an integer-only target's wide tensors) need opset 21
    wide = recipe.needs_opset21 or recipe.integer_only
    source_data, source_preprocess = calibration_data, preprocess  # as given (eq. (25) re-reads them)
    wide_tensors: list[str] = []  # eq. (25): non-negative data reaching 1e9
    model = load_for_quantization(model_input, min_opset=21 if wide else MIN_OPSET)
    prepare_float_graph(model)
    from quanta.ir.op_rules import QUANT_OPS

    # a float view's nodes with no float form stay quantized as the file wrote them
    kept_ops = frozenset(n.op_type for n in model.graph.nodes if n.op_type in QUANT_OPS)
    source_path = model.path  # eq. (24) may keep a copy of the model, which has no path
    if recipe.integer_only:
        # one integer operator per GELU (a table), instead of five float ops on the device
        from quanta.passes.manager import PassManager
        from quanta.passes.rules.eliminate_dead import EliminateDead
        from quanta.passes.rules.fuse_gelu import FuseGeluPass

        PassManager([FuseGeluPass(model.opset()), EliminateDead()]).run(model)
    quantize_inside = recipe.subgraphs is not SubgraphMode.FLOAT
    if quantize_inside:
        prepare_bodies(model, prepare_float_graph)
    graph = model.graph
    plan_recipe = recipe
    smoothed: list[str] = []
    if recipe.equalize and recipe.per_channel:
        calibration_data = _equalize(model, calibration_data, recipe, preprocess)
    if recipe.smooth_quant is not None:
        smoothed, calibration_data = _smooth(model, calibration_data, recipe, preprocess)
        # the Mul that produces a balanced activation stays float: its own inputs keep the
        # outliers the balancing moved out of its output (no MACs: the share is unchanged)
        plan_recipe = dataclasses.replace(
            recipe, exclude=(*recipe.exclude, *(re.escape(n) for n in smoothed))
        )
    # eq. (HB2): the layer computing a Log's input stays float when its own input spreads
    # over many powers of two (measured on the first calibration feeds, before planning)
    log_float = _log_float(model, calibration_data, graph, recipe, preprocess)
    if log_float:
        plan_recipe = dataclasses.replace(
            plan_recipe, exclude=(*plan_recipe.exclude, *(re.escape(n) for n in log_float))
        )
    plan = plan_qdq(graph, plan_recipe)
    if smoothed:  # the balancing Muls: say why, not "excluded by the recipe"
        balanced = set(smoothed)
        for d in plan.decisions:
            if d.node.name in balanced and not d.quantize:
                d.reason = SMOOTH_REASON
    for d in plan.decisions:
        if d.node.name in log_float and not d.quantize:
            d.reason = log_float[d.node.name]
    bodies = plan_bodies(model, body_recipe(recipe)) if quantize_inside else []
    ranges = {}
    minmax: dict = {}  # eq. (24)'s other candidate: MinMax of the tensors outside eq. (22)
    per_tensor: dict = {}  # eq. (29b)'s other candidate: the per-tensor range of a per-channel one
    body_float: dict[str, str] = {}
    samples = 0
    shapes: dict = {}
    to_calibrate = plan.activations_to_calibrate()
    # eq. (26): the input x of each LSTM that becomes DynamicQuantizeLSTM is quantized per
    # step at run time; its spread over powers of two decides whether that keeps it
    lstm_x = [n for n in lstm_inputs(model, recipe) if n not in to_calibrate]
    to_calibrate += lstm_x
    lstm_float: dict[str, str] = {}
    means_for = bias_correction_inputs(plan) if recipe.bias_correction else {}
    for scope in (s for top in bodies for s in top.walk()):
        assert scope.plan is not None
        to_calibrate += [scope.prefix + name for name in scope.plan.activations_to_calibrate()]
        if recipe.bias_correction:
            means_for.update({scope.prefix + k: a for k, a in bias_correction_inputs(scope.plan).items()})
    weights_for = (
        consumer_channel_weights(graph, plan) if recipe.method is CalibrationMethod.WEIGHTED_MSE else {}
    )
    per_channel = depthwise_per_channel(graph, plan, weights_for, recipe)
    means: dict = {}
    rounded = []
    if recipe.weight_rounding in ("gptq", "gptq_cd", "gptaq", "brecq"):
        from quanta.quantize.rounding import plan_rounding

        rounded = plan_rounding(graph, plan)
        if rounded:
            calibration_data = _rereadable(calibration_data, graph, recipe, preprocess)
    # with bodies, the calibration run also tells which If branches the data takes and
    # the shapes inside the bodies (coverage counts their MACs with them)
    # eq. (24): both range sets of the tensors outside eq. (22) are measured at the
    # outputs on the first calibration feeds (kept while calibrating a one-shot iterator)
    choose_ranges = recipe.method is CalibrationMethod.WEIGHTED_MSE and recipe.other_ranges == "auto"
    choice_feeds: list[dict] = []
    halves: dict = {}
    run: Callable[..., Any] | None = None
    in_process = engine == "inprocess" and workers in (None, 1)
    if to_calibrate or means_for or bodies or rounded:
        if not in_process:
            from quanta.scale import calibrate_sharded, make_engine

            # results: the range searches run on the workers, each on its part of the
            # tensors, and the driver receives ranges, not histograms (docs/scale.md eq. (S7))
            run = functools.partial(
                calibrate_sharded, engine=make_engine(engine, workers, address), shards=shards, results=True
            )
        else:
            # one compile for both passes over the float graph (GPTQ's second pass runs
            # before any Q/DQ is inserted: the graph is the one calibrated)
            run = functools.partial(calibrate, executor=compile_executor(model))
    # GPTQ's statistics pass reads the values this pass computes when they fit in memory
    # (quanta.quantize.replay): one forward pass over the data fewer
    replay = (
        InputReplay([layer.x_name for layer in rounded]) if rounded and in_process and not bodies else None
    )
    if to_calibrate or means_for or bodies:
        assert run is not None
        if choose_ranges and in_process and not reiterable(calibration_data):
            calibration_data = _keep_first(
                iter_feeds(
                    calibration_data, graph.inputs, preprocess=preprocess, limit=recipe.calibration_samples
                ),
                choice_feeds,
                2 * FEEDS,
            )
            preprocess = None
        make = make_observer_factory(recipe, weights_for, per_channel)
        if choose_ranges and in_process:
            make = split_observers(make)  # eq. (24) measures ranges of the even feeds on the odd ones
        if lstm_x:
            make = SpreadFor(make, lstm_x)
        observers = run(
            model,
            to_calibrate,
            calibration_data,
            make,
            preprocess=preprocess,
            limit=recipe.calibration_samples,
            progress=recipe.progress and verbose,
            channel_means=means_for,
            # only in process: the sharded engine's calibrate takes no taps
            **({"taps": replay.taps()} if replay is not None else {}),
        )
        halves = unsplit(observers)
        lstm_float = spread_reasons({n: observers.pop(n) for n in lstm_x if n in observers})
        if choose_ranges and not in_process and reiterable(calibration_data):
            # the same even feeds as the in-process split (the file does not depend on the engine)
            even_feeds = list(
                iter_feeds(
                    calibration_data, graph.inputs, preprocess=preprocess, limit=recipe.calibration_samples
                )
            )[0::2]
            halves = dict(
                run(
                    model,
                    to_calibrate,
                    even_feeds,
                    make_observer_factory(recipe, weights_for, per_channel),
                    progress=False,
                )
            )
        samples = observers.samples
        means = observers.means
        shapes = observers.value_shapes
        for name, obs in observers.items():
            bits = plan.tensors[name].storage.bits if name in plan.tensors else 8
            reason = obs.degenerate(bits)
            if reason is not None and reason.startswith(WIDE) and name in plan.tensors:
                wide_tensors.append(name)
            if reason is not None and recipe.integer_only and "reaches" in reason and name in plan.tensors:
                continue  # an additive mask: resolve_params takes the scores' range
            if reason is not None:
                if name in plan.tensors:
                    plan.tensors[name].float_reason = reason
                else:  # a scoped name: a tensor inside a body
                    body_float[name] = reason
            else:
                ranges[name] = obs.range()
                if ranges[name].axis is not None and hasattr(obs, "tensor_range"):
                    per_tensor[name] = obs.tensor_range()  # eq. (29b)'s other candidate
                if choose_ranges and name not in weights_for and issubclass(observer_type(obs), MSEObserver):
                    minmax[name] = obs.extrema()

    if wide_tensors and recipe.activation_storage.bits == 8 and reiterable(source_data):
        # eq. (25): data of wide dynamic range (a power spectrum reaching 1e12) has no
        # useful 8-bit grid; with 16-bit storage it is one more integer group (A16W8)
        # instead of a float one. The storage decides the opset the model is loaded at,
        # so the run starts again with those tensors widened.
        from quanta.quantize.recipe import TensorOverride

        # with the outputs of the Conv / Gemm / MatMul reading them (A16W8 needs its output
        # quantized; the output of a layer over such data is as wide)
        names = list(wide_tensors)
        for n in wide_tensors:
            readers = list(graph.value(n).consumers())
            while readers:
                reader = readers.pop()
                out = reader.outputs[0] if reader.outputs else None
                if out is not None and reader.op_type in VIEW_OPS:  # a view keeps its input's type
                    readers += out.consumers()
                elif (
                    out is not None and reader.op_type in MAC_OPS and all(out is not g for g in graph.outputs)
                ):
                    names.append(out.name)
        widened = {
            n: TensorOverride(dtype="int16") for n in dict.fromkeys(names) if n not in recipe.overrides
        }
        if widened:
            return quantize_static(
                model_input,
                model_output,
                source_data,
                dataclasses.replace(recipe, overrides={**recipe.overrides, **widened}),
                preprocess=source_preprocess,
                verbose=verbose,
                engine=engine,
                workers=workers,
                address=address,
                shards=shards,
                wide_fallback=wide_fallback,
            )

    def finish(
        model: Model, plan, bodies, ranges: dict, recipe: Recipe, round_weights: Any = None
    ) -> dict[int, str | None]:
        """The calibrated float model -> the QDQ model (in place); returns the LSTMs."""
        graph = model.graph
        # a gated activation's input: no codes for the tail where its output code is constant
        ranges = trim_gate_inputs(graph, plan, ranges)
        resolve_params(graph, plan, ranges, recipe)
        if round_weights is not None:
            round_weights(graph, plan)
        pair_safe_codes(graph, plan, recipe)  # eq. (12m), weight_pairs="ort"
        if recipe.bias_correction:
            correct_biases(graph, plan, means)
        if round_weights is not None and recipe.weight_rounding == "gptaq":
            from quanta.calibrate.runner import with_defaults
            from quanta.quantize.asymmetric import reconstruct

            # eqs. (12g)-(12j): the FP32 model and the quantized one as planned so far,
            # side by side, in this process (the same file on any engine)
            def feeds():
                for feed in iter_feeds(
                    calibration_data, graph.inputs, preprocess=preprocess, limit=recipe.calibration_samples
                ):
                    yield with_defaults(feed, graph)

            reconstruct(model, plan, recipe, feeds)
            pair_safe_codes(graph, plan, recipe)
        if round_weights is not None and recipe.weight_rounding == "brecq":
            from quanta.calibrate.runner import with_defaults
            from quanta.quantize.blocks import reconstruct_blocks

            # eqs. (12p)-(12t): each block's integers learned against its FP32 output
            def block_feeds():
                for feed in iter_feeds(
                    calibration_data, graph.inputs, preprocess=preprocess, limit=recipe.calibration_samples
                ):
                    yield with_defaults(feed, graph)

            reconstruct_blocks(model, plan, recipe, block_feeds, log=print if verbose else None)
            pair_safe_codes(graph, plan, recipe)
        quantize_bodies(bodies, model, ranges, dict(body_float), means, recipe)
        insert_qdq(graph, plan)
        settle_dq_propagation(graph, model.opset_imports.get("", 0))
        lstms = quantize_lstms(model, recipe, lstm_float)
        verify(graph, Stage.QDQ, kept=kept_ops)
        return lstms

    gptq_recipe: Recipe = recipe

    def gptq(graph, plan) -> None:
        """GPTQ's second pass once the activations' parameters are known: its statistics
        are taken over the inputs quantized as the model will see them (rounding.py eq.
        (12d)), then the weights are rounded."""
        from quanta.quantize.rounding import apply_rounding, quantized_inputs

        layers = quantized_inputs(plan, rounded)
        if not layers:
            return
        if replay is not None and replay.replay(layers, samples):
            apply_rounding(graph, plan, layers, gptq_recipe)
            return
        assert run is not None
        stats = run(
            model,
            [],
            calibration_data,
            make_observer_factory(gptq_recipe),
            preprocess=preprocess,
            limit=gptq_recipe.calibration_samples,
            progress=gptq_recipe.progress and verbose,
            stats=layers,
        )
        apply_rounding(graph, plan, stats.stats, gptq_recipe)

    rec: Recipe = recipe

    def candidate(rng: dict) -> Model:
        # the same float graph planned again (the graph is linked both ways: a copy
        # through the ONNX form, not a deep copy). The large constants are not copied:
        # the copy reads the model's arrays through read-only views (to_proto's
        # ``arrays``), as finish() replaces constants and never writes into them
        arrays: dict[str, Any] = {}
        alt = from_proto(to_proto(model, arrays=arrays), arrays=arrays)
        alt_plan = plan_qdq(alt.graph, plan_recipe)
        for name, t in plan.tensors.items():
            if t.float_reason is not None and name in alt_plan.tensors:
                alt_plan.tensors[name].float_reason = t.float_reason
        alt_bodies = plan_bodies(alt, body_recipe(rec)) if quantize_inside else []
        finish(alt, alt_plan, alt_bodies, rng, rec)
        return alt

    range_choice = None
    if any(ranges[k] != v for k, v in minmax.items()):
        if not choice_feeds:
            choice_feeds = list(
                iter_feeds(calibration_data, graph.inputs, preprocess=preprocess, limit=2 * FEEDS)
            )
        # the candidates take the ranges of the even feeds and run on the odd ones: ranges
        # measured on the feeds that made them favour the set that fits those feeds
        # (MSE's clipping is tuned to their tails), not the one that generalises. The
        # candidates round weights to nearest: the choice is between activation ranges.
        held_out = choice_feeds[1::2] if halves else choice_feeds
        even = half_ranges(halves, ranges, minmax) if halves else (ranges, minmax)

        if 0 < len(held_out[:FEEDS]) < MIN_FEEDS:  # too few to measure (range_choice.py)
            range_choice = too_few_feeds("minmax", len(held_out[:FEEDS]))
        else:
            with tempfile.TemporaryDirectory(prefix="quanta-ranges-") as tmp:
                reference = os.path.join(tmp, "float.onnx")
                save(model, reference, check=False)
                range_choice = choose(
                    reference,
                    {"minmax": candidate({**even[0], **even[1]}), "mse": candidate(even[0])},
                    held_out[:FEEDS],
                    lambda m, path: save(m, path, check=False),
                    run_file,
                )
        recipe = dataclasses.replace(recipe, other_ranges=range_choice.choice)
        if range_choice.choice == "minmax":
            ranges = {**ranges, **minmax}
    # eq. (29b): the per-channel grids of eq. (29) are kept only when the file with them
    # is at least PER_CHANNEL_MARGIN_DB closer to FP32 at the outputs than the file without
    # them, measured as eq. (24) (ranges of the even feeds, scored on the odd ones)
    channel_choice = None
    if per_tensor and recipe.depthwise_input_per_channel == "auto":
        if not choice_feeds and reiterable(calibration_data):
            choice_feeds = list(
                iter_feeds(calibration_data, graph.inputs, preprocess=preprocess, limit=2 * FEEDS)
            )
        held_out = choice_feeds[1::2] if halves else choice_feeds
        ev, ev_minmax = half_ranges(halves, ranges, minmax) if halves else (dict(ranges), dict(minmax))
        if recipe.other_ranges == "minmax":
            ev = {**ev, **ev_minmax}
        ev_pt = dict(ev)
        for name, full in per_tensor.items():
            h = halves.get(name)
            ev_pt[name] = h.tensor_range() if h is not None and ev[name] is not ranges[name] else full
        rec = recipe
        with tempfile.TemporaryDirectory(prefix="quanta-ranges-") as tmp:
            reference = os.path.join(tmp, "float.onnx")
            save(model, reference, check=False)
            channel_choice = choose(
                reference,
                {"per_tensor": candidate(ev_pt), "per_channel": candidate(ev)},
                held_out[:FEEDS],
                lambda m, path: save(m, path, check=False),
                run_file,
            )
        gain = channel_choice.scores.get("per_channel", 0.0) - channel_choice.scores.get("per_tensor", 0.0)
        if not channel_choice.scores or gain < PER_CHANNEL_MARGIN_DB:
            ranges = {**ranges, **per_tensor}
    # eq. (30): LSTMs / GRUs quantized per step at run time against the same file with them
    # float, at the outputs on the held-out calibration feeds (the odd ones, as eq. (24)).
    # Both take the file's ranges: the recurrent layers take none (x and h are quantized
    # per step at run time), so the two differ only in them.
    recurrent_choice = None
    if recipe.recurrent is RecurrentMode.AUTO:
        recurrent_mode = RecurrentMode.DYNAMIC
        # a main-graph LSTM / GRU that quantize_lstms rewrites (eq. (26) and the GRU size bar
        # keep others float without a candidate), or one inside a body
        if any(x not in lstm_float for x in lstm_x) or has_recurrent(bodies):
            if not choice_feeds and reiterable(calibration_data):
                choice_feeds = list(
                    iter_feeds(calibration_data, graph.inputs, preprocess=preprocess, limit=2 * FEEDS)
                )
            rec = dataclasses.replace(recipe, recurrent=RecurrentMode.DYNAMIC)
            dynamic = candidate(ranges)
            if has_dynamic_recurrent(dynamic):
                rec = dataclasses.replace(recipe, recurrent=RecurrentMode.FLOAT)
                with tempfile.TemporaryDirectory(prefix="quanta-recurrent-") as tmp:
                    reference = os.path.join(tmp, "float.onnx")
                    save(model, reference, check=False)
                    recurrent_choice = measure_recurrent(
                        reference,
                        dynamic,
                        candidate(ranges),
                        choice_feeds[1::2][:FEEDS],
                        lambda m, path: save(m, path, check=False),
                        run_file,
                    )
                if recurrent_choice.keep_float:
                    recurrent_mode = RecurrentMode.FLOAT
        recipe = dataclasses.replace(recipe, recurrent=recurrent_mode)  # the file records the choice
    # eq. (28) (quanta.quantize.pool_bias): the layers that read a global average pool,
    # measured on the float model as it is now and on the file once built
    pooled = pooled_layers(graph, plan) if recipe.pool_bias_correction else {}
    pool_float = to_proto(model) if pooled else None
    pool_feeds: list[dict] = []
    if pooled:
        if choice_feeds:
            pool_feeds = choice_feeds[: 2 * FEEDS]
        elif reiterable(calibration_data):
            pool_feeds = list(
                iter_feeds(calibration_data, graph.inputs, preprocess=preprocess, limit=2 * FEEDS)
            )
    if recipe.depthwise_input_per_channel == "auto" and recipe.method is CalibrationMethod.WEIGHTED_MSE:
        # the file records eq. (29)'s choice
        chosen = tuple(sorted(n for n in per_channel if n in ranges and ranges[n].axis is not None))
        recipe = dataclasses.replace(recipe, depthwise_input_per_channel=chosen)
    lstms = finish(model, plan, bodies, ranges, recipe, gptq if rounded else None)
    if recurrent_choice is not None and recurrent_choice.keep_float:
        # eq. (30)'s measurement, not the user's recipe, keeps them float
        recurrent_reason = recurrent_choice.node_reason()
        lstms = {k: recurrent_reason if r == RECURRENT_FLOAT_REASON else r for k, r in lstms.items()}
        for scope in (s for top in bodies for s in top.walk()):
            scope.lstms = {
                k: recurrent_reason if r == RECURRENT_FLOAT_REASON else r for k, r in scope.lstms.items()
            }
    model.metadata["quanta.recipe"] = recipe.to_json()
    model.producer_name = "quanta"
    report = lowered_coverage(model, shapes)
    if recipe.subgraphs is SubgraphMode.DYNAMIC:
        prefixes = tuple(scope.prefix for scope in bodies)
        for c in report.nodes:
            if c.name.startswith(prefixes) and not c.integer_op and c.op in recipe.op_types:
                c.reasons = [SUBGRAPH_STATIC_REASON]
    check_integer_share(report, recipe.min_integer_share, model_output)
    protect = [source_path] if source_path else []
    proto = to_proto(model)
    pool_bias = None
    if pooled and pool_float is not None:
        pool_bias = correct_pooled(proto, pool_float, pooled, pool_feeds, run_file)
    share_equal_initializers(proto)  # readers whose integer weights came out equal share one
    save(proto, model_output, protect=[*protect, *([model.path] if model.path else [])])
    learned = _learn(model_input, model_output, source_data, source_preprocess, graph, recipe)
    summary = _summarize(model, plan, lstms, model_output, recipe, samples, time.perf_counter() - t0)
    if learned is not None:
        summary.notes.append(learned)
    for scope in (s for top in bodies for s in top.walk()):
        _summarize_body(summary, scope, recipe)
    summary.coverage = report
    summary.range_choice = range_choice
    if channel_choice is not None:
        measured = ", ".join(f"{k} {v:.1f} dB" for k, v in channel_choice.scores.items())
        kept = "per channel" if recipe.depthwise_input_per_channel else "per tensor"
        # ONNX Runtime fuses no Conv whose input has a per-channel grid: a user who deploys
        # the file there needs to know it runs those convolutions in float
        ort = (
            "; ONNX Runtime runs these depthwise convolutions in float (slower there), "
            "depthwise_input_per_channel='off' keeps them fused in ONNX Runtime"
            if recipe.depthwise_input_per_channel
            else ""
        )
        summary.notes.append(
            f"depthwise inputs (eq. (29b)): {kept} ({measured or channel_choice.reason}; "
            f"per channel needs {PER_CHANNEL_MARGIN_DB} dB more){ort}"
        )
    summary.pool_bias = pool_bias
    if recurrent_choice is not None:
        summary.notes.append(recurrent_choice.note())
    note = file_note(model_output)
    if note:
        summary.notes.append(note)
    # eq. (27) (docs/calibration.md): an 8-bit file far from FP32 is measured against a 16-bit one
    if wide_fallback and wide_candidate(recipe, range_choice, channel_choice) and reiterable(source_data):
        summary = _wider_if_better(
            model_input,
            model_output,
            source_data,
            recipe,
            graph,
            summary,
            best_8bit_sqnr(range_choice, channel_choice),
            dict(
                preprocess=source_preprocess, engine=engine, workers=workers, address=address, shards=shards
            ),
        )
    if verbose:
        print(summary.format())
    return summary


def _wider_if_better(
    model_input: Any,
    model_output: str | os.PathLike,
    data: Any,
    recipe: Recipe,
    graph: Any,
    summary: QuantizationSummary,
    best8: float | None,
    run_options: dict[str, Any],
) -> QuantizationSummary:
    """Eq. (27): the 8-bit configurations measured (``best8``, eqs. (24) and (29b)) are
    under WIDE_TRY_SQNR_DB, the "far from FP32" bar. Run the 8-bit file written to
    ``model_output`` and the float model on the held-out calibration feeds; when the file
    itself reaches the bar it is kept; else quantize again with 16-bit activations and keep
    that file when it gains WIDE_MARGIN_DB. Returns the summary of the file kept, with a
    note saying what was measured."""
    from quanta.quantize.range_choice import mean_sqnr_db

    # eq. (24)'s held-out feeds: the odd ones of the first 2 * FEEDS
    feeds = list(iter_feeds(data, graph.inputs, preprocess=run_options["preprocess"], limit=2 * FEEDS))[1::2]
    n_feeds = summary.range_choice.feeds if summary.range_choice is not None else len(feeds)
    with tempfile.TemporaryDirectory(prefix="quanta-a16-") as tmp:
        if isinstance(model_input, (str, os.PathLike)):
            reference = os.fspath(model_input)
        else:
            reference = os.path.join(tmp, "float.onnx")
            proto = (
                model_input
                if isinstance(model_input, onnx.ModelProto)
                else onnx.load_from_string(model_input)
            )
            onnx.save(proto, reference)
        try:
            ref = run_file(reference, feeds)
            eight = mean_sqnr_db(ref, run_file(os.fspath(model_output), feeds))
        except Exception:  # a measurement never makes quantization fail (as eq. (24)'s)
            ref, eight = None, None
        sixteen = None
        wide: QuantizationSummary | None = None
        if ref is not None and eight is not None and eight < WIDE_TRY_SQNR_DB:
            path = os.path.join(tmp, "a16.onnx")
            built = quantize_static(
                model_input, path, data, widened_recipe(recipe, graph), verbose=False, **run_options
            )
            assert isinstance(built, QuantizationSummary)
            wide = built
            try:
                sixteen = mean_sqnr_db(ref, run_file(path, feeds))
            except Exception:
                sixteen = None
        keep, note = wide_decision(WIDE_TRY_SQNR_DB if best8 is None else best8, n_feeds, eight, sixteen)
        if not keep or wide is None:
            summary.notes.append(note)
            return summary
        save(onnx.load(path), model_output)
    wide.output = os.fspath(model_output)
    wide.seconds += summary.seconds
    wide.notes.append(note)
    return wide


def widened_recipe(recipe: Recipe, graph: Any) -> Recipe:
    """Eq. (27)'s candidate: ``recipe`` with 16-bit (int16) activations, and the output of
    every Conv / Gemm / MatMul that is not a graph output quantized to int16 as well (an
    A16W8 group needs its output quantized, docs/quantization-math.md §A16W8; a layer
    read only by float ops, an InstanceNormalization, would otherwise run in float).
    The recipe's own overrides win."""
    from quanta.quantize.recipe import TensorOverride

    outputs = {id(v) for v in graph.outputs}
    macs = [n.outputs[0].name for n in graph.nodes if n.op_type in MAC_OPS and n.outputs]
    macs = [name for name in macs if id(graph.value(name)) not in outputs]
    widened = {n: TensorOverride(dtype="int16") for n in dict.fromkeys(macs) if n not in recipe.overrides}
    return dataclasses.replace(recipe, activation_type="int16", overrides={**recipe.overrides, **widened})


# eq. (29b): the measured gain (dB of output SQNR on held-out calibration feeds) for which
# the per-channel grids of depthwise inputs are kept; below it the file keeps one grid per
# tensor (ONNX Runtime runs that file faster: it fuses only per-tensor activations)
PER_CHANNEL_MARGIN_DB = 0.5


def depthwise_per_channel(graph: Any, plan: Any, weights_for: dict, recipe: Recipe) -> list[str]:
    """The tensors whose observers may choose per-channel grids (eq. (29)): the
    depthwise-only inputs (qdq.depthwise_only_inputs) under method "weighted_mse", all of
    them with "auto", those the recipe lists with a list (a file's recorded choice)."""
    setting = recipe.depthwise_input_per_channel
    if setting == "off" or recipe.method is not CalibrationMethod.WEIGHTED_MSE:
        return []
    names = depthwise_only_inputs(graph, plan, weights_for)
    return names if setting == "auto" else [n for n in names if n in setting]


def _keep_first(feeds, kept: list, n: int):
    """``feeds`` passed through; the first ``n`` also appended to ``kept``."""
    for feed in feeds:
        if len(kept) < n:
            kept.append(feed)
        yield feed


def _smooth(model: Model, data: Any, recipe: Recipe, preprocess) -> tuple[list[str], Any]:
    """SmoothQuant on the float graph (quanta.quantize.smooth): one pass over the data for
    the per-channel maxima, then the factors folded into constants. Returns the names of
    the Mul nodes whose outputs were balanced, and the data for the calibration pass (a
    one-shot reader or iterator is read into a list here, as the calibration reads the
    data a second time)."""
    from quanta.quantize.smooth import apply_smoothing, plan_smoothing

    alpha = recipe.smooth_quant
    if alpha is None:
        raise ValueError("SmoothQuant: the recipe has smooth_quant off (None); the caller checks it is set")
    sites = plan_smoothing(model.graph, recipe.op_types, insert=True)
    if not sites:
        return [], data
    data = _float_pass(model, data, recipe, preprocess, {s.x.name: [s.observe] for s in sites})
    return apply_smoothing(model.graph, sites, float(alpha)), data


def _equalize(model: Model, data: Any, recipe: Recipe, preprocess) -> Any:
    """Cross-layer equalization on the float graph (quanta.quantize.equalize): one pass
    over the data for the per-channel maxima, then eq. (14)'s factors folded into the
    weights. Returns the data for the next pass (read into a list if it was one-shot)."""
    from quanta.quantize.equalize import apply_equalization, plan_equalization

    sites = plan_equalization(model.graph, recipe.op_types, recipe.excludes)
    if not sites:
        return data
    data = _float_pass(model, data, recipe, preprocess, {s.y.name: [s.observe] for s in sites})
    apply_equalization(model.graph, sites)
    return data


def _float_pass(model: Model, data: Any, recipe: Recipe, preprocess, taps: dict[str, list]) -> Any:
    """One pass of the float model over the calibration data, each named value handed to
    its ``taps`` (SmoothQuant's and equalization's per-channel maxima); returns the data
    in a form the next pass can read again."""
    data = _rereadable(data, model.graph, recipe, preprocess)
    calibrate(
        model,
        [],
        data,
        make_observer_factory(recipe),
        preprocess=preprocess,
        limit=recipe.calibration_samples,
        progress=False,
        taps=taps,
    )
    return data


def _log_float(model: Model, data: Any, graph, recipe: Recipe, preprocess) -> dict[str, str]:
    """Eq. (HB2) (quanta.quantize.log_inputs): the Conv / Gemm / MatMul layers that stay
    float because a Log reads their output and their input spreads over many powers of
    two, with the reason; {} when the model has none or the data cannot be read twice
    (the calibration run itself must read it then)."""
    from quanta.calibrate.spread import SpreadObserver
    from quanta.quantize.log_inputs import log_layers, log_reasons
    from quanta.quantize.range_choice import FEEDS
    from quanta.quantize.recurrent import SPREAD_LIMIT

    layers = log_layers(graph)
    layers = {k: v for k, v in layers.items() if not any(re.fullmatch(p, k) for p in recipe.exclude)}
    if not layers or not reiterable(data):
        return {}

    def observe(names: list[str]) -> dict[str, Any]:
        seen = calibrate(
            model, names, data, lambda _: SpreadObserver(), preprocess=preprocess, limit=FEEDS, progress=False
        )
        return dict(seen.items())

    return log_reasons(layers, observe, SPREAD_LIMIT)


def _rereadable(data: Any, graph, recipe: Recipe, preprocess) -> Any:
    """``data`` in a form that can be read twice (a one-shot reader or iterator is read
    into a list; paths, lists and rewindable readers are returned as they are)."""
    from quanta.calibrate.readers import iter_feeds

    if not isinstance(data, (list, tuple, str, os.PathLike, Mapping)) and not hasattr(data, "rewind"):
        data = list(iter_feeds(data, graph.inputs, preprocess=preprocess, limit=recipe.calibration_samples))
    return data


def _learn(model_input, model_output, data, preprocess, graph, recipe: Recipe) -> str | None:
    """Recipe.learned: the written file's weight and bias codes trained against the FP32
    model on the calibration feeds (quanta.qat.learned); the summary's note on it."""
    if recipe.learned is None:
        return None
    from quanta.calibrate.readers import iter_feeds
    from quanta.quantize.accuracy import learn_file

    if not isinstance(model_input, (str, os.PathLike, bytes, onnx.ModelProto)):
        raise ValueError("recipe.learned needs the FP32 model as an ONNX file, bytes or a ModelProto")
    if not reiterable(data):
        raise ValueError("recipe.learned reads the calibration data a second time: pass a list or a folder")
    feeds = list(iter_feeds(data, graph.inputs, preprocess=preprocess, limit=recipe.calibration_samples))
    done = learn_file(model_input, model_output, feeds, recipe.learned)
    before, after = done["holdout_loss"]
    return (
        f"learned ({done['method']}): {done['steps']} step(s), the state of step {done['best_step']} kept "
        f"(held-out loss {before:.4g} -> {after:.4g}), {done['cpu_seconds']:.0f} s CPU on "
        f"{done['threads']} thread(s)"
    )


def _quantize_to_target(
    model_input,
    model_output,
    calibration_data,
    recipe: Recipe,
    preprocess,
    verbose: bool,
    accuracy: Any,
    engine: tuple[Any, int | None, str | None] = ("inprocess", None, None),
    shards: int | None = None,
) -> QuantizationSummary:
    """quantize_static with an accuracy target: the feeds are read once (they are split
    into calibration / search / confirmation parts), then quanta.quantize.accuracy.search.
    ``engine`` (name or engine, workers, address): where each trial's calibration, the
    evaluations and the debugger passes run (the same results on any engine)."""
    from quanta.calibrate.readers import iter_feeds
    from quanta.quantize.accuracy import AccuracyTarget, search

    if not isinstance(accuracy, AccuracyTarget):
        raise TypeError(f"accuracy: expected a quanta.AccuracyTarget, got {type(accuracy).__name__}")
    inputs = load_for_quantization(model_input).graph.inputs
    feeds = list(
        iter_feeds(calibration_data, inputs, preprocess=preprocess, limit=recipe.calibration_samples)
    )
    if accuracy.eval_data is not None:
        accuracy = dataclasses.replace(accuracy, eval_data=list(iter_feeds(accuracy.eval_data, inputs)))

    name, workers, address = engine
    eng = None
    if name != "inprocess" or workers not in (None, 1):
        from quanta.scale import make_engine

        eng = make_engine(name, workers, address)

    def run(src, dst, calib, rec):
        # GPTQ's statistics stream into this process (they have no mergeable state)
        # eq. (27) off: the search measures and widens tensors itself
        if eng is None or rec.weight_rounding in ("gptq", "gptq_cd", "gptaq", "brecq"):
            return quantize_static(src, dst, calib, rec, verbose=False, wide_fallback=False)
        return quantize_static(
            src, dst, calib, rec, verbose=False, engine=eng, shards=shards, wide_fallback=False
        )

    summary, report = search(model_input, model_output, feeds, recipe, accuracy, run, engine=eng)
    summary.accuracy = report
    if verbose:
        print(summary.format())
    return summary


class IntegerShareError(ValueError):
    """Quantization would leave more compute float than ``min_integer_share`` allows."""


def check_integer_share(report: CoverageReport, minimum: float | None, output: str | os.PathLike) -> None:
    """Raise IntegerShareError, naming the largest float compute nodes, when fewer than
    ``minimum`` of the MACs would run in integer (nothing has been written then)."""
    if minimum is None or report.integer_share >= minimum:
        return
    raise IntegerShareError(
        f"{output}: not written: {report.integer_share * 100:.1f} % of the MACs would run in integer, "
        f"below min_integer_share {minimum * 100:.1f} %\n" + report.format_share(rows=10)
    )


def _recipe_from(recipe: Recipe | str | os.PathLike | None, options: dict[str, Any]) -> Recipe:
    if recipe is None:
        base = Recipe()
    elif isinstance(recipe, Recipe):
        base = recipe
    else:
        base = Recipe.from_file(recipe)
    if not options:
        return base
    d = base.to_dict()
    d.update(options)
    return Recipe.from_dict(d, where="options")


SUBGRAPH_REASON = (
    "control flow: the node stays; its subgraphs are quantized inside (their nodes are listed as "
    "'{node}/{attribute}/{name}')"
)


SUBGRAPH_FLOAT_REASON = "control flow: its subgraphs stay float (recipe subgraphs: float)"
SUBGRAPH_STATIC_REASON = (
    "inside a subgraph, static activation quantization is opt-in (recipe subgraphs: quantize; "
    "the default, dynamic, quantizes LSTMs only)"
)


def body_recipe(recipe: Recipe) -> Recipe:
    """The recipe a body is planned with: the recipe itself for subgraphs: quantize; no
    statically quantized op for subgraphs: dynamic (LSTMs still become
    DynamicQuantizeLSTM)."""
    if recipe.subgraphs is SubgraphMode.QUANTIZE:
        return recipe
    return dataclasses.replace(recipe, op_types=frozenset())


def _has_subgraphs(node) -> bool:
    return any(
        isinstance(v, onnx.GraphProto)
        or (isinstance(v, list) and any(isinstance(g, onnx.GraphProto) for g in v))
        for v in node.attrs.values()
    )


#: why the Mul that SmoothQuant balances (or inserts) before a MatMul stays float
SMOOTH_REASON = (
    "SmoothQuant's balancing Mul: its input keeps the outliers the balancing moves out of "
    "its output, so it stays float (no MACs)"
)


def _summarize(
    model: Model,
    plan: QdqPlan,
    lstms: dict[int, str | None],
    output: str | os.PathLike,
    recipe: Recipe,
    samples: int,
    seconds: float,
) -> QuantizationSummary:
    """``lstms``: quantize_lstms' decisions, which replace the plan's for those nodes."""
    s = QuantizationSummary(output=str(output), method=recipe.method.value, samples=samples, seconds=seconds)
    for d in plan.decisions:
        if id(d.node) in lstms:
            reason = lstms[id(d.node)]
            if reason is None:
                s.quantized.append((d.node.name, d.node.op_type))
            else:
                s.float_nodes.append((d.node.name, d.node.op_type, reason))
        elif d.quantize:
            s.quantized.append((d.node.name, d.node.op_type))
        elif _has_subgraphs(d.node):
            reason = SUBGRAPH_FLOAT_REASON if recipe.subgraphs is SubgraphMode.FLOAT else SUBGRAPH_REASON
            s.float_nodes.append((d.node.name, d.node.op_type, reason))
        else:
            s.float_nodes.append((d.node.name, d.node.op_type, d.reason))
    seen = set()
    for t in plan.tensors.values():
        if t.float_reason and t.name not in seen and t.role == "activation":
            seen.add(t.name)
            s.float_tensors.append((t.name, t.float_reason))
    if model.path and os.path.exists(model.path):
        s.input_bytes = os.path.getsize(model.path)
    if Path(output).exists():
        s.output_bytes = os.path.getsize(output)
    return s


def _summarize_body(s: QuantizationSummary, scope: BodyScope, recipe: Recipe) -> None:
    """Add the decisions of one body's plan to ``s``, nodes and tensors named under the
    body's scope."""
    plan = scope.plan
    assert plan is not None
    static_opt_in = recipe.subgraphs is SubgraphMode.DYNAMIC
    for d in plan.decisions:
        name = scope.prefix + (d.node.name or d.node.op_type)
        if id(d.node) in scope.lstms:
            reason = scope.lstms[id(d.node)]
            if reason is None:
                s.quantized.append((name, d.node.op_type))
            else:
                s.float_nodes.append((name, d.node.op_type, reason))
        elif d.quantize:
            s.quantized.append((name, d.node.op_type))
        elif _has_subgraphs(d.node):
            continue  # a nested If / Loop / Scan: its own scope lists its nodes
        elif static_opt_in and d.node.op_type in recipe.op_types:
            s.float_nodes.append((name, d.node.op_type, SUBGRAPH_STATIC_REASON))
        else:
            s.float_nodes.append((name, d.node.op_type, d.reason))
    seen = set()
    for t in plan.tensors.values():
        if t.float_reason and t.name not in seen and t.role == "activation":
            seen.add(t.name)
            s.float_tensors.append((scope.prefix + t.name, t.float_reason))


def recipe_of(path: str | os.PathLike) -> Recipe:
    """The recipe a quanta-quantized model was made with (from its metadata)."""
    proto = onnx.load(os.fspath(path), load_external_data=False)
    meta = {p.key: p.value for p in proto.metadata_props}
    if "quanta.recipe" not in meta:
        raise ValueError(f"{path}: not quantized by quanta (no quanta.recipe metadata)")
    return Recipe.from_dict(json.loads(meta["quanta.recipe"]), where=f"{path} metadata")
