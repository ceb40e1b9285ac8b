// NCHW16c drivers (contract: nchwc.h): the reorders, the weight packing and the
// convolution's tiling (interior pixels in tiles of several pixels with no bound checks,
// border pixels one at a time over the taps inside the image, the ky range of each
// output row restricted at the top and bottom), threads over (image, output channel
// blocks, output row).
#include "nchwc/nchwc.h"

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <utility>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace nchwc {

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kKernelsAvx512Vnni;
    case Isa::kAvx2: return kKernelsAvx2;
    default: return kKernelsPortable;
  }
}

namespace {

// Below this many floats moved a reorder runs on the calling thread.
constexpr int64_t kMinParallelMoves = 1 << 16;
// Below this many multiply-adds a convolution runs on the calling thread (as sgemm.cc).
constexpr int64_t kMinParallelMacs = 1 << 18;

}  // namespace

void reorder_to_nchwc(const float* x, int64_t n, int64_t c, int64_t hw, float* y, int num_threads, Isa isa) {
  const int64_t cb = blocks(c);
  const sgemm::Interleave16Fn interleave = sgemm::kernels_for(isa).interleave16;
  auto body = [&](int64_t item, int) {
    const int64_t b = item % cb, img = item / cb;
    const int64_t lanes = std::min<int64_t>(kBlock, c - b * kBlock);
    const float* src = x + (img * c + b * kBlock) * hw;
    float* dst = y + item * hw * kBlock;
    if (interleave) {
      interleave(src, hw, static_cast<int>(lanes), hw, dst);
      return;
    }
    for (int64_t i = 0; i < hw; ++i) {
      float* d = dst + i * kBlock;
      for (int64_t l = 0; l < lanes; ++l) d[l] = src[l * hw + i];
      for (int64_t l = lanes; l < kBlock; ++l) d[l] = 0.0f;
    }
  };
  const int threads = n * cb * hw * kBlock < kMinParallelMoves ? 1 : num_threads;
  if (threads <= 1) {
    for (int64_t item = 0; item < n * cb; ++item) body(item, 0);
  } else {
    qgemm::parallel_for(threads, n * cb, body);
  }
}

void reorder_to_nchw(const float* x, int64_t n, int64_t c, int64_t hw, float* y, int num_threads, Isa isa) {
  const int64_t cb = blocks(c);
  const sgemm::Deinterleave16Fn deinterleave = sgemm::kernels_for(isa).deinterleave16;
  auto body = [&](int64_t item, int) {
    const int64_t b = item % cb, img = item / cb;
    const int64_t lanes = std::min<int64_t>(kBlock, c - b * kBlock);
    const float* src = x + item * hw * kBlock;
    float* dst = y + (img * c + b * kBlock) * hw;
    if (deinterleave) {
      deinterleave(src, hw, static_cast<int>(lanes), dst, hw);
      return;
    }
    for (int64_t l = 0; l < lanes; ++l) {
      float* d = dst + l * hw;
      for (int64_t i = 0; i < hw; ++i) d[i] = src[i * kBlock + l];
    }
  };
  const int threads = n * cb * hw * kBlock < kMinParallelMoves ? 1 : num_threads;
  if (threads <= 1) {
    for (int64_t item = 0; item < n * cb; ++item) body(item, 0);
  } else {
    qgemm::parallel_for(threads, n * cb, body);
  }
}

void pack_weights(const float* w, int64_t m, int64_t c, int64_t kh, int64_t kw, bool depthwise, float* out) {
  const int64_t taps = kh * kw, cbs = blocks(c);
  std::memset(out, 0, sizeof(float) * static_cast<size_t>(packed_size(m, c, kh, kw, depthwise)));
  if (depthwise) {
    // [Cb][kh][kw][16]
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t t = 0; t < taps; ++t) out[((ch / kBlock) * taps + t) * kBlock + ch % kBlock] = w[ch * taps + t];
    return;
  }
  // [Mb][Cb][kh][kw][16 input lanes][16 output lanes]
  for (int64_t o = 0; o < m; ++o)
    for (int64_t ch = 0; ch < c; ++ch)
      for (int64_t t = 0; t < taps; ++t) {
        const int64_t blk = ((o / kBlock) * cbs + ch / kBlock) * taps + t;
        out[(blk * kBlock + ch % kBlock) * kBlock + o % kBlock] = w[(o * c + ch) * taps + t];
      }
}

namespace {

// The taps [k0, k1) of a window starting at input index i0 (stride between taps d) that
// fall inside [0, size).
inline void tap_range(int64_t i0, int64_t d, int64_t k, int64_t size, int64_t* k0, int64_t* k1) {
  const int64_t lo = i0 >= 0 ? 0 : (-i0 + d - 1) / d;
  const int64_t hi = i0 > size - 1 ? 0 : std::min<int64_t>(k, (size - 1 - i0) / d + 1);
  *k0 = std::min(lo, k);
  *k1 = std::max(hi, *k0);
}

// The output indices [lo, hi) whose whole window lies inside [0, size).
inline void interior(int64_t pad, int64_t s, int64_t d, int64_t k, int64_t size, int64_t out, int64_t* lo,
                     int64_t* hi) {
  *lo = std::min<int64_t>((pad + s - 1) / s, out);
  const int64_t last = size - 1 - (k - 1) * d + pad;  // o·s ≤ last
  *hi = last < 0 ? 0 : std::min<int64_t>(last / s + 1, out);
  if (*hi < *lo) *hi = *lo;
}

}  // namespace

void conv(const ConvGeom& geom, const float* x, const float* w_packed, const float* bias16, float lo, float hi,
          const sgemm::PostOp* post, float* y, int num_threads, Isa isa, const float* sum) {
  const Kernels& kr = kernels_for(isa);
  // A 1x1 convolution of stride 1 without pads maps the plane's pixels one to one: it runs
  // as rows of w' pixels, w' the largest divisor of H·W that leaves at least 4 rows (so
  // 2 threads still find items), so fewer tiles are cut short at a row's end (26x26: 4
  // rows of 169 instead of 26 rows of 26 that each end in a tile of 2). The same chains:
  // the same bytes.
  ConvGeom g = geom;
  if (g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.oh == g.h && g.ow == g.w && g.pt == 0 && g.pl == 0 &&
      g.h >= 4) {
    const int64_t hw = g.h * g.w;
    int64_t wide = g.w;
    for (int64_t d = hw / 4; d > g.w; --d) {
      if (hw % d == 0) {
        wide = d;
        break;
      }
    }
    g.w = g.ow = wide;
    g.h = g.oh = hw / wide;
  }
  // A k x 1 convolution of a one-column plane (a 1-D convolution written along H: jax2tf's
  // Conv1D, magika's [N, 256, 512, 1]) runs as its 1 x k twin with H and W exchanged: the
  // tensors [N, Cb, H, 1, 16] and [N, Cb, 1, H, 16] and the packed weights
  // [Mb][Cb][k][1][16][16] and [Mb][Cb][1][k][16][16] are the same bytes, and each chain
  // takes the same taps in the same order, so the same bytes come out; but the tiles run
  // along the row, several output pixels per tile, where a column gives one pixel a tile.
  if (g.w == 1 && g.kw == 1 && g.ow == 1 && g.pl == 0 && g.oh > 1) {
    std::swap(g.h, g.w);
    std::swap(g.kh, g.kw);
    std::swap(g.sh, g.sw);
    std::swap(g.dh, g.dw);
    std::swap(g.pt, g.pl);
    std::swap(g.oh, g.ow);
  }
  // A 1x1 convolution of stride 1 without pads reads pixel i of the input for output pixel
  // i: an item's rows are one run of pixels in memory (input and output), so they run as
  // one line, as MLAS's pointwise kernel takes a whole plane. Tiles then end once an item,
  // not once a row (a 13 x 13 plane, whose 169 pixels have no divisor to widen its rows, ran
  // rows of 13 as 3 + 3 + 3 + 2 + 2). The same chains: the same bytes.
  const bool flat = g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.oh == g.h && g.ow == g.w && g.pt == 0 &&
                    g.pl == 0 && !g.depthwise;
  const int64_t cbs = blocks(g.c), mbs = blocks(g.m), taps = g.kh * g.kw;
  const int64_t plane = g.h * g.w, oplane = g.oh * g.ow;
  int64_t ox_lo, ox_hi;
  interior(g.pl, g.sw, g.dw, g.kw, g.w, g.ow, &ox_lo, &ox_hi);
  // input strides in floats: NCHW16c, or plain planes (the stem)
  const int64_t xs_lane = g.input_nchw ? plane : 1;
  const int64_t xs_px = g.input_nchw ? 1 : kBlock;  // one input column
  const int64_t xs_cb = kBlock * plane;             // 16 channels: a block, or 16 planes
  const int64_t x_img = g.input_nchw ? g.c * plane : cbs * kBlock * plane;
  const int64_t y_img = mbs * kBlock * oplane;
  int max_nb = kr.max_nb;  // nchwc.h kWideRow
  if (!flat && g.ow < kWideRow)
    while (max_nb < kMaxNb && kr.max_p[max_nb] > 0) ++max_nb;
  const int64_t groups = g.depthwise ? mbs : (mbs + max_nb - 1) / max_nb;
  // Group 1: the input channel blocks run in passes whose weights (the group's output
  // blocks × the pass's input blocks × the taps) fit in L1 beside the input rows, over
  // items of several output rows (an output chunk that stays in L2 between passes), so a
  // pass's weights are read from L1 by every tile of those rows instead of streaming the
  // whole filter from L2 for each tile.
  constexpr int64_t kPassWeightBytes = 24 << 10, kItemOutBytes = 96 << 10;
  const int64_t group_nb = std::min<int64_t>(max_nb, mbs);
  const int64_t cb_pass =
      std::max<int64_t>(1, kPassWeightBytes / (group_nb * taps * kBlock * kBlock * int64_t{sizeof(float)}));
  const int64_t rows_per_item =
      g.depthwise
          ? 1
          : std::max<int64_t>(
                1, std::min<int64_t>(g.oh, kItemOutBytes / (g.ow * group_nb * kBlock * int64_t{sizeof(float)})));
  const int64_t row_items = (g.oh + rows_per_item - 1) / rows_per_item;
  const int64_t macs = g.n * g.oh * g.ow * mbs * kBlock * (g.depthwise ? 1 : g.c) * taps;
  const int threads = macs < kMinParallelMacs ? 1 : num_threads;
  // Images whose rows all fit in one item (a 1-D sequence model's Conv1d written as 1 x k
  // over [N, C, 1, W]) run several to an item, each pass over all of them: the pass's
  // weights are read from L1 by the rows of every image of the item instead of fetched
  // again from L2 for each image (slovorez's 256 -> 192, 1 x 5 on 8 rows of 16: 1.48x
  // ONNX Runtime's time, against 1.12x for one row of 128). Enough items stay for the
  // threads. Each pixel's chain (input channel block, ky, kx, lane) is unchanged: the
  // same bytes.
  int64_t imgs_per_item = 1;
  if (!g.depthwise && row_items == 1 && g.n > 1) {
    const int64_t per_img = g.oh * g.ow * group_nb * kBlock * int64_t{sizeof(float)};
    imgs_per_item = std::max<int64_t>(1, std::min<int64_t>(g.n, kItemOutBytes / per_img));
    const int64_t want = threads <= 1 ? 1 : std::min<int64_t>(g.n * groups, int64_t{4} * threads);
    while (imgs_per_item > 1 && (g.n + imgs_per_item - 1) / imgs_per_item * groups < want) --imgs_per_item;
  }
  const int64_t items = (g.n + imgs_per_item - 1) / imgs_per_item * groups * row_items;

  auto row = [&](int64_t item, int) {
    const int64_t oy = item % row_items * rows_per_item, rest = item / row_items;
    const int64_t grp = rest % groups, img = rest / groups * imgs_per_item;
    const int64_t img_end = std::min(g.n, img + imgs_per_item);
    const int64_t iy0 = oy * g.sh - g.pt;
    int64_t ky0, ky1;
    tap_range(iy0, g.dh, g.kh, g.h, &ky0, &ky1);
    if (g.depthwise) {
      const int64_t b = grp;
      DwTile t;
      t.x = x + img * x_img + b * kBlock * plane + (iy0 + ky0 * g.dh) * g.w * kBlock;
      t.xs_row = g.dh * g.w * kBlock;
      t.xs_col = g.dw * kBlock;
      t.xs_pix = g.sw * kBlock;
      t.nky = static_cast<int>(ky1 - ky0);
      t.w = w_packed + (b * taps + ky0 * g.kw) * kBlock;
      t.ws_row = g.kw * kBlock;
      t.bias = bias16 ? bias16 + b * kBlock : nullptr;
      t.lo = lo;
      t.hi = hi;
      float* yrow = y + img * y_img + (b * oplane + oy * g.ow) * kBlock;
      const float* xrow = t.x;
      const float* wrow = t.w;
      auto border = [&](int64_t ox) {
        const int64_t ix0 = ox * g.sw - g.pl;
        int64_t kx0, kx1;
        tap_range(ix0, g.dw, g.kw, g.w, &kx0, &kx1);
        t.x = xrow + (ix0 + kx0 * g.dw) * kBlock;
        t.w = wrow + kx0 * kBlock;
        t.nkx = static_cast<int>(kx1 - kx0);
        t.y = yrow + ox * kBlock;
        kr.dw[0](t, 1);
      };
      for (int64_t ox = 0; ox < ox_lo; ++ox) border(ox);
      t.nkx = static_cast<int>(g.kw);
      t.w = wrow;
      // the interior: full tiles in one call, then the remainder
      const int64_t interior = std::max<int64_t>(0, ox_hi - ox_lo), full = interior / kr.dw_max_p;
      const int64_t rest = interior - full * kr.dw_max_p;
      if (full > 0) {
        t.x = xrow + (ox_lo * g.sw - g.pl) * kBlock;
        t.y = yrow + ox_lo * kBlock;
        kr.dw[kr.dw_max_p - 1](t, full);
      }
      if (rest > 0) {
        const int64_t ox = ox_lo + full * kr.dw_max_p;
        t.x = xrow + (ox * g.sw - g.pl) * kBlock;
        t.y = yrow + ox * kBlock;
        kr.dw[rest - 1](t, 1);
      }
      for (int64_t ox = std::max(ox_hi, ox_lo); ox < g.ow; ++ox) border(ox);
      if (post) sgemm::apply_post(*post, yrow, g.ow * kBlock);
      return;
    }
    const int64_t ob0 = grp * max_nb;
    const int nb = static_cast<int>(std::min<int64_t>(max_nb, mbs - ob0));
    const int max_p = kr.max_p[nb - 1];
    const int64_t oy1 = std::min(g.oh, oy + rows_per_item);
    ConvTile t;
    t.xs_cb = xs_cb;
    t.xs_row = g.dh * g.w * xs_px;
    t.xs_col = g.dw * xs_px;
    t.xs_lane = xs_lane;
    t.xs_pix = g.sw * xs_px;
    t.ws_ob = cbs * taps * kBlock * kBlock;
    t.ws_cb = taps * kBlock * kBlock;
    t.ws_row = g.kw * kBlock * kBlock;
    t.bias = bias16 ? bias16 + ob0 * kBlock : nullptr;
    t.lo = lo;
    t.hi = hi;
    t.ys_ob = oplane * kBlock;
    // A row of 2-3 pixels runs as one tile, each pixel over its own taps (nchwc.h
    // RowTaps): as a border pair and a one-pixel tile it is 2 + 1 chains per output block,
    // the one-pixel tile waiting on its own fma latency.
    const bool whole_row = !flat && kr.row[nb - 1] != nullptr && g.ow >= 2 && g.ow <= kMaxRowP;
    RowTaps row_taps{};
    if (whole_row) {
      row_taps.p = static_cast<int>(g.ow);
      for (int i = 0; i < row_taps.p; ++i) {
        const int64_t ix0 = i * g.sw - g.pl;
        int64_t kx0, kx1;
        tap_range(ix0, g.dw, g.kw, g.w, &kx0, &kx1);
        row_taps.kx0[i] = static_cast<int>(kx0);
        row_taps.kx1[i] = static_cast<int>(kx1);
        row_taps.x_pix[i] = ix0 * xs_px;
      }
    }
    for (int64_t cb0 = 0; cb0 < cbs; cb0 += cb_pass) {
      t.cbs = std::min(cb_pass, cbs - cb0);
      t.last_lanes = cb0 + t.cbs == cbs ? static_cast<int>(g.c - (cbs - 1) * kBlock) : kBlock;
      t.first = cb0 == 0;
      t.last = cb0 + t.cbs == cbs;
      // The weights of the pass that runs next on this thread (this item's next pass, or
      // the first pass of the next item: the same group's next rows, else the next group)
      // are prefetched into L2 in equal shares before each row of this pass: the next
      // pass's first tiles otherwise wait on them (a 512 -> 512 3x3 filter is 9.4 MB, read
      // once per 7 x 7 image from L3 or memory; the border pairs, which run first in a
      // row, took more time than the interior tiles).
      const int64_t next_cb = t.last ? 0 : cb0 + t.cbs;
      const int64_t next_ob = t.last && oy1 == g.oh ? ob0 + nb : ob0;
      const int next_nb = static_cast<int>(std::min<int64_t>(max_nb, mbs - next_ob));
      const int64_t next_floats = std::min(cb_pass, cbs - next_cb) * t.ws_cb;
      const int64_t next_lines = next_nb > 0 ? next_floats / 16 : 0;  // 64-byte lines per block
      const int64_t rows = oy1 - oy;
      // a line: the item's rows (flat), else one row
      const int64_t line_rows = flat ? rows : 1, line_w = line_rows * g.ow;
      const int64_t x_hi = flat ? line_w : ox_hi;
      // the next pass's lines in equal shares over the item's rows of all its images
      const int64_t lines_of = (img_end - img) * rows;
      for (int64_t im = img; im < img_end; ++im)
        for (int64_t r = oy; r < oy1; r += line_rows) {
          {
            const int64_t at = (im - img) * rows + r - oy;
            const int64_t l0 = next_lines * at / lines_of, l1 = next_lines * (at + line_rows) / lines_of;
            for (int b = 0; b < next_nb; ++b) {
              const float* p = w_packed + (next_ob + b) * t.ws_ob + next_cb * t.ws_cb;
              for (int64_t l = l0; l < l1; ++l) __builtin_prefetch(p + l * 16, 0, 2);
            }
          }
          const int64_t ry0 = r * g.sh - g.pt;
          int64_t ky0, ky1;
          tap_range(ry0, g.dh, g.kh, g.h, &ky0, &ky1);
          t.nky = static_cast<int>(ky1 - ky0);
          const float* xrow = x + im * x_img + cb0 * xs_cb + (ry0 + ky0 * g.dh) * g.w * xs_px;
          const float* wrow = w_packed + ob0 * t.ws_ob + cb0 * t.ws_cb + ky0 * t.ws_row;
          float* yrow = y + im * y_img + (ob0 * oplane + r * g.ow) * kBlock;
          auto border = [&](int64_t ox) {
            const int64_t ix0 = ox * g.sw - g.pl;
            int64_t kx0, kx1;
            tap_range(ix0, g.dw, g.kw, g.w, &kx0, &kx1);
            t.x = xrow + (ix0 + kx0 * g.dw) * xs_px;
            t.w = wrow + kx0 * kBlock * kBlock;
            t.nkx = static_cast<int>(kx1 - kx0);
            t.y = yrow + ox * kBlock;
            t.sum = sum ? sum + (t.y - y) : nullptr;  // the sum operand has y's layout
          };
          if (whole_row) {
            t.x = xrow;
            t.w = wrow;
            t.nkx = static_cast<int>(g.kw);
            t.y = yrow;
            t.sum = sum ? sum + (yrow - y) : nullptr;
            kr.row[nb - 1](t, row_taps);
            continue;
          }
          // border pixels: the left ones paired with the right ones (two chains at a time)
          const int64_t right0 = std::max(x_hi, ox_lo);
          int64_t left = 0, right = right0;
          while (left < ox_lo && right < line_w) {
            border(left++);
            ConvTile a = t;
            border(right++);
            kr.pair[nb - 1](a, t);
          }
          while (left < ox_lo) {
            border(left++);
            kr.tile[nb - 1][0](t, 1);
          }
          while (right < line_w) {
            border(right++);
            kr.tile[nb - 1][0](t, 1);
          }
          t.nkx = static_cast<int>(g.kw);
          t.w = wrow;
          // the interior in as few tiles as max_p allows, of nearly equal sizes (8 pixels: 4 + 4,
          // not 6 + 2, whose 2-pixel tile loads as many weight vectors for a third of the fmas):
          // `more` tiles of q + 1 pixels, then the rest of q, each run one call
          const int64_t interior = x_hi - ox_lo;
          if (interior > 0) {
            const int64_t tiles = (interior + max_p - 1) / max_p, q = interior / tiles, more = interior % tiles;
            int64_t ox = ox_lo;
            for (const auto& [p, count] : {std::pair<int64_t, int64_t>{q + 1, more}, {q, tiles - more}}) {
              if (count == 0) continue;
              t.x = xrow + (ox * g.sw - g.pl) * xs_px;
              t.y = yrow + ox * kBlock;
              t.sum = sum ? sum + (t.y - y) : nullptr;
              kr.tile[nb - 1][p - 1](t, count);
              ox += p * count;
            }
          }
        }
    }
    // the post op once per output block over the item's finished rows (contiguous in y,
    // still in L2), not once per row: a 7-pixel row is 112 floats, less than the call costs
    if (post) {
      for (int64_t im = img; im < img_end; ++im) {
        float* yitem = y + im * y_img + (ob0 * oplane + oy * g.ow) * kBlock;
        for (int b = 0; b < nb; ++b) sgemm::apply_post(*post, yitem + b * t.ys_ob, (oy1 - oy) * g.ow * kBlock);
      }
    }
  };
  if (threads <= 1 || items == 1) {
    for (int64_t item = 0; item < items; ++item) row(item, 0);
  } else {
    qgemm::parallel_for(threads, items, row);
  }
}

void max_pool(const float* x, int64_t planes, const PoolGeom& g, float* y, int num_threads, Isa isa) {
  const Kernels& kr = kernels_for(isa);
  const int64_t in = g.h * g.w * kBlock, out = g.oh * g.ow * kBlock;
  auto body = [&](int64_t p, int) { kr.max_pool_plane(x + p * in, g, y + p * out); };
  const int threads = planes * out * g.kh * g.kw < kMinParallelMoves ? 1 : num_threads;
  if (threads <= 1 || planes == 1) {
    for (int64_t p = 0; p < planes; ++p) body(p, 0);
  } else {
    qgemm::parallel_for(threads, planes, body);
  }
}

void global_avg_pool(const float* x, int64_t planes, int64_t hw, float* y, int num_threads, Isa isa) {
  const Kernels& kr = kernels_for(isa);
  auto body = [&](int64_t p, int) { kr.gap_block(x + p * hw * kBlock, hw, y + p * kBlock); };
  const int threads = planes * hw * kBlock < kMinParallelMoves ? 1 : num_threads;
  if (threads <= 1 || planes == 1) {
    for (int64_t p = 0; p < planes; ++p) body(p, 0);
  } else {
    qgemm::parallel_for(threads, planes, body);
  }
}

void resize_nearest(const float* x, int64_t planes, int64_t h, int64_t w, int64_t fy, int64_t fx, float* y,
                    int num_threads) {
  const int64_t ow = w * fx, out_row = ow * kBlock;
  auto body = [&](int64_t item, int) {  // one input row of one plane: its fy output rows
    const int64_t p = item / h, iy = item % h;
    const float* src = x + (p * h + iy) * w * kBlock;
    float* dst = y + (p * h * fy + iy * fy) * out_row;
    for (int64_t ix = 0; ix < w; ++ix)
      for (int64_t r = 0; r < fx; ++r)
        std::memcpy(dst + (ix * fx + r) * kBlock, src + ix * kBlock, sizeof(float) * kBlock);
    for (int64_t r = 1; r < fy; ++r) std::memcpy(dst + r * out_row, dst, sizeof(float) * static_cast<size_t>(out_row));
  };
  const int64_t items = planes * h;
  const int threads = items * fy * out_row < kMinParallelMoves ? 1 : num_threads;
  if (threads <= 1 || items == 1) {
    for (int64_t i = 0; i < items; ++i) body(i, 0);
  } else {
    qgemm::parallel_for(threads, items, body);
  }
}

}  // namespace nchwc
}  // namespace quanta
