// quanta::MlasQLinearConv's driver (mlas_qconv.h): the (i, j, c) im2col, one saturating
// GEMM per group, the NCHW transposes, and the portable pairs.
#include "mlas_qconv/mlas_qconv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

namespace quanta {
namespace mlas_qconv {
namespace {

// dst[c, r] = src[r, c] ^ flip for an [rows, cols] byte matrix (flip 0x80: int8 -> x + 128),
// in square blocks so both sides stay in cache.
void transpose_bytes(const uint8_t* src, int64_t rows, int64_t cols, uint8_t* dst, uint8_t flip) {
  constexpr int64_t kB = 32;
  for (int64_t r0 = 0; r0 < rows; r0 += kB) {
    const int64_t r1 = std::min(rows, r0 + kB);
    for (int64_t c0 = 0; c0 < cols; c0 += kB) {
      const int64_t c1 = std::min(cols, c0 + kB);
      for (int64_t c = c0; c < c1; ++c) {
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = static_cast<uint8_t>(src[r * cols + c] ^ flip);
      }
    }
  }
}

// (QC1) for group `grp`: cols[p, (i, j, c)] from xt [h, w, group·c] (x' codes), zx' outside.
void im2col(const uint8_t* xt, const Geometry& g, int64_t grp, uint8_t zx, uint8_t* cols) {
  const int64_t ctot = g.group * g.c, k = g.kh * g.kw * g.c, run = g.kw * g.c;
  const bool contiguous = g.dw == 1 && g.group == 1;  // a kernel row is one run of x
  for (int64_t oh = 0; oh < g.oh; ++oh) {
    for (int64_t ow = 0; ow < g.ow; ++ow) {
      uint8_t* row = cols + (oh * g.ow + ow) * k;
      const int64_t iw0 = ow * g.sw - g.pl;
      for (int64_t i = 0; i < g.kh; ++i) {
        const int64_t ih = oh * g.sh - g.pt + i * g.dh;
        uint8_t* dst = row + i * run;
        if (ih < 0 || ih >= g.h) {
          std::memset(dst, zx, static_cast<size_t>(run));
          continue;
        }
        const uint8_t* src = xt + ih * g.w * ctot + grp * g.c;
        if (contiguous) {
          const int64_t j0 = std::min(g.kw, std::max<int64_t>(0, -iw0));
          const int64_t j1 = std::max(j0, std::min(g.kw, g.w - iw0));
          if (j0 > 0) std::memset(dst, zx, static_cast<size_t>(j0 * g.c));
          if (j1 > j0) std::memcpy(dst + j0 * g.c, src + (iw0 + j0) * ctot, static_cast<size_t>((j1 - j0) * g.c));
          if (j1 < g.kw) std::memset(dst + j1 * g.c, zx, static_cast<size_t>((g.kw - j1) * g.c));
          continue;
        }
        for (int64_t j = 0; j < g.kw; ++j) {
          const int64_t iw = iw0 + j * g.dw;
          if (iw < 0 || iw >= g.w) {
            std::memset(dst + j * g.c, zx, static_cast<size_t>(g.c));
          } else {
            std::memcpy(dst + j * g.c, src + iw * ctot, static_cast<size_t>(g.c));
          }
        }
      }
    }
  }
}

inline int32_t sat16(int32_t v) { return std::min(32767, std::max(-32768, v)); }

// (QC2)-(QC4) in scalar C++ for one group: a [P, K] (row stride lda) against w [f, K],
// into y [P, ·] (row stride ldy) at the group's columns.
void gemm_portable(const Packed& pw, int64_t grp, const uint8_t* a, int64_t lda, int64_t rows, int32_t zx,
                   const int32_t* bias, const float* multiplier, int32_t zy, bool y_signed, uint8_t* y, int64_t ldy) {
  const int64_t k = pw.k(), f0 = grp * pw.f;
  const float lo = (y_signed ? -128.f : 0.f) - static_cast<float>(zy);
  const float hi = (y_signed ? 127.f : 255.f) - static_cast<float>(zy);
  for (int64_t p = 0; p < rows; ++p) {
    const uint8_t* ap = a + p * lda;
    int64_t rowsum = 0;
    for (int64_t t = 0; t < k; ++t) rowsum += ap[t];
    for (int64_t f = f0; f < f0 + pw.f; ++f) {
      const int8_t* wf = pw.w.data() + f * k;
      int64_t acc = 0;
      int64_t t = 0;
      for (; t + 1 < k; t += 2) acc += sat16(ap[t] * wf[t] + ap[t + 1] * wf[t + 1]);
      if (t < k) acc += ap[t] * wf[t];  // K odd: its last pair's partner is a zero pad
      acc -= zx * pw.wsum[f] + pw.zw[f] * rowsum - k * zx * pw.zw[f];
      if (bias) acc += bias[f];
      float v = static_cast<float>(acc) * multiplier[f];
      v = std::min(std::max(v, lo), hi);  // integer bounds: the same as clipping after rounding
      const int32_t q = static_cast<int32_t>(std::nearbyint(v)) + zy;
      y[p * ldy + (f - f0)] = static_cast<uint8_t>(q);
    }
  }
}

}  // namespace

std::shared_ptr<Packed> pack(const int8_t* w, const int32_t* zw, int64_t group, int64_t f, int64_t c, int64_t kh,
                             int64_t kw, bool avx2) {
  auto pw = std::make_shared<Packed>();
  pw->group = group;
  pw->f = f;
  pw->c = c;
  pw->kh = kh;
  pw->kw = kw;
  pw->avx2 = avx2;
  const int64_t k = pw->k(), ftot = group * f;
  // [group·f, K] in (i, j, c) order: w[f, c, i, j] -> wk[f, (i·kw + j)·c + c]
  std::vector<int8_t> wk(static_cast<size_t>(ftot * k));
  for (int64_t o = 0; o < ftot; ++o) {
    for (int64_t ci = 0; ci < c; ++ci) {
      for (int64_t i = 0; i < kh; ++i) {
        for (int64_t j = 0; j < kw; ++j) wk[o * k + (i * kw + j) * c + ci] = w[((o * c + ci) * kh + i) * kw + j];
      }
    }
  }
  pw->zw.assign(zw, zw + ftot);
  pw->wsum.assign(static_cast<size_t>(ftot), 0);
  for (int64_t o = 0; o < ftot; ++o) {
    for (int64_t t = 0; t < k; ++t) pw->wsum[o] += wk[o * k + t];
  }
  if (!avx2) {
    pw->w = std::move(wk);
    return pw;
  }
  std::vector<int8_t> kn(static_cast<size_t>(k * f));  // one group's [K, f]
  for (int64_t grp = 0; grp < group; ++grp) {
    for (int64_t t = 0; t < k; ++t) {
      for (int64_t o = 0; o < f; ++o) kn[t * f + o] = wk[(grp * f + o) * k + t];
    }
    pw->gemm.push_back(qgemm::pack_weights(kn.data(), false, k, f, f, zw + grp * f, true, Isa::kAvx2, true));
  }
  return pw;
}

void conv(const Packed& pw, const void* x, bool x_signed, int32_t zx, const int32_t* bias, const float* multiplier,
          int32_t zy, bool y_signed, void* y, const Geometry& g, int num_threads) {
  if (g.group != pw.group || g.c != pw.c || g.f != pw.f || g.kh != pw.kh || g.kw != pw.kw) {
    throw std::invalid_argument("mlas_qconv: the geometry does not match the packed weights");
  }
  static thread_local std::vector<uint8_t> xt, cols, yt;
  static thread_local qgemm::Workspace ws;
  const int64_t ctot = g.group * g.c, ftot = g.group * g.f, hw = g.h * g.w, rows = g.oh * g.ow, k = pw.k();
  const uint8_t flip = x_signed ? 0x80 : 0;
  const int32_t zxu = x_signed ? zx + 128 : zx;
  // a 1x1 Conv of stride 1 without pads reads xt itself (row stride G·C)
  const bool pointwise =
      g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.oh == g.h && g.ow == g.w;
  xt.resize(static_cast<size_t>(hw * ctot));
  if (!pointwise) cols.resize(static_cast<size_t>(rows * k));
  yt.resize(static_cast<size_t>(rows * ftot));
  for (int64_t n = 0; n < g.batch; ++n) {
    transpose_bytes(static_cast<const uint8_t*>(x) + n * ctot * hw, ctot, hw, xt.data(), flip);
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const uint8_t* a = xt.data() + grp * g.c;
      int64_t lda = ctot;
      if (!pointwise) {
        im2col(xt.data(), g, grp, static_cast<uint8_t>(zxu), cols.data());
        a = cols.data();
        lda = k;
      }
      const int32_t* b = bias ? bias + grp * g.f : nullptr;
      const float* m = multiplier + grp * g.f;
      uint8_t* yg = yt.data() + grp * g.f;
      if (!pw.avx2) {
        gemm_portable(pw, grp, a, lda, rows, zxu, bias, multiplier, zy, y_signed, yg, ftot);
        continue;
      }
      qgemm::QGemmParams p;
      p.M = rows;
      p.x = a;
      p.x_row_stride = lda;
      p.x_signed = false;
      p.zx = zxu;
      p.w = pw.gemm[static_cast<size_t>(grp)].get();
      p.bias = b;
      p.out_type = y_signed ? qgemm::OutType::kS8 : qgemm::OutType::kU8;
      p.requant = qgemm::Requant::kFloat;
      p.multiplier = m;
      p.multiplier_per_channel = true;
      p.zy = zy;
      p.y = yg;
      p.y_row_stride = ftot;
      p.num_threads = num_threads;
      ws.reserve(qgemm::qgemm_workspace_bytes(p));
      qgemm::qgemm(p, ws);
    }
    transpose_bytes(yt.data(), rows, ftot, static_cast<uint8_t*>(y) + n * ftot * rows, 0);
  }
}

}  // namespace mlas_qconv
}  // namespace quanta
