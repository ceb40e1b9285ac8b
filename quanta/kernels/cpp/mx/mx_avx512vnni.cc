// mx_i8_6x32c4__avx512vnni: the MXINT8 GEMM tile, and the vectorized INT8 QuantizeMX.
//
// Tile: MR = 6 rows x NR = 32 columns. Per block k: the 12 int32 accumulators start at
// −128·Σ_block w (vpdpbusd takes u8 x s8: A is shifted by +128, eq. (8)), kb/4 groups of
// two 64-byte weight loads, one 4-byte broadcast per row and 2·MR vpdpbusd give the exact
// block dots D_k; then per row s = fl32(s_a · s_b) (eq. (MX5b)), p = fl32(fl32(D_k) · s)
// (eq. (MX5c)) and acc = acc + p (eq. (MX6)) in 12 float accumulators, separate multiply
// and add (this file is built with -mfma: fp-contract is off below).
// The other formats run the generic loops of mx_impl.h, compiled here with AVX-512.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>

#include "mx/mx_impl.h"

namespace quanta {
namespace mx {
namespace {

#define QUANTA_MX_VPDPBUSD(acc, a, b) (acc) = _mm512_dpbusd_epi32((acc), (a), (b))

// Blocks [k0, k1) of one 6 x 32 tile. The float accumulators live in registers within
// the range and in y between ranges (the K chunks of the driver): the same values in the
// same order, so the chain of eq. (MX6) is unchanged; the bias is added after the last.
template <int MR>
void tile(const uint8_t* au, const float* sa, const PackedMx& b, const float* bias, float* y, int64_t m, int64_t p,
          int k0, int k1) {
  const int nb = b.nb, kb = b.kb, G = kb / 4;
  const int64_t lda = static_cast<int64_t>(nb) * kb, N = b.N, n0 = p * 32;
  const int valid = static_cast<int>(std::min<int64_t>(32, N - n0));
  const __mmask16 k0m = valid >= 16 ? 0xffff : static_cast<__mmask16>((1u << valid) - 1u);
  const __mmask16 k1m = valid >= 32 ? 0xffff : (valid <= 16 ? 0 : static_cast<__mmask16>((1u << (valid - 16)) - 1u));
  __m512 acc[MR][2];
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    if (k0 == 0) {
      acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    } else {
      acc[r][0] = _mm512_maskz_loadu_ps(k0m, y + (m + r) * N + n0);
      acc[r][1] = _mm512_maskz_loadu_ps(k1m, y + (m + r) * N + n0 + 16);
    }
  }
  const __m512i zero = _mm512_setzero_si512();
  for (int k = k0; k < k1; ++k) {
    const int32_t* ck = b.comp.data() + (static_cast<size_t>(p) * nb + k) * 32;
    const __m512i c0 = _mm512_sub_epi32(zero, _mm512_loadu_si512(ck));
    const __m512i c1 = _mm512_sub_epi32(zero, _mm512_loadu_si512(ck + 16));
    __m512i d[MR][2];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      d[r][0] = c0;
      d[r][1] = c1;
    }
    const int8_t* w = b.i8.data() + ((p * nb + k) * static_cast<int64_t>(kb)) * 32;
    const uint8_t* ak = au + m * lda + static_cast<int64_t>(k) * kb;
    if (MR <= 2) {
      // one or two rows: two accumulator sets (even / odd k-groups) hide vpdpbusd's
      // latency; their sum is exact (int32)
      __m512i e[MR][2];
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) e[r][0] = e[r][1] = zero;
      int g = 0;
      for (; g + 2 <= G; g += 2) {
        const __m512i b0 = _mm512_loadu_si512(w + g * 128), b1 = _mm512_loadu_si512(w + g * 128 + 64);
        const __m512i b2 = _mm512_loadu_si512(w + g * 128 + 128), b3 = _mm512_loadu_si512(w + g * 128 + 192);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          int32_t a4, a5;
          __builtin_memcpy(&a4, ak + r * lda + 4 * g, 4);
          __builtin_memcpy(&a5, ak + r * lda + 4 * g + 4, 4);
          const __m512i a = _mm512_set1_epi32(a4), a1 = _mm512_set1_epi32(a5);
          QUANTA_MX_VPDPBUSD(d[r][0], a, b0);
          QUANTA_MX_VPDPBUSD(d[r][1], a, b1);
          QUANTA_MX_VPDPBUSD(e[r][0], a1, b2);
          QUANTA_MX_VPDPBUSD(e[r][1], a1, b3);
        }
      }
      for (; g < G; ++g) {
        const __m512i b0 = _mm512_loadu_si512(w + g * 128), b1 = _mm512_loadu_si512(w + g * 128 + 64);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          int32_t a4;
          __builtin_memcpy(&a4, ak + r * lda + 4 * g, 4);
          const __m512i a = _mm512_set1_epi32(a4);
          QUANTA_MX_VPDPBUSD(d[r][0], a, b0);
          QUANTA_MX_VPDPBUSD(d[r][1], a, b1);
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        d[r][0] = _mm512_add_epi32(d[r][0], e[r][0]);
        d[r][1] = _mm512_add_epi32(d[r][1], e[r][1]);
      }
    } else {
      // one group of 4 k: two 64-byte weight loads, one broadcast and two vpdpbusd per row
      auto group = [&](int g) {
        const __m512i b0 = _mm512_loadu_si512(w + g * 128);
        const __m512i b1 = _mm512_loadu_si512(w + g * 128 + 64);
#pragma GCC unroll 8
        for (int r = 0; r < MR; ++r) {
          int32_t a4;
          __builtin_memcpy(&a4, ak + r * lda + 4 * g, 4);
          const __m512i a = _mm512_set1_epi32(a4);
          QUANTA_MX_VPDPBUSD(d[r][0], a, b0);
          QUANTA_MX_VPDPBUSD(d[r][1], a, b1);
        }
      };
      if (G == 8) {
// the default block of 32: a fixed trip count, unrolled whole, keeps the 2·MR
// accumulators in fixed registers (a partly unrolled loop of unknown count made
// the compiler rotate them through register copies every step)
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) group(g);
      } else {
        for (int g = 0; g < G; ++g) group(g);
      }
    }
    const float* sk = b.sbp.data() + (static_cast<size_t>(p) * nb + k) * 32;
    const __m512 sb0 = _mm512_loadu_ps(sk);
    const __m512 sb1 = _mm512_loadu_ps(sk + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512 s_a = _mm512_set1_ps(sa[(m + r) * nb + k]);
      const __m512 p0 = _mm512_mul_ps(_mm512_cvtepi32_ps(d[r][0]), _mm512_mul_ps(s_a, sb0));
      const __m512 p1 = _mm512_mul_ps(_mm512_cvtepi32_ps(d[r][1]), _mm512_mul_ps(s_a, sb1));
      if (k == 0) {
        acc[r][0] = p0;
        acc[r][1] = p1;
      } else {
        acc[r][0] = _mm512_add_ps(acc[r][0], p0);
        acc[r][1] = _mm512_add_ps(acc[r][1], p1);
      }
    }
  }
  const bool last = k1 == nb;
  __m512 bv0 = _mm512_setzero_ps(), bv1 = _mm512_setzero_ps();
  if (bias && last) {
    bv0 = _mm512_maskz_loadu_ps(k0m, bias + n0);
    bv1 = _mm512_maskz_loadu_ps(k1m, bias + n0 + 16);
  }
#pragma GCC unroll 8
  for (int r = 0; r < MR; ++r) {
    __m512 v0 = acc[r][0], v1 = acc[r][1];
    if (bias && last) {
      v0 = _mm512_add_ps(v0, bv0);
      v1 = _mm512_add_ps(v1, bv1);
    }
    _mm512_mask_storeu_ps(y + (m + r) * N + n0, k0m, v0);
    _mm512_mask_storeu_ps(y + (m + r) * N + n0 + 16, k1m, v1);
  }
}

}  // namespace

void gemm_i8_avx512vnni(const uint8_t* au, const float* sa, const PackedMx& b, const float* bias, float* y, int64_t,
                        int64_t m0, int64_t m1, int64_t p0, int64_t p1, int k0, int k1) {
  for (int64_t p = p0; p < p1; ++p) {
    int64_t m = m0;
    for (; m + 6 <= m1; m += 6) tile<6>(au, sa, b, bias, y, m, p, k0, k1);
    switch (m1 - m) {
      case 5: tile<5>(au, sa, b, bias, y, m, p, k0, k1); break;
      case 4: tile<4>(au, sa, b, bias, y, m, p, k0, k1); break;
      case 3: tile<3>(au, sa, b, bias, y, m, p, k0, k1); break;
      case 2: tile<2>(au, sa, b, bias, y, m, p, k0, k1); break;
      case 1: tile<1>(au, sa, b, bias, y, m, p, k0, k1); break;
      default: break;
    }
  }
}

void gemm_f64_avx512vnni(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b, const float* bias,
                         float* y, int64_t m0, int64_t m1) {
  gemm_f64_generic(ad, abad, sa, b, bias, y, m0, m1);
}

void quantize_i8_avx512vnni(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K,
                            int block) {
  const int64_t nb = (K + block - 1) / block;
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  const __m512i expmask = _mm512_set1_epi32(0x7f800000);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512 s64 = _mm512_set1_ps(64.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * K;
    uint8_t* br = bits + r * K;
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t i0 = k * block, i1 = std::min<int64_t>(K, i0 + block);
      __m512i amax = _mm512_setzero_si512();  // |x| bits: integer max = float max for finite
      __mmask16 bad = 0;
      for (int64_t i = i0; i < i1; i += 16) {
        const int n = static_cast<int>(std::min<int64_t>(16, i1 - i));
        const __mmask16 mk = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1u);
        const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(mk, xr + i), absmask);
        bad |= _mm512_mask_cmpeq_epi32_mask(mk, _mm512_and_si512(v, expmask), expmask);
        amax = _mm512_max_epu32(amax, v);
      }
      if (bad) {
        codes[r * nb + k] = 255;
        std::fill(br + i0, br + i1, 0);
        continue;
      }
      const uint32_t ab = static_cast<uint32_t>(_mm512_reduce_max_epu32(amax));
      float af;
      __builtin_memcpy(&af, &ab, 4);
      const int e = shared_exponent(af, 0);
      codes[r * nb + k] = static_cast<uint8_t>(e + 127);
      const int h = -e / 2;
      const __m512 f1 = _mm512_set1_ps(pow2f(h)), f2 = _mm512_set1_ps(pow2f(-e - h));
      for (int64_t i = i0; i < i1; i += 16) {
        const int n = static_cast<int>(std::min<int64_t>(16, i1 - i));
        const __mmask16 mk = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(mk, xr + i);
        const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(v, f1), f2), s64);
        __m512i q = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
        _mm_mask_storeu_epi8(br + i, mk, _mm512_cvtepi32_epi8(q));
      }
    }
  }
}

}  // namespace mx
}  // namespace quanta
