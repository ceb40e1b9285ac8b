// pack_strided_panels (pack_strided.h) compiled for the avx2 family layout (16 x 2,
// int8_t), with this file's -m flags so the fixed-size loops vectorise for avx2.
#include "gemm/pack_strided.h"

namespace quanta {
namespace gemm {

void pack_strided_avx2(const StridedSource& s, void* dst, int32_t* cs, int32_t* zw) {
  if (s.w_unsigned) {
    pack_strided_panels<uint8_t, int8_t, 16, 2>(s, static_cast<int8_t*>(dst), cs, zw);
  } else {
    pack_strided_panels<int8_t, int8_t, 16, 2>(s, static_cast<int8_t*>(dst), cs, zw);
  }
}

}  // namespace gemm
}  // namespace quanta
