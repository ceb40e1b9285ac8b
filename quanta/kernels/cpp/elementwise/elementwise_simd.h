// The lane arithmetic of the QLinearAdd / QLinearMul runs, written once over the integer
// vector traits of simd.h (I = I32x8 in elementwise_avx2.cc, I32x16 in
// elementwise_avx512vnni.cc): each lane performs the float32 operations of add_one /
// mul_one (elementwise_scalar.h) in the same order; the files keep their own loops and
// narrowing stores. AS / BS: 1 for an operand that steps through memory, 0 for one
// repeated element (a[0] / b[0]), held in a register.
//
// Internal linkage, as in simd.h: the header is compiled into TUs built for different ISAs.
#pragma once

#include <cstdint>

#include "elementwise/elementwise.h"
#include "simd.h"

namespace quanta {
namespace elementwise {
namespace {  // NOLINT: see the header comment

// a·ra + (b·rb + k), zc included in k.
template <class I, typename T, int AS, int BS>
struct AddLanes {
  using F = typename I::F;
  using V = typename F::V;
  V ra, rb, vk, fa, fb;
  AddLanes(const T* a, const T* b, const AddParams& p)
      : ra(F::set1(p.ra)),
        rb(F::set1(p.rb)),
        vk(F::set1(p.k)),
        fa(F::set1(static_cast<float>(a[0]))),
        fb(F::set1(static_cast<float>(b[0]))) {}
  // kLanes elements from a and b (mask: the lanes to load, the others 0), before rounding.
  template <typename... Mask>
  V operator()(const T* a, const T* b, Mask... mask) const {
    const V va = AS ? I::to_f32(I::template widen<T>(a, mask...)) : fa;
    const V vb = BS ? I::to_f32(I::template widen<T>(b, mask...)) : fb;
    return F::fmadd(va, ra, F::fmadd(vb, rb, vk));
  }
};

// float32((a − za)·(b − zb))·ratio + zc, the product exact in int32.
template <class I, typename T, int AS, int BS>
struct MulLanes {
  using F = typename I::F;
  using V = typename F::V;
  using W = typename I::V;
  V r, zc;
  W za, zb, ia, ib;
  MulLanes(const T* a, const T* b, const MulParams& p)
      : r(F::set1(p.ratio)),
        zc(F::set1(static_cast<float>(p.zc))),
        za(I::set1(p.za)),
        zb(I::set1(p.zb)),
        ia(I::set1(static_cast<int32_t>(a[0]) - p.za)),
        ib(I::set1(static_cast<int32_t>(b[0]) - p.zb)) {}
  template <typename... Mask>
  V operator()(const T* a, const T* b, Mask... mask) const {
    const W da = AS ? I::sub(I::template widen<T>(a, mask...), za) : ia;
    const W db = BS ? I::sub(I::template widen<T>(b, mask...), zb) : ib;
    return F::add(F::mul(I::to_f32(I::mullo(da, db)), r), zc);
  }
};

}  // namespace
}  // namespace elementwise
}  // namespace quanta
