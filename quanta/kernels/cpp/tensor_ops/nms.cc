// NonMaxSuppression: contract in nms.h. Each box's extents and area are computed once per
// batch (the reference computes them per pair, with the same float32 operations, so the
// values are the same), then the greedy selection per class over a heap of the candidates.
#include "tensor_ops/nms.h"

#include <algorithm>
#include <numeric>

namespace quanta {
namespace tensor_ops {

namespace {

// Python's max / min of two numbers: the first operand unless the second is strictly
// greater / smaller.
inline float py_max(float a, float b) { return b > a ? b : a; }
inline float py_min(float a, float b) { return b < a ? b : a; }

struct Extent {
  float x_min, x_max, y_min, y_max, area;
};

Extent extent_of(const float* b, bool center_point_box) {
  Extent e{};
  if (center_point_box) {
    const float w_half = b[2] / 2.0f, h_half = b[3] / 2.0f;
    e.x_min = b[0] - w_half;
    e.x_max = b[0] + w_half;
    e.y_min = b[1] - h_half;
    e.y_max = b[1] + h_half;
  } else {  // max_min: (rhs, lhs) when lhs >= rhs
    e.x_min = b[1] >= b[3] ? b[3] : b[1];
    e.x_max = b[1] >= b[3] ? b[1] : b[3];
    e.y_min = b[0] >= b[2] ? b[2] : b[0];
    e.y_max = b[0] >= b[2] ? b[0] : b[2];
  }
  e.area = (e.x_max - e.x_min) * (e.y_max - e.y_min);
  return e;
}

// suppress_by_iou(candidate a, selected b): the reference's tests in its order.
bool suppresses(const Extent& a, const Extent& b, float iou_threshold) {
  const float ix_min = py_max(a.x_min, b.x_min), ix_max = py_min(a.x_max, b.x_max);
  if (ix_max <= ix_min) return false;
  const float iy_min = py_max(a.y_min, b.y_min), iy_max = py_min(a.y_max, b.y_max);
  if (iy_max <= iy_min) return false;
  const float inter = (ix_max - ix_min) * (iy_max - iy_min);
  if (inter <= 0.0f) return false;
  const float uni = a.area + b.area - inter;
  if (a.area <= 0.0f || b.area <= 0.0f || uni <= 0.0f) return false;
  return inter / uni > iou_threshold;
}

}  // namespace

void nms_f32(const float* boxes, const float* scores, int64_t batches, int64_t classes, int64_t n,
             int64_t max_per_class, float iou_threshold, bool has_score_threshold, float score_threshold,
             bool center_point_box, std::vector<int64_t>* selected) {
  if (max_per_class <= 0) return;
  std::vector<Extent> ext(static_cast<size_t>(n));
  std::vector<int64_t> order, kept;
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t i = 0; i < n; ++i) ext[i] = extent_of(boxes + (b * n + i) * 4, center_point_box);
    for (int64_t c = 0; c < classes; ++c) {
      const float* s = scores + (b * classes + c) * n;
      order.clear();
      for (int64_t i = 0; i < n; ++i) {
        if (!has_score_threshold || s[i] > score_threshold) order.push_back(i);
      }
      // a max-heap in the selection order: only the candidates the selection reaches are
      // ordered (it stops at max_per_class kept), as ONNX Runtime's priority queue
      const auto after = [s](int64_t i, int64_t j) { return s[i] < s[j] || (s[i] == s[j] && i > j); };
      std::make_heap(order.begin(), order.end(), after);
      kept.clear();
      for (auto end = order.end(); end != order.begin() && static_cast<int64_t>(kept.size()) < max_per_class; --end) {
        std::pop_heap(order.begin(), end, after);
        const int64_t i = *(end - 1);
        bool keep = true;
        for (const int64_t j : kept) {
          if (suppresses(ext[i], ext[j], iou_threshold)) {
            keep = false;
            break;
          }
        }
        if (!keep) continue;
        kept.push_back(i);
        selected->insert(selected->end(), {b, c, i});
      }
    }
  }
}

}  // namespace tensor_ops
}  // namespace quanta
