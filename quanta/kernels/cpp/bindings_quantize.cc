// Bindings for QuantizeLinear (quantize/quantize.h).
//
//   histogram_update(x: f32 | f64 [C, n] any strides, k: i64[C], start: i64[C],
//                    counts: i64 | i32 [C, B] (in place), zeros: i64[C] (in place)) -> None
//   int32 counts: the caller guarantees that no count can pass 2^31 - 1 with this sample
//   (quanta/calibrate/histogram.py widens them to int64 before it could).
//   quantize_linear_u8 / _s8 / _u16 / _s16(x: f32, scale: f32[C], zero_point: i32[C], axis=1,
//                                          num_threads=1, out=None) -> u8 / i8 / u16 / i16 of x's shape
//   per-tensor when C == 1 (and scale has rank <= 1), else per-axis along `axis`; `out`, when
//   given, is a C-contiguous writeable array of x's shape and the output dtype (not
//   overlapping x) that receives the result and is returned.
//   gptq_block_f64(w: f64[G, R, n] (in place), w0: f64[G, R, n], s: f64[G, R], v: f64[G, n, n],
//                  q: f64[G, R, n] (out), d: f64[G, R, n] (out), qmin, qmax) -> None
//   GPTQ's column loop over one block of columns of G groups (quantize/gptq.h).
//   conv_gram_u8(x: u8[N, C, H, W], zero_point, groups, kernel (kh, kw), strides (sh, sw),
//                pads (top, left, bottom, right), out: i64[G, K, K] (added into)) -> None
//   Σ x_int x_intᵀ over every output position of every sample, per group, exact
//   (quantize/conv_gram.h).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include <pybind11/stl.h>

#include "bindings.h"
#include "dispatch.h"
#include "quantize/conv_gram.h"
#include "quantize/gptq.h"
#include "quantize/histogram.h"
#include "quantize/quantize.h"

namespace quanta {
namespace {

template <typename T>
py::array_t<T, py::array::c_style> quantize_impl(const py::handle& x_obj, const py::handle& scale_obj,
                                                 const py::handle& zp_obj, int64_t axis, int num_threads,
                                                 const py::object& out_obj) {
  auto x = require_array<float>(x_obj, "quantize_linear: x");
  auto scale = require_array<float>(scale_obj, "quantize_linear: scale");
  auto zp = require_array<int32_t>(zp_obj, "quantize_linear: zero_point");
  const int64_t ndim = x.ndim();
  const int64_t channels = scale.size();
  if (zp.size() != channels) {
    throw py::value_error("quantize_linear: zero_point has " + std::to_string(zp.size()) + " elements but scale has " +
                          std::to_string(channels));
  }
  const auto [outer, inner] = axis_runs(x, channels, scale.ndim(), axis, "quantize_linear");
  const float* s = scale.data();
  for (int64_t c = 0; c < channels; ++c) {
    if (!(s[c] > 0.0f)) throw py::value_error("quantize_linear: scale must be positive and finite");
  }
  if (num_threads < 1) {
    throw py::value_error("quantize_linear: num_threads: expected >= 1, got " + std::to_string(num_threads));
  }
  std::vector<py::ssize_t> shape(x.shape(), x.shape() + ndim);
  py::array_t<T, py::array::c_style> y;
  if (out_obj.is_none()) {
    note_new_output();
    y = py::array_t<T, py::array::c_style>(shape);
  } else {
    y = require_array<T>(out_obj, "quantize_linear: out");
    if (y.ndim() != ndim || !std::equal(shape.begin(), shape.end(), y.shape())) {
      throw py::value_error("quantize_linear: out: expected the shape of x");
    }
    if (!y.writeable()) throw py::value_error("quantize_linear: out: expected a writeable array");
    const auto yb = reinterpret_cast<uintptr_t>(y.data()), xb = reinterpret_cast<uintptr_t>(x.data());
    if (y.nbytes() > 0 && x.nbytes() > 0 && yb < xb + x.nbytes() && xb < yb + y.nbytes()) {
      throw py::value_error("quantize_linear: out: expected a buffer that does not overlap x");
    }
  }
  QuantizeParams p{s, zp.data(), outer, channels, inner};
  run_or_record([=]() mutable { quantize_linear<T>(x.data(), y.mutable_data(), p, active_isa(), num_threads); });
  return y;
}

template <typename T, typename Count>
int64_t histogram_rows(const py::array& x, const int64_t* k, const int64_t* start, int64_t bins, Count* counts,
                       int64_t* zeros) {
  const auto item = static_cast<int64_t>(sizeof(T));
  if (x.strides(0) % item || x.strides(1) % item) throw py::value_error("histogram_update: x: unaligned strides");
  py::gil_scoped_release release;
  return histogram::update<T, Count>(static_cast<const T*>(x.data()), x.shape(0), x.shape(1), x.strides(0) / item,
                                     x.strides(1) / item, k, start, bins, counts, zeros);
}

// counts of type Count (int64, or int32 that the caller keeps from overflowing)
template <typename Count>
void histogram_counts(const std::string& op, const py::array& x, const int64_t* k, const int64_t* start,
                      const py::handle& counts_obj, py::array_t<int64_t, py::array::c_style>& zeros) {
  auto counts = require_array<Count>(counts_obj, "histogram_update: counts");
  const int64_t c = x.shape(0);
  if (counts.ndim() != 2 || counts.shape(0) != c) {
    throw py::value_error(op + ": counts: expected [" + std::to_string(c) + ", B]");
  }
  if (!counts.writeable() || !zeros.writeable()) throw py::value_error(op + ": counts and zeros: expected writeable");
  const int64_t bins = counts.shape(1);
  int64_t bad = -1;
  if (dtype_equiv(x.dtype(), py::dtype::of<float>())) {
    bad = histogram_rows<float>(x, k, start, bins, counts.mutable_data(), zeros.mutable_data());
  } else if (dtype_equiv(x.dtype(), py::dtype::of<double>())) {
    bad = histogram_rows<double>(x, k, start, bins, counts.mutable_data(), zeros.mutable_data());
  } else {
    throw py::value_error(op + ": x: expected float32 or float64, got " + std::string(py::str(x.dtype())));
  }
  if (bad >= 0) {
    throw py::value_error(op + ": a value of channel " + std::to_string(bad) + " falls outside the window of " +
                          std::to_string(bins) + " bins");
  }
}

void histogram_update(const py::array& x, const py::handle& k_obj, const py::handle& start_obj,
                      const py::handle& counts_obj, const py::handle& zeros_obj) {
  const std::string op = "histogram_update";
  if (x.ndim() != 2) throw py::value_error(op + ": x: expected [C, n], got rank " + std::to_string(x.ndim()));
  auto k = require_array<int64_t>(k_obj, "histogram_update: k");
  auto start = require_array<int64_t>(start_obj, "histogram_update: start");
  auto zeros = require_array<int64_t>(zeros_obj, "histogram_update: zeros");
  const int64_t c = x.shape(0);
  if (k.size() != c || start.size() != c || zeros.size() != c) {
    throw py::value_error(op + ": k, start and zeros: expected " + std::to_string(c) + " channels");
  }
  const bool narrow = py::isinstance<py::array>(counts_obj) &&
                      dtype_equiv(py::reinterpret_borrow<py::array>(counts_obj).dtype(), py::dtype::of<int32_t>());
  if (narrow) return histogram_counts<int32_t>(op, x, k.data(), start.data(), counts_obj, zeros);
  return histogram_counts<int64_t>(op, x, k.data(), start.data(), counts_obj, zeros);
}

void gptq_block_f64(const py::handle& w_obj, const py::handle& w0_obj, const py::handle& s_obj, const py::handle& v_obj,
                    const py::handle& q_obj, const py::handle& d_obj, double qmin, double qmax) {
  auto w = require_array<double>(w_obj, "gptq_block_f64: w");
  auto w0 = require_array<double>(w0_obj, "gptq_block_f64: w0");
  auto s = require_array<double>(s_obj, "gptq_block_f64: s");
  auto v = require_array<double>(v_obj, "gptq_block_f64: v");
  auto q = require_array<double>(q_obj, "gptq_block_f64: q");
  auto d = require_array<double>(d_obj, "gptq_block_f64: d");
  if (w.ndim() != 3) throw py::value_error("gptq_block_f64: w: expected [groups, rows, n]");
  const int64_t g = w.shape(0), rows = w.shape(1), n = w.shape(2);
  const std::vector<int64_t> wshape{g, rows, n};
  for (const auto* a : {&w0, &q, &d}) {
    if (shape_of(*a) != wshape) throw py::value_error("gptq_block_f64: w0, q and d: expected the shape of w");
  }
  if (shape_of(s) != std::vector<int64_t>{g, rows}) throw py::value_error("gptq_block_f64: s: expected [groups, rows]");
  if (shape_of(v) != std::vector<int64_t>{g, n, n}) throw py::value_error("gptq_block_f64: v: expected [groups, n, n]");
  if (!w.writeable() || !q.writeable() || !d.writeable()) {
    throw py::value_error("gptq_block_f64: w, q and d: expected writeable arrays");
  }
  const Isa isa = active_isa();
  double* wp = w.mutable_data();
  double* qp = q.mutable_data();
  double* dp = d.mutable_data();
  py::gil_scoped_release release;
  for (int64_t k = 0; k < g; ++k) {
    const int64_t off = k * rows * n;
    gptq_block(GptqBlock{wp + off, w0.data() + off, s.data() + k * rows, v.data() + k * n * n, qp + off, dp + off, rows,
                         n, qmin, qmax},
               isa);
  }
}

void conv_gram_u8(const py::handle& x_obj, int64_t zero_point, int64_t groups, std::vector<int64_t> kernel,
                  std::vector<int64_t> strides, std::vector<int64_t> pads, const py::handle& out_obj) {
  const std::string op = "conv_gram_u8";
  auto x = require_array<uint8_t>(x_obj, "conv_gram_u8: x");
  auto out = require_array<int64_t>(out_obj, "conv_gram_u8: out");
  if (x.ndim() != 4) throw py::value_error(op + ": x: expected [N, C, H, W] uint8 codes");
  if (kernel.size() != 2 || strides.size() != 2 || pads.size() != 4) {
    throw py::value_error(op + ": expected kernel (kh, kw), strides (sh, sw) and pads (top, left, bottom, right)");
  }
  if (zero_point < 0 || zero_point > 255) throw py::value_error(op + ": zero_point: expected a code in [0, 255]");
  const int64_t n = x.shape(0), c = x.shape(1);
  if (groups <= 0 || c % groups != 0) {
    throw py::value_error(op + ": " + std::to_string(c) + " channels do not split into " + std::to_string(groups) +
                          " groups");
  }
  for (int64_t v : {kernel[0], kernel[1], strides[0], strides[1]}) {
    if (v <= 0) throw py::value_error(op + ": kernel sizes and strides must be positive");
  }
  for (int64_t v : pads) {
    if (v < 0) throw py::value_error(op + ": pads must not be negative");
  }
  conv_gram::Args a{x.data(), n,         c,         x.shape(2), x.shape(3), static_cast<int32_t>(zero_point),
                    groups,   kernel[0], kernel[1], strides[0], strides[1], pads[0],
                    pads[1],  pads[2],   pads[3],   nullptr};
  const int64_t k = conv_gram::rows(a);
  if (shape_of(out) != std::vector<int64_t>{groups, k, k}) {
    throw py::value_error(op + ": out: expected shape " + shape_str({groups, k, k}) + ", got shape " +
                          shape_str(shape_of(out)));
  }
  if (!out.writeable()) throw py::value_error(op + ": out: expected a writeable array");
  a.out = out.mutable_data();
  const Isa isa = active_isa();
  py::gil_scoped_release release;
  conv_gram::accumulate(a, isa);
}

}  // namespace

void register_quantize(py::module_& m) {
  m.def("conv_gram_u8", &conv_gram_u8, py::arg("x"), py::arg("zero_point"), py::arg("groups"), py::arg("kernel"),
        py::arg("strides"), py::arg("pads"), py::arg("out"),
        "out[g] += Σ_p x_int(p) x_int(p)ᵀ over a convolution's output positions (quantize/conv_gram.h; "
        "rounding.RoundedLayer).");
  m.def("gptq_block_f64", &gptq_block_f64, py::arg("w"), py::arg("w0"), py::arg("s"), py::arg("v"), py::arg("q"),
        py::arg("d"), py::arg("qmin"), py::arg("qmax"),
        "GPTQ's column loop over one block of columns (quantize/gptq.h; rounding.gptq_round_groups).");
  m.def("histogram_update", &histogram_update, py::arg("x"), py::arg("k"), py::arg("start"), py::arg("counts"),
        py::arg("zeros"),
        "counts[c, floor(x[c, i]·2^-k[c]) - start[c]] += 1 for the finite values; zeros[c] += the zeros "
        "(quanta/calibrate/histogram.py).");
  m.def("quantize_linear_u8", &quantize_impl<uint8_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to uint8 (ONNX semantics, round half to even).");
  m.def("quantize_linear_s8", &quantize_impl<int8_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to int8 (ONNX semantics, round half to even).");
  m.def("quantize_linear_u16", &quantize_impl<uint16_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to uint16 (ONNX semantics, round half to even).");
  m.def("quantize_linear_s16", &quantize_impl<int16_t>, py::arg("x"), py::arg("scale"), py::arg("zero_point"),
        py::arg("axis") = 1, py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "QuantizeLinear to int16 (ONNX semantics, round half to even).");
}

}  // namespace quanta
