// conv_gram.h's sums compiled with this file's instruction set (conv_gram_impl.h).
#include "quantize/conv_gram_impl.h"

namespace quanta {
namespace conv_gram {

void accumulate_avx2(const Args& a) { accumulate_body(a); }

}  // namespace conv_gram
}  // namespace quanta
