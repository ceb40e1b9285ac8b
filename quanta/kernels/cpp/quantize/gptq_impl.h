// The body of gptq.h's column loop, compiled once per ISA file (gptq_portable.cc,
// gptq_avx2.cc, gptq_avx512vnni.cc) so the compiler vectorizes the row update with that
// file's instructions; -ffp-contract=off keeps the product and the sum two roundings.
#pragma once

#include <algorithm>
#include <cmath>

#include "gptq.h"

namespace quanta {
// In an anonymous namespace: each instruction set's file keeps its own copy (one inline
// definition shared by the three files would let the linker keep one build for all).
namespace {

void gptq_block_body(const GptqBlock& b) {
  const int64_t n = b.n;
  for (int64_t r = 0; r < b.rows; ++r) {
    double* __restrict w = b.w + r * n;
    const double* __restrict w0 = b.w0 + r * n;
    double* __restrict q = b.q + r * n;
    double* __restrict d = b.d + r * n;
    const double s = b.s[r];
    for (int64_t j = 0; j < n; ++j) {
      const double qj = std::min(std::max(std::nearbyint(w[j] / s), b.qmin), b.qmax);
      const double dj = w0[j] - s * qj;
      q[j] = qj;
      d[j] = dj;
      const double* __restrict vj = b.v + j * n;
      for (int64_t c = j + 1; c < n; ++c) {
        const double t = dj * vj[c];
        w[c] = w[c] + t;
      }
    }
  }
}

}  // namespace
}  // namespace quanta
