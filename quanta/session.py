"""``InferenceSession``: ONNX Runtime's API over quanta's targets.

    sess = quanta.InferenceSession("model.onnx")            # backend="native"
    sess = quanta.InferenceSession(proto, backend="reference")
    outs = sess.run(None, {"input": x})                      # list of numpy arrays
    sess.get_inputs()[0].name, .shape, .type                 # as ONNX Runtime reports them

Feeds are validated before anything runs: an unknown or missing input name, a wrong
dtype or a shape that contradicts the model's fixed dimensions raises
:class:`InvalidArgument` listing what the model expects.

The model is compiled once (:func:`quanta.runtime.compile`: kernels, slots, memory
plan; ``sess.plan`` prints it) and run by :class:`quanta.runtime.execute.Executor`.
Profiling as in ONNX Runtime::

    sess = quanta.InferenceSession(path, enable_profiling=True)  # or SessionOptions
    sess.run(None, feeds)
    print(sess.profile_summary())          # the slowest steps
    path = sess.end_profiling()            # {profile_file_prefix}_{timestamp}.json, as ORT
"""

from __future__ import annotations

import enum
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx

from quanta.hal.capabilities import UNPLANNED_SHAPE
from quanta.ir.graph import Model
from quanta.ir.ms_contrib import ORT_QUANTIZER_PRODUCER
from quanta.ir.onnx_io import load
from quanta.ir.types import CalibratedType, QuantType, TensorType, as_string_feed
from quanta.runtime.compile import compile as compile_model
from quanta.runtime.execute import Executor
from quanta.runtime.hetero import HeteroExecutor, SignatureExecutor
from quanta.runtime.plan import Plan
from quanta.runtime.profile import Profiler, ProfileSummary
from quanta.runtime.tuner import TuneReport, tune_session, tuning_enabled
from quanta.targets import TargetError, target_info

if TYPE_CHECKING:
    from quanta.passes.manager import Pass

__all__ = ["GraphOptimizationLevel", "InferenceSession", "InvalidArgument", "NodeArg", "SessionOptions"]


class InvalidArgument(ValueError):
    """Feeds or output names that do not match the model (ONNX Runtime: INVALID_ARGUMENT)."""


@dataclass(frozen=True)
class NodeArg:
    """A graph input or output as ONNX Runtime describes it."""

    name: str
    shape: list[int | str | None] | None
    type: str

    def __str__(self) -> str:
        return f"{self.name}: {self.type} {self.shape}"


class GraphOptimizationLevel(enum.IntEnum):
    """ONNX Runtime's levels. quanta has two behaviours: DISABLE_ALL runs the graph as
    written; any other level runs the compiler's default pipeline (QDQ groups lowered to
    integer operators), on every backend, so "native" and "reference" execute the same
    integer arithmetic."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_ALL = 99


@dataclass
class SessionOptions:
    """Options with ONNX Runtime's names, where ONNX Runtime has them."""

    graph_optimization_level: GraphOptimizationLevel = GraphOptimizationLevel.ORT_ENABLE_ALL
    intra_op_num_threads: int = 0  # 0: all cores this process may run on
    enable_profiling: bool = False
    profile_file_prefix: str = "quanta_profile"
    log_severity_level: int = 2
    #: Sigmoid, Tanh and BatchNormalization as ONNX defines them ("onnx": quanta's
    #: kernels, docs/float-ops.md) or as ONNX Runtime computes them ("ort": MLAS's
    #: rational approximations, ORT's folded batch-norm scale and shift, its truncating
    #: linear Resize of 8-bit codes, what a file made for ORT was calibrated with); "auto": "ort" for a file ORT's quantizer wrote
    #: (producer "onnx.quantize"), else "onnx". Both "ort" and "auto" on such a file run
    #: ORT's u8·s8 integer groups (the Conv, MatMul and Gemm groups it fuses, MatMulInteger
    #: and its fused forms, DynamicQuantizeLSTM) with ORT's int16-saturating pairs of products on a CPU
    #: whose ORT kernels saturate (x86 without VNNI; elsewhere ORT's sum is exact, as
    #: quanta's), natively and no slower than the exact sum. Both also run ORT's float
    #: orders at this session's thread count ("ort": all; "auto": AUTO_FLOAT_ORDERS): the
    #: QDQ Conv groups ORT leaves float in MLAS's float Conv order, float MatMuls in its
    #: SGEMM's, average pools in MlasPool's (bit-identical to ORT; a float Conv costs about
    #: twice quanta's exact integer one, as it does in ORT). "auto" runs every file's float
    #: LSTM and GRU in ORT's order (OrtLSTM, OrtGRU: fused multiply-add chains, exact to
    #: their twins and ORT's bytes, faster than ONNX's multiply-then-add order, which
    #: "onnx" keeps; docs/float-ops.md (RO1)). "auto" and "ort" also run a weight-only
    #: MatMul / Gemm (a DequantizeLinear of a constant weight, float activation) as ONNX
    #: Runtime's level-2 optimizer does, a MatMulNBits whose activation is quantized to int8
    #: per block (passes/rules/ort_dq_matmul_nbits.py, docs/quantization-math.md (NB8-2));
    #: "onnx" keeps ONNX's float product.
    #: docs/float-ops.md, "ONNX Runtime's functions", (QC1)-(QC4), (QM1), "ONNX Runtime's
    #: float convolution" and "Which of ORT's float orders "auto" takes".
    float_functions: str = "auto"

    #: which of ORT's float orders (ort_float_functions.FLOAT_ORDERS: "conv", "matmul",
    #: "pool") a session that runs ORT's functions takes; None: "ort" takes all, "auto"
    #: AUTO_FLOAT_ORDERS. Without "conv" the QDQ Conv groups ORT leaves float keep
    #: quanta's exact integer sum while ORT's integer groups keep its saturating pairs: on
    #: TensorRT-style symmetric files (int8 activations, which ORT leaves float where it
    #: cannot make them uint8) 1.20x instead of 1.54x quanta's own file with 3 instead of 4
    #: output steps from ORT on EfficientNet-Lite0, 0.99x instead of 2.99x with 8 instead
    #: of 0 on nudenet_320n (docs/float-ops.md (OT1)-(OT3)). Ignored where the session runs
    #: ONNX's functions.
    ort_float_orders: frozenset[str] | None = None

    #: quanta's own: run a MatMul whose weight the file stores as 8-bit integers times a
    #: scale (``Cast`` -> ``Mul``, "weight only") as ``DynamicQuantizeMatMul``, its float
    #: activation quantized on every run (ONNX Runtime's ``quantize_dynamic`` form:
    #: integer multiply-adds, the activation's rounding in the result). False: the file's
    #: own float semantics, as ONNX Runtime and OpenVINO run such files (the weight
    #: dequantized once, a float GEMM). passes/lower/weight_only_matmul.py.
    dynamic_weight_only: bool = False

    #: quanta's own: measure the int8 GEMM blockings of this model's shapes on this CPU
    #: (cached per CPU model; quanta/runtime/tuner.py); QUANTA_TUNE=0 turns it off
    enable_tuning: bool = True
    tuning_budget_s: float = 3.0  # measuring time per model, seconds

    #: device targets (backend="npu-sim"): the device memory in bytes (None: the
    #: target's default), how long a run waits for a device fence before it fails, and
    #: whether nodes the device cannot run may form host partitions (False: such a node
    #: is an error naming it and the rule it breaks)
    device_memory_bytes: int | None = None
    device_timeout_s: float = 60.0
    allow_host_partitions: bool = True


FLOAT_FUNCTIONS = ("auto", "onnx", "ort")

#: ONNX Runtime's float orders (ort_float_functions.FLOAT_ORDERS: "conv" MlasConv, "matmul"
#: MlasMatMul, "pool" MlasPool's global and 2-D averages) a session with "auto" takes on a
#: file ORT's quantizer wrote ("ort" by name takes all; docs/float-ops.md, "Which of ORT's
#: float orders "auto" takes")
AUTO_FLOAT_ORDERS: frozenset[str] = frozenset({"conv", "matmul", "pool"})


def uses_ort_float_functions(model: Model, float_functions: str) -> bool:
    """Whether a session with ``float_functions`` runs ``model`` with ONNX Runtime's
    Sigmoid, Tanh and BatchNormalization (SessionOptions.float_functions)."""
    if float_functions not in FLOAT_FUNCTIONS:
        raise ValueError(
            f"float_functions: expected one of {', '.join(FLOAT_FUNCTIONS)}, got {float_functions!r}"
        )
    if float_functions == "auto":
        return model.producer_name == ORT_QUANTIZER_PRODUCER
    return float_functions == "ort"


def _ort_type(t: TensorType | None) -> str:
    if t is None:
        return "tensor(unknown)"
    elem = t.elem
    if isinstance(elem, QuantType):
        code = elem.storage.onnx
    elif isinstance(elem, CalibratedType):
        code = elem.expressed.onnx
    else:
        code = elem.onnx
    name = onnx.TensorProto.DataType.Name(code).lower()
    return f"tensor({'float' if name == 'float' else name})"


def _ort_shape(t: TensorType | None) -> list[int | str | None] | None:
    if t is None or t.shape is None:
        return None
    return list(t.shape)


class InferenceSession:
    """Load a model (path, bytes or ``onnx.ModelProto``) and run it on a target.

    ``backend``: "native" (C++ kernels, reference fallback for nodes without one),
    "reference" (the bit-exact NumPy golden) or a device target such as "npu-sim"
    (``quanta.targets.registry``: device partitions on the target's HAL device, the rest
    on its host target). ``device``: a HAL device to run on instead of a fresh one of
    the target's kind (tests inject faults this way).
    """

    def __init__(
        self,
        model: str | os.PathLike | bytes | onnx.ModelProto,
        sess_options: SessionOptions | None = None,
        providers: Sequence[str] | None = None,
        *,
        backend: str = "native",
        enable_profiling: bool | None = None,
        device: Any = None,
    ):
        del providers  # accepted for ONNX Runtime compatibility; quanta picks by ``backend``
        t0 = time.perf_counter_ns()
        self._options = sess_options or SessionOptions()
        if enable_profiling is not None:
            self._options.enable_profiling = enable_profiling
        if self._options.intra_op_num_threads < 0:
            raise ValueError(
                f"intra_op_num_threads: expected >= 0 (0: all cores), got {self._options.intra_op_num_threads}"
            )
        self._source = model
        self._model: Model = load(model)
        self._backend = backend
        self._plan: Plan = self._compile(self._model)
        #: overridable initializers the compiled plan no longer reads (folded into the
        #: weights): their defaults are dropped here and read again from the source by
        #: the first run that overrides one (_overriding_executor)
        self._released_defaults = release_unread_defaults(self._model)
        if self._plan.passes is not None:
            # why each rule did not fire where it was tried: `quanta inspect --why-not`
            # runs the passes again to show it; a session would hold ~10 MB of these
            # strings on a CNN + LSTM of 200 nodes
            self._plan.passes.no_matches = []
        self._profiler: Profiler | None = None
        if self._options.enable_profiling:
            self._profiler = Profiler(self._plan, start_ns=t0)
            self._profiler.record_session_event("session_initialization", t0, time.perf_counter_ns())
        self._device = None
        self._exe: Executor | HeteroExecutor | SignatureExecutor = self._executor(device)
        self._tuning: TuneReport | None = None
        self._tune_pending = backend == "native" and tuning_enabled(self._options.enable_tuning)
        self._last_profiler: Profiler | None = self._profiler
        g = self._model.graph
        # As ONNX Runtime: an input that also has an initializer is an overridable
        # initializer, not listed by get_inputs() and not required in the feeds.
        self._inputs = [
            NodeArg(v.name, _ort_shape(v.type), _ort_type(v.type))
            for v in g.inputs
            if v.const is None and v.name not in self._released_defaults
        ]
        self._outputs = [NodeArg(v.name, _ort_shape(v.type), _ort_type(v.type)) for v in g.outputs]
        self._input_types = {v.name: v.type for v in g.inputs}  # overridable initializers too
        # An input that also has an initializer is optional (the initializer is its default).
        self._defaults = {v.name: v.const for v in g.inputs if v.const is not None}
        #: every overridable initializer, released or not
        self._default_names = frozenset(self._defaults) | frozenset(self._released_defaults)
        #: compiled on the first run that feeds one of ``_default_names`` (_overriding_executor)
        self._override_exe: Executor | HeteroExecutor | None = None
        #: the released defaults, read from the source with ``_override_exe``
        self._override_defaults: dict[str, np.ndarray] = {}
        # what _validate checks per input, decided once: (dtype or None, rank or None,
        # the fixed dimensions as (axis, size))
        self._checks: dict[str, tuple[np.dtype | None, int | None, tuple[tuple[int, int], ...]]] = {}
        for name, t in self._input_types.items():
            if t is None:
                self._checks[name] = (None, None, ())
                continue
            shape = t.shape
            fixed = (
                ()
                if shape is None
                else tuple((k, d) for k, d in enumerate(shape) if isinstance(d, int) and d >= 0)
            )
            self._checks[name] = (_numpy_dtype(t), None if shape is None else len(shape), fixed)
        self._output_names = [o.name for o in self._outputs]
        self._required = [a.name for a in self._inputs if a.name not in self._default_names]
        if self._tune_pending:
            feeds = self._static_feeds()
            if feeds is not None:  # else the first run's feeds give the shapes
                self._tune(feeds)

    def _compile(self, model: Model) -> Plan:
        if self._options.ort_float_orders is not None:
            from quanta.passes.rules.ort_float_functions import FLOAT_ORDERS

            unknown = sorted(set(self._options.ort_float_orders) - FLOAT_ORDERS)
            if unknown:
                raise ValueError(
                    f"SessionOptions.ort_float_orders: unknown orders {unknown}; expected a subset of "
                    f"{sorted(FLOAT_ORDERS)}"
                )
        if uses_ort_float_functions(model, self._options.float_functions):
            # what the functions compute, not an optimization: on every level
            from quanta.passes.manager import PassManager
            from quanta.passes.rules.ort_float_functions import FLOAT_ORDERS, OrtFloatFunctions

            # ORT's float orders (MlasConv, MlasMatMul, MlasPool: reference/mlas_conv.py,
            # mlas_matmul.py, mlas_pool.py) follow MLAS's schedule for ORT's thread count,
            # which is this session's. By name: all of them. "auto" on a file ORT's
            # quantizer wrote: AUTO_FLOAT_ORDERS, each of whose steps runs on a recorded
            # native kernel (docs/float-ops.md, "Which of ORT's float orders "auto"
            # takes", (AO1)-(AO2), with the time each costs the zoo's ORT files).
            from quanta.quantize.ort_saturation import onnxruntime_float_orders_modelled

            by_name = self._options.float_functions == "ort"
            # "auto" only where the twins are this host's ORT (AVX2 + FMA, no AVX-512F)
            modelled = onnxruntime_float_orders_modelled()
            orders = FLOAT_ORDERS if by_name else AUTO_FLOAT_ORDERS if modelled else frozenset()
            if self._options.ort_float_orders is not None and (by_name or modelled):
                orders = frozenset(self._options.ort_float_orders)
            threads = resolve_threads(self._options.intra_op_num_threads) if orders else None
            # "auto" and "ort": the Conv groups ORT fuses and its u8·s8 integer GEMMs as its
            # kernels compute them on this CPU (pairs of products saturate without VNNI:
            # reference/mlas_qconv.py, docs/float-ops.md (QC1)-(QC4), (QM1)); native, at
            # the exact sum's speed or faster. On a VNNI CPU ORT's sum is exact: nothing
            # changes.
            from quanta.passes.rules.ort_integer_resize import OrtIntegerResize
            from quanta.quantize.ort_saturation import onnxruntime_int8_saturates

            saturates = onnxruntime_int8_saturates()
            PassManager(
                [
                    OrtFloatFunctions(
                        threads=threads, u8s8_saturates=saturates, opset=model.opset(), orders=orders
                    ),
                    OrtIntegerResize(),
                ]
            ).run(model)
        elif self._options.float_functions == "auto" and any(
            n.op_type in ("LSTM", "GRU") and n.domain in ("", "ai.onnx") for n in model.graph.nodes
        ):
            # ONNX Runtime's float LSTM / GRU order (RNN-ORT) on every file: exact (its
            # twin, ORT's bytes) and faster than (RNN1)'s multiply-then-add, which
            # float_functions="onnx" keeps (docs/float-ops.md (RO1)); on every level. Not
            # verified here: a graph that only the compiler's folding makes well formed (an
            # integer constant two DequantizeLinears read) fails the verifier before it, and
            # the compiler's pipeline verifies after its own passes when verification is on.
            from quanta.passes.manager import PassManager
            from quanta.passes.rules.ort_float_functions import OrtRecurrentOrder

            PassManager([OrtRecurrentOrder()], verify=False).run(model)
        if (
            self._options.float_functions in ("auto", "ort")
            and self._options.graph_optimization_level >= GraphOptimizationLevel.ORT_ENABLE_EXTENDED
            and any(n.op_type == "DequantizeLinear" for n in model.graph.nodes)
        ):
            # ONNX Runtime's semantics of a weight-only MatMul / Gemm: its level-2 optimizer
            # makes it a MatMulNBits that quantizes the activation per block (not ONNX's
            # float product, which "onnx" and DISABLE_ALL / BASIC keep), on every file
            # (passes/rules/ort_dq_matmul_nbits.py, docs/quantization-math.md (NB8-2))
            from quanta.passes.manager import PassManager
            from quanta.passes.rules.ort_dq_matmul_nbits import OrtDQMatMulNBits

            PassManager([OrtDQMatMulNBits()]).run(model)
        if self._options.dynamic_weight_only:
            # what the graph computes, not an optimization: on every level and target
            from quanta.passes.lower.weight_only_matmul import DynamicWeightMatMuls
            from quanta.passes.manager import PassManager

            PassManager([DynamicWeightMatMuls()]).run(model)
        passes: list[Pass] | None = None if self._options.graph_optimization_level > 0 else []
        return compile_model(
            model,
            self._backend,
            num_threads=resolve_threads(self._options.intra_op_num_threads),
            passes=passes,
        )

    def _executor(self, device: Any) -> Executor | HeteroExecutor | SignatureExecutor:
        """The host executor, or for a plan with device partitions the heterogeneous one
        on ``device`` (or a new device of the backend's kind); compiled per input-shape
        signature when the device cannot plan some shape of the symbolic plan."""
        plan = self._plan
        parts = plan.partitions
        if parts is not None and any(UNPLANNED_SHAPE in why for p in parts for why in p.reasons.values()):
            from quanta.ir.onnx_io import load_proto

            self._proto, _ = load_proto(self._source)
            self._device = device if device is not None else self._make_device()
            return SignatureExecutor(self._build_for_shapes, plan, profiler=self._profiler)
        return self._executor_of(plan, device)

    def _build_for_shapes(self, shapes: dict[str, tuple[int, ...]]) -> Executor | HeteroExecutor:
        """The executor of this model compiled with its graph inputs' shapes fixed."""
        proto = onnx.ModelProto()
        proto.CopyFrom(self._proto)
        for inp in proto.graph.input:
            if inp.name in shapes and inp.type.HasField("tensor_type"):
                dims = inp.type.tensor_type.shape.dim
                del dims[:]
                for d in shapes[inp.name]:
                    dims.add().dim_value = d
        return self._executor_of(self._compile(load(proto)), self._device)

    def _make_device(self) -> Any:
        make = target_info(self._backend).make_device
        if make is None:
            raise TargetError(f"backend '{self._backend}' declares no device")
        opts = {}
        if self._options.device_memory_bytes is not None:
            opts["memory_bytes"] = self._options.device_memory_bytes
        return make(**opts)

    def _executor_of(self, plan: Plan, device: Any) -> Executor | HeteroExecutor:
        parts = plan.partitions
        if parts is not None and not self._options.allow_host_partitions:
            for p in parts:
                for k, why in p.reasons.items():
                    raise TargetError(
                        f"node {plan.steps[k].node.label} cannot run on {self._backend}: {why} "
                        f"(allow_host_partitions is off)"
                    )
        if not parts or all(p.on_host for p in parts):
            return Executor(plan, profiler=self._profiler)
        if device is None:
            device = self._device if self._device is not None else self._make_device()
        self._device = device
        return HeteroExecutor(plan, device, profiler=self._profiler, timeout=self._options.device_timeout_s)

    @property
    def device(self) -> Any:
        """The HAL device the device partitions run on (None: everything on the host)."""
        return self._device

    # -- ONNX Runtime API ---------------------------------------------------
    def get_inputs(self) -> list[NodeArg]:
        return list(self._inputs)

    def get_outputs(self) -> list[NodeArg]:
        return list(self._outputs)

    def get_providers(self) -> list[str]:
        return [f"quanta:{self._backend}"]

    def get_session_options(self) -> SessionOptions:
        return self._options

    @property
    def backend(self) -> str:
        return self._backend

    @property
    def model(self) -> Model:
        return self._model

    @property
    def fallbacks(self) -> list[tuple[str, str, str]]:
        """(node name, op type, reason) for every node not run by a native kernel."""
        return self.plan.fallbacks

    @property
    def plan(self) -> Plan:
        """The compiled plan (``print(sess.plan)``); on a device target compiled per
        input-shape signature, the plan of the last signature run."""
        return getattr(self._exe, "plan", self._plan)

    @property
    def executor(self) -> Executor | HeteroExecutor | SignatureExecutor:
        return self._exe

    # -- profiling (ONNX Runtime's API) -------------------------------------------
    def end_profiling(self) -> str:
        """Stop profiling and write the Chrome trace to
        ``{profile_file_prefix}_{%Y-%m-%d_%H-%M-%S}_{ms}.json``; return its path ("" when
        profiling was not on, as ONNX Runtime)."""
        if self._profiler is None:
            return ""
        path = self._profiler.write_with_prefix(self._options.profile_file_prefix)
        self._profiler = None
        self._exe.profiler = None
        return path

    def get_profiling_start_time_ns(self) -> int:
        """Wall-clock time (ns since the epoch) at which profiling started (0: never)."""
        return 0 if self._last_profiler is None else self._last_profiler.start_time_ns

    def profile_summary(self, top: int = 10) -> ProfileSummary:
        """The ``top`` slowest steps of the profiled runs (also after end_profiling)."""
        if self._last_profiler is None:
            raise RuntimeError("profiling is off: create the session with enable_profiling=True")
        return self._last_profiler.summary(top)

    def run(
        self,
        output_names: Sequence[str] | None,
        input_feed: Mapping[str, Any],
        run_options: Any = None,
    ) -> list[np.ndarray]:
        del run_options  # accepted for ONNX Runtime compatibility
        if not output_names:
            names = self._output_names
        else:
            names = list(output_names)
            known = set(self._output_names)
            for n in names:
                if n not in known:
                    raise InvalidArgument(f"unknown output '{n}'; the model's outputs are: {sorted(known)}")
        feeds = self._validate(input_feed)
        if self._default_names and not self._default_names.isdisjoint(input_feed):
            exe = self._overriding_executor()
            outs = exe.run({**self._override_defaults, **feeds}, names)
        else:
            if self._tune_pending:
                self._tune(feeds)
            outs = self._exe.run(feeds, names)
        # string tensors come out as object arrays, as ONNX Runtime returns them (the
        # NumPy kernels may build fixed-width unicode arrays)
        return [o.astype(object) if isinstance(o, np.ndarray) and o.dtype.kind == "U" else o for o in outs]

    def _overriding_executor(self) -> Executor | HeteroExecutor:
        """The executor for runs that feed an overridable initializer.

        The session's plan treats those inputs as the constants they default to (folded
        into weights, packed, specialized), as ONNX Runtime does not: an IR < 4 export
        lists every weight as a graph input (OpenCV zoo's SFace), and folding is what
        makes it fast. A feed that overrides one must still be what the run computes
        with, so the first such run compiles the model again with every overridable
        initializer a plain input; the session's defaults fill the ones not fed."""
        if self._override_exe is None:
            model = load(self._source)
            for v in model.graph.inputs:
                if v.name in self._released_defaults and v.const is not None:
                    self._override_defaults[v.name] = v.const
                v.const = None
            self._override_exe = self._executor_of(self._compile(model), self._device)
        return self._override_exe

    # -- autotuning (quanta/runtime/tuner.py) -------------------------------------
    @property
    def tuning(self) -> TuneReport | None:
        """What the autotuner chose for this model's GEMM shapes (None: not tuned yet,
        or tuning is off)."""
        return self._tuning

    def _static_feeds(self) -> dict[str, np.ndarray] | None:
        """Inputs of the model's static shapes (ones for integers: a valid token id or
        length; zeros for floats), or None when some dimension is symbolic."""
        feeds = {}
        for a in self._inputs:
            t = self._input_types[a.name]
            dtype = _numpy_dtype(t) if t is not None else None
            if dtype is None or a.shape is None or not all(isinstance(d, int) and d >= 0 for d in a.shape):
                return None
            shape = tuple(int(d) for d in a.shape)  # type: ignore[arg-type]
            feeds[a.name] = np.ones(shape, dtype) if dtype.kind in "iu" else np.zeros(shape, dtype)
        return feeds

    def _tune(self, feeds: Mapping[str, np.ndarray]) -> None:
        self._tune_pending = False
        names = [o.name for o in self._outputs]
        exe = Executor(self._plan)  # unprofiled: the tuning run is not the user's
        self._tuning = tune_session(lambda: exe.run(feeds, names), self._options.tuning_budget_s)

    # -- validation ------------------------------------------------------------
    def _expected(self) -> str:
        return "; ".join(f"'{a.name}' {a.type} shape {a.shape}" for a in self._inputs)

    def _declared_shape(self, name: str) -> list[Any]:
        """The declared shape of input ``name``; only inputs with a known rank have
        rank and dimension checks, so a missing shape here is a bug in ``_checks``."""
        t = self._input_types[name]
        if t is None or t.shape is None:
            raise RuntimeError(f"input '{name}': checked against a rank, but its declared shape is unknown")
        return list(t.shape)

    def _validate(self, input_feed: Mapping[str, Any]) -> dict[str, np.ndarray]:
        # a dict skips the ABC's isinstance (~0.3 µs: a small model's run is ~30 µs)
        if type(input_feed) is not dict and not isinstance(input_feed, Mapping):
            raise InvalidArgument(
                f"feeds must be a dict of input name -> array; the model expects {self._expected()}"
            )
        feeds: dict[str, np.ndarray] = {}
        checks = self._checks
        for name, value in input_feed.items():
            check = checks.get(name)
            if check is None:
                raise InvalidArgument(f"unknown input '{name}'; the model expects {self._expected()}")
            want, rank, fixed = check
            if want is None and rank is None and (value is None or isinstance(value, (list, tuple))):
                # an input of no tensor type: a sequence's tensors may differ in shape and
                # stay separate, an empty optional is None, as ONNX Runtime takes them
                feeds[name] = None if value is None else [np.asarray(v) for v in value]  # type: ignore[assignment]
                continue
            arr = value if type(value) is np.ndarray else np.asarray(value)
            # the built-in dtypes are singletons: ``is`` decides the common case without
            # dtype.__ne__'s conversion
            if want is not None and arr.dtype is not want and want.kind == "O" and arr.dtype != want:
                arr = as_string_feed(arr)
            if want is not None and arr.dtype is not want and arr.dtype != want:
                t = self._input_types[name]
                raise InvalidArgument(
                    f"input '{name}': dtype {arr.dtype}, expected {_ort_type(t)} ({want}); "
                    f"the model expects {self._expected()}"
                )
            if rank is not None:
                shape = arr.shape
                if len(shape) != rank:
                    raise InvalidArgument(
                        f"input '{name}': rank {arr.ndim} (shape {list(shape)}), expected rank "
                        f"{rank} (shape {self._declared_shape(name)})"
                    )
                for k, exp in fixed:
                    if shape[k] != exp:
                        raise InvalidArgument(
                            f"input '{name}': dimension {k} is {shape[k]}, expected {exp} "
                            f"(shape {list(shape)} vs expected {self._declared_shape(name)})"
                        )
            feeds[name] = arr
        missing = [n for n in self._required if n not in feeds]
        if missing:
            raise InvalidArgument(f"missing input(s) {missing}; the model expects {self._expected()}")
        for name, default in self._defaults.items():
            feeds.setdefault(name, default)
        return feeds


def release_unread_defaults(model: Model) -> frozenset[str]:
    """Drop the default of every graph input of ``model`` (compiled) that also has an
    initializer but that no node and no graph output reads any more, and return their
    names. An IR < 4 export lists every weight as such an input; once BatchNormalization
    is folded into the weights the plan reads the folded copies, and the session would
    otherwise hold each weight twice (SFace: 126 -> 74 MB held, ONNX Runtime 73)."""
    g = model.graph
    read = {id(v) for n in g.nodes for v in n.inputs if v is not None}
    read.update(id(v) for v in g.outputs)
    released = []
    for v in g.inputs:
        if v.const is not None and id(v) not in read:
            v.const = None
            released.append(v.name)
    return frozenset(released)


def resolve_threads(intra_op_num_threads: int) -> int:
    """The thread count a session uses: ``intra_op_num_threads``, or for 0 the number
    of cores this process may run on."""
    if intra_op_num_threads > 0:
        return intra_op_num_threads
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def _numpy_dtype(t: TensorType) -> np.dtype | None:
    try:
        return np.dtype(t.elem.numpy)
    except Exception:
        return None
