// conv driver: weight packing, geometry, the plan of a call, and the depthwise path (the
// im2col and implicit paths are in conv_gemm.cc). Contract and paths: conv.h.
//
// depthwise path, per call: units = (n, c) planes (or row blocks of them when there are
// fewer than 4 planes per thread); per unit, the input rows it needs are copied into the
// thread's padded buffer (flipped for int8 x; the pad columns, zx', are filled once per
// call and thread) unless the kernel reads the plane directly (kernels.h "Direct mode"),
// then one depthwise_rows_<isa> call writes the NCHW output rows.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "conv/kernels.h"
#include "gemm/batched_qgemm.h"
#include "qgemm/kernel.h"

namespace quanta {
namespace conv {
namespace {

constexpr int64_t kUnitsPerThread = 4;  // a few work items per thread: a late thread costs little
constexpr int64_t kDwFlatBandRows = 8;  // flat depthwise: rows of a band per row it prepares twice
// NCHW depthwise planes of at most this many output pixels (stride 1) run through the
// channels_last kernel between two transposes: the per-plane work of the NCHW kernel is
// too short there (measured, 1 thread: 960 ch at 7x7 0.067 -> 0.026 ms, 128 at 28x28
// 0.069 -> 0.051; 48 at 56x56 0.073 -> 0.091 and every stride-2 layer slower).
// With more threads the NCHW kernel splits its planes well and the bound is lower (2
// threads, 128 at 28x28: NCHW 0.040 ms, transposed 0.051-0.060; 960 at 7x7: 0.044 / 0.027).
constexpr int64_t kDwTransposedPixels = 1024;
constexpr int64_t kDwTransposedPixels2 = 256;
// Below this many input bytes the transposed path runs on one thread (960 ch at 7x7, two
// threads 0.031-0.038 ms, one 0.027); above it each pass splits over the threads.
constexpr int64_t kDwTransposedParallelBytes = 256 * 1024;

std::string str(int64_t v) { return std::to_string(v); }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

using DepthwiseFn = void (*)(const DepthwiseRows&);
DepthwiseFn depthwise_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return depthwise_rows_avx512vnni;
    case Isa::kAvx2: return depthwise_rows_avx2;
    case Isa::kPortable: break;
  }
  return depthwise_rows_portable;
}

// Names from the dispatch table (dispatch.h), whose rows match the ISA the kernel was built for.
const char* depthwise_name(Isa isa) { return select_kernel("qconv_depthwise", "u8s8->s32", isa)->kernel; }

// Flat rows (kernels.h) when C is not a multiple of 64 (else every lane of the 64c4
// kernel is used already, and it measured faster: 960 at 7x7 1.01x ORT vs 0.93x flat, 128
// at 28x28 1.26x vs 1.16x, same runs) and lcm(C, 64) is at most 24 vectors (the
// per-channel tables of C = 3, 7, 17, 24, 48, 96, 144 ... stay small: 24·64 entries are
// 18 KiB of 3x3 weights).
constexpr int64_t kMaxFlatBlocks = 24;

bool use_flat_rows(Isa isa, int64_t C, int64_t sw) {
  return isa == Isa::kAvx512Vnni && sw == 1 && C % 64 != 0 && dw_flat_blocks(C) <= kMaxFlatBlocks;
}

const char* depthwise_nhwc_name(Isa isa, bool flat) {
  return select_kernel(flat ? "qconv_depthwise_nhwc_flat" : "qconv_depthwise_nhwc", "u8s8->s32", isa)->kernel;
}

// The weight zero point of output channel m.
int32_t zp_of(const int32_t* zp, bool per_channel, int64_t m) { return zp[per_channel ? m : 0]; }

int32_t weight_at(const void* w, bool w_unsigned, int64_t i) {
  return w_unsigned ? static_cast<int32_t>(static_cast<const uint8_t*>(w)[i])
                    : static_cast<int32_t>(static_cast<const int8_t*>(w)[i]);
}

// Pads and output size of one spatial axis (conv_geometry.py resolve_pads / output_spatial).
void resolve_axis(int64_t size, int64_t k, int64_t s, int64_t d, int64_t pad_begin, int64_t pad_end, AutoPad mode,
                  int axis, int64_t* begin, int64_t* end, int64_t* out) {
  const int64_t extent = d * (k - 1) + 1;
  if (mode == AutoPad::kNotSet) {
    *begin = pad_begin;
    *end = pad_end;
  } else if (mode == AutoPad::kValid) {
    *begin = *end = 0;
  } else {
    const int64_t o = div_up(size, s);
    const int64_t total = std::max<int64_t>(0, (o - 1) * s + extent - size);
    const int64_t small = total / 2, big = total - total / 2;
    *begin = mode == AutoPad::kSameUpper ? small : big;
    *end = mode == AutoPad::kSameUpper ? big : small;
  }
  const int64_t span = size + *begin + *end - extent;
  require(span >= 0, "kernel: expected a dilated kernel extent <= padded input (" + str(size + *begin + *end) +
                         ") on spatial axis " + std::to_string(axis) + ", got " + str(extent));
  *out = span / s + 1;
}

using DepthwiseNhwcFn = void (*)(const DepthwiseNhwc&);
DepthwiseNhwcFn depthwise_nhwc_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return depthwise_nhwc_avx512vnni;
    case Isa::kAvx2: return depthwise_nhwc_avx2;
    case Isa::kPortable: break;
  }
  return depthwise_nhwc_portable;
}

// The channel of entry e of the channels_last per-channel arrays, or -1 (padding).
int64_t nhwc_channel(const DepthwiseWeights& d, int64_t e) { return d.nhwc_flat ? e % d.C : e < d.C ? e : -1; }

// The channels_last weights (kernels.h "Depthwise, channels_last", and "flat rows" when
// d.nhwc_flat) from d.taps / zero_point.
void pack_depthwise_nhwc(Isa isa, int64_t sh, int64_t sw, int64_t dh, DepthwiseWeights& d) {
  const int64_t C = d.C, taps = d.kh * d.kw, block = dw_nhwc_block(isa);
  d.nhwc_flat = use_flat_rows(isa, C, sw);
  d.nhwc_vtail = d.nhwc_flat && d.kh == 5 && d.kw == 5 && sh == 1 && dh == 1;
  const int64_t cpad = d.nhwc_flat ? dw_flat_blocks(C) * 64 : round_up(C, block);
  d.nhwc_cpad = cpad;
  auto w_eff = [&](int64_t e, int64_t t) -> int32_t {
    const int64_t c = nhwc_channel(d, e);
    return c >= 0 && t < taps ? d.taps[c * taps + t] : 0;
  };
  if (isa == Isa::kAvx512Vnni) {
    // 64c4: groups of 4 taps in tap order; flat rows: per kernel row ky, groups of 4 of
    // its kw taps (kernels.h "flat rows": the prepared rows' groups)
    const int64_t gx = div_up(d.kw, 4), groups = d.nhwc_flat ? d.kh * gx : div_up(taps, 4);
    auto tap_of = [&](int64_t q, int64_t i) -> int64_t {
      if (!d.nhwc_flat) return 4 * q + i;
      if (d.nhwc_vtail) {  // (ky, 0..3) for q < 5, (0..3, 4) for q = 5, (4, 4) in slot q − 6
        return q < 5 ? q * 5 + i : q == 5 ? i * 5 + 4 : i == q - 6 ? 24 : taps;
      }
      const int64_t kx = q % gx * 4 + i;
      return kx < d.kw ? q / gx * d.kw + kx : taps;  // taps: past the kernel row (0)
    };
    d.nhwc_taps.assign(static_cast<size_t>(cpad * groups * 4), 0);
    for (int64_t c = 0; c < cpad; ++c) {
      const int64_t b = c / 64, at = dw_nhwc_index(isa, c) % 64;
      for (int64_t q = 0; q < groups; ++q) {
        for (int64_t t = 0; t < 4; ++t) {
          d.nhwc_taps[static_cast<size_t>(((b * groups + q) * 64 + at) * 4 + t)] =
              static_cast<uint8_t>(static_cast<int8_t>(w_eff(c, tap_of(q, t))));
        }
      }
    }
  } else if (isa == Isa::kAvx2) {
    const int64_t pairs = div_up(taps, 2);
    d.nhwc_taps.assign(static_cast<size_t>(pairs * cpad * 2 * 2), 0);
    int16_t* w = reinterpret_cast<int16_t*>(d.nhwc_taps.data());
    for (int64_t p = 0; p < pairs; ++p) {
      for (int64_t c = 0; c < cpad; ++c) {
        const int64_t at = dw_nhwc_index(isa, c, C);
        w[(p * cpad + at) * 2] = static_cast<int16_t>(w_eff(c, 2 * p));
        w[(p * cpad + at) * 2 + 1] = static_cast<int16_t>(w_eff(c, 2 * p + 1));
      }
    }
  } else {
    d.nhwc_taps.assign(static_cast<size_t>(taps * C), 0);
    for (int64_t t = 0; t < taps; ++t) {
      for (int64_t c = 0; c < C; ++c) d.nhwc_taps[t * C + c] = static_cast<uint8_t>(static_cast<int8_t>(w_eff(c, t)));
    }
  }
  bool any_zw = false;
  for (int64_t c = 0; c < C; ++c) any_zw = any_zw || d.zero_point[c] != 0;
  d.nhwc_zero_point.clear();
  if (any_zw) {
    d.nhwc_zero_point.assign(static_cast<size_t>(cpad), 0);
    for (int64_t e = 0; e < cpad; ++e) {
      const int64_t c = nhwc_channel(d, e);
      if (c >= 0) d.nhwc_zero_point[dw_nhwc_index(isa, e, C)] = d.zero_point[c];
    }
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// Construction: packing.
// ---------------------------------------------------------------------------------------

std::shared_ptr<QConv> QConv::create(const void* w, bool w_unsigned, int64_t M, int64_t Cg, int64_t group,
                                     const int32_t* zero_point, bool zero_point_per_channel, const Attributes& attrs,
                                     Isa isa, bool borrow_w) {
  require(attrs.spatial_rank == 1 || attrs.spatial_rank == 2, "conv: expected 1 or 2 spatial axes");
  require(M >= 1 && Cg >= 1, "w: expected at least one output and one input channel");
  require(group >= 1 && M % group == 0,
          "group: expected a divisor of M=" + str(M) + " (output channels), got " + str(group));
  auto c = std::make_shared<QConv>();
  c->isa_ = isa;
  c->M_ = M;
  c->Cg_ = Cg;
  c->group_ = group;
  c->attrs_ = attrs;
  c->w_unsigned_ = w_unsigned;
  c->kh_ = attrs.spatial_rank == 2 ? attrs.kernel[0] : 1;
  c->kw_ = attrs.spatial_rank == 2 ? attrs.kernel[1] : attrs.kernel[0];
  const int64_t kh = c->kh_, kw = c->kw_, taps = kh * kw;
  c->K_ = Cg * taps;
  c->Kp_ = round_up(c->K_, 4);
  c->depthwise_ = Cg == 1 && M == group;

  if (c->depthwise_) {
    DepthwiseWeights& d = c->dw_;
    d.C = M;
    d.kh = kh;
    d.kw = kw;
    d.groups4 = div_up(kw, 4);
    d.taps4.assign(static_cast<size_t>(M * kh * d.groups4), 0);
    d.taps.assign(static_cast<size_t>(M * taps), 0);
    d.zero_point.assign(static_cast<size_t>(M), 0);
    d.column_sums.assign(static_cast<size_t>(M), 0);
    const bool two_d = attrs.spatial_rank == 2;
    dw_gather_tables(two_d ? attrs.strides[1] : attrs.strides[0], two_d ? attrs.dilations[1] : attrs.dilations[0], kw,
                     d.gather_perm, d.gather_perm2, d.gather_full, d.gather_last);
    for (int64_t m = 0; m < M; ++m) {
      const int32_t zw = zp_of(zero_point, zero_point_per_channel, m);
      // w_eff = w − zw when every tap of the channel fits int8 (no Σx' term), else w'.
      bool fits = true;
      uint32_t cs = 0;
      for (int64_t t = 0; t < taps; ++t) {
        const int32_t v = weight_at(w, w_unsigned, m * taps + t) - zw;
        fits = fits && v >= -128 && v <= 127;
        cs += static_cast<uint32_t>(v);
      }
      d.column_sums[m] = static_cast<int32_t>(cs);
      const int32_t shift = w_unsigned ? 128 : 0;
      d.zero_point[m] = fits ? 0 : zw - shift;
      for (int64_t ky = 0; ky < kh; ++ky) {
        for (int64_t kx = 0; kx < kw; ++kx) {
          const int32_t raw = weight_at(w, w_unsigned, (m * kh + ky) * kw + kx);
          const int8_t v = static_cast<int8_t>(fits ? raw - zw : raw - shift);
          d.taps[(m * kh + ky) * kw + kx] = v;
          const int64_t word = (m * kh + ky) * d.groups4 + kx / 4;
          uint32_t packed = static_cast<uint32_t>(d.taps4[word]);
          packed |= static_cast<uint32_t>(static_cast<uint8_t>(v)) << (8 * (kx % 4));
          d.taps4[word] = static_cast<int32_t>(packed);
        }
      }
    }
    pack_depthwise_nhwc(isa, two_d ? attrs.strides[0] : 1, two_d ? attrs.strides[1] : attrs.strides[0],
                        two_d ? attrs.dilations[0] : 1, d);
    return c;
  }

  if (group == 1 && taps == 1) {  // the pointwise NCHW path's operands (conv_gemm.cc)
    // the operand is w's own bytes: int8 and uint8 weights alike are qgemm's x as stored
    if (borrow_w) {
      c->pw_w_ = static_cast<const uint8_t*>(w);
    } else {
      const auto* bytes = static_cast<const uint8_t*>(w);
      c->pw_w_own_.assign(bytes, bytes + M * Cg);
      c->pw_w_ = c->pw_w_own_.data();
    }
    c->pw_rowsum_.assign(static_cast<size_t>(M), 0);
    for (int64_t i = 0; i < M * Cg; ++i) {
      const int32_t v = weight_at(w, w_unsigned, i);
      c->pw_rowsum_[i / Cg] = static_cast<int32_t>(static_cast<uint32_t>(c->pw_rowsum_[i / Cg]) +
                                                   static_cast<uint32_t>(v + (w_unsigned ? 0 : 128)));  // wraps
    }
    const int64_t n_zw = zero_point_per_channel ? M : 1;
    c->pw_zw_.assign(zero_point, zero_point + n_zw);
  }

  // gemm path: per group, W_g[k, j] = w[g·Mg + j, c, ky, kx] with k = (ky·kw + kx)·Cg + c
  // (the im2col row order); rows K .. Kp − 1 hold zw so that they add nothing.
  const int64_t Mg = M / group;
  std::vector<uint8_t> wg(static_cast<size_t>(c->Kp_ * Mg));
  std::vector<int32_t> zg(static_cast<size_t>(Mg));
  for (int64_t g = 0; g < group; ++g) {
    for (int64_t j = 0; j < Mg; ++j) {
      const int64_t m = g * Mg + j;
      const int32_t zw = zp_of(zero_point, zero_point_per_channel, m);
      zg[j] = zw;
      for (int64_t ci = 0; ci < Cg; ++ci) {
        for (int64_t t = 0; t < taps; ++t) {
          const int32_t v = weight_at(w, w_unsigned, (m * Cg + ci) * taps + t);
          wg[(t * Cg + ci) * Mg + j] = static_cast<uint8_t>(v);
        }
      }
      for (int64_t k = c->K_; k < c->Kp_; ++k) wg[k * Mg + j] = static_cast<uint8_t>(zw);
    }
    c->packed_.push_back(
        qgemm::pack_weights(wg.data(), w_unsigned, c->Kp_, Mg, Mg, zg.data(), zero_point_per_channel, isa));
  }

  // direct small-C kernel: channels not a multiple of 4 (else the implicit path reads
  // whole k-groups already), one group, dw = 1, a kernel row run of <= 64 bytes, M <= 64;
  // avx512vnni also needs w − zw in int8 for every weight (no Σx' term), while avx2's
  // int16 weights hold any w − zw; avx2 leaves a 1x1 convolution to its GEMM (the
  // transposed x rows are the GEMM rows, no im2col copy)
  const int64_t dil_w = attrs.dilations[attrs.spatial_rank - 1];
  const bool avx2 = isa == Isa::kAvx2;
  bool direct = (isa == Isa::kAvx512Vnni || (avx2 && taps > 1)) && group == 1 && Cg % 4 != 0 && dil_w == 1 &&
                kw * Cg <= 64 && M <= 64;
  for (int64_t m = 0; direct && !avx2 && m < M; ++m) {
    const int32_t zw = zp_of(zero_point, zero_point_per_channel, m);
    for (int64_t i = 0; direct && i < Cg * taps; ++i) {
      const int32_t v = weight_at(w, w_unsigned, m * Cg * taps + i) - zw;
      direct = v >= -128 && v <= 127;
    }
  }
  if (direct) {
    c->direct_ = true;
    // groups of 4 k (vpdpbusd, 16 lanes a block) or pairs (vpmaddwd, 8 lanes a block)
    const int64_t per = avx2 ? 2 : 4, lanes = avx2 ? 8 : 16;
    const int64_t groups = div_up(kw * Cg, per), mb = div_up(M, lanes);
    c->direct_groups_ = groups;
    if (avx2) {
      c->direct_w16_.assign(static_cast<size_t>(kh * groups * mb * lanes * per), 0);
    } else {
      c->direct_w_.assign(static_cast<size_t>(kh * groups * mb * lanes * per), 0);
    }
    c->direct_cs_.assign(static_cast<size_t>(M), 0);
    for (int64_t m = 0; m < M; ++m) {
      const int32_t zw = zp_of(zero_point, zero_point_per_channel, m);
      uint32_t cs = 0;
      for (int64_t ky = 0; ky < kh; ++ky) {
        for (int64_t k = 0; k < kw * Cg; ++k) {
          const int64_t kx = k / Cg, ci = k % Cg;
          const int32_t v = weight_at(w, w_unsigned, ((m * Cg + ci) * kh + ky) * kw + kx) - zw;
          cs += static_cast<uint32_t>(v);
          const int64_t q = k / per, t = k % per;
          const size_t at = static_cast<size_t>((((ky * groups + q) * mb + m / lanes) * lanes + m % lanes) * per + t);
          if (avx2) {
            c->direct_w16_[at] = static_cast<int16_t>(v);
          } else {
            c->direct_w_[at] = static_cast<int8_t>(v);
          }
        }
      }
      c->direct_cs_[m] = static_cast<int32_t>(cs);
    }
  }
  return c;
}

std::string QConv::kernel_name(bool channels_last) const {
  if (depthwise_ && channels_last) return depthwise_nhwc_name(isa_, dw_.nhwc_flat);
  if (direct_) return select_kernel("qconv_direct", "u8s8->s32", isa_)->kernel;  // NCHW: between two transposes
  if (depthwise_) return depthwise_name(isa_);
  // (uint8 x; int8 x takes the implicit path, which this name does not tell)
  const std::string gemm = packed_.empty() ? qgemm::qgemm_kernel_name(isa_) : qgemm::qgemm_kernel_name(*packed_[0]);
  if (channels_last && pointwise_gemm()) return "qconv_gemm+" + gemm;
  const bool implicit = implicit_path();
  return std::string(implicit ? "qconv_implicit" : "qconv_im2col") + "+" + gemm;
}

bool QConv::implicit_path() const {
  if (packed_.empty()) return false;
  const qgemm::KernelFamily& f = qgemm::kernel_family(*packed_[0]);
  if (implicit_chunk_k() % f.kr != 0) return false;
  // The int16 family (avx2, 8-bit weights) reads a padded image widened to int16: twice
  // the image's bytes written once, against im2col's kh·kw copies of each x' byte and their
  // int16 copy per qgemm call. A 1x1 kernel has no copies to save (pointwise / im2col rows).
  if (f.a_bytes != 1 && (f.isa != Isa::kAvx2 || kh_ * kw_ == 1)) return false;
  // one family for every group (avx2 packs each group's weights for the family they fit)
  for (const auto& w : packed_) {
    if (&qgemm::kernel_family(*w) != &f) return false;
  }
  return true;
}

size_t QConv::packed_bytes() const {
  size_t n = 0;
  for (const auto& p : packed_) n += p->data.size() + p->column_sums.size() + p->zero_point.size();
  n += dw_.taps4.size() * 4 + dw_.taps.size() + dw_.zero_point.size() * 4 + dw_.column_sums.size() * 4;
  return n;
}

// ---------------------------------------------------------------------------------------
// Geometry and plan.
// ---------------------------------------------------------------------------------------

Geometry QConv::resolve(int64_t N, int64_t C, int64_t H, int64_t W) const {
  require(C == Cg_ * group_, "x: expected " + str(Cg_ * group_) + " channels (w.shape[1] " + str(Cg_) + " * group " +
                                 str(group_) + "), got " + str(C));
  Geometry g;
  g.N = N;
  g.C = C;
  g.H = H;
  g.W = W;
  g.M = M_;
  g.kh = kh_;
  g.kw = kw_;
  const Attributes& a = attrs_;
  if (a.spatial_rank == 2) {
    g.sh = a.strides[0];
    g.sw = a.strides[1];
    g.dh = a.dilations[0];
    g.dw = a.dilations[1];
    resolve_axis(H, kh_, g.sh, g.dh, a.pads[0], a.pads[2], a.auto_pad, 0, &g.pad_top, &g.pad_bottom, &g.OH);
    resolve_axis(W, kw_, g.sw, g.dw, a.pads[1], a.pads[3], a.auto_pad, 1, &g.pad_left, &g.pad_right, &g.OW);
  } else {
    require(H == 1, "x: a 1-D convolution runs as H = 1");
    g.sw = a.strides[0];
    g.dw = a.dilations[0];
    g.OH = 1;
    resolve_axis(W, kw_, g.sw, g.dw, a.pads[0], a.pads[1], a.auto_pad, 0, &g.pad_left, &g.pad_right, &g.OW);
  }
  return g;
}

// NHWC copies of x and y after the main buffer of a channels_last plan.
void QConv::add_transposed_buffers(const ConvArgs& a, const Geometry& geo, Plan& pl) const {
  pl.off_xt = align64(pl.main_bytes);
  pl.off_yt = pl.off_xt + align64(static_cast<size_t>(geo.N * geo.H * geo.W * geo.C));
  pl.main_bytes = pl.off_yt + align64(static_cast<size_t>(geo.N * geo.OH * geo.OW * M_ * out_bytes(a.out_type)));
}

bool QConv::depthwise_via_nhwc(const Geometry& geo, int threads) const {
  // QUANTA_CONV_DW_PATH=planes|transposed pins the path (the tests run both on every case)
  if (const char* e = std::getenv("QUANTA_CONV_DW_PATH")) {
    if (std::strcmp(e, "planes") == 0) return false;
    if (std::strcmp(e, "transposed") == 0) return true;
  }
  if (isa_ == Isa::kAvx2 && dw_pairs_fit(geo.sw, geo.dw, geo.kh, geo.kw)) {
    // the pair kernel computes 16 pixels of a row per block: it beats the transposes down
    // to rows of 16 (measured, 1 thread, time / ORT's: 128 at 28x28 0.86 planes, 1.11
    // transposed), not below (960 at 7x7: 2.6 / 1.1; 144 at 28x28 stride 2, OW 14:
    // 1.17 / 0.97)
    return geo.OW < 16;
  }
  const int64_t pixels = geo.OH * geo.OW;
  return geo.sh == 1 && geo.sw == 1 && pixels <= (threads == 1 ? kDwTransposedPixels : kDwTransposedPixels2);
}

QConv::Plan QConv::make_plan(const ConvArgs& a, const Geometry& geo) const {
  Plan pl;
  pl.threads = std::max(1, a.num_threads);
  if (depthwise_ && a.channels_last) {
    pl.path = Path::kDepthwiseNhwc;
    plan_depthwise_nhwc(geo, pl);
  } else if (depthwise_ && depthwise_via_nhwc(geo, pl.threads)) {
    pl.path = Path::kDepthwiseTransposed;
    // three short passes: a second thread costs more than it saves (cache lines move
    // between the cores from one pass to the next)
    if (geo.N * geo.C * geo.H * geo.W < kDwTransposedParallelBytes) pl.threads = 1;
    plan_depthwise_nhwc(geo, pl);
    add_transposed_buffers(a, geo, pl);
  } else if (depthwise_) {
    pl.path = Path::kDepthwise;
    plan_depthwise(geo, pl);
  } else if (direct_) {
    // NCHW: between two transposes, as the im2col path would have them anyway (the
    // 3-channel stem at 224x224: 0.33 -> 0.15 ms, one thread)
    pl.path = a.channels_last ? Path::kDirect : Path::kDirectTransposed;
    plan_direct(a, geo, pl);
    if (!a.channels_last) add_transposed_buffers(a, geo, pl);
  } else if (!a.channels_last && pointwise_nchw(geo)) {
    pl.path = Path::kPointwiseNchw;
    plan_pointwise_nchw(a, geo, pl);
  } else if (a.channels_last && !a.x_signed && pointwise_gemm()) {
    // A pointwise convolution on uint8 NHWC data is a plain GEMM over the pixels, x read
    // in place: qgemm's own tiles (one A stride) beat the per-row pointers of the
    // implicit path here (ResNet-50 1x1 256->64 @56²: 611 vs 591 GOPS, one thread).
    pl.path = Path::kIm2col;
    plan_im2col(a, geo, pl);
  } else if (implicit_path()) {
    pl.path = Path::kImplicit;
    plan_implicit(a, geo, pl);
  } else {
    pl.path = Path::kIm2col;
    plan_im2col(a, geo, pl);
  }
  return pl;
}

void QConv::plan_depthwise(const Geometry& geo, Plan& pl) const {
  const int64_t planes = geo.N * geo.C;
  const int64_t want_units = int64_t{pl.threads} * kUnitsPerThread;
  const int64_t splits = planes >= want_units || pl.threads == 1 ? 1 : div_up(want_units, std::max<int64_t>(1, planes));
  pl.dw_rows_per_unit = std::max<int64_t>(1, div_up(geo.OH, splits));
  pl.dw_row_blocks = div_up(geo.OH, pl.dw_rows_per_unit);
  pl.units = planes * pl.dw_row_blocks;
  // Direct mode only for narrow rows and one tap group per row: there the padded copy
  // costs as much as the taps, elsewhere the masked loads cost more than the copy
  // (measured, time: 3x3 at 7x7 -9 %, at 28x28 stride 2 -20 %, at 112x112 +28 %;
  // 5x5 at 14x14 +27 %).
  pl.dw_direct = isa_ == Isa::kAvx512Vnni && dw_gather_fits(geo.sw, geo.dw, geo.kw) && dw_.groups4 == 1 && geo.OW <= 16;
  pl.dw_stride = depthwise_row_stride(geo.OW, geo.sw, geo.dw, dw_.groups4);
  pl.dw_in_rows = (pl.dw_rows_per_unit - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1;
  pl.thread_bytes = pl.dw_direct ? 0 : align64(static_cast<size_t>(pl.dw_in_rows * pl.dw_stride));
  // avx2 pair kernel: int16 rows it builds from the plane itself (no uint8 copy)
  pl.dw_pairs = isa_ == Isa::kAvx2 && dw_pairs_fit(geo.sw, geo.dw, geo.kh, geo.kw);
  if (pl.dw_pairs)
    pl.thread_bytes = align64(static_cast<size_t>(pl.dw_in_rows * dw_pairs_width(geo.OW, geo.sw, geo.kw)) * 2);
  pl.n_thread_ws = pl.dw_direct ? 0 : pl.threads;
  pl.off_colterm = 0;
  pl.off_ready = align64(static_cast<size_t>(geo.C) * 4);
  pl.main_bytes = pl.off_ready + align64(static_cast<size_t>(pl.threads));
}

void QConv::plan_depthwise_nhwc(const Geometry& geo, Plan& pl) const {
  // units = output rows (n, oy); each builds its row's tap pointers, then one kernel call.
  // Flat rows: units = bands of dw_rows_per_unit rows (n, oy0 .. oy1), one kernel call
  // each, which prepares each x row of the band once per strip (kernels.h). A band
  // prepares (kh − 1)·dh x rows beyond its own, and preparing a row costs about as much
  // as the taps of an output row (5x5: half the layer's time), so a band has at least
  // kDwFlatBandRows of them per extra row (the extra preparation at most an eighth) and
  // the bands of an image are a multiple of the threads (whole home ranges: 3 bands on
  // 2 threads run as 2 + 1); up to kUnitsPerThread a thread. With 4-row bands on 2
  // threads, EfficientNet-Lite0's 5x5 28x28 layer did 1.24-1.41x the work of one band,
  // its 3x3 14x14 layers 1.14-1.23x (the 2-thread plans run on one thread); with these
  // bands 1.03-1.20x and 1.02-1.06x. Two bands of a 14-row 5x5 layer still prepare 22
  // rows for 18 (1.12-1.27x): only a split along the row would remove that.
  const int64_t taps = geo.kh * geo.kw;
  pl.units = geo.N * geo.OH;
  if (dw_.nhwc_flat) {
    // (a batch of no image, or no output row, still gets one band: nothing to divide by)
    int64_t bands = 1;
    if (pl.threads > 1) {
      const int64_t min_rows = std::max<int64_t>(4, kDwFlatBandRows * (geo.kh - 1) * geo.dh);
      const int64_t per_image = std::max<int64_t>(1, div_up(int64_t{pl.threads}, std::max<int64_t>(1, geo.N)));
      // per_image bands a step, while every band keeps min_rows rows and a thread gets
      // at most kUnitsPerThread bands in all
      bands = per_image;
      while (bands + per_image <= geo.OH && geo.OH / (bands + per_image) >= min_rows &&
             (bands + per_image) * std::max<int64_t>(1, geo.N) <= int64_t{pl.threads} * kUnitsPerThread) {
        bands += per_image;
      }
      bands = std::min(bands, std::max<int64_t>(1, geo.OH));
    }
    pl.dw_rows_per_unit = std::max<int64_t>(1, div_up(geo.OH, bands));
    pl.dw_row_blocks = div_up(geo.OH, pl.dw_rows_per_unit);
    pl.units = geo.N * pl.dw_row_blocks;
  }
  pl.off_ptrs = 0;  // tap pointers, or the flat rows' kernel call's scratch
  pl.off_scratch = align64(static_cast<size_t>(std::max<int64_t>(geo.OW, 4) * taps) * 8);
  pl.thread_bytes = pl.off_scratch + align64(dw_nhwc_scratch_bytes(geo.C, taps));
  if (dw_.nhwc_flat) pl.thread_bytes = align64(dw_flat_scratch_bytes(geo.kh, geo.dh, geo.kw));
  pl.n_thread_ws = pl.threads;
  const int64_t cpad = dw_.nhwc_cpad;
  pl.off_colterm = 0;
  pl.off_mult = align64(static_cast<size_t>(cpad) * 4);
  pl.off_padrow = pl.off_mult + align64(static_cast<size_t>(cpad) * 4);
  pl.off_tapoff = pl.off_padrow + align64(static_cast<size_t>(cpad) + 64);
  pl.off_flat = pl.off_tapoff + align64(static_cast<size_t>(taps) * 8);  // flat rows: [3][taps] shift, lo, hi
  pl.main_bytes = pl.off_flat + align64(static_cast<size_t>(taps) * 24);
}

void QConv::reserve_workspace(const ConvArgs& a, const Geometry& geo, ConvWorkspace& ws) const {
  const Plan pl = make_plan(a, geo);
  if (ws.main.size() < pl.main_bytes) ws.main.resize(pl.main_bytes);
  if (static_cast<int>(ws.thread_bufs.size()) < pl.n_thread_ws) ws.thread_bufs.resize(pl.n_thread_ws);
  if (static_cast<int>(ws.thread_gemm.size()) < pl.n_thread_ws) ws.thread_gemm.resize(pl.n_thread_ws);
  for (int t = 0; t < pl.n_thread_ws; ++t) {
    if (ws.thread_bufs[t].size() < pl.thread_bytes) ws.thread_bufs[t].resize(pl.thread_bytes);
    ws.thread_gemm[t].reserve(pl.gemm_bytes);
  }
  if (pl.path == Path::kPointwiseNchw) {
    if (static_cast<int>(ws.thread_packed.size()) < pl.n_thread_ws) ws.thread_packed.resize(pl.n_thread_ws);
    for (int t = 0; t < pl.n_thread_ws; ++t) gemm::reserve_packed_weights(ws.thread_packed[t], isa_, geo.C, pl.pw_cols);
  }
}

void QConv::run(const ConvArgs& a, const Geometry& geo, ConvWorkspace& ws) const {
  require(a.out_type == OutType::kS32 || a.multiplier != nullptr, "conv: requantization needs a multiplier");
  const Plan pl = make_plan(a, geo);
  bool ok = ws.main.size() >= pl.main_bytes && static_cast<int>(ws.thread_bufs.size()) >= pl.n_thread_ws &&
            static_cast<int>(ws.thread_gemm.size()) >= pl.n_thread_ws;
  for (int t = 0; ok && t < pl.n_thread_ws; ++t) {
    ok = ws.thread_bufs[t].size() >= pl.thread_bytes && ws.thread_gemm[t].size() >= pl.gemm_bytes;
  }
  ok = ok && (pl.path != Path::kPointwiseNchw || static_cast<int>(ws.thread_packed.size()) >= pl.n_thread_ws);
  require(ok, "conv: workspace too small (call reserve_workspace first)");
  if (geo.N == 0 || geo.OH == 0 || geo.OW == 0) return;
  switch (pl.path) {
    case Path::kDepthwise: run_depthwise(a, geo, pl, ws); break;
    case Path::kDepthwiseNhwc: run_depthwise_nhwc(a, geo, pl, ws); break;
    case Path::kDepthwiseTransposed:
    case Path::kDirectTransposed: run_transposed(a, geo, pl, ws); break;
    case Path::kDirect: run_direct(a, geo, pl, ws); break;
    case Path::kImplicit: run_implicit(a, geo, pl, ws); break;
    case Path::kIm2col: run_im2col(a, geo, pl, ws); break;
    case Path::kPointwiseNchw: run_pointwise_nchw(a, geo, pl, ws); break;
  }
}

// ---------------------------------------------------------------------------------------
// depthwise path.
// ---------------------------------------------------------------------------------------

void QConv::run_depthwise(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const uint8_t flip = a.x_signed ? 0x80 : 0;
  const int32_t zx_shifted = a.zx + (a.x_signed ? 128 : 0);
  const uint8_t pad = static_cast<uint8_t>(zx_shifted);
  const int ob = out_bytes(a.out_type);
  const DepthwiseFn kernel = depthwise_for(isa_);
  const DepthwiseWeights& d = dw_;

  // colterm[c] = bias[c] − zx'·cs[c]  (wrapping), once per call
  int32_t* colterm = reinterpret_cast<int32_t*>(ws.main.data() + pl.off_colterm);
  for (int64_t c = 0; c < geo.C; ++c) {
    const uint32_t b = a.bias ? static_cast<uint32_t>(a.bias[c]) : 0u;
    colterm[c] = static_cast<int32_t>(b - static_cast<uint32_t>(zx_shifted) * static_cast<uint32_t>(d.column_sums[c]));
  }
  float lo = 0.f, hi = 0.f;
  if (a.out_type != OutType::kS32) {
    const OutputRange r = output_range(a);
    lo = static_cast<float>(r.lo - a.zy);
    hi = static_cast<float>(r.hi - a.zy);
  }
  const int64_t hw = geo.H * geo.W, ohw = geo.OH * geo.OW;
  const int64_t copy_begin = std::min(geo.pad_left, pl.dw_stride);
  const int64_t copy_len = std::max<int64_t>(0, std::min(geo.W, pl.dw_stride - copy_begin));
  uint8_t* ready = ws.main.data() + pl.off_ready;  // per thread: its buffer's borders are filled
  std::memset(ready, 0, static_cast<size_t>(pl.threads));

  auto unit_fn = [&](int64_t unit, int thread) {
    const int64_t plane = unit / pl.dw_row_blocks, rb = unit % pl.dw_row_blocks;
    const int64_t n = plane / geo.C, c = plane % geo.C;
    const int64_t oy0 = rb * pl.dw_rows_per_unit, oy1 = std::min(geo.OH, oy0 + pl.dw_rows_per_unit);
    const int64_t rows = oy1 - oy0;
    const int64_t iy_top = oy0 * geo.sh - geo.pad_top;
    const uint8_t* x = static_cast<const uint8_t*>(a.x) + (n * geo.C + c) * hw;
    DepthwiseRows r;
    if (pl.dw_direct || pl.dw_pairs) {
      r.plane = x;
      r.src_h = geo.H;
      r.src_w = geo.W;
      r.src_row0 = iy_top;
      r.src_col0 = -geo.pad_left;
      r.pad = pad;
      r.flip = flip;
      if (pl.dw_pairs) r.scratch16 = reinterpret_cast<int16_t*>(ws.thread_bufs[thread].data());
    } else {
      // Padded rows: column col holds x[iy, col − pad_left], zx' outside x. The columns
      // outside x are filled once per call and thread; a unit then only writes the
      // columns of x (data, or zx' for rows above / below x).
      uint8_t* buf = ws.thread_bufs[thread].data();
      if (!ready[thread]) {
        std::memset(buf, pad, static_cast<size_t>(pl.dw_in_rows * pl.dw_stride));
        ready[thread] = 1;
      }
      const int64_t in_rows = (rows - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1;
      uint8_t* interior = buf + copy_begin;
      for (int64_t row = 0; row < in_rows; ++row) {
        const int64_t iy = iy_top + row;
        if (iy < 0 || iy >= geo.H) {
          std::memset(interior + row * pl.dw_stride, pad, static_cast<size_t>(copy_len));
        } else {
          copy_flipped(x + iy * geo.W, interior + row * pl.dw_stride, copy_len, flip);
        }
      }
      r.in = buf;
      r.in_stride = pl.dw_stride;
    }
    r.rows = rows;
    r.ow = geo.OW;
    r.sh = geo.sh;
    r.sw = geo.sw;
    r.dh = geo.dh;
    r.dw = geo.dw;
    r.kh = geo.kh;
    r.kw = geo.kw;
    r.groups4 = d.groups4;
    r.gather_perm = d.gather_perm;
    r.gather_perm2 = d.gather_perm2;
    r.gather_full = d.gather_full;
    r.gather_last = d.gather_last;
    r.taps4 = d.taps4.data() + c * geo.kh * d.groups4;
    r.taps = d.taps.data() + c * geo.kh * geo.kw;
    r.zw = d.zero_point[c];
    r.colterm = colterm[c];
    r.out_type = a.out_type;
    if (a.out_type != OutType::kS32) {
      r.multiplier = a.multiplier[a.multiplier_per_channel ? c : 0];
      r.zy = a.zy;
      r.lo_minus_zy = lo;
      r.hi_minus_zy = hi;
    }
    r.y = static_cast<uint8_t*>(a.y) + ((n * geo.C + c) * ohw + oy0 * geo.OW) * ob;
    r.y_stride = geo.OW;
    kernel(r);
  };
  run_with_affinity(pl.threads, pl.units, unit_fn);
}

// ---------------------------------------------------------------------------------------
// depthwise path, channels_last.
// ---------------------------------------------------------------------------------------

void QConv::run_depthwise_nhwc(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const int32_t zx_shifted = a.zx + (a.x_signed ? 128 : 0);
  const int ob = out_bytes(a.out_type);
  const DepthwiseWeights& d = dw_;
  const int64_t C = geo.C, taps = geo.kh * geo.kw;

  // per call, in the ISA's channel order: colterm[c] = bias[c] − zx'·cs[c] (wrapping) and
  // the multipliers; a pad pixel of zx (x's own domain: the kernel's flip makes it zx')
  int32_t* colterm = reinterpret_cast<int32_t*>(ws.main.data() + pl.off_colterm);
  float* mult = reinterpret_cast<float*>(ws.main.data() + pl.off_mult);
  uint8_t* pad_pixel = ws.main.data() + pl.off_padrow;
  std::memset(colterm, 0, static_cast<size_t>(d.nhwc_cpad) * 4);
  std::memset(mult, 0, static_cast<size_t>(d.nhwc_cpad) * 4);
  for (int64_t e = 0; e < d.nhwc_cpad; ++e) {
    const int64_t c = nhwc_channel(d, e);
    if (c < 0) continue;
    const int64_t at = dw_nhwc_index(isa_, e, d.C);
    const uint32_t b = a.bias ? static_cast<uint32_t>(a.bias[c]) : 0u;
    colterm[at] = static_cast<int32_t>(b - static_cast<uint32_t>(zx_shifted) * static_cast<uint32_t>(d.column_sums[c]));
    if (a.out_type != OutType::kS32) mult[at] = a.multiplier[a.multiplier_per_channel ? c : 0];
  }
  std::memset(pad_pixel, static_cast<uint8_t>(a.zx), static_cast<size_t>(d.nhwc_cpad) + 64);

  DepthwiseNhwc base;
  base.ow = geo.OW;
  base.taps = taps;
  base.C = C;
  base.cpad = d.nhwc_cpad;
  base.flip = a.x_signed ? 0x80 : 0;
  base.weights = d.nhwc_taps.data();
  base.colterm = colterm;
  base.multiplier = mult;
  base.zw = d.nhwc_zero_point.empty() ? nullptr : d.nhwc_zero_point.data();
  base.out_type = a.out_type;
  if (a.out_type != OutType::kS32) {
    const OutputRange r = output_range(a);
    base.zy = a.zy;
    base.lo_minus_zy = static_cast<float>(r.lo - a.zy);
    base.hi_minus_zy = static_cast<float>(r.hi - a.zy);
  }
  base.y_pixel_stride = C;
  const DepthwiseNhwcFn kernel = depthwise_nhwc_for(isa_);
  const uint8_t* x = static_cast<const uint8_t*>(a.x);
  // tap t = ky·kw + kx of an interior pixel is at (ky·dh·W + kx·dw)·C bytes from its first
  int64_t* tap_offset = reinterpret_cast<int64_t*>(ws.main.data() + pl.off_tapoff);
  for (int64_t ky = 0; ky < geo.kh; ++ky) {
    for (int64_t kx = 0; kx < geo.kw; ++kx) tap_offset[ky * geo.kw + kx] = (ky * geo.dh * geo.W + kx * geo.dw) * C;
  }

  if (d.nhwc_flat) {
    run_depthwise_flat(a, geo, pl, ws, base);
    return;
  }

  auto unit_fn = [&](int64_t unit, int thread) {
    const int64_t n = unit / geo.OH, oy = unit % geo.OH;
    uint8_t* buf = ws.thread_bufs[thread].data();
    const uint8_t** ptrs = reinterpret_cast<const uint8_t**>(buf + pl.off_ptrs);
    const uint8_t* image = x + n * geo.H * geo.W * C;
    const int64_t iy0 = oy * geo.sh - geo.pad_top;
    const bool rows_in = iy0 >= 0 && iy0 + (geo.kh - 1) * geo.dh < geo.H;
    // avx2 reads the pixels with every tap inside x from their corner (kernels.h
    // DepthwiseNhwc::dense_x): they are one run of ox, whose pointers are not written
    const bool dense = isa_ == Isa::kAvx2;
    int64_t dense_begin = 0, dense_end = 0;
    for (int64_t ox = 0; ox < geo.OW; ++ox) {
      const uint8_t** p = ptrs + ox * taps;
      const int64_t ix0 = ox * geo.sw - geo.pad_left;
      if (rows_in && ix0 >= 0 && ix0 + (geo.kw - 1) * geo.dw < geo.W) {  // every tap inside x
        if (dense) {
          if (dense_end == 0) dense_begin = ox;
          dense_end = ox + 1;
          continue;
        }
        const uint8_t* corner = image + (iy0 * geo.W + ix0) * C;
        for (int64_t t = 0; t < taps; ++t) p[t] = corner + tap_offset[t];
        continue;
      }
      for (int64_t ky = 0; ky < geo.kh; ++ky) {
        const int64_t iy = iy0 + ky * geo.dh;
        const bool row_in = iy >= 0 && iy < geo.H;
        for (int64_t kx = 0; kx < geo.kw; ++kx) {
          const int64_t ix = ix0 + kx * geo.dw;
          p[ky * geo.kw + kx] = row_in && ix >= 0 && ix < geo.W ? image + (iy * geo.W + ix) * C : pad_pixel;
        }
      }
    }
    DepthwiseNhwc r = base;
    r.ptrs = ptrs;
    if (dense_end > dense_begin) {
      r.tap_offset = tap_offset;
      r.dense_x = image + (iy0 * geo.W + dense_begin * geo.sw - geo.pad_left) * C;
      r.dense_step = geo.sw * C;
      r.dense_begin = dense_begin;
      r.dense_end = dense_end;
    }
    r.scratch = buf + pl.off_scratch;
    r.y = static_cast<uint8_t*>(a.y) + ((n * geo.OH + oy) * geo.OW) * C * ob;
    kernel(r);
  };
  run_with_affinity(pl.threads, pl.units, unit_fn);
}

// ---------------------------------------------------------------------------------------
// NCHW data through a channels_last path (depthwise, direct) between two transposes.
// ---------------------------------------------------------------------------------------

void QConv::run_transposed(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const int64_t C = geo.C, M = M_, hw = geo.H * geo.W, ohw = geo.OH * geo.OW;
  const int ob = out_bytes(a.out_type);
  uint8_t* xt = ws.main.data() + pl.off_xt;
  uint8_t* yt = ws.main.data() + pl.off_yt;
  const TransposeU8Fn tr_u8 = transpose_u8_for(isa_);
  const TransposeS32Fn tr_s32 = transpose_s32_for(isa_);

  // x [N, C, H·W] -> xt [N, H·W, C], in blocks of 64 channels, or of 4096 pixels when
  // there are few channels (x keeps its domain: the kernels apply the int8 flip)
  const int64_t cb = div_up(C, 64), xpb = C < 64 ? div_up(hw, 4096) : 1;
  auto to_nhwc = [&](int64_t unit, int /*thread*/) {
    const int64_t n = unit / (cb * xpb), c0 = unit / xpb % cb * 64, cn = std::min<int64_t>(64, C - c0);
    const int64_t p0 = unit % xpb * 4096, pn = std::min<int64_t>(4096, hw - p0);
    tr_u8(static_cast<const uint8_t*>(a.x) + (n * C + c0) * hw + p0, hw, cn, pn, xt + (n * hw + p0) * C + c0, C, 0);
  };
  run_with_affinity(pl.threads, geo.N * cb * xpb, to_nhwc);

  ConvArgs t = a;
  t.x = xt;
  t.y = yt;
  t.channels_last = true;
  if (pl.path == Path::kDirectTransposed) {
    run_direct(t, geo, pl, ws);
  } else {
    run_depthwise_nhwc(t, geo, pl, ws);
  }

  // yt [N, OH·OW, M] -> y [N, M, OH·OW], in blocks of 64 pixels
  const int64_t pb = div_up(ohw, 64);
  auto to_nchw = [&](int64_t unit, int /*thread*/) {
    const int64_t n = unit / pb, p0 = unit % pb * 64, pn = std::min<int64_t>(64, ohw - p0);
    const int64_t src = (n * ohw + p0) * M, dst = n * M * ohw + p0;
    if (a.out_type == OutType::kS32) {
      tr_s32(reinterpret_cast<const int32_t*>(yt) + src, M, pn, M, static_cast<int32_t*>(a.y) + dst, ohw);
    } else {
      tr_u8(yt + src * ob, M, pn, M, static_cast<uint8_t*>(a.y) + dst, ohw, 0);
    }
  };
  run_with_affinity(pl.threads, geo.N * pb, to_nchw);
}

}  // namespace conv
}  // namespace quanta

namespace quanta {
namespace conv {

// Flat rows (kernels.h "Depthwise, channels_last, flat rows"; sw = 1, avx512vnni).
void QConv::run_depthwise_flat(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws,
                               const DepthwiseNhwc& base) const {
  const int64_t C = geo.C, n = geo.OW * C;
  // horizontal geometry, the same for every row: tap kx of output pixel ox reads input
  // column ox − pad_left + kx·dw, inside x for ox in [pad_left − kx·dw, W + pad_left − kx·dw)
  int64_t* shift = reinterpret_cast<int64_t*>(ws.main.data() + pl.off_flat);
  int64_t* lo = shift + geo.kw;
  int64_t* hi = lo + geo.kw;
  int64_t lo_max = 0, hi_min = n;
  for (int64_t kx = 0; kx < geo.kw; ++kx) {
    const int64_t left = geo.pad_left - kx * geo.dw;
    shift[kx] = -left * C;
    lo[kx] = std::clamp<int64_t>(left, 0, geo.OW) * C;
    hi[kx] = std::max(lo[kx], std::clamp<int64_t>(geo.W + left, 0, geo.OW) * C);
    lo_max = std::max(lo_max, lo[kx]);
    hi_min = std::min(hi_min, hi[kx]);
  }
  // vectors inside every tap's range read plain loads (a row outside x reads zx in any
  // vector)
  DepthwiseNhwcFlat f;
  f.n = n;
  f.kh = geo.kh;
  f.kw = geo.kw;
  f.blocks = dw_.nhwc_cpad / 64;
  f.H = geo.H;
  f.row_bytes = geo.W * C;
  f.sh = geo.sh;
  f.dh = geo.dh;
  f.pad_top = geo.pad_top;
  f.shift = shift;
  f.lo = lo;
  f.hi = hi;
  f.v_lo = div_up(lo_max, 64);
  f.v_hi = std::max(f.v_lo, hi_min / 64);
  f.zx = static_cast<uint8_t>(a.zx);
  f.flip = base.flip;
  f.weights = base.weights;
  f.colterm = base.colterm;
  f.multiplier = base.multiplier;
  f.zw = base.zw;
  f.out_type = base.out_type;
  f.zy = base.zy;
  f.lo_minus_zy = base.lo_minus_zy;
  f.hi_minus_zy = base.hi_minus_zy;
  f.vtail = dw_.nhwc_vtail;
  const int ob = out_bytes(a.out_type);
  const uint8_t* x = static_cast<const uint8_t*>(a.x);

  auto unit_fn = [&](int64_t unit, int thread) {
    const int64_t img = unit / pl.dw_row_blocks, oy0 = unit % pl.dw_row_blocks * pl.dw_rows_per_unit;
    DepthwiseNhwcFlat r = f;
    r.image = x + img * geo.H * geo.W * C;
    r.oy0 = oy0;
    r.oy1 = std::min(geo.OH, oy0 + pl.dw_rows_per_unit);
    r.scratch = ws.thread_bufs[thread].data() + pl.off_ptrs;
    r.y = static_cast<uint8_t*>(a.y) + (img * geo.OH + oy0) * n * ob;
    depthwise_nhwc_flat_avx512vnni(r);
  };
  run_with_affinity(pl.threads, pl.units, unit_fn);
}

}  // namespace conv
}  // namespace quanta
