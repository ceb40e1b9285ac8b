// Pooling plane kernels (pool_kernels.h) compiled with the baseline flags: plain loops.
#include "pool/pool_kernels.h"

namespace quanta {
namespace pool {

const Kernels kKernelsPortable = make_kernels<GenericRows>();

}  // namespace pool
}  // namespace quanta
