// The autotuner's hooks into the int8 GEMM (qgemm.h Blocking, the tuned table, the shape
// recorder, tune.h time_blockings) and the kernel dispatch table (dispatch.h).
#include <pybind11/stl.h>

#include "bindings.h"
#include "dispatch.h"
#include "qgemm/kernel.h"
#include "qgemm/qgemm.h"
#include "qgemm/tune.h"

namespace quanta {
namespace {

using qgemm::Blocking;

const char* const kBlockingFields[] = {"mc", "nc", "kc", "prefetch", "prefetch_a"};

Blocking blocking_from(const py::handle& obj, const char* op) {
  Blocking b;
  if (obj.is_none()) return b;
  if (!py::isinstance<py::dict>(obj)) throw py::value_error(std::string(op) + ": blocking: expected a dict or None");
  const py::dict d = py::reinterpret_borrow<py::dict>(obj);
  for (const auto& item : d) {
    const std::string key = py::str(item.first);
    bool known = false;
    for (const char* f : kBlockingFields) known = known || key == f;
    if (!known) {
      throw py::value_error(std::string(op) + ": blocking: unknown field '" + key +
                            "', expected some of mc, nc, kc, prefetch, prefetch_a");
    }
    const int64_t v = item.second.cast<int64_t>();
    const bool ok = key == "prefetch"     ? (v >= -1 && v <= 65536)
                    : key == "prefetch_a" ? (v >= -1 && v <= 1)
                                          : (v >= 0 && v <= (int64_t{1} << 30));
    if (!ok) {
      throw py::value_error(std::string(op) + ": blocking: " + key + ": out of range, got " + std::to_string(v));
    }
    if (key == "mc") b.mc = v;
    if (key == "nc") b.nc = v;
    if (key == "kc") b.kc = v;
    if (key == "prefetch") b.prefetch = static_cast<int>(v);
    if (key == "prefetch_a") b.prefetch_a = static_cast<int>(v);
  }
  return b;
}

qgemm::ShapeKey key_from(const std::string& isa, int64_t M, int64_t N, int64_t K, int threads, const char* op) {
  if (M < 0 || N < 0 || K < 0) throw py::value_error(std::string(op) + ": M, N, K: expected >= 0");
  check_threads(threads, op);
  return qgemm::ShapeKey{parse_isa_name(isa), M, N, K, threads};
}

}  // namespace

void register_tuner(py::module_& m) {
  m.def(
      "qgemm_set_tuned",
      [](const std::string& isa, int64_t M, int64_t N, int64_t K, int threads, const py::object& blocking) {
        qgemm::set_tuned_blocking(key_from(isa, M, N, K, threads, "qgemm_set_tuned"),
                                  blocking_from(blocking, "qgemm_set_tuned"));
      },
      py::arg("isa"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("threads"), py::arg("blocking"),
      "Install a blocking {mc, nc, kc, prefetch} for one GEMM shape (None or {}: remove it).");
  m.def("qgemm_clear_tuned", &qgemm::clear_tuned_blockings, "Forget every tuned blocking.");
  m.def("qgemm_record_shapes", &qgemm::record_shapes, py::arg("on"),
        "Start (clearing what was seen) or stop recording the shapes of qgemm calls.");
  m.def(
      "qgemm_recorded_shapes",
      [] {
        py::list out;
        for (const auto& [k, count] : qgemm::recorded_shapes()) {
          out.append(py::make_tuple(std::string(isa_name(k.isa)), k.M, k.N, k.K, k.threads, count));
        }
        return out;
      },
      "[(isa, M, N, K, threads, calls)] of the qgemm calls since qgemm_record_shapes(True).");
  m.def(
      "qgemm_blocking",
      [](const std::string& isa, int64_t M, int64_t N, int64_t K, int threads, const py::object& blocking) {
        const qgemm::ShapeKey key = key_from(isa, M, N, K, threads, "qgemm_blocking");
        // The plan reads the packed layout's dimensions only: weights without data.
        const qgemm::KernelFamily& f = qgemm::kernel_family(key.isa);
        qgemm::PackedWeights packed;
        packed.isa = key.isa;
        packed.nr = f.nr;
        packed.kr = f.kr;
        packed.storage_bytes = f.w_bytes;
        packed.K = K;
        packed.N = N;
        packed.Kp = (K + f.kr - 1) / f.kr * f.kr;
        packed.n_panels = (N + f.nr - 1) / f.nr;
        qgemm::QGemmParams p;
        p.M = M;
        p.x_row_stride = K;
        p.w = &packed;
        p.y_row_stride = N;
        p.num_threads = threads;
        p.blocking = blocking_from(blocking, "qgemm_blocking");
        const qgemm::ResolvedBlocking r = qgemm::qgemm_resolved_blocking(p);
        py::dict d;
        d["mc"] = r.mc;
        d["nc"] = r.nc;
        d["kc"] = r.kc;
        d["prefetch"] = r.prefetch;
        d["prefetch_a"] = r.prefetch_a;
        d["k_chunks"] = r.n_chunks;
        d["tuned"] = r.tuned;
        return d;
      },
      py::arg("isa"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("threads") = 1,
      py::arg("blocking") = py::none(),
      "The blocking a qgemm call of this shape runs with: `blocking` if given, else the tuned "
      "table's entry, else the heuristics (tuned says which).");
  m.def(
      "qgemm_time_blockings",
      [](const std::string& isa, int64_t M, int64_t N, int64_t K, int threads, const py::list& candidates,
         double seconds) {
        const qgemm::ShapeKey key = key_from(isa, M, N, K, threads, "qgemm_time_blockings");
        if (M < 1 || N < 1 || K < 1) throw py::value_error("qgemm_time_blockings: M, N, K: expected >= 1");
        if (!(seconds >= 0.0 && seconds <= 60.0)) {
          throw py::value_error("qgemm_time_blockings: seconds: expected a value in [0, 60]");
        }
        std::vector<Blocking> c;
        for (const auto& b : candidates) c.push_back(blocking_from(b, "qgemm_time_blockings"));
        py::gil_scoped_release release;
        return qgemm::time_blockings(key.isa, M, N, K, threads, c, seconds);
      },
      py::arg("isa"), py::arg("M"), py::arg("N"), py::arg("K"), py::arg("threads"), py::arg("candidates"),
      py::arg("seconds"),
      "Seconds per call of each candidate blocking (dicts as qgemm_set_tuned takes), timed round-robin "
      "on synthetic uint8 x int8 operands, best batch of each.");
  m.def(
      "kernel_table",
      [] {
        py::list out;
        for (const KernelRow& r : kernel_table()) {
          py::dict d;
          d["op"] = r.op;
          d["dtype"] = r.dtype;
          d["isa"] = isa_name(r.isa);
          d["kernel"] = r.kernel;
          d["supported"] = isa_supported(r.isa);
          py::list tun;
          for (const char* t : r.tunables) {
            if (t) tun.append(t);
          }
          d["tunables"] = tun;
          out.append(d);
        }
        return out;
      },
      "The kernel dispatch table (dispatch.h): one dict per (op, dtype, isa) row with its kernel name "
      "and run-time tunables.");
}

}  // namespace quanta
