// Portable NCHW16c micro-kernels (contract: nchwc.h): a 16-channel block is an array of 16
// floats, each lane one std::fma chain; one pixel × one output block per tile.
#include <cmath>

#include "nchwc/nchwc.h"

namespace quanta {
namespace nchwc {
namespace {

struct O {
  static constexpr int kEmbedMaxNb = 0;
  static constexpr bool kDwRowReuse = false;
  struct V {
    float v[16];
  };
  static V zero() { return V{}; }
  static V set1(float s) {
    V r;
    for (float& e : r.v) e = s;
    return r;
  }
  static V load(const float* p) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = p[i];
    return r;
  }
  static void store(float* p, const V& v) {
    for (int i = 0; i < 16; ++i) p[i] = v.v[i];
  }
  static V add(const V& x, const V& y) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = x.v[i] + y.v[i];
    return r;
  }
  static V div(const V& x, const V& y) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = x.v[i] / y.v[i];
    return r;
  }
  static V max_nan(const V& m, const V& v) {
    V r;
    for (int i = 0; i < 16; ++i)
      r.v[i] = v.v[i] != v.v[i] || m.v[i] != m.v[i] ? v.v[i] + m.v[i] : (v.v[i] > m.v[i] ? v.v[i] : m.v[i]);
    return r;
  }
  // As vmaxps (lo, v): v unless v < lo, so a NaN v stays NaN.
  static V max(const V& lo, const V& v) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = v.v[i] < lo.v[i] ? lo.v[i] : v.v[i];
    return r;
  }
  static V min(const V& hi, const V& v) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = v.v[i] > hi.v[i] ? hi.v[i] : v.v[i];
    return r;
  }
  static V fma(const V& x, const V& y, const V& c) {
    V r;
    for (int i = 0; i < 16; ++i) r.v[i] = std::fma(x.v[i], y.v[i], c.v[i]);
    return r;
  }
  static V fma_bcast(const V& w, const float* p, const V& c) {
    V r;
    const float s = *p;
    for (int i = 0; i < 16; ++i) r.v[i] = std::fma(w.v[i], s, c.v[i]);
    return r;
  }
};

#include "nchwc/tile.h"

}  // namespace

extern const Kernels kKernelsPortable = {
    "portable",
    {1, 0, 0, 0},
    1,
    {QUANTA_NCHWC_ROW(O, 1, 1), QUANTA_NCHWC_ROW(O, 2, 0), QUANTA_NCHWC_ROW(O, 3, 0), QUANTA_NCHWC_ROW(O, 4, 0)},
    QUANTA_NCHWC_PAIRS(O),
    {nullptr, nullptr, nullptr, nullptr},
    1,
    QUANTA_NCHWC_DW_ROW(O, 1),
    nchwc_max_pool_plane<O>,
    nchwc_gap_block<O>,
};

}  // namespace nchwc
}  // namespace quanta
