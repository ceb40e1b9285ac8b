// Drivers of ort_spatial.h: ISA selection, thread chunks, the resize's row slots, the count
// table of the average.
#include "ort_spatial/ort_spatial.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "qgemm/thread_pool.h"

namespace quanta {
namespace ort_spatial {
namespace {

// No AVX-512 variant (docs/kernels.md): an AVX-512 CPU runs the AVX2 kernels.
const Kernels& kernels_for(Isa isa) { return isa == Isa::kPortable ? kKernelsPortable : kKernelsAvx2; }

// Runs f(begin, end) over items [0, n), about `work_per_item` bytes each, in chunks.
template <typename F>
void for_items(int num_threads, int64_t n, int64_t work_per_item, F&& f) {
  constexpr int64_t kGrainBytes = int64_t{1} << 15;
  qgemm::parallel_ranges(num_threads, n, kGrainBytes / std::max<int64_t>(1, work_per_item), f);
}

}  // namespace

void ort_resize_linear(const float* x, float* y, int64_t planes, int64_t h, int64_t w, const ResizeTaps& t,
                       int num_threads, Isa isa) {
  const Kernels& k = kernels_for(isa);
  const int64_t rows = planes * t.n_h, n_w = t.n_w;
  for_items(num_threads, rows, 16 * n_w, [&](int64_t begin, int64_t end) {
    // two slots of gathered input rows (c1, c2 each), keyed by plane · h + row
    std::vector<float> buf(static_cast<size_t>(4 * n_w));
    float* c1[2] = {buf.data(), buf.data() + 2 * n_w};
    float* c2[2] = {buf.data() + n_w, buf.data() + 3 * n_w};
    int64_t held[2] = {-1, -1};
    // the slot holding input row `key`, gathered into the slot that does not hold `keep`
    auto fetch = [&](int64_t key, int64_t keep) {
      if (held[0] == key) return 0;
      if (held[1] == key) return 1;
      const int s = held[0] == keep ? 1 : 0;
      k.resize_gather(x + key * w, t, c1[s], c2[s]);
      held[s] = key;
      return s;
    };
    for (int64_t r = begin; r < end; ++r) {
      const int64_t p = r / t.n_h, i = r % t.n_h;
      const int64_t key1 = p * h + t.y1[i], key2 = p * h + t.y2[i];
      const int s1 = fetch(key1, key2);
      const int s2 = fetch(key2, key1);
      k.resize_combine(c1[s1], c2[s1], c1[s2], c2[s2], t.dy1[i], t.dy2[i], t, y + r * n_w);
    }
  });
}

void mlas_average_pool(const float* x, float* y, const PoolGeometry& g, bool count_include_pad, bool vector,
                       int num_threads, Isa isa) {
  constexpr int64_t kBlock = 8;  // the kernels' lanes: a thread chunk holds whole blocks
  const Kernels& k = kernels_for(isa);
  // (AP-M4)'s count of each output position.
  const int64_t out_plane = g.out[0] * g.out[1] * g.out[2];
  std::vector<float> count(static_cast<size_t>(out_plane));
  const float full = static_cast<float>(g.kernel[0] * g.kernel[1] * g.kernel[2]);
  int64_t o = 0;
  for (int64_t od = 0; od < g.out[0]; ++od) {
    for (int64_t oh = 0; oh < g.out[1]; ++oh) {
      for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
        if (count_include_pad) {
          count[static_cast<size_t>(o)] = full;
          continue;
        }
        const int64_t idx[3] = {od, oh, ow};
        float c = 1.0f;
        for (int a = 0; a < 3; ++a) {
          const int64_t start = idx[a] * g.strides[a] - g.pads[a];
          const int64_t inside = std::min(start + g.kernel[a], g.size[a]) - std::max<int64_t>(start, 0);
          c = c * static_cast<float>(inside);
        }
        count[static_cast<size_t>(o)] = c;
      }
    }
  }
  const int64_t taps = g.kernel[0] * g.kernel[1] * g.kernel[2];
  const int64_t blocks = (g.planes + kBlock - 1) / kBlock;
  const float* cp = count.data();
  for_items(num_threads, blocks, 4 * kBlock * out_plane * taps, [&](int64_t begin, int64_t end) {
    const auto planes = vector ? k.average_planes_vector : k.average_planes;
    planes(x, y, g, cp, begin * kBlock, std::min(end * kBlock, g.planes));
  });
}

}  // namespace ort_spatial
}  // namespace quanta
