// tensor_ops.h loops compiled for avx512vnni (the loops: tensor_ops_impl.h).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "simd.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace tensor_ops {
namespace {
#include "tensor_ops/tensor_ops_impl.h"
}  // namespace

const Kernels& kernels_avx512vnni() {
  static const Kernels k = make_kernels("avx512vnni");
  return k;
}

}  // namespace tensor_ops
}  // namespace quanta
