"""Simulation = deployment: the fake-quantized PyTorch forward against quanta's reference
and native backends running the exported QDQ file."""

from __future__ import annotations

import copy
import functools

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")

import quanta  # noqa: E402
from quanta.passes.coverage import CoverageReport  # noqa: E402
from quanta.qat import QatModel, distill, export, prepare  # noqa: E402
from quanta.runtime.coverage import lowered_coverage  # noqa: E402

from .models import SmallCnn, TinyTransformerBlock  # noqa: E402


@functools.cache
def _cnn_prepared(learn_scales: bool):
    torch.manual_seed(0)
    fp = SmallCnn().eval()
    g = torch.Generator().manual_seed(1)
    # an offset input: the input's zero point is far from 128
    calib = [torch.randn(2, 3, 11, 9, generator=g) * 1.3 + 0.7 for _ in range(4)]
    return fp, calib, prepare(fp, calib[0], calibration_data=calib, learn_scales=learn_scales)


def _cnn(learn_scales: bool = False):
    """A fresh copy of the prepared CNN (quantize_static runs once per setting)."""
    fp, calib, m = _cnn_prepared(learn_scales)
    return fp, calib, copy.deepcopy(m)


def _block(seed: int = 0):
    torch.manual_seed(seed)
    fp = TinyTransformerBlock().eval()
    g = torch.Generator().manual_seed(seed + 1)
    calib = [torch.randn(2, 5, 17, generator=g) for _ in range(4)]
    return fp, calib, prepare(fp, calib[0], calibration_data=calib)


def _quantized_names(m: QatModel) -> list[str]:
    return [n.output[0] for n in m.nodes if n.op_type == "QuantizeLinear"]


def _check_deployment(m: QatModel, x: torch.Tensor, path) -> None:
    export(m, path)
    feed = {m.input_names[0]: x.numpy()}
    with torch.no_grad():
        m.exact = True
        exact = m(x).numpy()
        m.exact = False
    for backend in ("reference", "native"):
        got = quanta.InferenceSession(str(path), backend=backend).run(None, feed)[0]
        np.testing.assert_array_equal(got, exact, err_msg=backend)


def _lsb_differences(m: QatModel, x: torch.Tensor) -> tuple[int, int, int]:
    """(max code difference, differing codes, codes) between the training forward and the
    exact one over every quantized tensor."""
    traces = []
    with torch.no_grad():
        for exact in (False, True):
            m.exact, m.trace = exact, {}
            m(x)
            traces.append(m.trace)
    m.exact, m.trace = False, None
    worst = differ = total = 0
    for name in _quantized_names(m):
        if name not in traces[0] or name not in traces[1]:
            continue
        d = (traces[0][name] - traces[1][name]).abs()
        worst = max(worst, int(d.max()))
        differ += int((d > 0).sum())
        total += d.numel()
    return worst, differ, total


def test_cnn_exact_forward_equals_reference_and_native(tmp_path):
    _, calib, m = _cnn()
    zps = [int(m._tensor(n.input[2])) for n in m.nodes if n.op_type == "QuantizeLinear"]
    assert any(z not in (0, 128) for z in zps), zps  # non-trivial zero points are exercised
    _check_deployment(m, calib[1], tmp_path / "cnn.onnx")


def test_cnn_training_forward_within_one_lsb(tmp_path):
    _, calib, m = _cnn()
    worst, differ, total = _lsb_differences(m, calib[2])
    assert total > 1000
    assert worst <= 1 and differ <= 0.01 * total, (worst, differ, total)


def test_transformer_block_exact_forward_equals_backends(tmp_path):
    _, calib, m = _block()
    assert sum(n.op_type == "MatMul" for n in m.nodes) >= 2
    _check_deployment(m, calib[1], tmp_path / "block.onnx")
    worst, differ, total = _lsb_differences(m, calib[2])
    assert worst <= 1 and differ <= 0.01 * total, (worst, differ, total)


def test_export_before_training_is_the_quantize_static_file(tmp_path):
    _, _, m = _cnn()
    proto = export(m, tmp_path / "same.onnx")
    assert [t.SerializeToString() for t in proto.graph.initializer] == [
        t.SerializeToString() for t in m.template.graph.initializer
    ]


def test_trained_model_exports_to_integer_kernels_and_runs_in_ort(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    fp, calib, m = _cnn(learn_scales=True)
    feeds = [{"input0": c.numpy()} for c in calib]
    distill(
        m, fp, feeds, steps=4, eval_every=2, batch_size=2, lr=0.5, scale_lr=0.01, holdout=0, progress=False
    )
    path = tmp_path / "trained.onnx"
    proto = export(m, path)
    assert any(
        a.SerializeToString() != b.SerializeToString()
        for a, b in zip(proto.graph.initializer, m.template.graph.initializer)
    )
    from quanta.ir.onnx_io import from_proto

    report: CoverageReport = lowered_coverage(from_proto(proto), {})
    assert report.integer_share == 1.0
    x = calib[3].numpy()
    ours = quanta.InferenceSession(str(path)).run(None, {"input0": x})[0]
    theirs = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"input0": x})[0]
    assert np.abs(ours - theirs).max() <= 0.1 * np.abs(theirs).max()
    _check_deployment(m, calib[3], tmp_path / "trained2.onnx")


def test_gradients_flow_to_every_weight_bias_and_scale():
    _, calib, m = _cnn(learn_scales=True)
    out = m(calib[0])
    out.square().sum().backward()
    kinds = m.parameters_by_kind()
    assert kinds["weights"] and kinds["biases"] and kinds["scales"]
    for kind, params in kinds.items():
        for p in params:
            assert p.grad is not None and torch.isfinite(p.grad).all(), kind
        assert any(float(p.grad.abs().sum()) > 0 for p in params), kind


def test_straight_through_gradient_is_one_inside_the_range_and_zero_outside():
    from quanta.qat import fake_quant as fq

    x = torch.tensor([-3.0, -0.25, 0.25, 0.75, 1.25, 5.0], requires_grad=True)
    s, z = torch.tensor(0.5), torch.tensor(3.0)
    q = fq.quantize(x, s, z, 0, 12)
    # x/s = -6, -0.5, 0.5, 1.5, 2.5, 10: ties to even (-0, 0, 2, 2), then + 3, saturated to [0, 12]
    assert q.tolist() == [0.0, 3.0, 3.0, 5.0, 5.0, 12.0]
    q.sum().backward()
    assert x.grad.tolist() == [0.0, 2.0, 2.0, 2.0, 2.0, 0.0]  # d(x/s)/dx inside the range only


def test_learned_step_size_is_the_stored_scale_bit_for_bit():
    """LSQ's gradient scaling must not move the forward's scale by an ulp: the exported
    file stores the parameter, and the exact forward has to use that very value."""
    from quanta.qat import fake_quant as fq

    g = torch.Generator().manual_seed(7)
    s = (torch.rand(4099, generator=g) * 3e-3 + 1e-7).requires_grad_(True)
    for factor in (1 / 17.0, 0.3, 1 / (259 * 127) ** 0.5):
        y = fq.grad_scale(s, factor)
        assert torch.equal(y.detach().view(torch.int32), s.detach().view(torch.int32))
        s.grad = None
        (y * 2.0).sum().backward()
        assert torch.allclose(s.grad, torch.full_like(s, 2.0 * factor))


def test_same_seed_same_weights():
    states = []
    for _ in range(2):
        fp, calib, m = _cnn()
        feeds = [{"input0": c.numpy()} for c in calib]
        distill(m, fp, feeds, steps=3, eval_every=3, batch_size=2, lr=0.5, progress=False, seed=7)
        states.append({k: v.clone() for k, v in m.state_dict().items()})
    assert states[0].keys() == states[1].keys()
    for k in states[0]:
        assert torch.equal(states[0][k], states[1][k]), k


def test_prepare_from_onnx_equals_prepare_from_module(tmp_path):
    from quanta.qat import to_onnx

    fp, calib, m = _cnn()
    path = tmp_path / "fp.onnx"
    onnx.save(to_onnx(fp, calib[0]), path)
    m2 = prepare(path, calibration_data=[{"input0": c.numpy()} for c in calib])
    with torch.no_grad():
        assert torch.equal(m(calib[1]), m2(calib[1]))


def test_distill_matches_intermediate_features_on_mirrored_data(tmp_path):
    """features=: the loss gains the normalised MSE of the named tensors (the student's
    Conv output before its quantization against the FP32 file's); augment="hflip" adds
    mirrored training samples; a cosine schedule with warm-up and a temperature run."""
    from quanta.qat import to_onnx

    fp, calib, m = _cnn()
    path = tmp_path / "fp.onnx"
    proto = to_onnx(fp, calib[0])
    onnx.save(proto, path)
    feeds = [{"input0": c.numpy()} for c in calib]
    add = next(n.output[0] for n in proto.graph.node if n.op_type == "Add")
    conv = [n.output[0] for n in proto.graph.node if n.op_type == "Conv"][-1]
    before = {k: v.clone() for k, v in m.state_dict().items()}
    res = distill(
        m,
        str(path),
        feeds,
        steps=4,
        eval_every=2,
        batch_size=2,
        lr=0.5,
        features=[add, conv],
        augment="hflip",
        schedule="cosine",
        warmup=0.25,
        temperature=2.0,
        holdout=0,
        progress=False,
    )
    assert res.steps == 4 and len(res.history) == 2
    assert m.taps == () and m.tapped == {}
    assert any(not torch.equal(before[k], v) for k, v in m.state_dict().items())
    _check_deployment(m, calib[1], tmp_path / "features.onnx")


def test_distill_refuses_unknown_features_and_options():
    fp, calib, m = _cnn()
    feeds = [{"input0": c.numpy()} for c in calib]
    with pytest.raises(ValueError, match="not tensors of the prepared model"):
        distill(m, fp, feeds, steps=1, features=["no_such_tensor"], progress=False)
    conv = next(n.output[0] for n in m.nodes if n.op_type == "Conv")
    with pytest.raises(ValueError, match="needs the FP32 model as an ONNX file"):
        distill(m, fp, feeds, steps=1, features=[conv], progress=False)
    with pytest.raises(ValueError, match="schedule"):
        distill(m, fp, feeds, steps=1, schedule="linear", progress=False)
    with pytest.raises(ValueError, match="augment"):
        distill(m, fp, feeds, steps=1, augment="rotate", progress=False)


def test_learning_rate_schedule_warms_up_then_decays_to_zero():
    from quanta.qat.train import _rate

    assert _rate(0.0, "cosine", 0.1) < 0.02
    assert _rate(0.05, "cosine", 0.1) == pytest.approx(0.51)
    assert _rate(0.1, "cosine", 0.1) == pytest.approx(1.0)
    assert _rate(0.55, "cosine", 0.1) == pytest.approx(0.5)
    assert _rate(1.0, "cosine", 0.1) == pytest.approx(0.0, abs=1e-12)
    assert _rate(0.7, "constant", 0.0) == 1.0
