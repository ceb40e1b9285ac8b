// MX driver (mx.h): element formats, packing, dispatch and threads.
#include "mx/mx.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <stdexcept>

#include "mx/mx_impl.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace mx {

ElemInfo elem_info(Elem e) {
  // ebits, mbits, bias, emax, emin, frac_bits (eq. (MX2)), max_norm
  switch (e) {
    case Elem::kInt8: return {0, 6, 0, 0, 0, 6, 127.0 / 64.0};
    case Elem::kE4M3: return {4, 3, 7, 8, -6, 9, 448.0};
    case Elem::kE5M2: return {5, 2, 15, 15, -14, 16, 57344.0};
    case Elem::kE3M2: return {3, 2, 3, 4, -2, 4, 28.0};
    case Elem::kE2M3: return {2, 3, 1, 2, 0, 3, 7.5};
    case Elem::kE2M1: return {2, 1, 1, 2, 0, 1, 6.0};
  }
  throw std::invalid_argument("unknown MX element");
}

Elem parse_elem(const std::string& n) {
  if (n == "i8" || n == "mxint8") return Elem::kInt8;
  if (n == "f8e4m3fn" || n == "mxfp8_e4m3") return Elem::kE4M3;
  if (n == "f8e5m2" || n == "mxfp8_e5m2") return Elem::kE5M2;
  if (n == "f6e3m2fn" || n == "mxfp6_e3m2") return Elem::kE3M2;
  if (n == "f6e2m3fn" || n == "mxfp6_e2m3") return Elem::kE2M3;
  if (n == "f4e2m1fn" || n == "mxfp4") return Elem::kE2M1;
  throw std::invalid_argument("unknown MX element format '" + n +
                              "': expected one of i8, f8e4m3fn, f8e5m2, f6e3m2fn, f6e2m3fn, f4e2m1fn");
}

const char* elem_name(Elem e) {
  switch (e) {
    case Elem::kInt8: return "i8";
    case Elem::kE4M3: return "f8e4m3fn";
    case Elem::kE5M2: return "f8e5m2";
    case Elem::kE3M2: return "f6e3m2fn";
    case Elem::kE2M3: return "f6e2m3fn";
    case Elem::kE2M1: return "f4e2m1fn";
  }
  return "?";
}

float pow2f(int e) {
  if (e == 128) return std::nanf("");
  return static_cast<float>(std::ldexp(1.0, std::max(-300, std::min(300, e))));
}

bool element_is_special(Elem e, uint8_t bits) {
  if (e == Elem::kE4M3) return (bits & 0x7f) == 0x7f;
  if (e == Elem::kE5M2) return (bits & 0x7c) == 0x7c;
  return false;
}

double element_integer(Elem e, uint8_t bits) {
  if (e == Elem::kInt8) return static_cast<double>(static_cast<int8_t>(bits));
  if (element_is_special(e, bits)) return 0.0;
  const ElemInfo f = elem_info(e);
  const int width = 1 + f.ebits + f.mbits;
  const bool neg = (bits >> (width - 1)) & 1;
  const int ef = (bits >> f.mbits) & ((1 << f.ebits) - 1);
  const int mf = bits & ((1 << f.mbits) - 1);
  // value = m · 2^(E − mbits) with E = emin for subnormals; times 2^frac_bits
  const int E = ef == 0 ? f.emin : ef - f.bias;
  const int m = ef == 0 ? mf : (mf | (1 << f.mbits));
  const double v = std::ldexp(static_cast<double>(m), E - f.mbits + f.frac_bits);
  return neg ? -v : v;
}

uint8_t encode_element(Elem e, float y) {
  const ElemInfo f = elem_info(e);
  const bool neg = std::signbit(y);
  double a = std::fabs(static_cast<double>(y));
  int code;
  if (e == Elem::kInt8) {
    double q = std::nearbyint(static_cast<double>(y) * 64.0);
    q = std::max(-127.0, std::min(127.0, q));
    return static_cast<uint8_t>(static_cast<int8_t>(q));
  }
  if (a == 0.0) {
    code = 0;
  } else {
    int ex;
    std::frexp(a, &ex);
    int E = std::max(ex - 1, f.emin);
    double q = std::nearbyint(std::ldexp(a, f.mbits - E));  // rne on the element grid
    double v = std::ldexp(q, E - f.mbits);
    if (v > f.max_norm) v = f.max_norm;
    if (v == 0.0) {
      code = 0;
    } else {
      std::frexp(v, &ex);
      E = ex - 1;
      if (E < f.emin) {
        code = static_cast<int>(std::ldexp(v, f.mbits - f.emin));  // subnormal mantissa
      } else {
        const int m = static_cast<int>(std::ldexp(v, f.mbits - E)) - (1 << f.mbits);
        code = ((E + f.bias) << f.mbits) | m;
      }
    }
  }
  const int width = 1 + f.ebits + f.mbits;
  return static_cast<uint8_t>(code | (neg ? 1 << (width - 1) : 0));
}

namespace {

int g_tile12 = -1;  // -1: the CPU's default

}  // namespace

Tile12 tile12_form(const PackedMx& b) {
  if (g_tile12 >= 0) return static_cast<Tile12>(g_tile12);
  if (!cpu_vendor_intel()) return Tile12::kHalvesScalef;
  return b.i8.size() + b.init.size() > kMxWideBytes ? Tile12::kWide : Tile12::kHalvesFma;
}

const char* tile12_forced() { return g_tile12 >= 0 ? tile12_name(static_cast<Tile12>(g_tile12)) : "auto"; }

const char* tile12_name(Tile12 f) {
  switch (f) {
    case Tile12::kHalvesScalef: return "halves_scalef";
    case Tile12::kHalvesFma: return "halves_fma";
    case Tile12::kWide: return "wide";
  }
  return "?";
}

void set_tile12(const std::string& name) {
  if (name.empty()) {
    g_tile12 = -1;
    return;
  }
  for (int f = 0; f < 3; ++f)
    if (name == tile12_name(static_cast<Tile12>(f))) {
      g_tile12 = f;
      return;
    }
  throw std::invalid_argument("mx tile12 form '" + name + "': expected one of halves_scalef, halves_fma, wide");
}

namespace {

void quantize_rows_any(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K, int block,
                       Elem e) {
  const ElemInfo f = elem_info(e);
  const int64_t nb = (K + block - 1) / block;
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t i0 = k * block, i1 = std::min<int64_t>(K, i0 + block);
      float amax = 0.0f;
      bool bad = false;
      for (int64_t i = i0; i < i1; ++i) {
        const float a = std::fabs(x[r * K + i]);
        if (!std::isfinite(a))
          bad = true;
        else
          amax = std::max(amax, a);
      }
      if (bad) {
        codes[r * nb + k] = 255;
        for (int64_t i = i0; i < i1; ++i) bits[r * K + i] = 0;
        continue;
      }
      const int se = shared_exponent(amax, f.emax);
      codes[r * nb + k] = static_cast<uint8_t>(se + 127);
      for (int64_t i = i0; i < i1; ++i) bits[r * K + i] = encode_element(e, scale_down(x[r * K + i], se));
    }
  }
}

}  // namespace

void quantize(const float* x, uint8_t* bits, uint8_t* codes, int64_t rows, int64_t K, int block, Elem e, Isa isa,
              int num_threads) {
  const int64_t grain = std::max<int64_t>(1, 16384 / std::max<int64_t>(K, 1));
  qgemm::parallel_ranges(num_threads, rows, grain, [&](int64_t r0, int64_t r1) {
    if (e != Elem::kInt8) {
      quantize_rows_any(x, bits, codes, r0, r1, K, block, e);
    } else if (isa == Isa::kAvx512Vnni) {
      quantize_i8_avx512vnni(x, bits, codes, r0, r1, K, block);
    } else if (isa == Isa::kAvx2) {
      quantize_i8_avx2(x, bits, codes, r0, r1, K, block);
    } else {
      quantize_i8_portable(x, bits, codes, r0, r1, K, block);
    }
  });
}

PackedMx pack(const uint8_t* bits, const uint8_t* codes, int64_t K, int64_t N, int block, Elem e, Isa isa) {
  PackedMx b;
  b.K = K;
  b.N = N;
  b.Np = (N + 31) / 32 * 32;
  b.block = block;
  b.nb = static_cast<int>((K + block - 1) / block);
  b.kb = (block + 3) / 4 * 4;
  b.elem = e;
  b.isa = isa;
  const ElemInfo f = elem_info(e);
  b.sb.assign(static_cast<size_t>(b.nb) * b.Np, 1.0f);
  b.bad.assign(static_cast<size_t>(b.nb) * b.Np, 0);
  for (int k = 0; k < b.nb; ++k)
    for (int64_t n = 0; n < N; ++n) {
      const int c = codes[k * N + n];
      b.sb[static_cast<size_t>(k) * b.Np + n] = c == 255 ? std::nanf("") : pow2f(c - 127 - f.frac_bits);
    }
  const int64_t panels = b.Np / 32;
  if (e == Elem::kInt8) {
    b.i8.resize(static_cast<size_t>(panels) * b.nb * b.kb * 32);
    b.sbp.assign(static_cast<size_t>(b.nb) * b.Np, 1.0f);
    for (int64_t p = 0; p < panels; ++p)
      for (int k = 0; k < b.nb; ++k)
        for (int j = 0; j < 32; ++j)
          b.sbp[(static_cast<size_t>(p) * b.nb + k) * 32 + j] = b.sb[static_cast<size_t>(k) * b.Np + p * 32 + j];
    // Σ_block b per column, [panel][block][32]: the portable loop reads it as comp = 128·Σ
    // (eq. (8)), the avx512vnni tiles as nsum = −Σ; the avx2 tile multiplies signed int16
    // and reads neither
    const bool sums = isa != Isa::kAvx2;
    std::vector<int32_t> colsum(sums ? static_cast<size_t>(b.nb) * b.Np : 0, 0);
    for (int64_t p = 0; p < panels; ++p)
      for (int k = 0; k < b.nb; ++k)
        for (int i = 0; i < b.kb; ++i) {
          const int64_t kk = static_cast<int64_t>(k) * block + i;
          if (i >= block || kk >= K) continue;
          for (int j = 0; j < 32; ++j) {
            const int64_t n = p * 32 + j;
            if (n >= N) continue;
            const int8_t v = static_cast<int8_t>(bits[kk * N + n]);
            // avx2: [half panel][block][pair][16][2]; otherwise [panel][block][group][32][4]
            const int64_t at = isa == Isa::kAvx2
                                   ? (((2 * p + j / 16) * b.nb + k) * (b.kb / 2) + i / 2) * 32 + (j % 16) * 2 + i % 2
                                   : (((p * b.nb + k) * (b.kb / 4) + i / 4) * 32 + j) * 4 + i % 4;
            b.i8.data()[at] = static_cast<uint8_t>(v);
            if (sums) colsum[(static_cast<size_t>(p) * b.nb + k) * 32 + j] += v;
          }
        }
    if (isa == Isa::kPortable) {
      b.comp.resize(colsum.size());
      for (size_t i = 0; i < colsum.size(); ++i) b.comp[i] = 128 * colsum[i];
    }
    if (isa != Isa::kAvx512Vnni) return b;
    b.nsum.assign(static_cast<size_t>(b.nb) * b.Np, 0);
    b.cbp.assign(static_cast<size_t>(b.nb) * b.Np, 127);
    std::vector<uint8_t> zero_col(static_cast<size_t>(b.nb) * b.Np, 1);
    b.cb_lo.assign(panels, 255);
    b.cb_hi.assign(panels, 0);
    for (int64_t p = 0; p < panels; ++p)
      for (int k = 0; k < b.nb; ++k)
        for (int j = 0; j < 32; ++j) {
          const int64_t n = p * 32 + j;
          if (n >= N) continue;
          const size_t at = (static_cast<size_t>(p) * b.nb + k) * 32 + j;
          b.nsum[at] = -colsum[at];
          bool zero = true;
          for (int64_t kk = static_cast<int64_t>(k) * block; kk < std::min<int64_t>(K, (k + 1) * int64_t{block}); ++kk)
            zero = zero && bits[kk * N + n] == 0;
          const int c = codes[k * N + n];
          if (zero && c != 255) {
            b.cbp[at] = 0;  // set below
            continue;
          }
          b.cbp[at] = static_cast<uint8_t>(c);
          zero_col[at] = 0;
          b.cb_lo[p] = std::min(b.cb_lo[p], c);
          b.cb_hi[p] = std::max(b.cb_hi[p], c);
        }
    // an all-zero block column (and a pad column) takes the panel's smallest code: its
    // products are +0 under any positive scale, and the tile's range test covers it
    for (int64_t p = 0; p < panels; ++p) {
      if (b.cb_lo[p] > b.cb_hi[p]) b.cb_lo[p] = b.cb_hi[p] = 127;
      for (size_t at = static_cast<size_t>(p) * b.nb * 32; at < static_cast<size_t>(p + 1) * b.nb * 32; ++at)
        if (zero_col[at]) b.cbp[at] = static_cast<uint8_t>(b.cb_lo[p]);
    }
    if (block < 256) {  // |D_k| ≤ block·2^14 < 2^22
      b.init.resize(static_cast<size_t>(b.nb) * b.Np * 4);
      int32_t* init = reinterpret_cast<int32_t*>(b.init.data());
      for (int64_t p = 0; p < panels; ++p) {
        if (b.cb_lo[p] < kMxInitLo || b.cb_hi[p] > kMxInitHi) continue;  // the tile reads nsum, cbp there
        for (size_t at = static_cast<size_t>(p) * b.nb * 32; at < static_cast<size_t>(p + 1) * b.nb * 32; ++at) {
          // bits of 1.5·2^(c − 110): biased exponent c + 17, the mantissa's top bit
          const int32_t mbits = static_cast<int32_t>((static_cast<uint32_t>(b.cbp[at]) + 17u) << 23 | 0x400000u);
          init[at] = mbits + 128 * static_cast<int32_t>(b.nsum[at]);
        }
      }
    }
  } else {
    b.f64.assign(static_cast<size_t>(b.nb) * b.kb * b.Np, 0.0);
    for (int k = 0; k < b.nb; ++k)
      for (int i = 0; i < b.kb; ++i) {
        const int64_t kk = static_cast<int64_t>(k) * block + i;
        if (i >= block || kk >= K) continue;
        for (int64_t n = 0; n < N; ++n) {
          const uint8_t v = bits[kk * N + n];
          b.f64[(static_cast<size_t>(k) * b.kb + i) * b.Np + n] = element_integer(e, v);
          if (element_is_special(e, v)) b.bad[static_cast<size_t>(k) * b.Np + n] = 1;
        }
      }
  }
  return b;
}

namespace {

// The avx512vnni INT8 x INT8 driver: A tiled (PackedMxA), then (row block, panel) chunks,
// each over the whole K.
template <class Scales>
void gemm_i8_tiled(const uint8_t* a_bits, const uint8_t* a_codes, int64_t M, const PackedMx& b, Scales&& scales,
                   const float* bias, float* y, int num_threads) {
  constexpr int T = kMxTileRows;
  const int nb = b.nb, kb = b.kb, block = b.block;
  const int64_t K = b.K;
  PackedMxA a;
  a.M = M;
  a.nb = nb;
  a.kb = kb;
  a.tiles = (M + T - 1) / T;
  a.rs = static_cast<int>(std::min<int64_t>(T, std::max<int64_t>(M, 1)));
  a.a.reset(new uint8_t[static_cast<size_t>(a.tiles) * nb * kb * a.rs]);
  a.ef.assign(static_cast<size_t>(a.tiles) * nb * a.rs, 0.0f);
  a.sf.assign(static_cast<size_t>(a.tiles) * nb * a.rs, 0.0f);
  a.lo.assign(a.tiles, 255);
  a.hi.assign(a.tiles, 0);
  qgemm::parallel_ranges(num_threads, a.tiles, 8,
                         [&](int64_t t0, int64_t t1) { pack_a_i8_avx512vnni(a_bits, a_codes, K, block, a, t0, t1); });
  const int64_t panels = b.Np / 32;
  // A's scales as floats, only when some tile and panel miss the fast test (M x nb table
  // look-ups: ~1 % of a 1024^3 GEMM that never reads them)
  bool slow = false;
  for (int64_t t = 0; t < a.tiles && !slow; ++t)
    for (int64_t p = 0; p < panels && !slow; ++p) slow = !tile_codes_fast(a.lo[t], a.hi[t], b.cb_lo[p], b.cb_hi[p]);
  if (slow) a.sa = scales();
  // One pass over K with row blocks of 2 tiles (24 rows): their A (24·K bytes; in L1 up
  // to K ~ 1000) is reused while every column panel passes, B streams from L2 / L3, and each tile keeps its
  // float sums in registers (the 12-row asm tile) or on its stack for the whole K. K
  // chunks with the sums parked in a scratch between chunks (B's chunk in L2, A's in L1)
  // measured slower on every shape tried on Zen 4 (1 thread, thread CPU time, load ~12:
  // 1024^3 0.84 -> 0.91 of the int8 GEMM, 256 x 1024 x 4096 0.90 -> 0.99; a 32 KB L1D
  // does not hold the 96-row A chunk and B's panel chunk together).
  const int64_t mt = std::min<int64_t>(2, a.tiles);
  const int64_t row_blocks = (a.tiles + mt - 1) / mt;
  const int64_t chunks = panels * row_blocks;
  auto body = [&](int64_t c, int) {
    const int64_t p = c % panels, rb = c / panels;
    gemm_i8_tiles_avx512vnni(a, b, bias, y, rb * mt, std::min(a.tiles, (rb + 1) * mt), p);
  };
  if (M > 0 && panels > 0) qgemm::parallel_for(num_threads, chunks, body);
}

}  // namespace

void gemm(const uint8_t* a_bits, const uint8_t* a_codes, Elem a_elem, int64_t M, const PackedMx& b, const float* bias,
          float* y, int num_threads) {
  const int nb = b.nb, kb = b.kb, block = b.block;
  const int64_t K = b.K;
  const ElemInfo fa = elem_info(a_elem);
  std::vector<float> sa;
  // A's scales fl32(2^(code − 127 − f_A)) as floats (NaN for 255), [M][nb]
  auto scales = [&]() -> const float* {
    float pow2_of_code[256];
    for (int c = 0; c < 256; ++c) pow2_of_code[c] = c == 255 ? std::nanf("") : pow2f(c - 127 - fa.frac_bits);
    sa.resize(static_cast<size_t>(M) * nb);
    for (int64_t i = 0; i < M * nb; ++i) sa[i] = pow2_of_code[a_codes[i]];
    return sa.data();
  };
  if (a_elem == Elem::kInt8 && b.elem == Elem::kInt8 && b.isa == Isa::kAvx512Vnni) {
    gemm_i8_tiled(a_bits, a_codes, M, b, scales, bias, y, num_threads);  // packs A into its own tiles
    return;
  }
  scales();
  if (a_elem == Elem::kInt8 && b.elem == Elem::kInt8) {
    // A + 128 as u8, each block padded to kb (pad: 128, i.e. a zero element); for the
    // avx2 tile A as int16, pad 0 (vpmaddwd multiplies signed int16: no offset, no comp)
    const bool wide = b.isa == Isa::kAvx2;
    std::vector<uint8_t> au(wide ? 0 : static_cast<size_t>(M) * nb * kb);
    std::vector<int16_t> a16(wide ? static_cast<size_t>(M) * nb * kb : 0);
    qgemm::parallel_ranges(num_threads, M, 64, [&](int64_t r0, int64_t r1) {
      for (int64_t m = r0; m < r1; ++m)
        for (int k = 0; k < nb; ++k) {
          const uint8_t* src = a_bits + m * K + static_cast<int64_t>(k) * block;
          const int len = static_cast<int>(std::min<int64_t>(block, K - static_cast<int64_t>(k) * block));
          if (wide) {
            int16_t* dst = a16.data() + (m * nb + k) * kb;
            for (int i = 0; i < len; ++i) dst[i] = static_cast<int8_t>(src[i]);
            for (int i = len; i < kb; ++i) dst[i] = 0;
            continue;
          }
          uint8_t* dst = au.data() + (m * nb + k) * kb;
          for (int i = 0; i < len; ++i) dst[i] = static_cast<uint8_t>(src[i] ^ 0x80);
          for (int i = len; i < kb; ++i) dst[i] = 128;
        }
    });
    const int64_t panels = b.Np / 32;
    // chunks: row blocks of up to 96 rows (their A stays in L2 while every column panel
    // passes), panel-minor so that one thread's consecutive chunks share the row block
    const int64_t mc = std::max<int64_t>(6, std::min<int64_t>(96, (M + 5) / 6 * 6));
    const int64_t row_blocks = (M + mc - 1) / mc;
    const int64_t chunks = panels * row_blocks;
    // K chunks of kc blocks, in order: one chunk's B (kc·block·N bytes) stays in L2 while
    // every row block passes; the float accumulators wait in y between chunks
    const int64_t chunk_bytes = static_cast<int64_t>(block) * b.Np;
    // (one row block reuses nothing: the whole K in one pass, no accumulators parked in y)
    // (avx2: a row block's int16 A up to 256 KB stays in L2 over the whole K while each
    // 16-column half panel of B, K·16 bytes, passes through L1: one pass, as one row block)
    const bool one_pass = row_blocks == 1 || (wide && mc * nb * kb * 2 <= (256 << 10));
    const int kc = one_pass ? std::max(nb, 1)
                            : static_cast<int>(std::max<int64_t>(
                                  1, std::min<int64_t>(nb, (512 << 10) / std::max<int64_t>(chunk_bytes, 1))));
    for (int k0 = 0; k0 < nb || (nb == 0 && k0 == 0); k0 += kc) {
      const int k1 = std::min(nb, k0 + kc);
      auto body = [&](int64_t c, int) {
        const int64_t p = c % panels, rb = c / panels;
        const int64_t m0 = rb * mc, m1 = std::min(M, m0 + mc);
        switch (b.isa) {
          case Isa::kAvx2: gemm_i8_avx2(a16.data(), sa.data(), b, bias, y, M, m0, m1, p, p + 1, k0, k1); break;
          default: gemm_i8_portable(au.data(), sa.data(), b, bias, y, M, m0, m1, p, p + 1, k0, k1); break;
        }
      };
      if (M > 0 && panels > 0) qgemm::parallel_for(num_threads, chunks, body);
      if (nb == 0) break;
    }
    return;
  }
  // float elements: n as double, blocks padded to kb with zeros
  std::vector<double> ad(static_cast<size_t>(M) * nb * kb, 0.0);
  std::vector<uint8_t> abad(static_cast<size_t>(M) * nb, 0);
  double lut[256];
  for (int v = 0; v < 256; ++v) lut[v] = element_integer(a_elem, static_cast<uint8_t>(v));
  for (int64_t m = 0; m < M; ++m)
    for (int64_t kk = 0; kk < K; ++kk) {
      const uint8_t v = a_bits[m * K + kk];
      ad[(m * nb + kk / block) * kb + kk % block] = lut[v];
      if (element_is_special(a_elem, v)) abad[m * nb + kk / block] = 1;
    }
  qgemm::parallel_ranges(num_threads, M, 8, [&](int64_t m0, int64_t m1) {
    switch (b.isa) {
      case Isa::kAvx512Vnni: gemm_f64_avx512vnni(ad.data(), abad.data(), sa.data(), b, bias, y, m0, m1); break;
      case Isa::kAvx2: gemm_f64_avx2(ad.data(), abad.data(), sa.data(), b, bias, y, m0, m1); break;
      default: gemm_f64_portable(ad.data(), abad.data(), sa.data(), b, bias, y, m0, m1); break;
    }
  });
}

}  // namespace mx
}  // namespace quanta
