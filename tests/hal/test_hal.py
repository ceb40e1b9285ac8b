"""The HAL's objects on both devices: semaphores, allocation, command buffers, the
asynchronous queue of npu-sim, faults, the executable cache."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from quanta.hal import (
    AllocationError,
    DeviceExecutable,
    DeviceLostError,
    FenceTimeout,
    HalError,
    HostDevice,
    Semaphore,
    UnsupportedError,
)
from quanta.targets.npu_sim import make_device
from quanta.targets.npu_sim.device import Faults


def devices():
    return [HostDevice(), make_device(memory_bytes=1 << 16)]


def test_semaphore_signal_wait_timeout_and_failure():
    s = Semaphore(3, "s")
    s.wait(3, timeout=0)  # already there
    t0 = time.monotonic()
    with pytest.raises(FenceTimeout, match=r"s did not reach 4 within 0\.05 s"):
        s.wait(4, timeout=0.05)
    assert time.monotonic() - t0 < 2
    threading.Timer(0.02, s.signal, args=(5,)).start()
    s.wait(5, timeout=5)
    assert s.value == 5
    with pytest.raises(HalError, match="below the current value"):
        s.signal(4)
    s.fail(DeviceLostError("gone"))
    with pytest.raises(DeviceLostError, match="gone"):
        s.wait(1, timeout=1)  # a failure wins over a reached value
    assert "failed" in repr(s)


def _add_exe(offset: int) -> DeviceExecutable:
    return DeviceExecutable(
        ("add", offset), "add", lambda a, b: (a.astype(np.int32) + b + offset).astype(np.int32)
    )


@pytest.mark.parametrize("device", devices(), ids=["host", "npu-sim"])
def test_upload_fill_dispatch_download_round_trip(device):
    a = np.arange(-7, 10, dtype=np.int8).reshape(1, 17)
    b = np.full((1, 17), 300, np.int32)
    buf = device.allocate(256 + 17 * 4 + 5)
    ba = buf.binding(a.shape, a.dtype)
    bb = buf.binding(b.shape, b.dtype, 128)
    bc = buf.binding((1, 17), np.int32, 256)
    bz = buf.binding((3,), np.uint8, 224)
    out, zeros = np.empty((1, 17), np.int32), np.empty(3, np.uint8)
    exe = device.executable(("add", 11), lambda: _add_exe(11))
    cb = device.command_buffer().copy(a, ba).copy(b, bb).fill(bz, 0xAB).barrier()
    cb.dispatch(exe, [ba, bb], [bc]).barrier().copy(bc, out).copy(bz, zeros)
    fence = device.semaphore()
    device.queue.submit([cb], signal=[(fence, 1)])
    fence.wait(1, timeout=10)
    np.testing.assert_array_equal(out, a.astype(np.int32) + 311)
    np.testing.assert_array_equal(zeros, [0xAB] * 3)
    device.release(buf)
    assert device.memory_used == 0
    with pytest.raises(HalError, match="already submitted"):
        cb.barrier()


@pytest.mark.parametrize("device", devices(), ids=["host", "npu-sim"])
def test_commands_are_checked_when_recorded(device):
    buf = device.allocate(64)
    with pytest.raises(HalError, match=r"copy x: float32\[2, 3\] into int8\[6\]"):
        device.command_buffer().copy(np.zeros((2, 3), np.float32), buf.binding((6,), np.int8), label="x")
    with pytest.raises(HalError, match="overruns"):
        device.command_buffer().fill(buf.binding((65,), np.uint8))
    device.release(buf)
    with pytest.raises(HalError, match="released"):
        device.command_buffer().fill(buf.binding((1,), np.uint8))
    with pytest.raises(HalError, match="not a live buffer"):
        device.release(buf)


def test_npu_sim_allocator_aligns_reuses_and_reports():
    dev = make_device(memory_bytes=1024)
    a, b, c = dev.allocate(1), dev.allocate(100), dev.allocate(64)
    assert [x.offset % 64 for x in (a, b, c)] == [0, 0, 0]
    assert (a.offset, b.offset, c.offset) == (0, 64, 192)
    dev.release(b)
    assert dev.allocate(128).offset == 64  # first fit in the hole
    with pytest.raises(
        AllocationError, match=r"cannot allocate 2000 bytes: .* of 1024 bytes free, largest free block"
    ):
        dev.allocate(2000)
    dev.faults.fail_allocation = 1
    with pytest.raises(AllocationError, match="injected fault"):
        dev.allocate(8)
    dev.allocate(8)  # one fault, then normal again


def test_npu_sim_submit_returns_before_the_work_is_done():
    dev = make_device(memory_bytes=4096)
    gate = threading.Event()
    ran = []

    def slow(x):
        gate.wait(10)
        ran.append(True)
        return x + 1

    buf = dev.allocate(256)
    bi, bo = buf.binding((3,), np.int32), buf.binding((3,), np.int32, 64)
    out = np.zeros(3, np.int32)
    cb = dev.command_buffer().copy(np.array([1, 2, 3], np.int32), bi)
    cb.dispatch(DeviceExecutable("slow", "slow", slow), [bi], [bo]).barrier().copy(bo, out)
    fence = dev.semaphore()
    dev.queue.submit([cb], signal=[(fence, 1)])  # returns while the worker is blocked
    assert fence.value == 0 and not ran and not out.any()
    with pytest.raises(FenceTimeout):
        fence.wait(1, timeout=0.05)
    gate.set()
    fence.wait(1, timeout=10)
    np.testing.assert_array_equal(out, [2, 3, 4])


def test_npu_sim_waits_on_semaphores_and_orders_submissions():
    dev = make_device(memory_bytes=4096)
    buf = dev.allocate(64)
    b = buf.binding((4,), np.int32)
    out = np.zeros(4, np.int32)
    go, done = dev.semaphore(name="go"), dev.semaphore(name="done")
    first = dev.command_buffer().copy(np.arange(4, dtype=np.int32), b)
    second = dev.command_buffer().copy(b, out)
    dev.queue.submit([first], wait=[(go, 1)])
    dev.queue.submit([second], signal=[(done, 1)])
    with pytest.raises(FenceTimeout):
        done.wait(1, timeout=0.05)  # the first waits for "go", the second after it
    go.signal(1)
    done.wait(1, timeout=10)
    np.testing.assert_array_equal(out, np.arange(4))


def test_npu_sim_failures_reach_the_fence():
    dev = make_device(memory_bytes=4096)
    buf = dev.allocate(64)
    b = buf.binding((2,), np.int32)
    bad = DeviceExecutable("bad", "bad", lambda x: np.zeros(3, np.int32))
    fence = dev.semaphore()
    dev.queue.submit([dev.command_buffer().dispatch(bad, [b], [b], label="node bad")], signal=[(fence, 1)])
    with pytest.raises(
        UnsupportedError, match=r"node bad: produced int32\[3\], its output buffer holds int32\[2\]"
    ):
        fence.wait(1, timeout=10)
    # the device is still usable after a failed command
    ok = dev.semaphore()
    dev.queue.submit([dev.command_buffer().fill(b, 1)], signal=[(ok, 1)])
    ok.wait(1, timeout=10)


def test_npu_sim_device_lost_fails_this_and_every_later_submission():
    dev = make_device(memory_bytes=4096, faults=Faults(lose_at_command=2))
    buf = dev.allocate(64)
    b = buf.binding((2,), np.int32)
    out = np.full(2, 7, np.int32)
    f1 = dev.semaphore()
    dev.queue.submit([dev.command_buffer().fill(b, 0).copy(b, out)], signal=[(f1, 1)])
    with pytest.raises(DeviceLostError, match="device lost while executing command 2"):
        f1.wait(1, timeout=10)
    np.testing.assert_array_equal(out, [7, 7])  # the download never happened
    f2 = dev.semaphore()
    dev.queue.submit([dev.command_buffer().fill(b, 0)], signal=[(f2, 1)])
    with pytest.raises(DeviceLostError):
        f2.wait(1, timeout=10)
    assert dev.lost is not None


def test_npu_sim_dropped_signal_times_out_without_hanging():
    dev = make_device(memory_bytes=4096, faults=Faults(drop_signals=True))
    fence = dev.semaphore()
    dev.queue.submit([dev.command_buffer().barrier()], signal=[(fence, 1)])
    t0 = time.monotonic()
    with pytest.raises(FenceTimeout):
        fence.wait(1, timeout=0.1)
    assert time.monotonic() - t0 < 5


def test_executable_cache_builds_each_key_once():
    dev = HostDevice()
    builds = []

    def build():
        builds.append(1)
        return _add_exe(0)

    e1 = dev.executable(("k", 1), build)
    e2 = dev.executable(("k", 1), build)
    dev.executable(("k", 2), build)
    assert e1 is e2 and len(builds) == 2 and dev.executable_builds == 2


def test_closed_device_refuses_submissions_and_its_worker_ends():
    dev = make_device(memory_bytes=4096)
    worker = dev._worker
    dev.close()
    worker.join(5)
    assert not worker.is_alive()
    with pytest.raises(HalError, match="closed"):
        dev.queue.submit([dev.command_buffer()])


def test_host_only_plans_run_on_the_executor_directly():
    """The native path has no HAL layer in its hot loop: a host-only plan's executable
    is the executor the session calls (docs/runtime.md §7)."""
    import quanta
    from quanta.runtime.execute import Executor
    from tests.ir import models

    for backend in ("native", "npu-sim"):  # a float model has no device partition
        sess = quanta.InferenceSession(models.float_cnn(), backend=backend)
        assert type(sess.executor) is Executor and sess.device is None
