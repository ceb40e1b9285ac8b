// mx_i8_12x32c4__avx512vnni: the MXINT8 GEMM tiles on A tiled by pack_a_i8_avx512vnni
// (PackedMxA), and the vectorized INT8 QuantizeMX.
//
// Tile: up to 12 rows x 32 columns of one B panel over the whole K. Per block k the int32
// accumulators start at −128·Σ_block w (vpdpbusd takes u8 x s8: A is shifted by +128, eq.
// (8)) or at the offset sums below; kb/4 groups of two 64-byte weight loads, one 4-byte
// broadcast per row and two vpdpbusd per row give the exact block dots D_k; then per row
// p = fl32(D_k)·s (eqs. (MX5b)-(MX5c)) and acc = acc + p (eq. (MX6)), one rounding each
// (this file is built with -mfma: fp-contract is off below; the explicit fma forms are
// exact where they stand, see each).
// The other formats run the generic loops of mx_impl.h, compiled here with AVX-512.
#if defined(__clang__)
#pragma clang fp contract(off)
#else
#pragma GCC optimize("fp-contract=off")
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "mx/mx_impl.h"

namespace quanta {
namespace mx {
namespace {

// The offset sums (PackedMx::init). A column with B code c starts its int32 block sum at
// I = bits(M) − 128·Σ_block w, M = 1.5·2^(c − 110), the float whose unit in the last
// place is 2^(c − 133) (B's scale fl32(2^(c − 127 − f_B)) of eq. (MX5b)). vpdpbusd adds
// Σ (a + 128)·w (eq. (8)), so the sum ends as bits(M) + D_k; |D_k| ≤ block·128·128 < 2^22
// (block < 256; 2^19 at 32) keeps it within M's binade, where adding D_k to the bits adds
// D_k units in the last place: read as a float the register is exactly
// M + D_k·2^(c − 133), and subtracting M gives D_k·2^(c − 133) exactly (both in one
// binade: Sterbenz). vscalefps by A's 2^(a − 133) then gives
// fl32(D_k)·fl32(2^(a + b − 266)) of eq. (MX5c) exactly where the driver's code ranges
// hold. Three vector operations per 16 outputs and block (subtract, scale, add) instead of
// four (exponent add, conversion, scale, add). Needs M normal and D_k·2^(c − 133) normal
// or zero: c in [kMxInitLo, kMxInitHi] = [7, 237] (the packer builds init only for such
// panels).
constexpr int32_t kExpMask = static_cast<int32_t>(0xff800000u);  // sign and exponent bits
constexpr int32_t kMantTop = 0x400000;                           // M's mantissa: 0.5

#define QUANTA_MX_VPDPBUSD(acc, a, b) (acc) = _mm512_dpbusd_epi32((acc), (a), (b))

// The fast path of a full 12-row tile, as two 6-row halves, each one asm loop over the
// blocks [k0, k1) that keeps its float accumulators of eq. (MX6) in registers: int32 block
// sums in zmm0-11 (row r: columns 0-15 in zmm r, 16-31 in zmm 6+r), float sums in
// zmm12-23 (the same layout from 12), B in zmm24-25, A's broadcasts in zmm26-27, the
// column offsets M_n in zmm30-31. Per block: the int32 sums are loaded as
// bits(M_n) − 128·Σ_block w (PackedMx::init, kExpMask above), 8 groups of 4 k give 96 vpdpbusd, after which
// each register read as floats is M_n + D_k·2^(b − 133) exactly; the subtraction of M_n
// gives D_k·2^(b − 133) exactly, vscalefps by A's 2^(a − 133) gives
// p = fl32(D_k)·fl32(2^(a + b − 266)) exactly when the driver's code ranges hold (eqs.
// (MX5b)-(MX5c)), and acc + p rounds once, as eq. (MX6)'s separate multiply and add (p is
// never −0, so the first block's 0 + p is p). Why this shape, measured on Zen 4 / 5: a
// 512-bit store costs about a vpdpbusd slot, so a 12 x 32 tile whose 24 float sums live in
// memory paid ~24 of every block's 96 cycles storing them; a multiply or an fma also takes
// a vpdpbusd slot, vsubps, vscalefps and vaddps do not, up to about one for every two
// vpdpbusd: the column terms come as loads (PackedMx::init), three vector operations per 16
// outputs and block remain.
// A: per block [group][12 rows][4] (the half starts at row 6·h), B: [group][32][4].
// clang-format off
#define MXH_ZERO(r) "vpxord %%zmm" #r ", %%zmm" #r ", %%zmm" #r "\n\t"
#define MXH_BCAST(bc, d, r, r2)                                  \
  "vpbroadcastd " #d "(%[a]), %%zmm" #bc "\n\t"                  \
  "vpdpbusd %%zmm24, %%zmm" #bc ", %%zmm" #r "\n\t"              \
  "vpdpbusd %%zmm25, %%zmm" #bc ", %%zmm" #r2 "\n\t"
#define MXH_GROUP(g)                                             \
  "vmovdqu64 " #g "*128(%[w]), %%zmm24\n\t"                      \
  "vmovdqu64 " #g "*128+64(%[w]), %%zmm25\n\t"                   \
  MXH_BCAST(26, g*48+0, 0, 6) MXH_BCAST(27, g*48+4, 1, 7)        \
  MXH_BCAST(26, g*48+8, 2, 8) MXH_BCAST(27, g*48+12, 3, 9)       \
  MXH_BCAST(26, g*48+16, 4, 10) MXH_BCAST(27, g*48+20, 5, 11)
#define MXH_INIT(r, r2)                                          \
  "vmovdqa64 (%[sd]), %%zmm" #r "\n\t"                          \
  "vmovdqa64 64(%[sd]), %%zmm" #r2 "\n\t"
#define MXH_SCALE(r, r2, f, f2)                                  \
  "vsubps %%zmm30, %%zmm" #r ", %%zmm" #r "\n\t"                 \
  "vsubps %%zmm31, %%zmm" #r2 ", %%zmm" #r2 "\n\t"               \
  "vscalefps " #r "*4(%[ea])%{1to16%}, %%zmm" #r ", %%zmm" #r "\n\t"    \
  "vscalefps " #r "*4(%[ea])%{1to16%}, %%zmm" #r2 ", %%zmm" #r2 "\n\t"  \
  "vaddps %%zmm" #r ", %%zmm" #f ", %%zmm" #f "\n\t"             \
  "vaddps %%zmm" #r2 ", %%zmm" #f2 ", %%zmm" #f2 "\n\t"
// M = (I & 0xff800000) | 0x400000 (vpternlogd 0xEA: A & B | C): the offset's bits from
// the starting sum I = bits(M) − 128·Σ w, whose low 23 bits are 2^22 − 128·Σ w (never
// carried out of them: |128·Σ w| ≤ 2^19)
#define MXH_OFFSET(z, off)                                       \
  "vmovdqa64 " #off "(%[sd]), %%zmm" #z "\n\t"                   \
  "vpternlogd $0xEA, %%zmm29, %%zmm28, %%zmm" #z "\n\t"
#define MXH_STORE(f, f2, r)                                      \
  "vmovaps %%zmm" #f ", " #r "*128(%[acc])\n\t"                  \
  "vmovaps %%zmm" #f2 ", " #r "*128+64(%[acc])\n\t"
// clang-format on

// The fma form of MXH_SCALE, eq. (MQ1) of docs/quantization-math.md: acc + v·2^(a − 133)
// with the power as a float (PackedMxA::sf) broadcast from memory, one rounding
// (v·2^(a − 133) is exact under the code ranges, so the fma rounds the sum of eq. (MX6)
// once, as vscalefps then vaddps do): two vector operations per 16 outputs and block
// instead of three.
// clang-format off
#define MXH_SCALE_FMA(r, r2, f, f2)                              \
  "vsubps %%zmm30, %%zmm" #r ", %%zmm" #r "\n\t"                 \
  "vsubps %%zmm31, %%zmm" #r2 ", %%zmm" #r2 "\n\t"               \
  "vfmadd231ps " #r "*4(%[ea])%{1to16%}, %%zmm" #r ", %%zmm" #f "\n\t"    \
  "vfmadd231ps " #r "*4(%[ea])%{1to16%}, %%zmm" #r2 ", %%zmm" #f2 "\n\t"
// clang-format on

// One half tile's blocks (the two asm forms differ in their rescale step, SCALE).
// clang-format off
#define MXH_HALF(SCALE)                                                                                                \
    __asm__ volatile(                                                                                                  \
        "vpbroadcastd %k[cm], %%zmm28\n\t"                                                                             \
        "vpbroadcastd %k[ch], %%zmm29\n\t"                                                                             \
        MXH_ZERO(12) MXH_ZERO(13) MXH_ZERO(14) MXH_ZERO(15) MXH_ZERO(16) MXH_ZERO(17)                                  \
        MXH_ZERO(18) MXH_ZERO(19) MXH_ZERO(20) MXH_ZERO(21) MXH_ZERO(22) MXH_ZERO(23)                                  \
        "1:\n\t"                                                                                                       \
        MXH_INIT(0, 6) MXH_INIT(1, 7) MXH_INIT(2, 8) MXH_INIT(3, 9) MXH_INIT(4, 10) MXH_INIT(5, 11)                    \
        MXH_GROUP(0) MXH_GROUP(1) MXH_GROUP(2) MXH_GROUP(3)                                                            \
        MXH_GROUP(4) MXH_GROUP(5) MXH_GROUP(6) MXH_GROUP(7)                                                            \
        MXH_OFFSET(30, 0) MXH_OFFSET(31, 64)                                                                           \
        SCALE(0, 6, 12, 18) SCALE(1, 7, 13, 19) SCALE(2, 8, 14, 20)                                                    \
        SCALE(3, 9, 15, 21) SCALE(4, 10, 16, 22) SCALE(5, 11, 17, 23)                                                  \
        "add $384, %[a]\n\t"                                                                                           \
        "add $1024, %[w]\n\t"                                                                                          \
        "add $128, %[sd]\n\t"                                                                                          \
        "add $48, %[ea]\n\t"                                                                                           \
        "dec %[n]\n\t"                                                                                                 \
        "jnz 1b\n\t"                                                                                                   \
        MXH_STORE(12, 18, 0) MXH_STORE(13, 19, 1) MXH_STORE(14, 20, 2)                                                 \
        MXH_STORE(15, 21, 3) MXH_STORE(16, 22, 4) MXH_STORE(17, 23, 5)                                                 \
        : [a] "+r"(ak), [w] "+r"(w), [sd] "+r"(sd), [ea] "+r"(ea), [n] "+r"(blocks)                                    \
        : [acc] "r"(ah), [cm] "r"(kExpMask), [ch] "r"(kMantTop)                                                        \
        : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",     \
          "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",  \
          "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31")
// clang-format on

// Every block of a full 12-row tile, block of 32 (kb = 32), fast path; the float sums
// are written to acc (row r at acc + 32·r). FMA: the rescale as MXH_SCALE_FMA (ea: sf).
template <bool FMA>
void tile12_fast(const PackedMxA& a, const PackedMx& b, int64_t t, int64_t p, float* acc) {
  constexpr int T = kMxTileRows;
  const int nb = b.nb;
  if (nb == 0) return;
  const size_t pk = static_cast<size_t>(p) * nb;
  for (int h = 0; h < 2; ++h) {
    const int32_t* sd = b.initp() + pk * 32;
    const int8_t* w = b.i8p() + pk * 32 * 32;
    const uint8_t* ak = a.a.get() + static_cast<size_t>(t) * nb * 32 * T + 24 * h;
    const float* ea = (FMA ? a.sf.data() : a.ef.data()) + static_cast<size_t>(t) * nb * T + 6 * h;
    float* ah = acc + 6 * 32 * h;
    int64_t blocks = nb;
    if constexpr (FMA) {
      MXH_HALF(MXH_SCALE_FMA);
    } else {
      MXH_HALF(MXH_SCALE);
    }
  }
}

// The whole 12 x 32 tile in one asm loop (the "wide" form): 24 int32 block sums in
// zmm0-23 (row r: columns 0-15 in zmm r, 16-31 in zmm 12 + r), B in zmm24-25, A's
// broadcasts in zmm26-27, kExpMask / kMantTop in zmm28-29, the column offsets M_n in
// zmm30-31. Each 64-byte B load feeds 12 vpdpbusd (6 in the two halves above, which read
// the panel's B twice); the float sums of eq. (MX6) do not fit in registers beside the 24
// int32 sums and live in acc (L1): per row, 16 columns and block one load, a vsubps, an
// fma with A's power 2^(a − 133) (PackedMxA::sf, eq. (MQ1)) and a store. On cores
// whose vector ALUs take every 512-bit operation on the vpdpbusd ports, this is two of
// those per 16 outputs and block, beside 8 vpdpbusd; stores and loads take other ports.
// acc holds 0 on entry (0 + p = p: p is never −0).
// clang-format off
#define MXW_BCAST(bc, d, r, r2)                                  \
  "vpbroadcastd " #d "(%[a]), %%zmm" #bc "\n\t"                  \
  "vpdpbusd %%zmm24, %%zmm" #bc ", %%zmm" #r "\n\t"              \
  "vpdpbusd %%zmm25, %%zmm" #bc ", %%zmm" #r2 "\n\t"
#define MXW_GROUP(g)                                             \
  "vmovdqu64 " #g "*128(%[w]), %%zmm24\n\t"                      \
  "vmovdqu64 " #g "*128+64(%[w]), %%zmm25\n\t"                   \
  MXW_BCAST(26, g*48+0, 0, 12) MXW_BCAST(27, g*48+4, 1, 13)      \
  MXW_BCAST(26, g*48+8, 2, 14) MXW_BCAST(27, g*48+12, 3, 15)     \
  MXW_BCAST(26, g*48+16, 4, 16) MXW_BCAST(27, g*48+20, 5, 17)    \
  MXW_BCAST(26, g*48+24, 6, 18) MXW_BCAST(27, g*48+28, 7, 19)    \
  MXW_BCAST(26, g*48+32, 8, 20) MXW_BCAST(27, g*48+36, 9, 21)    \
  MXW_BCAST(26, g*48+40, 10, 22) MXW_BCAST(27, g*48+44, 11, 23)
#define MXW_SCALE(r, r2, t, t2)                                  \
  "vsubps %%zmm30, %%zmm" #r ", %%zmm" #r "\n\t"                 \
  "vsubps %%zmm31, %%zmm" #r2 ", %%zmm" #r2 "\n\t"               \
  "vmovaps " #r "*128(%[acc]), %%zmm" #t "\n\t"                  \
  "vmovaps " #r "*128+64(%[acc]), %%zmm" #t2 "\n\t"              \
  "vfmadd231ps " #r "*4(%[ea])%{1to16%}, %%zmm" #r ", %%zmm" #t "\n\t"    \
  "vfmadd231ps " #r "*4(%[ea])%{1to16%}, %%zmm" #r2 ", %%zmm" #t2 "\n\t"  \
  "vmovaps %%zmm" #t ", " #r "*128(%[acc])\n\t"                  \
  "vmovaps %%zmm" #t2 ", " #r "*128+64(%[acc])\n\t"
// clang-format on

void tile12_wide(const PackedMxA& a, const PackedMx& b, int64_t t, int64_t p, float* acc) {
  constexpr int T = kMxTileRows;
  const int nb = b.nb;
  for (int i = 0; i < T * 32; i += 16) _mm512_store_ps(acc + i, _mm512_setzero_ps());
  if (nb == 0) return;
  const size_t pk = static_cast<size_t>(p) * nb;
  const int32_t* sd = b.initp() + pk * 32;
  const int8_t* w = b.i8p() + pk * 32 * 32;
  const uint8_t* ak = a.a.get() + static_cast<size_t>(t) * nb * 32 * T;
  const float* ea = a.sf.data() + static_cast<size_t>(t) * nb * T;
  int64_t blocks = nb;
  // clang-format off
  __asm__ volatile(
      "vpbroadcastd %k[cm], %%zmm28\n\t"
      "vpbroadcastd %k[ch], %%zmm29\n\t"
      "1:\n\t"
      MXH_INIT(0, 12) MXH_INIT(1, 13) MXH_INIT(2, 14) MXH_INIT(3, 15) MXH_INIT(4, 16) MXH_INIT(5, 17)
      MXH_INIT(6, 18) MXH_INIT(7, 19) MXH_INIT(8, 20) MXH_INIT(9, 21) MXH_INIT(10, 22) MXH_INIT(11, 23)
      MXW_GROUP(0) MXW_GROUP(1) MXW_GROUP(2) MXW_GROUP(3)
      MXW_GROUP(4) MXW_GROUP(5) MXW_GROUP(6) MXW_GROUP(7)
      MXH_OFFSET(30, 0) MXH_OFFSET(31, 64)
      MXW_SCALE(0, 12, 24, 25) MXW_SCALE(1, 13, 26, 27) MXW_SCALE(2, 14, 24, 25)
      MXW_SCALE(3, 15, 26, 27) MXW_SCALE(4, 16, 24, 25) MXW_SCALE(5, 17, 26, 27)
      MXW_SCALE(6, 18, 24, 25) MXW_SCALE(7, 19, 26, 27) MXW_SCALE(8, 20, 24, 25)
      MXW_SCALE(9, 21, 26, 27) MXW_SCALE(10, 22, 24, 25) MXW_SCALE(11, 23, 26, 27)
      "add $384, %[a]\n\t"
      "add $1024, %[w]\n\t"
      "add $128, %[sd]\n\t"
      "add $48, %[ea]\n\t"
      "dec %[n]\n\t"
      "jnz 1b\n\t"
      : [a] "+r"(ak), [w] "+r"(w), [sd] "+r"(sd), [ea] "+r"(ea), [n] "+r"(blocks)
      : [acc] "r"(acc), [cm] "r"(kExpMask), [ch] "r"(kMantTop)
      : "cc", "memory", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "xmm18", "xmm19", "xmm20", "xmm21", "xmm22",
        "xmm23", "xmm24", "xmm25", "xmm26", "xmm27", "xmm28", "xmm29", "xmm30", "xmm31");
  // clang-format on
}

// One tile of MR <= kMxTileRows rows (the tiled A of PackedMxA) x 32 columns, blocks
// [k0, k1). Per block: the 2·MR int32 accumulators start at −128·Σ_block w (eq. (8)); per
// group of 4 k two 64-byte weight loads, one 4-byte broadcast per row, 2·MR vpdpbusd give
// the exact block dots D_k. The float accumulators of eq. (MX6) live in `acc` (L1): 2·MR
// int32 and 2·MR float registers do not fit in 32.
// `fast`: every scale product of the tile is a normal float32 and every |D_k · s_k| <
// 2^128 (the driver checks the code ranges): then s_k = 2^(a + b − 266) exactly, its
// float bits are an integer add of the codes, fl32(D_k) · s_k is exact, and the fused
// acc + fl32(D_k) · s_k rounds once, as the separate multiply and add of eq. (MX6) do.
// `offset`: fast, and the panel has offset sums (PackedMx::init, block of 32): the int32
// sums start from them and p_k is (float) − M, scaled by A's exponent (kExpMask above).
// Else the scales are read as floats and multiplied and added separately.
template <int MR>
void tile_t(const PackedMxA& a, const PackedMx& b, const float* bias, float* y, int64_t t, int64_t p, bool fast,
            bool offset) {
  constexpr int T = kMxTileRows;
  const int S = a.rs;  // A's rows a tile in the layout (MR <= S)
  const int nb = b.nb, kb = b.kb, G = kb / 4;
  const int64_t N = b.N, n0 = p * 32, m = t * T;
  const int valid = static_cast<int>(std::min<int64_t>(32, N - n0));
  const __mmask16 k0m = valid >= 16 ? 0xffff : static_cast<__mmask16>((1u << valid) - 1u);
  const __mmask16 k1m = valid >= 32 ? 0xffff : (valid <= 16 ? 0 : static_cast<__mmask16>((1u << (valid - 16)) - 1u));
  int k0 = 0;
  const int k1 = nb;
  alignas(64) float acc[MR][32];
  if (nb == 0) {
    for (int r = 0; r < MR; ++r) {
      _mm512_store_ps(acc[r], _mm512_setzero_ps());
      _mm512_store_ps(acc[r] + 16, _mm512_setzero_ps());
    }
  }
  // Up to 3 rows (GEMV-like calls, which stream B): the float sums stay in registers
  // across the blocks, not in acc: a 512-bit store takes a vpdpbusd slot, two a row and
  // block against 16 vpdpbusd. Larger tiles have no registers left for them.
  __m512 fr[MR <= 3 ? MR : 1][2];
  if constexpr (MR <= 3) {
    for (int r = 0; r < MR; ++r) {
      fr[r][0] = _mm512_setzero_ps();
      fr[r][1] = _mm512_setzero_ps();
    }
  }
  // acc_r += p (eq. (MX6)); the first block's sum is p itself
  auto add_block = [&](int r, int h, __m512 pv, int k) __attribute__((always_inline)) {
    if constexpr (MR <= 3) {
      fr[r][h] = k == 0 ? pv : _mm512_add_ps(fr[r][h], pv);
    } else {
      _mm512_store_ps(acc[r] + 16 * h, k == 0 ? pv : _mm512_add_ps(_mm512_load_ps(acc[r] + 16 * h), pv));
    }
  };
  if constexpr (MR == kMxTileRows) {
    if (offset && kb == 32) {
      switch (tile12_form(b)) {
        case Tile12::kWide: tile12_wide(a, b, t, p, &acc[0][0]); break;
        case Tile12::kHalvesFma: tile12_fast<true>(a, b, t, p, &acc[0][0]); break;
        default: tile12_fast<false>(a, b, t, p, &acc[0][0]); break;
      }
      k0 = k1;
    }
  }
  for (int k = k0; k < k1; ++k) {
    const size_t pk = static_cast<size_t>(p) * nb + k;
    const int32_t* ns = b.nsum.data() + pk * 32;
    __m512i c0, c1;
    if (offset) {
      c0 = _mm512_load_si512(b.initp() + pk * 32);
      c1 = _mm512_load_si512(b.initp() + pk * 32 + 16);
    } else {
      c0 = _mm512_slli_epi32(_mm512_loadu_si512(ns), 7);
      c1 = _mm512_slli_epi32(_mm512_loadu_si512(ns + 16), 7);
    }
    __m512i d[MR][2];
#pragma GCC unroll 12
    for (int r = 0; r < MR; ++r) {
      d[r][0] = c0;
      d[r][1] = c1;
    }
    const int8_t* w = b.i8p() + pk * kb * 32;
    const uint8_t* ak = a.a.get() + (static_cast<size_t>(t) * nb + k) * kb * S;
    if constexpr (MR <= 3) {
      // few rows: a second accumulator set (odd groups) hides vpdpbusd's latency; the
      // int32 sum of the two is exact
      __m512i e[MR][2];
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) e[r][0] = e[r][1] = _mm512_setzero_si512();
      int g = 0;
      for (; g + 2 <= G; g += 2) {
        // few rows stream B (a panel's blocks are contiguous, one stream): no software
        // prefetch, as qgemm's one- and two-row tiles; the loop is bound by its loads, a
        // prefetcht0 per line takes load slots and the hardware prefetchers follow the
        // stream (Zen 4, 1 thread, aligned B: 1 x 3072 x 768 116 -> 141 GOPS, 3 x 1024 x
        // 1024 216 -> 234 without the 8 KB-ahead prefetch; 1 x 4096 x 4096 unchanged)
        const __m512i b0 = _mm512_loadu_si512(w + g * 128), b1 = _mm512_loadu_si512(w + g * 128 + 64);
        const __m512i b2 = _mm512_loadu_si512(w + g * 128 + 128), b3 = _mm512_loadu_si512(w + g * 128 + 192);
#pragma GCC unroll 12
        for (int r = 0; r < MR; ++r) {
          int32_t a4, a5;
          __builtin_memcpy(&a4, ak + (g * S + r) * 4, 4);
          __builtin_memcpy(&a5, ak + ((g + 1) * S + r) * 4, 4);
          const __m512i av = _mm512_set1_epi32(a4), av1 = _mm512_set1_epi32(a5);
          QUANTA_MX_VPDPBUSD(d[r][0], av, b0);
          QUANTA_MX_VPDPBUSD(d[r][1], av, b1);
          QUANTA_MX_VPDPBUSD(e[r][0], av1, b2);
          QUANTA_MX_VPDPBUSD(e[r][1], av1, b3);
        }
      }
      for (; g < G; ++g) {
        const __m512i b0 = _mm512_loadu_si512(w + g * 128), b1 = _mm512_loadu_si512(w + g * 128 + 64);
#pragma GCC unroll 12
        for (int r = 0; r < MR; ++r) {
          int32_t a4;
          __builtin_memcpy(&a4, ak + (g * S + r) * 4, 4);
          const __m512i av = _mm512_set1_epi32(a4);
          QUANTA_MX_VPDPBUSD(d[r][0], av, b0);
          QUANTA_MX_VPDPBUSD(d[r][1], av, b1);
        }
      }
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        d[r][0] = _mm512_add_epi32(d[r][0], e[r][0]);
        d[r][1] = _mm512_add_epi32(d[r][1], e[r][1]);
      }
    } else {
      auto group = [&](int g) {
        const __m512i b0 = _mm512_loadu_si512(w + g * 128);
        const __m512i b1 = _mm512_loadu_si512(w + g * 128 + 64);
#pragma GCC unroll 12
        for (int r = 0; r < MR; ++r) {
          int32_t a4;
          __builtin_memcpy(&a4, ak + (g * S + r) * 4, 4);
          const __m512i av = _mm512_set1_epi32(a4);
          QUANTA_MX_VPDPBUSD(d[r][0], av, b0);
          QUANTA_MX_VPDPBUSD(d[r][1], av, b1);
        }
      };
      if (G == 8) {
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) group(g);
      } else {
        for (int g = 0; g < G; ++g) group(g);
      }
    }
    if (offset) {
      // the offset sums (kExpMask above): p = ((float) − M)·2^(a − 133), exact
      const __m512i em = _mm512_set1_epi32(kExpMask), mt = _mm512_set1_epi32(kMantTop);
      const __m512 off0 = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(c0, em, mt, 0xEA));
      const __m512 off1 = _mm512_castsi512_ps(_mm512_ternarylogic_epi32(c1, em, mt, 0xEA));
      const float* ea = a.ef.data() + (static_cast<size_t>(t) * nb + k) * S;
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        const __m512 er = _mm512_set1_ps(ea[r]);
        add_block(r, 0, _mm512_scalef_ps(_mm512_sub_ps(_mm512_castsi512_ps(d[r][0]), off0), er), k);
        add_block(r, 1, _mm512_scalef_ps(_mm512_sub_ps(_mm512_castsi512_ps(d[r][1]), off1), er), k);
      }
    } else if (fast) {
      // exponent e = fl32(B code) + fl32(A code − 266), p = fl32(D)·2^e
      // exact (vscalefps), acc + p rounded once
      const uint8_t* cb = b.cbp.data() + pk * 32;
      const __m512 e0 = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb))));
      const __m512 e1 =
          _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(cb + 16))));
      const float* ea = a.ef.data() + (static_cast<size_t>(t) * nb + k) * S;
#pragma GCC unroll 12
      for (int r = 0; r < MR; ++r) {
        const __m512 er = _mm512_set1_ps(ea[r] - 133.0f);
        add_block(r, 0, _mm512_scalef_ps(_mm512_cvtepi32_ps(d[r][0]), _mm512_add_ps(e0, er)), k);
        add_block(r, 1, _mm512_scalef_ps(_mm512_cvtepi32_ps(d[r][1]), _mm512_add_ps(e1, er)), k);
      }
    } else {
      const float* sk = b.sbp.data() + pk * 32;
      const __m512 sb0 = _mm512_loadu_ps(sk), sb1 = _mm512_loadu_ps(sk + 16);
      for (int r = 0; r < MR; ++r) {
        const __m512 s_a = _mm512_set1_ps(a.sa[(m + r) * nb + k]);
        add_block(r, 0, _mm512_mul_ps(_mm512_cvtepi32_ps(d[r][0]), _mm512_mul_ps(s_a, sb0)), k);
        add_block(r, 1, _mm512_mul_ps(_mm512_cvtepi32_ps(d[r][1]), _mm512_mul_ps(s_a, sb1)), k);
      }
    }
  }
  if constexpr (MR <= 3) {
    if (k1 > k0) {
      for (int r = 0; r < MR; ++r) {
        _mm512_store_ps(acc[r], fr[r][0]);
        _mm512_store_ps(acc[r] + 16, fr[r][1]);
      }
    }
  }
  __m512 bv0 = _mm512_setzero_ps(), bv1 = _mm512_setzero_ps();
  if (bias) {
    bv0 = _mm512_maskz_loadu_ps(k0m, bias + n0);
    bv1 = _mm512_maskz_loadu_ps(k1m, bias + n0 + 16);
  }
  for (int r = 0; r < MR; ++r) {
    __m512 v0 = _mm512_load_ps(acc[r]), v1 = _mm512_load_ps(acc[r] + 16);
    if (bias) {
      v0 = _mm512_add_ps(v0, bv0);
      v1 = _mm512_add_ps(v1, bv1);
    }
    _mm512_mask_storeu_ps(y + (m + r) * N + n0, k0m, v0);
    _mm512_mask_storeu_ps(y + (m + r) * N + n0 + 16, k1m, v1);
  }
}

}  // namespace

void gemm_i8_tiles_avx512vnni(const PackedMxA& a, const PackedMx& b, const float* bias, float* y, int64_t t0,
                              int64_t t1, int64_t p) {
  const int blo = b.cb_lo[p], bhi = b.cb_hi[p];
  // the panel's offset sums exist (its codes in [kMxInitLo, kMxInitHi], kExpMask above)
  const bool has_init = b.init.size() > 0 && blo >= kMxInitLo && bhi <= kMxInitHi;
  for (int64_t t = t0; t < t1; ++t) {
    const bool fast = tile_codes_fast(a.lo[t], a.hi[t], blo, bhi);
    const int64_t rows = std::min<int64_t>(kMxTileRows, a.M - t * kMxTileRows);
    const bool offset = fast && has_init;
    switch (rows) {
      case 12: tile_t<12>(a, b, bias, y, t, p, fast, offset); break;
      case 11: tile_t<11>(a, b, bias, y, t, p, fast, offset); break;
      case 10: tile_t<10>(a, b, bias, y, t, p, fast, offset); break;
      case 9: tile_t<9>(a, b, bias, y, t, p, fast, offset); break;
      case 8: tile_t<8>(a, b, bias, y, t, p, fast, offset); break;
      case 7: tile_t<7>(a, b, bias, y, t, p, fast, offset); break;
      case 6: tile_t<6>(a, b, bias, y, t, p, fast, offset); break;
      case 5: tile_t<5>(a, b, bias, y, t, p, fast, offset); break;
      case 4: tile_t<4>(a, b, bias, y, t, p, fast, offset); break;
      case 3: tile_t<3>(a, b, bias, y, t, p, fast, offset); break;
      case 2: tile_t<2>(a, b, bias, y, t, p, fast, offset); break;
      case 1: tile_t<1>(a, b, bias, y, t, p, fast, offset); break;
      default: break;
    }
  }
}

void pack_a_i8_avx512vnni(const uint8_t* a_bits, const uint8_t* a_codes, int64_t K, int block, PackedMxA& a, int64_t t0,
                          int64_t t1) {
  constexpr int T = kMxTileRows;
  const int S = a.rs;  // rows a tile holds in the layout
  const int nb = a.nb, kb = a.kb;
  const int64_t M = a.M;
  std::vector<uint8_t> zero(static_cast<size_t>(nb) * S);
  // fl32(2^(c − 133)) per code (subnormal below c = 7, exact); 255 is never read by the
  // fast tiles (the driver's code ranges exclude it)
  float pow2_133[256];
  for (int c = 0; c < 256; ++c) pow2_133[c] = pow2f(std::min(c, 254) - 133);
  // row r's 4 k of group g go to dword g·S + r of the block
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
  // blocks of 32 k whose 32 elements all exist: the fast copies below write every byte
  const int whole = kb == 32 && block == 32 ? static_cast<int>(K / 32) : 0;
  for (int64_t t = t0; t < t1; ++t) {
    std::fill(zero.begin(), zero.end(), 1);
    int lo = 255, hi = 0;
    uint8_t* tile = a.a.get() + static_cast<size_t>(t) * nb * kb * S;
    const int rows = static_cast<int>(std::min<int64_t>(T, M - t * T));
    // pad rows and pad k hold 128 (a zero element); a tile of whole blocks and rows is
    // written whole below
    if (rows < S || whole < nb) std::fill(tile, tile + static_cast<size_t>(nb) * kb * S, uint8_t{128});
    // the codes of row r, block k (the all-zero test `any` from its elements)
    auto meta = [&](int r, int k, bool any) __attribute__((always_inline)) {
      const int c = a_codes[(t * T + r) * nb + k];
      if (!any && c != 255) return;  // all zero: products +0 under any positive scale
      a.ef[(static_cast<size_t>(t) * nb + k) * S + r] = static_cast<float>(c - 133);
      a.sf[(static_cast<size_t>(t) * nb + k) * S + r] = pow2_133[c];
      zero[static_cast<size_t>(k) * S + r] = 0;
      lo = std::min(lo, c);
      hi = std::max(hi, c);
    };
    int r = 0;
    // four rows at a time: a 4 x 8 dword transpose per block (two 4 x 4 in the 128-bit
    // lanes), each group's 4 rows one 16-byte store, in place of 32 dword stores
    for (; r + 4 <= rows; r += 4) {
      const uint8_t* src = a_bits + (t * T + r) * K;
      for (int k = 0; k < whole; ++k) {
        __m256i v[4];
        for (int i = 0; i < 4; ++i) {
          v[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i * K + k * 32));
          meta(r + i, k, !_mm256_testz_si256(v[i], v[i]));
          v[i] = _mm256_xor_si256(v[i], flip);
        }
        const __m256i p0 = _mm256_unpacklo_epi32(v[0], v[1]), p1 = _mm256_unpackhi_epi32(v[0], v[1]);
        const __m256i p2 = _mm256_unpacklo_epi32(v[2], v[3]), p3 = _mm256_unpackhi_epi32(v[2], v[3]);
        // per 128-bit lane h: groups 4h, 4h + 1, 4h + 2, 4h + 3, rows r .. r + 3 each
        const __m256i g0 = _mm256_unpacklo_epi64(p0, p2), g1 = _mm256_unpackhi_epi64(p0, p2);
        const __m256i g2 = _mm256_unpacklo_epi64(p1, p3), g3 = _mm256_unpackhi_epi64(p1, p3);
        uint8_t* dst = tile + static_cast<size_t>(k) * 32 * S + r * 4;
        const __m256i g[4] = {g0, g1, g2, g3};
        for (int i = 0; i < 4; ++i) {
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * S * 4), _mm256_castsi256_si128(g[i]));
          _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (i + 4) * S * 4), _mm256_extracti128_si256(g[i], 1));
        }
      }
    }
    for (; r < rows; ++r) {  // the rows left over, blocks of 32: eight dword stores
      const uint8_t* src = a_bits + (t * T + r) * K;
      for (int k = 0; k < whole; ++k) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + k * 32));
        meta(r, k, !_mm256_testz_si256(v, v));
        alignas(32) uint32_t f[8];
        _mm256_store_si256(reinterpret_cast<__m256i*>(f), _mm256_xor_si256(v, flip));
        uint32_t* d32 = reinterpret_cast<uint32_t*>(tile + static_cast<size_t>(k) * 32 * S) + r;
        for (int g = 0; g < 8; ++g) d32[g * S] = f[g];
      }
    }
    for (r = 0; r < rows; ++r) {  // blocks of other sizes, and a short last block
      const uint8_t* src = a_bits + (t * T + r) * K;
      for (int k = whole; k < nb; ++k) {
        uint8_t* dst = tile + static_cast<size_t>(k) * kb * S;
        const int64_t i0 = static_cast<int64_t>(k) * block;
        const int len = static_cast<int>(std::min<int64_t>(block, K - i0));
        bool any = false;
        for (int i = 0; i < len; ++i) {
          dst[((i / 4) * S + r) * 4 + i % 4] = static_cast<uint8_t>(src[i0 + i] ^ 0x80);
          any = any || src[i0 + i] != 0;
        }
        meta(r, k, any);
      }
    }
    // all-zero blocks and pad rows take the tile's smallest code (as B's zero columns)
    if (lo > hi) lo = hi = 127;
    a.lo[t] = lo;
    a.hi[t] = hi;
    for (size_t i = 0; i < zero.size(); ++i)
      if (zero[i]) {
        a.ef[static_cast<size_t>(t) * nb * S + i] = static_cast<float>(lo - 133);
        a.sf[static_cast<size_t>(t) * nb * S + i] = pow2_133[lo];
      }
  }
}

void gemm_f64_avx512vnni(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b, const float* bias,
                         float* y, int64_t m0, int64_t m1) {
  gemm_f64_generic(ad, abad, sa, b, bias, y, m0, m1);
}

namespace {

// Sixteen whole blocks of 32 (x: 512 floats, bits: 512 bytes, codes: 16): the arithmetic of
// the per-block loop below, with the block maxima and the factors computed 16 at a time.
// Each block's two |x| vectors fold to one by an unsigned max of their bits (for finite
// values the integer order is the float order; NaN and Inf lie above every finite value),
// then four rounds of lane shuffles and maxima reduce the 16 vectors to one vector of the
// 16 block maxima (lane 4c + j holds block c, 8 + c, 4 + c, 12 + c for j = 0, 1, 2, 3;
// one permute puts them in block order). The code of eq. (MX3) is the maximum's biased
// exponent field, eq. (M16a) of docs/quantization-math.md: 0 for a zero or subnormal
// maximum, 255 (the NaN code) for a block with NaN / Inf (bits >= 0x7f800000). The factors 2^h, 2^(−e−h) with h = −trunc(e/2) as in
// the loop below; the elements then run through the same multiplications, conversion and
// clamp, block by block.
inline void quantize16_b32(const float* x, uint8_t* bits, uint8_t* codes) {
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  __m512i m[16];
  for (int j = 0; j < 16; ++j) {
    const __m512i v0 = _mm512_and_si512(_mm512_loadu_si512(x + 32 * j), absmask);
    const __m512i v1 = _mm512_and_si512(_mm512_loadu_si512(x + 32 * j + 16), absmask);
    m[j] = _mm512_max_epu32(v0, v1);
  }
  // 16 -> 8: 128-bit chunks [max(a.q0, a.q2), max(a.q1, a.q3), the same of b]
  for (int i = 0; i < 8; ++i)
    m[i] = _mm512_max_epu32(_mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0x44),
                            _mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0xEE));
  // 8 -> 4: chunk c of m[i] holds four lanes of block 4i + c
  for (int i = 0; i < 4; ++i)
    m[i] = _mm512_max_epu32(_mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0x88),
                            _mm512_shuffle_i32x4(m[2 * i], m[2 * i + 1], 0xDD));
  // 4 -> 2: in chunk c, lanes 0 and 2 of block 8i + c, lanes 1 and 3 of block 8i + 4 + c
  for (int i = 0; i < 2; ++i)
    m[i] =
        _mm512_max_epu32(_mm512_unpacklo_epi32(m[2 * i], m[2 * i + 1]), _mm512_unpackhi_epi32(m[2 * i], m[2 * i + 1]));
  // 2 -> 1: lane 4c + j holds block c, 8 + c, 4 + c, 12 + c (j = 0 .. 3)
  const __m512i r = _mm512_max_epu32(_mm512_unpacklo_epi32(m[0], m[1]), _mm512_unpackhi_epi32(m[0], m[1]));
  const __m512i am =
      _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 2, 6, 10, 14, 1, 5, 9, 13, 3, 7, 11, 15), r);
  const __mmask16 bad = _mm512_cmpge_epu32_mask(am, _mm512_set1_epi32(0x7f800000));
  const __m512i code = _mm512_srli_epi32(am, 23);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(codes), _mm512_cvtepi32_epi8(code));
  // e = code − 127; t = trunc(e / 2) = (e + (e < 0)) >> 1; h = −t
  const __m512i e = _mm512_sub_epi32(code, _mm512_set1_epi32(127));
  const __m512i t = _mm512_srai_epi32(_mm512_add_epi32(e, _mm512_srli_epi32(e, 31)), 1);
  alignas(64) float f1[16], f2[16];
  _mm512_store_si512(f1, _mm512_slli_epi32(_mm512_sub_epi32(_mm512_set1_epi32(127), t), 23));
  _mm512_store_si512(f2, _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(_mm512_set1_epi32(127), e), t), 23));
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512 s64 = _mm512_set1_ps(64.0f);
  for (int j = 0; j < 16; ++j) {
    uint8_t* bj = bits + 32 * j;
    if (bad >> j & 1) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(bj), _mm256_setzero_si256());
      continue;
    }
    const __m512 g1 = _mm512_set1_ps(f1[j]), g2 = _mm512_set1_ps(f2[j]);
    for (int u = 0; u < 2; ++u) {
      const __m512 v = _mm512_loadu_ps(x + 32 * j + 16 * u);
      const __m512 q = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(v, g1), g2), s64);
      __m512i qi = _mm512_cvt_roundps_epi32(q, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      qi = _mm512_min_epi32(_mm512_max_epi32(qi, lo), hi);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(bj + 16 * u), _mm512_cvtepi32_epi8(qi));
    }
  }
}

}  // namespace

void quantize_i8_avx512vnni(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K,
                            int block) {
  const int64_t nb = (K + block - 1) / block;
  // runs of 16 whole blocks of 32 go through quantize16_b32, the rest block by block
  const int64_t k16 = block == 32 ? K / 512 * 16 : 0;
  const __m512i absmask = _mm512_set1_epi32(0x7fffffff);
  const __m512i expmask = _mm512_set1_epi32(0x7f800000);
  const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
  const __m512 s64 = _mm512_set1_ps(64.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * K;
    uint8_t* br = bits + r * K;
    for (int64_t k = 0; k < k16; k += 16) quantize16_b32(xr + k * 32, br + k * 32, codes + r * nb + k);
    for (int64_t k = k16; k < nb; ++k) {
      const int64_t i0 = k * block, i1 = std::min<int64_t>(K, i0 + block);
      __m512i amax = _mm512_setzero_si512();  // |x| bits: integer max = float max for finite
      __mmask16 bad = 0;
      for (int64_t i = i0; i < i1; i += 16) {
        const int n = static_cast<int>(std::min<int64_t>(16, i1 - i));
        const __mmask16 mk = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1u);
        const __m512i v = _mm512_and_si512(_mm512_maskz_loadu_epi32(mk, xr + i), absmask);
        bad |= _mm512_mask_cmpeq_epi32_mask(mk, _mm512_and_si512(v, expmask), expmask);
        amax = _mm512_max_epu32(amax, v);
      }
      if (bad) {
        codes[r * nb + k] = 255;
        std::fill(br + i0, br + i1, 0);
        continue;
      }
      const uint32_t ab = static_cast<uint32_t>(_mm512_reduce_max_epu32(amax));
      float af;
      __builtin_memcpy(&af, &ab, 4);
      const int e = shared_exponent(af, 0);
      codes[r * nb + k] = static_cast<uint8_t>(e + 127);
      // 2^h and 2^(−e−h), |h| <= 64: normal floats, built from their exponent bits (a
      // libm ldexp per factor was a third of the quantizer's time)
      const int h = -e / 2;
      const __m512 f1 = _mm512_castsi512_ps(_mm512_set1_epi32((h + 127) << 23));
      const __m512 f2 = _mm512_castsi512_ps(_mm512_set1_epi32((-e - h + 127) << 23));
      for (int64_t i = i0; i < i1; i += 16) {
        const int n = static_cast<int>(std::min<int64_t>(16, i1 - i));
        const __mmask16 mk = n >= 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1u);
        const __m512 v = _mm512_maskz_loadu_ps(mk, xr + i);
        const __m512 t = _mm512_mul_ps(_mm512_mul_ps(_mm512_mul_ps(v, f1), f2), s64);
        __m512i q = _mm512_cvt_roundps_epi32(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        q = _mm512_min_epi32(_mm512_max_epi32(q, lo), hi);
        _mm_mask_storeu_epi8(br + i, mk, _mm512_cvtepi32_epi8(q));
      }
    }
  }
}

}  // namespace mx
}  // namespace quanta
