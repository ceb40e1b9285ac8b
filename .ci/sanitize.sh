#!/usr/bin/env bash
# Sanitizer run of the native kernels: ASan + UBSan build of quanta.kernels._native in
# build/asan (separate from the regular editable build, which it does not touch), then the
# kernel tests against it.
#
#   .ci/sanitize.sh                      # the native-kernel tests (default, see below)
#   .ci/sanitize.sh tests/kernels/test_qgemm.py -k boundary
#
# How it works:
# - CMake configures with -DQUANTA_SANITIZE=ON (CMakeLists.txt adds
#   -fsanitize=address,undefined -fno-sanitize-recover=undefined), RelWithDebInfo for
#   readable reports.
# - Python itself is not instrumented, so libasan must be the first DSO loaded:
#   LD_PRELOAD=$(g++ -print-file-name=libasan.so), followed by libstdc++: python does not
#   link libstdc++, so without it ASan's __cxa_throw interceptor finds no real
#   __cxa_throw at start-up and the first C++ exception (every ValueError raised by the
#   bindings) kills the process silently. detect_leaks=0 because CPython and NumPy keep
#   allocations alive at exit by design (every run would "leak").
# - A tiny pytest plugin (build/asan/quanta_asan_plugin.py, written below) loads the
#   sanitized .so as quanta.kernels._native before any test imports it; the regular build
#   is never loaded in the same process (pybind11 would refuse the duplicate types).
# - Any ASan report aborts the process (non-zero exit); UBSan findings abort too
#   (-fno-sanitize-recover).
# - Default tests: tests/kernels without tests/kernels/reference, the batched Transpose
#   (tests/targets/test_native_layout.py: its binding is not in tests/kernels), and the
#   tensor-op, recurrent and float GEMM kernels, whose differential tests live in
#   tests/targets (test_native_tensor_ops.py, test_native_recurrent.py,
#   test_native_float_gemm.py), the native programs (tests/runtime/test_native_programs.py:
#   kernel calls recorded once and run later from C++), and the 4-bit block products
#   (tests/lowbit/test_w4a8.py, test_nbits_a8.py without its ONNX Runtime session test). The reference tests do
#   not touch _native, and several of them run onnxruntime, which crashes while creating
#   a session under a preloaded (uninstrumented-host) ASan. A native test that compares
#   with onnxruntime has the same problem: compare with the NumPy twin instead.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BUILD="$ROOT/build/asan"
PYTHON="${PYTHON:-python}"
JOBS="${JOBS:-2}"

GENERATOR=()
if command -v ninja >/dev/null 2>&1; then GENERATOR=(-G Ninja); fi
cmake -S "$ROOT" -B "$BUILD" ${GENERATOR[@]+"${GENERATOR[@]}"} \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DQUANTA_SANITIZE=ON \
  -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
  -Dpybind11_DIR="$("$PYTHON" -m pybind11 --cmakedir)" >/dev/null
if ! cmake --build "$BUILD" -j "$JOBS" >"$BUILD/build.log" 2>&1; then
  cat "$BUILD/build.log" >&2
  exit 1
fi

SO="$(find "$BUILD" -maxdepth 1 -name '_native*.so' | head -n 1)"
if [[ -z "$SO" ]]; then
  echo "sanitize.sh: no _native*.so in $BUILD" >&2
  exit 1
fi

cat >"$BUILD/quanta_asan_plugin.py" <<EOF
"""Loaded by .ci/sanitize.sh: makes quanta.kernels._native the sanitized build."""
import importlib.util
import sys

import quanta.kernels

_spec = importlib.util.spec_from_file_location("quanta.kernels._native", "$SO")
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
sys.modules["quanta.kernels._native"] = _mod
quanta.kernels._native = _mod
EOF

PRELOAD="$(g++ -print-file-name=libasan.so) $(g++ -print-file-name=libstdc++.so)"
if [[ "$#" -eq 0 ]]; then
  set -- "$ROOT/tests/kernels" "$ROOT/tests/targets/test_native_layout.py" \
    "$ROOT/tests/targets/test_native_tensor_ops.py" "$ROOT/tests/targets/test_native_recurrent.py" \
    "$ROOT/tests/targets/test_native_float_gemm.py" "$ROOT/tests/runtime/test_native_programs.py" \
    "$ROOT/tests/lowbit/test_w4a8.py" "$ROOT/tests/lowbit/test_nbits_a8.py" \
    --deselect="tests/lowbit/test_nbits_a8.py::test_accuracy_level_4_session_is_the_twin_and_ort_within_its_rounding" \
    --ignore="$ROOT/tests/kernels/reference"
fi
cd "$ROOT"
env LD_PRELOAD="$PRELOAD" \
  ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:halt_on_error=1:strict_string_checks=1:detect_stack_use_after_return=1" \
  UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  PYTHONPATH="$BUILD${PYTHONPATH:+:$PYTHONPATH}" \
  "$PYTHON" -m pytest -q -p no:cacheprovider -p quanta_asan_plugin "$@"
