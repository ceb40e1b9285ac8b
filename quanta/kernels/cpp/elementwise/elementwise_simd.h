// The lane arithmetic of the QLinearAdd / QLinearMul runs, written once over the integer
// vector traits of simd.h (I = I32x8 in elementwise_avx2.cc, I32x16 in
// elementwise_avx512vnni.cc): each lane performs the float32 operations of add_one /
// mul_one (elementwise_scalar.h) in the same order; the files keep their own loops and
// narrowing stores (binary_run_t, one per file). AS / BS: 1 for an operand that steps through memory, 0 for one
// repeated element (a[0] / b[0]), held in a register.
//
// Internal linkage, as in simd.h: the header is compiled into TUs built for different ISAs.
#pragma once

#include <cstdint>
#include <type_traits>

#include "elementwise/elementwise.h"
#include "elementwise/elementwise_scalar.h"
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
  static T one(T a, T b, const AddParams& p) { return add_one(a, b, p); }  // a scalar tail element
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
  static T one(T a, T b, const MulParams& p) { return mul_one(a, b, p); }
  template <typename... Mask>
  V operator()(const T* a, const T* b, Mask... mask) const {
    const W da = AS ? I::sub(I::template widen<T>(a, mask...), za) : ia;
    const W db = BS ? I::sub(I::template widen<T>(b, mask...), zb) : ib;
    return F::add(F::mul(I::to_f32(I::mullo(da, db)), r), zc);
  }
};

// One QLinearAdd (Lanes = AddLanes) or QLinearMul (MulLanes) run with constant strides:
// defined in each ISA file (its loop and stores).
template <template <class, typename, int, int> class Lanes, typename T, int AS, int BS, typename P>
void binary_run_t(const T* a, const T* b, T* c, int64_t n, const P& p);

// Calls run(AS, BS) with std::integral_constant<int, 1> for an operand that steps
// through memory and <int, 0> for one repeated element: the SIMD runs of QLinearAdd /
// QLinearMul are instantiated once per case, so a broadcast operand is one register.
template <typename Run>
inline void by_steps(int64_t a_step, int64_t b_step, Run&& run) {
  using One = std::integral_constant<int, 1>;
  using Zero = std::integral_constant<int, 0>;
  if (a_step && b_step) return run(One{}, One{});
  if (a_step) return run(One{}, Zero{});
  if (b_step) return run(Zero{}, One{});
  return run(Zero{}, Zero{});
}

template <template <class, typename, int, int> class Lanes, typename T, typename P>
void binary_run(const T* a, int64_t a_step, const T* b, int64_t b_step, T* c, int64_t n, const P& p) {
  if (n <= 0) return;
  by_steps(a_step, b_step,
           [&](auto as, auto bs) { binary_run_t<Lanes, T, decltype(as)::value, decltype(bs)::value>(a, b, c, n, p); });
}

template <typename T>
constexpr AddRunFn<T> add_run = binary_run<AddLanes, T, AddParams>;
template <typename T>
constexpr MulRunFn<T> mul_run = binary_run<MulLanes, T, MulParams>;

}  // namespace
}  // namespace elementwise
}  // namespace quanta
