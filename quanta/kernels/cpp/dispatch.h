// quanta kernel dispatch: the ONE place that asks the CPU what it supports (cpuid)
// and the one table that maps (op, isa) -> function.
//
// ISA names are a fixed set, as ruy's Path: portable, avx2, avx512vnni.
#pragma once

#include <string>
#include <vector>

namespace quanta {

enum class Isa : int { kPortable = 0, kAvx2 = 1, kAvx512Vnni = 2 };

const char* isa_name(Isa isa);

// ISAs this CPU (and OS, via XGETBV) can run, portable first.
const std::vector<Isa>& supported_isas();

// The best supported ISA, or the one forced by set_isa_override (tests use it to
// compare every variant pairwise).
Isa active_isa();
void set_isa_override(Isa isa);   // throws std::invalid_argument if unsupported
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

}  // namespace quanta
