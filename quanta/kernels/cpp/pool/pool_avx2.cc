// Pooling plane kernels (pool_kernels.h) with AVX2 row operations (scalar tails from
// GenericRows). The float row operations perform GenericRows' float32 operations lane by
// lane (same order, no FMA); integer sums and maxima are exact.
#include <immintrin.h>

#include <cstdint>
#include <limits>
#include <type_traits>

#include "pool/max_pool_f32_simd.h"
#include "pool/pool_kernels.h"
#include "simd.h"

namespace quanta {
namespace pool {
namespace {

// The even bytes of 16 (or 32) loaded bytes: the low byte of each 16-bit word.
inline __m128i even_bytes(__m128i v) {
  const __m128i lo = _mm_and_si128(v, _mm_set1_epi16(0x00ff));
  return _mm_packus_epi16(lo, lo);  // words are 0..255: no saturation
}
inline __m128i even_bytes(__m256i v) {
  const __m256i lo = _mm256_and_si256(v, _mm256_set1_epi16(0x00ff));
  const __m256i p = _mm256_packus_epi16(lo, lo);  // per 128-bit lane: 8 evens, twice
  return _mm256_castsi256_si128(_mm256_permute4x64_epi64(p, 0x08));
}

struct Avx2Rows : GenericRows {
  // Σ x with vpsadbw (int8: x ^ 0x80 = x + 128 as uint8, then − 128·count), modulo 2^32.
  template <typename T>
  static uint32_t sum(const T* x, int64_t n) {
    const __m256i zero = _mm256_setzero_si256();
    const __m256i flip = _mm256_set1_epi8(std::is_same_v<T, int8_t> ? static_cast<char>(0x80) : 0);
    __m256i acc = zero;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
      const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i)), flip);
      acc = _mm256_add_epi64(acc, _mm256_sad_epu8(v, zero));
    }
    alignas(32) uint64_t lanes[4];
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc);
    uint64_t s = lanes[0] + lanes[1] + lanes[2] + lanes[3];
    if (std::is_same_v<T, int8_t>) s -= 128u * static_cast<uint64_t>(i);
    return static_cast<uint32_t>(s) + GenericRows::sum(x + i, n - i);
  }

  template <typename T>
  static void max(T* y, const T* x, int64_t n, int64_t s) {
    int64_t i = 0;
    if (s == 1) {
      for (; i + 32 <= n; i += 32) {
        auto* py = reinterpret_cast<__m256i*>(y + i);
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
        _mm256_storeu_si256(py, simd::I8x32::max<T>(_mm256_loadu_si256(py), v));
      }
    } else if (s == 2) {
      // 16 outputs from 32 loaded bytes; the last byte loaded must be one that exists:
      // 2i + 31 <= 2(n − 1), i.e. i + 17 <= n.
      for (; i + 17 <= n; i += 16) {
        auto* py = reinterpret_cast<__m128i*>(y + i);
        const __m128i v = even_bytes(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + 2 * i)));
        _mm_storeu_si128(py, simd::I8x16::max<T>(_mm_loadu_si128(py), v));
      }
    }
    GenericRows::max(y + i, x + i * s, n - i, s);
  }

  // 32 (then 16) channels a vector held in a register over every tap, stored once; the
  // last channels below 16 by GenericRows
  template <typename T>
  static void max_windows_nhwc(T* y, const T* x, int64_t pixels, int64_t pixel_step, int64_t rows, int64_t row_step,
                               int64_t cols, int64_t col_step, int64_t channels) {
    const char qmin = static_cast<char>(std::numeric_limits<T>::min());
    for (int64_t q = 0; q < pixels; ++q) {
      const T* xq = x + q * pixel_step;
      T* yq = y + q * channels;
      int64_t c = 0;
      for (; c + 32 <= channels; c += 32) {
        __m256i acc = _mm256_set1_epi8(qmin);
        for (int64_t i = 0; i < rows; ++i) {
          const T* p = xq + i * row_step + c;
          for (int64_t j = 0; j < cols; ++j) {
            acc = simd::I8x32::max<T>(acc, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + j * col_step)));
          }
        }
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(yq + c), acc);
      }
      for (; c + 16 <= channels; c += 16) {
        __m128i acc = _mm_set1_epi8(qmin);
        for (int64_t i = 0; i < rows; ++i) {
          const T* p = xq + i * row_step + c;
          for (int64_t j = 0; j < cols; ++j) {
            acc = simd::I8x16::max<T>(acc, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * col_step)));
          }
        }
        _mm_storeu_si128(reinterpret_cast<__m128i*>(yq + c), acc);
      }
      if (c < channels)
        GenericRows::max_windows_nhwc(yq + c, xq + c, 1, 0, rows, row_step, cols, col_step, channels - c);
    }
  }

  template <typename T>
  static void add_dequantized(float* t, const T* x, int64_t n, int64_t s, float sx, int32_t zx) {
    const __m256 vsx = _mm256_set1_ps(sx);
    const __m256i vzx = _mm256_set1_epi32(zx);
    int64_t i = 0;
    if (s == 1) {
      for (; i + 8 <= n; i += 8) {
        const __m128i bytes = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(x + i));
        const __m256 d =
            _mm256_mul_ps(vsx, _mm256_cvtepi32_ps(_mm256_sub_epi32(simd::I32x8::widen_bytes<T>(bytes), vzx)));
        _mm256_storeu_ps(t + i, _mm256_add_ps(_mm256_loadu_ps(t + i), d));
      }
    } else if (s == 2) {
      for (; i + 9 <= n; i += 8) {  // 16 bytes loaded: 2i + 15 <= 2(n − 1)
        const __m128i bytes = even_bytes(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + 2 * i)));
        const __m256 d =
            _mm256_mul_ps(vsx, _mm256_cvtepi32_ps(_mm256_sub_epi32(simd::I32x8::widen_bytes<T>(bytes), vzx)));
        _mm256_storeu_ps(t + i, _mm256_add_ps(_mm256_loadu_ps(t + i), d));
      }
    }
    GenericRows::add_dequantized(t + i, x + i * s, n - i, s, sx, zx);
  }

  template <typename T>
  static void finish_average(T* y, const float* t, const float* count, int64_t n, float sy, float zy) {
    const __m256 lo = _mm256_set1_ps(static_cast<float>(std::numeric_limits<T>::min()));
    const __m256 hi = _mm256_set1_ps(static_cast<float>(std::numeric_limits<T>::max()));
    const __m256 vsy = _mm256_set1_ps(sy), vzy = _mm256_set1_ps(zy);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 avg = _mm256_div_ps(_mm256_loadu_ps(t + i), _mm256_loadu_ps(count + i));
      __m256 v = _mm256_add_ps(_mm256_div_ps(avg, vsy), vzy);
      v = _mm256_blendv_ps(lo, v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> qmin
      v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm256_min_ps(_mm256_max_ps(v, lo), hi);
      const __m256i q = _mm256_cvtps_epi32(v);
      const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
      const __m128i b8 = std::is_same_v<T, uint8_t> ? _mm_packus_epi16(w16, w16) : _mm_packs_epi16(w16, w16);
      _mm_storel_epi64(reinterpret_cast<__m128i*>(y + i), b8);
    }
    GenericRows::finish_average(y + i, t + i, count + i, n - i, sy, zy);
  }
};

}  // namespace

const Kernels kKernelsAvx2 = make_kernels<Avx2Rows>(max_plane_f32<simd::F32x8>);

}  // namespace pool
}  // namespace quanta
