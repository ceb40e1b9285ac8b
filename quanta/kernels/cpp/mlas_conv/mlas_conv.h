// quanta::MlasConv: ONNX Runtime's float32 Conv as MLAS computes it on x86-64 with FMA
// (reference/mlas_conv.py, docs/float-ops.md eqs. (MC1)-(MC6)). Per image and group:
//
//   cols[k, n] = x[c, oh·sh − pt + i·dh, ow·sw − pl + j·dw] (0 outside), k = (c, i, j)  (MC1)
//   each output belongs to one part (m0, mc, n0, cn, sk, kind) of `parts`                 (MC2)
//   per block [k0, k0 + sk): acc = +0; acc = fma(w[f, k], cols[k, n], acc), k increasing (MC3)
//   y = the first block's acc, then y = f32(y + acc) for each further block             (MC4)
//   one row (MLAS's M = 1 kernel): per 4 k t = ((p0 + p1) + p2) + p3 with p = f32(w·x),
//     y = f32(y + t) from +0, then a pair and a single the same way                    (MC5)
//   one pixel (MLAS's N = 1 kernel): eight lane sums of p in increasing k, reduced by the
//     row's place among its part's rows (blocks of 4, then 2, then 1)                   (MC5')
//   y = f32(y + b[f]) when bias is given                                               (MC6)
//
// The parts (m0, mc, n0, cn, sk, kind) come from reference/mlas_conv.py mlas_conv_plan (ORT's
// thread count and the shape decide them); kind 0 chains, 1 M = 1, 2 N = 1. A part is
// computed one K block at a time, as MLAS does (its CountK): the block's im2col rows are
// made, multiplied and dropped, so the block stays in L2. The arithmetic of one
// output does not depend on how this kernel itself is threaded (num_threads splits parts,
// groups and images; each part is one thread's, as an MLAS segment's slices are).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace quanta {
namespace mlas_conv {

struct Geometry {
  int64_t batch, group;
  int64_t c, h, w;  // input channels per group, input height and width
  int64_t f;        // filters per group
  int64_t kh, kw;   // kernel
  int64_t oh, ow;   // output
  int64_t sh, sw, dh, dw, pt, pl;
};

// The window of g (batch, group, c, f, kh, kw, h, w already set): strides and dilations
// [h, w], pads [top, left, bottom, right], the output plane oh x ow. An empty string, else
// what is wrong (the binders raise it as a ValueError); MlasConv and MlasQLinearConv share it.
std::string set_window(Geometry& g, const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                       const std::vector<int64_t>& pads);

enum Kind : int64_t { kChains = 0, kM1 = 1, kDot = 2 };

// x [batch, group·c, h, w], w [group·f, c·kh·kw], bias [group·f] or null, y [batch, group·f, oh·ow];
// parts: n_parts rows (m0, mc, n0, cn, sk, kind), every output of a group in exactly one.
void conv_f32(const float* x, const float* w, const float* bias, float* y, const Geometry& g, const int64_t* parts,
              int64_t n_parts, int num_threads, bool use_avx2);

// (MC3) for one K block of kb rows, rows [0, rows) of a (row stride lda, already offset to
// the block's first k) against the columns [0, cn) of b (kb im2col rows of stride ldb,
// readable and zero up to the next multiple of 16 columns): y = acc when `accumulate` is
// false (the first block), else y = f32(y + acc) (MC4). The AVX2 variant is bit-identical
// to the portable one.
void chains_portable(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int64_t rows,
                     int64_t cn, int64_t kb, bool accumulate);
void chains_avx2(const float* a, int64_t lda, const float* b, int64_t ldb, float* y, int64_t ldy, int64_t rows,
                 int64_t cn, int64_t kb, bool accumulate);

// (MC5) for one K block of kb rows: the filter row a against the columns [0, cn) of b (kb
// rows of stride ldb: im2col rows, or a pointwise Conv's input planes themselves), from
// y = +0 when `accumulate` is false. The AVX2 variant computes every output with the same
// vmulps / vaddps sequence, 8 outputs a vector: bit-identical to the portable one.
void chain_m1_portable(const float* a, const float* b, int64_t ldb, int64_t kb, int64_t cn, float* y, bool accumulate);
void chain_m1_avx2(const float* a, const float* b, int64_t ldb, int64_t kb, int64_t cn, float* y, bool accumulate);

}  // namespace mlas_conv
}  // namespace quanta
