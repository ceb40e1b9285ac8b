#!/usr/bin/env bash
# The native kernels on a CPU without AVX-512: QEMU's user-mode emulator with its Haswell
# model (AVX2 and FMA, no AVX-512: the instruction sets of Zen 2/3 and of client Intel
# cores) runs the import and the kernel tests, so that no AVX-512 instruction runs outside
# the AVX-512 paths (a table built while the library loads, a shared inline function one
# ISA's file compiled) and the AVX2 and portable paths pass their differential tests on
# a CPU that has nothing more. Skips, saying so, when qemu-user cannot be installed.
#
#   .ci/isa_check.sh            # the import, then a sample of tests/kernels (below)
#   .ci/isa_check.sh tests/kernels/test_qgemm.py -k boundary
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
PYTHON="$(command -v "${PYTHON:-python}")"
# the interpreter itself, not a shim script (pyenv's shims are shell scripts)
PYTHON="$("$PYTHON" -c 'import sys; print(sys.executable)')"
# On a host without AVX-512 the suite before this script has already loaded the library and
# run every kernel path the Haswell model has (portable and avx2) natively: nothing to add.
if [[ "$#" -eq 0 ]] && ! grep -qw avx512f /proc/cpuinfo 2>/dev/null; then
  echo "isa_check.sh: this CPU has no AVX-512: the test suite already ran the AVX2 paths natively; skipped"
  exit 0
fi
if ! command -v qemu-x86_64 >/dev/null; then
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null; } ||
    { echo "isa_check.sh: qemu-user could not be installed: the AVX2-only run is skipped"; exit 0; }
fi
QEMU=(qemu-x86_64 -cpu Haswell)
# QEMU warns once per CPUID feature its TCG does not model (TSX, x2apic, ...): not ours
"${QEMU[@]}" "$PYTHON" -c '
from quanta.kernels import _native
isa = _native.active_isa()
assert isa == "avx2", f"expected the avx2 kernels under the Haswell model, got {isa}"
assert "avx512vnni" not in _native.supported_isas()
print("isa_check.sh: the native library loads on an AVX2-only CPU:", _native.supported_isas())
' 2> >(grep -v "TCG doesn.t support requested feature" >&2)
if [[ "$#" -eq 0 ]]; then
  # QEMU runs the suite ~35x slower than the host: the full kernel tests took most of an
  # hour there. Every kernel test function runs once or more (the first of each eighth of
  # its parametrizations, tests/conftest.py's --param-sample) with four examples a
  # property, without the few whose one case is a large product or a dense sweep; what
  # this run adds is that no AVX-512 instruction executes on the AVX2 and portable paths,
  # and the host's run of the whole suite has already checked their values on every
  # parametrization.
  set -- "$ROOT/tests/kernels" --ignore="$ROOT/tests/kernels/reference" \
    --hypothesis-profile=isa --param-sample=8 \
    -k "not 1031 and not sweep and not within_stated_ulps and not worker_placement and not l2_sized and not geometry_space and not large_tiles"
fi
cd "$ROOT"
"${QEMU[@]}" "$PYTHON" -m pytest -q -p no:cacheprovider "$@" 2> >(grep -v "TCG doesn.t support requested feature" >&2)
