// Bindings for the MX kernels (mx/mx.h).
//
//   mx_quantize(x: f32 [R, K], fmt: str, block=32, num_threads=1, isa=None)
//       -> (bits: u8 [R, K], codes: u8 [R, ceil(K / block)])       eqs. (MX3)-(MX4)
//   mx_pack_weights(bits: u8 [K, N], codes: u8 [nb, N], fmt: str, block=32, isa=None)
//       -> MxPackedWeights                                         (B blocked along K)
//   mx_gemm(a_bits: u8 [M, K], a_codes: u8 [M, nb], a_fmt: str, packed, bias=None,
//           num_threads=1) -> f32 [M, N]                           eqs. (MX5)-(MX6)
// Elements are bit patterns (uint8 views of ml_dtypes / int8 arrays), scales E8M0 codes.
#include <cmath>
#include <string>

#include "bindings.h"
#include "mx/mx.h"

namespace quanta {
namespace {

Isa mx_isa(const py::object& isa) {
  if (isa.is_none()) return active_isa();
  const Isa i = parse_isa_name(isa.cast<std::string>());
  if (!isa_supported(i)) throw py::value_error("isa '" + isa.cast<std::string>() + "' is not supported by this CPU");
  return i;
}

mx::Elem elem_arg(const std::string& fmt, const char* op) {
  try {
    return mx::parse_elem(fmt);
  } catch (const std::invalid_argument& e) {
    throw py::value_error(std::string(op) + ": " + e.what());
  }
}

void check_block(int block, const char* op) {
  if (block < 1 || block > 4096) {
    throw py::value_error(std::string(op) + ": block: expected 1..4096, got " + std::to_string(block));
  }
}

py::tuple quantize_impl(const py::handle& x_obj, const std::string& fmt, int block, int num_threads,
                        const py::object& isa_obj) {
  const char* op = "mx_quantize";
  auto x = require_array<float>(x_obj, "mx_quantize: x");
  if (x.ndim() != 2)
    throw py::value_error("mx_quantize: x: expected a 2-D array [rows, K], got rank " + std::to_string(x.ndim()));
  check_block(block, op);
  check_threads(num_threads, op);
  const mx::Elem e = elem_arg(fmt, op);
  const int64_t R = x.shape(0), K = x.shape(1), nb = (K + block - 1) / block;
  py::array_t<uint8_t> bits({R, K}), codes({R, nb});
  const Isa isa = mx_isa(isa_obj);
  {
    py::gil_scoped_release release;
    mx::quantize(x.data(), bits.mutable_data(), codes.mutable_data(), R, K, block, e, isa, num_threads);
  }
  return py::make_tuple(bits, codes);
}

double elem_bound(mx::Elem e) {
  const mx::ElemInfo f = mx::elem_info(e);
  return e == mx::Elem::kInt8 ? 128.0 : f.max_norm * std::ldexp(1.0, f.frac_bits);
}

mx::PackedMx pack_impl(const py::handle& bits_obj, const py::handle& codes_obj, const std::string& fmt, int block,
                       const py::object& isa_obj) {
  const char* op = "mx_pack_weights";
  auto bits = require_array<uint8_t>(bits_obj, "mx_pack_weights: bits");
  auto codes = require_array<uint8_t>(codes_obj, "mx_pack_weights: codes");
  check_block(block, op);
  const mx::Elem e = elem_arg(fmt, op);
  if (bits.ndim() != 2)
    throw py::value_error("mx_pack_weights: bits: expected [K, N], got rank " + std::to_string(bits.ndim()));
  const int64_t K = bits.shape(0), N = bits.shape(1), nb = (K + block - 1) / block;
  if (codes.ndim() != 2 || codes.shape(0) != nb || codes.shape(1) != N) {
    throw py::value_error("mx_pack_weights: codes: expected shape " + shape_str({nb, N}) + ", got " +
                          shape_str(shape_of(codes)));
  }
  const Isa isa = mx_isa(isa_obj);
  py::gil_scoped_release release;
  return mx::pack(bits.data(), codes.data(), K, N, block, e, isa);
}

py::array_t<float> gemm_impl(const py::handle& a_obj, const py::handle& ac_obj, const std::string& a_fmt,
                             const mx::PackedMx& b, const py::object& bias_obj, int num_threads) {
  const char* op = "mx_gemm";
  auto a = require_array<uint8_t>(a_obj, "mx_gemm: a_bits");
  auto ac = require_array<uint8_t>(ac_obj, "mx_gemm: a_codes");
  check_threads(num_threads, op);
  const mx::Elem ea = elem_arg(a_fmt, op);
  if (a.ndim() != 2 || a.shape(1) != b.K) {
    throw py::value_error("mx_gemm: a_bits: expected [M, " + std::to_string(b.K) + "], got " + shape_str(shape_of(a)));
  }
  const int64_t M = a.shape(0);
  if (ac.ndim() != 2 || ac.shape(0) != M || ac.shape(1) != b.nb) {
    throw py::value_error("mx_gemm: a_codes: expected shape " + shape_str({M, b.nb}) + ", got " +
                          shape_str(shape_of(ac)));
  }
  if (b.elem == mx::Elem::kInt8 && ea != mx::Elem::kInt8) {
    // an INT8 pack holds only the integer panel; float activations need the float64 one
    throw py::value_error(std::string("mx_gemm: ") + mx::elem_name(ea) +
                          " activations with MXINT8 packed weights: this kernel pairs INT8 weights only "
                          "with INT8 activations; use the reference mx_gemm");
  }
  if (!(ea == mx::Elem::kInt8 && b.elem == mx::Elem::kInt8) &&
      elem_bound(ea) * elem_bound(b.elem) * b.block >= std::ldexp(1.0, 53)) {
    throw py::value_error(std::string("mx_gemm: ") + mx::elem_name(ea) + " x " + mx::elem_name(b.elem) +
                          " block dots exceed float64's exact range (2^53); use the reference mx_gemm");
  }
  const float* bias = nullptr;
  py::array_t<float, py::array::c_style> bias_arr;
  if (!bias_obj.is_none()) {
    bias_arr = require_array<float>(bias_obj, "mx_gemm: bias");
    if (bias_arr.ndim() != 1 || bias_arr.shape(0) != b.N) {
      throw py::value_error("mx_gemm: bias: expected shape (" + std::to_string(b.N) + ",), got " +
                            shape_str(shape_of(bias_arr)));
    }
    bias = bias_arr.data();
  }
  py::array_t<float> y({M, b.N});
  {
    py::gil_scoped_release release;
    mx::gemm(a.data(), ac.data(), ea, M, b, bias, y.mutable_data(), num_threads);
  }
  return y;
}

}  // namespace

void register_mx(py::module_& m) {
  py::class_<mx::PackedMx>(m, "MxPackedWeights", "MX weights B [K, N] (blocked along K) packed for mx_gemm.")
      .def_property_readonly("K", [](const mx::PackedMx& b) { return b.K; })
      .def_property_readonly("N", [](const mx::PackedMx& b) { return b.N; })
      .def_property_readonly("block", [](const mx::PackedMx& b) { return b.block; })
      .def_property_readonly("format", [](const mx::PackedMx& b) { return std::string(mx::elem_name(b.elem)); })
      .def_property_readonly("isa", [](const mx::PackedMx& b) { return std::string(isa_name(b.isa)); })
      .def("__repr__", [](const mx::PackedMx& b) {
        return "<MxPackedWeights K=" + std::to_string(b.K) + " N=" + std::to_string(b.N) + " " + mx::elem_name(b.elem) +
               " block=" + std::to_string(b.block) + " " + isa_name(b.isa) + ">";
      });
  m.def("mx_quantize", &quantize_impl, py::arg("x"), py::arg("fmt"), py::arg("block") = 32, py::arg("num_threads") = 1,
        py::arg("isa") = py::none(),
        "QuantizeMX of x [rows, K] along K: (element bits, E8M0 codes); eqs. (MX3)-(MX4).");
  m.def("mx_pack_weights", &pack_impl, py::arg("bits"), py::arg("codes"), py::arg("fmt"), py::arg("block") = 32,
        py::arg("isa") = py::none(), "Pack MX weights B [K, N] blocked along K for mx_gemm.");
  m.def("mx_gemm", &gemm_impl, py::arg("a_bits"), py::arg("a_codes"), py::arg("a_fmt"), py::arg("packed"),
        py::arg("bias") = py::none(), py::arg("num_threads") = 1,
        "Y = A · B for MX operands (eqs. (MX5)-(MX6)), float32 [M, N].");
  m.def(
      "mx_set_tile12", [](const std::string& name) { mx::set_tile12(name); }, py::arg("name") = "",
      "Force the avx512vnni MXINT8 12-row tile's form ('halves_scalef', 'halves_fma', 'wide'; '': the CPU's "
      "default). Every form gives the same bits; tests and benchmarks compare them.");
  m.def(
      "mx_tile12", [] { return std::string(mx::tile12_forced()); },
      "The avx512vnni MXINT8 12-row tile's forced form, or 'auto' (by the CPU and B's size).");
}

}  // namespace quanta
