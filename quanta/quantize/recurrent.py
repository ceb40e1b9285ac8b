"""LSTM -> com.microsoft DynamicQuantizeLSTM and GRU -> quanta::DynamicQuantizeGRU, for
``quantize_static`` and ``quantize_dynamic``::

    %y, %y_h, %y_c = LSTM(%x, %W, %R, %B?, %lens?, %h0?, %c0?, %P?)
      -> %y, %y_h, %y_c = com.microsoft::DynamicQuantizeLSTM(%x, %Wq, %Rq, %B?, %lens?, %h0?, %c0?, %P?,
                                                           %W_scale, %W_zero_point, %R_scale, %R_zero_point)

ONNX Runtime's form, which its ``quantize_dynamic`` writes and its static QOperator mode
writes too (an LSTM has no static integer form in either runtime): W [D, 4H, I] and
R [D, 4H, H] are quantized to int8, symmetric, per gate column (``[D, 4H]`` scales) or per
direction (``[D]``), then transposed into ORT's layout [D, I, 4H] / [D, H, 4H]; X and H are
quantized per step at run time (kernels/reference/ms_lstm.py, eq. (1) there), so the LSTM
needs no calibrated range and its input stays float. B, P and the states stay float.

A GRU becomes quanta::DynamicQuantizeGRU (kernels/reference/dq_gru.py), the same
arithmetic on the GRU's gates, with W [D, I, 3H] and R [D, H, 3H] quantized the same way.
ONNX Runtime has no such operator: the node names its overload and the file carries the
model-local ONNX function of that form (quantize/dq_gru_function.py), which ONNX Runtime
inlines and runs; quanta runs the node on its kernel.

``recipe.recurrent`` chooses: ``dynamic`` rewrites every LSTM and GRU that has an int8
form, ``float`` keeps them as they are, ``auto`` (the default) is ``dynamic`` in
``quantize_dynamic`` and, in ``quantize_static``, ``dynamic`` unless the file with them
float measures more than RECURRENT_LOSS_DB closer to FP32 at the outputs on held-out
calibration feeds (docs/calibration.md eq. (30)).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import numpy as np

from quanta.ir.graph import Model, Node, Value
from quanta.ir.op_facts import MS as MS_DOMAIN
from quanta.ir.types import F32, I8, TensorType
from quanta.kernels.reference.quantize import quantize_linear
from quanta.quantize.qdq import TensorPlan, _weight_type, weight_float_reason
from quanta.quantize.recipe import Recipe, RecurrentMode

__all__ = [
    "MS_DOMAIN",
    "RECURRENT_FLOAT_REASON",
    "SPREAD_LIMIT",
    "LstmWeights",
    "gru_float_reason",
    "has_dynamic_recurrent",
    "has_recurrent",
    "lstm_float_reason",
    "lstm_inputs",
    "quantize_lstms",
    "recurrent_float_reason",
    "rewrite_gru",
    "rewrite_lstm",
    "spread_reasons",
]

#: eq. (26) (calibrate/spread.py): an LSTM whose input x has at least this share of its
#: non-zero values below half an 8-bit step stays float in ``quantize_static``
SPREAD_LIMIT = 0.5

QUANTA_DOMAIN = "quanta"
_RECURRENT = frozenset({"LSTM", "GRU"})
_DYNAMIC_RECURRENT = frozenset({"DynamicQuantizeLSTM", "DynamicQuantizeGRU"})

#: why an LSTM / GRU stays float under ``recurrent: float``
RECURRENT_FLOAT_REASON = "the recipe keeps recurrent ops float (recurrent: float)"


def lstm_float_reason(node: Node, recipe: Recipe) -> str | None:
    """Why an ONNX LSTM node stays float (no DynamicQuantizeLSTM form), or None."""
    if recipe.recurrent is RecurrentMode.FLOAT:
        return RECURRENT_FLOAT_REASON
    if recipe.excludes(node):
        return "excluded by the recipe"
    x, w, r = node.input(0), node.input(1), node.input(2)
    if x is None or x.type is None or x.type.elem != F32:
        return "dynamic quantization needs a float32 activation input"
    if w is None or not w.is_const or w.const.dtype != np.float32:
        return "weight input is not a float32 constant"
    if r is None or not r.is_const or r.const.dtype != np.float32:
        return "recurrence weight R is not a float32 constant"
    if w.const.ndim != 3 or r.const.ndim != 3:
        return "LSTM weights of rank other than 3"
    if node.attrs.get("layout", 0):
        return "LSTM with layout = 1 (batch first) stays float (DynamicQuantizeLSTM has no layout)"
    return weight_float_reason(w) or weight_float_reason(r, "recurrence weight")


class _LayoutZero:
    """A node seen with ``layout`` 0 (its other attributes and inputs as they are)."""

    def __init__(self, node: Node):
        self._node = node
        self.attrs = {**node.attrs, "layout": 0}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._node, name)


def gru_float_reason(node: Node, recipe: Recipe, opset: int) -> str | None:
    """Why an ONNX GRU node stays float (no DynamicQuantizeGRU form), or None. ``opset``:
    the model's ai.onnx opset, which the written function body uses."""
    from quanta.quantize.dq_gru_function import MIN_OPSET

    if int(node.attrs.get("layout", 0) or 0) == 1:  # rewrite_gru transposes around the node
        node = _LayoutZero(node)  # type: ignore[assignment]
    reason = lstm_float_reason(node, recipe)
    if reason is not None:
        return reason.replace("LSTM", "GRU")
    if opset < MIN_OPSET:
        return (
            f"ai.onnx opset {opset} < {MIN_OPSET}: DynamicQuantizeGRU's ONNX body needs DynamicQuantizeLinear"
        )
    direction = node.attrs.get("direction", "forward")
    if isinstance(direction, bytes):
        direction = direction.decode()
    D = 2 if direction == "bidirectional" else 1
    acts = [a.decode() if isinstance(a, bytes) else str(a) for a in node.attrs.get("activations", ()) or ()]
    if acts and [a.lower() for a in acts] != ["sigmoid", "tanh"] * D:
        return f"GRU activations {acts}: DynamicQuantizeGRU computes Sigmoid, Tanh only"
    H = int(node.attrs.get("hidden_size", 0) or 0)
    w, r = node.input(1), node.input(2)
    assert w is not None and r is not None  # lstm_float_reason checked them
    if H <= 0 or w.const.shape[:2] != (D, 3 * H) or r.const.shape != (D, 3 * H, H):
        return f"GRU weights {list(w.const.shape)}, {list(r.const.shape)} do not match hidden_size {H} ({direction})"
    step = 3 * H * (int(w.const.shape[2]) + H)
    if step < recipe.gru_min_step_macs:
        return (
            f"a GRU step of {step} multiply-adds (H = {H}) is below gru_min_step_macs = "
            f"{recipe.gru_min_step_macs}: its dynamic int8 form is slower than the float GRU"
        )
    return None


class LstmWeights:
    """Quantized LSTM weights by content: LSTMs that read the same float values (one
    weight shared, or equal copies left by constant folding) share one int8 initializer
    and one set of scale / zero-point constants."""

    def __init__(self, model: Model, recipe: Recipe):
        self.model = model
        self.recipe = recipe
        self.entries: dict[tuple, tuple[Value, Value, Value]] = {}

    def get(self, w: Value) -> tuple[Value, Value, Value]:
        """(int8 weight in ORT's layout [D, K, 4H], scale, zero point) of an LSTM weight
        [D, 4H, K]: symmetric int8 per gate column ([D, 4H]) or per direction ([D])."""
        per_channel = self.recipe.per_channel
        wdata = np.asarray(w.const, np.float32)
        key = (hashlib.sha256(np.ascontiguousarray(wdata).tobytes()).hexdigest(), wdata.shape, per_channel)
        if key not in self.entries:
            g = self.model.graph
            d, n, k = wdata.shape
            rows = wdata.reshape(d * n, k) if per_channel else wdata.reshape(d, n * k)
            plan = TensorPlan(w.name, "weight", I8, True, axis=0)
            qw = _weight_type(rows, plan, F32, self.recipe)
            q = quantize_linear(rows, qw.scale_array(), qw.zero_point_array(), axis=0)
            if self.recipe.weight_pairs in ("ort", "ort_rows"):
                # eq. (12m): ORT's DynamicQuantizeLSTM multiplies uint8 x by these codes in
                # its saturating u8·s8 GEMM, paired along K (the last axis here)
                q = self._pair_safe(rows, qw, q, k)
            q = q.reshape(d, n, k)
            shape = (d, n) if per_channel else (d,)
            wq = g.add_initializer(
                g.fresh_name(f"{w.name}_quantized"), np.ascontiguousarray(q.transpose(0, 2, 1))
            )
            scale = g.add_initializer(
                g.fresh_name(f"{w.name}_scale"), qw.scale_array().astype(np.float32).reshape(shape)
            )
            zp = g.add_initializer(g.fresh_name(f"{w.name}_zero_point"), np.zeros(shape, np.int8))
            self.entries[key] = (wq, scale, zp)
        return self.entries[key]

    @staticmethod
    def _pair_safe(rows: np.ndarray, qw, q: np.ndarray, k: int) -> np.ndarray:
        """``q`` (int8 [rows, n·K / K], per row ``qw``) with eq. (12m) on every K-pair
        (ort_pairs.project_pairs; symmetric codes, zero point 0)."""
        from quanta.quantize.ort_pairs import k_partners, project_pairs

        u = rows.astype(np.float32) / qw.scale_array().astype(np.float32).reshape(-1, 1)
        r = rows.shape[0]
        u2, q2 = u.reshape(-1, k).astype(np.float64), q.reshape(-1, k)
        new, _ = project_pairs(u2, q2, k_partners(k), -127, 127)
        return new.reshape(r, -1).astype(np.int8)


def rewrite_lstm(node: Node, weights: LstmWeights) -> Node:
    """LSTM -> com.microsoft DynamicQuantizeLSTM (inputs 0-7 as the LSTM's, then W_scale,
    W_zero_point, R_scale, R_zero_point; attributes but ``layout``). The outputs keep
    their values, so readers of Y / Y_h / Y_c are untouched. Returns the new node."""
    model = weights.model
    g = model.graph
    x, w, r = node.inputs[0], node.inputs[1], node.inputs[2]
    assert w is not None and r is not None
    wq, ws, wz = weights.get(w)
    rq, rs, rz = weights.get(r)
    rest = list(node.inputs[3:8]) + [None] * (5 - len(node.inputs[3:8]))
    attrs = {k: v for k, v in node.attrs.items() if k != "layout"}
    types = {k: node.attr_types[k] for k in attrs if k in node.attr_types}
    outputs = list(node.outputs)
    at = g.nodes.index(node)
    anchor = g.nodes[at + 1] if at + 1 < len(g.nodes) else None
    node.outputs = []
    for v in outputs:
        v.producer = None
    g.remove_node(node)
    new = Node(
        "DynamicQuantizeLSTM",
        [x, wq, rq, *rest, ws, wz, rs, rz],
        outputs,
        attrs,
        name=g.fresh_name(f"{node.name}_quant" if node.name else "lstm_quant"),
        domain=MS_DOMAIN,
        attr_types=types,
    )
    g.add_node(new, before=anchor)
    model.opset_imports.setdefault(MS_DOMAIN, 1)
    return new


def rewrite_gru(node: Node, weights: LstmWeights) -> Node:
    """GRU -> quanta::DynamicQuantizeGRU (inputs 0-5 as the GRU's, then W_scale,
    W_zero_point, R_scale, R_zero_point; attributes but ``layout`` and the default
    activations), with the overload whose function the model gets. A batch-first GRU
    (``layout`` 1) gets Transposes of X and initial_h in and of Y and Y_h out (exact: they
    move bytes). Returns the new node."""
    from quanta.quantize.dq_gru_function import OP_TYPE, GruForm, gru_function, overload_name

    model = weights.model
    g = model.graph
    x, w, r = node.inputs[0], node.inputs[1], node.inputs[2]
    assert w is not None and r is not None
    wq, ws, wz = weights.get(w)
    rq, rs, rz = weights.get(r)
    rest = list(node.inputs[3:6]) + [None] * (3 - len(node.inputs[3:6]))
    batch_first = int(node.attrs.get("layout", 0) or 0) == 1
    keep = ("hidden_size", "direction", "linear_before_reset", "clip")
    attrs = {k: v for k, v in node.attrs.items() if k in keep}
    types = {k: node.attr_types[k] for k in attrs if k in node.attr_types}
    direction = attrs.get("direction", "forward")
    if isinstance(direction, bytes):
        direction = direction.decode()
    clip = attrs.get("clip")
    form = GruForm(
        hidden_size=int(attrs["hidden_size"]),
        direction=direction,
        linear_before_reset=bool(int(attrs.get("linear_before_reset", 0))),
        clip=None if clip is None else float(clip),
        has_bias=rest[0] is not None,
        has_lens=rest[1] is not None,
        has_initial_h=rest[2] is not None,
    )
    overload = overload_name(form)
    if not any(
        f.domain == QUANTA_DOMAIN and f.name == OP_TYPE and f.overload == overload for f in model.functions
    ):
        opset = int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0)))
        model.functions.append(gru_function(form, opset))
    model.ir_version = max(int(model.ir_version), 10)  # function overloads
    outputs: list[Value | None] = list(node.outputs)
    at = g.nodes.index(node)
    anchor = g.nodes[at + 1] if at + 1 < len(g.nodes) else None
    node.outputs = []
    for v in outputs:
        if v is not None:
            v.producer = None
    g.remove_node(node)
    after: list[Node] = []
    if batch_first:  # layout 1: X [B, T, I], initial_h [B, D, H] in; Y [B, T, D, H], Y_h [B, D, H] out
        x = _transposed(g, x, (1, 0, 2), anchor)
        rest[2] = _transposed(g, rest[2], (1, 0, 2), anchor)
        outputs, after = _time_major_outputs(g, outputs)
    new = Node(
        OP_TYPE,
        [x, wq, rq, *rest, ws, wz, rs, rz],
        outputs,
        attrs,
        name=g.fresh_name(f"{node.name}_quant" if node.name else "gru_quant"),
        domain=QUANTA_DOMAIN,
        attr_types=types,
    )
    new.overload = overload
    g.add_node(new, before=anchor)
    for n in after:
        g.add_node(n, before=anchor)
    model.opset_imports.setdefault(QUANTA_DOMAIN, 1)
    return new


def _transposed(g: Any, v: Value | None, perm: tuple[int, ...], anchor: Node | None) -> Value | None:
    """``v`` transposed by a Transpose inserted before ``anchor`` (None: None)."""
    if v is None:
        return None
    shape = None if v.shape is None else tuple(v.shape[p] for p in perm)
    out = Value(g.fresh_name(f"{v.name}_time_major"), None if shape is None else TensorType(F32, shape))
    g.add_node(
        Node("Transpose", [v], [out], {"perm": list(perm)}, name=g.fresh_name(f"{v.name}_Transpose")),
        before=anchor,
    )
    return out


def _time_major_outputs(g: Any, outputs: list[Value | None]) -> tuple[list[Value | None], list[Node]]:
    """The node's time-major outputs and the Transposes that give the batch-first ones
    (Y [T, D, B, H] -> [B, T, D, H], Y_h [D, B, H] -> [B, D, H])."""
    new: list[Value | None] = []
    nodes: list[Node] = []
    for v, perm in zip(outputs, ((2, 0, 1, 3), (1, 0, 2)), strict=False):
        if v is None or not v.name:
            new.append(v)
            continue
        inner = Value(g.fresh_name(f"{v.name}_time_major"))
        nodes.append(
            Node("Transpose", [inner], [v], {"perm": list(perm)}, name=g.fresh_name(f"{v.name}_Transpose"))
        )
        new.append(inner)
    return new, nodes


def _model_opset(model: Model) -> int:
    return int(model.opset_imports.get("", model.opset_imports.get("ai.onnx", 0)))


def recurrent_float_reason(node: Node, model: Model, recipe: Recipe) -> str | None:
    """Why an ONNX LSTM or GRU stays float, or None (it has a dynamic int8 form)."""
    if node.op_type == "GRU":
        return gru_float_reason(node, recipe, _model_opset(model))
    return lstm_float_reason(node, recipe)


def has_recurrent(bodies: list[Any]) -> bool:
    """Whether one of the planned ``bodies`` (quantize.bodies.BodyScope) has an ONNX LSTM
    or GRU node (eq. (30) builds its candidates to see whether it is rewritten)."""
    graphs = [s.model.graph for top in bodies for s in top.walk()]
    return any(n.op_type in _RECURRENT and n.domain in ("", "ai.onnx") for g in graphs for n in g.nodes)


def has_dynamic_recurrent(model: Model) -> bool:
    """Whether the quantized ``model`` (its main graph or any body) has a
    DynamicQuantizeLSTM / DynamicQuantizeGRU node."""
    import onnx

    from quanta.ir.onnx_io import to_proto

    def walk(g: onnx.GraphProto) -> bool:
        for n in g.node:
            if n.op_type in _DYNAMIC_RECURRENT:
                return True
            for a in n.attribute:
                if a.HasField("g") and walk(a.g):
                    return True
                if any(walk(sub) for sub in a.graphs):
                    return True
        return False

    return walk(to_proto(model).graph)


def lstm_inputs(model: Model, recipe: Recipe) -> list[str]:
    """The input x of every LSTM and GRU of the main graph that :func:`quantize_lstms`
    would rewrite: ``quantize_static`` observes their spread (eq. (26)) on the calibration
    data."""
    out = []
    for node in model.graph.nodes:
        if (
            node.op_type in _RECURRENT
            and node.domain in ("", "ai.onnx")
            and recurrent_float_reason(node, model, recipe) is None
        ):
            x = node.input(0)
            assert x is not None  # lstm_float_reason checked it
            out.append(x.name)
    return list(dict.fromkeys(out))


def spread_reasons(observers: Mapping[str, Any]) -> dict[str, str]:
    """LSTM input name -> why its LSTM stays float, for the inputs whose observer
    (SpreadObserver, or its result) finds eq. (26)'s share at 8 bits >= SPREAD_LIMIT: the
    per-step int8 quantization of x (kernels/reference/ms_lstm.py eq. (1)) rounds those
    values to 0, and no calibrated range can help, since x is quantized at run time."""
    from quanta.calibrate.spread import SPREAD

    out = {}
    for name, obs in observers.items():
        share = obs.spread(8)
        if share is None or share < SPREAD_LIMIT:
            continue
        ext = obs.extrema()
        top = float(max(abs(np.min(ext.min)), abs(np.max(ext.max))))
        out[name] = (
            f"{SPREAD}: {share:.0%} of the non-zero values of its input x lie below half an 8-bit "
            f"step of [0, {top:.3g}], which the per-step int8 quantization of DynamicQuantizeLSTM "
            "/ DynamicQuantizeGRU rounds to 0 (eq. (26) of docs/calibration.md)"
        )
    return out


def quantize_lstms(
    model: Model, recipe: Recipe, input_reasons: Mapping[str, str] | None = None, *, grus: bool = True
) -> dict[int, str | None]:
    """Rewrite every ONNX LSTM (and GRU, with ``grus``) of the main graph that has an int8
    form; returns, by ``id`` of the original node, None (rewritten) or why it stayed float.
    ``input_reasons``: input name -> why LSTMs / GRUs reading it stay float
    (:func:`spread_reasons`). A body's GRUs (``grus`` False) stay float: the function a
    DynamicQuantizeGRU needs lives in the top-level file."""
    weights = LstmWeights(model, recipe)
    decisions: dict[int, str | None] = {}
    ops = _RECURRENT if grus else frozenset({"LSTM"})
    for node in list(model.graph.nodes):
        if node.op_type not in ops or node.domain not in ("", "ai.onnx"):
            continue
        reason = recurrent_float_reason(node, model, recipe)
        x = node.input(0)
        if reason is None and input_reasons and x is not None and x.name in input_reasons:
            reason = input_reasons[x.name]
        decisions[id(node)] = reason
        if reason is None:
            (rewrite_gru if node.op_type == "GRU" else rewrite_lstm)(node, weights)
    if any(r is None for r in decisions.values()):
        model.graph.remove_unused_initializers()
    return decisions
