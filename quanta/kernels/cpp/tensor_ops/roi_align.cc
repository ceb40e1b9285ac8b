// RoiAlign: contract in roi_align.h. Per roi the samples' pixels and weights are computed
// once (they do not depend on the channel), then every channel plane accumulates them.
#include "tensor_ops/roi_align.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace tensor_ops {

namespace {

struct AxisSamples {  // per (bin, sample): (RA2), (RA3) along one axis
  std::vector<int64_t> low, high;
  std::vector<float> w_low, w_high;
  std::vector<char> inside;
};

void axis_samples(float start, float size, int64_t pooled, int64_t grid, int64_t extent, AxisSamples* a) {
  const float bin = size / static_cast<float>(pooled);
  const auto n = static_cast<size_t>(pooled * grid);
  a->low.assign(n, 0);
  a->high.assign(n, 0);
  a->w_low.assign(n, 0.0f);
  a->w_high.assign(n, 0.0f);
  a->inside.assign(n, 0);
  for (int64_t p = 0; p < pooled; ++p) {
    for (int64_t i = 0; i < grid; ++i) {
      const size_t k = static_cast<size_t>(p * grid + i);
      float pos =
          (start + static_cast<float>(p) * bin) + ((static_cast<float>(i) + 0.5f) * bin) / static_cast<float>(grid);
      if (!(pos >= -1.0f && pos <= static_cast<float>(extent))) continue;  // outside (NaN too)
      a->inside[k] = 1;
      if (pos <= 0.0f) pos = 0.0f;
      int64_t lo = static_cast<int64_t>(pos);
      int64_t hi = lo + 1;
      if (lo >= extent - 1) {
        lo = hi = extent - 1;
        pos = static_cast<float>(lo);
      }
      const float frac = pos - static_cast<float>(lo);
      a->low[k] = lo;
      a->high[k] = hi;
      a->w_low[k] = 1.0f - frac;
      a->w_high[k] = frac;
    }
  }
}

int64_t grid_of(int64_t sampling_ratio, float bins_per_pixel) {
  if (sampling_ratio > 0) return sampling_ratio;
  return std::isfinite(bins_per_pixel) ? static_cast<int64_t>(std::ceil(bins_per_pixel)) : 0;
}

inline float cmax(float a, float b) { return a < b ? b : a; }  // std::max's order

}  // namespace

void roi_align_f32(const float* x, int64_t n, int64_t c, int64_t h, int64_t w, const float* rois, const int64_t* batch,
                   int64_t r, int64_t ph, int64_t pw, int64_t sampling_ratio, float spatial_scale, bool half_pixel,
                   bool max_mode, float* y, int num_threads) {
  (void)n;
  const float o = half_pixel ? 0.5f : 0.0f;
  qgemm::parallel_ranges(num_threads, r, 1, [&](int64_t r0, int64_t r1) {
    AxisSamples ay, ax;
    std::vector<int64_t> off;
    std::vector<float> wt;
    for (int64_t q = r0; q < r1; ++q) {
      const float* roi = rois + q * 4;
      float* out = y + q * c * ph * pw;
      std::fill(out, out + c * ph * pw, 0.0f);
      const float start_w = roi[0] * spatial_scale - o, start_h = roi[1] * spatial_scale - o;  // (RA1)
      float size_w = (roi[2] * spatial_scale - o) - start_w, size_h = (roi[3] * spatial_scale - o) - start_h;
      if (!half_pixel) {
        size_w = std::max(size_w, 1.0f);
        size_h = std::max(size_h, 1.0f);
      }
      const int64_t gh = grid_of(sampling_ratio, size_h / static_cast<float>(ph));
      const int64_t gw = grid_of(sampling_ratio, size_w / static_cast<float>(pw));
      if (gh <= 0 || gw <= 0) continue;
      const float count = static_cast<float>(std::max<int64_t>(gh * gw, 1));
      axis_samples(start_h, size_h, ph, gh, h, &ay);
      axis_samples(start_w, size_w, pw, gw, w, &ax);
      // every sample's four pixel offsets and weights, in (bin y, bin x, i_y, i_x) order:
      // the same for every channel
      const int64_t samples = ph * pw * gh * gw;
      off.resize(static_cast<size_t>(4 * samples));
      wt.resize(static_cast<size_t>(4 * samples));
      int64_t k = 0;
      for (int64_t by = 0; by < ph; ++by) {
        for (int64_t bx = 0; bx < pw; ++bx) {
          for (int64_t iy = 0; iy < gh; ++iy) {
            const size_t ky = static_cast<size_t>(by * gh + iy);
            for (int64_t ix = 0; ix < gw; ++ix, k += 4) {
              const size_t kx = static_cast<size_t>(bx * gw + ix);
              const bool in = ay.inside[ky] && ax.inside[kx];  // (RA3): outside, weights 0 at pixel 0
              const float hy = in ? ay.w_low[ky] : 0.0f, ly = in ? ay.w_high[ky] : 0.0f;
              const float hx = in ? ax.w_low[kx] : 0.0f, lx = in ? ax.w_high[kx] : 0.0f;
              const int64_t y0 = in ? ay.low[ky] : 0, y1 = in ? ay.high[ky] : 0;
              const int64_t x0 = in ? ax.low[kx] : 0, x1 = in ? ax.high[kx] : 0;
              off[k] = y0 * w + x0;
              off[k + 1] = y0 * w + x1;
              off[k + 2] = y1 * w + x0;
              off[k + 3] = y1 * w + x1;
              wt[k] = hy * hx;
              wt[k + 1] = hy * lx;
              wt[k + 2] = ly * hx;
              wt[k + 3] = ly * lx;
            }
          }
        }
      }
      const int64_t per_bin = gh * gw;
      for (int64_t ch = 0; ch < c; ++ch) {
        const float* plane = x + (batch[q] * c + ch) * h * w;
        float* o_c = out + ch * ph * pw;
        const int64_t* po = off.data();
        const float* pwt = wt.data();
        for (int64_t bin = 0; bin < ph * pw; ++bin) {
          float acc = 0.0f;
          for (int64_t s = 0; s < per_bin; ++s, po += 4, pwt += 4) {
            const float t1 = pwt[0] * plane[po[0]], t2 = pwt[1] * plane[po[1]];
            const float t3 = pwt[2] * plane[po[2]], t4 = pwt[3] * plane[po[3]];
            if (!max_mode) {  // (RA4)
              acc = acc + (((t1 + t2) + t3) + t4);
            } else {
              const float m = cmax(cmax(cmax(t1, t2), t3), t4);
              acc = s == 0 ? m : cmax(acc, m);
            }
          }
          o_c[bin] = max_mode ? acc : acc / count;
        }
      }
    }
  });
}

}  // namespace tensor_ops
}  // namespace quanta
