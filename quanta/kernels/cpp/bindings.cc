// The _native module: ISA queries and one register_* call per kernel family.
#include <pybind11/stl.h>

#include "bindings.h"
#include "dispatch.h"

namespace quanta {
void register_index_ops(py::module_& m);    // bindings_index_ops.cc
void register_ort_spatial(py::module_& m);  // bindings_ort_spatial.cc
}  // namespace quanta

PYBIND11_MODULE(_native, m) {
  using namespace quanta;
  m.doc() = "quanta native int8 kernels (see docs/kernels.md)";
  m.def(
      "supported_isas",
      [] {
        std::vector<std::string> out;
        for (Isa i : supported_isas()) out.emplace_back(isa_name(i));
        return out;
      },
      "ISAs this CPU can run, portable first.");
  m.def("active_isa", [] { return std::string(isa_name(active_isa())); });
  m.def(
      "set_isa", [](const std::string& name) { set_isa_override(parse_isa_name(name)); },
      "Force one ISA variant (tests compare every variant pairwise).");
  m.def("clear_isa", [] { clear_isa_override(); });
  m.def(
      "avx512vbmi_supported", [] { return avx512vbmi_supported(); },
      "Whether the CPU has AVX-512 VBMI (the avx512vnni path's byte lookup uses it).");
  m.def("avx512vbmi_active", [] { return avx512vbmi_active(); });
  m.def(
      "set_avx512vbmi", [](bool enabled) { set_avx512vbmi_override(enabled); },
      "Turn the VBMI byte lookup on or off inside the avx512vnni path (tests run both).");
  m.def("clear_avx512vbmi", [] { clear_avx512vbmi_override(); });
  register_quantize(m);
  register_qgemm(m);
  register_tuner(m);
  register_gemm(m);
  register_elementwise(m);
  register_conv(m);
  register_mlas_conv(m);
  register_mlas_qconv(m);
  register_layout(m);
  register_float_ops(m);
  register_pool(m);
  register_ort_spatial(m);
  register_recurrent(m);
  register_tensor_ops(m);
  register_sgemm(m);
  register_intonly(m);
  register_a16w8(m);
  register_w4(m);
  register_bf16(m);
  register_mx(m);
  register_nchwc(m);
  register_index_ops(m);
  register_program(m);
}
