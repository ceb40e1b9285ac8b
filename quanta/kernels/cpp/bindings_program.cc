// Native programs: a run of a bound signature's steps as one C++ call (quanta.runtime's
// executor, docs/runtime.md "Native programs").
//
//   p = Program()
//   p.record(call, *arrays)   # runs call(*arrays) with recording on: True when it made
//                             # exactly one kernel call through run_or_record, kept
//   p.run()                   # every kept call in order, with the GIL released once
//
// A step's Python cost (the executor's loop, the specialized call, pybind11's argument
// conversion and checks, the GIL released and taken back) is about 0.4 us; a kept call
// costs an indirect call. What a kept call reads and writes must stay at the addresses
// it saw when recorded: the executor records only steps whose inputs and outputs are
// constants, signature-static values or the arena's planned views, and keeps the
// recorded callables (and so every array they hold) alive with the program.
#include <pybind11/pybind11.h>

#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"

namespace quanta {
namespace {

class Program {
 public:
  // Records call(*args); false (nothing kept) when it raised, made no kernel call or more
  // than one through run_or_record, or had a binding make its own output array.
  bool record(const py::object& call, const py::args& args) {
    CallRecorder*& slot = call_recorder();
    if (slot != nullptr) return false;  // a program records one step at a time
    CallRecorder recorder;
    slot = &recorder;
    try {
      call(*args);
    } catch (py::error_already_set&) {
      slot = nullptr;
      return false;
    } catch (...) {
      slot = nullptr;
      throw;
    }
    slot = nullptr;
    if (recorder.new_output || recorder.calls.size() != 1) return false;
    calls_.push_back(std::move(recorder.calls.front()));
    keep_.append(call);
    return true;
  }

  void run() const {
    size_t i = 0;
    try {
      py::gil_scoped_release release;
      for (; i < calls_.size(); ++i) calls_[i]();
    } catch (const std::exception& e) {
      throw std::runtime_error("native program: step " + std::to_string(i) + ": " + e.what());
    }
  }

  size_t size() const { return calls_.size(); }

 private:
  std::vector<std::function<void()>> calls_;
  py::list keep_;  // the recorded callables: they hold the arrays the calls point into
};

}  // namespace

void register_program(py::module_& m) {
  py::class_<Program>(m, "Program", "Kernel calls recorded from specialized steps, run as one call.")
      .def(py::init<>())
      .def("record", &Program::record, py::arg("call"),
           "call(*args) with recording on: True when it made exactly one kernel call, now kept.")
      .def("run", &Program::run, "Every kept call in order, the GIL released once.")
      .def("__len__", &Program::size);
}

}  // namespace quanta
