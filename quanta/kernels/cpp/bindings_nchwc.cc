// Bindings for the NCHW16c float kernels (nchwc/nchwc.h): the entry layer. Every argument
// is checked here and a ValueError names the argument, what was expected and what was
// given.
//
//   reorder_nchwc_f32(x: f32 [N, C, H, W], out=None, num_threads=1) -> [N, Cb, H, W, 16]
//   reorder_nchw_f32(x: f32 [N, Cb, H, W, 16], c, out=None, num_threads=1) -> [N, c, H, W]
//   conv_nchwc_pack_f32(w: f32 [M, C/G, kh, kw], group=1, input_nchw=False) -> packed (1-D)
//   conv_nchwc_f32(x, w_packed, bias | None, m, c, kh, kw, strides, dilations, pads (t, l, b, r),
//                  group, lo, hi, num_threads, out=None, post_kind=0, post_params=[],
//                  input_nchw=False, sum=None) -> y [N, ⌈m/16⌉, OH, OW, 16]
//       sum: an NCHW16c tensor of y's shape added after the bias (group 1; not y itself).
//       x: [N, ⌈c/16⌉, H, W, 16], or [N, c, H, W] with input_nchw (group 1); group 1 or
//       depthwise (group == c == m).
//   max_pool_nchwc_f32(x5, kernel, strides, pads, dilations=[1, 1], ceil_mode=False,
//                      num_threads=1, out=None)                  ONNX MaxPool, exact
//   global_avg_pool_nchwc_f32(x5, num_threads=1, out=None) -> [N, Cb, 1, 1, 16]   sum16 mean
//   resize_nearest_nchwc_f32(x5, fy, fx, num_threads=1, out=None) -> [N, Cb, H·fy, W·fx, 16]
#include <pybind11/stl.h>

#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "nchwc/nchwc.h"
#include "sgemm/sgemm.h"

namespace quanta {
namespace {

using Arr = py::array_t<float, py::array::c_style>;
constexpr py::ssize_t kB = nchwc::kBlock;

py::array reorder_nchwc(const py::handle& x_obj, const py::object& out_obj, int num_threads) {
  const std::string op = "reorder_nchwc_f32";
  check_threads(num_threads, op);
  auto x = require_array<float>(x_obj, "reorder_nchwc_f32: x");
  if (x.ndim() != 4) throw py::value_error(op + ": x: expected [N, C, H, W], got " + shape_str(shape_of(x)));
  const int64_t n = x.shape(0), c = x.shape(1), h = x.shape(2), w = x.shape(3);
  auto y = make_output<float>(out_obj, Shape{n, nchwc::blocks(c), h, w, kB}, op.c_str(), {x});
  if (y.size() == 0) return std::move(y);
  run_or_record(
      [=]() mutable { nchwc::reorder_to_nchwc(x.data(), n, c, h * w, y.mutable_data(), num_threads, active_isa()); });
  return std::move(y);
}

py::array reorder_nchw(const py::handle& x_obj, int64_t c, const py::object& out_obj, int num_threads) {
  const std::string op = "reorder_nchw_f32";
  check_threads(num_threads, op);
  auto x = require_array<float>(x_obj, "reorder_nchw_f32: x");
  if (x.ndim() != 5 || x.shape(4) != kB) {
    throw py::value_error(op + ": x: expected [N, Cb, H, W, 16], got " + shape_str(shape_of(x)));
  }
  if (c < 0 || nchwc::blocks(c) != x.shape(1)) {
    throw py::value_error(op + ": c: expected a channel count with ceil(c / 16) = " + std::to_string(x.shape(1)) +
                          " blocks, got " + std::to_string(c));
  }
  const int64_t n = x.shape(0), h = x.shape(2), w = x.shape(3);
  auto y = make_output<float>(out_obj, Shape{n, c, h, w}, op.c_str(), {x});
  if (y.size() == 0) return std::move(y);
  run_or_record(
      [=]() mutable { nchwc::reorder_to_nchw(x.data(), n, c, h * w, y.mutable_data(), num_threads, active_isa()); });
  return std::move(y);
}

bool depthwise_of(int64_t group, int64_t c, int64_t m) { return group > 1 && group == c && group == m; }

Arr conv_pack(const py::handle& w_obj, int64_t group, bool input_nchw) {
  const std::string op = "conv_nchwc_pack_f32";
  auto w = require_array<float>(w_obj, "conv_nchwc_pack_f32: w");
  if (w.ndim() != 4) throw py::value_error(op + ": w: expected [M, C/G, kh, kw], got " + shape_str(shape_of(w)));
  const int64_t m = w.shape(0), cg = w.shape(1), kh = w.shape(2), kw = w.shape(3);
  if (m < 1 || cg < 1 || kh < 1 || kw < 1) {
    throw py::value_error(op + ": w: expected a non-empty [M, C/G, kh, kw], got " + shape_str(shape_of(w)));
  }
  const bool dw = group > 1 && cg == 1 && group == m;
  if (group != 1 && !dw) {
    throw py::value_error(op + ": group: expected 1 or depthwise (group == M, weights [M, 1, kh, kw]), got group " +
                          std::to_string(group) + " for w " + shape_str(shape_of(w)));
  }
  if (input_nchw && group != 1) {
    throw py::value_error(op + ": input_nchw: expected group 1, got group " + std::to_string(group));
  }
  const int64_t c = dw ? m : cg;
  Arr out(Shape{static_cast<py::ssize_t>(nchwc::packed_size(m, c, kh, kw, dw))});
  nchwc::pack_weights(w.data(), m, c, kh, kw, dw, out.mutable_data());
  return out;
}

py::array conv(const py::handle& x_obj, const py::handle& w_obj, const py::object& bias_obj, int64_t m, int64_t c,
               int64_t kh, int64_t kw, const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
               const std::vector<int64_t>& pads, int64_t group, float lo, float hi, int num_threads,
               const py::object& out_obj, int post_kind, const std::vector<float>& post_params, bool input_nchw,
               const py::object& sum_obj) {
  const std::string op = "conv_nchwc_f32";
  // held by pointer: a recorded call passes the op's address on every run (an address
  // into the call's own capture gave other bytes from the second run on, -O3)
  const auto post = std::make_shared<const sgemm::PostOp>(post_op_arg(post_kind, post_params, op));
  check_threads(num_threads, op);
  auto x = require_array<float>(x_obj, "conv_nchwc_f32: x");
  auto w = require_array<float>(w_obj, "conv_nchwc_f32: w_packed");
  if (m < 1 || c < 1) {
    throw py::value_error(op + ": m, c: expected >= 1, got m = " + std::to_string(m) + ", c = " + std::to_string(c));
  }
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4) {
    throw py::value_error(op + ": expected 2 strides, 2 dilations and 4 pads (top, left, bottom, right), got " +
                          std::to_string(strides.size()) + ", " + std::to_string(dilations.size()) + " and " +
                          std::to_string(pads.size()));
  }
  if (kh < 1 || kw < 1 || strides[0] < 1 || strides[1] < 1 || dilations[0] < 1 || dilations[1] < 1 || pads[0] < 0 ||
      pads[1] < 0 || pads[2] < 0 || pads[3] < 0) {
    throw py::value_error(op + ": expected kernel, strides, dilations >= 1 and pads >= 0");
  }
  const bool dw = depthwise_of(group, c, m);
  if (group != 1 && !dw) {
    throw py::value_error(op + ": group: expected 1 or depthwise (group == c == m), got group " +
                          std::to_string(group) + " with c = " + std::to_string(c) + ", m = " + std::to_string(m));
  }
  if (input_nchw && group != 1) {
    throw py::value_error(op + ": input_nchw: expected group 1, got group " + std::to_string(group));
  }
  nchwc::ConvGeom g;
  if (input_nchw) {
    if (x.ndim() != 4 || x.shape(1) != c) {
      throw py::value_error(op + ": x: expected [N, " + std::to_string(c) + ", H, W] (input_nchw), got " +
                            shape_str(shape_of(x)));
    }
  } else if (x.ndim() != 5 || x.shape(1) != nchwc::blocks(c) || x.shape(4) != kB) {
    throw py::value_error(op + ": x: expected [N, " + std::to_string(nchwc::blocks(c)) +
                          ", H, W, 16] for c = " + std::to_string(c) + ", got " + shape_str(shape_of(x)));
  }
  g.n = x.shape(0);
  g.c = c;
  g.h = x.shape(2);
  g.w = x.shape(3);
  g.m = m;
  g.depthwise = dw;
  g.input_nchw = input_nchw;
  g.kh = kh;
  g.kw = kw;
  g.sh = strides[0];
  g.sw = strides[1];
  g.dh = dilations[0];
  g.dw = dilations[1];
  g.pt = pads[0];
  g.pl = pads[1];
  const int64_t eh = g.dh * (kh - 1) + 1, ew = g.dw * (kw - 1) + 1;
  const int64_t hp = g.h + pads[0] + pads[2], wp = g.w + pads[1] + pads[3];
  if (hp < eh || wp < ew) {
    throw py::value_error(op + ": the dilated kernel (" + std::to_string(eh) + ", " + std::to_string(ew) +
                          ") is larger than the padded input (" + std::to_string(hp) + ", " + std::to_string(wp) + ")");
  }
  g.oh = (hp - eh) / g.sh + 1;
  g.ow = (wp - ew) / g.sw + 1;
  const int64_t expect = nchwc::packed_size(m, c, kh, kw, dw);
  if (w.size() != expect) {
    throw py::value_error(op + ": w_packed: expected " + std::to_string(expect) +
                          " floats (conv_nchwc_pack_f32 of m = " + std::to_string(m) + ", c = " + std::to_string(c) +
                          ", kernel " + std::to_string(kh) + "x" + std::to_string(kw) + (dw ? ", depthwise" : "") +
                          "), got " + std::to_string(w.size()));
  }
  std::vector<float> bias16;
  if (!bias_obj.is_none()) {
    auto bias = require_array<float>(bias_obj, "conv_nchwc_f32: bias");
    if (bias.size() != m) {
      throw py::value_error(op + ": bias: expected " + std::to_string(m) + " floats, got " +
                            std::to_string(bias.size()));
    }
    bias16.assign(static_cast<size_t>(nchwc::blocks(m) * kB), 0.0f);
    std::copy(bias.data(), bias.data() + m, bias16.begin());
  }
  const Shape yshape{g.n, nchwc::blocks(m), g.oh, g.ow, kB};
  Arr sum;
  if (!sum_obj.is_none()) {
    if (dw) throw py::value_error(op + ": sum: a sum operand is for group 1 convolutions only");
    sum = require_array<float>(sum_obj, "conv_nchwc_f32: sum");
    if (shape_of(sum) != yshape) {
      throw py::value_error(op + ": sum: expected the output's shape " + shape_str(yshape) + ", got " +
                            shape_str(shape_of(sum)));
    }
  }
  // the output may not be the sum operand: a tile reads its sum after other tiles wrote y
  auto y = sum_obj.is_none() ? make_output<float>(out_obj, yshape, op.c_str(), {x, w})
                             : make_output<float>(out_obj, yshape, op.c_str(), {x, w, sum});
  if (y.size() == 0) return std::move(y);
  run_or_record([=]() mutable {
    nchwc::conv(g, x.data(), w.data(), bias16.empty() ? nullptr : bias16.data(), lo, hi,
                post_kind ? post.get() : nullptr, y.mutable_data(), num_threads, active_isa(),
                sum_obj.is_none() ? nullptr : sum.data());
  });
  return std::move(y);
}

// The 5-D NCHW16c input of a pool or resize, checked.
Arr blocked_input(const py::handle& x_obj, const std::string& op) {
  auto x = require_array<float>(x_obj, (op + ": x").c_str());
  if (x.ndim() != 5 || x.shape(4) != kB) {
    throw py::value_error(op + ": x: expected [N, Cb, H, W, 16], got " + shape_str(shape_of(x)));
  }
  return x;
}

py::array max_pool(const py::handle& x_obj, const std::vector<int64_t>& kernel, const std::vector<int64_t>& strides,
                   const std::vector<int64_t>& pads, const std::vector<int64_t>& dilations, bool ceil_mode,
                   int num_threads, const py::object& out_obj) {
  const std::string op = "max_pool_nchwc_f32";
  check_threads(num_threads, op);
  auto x = blocked_input(x_obj, op);
  if (kernel.size() != 2 || strides.size() != 2 || pads.size() != 4 || dilations.size() != 2) {
    throw py::value_error(op +
                          ": expected 2 kernel sizes, 2 strides, 4 pads (top, left, bottom, right) and 2 "
                          "dilations");
  }
  if (kernel[0] < 1 || kernel[1] < 1 || strides[0] < 1 || strides[1] < 1 || dilations[0] < 1 || dilations[1] < 1 ||
      pads[0] < 0 || pads[1] < 0 || pads[2] < 0 || pads[3] < 0) {
    throw py::value_error(op + ": expected kernel, strides, dilations >= 1 and pads >= 0");
  }
  nchwc::PoolGeom g{x.shape(2),   x.shape(3),   kernel[0], kernel[1], strides[0], strides[1],
                    dilations[0], dilations[1], pads[0],   pads[1],   0,          0};
  // ONNX MaxPool's output size (reference conv_geometry.output_spatial): floor, or ceil
  // with ceil_mode where a last window starting inside the end padding is dropped.
  int64_t* outs[2] = {&g.oh, &g.ow};
  const int64_t sizes[2] = {g.h, g.w}, ks[2] = {g.kh, g.kw}, ss[2] = {g.sh, g.sw}, ds[2] = {g.dh, g.dw};
  for (int a = 0; a < 2; ++a) {
    const int64_t span = sizes[a] + pads[a] + pads[a + 2] - ((ks[a] - 1) * ds[a] + 1);
    if (span < 0) {
      throw py::value_error(op + ": the dilated kernel is larger than the padded input along axis " +
                            std::to_string(a + 2));
    }
    int64_t o = (ceil_mode ? (span + ss[a] - 1) / ss[a] : span / ss[a]) + 1;
    if (ceil_mode && (o - 1) * ss[a] >= sizes[a] + pads[a]) --o;
    *outs[a] = o;
  }
  auto y = make_output<float>(out_obj, Shape{x.shape(0), x.shape(1), g.oh, g.ow, kB}, op.c_str(), {x});
  if (y.size() == 0) return std::move(y);
  run_or_record([=]() mutable {
    nchwc::max_pool(x.data(), x.shape(0) * x.shape(1), g, y.mutable_data(), num_threads, active_isa());
  });
  return std::move(y);
}

py::array global_avg_pool(const py::handle& x_obj, int num_threads, const py::object& out_obj) {
  const std::string op = "global_avg_pool_nchwc_f32";
  check_threads(num_threads, op);
  auto x = blocked_input(x_obj, op);
  const int64_t hw = x.shape(2) * x.shape(3);
  if (hw == 0) throw py::value_error(op + ": x: expected a non-empty plane, got " + shape_str(shape_of(x)));
  auto y = make_output<float>(out_obj, Shape{x.shape(0), x.shape(1), 1, 1, kB}, op.c_str(), {x});
  if (y.size() == 0) return std::move(y);
  run_or_record([=]() mutable {
    nchwc::global_avg_pool(x.data(), x.shape(0) * x.shape(1), hw, y.mutable_data(), num_threads, active_isa());
  });
  return std::move(y);
}

py::array resize_nearest(const py::handle& x_obj, int64_t fy, int64_t fx, int num_threads, const py::object& out_obj) {
  const std::string op = "resize_nearest_nchwc_f32";
  check_threads(num_threads, op);
  auto x = blocked_input(x_obj, op);
  if (fy < 1 || fx < 1) {
    throw py::value_error(op + ": fy, fx: expected integer factors >= 1, got " + std::to_string(fy) + ", " +
                          std::to_string(fx));
  }
  const int64_t h = x.shape(2), w = x.shape(3);
  auto y = make_output<float>(out_obj, Shape{x.shape(0), x.shape(1), h * fy, w * fx, kB}, op.c_str(), {x});
  if (y.size() == 0) return std::move(y);
  run_or_record([=]() mutable {
    nchwc::resize_nearest(x.data(), x.shape(0) * x.shape(1), h, w, fy, fx, y.mutable_data(), num_threads);
  });
  return std::move(y);
}

}  // namespace

void register_nchwc(py::module_& m) {
  const float inf = std::numeric_limits<float>::infinity();
  m.def("reorder_nchwc_f32", &reorder_nchwc, py::arg("x"), py::arg("out") = py::none(), py::arg("num_threads") = 1,
        "NCHW -> NCHW16c ([N, ceil(C/16), H, W, 16], pad lanes 0); moves only.");
  m.def("reorder_nchw_f32", &reorder_nchw, py::arg("x"), py::arg("c"), py::arg("out") = py::none(),
        py::arg("num_threads") = 1, "NCHW16c -> NCHW with c channels (pad lanes dropped); moves only.");
  m.def("conv_nchwc_pack_f32", &conv_pack, py::arg("w"), py::arg("group") = 1, py::arg("input_nchw") = false,
        "Pack float Conv weights [M, C/G, kh, kw] (group 1 or depthwise) for conv_nchwc_f32.");
  m.def("conv_nchwc_f32", &conv, py::arg("x"), py::arg("w_packed"), py::arg("bias"), py::arg("m"), py::arg("c"),
        py::arg("kh"), py::arg("kw"), py::arg("strides"), py::arg("dilations"), py::arg("pads"), py::arg("group") = 1,
        py::arg("lo") = -inf, py::arg("hi") = inf, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        py::arg("post_kind") = 0, py::arg("post_params") = std::vector<float>{}, py::arg("input_nchw") = false,
        py::arg("sum") = py::none(),
        "Float32 direct convolution on NCHW16c (nchwc.h; docs/float-ops.md (FG1)): + bias, + sum (group 1), clamp "
        "to [lo, hi], then the post op (sgemm.h PostOp kinds, as conv_f32's post).");
  m.def("max_pool_nchwc_f32", &max_pool, py::arg("x"), py::arg("kernel"), py::arg("strides"), py::arg("pads"),
        py::arg("dilations") = std::vector<int64_t>{1, 1}, py::arg("ceil_mode") = false, py::arg("num_threads") = 1,
        py::arg("out") = py::none(),
        "ONNX MaxPool (2-D, -inf padding) of an NCHW16c tensor, every lane; exact (max only selects).");
  m.def("global_avg_pool_nchwc_f32", &global_avg_pool, py::arg("x"), py::arg("num_threads") = 1,
        py::arg("out") = py::none(),
        "GlobalAveragePool of an NCHW16c tensor -> [N, Cb, 1, 1, 16]: per lane f32(sum16 / f32(H*W)), the bytes of "
        "the NCHW twin.");
  m.def("resize_nearest_nchwc_f32", &resize_nearest, py::arg("x"), py::arg("fy"), py::arg("fx"),
        py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "Nearest upsampling of H and W by integer factors of an NCHW16c tensor: each pixel's 16 floats copied "
        "fy*fx times.");
}

}  // namespace quanta
