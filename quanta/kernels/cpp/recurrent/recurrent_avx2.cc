// AVX2 elementwise steps of the recurrent kernels, 8 lanes per step, the tail lanes by
// recurrent_scalar.h; each lane computes the scalar operations in their order (the Horner
// steps are vfmadd, one rounding, as std::fma).
//
// NaN: vminps / vmaxps return their SECOND operand when either is NaN, so the clamps are
// max(lo, x) then min(hi, t): a NaN stays NaN, as np.maximum / np.minimum keep it.
#include <immintrin.h>

#include <cstdint>

#include "recurrent/recurrent.h"
#include "float_ops/float_ops_scalar.h"
#include "float_ops/float_ops_simd.h"
#include "recurrent/gru_simd.h"
#include "recurrent/lstm_simd.h"
#include "recurrent/ort_gru_simd.h"
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

// The LSTM row step with the gate functions Acts on whole vectors, the tail lanes by
// lstm_lane with the same functions (Sigmoid, Tanh) one lane at a time.
template <class Acts, float (*Sigmoid)(float), float (*Tanh)(float)>
void lstm_row_with(const float* p, const float* xg, const float* bias, const float* peephole, float clip,
                   bool input_forget, int64_t H, float* c, float* h) {
  using T = simd::F32x8;
  int64_t j = 0;
  for (; j + 8 <= H; j += 8) {
    __m256 cn, hn;
    lstm_lanes<T, Acts>([](const float* a) { return _mm256_loadu_ps(a); }, p, xg, bias, peephole, clip, input_forget, H,
                        j, c, &cn, &hn);
    _mm256_storeu_ps(h + j, hn);
    _mm256_storeu_ps(c + j, cn);
  }
  for (; j < H; ++j) lstm_lane<Sigmoid, Tanh>(p, xg, bias, peephole, clip, input_forget, H, j, c, h);
}

using OnnxActs8 = OnnxActs<simd::F32x8>;
constexpr auto lstm_row = lstm_row_with<MlasActs<simd::F32x8>, logistic_one, tanh_one>;
constexpr auto onnx_lstm_row = lstm_row_with<OnnxActs8, float_ops::sigmoid_one, float_ops::tanh_one>;

void onnx_gru_zr(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr) {
  using T = simd::F32x8;
  const auto ld = [](const float* a) { return _mm256_loadu_ps(a); };
  int64_t n = 0;
  for (; n + 8 <= count; n += 8) _mm256_storeu_ps(zr + n, gru_zr_lanes<T, OnnxActs8>(ld, xg, hg, bias, clip, n));
  for (; n < count; ++n) gru_zr_lane<float_ops::sigmoid_one>(xg, hg, bias, clip, n, zr);
}

void onnx_gru_h(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                const float* bias_h, float clip, bool lbr, int64_t H, float* h) {
  using T = simd::F32x8;
  const auto ld = [](const float* a) { return _mm256_loadu_ps(a); };
  int64_t j = 0;
  for (; j + 8 <= H; j += 8) {
    _mm256_storeu_ps(h + j, gru_h_lanes<T, OnnxActs8>(ld, xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h));
  }
  for (; j < H; ++j) gru_h_lane<float_ops::tanh_one>(xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h);
}

// quanta::DynamicQuantizeGRU's gates: the GRU steps above with MLAS's logistic and tanh.
using MlasActs8 = MlasActs<simd::F32x8>;

void mlas_gru_zr(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr) {
  using T = simd::F32x8;
  const auto ld = [](const float* a) { return _mm256_loadu_ps(a); };
  int64_t n = 0;
  for (; n + 8 <= count; n += 8) _mm256_storeu_ps(zr + n, gru_zr_lanes<T, MlasActs8>(ld, xg, hg, bias, clip, n));
  for (; n < count; ++n) gru_zr_lane<logistic_one>(xg, hg, bias, clip, n, zr);
}

void mlas_gru_h(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                const float* bias_h, float clip, bool lbr, int64_t H, float* h) {
  using T = simd::F32x8;
  const auto ld = [](const float* a) { return _mm256_loadu_ps(a); };
  int64_t j = 0;
  for (; j + 8 <= H; j += 8) {
    _mm256_storeu_ps(h + j, gru_h_lanes<T, MlasActs8>(ld, xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h));
  }
  for (; j < H; ++j) gru_h_lane<tanh_one>(xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h);
}

void ort_gru_reset(const float* zr_r, const float* br, float clip, const float* src, int64_t H, float* out) {
  using T = simd::F32x8;
  const auto ld = [](const float* a) { return _mm256_loadu_ps(a); };
  int64_t j = 0;
  for (; j + 8 <= H; j += 8) _mm256_storeu_ps(out + j, ort_gru_reset_lanes<T>(ld, zr_r, br, clip, src, j));
  for (; j < H; ++j) ort_gru_reset_lane(zr_r, br, clip, src, j, out);
}

void ort_gru_update(const float* zr_z, const float* bz, const float* a0, const float* a1, const float* bh, float clip,
                    int64_t H, float* h) {
  using T = simd::F32x8;
  const auto ld = [](const float* a) { return _mm256_loadu_ps(a); };
  int64_t j = 0;
  for (; j + 8 <= H; j += 8) _mm256_storeu_ps(h + j, ort_gru_update_lanes<T>(ld, zr_z, bz, a0, a1, bh, clip, j, h));
  for (; j < H; ++j) ort_gru_update_lane(zr_z, bz, a0, a1, bh, clip, j, h);
}

}  // namespace

extern const Kernels kKernelsAvx2 = {min_max,    quantize_u8,   lstm_row,       onnx_lstm_row, onnx_gru_zr,
                                     onnx_gru_h, ort_gru_reset, ort_gru_update, mlas_gru_zr,   mlas_gru_h};

}  // namespace recurrent
}  // namespace quanta
