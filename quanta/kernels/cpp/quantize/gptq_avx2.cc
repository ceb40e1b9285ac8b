// gptq.h's column loop compiled with this file's instruction set (gptq_impl.h).
#include "gptq_impl.h"

namespace quanta {

void gptq_block_avx2(const GptqBlock& b) { gptq_block_body(b); }

}  // namespace quanta
