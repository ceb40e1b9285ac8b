// Measurement for the autotuner (quanta/runtime/tuner.py): the candidate blockings of one
// GEMM shape timed round-robin on synthetic operands, so that a disturbance of the shared
// machine falls on every candidate alike; the best batch of each is kept. A one-thread
// shape's batches are timed in the calling thread's CPU time, which does not count the
// time the OS gives other processes (on 2 shared cores at load 17, wall-clock batches
// had a candidate for 1024^3 measured 3.6x faster than the heuristic blocking, where
// thread CPU time puts them within a few %); with more threads the call's time is the
// slowest worker's, which one thread's CPU clock does not see, and wall time stays.
#include "qgemm/tune.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <random>
#include <stdexcept>

namespace quanta {
namespace qgemm {
std::vector<double> time_blockings(Isa isa, int64_t M, int64_t N, int64_t K, int threads,
                                   const std::vector<Blocking>& candidates, double seconds) {
  if (M < 1 || N < 1 || K < 1) throw std::invalid_argument("time_blockings: M, N and K must be >= 1");
  if (candidates.empty()) return {};
  std::mt19937 rng(12345);
  std::vector<uint8_t> x(static_cast<size_t>(M * K));
  std::vector<int8_t> w(static_cast<size_t>(K * N));
  for (auto& v : x) v = static_cast<uint8_t>(rng());
  for (auto& v : w) v = static_cast<int8_t>(rng());
  const int32_t zw = 0;
  const auto packed = pack_weights(w.data(), false, K, N, N, &zw, false, isa);
  std::vector<int32_t> y(static_cast<size_t>(M * N));
  QGemmParams p;
  p.M = M;
  p.x = x.data();
  p.x_row_stride = K;
  p.zx = 3;
  p.w = packed.get();
  p.y = y.data();
  p.y_row_stride = N;
  p.num_threads = std::max(1, threads);
  Workspace ws;
  ws.reserve(qgemm_workspace_bytes(p));

  using clock = std::chrono::steady_clock;
  const bool cpu_time = p.num_threads == 1;
  auto seconds_now = [&] {
    return cpu_time ? thread_cpu_seconds() : std::chrono::duration<double>(clock::now().time_since_epoch()).count();
  };
  auto run = [&](const Blocking& b) {
    p.blocking = b;
    qgemm(p, ws);
  };
  // Calls per batch: about 2 ms of the first candidate.
  run(candidates[0]);
  const double t0 = seconds_now();
  run(candidates[0]);
  const double one = std::max(1e-7, seconds_now() - t0);
  const int reps = std::max(1, static_cast<int>(2e-3 / one));
  std::vector<double> best(candidates.size(), std::numeric_limits<double>::infinity());
  const auto start = clock::now();
  int rounds = 0;
  do {
    for (size_t c = 0; c < candidates.size(); ++c) {
      const double b0 = seconds_now();
      for (int r = 0; r < reps; ++r) run(candidates[c]);
      best[c] = std::min(best[c], std::max(1e-9, seconds_now() - b0) / reps);
    }
    ++rounds;
  } while (rounds < 3 || std::chrono::duration<double>(clock::now() - start).count() < seconds);
  return best;
}

}  // namespace qgemm
}  // namespace quanta
