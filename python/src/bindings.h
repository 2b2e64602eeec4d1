// Shared helpers of the nanobind module ember._ember: the one Status ->
// Python exception mapping, and the float-seconds <-> Duration conversion.
//
// Binding functions release the GIL around blocking calls
// (nb::call_guard<nb::gil_scoped_release>), so they must not touch Python
// objects while the core works.  A non-OK Status therefore leaves the call as
// a C++ StatusError; the translator registered by RegisterStatusErrors()
// turns it into the Python exception for its code once the GIL is held again.
#pragma once

#include <nanobind/nanobind.h>

#include <chrono>
#include <cmath>
#include <exception>
#include <functional>
#include <string>
#include <utility>

#include "ember/deadline.h"
#include "ember/coordinator.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::python {

namespace nb = nanobind;

// Carries a non-OK Status from a binding function to the exception translator.
class StatusError : public std::exception {
 public:
  explicit StatusError(Status status)
      : status_(std::move(status)), what_(status_.ToString()) {}
  const Status& status() const { return status_; }
  const char* what() const noexcept override { return what_.c_str(); }

 private:
  Status status_;
  std::string what_;
};

// Throws StatusError unless `status` is OK.  Safe without the GIL.
inline void ThrowIfError(const Status& status) {
  if (!status.ok()) throw StatusError(status);
}

// The value of `result`, or throws StatusError.  Safe without the GIL.
template <typename T>
T ValueOrThrow(Result<T> result) {
  if (!result.ok()) throw StatusError(result.status());
  return result.MoveValueUnsafe();
}

// Float seconds (Python's convention) to the core's Duration, rounded up to
// the next millisecond so a small positive wait never becomes "don't wait".
// Negative and NaN become zero.
inline Duration SecondsToDuration(double seconds) {
  if (!(seconds > 0)) return Duration(0);
  return Duration(static_cast<Duration::rep>(std::ceil(seconds * 1000.0)));
}

inline double DurationToSeconds(Duration d) { return static_cast<double>(d.count()) / 1000.0; }

// A Python bytes object's contents (secrets, KV values).
inline std::string BytesToString(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }

// Runs a blocking core wait for up to `timeout` seconds with the GIL released.
// `wait(slice)` must return at once on whatever it waits for and
// DeadlineExceeded when `slice` passes.  The core wakes a wait the moment its
// event happens (a registration, a node failure, an abort); the slices of at
// most 250 ms exist only so that the main thread runs Python's signal
// handlers (Ctrl-C) during a long wait, which Python cannot do while C++
// holds the thread.  Call with the GIL held; throws nb::python_error if a
// handler raised.
inline Status WaitInterruptibly(double timeout, const std::function<Status(Duration)>& wait) {
  const Deadline deadline = Deadline::After(SecondsToDuration(timeout));
  constexpr Duration kSlice{250};
  while (true) {
    Status status;
    {
      nb::gil_scoped_release release;
      status = wait(std::min(deadline.remaining(), kSlice));
    }
    if (status.code() != StatusCode::kDeadlineExceeded || deadline.expired()) return status;
    if (PyErr_CheckSignals() != 0) throw nb::python_error();
  }
}

// Defines EmberError and one subclass per StatusCode in `m`, and registers
// the StatusError translator.  Defined in module.cc.
void RegisterStatusErrors(nb::module_& m);

// Defined in roles_binding.cc: ClusterLayout, AssignRole and the training-rank
// rules of ember/roles.h.
void BindRoles(nb::module_& m);
// Binds CoordinatorServer, CoordinatorClient, CoordinatorRelay, RelayAgent and the value types they use.
// Defined in coordinator_binding.cc; after BindRoles (it uses ClusterLayout).
void BindCoordinator(nb::module_& m);
// Defined in feed_binding.cc: shm::Ring, FeedServer, FeedClient.
void BindFeed(nb::module_& m);
// Defined in node_binding.cc: NodeContext and the node start-up message.
void BindNode(nb::module_& m);
// Defined in collective_binding.cc: Communicator, its options and stores.
void BindCollective(nb::module_& m);
// fs_binding.cc: ResolveOptions and the fs_* functions over URIs.
void BindFileSystem(nb::module_& m);
// data_binding.cc: ExampleDataset, ExampleWriter, fs_glob, infer_example_schema.
void BindDataset(nb::module_& m);
// summary_binding.cc: EventWriter (TensorBoard event files) and its options.
void BindSummary(nb::module_& m);
void BindCheckpoint(nb::module_& m);
// Binds include/ember/gpu.h: a node's CUDA_VISIBLE_DEVICES, the shared-GPU check, NVML UUIDs.
void BindGpu(nb::module_& m);
void BindPs(nb::module_& m);

}  // namespace ember::python
