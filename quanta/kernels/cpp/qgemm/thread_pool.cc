// See thread_pool.h.
#include "qgemm/thread_pool.h"

#include <pthread.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <vector>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define QUANTA_PAUSE() _mm_pause()
#else
#define QUANTA_PAUSE() ((void)0)
#endif

namespace quanta {
namespace qgemm {
namespace {

constexpr int kMaxWorkers = 63;
// Spin budgets before blocking on a condition variable: the caller waiting for the last
// chunks, and a worker waiting for the next job. A worker that went to sleep costs a
// futex wake-up, and in a VM the halted vCPU's wake-up (measured here: the MobileNet-style
// CNN at 2 threads took 2.3 ms with a 100 us worker spin, 1.5 ms with 2 ms), so the worker
// spins across the gaps between the kernels of one model run (a float step between two
// integer kernels takes up to a few hundred us); ONNX Runtime's pool spins likewise.
// Bounded, so an idle session does not hold a core.
constexpr auto kCallerSpin = std::chrono::microseconds(100);
constexpr auto kWorkerSpin = std::chrono::microseconds(2000);

// Spins (pause) until pred() or the budget is spent; returns pred().
template <typename Pred>
bool spin_until(Pred pred, std::chrono::microseconds budget) {
  const auto end = std::chrono::steady_clock::now() + budget;
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (pred()) return true;
      QUANTA_PAUSE();
    }
    if (std::chrono::steady_clock::now() >= end) return pred();
  }
}

class Pool {
 public:
  void run(int threads, int64_t n_chunks, ChunkFn fn, void* ctx) {
    std::unique_lock<std::mutex> exclusive(run_mu_, std::try_to_lock);
    if (threads <= 1 || n_chunks <= 1 || !exclusive.owns_lock()) {
      for (int64_t c = 0; c < n_chunks; ++c) fn(ctx, c, 0);
      return;
    }
    if (threads > kMaxWorkers + 1) threads = kMaxWorkers + 1;
    ensure_workers(threads - 1);
    uint32_t gen;
    {
      std::lock_guard<std::mutex> lk(mu_);
      gen = ++gen_;
      fn_ = fn;
      ctx_ = ctx;
      n_ = n_chunks;
      invited_ = threads;
      done_.store(0, std::memory_order_relaxed);
      // Home ranges: thread r first takes chunks [n·r/T, n·(r+1)/T), in order, then helps
      // the others from the start of theirs. The same chunk lands on the same thread run
      // after run and op after op (unless a thread is late), so the lines a chunk writes
      // stay in that core's cache: with one shared ticket the halves of every output
      // moved between the cores' L2s, and a 70 KB transpose took longer on 2 threads
      // than on 1.
      for (int r = 0; r < threads; ++r) {
        range_[r].end.store(n_chunks * (r + 1) / threads, std::memory_order_relaxed);
        range_[r].next.store((static_cast<uint64_t>(gen) << 32) | static_cast<uint64_t>(n_chunks * r / threads),
                             std::memory_order_release);
      }
      ranges_.store(threads, std::memory_order_release);
    }
    // Published after the lock is released: a spinning worker that sees the new job
    // takes mu_ at once instead of blocking on it (a futex sleep, and in a VM a vCPU
    // wake-up of tens of us, which made every short parallel region pay for it).
    published_.store(gen, std::memory_order_release);
    cv_.notify_all();
    work(gen, n_chunks, fn, ctx, 0);
    if (!spin_until([&] { return done_.load(std::memory_order_acquire) == n_chunks; }, kCallerSpin)) {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire) == n_chunks; });
    }
  }

 private:
  // Claims chunks of job `gen` (its own range first, then the others') until none is
  // left or a newer job replaced it.
  void work(uint32_t gen, int64_t n, ChunkFn fn, void* ctx, int thread) {
    const int ranges = ranges_.load(std::memory_order_acquire);
    for (int k = 0; k < ranges; ++k) {
      Range& range = range_[(thread + k) % ranges];
      for (;;) {
        uint64_t t = range.next.load(std::memory_order_acquire);
        int64_t chunk = -1;
        for (;;) {
          if (static_cast<uint32_t>(t >> 32) != gen) return;
          const int64_t c = static_cast<int64_t>(t & 0xffffffffu);
          if (c >= range.end.load(std::memory_order_relaxed)) break;  // this range is done
          if (range.next.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) {
            chunk = c;  // claimed: it must run, whatever is published meanwhile
            break;
          }
        }
        if (chunk < 0) break;
        fn(ctx, chunk, thread);
        // A claimed chunk keeps job `gen` alive until this increment, so `done_` always
        // counts the current job.
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
          std::lock_guard<std::mutex> lk(mu_);
          done_cv_.notify_all();
        }
      }
    }
  }

  void worker_main(int index) {
    uint32_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (gen_ == seen) {
        lk.unlock();
        const uint32_t rest = rest_.load(std::memory_order_acquire);
        spin_until(
            [&] {
              return published_.load(std::memory_order_acquire) != seen || rest_.load(std::memory_order_relaxed) != rest;
            },
            kWorkerSpin);
        lk.lock();
      }
      cv_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      if (index >= invited_) continue;
      const ChunkFn fn = fn_;
      void* const ctx = ctx_;
      const int64_t n = n_;
      lk.unlock();
      work(seen, n, fn, ctx, index);
      lk.lock();
    }
  }

  void ensure_workers(int count) {
    while (static_cast<int>(workers_.size()) < count) {
      const int index = static_cast<int>(workers_.size()) + 1;
      workers_.emplace_back([this, index] { worker_main(index); });
      workers_.back().detach();  // the pool lives until the process ends
    }
  }

  std::mutex run_mu_;  // one job at a time; a concurrent caller runs inline
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  uint32_t gen_ = 0;
  std::atomic<uint32_t> published_{0};  // gen_, readable without the lock (worker spin)

 public:
  std::atomic<uint32_t> rest_{0};  // bumped by pool_rest(): spinning workers go to sleep

 private:
  ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
  int64_t n_ = 0;
  int invited_ = 0;
  struct alignas(64) Range {
    std::atomic<uint64_t> next{0};  // generation << 32 | next chunk of the range
    std::atomic<int64_t> end{0};
  };
  Range range_[kMaxWorkers + 1];
  std::atomic<int> ranges_{0};
  std::atomic<int64_t> done_{0};
  std::vector<std::thread> workers_;
};

std::mutex g_pool_mu;
// Read on every parallel region without a lock or a system call (getpid() is one: a
// model of a few hundred small steps made hundreds of them per run). Never destroyed
// (workers may still wait on it at exit); after fork() the child has none of the
// parent's threads, so the atfork handler drops the pointer and the child's first
// parallel region starts a fresh pool (the old one is abandoned).
std::atomic<Pool*> g_pool{nullptr};

void forget_pool_in_child() { g_pool.store(nullptr, std::memory_order_relaxed); }

Pool& pool() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) return *p;
  std::lock_guard<std::mutex> lk(g_pool_mu);
  p = g_pool.load(std::memory_order_relaxed);
  if (p == nullptr) {
    static const bool registered = (pthread_atfork(nullptr, nullptr, forget_pool_in_child), true);
    (void)registered;
    p = new Pool();
    g_pool.store(p, std::memory_order_release);
  }
  return *p;
}

}  // namespace

void pool_rest() {
  Pool* p = g_pool.load(std::memory_order_acquire);
  if (p != nullptr) p->rest_.fetch_add(1, std::memory_order_release);
}

void parallel_run(int threads, int64_t n_chunks, ChunkFn fn, void* ctx) {
  if (threads <= 1 || n_chunks <= 1) {
    for (int64_t c = 0; c < n_chunks; ++c) fn(ctx, c, 0);
    return;
  }
  pool().run(threads, n_chunks, fn, ctx);
}

}  // namespace qgemm
}  // namespace quanta
