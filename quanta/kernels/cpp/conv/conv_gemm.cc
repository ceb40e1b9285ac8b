// The two paths of conv.h that run on qgemm: implicit (qgemm's micro-kernel tiles over a
// padded NHWC image, one K chunk per tap) and im2col (qgemm over im2col rows).
//
// implicit, per call:
//   1. xpad = padded NHWC image of x': units = pad rows (zx'), and input rows transposed
//      [C, W] -> [W, C] between zx' pad columns, or, without left/right pads, blocks of
//      the image's pixels transposed at once. For 1x1 / stride 1 / no pads this phase is
//      folded into step 3: each unit transposes the pixels it reads.
//   2. Per group: colterm[n] = bias[n] − zx'·cs[n] and the padded multipliers (what
//      qgemm.cc::make_epilogue computes per call); with weight zero points, the per-pixel
//      channel sums of xpad, from which each row's Σx' is a sum over its taps.
//   3. units = (image, block of mc output pixels) x group; per unit, the row pointers
//      (output pixel -> its first tap in xpad), then for each N panel the tap chunks
//      through qgemm's tile function in its indirect-rows form (kernel.h TileArgs::
//      a_rows: the sums stay in registers across the taps of a call, the fused output
//      stage runs at the end), into y's rows (channels_last) or an NHWC block [mc, Mg]
//      then transposed into y (NCHW).
// im2col, per call:
//   1. xt = NHWC(x'), parallel over pixel blocks;
//   2. units = (chunk of output pixels) x group: im2col rows (or the xt rows themselves
//      for 1x1 / stride 1 / no pads / G = 1), qgemm (one thread) into an NHWC block,
//      transposed into y. With fewer units than 2 per thread, the units run one after
//      the other and qgemm splits its N panels over the threads instead.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>

#include "conv/kernels.h"
#include "gemm/batched_qgemm.h"
#include "qgemm/kernel.h"

namespace quanta {
namespace conv {
namespace {

// im2col rows + the chunk's NHWC result per unit: ~128 KiB, so that a chunk's A block
// and its output stay in L2 next to the packed weights.
constexpr int64_t kChunkBytes = 128 * 1024;
constexpr int64_t kMinChunkRows = 32;
constexpr int64_t kUnitsPerThread = 4;
constexpr int64_t kTransposePixels = 2048;  // at most, pixels per unit of an image transpose

// Pixels per unit of an image transpose: a few units per thread (a 56x56 image is 2
// units of 2048 pixels, which two threads would split 2:1), whole 64-pixel tiles.
int64_t transpose_block(int64_t pixels, int threads) {
  const int64_t want = div_up(pixels, int64_t{threads} * kUnitsPerThread);
  return std::min(kTransposePixels, std::max<int64_t>(64, round_up(want, 64)));
}
// Output pixels of an implicit unit (16 tiles of 8): its A rows are reread from L1/L2 for
// each N panel (64, 128 and 256 measured within 1 % of each other on the ResNet shapes).
constexpr int64_t kImplicitRows = 128;
// pointwise NCHW path: from this many pixels per image (below, the implicit path), and
// packed x per unit
constexpr int64_t kPointwisePixels = 256;
constexpr int64_t kPointwiseUnitBytes = 512 * 1024;
// avx2, pair-safe weights: from this many output channels the implicit path instead
// (QConv::pointwise_nchw)
constexpr int64_t kPointwiseImplicitMinM = 64;
// B budget of one tile call: whole tap chunks up to 48 KiB of packed weights (the L1 of
// the machines we measured; 3x3 with 128 channels is 36 KiB, 2.5 % faster as one call
// than as two), a longer tap chunk split into pieces like qgemm.cc's KC.
constexpr int64_t kBChunkBytes = 48 * 1024;

Im2colFn im2col_for(Isa isa) { return isa == Isa::kAvx512Vnni ? im2col_nhwc_avx512vnni : im2col_nhwc; }

// rows [0, n) of an NHWC block (row stride Mg elements) -> y[channel·ohw + pixel] from
// `at` (elements), i.e. channels g·Mg .. of one image, pixels p0 .. p0 + n.
void store_nchw(const uint8_t* block, int64_t n, int64_t Mg, OutType t, int64_t ohw, void* y, int64_t at,
                TransposeU8Fn tr_u8, TransposeS32Fn tr_s32) {
  if (t == OutType::kS32) {
    tr_s32(reinterpret_cast<const int32_t*>(block), Mg, n, Mg, static_cast<int32_t*>(y) + at, ohw);
  } else {
    tr_u8(block, Mg, n, Mg, static_cast<uint8_t*>(y) + at, ohw, 0);
  }
}

}  // namespace

// ---------------------------------------------------------------------------------------
// implicit path
// ---------------------------------------------------------------------------------------

void QConv::plan_implicit(const ConvArgs& a, const Geometry& geo, Plan& pl) const {
  const qgemm::KernelFamily& fam = qgemm::kernel_family(*packed_[0]);  // implicit_path(): every group's
  const int64_t Mg = M_ / group_, ob = out_bytes(a.out_type);
  pl.Hp = geo.H + geo.pad_top + geo.pad_bottom;
  pl.Wp = geo.W + geo.pad_left + geo.pad_right;
  pl.chunk_k = implicit_chunk_k();
  pl.n_taps = pl.chunk_k == Cg_ ? kh_ * kw_ : kh_;
  // Tap chunks per tile call: as many whole taps as fit the B budget (the sums stay in
  // registers across them); a tap chunk over the budget is split into pieces of kc_max.
  const int64_t kc_max = std::max<int64_t>(fam.kr, kBChunkBytes / (int64_t{fam.nr} * fam.w_bytes) / fam.kr * fam.kr);
  pl.taps_per_call = pl.chunk_k <= kc_max ? std::max<int64_t>(1, kc_max / std::max<int64_t>(1, pl.chunk_k)) : 1;
  // 1x1, stride 1, no pads: a unit's rows are exactly the pixels it reads, so it
  // transposes them itself (on the core that then reads them: with a separate phase,
  // half of the units read rows the other core wrote; 256 -> 64 at 56x56, two threads
  // over one: 1.42x before, 1.55x after).
  pl.wide = fam.a_bytes == 2;  // implicit_path(): more than one tap
  pl.fused_transpose = kh_ == 1 && kw_ == 1 && geo.sh == 1 && geo.sw == 1 && pl.Hp == geo.H && pl.Wp == geo.W;
  // Rows are output pixels, a run is one (image, group): each row has its own A pointer
  // (TileArgs::a_rows), so tiles cross output rows and no pad column is computed.
  pl.run_len = geo.OH * geo.OW;
  const int64_t runs = geo.N * group_;
  const int64_t mr = fam.mr_indirect;                      // rows per tile of the indirect form
  const int64_t tiles = div_up(pl.run_len, mr);            // per run
  int64_t per = std::max<int64_t>(1, kImplicitRows / mr);  // tiles per block
  const int64_t want_units = int64_t{pl.threads} * kUnitsPerThread;
  if (runs * div_up(tiles, per) < want_units) per = std::max<int64_t>(1, div_up(runs * tiles, want_units));
  if (pl.threads > 1) {  // the block size in [per/2, per] whose busiest thread has the fewest tiles
    int64_t best = per, best_load = std::numeric_limits<int64_t>::max();
    for (int64_t q = per; q >= std::max<int64_t>(1, per / 2); --q) {
      const int64_t load = div_up(runs * div_up(tiles, q), int64_t{pl.threads}) * q;
      if (load < best_load) {
        best = q;
        best_load = load;
      }
    }
    per = best;
  }
  pl.mc = std::max<int64_t>(1, std::min(per * mr, pl.run_len));
  pl.blocks_per_run = div_up(pl.run_len, pl.mc);
  pl.units = runs * pl.blocks_per_run;
  pl.rowsums = false;
  for (const auto& w : packed_) pl.rowsums = pl.rowsums || w->has_zero_point;

  const int64_t np = packed_[0]->padded_n();
  const int64_t pixels = geo.N * pl.Hp * pl.Wp;
  // channels_last, uint8 x, no pads: the padded image is x itself
  pl.x_in_place = a.channels_last && !a.x_signed && pl.Hp == geo.H && pl.Wp == geo.W && !pl.wide;
  // channels_last, uint8 x, pads, one group, no Σx' term: border mode (kernels.h Plan)
  pl.band_rows = (kh_ - 1) * geo.dh + 1;
  pl.span_w = (kw_ - 1) * geo.dw + 1;
  pl.border = a.channels_last && !a.x_signed && !pl.x_in_place && !pl.wide && group_ == 1 && !pl.rowsums &&
              pl.span_w <= geo.W && std::getenv("QUANTA_CONV_NO_BORDER") == nullptr;
  size_t border_bytes = 0;
  if (pl.border) {
    auto row_border = [&](int64_t oy) {
      const int64_t iy0 = oy * geo.sh - geo.pad_top;
      return iy0 < 0 || iy0 + pl.band_rows > geo.H;
    };
    auto col_border = [&](int64_t ox) {
      const int64_t ix0 = ox * geo.sw - geo.pad_left;
      return ix0 < 0 || ix0 + pl.span_w > geo.W;
    };
    pl.n_strips = 0;
    for (int64_t oy = 0; oy < geo.OH; ++oy) pl.n_strips += row_border(oy) ? 1 : 0;
    pl.n_colborder = 0;
    for (int64_t ox = 0; ox < geo.OW; ++ox) pl.n_colborder += col_border(ox) ? 1 : 0;
    pl.per_band = geo.W / pl.span_w;
    pl.n_bands = div_up(geo.OH * pl.n_colborder, pl.per_band);
    border_bytes = static_cast<size_t>(geo.N * (pl.n_strips + pl.n_bands) * pl.band_rows * geo.W * geo.C);
    // A widely dilated kernel (a TCN's dilation 1024: a band of 4097 rows for every
    // output row) would copy far more than the padded image: build that instead.
    if (border_bytes > static_cast<size_t>(pixels * geo.C)) {
      pl.border = false;
      border_bytes = 0;
    }
  }
  size_t off = 0;
  pl.off_xpad = off;
  off += pl.x_in_place ? 0 : align64(pl.border ? border_bytes : static_cast<size_t>(pixels * geo.C));
  pl.off_xpad16 = off;
  off += pl.wide ? align64(static_cast<size_t>(pixels * geo.C) * 2) : 0;
  pl.off_strip_index = off;
  off += pl.border ? align64(static_cast<size_t>(geo.OH) * 4) : 0;
  pl.off_col_index = off;
  off += pl.border ? align64(static_cast<size_t>(geo.OW) * 4) : 0;
  pl.off_pixsum = off;
  off += pl.rowsums ? align64(static_cast<size_t>(pixels * group_) * 4) : 0;
  pl.off_colterm = off;
  off += align64(static_cast<size_t>(group_ * np) * 4);
  pl.off_mult = off;
  off += align64(static_cast<size_t>(group_ * np) * 4);
  pl.off_tapoff = off;
  off += align64(static_cast<size_t>(pl.n_taps) * 8);
  pl.main_bytes = off;

  // the NHWC block (NCHW y; channels_last: the tiles write y in place), the partial sums
  // (when a panel takes several tile calls), Σx' per row, the row pointers
  size_t t = a.channels_last ? 0 : align64(static_cast<size_t>(pl.mc * Mg * ob));
  pl.off_partial = t;
  t += align64(static_cast<size_t>(pl.mc * fam.nr) * 4);
  pl.off_rowsum = t;
  t += pl.rowsums ? align64(static_cast<size_t>(pl.mc) * 4) : 0;
  pl.off_ptrs = t;
  t += align64(static_cast<size_t>(pl.mc) * sizeof(const uint8_t*));
  pl.thread_bytes = t;
  pl.n_thread_ws = pl.threads;
}

void QConv::run_implicit(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const qgemm::KernelFamily& fam = qgemm::kernel_family(*packed_[0]);  // implicit_path(): every group's
  const int64_t C = geo.C, Mg = M_ / group_, ob = out_bytes(a.out_type);
  const int64_t hw = geo.H * geo.W, ohw = geo.OH * geo.OW;
  const int64_t Hp = pl.Hp, Wp = pl.Wp, image = Hp * Wp;  // pixels per padded image
  const uint8_t flip = a.x_signed ? 0x80 : 0;
  const int32_t zx_shifted = a.zx + (a.x_signed ? 128 : 0);
  const uint8_t pad = static_cast<uint8_t>(zx_shifted);
  const TransposeU8Fn tr_u8 = transpose_u8_for(isa_);
  const TransposeS32Fn tr_s32 = transpose_s32_for(isa_);
  uint8_t* xpad_buf = ws.main.data() + pl.off_xpad;
  // what the tiles read: the padded image, or x itself (pl.x_in_place)
  const uint8_t* xpad = pl.x_in_place ? static_cast<const uint8_t*>(a.x) : xpad_buf;
  const bool nhwc = a.channels_last;
  const int64_t np = packed_[0]->padded_n();
  int16_t* xpad16 = reinterpret_cast<int16_t*>(ws.main.data() + pl.off_xpad16);  // pl.wide
  const int64_t a_bytes = fam.a_bytes;  // the tiles' row pointers and tap offsets are in bytes

  // 1. the padded NHWC image (and, with weight zero points, its per-pixel channel sums).
  //    Without left/right pads the image rows are contiguous in xpad: the interior is
  //    transposed in blocks of pixels (whole 64-column tiles), else row by row.
  int32_t* pixsum = reinterpret_cast<int32_t*>(ws.main.data() + pl.off_pixsum);
  const bool whole = geo.pad_left == 0 && geo.pad_right == 0;
  const int64_t block = transpose_block(hw, pl.threads);
  const int64_t interior_blocks = whole ? div_up(hw, block) : geo.H;
  const int64_t pad_rows = geo.pad_top + geo.pad_bottom;
  auto pixel_sums = [&](int64_t n, int64_t p0, int64_t p1) {  // padded pixels [p0, p1) of image n
    for (int64_t px = p0; px < p1; ++px) {
      for (int64_t g = 0; g < group_; ++g) {
        const uint8_t* v = xpad + (n * image + px) * C + g * Cg_;
        uint32_t sum = 0;
        for (int64_t c = 0; c < Cg_; ++c) sum += v[c];
        pixsum[(n * image + px) * group_ + g] = static_cast<int32_t>(sum);
      }
    }
  };
  // channels_last: the rows of x are already NHWC, so this is row copies (flipped for
  // int8 x), or nothing but the pixel sums when the tiles read x in place
  auto pad_image = [&](int64_t unit, int) {
    const int64_t n = unit / (interior_blocks + pad_rows), u = unit % (interior_blocks + pad_rows);
    const uint8_t* x = static_cast<const uint8_t*>(a.x) + n * C * hw;
    int64_t p0, p1;  // padded pixels written; units in pixel order: top pads, x, bottom pads
    const bool above = u < geo.pad_top, below = u >= geo.pad_top + interior_blocks;
    if (above || below) {  // a pad row above or below x
      const int64_t row = above ? u : geo.H + (u - interior_blocks);
      p0 = row * Wp;
      p1 = p0 + Wp;
      std::memset(xpad_buf + (n * image + p0) * C, pad, static_cast<size_t>(Wp * C));
    } else if (whole) {  // pixels [q0, q1) of x, contiguous in xpad
      const int64_t q0 = (u - geo.pad_top) * block, q1 = std::min(hw, q0 + block);
      p0 = geo.pad_top * Wp + q0;
      p1 = p0 + (q1 - q0);
      if (pl.x_in_place) {
        // nothing to copy
      } else if (nhwc) {
        copy_flipped(x + q0 * C, xpad_buf + (n * image + p0) * C, (q1 - q0) * C, flip);
      } else {
        tr_u8(x + q0, hw, C, q1 - q0, xpad_buf + (n * image + p0) * C, C, flip);
      }
    } else {  // input row u − pad_top between its pad columns
      p0 = u * Wp;
      p1 = p0 + Wp;
      uint8_t* row = xpad_buf + (n * image + p0) * C;
      std::memset(row, pad, static_cast<size_t>(geo.pad_left * C));
      if (nhwc) {
        copy_flipped(x + (u - geo.pad_top) * geo.W * C, row + geo.pad_left * C, geo.W * C, flip);
      } else {
        tr_u8(x + (u - geo.pad_top) * geo.W, hw, C, geo.W, row + geo.pad_left * C, C, flip);
      }
      std::memset(row + (geo.pad_left + geo.W) * C, pad, static_cast<size_t>(geo.pad_right * C));
    }
    if (pl.rowsums) pixel_sums(n, p0, p1);
    if (pl.wide) {  // the same pixels widened to int16 for the tiles, while in cache
      const int64_t at = (n * image + p0) * C, count = (p1 - p0) * C;
      qgemm::pack_activations_s16_avx2(xpad_buf + at, count, false, count, count, 0, 1, xpad16 + at);
    }
  };
  // border mode: the windows that leave x, copied with x's row pitch (kernels.h Plan)
  int32_t* strip_index = reinterpret_cast<int32_t*>(ws.main.data() + pl.off_strip_index);
  int32_t* col_index = reinterpret_cast<int32_t*>(ws.main.data() + pl.off_col_index);
  const int64_t band_bytes = pl.band_rows * geo.W * C;
  const int64_t border_image = (pl.n_strips + pl.n_bands) * band_bytes;  // bytes per image
  if (pl.border) {
    int32_t s_count = 0, c_count = 0;
    for (int64_t oy = 0; oy < geo.OH; ++oy) {
      const int64_t iy0 = oy * geo.sh - geo.pad_top;
      strip_index[oy] = iy0 < 0 || iy0 + pl.band_rows > geo.H ? s_count++ : -1;
    }
    for (int64_t ox = 0; ox < geo.OW; ++ox) {
      const int64_t ix0 = ox * geo.sw - geo.pad_left;
      col_index[ox] = ix0 < 0 || ix0 + pl.span_w > geo.W ? c_count++ : -1;
    }
    const int64_t row_bytes = geo.W * C;
    auto build = [&](int64_t unit, int) {  // one strip or one band of patches of image n
      const int64_t per_image = pl.n_strips + pl.n_bands;
      const int64_t n = unit / per_image, k = unit % per_image;
      const uint8_t* x = static_cast<const uint8_t*>(a.x) + n * hw * C;
      uint8_t* dst = xpad_buf + n * border_image + k * band_bytes;
      if (k < pl.n_strips) {  // the strip of the k-th border output row: band_rows input rows
        int64_t oy = 0;
        while (strip_index[oy] != k) ++oy;
        const int64_t iy0 = oy * geo.sh - geo.pad_top;
        for (int64_t j = 0; j < pl.band_rows; ++j) {
          const int64_t iy = iy0 + j;
          if (iy >= 0 && iy < geo.H) {
            std::memcpy(dst + j * row_bytes, x + iy * row_bytes, static_cast<size_t>(row_bytes));
          } else {
            std::memset(dst + j * row_bytes, pad, static_cast<size_t>(row_bytes));
          }
        }
        return;
      }
      // band b: patches q = b·per_band + slot, q = oy·n_colborder + col_index[ox]
      const int64_t b = k - pl.n_strips;
      for (int64_t slot = 0; slot < pl.per_band; ++slot) {
        const int64_t q = b * pl.per_band + slot;
        if (q >= geo.OH * pl.n_colborder) break;
        const int64_t oy = q / pl.n_colborder, ci = q % pl.n_colborder;
        int64_t ox = 0;
        while (col_index[ox] != ci) ++ox;
        const int64_t iy0 = oy * geo.sh - geo.pad_top, ix0 = ox * geo.sw - geo.pad_left;
        for (int64_t j = 0; j < pl.band_rows; ++j) {
          const int64_t iy = iy0 + j;
          uint8_t* d = dst + j * row_bytes + slot * pl.span_w * C;
          for (int64_t u = 0; u < pl.span_w; ++u) {
            const int64_t ix = ix0 + u;
            if (iy >= 0 && iy < geo.H && ix >= 0 && ix < geo.W) {
              std::memcpy(d + u * C, x + (iy * geo.W + ix) * C, static_cast<size_t>(C));
            } else {
              std::memset(d + u * C, pad, static_cast<size_t>(C));
            }
          }
        }
      }
    };
    run_with_affinity(pl.threads, geo.N * (pl.n_strips + pl.n_bands), build);
  } else if (!pl.fused_transpose && (!pl.x_in_place || pl.rowsums)) {
    run_with_affinity(pl.threads, geo.N * (interior_blocks + pad_rows), pad_image);
  }

  // 2. per-group epilogue constants, as qgemm.cc::make_epilogue: colterm = bias − zx'·cs
  //    (eq. (5) with the u8 shift of eq. (8)) and the multipliers, padded to np columns
  int32_t* colterm = reinterpret_cast<int32_t*>(ws.main.data() + pl.off_colterm);
  float* mult = reinterpret_cast<float*>(ws.main.data() + pl.off_mult);
  for (int64_t g = 0; g < group_; ++g) {
    const int32_t* cs = packed_[g]->column_sums_ptr();
    for (int64_t n = 0; n < np; ++n) {
      const int64_t m = g * Mg + n;
      const uint32_t b = n < Mg && a.bias ? static_cast<uint32_t>(a.bias[m]) : 0u;
      colterm[g * np + n] =
          n < Mg ? static_cast<int32_t>(b - static_cast<uint32_t>(zx_shifted) * static_cast<uint32_t>(cs[n])) : 0;
      mult[g * np + n] = n < Mg && a.out_type != OutType::kS32 ? a.multiplier[a.multiplier_per_channel ? m : 0] : 0.0f;
    }
  }
  qgemm::Epilogue base;
  base.y_row_stride = Mg;
  base.zy = a.zy;
  if (a.out_type == OutType::kS32) {
    base.kind = qgemm::EpiKind::kS32;
    base.lo = std::numeric_limits<int32_t>::min();
    base.hi = std::numeric_limits<int32_t>::max();
  } else {
    base.kind = qgemm::EpiKind::kQ8Float;
    base.y_signed = a.out_type == OutType::kS8;
    const OutputRange r = output_range(a);
    base.lo = r.lo;
    base.hi = r.hi;
    base.lo_minus_zy = static_cast<float>(base.lo - a.zy);
    base.hi_minus_zy = static_cast<float>(base.hi - a.zy);
  }

  // 3. units: row pointers, then per N panel the tap chunks through qgemm's tile
  //    function (kernel.h TileArgs::a_rows), the fused output stage on the last call
  int64_t* tap_off = reinterpret_cast<int64_t*>(ws.main.data() + pl.off_tapoff);
  for (int64_t tap = 0; tap < pl.n_taps; ++tap) {  // (ky, kx), or ky with kx in the chunk
    const int64_t ky = pl.n_taps == kh_ ? tap : tap / kw_, kx = pl.n_taps == kh_ ? 0 : tap % kw_;
    tap_off[tap] = (ky * geo.dh * (pl.border ? geo.W : Wp) + kx * geo.dw) * C * a_bytes;  // border mode: x's pitch
  }
  const int64_t kc_max = std::max<int64_t>(fam.kr, kBChunkBytes / (int64_t{fam.nr} * fam.w_bytes) / fam.kr * fam.kr);
  auto unit_fn = [&](int64_t unit, int thread) {
    const int64_t g = unit % group_;
    const int64_t rest = unit / group_;
    const int64_t blk = rest % pl.blocks_per_run, n = rest / pl.blocks_per_run;
    const int64_t r0 = blk * pl.mc, rows = std::min(pl.mc, pl.run_len - r0);  // output pixels of image n
    uint8_t* buf = ws.thread_bufs[thread].data();
    const qgemm::PackedWeights& w = *packed_[g];
    if (pl.fused_transpose) {  // this unit's pixels, this group's channels
      if (pl.x_in_place) {
        // the tiles read x itself
      } else if (nhwc) {
        const uint8_t* x = static_cast<const uint8_t*>(a.x) + (n * image + r0) * C + g * Cg_;
        uint8_t* dst = xpad_buf + (n * image + r0) * C + g * Cg_;
        if (group_ == 1) {
          copy_flipped(x, dst, rows * C, flip);
        } else {
          for (int64_t r = 0; r < rows; ++r) copy_flipped(x + r * C, dst + r * C, Cg_, flip);
        }
      } else {
        const uint8_t* x = static_cast<const uint8_t*>(a.x) + (n * C + g * Cg_) * hw + r0;
        tr_u8(x, hw, Cg_, rows, xpad_buf + (n * image + r0) * C + g * Cg_, C, flip);
      }
      if (pl.rowsums) {
        for (int64_t p = r0; p < r0 + rows; ++p) {
          const uint8_t* v = xpad + (n * image + p) * C + g * Cg_;
          uint32_t sum = 0;
          for (int64_t c = 0; c < Cg_; ++c) sum += v[c];
          pixsum[(n * image + p) * group_ + g] = static_cast<int32_t>(sum);
        }
      }
    }

    // row r: output pixel (oy, ox) = divmod(r0 + r, OW), its first tap at padded pixel
    // (oy·sh, ox·sw)
    const uint8_t** row_ptr = reinterpret_cast<const uint8_t**>(buf + pl.off_ptrs);
    int32_t* rowsum = reinterpret_cast<int32_t*>(buf + pl.off_rowsum);
    const int32_t* ps = pixsum + n * image * group_ + g;
    int64_t oy = r0 / geo.OW, ox = r0 % geo.OW;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t p = oy * geo.sh * Wp + ox * geo.sw;
      if (pl.border) {  // x in place, or the window's copy with x's pitch (one group)
        const int64_t iy0 = oy * geo.sh - geo.pad_top, ix0 = ox * geo.sw - geo.pad_left;
        const uint8_t* copies = xpad_buf + n * border_image;
        if (col_index[ox] >= 0) {
          const int64_t q = oy * pl.n_colborder + col_index[ox];
          row_ptr[r] = copies + (pl.n_strips + q / pl.per_band) * band_bytes + (q % pl.per_band) * pl.span_w * C;
        } else if (strip_index[oy] >= 0) {
          row_ptr[r] = copies + strip_index[oy] * band_bytes + ix0 * C;
        } else {
          row_ptr[r] = static_cast<const uint8_t*>(a.x) + (n * hw + iy0 * geo.W + ix0) * C;
        }
      } else if (pl.wide) {
        row_ptr[r] = reinterpret_cast<const uint8_t*>(xpad16 + (n * image + p) * C + g * Cg_);
      } else {
        row_ptr[r] = xpad + (n * image + p) * C + g * Cg_;
      }
      if (w.has_zero_point) {
        uint32_t sum = 0;
        for (int64_t ky = 0; ky < geo.kh; ++ky) {
          for (int64_t kx = 0; kx < geo.kw; ++kx) {
            sum += static_cast<uint32_t>(ps[(p + ky * geo.dh * Wp + kx * geo.dw) * group_]);
          }
        }
        rowsum[r] = static_cast<int32_t>(sum);
      }
      if (++ox == geo.OW) {
        ox = 0;
        ++oy;
      }
    }

    qgemm::Epilogue e = base;
    e.colterm = colterm + g * np;
    e.multiplier = mult + g * np;
    if (nhwc) {  // rows r0 .. are y's pixels (n, r0 ..): written in place
      e.y = static_cast<uint8_t*>(a.y) + ((n * ohw + r0) * M_ + g * Mg) * ob;
      e.y_row_stride = M_;
    } else {
      e.y = buf;
    }
    if (w.has_zero_point) {
      e.zw = w.zero_point_ptr();
      e.rowsum = rowsum;
    }

    qgemm::TileArgs t;
    t.partial = reinterpret_cast<int32_t*>(buf + pl.off_partial);
    t.epi = &e;
    t.a_rows = row_ptr;
    t.rows = rows;
    t.m0 = 0;
    int64_t piece_off = 0;  // a tap chunk split into pieces: one offset per call
    for (int64_t panel = 0; panel < w.n_panels; ++panel) {
      t.n0 = panel * fam.nr;
      t.cols = static_cast<int>(std::min<int64_t>(fam.nr, Mg - t.n0));
      const uint8_t* b_panel = w.data.data() + panel * w.Kp * fam.nr * fam.w_bytes;
      for (int64_t tap = 0; tap < pl.n_taps; tap += pl.taps_per_call) {
        const int64_t taps = std::min(pl.taps_per_call, pl.n_taps - tap);
        for (int64_t k = 0; k < pl.chunk_k; k += kc_max) {  // pieces of <= 48 KiB of weights
          t.kc = std::min(kc_max, pl.chunk_k - k);
          if (t.kc == pl.chunk_k) {  // whole taps
            t.tap_offset = tap_off + tap;
            t.n_taps = taps;
          } else {  // taps_per_call = 1
            piece_off = tap_off[tap] + k * a_bytes;
            t.tap_offset = &piece_off;
            t.n_taps = 1;
          }
          t.b = b_panel + (tap * pl.chunk_k + k) * fam.nr * fam.w_bytes;
          t.accumulate = tap > 0 || k > 0;
          t.finish = tap + taps == pl.n_taps && k + t.kc == pl.chunk_k;
          fam.tiles(t);
        }
      }
    }

    // NCHW: the NHWC block -> y[n, g·Mg .., pixels r0 ..]
    if (!nhwc) {
      store_nchw(buf, rows, Mg, a.out_type, ohw, a.y, (n * M_ + g * Mg) * ohw + r0, tr_u8, tr_s32);
    }
  };
  run_with_affinity(pl.threads, pl.units, unit_fn);
}

// ---------------------------------------------------------------------------------------
// pointwise NCHW path (conv.h "Paths")
// ---------------------------------------------------------------------------------------

bool QConv::pointwise_nchw(const Geometry& geo) const {
  if (pw_w_ == nullptr || kh_ != 1 || kw_ != 1 || geo.sh != 1 || geo.sw != 1 || geo.pad_top != 0 || geo.pad_left != 0 ||
      geo.pad_bottom != 0 || geo.pad_right != 0) {
    return false;
  }
  if (const char* e = std::getenv("QUANTA_CONV_PW_PATH")) {  // the tests run both paths
    if (std::strcmp(e, "gemm") == 0) return true;
    if (std::strcmp(e, "transposed") == 0) return false;
  }
  // avx2 with pair-safe weights (implicit_path() there means the vpmaddubsw family): this
  // path's GEMM packs x as its B, and activations take the int16 family, while the
  // implicit path runs the weights' pair-safe family (a 1.27x faster k-step). Measured, one
  // thread, 56x56 / 28x28 ResNet-50 1x1 layers 256 -> 64 and 512 -> 128: 1.51x -> 1.23x and
  // 1.38x -> 1.12x ONNX Runtime's time; MobileNet's 96 -> 24 at 56x56 (two 16-column
  // panels for 24 channels) 1.41x -> 1.49x, so from kPointwiseImplicitMinM outputs.
  if (isa_ == Isa::kAvx2 && M_ >= kPointwiseImplicitMinM && implicit_path()) return false;
  // Few pixels (a 7x7 or 14x14 map): the pixels are qgemm's N, padded to whole NR-column
  // panels, and the transposes are short; the implicit path's rows waste less there.
  return geo.H * geo.W >= kPointwisePixels;
}

void QConv::plan_pointwise_nchw(const ConvArgs& a, const Geometry& geo, Plan& pl) const {
  const qgemm::KernelFamily& fam = qgemm::kernel_family(isa_);
  const int64_t hw = geo.H * geo.W;
  // Units of <= kPointwiseUnitBytes of packed x (B stays in L2 while qgemm's panels pass),
  // and a few per thread when there are several.
  int64_t parts = std::max<int64_t>(1, div_up(geo.C * hw, kPointwiseUnitBytes));
  if (pl.threads > 1) parts = std::max(parts, div_up(int64_t{pl.threads} * 2, geo.N));
  pl.pw_cols = std::min(round_up(div_up(hw, parts), fam.nr), round_up(hw, fam.nr));
  pl.pw_parts = div_up(hw, pl.pw_cols);
  pl.units = geo.N * pl.pw_parts;
  pl.threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(pl.threads, pl.units)));
  pl.n_thread_ws = pl.threads;
  pl.main_bytes = align64(static_cast<size_t>(M_) * 4);  // the row terms

  // the B of a unit: x's block, its zero-point term folded into the row term (no row sums)
  const qgemm::PackedWeights probe = gemm::packed_layout(isa_, geo.C, pl.pw_cols, !a.x_signed, false);
  qgemm::QGemmParams p = pointwise_gemm_params(a);
  p.w = &probe;
  pl.gemm_bytes = qgemm::qgemm_workspace_bytes(p);
}

// The qgemm call of a unit, but for its B, y and row terms (plan and run both start here).
qgemm::QGemmParams QConv::pointwise_gemm_params(const ConvArgs& a) const {
  qgemm::QGemmParams p;
  p.M = M_;
  p.x = pw_w_;
  p.x_row_stride = Cg_;
  p.x_signed = !w_unsigned_;
  if (pw_zw_.size() > 1) {
    p.zx_per_row = pw_zw_.data();
  } else {
    p.zx = pw_zw_[0];
  }
  p.out_type = a.out_type;
  if (a.out_type != OutType::kS32) {
    p.requant = qgemm::Requant::kFloat;
    p.multiplier = a.multiplier;
    p.multiplier_per_row = a.multiplier_per_channel;
    p.zy = a.zy;
    const OutputRange r = output_range(a);
    p.has_clamp = true;
    p.clamp_lo = r.lo;
    p.clamp_hi = r.hi;
  }
  p.num_threads = 1;
  return p;
}

void QConv::run_pointwise_nchw(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const int64_t hw = geo.H * geo.W;  // = OH·OW
  const int ob = out_bytes(a.out_type);
  // qgemm's −zw'·Σ_k x'[m, k] term (eq. (5); here zw' is B's zero point: zx, shifted to
  // int8 for uint8 x, and x' = w') is a per-row constant: folded with the bias into one
  // row term, so qgemm computes no row sums and the tiles do no multiply per row.
  const int32_t zb = a.zx - (a.x_signed ? 0 : 128);
  int32_t* rowterm = reinterpret_cast<int32_t*>(ws.main.data());
  for (int64_t m = 0; m < M_; ++m) {
    const uint32_t b = a.bias ? static_cast<uint32_t>(a.bias[m]) : 0u;
    rowterm[m] = static_cast<int32_t>(b - static_cast<uint32_t>(zb) * static_cast<uint32_t>(pw_rowsum_[m]));
  }
  auto unit_fn = [&](int64_t unit, int thread) {
    const int64_t n = unit / pl.pw_parts, p0 = (unit % pl.pw_parts) * pl.pw_cols;
    const int64_t cols = std::min(pl.pw_cols, hw - p0);
    qgemm::PackedWeights& xb = ws.thread_packed[thread];
    // B[c, j] = x[n, c, p0 + j] (uint8 or int8), zero point zx; reserved: no allocation
    gemm::pack_weights_strided(static_cast<const uint8_t*>(a.x) + n * geo.C * hw + p0, !a.x_signed, geo.C, cols, hw, 1,
                               &a.zx, false, isa_, xb);
    xb.has_zero_point = false;  // its term is in rowterm
    qgemm::QGemmParams p = pointwise_gemm_params(a);
    p.w = &xb;
    p.row_bias = rowterm;
    p.y = static_cast<uint8_t*>(a.y) + (n * M_ * hw + p0) * ob;
    p.y_row_stride = hw;
    qgemm::qgemm(p, ws.thread_gemm[thread]);
  };
  run_with_affinity(pl.threads, pl.units, unit_fn);
}

// ---------------------------------------------------------------------------------------
// im2col path
// ---------------------------------------------------------------------------------------

void QConv::plan_im2col(const ConvArgs& a, const Geometry& geo, Plan& pl) const {
  const int64_t Mg = M_ / group_, ob = out_bytes(a.out_type);
  pl.direct = kh_ == 1 && kw_ == 1 && group_ == 1 && geo.sh == 1 && geo.sw == 1 && geo.pad_top == 0 &&
              geo.pad_left == 0 && geo.pad_bottom == 0 && geo.pad_right == 0;
  pl.xt_stride = pl.direct ? Kp_ : geo.C;
  pl.rows = geo.N * geo.OH * geo.OW;
  const int64_t row_bytes = (pl.direct ? 0 : Kp_) + Mg * ob;
  const int64_t max_rows = std::max<int64_t>(kMinChunkRows, kChunkBytes / std::max<int64_t>(1, row_bytes));
  int64_t target = std::max(div_up(pl.rows, max_rows),
                            std::min(int64_t{pl.threads} * kUnitsPerThread, div_up(pl.rows, kMinChunkRows)));
  // Units too few to run in parallel (fewer than 2 per thread: qgemm splits N instead)
  // are chunks for the L2 budget only: each re-reads all of B and is a job of the pool of
  // its own. A late ResNet layer has few pixels and large weights (3x3 243 -> 243 at
  // 10x4: 40 rows and 532 KB of B were two calls of 24 and 16 rows on 2 threads).
  if (pl.threads > 1 && target * group_ < 2 * int64_t{pl.threads}) target = div_up(pl.rows, max_rows);
  // Whole register tiles per chunk: avx2's 6-row tile would otherwise end every chunk of
  // 8·j rows with a short tile (56 rows = 9 x 6 + 2: the 2-row tile runs the k-loop of a
  // 6-row one at a third of its products); avx512vnni keeps multiples of 8.
  const int64_t row_step = isa_ == Isa::kAvx2 ? qgemm::kernel_family(*packed_[0]).mr : 8;
  pl.chunk_rows = std::max<int64_t>(1, round_up(div_up(pl.rows, std::max<int64_t>(1, target)), row_step));
  pl.n_chunks = div_up(pl.rows, pl.chunk_rows);
  pl.units = pl.n_chunks * group_;
  pl.parallel_units = pl.threads == 1 || pl.units >= 2 * int64_t{pl.threads};
  pl.n_thread_ws = pl.parallel_units ? pl.threads : 1;

  const size_t a_bytes = pl.direct ? 0 : align64(static_cast<size_t>(pl.chunk_rows * Kp_));
  pl.off_ybuf = a_bytes;
  // channels_last: qgemm writes y's rows in place; uint8 x with xt's stride is xt itself
  pl.x_in_place = a.channels_last && !a.x_signed && pl.xt_stride == geo.C;
  pl.thread_bytes = a_bytes + (a.channels_last ? 0 : align64(static_cast<size_t>(pl.chunk_rows * Mg * ob)));
  pl.main_bytes = pl.x_in_place ? 0 : align64(static_cast<size_t>(geo.N * geo.H * geo.W * pl.xt_stride));

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
}

void QConv::run_im2col(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const int64_t Mg = M_ / group_;
  const int64_t hw = geo.H * geo.W, ohw = geo.OH * geo.OW;
  const uint8_t flip = a.x_signed ? 0x80 : 0;
  const int32_t zx_shifted = a.zx + (a.x_signed ? 128 : 0);
  const int ob = out_bytes(a.out_type);
  uint8_t* xt_buf = ws.main.data();
  const uint8_t* xt = pl.x_in_place ? static_cast<const uint8_t*>(a.x) : xt_buf;
  const TransposeU8Fn tr_u8 = transpose_u8_for(isa_);
  const TransposeS32Fn tr_s32 = transpose_s32_for(isa_);
  const Im2colFn im2col = im2col_for(isa_);

  // 1. x -> xt (NHWC, x' domain); the columns [C, xt_stride) of the direct path are
  //    zeroed (their weight rows hold zw: any value would add nothing).
  const int64_t block = transpose_block(hw, pl.threads);
  const int64_t pix_blocks = div_up(hw, block);
  auto to_nhwc = [&](int64_t unit, int) {
    const int64_t n = unit / pix_blocks, p0 = (unit % pix_blocks) * block;
    const int64_t p1 = std::min(hw, p0 + block);
    uint8_t* dst = xt_buf + (n * hw + p0) * pl.xt_stride;
    if (a.channels_last) {  // NHWC already: a copy (flipped for int8 x), at xt's stride
      const uint8_t* src = static_cast<const uint8_t*>(a.x) + (n * hw + p0) * geo.C;
      if (pl.xt_stride == geo.C) {
        copy_flipped(src, dst, (p1 - p0) * geo.C, flip);
      } else {
        for (int64_t p = 0; p < p1 - p0; ++p) copy_flipped(src + p * geo.C, dst + p * pl.xt_stride, geo.C, flip);
      }
    } else {
      const uint8_t* src = static_cast<const uint8_t*>(a.x) + n * geo.C * hw + p0;
      tr_u8(src, hw, geo.C, p1 - p0, dst, pl.xt_stride, flip);
    }
    if (pl.xt_stride > geo.C) {
      for (int64_t p = 0; p < p1 - p0; ++p) {
        std::memset(dst + p * pl.xt_stride + geo.C, 0, static_cast<size_t>(pl.xt_stride - geo.C));
      }
    }
  };
  if (!pl.x_in_place) run_with_affinity(pl.threads, geo.N * pix_blocks, to_nhwc);

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
      im2col(xt, pl.xt_stride, geo, Cg_, g, r0, r1, static_cast<uint8_t>(zx_shifted), Kp_, buf);
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
      const OutputRange r = output_range(a);
      p.has_clamp = true;
      p.clamp_lo = r.lo;
      p.clamp_hi = r.hi;
    }
    uint8_t* ybuf = buf + pl.off_ybuf;
    p.y = a.channels_last ? static_cast<uint8_t*>(a.y) + (r0 * M_ + g * Mg) * ob : ybuf;
    p.y_row_stride = a.channels_last ? M_ : Mg;
    p.num_threads = pl.parallel_units ? 1 : pl.threads;
    qgemm::qgemm(p, ws.thread_gemm[pl.parallel_units ? thread : 0]);
    if (a.channels_last) return;  // rows [r0, r1) are y's pixels r0 .. r1 − 1

    // NHWC rows [r0, r1) -> y[n, g·Mg + j, pixel], image by image
    for (int64_t s0 = r0; s0 < r1;) {
      const int64_t n = s0 / ohw, p0 = s0 % ohw;
      const int64_t s1 = std::min(r1, (n + 1) * ohw);
      store_nchw(ybuf + (s0 - r0) * Mg * ob, s1 - s0, Mg, a.out_type, ohw, a.y, (n * M_ + g * Mg) * ohw + p0, tr_u8,
                 tr_s32);
      s0 = s1;
    }
  };
  if (pl.parallel_units) {
    run_with_affinity(pl.threads, pl.units, unit_fn);
  } else {
    for (int64_t u = 0; u < pl.units; ++u) unit_fn(u, 0);
  }
}

// ---------------------------------------------------------------------------------------
// direct small-C path (channels_last, avx512vnni): 1. the padded NHWC image of x' by row
// copies (pads zx', 64 slack bytes); 2. units = output rows, one direct_row call each.
// ---------------------------------------------------------------------------------------

void QConv::plan_direct(const ConvArgs& a, const Geometry& geo, Plan& pl) const {
  (void)a;
  pl.Hp = geo.H + geo.pad_top + geo.pad_bottom;
  pl.Wp = geo.W + geo.pad_left + geo.pad_right;
  pl.units = geo.N * geo.OH;
  const size_t cols = static_cast<size_t>(div_up(M_, 16) * 16);
  pl.off_colterm = 0;
  pl.off_mult = align64(cols * 4);
  pl.off_xpad = pl.off_mult + align64(cols * 4);
  const size_t elem = isa_ == Isa::kAvx2 ? 2 : 1;  // avx2: the image widened to int16
  pl.main_bytes = pl.off_xpad + align64(static_cast<size_t>(geo.N * pl.Hp * pl.Wp * geo.C) * elem + 64);
  pl.n_thread_ws = 0;
}

void QConv::run_direct(const ConvArgs& a, const Geometry& geo, const Plan& pl, ConvWorkspace& ws) const {
  const int64_t C = geo.C, Hp = pl.Hp, Wp = pl.Wp;
  const uint8_t flip = a.x_signed ? 0x80 : 0;
  const int32_t zx_shifted = a.zx + (a.x_signed ? 128 : 0);
  const uint8_t pad = static_cast<uint8_t>(zx_shifted);
  const int ob = out_bytes(a.out_type);
  uint8_t* xpad = ws.main.data() + pl.off_xpad;
  int32_t* colterm = reinterpret_cast<int32_t*>(ws.main.data() + pl.off_colterm);
  float* mult = reinterpret_cast<float*>(ws.main.data() + pl.off_mult);
  const int64_t cols = div_up(M_, 16) * 16;
  for (int64_t m = 0; m < cols; ++m) {  // colterm = bias − zx'·Σ w_eff (wrapping)
    const uint32_t b = m < M_ && a.bias ? static_cast<uint32_t>(a.bias[m]) : 0u;
    colterm[m] =
        m < M_ ? static_cast<int32_t>(b - static_cast<uint32_t>(zx_shifted) * static_cast<uint32_t>(direct_cs_[m])) : 0;
    mult[m] = m < M_ && a.out_type != OutType::kS32 ? a.multiplier[a.multiplier_per_channel ? m : 0] : 0.0f;
  }
  const bool avx2 = isa_ == Isa::kAvx2;
  int16_t* xpad16 = reinterpret_cast<int16_t*>(xpad);  // avx2: x' widened to int16
  if (avx2) {
    std::fill(xpad16 + geo.N * Hp * Wp * C, xpad16 + geo.N * Hp * Wp * C + 32, static_cast<int16_t>(pad));
  } else {
    std::memset(xpad + geo.N * Hp * Wp * C, pad, 64);
  }

  auto pad_row = [&](int64_t unit, int) {  // padded row `unit` of (n, row)
    const int64_t n = unit / Hp, r = unit % Hp, iy = r - geo.pad_top;
    const bool inside = iy >= 0 && iy < geo.H;
    const uint8_t* src = static_cast<const uint8_t*>(a.x) + ((n * geo.H + (inside ? iy : 0)) * geo.W) * C;
    if (avx2) {
      int16_t* dst = xpad16 + unit * Wp * C;
      const int64_t lo = inside ? geo.pad_left * C : Wp * C, hi = inside ? (geo.pad_left + geo.W) * C : Wp * C;
      for (int64_t i = 0; i < lo; ++i) dst[i] = static_cast<int16_t>(pad);
      for (int64_t i = lo; i < hi; ++i) dst[i] = static_cast<int16_t>(src[i - lo] ^ flip);
      for (int64_t i = hi; i < Wp * C; ++i) dst[i] = static_cast<int16_t>(pad);
      return;
    }
    uint8_t* dst = xpad + unit * Wp * C;
    if (!inside) {
      std::memset(dst, pad, static_cast<size_t>(Wp * C));
      return;
    }
    std::memset(dst, pad, static_cast<size_t>(geo.pad_left * C));
    copy_flipped(src, dst + geo.pad_left * C, geo.W * C, flip);
    std::memset(dst + (geo.pad_left + geo.W) * C, pad, static_cast<size_t>(geo.pad_right * C));
  };
  run_with_affinity(pl.threads, geo.N * Hp, pad_row);

  DirectRow base;
  base.row_step = geo.dh * Wp * C;
  base.pixel_step = geo.sw * C;
  base.kh = geo.kh;
  base.groups = direct_groups_;
  base.ow = geo.OW;
  base.M = M_;
  base.weights = direct_w_.data();
  base.colterm = colterm;
  base.multiplier = mult;
  base.out_type = a.out_type;
  if (a.out_type != OutType::kS32) {
    const OutputRange r = output_range(a);
    base.zy = a.zy;
    base.lo_minus_zy = static_cast<float>(r.lo - a.zy);
    base.hi_minus_zy = static_cast<float>(r.hi - a.zy);
  }
  base.weights16 = direct_w16_.data();
  auto unit_fn = [&](int64_t unit, int) {
    const int64_t n = unit / geo.OH, oy = unit % geo.OH;
    DirectRow r = base;
    r.y = static_cast<uint8_t*>(a.y) + unit * geo.OW * M_ * ob;
    if (avx2) {
      r.in16 = xpad16 + ((n * Hp + oy * geo.sh) * Wp) * C;
      direct_row_avx2(r);
    } else {
      r.in = xpad + ((n * Hp + oy * geo.sh) * Wp) * C;
      direct_row_avx512vnni(r);
    }
  };
  run_with_affinity(pl.threads, pl.units, unit_fn);
}

}  // namespace conv
}  // namespace quanta
