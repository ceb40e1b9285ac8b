// Measurement for the autotuner (quanta/runtime/tuner.py).
#pragma once

#include <ctime>
#include <vector>

#include "qgemm/qgemm.h"

namespace quanta {
namespace qgemm {

// The calling thread's CPU time in seconds: what the tuner and the peak probe time one
// thread in, since on a shared machine wall time also counts the time other processes
// held the core.
inline double thread_cpu_seconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Seconds per call of each candidate blocking for one int8 GEMM shape (uint8 x, int8 w,
// int32 output, `threads` threads): the candidates run round-robin in batches of ~2 ms
// for about `seconds` in all (at least 3 rounds), the best batch of each kept; timed in the
// calling thread's CPU time when threads == 1, else in wall time.
std::vector<double> time_blockings(Isa isa, int64_t M, int64_t N, int64_t K, int threads,
                                   const std::vector<Blocking>& candidates, double seconds);

}  // namespace qgemm
}  // namespace quanta
