// Measurement for the autotuner (quanta/runtime/tuner.py).
#pragma once

#include <vector>

#include "qgemm/qgemm.h"

namespace quanta {
namespace qgemm {

// Seconds per call of each candidate blocking for one int8 GEMM shape (uint8 x, int8 w,
// int32 output, `threads` threads): the candidates run round-robin in batches of ~2 ms
// for about `seconds` in all (at least 3 rounds), the best batch of each kept; timed in the
// calling thread's CPU time when threads == 1, else in wall time.
std::vector<double> time_blockings(Isa isa, int64_t M, int64_t N, int64_t K, int threads,
                                   const std::vector<Blocking>& candidates, double seconds);

}  // namespace qgemm
}  // namespace quanta
