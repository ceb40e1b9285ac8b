// AVX-512 elementwise steps of the recurrent kernels, 16 lanes per step with masked
// tails; each lane computes recurrent_scalar.h's operations in its order (the Horner
// steps are vfmadd, one rounding, as std::fma).
//
// NaN: vminps / vmaxps return their SECOND operand when either is NaN, so the clamps are
// max(lo, x) then min(hi, t): a NaN stays NaN, as np.maximum / np.minimum keep it.
#include <immintrin.h>

#include <cstdint>

#include "recurrent/recurrent.h"
#include "float_ops/float_ops_simd.h"
#include "recurrent/gru_simd.h"
#include "recurrent/lstm_simd.h"
#include "recurrent/ort_gru_simd.h"
#include "recurrent/recurrent_scalar.h"

namespace quanta {
namespace recurrent {
namespace {

inline __mmask16 tail_mask(int64_t left) {
  return left >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << left) - 1u);
}

void min_max(const float* x, int64_t n, float* lo, float* hi) {
  __m512 mn = _mm512_set1_ps(0.0f), mx = _mm512_set1_ps(0.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    mn = _mm512_min_ps(mn, v);
    mx = _mm512_max_ps(mx, v);
  }
  if (i < n) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);  // masked-off lanes are 0: inside [lo, hi]
    mn = _mm512_min_ps(mn, v);
    mx = _mm512_max_ps(mx, v);
  }
  // Starting from 0 gives min(0, min x) and max(0, max x) directly; a −0 minimum reads
  // as 0 below, as the twin's min(0, −0) keeps its first operand.
  const float a = _mm512_reduce_min_ps(mn), b = _mm512_reduce_max_ps(mx);
  *lo = a < 0.0f ? a : 0.0f;
  *hi = b > 0.0f ? b : 0.0f;
}

void quantize_u8(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  const __m512 s = _mm512_set1_ps(scale), z = _mm512_set1_ps(zp);
  const __m512 zero = _mm512_setzero_ps(), top = _mm512_set1_ps(255.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 m = tail_mask(n - i);
    const __m512 v = _mm512_maskz_loadu_ps(m, x + i);
    __m512 r = _mm512_roundscale_ps(_mm512_div_ps(v, s), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    r = _mm512_min_ps(top, _mm512_max_ps(zero, _mm512_add_ps(r, z)));
    _mm_mask_storeu_epi8(q + i, m, _mm512_cvtusepi32_epi8(_mm512_cvtps_epi32(r)));
  }
}

// The LSTM row step with the gate functions Acts, masked tails.
template <class Acts>
void lstm_row_with(const float* p, const float* xg, const float* bias, const float* peephole, float clip,
                   bool input_forget, int64_t H, float* c, float* h) {
  using T = simd::F32x16;
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 m = tail_mask(H - j);
    __m512 cn, hn;
    lstm_lanes<T, Acts>([m](const float* a) { return _mm512_maskz_loadu_ps(m, a); }, p, xg, bias, peephole, clip,
                        input_forget, H, j, c, &cn, &hn);
    _mm512_mask_storeu_ps(h + j, m, hn);
    _mm512_mask_storeu_ps(c + j, m, cn);
  }
}

using OnnxActs16 = OnnxActs<simd::F32x16>;
constexpr auto lstm_row = lstm_row_with<MlasActs<simd::F32x16>>;
constexpr auto onnx_lstm_row = lstm_row_with<OnnxActs16>;

void onnx_gru_zr(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr) {
  using T = simd::F32x16;
  for (int64_t n = 0; n < count; n += 16) {
    const __mmask16 m = tail_mask(count - n);
    const auto ld = [m](const float* a) { return _mm512_maskz_loadu_ps(m, a); };
    _mm512_mask_storeu_ps(zr + n, m, gru_zr_lanes<T, OnnxActs16>(ld, xg, hg, bias, clip, n));
  }
}

void onnx_gru_h(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                const float* bias_h, float clip, bool lbr, int64_t H, float* h) {
  using T = simd::F32x16;
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 m = tail_mask(H - j);
    const auto ld = [m](const float* a) { return _mm512_maskz_loadu_ps(m, a); };
    _mm512_mask_storeu_ps(h + j, m, gru_h_lanes<T, OnnxActs16>(ld, xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h));
  }
}

// quanta::DynamicQuantizeGRU's gates: the GRU steps above with MLAS's logistic and tanh.
using MlasActs16 = MlasActs<simd::F32x16>;

void mlas_gru_zr(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr) {
  using T = simd::F32x16;
  for (int64_t n = 0; n < count; n += 16) {
    const __mmask16 m = tail_mask(count - n);
    const auto ld = [m](const float* a) { return _mm512_maskz_loadu_ps(m, a); };
    _mm512_mask_storeu_ps(zr + n, m, gru_zr_lanes<T, MlasActs16>(ld, xg, hg, bias, clip, n));
  }
}

void mlas_gru_h(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                const float* bias_h, float clip, bool lbr, int64_t H, float* h) {
  using T = simd::F32x16;
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 m = tail_mask(H - j);
    const auto ld = [m](const float* a) { return _mm512_maskz_loadu_ps(m, a); };
    _mm512_mask_storeu_ps(h + j, m, gru_h_lanes<T, MlasActs16>(ld, xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h));
  }
}

void ort_gru_reset(const float* zr_r, const float* br, float clip, const float* src, int64_t H, float* out) {
  using T = simd::F32x16;
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 m = tail_mask(H - j);
    const auto ld = [m](const float* a) { return _mm512_maskz_loadu_ps(m, a); };
    _mm512_mask_storeu_ps(out + j, m, ort_gru_reset_lanes<T>(ld, zr_r, br, clip, src, j));
  }
}

void ort_gru_update(const float* zr_z, const float* bz, const float* a0, const float* a1, const float* bh, float clip,
                    int64_t H, float* h) {
  using T = simd::F32x16;
  for (int64_t j = 0; j < H; j += 16) {
    const __mmask16 m = tail_mask(H - j);
    const auto ld = [m](const float* a) { return _mm512_maskz_loadu_ps(m, a); };
    _mm512_mask_storeu_ps(h + j, m, ort_gru_update_lanes<T>(ld, zr_z, bz, a0, a1, bh, clip, j, h));
  }
}

}  // namespace

extern const Kernels kKernelsAvx512Vnni = {min_max,    quantize_u8,   lstm_row,       onnx_lstm_row, onnx_gru_zr,
                                           onnx_gru_h, ort_gru_reset, ort_gru_update, mlas_gru_zr,   mlas_gru_h};

}  // namespace recurrent
}  // namespace quanta
