// The generic MX loops (mx.h contract), included by mx_portable.cc and mx_avx2.cc and
// compiled with each file's flags. Everything here is in an anonymous namespace so that
// each ISA file keeps its own copy (one shared inline function would let the linker pick
// the AVX2 build for the portable path).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "mx/mx.h"

namespace quanta {
namespace mx {
namespace {

// Shared exponent of eq. (MX3) from the block's largest finite magnitude (float32 bits:
// the exponent field is floor(log2), exact, subnormals by their leading bit).
inline int shared_exponent(float amax, int emax) {
  if (amax == 0.0f) return -127;
  uint32_t u;
  std::memcpy(&u, &amax, 4);
  int e = static_cast<int>((u >> 23) & 0xff);
  int fl;
  if (e == 0) {
    const uint32_t m = u & 0x7fffff;  // subnormal: 2^-149 · m
    fl = -149 + (31 - __builtin_clz(m));
  } else {
    fl = e - 127;
  }
  int s = fl - emax;
  return s < -127 ? -127 : (s > 127 ? 127 : s);
}

// x / 2^e, exact for every value that does not round to zero anyway (mx.cc comment).
inline float scale_down(float v, int e) {
  // 2^-e in two steps keeps both factors normal or exact subnormal powers of two
  const int h = -e / 2;
  return (v * pow2f(h)) * pow2f(-e - h);
}

inline void quantize_i8_rows_generic(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K,
                                     int block) {
  const int64_t nb = (K + block - 1) / block;
  for (int64_t r = r0; r < r1; ++r) {
    const float* xr = x + r * K;
    for (int64_t k = 0; k < nb; ++k) {
      const int64_t i0 = k * block, i1 = std::min<int64_t>(K, i0 + block);
      float amax = 0.0f;
      bool bad = false;
      for (int64_t i = i0; i < i1; ++i) {
        const float a = std::fabs(xr[i]);
        bad |= !(a <= 3.4028234663852886e38f);
        amax = a > amax && a <= 3.4028234663852886e38f ? a : amax;
      }
      uint8_t* br = bits + r * K;
      if (bad) {
        codes[r * nb + k] = 255;
        for (int64_t i = i0; i < i1; ++i) br[i] = 0;
        continue;
      }
      const int e = shared_exponent(amax, 0);
      codes[r * nb + k] = static_cast<uint8_t>(e + 127);
      for (int64_t i = i0; i < i1; ++i) {
        float q = std::nearbyint(scale_down(xr[i], e) * 64.0f);
        q = q > 127.0f ? 127.0f : (q < -127.0f ? -127.0f : q);
        br[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
      }
    }
  }
}

inline void gemm_i8_generic(const uint8_t* au, const float* sa, const PackedMx& b, const float* bias, float* y,
                            int64_t m0, int64_t m1, int64_t p0, int64_t p1, int k0, int k1) {
  const int nb = b.nb, kb = b.kb;
  const int64_t N = b.N;
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * 32;
    const int ncols = static_cast<int>(std::min<int64_t>(32, N - n0));
    for (int64_t m = m0; m < m1; ++m) {
      float acc[32];
      float* yr = y + m * N + n0;
      for (int j = 0; j < 32; ++j) acc[j] = k0 > 0 && j < ncols ? yr[j] : 0.0f;
      for (int k = k0; k < k1; ++k) {
        int32_t d[32];
        for (int j = 0; j < 32; ++j) d[j] = -b.comp[(static_cast<size_t>(p) * nb + k) * 32 + j];
        const uint8_t* ar = au + m * static_cast<int64_t>(nb) * kb + static_cast<int64_t>(k) * kb;
        const int8_t* w = b.i8p() + ((p * nb + k) * static_cast<int64_t>(kb)) * 32;
        for (int g = 0; g < kb / 4; ++g)
          for (int j = 0; j < 32; ++j)
            for (int t = 0; t < 4; ++t) d[j] += static_cast<int32_t>(ar[4 * g + t]) * w[(g * 32 + j) * 4 + t];
        const float s_a = sa[m * nb + k];
        const float* sbk = b.sbp.data() + (static_cast<size_t>(p) * nb + k) * 32;
        for (int j = 0; j < 32; ++j) {
          const float s = s_a * sbk[j];                   // eq. (MX5b)
          const float pk = static_cast<float>(d[j]) * s;  // eq. (MX5c)
          acc[j] = k == 0 ? pk : acc[j] + pk;             // eq. (MX6)
        }
      }
      for (int j = 0; j < ncols; ++j) {
        float v = nb == 0 ? 0.0f : acc[j];
        if (bias && k1 == nb) v = v + bias[n0 + j];
        yr[j] = v;
      }
    }
  }
}

inline void gemm_f64_generic(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b,
                             const float* bias, float* y, int64_t m0, int64_t m1) {
  const int nb = b.nb, kb = b.kb;
  const int64_t N = b.N, Np = b.Np;
  std::vector<double> d(static_cast<size_t>(Np));
  std::vector<float> acc(static_cast<size_t>(Np));
  for (int64_t m = m0; m < m1; ++m) {
    for (int k = 0; k < nb; ++k) {
      std::fill(d.begin(), d.end(), 0.0);
      const double* ar = ad + (m * nb + k) * static_cast<int64_t>(kb);
      const double* w = b.f64.data() + static_cast<size_t>(k) * kb * Np;
      // every product and partial sum is an integer below 2^53: exact in any order
      for (int i = 0; i < kb; ++i) {
        const double av = ar[i];
        const double* wr = w + static_cast<size_t>(i) * Np;
        for (int64_t j = 0; j < Np; ++j) d[j] += av * wr[j];
      }
      const float s_a = sa[m * nb + k];
      const bool bad_a = abad[m * nb + k] != 0;
      const float* sbk = b.sb.data() + static_cast<size_t>(k) * Np;
      const uint8_t* badb = b.bad.data() + static_cast<size_t>(k) * Np;
      for (int64_t j = 0; j < Np; ++j) {
        const float s = s_a * sbk[j];
        float pk = static_cast<float>(d[j]) * s;
        if (bad_a || badb[j]) pk = std::nanf("");
        acc[j] = k == 0 ? pk : acc[j] + pk;
      }
    }
    for (int64_t j = 0; j < N; ++j) {
      float v = nb == 0 ? 0.0f : acc[j];
      if (bias) v = v + bias[j];
      y[m * N + j] = v;
    }
  }
}

}  // namespace
}  // namespace mx
}  // namespace quanta

// The entry points of one ISA file on the generic loops: the float-element GEMM
// (mx_portable.cc, mx_avx2.cc: the same code compiled with that file's flags), and the
// INT8 quantize and INT8 GEMM (mx_portable.cc; mx_avx2.cc has its own).
#define QUANTA_MX_GENERIC_F64(SUFFIX)                                                                                  \
  namespace quanta {                                                                                                   \
  namespace mx {                                                                                                       \
  void gemm_f64_##SUFFIX(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b, const float* bias, \
                         float* y, int64_t m0, int64_t m1) {                                                           \
    gemm_f64_generic(ad, abad, sa, b, bias, y, m0, m1);                                                                \
  }                                                                                                                    \
  }                                                                                                                    \
  }
#define QUANTA_MX_GENERIC_ENTRY_POINTS(SUFFIX)                                                                       \
  QUANTA_MX_GENERIC_F64(SUFFIX)                                                                                      \
  namespace quanta {                                                                                                 \
  namespace mx {                                                                                                     \
  void quantize_i8_##SUFFIX(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K,        \
                            int block) {                                                                             \
    quantize_i8_rows_generic(x, bits, codes, r0, r1, K, block);                                                      \
  }                                                                                                                  \
  void gemm_i8_##SUFFIX(const uint8_t* au, const float* sa, const PackedMx& b, const float* bias, float* y, int64_t, \
                        int64_t m0, int64_t m1, int64_t p0, int64_t p1, int k0, int k1) {                            \
    gemm_i8_generic(au, sa, b, bias, y, m0, m1, p0, p1, k0, k1);                                                     \
  }                                                                                                                  \
  }                                                                                                                  \
  }
