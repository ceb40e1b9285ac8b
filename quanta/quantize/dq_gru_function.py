"""The ONNX function of quanta::DynamicQuantizeGRU: its body in standard ONNX, so that
ONNX Runtime (which inlines model-local functions) runs a file quanta wrote.

The body computes kernels/reference/dq_gru.py's (DQG1)-(DQG6) operation for operation:
DynamicQuantizeLinear is (DQG1) (ONNX Runtime's is ``GetQuantizationParameter`` then
``MlasQuantizeLinear``, the same as its DynamicQuantizeLSTM), MatMulInteger then
Cast and Mul by f32(s · w_scale) is (DQG2), a Loop over the L = max(sequence_lens) steps
carries h, and ONNX Runtime's Sigmoid and Tanh are MLAS's logistic and tanh, which the
twin uses. ``tests/quantize/test_dq_gru.py`` checks ONNX Runtime's outputs against the
twin's bytes.

A body is written for one form of the node (direction, linear_before_reset, clip, which
optional inputs are present): the function's ``overload`` names the form
(:func:`overload_name`), so one file may hold several (ONNX IR version 10).
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import TensorProto, helper

from quanta.kernels.reference.dq_gru import QUANTA_DOMAIN

__all__ = [
    "FUNCTION_INPUTS",
    "FUNCTION_OUTPUTS",
    "MIN_OPSET",
    "OP_TYPE",
    "GruForm",
    "gru_function",
    "overload_name",
]

OP_TYPE = "DynamicQuantizeGRU"
FUNCTION_INPUTS = [
    "X",
    "W",
    "R",
    "B",
    "sequence_lens",
    "initial_h",
    "W_scale",
    "W_zero_point",
    "R_scale",
    "R_zero_point",
]
FUNCTION_OUTPUTS = ["Y", "Y_h"]
#: the lowest ai.onnx opset a body is written for (DynamicQuantizeLinear, Loop 11); the
#: body imports the model's own opset (ONNX's checker wants a function's operators to
#: resolve to the versions the model's imports give them), Squeeze / Unsqueeze in the form
#: of that opset
MIN_OPSET = 11


@dataclass(frozen=True)
class GruForm:
    """What a body depends on."""

    hidden_size: int
    direction: str = "forward"
    linear_before_reset: bool = False
    clip: float | None = None
    has_bias: bool = False
    has_lens: bool = False
    has_initial_h: bool = False


def overload_name(form: GruForm) -> str:
    """The function overload of ``form``: every field that changes the body."""
    parts = [form.direction, f"lbr{int(form.linear_before_reset)}", f"h{form.hidden_size}"]
    if form.clip is not None:
        parts.append(f"clip{float(form.clip).hex()}")
    parts.append(
        "".join(c for c, on in (("b", form.has_bias), ("s", form.has_lens), ("i", form.has_initial_h)) if on)
    )
    return "_".join(p for p in parts if p)


class _Body:
    """Nodes of one graph with fresh value names."""

    def __init__(self, prefix: str, opset: int):
        self.nodes: list[onnx.NodeProto] = []
        self.prefix = prefix
        self.opset = opset
        self.n = 0

    def axes_op(self, op: str, x: str, axes: list[int]) -> str:
        """Squeeze / Unsqueeze: axes an attribute before opset 13, an input from 13."""
        if self.opset < 13:
            return self.one(op, [x], axes=axes)
        return self.one(op, [x, self.const(axes)])

    def __call__(self, op: str, inputs: list[str], n_out: int = 1, **attrs) -> list[str]:
        outs = [f"{self.prefix}{self.n}_{k}" for k in range(n_out)]
        self.n += 1
        self.nodes.append(helper.make_node(op, inputs, outs, **attrs))
        return outs

    def one(self, op: str, inputs: list[str], **attrs) -> str:
        return self(op, inputs, **attrs)[0]

    def const(self, value, dtype=TensorProto.INT64, dims=None) -> str:
        vals = value if isinstance(value, list) else [value]
        t = helper.make_tensor(
            "v", dtype, dims if dims is not None else ([len(vals)] if isinstance(value, list) else []), vals
        )
        return self.one("Constant", [], value=t)


def _qgemm(g: _Body, block: str, w: str, wz: str, scale: str) -> str:
    """(DQG1)+(DQG2): f32(f32(acc) · f32(s · scale)) of the block against w."""
    q, s, z = g("DynamicQuantizeLinear", [block], n_out=3)
    acc = g.one("MatMulInteger", [q, w, z, wz])
    return g.one("Mul", [g.one("Cast", [acc], to=TensorProto.FLOAT), g.one("Mul", [s, scale])])


def _cols(g: _Body, t: str, start: int, end: int, axis: int) -> str:
    return g.one("Slice", [t, g.const([start]), g.const([end]), g.const([axis])])


def _direction(g: _Body, form: GruForm, d: int, reverse: bool, steps: str, lens64: str | None, tlen: str):
    """Y_d [T, B, H] and Y_h_d [B, H] of direction d."""
    H = form.hidden_size
    lbr = form.linear_before_reset
    idx = g.const(d)
    w = g.one("Gather", ["W", idx], axis=0)
    r = g.one("Gather", ["R", idx], axis=0)
    first = g.const([0])

    def zero_point(name: str) -> str:  # the direction's first element, as [1]
        flat = g.one("Reshape", [g.one("Gather", [name, idx], axis=0), g.const([-1])])
        return g.one("Slice", [flat, first, g.const([1]), first])

    def scales(name: str) -> str:  # [1] (per direction) or [3H]
        return g.one("Reshape", [g.one("Gather", [name, idx], axis=0), g.const([-1])])

    wz, rz = zero_point("W_zero_point"), zero_point("R_zero_point")
    ws, rs = scales("W_scale"), scales("R_scale")
    rs3 = g.one("Expand", [rs, g.const([3 * H])])
    x = g.one("Slice", ["X", first, steps, first])  # X[:L]
    if reverse:
        assert lens64 is not None
        x = g.one("ReverseSequence", [x, lens64], batch_axis=1, time_axis=0)
    gx = _qgemm(g, x, w, wz, ws)  # [L, B, 3H]
    r_zr, rs_zr = _cols(g, r, 0, 2 * H, 1), _cols(g, rs3, 0, 2 * H, 0)
    r_h, rs_h = _cols(g, r, 2 * H, 3 * H, 1), _cols(g, rs3, 2 * H, 3 * H, 0)
    b_zr = b_h = rb_h = None
    if form.has_bias:
        bd = g.one("Gather", ["B", idx], axis=0)
        wb, rb = _cols(g, bd, 0, 3 * H, 0), _cols(g, bd, 3 * H, 6 * H, 0)
        b_zr = g.one("Add", [_cols(g, wb, 0, 2 * H, 0), _cols(g, rb, 0, 2 * H, 0)])
        if lbr:
            b_h, rb_h = _cols(g, wb, 2 * H, 3 * H, 0), _cols(g, rb, 2 * H, 3 * H, 0)
        else:
            b_h = g.one("Add", [_cols(g, wb, 2 * H, 3 * H, 0), _cols(g, rb, 2 * H, 3 * H, 0)])
    batch = g.one("Gather", [g.one("Shape", ["X"]), g.const(1)], axis=0)
    bh_shape = g.one("Concat", [g.axes_op("Unsqueeze", batch, [0]), g.const([H])], axis=0)
    fzero = g.const(0.0, TensorProto.FLOAT)
    if form.has_initial_h:
        h0 = g.one("Gather", ["initial_h", idx], axis=0)
    else:
        h0 = g.one("Expand", [fzero, bh_shape])
    clip_lo = clip_hi = None
    if form.clip is not None:
        clip_lo, clip_hi = (
            g.const(-float(form.clip), TensorProto.FLOAT),
            g.const(float(form.clip), TensorProto.FLOAT),
        )

    # the Loop body: (i, cond, h) -> (cond, h', y_t)
    s = _Body(f"d{d}s", g.opset)
    i_name, c_name, h_name = f"d{d}_i", f"d{d}_cond", f"d{d}_h"
    gt = s.one("Gather", [gx, i_name], axis=0)  # [B, 3H]
    if lens64 is not None:
        active = s.axes_op("Unsqueeze", s.one("Less", [i_name, lens64]), [1])
        hq = s.one("Where", [active, h_name, fzero])  # (DQG3)
    else:
        active, hq = None, h_name
    p = _qgemm(s, hq, r if lbr else r_zr, rz, rs3 if lbr else rs_zr)
    v = s.one("Add", [_cols(s, gt, 0, 2 * H, 1), _cols(s, p, 0, 2 * H, 1)])  # (DQG4)
    if b_zr is not None:
        v = s.one("Add", [v, b_zr])
    if clip_lo is not None:
        v = s.one("Clip", [v, clip_lo, clip_hi])
    zr = s.one("Sigmoid", [v])
    z, rr = _cols(s, zr, 0, H, 1), _cols(s, zr, H, 2 * H, 1)
    gh = _cols(s, gt, 2 * H, 3 * H, 1)
    if lbr:  # (DQG5)
        u = _cols(s, p, 2 * H, 3 * H, 1)
        if rb_h is not None:
            u = s.one("Add", [u, rb_h])
        a = s.one("Add", [gh, s.one("Mul", [rr, u])])
    else:
        qb = s.one("Mul", [rr, hq])
        if active is not None:
            qb = s.one("Where", [active, qb, fzero])
        a = s.one("Add", [gh, _qgemm(s, qb, r_h, rz, rs_h)])
    if b_h is not None:
        a = s.one("Add", [a, b_h])
    if clip_lo is not None:
        a = s.one("Clip", [a, clip_lo, clip_hi])
    one = s.const(1.0, TensorProto.FLOAT)
    hn = s.one(  # (DQG6)
        "Add",
        [s.one("Mul", [s.one("Sub", [one, z]), s.one("Tanh", [a])]), s.one("Mul", [z, h_name])],
    )
    if active is not None:
        h_next = s.one("Where", [active, hn, h_name])
        y_t = s.one("Where", [active, hn, fzero])
    else:
        h_next, y_t = s.one("Identity", [hn]), s.one("Identity", [hn])
    c_out = s.one("Identity", [c_name])
    body = helper.make_graph(
        s.nodes,
        f"gru_d{d}_step",
        [
            helper.make_tensor_value_info(i_name, TensorProto.INT64, []),
            helper.make_tensor_value_info(c_name, TensorProto.BOOL, []),
            helper.make_tensor_value_info(h_name, TensorProto.FLOAT, [None, None]),
        ],
        [
            helper.make_tensor_value_info(c_out, TensorProto.BOOL, []),
            helper.make_tensor_value_info(h_next, TensorProto.FLOAT, [None, None]),
            helper.make_tensor_value_info(y_t, TensorProto.FLOAT, [None, None]),
        ],
    )
    true = g.const(True, TensorProto.BOOL)
    h_fin, y = g("Loop", [g.axes_op("Squeeze", steps, [0]), true, h0], n_out=2, body=body)
    if reverse:
        y = g.one("ReverseSequence", [y, lens64], batch_axis=1, time_axis=0)
    # steps t >= L are zeros: pad Y [L, B, H] to [T, B, H]
    pads = g.one("Concat", [g.const([0, 0, 0]), g.one("Sub", [tlen, steps]), g.const([0, 0])], axis=0)
    y = g.one("Pad", [y, pads, fzero])
    if lens64 is not None:
        started = g.axes_op("Unsqueeze", g.one("Greater", [lens64, g.const(0)]), [1])
        h_fin = g.one("Where", [started, h_fin, fzero])
    return y, h_fin


def gru_function(form: GruForm, opset: int) -> onnx.FunctionProto:
    """The FunctionProto (domain quanta, ``DynamicQuantizeGRU``, overload
    :func:`overload_name`) for nodes of this form, its body in ai.onnx ``opset``
    (>= :data:`MIN_OPSET`)."""
    if opset < MIN_OPSET:
        raise ValueError(f"a DynamicQuantizeGRU body needs ai.onnx opset >= {MIN_OPSET}, got {opset}")
    g = _Body("g", opset)
    tlen = g.one("Slice", [g.one("Shape", ["X"]), g.const([0]), g.const([1]), g.const([0])])  # [1]
    lens64 = None
    if form.has_lens:
        lens64 = g.one("Cast", ["sequence_lens"], to=TensorProto.INT64)
        steps = g.one("Reshape", [g.one("ReduceMax", [lens64], keepdims=1), g.const([1])])
    else:
        lens64 = None
        steps = tlen
    dirs = (
        [(0, False), (1, True)] if form.direction == "bidirectional" else [(0, form.direction == "reverse")]
    )
    if lens64 is None and any(rev for _, rev in dirs):
        # ReverseSequence needs the lengths: all T
        batch = g.one("Gather", [g.one("Shape", ["X"]), g.const(1)], axis=0)
        lens64 = g.one("Expand", [tlen, g.axes_op("Unsqueeze", batch, [0])])
    ys, hs = [], []
    for d, rev in dirs:
        y, h = _direction(g, form, d, rev, steps, lens64 if (rev or form.has_lens) else None, tlen)
        ys.append(g.axes_op("Unsqueeze", y, [1]))
        hs.append(g.axes_op("Unsqueeze", h, [0]))
    g.nodes.append(
        helper.make_node(
            "Concat" if len(ys) > 1 else "Identity", ys, ["Y"], **({"axis": 1} if len(ys) > 1 else {})
        )
    )
    g.nodes.append(
        helper.make_node(
            "Concat" if len(hs) > 1 else "Identity", hs, ["Y_h"], **({"axis": 0} if len(hs) > 1 else {})
        )
    )
    return helper.make_function(
        QUANTA_DOMAIN,
        OP_TYPE,
        FUNCTION_INPUTS,
        FUNCTION_OUTPUTS,
        g.nodes,
        [helper.make_opsetid("", opset)],
        attributes=["hidden_size", "direction", "linear_before_reset", "clip", "layout", "activations"],
        overload=overload_name(form),
    )
