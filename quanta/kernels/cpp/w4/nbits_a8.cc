// MatMulNBits W4A8 driver, the row quantizer and the portable panel (nbits_a8.h).
#include "w4/nbits_a8.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace nbits_a8 {

void panel_portable(const PanelArgs& p, int rows, int nt) {
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < nt * 16; ++c) p.t[r * 32 + c] = 0.0f;
  }
  for (int64_t b = 0; b < p.kb; ++b) {
    const uint8_t* w = p.w + b * p.wb_stride;
    for (int r = 0; r < rows; ++r) {
      const int8_t* a = p.qa + r * p.lda + b * p.b4 * 4;
      const float s = p.sa[r * p.kb + b];
      const int32_t sq = p.sqa[r * p.kb + b];
      for (int j = 0; j < nt; ++j) {
        for (int c = 0; c < 16; ++c) {
          int32_t acc = 0;
          for (int64_t g = 0; g < p.b4; ++g) {
            for (int t = 0; t < 4; ++t) {
              const int32_t q = p.bits == 8 ? w[g * 128 + j * 64 + c * 4 + t] : (w[g * 64 + c * 4 + t] >> (4 * j)) & 15;
              acc += static_cast<int32_t>(a[4 * g + t]) * q;
            }
          }
          const int64_t col = j * 16 + c;
          const float f = static_cast<float>(acc - p.zp[b * 32 + col] * sq);  // eq. (W10)
          const float cs = s * p.sw[b * 32 + col];
          const float prod = f * cs;
          p.t[r * 32 + col] = p.t[r * 32 + col] + prod;
        }
      }
    }
  }
}

namespace {

struct Fns {
  Panel panel;
  QuantizeRows quantize;
};

Fns select(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return {panel_avx512vnni, quantize_rows_avx512vnni};
    case Isa::kAvx2: return {panel_avx2, quantize_rows_avx2};
    default: return {panel_portable, quantize_rows};
  }
}

}  // namespace

void quantize_rows(const float* a, const Params& p, int64_t r0, int64_t r1, int8_t* qa, float* sa, int32_t* sqa) {
  const int64_t kb = (p.k + p.block - 1) / p.block, lda = kb * p.block;
  for (int64_t i = r0; i < r1; ++i) {
    const float* row = a + i * p.k;
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t k0 = b * p.block, k1 = k0 + p.block < p.k ? k0 + p.block : p.k;
      float mx = 0.0f;
      bool finite = true;
      for (int64_t k = k0; k < k1; ++k) {
        const float v = std::fabs(row[k]);
        finite = finite && v <= FLT_MAX;  // false for inf and NaN
        mx = v > mx ? v : mx;
      }
      int8_t* q = qa + i * lda + k0;
      if (!finite) {
        sa[i * kb + b] = std::numeric_limits<float>::quiet_NaN();
        sqa[i * kb + b] = 0;
        for (int64_t k = 0; k < p.block; ++k) q[k] = 0;
        continue;
      }
      sa[i * kb + b] = mx / 127.0f;
      const float r = mx != 0.0f ? 127.0f / mx : 0.0f;
      int32_t sum = 0;
      for (int64_t k = k0; k < k1; ++k) {
        // |a · r| ≤ 127 (+ one rounding), so the code needs no clamp
        const int32_t v = static_cast<int32_t>(std::nearbyint(row[k] * r));  // the default mode: to nearest even
        q[k - k0] = static_cast<int8_t>(v);
        sum += v;
      }
      sqa[i * kb + b] = sum;
      for (int64_t k = k1 - k0; k < p.block; ++k) q[k] = 0;
    }
  }
}

void matmul(const float* a, const Params& p, float* y, int threads) {
  const Fns fns = select(select_kernel("nbits_a8", "f32s4->f32")->isa);
  const int64_t kb = (p.k + p.block - 1) / p.block, ntiles = (p.n + 15) / 16;
  const int64_t panels = (ntiles + 1) / 2;
  const int64_t lda = kb * p.block, wb_stride = p.block * 16 * (p.bits / 4);
  std::vector<int8_t> qa(static_cast<size_t>(p.m * lda));
  std::vector<float> sa(static_cast<size_t>(p.m * kb));
  std::vector<int32_t> sqa(static_cast<size_t>(p.m * kb));
  qgemm::parallel_ranges(threads, p.m, 8,
                         [&](int64_t r0, int64_t r1) { fns.quantize(a, p, r0, r1, qa.data(), sa.data(), sqa.data()); });
  // Panels of 32 columns: a panel's weights (K · 16 bytes) stay in cache over all rows.
  qgemm::parallel_ranges(threads, panels, 1, [&](int64_t c0, int64_t c1) {
    alignas(64) float t[4 * 32];
    for (int64_t pc = c0; pc < c1; ++pc) {
      const int64_t tile = pc * 2;
      const int nt = tile + 1 < ntiles ? 2 : 1;
      const int64_t col0 = tile * 16;
      for (int64_t i = 0; i < p.m; i += 4) {
        const int rows = static_cast<int>(p.m - i < 4 ? p.m - i : 4);
        PanelArgs args{qa.data() + i * lda,
                       lda,
                       sa.data() + i * kb,
                       sqa.data() + i * kb,
                       kb,
                       p.block / 4,
                       p.packed + pc * kb * wb_stride,
                       wb_stride,
                       p.zp + pc * kb * 32,
                       p.sw + pc * kb * 32,
                       t,
                       p.bits};
        fns.panel(args, rows, nt);
        const int64_t cols = p.n - col0 < nt * 16 ? p.n - col0 : nt * 16;
        for (int r = 0; r < rows; ++r) {
          float* yr = y + (i + r) * p.n + col0;
          if (p.bias != nullptr) {
            for (int64_t c = 0; c < cols; ++c) yr[c] = t[r * 32 + c] + p.bias[col0 + c];
          } else {
            for (int64_t c = 0; c < cols; ++c) yr[c] = t[r * 32 + c];
          }
        }
      }
    }
  });
}

}  // namespace nbits_a8
}  // namespace quanta
