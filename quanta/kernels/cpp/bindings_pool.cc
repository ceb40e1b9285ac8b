// Bindings for the channels-last pooling kernels (pool/pool.h); the NCHW pooling
// bindings live with the elementwise family (bindings_elementwise.cc).
//
//   max_pool_2d_nhwc(x [N,H,W,C] u8|i8, kernel, strides, dilations, pads_begin, out_hw,
//                    num_threads=1, out=None) -> y [N, OH, OW, C]
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>

#include "bindings.h"
#include "dispatch.h"
#include "pool/pool.h"

namespace quanta {
namespace {

using Pair = std::array<int64_t, 2>;

std::string shape_text(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + ")";
}

template <typename T>
py::array max_pool_nhwc_impl(const py::handle& x_obj, const Pair& kernel, const Pair& strides, const Pair& dilations,
                             const Pair& pads_begin, const Pair& out_hw, int num_threads, const py::object& out_obj) {
  const char* op = "max_pool_2d_nhwc";
  auto x = require_array<T>(x_obj, "max_pool_2d_nhwc: x");
  if (x.ndim() != 4) {
    throw py::value_error(std::string(op) + ": x: expected rank 4 [N, H, W, C], got shape " + shape_text(x));
  }
  if (num_threads < 1) throw py::value_error(std::string(op) + ": num_threads: expected >= 1");
  for (int i = 0; i < 2; ++i) {
    if (kernel[i] < 1 || strides[i] < 1 || dilations[i] < 1) {
      throw py::value_error(std::string(op) + ": expected kernel, strides and dilations >= 1");
    }
    if (pads_begin[i] < 0 || out_hw[i] < 0) throw py::value_error(std::string(op) + ": expected pads and sizes >= 0");
    const int64_t size = x.shape(1 + i);
    if (out_hw[i] > 0 && (out_hw[i] - 1) * strides[i] - pads_begin[i] >= size) {
      throw py::value_error(std::string(op) + ": expected the last window to start inside the input on axis " +
                            std::to_string(1 + i));
    }
  }
  const py::ssize_t n = x.shape(0), c = x.shape(3);
  const std::array<py::ssize_t, 4> shape{n, static_cast<py::ssize_t>(out_hw[0]), static_cast<py::ssize_t>(out_hw[1]),
                                         c};
  py::array_t<T, py::array::c_style> y;
  if (out_obj.is_none()) {
    y = py::array_t<T, py::array::c_style>(std::vector<py::ssize_t>(shape.begin(), shape.end()));
  } else {
    y = require_array<T>(out_obj, "max_pool_2d_nhwc: out");
    bool same = y.ndim() == 4 && y.writeable();
    for (int i = 0; same && i < 4; ++i) same = y.shape(i) == shape[i];
    if (!same) {
      throw py::value_error(std::string(op) + ": out: expected a writeable array of shape (" + std::to_string(n) +
                            ", " + std::to_string(out_hw[0]) + ", " + std::to_string(out_hw[1]) + ", " +
                            std::to_string(c) + "), got " + shape_text(y));
    }
    const auto* xs = reinterpret_cast<const uint8_t*>(x.data());
    const auto* ys = reinterpret_cast<const uint8_t*>(y.data());
    if (x.nbytes() && y.nbytes() && xs < ys + y.nbytes() && ys < xs + x.nbytes()) {
      throw py::value_error(std::string(op) + ": out overlaps x");
    }
  }
  const pool::Geometry2d g{n,          x.shape(1), x.shape(2),   out_hw[0],    out_hw[1],     kernel[0],    kernel[1],
                           strides[0], strides[1], dilations[0], dilations[1], pads_begin[0], pads_begin[1]};
  {
    py::gil_scoped_release release;
    pool::max_pool_2d_nhwc<T>(x.data(), y.mutable_data(), g, c, num_threads);
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
  const std::string op = "max_pool_2d_f32";
  auto x = require_array<float>(x_obj, "max_pool_2d_f32: x");
  if (x.ndim() != 4) throw py::value_error(op + ": x: expected rank 4 [N, C, H, W], got shape " + shape_text(x));
  check_threads(num_threads, op);
  for (int i = 0; i < 2; ++i) {
    if (kernel[i] < 1 || strides[i] < 1 || dilations[i] < 1) {
      throw py::value_error(op + ": expected kernel, strides and dilations >= 1");
    }
    if (pads_begin[i] < 0 || out_hw[i] < 0) throw py::value_error(op + ": expected pads and sizes >= 0");
  }
  const Shape shape{x.shape(0), x.shape(1), static_cast<py::ssize_t>(out_hw[0]), static_cast<py::ssize_t>(out_hw[1])};
  py::array_t<float, py::array::c_style> y;
  if (out_obj.is_none()) {
    y = py::array_t<float, py::array::c_style>(shape);
  } else {
    y = require_array<float>(out_obj, "max_pool_2d_f32: out");
    if (shape_of(y) != shape || !y.writeable()) {
      throw py::value_error(op + ": out: expected a writeable array of shape " + shape_str(shape) + ", got " +
                            shape_text(y));
    }
    if (overlaps(x, y)) throw py::value_error(op + ": out overlaps x");
  }
  const pool::Geometry2d g{x.shape(0) * x.shape(1),
                           x.shape(2),
                           x.shape(3),
                           out_hw[0],
                           out_hw[1],
                           kernel[0],
                           kernel[1],
                           strides[0],
                           strides[1],
                           dilations[0],
                           dilations[1],
                           pads_begin[0],
                           pads_begin[1]};
  if (y.size() == 0) return std::move(y);
  {
    py::gil_scoped_release release;
    pool::max_pool_2d_f32(x.data(), y.mutable_data(), g, num_threads);
  }
  return std::move(y);
}

}  // namespace

void register_pool(py::module_& m) {
  m.def("max_pool_2d_f32", &max_pool_2d_f32, py::arg("x"), py::arg("kernel"), py::arg("strides"), py::arg("dilations"),
        py::arg("pads_begin"), py::arg("out_hw"), py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "NCHW MaxPool on float32 (pool/pool.h max_pool_2d_f32).");
  m.def("max_pool_2d_nhwc", &max_pool_2d_nhwc, py::arg("x"), py::arg("kernel"), py::arg("strides"),
        py::arg("dilations"), py::arg("pads_begin"), py::arg("out_hw"), py::arg("num_threads") = 1,
        py::arg("out") = py::none(), "Channels-last MaxPool on uint8/int8 (pool/pool.h).");
}

}  // namespace quanta
