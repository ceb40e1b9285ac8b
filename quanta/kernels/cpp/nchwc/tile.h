// The NCHW16c micro-kernels, written once over a 16-float block type O and included by
// each ISA's file (nchwc_<isa>.cc) inside its anonymous namespace. O provides:
//   V                      16 floats (one zmm, two ymm, or an array)
//   zero(), set1(f), load(p), store(p, v), add(a, b), div(a, b), max(a, b), min(a, b)
//   max_nan(m, v)          max(m, v) per lane, NaN when either is NaN
//   fma(a, b, c)           a·b + c per lane, one rounding
//   fma_bcast(w, p, c)     w·p[0] + c per lane, one rounding (AVX-512: an embedded broadcast)
//   kEmbedMaxNb            tiles of up to this many output blocks use fma_bcast per fma;
//                          wider ones broadcast each input value once (set1) for all blocks
//   kDwRowReuse            depthwise rows of 3 or 5 taps load each input pixel once for
//                          its taps (S·(P − 1) + K vectors live at once: 32 zmm hold
//                          them, 16 ymm pairs do not)
// max(set1(lo), v) and min(set1(hi), v) keep a NaN v (vmaxps / vminps return their second
// operand when either is NaN), as the GEMM's clamp does.
//
// The accumulators are arrays indexed by compile-time constants in fully unrolled loops, so
// they live in registers (checked in the generated code: no stack traffic in the tap loop).
#pragma once

#include "nchwc/nchwc.h"

template <class O, int NB>
inline void nchwc_finish(typename O::V (&acc)[NB], const float* bias, float lo, float hi, float* y, int64_t ys_ob,
                         const float* sum) {
  for (int ob = 0; ob < NB; ++ob) {
    typename O::V v = acc[ob];
    if (bias) v = O::add(v, O::load(bias + ob * 16));
    if (sum) v = O::add(v, O::load(sum + ob * ys_ob));
    if (lo != -__builtin_inff()) v = O::max(O::set1(lo), v);
    if (hi != __builtin_inff()) v = O::min(O::set1(hi), v);
    O::store(y + ob * ys_ob, v);
  }
}

// One input lane of every tap step: NB weight vectors, then P × NB fma with the pixel's
// input value broadcast.
template <class O, int P, int NB>
inline __attribute__((always_inline)) void nchwc_lane(typename O::V (&acc)[P][NB], const float* x, int64_t xs_pix,
                                                      const float* w, int64_t ws_ob) {
  typename O::V wv[NB];
#pragma GCC unroll 4
  for (int ob = 0; ob < NB; ++ob) wv[ob] = O::load(w + ob * ws_ob);
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
    if constexpr (NB <= O::kEmbedMaxNb) {
#pragma GCC unroll 4
      for (int ob = 0; ob < NB; ++ob) acc[p][ob] = O::fma_bcast(wv[ob], x + p * xs_pix, acc[p][ob]);
    } else {
      const typename O::V xv = O::set1(x[p * xs_pix]);
#pragma GCC unroll 4
      for (int ob = 0; ob < NB; ++ob) acc[p][ob] = O::fma(wv[ob], xv, acc[p][ob]);
    }
  }
}

// kPix: the input pixel stride t.xs_pix as a compile-time constant (16 and 32: stride 1
// and 2 on NCHW16c; 1 and 2 on the plain planes of a stem), 0 to read it from t. With a
// constant, the P broadcasts of a lane step are fixed displacements from one pointer; read
// from t, GCC computes them as a chain of pointer adds between the fmas (1 x 1, 16 -> 16
// channels on a 64 x 64 plane: 33.5 -> 27.6 us, one thread).
template <class O, int P, int NB, int64_t kPix>
inline __attribute__((always_inline)) void nchwc_conv_tile_body(const quanta::nchwc::ConvTile& t) {
  typename O::V acc[P][NB];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
    for (int ob = 0; ob < NB; ++ob) acc[p][ob] = t.first ? O::zero() : O::load(t.y + ob * t.ys_ob + p * 16);
  }
  const float* xc = t.x;
  const float* wc = t.w;
  const int64_t xs_pix = kPix ? kPix : t.xs_pix, ws_ob = t.ws_ob, xs_lane = t.xs_lane;
  for (int64_t cb = 0; cb < t.cbs; ++cb, xc += t.xs_cb, wc += t.ws_cb) {
    const int lanes = cb + 1 < t.cbs ? 16 : t.last_lanes;
    for (int ky = 0; ky < t.nky; ++ky) {
      const float* xr = xc + ky * t.xs_row;
      const float* wr = wc + ky * t.ws_row;
      for (int kx = 0; kx < t.nkx; ++kx) {
        const float* xk = xr + kx * t.xs_col;
        const float* wk = wr + kx * 256;
        // A plain loop over the lanes, not unrolled: unrolled 16 times, GCC interleaves the
        // lanes' steps and runs out of registers (accumulators spilled, per-lane addresses
        // reloaded from the stack); rolled, each lane is 4 weight loads, 6 broadcasts and
        // 24 fmas on pointers that advance by one float and one vector.
#pragma GCC unroll 1
        for (int l = 0; l < lanes; ++l) nchwc_lane<O, P, NB>(acc, xk + l * xs_lane, xs_pix, wk + l * 16, ws_ob);
      }
    }
  }
  if (!t.last) {
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
      for (int ob = 0; ob < NB; ++ob) O::store(t.y + ob * t.ys_ob + p * 16, acc[p][ob]);
    }
    return;
  }
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p)
    nchwc_finish<O, NB>(acc[p], t.bias, t.lo, t.hi, t.y + p * 16, t.ys_ob, t.sum ? t.sum + p * 16 : nullptr);
}

// One tile, not inlined: a tile of 3-4 output blocks keeps 18-24 accumulators live, and
// inlined into the run's loop GCC spilled its addresses to the stack (PP-LCNet's 1 x 1,
// 256 -> 256 on 14 x 14: 240 -> 330 us); those tiles do enough work to pay their call.
template <class O, int P, int NB, int64_t kPix>
__attribute__((noinline)) void nchwc_conv_tile_call(const quanta::nchwc::ConvTile& t) {
  nchwc_conv_tile_body<O, P, NB, kPix>(t);
}

template <class O, int P, int NB, int64_t kPix>
inline __attribute__((always_inline)) void nchwc_conv_tiles(const quanta::nchwc::ConvTile& t0, int64_t count) {
  quanta::nchwc::ConvTile t = t0;
  const int64_t dx = P * (kPix ? kPix : t0.xs_pix);
  for (int64_t i = 0; i < count; ++i) {
    if constexpr (NB <= 2) {
      nchwc_conv_tile_body<O, P, NB, kPix>(t);
    } else {
      nchwc_conv_tile_call<O, P, NB, kPix>(t);
    }
    t.x += dx;
    t.y += P * 16;
    if (t.sum) t.sum += P * 16;
  }
}

template <class O, int P, int NB>
void nchwc_conv_tile(const quanta::nchwc::ConvTile& t, int64_t count) {
  // one pixel: no broadcasts to place, the generic form only
  if constexpr (P == 1) {
    nchwc_conv_tiles<O, P, NB, 0>(t, count);
  } else if (t.xs_pix == 16) {
    nchwc_conv_tiles<O, P, NB, 16>(t, count);
  } else if (t.xs_pix == 32) {
    nchwc_conv_tiles<O, P, NB, 32>(t, count);
  } else if (t.xs_pix == 2) {
    nchwc_conv_tiles<O, P, NB, 2>(t, count);
  } else if (t.xs_pix == 1) {
    nchwc_conv_tiles<O, P, NB, 1>(t, count);
  } else {
    nchwc_conv_tiles<O, P, NB, 0>(t, count);
  }
}

// Two border pixels of one row (their own x, w, nkx and y; everything else from a): the
// two chains interleaved, so a pixel of one or two output blocks is not one fma chain
// waiting on its own latency. Each pixel's chain keeps its order: per (cb, ky) its taps
// in increasing kx, per tap its lanes.
template <class O, int NB>
void nchwc_conv_pair(const quanta::nchwc::ConvTile& a, const quanta::nchwc::ConvTile& b) {
  typename O::V acc[2][NB];
#pragma GCC unroll 4
  for (int ob = 0; ob < NB; ++ob) {
    acc[0][ob] = a.first ? O::zero() : O::load(a.y + ob * a.ys_ob);
    acc[1][ob] = a.first ? O::zero() : O::load(b.y + ob * a.ys_ob);
  }
  const int64_t ws_ob = a.ws_ob, xs_lane = a.xs_lane;
  const int both = a.nkx < b.nkx ? a.nkx : b.nkx;
  for (int64_t cb = 0; cb < a.cbs; ++cb) {
    const int lanes = cb + 1 < a.cbs ? 16 : a.last_lanes;
    for (int ky = 0; ky < a.nky; ++ky) {
      const float* xa = a.x + cb * a.xs_cb + ky * a.xs_row;
      const float* xb = b.x + cb * a.xs_cb + ky * a.xs_row;
      const float* wa = a.w + cb * a.ws_cb + ky * a.ws_row;
      const float* wb = b.w + cb * a.ws_cb + ky * a.ws_row;
      for (int kx = 0; kx < both; ++kx) {
#pragma GCC unroll 1
        for (int l = 0; l < lanes; ++l) {
          const float* pa = wa + kx * 256 + l * 16;
          const float* pb = wb + kx * 256 + l * 16;
          const typename O::V sa = O::set1(xa[kx * a.xs_col + l * xs_lane]);
          const typename O::V sb = O::set1(xb[kx * a.xs_col + l * xs_lane]);
#pragma GCC unroll 4
          for (int ob = 0; ob < NB; ++ob) {
            acc[0][ob] = O::fma(O::load(pa + ob * ws_ob), sa, acc[0][ob]);
            acc[1][ob] = O::fma(O::load(pb + ob * ws_ob), sb, acc[1][ob]);
          }
        }
      }
      for (int kx = both; kx < a.nkx; ++kx) {
        typename O::V(&one)[1][NB] = reinterpret_cast<typename O::V(&)[1][NB]>(acc[0]);
        for (int l = 0; l < lanes; ++l)
          nchwc_lane<O, 1, NB>(one, xa + kx * a.xs_col + l * xs_lane, 0, wa + kx * 256 + l * 16, ws_ob);
      }
      for (int kx = both; kx < b.nkx; ++kx) {
        typename O::V(&one)[1][NB] = reinterpret_cast<typename O::V(&)[1][NB]>(acc[1]);
        for (int l = 0; l < lanes; ++l)
          nchwc_lane<O, 1, NB>(one, xb + kx * a.xs_col + l * xs_lane, 0, wb + kx * 256 + l * 16, ws_ob);
      }
    }
  }
  if (!a.last) {
#pragma GCC unroll 4
    for (int ob = 0; ob < NB; ++ob) {
      O::store(a.y + ob * a.ys_ob, acc[0][ob]);
      O::store(b.y + ob * a.ys_ob, acc[1][ob]);
    }
    return;
  }
  nchwc_finish<O, NB>(acc[0], a.bias, a.lo, a.hi, a.y, a.ys_ob, a.sum);
  nchwc_finish<O, NB>(acc[1], a.bias, a.lo, a.hi, b.y, a.ys_ob, b.sum);
}

// One weight tap of a narrow row (nchwc_conv_row): per lane, NB weight vectors loaded once,
// then for each pixel in M (bit i: pixel i takes this tap) its input value broadcast and NB
// fmas. The lanes run in increasing order, so each pixel's chain keeps (cb, ky, kx, lane).
template <class O, int P, int NB, unsigned M>
inline __attribute__((always_inline)) void nchwc_row_tap(typename O::V (&acc)[P][NB], const float* const (&xp)[P],
                                                         const float* wk, int64_t ws_ob, int64_t xs_lane, int lanes) {
#pragma GCC unroll 1
  for (int l = 0; l < lanes; ++l) {
    typename O::V wv[NB];
#pragma GCC unroll 4
    for (int ob = 0; ob < NB; ++ob) wv[ob] = O::load(wk + l * 16 + ob * ws_ob);
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
      if (((M >> p) & 1u) != 0) {  // a constant once the loop is unrolled
        if constexpr (NB <= O::kEmbedMaxNb) {
#pragma GCC unroll 4
          for (int ob = 0; ob < NB; ++ob) acc[p][ob] = O::fma_bcast(wv[ob], xp[p] + l * xs_lane, acc[p][ob]);
        } else {
          const typename O::V xv = O::set1(xp[p][l * xs_lane]);
#pragma GCC unroll 4
          for (int ob = 0; ob < NB; ++ob) acc[p][ob] = O::fma(wv[ob], xv, acc[p][ob]);
        }
      }
    }
  }
}

// The tap loop of nchwc_row_tap for the run-time pixel set `mask`: one compile-time
// instance per set, chosen by comparison (mask < 2^P; 0 takes no fma).
template <class O, int P, int NB, unsigned M = 1>
inline __attribute__((always_inline)) void nchwc_row_tap_mask(unsigned mask, typename O::V (&acc)[P][NB],
                                                              const float* const (&xp)[P], const float* wk,
                                                              int64_t ws_ob, int64_t xs_lane, int lanes) {
  if constexpr (M < (1u << P)) {
    if (mask == M) {
      nchwc_row_tap<O, P, NB, M>(acc, xp, wk, ws_ob, xs_lane, lanes);
      return;
    }
    nchwc_row_tap_mask<O, P, NB, M + 1>(mask, acc, xp, wk, ws_ob, xs_lane, lanes);
  }
}

// A whole output row of P pixels (nchwc.h ConvRowFn): per (cb, ky) the window's taps kx in
// increasing order, each tap's weights loaded once for every pixel that takes it (pixel i:
// kx in [r.kx0[i], r.kx1[i])). Where the pair and a one-pixel tile run a 3-pixel row as
// 2 + 1 chains per block (the one-pixel tile waits on its own fma latency), this keeps P·NB
// chains and a third of the weight loads. Each pixel's chain: (cb, ky, kx, lane), as the tiles.
template <class O, int P, int NB>
void nchwc_conv_row_p(const quanta::nchwc::ConvTile& t, const quanta::nchwc::RowTaps& r) {
  typename O::V acc[P][NB];
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
    for (int ob = 0; ob < NB; ++ob) acc[p][ob] = t.first ? O::zero() : O::load(t.y + ob * t.ys_ob + p * 16);
  }
  for (int64_t cb = 0; cb < t.cbs; ++cb) {
    const int lanes = cb + 1 < t.cbs ? 16 : t.last_lanes;
    for (int ky = 0; ky < t.nky; ++ky) {
      const float* xr = t.x + cb * t.xs_cb + ky * t.xs_row;
      const float* wr = t.w + cb * t.ws_cb + ky * t.ws_row;
      for (int kx = 0; kx < t.nkx; ++kx) {
        // pixel i's input at tap kx, formed only for the pixels that take it (the others'
        // columns lie outside the row)
        unsigned mask = 0;
        const float* xp[P];
#pragma GCC unroll 4
        for (int p = 0; p < P; ++p) {
          const bool in = kx >= r.kx0[p] && kx < r.kx1[p];
          mask |= in ? 1u << p : 0u;
          xp[p] = in ? xr + r.x_pix[p] + kx * t.xs_col : xr;
        }
        nchwc_row_tap_mask<O, P, NB>(mask, acc, xp, wr + kx * 256, t.ws_ob, t.xs_lane, lanes);
      }
    }
  }
  if (!t.last) {
#pragma GCC unroll 4
    for (int p = 0; p < P; ++p) {
#pragma GCC unroll 4
      for (int ob = 0; ob < NB; ++ob) O::store(t.y + ob * t.ys_ob + p * 16, acc[p][ob]);
    }
    return;
  }
#pragma GCC unroll 4
  for (int p = 0; p < P; ++p)
    nchwc_finish<O, NB>(acc[p], t.bias, t.lo, t.hi, t.y + p * 16, t.ys_ob, t.sum ? t.sum + p * 16 : nullptr);
}

template <class O, int NB>
void nchwc_conv_row(const quanta::nchwc::ConvTile& t, const quanta::nchwc::RowTaps& r) {
  if (r.p == 2) {
    nchwc_conv_row_p<O, 2, NB>(t, r);
  } else {
    nchwc_conv_row_p<O, 3, NB>(t, r);
  }
}

// The taps of a tile in the generic order: per row ky, per tap kx, the P pixels.
template <class O, int P>
inline __attribute__((always_inline)) void nchwc_dw_taps(const quanta::nchwc::DwTile& t, typename O::V (&acc)[P]) {
  for (int ky = 0; ky < t.nky; ++ky) {
    const float* xr = t.x + ky * t.xs_row;
    const float* wr = t.w + ky * t.ws_row;
    for (int kx = 0; kx < t.nkx; ++kx) {
      const typename O::V wv = O::load(wr + kx * 16);
      const float* xk = xr + kx * t.xs_col;
#pragma GCC unroll 8
      for (int p = 0; p < P; ++p) acc[p] = O::fma(O::load(xk + p * t.xs_pix), wv, acc[p]);
    }
  }
}

// A row of K taps (3 or 5) at dilation 1 and pixel stride S (1 or 2) of P pixels reads
// input pixels 0 .. S·(P − 1) + K − 1 of the row: each is loaded once and serves every
// tap that reads it (S·(P − 1) + K loads a row instead of K·P). Each accumulator still
// takes its taps in increasing kx: the chains and their bytes are the generic loop's.
template <int P, int S, int K>
constexpr bool dw_row_fits() {  // inputs, weights and accumulators in 31 of the 32 zmm
  return S * (P - 1) + K + K + P <= 31;
}

template <class O, int P, int S, int K>
inline __attribute__((always_inline)) void nchwc_dw_row(const float* xr, const float* wr, typename O::V (&acc)[P]) {
  constexpr int kN = S * (P - 1) + K;
  typename O::V v[kN], w[K];
  // the empty asm keeps each loaded pixel in its register: without it GCC folds the
  // loads back into the fmas as memory operands, K loads a pixel again
#pragma GCC unroll 24
  for (int i = 0; i < kN; ++i) {
    v[i] = O::load(xr + i * 16);
    asm("" : "+v"(v[i]));
  }
#pragma GCC unroll 5
  for (int kx = 0; kx < K; ++kx) w[kx] = O::load(wr + kx * 16);
#pragma GCC unroll 5
  for (int kx = 0; kx < K; ++kx) {
#pragma GCC unroll 8
    for (int p = 0; p < P; ++p) acc[p] = O::fma(v[S * p + kx], w[kx], acc[p]);
  }
}

// The rows of a tile through nchwc_dw_row when its taps, stride and P allow; false if not.
template <class O, int P, int S, int K>
inline __attribute__((always_inline)) bool nchwc_dw_rows(const quanta::nchwc::DwTile& t, typename O::V (&acc)[P]) {
  if constexpr (O::kDwRowReuse && P > 1 && dw_row_fits<P, S, K>()) {
    if (t.nkx != K || t.xs_pix != S * 16) return false;
    for (int ky = 0; ky < t.nky; ++ky) nchwc_dw_row<O, P, S, K>(t.x + ky * t.xs_row, t.w + ky * t.ws_row, acc);
    return true;
  } else {
    return false;
  }
}

template <class O, int P>
inline __attribute__((always_inline)) void nchwc_dw_tile_one(const quanta::nchwc::DwTile& t) {
  typename O::V acc[P];
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) acc[p] = O::zero();
  const bool rows = t.xs_col == 16 && (nchwc_dw_rows<O, P, 1, 3>(t, acc) || nchwc_dw_rows<O, P, 2, 3>(t, acc) ||
                                       nchwc_dw_rows<O, P, 1, 5>(t, acc) || nchwc_dw_rows<O, P, 2, 5>(t, acc));
  if (!rows) nchwc_dw_taps<O, P>(t, acc);
#pragma GCC unroll 8
  for (int p = 0; p < P; ++p) {
    typename O::V one[1] = {acc[p]};
    nchwc_finish<O, 1>(one, t.bias, t.lo, t.hi, t.y + p * 16, 0, nullptr);
  }
}

template <class O, int P>
void nchwc_dw_tile(const quanta::nchwc::DwTile& t0, int64_t count) {
  quanta::nchwc::DwTile t = t0;
  for (int64_t i = 0; i < count; ++i) {
    nchwc_dw_tile_one<O, P>(t);
    t.x += P * t0.xs_pix;
    t.y += P * 16;
  }
}

// The maximum over a window inside the plane (no bounds tests): KH × KW taps when they
// are compile-time constants, else g.kh × g.kw. Any order gives the same result (max only
// selects; a NaN anywhere gives NaN), so the first tap starts the running maximum.
template <class O, int KH, int KW>
inline typename O::V nchwc_pool_window(const float* x0, const quanta::nchwc::PoolGeom& g) {
  const int kh = KH ? KH : static_cast<int>(g.kh), kw = KW ? KW : static_cast<int>(g.kw);
  const int64_t row = g.dh * g.w * 16, col = g.dw * 16;
  typename O::V m = O::load(x0);
#pragma GCC unroll 4
  for (int ky = 0; ky < kh; ++ky) {
#pragma GCC unroll 4
    for (int kx = ky == 0 ? 1 : 0; kx < kw; ++kx) m = O::max_nan(m, O::load(x0 + ky * row + kx * col));
  }
  return m;
}

template <class O, int KH, int KW>
void nchwc_max_pool_plane_k(const float* x, const quanta::nchwc::PoolGeom& g, float* y) {
  // outputs whose whole window lies inside the plane: [oy_lo, oy_hi) × [ox_lo, ox_hi)
  auto inside = [](int64_t pad, int64_t s, int64_t d, int64_t k, int64_t size, int64_t out, int64_t* lo, int64_t* hi) {
    // (tile.h is included inside a namespace: no <algorithm>)
    const int64_t first = (pad + s - 1) / s, last = size - 1 - (k - 1) * d + pad;
    *lo = first < out ? first : out;
    *hi = last < 0 ? 0 : (last / s + 1 < out ? last / s + 1 : out);
    if (*hi < *lo) *hi = *lo;
  };
  int64_t oy_lo, oy_hi, ox_lo, ox_hi;
  inside(g.pt, g.sh, g.dh, g.kh, g.h, g.oh, &oy_lo, &oy_hi);
  inside(g.pl, g.sw, g.dw, g.kw, g.w, g.ow, &ox_lo, &ox_hi);
  for (int64_t oy = 0; oy < g.oh; ++oy) {
    const int64_t iy0 = oy * g.sh - g.pt;
    auto border = [&](int64_t ox) {
      const int64_t ix0 = ox * g.sw - g.pl;
      typename O::V m = O::set1(-__builtin_inff());
      for (int64_t ky = 0; ky < g.kh; ++ky) {
        const int64_t iy = iy0 + ky * g.dh;
        if (iy < 0 || iy >= g.h) continue;
        const float* row = x + iy * g.w * 16;
        for (int64_t kx = 0; kx < g.kw; ++kx) {
          const int64_t ix = ix0 + kx * g.dw;
          if (ix < 0 || ix >= g.w) continue;
          m = O::max_nan(m, O::load(row + ix * 16));
        }
      }
      O::store(y + (oy * g.ow + ox) * 16, m);
    };
    if (oy < oy_lo || oy >= oy_hi) {
      for (int64_t ox = 0; ox < g.ow; ++ox) border(ox);
      continue;
    }
    for (int64_t ox = 0; ox < ox_lo; ++ox) border(ox);
    for (int64_t ox = ox_lo; ox < ox_hi; ++ox)
      O::store(y + (oy * g.ow + ox) * 16, nchwc_pool_window<O, KH, KW>(x + (iy0 * g.w + ox * g.sw - g.pl) * 16, g));
    for (int64_t ox = ox_hi; ox < g.ow; ++ox) border(ox);
  }
}

// One channel block's plane: the windows inside the plane without bounds tests (2 × 2 and
// 3 × 3 unrolled), the border ones over their taps inside.
template <class O>
void nchwc_max_pool_plane(const float* x, const quanta::nchwc::PoolGeom& g, float* y) {
  if (g.kh == 2 && g.kw == 2) {
    nchwc_max_pool_plane_k<O, 2, 2>(x, g, y);
  } else if (g.kh == 3 && g.kw == 3) {
    nchwc_max_pool_plane_k<O, 3, 3>(x, g, y);
  } else {
    nchwc_max_pool_plane_k<O, 0, 0>(x, g, y);
  }
}

template <class O>
void nchwc_gap_block(const float* x, int64_t hw, float* y) {
  typename O::V s[16];
#pragma GCC unroll 16
  for (int j = 0; j < 16; ++j) s[j] = O::zero();
  int64_t i = 0;
  for (; i + 16 <= hw; i += 16) {
#pragma GCC unroll 16
    for (int j = 0; j < 16; ++j) s[j] = O::add(s[j], O::load(x + (i + j) * 16));
  }
  for (int j = 0; i + j < hw; ++j) s[j] = O::add(s[j], O::load(x + (i + j) * 16));
  for (int h = 8; h >= 1; h /= 2)
    for (int j = 0; j < h; ++j) s[j] = O::add(s[j], s[j + h]);
  O::store(y, O::div(s[0], O::set1(static_cast<float>(hw))));
}

// The dispatch tables' entries: a tile of P pixels when P ≤ MaxP, else null (never
// instantiated).
template <class O, int P, int NB, int MaxP>
constexpr quanta::nchwc::ConvTileFn nchwc_tile_fn() {
  if constexpr (P <= MaxP) {
    return nchwc_conv_tile<O, P, NB>;
  } else {
    return nullptr;
  }
}
template <class O, int P, int MaxP>
constexpr quanta::nchwc::DwTileFn nchwc_dw_fn() {
  if constexpr (P <= MaxP) {
    return nchwc_dw_tile<O, P>;
  } else {
    return nullptr;
  }
}
#define QUANTA_NCHWC_ROW(O, NB, MaxP)                                                                 \
  {nchwc_tile_fn<O, 1, NB, MaxP>(), nchwc_tile_fn<O, 2, NB, MaxP>(), nchwc_tile_fn<O, 3, NB, MaxP>(), \
   nchwc_tile_fn<O, 4, NB, MaxP>(), nchwc_tile_fn<O, 5, NB, MaxP>(), nchwc_tile_fn<O, 6, NB, MaxP>(), \
   nchwc_tile_fn<O, 7, NB, MaxP>(), nchwc_tile_fn<O, 8, NB, MaxP>()}
#define QUANTA_NCHWC_PAIRS(O) \
  {nchwc_conv_pair<O, 1>, nchwc_conv_pair<O, 2>, nchwc_conv_pair<O, 3>, nchwc_conv_pair<O, 4>}
#define QUANTA_NCHWC_ROWS(O) {nchwc_conv_row<O, 1>, nchwc_conv_row<O, 2>, nchwc_conv_row<O, 3>, nchwc_conv_row<O, 4>}
#define QUANTA_NCHWC_DW_ROW(O, MaxP)                                                                           \
  {nchwc_dw_fn<O, 1, MaxP>(), nchwc_dw_fn<O, 2, MaxP>(), nchwc_dw_fn<O, 3, MaxP>(), nchwc_dw_fn<O, 4, MaxP>(), \
   nchwc_dw_fn<O, 5, MaxP>(), nchwc_dw_fn<O, 6, MaxP>(), nchwc_dw_fn<O, 7, MaxP>(), nchwc_dw_fn<O, 8, MaxP>()}
