// Drivers of the float GEMM family (contract: sgemm.h): packing, K blocks and thread
// tiles of the GEMM, the convolution paths. The micro-kernels live in sgemm_<isa>.cc.
//
// Blocking: K in blocks of kKc (a 32-column B micro-panel of kKc rows, 32 KB, stays in L1
// while the tile walks down every row panel of A); a thread task is a block of rows ×
// columns (all rows when that still leaves each thread a few tasks). Later K blocks load
// the partial sums back from C, so every element is still one fma chain in increasing k.
// A packed B with few rows of A streams panel after panel instead (run_block_stream).
//
// Scratch (packed B panels and C blocks of the implicit GEMM, its phase-split input,
// depthwise padded planes) is one buffer per thread, grown on first use and kept: the hot
// path allocates only when a larger model runs.
#include "sgemm/sgemm.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "layout/transpose.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace sgemm {

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kKernelsAvx512Vnni;
    case Isa::kAvx2: return kKernelsAvx2;
    default: return kKernelsPortable;
  }
}

namespace {

constexpr int64_t kKc = 256;
// Below this many multiply-adds a product runs on the calling thread.
// (2^18 multiply-adds are ~8 us of one core: less and waking a worker costs about what
// it saves.)
constexpr int64_t kMinParallelMacs = int64_t{1} << 18;

int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }
int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

float* thread_scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

// A packed B read panel after panel (run_block_stream) when the task's rows of A take at
// most this many floats (256 KB: they stay in L2 while B streams past them).
constexpr int64_t kStreamAFloats = int64_t{1} << 16;
// How far ahead of the micro-panel it reads the first row tile prefetches packed B: 128
// k steps of a 32-column panel (16 KB). The hardware prefetchers alone left a 1-row
// product at 31 GB/s (1.2x ONNX Runtime's time at K = 1024, N = 8210 on Zen 4); with
// 4, 8, 16 or 32 KB ahead it ran at 0.7-0.9x, 16 KB the best by a little (measured).
constexpr int64_t kPrefetchAhead = 128 * kPackNr;

// The row tiles of rows [m0, m1) over one K block (from k0) and one column tile (t's
// B, columns, epilogue set): each tile's A and C. `pf`, when given, goes to the first
// row tile only (the others reuse the micro-panel it brings into L1).
// Rows of a tile on A: a packed A panel holds kPackMr rows, which a tile must not straddle.
int tile_rows(const Kernels& kr, const MatA& a) { return a.packed ? kr.mr : kr.mr_rows; }

void run_rows(const Kernels& kr, Tile& t, int64_t m0, int64_t m1, int64_t k, int64_t k0, const MatA& a, float* c,
              int64_t ldc, int64_t j, const float* pf) {
  const int mr = tile_rows(kr, a);
  for (int64_t i = m0; i < m1; i += mr) {
    const int r = static_cast<int>(std::min<int64_t>(mr, m1 - i));
    if (a.packed) {
      t.a = a.p + (i / kPackMr) * k * kPackMr + k0 * kPackMr + i % kPackMr;
      t.a_rs = 1;
    } else {
      t.a = a.p + i * a.rs + k0;
      t.a_rs = a.rs;
    }
    t.c = c + i * ldc + j;
    t.row0 = i;
    t.pf = i == m0 ? pf : nullptr;
    kr.tile[a.packed ? 1 : 0][r](t);
  }
}

// Rows [m0, m1) × columns [n0, n1) of C = A·B for a packed B and few rows of A (a weight
// streamed from DRAM or L3 by a batch of a few rows: a classifier head, a recurrent
// projection). Panel by panel, every K block of a panel before the next one, so B is
// read front to back in one contiguous stream ([⌈N/32⌉][K][32]) exactly once, and the
// row tiles of a K block reuse its kc × 32 micro-panel from L1; the first row tile
// prefetches B kPrefetchAhead ahead, so the next micro-panel is on its way while the
// other row tiles run. A single row tile takes all of K at once (no C round trips).
// The chains are run_block's: each element one fma chain in increasing k (a K block
// ends by storing the accumulators to C and the next reloads them: the same floats).
void run_block_stream(const Kernels& kr, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k, const MatA& a,
                      const MatB& b, float* c, int64_t ldc, const Epilogue& ep) {
  const int64_t kcb = m1 - m0 <= tile_rows(kr, a) ? k : kKc;
  for (int64_t jp = n0; jp < n1; jp += kPackNr) {
    const float* panel = b.p + (jp / kPackNr) * k * kPackNr;
    const int64_t jend = std::min(n1, jp + kPackNr);
    for (int64_t k0 = 0; k0 < k; k0 += kcb) {
      const int64_t kc = std::min(kcb, k - k0);
      const bool last = k0 + kc >= k;
      for (int64_t j = jp; j < jend; j += kr.nr) {
        Tile t;
        t.k = kc;
        t.nr = static_cast<int>(std::min<int64_t>(kr.nr, jend - j));
        t.b = panel + k0 * kPackNr + (j - jp);
        t.ldb = kPackNr;
        t.ldc = ldc;
        t.load_c = k0 > 0;
        t.ep = last ? &ep : nullptr;
        t.col0 = j;
        run_rows(kr, t, m0, m1, k, k0, a, c, ldc, j, j == jp ? panel + k0 * kPackNr + kPrefetchAhead : nullptr);
      }
    }
  }
}

// Rows [m0, m1) × columns [n0, n1) of C = A·B (m0 a multiple of kPackMr, n0 of kPackNr),
// every K block; rows/columns are absolute, a and b address the whole matrices. A
// row-major B is copied one kc × NR micro-panel at a time into a contiguous buffer
// before the tile walks down A: its rows sit ldb apart, and a power-of-two ldb maps all
// of a panel's kc rows onto a few L1 sets (a 512 x 512 x 512 product ran at a fifth of
// the speed of a 256 x 256 x 196 one).
void run_block(const Kernels& kr, int64_t m0, int64_t m1, int64_t n0, int64_t n1, int64_t k, const MatA& a,
               const MatB& b, float* c, int64_t ldc, const Epilogue& ep) {
  if (b.packed && (m1 - m0) * k <= kStreamAFloats) {
    run_block_stream(kr, m0, m1, n0, n1, k, a, b, c, ldc, ep);
    return;
  }
  alignas(64) float panel[kKc * kPackNr];
  for (int64_t k0 = 0; k0 < k; k0 += kKc) {
    const int64_t kc = std::min(kKc, k - k0);
    const bool last = k0 + kc >= k;
    for (int64_t j = n0; j < n1; j += kr.nr) {
      Tile t;
      t.k = kc;
      t.nr = static_cast<int>(std::min<int64_t>(kr.nr, n1 - j));
      if (b.packed) {
        t.b = b.p + (j / kPackNr) * k * kPackNr + k0 * kPackNr + j % kPackNr;
        t.ldb = kPackNr;
      } else if (m1 - m0 > tile_rows(kr, a)) {
        const float* src = b.p + k0 * b.ld + j;
        for (int64_t kk = 0; kk < kc; ++kk) {
          std::memcpy(panel + kk * kr.nr, src + kk * b.ld, static_cast<size_t>(t.nr) * sizeof(float));
        }
        t.b = panel;
        t.ldb = kr.nr;
      } else {
        t.b = b.p + k0 * b.ld + j;  // one row panel: each B element is read once anyway
        t.ldb = b.ld;
      }
      t.ldc = ldc;
      t.load_c = k0 > 0;
      t.ep = last ? &ep : nullptr;
      t.col0 = j;
      run_rows(kr, t, m0, m1, k, k0, a, c, ldc, j, nullptr);
    }
  }
}

// Rows [m0, m1) × columns [0, n) of C = A·B for the implicit GEMM without packing: A
// packed, B row kk the run b + off[kk] (kr.tile_indirect). K blocks of 128: a block's
// 32-column B runs are 128 scattered, unaligned 128-byte rows (up to 3 cache lines each),
// which must stay in L1 while the tile walks down A.
void run_block_indirect(const Kernels& kr, int64_t m0, int64_t m1, int64_t n, int64_t k, const float* a_packed,
                        const float* b, const int64_t* off, float* c, int64_t ldc, const Epilogue& ep) {
  constexpr int64_t kKci = 128;
  for (int64_t k0 = 0; k0 < k; k0 += kKci) {
    const int64_t kc = std::min(kKci, k - k0);
    const bool last = k0 + kc >= k;
    for (int64_t j = 0; j < n; j += kr.nr) {
      Tile t;
      t.k = kc;
      t.nr = static_cast<int>(std::min<int64_t>(kr.nr, n - j));
      t.b = b + j;
      t.boff = off + k0;
      t.ldb = 0;
      t.ldc = ldc;
      t.load_c = k0 > 0;
      t.ep = last ? &ep : nullptr;
      t.col0 = j;
      t.a_rs = 1;
      for (int64_t i = m0; i < m1; i += kr.mr) {
        const int r = static_cast<int>(std::min<int64_t>(kr.mr, m1 - i));
        t.a = a_packed + (i / kPackMr) * k * kPackMr + k0 * kPackMr + i % kPackMr;
        t.c = c + i * ldc + j;
        t.row0 = i;
        kr.tile_indirect[r](t);
      }
    }
  }
}

// The fused activation over rows [m0, m1) × columns [n0, n1) of C, once a task has
// finished them (still in L2; per 32-column tile the calls cost more than they save).
void post_block(const Epilogue& ep, float* c, int64_t ldc, int64_t m0, int64_t m1, int64_t n0, int64_t n1) {
  if (!ep.post) return;
  if (ldc == n1 - n0 && n0 == 0) {
    apply_post(*ep.post, c + m0 * ldc, (m1 - m0) * ldc);
    return;
  }
  for (int64_t i = m0; i < m1; ++i) apply_post(*ep.post, c + i * ldc + n0, n1 - n0);
}

// Row and column block sizes of the thread tasks of an m × n product.
void task_blocks(int64_t m, int64_t n, int64_t k, int64_t copies, int threads, int64_t* mc, int64_t* nc) {
  // Columns: up to 256 per task (fewer when K is long, so a task's B block stays in L2).
  int64_t cols = k > 1024 ? 128 : 256;
  *nc = std::min(round_up(n, kPackNr), cols);
  *mc = round_up(m, kPackMr);
  if (threads <= 1) return;
  const int64_t want = 4 * threads;
  int64_t tasks = copies * ceil_div(n, *nc);
  if (tasks < want) {
    // Narrower column blocks first (down to 64), then row blocks (down to 32 rows).
    while (tasks < want && *nc > 64) {
      *nc = round_up(*nc / 2, kPackNr);
      tasks = copies * ceil_div(n, *nc);
    }
    const int64_t row_tasks = std::max<int64_t>(1, ceil_div(want, tasks));
    *mc = std::max<int64_t>(32, round_up(ceil_div(m, row_tasks), kPackMr));
    *mc = std::min(*mc, round_up(m, kPackMr));
  }
}

}  // namespace

void pack_a(const float* a, int64_t rs, int64_t cs, int64_t m, int64_t k, float* out) {
  for (int64_t p = 0; p < ceil_div(m, kPackMr); ++p) {
    float* dst = out + p * k * kPackMr;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t r = 0; r < kPackMr; ++r) {
        const int64_t i = p * kPackMr + r;
        dst[kk * kPackMr + r] = i < m ? a[i * rs + kk * cs] : 0.0f;
      }
    }
  }
}

void pack_b(const float* b, int64_t rs, int64_t cs, int64_t k, int64_t n, float* out) {
  for (int64_t p = 0; p < ceil_div(n, kPackNr); ++p) {
    float* dst = out + p * k * kPackNr;
    for (int64_t kk = 0; kk < k; ++kk) {
      for (int64_t r = 0; r < kPackNr; ++r) {
        const int64_t j = p * kPackNr + r;
        dst[kk * kPackNr + r] = j < n ? b[kk * rs + j * cs] : 0.0f;
      }
    }
  }
}

void empty_product(int64_t batch, int64_t m, int64_t n, const Epilogue& ep, float* c) {
  for (int64_t t = 0; t < batch; ++t) {
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        float v = 0.0f;
        if (ep.alpha != 1.0f) v = v * ep.alpha;
        if (ep.bias_row) v = v + ep.bias_row[i];
        if (ep.bias_col) v = v + ep.bias_col[j];
        v = v < ep.lo ? ep.lo : v;
        v = v > ep.hi ? ep.hi : v;
        c[(t * m + i) * n + j] = v;
      }
    }
  }
  if (ep.post) apply_post(*ep.post, c, batch * m * n);
}

void gemm_batched(int64_t batch, int64_t m, int64_t n, int64_t k, const MatA& a, const int64_t* a_off, const MatB& b,
                  const int64_t* b_off, float* c, const Epilogue& ep, int num_threads, Isa isa) {
  if (batch <= 0 || m <= 0 || n <= 0) return;
  const Kernels& kr = kernels_for(isa);
  if (k == 0) {
    empty_product(batch, m, n, ep, c);
    return;
  }
  const int threads = batch * m * n * k < kMinParallelMacs ? 1 : num_threads;
  int64_t mc, nc;
  task_blocks(m, n, k, batch, threads, &mc, &nc);
  const int64_t tm = ceil_div(m, mc), tn = ceil_div(n, nc);
  auto body = [&](int64_t task, int) {
    const int64_t t = task / (tm * tn), rest = task % (tm * tn);
    const int64_t bi = rest / tn, bj = rest % tn;
    MatA at = a;
    MatB bt = b;
    if (!a.packed && a_off) at.p = a.p + a_off[t];
    if (!b.packed && b_off) bt.p = b.p + b_off[t];
    const int64_t m0 = bi * mc, m1 = std::min(m, (bi + 1) * mc), n0 = bj * nc, n1 = std::min(n, (bj + 1) * nc);
    run_block(kr, m0, m1, n0, n1, k, at, bt, c + t * m * n, n, ep);
    post_block(ep, c + t * m * n, n, m0, m1, n0, n1);
  };
  const int64_t tasks = batch * tm * tn;
  if (threads <= 1 || tasks == 1) {
    for (int64_t task = 0; task < tasks; ++task) body(task, 0);
  } else {
    qgemm::parallel_for(threads, tasks, body);
  }
}

void gemm(int64_t m, int64_t n, int64_t k, const MatA& a, const MatB& b, float* c, int64_t ldc, const Epilogue& ep,
          int num_threads, Isa isa) {
  if (n == 1 && a.packed && k > 0 && m > 0) {
    // One column (a 1x1 convolution of a 1x1 image: squeeze-excite blocks): the tile
    // would use one lane of 32; the GEMV kernel runs 8 rows per vector, the same fma
    // chain per element. Column stride ldc.
    const Kernels& kr = kernels_for(isa);
    const int64_t panels = (m + kPackMr - 1) / kPackMr;
    const int threads = m * k < kMinParallelMacs ? 1 : num_threads;
    const int64_t per = 8;  // panels per task
    auto body = [&](int64_t task, int) {
      const int64_t p0 = task * per, p1 = std::min(panels, p0 + per);
      kr.gemv(a.p + p0 * k * kPackMr, p1 - p0, k, b.p, b.ld, c + p0 * kPackMr * ldc, ldc, m - p0 * kPackMr,
              p0 * kPackMr, ep);
      if (ep.post) {
        const int64_t rows = std::min(m, p1 * kPackMr) - p0 * kPackMr;
        float* col = c + p0 * kPackMr * ldc;
        if (ldc == 1) {
          apply_post(*ep.post, col, rows);
        } else {
          for (int64_t i = 0; i < rows; ++i) apply_post(*ep.post, col + i * ldc, 1);
        }
      }
    };
    const int64_t tasks = (panels + per - 1) / per;
    if (threads <= 1 || tasks == 1) {
      for (int64_t t = 0; t < tasks; ++t) body(t, 0);
    } else {
      qgemm::parallel_for(threads, tasks, body);
    }
    return;
  }
  if (ldc == n) {
    gemm_batched(1, m, n, k, a, nullptr, b, nullptr, c, ep, num_threads, isa);
    return;
  }
  if (m <= 0 || n <= 0 || k <= 0) {
    // Only the convolution drivers call with ldc != n, and never with an empty product.
    return;
  }
  const Kernels& kr = kernels_for(isa);
  const int threads = m * n * k < kMinParallelMacs ? 1 : num_threads;
  int64_t mc, nc;
  task_blocks(m, n, k, 1, threads, &mc, &nc);
  const int64_t tm = ceil_div(m, mc), tn = ceil_div(n, nc);
  auto body = [&](int64_t task, int) {
    const int64_t bi = task / tn, bj = task % tn;
    const int64_t m0 = bi * mc, m1 = std::min(m, (bi + 1) * mc), n0 = bj * nc, n1 = std::min(n, (bj + 1) * nc);
    run_block(kr, m0, m1, n0, n1, k, a, b, c, ldc, ep);
    post_block(ep, c, ldc, m0, m1, n0, n1);
  };
  if (threads <= 1 || tm * tn == 1) {
    for (int64_t task = 0; task < tm * tn; ++task) body(task, 0);
  } else {
    qgemm::parallel_for(threads, tm * tn, body);
  }
}

// ---- convolution -----------------------------------------------------------------------------

namespace {

// A 1x1 convolution without pads whose output position (oy, ox) reads input (oy·sh, ox·sw).
bool unpadded_1x1(const ConvGeom& g) {
  return g.kh == 1 && g.kw == 1 && g.pt == 0 && g.pl == 0 && g.oh == (g.h - 1) / g.sh + 1 &&
         g.ow == (g.w - 1) / g.sw + 1;
}

// Whether the pixels-as-rows form does less vector work: the NCHW form runs rows of 8
// output channels over the plane in 16-lane columns, the rows form rows of 8 pixels over
// the channels; the rows form also packs Xᵀ and transposes Cᵀ (a few percent, the
// margin). One column (a 1x1 plane) is the GEMV path's; planes past 1024 pixels fill
// their columns anyway.
bool rows_pay(int64_t hw, int64_t m) {
  if (hw <= 1 || hw > 1024 || m < 16) return false;
  const int64_t cols_work = (m + 7) / 8 * 8 * ((hw + 15) / 16 * 16);
  const int64_t rows_work = (hw + 7) / 8 * 8 * ((m + 15) / 16 * 16);
  return rows_work * 20 < cols_work * 19;
}

// The same comparison for the implicit GEMM, whose columns are the OH × wq grid of its
// phase planes (wq ≥ OW: the padded width over the stride), against gathered pixel rows,
// in zmm FMAs per reduction step: rows of 8 × 16-lane column vectors each way, plus the
// gather, about 3/4 of a cycle per gathered value (C·kh·kw per pixel; measured on Zen 4:
// 96 -> 96 channels at 26x26 ran 1.23x slower as rows, 192 at 13x13 0.93x, 512 at 7x7
// 0.75x). One output pixel (the last layers of a 1-D audio net, a 3x3 on a 1x1 plane)
// is one row: the 1-row tile streams the packed Wᵀ, where the implicit GEMM would run
// every row panel of W over a 32-column B panel to keep one column (Silero VAD's
// 64 -> 128 channel k3 layer on one frame: 7 us, 24K multiply-adds).
bool im2col_rows_pay(const ConvGeom& g) {
  const int64_t hw = g.oh * g.ow;
  if (hw < 1 || hw > 1024 || g.m < 32) return false;
  const int64_t wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int64_t grid = g.oh * ((wp + g.sw - 1) / g.sw);
  const int64_t cols4 = 4 * ((g.m + 7) / 8 * 8) * ((grid + 15) / 16);
  const int64_t rows4 = 4 * ((hw + 7) / 8 * 8) * ((g.m + 15) / 16) + 3 * hw;
  return rows4 * 20 < cols4 * 19;
}

}  // namespace

ConvPath conv_path(const ConvGeom& g, bool rows_allowed) {
  if (g.g == g.c && g.m == g.c && g.g > 1) return ConvPath::kDepthwise;
  if (rows_allowed && g.g == 1 && unpadded_1x1(g) && rows_pay(g.oh * g.ow, g.m)) return ConvPath::kPointwiseRows;
  if (g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.oh == g.h && g.ow == g.w)
    return ConvPath::kPointwise;
  if (rows_allowed && g.g == 1 && !unpadded_1x1(g) && im2col_rows_pay(g)) return ConvPath::kIm2colRows;
  return ConvPath::kIm2col;
}

namespace {

// Depthwise on output rows of at most 16 pixels (the 7x7 and 14x14 planes of MobileNet
// tails): the row kernel would fill a fraction of its 16 lanes and pay a padded-plane copy
// per channel; instead 16 channels share the lanes (DwBlockFn), each channel's chain
// unchanged, so the bytes are those of the row path. (Measured on Zen 5, 512 channels of
// 7x7 with 5x5 taps: 0.185 ms -> 0.063 ms; at 28 columns the row kernel is as fast.)
void conv_depthwise_blocked(const ConvGeom& g, const float* x, const float* w, const float* bias, float lo, float hi,
                            float* y, int num_threads, const Kernels& kr, const PostOp* post) {
  const int64_t taps = g.kh * g.kw;
  const int64_t hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;  // padded rows / columns the windows read
  const int64_t wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int64_t blocks = ceil_div(g.c, 16);
  const int64_t tasks = g.n * blocks;
  const int threads = g.n * g.m * g.oh * g.ow * taps < kMinParallelMacs ? 1 : num_threads;
  auto body = [&](int64_t task, int) {
    const int64_t img = task / blocks, c0 = (task % blocks) * 16, cb = std::min<int64_t>(16, g.c - c0);
    float* buf = thread_scratch(hp * wp * 16 + taps * 16 + 16 + g.oh * g.ow * 16);
    float* w16 = buf + hp * wp * 16;
    float* b16 = w16 + taps * 16;
    float* out16 = b16 + 16;
    std::fill(buf, buf + hp * wp * 16, 0.0f);
    const float* planes = x + (img * g.c + c0) * g.h * g.w;
    const int64_t cols = std::min(g.w, wp - g.pl);
    for (int64_t iy = 0; iy < g.h && iy + g.pt < hp; ++iy) {
      kr.interleave16(planes + iy * g.w, g.h * g.w, static_cast<int>(cb), cols, buf + ((iy + g.pt) * wp + g.pl) * 16);
    }
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t l = 0; l < 16; ++l) w16[t * 16 + l] = l < cb ? w[(c0 + l) * taps + t] : 0.0f;
    }
    for (int64_t l = 0; l < 16; ++l) b16[l] = bias && l < cb ? bias[c0 + l] : 0.0f;
    kr.dw_block16(buf, wp, w16, b16, static_cast<int>(g.kh), static_cast<int>(g.kw), static_cast<int>(g.sh),
                  static_cast<int>(g.sw), static_cast<int>(g.dh), static_cast<int>(g.dw), g.oh, g.ow, lo, hi, out16);
    const int64_t positions = g.oh * g.ow;
    // lanes past cb hold the chains of zero weights: harmless to transform
    if (post) apply_post(*post, out16, positions * 16);
    kr.deinterleave16(out16, positions, static_cast<int>(cb), y + (img * g.c + c0) * positions, positions);
  };
  if (threads <= 1 || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) body(t, 0);
  } else {
    qgemm::parallel_for(threads, tasks, body);
  }
}

// The padded planes of conv_depthwise: h rows of wp floats, the input at columns [pl, pl + w),
// then one zero row. Only those columns change from plane to plane, so the buffer is zeroed
// once per geometry and thread: it is this function's own (thread_scratch is shared with the
// GEMM packing, which would overwrite the padding).
// `split`: the rows hold the split layout of DwRows2SplitFn, whose padding columns are
// others than the plain layout's with the same wp.
float* padded_plane_scratch(int64_t h, int64_t w, int64_t pl, int64_t wp, bool split) {
  thread_local std::vector<float> buf;
  thread_local int64_t shape[5] = {-1, -1, -1, -1, -1};
  if (shape[0] != h || shape[1] != w || shape[2] != pl || shape[3] != wp || shape[4] != split) {
    buf.assign(static_cast<size_t>((h + 1) * wp + 64 + 16), 0.0f);
    shape[0] = h, shape[1] = w, shape[2] = pl, shape[3] = wp, shape[4] = split;
  }
  // 64-byte aligned, so that with wp a multiple of 16 every row is (the aligned 3x3 / 5x5
  // row pairs of dw_row.h)
  const uintptr_t at = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - at % 64) % 64) / sizeof(float);
}

// Where the 16-channels-per-vector path beats the row kernels (measured on Zen 4, the
// two paths alternating in one process): rows of at most 16 pixels, where a row fills a
// fraction of its lanes; and 5x5 taps on rows of up to 32 pixels, where the blocked
// kernel's aligned loads and 8 pixel chains per tap row beat the row kernel's unaligned
// ones (0.65-0.83x the time at stride 1; at stride 2, on split rows, ow 20-28: blocked
// 0.7-0.85x, ow 40-56: the rows 0.8-0.9x). 3x3 taps on wider rows stay on the row kernels
// (0.9-1.5x there; at stride 1 their rows are 64-byte aligned, dw_row.h step2_aligned, at
// stride 2 split, step2_split).
bool blocked_depthwise_pays(const ConvGeom& g) {
  if (g.ow <= 16) return true;
  return g.kh * g.kw >= 25 && g.ow <= 32;
}

void conv_depthwise(const ConvGeom& g, const float* x, const float* w, const float* bias, float lo, float hi, float* y,
                    int num_threads, const Kernels& kr, const PostOp* post) {
  if (kr.dw_block16 && kr.interleave16 && kr.deinterleave16 && blocked_depthwise_pays(g)) {
    conv_depthwise_blocked(g, x, w, bias, lo, hi, y, num_threads, kr, post);
    return;
  }
  const int64_t taps = g.kh * g.kw;
  // A padded plane: row iy at plane + iy·wp, column ix at + pl + ix; the zero row serves
  // the rows above and below the input.
  // The row kernels read whole vectors: up to round_up(ow, 16) outputs, the last S = 2
  // step 32 floats from its start.
  // At stride 2 (3x3, 5x5, dilation 1) the rows are split instead (DwRows2SplitFn): the
  // padded row's even columns in [0, half), its odd ones in [half, 2·half), each aligned.
  const bool split = kr.dw_rows2_split != nullptr && kr.split2 != nullptr && g.sw == 2 && g.dw == 1 && g.kh == g.kw &&
                     (g.kh == 3 || g.kh == 5);
  const int64_t half = round_up(std::max<int64_t>(round_up(g.ow, 16) + 16, (g.pl + g.w + 1) / 2), 16);
  const int64_t need = round_up(g.ow, 16) * g.sw + (g.kw - 1) * g.dw + 32;
  const int64_t wp = split ? 2 * half : round_up(std::max<int64_t>(need, g.pl + g.w), 16);
  const int64_t planes = g.n * g.c;
  const int threads = g.n * g.m * g.oh * g.ow * taps < kMinParallelMacs ? 1 : num_threads;
  auto body = [&](int64_t plane_index, int) {
    const int64_t ch = plane_index % g.c;
    float* buf = padded_plane_scratch(g.h, g.w, g.pl, wp, split);
    float* zero = buf + g.h * wp;
    const float* src = x + plane_index * g.h * g.w;
    for (int64_t iy = 0; iy < g.h; ++iy) {
      float* row = buf + iy * wp;
      if (!split) {
        std::memcpy(row + g.pl, src + iy * g.w, static_cast<size_t>(g.w) * sizeof(float));
      } else if (g.pl % 2 == 0) {  // input column 2i at padded column pl + 2i: even
        kr.split2(src + iy * g.w, g.w, row + g.pl / 2, row + half + g.pl / 2);
      } else {  // pl odd: input column 2i lands on an odd padded column, 2i + 1 on an even one
        kr.split2(src + iy * g.w, g.w, row + half + g.pl / 2, row + g.pl / 2 + 1);
      }
    }
    const float* rows[32];
    std::vector<const float*> many;
    const float** rp = rows;
    if (g.kh > 32) {
      many.resize(static_cast<size_t>(g.kh));
      rp = many.data();
    }
    const float* wc = w + ch * taps;
    const float b = bias ? bias[ch] : 0.0f;
    float* out = y + plane_index * g.oh * g.ow;
    const auto input_rows = [&](int64_t oy, const float** r) {
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh - g.pt + ky * g.dh;
        r[ky] = iy >= 0 && iy < g.h ? buf + iy * wp : zero;
      }
    };
    const int kh = static_cast<int>(g.kh), kw = static_cast<int>(g.kw), sw = static_cast<int>(g.sw),
              dw = static_cast<int>(g.dw);
    int64_t oy = 0;
    if (split) {
      const float* r1[5];
      for (; oy + 2 <= g.oh; oy += 2) {
        input_rows(oy, rp);
        input_rows(oy + 1, r1);
        float* y0 = out + oy * g.ow;
        kr.dw_rows2_split(rp, r1, half, wc, kh, kw, b, lo, hi, y0, y0 + g.ow, g.ow);
        if (post) apply_post(*post, y0, 2 * g.ow);
      }
      if (oy < g.oh) {  // the last row of an odd count: its pair's second row is discarded
        thread_local std::vector<float> spare;
        spare.resize(static_cast<size_t>(g.ow));
        input_rows(oy, rp);
        float* y0 = out + oy * g.ow;
        kr.dw_rows2_split(rp, rp, half, wc, kh, kw, b, lo, hi, y0, spare.data(), g.ow);
        if (post) apply_post(*post, y0, g.ow);
      }
      return;
    }
    if (kr.dw_rows2 && g.kh <= 16) {
      const float* r1[16];
      for (; oy + 2 <= g.oh; oy += 2) {
        input_rows(oy, rp);
        input_rows(oy + 1, r1);
        float* y0 = out + oy * g.ow;
        if (!kr.dw_rows2(rp, r1, wc, kh, kw, sw, dw, b, lo, hi, y0, y0 + g.ow, g.ow)) break;
        if (post) apply_post(*post, y0, 2 * g.ow);
      }
    }
    for (; oy < g.oh; ++oy) {
      input_rows(oy, rp);
      kr.dw_row(rp, wc, kh, kw, sw, dw, b, lo, hi, out + oy * g.ow, g.ow);
      if (post) apply_post(*post, out + oy * g.ow, g.ow);
    }
  };
  if (threads <= 1 || planes == 1) {
    for (int64_t p = 0; p < planes; ++p) body(p, 0);
  } else {
    qgemm::parallel_for(threads, planes, body);
  }
}

// The phase-split input of conv_phased, shared by the tasks of one call (the calling
// thread's, kept like thread_scratch; the workers only read it).
// K rows of the implicit GEMM's B micro-panel without an indirect tile: 128 × 32 floats,
// 16 KB, stay in L1 next to the tile's rows of A.
constexpr int64_t kKcPhased = 128;

float* phase_scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

// The weights of g groups, each mg rows of packed A panels (kPackMr rows × k, one
// group every `packed` floats), as row-major [g][mg][k] in the calling thread's `buf`:
// a tile on a row-major A takes the ISA's row-major row count (AVX2: 6 rows, 12
// accumulators) where a packed panel of 8 rows holds two tiles of 4 (8 accumulators,
// too few for 2 fmas a cycle at Zen 3's latency of 4). M·K floats moved.
const float* unpacked_rows(const float* w, int64_t groups, int64_t mg, int64_t k, int64_t packed,
                           std::vector<float>& buf) {
  if (static_cast<int64_t>(buf.size()) < groups * mg * k) buf.resize(static_cast<size_t>(groups * mg * k));
  for (int64_t grp = 0; grp < groups; ++grp) {
    const float* src = w + grp * packed;
    float* dst = buf.data() + grp * mg * k;
    for (int64_t i = 0; i < mg; ++i) {
      const float* panel = src + (i / kPackMr) * k * kPackMr + i % kPackMr;
      for (int64_t j = 0; j < k; ++j) dst[i * k + j] = panel[j * kPackMr];
    }
  }
  return buf.data();
}

// A convolution as one GEMM whose B rows are contiguous runs of a copy of the input
// (implicit GEMM: no im2col). The zero-padded input of each channel is split into its
// sh × sw phase planes, P[c][py][px][r][q] = xpad[c][r·sh + py][q·sw + px] (hq × wq each);
// then tap (c, ky, kx) of output position (oy, ox) is P[c][py][px][oy + ry][ox + rx] with
// (ry, py) = divmod(ky·dh, sh), (rx, px) = divmod(kx·dw, sw), so over the grid of oh × wq
// positions j = oy·wq + ox the row of B for tap k is the contiguous run P_k + j. The
// grid's columns ox ≥ ow are computed and dropped (a few percent of a wide plane; their
// reads stay inside the buffer). B panels ([kk][32], the pack_b layout) are 32-float
// copies of those runs; the tile writes a task's rows × columns into a scratch C with the
// epilogue, and the columns ox < ow are copied out. Each element's chain sees the im2col
// path's values (the input or a padding 0) in the same k order: the same bytes.
void conv_phased(const ConvGeom& g, const float* x, const float* w, const float* bias, float lo, float hi, float* y,
                 int num_threads, const Kernels& kr, const PostOp* post) {
  const int64_t cg = g.c / g.g, mg = g.m / g.g;
  const int64_t kk = cg * g.kh * g.kw;
  const int64_t positions = g.oh * g.ow;
  const int64_t packed = packed_a_size(mg, kk);
  const int64_t hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;  // padded rows / columns the windows read
  const int64_t wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int64_t hq = ceil_div(hp, g.sh), wq = ceil_div(wp, g.sw);
  const int64_t plane = hq * wq, chan = g.sh * g.sw * plane;
  const int64_t grid = g.oh * wq;
  // A panel reads up to 31 floats past the grid, and a tap up to (kw − 1)·dw / sw past its plane.
  const int64_t slack = (g.kw - 1) * g.dw / g.sw + kPackNr;
  const int64_t total = g.n * g.c * chan + slack;
  float* phases = phase_scratch(total);
  std::fill(phases + total - slack, phases + total, 0.0f);
  const int threads = g.n * g.m * positions * kk < kMinParallelMacs ? 1 : num_threads;
  // Columns q of phase px whose input column q·sw + px − pl lies in [0, w): [first, end).
  std::vector<int64_t> first(static_cast<size_t>(g.sw)), end(static_cast<size_t>(g.sw));
  for (int64_t px = 0; px < g.sw; ++px) {
    first[px] = std::max<int64_t>(0, ceil_div(g.pl - px, g.sw));
    end[px] = std::max(first[px], std::min(wq, ceil_div(g.w + g.pl - px, g.sw)));
  }
  // Stride 2 across (and the ISA's split2): both column phases of an input row in one
  // vector pass, its even columns to one phase and its odd ones to the other: the input
  // columns that land in a phase column < wq, input column 0 (padded column pl) going to
  // phase pl % 2.
  const bool split_rows = g.sw == 2 && kr.split2 != nullptr;
  const int64_t used = std::clamp<int64_t>(2 * wq - g.pl, 0, g.w);
  const int64_t p0 = g.pl % 2;
  auto split = [&](int64_t nc_index, int) {
    const float* src = x + nc_index * g.h * g.w;
    float* dst = phases + nc_index * chan;
    for (int64_t py = 0; py < g.sh; ++py) {
      for (int64_t r = 0; r < hq; ++r) {
        float* row = dst + py * g.sw * plane + r * wq;  // phase px: row + px·plane
        const int64_t iy = r * g.sh + py - g.pt;
        if (iy < 0 || iy >= g.h || r * g.sh + py >= hp) {
          for (int64_t px = 0; px < g.sw; ++px) std::fill(row + px * plane, row + px * plane + wq, 0.0f);
          continue;
        }
        const float* s = src + iy * g.w;
        if (split_rows) {
          kr.split2(s, used, row + p0 * plane + first[p0], row + (1 - p0) * plane + first[1 - p0]);
        }
        for (int64_t px = 0; px < g.sw; ++px) {
          float* d = row + px * plane;
          const float* sp = s + px - g.pl;  // sp[q·sw]
          if (g.sw == 1) {
            std::memcpy(d + first[px], sp + first[px], static_cast<size_t>(end[px] - first[px]) * sizeof(float));
          } else if (!split_rows) {
            for (int64_t q = first[px]; q < end[px]; ++q) d[q] = sp[q * g.sw];
          }
          std::fill(d, d + first[px], 0.0f);
          std::fill(d + end[px], d + wq, 0.0f);
        }
      }
    }
  };
  if (threads <= 1 || g.n * g.c == 1) {
    for (int64_t i = 0; i < g.n * g.c; ++i) split(i, 0);
  } else {
    qgemm::parallel_for(threads, g.n * g.c, split);
  }
  std::vector<int64_t> off(static_cast<size_t>(kk));
  for (int64_t c = 0, k = 0; c < cg; ++c) {
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      for (int64_t kx = 0; kx < g.kw; ++kx, ++k) {
        const int64_t ry = ky * g.dh / g.sh, py = ky * g.dh % g.sh;
        const int64_t rx = kx * g.dw / g.sw, px = kx * g.dw % g.sw;
        off[static_cast<size_t>(k)] = c * chan + (py * g.sw + px) * plane + ry * wq + rx;
      }
    }
  }
  const bool indirect = kr.tile_indirect[1] != nullptr;
  // Without an indirect tile the weights are read as a row-major A (unpacked_rows): M·K
  // floats moved against M·K·OH·OW multiply-adds.
  thread_local std::vector<float> a_rows_buf;
  const float* a_rows = indirect ? nullptr : unpacked_rows(w, g.g, mg, kk, packed, a_rows_buf);
  int64_t mc, nc;
  task_blocks(mg, grid, kk, g.n * g.g, threads, &mc, &nc);
  while (nc > kPackNr && kk * nc > (int64_t{1} << 17)) nc -= kPackNr;
  const int64_t tm = ceil_div(mg, mc), tn = ceil_div(grid, nc);
  auto body = [&](int64_t task, int) {
    const int64_t img = task / (g.g * tm * tn);
    int64_t rest = task % (g.g * tm * tn);
    const int64_t grp = rest / (tm * tn);
    rest %= tm * tn;
    const int64_t bi = rest / tn, bj = rest % tn;
    const int64_t p0 = bj * nc, p1 = std::min(grid, p0 + nc);
    const int64_t panels = ceil_div(p1 - p0, kPackNr);
    const int64_t ldc = panels * kPackNr;
    const int64_t m0 = bi * mc, m1 = std::min(mg, (bi + 1) * mc);
    const int64_t packed_floats = indirect ? 0 : kKcPhased * kPackNr;
    float* cols = thread_scratch(packed_floats + (m1 - m0) * ldc);
    float* cbuf = cols + packed_floats;
    const float* base = phases + (img * g.c + grp * cg) * chan + p0;
    Epilogue ep;
    ep.bias_row = bias ? bias + grp * mg : nullptr;
    ep.lo = lo;
    ep.hi = hi;
    // run_block addresses C by absolute row: rows [m0, m1) land at cbuf.
    if (indirect) {
      run_block_indirect(kr, m0, m1, p1 - p0, kk, w + grp * packed, base, off.data(), cbuf - m0 * ldc, ldc, ep);
    } else {
      // Per K block and 32-column panel: the block's B runs copied into one micro-panel
      // (kKcPhased × 32 floats, in L1), then every row tile of the task reads it there:
      // each element's chain runs through the K blocks in increasing k, stored to C and
      // reloaded between them (the same floats). The copy prefetches the runs of the
      // micro-panel it makes next (the next panel's, or the next K block's first): they
      // are kh·kw·Cg scattered runs, a plane apart per channel, that no hardware
      // prefetcher follows, and the copy stalled on them (40 % of a 96 -> 24 channel
      // 3x3 layer at 160 x 224).
      const MatA a{a_rows + grp * mg * kk, false, kk};
      for (int64_t k0 = 0; k0 < kk; k0 += kKcPhased) {
        const int64_t kc = std::min(kKcPhased, kk - k0);
        for (int64_t q = 0; q < panels; ++q) {
          const float* src = base + q * kPackNr;
          const bool last_panel = q + 1 == panels;
          const int64_t ncols = std::min<int64_t>(kPackNr, p1 - p0 - q * kPackNr);
          for (int64_t k = 0; k < kc; ++k) {
            const float* run = src + off[static_cast<size_t>(k0 + k)];
            std::memcpy(cols + k * kPackNr, run, kPackNr * sizeof(float));
            const float* next = !last_panel        ? run + kPackNr
                                : k0 + kc + k < kk ? base + off[static_cast<size_t>(k0 + kc + k)]
                                                   : nullptr;
            if (next != nullptr) {
              __builtin_prefetch(next);
              __builtin_prefetch(next + 16);
              __builtin_prefetch(next + kPackNr - 1);
            }
          }
          for (int64_t j = 0; j < ncols; j += kr.nr) {
            Tile t;
            t.k = kc;
            t.nr = static_cast<int>(std::min<int64_t>(kr.nr, ncols - j));
            t.b = cols + j;
            t.ldb = kPackNr;
            t.ldc = ldc;
            t.load_c = k0 > 0;
            t.ep = k0 + kc >= kk ? &ep : nullptr;
            t.col0 = q * kPackNr + j;
            run_rows(kr, t, m0, m1, kk, k0, a, cbuf - m0 * ldc, ldc, q * kPackNr + j, nullptr);
          }
        }
      }
    }
    // the grid's columns past p1 - p0 are transformed too and dropped with the others
    if (post) apply_post(*post, cbuf, (m1 - m0) * ldc);
    for (int64_t i = m0; i < m1; ++i) {
      const float* crow = cbuf + (i - m0) * ldc;
      float* yrow = y + (img * g.m + grp * mg + i) * positions;
      for (int64_t j = p0; j < p1;) {
        const int64_t oy = j / wq, ox = j % wq;
        const int64_t run = std::min(p1 - j, wq - ox);
        if (ox < g.ow) {
          std::memcpy(yrow + oy * g.ow + ox, crow + (j - p0),
                      static_cast<size_t>(std::min(run, g.ow - ox)) * sizeof(float));
        }
        j += run;
      }
    }
  };
  const int64_t tasks = g.n * g.g * tm * tn;
  if (threads <= 1 || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) body(t, 0);
  } else {
    qgemm::parallel_for(threads, tasks, body);
  }
}

// Few output channels at stride 1 (sgemm.h DirectRow): the implicit GEMM's cost is its
// copies (the phase-split input, then a micro-panel per K block and 32 columns), which do
// not shrink with M, so at M = 24 a 96-channel 3x3 layer at 160 x 224 ran at 1.5x ONNX
// Runtime's time (MLAS runs it as three NCHWc blocks of 8). Here each output row's
// tiles read the input rows in place: per output row, per group of 4 channels, the ISA's
// direct_row. The chains and epilogue are the implicit GEMM's: the same bytes.
constexpr int64_t kDirectMaxM = 32;

// The plane size from which a 1x1 convolution reads its weights as a row-major copy
// (conv, pointwise): the copy is then at most 1/256 of the multiply-adds.
constexpr int64_t kPointwiseRowMajorPixels = 256;

bool direct_fits(const ConvGeom& g, const Kernels& kr) {
  return kr.direct_row != nullptr && g.g == 1 && g.m <= kDirectMaxM && g.sh == 1 && g.sw == 1 && g.dh == 1 &&
         g.dw == 1 && g.kw <= 8 && g.kh <= 64 && g.kh * g.kw > 1;
}

void conv_direct(const ConvGeom& g, const float* x, const float* w, const float* bias, float lo, float hi, float* y,
                 int num_threads, const Kernels& kr, const PostOp* post) {
  const int64_t kk = g.c * g.kh * g.kw, plane = g.h * g.w, out_plane = g.oh * g.ow;
  const int64_t groups = ceil_div(g.m, 4);
  // The weights of each 4 rows k-major (16 bytes a k step), from the 8-row packed panels.
  thread_local std::vector<float> a4_buf;
  if (static_cast<int64_t>(a4_buf.size()) < groups * kk * 4) a4_buf.resize(static_cast<size_t>(groups * kk * 4));
  float* a4 = a4_buf.data();
  for (int64_t q = 0; q < groups; ++q) {
    const float* panel = w + (4 * q / kPackMr) * kk * kPackMr + 4 * q % kPackMr;
    for (int64_t k = 0; k < kk; ++k) std::memcpy(a4 + (q * kk + k) * 4, panel + k * kPackMr, 4 * sizeof(float));
  }
  // A ring of kh zero-padded input rows per channel (row iy in slot iy % kh), ld floats
  // apart. Read in place, the channels' rows of a plane are a multiple of 4 KB apart at
  // common widths (160 x 224): a tile's 3·C runs fell into a few L1 sets and every load
  // went to L2; and the padding is zeros here, so no load is masked.
  const int64_t pr = std::max<int64_t>(0, (g.ow + 7) / 8 * 8 + g.kw - 1 - g.pl - g.w);
  const int64_t ld = (g.pl + g.w + pr + 15) / 16 * 16 + 16, cstride_ring = g.kh * ld;
  const std::vector<float> zero(static_cast<size_t>(ld), 0.0f);
  const int threads = g.n * g.m * out_plane * kk < kMinParallelMacs ? 1 : num_threads;
  const int64_t chunks = threads <= 1 ? 1 : std::min<int64_t>(g.oh, 4 * threads);
  auto body = [&](int64_t task, int) {
    const int64_t img = task / chunks, part = task % chunks;
    const int64_t oy0 = g.oh * part / chunks, oy1 = g.oh * (part + 1) / chunks;
    const float* xi = x + img * g.c * plane;
    thread_local std::vector<float> ring_buf;
    ring_buf.assign(static_cast<size_t>(g.c * cstride_ring), 0.0f);
    float* ring = ring_buf.data();
    int64_t held[64];  // the input row in each slot (−1: none)
    std::fill(held, held + g.kh, int64_t{-1});
    const float* rows[64];
    int64_t cstride[64];
    DirectRow d;
    d.rows = rows;
    d.cstride = cstride;
    d.c = g.c;
    d.kh = g.kh;
    d.kw = g.kw;
    d.pl = g.pl;
    d.ow = g.ow;
    d.lo = lo;
    d.hi = hi;
    d.ldy = out_plane;
    d.a = a4;
    d.m = g.m;
    d.bias = bias;
    for (int64_t oy = oy0; oy < oy1; ++oy) {
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy - g.pt + ky;
        if (iy < 0 || iy >= g.h) {
          rows[ky] = zero.data() + g.pl;
          cstride[ky] = 0;
          continue;
        }
        const int64_t slot = iy % g.kh;
        float* dst = ring + slot * ld + g.pl;
        if (held[slot] != iy) {
          for (int64_t c = 0; c < g.c; ++c) {
            std::memcpy(dst + c * cstride_ring, xi + c * plane + iy * g.w, static_cast<size_t>(g.w) * sizeof(float));
          }
          held[slot] = iy;
        }
        rows[ky] = dst;
        cstride[ky] = cstride_ring;
      }
      d.y = y + img * g.m * out_plane + oy * g.ow;
      kr.direct_row(d);
      if (post) {
        for (int64_t i = 0; i < g.m; ++i) apply_post(*post, y + (img * g.m + i) * out_plane + oy * g.ow, g.ow);
      }
    }
  };
  const int64_t tasks = g.n * chunks;
  if (threads <= 1 || tasks == 1) {
    for (int64_t t = 0; t < tasks; ++t) body(t, 0);
  } else {
    qgemm::parallel_for(threads, tasks, body);
  }
}

// The product of the rows paths for one image: Cᵀ (hw × m, into ct) = A · B with A the
// packed pixel rows (k columns), B the packed Wᵀ, the channel bias per column and the
// fused activation per task block; then Cᵀ transposed into y's [m][hw] planes.
void rows_product(int64_t hw, int64_t m, int64_t k, const float* at, const float* wb, const float* bias, float lo,
                  float hi, const PostOp* post, float* ct, float* y, int num_threads, Isa isa) {
  Epilogue ep;
  ep.bias_col = bias;
  ep.lo = lo;
  ep.hi = hi;
  ep.post = post;
  gemm(hw, m, k, MatA{at, true, 0}, MatB{wb, true, 0}, ct, m, ep, num_threads, isa);
  layout::transpose_batched(ct, y, 1, hw, m, sizeof(float), num_threads);
}

// kPointwiseRows (sgemm.h): per image, Xᵀ packed as A panels (the pixels' values of 8
// consecutive pixels are one contiguous run per channel), the GEMM into this thread's
// Cᵀ buffer with the bias per column and the post-op per task block, then Cᵀ transposed
// into y. A stride samples the plane while packing.
void conv_pointwise_rows(const ConvGeom& g, const float* x, const float* wb, const float* bias, float lo, float hi,
                         float* y, int num_threads, Isa isa, const PostOp* post) {
  const int64_t hw = g.oh * g.ow, c = g.c, m = g.m;
  const int64_t panels = ceil_div(hw, kPackMr);
  // own buffers: the GEMM's tasks use thread_scratch
  thread_local std::vector<float> at_buf, ct_buf;
  if (static_cast<int64_t>(at_buf.size()) < panels * kPackMr * c)
    at_buf.resize(static_cast<size_t>(panels * kPackMr * c));
  if (static_cast<int64_t>(ct_buf.size()) < hw * m) ct_buf.resize(static_cast<size_t>(hw * m));
  float* at = at_buf.data();
  float* ct = ct_buf.data();
  const bool dense = g.sh == 1 && g.sw == 1;
  for (int64_t img = 0; img < g.n; ++img) {
    const float* xi = x + img * c * g.h * g.w;
    for (int64_t p = 0; p < panels; ++p) {
      float* dst = at + p * c * kPackMr;
      const int64_t i0 = p * kPackMr, rows = std::min<int64_t>(kPackMr, hw - i0);
      if (dense && rows == kPackMr) {
        for (int64_t k = 0; k < c; ++k) std::memcpy(dst + k * kPackMr, xi + k * hw + i0, kPackMr * sizeof(float));
        continue;
      }
      int64_t src[kPackMr];  // offsets of the panel's pixels in a channel plane
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t oy = (i0 + r) / g.ow, ox = (i0 + r) % g.ow;
        src[r] = oy * g.sh * g.w + ox * g.sw;
      }
      for (int64_t k = 0; k < c; ++k) {
        const float* plane = xi + k * g.h * g.w;
        for (int64_t r = 0; r < kPackMr; ++r) dst[k * kPackMr + r] = r < rows ? plane[src[r]] : 0.0f;
      }
    }
    rows_product(hw, m, c, at, wb, bias, lo, hi, post, ct, y + img * m * hw, num_threads, isa);
  }
}

// kIm2colRows (sgemm.h): per image the input zero-padded once (hp × wp per channel: the
// rows and columns the windows read), then per panel of 8 output pixels their im2col rows
// gathered into an A panel (pack_gather8: window origins + tap offsets; a last partial
// panel element by element, its missing pixels 0), the GEMM into Cᵀ, Cᵀ transposed into y.
static_assert(kPackMr == 8, "pack_gather8 fills 8-row A panels");

void conv_im2col_rows(const ConvGeom& g, const float* x, const float* wb, const float* bias, float lo, float hi,
                      float* y, int num_threads, Isa isa, const Kernels& kr, const PostOp* post) {
  const int64_t hw = g.oh * g.ow, m = g.m, kk = g.c * g.kh * g.kw;
  const int64_t hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1, wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int64_t plane = hp * wp;
  const int64_t panels = ceil_div(hw, kPackMr);
  thread_local std::vector<float> xp_buf, at_buf, ct_buf;
  thread_local std::vector<int64_t> taps;
  thread_local std::vector<int32_t> base;
  xp_buf.assign(static_cast<size_t>(g.c * plane), 0.0f);
  if (static_cast<int64_t>(at_buf.size()) < panels * kPackMr * kk)
    at_buf.resize(static_cast<size_t>(panels * kPackMr * kk));
  if (static_cast<int64_t>(ct_buf.size()) < hw * m) ct_buf.resize(static_cast<size_t>(hw * m));
  taps.resize(static_cast<size_t>(kk));
  base.resize(static_cast<size_t>(panels * kPackMr));
  for (int64_t c = 0, k = 0; c < g.c; ++c)
    for (int64_t ky = 0; ky < g.kh; ++ky)
      for (int64_t kx = 0; kx < g.kw; ++kx, ++k) taps[static_cast<size_t>(k)] = c * plane + ky * g.dh * wp + kx * g.dw;
  for (int64_t i = 0; i < panels * kPackMr; ++i) {
    base[static_cast<size_t>(i)] = i < hw ? static_cast<int32_t>((i / g.ow) * g.sh * wp + (i % g.ow) * g.sw) : 0;
  }
  float* xp = xp_buf.data();
  float* at = at_buf.data();
  float* ct = ct_buf.data();
  const int64_t rows_in = std::min(g.h, hp - g.pt), cols_in = std::min(g.w, wp - g.pl);
  for (int64_t img = 0; img < g.n; ++img) {
    const float* xi = x + img * g.c * g.h * g.w;
    for (int64_t c = 0; c < g.c && cols_in > 0; ++c) {
      for (int64_t iy = 0; iy < rows_in; ++iy) {
        std::memcpy(xp + c * plane + (iy + g.pt) * wp + g.pl, xi + (c * g.h + iy) * g.w,
                    static_cast<size_t>(cols_in) * sizeof(float));
      }
    }
    for (int64_t p = 0; p < panels; ++p) {
      float* dst = at + p * kk * kPackMr;
      if ((p + 1) * kPackMr <= hw) {
        kr.pack_gather8(xp, base.data() + p * kPackMr, taps.data(), kk, dst);
        continue;
      }
      for (int64_t k = 0; k < kk; ++k) {
        for (int64_t r = 0; r < kPackMr; ++r) {
          const int64_t i = p * kPackMr + r;
          dst[k * kPackMr + r] = i < hw ? xp[taps[static_cast<size_t>(k)] + base[static_cast<size_t>(i)]] : 0.0f;
        }
      }
    }
    rows_product(hw, m, kk, at, wb, bias, lo, hi, post, ct, y + img * m * hw, num_threads, isa);
  }
}

}  // namespace

void conv(const ConvGeom& g, ConvPath path, const float* x, const float* w, const float* bias, float lo, float hi,
          float* y, int num_threads, Isa isa, const PostOp* post) {
  const Kernels& kr = kernels_for(isa);
  if (post && post->kind == PostKind::kNone) post = nullptr;
  if (path == ConvPath::kDepthwise) {
    conv_depthwise(g, x, w, bias, lo, hi, y, num_threads, kr, post);
    return;
  }
  if (path == ConvPath::kPointwiseRows) {
    conv_pointwise_rows(g, x, w, bias, lo, hi, y, num_threads, isa, post);
    return;
  }
  if (path == ConvPath::kIm2colRows) {
    conv_im2col_rows(g, x, w, bias, lo, hi, y, num_threads, isa, kr, post);
    return;
  }
  // A strided 1x1 without pads (ResNet's downsampling shortcuts and stride-2 bottleneck
  // entries): the pointwise product on the subsampled plane, gathered once per image into
  // this thread's own buffer (the phase split would build sh·sw phase planes to use one).
  const bool strided_pointwise = path == ConvPath::kIm2col && unpadded_1x1(g);
  if (path == ConvPath::kIm2col && !strided_pointwise && direct_fits(g, kr)) {
    conv_direct(g, x, w, bias, lo, hi, y, num_threads, kr, post);
    return;
  }
  if (path == ConvPath::kIm2col && !strided_pointwise) {
    conv_phased(g, x, w, bias, lo, hi, y, num_threads, kr, post);
    return;
  }
  // Pointwise: y[n, group] (Mg × HW) = W_group (Mg × Cg) · x[n, group] (Cg × HW).
  const int64_t cg = g.c / g.g, mg = g.m / g.g, hw = g.oh * g.ow;
  float* sub = nullptr;
  if (strided_pointwise) {
    thread_local std::vector<float> subsampled;  // not thread_scratch: the GEMM packs into that
    if (static_cast<int64_t>(subsampled.size()) < g.c * hw) subsampled.resize(static_cast<size_t>(g.c * hw));
    sub = subsampled.data();
  }
  const int64_t packed = packed_a_size(mg, cg);
  // Where the ISA's tile on a row-major A has more rows than on a packed one, the weights
  // are read as a row-major copy (unpacked_rows), as conv_phased does: M·K floats moved
  // against M·K·HW multiply-adds, so only on planes of at least kPointwiseRowMajorPixels
  // pixels (a 1x1 head on a 1x1 map would move as many floats as it multiplies). Each
  // element keeps its chain (k increasing from +0, then the epilogue): the same bytes.
  thread_local std::vector<float> a_rows_buf;
  const bool rows = kr.mr_rows > kr.mr && hw >= kPointwiseRowMajorPixels;
  const float* a_rows = rows ? unpacked_rows(w, g.g, mg, cg, packed, a_rows_buf) : nullptr;
  for (int64_t img = 0; img < g.n; ++img) {
    const float* xi = x + img * g.c * g.h * g.w;
    if (sub != nullptr) {
      for (int64_t c = 0; c < g.c; ++c) {
        for (int64_t oy = 0; oy < g.oh; ++oy) {
          const float* src = xi + (c * g.h + oy * g.sh) * g.w;
          float* dst = sub + c * hw + oy * g.ow;
          for (int64_t ox = 0; ox < g.ow; ++ox) dst[ox] = src[ox * g.sw];
        }
      }
      xi = sub;
    }
    for (int64_t grp = 0; grp < g.g; ++grp) {
      Epilogue ep;
      ep.bias_row = bias ? bias + grp * mg : nullptr;
      ep.lo = lo;
      ep.hi = hi;
      ep.post = post;
      const MatA a = a_rows ? MatA{a_rows + grp * mg * cg, false, cg} : MatA{w + grp * packed, true, 0};
      gemm(mg, hw, cg, a, MatB{xi + grp * cg * hw, false, hw}, y + (img * g.m + grp * mg) * hw, hw, ep, num_threads,
           isa);
    }
  }
}

void col2im(const float* cols, int64_t planes, int64_t m, int64_t kh, int64_t kw, int64_t h, int64_t w, int64_t sh,
            int64_t sw, int64_t dh, int64_t dw, int64_t bt, int64_t bl, int64_t oh, int64_t ow, const float* bias,
            float lo, float hi, float* y, int num_threads) {
  if (planes <= 0 || oh <= 0 || ow <= 0) return;
  const int64_t hw = h * w;
  // Per kernel column kx, the output columns it reaches form an arithmetic progression:
  // ox with (ox + bl − kx·dw) = ix·sw, 0 ≤ ix < w. ox0[kx]: the first, ix0[kx] its ix, n[kx] how many.
  std::vector<int64_t> ox0(static_cast<size_t>(kw)), ix0(static_cast<size_t>(kw)), cnt(static_cast<size_t>(kw));
  for (int64_t kx = 0; kx < kw; ++kx) {
    const int64_t off = bl - kx * dw;  // canvas column of ox is ox + bl; ix·sw = ox + off
    // smallest ox ≥ 0 with (ox + off) ≡ 0 (mod sw) and ox + off ≥ 0
    int64_t first = off >= 0 ? (sw - off % sw) % sw : -off;
    int64_t ix = (first + off) / sw;
    int64_t last_ix = std::min(w - 1, (ow - 1 + off) >= 0 ? (ow - 1 + off) / sw : -1);
    ox0[kx] = first;
    ix0[kx] = ix;
    cnt[kx] = first < ow && ix <= last_ix ? last_ix - ix + 1 : 0;
  }
  const int threads = planes * oh * ow * kh * kw < kMinParallelMacs ? 1 : num_threads;
  auto body = [&](int64_t p, int) {
    const float* src = cols + p * kh * kw * hw;
    float* out = y + p * oh * ow;
    const float b = bias ? bias[p % m] : 0.0f;
    for (int64_t oy = 0; oy < oh; ++oy) {
      float* row = out + oy * ow;
      std::fill(row, row + ow, 0.0f);
      const int64_t cy = oy + bt;
      for (int64_t ky = 0; ky < kh; ++ky) {
        const int64_t ty = cy - ky * dh;
        if (ty < 0 || ty % sh) continue;
        const int64_t iy = ty / sh;
        if (iy >= h) continue;
        for (int64_t kx = 0; kx < kw; ++kx) {
          const float* s = src + (ky * kw + kx) * hw + iy * w + ix0[kx];
          float* d = row + ox0[kx];
          const int64_t n = cnt[kx];
          if (sw == 1) {
            for (int64_t i = 0; i < n; ++i) d[i] = d[i] + s[i];
          } else {
            for (int64_t i = 0; i < n; ++i) d[i * sw] = d[i * sw] + s[i];
          }
        }
      }
      for (int64_t ox = 0; ox < ow; ++ox) {
        float v = row[ox] + b;
        v = v < lo ? lo : v;
        v = v > hi ? hi : v;
        row[ox] = v;
      }
    }
  };
  if (threads <= 1 || planes == 1) {
    for (int64_t p = 0; p < planes; ++p) body(p, 0);
  } else {
    qgemm::parallel_for(threads, planes, body);
  }
}

}  // namespace sgemm
}  // namespace quanta
