// A16W8 driver: activation panels (with the eq. (A2) offset), the plane loop, the exact
// eq. (A3) zero-point terms and the eq. (A4) requantization; the portable micro-kernel.
#include "a16w8/a16w8.h"

#include <cmath>
#include <cstring>
#include <vector>

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

// Round to nearest, ties to even, for |v| ≤ 2^22 (the clamped values here stay within
// ±65536): adding and subtracting 1.5·2^23 leaves the integer part in float32's last
// place, rounded by the current (default: nearest-even) mode. nearbyint is a libm call
// that saves the floating-point environment, which cost more than the GEMM itself.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;  // 1.5 · 2^23
  const float t = v + kMagic;  // two IEEE roundings (no -ffast-math: not reassociated)
  return t - kMagic;
}

// eq. (A4): saturate(rne(f32(acc) · m) + zy), clamped before rounding as requantize() does.
template <typename T>
inline void store(void* y, int64_t i, int64_t acc, float m, int64_t zy, int64_t qmin, int64_t qmax) {
  const float lo = static_cast<float>(qmin - zy), hi = static_cast<float>(qmax - zy);
  float v = static_cast<float>(acc) * m;
  v = std::isnan(v) ? lo : (v < lo ? lo : (v > hi ? hi : v));
  int64_t q = static_cast<int64_t>(round_even(v)) + zy;
  q = q < qmin ? qmin : (q > qmax ? qmax : q);
  static_cast<T*>(y)[i] = static_cast<T>(q);
}

inline void store_any(void* y, Elem out, int64_t i, int64_t acc, float m, int64_t zy) {
  switch (out) {
    case Elem::kU8: store<uint8_t>(y, i, acc, m, zy, 0, 255); break;
    case Elem::kI8: store<int8_t>(y, i, acc, m, zy, -128, 127); break;
    case Elem::kU16: store<uint16_t>(y, i, acc, m, zy, 0, 65535); break;
    default: store<int16_t>(y, i, acc, m, zy, -32768, 32767); break;
  }
}

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

void conv2d(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const Packed* w, const Epilogue& ep,
            void* y, int threads) {
  const MicroKernel uk = select_ukernel(select_kernel("a16w8", "s16s16->s64")->isa);
  const int64_t oa = elem_offset(x_elem);
  const int64_t cg = g.c / g.group, mg = g.m / g.group, P = g.oh * g.ow, khw = g.kh * g.kw;
  const int16_t pad = static_cast<int16_t>(zx - oa);  // the real value 0 (eq. (A2))
  const int64_t row_blocks = (P + 8 * kMR - 1) / (8 * kMR);
  const int64_t jobs = g.batch * g.group * row_blocks;
  auto body = [&](int64_t job, int) {
    const int64_t img = job / (g.group * row_blocks), rest = job % (g.group * row_blocks);
    const int64_t grp = rest / row_blocks, rb = rest % row_blocks;
    const int64_t x_base = (img * g.c + grp * cg) * g.h * g.w;
    auto fill = [&](int64_t r0, int mr, int16_t* panel, int64_t lda, int64_t* rowsum) {
      for (int r = 0; r < mr; ++r) {
        const int64_t pix = r0 + r, oy = pix / g.ow, ox = pix % g.ow;
        int16_t* dst = panel + r * lda;
        int64_t s = 0, i = 0;
        for (int64_t ch = 0; ch < cg; ++ch) {
          for (int64_t ky = 0; ky < g.kh; ++ky) {
            const int64_t iy = oy * g.sh - g.pt + ky * g.dh;
            for (int64_t kx = 0; kx < g.kw; ++kx, ++i) {
              const int64_t ix = ox * g.sw - g.pl + kx * g.dw;
              int64_t v = pad;
              if (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w)
                v = load_elem(x, x_elem, x_base + (ch * g.h + iy) * g.w + ix) - oa;
              dst[i] = static_cast<int16_t>(v);
              s += v;
            }
          }
        }
        for (i = cg * khw; i < lda; ++i) dst[i] = 0;
        rowsum[r] = s;
      }
    };
    const int64_t y_base = (img * g.m + grp * mg) * P;
    auto out_index = [y_base, P](int64_t row, int64_t col) { return y_base + col * P + row; };
    const int64_t b = rb * 8 * kMR, e = b + 8 * kMR < P ? b + 8 * kMR : P;
    gemm_rows(b, e, w[grp], ep, grp * mg, fill, out_index, y, uk);
  };
  qgemm::parallel_for(threads, jobs, body);
}

void conv2d_depthwise(const void* x, Elem x_elem, int64_t zx, const ConvGeom& g, const int32_t* wd,
                      const Epilogue& ep, void* y, int threads) {
  const int64_t P = g.oh * g.ow, khw = g.kh * g.kw;
  auto body = [&](int64_t job, int) {
    const int64_t img = job / g.m, ch = job % g.m;
    const int64_t x_base = (img * g.c + ch) * g.h * g.w, y_base = (img * g.m + ch) * P;
    const int32_t* wc = wd + ch * khw;
    std::vector<int64_t> xs(static_cast<size_t>(g.h * g.w));
    for (int64_t i = 0; i < g.h * g.w; ++i) xs[i] = load_elem(x, x_elem, x_base + i) - zx;
    for (int64_t oy = 0; oy < g.oh; ++oy) {
      for (int64_t ox = 0; ox < g.ow; ++ox) {
        int64_t acc = 0;
        for (int64_t ky = 0; ky < g.kh; ++ky) {
          const int64_t iy = oy * g.sh - g.pt + ky * g.dh;
          if (iy < 0 || iy >= g.h) continue;
          for (int64_t kx = 0; kx < g.kw; ++kx) {
            const int64_t ix = ox * g.sw - g.pl + kx * g.dw;
            if (ix < 0 || ix >= g.w) continue;
            acc += xs[iy * g.w + ix] * wc[ky * g.kw + kx];
          }
        }
        if (ep.bias) acc += ep.bias[ch];
        store_any(y, ep.out, y_base + oy * g.ow + ox, acc, ep.mult[ch], ep.zy);
      }
    }
  };
  qgemm::parallel_for(threads, g.batch * g.m, body);
}

}  // namespace a16w8
}  // namespace quanta
