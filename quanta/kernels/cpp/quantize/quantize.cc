// Driver for QuantizeLinear: walks [outer, channels, inner] and calls the ISA variant
// on each contiguous run that shares one (scale, zero_point). See quantize.h.
#include "quantize.h"

#include <type_traits>

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
  } else {
    switch (isa) {
      case Isa::kAvx512Vnni: return quantize_run_s8_avx512vnni;
      case Isa::kAvx2: return quantize_run_s8_avx2;
      default: return quantize_run_s8_portable;
    }
  }
}
}  // namespace

template <typename T>
void quantize_linear(const float* x, T* y, const QuantizeParams& p, Isa isa) {
  const RunFn<T> run = select_run<T>(isa);
  for (int64_t o = 0; o < p.outer; ++o) {
    for (int64_t c = 0; c < p.channels; ++c) {
      const int64_t off = (o * p.channels + c) * p.inner;
      run(x + off, y + off, p.inner, p.scale[c], p.zero_point[c]);
    }
  }
}

template void quantize_linear<uint8_t>(const float*, uint8_t*, const QuantizeParams&, Isa);
template void quantize_linear<int8_t>(const float*, int8_t*, const QuantizeParams&, Isa);

}  // namespace quanta
