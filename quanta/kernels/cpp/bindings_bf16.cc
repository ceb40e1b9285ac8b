// Bindings for the bf16 island kernels (bf16/bf16.h; docs/float-ops.md "bf16 islands").
//
//   bf16_matmul(a, packed, n, bias=None, num_threads=1, out=None) -> [..., N] float32
//     a: [..., K] float32 (rounded to bf16 in the kernel); packed: uint16 [blocks, k2, 32]
//     (quanta.targets.native.bf16.pack_bf16); bias: float32 [N] or None.
//   avx512bf16_supported(), avx512bf16_active(), set_avx512bf16(bool), clear_avx512bf16(),
//   bf16_path() -> "bf16" | "avx512" | "portable"
#include <cstdint>
#include <string>

#include "bf16/bf16.h"
#include "bindings.h"
#include "dispatch.h"

namespace quanta {
namespace {

py::array bf16_matmul_impl(const py::handle& a_obj, const py::handle& packed_obj, int64_t n, const py::object& bias_obj,
                           int num_threads, const py::object& out_obj) {
  const std::string op = "bf16_matmul";
  check_threads(num_threads, op);
  auto a = require_array<float>(a_obj, (op + ": a").c_str());
  if (a.ndim() < 1) throw py::value_error(op + ": a: expected rank >= 1");
  const int64_t k = a.shape(a.ndim() - 1);
  auto packed = require_array<uint16_t>(packed_obj, (op + ": packed").c_str());
  const int64_t k2 = (k + 1) / 2, blocks = 2 * ((n + 31) / 32);
  if (packed.ndim() != 3 || packed.shape(0) != blocks || packed.shape(1) != k2 || packed.shape(2) != 32) {
    throw py::value_error(op + ": packed: expected shape (" + std::to_string(blocks) + ", " + std::to_string(k2) +
                          ", 32) for K=" + std::to_string(k) + ", N=" + std::to_string(n) + ", got " +
                          shape_str(shape_of(packed)));
  }
  const float* bias = nullptr;
  py::array_t<float, py::array::c_style> b;
  if (!bias_obj.is_none()) {
    b = require_array<float>(bias_obj, (op + ": bias").c_str());
    if (b.size() != n) throw py::value_error(op + ": bias: expected " + std::to_string(n) + " values");
    bias = b.data();
  }
  Shape shape = shape_of(a);
  shape.back() = n;
  py::array_t<float, py::array::c_style> y;
  if (out_obj.is_none()) {
    y = py::array_t<float, py::array::c_style>(shape);
  } else {
    y = require_array<float>(out_obj, (op + ": out").c_str());
    if (shape_of(y) != shape || !y.writeable()) {
      throw py::value_error(op + ": out: expected a writeable array of shape " + shape_str(shape));
    }
  }
  const int64_t m = k == 0 ? 0 : static_cast<int64_t>(a.size()) / k;
  {
    py::gil_scoped_release release;
    bf16::matmul(a.data(), m, k, packed.data(), n, bias, y.mutable_data(), num_threads);
  }
  return y;
}

}  // namespace

void register_bf16(py::module_& m) {
  m.def("bf16_matmul", &bf16_matmul_impl, py::arg("a"), py::arg("packed"), py::arg("n"), py::arg("bias") = py::none(),
        py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "bf16(a) @ packed bf16 weights, float32 sums (bf16/bf16.h).");
  m.def("avx512bf16_supported", [] { return avx512bf16_supported(); }, "Whether the CPU has AVX512_BF16 (vdpbf16ps).");
  m.def("avx512bf16_active", [] { return avx512bf16_active(); });
  m.def(
      "set_avx512bf16", [](bool enabled) { set_avx512bf16_override(enabled); },
      "Turn vdpbf16ps on or off inside the avx512vnni path (tests run both).");
  m.def("clear_avx512bf16", [] { clear_avx512bf16_override(); });
  m.def("bf16_path", [] { return std::string(bf16::path_name()); });
}

}  // namespace quanta
