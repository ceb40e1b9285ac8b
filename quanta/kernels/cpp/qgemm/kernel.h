// Internal interface between the qgemm driver (qgemm.cc) and the micro-kernel families
// (qgemm_<isa>.cc): the fixed layouts, the per-call epilogue constants, the tile call,
// and the scalar arithmetic every family shares for its epilogue (so the portable path
// and the SIMD tails are the same code).
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "qgemm/qgemm.h"

namespace quanta {
namespace qgemm {

// The packed layout is part of the micro-kernel's type (ruy FixedKernelLayout): NR
// columns per panel, KR consecutive k per group, weight storage type, and the A-side
// (x') element type the kernel reads. MR is the register tile height.
template <int MR_, int NR_, int KR_, typename WStorage, typename AStorage>
struct FixedKernelLayout {
  static constexpr int kMR = MR_;
  static constexpr int kNR = NR_;
  static constexpr int kKR = KR_;
  using WeightStorage = WStorage;
  using ActivationStorage = AStorage;
};

// qgemm_u8s8_s32_4x16c4__portable: plain C++ over the vpdpbusd-shaped layout.
using PortableLayout = FixedKernelLayout<4, 16, 4, int8_t, uint8_t>;
// qgemm_u8s8_s32_6x16c2__avx2: vpmaddwd on int16 operands (x' zero-extended per call, w
// stored as int8 pairs and sign-extended in the k-loop), which cannot saturate:
// |x'0·w0 + x'1·w1| <= 2·255·128 < 2^31. (vpmaddubsw would saturate its int16 pair sums
// at 2·255·127 > 2^15 − 1.)
using Avx2Layout = FixedKernelLayout<6, 16, 2, int8_t, int16_t>;
// qgemm_u8s8p_s32_5x16c4__avx2: weights whose every pair of w' (k = 2j, 2j + 1) sums to
// at most 128 in its positive codes and in its negative codes' magnitudes
// (weights_pairs_fit_int16; Recipe.weight_bits = 7 gives [-64, 64], which always fits),
// packed instead of the family above when the avx2 weights allow it
// (PackedWeights::narrow): vpmaddubsw + vpmaddwd(1) + vpaddd, 4 k per x' broadcast, exact
// because x'0·w0 + x'1·w1 is then in [−255·128, 255·128] = [−32640, 32640], inside the int16
// that vpmaddubsw saturates to (docs/kernels.md eq. (K1)-(K2)). Same data layout as the
// portable family (int8 groups of 4, uint8 x').
using Avx2NarrowLayout = FixedKernelLayout<5, 16, 4, int8_t, uint8_t>;
// qgemm_u8s8_s32_12x32c4__avx512vnni: vpdpbusd, 12 rows x 2 zmm of int32 accumulators.
using Avx512VnniLayout = FixedKernelLayout<12, 32, 4, int8_t, uint8_t>;

enum class EpiKind : int { kS32, kF32, kQ8Float, kQ8Fixed };

// Per-call constants of the fused output stage. Column arrays are padded to
// n_panels·NR entries (zeros), so whole-vector loads never leave them.
struct Epilogue {
  EpiKind kind = EpiKind::kS32;
  bool y_signed = false;              // kQ8*: int8 (true) or uint8 output
  const int32_t* colterm = nullptr;   // bias[n] − zx'·cs[n] (wrapping); bias[n] when zx_row
  const int32_t* zw = nullptr;        // zw'[n], or null when every zw' is 0
  const int32_t* rowsum = nullptr;    // Σ_k x'[m,k] (when zw)
  const int32_t* zx_row = nullptr;    // per-row zx'[m], or null for a scalar zx
  const int32_t* cs = nullptr;        // cs[n] (when zx_row)
  const float* multiplier = nullptr;  // kF32, kQ8Float: per column n
  // The transposed output stage (qgemm.h row_bias / multiplier_per_row): rowterm[m] is
  // added to row m's sums, and mult_row[m] replaces multiplier[n] (kF32, kQ8Float).
  const int32_t* rowterm = nullptr;
  const float* mult_row = nullptr;
  const float* float_bias = nullptr;          // kF32, or null
  const int32_t* fixed_multiplier = nullptr;  // kQ8Fixed
  const int32_t* fixed_shift = nullptr;       // kQ8Fixed
  int32_t zy = 0;
  int32_t lo = 0, hi = 0;                      // kS32: clamp; kQ8*: L, H of the contract (quantized)
  float lo_minus_zy = 0.f, hi_minus_zy = 0.f;  // kQ8Float: L − zy, H − zy
  float flo = 0.f, fhi = 0.f;                  // kF32 clamp
  // kQ8Float: the second affine stage (qgemm.h post_k), or null; post_lo / post_hi are
  // the output type's qmin, qmax
  const float* post_k = nullptr;
  const float* post_u = nullptr;
  float post_r1 = 0.f, post_r2 = 0.f, post_lo = 0.f, post_hi = 0.f;
  void* y = nullptr;
  int64_t y_row_stride = 0;  // elements
};

constexpr int64_t kDefaultPrefetch = 2048;

// One call: rows [m0, m0 + rows) of the A block x one NR panel x one K chunk.
struct TileArgs {
  const void* a = nullptr;     // x' at (row m0, k = k0), ActivationStorage elements
  int64_t a_row_stride = 0;    // elements
  int64_t rows = 0;            // processed in MR-row tiles; the last may be shorter
  int64_t kc = 0;              // chunk length, a multiple of KR (may be 0)
  const void* b = nullptr;     // packed panel at group k0 / KR
  int32_t* partial = nullptr;  // rows x NR int32 (row stride NR): sums of earlier chunks
  bool accumulate = false;     // start from `partial` instead of 0
  bool finish = false;         // last chunk: run the epilogue; else store sums to `partial`
  // Required on every call, not only with finish: a family may fold epi->colterm into the
  // first chunk's sums (the AVX-512 one does), so `partial` is private to the family.
  const Epilogue* epi = nullptr;
  int64_t m0 = 0, n0 = 0;  // output origin
  int cols = 0;            // valid columns of the panel (<= NR)
  // B prefetch distance in bytes (qgemm.h Blocking::prefetch; the avx512vnni 12-row tile
  // reads it, 0: no prefetch). Any value gives the same bytes.
  int64_t prefetch = kDefaultPrefetch;
  // Few rows against a B streamed from L3 or DRAM (qgemm.cc kStreamRows): the first row
  // tile of the call prefetches B this many bytes ahead of what it reads, whatever its
  // height (0: none; the avx512vnni family reads it, the others ignore it), so the next
  // panels are on their way while the other row tiles reuse this one from L1. Any value
  // gives the same bytes.
  int64_t stream_prefetch = 0;
  // Indirect rows and taps (the implicit convolution, conv_gemm.cc; every family but the
  // AVX-512 int16 one). When a_rows is set, `a` and a_row_stride are unused and the call
  // runs n_taps chunks of kc each with the sums kept in registers: row r's x' for tap i and
  // k < kc is element k of ActivationStorage at byte a_rows[r] + tap_offset[i], and
  // tap i's weights are the kc / KR groups after tap i − 1's in the panel (B is read
  // sequentially, k = i·kc + ..). accumulate / finish apply to the call as a whole.
  const uint8_t* const* a_rows = nullptr;  // `rows` pointers (row 0 = row m0 of the tile run)
  const int64_t* tap_offset = nullptr;     // n_taps byte offsets
  int64_t n_taps = 1;
};

using TileFn = void (*)(const TileArgs&);

// One row of the dispatch table (qgemm.cc): a micro-kernel family and its layout.
struct KernelFamily {
  Isa isa;
  const char* name;  // docs/kernels.md grammar
  int mr, nr, kr;
  int w_bytes;  // weight storage bytes (1: int8, 2: int16)
  int a_bytes;  // x' storage bytes (1: uint8, 2: int16)
  TileFn tiles;
  // The tile streams B from L2 at full speed with its MR x KC x' bytes in L1: when the
  // task's B fits in 3/4 of the core's L2, the driver runs the row tiles outer and the panels
  // inner (qgemm.cc l2_share_bytes). Else, and for the other families, large A blocks with B chunks
  // in L1.
  bool row_tiles_outer;
  // Rows per tile of the indirect form (TileArgs::a_rows, the implicit convolution): the
  // avx512vnni family keeps 8-row tiles there (12 row pointers would not fit the GPRs).
  int mr_indirect;
};
const KernelFamily& kernel_family(Isa isa);
// The family the weights were packed for: kernel_family(w.isa), or the avx2 pair-safe
// family for PackedWeights::narrow.
const KernelFamily& kernel_family(const PackedWeights& w);
// The largest sum of one sign's codes a vpmaddubsw pair may hold exactly: 255·128 =
// 32640 <= 32767, 255·129 > 32768 (docs/kernels.md eq. (K2)).
constexpr int32_t kPairCodeBound = 128;
// Whether every pair (k = 2j, 2j + 1) of w' (w, or w − 128 for uint8 w) of w [K, N] (row
// stride `stride`) holds at most kPairCodeBound in its positive codes and in its negative
// codes' magnitudes, so that the avx2 pair-safe family computes it exactly.
bool weights_pairs_fit_int16(const void* w, bool w_unsigned, int64_t K, int64_t N, int64_t stride);

// Activation packing (pack.cc): rows [m_begin, m_end) of x -> x' rows of Kp elements
// (x' = x for uint8, x ^ 0x80 = x + 128 for int8; zeros in [K, Kp)).
void pack_activations_u8(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t Kp, int64_t m_begin,
                         int64_t m_end, uint8_t* dst);
void pack_activations_s16(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t Kp, int64_t m_begin,
                          int64_t m_end, int16_t* dst);
// The same with AVX2 vectors (qgemm_avx2.cc; the avx2 8-bit family's x').
void pack_activations_s16_avx2(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t Kp,
                               int64_t m_begin, int64_t m_end, int16_t* dst);
// rowsum[m] = Σ_k x'[m,k] for m in [m_begin, m_end).
void activation_row_sums(const void* x, int64_t x_row_stride, bool x_signed, int64_t K, int64_t m_begin, int64_t m_end,
                         int32_t* rowsum);

void qgemm_tiles_portable(const TileArgs& t);
void qgemm_tiles_avx2(const TileArgs& t);
void qgemm_tiles_avx2_narrow(const TileArgs& t);
// One row (M = 1) on the avx2 pair-safe family's panels [pb, pe): x' a [Kp] (zeros in [K, Kp)),
// the panels' whole K summed in registers, two panels per pass, and e's output stage for
// row 0 (fold_row, then finish_vector's operations; kF32 inline). The sums are
// tile<1, true>'s in int32 (wrapping, so the order of the terms does not change a bit), and
// the output stage is the same per-lane operations, so the bytes are the tiles'. It serves
// the GEMV of a recurrent step and any other one-row product: the tile driver spends a
// call, a tile set-up and two out-of-line finish_vector calls per 16-column panel and cuts
// K into chunks (measured on Zen 3, one thread: 1 x 256 x 1024 8.3-9.0 -> 6.8-7.2 us,
// 1 x 768 x 3072 57-62 -> 48-56 us; docs/kernels.md "Blocking").
void qgemm_row_avx2_narrow(const uint8_t* a, int64_t Kp, const uint8_t* w_panels, int64_t pb, int64_t pe, int64_t N,
                           const Epilogue& e);
void qgemm_tiles_avx512vnni(const TileArgs& t);
double vnni_peak_probe_avx512vnni(double seconds);

// ---------------------------------------------------------------------------------------
// Scalar arithmetic shared by every family (int32 wraps: computed in uint32).
// ---------------------------------------------------------------------------------------

inline int32_t wrapping_add(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) + static_cast<uint32_t>(b));
}
inline int32_t wrapping_sub(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) - static_cast<uint32_t>(b));
}
inline int32_t wrapping_mul(int32_t a, int32_t b) {
  return static_cast<int32_t>(static_cast<uint32_t>(a) * static_cast<uint32_t>(b));
}

// gemmlowp SaturatingRoundingDoublingHighMul: floor(a·b / 2^31 + 1/2) (ties up), with
// INT32_MIN·INT32_MIN saturating to INT32_MAX (requant.py).
inline int32_t srdhm(int32_t a, int32_t b) {
  if (a == INT32_MIN && b == INT32_MIN) return INT32_MAX;
  const int64_t ab = static_cast<int64_t>(a) * static_cast<int64_t>(b);
  const int64_t nudge = ab >= 0 ? (int64_t{1} << 30) : (1 - (int64_t{1} << 30));
  return static_cast<int32_t>((ab + nudge) / (int64_t{1} << 31));  // C++ truncates toward 0
}

// gemmlowp RoundingDivideByPOT: x / 2^e rounded half away from zero, 0 <= e <= 31.
inline int32_t rdbpot(int32_t x, int e) {
  const int64_t mask = (int64_t{1} << e) - 1;
  const int64_t x64 = x;
  const int64_t remainder = x64 & mask;
  const int64_t threshold = (mask >> 1) + (x64 < 0 ? 1 : 0);
  return static_cast<int32_t>((x64 >> e) + (remainder > threshold ? 1 : 0));
}

// TFLite MultiplyByQuantizedMultiplier (eq. (7)); acc·2^left wraps as int32.
inline int32_t fixed_point_scale(int32_t acc, int32_t multiplier, int32_t shift) {
  const int left = shift > 0 ? shift : 0;
  const int right = shift > 0 ? 0 : -shift;
  const int32_t shifted = static_cast<int32_t>(static_cast<uint32_t>(acc) << left);
  return rdbpot(srdhm(shifted, multiplier), right);
}

// The second affine stage on a code y in [L, H] (qgemm.h post_k): two fused multiply-adds
// (std::fma: one rounding each, as the SIMD families' vfmadd), clamped to the output type.
inline int32_t post_stage(int32_t y, const Epilogue& e, int64_t n) {
  float g = std::fma(e.post_u[n], e.post_r2, std::fma(static_cast<float>(y), e.post_r1, e.post_k[n]));
  g = g < e.post_lo ? e.post_lo : g;
  g = g > e.post_hi ? e.post_hi : g;
  return static_cast<int32_t>(std::nearbyint(g));
}

// The output stage for one element; `acc` already holds every folded term (eq. (5)).
inline void finish_element(int32_t acc, const Epilogue& e, int64_t m, int64_t n) {
  const int64_t at = m * e.y_row_stride + n;
  switch (e.kind) {
    case EpiKind::kS32: {
      int32_t v = acc < e.lo ? e.lo : acc;
      v = v > e.hi ? e.hi : v;
      static_cast<int32_t*>(e.y)[at] = v;
      return;
    }
    case EpiKind::kF32: {
      float v = static_cast<float>(acc) * (e.mult_row ? e.mult_row[m] : e.multiplier[n]);
      if (e.float_bias) v = v + e.float_bias[n];
      v = v < e.flo ? e.flo : v;
      v = v > e.fhi ? e.fhi : v;
      static_cast<float*>(e.y)[at] = v;
      return;
    }
    case EpiKind::kQ8Float: {
      float v = static_cast<float>(acc) * (e.mult_row ? e.mult_row[m] : e.multiplier[n]);
      v = v < e.lo_minus_zy ? e.lo_minus_zy : v;
      v = v > e.hi_minus_zy ? e.hi_minus_zy : v;
      int32_t q = static_cast<int32_t>(std::nearbyint(v)) + e.zy;
      if (e.post_k) q = post_stage(q, e, n);
      if (e.y_signed) {
        static_cast<int8_t*>(e.y)[at] = static_cast<int8_t>(q);
      } else {
        static_cast<uint8_t*>(e.y)[at] = static_cast<uint8_t>(q);
      }
      return;
    }
    case EpiKind::kQ8Fixed: {
      const int64_t s = static_cast<int64_t>(fixed_point_scale(acc, e.fixed_multiplier[n], e.fixed_shift[n])) + e.zy;
      const int32_t q = static_cast<int32_t>(s < e.lo ? e.lo : (s > e.hi ? e.hi : s));
      if (e.y_signed) {
        static_cast<int8_t*>(e.y)[at] = static_cast<int8_t>(q);
      } else {
        static_cast<uint8_t*>(e.y)[at] = static_cast<uint8_t>(q);
      }
      return;
    }
  }
}

// acc with the folded zero-point and bias terms, scalar form (eq. (5)).
inline int32_t fold_terms(int32_t product, const Epilogue& e, int64_t m, int64_t n) {
  int32_t acc = wrapping_add(product, e.colterm[n]);
  if (e.zw) acc = wrapping_sub(acc, wrapping_mul(e.zw[n], e.rowsum[m]));
  if (e.zx_row) acc = wrapping_sub(acc, wrapping_mul(e.zx_row[m], e.cs[n]));
  if (e.rowterm) acc = wrapping_add(acc, e.rowterm[m]);
  return acc;
}

template <typename T>
inline T load_unaligned(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace qgemm
}  // namespace quanta
