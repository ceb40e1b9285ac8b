// Driver for QuantizeLinear: walks [outer, channels, inner] (in thread chunks of the flat
// range) and calls the ISA variant on each contiguous run that shares one (scale,
// zero_point). See quantize.h.
#include "quantize.h"

#include <algorithm>
#include <type_traits>

#include "qgemm/thread_pool.h"

namespace quanta {

namespace {
template <typename T>
using RunFn = void (*)(const float*, T*, int64_t, float, int32_t);

template <typename T>
RunFn<T> select_run(Isa isa) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    switch (isa) {
      case Isa::kAvx512Vnni: return quantize_run_u8_avx512vnni;
      case Isa::kAvx2: return quantize_run_u8_avx2;
      default: return quantize_run_u8_portable;
    }
  } else if constexpr (std::is_same_v<T, int8_t>) {
    switch (isa) {
      case Isa::kAvx512Vnni: return quantize_run_s8_avx512vnni;
      case Isa::kAvx2: return quantize_run_s8_avx2;
      default: return quantize_run_s8_portable;
    }
  } else if constexpr (std::is_same_v<T, uint16_t>) {
    switch (isa) {
      case Isa::kAvx512Vnni: return quantize_run_u16_avx512vnni;
      case Isa::kAvx2: return quantize_run_u16_avx2;
      default: return quantize_run_u16_portable;
    }
  } else {
    switch (isa) {
      case Isa::kAvx512Vnni: return quantize_run_s16_avx512vnni;
      case Isa::kAvx2: return quantize_run_s16_avx2;
      default: return quantize_run_s16_portable;
    }
  }
}
}  // namespace

// Elements per thread chunk (a multiple of 64, so chunk edges fall on whole vectors).
// 2^14 elements (2^16 before): inside a model run the pool's worker is awake (it spins
// between kernels), and the caller never waits for a worker that has not claimed a
// chunk, so 16K-element halves pay; 2 threads, whole runs: EfficientNet-Lite0 3.19 ->
// 2.83 ms, all-MiniLM-L6-v2 10.4 -> 9.4 ms, the MobileNet-style CNN 1.04 -> 0.98 ms.
constexpr int64_t kGrain = int64_t{1} << 14;

template <typename T>
void quantize_linear(const float* x, T* y, const QuantizeParams& p, Isa isa, int num_threads) {
  const RunFn<T> run = select_run<T>(isa);
  const int64_t runs = p.outer * p.channels;
  const int64_t total = runs * p.inner;
  if (total <= 0) return;
  // [begin, end) of the flat elements: the runs (one scale / zero point each) it touches.
  auto range = [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t r = begin / p.inner;
      const int64_t c = r % p.channels;
      const int64_t stop = std::min(end, (r + 1) * p.inner);
      run(x + begin, y + begin, stop - begin, p.scale[c], p.zero_point[c]);
      begin = stop;
    }
  };
  const int64_t chunks = (total + kGrain - 1) / kGrain;
  if (num_threads <= 1 || chunks == 1) return range(0, total);
  auto body = [&](int64_t chunk, int) { range(chunk * kGrain, std::min(total, (chunk + 1) * kGrain)); };
  qgemm::parallel_for(num_threads, chunks, body);
}

template void quantize_linear<uint8_t>(const float*, uint8_t*, const QuantizeParams&, Isa, int);
template void quantize_linear<int8_t>(const float*, int8_t*, const QuantizeParams&, Isa, int);
template void quantize_linear<uint16_t>(const float*, uint16_t*, const QuantizeParams&, Isa, int);
template void quantize_linear<int16_t>(const float*, int16_t*, const QuantizeParams&, Isa, int);

}  // namespace quanta
