// qgemm_u8s8_s32_4x16c4__portable (layout: kernel.h PortableLayout).
//
// The same computation as the SIMD families in plain C++ over the vpdpbusd-shaped
// layout (groups of 4 k per column), the always-available path and the one CI without
// AVX2 runs. Accumulators are uint32 so that wrap-around (ONNX's int32 accumulator for
// very long K) is defined behaviour; each product u8·s8 fits in int32 exactly.
#include "qgemm/kernel.h"

namespace quanta {
namespace qgemm {
namespace {

using L = PortableLayout;
constexpr int kNR = L::kNR;
constexpr int kKR = L::kKR;

template <int MR>
void tile(const TileArgs& t, int64_t r0) {
  const uint8_t* a = t.a_rows ? nullptr : static_cast<const uint8_t*>(t.a) + r0 * t.a_row_stride;
  const int8_t* b = static_cast<const int8_t*>(t.b);
  int32_t* partial = t.partial + r0 * kNR;

  uint32_t acc[MR][kNR];
  for (int r = 0; r < MR; ++r) {
    for (int j = 0; j < kNR; ++j) acc[r][j] = t.accumulate ? static_cast<uint32_t>(partial[r * kNR + j]) : 0u;
  }
  const int64_t taps = t.a_rows ? t.n_taps : 1;  // indirect rows: kernel.h TileArgs
  for (int64_t i = 0; i < taps; ++i) {
    for (int64_t k = 0; k < t.kc; k += kKR) {
      for (int r = 0; r < MR; ++r) {
        const uint8_t* ar = (t.a_rows ? t.a_rows[r0 + r] + t.tap_offset[i] : a + r * t.a_row_stride) + k;
        for (int j = 0; j < kNR; ++j) {
          int32_t dot = 0;  // |Σ_4 u8·s8| <= 4·255·128: exact
          for (int q = 0; q < kKR; ++q) dot += static_cast<int32_t>(ar[q]) * static_cast<int32_t>(b[j * kKR + q]);
          acc[r][j] += static_cast<uint32_t>(dot);
        }
      }
      b += kNR * kKR;
    }
  }

  if (!t.finish) {
    for (int r = 0; r < MR; ++r) {
      for (int j = 0; j < kNR; ++j) partial[r * kNR + j] = static_cast<int32_t>(acc[r][j]);
    }
    return;
  }
  const Epilogue& e = *t.epi;
  for (int r = 0; r < MR; ++r) {
    const int64_t m = t.m0 + r0 + r;
    for (int j = 0; j < t.cols; ++j) {
      const int64_t n = t.n0 + j;
      finish_element(fold_terms(static_cast<int32_t>(acc[r][j]), e, m, n), e, m, n);
    }
  }
}

}  // namespace

void qgemm_tiles_portable(const TileArgs& t) {
  constexpr int MR = L::kMR;
  int64_t r0 = 0;
  for (; r0 + MR <= t.rows; r0 += MR) tile<MR>(t, r0);
  switch (t.rows - r0) {
    case 1: tile<1>(t, r0); break;
    case 2: tile<2>(t, r0); break;
    case 3: tile<3>(t, r0); break;
    default: break;
  }
}

}  // namespace qgemm
}  // namespace quanta
