// conv driver: geometry, weight packing, the two paths of conv.h and their threads.
//
// gemm path, per call:
//   1. xt = NHWC(x') : transpose of each image [C, H·W] -> [H·W, xt_stride] with the +128
//      flip for int8 x (layout*.cc); parallel over pixel blocks.
//   2. units = (chunk of output pixels) x (group), claimed by the threads; per unit
//        A = im2col rows of the chunk (im2col.cc), or the xt rows themselves (direct 1x1)
//        qgemm(A, packed[g]) -> ybuf [rows, Mg] with the fused output stage (1 thread)
//        ybuf transposed into y[n, g·Mg .., pixels] (NCHW)
//      With fewer units than 2 threads, the units run one after the other and qgemm
//      splits its N panels over the threads instead.
// depthwise path, per call: units = (n, c) planes (or row blocks of them when there are
// fewer than 4 planes per thread); per unit, the input rows it needs are copied padded
// (zx') and flipped into the thread's buffer, then one depthwise_rows_<isa> call.
#include <algorithm>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "conv/kernels.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace conv {
namespace {

// im2col rows + the chunk's NHWC result per unit: ~128 KiB, so that a chunk's A block
// and its output stay in L2 next to the packed weights.
constexpr int64_t kChunkBytes = 128 * 1024;
constexpr int64_t kMinChunkRows = 32;
constexpr int64_t kChunksPerThread = 4;
constexpr int64_t kTransposePixels = 2048;  // pixels per unit of the input transpose

int64_t round_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
int64_t div_up(int64_t v, int64_t by) { return (v + by - 1) / by; }
size_t align64(size_t v) { return (v + 63) / 64 * 64; }

std::string str(int64_t v) { return std::to_string(v); }

void require(bool ok, const std::string& message) {
  if (!ok) throw std::invalid_argument(message);
}

TransposeU8Fn transpose_u8_for(Isa isa) { return isa == Isa::kPortable ? transpose_u8_portable : transpose_u8_avx2; }
TransposeS32Fn transpose_s32_for(Isa isa) {
  return isa == Isa::kPortable ? transpose_s32_portable : transpose_s32_avx2;
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

const char* depthwise_name(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return "qconv_dw_u8s8_s32_16c4__avx512vnni";
    case Isa::kAvx2: return "qconv_dw_u8s8_s32_8c4__avx2";
    case Isa::kPortable: break;
  }
  return "qconv_dw_u8s8_s32_1c1__portable";
}

int out_bytes(OutType t) { return t == OutType::kS32 ? 4 : 1; }

// dst[i] = src[i] ^ flip (the u8 shift of int8 x, eq. (8)); vectorised by the compiler.
void copy_flipped(const uint8_t* __restrict src, uint8_t* __restrict dst, int64_t n, uint8_t flip) {
  if (flip == 0) {
    std::memcpy(dst, src, static_cast<size_t>(n));
    return;
  }
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<uint8_t>(src[i] ^ 0x80);
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

}  // namespace

// ---------------------------------------------------------------------------------------
// Construction: packing.
// ---------------------------------------------------------------------------------------

std::shared_ptr<QConv> QConv::create(const void* w, bool w_unsigned, int64_t M, int64_t Cg, int64_t group,
                                     const int32_t* zero_point, bool zero_point_per_channel, const Attributes& attrs,
                                     Isa isa) {
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
                     d.gather_perm, d.gather_full, d.gather_last);
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
    return c;
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
  return c;
}

std::string QConv::kernel_name() const {
  if (depthwise_) return depthwise_name(isa_);
  return std::string(kh_ == 1 && kw_ == 1 ? "qconv_1x1" : "qconv_im2col") + "+" + qgemm::qgemm_kernel_name(isa_);
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
  require(C == Cg_ * group_, "x: expected " + str(Cg_ * group_) + " channels (w.shape[1] " + str(Cg_) +
                                 " * group " + str(group_) + "), got " + str(C));
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

struct QConv::Plan {
  int threads = 1;
  size_t main_bytes = 0, thread_bytes = 0, gemm_bytes = 0;
  int n_thread_ws = 0;       // per-thread buffers / qgemm workspaces in use
  // gemm
  bool direct = false;       // 1x1, stride 1, no pads, one group: xt rows are the GEMM rows
  int64_t xt_stride = 0;     // bytes per pixel in xt
  int64_t rows = 0, chunk_rows = 0, n_chunks = 0, units = 0;
  bool parallel_units = true;  // else qgemm gets the threads
  size_t off_ybuf = 0;       // in a thread buffer, after the im2col rows
  // depthwise
  int64_t dw_stride = 0, dw_rows_per_unit = 0, dw_row_blocks = 0, dw_in_rows = 0;
  size_t off_colterm = 0;    // in the main buffer
};

QConv::Plan QConv::make_plan(const ConvArgs& a, const Geometry& geo) const {
  Plan pl;
  pl.threads = std::max(1, a.num_threads);
  const int64_t ob = out_bytes(a.out_type);
  if (depthwise_) {
    const int64_t planes = geo.N * geo.C;
    const int64_t want_units = int64_t{pl.threads} * kChunksPerThread;
    const int64_t splits = planes >= want_units || pl.threads == 1 ? 1 : div_up(want_units, std::max<int64_t>(1, planes));
    pl.dw_rows_per_unit = std::max<int64_t>(1, div_up(geo.OH, splits));
    pl.dw_row_blocks = div_up(geo.OH, pl.dw_rows_per_unit);
    pl.units = planes * pl.dw_row_blocks;
    pl.dw_stride = depthwise_row_stride(geo.OW, geo.sw, geo.dw, dw_.groups4);
    pl.dw_in_rows = (pl.dw_rows_per_unit - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1;
    pl.thread_bytes = align64(static_cast<size_t>(pl.dw_in_rows * pl.dw_stride));
    pl.n_thread_ws = pl.threads;
    pl.off_colterm = 0;
    pl.main_bytes = align64(static_cast<size_t>(geo.C) * 4);
    return pl;
  }

  const int64_t Mg = M_ / group_;
  pl.direct = kh_ == 1 && kw_ == 1 && group_ == 1 && geo.sh == 1 && geo.sw == 1 && geo.pad_top == 0 &&
              geo.pad_left == 0 && geo.pad_bottom == 0 && geo.pad_right == 0;
  pl.xt_stride = pl.direct ? Kp_ : geo.C;
  pl.rows = geo.N * geo.OH * geo.OW;
  const int64_t row_bytes = (pl.direct ? 0 : Kp_) + Mg * ob;
  const int64_t max_rows = std::max<int64_t>(kMinChunkRows, kChunkBytes / std::max<int64_t>(1, row_bytes));
  const int64_t target = std::max(div_up(pl.rows, max_rows),
                                  std::min(int64_t{pl.threads} * kChunksPerThread, div_up(pl.rows, kMinChunkRows)));
  pl.chunk_rows = std::max<int64_t>(1, round_up(div_up(pl.rows, std::max<int64_t>(1, target)), 8));
  pl.n_chunks = div_up(pl.rows, pl.chunk_rows);
  pl.units = pl.n_chunks * group_;
  pl.parallel_units = pl.threads == 1 || pl.units >= 2 * int64_t{pl.threads};
  pl.n_thread_ws = pl.parallel_units ? pl.threads : 1;

  const size_t a_bytes = pl.direct ? 0 : align64(static_cast<size_t>(pl.chunk_rows * Kp_));
  pl.off_ybuf = a_bytes;
  pl.thread_bytes = a_bytes + align64(static_cast<size_t>(pl.chunk_rows * Mg * ob));
  pl.main_bytes = align64(static_cast<size_t>(geo.N * geo.H * geo.W * pl.xt_stride));

  qgemm::QGemmParams p;
  p.M = pl.chunk_rows;
  p.x_row_stride = pl.direct ? pl.xt_stride : Kp_;
  p.out_type = a.out_type;
  p.requant = a.out_type == OutType::kS32 ? qgemm::Requant::kNone : qgemm::Requant::kFloat;
  p.num_threads = pl.parallel_units ? 1 : pl.threads;
  for (const auto& pw : packed_) {
    p.w = pw.get();
    pl.gemm_bytes = std::max(pl.gemm_bytes, qgemm::qgemm_workspace_bytes(p));
  }
  return pl;
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
}

void QConv::run(const ConvArgs& a, const Geometry& geo, ConvWorkspace& ws) const {
  require(a.out_type == OutType::kS32 || a.multiplier != nullptr, "conv: requantization needs a multiplier");
  const Plan pl = make_plan(a, geo);
  bool ok = ws.main.size() >= pl.main_bytes && static_cast<int>(ws.thread_bufs.size()) >= pl.n_thread_ws &&
            static_cast<int>(ws.thread_gemm.size()) >= pl.n_thread_ws;
  for (int t = 0; ok && t < pl.n_thread_ws; ++t) {
    ok = ws.thread_bufs[t].size() >= pl.thread_bytes && ws.thread_gemm[t].size() >= pl.gemm_bytes;
  }
  require(ok, "conv: workspace too small (call reserve_workspace first)");
  if (geo.N == 0 || geo.OH == 0 || geo.OW == 0) return;
  if (depthwise_) {
    run_depthwise(a, geo, pl, ws);
  } else {
    run_gemm(a, geo, pl, ws);
  }
}

// ---------------------------------------------------------------------------------------
// gemm path.
// ---------------------------------------------------------------------------------------

void QConv::run_gemm(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const int64_t Mg = M_ / group_;
  const int64_t hw = geo.H * geo.W, ohw = geo.OH * geo.OW;
  const uint8_t flip = a.x_signed ? 0x80 : 0;
  const int32_t zx_shifted = a.zx + (a.x_signed ? 128 : 0);
  const int ob = out_bytes(a.out_type);
  uint8_t* xt = ws.main.data();
  const TransposeU8Fn tr_u8 = transpose_u8_for(isa_);
  const TransposeS32Fn tr_s32 = transpose_s32_for(isa_);

  // 1. x -> xt (NHWC, x' domain); the columns [C, xt_stride) of the direct path are
  //    zeroed (their weight rows hold zw: any value would add nothing).
  const int64_t pix_blocks = div_up(hw, kTransposePixels);
  auto to_nhwc = [&](int64_t unit, int) {
    const int64_t n = unit / pix_blocks, p0 = (unit % pix_blocks) * kTransposePixels;
    const int64_t p1 = std::min(hw, p0 + kTransposePixels);
    const uint8_t* src = static_cast<const uint8_t*>(a.x) + n * geo.C * hw + p0;
    uint8_t* dst = xt + (n * hw + p0) * pl.xt_stride;
    tr_u8(src, hw, geo.C, p1 - p0, dst, pl.xt_stride, flip);
    if (pl.xt_stride > geo.C) {
      for (int64_t p = 0; p < p1 - p0; ++p) {
        std::memset(dst + p * pl.xt_stride + geo.C, 0, static_cast<size_t>(pl.xt_stride - geo.C));
      }
    }
  };
  qgemm::parallel_for(pl.threads, geo.N * pix_blocks, to_nhwc);

  // 2. chunks x groups
  auto unit_fn = [&](int64_t unit, int thread) {
    const int64_t chunk = unit / group_, g = unit % group_;
    const int64_t r0 = chunk * pl.chunk_rows, r1 = std::min(pl.rows, r0 + pl.chunk_rows);
    uint8_t* buf = ws.thread_bufs[thread].data();
    qgemm::QGemmParams p;
    p.M = r1 - r0;
    if (pl.direct) {
      p.x = xt + r0 * pl.xt_stride;
      p.x_row_stride = pl.xt_stride;
    } else {
      im2col_nhwc(xt, pl.xt_stride, geo, Cg_, g, r0, r1, static_cast<uint8_t>(zx_shifted), Kp_, buf);
      p.x = buf;
      p.x_row_stride = Kp_;
    }
    p.x_signed = false;
    p.zx = zx_shifted;
    p.w = packed_[g].get();
    p.bias = a.bias ? a.bias + g * Mg : nullptr;
    p.out_type = a.out_type;
    if (a.out_type != OutType::kS32) {
      p.requant = qgemm::Requant::kFloat;
      p.multiplier = a.multiplier + (a.multiplier_per_channel ? g * Mg : 0);
      p.multiplier_per_channel = a.multiplier_per_channel;
      p.zy = a.zy;
    }
    uint8_t* ybuf = buf + pl.off_ybuf;
    p.y = ybuf;
    p.y_row_stride = Mg;
    p.num_threads = pl.parallel_units ? 1 : pl.threads;
    qgemm::qgemm(p, ws.thread_gemm[pl.parallel_units ? thread : 0]);

    // NHWC rows [r0, r1) -> y[n, g·Mg + j, pixel], image by image
    for (int64_t s0 = r0; s0 < r1;) {
      const int64_t n = s0 / ohw, p0 = s0 % ohw;
      const int64_t s1 = std::min(r1, (n + 1) * ohw);
      const int64_t at = (n * M_ + g * Mg) * ohw + p0;  // elements of y
      const uint8_t* src = ybuf + (s0 - r0) * Mg * ob;
      if (a.out_type == OutType::kS32) {
        tr_s32(reinterpret_cast<const int32_t*>(src), Mg, s1 - s0, Mg, static_cast<int32_t*>(a.y) + at, ohw);
      } else {
        tr_u8(src, Mg, s1 - s0, Mg, static_cast<uint8_t*>(a.y) + at, ohw, 0);
      }
      s0 = s1;
    }
  };
  if (pl.parallel_units) {
    qgemm::parallel_for(pl.threads, pl.units, unit_fn);
  } else {
    for (int64_t u = 0; u < pl.units; ++u) unit_fn(u, 0);
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
    const int32_t qmin = a.out_type == OutType::kS8 ? -128 : 0, qmax = a.out_type == OutType::kS8 ? 127 : 255;
    lo = static_cast<float>(qmin - a.zy);
    hi = static_cast<float>(qmax - a.zy);
  }
  const int64_t hw = geo.H * geo.W, ohw = geo.OH * geo.OW;

  auto unit_fn = [&](int64_t unit, int thread) {
    const int64_t plane = unit / pl.dw_row_blocks, rb = unit % pl.dw_row_blocks;
    const int64_t n = plane / geo.C, c = plane % geo.C;
    const int64_t oy0 = rb * pl.dw_rows_per_unit, oy1 = std::min(geo.OH, oy0 + pl.dw_rows_per_unit);
    const int64_t rows = oy1 - oy0;
    const int64_t in_rows = (rows - 1) * geo.sh + (geo.kh - 1) * geo.dh + 1;
    const int64_t iy_top = oy0 * geo.sh - geo.pad_top;
    const uint8_t* x = static_cast<const uint8_t*>(a.x) + (n * geo.C + c) * hw;
    uint8_t* buf = ws.thread_bufs[thread].data();
    // padded rows: column col holds x[iy, col − pad_left], zx' outside x
    const int64_t copy_begin = std::min(geo.pad_left, pl.dw_stride);
    const int64_t copy_len = std::max<int64_t>(0, std::min(geo.W, pl.dw_stride - copy_begin));
    for (int64_t r = 0; r < in_rows; ++r) {
      const int64_t iy = iy_top + r;
      uint8_t* dst = buf + r * pl.dw_stride;
      if (iy < 0 || iy >= geo.H) {
        std::memset(dst, pad, static_cast<size_t>(pl.dw_stride));
        continue;
      }
      std::memset(dst, pad, static_cast<size_t>(copy_begin));
      uint8_t* out = dst + copy_begin;
      copy_flipped(x + iy * geo.W, out, copy_len, flip);
      std::memset(out + copy_len, pad, static_cast<size_t>(pl.dw_stride - copy_begin - copy_len));
    }
    DepthwiseRows r;
    r.in = buf;
    r.in_stride = pl.dw_stride;
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
  qgemm::parallel_for(pl.threads, pl.units, unit_fn);
}

}  // namespace conv
}  // namespace quanta
