"""A corpus of QAT exports from other tools, built by code (tiny models).

- torch.ao QAT, eager and FX, exported with the TorchScript exporter
  (``torch.onnx.export(..., dynamo=False)``), before and after ``convert``: the
  prepared model's FakeQuantize modules (``FakeQuantize`` with MovingAverage observers,
  the exportable form; the default ``FusedMovingAvgObsFakeQuantize`` has no ONNX
  symbolic) become Q/DQ pairs with one-element 1-D scales, Q/DQ on the float weights
  (per output channel, axis 0), and ConvBn QAT modules leave ``Conv -> Div(γ/σ) ->
  Add(bias) -> BatchNormalization``;
- NNCF's QAT export layout (written here with onnx.helper, as NNCF 2.x writes it for a
  model trained with ``nncf.torch``): symmetric quantizers (zero point 0; int8 for
  signed tensors, uint8 after a Relu), Q/DQ on the inputs of each Conv/MatMul and on
  the float weights, per output channel (axis 0 for Conv, axis 1 for a ``[K, N]``
  MatMul weight), BatchNormalization left after the Conv;
- pytorch-quantization / ModelOpt (TensorRT's layout): int8 symmetric Q/DQ (zero point
  0) on the inputs of Conv/Gemm/MatMul and on both inputs of a residual Add, float
  weights under per-channel Q/DQ, BatchNormalization and Relu left unfolded.
"""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 17


# ------------------------------------------------------------------ torch.ao


def _ao_qconfig(per_channel: bool = True):
    import torch
    import torch.ao.quantization as tq
    from torch.ao.quantization.fake_quantize import FakeQuantize
    from torch.ao.quantization.observer import (
        MovingAverageMinMaxObserver,
        MovingAveragePerChannelMinMaxObserver,
    )

    act = FakeQuantize.with_args(observer=MovingAverageMinMaxObserver, quant_min=0, quant_max=255)
    if per_channel:
        weight = FakeQuantize.with_args(
            observer=MovingAveragePerChannelMinMaxObserver,
            quant_min=-128,
            quant_max=127,
            dtype=torch.qint8,
            qscheme=torch.per_channel_symmetric,
            ch_axis=0,
        )
    else:
        weight = FakeQuantize.with_args(
            observer=MovingAverageMinMaxObserver,
            quant_min=-128,
            quant_max=127,
            dtype=torch.qint8,
            qscheme=torch.per_tensor_symmetric,
        )
    return tq.QConfig(activation=act, weight=weight)


def _export(module, shape, seed: int) -> onnx.ModelProto:
    import torch

    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            module,
            torch.randn(*shape, generator=torch.Generator().manual_seed(seed)),
            buf,
            dynamo=False,
            opset_version=OPSET,
            input_names=["x"],
        )
    return onnx.load_from_string(buf.getvalue())


def _train(module, shape, seed: int, steps: int = 4) -> None:
    import torch

    g = torch.Generator().manual_seed(seed)
    opt = torch.optim.SGD(module.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = module(torch.randn(*shape, generator=g) * 1.5 + 0.3).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def _eager_model():
    import torch.ao.quantization as tq
    import torch.nn as nn

    class Eager(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.quant = tq.QuantStub()
            self.c1 = nn.Conv2d(3, 7, 3, padding=1)
            self.bn1 = nn.BatchNorm2d(7)
            self.r1 = nn.ReLU()
            self.c2 = nn.Conv2d(7, 17, 3, stride=2)
            self.bn2 = nn.BatchNorm2d(17)
            self.r2 = nn.ReLU()
            self.fc = nn.Linear(17 * 4 * 3, 5)
            self.dequant = tq.DeQuantStub()

        def forward(self, x):
            x = self.quant(x)
            x = self.r2(self.bn2(self.c2(self.r1(self.bn1(self.c1(x))))))
            return self.dequant(self.fc(x.flatten(1)))

    return Eager()


SHAPE = (2, 3, 9, 7)


def ao_eager(converted: bool, seed: int = 0) -> onnx.ModelProto:
    import torch
    import torch.ao.quantization as tq

    torch.manual_seed(seed)
    m = _eager_model().train()
    tq.fuse_modules_qat(m, [["c1", "bn1", "r1"], ["c2", "bn2", "r2"]], inplace=True)
    m.qconfig = _ao_qconfig()
    tq.prepare_qat(m, inplace=True)
    _train(m, SHAPE, seed)
    m.eval()
    m.apply(tq.disable_observer)
    if converted:
        m = tq.convert(m)
    return _export(m, SHAPE, seed)


def _fx_model(depthwise: bool):
    import torch
    import torch.nn as nn

    class Fx(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(3, 7, 3, padding=1)
            self.bn = nn.BatchNorm2d(7)
            self.dw = nn.Conv2d(7, 7, 3, padding=1, groups=7) if depthwise else nn.Conv2d(7, 7, 1)
            self.c2 = nn.Conv2d(7, 17, 3, stride=2)
            self.fc = nn.Linear(17, 5)

        def forward(self, x):
            x = torch.relu(self.bn(self.c1(x)))
            x = torch.relu(self.dw(x)) + x
            x = torch.relu(self.c2(x))
            return self.fc(x.mean((2, 3)))

    return Fx()


def ao_fx(
    converted: bool, *, per_channel: bool = True, depthwise: bool = False, seed: int = 0
) -> onnx.ModelProto:
    import torch
    import torch.ao.quantization as tq
    from torch.ao.quantization import QConfigMapping
    from torch.ao.quantization.quantize_fx import convert_fx, prepare_qat_fx

    torch.manual_seed(seed)
    m = _fx_model(depthwise).train()
    m = prepare_qat_fx(m, QConfigMapping().set_global(_ao_qconfig(per_channel)), (torch.randn(*SHAPE),))
    _train(m, SHAPE, seed)
    m.eval()
    m.apply(tq.disable_observer)
    if converted:
        m = convert_fx(m)
    return _export(m, SHAPE, seed)


def ao_fx_mlp(seed: int = 0) -> onnx.ModelProto:
    import torch
    import torch.ao.quantization as tq
    import torch.nn as nn
    from torch.ao.quantization import QConfigMapping
    from torch.ao.quantization.quantize_fx import prepare_qat_fx

    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(17, 7), nn.ReLU(), nn.Linear(7, 3)).train()
    m = prepare_qat_fx(m, QConfigMapping().set_global(_ao_qconfig()), (torch.randn(2, 17),))
    _train(m, (2, 17), seed)
    m.eval()
    m.apply(tq.disable_observer)
    return _export(m, (2, 17), seed)


# ------------------------------------------------------------------ by hand


class _G:
    """A small graph builder: float initializers, Q/DQ pairs, nodes."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.k = 0

    def name(self, base: str) -> str:
        self.k += 1
        return f"{base}_{self.k}"

    def init(self, base: str, arr: np.ndarray) -> str:
        n = self.name(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), n))
        return n

    def node(self, op: str, ins: list[str], **attrs) -> str:
        out = self.name(op.lower())
        self.nodes.append(helper.make_node(op, ins, [out], name=out, **attrs))
        return out

    def qdq(self, x: str, scale, zp, axis: int | None = None) -> str:
        s = self.init("scale", np.asarray(scale, np.float32))
        z = self.init("zp", np.asarray(zp))
        attrs = {} if axis is None else {"axis": axis}
        q = self.node("QuantizeLinear", [x, s, z], **attrs)
        return self.node("DequantizeLinear", [q, s, z], **attrs)

    def act(self, x: str, amax: float, unsigned: bool = False) -> str:
        """A symmetric activation quantizer (zero point 0)."""
        if unsigned:
            return self.qdq(x, amax / 255.0, np.uint8(0))
        return self.qdq(x, amax / 127.0, np.int8(0))

    def weight(self, w: np.ndarray, axis: int) -> str:
        """Per-channel symmetric int8 Q/DQ on a float weight."""
        red = tuple(i for i in range(w.ndim) if i != axis)
        amax = np.abs(w).max(axis=red)
        return self.qdq(
            self.init("w", w.astype(np.float32)),
            (amax / 127.0).astype(np.float32),
            np.zeros(amax.shape, np.int8),
            axis,
        )

    def conv(
        self, x: str, cin: int, cout: int, k: int, *, group: int = 1, stride: int = 1, bias: bool = True
    ) -> str:
        w = self.rng.standard_normal((cout, cin // group, k, k)).astype(np.float32) * (
            1.5 / np.sqrt(cin // group * k * k)
        )
        ins = [x, self.weight(w, 0)]
        if bias:
            ins.append(self.init("b", self.rng.uniform(-0.2, 0.2, cout).astype(np.float32)))
        return self.node("Conv", ins, pads=[k // 2] * 4, strides=[stride, stride], group=group)

    def bn(self, x: str, c: int) -> str:
        r = self.rng
        return self.node(
            "BatchNormalization",
            [
                x,
                self.init(
                    "g",
                    r.uniform(0.5, 1.5, c).astype(np.float32)
                    * np.where(r.random(c) < 0.2, -1, 1).astype(np.float32),
                ),
                self.init("beta", r.uniform(-0.3, 0.3, c).astype(np.float32)),
                self.init("mean", r.uniform(-0.3, 0.3, c).astype(np.float32)),
                self.init("var", r.uniform(0.5, 2.0, c).astype(np.float32)),
            ],
            epsilon=1e-5,
        )

    def model(self, x_shape: tuple[int, ...], out: str) -> onnx.ModelProto:
        g = helper.make_graph(
            self.nodes,
            "qat",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
            [],
            self.inits,
        )
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="qat-corpus")
        inferred = onnx.shape_inference.infer_shapes(m)
        vi = next(v for v in inferred.graph.value_info if v.name == out)
        m.graph.output.append(vi)
        onnx.checker.check_model(m)
        return m


def nncf_cnn(seed: int = 0) -> onnx.ModelProto:
    """NNCF layout: symmetric quantizers on Conv inputs (int8 on the signed input,
    uint8 after Relu), per-channel weights, BN after each Conv, a depthwise Conv."""
    g = _G(seed)
    y = g.conv(g.act("x", 3.0), 3, 7, 3, bias=False)
    y = g.node("Relu", [g.bn(y, 7)])
    y = g.conv(g.act(y, 4.0, unsigned=True), 7, 7, 3, group=7, bias=False)
    y = g.node("Relu", [g.bn(y, 7)])
    y = g.conv(g.act(y, 4.0, unsigned=True), 7, 17, 1, stride=2)
    y = g.node("GlobalAveragePool", [y])
    return g.model((1, 3, 9, 7), y)


def nncf_matmul(seed: int = 0) -> onnx.ModelProto:
    """MatMul with a ``[K, N]`` weight quantized per output channel on axis 1, a bias Add."""
    g = _G(seed)
    w1 = g.rng.standard_normal((17, 7)).astype(np.float32) * 0.3
    y = g.node("MatMul", [g.act("x", 3.0), g.weight(w1, 1)])
    y = g.node("Add", [y, g.init("b", g.rng.uniform(-0.2, 0.2, 7).astype(np.float32))])
    y = g.node("Relu", [y])
    w2 = g.rng.standard_normal((7, 5)).astype(np.float32) * 0.4
    y = g.node("MatMul", [g.act(y, 3.0, unsigned=True), g.weight(w2, 1)])
    return g.model((3, 17), y)


def modelopt_cnn(seed: int = 0) -> onnx.ModelProto:
    """TensorRT layout: int8 symmetric Q/DQ on Conv inputs and on both inputs of the
    residual Add, BN and Relu unfolded, a Gemm head with a ``transB`` weight."""
    g = _G(seed)
    a = g.conv(g.act("x", 3.0), 3, 7, 3)
    a = g.node("Relu", [g.bn(a, 7)])
    b = g.conv(g.act(a, 4.0), 7, 7, 3)
    b = g.bn(b, 7)
    y = g.node("Add", [g.act(a, 4.0), g.act(b, 5.0)])
    y = g.node("Relu", [y])
    y = g.conv(g.act(y, 6.0), 7, 17, 3, stride=2)
    y = g.node("Relu", [y])
    y = g.node("Flatten", [g.node("GlobalAveragePool", [y])])
    w = g.rng.standard_normal((5, 17)).astype(np.float32) * 0.3
    y = g.node("Gemm", [g.act(y, 3.0), g.weight(w, 0), g.init("b", np.zeros(5, np.float32))], transB=1)
    return g.model((1, 3, 9, 7), y)


def modelopt_mlp(seed: int = 0) -> onnx.ModelProto:
    """pytorch-quantization's QuantLinear exported: MatMul on a transposed weight, Add."""
    g = _G(seed)
    w = g.rng.standard_normal((7, 17)).astype(np.float32) * 0.3  # [out, in], transposed in the graph
    wt = g.node("Transpose", [g.weight(w, 0)], perm=[1, 0])
    y = g.node("MatMul", [g.act("x", 3.0), wt])
    y = g.node("Add", [y, g.init("b", g.rng.uniform(-0.2, 0.2, 7).astype(np.float32))])
    y = g.node("Relu", [y])
    w2 = g.rng.standard_normal((3, 7)).astype(np.float32) * 0.4
    y = g.node("Gemm", [g.act(y, 3.0), g.weight(w2, 0)], transB=1)
    return g.model((2, 17), y)


CORPUS = {
    "ao_eager_qat": lambda: ao_eager(False),
    "ao_eager_converted": lambda: ao_eager(True),
    "ao_fx_qat": lambda: ao_fx(False),
    "ao_fx_converted": lambda: ao_fx(True),
    "ao_fx_qat_per_tensor_depthwise": lambda: ao_fx(False, per_channel=False, depthwise=True, seed=1),
    "ao_fx_qat_mlp": ao_fx_mlp,
    "nncf_cnn": nncf_cnn,
    "nncf_matmul": nncf_matmul,
    "modelopt_cnn": modelopt_cnn,
    "modelopt_mlp": modelopt_mlp,
}
