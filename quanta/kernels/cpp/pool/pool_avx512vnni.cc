// Pooling plane kernels (pool_kernels.h) compiled with the avx512vnni flags (AVX-512 flags).
#include "pool/pool_kernels.h"

namespace quanta {
namespace pool {

const Kernels kKernelsAvx512Vnni = kPlaneKernels;

}  // namespace pool
}  // namespace quanta
