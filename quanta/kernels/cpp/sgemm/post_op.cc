// The fused activations of the float GEMM family (sgemm.h PostOp): each is the chain of
// the float32 kernels of the nodes it replaces, run on one finished tile row, so its
// bytes are those of the separate steps (and of their NumPy twins).
#include "float_ops/float_ops.h"
#include "sgemm/sgemm.h"
#include "tensor_ops/tensor_ops.h"

namespace quanta {
namespace sgemm {

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
    case PostKind::kClipGateDiv: to.clip_gate_div(y, n, op.p); return;
    case PostKind::kLeakyRelu:
      up.alpha = op.p[0];
      to.unary_f32[static_cast<int>(tensor_ops::UnaryF32::kLeakyRelu)](y, y, n, up);
      // the Max node's kernel with its scalar operand (np.maximum: a NaN y stays NaN)
      if (op.p[1] != -__builtin_inff()) fo.binary[static_cast<int>(float_ops::BinaryOp::kMax)](y, 1, &op.p[1], 0, y, n);
      return;
    default: return;
  }
}

}  // namespace sgemm
}  // namespace quanta
