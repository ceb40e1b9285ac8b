// Binding of quanta::MlasConv (mlas_conv/mlas_conv.h): the entry layer. Arguments are
// checked here and a ValueError names the argument, before a pointer reaches the driver.
//
//   mlas_conv_f32(x: f32 [B, G·C, H, W], w: f32 [G·F, C, kh, kw], bias: f32 [G·F] | None,
//                 strides (sh, sw), dilations (dh, dw), pads (t, l, b, r), group,
//                 parts: int64 [P, 6] (m0, mc, n0, cn, sk, kind), num_threads=1, out=None,
//                 isa=None, alpha=1)
//       -> y f32 [B, G·F, oh, ow]: ONNX Runtime's float Conv, eqs. (MC1)-(MC6); the parts
//       are reference/mlas_conv.py mlas_conv_plan's for ORT's thread count. alpha != 1:
//       then y = f32(y · alpha) per element, MlasMatMul's (MM4) where every part is one K
//       block (the caller checks that), in the same recorded call
//
// x, w, bias and out must be C-contiguous float32 (a ValueError otherwise: the caller's
// generic path makes the copy), so the kernel call reads and writes the caller's arrays and
// can be recorded into a native program (bindings.h run_or_record). The output size is
// reference/mlas_conv.py conv_shape's; it is recomputed here only to check `out`.
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "dispatch.h"
#include "mlas_conv/mlas_conv.h"

namespace quanta {
namespace {

void need(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("mlas_conv_f32: " + what);
}

// The parts tile [0, F) x [0, oh·ow) exactly: each inside it, no two overlapping, their areas
// summing to F·oh·ow. Incorrect: (0, 4, 0, 16) and (2, 4, 8, 16) (rows 2-3 x columns 8-15
// twice, so another output is left unwritten); correct: (0, 4, 0, 16) and (4, 4, 0, 16).
void check_parts(const int64_t* s, int64_t n_parts, int64_t f, int64_t n_out) {
  int64_t covered = 0;
  for (int64_t i = 0; i < n_parts; ++i) {
    const int64_t* p = s + 6 * i;
    need(p[0] >= 0 && p[1] >= 1 && p[0] + p[1] <= f && p[2] >= 0 && p[3] >= 1 && p[2] + p[3] <= n_out && p[4] >= 1 &&
             p[5] >= 0 && p[5] <= 2,
         "part " + std::to_string(i) + " lies outside [0, F) x [0, oh·ow) or has an unknown kind");
    for (int64_t j = 0; j < i; ++j) {
      const int64_t* q = s + 6 * j;
      const bool rows = p[0] < q[0] + q[1] && q[0] < p[0] + p[1];
      const bool cols = p[2] < q[2] + q[3] && q[2] < p[2] + p[3];
      need(!(rows && cols), "parts " + std::to_string(j) + " and " + std::to_string(i) + " overlap");
    }
    covered += p[1] * p[3];
  }
  need(covered == f * n_out, "the parts must cover every output of a group once");
}

py::array mlas_conv_f32(const py::handle& x_obj, const py::handle& w_obj, const py::object& bias_obj,
                        const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                        const std::vector<int64_t>& pads, int64_t group, const py::handle& parts_obj, int num_threads,
                        const py::object& out_obj, const std::optional<std::string>& isa, float alpha) {
  check_threads(num_threads, "mlas_conv_f32");
  auto x = require_array<float>(x_obj, "mlas_conv_f32: x");
  auto w = require_array<float>(w_obj, "mlas_conv_f32: w");
  need(x.ndim() == 4, "x must be 4-D [B, C, H, W], got rank " + std::to_string(x.ndim()));
  need(w.ndim() == 4, "w must be 4-D [M, C/group, kh, kw], got rank " + std::to_string(w.ndim()));
  need(group >= 1 && x.shape(1) % group == 0 && w.shape(0) % group == 0, "group must divide C and M");
  mlas_conv::Geometry g{};
  g.batch = x.shape(0);
  g.group = group;
  g.c = x.shape(1) / group;
  g.h = x.shape(2);
  g.w = x.shape(3);
  g.f = w.shape(0) / group;
  need(w.shape(1) == g.c, "w.shape[1] must be C/group = " + std::to_string(g.c));
  g.kh = w.shape(2);
  g.kw = w.shape(3);
  const std::string window = mlas_conv::set_window(g, strides, dilations, pads);
  need(window.empty(), window);
  const float* b = nullptr;
  py::array_t<float, py::array::c_style> bias;
  if (!bias_obj.is_none()) {
    bias = require_array<float>(bias_obj, "mlas_conv_f32: bias");
    need(bias.ndim() == 1 && bias.shape(0) == w.shape(0), "bias must be [M]");
    b = bias.data();
  }
  auto parts = require_array<int64_t>(parts_obj, "mlas_conv_f32: parts");
  need(parts.ndim() == 2 && parts.shape(1) == 6, "parts must be int64 [P, 6] (m0, mc, n0, cn, sk, kind)");
  check_parts(parts.data(), parts.shape(0), g.f, g.oh * g.ow);
  const Isa which = isa ? runnable_isa(*isa) : active_isa();
  const bool avx2 = which != Isa::kPortable;
  auto y = make_output<float>(out_obj, {g.batch, g.group * g.f, g.oh, g.ow}, "mlas_conv_f32", {x, w});
  // the recorded call holds pointers into x, w, bias and y (the caller's arrays and the
  // specialized call's constants, docs/runtime.md "Native programs") and its own parts
  const std::vector<int64_t> pv(parts.data(), parts.data() + parts.size());
  const float* xp = x.data();
  const float* wp = w.data();
  float* yp = y.mutable_data();
  const int64_t ny = g.batch * g.group * g.f * g.oh * g.ow;
  run_or_record([=]() {
    mlas_conv::conv_f32(xp, wp, b, yp, g, pv.data(), static_cast<int64_t>(pv.size() / 6), num_threads, avx2);
    if (alpha != 1.0f) {
      for (int64_t i = 0; i < ny; ++i) yp[i] = yp[i] * alpha;
    }
  });
  return y;
}

}  // namespace

void register_mlas_conv(py::module_& m) {
  m.def("mlas_conv_f32", &mlas_conv_f32, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("strides"),
        py::arg("dilations"), py::arg("pads"), py::arg("group"), py::arg("parts"), py::arg("num_threads") = 1,
        py::arg("out") = py::none(), py::arg("isa") = py::none(), py::arg("alpha") = 1.0f,
        "ONNX Runtime's float32 Conv in MLAS's order (mlas_conv/mlas_conv.h, eqs. (MC1)-(MC6)); "
        "alpha != 1: y = f32(y * alpha) after it (MlasMatMul's (MM4), one K block).");
}

}  // namespace quanta
