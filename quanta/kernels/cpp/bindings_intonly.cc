// Bindings for the integer-only kernels (intonly/intonly.h), the npu-sim device's
// instruction set. Operands arrive as C-contiguous int32 arrays (the Python binder,
// quanta/targets/npu_sim/native_bind.py, widens int8/uint8/int16 storage and narrows the
// int32 results, which are already clamped to the output type's range); every entry
// checks dtypes and sizes here and raises ValueError naming the argument.
//
//   intonly_apply_scale(acc int64[n], mult int32[n], shift int32[n], rounding) -> int64[n]
//   intonly_requantize(acc int32[outer, C, inner], mult, shift, zy, lo, hi, rounding) -> int32
//   intonly_matmul(a [B, M, K], b [Bb, K, N], c [N] | None, za, zb, zy, mult, shift, lo, hi, rounding)
//   intonly_conv2d(x [N, C, H, W], w [M, C/g, KH, KW], c [M], zx, zy, mult, shift, lo, hi, rounding,
//                  strides, dilations, pads_begin, out_hw, group)
//   intonly_add(a, b, params[12], rounding)  params: za zb zy am as bm bs m s left lo hi
//   intonly_mul(a, b, za, zb, zy, m, s, lo, hi, rounding)
//   intonly_softmax(x [R, n], exp_table [256], y_shift, zy, lo, hi)
//   intonly_layer_norm(x [R, n], g [n], b [n], zx, zy, eps, gamma_shift, lo, hi)
//   intonly_softmax_poly(x [R, n], x0, b, c, exp_shift, y_shift, zy, lo, hi)   (I-BERT i-exp)
//   intonly_gelu(x, zx, erf_b, erf_c, pre_shift, m, s, zy, lo, hi, rounding)    (I-BERT i-GELU)
//   intonly_lookup16(x int16 codes, table [513]) -> int16 codes          (TFLite int16 table)
//   intonly_isqrt(v int64[n]) -> int64[n]
// rounding: 0 double (TFLite), 1 single, 2 TOSA apply_scale with double_round.
#include <string>
#include <vector>

#include "bindings.h"
#include "intonly/intonly.h"

#include <pybind11/stl.h>

namespace quanta {
namespace {

using I32 = py::array_t<int32_t, py::array::c_style>;
using I64 = py::array_t<int64_t, py::array::c_style>;

intonly::Rounding rounding_of(int r) {
  if (r < 0 || r > 2)
    throw py::value_error("rounding: expected 0 (double), 1 (single) or 2 (tosa), got " + std::to_string(r));
  return static_cast<intonly::Rounding>(r);
}

void check_params(const I32& mult, const I32& shift, int64_t channels, const std::string& op) {
  if (mult.size() != shift.size() || (mult.size() != 1 && mult.size() != channels)) {
    throw py::value_error(op + ": multiplier/shift: expected 1 or " + std::to_string(channels) + " values, got " +
                          std::to_string(mult.size()) + " and " + std::to_string(shift.size()));
  }
  for (py::ssize_t i = 0; i < shift.size(); ++i) {
    if (shift.data()[i] < -31 || shift.data()[i] > 30)
      throw py::value_error(op + ": shift: expected values in [-31, 30]");
    if (mult.data()[i] < 0) throw py::value_error(op + ": multiplier: expected values >= 0");
  }
}

}  // namespace

void register_intonly(py::module_& m) {
  m.def("intonly_apply_scale", [](const py::handle& acc_o, const py::handle& mult_o, const py::handle& shift_o, int r) {
    auto acc = require_array<int64_t>(acc_o, "acc");
    auto mult = require_array<int32_t>(mult_o, "multiplier");
    auto shift = require_array<int32_t>(shift_o, "shift");
    if (mult.size() != acc.size() || shift.size() != acc.size())
      throw py::value_error("intonly_apply_scale: acc, multiplier and shift must have the same size");
    check_params(mult, shift, acc.size(), "intonly_apply_scale");
    const auto rr = rounding_of(r);
    I64 out(shape_of(acc));
    for (py::ssize_t i = 0; i < acc.size(); ++i)
      out.mutable_data()[i] = intonly::apply_scale(acc.data()[i], mult.data()[i], shift.data()[i], rr);
    return out;
  });
  m.def("intonly_requantize", [](const py::handle& acc_o, const py::handle& mult_o, const py::handle& shift_o, int zy,
                                 int lo, int hi, int r) {
    auto acc = require_array<int32_t>(acc_o, "acc");
    auto mult = require_array<int32_t>(mult_o, "multiplier");
    auto shift = require_array<int32_t>(shift_o, "shift");
    if (acc.ndim() != 3) throw py::value_error("intonly_requantize: acc: expected [outer, C, inner]");
    check_params(mult, shift, acc.shape(1), "intonly_requantize");
    I32 y(shape_of(acc));
    intonly::requantize(acc.data(), acc.shape(0), acc.shape(1), acc.shape(2), mult.data(), shift.data(), mult.size(),
                        zy, lo, hi, rounding_of(r), y.mutable_data());
    return y;
  });
  m.def("intonly_matmul", [](const py::handle& a_o, const py::handle& b_o, const py::handle& c_o, int za, int zb,
                             int zy, const py::handle& mult_o, const py::handle& shift_o, int lo, int hi, int r) {
    auto a = require_array<int32_t>(a_o, "a");
    auto b = require_array<int32_t>(b_o, "b");
    auto mult = require_array<int32_t>(mult_o, "multiplier");
    auto shift = require_array<int32_t>(shift_o, "shift");
    if (a.ndim() != 3 || b.ndim() != 3)
      throw py::value_error("intonly_matmul: a, b: expected [B, M, K] and [Bb, K, N]");
    const int64_t batch = a.shape(0), mm = a.shape(1), k = a.shape(2), bb = b.shape(0), n = b.shape(2);
    if (b.shape(1) != k)
      throw py::value_error("intonly_matmul: inner dimensions differ: " + shape_str(shape_of(a)) + " @ " +
                            shape_str(shape_of(b)));
    if (bb != 1 && bb != batch) throw py::value_error("intonly_matmul: b: batch must be 1 or a's");
    check_params(mult, shift, n, "intonly_matmul");
    const int32_t* c = nullptr;
    I32 carr;
    if (!c_o.is_none()) {
      carr = require_array<int32_t>(c_o, "c");
      if (carr.size() != n) throw py::value_error("intonly_matmul: c: expected " + std::to_string(n) + " values");
      c = carr.data();
    }
    I32 y(Shape{batch, mm, n});
    intonly::matmul(a.data(), b.data(), c, batch, bb, mm, k, n, za, zb, zy, mult.data(), shift.data(), mult.size(), lo,
                    hi, rounding_of(r), y.mutable_data());
    return y;
  });
  m.def("intonly_conv2d",
        [](const py::handle& x_o, const py::handle& w_o, const py::handle& c_o, int zx, int zy,
           const py::handle& mult_o, const py::handle& shift_o, int lo, int hi, int r, std::vector<int64_t> strides,
           std::vector<int64_t> dilations, std::vector<int64_t> pads, std::vector<int64_t> out_hw, int64_t group) {
          auto x = require_array<int32_t>(x_o, "x");
          auto w = require_array<int32_t>(w_o, "w");
          auto c = require_array<int32_t>(c_o, "c");
          auto mult = require_array<int32_t>(mult_o, "multiplier");
          auto shift = require_array<int32_t>(shift_o, "shift");
          if (x.ndim() != 4 || w.ndim() != 4) throw py::value_error("intonly_conv2d: x, w: expected rank 4");
          if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 2 || out_hw.size() != 2)
            throw py::value_error("intonly_conv2d: strides, dilations, pads, out_hw: expected 2 values each");
          intonly::Conv2d g{x.shape(0),
                            x.shape(1),
                            x.shape(2),
                            x.shape(3),
                            w.shape(0),
                            w.shape(2),
                            w.shape(3),
                            out_hw[0],
                            out_hw[1],
                            group,
                            {strides[0], strides[1]},
                            {dilations[0], dilations[1]},
                            {pads[0], pads[1]}};
          if (group < 1 || g.ci % group || g.co % group || w.shape(1) * group != g.ci)
            throw py::value_error("intonly_conv2d: w: " + shape_str(shape_of(w)) + " does not match x channels " +
                                  std::to_string(g.ci) + " with group " + std::to_string(group));
          if (c.size() != g.co)
            throw py::value_error("intonly_conv2d: c: expected " + std::to_string(g.co) + " values");
          check_params(mult, shift, g.co, "intonly_conv2d");
          I32 y(Shape{g.n, g.co, g.oh, g.ow});
          intonly::conv2d(x.data(), w.data(), c.data(), g, zx, zy, mult.data(), shift.data(), mult.size(), lo, hi,
                          rounding_of(r), y.mutable_data());
          return y;
        });
  m.def("intonly_add", [](const py::handle& a_o, const py::handle& b_o, std::vector<int32_t> p, int r) {
    auto a = require_array<int32_t>(a_o, "a");
    auto b = require_array<int32_t>(b_o, "b");
    if (a.size() != b.size()) throw py::value_error("intonly_add: a, b: expected the same size (broadcast first)");
    if (p.size() != 12) throw py::value_error("intonly_add: params: expected 12 values");
    if (p[9] < 0 || p[9] > 20) throw py::value_error("intonly_add: left shift: expected 0..20");
    intonly::AddParams ap{p[0], p[1], p[2], p[3], p[4], p[5], p[6], p[7], p[8], p[9], p[10], p[11]};
    I32 y(shape_of(a));
    intonly::add(a.data(), b.data(), a.size(), ap, rounding_of(r), y.mutable_data());
    return y;
  });
  m.def("intonly_mul",
        [](const py::handle& a_o, const py::handle& b_o, int za, int zb, int zy, int mm, int s, int lo, int hi, int r) {
          auto a = require_array<int32_t>(a_o, "a");
          auto b = require_array<int32_t>(b_o, "b");
          if (a.size() != b.size())
            throw py::value_error("intonly_mul: a, b: expected the same size (broadcast first)");
          I32 y(shape_of(a));
          intonly::mul(a.data(), b.data(), a.size(), za, zb, zy, mm, s, lo, hi, rounding_of(r), y.mutable_data());
          return y;
        });
  m.def("intonly_softmax", [](const py::handle& x_o, const py::handle& t_o, int y_shift, int zy, int lo, int hi) {
    auto x = require_array<int32_t>(x_o, "x");
    auto t = require_array<int32_t>(t_o, "exp_table");
    if (x.ndim() != 2 || x.shape(1) < 1) throw py::value_error("intonly_softmax: x: expected [rows, n >= 1]");
    if (t.size() != 256) throw py::value_error("intonly_softmax: exp_table: expected 256 values");
    for (py::ssize_t i = 0; i < x.size(); ++i)
      if (x.data()[i] < -128 || x.data()[i] > 255) throw py::value_error("intonly_softmax: x: expected 8-bit values");
    if (t.data()[0] <= 0) throw py::value_error("intonly_softmax: exp_table[0] must be > 0");
    I32 y(shape_of(x));
    intonly::softmax(x.data(), x.shape(0), x.shape(1), t.data(), y_shift, zy, lo, hi, y.mutable_data());
    return y;
  });
  m.def("intonly_layer_norm", [](const py::handle& x_o, const py::handle& g_o, const py::handle& b_o, int zx, int zy,
                                 int64_t eps, int gamma_shift, int lo, int hi) {
    auto x = require_array<int32_t>(x_o, "x");
    auto g = require_array<int32_t>(g_o, "gamma");
    auto b = require_array<int32_t>(b_o, "beta");
    if (x.ndim() != 2) throw py::value_error("intonly_layer_norm: x: expected [rows, n]");
    if (g.size() != x.shape(1) || b.size() != x.shape(1))
      throw py::value_error("intonly_layer_norm: gamma, beta: expected " + std::to_string(x.shape(1)) + " values");
    if (gamma_shift < 0 || gamma_shift > 31) throw py::value_error("intonly_layer_norm: gamma_shift: expected 0..31");
    I32 y(shape_of(x));
    intonly::layer_norm(x.data(), x.shape(0), x.shape(1), g.data(), b.data(), zx, zy, eps, gamma_shift, lo, hi,
                        y.mutable_data());
    return y;
  });
  m.def("intonly_softmax_poly", [](const py::handle& x_o, int64_t x0, int64_t b, int64_t c, int exp_shift, int y_shift,
                                   int zy, int lo, int hi) {
    auto x = require_array<int32_t>(x_o, "x");
    if (x.ndim() != 2 || x.shape(1) < 1) throw py::value_error("intonly_softmax_poly: x: expected [rows, n >= 1]");
    if (x0 >= 0) throw py::value_error("intonly_softmax_poly: exp_x0: expected a negative integer");
    if (exp_shift < -62 || exp_shift > 30) throw py::value_error("intonly_softmax_poly: exp_shift: expected -62..30");
    if (-x0 > b || c < 0 || b > (int64_t{1} << 30) ||
        (b * b + c) >= ((int64_t{1} << 62) >> (exp_shift > 0 ? exp_shift : 0)))
      throw py::value_error(
          "intonly_softmax_poly: exp_x0, exp_b, exp_c: expected 0 < -x0 <= b, c >= 0, "
          "(b² + c)·2^exp_shift < 2^62");
    if (y_shift < 0 || y_shift > 16) throw py::value_error("intonly_softmax_poly: y_shift: expected 0..16");
    for (py::ssize_t i = 0; i < x.size(); ++i)
      if (x.data()[i] < -32768 || x.data()[i] > 65535)
        throw py::value_error("intonly_softmax_poly: x: expected 16-bit values");
    I32 y(shape_of(x));
    const intonly::ExpPoly e{x0, b, c, exp_shift};
    intonly::softmax_poly(x.data(), x.shape(0), x.shape(1), e, y_shift, zy, lo, hi, y.mutable_data());
    return y;
  });
  m.def("intonly_gelu", [](const py::handle& x_o, int zx, int64_t b, int64_t c, int pre_shift, int mm, int s, int zy,
                           int lo, int hi, int r) {
    auto x = require_array<int32_t>(x_o, "x");
    if (b < 1 || c < b * b || c > (int64_t{1} << 40))
      throw py::value_error("intonly_gelu: erf_b, erf_c: expected b >= 1, b² <= c <= 2^40");
    if (pre_shift < 0 || pre_shift > 62) throw py::value_error("intonly_gelu: pre_shift: expected 0..62");
    if (s < -31 || s > 30 || mm < 0) throw py::value_error("intonly_gelu: multiplier/shift out of range");
    const intonly::GeluPoly g{b, c, zx, pre_shift, mm, s, zy};
    for (py::ssize_t i = 0; i < x.size(); ++i) {
      const int64_t d = static_cast<int64_t>(x.data()[i]) - zx;
      if (d < -65535 || d > 65535) throw py::value_error("intonly_gelu: x: expected 16-bit values");
    }
    I32 y(shape_of(x));
    if (intonly::gelu(x.data(), x.size(), g, lo, hi, rounding_of(r), y.mutable_data()) >= 0)
      throw py::value_error("intonly_gelu: pre_shift " + std::to_string(pre_shift) +
                            " leaves a value outside int32 (x beyond the compile-time bound)");
    return y;
  });
  m.def("intonly_lookup16", [](const py::handle& x_o, const py::handle& t_o) {
    auto x = require_array<int32_t>(x_o, "x");
    auto t = require_array<int32_t>(t_o, "table");
    if (t.ndim() != 1 || t.size() != 513) throw py::value_error("intonly_lookup16: table: expected 513 values");
    for (py::ssize_t i = 0; i < t.size(); ++i)
      if (t.data()[i] < -32768 || t.data()[i] > 32767)
        throw py::value_error("intonly_lookup16: table: expected int16 values");
    for (py::ssize_t i = 0; i < x.size(); ++i)
      if (x.data()[i] < -32768 || x.data()[i] > 32767)
        throw py::value_error("intonly_lookup16: x: expected int16 values");
    I32 y(shape_of(x));
    {
      py::gil_scoped_release release;
      intonly::lookup16(x.data(), x.size(), t.data(), y.mutable_data());
    }
    return y;
  });
  m.def("intonly_isqrt", [](const py::handle& v_o) {
    auto v = require_array<int64_t>(v_o, "v");
    I64 out(shape_of(v));
    for (py::ssize_t i = 0; i < v.size(); ++i) {
      if (v.data()[i] < 0) throw py::value_error("intonly_isqrt: v: expected values >= 0");
      out.mutable_data()[i] = intonly::isqrt(v.data()[i]);
    }
    return out;
  });
}

}  // namespace quanta
