// mul_quant: a Mul by a per-column (or scalar) float32 constant and a per-tensor
// QuantizeLinear (quanta::MulQuant, contract in tensor_ops.h): quanta's SmoothQuant files
// divide an activation by its smoothing factor column by column right before quantizing it.
// The composition of float_ops' binary Mul run (one float32 rounding) and QuantizeLinear's
// per-tensor run (the true float32 division, round half to even, saturation) on pieces of
// a row in a stack buffer; on AVX-512 the two run per 16 lanes in registers
// (mul_quant_avx512vnni.cc), the same operations. With `gelu` (MulQuant's activation "gelu",
// docs/float-ops.md (OV1)) a piece of the row first goes through float_ops' Gelu run (G1)
// into a stack buffer that stays in L1, and the Mul and QuantizeLinear read it there: the
// bytes of the Gelu step followed by the MulQuant step, without the float tensor between
// them making a round trip through memory.
#include <algorithm>

#include "float_ops/float_ops.h"
#include "qgemm/thread_pool.h"
#include "quantize/quantize.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace tensor_ops {

template <typename T>
void mul_quant(const float* x, T* y, int64_t rows, int64_t d, const float* c, int64_t c_step, float y_scale, int32_t zy,
               int num_threads, Isa isa, bool gelu) {
  if (d <= 0 || rows <= 0) return;
  const float_ops::BinaryRunFn mul = float_ops::kernels_for(isa).binary[static_cast<int>(float_ops::BinaryOp::kMul)];
  const float_ops::UnaryRunFn act = float_ops::kernels_for(isa).unary[static_cast<int>(float_ops::UnaryOp::kGelu)];
  const QuantizeParams qp{&y_scale, &zy, 1, 1, 0};
  constexpr int64_t kPiece = 4096;
  // the Gelu's output piece: 4 KiB, read back while it is still in L1
  constexpr int64_t kActPiece = 1024;
  auto range = [&](int64_t lo, int64_t hi) {
    if (!gelu && isa == Isa::kAvx512Vnni) {
      mul_quant_rows_avx512vnni<T>(x + lo * d, y + lo * d, hi - lo, d, c, c_step, y_scale, zy);
      return;
    }
    alignas(64) float v[kPiece];
    alignas(64) float a[kActPiece];
    const int64_t piece = gelu ? kActPiece : kPiece;
    for (int64_t r = lo; r < hi; ++r) {
      for (int64_t i = 0; i < d; i += piece) {
        const int64_t n = std::min(piece, d - i);
        const float* src = x + r * d + i;
        if (gelu) {
          act(src, a, n);
          src = a;
        }
        if (isa == Isa::kAvx512Vnni) {
          mul_quant_rows_avx512vnni<T>(src, y + r * d + i, 1, n, c + i * c_step, c_step, y_scale, zy);
          continue;
        }
        mul(src, 1, c + i * c_step, c_step, v, n);
        QuantizeParams p = qp;
        p.inner = n;
        quantize_linear<T>(v, y + r * d + i, p, isa, 1);
      }
    }
  };
  // ~0.1 ns per element (with the Gelu ~0.7 ns): chunks of ~32 K (~4 K) elements
  const int64_t per = std::max<int64_t>(1, (int64_t{1} << (gelu ? 12 : 15)) / d);
  qgemm::parallel_ranges(num_threads, rows, per, range);
}

template void mul_quant<uint8_t>(const float*, uint8_t*, int64_t, int64_t, const float*, int64_t, float, int32_t, int,
                                 Isa, bool);
template void mul_quant<int8_t>(const float*, int8_t*, int64_t, int64_t, const float*, int64_t, float, int32_t, int,
                                Isa, bool);

}  // namespace tensor_ops
}  // namespace quanta
