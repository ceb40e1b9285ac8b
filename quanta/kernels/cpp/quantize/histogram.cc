#include "quantize/histogram.h"

#include <cmath>
#include <limits>

namespace quanta {
namespace histogram {

namespace {

// floor(s) as an integer, for |s| < 2^62: truncation, minus one where it rounded up (no
// libm call: the portable build has no SSE4.1 roundss).
template <typename T>
inline int64_t floor_int(T s) {
  const auto t = static_cast<int64_t>(s);
  return t - (static_cast<T>(t) > s);
}

// One channel's values into its row. Multiply: 2^-k is a normal number of T, one multiply per value (exact: a power of two); otherwise
// (an all-zero channel's k, subnormal-sized ranges) ldexp, as the twin. A template
// argument, not a branch in the loop: the compiler would otherwise call ldexp for every
// value and select.
template <typename T, typename Count, bool Multiply>
bool count_row(const T* xc, int64_t n, int64_t es, int64_t kc, int64_t s, int64_t bins, Count* row, int64_t* zero) {
  const T big = std::numeric_limits<T>::max();
  const T scale = Multiply ? static_cast<T>(std::ldexp(1.0, static_cast<int>(-kc))) : T(0);
  const int e = static_cast<int>(kc > 100000 ? 100000 : (kc < -100000 ? -100000 : kc));
  const int64_t underflow_fix = kc > 0;
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    const T v = xc[i * es];
    zeros += v == T(0);
    if (!(std::abs(v) <= big)) continue;  // NaN, ±inf: rare, a predicted branch
    T scaled;
    if constexpr (Multiply) {
      scaled = v * scale;
    } else {
      scaled = std::ldexp(v, -e);
    }
    // arithmetic, not branches: a ReLU's zeros make g == 0 a coin flip per value
    int64_t g = floor_int(scaled);
    g -= underflow_fix & static_cast<int64_t>(g == 0) & static_cast<int64_t>(v < T(0));
    g -= s;
    if (static_cast<uint64_t>(g) >= static_cast<uint64_t>(bins)) return false;
    ++row[g];
  }
  *zero += zeros;
  return true;
}

}  // namespace

template <typename T, typename Count>
int64_t update(const T* x, int64_t channels, int64_t n, int64_t cs, int64_t es, const int64_t* k, const int64_t* start,
               int64_t bins, Count* counts, int64_t* zeros) {
  for (int64_t c = 0; c < channels; ++c) {
    const T* xc = x + c * cs;
    Count* row = counts + c * bins;
    const int64_t kc = k[c], s = start[c];
    const bool ok = kc >= -120 && kc <= 120 ? count_row<T, Count, true>(xc, n, es, kc, s, bins, row, zeros + c)
                                            : count_row<T, Count, false>(xc, n, es, kc, s, bins, row, zeros + c);
    if (!ok) return c;
  }
  return -1;
}

template int64_t update<float, int64_t>(const float*, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                                        const int64_t*, int64_t, int64_t*, int64_t*);
template int64_t update<double, int64_t>(const double*, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                                         const int64_t*, int64_t, int64_t*, int64_t*);
template int64_t update<float, int32_t>(const float*, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                                        const int64_t*, int64_t, int32_t*, int64_t*);
template int64_t update<double, int32_t>(const double*, int64_t, int64_t, int64_t, int64_t, const int64_t*,
                                         const int64_t*, int64_t, int32_t*, int64_t*);

}  // namespace histogram
}  // namespace quanta
