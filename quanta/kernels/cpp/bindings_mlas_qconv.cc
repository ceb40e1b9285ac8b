// Binding of quanta::MlasQLinearConv (mlas_qconv/mlas_qconv.h): the entry layer. Arguments
// are checked here and a ValueError names the argument, before a pointer reaches the driver.
//
//   mlas_qconv_pack(w: int8 [G·F, C, kh, kw], zero_point: int32 [G·F], group, isa=None)
//       -> MlasQConvPacked (isa None: avx2 where this CPU runs it, else portable)
//   mlas_qconv(x: uint8|int8 [B, G·C, H, W], packed, zx, multiplier: f32 [G·F], zy,
//              y_signed, bias: int32 [G·F] | None, strides (sh, sw), dilations (dh, dw),
//              pads (t, l, b, r), num_threads=1, out=None, channels_last=False)
//       -> y uint8|int8 [B, G·F, oh, ow]: ONNX Runtime's QLinearConv without VNNI,
//       eqs. (QC1)-(QC4); channels_last: x [B, H, W, G·C] -> y [B, oh, ow, G·F]
#include <pybind11/stl.h>

#include <cmath>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "dispatch.h"
#include "mlas_qconv/mlas_qconv.h"

namespace quanta {
namespace {

using mlas_qconv::Packed;

void need(bool ok, const std::string& what) {
  if (!ok) throw py::value_error("mlas_qconv: " + what);
}

std::shared_ptr<Packed> pack(const py::handle& w_obj, const py::handle& zw_obj, int64_t group,
                             const std::optional<std::string>& isa) {
  auto w = require_array<int8_t>(w_obj, "mlas_qconv_pack: w");
  auto zw = require_array<int32_t>(zw_obj, "mlas_qconv_pack: zero_point");
  if (w.ndim() != 4) throw py::value_error("mlas_qconv_pack: w must be 4-D [G·F, C, kh, kw]");
  if (group < 1 || w.shape(0) % group) throw py::value_error("mlas_qconv_pack: group must divide w.shape[0]");
  if (zw.ndim() != 1 || zw.shape(0) != w.shape(0)) throw py::value_error("mlas_qconv_pack: zero_point must be [G·F]");
  for (py::ssize_t i = 0; i < zw.shape(0); ++i) {
    if (zw.data()[i] < -128 || zw.data()[i] > 127) {
      throw py::value_error("mlas_qconv_pack: zero_point[" + std::to_string(i) + "] is outside [-128, 127]");
    }
  }
  const Isa which = isa ? runnable_isa(*isa) : active_isa();
  const bool avx2 = which != Isa::kPortable;
  py::gil_scoped_release release;
  return mlas_qconv::pack(w.data(), zw.data(), group, w.shape(0) / group, w.shape(1), w.shape(2), w.shape(3), avx2);
}

template <typename T>
py::array run(const std::shared_ptr<Packed>& pw, const py::array& x_any, bool x_signed, int64_t zx,
              const std::vector<float>& mult, int64_t zy, bool y_signed, const std::vector<int32_t>& bias,
              const mlas_qconv::Geometry& g, int num_threads, bool channels_last, const py::object& out_obj) {
  auto x = require_array<T>(x_any, "mlas_qconv: x");
  auto make = [&](auto tag) -> py::array {
    using Y = decltype(tag);
    const int64_t ftot = g.group * g.f;
    auto y = channels_last ? make_output<Y>(out_obj, {g.batch, g.oh, g.ow, ftot}, "mlas_qconv", {x})
                           : make_output<Y>(out_obj, {g.batch, ftot, g.oh, g.ow}, "mlas_qconv", {x});
    const void* xp = x.data();
    void* yp = y.mutable_data();
    std::shared_ptr<Packed> keep = pw;
    run_or_record([=]() {
      mlas_qconv::conv(*keep, xp, x_signed, static_cast<int32_t>(zx), bias.empty() ? nullptr : bias.data(), mult.data(),
                       static_cast<int32_t>(zy), y_signed, yp, g, num_threads, channels_last);
    });
    return y;
  };
  return y_signed ? make(int8_t{}) : make(uint8_t{});
}

py::array mlas_qconv_call(const py::handle& x_obj, const std::shared_ptr<Packed>& pw, int64_t zx,
                          const py::handle& mult_obj, int64_t zy, bool y_signed, const py::object& bias_obj,
                          const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                          const std::vector<int64_t>& pads, int num_threads, const py::object& out_obj,
                          bool channels_last) {
  check_threads(num_threads, "mlas_qconv");
  need(pw != nullptr, "packed: expected an MlasQConvPacked, got None");
  need(py::isinstance<py::array>(x_obj), "x: expected a numpy array");
  auto x_any = py::reinterpret_borrow<py::array>(x_obj);
  const bool x_signed = dtype_equiv(x_any.dtype(), py::dtype::of<int8_t>());
  need(x_signed || dtype_equiv(x_any.dtype(), py::dtype::of<uint8_t>()), "x: expected uint8 or int8");
  need(x_any.ndim() == 4, channels_last ? "x must be 4-D [B, H, W, G·C]" : "x must be 4-D [B, G·C, H, W]");
  const int64_t c_axis = channels_last ? 3 : 1;
  mlas_qconv::Geometry g{};
  g.batch = x_any.shape(0);
  g.group = pw->group;
  g.c = pw->c;
  g.f = pw->f;
  g.kh = pw->kh;
  g.kw = pw->kw;
  need(x_any.shape(c_axis) == g.group * g.c,
       "x has " + std::to_string(x_any.shape(c_axis)) + " channels, the weights " + std::to_string(g.group * g.c));
  g.h = x_any.shape(channels_last ? 1 : 2);
  g.w = x_any.shape(channels_last ? 2 : 3);
  const std::string window = mlas_conv::set_window(g, strides, dilations, pads);
  need(window.empty(), window);
  need(x_signed ? (zx >= -128 && zx <= 127) : (zx >= 0 && zx <= 255), "zx is outside x's range");
  need(y_signed ? (zy >= -128 && zy <= 127) : (zy >= 0 && zy <= 255), "zy is outside y's range");
  const int64_t ftot = g.group * g.f;
  auto mult = require_array<float>(mult_obj, "mlas_qconv: multiplier");
  need(mult.ndim() == 1 && mult.shape(0) == ftot, "multiplier must be float32 [G·F]");
  std::vector<float> mv(mult.data(), mult.data() + ftot);
  for (float v : mv) need(std::isfinite(v) && v > 0.f, "multiplier values must be finite and > 0");
  std::vector<int32_t> bv;
  if (!bias_obj.is_none()) {
    auto b = require_array<int32_t>(bias_obj, "mlas_qconv: bias");
    need(b.ndim() == 1 && b.shape(0) == ftot, "bias must be int32 [G·F]");
    bv.assign(b.data(), b.data() + ftot);
  }
  return x_signed ? run<int8_t>(pw, x_any, true, zx, mv, zy, y_signed, bv, g, num_threads, channels_last, out_obj)
                  : run<uint8_t>(pw, x_any, false, zx, mv, zy, y_signed, bv, g, num_threads, channels_last, out_obj);
}

}  // namespace

void register_mlas_qconv(py::module_& m) {
  py::class_<Packed, std::shared_ptr<Packed>>(m, "MlasQConvPacked",
                                              "MlasQLinearConv weights prepacked once (mlas_qconv/mlas_qconv.h).")
      .def_property_readonly("isa", [](const Packed& p) { return std::string(p.avx2 ? "avx2" : "portable"); })
      .def_property_readonly("group", [](const Packed& p) { return p.group; })
      .def_property_readonly("k", [](const Packed& p) { return p.k(); });
  m.def("mlas_qconv_pack", &pack, py::arg("w"), py::arg("zero_point"), py::arg("group") = 1,
        py::arg("isa") = py::none(), "MlasQLinearConv's weights, packed once (saturating pairs, (QC1)-(QC2)).");
  m.def("mlas_qconv", &mlas_qconv_call, py::arg("x"), py::arg("packed"), py::arg("zx"), py::arg("multiplier"),
        py::arg("zy"), py::arg("y_signed"), py::arg("bias"), py::arg("strides"), py::arg("dilations"), py::arg("pads"),
        py::arg("num_threads") = 1, py::arg("out") = py::none(), py::arg("channels_last") = false,
        "ONNX Runtime's QLinearConv with u8·s8 pairs saturating to int16 (eqs. (QC1)-(QC4)); "
        "channels_last: x [B, H, W, G·C] and y [B, oh, ow, G·F].");
}

}  // namespace quanta
