// quanta::MlasQLinearConv: ONNX Runtime's QLinearConv of uint8 (or int8) x and int8 w as
// its u8·s8 kernels without VNNI compute it (reference/mlas_qconv.py, docs/float-ops.md
// (QC1)-(QC4)). Per image and group, p = (oh, ow), k = (i, j, c):
//
//   a[p, k] = x'[c, oh·sh − pt + i·dh, ow·sw − pl + j·dw]  (zx' outside x)              (QC1)
//   acc[p, f] = Σ_j sat16(a[p, 2j]·w[f, 2j] + a[p, 2j+1]·w[f, 2j+1])                    (QC2)
//   acc −= zx'·Σ_k w[f, k] + zw[f]·Σ_k a[p, k] − K·zx'·zw[f];  acc += B[f]              (QC3)
//   y[f, p] = sat(rne(f32(f32(acc) · m[f])) + zy)                                       (QC4)
//
// x' = x for uint8 x; x + 128 (and zx' = zx + 128) for int8 x, as ORT's QDQS8ToU8
// transformer makes it. m[f] = f32(f32(sx·sw[f]) / sy) is the caller's.
//
// Paths: AVX2 (also on AVX-512 hosts, whose ORT without VNNI runs the same vpmaddubsw
// pairs) is qgemm's saturating family (qgemm.h pack_weights `saturating`): vpmaddubsw
// clips each pair by itself, the zero points and the requantization are qgemm's exact
// epilogue (its folded form equals (QC3) term by term, its Requant::kFloat equals (QC4)).
// Portable: the same pairs, clipped in scalar C++. A grouped Conv is one GEMM per group
// into its columns of an [P, G·F] NHWC block.
//
// Layout: the GEMM reads (QC1)'s rows from x in [h, w, G·C] order and writes y as
// [oh·ow, G·F], so an NCHW x is transposed in per image and y transposed back out;
// channels_last (x [batch, h, w, G·C], y [batch, oh, ow, G·F], what the channels-last pass
// asks for between consecutive convolutions) skips both: a uint8 x feeds the im2col (or a
// pointwise GEMM) as it is, an int8 x is copied once with its codes + 128. The arithmetic
// is the same either way: the layouts only move bytes.
//
// Threads: qgemm splits each GEMM, the im2col its rows and the transposes their blocks
// (every byte is written by one thread, whatever the split: the same bytes for any count).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "mlas_conv/mlas_conv.h"
#include "qgemm/qgemm.h"

namespace quanta {
namespace mlas_qconv {

// MlasConv's: the same 2-D window over [batch, group·c, h, w] (mlas_conv::set_window)
using Geometry = mlas_conv::Geometry;

// The weights of one node, prepacked once: per group [K, f] in (i, j, c) order.
struct Packed {
  int64_t group = 1, f = 0, c = 0, kh = 0, kw = 0;  // f, c per group
  bool avx2 = false;
  std::vector<std::shared_ptr<qgemm::PackedWeights>> gemm;  // avx2: one per group
  std::vector<int8_t> w;                                    // portable: [group·f, K]
  std::vector<int32_t> zw;                                  // [group·f]
  std::vector<int64_t> wsum;                                // [group·f]: Σ_k w[f, k]
  int64_t k() const { return kh * kw * c; }
};

// w [group·f, c, kh, kw] int8 (C-contiguous), zw [group·f] (int8 range).
std::shared_ptr<Packed> pack(const int8_t* w, const int32_t* zw, int64_t group, int64_t f, int64_t c, int64_t kh,
                             int64_t kw, bool avx2);

// x [batch, group·c, h, w] codes (int8 when x_signed), zx in x's range; bias [group·f] or
// null; multiplier [group·f] (finite, > 0); zy in y's range; y [batch, group·f, oh, ow]
// (int8 when y_signed). channels_last: x [batch, h, w, group·c], y [batch, oh, ow, group·f].
void conv(const Packed& pw, const void* x, bool x_signed, int32_t zx, const int32_t* bias, const float* multiplier,
          int32_t zy, bool y_signed, void* y, const Geometry& g, int num_threads, bool channels_last = false);

}  // namespace mlas_qconv
}  // namespace quanta
