// qgemm_u8s8_s32_12x32c4__avx512vnni (layout: kernel.h Avx512VnniLayout).
//
// Register tile: MR = 12 rows x NR = 32 columns = 24 zmm int32 accumulators. Per group of
// KR = 4 k values: two 64-byte loads of the packed panel (32 columns x 4 k, int8), one
// vpbroadcastd of 4 x' bytes per row, and 2·MR vpdpbusd
//   acc[r][j] += Σ_{t<4} u8(x'[r, k+t]) · s8(w'[k+t, 16j + lane])   (exact in int32).
// vpdpbusd takes u8 x s8, hence the u8 shift of int8 x done by the driver (eq. (8)).
// The 12-row k-loop is one inline-asm block (tile12: the accumulators pinned in zmm0-23,
// GCC 12 spills 24 accumulators written with intrinsics); the shorter tiles (the M edge)
// and the indirect rows are the intrinsics tile below, up to 8 rows.
// With 1 or 2 rows (GEMV) the k-groups alternate between two accumulator sets so that
// vpdpbusd's 5-cycle latency is hidden; the sets are added at the end (exact).
// Indirect rows (TileArgs::a_rows, the implicit convolution): one x' pointer per row and
// several tap chunks per call, the accumulators in registers across them (tile_indirect).
//
// Epilogue fused on the accumulators (qgemm.h contract). The first K chunk of a tile
// (accumulate = false) starts its sums from colterm = bias[n] − zx'·cs[n] rather than 0, so
// a partial sum already holds that term (int32 addition wraps: same bits in any order).
// The last chunk subtracts zw'·rowsum (and zx'[m]·cs for a per-row zx), then runs the
// output stage in zmm registers (float32 multiply, explicit round-to-nearest-even
// conversion), masked stores for the N edge; uint8/int8 outputs two rows at a time
// through saturating packs (Stage<kQ8Float>). The fixed-point stage runs the shared scalar
// code (kernel.h) per lane. The kind of output stage is dispatched once per tile, on a
// local copy of the Epilogue (see Stage).
//
// No fused multiply-add may replace float32(acc)·m + float_bias: the reference rounds the
// product first (this file is built with -mfma).
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
// GCC 12 reports a false -Wmaybe-uninitialized inside its own AVX-512 headers (the
// `__Y = __Y` idiom of _mm512_undefined_*), fixed in GCC 13.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <chrono>

#include "qgemm/fold.h"
#include "qgemm/kernel.h"
#include "qgemm/tune.h"
#include "simd.h"

namespace quanta {
namespace qgemm {
namespace {

using L = Avx512VnniLayout;
constexpr int kNR = L::kNR;
constexpr int kKR = L::kKR;
static_assert(L::kMR == 12 && kNR == 32 && kKR == 4, "the tiles below are written for 12 x (2 zmm) x 4 k");

// acc += Σ_{t<4} u8(a[4i+t]) · s8(b[4i+t]) per int32 lane. Written as a one-instruction asm
// so the accumulator stays in place: with the intrinsic, GCC 12 copies and spills the 16
// accumulators inside the k-loop (about half the peak).
#define QUANTA_VPDPBUSD(acc, a, b) __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b))

inline __mmask16 lane_mask(int valid) {
  return valid >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << valid) - 1u);
}

// The output stage of one kind on a 16-column vector, with its per-panel constants loaded
// once per tile. The caller works on a local copy of the Epilogue, so the stores through
// e.y cannot make the compiler reload its fields (which it did, per vector, when the
// stage read them through t.epi: about 70 cycles per 8 x 32 tile).
template <EpiKind KIND>
struct Stage;

template <>
struct Stage<EpiKind::kS32> {
  __m512i lo, hi;
  bool clamp;  // false for the full int32 range: the min/max would be no-ops
  __attribute__((always_inline)) Stage(const Epilogue& e, int64_t /*n0*/)
      : lo(_mm512_set1_epi32(e.lo)), hi(_mm512_set1_epi32(e.hi)), clamp(e.lo != INT32_MIN || e.hi != INT32_MAX) {}
  __attribute__((always_inline)) void store(__m512i v, int /*half*/, void* y, __mmask16 mask) const {
    if (clamp) v = _mm512_max_epi32(_mm512_min_epi32(v, hi), lo);
    _mm512_mask_storeu_epi32(y, mask, v);
  }
  static constexpr int kBytes = 4;
};

template <>
struct Stage<EpiKind::kF32> {
  __m512 mult[2], fbias[2], flo, fhi;
  bool has_fbias;
  __attribute__((always_inline)) Stage(const Epilogue& e, int64_t n0)
      : flo(_mm512_set1_ps(e.flo)),
        fhi(_mm512_set1_ps(e.fhi)),
        has_fbias(e.float_bias != nullptr),
        mult_row(e.mult_row) {
    for (int h = 0; h < 2; ++h) {
      mult[h] = mult_row ? _mm512_setzero_ps() : _mm512_loadu_ps(e.multiplier + n0 + 16 * h);
      fbias[h] = has_fbias ? _mm512_loadu_ps(e.float_bias + n0 + 16 * h) : _mm512_setzero_ps();
    }
  }
  const float* mult_row;  // the transposed stage: one multiplier per row
  int64_t m = 0;          // the row being stored (mult_row)
  __attribute__((always_inline)) void store(__m512i v, int half, void* y, __mmask16 mask) const {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), mult_row ? _mm512_set1_ps(mult_row[m]) : mult[half]);
    if (has_fbias) f = _mm512_add_ps(f, fbias[half]);  // a separate rounding: no FMA
    f = _mm512_min_ps(_mm512_max_ps(f, flo), fhi);
    _mm512_mask_storeu_ps(y, mask, f);
  }
  static constexpr int kBytes = 4;
};

// Two rows (4 vectors of 16 int32) at a time, packed to bytes with saturating packs
// instead of four narrowing stores (vpmovdb to memory is 2 port-5 uops + a store each;
// with K = 256 the output stage was ~12 % of an 8 x 32 tile). Same bytes as the contract:
//   v = fl(float32(acc)·m);  q = rne(min(v, H − zy))          (int32; below −2^31: INT32_MIN)
//   y = max(sat8(sat16(sat16(q) + zy)), L)                    (sat8: uint8 or int8 range)
// Proof: for v >= L − zy, rne(min(v, H − zy)) lies in [L − zy, H − zy] (both integers,
// rne is monotone), so no saturation happens and y = rne(clamp(v)) + zy. For v < L − zy,
// q <= L − zy, each saturation keeps the value <= L (L is in the output's range), so
// max(., L) = L, the contract's value. The lower float clamp is not needed, the upper one is
// (v >= 2^31 would convert to INT32_MIN). The int16 add saturates only when sat16 did,
// on the same side.
//
// With the second affine stage (qgemm.h post_k) round() returns the final code instead:
//   y = rne(min(max(v, L − zy), H − zy)) + zy     (float32, exact: integers in [L, H])
//   q = rne(min(fma(u[n], r2, fma(y, r1, k[n])), qmax))      (int32; below −2^31: INT32_MIN)
// and the packs add no zy: sat8(sat16(q)) is the contract's min(max(rne(g), qmin), qmax)
// (rne is monotone and qmin, qmax integers; g >= 2^31 would convert to INT32_MIN, hence
// the upper clamp; a g below qmin saturates to qmin however far below it lies).
template <>
struct Stage<EpiKind::kQ8Float> {
  __m512 mult[2], hi;
  __m512i zy16, lo8, perm;
  bool y_signed, clamp_lo;
  // the second affine stage
  bool post;
  __m512 lo, pk[2], pu[2], r1, r2, phi, zyf;
  __attribute__((always_inline)) Stage(const Epilogue& e, int64_t n0)
      : hi(_mm512_set1_ps(e.hi_minus_zy)),
        zy16(_mm512_set1_epi16(static_cast<int16_t>(e.zy))),
        lo8(_mm512_set1_epi8(static_cast<char>(e.lo))),
        // after the in-lane packs, lane l holds dwords (a0, a1, b0, b1) of columns 4l.. /
        // 16 + 4l..: row a's 32 bytes are dwords 0, 4, 8, 12, 1, 5, 9, 13, row b's the rest
        perm(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15)),
        y_signed(e.y_signed),
        clamp_lo(!e.post_k && e.lo != (e.y_signed ? -128 : 0)),
        post(e.post_k != nullptr),
        lo(_mm512_set1_ps(e.lo_minus_zy)),
        r1(_mm512_set1_ps(e.post_r1)),
        r2(_mm512_set1_ps(e.post_r2)),
        phi(_mm512_set1_ps(e.post_hi)),
        zyf(_mm512_set1_ps(static_cast<float>(e.zy))),
        mult_row(e.mult_row) {
    for (int h = 0; h < 2; ++h) {
      mult[h] = mult_row ? _mm512_setzero_ps() : _mm512_loadu_ps(e.multiplier + n0 + 16 * h);
      pk[h] = post ? _mm512_loadu_ps(e.post_k + n0 + 16 * h) : _mm512_setzero_ps();
      pu[h] = post ? _mm512_loadu_ps(e.post_u + n0 + 16 * h) : _mm512_setzero_ps();
    }
  }
  const float* mult_row;  // the transposed stage: one multiplier per row
  int64_t m = 0;          // row a of the pair being stored (mult_row)
  __attribute__((always_inline)) __m512i round(__m512i v, int half, int64_t row) const {
    __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(v), mult_row ? _mm512_set1_ps(mult_row[row]) : mult[half]);
    f = _mm512_min_ps(f, hi);
    if (post) {
      const __m512 y =
          _mm512_add_ps(_mm512_roundscale_ps(_mm512_max_ps(f, lo), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), zyf);
      f = _mm512_min_ps(_mm512_fmadd_ps(pu[half], r2, _mm512_fmadd_ps(y, r1, pk[half])), phi);
    }
    return _mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  __attribute__((always_inline)) __m512i add_zy(__m512i p) const { return post ? p : _mm512_adds_epi16(p, zy16); }
  // rows a (columns 0-15, 16-31) and b; mask: valid columns (bit j = column j)
  __attribute__((always_inline)) void store_pair(__m512i a0, __m512i a1, __m512i b0, __m512i b1, uint8_t* ya,
                                                 uint8_t* yb, __mmask32 mask, bool has_b) const {
    const __m512i pa = add_zy(_mm512_packs_epi32(round(a0, 0, m), round(a1, 1, m)));
    const __m512i pb = has_b ? add_zy(_mm512_packs_epi32(round(b0, 0, m + 1), round(b1, 1, m + 1))) : pa;
    __m512i q = y_signed ? _mm512_packs_epi16(pa, pb) : _mm512_packus_epi16(pa, pb);
    if (clamp_lo) q = y_signed ? _mm512_max_epi8(q, lo8) : _mm512_max_epu8(q, lo8);
    q = _mm512_permutexvar_epi32(perm, q);
    _mm256_mask_storeu_epi8(ya, mask, _mm512_castsi512_si256(q));
    if (has_b) _mm256_mask_storeu_epi8(yb, mask, _mm512_extracti64x4_epi64(q, 1));
  }
  // Four rows of a narrow panel (at most 16 columns: one vector a row), rows m .. m + 3
  // at y, y + stride, ..: the same packs take four rows' 16 columns where store_pair takes
  // two rows' 32, and leave row i's 16 bytes in dwords i, 4 + i, 8 + i, 12 + i of each
  // lane, so the same permutation puts row i in 128-bit lane i.
  __attribute__((always_inline)) void store_quad(const __m512i (&v)[4], uint8_t* y, int64_t stride, __mmask16 mask,
                                                 int64_t row) const {
    const __m512i pa = add_zy(_mm512_packs_epi32(round(v[0], 0, row), round(v[1], 0, row + 1)));
    const __m512i pb = add_zy(_mm512_packs_epi32(round(v[2], 0, row + 2), round(v[3], 0, row + 3)));
    __m512i q = y_signed ? _mm512_packs_epi16(pa, pb) : _mm512_packus_epi16(pa, pb);
    if (clamp_lo) q = y_signed ? _mm512_max_epi8(q, lo8) : _mm512_max_epu8(q, lo8);
    q = _mm512_permutexvar_epi32(perm, q);
    _mm_mask_storeu_epi8(y, mask, _mm512_castsi512_si128(q));
    _mm_mask_storeu_epi8(y + stride, mask, _mm512_extracti32x4_epi32(q, 1));
    _mm_mask_storeu_epi8(y + 2 * stride, mask, _mm512_extracti32x4_epi32(q, 2));
    _mm_mask_storeu_epi8(y + 3 * stride, mask, _mm512_extracti32x4_epi32(q, 3));
  }
  static constexpr int kBytes = 1;
};

// The fixed-point stage runs the shared scalar code (kernel.h) per lane.
template <>
struct Stage<EpiKind::kQ8Fixed> {
  const Epilogue& e;
  int64_t m = 0, n0;
  __attribute__((always_inline)) Stage(const Epilogue& epi, int64_t n) : e(epi), n0(n) {}
  __attribute__((always_inline)) void store(__m512i v, int half, void* /*y*/, __mmask16 mask) const {
    alignas(64) int32_t tmp[16];
    _mm512_store_si512(tmp, v);
    for (int i = 0; i < 16; ++i) {
      if ((mask >> i) & 1) finish_element(tmp[i], e, m, n0 + 16 * half + i);
    }
  }
  static constexpr int kBytes = 1;
};

// Where an output stage reads a tile's sums, row r's columns 0-15 (lo) and 16-31 (hi):
// the intrinsics tiles' registers, or the stack buffer the asm tiles store them to (row
// stride NR), read row by row as the stage goes: with the 24 sums loaded into an array
// first, GCC kept the array on the stack and copied it there once more.
template <int MR>
struct RegRows {
  __m512i (&c0)[MR];
  __m512i (&c1)[MR];
  __attribute__((always_inline)) __m512i lo(int r) const { return c0[r]; }
  __attribute__((always_inline)) __m512i hi(int r) const { return c1[r]; }
};
struct BufRows {
  const int32_t* buf;
  __attribute__((always_inline)) __m512i lo(int r) const { return _mm512_load_si512(buf + r * kNR); }
  __attribute__((always_inline)) __m512i hi(int r) const { return _mm512_load_si512(buf + r * kNR + 16); }
};

// The output stage of a narrow tile (a panel with at most 16 valid columns: the sums of
// columns 0-15 alone, rows.lo), MR a multiple of 4.
template <EpiKind KIND, int MR, class Rows>
__attribute__((always_inline)) inline void finish_tile_narrow(const Rows& rows, const Epilogue& e, int64_t m0,
                                                              int64_t n0, int cols) {
  static_assert(MR % 4 == 0, "the uint8 / int8 stage stores four rows at a time");
  const __mmask16 mask = lane_mask(cols);
  __m512i zw[2], cs[2];
  fold_columns<simd::I32x16>(e, n0, zw, cs);
  Stage<KIND> stage(e, n0);
  constexpr int kBytes = Stage<KIND>::kBytes;
  uint8_t* y = static_cast<uint8_t*>(e.y) + (m0 * e.y_row_stride + n0) * kBytes;
  const int64_t y_stride = e.y_row_stride * kBytes;
  auto fold = [&](__m512i& v, int r) __attribute__((always_inline)) {
    __m512i unused = v;  // the columns 16-31 a narrow tile has not: folded, never read
    fold_row<simd::I32x16>(v, unused, e, m0 + r, zw, cs);
  };
  if constexpr (KIND == EpiKind::kQ8Float) {
#pragma GCC unroll 3
    for (int r = 0; r < MR; r += 4) {
      __m512i v[4] = {rows.lo(r), rows.lo(r + 1), rows.lo(r + 2), rows.lo(r + 3)};
      for (int i = 0; i < 4; ++i) fold(v[i], r + i);
      stage.store_quad(v, y + r * y_stride, y_stride, mask, m0 + r);
    }
  } else {
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      __m512i v = rows.lo(r);
      fold(v, r);
      if constexpr (KIND == EpiKind::kQ8Fixed || KIND == EpiKind::kF32) stage.m = m0 + r;
      stage.store(v, 0, y + r * y_stride, mask);
    }
  }
}

// Folds the per-row terms into the MR x 32 sums (which already hold colterm) and runs the
// output stage (qgemm.h).
template <EpiKind KIND, int MR, class Rows>
__attribute__((always_inline)) inline void finish_tile(const Rows& rows, const Epilogue& e, int64_t m0, int64_t n0,
                                                       int cols) {
  const __mmask16 mask0 = lane_mask(cols);
  const __mmask16 mask1 = cols > 16 ? lane_mask(cols - 16) : static_cast<__mmask16>(0);
  const bool two = cols > 16;
  __m512i zw[2], cs[2];
  fold_columns<simd::I32x16>(e, n0, zw, cs);
  Stage<KIND> stage(e, n0);
  constexpr int kBytes = Stage<KIND>::kBytes;
  uint8_t* y = static_cast<uint8_t*>(e.y) + (m0 * e.y_row_stride + n0) * kBytes;
  const int64_t y_stride = e.y_row_stride * kBytes;
  // colterm is already in (the first chunk started from it)
  auto fold = [&](__m512i& v0, __m512i& v1, int r)
                  __attribute__((always_inline)) { fold_row<simd::I32x16>(v0, v1, e, m0 + r, zw, cs); };
  if constexpr (KIND == EpiKind::kQ8Float) {
    const __mmask32 mask = cols >= 32 ? ~__mmask32{0} : static_cast<__mmask32>((1u << cols) - 1u);
#pragma GCC unroll 6
    for (int r = 0; r < MR; r += 2) {
      const bool has_b = r + 1 < MR;
      const int rb = has_b ? r + 1 : r;
      __m512i a0 = rows.lo(r), a1 = rows.hi(r), b0 = rows.lo(rb), b1 = rows.hi(rb);
      fold(a0, a1, r);
      if (has_b) fold(b0, b1, rb);
      stage.m = m0 + r;
      stage.store_pair(a0, a1, b0, b1, y + r * y_stride, y + rb * y_stride, mask, has_b);
    }
  } else {
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      __m512i v0 = rows.lo(r);
      __m512i v1 = rows.hi(r);
      fold(v0, v1, r);
      if constexpr (KIND == EpiKind::kQ8Fixed || KIND == EpiKind::kF32) stage.m = m0 + r;
      stage.store(v0, 0, y + r * y_stride, mask0);
      if (two) stage.store(v1, 1, y + r * y_stride + 16 * kBytes, mask1);
    }
  }
}

// The output stage of a tile's last chunk on its sums in `rows` (RegRows / BufRows), the
// 32-column stage or, kNarrow, the narrow one; the kind is dispatched once per tile.
template <int MR, bool kNarrow, class Rows>
__attribute__((always_inline)) inline void finish_rows(const TileArgs& t, int64_t r0, const Rows& rows) {
  const Epilogue e = *t.epi;  // local: see Stage
  const int64_t m0 = t.m0 + r0;
  switch (e.kind) {
#define QG_FINISH(KIND)                                        \
  case KIND:                                                   \
    if constexpr (kNarrow) {                                   \
      finish_tile_narrow<KIND, MR>(rows, e, m0, t.n0, t.cols); \
    } else {                                                   \
      finish_tile<KIND, MR>(rows, e, m0, t.n0, t.cols);        \
    }                                                          \
    break;
    QG_FINISH(EpiKind::kS32)
    QG_FINISH(EpiKind::kF32)
    QG_FINISH(EpiKind::kQ8Float)
    QG_FINISH(EpiKind::kQ8Fixed)
#undef QG_FINISH
  }
}

// The sums of a tile call start from `partial` (accumulate) or, on the first chunk, from
// the column term bias[n] − zx'·cs[n] instead of 0 (int32 addition wraps, so the order
// does not change the bits): the epilogue then has one vector add less per output vector.
template <int MR>
__attribute__((always_inline)) inline void start_sums(const TileArgs& t, const int32_t* partial, __m512i (&c0)[MR],
                                                      __m512i (&c1)[MR]) {
  if (t.accumulate) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      c0[r] = _mm512_loadu_si512(partial + r * kNR);
      c1[r] = _mm512_loadu_si512(partial + r * kNR + 16);
    }
  } else {
    const __m512i ct0 = _mm512_loadu_si512(t.epi->colterm + t.n0);
    const __m512i ct1 = _mm512_loadu_si512(t.epi->colterm + t.n0 + 16);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      c0[r] = ct0;
      c1[r] = ct1;
    }
  }
}

// Not the last chunk: the sums go to `partial`; else the fused output stage.
template <int MR>
__attribute__((always_inline)) inline void end_sums(const TileArgs& t, int64_t r0, int32_t* partial, __m512i (&c0)[MR],
                                                    __m512i (&c1)[MR]) {
  if (!t.finish) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      _mm512_storeu_si512(partial + r * kNR, c0[r]);
      _mm512_storeu_si512(partial + r * kNR + 16, c1[r]);
    }
    return;
  }

  finish_rows<MR, false>(t, r0, RegRows<MR>{c0, c1});
}

// Up to 8 rows (the M edge of the 12-row tiles), with intrinsics. KU accumulator sets (1, or 2
// for short tiles): set s takes k-groups g with g % KU == s. kPf: the first tile of a
// streaming call (TileArgs::stream_prefetch) prefetches the two B lines of each k-group
// that many bytes ahead.
template <int MR, int KU, bool kPf = false>
__attribute__((always_inline)) inline void tile(const TileArgs& t, int64_t r0) {
  const uint8_t* a = static_cast<const uint8_t*>(t.a) + r0 * t.a_row_stride;
  const int64_t s = t.a_row_stride;
  const int8_t* b = static_cast<const int8_t*>(t.b);
  int32_t* partial = t.partial + r0 * kNR;

  __m512i c0[KU][MR], c1[KU][MR];
#pragma GCC unroll 8
  for (int u = 1; u < KU; ++u) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      c0[u][r] = _mm512_setzero_si512();
      c1[u][r] = _mm512_setzero_si512();
    }
  }
  start_sums<MR>(t, partial, c0[0], c1[0]);

  int64_t k = 0;
  const int64_t kc = t.kc;
  const int64_t pf = kPf ? t.stream_prefetch : 0;
#pragma GCC unroll 2
  for (; k + KU * kKR <= kc; k += KU * kKR) {
#pragma GCC unroll 2
    for (int u = 0; u < KU; ++u) {
      if (kPf) {
        _mm_prefetch(reinterpret_cast<const char*>(b + pf), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(b + pf + 64), _MM_HINT_T0);
      }
      const __m512i b0 = _mm512_load_si512(b);
      const __m512i b1 = _mm512_load_si512(b + 64);
      b += kNR * kKR;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512i xa = _mm512_set1_epi32(load_unaligned<int32_t>(a + r * s + k + u * kKR));
        QUANTA_VPDPBUSD(c0[u][r], xa, b0);
        QUANTA_VPDPBUSD(c1[u][r], xa, b1);
      }
    }
  }
  for (; k < kc; k += kKR) {  // leftover groups when KU > 1
    if (kPf) {
      _mm_prefetch(reinterpret_cast<const char*>(b + pf), _MM_HINT_T0);
      _mm_prefetch(reinterpret_cast<const char*>(b + pf + 64), _MM_HINT_T0);
    }
    const __m512i b0 = _mm512_load_si512(b);
    const __m512i b1 = _mm512_load_si512(b + 64);
    b += kNR * kKR;
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      const __m512i xa = _mm512_set1_epi32(load_unaligned<int32_t>(a + r * s + k));
      QUANTA_VPDPBUSD(c0[0][r], xa, b0);
      QUANTA_VPDPBUSD(c1[0][r], xa, b1);
    }
  }
#pragma GCC unroll 8
  for (int u = 1; u < KU; ++u) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) {
      c0[0][r] = _mm512_add_epi32(c0[0][r], c0[u][r]);
      c1[0][r] = _mm512_add_epi32(c1[0][r], c1[u][r]);
    }
  }

  end_sums<MR>(t, r0, partial, c0[0], c1[0]);
}

// The 12-row tile: its k-loop is one asm block, the 24 accumulators in zmm0-23 (row r:
// columns 0-15 in zmm r, 16-31 in zmm 12+r), B in zmm24-25, the broadcasts rotating
// through zmm26-31. Rows 0-3, 4-7 and 8-11 are addressed from a0, a4 = a0 + 4s, a8 = a0 + 8s
// with the index s, 2s (scale) or 3s. Four k-groups per iteration (one add per pointer and
// a dec/jnz), then the leftover groups one by one. The sums start from `init` (partial, row
// stride NR, when accumulating; else the two colterm vectors, in every row) and end in
// `out` (partial, or a local buffer that the C++ epilogue reads back: 24 stores and loads
// per 12 x 32 x kc tile, against 3·kc cycles of vpdpbusd).
// prefetcht0 of B TileArgs::prefetch bytes ahead (default 2 KiB, 16 k-groups; 0: the loop
// without prefetches; a run-time tunable, qgemm.h Blocking): the driver runs the row tiles
// outer and the panels inner (qgemm.cc), so B streams from L2 and its next panel follows
// this one (measured: +0.5 %, about the noise; a prefetch past the weights never faults).
// clang-format off: the asm text is laid out one instruction a line
#define QG_BCAST(bc, addr, r, r2)                                \
  "vpbroadcastd " addr ", %%zmm" #bc "\n\t"                      \
  "vpdpbusd %%zmm24, %%zmm" #bc ", %%zmm" #r "\n\t"              \
  "vpdpbusd %%zmm25, %%zmm" #bc ", %%zmm" #r2 "\n\t"
// one k-group: x' bytes at displacement d of each row pointer, B at displacement bd
#define QG_GROUP(d, bd)                                          \
  "vmovdqa64 " #bd "(%[b]), %%zmm24\n\t"                         \
  "vmovdqa64 " #bd "+64(%[b]), %%zmm25\n\t"                      \
  QG_BCAST(26, #d "(%[a0])", 0, 12)                              \
  QG_BCAST(27, #d "(%[a0],%[s])", 1, 13)                         \
  QG_BCAST(28, #d "(%[a0],%[s],2)", 2, 14)                       \
  QG_BCAST(29, #d "(%[a0],%[s3])", 3, 15)                        \
  QG_BCAST(30, #d "(%[a4])", 4, 16)                              \
  QG_BCAST(31, #d "(%[a4],%[s])", 5, 17)                         \
  QG_BCAST(26, #d "(%[a4],%[s],2)", 6, 18)                       \
  QG_BCAST(27, #d "(%[a4],%[s3])", 7, 19)                        \
  QG_BCAST(28, #d "(%[a8])", 8, 20)                              \
  QG_BCAST(29, #d "(%[a8],%[s])", 9, 21)                         \
  QG_BCAST(30, #d "(%[a8],%[s],2)", 10, 22)                      \
  QG_BCAST(31, #d "(%[a8],%[s3])", 11, 23)
#define QG_PREFETCH_B(bd)                                        \
  "prefetcht0 " #bd "(%[b],%[pf])\n\t"                        \
  "prefetcht0 " #bd "+64(%[b],%[pf])\n\t"
#define QG_NO_PREFETCH(bd)
#define QG_LOAD_ROW(r, r2)                                       \
  "vmovdqu64 " #r "*128(%[init]), %%zmm" #r "\n\t"               \
  "vmovdqu64 " #r "*128+64(%[init]), %%zmm" #r2 "\n\t"
#define QG_COPY_ROW(r, r2)                                       \
  "vmovdqa64 %%zmm0, %%zmm" #r "\n\t"                            \
  "vmovdqa64 %%zmm12, %%zmm" #r2 "\n\t"
// row r's 32 sums (zmm r, zmm r2) at `at`; the rows of a group of four at a0, a0 + os,
// a0 + 2os and a0 + 3os (a4 = 3os)
#define QG_STORE_ROW(r, r2, at)                                  \
  "vmovdqu64 %%zmm" #r ", " at "\n\t"                           \
  "vmovdqu64 %%zmm" #r2 ", 64" at "\n\t"
#define QG_STORE_FOUR(r0, r1, r2, r3, h0, h1, h2, h3)             \
  QG_STORE_ROW(r0, h0, "(%[a0])")                                \
  QG_STORE_ROW(r1, h1, "(%[a0],%[os])")                          \
  QG_STORE_ROW(r2, h2, "(%[a0],%[os],2)")                        \
  QG_STORE_ROW(r3, h3, "(%[a0],%[a4])")

// The operands of the 12-row asm tiles (tile12, tile12_narrow): rows 0-3, 4-7 and 8-11
// from a0, a4, a8 with the index s, 2s or 3s; n4 iterations of four k-groups, then n1
// single groups; the sums start from `init` and end in `out`, rows `os` bytes apart
// (tile12; the narrow tile stores rows NR int32 apart).
struct Tile12Operands {
  const uint8_t *a0, *a4, *a8;
  int64_t s, s3;
  const int8_t* b;
  int64_t n4, n1, accumulate;
  const int32_t* init;
  int32_t* out;
  int64_t os = kNR * 4;
  Tile12Operands(const TileArgs& t, int64_t r0, int32_t* buf)
      : a0(static_cast<const uint8_t*>(t.a) + r0 * t.a_row_stride),
        a4(a0 + 4 * t.a_row_stride),
        a8(a0 + 8 * t.a_row_stride),
        s(t.a_row_stride),
        s3(3 * t.a_row_stride),
        b(static_cast<const int8_t*>(t.b)),
        n4(t.kc / kKR / 4),
        n1(t.kc / kKR % 4),
        accumulate(t.accumulate),
        init(t.accumulate ? t.partial + r0 * kNR : t.epi->colterm + t.n0),
        out(t.finish ? buf : t.partial + r0 * kNR) {}
};
#define QG_TILE12_OPERANDS \
  : [a0] "+r"(g.a0), [a4] "+r"(g.a4), [a8] "+r"(g.a8), [b] "+r"(g.b), [n4] "+r"(g.n4), [n1] "+r"(g.n1) \
  : [s] "r"(g.s), [s3] "r"(g.s3), [init] "r"(g.init), [out] "r"(g.out), [acc] "r"(g.accumulate), [pf] "r"(pf), \
    [os] "r"(g.os)

#define QG_TILE12_ASM(PF) \
  __asm__ volatile( \
      "test %[acc], %[acc]\n\t" \
      "jz 5f\n\t" \
      QG_LOAD_ROW(0, 12) QG_LOAD_ROW(1, 13) QG_LOAD_ROW(2, 14) QG_LOAD_ROW(3, 15) \
      QG_LOAD_ROW(4, 16) QG_LOAD_ROW(5, 17) QG_LOAD_ROW(6, 18) QG_LOAD_ROW(7, 19) \
      QG_LOAD_ROW(8, 20) QG_LOAD_ROW(9, 21) QG_LOAD_ROW(10, 22) QG_LOAD_ROW(11, 23) \
      "jmp 6f\n\t" \
      "5:\n\t" \
      "vmovdqu64 (%[init]), %%zmm0\n\t" \
      "vmovdqu64 64(%[init]), %%zmm12\n\t" \
      QG_COPY_ROW(1, 13) QG_COPY_ROW(2, 14) QG_COPY_ROW(3, 15) QG_COPY_ROW(4, 16) \
      QG_COPY_ROW(5, 17) QG_COPY_ROW(6, 18) QG_COPY_ROW(7, 19) QG_COPY_ROW(8, 20) \
      QG_COPY_ROW(9, 21) QG_COPY_ROW(10, 22) QG_COPY_ROW(11, 23) \
      "6:\n\t" \
      "test %[n4], %[n4]\n\t" \
      "jz 2f\n\t" \
      ".p2align 5\n\t" \
      "1:\n\t" \
      PF(0) QG_GROUP(0, 0) \
      PF(128) QG_GROUP(4, 128) \
      PF(256) QG_GROUP(8, 256) \
      PF(384) QG_GROUP(12, 384) \
      "add $16, %[a0]\n\t" \
      "add $16, %[a4]\n\t" \
      "add $16, %[a8]\n\t" \
      "add $512, %[b]\n\t" \
      "dec %[n4]\n\t" \
      "jnz 1b\n\t" \
      "2:\n\t" \
      "test %[n1], %[n1]\n\t" \
      "jz 4f\n\t" \
      "3:\n\t" \
      QG_GROUP(0, 0) \
      "add $4, %[a0]\n\t" \
      "add $4, %[a4]\n\t" \
      "add $4, %[a8]\n\t" \
      "add $128, %[b]\n\t" \
      "dec %[n1]\n\t" \
      "jnz 3b\n\t" \
      "4:\n\t" \
      "mov %[out], %[a0]\n\t" \
      "lea (%[os],%[os],2), %[a4]\n\t" \
      QG_STORE_FOUR(0, 1, 2, 3, 12, 13, 14, 15) \
      "lea (%[a0],%[os],4), %[a0]\n\t" \
      QG_STORE_FOUR(4, 5, 6, 7, 16, 17, 18, 19) \
      "lea (%[a0],%[os],4), %[a0]\n\t" \
      QG_STORE_FOUR(8, 9, 10, 11, 20, 21, 22, 23) \
      QG_TILE12_OPERANDS \
      : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22", \
        "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");

// clang-format on
// The sums are the output when it is int32 with nothing to fold or clamp and the panel
// has 32 columns (a MatMulInteger / ConvInteger without weight zero points): finish_tile
// would store them unchanged, so the asm stores them into y itself instead of into the
// stack buffer for the C++ stage to reload (1024^3 with int32 output, one thread: the
// stage was ~4 % of the time, perf samples on an Intel Xeon).
inline bool sums_are_output(const TileArgs& t) {
  const Epilogue& e = *t.epi;
  return t.finish && t.cols == kNR && e.kind == EpiKind::kS32 && e.zw == nullptr && e.zx_row == nullptr &&
         e.rowterm == nullptr && e.lo == INT32_MIN && e.hi == INT32_MAX;
}

__attribute__((always_inline)) inline void tile12(const TileArgs& t, int64_t r0) {
  constexpr int MR = 12;
  alignas(64) int32_t buf[MR * kNR];
  Tile12Operands g(t, r0, buf);
  const bool direct = sums_are_output(t);
  if (direct) {
    g.out = static_cast<int32_t*>(t.epi->y) + (t.m0 + r0) * t.epi->y_row_stride + t.n0;
    g.os = t.epi->y_row_stride * 4;
  }
  if (t.prefetch > 0) {
    const int64_t pf = t.prefetch;
    QG_TILE12_ASM(QG_PREFETCH_B)
  } else {
    const int64_t pf = 0;
    QG_TILE12_ASM(QG_NO_PREFETCH)
  }
  if (!t.finish || direct) return;  // the sums are in partial, or in y
  finish_rows<MR, false>(t, r0, BufRows{buf});
}

// The 12-row tile of a narrow panel (at most 16 valid columns: N <= 16, or the last panel
// of N = 32p + 1 .. 32p + 16): the columns 16-31 of the panel are zero padding, so only
// the first B vector of each k-group is read and 12 vpdpbusd a group do the work that 24
// do in tile12, and the output stage runs on one vector a row (finish_tile_narrow). The
// accumulators are zmm0-11, B zmm24, the broadcasts rotate through zmm26-31; `partial`
// keeps its layout (row stride NR, the first 16 columns used).
// clang-format off: the asm text is laid out one instruction a line
#define QGN_BCAST(bc, addr, r)                                   \
  "vpbroadcastd " addr ", %%zmm" #bc "\n\t"                      \
  "vpdpbusd %%zmm24, %%zmm" #bc ", %%zmm" #r "\n\t"
#define QGN_GROUP(d, bd)                                         \
  "vmovdqa64 " #bd "(%[b]), %%zmm24\n\t"                         \
  QGN_BCAST(26, #d "(%[a0])", 0)                                 \
  QGN_BCAST(27, #d "(%[a0],%[s])", 1)                            \
  QGN_BCAST(28, #d "(%[a0],%[s],2)", 2)                          \
  QGN_BCAST(29, #d "(%[a0],%[s3])", 3)                           \
  QGN_BCAST(30, #d "(%[a4])", 4)                                 \
  QGN_BCAST(31, #d "(%[a4],%[s])", 5)                            \
  QGN_BCAST(26, #d "(%[a4],%[s],2)", 6)                          \
  QGN_BCAST(27, #d "(%[a4],%[s3])", 7)                           \
  QGN_BCAST(28, #d "(%[a8])", 8)                                 \
  QGN_BCAST(29, #d "(%[a8],%[s])", 9)                            \
  QGN_BCAST(30, #d "(%[a8],%[s],2)", 10)                         \
  QGN_BCAST(31, #d "(%[a8],%[s3])", 11)
#define QGN_PREFETCH_B(bd)                                       \
  "prefetcht0 " #bd "(%[b],%[pf])\n\t"
#define QGN_LOAD_ROW(r)                                          \
  "vmovdqu64 " #r "*128(%[init]), %%zmm" #r "\n\t"
#define QGN_COPY_ROW(r)                                          \
  "vmovdqa64 %%zmm0, %%zmm" #r "\n\t"
#define QGN_STORE_ROW(r)                                         \
  "vmovdqu64 %%zmm" #r ", " #r "*128(%[out])\n\t"

#define QGN_TILE12_ASM(PF) \
  __asm__ volatile( \
      "test %[acc], %[acc]\n\t" \
      "jz 5f\n\t" \
      QGN_LOAD_ROW(0) QGN_LOAD_ROW(1) QGN_LOAD_ROW(2) QGN_LOAD_ROW(3) QGN_LOAD_ROW(4) QGN_LOAD_ROW(5) \
      QGN_LOAD_ROW(6) QGN_LOAD_ROW(7) QGN_LOAD_ROW(8) QGN_LOAD_ROW(9) QGN_LOAD_ROW(10) QGN_LOAD_ROW(11) \
      "jmp 6f\n\t" \
      "5:\n\t" \
      "vmovdqu64 (%[init]), %%zmm0\n\t" \
      QGN_COPY_ROW(1) QGN_COPY_ROW(2) QGN_COPY_ROW(3) QGN_COPY_ROW(4) QGN_COPY_ROW(5) QGN_COPY_ROW(6) \
      QGN_COPY_ROW(7) QGN_COPY_ROW(8) QGN_COPY_ROW(9) QGN_COPY_ROW(10) QGN_COPY_ROW(11) \
      "6:\n\t" \
      "test %[n4], %[n4]\n\t" \
      "jz 2f\n\t" \
      ".p2align 5\n\t" \
      "1:\n\t" \
      PF(0) QGN_GROUP(0, 0) \
      PF(128) QGN_GROUP(4, 128) \
      PF(256) QGN_GROUP(8, 256) \
      PF(384) QGN_GROUP(12, 384) \
      "add $16, %[a0]\n\t" \
      "add $16, %[a4]\n\t" \
      "add $16, %[a8]\n\t" \
      "add $512, %[b]\n\t" \
      "dec %[n4]\n\t" \
      "jnz 1b\n\t" \
      "2:\n\t" \
      "test %[n1], %[n1]\n\t" \
      "jz 4f\n\t" \
      "3:\n\t" \
      QGN_GROUP(0, 0) \
      "add $4, %[a0]\n\t" \
      "add $4, %[a4]\n\t" \
      "add $4, %[a8]\n\t" \
      "add $128, %[b]\n\t" \
      "dec %[n1]\n\t" \
      "jnz 3b\n\t" \
      "4:\n\t" \
      QGN_STORE_ROW(0) QGN_STORE_ROW(1) QGN_STORE_ROW(2) QGN_STORE_ROW(3) QGN_STORE_ROW(4) QGN_STORE_ROW(5) \
      QGN_STORE_ROW(6) QGN_STORE_ROW(7) QGN_STORE_ROW(8) QGN_STORE_ROW(9) QGN_STORE_ROW(10) QGN_STORE_ROW(11) \
      QG_TILE12_OPERANDS \
      : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", \
        "xmm11", "xmm24", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");

// clang-format on
__attribute__((always_inline)) inline void tile12_narrow(const TileArgs& t, int64_t r0) {
  constexpr int MR = 12;
  alignas(64) int32_t buf[MR * kNR];
  Tile12Operands g(t, r0, buf);
  if (t.prefetch > 0) {
    const int64_t pf = t.prefetch;
    QGN_TILE12_ASM(QGN_PREFETCH_B)
  } else {
    const int64_t pf = 0;
    QGN_TILE12_ASM(QG_NO_PREFETCH)
  }
  if (!t.finish) return;  // the sums are in partial
  finish_rows<MR, true>(t, r0, BufRows{buf});
}
#undef QGN_BCAST
#undef QGN_GROUP
#undef QGN_PREFETCH_B
#undef QGN_TILE12_ASM
#undef QGN_LOAD_ROW
#undef QGN_COPY_ROW
#undef QGN_STORE_ROW
#undef QG_BCAST
#undef QG_GROUP
#undef QG_PREFETCH_B
#undef QG_NO_PREFETCH
#undef QG_TILE12_ASM
#undef QG_TILE12_OPERANDS
#undef QG_LOAD_ROW
#undef QG_COPY_ROW
#undef QG_STORE_ROW
#undef QG_STORE_FOUR

// Indirect rows (kernel.h TileArgs::a_rows): the n_taps chunks of one call with the sums
// in registers, row r's bytes of tap i at a_rows[r] + tap_offset[i] (a convolution's
// taps, XNNPACK / MLAS "indirect" GEMM); B is read sequentially across the taps. With
// one call per tap chunk the 16 accumulators would go through `partial` between taps
// (32 vector memory operations each time), and the rows would need a constant stride.
template <int MR>
__attribute__((always_inline)) inline void tile_indirect(const TileArgs& t, int64_t r0) {
  const uint8_t* const* rows = t.a_rows + r0;
  const int8_t* b = static_cast<const int8_t*>(t.b);
  int32_t* partial = t.partial + r0 * kNR;
  const int64_t kc = t.kc;

  __m512i c0[MR], c1[MR];
  start_sums<MR>(t, partial, c0, c1);
  for (int64_t i = 0; i < t.n_taps; ++i) {
    const int64_t off = t.tap_offset[i];
    const uint8_t* p[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) p[r] = rows[r] + off;
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k += kKR) {
      const __m512i b0 = _mm512_load_si512(b);
      const __m512i b1 = _mm512_load_si512(b + 64);
      b += kNR * kKR;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512i xa = _mm512_set1_epi32(load_unaligned<int32_t>(p[r] + k));
        QUANTA_VPDPBUSD(c0[r], xa, b0);
        QUANTA_VPDPBUSD(c1[r], xa, b1);
      }
    }
  }
  end_sums<MR>(t, r0, partial, c0, c1);
}

// tile_indirect on a narrow panel (at most 16 valid columns, as tile12_narrow): one B
// vector a k-group and the output stage on one vector a row; `partial` keeps its layout.
template <int MR>
__attribute__((always_inline)) inline void tile_indirect_narrow(const TileArgs& t, int64_t r0) {
  const uint8_t* const* rows = t.a_rows + r0;
  const int8_t* b = static_cast<const int8_t*>(t.b);
  int32_t* partial = t.partial + r0 * kNR;
  const int64_t kc = t.kc;

  __m512i c0[MR];
  if (t.accumulate) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) c0[r] = _mm512_loadu_si512(partial + r * kNR);
  } else {
    const __m512i ct = _mm512_loadu_si512(t.epi->colterm + t.n0);
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) c0[r] = ct;
  }
  for (int64_t i = 0; i < t.n_taps; ++i) {
    const int64_t off = t.tap_offset[i];
    const uint8_t* p[MR];
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) p[r] = rows[r] + off;
#pragma GCC unroll 2
    for (int64_t k = 0; k < kc; k += kKR) {
      const __m512i b0 = _mm512_load_si512(b);
      b += kNR * kKR;
#pragma GCC unroll 8
      for (int r = 0; r < MR; ++r) {
        const __m512i xa = _mm512_set1_epi32(load_unaligned<int32_t>(p[r] + k));
        QUANTA_VPDPBUSD(c0[r], xa, b0);
      }
    }
  }
  if (!t.finish) {
#pragma GCC unroll 8
    for (int r = 0; r < MR; ++r) _mm512_storeu_si512(partial + r * kNR, c0[r]);
    return;
  }
  finish_rows<MR, true>(t, r0, RegRows<MR>{c0, c0});  // a narrow stage reads lo alone
}

}  // namespace

namespace {

// Each tile form is its own (not inlined) function: inlined together into the dispatcher
// below, with the 12-row tile's asm clobbering all 32 zmm registers, GCC's LTO build spilled
// the 8-row tile's accumulators to the stack inside its k-loop (8 x 768 x 768 ran at 44 %
// of the peak in the extension and 92 % in a static build). A call per tile costs nothing
// against its k-loop.
template <int MR, int KU>
__attribute__((noinline)) void run_tile(const TileArgs& t, int64_t r0) {
  tile<MR, KU>(t, r0);
}
template <int MR, int KU>
__attribute__((noinline)) void run_tile_pf(const TileArgs& t, int64_t r0) {
  tile<MR, KU, true>(t, r0);
}
template <int MR>
__attribute__((noinline)) void run_tile_indirect(const TileArgs& t, int64_t r0) {
  tile_indirect<MR>(t, r0);
}
template <int MR>
__attribute__((noinline)) void run_tile_indirect_narrow(const TileArgs& t, int64_t r0) {
  tile_indirect_narrow<MR>(t, r0);
}
__attribute__((noinline)) void run_tile12(const TileArgs& t, int64_t r0) { tile12(t, r0); }
__attribute__((noinline)) void run_tile12_narrow(const TileArgs& t, int64_t r0) { tile12_narrow(t, r0); }

}  // namespace

void qgemm_tiles_avx512vnni(const TileArgs& t) {
  int64_t r0 = 0;
  if (t.a_rows) {  // 8-row tiles: 12 row pointers and the loop would not fit the GPRs
    if (t.cols <= 16) {
      for (; r0 + 8 <= t.rows; r0 += 8) run_tile_indirect_narrow<8>(t, r0);
    } else {
      for (; r0 + 8 <= t.rows; r0 += 8) run_tile_indirect<8>(t, r0);
    }
    switch (t.rows - r0) {
      case 1: run_tile_indirect<1>(t, r0); break;
      case 2: run_tile_indirect<2>(t, r0); break;
      case 3: run_tile_indirect<3>(t, r0); break;
      case 4: run_tile_indirect<4>(t, r0); break;
      case 5: run_tile_indirect<5>(t, r0); break;
      case 6: run_tile_indirect<6>(t, r0); break;
      case 7: run_tile_indirect<7>(t, r0); break;
      default: break;
    }
    return;
  }
  // 12-row tiles; 16 rows left (12 + 4) run as two 8-row tiles: a 4-row tile loads B for
  // 8 vpdpbusd where the 8-row one does for 16 (1024 rows: 84 x 12 + 2 x 8)
  const int64_t n12 = t.rows % 12 == 4 && t.rows >= 16 ? t.rows / 12 - 1 : t.rows / 12;
  const auto tile12_fn = t.cols <= 16 ? run_tile12_narrow : run_tile12;
  if (t.stream_prefetch > 0) {  // the first tile streams B: it prefetches further ahead
    if (n12 > 0) {
      TileArgs first = t;
      first.prefetch = t.stream_prefetch;
      tile12_fn(first, 0);
      r0 = 12;
    } else {
      switch (t.rows) {
        case 1: run_tile_pf<1, 2>(t, 0); return;
        case 2: run_tile_pf<2, 2>(t, 0); return;
        case 3: run_tile_pf<3, 1>(t, 0); return;
        case 4: run_tile_pf<4, 1>(t, 0); return;
        case 5: run_tile_pf<5, 1>(t, 0); return;
        case 6: run_tile_pf<6, 1>(t, 0); return;
        case 7: run_tile_pf<7, 1>(t, 0); return;
        default:  // 8 to 11 rows, or 16
          run_tile_pf<8, 1>(t, 0);
          r0 = 8;
          break;
      }
    }
  }
  for (int64_t i = r0 / 12; i < n12; ++i, r0 += 12) tile12_fn(t, r0);
  if (t.rows - r0 == 16) {
    run_tile<8, 1>(t, r0);
    r0 += 8;
  }
  if (r0 + 8 <= t.rows) {  // 8 to 11 rows left
    run_tile<8, 1>(t, r0);
    r0 += 8;
  }
  switch (t.rows - r0) {
    case 1: run_tile<1, 2>(t, r0); break;
    case 2: run_tile<2, 2>(t, r0); break;
    case 3: run_tile<3, 1>(t, r0); break;
    case 4: run_tile<4, 1>(t, r0); break;
    case 5: run_tile<5, 1>(t, r0); break;
    case 6: run_tile<6, 1>(t, r0); break;
    case 7: run_tile<7, 1>(t, r0); break;
    default: break;
  }
}

// 20 independent vpdpbusd chains on registers (latency 5 cycles, up to 2 per cycle on the
// CPUs we know of: 10 chains would do; 20 leaves margin), counted in 2·64 ops each. The
// rate of the best batch (~3 ms each) is returned, as the GEMM benchmarks keep their best
// batch, each batch timed in this thread's CPU time: on a shared machine the wall time of
// the whole probe includes the time other processes held the core (with 10 runnable
// processes on 2 cores it read 40 % of the best batch's rate), and so does a batch that
// the scheduler cuts. The register-only loop loses nothing else to other processes, and
// the GEMMs it is compared with are timed the same way (benchmarks/kernels.py --cpu-time).
double vnni_peak_probe_avx512vnni(double seconds) {
  using clock = std::chrono::steady_clock;
  constexpr long kBatch = 1 << 20;
  const auto t0 = clock::now();
  double best = 0.0;
  do {
    const double b0 = thread_cpu_seconds();
    long n = kBatch;
    // clang-format off
    __asm__ volatile(
        "vpxord %%zmm30, %%zmm30, %%zmm30\n\t"
        "vpxord %%zmm31, %%zmm31, %%zmm31\n\t"
        "1:\n\t"
        ".irp r,0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19\n\t"
        "vpdpbusd %%zmm31, %%zmm30, %%zmm\\r\n\t"
        ".endr\n\t"
        "dec %0\n\t"
        "jnz 1b\n\t"
        : "+r"(n)
        :
        : "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11",
          "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm30", "xmm31");
    // clang-format on
    const double dt = std::max(1e-9, thread_cpu_seconds() - b0);
    best = std::max(best, kBatch * 20.0 * 64.0 * 2.0 / dt / 1e9);
  } while (std::chrono::duration<double>(clock::now() - t0).count() < seconds);
  return best;
}

}  // namespace qgemm
}  // namespace quanta
