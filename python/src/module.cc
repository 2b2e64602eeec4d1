// ember._ember: the native half of the `ember` package.
//
// The Python-facing exception hierarchy lives here, because this is where a
// Status becomes an exception.  Every type is re-exported (and documented)
// by python/ember/errors.py; its __module__ is "ember.errors" so tracebacks
// and pickles name the public module.
#include <Python.h>
#include <nanobind/nanobind.h>

#include <array>
#include <string>

#include "bindings.h"

namespace ember::python {
namespace {

constexpr int kNumCodes = static_cast<int>(StatusCode::kInternal) + 1;

// Exception type per StatusCode; index 0 (kOk) holds the EmberError base.
// Created once at import and kept for the life of the process.
std::array<PyObject*, kNumCodes> g_exception_types{};

PyObject* NewExceptionType(nb::module_& m, const char* name, const char* doc, PyObject* bases) {
  std::string qualified = std::string("ember.errors.") + name;
  PyObject* type = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases, nullptr);
  if (type == nullptr) throw nb::python_error();
  m.attr(name) = nb::handle(type);
  return type;
}

// A subclass of EmberError, plus `builtin` (a builtin exception) when given.
PyObject* NewCodeType(nb::module_& m, const char* name, const char* doc, PyObject* builtin = nullptr) {
  PyObject* base = g_exception_types[0];
  nb::object bases = nb::steal(builtin ? PyTuple_Pack(2, base, builtin) : PyTuple_Pack(1, base));
  if (!bases.is_valid()) throw nb::python_error();
  return NewExceptionType(m, name, doc, bases.ptr());
}

}  // namespace

void RegisterStatusErrors(nb::module_& m) {
  g_exception_types[0] = NewExceptionType(
      m, "EmberError", "Base class of every error raised by Ember.", PyExc_RuntimeError);

  auto set = [&](StatusCode code, const char* name, const char* doc, PyObject* builtin = nullptr) {
    g_exception_types[static_cast<int>(code)] = NewCodeType(m, name, doc, builtin);
  };
  set(StatusCode::kInvalidArgument, "InvalidArgument", "The caller passed something wrong.",
      PyExc_ValueError);
  set(StatusCode::kNotFound, "NotFound", "Something asked for does not exist.");
  set(StatusCode::kAlreadyExists, "AlreadyExists", "Something to be created exists already.");
  set(StatusCode::kDeadlineExceeded, "DeadlineExceeded", "A wait ran out of time.",
      PyExc_TimeoutError);
  set(StatusCode::kUnavailable, "Unavailable", "A peer cannot be reached.", PyExc_ConnectionError);
  set(StatusCode::kUnauthenticated, "Unauthenticated", "A peer did not prove the job's secret.");
  set(StatusCode::kAborted, "Aborted", "The job was aborted (a node failed, or the driver stopped it).");
  set(StatusCode::kIOError, "EmberIOError", "The operating system refused an operation.",
      PyExc_OSError);
  set(StatusCode::kCorruption, "Corruption", "Malformed bytes from a file or the network.");
  set(StatusCode::kOutOfRange, "OutOfRange", "End of data.");
  set(StatusCode::kCancelled, "Cancelled", "The operation was cancelled.");
  set(StatusCode::kInternal, "Internal", "A bug in Ember.");

  // The one place a Status becomes a Python exception.
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const StatusError& e) {
      int code = static_cast<int>(e.status().code());
      PyObject* type = (code > 0 && code < kNumCodes && g_exception_types[code])
                           ? g_exception_types[code]
                           : g_exception_types[0];
      PyErr_SetString(type, e.status().message().c_str());
    }
  });
}

}  // namespace ember::python

NB_MODULE(_ember, m) {
  m.doc() = "Ember's native core: coordinator server and client (thin bindings, no logic).";
  ember::python::RegisterStatusErrors(m);
  ember::python::BindRoles(m);  // before BindCoordinator: its options hold a ClusterLayout
  ember::python::BindCoordinator(m);
  ember::python::BindFeed(m);
  ember::python::BindNode(m);
  ember::python::BindCollective(m);
  ember::python::BindFileSystem(m);  // before BindDataset: its functions take ResolveOptions
  ember::python::BindDataset(m);
  ember::python::BindSummary(m);  // after BindFileSystem: EventWriter.open takes ResolveOptions
  ember::python::BindCheckpoint(m);  // after BindFileSystem: CheckpointManager.open takes ResolveOptions
  ember::python::BindGpu(m);
  ember::python::BindPs(m);
}
