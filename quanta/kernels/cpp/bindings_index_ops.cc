// Bindings for the index and running-sum kernels (tensor_ops/index_ops.h). Every entry
// checks dtypes, contiguity, shapes and `out` here and raises ValueError naming the
// argument; an index out of range is a ValueError too, which sends the step to its twin
// to raise the operator's error with the node's name.
//
//   cumsum(x, axis, exclusive=False, reverse=False, out=None) -> y   float32/64, int32/64
//   nonzero(x) -> y [rank, count] int64                  float32/64, (u)int8, int32/64, bool
//   one_hot(indices, depth, values, axis, out=None) -> y indices int64, values [off, on]
//     of any 1-8-byte dtype; y: indices' shape with depth inserted at axis
//   scatter_nd(data, indices, updates, reduction, out=None) -> y   float32/64, int32/64;
//     indices int64 [..., m]; reduction none, add, mul, max, min
//   arg_extreme(x, axis, find_max, select_last=False, out=None) -> y [outer, inner] int64
//     float32/64, (u)int8, int32/64: ArgMax / ArgMin
//   softsign(x, out=None) -> y                           float32/64: x / (1 + |x|)
//   negate(x, out=None) -> y                             float32/64: the sign bit flipped
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "bindings.h"
#include "tensor_ops/index_ops.h"

namespace quanta {
namespace {

py::array c_array(const py::handle& obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj)) throw py::value_error(what + ": expected a numpy array");
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!(a.flags() & py::array::c_style)) throw py::value_error(what + ": expected a C-contiguous array");
  return a;
}

// A new array of `dtype` and `shape`, or `out` checked like make_output does.
py::array output_like(const py::object& out_obj, const py::dtype& dtype, const Shape& shape, const std::string& op,
                      std::initializer_list<py::array> inputs) {
  if (out_obj.is_none()) return py::array(dtype, shape);
  const std::string what = op + ": out";
  auto y = c_array(out_obj, what);
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

// 'f4', 'f8', 'i4', 'i8', ... of a numeric array: which instantiation runs.
std::string code_of(const py::array& a) {
  const char kind = a.dtype().kind();
  return std::string(1, kind == 'b' ? 'b' : kind) + std::to_string(a.itemsize());
}

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

int64_t normalized_axis(int64_t axis, int64_t rank, const std::string& what) {
  if (axis < -rank || axis >= rank) {
    throw py::value_error(what + ": expected an axis in [" + std::to_string(-rank) + ", " + std::to_string(rank - 1) +
                          "], got " + std::to_string(axis));
  }
  return axis < 0 ? axis + rank : axis;
}

py::array cumsum(const py::handle& x_obj, int64_t axis, bool exclusive, bool reverse, const py::object& out_obj) {
  auto x = c_array(x_obj, "cumsum: x");
  const int64_t a = normalized_axis(axis, x.ndim(), "cumsum: axis");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < a; ++d) outer *= x.shape(d);
  for (int64_t d = a + 1; d < x.ndim(); ++d) inner *= x.shape(d);
  const int64_t n = x.shape(a);
  const std::string code = code_of(x);
  if (code != "f4" && code != "f8" && code != "i4" && code != "i8") {
    throw py::value_error("cumsum: x: expected float32/64 or int32/64, got " + dtype_str(x));
  }
  auto y = output_like(out_obj, x.dtype(), shape_of(x), "cumsum", {x});
  const void* xp = x.data();
  void* yp = y.mutable_data();
  py::gil_scoped_release release;
  if (code == "f4") {
    tensor_ops::cumsum(static_cast<const float*>(xp), static_cast<float*>(yp), outer, n, inner, exclusive, reverse);
  } else if (code == "f8") {
    tensor_ops::cumsum(static_cast<const double*>(xp), static_cast<double*>(yp), outer, n, inner, exclusive, reverse);
  } else if (code == "i4") {
    tensor_ops::cumsum(static_cast<const int32_t*>(xp), static_cast<int32_t*>(yp), outer, n, inner, exclusive, reverse);
  } else {
    tensor_ops::cumsum(static_cast<const int64_t*>(xp), static_cast<int64_t*>(yp), outer, n, inner, exclusive, reverse);
  }
  return y;
}

template <typename T>
py::array nonzero_typed(const py::array& x) {
  const auto* xp = static_cast<const T*>(x.data());
  const int rank = static_cast<int>(x.ndim());
  const int64_t count = tensor_ops::count_nonzero(xp, x.size());
  py::array_t<int64_t> y(Shape{rank, count});
  std::vector<int64_t> shape(x.shape(), x.shape() + rank);
  tensor_ops::nonzero(xp, shape.data(), rank, count, y.mutable_data());
  return y;
}

py::array nonzero(const py::handle& x_obj) {
  auto x = c_array(x_obj, "nonzero: x");
  if (x.ndim() < 1 || x.ndim() > 16) {
    throw py::value_error("nonzero: x: expected rank 1 to 16, got rank " + std::to_string(x.ndim()));
  }
  const std::string code = code_of(x);
  if (code == "f4") return nonzero_typed<float>(x);
  if (code == "f8") return nonzero_typed<double>(x);
  if (code == "i1") return nonzero_typed<int8_t>(x);
  if (code == "u1") return nonzero_typed<uint8_t>(x);
  if (code == "b1") return nonzero_typed<uint8_t>(x);  // numpy bools are bytes 0 / 1
  if (code == "i4") return nonzero_typed<int32_t>(x);
  if (code == "i8") return nonzero_typed<int64_t>(x);
  throw py::value_error("nonzero: x: expected float32/64, (u)int8, int32/64 or bool, got " + dtype_str(x));
}

py::array one_hot(const py::handle& idx_obj, int64_t depth, const py::handle& values_obj, int64_t axis,
                  const py::object& out_obj) {
  auto idx = require_array<int64_t>(idx_obj, "one_hot: indices");
  auto values = c_array(values_obj, "one_hot: values");
  if (values.size() != 2) {
    throw py::value_error("one_hot: values: expected [off, on] (2 elements), got shape " + shape_str(shape_of(values)));
  }
  if (values.dtype().kind() == 'O') throw py::value_error("one_hot: values: expected a numeric dtype, got object");
  if (depth < 0) throw py::value_error("one_hot: depth: expected >= 0, got " + std::to_string(depth));
  const int64_t rank = idx.ndim() + 1;
  const int64_t a = normalized_axis(axis, rank, "one_hot: axis");
  Shape shape;
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < idx.ndim(); ++d) {
    if (d == a) shape.push_back(depth);
    shape.push_back(idx.shape(d));
    (d < a ? outer : inner) *= idx.shape(d);
  }
  if (a == idx.ndim()) shape.push_back(depth);
  auto y = output_like(out_obj, values.dtype(), shape, "one_hot", {idx, values});
  const auto* v = static_cast<const uint8_t*>(values.data());
  const int64_t size = values.itemsize();
  const int64_t* ip = idx.data();
  auto* yp = static_cast<uint8_t*>(y.mutable_data());
  py::gil_scoped_release release;
  tensor_ops::one_hot(ip, outer, inner, depth, v, v + size, size, yp);
  return y;
}

tensor_ops::ScatterReduce reduction_of(const std::string& name) {
  static const char* names[] = {"none", "add", "mul", "max", "min"};
  for (int i = 0; i < 5; ++i) {
    if (name == names[i]) return static_cast<tensor_ops::ScatterReduce>(i);
  }
  throw py::value_error("scatter_nd: reduction: expected none, add, mul, max or min, got '" + name + "'");
}

py::array scatter_nd(const py::handle& data_obj, const py::handle& idx_obj, const py::handle& upd_obj,
                     const std::string& reduction, const py::object& out_obj) {
  const tensor_ops::ScatterReduce op = reduction_of(reduction);
  auto data = c_array(data_obj, "scatter_nd: data");
  auto idx = require_array<int64_t>(idx_obj, "scatter_nd: indices");
  auto upd = c_array(upd_obj, "scatter_nd: updates");
  const std::string code = code_of(data);
  if (code != "f4" && code != "f8" && code != "i4" && code != "i8") {
    throw py::value_error("scatter_nd: data: expected float32/64 or int32/64, got " + dtype_str(data));
  }
  if (!dtype_equiv(upd.dtype(), data.dtype())) {
    throw py::value_error("scatter_nd: updates: expected data's dtype " + dtype_str(data) + ", got " + dtype_str(upd));
  }
  if (idx.ndim() < 1) throw py::value_error("scatter_nd: indices: expected rank >= 1, got rank 0");
  const int64_t m = idx.shape(idx.ndim() - 1);
  if (m < 1 || m > data.ndim()) {
    throw py::value_error("scatter_nd: indices: expected a last dimension in [1, " + std::to_string(data.ndim()) +
                          "], got " + std::to_string(m));
  }
  Shape want(idx.shape(), idx.shape() + idx.ndim() - 1);
  for (int64_t d = m; d < data.ndim(); ++d) want.push_back(data.shape(d));
  if (shape_of(upd) != want) {
    throw py::value_error("scatter_nd: updates: expected shape " + shape_str(want) + ", got shape " +
                          shape_str(shape_of(upd)));
  }
  int64_t slice = 1;
  for (int64_t d = m; d < data.ndim(); ++d) slice *= data.shape(d);
  const int64_t rows = m ? idx.size() / m : 0;
  // every row's offset in data, its indices counted from the end when negative
  std::vector<int64_t> offsets(static_cast<size_t>(rows));
  const int64_t* ip = idx.data();
  for (int64_t r = 0; r < rows; ++r) {
    int64_t off = 0;
    for (int64_t k = 0; k < m; ++k) {
      const int64_t dim = data.shape(k);
      int64_t v = ip[r * m + k];
      if (v < -dim || v >= dim) {
        throw py::value_error("scatter_nd: indices: expected values in [" + std::to_string(-dim) + ", " +
                              std::to_string(dim - 1) + "] along axis " + std::to_string(k) + ", got " +
                              std::to_string(v));
      }
      if (v < 0) v += dim;
      off = off * dim + v;
    }
    offsets[static_cast<size_t>(r)] = off * slice;
  }
  auto y = output_like(out_obj, data.dtype(), shape_of(data), "scatter_nd", {data, idx, upd});
  const void* dp = data.data();
  const void* up = upd.data();
  void* yp = y.mutable_data();
  const int64_t nbytes = data.nbytes();
  py::gil_scoped_release release;
  std::memcpy(yp, dp, static_cast<size_t>(nbytes));
  if (code == "f4") {
    tensor_ops::scatter_rows(static_cast<float*>(yp), offsets.data(), static_cast<const float*>(up), rows, slice, op);
  } else if (code == "f8") {
    tensor_ops::scatter_rows(static_cast<double*>(yp), offsets.data(), static_cast<const double*>(up), rows, slice, op);
  } else if (code == "i4") {
    tensor_ops::scatter_rows(static_cast<int32_t*>(yp), offsets.data(), static_cast<const int32_t*>(up), rows, slice,
                             op);
  } else {
    tensor_ops::scatter_rows(static_cast<int64_t*>(yp), offsets.data(), static_cast<const int64_t*>(up), rows, slice,
                             op);
  }
  return y;
}

template <typename T>
void arg_extreme_typed(const py::array& x, int64_t* y, int64_t outer, int64_t n, int64_t inner, bool find_max,
                       bool select_last) {
  const auto* xp = static_cast<const T*>(x.data());
  py::gil_scoped_release release;
  tensor_ops::arg_extreme(xp, y, outer, n, inner, find_max, select_last);
}

// ArgMax / ArgMin of x along axis into int64 [outer, inner] (the caller reshapes for
// keepdims).
py::array arg_extreme(const py::handle& x_obj, int64_t axis, bool find_max, bool select_last,
                      const py::object& out_obj) {
  auto x = c_array(x_obj, "arg_extreme: x");
  if (x.ndim() < 1) throw py::value_error("arg_extreme: x: expected rank >= 1, got rank 0");
  const int64_t a = normalized_axis(axis, x.ndim(), "arg_extreme: axis");
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < a; ++d) outer *= x.shape(d);
  for (int64_t d = a + 1; d < x.ndim(); ++d) inner *= x.shape(d);
  const int64_t n = x.shape(a);
  if (n == 0) throw py::value_error("arg_extreme: x: expected a non-empty axis, got shape " + shape_str(shape_of(x)));
  const std::string code = code_of(x);
  auto y = output_like(out_obj, py::dtype::of<int64_t>(), Shape{outer, inner}, "arg_extreme", {x});
  auto* yp = static_cast<int64_t*>(y.mutable_data());
  if (code == "f4") {
    arg_extreme_typed<float>(x, yp, outer, n, inner, find_max, select_last);
  } else if (code == "f8") {
    arg_extreme_typed<double>(x, yp, outer, n, inner, find_max, select_last);
  } else if (code == "i4") {
    arg_extreme_typed<int32_t>(x, yp, outer, n, inner, find_max, select_last);
  } else if (code == "i8") {
    arg_extreme_typed<int64_t>(x, yp, outer, n, inner, find_max, select_last);
  } else if (code == "i1") {
    arg_extreme_typed<int8_t>(x, yp, outer, n, inner, find_max, select_last);
  } else if (code == "u1") {
    arg_extreme_typed<uint8_t>(x, yp, outer, n, inner, find_max, select_last);
  } else {
    throw py::value_error("arg_extreme: x: expected float32/64, (u)int8 or int32/64, got " + dtype_str(x));
  }
  return y;
}

template <void (*F32)(const float*, float*, int64_t), void (*F64)(const double*, double*, int64_t)>
py::array float_unary(const char* op, const py::handle& x_obj, const py::object& out_obj) {
  auto x = c_array(x_obj, std::string(op) + ": x");
  const std::string code = code_of(x);
  if (code != "f4" && code != "f8") {
    throw py::value_error(std::string(op) + ": x: expected float32 or float64, got " + dtype_str(x));
  }
  auto y = output_like(out_obj, x.dtype(), shape_of(x), op, {x});
  const void* xp = x.data();
  void* yp = y.mutable_data();
  const int64_t n = x.size();
  py::gil_scoped_release release;
  if (code == "f4") {
    F32(static_cast<const float*>(xp), static_cast<float*>(yp), n);
  } else {
    F64(static_cast<const double*>(xp), static_cast<double*>(yp), n);
  }
  return y;
}

py::array softsign(const py::handle& x, const py::object& out) {
  return float_unary<&tensor_ops::softsign<float>, &tensor_ops::softsign<double>>("softsign", x, out);
}

py::array negate(const py::handle& x, const py::object& out) {
  return float_unary<&tensor_ops::negate<float>, &tensor_ops::negate<double>>("negate", x, out);
}

}  // namespace

void register_index_ops(py::module_& m) {
  using py::arg;
  const py::object none = py::none();
  m.def("cumsum", &cumsum, arg("x"), arg("axis"), arg("exclusive") = false, arg("reverse") = false, arg("out") = none,
        "CumSum along axis: a running sum per lane in axis order (index_ops.h), float32/64, int32/64 (wrapping).");
  m.def("nonzero", &nonzero, arg("x"), "NonZero: int64 [rank, count] coordinates of the non-zero elements in C order.");
  m.def("one_hot", &one_hot, arg("indices"), arg("depth"), arg("values"), arg("axis"), arg("out") = none,
        "OneHot of int64 indices (negative: + depth; outside: a row of off), values [off, on].");
  m.def("scatter_nd", &scatter_nd, arg("data"), arg("indices"), arg("updates"), arg("reduction"), arg("out") = none,
        "ScatterND: a copy of data with the update rows applied in order (none, add, mul, max, min).");
  m.def("arg_extreme", &arg_extreme, arg("x"), arg("axis"), arg("find_max"), arg("select_last") = false,
        arg("out") = none,
        "ArgMax (find_max) / ArgMin as np.argmax / np.argmin (first extreme, NaN wins) into int64 [outer, inner].");
  m.def("softsign", &softsign, arg("x"), arg("out") = none, "Softsign, float32/64: x / (1 + |x|).");
  m.def("negate", &negate, arg("x"), arg("out") = none, "Neg of float32/64: the sign bit flipped (np.negative).");
}

}  // namespace quanta
