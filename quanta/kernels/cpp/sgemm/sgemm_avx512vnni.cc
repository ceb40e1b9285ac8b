// AVX-512 float micro-kernels (contract: sgemm.h): an R × 32 tile (two zmm columns per row,
// R ≤ 8, 16 accumulators at R = 8: enough independent chains to keep both FMA pipes busy),
// and the depthwise rows, 16 output pixels per zmm, up to 4 zmm per step.
#include <immintrin.h>

#include <algorithm>

#include "sgemm/dw_row.h"
#include "sgemm/gemv_ymm.h"
#include "sgemm/sgemm.h"

namespace quanta {
namespace sgemm {
namespace {

inline __mmask16 lane_mask(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xFFFF) : n <= 0 ? 0 : static_cast<__mmask16>((1u << n) - 1);
}

// The epilogue of sgemm.h on one vector: α, row bias, column bias, clamp (max(lo, v) keeps
// a NaN v: vmaxps returns its second operand when either is NaN).
inline __m512 finish(__m512 v, const Epilogue& ep, float row_bias, const float* col_bias, __mmask16 m) {
  if (ep.alpha != 1.0f) v = _mm512_mul_ps(v, _mm512_set1_ps(ep.alpha));
  if (ep.bias_row) v = _mm512_add_ps(v, _mm512_set1_ps(row_bias));
  if (col_bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, col_bias));
  if (ep.lo != -__builtin_inff()) v = _mm512_max_ps(_mm512_set1_ps(ep.lo), v);
  if (ep.hi != __builtin_inff()) v = _mm512_min_ps(_mm512_set1_ps(ep.hi), v);
  return v;
}

// A element (i, k): packed panel (a[i + 8k]) or row-major (a[i·rs + k]).
//
// The accumulators are named variables, not arrays: GCC kept two __m512[8] arrays in
// registers but also stored all 16 back to the stack on every k step (arrays of 1 KB
// exceed its scalar-replacement limit), which made the loop store-bound at a quarter of
// the FMA rate. `if (R > r)` is resolved at compile time.
#define QUANTA_SGEMM_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5) X(6) X(7)

template <int R, bool kPacked, bool kTwo, bool kIndirect = false, bool kPrefetch = false>
void tile_impl(const Tile& t) {
  const __mmask16 m0 = lane_mask(t.nr), m1 = lane_mask(t.nr - 16);
#define DECL(r) __m512 c0_##r = _mm512_setzero_ps(), c1_##r = _mm512_setzero_ps();
  QUANTA_SGEMM_ROWS(DECL)
#undef DECL
  if (t.load_c) {
#define LOADC(r)                                                        \
  if (R > r) {                                                          \
    c0_##r = _mm512_maskz_loadu_ps(m0, t.c + r * t.ldc);                \
    if (kTwo) c1_##r = _mm512_maskz_loadu_ps(m1, t.c + r * t.ldc + 16); \
  }
    QUANTA_SGEMM_ROWS(LOADC)
#undef LOADC
  }
  const float* b = t.b;
  const int64_t ldb = t.ldb;
  const float* a = t.a;
  const int64_t rs = kPacked ? 1 : t.a_rs;
  const int64_t* boff = t.boff;
  const char* pf = reinterpret_cast<const char*>(t.pf);
  for (int64_t k = 0; k < t.k; ++k) {
    if (kPrefetch) {
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      pf += kPackNr * sizeof(float);
    }
    const float* bk = kIndirect ? t.b + boff[k] : b;
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, bk);
    const __m512 b1 = kTwo ? _mm512_maskz_loadu_ps(m1, bk + 16) : b0;
#define STEP(r)                                                   \
  if (R > r) {                                                    \
    const __m512 av = _mm512_set1_ps(kPacked ? a[r] : a[r * rs]); \
    c0_##r = _mm512_fmadd_ps(av, b0, c0_##r);                     \
    if (kTwo) c1_##r = _mm512_fmadd_ps(av, b1, c1_##r);           \
  }
    QUANTA_SGEMM_ROWS(STEP)
#undef STEP
    a += kPacked ? kPackMr : 1;
    b += ldb;
  }
  const Epilogue* ep = t.ep;
  const float* cb = ep && ep->bias_col ? ep->bias_col + t.col0 : nullptr;
#define STORE(r)                                                       \
  if (R > r) {                                                         \
    float* c = t.c + r * t.ldc;                                        \
    __m512 v0 = c0_##r, v1 = c1_##r;                                   \
    if (ep) {                                                          \
      const float rb = ep->bias_row ? ep->bias_row[t.row0 + r] : 0.0f; \
      v0 = finish(v0, *ep, rb, cb, m0);                                \
      if (kTwo) v1 = finish(v1, *ep, rb, cb ? cb + 16 : nullptr, m1);  \
    }                                                                  \
    _mm512_mask_storeu_ps(c, m0, v0);                                  \
    if (kTwo) _mm512_mask_storeu_ps(c + 16, m1, v1);                   \
  }
  QUANTA_SGEMM_ROWS(STORE)
#undef STORE
}

#undef QUANTA_SGEMM_ROWS

template <int R, bool kPacked>
void tile(const Tile& t) {
  if (t.nr > 16 && t.pf) {
    tile_impl<R, kPacked, true, false, true>(t);
  } else if (t.nr > 16) {
    tile_impl<R, kPacked, true>(t);
  } else {
    tile_impl<R, kPacked, false>(t);
  }
}

template <int R>
void tile_indirect(const Tile& t) {
  if (t.nr > 16) {
    tile_impl<R, true, true, true>(t);
  } else {
    tile_impl<R, true, false, true>(t);
  }
}

// V output pixels of one row at once (V independent fma chains: the FMA latency is
// hidden behind the others), 16 channels per lane.
template <int V>
inline void dw_block_pixels(const float* buf, int64_t wp, const float* w16, __m512 bias, int kh, int kw, int sw, int dh,
                            int dw, int64_t row0, int64_t ox0, float lo, float hi, float* out) {
  __m512 acc[V];
  for (int v = 0; v < V; ++v) acc[v] = _mm512_setzero_ps();
  for (int ky = 0; ky < kh; ++ky) {
    const float* r = buf + (row0 + ky * dh) * wp * 16;
    for (int kx = 0; kx < kw; ++kx) {
      const __m512 wv = _mm512_loadu_ps(w16 + (ky * kw + kx) * 16);
      const float* p = r + (ox0 * sw + kx * dw) * 16;
      for (int v = 0; v < V; ++v) acc[v] = _mm512_fmadd_ps(wv, _mm512_loadu_ps(p + v * sw * 16), acc[v]);
    }
  }
  for (int v = 0; v < V; ++v) {
    __m512 r = _mm512_add_ps(acc[v], bias);
    if (lo != -__builtin_inff()) r = _mm512_max_ps(_mm512_set1_ps(lo), r);
    if (hi != __builtin_inff()) r = _mm512_min_ps(_mm512_set1_ps(hi), r);
    _mm512_storeu_ps(out + (ox0 + v) * 16, r);
  }
}

void dw_block16(const float* buf, int64_t wp, const float* w16, const float* bias16, int kh, int kw, int sh, int sw,
                int dh, int dw, int64_t oh, int64_t ow, float lo, float hi, float* out16) {
  const __m512 bias = _mm512_loadu_ps(bias16);
  for (int64_t oy = 0; oy < oh; ++oy) {
    float* out = out16 + oy * ow * 16;
    const int64_t row0 = oy * sh;
    int64_t ox = 0;
    for (; ox + 8 <= ow; ox += 8) dw_block_pixels<8>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out);
    switch (ow - ox) {
      case 7: dw_block_pixels<7>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out); break;
      case 6: dw_block_pixels<6>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out); break;
      case 5: dw_block_pixels<5>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out); break;
      case 4: dw_block_pixels<4>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out); break;
      case 3: dw_block_pixels<3>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out); break;
      case 2: dw_block_pixels<2>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out); break;
      case 1: dw_block_pixels<1>(buf, wp, w16, bias, kh, kw, sw, dh, dw, row0, ox, lo, hi, out); break;
      default: break;
    }
  }
}

// r[i] (16 rows of 16 floats) becomes its transpose: r[c] holds column c. Unpack pairs of
// rows, then pairs of pairs (each 128-bit lane L of b[4j + k] holds column 4L + k of rows
// 4j .. 4j + 3), then a 4 x 4 transpose of the 128-bit lanes per k.
inline void transpose16(__m512 r[16]) {
  __m512 a[16], b[16];
  for (int i = 0; i < 8; ++i) {
    a[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    a[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int j = 0; j < 4; ++j) {
    b[4 * j + 0] = _mm512_shuffle_ps(a[4 * j + 0], a[4 * j + 2], 0x44);
    b[4 * j + 1] = _mm512_shuffle_ps(a[4 * j + 0], a[4 * j + 2], 0xEE);
    b[4 * j + 2] = _mm512_shuffle_ps(a[4 * j + 1], a[4 * j + 3], 0x44);
    b[4 * j + 3] = _mm512_shuffle_ps(a[4 * j + 1], a[4 * j + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    const __m512 c0 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0x88), c1 = _mm512_shuffle_f32x4(b[k], b[4 + k], 0xDD);
    const __m512 c2 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0x88);
    const __m512 c3 = _mm512_shuffle_f32x4(b[8 + k], b[12 + k], 0xDD);
    r[k] = _mm512_shuffle_f32x4(c0, c2, 0x88);
    r[8 + k] = _mm512_shuffle_f32x4(c0, c2, 0xDD);
    r[4 + k] = _mm512_shuffle_f32x4(c1, c3, 0x88);
    r[12 + k] = _mm512_shuffle_f32x4(c1, c3, 0xDD);
  }
}

void interleave16(const float* src, int64_t ld, int cb, int64_t n, float* dst) {
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int m = static_cast<int>(std::min<int64_t>(16, n - i0));
    const __mmask16 k = static_cast<__mmask16>((1u << m) - 1u);
    __m512 r[16];
    for (int l = 0; l < 16; ++l) r[l] = l < cb ? _mm512_maskz_loadu_ps(k, src + l * ld + i0) : _mm512_setzero_ps();
    transpose16(r);
    for (int p = 0; p < m; ++p) _mm512_storeu_ps(dst + (i0 + p) * 16, r[p]);
  }
}

void deinterleave16(const float* src, int64_t n, int cb, float* dst, int64_t ld) {
  for (int64_t i0 = 0; i0 < n; i0 += 16) {
    const int m = static_cast<int>(std::min<int64_t>(16, n - i0));
    const __mmask16 k = static_cast<__mmask16>((1u << m) - 1u);
    __m512 r[16];
    for (int p = 0; p < 16; ++p) r[p] = p < m ? _mm512_loadu_ps(src + (i0 + p) * 16) : _mm512_setzero_ps();
    transpose16(r);
    for (int l = 0; l < cb; ++l) _mm512_mask_storeu_ps(dst + l * ld + i0, k, r[l]);
  }
}

void split2(const float* src, int64_t n, float* even, float* odd) {
  const __m512i ev = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
  const __m512i od = _mm512_setr_epi32(1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
  for (int64_t i = 0; i < n; i += 32) {
    const int64_t m = std::min<int64_t>(32, n - i);
    const __m512 lo = _mm512_maskz_loadu_ps(simd::F32x16::tail(m), src + i);
    const __m512 hi = _mm512_maskz_loadu_ps(simd::F32x16::tail(m - 16), src + i + 16);
    _mm512_mask_storeu_ps(even + i / 2, simd::F32x16::tail((m + 1) / 2), _mm512_permutex2var_ps(lo, ev, hi));
    _mm512_mask_storeu_ps(odd + i / 2, simd::F32x16::tail(m / 2), _mm512_permutex2var_ps(lo, od, hi));
  }
}

void pack_gather8(const float* src, const int32_t* base, const int64_t* tap, int64_t k, float* dst) {
  const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base));
  for (int64_t kk = 0; kk < k; ++kk) _mm256_storeu_ps(dst + kk * 8, _mm256_i32gather_ps(src + tap[kk], idx, 4));
}

}  // namespace

extern const Kernels kKernelsAvx512Vnni = {
    "avx512vnni",
    8,
    32,
    8,
    {{nullptr, tile<1, false>, tile<2, false>, tile<3, false>, tile<4, false>, tile<5, false>, tile<6, false>,
      tile<7, false>, tile<8, false>},
     {nullptr, tile<1, true>, tile<2, true>, tile<3, true>, tile<4, true>, tile<5, true>, tile<6, true>, tile<7, true>,
      tile<8, true>}},
    {nullptr, tile_indirect<1>, tile_indirect<2>, tile_indirect<3>, tile_indirect<4>, tile_indirect<5>,
     tile_indirect<6>, tile_indirect<7>, tile_indirect<8>},
    dw::row<simd::F32x16>,
    ymm::gemv,
    dw_block16,
    dw::rows2<simd::F32x16>,
    interleave16,
    deinterleave16,
    dw::rows2_split<simd::F32x16>,
    split2,
    pack_gather8,
    nullptr,  // direct_row: the implicit GEMM
};

}  // namespace sgemm
}  // namespace quanta
