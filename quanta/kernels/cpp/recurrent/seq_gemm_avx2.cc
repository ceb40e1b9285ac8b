// AVX2 seq_gemm (float_rnn.h (RNN1); the template: seq_gemm_simd.h): 8 columns per
// vector, one row x 4 vectors per block (32 columns); masked column tails (vmaskmovps).
#include "recurrent/seq_gemm_simd.h"

namespace quanta {
namespace recurrent {

extern const SeqGemmFn kSeqGemmAvx2 = seq_gemm_simd<simd::F32x8, 4>;
extern const SeqGemmMlasFn kSeqGemmMlasAvx2 = seq_gemm_mlas_simd<simd::F32x8, 4>;

}  // namespace recurrent
}  // namespace quanta
