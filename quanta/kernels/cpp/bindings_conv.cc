// Bindings for the convolution kernels (conv/conv.h): the entry layer. Every argument is
// checked here (dtype, rank, shape, contiguity, ranges, aliasing) and a ValueError names
// the argument with what was expected and what was given, in the wording of the NumPy
// twins (reference/qlinear_conv.py, integer_ops.py, conv_geometry.py), before a pointer
// reaches the driver.
//
//   QConv(w: int8|uint8 [M, C/group, *kernel], w_zero_point: int | array (1 or M) = 0, *,
//         group=1, kernel_shape=None, strides=None, dilations=None, pads=None,
//         auto_pad="NOTSET", isa=None)            weights prepacked once, for `isa`
//     .qlinear(x, x_scale, x_zero_point, w_scale, y_scale, y_zero_point, bias=None, *,
//              num_threads=1, out=None, channels_last=False) -> [N, M, *out] of y_zero_point's dtype
//     .integer(x, x_zero_point=None, *, num_threads=1, out=None, channels_last=False)
//              -> int32 [N, M, *out]
//     .output_shape(x_shape, channels_last=False) -> tuple
//   channels_last=True (com.microsoft QLinearConv channels_last=1): x is [N, *spatial, C]
//   and y [N, *out, M]; w keeps its ONNX layout [M, C/group, *kernel].
//   The object owns its workspace (grown on the first call of a shape, then reused); a
//   second concurrent call runs on a temporary one.
#include <pybind11/stl.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "conv/conv.h"

namespace quanta {
namespace {

using conv::AutoPad;
using conv::OutType;

std::string tuple_str(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t d = 0; d < dims.size(); ++d) s += (d ? ", " : "") + std::to_string(dims[d]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

std::string list_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t d = 0; d < v.size(); ++d) s += (d ? ", " : "") + std::to_string(v[d]);
  return s + "]";
}

std::vector<int64_t> dims_of(const py::array& a) { return std::vector<int64_t>(a.shape(), a.shape() + a.ndim()); }

std::string dtype_name(const py::array& a) { return py::str(a.dtype()).cast<std::string>(); }

// None: the active ISA; else the named one, which this CPU must run (dispatch.h).
Isa parse_isa(const py::object& isa) { return isa.is_none() ? active_isa() : runnable_isa(py::str(isa)); }

// numpy.asarray for anything that is not an ndarray yet (numpy scalars, Python numbers).
py::array as_array(const py::handle& obj) {
  if (py::isinstance<py::array>(obj)) return py::reinterpret_borrow<py::array>(obj);
  return py::module_::import("numpy").attr("asarray")(obj);
}

// numpy type numbers (NPY_TYPES): checking them costs no attribute lookup, which keeps
// the per-call overhead of a small convolution low.
enum : int { kNpyInt8 = 1, kNpyUint8 = 2, kNpyInt32 = 5, kNpyFloat32 = 11 };

int type_num(const py::array& a) { return a.dtype().num(); }

std::vector<int64_t> int_list(const py::object& obj, const char* what) {
  std::vector<int64_t> v;
  try {
    for (const auto& item : obj) v.push_back(py::module_::import("operator").attr("index")(item).cast<int64_t>());
  } catch (const py::error_already_set&) {
    throw py::value_error(std::string(what) + ": expected a list of integers, got " +
                          py::repr(obj).cast<std::string>());
  } catch (const py::cast_error&) {
    throw py::value_error(std::string(what) + ": expected a list of integers, got " +
                          py::repr(obj).cast<std::string>());
  }
  return v;
}

// Integer values of a zero point: a Python int or an integer array of 1 (or n) values,
// each in [lo, hi]. want_num: the dtype the array must have (ONNX: its input's), or -1.
std::vector<int32_t> zero_points(const py::handle& obj, int64_t n, int64_t lo, int64_t hi, const std::string& what,
                                 int want_num, const char* want_name) {
  std::vector<int32_t> out;
  if (py::isinstance<py::int_>(obj) && !py::isinstance<py::bool_>(obj)) {
    const int64_t v = obj.cast<int64_t>();
    if (v < lo || v > hi) {
      throw py::value_error(what + ": expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(v));
    }
    out.push_back(static_cast<int32_t>(v));
    return out;
  }
  py::array a = as_array(obj);
  const int num = type_num(a);
  if (want_num >= 0 && num != want_num) {
    throw py::value_error(what + ": expected the type of its input (" + want_name + "), got " + dtype_name(a));
  }
  const int64_t size = a.size();
  if (!(size == 1 || (size == n && n > 1 && a.ndim() == 1))) {
    throw py::value_error(
        what + ": expected a scalar" +
        (n > 1 ? " or a 1-D tensor of " + std::to_string(n) + " (output channels)" : std::string(" (per-tensor)")) +
        ", got shape " + tuple_str(dims_of(a)));
  }
  if (size == 1 && (num == kNpyUint8 || num == kNpyInt8)) {  // the common case: no conversion
    const int64_t v = num == kNpyUint8 ? *static_cast<const uint8_t*>(a.data()) : *static_cast<const int8_t*>(a.data());
    if (v < lo || v > hi) {
      throw py::value_error(what + ": expected a value in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(v));
    }
    out.push_back(static_cast<int32_t>(v));
    return out;
  }
  const char kind = a.dtype().kind();
  if (kind != 'i' && kind != 'u') throw py::value_error(what + ": expected integers, got " + dtype_name(a));
  py::array_t<int64_t, py::array::c_style | py::array::forcecast> v(a);
  for (int64_t i = 0; i < size; ++i) {
    const int64_t z = v.data()[i];
    if (z < lo || z > hi) {
      throw py::value_error(what + ": expected values in [" + std::to_string(lo) + ", " + std::to_string(hi) +
                            "], got " + std::to_string(z));
    }
    out.push_back(static_cast<int32_t>(z));
  }
  return out;
}

// float32 values of a scale: 1 value, or n (n > 1: per output channel).
std::vector<float> scales(const py::handle& obj, int64_t n, const std::string& what) {
  py::array a = as_array(obj);
  const int64_t size = a.size();
  if (!(size == 1 || (n > 1 && size == n && a.ndim() == 1))) {
    if (n > 1) {
      throw py::value_error(what + ": expected a scalar or a 1-D tensor of " + std::to_string(n) +
                            " (output channels), got shape " + tuple_str(dims_of(a)));
    }
    throw py::value_error(what + ": expected a scalar (per-tensor), got shape " + tuple_str(dims_of(a)));
  }
  if (type_num(a) == kNpyFloat32 && (size == 1 || (a.flags() & py::array::c_style))) {  // no conversion
    const float* p = static_cast<const float*>(a.data());
    return std::vector<float>(p, p + size);
  }
  const char kind = a.dtype().kind();
  if (kind != 'f' && kind != 'i' && kind != 'u') {
    throw py::value_error(what + ": expected a float32 scale, got " + dtype_name(a));
  }
  py::array_t<float, py::array::c_style | py::array::forcecast> v(a);  // numpy's float32 rounding
  return std::vector<float>(v.data(), v.data() + size);
}

struct PyConv {
  // the weights array QConv reads in place (its pointwise operand); declared before conv
  // so that the QConv goes first. quanta's binders pass the plan's constant, which nothing
  // writes after compile.
  py::object w_keep;
  std::shared_ptr<conv::QConv> conv;
  conv::ConvWorkspace ws;
  std::atomic<bool> busy{false};

  // x: [N, C, *spatial] uint8/int8 C-contiguous of the kernel's spatial rank.
  py::array check_x(const py::handle& x_obj, const char* fn, bool channels_last, bool* x_signed) const {
    if (!py::isinstance<py::array>(x_obj)) throw py::value_error(std::string(fn) + ": x: expected a numpy array");
    auto x = py::reinterpret_borrow<py::array>(x_obj);
    const int num = type_num(x);
    if (num != kNpyUint8 && num != kNpyInt8) {
      throw py::value_error(std::string(fn) + ": x: expected int8 or uint8, got " + dtype_name(x));
    }
    *x_signed = num == kNpyInt8;
    const int rank = conv->attributes().spatial_rank + 2;
    if (x.ndim() != rank) {
      const std::string dims =
          channels_last ? (rank == 4 ? "N, H, W, C" : "N, W, C") : (rank == 4 ? "N, C, H, W" : "N, C, W");
      throw py::value_error(std::string(fn) + ": x: expected rank " + std::to_string(rank) + " (" + dims +
                            ") like w, got shape " + tuple_str(dims_of(x)));
    }
    if (!(x.flags() & py::array::c_style)) {
      throw py::value_error(std::string(fn) + ": x: expected a C-contiguous array");
    }
    return x;
  }

  // The geometry of an input shape ([N, C, *spatial], or [N, *spatial, C] channels_last).
  conv::Geometry resolve_shape(const std::vector<int64_t>& shape, bool channels_last) const {
    const bool two_d = conv->attributes().spatial_rank == 2;
    const int64_t N = shape[0], C = channels_last ? shape.back() : shape[1];
    const int64_t s0 = channels_last ? 1 : 2;
    return conv->resolve(N, C, two_d ? shape[s0] : 1, two_d ? shape[s0 + 1] : shape[s0]);
  }

  conv::Geometry geometry(const py::array& x, const char* fn, bool channels_last) const {
    try {
      return resolve_shape(dims_of(x), channels_last);
    } catch (const std::invalid_argument& e) {
      throw py::value_error(std::string(fn) + ": " + e.what());
    }
  }

  std::vector<int64_t> out_shape(const conv::Geometry& g, bool channels_last) const {
    if (conv->attributes().spatial_rank == 2) {
      if (channels_last) return {g.N, g.OH, g.OW, g.M};
      return {g.N, g.M, g.OH, g.OW};
    }
    if (channels_last) return {g.N, g.OW, g.M};
    return {g.N, g.M, g.OW};
  }

  py::array output(const py::object& out_obj, const std::vector<int64_t>& shape, const py::dtype& dt,
                   const py::array& x, const char* fn) const {
    if (out_obj.is_none())
      return note_new_output(), py::array(dt, std::vector<py::ssize_t>(shape.begin(), shape.end()));
    if (!py::isinstance<py::array>(out_obj)) {
      throw py::value_error(std::string(fn) + ": out: expected a numpy array or None");
    }
    auto y = py::reinterpret_borrow<py::array>(out_obj);
    if (y.dtype().num() != dt.num()) {
      throw py::value_error(std::string(fn) + ": out: expected dtype " + py::str(dt).cast<std::string>() + ", got " +
                            dtype_name(y));
    }
    if (dims_of(y) != shape) {
      throw py::value_error(std::string(fn) + ": out: expected shape " + tuple_str(shape) + ", got shape " +
                            tuple_str(dims_of(y)));
    }
    if (!(y.flags() & py::array::c_style))
      throw py::value_error(std::string(fn) + ": out: expected a C-contiguous array");
    if (!y.writeable()) throw py::value_error(std::string(fn) + ": out: expected a writeable array");
    const auto px = reinterpret_cast<uintptr_t>(x.data()), py_ = reinterpret_cast<uintptr_t>(y.data());
    const auto nx = static_cast<uintptr_t>(x.nbytes()), ny = static_cast<uintptr_t>(y.nbytes());
    if (nx > 0 && ny > 0 && px < py_ + ny && py_ < px + nx) {
      throw py::value_error(std::string(fn) + ": out: expected a buffer that does not overlap x");
    }
    return y;
  }

  // `keep`: what args points into beyond x and y (a QLinearConv's converted parameters),
  // held by a recorded call.
  void execute(conv::ConvArgs& args, const conv::Geometry& geo, std::shared_ptr<const void> keep = nullptr) {
    if (CallRecorder* recorder = call_recorder()) {
      // A recorded call (a native program's step, bindings.h run_or_record): this
      // convolution (its Python object is held by the recording caller), x and y at the
      // same places for the program's life; the workspace as a direct call would take it.
      recorder->calls.emplace_back([this, args, geo, keep]() mutable { run_unlocked(args, geo); });
      return;
    }
    bool expected = false;
    const bool mine = busy.compare_exchange_strong(expected, true);
    conv::ConvWorkspace local;
    conv::ConvWorkspace& w = mine ? ws : local;  // a concurrent call gets its own scratch
    try {
      conv->reserve_workspace(args, geo, w);  // allocates only when this shape needs more
      py::gil_scoped_release release;
      conv->run(args, geo, w);
    } catch (...) {
      if (mine) busy.store(false);
      throw;
    }
    if (mine) busy.store(false);
  }

  // execute's body without the GIL (a native program runs it with the GIL released).
  void run_unlocked(conv::ConvArgs& args, const conv::Geometry& geo) {
    bool expected = false;
    const bool mine = busy.compare_exchange_strong(expected, true);
    conv::ConvWorkspace local;
    conv::ConvWorkspace& w = mine ? ws : local;
    try {
      conv->reserve_workspace(args, geo, w);
      conv->run(args, geo, w);
    } catch (...) {
      if (mine) busy.store(false);
      throw;
    }
    if (mine) busy.store(false);
  }

  // The requantization parameters of a QLinearConv call, validated and converted once:
  // per call (qlinear) or at compile time for constant parameters (prepare + run). The
  // multiplier arrives derived (passes/lower/requant_params.py: the lowering carries it
  // on the node); this binding never computes one from scales.
  struct QParams {
    bool x_signed = false, y_signed = false;
    int32_t zx = 0, zy = 0;
    int32_t clamp_lo = INT32_MIN, clamp_hi = INT32_MAX;  // the output code clamp (conv.h), in y's range
    std::vector<float> mult;                             // m[c] = f32(f32(sx·sw[c]) / sy), as given
    std::vector<int32_t> bias;                           // empty: no bias
  };
  // swapped whole (std::atomic_load / atomic_store): a call holds its own reference, so a
  // prepare() from another thread never changes parameters under a running call
  std::shared_ptr<const QParams> prepared;

  QParams make_qparams(const py::handle& zx_obj, bool x_signed, const py::handle& mult_obj, const py::handle& zy_obj,
                       const py::object& bias_obj, const py::object& clamp_obj) const {
    const char* fn = "QLinearConv";
    const int64_t M = conv->M();
    QParams q;
    q.x_signed = x_signed;
    q.zx = zero_points(zx_obj, 1, x_signed ? -128 : 0, x_signed ? 127 : 255, std::string(fn) + ": x_zero_point",
                       x_signed ? kNpyInt8 : kNpyUint8, x_signed ? "int8" : "uint8")[0];
    py::array zy = as_array(zy_obj);
    const int ynum = type_num(zy);
    if (ynum != kNpyUint8 && ynum != kNpyInt8) {
      throw py::value_error(std::string(fn) + ": y_zero_point: expected int8 or uint8, got " + dtype_name(zy));
    }
    q.y_signed = ynum == kNpyInt8;
    q.zy = zero_points(zy, 1, q.y_signed ? -128 : 0, q.y_signed ? 127 : 255, std::string(fn) + ": y_zero_point", -1,
                       nullptr)[0];
    if (!clamp_obj.is_none()) {
      // codes of y: qmin <= lo <= hi <= qmax (a bound outside y's range is a lowering error)
      const int64_t qmin = q.y_signed ? -128 : 0, qmax = q.y_signed ? 127 : 255;
      py::sequence seq;
      try {
        seq = clamp_obj.cast<py::sequence>();
      } catch (const py::cast_error&) {
        throw py::value_error(std::string(fn) + ": clamp: expected None or a pair (lo, hi) of codes");
      }
      if (py::len(seq) != 2)
        throw py::value_error(std::string(fn) + ": clamp: expected None or a pair (lo, hi) of codes");
      const int64_t lo = seq[0].cast<int64_t>(), hi = seq[1].cast<int64_t>();
      if (lo < qmin || hi > qmax || lo > hi) {
        throw py::value_error(std::string(fn) + ": clamp: expected " + std::to_string(qmin) +
                              " <= lo <= hi <= " + std::to_string(qmax) + " (codes of y), got (" + std::to_string(lo) +
                              ", " + std::to_string(hi) + ")");
      }
      q.clamp_lo = static_cast<int32_t>(lo);
      q.clamp_hi = static_cast<int32_t>(hi);
    }
    q.mult = scales(mult_obj, M, std::string(fn) + ": multiplier");
    for (size_t i = 0; i < q.mult.size(); ++i) {
      if (!std::isfinite(q.mult[i])) {
        throw py::value_error(std::string(fn) + ": multiplier: expected finite requantization multipliers, got " +
                              std::to_string(q.mult[i]) + " at output channel " + std::to_string(i));
      }
    }
    if (!bias_obj.is_none()) {
      py::array bias = as_array(bias_obj);
      if (type_num(bias) != kNpyInt32 || bias.ndim() != 1 || bias.shape(0) != M) {
        throw py::value_error(std::string(fn) + ": B: expected int32 of shape (" + std::to_string(M) + ",), got " +
                              dtype_name(bias) + " of shape " + tuple_str(dims_of(bias)));
      }
      py::array_t<int32_t, py::array::c_style | py::array::forcecast> b(bias);
      q.bias.assign(b.data(), b.data() + M);
    }
    return q;
  }

  py::array run_qlinear(const py::array& x, bool x_signed, const std::shared_ptr<const QParams>& qp, int num_threads,
                        const py::object& out_obj, bool channels_last) {
    const QParams& q = *qp;
    const char* fn = "QLinearConv";
    if (x_signed != q.x_signed) {
      throw py::value_error(std::string(fn) + ": x: expected " + (q.x_signed ? "int8" : "uint8") +
                            " like x_zero_point, got " + dtype_name(x));
    }
    if (num_threads < 1) {
      throw py::value_error(std::string(fn) + ": num_threads: expected >= 1, got " + std::to_string(num_threads));
    }
    conv::ConvArgs args;
    args.x = x.data();
    args.x_signed = x_signed;
    args.zx = q.zx;
    args.zy = q.zy;
    args.clamp_lo = q.clamp_lo;
    args.clamp_hi = q.clamp_hi;
    args.out_type = q.y_signed ? OutType::kS8 : OutType::kU8;
    args.multiplier = q.mult.data();
    args.multiplier_per_channel = q.mult.size() > 1;
    args.bias = q.bias.empty() ? nullptr : q.bias.data();
    args.num_threads = num_threads;
    args.channels_last = channels_last;
    const conv::Geometry geo = geometry(x, fn, channels_last);
    py::array y = output(out_obj, out_shape(geo, channels_last),
                         q.y_signed ? py::dtype::of<int8_t>() : py::dtype::of<uint8_t>(), x, fn);
    args.y = y.mutable_data();
    execute(args, geo, qp);
    return y;
  }

  py::array qlinear(const py::handle& x_obj, const py::handle& zx_obj, const py::handle& mult_obj,
                    const py::handle& zy_obj, const py::object& bias_obj, int num_threads, const py::object& out_obj,
                    bool channels_last, const py::object& clamp_obj) {
    bool x_signed = false;
    py::array x = check_x(x_obj, "QLinearConv", channels_last, &x_signed);
    const auto q =
        std::make_shared<const QParams>(make_qparams(zx_obj, x_signed, mult_obj, zy_obj, bias_obj, clamp_obj));
    return run_qlinear(x, x_signed, q, num_threads, out_obj, channels_last);
  }

  // Constant requantization parameters, converted once (the binder's compile-time call):
  // x's type follows x_zero_point's.
  void prepare(const py::handle& zx_obj, const py::handle& mult_obj, const py::handle& zy_obj,
               const py::object& bias_obj, const py::object& clamp_obj) {
    const bool x_signed = type_num(as_array(zx_obj)) == kNpyInt8;
    std::atomic_store(&prepared, std::shared_ptr<const QParams>(std::make_shared<QParams>(
                                     make_qparams(zx_obj, x_signed, mult_obj, zy_obj, bias_obj, clamp_obj))));
  }

  py::array qlinear_prepared(const py::handle& x_obj, int num_threads, const py::object& out_obj, bool channels_last) {
    const std::shared_ptr<const QParams> q = std::atomic_load(&prepared);
    if (!q) throw py::value_error("QLinearConv: qlinear_prepared: call prepare(...) first");
    bool x_signed = false;
    py::array x = check_x(x_obj, "QLinearConv", channels_last, &x_signed);
    return run_qlinear(x, x_signed, q, num_threads, out_obj, channels_last);
  }

  py::array integer(const py::handle& x_obj, const py::object& zx_obj, int num_threads, const py::object& out_obj,
                    bool channels_last) {
    const char* fn = "ConvInteger";
    bool x_signed = false;
    py::array x = check_x(x_obj, fn, channels_last, &x_signed);
    conv::ConvArgs args;
    args.x = x.data();
    args.x_signed = x_signed;
    if (!zx_obj.is_none()) {
      args.zx = zero_points(zx_obj, 1, x_signed ? -128 : 0, x_signed ? 127 : 255, std::string(fn) + ": x_zero_point",
                            x_signed ? kNpyInt8 : kNpyUint8, x_signed ? "int8" : "uint8")[0];
    }
    args.out_type = OutType::kS32;
    if (num_threads < 1) {
      throw py::value_error(std::string(fn) + ": num_threads: expected >= 1, got " + std::to_string(num_threads));
    }
    args.num_threads = num_threads;
    args.channels_last = channels_last;
    const conv::Geometry geo = geometry(x, fn, channels_last);
    py::array y = output(out_obj, out_shape(geo, channels_last), py::dtype::of<int32_t>(), x, fn);
    args.y = y.mutable_data();
    execute(args, geo);
    return y;
  }
};

AutoPad parse_auto_pad(const std::string& s) {
  if (s == "NOTSET" || s.empty()) return AutoPad::kNotSet;
  if (s == "VALID") return AutoPad::kValid;
  if (s == "SAME_UPPER") return AutoPad::kSameUpper;
  if (s == "SAME_LOWER") return AutoPad::kSameLower;
  throw py::value_error("auto_pad: expected one of NOTSET, VALID, SAME_UPPER, SAME_LOWER, got '" + s + "'");
}

std::shared_ptr<PyConv> make_conv(const py::handle& w_obj, const py::handle& zw_obj, int64_t group,
                                  const py::object& kernel_shape, const py::object& strides,
                                  const py::object& dilations, const py::object& pads, const std::string& auto_pad,
                                  const py::object& isa_obj) {
  if (!py::isinstance<py::array>(w_obj)) throw py::value_error("w: expected a numpy array");
  auto w_any = py::reinterpret_borrow<py::array>(w_obj);
  const std::string wdt = dtype_name(w_any);
  if (wdt != "uint8" && wdt != "int8") throw py::value_error("w: expected int8 or uint8, got " + wdt);
  const bool w_unsigned = wdt == "uint8";
  const std::vector<int64_t> wshape = dims_of(w_any);
  if (w_any.ndim() != 3 && w_any.ndim() != 4) {
    throw py::value_error("w: expected rank 3 (1-D) or 4 (2-D) [M, C/group, *kernel], got shape " + tuple_str(wshape) +
                          (w_any.ndim() == 5 ? " (3-D convolutions have no native kernel)" : ""));
  }
  py::array w =
      w_unsigned ? py::array(require_array<uint8_t>(w_obj, "w")) : py::array(require_array<int8_t>(w_obj, "w"));
  const int rank = static_cast<int>(w.ndim()) - 2;
  const int64_t M = wshape[0], Cg = wshape[1];
  if (M < 1 || Cg < 1) throw py::value_error("w: expected M >= 1 and C/group >= 1, got shape " + tuple_str(wshape));
  if (group < 1 || M % group != 0) {
    throw py::value_error("group: expected a divisor of M=" + std::to_string(M) + " (output channels), got " +
                          std::to_string(group));
  }
  conv::Attributes attrs;
  attrs.spatial_rank = rank;
  const std::vector<int64_t> wk(wshape.begin() + 2, wshape.end());
  if (!kernel_shape.is_none()) {
    const std::vector<int64_t> ks = int_list(kernel_shape, "kernel_shape");
    if (ks != wk) {
      throw py::value_error("kernel_shape: expected the spatial shape of w " + tuple_str(wk) + ", got " +
                            tuple_str(ks));
    }
  }
  for (int i = 0; i < rank; ++i) {
    if (wk[i] < 1) throw py::value_error("w: expected kernel sizes >= 1, got shape " + tuple_str(wshape));
    attrs.kernel[i] = wk[i];
  }
  auto axis_values = [&](const py::object& obj, const char* what, int64_t* dst) {
    if (obj.is_none()) return;
    const std::vector<int64_t> v = int_list(obj, what);
    if (v.empty()) return;  // ONNX: absent or empty means the default
    bool ok = static_cast<int>(v.size()) == rank;
    for (int64_t e : v) ok = ok && e >= 1;
    if (!ok) {
      throw py::value_error(std::string(what) + ": expected " + std::to_string(rank) + " values >= 1, got " +
                            list_str(v));
    }
    for (int i = 0; i < rank; ++i) dst[i] = v[i];
  };
  axis_values(strides, "strides", attrs.strides);
  axis_values(dilations, "dilations", attrs.dilations);
  attrs.auto_pad = parse_auto_pad(auto_pad);
  if (!pads.is_none() && attrs.auto_pad == AutoPad::kNotSet) {
    const std::vector<int64_t> p = int_list(pads, "pads");
    if (static_cast<int>(p.size()) != 2 * rank) {
      throw py::value_error("pads: expected " + std::to_string(2 * rank) + " values (begin and end for " +
                            std::to_string(rank) + " spatial axes), got " + std::to_string(p.size()));
    }
    for (int64_t e : p) {
      if (e < 0) throw py::value_error("pads: expected values >= 0, got " + list_str(p));
    }
    for (int i = 0; i < 2 * rank; ++i) attrs.pads[i] = p[i];
  }
  const std::vector<int32_t> zw =
      zero_points(zw_obj, M, w_unsigned ? 0 : -128, w_unsigned ? 255 : 127, "w_zero_point", -1, nullptr);
  const Isa isa = parse_isa(isa_obj);
  auto out = std::make_shared<PyConv>();
  out->w_keep = w;
  {
    py::gil_scoped_release release;
    out->conv = conv::QConv::create(w.data(), w_unsigned, M, Cg, group, zw.data(), zw.size() > 1, attrs, isa,
                                    /*borrow_w=*/true);
  }
  return out;
}

std::string repr(const PyConv& c) {
  const conv::QConv& q = *c.conv;
  return "<QConv M=" + std::to_string(q.M()) + " C/group=" + std::to_string(q.Cg()) +
         " group=" + std::to_string(q.group()) + " " + q.kernel_name() + ">";
}

}  // namespace

void register_conv(py::module_& m) {
  py::class_<PyConv, std::shared_ptr<PyConv>>(
      m, "QConv", "QLinearConv / ConvInteger with weights prepacked once (conv/conv.h); owns its workspace.")
      .def(py::init(&make_conv), py::arg("w"), py::arg("w_zero_point") = 0, py::kw_only(), py::arg("group") = 1,
           py::arg("kernel_shape") = py::none(), py::arg("strides") = py::none(), py::arg("dilations") = py::none(),
           py::arg("pads") = py::none(), py::arg("auto_pad") = "NOTSET", py::arg("isa") = py::none())
      .def("qlinear", &PyConv::qlinear, py::arg("x"), py::arg("x_zero_point"), py::arg("multiplier"),
           py::arg("y_zero_point"), py::arg("bias") = py::none(), py::kw_only(), py::arg("num_threads") = 1,
           py::arg("out") = py::none(), py::arg("channels_last") = false, py::arg("clamp") = py::none(),
           "QLinearConv: y = min(max(round_half_even(f32(acc)·m[c]) + zy, L), H) with the multiplier m (scalar or "
           "one per output channel) as the lowering derived it (requant_params.float_multiplier); [L, H] is "
           "clamp = (lo, hi) (codes of y), default y's type range.")
      .def("prepare", &PyConv::prepare, py::arg("x_zero_point"), py::arg("multiplier"), py::arg("y_zero_point"),
           py::arg("bias") = py::none(), py::kw_only(), py::arg("clamp") = py::none(),
           "Converts constant QLinearConv parameters once (checked as qlinear checks them); "
           "qlinear_prepared then takes x alone. x's type follows x_zero_point's.")
      .def("qlinear_prepared", &PyConv::qlinear_prepared, py::arg("x"), py::kw_only(), py::arg("num_threads") = 1,
           py::arg("out") = py::none(), py::arg("channels_last") = false,
           "QLinearConv with the parameters of prepare(): the same bytes as qlinear.")
      .def("integer", &PyConv::integer, py::arg("x"), py::arg("x_zero_point") = py::none(), py::kw_only(),
           py::arg("num_threads") = 1, py::arg("out") = py::none(), py::arg("channels_last") = false,
           "ConvInteger: the int32 accumulator of eq. (4).")
      .def(
          "output_shape",
          [](const PyConv& c, const std::vector<int64_t>& x_shape, bool channels_last) {
            const int rank = c.conv->attributes().spatial_rank + 2;
            if (static_cast<int>(x_shape.size()) != rank) {
              throw py::value_error("x: expected rank " + std::to_string(rank) + ", got shape " + tuple_str(x_shape));
            }
            return py::tuple(py::cast(c.out_shape(c.resolve_shape(x_shape, channels_last), channels_last)));
          },
          py::arg("x_shape"), py::arg("channels_last") = false)
      .def_property_readonly("kernel", [](const PyConv& c) { return c.conv->kernel_name(); })
      .def_property_readonly("kernel_channels_last", [](const PyConv& c) { return c.conv->kernel_name(true); })
      .def_property_readonly("isa", [](const PyConv& c) { return std::string(isa_name(c.conv->isa())); })
      .def_property_readonly("path",
                             [](const PyConv& c) { return std::string(c.conv->depthwise() ? "depthwise" : "gemm"); })
      .def_property_readonly("M", [](const PyConv& c) { return c.conv->M(); })
      .def_property_readonly("group", [](const PyConv& c) { return c.conv->group(); })
      .def_property_readonly("weights_dtype",
                             [](const PyConv& c) { return std::string(c.conv->weights_unsigned() ? "uint8" : "int8"); })
      .def_property_readonly("nbytes", [](const PyConv& c) { return c.conv->packed_bytes(); })
      .def_property_readonly("workspace_nbytes",
                             [](const PyConv& c) {
                               size_t n = c.ws.main.size();
                               for (const auto& b : c.ws.thread_bufs) n += b.size();
                               for (const auto& g : c.ws.thread_gemm) n += g.size();
                               return n;
                             })
      .def("__repr__", &repr);
}

}  // namespace quanta
