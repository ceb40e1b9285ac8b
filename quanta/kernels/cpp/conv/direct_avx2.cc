// qconv_direct_u8s8_s32_6x16c2__avx2: the direct small-channel kernel for channels_last
// on AVX2 (the stem of a CNN: C = 3, 3x3, stride 2; contract in kernels.h "Direct,
// small C").
//
// SIMD lanes are output channels (8 per ymm, up to 8 ymm); the 2 int16 of a lane are 2
// consecutive k of one kernel row's run of kw·C input elements, read as one broadcast
// dword from the padded NHWC image, which the driver stores widened to int16
// (vpbroadcastd from memory: a load, no shuffle, no widening in the loop). vpmaddwd adds
// the two products in int32: exact for any weights (|x'·w_eff| <= 255·255, w_eff = w − zw
// in [−255, 255] as int16), so no Σx' term and no vpmaddubsw saturation. A run is padded
// to pairs whose extra k has weight 0, so the element read past the run (the next
// pixel's, or the image's slack) adds nothing. Up to 6 output pixels run together and
// share each weight vector (accumulators: pixels × channel blocks <= 12 ymm).
// Epilogue as qgemm's AVX2 family (float32 multiply, clamp, vroundps to nearest even).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <cstring>

#include "conv/kernels.h"
#include "requant_avx2.h"

namespace quanta {
namespace conv {
namespace {

inline int32_t load_dword(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// 8 channels [8b, 8b + n) of one pixel from their int32 sums (colterm added)
inline void store8(const DirectRow& a, __m256i v, int64_t b, void* y, int n) {
  if (a.out_type == OutType::kS32) {
    if (n >= 8) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y), v);
    } else {
      alignas(32) int32_t tmp[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), v);
      std::memcpy(y, tmp, static_cast<size_t>(n) * 4);
    }
    return;
  }
  const __m256i q = avx2::requant_q8(v, _mm256_loadu_ps(a.multiplier + 8 * b), a.lo_minus_zy, a.hi_minus_zy, a.zy);
  avx2::store_q8(q, a.out_type == OutType::kS8, y, n);
}

template <int MB, int NP>
inline void pixels(const DirectRow& a, int64_t o0) {
  __m256i acc[NP][MB];
  for (int p = 0; p < NP; ++p) {
    for (int b = 0; b < MB; ++b) acc[p][b] = _mm256_setzero_si256();
  }
  const int16_t* w = a.weights16;
  for (int64_t ky = 0; ky < a.kh; ++ky) {
    const int16_t* row = a.in16 + ky * a.row_step + o0 * a.pixel_step;
    for (int64_t q = 0; q < a.groups; ++q) {
      for (int p = 0; p < NP; ++p) {
        const __m256i xv = _mm256_set1_epi32(load_dword(row + p * a.pixel_step + 2 * q));
        for (int b = 0; b < MB; ++b) {
          const __m256i wv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 16 * b));
          acc[p][b] = _mm256_add_epi32(acc[p][b], _mm256_madd_epi16(xv, wv));
        }
      }
      w += 16 * MB;
    }
  }
  const int ob = out_bytes(a.out_type);
  for (int p = 0; p < NP; ++p) {
    uint8_t* y = static_cast<uint8_t*>(a.y) + (o0 + p) * a.M * ob;
    for (int b = 0; b < MB; ++b) {
      const __m256i v =
          _mm256_add_epi32(acc[p][b], _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.colterm + 8 * b)));
      const int64_t left = a.M - 8 * b;
      store8(a, v, b, y + 8 * b * ob, static_cast<int>(left < 8 ? left : 8));
    }
  }
}

// pixels per step: the accumulators (NP × MB ymm) in at most 12 registers
template <int MB>
void row_impl(const DirectRow& a) {
  constexpr int kNp = MB == 1 ? 8 : 12 / MB > 0 ? 12 / MB : 1;
  int64_t o = 0;
  for (; o + kNp <= a.ow; o += kNp) pixels<MB, kNp>(a, o);
  for (; o < a.ow; ++o) pixels<MB, 1>(a, o);
}

}  // namespace

void direct_row_avx2(const DirectRow& a) {
  switch ((a.M + 7) / 8) {
    case 1: row_impl<1>(a); break;
    case 2: row_impl<2>(a); break;
    case 3: row_impl<3>(a); break;
    case 4: row_impl<4>(a); break;
    case 5: row_impl<5>(a); break;
    case 6: row_impl<6>(a); break;
    case 7: row_impl<7>(a); break;
    default: row_impl<8>(a); break;
  }
}

}  // namespace conv
}  // namespace quanta
