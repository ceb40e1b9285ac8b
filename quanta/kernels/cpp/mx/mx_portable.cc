// The portable MX loops (mx_impl.h), compiled without ISA flags.
#include <algorithm>
#include <vector>

#include "mx/mx_impl.h"

namespace quanta {
namespace mx {

void gemm_i8_portable(const uint8_t* au, const float* sa, const PackedMx& b, const float* bias, float* y, int64_t,
                      int64_t m0, int64_t m1, int64_t p0, int64_t p1, int k0, int k1) {
  gemm_i8_generic(au, sa, b, bias, y, m0, m1, p0, p1, k0, k1);
}

void gemm_f64_portable(const double* ad, const uint8_t* abad, const float* sa, const PackedMx& b, const float* bias,
                       float* y, int64_t m0, int64_t m1) {
  gemm_f64_generic(ad, abad, sa, b, bias, y, m0, m1);
}

void quantize_i8_portable(const float* x, uint8_t* bits, uint8_t* codes, int64_t r0, int64_t r1, int64_t K,
                          int block) {
  quantize_i8_rows_generic(x, bits, codes, r0, r1, K, block);
}

}  // namespace mx
}  // namespace quanta
