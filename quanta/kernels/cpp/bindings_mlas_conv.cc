// Binding of quanta::MlasConv (mlas_conv/mlas_conv.h): the entry layer. Arguments are
// checked here and a ValueError names the argument, before a pointer reaches the driver.
//
//   mlas_conv_f32(x: f32 [B, G·C, H, W], w: f32 [G·F, C, kh, kw], bias: f32 [G·F] | None,
//                 strides (sh, sw), dilations (dh, dw), pads (t, l, b, r), group,
//                 parts: int64 [P, 6] (m0, mc, n0, cn, sk, kind), num_threads=1, isa=None)
//       -> y f32 [B, G·F, oh, ow]: ONNX Runtime's float Conv, eqs. (MC1)-(MC6); the parts
//       are reference/mlas_conv.py mlas_conv_plan's for ORT's thread count
#include <pybind11/stl.h>

#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "dispatch.h"
#include "mlas_conv/mlas_conv.h"

namespace quanta {
namespace {

using F32Array = py::array_t<float, py::array::c_style | py::array::forcecast>;

void need(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("mlas_conv_f32: " + what);
}

py::array_t<float> mlas_conv_f32(const F32Array& x, const F32Array& w, const std::optional<F32Array>& bias,
                                 const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                                 const std::vector<int64_t>& pads, int64_t group,
                                 const py::array_t<int64_t, py::array::c_style | py::array::forcecast>& parts,
                                 int num_threads, const std::optional<std::string>& isa) {
  need(x.ndim() == 4, "x must be 4-D [B, C, H, W], got rank " + std::to_string(x.ndim()));
  need(w.ndim() == 4, "w must be 4-D [M, C/group, kh, kw], got rank " + std::to_string(w.ndim()));
  need(strides.size() == 2 && dilations.size() == 2 && pads.size() == 4, "strides, dilations need 2 values, pads 4");
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
  g.sh = strides[0];
  g.sw = strides[1];
  g.dh = dilations[0];
  g.dw = dilations[1];
  g.pt = pads[0];
  g.pl = pads[1];
  need(g.sh >= 1 && g.sw >= 1 && g.dh >= 1 && g.dw >= 1, "strides and dilations must be >= 1");
  g.oh = (g.h + pads[0] + pads[2] - g.dh * (g.kh - 1) - 1) / g.sh + 1;
  g.ow = (g.w + pads[1] + pads[3] - g.dw * (g.kw - 1) - 1) / g.sw + 1;
  need(g.oh >= 1 && g.ow >= 1, "the output would be empty");
  const float* b = nullptr;
  if (bias) {
    need(bias->ndim() == 1 && bias->shape(0) == w.shape(0), "bias must be [M]");
    b = bias->data();
  }
  need(parts.ndim() == 2 && parts.shape(1) == 6, "parts must be int64 [P, 6] (m0, mc, n0, cn, sk, kind)");
  const int64_t* s = parts.data();
  int64_t covered = 0;
  for (py::ssize_t i = 0; i < parts.shape(0); ++i) {
    const int64_t* p = s + 6 * i;
    need(p[0] >= 0 && p[1] >= 1 && p[0] + p[1] <= g.f && p[2] >= 0 && p[3] >= 1 && p[2] + p[3] <= g.oh * g.ow &&
             p[4] >= 1 && p[5] >= 0 && p[5] <= 2,
         "a part lies outside [0, F) x [0, oh·ow) or has an unknown kind");
    covered += p[1] * p[3];
  }
  need(covered == g.f * g.oh * g.ow, "the parts must cover every output of a group once");
  const Isa which = isa ? runnable_isa(*isa) : active_isa();
  const bool avx2 = which != Isa::kPortable;
  py::array_t<float> y({g.batch, g.group * g.f, g.oh, g.ow});
  float* yp = y.mutable_data();
  {
    py::gil_scoped_release release;
    mlas_conv::conv_f32(x.data(), w.data(), b, yp, g, s, parts.shape(0), num_threads, avx2);
  }
  return y;
}

}  // namespace

void register_mlas_conv(py::module_& m) {
  m.def("mlas_conv_f32", &mlas_conv_f32, py::arg("x"), py::arg("w"), py::arg("bias"), py::arg("strides"),
        py::arg("dilations"), py::arg("pads"), py::arg("group"), py::arg("parts"), py::kw_only(),
        py::arg("num_threads") = 1, py::arg("isa") = py::none(),
        "ONNX Runtime's float32 Conv in MLAS's order (mlas_conv/mlas_conv.h, eqs. (MC1)-(MC6)).");
}

}  // namespace quanta
