// seq_gemm (float_rnn.h (RNN1)) over the vector traits of simd.h, shared by
// seq_gemm_avx2.cc and seq_gemm_avx512vnni.cc: AVX-512 in row blocks × NV vectors per
// block (NV·kLanes columns), masked column tails; AVX2 in tiles (seq_gemm_tiled). Each
// accumulator lane adds its products in increasing k, as the twin: separate multiply and
// add (no FMA).
#pragma once

#include <immintrin.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#include "recurrent/float_rnn.h"
#include "simd.h"

namespace quanta {
namespace recurrent {
namespace {

template <class T, int RB, int NV>
void seq_block(const float* a, int64_t lda, const float* w, int64_t ldw, float* y, int64_t ldy, int64_t K, int64_t N,
               int64_t n0) {
  constexpr int L = T::kLanes;
  typename T::M m[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) m[v] = T::tail(N - n0 - L * v);
  typename T::V acc[RB][NV];
#pragma GCC unroll 8
  for (int r = 0; r < RB; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[r][v] = T::zero();
  for (int64_t k = 0; k < K; ++k) {
    typename T::V wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) wv[v] = T::load(m[v], w + k * ldw + n0 + L * v);
#pragma GCC unroll 8
    for (int r = 0; r < RB; ++r) {
      const typename T::V av = T::set1(a[r * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[r][v] = T::add(acc[r][v], T::mul(av, wv[v]));
    }
  }
  for (int r = 0; r < RB; ++r)
    for (int v = 0; v < NV; ++v) T::store(y + r * ldy + n0 + L * v, m[v], acc[r][v]);
}

// One row over NV <= kRowPanelsMaxV vectors of columns that start a panel (float_rnn.h
// kSeqPanel; vector v at panel v / 8, lanes 16·(v % 8) of its k-th row), all NV chains in
// one k loop, each lane's chain as seq_block's (kFma false: (RNN1)) or seq_block_mlas's
// (kFma: per block of kMlasStrideK k an FMA chain from +0, added to y with one addition
// when accumulate or from the second block on, else stored). Only the columns below ncols
// are written; the vectors are loaded whole (the panels are zero-padded to kSeqPanel
// columns). The vector count is a template parameter, so the loop is NV loads and NV
// multiply-adds with every accumulator in a register: the runtime vector counts of the
// pair-of-panels loop this replaces compiled to a compare and a branch per vector and the
// k counter and masks kept on the stack (a T = 10, H = 160 bidirectional OrtGRU node: 1.22
// -> 0.86 of ONNX Runtime's time, benchmarks/results/2026-12-07h-rnn9.md). Up to 24 chains in flight
// hide the multiply-add latency (4 cycles, 2 a cycle: 8 chains fill the ports) that a
// step's 160-long chains would otherwise expose. Each panel is one contiguous stream (K
// rows of 512 bytes) that the hardware prefetchers follow on their own: a software
// prefetch of every line costs a load slot, and the loads bound this loop (nsnet2's H =
// 400 GRU step, 1.9 MB of R: 27.6 us with them, 22.2 without).
constexpr int kRowPanelsMaxV = 24;

template <class T, int NV, bool kFma>
__attribute__((noinline)) void row_panels(const float* a, const float* w, int64_t K, int64_t ncols, float* y,
                                          bool accumulate) {
  constexpr int L = T::kLanes;
  constexpr int PV = static_cast<int>(kSeqPanel / L);
  static_assert(NV >= 1 && NV <= kRowPanelsMaxV && NV <= 3 * PV, "row_panels: three panels at most");
  using V = typename T::V;
  const typename T::M last = T::tail(ncols - L * (NV - 1));
  const int64_t block = kFma ? kMlasStrideK : K;
  for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += block) {
    const int64_t k1 = K < k0 + block ? K : k0 + block;
    V acc[NV];
#pragma GCC unroll 24
    for (int v = 0; v < NV; ++v) acc[v] = T::zero();
    const float* w0 = w + k0 * kSeqPanel;
    const float* w1 = w0 + kSeqPanel * K;
    const float* w2 = w1 + kSeqPanel * K;
    for (int64_t k = k0; k < k1; ++k, w0 += kSeqPanel, w1 += kSeqPanel, w2 += kSeqPanel) {
      const V av = T::set1(a[k]);
#pragma GCC unroll 24
      for (int v = 0; v < NV; ++v) {
        const float* wv = (v < PV ? w0 : v < 2 * PV ? w1 : w2) + L * (v % PV);
        acc[v] = kFma ? T::fmadd(av, T::loadu(wv), acc[v]) : T::add(acc[v], T::mul(av, T::loadu(wv)));
      }
    }
    const bool add = kFma && (accumulate || k0 > 0);
#pragma GCC unroll 24
    for (int v = 0; v < NV; ++v) {
      float* yv = y + L * v;
      if (v + 1 < NV) {
        T::storeu(yv, add ? T::add(acc[v], T::loadu(yv)) : acc[v]);
      } else {
        T::store(yv, last, add ? T::add(acc[v], T::load(last, yv)) : acc[v]);
      }
    }
    if (block == 0) break;
  }
}

template <class T, bool kFma, int... I>
constexpr auto row_panels_table(std::integer_sequence<int, I...>) {
  using Fn = void (*)(const float*, const float*, int64_t, int64_t, float*, bool);
  return std::array<Fn, sizeof...(I)>{&row_panels<T, I + 1, kFma>...};
}

// y [N] = a [K] · w (panels), a batch-1 product: row_panels over chunks of whole panels
// (24 vectors, or 16 where 24 would leave fewer than 8 for the last chunk), the last chunk
// the vectors left.
template <class T, bool kFma>
void seq_row_panels(const float* a, const float* w, int64_t K, int64_t N, float* y, bool accumulate) {
  constexpr int L = T::kLanes;
  static constexpr auto kFns = row_panels_table<T, kFma>(std::make_integer_sequence<int, kRowPanelsMaxV>());
  const int64_t nvec = (N + L - 1) / L;
  for (int64_t v0 = 0; v0 < nvec;) {
    const int64_t left = nvec - v0;
    const int64_t take = left <= kRowPanelsMaxV ? left : left >= kRowPanelsMaxV + 8 ? kRowPanelsMaxV : 16;
    const int64_t c0 = v0 * L;
    kFns[static_cast<size_t>(take - 1)](a, w + c0 * K, K, std::min(N - c0, take * L), y + c0, accumulate);
    v0 += take;
  }
}

// Two or three rows over one panel's columns (up to NV vectors: a whole panel at
// NV·kLanes = kSeqPanel; the vectors past ncols skipped, not loaded), each lane's chain as
// seq_block's: one contiguous pass over the panel, each weight vector loaded once for all
// the rows. The loads bound a small-batch recurrence (an H = 256 LSTM step at batch 2:
// 20.5 us with the weight loads folded into each row's vmulps, 16.5 with one load a
// vector, ONNX Runtime 15.1; at batch 3, a pair and a single row read R twice: 27.7 us,
// three rows in one pass 23.4, ONNX Runtime 20.6). R·NV accumulators and a weight vector:
// AVX-512's 32 registers hold NV = 8.
template <class T, int NV, int R = 2>
void seq_rows2_panel(const float* a, int64_t lda, const float* w, int64_t K, float* y, int64_t ldy, int64_t ncols) {
  static_assert(R == 2 || R == 3, "seq_rows2_panel: two or three rows");
  constexpr int L = T::kLanes;
  using V = typename T::V;
  const int nv = static_cast<int>((ncols + L - 1) / L);
  V acc0[NV], acc1[NV], acc2[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc0[v] = acc1[v] = acc2[v] = T::zero();
  for (int64_t k = 0; k < K; ++k) {
    const V av0 = T::set1(a[k]), av1 = T::set1(a[lda + k]), av2 = T::set1(a[(R - 1) * lda + k]);
    const float* wk = w + k * kSeqPanel;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      if (v < nv) {
        V wv = T::loadu(wk + L * v);  // inside the zero-padded panel
        // in a register: without the barrier GCC folds the load into each row's vmulps
        __asm__("" : "+v"(wv));
        acc0[v] = T::add(acc0[v], T::mul(av0, wv));
        acc1[v] = T::add(acc1[v], T::mul(av1, wv));
        if (R > 2) acc2[v] = T::add(acc2[v], T::mul(av2, wv));
      }
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    if (v < nv) {
      const typename T::M m = T::tail(ncols - L * v);
      T::store(y + L * v, m, acc0[v]);
      T::store(y + ldy + L * v, m, acc1[v]);
      if (R > 2) T::store(y + 2 * ldy + L * v, m, acc2[v]);
    }
  }
}

// How many k steps ahead seq_rows' six-row block prefetches its weight lines: 4 of every
// 512-byte panel row, a strided stream. A batch-6 recurrence step (H = 256: R is 1 MB in 8
// panels, read from L2 / L3 at every step) took 16-17 us without it, 13.2-13.7 with it 4
// steps ahead (12.5-14 at 8 and 16; the same product on 64-column contiguous strips:
// 13.5 without, 12.2 with); the 960-row input projection of the same weights is unchanged
// (2.2-2.3 ms). Six rows are 24 multiplies and 24 adds a k step, so four prefetches there
// take no load slot the loop needs; the blocks of fewer rows do not prefetch.
constexpr int64_t kRowsPrefetch = 4;

// Four rows × NV <= 4 vectors of one panel (4·kLanes columns at w, kSeqPanel floats a k
// step; masked past ncols), each lane's chain as seq_block's. A row at a time reads the
// whole panel (128 KB at K = 256, 256 KB at K = 512: L2, not L1) once per row; four rows
// share each weight vector, a quarter of those reads. The accumulators are named
// variables, not an array: GCC keeps a 1 KB array of vectors in registers but also stores
// it to the stack on every k step (the 4-row array block this replaces ran 5-10x slower;
// sgemm's tiles had the same problem).
//
// Six rows (R = 6: 24 accumulators, 4 weight vectors: AVX-512's 32 registers) read each
// weight vector once for six rows: a batch-6 recurrence (Resemblyzer's LSTMs, H = 256)
// ran four rows here and two over the whole panel (seq_rows2_panel), three passes over
// each 128 KB panel a step, out of L1.
//
// LD: the floats from one k step's weights to the next (kSeqPanel in the panels;
// kSeqStrip in seq_gemm_strips_simd's strips, where the block's lines are contiguous).
template <class T, int NV, int R, int64_t LD = kSeqPanel>
void seq_rows(const float* a, int64_t lda, const float* w, int64_t K, float* y, int64_t ldy, int64_t ncols) {
  static_assert(R == 2 || R == 4 || R == 6, "seq_rows: two, four or six rows");
  constexpr int L = T::kLanes;
  using V = typename T::V;
  const typename T::M m0 = T::tail(ncols), m1 = T::tail(ncols - L), m2 = T::tail(ncols - 2 * L),
                      m3 = T::tail(ncols - 3 * L);
#define QUANTA_SEQ_ROWS(X) X(0) X(1) X(2) X(3) X(4) X(5)
#define DECL(r) V c##r##0 = T::zero(), c##r##1 = T::zero(), c##r##2 = T::zero(), c##r##3 = T::zero();
  QUANTA_SEQ_ROWS(DECL)
#undef DECL
  for (int64_t k = 0; k < K; ++k) {
    const float* wk = w + k * LD;
    if (R == 6 && k + kRowsPrefetch < K) {
      // the lines of this block's vectors kRowsPrefetch k steps ahead (16 floats a line)
      const float* ahead = wk + kRowsPrefetch * LD;
#pragma GCC unroll 4
      for (int v = 0; v < (NV * L * 4 + 63) / 64; ++v)
        _mm_prefetch(reinterpret_cast<const char*>(ahead + 16 * v), _MM_HINT_T0);
    }
    V w0 = T::load(m0, wk), w1 = T::load(m1, wk + L), w2 = T::load(m2, wk + 2 * L), w3 = T::load(m3, wk + 3 * L);
    // one load per weight vector for all the rows (seq_rows2_panel's reason)
    __asm__("" : "+v"(w0), "+v"(w1), "+v"(w2), "+v"(w3));
#define STEP(r)                                            \
  if (r < R) {                                             \
    const V av = T::set1(a[r * lda + k]);                  \
    c##r##0 = T::add(c##r##0, T::mul(av, w0));             \
    if (NV > 1) c##r##1 = T::add(c##r##1, T::mul(av, w1)); \
    if (NV > 2) c##r##2 = T::add(c##r##2, T::mul(av, w2)); \
    if (NV > 3) c##r##3 = T::add(c##r##3, T::mul(av, w3)); \
  }
    QUANTA_SEQ_ROWS(STEP)
#undef STEP
  }
#define STORE1(r, v, m) \
  if (NV > v) T::store(y + r * ldy + v * L, m, c##r##v);
#define STORE(r)                                                        \
  if (r < R) {                                                          \
    STORE1(r, 0, m0) STORE1(r, 1, m1) STORE1(r, 2, m2) STORE1(r, 3, m3) \
  }
  QUANTA_SEQ_ROWS(STORE)
#undef STORE
#undef STORE1
#undef QUANTA_SEQ_ROWS
}

// The column block [n0, n0 + 4·kLanes) of four rows, with the vectors the columns left
// need (N = 100 is 64 + 36 columns: 4 + 3 vectors). Block(nv) calls the NV = nv kernel.
template <class Block>
inline void by_vectors(int64_t left, int lanes, Block block) {
  const int64_t nv = (left + lanes - 1) / lanes;
  if (nv >= 4) {
    block(std::integral_constant<int, 4>());
  } else if (nv == 3) {
    block(std::integral_constant<int, 3>());
  } else if (nv == 2) {
    block(std::integral_constant<int, 2>());
  } else {
    block(std::integral_constant<int, 1>());
  }
}

// The tiled products of a core with 16 vector registers (AVX2), for seq_gemm and
// seq_gemm_mlas: a panel's 16 vectors of columns do not fit as one row's accumulators, and
// seq_block's one row × 4 vectors walked each panel four times per row, two of every
// eight lines 512 bytes apart (the prefetchers follow that poorly: ddddocr's H = 512
// batch-1 step, 4 MB of R, took ~130 us; its 21-row input projection ran at ~6 MAC a
// cycle). Here a panel passes in chunks of kTileK k steps (16 KB, contiguous, in L1 while
// every row block of the tile computes on it), for up to kTileRows rows at a time whose
// accumulators wait in a tile buffer between chunks: a float stored and reloaded is the
// same float, so every lane keeps its chain, (RNN1)'s or (RNN-ORT1)'s.
constexpr int64_t kTileK = 32;
constexpr int64_t kTileRows = 24;

// R rows × NV vectors (R·NV <= 12 accumulators, NV weight vectors, the broadcast and a
// product: 16 registers) over k steps [k0, k1) of the panel columns at w; acc [R][kSeqPanel]
// holds the chains (from +0 when zero). The weight vectors are inside the zero-padded
// panel, so loaded whole.
// Not inlined: inside the LTO build's larger function GCC hoisted the eight weight loads of
// the one-row block and spilled an accumulator to the stack (a store-to-load chain a k
// step); on its own it keeps every accumulator in a register.
template <class T, int R, int NV, bool kFma>
__attribute__((noinline)) void tile_rows(const float* a, int64_t lda, const float* w, int64_t k0, int64_t k1,
                                         float* acc, bool zero) {
  constexpr int L = T::kLanes;
  using V = typename T::V;
  V c[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) c[r][v] = zero ? T::zero() : T::loadu(acc + r * kSeqPanel + L * v);
  for (int64_t k = k0; k < k1; ++k) {
    const float* wk = w + k * kSeqPanel;
    V wv[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      wv[v] = T::loadu(wk + L * v);
      __asm__("" : "+v"(wv[v]));  // one load per weight vector (seq_rows2_panel's reason)
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const V av = T::set1(a[r * lda + k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) c[r][v] = kFma ? T::fmadd(av, wv[v], c[r][v]) : T::add(c[r][v], T::mul(av, wv[v]));
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) T::storeu(acc + r * kSeqPanel + L * v, c[r][v]);
}

// tile_rows with nv <= NV vectors (the columns a partial panel's last block holds: the
// vectors past them are not read, a batch-1 step streams only R's columns).
template <class T, int R, int NV, bool kFma>
inline void tile_rows_n(int nv, const float* a, int64_t lda, const float* w, int64_t k0, int64_t k1, float* acc,
                        bool zero) {
  if constexpr (NV >= 1) {
    if (nv >= NV) {
      tile_rows<T, R, NV, kFma>(a, lda, w, k0, k1, acc, zero);
    } else {
      tile_rows_n<T, R, NV - 1, kFma>(nv, a, lda, w, k0, k1, acc, zero);
    }
  }
}

// tile_rows over the np columns of a panel for R rows: 2, 4 or 8 vectors a block by R.
template <class T, int R, bool kFma>
inline void tile_block(const float* a, int64_t lda, const float* wp, int64_t np, int64_t k0, int64_t k1, float* acc,
                       bool zero) {
  constexpr int L = T::kLanes;
  constexpr int NV = R >= 4 ? 2 : R >= 2 ? 4 : 8;
  int64_t n0 = 0;
  for (; n0 + NV * L <= np; n0 += NV * L) tile_rows<T, R, NV, kFma>(a, lda, wp + n0, k0, k1, acc + n0, zero);
  if (n0 < np) {
    const int nv = static_cast<int>((np - n0 + L - 1) / L);
    tile_rows_n<T, R, NV, kFma>(nv, a, lda, wp + n0, k0, k1, acc + n0, zero);
  }
}

// y [M, N] = a [M, K] · w (panels) by (RNN1), or with kFma by (RNN-ORT1) (seq_gemm_mlas:
// per block of kMlasStrideK k an FMA chain from +0, added to y when accumulate or from
// the second block on, else stored).
template <class T, bool kFma>
void seq_gemm_tiled(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy, int64_t M,
                    bool accumulate) {
  static_assert(kSeqPanel % (8 * T::kLanes) == 0 && kMlasStrideK % kTileK == 0, "seq_gemm_tiled: blocks");
  alignas(64) float acc[kTileRows * kSeqPanel];
  const int64_t block = kFma ? kMlasStrideK : K;
  for (int64_t p0 = 0; p0 < N; p0 += kSeqPanel) {
    const float* wp = w + p0 * K;
    const int64_t np = N - p0 < kSeqPanel ? N - p0 : kSeqPanel;
    for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
      const int64_t mr = M - m0 < kTileRows ? M - m0 : kTileRows;
      const float* am = a + m0 * lda;
      for (int64_t b0 = 0; b0 < K || b0 == 0; b0 += block) {
        const int64_t b1 = K < b0 + block ? K : b0 + block;
        if (b1 == b0) std::fill(acc, acc + mr * kSeqPanel, 0.0f);  // K = 0
        for (int64_t k0 = b0; k0 < b1; k0 += kTileK) {
          const int64_t k1 = b1 < k0 + kTileK ? b1 : k0 + kTileK;
          const bool zero = k0 == b0;
          if (mr > 1) {
            // the next chunk's lines: its first column block would otherwise take the misses
            // of a 512-byte stride, one line a k step (a batch-1 step's chunk is too short
            // to hide them and streams at the L3's rate without)
            const int64_t k2 = K < k1 + kTileK ? K : k1 + kTileK;
            for (const float* q = wp + k1 * kSeqPanel; q < wp + k2 * kSeqPanel; q += 16)
              _mm_prefetch(reinterpret_cast<const char*>(q), _MM_HINT_T0);
          }
          int64_t r = 0;
          for (; r + 6 <= mr; r += 6)
            tile_block<T, 6, kFma>(am + r * lda, lda, wp, np, k0, k1, acc + r * kSeqPanel, zero);
          const float* ar = am + r * lda;
          float* accr = acc + r * kSeqPanel;
          switch (mr - r) {
            case 5: tile_block<T, 5, kFma>(ar, lda, wp, np, k0, k1, accr, zero); break;
            case 4: tile_block<T, 4, kFma>(ar, lda, wp, np, k0, k1, accr, zero); break;
            case 3: tile_block<T, 3, kFma>(ar, lda, wp, np, k0, k1, accr, zero); break;
            case 2: tile_block<T, 2, kFma>(ar, lda, wp, np, k0, k1, accr, zero); break;
            case 1: tile_block<T, 1, kFma>(ar, lda, wp, np, k0, k1, accr, zero); break;
            default: break;
          }
        }
        const bool add = kFma && (accumulate || b0 > 0);
        for (int64_t i = 0; i < mr; ++i) {
          float* yr = y + (m0 + i) * ldy + p0;
          const float* ar = acc + i * kSeqPanel;
          if (add) {
            for (int64_t n = 0; n < np; ++n) yr[n] = ar[n] + yr[n];
          } else {
            std::memcpy(yr, ar, sizeof(float) * np);
          }
        }
        if (block == 0) break;
      }
    }
  }
}

// One row over NS (1 or 2) strips of kSeqRowStrip columns (float_rnn.h; 4 vectors a strip
// on AVX2) at w and w + kSeqRowStrip·K, k steps [k0, k1): out [NS·kSeqRowStrip] = the
// chains from +0, (RNN1)'s (separate multiply and add) or with kFma (RNN-ORT1)'s. Each
// strip is one contiguous stream (128 bytes a k step), so a batch-1 step reads R
// front to back in two streams, the pattern the hardware prefetchers follow best.
template <class T, int NS, bool kFma>
__attribute__((noinline)) void row_strips(const float* a, const float* w, int64_t K, int64_t k0, int64_t k1,
                                          float* out) {
  constexpr int L = T::kLanes;
  static_assert(4 * L == kSeqRowStrip && (NS == 1 || NS == 2), "row_strips: four vectors a strip");
  using V = typename T::V;
  V c[NS][4];
#pragma GCC unroll 8
  for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) c[s][v] = T::zero();
  const float* w0 = w + k0 * kSeqRowStrip;
  const float* w1 = w0 + kSeqRowStrip * K;
  for (int64_t k = k0; k < k1; ++k, w0 += kSeqRowStrip, w1 += kSeqRowStrip) {
    const V av = T::set1(a[k]);
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) {
      c[0][v] = kFma ? T::fmadd(av, T::loadu(w0 + L * v), c[0][v]) : T::add(c[0][v], T::mul(av, T::loadu(w0 + L * v)));
      if (NS > 1)
        c[NS - 1][v] = kFma ? T::fmadd(av, T::loadu(w1 + L * v), c[NS - 1][v])
                            : T::add(c[NS - 1][v], T::mul(av, T::loadu(w1 + L * v)));
    }
  }
#pragma GCC unroll 8
  for (int s = 0; s < NS; ++s)
#pragma GCC unroll 4
    for (int v = 0; v < 4; ++v) T::storeu(out + s * kSeqRowStrip + L * v, c[s][v]);
}

// y [M, N] = a [M, K] · w on row strips (float_rnn.h seq_row_strips_for), a row at a time,
// a pair of strips at a time (the last strip alone when their count is odd): by (RNN1), or
// with kFma by (RNN-ORT1) (per block of kMlasStrideK k a chain from +0, added to y when
// accumulate or from the second block on, else stored). The strips are zero-padded past
// N; only the columns below N are written.
template <class T, bool kFma>
void seq_row_strips(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy, int64_t M,
                    bool accumulate) {
  alignas(64) float buf[2 * kSeqRowStrip];
  const int64_t block = kFma ? kMlasStrideK : K;
  for (int64_t m = 0; m < M; ++m) {
    const float* am = a + m * lda;
    for (int64_t n0 = 0; n0 < N; n0 += 2 * kSeqRowStrip) {
      const int64_t nc = N - n0 < 2 * kSeqRowStrip ? N - n0 : 2 * kSeqRowStrip;
      float* yr = y + m * ldy + n0;
      for (int64_t b0 = 0; b0 < K || b0 == 0; b0 += block) {
        const int64_t b1 = K < b0 + block ? K : b0 + block;
        const bool add = kFma && (accumulate || b0 > 0);
        float* out = !add && nc == 2 * kSeqRowStrip ? yr : buf;
        if (nc > kSeqRowStrip) {
          row_strips<T, 2, kFma>(am, w + n0 * K, K, b0, b1, out);
        } else {
          row_strips<T, 1, kFma>(am, w + n0 * K, K, b0, b1, out);
        }
        if (add) {
          for (int64_t n = 0; n < nc; ++n) yr[n] = buf[n] + yr[n];
        } else if (out == buf) {
          std::memcpy(yr, buf, sizeof(float) * nc);
        }
        if (block == 0) break;
      }
    }
  }
}

// R rows × S strips of kSeqWStrip columns (float_rnn.h; NV <= 2 vectors a strip, 1 for a
// strip of 8 columns or fewer: R·S·NV <= 12 accumulators on AVX2's 16 registers) over k
// steps [k0, k1) of the strips at w, w + kSeqWStrip·K: out [r·ldo + s·kSeqWStrip] = the
// chains from +0, (RNN1)'s (separate multiply and add) or with kFma (RNN-ORT1)'s. Each
// strip is one contiguous stream (64 bytes a k step) that stays in L1 while the row
// blocks of a tile pass over it: the panels' 64 of every 512 bytes a k step map to an
// eighth of L1's sets, so a block's K lines did not stay there between row blocks (600 ×
// 266 × 100 ran at ~30 GMAC/s on the panels, ~40 on strips).
template <class T, int R, int S, int NV, bool kFma>
__attribute__((noinline)) void wstrip_block(const float* a, int64_t lda, const float* w, int64_t K, int64_t k0,
                                            int64_t k1, float* out, int64_t ldo) {
  constexpr int L = T::kLanes;
  static_assert(2 * L == kSeqWStrip && R * S * NV <= 12 && NV <= 2, "wstrip_block: blocks");
  using V = typename T::V;
  V c[R][S][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) c[r][s][v] = T::zero();
  const float* wk = w + k0 * kSeqWStrip;
  for (int64_t k = k0; k < k1; ++k, wk += kSeqWStrip) {
    V wv[S][NV];
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) {
        wv[s][v] = T::loadu(wk + s * kSeqWStrip * K + L * v);
        __asm__("" : "+v"(wv[s][v]));  // one load per weight vector (seq_rows2_panel's reason)
      }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const V av = T::set1(a[r * lda + k]);
#pragma GCC unroll 4
      for (int s = 0; s < S; ++s)
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v)
          c[r][s][v] = kFma ? T::fmadd(av, wv[s][v], c[r][s][v]) : T::add(c[r][s][v], T::mul(av, wv[s][v]));
    }
  }
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int s = 0; s < S; ++s)
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) T::storeu(out + r * ldo + s * kSeqWStrip + L * v, c[r][s][v]);
}

// y [M, N] = a [M, K] · w on strips of kSeqWStrip columns (float_rnn.h seq_gemm_wstrips_for)
// by (RNN1), or with kFma by (RNN-ORT1) (per block of kMlasStrideK k a chain from +0, added
// to y when accumulate or from the second block on, else stored). Rows in tiles of about
// 128 KB of a (in L2), each strip passing once per tile (K·64 bytes: in L1 while the tile's
// row blocks use it): six rows × one strip (12 accumulators), the rows a tile leaves over
// (three or fewer) × two strips; a strip of 8 columns or fewer with one vector. The strips
// are zero-padded past N; only the columns below N are written.
template <class T, bool kFma>
void seq_gemm_wstrips(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy,
                      int64_t M, bool accumulate) {
  constexpr int64_t W = kSeqWStrip;
  alignas(64) float buf[6 * 2 * W];
  const int64_t block = kFma ? kMlasStrideK : K;
  const int64_t ns = (N + W - 1) / W;
  const int64_t tile = std::max<int64_t>(6, (int64_t{32} * 1024 / std::max<int64_t>(K, 1)) / 6 * 6);
  // rows [m, m + R) × strips [s, s + S) (S·W columns at most; nc of them below N)
  auto run = [&](int64_t m, int R, int64_t s, int S) {
    const int64_t n0 = s * W, nc = std::min(N - n0, S * W);
    const bool narrow = S == 1 && nc <= W / 2;
    const float* as = a + m * lda;
    const float* ws = w + n0 * K;
    for (int64_t b0 = 0; b0 < K || b0 == 0; b0 += block) {
      const int64_t b1 = K < b0 + block ? K : b0 + block;
      const bool add = kFma && (accumulate || b0 > 0);
      const bool direct = !add && nc == S * W;
      float* out = direct ? y + m * ldy + n0 : buf;
      const int64_t ldo = direct ? ldy : S * W;
#define QUANTA_WSTRIP(RR, SS, NVV) wstrip_block<T, RR, SS, NVV, kFma>(as, lda, ws, K, b0, b1, out, ldo)
      if (S == 2) {
        switch (R) {
          case 3: QUANTA_WSTRIP(3, 2, 2); break;
          case 2: QUANTA_WSTRIP(2, 2, 2); break;
          default: QUANTA_WSTRIP(1, 2, 2); break;
        }
      } else if (narrow) {
        switch (R) {
          case 6: QUANTA_WSTRIP(6, 1, 1); break;
          case 5: QUANTA_WSTRIP(5, 1, 1); break;
          case 4: QUANTA_WSTRIP(4, 1, 1); break;
          case 3: QUANTA_WSTRIP(3, 1, 1); break;
          case 2: QUANTA_WSTRIP(2, 1, 1); break;
          default: QUANTA_WSTRIP(1, 1, 1); break;
        }
      } else {
        switch (R) {
          case 6: QUANTA_WSTRIP(6, 1, 2); break;
          case 5: QUANTA_WSTRIP(5, 1, 2); break;
          case 4: QUANTA_WSTRIP(4, 1, 2); break;
          case 3: QUANTA_WSTRIP(3, 1, 2); break;
          case 2: QUANTA_WSTRIP(2, 1, 2); break;
          default: QUANTA_WSTRIP(1, 1, 2); break;
        }
      }
#undef QUANTA_WSTRIP
      if (!direct) {
        for (int r = 0; r < R; ++r) {
          float* yr = y + (m + r) * ldy + n0;
          const float* br = buf + r * ldo;
          if (add) {
            for (int64_t n = 0; n < nc; ++n) yr[n] = br[n] + yr[n];
          } else {
            std::memcpy(yr, br, sizeof(float) * nc);
          }
        }
      }
      if (block == 0) break;
    }
  };
  for (int64_t t0 = 0; t0 < M; t0 += tile) {
    const int64_t t1 = std::min(M, t0 + tile);
    const int64_t full = t0 + (t1 - t0) / 6 * 6;  // six-row blocks end here
    for (int64_t s = 0; s < ns; ++s)
      for (int64_t m = t0; m < full; m += 6) run(m, 6, s, 1);
    const int rest = static_cast<int>(t1 - full);
    if (rest == 0) continue;
    if (rest > 3) {
      for (int64_t s = 0; s < ns; ++s) run(full, rest, s, 1);
      continue;
    }
    int64_t s = 0;
    for (; s + 2 <= ns; s += 2) run(full, rest, s, 2);
    if (s < ns) run(full, rest, s, 1);
  }
}

// kRows4: blocks of four rows by seq_rows (an ISA with registers for its 16
// accumulators: AVX-512's 32); then pairs of rows on every ISA.
template <class T, int NV, bool kRows4 = false>
void seq_gemm_simd(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy,
                   int64_t M) {
  constexpr int64_t kCols = NV * T::kLanes;
  if constexpr (kCols < kSeqPanel) {  // AVX2
    seq_gemm_tiled<T, false>(a, lda, w, K, N, y, ldy, M, false);
    return;
  }
  // Panel by panel (kSeqPanel columns, [K][kSeqPanel] contiguous): a panel stays in the
  // cache while every row block passes over it, and each k step reads contiguous bytes.
  if (M == 1 && NV * T::kLanes == kSeqPanel) {
    seq_row_panels<T, false>(a, w, K, N, y, false);
    return;
  }
  for (int64_t p0 = 0; p0 < N; p0 += kSeqPanel) {
    const float* wp = w + p0 * K;
    const int64_t np = N - p0 < kSeqPanel ? N - p0 : kSeqPanel;
    // One row at a time over the panel (in L2 after the first row): a 4-row register
    // block ran 5-10x slower inside the module build (measured, H = 512), one row at a
    // time streams at the cache's speed.
    int64_t m0 = 0;
    if (kRows4) {
      for (; m0 + 6 <= M; m0 += 6)
        for (int64_t n0 = 0; n0 < np; n0 += 4 * T::kLanes)
          by_vectors(np - n0, T::kLanes, [&](auto nv) {
            seq_rows<T, decltype(nv)::value, 6>(a + m0 * lda, lda, wp + n0, K, y + m0 * ldy + p0 + n0, ldy, np - n0);
          });
      for (; m0 + 4 <= M; m0 += 4)
        for (int64_t n0 = 0; n0 < np; n0 += 4 * T::kLanes)
          by_vectors(np - n0, T::kLanes, [&](auto nv) {
            seq_rows<T, decltype(nv)::value, 4>(a + m0 * lda, lda, wp + n0, K, y + m0 * ldy + p0 + n0, ldy, np - n0);
          });
    }
    // pairs of rows share each weight vector too (three rows left: one block): over the
    // whole panel in one pass where the registers hold the accumulators of a panel
    // (kRows4: AVX-512), else in 4-vector blocks (8 accumulators: AVX2's 16 registers)
    if (kRows4 && kCols == kSeqPanel) {
      if (M - m0 == 3) {
        seq_rows2_panel<T, NV, 3>(a + m0 * lda, lda, wp, K, y + m0 * ldy + p0, ldy, np);
        m0 = M;
      }
      for (; m0 + 2 <= M; m0 += 2) seq_rows2_panel<T, NV>(a + m0 * lda, lda, wp, K, y + m0 * ldy + p0, ldy, np);
    }
    for (; m0 + 2 <= M; m0 += 2)
      for (int64_t n0 = 0; n0 < np; n0 += 4 * T::kLanes)
        by_vectors(np - n0, T::kLanes, [&](auto nv) {
          seq_rows<T, decltype(nv)::value, 2>(a + m0 * lda, lda, wp + n0, K, y + m0 * ldy + p0 + n0, ldy, np - n0);
        });
    for (; m0 < M; ++m0)
      for (int64_t n0 = 0; n0 < np; n0 += kCols)
        seq_block<T, 1, NV>(a + m0 * lda, lda, wp, kSeqPanel, y + m0 * ldy + p0, ldy, K, np, n0);
  }
}

// seq_gemm on weights in strips (float_rnn.h kSeqStrip; AVX-512): per strip, blocks of
// six rows (seq_rows, each k step's 64 columns one contiguous 256-byte run), then four,
// two, one; each lane's chain as seq_block's.
template <class T>
void seq_gemm_strips_simd(const float* a, int64_t lda, const float* ws, int64_t K, int64_t N, float* y, int64_t ldy,
                          int64_t M) {
  static_assert(4 * T::kLanes == kSeqStrip, "seq_gemm_strips_simd: a strip is four vectors");
  for (int64_t n0 = 0; n0 < N; n0 += kSeqStrip) {
    const float* w = ws + n0 * K;
    const int64_t nc = N - n0 < kSeqStrip ? N - n0 : kSeqStrip;
    float* yc = y + n0;
    by_vectors(nc, T::kLanes, [&](auto nv) {
      constexpr int kNv = decltype(nv)::value;
      int64_t m0 = 0;
      for (; m0 + 6 <= M; m0 += 6) seq_rows<T, kNv, 6, kSeqStrip>(a + m0 * lda, lda, w, K, yc + m0 * ldy, ldy, nc);
      for (; m0 + 4 <= M; m0 += 4) seq_rows<T, kNv, 4, kSeqStrip>(a + m0 * lda, lda, w, K, yc + m0 * ldy, ldy, nc);
      for (; m0 + 2 <= M; m0 += 2) seq_rows<T, kNv, 2, kSeqStrip>(a + m0 * lda, lda, w, K, yc + m0 * ldy, ldy, nc);
      for (; m0 < M; ++m0) seq_block<T, 1, kNv>(a + m0 * lda, lda, w, kSeqStrip, yc + m0 * ldy, ldy, K, nc, 0);
    });
  }
}

// seq_gemm_mlas (float_rnn.h): the same blocking over n; over k, FMA chains of
// kMlasStrideK steps from zero, each added to y with one addition (or stored: the first
// block without accumulate).
template <class T, int NV>
void seq_block_mlas(const float* a, const float* w, int64_t ldw, float* y, int64_t K, int64_t N, int64_t n0,
                    bool accumulate) {
  constexpr int L = T::kLanes;
  typename T::M m[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) m[v] = T::tail(N - n0 - L * v);
  for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kMlasStrideK) {
    typename T::V acc[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[v] = T::zero();
    const int64_t k1 = K < k0 + kMlasStrideK ? K : k0 + kMlasStrideK;
    for (int64_t k = k0; k < k1; ++k) {
      const typename T::V av = T::set1(a[k]);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[v] = T::fmadd(av, T::load(m[v], w + k * ldw + n0 + L * v), acc[v]);
    }
    const bool add = accumulate || k0 > 0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      float* yv = y + n0 + L * v;
      T::store(yv, m[v], add ? T::add(acc[v], T::load(m[v], yv)) : acc[v]);
    }
  }
}

// Four rows × NV <= 4 vectors (masked past ncols) of one panel for seq_gemm_mlas, each
// lane's chains as seq_block_mlas's. One row at a time re-reads the whole panel per row:
// at K = 266 that is 136 KB, out of L1, and the X·Wᵀ product of a 600-step, H = 25 LSTM
// ran at L2's speed (2.3x ONNX Runtime's time); four rows share each weight vector. The
// accumulators are named variables (seq_rows' reason).
template <class T, int NV>
void seq_rows4_mlas(const float* a, int64_t lda, const float* w, float* y, int64_t ldy, int64_t K, int64_t ncols,
                    bool accumulate) {
  constexpr int L = T::kLanes;
  using V = typename T::V;
  const typename T::M m0 = T::tail(ncols), m1 = T::tail(ncols - L), m2 = T::tail(ncols - 2 * L),
                      m3 = T::tail(ncols - 3 * L);
#define QUANTA_SEQ_ROWS(X) X(0) X(1) X(2) X(3)
  for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kMlasStrideK) {
#define DECL(r) V c##r##0 = T::zero(), c##r##1 = T::zero(), c##r##2 = T::zero(), c##r##3 = T::zero();
    QUANTA_SEQ_ROWS(DECL)
#undef DECL
    const int64_t k1 = K < k0 + kMlasStrideK ? K : k0 + kMlasStrideK;
    for (int64_t k = k0; k < k1; ++k) {
      const float* wk = w + k * kSeqPanel;
      const V w0 = T::load(m0, wk), w1 = T::load(m1, wk + L), w2 = T::load(m2, wk + 2 * L),
              w3 = T::load(m3, wk + 3 * L);
#define STEP(r)                                      \
  {                                                  \
    const V av = T::set1(a[r * lda + k]);            \
    c##r##0 = T::fmadd(av, w0, c##r##0);             \
    if (NV > 1) c##r##1 = T::fmadd(av, w1, c##r##1); \
    if (NV > 2) c##r##2 = T::fmadd(av, w2, c##r##2); \
    if (NV > 3) c##r##3 = T::fmadd(av, w3, c##r##3); \
  }
      QUANTA_SEQ_ROWS(STEP)
#undef STEP
    }
    const bool add = accumulate || k0 > 0;
#define STORE1(r, v, m)                                               \
  if (NV > v) {                                                       \
    float* yv = y + r * ldy + v * L;                                  \
    T::store(yv, m, add ? T::add(c##r##v, T::load(m, yv)) : c##r##v); \
  }
#define STORE(r) STORE1(r, 0, m0) STORE1(r, 1, m1) STORE1(r, 2, m2) STORE1(r, 3, m3)
    QUANTA_SEQ_ROWS(STORE)
#undef STORE
#undef STORE1
  }
#undef QUANTA_SEQ_ROWS
}

// R <= kRowsMlasMax rows × NV <= 2 vectors at w (32 columns of a panel, kSeqPanel floats a
// k step; only the columns below ncols written) over k steps [k0, k1) for seq_gemm_mlas:
// each lane's chain from +0 in increasing k by fused multiply-adds, then added to y with
// one addition (add) or stored, as seq_block_mlas. Two weight vectors a k step feed 2·R
// accumulators (24 of the 32 registers), and the block's K × 32 columns (24 KB at K = 192)
// stay in L1 while every row block of the product passes over them; four rows × 64
// columns (seq_rows4_mlas) re-read K × 256 bytes per row block from L2 (oskut_ws's B = 42,
// H = 192 bidirectional OrtLSTM node: 1.37 -> 1.19 of ONNX Runtime's time; a B = 6, H =
// 256 one 1.97 -> 1.25; benchmarks/results/2026-12-07h-rnn9.md). The loads of the
// weight vectors are whole (inside the zero-padded panel); the rows' values are
// broadcast from memory into each multiply-add.
constexpr int kRowsMlasMax = 12;

template <class T, int R, int NV>
__attribute__((noinline)) void rows_mlas(const float* a, int64_t lda, const float* w, int64_t k0, int64_t k1, float* y,
                                         int64_t ldy, int64_t ncols, bool add) {
  constexpr int L = T::kLanes;
  static_assert(R >= 1 && R <= kRowsMlasMax && (NV == 1 || NV == 2), "rows_mlas: blocks");
  using V = typename T::V;
  V c[R][NV];
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) c[r][v] = T::zero();
  const float* wk = w + k0 * kSeqPanel;
  for (int64_t k = k0; k < k1; ++k, wk += kSeqPanel) {
    V wv[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      wv[v] = T::loadu(wk + L * v);
      __asm__("" : "+v"(wv[v]));  // one load per weight vector (seq_rows2_panel's reason)
    }
#pragma GCC unroll 12
    for (int r = 0; r < R; ++r) {
      const V av = T::set1(a[r * lda + k]);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) c[r][v] = T::fmadd(av, wv[v], c[r][v]);
    }
  }
  const typename T::M last = T::tail(ncols - L * (NV - 1));
#pragma GCC unroll 12
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) {
      float* yv = y + r * ldy + L * v;
      if (v + 1 < NV) {
        T::storeu(yv, add ? T::add(c[r][v], T::loadu(yv)) : c[r][v]);
      } else {
        T::store(yv, last, add ? T::add(c[r][v], T::load(last, yv)) : c[r][v]);
      }
    }
}

template <class T, int NV, int... I>
constexpr auto rows_mlas_table(std::integer_sequence<int, I...>) {
  using Fn = void (*)(const float*, int64_t, const float*, int64_t, int64_t, float*, int64_t, int64_t, bool);
  return std::array<Fn, sizeof...(I)>{&rows_mlas<T, I + 1, NV>...};
}

// seq_gemm_mlas for M >= kRowsMlasMin on AVX-512 (panels of 8 vectors): per block of 32
// columns, per block of kMlasStrideK k, rows_mlas over the rows in ceil(M / kRowsMlasMax)
// blocks of equal size (to a row: a lone last row would run two chains, latency-bound).
// Under kRowsMlasMin rows, 2·R chains are too few to fill the multiply-add ports.
constexpr int64_t kRowsMlasMin = 6;
template <class T>
void seq_gemm_mlas_rows(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy,
                        int64_t M, bool accumulate) {
  constexpr int L = T::kLanes;
  static_assert(kSeqPanel % (2 * L) == 0, "seq_gemm_mlas_rows: panels of 32-column blocks");
  static constexpr auto kOne = rows_mlas_table<T, 1>(std::make_integer_sequence<int, kRowsMlasMax>());
  static constexpr auto kTwo = rows_mlas_table<T, 2>(std::make_integer_sequence<int, kRowsMlasMax>());
  const int64_t blocks = (M + kRowsMlasMax - 1) / kRowsMlasMax;  // of M / blocks rows, rounded
  for (int64_t n0 = 0; n0 < N; n0 += 2 * L) {
    const float* wn = w + (n0 / kSeqPanel) * kSeqPanel * K + n0 % kSeqPanel;
    const int64_t nc = N - n0 < 2 * L ? N - n0 : 2 * L;
    const auto& fns = nc > L ? kTwo : kOne;
    for (int64_t k0 = 0; k0 < K || k0 == 0; k0 += kMlasStrideK) {
      const int64_t k1 = K < k0 + kMlasStrideK ? K : k0 + kMlasStrideK;
      const bool add = accumulate || k0 > 0;
      for (int64_t b = 0; b < blocks; ++b) {
        const int64_t m0 = b * M / blocks, m1 = (b + 1) * M / blocks;
        fns[static_cast<size_t>(m1 - m0 - 1)](a + m0 * lda, lda, wn, k0, k1, y + m0 * ldy + n0, ldy, nc, add);
      }
    }
  }
}

// kRows4: blocks of four rows by seq_rows4_mlas (an ISA with registers for its 16
// accumulators: AVX-512's 32).
template <class T, int NV, bool kRows4 = false>
void seq_gemm_mlas_simd(const float* a, int64_t lda, const float* w, int64_t K, int64_t N, float* y, int64_t ldy,
                        int64_t M, bool accumulate) {
  constexpr int64_t kCols = NV * T::kLanes;
  if constexpr (kCols < kSeqPanel) {  // AVX2
    seq_gemm_tiled<T, true>(a, lda, w, K, N, y, ldy, M, accumulate);
    return;
  }
  if (M == 1 && kCols == kSeqPanel) {
    seq_row_panels<T, true>(a, w, K, N, y, accumulate);
    return;
  }
  if (kRows4 && kCols == kSeqPanel && M >= kRowsMlasMin) {
    seq_gemm_mlas_rows<T>(a, lda, w, K, N, y, ldy, M, accumulate);
    return;
  }
  for (int64_t p0 = 0; p0 < N; p0 += kSeqPanel) {
    const float* wp = w + p0 * K;
    const int64_t np = N - p0 < kSeqPanel ? N - p0 : kSeqPanel;
    int64_t first = 0;
    if (kRows4) {
      for (; first + 4 <= M; first += 4)
        for (int64_t n0 = 0; n0 < np; n0 += 4 * T::kLanes)
          by_vectors(np - n0, T::kLanes, [&](auto nv) {
            seq_rows4_mlas<T, decltype(nv)::value>(a + first * lda, lda, wp + n0, y + first * ldy + p0 + n0, ldy, K,
                                                   np - n0, accumulate);
          });
    }
    for (int64_t m0 = first; m0 < M; ++m0)
      for (int64_t n0 = 0; n0 < np; n0 += kCols)
        seq_block_mlas<T, NV>(a + m0 * lda, wp, kSeqPanel, y + m0 * ldy + p0, K, np, n0, accumulate);
  }
}

}  // namespace
}  // namespace recurrent
}  // namespace quanta
