"""Conformance: every registered target runs the same model tests, and device targets
survive the same faults.

- Outputs are bit-identical with the target's golden: the reference session for the
  targets sharing the host numerics (reference, native), the target's own golden
  (``TargetInfo.golden``) otherwise — for npu-sim the NumPy golden of the integer-only
  kernels run without the device machinery.
- A device target shows its partitions and transfers in the plan and its device and
  transfer timelines in the profile.
- Faults on a device target (allocation failure, a fence that never signals, a device
  lost mid-stream, a shape outside the device's rules, a model larger than its memory)
  each end with a clear error, in bounded time, with no partial output and the host
  state intact (feeds unchanged, device memory released, a fresh session runs).
"""

from __future__ import annotations

import json
import time

import numpy as np
import onnx
import pytest

import quanta
from quanta.hal import AllocationError, DeviceLostError, FenceTimeout
from quanta.targets import TargetError, registered_targets, target_info
from quanta.targets.npu_sim.device import Faults
from tests.ir import models

TARGETS = registered_targets()
DEVICE_TARGETS = [t for t in TARGETS if target_info(t).make_device is not None]


def golden_run(model, feeds, target):
    """The outputs ``target`` must reproduce bit for bit: its own golden
    (``TargetInfo.golden``) or the reference session."""
    golden = target_info(target).golden
    if golden is not None:
        return golden(model, feeds)
    return run(model, feeds, "reference")[1]


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    from quanta.cli.demo import MODEL, load_demo_data

    data = load_demo_data()
    path = tmp_path_factory.mktemp("conf") / "demo.onnx"
    quanta.quantize_static(MODEL, path, [{"input": data["calib_x"][:64]}], verbose=False)
    return str(path), data["test_x"][:5]


@pytest.fixture(scope="module")
def branches(tmp_path_factory):
    rng = np.random.default_rng(9)
    src = tmp_path_factory.mktemp("conf") / "branches_f.onnx"
    onnx.save(models.concat_branches(), src)
    out = src.with_name("branches_q.onnx")
    calib = [{"x": rng.standard_normal((2, 3, 11, 9)).astype(np.float32)} for _ in range(4)]
    quanta.quantize_static(str(src), out, calib, verbose=False)
    return str(out), rng.standard_normal((3, 3, 11, 9)).astype(np.float32)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory):
    src = tmp_path_factory.mktemp("conf") / "enc_f.onnx"
    onnx.save(models.encoder_block(), src)
    out = src.with_name("enc_q.onnx")
    quanta.quantize_static(str(src), out, models.encoder_feeds(3), verbose=False)
    return str(out), models.encoder_feeds(5, seed=11)[4]


@pytest.fixture(scope="module")
def encoder_npu(tmp_path_factory):
    """The encoder quantized for npu-sim (symmetric weights, integer-only stage): its
    device partitions alternate with host ones and hand values to each other."""
    src = tmp_path_factory.mktemp("conf") / "enc_f.onnx"
    onnx.save(models.encoder_block(), src)
    out = src.with_name("enc_npu.onnx")
    quanta.quantize_static(str(src), out, models.encoder_feeds(3), verbose=False, target="npu-sim")
    return str(out), models.encoder_feeds(5, seed=11)


def run(model, feeds, target, **kw):
    sess = quanta.InferenceSession(model, backend=target, **kw)
    return sess, sess.run(None, feeds)


def assert_conforms(model, feeds, target, *, float_graph=False):
    """Bit-identical with the target's golden; a float graph (float GEMM family on the
    native kernels) within the float kernels' stated bound (docs/float-ops.md)."""
    before = {k: v.copy() for k, v in feeds.items()}
    sess, outs = run(model, feeds, target)
    want = golden_run(model, feeds, target)
    assert len(outs) == len(want)
    for a, b in zip(outs, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        if float_graph:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
        else:
            np.testing.assert_array_equal(a, b)
    for k, v in feeds.items():
        np.testing.assert_array_equal(v, before[k])  # feeds untouched
    return sess


@pytest.mark.parametrize("target", TARGETS)
def test_qdq_conv_static_shapes(target):
    rng = np.random.default_rng(0)
    assert_conforms(models.qdq_conv(), {"x": rng.standard_normal((1, 3, 9, 5)).astype(np.float32)}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_qoperator_residual_with_two_inputs(target):
    rng = np.random.default_rng(1)
    feeds = {
        "x": rng.standard_normal((1, 3, 7, 5)).astype(np.float32),
        "r": rng.standard_normal((1, 7, 7, 5)).astype(np.float32),
    }
    assert_conforms(models.qoperator(), feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_demo_cnn_symbolic_batch(target, demo):
    path, x = demo
    sess = assert_conforms(path, {"input": x}, target)
    assert_conforms(path, {"input": x[:2]}, target)  # a second signature
    if target in DEVICE_TARGETS:
        parts = sess.plan.partitions
        assert any(not p.on_host for p in parts)
        up, down = sess.plan.transfers
        assert up >= 1 and down >= 1
        text = str(sess.plan)
        assert "transfers per run" in text and f"#1 {target}" in text
        # the run's device arena is a second one (batch 2): both fit, both released later
        assert sess.device.memory_used > 0


@pytest.mark.parametrize("target", TARGETS)
def test_concat_of_branches(target, branches):
    path, x = branches
    assert_conforms(path, {"x": x}, target)


@pytest.mark.parametrize("target", TARGETS)
def test_quantized_encoder_block(target, encoder):
    path, feeds = encoder
    assert_conforms(path, feeds, target)


@pytest.mark.parametrize("target", TARGETS)
def test_encoder_quantized_for_the_device(target, encoder_npu):
    path, feeds = encoder_npu
    sess = assert_conforms(path, feeds[4], target)
    assert_conforms(path, feeds[1], target)  # another sequence length
    if target in DEVICE_TARGETS:
        # compiled for the run's shapes: the attention runs on the device, in two
        # partitions around the float mask and Softmax on the host
        sess.run(None, feeds[4])
        device_parts = [p for p in sess.plan.partitions if not p.on_host]
        assert len(device_parts) >= 2
        assert {"IntMatMul", "IntMul"} <= {sess.plan.steps[k].op_type for p in device_parts for k in p.steps}
        later = set().union(*(p.uploads for p in device_parts[1:]))
        assert later & set(device_parts[0].downloads)  # a value crosses partitions


@pytest.mark.parametrize("target", TARGETS)
def test_float_model_runs_on_every_target(target):
    rng = np.random.default_rng(2)
    feeds = {"x": rng.standard_normal((2, 3, 8, 6)).astype(np.float32)}
    sess = assert_conforms(models.float_cnn(), feeds, target, float_graph=True)
    if target in DEVICE_TARGETS:
        # nothing float runs on an integer device: one host partition, no transfers
        assert all(p.on_host for p in sess.plan.partitions) and sess.plan.transfers == (0, 0)
        assert sess.device is None


# -- device targets: profile, faults ------------------------------------------------------------
@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_profile_shows_host_and_device_timelines(target, demo, tmp_path):
    path, x = demo
    opts = quanta.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "p")
    sess = quanta.InferenceSession(path, opts, backend=target)
    sess.run(None, {"input": x})
    trace = json.loads(open(sess.end_profiling()).read())
    names = {e["args"]["name"]: e["tid"] for e in trace if e.get("ph") == "M"}
    device_tid = names[f"{target} device"]
    host_tid = names["host"]
    assert device_tid != host_tid
    nodes = [e for e in trace if e.get("cat") == "Node"]
    on_device = [e for e in nodes if e["args"].get("device") == target]
    assert on_device and all(e["tid"] == device_tid for e in on_device)
    assert any(e["tid"] != device_tid for e in nodes)  # host partitions on the host thread
    transfers = [e for e in trace if e.get("cat") == "Transfer"]
    assert {e["args"]["kind"] for e in transfers} >= {"upload", "download"}
    assert all(e["tid"] == device_tid for e in transfers)
    waits = [e for e in trace if e.get("cat") == "Wait"]
    assert waits and all(e["tid"] == host_tid for e in waits)
    assert sess.profile_summary().runs == 1


def device_session(target, path, **device_options):
    dev = target_info(target).make_device(**device_options)
    return quanta.InferenceSession(path, backend=target, device=dev), dev


@pytest.mark.parametrize("target", DEVICE_TARGETS)
@pytest.mark.parametrize("nth", [1, 2])  # the arena, the constants
def test_allocation_failure_at_session_creation_releases_everything(target, demo, nth):
    path, x = demo
    dev = target_info(target).make_device(faults=Faults(fail_allocation=nth))
    with pytest.raises(AllocationError, match="injected fault"):
        quanta.InferenceSession(path, backend=target, device=dev)
    assert dev.memory_used == 0
    # the device and the host are fine afterwards
    sess = quanta.InferenceSession(path, backend=target, device=dev)
    want = golden_run(path, {"input": x}, target)
    np.testing.assert_array_equal(sess.run(None, {"input": x})[0], want[0])


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_allocation_failure_for_a_new_signature(target, demo):
    path, x = demo
    sess, dev = device_session(target, path)
    used = dev.memory_used
    dev.faults.fail_allocation = 1
    with pytest.raises(AllocationError):
        sess.run(None, {"input": x[:3]})  # batch 3: a new arena
    assert dev.memory_used == used
    want = golden_run(path, {"input": x[:3]}, target)
    np.testing.assert_array_equal(sess.run(None, {"input": x[:3]})[0], want[0])


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_fence_that_never_signals_times_out(target, demo):
    path, x = demo
    opts = quanta.SessionOptions()
    opts.device_timeout_s = 0.2
    dev = target_info(target).make_device()
    sess = quanta.InferenceSession(path, opts, backend=target, device=dev)
    want = sess.run(None, {"input": x})[0]
    dev.faults.drop_signals = True
    t0 = time.monotonic()
    with pytest.raises(FenceTimeout, match=r"partition #1: .* did not reach .* within 0.2 s"):
        sess.run(None, {"input": x})
    assert time.monotonic() - t0 < 10
    dev.faults.drop_signals = False
    np.testing.assert_array_equal(sess.run(None, {"input": x})[0], want)  # a fresh fence


@pytest.mark.parametrize("target", DEVICE_TARGETS)
@pytest.mark.parametrize("after", [1, 5, 12])
def test_device_lost_mid_stream(target, demo, after):
    path, x = demo
    sess, dev = device_session(target, path)
    feeds = {"input": x.copy()}
    sess.run(None, feeds)
    dev.faults.lose_at_command = dev.commands_executed + after
    with pytest.raises(DeviceLostError, match="device lost while executing command"):
        sess.run(None, feeds)
    with pytest.raises(DeviceLostError):  # lost stays lost
        sess.run(None, feeds)
    np.testing.assert_array_equal(feeds["input"], x)
    # the host is intact: a new session on a new device runs
    want = golden_run(path, {"input": x}, target)
    _, got = run(path, {"input": x}, target)
    np.testing.assert_array_equal(got[0], want[0])


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_device_partitions_pass_the_stage_verifier(target, demo, encoder):
    from quanta.ir.onnx_io import load
    from quanta.runtime.compile import compile as compile_model

    for path in (demo[0], encoder[0]):
        sess = quanta.InferenceSession(path, backend=target)
        tgt = quanta.targets.get_target(target)
        for p in sess.plan.partitions:
            if p.on_host:
                continue
            nodes = [sess.plan.steps[k].node for k in p.steps]
            assert tgt.verify_partition(nodes) == []
            for n in nodes:  # and, said plainly: no float tensor on the device
                for v in (*n.inputs, *n.outputs):
                    if v is not None and not v.is_const:
                        assert np.dtype(v.type.elem.numpy).kind in "iu", (n.label, v.name)

    class Careless(type(quanta.targets.get_target(target))):
        def unsupported(self, model, node):  # claims every node
            return None

    with pytest.raises(TargetError, match=r"device partition #0 on .*: .*node"):
        compile_model(load(demo[0]), Careless())


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_shape_outside_the_device_rules_is_refused_when_partitions_are_not_allowed(target):
    opts = quanta.SessionOptions()
    opts.allow_host_partitions = False
    with pytest.raises(TargetError, match=r"node .*q_x.* cannot run on .*: operator ai.onnx::QuantizeLinear"):
        quanta.InferenceSession(models.qdq_conv(), opts, backend=target)


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_dimension_over_the_device_limit_goes_to_the_host_with_its_reason(target):
    from dataclasses import replace

    caps = replace(target_info(target).capabilities, max_dim=8)
    dev = target_info(target).make_device(capabilities=caps)
    from quanta.targets.npu_sim import NpuSimTarget

    rng = np.random.default_rng(3)
    feeds = {"x": rng.standard_normal((1, 3, 9, 5)).astype(np.float32)}
    from quanta.ir.onnx_io import load
    from quanta.runtime.compile import compile as compile_model

    plan = compile_model(load(models.qdq_conv()), NpuSimTarget(caps))
    reasons = [why for p in plan.partitions for why in p.reasons.values()]
    assert any("has dimension 9 > 8" in why for why in reasons), reasons
    assert all(p.on_host for p in plan.partitions)
    del dev, feeds


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_model_larger_than_device_memory_streams_or_is_refused_before_allocating(target, demo):
    path, x = demo
    want = golden_run(path, {"input": x}, target)
    full = quanta.InferenceSession(path, backend=target)
    m = full.plan.device_memory
    # fits the arena and the largest step's constants, not every constant: streamed
    small = m.arena_bytes + m.scratch_bytes
    assert small < m.arena_bytes + m.constant_bytes
    opts = quanta.SessionOptions()
    opts.device_memory_bytes = small
    sess = quanta.InferenceSession(path, opts, backend=target)
    assert sess.plan.device_memory.streaming and "streamed" in str(sess.plan)
    np.testing.assert_array_equal(sess.run(None, {"input": x[:1]})[0], want[0][:1])
    # too small even to stream: refused, nothing allocated
    dev = target_info(target).make_device(memory_bytes=m.scratch_bytes)
    with pytest.raises(TargetError, match=r"does not fit the device: .* the device has"):
        quanta.InferenceSession(path, backend=target, device=dev)
    assert dev.memory_used == 0 and dev.allocations == 0


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_batch_larger_than_device_memory_is_refused_per_run(target, demo):
    path, x = demo
    full = quanta.InferenceSession(path, backend=target)
    m = full.plan.device_memory
    opts = quanta.SessionOptions()
    opts.device_memory_bytes = m.total_bytes + 2 * m.arena_bytes  # batch 1 to 3
    sess = quanta.InferenceSession(path, opts, backend=target)
    sess.run(None, {"input": x[:1]})
    with pytest.raises(TargetError, match=r"does not fit the device: .* \(shapes with \{'N': 5\}\)"):
        sess.run(None, {"input": x})
    assert sess.run(None, {"input": x[:1]})[0].shape == (1, 10)


@pytest.mark.parametrize("target", DEVICE_TARGETS)
def test_kernel_result_of_an_unsupported_shape_fails_the_run_cleanly(target, demo):
    from quanta.hal import DeviceExecutable, UnsupportedError
    from quanta.runtime.hetero import HeteroExecutor

    path, x = demo
    sess, _ = device_session(target, path)
    want = sess.run(None, {"input": x})[0]
    exe = sess.executor
    assert isinstance(exe, HeteroExecutor)
    part = next(p for p in exe._parts if hasattr(p, "executables"))
    good = part.executables[2]
    # a kernel whose result does not have the planned shape (one row short)
    part.executables[2] = DeviceExecutable("bad", good.name, lambda *a: good.fn(*a)[0][:-1])
    with pytest.raises(
        UnsupportedError, match=r"node .*: produced .* its output buffer holds .*unsupported shape"
    ):
        sess.run(None, {"input": x})
    part.executables[2] = good
    np.testing.assert_array_equal(sess.run(None, {"input": x})[0], want)
