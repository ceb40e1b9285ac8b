// mx: OCP Microscaling kernels: run-time QuantizeMX and MX GEMM (MXINT8, MXFP8 E4M3,
// MXFP6, MXFP4 operands).
//
// Contract: docs/quantization-math.md section 11; the NumPy twin is
// quanta/kernels/reference/mx.py (quantize_mx, mx_gemm), bit-exact for every ISA.
//
//   quantize:  x [R, K] float32, blocks of `block` consecutive elements along K;
//              e = clamp(floor(log2 amax) − emax, −127, 127)          eq. (MX3)
//              P = sat(rne_elem(x / 2^e))                             eq. (MX4)
//              all-zero block: code 0; a NaN/Inf in a block: code 255 and zero elements.
//   gemm:      Y [M, N] = A [M, K] · B [K, N], A's blocks along K per row, B's along K
//              per column; D_k exact (int32 for INT8 x INT8, float64 otherwise: every
//              product and partial sum is an integer below 2^53), then
//              s_k = fl32(fl32(2^(a−f_A)) · fl32(2^(b−f_B)))            eq. (MX5b)
//              p_k = fl32(fl32(D_k) · s_k)                             eq. (MX5c)
//              y = p_0, y = fl32(y + p_k) for k = 1.. in order, then fl32(y + bias)  eq. (MX6)
//              (-ffp-contract=off: the compiler fuses nothing; the avx512vnni tile uses an
//              explicit fma only where fl32(D_k) · s_k is exact, which equals eq. (MX6)).
//
// Element formats (Elem): INT8 (q, value q·2^-6), FP8 E4M3, FP6 E3M2, FP6 E2M3, FP4 E2M1,
// FP8 E5M2 (quantize only: E5M2 x E5M2 block dots exceed float64's exact range).
// Elements cross the boundary as their bit patterns (uint8), scales as E8M0 codes (uint8).
//
// Layering: bindings_mx.cc (checks) -> mx.cc (packing, threads, dispatch) -> the ISA
// files: mx_avx512vnni.cc (the INT8 vpdpbusd tiles, the vectorized INT8 quantize),
// mx_avx2.cc (the INT8 vpmaddwd tile, the vectorized INT8 quantize; the float-element
// GEMM as mx_portable.cc) and mx_portable.cc
// (the generic code of mx_impl.h, compiled per ISA).
// Threads: column panels (or rows) are split between threads; every output is computed
// by the same instructions on any thread, so results do not depend on num_threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dispatch.h"
#include "qgemm/qgemm.h"

namespace quanta {
namespace mx {

enum class Elem : int { kInt8 = 0, kE4M3 = 1, kE5M2 = 2, kE3M2 = 3, kE2M3 = 4, kE2M1 = 5 };

struct ElemInfo {
  int ebits, mbits, bias, emax, emin, frac_bits;
  double max_norm;
};
ElemInfo elem_info(Elem e);
Elem parse_elem(const std::string& name);  // f8e4m3fn, i8, mxfp8_e4m3, ...; throws invalid_argument
const char* elem_name(Elem e);

// decode(P) · 2^frac_bits (an integer, as a double); NaN/Inf patterns give 0.
double element_integer(Elem e, uint8_t bits);
bool element_is_special(Elem e, uint8_t bits);  // NaN or Inf
// The element nearest to y (|y| < 2^(emax+1) or saturating), rne, as its bit pattern.
uint8_t encode_element(Elem e, float y);

// x [rows, K] -> bits [rows, K], codes [rows, nb].
void quantize(const float* x, uint8_t* bits, uint8_t* codes, int64_t rows, int64_t K, int block, Elem e, Isa isa,
              int num_threads);

// Weights B [K, N] packed once. INT8: panels of 32 columns, per block ceil(block/4) groups
// of 4 k (zero padded), bytes [panel][block][group][32][4]. INT8 packed for avx2: half panels of
// 16 columns, per block kb/2 pairs of k, bytes [half panel][block][pair][16][2] (the
// vpmaddwd tile of mx_avx2.cc, eq. (MA1)). Other formats: n as double, [block][kb][Np].
struct PackedMx {
  int64_t K = 0, N = 0, Np = 0;
  int block = 32, nb = 0, kb = 0;
  Elem elem = Elem::kInt8;
  Isa isa = Isa::kPortable;
  // 64-byte aligned: the tiles load whole 64-byte lines of it (a std::vector's buffer sits
  // 16 bytes past a line, and every 64-byte load would then touch two lines)
  qgemm::AlignedBuffer i8;
  const int8_t* i8p() const { return reinterpret_cast<const int8_t*>(i8.data()); }
  // INT8 on portable only (the generic loop's u8 shift, eq. (8)): 128·Σ_block b,
  // [panel][block][32]; empty on avx2 (signed int16 products: no shift) and avx512vnni
  // (nsum, init)
  std::vector<int32_t> comp;
  std::vector<double> f64;
  std::vector<float> sb;  // [nb][Np] fl32(2^(e − f_B)); NaN for code 255
  // INT8: the scales panel-major, [panel][block][32]: the tiles read them with
  // a unit stride (a [block][Np] layout put every block's line in one L1 set at N = 1024)
  std::vector<float> sbp;
  std::vector<uint8_t> bad;  // [nb][Np] a NaN/Inf element in the block
  // INT8 on avx512vnni only (mx_avx512vnni.cc): −Σ_block b as int32 (the tile shifts it
  // by 7: −128·Σ, eq. (8); |Σ| reaches 128·block, past int16 from block 256), the E8M0
  // codes, [panel][block][32]; per panel the smallest
  // and largest code of the blocks that are not all zero (255 with a NaN scale; 127 when
  // every block is zero). An all-zero block column carries the panel's smallest code: its
  // products are +0 under any positive scale.
  std::vector<int32_t> nsum;
  std::vector<uint8_t> cbp;
  std::vector<int> cb_lo, cb_hi;
  // INT8 on avx512vnni, panels whose codes cbp all lie in [kMxInitLo, kMxInitHi]: the
  // tile's starting int32 block sums bits(M) − 128·Σ_block w with M = 1.5·2^(c − 110),
  // [panel][block][32] (mx_avx512vnni.cc, "offset sums"); empty on other ISAs
  qgemm::AlignedBuffer init;  // int32, 64-byte aligned
  const int32_t* initp() const { return reinterpret_cast<const int32_t*>(init.data()); }
};
constexpr int kMxInitLo = 7, kMxInitHi = 237;

// A [M, K] INT8 for the avx512vnni tile: rows in tiles of kMxTileRows, per tile and block
// the kb/4 groups of 4 k of every row interleaved, x + 128 as u8 ([tile][block][group]
// [row][4], pad rows and pad k: 128, a zero element); per tile and block and row the
// exponent code − 133 as a float (ef); per tile
// the smallest / largest code of its blocks that are not all zero (all-zero blocks and
// pad rows carry the smallest).
constexpr int kMxTileRows = 12;
struct PackedMxA {
  int64_t M = 0, tiles = 0;
  int nb = 0, kb = 0;
  // Rows a tile holds in the layout: kMxTileRows, or M when M is smaller (a GEMV's one
  // row then streams 32 bytes of A a block, not a 12-row tile's 384, beside each panel)
  int rs = kMxTileRows;
  // uninitialized when allocated: the packer writes every byte (pads: 128)
  std::unique_ptr<uint8_t[]> a;
  // per tile, block and row: fl32(code − 133), the exponent of A's factor of eq. (MX5b)'s
  // scale, 2^(code − 127 − f_A)
  std::vector<float> ef;
  // the same positions as ef: fl32(2^(code − 133)) (the fma forms of the 12-row tile)
  std::vector<float> sf;
  std::vector<int> lo, hi;
  // [M][nb] fl32(2^(code − 133)), NaN for 255: read only by tiles off tile_codes_fast,
  // and built only when some tile and panel are
  const float* sa = nullptr;
};

// The rescale form of the avx512vnni 12-row fast tile (mx_avx512vnni.cc); every form gives
// the same bits. kHalvesScalef: two 6-row halves, the float sums in registers, vsubps +
// vscalefps + vaddps per 16 outputs and block; kHalvesFma: the same with vsubps + fma;
// kWide: one 12-row pass (each B load feeds 12 rows), the float sums in L1, vsubps + fma.
enum class Tile12 : int { kHalvesScalef = 0, kHalvesFma = 1, kWide = 2 };
// The form for B: set_tile12's, else by the CPU. On Intel cores (every 512-bit vector
// operation takes a vpdpbusd port, so the fma forms' two operations per 16 outputs and
// block beat three) kHalvesFma while B's packed bytes fit kMxWideBytes, kWide past that
// (it reads B once per tile, the halves twice); elsewhere kHalvesScalef (vsubps,
// vscalefps and vaddps run beside vpdpbusd, an fma or a 512-bit store takes its slot).
Tile12 tile12_form(const PackedMx& b);
// 1.5 MiB, three quarters of the 2 MiB L2 of the Xeon it was measured on: 1024 x 1024
// B (1.1 MB) ran faster as halves, 768 x 3072 (2.6 MB) as wide
constexpr size_t kMxWideBytes = size_t{3} << 19;
// "halves_scalef" / "halves_fma" / "wide", or "" for the CPU's default (tests and
// benchmarks compare the forms); throws std::invalid_argument otherwise.
void set_tile12(const std::string& name);
// The forced form's name, or "auto"
const char* tile12_forced();
const char* tile12_name(Tile12 f);

PackedMx pack(const uint8_t* bits, const uint8_t* codes, int64_t K, int64_t N, int block, Elem e, Isa isa);

// y [M, N] = A · B (+ bias[N] when not null).
void gemm(const uint8_t* a_bits, const uint8_t* a_codes, Elem a_elem, int64_t M, const PackedMx& b, const float* bias,
          float* y, int num_threads);

// fl32(2^e) for an unbiased e (128: NaN).
float pow2f(int e);

// ---- ISA entry points (one file each) --------------------------------------------------
// INT8 x INT8 rows [m0, m1) x panels [p0, p1) x blocks [k0, k1); au: A + 128 as u8
// [M][nb·kb]; sa: [M][nb]. With k0 > 0 the float accumulators start from y (the chunk
// before wrote them there); with k1 = nb the bias is added and y is final.
void gemm_i8_portable(const uint8_t* au, const float* sa, const PackedMx& b, const float* bias, float* y, int64_t M,
                      int64_t m0, int64_t m1, int64_t p0, int64_t p1, int k0, int k1);
// The same rows / panels / blocks on B packed for avx2 (PackedMx INT8 avx2 layout); a16: A
// as int16 [M][nb·kb], each block zero padded to kb.
void gemm_i8_avx2(const int16_t* a16, const float* sa, const PackedMx& b, const float* bias, float* y, int64_t M,
                  int64_t m0, int64_t m1, int64_t p0, int64_t p1, int k0, int k1);
// The avx512vnni tile's fast test on a tile's A codes [a_lo, a_hi] and a panel's B codes
// [b_lo, b_hi] (all-zero blocks excluded): eq. (MX5b) by code arithmetic needs
// 2^(ca + cb − 266) normal (ca + cb >= 140) and |fl32(D_k)| · s_k < 2^128 with |D_k| <
// 2^31 (ca + cb <= 362), and no NaN scale (255). Off it the tile reads A's scales as
// floats (PackedMxA::sa).
inline bool tile_codes_fast(int a_lo, int a_hi, int b_lo, int b_hi) {
  return a_hi <= 254 && b_hi <= 254 && a_lo + b_lo >= 140 && a_hi + b_hi <= 362;
}
// Tiles [t0, t1) of a (sized by the caller: a, ef zeroed or not, lo / hi) from A's bits
// [M, K] and codes [M, nb].
void pack_a_i8_avx512vnni(const uint8_t* a_bits, const uint8_t* a_codes, int64_t K, int block, PackedMxA& a, int64_t t0,
                          int64_t t1);
// Row tiles [t0, t1) x panel p on the tiled A, every block of K in one pass; the bias is
// added and y written.
void gemm_i8_tiles_avx512vnni(const PackedMxA& a, const PackedMx& b, const float* bias, float* y, int64_t t0,
                              int64_t t1, int64_t p);
// Float-element GEMM rows [m0, m1): ad: A's n as double [M][nb·kb]; abad [M][nb].
void gemm_f64_portable(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b, const float* bias,
                       float* y, int64_t m0, int64_t m1);
void gemm_f64_avx2(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b, const float* bias,
                   float* y, int64_t m0, int64_t m1);
void gemm_f64_avx512vnni(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b, const float* bias,
                         float* y, int64_t m0, int64_t m1);
// Quantize rows [r0, r1) of INT8 elements.
void quantize_i8_portable(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K, int block);
void quantize_i8_avx2(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K, int block);
void quantize_i8_avx512vnni(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K,
                            int block);

}  // namespace mx
}  // namespace quanta
