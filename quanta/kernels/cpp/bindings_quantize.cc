// Bindings for QuantizeLinear (quantize/quantize.h).
//
//   quantize_linear_u8 / _s8 / _u16 / _s16(x: f32, scale: f32[C], zero_point: i32[C], axis=1,
//                                          num_threads=1, out=None) -> u8 / i8 / u16 / i16 of x's shape
//   per-tensor when C == 1 (and scale has rank <= 1), else per-axis along `axis`; `out`, when
//   given, is a C-contiguous writeable array of x's shape and the output dtype (not
//   overlapping x) that receives the result and is returned.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "bindings.h"
#include "quantize/quantize.h"

namespace quanta {
namespace {

template <typename T>
py::array_t<T, py::array::c_style> quantize_impl(const py::handle& x_obj, const py::handle& scale_obj,
                                                 const py::handle& zp_obj, int64_t axis, int num_threads,
                                                 const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "quantize_linear: x");
  auto scale = require_array<float>(scale_obj, "quantize_linear: scale");
  auto zp = require_array<int32_t>(zp_obj, "quantize_linear: zero_point");
  const int64_t ndim = x.ndim();
  const int64_t channels = scale.size();
  if (zp.size() != channels) {
    throw py::value_error("quantize_linear: zero_point has " + std::to_string(zp.size()) + " elements but scale has " +
                          std::to_string(channels));
  }
  const auto [outer, inner] = axis_runs(x, channels, scale.ndim(), axis, "quantize_linear");
  const float* s = scale.data();
  for (int64_t c = 0; c < channels; ++c) {
    if (!(s[c] > 0.0f)) throw py::value_error("quantize_linear: scale must be positive and finite");
  }
  if (num_threads < 1) {
    throw py::value_error("quantize_linear: num_threads: expected >= 1, got " + std::to_string(num_threads));
  }
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + ndim);
  py::array_t<T, py::array::c_style> y;
  if (out_obj.is_none()) {
    y = py::array_t<T, py::array::c_style>(shape);
  } else {
    y = require_array<T>(out_obj, "quantize_linear: out");
    if (y.ndim() != ndim || !std::equal(shape.begin(), shape.end(), y.shape())) {
      throw py::value_error("quantize_linear: out: expected the shape of x");
    }
    if (!y.writeable()) throw py::value_error("quantize_linear: out: expected a writeable array");
    const auto yb = reinterpret_cast<uintptr_t>(y.data()), xb = reinterpret_cast<uintptr_t>(x.data());
    if (y.nbytes() > 0 && x.nbytes() > 0 && yb < xb + x.nbytes() && xb < yb + y.nbytes()) {
      throw py::value_error("quantize_linear: out: expected a buffer that does not overlap x");
    }
  }
  QuantizeParams p{s, zp.data(), outer, channels, inner};
  {
    py::gil_scoped_release release;
    quantize_linear<T>(x.data(), y.mutable_data(), p, active_isa(), num_threads);
  }
  return y;
}

}  // namespace

void register_quantize(py::module_& m) {
  m.def("quantize_linear_u8", &quantize_impl<uint8_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to uint8 (ONNX semantics, round half to even).");
  m.def("quantize_linear_s8", &quantize_impl<int8_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to int8 (ONNX semantics, round half to even).");
  m.def("quantize_linear_u16", &quantize_impl<uint16_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to uint16 (ONNX semantics, round half to even).");
  m.def("quantize_linear_s16", &quantize_impl<int16_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to int16 (ONNX semantics, round half to even).");
}

}  // namespace quanta
