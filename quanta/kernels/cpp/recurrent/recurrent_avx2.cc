// AVX2 elementwise steps of the recurrent kernels, 8 lanes per step, the tail lanes by
// recurrent_scalar.h; each lane computes the scalar operations in their order (the Horner
// steps are vfmadd, one rounding, as std::fma).
//
// NaN: vminps / vmaxps return their SECOND operand when either is NaN, so the clamps are
// max(lo, x) then min(hi, t): a NaN stays NaN, as np.maximum / np.minimum keep it.
#include <immintrin.h>

#include <cstdint>

#include "recurrent/recurrent.h"
#include "recurrent/mlas_simd.h"
#include "recurrent/recurrent_scalar.h"

namespace quanta {
namespace recurrent {
namespace {

void min_max(const float* x, int64_t n, float* lo, float* hi) {
  __m256 mn = _mm256_setzero_ps(), mx = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    mn = _mm256_min_ps(mn, v);
    mx = _mm256_max_ps(mx, v);
  }
  alignas(32) float a[8], b[8];
  _mm256_store_ps(a, mn);
  _mm256_store_ps(b, mx);
  float l = 0.0f, h = 0.0f;
  for (int k = 0; k < 8; ++k) {
    l = a[k] < l ? a[k] : l;
    h = b[k] > h ? b[k] : h;
  }
  for (; i < n; ++i) {
    l = x[i] < l ? x[i] : l;
    h = x[i] > h ? x[i] : h;
  }
  *lo = l;
  *hi = h;
}

void quantize_u8(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  const __m256 s = _mm256_set1_ps(scale), z = _mm256_set1_ps(zp);
  const __m256 zero = _mm256_setzero_ps(), top = _mm256_set1_ps(255.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 r = _mm256_round_ps(_mm256_div_ps(_mm256_loadu_ps(x + i), s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm256_min_ps(top, _mm256_max_ps(zero, _mm256_add_ps(r, z)));
    const __m256i v = _mm256_cvtps_epi32(r);
    const __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(q + i), _mm_packus_epi16(w, w));
  }
  for (; i < n; ++i) q[i] = quantize_one(x[i], scale, zp);
}

void lstm_row(const float* p, const float* xg, const float* bias, const float* peephole, float clip, bool input_forget,
              int64_t H, float* c, float* h) {
  int64_t j = 0;
  for (; j + 8 <= H; j += 8) {
    const __m256 cp = _mm256_loadu_ps(c + j);
    __m256 gi = _mm256_add_ps(_mm256_loadu_ps(p + j), _mm256_loadu_ps(xg + j));
    if (peephole) gi = _mm256_add_ps(gi, _mm256_mul_ps(cp, _mm256_loadu_ps(peephole + j)));
    if (bias) gi = _mm256_add_ps(gi, _mm256_loadu_ps(bias + j));
    const __m256 i = logistic8(clamp8(gi, -clip, clip));
    __m256 f;
    if (input_forget) {
      f = _mm256_sub_ps(_mm256_set1_ps(1.0f), i);
    } else {
      __m256 gf = _mm256_add_ps(_mm256_loadu_ps(p + 2 * H + j), _mm256_loadu_ps(xg + 2 * H + j));
      if (peephole) gf = _mm256_add_ps(gf, _mm256_mul_ps(cp, _mm256_loadu_ps(peephole + 2 * H + j)));
      if (bias) gf = _mm256_add_ps(gf, _mm256_loadu_ps(bias + 2 * H + j));
      f = logistic8(clamp8(gf, -clip, clip));
    }
    __m256 gc = _mm256_add_ps(_mm256_loadu_ps(p + 3 * H + j), _mm256_loadu_ps(xg + 3 * H + j));
    if (bias) gc = _mm256_add_ps(gc, _mm256_loadu_ps(bias + 3 * H + j));
    const __m256 g = tanh8(clamp8(gc, -clip, clip));
    const __m256 cn = _mm256_add_ps(_mm256_mul_ps(cp, f), _mm256_mul_ps(i, g));
    __m256 go = _mm256_add_ps(_mm256_loadu_ps(p + H + j), _mm256_loadu_ps(xg + H + j));
    if (peephole) go = _mm256_add_ps(go, _mm256_mul_ps(cn, _mm256_loadu_ps(peephole + H + j)));
    if (bias) go = _mm256_add_ps(go, _mm256_loadu_ps(bias + H + j));
    const __m256 o = logistic8(clamp8(go, -clip, clip));
    _mm256_storeu_ps(h + j, _mm256_mul_ps(tanh8(cn), o));
    _mm256_storeu_ps(c + j, cn);
  }
  for (; j < H; ++j) lstm_lane(p, xg, bias, peephole, clip, input_forget, H, j, c, h);
}

}  // namespace

extern const Kernels kKernelsAvx2 = {min_max, quantize_u8, lstm_row};

}  // namespace recurrent
}  // namespace quanta
