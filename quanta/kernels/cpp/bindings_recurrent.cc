// Bindings for the recurrent kernels (recurrent/recurrent.h): the entry layer. Every
// argument is checked here (dtype, shape, contiguity, ranges) and a ValueError names the
// argument with what was expected and what was given.
//
//   dq_lstm(x: f32[T, B, I], w: list[PackedWeights] (D, each [I, 4H]),
//           r: list[PackedWeights] (D, each [H, 4H]), w_scale: f32[D, 4H],
//           r_scale: f32[D, 4H], bias: f32[D, 4H] | None (Wb + Rb, fused),
//           peephole: f32[D, 3H] | None, initial_h: f32[D, B, H] | None,
//           initial_c: f32[D, B, H] | None, sequence_lens: int32[B] | None,
//           direction: "forward" | "reverse" | "bidirectional", clip: float > 0,
//           input_forget: bool, want_y: bool, num_threads=1, out=None | (Y, Y_h, Y_c))
//       -> (Y f32[T, D, B, H], Y_h f32[D, B, H], Y_c f32[D, B, H]) (out's arrays when given)
//   dq_gru(x: f32[T, B, I], w: list[PackedWeights] (D, each [I, 3H]),
//          r_zr: list[PackedWeights] (D, each [H, 2H], or [H, 3H] with linear_before_reset),
//          r_h: list[PackedWeights | None] (D, each [H, H]; None with linear_before_reset),
//          w_scale: f32[D, 3H], r_scale: f32[D, 3H], bias: f32[D, 6H] | None (Wb then Rb),
//          initial_h: f32[D, B, H] | None, sequence_lens: int32[B] | None, direction,
//          clip: float > 0, linear_before_reset: bool, num_threads=1)
//       -> (Y f32[T, D, B, H], Y_h f32[D, B, H])
//   float_rnn(kind: "lstm" | "gru", x: f32[T, B, I], w: list[f32[P, I, 128]] (D; the ONNX W
//             of each direction transposed to [I, G·H], G = 4 LSTM / 3 GRU, in panels of
//             kSeqPanel = 128 columns: P = ceil(G·H / 128)), r: list (D) of R's panels
//             (LSTM [H, 4H]; GRU its z, r columns [H, 2H]), r_h: list (D) of the GRU's h
//             columns [H, H] in panels (empty for an LSTM); w all in panels or all in
//             strips [P, I, 16], r and r_h all in panels [P, H, 128] or all in row strips
//             [P, H, 32] (float_rnn_layout() gives the active ISA's),
//             bias: f32[D, 2·G·H] | None, peephole: f32[D, 3H] | None (LSTM),
//             initial_h, initial_c (LSTM): f32[D, B, H] | None, sequence_lens: int32[B] | None,
//             direction, clip: float > 0, input_forget (LSTM), linear_before_reset (GRU),
//             num_threads=1)
//       -> (Y f32[T, D, B, H], Y_h f32[D, B, H][, Y_c f32[D, B, H] (LSTM)])
#include <pybind11/stl.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "bindings.h"
#include "recurrent/float_rnn.h"
#include "recurrent/recurrent.h"

namespace quanta {
namespace {

std::string shape_str(const py::array& a) {
  std::string s = "(";
  for (py::ssize_t d = 0; d < a.ndim(); ++d) s += (d ? ", " : "") + std::to_string(a.shape(d));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

std::string dims_str(const std::vector<int64_t>& dims) {
  std::string s = "(";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + (dims.size() == 1 ? ",)" : ")");
}

template <typename T>
const T* optional_array(const py::object& obj, const char* what, const std::vector<int64_t>& dims,
                        std::vector<py::array>& keep, const char* op = "dq_lstm") {
  if (obj.is_none()) return nullptr;
  const std::string name = std::string(op) + ": " + what;
  auto a = require_array<T>(obj, name.c_str());
  bool ok = a.ndim() == static_cast<py::ssize_t>(dims.size());
  for (size_t i = 0; ok && i < dims.size(); ++i) ok = a.shape(i) == dims[i];
  if (!ok) throw py::value_error(name + ": expected shape " + dims_str(dims) + ", got " + shape_str(a));
  keep.push_back(a);
  return a.data();
}

py::tuple dq_lstm_impl(const py::handle& x_obj, const std::vector<std::shared_ptr<qgemm::PackedWeights>>& w,
                       const std::vector<std::shared_ptr<qgemm::PackedWeights>>& r, const py::handle& w_scale_obj,
                       const py::handle& r_scale_obj, const py::object& bias_obj, const py::object& peep_obj,
                       const py::object& h0_obj, const py::object& c0_obj, const py::object& lens_obj,
                       const std::string& direction, double clip, bool input_forget, bool want_y, int num_threads,
                       const py::object& out_obj) {
  recurrent::DqLstmParams p;
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    throw py::value_error("dq_lstm: direction: expected forward, reverse or bidirectional, got '" + direction + "'");
  }
  p.D = direction == "bidirectional" ? 2 : 1;
  p.reverse = direction == "reverse";
  auto x = require_array<float>(x_obj, "dq_lstm: x");
  if (x.ndim() != 3) throw py::value_error("dq_lstm: x: expected rank 3 [T, B, I], got shape " + shape_str(x));
  p.T = x.shape(0);
  p.B = x.shape(1);
  p.I = x.shape(2);
  if (static_cast<int>(w.size()) != p.D || static_cast<int>(r.size()) != p.D) {
    throw py::value_error("dq_lstm: w, r: expected " + std::to_string(p.D) + " packed weights each (direction " +
                          direction + "), got " + std::to_string(w.size()) + " and " + std::to_string(r.size()));
  }
  if (!r[0]) throw py::value_error("dq_lstm: r: expected PackedWeights, got None");
  p.H = r[0]->K;
  const int64_t N = 4 * p.H;
  for (int d = 0; d < p.D; ++d) {
    if (!w[d] || !r[d]) throw py::value_error("dq_lstm: w, r: expected PackedWeights, got None");
    if (w[d]->K != p.I || w[d]->N != N) {
      throw py::value_error("dq_lstm: w[" + std::to_string(d) + "]: expected packed [" + std::to_string(p.I) + ", " +
                            std::to_string(N) + "], got [" + std::to_string(w[d]->K) + ", " + std::to_string(w[d]->N) +
                            "]");
    }
    if (r[d]->K != p.H || r[d]->N != N) {
      throw py::value_error("dq_lstm: r[" + std::to_string(d) + "]: expected packed [" + std::to_string(p.H) + ", " +
                            std::to_string(N) + "], got [" + std::to_string(r[d]->K) + ", " + std::to_string(r[d]->N) +
                            "]");
    }
    if (w[d]->isa != w[0]->isa || r[d]->isa != w[0]->isa) {
      throw py::value_error("dq_lstm: w, r: expected weights packed for one ISA, got several");
    }
    if (!isa_supported(w[d]->isa)) {
      throw py::value_error(std::string("dq_lstm: weights packed for '") + isa_name(w[d]->isa) +
                            "', which this CPU does not support");
    }
    p.w[d] = w[d].get();
    p.r[d] = r[d].get();
  }
  std::vector<py::array> keep;
  const int64_t D = p.D, B = p.B, H = p.H;
  p.w_scale = optional_array<float>(py::reinterpret_borrow<py::object>(w_scale_obj), "w_scale", {D, N}, keep);
  p.r_scale = optional_array<float>(py::reinterpret_borrow<py::object>(r_scale_obj), "r_scale", {D, N}, keep);
  if (!p.w_scale || !p.r_scale) throw py::value_error("dq_lstm: w_scale, r_scale: expected arrays, got None");
  p.bias = optional_array<float>(bias_obj, "bias", {D, N}, keep);
  p.peephole = optional_array<float>(peep_obj, "peephole", {D, 3 * H}, keep);
  p.initial_h = optional_array<float>(h0_obj, "initial_h", {D, B, H}, keep);
  p.initial_c = optional_array<float>(c0_obj, "initial_c", {D, B, H}, keep);
  p.lens = optional_array<int32_t>(lens_obj, "sequence_lens", {B}, keep);
  if (p.lens) {
    for (int64_t b = 0; b < B; ++b) {
      if (p.lens[b] < 0 || p.lens[b] > p.T) {
        throw py::value_error("dq_lstm: sequence_lens: expected values in [0, " + std::to_string(p.T) + "], got " +
                              std::to_string(p.lens[b]) + " at " + std::to_string(b));
      }
    }
  }
  if (!(clip > 0.0)) throw py::value_error("dq_lstm: clip: expected a value > 0, got " + std::to_string(clip));
  p.clip = static_cast<float>(clip);
  p.input_forget = input_forget;
  p.want_y = want_y;
  if (num_threads < 1) throw py::value_error("dq_lstm: num_threads: expected >= 1, got " + std::to_string(num_threads));
  p.num_threads = num_threads;
  p.x = x.data();

  const Shape y_shape{p.T, D, B, H}, state_shape{D, B, H};
  if (out_obj.is_none()) {
    py::array_t<float> y(y_shape), yh(state_shape), yc(state_shape);
    p.y = y.mutable_data();
    p.y_h = yh.mutable_data();
    p.y_c = yc.mutable_data();
    {
      py::gil_scoped_release release;
      recurrent::dq_lstm(p);
    }
    return py::make_tuple(y, yh, yc);
  }
  // Into given places (the runtime's arena): one call through run_or_record, so a native
  // program can keep it. What the call reads must stay where it is (bindings.h), and
  // sequence_lens is read again on every run: a recorded call sees the values of its run.
  const auto places = py::cast<py::sequence>(out_obj);
  if (places.size() != 3) {
    throw py::value_error("dq_lstm: out: expected (Y, Y_h, Y_c), got " + std::to_string(places.size()) + " arrays");
  }
  auto y = make_output<float>(places[0], y_shape, "dq_lstm (Y)", {x});
  auto yh = make_output<float>(places[1], state_shape, "dq_lstm (Y_h)", {x, y});
  auto yc = make_output<float>(places[2], state_shape, "dq_lstm (Y_c)", {x, y, yh});
  for (const py::array& in : keep) {
    if (overlaps(y, in) || overlaps(yh, in) || overlaps(yc, in)) {
      throw py::value_error("dq_lstm: out: expected buffers that overlap no input");
    }
  }
  p.y = y.mutable_data();
  p.y_h = yh.mutable_data();
  p.y_c = yc.mutable_data();
  run_or_record([p, w, r]() {  // w, r: the packed weights stay alive with the call
    if (p.lens) {
      for (int64_t b = 0; b < p.B; ++b) {
        if (p.lens[b] < 0 || p.lens[b] > p.T) {
          throw std::invalid_argument("dq_lstm: sequence_lens: expected values in [0, " + std::to_string(p.T) +
                                      "], got " + std::to_string(p.lens[b]) + " at " + std::to_string(b));
        }
      }
    }
    recurrent::dq_lstm(p);
  });
  return py::make_tuple(y, yh, yc);
}

py::tuple dq_gru_impl(const py::handle& x_obj, const std::vector<std::shared_ptr<qgemm::PackedWeights>>& w,
                      const std::vector<std::shared_ptr<qgemm::PackedWeights>>& r_zr,
                      const std::vector<std::shared_ptr<qgemm::PackedWeights>>& r_h, const py::handle& w_scale_obj,
                      const py::handle& r_scale_obj, const py::object& bias_obj, const py::object& h0_obj,
                      const py::object& lens_obj, const std::string& direction, double clip, bool linear_before_reset,
                      int num_threads) {
  recurrent::DqGruParams p;
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    throw py::value_error("dq_gru: direction: expected forward, reverse or bidirectional, got '" + direction + "'");
  }
  p.D = direction == "bidirectional" ? 2 : 1;
  p.reverse = direction == "reverse";
  p.linear_before_reset = linear_before_reset;
  auto x = require_array<float>(x_obj, "dq_gru: x");
  if (x.ndim() != 3) throw py::value_error("dq_gru: x: expected rank 3 [T, B, I], got shape " + shape_str(x));
  p.T = x.shape(0);
  p.B = x.shape(1);
  p.I = x.shape(2);
  const size_t nd = static_cast<size_t>(p.D);
  if (w.size() != nd || r_zr.size() != nd || r_h.size() != nd) {
    throw py::value_error("dq_gru: w, r_zr, r_h: expected " + std::to_string(p.D) + " entries each (direction " +
                          direction + ")");
  }
  if (!r_zr[0]) throw py::value_error("dq_gru: r_zr: expected PackedWeights, got None");
  p.H = r_zr[0]->K;
  const int64_t H = p.H, N = 3 * H;
  auto check = [&](const std::shared_ptr<qgemm::PackedWeights>& pw, const char* what, int d, int64_t K, int64_t n) {
    if (!pw) throw py::value_error(std::string("dq_gru: ") + what + ": expected PackedWeights, got None");
    if (pw->K != K || pw->N != n) {
      throw py::value_error(std::string("dq_gru: ") + what + "[" + std::to_string(d) + "]: expected packed [" +
                            std::to_string(K) + ", " + std::to_string(n) + "], got [" + std::to_string(pw->K) + ", " +
                            std::to_string(pw->N) + "]");
    }
    if (pw->isa != w[0]->isa) throw py::value_error("dq_gru: weights packed for more than one ISA");
    if (!isa_supported(pw->isa)) {
      throw py::value_error(std::string("dq_gru: weights packed for '") + isa_name(pw->isa) +
                            "', which this CPU does not support");
    }
  };
  for (int d = 0; d < p.D; ++d) {
    if (!w[d]) throw py::value_error("dq_gru: w: expected PackedWeights, got None");
    check(w[d], "w", d, p.I, N);
    check(r_zr[d], "r_zr", d, H, linear_before_reset ? N : 2 * H);
    if (linear_before_reset) {
      if (r_h[d]) throw py::value_error("dq_gru: r_h: expected None with linear_before_reset");
    } else {
      check(r_h[d], "r_h", d, H, H);
      p.r_h[d] = r_h[d].get();
    }
    p.w[d] = w[d].get();
    p.r_zr[d] = r_zr[d].get();
  }
  std::vector<py::array> keep;
  const int64_t D = p.D, B = p.B;
  p.w_scale = optional_array<float>(py::reinterpret_borrow<py::object>(w_scale_obj), "w_scale", {D, N}, keep, "dq_gru");
  p.r_scale = optional_array<float>(py::reinterpret_borrow<py::object>(r_scale_obj), "r_scale", {D, N}, keep, "dq_gru");
  if (!p.w_scale || !p.r_scale) throw py::value_error("dq_gru: w_scale, r_scale: expected arrays, got None");
  p.bias = optional_array<float>(bias_obj, "bias", {D, 2 * N}, keep, "dq_gru");
  p.initial_h = optional_array<float>(h0_obj, "initial_h", {D, B, H}, keep, "dq_gru");
  p.lens = optional_array<int32_t>(lens_obj, "sequence_lens", {B}, keep, "dq_gru");
  if (p.lens) {
    for (int64_t b = 0; b < B; ++b) {
      if (p.lens[b] < 0 || p.lens[b] > p.T) {
        throw py::value_error("dq_gru: sequence_lens: expected values in [0, " + std::to_string(p.T) + "], got " +
                              std::to_string(p.lens[b]) + " at " + std::to_string(b));
      }
    }
  }
  if (!(clip > 0.0)) throw py::value_error("dq_gru: clip: expected a value > 0, got " + std::to_string(clip));
  p.clip = static_cast<float>(clip);
  if (num_threads < 1) throw py::value_error("dq_gru: num_threads: expected >= 1, got " + std::to_string(num_threads));
  p.num_threads = num_threads;
  p.x = x.data();
  py::array_t<float> y(std::vector<py::ssize_t>{p.T, D, B, H}), yh(std::vector<py::ssize_t>{D, B, H});
  p.y = y.mutable_data();
  p.y_h = yh.mutable_data();
  {
    py::gil_scoped_release release;
    recurrent::dq_gru(p);
  }
  return py::make_tuple(y, yh);
}

py::tuple float_rnn_impl(const std::string& kind, const py::handle& x_obj, const std::vector<py::object>& w,
                         const std::vector<py::object>& r, const std::vector<py::object>& r_h,
                         const py::object& bias_obj, const py::object& peep_obj, const py::object& h0_obj,
                         const py::object& c0_obj, const py::object& lens_obj, const std::string& direction,
                         double clip, bool input_forget, bool linear_before_reset, int num_threads) {
  recurrent::FloatRnnParams p;
  if (kind != "lstm" && kind != "gru" && kind != "ort_lstm" && kind != "ort_gru")
    throw py::value_error("float_rnn: kind: expected lstm, gru, ort_lstm or ort_gru, got '" + kind + "'");
  p.gru = kind == "gru" || kind == "ort_gru";
  p.ort = kind == "ort_lstm" || kind == "ort_gru";
  if (direction != "forward" && direction != "reverse" && direction != "bidirectional") {
    throw py::value_error("float_rnn: direction: expected forward, reverse or bidirectional, got '" + direction + "'");
  }
  p.D = direction == "bidirectional" ? 2 : 1;
  p.reverse = direction == "reverse";
  auto x = require_array<float>(x_obj, "float_rnn: x");
  if (x.ndim() != 3) throw py::value_error("float_rnn: x: expected rank 3 [T, B, I], got shape " + shape_str(x));
  p.T = x.shape(0);
  p.B = x.shape(1);
  p.I = x.shape(2);
  if (static_cast<int>(w.size()) != p.D || static_cast<int>(r.size()) != p.D) {
    throw py::value_error("float_rnn: w, r: expected " + std::to_string(p.D) + " arrays each (direction " + direction +
                          "), got " + std::to_string(w.size()) + " and " + std::to_string(r.size()));
  }
  const int64_t G = p.gru ? 3 : 4;
  std::vector<py::array> keep;
  {
    auto r0 = require_array<float>(r[0], "float_rnn: r[0]");
    if (r0.ndim() != 3 || (r0.shape(2) != recurrent::kSeqPanel && r0.shape(2) != recurrent::kSeqRowStrip))
      throw py::value_error("float_rnn: r[0]: expected rank 3 [P, H, 128] or [P, H, 32], got shape " + shape_str(r0));
    p.H = r0.shape(1);
    p.r_cols = r0.shape(2);
  }
  const int64_t D = p.D, B = p.B, H = p.H, N = G * H;
  if (static_cast<int>(r_h.size()) != (p.gru ? p.D : 0)) {
    throw py::value_error("float_rnn: r_h: expected " + std::to_string(p.gru ? p.D : 0) + " arrays, got " +
                          std::to_string(r_h.size()));
  }
  auto panels = [](int64_t n, int64_t cols) { return (n + cols - 1) / cols; };
  const int64_t rc = p.r_cols;
  {
    auto w0 = require_array<float>(w[0], "float_rnn: w[0]");
    if (w0.ndim() != 3 || (w0.shape(2) != recurrent::kSeqPanel && w0.shape(2) != recurrent::kSeqWStrip))
      throw py::value_error("float_rnn: w[0]: expected rank 3 [P, I, 128] or [P, I, 16], got shape " + shape_str(w0));
    p.w_cols = w0.shape(2);
  }
  const int64_t wc = p.w_cols;
  for (int d = 0; d < p.D; ++d) {
    const std::string wn = "w[" + std::to_string(d) + "]", rn = "r[" + std::to_string(d) + "]";
    const std::string hn = "r_h[" + std::to_string(d) + "]";
    p.w[d] = optional_array<float>(w[d], wn.c_str(), {panels(N, wc), p.I, wc}, keep, "float_rnn");
    const int64_t rn_cols = p.gru ? 2 * H : N;
    p.r[d] = optional_array<float>(r[d], rn.c_str(), {panels(rn_cols, rc), H, rc}, keep, "float_rnn");
    if (!p.w[d] || !p.r[d]) throw py::value_error("float_rnn: " + wn + ", " + rn + ": expected arrays, got None");
    if (p.gru) {
      p.r_h[d] = optional_array<float>(r_h[d], hn.c_str(), {panels(H, rc), H, rc}, keep, "float_rnn");
      if (!p.r_h[d]) throw py::value_error("float_rnn: " + hn + ": expected an array, got None");
    }
  }
  p.bias = optional_array<float>(bias_obj, "bias", {D, 2 * N}, keep, "float_rnn");
  if (p.gru && !peep_obj.is_none()) throw py::value_error("float_rnn: peephole: expected None for a GRU");
  p.peephole = optional_array<float>(peep_obj, "peephole", {D, 3 * H}, keep, "float_rnn");
  p.initial_h = optional_array<float>(h0_obj, "initial_h", {D, B, H}, keep, "float_rnn");
  if (p.gru && !c0_obj.is_none()) throw py::value_error("float_rnn: initial_c: expected None for a GRU");
  p.initial_c = optional_array<float>(c0_obj, "initial_c", {D, B, H}, keep, "float_rnn");
  p.lens = optional_array<int32_t>(lens_obj, "sequence_lens", {B}, keep, "float_rnn");
  if (p.lens) {
    for (int64_t b = 0; b < B; ++b) {
      if (p.lens[b] < 0 || p.lens[b] > p.T) {
        throw py::value_error("float_rnn: sequence_lens: expected values in [0, " + std::to_string(p.T) + "], got " +
                              std::to_string(p.lens[b]) + " at " + std::to_string(b));
      }
    }
  }
  if (!(clip > 0.0)) throw py::value_error("float_rnn: clip: expected a value > 0, got " + std::to_string(clip));
  p.clip = static_cast<float>(clip);
  p.input_forget = input_forget;
  p.linear_before_reset = linear_before_reset;
  if (num_threads < 1) {
    throw py::value_error("float_rnn: num_threads: expected >= 1, got " + std::to_string(num_threads));
  }
  p.num_threads = num_threads;
  p.isa = active_isa();
  p.x = x.data();
  py::array_t<float> y(std::vector<py::ssize_t>{p.T, D, B, H}), yh(std::vector<py::ssize_t>{D, B, H});
  py::array_t<float> yc(std::vector<py::ssize_t>{p.gru ? 0 : D, B, H});
  p.y = y.mutable_data();
  p.y_h = yh.mutable_data();
  p.y_c = p.gru ? nullptr : yc.mutable_data();
  {
    py::gil_scoped_release release;
    recurrent::float_rnn(p);
  }
  if (p.gru) return py::make_tuple(y, yh);
  return py::make_tuple(y, yh, yc);
}

py::tuple lstm_gates_impl(const py::handle& gates_obj, const py::handle& c_obj, const std::vector<int>& order) {
  auto gates = require_array<float>(gates_obj, "lstm_gates_f32: gates");
  auto c = require_array<float>(c_obj, "lstm_gates_f32: c");
  if (gates.ndim() != 2 || gates.shape(1) % 4 != 0) {
    throw py::value_error("lstm_gates_f32: gates: expected [B, 4H], got shape " + shape_str(gates));
  }
  const int64_t B = gates.shape(0), H = gates.shape(1) / 4;
  if (c.ndim() != 2 || c.shape(0) != B || c.shape(1) != H) {
    throw py::value_error("lstm_gates_f32: c: expected shape " + dims_str({B, H}) + ", got " + shape_str(c));
  }
  bool perm = order.size() == 4;
  int seen = 0;
  for (size_t k = 0; perm && k < order.size(); ++k) {
    perm = order[k] >= 0 && order[k] < 4 && !(seen & (1 << order[k]));
    if (perm) seen |= 1 << order[k];
  }
  if (!perm) throw py::value_error("lstm_gates_f32: order: expected a permutation of 0, 1, 2, 3");
  py::array_t<float> h_out(std::vector<py::ssize_t>{B, H}), c_out(std::vector<py::ssize_t>{B, H});
  const int ord[4] = {order[0], order[1], order[2], order[3]};
  recurrent::lstm_gates(gates.data(), c.data(), h_out.mutable_data(), c_out.mutable_data(), B, H, ord, active_isa());
  return py::make_tuple(h_out, c_out);
}

py::array_t<float> gru_gates_impl(const py::handle& gx_obj, const py::handle& gh_obj, const py::handle& h_obj,
                                  const std::vector<int>& order) {
  auto gx = require_array<float>(gx_obj, "gru_gates_f32: gx");
  auto gh = require_array<float>(gh_obj, "gru_gates_f32: gh");
  auto h = require_array<float>(h_obj, "gru_gates_f32: h");
  if (gx.ndim() != 2 || gx.shape(1) % 3 != 0) {
    throw py::value_error("gru_gates_f32: gx: expected [B, 3H], got shape " + shape_str(gx));
  }
  const int64_t B = gx.shape(0), H = gx.shape(1) / 3;
  if (gh.ndim() != 2 || gh.shape(0) != B || gh.shape(1) != 3 * H) {
    throw py::value_error("gru_gates_f32: gh: expected shape " + dims_str({B, 3 * H}) + ", got " + shape_str(gh));
  }
  if (h.ndim() != 2 || h.shape(0) != B || h.shape(1) != H) {
    throw py::value_error("gru_gates_f32: h: expected shape " + dims_str({B, H}) + ", got " + shape_str(h));
  }
  bool perm = order.size() == 3;
  int seen = 0;
  for (size_t k = 0; perm && k < order.size(); ++k) {
    perm = order[k] >= 0 && order[k] < 3 && !(seen & (1 << order[k]));
    if (perm) seen |= 1 << order[k];
  }
  if (!perm) throw py::value_error("gru_gates_f32: order: expected a permutation of 0, 1, 2");
  py::array_t<float> h_out(std::vector<py::ssize_t>{B, H});
  const int ord[3] = {order[0], order[1], order[2]};
  recurrent::gru_gates(gx.data(), gh.data(), h.data(), h_out.mutable_data(), B, H, ord, active_isa());
  return h_out;
}

}  // namespace

void register_recurrent(py::module_& m) {
  m.def("gru_gates_f32", &gru_gates_impl, py::arg("gx"), py::arg("gh"), py::arg("h"), py::arg("order"),
        "quanta::GRUGates h' by docs/float-ops.md (GG1)-(GG3), bit-exact with reference/rnn.py gru_gates; "
        "see quanta/kernels/cpp/recurrent/float_rnn.h.");
  m.def("lstm_gates_f32", &lstm_gates_impl, py::arg("gates"), py::arg("c"), py::arg("order"),
        "quanta::LSTMGates (h', c') by docs/float-ops.md (LG1)-(LG2), bit-exact with reference/rnn.py "
        "lstm_gates; see quanta/kernels/cpp/recurrent/float_rnn.h.");
  m.def("dq_lstm", &dq_lstm_impl, py::arg("x"), py::arg("w"), py::arg("r"), py::arg("w_scale"), py::arg("r_scale"),
        py::arg("bias") = py::none(), py::arg("peephole") = py::none(), py::arg("initial_h") = py::none(),
        py::arg("initial_c") = py::none(), py::arg("sequence_lens") = py::none(), py::arg("direction") = "forward",
        py::arg("clip") = 3.4028234663852886e38, py::arg("input_forget") = false, py::arg("want_y") = true,
        py::arg("num_threads") = 1, py::arg("out") = py::none(),
        "com.microsoft DynamicQuantizeLSTM, bit-exact with reference/ms_lstm.py; see "
        "quanta/kernels/cpp/recurrent/recurrent.h. out: None (new arrays) or (Y, Y_h, Y_c) written in place, "
        "one call a native program can record.");
  m.def("dq_gru", &dq_gru_impl, py::arg("x"), py::arg("w"), py::arg("r_zr"), py::arg("r_h"), py::arg("w_scale"),
        py::arg("r_scale"), py::arg("bias") = py::none(), py::arg("initial_h") = py::none(),
        py::arg("sequence_lens") = py::none(), py::arg("direction") = "forward",
        py::arg("clip") = 3.4028234663852886e38, py::arg("linear_before_reset") = false, py::arg("num_threads") = 1,
        "quanta::DynamicQuantizeGRU, bit-exact with reference/dq_gru.py; see "
        "quanta/kernels/cpp/recurrent/recurrent.h.");
  m.def("float_rnn", &float_rnn_impl, py::arg("kind"), py::arg("x"), py::arg("w"), py::arg("r"), py::arg("r_h"),
        py::arg("bias") = py::none(), py::arg("peephole") = py::none(), py::arg("initial_h") = py::none(),
        py::arg("initial_c") = py::none(), py::arg("sequence_lens") = py::none(), py::arg("direction") = "forward",
        py::arg("clip") = 3.4028234663852886e38, py::arg("input_forget") = false,
        py::arg("linear_before_reset") = false, py::arg("num_threads") = 1,
        "Float32 ONNX LSTM / GRU by docs/float-ops.md (RNN1)-(RNN9) (kind 'ort_lstm' / 'ort_gru': ONNX Runtime's, "
        "(RNN-ORT)), bit-exact with reference/rnn.py; see "
        "quanta/kernels/cpp/recurrent/float_rnn.h.");
  m.def(
      "float_rnn_layout",
      [] {
        const Isa isa = active_isa();
        return py::make_tuple(recurrent::float_rnn_w_cols(isa), recurrent::float_rnn_r_cols(isa));
      },
      "(w columns, r columns): the column blocks float_rnn's w and its r, r_h are packed in on the active ISA "
      "(128: panels; 16: W's strips, 32: R's row strips); float_rnn takes either, and repacks for a call whose "
      "path needs the other.");
}

}  // namespace quanta
