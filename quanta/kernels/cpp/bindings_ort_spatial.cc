// Bindings for ONNX Runtime's float spatial orders (ort_spatial/ort_spatial.h):
//
//   ort_resize_linear_f32(x [..., H, W] f32, y1, y2 [n_h] i32, dy1, dy2 [n_h] f32,
//                         x1, x2 [n_w] i32, dx1, dx2 [n_w] f32, num_threads=1, out=None)
//       -> y [..., n_h, n_w]        (RB1) taps from the twin's ort_bilinear_axis
//   mlas_average_pool_f32(x [N, C, spatial...] f32 (1-3 spatial axes), kernel, strides,
//                         pads_begin, out_sizes, count_include_pad, vector=False,
//                         num_threads=1, out=None) -> y [N, C, out_sizes...]
//       MlasPool's generic order, or its vector order (vector=True, 2-D pools only)
#include <pybind11/stl.h>

#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "dispatch.h"
#include "ort_spatial/ort_spatial.h"

namespace quanta {
namespace {

// A 1-D tap array of n values copied out (the recorded call keeps its own copy), each
// index inside [0, limit) when `limit` > 0.
template <typename T>
std::vector<T> taps(const py::handle& obj, int64_t n, int64_t limit, const char* what) {
  auto a = require_array<T>(obj, what);
  if (a.ndim() != 1 || a.shape(0) != n) {
    throw py::value_error(std::string(what) + ": expected shape (" + std::to_string(n) + ",), got shape " +
                          shape_str(shape_of(a)));
  }
  std::vector<T> v(a.data(), a.data() + n);
  if (limit > 0) {
    for (const T i : v) {
      if (static_cast<int64_t>(i) < 0 || static_cast<int64_t>(i) >= limit) {
        throw py::value_error(std::string(what) + ": expected indices in [0, " + std::to_string(limit) + "), got " +
                              std::to_string(static_cast<int64_t>(i)));
      }
    }
  }
  return v;
}

py::array ort_resize_linear_f32(const py::handle& x_obj, const py::handle& y1_obj, const py::handle& y2_obj,
                                const py::handle& dy1_obj, const py::handle& dy2_obj, const py::handle& x1_obj,
                                const py::handle& x2_obj, const py::handle& dx1_obj, const py::handle& dx2_obj,
                                int num_threads, const py::object& out_obj) {
  const char* op = "ort_resize_linear_f32";
  auto x = require_array<float>(x_obj, "ort_resize_linear_f32: x");
  check_threads(num_threads, op);
  if (x.ndim() < 2)
    throw py::value_error(std::string(op) + ": x: expected rank >= 2, got rank " + std::to_string(x.ndim()));
  const int64_t h = x.shape(x.ndim() - 2), w = x.shape(x.ndim() - 1);
  auto y1_arr = require_array<int32_t>(y1_obj, "ort_resize_linear_f32: y1");
  auto x1_arr = require_array<int32_t>(x1_obj, "ort_resize_linear_f32: x1");
  if (y1_arr.ndim() != 1 || x1_arr.ndim() != 1) throw py::value_error(std::string(op) + ": expected 1-D taps");
  const int64_t n_h = y1_arr.shape(0), n_w = x1_arr.shape(0);
  auto y1 = taps<int32_t>(y1_obj, n_h, h, "ort_resize_linear_f32: y1");
  auto y2 = taps<int32_t>(y2_obj, n_h, h, "ort_resize_linear_f32: y2");
  auto dy1 = taps<float>(dy1_obj, n_h, 0, "ort_resize_linear_f32: dy1");
  auto dy2 = taps<float>(dy2_obj, n_h, 0, "ort_resize_linear_f32: dy2");
  auto x1 = taps<int32_t>(x1_obj, n_w, w, "ort_resize_linear_f32: x1");
  auto x2 = taps<int32_t>(x2_obj, n_w, w, "ort_resize_linear_f32: x2");
  auto dx1 = taps<float>(dx1_obj, n_w, 0, "ort_resize_linear_f32: dx1");
  auto dx2 = taps<float>(dx2_obj, n_w, 0, "ort_resize_linear_f32: dx2");
  Shape shape = shape_of(x);
  shape[shape.size() - 2] = static_cast<py::ssize_t>(n_h);
  shape[shape.size() - 1] = static_cast<py::ssize_t>(n_w);
  auto y = make_output<float>(out_obj, shape, op, {x});
  if (y.size() == 0) return std::move(y);
  const int64_t planes = h * w > 0 ? x.size() / (h * w) : 0;
  if (planes == 0 || h == 0 || w == 0) throw py::value_error(std::string(op) + ": x: expected a non-empty input");
  // recordable (bindings.h run_or_record): the call keeps pointers and its own tap copies
  const float* xp = x.data();
  float* yp = y.mutable_data();
  const Isa isa = active_isa();
  run_or_record([=]() {
    const ort_spatial::ResizeTaps t{n_h,        n_w,       y1.data(), y2.data(),  dy1.data(),
                                    dy2.data(), x1.data(), x2.data(), dx1.data(), dx2.data()};
    ort_spatial::ort_resize_linear(xp, yp, planes, h, w, t, num_threads, isa);
  });
  return std::move(y);
}

py::array mlas_average_pool_f32(const py::handle& x_obj, const std::vector<int64_t>& kernel,
                                const std::vector<int64_t>& strides, const std::vector<int64_t>& pads_begin,
                                const std::vector<int64_t>& out_sizes, bool count_include_pad, bool vector,
                                int num_threads, const py::object& out_obj) {
  const char* op = "mlas_average_pool_f32";
  auto x = require_array<float>(x_obj, "mlas_average_pool_f32: x");
  check_threads(num_threads, op);
  const int d = static_cast<int>(x.ndim()) - 2;
  if (d < 1 || d > 3) {
    throw py::value_error(std::string(op) + ": x: expected rank 3 to 5 [N, C, spatial...], got shape " +
                          shape_str(shape_of(x)));
  }
  const size_t nd = static_cast<size_t>(d);
  if (kernel.size() != nd || strides.size() != nd || pads_begin.size() != nd || out_sizes.size() != nd) {
    throw py::value_error(std::string(op) + ": expected kernel, strides, pads_begin and out_sizes of " +
                          std::to_string(d) + " values each");
  }
  if (vector && d != 2)
    throw py::value_error(std::string(op) + ": vector: expected a 2-D pool, got " + std::to_string(d) + "-D");
  ort_spatial::PoolGeometry g{};
  g.planes = x.shape(0) * x.shape(1);
  Shape shape = {x.shape(0), x.shape(1)};
  for (int a = 0; a < 3; ++a) {
    const int i = a - (3 - d);  // the pool's axis, or < 0 for a leading axis of size 1
    if (i < 0) {
      g.size[a] = g.out[a] = g.kernel[a] = g.strides[a] = 1;
      g.pads[a] = 0;
      continue;
    }
    const size_t u = static_cast<size_t>(i);
    g.size[a] = x.shape(2 + i);
    g.out[a] = out_sizes[u];
    g.kernel[a] = kernel[u];
    g.strides[a] = strides[u];
    g.pads[a] = pads_begin[u];
    if (g.kernel[a] < 1 || g.strides[a] < 1 || g.pads[a] < 0 || g.out[a] < 1) {
      throw py::value_error(std::string(op) + ": expected kernel, strides, out_sizes >= 1 and pads >= 0");
    }
    if ((g.out[a] - 1) * g.strides[a] - g.pads[a] >= g.size[a]) {
      throw py::value_error(std::string(op) + ": expected the last window to start inside the input on axis " +
                            std::to_string(2 + i));
    }
    shape.push_back(static_cast<py::ssize_t>(g.out[a]));
  }
  auto y = make_output<float>(out_obj, shape, op, {x});
  if (y.size() == 0) return std::move(y);
  // recordable (bindings.h run_or_record): the call keeps pointers and the geometry only
  const float* xp = x.data();
  float* yp = y.mutable_data();
  const Isa isa = active_isa();
  run_or_record([=]() { ort_spatial::mlas_average_pool(xp, yp, g, count_include_pad, vector, num_threads, isa); });
  return std::move(y);
}

}  // namespace

void register_ort_spatial(py::module_& m) {
  m.def("ort_resize_linear_f32", &ort_resize_linear_f32, py::arg("x"), py::arg("y1"), py::arg("y2"), py::arg("dy1"),
        py::arg("dy2"), py::arg("x1"), py::arg("x2"), py::arg("dx1"), py::arg("dx2"), py::arg("num_threads") = 1,
        py::arg("out") = py::none(),
        "ONNX Runtime's float32 bilinear Resize, docs/float-ops.md (RB1)-(RB3) (ort_spatial/ort_spatial.h).");
  m.def(
      "mlas_average_pool_f32", &mlas_average_pool_f32, py::arg("x"), py::arg("kernel"), py::arg("strides"),
      py::arg("pads_begin"), py::arg("out_sizes"), py::arg("count_include_pad"), py::arg("vector") = false,
      py::arg("num_threads") = 1, py::arg("out") = py::none(),
      "MlasPool's generic or vector AveragePool order, docs/float-ops.md (AP-M2)-(AP-M4) (ort_spatial/ort_spatial.h).");
}

}  // namespace quanta
