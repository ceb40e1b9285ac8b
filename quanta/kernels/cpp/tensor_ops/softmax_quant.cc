// softmax_quant: an attention score's float stage, Mul by a scalar, Add of a mask, Softmax
// along the last axis and a per-tensor QuantizeLinear (quanta::SoftmaxQuant, contract in
// tensor_ops.h). It is the composition of kernels that are each bit-exact with their
// twins, run one row at a time in stack buffers so that the float values never leave L1:
// float_ops' binary Mul and Add runs (one float32 rounding each), its Softmax row
// (S1)-(S5) with the fused exp (EN1)-(EN6) in (S2) (Kernels::softmax_fused: the 8-bit
// output shows no difference but at rounding ties, docs/float-ops.md "SoftmaxQuant"),
// and QuantizeLinear's per-tensor run (the true float32 division, round half
// to even, saturation). On AVX-512 the same operations per element run fused into three
// passes (softmax_quant_avx512vnni.cc).
#include <algorithm>

#include "float_ops/float_ops.h"
#include "qgemm/thread_pool.h"
#include "quantize/quantize.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace tensor_ops {

template <typename T>
void softmax_quant(const float* x, T* y, int64_t rows, int64_t d, const float* scale, const float* mask,
                   const int64_t* mask_rows, float y_scale, int32_t zy, int num_threads, Isa isa) {
  if (d <= 0 || rows <= 0) return;
  const float_ops::Kernels& k = float_ops::kernels_for(isa);
  const float_ops::BinaryRunFn mul = k.binary[static_cast<int>(float_ops::BinaryOp::kMul)];
  const float_ops::BinaryRunFn add = k.binary[static_cast<int>(float_ops::BinaryOp::kAdd)];
  const QuantizeParams qp{&y_scale, &zy, 1, 1, 0};
  // blocks of whole rows, 16 KiB of floats (several rows whenever d <= 1024: the AVX-512
  // Softmax row kernel interleaves rows in groups of four, and one row at a time leaves
  // its reductions' latency exposed)
  const int64_t block = std::max<int64_t>(1, kSoftmaxQuantMaxD / d);
  auto range = [&](int64_t lo, int64_t hi) {
    if (isa == Isa::kAvx512Vnni) {
      softmax_quant_rows_avx512vnni<T>(x + lo * d, y + lo * d, hi - lo, d, scale, mask,
                                       mask_rows != nullptr ? mask_rows + lo : nullptr, y_scale, zy);
      return;
    }
    alignas(64) float v[kSoftmaxQuantMaxD];
    alignas(64) float s[kSoftmaxQuantMaxD];
    for (int64_t r0 = lo; r0 < hi; r0 += block) {
      const int64_t n = std::min(block, hi - r0);
      const float* src = x + r0 * d;
      if (scale != nullptr) {
        mul(src, 1, scale, 0, v, n * d);
        src = v;
      }
      if (mask != nullptr) {
        for (int64_t r = 0; r < n; ++r) add(src + r * d, 1, mask + mask_rows[r0 + r] * d, 1, v + r * d, d);
        src = v;
      }
      k.softmax_fused(src, s, n, d);
      QuantizeParams p = qp;
      p.inner = n * d;
      quantize_linear<T>(s, y + r0 * d, p, isa, 1);
    }
  };
  // ~0.5 ns per element: chunks of ~8 K elements, a multiple of 4 rows
  const int64_t per = std::max<int64_t>(4, ((int64_t{1} << 13) / d) & ~int64_t{3});
  qgemm::parallel_ranges(num_threads, rows, per, range);
}

template void softmax_quant<uint8_t>(const float*, uint8_t*, int64_t, int64_t, const float*, const float*,
                                     const int64_t*, float, int32_t, int, Isa);
template void softmax_quant<int8_t>(const float*, int8_t*, int64_t, int64_t, const float*, const float*, const int64_t*,
                                    float, int32_t, int, Isa);

}  // namespace tensor_ops
}  // namespace quanta
