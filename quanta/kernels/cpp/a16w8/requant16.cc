// requant16.h: the portable loops and the dispatch to the AVX2 and AVX-512 ones
// (requant16_avx2.cc, requant16_avx512vnni.cc: the same loops, compiled per ISA).
#define QUANTA_R16_NS portable
#include "a16w8/requant16_impl.h"

namespace quanta {
namespace a16w8 {
namespace avx2 {
template <typename TI, typename TO>
void affine16(const TI* x, TO* y, const Affine16& p);
template <typename T>
void binary16(const T* a, const T* b, T* y, const broadcast::Shape& s, const Binary16& p);
}  // namespace avx2
namespace avx512 {
template <typename TI, typename TO>
void affine16(const TI* x, TO* y, const Affine16& p);
template <typename T>
void binary16(const T* a, const T* b, T* y, const broadcast::Shape& s, const Binary16& p);
}  // namespace avx512

template <typename TI, typename TO>
void affine16(const TI* x, TO* y, const Affine16& p, Isa isa) {
  if (isa == Isa::kPortable) {
    portable::affine16(x, y, p);
  } else if (isa == Isa::kAvx2) {
    avx2::affine16(x, y, p);
  } else {
    avx512::affine16(x, y, p);
  }
}

template <typename T>
void binary16(const T* a, const T* b, T* y, const broadcast::Shape& s, const Binary16& p, Isa isa) {
  if (isa == Isa::kPortable) {
    portable::binary16(a, b, y, s, p);
  } else if (isa == Isa::kAvx2) {
    avx2::binary16(a, b, y, s, p);
  } else {
    avx512::binary16(a, b, y, s, p);
  }
}

template <typename T>
void lut16(const uint16_t* x, T* y, int64_t n, const T* table) {
  // scalar loads: a 128 KiB table stays in L2, and a gather of 16-bit entries saves nothing
  for (int64_t i = 0; i < n; ++i) y[i] = table[x[i]];
}

template void lut16<uint16_t>(const uint16_t*, uint16_t*, int64_t, const uint16_t*);
template void lut16<int16_t>(const uint16_t*, int16_t*, int64_t, const int16_t*);
template void affine16<uint16_t, uint16_t>(const uint16_t*, uint16_t*, const Affine16&, Isa);
template void affine16<uint16_t, int16_t>(const uint16_t*, int16_t*, const Affine16&, Isa);
template void affine16<int16_t, uint16_t>(const int16_t*, uint16_t*, const Affine16&, Isa);
template void affine16<int16_t, int16_t>(const int16_t*, int16_t*, const Affine16&, Isa);
template void binary16<uint16_t>(const uint16_t*, const uint16_t*, uint16_t*, const broadcast::Shape&, const Binary16&,
                                 Isa);
template void binary16<int16_t>(const int16_t*, const int16_t*, int16_t*, const broadcast::Shape&, const Binary16&,
                                Isa);

}  // namespace a16w8
}  // namespace quanta
