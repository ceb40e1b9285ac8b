// conv: QLinearConv and ConvInteger on the int8 GEMM core, plus a dedicated depthwise
// kernel. Equation numbers cite docs/quantization-math.md; the layering is that of qgemm
// (docs/kernels.md "Convolution").
//
// ---------------------------------------------------------------------------------------
// Contract
// ---------------------------------------------------------------------------------------
//
// Operands (ONNX layout at this boundary): x [N, C, H, W] (2-D) or [N, C, W] (1-D, run as
// H = 1), uint8 or int8, C-contiguous; w [M, C/G, kh, kw] (or [M, C/G, kw]) int8 or
// uint8, prepacked once by QConv::create; zx one run-time scalar in x's range; zw[m]
// static, one value or one per output channel; G groups (C and M multiples of G);
// Cg = C/G, Mg = M/G, g(m) = m / Mg. Geometry: strides (sh, sw), dilations (dh, dw),
// pads (top, left, bottom, right) resolved from auto_pad exactly as
// quanta/kernels/reference/conv_geometry.py (QConv::resolve below).
//
// For every n, m and output position (oy, ox), in int32 arithmetic that WRAPS modulo 2^32
// (ONNX's int32 accumulator; every order of summation gives the same bits):
//
//   acc[n,m,oy,ox] = Σ_{c<Cg} Σ_{ky<kh} Σ_{kx<kw}
//                      (xpad[n, g(m)·Cg + c, oy·sh + ky·dh, ox·sw + kx·dw] − zx)
//                    · (w[m, c, ky, kx] − zw[m])                 + bias[m]          eq. (4)
//
// where xpad is x surrounded by (top, left, bottom, right) positions holding the REAL
// value 0, i.e. the quantized value zx (so padded taps contribute exactly 0).
//
// Output, by out_type:
//   kS32 (ConvInteger):  y = acc                         (no bias: ConvInteger has none)
//   kU8 / kS8 (QLinearConv, eq. (6), ONNX Runtime semantics, bit-exact with
//   quanta/kernels/reference/qlinear_conv.py):
//       v = fl(float32(acc) · multiplier[m]);  v = min(max(v, L − zy), H − zy)
//       y = round_half_even(v) + zy
//   with multiplier[m] = fl(fl(sx · sw[m]) / sy) computed by the caller (the binding), as
//   reference/requant.py::requant_multiplier, and L = max(qmin, clamp_lo), H = min(qmax,
//   clamp_hi): the output code clamp (ConvArgs; default the type's range). A clamp of the
//   codes after requantization, since L − zy and H − zy are integers and round_half_even is
//   monotone with integer fixed points: round(min(max(v, L − zy), H − zy)) =
//   min(max(round(v), L − zy), H − zy) (docs/quantization-math.md eq. (6c)).
//
// Every path computes acc in the folded form of eq. (5) with the u8 shift of eq. (8):
// x' = x (uint8) or x ^ 0x80 = x + 128 (int8), zx' = zx (+ 128), so x' − zx' = x − zx and
// the padding value is zx'. The +128 flip is applied while the activations are copied
// anyway (the NCHW -> NHWC transposes, the depthwise padded rows or masked loads).
//
// Paths (the kernel name tells which; chosen from the weights' shape and the geometry):
//
//   depthwise   G == C == M (one input and one output channel per group), any kernel
//               size, stride, dilation and pads, 2-D or 1-D. Runs on NCHW directly (no
//               transposes): per channel plane, rows padded with zx' into the workspace
//               (or, avx512vnni with narrow rows, read in place with masked loads), then a
//               dedicated kernel (kernels.h) whose SIMD lanes are output pixels and whose 4
//               bytes per lane are 4 horizontal taps (vpdpbusd / vpmaddwd). With stride 1
//               and small planes (<= 1024 output pixels, <= 256 with several threads) the
//               per-plane work is too short for that: x is transposed to NHWC, the
//               channels_last depthwise kernel below runs, and its NHWC result is
//               transposed into y (same bytes; QUANTA_CONV_DW_PATH=planes|transposed pins
//               the choice).
//   implicit    the other convolutions whose tap chunks are whole k-groups (Cg, or kw·Cg
//               with dw = 1 and G = 1, a multiple of 4) on the ISAs whose qgemm tiles read
//               uint8 activations (avx512vnni, portable). x is transposed into a padded
//               NHWC image (pads hold zx', the +128 flip applied on the way); then qgemm's
//               micro-kernel runs in its indirect-rows form (qgemm/kernel.h TileArgs::
//               a_rows): the rows of a tile are output pixels, each with a pointer to its
//               first tap in that image, and the taps (ky, or (ky, kx)) are byte offsets
//               from it, so the sums stay in registers across the taps of a call and tiles
//               cross output rows. qgemm's fused output stage writes an NHWC block,
//               transposed into y. No im2col copy.
//   pointwise   1x1, stride 1, no pads, one group, at least kPointwisePixels pixels per
//               image: the transposed GEMM y[n][m, p] = Σ_c w[m, c]·x[n][c, p], so neither
//               x nor y is transposed. Per unit (an image's range of pixels) x's [C, pixels]
//               block is packed as qgemm's B operand (gemm/batched_qgemm.h
//               pack_weights_strided: x' with its column sums, zx as B's zero point), w is
//               qgemm's x operand (zw its per-row zero point), and qgemm's transposed
//               output stage (qgemm.h: row_bias = bias[m], multiplier per row for
//               per-channel scales) writes y's channel rows [m, p0 ..) in place.
//               QUANTA_CONV_PW_PATH=gemm|transposed pins the choice.
//   direct      the channels_last direct kernel (below) between an NCHW -> NHWC transpose
//               of x and an NHWC -> NCHW one of y (a CNN's 3-channel stem).
//   im2col      everything else (the avx2 ISA, channel counts that are not multiples of
//               4): NCHW -> NHWC transpose, per chunk of output pixels and per group im2col
//               rows [ky][kx][c] (or the transposed rows themselves for 1x1 / stride 1 /
//               no pads / G = 1), qgemm with the fused requantization, NHWC -> NCHW.
//
// channels_last (ConvArgs::channels_last; the com.microsoft QLinearConv of an NHWC graph):
// x [N, H, W, C] and y [N, OH, OW, M], same arithmetic and bytes, no transposes:
//   depthwise   a channels-as-lanes kernel (kernels.h "Depthwise, channels_last") over
//               per-pixel tap pointers into x (or a pad pixel of zx); on avx512vnni with
//               horizontal stride 1, C not a multiple of 64 and lcm(C, 64) <= 24·64, the
//               flat-row form instead: 64-byte vectors of the output row's OW·C stream,
//               several pixels per vector when C < 64 (kernels.h "flat rows").
//   direct      avx512vnni, G = 1, Cg not a multiple of 4, dw = 1, kw·Cg <= 64, M <= 64,
//               every w − zw in int8 (a CNN's stem): padded NHWC image by row copies,
//               then output channels as lanes and broadcast dwords of each kernel row
//               (kernels.h "Direct, small C").
//   implicit    the padded image by row copies, or x itself (uint8 x, no pads); the
//               tiles write y's rows in place.
//   im2col      xt is x itself (uint8 x) or a flipped copy; qgemm writes y's rows.
//
// Weights are packed for qgemm once per group with k = (ky·kw + kx)·Cg + c and K rounded up
// to a multiple of 4 (the extra rows hold zw[m], so w − zw = 0 there).
//
// Threads: num_threads >= 1. The depthwise path splits (n, c) planes, or row blocks of
// them when there are few planes; the implicit path splits blocks of output pixels x groups
// (and the padded image's rows before them); the im2col path splits output-pixel chunks x
// groups (each a one-thread qgemm on its own scratch) or, with fewer chunks than
// threads, lets qgemm split its N panels. Units go through run_with_affinity (kernels.h):
// a home range per thread, then stealing. Every output element is computed by the same arithmetic
// whichever thread or chunk computes it (integer sums are exact modulo 2^32; the float
// epilogue is the same sequence of float32 operations), so the bytes are identical for
// any num_threads.
//
// Buffers: the caller owns x, y, bias and multipliers (read during the call only) and a
// ConvWorkspace (scratch, one call at a time). run() never allocates: the caller sizes the
// workspace with reserve_workspace() first (which grows it once; later calls of the same
// or a smaller shape reuse it).
//
// Layering: entry = bindings_conv.cc (checks, multipliers) -> driver = conv.cc (packing,
// geometry, plan, depthwise path) and conv_gemm.cc (implicit and im2col paths) ->
// depthwise_<isa>.cc, layout*.cc (transposes, AVX-512 im2col), im2col.cc, and qgemm: its
// public API (im2col path) or its micro-kernel tiles through qgemm/kernel.h (implicit
// path, which builds the same Epilogue constants as qgemm.cc::make_epilogue).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dispatch.h"
#include "qgemm/qgemm.h"

namespace quanta {
namespace conv {

using qgemm::OutType;

enum class AutoPad : int { kNotSet = 0, kValid = 1, kSameUpper = 2, kSameLower = 3 };

// ONNX attributes of a 1-D or 2-D convolution. For spatial_rank 1 only index 0 of
// kernel/strides/dilations and pads {begin, end} are used.
struct Attributes {
  int spatial_rank = 2;        // 1 or 2
  int64_t kernel[2] = {1, 1};  // (kh, kw) or (kw)
  int64_t strides[2] = {1, 1};
  int64_t dilations[2] = {1, 1};
  int64_t pads[4] = {0, 0, 0, 0};  // ONNX order: begins, then ends
  AutoPad auto_pad = AutoPad::kNotSet;
};

// The geometry of one call (a 1-D convolution as H = kh = 1).
struct Geometry {
  int64_t N = 0, C = 0, H = 0, W = 0;  // input
  int64_t M = 0, OH = 0, OW = 0;       // output
  int64_t kh = 1, kw = 1, sh = 1, sw = 1, dh = 1, dw = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;
};

struct ConvArgs {
  const void* x = nullptr;  // [N, C, H, W], or [N, H, W, C] with channels_last
  bool x_signed = false;
  bool channels_last = false;         // x and y NHWC (com.microsoft QLinearConv channels_last=1)
  int32_t zx = 0;                     // in x's range
  OutType out_type = OutType::kS32;   // kS32, kU8 or kS8
  const float* multiplier = nullptr;  // kU8/kS8: 1 or M values (finite)
  bool multiplier_per_channel = false;
  const int32_t* bias = nullptr;  // [M] or null
  int32_t zy = 0;                 // kU8/kS8, in the output's range
  // kU8/kS8: the output code clamp [clamp_lo, clamp_hi] (a Relu / Clip folded into the
  // epilogue), intersected with the type's range by output_range(); clamp_lo <= clamp_hi
  int32_t clamp_lo = INT32_MIN, clamp_hi = INT32_MAX;
  void* y = nullptr;  // [N, M, OH, OW] (or [N, OH, OW, M]) of out_type
  int num_threads = 1;
};

// The codes [L, H] a kU8 / kS8 call writes: L = max(qmin, clamp_lo), H = min(qmax, clamp_hi).
struct OutputRange {
  int32_t lo = 0, hi = 0;
};
inline OutputRange output_range(const ConvArgs& a) {
  const bool s8 = a.out_type == OutType::kS8;
  const int32_t qmin = s8 ? -128 : 0, qmax = s8 ? 127 : 255;
  return {a.clamp_lo > qmin ? a.clamp_lo : qmin, a.clamp_hi < qmax ? a.clamp_hi : qmax};
}

// Scratch of one call: a main buffer, and one buffer + one qgemm::Workspace per thread.
class ConvWorkspace {
 public:
  qgemm::AlignedBuffer main;
  std::vector<qgemm::AlignedBuffer> thread_bufs;
  std::vector<qgemm::Workspace> thread_gemm;
  std::vector<qgemm::PackedWeights> thread_packed;  // pointwise NCHW path: x's pixels packed as qgemm's B
};

// Weights of one depthwise convolution, prepacked (kernels.h describes the layout).
struct DepthwiseWeights {
  int64_t C = 0, kh = 0, kw = 0, groups4 = 0;  // groups4 = ceil(kw / 4) tap groups per row
  std::vector<int32_t> taps4;                  // [C][kh][groups4]: 4 int8 taps w_eff per int32, 0 past kw
  std::vector<int8_t> taps;                    // [C][kh][kw]: w_eff (the portable kernel)
  std::vector<int32_t> zero_point;             // [C]: zw_eff (0 when w − zw fits int8: no Σx' term)
  std::vector<int32_t> column_sums;            // [C]: cs[c] = Σ_taps (w − zw)
  // The SIMD kernels' one-load gather (kernels.h): 16 vpermd dword indices, then the
  // vpshufb bytes of a full and of the row's last tap group (64 each).
  int32_t gather_perm[16] = {}, gather_perm2[16] = {};
  int8_t gather_full[64] = {}, gather_last[64] = {};
  // channels_last kernels (kernels.h "Depthwise, channels_last"): w_eff in the ISA's
  // layout, and zw_eff in its channel order (empty when every zw_eff is 0).
  std::vector<uint8_t> nhwc_taps;
  std::vector<int32_t> nhwc_zero_point;
  int64_t nhwc_cpad = 0;  // entries of the per-channel arrays (channels rounded up to the ISA's block)
  // avx512vnni with horizontal stride 1: the flat-row layout (kernels.h "Depthwise,
  // channels_last, flat rows"), entry e for channel e mod C, nhwc_cpad = lcm(C, 64)
  bool nhwc_flat = false;
  bool nhwc_vtail = false;  // flat 5x5 at sh = dh = 1 with the vertical tail (kernels.h)
};

struct DepthwiseNhwc;  // kernels.h

class QConv {
 public:
  // w: [M, Cg, kh, kw] (kh = 1 for 1-D), w_unsigned selects uint8; zero_point: M values
  // or 1. Throws std::invalid_argument on inconsistent arguments. borrow_w: the caller
  // keeps w alive and unchanged for the QConv's lifetime, so the pointwise path reads its
  // bytes in place (w [M, Cg] is that path's operand as it is) instead of a copy.
  static std::shared_ptr<QConv> create(const void* w, bool w_unsigned, int64_t M, int64_t Cg, int64_t group,
                                       const int32_t* zero_point, bool zero_point_per_channel, const Attributes& attrs,
                                       Isa isa, bool borrow_w = false);

  // The geometry for an input [N, C, H, W] (H = 1 for 1-D); throws std::invalid_argument
  // with the reference's wording when the input does not fit.
  Geometry resolve(int64_t N, int64_t C, int64_t H, int64_t W) const;

  // Grows `ws` (never shrinks) so that run(a, geo, ws) needs no allocation.
  void reserve_workspace(const ConvArgs& a, const Geometry& geo, ConvWorkspace& ws) const;

  // Precondition: reserve_workspace(a, geo, ws) was called with the same shapes and
  // thread count (checked; throws std::invalid_argument otherwise).
  void run(const ConvArgs& a, const Geometry& geo, ConvWorkspace& ws) const;

  bool depthwise() const { return depthwise_; }
  Isa isa() const { return isa_; }
  int64_t M() const { return M_; }
  int64_t Cg() const { return Cg_; }
  int64_t group() const { return group_; }
  const Attributes& attributes() const { return attrs_; }
  bool weights_unsigned() const { return w_unsigned_; }
  std::string kernel_name(bool channels_last = false) const;
  size_t packed_bytes() const;

 private:
  struct Plan;  // conv/kernels.h
  Plan make_plan(const ConvArgs& a, const Geometry& geo) const;
  void plan_depthwise(const Geometry& geo, Plan& pl) const;                    // conv.cc
  void plan_im2col(const ConvArgs& a, const Geometry& geo, Plan& pl) const;    // conv_gemm.cc
  void plan_implicit(const ConvArgs& a, const Geometry& geo, Plan& pl) const;  // conv_gemm.cc
  void plan_depthwise_nhwc(const Geometry& geo, Plan& pl) const;               // conv.cc
  void run_depthwise(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const;
  void run_depthwise_nhwc(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const;
  void run_transposed(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const;
  void add_transposed_buffers(const ConvArgs& a, const Geometry& geo, Plan& pl) const;
  bool depthwise_via_nhwc(const Geometry& geo, int threads) const;  // NCHW depthwise through the channels_last kernel
  void run_depthwise_flat(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws,
                          const DepthwiseNhwc& base) const;                  // conv.cc
  void plan_direct(const ConvArgs& a, const Geometry& geo, Plan& pl) const;  // conv_gemm.cc
  void run_direct(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const;
  void run_im2col(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const;
  void run_implicit(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const;
  bool pointwise_nchw(const Geometry& geo) const;  // conv_gemm.cc
  void plan_pointwise_nchw(const ConvArgs& a, const Geometry& geo, Plan& pl) const;
  void run_pointwise_nchw(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const;
  qgemm::QGemmParams pointwise_gemm_params(const ConvArgs& a) const;

  // The implicit path applies: tap chunks of whole k-groups and a GEMM family whose tiles
  // read x' through row pointers (the packed weights' family: uint8 x' in place, or, for
  // avx2's int16 family (8-bit weights), an image widened to int16, kernels of more than
  // one tap only). Defined in conv.cc.
  bool implicit_path() const;
  // K of one tap chunk of the implicit path: kw·Cg (dw = 1, one group) or Cg.
  int64_t implicit_chunk_k() const {
    return attrs_.dilations[attrs_.spatial_rank - 1] == 1 && group_ == 1 ? kw_ * Cg_ : Cg_;
  }
  // A 1x1, stride-1, unpadded, one-group convolution with whole k-groups of channels: on
  // uint8 NHWC data a plain GEMM over the pixels (the im2col path reading x in place).
  bool pointwise_gemm() const {
    bool unpadded = attrs_.auto_pad == AutoPad::kNotSet || attrs_.auto_pad == AutoPad::kValid;
    for (int i = 0; i < 2 * attrs_.spatial_rank; ++i) unpadded = unpadded && attrs_.pads[i] == 0;
    bool unit_stride = true;
    for (int i = 0; i < attrs_.spatial_rank; ++i) unit_stride = unit_stride && attrs_.strides[i] == 1;
    return kh_ == 1 && kw_ == 1 && group_ == 1 && Kp_ == Cg_ && unpadded && unit_stride;
  }

  Isa isa_ = Isa::kPortable;
  int64_t M_ = 0, Cg_ = 0, group_ = 1, kh_ = 1, kw_ = 1;
  int64_t K_ = 0, Kp_ = 0;  // reduction length Cg·kh·kw and its multiple of 4
  bool w_unsigned_ = false;
  bool depthwise_ = false;
  Attributes attrs_;
  std::vector<std::shared_ptr<qgemm::PackedWeights>> packed_;  // one per group (gemm path)
  DepthwiseWeights dw_;
  // direct small-C kernel (channels_last, avx512vnni and avx2; kernels.h "Direct, small C")
  bool direct_ = false;
  int64_t direct_groups_ = 0;
  std::vector<int8_t> direct_w_;     // avx512vnni
  std::vector<int16_t> direct_w16_;  // avx2
  std::vector<int32_t> direct_cs_;   // Σ (w − zw) per output channel
  // pointwise NCHW path (1x1, one group): w [M, Cg] as qgemm's x operand (the caller's
  // bytes when borrowed, else pw_w_own_), and zw
  const uint8_t* pw_w_ = nullptr;
  std::vector<uint8_t> pw_w_own_;
  std::vector<int32_t> pw_zw_;      // M values, or 1
  std::vector<int32_t> pw_rowsum_;  // Σ_c w'[m, c], w' = w + 128 for int8 w (qgemm's x')
};

}  // namespace conv
}  // namespace quanta
