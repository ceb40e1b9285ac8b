// Drivers of the pooling kernels (contract: pool.h): thread chunks over planes, ISA
// selection, the requantization of the global average.
#include "pool/pool.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "pool/max_pool_2x2_avx2.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace pool {
namespace {

const Kernels& kernels_for(Isa isa) {
  switch (isa) {
    case Isa::kAvx512Vnni: return kKernelsAvx512Vnni;
    case Isa::kAvx2: return kKernelsAvx2;
    default: return kKernelsPortable;
  }
}

// Runs f(begin, end) over items [0, n), about `work_per_item` bytes each, in chunks.
template <typename F>
void for_items(int num_threads, int64_t n, int64_t work_per_item, F&& f) {
  constexpr int64_t kGrainBytes = int64_t{1} << 15;
  qgemm::parallel_ranges(num_threads, n, kGrainBytes / std::max<int64_t>(1, work_per_item), f);
}

// requant.py::requantize, eq. (6): clamp in float32 before rounding, NaN -> qmin − zy.
template <typename T>
inline T requantize_one(uint32_t acc_bits, float m, int32_t zy) {
  const float lo = static_cast<float>(static_cast<int32_t>(std::numeric_limits<T>::min()) - zy);
  const float hi = static_cast<float>(static_cast<int32_t>(std::numeric_limits<T>::max()) - zy);
  float v = static_cast<float>(static_cast<int32_t>(acc_bits)) * m;
  if (v != v) v = lo;
  v = v < lo ? lo : v;
  v = v > hi ? hi : v;
  return static_cast<T>(static_cast<int32_t>(std::nearbyint(v)) + zy);
}

}  // namespace

template <typename T>
void qlinear_global_average_pool(const T* x, T* y, int64_t n, int64_t c, int64_t hw, bool channels_last, float m,
                                 int32_t zx, int32_t zy, int num_threads, Isa isa) {
  const Kernels& k = kernels_for(isa);
  // acc = Σ x − zx·HW modulo 2^32: the twin's int64 value cast to int32.
  const uint32_t zx_hw = static_cast<uint32_t>(zx) * static_cast<uint32_t>(hw);
  if (!channels_last) {
    uint32_t (*sum)(const T*, int64_t);
    if constexpr (std::is_same_v<T, uint8_t>) {
      sum = k.sum_u8;
    } else {
      sum = k.sum_s8;
    }
    for_items(num_threads, n * c, hw, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) y[p] = requantize_one<T>(sum(x + p * hw, hw) - zx_hw, m, zy);
    });
    return;
  }
  void (*sum_channels)(const T*, int64_t, int64_t, int64_t, uint32_t*);
  if constexpr (std::is_same_v<T, uint8_t>) {
    sum_channels = k.sum_channels_u8;
  } else {
    sum_channels = k.sum_channels_s8;
  }
  constexpr int64_t kChannelBlock = 512;  // int32 accumulators on the stack
  const int64_t blocks = (c + kChannelBlock - 1) / kChannelBlock;
  for_items(num_threads, n * blocks, hw * std::min(c, kChannelBlock), [&](int64_t begin, int64_t end) {
    uint32_t acc[kChannelBlock];
    for (int64_t item = begin; item < end; ++item) {
      const int64_t img = item / blocks;
      const int64_t c0 = (item % blocks) * kChannelBlock;
      const int64_t cw = std::min(kChannelBlock, c - c0);
      std::fill(acc, acc + cw, 0u);
      sum_channels(x + img * hw * c + c0, hw, c, cw, acc);  // hw rows of cw channels, c apart
      for (int64_t j = 0; j < cw; ++j) y[img * c + c0 + j] = requantize_one<T>(acc[j] - zx_hw, m, zy);
    }
  });
}

template <typename T>
void max_pool_2d(const T* x, T* y, const Geometry2d& g, int num_threads, Isa isa) {
  void (*plane)(const T*, T*, const Geometry2d&);
  if constexpr (std::is_same_v<T, uint8_t>) {
    plane = kernels_for(isa).max_plane_u8;
  } else {
    plane = kernels_for(isa).max_plane_s8;
  }
  const int64_t in = g.h * g.w, out = g.out_h * g.out_w;
  for_items(num_threads, g.planes, out * g.k_h * g.k_w, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) plane(x + p * in, y + p * out, g);
  });
}

template <typename T>
void qlinear_average_pool_2d(const T* x, T* y, const Geometry2d& g, const AverageParams& prm, int num_threads,
                             Isa isa) {
  void (*plane)(const T*, T*, const Geometry2d&, const AverageParams&);
  if constexpr (std::is_same_v<T, uint8_t>) {
    plane = kernels_for(isa).average_plane_u8;
  } else {
    plane = kernels_for(isa).average_plane_s8;
  }
  const int64_t in = g.h * g.w, out = g.out_h * g.out_w;
  for_items(num_threads, g.planes, 4 * out * g.k_h * g.k_w, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) plane(x + p * in, y + p * out, g, prm);
  });
}

template <typename T>
void max_pool_2d_nhwc(const T* x, T* y, const Geometry2d& g, int64_t channels, int num_threads, Isa isa) {
  void (*row)(const T*, T*, const Geometry2d&, int64_t, int64_t);
  if constexpr (std::is_same_v<T, uint8_t>) {
    row = kernels_for(isa).max_row_nhwc_u8;
  } else {
    row = kernels_for(isa).max_row_nhwc_s8;
  }
  const int64_t C = channels;
  for_items(num_threads, g.planes * g.out_h, g.out_w * g.k_h * g.k_w * C, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const int64_t n = r / g.out_h, oy = r % g.out_h;
      row(x + n * g.h * g.w * C, y + r * g.out_w * C, g, C, oy);
    }
  });
}

void max_pool_2d_f32(const float* x, float* y, const Geometry2d& g, int num_threads, Isa isa) {
  const int64_t in = g.h * g.w, out = g.out_h * g.out_w;
  const auto plane = kernels_for(isa).max_plane_f32;
  // Windows that do not overlap (VGG's 2x2 stride 2, a [1, 3] stride [1, 3] time pool)
  // read every input once: the bordered copy would double their memory traffic; inside
  // the plane they take the direct form (no copy), else the generic loops.
  const bool overlap = (g.s_h == 1 && g.s_w == 1) || (g.k_h > g.s_h && g.k_w > g.s_w);
  if (isa == Isa::kAvx2 && max_pool_2x2s2(g)) {
    for_items(num_threads, g.planes, 4 * (in + out), [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) max_plane_2x2s2_avx2(x + p * in, y + p * out, g);
    });
    return;
  }
  if (plane && (overlap || direct_max_pool(g)) && g.d_h == 1 && g.d_w == 1 && g.pad_t >= 0 && g.pad_l >= 0) {
    const int64_t wp = (g.out_w - 1) * g.s_w + g.k_w, padded = ((g.out_h - 1) * g.s_h + g.k_h) * wp;
    // every form's scratch (pool.h)
    const int64_t need = std::max(2 * padded + 2 * wp + 2 * g.s_w, g.out_w * g.s_w + 16 * g.s_w);
    for_items(num_threads, g.planes, 4 * (padded * g.k_w + out * g.k_h), [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> scratch;
      if (static_cast<int64_t>(scratch.size()) < need) scratch.resize(static_cast<size_t>(need));
      for (int64_t p = begin; p < end; ++p) plane(x + p * in, y + p * out, g, scratch.data());
    });
    return;
  }
  // Per kernel column kx, the output columns whose tap ox·s_w − pad_l + kx·d_w lies in [0, w).
  std::vector<int64_t> lo(static_cast<size_t>(g.k_w)), hi(static_cast<size_t>(g.k_w));
  for (int64_t kx = 0; kx < g.k_w; ++kx) {
    const int64_t off = kx * g.d_w - g.pad_l;  // input column of output column ox: ox·s_w + off
    int64_t a = off >= 0 ? 0 : (-off + g.s_w - 1) / g.s_w;
    int64_t b = g.w - 1 - off < 0 ? 0 : (g.w - 1 - off) / g.s_w + 1;
    a = std::min(a, g.out_w);
    lo[static_cast<size_t>(kx)] = a;
    hi[static_cast<size_t>(kx)] = std::max(a, std::min(b, g.out_w));
  }
  // v > m or v is NaN: take v; a NaN m stays (both comparisons are false).
  auto row_max = [&](const float* plane_row, float* __restrict row) {
    for (int64_t kx = 0; kx < g.k_w; ++kx) {
      const float* __restrict src = plane_row + kx * g.d_w - g.pad_l;  // src[ox·s_w]
      const int64_t a = lo[static_cast<size_t>(kx)], b = hi[static_cast<size_t>(kx)];
      if (g.s_w == 1) {
        for (int64_t ox = a; ox < b; ++ox) {
          const float v = src[ox], m = row[ox];
          row[ox] = (v > m || v != v) ? v : m;
        }
      } else {
        for (int64_t ox = a; ox < b; ++ox) {
          const float v = src[ox * g.s_w], m = row[ox];
          row[ox] = (v > m || v != v) ? v : m;
        }
      }
    }
  };
  const float ninf = -std::numeric_limits<float>::infinity();
  if (g.k_h > g.s_h && g.k_w > 1) {
    // Separable: the row maxima of every input row once (over the kx taps), then each
    // output row is the maximum of its k_h row maxima: k_h + k_w passes per output row
    // instead of k_h·k_w (an SPP 13x13 pool: 26 instead of 169). The same value is
    // selected (max only selects, and a NaN wins in either order).
    for_items(num_threads, g.planes, 4 * out * (g.k_h + g.k_w), [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> rows;
      if (static_cast<int64_t>(rows.size()) < g.h * g.out_w) rows.resize(static_cast<size_t>(g.h * g.out_w));
      float* __restrict hr = rows.data();
      for (int64_t p = begin; p < end; ++p) {
        const float* plane = x + p * in;
        std::fill(hr, hr + g.h * g.out_w, ninf);
        for (int64_t iy = 0; iy < g.h; ++iy) row_max(plane + iy * g.w, hr + iy * g.out_w);
        for (int64_t oy = 0; oy < g.out_h; ++oy) {
          float* __restrict row = y + p * out + oy * g.out_w;
          std::fill(row, row + g.out_w, ninf);
          for (int64_t ky = 0; ky < g.k_h; ++ky) {
            const int64_t iy = oy * g.s_h - g.pad_t + ky * g.d_h;
            if (iy < 0 || iy >= g.h) continue;
            const float* __restrict src = hr + iy * g.out_w;
            for (int64_t ox = 0; ox < g.out_w; ++ox) {
              const float v = src[ox], m = row[ox];
              row[ox] = (v > m || v != v) ? v : m;
            }
          }
        }
      }
    });
    return;
  }
  for_items(num_threads, g.planes, 4 * out * g.k_h * g.k_w, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const float* plane = x + p * in;
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        float* __restrict row = y + p * out + oy * g.out_w;
        std::fill(row, row + g.out_w, ninf);
        for (int64_t ky = 0; ky < g.k_h; ++ky) {
          const int64_t iy = oy * g.s_h - g.pad_t + ky * g.d_h;
          if (iy < 0 || iy >= g.h) continue;
          row_max(plane + iy * g.w, row);
        }
      }
    }
  });
}

void average_pool_2d_f32(const float* x, float* y, const Geometry2d& g, int64_t pad_b, int64_t pad_r,
                         bool count_include_pad, int num_threads) {
  constexpr int kLanes = 16;
  const int64_t in = g.h * g.w, out = g.out_h * g.out_w;
  // Per kernel column kx, the output columns whose tap lies in [0, w) (as max_pool_2d_f32).
  std::vector<int64_t> lo(static_cast<size_t>(g.k_w)), hi(static_cast<size_t>(g.k_w));
  for (int64_t kx = 0; kx < g.k_w; ++kx) {
    const int64_t off = kx * g.d_w - g.pad_l;
    int64_t a = off >= 0 ? 0 : (-off + g.s_w - 1) / g.s_w;
    int64_t b = g.w - 1 - off < 0 ? 0 : (g.w - 1 - off) / g.s_w + 1;
    a = std::min(a, g.out_w);
    lo[static_cast<size_t>(kx)] = a;
    hi[static_cast<size_t>(kx)] = std::max(a, std::min(b, g.out_w));
  }
  // (AP3)'s count per axis: the taps inside [first, last).
  auto taps = [](int64_t start, int64_t k, int64_t d, int64_t first, int64_t last) {
    int64_t n = 0;
    for (int64_t i = 0; i < k; ++i) n += (start + i * d >= first && start + i * d < last) ? 1 : 0;
    return n;
  };
  std::vector<float> count_w(static_cast<size_t>(g.out_w));
  for (int64_t ox = 0; ox < g.out_w; ++ox) {
    const int64_t first = count_include_pad ? -g.pad_l : 0, last = count_include_pad ? g.w + pad_r : g.w;
    count_w[static_cast<size_t>(ox)] = static_cast<float>(taps(ox * g.s_w - g.pad_l, g.k_w, g.d_w, first, last));
  }
  const int64_t k_total = g.k_h * g.k_w;
  const int used = static_cast<int>(std::min<int64_t>(k_total, kLanes));
  for_items(num_threads, g.planes, 4 * out * (k_total + kLanes), [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> lanes;
    const size_t row = static_cast<size_t>(g.out_w);
    if (lanes.size() < kLanes * row) lanes.resize(kLanes * row);
    for (int64_t p = begin; p < end; ++p) {
      const float* plane = x + p * in;
      for (int64_t oy = 0; oy < g.out_h; ++oy) {
        std::fill(lanes.begin(), lanes.begin() + static_cast<int64_t>(kLanes * row), 0.0f);  // (R1): +0
        int64_t k = 0;
        for (int64_t ky = 0; ky < g.k_h; ++ky) {
          const int64_t iy = oy * g.s_h - g.pad_t + ky * g.d_h;
          if (iy < 0 || iy >= g.h) {
            k += g.k_w;  // a pad row: +0 into every lane, no change
            continue;
          }
          for (int64_t kx = 0; kx < g.k_w; ++kx, ++k) {
            float* __restrict acc = lanes.data() + static_cast<size_t>(k % kLanes) * row;
            const float* __restrict src = plane + iy * g.w + kx * g.d_w - g.pad_l;  // src[ox·s_w]
            const int64_t a = lo[static_cast<size_t>(kx)], b = hi[static_cast<size_t>(kx)];
            if (g.s_w == 1) {
              for (int64_t ox = a; ox < b; ++ox) acc[ox] = acc[ox] + src[ox];
            } else {
              for (int64_t ox = a; ox < b; ++ox) acc[ox] = acc[ox] + src[ox * g.s_w];
            }
          }
        }
        // (R2): lanes at or past `used` hold +0 and add nothing, so only the others' pairs run
        for (int h = kLanes / 2; h >= 1; h /= 2) {
          for (int j = 0; j < h && j + h < used; ++j) {
            float* __restrict aj = lanes.data() + static_cast<size_t>(j) * row;
            const float* __restrict ah = lanes.data() + static_cast<size_t>(j + h) * row;
            for (size_t ox = 0; ox < row; ++ox) aj[ox] = aj[ox] + ah[ox];
          }
        }
        const int64_t first = count_include_pad ? -g.pad_t : 0, last = count_include_pad ? g.h + pad_b : g.h;
        const float count_h = static_cast<float>(taps(oy * g.s_h - g.pad_t, g.k_h, g.d_h, first, last));
        float* __restrict yr = y + p * out + oy * g.out_w;
        const float* __restrict s = lanes.data();
        for (size_t ox = 0; ox < row; ++ox) yr[ox] = s[ox] / (count_h * count_w[ox]);  // (AP3), exact product
      }
    }
  });
}

#define QUANTA_POOL_INSTANTIATE(T)                                                                                     \
  template void qlinear_global_average_pool<T>(const T*, T*, int64_t, int64_t, int64_t, bool, float, int32_t, int32_t, \
                                               int, Isa);                                                              \
  template void max_pool_2d<T>(const T*, T*, const Geometry2d&, int, Isa);                                             \
  template void qlinear_average_pool_2d<T>(const T*, T*, const Geometry2d&, const AverageParams&, int, Isa);           \
  template void max_pool_2d_nhwc<T>(const T*, T*, const Geometry2d&, int64_t, int, Isa);
QUANTA_POOL_INSTANTIATE(uint8_t)
QUANTA_POOL_INSTANTIATE(int8_t)
#undef QUANTA_POOL_INSTANTIATE

}  // namespace pool
}  // namespace quanta
