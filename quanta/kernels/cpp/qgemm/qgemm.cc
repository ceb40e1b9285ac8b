// qgemm driver: the dispatch table of micro-kernel families, cache blocking, threads and
// the per-call folding of zero points and bias (contract in qgemm.h).
//
// Loop nest, per chunk of work (a contiguous range of N panels, or of rows when there are
// fewer panels than threads, or (row group, panel group) pairs when neither balances):
//
//   for nb in the task's panels, step NC  B block of NC panels (NC = all by default)
//   for mc0 in rows, step MC            A block MC x Kp of x' stays in L2 across panels
//     for panel p in the B block        B panel Kp x NR
//       for chunk k0 in [0, Kp), step KC  B chunk KC x NR stays in L1 across the MC rows
//         tiles(rows mc0 .. mc0+MC, panel p, chunk k0)   MR x NR register tiles; int32
//                                          partial sums go through a small per-thread
//                                          buffer between chunks, the epilogue runs on
//                                          the last chunk
//
// Before it, on the calling thread: x -> x' rows (when the kernel cannot read x in place)
// and the row sums Σ_k x' (when some zw' != 0).
//
// MC, NC, KC and the prefetches are run-time parameters (qgemm.h Blocking): the caller's,
// else the tuned table's entry for the shape, else the heuristics below.
//
// Threads: the task's units are cut into a few chunks per thread, claimed dynamically
// from a small pool (thread_pool.h); each output element is computed by the same code
// whichever thread claims it, so the bytes do not depend on the thread count.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "qgemm/kernel.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace qgemm {
namespace {

template <typename L>
KernelFamily family_of(Isa isa, const char* name, TileFn tiles, bool row_tiles_outer = false, int mr_indirect = 0) {
  return KernelFamily{isa,
                      name,
                      L::kMR,
                      L::kNR,
                      L::kKR,
                      static_cast<int>(sizeof(typename L::WeightStorage)),
                      static_cast<int>(sizeof(typename L::ActivationStorage)),
                      tiles,
                      row_tiles_outer,
                      mr_indirect > 0 ? mr_indirect : L::kMR};
}

// B chunk (KC x NR weights) budget: about 2/3 of a 48 KiB L1D, the rest for the A rows.
constexpr int64_t kKcBytes = 32 * 1024;
// A block (MC x Kp of x') budget: an eighth of a 2 MiB L2, leaving room for the B panels
// and the output lines streaming through (measured on 1024^3, one thread: 512 KiB is
// ~3 % slower, 128 KiB the same).
constexpr int64_t kMcBytes = 256 * 1024;
// L2 share for what one A block streams past: the packed B of the task's panels, the A
// block and its output lines (docs/kernels.md (GI1)). When the task's B fits with an A
// block of >= kMinMcRows rows, MC is cut so that all three stay in L2 and every A block
// re-reads B from L2 instead of L3 (1024^3, one thread: B is 1 MiB, MC 256 -> 96 rows,
// about +0.7 %, the median of 5 alternating runs; with two threads a task holds 1/8 of B
// and MC stays 256, and 32-row blocks there were 3 % slower). Otherwise B streams from L3
// anyway and the large block amortises it best (512 x 1024 x 4096: 32-row blocks ran at
// 60 % of the 64-row speed).
// A family with row_tiles_outer takes MC = MR instead when the task's B fits (GI2): each
// row tile's x' stays in L1 across the task's panels, B streams from L2, and the tile's
// output rows are written left to right, a few pages at a time (1024^3, one thread,
// 12 x 32 tile: ~+2 % over MC = 96 on an Intel core with 2 MiB of L2; the 4 x 16 avx2
// tile lost 10 % that way).
// The share is 3/4 of the running core's L2 (l2_share_bytes), read from the CPU, not a
// constant: 1.5 MiB on the 2 MiB L2 of Intel's Sapphire / Emerald Rapids where the blocking
// was measured, 768 KiB on the 1 MiB L2 of Zen 4 / Zen 5, where a 1 MiB B streamed by the
// row tiles from L3 ran at 0.88 of the peak in the tile against 0.93-0.95 from L2, and
// 384 KiB on Zen 3's 512 KiB.
constexpr int64_t kMinMcRows = 32;
constexpr int64_t kChunksPerThread = 4;
// Few rows (a transformer's tokens, a recurrent step, a classifier head): every row of a
// task is one block, so each B chunk is read once (by the first row tile, from L3 or
// DRAM: a model's weights do not stay in L2 between its layers) and reused from L1 by the
// other row tiles, and the panels pass front to back in one contiguous stream; the first
// row tile prefetches it kStreamPrefetch bytes ahead (TileArgs::stream_prefetch).
// Row tiles outer would read the whole B once per 12 rows, and only the 12-row tile
// prefetched (2 KiB ahead).
// Measured (M = 16, t5's K x N, 16 MB of weights, 1 thread): 3-24 % faster than row tiles
// outer with a prefetch 4, 16 or 32 KiB ahead (16 kept), ~0 % without it; M = 48 against a
// 512 x 1024 B ran 10-20 % slower than row tiles outer (B from L2 four times beats four
// tiles sharing an L1 chunk), so two row tiles at most.
// One or two rows (a batch-1 recurrent step, a decoder's token) do not prefetch: their
// k-loop is two loads and two or four vpdpbusd a k-group, bound by the loads, and a
// prefetch per line takes load slots; the hardware prefetchers follow the one stream
// (Zen 4, 1 thread, B from L3: 768 x 3072, the step of an H = 768 DynamicQuantizeLSTM,
// 38 -> 31 us at M = 1 and 41 -> 32 at M = 2; 1024 x 4096 65 -> 53 us; from M = 4 on the
// prefetch is even or ahead, 16 MB of B at M = 4 and 8 by ~10 %).
constexpr int64_t kStreamRows = 24;
constexpr int64_t kStreamPrefetch = 16 * 1024;
constexpr int64_t kStreamPrefetchMinRows = 3;

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
int64_t div_up(int64_t v, int64_t by) { return (v + by - 1) / by; }
size_t align64(size_t v) { return (v + 63) / 64 * 64; }

// 3/4 of the running core's L2 (sysconf, which reads the CPU's cache descriptors; 2 MiB
// when it reports none): the B a task may have for a row_tiles_outer family to run its
// row tiles outer, and the L2 share of the MC cut (see above kMinMcRows; docs/kernels.md
// (GI1), (GI2)). On Zen 3 (512 KiB) a 1024 x 1024 B streamed by the row tiles comes from
// L3, and ~100-row blocks with B chunks in L1 ran ~2 % faster for the avx2 pair-safe
// family (1024^3, 256 x 1024 x 1024, 128 x 768 x 768; one thread).
int64_t l2_share_bytes() {
  static const int64_t share = [] {
    const long v = sysconf(_SC_LEVEL2_CACHE_SIZE);
    const int64_t l2 = v > 0 ? static_cast<int64_t>(v) : int64_t{2} * 1024 * 1024;
    return l2 / 4 * 3;
  }();
  return share;
}

// The tuned table (qgemm.h set_tuned_blocking) and the shape recorder.
// Two atomic flags keep the untuned hot path free of the lock.
struct Tuned {
  std::mutex mu;
  std::map<ShapeKey, Blocking> table;
  std::atomic<bool> has_entries{false};
  std::atomic<bool> recording{false};
  std::map<ShapeKey, int64_t> seen;
};
Tuned& tuned() {
  static Tuned t;
  return t;
}

// The blocking a call asks for: its own, else the table's entry for its shape.
Blocking requested_blocking(const QGemmParams& p, Isa isa) {
  if (!p.blocking.is_default()) return p.blocking;
  Tuned& t = tuned();
  if (!t.has_entries.load(std::memory_order_acquire)) return Blocking{};
  const ShapeKey key{isa, p.M, p.w->N, p.w->K, std::max(1, p.num_threads)};
  std::lock_guard<std::mutex> lock(t.mu);
  const auto it = t.table.find(key);
  return it == t.table.end() ? Blocking{} : it->second;
}

struct Plan {
  const KernelFamily* fam = nullptr;
  int64_t M = 0, N = 0, K = 0, Kp = 0, Np = 0, n_panels = 0;
  bool direct = false;  // the kernel reads x in place
  bool rowsums = false;
  int64_t kc = 0, n_chunks = 1, mc = 0;
  int64_t nc = 0;  // panels per B block
  int64_t prefetch = kDefaultPrefetch;
  int64_t stream_prefetch = 0;  // kStreamRows: B bytes ahead the first row tile prefetches
  bool prefetch_a = false;
  bool tuned = false;        // the blocking came from the table or the caller
  int64_t partial_rows = 0;  // rows per thread of the partial-sum buffer
  int tasks = 1;             // threads used
  bool split_n = true;
  bool split_2d = false;  // units are (MR-row group, panel group) pairs, row-major
  int64_t units = 0;      // groups of panels_per_unit panels (split_n) or MR-row groups
  int64_t n_units = 1;    // split_2d: panel groups per row group
  int64_t panels_per_unit = 1;
  int64_t n_work = 1;  // work chunks (ranges of units) claimed by the threads
  size_t off_a = 0, off_rowsum = 0, off_zx_row = 0, off_colterm = 0, off_mult = 0, off_fbias = 0, off_fmult = 0,
         off_fshift = 0, off_post_k = 0, off_post_u = 0, off_partial = 0, total = 0;
};

Plan make_plan(const QGemmParams& p) {
  if (p.w == nullptr) throw std::invalid_argument("qgemm: no packed weights");
  const PackedWeights& w = *p.w;
  Plan pl;
  pl.fam = &kernel_family(w);
  const KernelFamily& f = *pl.fam;
  if (f.nr != w.nr || f.kr != w.kr || f.w_bytes != w.storage_bytes) {
    throw std::invalid_argument("qgemm: packed weights do not match the layout of their ISA");
  }
  pl.M = p.M;
  pl.N = w.N;
  pl.K = w.K;
  pl.Kp = w.Kp;
  pl.n_panels = w.n_panels;
  pl.Np = w.padded_n();
  pl.direct = f.a_bytes == 1 && !p.x_signed && pl.K == pl.Kp;
  pl.rowsums = w.has_zero_point;

  const int64_t kc_max = std::max<int64_t>(f.kr, kKcBytes / (int64_t{f.nr} * f.w_bytes) / f.kr * f.kr);
  const int64_t chunks = std::max<int64_t>(1, div_up(pl.Kp, kc_max));
  pl.kc = round_up(div_up(pl.Kp, chunks), f.kr);
  const int threads = std::max(1, p.num_threads);
  const int64_t row_groups = div_up(pl.M, f.mr);
  // Split N unless there are too few panels for a few chunks per thread and more rows.
  pl.split_n = pl.n_panels >= int64_t{threads} * kChunksPerThread || pl.n_panels >= row_groups;
  // Splitting N: a unit's columns cover whole 64-byte lines of y (2 panels of 32 bytes for
  // an 8-bit output), so two threads never write into one cache line of a row (false
  // sharing: a 128x384x384 QLinearMatMul scaled 1.34x on 2 threads with 1-panel units).
  const int64_t y_elem_bytes = p.out_type == OutType::kU8 || p.out_type == OutType::kS8 ? 1 : 4;
  pl.panels_per_unit = std::max<int64_t>(1, 64 / (int64_t{f.nr} * y_elem_bytes));
  pl.units = pl.split_n ? div_up(pl.n_panels, pl.panels_per_unit) : row_groups;
  // Few units of either kind (a 7x7 pointwise layer: 7 row groups, 3 panel groups): the
  // busiest thread of a 1-D split carries ceil(units / threads) of them (3 of 7 row groups
  // on 2 threads: at most 1.33x), so such calls split rows and panels at once.
  if (threads > 1) {
    const int64_t pu = div_up(pl.n_panels, pl.panels_per_unit);
    auto balance = [&](int64_t u) { return static_cast<double>(u) / (threads * div_up(u, threads)); };
    const double one_d = balance(pl.units), two_d = balance(row_groups * pu);
    if (one_d < 0.85 && two_d > one_d && row_groups > 1 && pu > 1) {
      pl.split_n = false;
      pl.split_2d = true;
      pl.n_units = pu;
      pl.units = row_groups * pu;
    }
  }
  pl.tasks = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, pl.units)));
  // A few chunks per thread, so that a thread the OS runs late costs little.
  pl.n_work = pl.tasks == 1 ? 1 : std::min<int64_t>(pl.units, int64_t{pl.tasks} * kChunksPerThread);
  if (pl.split_2d) pl.n_work = std::min<int64_t>(pl.units, 64);  // few small units: one per claim

  // MC: see kMcBytes and l2_share_bytes. Rows per block, then balanced over the blocks.
  const int64_t a_row_bytes = std::max<int64_t>(1, pl.Kp * f.a_bytes);
  int64_t mc_max = std::max<int64_t>(f.mr, kMcBytes / a_row_bytes / f.mr * f.mr);
  const int64_t task_panels = pl.split_n ? div_up(pl.n_panels, pl.n_work) : pl.n_panels;  // at most
  const int64_t b_bytes = task_panels * pl.Kp * f.nr * f.w_bytes;
  const int64_t y_bytes = p.out_type == OutType::kU8 || p.out_type == OutType::kS8 ? 1 : 4;
  const int64_t l2_bytes = l2_share_bytes();
  const int64_t l2_rows = (l2_bytes - b_bytes) / (a_row_bytes + task_panels * f.nr * y_bytes) / f.mr * f.mr;
  const bool stream = f.row_tiles_outer && pl.M <= kStreamRows;
  if (stream) {
    mc_max = std::max(mc_max, round_up(pl.M, f.mr));
    pl.stream_prefetch = pl.M >= kStreamPrefetchMinRows ? kStreamPrefetch : 0;
  } else if (b_bytes < l2_bytes && f.row_tiles_outer) {
    mc_max = f.mr;
  } else if (b_bytes < l2_bytes && l2_rows >= kMinMcRows) {
    mc_max = std::min(mc_max, l2_rows);
  }
  pl.mc = round_up(div_up(pl.M, std::max<int64_t>(1, div_up(pl.M, mc_max))), f.mr);  // balanced blocks
  pl.mc = std::max<int64_t>(f.mr, std::min(pl.mc, mc_max));
  pl.nc = pl.n_panels;

  // The partial-sum buffer is sized for the heuristic blocking and for any tuned one
  // (mc <= kMaxTunedMc rows, kc >= kMinTunedKc), so that the workspace size does not
  // depend on the blocking a tuner picks later.
  const int64_t heuristic_chunks = pl.kc == 0 ? 1 : std::max<int64_t>(1, div_up(pl.Kp, pl.kc));
  const int64_t partial_rows = std::max(pl.mc, std::min(round_up(pl.M, f.mr), round_up(kMaxTunedMc, f.mr)));
  const bool partial_needed = heuristic_chunks > 1 || pl.Kp > kMinTunedKc;

  const Blocking want = requested_blocking(p, f.isa);
  if (!want.is_default()) {
    pl.tuned = true;
    if (want.mc > 0) pl.mc = std::max<int64_t>(f.mr, std::min(round_up(want.mc, f.mr), partial_rows));
    if (want.nc > 0) pl.nc = want.nc;

    if (want.kc > 0) pl.kc = std::max(round_up(std::max(want.kc, kMinTunedKc), f.kr), round_up(f.kr, f.kr));
    if (want.prefetch >= 0) pl.prefetch = want.prefetch;
    if (want.prefetch_a >= 0) pl.prefetch_a = want.prefetch_a > 0;
  }
  pl.nc = std::max<int64_t>(1, pl.nc);
  pl.n_chunks = pl.kc == 0 ? 1 : std::max<int64_t>(1, div_up(pl.Kp, pl.kc));
  if (pl.kc > 0 && pl.kc >= pl.Kp) {
    pl.kc = pl.Kp;
    pl.n_chunks = 1;
  }

  size_t off = 0;
  auto take = [&off](size_t bytes) {
    const size_t at = off;
    off += align64(bytes);
    return at;
  };
  pl.off_a = take(pl.direct ? 0 : static_cast<size_t>(pl.M * pl.Kp * f.a_bytes));
  pl.off_rowsum = take(pl.rowsums ? static_cast<size_t>(pl.M) * 4 : 0);
  pl.off_zx_row = take(p.zx_per_row ? static_cast<size_t>(pl.M) * 4 : 0);
  pl.off_colterm = take(static_cast<size_t>(pl.Np) * 4);
  const bool float_mult = p.out_type == OutType::kF32 || p.requant == Requant::kFloat;
  pl.off_mult = take(float_mult ? static_cast<size_t>(pl.Np) * 4 : 0);
  pl.off_fbias = take(p.float_bias ? static_cast<size_t>(pl.Np) * 4 : 0);
  const bool fixed = p.requant == Requant::kFixedPoint;
  pl.off_fmult = take(fixed ? static_cast<size_t>(pl.Np) * 4 : 0);
  pl.off_fshift = take(fixed ? static_cast<size_t>(pl.Np) * 4 : 0);
  pl.off_post_k = take(p.post_k ? static_cast<size_t>(pl.Np) * 4 : 0);
  pl.off_post_u = take(p.post_k ? static_cast<size_t>(pl.Np) * 4 : 0);
  // + MR: a last block of fewer than MR rows joins the one before it (run_block)
  pl.partial_rows = partial_rows + f.mr;
  pl.off_partial = take(partial_needed ? static_cast<size_t>(pl.tasks * pl.partial_rows * f.nr) * 4 : 0);
  pl.total = off;
  return pl;
}

template <typename T>
T* at(uint8_t* base, size_t off) {
  return reinterpret_cast<T*>(base + off);
}

Epilogue make_epilogue(const QGemmParams& p, const Plan& pl, uint8_t* ws) {
  const PackedWeights& w = *p.w;
  Epilogue e;
  e.y = p.y;
  e.y_row_stride = p.y_row_stride;
  e.zy = p.zy;

  // colterm[n] = bias[n] − zx'·cs[n]  (eq. (5) with the u8 shift of eq. (8): zx' = zx + 128
  // for int8 x folds the 128·Σ(w − zw) compensation into this one term).
  // A per-row zx keeps the zx' term out of the column constant: − zx'[m]·cs[n] is then
  // one more rank-1 term in the epilogue, like the zw' one.
  const int32_t shift = p.x_signed ? 128 : 0;
  const int32_t zx_shifted = p.zx_per_row ? 0 : p.zx + shift;
  int32_t* colterm = at<int32_t>(ws, pl.off_colterm);
  const int32_t* cs = w.column_sums_ptr();
  // These per-call loops run once per output column (a recurrent step's GEMV at M = 1,
  // N = 4H redoes them every step), so each is a plain loop over [0, N) the compiler
  // vectorizes, then the padding columns [N, Np) zeroed.
  if (p.bias) {
    for (int64_t n = 0; n < pl.N; ++n) colterm[n] = wrapping_sub(p.bias[n], wrapping_mul(zx_shifted, cs[n]));
  } else {
    for (int64_t n = 0; n < pl.N; ++n) colterm[n] = wrapping_sub(0, wrapping_mul(zx_shifted, cs[n]));
  }
  std::fill(colterm + pl.N, colterm + pl.Np, 0);
  e.colterm = colterm;
  if (p.zx_per_row) {
    int32_t* zx_row = at<int32_t>(ws, pl.off_zx_row);
    for (int64_t m = 0; m < pl.M; ++m) zx_row[m] = p.zx_per_row[m] + shift;
    e.zx_row = zx_row;
    e.cs = cs;
  }
  if (pl.rowsums) {
    e.zw = w.zero_point_ptr();
    e.rowsum = at<int32_t>(ws, pl.off_rowsum);
  }

  e.rowterm = p.row_bias;
  if (p.multiplier_per_row) {
    if (p.requant == Requant::kFixedPoint) {
      throw std::invalid_argument("qgemm: multiplier_per_row needs a float32 multiplier");
    }
    e.mult_row = p.multiplier;  // read during the call, like every parameter array
  } else if (p.out_type == OutType::kF32 || p.requant == Requant::kFloat) {
    float* mult = at<float>(ws, pl.off_mult);
    if (p.multiplier_per_channel) {
      std::copy(p.multiplier, p.multiplier + pl.N, mult);
    } else {
      std::fill(mult, mult + pl.N, p.multiplier[0]);
    }
    std::fill(mult + pl.N, mult + pl.Np, 0.0f);
    e.multiplier = mult;
  }
  if (p.float_bias) {
    float* fb = at<float>(ws, pl.off_fbias);
    std::copy(p.float_bias, p.float_bias + pl.N, fb);
    std::fill(fb + pl.N, fb + pl.Np, 0.0f);
    e.float_bias = fb;
  }
  if (p.requant == Requant::kFixedPoint) {
    int32_t* fm = at<int32_t>(ws, pl.off_fmult);
    int32_t* fs = at<int32_t>(ws, pl.off_fshift);
    for (int64_t n = 0; n < pl.Np; ++n) {
      const int64_t i = p.fixed_per_channel ? n : 0;
      fm[n] = n < pl.N ? p.fixed_multiplier[i] : 0;
      fs[n] = n < pl.N ? p.fixed_shift[i] : 0;
    }
    e.fixed_multiplier = fm;
    e.fixed_shift = fs;
  }

  switch (p.out_type) {
    case OutType::kS32:
      e.kind = EpiKind::kS32;
      e.lo = p.has_clamp ? static_cast<int32_t>(p.clamp_lo) : std::numeric_limits<int32_t>::min();
      e.hi = p.has_clamp ? static_cast<int32_t>(p.clamp_hi) : std::numeric_limits<int32_t>::max();
      break;
    case OutType::kF32:
      e.kind = EpiKind::kF32;
      e.flo = p.has_clamp ? static_cast<float>(p.clamp_lo) : -std::numeric_limits<float>::infinity();
      e.fhi = p.has_clamp ? static_cast<float>(p.clamp_hi) : std::numeric_limits<float>::infinity();
      break;
    case OutType::kU8:
    case OutType::kS8: {
      e.y_signed = p.out_type == OutType::kS8;
      const int32_t qmin = e.y_signed ? -128 : 0;
      const int32_t qmax = e.y_signed ? 127 : 255;
      e.lo = p.has_clamp ? std::max(qmin, static_cast<int32_t>(p.clamp_lo)) : qmin;
      e.hi = p.has_clamp ? std::min(qmax, static_cast<int32_t>(p.clamp_hi)) : qmax;
      e.lo_minus_zy = static_cast<float>(e.lo - p.zy);
      e.hi_minus_zy = static_cast<float>(e.hi - p.zy);
      e.kind = p.requant == Requant::kFixedPoint ? EpiKind::kQ8Fixed : EpiKind::kQ8Float;
      if (p.post_k) {
        // padded copies: the SIMD stages load whole vectors of the panel's columns
        float* pk = at<float>(ws, pl.off_post_k);
        float* pu = at<float>(ws, pl.off_post_u);
        std::copy(p.post_k, p.post_k + pl.N, pk);
        std::copy(p.post_u, p.post_u + pl.N, pu);
        std::fill(pk + pl.N, pk + pl.Np, 0.0f);
        std::fill(pu + pl.N, pu + pl.Np, 0.0f);
        e.post_k = pk;
        e.post_u = pu;
        e.post_r1 = p.post_r1;
        e.post_r2 = p.post_r2;
        e.post_lo = static_cast<float>(qmin);
        e.post_hi = static_cast<float>(qmax);
      }
      break;
    }
  }
  if (p.post_k && e.kind != EpiKind::kQ8Float) {
    throw std::invalid_argument("qgemm: post_k: the second affine stage needs a uint8/int8 output, float requant");
  }
  return e;
}

}  // namespace

// The micro-kernel families, one per qgemm row of the dispatch table (dispatch.h), whose
// name they take (docs/kernels.md "Adding an ISA").
const KernelFamily& kernel_family(Isa isa) {
  auto name = [](Isa i) { return select_kernel("qgemm", "u8s8->s32", i)->kernel; };
  static const KernelFamily kPortable =
      family_of<PortableLayout>(Isa::kPortable, name(Isa::kPortable), qgemm_tiles_portable);
  static const KernelFamily kAvx2 = family_of<Avx2Layout>(Isa::kAvx2, name(Isa::kAvx2), qgemm_tiles_avx2);
  static const KernelFamily kAvx512Vnni =
      family_of<Avx512VnniLayout>(Isa::kAvx512Vnni, name(Isa::kAvx512Vnni), qgemm_tiles_avx512vnni, true, 8);
  switch (isa) {
    case Isa::kAvx512Vnni: return kAvx512Vnni;
    case Isa::kAvx2: return kAvx2;
    case Isa::kPortable: break;
  }
  return kPortable;
}

const KernelFamily& kernel_family(const PackedWeights& w) {
  // Row tiles outer: the 5 x K uint8 x' rows of a tile stay in L1 while the panels stream
  // from L2 (Zen 5, 2 MiB L2, 1024^3, fastest calls, loaded machine: 1.29x -> 0.87-0.92x
  // ONNX Runtime's AVX2 time; on a smaller L2 only for a smaller B, l2_share_bytes);
  // the 6-row int16 family measured no better that way (1.41x -> 1.27-1.48x).
  static const KernelFamily kAvx2Narrow = family_of<Avx2NarrowLayout>(
      Isa::kAvx2, select_kernel("qgemm", "u8s8p->s32", Isa::kAvx2)->kernel, qgemm_tiles_avx2_narrow, true);
  return w.narrow && w.isa == Isa::kAvx2 ? kAvx2Narrow : kernel_family(w.isa);
}

std::string qgemm_kernel_name(Isa isa) { return kernel_family(isa).name; }
std::string qgemm_kernel_name(const PackedWeights& w) { return kernel_family(w).name; }

size_t qgemm_workspace_bytes(const QGemmParams& p) { return make_plan(p).total; }

ResolvedBlocking qgemm_resolved_blocking(const QGemmParams& p) {
  const Plan pl = make_plan(p);
  return ResolvedBlocking{pl.mc,   pl.nc, pl.kc, pl.n_chunks, static_cast<int>(pl.prefetch), pl.prefetch_a ? 1 : 0,
                          pl.tuned};
}

bool ShapeKey::operator<(const ShapeKey& o) const {
  if (isa != o.isa) return isa < o.isa;
  if (M != o.M) return M < o.M;
  if (N != o.N) return N < o.N;
  if (K != o.K) return K < o.K;
  return threads < o.threads;
}
bool ShapeKey::operator==(const ShapeKey& o) const { return !(*this < o) && !(o < *this); }

void set_tuned_blocking(const ShapeKey& key, const Blocking& b) {
  Tuned& t = tuned();
  std::lock_guard<std::mutex> lock(t.mu);
  if (b.is_default()) {
    t.table.erase(key);
  } else {
    t.table[key] = b;
  }
  t.has_entries.store(!t.table.empty(), std::memory_order_release);
}

void clear_tuned_blockings() {
  Tuned& t = tuned();
  std::lock_guard<std::mutex> lock(t.mu);
  t.table.clear();
  t.has_entries.store(false, std::memory_order_release);
}

void record_shapes(bool on) {
  Tuned& t = tuned();
  std::lock_guard<std::mutex> lock(t.mu);
  t.recording = on;
  if (on) t.seen.clear();
}

std::vector<std::pair<ShapeKey, int64_t>> recorded_shapes() {
  Tuned& t = tuned();
  std::lock_guard<std::mutex> lock(t.mu);
  return {t.seen.begin(), t.seen.end()};
}

void qgemm(const QGemmParams& p, Workspace& workspace) {
  const Plan pl = make_plan(p);
  if (workspace.size() < pl.total) {
    throw std::invalid_argument("qgemm: workspace has " + std::to_string(workspace.size()) + " bytes, needs " +
                                std::to_string(pl.total));
  }
  if (pl.M == 0 || pl.N == 0) return;
  if (tuned().recording.load(std::memory_order_relaxed)) {
    Tuned& t = tuned();
    std::lock_guard<std::mutex> lock(t.mu);
    ++t.seen[ShapeKey{pl.fam->isa, pl.M, pl.N, pl.K, std::max(1, p.num_threads)}];
  }
  if (!isa_supported(pl.fam->isa)) {
    throw std::invalid_argument(std::string("qgemm: weights were packed for '") + isa_name(pl.fam->isa) +
                                "', which this CPU does not support");
  }
  uint8_t* ws = workspace.reserve(0);
  const Epilogue epi = make_epilogue(p, pl, ws);
  const KernelFamily& f = *pl.fam;
  const PackedWeights& w = *p.w;

  const uint8_t* a_base = pl.direct ? static_cast<const uint8_t*>(p.x) : ws + pl.off_a;
  const int64_t a_stride = pl.direct ? p.x_row_stride : pl.Kp;  // elements
  int32_t* rowsum = at<int32_t>(ws, pl.off_rowsum);

  // Phase 1, on the calling thread: x' and row sums (O(M·K), against O(M·N·K) below).
  if (!pl.direct) {
    if (f.a_bytes == 1) {
      pack_activations_u8(p.x, p.x_row_stride, p.x_signed, pl.K, pl.Kp, 0, pl.M, ws + pl.off_a);
    } else {
      const auto pack = f.isa == Isa::kAvx2 ? pack_activations_s16_avx2 : pack_activations_s16;
      pack(p.x, p.x_row_stride, p.x_signed, pl.K, pl.Kp, 0, pl.M, at<int16_t>(ws, pl.off_a));
    }
  }
  if (pl.rowsums) activation_row_sums(p.x, p.x_row_stride, p.x_signed, pl.K, 0, pl.M, rowsum);

  // One row on the avx2 pair-safe family (a recurrent step's GEMV, a decoder's one-token
  // products): the whole K per panel pair in registers (kernel.h qgemm_row_avx2_narrow),
  // the same sums and output stage as the tiles below, so the same bytes; threads split
  // the panels in the units of the plan (split_n: M = 1 is one row group).
  if (pl.M == 1 && f.tiles == qgemm_tiles_avx2_narrow) {
    const uint8_t* w_panels = w.data.data();
    if (pl.tasks == 1) {
      qgemm_row_avx2_narrow(a_base, pl.Kp, w_panels, 0, pl.n_panels, pl.N, epi);
      return;
    }
    auto row_chunk = [&](int64_t chunk, int) {
      const int64_t ub = pl.units * chunk / pl.n_work, ue = pl.units * (chunk + 1) / pl.n_work;
      const int64_t pb = ub * pl.panels_per_unit, pe = std::min(pl.n_panels, ue * pl.panels_per_unit);
      qgemm_row_avx2_narrow(a_base, pl.Kp, w_panels, pb, pe, pl.N, epi);
    };
    parallel_for(pl.tasks, pl.n_work, row_chunk);
    return;
  }

  // Phase 2: the blocked GEMM. A chunk is a contiguous range of units (panel groups,
  // MR-row groups, or (row group, panel group) pairs); chunks are claimed dynamically by
  // the threads (thread_pool.h).
  const int64_t panel_elems = pl.Kp * f.nr;  // weights per panel
  // rows [mb, me) x panels [pb, pe), blocked as in the loop nest above
  auto run_block = [&](int64_t mb, int64_t me, int64_t pb, int64_t pe, int thread) {
    TileArgs t;
    t.a_row_stride = a_stride;
    t.partial = pl.n_chunks > 1 ? at<int32_t>(ws, pl.off_partial) + thread * pl.partial_rows * f.nr : nullptr;
    t.epi = &epi;
    t.prefetch = pl.prefetch;
    t.stream_prefetch = pl.stream_prefetch;
    const int64_t a_row_bytes = a_stride * f.a_bytes, a_bytes = pl.Kp * f.a_bytes;
    for (int64_t nb = pb; nb < pe; nb += pl.nc)
      for (int64_t mc0 = mb; mc0 < me; mc0 += t.rows) {
        t.rows = std::min(pl.mc, me - mc0);
        // A last block of fewer than MR rows joins this one: with MC = MR (row tiles outer)
        // it would run its short tile against every panel of B on its own (1024 rows =
        // 85 x 12 + 4; the tile function runs 12 + 4 rows as 8 + 8).
        if (me - mc0 - t.rows > 0 && me - mc0 - t.rows < f.mr) t.rows = me - mc0;
        t.m0 = mc0;
        if (pl.prefetch_a && mc0 + t.rows < me) {  // the next A block into L2 (prefetcht1)
          const uint8_t* next = a_base + (mc0 + t.rows) * a_row_bytes;
          const int64_t rows = std::min(pl.mc, me - mc0 - t.rows);
          for (int64_t r = 0; r < rows; ++r) {
            for (int64_t k = 0; k < a_bytes; k += 64) __builtin_prefetch(next + r * a_row_bytes + k, 0, 2);
          }
        }
        for (int64_t panel = nb; panel < std::min(pe, nb + pl.nc); ++panel) {
          t.n0 = panel * f.nr;
          t.cols = static_cast<int>(std::min<int64_t>(f.nr, pl.N - t.n0));
          const uint8_t* b_panel = w.data.data() + panel * panel_elems * f.w_bytes;
          for (int64_t c = 0; c < pl.n_chunks; ++c) {
            const int64_t k0 = c * pl.kc;
            t.kc = std::min(pl.kc, pl.Kp - k0);
            t.a = a_base + (mc0 * a_stride + k0) * f.a_bytes;
            t.b = b_panel + k0 * f.nr * f.w_bytes;
            t.accumulate = c > 0;
            t.finish = c == pl.n_chunks - 1;
            f.tiles(t);
          }
        }
      }
  };
  auto compute = [&](int64_t chunk, int thread) {
    const int64_t ub = pl.units * chunk / pl.n_work, ue = pl.units * (chunk + 1) / pl.n_work;
    if (pl.split_2d) {  // each unit: its row group x its panel group
      for (int64_t u = ub; u < ue; ++u) {
        const int64_t rg = u / pl.n_units, pu = u % pl.n_units;
        run_block(rg * f.mr, std::min(pl.M, (rg + 1) * f.mr), pu * pl.panels_per_unit,
                  std::min(pl.n_panels, (pu + 1) * pl.panels_per_unit), thread);
      }
      return;
    }
    const int64_t pb = pl.split_n ? ub * pl.panels_per_unit : 0;
    const int64_t pe = pl.split_n ? std::min(pl.n_panels, ue * pl.panels_per_unit) : pl.n_panels;
    const int64_t mb = pl.split_n ? 0 : ub * f.mr, me = pl.split_n ? pl.M : std::min(pl.M, ue * f.mr);
    run_block(mb, me, pb, pe, thread);
  };
  parallel_for(pl.tasks, pl.n_work, compute);
}

double vnni_peak_probe(double seconds) {
  if (!isa_supported(Isa::kAvx512Vnni)) {
    throw std::invalid_argument("vnni_peak_probe: this CPU does not support avx512vnni");
  }
  return vnni_peak_probe_avx512vnni(seconds);
}

}  // namespace qgemm
}  // namespace quanta
