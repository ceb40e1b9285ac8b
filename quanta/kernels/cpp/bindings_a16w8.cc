// Bindings for the A16W8 kernels (a16w8/a16w8.h; docs/quantization-math.md eqs. (A1)-(A4)).
//
//   a16w8_matmul(a, packed, k, n, dw, cw, bias, mult, za, zy, out_dtype, num_threads=1, out=None)
//     a: [..., K] uint8/int8/uint16/int16; packed: int16 [planes, blocks, k2, 32] (the layout
//     of a16w8.h, built by quanta.targets.native.a16w8.pack_weight); dw, cw, bias: int64 [N]
//     (bias may be None); mult: float32 [N]; out_dtype: "u8", "i8", "u16", "i16". -> [..., N]
//   a16w8_conv2d(x, zx, packed, m, kernel, strides, dilations, pads, out_hw, group, dw, cw,
//                bias, mult, zy, out_dtype, num_threads=1, out=None)
//     x: [N, C, H, W]; packed: int16 [group, planes, M / group, 2·k2] weight rows (a16w8.h
//     conv2d, built by quanta.targets.native.a16w8.pack_rows). -> [N, M, OH, OW]
//   a16w8_conv2d_depthwise(x, zx, wd, kernel, strides, dilations, pads, out_hw, bias, mult,
//                          zy, out_dtype, num_threads=1, out=None)
//     wd: int32 [C, kh·kw] = w − zw (group = C = M).
//   a16w8_affine16(x, zx, m, b, lo, hi, axis, out_dtype, out=None)      QLinearAffine16 (eq. (E1))
//   a16w8_binary16(kind, a, za, b, zb, sa, sb, sy, zy, out=None)        QLinearAdd16 / QLinearMul16
//   a16w8_lut16(x, table, out=None)                                     QLinearLookup of 16-bit codes
//     (a16w8/requant16.h; float64 multipliers from quanta.kernels.reference.requant16)
#include <array>
#include <cstdint>
#include <string>

#include <pybind11/stl.h>

#include "a16w8/a16w8.h"
#include "a16w8/requant16.h"
#include "bindings.h"

namespace quanta {
namespace {

using a16w8::Elem;

Elem elem_of(const py::array& a, const std::string& what) {
  if (dtype_equiv(a.dtype(), py::dtype::of<uint8_t>())) return Elem::kU8;
  if (dtype_equiv(a.dtype(), py::dtype::of<int8_t>())) return Elem::kI8;
  if (dtype_equiv(a.dtype(), py::dtype::of<uint16_t>())) return Elem::kU16;
  if (dtype_equiv(a.dtype(), py::dtype::of<int16_t>())) return Elem::kI16;
  throw py::value_error(what + ": expected uint8, int8, uint16 or int16, got " +
                        py::str(a.dtype()).cast<std::string>());
}

Elem parse_out(const std::string& op, const std::string& s) {
  if (s == "u8") return Elem::kU8;
  if (s == "i8") return Elem::kI8;
  if (s == "u16") return Elem::kU16;
  if (s == "i16") return Elem::kI16;
  throw py::value_error(op + ": out_dtype: expected u8, i8, u16 or i16, got '" + s + "'");
}

py::dtype numpy_of(Elem e) {
  switch (e) {
    case Elem::kU8: return py::dtype::of<uint8_t>();
    case Elem::kI8: return py::dtype::of<int8_t>();
    case Elem::kU16: return py::dtype::of<uint16_t>();
    default: return py::dtype::of<int16_t>();
  }
}

py::array contiguous_int_input(const py::handle& obj, const std::string& what) {
  if (!py::isinstance<py::array>(obj)) throw py::value_error(what + ": expected a numpy array");
  auto a = py::reinterpret_borrow<py::array>(obj);
  if (!(a.flags() & py::array::c_style)) throw py::value_error(what + ": expected a C-contiguous array");
  return a;
}

struct EpArrays {
  py::array_t<int64_t, py::array::c_style> dw, cw, bias;
  py::array_t<float, py::array::c_style> mult;
  bool has_bias = false;
};

EpArrays epilogue_arrays(const std::string& op, int64_t n, const py::object& dw, const py::object& cw,
                         const py::object& bias, const py::object& mult, bool need_dw_cw) {
  EpArrays e;
  auto check_len = [&](const py::array& a, const char* what) {
    if (a.size() != n) {
      throw py::value_error(op + ": " + what + ": expected " + std::to_string(n) +
                            " values (one per output column), got " + std::to_string(a.size()));
    }
  };
  if (need_dw_cw) {
    e.dw = require_array<int64_t>(dw, (op + ": dw").c_str());
    e.cw = require_array<int64_t>(cw, (op + ": cw").c_str());
    check_len(e.dw, "dw");
    check_len(e.cw, "cw");
  }
  if (!bias.is_none()) {
    e.bias = require_array<int64_t>(bias, (op + ": bias").c_str());
    check_len(e.bias, "bias");
    e.has_bias = true;
  }
  e.mult = require_array<float>(mult, (op + ": mult").c_str());
  check_len(e.mult, "mult");
  return e;
}

py::array output_array(const std::string& op, Elem out, const Shape& shape, const py::object& out_obj,
                       const py::array& input) {
  if (out_obj.is_none()) return note_new_output(), py::array(numpy_of(out), shape);
  if (!py::isinstance<py::array>(out_obj)) throw py::value_error(op + ": out: expected a numpy array");
  auto y = py::reinterpret_borrow<py::array>(out_obj);
  if (!dtype_equiv(y.dtype(), numpy_of(out)) || !(y.flags() & py::array::c_style) || !y.writeable() ||
      shape_of(y) != shape) {
    throw py::value_error(op + ": out: expected a writeable C-contiguous array of shape " + shape_str(shape));
  }
  if (overlaps(y, input)) throw py::value_error(op + ": out overlaps the input");
  return y;
}

a16w8::Packed packed_of(const std::string& op, const py::array_t<int16_t, py::array::c_style>& p, int64_t k, int64_t n,
                        int lead) {
  const int64_t k2 = (k + 1) / 2, blocks = 2 * ((n + a16w8::kNR - 1) / a16w8::kNR);
  if (p.ndim() != lead + 4 || p.shape(lead + 1) != blocks || p.shape(lead + 2) != k2 || p.shape(lead + 3) != 32 ||
      (p.shape(lead) != 1 && p.shape(lead) != 2)) {
    throw py::value_error(op + ": packed: expected shape [..., planes (1|2), " + std::to_string(blocks) + ", " +
                          std::to_string(k2) + ", 32] for K=" + std::to_string(k) + ", N=" + std::to_string(n) +
                          ", got " + shape_str(shape_of(p)));
  }
  return a16w8::Packed{p.data(), static_cast<int>(p.shape(lead)), k, n};
}

py::array matmul_impl(const py::handle& a_obj, const py::handle& packed_obj, int64_t k, int64_t n, const py::object& dw,
                      const py::object& cw, const py::object& bias, const py::object& mult, int64_t za, int64_t zy,
                      const std::string& out_dtype, int num_threads, const py::object& out_obj) {
  const std::string op = "a16w8_matmul";
  check_threads(num_threads, op);
  auto a = contiguous_int_input(a_obj, op + ": a");
  const Elem ae = elem_of(a, op + ": a");
  if (a.ndim() < 1 || a.shape(a.ndim() - 1) != k) {
    throw py::value_error(op + ": a: expected shape [..., " + std::to_string(k) + "], got " + shape_str(shape_of(a)));
  }
  auto packed = require_array<int16_t>(packed_obj, (op + ": packed").c_str());
  const a16w8::Packed w = packed_of(op, packed, k, n, 0);
  EpArrays e = epilogue_arrays(op, n, dw, cw, bias, mult, true);
  const Elem oe = parse_out(op, out_dtype);
  Shape shape = shape_of(a);
  shape.back() = n;
  py::array y = output_array(op, oe, shape, out_obj, a);
  const int64_t m = k == 0 ? 0 : static_cast<int64_t>(a.size()) / k;
  const int64_t oa = ae == Elem::kU16 ? 32768 : 0;
  a16w8::Epilogue ep{e.dw.data(), e.cw.data(), e.has_bias ? e.bias.data() : nullptr, e.mult.data(), oa - za, zy, oe};
  // the recorded call holds pointers into a, packed, the epilogue's arrays and y: the
  // caller's arrays and the specialized call's constants (docs/runtime.md "Native programs")
  const void* ad = a.data();
  void* yd = y.mutable_data();
  run_or_record([=]() { a16w8::matmul(ad, ae, m, w, ep, yd, num_threads); });
  return y;
}

a16w8::ConvGeom conv_geom(const std::string& op, const py::array& x, int64_t m, std::array<int64_t, 2> kernel,
                          std::array<int64_t, 2> strides, std::array<int64_t, 2> dilations, std::array<int64_t, 2> pads,
                          std::array<int64_t, 2> out_hw, int64_t group) {
  if (x.ndim() != 4) throw py::value_error(op + ": x: expected [N, C, H, W], got " + shape_str(shape_of(x)));
  a16w8::ConvGeom g{x.shape(0),   x.shape(1), x.shape(2), x.shape(3), m,          kernel[0],
                    kernel[1],    out_hw[0],  out_hw[1],  strides[0], strides[1], dilations[0],
                    dilations[1], pads[0],    pads[1],    group};
  if (group < 1 || g.c % group || m % group) {
    throw py::value_error(op + ": group " + std::to_string(group) + " does not divide C=" + std::to_string(g.c) +
                          " and M=" + std::to_string(m));
  }
  if (g.kh < 1 || g.kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || g.oh < 0 || g.ow < 0) {
    throw py::value_error(op + ": kernel, strides and dilations must be >= 1 and the output size >= 0");
  }
  return g;
}

py::array conv_impl(const py::handle& x_obj, int64_t zx, const py::handle& packed_obj, int64_t m,
                    std::array<int64_t, 2> kernel, std::array<int64_t, 2> strides, std::array<int64_t, 2> dilations,
                    std::array<int64_t, 2> pads, std::array<int64_t, 2> out_hw, int64_t group, const py::object& dw,
                    const py::object& cw, const py::object& bias, const py::object& mult, int64_t zy,
                    const std::string& out_dtype, int num_threads, const py::object& out_obj) {
  const std::string op = "a16w8_conv2d";
  check_threads(num_threads, op);
  auto x = contiguous_int_input(x_obj, op + ": x");
  const Elem xe = elem_of(x, op + ": x");
  const a16w8::ConvGeom g = conv_geom(op, x, m, kernel, strides, dilations, pads, out_hw, group);
  auto packed = require_array<int16_t>(packed_obj, (op + ": packed").c_str());
  const int64_t k = g.c / group * g.kh * g.kw, mg = m / group;
  const int64_t lda = 2 * ((k + 1) / 2);
  if (packed.ndim() != 4 || packed.shape(0) != group || (packed.shape(1) != 1 && packed.shape(1) != 2) ||
      packed.shape(2) != mg || packed.shape(3) != lda) {
    throw py::value_error(op + ": packed: expected shape [" + std::to_string(group) + " (group), planes (1|2), " +
                          std::to_string(mg) + ", " + std::to_string(lda) + "] for K=" + std::to_string(k) + ", got " +
                          shape_str(shape_of(packed)));
  }
  const int planes = static_cast<int>(packed.shape(1));
  std::vector<a16w8::Packed> ws(static_cast<size_t>(group));
  for (int64_t i = 0; i < group; ++i) ws[i] = a16w8::Packed{packed.data() + i * planes * mg * lda, planes, k, mg};
  EpArrays e = epilogue_arrays(op, m, dw, cw, bias, mult, true);
  const Elem oe = parse_out(op, out_dtype);
  py::array y = output_array(op, oe, Shape{g.batch, m, g.oh, g.ow}, out_obj, x);
  const int64_t oa = xe == Elem::kU16 ? 32768 : 0;
  a16w8::Epilogue ep{e.dw.data(), e.cw.data(), e.has_bias ? e.bias.data() : nullptr, e.mult.data(), oa - zx, zy, oe};
  const void* xd = x.data();
  void* yd = y.mutable_data();
  run_or_record([=]() { a16w8::conv2d(xd, xe, zx, g, ws.data(), ep, yd, num_threads); });
  return y;
}

py::array depthwise_impl(const py::handle& x_obj, int64_t zx, const py::handle& wd_obj, std::array<int64_t, 2> kernel,
                         std::array<int64_t, 2> strides, std::array<int64_t, 2> dilations, std::array<int64_t, 2> pads,
                         std::array<int64_t, 2> out_hw, const py::object& bias, const py::object& mult, int64_t zy,
                         const std::string& out_dtype, int num_threads, const py::object& out_obj) {
  const std::string op = "a16w8_conv2d_depthwise";
  check_threads(num_threads, op);
  auto x = contiguous_int_input(x_obj, op + ": x");
  const Elem xe = elem_of(x, op + ": x");
  const int64_t c = x.ndim() == 4 ? x.shape(1) : 0;
  const a16w8::ConvGeom g = conv_geom(op, x, c, kernel, strides, dilations, pads, out_hw, c);
  if (g.kh * g.kw >= a16w8::kMaxDepthwiseTaps) {
    throw py::value_error(op + ": kernel of " + std::to_string(g.kh * g.kw) + " taps: expected fewer than " +
                          std::to_string(a16w8::kMaxDepthwiseTaps) + " (use a16w8_conv2d)");
  }
  auto wd = require_array<int32_t>(wd_obj, (op + ": wd").c_str());
  if (wd.ndim() != 2 || wd.shape(0) != c || wd.shape(1) != g.kh * g.kw) {
    throw py::value_error(op + ": wd: expected [" + std::to_string(c) + ", " + std::to_string(g.kh * g.kw) + "], got " +
                          shape_str(shape_of(wd)));
  }
  EpArrays e = epilogue_arrays(op, c, py::none(), py::none(), bias, mult, false);
  const Elem oe = parse_out(op, out_dtype);
  py::array y = output_array(op, oe, Shape{g.batch, c, g.oh, g.ow}, out_obj, x);
  a16w8::Epilogue ep{nullptr, nullptr, e.has_bias ? e.bias.data() : nullptr, e.mult.data(), 0, zy, oe};
  const void* xd = x.data();
  const int32_t* wdd = wd.data();
  void* yd = y.mutable_data();
  run_or_record([=]() { a16w8::conv2d_depthwise(xd, xe, zx, g, wdd, ep, yd, num_threads); });
  return y;
}

// ---- elementwise ops on 16-bit codes (a16w8/requant16.h) ----------------------------------

template <typename TI, typename TO>
void affine_typed(const py::array& x, py::array& y, const a16w8::Affine16& p) {
  const TI* xs = static_cast<const TI*>(x.data());
  TO* ys = static_cast<TO*>(y.mutable_data());
  const Isa isa = active_isa();
  run_or_record([=]() { a16w8::affine16<TI, TO>(xs, ys, p, isa); });
}

py::array affine16_impl(const py::handle& x_obj, int64_t zx, const py::handle& m_obj, const py::handle& b_obj,
                        double lo, double hi, int64_t axis, const std::string& out_dtype, const py::object& out_obj) {
  const std::string op = "a16w8_affine16";
  py::array x = contiguous_int_input(x_obj, op + ": x");
  const Elem ex = elem_of(x, op + ": x");
  const Elem ey = parse_out(op, out_dtype);
  if ((ex != Elem::kU16 && ex != Elem::kI16) || (ey != Elem::kU16 && ey != Elem::kI16)) {
    throw py::value_error(op + ": expected uint16 / int16 x and output");
  }
  auto m = require_array<double>(m_obj, "a16w8_affine16: m");
  auto b = require_array<double>(b_obj, "a16w8_affine16: b");
  if (m.size() != b.size() || m.size() < 1) throw py::value_error(op + ": m, b: expected as many values, at least 1");
  if (!(lo <= hi)) throw py::value_error(op + ": expected lo <= hi");
  const AxisRuns runs = axis_runs(x, m.size(), m.size() == 1 ? 0 : 1, axis, op);
  a16w8::Affine16 p;
  p.outer = runs.outer;
  p.channels = m.size() == 1 ? 1 : m.size();
  p.inner = runs.inner;
  p.m = m.data();
  p.b = b.data();
  p.zx = static_cast<int32_t>(zx);
  p.lo = lo;
  p.hi = hi;
  py::array y;
  if (out_obj.is_none()) {
    note_new_output();
    y = py::array(numpy_of(ey), shape_of(x));
  } else {
    y = contiguous_int_input(out_obj, op + ": out");
    if (elem_of(y, op + ": out") != ey || shape_of(y) != shape_of(x) || !y.writeable() || overlaps(x, y)) {
      throw py::value_error(op + ": out: expected a writeable " + out_dtype + " array of x's shape, apart from x");
    }
  }
  if (x.size() == 0) return run_or_record([]() {}), y;  // one (empty) call, as every other size
  if (ex == Elem::kU16 && ey == Elem::kU16) affine_typed<uint16_t, uint16_t>(x, y, p);
  if (ex == Elem::kU16 && ey == Elem::kI16) affine_typed<uint16_t, int16_t>(x, y, p);
  if (ex == Elem::kI16 && ey == Elem::kU16) affine_typed<int16_t, uint16_t>(x, y, p);
  if (ex == Elem::kI16 && ey == Elem::kI16) affine_typed<int16_t, int16_t>(x, y, p);
  return y;
}

template <typename T>
py::array binary_typed(const py::array& a, const py::array& b, const py::object& out_obj, const a16w8::Binary16& p,
                       const std::string& op) {
  const Broadcast bc = broadcast_shapes(a, b, op);
  auto y = make_output<T>(out_obj, bc.out, op.c_str(), {a, b});
  const T* as = static_cast<const T*>(a.data());
  const T* bs = static_cast<const T*>(b.data());
  T* ys = y.mutable_data();
  const Isa isa = active_isa();
  // bc by value: its shape() points into it, so the kept call holds its own copy
  run_or_record([=]() { a16w8::binary16<T>(as, bs, ys, bc.shape(), p, isa); });
  return std::move(y);
}

py::array binary16_impl(const std::string& kind, const py::handle& a_obj, int64_t za, const py::handle& b_obj,
                        int64_t zb, double sa, double sb, double sy, int64_t zy, const py::object& out_obj) {
  const std::string op = "a16w8_binary16";
  if (kind != "Add" && kind != "Mul") throw py::value_error(op + ": kind: expected 'Add' or 'Mul', got '" + kind + "'");
  py::array a = contiguous_int_input(a_obj, op + ": a");
  py::array b = contiguous_int_input(b_obj, op + ": b");
  const Elem ea = elem_of(a, op + ": a");
  if ((ea != Elem::kU16 && ea != Elem::kI16) || elem_of(b, op + ": b") != ea) {
    throw py::value_error(op + ": expected a and b of one type, uint16 or int16");
  }
  a16w8::Binary16 p;
  p.mul = kind == "Mul";
  p.za = static_cast<int32_t>(za);
  p.zb = static_cast<int32_t>(zb);
  // the float32 scales the file holds (the binder passes them as Python floats)
  p.sa = static_cast<float>(sa);
  p.sb = static_cast<float>(sb);
  p.sy = static_cast<float>(sy);
  p.zy = static_cast<double>(zy);
  p.lo = ea == Elem::kU16 ? 0.0 : -32768.0;
  p.hi = ea == Elem::kU16 ? 65535.0 : 32767.0;
  if (ea == Elem::kU16) return binary_typed<uint16_t>(a, b, out_obj, p, op);
  return binary_typed<int16_t>(a, b, out_obj, p, op);
}

py::array lut16_impl(const py::handle& x_obj, const py::handle& t_obj, const py::object& out_obj) {
  const std::string op = "a16w8_lut16";
  py::array x = contiguous_int_input(x_obj, op + ": x");
  py::array t = contiguous_int_input(t_obj, op + ": table");
  const Elem ex = elem_of(x, op + ": x"), et = elem_of(t, op + ": table");
  if ((ex != Elem::kU16 && ex != Elem::kI16) || (et != Elem::kU16 && et != Elem::kI16) || t.size() != 65536) {
    throw py::value_error(op + ": expected uint16 / int16 x and a table of 65536 uint16 / int16 codes");
  }
  py::array y;
  if (out_obj.is_none()) {
    note_new_output();
    y = py::array(numpy_of(et), shape_of(x));
  } else {
    y = contiguous_int_input(out_obj, op + ": out");
    if (elem_of(y, op + ": out") != et || shape_of(y) != shape_of(x) || !y.writeable() || overlaps(x, y)) {
      throw py::value_error(op + ": out: expected a writeable array of x's shape and the table's type, apart from x");
    }
  }
  const auto* xs = static_cast<const uint16_t*>(x.data());
  const int64_t n = x.size();
  void* yd = y.mutable_data();
  const void* td = t.data();
  if (et == Elem::kU16) {
    run_or_record(
        [=]() { a16w8::lut16<uint16_t>(xs, static_cast<uint16_t*>(yd), n, static_cast<const uint16_t*>(td)); });
  } else {
    run_or_record([=]() { a16w8::lut16<int16_t>(xs, static_cast<int16_t*>(yd), n, static_cast<const int16_t*>(td)); });
  }
  return y;
}

}  // namespace

void register_a16w8(py::module_& m) {
  m.def("a16w8_affine16", &affine16_impl, py::arg("x"), py::arg("zx"), py::arg("m"), py::arg("b"), py::arg("lo"),
        py::arg("hi"), py::arg("axis"), py::arg("out_dtype"), py::arg("out") = py::none(),
        "y = sat(rne(clamp(f64(x - zx) * m[c] + b[c], lo, hi))) on 16-bit codes, c along axis (requant16.h).");
  m.def("a16w8_lut16", &lut16_impl, py::arg("x"), py::arg("table"), py::arg("out") = py::none(),
        "y = table[16 bits of x] (a 65536-entry lookup table, requant16.h).");
  m.def("a16w8_binary16", &binary16_impl, py::arg("kind"), py::arg("a"), py::arg("za"), py::arg("b"), py::arg("zb"),
        py::arg("sa"), py::arg("sb"), py::arg("sy"), py::arg("zy"), py::arg("out") = py::none(),
        "QLinearAdd16 / QLinearMul16 on 16-bit codes with numpy broadcasting (requant16.h).");
  m.def("a16w8_matmul", &matmul_impl, py::arg("a"), py::arg("packed"), py::arg("k"), py::arg("n"), py::arg("dw"),
        py::arg("cw"), py::arg("bias"), py::arg("mult"), py::arg("za"), py::arg("zy"), py::arg("out_dtype"),
        py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "16-bit (or 8-bit) a times packed 8-bit / byte-split 16-bit weights, exact, requantized (a16w8.h).");
  m.def("a16w8_conv2d", &conv_impl, py::arg("x"), py::arg("zx"), py::arg("packed"), py::arg("m"), py::arg("kernel"),
        py::arg("strides"), py::arg("dilations"), py::arg("pads"), py::arg("out_hw"), py::arg("group"), py::arg("dw"),
        py::arg("cw"), py::arg("bias"), py::arg("mult"), py::arg("zy"), py::arg("out_dtype"),
        py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "NCHW A16W8 convolution on the a16w8 GEMM (pads: top, left).");
  m.def("a16w8_conv2d_depthwise", &depthwise_impl, py::arg("x"), py::arg("zx"), py::arg("wd"), py::arg("kernel"),
        py::arg("strides"), py::arg("dilations"), py::arg("pads"), py::arg("out_hw"), py::arg("bias"), py::arg("mult"),
        py::arg("zy"), py::arg("out_dtype"), py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "NCHW depthwise A16W8 convolution, exact int64 sums.");
}

}  // namespace quanta
