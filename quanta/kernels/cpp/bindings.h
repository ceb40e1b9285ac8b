// Binding boundary helpers: every kernel entry point checks dtype, contiguity, shape
// and parameter lengths here and raises a Python ValueError naming the argument and
// what was expected, before any pointer reaches a kernel.
#pragma once

#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <algorithm>
#include <array>
#include <sstream>
#include <stdexcept>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "broadcast.h"

namespace quanta {
namespace py = pybind11;

// ---------------------------------------------------------------------------------------
// Recorded kernel calls (quanta.runtime's native programs, docs/runtime.md "Native
// programs"). A binding checks its arguments and makes its output with the GIL held, then
// hands the kernel call itself to run_or_record, which runs it with the GIL released, or,
// while Program.record (bindings_program.cc) records a step on this thread, keeps it to
// run later from the program. The callable captures what it uses by value (pointers into
// arrays the program keeps alive, shapes, vectors): it must not refer to the binding's
// locals.
struct CallRecorder {
  std::vector<std::function<void()>> calls;
  bool new_output = false;  // a call made its own output (see note_new_output)
};

inline CallRecorder*& call_recorder() {
  static thread_local CallRecorder* recorder = nullptr;
  return recorder;
}

// A binding that makes its own output array (no `out` given) says so: while recording,
// the kept call would write into an array the recording caller does not keep (a
// wrapper's temporary), so Program.record refuses the step.
inline void note_new_output() {
  if (CallRecorder* r = call_recorder()) r->new_output = true;
}

template <typename F>
void run_or_record(F&& call) {
  if (CallRecorder* r = call_recorder()) {
    r->calls.emplace_back(std::forward<F>(call));
    return;
  }
  py::gil_scoped_release release;
  call();
}

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
void register_nchwc(py::module_& m);
void register_program(py::module_& m);
void register_mlas_conv(py::module_& m);
void register_mlas_qconv(py::module_& m);

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

// Whether two dtypes describe the same elements. Not `is`: NumPy hands out the builtin
// descriptor for most arrays, but an unpickled array (a process pool's, a Ray worker's)
// carries an equal descriptor object of its own, which identity would refuse.
inline bool dtype_equiv(const py::dtype& a, const py::dtype& b) {
  return a.is(b) || py::detail::npy_api::get().PyArray_EquivTypes_(a.ptr(), b.ptr());
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
  if (!dtype_equiv(arr.dtype(), py::dtype::of<T>())) {
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

// The output of a kernel: a new array, or `out` checked for dtype, shape, contiguity,
// writeability and overlap with the inputs.
template <typename T>
py::array_t<T, py::array::c_style> make_output(const py::object& out_obj, const Shape& shape, const char* op,
                                               std::initializer_list<py::array> inputs) {
  if (out_obj.is_none()) return note_new_output(), py::array_t<T, py::array::c_style>(shape);
  const std::string what = std::string(op) + ": out";
  auto y = require_array<T>(out_obj, what.c_str());
  if (shape_of(y) != shape) {
    throw py::value_error(what + ": expected shape " + shape_str(shape) + ", got shape " + shape_str(shape_of(y)));
  }
  if (!y.writeable()) throw py::value_error(what + ": expected a writeable array");
  for (const py::array& in : inputs) {
    if (overlaps(y, in)) throw py::value_error(what + ": expected a buffer that does not overlap the inputs");
  }
  return y;
}

// The (outer, inner) runs around a per-axis parameter of `channels` values (Quantize /
// DequantizeLinear): one run of x.size() when the parameter is a scalar (channels 1 and
// scale rank <= 1), else the products of x's dimensions before and after `axis`
// (negative: from the end), which must hold `channels`.
struct AxisRuns {
  int64_t outer = 1, inner = 1;
};
inline AxisRuns axis_runs(const py::array& x, int64_t channels, py::ssize_t scale_ndim, int64_t axis,
                          const std::string& op) {
  AxisRuns r;
  const int64_t ndim = x.ndim();
  if (channels == 1 && scale_ndim <= 1) {
    r.inner = x.size();
    return r;
  }
  if (axis < 0) axis += ndim;
  if (axis < 0 || axis >= ndim) {
    throw py::value_error(op + ": axis " + std::to_string(axis) + " is out of range for rank " + std::to_string(ndim));
  }
  if (x.shape(axis) != channels) {
    throw py::value_error(op + ": scale has " + std::to_string(channels) + " elements but x has " +
                          std::to_string(x.shape(axis)) + " along axis " + std::to_string(axis));
  }
  for (int64_t d = 0; d < axis; ++d) r.outer *= x.shape(d);
  for (int64_t d = axis + 1; d < ndim; ++d) r.inner *= x.shape(d);
  return r;
}

// NumPy broadcasting of a and b (broadcast.h): the output shape, and the three shapes
// aligned to its rank for broadcast::Shape.
struct Broadcast {
  Shape out;
  std::array<int64_t, broadcast::kMaxRank> o{}, a{}, b{};
  int rank = 0;
  broadcast::Shape shape() const { return {rank, o.data(), a.data(), b.data()}; }
};
inline Broadcast broadcast_shapes(const py::array& a, const py::array& b, const std::string& op) {
  Broadcast r;
  r.rank = static_cast<int>(std::max(a.ndim(), b.ndim()));
  if (r.rank > broadcast::kMaxRank) {
    throw py::value_error(op + ": expected rank <= " + std::to_string(broadcast::kMaxRank) + ", got " +
                          std::to_string(r.rank));
  }
  for (int d = 0; d < r.rank; ++d) {
    const int da = d - (r.rank - static_cast<int>(a.ndim()));
    const int db = d - (r.rank - static_cast<int>(b.ndim()));
    const int64_t sa = da >= 0 ? a.shape(da) : 1;
    const int64_t sb = db >= 0 ? b.shape(db) : 1;
    if (sa != sb && sa != 1 && sb != 1) {
      throw py::value_error(op + ": expected broadcastable shapes, got " + shape_str(shape_of(a)) + " and " +
                            shape_str(shape_of(b)));
    }
    r.a[d] = sa;
    r.b[d] = sb;
    r.o[d] = sa == 1 ? sb : sa;
    r.out.push_back(static_cast<py::ssize_t>(r.o[d]));
  }
  return r;
}

// Holds a caller-owned scratch object (a struct with `std::atomic<bool> busy`) for one
// call: a second call that shares it meanwhile raises instead of racing on it.
template <class S>
class BusyGuard {
 public:
  BusyGuard(S& s, const std::string& what) : s_(s) {
    bool expected = false;
    if (!s_.busy.compare_exchange_strong(expected, true)) {
      throw py::value_error(what + ": expected one not in use by another call, got a busy one");
    }
  }
  ~BusyGuard() { s_.busy.store(false); }
  BusyGuard(const BusyGuard&) = delete;
  BusyGuard& operator=(const BusyGuard&) = delete;

 private:
  S& s_;
};

namespace sgemm {
struct PostOp;
}  // namespace sgemm

// A float post-op from its binding arguments (sgemm.h PostKind as an int, at most 4
// parameters), for the active ISA; a ValueError naming `op` otherwise (bindings_sgemm.cc).
sgemm::PostOp post_op_arg(int kind, const std::vector<float>& params, const std::string& op);

}  // namespace quanta
