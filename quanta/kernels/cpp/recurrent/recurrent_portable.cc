// Portable elementwise steps of the recurrent kernels: recurrent_scalar.h lane by lane
// (std::fma for the MLAS Horner steps: one rounding, the FMA instruction's result).
#include <cstdint>

#include "float_ops/float_ops_scalar.h"
#include "recurrent/recurrent.h"
#include "recurrent/recurrent_scalar.h"

namespace quanta {
namespace recurrent {
namespace {

void quantize_u8(const float* x, int64_t n, float scale, float zp, uint8_t* q) {
  for (int64_t i = 0; i < n; ++i) q[i] = quantize_one(x[i], scale, zp);
}

void lstm_row(const float* p, const float* xg, const float* bias, const float* peephole, float clip, bool input_forget,
              int64_t H, float* c, float* h) {
  for (int64_t j = 0; j < H; ++j) lstm_lane(p, xg, bias, peephole, clip, input_forget, H, j, c, h);
}

void onnx_lstm_row(const float* p, const float* xg, const float* bias, const float* peephole, float clip,
                   bool input_forget, int64_t H, float* c, float* h) {
  for (int64_t j = 0; j < H; ++j) {
    lstm_lane<float_ops::sigmoid_one, float_ops::tanh_one>(p, xg, bias, peephole, clip, input_forget, H, j, c, h);
  }
}

void onnx_gru_zr(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr) {
  for (int64_t n = 0; n < count; ++n) gru_zr_lane<float_ops::sigmoid_one>(xg, hg, bias, clip, n, zr);
}

void onnx_gru_h(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                const float* bias_h, float clip, bool lbr, int64_t H, float* h) {
  for (int64_t j = 0; j < H; ++j) gru_h_lane<float_ops::tanh_one>(xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h);
}

void mlas_gru_zr(const float* xg, const float* hg, const float* bias, float clip, int64_t count, float* zr) {
  for (int64_t n = 0; n < count; ++n) gru_zr_lane<logistic_one>(xg, hg, bias, clip, n, zr);
}

void mlas_gru_h(const float* xg_h, const float* hr_h, const float* rb_h, const float* r, const float* z,
                const float* bias_h, float clip, bool lbr, int64_t H, float* h) {
  for (int64_t j = 0; j < H; ++j) gru_h_lane<tanh_one>(xg_h, hr_h, rb_h, r, z, bias_h, clip, lbr, j, h);
}

void ort_gru_reset(const float* zr_r, const float* br, float clip, const float* src, int64_t H, float* out) {
  for (int64_t j = 0; j < H; ++j) ort_gru_reset_lane(zr_r, br, clip, src, j, out);
}

void ort_gru_update(const float* zr_z, const float* bz, const float* a0, const float* a1, const float* bh, float clip,
                    int64_t H, float* h) {
  for (int64_t j = 0; j < H; ++j) ort_gru_update_lane(zr_z, bz, a0, a1, bh, clip, j, h);
}

}  // namespace

extern const Kernels kKernelsPortable = {min_max_scalar, quantize_u8,   lstm_row,       onnx_lstm_row, onnx_gru_zr,
                                         onnx_gru_h,     ort_gru_reset, ort_gru_update, mlas_gru_zr,   mlas_gru_h};

}  // namespace recurrent
}  // namespace quanta
