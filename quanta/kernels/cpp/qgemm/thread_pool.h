// A small thread pool for the kernels: run(threads, n_chunks, fn) calls fn(chunk, thread)
// once for every chunk in [0, n_chunks), on the calling thread plus up to threads − 1
// workers, and returns when every chunk is done.
//
// Why not an OpenMP parallel-for: on a machine whose cores are shared with other
// processes, a fork/join region waits at its barrier for every team thread, including one
// the OS has not scheduled yet (a few ms on Linux), which turned a 0.6 ms GEMV into an 8 ms
// one. Here chunks are claimed dynamically (each thread from its home range first, then
// from the others'), the caller claims too, and the caller waits only for chunks that
// were actually claimed; a worker that wakes up late finds the job finished and goes
// back to sleep.
//
// A worker keeps off the caller's CPU (thread_pool.cc, step_off): two threads on one core
// while the other idles are slower than one.
//
// Determinism: which thread runs a chunk never changes what the chunk computes, so the
// kernels' results are identical for any thread count and any schedule.
//
// No allocation per run: the job lives in the pool; each range's 64-bit cursor
// (generation << 32 | next chunk) keeps a late worker from claiming a chunk of a newer
// job with the old fn.
// Concurrent run() calls from different threads: the second one runs its chunks inline on
// its own thread (no waiting, no deadlock). After fork() the child starts a fresh pool.
#pragma once

#include <cstdint>

namespace quanta {
namespace qgemm {

using ChunkFn = void (*)(void* ctx, int64_t chunk, int thread);

// thread is in [0, threads): 0 for the caller, a worker index otherwise.
void parallel_run(int threads, int64_t n_chunks, ChunkFn fn, void* ctx);

// Workers spinning for the next job go to sleep now instead of at the end of their spin
// budget: called before code that runs its own threads (NumPy's BLAS under a reference
// kernel), which a spinning worker would take a core from. The next run() wakes them.
void pool_rest();

// The contention back-off (thread_pool.cc, kLateWaitNs): parallel jobs run, jobs run on
// the caller alone because of it, back-offs from a late worker, workers that found
// themselves descheduled while they spun; and where a parallel job's time goes: the chunks
// the caller and the workers ran, the time the caller took to publish jobs (the lock) and
// the time it waited for chunks the workers held after its own were done.
struct PoolStats {
  int64_t jobs, solo_jobs, backoffs, preemptions;
  int64_t caller_chunks, worker_chunks, publish_ns, wait_ns, colocated;
  // ns the caller spent in its own chunks, the workers in theirs, and the workers spinning
  // for the next job (the CPU a parallel session spends beyond its work).
  int64_t caller_work_ns, worker_work_ns, worker_spin_ns;
};
PoolStats pool_stats();
// Turns the back-off on or off; it starts on unless the environment has
// QUANTA_POOL_BACKOFF=0 when the pool starts.
void pool_set_backoff(bool enabled);
// Runs every parallel job on the caller alone for the next `microseconds` (0: from now
// on, as measured); the tests' way to take the solo path without a loaded machine.
void pool_solo_for(int64_t microseconds);

template <typename F>
void parallel_for(int threads, int64_t n_chunks, F& f) {
  parallel_run(threads, n_chunks, [](void* c, int64_t chunk, int thread) { (*static_cast<F*>(c))(chunk, thread); }, &f);
}

// f(begin, end) over [0, n) in chunks of `grain` items (the last one shorter), claimed by
// up to `threads` threads; one call f(0, n) when one thread or one chunk suffices. The
// elementwise, float and pooling drivers split their flat outputs with it.
template <typename F>
void parallel_ranges(int threads, int64_t n, int64_t grain, F&& f) {
  if (n <= 0) return;
  grain = grain < 1 ? 1 : grain;
  const int64_t chunks = (n + grain - 1) / grain;
  if (threads <= 1 || chunks == 1) {
    f(int64_t{0}, n);
    return;
  }
  auto body = [&](int64_t c, int) { f(c * grain, (c + 1) * grain < n ? (c + 1) * grain : n); };
  parallel_for(threads, chunks, body);
}

}  // namespace qgemm
}  // namespace quanta
