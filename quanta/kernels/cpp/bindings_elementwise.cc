// Bindings for the elementwise and pooling kernels (elementwise/elementwise.h,
// pool/pool.h): the entry layer. Every argument is checked here (dtype, rank, shape,
// contiguity, parameter ranges, aliasing of out=) and a ValueError names the argument,
// what was expected and what was given, before a pointer reaches a driver.
//
//   dequantize_linear(x: u8|i8|u16|i16, scale: f32[C], zero_point: i32[C], axis, num_threads=1, out=None) -> f32
//   dynamic_quantize_linear(x: f32, num_threads=1) -> (y u8, scale f32[], zero_point u8[])
//   qlinear_add(a, b, sa, za, sb, zb, sc, zc, num_threads=1, out=None)      numpy broadcasting
//   qlinear_mul(a, b, ratio, za, zb, zc, num_threads=1, out=None)           numpy broadcasting
//   lut8(x: u8|i8, table: [256] of x's dtype, num_threads=1, out=None)      y = table[bits of x]
//   lut8_channels(x, tables: [C, 256] of x's dtype, axis, num_threads=1, out=None)
//                                                   y = tables[channel of the element along axis][bits of x]
//   qlinear_softmax_rows(x: [rows, D] u8|i8, table: f32[256], ys, zy, num_threads=1, out=None)
//   qlinear_concat(inputs: [u8|i8 arrays], tables: [None | table], axis, out=None)
//   qlinear_global_average_pool(x, m, zx, zy, channels_last, num_threads=1, out=None)
//   max_pool_2d(x [N,C,H,W], kernel, strides, dilations, pads_begin, out_hw, num_threads=1, out=None)
//   qlinear_average_pool_2d(x [N,C,H,W], kernel, strides, pads_begin, out_hw, sx, zx, sy, zy,
//                           count_include_pad, num_threads=1, out=None)
#include <pybind11/stl.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "bindings.h"
#include "bindings_pool.h"
#include "elementwise/elementwise.h"
#include "pool/pool.h"

namespace quanta {
namespace {

bool is_dtype(const py::array& a, const py::dtype& dt) { return dtype_equiv(a.dtype(), dt); }

void require_eight_bit(const py::handle& obj, const char* what) {
  if (!py::isinstance<py::array>(obj)) throw py::value_error(std::string(what) + ": expected a numpy array");
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!is_dtype(a, py::dtype::of<uint8_t>()) && !is_dtype(a, py::dtype::of<int8_t>())) {
    throw py::value_error(std::string(what) + ": expected dtype uint8 or int8, got " +
                          py::str(a.dtype()).cast<std::string>());
  }
}

template <typename T>
int32_t check_zero_point(int64_t zp, const char* what) {
  if (zp < std::numeric_limits<T>::min() || zp > std::numeric_limits<T>::max()) {
    throw py::value_error(std::string(what) + ": expected a value in [" +
                          std::to_string(static_cast<int>(std::numeric_limits<T>::min())) + ", " +
                          std::to_string(static_cast<int>(std::numeric_limits<T>::max())) + "], got " +
                          std::to_string(zp));
  }
  return static_cast<int32_t>(zp);
}

// ---- DequantizeLinear -------------------------------------------------------------------

template <typename T>
py::array dequantize_impl(const py::handle& x_obj, const py::handle& scale_obj, const py::handle& zp_obj, int64_t axis,
                          int num_threads, const py::object& out_obj) {
  auto x = require_array<T>(x_obj, "dequantize_linear: x");
  auto scale = require_array<float>(scale_obj, "dequantize_linear: scale");
  auto zp = require_array<int32_t>(zp_obj, "dequantize_linear: zero_point");
  check_threads(num_threads, "dequantize_linear");
  const int64_t channels = scale.size();
  if (zp.size() != channels) {
    throw py::value_error("dequantize_linear: zero_point has " + std::to_string(zp.size()) +
                          " elements but scale has " + std::to_string(channels));
  }
  const auto [outer, inner] = axis_runs(x, channels, scale.ndim(), axis, "dequantize_linear");
  for (int64_t c = 0; c < channels; ++c) check_zero_point<T>(zp.data()[c], "dequantize_linear: zero_point");
  auto y = make_output<float>(out_obj, shape_of(x), "dequantize_linear", {x});
  run_or_record([=]() mutable {
    elementwise::dequantize_linear<T>(x.data(), y.mutable_data(), scale.data(), zp.data(), outer, channels, inner,
                                      num_threads, active_isa());
  });
  return std::move(y);
}

py::array dequantize_linear(const py::handle& x, const py::handle& scale, const py::handle& zp, int64_t axis,
                            int num_threads, const py::object& out) {
  if (py::isinstance<py::array>(x)) {  // 16-bit codes (ORT's QUInt16 / QInt16 activations)
    const auto a = py::reinterpret_borrow<py::array>(x);
    if (is_dtype(a, py::dtype::of<uint16_t>())) return dequantize_impl<uint16_t>(x, scale, zp, axis, num_threads, out);
    if (is_dtype(a, py::dtype::of<int16_t>())) return dequantize_impl<int16_t>(x, scale, zp, axis, num_threads, out);
  }
  require_eight_bit(x, "dequantize_linear: x");
  if (is_dtype(py::reinterpret_borrow<py::array>(x), py::dtype::of<uint8_t>())) {
    return dequantize_impl<uint8_t>(x, scale, zp, axis, num_threads, out);
  }
  return dequantize_impl<int8_t>(x, scale, zp, axis, num_threads, out);
}

// ---- DynamicQuantizeLinear ----------------------------------------------------------------

py::tuple dynamic_quantize_linear(const py::handle& x_obj, int num_threads) {
  auto x = require_array<float>(x_obj, "dynamic_quantize_linear: x");
  check_threads(num_threads, "dynamic_quantize_linear");
  py::array_t<uint8_t> y(shape_of(x));
  py::array_t<float> scale(std::vector<py::ssize_t>{});
  py::array_t<uint8_t> zp(std::vector<py::ssize_t>{});
  {
    py::gil_scoped_release release;
    elementwise::dynamic_quantize_linear(x.data(), y.mutable_data(), x.size(), scale.mutable_data(), zp.mutable_data(),
                                         num_threads, active_isa());
  }
  return py::make_tuple(y, scale, zp);
}

// DynamicQuantizeLinear into planned outputs (the executor's arena): y of x's shape, the
// scale and zero point one value each. The kernel computes the scale and zero point from
// x's values inside the call, so a native program's recorded step (run_or_record) gives
// the same three outputs as the call above on every run.
py::tuple dynamic_quantize_linear_into(const py::handle& x_obj, const py::object& y_obj, const py::handle& scale_obj,
                                       const py::handle& zp_obj, int num_threads) {
  auto x = require_array<float>(x_obj, "dynamic_quantize_linear_into: x");
  check_threads(num_threads, "dynamic_quantize_linear_into");
  auto y = make_output<uint8_t>(y_obj, shape_of(x), "dynamic_quantize_linear_into", {x});
  auto scale = require_array<float>(scale_obj, "dynamic_quantize_linear_into: scale");
  auto zp = require_array<uint8_t>(zp_obj, "dynamic_quantize_linear_into: zero_point");
  if (scale.size() != 1 || zp.size() != 1) {
    throw py::value_error("dynamic_quantize_linear_into: scale, zero_point: expected one value each, got shapes " +
                          shape_str(shape_of(scale)) + " and " + shape_str(shape_of(zp)));
  }
  if (!scale.writeable() || !zp.writeable()) {
    throw py::value_error("dynamic_quantize_linear_into: scale, zero_point: expected writeable arrays");
  }
  if (overlaps(scale, x) || overlaps(zp, x) || overlaps(scale, y) || overlaps(zp, y) || overlaps(scale, zp)) {
    throw py::value_error("dynamic_quantize_linear_into: expected outputs that overlap neither x nor each other");
  }
  const float* px = x.data();
  uint8_t* py_ = y.mutable_data();
  float* ps = scale.mutable_data();
  uint8_t* pz = zp.mutable_data();
  const int64_t n = x.size();
  run_or_record([=]() { elementwise::dynamic_quantize_linear(px, py_, n, ps, pz, num_threads, active_isa()); });
  return py::make_tuple(y, scale, zp);
}

// ---- QLinearAdd / QLinearMul --------------------------------------------------------------

template <typename T>
py::array add_impl(const py::handle& a_obj, const py::handle& b_obj, float sa, int64_t za, float sb, int64_t zb,
                   float sc, int64_t zc, int num_threads, const py::object& out_obj) {
  auto a = require_array<T>(a_obj, "qlinear_add: a");
  auto b = require_array<T>(b_obj, "qlinear_add: b");
  check_threads(num_threads, "qlinear_add");
  const elementwise::AddParams p = elementwise::make_add_params(
      sa, check_zero_point<T>(za, "qlinear_add: a_zero_point"), sb,
      check_zero_point<T>(zb, "qlinear_add: b_zero_point"), sc, check_zero_point<T>(zc, "qlinear_add: c_zero_point"));
  const Broadcast bc = broadcast_shapes(a, b, "qlinear_add");
  auto c = make_output<T>(out_obj, bc.out, "qlinear_add", {a, b});
  run_or_record([=]() mutable {  // bc.shape() points into the call's own copy of bc
    elementwise::qlinear_add<T>(a.data(), b.data(), c.mutable_data(), bc.shape(), p, num_threads, active_isa());
  });
  return std::move(c);
}

template <typename T>
py::array mul_impl(const py::handle& a_obj, const py::handle& b_obj, float ratio, int64_t za, int64_t zb, int64_t zc,
                   int num_threads, const py::object& out_obj) {
  auto a = require_array<T>(a_obj, "qlinear_mul: a");
  auto b = require_array<T>(b_obj, "qlinear_mul: b");
  check_threads(num_threads, "qlinear_mul");
  const elementwise::MulParams p{ratio, check_zero_point<T>(za, "qlinear_mul: a_zero_point"),
                                 check_zero_point<T>(zb, "qlinear_mul: b_zero_point"),
                                 check_zero_point<T>(zc, "qlinear_mul: c_zero_point")};
  const Broadcast bc = broadcast_shapes(a, b, "qlinear_mul");
  auto c = make_output<T>(out_obj, bc.out, "qlinear_mul", {a, b});
  run_or_record([=]() mutable {  // bc.shape() points into the call's own copy of bc
    elementwise::qlinear_mul<T>(a.data(), b.data(), c.mutable_data(), bc.shape(), p, num_threads, active_isa());
  });
  return std::move(c);
}

bool is_u8(const py::handle& obj) { return is_dtype(py::reinterpret_borrow<py::array>(obj), py::dtype::of<uint8_t>()); }

py::array qlinear_add(const py::handle& a, const py::handle& b, float sa, int64_t za, float sb, int64_t zb, float sc,
                      int64_t zc, int num_threads, const py::object& out) {
  require_eight_bit(a, "qlinear_add: a");
  if (is_u8(a)) return add_impl<uint8_t>(a, b, sa, za, sb, zb, sc, zc, num_threads, out);
  return add_impl<int8_t>(a, b, sa, za, sb, zb, sc, zc, num_threads, out);
}

py::array qlinear_mul(const py::handle& a, const py::handle& b, float ratio, int64_t za, int64_t zb, int64_t zc,
                      int num_threads, const py::object& out) {
  require_eight_bit(a, "qlinear_mul: a");
  if (is_u8(a)) return mul_impl<uint8_t>(a, b, ratio, za, zb, zc, num_threads, out);
  return mul_impl<int8_t>(a, b, ratio, za, zb, zc, num_threads, out);
}

// ---- lookup tables, softmax, concat ---------------------------------------------------------

template <typename T>
py::array lut_impl(const py::handle& x_obj, const py::handle& table_obj, int num_threads, const py::object& out_obj) {
  auto x = require_array<T>(x_obj, "lut8: x");
  auto table = require_array<T>(table_obj, "lut8: table");
  check_threads(num_threads, "lut8");
  if (table.ndim() != 1 || table.size() != 256) {
    throw py::value_error("lut8: table: expected shape (256,), got shape " + shape_str(shape_of(table)));
  }
  auto y = make_output<T>(out_obj, shape_of(x), "lut8", {x});
  const auto* xb = reinterpret_cast<const uint8_t*>(x.data());
  const auto* tb = reinterpret_cast<const uint8_t*>(table.data());
  auto* yb = reinterpret_cast<uint8_t*>(y.mutable_data());
  // int8 codes index the table by their bits: code v at entry uint8(v) (the caller builds
  // the table that way).
  run_or_record([=]() mutable { elementwise::lut_u8(xb, yb, x.size(), tb, num_threads, active_isa()); });
  return std::move(y);
}

py::array lut8(const py::handle& x, const py::handle& table, int num_threads, const py::object& out) {
  require_eight_bit(x, "lut8: x");
  if (is_u8(x)) return lut_impl<uint8_t>(x, table, num_threads, out);
  return lut_impl<int8_t>(x, table, num_threads, out);
}

template <typename T>
py::array lut_channels_impl(const py::handle& x_obj, const py::handle& tables_obj, int64_t axis, int num_threads,
                            const py::object& out_obj) {
  auto x = require_array<T>(x_obj, "lut8_channels: x");
  auto tables = require_array<T>(tables_obj, "lut8_channels: tables");
  check_threads(num_threads, "lut8_channels");
  const auto shape = shape_of(x);
  const int64_t rank = static_cast<int64_t>(shape.size());
  if (axis < 0 || axis >= rank) {
    throw py::value_error("lut8_channels: axis " + std::to_string(axis) + " is not an axis of x of shape " +
                          shape_str(shape));
  }
  const int64_t channels = shape[axis];
  if (tables.ndim() != 2 || tables.shape(0) != channels || tables.shape(1) != 256) {
    throw py::value_error("lut8_channels: tables: expected shape (" + std::to_string(channels) + ", 256), got shape " +
                          shape_str(shape_of(tables)));
  }
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= shape[d];
  for (int64_t d = axis + 1; d < rank; ++d) inner *= shape[d];
  auto y = make_output<T>(out_obj, shape, "lut8_channels", {x});
  const auto* xb = reinterpret_cast<const uint8_t*>(x.data());
  const auto* tb = reinterpret_cast<const uint8_t*>(tables.data());
  auto* yb = reinterpret_cast<uint8_t*>(y.mutable_data());
  run_or_record(
      [=]() mutable { elementwise::lut_u8_channels(xb, yb, outer, channels, inner, tb, num_threads, active_isa()); });
  return std::move(y);
}

py::array lut8_channels(const py::handle& x, const py::handle& tables, int64_t axis, int num_threads,
                        const py::object& out) {
  require_eight_bit(x, "lut8_channels: x");
  if (is_u8(x)) return lut_channels_impl<uint8_t>(x, tables, axis, num_threads, out);
  return lut_channels_impl<int8_t>(x, tables, axis, num_threads, out);
}

template <typename T>
py::array softmax_impl(const py::handle& x_obj, const py::handle& table_obj, float ys, int64_t zy, int num_threads,
                       const py::object& out_obj) {
  auto x = require_array<T>(x_obj, "qlinear_softmax_rows: x");
  auto table = require_array<float>(table_obj, "qlinear_softmax_rows: table");
  check_threads(num_threads, "qlinear_softmax_rows");
  if (x.ndim() != 2) {
    throw py::value_error("qlinear_softmax_rows: x: expected rank 2 [rows, D], got shape " + shape_str(shape_of(x)));
  }
  if (table.ndim() != 1 || table.size() != 256) {
    throw py::value_error("qlinear_softmax_rows: table: expected shape (256,), got shape " +
                          shape_str(shape_of(table)));
  }
  const int32_t z = check_zero_point<T>(zy, "qlinear_softmax_rows: y_zero_point");
  auto y = make_output<T>(out_obj, shape_of(x), "qlinear_softmax_rows", {x});
  run_or_record([=]() mutable {
    elementwise::qlinear_softmax_rows<T>(x.data(), y.mutable_data(), x.shape(0), x.shape(1), table.data(), ys, z,
                                         num_threads, active_isa());
  });
  return std::move(y);
}

py::array qlinear_softmax_rows(const py::handle& x, const py::handle& table, float ys, int64_t zy, int num_threads,
                               const py::object& out) {
  require_eight_bit(x, "qlinear_softmax_rows: x");
  if (is_u8(x)) return softmax_impl<uint8_t>(x, table, ys, zy, num_threads, out);
  return softmax_impl<int8_t>(x, table, ys, zy, num_threads, out);
}

// Concatenation along `axis`: input i is copied (table None) or mapped through its
// 256-entry table (the requantization q_y(dq_i(x)) evaluated on every code).
py::array qlinear_concat(const py::list& inputs, const py::list& tables, int64_t axis, const py::object& out_obj) {
  const size_t n = inputs.size();
  if (n == 0) throw py::value_error("qlinear_concat: inputs: expected at least one array, got none");
  if (tables.size() != n) {
    throw py::value_error("qlinear_concat: tables: expected one entry per input (" + std::to_string(n) + "), got " +
                          std::to_string(tables.size()));
  }
  require_eight_bit(inputs[0], "qlinear_concat: inputs[0]");
  const py::dtype dt = py::reinterpret_borrow<py::array>(inputs[0]).dtype();
  std::vector<py::array> xs;
  std::vector<const uint8_t*> tbl(n, nullptr);
  for (size_t i = 0; i < n; ++i) {
    const std::string what = "qlinear_concat: inputs[" + std::to_string(i) + "]";
    if (!py::isinstance<py::array>(inputs[i])) throw py::value_error(what + ": expected a numpy array");
    auto a = py::reinterpret_borrow<py::array>(inputs[i]);
    if (!dtype_equiv(a.dtype(), dt)) {
      throw py::value_error(what + ": expected dtype " + py::str(dt).cast<std::string>() + ", got " +
                            py::str(a.dtype()).cast<std::string>());
    }
    if (!(a.flags() & py::array::c_style)) throw py::value_error(what + ": expected a C-contiguous array");
    xs.push_back(a);
    if (!tables[i].is_none()) {
      const std::string tw = "qlinear_concat: tables[" + std::to_string(i) + "]";
      if (!py::isinstance<py::array>(tables[i])) throw py::value_error(tw + ": expected a numpy array or None");
      auto t = py::reinterpret_borrow<py::array>(tables[i]);
      if (!dtype_equiv(t.dtype(), dt) || t.ndim() != 1 || t.size() != 256 || !(t.flags() & py::array::c_style)) {
        throw py::value_error(tw + ": expected a contiguous (256,) array of the inputs' dtype");
      }
      tbl[i] = reinterpret_cast<const uint8_t*>(t.data());
    }
  }
  const int64_t rank = xs[0].ndim();
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) {
    throw py::value_error("qlinear_concat: axis: expected a value in [" + std::to_string(-rank) + ", " +
                          std::to_string(rank - 1) + "], got " + std::to_string(axis));
  }
  std::vector<py::ssize_t> out_shape = shape_of(xs[0]);
  out_shape[axis] = 0;
  for (size_t i = 0; i < n; ++i) {
    bool ok = xs[i].ndim() == rank;
    for (int64_t d = 0; ok && d < rank; ++d) ok = d == axis || xs[i].shape(d) == xs[0].shape(d);
    if (!ok) {
      throw py::value_error("qlinear_concat: inputs[" + std::to_string(i) + "]: expected the shape of inputs[0] " +
                            shape_str(shape_of(xs[0])) + " except on axis " + std::to_string(axis) + ", got " +
                            shape_str(shape_of(xs[i])));
    }
    out_shape[axis] += xs[i].shape(axis);
  }
  py::array y;
  if (out_obj.is_none()) {
    note_new_output();
    y = py::array(dt, out_shape);
  } else {
    if (!py::isinstance<py::array>(out_obj)) throw py::value_error("qlinear_concat: out: expected a numpy array");
    y = py::reinterpret_borrow<py::array>(out_obj);
    if (!dtype_equiv(y.dtype(), dt) || shape_of(y) != out_shape || !(y.flags() & py::array::c_style) ||
        !y.writeable()) {
      throw py::value_error("qlinear_concat: out: expected a writeable C-contiguous array of shape " +
                            shape_str(out_shape) + " and dtype " + py::str(dt).cast<std::string>());
    }
    for (const auto& a : xs) {
      if (overlaps(y, a)) {
        throw py::value_error("qlinear_concat: out: expected a buffer that does not overlap the inputs");
      }
    }
  }
  int64_t outer = 1;
  for (int64_t d = 0; d < axis; ++d) outer *= out_shape[d];
  int64_t tail = 1;
  for (int64_t d = axis + 1; d < rank; ++d) tail *= out_shape[d];
  std::vector<int64_t> inner(n);
  std::vector<const uint8_t*> src(n);
  for (size_t i = 0; i < n; ++i) {
    inner[i] = xs[i].shape(axis) * tail;
    src[i] = reinterpret_cast<const uint8_t*>(xs[i].data());
  }
  const int64_t row = out_shape[axis] * tail;
  auto* dst = reinterpret_cast<uint8_t*>(y.mutable_data());
  const Isa isa = active_isa();
  // the kept call holds the inputs', the tables' and y's addresses (the specialized call
  // holds the tables; docs/runtime.md "Native programs") and its own copies of the runs
  run_or_record([=]() {
    for (int64_t o = 0; o < outer; ++o) {
      uint8_t* d = dst + o * row;
      for (size_t i = 0; i < n; ++i) {
        const uint8_t* s = src[i] + o * inner[i];
        if (tbl[i] == nullptr) {
          if (inner[i]) std::memcpy(d, s, static_cast<size_t>(inner[i]));
        } else {
          elementwise::lut_u8(s, d, inner[i], tbl[i], 1, isa);
        }
        d += inner[i];
      }
    }
  });
  return y;
}

// ---- pooling ------------------------------------------------------------------------------

template <typename T>
py::array gap_impl(const py::handle& x_obj, float m, int64_t zx, int64_t zy, bool channels_last, int num_threads,
                   const py::object& out_obj) {
  auto x = require_array<T>(x_obj, "qlinear_global_average_pool: x");
  check_threads(num_threads, "qlinear_global_average_pool");
  if (x.ndim() < 3) {
    throw py::value_error("qlinear_global_average_pool: x: expected rank >= 3, got shape " + shape_str(shape_of(x)));
  }
  const int32_t zx32 = check_zero_point<T>(zx, "qlinear_global_average_pool: x_zero_point");
  const int32_t zy32 = check_zero_point<T>(zy, "qlinear_global_average_pool: y_zero_point");
  const int64_t rank = x.ndim();
  const int64_t n = x.shape(0);
  const int64_t c = channels_last ? x.shape(rank - 1) : x.shape(1);
  int64_t hw = 1;
  for (int64_t d = channels_last ? 1 : 2; d < (channels_last ? rank - 1 : rank); ++d) hw *= x.shape(d);
  std::vector<py::ssize_t> out_shape(static_cast<size_t>(rank), 1);
  out_shape[0] = n;
  out_shape[channels_last ? rank - 1 : 1] = c;
  auto y = make_output<T>(out_obj, out_shape, "qlinear_global_average_pool", {x});
  run_or_record([=]() mutable {
    pool::qlinear_global_average_pool<T>(x.data(), y.mutable_data(), n, c, hw, channels_last, m, zx32, zy32,
                                         num_threads, active_isa());
  });
  return std::move(y);
}

py::array qlinear_global_average_pool(const py::handle& x, float m, int64_t zx, int64_t zy, bool channels_last,
                                      int num_threads, const py::object& out) {
  require_eight_bit(x, "qlinear_global_average_pool: x");
  if (is_u8(x)) return gap_impl<uint8_t>(x, m, zx, zy, channels_last, num_threads, out);
  return gap_impl<int8_t>(x, m, zx, zy, channels_last, num_threads, out);
}

using Pair = PoolPair;

template <typename T>
py::array max_pool_impl(const py::handle& x_obj, const Pair& kernel, const Pair& strides, const Pair& dilations,
                        const Pair& pads_begin, const Pair& out_hw, int num_threads, const py::object& out_obj) {
  auto x = require_array<T>(x_obj, "max_pool_2d: x");
  check_threads(num_threads, "max_pool_2d");
  const pool::Geometry2d g = pool_geometry_2d(x, false, kernel, strides, dilations, pads_begin, out_hw, "max_pool_2d");
  auto y = make_output<T>(
      out_obj, {x.shape(0), x.shape(1), static_cast<py::ssize_t>(out_hw[0]), static_cast<py::ssize_t>(out_hw[1])},
      "max_pool_2d", {x});
  run_or_record([=]() mutable { pool::max_pool_2d<T>(x.data(), y.mutable_data(), g, num_threads, active_isa()); });
  return std::move(y);
}

py::array max_pool_2d(const py::handle& x, const Pair& kernel, const Pair& strides, const Pair& dilations,
                      const Pair& pads_begin, const Pair& out_hw, int num_threads, const py::object& out) {
  require_eight_bit(x, "max_pool_2d: x");
  if (is_u8(x)) return max_pool_impl<uint8_t>(x, kernel, strides, dilations, pads_begin, out_hw, num_threads, out);
  return max_pool_impl<int8_t>(x, kernel, strides, dilations, pads_begin, out_hw, num_threads, out);
}

template <typename T>
py::array average_pool_impl(const py::handle& x_obj, const Pair& kernel, const Pair& strides, const Pair& pads_begin,
                            const Pair& out_hw, float sx, int64_t zx, float sy, int64_t zy, bool count_include_pad,
                            int num_threads, const py::object& out_obj) {
  auto x = require_array<T>(x_obj, "qlinear_average_pool_2d: x");
  check_threads(num_threads, "qlinear_average_pool_2d");
  const pool::Geometry2d g =
      pool_geometry_2d(x, false, kernel, strides, Pair{1, 1}, pads_begin, out_hw, "qlinear_average_pool_2d");
  const pool::AverageParams p{sx, sy, check_zero_point<T>(zx, "qlinear_average_pool_2d: x_zero_point"),
                              check_zero_point<T>(zy, "qlinear_average_pool_2d: y_zero_point"), count_include_pad};
  auto y = make_output<T>(
      out_obj, {x.shape(0), x.shape(1), static_cast<py::ssize_t>(out_hw[0]), static_cast<py::ssize_t>(out_hw[1])},
      "qlinear_average_pool_2d", {x});
  run_or_record(
      [=]() mutable { pool::qlinear_average_pool_2d<T>(x.data(), y.mutable_data(), g, p, num_threads, active_isa()); });
  return std::move(y);
}

py::array qlinear_average_pool_2d(const py::handle& x, const Pair& kernel, const Pair& strides, const Pair& pads_begin,
                                  const Pair& out_hw, float sx, int64_t zx, float sy, int64_t zy,
                                  bool count_include_pad, int num_threads, const py::object& out) {
  require_eight_bit(x, "qlinear_average_pool_2d: x");
  if (is_u8(x)) {
    return average_pool_impl<uint8_t>(x, kernel, strides, pads_begin, out_hw, sx, zx, sy, zy, count_include_pad,
                                      num_threads, out);
  }
  return average_pool_impl<int8_t>(x, kernel, strides, pads_begin, out_hw, sx, zx, sy, zy, count_include_pad,
                                   num_threads, out);
}

}  // namespace

void register_elementwise(py::module_& m) {
  using py::arg;
  const auto none = py::none();
  m.def("dequantize_linear", &dequantize_linear, arg("x"), arg("scale"), arg("zero_point"), arg("axis") = 1,
        arg("num_threads") = 1, arg("out") = none,
        "DequantizeLinear u8/i8 -> f32, per-tensor or per-axis: y = f32(float32(x - zp) * scale).");
  m.def("dynamic_quantize_linear", &dynamic_quantize_linear, arg("x"), arg("num_threads") = 1,
        "DynamicQuantizeLinear f32 -> (y u8, scale f32, zero_point u8), as quantize.py (eq. (10)).");
  m.def("dynamic_quantize_linear_into", &dynamic_quantize_linear_into, arg("x"), arg("y"), arg("scale"),
        arg("zero_point"), arg("num_threads") = 1,
        "DynamicQuantizeLinear f32 -> (y u8, scale f32, zero_point u8) written into the given arrays "
        "(y of x's shape, one value each for scale and zero_point); recordable into a native program.");
  m.def("qlinear_add", &qlinear_add, arg("a"), arg("b"), arg("a_scale"), arg("a_zero_point"), arg("b_scale"),
        arg("b_zero_point"), arg("c_scale"), arg("c_zero_point"), arg("num_threads") = 1, arg("out") = none,
        "com.microsoft QLinearAdd (MLAS portable float32 steps), numpy broadcasting.");
  m.def("qlinear_mul", &qlinear_mul, arg("a"), arg("b"), arg("ratio"), arg("a_zero_point"), arg("b_zero_point"),
        arg("c_zero_point"), arg("num_threads") = 1, arg("out") = none,
        "com.microsoft QLinearMul, ratio = f32(f32(sa * sb) / sc), numpy broadcasting.");
  m.def("lut8", &lut8, arg("x"), arg("table"), arg("num_threads") = 1, arg("out") = none,
        "y = table[uint8 bits of x] (256-entry lookup table).");
  m.def("lut8_channels", &lut8_channels, arg("x"), arg("tables"), arg("axis"), arg("num_threads") = 1,
        arg("out") = none, "y = tables[channel along axis][uint8 bits of x] (a 256-entry table per channel).");
  m.def("qlinear_softmax_rows", &qlinear_softmax_rows, arg("x"), arg("table"), arg("ys"), arg("y_zero_point"),
        arg("num_threads") = 1, arg("out") = none, "com.microsoft QLinearSoftmax over the rows of x [rows, D].");
  m.def("qlinear_concat", &qlinear_concat, arg("inputs"), arg("tables"), arg("axis"), arg("out") = none,
        "Concatenate 8-bit tensors, each copied (table None) or mapped through its table.");
  m.def("qlinear_global_average_pool", &qlinear_global_average_pool, arg("x"), arg("multiplier"), arg("x_zero_point"),
        arg("y_zero_point"), arg("channels_last") = false, arg("num_threads") = 1, arg("out") = none,
        "com.microsoft QLinearGlobalAveragePool (integer sum, eq. (6)).");
  m.def("max_pool_2d", &max_pool_2d, arg("x"), arg("kernel"), arg("strides"), arg("dilations"), arg("pads_begin"),
        arg("out_hw"), arg("num_threads") = 1, arg("out") = none, "MaxPool on uint8/int8 NCHW (no indices).");
  m.def("qlinear_average_pool_2d", &qlinear_average_pool_2d, arg("x"), arg("kernel"), arg("strides"), arg("pads_begin"),
        arg("out_hw"), arg("x_scale"), arg("x_zero_point"), arg("y_scale"), arg("y_zero_point"),
        arg("count_include_pad") = false, arg("num_threads") = 1, arg("out") = none,
        "com.microsoft QLinearAveragePool, 2-D NCHW.");
}

}  // namespace quanta
