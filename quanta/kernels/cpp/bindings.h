// Binding boundary helpers: every kernel entry point checks dtype, contiguity, shape
// and parameter lengths here and raises a Python ValueError naming the argument and
// what was expected, before any pointer reaches a kernel.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <sstream>
#include <stdexcept>
#include <cstdint>
#include <string>
#include <vector>

namespace quanta {
namespace py = pybind11;

// One registration function per kernel family (bindings_<family>.cc).
void register_quantize(py::module_& m);
void register_qgemm(py::module_& m);
void register_gemm(py::module_& m);
void register_elementwise(py::module_& m);
void register_conv(py::module_& m);
void register_layout(py::module_& m);
void register_float_ops(py::module_& m);
void register_pool(py::module_& m);
void register_recurrent(py::module_& m);
void register_tensor_ops(py::module_& m);
void register_sgemm(py::module_& m);
void register_tuner(py::module_& m);
void register_intonly(py::module_& m);
void register_a16w8(py::module_& m);
void register_w4(py::module_& m);
void register_bf16(py::module_& m);
void register_mx(py::module_& m);

// Shapes, thread counts and output aliasing, checked the same way (and named in the same
// words) by every binding family.
using Shape = std::vector<py::ssize_t>;

inline Shape shape_of(const py::array& a) { return {a.shape(), a.shape() + a.ndim()}; }

// As Python prints a tuple: (2, 3), (4,), ().
inline std::string shape_str(const Shape& shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    s += std::to_string(shape[i]);
    if (shape.size() == 1 || i + 1 < shape.size()) s += shape.size() == 1 ? "," : ", ";
  }
  return s + ")";
}

inline void check_threads(int num_threads, const std::string& op) {
  if (num_threads < 1) {
    throw py::value_error(op + ": num_threads: expected >= 1, got " + std::to_string(num_threads));
  }
}

inline bool overlaps(const py::array& a, const py::array& b) {
  const auto pa = reinterpret_cast<uintptr_t>(a.data()), pb = reinterpret_cast<uintptr_t>(b.data());
  const auto na = static_cast<uintptr_t>(a.nbytes()), nb = static_cast<uintptr_t>(b.nbytes());
  return na && nb && pa < pb + nb && pb < pa + na;
}

template <typename T>
py::array_t<T, py::array::c_style> require_array(const py::handle& obj, const char* what) {
  if (!py::isinstance<py::array>(obj)) {
    throw py::value_error(std::string(what) + ": expected a numpy array");
  }
  auto arr = py::reinterpret_borrow<py::array>(obj);
  if (!arr.dtype().is(py::dtype::of<T>())) {
    std::ostringstream os;
    os << what << ": expected dtype " << py::str(py::dtype::of<T>()).cast<std::string>() << ", got "
       << py::str(arr.dtype()).cast<std::string>();
    throw py::value_error(os.str());
  }
  if (!(arr.flags() & py::array::c_style)) {
    throw py::value_error(std::string(what) + ": expected a C-contiguous array");
  }
  return py::reinterpret_borrow<py::array_t<T, py::array::c_style>>(arr);
}

}  // namespace quanta
