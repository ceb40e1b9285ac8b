// Bindings for the W4A8 kernel (w4/w4a8.h; docs/quantization-math.md eqs. (W3)-(W5)).
//
//   w4a8_matmul(a, packed, colsum, c, k, n, block, za, y_scale=None, zy=0, out_dtype="f32",
//               num_threads=1, out=None) -> [..., N]
//     a: [..., K] uint8 or int8 (za in a's type); packed: int8 [kb, ntiles, block/4, 64]
//     (quanta.targets.native.w4a8.pack_blocks); colsum: int32 [kb, ntiles·16]; c: float32
//     [kb, ntiles·16]; out_dtype "f32" (then no y_scale), "u8" or "i8" (y_scale a float).
//
//   nbits_a8_matmul(a, packed, zp, sw, k, n, block, bias=None, num_threads=1, out=None, bits=4)
//     -> float32 [..., N]: MatMulNBits at accuracy_level 4 (w4/nbits_a8.h, eqs. (W6)-(W10)).
//     a: float32 [..., K]; packed: uint8 [panels, kb, block/4, 64] of the 4-bit codes, two
//     to a byte (pack_nibbles; panels = ceil(N / 32)); zp: uint8 [panels, kb, 32] (the zero
//     points), sw: float32 [panels, kb, 32] (nbits_block_params); bias: float32 [N].
#include <cstdint>
#include <string>

#include "bindings.h"
#include "w4/nbits_a8.h"
#include "w4/w4a8.h"

namespace quanta {
namespace {

// What both 4-bit block products check alike: A's last axis and layout, and the block size.
void check_a(const std::string& op, const py::array& a, int64_t k, int64_t block) {
  if (!(a.flags() & py::array::c_style)) throw py::value_error(op + ": a: expected a C-contiguous array");
  if (a.ndim() < 1 || a.shape(a.ndim() - 1) != k) {
    throw py::value_error(op + ": a: expected shape [..., " + std::to_string(k) + "], got " + shape_str(shape_of(a)));
  }
  if (block < 4 || block % 4 || block > 4096) {
    throw py::value_error(op + ": block: expected a multiple of 4 in [4, 4096], got " + std::to_string(block));
  }
}

// w4a8's packed weight: kb blocks along K by ntiles tiles of 16 columns, one int8 a value.
struct BlockLayout {
  int64_t kb, ntiles;
  py::array_t<int8_t, py::array::c_style> packed;
};

BlockLayout check_block_layout(const std::string& op, const py::array& a, const py::handle& packed_obj, int64_t k,
                               int64_t n, int64_t block) {
  check_a(op, a, k, block);
  const int64_t kb = (k + block - 1) / block, ntiles = (n + 15) / 16;
  auto packed = require_array<int8_t>(packed_obj, (op + ": packed").c_str());
  if (packed.size() != kb * ntiles * block * 16) {
    throw py::value_error(op + ": packed: expected " + std::to_string(kb * ntiles * block * 16) +
                          " int8 values for K=" + std::to_string(k) + ", N=" + std::to_string(n) +
                          ", block=" + std::to_string(block));
  }
  return {kb, ntiles, packed};
}

py::array w4a8_impl(const py::handle& a_obj, const py::handle& packed_obj, const py::handle& colsum_obj,
                    const py::handle& c_obj, int64_t k, int64_t n, int64_t block, int64_t za, const py::object& y_scale,
                    int64_t zy, const std::string& out_dtype, int num_threads, const py::object& out_obj) {
  const std::string op = "w4a8_matmul";
  check_threads(num_threads, op);
  if (!py::isinstance<py::array>(a_obj)) throw py::value_error(op + ": a: expected a numpy array");
  auto a = py::reinterpret_borrow<py::array>(a_obj);
  const bool a_signed = dtype_equiv(a.dtype(), py::dtype::of<int8_t>());
  if (!a_signed && !dtype_equiv(a.dtype(), py::dtype::of<uint8_t>())) {
    throw py::value_error(op + ": a: expected uint8 or int8, got " + py::str(a.dtype()).cast<std::string>());
  }
  const BlockLayout layout = check_block_layout(op, a, packed_obj, k, n, block);
  const int64_t kb = layout.kb, ntiles = layout.ntiles;
  const auto& packed = layout.packed;
  auto colsum = require_array<int32_t>(colsum_obj, (op + ": colsum").c_str());
  auto c = require_array<float>(c_obj, (op + ": c").c_str());
  if (colsum.size() != kb * ntiles * 16 || c.size() != kb * ntiles * 16) {
    throw py::value_error(op + ": colsum, c: expected " + std::to_string(kb * ntiles * 16) + " values each");
  }
  int kind;
  py::dtype odt;
  if (out_dtype == "f32") {
    kind = 0, odt = py::dtype::of<float>();
  } else if (out_dtype == "u8") {
    kind = 1, odt = py::dtype::of<uint8_t>();
  } else if (out_dtype == "i8") {
    kind = 2, odt = py::dtype::of<int8_t>();
  } else {
    throw py::value_error(op + ": out_dtype: expected f32, u8 or i8, got '" + out_dtype + "'");
  }
  float sy = 1.0f;
  if (kind != 0) {
    if (y_scale.is_none()) throw py::value_error(op + ": y_scale: required for a quantized output");
    sy = y_scale.cast<float>();
  }
  Shape shape = shape_of(a);
  shape.back() = n;
  py::array y;
  if (out_obj.is_none()) {
    y = py::array(odt, shape);
  } else {
    y = py::reinterpret_borrow<py::array>(out_obj);
    if (!dtype_equiv(y.dtype(), odt) || shape_of(y) != shape || !(y.flags() & py::array::c_style) || !y.writeable()) {
      throw py::value_error(op + ": out: expected a writeable C-contiguous array of shape " + shape_str(shape));
    }
  }
  w4a8::Params p{static_cast<int64_t>(a.size()) / (k ? k : 1),
                 k,
                 n,
                 block,
                 packed.data(),
                 colsum.data(),
                 c.data(),
                 static_cast<int32_t>(a_signed ? za + 128 : za),
                 a_signed,
                 kind ? &sy : nullptr,
                 static_cast<int32_t>(zy),
                 kind};
  if (k == 0) p.m = 0;
  {
    py::gil_scoped_release release;
    w4a8::matmul(a.data(), p, y.mutable_data(), num_threads);
  }
  return y;
}

py::array nbits_a8_impl(const py::handle& a_obj, const py::handle& packed_obj, const py::handle& zp_obj,
                        const py::handle& sw_obj, int64_t k, int64_t n, int64_t block, const py::object& bias_obj,
                        int num_threads, const py::object& out_obj, int bits) {
  const std::string op = "nbits_a8_matmul";
  check_threads(num_threads, op);
  if (bits != 4 && bits != 8) throw py::value_error(op + ": bits: expected 4 or 8, got " + std::to_string(bits));
  if (!py::isinstance<py::array>(a_obj)) throw py::value_error(op + ": a: expected a numpy array");
  auto a = py::reinterpret_borrow<py::array>(a_obj);
  if (!dtype_equiv(a.dtype(), py::dtype::of<float>())) {
    throw py::value_error(op + ": a: expected float32, got " + py::str(a.dtype()).cast<std::string>());
  }
  check_a(op, a, k, block);
  const int64_t kb = (k + block - 1) / block, panels = (n + 31) / 32;
  auto packed = require_array<uint8_t>(packed_obj, (op + ": packed").c_str());
  if (packed.size() != kb * panels * block * 16 * (bits / 4)) {
    throw py::value_error(op + ": packed: expected " + std::to_string(kb * panels * block * 16 * (bits / 4)) +
                          " uint8 values for K=" + std::to_string(k) + ", N=" + std::to_string(n) +
                          ", block=" + std::to_string(block));
  }
  auto zp = require_array<uint8_t>(zp_obj, (op + ": zp").c_str());
  auto sw = require_array<float>(sw_obj, (op + ": sw").c_str());
  if (zp.size() != panels * kb * 32 || sw.size() != panels * kb * 32) {
    throw py::value_error(op + ": zp, sw: expected " + std::to_string(panels * kb * 32) + " values each");
  }
  py::array_t<float, py::array::c_style> bias;
  if (!bias_obj.is_none()) {
    bias = require_array<float>(bias_obj, (op + ": bias").c_str());
    if (bias.size() != n) throw py::value_error(op + ": bias: expected " + std::to_string(n) + " values");
  }
  Shape shape = shape_of(a);
  shape.back() = n;
  py::array y;
  if (out_obj.is_none()) {
    y = py::array(py::dtype::of<float>(), shape);
  } else {
    y = py::reinterpret_borrow<py::array>(out_obj);
    if (!dtype_equiv(y.dtype(), py::dtype::of<float>()) || shape_of(y) != shape || !(y.flags() & py::array::c_style) ||
        !y.writeable()) {
      throw py::value_error(op + ": out: expected a writeable C-contiguous float32 array of shape " + shape_str(shape));
    }
  }
  nbits_a8::Params p{k ? static_cast<int64_t>(a.size()) / k : 0, k,   n, block, packed.data(), zp.data(), sw.data(),
                     bias_obj.is_none() ? nullptr : bias.data(), bits};
  {
    py::gil_scoped_release release;
    nbits_a8::matmul(static_cast<const float*>(a.data()), p, static_cast<float*>(y.mutable_data()), num_threads);
  }
  return y;
}

}  // namespace

void register_w4(py::module_& m) {
  m.def("w4a8_matmul", &w4a8_impl, py::arg("a"), py::arg("packed"), py::arg("colsum"), py::arg("c"), py::arg("k"),
        py::arg("n"), py::arg("block"), py::arg("za"), py::arg("y_scale") = py::none(), py::arg("zy") = 0,
        py::arg("out_dtype") = "f32", py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "8-bit a times 4-bit weights per block of K, exact block dots, float32 block sums in order (w4a8.h).");
  m.def("nbits_a8_matmul", &nbits_a8_impl, py::arg("a"), py::arg("packed"), py::arg("zp"), py::arg("sw"), py::arg("k"),
        py::arg("n"), py::arg("block"), py::arg("bias") = py::none(), py::arg("num_threads") = 1,
        py::arg("out") = py::none(), py::arg("bits") = 4,
        "float32 a quantized to int8 per row and block, times 4- or 8-bit weights per block (nbits_a8.h).");
}

}  // namespace quanta
