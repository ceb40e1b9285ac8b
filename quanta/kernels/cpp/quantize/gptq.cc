// Dispatch of gptq.h's column loop.
#include "gptq.h"

namespace quanta {

void gptq_block(const GptqBlock& b, Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: gptq_block_avx512vnni(b); break;
    case Isa::kAvx2: gptq_block_avx2(b); break;
    default: gptq_block_portable(b); break;
  }
}

}  // namespace quanta
