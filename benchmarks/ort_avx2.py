"""ONNX Runtime as it runs on a CPU without AVX-512 and without VNNI, on a CPU that has both.

MLAS picks its kernels once, in the ``MLAS_PLATFORM`` constructor, from ``cpuid`` and
``xgetbv``; it reads no environment variable or session option for that (onnxruntime
``core/mlas/lib/platform.cpp``), and this machine's hypervisor offers no CPUID faulting to
mask the bits from outside. So this module makes a patched copy of the ``onnxruntime``
Python package in which two conditional jumps of that constructor always skip their
block:

1. ``if (Cpuid7_1[0] & 0x10)`` (AVX-VNNI): the block that replaces the AVX2 u8s8 GEMM
   kernel, GEMV kernel and symmetric-conv dispatch by their ``vpdpbusd ymm`` versions;
2. ``if ((Cpuid7[1] & 0x10000) && (xcr0 & 0xE0) == 0xE0)`` (AVX-512F): every AVX-512
   kernel (float and int8, the VNNI ones inside it).

What stays is exactly the AVX2 (Haswell-class) assignment of the constructor:
``MlasGemmU8S8DispatchAvx2`` with ``MlasGemmU8S8KernelAvx2`` (``vpmaddubsw`` +
``vpmaddwd`` with ones + ``vpaddd``, 6 x 16 tiles), ``MlasConvSymDispatchAvx2``, the AVX2
depthwise kernels, the FMA3 float kernels. The rest of ONNX Runtime (its own
``CPUIDInfo``) is unchanged; it decides no int8 kernel. The patch is located by byte
patterns (each must match exactly once) and verified against ONNX Runtime 1.32's bytes;
another build is refused with the reason. Proof that the AVX2 kernel runs: on
``u8 255 · s8 −128`` pairs its ``vpmaddubsw`` saturates, so the patched MatMulInteger
returns wrong sums where the stock one is exact (``check()`` below, also printed by the
benchmarks that use this module).

Use: ``import ort_avx2; ort = ort_avx2.load()`` before anything imports ``onnxruntime``
(it puts the patched copy first on ``sys.path`` and imports it), or
``python benchmarks/ort_avx2.py`` to build the copy and run the check.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import shutil
import sys
from pathlib import Path

# (pattern, offset of the byte to rewrite inside it, old byte, new byte, what it is)
_PATCHES: tuple[tuple[bytes, int, int, int, str], ...] = (
    # mov eax,7; mov ecx,1; cpuid; test al,0x10; je +0x38  ->  jmp +0x38
    (bytes.fromhex("b807000000b9010000000fa2a8107438"), 14, 0x74, 0xEB, "AVX-VNNI block"),
    # test r10d,0x10000; je +0x0e; mov rax,r8; not rax; test al,0xe0  ->  jmp +0x0e
    (bytes.fromhex("41f7c20000010074 0e4c89c048f7d0a8e0".replace(" ", "")), 7, 0x74, 0xEB, "AVX-512 block"),
)


def _stock_package() -> Path:
    spec = importlib.util.find_spec("onnxruntime")
    if spec is None or spec.origin is None:
        raise RuntimeError("ort_avx2: onnxruntime is not installed")
    return Path(spec.origin).parent


def build(cache: Path | None = None) -> Path:
    """The folder holding the patched ``onnxruntime`` package (built on first use)."""
    stock = _stock_package()
    version = importlib.metadata.version("onnxruntime")
    root = (
        cache or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "quanta-ort-avx2" / version
    )
    target = root / "onnxruntime"
    marker = root / "patched.ok"
    if marker.exists():
        return root
    tmp = root.with_name(root.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(stock, tmp / "onnxruntime")
    (mod,) = (tmp / "onnxruntime" / "capi").glob("onnxruntime_pybind11_state*.so")
    data = bytearray(mod.read_bytes())
    for pattern, at, old, new, what in _PATCHES:
        first = data.find(pattern)
        if first < 0 or data.find(pattern, first + 1) >= 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise RuntimeError(
                f"ort_avx2: the MLAS_PLATFORM pattern for the {what} matches "
                f"{'no' if first < 0 else 'more than one'} place in onnxruntime {version}; "
                "this patch is written for the 1.32 wheel"
            )
        assert data[first + at] == old
        data[first + at] = new
    mod.write_bytes(bytes(data))
    if target.exists():
        shutil.rmtree(root, ignore_errors=True)
    root.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(tmp, root)
    except OSError:  # another process won the race: use its copy
        shutil.rmtree(tmp, ignore_errors=True)
    (root / "patched.ok").write_text(version + "\n")
    return root


def load():
    """Import the patched package as ``onnxruntime`` (must come before any other import)."""
    if "onnxruntime" in sys.modules:
        mod = sys.modules["onnxruntime"]
        if "quanta-ort-avx2" not in str(mod.__file__):
            raise RuntimeError("ort_avx2.load(): the stock onnxruntime is already imported in this process")
        return mod
    root = build()
    sys.path.insert(0, str(root))
    import onnxruntime

    assert "quanta-ort-avx2" in str(onnxruntime.__file__), onnxruntime.__file__
    return onnxruntime


def saturating_pairs(K: int) -> tuple:
    """x = 255 everywhere, w = −128 on every k: each vpmaddubsw pair is 2·255·(−128) =
    −65280, saturated to −32768 by MLAS's AVX2 kernel."""
    import numpy as np

    x = np.full((4, K), 255, np.uint8)
    w = np.full((K, 16), -128, np.int8)
    return x, w


def check(ort) -> tuple[bool, int, int]:
    """(the AVX2 kernel runs, its first sum, the exact sum) for a MatMulInteger on
    saturating pairs, zero points 0."""
    import numpy as np
    from onnx import TensorProto, helper, numpy_helper

    K = 64
    x, w = saturating_pairs(K)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "w"], ["y"])],
        "sat",
        [helper.make_tensor_value_info("x", TensorProto.UINT8, list(x.shape))],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [x.shape[0], w.shape[1]])],
        [numpy_helper.from_array(w, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    got = int(sess.run(None, {"x": x})[0][0, 0])
    exact = int(x[0].astype(np.int64) @ w[:, 0].astype(np.int64))
    return got != exact, got, exact


if __name__ == "__main__":
    ort = load()
    avx2, got, exact = check(ort)
    print(f"patched onnxruntime at {Path(ort.__file__).parent}")
    print(
        f"MatMulInteger on saturating pairs: {got} (exact {exact}) -> MLAS AVX2 kernel {'runs' if avx2 else 'does NOT run'}"
    )
    sys.exit(0 if avx2 else 1)
