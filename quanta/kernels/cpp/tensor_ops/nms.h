// NonMaxSuppression (ONNX), float32 boxes and scores: the algorithm of ONNX's reference
// (onnx/reference/ops/op_non_max_suppression.py, itself ONNX Runtime's), in the same float32
// operations, so the selected indices are the reference's:
//
//   per batch and class: the boxes whose score is > score_threshold (every box when there
//   is no threshold), taken in order of descending score, equal scores by ascending box
//   index; a box is selected unless its IoU with a box already selected for the class is
//   > iou_threshold; at most max_per_class boxes per class.
//
// IoU of boxes a, b (center_point_box 0: [y1, x1, y2, x2] in any corner order, min / max
// per axis; 1: [xc, yc, w, h], min = c - w / 2, max = c + w / 2): no suppression when the
// intersection is empty (max <= min on an axis), its area <= 0, either area <= 0 or the
// union <= 0; else iou = inter / (area_a + area_b - inter). max(a, b) and min(a, b) are
// Python's (the first operand on a tie). Scores that are NaN with no threshold have no
// order in the reference: the binding leaves those calls to it.
#pragma once

#include <cstdint>
#include <vector>

namespace quanta {
namespace tensor_ops {

// boxes [batches, n, 4], scores [batches, classes, n]; appends (batch, class, box) triples
// to `selected` in the reference's order.
void nms_f32(const float* boxes, const float* scores, int64_t batches, int64_t classes, int64_t n,
             int64_t max_per_class, float iou_threshold, bool has_score_threshold, float score_threshold,
             bool center_point_box, std::vector<int64_t>* selected);

}  // namespace tensor_ops
}  // namespace quanta
