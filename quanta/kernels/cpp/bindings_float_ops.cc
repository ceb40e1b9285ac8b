// Bindings for the float32 kernels (float_ops/float_ops.h): the entry layer. Every
// argument is checked here (dtype, contiguity, shapes, out= aliasing) and a ValueError
// names the argument, what was expected and what was given.
//
//   exp_f32(x: f32, num_threads=1, out=None)                         eqs. (E1)-(E6)
//   softmax_f32(x: f32, rank >= 1, num_threads=1, out=None)          along the last axis, (S1)-(S5)
//   layer_norm_f32(x: f32, scale: f32, bias: f32 | None, axis, epsilon, num_threads=1,
//                  out=None, stats=False, divide=False, rms=False) -> y | (y, mean, inv_std)
//                                                                    over axes [axis, rank), (L1)-(L5);
//                                                                    divide: (L4'), (L5') instead;
//                                                                    rms: (L1r) instead of (L1)
//   binary_f32(op: "add" | "sub" | "mul" | "div" | "max" | "min", a: f32, b: f32, num_threads=1, out=None)
//                                                                    numpy broadcasting
//   unary_f32(op: "erf" | "tanh" | "sigmoid" | "relu" | "gelu" | "gelu_tanh" | "mlas_logistic"
//             | "mlas_tanh" | "silu" | "log" | "gelu_tanh_mlas" | "atan" | "softplus", x: f32,  (F1)-(F5), (T1)-(T4), (Σ1)-(Σ2),
//             num_threads=1, out=None)                               np.maximum(x, 0), (G1), (G2),
//                                                                    ORT's MLAS logistic and tanh,
//                                                                    (G2) with MLAS's tanh,
//                                                                    x · sigmoid(x), (LN1)-(LN6),
//                                                                    (CS1)-(CS6) ("cos"), (SN1) ("sin")
//   elu_f32(x: f32, alpha: float, num_threads=1, out=None)           (EL), alpha rounded to float32
//   mlas_softmax_f32(x: f32, rank >= 1, num_threads=1, out=None,     ORT's MLAS softmax along the
//                    avx512f=-1)                                     last axis, (SM1)-(SM5); its
//                                                                    AVX-512F host's (SX1)-(SX2)
//                                                                    when avx512f (-1: this host)
//   host_runs_ort_avx512f() -> bool                                  whether avx512f=-1 takes the
//                                                                    AVX-512F host's order
//   ort_layer_norm_f32(x: f32, scale: f32, bias: f32 | None, axis, epsilon, kernel:
//                      "layer_norm" | "simplified" | "skip", num_threads=1, out=None)
//                                                                    ORT's LayerNorm kernels, (OL1)-(OL9)
//   cast_half(x: f32 | f16, num_threads=1, out=None) -> f16 | f32    NumPy's astype(float16) /
//                                                                    astype(float32), NaN payloads included
#include <pybind11/stl.h>

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "float_ops/float_ops.h"

namespace quanta {
namespace {

py::array exp_f32(const py::handle& x_obj, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "exp_f32: x");
  check_threads(num_threads, "exp_f32");
  auto y = make_output<float>(out_obj, shape_of(x), "exp_f32", {x});
  run_or_record([=]() mutable { float_ops::exp_f32(x.data(), y.mutable_data(), x.size(), num_threads, active_isa()); });
  return std::move(y);
}

py::array softmax_f32(const py::handle& x_obj, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "softmax_f32: x");
  check_threads(num_threads, "softmax_f32");
  if (x.ndim() < 1) throw py::value_error("softmax_f32: x: expected rank >= 1, got a scalar");
  auto y = make_output<float>(out_obj, shape_of(x), "softmax_f32", {x});
  const int64_t d = x.shape(x.ndim() - 1);
  const int64_t rows = d == 0 ? 0 : x.size() / d;
  run_or_record([=]() mutable { float_ops::softmax(x.data(), y.mutable_data(), rows, d, num_threads, active_isa()); });
  return std::move(y);
}

py::object layer_norm_f32(const py::handle& x_obj, const py::handle& scale_obj, const py::object& bias_obj,
                          int64_t axis, float epsilon, int num_threads, const py::object& out_obj, bool stats,
                          bool divide, bool rms) {
  auto x = require_array<float>(x_obj, "layer_norm_f32: x");
  auto scale = require_array<float>(scale_obj, "layer_norm_f32: scale");
  check_threads(num_threads, "layer_norm_f32");
  const int64_t rank = x.ndim();
  if (axis < 0) axis += rank;
  if (axis < 0 || axis >= rank) {
    throw py::value_error("layer_norm_f32: axis: expected in [" + std::to_string(-rank) + ", " +
                          std::to_string(rank - 1) + "], got " + std::to_string(axis));
  }
  int64_t rows = 1, d = 1;
  for (int64_t k = 0; k < axis; ++k) rows *= x.shape(k);
  for (int64_t k = axis; k < rank; ++k) d *= x.shape(k);
  if (scale.size() != d) {
    throw py::value_error("layer_norm_f32: scale: expected " + std::to_string(d) + " elements, got " +
                          std::to_string(scale.size()));
  }
  const float* bias_ptr = nullptr;
  py::array_t<float, py::array::c_style> bias;
  if (!bias_obj.is_none()) {
    bias = require_array<float>(bias_obj, "layer_norm_f32: bias");
    if (bias.size() != d) {
      throw py::value_error("layer_norm_f32: bias: expected " + std::to_string(d) + " elements, got " +
                            std::to_string(bias.size()));
    }
    bias_ptr = bias.data();
  }
  auto y = make_output<float>(out_obj, shape_of(x), "layer_norm_f32", {x, scale});
  Shape stat_shape(x.shape(), x.shape() + axis);
  stat_shape.resize(static_cast<size_t>(rank), 1);
  py::array_t<float> mean, inv_std;
  float* mean_ptr = nullptr;
  float* inv_ptr = nullptr;
  if (stats) {
    mean = py::array_t<float>(stat_shape);
    inv_std = py::array_t<float>(stat_shape);
    mean_ptr = mean.mutable_data();
    inv_ptr = inv_std.mutable_data();
  }
  // bias_ptr points into the caller's bias, which a recording caller keeps alive
  run_or_record([=]() mutable {
    float_ops::layer_norm(x.data(), y.mutable_data(), rows, d, scale.data(), bias_ptr, epsilon, mean_ptr, inv_ptr,
                          num_threads, active_isa(), divide, rms);
  });
  if (!stats) return std::move(y);
  return py::make_tuple(y, mean, inv_std);
}

py::array mlas_softmax_f32(const py::handle& x_obj, int num_threads, const py::object& out_obj, int avx512f) {
  auto x = require_array<float>(x_obj, "mlas_softmax_f32: x");
  check_threads(num_threads, "mlas_softmax_f32");
  if (x.ndim() < 1) throw py::value_error("mlas_softmax_f32: x: expected rank >= 1, got a scalar");
  auto y = make_output<float>(out_obj, shape_of(x), "mlas_softmax_f32", {x});
  const int64_t d = x.shape(x.ndim() - 1);
  const int64_t rows = d == 0 ? 0 : x.size() / d;
  const bool order = avx512f < 0 ? float_ops::host_runs_ort_avx512f() : avx512f != 0;
  run_or_record([=]() mutable {
    float_ops::mlas_softmax(x.data(), y.mutable_data(), rows, d, num_threads, active_isa(), order);
  });
  return std::move(y);
}

py::array ort_layer_norm_f32(const py::handle& x_obj, const py::handle& scale_obj, const py::object& bias_obj,
                             int64_t axis, float epsilon, const std::string& kernel_name, int num_threads,
                             const py::object& out_obj) {
  float_ops::OrtNormKernel kernel;
  if (kernel_name == "layer_norm") {
    kernel = float_ops::OrtNormKernel::kLayerNorm;
  } else if (kernel_name == "simplified") {
    kernel = float_ops::OrtNormKernel::kSimplified;
  } else if (kernel_name == "skip") {
    kernel = float_ops::OrtNormKernel::kSkip;
  } else {
    throw py::value_error("ort_layer_norm_f32: kernel: expected one of layer_norm, simplified, skip, got '" +
                          kernel_name + "'");
  }
  auto x = require_array<float>(x_obj, "ort_layer_norm_f32: x");
  auto scale = require_array<float>(scale_obj, "ort_layer_norm_f32: scale");
  check_threads(num_threads, "ort_layer_norm_f32");
  const int64_t rank = x.ndim();
  if (axis < -rank || axis >= rank) {
    throw py::value_error("ort_layer_norm_f32: axis: expected in [" + std::to_string(-rank) + ", " +
                          std::to_string(rank - 1) + "], got " + std::to_string(axis));
  }
  if (axis < 0) axis += rank;
  int64_t d = 1;
  for (int64_t k = axis; k < rank; ++k) d *= x.shape(k);
  if (scale.size() != d) {
    throw py::value_error("ort_layer_norm_f32: scale: expected " + std::to_string(d) + " elements, got " +
                          std::to_string(scale.size()));
  }
  py::array_t<float, py::array::c_style> bias;
  const bool has_bias = !bias_obj.is_none();
  if (has_bias) {
    if (kernel == float_ops::OrtNormKernel::kSimplified) {
      throw py::value_error("ort_layer_norm_f32: bias: the simplified kernel takes none");
    }
    bias = require_array<float>(bias_obj, "ort_layer_norm_f32: bias");
    if (bias.size() != d) {
      throw py::value_error("ort_layer_norm_f32: bias: expected " + std::to_string(d) + " elements, got " +
                            std::to_string(bias.size()));
    }
  }
  auto y = make_output<float>(out_obj, shape_of(x), "ort_layer_norm_f32", {x, scale});
  const int64_t rows = d == 0 ? 0 : x.size() / d;
  run_or_record([=]() mutable {
    float_ops::ort_layer_norm(x.data(), y.mutable_data(), rows, d, scale.data(), has_bias ? bias.data() : nullptr,
                              epsilon, kernel, num_threads, active_isa());
  });
  return std::move(y);
}

py::array binary_f32(const std::string& op_name, const py::handle& a_obj, const py::handle& b_obj, int num_threads,
                     const py::object& out_obj) {
  float_ops::BinaryOp op;
  if (op_name == "add") {
    op = float_ops::BinaryOp::kAdd;
  } else if (op_name == "sub") {
    op = float_ops::BinaryOp::kSub;
  } else if (op_name == "mul") {
    op = float_ops::BinaryOp::kMul;
  } else if (op_name == "div") {
    op = float_ops::BinaryOp::kDiv;
  } else if (op_name == "max") {
    op = float_ops::BinaryOp::kMax;
  } else if (op_name == "min") {
    op = float_ops::BinaryOp::kMin;
  } else if (op_name == "prelu") {
    op = float_ops::BinaryOp::kPRelu;
  } else {
    throw py::value_error("binary_f32: op: expected one of add, sub, mul, div, max, min, prelu, got '" + op_name + "'");
  }
  auto a = require_array<float>(a_obj, "binary_f32: a");
  auto b = require_array<float>(b_obj, "binary_f32: b");
  check_threads(num_threads, "binary_f32");
  const Broadcast bc = broadcast_shapes(a, b, "binary_f32");
  auto c = make_output<float>(out_obj, bc.out, "binary_f32", {a, b});
  run_or_record([=]() mutable {  // bc.shape() points into the call's own copy of bc
    float_ops::binary(op, a.data(), b.data(), c.mutable_data(), bc.shape(), num_threads, active_isa());
  });
  return std::move(c);
}

py::array unary_f32(const std::string& op_name, const py::handle& x_obj, int num_threads, const py::object& out_obj) {
  static const std::pair<const char*, float_ops::UnaryOp> kOps[] = {
      {"erf", float_ops::UnaryOp::kErf},
      {"tanh", float_ops::UnaryOp::kTanh},
      {"sigmoid", float_ops::UnaryOp::kSigmoid},
      {"relu", float_ops::UnaryOp::kRelu},
      {"gelu", float_ops::UnaryOp::kGelu},
      {"gelu_tanh", float_ops::UnaryOp::kGeluTanh},
      {"mlas_logistic", float_ops::UnaryOp::kMlasLogistic},
      {"mlas_tanh", float_ops::UnaryOp::kMlasTanh},
      {"silu", float_ops::UnaryOp::kSilu},
      {"log", float_ops::UnaryOp::kLog},
      {"cos", float_ops::UnaryOp::kCos},
      {"sin", float_ops::UnaryOp::kSin},
      {"expm1", float_ops::UnaryOp::kExpm1},
      {"gelu_tanh_mlas", float_ops::UnaryOp::kGeluTanhMlas},
      {"atan", float_ops::UnaryOp::kAtan},
      {"softplus", float_ops::UnaryOp::kSoftplus},
      {"fast_gelu_ort", float_ops::UnaryOp::kFastGeluOrt},
  };
  const std::pair<const char*, float_ops::UnaryOp>* found = nullptr;
  for (const auto& entry : kOps) {
    if (op_name == entry.first) found = &entry;
  }
  if (found == nullptr) {
    throw py::value_error(
        "unary_f32: op: expected one of erf, tanh, sigmoid, relu, gelu, gelu_tanh, mlas_logistic, mlas_tanh, silu, "
        "log, cos, sin, expm1, gelu_tanh_mlas, atan, softplus, fast_gelu_ort, "
        "got "
        "'" +
        op_name + "'");
  }
  auto x = require_array<float>(x_obj, "unary_f32: x");
  check_threads(num_threads, "unary_f32");
  auto y = make_output<float>(out_obj, shape_of(x), "unary_f32", {x});
  run_or_record([=]() mutable {
    float_ops::unary(found->second, x.data(), y.mutable_data(), x.size(), num_threads, active_isa());
  });
  return std::move(y);
}

py::array elu_f32(const py::handle& x_obj, float alpha, int num_threads, const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "elu_f32: x");
  check_threads(num_threads, "elu_f32");
  auto y = make_output<float>(out_obj, shape_of(x), "elu_f32", {x});
  run_or_record(
      [=]() mutable { float_ops::elu(x.data(), y.mutable_data(), x.size(), alpha, num_threads, active_isa()); });
  return std::move(y);
}

// float32 -> float16 or float16 -> float32, by x's dtype (pybind11 has no float16 type:
// the halves are handled as their uint16 bits).
py::array cast_half(const py::handle& x_obj, int num_threads, const py::object& out_obj) {
  if (!py::isinstance<py::array>(x_obj)) throw py::value_error("cast_half: x: expected a numpy array");
  auto x = py::reinterpret_borrow<py::array>(x_obj);
  const py::dtype f16("float16"), f32 = py::dtype::of<float>();
  const bool from_f32 = dtype_equiv(x.dtype(), f32);
  if (!from_f32 && !dtype_equiv(x.dtype(), f16)) {
    throw py::value_error("cast_half: x: expected dtype float32 or float16, got " +
                          py::str(x.dtype()).cast<std::string>());
  }
  if (!(x.flags() & py::array::c_style)) throw py::value_error("cast_half: x: expected a C-contiguous array");
  check_threads(num_threads, "cast_half");
  const py::dtype to = from_f32 ? f16 : f32;
  py::array y;
  if (out_obj.is_none()) {
    note_new_output();
    y = py::array(to, shape_of(x));
  } else {
    if (!py::isinstance<py::array>(out_obj)) throw py::value_error("cast_half: out: expected a numpy array");
    y = py::reinterpret_borrow<py::array>(out_obj);
    if (!dtype_equiv(y.dtype(), to)) {
      throw py::value_error("cast_half: out: expected dtype " + py::str(to).cast<std::string>() + ", got " +
                            py::str(y.dtype()).cast<std::string>());
    }
    if (!(y.flags() & py::array::c_style)) throw py::value_error("cast_half: out: expected a C-contiguous array");
    if (shape_of(y) != shape_of(x)) {
      throw py::value_error("cast_half: out: expected shape " + shape_str(shape_of(x)) + ", got shape " +
                            shape_str(shape_of(y)));
    }
    if (!y.writeable()) throw py::value_error("cast_half: out: expected a writeable array");
    if (overlaps(y, x)) throw py::value_error("cast_half: out: expected a buffer that does not overlap the inputs");
  }
  const int64_t n = x.size();
  const void* src = x.data();
  void* dst = y.mutable_data();
  // one kernel call into y: a native program may keep it (the float16 islands' Cast pairs
  // sit between recorded steps and would otherwise split their program)
  const Isa isa = active_isa();
  run_or_record([=]() {
    if (from_f32) {
      float_ops::to_half(static_cast<const float*>(src), static_cast<uint16_t*>(dst), n, num_threads, isa);
    } else {
      float_ops::from_half(static_cast<const uint16_t*>(src), static_cast<float*>(dst), n, num_threads, isa);
    }
  });
  return y;
}

}  // namespace

void register_float_ops(py::module_& m) {
  using py::arg;
  const auto none = py::none();
  m.def("exp_f32", &exp_f32, arg("x"), arg("num_threads") = 1, arg("out") = none,
        "quanta's float32 exp, eqs. (E1)-(E6) of docs/float-ops.md (the twin: reference/float_ops.exp_f32).");
  m.def("softmax_f32", &softmax_f32, arg("x"), arg("num_threads") = 1, arg("out") = none,
        "Softmax along the last axis of float32 x, eqs. (S1)-(S5) of docs/float-ops.md.");
  m.def("layer_norm_f32", &layer_norm_f32, arg("x"), arg("scale"), arg("bias"), arg("axis"), arg("epsilon"),
        arg("num_threads") = 1, arg("out") = none, arg("stats") = false, arg("divide") = false, arg("rms") = false,
        "LayerNormalization of float32 x over axes [axis, rank), eqs. (L1)-(L5) of docs/float-ops.md; "
        "stats=True also returns (mean, inv_std) of shape x.shape[:axis] + (1,) * (rank - axis); "
        "divide=True divides by the standard deviation, eqs. (L4'), (L5') (quanta::LayerNormDiv); "
        "rms=True does not subtract a mean, eq. (L1r) (quanta::RMSNormDiv).");
  m.def("mlas_softmax_f32", &mlas_softmax_f32, arg("x"), arg("num_threads") = 1, arg("out") = none, arg("avx512f") = -1,
        "Softmax along the last axis of float32 x as ONNX Runtime's MLAS computes it, eqs. (SM1)-(SM5) "
        "of docs/float-ops.md, on an AVX-512F host (SX1) and (SX2): avx512f = 1 that order, 0 the "
        "AVX2 host's, -1 this host's (the twin: reference/ort_float.mlas_softmax_rows).");
  m.def("host_runs_ort_avx512f", &float_ops::host_runs_ort_avx512f,
        "Whether this CPU runs ONNX Runtime's AVX-512F Softmax, (SX1) and (SX2) of docs/float-ops.md: the "
        "order mlas_softmax_f32(avx512f=-1) takes, read from CPUID and XCR0 as MLAS reads them "
        "(reference/ort_host.onnxruntime_softmax_avx512f reports it).");
  m.def("ort_layer_norm_f32", &ort_layer_norm_f32, arg("x"), arg("scale"), arg("bias"), arg("axis"), arg("epsilon"),
        arg("kernel"), arg("num_threads") = 1, arg("out") = none,
        "x normalized over axes [axis, rank) as ONNX Runtime 1.32's LayerNormalization (kernel "
        "'layer_norm'), SimplifiedLayerNormalization ('simplified') or SkipLayerNormalization ('skip') "
        "computes it, eqs. (OL1)-(OL9) of docs/float-ops.md (the twin: reference/ort_float.ort_layer_norm_rows).");
  m.def("binary_f32", &binary_f32, arg("op"), arg("a"), arg("b"), arg("num_threads") = 1, arg("out") = none,
        "c = a op b in float32 (op: add, sub, mul, div), numpy broadcasting.");
  m.def("elu_f32", &elu_f32, arg("x"), arg("alpha"), arg("num_threads") = 1, arg("out") = none,
        "Elu of float32 x, eq. (EL) of docs/float-ops.md: x < 0 ? f32(alpha · expm1(x)) : x in one pass "
        "(the twin: reference/float_ops.elu_f32).");
  m.def("cast_half", &cast_half, arg("x"), arg("num_threads") = 1, arg("out") = none,
        "float32 x -> float16, float16 x -> float32: the bits of NumPy's astype (round to nearest even, "
        "NaN payloads as NumPy keeps them), by vcvtps2ph / vcvtph2ps.");
  m.def("unary_f32", &unary_f32, arg("op"), arg("x"), arg("num_threads") = 1, arg("out") = none,
        "y = op(x) elementwise in float32, op one of erf (F1)-(F5), tanh (T1)-(T4), sigmoid (Σ1)-(Σ2), "
        "relu (np.maximum(x, 0)), gelu (G1), gelu_tanh (G2), log (LN1)-(LN6), cos (CS1)-(CS6), sin (SN1), "
        "atan (AT1)-(AT4) of "
        "docs/float-ops.md "
        "(twins: "
        "reference/float_ops.py).");
}

}  // namespace quanta
