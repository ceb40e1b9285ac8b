// AVX2 seq_gemm and seq_gemm_mlas (float_rnn.h (RNN1), (RNN-ORT1); the templates:
// seq_gemm_simd.h): 8 columns per vector, the products in tiles (seq_gemm_tiled: chunks
// of kTileK k steps of a panel, blocks of up to 6 rows × 2 vectors); a batch-1 step on
// row strips (seq_row_strips); the input projection on W's strips of 16 columns
// (seq_gemm_wstrips).
#include "recurrent/seq_gemm_simd.h"

namespace quanta {
namespace recurrent {

extern const SeqGemmFn kSeqGemmAvx2 = seq_gemm_simd<simd::F32x8, 4>;
extern const SeqGemmMlasFn kSeqGemmMlasAvx2 = seq_gemm_mlas_simd<simd::F32x8, 4>;
extern const SeqGemmMlasFn kSeqRowStripsAvx2 = seq_row_strips<simd::F32x8, false>;
extern const SeqGemmMlasFn kSeqRowStripsMlasAvx2 = seq_row_strips<simd::F32x8, true>;
extern const SeqGemmMlasFn kSeqWStripsAvx2 = seq_gemm_wstrips<simd::F32x8, false>;
extern const SeqGemmMlasFn kSeqWStripsMlasAvx2 = seq_gemm_wstrips<simd::F32x8, true>;

}  // namespace recurrent
}  // namespace quanta
