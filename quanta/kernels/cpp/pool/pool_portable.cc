// Pooling plane kernels (pool_kernels.h) compiled with the portable flags (baseline flags (SSE2)).
#include "pool/pool_kernels.h"

namespace quanta {
namespace pool {

const Kernels kKernelsPortable = kPlaneKernels;

}  // namespace pool
}  // namespace quanta
