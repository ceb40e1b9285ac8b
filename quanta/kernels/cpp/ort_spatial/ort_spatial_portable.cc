// ort_spatial.h kernels compiled with the baseline flags: plain loops.
#include "ort_spatial/ort_spatial_kernels.h"

namespace quanta {
namespace ort_spatial {

const Kernels kKernelsPortable = {resize_gather_generic, resize_combine, average_planes_generic, average_planes_vector};

}  // namespace ort_spatial
}  // namespace quanta
