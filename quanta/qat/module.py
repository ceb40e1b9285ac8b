"""``QatModel``: a QDQ ONNX graph run as a trainable PyTorch module.

The module is built from the QDQ file that ``quantize_static`` writes (or any QDQ file):
every node of that graph is one PyTorch operation, so the fake quantization sits exactly
where the deployed file has its QuantizeLinear / DequantizeLinear nodes, and the
parameters are the file's own (scales and zero points from quanta's observers, weights
already BatchNorm-folded as quanta folds them). What becomes trainable:

- a weight, ``DequantizeLinear(codes, s, z)`` feeding a Conv/Gemm/MatMul weight input:
  a float parameter ``w`` initialised to ``dq(codes)``, quantized in every forward
  (``q = sat(rne(w/s) + z)``, STE), symmetric int8 weights kept in ``[-127, 127]``;
- an int32 bias whose scale is ``f32(sx·sw)`` (quanta's and ORT's rule): a float
  parameter, re-quantized in every forward against the *current* ``sx`` and ``sw``;
- with ``learn_scales=True`` every scale (activations and weights) is a parameter
  too (LSQ); zero points stay fixed integers.

Two forward modes (``model.exact``):

- ``exact=False`` (training): Q and DQ are the ONNX operators (float32 arithmetic,
  round half to even), the convolutions are float32 PyTorch convolutions of the
  dequantized operands. The integer kernels accumulate exactly in int32 and round
  once in eq. (6); PyTorch's float32 accumulation rounds at every addition, in its own
  order, so a tensor can differ from the deployed one by 1 LSB where its real value
  lies within float32 rounding of a rounding boundary.
- ``exact=True`` (no gradient needed, e.g. evaluation): every Conv/Gemm/MatMul whose
  operands are dequantized computes the integer accumulator exactly (float64 holds every
  int32 sum exactly), then requantizes with eq. (6) when a QuantizeLinear follows
  (through a Relu/Clip, fused as output saturation), or converts it to float as
  ``quanta::AccumulatorToFloat`` / QGemm do (``f32(acc + bias) · f32(sx·sw)``). An Add of
  two dequantized tensors followed by a QuantizeLinear is ORT's QLinearAdd formula, a
  GlobalAveragePool between Q/DQ is QLinearGlobalAveragePool's. The result equals
  quanta's reference and native backends bit for bit (tests/qat).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import helper, numpy_helper

from quanta.qat import fake_quant as fq

__all__ = ["QatModel", "UnsupportedNodeError"]

_MAC_OPS = ("Conv", "Gemm", "MatMul")
_INT_RANGES = {
    onnx.TensorProto.INT8: (-128, 127),
    onnx.TensorProto.UINT8: (0, 255),
    onnx.TensorProto.INT16: (-32768, 32767),
    onnx.TensorProto.UINT16: (0, 65535),
    onnx.TensorProto.INT32: (-(2**31), 2**31 - 1),
    onnx.TensorProto.INT4: (-8, 7),
    onnx.TensorProto.UINT4: (0, 15),
}
_NP_RANGES = {
    np.dtype(np.int8): (-128, 127),
    np.dtype(np.uint8): (0, 255),
    np.dtype(np.int16): (-32768, 32767),
    np.dtype(np.uint16): (0, 65535),
    np.dtype(np.int32): (-(2**31), 2**31 - 1),
}


class UnsupportedNodeError(NotImplementedError):
    """A node the PyTorch interpreter has no implementation for (the message names it)."""


def _attrs(node: onnx.NodeProto) -> dict[str, Any]:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _range_of(arr: np.ndarray) -> tuple[int, int]:
    if arr.dtype in _NP_RANGES:
        return _NP_RANGES[arr.dtype]
    info = np.iinfo(arr.dtype) if arr.dtype.kind in "iu" else None
    if info is None:
        raise TypeError(f"not an integer storage type: {arr.dtype}")
    return int(info.min), int(info.max)


class QatModel(torch.nn.Module):
    """A QDQ ONNX model as a PyTorch module (module docstring). ``forward`` takes the
    graph inputs positionally or by name and returns the graph outputs (one tensor, or a
    tuple). ``export(path)`` writes the QDQ file with the trained weights and scales."""

    def __init__(self, qdq: onnx.ModelProto, *, learn_scales: bool = False) -> None:
        super().__init__()
        self.template = qdq
        self.exact = False
        #: when a dict, every forward stores each node output in it (by tensor name)
        self.trace: dict[str, torch.Tensor] | None = None
        #: tensor names whose values every forward keeps in ``tapped`` (distillation's
        #: intermediate features); unlike ``trace`` the training shortcuts stay on
        self.taps: tuple[str, ...] = ()
        self.tapped: dict[str, torch.Tensor] = {}
        g = qdq.graph
        inits: dict[str, np.ndarray] = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        self.nodes: list[onnx.NodeProto] = []
        for n in g.node:
            if n.op_type == "Constant" and n.domain in ("", "ai.onnx"):
                a = _attrs(n)
                if "value" not in a:
                    raise UnsupportedNodeError(
                        f"Constant node {n.name!r}: only the 'value' attribute is supported"
                    )
                inits[n.output[0]] = numpy_helper.to_array(a["value"])
            else:
                self.nodes.append(n)
        self.input_names = [i.name for i in g.input if i.name not in inits]
        self.output_names = [o.name for o in g.output]
        producer = {o: n for n in self.nodes for o in n.output}
        consumers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
        for n in self.nodes:
            for k, i in enumerate(n.input):
                consumers.setdefault(i, []).append((n, k))
        self._producer, self._consumers = producer, consumers

        self._slots: dict[str, str] = {}  # tensor name -> attribute name holding it
        self._params = torch.nn.ParameterDict()
        self._weights: dict[str, dict[str, Any]] = {}  # DQ output -> weight description
        self._biases: dict[str, dict[str, Any]] = {}  # DQ output -> bias description
        learnable_scales: set[str] = set()

        def keep(name: str, value: np.ndarray, trainable: bool) -> None:
            if name in self._slots:
                return
            key = f"t{len(self._slots)}"
            self._slots[name] = key
            t = torch.from_numpy(np.array(value, copy=True))
            if t.dtype != torch.float32 and t.is_floating_point():
                t = t.float()
            if trainable:
                self._params[key] = torch.nn.Parameter(t.float())
            else:
                self.register_buffer(key, t if t.is_floating_point() or t.dtype == torch.bool else t.long())

        for n in self.nodes:
            if n.op_type != "DequantizeLinear" or n.input[0] not in inits:
                continue
            codes = inits[n.input[0]]
            if codes.dtype.kind not in "iu" or n.input[1] not in inits:
                continue
            uses = consumers.get(n.output[0], [])
            scale = inits[n.input[1]].astype(np.float32)
            zp = (
                inits[n.input[2]].astype(np.int64)
                if len(n.input) > 2 and n.input[2]
                else np.zeros_like(codes, shape=())
            )
            axis = int(_attrs(n).get("axis", 1))
            if _attrs(n).get("block_size", 0):
                continue  # blocked weights stay constants (int4 blocked is a PTQ format)
            real = self._dequant_np(codes, scale, zp, axis)
            if uses and all(c.op_type in _MAC_OPS and k == 1 for c, k in uses) and codes.dtype != np.int32:
                lo, hi = _range_of(codes)
                if lo == -128 and hi == 127 and not zp.any() and codes.min(initial=0) >= -127:
                    lo = -127  # symmetric int8 weights (quanta, ORT, TensorRT): [-127, 127]
                keep(n.input[0], real, True)
                self._weights[n.output[0]] = {"codes": n.input[0], "range": (lo, hi), "axis": axis}
                learnable_scales.add(n.input[1])
            elif (
                uses
                and codes.dtype == np.int32
                and all(c.op_type in ("Conv", "Gemm") and k == 2 for c, k in uses)
            ):
                consumer = uses[0][0]
                sx_name = self._dq_scale_name(consumer.input[0])
                sw_name = self._dq_scale_name(consumer.input[1])
                tied = False
                if sx_name in inits and sw_name in inits:
                    sb = (np.float32(inits[sx_name]) * inits[sw_name].astype(np.float32)).reshape(-1)
                    tied = sb.size in (1, scale.size) and np.array_equal(
                        np.broadcast_to(sb, scale.reshape(-1).shape), scale.reshape(-1)
                    )
                keep(n.input[0], real, True)
                self._biases[n.output[0]] = {
                    "codes": n.input[0],
                    "scale": n.input[1],
                    "tied": tied,
                    "sx": sx_name,
                    "sw": sw_name,
                    "axis": axis,
                }
        for n in self.nodes:
            if n.op_type == "QuantizeLinear" and len(n.input) > 1 and n.input[1] in inits:
                learnable_scales.add(n.input[1])
        for name, arr in inits.items():
            if name in self._slots:
                continue
            trainable = learn_scales and name in learnable_scales
            keep(name, arr, trainable)
        self.learn_scales = learn_scales
        self._scale_elems = {name: self._scale_fan(name) for name in learnable_scales if learn_scales}
        self._fused = self._plan_fusions(inits)
        self._pairs, self._implied = self._plan_training_shortcuts(inits)

    # ------------------------------------------------------------------ graph helpers

    @staticmethod
    def _dequant_np(codes: np.ndarray, scale: np.ndarray, zp: np.ndarray, axis: int) -> np.ndarray:
        if scale.size > 1:
            shape = [1] * codes.ndim
            shape[axis % codes.ndim] = scale.size
            scale = scale.reshape(shape)
            zp = zp.reshape(shape)
        return ((codes.astype(np.int64) - zp).astype(np.float32) * scale).astype(np.float32)

    def _dq_scale_name(self, value: str) -> str | None:
        p = self._producer.get(value)
        if p is not None and p.op_type == "DequantizeLinear":
            return p.input[1]
        return None

    def _scale_fan(self, name: str) -> float:
        """LSQ's gradient scale ``1 / sqrt(N · qmax)`` for the scale ``name``, with N the
        number of elements it quantizes per scale value."""
        for out, w in self._weights.items():
            p = self._producer[out]
            if p.input[1] == name:
                n = self._tensor(w["codes"]).numel() / max(1, self._tensor(name).numel())
                return 1.0 / math.sqrt(max(1.0, n * w["range"][1]))
        return 1.0 / math.sqrt(255.0 * 1000.0)  # activations: a fixed typical fan

    def _plan_fusions(
        self, inits: dict[str, np.ndarray]
    ) -> dict[str, tuple[list[onnx.NodeProto], onnx.NodeProto]]:
        """For each Conv/Gemm/MatMul/Add/GlobalAveragePool: the (Relu|Clip)? -> QuantizeLinear
        chain that the lowering turns into the op's requantized output."""
        fused = {}
        for n in self.nodes:
            if n.op_type not in (*_MAC_OPS, "Add", "GlobalAveragePool"):
                continue
            chain: list[onnx.NodeProto] = []
            out = n.output[0]
            if out in self.output_names:
                continue
            while True:
                uses = self._consumers.get(out, [])
                if len(uses) != 1:
                    break
                c = uses[0][0]
                if (
                    c.op_type in ("Relu", "Clip")
                    and n.op_type != "GlobalAveragePool"
                    and not chain
                    and out not in self.output_names
                ):
                    chain.append(c)
                    out = c.output[0]
                    if out in self.output_names:
                        break
                    continue
                if c.op_type == "QuantizeLinear" and all(i in inits for i in c.input[1:] if i):
                    if inits[c.input[1]].size == 1:
                        fused[n.name or n.output[0]] = (chain, c)
                break
        return fused

    def _plan_training_shortcuts(self, inits: dict[str, np.ndarray]):
        """For the training forward: QuantizeLinear -> DequantizeLinear pairs with the same
        parameters (one fused fake-quantization), and the Relu/Clip whose only consumer
        is a QuantizeLinear that saturates where they clamp (quanta's
        DropActivationImpliedByQuantize condition ``Q(lo) = qmin``, ``Q(hi) = qmax``):
        dropping them changes neither the value nor the STE gradient (the quantizer's
        own mask is inside theirs). Decided once on the file's scales, so not with
        learned scales."""
        pairs: dict[str, onnx.NodeProto] = {}
        implied: set[str] = set()
        for n in self.nodes:
            if n.op_type != "QuantizeLinear":
                continue
            uses = self._consumers.get(n.output[0], [])
            if (
                len(uses) == 1
                and uses[0][0].op_type == "DequantizeLinear"
                and list(uses[0][0].input[1:]) == list(n.input[1:])
                and n.output[0] not in self.output_names
                and n.input[1] in inits
                and inits[n.input[1]].size == 1
            ):
                pairs[n.name or n.output[0]] = uses[0][0]
            if self.learn_scales or n.input[1] not in inits or inits[n.input[1]].size != 1:
                continue
            act = self._producer.get(n.input[0])
            if (
                act is None
                or act.op_type not in ("Relu", "Clip")
                or len(self._consumers.get(act.output[0], [])) != 1
            ):
                continue
            if act.output[0] in self.output_names:
                continue
            try:
                lo, hi = self._act_bounds(act, inits)
            except (KeyError, TypeError):
                continue
            s = np.float32(inits[n.input[1]].reshape(()))
            z = int(inits[n.input[2]].reshape(())) if len(n.input) > 2 and n.input[2] else 0
            qmin, qmax = self._storage_range(n, n.input[2] if len(n.input) > 2 else "")

            def qv(v: float, s=s, z=z, qmin=qmin, qmax=qmax) -> float:
                if math.isinf(v):
                    return qmin if v < 0 else qmax
                return float(np.clip(np.round(np.float32(v) / s) + z, qmin, qmax))

            if qv(lo) == qmin and qv(hi) == qmax:
                implied.add(act.name or act.output[0])
        return pairs, implied

    @staticmethod
    def _act_bounds(act: onnx.NodeProto, inits: dict[str, np.ndarray]) -> tuple[float, float]:
        if act.op_type == "Relu":
            return 0.0, math.inf
        a = _attrs(act)
        lo = float(inits[act.input[1]]) if len(act.input) > 1 and act.input[1] else a.get("min", -math.inf)
        hi = float(inits[act.input[2]]) if len(act.input) > 2 and act.input[2] else a.get("max", math.inf)
        return lo, hi

    def _tensor(self, name: str) -> torch.Tensor:
        key = self._slots[name]
        return self._params[key] if key in self._params else getattr(self, key)

    def parameters_by_kind(self) -> dict[str, list[torch.nn.Parameter]]:
        """``{"weights": [...], "biases": [...], "scales": [...]}`` (for optimizer groups)."""
        out: dict[str, list[torch.nn.Parameter]] = {"weights": [], "biases": [], "scales": []}
        w = {d["codes"] for d in self._weights.values()}
        b = {d["codes"] for d in self._biases.values()}
        for name, key in self._slots.items():
            if key in self._params:
                kind = "weights" if name in w else "biases" if name in b else "scales"
                out[kind].append(self._params[key])
        return out

    def parameter_steps(self) -> list[tuple[str, torch.nn.Parameter, float]]:
        """``(kind, parameter, step)`` for every trainable tensor: the size of one
        quantization step it is measured in. A weight: the median of its scales; a bias:
        the scale of the quantized output of its Conv/Gemm when there is one (else the
        median weight scale); a scale: its own value. An optimizer that moves each
        parameter by a fraction of its step treats a depthwise kernel with scale 1e-3
        and a classifier with scale 1e-1 alike."""
        out: list[tuple[str, torch.nn.Parameter, float]] = []
        owner = {}
        for node in self.nodes:
            if node.op_type in ("Conv", "Gemm") and len(node.input) > 2:
                owner[node.input[2]] = node
        for dq_out, w in self._weights.items():
            scale = self._tensor(self._producer[dq_out].input[1]).detach()
            out.append(("weights", self._params[self._slots[w["codes"]]], float(scale.median())))
        for dq_out, b in self._biases.items():
            step = None
            node = owner.get(dq_out)
            if node is not None and (node.name or node.output[0]) in self._fused:
                q = self._fused[node.name or node.output[0]][1]
                step = float(self._tensor(q.input[1]).detach().reshape(-1)[0])
            if step is None:
                sw = b["sw"]
                step = float(self._tensor(sw).detach().median()) if sw in self._slots else 1e-3
            out.append(("biases", self._params[self._slots[b["codes"]]], step))
        for name, key in self._slots.items():
            if key in self._params and name not in {
                d["codes"] for d in (*self._weights.values(), *self._biases.values())
            }:
                p = self._params[key]
                out.append(("scales", p, float(p.detach().abs().median())))
        return out

    # ------------------------------------------------------------------ forward

    def forward(self, *args: torch.Tensor, **kwargs: torch.Tensor):  # type: ignore[override]
        env: dict[str, torch.Tensor] = {}
        for name, a in zip(self.input_names, args):
            env[name] = a
        env.update(kwargs)
        missing = [n for n in self.input_names if n not in env]
        if missing:
            raise ValueError(f"QatModel: missing input(s) {missing}; expected {self.input_names}")
        codes: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        done: set[str] = set()
        for n in self.nodes:
            key = n.name or n.output[0]
            if key in done:
                continue
            if self.exact and key in self._fused and self._exact_fused(n, env, codes, done):
                continue
            if not self.exact and self.trace is None:
                if key in self._implied and n.output[0] not in self.taps:
                    env[n.output[0]] = self._get(env, n.input[0])
                    continue
                dq = self._pairs.get(key)
                if dq is not None:
                    env[dq.output[0]] = self._fake_quant_pair(n, env)
                    done.add(dq.name or dq.output[0])
                    continue
            if self.exact and n.op_type in _MAC_OPS:
                y = self._exact_float_output(n, env, codes)
                if y is not None:
                    env[n.output[0]] = y
                    continue
            outs = self._run(n, env, codes)
            for o, v in zip(n.output, outs):
                if o:
                    env[o] = v
        if self.trace is not None:
            self.trace.update(env)
        if self.taps:
            self.tapped = {name: env[name] for name in self.taps}
        res = tuple(env[o] for o in self.output_names)
        return res[0] if len(res) == 1 else res

    def _get(self, env: dict[str, torch.Tensor], name: str) -> torch.Tensor | None:
        if not name:
            return None
        if name in env:
            return env[name]
        if name in self._slots:
            return self._tensor(name)
        raise KeyError(f"QatModel: tensor {name!r} is neither computed nor an initializer")

    def _scale_value(self, name: str) -> torch.Tensor:
        s = self._tensor(name)
        if self.learn_scales and name in self._scale_elems and isinstance(s, torch.nn.Parameter):
            s = fq.grad_scale(s, self._scale_elems[name])
        return s

    @staticmethod
    def _axis_shape(t: torch.Tensor, ndim: int, axis: int) -> torch.Tensor:
        if t.numel() == 1:
            return t.reshape(())
        shape = [1] * ndim
        shape[axis % ndim] = t.numel()
        return t.reshape(shape)

    def _fake_quant_pair(self, n: onnx.NodeProto, env) -> torch.Tensor:
        x = self._get(env, n.input[0])
        s = self._scale_value(n.input[1]).reshape(())
        zname = n.input[2] if len(n.input) > 2 else ""
        z = self._get(env, zname).float().reshape(()) if zname else torch.zeros(())
        lo, hi = self._storage_range(n, zname)
        return fq.fake_quantize(x, s, z, lo, hi)

    def _run(self, n: onnx.NodeProto, env, codes) -> list[torch.Tensor]:
        op = n.op_type
        if op == "QuantizeLinear":
            x = self._get(env, n.input[0])
            s = self._scale_value(n.input[1])
            zname = n.input[2] if len(n.input) > 2 else ""
            z = self._get(env, zname) if zname else None
            lo, hi = self._storage_range(n, zname)
            axis = int(_attrs(n).get("axis", 1))
            s = self._axis_shape(s, x.dim(), axis)
            zf = torch.zeros(()) if z is None else self._axis_shape(z.float(), x.dim(), axis)
            return [fq.quantize(x, s, zf, lo, hi)]
        if op == "DequantizeLinear":
            return [self._dequantize(n, env, codes)]
        return _OPS.get(op, _unsupported)(self, n, [self._get(env, i) for i in n.input], _attrs(n))

    def _storage_range(self, n: onnx.NodeProto, zname: str) -> tuple[int, int]:
        if zname:
            z = self._tensor(zname) if zname in self._slots else None
            if z is not None:
                dt = self.template_dtype(zname)
                if dt is not None:
                    return _INT_RANGES[dt]
        a = _attrs(n)
        if a.get("output_dtype"):
            return _INT_RANGES[a["output_dtype"]]
        return 0, 255

    def template_dtype(self, name: str) -> int | None:
        if not hasattr(self, "_dtypes"):
            d = {t.name: t.data_type for t in self.template.graph.initializer}
            for n in self.template.graph.node:
                if n.op_type == "Constant":
                    v = _attrs(n).get("value")
                    if v is not None:
                        d[n.output[0]] = v.data_type
            self._dtypes = d
        return self._dtypes.get(name)

    def _dequantize(self, n: onnx.NodeProto, env, codes) -> torch.Tensor:
        out = n.output[0]
        axis = int(_attrs(n).get("axis", 1))
        zname = n.input[2] if len(n.input) > 2 else ""
        if out in self._weights:
            w = self._weights[out]
            wf = self._tensor(w["codes"])
            s = self._axis_shape(self._scale_value(n.input[1]), wf.dim(), axis)
            z = self._axis_shape(self._tensor(zname).float(), wf.dim(), axis) if zname else torch.zeros(())
            q = fq.quantize(wf, s, z, *w["range"])
            codes[out] = (q, s, z)
            return fq.dequantize(q, s, z)
        if out in self._biases:
            b = self._biases[out]
            bf = self._tensor(b["codes"])
            if b["tied"]:
                sx = self._scale_value(b["sx"]).reshape(-1)
                sw = self._scale_value(b["sw"]).reshape(-1)
                sb = (sx.float() * sw.float()).reshape(-1)
            else:
                sx = torch.ones(1)
                sw = sb = self._tensor(n.input[1]).float().reshape(-1)
            q = fq.bias_codes(bf, sx, sw)
            codes[out] = (q, sb, torch.zeros(()))
            return (q * sb.to(torch.float64)).to(torch.float32)
        x = self._get(env, n.input[0])
        s = self._scale_value(n.input[1])
        s = self._axis_shape(s, max(1, x.dim()), axis)
        z = self._get(env, zname) if zname else None
        zf = torch.zeros(()) if z is None else self._axis_shape(z.float(), max(1, x.dim()), axis)
        xf = x.float()
        if x.dtype == torch.int32 or (
            n.input[0] in self._slots and self.template_dtype(n.input[0]) == onnx.TensorProto.INT32
        ):
            codes[out] = (xf.double(), s, zf)
            return ((x.double() - zf.double()) * s.double()).float()
        codes[out] = (xf, s, zf)
        return fq.dequantize(xf, s, zf)

    # ------------------------------------------------------------------ exact integer groups

    def _exact_fused(self, n: onnx.NodeProto, env, codes, done: set[str]) -> bool:
        chain, q = self._fused[n.name or n.output[0]]
        if n.op_type in _MAC_OPS:
            acc_info = self._accumulate(n, env, codes)
            if acc_info is None:
                return False
            acc, sx, sw = acc_info
            sy = self._tensor(q.input[1]).float().reshape(())
            zy = (
                self._tensor(q.input[2]).float().reshape(())
                if len(q.input) > 2 and q.input[2]
                else torch.zeros(())
            )
            lo, hi = self._storage_range(q, q.input[2] if len(q.input) > 2 else "")
            if n.op_type == "Gemm":
                alpha = float(_attrs(n).get("alpha", 1.0))
                m = ((torch.tensor(alpha, dtype=torch.float32) * sx) * sw) / sy
            else:
                m = fq.requant_multiplier(sx, sw, sy)
            y = fq.requantize(acc, m, zy, lo, hi)
        elif n.op_type == "Add":
            a, b = (codes.get(i) for i in n.input)
            if a is None or b is None or a[1].numel() != 1 or b[1].numel() != 1:
                return False
            y = self._qlinear_add(a, b, q)
        else:  # GlobalAveragePool
            a = codes.get(n.input[0])
            if a is None or a[1].numel() != 1:
                return False
            x, sx, zx = a
            hw = math.prod(x.shape[2:])
            sy = self._tensor(q.input[1]).float().reshape(())
            zy = self._tensor(q.input[2]).float().reshape(())
            lo, hi = self._storage_range(q, q.input[2])
            acc = x.double().sum(dim=tuple(range(2, x.dim())), keepdim=True) - zx.double() * hw
            m = sx.float() / (sy * torch.tensor(float(hw), dtype=torch.float32))
            y = fq.requantize(acc, m, zy, lo, hi)
        for c in chain:
            qa = self._clamp_codes(c, q, env)
            y = torch.clamp(y, *qa)
        env[q.output[0]] = y
        done.update(c.name or c.output[0] for c in (*chain, q))
        return True

    def _clamp_codes(self, act: onnx.NodeProto, q: onnx.NodeProto, env) -> tuple[float, float]:
        """``Q(lo), Q(hi)`` of a Relu/Clip fused as output saturation."""
        if act.op_type == "Relu":
            lo, hi = 0.0, math.inf
        else:
            a = _attrs(act)
            lo = (
                float(self._get(env, act.input[1]))
                if len(act.input) > 1 and act.input[1]
                else a.get("min", -math.inf)
            )
            hi = (
                float(self._get(env, act.input[2]))
                if len(act.input) > 2 and act.input[2]
                else a.get("max", math.inf)
            )
        sy = self._tensor(q.input[1]).float().reshape(())
        zy = self._tensor(q.input[2]).float().reshape(())
        qmin, qmax = self._storage_range(q, q.input[2])

        def qv(v: float) -> float:
            if math.isinf(v):
                return qmin if v < 0 else qmax
            return float(torch.clamp(torch.round(torch.tensor(v, dtype=torch.float32) / sy) + zy, qmin, qmax))

        return qv(lo), qv(hi)

    def _qlinear_add(self, a, b, q) -> torch.Tensor:
        """ORT's QLinearAdd (quanta.kernels.reference.ms_qlinear.qlinear_add)."""
        (xa, sa, za), (xb, sb, zb) = a, b
        sc = self._tensor(q.input[1]).float().reshape(())
        zc = self._tensor(q.input[2]).float().reshape(())
        lo, hi = self._storage_range(q, q.input[2])
        ra = (sa.float().reshape(()) / sc).double()
        rb = (sb.float().reshape(()) / sc).double()
        k = (
            zc.double() - (za.double().reshape(()) * ra + (rb * zb.double().reshape(())).float().double())
        ).float()
        inner = (xb.double() * rb + k.double()).float()
        y = (xa.double() * ra + inner.double()).float()
        return torch.clamp(torch.round(y), lo, hi)

    def _accumulate(self, n: onnx.NodeProto, env, codes):
        """Exact integer accumulator (float64) with the int32 bias, and ``sx``, ``sw``."""
        xa = codes.get(n.input[0])
        wa = codes.get(n.input[1])
        if xa is None or wa is None or xa[1].numel() != 1:
            return None
        x, sx, zx = xa
        w, sw, zw = wa
        a = _attrs(n)
        xi = x.double() - zx.double()
        wi = w.double() - zw.double()
        bias = None
        if len(n.input) > 2 and n.input[2]:
            ba = codes.get(n.input[2])
            if ba is None:
                return None
            bias = ba[0].double()
        if n.op_type == "Conv":
            acc = _conv(xi, wi, None, a)
            if bias is not None:
                acc = acc + bias.reshape(1, -1, *([1] * (acc.dim() - 2)))
            sw = sw.reshape(-1, *([1] * (acc.dim() - 2))) if sw.numel() > 1 else sw.reshape(())
        elif n.op_type == "Gemm":
            xi = xi.t() if a.get("transA", 0) else xi
            wi = wi.t() if a.get("transB", 0) else wi
            acc = xi @ wi
            if bias is not None:
                acc = acc + bias
            sw = sw.reshape(-1) if sw.numel() > 1 else sw.reshape(())
        else:
            acc = torch.matmul(xi, wi)
            sw = sw.reshape(-1) if sw.numel() > 1 else sw.reshape(())
        return acc, sx.reshape(()).float(), sw.float()

    def _exact_float_output(self, n: onnx.NodeProto, env, codes) -> torch.Tensor | None:
        """An integer Conv/Gemm/MatMul whose result stays float: ``f32(acc + bias) · m`` with
        ``m = f32(sx·sw)`` (quanta::AccumulatorToFloat; QGemm: ``f32(f32(alpha·sx)·sw)``)."""
        acc_info = self._accumulate(n, env, codes)
        if acc_info is None:
            return None
        acc, sx, sw = acc_info
        if n.op_type == "Gemm":
            m = (torch.tensor(float(_attrs(n).get("alpha", 1.0)), dtype=torch.float32) * sx) * sw
        else:
            m = sx * sw
        return acc.to(torch.float32) * m

    # ------------------------------------------------------------------ export

    def export_proto(self) -> onnx.ModelProto:
        """The template QDQ model with the current weights, biases and scales."""
        from quanta.qat.write import export_proto

        return export_proto(self)


# ---------------------------------------------------------------------- float ops


def _unsupported(model: QatModel, n: onnx.NodeProto, xs, a) -> list[torch.Tensor]:
    raise UnsupportedNodeError(
        f"node {n.name!r} ({n.domain + '::' if n.domain else ''}{n.op_type}): not supported by quanta.qat's "
        "PyTorch interpreter"
    )


def _pads(a: dict[str, Any], spatial: Sequence[int], kernel: Sequence[int], strides, dilations) -> list[int]:
    nd = len(kernel)
    auto = a.get("auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads_b, pads_e = [], []
        for i in range(nd):
            out = -(-spatial[i] // strides[i])
            total = max(0, (out - 1) * strides[i] + (kernel[i] - 1) * dilations[i] + 1 - spatial[i])
            small, big = total // 2, total - total // 2
            pads_b.append(small if auto == "SAME_UPPER" else big)
            pads_e.append(big if auto == "SAME_UPPER" else small)
        return pads_b + pads_e
    if auto == "VALID":
        return [0] * (2 * nd)
    return list(a.get("pads", [0] * (2 * nd)))


def _pad_input(x: torch.Tensor, pads: list[int], value: float = 0.0) -> tuple[torch.Tensor, list[int]]:
    nd = len(pads) // 2
    if pads[:nd] == pads[nd:]:
        return x, pads[:nd]
    fpad: list[int] = []
    for i in reversed(range(nd)):
        fpad += [pads[i], pads[i + nd]]
    return F.pad(x, fpad, value=value), [0] * nd


def _conv(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, a: dict[str, Any]) -> torch.Tensor:
    nd = w.dim() - 2
    kernel = list(w.shape[2:])
    strides = list(a.get("strides", [1] * nd))
    dil = list(a.get("dilations", [1] * nd))
    pads = _pads(a, list(x.shape[2:]), kernel, strides, dil)
    x, padding = _pad_input(x, pads)
    fn = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    return fn(x, w, b, stride=strides, padding=padding, dilation=dil, groups=int(a.get("group", 1)))


def _op_conv(m, n, xs, a):
    x, w = xs[0], xs[1]
    if not m.exact and x.dim() == 4:
        # oneDNN's NHWC kernels: a depthwise 5x5 backward is ~25x faster than in NCHW on
        # this CPU, the whole EfficientNet-Lite0 training step ~2x (docs/qat.md); the sums
        # run in another order, within the training forward's float32 tolerance
        x = x.contiguous(memory_format=torch.channels_last)
        w = w.contiguous(memory_format=torch.channels_last)
    return [_conv(x, w, xs[2] if len(xs) > 2 else None, a)]


def _op_gemm(m, n, xs, a):
    x, w = xs[0], xs[1]
    if a.get("transA", 0):
        x = x.t()
    if a.get("transB", 0):
        w = w.t()
    y = x @ w
    alpha = a.get("alpha", 1.0)
    if alpha != 1.0:
        y = y * alpha
    if len(xs) > 2 and xs[2] is not None:
        beta = a.get("beta", 1.0)
        y = y + (xs[2] if beta == 1.0 else beta * xs[2])
    return [y]


def _pool(m, n, xs, a):
    x = xs[0]
    kernel = list(a["kernel_shape"])
    nd = len(kernel)
    strides = list(a.get("strides", [1] * nd))
    dil = list(a.get("dilations", [1] * nd))
    pads = _pads(a, list(x.shape[2:]), kernel, strides, dil)
    ceil = bool(a.get("ceil_mode", 0))
    if n.op_type == "MaxPool":
        x, padding = _pad_input(x, pads, value=-math.inf)
        fn = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
        return [fn(x, kernel, strides, padding, dil, ceil_mode=ceil)]
    include = bool(a.get("count_include_pad", 0))
    x, padding = _pad_input(x, pads) if include else (x, pads[:nd])
    if pads[:nd] != pads[nd:] and not include:
        raise UnsupportedNodeError(
            f"node {n.name!r} (AveragePool): asymmetric pads without count_include_pad"
        )
    fn = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[nd]
    return [fn(x, kernel, strides, padding, ceil_mode=ceil, count_include_pad=include)]


def _axes(xs, a, k=1):
    if len(xs) > k and xs[k] is not None:
        return [int(v) for v in xs[k].reshape(-1).tolist()]
    v = a.get("axes")
    return None if v is None else list(v)


def _reduce(fn):
    def run(m, n, xs, a):
        x = xs[0]
        axes = _axes(xs, a)
        keep = bool(a.get("keepdims", 1))
        if axes is None or len(axes) == 0:
            if a.get("noop_with_empty_axes", 0):
                return [x]
            axes = list(range(x.dim()))
        return [fn(x, dim=[ax % x.dim() for ax in axes], keepdim=keep)]

    return run


def _clip(m, n, xs, a):
    lo = xs[1] if len(xs) > 1 and xs[1] is not None else a.get("min")
    hi = xs[2] if len(xs) > 2 and xs[2] is not None else a.get("max")
    x = xs[0]
    if lo is not None:
        x = torch.maximum(x, torch.as_tensor(lo, dtype=x.dtype))
    if hi is not None:
        x = torch.minimum(x, torch.as_tensor(hi, dtype=x.dtype))
    return [x]


def _reshape(m, n, xs, a):
    shape = [int(v) for v in xs[1].tolist()]
    x = xs[0]
    if not a.get("allowzero", 0):
        shape = [x.shape[i] if s == 0 else s for i, s in enumerate(shape)]
    return [x.reshape(shape)]


def _flatten(m, n, xs, a):
    x = xs[0]
    axis = a.get("axis", 1) % max(1, x.dim()) if x.dim() else 0
    return [x.reshape(math.prod(x.shape[:axis]), -1)]


def _transpose(m, n, xs, a):
    perm = a.get("perm") or list(reversed(range(xs[0].dim())))
    return [xs[0].permute(*perm)]


def _concat(m, n, xs, a):
    return [torch.cat([x for x in xs if x is not None and x.numel() > 0] or xs[:1], dim=a["axis"])]


def _squeeze(m, n, xs, a):
    axes = _axes(xs, a)
    x = xs[0]
    if axes is None:
        return [x.squeeze()]
    for ax in sorted((ax % x.dim() for ax in axes), reverse=True):
        x = x.squeeze(ax)
    return [x]


def _unsqueeze(m, n, xs, a):
    axes = _axes(xs, a)
    x = xs[0]
    rank = x.dim() + len(axes)
    for ax in sorted(ax % rank for ax in axes):
        x = x.unsqueeze(ax)
    return [x]


def _softmax(m, n, xs, a):
    return [torch.softmax(xs[0], dim=a.get("axis", -1))]


def _layer_norm(m, n, xs, a):
    x = xs[0]
    axis = a.get("axis", -1) % x.dim()
    shape = x.shape[axis:]
    y = F.layer_norm(x, shape, None, None, eps=a.get("epsilon", 1e-5))
    y = y * xs[1]
    if len(xs) > 2 and xs[2] is not None:
        y = y + xs[2]
    return [y]


def _gather(m, n, xs, a):
    x, idx = xs
    axis = a.get("axis", 0) % x.dim()
    idx = idx.long()
    idx = torch.where(idx < 0, idx + x.shape[axis], idx)
    out = torch.index_select(x, axis, idx.reshape(-1))
    return [out.reshape(*x.shape[:axis], *idx.shape, *x.shape[axis + 1 :])]


def _slice(m, n, xs, a):
    x = xs[0]
    starts = xs[1].tolist()
    ends = xs[2].tolist()
    axes = xs[3].tolist() if len(xs) > 3 and xs[3] is not None else list(range(len(starts)))
    steps = xs[4].tolist() if len(xs) > 4 and xs[4] is not None else [1] * len(starts)
    sl = [slice(None)] * x.dim()
    for s, e, ax, st in zip(starts, ends, axes, steps):
        if st != 1:
            raise UnsupportedNodeError(f"node {n.name!r} (Slice): step {st}")
        dim = x.shape[ax]
        s = max(0, min(dim, s + dim if s < 0 else s))
        e = max(0, min(dim, e + dim if e < 0 else e))
        sl[ax % x.dim()] = slice(s, e)
    return [x[tuple(sl)]]


def _split(m, n, xs, a):
    x = xs[0]
    axis = a.get("axis", 0)
    if len(xs) > 1 and xs[1] is not None:
        sizes = [int(v) for v in xs[1].tolist()]
    elif "split" in a:
        sizes = list(a["split"])
    else:
        k = len(n.output)
        sizes = [-(-x.shape[axis] // k)] * k
        sizes[-1] = x.shape[axis] - sum(sizes[:-1])
    return list(torch.split(x, sizes, dim=axis))


def _pad(m, n, xs, a):
    x = xs[0]
    pads = [int(v) for v in xs[1].tolist()]
    mode = a.get("mode", b"constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    value = float(xs[2]) if len(xs) > 2 and xs[2] is not None and xs[2].numel() else 0.0
    nd = x.dim()
    fpad: list[int] = []
    for i in reversed(range(nd)):
        fpad += [pads[i], pads[i + nd]]
    while len(fpad) > 2 and fpad[-2:] == [0, 0]:
        fpad = fpad[:-2]
    return [F.pad(x, fpad, mode=mode, value=value) if mode == "constant" else F.pad(x, fpad, mode=mode)]


def _cast(m, n, xs, a):
    to = a["to"]
    dt = {
        onnx.TensorProto.FLOAT: torch.float32,
        onnx.TensorProto.INT64: torch.int64,
        onnx.TensorProto.INT32: torch.int32,
        onnx.TensorProto.BOOL: torch.bool,
        onnx.TensorProto.DOUBLE: torch.float64,
    }.get(to)
    if dt is None:
        raise UnsupportedNodeError(f"node {n.name!r} (Cast): target type {to}")
    return [xs[0].to(dt)]


def _hard_sigmoid(m, n, xs, a):
    return [torch.clamp(xs[0] * a.get("alpha", 0.2) + a.get("beta", 0.5), 0.0, 1.0)]


def _hard_swish(m, n, xs, a):
    x = xs[0]
    return [x * torch.clamp(x * (1.0 / 6.0) + 0.5, 0.0, 1.0)]


def _binary(fn):
    return lambda m, n, xs, a: [fn(xs[0], xs[1])]


def _unary(fn):
    return lambda m, n, xs, a: [fn(xs[0])]


_OPS = {
    "Conv": _op_conv,
    "Gemm": _op_gemm,
    "MatMul": _binary(torch.matmul),
    "Add": _binary(torch.add),
    "Sub": _binary(torch.sub),
    "Mul": _binary(torch.mul),
    "Div": _binary(torch.div),
    "Pow": _binary(torch.pow),
    "Max": lambda m, n, xs, a: [torch.stack(torch.broadcast_tensors(*xs)).amax(0)],
    "Min": lambda m, n, xs, a: [torch.stack(torch.broadcast_tensors(*xs)).amin(0)],
    "Relu": _unary(torch.relu),
    "Clip": _clip,
    "Sigmoid": _unary(torch.sigmoid),
    "Tanh": _unary(torch.tanh),
    "Erf": _unary(torch.erf),
    "Sqrt": _unary(torch.sqrt),
    "Exp": _unary(torch.exp),
    "Neg": _unary(torch.neg),
    "Abs": _unary(torch.abs),
    "Reciprocal": _unary(torch.reciprocal),
    "Identity": _unary(lambda x: x),
    "Dropout": lambda m, n, xs, a: [xs[0]] + [torch.ones_like(xs[0], dtype=torch.bool)] * (len(n.output) - 1),
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "LeakyRelu": lambda m, n, xs, a: [F.leaky_relu(xs[0], a.get("alpha", 0.01))],
    "Gelu": lambda m, n, xs, a: [
        F.gelu(xs[0], approximate="tanh" if a.get("approximate", b"none") in (b"tanh", "tanh") else "none")
    ],
    "Softmax": _softmax,
    "LayerNormalization": _layer_norm,
    "GlobalAveragePool": lambda m, n, xs, a: [xs[0].mean(dim=tuple(range(2, xs[0].dim())), keepdim=True)],
    "GlobalMaxPool": lambda m, n, xs, a: [xs[0].amax(dim=tuple(range(2, xs[0].dim())), keepdim=True)],
    "AveragePool": _pool,
    "MaxPool": _pool,
    "ReduceMean": _reduce(torch.mean),
    "ReduceSum": _reduce(torch.sum),
    "ReduceMax": _reduce(torch.amax),
    "Reshape": _reshape,
    "Flatten": _flatten,
    "Transpose": _transpose,
    "Concat": _concat,
    "Squeeze": _squeeze,
    "Unsqueeze": _unsqueeze,
    "Shape": lambda m, n, xs, a: [torch.tensor(list(xs[0].shape), dtype=torch.int64)],
    "Gather": _gather,
    "Slice": _slice,
    "Split": _split,
    "Pad": _pad,
    "Cast": _cast,
}
