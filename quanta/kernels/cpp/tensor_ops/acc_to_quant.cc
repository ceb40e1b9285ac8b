// acc_to_quant: the quantized output stage of an integer convolution whose scaling, float
// offset or activation runs in float (quanta::AccumulatorToQuant, contract in
// tensor_ops.h). It is the composition of three kernels that are each bit-exact with
// their twins, run on pieces of a row in a stack buffer so that the float values never
// leave L1: acc_to_float (the Cast, Mul and Add), the float post-op of the float
// convolutions (sgemm::apply_post: the activation's nodes in order), and QuantizeLinear's
// per-tensor run (the true float32 division, round half to even, saturation).
#include <algorithm>

#include "qgemm/thread_pool.h"
#include "quantize/quantize.h"
#include "sgemm/sgemm.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace tensor_ops {

namespace {

// Floats per piece: 16 KiB of stack, a multiple of 64 (whole vectors on every ISA).
constexpr int64_t kPiece = 4096;
// Elements per thread chunk (as the other drivers of this file family).
constexpr int64_t kQuantGrain = int64_t{1} << 14;

}  // namespace

template <typename T>
void acc_to_quant(const int32_t* acc, T* y, int64_t rows, int64_t inner, int64_t channels, const int32_t* bias,
                  const float* scale, const float* fbias, const sgemm::PostOp* post, float y_scale, int32_t zy,
                  int num_threads, Isa isa) {
  const AccToFloatFn to_float = kernels_for(isa).acc_to_float;
  const QuantizeParams qp{&y_scale, &zy, 1, 1, 0};
  auto range = [&](int64_t lo, int64_t hi) {
    alignas(64) float buf[kPiece];
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t i = 0; i < inner; i += kPiece) {
        const int64_t n = std::min(kPiece, inner - i);
        // one row of n elements whose channel is r mod channels
        to_float(acc + r * inner + i, buf, 1, n, channels, bias, scale, fbias, r);
        if (post != nullptr) sgemm::apply_post(*post, buf, n);
        QuantizeParams p = qp;
        p.inner = n;
        quantize_linear<T>(buf, y + r * inner + i, p, isa, 1);
      }
    }
  };
  const int64_t per = std::max<int64_t>(1, kQuantGrain / std::max<int64_t>(inner, 1));
  qgemm::parallel_ranges(num_threads, rows, per, range);
}

template void acc_to_quant<uint8_t>(const int32_t*, uint8_t*, int64_t, int64_t, int64_t, const int32_t*, const float*,
                                    const float*, const sgemm::PostOp*, float, int32_t, int, Isa);
template void acc_to_quant<int8_t>(const int32_t*, int8_t*, int64_t, int64_t, int64_t, const int32_t*, const float*,
                                   const float*, const sgemm::PostOp*, float, int32_t, int, Isa);

}  // namespace tensor_ops
}  // namespace quanta
