// Bindings for the layout kernels (layout/transpose.h).
//
//   transpose_batched(x, batch, rows, cols, num_threads=1, out=None) -> y
//     x: a C-contiguous array holding batch·rows·cols elements of any fixed-size dtype
//     whose itemsize divides evenly (the element is x.nbytes / (batch·rows·cols) bytes);
//     y (new, or `out`: C-contiguous, same dtype and size, not overlapping x) holds
//     [batch, cols, rows] of those elements, returned in out's shape (or x's size, flat).
#include <cstdint>
#include <string>

#include "bindings.h"
#include "layout/transpose.h"

namespace quanta {
namespace {

py::array transpose_impl(const py::handle& x_obj, int64_t batch, int64_t rows, int64_t cols, int num_threads,
                         const py::object& out_obj) {
  if (!py::isinstance<py::array>(x_obj)) throw py::value_error("transpose_batched: x: expected a numpy array");
  auto x = py::reinterpret_borrow<py::array>(x_obj);
  if (!(x.flags() & py::array::c_style)) throw py::value_error("transpose_batched: x: expected a C-contiguous array");
  if (batch < 0 || rows < 0 || cols < 0) throw py::value_error("transpose_batched: negative dimension");
  if (num_threads < 1) throw py::value_error("transpose_batched: num_threads must be >= 1");
  const int64_t n = batch * rows * cols;
  const int64_t nbytes = static_cast<int64_t>(x.nbytes());
  if (n == 0 ? nbytes != 0 : nbytes % n != 0) {
    throw py::value_error("transpose_batched: x has " + std::to_string(nbytes) + " bytes, not a multiple of " +
                          std::to_string(batch) + "x" + std::to_string(rows) + "x" + std::to_string(cols) +
                          " elements");
  }
  const int64_t elem = n == 0 ? 1 : nbytes / n;
  py::array y;
  if (out_obj.is_none()) {
    note_new_output();
    y = py::array(x.dtype(), std::vector<py::ssize_t>{static_cast<py::ssize_t>(x.size())});
  } else {
    if (!py::isinstance<py::array>(out_obj)) throw py::value_error("transpose_batched: out: expected a numpy array");
    y = py::reinterpret_borrow<py::array>(out_obj);
    if (!dtype_equiv(y.dtype(), x.dtype()) || y.nbytes() != x.nbytes() || !(y.flags() & py::array::c_style) ||
        !y.writeable()) {
      throw py::value_error("transpose_batched: out: expected a writeable C-contiguous array of x's dtype and size");
    }
    const auto* xs = static_cast<const uint8_t*>(x.data());
    const auto* ys = static_cast<const uint8_t*>(y.data());
    if (nbytes > 0 && xs < ys + nbytes && ys < xs + nbytes) {
      throw py::value_error("transpose_batched: out overlaps x");
    }
  }
  run_or_record(
      [=]() mutable { layout::transpose_batched(x.data(), y.mutable_data(), batch, rows, cols, elem, num_threads); });
  return y;
}

}  // namespace

void register_layout(py::module_& m) {
  m.def("transpose_batched", &transpose_impl, py::arg("x"), py::arg("batch"), py::arg("rows"), py::arg("cols"),
        py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "y[b, c, r] = x[b, r, c] for [batch, rows, cols] elements of x's itemsize multiple (layout/transpose.h).");
}

}  // namespace quanta
