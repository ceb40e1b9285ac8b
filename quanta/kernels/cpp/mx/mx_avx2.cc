// The AVX2 MX kernels: the INT8 x INT8 GEMM as a vpmaddwd tile (eq. (MA1) of
// docs/quantization-math.md), the INT8 QuantizeMX 8 lanes at a time (quantize_i8_avx2
// below), and the float-element GEMM as the generic loop of mx_impl.h compiled with
// -mavx2 -mfma.
//
// INT8 tile: MR = 6 rows x 16 columns (a half panel of B, PackedMx's avx2 layout), 12 ymm
// int32 block sums. Per pair of k: 2 vpmovsxbw of B's int8 pairs (16 bytes each: 8
// columns x 2 k), shared by the rows; per row one vpbroadcastd of A's int16 pair and 2
// vpmaddwd + 2 vpaddd. vpmaddwd forms each int8·int8 product and the pair's sum in int32
// (exact; vpmaddubsw would saturate the pair in int16), and the int32 block sum wraps as
// the generic loop's does, so D_k is the block dot of eq. (MX5a) bit for bit.
// After each block, per row and 8 columns, eqs. (MX5b)-(MX6) in float32 as the generic
// loop computes them: s = s_a·sb (vmulps), p = fl32(D_k)·s (vcvtdq2ps, vmulps), acc = p
// for the first block of K, acc + p after (vaddps); the float sums live in a 6 x 16 array
// on the stack (the 12 int32 sums, 2 B vectors and the broadcast fill 15 of 16 ymm).
// -ffp-contract=off (and the pragma below) keep every multiply and add one rounding.
// A code-255 block's scale is NaN (sa or sb), so its products and every later sum are
// NaN, as in the twin.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "mx/mx_impl.h"

QUANTA_MX_GENERIC_F64(avx2)

namespace quanta {
namespace mx {
namespace {

constexpr int kMR = 6;   // rows of the register tile
constexpr int kNH = 16;  // columns of a half panel

// One block's int32 sums of the 6-row tile, d[r][0..15] for rows a + r·stride (bytes):
// the k-pair loop in asm with the 12 sums in ymm0-11 (GCC's allocation of the intrinsics
// version hoisted the six broadcasts and kept half the sums on the stack, a load and a
// store per vpaddd), stored once at the end of the block. pairs >= 1.
inline void block_sums_6(const int16_t* a, int64_t stride, const int8_t* w, int pairs, int32_t (*d)[kNH]) {
  const int8_t* w_end = w + static_cast<int64_t>(pairs) * 32;
  const char* a0 = reinterpret_cast<const char*>(a);
  const char* a3 = a0 + 3 * stride;
  asm volatile(
      "vpxor %%xmm0, %%xmm0, %%xmm0\n\t"
      "vpxor %%xmm1, %%xmm1, %%xmm1\n\t"
      "vpxor %%xmm2, %%xmm2, %%xmm2\n\t"
      "vpxor %%xmm3, %%xmm3, %%xmm3\n\t"
      "vpxor %%xmm4, %%xmm4, %%xmm4\n\t"
      "vpxor %%xmm5, %%xmm5, %%xmm5\n\t"
      "vpxor %%xmm6, %%xmm6, %%xmm6\n\t"
      "vpxor %%xmm7, %%xmm7, %%xmm7\n\t"
      "vpxor %%xmm8, %%xmm8, %%xmm8\n\t"
      "vpxor %%xmm9, %%xmm9, %%xmm9\n\t"
      "vpxor %%xmm10, %%xmm10, %%xmm10\n\t"
      "vpxor %%xmm11, %%xmm11, %%xmm11\n\t"
      "1:\n\t"
      "vpmovsxbw (%[w]), %%ymm12\n\t"
      "vpmovsxbw 16(%[w]), %%ymm13\n\t"
      // row r: columns 0-7 in ymm r, 8-15 in ymm r + 6; rows 3-5 at a3 = a0 + 3·stride
      "vpbroadcastd (%[a0]), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm14\n\t"
      "vpaddd %%ymm15, %%ymm0, %%ymm0\n\t"
      "vpaddd %%ymm14, %%ymm6, %%ymm6\n\t"
      "vpbroadcastd (%[a0],%[s]), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm14\n\t"
      "vpaddd %%ymm15, %%ymm1, %%ymm1\n\t"
      "vpaddd %%ymm14, %%ymm7, %%ymm7\n\t"
      "vpbroadcastd (%[a0],%[s],2), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm14\n\t"
      "vpaddd %%ymm15, %%ymm2, %%ymm2\n\t"
      "vpaddd %%ymm14, %%ymm8, %%ymm8\n\t"
      "vpbroadcastd (%[a3]), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm14\n\t"
      "vpaddd %%ymm15, %%ymm3, %%ymm3\n\t"
      "vpaddd %%ymm14, %%ymm9, %%ymm9\n\t"
      "vpbroadcastd (%[a3],%[s]), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm14\n\t"
      "vpaddd %%ymm15, %%ymm4, %%ymm4\n\t"
      "vpaddd %%ymm14, %%ymm10, %%ymm10\n\t"
      "vpbroadcastd (%[a3],%[s],2), %%ymm14\n\t"
      "vpmaddwd %%ymm12, %%ymm14, %%ymm15\n\t"
      "vpmaddwd %%ymm13, %%ymm14, %%ymm14\n\t"
      "vpaddd %%ymm15, %%ymm5, %%ymm5\n\t"
      "vpaddd %%ymm14, %%ymm11, %%ymm11\n\t"
      "add $32, %[w]\n\t"
      "add $4, %[a0]\n\t"
      "add $4, %[a3]\n\t"
      "cmp %[w_end], %[w]\n\t"
      "jb 1b\n\t"
      "vmovdqa %%ymm0, 0(%[d])\n\t"
      "vmovdqa %%ymm6, 32(%[d])\n\t"
      "vmovdqa %%ymm1, 64(%[d])\n\t"
      "vmovdqa %%ymm7, 96(%[d])\n\t"
      "vmovdqa %%ymm2, 128(%[d])\n\t"
      "vmovdqa %%ymm8, 160(%[d])\n\t"
      "vmovdqa %%ymm3, 192(%[d])\n\t"
      "vmovdqa %%ymm9, 224(%[d])\n\t"
      "vmovdqa %%ymm4, 256(%[d])\n\t"
      "vmovdqa %%ymm10, 288(%[d])\n\t"
      "vmovdqa %%ymm5, 320(%[d])\n\t"
      "vmovdqa %%ymm11, 352(%[d])\n\t"
      : [w] "+r"(w), [a0] "+r"(a0), [a3] "+r"(a3)
      : [s] "r"(stride), [w_end] "r"(w_end), [d] "r"(d)
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12",
        "xmm13", "xmm14", "xmm15", "cc", "memory");
}

// Rows [m, m + MR) x half panel h over blocks [k0, k1): the float sums start from y when
// k0 > 0 (the K chunk before left them there), y gets the sums (+ bias when k1 = nb).
template <int MR>
__attribute__((always_inline)) inline void tile(const int16_t* a16, const float* sa, const PackedMx& b,
                                                const float* bias, float* y, int64_t m, int64_t h, int k0, int k1) {
  const int nb = b.nb, kb = b.kb, pairs = kb / 2;
  const int64_t N = b.N, n0 = h * kNH;
  const int ncols = static_cast<int>(std::min<int64_t>(kNH, N - n0));
  const int64_t a_stride = static_cast<int64_t>(nb) * kb;
  alignas(32) float acc[MR][kNH];
  if (k0 > 0) {
    for (int r = 0; r < MR; ++r)
      for (int j = 0; j < kNH; ++j) acc[r][j] = j < ncols ? y[(m + r) * N + n0 + j] : 0.0f;
  }
  const int8_t* w = b.i8p() + (h * nb + k0) * static_cast<int64_t>(pairs) * 32;
  // sbp is [panel][block][32]: this half panel's 16 scales sit at offset (h % 2)·16
  const float* sbh = b.sbp.data() + static_cast<size_t>(h / 2) * nb * 32 + (h % 2) * kNH;
  for (int k = k0; k < k1; ++k) {
    const int16_t* rows[MR];
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) rows[r] = a16 + (m + r) * a_stride + static_cast<int64_t>(k) * kb;
    __m256i c0[MR], c1[MR];
    if constexpr (MR == kMR) {
      alignas(32) int32_t d[kMR][kNH];
      block_sums_6(rows[0], a_stride * 2, w, pairs, d);
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) {
        c0[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(d[r]));
        c1[r] = _mm256_load_si256(reinterpret_cast<const __m256i*>(d[r] + 8));
      }
    } else {
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) c0[r] = c1[r] = _mm256_setzero_si256();
      for (int i = 0; i < pairs; ++i) {
        const __m256i b0 = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(w + 32 * i)));
        const __m256i b1 = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(w + 32 * i + 16)));
#pragma GCC unroll 6
        for (int r = 0; r < MR; ++r) {
          int32_t pr;
          std::memcpy(&pr, rows[r] + 2 * i, 4);
          const __m256i xa = _mm256_set1_epi32(pr);
          c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(xa, b0));
          c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(xa, b1));
        }
      }
    }
    w += static_cast<int64_t>(pairs) * 32;
    const __m256 sb0 = _mm256_loadu_ps(sbh + static_cast<size_t>(k) * 32);
    const __m256 sb1 = _mm256_loadu_ps(sbh + static_cast<size_t>(k) * 32 + 8);
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      const __m256 s_a = _mm256_set1_ps(sa[(m + r) * nb + k]);
      const __m256 p0 = _mm256_mul_ps(_mm256_cvtepi32_ps(c0[r]), _mm256_mul_ps(s_a, sb0));  // eqs. (MX5b), (MX5c)
      const __m256 p1 = _mm256_mul_ps(_mm256_cvtepi32_ps(c1[r]), _mm256_mul_ps(s_a, sb1));
      if (k == 0) {  // eq. (MX6): the first block's product is the sum (−0 stays −0)
        _mm256_store_ps(acc[r], p0);
        _mm256_store_ps(acc[r] + 8, p1);
      } else {
        _mm256_store_ps(acc[r], _mm256_add_ps(_mm256_load_ps(acc[r]), p0));
        _mm256_store_ps(acc[r] + 8, _mm256_add_ps(_mm256_load_ps(acc[r] + 8), p1));
      }
    }
  }
  const bool final = k1 == nb;
  for (int r = 0; r < MR; ++r) {
    float* yr = y + (m + r) * N + n0;
    for (int j = 0; j < ncols; ++j) {
      float v = nb == 0 ? 0.0f : acc[r][j];
      if (bias && final) v = v + bias[n0 + j];
      yr[j] = v;
    }
  }
}

}  // namespace

void gemm_i8_avx2(const int16_t* a16, const float* sa, const PackedMx& b, const float* bias, float* y, int64_t,
                  int64_t m0, int64_t m1, int64_t p0, int64_t p1, int k0, int k1) {
  for (int64_t h = 2 * p0; h < 2 * p1; ++h) {
    if (h * kNH >= b.N) break;  // a pad half panel: no column to write
    int64_t m = m0;
    for (; m + kMR <= m1; m += kMR) tile<kMR>(a16, sa, b, bias, y, m, h, k0, k1);
    switch (m1 - m) {
      case 5: tile<5>(a16, sa, b, bias, y, m, h, k0, k1); break;
      case 4: tile<4>(a16, sa, b, bias, y, m, h, k0, k1); break;
      case 3: tile<3>(a16, sa, b, bias, y, m, h, k0, k1); break;
      case 2: tile<2>(a16, sa, b, bias, y, m, h, k0, k1); break;
      case 1: tile<1>(a16, sa, b, bias, y, m, h, k0, k1); break;
      default: break;
    }
  }
}

// INT8 QuantizeMX (eqs. (MX3)-(MX4)), the generic loop's arithmetic 8 lanes at a time:
// amax as the unsigned maximum of the |x| bit patterns (for finite floats their integer
// order is their order), a non-finite element by its exponent field; e from amax as the
// scalar shared_exponent; x·2^h·2^(−e−h)·64 with the same two normal power-of-two factors
// and the same order of multiplications; vcvtps2dq rounds as nearbyint does (both by
// MXCSR, nearest even); the clamp to ±127 in int32; saturating packs are exact there.
// Blocks whose length is not a multiple of 8 (and K's last block) read and write their
// last lanes masked (masked-off lanes load +0, which changes neither amax nor the test).
void quantize_i8_avx2(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K, int block) {
  const int64_t nb = (K + block - 1) / block;
  const __m256i absmask = _mm256_set1_epi32(0x7fffffff);
  const __m256i expmask = _mm256_set1_epi32(0x7f800000);
  const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 s64 = _mm256_set1_ps(64.0f);
  // eight int32 in [−127, 127] -> eight bytes in the low 64 bits
  auto pack8 = [](__m256i q) __attribute__((always_inline)) {
    const __m256i w = _mm256_packs_epi16(_mm256_packs_epi32(q, q), _mm256_setzero_si256());
    return _mm_unpacklo_epi32(_mm256_castsi256_si128(w), _mm256_extracti128_si256(w, 1));
  };
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * K;
    uint8_t* br = bits + r * K;
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t i0 = k * block, i1 = std::min<int64_t>(K, i0 + block);
      __m256i amax = _mm256_setzero_si256(), bad = _mm256_setzero_si256();
      for (int64_t i = i0; i < i1; i += 8) {
        const int64_t n = std::min<int64_t>(8, i1 - i);
        __m256i v;
        if (n == 8) {
          v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xr + i));
        } else {
          const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes);
          v = _mm256_maskload_epi32(reinterpret_cast<const int*>(xr + i), mk);
        }
        v = _mm256_and_si256(v, absmask);
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(v, expmask), expmask));
        amax = _mm256_max_epu32(amax, v);
      }
      if (!_mm256_testz_si256(bad, bad)) {
        codes[r * nb + k] = 255;
        std::fill(br + i0, br + i1, 0);
        continue;
      }
      __m128i m4 = _mm_max_epu32(_mm256_castsi256_si128(amax), _mm256_extracti128_si256(amax, 1));
      m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0x4e));
      m4 = _mm_max_epu32(m4, _mm_shuffle_epi32(m4, 0xb1));
      const uint32_t ab = static_cast<uint32_t>(_mm_cvtsi128_si32(m4));
      float af;
      std::memcpy(&af, &ab, 4);
      const int e = shared_exponent(af, 0);
      codes[r * nb + k] = static_cast<uint8_t>(e + 127);
      // 2^h and 2^(−e−h), |h| <= 64: normal floats from their exponent bits (scale_down)
      const int h = -e / 2;
      const __m256 f1 = _mm256_castsi256_ps(_mm256_set1_epi32((h + 127) << 23));
      const __m256 f2 = _mm256_castsi256_ps(_mm256_set1_epi32((-e - h + 127) << 23));
      for (int64_t i = i0; i < i1; i += 8) {
        const int64_t n = std::min<int64_t>(8, i1 - i);
        __m256 v;
        if (n == 8) {
          v = _mm256_loadu_ps(xr + i);
        } else {
          const __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lanes);
          v = _mm256_maskload_ps(xr + i, mk);
        }
        const __m256 t = _mm256_mul_ps(_mm256_mul_ps(_mm256_mul_ps(v, f1), f2), s64);
        const __m256i q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(t), lo), hi);
        const __m128i b8 = pack8(q);
        if (n == 8) {
          _mm_storel_epi64(reinterpret_cast<__m128i*>(br + i), b8);
        } else {
          alignas(16) uint8_t tmp[16];
          _mm_store_si128(reinterpret_cast<__m128i*>(tmp), b8);
          std::memcpy(br + i, tmp, static_cast<size_t>(n));
        }
      }
    }
  }
}

}  // namespace mx
}  // namespace quanta
