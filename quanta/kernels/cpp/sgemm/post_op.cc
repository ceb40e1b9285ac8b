// The fused activations of the float GEMM family (sgemm.h PostOp): each is the chain of
// the float32 kernels of the nodes it replaces, run on one finished tile row, so its
// bytes are those of the separate steps (and of their NumPy twins).
#include <vector>

#include "float_ops/float_ops.h"
#include "sgemm/sgemm.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace sgemm {

namespace {

float* post_scratch(int64_t floats) {
  thread_local std::vector<float> buf;
  if (static_cast<int64_t>(buf.size()) < floats) buf.resize(static_cast<size_t>(floats));
  return buf.data();
}

}  // namespace

void apply_post(const PostOp& op, float* y, int64_t n) {
  if (op.kind == PostKind::kNone || n <= 0) return;
  const float_ops::Kernels& fo = float_ops::kernels_for(op.isa);
  const tensor_ops::Kernels& to = tensor_ops::kernels_for(op.isa);
  tensor_ops::UnaryParams up;
  switch (op.kind) {
    case PostKind::kSilu:
      // y · Sigmoid(y) in one pass: the Sigmoid and Mul steps' operations on each element
      fo.unary[static_cast<int>(float_ops::UnaryOp::kSilu)](y, y, n);
      return;
    case PostKind::kHardSwish: to.unary_f32[static_cast<int>(tensor_ops::UnaryF32::kHardSwish)](y, y, n, up); return;
    case PostKind::kHardSigmoid:
      up.alpha = op.p[0];
      up.beta = op.p[1];
      to.unary_f32[static_cast<int>(tensor_ops::UnaryF32::kHardSigmoid)](y, y, n, up);
      return;
    case PostKind::kClipGateDiv: {
      float* t = post_scratch(n);
      fo.binary[static_cast<int>(float_ops::BinaryOp::kAdd)](y, 1, &op.p[0], 0, t, n);
      up.lo = op.p[1];
      up.hi = op.p[2];
      up.has_lo = up.has_hi = true;
      to.unary_f32[static_cast<int>(tensor_ops::UnaryF32::kClip)](t, t, n, up);
      fo.binary[static_cast<int>(float_ops::BinaryOp::kMul)](y, 1, t, 1, t, n);
      fo.binary[static_cast<int>(float_ops::BinaryOp::kDiv)](t, 1, &op.p[3], 0, y, n);
      return;
    }
    default: return;
  }
}

}  // namespace sgemm
}  // namespace quanta
