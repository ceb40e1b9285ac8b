// Bindings for the tensor_ops kernels (tensor_ops/tensor_ops.h). Every entry checks
// dtypes, contiguity, shapes and `out` here and raises ValueError naming the argument.
//
//   unary_f32_ex(op, x, num_threads=1, out=None, lo=None, hi=None, alpha=0, beta=0) -> y
//     op: clip, sqrt, neg, abs, reciprocal, square, cube, hard_sigmoid, hard_swish, leaky_relu (float32)
//   clip_int(x, lo, hi, num_threads=1, out=None) -> y        int8 / uint8 / int32 / int64
//   cast(x, dtype, num_threads=1, out=None) -> y             float32/64, (u)int8, int32/64, bool
//   broadcast_op(op, a, b, num_threads=1, out=None) -> c     add, sub, mul, div, max, min (int32, int64,
//     float64); mod, fmod (int32, int64);
//     equal, less, less_equal, greater, greater_equal (any, bool out); and, or, xor (bool)
//   reduce_rows_f32(op, x, num_threads=1, out=None) -> y     x [R, D]; sum, sum_square, max, min, prod
//   reduce_middle_f32(op, x, num_threads=1, out=None) -> y   x [outer, D, inner]: the same
//     operations over D, y [outer, inner]
//   ort_reduce_rows_f32(x, mean, num_threads=1, out=None) -> y   x [R, n]: ONNX Runtime's row sum / mean
//     in Eigen's order (tensor_ops/ort_reduce.h)
//   mlas_global_average_rows_f32(x, num_threads=1, out=None) -> y   x [R, n]: ONNX Runtime's
//     GlobalAveragePool of each row in MLAS's order (GP1)-(GP3) (tensor_ops/ort_reduce.h)
//   reduce_rows_int(op, x, num_threads=1, out=None) -> y     x [R, D] int32 / int64; sum, sum_square,
//     sum_abs, prod (wrapping), max, min
//   scatter_f32(op, y, positions, updates) -> None           y[p_i] op= u_i in order (add, mul), float32
//   resize_axis_f64(x, taps, w, num_threads=1, out=None) -> y   x [outer, n, inner] float64,
//     taps [o, t] int64 in [0, n), w [o, t] float64 -> y [outer, o, inner]
//   resize_2d_f32(x, rows_first, taps_a, w_a, taps_b, w_b, num_threads=1, out=None, lanes=1) -> y
//     x float32 rank >= 2; the two steps over its last two axes, rows (h) first or not; with
//     lanes > 1, x [..., h, w, lanes] (rank >= 3) and the steps over the two axes before lanes
//   batch_norm_f32(x, mean, denom, scale, bias, num_threads=1, out=None) -> y   x [N, C, ...]
//   acc_to_float(acc, bias, scale, float_bias, num_threads=1, out=None) -> y   acc [N, M, ...]
//     int32, bias int32 [M] or None, scale float32 [M], float_bias float32 [M] or None
//   acc_to_quant(acc, bias, scale, float_bias, post_kind, post_params, y_scale, y_zero_point,
//                y_signed, num_threads=1, out=None) -> y uint8 / int8   the same acc and
//     parameters; post_kind a sgemm.h PostOp kind (0: none); y_scale > 0 and finite
//   softmax_quant(x, scale, mask, mask_rows, y_scale, y_zero_point, y_signed, num_threads=1,
//                 out=None) -> y uint8 / int8   x float32 rank >= 1, last dimension d in
//     [1, 4096]; scale None or one float32; mask None or float32 [R', d] with mask_rows int64
//     [x.size / d] in [0, R'); y_scale > 0 and finite
//   mul_quant(x, c, y_scale, y_zero_point, y_signed, num_threads=1, out=None, gelu=False) -> y uint8 /
//     int8   x float32 rank >= 1; c float32, one value or one per element of x's last axis;
//     y_scale > 0 and finite; gelu: Gelu (G1) of x first (MulQuant's activation "gelu")
//   take_axis(x, axis, idx, num_threads=1, out=None) -> y     any dtype; idx int64 in [-n, n)
//   repeat_2d(x, sh, sw, num_threads=1, out=None, lanes=False) -> y   1-64-byte elements, rank >= 2
//   copy_strided(x, num_threads=1, out=None) -> y            any dtype, any strides -> C order
//   topk_f32(x, k, largest, num_threads=1) -> (values, indices)   x [R, n] float32, 0 <= k <= n:
//     values [R, k] float32, indices [R, k] int64 (tensor_ops/topk.h's order)
//   nms_f32(boxes, scores, max_per_class, iou_threshold, score_threshold, center_point_box) -> selected
//     boxes [B, N, 4], scores [B, C, N] float32; score_threshold None or a float; selected
//     [K, 3] int64 (tensor_ops/nms.h); NaN scores without a threshold: ValueError
//   gather_elements(data, indices, axis, num_threads=1, out=None) -> y   data any 1/2/4/8-byte
//     dtype, indices int64 of data's rank (other axes no larger than data's), values in
//     [-n, n) along axis -> y of indices' shape (tensor_ops/gather_elements.h)
//   roi_align_f32(x, rois, batch_indices, output_height, output_width, sampling_ratio, spatial_scale,
//                 half_pixel, max_mode, num_threads=1, out=None) -> y   x [N, C, H, W], rois [R, 4]
//     float32, batch_indices [R] int64 in [0, N) -> y [R, C, PH, PW] (tensor_ops/roi_align.h)
//   grid_sample_f32(x, grid, align_corners, nearest, border, num_threads=1, out=None) -> y
//     x [N, C, H, W], grid [N, Ho, Wo, 2] float32 -> y [N, C, Ho, Wo] (tensor_ops/grid_sample.h)
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"
#include "sgemm/sgemm.h"
#include "tensor_ops/scatter.h"
#include "tensor_ops/tensor_ops.h"
#include "tensor_ops/gather_elements.h"
#include "tensor_ops/grid_sample.h"
#include "tensor_ops/nms.h"
#include "tensor_ops/ort_reduce.h"
#include "tensor_ops/roi_align.h"
#include "tensor_ops/topk.h"

namespace quanta {
namespace {

using tensor_ops::DType;

bool dtype_of(const py::dtype& d, DType* t) {
  const char kind = d.kind();
  const auto size = d.itemsize();
  if (kind == 'f' && size == 4)
    *t = DType::kF32;
  else if (kind == 'f' && size == 8)
    *t = DType::kF64;
  else if (kind == 'i' && size == 1)
    *t = DType::kI8;
  else if (kind == 'u' && size == 1)
    *t = DType::kU8;
  else if (kind == 'i' && size == 4)
    *t = DType::kI32;
  else if (kind == 'i' && size == 8)
    *t = DType::kI64;
  else if (kind == 'b' && size == 1)
    *t = DType::kBool;
  else
    return false;
  return true;
}

py::array as_array(const py::handle& obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj)) throw py::value_error(what + ": expected a numpy array");
  return py::reinterpret_borrow<py::array>(obj);
}

py::array contiguous(const py::handle& obj, const std::string& what) {
  auto a = as_array(obj, what);
  if (!(a.flags() & py::array::c_style)) throw py::value_error(what + ": expected a C-contiguous array");
  return a;
}

DType element_type(const py::array& a, const std::string& what) {
  DType t;
  if (!dtype_of(a.dtype(), &t)) {
    throw py::value_error(what + ": expected float32/64, (u)int8, int32/64 or bool, got " +
                          py::str(a.dtype()).cast<std::string>());
  }
  return t;
}

// A new C-contiguous array, or `out` checked for dtype, shape, contiguity, writeability
// and overlap with the inputs.
py::array make_output(const py::object& out_obj, const py::dtype& dtype, const Shape& shape, const std::string& op,
                      std::initializer_list<py::array> inputs) {
  if (out_obj.is_none()) return note_new_output(), py::array(dtype, shape);
  const std::string what = op + ": out";
  auto y = contiguous(out_obj, what);
  if (!dtype_equiv(y.dtype(), dtype)) {
    throw py::value_error(what + ": expected dtype " + py::str(dtype).cast<std::string>() + ", got " +
                          py::str(y.dtype()).cast<std::string>());
  }
  if (shape_of(y) != shape) {
    throw py::value_error(what + ": expected shape " + shape_str(shape) + ", got shape " + shape_str(shape_of(y)));
  }
  if (!y.writeable()) throw py::value_error(what + ": expected a writeable array");
  for (const py::array& in : inputs) {
    if (overlaps(y, in)) throw py::value_error(what + ": expected a buffer that does not overlap the inputs");
  }
  return y;
}

py::array unary_f32_ex(const std::string& op_name, const py::handle& x_obj, int num_threads, const py::object& out_obj,
                       const py::object& lo, const py::object& hi, float alpha, float beta) {
  static const std::array<const char*, tensor_ops::kNumUnaryF32> names = {
      "clip", "sqrt", "neg", "abs", "reciprocal", "square", "cube", "hard_sigmoid", "hard_swish", "leaky_relu"};
  int op = -1;
  for (int i = 0; i < tensor_ops::kNumUnaryF32; ++i) {
    if (op_name == names[i]) op = i;
  }
  if (op < 0) throw py::value_error("unary_f32_ex: op: unknown operation '" + op_name + "'");
  auto x = require_array<float>(x_obj, "unary_f32_ex: x");
  check_threads(num_threads, "unary_f32_ex");
  tensor_ops::UnaryParams p;
  p.has_lo = !lo.is_none();
  p.has_hi = !hi.is_none();
  if (p.has_lo) p.lo = lo.cast<float>();
  if (p.has_hi) p.hi = hi.cast<float>();
  p.alpha = alpha;
  p.beta = beta;
  auto y = make_output(out_obj, x.dtype(), shape_of(x), "unary_f32_ex", {x});
  run_or_record([=]() mutable {
    tensor_ops::unary_f32(static_cast<tensor_ops::UnaryF32>(op), x.data(), static_cast<float*>(y.mutable_data()),
                          x.size(), p, num_threads, active_isa());
  });
  return y;
}

py::array clip_int(const py::handle& x_obj, const py::object& lo, const py::object& hi, int num_threads,
                   const py::object& out_obj) {
  auto x = contiguous(x_obj, "clip_int: x");
  const DType t = element_type(x, "clip_int: x");
  if (t != DType::kI8 && t != DType::kU8 && t != DType::kI32 && t != DType::kI64) {
    throw py::value_error("clip_int: x: expected int8, uint8, int32 or int64, got " +
                          py::str(x.dtype()).cast<std::string>());
  }
  check_threads(num_threads, "clip_int");
  auto y = make_output(out_obj, x.dtype(), shape_of(x), "clip_int", {x});
  const int64_t l = lo.is_none() ? 0 : lo.cast<int64_t>();
  const int64_t h = hi.is_none() ? 0 : hi.cast<int64_t>();
  {
    py::gil_scoped_release release;
    tensor_ops::clip_int(t, x.data(), y.mutable_data(), x.size(), l, h, !lo.is_none(), !hi.is_none(), num_threads,
                         active_isa());
  }
  return y;
}

py::array cast(const py::handle& x_obj, const py::object& dtype_obj, int num_threads, const py::object& out_obj) {
  auto x = contiguous(x_obj, "cast: x");
  const DType from = element_type(x, "cast: x");
  const py::dtype to_dtype = py::dtype::from_args(dtype_obj);
  DType to;
  if (!dtype_of(to_dtype, &to)) {
    throw py::value_error("cast: dtype: expected float32/64, (u)int8, int32/64 or bool, got " +
                          py::str(to_dtype).cast<std::string>());
  }
  check_threads(num_threads, "cast");
  auto y = make_output(out_obj, to_dtype, shape_of(x), "cast", {x});
  run_or_record(
      [=]() mutable { tensor_ops::cast(from, to, x.data(), y.mutable_data(), x.size(), num_threads, active_isa()); });
  return y;
}

py::array broadcast_op(const std::string& op_name, const py::handle& a_obj, const py::handle& b_obj, int num_threads,
                       const py::object& out_obj) {
  static const char* binary[] = {"add", "sub", "mul", "div", "max", "min", "mod", "fmod"};
  static const char* compare[] = {"equal", "less", "less_equal", "greater", "greater_equal"};
  static const char* logic[] = {"and", "or", "xor"};
  int kind = -1, op = -1;
  for (int i = 0; i < 8; ++i) {
    if (op_name == binary[i]) kind = 0, op = i;
  }
  for (int i = 0; i < 3; ++i) {
    if (op_name == logic[i]) kind = 2, op = i;
  }
  for (int i = 0; i < 5; ++i) {
    if (op_name == compare[i]) kind = 1, op = i;
  }
  if (kind < 0) throw py::value_error("broadcast_op: op: unknown operation '" + op_name + "'");
  auto a = contiguous(a_obj, "broadcast_op: a");
  auto b = contiguous(b_obj, "broadcast_op: b");
  if (!dtype_equiv(a.dtype(), b.dtype())) {
    throw py::value_error("broadcast_op: b: expected a's dtype " + py::str(a.dtype()).cast<std::string>() + ", got " +
                          py::str(b.dtype()).cast<std::string>());
  }
  const DType t = element_type(a, "broadcast_op: a");
  if ((kind == 0 && t != DType::kI32 && t != DType::kI64 && (t != DType::kF64 || op >= 6)) ||
      (kind == 2 && t != DType::kBool)) {
    throw py::value_error("broadcast_op: " + op_name + ": no kernel for dtype " +
                          py::str(a.dtype()).cast<std::string>());
  }
  check_threads(num_threads, "broadcast_op");
  const Broadcast bc = broadcast_shapes(a, b, "broadcast_op");
  const py::dtype out_dtype = kind == 0 ? a.dtype() : py::dtype("bool");
  auto c = make_output(out_obj, out_dtype, bc.out, "broadcast_op", {a, b});
  run_or_record([=]() mutable {  // bc.shape() points into the call's own copy of bc
    tensor_ops::broadcast_op(kind, op, t, a.data(), b.data(), c.mutable_data(), bc.shape(), num_threads, active_isa());
  });
  return c;
}

py::array reduce_rows_f32(const std::string& op_name, const py::handle& x_obj, int num_threads,
                          const py::object& out_obj) {
  static const char* names[] = {"sum", "sum_square", "max", "min", "prod"};
  int op = -1;
  for (int i = 0; i < tensor_ops::kNumReduce; ++i) {
    if (op_name == names[i]) op = i;
  }
  if (op < 0) throw py::value_error("reduce_rows_f32: op: unknown operation '" + op_name + "'");
  auto x = require_array<float>(x_obj, "reduce_rows_f32: x");
  if (x.ndim() != 2) throw py::value_error("reduce_rows_f32: x: expected [rows, d], got " + shape_str(shape_of(x)));
  check_threads(num_threads, "reduce_rows_f32");
  auto y = make_output(out_obj, x.dtype(), Shape{x.shape(0)}, "reduce_rows_f32", {x});
  run_or_record([=]() mutable {
    tensor_ops::reduce_rows(static_cast<tensor_ops::Reduce>(op), x.data(), x.shape(0), x.shape(1),
                            static_cast<float*>(y.mutable_data()), num_threads, active_isa());
  });
  return y;
}

py::array ort_reduce_rows_f32(const py::handle& x_obj, bool mean, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "ort_reduce_rows_f32: x");
  if (x.ndim() != 2) throw py::value_error("ort_reduce_rows_f32: x: expected [rows, n], got " + shape_str(shape_of(x)));
  check_threads(num_threads, "ort_reduce_rows_f32");
  auto y = make_output(out_obj, x.dtype(), Shape{x.shape(0)}, "ort_reduce_rows_f32", {x});
  run_or_record([=]() mutable {
    tensor_ops::ort_reduce_rows(x.data(), x.shape(0), x.shape(1), mean, static_cast<float*>(y.mutable_data()),
                                num_threads);
  });
  return y;
}

py::array mlas_global_average_rows_f32(const py::handle& x_obj, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "mlas_global_average_rows_f32: x");
  if (x.ndim() != 2) {
    throw py::value_error("mlas_global_average_rows_f32: x: expected [rows, n], got " + shape_str(shape_of(x)));
  }
  check_threads(num_threads, "mlas_global_average_rows_f32");
  auto y = make_output(out_obj, x.dtype(), Shape{x.shape(0)}, "mlas_global_average_rows_f32", {x});
  run_or_record([=]() mutable {
    tensor_ops::mlas_global_average_rows(x.data(), x.shape(0), x.shape(1), static_cast<float*>(y.mutable_data()),
                                         num_threads);
  });
  return y;
}

py::array reduce_middle_f32(const std::string& op_name, const py::handle& x_obj, int num_threads,
                            const py::object& out_obj) {
  static const char* names[] = {"sum", "sum_square", "max", "min", "prod"};
  int op = -1;
  for (int i = 0; i < tensor_ops::kNumReduce; ++i) {
    if (op_name == names[i]) op = i;
  }
  if (op < 0) throw py::value_error("reduce_middle_f32: op: unknown operation '" + op_name + "'");
  auto x = require_array<float>(x_obj, "reduce_middle_f32: x");
  if (x.ndim() != 3) {
    throw py::value_error("reduce_middle_f32: x: expected [outer, d, inner], got " + shape_str(shape_of(x)));
  }
  check_threads(num_threads, "reduce_middle_f32");
  auto y = make_output(out_obj, x.dtype(), Shape{x.shape(0), x.shape(2)}, "reduce_middle_f32", {x});
  run_or_record([=]() mutable {
    tensor_ops::reduce_middle(static_cast<tensor_ops::Reduce>(op), x.data(), x.shape(0), x.shape(1), x.shape(2),
                              static_cast<float*>(y.mutable_data()), num_threads, active_isa());
  });
  return y;
}

py::array reduce_rows_int(const std::string& op_name, const py::handle& x_obj, int num_threads,
                          const py::object& out_obj) {
  static const char* names[] = {"sum", "sum_square", "sum_abs", "prod", "max", "min"};
  int op = -1;
  for (int i = 0; i < tensor_ops::kNumReduceInt; ++i) {
    if (op_name == names[i]) op = i;
  }
  if (op < 0) throw py::value_error("reduce_rows_int: op: unknown operation '" + op_name + "'");
  auto x = contiguous(x_obj, "reduce_rows_int: x");
  const DType t = element_type(x, "reduce_rows_int: x");
  if (t != DType::kI32 && t != DType::kI64) {
    throw py::value_error("reduce_rows_int: x: expected int32 or int64, got " + py::str(x.dtype()).cast<std::string>());
  }
  if (x.ndim() != 2) throw py::value_error("reduce_rows_int: x: expected [rows, d], got " + shape_str(shape_of(x)));
  check_threads(num_threads, "reduce_rows_int");
  auto y = make_output(out_obj, x.dtype(), Shape{x.shape(0)}, "reduce_rows_int", {x});
  {
    py::gil_scoped_release release;
    tensor_ops::reduce_rows_int(static_cast<tensor_ops::ReduceInt>(op), t, x.data(), x.shape(0), x.shape(1),
                                y.mutable_data(), num_threads, active_isa());
  }
  return y;
}

py::array resize_axis_f64(const py::handle& x_obj, const py::handle& taps_obj, const py::handle& w_obj, int num_threads,
                          const py::object& out_obj) {
  auto x = require_array<double>(x_obj, "resize_axis_f64: x");
  auto taps = require_array<int64_t>(taps_obj, "resize_axis_f64: taps");
  auto w = require_array<double>(w_obj, "resize_axis_f64: w");
  if (x.ndim() != 3)
    throw py::value_error("resize_axis_f64: x: expected [outer, n, inner], got " + shape_str(shape_of(x)));
  if (taps.ndim() != 2 || shape_of(w) != shape_of(taps) || taps.shape(1) < 1) {
    throw py::value_error("resize_axis_f64: taps, w: expected the same shape [o, t], t >= 1, got " +
                          shape_str(shape_of(taps)) + " and " + shape_str(shape_of(w)));
  }
  const int64_t n = x.shape(1);
  const int64_t* tp = taps.data();
  for (py::ssize_t i = 0; i < taps.size(); ++i) {
    if (tp[i] < 0 || tp[i] >= n)
      throw py::value_error("resize_axis_f64: taps: expected indices in [0, " + std::to_string(n) + ")");
  }
  check_threads(num_threads, "resize_axis_f64");
  auto y = make_output(out_obj, x.dtype(), Shape{x.shape(0), taps.shape(0), x.shape(2)}, "resize_axis_f64", {x});
  {
    py::gil_scoped_release release;
    tensor_ops::resize_axis(x.data(), x.shape(0), n, x.shape(2), tp, w.data(), taps.shape(0), taps.shape(1),
                            static_cast<double*>(y.mutable_data()), num_threads, active_isa());
  }
  return y;
}

py::array resize_2d_f32(const py::handle& x_obj, bool rows_first, const py::handle& ta_obj, const py::handle& wa_obj,
                        const py::handle& tb_obj, const py::handle& wb_obj, int num_threads, const py::object& out_obj,
                        int64_t lanes) {
  const std::string op = "resize_2d_f32";
  auto x = require_array<float>(x_obj, "resize_2d_f32: x");
  if (lanes < 1) throw py::value_error(op + ": lanes: expected >= 1, got " + std::to_string(lanes));
  const int ax = lanes > 1 ? 1 : 0;  // the lanes axis, when there is one, is last
  if (x.ndim() < 2 + ax || (ax && x.shape(x.ndim() - 1) != lanes)) {
    throw py::value_error(op + ": x: expected rank >= " + std::to_string(2 + ax) +
                          (ax ? " with a last axis of " + std::to_string(lanes) : std::string()) + ", got " +
                          shape_str(shape_of(x)));
  }
  const int64_t h = x.shape(x.ndim() - 2 - ax);
  const int64_t w = x.shape(x.ndim() - 1 - ax);
  auto check = [&](const py::handle& t_obj, const py::handle& w_obj, int64_t n, const char* name) {
    auto taps = require_array<int64_t>(t_obj, (op + ": taps_" + name).c_str());
    auto wt = require_array<double>(w_obj, (op + ": w_" + name).c_str());
    if (taps.ndim() != 2 || shape_of(wt) != shape_of(taps) || taps.shape(1) < 1) {
      throw py::value_error(op + ": taps_" + name + ", w_" + name + ": expected the same shape [o, t], t >= 1, got " +
                            shape_str(shape_of(taps)) + " and " + shape_str(shape_of(wt)));
    }
    const int64_t* tp = taps.data();
    for (py::ssize_t i = 0; i < taps.size(); ++i) {
      if (tp[i] < 0 || tp[i] >= n)
        throw py::value_error(op + ": taps_" + name + ": expected indices in [0, " + std::to_string(n) + ")");
    }
    return std::make_pair(taps, wt);
  };
  auto [ta, wa] = check(ta_obj, wa_obj, rows_first ? h : w, "a");
  auto [tb, wb] = check(tb_obj, wb_obj, rows_first ? w : h, "b");
  check_threads(num_threads, op.c_str());
  Shape out_shape = shape_of(x);
  out_shape[out_shape.size() - 2 - ax] = rows_first ? ta.shape(0) : tb.shape(0);
  out_shape[out_shape.size() - 1 - ax] = rows_first ? tb.shape(0) : ta.shape(0);
  auto y = make_output(out_obj, x.dtype(), out_shape, op.c_str(), {x});
  const int64_t planes = h * w == 0 ? 0 : x.size() / (h * w * lanes);
  {
    py::gil_scoped_release release;
    tensor_ops::resize_2d_f32(x.data(), planes, h, w, lanes, rows_first, ta.data(), wa.data(), ta.shape(0), ta.shape(1),
                              tb.data(), wb.data(), tb.shape(0), tb.shape(1), static_cast<float*>(y.mutable_data()),
                              num_threads, active_isa());
  }
  return y;
}

py::array batch_norm_f32(const py::handle& x_obj, const py::handle& m_obj, const py::handle& d_obj,
                         const py::handle& g_obj, const py::handle& b_obj, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "batch_norm_f32: x");
  if (x.ndim() < 2) throw py::value_error("batch_norm_f32: x: expected [N, C, ...], got " + shape_str(shape_of(x)));
  const int64_t channels = x.shape(1);
  std::array<py::array_t<float, py::array::c_style>, 4> p{
      require_array<float>(m_obj, "batch_norm_f32: mean"), require_array<float>(d_obj, "batch_norm_f32: denom"),
      require_array<float>(g_obj, "batch_norm_f32: scale"), require_array<float>(b_obj, "batch_norm_f32: bias")};
  for (const auto& v : p) {
    if (v.size() != channels) {
      throw py::value_error("batch_norm_f32: expected " + std::to_string(channels) + " values per parameter, got " +
                            std::to_string(v.size()));
    }
  }
  check_threads(num_threads, "batch_norm_f32");
  auto y = make_output(out_obj, x.dtype(), shape_of(x), "batch_norm_f32", {x});
  int64_t inner = 1;
  for (py::ssize_t dim = 2; dim < x.ndim(); ++dim) inner *= x.shape(dim);
  run_or_record([=]() mutable {
    tensor_ops::batch_norm(x.data(), static_cast<float*>(y.mutable_data()), x.shape(0) * channels, inner, channels,
                           p[0].data(), p[1].data(), p[2].data(), p[3].data(), num_threads, active_isa());
  });
  return y;
}

// acc_to_float / acc_to_quant's operands: acc int32 [N, M, ...]; bias int32 and
// float_bias float32 (or None) and scale float32, one value per channel M.
struct AccOperands {
  py::array_t<int32_t, py::array::c_style> acc, bias;
  py::array_t<float, py::array::c_style> scale, fbias;
  bool has_bias = false, has_fbias = false;  // a default array_t is an empty array, not None
  int64_t channels = 0, inner = 1;
  const int32_t* bias_ptr() const { return has_bias ? bias.data() : nullptr; }
  const float* fbias_ptr() const { return has_fbias ? fbias.data() : nullptr; }
};

AccOperands acc_operands(const py::handle& acc_obj, const py::object& bias_obj, const py::handle& scale_obj,
                         const py::object& fbias_obj, const std::string& op) {
  AccOperands a;
  a.acc = require_array<int32_t>(acc_obj, (op + ": acc").c_str());
  if (a.acc.ndim() < 2) throw py::value_error(op + ": acc: expected [N, M, ...], got " + shape_str(shape_of(a.acc)));
  a.channels = a.acc.shape(1);
  for (py::ssize_t d = 2; d < a.acc.ndim(); ++d) a.inner *= a.acc.shape(d);
  auto check_len = [&](const py::array& v, const char* what) {
    if (v.size() != a.channels) {
      throw py::value_error(op + ": " + what + ": expected " + std::to_string(a.channels) +
                            " values (one per channel), got " + std::to_string(v.size()));
    }
  };
  a.scale = require_array<float>(scale_obj, (op + ": scale").c_str());
  check_len(a.scale, "scale");
  if (!bias_obj.is_none()) {
    a.bias = require_array<int32_t>(bias_obj, (op + ": bias").c_str());
    check_len(a.bias, "bias");
    a.has_bias = true;
  }
  if (!fbias_obj.is_none()) {
    a.fbias = require_array<float>(fbias_obj, (op + ": float_bias").c_str());
    check_len(a.fbias, "float_bias");
    a.has_fbias = true;
  }
  return a;
}

py::array acc_to_float(const py::handle& acc_obj, const py::object& bias_obj, const py::handle& scale_obj,
                       const py::object& fbias_obj, int num_threads, const py::object& out_obj) {
  const AccOperands a = acc_operands(acc_obj, bias_obj, scale_obj, fbias_obj, "acc_to_float");
  check_threads(num_threads, "acc_to_float");
  auto y = make_output(out_obj, py::dtype::of<float>(), shape_of(a.acc), "acc_to_float", {a.acc});
  run_or_record([=]() mutable {
    tensor_ops::acc_to_float(a.acc.data(), static_cast<float*>(y.mutable_data()), a.acc.shape(0) * a.channels, a.inner,
                             a.channels, a.bias_ptr(), a.scale.data(), a.fbias_ptr(), num_threads, active_isa());
  });
  return y;
}

// A per-tensor 8-bit output's parameters: QuantizeLinear's run divides by y_scale, so a
// zero, negative or non-finite scale is the twin's business (it raises or defines the
// result), not a kernel's; the zero point must lie in the storage type's range.
void check_quant_output(float y_scale, int32_t y_zero_point, bool y_signed, const std::string& op) {
  if (!(y_scale > 0.0f) || !std::isfinite(y_scale)) {
    throw py::value_error(op + ": y_scale: expected a positive finite value, got " + std::to_string(y_scale));
  }
  const int32_t qmin = y_signed ? -128 : 0, qmax = y_signed ? 127 : 255;
  if (y_zero_point < qmin || y_zero_point > qmax) {
    throw py::value_error(op + ": y_zero_point: expected in [" + std::to_string(qmin) + ", " + std::to_string(qmax) +
                          "], got " + std::to_string(y_zero_point));
  }
}

py::array acc_to_quant(const py::handle& acc_obj, const py::object& bias_obj, const py::handle& scale_obj,
                       const py::object& fbias_obj, int post_kind, const std::vector<float>& post_params, float y_scale,
                       int32_t y_zero_point, bool y_signed, int num_threads, const py::object& out_obj) {
  const std::string op = "acc_to_quant";
  const AccOperands a = acc_operands(acc_obj, bias_obj, scale_obj, fbias_obj, op);
  // held by pointer: a recorded call passes the op's address on every run (an address
  // into the call's own capture gave other bytes from the second run on, -O3)
  const auto post = std::make_shared<const sgemm::PostOp>(post_op_arg(post_kind, post_params, op));
  check_quant_output(y_scale, y_zero_point, y_signed, op);
  check_threads(num_threads, op);
  const py::dtype dt = y_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>();
  auto y = make_output(out_obj, dt, shape_of(a.acc), op, {a.acc});
  run_or_record([=]() mutable {
    const sgemm::PostOp* pp = post_kind ? post.get() : nullptr;
    const int64_t rows = a.acc.shape(0) * a.channels;
    if (y_signed) {
      tensor_ops::acc_to_quant(a.acc.data(), static_cast<int8_t*>(y.mutable_data()), rows, a.inner, a.channels,
                               a.bias_ptr(), a.scale.data(), a.fbias_ptr(), pp, y_scale, y_zero_point, num_threads,
                               active_isa());
    } else {
      tensor_ops::acc_to_quant(a.acc.data(), static_cast<uint8_t*>(y.mutable_data()), rows, a.inner, a.channels,
                               a.bias_ptr(), a.scale.data(), a.fbias_ptr(), pp, y_scale, y_zero_point, num_threads,
                               active_isa());
    }
  });
  return y;
}

py::array softmax_quant(const py::handle& x_obj, const py::object& scale_obj, const py::object& mask_obj,
                        const py::object& rows_obj, float y_scale, int32_t y_zero_point, bool y_signed, int num_threads,
                        const py::object& out_obj) {
  const std::string op = "softmax_quant";
  auto x = require_array<float>(x_obj, "softmax_quant: x");
  if (x.ndim() < 1) throw py::value_error(op + ": x: expected rank >= 1, got a scalar");
  const int64_t d = x.shape(x.ndim() - 1);
  if (d < 1 || d > tensor_ops::kSoftmaxQuantMaxD) {
    throw py::value_error(op + ": x: expected a last dimension in [1, " +
                          std::to_string(tensor_ops::kSoftmaxQuantMaxD) + "], got " + std::to_string(d));
  }
  const int64_t rows = x.size() / d;
  const float* scale = nullptr;
  py::array_t<float, py::array::c_style> sc;
  if (!scale_obj.is_none()) {
    sc = require_array<float>(scale_obj, "softmax_quant: scale");
    if (sc.size() != 1) throw py::value_error(op + ": scale: expected one value");
    scale = sc.data();
  }
  const float* mask = nullptr;
  const int64_t* mask_rows = nullptr;
  py::array_t<float, py::array::c_style> mk;
  py::array_t<int64_t, py::array::c_style> mr;
  if (!mask_obj.is_none()) {
    mk = require_array<float>(mask_obj, "softmax_quant: mask");
    mr = require_array<int64_t>(rows_obj, "softmax_quant: mask_rows");
    if (mk.ndim() < 1 || mk.shape(mk.ndim() - 1) != d) {
      throw py::value_error(op + ": mask: expected a last dimension of " + std::to_string(d));
    }
    if (mr.size() != rows) throw py::value_error(op + ": mask_rows: expected " + std::to_string(rows) + " values");
    const int64_t mask_n = mk.size() / d;
    for (int64_t r = 0; r < rows; ++r) {
      if (mr.data()[r] < 0 || mr.data()[r] >= mask_n) {
        throw py::value_error(op + ": mask_rows: expected values in [0, " + std::to_string(mask_n) + ")");
      }
    }
    mask = mk.data();
    mask_rows = mr.data();
  }
  check_quant_output(y_scale, y_zero_point, y_signed, op);
  check_threads(num_threads, op);
  const py::dtype dt = y_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>();
  auto y = make_output(out_obj, dt, shape_of(x), op, {x});
  run_or_record([=]() mutable {
    if (y_signed) {
      tensor_ops::softmax_quant(x.data(), static_cast<int8_t*>(y.mutable_data()), rows, d, scale, mask, mask_rows,
                                y_scale, y_zero_point, num_threads, active_isa());
    } else {
      tensor_ops::softmax_quant(x.data(), static_cast<uint8_t*>(y.mutable_data()), rows, d, scale, mask, mask_rows,
                                y_scale, y_zero_point, num_threads, active_isa());
    }
  });
  return y;
}

py::array mul_quant(const py::handle& x_obj, const py::handle& c_obj, float y_scale, int32_t y_zero_point,
                    bool y_signed, int num_threads, const py::object& out_obj, bool gelu) {
  const std::string op = "mul_quant";
  auto x = require_array<float>(x_obj, "mul_quant: x");
  if (x.ndim() < 1) throw py::value_error(op + ": x: expected rank >= 1, got a scalar");
  const int64_t d = x.shape(x.ndim() - 1);
  auto c = require_array<float>(c_obj, "mul_quant: c");
  if (c.size() != 1 && c.size() != d) {
    throw py::value_error(op + ": c: expected 1 or " + std::to_string(d) + " values, got " + std::to_string(c.size()));
  }
  const int64_t c_step = c.size() == 1 ? 0 : 1;
  const int64_t rows = d == 0 ? 0 : x.size() / d;
  check_quant_output(y_scale, y_zero_point, y_signed, op);
  check_threads(num_threads, op);
  const py::dtype dt = y_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>();
  auto y = make_output(out_obj, dt, shape_of(x), op, {x});
  run_or_record([=]() mutable {
    if (y_signed) {
      tensor_ops::mul_quant(x.data(), static_cast<int8_t*>(y.mutable_data()), rows, d, c.data(), c_step, y_scale,
                            y_zero_point, num_threads, active_isa(), gelu);
    } else {
      tensor_ops::mul_quant(x.data(), static_cast<uint8_t*>(y.mutable_data()), rows, d, c.data(), c_step, y_scale,
                            y_zero_point, num_threads, active_isa(), gelu);
    }
  });
  return y;
}

py::array take_axis(const py::handle& x_obj, int64_t axis, const py::handle& idx_obj, int num_threads,
                    const py::object& out_obj) {
  auto x = contiguous(x_obj, "take_axis: x");
  // int32 indices (a Cast to int32 before an embedding Gather, as Keras and Paddle export
  // it) are widened into a copy: the index count is the output's row count, small beside
  // the rows it moves.
  std::vector<int64_t> widened;
  const int64_t* ip = nullptr;
  py::ssize_t count = 0;
  if (py::isinstance<py::array>(idx_obj) &&
      dtype_equiv(py::reinterpret_borrow<py::array>(idx_obj).dtype(), py::dtype::of<int32_t>())) {
    auto idx32 = require_array<int32_t>(idx_obj, "take_axis: idx");
    widened.assign(idx32.data(), idx32.data() + idx32.size());
    ip = widened.data();
    count = idx32.size();
  } else {
    auto idx = require_array<int64_t>(idx_obj, "take_axis: idx");
    ip = idx.data();
    count = idx.size();
  }
  const int64_t rank = x.ndim();
  if (axis < 0 || axis >= rank)
    throw py::value_error("take_axis: axis: expected in [0, " + std::to_string(rank) + "), got " +
                          std::to_string(axis));
  check_threads(num_threads, "take_axis");
  const int64_t n = x.shape(axis);
  bool negative = false;
  for (py::ssize_t i = 0; i < count; ++i) {
    if (ip[i] < -n || ip[i] >= n) {
      throw py::value_error("take_axis: idx: expected indices in [-" + std::to_string(n) + ", " + std::to_string(n) +
                            "), got " + std::to_string(ip[i]));
    }
    negative |= ip[i] < 0;
  }
  // a negative index counts from the end (np.take's and ONNX Gather's), made
  // non-negative in the widened copy: a duration net's unknown-label ids (-1) gather the
  // last row without leaving the fast path
  if (negative) {
    if (widened.empty()) widened.assign(ip, ip + count);
    for (auto& v : widened) v += v < 0 ? n : 0;
    ip = widened.data();
  }
  int64_t outer = 1, inner = x.itemsize();
  Shape out_shape;
  for (int64_t d = 0; d < axis; ++d) outer *= x.shape(d), out_shape.push_back(x.shape(d));
  out_shape.push_back(count);
  for (int64_t d = axis + 1; d < rank; ++d) inner *= x.shape(d), out_shape.push_back(x.shape(d));
  auto y = make_output(out_obj, x.dtype(), out_shape, "take_axis", {x});
  // A recorded call keeps its own copy of widened int32 indices, or points into the
  // int64 array (the recording caller keeps it alive); the bounds were checked here, so a
  // program records take_axis for constant indices only (quanta.targets.native.tensor_ops).
  const bool wide = !widened.empty();
  const int64_t* ip64 = wide ? nullptr : ip;
  run_or_record([=]() mutable {
    const int64_t* p = wide ? widened.data() : ip64;
    tensor_ops::take_axis(static_cast<const uint8_t*>(x.data()), outer, n, inner, p, count,
                          static_cast<uint8_t*>(y.mutable_data()), num_threads);
  });
  return y;
}

py::array repeat_2d(const py::handle& x_obj, int64_t sh, int64_t sw, int num_threads, const py::object& out_obj,
                    bool lanes) {
  auto x = contiguous(x_obj, "repeat_2d: x");
  // lanes: the last axis is part of the element (an NCHW16c tensor [N, Cb, H, W, 16]:
  // H and W are the axes before it, a pixel's 16 floats move as one element)
  const int64_t rank = x.ndim() - (lanes ? 1 : 0);
  const int64_t elem = x.itemsize() * (lanes && x.ndim() > 0 ? x.shape(x.ndim() - 1) : 1);
  if (rank < 2)
    throw py::value_error("repeat_2d: x: expected rank >= 2 (3 with lanes), got " + std::to_string(x.ndim()));
  if (elem != 1 && elem != 2 && elem != 4 && elem != 8 && elem != 16 && elem != 32 && elem != 64) {
    throw py::value_error("repeat_2d: x: expected elements of 1, 2, 4, 8, 16, 32 or 64 bytes, got " +
                          std::to_string(elem));
  }
  if (sh < 1 || sw < 1) {
    throw py::value_error("repeat_2d: expected factors >= 1, got " + std::to_string(sh) + ", " + std::to_string(sw));
  }
  check_threads(num_threads, "repeat_2d");
  Shape out_shape;
  int64_t planes = 1;
  for (int64_t d = 0; d < rank - 2; ++d) planes *= x.shape(d), out_shape.push_back(x.shape(d));
  const int64_t h = x.shape(rank - 2), w = x.shape(rank - 1);
  out_shape.push_back(static_cast<py::ssize_t>(h * sh));
  out_shape.push_back(static_cast<py::ssize_t>(w * sw));
  if (lanes) out_shape.push_back(x.shape(rank));
  auto y = make_output(out_obj, x.dtype(), out_shape, "repeat_2d", {x});
  if (y.size() == 0) return y;
  run_or_record([=]() mutable {
    tensor_ops::repeat_2d(static_cast<const uint8_t*>(x.data()), planes, h, w, elem, sh, sw,
                          static_cast<uint8_t*>(y.mutable_data()), num_threads);
  });
  return y;
}

py::array copy_strided(const py::handle& x_obj, int num_threads, const py::object& out_obj) {
  auto x = as_array(x_obj, "copy_strided: x");
  if (x.ndim() > broadcast::kMaxRank) throw py::value_error("copy_strided: x: expected rank <= 16");
  if (x.dtype().kind() == 'O') throw py::value_error("copy_strided: x: expected a numeric dtype, got object");
  check_threads(num_threads, "copy_strided");
  auto y = make_output(out_obj, x.dtype(), shape_of(x), "copy_strided", {});
  std::array<int64_t, broadcast::kMaxRank> shape{}, strides{};
  // the bytes the view spans (negative and zero strides included), for the overlap check:
  // x.nbytes() from x.data() would miss a reversed view's bytes and count a broadcast's twice
  int64_t lo = 0, hi = x.size() ? x.itemsize() : 0;
  for (py::ssize_t d = 0; d < x.ndim(); ++d) {
    shape[d] = x.shape(d), strides[d] = x.strides(d);
    if (shape[d] > 0) (strides[d] < 0 ? lo : hi) += (shape[d] - 1) * strides[d];
  }
  const auto xs = reinterpret_cast<intptr_t>(x.data());
  const auto ys = reinterpret_cast<intptr_t>(y.data());
  if (x.size() && y.nbytes() && xs + lo < ys + static_cast<intptr_t>(y.nbytes()) && ys < xs + hi) {
    throw py::value_error("copy_strided: out: expected a buffer that does not overlap the inputs");
  }
  const int rank = static_cast<int>(x.ndim());
  const int64_t itemsize = x.itemsize();
  run_or_record([=]() mutable {
    tensor_ops::copy_strided(static_cast<const uint8_t*>(x.data()), rank, shape.data(), strides.data(), itemsize,
                             static_cast<uint8_t*>(y.mutable_data()), num_threads);
  });
  return y;
}

// Concat of C-contiguous arrays of one dtype along axis into out (C-contiguous, the
// concatenated shape): per row of the axes before axis, each input's row of bytes in turn
// (np.concatenate's bytes).
void concat_into(const py::list& xs, int64_t axis, const py::handle& out_obj) {
  if (xs.empty()) throw py::value_error("concat_into: xs: expected at least one array");
  auto y = contiguous(out_obj, "concat_into: out");
  if (!y.writeable()) throw py::value_error("concat_into: out: expected a writeable array");
  const int64_t rank = y.ndim();
  if (axis < 0 || axis >= rank) {
    throw py::value_error("concat_into: axis: expected in [0, " + std::to_string(rank) + "), got " +
                          std::to_string(axis));
  }
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= y.shape(d);
  const int64_t item = y.itemsize();
  std::vector<py::array> parts;
  std::vector<int64_t> row_bytes;
  int64_t along = 0, y_row = 0;
  for (const py::handle& h : xs) {
    auto x = contiguous(h, "concat_into: xs[" + std::to_string(parts.size()) + "]");
    if (!dtype_equiv(x.dtype(), y.dtype()) || x.ndim() != rank) {
      throw py::value_error("concat_into: xs: expected arrays of out's dtype and rank");
    }
    int64_t row = item;
    for (int64_t d = 0; d < rank; ++d) {
      if (d != axis && x.shape(d) != y.shape(d)) {
        throw py::value_error("concat_into: xs: expected out's shape off the axis, got " + shape_str(shape_of(x)));
      }
      if (d >= axis) row *= x.shape(d);
    }
    if (overlaps(y, x)) throw py::value_error("concat_into: out: expected a buffer that does not overlap the inputs");
    along += x.shape(axis);
    y_row += row;
    parts.push_back(x);
    row_bytes.push_back(row);
  }
  if (along != y.shape(axis)) {
    throw py::value_error("concat_into: out: expected " + std::to_string(along) + " along the axis, got " +
                          std::to_string(y.shape(axis)));
  }
  std::vector<const uint8_t*> src;
  for (const auto& x : parts) src.push_back(static_cast<const uint8_t*>(x.data()));
  auto* dst = static_cast<uint8_t*>(y.mutable_data());
  // One element from each input per row (a stack along a new last axis: attacut's three
  // [1, 174, 196, 1] maps into [1, 174, 196, 3]): the inputs interleaved by a typed loop;
  // a memcpy call per element cost ~5 ns each.
  const bool interleave = outer > 1 && (item == 1 || item == 2 || item == 4 || item == 8) &&
                          std::all_of(row_bytes.begin(), row_bytes.end(), [item](int64_t b) { return b == item; });
  // a recorded call holds the parts (and so their bytes)
  run_or_record([src, row_bytes, outer, dst, parts, interleave, item]() {
    if (interleave) {
      const int64_t n = static_cast<int64_t>(src.size());
      for (int64_t i = 0; i < n; ++i) {
        switch (item) {
          case 1: tensor_ops::interleave_column<uint8_t>(src[i], outer, n, dst + i * item); break;
          case 2: tensor_ops::interleave_column<uint16_t>(src[i], outer, n, dst + i * item); break;
          case 4: tensor_ops::interleave_column<uint32_t>(src[i], outer, n, dst + i * item); break;
          default: tensor_ops::interleave_column<uint64_t>(src[i], outer, n, dst + i * item); break;
        }
      }
      return;
    }
    uint8_t* d = dst;
    for (int64_t o = 0; o < outer; ++o) {
      for (size_t i = 0; i < src.size(); ++i) {
        std::memcpy(d, src[i] + o * row_bytes[i], static_cast<size_t>(row_bytes[i]));
        d += row_bytes[i];
      }
    }
  });
}

// y (float32, C-contiguous, written in place) combined with updates at flat positions.
void scatter_f32(const std::string& op_name, const py::handle& y_obj, const py::handle& pos_obj,
                 const py::handle& upd_obj) {
  if (op_name != "add" && op_name != "mul") {
    throw py::value_error("scatter_f32: op: expected add or mul, got '" + op_name + "'");
  }
  if (!py::isinstance<py::array_t<float>>(y_obj)) throw py::value_error("scatter_f32: y: expected a float32 array");
  auto y = py::reinterpret_borrow<py::array_t<float>>(y_obj);
  if (!(y.flags() & py::array::c_style) || !y.writeable()) {
    throw py::value_error("scatter_f32: y: expected a writeable C-contiguous array");
  }
  auto pos = require_array<int64_t>(pos_obj, "scatter_f32: positions");
  auto upd = require_array<float>(upd_obj, "scatter_f32: updates");
  if (pos.ndim() != 1 || upd.ndim() != 1 || pos.size() != upd.size()) {
    throw py::value_error("scatter_f32: expected 1-D positions and updates of one length, got " +
                          shape_str(shape_of(pos)) + " and " + shape_str(shape_of(upd)));
  }
  const int64_t n = pos.size(), size = y.size();
  const int64_t* p = pos.data();
  for (int64_t i = 0; i < n; ++i) {
    if (p[i] < 0 || p[i] >= size) {
      throw py::value_error("scatter_f32: positions: expected values in [0, " + std::to_string(size) + "), got " +
                            std::to_string(p[i]));
    }
  }
  py::gil_scoped_release release;
  tensor_ops::scatter_f32(y.mutable_data(), p, upd.data(), n, op_name == "mul");
}

py::tuple topk_f32(const py::handle& x_obj, int64_t k, bool largest, int num_threads) {
  auto x = require_array<float>(x_obj, "topk_f32: x");
  if (x.ndim() != 2) throw py::value_error("topk_f32: x: expected [rows, n], got " + shape_str(shape_of(x)));
  const int64_t rows = x.shape(0), n = x.shape(1);
  if (k < 0 || k > n)
    throw py::value_error("topk_f32: k: expected in [0, " + std::to_string(n) + "], got " + std::to_string(k));
  check_threads(num_threads, "topk_f32");
  py::array_t<float, py::array::c_style> values(Shape{rows, k});
  py::array_t<int64_t, py::array::c_style> indices(Shape{rows, k});
  {
    py::gil_scoped_release release;
    tensor_ops::topk_f32(x.data(), rows, n, k, largest, values.mutable_data(), indices.mutable_data(), num_threads);
  }
  return py::make_tuple(values, indices);
}

py::array grid_sample_f32(const py::handle& x_obj, const py::handle& grid_obj, bool align_corners, bool nearest,
                          bool border, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "grid_sample_f32: x");
  auto grid = require_array<float>(grid_obj, "grid_sample_f32: grid");
  if (x.ndim() != 4) throw py::value_error("grid_sample_f32: x: expected [N, C, H, W], got " + shape_str(shape_of(x)));
  if (grid.ndim() != 4 || grid.shape(0) != x.shape(0) || grid.shape(3) != 2) {
    throw py::value_error("grid_sample_f32: grid: expected [" + std::to_string(x.shape(0)) + ", Ho, Wo, 2], got " +
                          shape_str(shape_of(grid)));
  }
  check_threads(num_threads, "grid_sample_f32");
  const int64_t n = x.shape(0), c = x.shape(1), h = x.shape(2), w = x.shape(3);
  if (h < 1 || w < 1) throw py::value_error("grid_sample_f32: x: expected H, W >= 1, got " + shape_str(shape_of(x)));
  const int64_t p = grid.shape(1) * grid.shape(2);
  auto y = make_output(out_obj, x.dtype(), Shape{n, c, grid.shape(1), grid.shape(2)}, "grid_sample_f32", {x, grid});
  {
    py::gil_scoped_release release;
    tensor_ops::grid_sample_f32(x.data(), grid.data(), n, c, h, w, p, align_corners, nearest, border,
                                static_cast<float*>(y.mutable_data()), num_threads);
  }
  return y;
}

py::array nms_f32(const py::handle& boxes_obj, const py::handle& scores_obj, int64_t max_per_class, float iou_threshold,
                  const py::object& score_threshold, bool center_point_box) {
  auto boxes = require_array<float>(boxes_obj, "nms_f32: boxes");
  auto scores = require_array<float>(scores_obj, "nms_f32: scores");
  if (boxes.ndim() != 3 || boxes.shape(2) != 4)
    throw py::value_error("nms_f32: boxes: expected [B, N, 4], got " + shape_str(shape_of(boxes)));
  if (scores.ndim() != 3 || scores.shape(0) != boxes.shape(0) || scores.shape(2) != boxes.shape(1)) {
    throw py::value_error("nms_f32: scores: expected [" + std::to_string(boxes.shape(0)) + ", C, " +
                          std::to_string(boxes.shape(1)) + "], got " + shape_str(shape_of(scores)));
  }
  const bool has_threshold = !score_threshold.is_none();
  const float threshold = has_threshold ? score_threshold.cast<float>() : 0.0f;
  if (!has_threshold) {
    const float* s = scores.data();
    for (py::ssize_t i = 0; i < scores.size(); ++i) {
      if (std::isnan(s[i])) throw py::value_error("nms_f32: scores: NaN without a score threshold has no order");
    }
  }
  std::vector<int64_t> selected;
  {
    py::gil_scoped_release release;
    tensor_ops::nms_f32(boxes.data(), scores.data(), boxes.shape(0), scores.shape(1), boxes.shape(1), max_per_class,
                        iou_threshold, has_threshold, threshold, center_point_box, &selected);
  }
  const auto k = static_cast<py::ssize_t>(selected.size() / 3);
  py::array_t<int64_t, py::array::c_style> out(Shape{k, 3});
  std::copy(selected.begin(), selected.end(), out.mutable_data());
  return out;
}

py::array gather_elements(const py::handle& data_obj, const py::handle& idx_obj, int64_t axis, int num_threads,
                          const py::object& out_obj) {
  auto data = contiguous(data_obj, "gather_elements: data");
  auto idx = require_array<int64_t>(idx_obj, "gather_elements: indices");
  const int64_t rank = data.ndim();
  const int64_t size = data.itemsize();
  if (size != 1 && size != 2 && size != 4 && size != 8)
    throw py::value_error("gather_elements: data: expected elements of 1, 2, 4 or 8 bytes");
  if (idx.ndim() != rank || rank == 0) {
    throw py::value_error("gather_elements: indices: expected rank " + std::to_string(rank) + ", got shape " +
                          shape_str(shape_of(idx)));
  }
  if (axis < 0 || axis >= rank)
    throw py::value_error("gather_elements: axis: expected in [0, " + std::to_string(rank) + "), got " +
                          std::to_string(axis));
  std::vector<int64_t> dshape(static_cast<size_t>(rank)), ishape(static_cast<size_t>(rank));
  for (int64_t d = 0; d < rank; ++d) {
    dshape[d] = data.shape(d);
    ishape[d] = idx.shape(d);
    if (d != axis && ishape[d] > dshape[d]) {
      throw py::value_error("gather_elements: indices: shape " + shape_str(shape_of(idx)) + " exceeds data's " +
                            shape_str(shape_of(data)) + " on axis " + std::to_string(d));
    }
  }
  check_threads(num_threads, "gather_elements");
  const int64_t n = dshape[axis];
  const int64_t* ip = idx.data();
  for (py::ssize_t i = 0; i < idx.size(); ++i) {
    if (ip[i] < -n || ip[i] >= n) {
      throw py::value_error("gather_elements: indices: expected values in [" + std::to_string(-n) + ", " +
                            std::to_string(n) + "), got " + std::to_string(ip[i]));
    }
  }
  auto y = make_output(out_obj, data.dtype(), shape_of(idx), "gather_elements", {data});
  {
    py::gil_scoped_release release;
    tensor_ops::gather_elements(static_cast<const uint8_t*>(data.data()), dshape, ip, ishape, axis, size,
                                static_cast<uint8_t*>(y.mutable_data()), num_threads);
  }
  return y;
}

py::array roi_align_f32(const py::handle& x_obj, const py::handle& rois_obj, const py::handle& batch_obj,
                        int64_t output_height, int64_t output_width, int64_t sampling_ratio, float spatial_scale,
                        bool half_pixel, bool max_mode, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "roi_align_f32: x");
  auto rois = require_array<float>(rois_obj, "roi_align_f32: rois");
  auto batch = require_array<int64_t>(batch_obj, "roi_align_f32: batch_indices");
  if (x.ndim() != 4) throw py::value_error("roi_align_f32: x: expected [N, C, H, W], got " + shape_str(shape_of(x)));
  if (rois.ndim() != 2 || rois.shape(1) != 4)
    throw py::value_error("roi_align_f32: rois: expected [R, 4], got " + shape_str(shape_of(rois)));
  if (batch.ndim() != 1 || batch.shape(0) != rois.shape(0)) {
    throw py::value_error("roi_align_f32: batch_indices: expected [" + std::to_string(rois.shape(0)) + "], got " +
                          shape_str(shape_of(batch)));
  }
  if (output_height < 1 || output_width < 1) throw py::value_error("roi_align_f32: output size: expected >= 1");
  if (x.shape(2) < 1 || x.shape(3) < 1) throw py::value_error("roi_align_f32: x: expected H, W >= 1");
  const int64_t* bp = batch.data();
  for (py::ssize_t i = 0; i < batch.size(); ++i) {
    if (bp[i] < 0 || bp[i] >= x.shape(0)) {
      throw py::value_error("roi_align_f32: batch_indices: expected values in [0, " + std::to_string(x.shape(0)) +
                            "), got " + std::to_string(bp[i]));
    }
  }
  check_threads(num_threads, "roi_align_f32");
  auto y = make_output(out_obj, x.dtype(), Shape{rois.shape(0), x.shape(1), output_height, output_width},
                       "roi_align_f32", {x, rois});
  {
    py::gil_scoped_release release;
    tensor_ops::roi_align_f32(x.data(), x.shape(0), x.shape(1), x.shape(2), x.shape(3), rois.data(), bp, rois.shape(0),
                              output_height, output_width, sampling_ratio, spatial_scale, half_pixel, max_mode,
                              static_cast<float*>(y.mutable_data()), num_threads);
  }
  return y;
}

}  // namespace

void register_tensor_ops(py::module_& m) {
  using py::arg;
  const py::object none = py::none();
  m.def("unary_f32_ex", &unary_f32_ex, arg("op"), arg("x"), arg("num_threads") = 1, arg("out") = none, arg("lo") = none,
        arg("hi") = none, arg("alpha") = 0.0f, arg("beta") = 0.0f,
        "float32 clip, sqrt, neg, abs, reciprocal, square, cube, hard_sigmoid, hard_swish, leaky_relu (tensor_ops.h).");
  m.def("clip_int", &clip_int, arg("x"), arg("lo"), arg("hi"), arg("num_threads") = 1, arg("out") = none,
        "Integer clip (numpy np.maximum then np.minimum).");
  m.def("cast", &cast, arg("x"), arg("dtype"), arg("num_threads") = 1, arg("out") = none,
        "numpy astype between float32/64, (u)int8, int32/64 and bool (tensor_ops.h).");
  m.def("broadcast_op", &broadcast_op, arg("op"), arg("a"), arg("b"), arg("num_threads") = 1, arg("out") = none,
        "Integer add/sub/mul/div/max/min, comparisons and bool logic with numpy broadcasting.");
  m.def("scatter_f32", &scatter_f32, arg("op"), arg("y"), arg("positions"), arg("updates"),
        "y[p_i] = y[p_i] op u_i in order, op add or mul, float32, in place (tensor_ops/scatter.h).");
  m.def("reduce_rows_f32", &reduce_rows_f32, arg("op"), arg("x"), arg("num_threads") = 1, arg("out") = none,
        "Row sum / sum of squares (R1)-(R3), max / min (M1)-(M3), product (P16) of x [R, D] float32.");
  m.def("ort_reduce_rows_f32", &ort_reduce_rows_f32, arg("x"), arg("mean"), arg("num_threads") = 1, arg("out") = none,
        "ONNX Runtime's row sum (mean: / f32(n)) of x [R, n] float32 in Eigen's order (ER1)-(ER4).");
  m.def("mlas_global_average_rows_f32", &mlas_global_average_rows_f32, arg("x"), arg("num_threads") = 1,
        arg("out") = none,
        "ONNX Runtime's GlobalAveragePool of each row of x [R, n] float32 in MLAS's order (GP1)-(GP3).");
  m.def("reduce_middle_f32", &reduce_middle_f32, arg("op"), arg("x"), arg("num_threads") = 1, arg("out") = none,
        "The reduce_rows_f32 operations over the middle axis of x [outer, d, inner] float32 -> [outer, inner].");
  m.def("reduce_rows_int", &reduce_rows_int, arg("op"), arg("x"), arg("num_threads") = 1, arg("out") = none,
        "Row sum / sum of squares / sum of |x| / product (wrapping), max / min of x [R, D] int32 or int64.");
  m.def("resize_2d_f32", &resize_2d_f32, arg("x"), arg("rows_first"), arg("taps_a"), arg("w_a"), arg("taps_b"),
        arg("w_b"), arg("num_threads") = 1, arg("out") = none, arg("lanes") = 1,
        "Two resize_axis steps over the last two axes of float32 x (rows first, or columns first), plane by "
        "plane in double, rounded to float32 once: the bytes of cast, resize_axis_f64 twice, cast. With "
        "lanes > 1 the two axes before a last axis of `lanes` values (an NCHW16c tensor's H, W).");
  m.def("resize_axis_f64", &resize_axis_f64, arg("x"), arg("taps"), arg("w"), arg("num_threads") = 1, arg("out") = none,
        "One axis of a separable Resize in float64 (nn_resize.py (3)).");
  m.def("batch_norm_f32", &batch_norm_f32, arg("x"), arg("mean"), arg("denom"), arg("scale"), arg("bias"),
        arg("num_threads") = 1, arg("out") = none,
        "y = f32(f32(f32(f32(x - m_c) / d_c) * g_c) + b_c) over channel axis 1 of float32 x.");
  m.def("acc_to_float", &acc_to_float, arg("acc"), arg("bias"), arg("scale"), arg("float_bias"), arg("num_threads") = 1,
        arg("out") = none,
        "y = f32(f32(int32(acc + bias_c)) * scale_c) (+ float_bias_c) over channel axis 1 of int32 acc.");
  m.def("acc_to_quant", &acc_to_quant, arg("acc"), arg("bias"), arg("scale"), arg("float_bias"), arg("post_kind"),
        arg("post_params"), arg("y_scale"), arg("y_zero_point"), arg("y_signed"), arg("num_threads") = 1,
        arg("out") = none,
        "y = QuantizeLinear(post(acc_to_float(acc, bias, scale, float_bias)), y_scale, y_zero_point), uint8 or "
        "int8, over channel axis 1 of int32 acc (post: sgemm.h PostOp kinds, as conv_f32).");
  m.def("softmax_quant", &softmax_quant, arg("x"), arg("scale"), arg("mask"), arg("mask_rows"), arg("y_scale"),
        arg("y_zero_point"), arg("y_signed"), arg("num_threads") = 1, arg("out") = none,
        "y = QuantizeLinear(Softmax(Add?(Mul?(x, scale), mask[mask_rows]), axis=-1), y_scale, y_zero_point), "
        "uint8 or int8, per row of float32 x (quanta::SoftmaxQuant).");
  m.def("mul_quant", &mul_quant, arg("x"), arg("c"), arg("y_scale"), arg("y_zero_point"), arg("y_signed"),
        arg("num_threads") = 1, arg("out") = none, arg("gelu") = false,
        "y = QuantizeLinear(Mul(x, c), y_scale, y_zero_point), uint8 or int8, c one float32 value or one per "
        "element of x's last axis (quanta::MulQuant); with gelu, Mul(Gelu(x), c), Gelu (G1).");
  m.def("take_axis", &take_axis, arg("x"), arg("axis"), arg("idx"), arg("num_threads") = 1, arg("out") = none,
        "y[a, q, :] = x[a, idx[q], :] along axis, any dtype; idx int64 or int32, in [0, n).");
  m.def("repeat_2d", &repeat_2d, arg("x"), arg("sh"), arg("sw"), arg("num_threads") = 1, arg("out") = none,
        arg("lanes") = false,
        "y[..., oy, ox] = x[..., oy // sh, ox // sw]: nearest upsampling of the last two axes by integers "
        "(lanes: of the two before the last, whose elements move together).");
  m.def("concat_into", &concat_into, arg("xs"), arg("axis"), arg("out"),
        "Concat of C-contiguous arrays of out's dtype along axis into out (np.concatenate's bytes).");
  m.def("copy_strided", &copy_strided, arg("x"), arg("num_threads") = 1, arg("out") = none,
        "A C-contiguous copy of any strided array (transposed, sliced, broadcast views).");
  m.def("topk_f32", &topk_f32, arg("x"), arg("k"), arg("largest"), arg("num_threads") = 1,
        "(values, indices) of the k first of each row of float32 x [R, n] in ONNX TopK's order "
        "(tensor_ops/topk.h): the reference's bytes.");
  m.def("grid_sample_f32", &grid_sample_f32, arg("x"), arg("grid"), arg("align_corners"), arg("nearest"), arg("border"),
        arg("num_threads") = 1, arg("out") = none,
        "GridSample of float32 x [N, C, H, W] at grid [N, Ho, Wo, 2], linear or nearest, zeros or border "
        "padding (tensor_ops/grid_sample.h, eqs. (GS1)-(GS4)).");
  m.def("nms_f32", &nms_f32, arg("boxes"), arg("scores"), arg("max_per_class"), arg("iou_threshold"),
        arg("score_threshold"), arg("center_point_box"),
        "NonMaxSuppression of float32 boxes [B, N, 4] and scores [B, C, N]: the (batch, class, box) triples "
        "ONNX's reference selects (tensor_ops/nms.h).");
  m.def("gather_elements", &gather_elements, arg("data"), arg("indices"), arg("axis"), arg("num_threads") = 1,
        arg("out") = none, "GatherElements of any 1-8-byte dtype along axis (tensor_ops/gather_elements.h).");
  m.def("roi_align_f32", &roi_align_f32, arg("x"), arg("rois"), arg("batch_indices"), arg("output_height"),
        arg("output_width"), arg("sampling_ratio"), arg("spatial_scale"), arg("half_pixel"), arg("max_mode"),
        arg("num_threads") = 1, arg("out") = none,
        "RoiAlign of float32 x at rois (avg or max; tensor_ops/roi_align.h, eqs. (RA1)-(RA4)).");
}

}  // namespace quanta
