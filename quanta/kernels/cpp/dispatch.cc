// See dispatch.h. cpuid is read here and nowhere else.
#include "dispatch.h"

#include <cpuid.h>
#include <stdexcept>

namespace quanta {
namespace {

struct CpuFeatures {
  bool avx2 = false;
  bool avx512vnni = false;
  bool avx512vbmi = false;
  bool avx512bf16 = false;
};

unsigned long long xgetbv0() {
  unsigned int eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (static_cast<unsigned long long>(edx) << 32) | eax;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(1, &eax, &ebx, &ecx, &edx)) return f;
  const bool osxsave = (ecx >> 27) & 1;
  const bool fma = (ecx >> 12) & 1;
  if (!osxsave) return f;
  const unsigned long long xcr0 = xgetbv0();
  const bool ymm_os = (xcr0 & 0x6) == 0x6;
  const bool zmm_os = (xcr0 & 0xe6) == 0xe6;
  if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return f;
  const bool avx2 = (ebx >> 5) & 1;
  const bool avx512f = (ebx >> 16) & 1;
  const bool avx512dq = (ebx >> 17) & 1;
  const bool avx512bw = (ebx >> 30) & 1;
  const bool avx512vl = (ebx >> 31) & 1;
  const bool avx512vnni = (ecx >> 11) & 1;
  const bool avx512vbmi = (ecx >> 1) & 1;
  f.avx2 = ymm_os && avx2 && fma;
  f.avx512vnni = f.avx2 && zmm_os && avx512f && avx512dq && avx512bw && avx512vl && avx512vnni;
  f.avx512vbmi = f.avx512vnni && avx512vbmi;
  if (__get_cpuid_count(7, 1, &eax, &ebx, &ecx, &edx)) f.avx512bf16 = f.avx512vnni && ((eax >> 5) & 1);
  return f;
}

bool detect_intel() {
  unsigned int eax, ebx, ecx, edx;
  if (!__get_cpuid(0, &eax, &ebx, &ecx, &edx)) return false;
  return ebx == 0x756e6547u && edx == 0x49656e69u && ecx == 0x6c65746eu;  // "Genu" "ineI" "ntel"
}

const CpuFeatures& features() {
  static const CpuFeatures f = detect();
  return f;
}

int g_override = -1;
int g_vbmi_override = -1;  // -1: as the CPU says; 0: off; 1: on
int g_bf16_override = -1;  // the same for AVX512_BF16

}  // namespace

bool cpu_vendor_intel() {
  static const bool intel = detect_intel();
  return intel;
}

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable: return "portable";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512Vnni: return "avx512vnni";
  }
  return "unknown";
}

Isa parse_isa_name(const std::string& name) {
  if (name == "portable") return Isa::kPortable;
  if (name == "avx2") return Isa::kAvx2;
  if (name == "avx512vnni") return Isa::kAvx512Vnni;
  throw std::invalid_argument("unknown ISA '" + name + "': expected one of portable, avx2, avx512vnni");
}

Isa runnable_isa(const std::string& name) {
  if (name != "portable" && name != "avx2" && name != "avx512vnni") {
    throw std::invalid_argument("isa: expected one of portable, avx2, avx512vnni, got '" + name + "'");
  }
  const Isa out = parse_isa_name(name);
  if (!isa_supported(out)) throw std::invalid_argument("isa: '" + name + "' is not supported by this CPU");
  return out;
}

// The dispatch table. The int8 GEMM rows carry the Blocking fields of qgemm.h; the
// convolution paths built on qgemm name their micro-kernel family after a '+'.
const std::vector<KernelRow>& kernel_table() {
  static const std::vector<KernelRow> rows = {
      {"qgemm",
       "u8s8->s32",
       Isa::kPortable,
       "qgemm_u8s8_s32_4x16c4__portable",
       {"mc", "nc", "kc", "prefetch_a", nullptr}},
      {"qgemm", "u8s8->s32", Isa::kAvx2, "qgemm_u8s8_s32_6x16c2__avx2", {"mc", "nc", "kc", "prefetch_a", nullptr}},
      {"qgemm", "u8s8p->s32", Isa::kAvx2, "qgemm_u8s8p_s32_5x16c4__avx2", {"mc", "nc", "kc", "prefetch_a", nullptr}},
      {"qgemm",
       "u8s8->s32",
       Isa::kAvx512Vnni,
       "qgemm_u8s8_s32_12x32c4__avx512vnni",
       {"mc", "nc", "kc", "prefetch", "prefetch_a"}},
      {"qconv_direct", "u8s8->s32", Isa::kAvx2, "qconv_direct_u8s8_s32_6x16c2__avx2", {}},
      {"qconv_direct", "u8s8->s32", Isa::kAvx512Vnni, "qconv_direct_u8s8_s32_8x16c4__avx512vnni", {}},
      {"qconv_depthwise", "u8s8->s32", Isa::kPortable, "qconv_dw_u8s8_s32_1c1__portable", {}},
      {"qconv_depthwise", "u8s8->s32", Isa::kAvx2, "qconv_dw_u8s8_s32_8c4__avx2", {}},
      {"qconv_depthwise", "u8s8->s32", Isa::kAvx512Vnni, "qconv_dw_u8s8_s32_16c4__avx512vnni", {}},
      {"qconv_depthwise_nhwc", "u8s8->s32", Isa::kPortable, "qconv_dwc_u8s8_s32_1c1__portable", {}},
      {"qconv_depthwise_nhwc", "u8s8->s32", Isa::kAvx2, "qconv_dwc_u8s8_s32_16c2__avx2", {}},
      {"qconv_depthwise_nhwc", "u8s8->s32", Isa::kAvx512Vnni, "qconv_dwc_u8s8_s32_64c4__avx512vnni", {}},
      {"qconv_depthwise_nhwc_flat", "u8s8->s32", Isa::kAvx512Vnni, "qconv_dwc_flat_u8s8_s32_64c4__avx512vnni", {}},
      {"a16w8", "s16s16->s64", Isa::kPortable, "a16w8_s16s16_s64_4x32c2__portable", {}},
      {"a16w8", "s16s16->s64", Isa::kAvx2, "a16w8_s16s16_s64_4x32c2__avx2", {}},
      {"a16w8", "s16s16->s64", Isa::kAvx512Vnni, "a16w8_s16s16_s64_4x32c2__avx512vnni", {}},
      {"w4a8", "u8s4->s32", Isa::kPortable, "w4a8_u8s4_s32_1x16c4__portable", {}},
      {"w4a8", "u8s4->s32", Isa::kAvx2, "w4a8_u8s4_s32_1x16c4__avx2", {}},
      {"w4a8", "u8s4->s32", Isa::kAvx512Vnni, "w4a8_u8s4_s32_1x16c4__avx512vnni", {}},
      // MatMulNBits accuracy_level 4 (w4/nbits_a8.h): activations quantized per row and block
      {"nbits_a8", "f32s4->f32", Isa::kPortable, "nbits_a8_s8u4_f32_4x32c4__portable", {}},
      {"nbits_a8", "f32s4->f32", Isa::kAvx2, "nbits_a8_s8u4_f32_4x16c4__avx2", {}},
      {"nbits_a8", "f32s4->f32", Isa::kAvx512Vnni, "nbits_a8_s8u4_f32_4x32c4__avx512vnni", {}},
      // MX (mx/mx.h): INT8 block dots in int32, float elements in exact float64 dots.
      {"mx_gemm", "mxint8->f32", Isa::kPortable, "mx_i8_1x32c4__portable", {}},
      {"mx_gemm", "mxint8->f32", Isa::kAvx2, "mx_i8_6x16c2__avx2", {}},
      {"mx_gemm", "mxint8->f32", Isa::kAvx512Vnni, "mx_i8_12x32c4__avx512vnni", {}},
      {"mx_gemm", "mxfp->f32", Isa::kPortable, "mx_f64_1xN__portable", {}},
      {"mx_gemm", "mxfp->f32", Isa::kAvx2, "mx_f64_1xN__avx2", {}},
      {"mx_gemm", "mxfp->f32", Isa::kAvx512Vnni, "mx_f64_1xN__avx512vnni", {}},
      {"mx_quantize", "f32->mxint8", Isa::kPortable, "mx_quantize_i8__portable", {}},
      {"mx_quantize", "f32->mxint8", Isa::kAvx2, "mx_quantize_i8_8__avx2", {}},
      {"mx_quantize", "f32->mxint8", Isa::kAvx512Vnni, "mx_quantize_i8_16__avx512vnni", {}},
      {"mx_quantize", "f32->mxfp", Isa::kPortable, "mx_quantize_fp__portable", {}},
  };
  return rows;
}

const KernelRow* select_kernel(const std::string& op, const std::string& dtype, Isa isa) {
  const KernelRow* best = nullptr;
  for (const KernelRow& r : kernel_table()) {
    if (op != r.op || dtype != r.dtype || static_cast<int>(r.isa) > static_cast<int>(isa)) {
      continue;
    }
    if (best == nullptr || static_cast<int>(r.isa) > static_cast<int>(best->isa)) best = &r;
  }
  return best;
}

const KernelRow* select_kernel(const std::string& op, const std::string& dtype) {
  return select_kernel(op, dtype, active_isa());
}

const std::vector<Isa>& supported_isas() {
  static const std::vector<Isa> isas = [] {
    std::vector<Isa> v{Isa::kPortable};
    if (features().avx2) v.push_back(Isa::kAvx2);
    if (features().avx512vnni) v.push_back(Isa::kAvx512Vnni);
    return v;
  }();
  return isas;
}

bool isa_supported(Isa isa) {
  for (Isa s : supported_isas())
    if (s == isa) return true;
  return false;
}

Isa active_isa() {
  if (g_override >= 0) return static_cast<Isa>(g_override);
  return supported_isas().back();
}

void set_isa_override(Isa isa) {
  if (!isa_supported(isa))
    throw std::invalid_argument(std::string("ISA '") + isa_name(isa) + "' is not supported by this CPU");
  g_override = static_cast<int>(isa);
}

void clear_isa_override() { g_override = -1; }

bool avx512vbmi_supported() { return features().avx512vbmi; }

bool avx512vbmi_active() { return features().avx512vbmi && g_vbmi_override != 0 && active_isa() == Isa::kAvx512Vnni; }

void set_avx512vbmi_override(bool enabled) {
  if (enabled && !features().avx512vbmi) throw std::invalid_argument("AVX-512 VBMI is not supported by this CPU");
  g_vbmi_override = enabled ? 1 : 0;
}

void clear_avx512vbmi_override() { g_vbmi_override = -1; }

bool avx512bf16_supported() { return features().avx512bf16; }

bool avx512bf16_active() { return features().avx512bf16 && g_bf16_override != 0 && active_isa() == Isa::kAvx512Vnni; }

void set_avx512bf16_override(bool enabled) {
  if (enabled && !features().avx512bf16) throw std::invalid_argument("AVX512_BF16 is not supported by this CPU");
  g_bf16_override = enabled ? 1 : 0;
}

void clear_avx512bf16_override() { g_bf16_override = -1; }

}  // namespace quanta
