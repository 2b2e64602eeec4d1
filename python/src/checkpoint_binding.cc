// ember._ember.CheckpointManager: checkpoints written and verified by the core
// (include/ember/checkpoint.h).  Conversion only; ember/checkpoint.py is the
// Python API.  The GIL is released around every call into the manager (a
// Save or a Restore may move gigabytes to HDFS); bytes objects are immutable,
// so a Save reads them in place without the GIL.
//
//   m = CheckpointManager.open(uri, resolve_options, CheckpointOptions())
//   m.save(step, {name: bytes}); m.steps() -> [int]; m.latest() -> int | None
//   m.restore(step | None, fall_back_to_older) -> (step, {name: bytes})
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "ember/checkpoint.h"
#include "ember/fs.h"

namespace ember::python {
namespace {

using checkpoint::CheckpointManager;
using checkpoint::CheckpointOptions;

std::unique_ptr<CheckpointManager> OpenManager(const std::string& uri, const fs::ResolveOptions& resolve,
                                        const CheckpointOptions& options) {
  fs::Resolved r = ValueOrThrow(fs::ResolveFileSystem(uri, resolve));
  return ValueOrThrow(CheckpointManager::Open(r.fs, r.path, options));
}

void Save(CheckpointManager& m, int64_t step, const nb::dict& blobs) {
  std::vector<checkpoint::BlobRef> refs;
  std::vector<nb::bytes> held;  // keeps each bytes object alive for the call
  for (auto [key, value] : blobs) {
    if (!nb::isinstance<nb::str>(key) || !nb::isinstance<nb::bytes>(value)) {
      throw nb::type_error("CheckpointManager.save: blobs must map str names to bytes");
    }
    nb::bytes b = nb::borrow<nb::bytes>(value);
    refs.push_back({nb::cast<std::string>(key), std::string_view(b.c_str(), b.size())});
    held.push_back(std::move(b));
  }
  nb::gil_scoped_release release;
  ThrowIfError(m.Save(step, refs));
}

nb::tuple Restore(const CheckpointManager& m, std::optional<int64_t> step, bool fall_back_to_older) {
  checkpoint::RestoreOptions options;
  options.step = step;
  options.fall_back_to_older = fall_back_to_older;
  Result<checkpoint::Checkpoint> c = Status::Internal("not restored");
  {
    nb::gil_scoped_release release;
    c = m.Restore(options);
  }
  checkpoint::Checkpoint ckpt = ValueOrThrow(std::move(c));
  nb::dict blobs;
  for (const auto& [name, data] : ckpt.blobs) blobs[nb::str(name.c_str())] = nb::bytes(data.data(), data.size());
  return nb::make_tuple(ckpt.step, blobs);
}

}  // namespace

void BindCheckpoint(nb::module_& m) {
  nb::class_<CheckpointOptions>(m, "CheckpointOptions", "Options of a CheckpointManager (ember/checkpoint.h).")
      .def(nb::init<>())
      .def_rw("keep", &CheckpointOptions::keep)
      .def_rw("sync", &CheckpointOptions::sync);

  using nb::call_guard;
  using Release = nb::gil_scoped_release;
  nb::class_<CheckpointManager>(m, "CheckpointManager", "A directory of checkpoints (ember/checkpoint.h).")
      .def_static("open", &OpenManager, call_guard<Release>(), nb::arg("uri"), nb::arg("resolve"), nb::arg("options"))
      .def("save", &Save, nb::arg("step"), nb::arg("blobs"))
      .def(
          "steps",
          [](const CheckpointManager& m) {
            std::vector<int64_t> out;
            for (const auto& c : ValueOrThrow(m.List())) out.push_back(c.step);
            return out;
          },
          call_guard<Release>(), "Steps of the complete checkpoints, oldest first.")
      .def(
          "latest",
          [](const CheckpointManager& m) -> std::optional<int64_t> {
            auto latest = ValueOrThrow(m.Latest());
            if (!latest) return std::nullopt;
            return latest->step;
          },
          call_guard<Release>(), "The newest complete checkpoint's step, or None.")
      .def("restore", &Restore, nb::arg("step").none(), nb::arg("fall_back_to_older"))
      .def_prop_ro("uri", &CheckpointManager::uri);
}

}  // namespace ember::python
