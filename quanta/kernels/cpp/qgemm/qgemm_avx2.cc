// qgemm_u8s8_s32_6x16c2__avx2 (layout: kernel.h Avx2Layout).
//
// Exact for every u8·s8 pair: the products are formed by vpmaddwd on int16 operands,
//   acc[r][lane] += x'[r,k]·w'[k,n] + x'[r,k+1]·w'[k+1,n]   (|pair| <= 2·255·128 < 2^31)
// never by vpmaddubsw, whose int16 pair sum saturates (255·(−128)·2 = −65280 < −32768:
// ONNX Runtime's AVX2 kernel returns −32768 for that pair). Weights are packed as int8
// pairs of k (32 bytes per k-pair and 16 columns: half the bytes of an int16 panel, so a
// 4096 x 4096 GEMV's weights fit a 32 MiB L3) and sign-extended in the k-loop with one
// vpmovsxbw per 8 columns, shared by the 6 rows of the tile; x' is widened to int16 once
// per call (pack.cc pack_activations_s16).
//
// Register tile: MR = 6 rows x NR = 16 columns = 12 ymm accumulators; per k-pair 2
// vpmovsxbw (load + widen) of the panel, 6 vpbroadcastd of x' pairs, 12 vpmaddwd + 12
// vpaddd: 26 vector-ALU uops per 192 products (the int16 panel with 4 rows took 24 per
// 192 and twice the weight bytes).
//
// Epilogue as in the AVX-512 family; lanes of a partial 8-column vector and the
// fixed-point stage go through the shared scalar code (kernel.h).
// float32(acc)·m + float_bias: two roundings, never one FMA (this file is built with -mfma).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#endif

#include <immintrin.h>

#include <algorithm>

#include "qgemm/fold.h"
#include "qgemm/kernel.h"
#include "requant_avx2.h"
#include "simd.h"

namespace quanta {
namespace qgemm {
namespace {

using L = Avx2Layout;
constexpr int kNR = L::kNR;
constexpr int kKR = L::kKR;
static_assert(kNR == 16 && kKR == 2 && sizeof(L::WeightStorage) == 1 && sizeof(L::ActivationStorage) == 2,
              "the tile below is written for 2 ymm x 2 k, int8 weights, int16 x'");

inline __m256 row_or_column_multiplier(const Epilogue& e, int64_t m, int64_t n) {
  return e.mult_row ? _mm256_set1_ps(e.mult_row[m]) : _mm256_loadu_ps(e.multiplier + n);
}

// Out of line: the tiles inline only their common output stage (tile, kQ8Float), so that a
// call from the row loop does not spill the tile's accumulators around every vector (1x1
// 128 -> 512 at 14x14, one thread: finish_vector took 8 % of the time as a call).
__attribute__((noinline)) void finish_vector(__m256i v, const Epilogue& e, int64_t m, int64_t n, int valid) {
  const int64_t at = m * e.y_row_stride + n;
  if (valid >= 8 && e.kind != EpiKind::kQ8Fixed) {
    switch (e.kind) {
      case EpiKind::kS32: {
        v = _mm256_max_epi32(_mm256_min_epi32(v, _mm256_set1_epi32(e.hi)), _mm256_set1_epi32(e.lo));
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<int32_t*>(e.y) + at), v);
        return;
      }
      case EpiKind::kF32: {
        __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(v), row_or_column_multiplier(e, m, n));
        if (e.float_bias) f = _mm256_add_ps(f, _mm256_loadu_ps(e.float_bias + n));
        f = _mm256_min_ps(_mm256_max_ps(f, _mm256_set1_ps(e.flo)), _mm256_set1_ps(e.fhi));
        _mm256_storeu_ps(static_cast<float*>(e.y) + at, f);
        return;
      }
      case EpiKind::kQ8Float: {
        __m256i q = avx2::requant_q8(v, row_or_column_multiplier(e, m, n), e.lo_minus_zy, e.hi_minus_zy, e.zy);
        if (e.post_k) {  // the second affine stage (qgemm.h post_k), as kernel.h post_stage
          __m256 g = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), _mm256_set1_ps(e.post_r1), _mm256_loadu_ps(e.post_k + n));
          g = _mm256_fmadd_ps(_mm256_loadu_ps(e.post_u + n), _mm256_set1_ps(e.post_r2), g);
          g = _mm256_min_ps(_mm256_max_ps(g, _mm256_set1_ps(e.post_lo)), _mm256_set1_ps(e.post_hi));
          q = _mm256_cvttps_epi32(_mm256_round_ps(g, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
        }
        avx2::store_q8(q, e.y_signed, static_cast<uint8_t*>(e.y) + at);
        return;
      }
      case EpiKind::kQ8Fixed: break;
    }
  }
  alignas(32) int32_t tmp[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(tmp), v);
  for (int i = 0; i < valid && i < 8; ++i) finish_element(tmp[i], e, m, n + i);
}

// One k-pair of the wide family for MR rows: the panel's int8 pairs widened to int16,
// x' int16 pairs broadcast from rows[r] + k, vpmaddwd.
template <int MR>
__attribute__((always_inline)) inline void k_step_wide(const int16_t* const* rows, int64_t k, const int8_t* b,
                                                       __m256i* c0, __m256i* c1) {
  const __m256i b0 = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(b)));
  const __m256i b1 = _mm256_cvtepi8_epi16(_mm_load_si128(reinterpret_cast<const __m128i*>(b + 16)));
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    const __m256i xa = _mm256_set1_epi32(load_unaligned<int32_t>(rows[r] + k));
    c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(xa, b0));
    c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(xa, b1));
  }
}

// Sums of one K chunk for MR rows into c0 (columns 0-7) and c1 (8-15).
// Wide (Avx2Layout): int8 weight pairs widened to int16, x' int16 pairs, vpmaddwd. x' rows
// at a row stride (kIndirect false), or the implicit convolution's n_taps chunks of x' rows
// at a_rows[r] + tap_offset[i] (kernel.h TileArgs::a_rows: byte pointers into a padded
// NHWC image already widened to int16, byte offsets; B is read on across the taps).
template <int MR, bool kIndirect>
__attribute__((always_inline)) inline void k_loop_wide(const TileArgs& t, int64_t r0, __m256i* c0, __m256i* c1) {
  const int8_t* b = static_cast<const int8_t*>(t.b);
  const int16_t* rows[MR];
  if constexpr (kIndirect) {
    for (int64_t i = 0; i < t.n_taps; ++i) {
#pragma GCC unroll 6
      for (int r = 0; r < MR; ++r) rows[r] = reinterpret_cast<const int16_t*>(t.a_rows[r0 + r] + t.tap_offset[i]);
      for (int64_t k = 0; k < t.kc; k += kKR) {
        k_step_wide<MR>(rows, k, b, c0, c1);
        b += kNR * kKR;
      }
    }
  } else {
    const int16_t* a = static_cast<const int16_t*>(t.a) + r0 * t.a_row_stride;
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) rows[r] = a + r * t.a_row_stride;
    for (int64_t k = 0; k < t.kc; k += kKR) {
      k_step_wide<MR>(rows, k, b, c0, c1);
      b += kNR * kKR;
    }
  }
}

// Narrow (Avx2NarrowLayout, pair-safe w': weights_pairs_fit_int16): 4 k of uint8 x' per
// broadcast, vpmaddubsw (exact: |pair sum| <= 255·128 < 2^15), vpmaddwd by 1 to int32 per
// column.
template <int MR>
__attribute__((always_inline)) inline void k_step_narrow(const uint8_t* const* rows, int64_t k, const int8_t* b,
                                                         __m256i ones, __m256i* c0, __m256i* c1) {
  const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
  const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 32));
#pragma GCC unroll 5
  for (int r = 0; r < MR; ++r) {
    const __m256i xa = _mm256_set1_epi32(load_unaligned<int32_t>(rows[r] + k));
    c0[r] = _mm256_add_epi32(c0[r], _mm256_madd_epi16(_mm256_maddubs_epi16(xa, b0), ones));
    c1[r] = _mm256_add_epi32(c1[r], _mm256_madd_epi16(_mm256_maddubs_epi16(xa, b1), ones));
  }
}

// One K chunk of x' rows at a row stride (kIndirect false), or the implicit
// convolution's n_taps chunks of x' rows at a_rows[r] + tap_offset[i] (kernel.h
// TileArgs::a_rows; B is read on across the taps).
template <int MR, bool kIndirect>
__attribute__((always_inline)) inline void k_loop_narrow(const TileArgs& t, int64_t r0, __m256i* c0, __m256i* c1) {
  constexpr int kKR4 = Avx2NarrowLayout::kKR;
  const int8_t* b = static_cast<const int8_t*>(t.b);
  const __m256i ones = _mm256_set1_epi16(1);
  const uint8_t* rows[MR];
  if constexpr (kIndirect) {
    for (int64_t i = 0; i < t.n_taps; ++i) {
#pragma GCC unroll 5
      for (int r = 0; r < MR; ++r) rows[r] = t.a_rows[r0 + r] + t.tap_offset[i];
      for (int64_t k = 0; k < t.kc; k += kKR4) {
        k_step_narrow<MR>(rows, k, b, ones, c0, c1);
        b += kNR * kKR4;
      }
    }
  } else {
    const uint8_t* a = static_cast<const uint8_t*>(t.a) + r0 * t.a_row_stride;
#pragma GCC unroll 5
    for (int r = 0; r < MR; ++r) rows[r] = a + r * t.a_row_stride;
    for (int64_t k = 0; k < t.kc; k += kKR4) {
      k_step_narrow<MR>(rows, k, b, ones, c0, c1);
      b += kNR * kKR4;
    }
  }
}

template <int MR, bool kNarrow, bool kIndirect = false>
__attribute__((always_inline)) inline void tile(const TileArgs& t, int64_t r0) {
  int32_t* partial = t.partial + r0 * kNR;

  // The first chunk's sums start at colterm[n] (int32 sums wrap, so where it is added does
  // not change the bits; `partial` is this family's own): two vpaddd a row fewer in the
  // epilogue, which is ~1/3 of a tile's work at K = 16.
  const Epilogue& e = *t.epi;
  const int64_t n0 = t.n0;
  __m256i c0[MR], c1[MR];
  if (t.accumulate) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      c0[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(partial + r * kNR));
      c1[r] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(partial + r * kNR + 8));
    }
  } else {
    const __m256i ct0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.colterm + n0));
    const __m256i ct1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.colterm + n0 + 8));
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      c0[r] = ct0;
      c1[r] = ct1;
    }
  }
  if constexpr (kNarrow) {
    k_loop_narrow<MR, kIndirect>(t, r0, c0, c1);
  } else {
    k_loop_wide<MR, kIndirect>(t, r0, c0, c1);
  }

  if (!t.finish) {
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(partial + r * kNR), c0[r]);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(partial + r * kNR + 8), c1[r]);
    }
    return;
  }

  const int64_t m0 = t.m0 + r0;
  __m256i zw[2], cs[2];
  fold_columns<simd::I32x8>(e, n0, zw, cs);
  if (e.kind == EpiKind::kQ8Float && !e.post_k && !e.mult_row && t.cols == kNR) {
    // the common output stage inline, its constants loaded once per tile (e's fields are
    // read into locals: y's bytes may alias them as far as the compiler knows), and a
    // row's 16 outputs packed into one 16-byte store; the same per-lane operations as
    // finish_vector, so the same bytes
    const __m256 mul0 = _mm256_loadu_ps(e.multiplier + n0), mul1 = _mm256_loadu_ps(e.multiplier + n0 + 8);
    const __m256 lo = _mm256_set1_ps(e.lo_minus_zy), hi = _mm256_set1_ps(e.hi_minus_zy);
    const __m256i zy16 = _mm256_set1_epi16(static_cast<int16_t>(e.zy));
    const bool y_signed = e.y_signed;
    uint8_t* y = static_cast<uint8_t*>(e.y) + m0 * e.y_row_stride + n0;
    const int64_t ys = e.y_row_stride;
#pragma GCC unroll 6
    for (int r = 0; r < MR; ++r) {
      __m256i v0 = c0[r], v1 = c1[r];
      fold_row<simd::I32x8>(v0, v1, e, m0 + r, zw, cs);
      avx2::store_bytes16(avx2::pack_q8x16_zy(avx2::requant_q8_nozy(v0, mul0, lo, hi),
                                              avx2::requant_q8_nozy(v1, mul1, lo, hi), zy16, y_signed),
                          y + r * ys);
    }
    return;
  }
#pragma GCC unroll 6
  for (int r = 0; r < MR; ++r) {
    __m256i v0 = c0[r], v1 = c1[r];
    fold_row<simd::I32x8>(v0, v1, e, m0 + r, zw, cs);
    finish_vector(v0, e, m0 + r, n0, t.cols);
    if (t.cols > 8) finish_vector(v1, e, m0 + r, n0 + 8, t.cols - 8);
  }
}

template <int MR, bool kNarrow, bool kIndirect = false>
__attribute__((noinline)) void run_rows(const TileArgs& t) {
  int64_t r0 = 0;
  for (; r0 + MR <= t.rows; r0 += MR) tile<MR, kNarrow, kIndirect>(t, r0);
  switch (t.rows - r0) {
    case 1: tile<1, kNarrow, kIndirect>(t, r0); break;
    case 2: tile<2, kNarrow, kIndirect>(t, r0); break;
    case 3: tile<3, kNarrow, kIndirect>(t, r0); break;
    case 4:
      if constexpr (MR > 4) tile<4, kNarrow, kIndirect>(t, r0);
      break;
    case 5:
      if constexpr (MR > 5) tile<5, kNarrow, kIndirect>(t, r0);
      break;
    default: break;
  }
}

// 16 x' of x at s widened to int16 at d
inline void widen16(const uint8_t* s, __m128i flip, int16_t* d) {
  const __m128i v = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(s)), flip);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), _mm256_cvtepu8_epi16(v));
}

}  // namespace

// The int16 family also serves the implicit convolution's indirect rows (TileArgs::a_rows
// into a padded NHWC image of int16 x', conv.cc QConv::implicit_path).
void qgemm_tiles_avx2(const TileArgs& t) {
  if (t.a_rows) {
    run_rows<L::kMR, false, true>(t);
  } else {
    run_rows<L::kMR, false>(t);
  }
}

// pack_activations_s16 (kernel.h) in 16-element vectors: the compiler's loop of the
// generic build took 1/4 of a 1x1 16 -> 16 layer at 320x320 (K = 16: a loop set up per
// row of 16) and more with odd K. Rows that follow each other without padding (uint8 x of
// K = Kp columns at that stride) are one stream; otherwise each row's last vector
// overlaps the one before it (the same values written twice).
void pack_activations_s16_avx2(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t Kp,
                               int64_t m_begin, int64_t m_end, int16_t* dst) {
  const uint8_t flip_byte = x_signed ? 0x80 : 0x00;
  const __m128i flip = _mm_set1_epi8(static_cast<char>(flip_byte));
  const uint8_t* src = static_cast<const uint8_t*>(x);
  if (x_row_stride == K && K == Kp) {
    const uint8_t* s = src + m_begin * K;
    int16_t* d = dst + m_begin * Kp;
    const int64_t n = (m_end - m_begin) * K;
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) widen16(s + i, flip, d + i);
    for (; i < n; ++i) d[i] = static_cast<int16_t>(static_cast<uint8_t>(s[i] ^ flip_byte));
    return;
  }
  for (int64_t m = m_begin; m < m_end; ++m) {
    const uint8_t* s = src + m * x_row_stride;
    int16_t* d = dst + m * Kp;
    if (K >= 16) {
      for (int64_t k = 0; k + 16 <= K; k += 16) widen16(s + k, flip, d + k);
      if (K % 16) widen16(s + K - 16, flip, d + K - 16);
    } else {
      for (int64_t k = 0; k < K; ++k) d[k] = static_cast<int16_t>(static_cast<uint8_t>(s[k] ^ flip_byte));
    }
    for (int64_t k = K; k < Kp; ++k) d[k] = 0;
  }
}

namespace {

// qgemm_row_avx2_narrow (kernel.h): row 0's two vectors of one panel through the output stage.
__attribute__((always_inline)) inline void finish_row_panel(__m256i v0, __m256i v1, const Epilogue& e, int64_t n0,
                                                            int64_t N) {
  __m256i zw[2], cs[2];
  fold_columns<simd::I32x8>(e, n0, zw, cs);
  fold_row<simd::I32x8>(v0, v1, e, 0, zw, cs);
  const int cols = static_cast<int>(std::min<int64_t>(kNR, N - n0));
  if (e.kind == EpiKind::kF32 && !e.mult_row && cols == kNR) {
    // finish_vector's kF32 case, inline: f = min(max(f32(v) · m[n] (+ b[n]), flo), fhi)
    const __m256 lo = _mm256_set1_ps(e.flo), hi = _mm256_set1_ps(e.fhi);
    __m256 f0 = _mm256_mul_ps(_mm256_cvtepi32_ps(v0), _mm256_loadu_ps(e.multiplier + n0));
    __m256 f1 = _mm256_mul_ps(_mm256_cvtepi32_ps(v1), _mm256_loadu_ps(e.multiplier + n0 + 8));
    if (e.float_bias) {
      f0 = _mm256_add_ps(f0, _mm256_loadu_ps(e.float_bias + n0));
      f1 = _mm256_add_ps(f1, _mm256_loadu_ps(e.float_bias + n0 + 8));
    }
    float* y = static_cast<float*>(e.y) + n0;
    _mm256_storeu_ps(y, _mm256_min_ps(_mm256_max_ps(f0, lo), hi));
    _mm256_storeu_ps(y + 8, _mm256_min_ps(_mm256_max_ps(f1, lo), hi));
    return;
  }
  finish_vector(v0, e, 0, n0, cols);
  if (cols > 8) finish_vector(v1, e, 0, n0 + 8, cols - 8);
}

}  // namespace

void qgemm_row_avx2_narrow(const uint8_t* a, int64_t Kp, const uint8_t* w_panels, int64_t pb, int64_t pe, int64_t N,
                           const Epilogue& e) {
  constexpr int kKR4 = Avx2NarrowLayout::kKR;
  const __m256i ones = _mm256_set1_epi16(1);
  const int64_t panel_bytes = Kp * kNR;
  const auto step = [&](__m256i xa, const int8_t* b, __m256i& c0, __m256i& c1) {
    const __m256i b0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b));
    const __m256i b1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(b + 32));
    c0 = _mm256_add_epi32(c0, _mm256_madd_epi16(_mm256_maddubs_epi16(xa, b0), ones));
    c1 = _mm256_add_epi32(c1, _mm256_madd_epi16(_mm256_maddubs_epi16(xa, b1), ones));
  };
  const auto colterm = [&](int64_t n) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(e.colterm + n)); };
  int64_t p = pb;
  for (; p + 2 <= pe; p += 2) {
    const int64_t n0 = p * kNR;
    const int8_t* b = reinterpret_cast<const int8_t*>(w_panels + p * panel_bytes);
    const int8_t* b2 = b + panel_bytes;
    __m256i c0 = colterm(n0), c1 = colterm(n0 + 8), c2 = colterm(n0 + 16), c3 = colterm(n0 + 24);
    for (int64_t k = 0; k < Kp; k += kKR4) {
      const __m256i xa = _mm256_set1_epi32(load_unaligned<int32_t>(a + k));
      step(xa, b, c0, c1);
      step(xa, b2, c2, c3);
      b += kNR * kKR4;
      b2 += kNR * kKR4;
    }
    finish_row_panel(c0, c1, e, n0, N);
    finish_row_panel(c2, c3, e, n0 + kNR, N);
  }
  if (p < pe) {
    const int64_t n0 = p * kNR;
    const int8_t* b = reinterpret_cast<const int8_t*>(w_panels + p * panel_bytes);
    __m256i c0 = colterm(n0), c1 = colterm(n0 + 8);
    for (int64_t k = 0; k < Kp; k += kKR4) {
      step(_mm256_set1_epi32(load_unaligned<int32_t>(a + k)), b, c0, c1);
      b += kNR * kKR4;
    }
    finish_row_panel(c0, c1, e, n0, N);
  }
}

// The pair-safe family reads uint8 x' in place, so it also serves the implicit convolution's
// indirect rows (TileArgs::a_rows) over the padded NHWC image of uint8 x'.
void qgemm_tiles_avx2_narrow(const TileArgs& t) {
  if (t.a_rows) {
    run_rows<Avx2NarrowLayout::kMR, true, true>(t);
  } else {
    run_rows<Avx2NarrowLayout::kMR, true>(t);
  }
}

}  // namespace qgemm
}  // namespace quanta
