// AVX-512 seq_gemm (float_rnn.h (RNN1); the template: seq_gemm_simd.h): 16 columns per
// vector, one row x 8 vectors per block (8 accumulators, 128 columns: a panel), or four
// rows x 4 vectors (16 accumulators); masked column tails.
#include "recurrent/seq_gemm_simd.h"

namespace quanta {
namespace recurrent {

extern const SeqGemmFn kSeqGemmAvx512Vnni = seq_gemm_simd<simd::F32x16, 8, true>;
extern const SeqGemmFn kSeqGemmStripsAvx512Vnni = seq_gemm_strips_simd<simd::F32x16>;
extern const SeqGemmMlasFn kSeqGemmMlasAvx512Vnni = seq_gemm_mlas_simd<simd::F32x16, 8, true>;

}  // namespace recurrent
}  // namespace quanta
