// The histogram observers' per-sample count update (quanta/calibrate/histogram.py,
// docs/calibration.md eq. (12): the power-of-two grid of a channel).
//
// For channel c with grid exponent k[c] and window start s[c], every finite value x of
// the channel lands in bin
//   g = floor(x · 2^-k[c]) − s[c]    (x · 2^-k exact in x's own type: a power-of-two
//                                      scaling; ldexp where 2^-k is not a normal float)
// except that a negative x whose scaled value underflows to −0 (k > 0) lands in
// floor = −1, not 0; counts[c][g] += 1. NaN and ±inf are not counted; zeros[c] counts the
// values equal to 0 (NaN is not zero). The same integers as the NumPy twin
// (HistogramObserver._update_numpy), which scales with the same float operation.
#pragma once

#include <cstdint>

namespace quanta {
namespace histogram {

// x: channel c's n values at x + c·cs + i·es (elements); counts: C rows of `bins` int64 or
// int32 (Count; the caller widens int32 rows before a sample could overflow them);
// returns the channel of the first value whose bin falls outside [0, bins), or −1 when
// every value landed (the caller's window must cover the sample: a bug guard; the counts
// of the values before it are then already added).
template <typename T, typename Count>
int64_t update(const T* x, int64_t channels, int64_t n, int64_t cs, int64_t es, const int64_t* k, const int64_t* start,
               int64_t bins, Count* counts, int64_t* zeros);

}  // namespace histogram
}  // namespace quanta
