// AVX2 + FMA float micro-kernels (contract: sgemm.h): an R × 16 tile (two ymm columns per
// row, R ≤ 6 on a row-major A, R ≤ 4 on a packed one),
// the depthwise rows, 8 output pixels per ymm, up to 4 ymm per step, and the lane moves
// of the NCHW16c reorders.
#include <immintrin.h>

#include <algorithm>

#include "sgemm/dw_row.h"
#include "sgemm/gemv_ymm.h"
#include "sgemm/sgemm.h"

namespace quanta {
namespace sgemm {
namespace {

// Lanes [0, n) set (n clamped to [0, 8]).
inline __m256i lane_mask(int n) {
  n = n < 0 ? 0 : n > 8 ? 8 : n;
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Full: all 8 lanes (plain loads; the bytes of the masked form with every lane set).
template <bool Full>
inline __m256 load8(const float* p, __m256i m) {
  return Full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m);
}
template <bool Full>
inline void store8(float* p, __m256i m, __m256 v) {
  if (Full) {
    _mm256_storeu_ps(p, v);
  } else {
    _mm256_maskstore_ps(p, m, v);
  }
}

template <bool Full>
inline __m256 finish(__m256 v, const Epilogue& ep, float row_bias, const float* col_bias, __m256i m) {
  if (ep.alpha != 1.0f) v = _mm256_mul_ps(v, _mm256_set1_ps(ep.alpha));
  if (ep.bias_row) v = _mm256_add_ps(v, _mm256_set1_ps(row_bias));
  if (col_bias) v = _mm256_add_ps(v, load8<Full>(col_bias, m));
  if (ep.lo != -__builtin_inff()) v = _mm256_max_ps(_mm256_set1_ps(ep.lo), v);
  if (ep.hi != __builtin_inff()) v = _mm256_min_ps(_mm256_set1_ps(ep.hi), v);
  return v;
}

// Named accumulators, not arrays: GCC stored __m256 accumulator arrays back to the stack
// on every k step (see sgemm_avx512vnni.cc). `if (R > r)` is resolved at compile time.
// Six rows (12 accumulators, 2 B vectors, 1 broadcast: 15 of the 16 ymm) keep more FMAs
// in flight than Zen 3's 2 per cycle × 4 cycles of latency need, and load 8 operands per
// 12 FMAs instead of 6 per 8; packed A panels are 8 rows, so packed A stops at 4.
#define QUANTA_SGEMM_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)

// Full: nr = 16 (both ymm columns whole). kPrefetch: t.pf is set (a packed B streamed by
// run_block_stream); each k step prefetches the two lines of one 32-column panel row
// there, as the AVX-512 tile does. Without it a short-M product on a weight that is not
// in cache (a model's next layer) waits on B: 24 x 2048 x 256 ran at 61 GF/s against 76
// with the weight in L2.
template <int R, bool kPacked, bool Full, bool kPrefetch>
void tile_body(const Tile& t) {
  const __m256i m0 = lane_mask(t.nr), m1 = lane_mask(t.nr - 8);
  const bool two = Full || t.nr > 8;
#define DECL(r) __m256 c0_##r = _mm256_setzero_ps(), c1_##r = _mm256_setzero_ps();
  QUANTA_SGEMM_ROWS(DECL)
#undef DECL
  if (t.load_c) {
#define LOADC(r)                                            \
  if (R > r) {                                              \
    c0_##r = load8<Full>(t.c + r * t.ldc, m0);              \
    if (two) c1_##r = load8<Full>(t.c + r * t.ldc + 8, m1); \
  }
    QUANTA_SGEMM_ROWS(LOADC)
#undef LOADC
  }
  const float* b = t.b;
  const float* a = t.a;
  const int64_t rs = kPacked ? 1 : t.a_rs;
  const char* pf = reinterpret_cast<const char*>(t.pf);
  for (int64_t k = 0; k < t.k; ++k) {
    if (kPrefetch) {
      _mm_prefetch(pf, _MM_HINT_T0);
      _mm_prefetch(pf + 64, _MM_HINT_T0);
      pf += kPackNr * sizeof(float);
    }
    const __m256 b0 = load8<Full>(b, m0);
    const __m256 b1 = load8<Full>(b + 8, m1);
#define STEP(r)                                        \
  if (R > r) {                                         \
    const __m256 av = _mm256_broadcast_ss(a + r * rs); \
    c0_##r = _mm256_fmadd_ps(av, b0, c0_##r);          \
    c1_##r = _mm256_fmadd_ps(av, b1, c1_##r);          \
  }
    QUANTA_SGEMM_ROWS(STEP)
#undef STEP
    a += kPacked ? kPackMr : 1;
    b += t.ldb;
  }
  const Epilogue* ep = t.ep;
  const float* cb = ep && ep->bias_col ? ep->bias_col + t.col0 : nullptr;
#define STORE(r)                                                            \
  if (R > r) {                                                              \
    float* c = t.c + r * t.ldc;                                             \
    __m256 v0 = c0_##r, v1 = c1_##r;                                        \
    if (ep) {                                                               \
      const float rb = ep->bias_row ? ep->bias_row[t.row0 + r] : 0.0f;      \
      v0 = finish<Full>(v0, *ep, rb, cb, m0);                               \
      v1 = two ? finish<Full>(v1, *ep, rb, cb ? cb + 8 : nullptr, m1) : v1; \
    }                                                                       \
    store8<Full>(c, m0, v0);                                                \
    if (two) store8<Full>(c + 8, m1, v1);                                   \
  }
  QUANTA_SGEMM_ROWS(STORE)
#undef STORE
}

template <int R, bool kPacked>
void tile(const Tile& t) {
  if (t.nr == 16 && t.pf) {
    tile_body<R, kPacked, true, true>(t);
  } else if (t.nr == 16) {
    tile_body<R, kPacked, true, false>(t);
  } else {
    tile_body<R, kPacked, false, false>(t);
  }
}

#undef QUANTA_SGEMM_ROWS

void pack_gather8(const float* src, const int32_t* base, const int64_t* tap, int64_t k, float* dst) {
  const __m256i idx = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(base));
  for (int64_t kk = 0; kk < k; ++kk) _mm256_storeu_ps(dst + kk * 8, _mm256_i32gather_ps(src + tap[kk], idx, 4));
}

// r[i] (8 rows of 8 floats) becomes its transpose: r[c] holds column c. Unpack pairs of
// rows, shuffle pairs of pairs (128-bit lane L of s[k] holds column 4L + k of rows 0-3,
// of s[4 + k] of rows 4-7), then join the 128-bit halves.
inline void transpose8(__m256 r[8]) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int j = 0; j < 2; ++j) {
    s[4 * j + 0] = _mm256_shuffle_ps(t[4 * j + 0], t[4 * j + 2], 0x44);
    s[4 * j + 1] = _mm256_shuffle_ps(t[4 * j + 0], t[4 * j + 2], 0xEE);
    s[4 * j + 2] = _mm256_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0x44);
    s[4 * j + 3] = _mm256_shuffle_ps(t[4 * j + 1], t[4 * j + 3], 0xEE);
  }
  for (int k = 0; k < 4; ++k) {
    r[k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x20);
    r[4 + k] = _mm256_permute2f128_ps(s[k], s[4 + k], 0x31);
  }
}

// sgemm.h Interleave16Fn / Deinterleave16Fn in 8 x 8 transposes, one 8-lane half of the
// block at a time: the NCHW16c reorders (nchwc.cc) wrote or read one element at a time at
// a 64-byte stride (ppocrv3_det: 10 ms of reorders at 1 thread against ONNX Runtime's 2.3).
void interleave16(const float* src, int64_t ld, int cb, int64_t n, float* dst) {
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int m = static_cast<int>(std::min<int64_t>(8, n - i0));
    const __m256i k = lane_mask(m);
    for (int h = 0; h < 2; ++h) {
      __m256 r[8];
      for (int l = 0; l < 8; ++l) {
        const int lane = 8 * h + l;
        r[l] = lane >= cb ? _mm256_setzero_ps()
               : m == 8   ? _mm256_loadu_ps(src + lane * ld + i0)
                          : _mm256_maskload_ps(src + lane * ld + i0, k);
      }
      transpose8(r);
      for (int p = 0; p < m; ++p) _mm256_storeu_ps(dst + (i0 + p) * 16 + 8 * h, r[p]);
    }
  }
}

void deinterleave16(const float* src, int64_t n, int cb, float* dst, int64_t ld) {
  for (int64_t i0 = 0; i0 < n; i0 += 8) {
    const int m = static_cast<int>(std::min<int64_t>(8, n - i0));
    const __m256i k = lane_mask(m);
    for (int h = 0; h < 2 && 8 * h < cb; ++h) {
      __m256 r[8];
      for (int p = 0; p < 8; ++p) r[p] = p < m ? _mm256_loadu_ps(src + (i0 + p) * 16 + 8 * h) : _mm256_setzero_ps();
      transpose8(r);
      for (int l = 0; l < 8 && 8 * h + l < cb; ++l) {
        float* d = dst + (8 * h + l) * ld + i0;
        if (m == 8) {
          _mm256_storeu_ps(d, r[l]);
        } else {
          _mm256_maskstore_ps(d, k, r[l]);
        }
      }
    }
  }
}

// ---- direct convolution rows (sgemm.h DirectRow) -------------------------------------------
// A tile is 4 output channels × NV ≤ 3 vectors of 8 consecutive output pixels of one
// row (channels m ≥ 4 of d: the first 4): 12 accumulators, the NV input vectors of a tap
// and one broadcast weight (16 ymm); per tap NV unaligned loads of the padded input row and
// 4 broadcasts feed 4·NV fmas, no packing. Tail: the tile's last vector passes ow (masked
// stores). KH, KW: the window as compile-time constants (0: read from d).
//
// With a constant window the taps of one channel are straight-line code, each behind an
// empty asm with a memory clobber: without it GCC hoisted the next taps' broadcasts and
// input loads above the fmas, ran out of the 16 ymm and kept 5 of the 12 accumulators on
// the stack (a store and a reload on each of their chains every (c, ky) step). With it
// each tap is 3 loads, 4 broadcasts and 12 fmas on registers (checked in the generated
// code: no stack traffic in the channel loop), and the kh row pointers stay in registers,
// advanced by their channel strides.
#define QUANTA_DIRECT_ROWS(X) X(0) X(1) X(2) X(3)

template <int NV, bool Tail, int KH, int KW>
void direct_tile(const DirectRow& d, int64_t ox0) {
#define DECL(r) __m256 a0_##r = _mm256_setzero_ps(), a1_##r = _mm256_setzero_ps(), a2_##r = _mm256_setzero_ps();
  QUANTA_DIRECT_ROWS(DECL)
#undef DECL
  const float* wk = d.a;
  auto tap = [&](const float* p) __attribute__((always_inline)) {
    asm volatile("" ::: "memory");
    const __m256 x0 = _mm256_loadu_ps(p);
    const __m256 x1 = NV < 2 ? x0 : _mm256_loadu_ps(p + 8);
    const __m256 x2 = NV < 3 ? x0 : _mm256_loadu_ps(p + 16);
#define STEP(r)                                           \
  {                                                       \
    const __m256 wv = _mm256_broadcast_ss(wk + r);        \
    a0_##r = _mm256_fmadd_ps(wv, x0, a0_##r);             \
    if (NV > 1) a1_##r = _mm256_fmadd_ps(wv, x1, a1_##r); \
    if (NV > 2) a2_##r = _mm256_fmadd_ps(wv, x2, a2_##r); \
  }
    QUANTA_DIRECT_ROWS(STEP)
#undef STEP
    wk += 4;
  };
  if constexpr (KH > 0 && KW > 0) {
    const float* row[KH];
    int64_t cs[KH];
#pragma GCC unroll 8
    for (int ky = 0; ky < KH; ++ky) {
      row[ky] = d.rows[ky] + ox0 - d.pl;
      cs[ky] = d.cstride[ky];
    }
    for (int64_t c = 0; c < d.c; ++c) {
#pragma GCC unroll 8
      for (int ky = 0; ky < KH; ++ky) {
#pragma GCC unroll 8
        for (int kx = 0; kx < KW; ++kx) tap(row[ky] + kx);
        row[ky] += cs[ky];
      }
    }
  } else {
    for (int64_t c = 0; c < d.c; ++c) {
      for (int64_t ky = 0; ky < d.kh; ++ky) {
        const float* row = d.rows[ky] + c * d.cstride[ky] + ox0 - d.pl;
#pragma GCC unroll 1
        for (int64_t kx = 0; kx < d.kw; ++kx) tap(row + kx);
      }
    }
  }
  Epilogue ep;
  ep.bias_row = d.bias;
  ep.lo = d.lo;
  ep.hi = d.hi;
  const __m256i m0 = lane_mask(static_cast<int>(std::min<int64_t>(d.ow - ox0, 8)));
  const __m256i m1 = lane_mask(static_cast<int>(std::min<int64_t>(d.ow - ox0 - 8, 8)));
  const __m256i m2 = lane_mask(static_cast<int>(std::min<int64_t>(d.ow - ox0 - 16, 8)));
#define STORE(r)                                                                      \
  if (d.m > r) {                                                                      \
    float* y = d.y + r * d.ldy + ox0;                                                 \
    const float rb = d.bias ? d.bias[r] : 0.0f;                                       \
    store8<!Tail>(y, m0, finish<true>(a0_##r, ep, rb, nullptr, m0));                  \
    if (NV > 1) store8<!Tail>(y + 8, m1, finish<true>(a1_##r, ep, rb, nullptr, m1));  \
    if (NV > 2) store8<!Tail>(y + 16, m2, finish<true>(a2_##r, ep, rb, nullptr, m2)); \
  }
  QUANTA_DIRECT_ROWS(STORE)
#undef STORE
}

template <int NV, int KH, int KW>
void direct_tile_at(const DirectRow& d, int64_t ox0) {
  if (ox0 + 8 * NV <= d.ow) {
    direct_tile<NV, false, KH, KW>(d, ox0);
  } else {
    direct_tile<NV, true, KH, KW>(d, ox0);
  }
}

// Tiles of 3 vectors; a row's last 4 vectors as 2 + 2 (a 1-vector tile has 4
// accumulators, too few chains for 2 fmas a cycle at latency 4).
// Per tile position every group of 4 channels in turn: the tile's input runs (C·kh
// rows of 8·NV + kw − 1 floats) stay in L1 while the groups' weights stream past.
template <int NV, int KH, int KW>
void direct_groups_at(const DirectRow& d, int64_t ox0) {
  const int64_t kk = d.c * d.kh * d.kw;
  DirectRow q = d;
  for (int64_t i0 = 0; i0 < d.m; i0 += 4) {
    q.a = d.a + i0 * kk;
    q.m = d.m - i0;
    q.bias = d.bias ? d.bias + i0 : nullptr;
    q.y = d.y + i0 * d.ldy;
    direct_tile_at<NV, KH, KW>(q, ox0);
  }
}

template <int KH, int KW>
void direct_row_k(const DirectRow& d) {
  int64_t left = (d.ow + 7) / 8, ox0 = 0;
  for (; left > 4; left -= 3, ox0 += 24) direct_groups_at<3, KH, KW>(d, ox0);
  if (left == 4) {
    direct_groups_at<2, KH, KW>(d, ox0);
    direct_groups_at<2, KH, KW>(d, ox0 + 16);
  } else if (left == 3) {
    direct_groups_at<3, KH, KW>(d, ox0);
  } else if (left == 2) {
    direct_groups_at<2, KH, KW>(d, ox0);
  } else if (left == 1) {
    direct_groups_at<1, KH, KW>(d, ox0);
  }
}

// The windows of the zoo's direct-rows layers as constants (3x3; 3x1 and 1x3 in
// oww_embedding), any other window from d.
void direct_row(const DirectRow& d) {
  if (d.kh == 3 && d.kw == 3) {
    direct_row_k<3, 3>(d);
  } else if (d.kh == 3 && d.kw == 1) {
    direct_row_k<3, 1>(d);
  } else if (d.kh == 1 && d.kw == 3) {
    direct_row_k<1, 3>(d);
  } else {
    direct_row_k<0, 0>(d);
  }
}

}  // namespace

extern const Kernels kKernelsAvx2 = {
    "avx2",
    4,
    16,
    6,
    {{nullptr, tile<1, false>, tile<2, false>, tile<3, false>, tile<4, false>, tile<5, false>, tile<6, false>, nullptr,
      nullptr},
     {nullptr, tile<1, true>, tile<2, true>, tile<3, true>, tile<4, true>, nullptr, nullptr, nullptr, nullptr}},
    {},  // tile_indirect: the implicit GEMM packs B panels
    dw::row<simd::F32x8>,
    ymm::gemv,
    nullptr,  // dw_block16: small planes take the row kernel
    dw::rows2<simd::F32x8>,
    interleave16,  // the NCHW16c reorders (dw_block16 is null: small planes stay on the row kernel)
    deinterleave16,
    nullptr,  // dw_rows2_split: stride 2 takes dw_rows2 / dw_row
    nullptr,
    pack_gather8,
    direct_row,
};

}  // namespace sgemm
}  // namespace quanta
