// A16W8 driver: activation panels (with the eq. (A2) offset), the plane loop, the exact
// eq. (A3) zero-point terms and the eq. (A4) requantization; the portable micro-kernel.
#include "a16w8/a16w8.h"

#include <algorithm>

#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "a16w8/rows.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace a16w8 {

void ukernel_portable(const int16_t* a, int64_t lda, int mr, int64_t k2, const int16_t* b, int64_t* c) {
  for (int r = 0; r < mr; ++r) {
    for (int j = 0; j < kNR; ++j) c[r * kNR + j] = 0;
  }
  for (int64_t p0 = 0; p0 < k2; p0 += kKcPairs) {
    const int64_t p1 = p0 + kKcPairs < k2 ? p0 + kKcPairs : k2;
    for (int r = 0; r < mr; ++r) {
      int32_t acc[kNR] = {0};
      for (int64_t p = p0; p < p1; ++p) {
        const int32_t a0 = a[r * lda + 2 * p], a1 = a[r * lda + 2 * p + 1];
        for (int blk = 0; blk < 2; ++blk) {
          const int16_t* bp = b + blk * k2 * 32 + p * 32;
          for (int j = 0; j < 16; ++j) acc[blk * 16 + j] += a0 * bp[2 * j] + a1 * bp[2 * j + 1];
        }
      }
      for (int j = 0; j < kNR; ++j) c[r * kNR + j] += acc[j];
    }
  }
}

const RowKernels kRowsPortable = {dw_row_generic, dw_pairs_generic, requant_row_generic};

MicroKernel select_ukernel(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return ukernel_avx512vnni;
    case Isa::kAvx2: return ukernel_avx2;
    default: return ukernel_portable;
  }
}

namespace {

inline int64_t load_elem(const void* p, Elem e, int64_t i) {
  switch (e) {
    case Elem::kU8: return static_cast<const uint8_t*>(p)[i];
    case Elem::kI8: return static_cast<const int8_t*>(p)[i];
    case Elem::kU16: return static_cast<const uint16_t*>(p)[i];
    default: return static_cast<const int16_t*>(p)[i];
  }
}

inline int64_t elem_offset(Elem e) { return e == Elem::kU16 ? 32768 : 0; }

// One GEMM over `rows` output rows: fill(r0, nrows, panel, lda, rowsum) writes the A'
// panel (padded K with 0) and the row sums Σ_k A'; out(row, col) is the output index.
template <typename Fill, typename OutIndex>
void gemm_rows(int64_t r_begin, int64_t r_end, const Packed& w, const Epilogue& ep, int64_t col0, Fill& fill,
               OutIndex& out_index, void* y, MicroKernel uk) {
  const int64_t k2 = (w.k + 1) / 2, lda = 2 * k2;
  const int64_t nb32 = (w.n + kNR - 1) / kNR;
  const int64_t plane_stride = nb32 * 2 * k2 * 32;
  // Rows are taken kRowPanels panels (64 rows) at a time, and each 32-column block of the
  // weight (2·K int16 values per column pair: 64 KB at K = 1024) is used for all of them
  // while it is in L2: streaming the whole packed weight once per 4 rows made the kernel
  // memory-bound (a 2 MB weight at K = N = 1024).
  constexpr int kRowPanels = 16;
  std::vector<int16_t> panel(static_cast<size_t>(kRowPanels * kMR * lda));
  int64_t rowsum[kRowPanels * kMR];
  int64_t tile[kMR * kNR], acc[kMR * kNR];
  for (int64_t c0 = r_begin; c0 < r_end; c0 += kRowPanels * kMR) {
    const int64_t c1 = c0 + kRowPanels * kMR < r_end ? c0 + kRowPanels * kMR : r_end;
    int np = 0;
    for (int64_t r0 = c0; r0 < c1; r0 += kMR, ++np) {
      const int mr = static_cast<int>(c1 - r0 < kMR ? c1 - r0 : kMR);
      fill(r0, mr, panel.data() + np * kMR * lda, lda, rowsum + np * kMR);
    }
    for (int64_t nb = 0; nb < nb32; ++nb) {
      const int64_t ncols = w.n - nb * kNR < kNR ? w.n - nb * kNR : kNR;
      for (int ip = 0; ip < np; ++ip) {
        const int64_t r0 = c0 + ip * kMR;
        const int mr = static_cast<int>(c1 - r0 < kMR ? c1 - r0 : kMR);
        const int16_t* pa = panel.data() + ip * kMR * lda;
        const int64_t* rs = rowsum + ip * kMR;
        for (int i = 0; i < kMR * kNR; ++i) acc[i] = 0;
        for (int p = 0; p < w.planes; ++p) {
          // plane 0 is the high byte of a split weight (eq. (A2)): scaled by 256
          const int64_t scale = (w.planes == 2 && p == 0) ? 256 : 1;
          uk(pa, lda, mr, k2, w.data + p * plane_stride + nb * 2 * k2 * 32, tile);
          for (int r = 0; r < mr; ++r)
            for (int j = 0; j < kNR; ++j) acc[r * kNR + j] += scale * tile[r * kNR + j];
        }
        for (int r = 0; r < mr; ++r) {
          for (int64_t j = 0; j < ncols; ++j) {
            const int64_t n = nb * kNR + j, cn = col0 + n;
            // eq. (A3): S + dw·RA + da·CW' + K·da·dw + bias
            int64_t v = acc[r * kNR + j] + ep.dw[cn] * rs[r] + ep.da * ep.cw[cn] + w.k * ep.da * ep.dw[cn];
            if (ep.bias) v += ep.bias[cn];
            store_any(y, ep.out, out_index(r0 + r, n), v, ep.mult[cn], ep.zy);
          }
        }
      }
    }
  }
}

}  // namespace

void matmul(const void* a, Elem a_elem, int64_t m, const Packed& w, const Epilogue& ep, void* y, int threads) {
  const MicroKernel uk = select_ukernel(select_kernel("a16w8", "s16s16->s64")->isa);
  const int64_t oa = elem_offset(a_elem), k = w.k, n = w.n;
  auto fill = [&](int64_t r0, int mr, int16_t* panel, int64_t lda, int64_t* rowsum) {
    for (int r = 0; r < mr; ++r) {
      int64_t s = 0;
      const int64_t base = (r0 + r) * k;
      int16_t* dst = panel + r * lda;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t v = load_elem(a, a_elem, base + i) - oa;
        dst[i] = static_cast<int16_t>(v);
        s += v;
      }
      for (int64_t i = k; i < lda; ++i) dst[i] = 0;
      rowsum[r] = s;
    }
  };
  auto out_index = [n](int64_t row, int64_t col) { return row * n + col; };
  const int64_t grain = 8 * kMR;
  qgemm::parallel_ranges(threads, m, grain,
                         [&](int64_t b, int64_t e) { gemm_rows(b, e, w, ep, 0, fill, out_index, y, uk); });
}

namespace {

const RowKernels& row_kernels(Isa isa) {
  return isa == Isa::kAvx512Vnni ? kRowsAvx512Vnni : isa == Isa::kAvx2 ? kRowsAvx2 : kRowsPortable;
}

// dst[t] = src[t·step] − off for t in [0, n) where 0 ≤ ix0 + t·step < w (ix0 the input
// column of t = 0), `fill` elsewhere: three plain loops (the middle one vectorizes for
// step 1) instead of a bounds test per element.
template <typename T, typename D>
inline void gather_row(const T* row, int64_t ix0, int64_t step, int64_t w, int64_t n, int64_t off, D fill, D* dst) {
  int64_t t0 = ix0 >= 0 ? 0 : (-ix0 + step - 1) / step;     // first t with ix ≥ 0
  int64_t t1 = ix0 >= w ? 0 : (w - ix0 + step - 1) / step;  // first t with ix ≥ w
  t0 = t0 < n ? t0 : n;
  t1 = t1 < n ? t1 : n;
  t1 = t1 > t0 ? t1 : t0;
  for (int64_t t = 0; t < t0; ++t) dst[t] = fill;
  if (step == 1) {
    const T* src = row + (ix0 + t0);  // in range: t0 is the first valid column
    for (int64_t t = 0; t < t1 - t0; ++t) dst[t0 + t] = static_cast<D>(static_cast<int64_t>(src[t]) - off);
  } else {
    for (int64_t t = t0; t < t1; ++t) dst[t] = static_cast<D>(static_cast<int64_t>(row[ix0 + t * step]) - off);
  }
  for (int64_t t = t1; t < n; ++t) dst[t] = fill;
}

// The im2col B panel of output pixels [p0, p0 + np) (np ≤ 32) of one image and group, in
// the packed layout (a16w8.h), and rx[j] = Σ_k X'[k, p0 + j]; columns ≥ np and k ≥ K are
// 0. The pixels fall into runs along output rows; each (k, run) is one gather_row.
template <typename T>
void fill_panel(const T* xg, int64_t oa, int16_t pad, const ConvGeom& g, int64_t cg, int64_t p0, int np, int64_t k2,
                int16_t* panel, int64_t* rx) {
  // A whole panel of a 1×1 stride-1 convolution without pads: input channel k is the
  // contiguous run x[k·hw + p0 ..] (no runs, no bounds: fixed-length loops that vectorize)
  if (np == kNR && g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.oh == g.h &&
      g.ow == g.w) {
    const int64_t hw = g.h * g.w;
    const int32_t off = static_cast<int32_t>(oa);
    int64_t sums[kNR] = {0};
    for (int64_t p = 0; p < k2; ++p) {
      int16_t c0[kNR], c1[kNR];
      const T* a = xg + 2 * p * hw + p0;
      for (int j = 0; j < kNR; ++j) c0[j] = static_cast<int16_t>(static_cast<int32_t>(a[j]) - off);
      if (2 * p + 1 < cg) {
        const T* b = a + hw;
        for (int j = 0; j < kNR; ++j) c1[j] = static_cast<int16_t>(static_cast<int32_t>(b[j]) - off);
      } else {
        for (int j = 0; j < kNR; ++j) c1[j] = 0;
      }
      for (int blk = 0; blk < 2; ++blk) {
        int16_t* dst = panel + blk * k2 * 32 + p * 32;
        for (int j = 0; j < 16; ++j) {
          dst[2 * j] = c0[blk * 16 + j];
          dst[2 * j + 1] = c1[blk * 16 + j];
        }
      }
      for (int j = 0; j < kNR; ++j) sums[j] += static_cast<int64_t>(c0[j]) + c1[j];
    }
    for (int j = 0; j < kNR; ++j) rx[j] = sums[j];
    return;
  }
  struct Run {
    int j0, n;
    int64_t iy0, ix0;
  };
  Run runs[kNR];
  int nruns = 0;
  for (int j = 0; j < np;) {
    const int64_t pix = p0 + j, oy = pix / g.ow, ox = pix % g.ow;
    const int n = static_cast<int>(g.ow - ox < np - j ? g.ow - ox : np - j);
    runs[nruns++] = Run{j, n, oy * g.sh - g.pt, ox * g.sw - g.pl};
    j += n;
  }
  for (int j = 0; j < kNR; ++j) rx[j] = 0;
  const int64_t khw = g.kh * g.kw, hw = g.h * g.w, kk = cg * khw;
  int16_t col[2][kNR];
  for (int64_t p = 0; p < k2; ++p) {
    for (int t = 0; t < 2; ++t) {
      const int64_t k = 2 * p + t;
      int16_t* c = col[t];
      for (int j = np; j < kNR; ++j) c[j] = 0;
      if (k >= kk) {
        for (int j = 0; j < np; ++j) c[j] = 0;
        continue;
      }
      const int64_t ch = k / khw, ky = (k % khw) / g.kw, kx = k % g.kw;
      for (int r = 0; r < nruns; ++r) {
        const Run& run = runs[r];
        const int64_t iy = run.iy0 + ky * g.dh;
        if (iy < 0 || iy >= g.h) {
          for (int j = 0; j < run.n; ++j) c[run.j0 + j] = pad;
        } else {
          gather_row(xg + ch * hw + iy * g.w, run.ix0 + kx * g.dw, g.sw, g.w, run.n, oa, pad, c + run.j0);
        }
      }
    }
    for (int blk = 0; blk < 2; ++blk) {
      int16_t* dst = panel + blk * k2 * 32 + p * 32;
      for (int j = 0; j < 16; ++j) {
        dst[2 * j] = col[0][blk * 16 + j];
        dst[2 * j + 1] = col[1][blk * 16 + j];
      }
    }
    for (int j = 0; j < kNR; ++j) rx[j] += col[0][j] + col[1][j];
  }
}

// The direct convolution (a16w8.h DirectStrip, AVX2): false when it does not apply (the
// caller then runs the GEMM). Its conditions: one weight plane, 16-bit input, and
// per output channel |dw| ≤ 32767 − 255 and the int32 bound of a16w8.h.
bool conv2d_direct(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const Packed* w, const Epilogue& ep,
                   void* y, int threads) {
  if ((x_elem != Elem::kU16 && x_elem != Elem::kI16) || w[0].planes != 1) return false;
  if (g.batch <= 0 || g.oh <= 0 || g.ow <= 0) return false;  // no output: the GEMM driver returns at once
  const int64_t cg = g.c / g.group, mg = g.m / g.group, k = w[0].k, lda = 2 * ((k + 1) / 2);
  if (k != cg * g.kh * g.kw || k <= 0 || mg <= 0) return false;
  constexpr int64_t kInt32Max = (int64_t{1} << 31) - 1;
  std::vector<int32_t> c0(static_cast<size_t>(g.m));
  for (int64_t n = 0; n < g.m; ++n) {
    const int64_t dw = ep.dw[n];
    if (dw < -(32767 - 255) || dw > 32767 - 255) return false;
    // eq. (A3)'s constant; |da| ≤ 65535, |cw| ≤ 255·K: no int64 overflow for K < 2^32
    const int64_t c = ep.da * ep.cw[n] + k * ep.da * dw + (ep.bias ? ep.bias[n] : 0);
    const int64_t ac = c < 0 ? -c : c, adw = dw < 0 ? -dw : dw;
    if (ac > kInt32Max) return false;
    if (k > kInt32Max / 32768 / (255 + adw) || 32768 * k * (255 + adw) > kInt32Max - ac) {
      // the scanned Σ_k |W''[n, k]| (a16w8.h): most trained weights are far below 255
      const int16_t* row = w[n / mg].data + (n % mg) * lda;
      int64_t a = 0;
      for (int64_t i = 0; i < k; ++i) {
        const int64_t v = row[i] + dw;
        a += v < 0 ? -v : v;
      }
      if (a > (kInt32Max - ac) / 32768) return false;
    }
    c0[static_cast<size_t>(n)] = static_cast<int32_t>(c);
  }
  // the input as read: x itself when every tap of every output lies inside it and the
  // columns step by 1, else a copy padded with zx (the real value 0) to the extent the
  // outputs read, each row in sw column phases (column c at phase c mod sw, index c / sw:
  // a16w8.h), so that an output row's tap reads 16 consecutive values at any stride
  const int64_t hs_need = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  const int64_t ws_need = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const bool inside = g.sw == 1 && g.pt == 0 && g.pl == 0 && hs_need <= g.h && ws_need <= g.w;
  const int64_t wr = inside ? g.w : (ws_need + g.sw - 1) / g.sw;             // one phase's columns
  const int64_t hs = inside ? g.h : hs_need, rs = inside ? g.w : g.sw * wr;  // rows, row size
  std::vector<int16_t> padded;
  const int16_t* src = static_cast<const int16_t*>(x);  // uint16 codes read as int16 (the kernel flips the sign bit)
  if (!inside) {
    padded.resize(static_cast<size_t>(g.batch * g.c * hs * rs));
    const int16_t zpad = static_cast<int16_t>(static_cast<uint16_t>(zx));  // zx's 16 bits in either type
    qgemm::parallel_ranges(threads, g.batch * g.c, 1, [&](int64_t p0, int64_t p1) {
      for (int64_t p = p0; p < p1; ++p) {
        const int16_t* xs = src + p * g.h * g.w;
        int16_t* dst = padded.data() + p * hs * rs;
        for (int64_t iy = 0; iy < hs; ++iy) {
          const int64_t sy = iy - g.pt;
          int16_t* d = dst + iy * rs;
          if (sy < 0 || sy >= g.h) {
            std::fill(d, d + rs, zpad);
            continue;
          }
          // gather_row: phase r's column i is padded column r + sw·i, input column r + sw·i − pl
          for (int64_t r = 0; r < g.sw; ++r) gather_row(xs + sy * g.w, r - g.pl, g.sw, g.w, wr, 0, zpad, d + r * wr);
        }
      }
    });
    src = padded.data();
  }
  std::vector<int64_t> off(static_cast<size_t>(k)), tail_off(static_cast<size_t>(k));
  for (int64_t kk = 0; kk < k; ++kk) {
    const int64_t ch = kk / (g.kh * g.kw), ky = (kk / g.kw) % g.kh, kx = kk % g.kw;
    const int64_t col = kx * g.dw;  // the tap's padded column for output column 0
    off[static_cast<size_t>(kk)] = ch * hs * rs + ky * g.dh * rs + (col % g.sw) * wr + col / g.sw;
    tail_off[static_cast<size_t>(kk)] = 16 * kk;
  }
  // strips: the flat plane in chunks (1×1 reading x itself with ow = w: output pixel p reads
  // x[p]), else output rows in chunks; a chunk's K × pixels of input stay in L1 where they can
  const int64_t P = g.oh * g.ow;
  const bool flat = inside && g.kh == 1 && g.kw == 1 && g.sh == 1 && g.ow == g.w;
  const int64_t budget = std::max<int64_t>(16, (16384 / (2 * k)) / 16 * 16);  // pixels per chunk
  const int64_t per_chunk = flat ? std::min<int64_t>(budget, 1024) : std::max<int64_t>(1, budget / g.ow);
  const int64_t chunks = ((flat ? P : g.oh) + per_chunk - 1) / per_chunk;
  const int64_t nblocks = (mg + kDirectMR - 1) / kDirectMR;
  const int64_t px_jobs = g.batch * g.group * chunks;
  // too few pixel chunks for the threads: the channel blocks split too (each output is
  // computed the same way whichever job holds it)
  const int64_t cchunks =
      threads > 1 && px_jobs < 4 * threads ? std::min(nblocks, (4 * threads + px_jobs - 1) / px_jobs) : 1;
  const int nthreads = threads < 1 ? 1 : threads;
  std::vector<int16_t> tails(static_cast<size_t>(nthreads * lda * 16));
  const size_t ysize = ep.out == Elem::kU8 || ep.out == Elem::kI8 ? 1 : 2;
  auto body = [&](int64_t job, int thread) {
    const int64_t cc = job % cchunks, pj = job / cchunks;
    const int64_t chunk = pj % chunks, ig = pj / chunks, grp = ig % g.group, img = ig / g.group;
    DirectStrip s;
    s.off = off.data();
    s.k = k;
    s.u16 = x_elem == Elem::kU16;
    s.w = w[grp].data;
    s.lda = lda;
    s.dw = ep.dw + grp * mg;
    s.c0 = c0.data() + grp * mg;
    s.mult = ep.mult + grp * mg;
    s.zy = ep.zy;
    s.out = ep.out;
    s.y_stride = P;
    s.mg = mg;
    s.nblocks = nblocks;
    s.b0 = cc * nblocks / cchunks;
    s.b1 = (cc + 1) * nblocks / cchunks;
    s.tail = tails.data() + thread * lda * 16;
    s.tail_off = tail_off.data();
    const int16_t* xg = src + (img * g.c + grp * cg) * hs * rs;
    char* yg = static_cast<char*>(y) + static_cast<size_t>((img * g.m + grp * mg) * P) * ysize;
    const int64_t u0 = chunk * per_chunk, u1 = std::min((flat ? P : g.oh), u0 + per_chunk);
    if (flat) {
      s.x = xg + u0;
      s.y = yg + static_cast<size_t>(u0) * ysize;
      s.len = u1 - u0;
      direct_strip_avx2(s);
      return;
    }
    for (int64_t oy = u0; oy < u1; ++oy) {
      s.x = xg + oy * g.sh * rs;
      s.y = yg + static_cast<size_t>(oy * g.ow) * ysize;
      s.len = g.ow;
      direct_strip_avx2(s);
    }
  };
  qgemm::parallel_for(threads, px_jobs * cchunks, body);
  return true;
}

}  // namespace

void conv2d(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const Packed* w, const Epilogue& ep, void* y,
            int threads) {
  const Isa isa = select_kernel("a16w8", "s16s16->s64")->isa;
  if (isa == Isa::kAvx2 && conv2d_direct(x, x_elem, zx, g, w, ep, y, threads)) return;
  const MicroKernel uk = select_ukernel(isa);
  const RowKernels& rk = row_kernels(isa);
  const int64_t oa = elem_offset(x_elem);
  const int64_t cg = g.c / g.group, mg = g.m / g.group, P = g.oh * g.ow;
  const int16_t pad = static_cast<int16_t>(zx - oa);  // the real value 0 (eq. (A2))
  const int64_t k = w[0].k, k2 = (k + 1) / 2, lda = 2 * k2;
  const int planes = w[0].planes;
  const int64_t pixel_blocks = (P + kNR - 1) / kNR;
  const int64_t jobs = g.batch * g.group * pixel_blocks;
  if (jobs <= 0 || mg <= 0) return;
  // one panel per thread, sized once per call: fill_panel writes every entry, and a
  // per-job allocation (with its zero fill) cost as much as filling the panel
  const int nthreads = threads < 1 ? 1 : threads;
  std::vector<std::vector<int16_t>> panels(static_cast<size_t>(nthreads));
  auto body = [&](int64_t job, int thread) {
    const int64_t img = job / (g.group * pixel_blocks), rest = job % (g.group * pixel_blocks);
    const int64_t grp = rest / pixel_blocks, p0 = (rest % pixel_blocks) * kNR;
    const int np = static_cast<int>(P - p0 < kNR ? P - p0 : kNR);
    const int64_t x_base = (img * g.c + grp * cg) * g.h * g.w;
    std::vector<int16_t>& panel = panels[static_cast<size_t>(thread)];
    panel.resize(static_cast<size_t>(2 * k2 * 32));
    int64_t rx[kNR], tile[2][kMR * kNR];
    switch (x_elem) {
      case Elem::kU8:
        fill_panel(static_cast<const uint8_t*>(x) + x_base, oa, pad, g, cg, p0, np, k2, panel.data(), rx);
        break;
      case Elem::kI8:
        fill_panel(static_cast<const int8_t*>(x) + x_base, oa, pad, g, cg, p0, np, k2, panel.data(), rx);
        break;
      case Elem::kU16:
        fill_panel(static_cast<const uint16_t*>(x) + x_base, oa, pad, g, cg, p0, np, k2, panel.data(), rx);
        break;
      default: fill_panel(static_cast<const int16_t*>(x) + x_base, oa, pad, g, cg, p0, np, k2, panel.data(), rx); break;
    }
    const Packed& wg = w[grp];
    const int64_t y_base = (img * g.m + grp * mg) * P + p0;
    for (int64_t r0 = 0; r0 < mg; r0 += kMR) {
      const int mr = static_cast<int>(mg - r0 < kMR ? mg - r0 : kMR);
      for (int p = 0; p < planes; ++p) uk(wg.data + (p * mg + r0) * lda, lda, mr, k2, panel.data(), tile[p]);
      for (int r = 0; r < mr; ++r) {
        const int64_t n = grp * mg + r0 + r;
        // eq. (A3) with X' in the column role: S + dw·RX + da·CW' + K·da·dw + bias
        int64_t c0 = ep.da * ep.cw[n] + k * ep.da * ep.dw[n];
        if (ep.bias) c0 += ep.bias[n];
        const int64_t* hi = planes == 2 ? tile[0] + r * kNR : nullptr;
        const int64_t* lo = tile[planes - 1] + r * kNR;
        rk.requant(hi, lo, rx, ep.dw[n], c0, ep.mult[n], ep.zy, ep.out, y, y_base + (r0 + r) * P, np);
      }
    }
  };
  qgemm::parallel_for(threads, jobs, body);
}

namespace {

// One channel's input minus `off` (`pad` in the padding) in `sw` column phases of
// `wr` columns each (a16w8.h): the float64 phases (off = zx, pad 0).
template <typename T, typename D>
void fill_phases(const T* xc, int64_t off, D pad, const ConvGeom& g, int64_t hp, int64_t wr, D* ph) {
  for (int64_t r = 0; r < g.sw; ++r) {
    for (int64_t iy = 0; iy < hp; ++iy) {
      const int64_t sy = iy - g.pt;
      D* dst = ph + (r * hp + iy) * wr;
      if (sy < 0 || sy >= g.h) {
        std::fill(dst, dst + wr, pad);
      } else {
        gather_row(xc + sy * g.w, r - g.pl, g.sw, g.w, wr, off, pad, dst);
      }
    }
  }
}

}  // namespace

void conv2d_depthwise(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const int32_t* wd, const Epilogue& ep,
                      void* y, int threads) {
  const RowKernels& rk = row_kernels(select_kernel("a16w8", "s16s16->s64")->isa);
  const int64_t P = g.oh * g.ow, khw = g.kh * g.kw;
  if (P <= 0 || g.batch * g.m <= 0) return;
  // the padded plane's extent that the output reads, and the width of one phase
  const int64_t hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  const int64_t wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int64_t wr = (wp + g.sw - 1) / g.sw;
  // int16 pairs when the weights fit int16 and Σ|wd| · 32768 fits int32 (a16w8.h)
  bool pairs = true;
  for (int64_t ch = 0; ch < g.m && pairs; ++ch) {
    int64_t s = 0;
    for (int64_t t = 0; t < khw; ++t) {
      const int64_t v = wd[ch * khw + t];
      pairs = pairs && v >= -32767 && v <= 32767;
      s += v < 0 ? -v : v;
    }
    pairs = pairs && s * 32768 <= (int64_t{1} << 31) - 1;
  }
  // The pair slots of one output row: per kernel row, the taps in each phase by their
  // column index there; consecutive indices go in one slot, a lone tap with weight 0 as
  // its second half (reading the column after it: the phase rows have one more).
  struct Slot {
    int64_t ky, phase, idx, t0, t1;  // t1 < 0: no second tap
  };
  std::vector<Slot> slots;
  if (pairs) {
    for (int64_t ky = 0; ky < g.kh; ++ky) {
      for (int64_t r = 0; r < g.sw; ++r) {
        std::vector<std::pair<int64_t, int64_t>> taps;  // (index in the phase, tap)
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t off = kx * g.dw;
          if (off % g.sw == r) taps.emplace_back(off / g.sw, ky * g.kw + kx);
        }
        std::sort(taps.begin(), taps.end());
        for (size_t a = 0; a < taps.size();) {
          if (a + 1 < taps.size() && taps[a + 1].first == taps[a].first + 1) {
            slots.push_back({ky, r, taps[a].first, taps[a].second, taps[a + 1].second});
            a += 2;
          } else {
            slots.push_back({ky, r, taps[a].first, taps[a].second, -1});
            a += 1;
          }
        }
      }
    }
  }
  const int64_t ns = static_cast<int64_t>(slots.size());
  const int64_t oa = elem_offset(x_elem);
  // channels in ranges of 8 (one set of buffers per range; each channel is computed alone,
  // so the split does not change the bytes)
  auto range = [&](int64_t job0, int64_t job1) {
    const size_t phase_size = static_cast<size_t>(g.sw * hp * wr);
    std::vector<double> ph(pairs ? 0 : phase_size), wt(pairs ? 0 : static_cast<size_t>(khw));
    std::vector<const double*> src(pairs ? 0 : static_cast<size_t>(khw));
    // int16 phases with one more column per row, and the pairs of each row's columns
    const int64_t wr1 = wr + 1;
    std::vector<int16_t> ph16(pairs ? static_cast<size_t>(g.sw * hp * wr1) : 0);
    std::vector<int32_t> pr(pairs ? phase_size : 0), wpair(static_cast<size_t>(ns));
    std::vector<const int32_t*> srcp(static_cast<size_t>(ns));
    std::vector<int64_t> acc(static_cast<size_t>(P));
    const int16_t pad16 = static_cast<int16_t>(zx - oa);
    // the padded rows above and below the image: x' = zx − ox everywhere, for every channel
    const int64_t iy_in0 = std::min(g.pt, hp), iy_in1 = std::max(iy_in0, std::min(hp, g.pt + g.h));
    if (pairs) {
      const uint32_t pad_pair =
          static_cast<uint16_t>(pad16) | (static_cast<uint32_t>(static_cast<uint16_t>(pad16)) << 16);
      std::fill(pr.begin(), pr.end(), static_cast<int32_t>(pad_pair));
    }
    for (int64_t job = job0; job < job1; ++job) {
      const int64_t img = job / g.m, ch = job % g.m;
      const int64_t x_base = (img * g.c + ch) * g.h * g.w, y_base = (img * g.m + ch) * P;
      const int32_t* w = wd + ch * khw;
      int64_t bias = ep.bias ? ep.bias[ch] : 0;
      if (pairs) {
        // only the rows inside the image: the padding rows keep the pad pairs written once
        for (int64_t r = 0; r < g.sw; ++r) {
          for (int64_t iy = iy_in0; iy < iy_in1; ++iy) {
            const int64_t row = r * hp + iy, sy = iy - g.pt;
            int16_t* a = ph16.data() + row * wr1;
            const int64_t at = x_base + sy * g.w;
            switch (x_elem) {
              case Elem::kU8:
                gather_row(static_cast<const uint8_t*>(x) + at, r - g.pl, g.sw, g.w, wr1, oa, pad16, a);
                break;
              case Elem::kI8:
                gather_row(static_cast<const int8_t*>(x) + at, r - g.pl, g.sw, g.w, wr1, oa, pad16, a);
                break;
              case Elem::kU16:
                gather_row(static_cast<const uint16_t*>(x) + at, r - g.pl, g.sw, g.w, wr1, oa, pad16, a);
                break;
              default: gather_row(static_cast<const int16_t*>(x) + at, r - g.pl, g.sw, g.w, wr1, oa, pad16, a); break;
            }
            // (x'[c], x'[c + 1]) as one int32, low half first
            int32_t* d = pr.data() + row * wr;
            for (int64_t c = 0; c < wr; ++c)
              d[c] = static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint16_t>(a[c])) |
                                          (static_cast<uint32_t>(static_cast<uint16_t>(a[c + 1])) << 16));
          }
        }
        int64_t wsum = 0;
        for (int64_t t = 0; t < khw; ++t) wsum += w[t];
        bias += (oa - zx) * wsum;  // eq. (A3): x − zx = x' + (ox − zx)
        for (int64_t k = 0; k < ns; ++k) {
          const Slot& sl = slots[static_cast<size_t>(k)];
          const uint32_t lo = static_cast<uint16_t>(static_cast<int16_t>(w[sl.t0]));
          const uint32_t hi = sl.t1 < 0 ? 0u : static_cast<uint16_t>(static_cast<int16_t>(w[sl.t1]));
          wpair[static_cast<size_t>(k)] = static_cast<int32_t>(lo | (hi << 16));
        }
      } else {
        switch (x_elem) {
          case Elem::kU8: fill_phases(static_cast<const uint8_t*>(x) + x_base, zx, 0.0, g, hp, wr, ph.data()); break;
          case Elem::kI8: fill_phases(static_cast<const int8_t*>(x) + x_base, zx, 0.0, g, hp, wr, ph.data()); break;
          case Elem::kU16: fill_phases(static_cast<const uint16_t*>(x) + x_base, zx, 0.0, g, hp, wr, ph.data()); break;
          default: fill_phases(static_cast<const int16_t*>(x) + x_base, zx, 0.0, g, hp, wr, ph.data()); break;
        }
        for (int64_t t = 0; t < khw; ++t) wt[t] = w[t];
      }
      for (int64_t oy = 0; oy < g.oh; ++oy) {
        if (pairs) {
          for (int64_t k = 0; k < ns; ++k) {
            const Slot& sl = slots[static_cast<size_t>(k)];
            srcp[static_cast<size_t>(k)] = pr.data() + (sl.phase * hp + oy * g.sh + sl.ky * g.dh) * wr + sl.idx;
          }
          rk.dw_pairs(srcp.data(), wpair.data(), ns, g.ow, acc.data() + oy * g.ow);
          continue;
        }
        for (int64_t ky = 0; ky < g.kh; ++ky) {
          const int64_t iy = oy * g.sh + ky * g.dh;
          for (int64_t kx = 0; kx < g.kw; ++kx) {
            const int64_t off = kx * g.dw;
            src[ky * g.kw + kx] = ph.data() + ((off % g.sw) * hp + iy) * wr + off / g.sw;
          }
        }
        rk.dw_row(src.data(), wt.data(), khw, g.ow, acc.data() + oy * g.ow);
      }
      rk.requant(nullptr, acc.data(), nullptr, 0, bias, ep.mult[ch], ep.zy, ep.out, y, y_base, P);
    }
  };
  qgemm::parallel_ranges(threads, g.batch * g.m, 8, range);
}

}  // namespace a16w8
}  // namespace quanta
