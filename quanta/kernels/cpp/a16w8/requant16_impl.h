// The loops of requant16.h, compiled once per ISA: each file that includes this defines
// QUANTA_R16_NS (the namespace that keeps the instantiations apart) first.
#pragma once

#include <algorithm>
#include <cstdint>

#include "a16w8/requant16.h"

namespace quanta {
namespace a16w8 {
namespace QUANTA_R16_NS {

// 1.5·2^52: adding and subtracting it rounds a double of magnitude < 2^51 to an integer,
// half to even (the default rounding mode), in two vectorizable additions.
constexpr double kRound = 6755399441055744.0;

inline double rne_clamped(double v, double lo, double hi) {
  v = std::min(std::max(v, lo), hi);
  return (v + kRound) - kRound;
}

template <typename TI, typename TO>
void affine16(const TI* x, TO* y, const Affine16& p) {
  for (int64_t o = 0; o < p.outer; ++o) {
    for (int64_t c = 0; c < p.channels; ++c) {
      const double m = p.m[c], b = p.b[c], lo = p.lo, hi = p.hi;
      const double zxd = p.zx;  // x − zx is exact in double
      const int64_t base = (o * p.channels + c) * p.inner;
      const TI* xs = x + base;
      TO* ys = y + base;
      for (int64_t i = 0; i < p.inner; ++i) {
        const double v = (static_cast<double>(xs[i]) - zxd) * m + b;
        ys[i] = static_cast<TO>(static_cast<int32_t>(rne_clamped(v, lo, hi)));
      }
    }
  }
}

// One run of a binary op: a_step / b_step are 1 (stepping) or 0 (repeating one value); the
// three cases get loops of their own so each vectorizes. Every step is the float group's
// float32 operation (a 17-bit difference converts exactly; -ffp-contract=off keeps the
// products and the sum apart). The quotient is rounded before the zero point is added, as
// QuantizeLinear does: a tie rounds to even on its own, not on its sum with an odd zero
// point. Clamping to the integer bounds less zy first gives the same codes and keeps the
// rounding trick's range.
template <bool kMul, typename T>
void binary_run(const T* a, int64_t a_step, const T* b, int64_t b_step, T* y, int64_t n, const Binary16& p) {
  const int32_t za = p.za, zb = p.zb;
  const float sa = p.sa, sb = p.sb, sy = p.sy;
  const double zy = p.zy, lo = p.lo - p.zy, hi = p.hi - p.zy;
  auto one = [&](float fa, float fb) {
    const float v = kMul ? fa * fb : fa + fb;
    const float q = v / sy;
    return static_cast<T>(static_cast<int32_t>(rne_clamped(static_cast<double>(q), lo, hi) + zy));
  };
  auto deq_a = [&](T v) { return static_cast<float>(static_cast<int32_t>(v) - za) * sa; };
  auto deq_b = [&](T v) { return static_cast<float>(static_cast<int32_t>(v) - zb) * sb; };
  if (a_step == 1 && b_step == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = one(deq_a(a[i]), deq_b(b[i]));
  } else if (a_step == 1) {
    const float fb = deq_b(b[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = one(deq_a(a[i]), fb);
  } else if (b_step == 1) {
    const float fa = deq_a(a[0]);
    for (int64_t i = 0; i < n; ++i) y[i] = one(fa, deq_b(b[i]));
  } else {
    const T v = one(deq_a(a[0]), deq_b(b[0]));
    for (int64_t i = 0; i < n; ++i) y[i] = v;
  }
}

template <typename T>
void binary16(const T* a, const T* b, T* y, const broadcast::Shape& s, const Binary16& p) {
  if (broadcast::empty(s)) return;
  const broadcast::Plan plan = broadcast::make_plan(s);
  broadcast::for_each_run(a, b, y, plan, 0, plan.total(),
                          [&p](const T* ar, int64_t as, const T* br, int64_t bs, T* yr, int64_t n) {
                            if (p.mul) {
                              binary_run<true>(ar, as, br, bs, yr, n, p);
                            } else {
                              binary_run<false>(ar, as, br, bs, yr, n, p);
                            }
                          });
}

}  // namespace QUANTA_R16_NS
}  // namespace a16w8
}  // namespace quanta
