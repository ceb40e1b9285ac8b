// Strided weight packing for batched_qgemm: one template, compiled once per ISA file
// (pack_strided_avx2.cc, pack_strided_avx512vnni.cc with their -m flags, the portable
// instance in batched_qgemm.cc), so the compiler vectorises the fixed-size inner loops for
// each target. The layout is the one of qgemm.h / pack.cc (see batched_qgemm.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#if defined(__SSE2__)
#include <immintrin.h>
#endif

namespace quanta {
namespace gemm {

struct StridedSource {
  const void* w = nullptr;  // w[k,n] = w[k·k_stride + n·n_stride]
  bool w_unsigned = false;
  int64_t K = 0, N = 0, k_stride = 0, n_stride = 0;
  int64_t Kp = 0, n_panels = 0;
  const int32_t* zero_point = nullptr;  // N values, or 1
  bool zero_point_per_channel = false;
};

// Packs every panel into dst (layout of the family NR x KR, Storage), the column sums into
// cs and zw' into zw (n_panels·NR entries each, padded with zeros). Internal linkage (the
// unnamed namespace): each ISA file keeps its own copy, compiled with its own flags, and the
// linker never merges an AVX-512 instance into the portable path.
namespace {

// One k-group (KR consecutive k) of one full panel (NR columns) into dg[j·KR + t].
// Columns contiguous along k (k_stride 1, Kᵀ of attention): KR bytes per column.
template <typename Src, typename Storage, int NR, int KR>
inline void pack_group_k_contiguous(const Src* col0, int64_t ns, Storage* dg) {
  constexpr int32_t kShift = std::is_same_v<Src, uint8_t> ? 128 : 0;
  if constexpr (sizeof(Storage) == 1 && KR == 4) {
    // 4 k values of a column are one 32-bit word; w − 128 of a uint8 is its byte ^ 0x80.
    constexpr uint32_t kFlip = kShift ? 0x80808080u : 0u;
    for (int j = 0; j < NR; ++j) {
      uint32_t v;
      std::memcpy(&v, col0 + j * ns, 4);
      v ^= kFlip;
      std::memcpy(dg + j * 4, &v, 4);
    }
  } else {
    for (int j = 0; j < NR; ++j) {
      for (int t = 0; t < KR; ++t)
        dg[j * KR + t] = static_cast<Storage>(static_cast<int32_t>(col0[j * ns + t]) - kShift);
    }
  }
}

// Rows contiguous along n (n_stride 1, a row-major [K, N] source, V of attention): an
// interleave of KR rows of NR bytes.
template <typename Src, typename Storage, int NR, int KR>
inline void pack_group_row_major(const Src* row0, int64_t ks, Storage* dg) {
  constexpr int32_t kShift = std::is_same_v<Src, uint8_t> ? 128 : 0;
#if defined(__SSE2__)
  if constexpr (NR % 16 == 0 && ((sizeof(Storage) == 1 && (KR == 4 || KR == 2)) || (sizeof(Storage) == 2 && KR == 2))) {
    const __m128i flip = _mm_set1_epi8(kShift ? static_cast<char>(0x80) : 0);
    for (int h = 0; h < NR / 16; ++h) {
      __m128i a[KR];
      for (int t = 0; t < KR; ++t) {
        a[t] = _mm_xor_si128(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row0 + t * ks + 16 * h)), flip);
      }
      __m128i* out = reinterpret_cast<__m128i*>(dg + 16 * h * KR);
      if constexpr (sizeof(Storage) == 1 && KR == 2) {
        // int8 storage, 2 k per j: bytes (r0[j], r1[j])
        _mm_storeu_si128(out + 0, _mm_unpacklo_epi8(a[0], a[1]));
        _mm_storeu_si128(out + 1, _mm_unpackhi_epi8(a[0], a[1]));
      } else if constexpr (KR == 4) {
        // bytes (r0[j], r1[j]) then words ((r0, r1)[j], (r2, r3)[j]): j-major, 4 k per j
        const __m128i t01lo = _mm_unpacklo_epi8(a[0], a[1]), t01hi = _mm_unpackhi_epi8(a[0], a[1]);
        const __m128i t23lo = _mm_unpacklo_epi8(a[2], a[3]), t23hi = _mm_unpackhi_epi8(a[2], a[3]);
        _mm_storeu_si128(out + 0, _mm_unpacklo_epi16(t01lo, t23lo));
        _mm_storeu_si128(out + 1, _mm_unpackhi_epi16(t01lo, t23lo));
        _mm_storeu_si128(out + 2, _mm_unpacklo_epi16(t01hi, t23hi));
        _mm_storeu_si128(out + 3, _mm_unpackhi_epi16(t01hi, t23hi));
      } else {
        // int16 storage, 2 k per j: pairs (r0[j], r1[j]) sign-extended to int16
        const __m128i lo = _mm_unpacklo_epi8(a[0], a[1]), hi = _mm_unpackhi_epi8(a[0], a[1]);
        _mm_storeu_si128(out + 0, _mm_srai_epi16(_mm_unpacklo_epi8(lo, lo), 8));
        _mm_storeu_si128(out + 1, _mm_srai_epi16(_mm_unpackhi_epi8(lo, lo), 8));
        _mm_storeu_si128(out + 2, _mm_srai_epi16(_mm_unpacklo_epi8(hi, hi), 8));
        _mm_storeu_si128(out + 3, _mm_srai_epi16(_mm_unpackhi_epi8(hi, hi), 8));
      }
    }
    return;
  }
#endif
  for (int t = 0; t < KR; ++t) {
    const Src* r = row0 + t * ks;
    for (int j = 0; j < NR; ++j) dg[j * KR + t] = static_cast<Storage>(static_cast<int32_t>(r[j]) - kShift);
  }
}

// sums[j] += Σ over the panel's groups and lanes of dg[j·KR + t] (wrapping uint32).
template <typename Storage, int NR, int KR>
inline void panel_column_sums(const Storage* d, int64_t groups, uint32_t* sums) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  if constexpr (sizeof(Storage) == 1 && KR == 4 && NR == 32) {
    // vpdpbusd(1, w'): each int32 lane j accumulates Σ_t w'[j·4 + t]
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i acc0 = _mm512_setzero_si512(), acc1 = _mm512_setzero_si512();
    for (int64_t g = 0; g < groups; ++g) {
      const int8_t* dg = reinterpret_cast<const int8_t*>(d) + g * 128;
      acc0 = _mm512_dpbusd_epi32(acc0, ones, _mm512_loadu_si512(dg));
      acc1 = _mm512_dpbusd_epi32(acc1, ones, _mm512_loadu_si512(dg + 64));
    }
    alignas(64) uint32_t tmp[32];
    _mm512_store_si512(tmp, acc0);
    _mm512_store_si512(tmp + 16, acc1);
    for (int j = 0; j < 32; ++j) sums[j] += tmp[j];
    return;
  }
#endif
  for (int64_t g = 0; g < groups; ++g) {
    const Storage* dg = d + g * NR * KR;
    for (int j = 0; j < NR; ++j) {
      uint32_t acc = 0;
      for (int t = 0; t < KR; ++t) acc += static_cast<uint32_t>(static_cast<int32_t>(dg[j * KR + t]));
      sums[j] += acc;
    }
  }
}

#if defined(__AVX512BW__)
// Two full panels (64 columns) of a row-major source, int8 storage, KR = 4: one 64-byte
// load per row and k-group, the AVX-512 unpacks (per 128-bit lane: column quads 16L ..
// 16L + 15), then a 4 x 4 transpose of the lanes into the two panels' 128-byte groups.
// The rows are read down a column strip (stride ks, often past the hardware prefetchers'
// reach), so the rows of a group 8 groups ahead are prefetched.
// With VNNI the column sums Σ_k w' of both panels come out of the same loop (sums0/1 +=).
template <typename Src>
inline void pack_panel_pair_row_major(const Src* col0, int64_t ks, int64_t groups, int8_t* d0, int8_t* d1,
                                      uint32_t* sums0, uint32_t* sums1) {
  constexpr bool kUnsigned = std::is_same_v<Src, uint8_t>;
  const __m512i flip = _mm512_set1_epi8(kUnsigned ? static_cast<char>(0x80) : 0);
  constexpr int64_t kAhead = 8;
#if defined(__AVX512VNNI__)
  const __m512i ones = _mm512_set1_epi8(1);
  __m512i acc[4] = {_mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512(), _mm512_setzero_si512()};
#endif
  for (int64_t g = 0; g < groups; ++g) {
    const Src* r = col0 + g * 4 * ks;
    if (g + kAhead < groups) {
      for (int t = 0; t < 4; ++t) _mm_prefetch(reinterpret_cast<const char*>(r + (kAhead * 4 + t) * ks), _MM_HINT_T0);
    }
    __m512i a[4];
    for (int t = 0; t < 4; ++t) a[t] = _mm512_xor_si512(_mm512_loadu_si512(r + t * ks), flip);
    const __m512i t01lo = _mm512_unpacklo_epi8(a[0], a[1]), t01hi = _mm512_unpackhi_epi8(a[0], a[1]);
    const __m512i t23lo = _mm512_unpacklo_epi8(a[2], a[3]), t23hi = _mm512_unpackhi_epi8(a[2], a[3]);
    // lane L of o_q: columns 16L + 4q .. 16L + 4q + 3, 4 bytes (k) each
    const __m512i o0 = _mm512_unpacklo_epi16(t01lo, t23lo), o1 = _mm512_unpackhi_epi16(t01lo, t23lo);
    const __m512i o2 = _mm512_unpacklo_epi16(t01hi, t23hi), o3 = _mm512_unpackhi_epi16(t01hi, t23hi);
    const __m512i u0 = _mm512_shuffle_i64x2(o0, o1, 0x44), u1 = _mm512_shuffle_i64x2(o2, o3, 0x44);  // lanes 0, 1
    const __m512i u2 = _mm512_shuffle_i64x2(o0, o1, 0xee), u3 = _mm512_shuffle_i64x2(o2, o3, 0xee);  // lanes 2, 3
    const __m512i v[4] = {_mm512_shuffle_i64x2(u0, u1, 0x88), _mm512_shuffle_i64x2(u0, u1, 0xdd),    // columns 0 .. 31
                          _mm512_shuffle_i64x2(u2, u3, 0x88), _mm512_shuffle_i64x2(u2, u3, 0xdd)};   // 32 .. 63
    _mm512_storeu_si512(d0 + g * 128, v[0]);
    _mm512_storeu_si512(d0 + g * 128 + 64, v[1]);
    _mm512_storeu_si512(d1 + g * 128, v[2]);
    _mm512_storeu_si512(d1 + g * 128 + 64, v[3]);
#if defined(__AVX512VNNI__)
    for (int i = 0; i < 4; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], ones, v[i]);  // Σ_t of each column's 4 k
#endif
  }
#if defined(__AVX512VNNI__)
  alignas(64) uint32_t tmp[64];
  for (int i = 0; i < 4; ++i) _mm512_store_si512(tmp + 16 * i, acc[i]);
  for (int j = 0; j < 32; ++j) {
    sums0[j] += tmp[j];
    sums1[j] += tmp[32 + j];
  }
#else
  panel_column_sums<int8_t, 32, 4>(d0, groups, sums0);
  panel_column_sums<int8_t, 32, 4>(d1, groups, sums1);
#endif
}
#endif

template <typename Src, typename Storage, int NR, int KR>
void pack_strided_panels(const StridedSource& s, Storage* dst, int32_t* cs, int32_t* zw) {
  constexpr int32_t kShift = std::is_same_v<Src, uint8_t> ? 128 : 0;  // w' = w − 128 for uint8
  const Src* w = static_cast<const Src*>(s.w);
  const int64_t K = s.K, N = s.N, ks = s.k_stride, ns = s.n_stride;
  const int64_t groups = s.Kp / KR;
  const int64_t full_groups = K / KR;
  auto conv = [](Src v) { return static_cast<Storage>(static_cast<int32_t>(v) - kShift); };
  // Groups from g_done on (the K tail, a partial panel, or other strides, zero padded),
  // then the column sums of panel p (its groups before `summed` are in sums already).
  auto finish_panel = [&](int64_t p, int64_t g_done, uint32_t* sums, int64_t summed) {
    const int64_t n0 = p * NR;
    const int cols = static_cast<int>(std::min<int64_t>(NR, N - n0));
    Storage* d = dst + p * s.Kp * NR;
    for (int64_t g = g_done; g < groups; ++g) {
      Storage* dg = d + g * NR * KR;
      for (int j = 0; j < NR; ++j) {
        for (int t = 0; t < KR; ++t) {
          const int64_t k = g * KR + t;
          dg[j * KR + t] = (j < cols && k < K) ? conv(w[k * ks + (n0 + j) * ns]) : Storage{0};
        }
      }
    }
    // Column sums from the packed panel (contiguous): Σ_k w' in wrapping uint32, then
    // cs = Σ w' + K·shift − K·zw, wrapped to int32 as pack.cc does.
    panel_column_sums<Storage, NR, KR>(d + summed * NR * KR, groups - summed, sums);
    for (int j = 0; j < NR; ++j) {
      const int64_t n = n0 + j;
      if (j >= cols) {
        cs[n] = 0;
        zw[n] = 0;
        continue;
      }
      const int64_t z = s.zero_point[s.zero_point_per_channel ? n : 0];
      const uint64_t total = static_cast<uint64_t>(sums[j]) + static_cast<uint64_t>(K * (kShift - z));
      cs[n] = static_cast<int32_t>(static_cast<uint32_t>(total));
      zw[n] = static_cast<int32_t>(z - kShift);
    }
  };
  for (int64_t p = 0; p < s.n_panels; ++p) {
    const int64_t n0 = p * NR;
    const int cols = static_cast<int>(std::min<int64_t>(NR, N - n0));
    Storage* d = dst + p * s.Kp * NR;
#if defined(__AVX512BW__)
    if constexpr (sizeof(Storage) == 1 && NR == 32 && KR == 4) {
      if (ns == 1 && N - n0 >= 2 * NR) {  // two full panels of a row-major source
        uint32_t sums0[NR] = {}, sums1[NR] = {};
        pack_panel_pair_row_major<Src>(w + n0, ks, full_groups, reinterpret_cast<int8_t*>(d),
                                       reinterpret_cast<int8_t*>(d + s.Kp * NR), sums0, sums1);
        finish_panel(p, full_groups, sums0, full_groups);
        finish_panel(p + 1, full_groups, sums1, full_groups);
        ++p;
        continue;
      }
    }
#endif
    int64_t g_done = 0;
    if (cols == NR && ks == 1) {
      // Each column's k values are contiguous (a transposed source, e.g. Kᵀ in attention).
      for (int64_t g = 0; g < full_groups; ++g) {
        pack_group_k_contiguous<Src, Storage, NR, KR>(w + n0 * ns + g * KR, ns, d + g * NR * KR);
      }
      g_done = full_groups;
    } else if (cols == NR && ns == 1) {
      // Rows are contiguous (a row-major [K, N] source, e.g. V in attention).
      for (int64_t g = 0; g < full_groups; ++g) {
        pack_group_row_major<Src, Storage, NR, KR>(w + g * KR * ks + n0, ks, d + g * NR * KR);
      }
      g_done = full_groups;
    }
    uint32_t sums[NR] = {};
    finish_panel(p, g_done, sums, 0);
  }
}
}  // namespace

// The per-ISA entry points (one per family layout).
void pack_strided_portable(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw);    // 16 x 4, int8
void pack_strided_avx2(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw);        // 16 x 2, int16
void pack_strided_avx512vnni(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw);  // 32 x 4, int8

}  // namespace gemm
}  // namespace quanta
