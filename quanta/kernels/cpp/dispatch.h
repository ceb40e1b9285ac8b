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

}  // namespace quanta
