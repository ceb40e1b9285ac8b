// Bindings for the float GEMM family (sgemm/sgemm.h): the entry layer. Every argument is
// checked here (dtype, contiguity, shapes, packed sizes, out=) and a ValueError names the
// argument, what was expected and what was given.
//
//   sgemm_pack_b(b: f32 2-D, trans=False) -> packed      B = b (K × N) or b.T (b is N × K)
//   sgemm_pack_a(a: f32 2-D, trans=False) -> packed      A = a (M × K) or a.T
//   matmul_f32(a: f32 [..., M, K], b: f32 [..., K, N] | None, b_packed=None, n=0,
//              bias=None (f32 [N]), alpha=1.0, lo=-inf, hi=inf, num_threads=1, out=None)
//       b given: numpy.matmul batch broadcasting (rank >= 2 each);
//       b_packed given (K × n, from sgemm_pack_b): one GEMM over every row of a.
//   sgemm_pack_w8(q: int8 [K, N], zero_point: f32 [N], scale: f32 [N])
//       -> (q_packed int8, zero_point f32, scale f32), each padded to ⌈N/32⌉·32 columns (w8.h)
//   matmul_w8_f32(a: f32 [..., K], q_packed, zero_point, scale, n, bias=None (f32 [N]),
//                 num_threads=1, out=None) -> y [..., n]: a · (W8)(q) (w8.h), the bytes of
//       matmul_f32 with b_packed = sgemm_pack_b of the dequantized weight.
//   conv_pack_f32(w: f32 [M, C/G, kh(, kw)], group, rows=False) -> packed   (raw [C, taps] if
//       depthwise; rows: weights of group 1 packed for the pixels-as-rows paths, sgemm.h
//       kPointwiseRows / kIm2colRows)
//   conv_f32(x: f32 [N, C, H, W], w_packed, bias | None, m, kh, kw, strides, dilations,
//            pads (t, l, b, r), group, lo=-inf, hi=inf, num_threads=1, out=None, rows=False) -> y
//       rows: w_packed is the rows packing; the geometry must take a rows path
//   ConvF32Call(x_shape, x4_shape, y_shape, w_packed, bias, m, ...conv_f32's other arguments...)
//       (x) -> y: conv_f32 of one x shape (x4_shape as [N, C, H, W]) with the rest bound once
//   conv_path_f32(...same geometry..., rows=False) -> "pointwise" | "pointwise_rows" | "im2col" |
//       "im2col_rows" | "depthwise"
//   col2im_f32(cols: f32 [N, M·kh·kw, H, W], m, kh, kw, strides, dilations, begin (t, l),
//              out_hw, bias=None, lo=-inf, hi=inf, num_threads=1, out=None) -> y [N, M, oh, ow]
//       (kernel = stride, dilation 1: col2im_tiles.h, the same bytes)
#include <pybind11/stl.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "sgemm/col2im_tiles.h"
#include "sgemm/sgemm.h"
#include "sgemm/w8.h"

namespace quanta {
namespace {

using Arr = py::array_t<float, py::array::c_style>;

Arr make_output(const py::object& out_obj, const Shape& shape, const std::string& op) {
  if (out_obj.is_none()) return note_new_output(), Arr(shape);
  auto y = require_array<float>(out_obj, (op + ": out").c_str());
  if (shape_of(y) != shape) {
    throw py::value_error(op + ": out: expected shape " + shape_str(shape) + ", got " + shape_str(shape_of(y)));
  }
  if (!y.writeable()) throw py::value_error(op + ": out: expected a writeable array");
  return y;
}

Arr pack_b(const py::handle& b_obj, bool trans) {
  auto b = require_array<float>(b_obj, "sgemm_pack_b: b");
  if (b.ndim() != 2) throw py::value_error("sgemm_pack_b: b: expected a 2-D array, got " + shape_str(shape_of(b)));
  const int64_t k = trans ? b.shape(1) : b.shape(0), n = trans ? b.shape(0) : b.shape(1);
  Arr out(Shape{static_cast<py::ssize_t>(sgemm::packed_b_size(k, n))});
  sgemm::pack_b(b.data(), trans ? 1 : n, trans ? k : 1, k, n, out.mutable_data());
  return out;
}

Arr pack_a(const py::handle& a_obj, bool trans) {
  auto a = require_array<float>(a_obj, "sgemm_pack_a: a");
  if (a.ndim() != 2) throw py::value_error("sgemm_pack_a: a: expected a 2-D array, got " + shape_str(shape_of(a)));
  const int64_t m = trans ? a.shape(1) : a.shape(0), k = trans ? a.shape(0) : a.shape(1);
  Arr out(Shape{static_cast<py::ssize_t>(sgemm::packed_a_size(m, k))});
  sgemm::pack_a(a.data(), trans ? 1 : k, trans ? m : 1, m, k, out.mutable_data());
  return out;
}

// The optional per-column bias of a product with n columns: checked, kept alive in *hold,
// its data (null without one).
const float* column_bias(const py::object& bias_obj, int64_t n, const std::string& op, Arr* hold) {
  if (bias_obj.is_none()) return nullptr;
  *hold = require_array<float>(bias_obj, (op + ": bias").c_str());
  if (hold->size() != n) throw py::value_error(op + ": bias: expected " + std::to_string(n) + " floats");
  return hold->data();
}

// The rows of a [..., K] operand taken as one matrix, and the output shape [..., n].
int64_t leading_rows(const py::array& a) {
  int64_t rows = 1;
  for (py::ssize_t d = 0; d + 1 < a.ndim(); ++d) rows *= a.shape(d);
  return rows;
}
Shape with_last(const py::array& a, int64_t n) {
  Shape s = shape_of(a);
  s.back() = n;
  return s;
}

py::array matmul_f32(const py::handle& a_obj, const py::object& b_obj, const py::object& b_packed_obj, int64_t n_packed,
                     const py::object& bias_obj, float alpha, float lo, float hi, int num_threads,
                     const py::object& out_obj) {
  const std::string op = "matmul_f32";
  check_threads(num_threads, op);
  auto a = require_array<float>(a_obj, "matmul_f32: a");
  if (a.ndim() < 2) throw py::value_error("matmul_f32: a: expected rank >= 2, got " + shape_str(shape_of(a)));
  const int64_t m = a.shape(a.ndim() - 2), k = a.shape(a.ndim() - 1);
  sgemm::Epilogue ep;
  ep.alpha = alpha;
  ep.lo = lo;
  ep.hi = hi;
  Arr bias;
  int64_t n;
  if (!b_packed_obj.is_none()) {
    if (!b_obj.is_none()) throw py::value_error("matmul_f32: give b or b_packed, not both");
    auto bp = require_array<float>(b_packed_obj, "matmul_f32: b_packed");
    n = n_packed;
    if (n < 0 || bp.size() != sgemm::packed_b_size(k, n)) {
      throw py::value_error("matmul_f32: b_packed: expected " + std::to_string(sgemm::packed_b_size(k, n)) +
                            " floats (K = " + std::to_string(k) + ", N = " + std::to_string(n) + "), got " +
                            std::to_string(bp.size()));
    }
    ep.bias_col = column_bias(bias_obj, n, op, &bias);
    auto y = make_output(out_obj, with_last(a, n), op);
    const int64_t rows = leading_rows(a);
    run_or_record([=]() mutable {
      sgemm::gemm_batched(1, rows, n, k, sgemm::MatA{a.data(), false, k}, nullptr, sgemm::MatB{bp.data(), true, 0},
                          nullptr, y.mutable_data(), ep, num_threads, active_isa());
    });
    return std::move(y);
  }
  auto b = require_array<float>(b_obj, "matmul_f32: b");
  if (b.ndim() < 2) throw py::value_error("matmul_f32: b: expected rank >= 2, got " + shape_str(shape_of(b)));
  if (b.shape(b.ndim() - 2) != k) {
    throw py::value_error("matmul_f32: inner dimensions differ: a " + shape_str(shape_of(a)) + ", b " +
                          shape_str(shape_of(b)));
  }
  n = b.shape(b.ndim() - 1);
  ep.bias_col = column_bias(bias_obj, n, op, &bias);
  // Batch broadcasting over the leading dimensions (numpy.matmul).
  const int ra = static_cast<int>(a.ndim()) - 2, rb = static_cast<int>(b.ndim()) - 2;
  const int rank = std::max(ra, rb);
  Shape batch(static_cast<size_t>(rank));
  std::vector<int64_t> sa(static_cast<size_t>(rank), 0), sb(static_cast<size_t>(rank), 0);
  int64_t stride_a = m * k, stride_b = k * n;
  for (int d = rank - 1; d >= 0; --d) {
    const int da = d - (rank - ra), db = d - (rank - rb);
    const int64_t ea = da >= 0 ? a.shape(da) : 1, eb = db >= 0 ? b.shape(db) : 1;
    if (ea != eb && ea != 1 && eb != 1) {
      throw py::value_error("matmul_f32: batch dimensions do not broadcast: a " + shape_str(shape_of(a)) + ", b " +
                            shape_str(shape_of(b)));
    }
    batch[static_cast<size_t>(d)] = std::max(ea, eb);
    sa[static_cast<size_t>(d)] = ea == 1 ? 0 : stride_a;
    sb[static_cast<size_t>(d)] = eb == 1 ? 0 : stride_b;
    stride_a *= ea;
    stride_b *= eb;
  }
  int64_t nb = 1;
  for (auto e : batch) nb *= e;
  Shape ys = batch;
  ys.push_back(m);
  ys.push_back(n);
  auto y = make_output(out_obj, ys, op);
  std::vector<int64_t> aoff(static_cast<size_t>(nb)), boff(static_cast<size_t>(nb));
  std::vector<int64_t> idx(static_cast<size_t>(rank), 0);
  for (int64_t t = 0; t < nb; ++t) {
    int64_t oa = 0, ob = 0;
    for (int d = 0; d < rank; ++d) {
      oa += idx[static_cast<size_t>(d)] * sa[static_cast<size_t>(d)];
      ob += idx[static_cast<size_t>(d)] * sb[static_cast<size_t>(d)];
    }
    aoff[static_cast<size_t>(t)] = oa;
    boff[static_cast<size_t>(t)] = ob;
    for (int d = rank - 1; d >= 0; --d) {
      if (++idx[static_cast<size_t>(d)] < batch[static_cast<size_t>(d)]) break;
      idx[static_cast<size_t>(d)] = 0;
    }
  }
  run_or_record([=]() mutable {
    sgemm::gemm_batched(nb, m, n, k, sgemm::MatA{a.data(), false, k}, aoff.data(), sgemm::MatB{b.data(), false, n},
                        boff.data(), y.mutable_data(), ep, num_threads, active_isa());
  });
  return std::move(y);
}

py::tuple pack_w8(const py::handle& q_obj, const py::handle& zp_obj, const py::handle& scale_obj) {
  const std::string op = "sgemm_pack_w8";
  auto q = require_array<int8_t>(q_obj, "sgemm_pack_w8: q");
  if (q.ndim() != 2) throw py::value_error(op + ": q: expected a 2-D array, got " + shape_str(shape_of(q)));
  const int64_t k = q.shape(0), n = q.shape(1);
  auto zp = require_array<float>(zp_obj, "sgemm_pack_w8: zero_point");
  auto scale = require_array<float>(scale_obj, "sgemm_pack_w8: scale");
  if (zp.size() != n || scale.size() != n) {
    throw py::value_error(op + ": expected " + std::to_string(n) + " zero points and scales (one per column), got " +
                          std::to_string(zp.size()) + " and " + std::to_string(scale.size()));
  }
  const int64_t np = sgemm::packed_b_size(1, n);
  py::array_t<int8_t, py::array::c_style> qp(Shape{static_cast<py::ssize_t>(sgemm::packed_w8_size(k, n))});
  Arr zpp(Shape{static_cast<py::ssize_t>(np)}), sp(Shape{static_cast<py::ssize_t>(np)});
  sgemm::pack_b_w8(q.data(), n, 1, k, n, qp.mutable_data());
  for (int64_t j = 0; j < np; ++j) {
    zpp.mutable_data()[j] = j < n ? zp.data()[j] : 0.0f;
    sp.mutable_data()[j] = j < n ? scale.data()[j] : 0.0f;
  }
  return py::make_tuple(qp, zpp, sp);
}

py::array matmul_w8(const py::handle& a_obj, const py::handle& q_obj, const py::handle& zp_obj,
                    const py::handle& scale_obj, int64_t n, const py::object& bias_obj, int num_threads,
                    const py::object& out_obj) {
  const std::string op = "matmul_w8_f32";
  check_threads(num_threads, op);
  auto a = require_array<float>(a_obj, "matmul_w8_f32: a");
  if (a.ndim() < 1) throw py::value_error(op + ": a: expected rank >= 1, got a scalar");
  const int64_t k = a.shape(a.ndim() - 1);
  auto q = require_array<int8_t>(q_obj, "matmul_w8_f32: q_packed");
  if (n < 0 || q.size() != sgemm::packed_w8_size(k, n)) {
    throw py::value_error(op + ": q_packed: expected " + std::to_string(sgemm::packed_w8_size(k, n)) + " bytes (K = " +
                          std::to_string(k) + ", N = " + std::to_string(n) + "), got " + std::to_string(q.size()));
  }
  auto zp = require_array<float>(zp_obj, "matmul_w8_f32: zero_point");
  auto scale = require_array<float>(scale_obj, "matmul_w8_f32: scale");
  const int64_t np = sgemm::packed_b_size(1, n);
  if (zp.size() != np || scale.size() != np) {
    throw py::value_error(op + ": zero_point and scale: expected " + std::to_string(np) +
                          " floats each (sgemm_pack_w8's padding)");
  }
  sgemm::Epilogue ep;
  Arr bias;
  ep.bias_col = column_bias(bias_obj, n, op, &bias);
  auto y = make_output(out_obj, with_last(a, n), op);
  const int64_t rows = leading_rows(a);
  {
    py::gil_scoped_release release;
    sgemm::gemm_w8(rows, n, k, a.data(), k, q.data(), zp.data(), scale.data(), y.mutable_data(), ep, num_threads,
                   active_isa());
  }
  return std::move(y);
}

bool is_depthwise_weight(const py::array& w, int64_t group) {
  return group > 1 && w.shape(1) == 1 && w.shape(0) == group;
}

Arr conv_pack(const py::handle& w_obj, int64_t group, bool rows) {
  auto w = require_array<float>(w_obj, "conv_pack_f32: w");
  if (w.ndim() < 3 || w.ndim() > 4) {
    throw py::value_error("conv_pack_f32: w: expected [M, C/G, kh, kw] or [M, C/G, kw], got " + shape_str(shape_of(w)));
  }
  const int64_t m = w.shape(0);
  if (rows) {
    if (group != 1 || m < 1) {
      throw py::value_error("conv_pack_f32: rows: expected weights of group 1, got " + shape_str(shape_of(w)) +
                            " with group " + std::to_string(group));
    }
    const int64_t kk = w.size() / m;  // C·kh·kw, in (c, ky, kx) order
    Arr out(Shape{static_cast<py::ssize_t>(sgemm::packed_b_size(kk, m))});
    sgemm::pack_b(w.data(), 1, kk, kk, m, out.mutable_data());  // B = Wᵀ: (k, j) at w[j·kk + k]
    return out;
  }
  if (group < 1 || m % group) {
    throw py::value_error("conv_pack_f32: group: expected a divisor of M = " + std::to_string(m) + ", got " +
                          std::to_string(group));
  }
  const int64_t kk = w.size() / std::max<int64_t>(m, 1);
  if (is_depthwise_weight(w, group)) {
    Arr out(Shape{static_cast<py::ssize_t>(w.size())});
    std::copy(w.data(), w.data() + w.size(), out.mutable_data());
    return out;
  }
  const int64_t mg = m / group, per = sgemm::packed_a_size(mg, kk);
  Arr out(Shape{static_cast<py::ssize_t>(per * group)});
  for (int64_t g = 0; g < group; ++g)
    sgemm::pack_a(w.data() + g * mg * kk, kk, 1, mg, kk, out.mutable_data() + g * per);
  return out;
}

sgemm::ConvGeom geometry(const Shape& x_shape, int64_t m, int64_t kh, int64_t kw, const std::vector<int64_t>& strides,
                         const std::vector<int64_t>& dilations, const std::vector<int64_t>& pads, int64_t group) {
  const std::string op = "conv_f32";
  if (x_shape.size() != 4) throw py::value_error(op + ": x: expected [N, C, H, W], got " + shape_str(x_shape));
  if (strides.size() != 2 || dilations.size() != 2 || pads.size() != 4) {
    throw py::value_error(op + ": expected 2 strides, 2 dilations and 4 pads (top, left, bottom, right)");
  }
  sgemm::ConvGeom g;
  g.n = x_shape[0];
  g.c = x_shape[1];
  g.h = x_shape[2];
  g.w = x_shape[3];
  g.m = m;
  g.g = group;
  g.kh = kh;
  g.kw = kw;
  g.sh = strides[0];
  g.sw = strides[1];
  g.dh = dilations[0];
  g.dw = dilations[1];
  g.pt = pads[0];
  g.pl = pads[1];
  if (group < 1 || g.c % group || m % group) {
    throw py::value_error(op + ": group " + std::to_string(group) + " must divide C = " + std::to_string(g.c) +
                          " and M = " + std::to_string(m));
  }
  if (kh < 1 || kw < 1 || g.sh < 1 || g.sw < 1 || g.dh < 1 || g.dw < 1 || pads[0] < 0 || pads[1] < 0 || pads[2] < 0 ||
      pads[3] < 0) {
    throw py::value_error(op + ": expected kernel, strides, dilations >= 1 and pads >= 0");
  }
  const int64_t eh = g.dh * (kh - 1) + 1, ew = g.dw * (kw - 1) + 1;
  const int64_t hp = g.h + pads[0] + pads[2], wp = g.w + pads[1] + pads[3];
  if (hp < eh || wp < ew) {
    throw py::value_error(op + ": the dilated kernel (" + std::to_string(eh) + ", " + std::to_string(ew) +
                          ") is larger than the padded input (" + std::to_string(hp) + ", " + std::to_string(wp) + ")");
  }
  g.oh = (hp - eh) / g.sh + 1;
  g.ow = (wp - ew) / g.sw + 1;
  return g;
}

}  // namespace

sgemm::PostOp post_op_arg(int kind, const std::vector<float>& params, const std::string& op) {
  if (kind < 0 || kind >= sgemm::kNumPostKinds) {
    throw py::value_error(op + ": post: expected a kind in [0, " + std::to_string(sgemm::kNumPostKinds) + "), got " +
                          std::to_string(kind));
  }
  if (params.size() > 4) throw py::value_error(op + ": post_params: at most 4 values");
  sgemm::PostOp post;
  post.kind = static_cast<sgemm::PostKind>(kind);
  for (size_t i = 0; i < params.size(); ++i) post.p[i] = params[i];
  post.isa = active_isa();
  return post;
}

namespace {

// The path of a convolution and its packed weights, checked against each other.
sgemm::ConvPath checked_path(const sgemm::ConvGeom& g, const py::array& w, bool rows) {
  const std::string op = "conv_f32";
  const sgemm::ConvPath path = sgemm::conv_path(g, rows);
  const bool rows_path = path == sgemm::ConvPath::kPointwiseRows || path == sgemm::ConvPath::kIm2colRows;
  if (rows && !rows_path) {
    throw py::value_error(op + ": rows: weights packed for the pixels-as-rows path, but this geometry takes another");
  }
  const int64_t m = g.m, group = g.g, kh = g.kh, kw = g.kw;
  const int64_t cg = g.c / group, mg = m / group;
  const int64_t expect = path == sgemm::ConvPath::kDepthwise ? m * kh * kw
                         : rows_path                         ? sgemm::packed_b_size(cg * kh * kw, m)
                                                             : group * sgemm::packed_a_size(mg, cg * kh * kw);
  if (w.size() != expect) {
    throw py::value_error(op + ": w_packed: expected " + std::to_string(expect) +
                          " floats for M = " + std::to_string(m) + ", C/G = " + std::to_string(cg) + ", kernel " +
                          std::to_string(kh) + "x" + std::to_string(kw) + ", got " + std::to_string(w.size()));
  }
  return path;
}

// The optional bias of M output channels, checked, kept alive in *hold.
const float* conv_bias(const py::object& bias_obj, int64_t m, Arr* hold) {
  if (bias_obj.is_none()) return nullptr;
  *hold = require_array<float>(bias_obj, "conv_f32: bias");
  if (hold->size() != m) throw py::value_error("conv_f32: bias: expected " + std::to_string(m) + " floats");
  return hold->data();
}

py::array conv_f32(const py::handle& x_obj, const py::handle& w_obj, const py::object& bias_obj, int64_t m, int64_t kh,
                   int64_t kw, const std::vector<int64_t>& strides, const std::vector<int64_t>& dilations,
                   const std::vector<int64_t>& pads, int64_t group, float lo, float hi, int num_threads,
                   const py::object& out_obj, int post_kind, const std::vector<float>& post_params, bool rows) {
  const std::string op = "conv_f32";
  const sgemm::PostOp post = post_op_arg(post_kind, post_params, op);
  check_threads(num_threads, op);
  auto x = require_array<float>(x_obj, "conv_f32: x");
  auto w = require_array<float>(w_obj, "conv_f32: w_packed");
  const sgemm::ConvGeom g = geometry(shape_of(x), m, kh, kw, strides, dilations, pads, group);
  const sgemm::ConvPath path = checked_path(g, w, rows);
  Arr bias;
  const float* bias_ptr = conv_bias(bias_obj, m, &bias);
  auto y = make_output(out_obj, Shape{g.n, m, g.oh, g.ow}, op);
  if (y.size() == 0) return std::move(y);
  {
    py::gil_scoped_release release;
    sgemm::conv(g, path, x.data(), w.data(), bias_ptr, lo, hi, y.mutable_data(), num_threads, active_isa(),
                post_kind ? &post : nullptr);
  }
  return std::move(y);
}

// conv_f32 of one x shape with every other argument bound (a specialized step of the
// executor, targets/native/float_gemm.py): the arguments converted and checked once, so
// a call checks x and runs sgemm::conv, the same call as conv_f32's: its bytes. x has
// the shape given (a 1-D convolution's [N, C, T] too), read as x4_shape [N, C, H, W];
// y has y_shape (the planned out, or a new array of that shape each call). conv_f32's
// seventeen arguments cost ~1 us of parsing per call, as long as the convolution of a
// Silero VAD layer on one frame.
class ConvF32Call {
 public:
  ConvF32Call(const Shape& x_shape, const Shape& x4_shape, const Shape& y_shape, const py::handle& w_obj,
              const py::object& bias_obj, int64_t m, int64_t kh, int64_t kw, const std::vector<int64_t>& strides,
              const std::vector<int64_t>& dilations, const std::vector<int64_t>& pads, int64_t group, float lo,
              float hi, int num_threads, const py::object& out_obj, int post_kind,
              const std::vector<float>& post_params, bool rows)
      : x_shape_(x_shape), y_shape_(y_shape), lo_(lo), hi_(hi), threads_(num_threads) {
    const std::string op = "ConvF32Call";
    post_ = post_op_arg(post_kind, post_params, op);
    has_post_ = post_kind != 0;
    check_threads(num_threads, op);
    w_ = require_array<float>(w_obj, "conv_f32: w_packed");
    g_ = geometry(x4_shape, m, kh, kw, strides, dilations, pads, group);
    path_ = checked_path(g_, w_, rows);
    bias_ptr_ = conv_bias(bias_obj, m, &bias_);
    const auto count = [](const Shape& s) {
      py::ssize_t n = 1;
      for (py::ssize_t d : s) n *= d;
      return n;
    };
    if (count(x_shape) != g_.n * g_.c * g_.h * g_.w) {
      throw py::value_error(op + ": x_shape " + shape_str(x_shape) + " and x4_shape " + shape_str(x4_shape) +
                            " differ in size");
    }
    if (count(y_shape) != g_.n * m * g_.oh * g_.ow) {
      throw py::value_error(op + ": y_shape: expected " + std::to_string(g_.n * m * g_.oh * g_.ow) + " elements, got " +
                            shape_str(y_shape));
    }
    if (!out_obj.is_none()) out_ = make_output(out_obj, y_shape, op);
  }

  py::array call(const py::handle& x_obj) const {
    auto x = require_array<float>(x_obj, "ConvF32Call: x");
    if (x.ndim() != static_cast<py::ssize_t>(x_shape_.size()) ||
        !std::equal(x_shape_.begin(), x_shape_.end(), x.shape())) {
      throw py::value_error("ConvF32Call: x: expected shape " + shape_str(x_shape_) + ", got " +
                            shape_str(shape_of(x)));
    }
    Arr y = out_ ? *out_ : (note_new_output(), Arr(y_shape_));
    if (y.size() == 0) return std::move(y);
    // the call holds this plan (the recorded callable keeps its Python object alive)
    run_or_record([this, x, y]() mutable {
      sgemm::conv(g_, path_, x.data(), w_.data(), bias_ptr_, lo_, hi_, y.mutable_data(), threads_, active_isa(),
                  has_post_ ? &post_ : nullptr);
    });
    return std::move(y);
  }

 private:
  Shape x_shape_, y_shape_;
  sgemm::ConvGeom g_;
  sgemm::ConvPath path_;
  Arr w_, bias_;
  std::optional<Arr> out_;
  const float* bias_ptr_ = nullptr;
  float lo_, hi_;
  int threads_;
  sgemm::PostOp post_;
  bool has_post_ = false;
};

py::array col2im_f32(const py::handle& cols_obj, int64_t m, int64_t kh, int64_t kw, const std::vector<int64_t>& strides,
                     const std::vector<int64_t>& dilations, const std::vector<int64_t>& begin,
                     const std::vector<int64_t>& out_hw, const py::object& bias_obj, float lo, float hi,
                     int num_threads, const py::object& out_obj) {
  const std::string op = "col2im_f32";
  check_threads(num_threads, op);
  auto cols = require_array<float>(cols_obj, "col2im_f32: cols");
  if (cols.ndim() != 4)
    throw py::value_error(op + ": cols: expected [N, M*kh*kw, H, W], got " + shape_str(shape_of(cols)));
  if (strides.size() != 2 || dilations.size() != 2 || begin.size() != 2 || out_hw.size() != 2) {
    throw py::value_error(op + ": expected 2 strides, 2 dilations, 2 crop begins and 2 output sizes");
  }
  if (m < 1 || kh < 1 || kw < 1 || strides[0] < 1 || strides[1] < 1 || dilations[0] < 1 || dilations[1] < 1 ||
      out_hw[0] < 0 || out_hw[1] < 0) {
    throw py::value_error(op + ": expected m, kernel, strides, dilations >= 1 and output sizes >= 0");
  }
  if (cols.shape(1) != m * kh * kw) {
    throw py::value_error(op + ": cols: expected " + std::to_string(m * kh * kw) + " rows (M*kh*kw), got " +
                          shape_str(shape_of(cols)));
  }
  const float* bias_ptr = nullptr;
  Arr bias;
  if (!bias_obj.is_none()) {
    bias = require_array<float>(bias_obj, "col2im_f32: bias");
    if (bias.size() != m) throw py::value_error(op + ": bias: expected " + std::to_string(m) + " floats");
    bias_ptr = bias.data();
  }
  const int64_t n = cols.shape(0);
  auto y = make_output(out_obj, Shape{n, m, out_hw[0], out_hw[1]}, op);
  if (y.size() == 0) return std::move(y);
  {
    py::gil_scoped_release release;
    if (sgemm::col2im_tiles_apply(kh, kw, strides[0], strides[1], dilations[0], dilations[1])) {
      sgemm::col2im_tiles(cols.data(), n * m, m, kh, kw, cols.shape(2), cols.shape(3), begin[0], begin[1], out_hw[0],
                          out_hw[1], bias_ptr, lo, hi, y.mutable_data(), num_threads, active_isa());
    } else {
      sgemm::col2im(cols.data(), n * m, m, kh, kw, cols.shape(2), cols.shape(3), strides[0], strides[1], dilations[0],
                    dilations[1], begin[0], begin[1], out_hw[0], out_hw[1], bias_ptr, lo, hi, y.mutable_data(),
                    num_threads);
    }
  }
  return std::move(y);
}

}  // namespace

void register_sgemm(py::module_& m) {
  const float inf = std::numeric_limits<float>::infinity();
  m.def("sgemm_pack_b", &pack_b, py::arg("b"), py::arg("trans") = false,
        "Pack a constant B (K x N, or its transpose) into the float GEMM's 32-column panels.");
  m.def("sgemm_pack_a", &pack_a, py::arg("a"), py::arg("trans") = false,
        "Pack a constant A (M x K, or its transpose) into the float GEMM's 8-row panels.");
  m.def("matmul_f32", &matmul_f32, py::arg("a"), py::arg("b") = py::none(), py::arg("b_packed") = py::none(),
        py::arg("n") = 0, py::arg("bias") = py::none(), py::arg("alpha") = 1.0f, py::arg("lo") = -inf,
        py::arg("hi") = inf, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "Float32 matmul (docs/float-ops.md (FG1)): numpy.matmul batching, or one GEMM with a packed B.");
  m.def("sgemm_pack_w8", &pack_w8, py::arg("q"), py::arg("zero_point"), py::arg("scale"),
        "Pack a constant int8 weight (K x N) with its per-column zero points and scales for matmul_w8_f32.");
  m.def("matmul_w8_f32", &matmul_w8, py::arg("a"), py::arg("q_packed"), py::arg("zero_point"), py::arg("scale"),
        py::arg("n"), py::arg("bias") = py::none(), py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "Float32 a times an int8 weight dequantized per column (w8.h (W8)): matmul_f32's bytes on the dequantized "
        "weight, a quarter of its weight bytes.");
  m.def("conv_pack_f32", &conv_pack, py::arg("w"), py::arg("group") = 1, py::arg("rows") = false,
        "Pack float Conv weights for conv_f32 (raw for depthwise; rows: for the pixels-as-rows 1x1 path).");
  m.def("conv_f32", &conv_f32, py::arg("x"), py::arg("w_packed"), py::arg("bias"), py::arg("m"), py::arg("kh"),
        py::arg("kw"), py::arg("strides"), py::arg("dilations"), py::arg("pads"), py::arg("group") = 1,
        py::arg("lo") = -inf, py::arg("hi") = inf, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        py::arg("post") = 0, py::arg("post_params") = std::vector<float>{}, py::arg("rows") = false,
        "Float32 NCHW convolution (docs/float-ops.md (FG1)-(FG2)); post: a fused activation after the clamp "
        "(sgemm.h PostOp: 0 none, 1 SiLU, 2 HardSwish, 3 HardSigmoid [alpha, beta], 4 Paddle's hardswish "
        "[b, lo, hi, d], 5 LeakyRelu [alpha, floor]), the bytes of the separate float32 kernels.");
  py::class_<ConvF32Call>(m, "ConvF32Call",
                          "conv_f32 of one x shape with every other argument bound and checked once; call(x) "
                          "gives conv_f32's bytes (into out when one was bound).")
      .def(py::init<const Shape&, const Shape&, const Shape&, const py::handle&, const py::object&, int64_t, int64_t,
                    int64_t, const std::vector<int64_t>&, const std::vector<int64_t>&, const std::vector<int64_t>&,
                    int64_t, float, float, int, const py::object&, int, const std::vector<float>&, bool>(),
           py::arg("x_shape"), py::arg("x4_shape"), py::arg("y_shape"), py::arg("w_packed"), py::arg("bias"),
           py::arg("m"), py::arg("kh"), py::arg("kw"), py::arg("strides"), py::arg("dilations"), py::arg("pads"),
           py::arg("group") = 1, py::arg("lo") = -inf, py::arg("hi") = inf, py::arg("num_threads") = 1,
           py::arg("out") = py::none(), py::arg("post") = 0, py::arg("post_params") = std::vector<float>{},
           py::arg("rows") = false)
      .def("__call__", &ConvF32Call::call, py::arg("x"));
  m.def("col2im_f32", &col2im_f32, py::arg("cols"), py::arg("m"), py::arg("kh"), py::arg("kw"), py::arg("strides"),
        py::arg("dilations"), py::arg("begin"), py::arg("out_hw"), py::arg("bias") = py::none(), py::arg("lo") = -inf,
        py::arg("hi") = inf, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "ConvTranspose's col2im (sgemm.h col2im): the NumPy twin's scatter order, then bias and clamp.");
  m.def(
      "conv_path_f32",
      [](const py::handle& x_obj, int64_t m, int64_t kh, int64_t kw, const std::vector<int64_t>& strides,
         const std::vector<int64_t>& dilations, const std::vector<int64_t>& pads, int64_t group, bool rows) {
        auto x = require_array<float>(x_obj, "conv_path_f32: x");
        switch (sgemm::conv_path(geometry(shape_of(x), m, kh, kw, strides, dilations, pads, group), rows)) {
          case sgemm::ConvPath::kPointwise: return std::string("pointwise");
          case sgemm::ConvPath::kPointwiseRows: return std::string("pointwise_rows");
          case sgemm::ConvPath::kIm2colRows: return std::string("im2col_rows");
          case sgemm::ConvPath::kDepthwise: return std::string("depthwise");
          default: return std::string("im2col");
        }
      },
      py::arg("x"), py::arg("m"), py::arg("kh"), py::arg("kw"), py::arg("strides"), py::arg("dilations"),
      py::arg("pads"), py::arg("group") = 1, py::arg("rows") = false);
}

}  // namespace quanta
