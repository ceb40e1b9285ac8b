// quanta::MlasConv driver (mlas_conv.h): im2col of one K block of a part (rows of the part's
// columns, which the FMA chains read 16 columns at a time), the chains, MLAS's M = 1 and
// N = 1 orders, the bias. Parts, groups and images are the units this kernel threads over; the result of
// an output does not depend on which thread computes it.
#include "mlas_conv/mlas_conv.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace mlas_conv {

void chains_portable(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int64_t rows,
                     int64_t cn, int64_t kb, bool accumulate) {
  for (int64_t n0 = 0; n0 < cn; n0 += 16) {
    const int64_t cols = cn - n0 < 16 ? cn - n0 : 16;
    for (int64_t r = 0; r < rows; ++r) {
      float* yr = y + r * ldy + n0;
      float acc[16] = {};
      for (int64_t kk = 0; kk < kb; ++kk) {
        const float av = a[r * lda + kk];
        for (int l = 0; l < 16; ++l) acc[l] = std::fma(av, b[kk * ldb + n0 + l], acc[l]);
      }
      for (int64_t l = 0; l < cols; ++l) yr[l] = accumulate ? yr[l] + acc[l] : acc[l];
    }
  }
}

namespace {

// Columns [t0, t0 + cols) of im2col row (dy, dx) into dst, the first being output pixel
// (oy, ox): per output row they cover, the input row's taps inside x are a strided run
// (contiguous at stride 1) between two zero runs (the padding), found by bounds, not tap by
// tap.
inline void im2col_run(const float* xc, const Geometry& g, int64_t oy, int64_t ox, int64_t cols, int64_t dy, int64_t dx,
                       float* dst) {
  int64_t t = 0;
  while (t < cols) {
    const int64_t run = cols - t < g.ow - ox ? cols - t : g.ow - ox;
    float* d = dst + t;
    const int64_t iy = oy * g.sh - g.pt + dy;
    if (iy < 0 || iy >= g.h) {
      for (int64_t l = 0; l < run; ++l) d[l] = 0.0f;
    } else {
      const int64_t ix0 = ox * g.sw - g.pl + dx;
      // taps l with 0 <= ix0 + l·sw < w: [lo, hi), without a division in the common case
      // (the run inside x, or a few taps of padding at its left end)
      int64_t lo = 0;
      while (lo < run && ix0 + lo * g.sw < 0) ++lo;
      int64_t hi = run;
      if (ix0 + (run - 1) * g.sw >= g.w) hi = ix0 >= g.w ? 0 : (g.w - 1 - ix0) / g.sw + 1;
      hi = hi > lo ? hi : lo;
      const float* xr = xc + iy * g.w;
      for (int64_t l = 0; l < lo; ++l) d[l] = 0.0f;
      // constant strides: the compiler vectorizes the copy and the even-element pick
      if (g.sw == 1) {
        for (int64_t l = lo; l < hi; ++l) d[l] = xr[ix0 + l];
      } else if (g.sw == 2) {
        for (int64_t l = lo; l < hi; ++l) d[l] = xr[ix0 + 2 * l];
      } else {
        for (int64_t l = lo; l < hi; ++l) d[l] = xr[ix0 + l * g.sw];
      }
      for (int64_t l = hi; l < run; ++l) d[l] = 0.0f;
    }
    t += run;
    ox = 0;
    ++oy;
  }
}

// (MC1) for the part's columns [n0, n0 + cn) and the K rows [k0, k1): rows [k1 − k0][ld],
// columns [cn, ld) zero where ld > cn (the chains read whole 16-column groups). Each k's
// channel and tap are decoded once per block, and a row is written run by run of output
// rows, the padding found by bounds.
void im2col(const float* x, const Geometry& g, int64_t n0, int64_t cn, int64_t k0, int64_t k1, int64_t ld, float* out) {
  const int64_t oy = n0 / g.ow, ox = n0 % g.ow;
  const int64_t pad_to = (cn + 15) / 16 * 16 < ld ? (cn + 15) / 16 * 16 : ld;
  for (int64_t kk = k0; kk < k1; ++kk) {
    const int64_t c = kk / (g.kh * g.kw), i = (kk / g.kw) % g.kh, j = kk % g.kw;
    float* dst = out + (kk - k0) * ld;
    im2col_run(x + c * g.h * g.w, g, oy, ox, cn, i * g.dh, j * g.dw, dst);
    for (int64_t l = cn; l < pad_to; ++l) dst[l] = 0.0f;
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

// (MC5): SgemmKernelM1Avx's vmulps / vaddps order over the kb rows of one K block, from
// y = +0 on the first block. Every block but the last has a multiple of 4 rows (a K of
// more than one block has blocks of 128 or more), so the groups of four line up with the
// twin's over the whole K.
void chain_m1_portable(const float* a, const float* b, int64_t ldb, int64_t kb, int64_t cn, float* y, bool accumulate) {
  if (!accumulate) {
    for (int64_t n = 0; n < cn; ++n) y[n] = 0.0f;
  }
  int64_t kk = 0;
  for (; kk + 4 <= kb; kk += 4) {
    const float* b0 = b + kk * ldb;
    for (int64_t n = 0; n < cn; ++n) {
      float t = a[kk] * b0[n];
      t = t + a[kk + 1] * b0[ldb + n];
      t = t + a[kk + 2] * b0[2 * ldb + n];
      t = t + a[kk + 3] * b0[3 * ldb + n];
      y[n] = t + y[n];
    }
  }
  if (kb - kk >= 2) {
    const float* b0 = b + kk * ldb;
    for (int64_t n = 0; n < cn; ++n) y[n] = (a[kk] * b0[n] + a[kk + 1] * b0[ldb + n]) + y[n];
    kk += 2;
  }
  if (kb - kk == 1) {
    const float* b0 = b + kk * ldb;
    for (int64_t n = 0; n < cn; ++n) y[n] = a[kk] * b0[n] + y[n];
  }
}

std::string set_window(Geometry& g, const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                       const std::vector<int64_t>& pads) {
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4)
    return "strides, dilations need 2 values, pads 4";
  g.sh = strides[0];
  g.sw = strides[1];
  g.dh = dilations[0];
  g.dw = dilations[1];
  g.pt = pads[0];
  g.pl = pads[1];
  if (g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1) return "strides and dilations must be >= 1";
  if (pads[0] < 0 || pads[1] < 0 || pads[2] < 0 || pads[3] < 0) {
    return "pads must be >= 0, got (" + std::to_string(pads[0]) + ", " + std::to_string(pads[1]) + ", " +
           std::to_string(pads[2]) + ", " + std::to_string(pads[3]) + ")";
  }
  const int64_t hp = g.h + pads[0] + pads[2], wp = g.w + pads[1] + pads[3];
  if (hp < g.dh * (g.kh - 1) + 1 || wp < g.dw * (g.kw - 1) + 1) return "the output would be empty";
  g.oh = (hp - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.ow = (wp - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  return "";
}

void conv_f32(const float* x, const float* w, const float* bias, float* y, const Geometry& g, const int64_t* parts,
              int64_t n_parts, int num_threads, bool use_avx2) {
  const int64_t k = g.c * g.kh * g.kw, n_out = g.oh * g.ow;
  const int64_t units = g.batch * g.group * n_parts;
  // 1x1, stride 1, no padding: the output plane is the input plane
  const bool pointwise =
      g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.oh == g.h && g.ow == g.w;
  const auto chain_m1 = use_avx2 ? chain_m1_avx2 : chain_m1_portable;
  auto body = [&](int64_t u, int) {
    const int64_t* p = parts + 6 * (u % n_parts);
    const int64_t bg = u / n_parts, grp = bg % g.group, img = bg / g.group;
    const int64_t m0 = p[0], mc = p[1], n0 = p[2], cn = p[3], kind = p[5];
    // a one-pixel part (MC5') reads the whole K at once; the others one block at a time
    const int64_t sk = kind == kDot ? k : p[4];
    thread_local std::vector<float> cols;
    // the chains' rows: whole 16-column groups (64-byte lines), an odd number of them, so
    // that consecutive rows fall in every L1 set (an even count, as 128 columns, puts the
    // rows a 16-column group reads in 1/2, 1/4, ... of the sets)
    const int64_t groups = (cn + 15) / 16;
    const int64_t ld = kind == kChains ? 16 * (groups % 2 == 1 ? groups : groups + 1) : cn;
    const int64_t kb_max = sk < k ? sk : k;
    cols.resize(static_cast<size_t>(kb_max * ld));
    const float* xg = x + (img * g.group + grp) * g.c * g.h * g.w;
    const float* a = w + (grp * g.f + m0) * k;
    float* yg = y + ((img * g.group + grp) * g.f + m0) * n_out + n0;
    for (int64_t k0 = 0; k0 < k; k0 += sk) {
      const int64_t k1 = k < k0 + sk ? k : k0 + sk;
      if (kind == kM1 && pointwise) {
        // im2col row k of a pointwise Conv is input plane k: the chains read it in place
        chain_m1(a + k0, xg + k0 * n_out + n0, n_out, k1 - k0, cn, yg, k0 != 0);
        continue;
      }
      im2col(xg, g, n0, cn, k0, k1, ld, cols.data());
      if (kind == kM1) {
        chain_m1(a + k0, cols.data(), cn, k1 - k0, cn, yg, k0 != 0);
      } else if (kind == kDot) {
        dot_rows(a, k, cols.data(), k, mc, yg, n_out);
      } else if (use_avx2) {
        chains_avx2(a + k0, k, cols.data(), ld, yg, n_out, mc, cn, k1 - k0, k0 != 0);
      } else {
        chains_portable(a + k0, k, cols.data(), ld, yg, n_out, mc, cn, k1 - k0, k0 != 0);
      }
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
    return;
  }
  // MLAS's segment order: each thread takes one contiguous run of the parts (an ORT
  // thread's segment is a contiguous run of slices), so neighbouring slices, which read
  // overlapping input rows, stay on one core.
  const int64_t t = units < num_threads ? units : num_threads;
  auto run = [&](int64_t i, int) {
    for (int64_t u = units * i / t; u < units * (i + 1) / t; ++u) body(u, 0);
  };
  qgemm::parallel_for(static_cast<int>(t), t, run);
}

}  // namespace mlas_conv
}  // namespace quanta
