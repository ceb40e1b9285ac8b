// GPTQ's column loop for one block of columns (quanta/quantize/rounding.py
// gptq_round_groups; docs/debugger.md eq. (12f)), the same float64 operations in the
// same order as the NumPy loop it replaces, so the integers it chooses are identical:
//
//   for each row r (rows are independent) and column j = 0 .. n-1 of the block:
//     q[r][j] = min(max(rint(w[r][j] / s[r]), qmin), qmax)     rint: half to even
//     d[r][j] = w0[r][j] - s[r] * q[r][j]
//     w[r][c] = w[r][c] + d[r][j] * v[j][c]      for c = j+1 .. n-1, two roundings
//
// w is updated in place (the block's columns with every earlier column's feedback);
// every array is row-major and contiguous: w, w0, q, d [rows, n], s [rows], v [n, n].
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {

struct GptqBlock {
  double* w;
  const double* w0;
  const double* s;
  const double* v;
  double* q;
  double* d;
  int64_t rows;
  int64_t n;
  double qmin;
  double qmax;
};

void gptq_block_portable(const GptqBlock& b);
void gptq_block_avx2(const GptqBlock& b);
void gptq_block_avx512vnni(const GptqBlock& b);

// The variant of `isa` (the active one for the bindings).
void gptq_block(const GptqBlock& b, Isa isa);

}  // namespace quanta
