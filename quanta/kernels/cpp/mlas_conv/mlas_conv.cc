// quanta::MlasConv driver (mlas_conv.h): im2col of one part (into 16-column panels for the
// FMA chains, as MLAS's CopyPackB lays B out), the chains, MLAS's M = 1 and N = 1 orders,
// the bias. Parts, groups and images are the units this kernel threads over; the result of
// an output does not depend on which thread computes it.
#include "mlas_conv/mlas_conv.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace mlas_conv {

void chains_portable(const float* a, int64_t lda, const float* panels, float* y, int64_t ldy, int64_t rows, int64_t cn,
                     int64_t k, int64_t sk) {
  for (int64_t n0 = 0; n0 < cn; n0 += 16) {
    const int64_t cols = cn - n0 < 16 ? cn - n0 : 16;
    const float* panel = panels + (n0 / 16) * k * 16;
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + r * ldy + n0;
      for (int64_t k0 = 0; k0 < k; k0 += sk) {
        const int64_t k1 = k < k0 + sk ? k : k0 + sk;
        float acc[16] = {};
        for (int64_t kk = k0; kk < k1; ++kk) {
          const float av = a[r * lda + kk];
          for (int l = 0; l < 16; ++l) acc[l] = std::fma(av, panel[kk * 16 + l], acc[l]);
        }
        for (int64_t l = 0; l < cols; ++l) yr[l] = k0 == 0 ? acc[l] : yr[l] + acc[l];
      }
    }
  }
}

namespace {

// The input offsets of the part's columns: row oy·sh − pt and column ox·sw − pl.
void column_bases(const Geometry& g, int64_t n0, int64_t cn, int64_t* by, int64_t* bx) {
  int64_t oy = n0 / g.ow, ox = n0 % g.ow;
  for (int64_t t = 0; t < cn; ++t) {
    by[t] = oy * g.sh - g.pt;
    bx[t] = ox * g.sw - g.pl;
    if (++ox == g.ow) {
      ox = 0;
      ++oy;
    }
  }
}

inline float tap(const float* xc, const Geometry& g, int64_t iy, int64_t ix) {
  return (iy >= 0 && iy < g.h && ix >= 0 && ix < g.w) ? xc[iy * g.w + ix] : 0.0f;
}

// Columns [t0, t0 + cols) of im2col row (dy, dx) into dst: a strided run of x when they
// lie in one output row inside the input (contiguous at stride 1), else tap by tap.
inline void im2col_run(const float* xc, const Geometry& g, const int64_t* by, const int64_t* bx, int64_t t0,
                       int64_t cols, int64_t dy, int64_t dx, float* dst) {
  const int64_t iy = by[t0] + dy, ix0 = bx[t0] + dx;
  if (by[t0 + cols - 1] == by[t0] && iy >= 0 && iy < g.h && ix0 >= 0 && ix0 + (cols - 1) * g.sw < g.w) {
    const float* src = xc + iy * g.w + ix0;
    if (g.sw == 1 && cols == 16) {
      std::memcpy(dst, src, 16 * sizeof(float));
    } else if (g.sw == 1) {
      for (int64_t l = 0; l < cols; ++l) dst[l] = src[l];
    } else {
      for (int64_t l = 0; l < cols; ++l) dst[l] = src[l * g.sw];
    }
    return;
  }
  for (int64_t l = 0; l < cols; ++l) dst[l] = tap(xc, g, by[t0 + l] + dy, bx[t0 + l] + dx);
}

// (MC1) for the part's columns: packed panels [⌈cn/16⌉][K][16] (zero-padded) when `packed`,
// else rows [K][cn].
void im2col(const float* x, const Geometry& g, int64_t cn, const int64_t* by, const int64_t* bx, bool packed,
            float* out) {
  const int64_t k = g.c * g.kh * g.kw;
  for (int64_t kk = 0; kk < k; ++kk) {
    const int64_t c = kk / (g.kh * g.kw), i = (kk / g.kw) % g.kh, j = kk % g.kw;
    const float* xc = x + c * g.h * g.w;
    const int64_t dy = i * g.dh, dx = j * g.dw;
    for (int64_t t0 = 0; t0 < cn; t0 += 16) {
      const int64_t cols = cn - t0 < 16 ? cn - t0 : 16;
      if (!packed) {
        im2col_run(xc, g, by, bx, t0, cols, dy, dx, out + kk * cn + t0);
        continue;
      }
      float* dst = out + ((t0 / 16) * k + kk) * 16;
      im2col_run(xc, g, by, bx, t0, cols, dy, dx, dst);
      for (int64_t l = cols; l < 16; ++l) dst[l] = 0.0f;
    }
  }
}

// (MC5): SgemmKernelM1Avx's vmulps / vaddps order.
void chain_m1(const float* a, const float* cols, int64_t k, int64_t cn, float* y) {
  for (int64_t n = 0; n < cn; ++n) y[n] = 0.0f;
  int64_t kk = 0;
  for (; kk + 4 <= k; kk += 4) {
    const float* b0 = cols + kk * cn;
    for (int64_t n = 0; n < cn; ++n) {
      float t = a[kk] * b0[n];
      t = t + a[kk + 1] * b0[cn + n];
      t = t + a[kk + 2] * b0[2 * cn + n];
      t = t + a[kk + 3] * b0[3 * cn + n];
      y[n] = t + y[n];
    }
  }
  if (k - kk >= 2) {
    const float* b0 = cols + kk * cn;
    for (int64_t n = 0; n < cn; ++n) y[n] = (a[kk] * b0[n] + a[kk + 1] * b0[cn + n]) + y[n];
    kk += 2;
  }
  if (k - kk == 1) {
    const float* b0 = cols + kk * cn;
    for (int64_t n = 0; n < cn; ++n) y[n] = a[kk] * b0[n] + y[n];
  }
}

// (MC5'): SgemmKernelM1TransposeBAvx, rows a [mc, k] (row stride lda) against one column
// b [k]; y[r] has row stride ldy.
void dot_rows(const float* a, int64_t lda, const float* b, int64_t k, int64_t mc, float* y, int64_t ldy) {
  const int64_t fours = mc / 4 * 4, pair_end = fours + (mc % 4 >= 2 ? 2 : 0);
  for (int64_t r = 0; r < mc; ++r) {
    float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    const float* ar = a + r * lda;
    for (int64_t j = 0; j < k; j += 8) {
      for (int l = 0; l < 8 && j + l < k; ++l) s[l] = s[l] + ar[j + l] * b[j + l];
    }
    float v;
    if (r < fours) {
      v = (((s[0] + s[1]) + s[2]) + s[3]) + (((s[4] + s[5]) + s[6]) + s[7]);
    } else if (r < pair_end) {
      v = ((s[0] + s[2]) + (s[4] + s[6])) + ((s[1] + s[3]) + (s[5] + s[7]));
    } else {
      v = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
    }
    y[r * ldy] = v + 0.0f;
  }
}

}  // namespace

void conv_f32(const float* x, const float* w, const float* bias, float* y, const Geometry& g, const int64_t* parts,
              int64_t n_parts, int num_threads, bool use_avx2) {
  const int64_t k = g.c * g.kh * g.kw, n_out = g.oh * g.ow;
  const int64_t units = g.batch * g.group * n_parts;
  auto body = [&](int64_t u, int) {
    const int64_t* p = parts + 6 * (u % n_parts);
    const int64_t bg = u / n_parts, grp = bg % g.group, img = bg / g.group;
    const int64_t m0 = p[0], mc = p[1], n0 = p[2], cn = p[3], sk = p[4], kind = p[5];
    thread_local std::vector<float> cols;
    thread_local std::vector<int64_t> bases;
    const bool packed = kind == kChains;
    cols.resize(static_cast<size_t>(k * (packed ? (cn + 15) / 16 * 16 : cn)));
    bases.resize(static_cast<size_t>(2 * cn));
    column_bases(g, n0, cn, bases.data(), bases.data() + cn);
    const float* xg = x + (img * g.group + grp) * g.c * g.h * g.w;
    im2col(xg, g, cn, bases.data(), bases.data() + cn, packed, cols.data());
    const float* a = w + (grp * g.f + m0) * k;
    float* yg = y + ((img * g.group + grp) * g.f + m0) * n_out + n0;
    if (kind == kM1) {
      chain_m1(a, cols.data(), k, cn, yg);
    } else if (kind == kDot) {
      dot_rows(a, k, cols.data(), k, mc, yg, n_out);
    } else if (use_avx2) {
      chains_avx2(a, k, cols.data(), yg, n_out, mc, cn, k, sk);
    } else {
      chains_portable(a, k, cols.data(), yg, n_out, mc, cn, k, sk);
    }
    if (bias != nullptr) {
      for (int64_t f = 0; f < mc; ++f) {
        const float bf = bias[grp * g.f + m0 + f];
        float* row = yg + f * n_out;
        for (int64_t t = 0; t < cn; ++t) row[t] = row[t] + bf;
      }
    }
  };
  if (num_threads <= 1 || units == 1) {
    for (int64_t u = 0; u < units; ++u) body(u, 0);
  } else {
    qgemm::parallel_for(num_threads, units, body);
  }
}

}  // namespace mlas_conv
}  // namespace quanta
