// quanta kernel dispatch: the ONE place that asks the CPU what it supports (cpuid), the
// one ISA-name parser, and the kernel dispatch table: (op, dtype, isa) -> kernel name and
// its run-time tunables (docs/kernels.md "Dispatch table"), which the kernel drivers
// (qgemm.cc, conv.cc), the autotuner (quanta/runtime/tuner.py, through
// _native.kernel_table()) and `quanta inspect --kernels` read.
//
// ISA names are a fixed set, as ruy's Path: portable, avx2, avx512vnni.
#pragma once

#include <string>
#include <vector>

namespace quanta {

enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512Vnni = 2 };

const char* isa_name(Isa isa);
// "portable" / "avx2" / "avx512vnni" -> Isa; throws std::invalid_argument (a Python
// ValueError through pybind11) naming the accepted names otherwise.
Isa parse_isa_name(const std::string& name);
// The bindings' `isa=` argument: the named ISA when this CPU runs it; otherwise throws
// std::invalid_argument "isa: expected one of ..." / "isa: '...' is not supported by this CPU".
Isa runnable_isa(const std::string& name);

// ISAs this CPU (and OS, via XGETBV) can run, portable first.
const std::vector<Isa>& supported_isas();

// The best supported ISA, or the one forced by set_isa_override (tests use it to
// compare every variant pairwise).
Isa active_isa();
void set_isa_override(Isa isa);  // throws std::invalid_argument if unsupported
void clear_isa_override();

bool isa_supported(Isa isa);

// AVX-512 VBMI (vpermb / vpermi2b: byte permutes across a whole zmm register), an
// extension inside the avx512vnni path rather than an ISA of its own: the byte lookup
// (elementwise lut) uses it when the CPU has it and the active ISA is avx512vnni.
bool avx512vbmi_supported();
// Whether the avx512vnni path uses VBMI now: supported and not turned off by
// set_avx512vbmi_override(false) (tests run the vpgatherdd path on a VBMI CPU with it).
bool avx512vbmi_active();
void set_avx512vbmi_override(bool enabled);  // throws std::invalid_argument if unsupported
void clear_avx512vbmi_override();

// AVX512_BF16 (vdpbf16ps), also an extension inside the avx512vnni path: the bf16 island
// kernels (bf16/bf16.h) use it when the CPU has it; off, they widen bf16 to float32.
bool avx512bf16_supported();
bool avx512bf16_active();
void set_avx512bf16_override(bool enabled);  // throws std::invalid_argument if unsupported
void clear_avx512bf16_override();

// The CPU's vendor string is "GenuineIntel" (cpuid leaf 0): the MX tile picks its
// rescale form by it (mx/mx.h tile12_form).
bool cpu_vendor_intel();

// One row of the dispatch table. The fallback convention is the same for every op: a
// kernel runs with the active ISA's row when the op has one, else with the row of the
// best supported ISA below it (select_kernel); portable rows exist for every op.
struct KernelRow {
  const char* op;     // operation family: "qgemm", "qconv_implicit", "qconv_depthwise", ...
  const char* dtype;  // operand types, "u8s8->s32" (x, w -> accumulator)
  Isa isa;
  const char* kernel;  // micro-kernel name in the docs/kernels.md grammar
  // Run-time tunables (qgemm.h Blocking fields) the autotuner may set; none: nullptr.
  const char* tunables[5];
};

const std::vector<KernelRow>& kernel_table();
// The row for (op, dtype) on `isa` (default: the active one, which is supported), or
// the best ISA below it that has a row; null when the op has no row at all.
const KernelRow* select_kernel(const std::string& op, const std::string& dtype);
const KernelRow* select_kernel(const std::string& op, const std::string& dtype, Isa isa);

}  // namespace quanta
