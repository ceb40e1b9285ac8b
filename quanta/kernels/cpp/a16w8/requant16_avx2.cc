// requant16.h's loops compiled for AVX2 (four doubles a vector).
#define QUANTA_R16_NS avx2
#include "a16w8/requant16_impl.h"

namespace quanta {
namespace a16w8 {
namespace avx2 {

template void affine16<uint16_t, uint16_t>(const uint16_t*, uint16_t*, const Affine16&);
template void affine16<uint16_t, int16_t>(const uint16_t*, int16_t*, const Affine16&);
template void affine16<int16_t, uint16_t>(const int16_t*, uint16_t*, const Affine16&);
template void affine16<int16_t, int16_t>(const int16_t*, int16_t*, const Affine16&);
template void binary16<uint16_t>(const uint16_t*, const uint16_t*, uint16_t*, const broadcast::Shape&, const Binary16&);
template void binary16<int16_t>(const int16_t*, const int16_t*, int16_t*, const broadcast::Shape&, const Binary16&);

}  // namespace avx2
}  // namespace a16w8
}  // namespace quanta
