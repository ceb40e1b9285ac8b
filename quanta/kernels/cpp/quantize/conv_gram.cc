// Dispatch of conv_gram.h's sums.
#include "quantize/conv_gram.h"

namespace quanta {
namespace conv_gram {

int64_t rows(const Args& a) { return a.channels / a.groups * a.kh * a.kw; }

void accumulate(const Args& a, Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: accumulate_avx512vnni(a); break;
    case Isa::kAvx2: accumulate_avx2(a); break;
    default: accumulate_portable(a); break;
  }
}

}  // namespace conv_gram
}  // namespace quanta
