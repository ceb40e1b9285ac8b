// Pooling plane kernels (pool_kernels.h) with AVX-512 row operations: masked loads and
// stores instead of scalar tails (rows of pooling outputs are short: 7 .. 112). The float
// row operations perform GenericRows' float32 operations lane by lane (same order, no FMA);
// integer sums and maxima are exact.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "pool/max_pool_f32_simd.h"
#include "pool/pool_kernels.h"
#include "simd.h"

namespace quanta {
namespace pool {
namespace {

inline __mmask64 mask64(int64_t n) { return n >= 64 ? ~__mmask64{0} : (__mmask64{1} << n) - 1; }
inline __mmask32 mask32(int64_t n) { return n >= 32 ? ~__mmask32{0} : (__mmask32{1} << n) - 1; }
inline __mmask16 mask16(int64_t n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1);
}

struct Avx512Rows : GenericRows {
  // Σ x with vpsadbw (int8: x ^ 0x80 = x + 128 as uint8, then − 128·n), modulo 2^32.
  template <typename T>
  static uint32_t sum(const T* x, int64_t n) {
    const __m512i zero = _mm512_setzero_si512();
    const __m512i flip = _mm512_set1_epi8(std::is_same_v<T, int8_t> ? static_cast<char>(0x80) : 0);
    __m512i acc = zero;
    for (int64_t i = 0; i < n; i += 64) {
      const __mmask64 k = mask64(n - i);
      const __m512i v = _mm512_maskz_mov_epi8(k, _mm512_xor_si512(_mm512_maskz_loadu_epi8(k, x + i), flip));
      acc = _mm512_add_epi64(acc, _mm512_sad_epu8(v, zero));
    }
    uint64_t s = static_cast<uint64_t>(_mm512_reduce_add_epi64(acc));
    if (std::is_same_v<T, int8_t>) s -= 128u * static_cast<uint64_t>(n);
    return static_cast<uint32_t>(s);
  }

  // Full vectors use plain loads and stores, only the tail is masked: a masked store does
  // not forward to the next tap's load of the same row (a stall of ~20 cycles per tap).
  template <typename T>
  static void max(T* y, const T* x, int64_t n, int64_t s) {
    if (s == 1) {
      int64_t i = 0;
      for (; i + 64 <= n; i += 64) {
        auto* py = reinterpret_cast<__m512i*>(y + i);
        _mm512_storeu_si512(py, simd::I8x64::max<T>(_mm512_loadu_si512(py), _mm512_loadu_si512(x + i)));
      }
      if (i < n) {
        const __mmask64 k = mask64(n - i);
        const __m512i v = simd::I8x64::max<T>(_mm512_maskz_loadu_epi8(k, y + i), _mm512_maskz_loadu_epi8(k, x + i));
        _mm512_mask_storeu_epi8(y + i, k, v);
      }
    } else if (s == 2) {
      // 32 outputs from 63 input bytes: vpmovwb keeps the low (even) byte of each word.
      int64_t i = 0;
      for (; i + 33 <= n; i += 32) {  // 64 bytes loaded: 2i + 63 <= 2(n − 1)
        auto* py = reinterpret_cast<__m256i*>(y + i);
        const __m256i v = _mm512_cvtepi16_epi8(_mm512_loadu_si512(x + 2 * i));
        _mm256_storeu_si256(py, simd::I8x32::max<T>(_mm256_loadu_si256(py), v));
      }
      if (i < n) {
        const int64_t left = n - i;
        const __m512i in = _mm512_maskz_loadu_epi8(mask64(2 * left - 1), x + 2 * i);
        const __mmask32 k = mask32(left);
        const __m256i v = simd::I8x32::max<T>(_mm256_maskz_loadu_epi8(k, y + i), _mm512_cvtepi16_epi8(in));
        _mm256_mask_storeu_epi8(y + i, k, v);
      }
    } else {
      GenericRows::max(y, x, n, s);
    }
  }

  // 64 channels a vector held in a register over every tap, stored once (masked tail)
  template <typename T>
  static void max_windows_nhwc(T* y, const T* x, int64_t pixels, int64_t pixel_step, int64_t rows, int64_t row_step,
                               int64_t cols, int64_t col_step, int64_t channels) {
    const __m512i qmin = _mm512_set1_epi8(static_cast<char>(std::numeric_limits<T>::min()));
    for (int64_t q = 0; q < pixels; ++q) {
      const T* xq = x + q * pixel_step;
      T* yq = y + q * channels;
      for (int64_t c = 0; c < channels; c += 64) {
        const __mmask64 k = mask64(channels - c);
        __m512i acc = qmin;
        for (int64_t i = 0; i < rows; ++i) {
          const T* p = xq + i * row_step + c;
          for (int64_t j = 0; j < cols; ++j) {
            acc = simd::I8x64::max<T>(acc, _mm512_maskz_loadu_epi8(k, p + j * col_step));
          }
        }
        _mm512_mask_storeu_epi8(yq + c, k, acc);
      }
    }
  }

  template <typename T>
  static void add_dequantized(float* t, const T* x, int64_t n, int64_t s, float sx, int32_t zx) {
    if (s != 1 && s != 2) return GenericRows::add_dequantized(t, x, n, s, sx, zx);
    const __m512 vsx = _mm512_set1_ps(sx);
    const __m512i vzx = _mm512_set1_epi32(zx);
    for (int64_t i = 0; i < n; i += 16) {
      const int64_t left = n - i;
      __m128i bytes;
      if (s == 1) {
        bytes = left >= 16 ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i))
                           : _mm_maskz_loadu_epi8(mask16(left), x + i);
      } else {
        bytes = _mm256_cvtepi16_epi8(_mm256_maskz_loadu_epi8(mask32(2 * left - 1), x + 2 * i));
      }
      const __m512 d =
          _mm512_mul_ps(vsx, _mm512_cvtepi32_ps(_mm512_sub_epi32(simd::I32x16::widen_bytes<T>(bytes), vzx)));
      if (left >= 16) {  // plain store: it forwards to the next tap's load (a masked one does not)
        _mm512_storeu_ps(t + i, _mm512_add_ps(_mm512_loadu_ps(t + i), d));
      } else {
        const __mmask16 k = mask16(left);
        _mm512_mask_storeu_ps(t + i, k, _mm512_add_ps(_mm512_maskz_loadu_ps(k, t + i), d));
      }
    }
  }

  template <typename T>
  static void finish_average(T* y, const float* t, const float* count, int64_t n, float sy, float zy) {
    const __m512 lo = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::min()));
    const __m512 hi = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::max()));
    const __m512 vsy = _mm512_set1_ps(sy), vzy = _mm512_set1_ps(zy);
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 k = mask16(n - i);
      const __m512 avg = _mm512_maskz_div_ps(k, _mm512_maskz_loadu_ps(k, t + i), _mm512_maskz_loadu_ps(k, count + i));
      __m512 v = _mm512_add_ps(_mm512_maskz_div_ps(k, avg, vsy), vzy);
      v = _mm512_mask_mov_ps(lo, _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);  // NaN -> qmin
      v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
      const __m512i q = _mm512_cvtps_epi32(v);
      if constexpr (std::is_same_v<T, uint8_t>) {
        _mm512_mask_cvtusepi32_storeu_epi8(y + i, k, q);
      } else {
        _mm512_mask_cvtsepi32_storeu_epi8(y + i, k, q);
      }
    }
  }
};

// Bits j of v moved to bits 2j (lane j of a stride-2 gather reads byte 2j).
inline uint32_t spread16(uint32_t v) {
  v = (v | (v << 8)) & 0x00ff00ffu;
  v = (v | (v << 4)) & 0x0f0f0f0fu;
  v = (v | (v << 2)) & 0x33333333u;
  return (v | (v << 1)) & 0x55555555u;
}
inline uint64_t spread32(uint64_t v) {
  v = (v | (v << 16)) & 0x0000ffff0000ffffull;
  v = (v | (v << 8)) & 0x00ff00ff00ff00ffull;
  v = (v | (v << 4)) & 0x0f0f0f0f0f0f0f0full;
  v = (v | (v << 2)) & 0x3333333333333333ull;
  return (v | (v << 1)) & 0x5555555555555555ull;
}
// Lanes [l, h) of a vector (0 <= l < h <= 64).
inline uint64_t lane_bits(int64_t l, int64_t h) {
  const uint64_t upto_h = h >= 64 ? ~uint64_t{0} : (uint64_t{1} << h) - 1;
  return upto_h & ~((uint64_t{1} << l) - 1);
}

// Lane masks of every (output vector, kw) pair: which outputs of vector b have tap kw
// inside the input row (they do not depend on the output row, so they are computed once
// per plane). For stride 2 the byte mask of the load is the lane mask spread to even bits.
struct TapMasks {
  static constexpr int64_t kMaxVectors = 32;
  static constexpr int64_t kMaxTaps = 16;
  uint64_t lanes[kMaxVectors][kMaxTaps];
  uint64_t bytes[kMaxVectors][kMaxTaps];
  static bool fits(const Geometry2d& g, int64_t v) {
    return g.s_w <= 2 && g.k_w <= kMaxTaps && (g.out_w + v - 1) / v <= kMaxVectors;
  }
  TapMasks(const Geometry2d& g, int64_t v, int64_t d_w) {
    for (int64_t kw = 0; kw < g.k_w; ++kw) {
      int64_t lo, hi;
      valid_outputs(g.out_w, g.s_w, g.pad_l, kw * d_w, g.w, &lo, &hi);
      for (int64_t b = 0, ob = 0; ob < g.out_w; ++b, ob += v) {
        const int64_t l = std::max(lo, ob), h = std::min(hi, std::min(ob + v, g.out_w));
        const uint64_t m = h > l ? lane_bits(l - ob, h - ob) : 0;
        lanes[b][kw] = m;
        bytes[b][kw] = g.s_w == 1 ? m : (v == 32 ? spread32(m) : spread16(static_cast<uint32_t>(m)));
      }
    }
  }
};

// Register-blocked planes: a vector of outputs accumulates every tap in registers (masked
// to the lanes whose tap lies inside the input) and is stored once, so no tap waits on the
// previous tap's store. Each lane's taps still come in row-major window order, so the
// average's float32 sum is the generic one's. Geometries beyond TapMasks use the generic
// planes.
struct Avx512Planes {
  template <typename T>
  static void max(const T* x, T* y, const Geometry2d& g) {
    const int64_t V = g.s_w == 1 ? 64 : 32;  // outputs per vector
    if (!TapMasks::fits(g, V)) return max_plane<Avx512Rows, T>(x, y, g);
    const TapMasks masks(g, V, g.d_w);
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      T* yr = y + oh * g.out_w;
      for (int64_t b = 0, ob = 0; ob < g.out_w; ++b, ob += V) {
        __m512i acc = _mm512_set1_epi8(static_cast<char>(std::numeric_limits<T>::min()));
        for (int64_t kh = 0; kh < g.k_h; ++kh) {
          const int64_t ih = oh * g.s_h - g.pad_t + kh * g.d_h;
          if (ih < 0 || ih >= g.h) continue;
          // lane j of tap kw reads row[kw·d_w − pad_l + (ob + j)·s_w]; masked lanes are not
          // accessed (the address may lie before the row: integer arithmetic, no pointer)
          const uintptr_t row = reinterpret_cast<uintptr_t>(x + ih * g.w) + (ob * g.s_w - g.pad_l);
          for (int64_t kw = 0; kw < g.k_w; ++kw) {
            const T* p = reinterpret_cast<const T*>(row + kw * g.d_w);
            const __mmask64 kb = _cvtu64_mask64(masks.bytes[b][kw]);
            if (g.s_w == 1) {
              acc = _mm512_mask_mov_epi8(acc, kb, simd::I8x64::max<T>(acc, _mm512_maskz_loadu_epi8(kb, p)));
            } else {
              const __m256i v = _mm512_cvtepi16_epi8(_mm512_maskz_loadu_epi8(kb, p));
              const __m256i a = _mm512_castsi512_si256(acc);
              const __mmask32 kl = _cvtu32_mask32(static_cast<uint32_t>(masks.lanes[b][kw]));
              acc = _mm512_castsi256_si512(_mm256_mask_mov_epi8(a, kl, simd::I8x32::max<T>(a, v)));
            }
          }
        }
        const uint64_t out_lanes = lane_bits(0, std::min(V, g.out_w - ob));
        if (g.s_w == 1) {
          _mm512_mask_storeu_epi8(yr + ob, _cvtu64_mask64(out_lanes), acc);
        } else {
          _mm256_mask_storeu_epi8(yr + ob, _cvtu32_mask32(static_cast<uint32_t>(out_lanes)),
                                  _mm512_castsi512_si256(acc));
        }
      }
    }
  }

  template <typename T>
  static void average(const T* x, T* y, const Geometry2d& g, const AverageParams& p) {
    constexpr int64_t V = 16;
    if (!TapMasks::fits(g, V)) return average_plane<Avx512Rows, T>(x, y, g, p);
    const TapMasks masks(g, V, 1);
    const __m512 vsx = _mm512_set1_ps(p.sx), vsy = _mm512_set1_ps(p.sy);
    const __m512 vzy = _mm512_set1_ps(static_cast<float>(p.zy));
    const __m512i vzx = _mm512_set1_epi32(p.zx);
    const __m512 lo_q = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::min()));
    const __m512 hi_q = _mm512_set1_ps(static_cast<float>(std::numeric_limits<T>::max()));
    // columns inside the input per output (count_include_pad = 0); 1 past the end
    alignas(64) int32_t cols_in[TapMasks::kMaxVectors * V];
    for (int64_t ow = 0; ow < TapMasks::kMaxVectors * V && ow < ((g.out_w + V - 1) / V) * V; ++ow) {
      const int64_t w0 = ow * g.s_w - g.pad_l;
      cols_in[ow] = ow < g.out_w ? static_cast<int32_t>(std::min(w0 + g.k_w, g.w) - std::max<int64_t>(w0, 0)) : 1;
    }
    const __m512 window = _mm512_set1_ps(static_cast<float>(g.k_h * g.k_w));
    for (int64_t oh = 0; oh < g.out_h; ++oh) {
      const int64_t h0 = oh * g.s_h - g.pad_t;
      const int64_t rows_in = std::min(h0 + g.k_h, g.h) - std::max<int64_t>(h0, 0);
      T* yr = y + oh * g.out_w;
      for (int64_t b = 0, ob = 0; ob < g.out_w; ++b, ob += V) {
        __m512 acc = _mm512_setzero_ps();
        for (int64_t kh = 0; kh < g.k_h; ++kh) {
          const int64_t ih = h0 + kh;
          if (ih < 0 || ih >= g.h) continue;
          const uintptr_t row = reinterpret_cast<uintptr_t>(x + ih * g.w) + (ob * g.s_w - g.pad_l);
          for (int64_t kw = 0; kw < g.k_w; ++kw) {
            const T* src = reinterpret_cast<const T*>(row + kw);
            const __mmask16 kl = static_cast<__mmask16>(masks.lanes[b][kw]);
            __m128i bytes;
            if (g.s_w == 1) {
              bytes = _mm_maskz_loadu_epi8(kl, src);
            } else {
              bytes = _mm256_cvtepi16_epi8(
                  _mm256_maskz_loadu_epi8(_cvtu32_mask32(static_cast<uint32_t>(masks.bytes[b][kw])), src));
            }
            const __m512 d =
                _mm512_mul_ps(vsx, _mm512_cvtepi32_ps(_mm512_sub_epi32(simd::I32x16::widen_bytes<T>(bytes), vzx)));
            acc = _mm512_mask_add_ps(acc, kl, acc, d);  // other lanes: no tap
          }
        }
        __m512 count = window;
        if (!p.count_include_pad) {
          const __m512i c =
              _mm512_mullo_epi32(_mm512_set1_epi32(static_cast<int32_t>(rows_in)), _mm512_load_si512(cols_in + ob));
          count = _mm512_cvtepi32_ps(c);
        }
        const __mmask16 k = static_cast<__mmask16>(lane_bits(0, std::min(V, g.out_w - ob)));
        const __m512 avg = _mm512_maskz_div_ps(k, acc, count);
        __m512 v = _mm512_add_ps(_mm512_div_ps(avg, vsy), vzy);
        v = _mm512_mask_mov_ps(lo_q, _mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);  // NaN -> qmin
        v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        v = _mm512_min_ps(_mm512_max_ps(v, lo_q), hi_q);
        const __m512i q = _mm512_cvtps_epi32(v);
        if constexpr (std::is_same_v<T, uint8_t>) {
          _mm512_mask_cvtusepi32_storeu_epi8(yr + ob, k, q);
        } else {
          _mm512_mask_cvtsepi32_storeu_epi8(yr + ob, k, q);
        }
      }
    }
  }
};

}  // namespace

const Kernels kKernelsAvx512Vnni = make_kernels<Avx512Rows, Avx512Planes>(max_plane_f32<simd::F32x16>);

}  // namespace pool
}  // namespace quanta
