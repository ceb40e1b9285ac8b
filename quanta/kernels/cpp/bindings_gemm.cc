// Bindings for batched_qgemm (gemm/batched_qgemm.h): GEMMs whose weights are run-time
// activations, over strided views. Every argument is checked here; a ValueError names the
// argument with what was expected and what was given.
//
//   qgemm_batched(x: uint8|int8 [B, M, K] (k stride 1, row stride >= K or M == 1, any
//                 batch stride), w: uint8|int8 [B, K, N] (any strides), zx: int,
//                 zw: int | int32[N], out_dtype, *, bias=None (int32[N]),
//                 float_bias=None (float32[N], float32 out), multiplier=None (float32
//                 scalar or [N]; uint8/int8/float32 out), zy=0, num_threads=1,
//                 scratch=None, out=None (C-contiguous [B, M, N])) -> [B, M, N]
//   qgemm_batched_call(x, w, zx, zw, out_dtype, float_bias, multiplier, zy, num_threads,
//                      scratch, out): the same call, every argument by position (no bias);
//                      recordable (bindings.h run_or_record)
//   BatchedQGemmScratch(): packed panels + workspaces reused across calls (one at a time)
#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "gemm/batched_qgemm.h"

namespace quanta {
namespace {

using gemm::BatchedParams;
using gemm::BatchedScratch;
using qgemm::OutType;
using qgemm::Requant;

struct PyBatchedScratch {
  BatchedScratch scratch;
  std::atomic<bool> busy{false};
};

std::string shape_text(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dtype_str(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// An 8-bit array of rank 3 (any strides); returns whether it is int8.
bool eight_bit_rank3(const py::array& a, const char* what) {
  const bool s8 = dtype_equiv(a.dtype(), py::dtype::of<int8_t>());
  if (!s8 && !dtype_equiv(a.dtype(), py::dtype::of<uint8_t>())) {
    throw py::value_error(std::string("qgemm_batched: ") + what + ": expected dtype uint8 or int8, got " +
                          dtype_str(a));
  }
  if (a.ndim() != 3) {
    throw py::value_error(std::string("qgemm_batched: ") + what + ": expected rank 3, got shape " + shape_text(a));
  }
  return s8;
}

int64_t int_arg(const py::handle& obj, const char* what) {
  if (py::isinstance<py::bool_>(obj) || !py::isinstance<py::int_>(obj)) {
    throw py::value_error(std::string("qgemm_batched: ") + what + ": expected an int, got " +
                          py::repr(obj).cast<std::string>());
  }
  return obj.cast<int64_t>();
}

void in_range(int64_t v, int64_t lo, int64_t hi, const std::string& what) {
  if (v < lo || v > hi) {
    throw py::value_error("qgemm_batched: " + what + ": expected a value in [" + std::to_string(lo) + ", " +
                          std::to_string(hi) + "], got " + std::to_string(v));
  }
}

// Lowest and one-past-highest byte a strided array touches (empty: lo == hi).
void extent(const py::array& a, uintptr_t* lo, uintptr_t* hi) {
  intptr_t first = reinterpret_cast<intptr_t>(a.data()), last = first;
  if (a.size() == 0) {
    *lo = *hi = static_cast<uintptr_t>(first);
    return;
  }
  for (py::ssize_t d = 0; d < a.ndim(); ++d) {
    const intptr_t span = static_cast<intptr_t>(a.strides(d)) * (a.shape(d) - 1);
    if (span < 0)
      first += span;
    else
      last += span;
  }
  *lo = static_cast<uintptr_t>(first);
  *hi = static_cast<uintptr_t>(last + a.itemsize());
}

bool overlap(const py::array& a, const py::array& b) {
  uintptr_t alo, ahi, blo, bhi;
  extent(a, &alo, &ahi);
  extent(b, &blo, &bhi);
  return alo < ahi && blo < bhi && alo < bhi && blo < ahi;
}

py::array qgemm_batched(const py::array& x, const py::array& w, const py::handle& zx_obj, const py::handle& zw_obj,
                        const std::string& out_dtype, const py::object& bias_obj, const py::object& float_bias_obj,
                        const py::object& multiplier_obj, const py::handle& zy_obj, int num_threads,
                        const py::object& scratch_obj, const py::object& out_obj) {
  BatchedParams p;
  qgemm::QGemmParams& g = p.gemm;
  g.x_signed = eight_bit_rank3(x, "x");
  const bool w_signed = eight_bit_rank3(w, "w");
  p.w_unsigned = !w_signed;
  const int64_t B = x.shape(0), M = x.shape(1), K = x.shape(2);
  if (w.shape(0) != B || w.shape(1) != K) {
    throw py::value_error("qgemm_batched: w: expected shape (" + std::to_string(B) + ", " + std::to_string(K) +
                          ", N) for x of shape " + shape_text(x) + ", got shape " + shape_text(w));
  }
  const int64_t N = w.shape(2);
  p.batch = B;
  p.K = K;
  p.N = N;
  g.M = M;
  if (K > 1 && x.strides(2) != 1) {
    throw py::value_error("qgemm_batched: x: expected unit stride along K, got strides (" +
                          std::to_string(x.strides(0)) + ", " + std::to_string(x.strides(1)) + ", " +
                          std::to_string(x.strides(2)) + ")");
  }
  if (M > 1 && x.strides(1) < K) {
    throw py::value_error("qgemm_batched: x: expected a row stride >= K = " + std::to_string(K) + ", got " +
                          std::to_string(x.strides(1)));
  }
  g.x = x.data();
  g.x_row_stride = M > 1 ? x.strides(1) : K;
  p.x_batch_stride = x.strides(0);
  p.w = w.data();
  p.w_batch_stride = w.strides(0);
  p.w_k_stride = w.strides(1);
  p.w_n_stride = w.strides(2);

  const int64_t zx = int_arg(zx_obj, "zx");
  in_range(zx, g.x_signed ? -128 : 0, g.x_signed ? 127 : 255,
           std::string("zx (x is ") + (g.x_signed ? "int8)" : "uint8)"));
  g.zx = static_cast<int32_t>(zx);

  std::vector<int32_t> zw;
  if (py::isinstance<py::array>(zw_obj)) {
    auto z = require_array<int32_t>(zw_obj, "qgemm_batched: zw");
    if (!(z.ndim() == 0 || (z.ndim() == 1 && (z.shape(0) == 1 || z.shape(0) == N)))) {
      throw py::value_error("qgemm_batched: zw: expected an int or shape (" + std::to_string(N) + ",), got shape " +
                            shape_text(z));
    }
    zw.assign(z.data(), z.data() + z.size());
  } else {
    zw.push_back(static_cast<int32_t>(int_arg(zw_obj, "zw")));
  }
  for (size_t i = 0; i < zw.size(); ++i) {
    in_range(zw[i], w_signed ? -128 : 0, w_signed ? 127 : 255, "zw[" + std::to_string(i) + "]");
  }
  p.zw = zw.data();
  p.zw_per_channel = zw.size() != 1;

  py::dtype ydt;
  if (out_dtype == "uint8") {
    g.out_type = OutType::kU8;
    ydt = py::dtype::of<uint8_t>();
  } else if (out_dtype == "int8") {
    g.out_type = OutType::kS8;
    ydt = py::dtype::of<int8_t>();
  } else if (out_dtype == "int32") {
    g.out_type = OutType::kS32;
    ydt = py::dtype::of<int32_t>();
  } else if (out_dtype == "float32") {
    g.out_type = OutType::kF32;
    ydt = py::dtype::of<float>();
  } else {
    throw py::value_error("qgemm_batched: out_dtype: expected one of uint8, int8, int32, float32, got '" + out_dtype +
                          "'");
  }
  const bool q8 = g.out_type == OutType::kU8 || g.out_type == OutType::kS8;

  if (!bias_obj.is_none()) {
    auto b = require_array<int32_t>(bias_obj, "qgemm_batched: bias");
    if (b.ndim() != 1 || b.shape(0) != N) {
      throw py::value_error("qgemm_batched: bias: expected shape (" + std::to_string(N) + ",), got shape " +
                            shape_text(b));
    }
    g.bias = b.data();
  }
  if (!float_bias_obj.is_none()) {
    if (g.out_type != OutType::kF32) {
      throw py::value_error("qgemm_batched: float_bias: expected None for out_dtype " + out_dtype);
    }
    auto b = require_array<float>(float_bias_obj, "qgemm_batched: float_bias");
    if (b.ndim() != 1 || b.shape(0) != N) {
      throw py::value_error("qgemm_batched: float_bias: expected shape (" + std::to_string(N) + ",), got shape " +
                            shape_text(b));
    }
    g.float_bias = b.data();
  }
  std::vector<float> mult;
  if (g.out_type == OutType::kS32) {
    if (!multiplier_obj.is_none()) {
      throw py::value_error("qgemm_batched: multiplier: expected None for out_dtype int32");
    }
  } else {
    if (multiplier_obj.is_none()) {
      throw py::value_error("qgemm_batched: multiplier: expected a scalar or [N] float32 for out_dtype " + out_dtype +
                            ", got None");
    }
    if (py::isinstance<py::array>(multiplier_obj)) {
      auto m = require_array<float>(multiplier_obj, "qgemm_batched: multiplier");
      if (!(m.ndim() == 0 || (m.ndim() == 1 && (m.shape(0) == 1 || m.shape(0) == N)))) {
        throw py::value_error("qgemm_batched: multiplier: expected a scalar or shape (" + std::to_string(N) +
                              ",), got shape " + shape_text(m));
      }
      mult.assign(m.data(), m.data() + m.size());
    } else {
      try {
        mult.push_back(multiplier_obj.cast<float>());
      } catch (const py::cast_error&) {
        throw py::value_error("qgemm_batched: multiplier: expected a float32 number or array, got " +
                              py::repr(multiplier_obj).cast<std::string>());
      }
    }
    for (size_t i = 0; i < mult.size(); ++i) {
      if (!(std::isfinite(mult[i]) && mult[i] > 0.0f)) {
        throw py::value_error("qgemm_batched: multiplier[" + std::to_string(i) +
                              "]: expected a finite value > 0, got " + std::to_string(mult[i]));
      }
    }
    g.multiplier = mult.data();
    g.multiplier_per_channel = mult.size() != 1;
    if (q8) g.requant = Requant::kFloat;
  }
  const int64_t zy = int_arg(zy_obj, "zy");
  if (q8) {
    const bool s8 = g.out_type == OutType::kS8;
    in_range(zy, s8 ? -128 : 0, s8 ? 127 : 255, "zy (out_dtype " + out_dtype + ")");
  } else if (zy != 0) {
    throw py::value_error("qgemm_batched: zy: expected 0 for out_dtype " + out_dtype + ", got " + std::to_string(zy));
  }
  g.zy = static_cast<int32_t>(zy);
  if (num_threads < 1) {
    throw py::value_error("qgemm_batched: num_threads: expected >= 1, got " + std::to_string(num_threads));
  }
  g.num_threads = num_threads;
  p.isa = active_isa();

  py::array y;
  const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(B), static_cast<py::ssize_t>(M),
                                       static_cast<py::ssize_t>(N)};
  if (out_obj.is_none()) {
    y = py::array(ydt, shape);
    note_new_output();
  } else {
    if (!py::isinstance<py::array>(out_obj))
      throw py::value_error("qgemm_batched: out: expected a numpy array or None");
    y = py::reinterpret_borrow<py::array>(out_obj);
    if (!dtype_equiv(y.dtype(), ydt)) {
      throw py::value_error("qgemm_batched: out: expected dtype " + out_dtype + ", got " + dtype_str(y));
    }
    if (y.ndim() != 3 || y.shape(0) != B || y.shape(1) != M || y.shape(2) != N) {
      throw py::value_error("qgemm_batched: out: expected shape (" + std::to_string(B) + ", " + std::to_string(M) +
                            ", " + std::to_string(N) + "), got shape " + shape_text(y));
    }
    if (!(y.flags() & py::array::c_style)) throw py::value_error("qgemm_batched: out: expected a C-contiguous array");
    if (!y.writeable()) throw py::value_error("qgemm_batched: out: expected a writeable array");
    if (overlap(y, x) || overlap(y, w)) {
      throw py::value_error("qgemm_batched: out: expected a buffer that does not overlap x or w");
    }
  }
  g.y = y.mutable_data();
  g.y_row_stride = N;
  p.y_batch_stride = M * N;

  if (CallRecorder* recorder = call_recorder()) {
    // A recorded call (a native program's step, bindings.h run_or_record): its own
    // scratch, and its own copies of the zero points and multipliers this call converted
    // (p points into them); x, w, y and the caller's bias arrays stay where they are for
    // the program's life.
    auto own = std::make_shared<BatchedScratch>();
    recorder->calls.emplace_back([p, own, zw, mult]() mutable {
      p.zw = zw.data();
      if (!mult.empty()) p.gemm.multiplier = mult.data();
      gemm::batched_qgemm(p, *own);
    });
    return y;
  }
  PyBatchedScratch local;
  PyBatchedScratch* sp = &local;
  if (!scratch_obj.is_none()) {
    try {
      sp = scratch_obj.cast<PyBatchedScratch*>();
    } catch (const py::cast_error&) {
      throw py::value_error("qgemm_batched: scratch: expected a BatchedQGemmScratch or None");
    }
  }
  BusyGuard<PyBatchedScratch> guard(*sp, "qgemm_batched: scratch");
  {
    py::gil_scoped_release release;
    gemm::batched_qgemm(p, sp->scratch);
  }
  return y;
}

}  // namespace

void register_gemm(py::module_& m) {
  py::class_<PyBatchedScratch>(
      m, "BatchedQGemmScratch",
      "Packed panels and workspaces for qgemm_batched, grown on first use; one call at a time.")
      .def(py::init<>());
  m.def("qgemm_batched", &qgemm_batched, py::arg("x"), py::arg("w"), py::arg("zx"), py::arg("zw"),
        py::arg("out_dtype") = "int32", py::kw_only(), py::arg("bias") = py::none(), py::arg("float_bias") = py::none(),
        py::arg("multiplier") = py::none(), py::arg("zy") = 0, py::arg("num_threads") = 1,
        py::arg("scratch") = py::none(), py::arg("out") = py::none(),
        "y[i] = output_stage(Σ_k (x[i] − zx)(w[i] − zw) + bias) for run-time w over strided views; "
        "see quanta/kernels/cpp/gemm/batched_qgemm.h.");
  m.def(
      "qgemm_batched_call",
      [](const py::array& x, const py::array& w, const py::handle& zx, const py::handle& zw,
         const std::string& out_dtype, const py::object& float_bias, const py::object& multiplier, const py::handle& zy,
         int num_threads, const py::object& scratch, const py::object& out) {
        return qgemm_batched(x, w, zx, zw, out_dtype, py::none(), float_bias, multiplier, zy, num_threads, scratch,
                             out);
      },
      py::arg("x"), py::arg("w"), py::arg("zx"), py::arg("zw"), py::arg("out_dtype"), py::arg("float_bias"),
      py::arg("multiplier"), py::arg("zy"), py::arg("num_threads"), py::arg("scratch"), py::arg("out"),
      "qgemm_batched(x, w, zx, zw, out_dtype, float_bias=float_bias, multiplier=multiplier, zy=zy, "
      "num_threads=num_threads, scratch=scratch, out=out), every argument by position.");
}

}  // namespace quanta
