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
// three cases get loops of their own so each vectorizes. A product of two 17-bit
// differences is exact in double, so multiplying the converted differences equals
// converting the int64 product (the twin's form).
template <bool kMul, typename T>
void binary_run(const T* a, int64_t a_step, const T* b, int64_t b_step, T* y, int64_t n, const Binary16& p) {
  const double za = p.za, zb = p.zb, m0 = p.m0, m1 = p.m1, zy = p.zy, lo = p.lo, hi = p.hi;
  auto one = [&](double da, double db) {
    const double v = kMul ? (da * db) * m0 + zy : (da * m0 + db * m1) + zy;
    return static_cast<T>(static_cast<int32_t>(rne_clamped(v, lo, hi)));
  };
  if (a_step == 1 && b_step == 1) {
    for (int64_t i = 0; i < n; ++i) y[i] = one(static_cast<double>(a[i]) - za, static_cast<double>(b[i]) - zb);
  } else if (a_step == 1) {
    const double db = static_cast<double>(b[0]) - zb;
    for (int64_t i = 0; i < n; ++i) y[i] = one(static_cast<double>(a[i]) - za, db);
  } else if (b_step == 1) {
    const double da = static_cast<double>(a[0]) - za;
    for (int64_t i = 0; i < n; ++i) y[i] = one(da, static_cast<double>(b[i]) - zb);
  } else {
    const T v = one(static_cast<double>(a[0]) - za, static_cast<double>(b[0]) - zb);
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
