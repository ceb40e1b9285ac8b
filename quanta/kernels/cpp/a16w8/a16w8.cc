// A16W8 driver: activation panels (with the eq. (A2) offset), the plane loop, the exact
// eq. (A3) zero-point terms and the eq. (A4) requantization; the portable micro-kernel.
#include "a16w8/a16w8.h"

#include <algorithm>

#include <cmath>
#include <cstring>
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

const RowKernels kRowsPortable = {mac_row_generic, requant_row_generic};

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
  qgemm::parallel_ranges(threads, m, grain, [&](int64_t b, int64_t e) {
    gemm_rows(b, e, w, ep, 0, fill, out_index, y, uk);
  });
}

namespace {

const RowKernels& row_kernels(Isa isa) {
  return isa == Isa::kAvx512Vnni ? kRowsAvx512Vnni : isa == Isa::kAvx2 ? kRowsAvx2 : kRowsPortable;
}

// The im2col B panel of output pixels [p0, p0 + np) (np ≤ 32) of one image and group, in
// the packed layout (a16w8.h), and rx[j] = Σ_k X'[k, p0 + j]; columns ≥ np and k ≥ K are 0.
template <typename T>
void fill_panel(const T* xg, int64_t oa, int16_t pad, const ConvGeom& g, int64_t cg, int64_t p0, int np,
                int64_t k2, int16_t* panel, int64_t* rx) {
  int64_t by[kNR], bx[kNR];
  for (int j = 0; j < kNR; ++j) {
    const int64_t pix = p0 + (j < np ? j : 0);
    by[j] = (pix / g.ow) * g.sh - g.pt;
    bx[j] = (pix % g.ow) * g.sw - g.pl;
    rx[j] = 0;
  }
  const int64_t khw = g.kh * g.kw, hw = g.h * g.w;
  const bool dense = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.ow == g.w;
  int16_t col[kNR];
  for (int64_t k = 0; k < 2 * k2; ++k) {
    if (k >= cg * khw || np == 0) {
      for (int j = 0; j < kNR; ++j) col[j] = 0;
    } else if (dense) {  // 1×1, stride 1, no padding: the pixels are the input's, in order
      const T* src = xg + k * hw + p0;
      for (int j = 0; j < np; ++j) col[j] = static_cast<int16_t>(static_cast<int32_t>(src[j]) - oa);
      for (int j = np; j < kNR; ++j) col[j] = 0;
    } else {
      const int64_t ch = k / khw, ky = (k % khw) / g.kw, kx = k % g.kw;
      const T* src = xg + ch * hw;
      for (int j = 0; j < kNR; ++j) {
        const int64_t iy = by[j] + ky * g.dh, ix = bx[j] + kx * g.dw;
        int16_t v = pad;
        if (j >= np) {
          v = 0;
        } else if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) {
          v = static_cast<int16_t>(static_cast<int32_t>(src[iy * g.w + ix]) - oa);
        }
        col[j] = v;
      }
    }
    const int64_t p = k / 2, t = k % 2;
    for (int j = 0; j < kNR; ++j) {
      panel[(j / 16) * k2 * 32 + p * 32 + (j % 16) * 2 + t] = col[j];
      rx[j] += col[j];
    }
  }
}

}  // namespace

void conv2d(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const Packed* w, const Epilogue& ep,
            void* y, int threads) {
  const Isa isa = select_kernel("a16w8", "s16s16->s64")->isa;
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
  auto body = [&](int64_t job, int) {
    const int64_t img = job / (g.group * pixel_blocks), rest = job % (g.group * pixel_blocks);
    const int64_t grp = rest / pixel_blocks, p0 = (rest % pixel_blocks) * kNR;
    const int np = static_cast<int>(P - p0 < kNR ? P - p0 : kNR);
    const int64_t x_base = (img * g.c + grp * cg) * g.h * g.w;
    std::vector<int16_t> panel(static_cast<size_t>(2 * k2 * 32));
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
      default:
        fill_panel(static_cast<const int16_t*>(x) + x_base, oa, pad, g, cg, p0, np, k2, panel.data(), rx);
        break;
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

// One channel's input minus zx (0 in the padding) in `sw` column phases (a16w8.h).
template <typename T>
void fill_phases(const T* xc, int64_t zx, const ConvGeom& g, int64_t hp, int64_t wr, int64_t* ph) {
  for (int64_t r = 0; r < g.sw; ++r) {
    for (int64_t iy = 0; iy < hp; ++iy) {
      const int64_t sy = iy - g.pt;
      int64_t* dst = ph + (r * hp + iy) * wr;
      if (sy < 0 || sy >= g.h) {
        std::fill(dst, dst + wr, int64_t{0});
        continue;
      }
      const T* src = xc + sy * g.w;
      for (int64_t j = 0; j < wr; ++j) {
        const int64_t sx = j * g.sw + r - g.pl;
        dst[j] = (sx >= 0 && sx < g.w) ? static_cast<int64_t>(src[sx]) - zx : 0;
      }
    }
  }
}

}  // namespace

void conv2d_depthwise(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const int32_t* wd,
                      const Epilogue& ep, void* y, int threads) {
  const RowKernels& rk = row_kernels(select_kernel("a16w8", "s16s16->s64")->isa);
  const int64_t P = g.oh * g.ow, khw = g.kh * g.kw;
  if (P <= 0 || g.batch * g.m <= 0) return;
  // the padded plane's extent that the output reads, and the width of one phase
  const int64_t hp = (g.oh - 1) * g.sh + (g.kh - 1) * g.dh + 1;
  const int64_t wp = (g.ow - 1) * g.sw + (g.kw - 1) * g.dw + 1;
  const int64_t wr = (wp + g.sw - 1) / g.sw;
  auto body = [&](int64_t job, int) {
    const int64_t img = job / g.m, ch = job % g.m;
    const int64_t x_base = (img * g.c + ch) * g.h * g.w, y_base = (img * g.m + ch) * P;
    const int32_t* wc = wd + ch * khw;
    std::vector<int64_t> ph(static_cast<size_t>(g.sw * hp * wr)), acc(static_cast<size_t>(g.ow));
    switch (x_elem) {
      case Elem::kU8: fill_phases(static_cast<const uint8_t*>(x) + x_base, zx, g, hp, wr, ph.data()); break;
      case Elem::kI8: fill_phases(static_cast<const int8_t*>(x) + x_base, zx, g, hp, wr, ph.data()); break;
      case Elem::kU16: fill_phases(static_cast<const uint16_t*>(x) + x_base, zx, g, hp, wr, ph.data()); break;
      default: fill_phases(static_cast<const int16_t*>(x) + x_base, zx, g, hp, wr, ph.data()); break;
    }
    const int64_t bias = ep.bias ? ep.bias[ch] : 0;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      std::fill(acc.begin(), acc.end(), int64_t{0});
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = oy * g.sh + ky * g.dh;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t off = kx * g.dw, r = off % g.sw;
          rk.mac(acc.data(), ph.data() + (r * hp + iy) * wr + off / g.sw, wc[ky * g.kw + kx], g.ow);
        }
      }
      rk.requant(nullptr, acc.data(), nullptr, 0, bias, ep.mult[ch], ep.zy, ep.out, y, y_base + oy * g.ow, g.ow);
    }
  };
  qgemm::parallel_for(threads, g.batch * g.m, body);
}

}  // namespace a16w8
}  // namespace quanta
