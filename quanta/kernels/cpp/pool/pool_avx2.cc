// Pooling plane kernels (pool_kernels.h) compiled with the avx2 flags (-mavx2 -mfma).
#include "pool/pool_kernels.h"

namespace quanta {
namespace pool {

const Kernels kKernelsAvx2 = kPlaneKernels;

}  // namespace pool
}  // namespace quanta
