// Drivers of the elementwise kernels (contract: elementwise.h): broadcast iteration,
// thread chunks, ISA selection. The per-ISA inner runs live in elementwise_<isa>.cc.
#include "elementwise/elementwise.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <type_traits>
#include <vector>

#include "elementwise/elementwise_scalar.h"
#include "qgemm/thread_pool.h"
#include "quantize/quantize.h"

namespace quanta {
namespace elementwise {

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kKernelsAvx512Vnni;
    case Isa::kAvx2: return kKernelsAvx2;
    default: return kKernelsPortable;
  }
}

namespace {

// Elements per thread chunk: large enough that a chunk costs far more than claiming it.
// 2^14 elements (2^16 before): inside a model run the pool's worker is awake (it spins
// between kernels), and the caller never waits for a worker that has not claimed a
// chunk, so 16K-element halves pay; 2 threads, whole runs: EfficientNet-Lite0 3.19 ->
// 2.83 ms, all-MiniLM-L6-v2 10.4 -> 9.4 ms, the MobileNet-style CNN 1.04 -> 0.98 ms.
constexpr int64_t kGrain = int64_t{1} << 14;

int64_t n_chunks_for(int64_t n, int64_t grain) { return n <= 0 ? 0 : (n + grain - 1) / grain; }

// Runs f(begin, end) over [0, n) in chunks of `grain` on up to num_threads threads.
template <typename F>
void for_ranges(int num_threads, int64_t n, int64_t grain, F&& f) {
  qgemm::parallel_ranges(num_threads, n, grain, f);
}

}  // namespace

// ---- DequantizeLinear ---------------------------------------------------------------------

namespace {
// 16-bit codes (ORT's QUInt16 / QInt16 activations): the scalar step of the 8-bit kernels.
template <typename T>
void dequantize_wide(const T* x, float* y, int64_t n, float scale, int32_t zp) {
  for (int64_t i = 0; i < n; ++i) y[i] = dequantize_one(x[i], scale, zp);
}
}  // namespace

template <typename T>
void dequantize_linear(const T* x, float* y, const float* scale, const int32_t* zero_point, int64_t outer,
                       int64_t channels, int64_t inner, int num_threads, Isa isa) {
  const Kernels& k = kernels_for(isa);
  DequantizeRunFn<T> run;
  if constexpr (std::is_same_v<T, uint8_t>) {
    run = k.dequantize_u8;
  } else if constexpr (std::is_same_v<T, int8_t>) {
    run = k.dequantize_s8;
  } else {
    run = dequantize_wide<T>;  // 16-bit codes: one scalar loop on every ISA
  }
  // Flat positions [begin, end) of the [outer, channels, inner] view, split at channel runs.
  const int64_t total = outer * channels * inner;
  if (inner == 0) return;
  for_ranges(num_threads, total, kGrain, [&](int64_t begin, int64_t end) {
    int64_t pos = begin;
    while (pos < end) {
      const int64_t run_index = pos / inner;  // o * channels + c
      const int64_t c = run_index % channels;
      const int64_t len = std::min(end, (run_index + 1) * inner) - pos;
      run(x + pos, y + pos, len, scale[c], zero_point[c]);
      pos += len;
    }
  });
}

template void dequantize_linear<uint8_t>(const uint8_t*, float*, const float*, const int32_t*, int64_t, int64_t,
                                         int64_t, int, Isa);
template void dequantize_linear<int8_t>(const int8_t*, float*, const float*, const int32_t*, int64_t, int64_t, int64_t,
                                        int, Isa);
template void dequantize_linear<uint16_t>(const uint16_t*, float*, const float*, const int32_t*, int64_t, int64_t,
                                          int64_t, int, Isa);
template void dequantize_linear<int16_t>(const int16_t*, float*, const float*, const int32_t*, int64_t, int64_t,
                                         int64_t, int, Isa);

// ---- DynamicQuantizeLinear ------------------------------------------------------------------

void dynamic_quantize_linear(const float* x, uint8_t* y, int64_t n, float* scale_out, uint8_t* zero_point_out,
                             int num_threads, Isa isa) {
  // Range: min/max per chunk (exact in any order: min and max only select), then combined.
  constexpr int kMaxChunks = 256;
  const int64_t grain = std::max(kGrain, n_chunks_for(n, kMaxChunks));
  const int64_t chunks = n_chunks_for(n, grain);
  float lo_c[kMaxChunks], hi_c[kMaxChunks];
  bool nan_c[kMaxChunks];
  const MinMaxFn minmax = kernels_for(isa).minmax_f32;
  auto chunk = [&](int64_t c, int) {
    const int64_t begin = c * grain;
    minmax(x + begin, std::min(n, begin + grain) - begin, &lo_c[c], &hi_c[c], &nan_c[c]);
  };
  if (num_threads <= 1) {
    for (int64_t c = 0; c < chunks; ++c) chunk(c, 0);
  } else {
    qgemm::parallel_for(num_threads, chunks, chunk);
  }
  // eq. (10) in float32, step for step as quantize.py::dynamic_quantize_linear (NumPy's
  // max/min of an array with a NaN is NaN, and Python's max(0, NaN) / min(0, NaN) is 0).
  float hi = 0.0f, lo = 0.0f;
  bool nan = false;
  for (int64_t c = 0; c < chunks; ++c) nan |= nan_c[c];
  if (chunks > 0 && !nan) {
    float mn = lo_c[0], mx = hi_c[0];
    for (int64_t c = 1; c < chunks; ++c) {
      mn = lo_c[c] < mn ? lo_c[c] : mn;
      mx = hi_c[c] > mx ? hi_c[c] : mx;
    }
    hi = mx > 0.0f ? mx : 0.0f;  // max(float32(0), max(x))
    lo = mn < 0.0f ? mn : 0.0f;  // min(float32(0), min(x))
  }
  const float width = hi == lo ? 1.0f : hi - lo;
  const float scale = width / 255.0f;
  const float initial = 0.0f - lo / scale;
  float clamped = initial > 0.0f ? initial : 0.0f;  // Python max(qmin, initial): NaN -> qmin
  clamped = clamped < 255.0f ? clamped : 255.0f;    // Python min(qmax, .)
  const float zp = std::nearbyint(clamped);
  *scale_out = scale;
  *zero_point_out = static_cast<uint8_t>(static_cast<int32_t>(zp));
  const int32_t zp_i = static_cast<int32_t>(zp);
  void (*quantize)(const float*, uint8_t*, int64_t, float, int32_t) = quantize_run_u8_portable;
  if (isa == Isa::kAvx512Vnni) quantize = quantize_run_u8_avx512vnni;
  if (isa == Isa::kAvx2) quantize = quantize_run_u8_avx2;
  for_ranges(num_threads, n, kGrain,
             [&](int64_t begin, int64_t end) { quantize(x + begin, y + begin, end - begin, scale, zp_i); });
}

// ---- QLinearAdd / QLinearMul: broadcast iteration ------------------------------------------

namespace {

using broadcast::Plan;

template <typename T, typename Run>
void broadcast_binary(const T* a, const T* b, T* c, const BroadcastShape& s, int num_threads, Run&& run) {
  if (broadcast::empty(s)) return;
  const Plan p = broadcast::make_plan(s);
  for_ranges(num_threads, p.total(), kGrain,
             [&](int64_t begin, int64_t end) { broadcast::for_each_run(a, b, c, p, begin, end, run); });
}

}  // namespace

template <typename T>
void qlinear_add(const T* a, const T* b, T* c, const BroadcastShape& s, const AddParams& p, int num_threads, Isa isa) {
  AddRunFn<T> fn;
  if constexpr (std::is_same_v<T, uint8_t>) {
    fn = kernels_for(isa).add_u8;
  } else {
    fn = kernels_for(isa).add_s8;
  }
  broadcast_binary(a, b, c, s, num_threads, [&](const T* ra, int64_t sa, const T* rb, int64_t sb, T* rc, int64_t n) {
    fn(ra, sa, rb, sb, rc, n, p);
  });
}

template <typename T>
void qlinear_mul(const T* a, const T* b, T* c, const BroadcastShape& s, const MulParams& p, int num_threads, Isa isa) {
  MulRunFn<T> fn;
  if constexpr (std::is_same_v<T, uint8_t>) {
    fn = kernels_for(isa).mul_u8;
  } else {
    fn = kernels_for(isa).mul_s8;
  }
  broadcast_binary(a, b, c, s, num_threads, [&](const T* ra, int64_t sa, const T* rb, int64_t sb, T* rc, int64_t n) {
    fn(ra, sa, rb, sb, rc, n, p);
  });
}

template void qlinear_add<uint8_t>(const uint8_t*, const uint8_t*, uint8_t*, const BroadcastShape&, const AddParams&,
                                   int, Isa);
template void qlinear_add<int8_t>(const int8_t*, const int8_t*, int8_t*, const BroadcastShape&, const AddParams&, int,
                                  Isa);
template void qlinear_mul<uint8_t>(const uint8_t*, const uint8_t*, uint8_t*, const BroadcastShape&, const MulParams&,
                                   int, Isa);
template void qlinear_mul<int8_t>(const int8_t*, const int8_t*, int8_t*, const BroadcastShape&, const MulParams&, int,
                                  Isa);

// ---- lookup tables ------------------------------------------------------------------------

void lut_u8(const uint8_t* x, uint8_t* y, int64_t n, const uint8_t* table, int num_threads, Isa isa) {
  const LutFn lut = isa == Isa::kAvx512Vnni && avx512vbmi_active() ? lut_avx512vbmi : kernels_for(isa).lut;
  for_ranges(num_threads, n, kGrain,
             [&](int64_t begin, int64_t end) { lut(x + begin, y + begin, end - begin, table); });
}

void lut_u8_channels(const uint8_t* x, uint8_t* y, int64_t outer, int64_t channels, int64_t inner,
                     const uint8_t* tables, int num_threads, Isa isa) {
  const LutFn lut = isa == Isa::kAvx512Vnni && avx512vbmi_active() ? lut_avx512vbmi : kernels_for(isa).lut;
  if (inner < 16) {
    // channels innermost (a channels-last tensor: inner = 1) or nearly: runs too short for
    // the run kernel. Rows of channels · inner elements; AVX-512 and AVX2 gather 16 at a
    // time with a per-element table offset, the portable ISA looks each element up.
    const int64_t row = channels * inner;
    const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(row, 1));
    // The gather's setup (a per-element offset table of lcm(row, 16) entries and a padded
    // copy of every channel's table) costs more than looking a few rows up one element at
    // a time: at most kFewRows rows take the plain loop (DTLN's [1, 1, 257] and [1, 512]
    // gates: ~16 us of setup for 257-512 lookups).
    constexpr int64_t kFewRows = 8;
    if ((isa == Isa::kAvx512Vnni || isa == Isa::kAvx2) && outer > kFewRows) {
      const auto gather = isa == Isa::kAvx512Vnni ? lut_channels_last_avx512 : lut_channels_last_avx2;
      const int64_t period = std::lcm(row, int64_t{16});
      std::vector<int32_t> offsets(period + 16);
      for (int64_t j = 0; j < period + 16; ++j) offsets[j] = static_cast<int32_t>((j % row) / inner * 256);
      std::vector<uint8_t> padded(channels * 256 + 4, 0);
      std::memcpy(padded.data(), tables, channels * 256);
      for_ranges(num_threads, outer, grain, [&](int64_t begin, int64_t end) {
        // row r starts at element r·row, so at offset index (r·row) mod period
        gather(x + begin * row, y + begin * row, (end - begin) * row, (begin * row) % period, offsets.data(), period,
               padded.data());
      });
      return;
    }
    for_ranges(num_threads, outer, grain, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        for (int64_t c = 0; c < channels; ++c) {
          const uint8_t* t = tables + c * 256;
          const int64_t base = (r * channels + c) * inner;
          for (int64_t i = 0; i < inner; ++i) y[base + i] = t[x[base + i]];
        }
      }
    });
    return;
  }
  // a chunk is whole runs of `inner` elements (one channel of one outer index each), about
  // kGrain elements of them: a run's table is fixed, so the gather loads it once per run
  const int64_t runs = outer * channels;
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(inner, 1));
  for_ranges(num_threads, runs, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      lut(x + r * inner, y + r * inner, inner, tables + (r % channels) * 256);
    }
  });
}

// ---- QLinearSoftmax -----------------------------------------------------------------------

template <typename T>
void qlinear_softmax_rows(const T* x, T* y, int64_t rows, int64_t d, const float* table, float ys, int32_t zy,
                          int num_threads, Isa isa) {
  if (d <= 0) return;
  SoftmaxRowsFn<T> fn;
  if constexpr (std::is_same_v<T, uint8_t>) {
    fn = kernels_for(isa).softmax_u8;
  } else {
    fn = kernels_for(isa).softmax_s8;
  }
  const int64_t grain = std::max<int64_t>(4, (kGrain / d) & ~int64_t{3});
  for_ranges(num_threads, rows, grain,
             [&](int64_t begin, int64_t end) { fn(x + begin * d, y + begin * d, end - begin, d, table, ys, zy); });
}

template void qlinear_softmax_rows<uint8_t>(const uint8_t*, uint8_t*, int64_t, int64_t, const float*, float, int32_t,
                                            int, Isa);
template void qlinear_softmax_rows<int8_t>(const int8_t*, int8_t*, int64_t, int64_t, const float*, float, int32_t, int,
                                           Isa);

}  // namespace elementwise
}  // namespace quanta
