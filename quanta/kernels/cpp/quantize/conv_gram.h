// GPTQ's statistics of a convolution whose Gram matrices are narrow (K < 32: a depthwise
// or grouped layer, or a stem of few channels): Σ_p x_int(p) x_int(p)ᵀ over the output
// positions p of one sample, per group, added exactly into int64 sums
// (quanta/quantize/rounding.py, RoundedLayer; docs/debugger.md eq. (12d)).
//
// x_int = c − o for an 8-bit code c with zero point o; a padded position reads x_int 0
// (the zero point). Row r of group g is input channel g·C_g + r / (kh·kw) at tap
// (r mod kh·kw) = i·kw + j, W.reshape(Cout, −1)'s order. The same integers as the NumPy
// path (im2col, then float64 products whose sums stay below 2^53): both are the exact
// sums, so no summation order is specified.
#pragma once

#include <cstdint>

#include "dispatch.h"

namespace quanta {
namespace conv_gram {

struct Args {
  const uint8_t* x;  // the samples' codes [N, C, H, W], contiguous
  int64_t samples, channels, height, width;
  int32_t zero_point;
  int64_t groups, kh, kw, sh, sw;
  int64_t pad_top, pad_left, pad_bottom, pad_right;
  int64_t* out;  // [groups, K, K] int64, added into
};

// The number of Gram rows a group has: C / groups · kh · kw.
int64_t rows(const Args& a);

// Adds the samples' Gram matrices into a.out (the instruction set's build of the same sums;
// its scratch is allocated once for all the samples).
void accumulate(const Args& a, Isa isa);
void accumulate_portable(const Args& a);
void accumulate_avx2(const Args& a);
void accumulate_avx512vnni(const Args& a);

}  // namespace conv_gram
}  // namespace quanta
