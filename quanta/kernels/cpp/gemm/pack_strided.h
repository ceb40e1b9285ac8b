// Strided weight packing for batched_qgemm: one template, compiled once per ISA file
// (pack_strided_avx2.cc, pack_strided_avx512vnni.cc with their -m flags, the portable
// instance in batched_qgemm.cc), so the compiler vectorises the fixed-size inner loops for
// each target. The layout is the one of qgemm.h / pack.cc (see batched_qgemm.cc).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace quanta {
namespace gemm {

struct StridedSource {
  const void* w = nullptr;    // w[k,n] = w[k·k_stride + n·n_stride]
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
template <typename Src, typename Storage, int NR, int KR>
void pack_strided_panels(const StridedSource& s, Storage* dst, int32_t* cs, int32_t* zw) {
  constexpr int32_t kShift = std::is_same_v<Src, uint8_t> ? 128 : 0;  // w' = w − 128 for uint8
  const Src* w = static_cast<const Src*>(s.w);
  const int64_t K = s.K, N = s.N, ks = s.k_stride, ns = s.n_stride;
  const int64_t groups = s.Kp / KR;
  const int64_t full_groups = K / KR;
  auto conv = [](Src v) { return static_cast<Storage>(static_cast<int32_t>(v) - kShift); };
  for (int64_t p = 0; p < s.n_panels; ++p) {
    const int64_t n0 = p * NR;
    const int cols = static_cast<int>(std::min<int64_t>(NR, N - n0));
    Storage* d = dst + p * s.Kp * NR;
    int64_t g_done = 0;
    if (cols == NR && ks == 1) {
      // Each column's k values are contiguous (a transposed source, e.g. Kᵀ in attention).
      for (int64_t g = 0; g < full_groups; ++g) {
        Storage* dg = d + g * NR * KR;
        for (int j = 0; j < NR; ++j) {
          const Src* src = w + (n0 + j) * ns + g * KR;
          for (int t = 0; t < KR; ++t) dg[j * KR + t] = conv(src[t]);
        }
      }
      g_done = full_groups;
    } else if (cols == NR && ns == 1) {
      // Rows are contiguous (a row-major [K, N] source, e.g. V in attention).
      for (int64_t g = 0; g < full_groups; ++g) {
        Storage* dg = d + g * NR * KR;
        const Src* row = w + g * KR * ks + n0;
        for (int t = 0; t < KR; ++t) {
          const Src* r = row + t * ks;
          for (int j = 0; j < NR; ++j) dg[j * KR + t] = conv(r[j]);
        }
      }
      g_done = full_groups;
    }
    // Remaining groups (the K tail, a partial panel, or other strides), zero padded.
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
    uint32_t sums[NR] = {};
    for (int64_t g = 0; g < groups; ++g) {
      const Storage* dg = d + g * NR * KR;
      for (int j = 0; j < NR; ++j) {
        uint32_t acc = 0;
        for (int t = 0; t < KR; ++t) acc += static_cast<uint32_t>(static_cast<int32_t>(dg[j * KR + t]));
        sums[j] += acc;
      }
    }
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
  }
}
}  // namespace

// The per-ISA entry points (one per family layout).
void pack_strided_portable(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw);    // 16 x 4, int8
void pack_strided_avx2(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw);        // 16 x 2, int16
void pack_strided_avx512vnni(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw);  // 32 x 4, int8

}  // namespace gemm
}  // namespace quanta
