// Bindings for the int8 GEMM core (qgemm/qgemm.h): the entry layer. Every argument is
// checked here (dtype, rank, shape, contiguity, ranges, aliasing) and a ValueError names
// the argument with what was expected and what was given, before a pointer reaches the
// driver.
//
//   pack_weights_s8(w: int8[K, N], zero_point: int | int32[N] = 0, isa: str | None = None,
//                   saturating: bool = False)
//       saturating: the avx2 vpmaddubsw family whatever w's range (isa None: avx2), whose
//       pair sums of raw uint8 x and int8 w saturate to int16 as ONNX Runtime's u8·s8
//       kernels without VNNI (qgemm.h pack_weights)
//   pack_weights_u8(w: uint8[K, N], zero_point: int | int32[N] = 0, isa: str | None = None)
//       -> PackedWeights (owns the packed panels, column sums, K, N, the ISA)
//   qgemm(x: uint8|int8 [..., K], packed, zx: int | int32[...] (per row), out_dtype, *,
//         bias=None, float_bias=None,
//         multiplier=None, fixed_multiplier=None, fixed_shift=None, zy=0, clamp=None,
//         num_threads=1, workspace=None, out=None, row_bias=None, row_multiplier=None,
//         post_add=None) -> [..., N] of out_dtype
//       post_add: (k: float32[N], u: float32[N], r1: float, r2: float), the second affine
//       stage of a uint8/int8 output with a float multiplier (qgemm.h post_k)
//   QGemmWorkspace(): scratch reused across calls (one call at a time)
//   qgemm_kernel_name(isa=None), vnni_peak_probe(seconds)
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "qgemm/qgemm.h"
#include "qgemm/thread_pool.h"

namespace quanta {
namespace {

using qgemm::OutType;
using qgemm::PackedWeights;
using qgemm::QGemmParams;
using qgemm::Requant;

// The workspace plus a guard: two concurrent calls on one workspace (the GIL is released
// during the GEMM) raise instead of racing on the scratch.
struct PyWorkspace {
  qgemm::Workspace ws;
  std::atomic<bool> busy{false};
};

// None: the active ISA; else the named one, which this CPU must run (dispatch.h).
Isa parse_isa(const py::object& isa) { return isa.is_none() ? active_isa() : runnable_isa(py::str(isa)); }

// Python's tuple spelling: (), (3,), (2, 3).
std::string tuple_str(const py::ssize_t* dims, py::ssize_t n) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < n; ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + (n == 1 ? ",)" : ")");
}

std::string shape_str(const py::array& a) { return tuple_str(a.shape(), a.ndim()); }

// A scalar or an array of 1 or n values of T: returns the values and whether there are n.
template <typename T>
std::vector<T> scalar_or_vector(const py::handle& obj, int64_t n, const char* what, bool* per_channel) {
  std::vector<T> v;
  if (py::isinstance<py::array>(obj)) {
    auto arr = require_array<T>(obj, what);
    const int64_t size = arr.size();
    if (arr.ndim() > 1 || (size != 1 && size != n)) {
      throw py::value_error(std::string(what) + ": expected a scalar or shape (" + std::to_string(n) +
                            ",), got shape " + shape_str(arr));
    }
    v.assign(arr.data(), arr.data() + size);
  } else {
    try {
      v.push_back(obj.cast<T>());
    } catch (const py::cast_error&) {
      throw py::value_error(std::string(what) + ": expected " + (std::is_same_v<T, float> ? "a float32" : "an int32") +
                            " number or numpy array, got " + py::repr(obj).cast<std::string>());
    }
  }
  *per_channel = v.size() != 1;
  return v;
}

int64_t checked_int(const py::handle& obj, const char* what) {
  if (py::isinstance<py::bool_>(obj) || !(py::isinstance<py::int_>(obj) || py::hasattr(obj, "__index__"))) {
    throw py::value_error(std::string(what) + ": expected an integer, got " +
                          py::str(py::type::of(obj)).cast<std::string>());
  }
  // Fast path first: a Python int (the usual case) needs no operator.index round trip,
  // which cost microseconds per call on single-row GEMMs.
  if (py::isinstance<py::int_>(obj)) {
    try {
      return obj.cast<int64_t>();
    } catch (const py::cast_error&) {
      throw py::value_error(std::string(what) + ": expected an integer in the int64 range, got " +
                            py::repr(obj).cast<std::string>());
    }
  }
  // Leaked on purpose: a static py::object would be destroyed after the interpreter.
  static const py::object* index_fn = new py::object(py::module_::import("operator").attr("index"));
  const py::object index = (*index_fn)(obj);
  try {
    return index.cast<int64_t>();
  } catch (const py::cast_error&) {
    throw py::value_error(std::string(what) + ": expected an integer in the int64 range, got " +
                          py::repr(obj).cast<std::string>());
  }
}

void check_range(int64_t v, int64_t lo, int64_t hi, const std::string& what) {
  if (v < lo || v > hi) {
    throw py::value_error(what + ": expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                          "], got " + std::to_string(v));
  }
}

template <typename T>
std::shared_ptr<PackedWeights> pack_impl(const py::handle& w_obj, const py::handle& zp_obj, const py::object& isa_obj,
                                         const char* fn, bool saturating = false) {
  const std::string name = fn;
  auto w = require_array<T>(w_obj, (name + ": w").c_str());
  if (w.ndim() != 2) throw py::value_error(name + ": w: expected a 2-D array [K, N], got shape " + shape_str(w));
  const int64_t K = w.shape(0), N = w.shape(1);
  const bool w_unsigned = std::is_same_v<T, uint8_t>;
  const int64_t zlo = w_unsigned ? 0 : -128, zhi = w_unsigned ? 255 : 127;
  bool per_channel = false;
  std::vector<int32_t> zp;
  if (py::isinstance<py::array>(zp_obj)) {
    zp = scalar_or_vector<int32_t>(zp_obj, N, (name + ": zero_point").c_str(), &per_channel);
  } else {
    const int64_t raw = checked_int(zp_obj, (name + ": zero_point").c_str());
    check_range(raw, zlo, zhi, name + ": zero_point");
    zp.push_back(static_cast<int32_t>(raw));
  }
  for (size_t i = 0; i < zp.size(); ++i) check_range(zp[i], zlo, zhi, name + ": zero_point[" + std::to_string(i) + "]");
  const Isa isa = saturating && isa_obj.is_none() ? runnable_isa("avx2") : parse_isa(isa_obj);
  if (saturating && isa != Isa::kAvx2) throw py::value_error(name + ": saturating pairs are the avx2 family's");
  std::shared_ptr<PackedWeights> out;
  {
    py::gil_scoped_release release;
    out = qgemm::pack_weights(w.data(), w_unsigned, K, N, N, zp.data(), per_channel, isa, saturating);
  }
  return out;
}

OutType parse_out_dtype(const py::handle& obj) {
  // Fast path: the plain strings the binders pass ("uint8", "int8", "int32", "float32").
  if (py::isinstance<py::str>(obj)) {
    const std::string s = obj.cast<std::string>();
    if (s == "uint8") return OutType::kU8;
    if (s == "int8") return OutType::kS8;
    if (s == "int32") return OutType::kS32;
    if (s == "float32") return OutType::kF32;
  }
  std::string name;
  try {
    name = py::module_::import("numpy").attr("dtype")(obj).attr("name").cast<std::string>();
  } catch (const py::error_already_set&) {
    throw py::value_error("qgemm: out_dtype: expected one of uint8, int8, int32, float32, got " +
                          py::repr(obj).cast<std::string>());
  }
  if (name == "uint8") return OutType::kU8;
  if (name == "int8") return OutType::kS8;
  if (name == "int32") return OutType::kS32;
  if (name == "float32") return OutType::kF32;
  throw py::value_error("qgemm: out_dtype: expected one of uint8, int8, int32, float32, got " + name);
}

py::dtype dtype_of(OutType t) {
  switch (t) {
    case OutType::kU8: return py::dtype::of<uint8_t>();
    case OutType::kS8: return py::dtype::of<int8_t>();
    case OutType::kS32: return py::dtype::of<int32_t>();
    case OutType::kF32: break;
  }
  return py::dtype::of<float>();
}

const char* out_name(OutType t) {
  switch (t) {
    case OutType::kU8: return "uint8";
    case OutType::kS8: return "int8";
    case OutType::kS32: return "int32";
    case OutType::kF32: break;
  }
  return "float32";
}

bool overlaps(const void* a, size_t a_bytes, const void* b, size_t b_bytes) {
  const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
  return a_bytes > 0 && b_bytes > 0 && pa < pb + b_bytes && pb < pa + a_bytes;
}

// A float32-output call's a_scale and a_zero_point read from arrays when the call runs
// (MatMulIntegerToFloat after a DynamicQuantizeLinear): a recorded call computes
// m[n] = f32(a_scale · b_scale[n]) (ms_qgemm.py (3)) and zx from their current values
// on every run of its program. `a_scale`, `a_zero_point` and `b_scale` point into arrays
// the program keeps alive (the arena's planned views and a constant).
struct RuntimeScale {
  const float* a_scale = nullptr;
  const void* a_zero_point = nullptr;  // null: zx = 0
  bool zero_point_signed = false;
  const float* b_scale = nullptr;  // as many values as the call's multipliers
};

// The float32 output stage of ms_qgemm.py (3) written out, for a multiplier the kernel
// refuses (not finite and > 0: a DynamicQuantizeLinear of a non-finite x): the raw
// accumulator from qgemm, then y = f32(f32(f32(acc) · m[n]) + bias[n]) per element, the
// twin's order (-ffp-contract=off keeps the product and the sum two roundings).
void qgemm_float_stage_unchecked(const QGemmParams& p, const std::vector<float>& mult, qgemm::Workspace& ws) {
  const int64_t M = p.M, N = p.w->N;
  std::vector<int32_t> acc(static_cast<size_t>(M * N));
  QGemmParams q = p;
  q.out_type = OutType::kS32;
  q.requant = Requant::kNone;
  q.multiplier = nullptr;
  q.multiplier_per_channel = false;
  q.float_bias = nullptr;
  q.y = acc.data();
  q.y_row_stride = N;
  ws.reserve(qgemm::qgemm_workspace_bytes(q));
  qgemm::qgemm(q, ws);
  float* y = static_cast<float*>(p.y);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float v = static_cast<float>(acc[static_cast<size_t>(m * N + n)]) * mult[p.multiplier_per_channel ? n : 0];
      if (p.float_bias != nullptr) v = v + p.float_bias[n];
      y[m * p.y_row_stride + n] = v;
    }
  }
}

py::array qgemm_run(const py::handle& x_obj, const std::shared_ptr<PackedWeights>& packed, const py::handle& zx_obj,
                    const py::handle& out_dtype_obj, const py::object& bias_obj, const py::object& float_bias_obj,
                    const py::object& multiplier_obj, const py::object& fixed_multiplier_obj,
                    const py::object& fixed_shift_obj, const py::handle& zy_obj, const py::object& clamp_obj,
                    int num_threads, const py::object& workspace_obj, const py::object& out_obj,
                    const py::object& row_bias_obj, const py::object& row_multiplier_obj, const py::object& post_obj,
                    const RuntimeScale* runtime_scale) {
  if (!packed) throw py::value_error("qgemm: packed: expected a PackedWeights, got None");
  const PackedWeights& w = *packed;
  const int64_t K = w.K, N = w.N;
  QGemmParams p;
  p.w = packed.get();

  // x: uint8 or int8 [..., K], C-contiguous.
  if (!py::isinstance<py::array>(x_obj)) throw py::value_error("qgemm: x: expected a numpy array");
  auto x_any = py::reinterpret_borrow<py::array>(x_obj);
  py::array x;
  if (dtype_equiv(x_any.dtype(), py::dtype::of<uint8_t>())) {
    x = require_array<uint8_t>(x_obj, "qgemm: x");
  } else if (dtype_equiv(x_any.dtype(), py::dtype::of<int8_t>())) {
    x = require_array<int8_t>(x_obj, "qgemm: x");
    p.x_signed = true;
  } else {
    throw py::value_error("qgemm: x: expected dtype uint8 or int8, got " + py::str(x_any.dtype()).cast<std::string>());
  }
  if (x.ndim() < 1) throw py::value_error("qgemm: x: expected an array of rank >= 1 [..., K], got a scalar");
  if (x.shape(x.ndim() - 1) != K) {
    throw py::value_error("qgemm: x: expected last dimension K = " + std::to_string(K) +
                          " (the packed weights' K), got shape " + shape_str(x));
  }
  p.M = 1;
  for (py::ssize_t d = 0; d + 1 < x.ndim(); ++d) p.M *= x.shape(d);
  p.x = x.data();
  p.x_row_stride = K;

  const std::string zx_what = std::string("qgemm: zx (x is ") + (p.x_signed ? "int8)" : "uint8)");
  const int64_t zx_lo = p.x_signed ? -128 : 0, zx_hi = p.x_signed ? 127 : 255;
  if (py::isinstance<py::array>(zx_obj) && py::reinterpret_borrow<py::array>(zx_obj).ndim() > 0) {
    // Per-row zero points: shape x.shape[:-1] (or flat (M,)).
    auto z = require_array<int32_t>(zx_obj, "qgemm: zx");
    bool rows_shape = z.ndim() == x.ndim() - 1;
    for (py::ssize_t d = 0; rows_shape && d < z.ndim(); ++d) rows_shape = z.shape(d) == x.shape(d);
    if (!(rows_shape || (z.ndim() == 1 && z.shape(0) == p.M))) {
      throw py::value_error("qgemm: zx: expected an integer or one zero point per row, shape " +
                            tuple_str(x.shape(), x.ndim() - 1) + ", got shape " + shape_str(z));
    }
    for (py::ssize_t i = 0; i < z.size(); ++i) {
      check_range(z.data()[i], zx_lo, zx_hi, zx_what + "[" + std::to_string(i) + "]");
    }
    p.zx_per_row = z.data();  // z borrows zx_obj, which outlives the call
  } else {
    const int64_t zx = checked_int(zx_obj, "qgemm: zx");
    check_range(zx, zx_lo, zx_hi, zx_what);
    p.zx = static_cast<int32_t>(zx);
  }

  p.out_type = parse_out_dtype(out_dtype_obj);
  const bool q8 = p.out_type == OutType::kU8 || p.out_type == OutType::kS8;
  const std::string on = out_name(p.out_type);

  if (!bias_obj.is_none()) {
    auto b = require_array<int32_t>(bias_obj, "qgemm: bias");
    if (b.ndim() != 1 || b.shape(0) != N) {
      throw py::value_error("qgemm: bias: expected shape (" + std::to_string(N) + ",), got shape " + shape_str(b));
    }
    p.bias = b.data();  // b borrows bias_obj, which outlives the call
  }
  if (!float_bias_obj.is_none()) {
    if (p.out_type != OutType::kF32) {
      throw py::value_error("qgemm: float_bias: expected None for out_dtype " + on + " (float32 output only)");
    }
    auto b = require_array<float>(float_bias_obj, "qgemm: float_bias");
    if (b.ndim() != 1 || b.shape(0) != N) {
      throw py::value_error("qgemm: float_bias: expected shape (" + std::to_string(N) + ",), got shape " +
                            shape_str(b));
    }
    p.float_bias = b.data();
  }

  // The transposed output stage (qgemm.h): per-row bias and multipliers.
  py::array_t<int32_t> row_bias;
  if (!row_bias_obj.is_none()) {
    row_bias = require_array<int32_t>(row_bias_obj, "qgemm: row_bias");
    if (row_bias.ndim() != 1 || row_bias.shape(0) != p.M) {
      throw py::value_error("qgemm: row_bias: expected shape (" + std::to_string(p.M) +
                            ",) (one per row of x), got shape " + shape_str(row_bias));
    }
    p.row_bias = row_bias.data();
  }
  py::array_t<float> row_mult;
  if (!row_multiplier_obj.is_none()) {
    if (!multiplier_obj.is_none() || !fixed_multiplier_obj.is_none() || !fixed_shift_obj.is_none()) {
      throw py::value_error(
          "qgemm: row_multiplier: expected None for multiplier / fixed_multiplier / fixed_shift "
          "when given (one float32 multiplier per row replaces them)");
    }
    row_mult = require_array<float>(row_multiplier_obj, "qgemm: row_multiplier");
    if (row_mult.ndim() != 1 || row_mult.shape(0) != p.M) {
      throw py::value_error("qgemm: row_multiplier: expected shape (" + std::to_string(p.M) +
                            ",) (one per row of x), got shape " + shape_str(row_mult));
    }
    for (py::ssize_t i = 0; i < row_mult.size(); ++i) {
      if (!(std::isfinite(row_mult.data()[i]) && row_mult.data()[i] > 0.0f)) {
        throw py::value_error("qgemm: row_multiplier[" + std::to_string(i) + "]: expected a finite value > 0, got " +
                              std::to_string(row_mult.data()[i]));
      }
    }
  }

  std::vector<float> mult;
  std::vector<int32_t> fmult, fshift;
  const bool has_row_mult = !row_multiplier_obj.is_none();
  const bool has_mult = !multiplier_obj.is_none() || has_row_mult;
  const bool has_fixed = !fixed_multiplier_obj.is_none() || !fixed_shift_obj.is_none();
  if (p.out_type == OutType::kS32) {
    if (has_mult || has_fixed) {
      throw py::value_error("qgemm: multiplier: expected None for out_dtype int32 (the raw accumulator)");
    }
  } else if (p.out_type == OutType::kF32) {
    if (!has_mult) {
      throw py::value_error("qgemm: multiplier: expected sx*sw (scalar or [N]) for out_dtype float32, got None");
    }
    if (has_fixed) throw py::value_error("qgemm: fixed_multiplier: expected None for out_dtype float32");
  } else if (has_mult == has_fixed) {
    throw py::value_error(
        "qgemm: expected exactly one of multiplier (float requantization) or fixed_multiplier + "
        "fixed_shift (fixed-point) for out_dtype " +
        on);
  }
  if (has_row_mult) {
    if (p.out_type == OutType::kS32) throw py::value_error("qgemm: row_multiplier: expected None for out_dtype int32");
    p.multiplier = row_mult.data();  // row_mult borrows row_multiplier_obj, which outlives the call
    p.multiplier_per_row = true;
    if (q8) p.requant = Requant::kFloat;
  } else if (has_mult) {
    mult = scalar_or_vector<float>(multiplier_obj, N, "qgemm: multiplier", &p.multiplier_per_channel);
    for (size_t i = 0; i < mult.size(); ++i) {
      if (!(std::isfinite(mult[i]) && mult[i] > 0.0f)) {
        throw py::value_error("qgemm: multiplier[" + std::to_string(i) + "]: expected a finite value > 0, got " +
                              std::to_string(mult[i]));
      }
    }
    p.multiplier = mult.data();
    if (q8) p.requant = Requant::kFloat;
  }
  if (has_fixed) {
    if (fixed_multiplier_obj.is_none() || fixed_shift_obj.is_none()) {
      throw py::value_error("qgemm: fixed_multiplier and fixed_shift: expected both, got only one");
    }
    bool pc_m = false, pc_s = false;
    fmult = scalar_or_vector<int32_t>(fixed_multiplier_obj, N, "qgemm: fixed_multiplier", &pc_m);
    fshift = scalar_or_vector<int32_t>(fixed_shift_obj, N, "qgemm: fixed_shift", &pc_s);
    for (size_t i = 0; i < fmult.size(); ++i) {
      check_range(fmult[i], 0, INT32_MAX, "qgemm: fixed_multiplier[" + std::to_string(i) + "]");
    }
    for (size_t i = 0; i < fshift.size(); ++i) {
      check_range(fshift[i], -31, 30, "qgemm: fixed_shift[" + std::to_string(i) + "]");
    }
    if (pc_m != pc_s) {  // broadcast the per-tensor one so both have N entries
      if (!pc_m) fmult.assign(static_cast<size_t>(N), fmult[0]);
      if (!pc_s) fshift.assign(static_cast<size_t>(N), fshift[0]);
    }
    p.fixed_per_channel = pc_m || pc_s;
    p.fixed_multiplier = fmult.data();
    p.fixed_shift = fshift.data();
    p.requant = Requant::kFixedPoint;
  }

  const int64_t qmin = p.out_type == OutType::kS8 ? -128 : 0;
  const int64_t qmax = p.out_type == OutType::kS8 ? 127 : 255;
  {
    const int64_t zy = checked_int(zy_obj, "qgemm: zy");
    if (q8) {
      check_range(zy, qmin, qmax, "qgemm: zy (out_dtype " + on + ")");
    } else if (zy != 0) {
      throw py::value_error("qgemm: zy: expected 0 for out_dtype " + on + " (uint8/int8 outputs only), got " +
                            std::to_string(zy));
    }
    p.zy = static_cast<int32_t>(zy);
  }

  if (!clamp_obj.is_none()) {
    py::sequence seq;
    try {
      seq = clamp_obj.cast<py::sequence>();
    } catch (const py::cast_error&) {
      throw py::value_error("qgemm: clamp: expected None or a pair (lo, hi)");
    }
    if (py::len(seq) != 2) throw py::value_error("qgemm: clamp: expected None or a pair (lo, hi)");
    p.has_clamp = true;
    if (p.out_type == OutType::kF32) {
      p.clamp_lo = seq[0].cast<double>();
      p.clamp_hi = seq[1].cast<double>();
      if (std::isnan(p.clamp_lo) || std::isnan(p.clamp_hi)) {
        throw py::value_error("qgemm: clamp: expected numbers, got NaN");
      }
    } else {
      const int64_t lo = checked_int(seq[0], "qgemm: clamp[0]"), hi = checked_int(seq[1], "qgemm: clamp[1]");
      const int64_t tmin = q8 ? qmin : INT32_MIN, tmax = q8 ? qmax : INT32_MAX;
      check_range(lo, tmin, tmax, "qgemm: clamp[0] (out_dtype " + on + ")");
      check_range(hi, tmin, tmax, "qgemm: clamp[1] (out_dtype " + on + ")");
      p.clamp_lo = static_cast<double>(lo);
      p.clamp_hi = static_cast<double>(hi);
    }
    if (p.clamp_lo > p.clamp_hi) {
      throw py::value_error("qgemm: clamp: expected lo <= hi, got (" + py::str(seq[0]).cast<std::string>() + ", " +
                            py::str(seq[1]).cast<std::string>() + ")");
    }
  }

  // The second affine stage (qgemm.h post_k): k, u borrowed from post_obj (like bias).
  if (!post_obj.is_none()) {
    if (!q8 || p.requant != Requant::kFloat) {
      throw py::value_error("qgemm: post_add: expected None unless out_dtype is uint8/int8 with a float multiplier");
    }
    py::tuple t;
    try {
      t = post_obj.cast<py::tuple>();
    } catch (const py::cast_error&) {
      throw py::value_error("qgemm: post_add: expected a tuple (k: float32[N], u: float32[N], r1, r2)");
    }
    if (py::len(t) != 4)
      throw py::value_error("qgemm: post_add: expected a tuple (k: float32[N], u: float32[N], r1, r2)");
    const char* names[2] = {"qgemm: post_add k", "qgemm: post_add u"};
    const float* ptr[2] = {nullptr, nullptr};
    for (int i = 0; i < 2; ++i) {
      auto a = require_array<float>(t[i], names[i]);
      if (a.ndim() != 1 || a.shape(0) != N) {
        throw py::value_error(std::string(names[i]) + ": expected shape (" + std::to_string(N) + ",), got shape " +
                              shape_str(a));
      }
      for (py::ssize_t j = 0; j < a.size(); ++j) {
        if (!std::isfinite(a.data()[j])) {
          throw py::value_error(std::string(names[i]) + "[" + std::to_string(j) + "]: expected a finite value, got " +
                                std::to_string(a.data()[j]));
        }
      }
      ptr[i] = a.data();  // a borrows the tuple's array, which outlives the call
    }
    const float r1 = t[2].cast<float>(), r2 = t[3].cast<float>();
    if (!std::isfinite(r1) || !std::isfinite(r2)) {
      throw py::value_error("qgemm: post_add r1, r2: expected finite values, got " + std::to_string(r1) + ", " +
                            std::to_string(r2));
    }
    p.post_k = ptr[0];
    p.post_u = ptr[1];
    p.post_r1 = r1;
    p.post_r2 = r2;
  }

  if (num_threads < 1) throw py::value_error("qgemm: num_threads: expected >= 1, got " + std::to_string(num_threads));
  p.num_threads = num_threads;

  if (!isa_supported(w.isa)) {
    throw py::value_error(std::string("qgemm: packed: weights were packed for '") + isa_name(w.isa) +
                          "', which this CPU does not support");
  }

  // Output: [..., N].
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + x.ndim() - 1);
  shape.push_back(static_cast<py::ssize_t>(N));
  py::array y;
  const py::dtype ydt = dtype_of(p.out_type);
  if (out_obj.is_none()) {
    note_new_output();
    y = py::array(ydt, shape);
  } else {
    if (!py::isinstance<py::array>(out_obj)) throw py::value_error("qgemm: out: expected a numpy array or None");
    y = py::reinterpret_borrow<py::array>(out_obj);
    if (!dtype_equiv(y.dtype(), ydt)) {
      throw py::value_error("qgemm: out: expected dtype " + on + ", got " + py::str(y.dtype()).cast<std::string>());
    }
    bool same = y.ndim() == static_cast<py::ssize_t>(shape.size());
    for (size_t d = 0; same && d < shape.size(); ++d) same = y.shape(d) == shape[d];
    if (!same) {
      throw py::value_error("qgemm: out: expected shape " +
                            tuple_str(shape.data(), static_cast<py::ssize_t>(shape.size())) + ", got shape " +
                            shape_str(y));
    }
    if (!(y.flags() & py::array::c_style)) throw py::value_error("qgemm: out: expected a C-contiguous array");
    if (!y.writeable()) throw py::value_error("qgemm: out: expected a writeable array");
    if (overlaps(y.data(), static_cast<size_t>(y.nbytes()), x.data(), static_cast<size_t>(x.nbytes()))) {
      throw py::value_error("qgemm: out: expected a buffer that does not overlap x");
    }
  }
  p.y = y.mutable_data();
  p.y_row_stride = N;

  PyWorkspace local;
  PyWorkspace* wsp = &local;
  if (!workspace_obj.is_none()) {
    try {
      wsp = workspace_obj.cast<PyWorkspace*>();
    } catch (const py::cast_error&) {
      throw py::value_error("qgemm: workspace: expected a QGemmWorkspace or None");
    }
  }
  const size_t need = qgemm::qgemm_workspace_bytes(p);
  if (CallRecorder* recorder = call_recorder()) {
    // A recorded call (a native program's step, bindings.h run_or_record): its own
    // workspace, the packed weights held, and its own copies of the multipliers this
    // call converted (p points into them); x, y and the caller's parameter arrays stay
    // where they are for the program's life.
    auto own = std::make_shared<PyWorkspace>();
    own->ws.reserve(need);
    const bool local_mult = !mult.empty() && p.multiplier == mult.data();
    const bool local_fixed = !fmult.empty() && p.fixed_multiplier == fmult.data();
    if (runtime_scale != nullptr) {
      if (!local_mult || p.out_type != OutType::kF32) {
        throw py::value_error("qgemm: a run-time a_scale needs the float32 output and its own multipliers");
      }
      const RuntimeScale rs = *runtime_scale;
      recorder->calls.emplace_back([p, own, packed, mult, rs]() mutable {
        p.multiplier = mult.data();
        const float sa = *rs.a_scale;
        bool valid = true;
        for (size_t i = 0; i < mult.size(); ++i) {
          mult[i] = sa * rs.b_scale[i];
          valid = valid && std::isfinite(mult[i]) && mult[i] > 0.0f;
        }
        if (rs.a_zero_point != nullptr) {
          p.zx = rs.zero_point_signed ? *static_cast<const int8_t*>(rs.a_zero_point)
                                      : *static_cast<const uint8_t*>(rs.a_zero_point);
        }
        if (valid) {
          qgemm::qgemm(p, own->ws);
        } else {
          qgemm_float_stage_unchecked(p, mult, own->ws);
        }
      });
      return y;
    }
    recorder->calls.emplace_back([p, own, packed, mult, fmult, fshift, local_mult, local_fixed]() mutable {
      if (local_mult) p.multiplier = mult.data();
      if (local_fixed) p.fixed_multiplier = fmult.data(), p.fixed_shift = fshift.data();
      qgemm::qgemm(p, own->ws);
    });
    return y;
  }
  BusyGuard<PyWorkspace> guard(*wsp, "qgemm: workspace");
  wsp->ws.reserve(need);  // allocates only when this call needs more than any before
  {
    py::gil_scoped_release release;
    qgemm::qgemm(p, wsp->ws);
  }
  return y;
}

py::array qgemm_impl(const py::handle& x_obj, const std::shared_ptr<PackedWeights>& packed, const py::handle& zx_obj,
                     const py::handle& out_dtype_obj, const py::object& bias_obj, const py::object& float_bias_obj,
                     const py::object& multiplier_obj, const py::object& fixed_multiplier_obj,
                     const py::object& fixed_shift_obj, const py::handle& zy_obj, const py::object& clamp_obj,
                     int num_threads, const py::object& workspace_obj, const py::object& out_obj,
                     const py::object& row_bias_obj, const py::object& row_multiplier_obj, const py::object& post_obj) {
  return qgemm_run(x_obj, packed, zx_obj, out_dtype_obj, bias_obj, float_bias_obj, multiplier_obj, fixed_multiplier_obj,
                   fixed_shift_obj, zy_obj, clamp_obj, num_threads, workspace_obj, out_obj, row_bias_obj,
                   row_multiplier_obj, post_obj, nullptr);
}

py::array_t<int32_t> column_sums(const PackedWeights& w) {
  py::array_t<int32_t> out(static_cast<py::ssize_t>(w.N));
  std::copy(w.column_sums_ptr(), w.column_sums_ptr() + w.N, out.mutable_data());
  return out;
}

py::array_t<int32_t> zero_points(const PackedWeights& w) {
  py::array_t<int32_t> out(static_cast<py::ssize_t>(w.N));
  for (int64_t n = 0; n < w.N; ++n) out.mutable_data()[n] = w.zero_point_ptr()[n] + (w.weights_unsigned ? 128 : 0);
  return out;
}

}  // namespace

void register_qgemm(py::module_& m) {
  py::class_<PackedWeights, std::shared_ptr<PackedWeights>>(
      m, "PackedWeights", "Weights prepacked for one ISA's qgemm micro-kernel, with their column sums (qgemm.h).")
      .def_property_readonly("K", [](const PackedWeights& w) { return w.K; })
      .def_property_readonly("N", [](const PackedWeights& w) { return w.N; })
      .def_property_readonly("isa", [](const PackedWeights& w) { return std::string(isa_name(w.isa)); })
      .def_property_readonly("kernel", [](const PackedWeights& w) { return qgemm::qgemm_kernel_name(w); })
      .def_property_readonly("weights_dtype",
                             [](const PackedWeights& w) { return std::string(w.weights_unsigned ? "uint8" : "int8"); })
      .def_property_readonly(
          "nbytes", [](const PackedWeights& w) { return w.data.size() + w.column_sums.size() + w.zero_point.size(); })
      .def_property_readonly("column_sums", &column_sums, "cs[n] = Σ_k (w[k,n] − zw[n]) (int32, wrapping).")
      .def_property_readonly("zero_point", &zero_points, "zw[n] in the weights' own dtype range.")
      .def("__repr__", [](const PackedWeights& w) {
        return "<PackedWeights K=" + std::to_string(w.K) + " N=" + std::to_string(w.N) + " " +
               qgemm::qgemm_kernel_name(w) + ">";
      });

  py::class_<PyWorkspace>(m, "QGemmWorkspace", "Scratch for qgemm, grown on first use and reused; one call at a time.")
      .def(py::init<>())
      .def_property_readonly("nbytes", [](const PyWorkspace& w) { return w.ws.size(); });

  m.def(
      "pack_weights_s8",
      [](const py::handle& w, const py::handle& zp, const py::object& isa, bool saturating) {
        return pack_impl<int8_t>(w, zp, isa, "pack_weights_s8", saturating);
      },
      py::arg("w"), py::arg("zero_point") = 0, py::arg("isa") = py::none(), py::arg("saturating") = false,
      "Prepack int8 weights w[K, N] (zero_point: int or int32[N], in [-128, 127]) for `isa` (default: active). "
      "saturating: the avx2 vpmaddubsw family whatever w's range (isa default: avx2), ONNX Runtime's "
      "saturating u8·s8 pairs on CPUs without VNNI.");
  m.def(
      "pack_weights_u8",
      [](const py::handle& w, const py::handle& zp, const py::object& isa) {
        return pack_impl<uint8_t>(w, zp, isa, "pack_weights_u8");
      },
      py::arg("w"), py::arg("zero_point") = 0, py::arg("isa") = py::none(),
      "Prepack uint8 weights w[K, N] (zero_point: int or int32[N], in [0, 255]) for `isa` (default: active).");
  m.def("qgemm", &qgemm_impl, py::arg("x"), py::arg("packed"), py::arg("zx"), py::arg("out_dtype") = "int32",
        py::kw_only(), py::arg("bias") = py::none(), py::arg("float_bias") = py::none(),
        py::arg("multiplier") = py::none(), py::arg("fixed_multiplier") = py::none(),
        py::arg("fixed_shift") = py::none(), py::arg("zy") = 0, py::arg("clamp") = py::none(),
        py::arg("num_threads") = 1, py::arg("workspace") = py::none(), py::arg("out") = py::none(),
        py::arg("row_bias") = py::none(), py::arg("row_multiplier") = py::none(), py::arg("post_add") = py::none(),
        "y = output_stage(Σ_k (x − zx)(w − zw) + bias [+ row_bias[m]]), multiplier per column or "
        "row_multiplier per row; see quanta/kernels/cpp/qgemm/qgemm.h.");
  // The same call with its common arguments by position: pybind11 looks every keyword
  // parameter of a call that passes keywords up by name (a string made, hashed and
  // compared per parameter), about as long as a one-row product itself.
  m.def(
      "qgemm_call",
      [](const py::handle& x, const std::shared_ptr<PackedWeights>& packed, const py::handle& zx,
         const py::handle& out_dtype, const py::object& bias, const py::object& multiplier, const py::handle& zy,
         int num_threads, const py::object& workspace, const py::object& out) {
        const py::none none;
        return qgemm_impl(x, packed, zx, out_dtype, bias, none, multiplier, none, none, zy, none, num_threads,
                          workspace, out, none, none, none);
      },
      py::arg("x"), py::arg("packed"), py::arg("zx"), py::arg("out_dtype"), py::arg("bias"), py::arg("multiplier"),
      py::arg("zy"), py::arg("num_threads"), py::arg("workspace"), py::arg("out"),
      "qgemm(x, packed, zx, out_dtype, bias=bias, multiplier=multiplier, zy=zy, num_threads=num_threads, "
      "workspace=workspace, out=out), every argument by position.");
  // The uint8/int8 output with the second affine stage (a fused QLinearMatMul + QLinearAdd
  // of a constant), every argument by position.
  m.def(
      "qgemm_call_post",
      [](const py::handle& x, const std::shared_ptr<PackedWeights>& packed, const py::handle& zx,
         const py::handle& out_dtype, const py::object& multiplier, const py::handle& zy, const py::object& post_add,
         int num_threads, const py::object& workspace, const py::object& out) {
        const py::none none;
        return qgemm_impl(x, packed, zx, out_dtype, none, none, multiplier, none, none, zy, none, num_threads,
                          workspace, out, none, none, post_add);
      },
      py::arg("x"), py::arg("packed"), py::arg("zx"), py::arg("out_dtype"), py::arg("multiplier"), py::arg("zy"),
      py::arg("post_add"), py::arg("num_threads"), py::arg("workspace"), py::arg("out"),
      "qgemm(x, packed, zx, out_dtype, multiplier=multiplier, zy=zy, post_add=post_add, num_threads=num_threads, "
      "workspace=workspace, out=out), every argument by position.");
  // The float32 output with a float bias (MatMulIntegerToFloat on a prepacked b), every
  // argument by position.
  m.def(
      "qgemm_call_float",
      [](const py::handle& x, const std::shared_ptr<PackedWeights>& packed, const py::handle& zx,
         const py::object& float_bias, const py::object& multiplier, int num_threads, const py::object& workspace,
         const py::object& out) {
        const py::none none;
        return qgemm_impl(x, packed, zx, py::str("float32"), none, float_bias, multiplier, none, none, py::int_(0),
                          none, num_threads, workspace, out, none, none, none);
      },
      py::arg("x"), py::arg("packed"), py::arg("zx"), py::arg("float_bias"), py::arg("multiplier"),
      py::arg("num_threads"), py::arg("workspace"), py::arg("out"),
      "qgemm(x, packed, zx, 'float32', float_bias=float_bias, multiplier=multiplier, num_threads=num_threads, "
      "workspace=workspace, out=out), every argument by position.");
  // MatMulIntegerToFloat with a run-time a_scale and a_zero_point (ONNX Runtime's
  // quantize_dynamic: a DynamicQuantizeLinear feeds them): the multiplier f32(sa · sb[n])
  // (one float32 product each, as NumPy's) made here, with its checks, instead of by
  // NumPy per call. ValueError when a_scale is not one float32, a_zero_point not one
  // value of x's type, or a product not finite and > 0 (the caller's generic path).
  // Recorded into a native program, the call reads a_scale and a_zero_point on every run
  // (RuntimeScale): their arrays are a DynamicQuantizeLinear's planned outputs, which its
  // own recorded step writes just before.
  m.def(
      "qgemm_scaled_float",
      [](const py::handle& x, const std::shared_ptr<PackedWeights>& packed, const py::handle& a_scale,
         const py::object& a_zero_point, const py::handle& b_scale, const py::object& float_bias, int num_threads,
         const py::object& workspace, const py::object& out) {
        const auto one = [](const py::array& a) { return a.ndim() == 0 || (a.ndim() == 1 && a.shape(0) == 1); };
        if (!py::isinstance<py::array>(x)) throw py::value_error("qgemm_scaled_float: x: expected a numpy array");
        auto sa = require_array<float>(a_scale, "qgemm_scaled_float: a_scale");
        if (!one(sa)) throw py::value_error("qgemm_scaled_float: a_scale: expected one value");
        int64_t z = 0;
        if (!a_zero_point.is_none()) {
          if (!py::isinstance<py::array>(a_zero_point)) {
            throw py::value_error("qgemm_scaled_float: a_zero_point: expected a numpy array");
          }
          auto za = py::reinterpret_borrow<py::array>(a_zero_point);
          const py::dtype xdt = py::reinterpret_borrow<py::array>(x).dtype();
          if (!dtype_equiv(za.dtype(), xdt) || !one(za) || !(za.flags() & py::array::c_style)) {
            throw py::value_error("qgemm_scaled_float: a_zero_point: expected one value of x's type");
          }
          z = dtype_equiv(xdt, py::dtype::of<int8_t>()) ? *static_cast<const int8_t*>(za.data())
                                                        : *static_cast<const uint8_t*>(za.data());
        }
        RuntimeScale rs;
        rs.a_scale = sa.data();
        if (!a_zero_point.is_none()) {
          const auto za = py::reinterpret_borrow<py::array>(a_zero_point);
          rs.a_zero_point = za.data();
          rs.zero_point_signed = dtype_equiv(za.dtype(), py::dtype::of<int8_t>());
        }
        auto sb = require_array<float>(b_scale, "qgemm_scaled_float: b_scale");
        rs.b_scale = sb.data();
        py::array_t<float> m(shape_of(sb));
        const float s = *sa.data();
        const float* pb = sb.data();
        float* pm = m.mutable_data();
        // a recorded call computes its multipliers from a_scale on every run, and takes
        // the twin's steps for one the kernel refuses: a_scale's value while recording
        // (an arena place no run has written yet) does not matter, so 1 stands in
        const bool recording = call_recorder() != nullptr;
        for (py::ssize_t i = 0; i < sb.size(); ++i) {
          pm[i] = recording ? 1.0f : s * pb[i];
          if (!(std::isfinite(pm[i]) && pm[i] > 0.0f)) {
            throw py::value_error("qgemm_scaled_float: a multiplier a_scale * b_scale not finite and > 0");
          }
        }
        const py::none none;
        return qgemm_run(x, packed, py::int_(z), py::str("float32"), none, float_bias, m, none, none, py::int_(0), none,
                         num_threads, workspace, out, none, none, none, &rs);
      },
      py::arg("x"), py::arg("packed"), py::arg("a_scale"), py::arg("a_zero_point"), py::arg("b_scale"),
      py::arg("float_bias"), py::arg("num_threads"), py::arg("workspace"), py::arg("out"),
      "qgemm(x, packed, a_zero_point, 'float32', float_bias=float_bias, multiplier=f32(a_scale * b_scale), ...), "
      "a_scale / a_zero_point one value each (else ValueError), every argument by position.");
  m.def("pool_rest", &qgemm::pool_rest,
        "Let the kernel pool's spinning workers sleep now (before NumPy/BLAS work that runs its own "
        "threads); the next parallel kernel wakes them.");
  m.def(
      "pool_stats",
      [] {
        const qgemm::PoolStats st = qgemm::pool_stats();
        py::dict d;
        d["jobs"] = st.jobs;
        d["solo_jobs"] = st.solo_jobs;
        d["backoffs"] = st.backoffs;
        d["preemptions"] = st.preemptions;
        d["caller_chunks"] = st.caller_chunks;
        d["worker_chunks"] = st.worker_chunks;
        d["publish_ns"] = st.publish_ns;
        d["wait_ns"] = st.wait_ns;
        d["colocated"] = st.colocated;
        d["caller_work_ns"] = st.caller_work_ns;
        d["worker_work_ns"] = st.worker_work_ns;
        d["worker_spin_ns"] = st.worker_spin_ns;
        return d;
      },
      "The pool's counters: parallel jobs, jobs run on the caller alone by the contention "
      "back-off, back-offs from a late worker, workers descheduled while spinning; chunks run by "
      "the caller and by the workers, ns the caller spent publishing jobs and waiting for workers.");
  m.def("pool_set_backoff", &qgemm::pool_set_backoff, py::arg("enabled"),
        "Turn the pool's contention back-off on or off (on unless QUANTA_POOL_BACKOFF=0).");
  m.def("pool_solo_for", &qgemm::pool_solo_for, py::arg("microseconds"),
        "Run every parallel job on the caller alone for the next `microseconds` (0: end it).");
  m.def(
      "qgemm_kernel_name", [](const py::object& isa) { return qgemm::qgemm_kernel_name(parse_isa(isa)); },
      py::arg("isa") = py::none(), "Micro-kernel family name (docs/kernels.md grammar).");
  m.def(
      "vnni_peak_probe",
      [](double seconds) {
        if (!isa_supported(Isa::kAvx512Vnni)) {
          throw py::value_error("vnni_peak_probe: expected a CPU with avx512vnni, this one has none");
        }
        if (!(seconds > 0.0 && seconds <= 60.0)) {
          throw py::value_error("vnni_peak_probe: seconds: expected a value in (0, 60], got " +
                                std::to_string(seconds));
        }
        py::gil_scoped_release release;
        return qgemm::vnni_peak_probe(seconds);
      },
      py::arg("seconds") = 0.2, "vpdpbusd throughput in GOPS (2 ops per multiply-add), one thread.");
}

}  // namespace quanta
