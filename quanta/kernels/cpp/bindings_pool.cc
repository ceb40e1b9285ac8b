// Bindings for the channels-last pooling kernels (pool/pool.h); the NCHW pooling
// bindings live with the elementwise family (bindings_elementwise.cc).
//
//   max_pool_2d_nhwc(x [N,H,W,C] u8|i8, kernel, strides, dilations, pads_begin, out_hw,
//                    num_threads=1, out=None) -> y [N, OH, OW, C]
//   max_pool_2d_f32(x [N,C,H,W] f32, kernel, strides, dilations, pads_begin, out_hw,
//                   num_threads=1, out=None) -> y [N, C, OH, OW]
//   average_pool_2d_f32(x [N,C,H,W] f32, kernel, strides, dilations, pads_begin, pads_end,
//                       out_hw, count_include_pad, num_threads=1, out=None) -> y [N, C, OH, OW]
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>

#include "bindings.h"
#include "bindings_pool.h"
#include "dispatch.h"
#include "pool/pool.h"

namespace quanta {
namespace {

using Pair = PoolPair;

template <typename T>
py::array max_pool_nhwc_impl(const py::handle& x_obj, const Pair& kernel, const Pair& strides, const Pair& dilations,
                             const Pair& pads_begin, const Pair& out_hw, int num_threads, const py::object& out_obj) {
  const char* op = "max_pool_2d_nhwc";
  auto x = require_array<T>(x_obj, "max_pool_2d_nhwc: x");
  check_threads(num_threads, op);
  const pool::Geometry2d g = pool_geometry_2d(x, true, kernel, strides, dilations, pads_begin, out_hw, op);
  const py::ssize_t c = x.shape(3);
  auto y = make_output<T>(
      out_obj, {x.shape(0), static_cast<py::ssize_t>(out_hw[0]), static_cast<py::ssize_t>(out_hw[1]), c}, op, {x});
  {
    py::gil_scoped_release release;
    pool::max_pool_2d_nhwc<T>(x.data(), y.mutable_data(), g, c, num_threads, active_isa());
  }
  return std::move(y);
}

py::array max_pool_2d_nhwc(const py::handle& x, const Pair& kernel, const Pair& strides, const Pair& dilations,
                           const Pair& pads_begin, const Pair& out_hw, int num_threads, const py::object& out) {
  if (!py::isinstance<py::array>(x)) throw py::value_error("max_pool_2d_nhwc: x: expected a numpy array");
  const py::dtype dt = py::reinterpret_borrow<py::array>(x).dtype();
  if (dt.is(py::dtype::of<uint8_t>())) {
    return max_pool_nhwc_impl<uint8_t>(x, kernel, strides, dilations, pads_begin, out_hw, num_threads, out);
  }
  if (dt.is(py::dtype::of<int8_t>())) {
    return max_pool_nhwc_impl<int8_t>(x, kernel, strides, dilations, pads_begin, out_hw, num_threads, out);
  }
  throw py::value_error("max_pool_2d_nhwc: x: expected dtype uint8 or int8, got " + py::str(dt).cast<std::string>());
}

// NCHW float32 MaxPool (pool.h max_pool_2d_f32): x [N, C, H, W] -> y [N, C, OH, OW].
py::array max_pool_2d_f32(const py::handle& x_obj, const Pair& kernel, const Pair& strides, const Pair& dilations,
                          const Pair& pads_begin, const Pair& out_hw, int num_threads, const py::object& out_obj) {
  const char* op = "max_pool_2d_f32";
  auto x = require_array<float>(x_obj, "max_pool_2d_f32: x");
  check_threads(num_threads, op);
  const pool::Geometry2d g = pool_geometry_2d(x, false, kernel, strides, dilations, pads_begin, out_hw, op);
  auto y = make_output<float>(
      out_obj, {x.shape(0), x.shape(1), static_cast<py::ssize_t>(out_hw[0]), static_cast<py::ssize_t>(out_hw[1])}, op,
      {x});
  if (y.size() == 0) return std::move(y);
  // recordable (bindings.h run_or_record): the call keeps pointers and the geometry only
  const float* xp = x.data();
  float* yp = y.mutable_data();
  const Isa isa = active_isa();
  run_or_record([=]() { pool::max_pool_2d_f32(xp, yp, g, num_threads, isa); });
  return std::move(y);
}

// NCHW float32 AveragePool (pool.h average_pool_2d_f32): x [N, C, H, W] -> y [N, C, OH, OW].
py::array average_pool_2d_f32(const py::handle& x_obj, const Pair& kernel, const Pair& strides, const Pair& dilations,
                              const Pair& pads_begin, const Pair& pads_end, const Pair& out_hw, bool count_include_pad,
                              int num_threads, const py::object& out_obj) {
  const char* op = "average_pool_2d_f32";
  auto x = require_array<float>(x_obj, "average_pool_2d_f32: x");
  check_threads(num_threads, op);
  const pool::Geometry2d g = pool_geometry_2d(x, false, kernel, strides, dilations, pads_begin, out_hw, op);
  if (pads_end[0] < 0 || pads_end[1] < 0) throw py::value_error(std::string(op) + ": expected pads_end >= 0");
  auto y = make_output<float>(
      out_obj, {x.shape(0), x.shape(1), static_cast<py::ssize_t>(out_hw[0]), static_cast<py::ssize_t>(out_hw[1])}, op,
      {x});
  if (y.size() == 0) return std::move(y);
  // recordable (bindings.h run_or_record): the call keeps pointers, the geometry and the
  // end pads only
  const float* xp = x.data();
  float* yp = y.mutable_data();
  const int64_t end_h = pads_end[0], end_w = pads_end[1];
  run_or_record([=]() { pool::average_pool_2d_f32(xp, yp, g, end_h, end_w, count_include_pad, num_threads); });
  return std::move(y);
}

}  // namespace

void register_pool(py::module_& m) {
  m.def("max_pool_2d_f32", &max_pool_2d_f32, py::arg("x"), py::arg("kernel"), py::arg("strides"), py::arg("dilations"),
        py::arg("pads_begin"), py::arg("out_hw"), py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "NCHW MaxPool on float32 (pool/pool.h max_pool_2d_f32).");
  m.def("average_pool_2d_f32", &average_pool_2d_f32, py::arg("x"), py::arg("kernel"), py::arg("strides"),
        py::arg("dilations"), py::arg("pads_begin"), py::arg("pads_end"), py::arg("out_hw"),
        py::arg("count_include_pad"), py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "NCHW AveragePool on float32, docs/float-ops.md (AP1)-(AP3) (pool/pool.h average_pool_2d_f32).");
  m.def("max_pool_2d_nhwc", &max_pool_2d_nhwc, py::arg("x"), py::arg("kernel"), py::arg("strides"),
        py::arg("dilations"), py::arg("pads_begin"), py::arg("out_hw"), py::arg("num_threads") = 1,
        py::arg("out") = py::none(), "Channels-last MaxPool on uint8/int8 (pool/pool.h).");
}

}  // namespace quanta
