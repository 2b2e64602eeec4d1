// ember._ember.EventWriter: TensorBoard event files written by the core
// (include/ember/summary.h).  Conversion only; ember/summary.py is the
// Python API.  The GIL is released around every call into the writer (a
// write may reach HDFS).
//
//   w = EventWriter.open(uri, resolve_options, EventWriterOptions())
//   w.add_scalar(tag, value, step); w.add_histogram(tag, float64 array, step)
//   w.add_text(tag, text, step); w.add_image(tag, png, h, w, c, step)
//   w.flush(); w.close()
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <memory>
#include <span>
#include <string>

#include "bindings.h"
#include "ember/fs.h"
#include "ember/summary.h"

namespace ember::python {
namespace {

using summary::EventWriter;
using summary::EventWriterOptions;
using Values = nb::ndarray<const double, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

std::unique_ptr<EventWriter> Open(const std::string& uri, const fs::ResolveOptions& resolve,
                                  const EventWriterOptions& options) {
  fs::Resolved r = ValueOrThrow(fs::ResolveFileSystem(uri, resolve));
  return ValueOrThrow(EventWriter::Open(r.fs, r.path, options));
}

}  // namespace

void BindSummary(nb::module_& m) {
  nb::class_<EventWriterOptions>(m, "EventWriterOptions", "Options of an EventWriter (ember/summary.h).")
      .def(nb::init<>())
      .def_rw("file_suffix", &EventWriterOptions::file_suffix)
      .def_prop_rw(
          "flush_period", [](const EventWriterOptions& o) { return DurationToSeconds(o.flush_period); },
          [](EventWriterOptions& o, double s) { o.flush_period = SecondsToDuration(s); });

  using nb::call_guard;
  using Release = nb::gil_scoped_release;
  nb::class_<EventWriter>(m, "EventWriter", "One TensorBoard event file (ember/summary.h).")
      .def_static("open", &Open, call_guard<Release>(), nb::arg("uri"), nb::arg("resolve"),
                  nb::arg("options"))
      .def("add_scalar",
           [](EventWriter& w, const std::string& tag, double value, int64_t step) {
             ThrowIfError(w.AddScalar(tag, value, step));
           },
           call_guard<Release>(), nb::arg("tag"), nb::arg("value"), nb::arg("step"))
      .def("add_histogram",
           [](EventWriter& w, const std::string& tag, Values values, int64_t step) {
             // `values` keeps the array alive for the call; its memory is read without the GIL.
             ThrowIfError(w.AddHistogram(tag, std::span<const double>(values.data(), values.shape(0)), step));
           },
           call_guard<Release>(), nb::arg("tag"), nb::arg("values"), nb::arg("step"))
      .def("add_text",
           [](EventWriter& w, const std::string& tag, const std::string& text, int64_t step) {
             ThrowIfError(w.AddText(tag, text, step));
           },
           call_guard<Release>(), nb::arg("tag"), nb::arg("text"), nb::arg("step"))
      .def("add_image",
           [](EventWriter& w, const std::string& tag, nb::bytes encoded, int height, int width,
              int channels, int64_t step) {
             std::string bytes(encoded.c_str(), encoded.size());
             nb::gil_scoped_release release;
             ThrowIfError(w.AddImage(tag, bytes, height, width, channels, step));
           },
           nb::arg("tag"), nb::arg("encoded"), nb::arg("height"), nb::arg("width"), nb::arg("channels"),
           nb::arg("step"))
      .def("flush", [](EventWriter& w) { ThrowIfError(w.Flush()); }, call_guard<Release>())
      .def("close", [](EventWriter& w) { ThrowIfError(w.Close()); }, call_guard<Release>())
      .def_prop_ro("uri", &EventWriter::uri)
      .def_prop_ro("path", &EventWriter::path)
      .def_prop_ro("events_written", &EventWriter::events_written);

  m.def("summary_node_log_dir", &summary::NodeLogDir, nb::arg("log_dir"), nb::arg("job_name"),
        nb::arg("task_index"), "Where a node's events go: <log_dir>/<job_name>_<task_index>.");
}

}  // namespace ember::python
