// quanta::MlasQLinearConv's driver (mlas_qconv.h): the (i, j, c) im2col, one saturating
// GEMM per group, the NCHW <-> NHWC transposes (none channels-last), and the portable pairs.
#include "mlas_qconv/mlas_qconv.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>

#include "layout/transpose.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace mlas_qconv {
namespace {

// b[i] ^= 0x80 over n bytes: int8 codes as x + 128 (the compiler vectorizes the loop).
void flip_bytes(uint8_t* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) b[i] = static_cast<uint8_t>(b[i] ^ 0x80);
}

// dst[0, n) = src[0, n). A run of at most 16 bytes (a 3-channel stem's 3 x 3 kernel row:
// 9) is one 16-byte copy when src has 16 readable bytes (src_end) and dst's row 16 more
// (dst_end): the bytes past n land in the same im2col row, where the row's next run or
// padding is written afterwards (a row is written in increasing address order). A libc
// memcpy of a variable size cost more than the copy itself.
inline void copy_run(uint8_t* dst, const uint8_t* src, int64_t n, const uint8_t* src_end, const uint8_t* dst_end) {
  if (n <= 16 && src + 16 <= src_end && dst + 16 <= dst_end) {
    std::memcpy(dst, src, 16);
  } else {
    std::memcpy(dst, src, static_cast<size_t>(n));
  }
}

// (QC1) for group `grp`, rows p in [p0, p1): cols[p, (i, j, c)] from xt [h, w, group·c]
// (x' codes), zx' outside. Each row is written by one call alone and nothing past it, so
// any split of the rows over threads writes the same bytes.
void im2col(const uint8_t* xt, const Geometry& g, int64_t grp, uint8_t zx, uint8_t* cols, int64_t p0, int64_t p1) {
  const int64_t ctot = g.group * g.c, k = g.kh * g.kw * g.c, run = g.kw * g.c;
  const bool contiguous = g.dw == 1 && g.group == 1;  // a kernel row is one run of x
  const uint8_t* xt_end = xt + g.h * g.w * ctot;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t oh = p / g.ow, ow = p % g.ow;
    uint8_t* row = cols + p * k;
    const uint8_t* row_end = row + k;
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
        if (j1 > j0) copy_run(dst + j0 * g.c, src + (iw0 + j0) * ctot, (j1 - j0) * g.c, xt_end, row_end);
        if (j1 < g.kw) std::memset(dst + j1 * g.c, zx, static_cast<size_t>((g.kw - j1) * g.c));
        continue;
      }
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t iw = iw0 + j * g.dw;
        if (iw < 0 || iw >= g.w) {
          std::memset(dst + j * g.c, zx, static_cast<size_t>(g.c));
        } else {
          copy_run(dst + j * g.c, src + iw * ctot, g.c, xt_end, row_end);
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
          int32_t zy, bool y_signed, void* y, const Geometry& g, int num_threads, bool channels_last) {
  if (g.group != pw.group || g.c != pw.c || g.f != pw.f || g.kh != pw.kh || g.kw != pw.kw) {
    throw std::invalid_argument("mlas_qconv: the geometry does not match the packed weights");
  }
  static thread_local std::vector<uint8_t> xt, cols, yt;
  static thread_local qgemm::Workspace ws;
  const int64_t ctot = g.group * g.c, ftot = g.group * g.f, hw = g.h * g.w, rows = g.oh * g.ow, k = pw.k();
  const int32_t zxu = x_signed ? zx + 128 : zx;
  // a 1x1 Conv of stride 1 without pads reads the [h·w, G·C] input itself (row stride G·C)
  const bool pointwise =
      g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0 && g.oh == g.h && g.ow == g.w;
  // the im2col splits its rows over the threads when it moves enough bytes to pay for a
  // second thread (~256 KiB), in chunks of ~32 KiB
  const int im2col_threads = rows * k >= (int64_t{256} << 10) ? num_threads : 1;
  const int64_t im2col_grain = std::max<int64_t>(1, (int64_t{32} << 10) / std::max<int64_t>(1, k));
  // a channels-last uint8 x is the GEMM's input as it is; otherwise one copy per image
  // (NCHW -> NHWC, and int8 codes + 128)
  const bool copy_x = !channels_last || x_signed;
  if (copy_x) xt.resize(static_cast<size_t>(hw * ctot));
  if (!pointwise) cols.resize(static_cast<size_t>(rows * k));
  if (!channels_last) yt.resize(static_cast<size_t>(rows * ftot));
  for (int64_t n = 0; n < g.batch; ++n) {
    const uint8_t* xn = static_cast<const uint8_t*>(x) + n * ctot * hw;
    uint8_t* yn = static_cast<uint8_t*>(y) + n * ftot * rows;
    const uint8_t* xh = xn;  // [h, w, G·C] x' codes
    if (copy_x) {
      if (channels_last) {
        std::memcpy(xt.data(), xn, static_cast<size_t>(hw * ctot));
      } else {
        layout::transpose_batched(xn, xt.data(), 1, ctot, hw, 1, num_threads);
      }
      if (x_signed) flip_bytes(xt.data(), hw * ctot);
      xh = xt.data();
    }
    uint8_t* yh = channels_last ? yn : yt.data();  // [oh·ow, G·F]
    for (int64_t grp = 0; grp < g.group; ++grp) {
      const uint8_t* a = xh + grp * g.c;
      int64_t lda = ctot;
      if (!pointwise) {
        uint8_t* c = cols.data();
        qgemm::parallel_ranges(im2col_threads, rows, im2col_grain, [&](int64_t p0, int64_t p1) {
          im2col(xh, g, grp, static_cast<uint8_t>(zxu), c, p0, p1);
        });
        a = c;
        lda = k;
      }
      const int32_t* b = bias ? bias + grp * g.f : nullptr;
      const float* m = multiplier + grp * g.f;
      uint8_t* yg = yh + grp * g.f;
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
    if (!channels_last) layout::transpose_batched(yt.data(), yn, 1, rows, ftot, 1, num_threads);
  }
}

}  // namespace mlas_qconv
}  // namespace quanta
