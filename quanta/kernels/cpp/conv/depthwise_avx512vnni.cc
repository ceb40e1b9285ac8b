// qconv_dw_u8s8_s32_16c4__avx512vnni: the depthwise kernel (contract in kernels.h).
//
// One zmm holds 16 consecutive output pixels of a row as int32 lanes; the 4 bytes that
// vpdpbusd multiplies and adds per lane are 4 horizontal taps of that pixel:
//   acc[o] += Σ_{t<4} u8(xpad'[row, (ox0 + o)·sw + (4q + t)·dw]) · s8(w_eff[ky, 4q + t])
// The 64 taps of a 16-pixel block come from ONE 64-byte load: vpermd gives 128-bit lane L
// the 16 bytes at 4·L·sw (dwords L·sw .. L·sw + 3, needs sw <= 4), and an in-lane vpshufb
// picks byte o·sw + t·dw for pixel 4L + o and tap t (index 0x80, i.e. zero, for taps past
// kw). A 3x3 kernel is 3 loads, 6 shuffles and 3 vpdpbusd per 16 pixels; 5x5 is 10 of
// each group (the second group of a row holds 1 tap). Geometries whose taps do not fit the
// one-load gather (dw_gather_fits) build the same vectors with scalar loads.
//
// Direct mode (kernels.h): the loads read the NCHW plane itself, masked to the columns
// inside x and merged with zx' elsewhere (rows above / below x are zx' without a load),
// flipped for int8 x; so a plane needs no padded copy, which dominated 7x7 planes.
//
// Rows of at most 8 pixels go two to a vector (vpermt2d gathers lanes 0, 1 from one row
// and 2, 3 from the next), so that a 7x7 plane fills 14 of 16 lanes instead of 7. With
// zw_eff != 0 a second vpdpbusd against bytes of 1 accumulates Σ x' for the − zw·Σx' term
// (the zeroed pad taps add nothing). Four blocks run together (across row ends) so that
// the vpdpbusd chains overlap. Epilogue as qgemm's (float32 multiply, clamp,
// round-to-nearest-even conversion, + zy), masked stores for the row's tail.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC 12, inside its AVX-512 headers
#endif

#include <immintrin.h>

#include "conv/kernels.h"

namespace quanta {
namespace conv {
namespace {

struct Gather {
  __m512i perm;       // vpermd: lane L takes dwords L·sw .. L·sw + 3 of one row
  __m512i perm2;      // vpermt2d (paired rows): lanes 0, 1 from the first row, 2, 3 from the second
  __m512i shuf_full;  // a group of 4 taps
  __m512i shuf_last;  // the row's last group (kw − 4·(groups4 − 1) taps)
  __m512i pad;        // direct mode: zx' ^ flip, so that the flip leaves zx'
  __m512i flip;
};

Gather make_gather(const DepthwiseRows& a) {
  Gather g;
  g.perm = _mm512_loadu_si512(a.gather_perm);
  g.perm2 = _mm512_loadu_si512(a.gather_perm2);
  g.shuf_full = _mm512_loadu_si512(a.gather_full);
  g.shuf_last = _mm512_loadu_si512(a.gather_last);
  g.pad = _mm512_set1_epi8(static_cast<char>(a.pad ^ a.flip));
  g.flip = _mm512_set1_epi8(static_cast<char>(a.flip));
  return g;
}

inline __mmask64 first_bytes(int64_t n) { return n >= 64 ? ~0ull : n <= 0 ? 0ull : (1ull << n) - 1; }

// Bytes j of the 64-byte window at column c0 with 0 <= c0 + j < w.
inline __mmask64 column_mask(int64_t c0, int64_t w) { return first_bytes(w - c0) & ~first_bytes(-c0); }

// The 64 raw bytes at `src` (padded mode) or at plane row `row` / column c0 (direct mode;
// row == nullptr: above or below x).
template <bool kDirect>
inline __m512i load_window(const uint8_t* src, const uint8_t* row, int64_t c0, __mmask64 mask, const Gather& g) {
  if (!kDirect) return _mm512_loadu_si512(src);
  if (row == nullptr) return g.pad;
  // masked-off bytes are not accessed (no fault), whatever the address
  return _mm512_mask_loadu_epi8(g.pad, mask, reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(row) + c0));
}

inline void finish(__m512i acc, const DepthwiseRows& a, int64_t at, __mmask16 mask) {
  if (a.out_type == OutType::kS32) {
    _mm512_mask_storeu_epi32(static_cast<int32_t*>(a.y) + at, mask, acc);
    return;
  }
  __m512 f = _mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_set1_ps(a.multiplier));
  f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(a.lo_minus_zy)), _mm512_set1_ps(a.hi_minus_zy));
  const __m512i q = _mm512_add_epi32(_mm512_cvt_roundps_epi32(f, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC),
                                     _mm512_set1_epi32(a.zy));
  // q is in [qmin, qmax]: the truncating narrow is exact
  if (a.out_type == OutType::kS8) {
    _mm512_mask_cvtepi32_storeu_epi8(static_cast<int8_t*>(a.y) + at, mask, q);
  } else {
    _mm512_mask_cvtepi32_storeu_epi8(static_cast<uint8_t*>(a.y) + at, mask, q);
  }
}

inline __mmask16 first_lanes(int n) {
  return n >= 16 ? static_cast<__mmask16>(0xffff) : static_cast<__mmask16>((1u << n) - 1u);
}

// One block: 16 pixels of output row oy from ox0 (valid of them), or (kPaired, OW <= 8)
// pixels 0..7 of rows oy and oy + 1 (valid and valid2 of them; valid2 = 0: no second row).
struct Block {
  int64_t oy = 0, ox0 = 0;
  int valid = 0, valid2 = 0;
};

// Options of one instantiation: compile-time kh / groups4 (0: read from the call),
// Σx' term, one-load gathers, paired rows, direct mode, int8 flip (direct mode).
template <int KH_, int G_, bool kZw_, bool kFast_, bool kPaired_, bool kDirect_, bool kFlip_>
struct Opt {
  static constexpr int KH = KH_, G = G_;
  static constexpr bool kZw = kZw_, kFast = kFast_, kPaired = kPaired_, kDirect = kDirect_, kFlip = kFlip_;
};

// NB blocks together, so that four independent vpdpbusd chains overlap even when rows are
// short.
template <int NB, typename O>
inline void blocks(const DepthwiseRows& a, const Gather& g, const Block* blk) {
  static_assert(!O::kDirect || (O::kFast && O::G == 1), "direct mode: one-load gathers, one tap group");
  const int64_t kh = O::KH ? O::KH : a.kh;
  const int64_t groups = O::G ? O::G : a.groups4;
  const int64_t last_taps = a.kw - 4 * (groups - 1);
  const uint8_t* base[NB];  // padded mode: the block's first row at tap 0
  int64_t iy[NB];           // direct mode: the plane row of tap row 0
  __mmask64 cmask[NB];      // direct mode: columns inside x
  __m512i acc[NB], xs[NB];
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    if (O::kDirect) {
      iy[b] = a.src_row0 + blk[b].oy * a.sh;
      cmask[b] = column_mask(a.src_col0 + blk[b].ox0 * a.sw, a.src_w);
    } else {
      base[b] = a.in + blk[b].oy * a.sh * a.in_stride + blk[b].ox0 * a.sw;
    }
    acc[b] = _mm512_setzero_si512();
    xs[b] = _mm512_setzero_si512();
  }
  const __m512i ones = _mm512_set1_epi8(1);
#pragma GCC unroll 5
  for (int64_t ky = 0; ky < kh; ++ky) {
#pragma GCC unroll 2
    for (int64_t q = 0; q < groups; ++q) {
      const bool last = q == groups - 1;
      const int64_t taps = last ? last_taps : 4;
      const __m512i w = _mm512_set1_epi32(a.taps4[ky * groups + q]);
      const __m512i shuf = last ? g.shuf_last : g.shuf_full;
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) {
        __m512i v;
        if (O::kFast) {
          const uint8_t *p1 = nullptr, *p2 = nullptr, *r1 = nullptr, *r2 = nullptr;
          int64_t c0 = 0;
          if (O::kDirect) {
            const int64_t y1 = iy[b] + ky * a.dh, y2 = y1 + a.sh;
            r1 = y1 >= 0 && y1 < a.src_h ? a.plane + y1 * a.src_w : nullptr;
            r2 = O::kPaired && blk[b].valid2 > 0 && y2 >= 0 && y2 < a.src_h ? a.plane + y2 * a.src_w : nullptr;
            c0 = a.src_col0 + blk[b].ox0 * a.sw + 4 * q * a.dw;
          } else {
            p1 = base[b] + ky * a.dh * a.in_stride + 4 * q * a.dw;
            // without a second row, read the first one again (the buffer may end after it)
            p2 = O::kPaired && blk[b].valid2 > 0 ? p1 + a.sh * a.in_stride : p1;
          }
          const __mmask64 m = O::kDirect ? cmask[b] : 0;
          __m512i w1 = load_window<O::kDirect>(p1, r1, c0, m, g);
          if (O::kFlip) w1 = _mm512_xor_si512(w1, g.flip);
          if (O::kPaired) {
            __m512i w2 = load_window<O::kDirect>(p2, r2, c0, m, g);
            if (O::kFlip) w2 = _mm512_xor_si512(w2, g.flip);
            v = _mm512_permutex2var_epi32(w1, g.perm2, w2);
          } else {
            v = _mm512_permutexvar_epi32(g.perm, w1);
          }
          v = _mm512_shuffle_epi8(v, shuf);
        } else {
          alignas(64) uint8_t tmp[64];
          const uint8_t* p1 = base[b] + ky * a.dh * a.in_stride + 4 * q * a.dw;
          const uint8_t* p2 = O::kPaired && blk[b].valid2 > 0 ? p1 + a.sh * a.in_stride : p1;
          for (int o = 0; o < 16; ++o) {
            const uint8_t* src = O::kPaired && o >= 8 ? p2 + (o - 8) * a.sw : p1 + o * a.sw;
            for (int t = 0; t < 4; ++t) tmp[4 * o + t] = t < taps ? src[t * a.dw] : 0;
          }
          v = _mm512_load_si512(tmp);
        }
        acc[b] = _mm512_dpbusd_epi32(acc[b], v, w);
        if (O::kZw) xs[b] = _mm512_dpbusd_epi32(xs[b], v, ones);
      }
    }
  }
  const __m512i colterm = _mm512_set1_epi32(a.colterm);
  const __m512i zw = _mm512_set1_epi32(a.zw);
#pragma GCC unroll 4
  for (int b = 0; b < NB; ++b) {
    __m512i v = _mm512_add_epi32(acc[b], colterm);
    if (O::kZw) v = _mm512_sub_epi32(v, _mm512_mullo_epi32(xs[b], zw));
    const int64_t at = blk[b].oy * a.y_stride + blk[b].ox0;
    finish(v, a, at, first_lanes(blk[b].valid));
    if (O::kPaired && blk[b].valid2 > 0) {  // lanes 8..15 -> the second row
      finish(_mm512_alignr_epi32(_mm512_setzero_si512(), v, 8), a, at + a.y_stride, first_lanes(blk[b].valid2));
    }
  }
}

template <typename O>
void rows_impl(const DepthwiseRows& a) {
  const Gather g = make_gather(a);
  Block blk[4];
  int n = 0;
  auto add = [&](const Block& b) {
    blk[n++] = b;
    if (n == 4) {
      blocks<4, O>(a, g, blk);
      n = 0;
    }
  };
  if (O::kPaired) {
    for (int64_t oy = 0; oy < a.rows; oy += 2) {
      add(Block{oy, 0, static_cast<int>(a.ow), oy + 1 < a.rows ? static_cast<int>(a.ow) : 0});
    }
  } else {
    for (int64_t oy = 0; oy < a.rows; ++oy) {
      for (int64_t x = 0; x < a.ow; x += 16) add(Block{oy, x, static_cast<int>(a.ow - x < 16 ? a.ow - x : 16), 0});
    }
  }
  for (int b = 0; b < n; ++b) blocks<1, O>(a, g, blk + b);
}

// Runtime choices -> one instantiation.
template <int KH, int G, bool kZw, bool kFast, bool kPaired>
void with_mode(const DepthwiseRows& a) {
  if constexpr (kFast && G == 1) {
    if (a.in == nullptr) {
      if (a.flip) {
        rows_impl<Opt<KH, G, kZw, kFast, kPaired, true, true>>(a);
      } else {
        rows_impl<Opt<KH, G, kZw, kFast, kPaired, true, false>>(a);
      }
      return;
    }
  }
  rows_impl<Opt<KH, G, kZw, kFast, kPaired, false, false>>(a);
}

template <int KH, int G, bool kZw, bool kFast>
void with_pairing(const DepthwiseRows& a) {
  if (a.ow <= 8 && a.rows > 1) {
    with_mode<KH, G, kZw, kFast, true>(a);
  } else {
    with_mode<KH, G, kZw, kFast, false>(a);
  }
}

template <bool kZw>
void with_shape(const DepthwiseRows& a) {
  if (!dw_gather_fits(a.sw, a.dw, a.kw)) {
    with_pairing<0, 0, kZw, false>(a);
  } else if (a.kh == 3 && a.kw == 3) {
    with_pairing<3, 1, kZw, true>(a);
  } else if (a.kh == 5 && a.kw == 5) {
    with_pairing<5, 2, kZw, true>(a);
  } else if (a.groups4 == 1) {
    with_pairing<0, 1, kZw, true>(a);
  } else if (a.groups4 == 2) {
    with_pairing<0, 2, kZw, true>(a);
  } else {
    with_pairing<0, 0, kZw, true>(a);
  }
}

}  // namespace

void depthwise_rows_avx512vnni(const DepthwiseRows& a) {
  if (a.zw != 0) {
    with_shape<true>(a);
  } else {
    with_shape<false>(a);
  }
}

}  // namespace conv
}  // namespace quanta
