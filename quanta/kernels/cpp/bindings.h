// Binding boundary helpers: every kernel entry point checks dtype, contiguity, shape
// and parameter lengths here and raises a Python ValueError naming the argument and
// what was expected, before any pointer reaches a kernel.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <sstream>
#include <stdexcept>
#include <string>

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
