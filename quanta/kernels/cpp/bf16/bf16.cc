// bf16 driver and portable micro-kernel (bf16.h).
#include "bf16/bf16.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "dispatch.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace bf16 {

namespace {
inline float widen(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

constexpr int kMR = 4, kNR = 32;

MicroKernel select() {
  if (avx512bf16_active()) return ukernel_avx512bf16;
  if (active_isa() == Isa::kAvx512Vnni) return ukernel_avx512;
  return ukernel_portable;
}
}  // namespace

void ukernel_portable(const uint16_t* a, int64_t lda, int mr, int64_t k2, const uint16_t* b, float* c) {
  for (int r = 0; r < mr; ++r) {
    float acc[kNR] = {0};
    for (int64_t p = 0; p < k2; ++p) {
      const float a0 = widen(a[r * lda + 2 * p]), a1 = widen(a[r * lda + 2 * p + 1]);
      for (int blk = 0; blk < 2; ++blk) {
        const uint16_t* bp = b + blk * k2 * 32 + p * 32;
        for (int j = 0; j < 16; ++j) {
          float& s = acc[blk * 16 + j];
          s = std::fma(a0, widen(bp[2 * j]), s);
          s = std::fma(a1, widen(bp[2 * j + 1]), s);
        }
      }
    }
    for (int j = 0; j < kNR; ++j) c[r * kNR + j] = acc[j];
  }
}

const char* path_name() {
  if (avx512bf16_active()) return "bf16";
  if (active_isa() == Isa::kAvx512Vnni) return "avx512";
  return "portable";
}

void matmul(const float* a, int64_t m, int64_t k, const uint16_t* packed, int64_t n, const float* bias, float* y,
            int threads) {
  const MicroKernel uk = select();
  const int64_t k2 = (k + 1) / 2, lda = 2 * k2, nb32 = (n + kNR - 1) / kNR;
  qgemm::parallel_ranges(threads, m, 8 * kMR, [&](int64_t r_begin, int64_t r_end) {
    std::vector<uint16_t> panel(static_cast<size_t>(kMR * lda));
    float tile[kMR * kNR];
    for (int64_t r0 = r_begin; r0 < r_end; r0 += kMR) {
      const int mr = static_cast<int>(r_end - r0 < kMR ? r_end - r0 : kMR);
      for (int r = 0; r < mr; ++r) {
        const float* src = a + (r0 + r) * k;
        uint16_t* dst = panel.data() + r * lda;
        for (int64_t i = 0; i < k; ++i) dst[i] = to_bf16(src[i]);
        for (int64_t i = k; i < lda; ++i) dst[i] = 0;
      }
      for (int64_t nb = 0; nb < nb32; ++nb) {
        uk(panel.data(), lda, mr, k2, packed + nb * 2 * k2 * 32, tile);
        const int64_t ncols = n - nb * kNR < kNR ? n - nb * kNR : kNR;
        for (int r = 0; r < mr; ++r) {
          for (int64_t j = 0; j < ncols; ++j) {
            float v = tile[r * kNR + j];
            if (bias) v += bias[nb * kNR + j];
            y[(r0 + r) * n + nb * kNR + j] = v;
          }
        }
      }
    }
  });
}

}  // namespace bf16
}  // namespace quanta
