// Bindings of include/ember/node.h's start-up message: NodeContext and its
// encoding (ember/node.h, node::EncodeStartup), and the options of a node's communicator.  Type conversion only: bytes fields (secret,
// payload) cross as bytes, connect_timeout as float seconds, input_mode as
// the int of ember.InputMode.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "ember/node.h"

namespace ember::python {
namespace {

using namespace nb::literals;

nb::bytes ToBytes(const std::string& s) { return nb::bytes(s.data(), s.size()); }
std::string FromBytes(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }

}  // namespace

void BindNode(nb::module_& m) {
  nb::class_<NodeContext>(m, "NodeContext",
                          "What the launcher tells a node: the typed start-up message "
                          "(docs/wire.md, \"Node start-up\").")
      .def(nb::init<>())
      .def_rw("job_id", &NodeContext::job_id)
      .def_rw("executor_id", &NodeContext::executor_id)
      .def_rw("job_name", &NodeContext::job_name)
      .def_rw("task_index", &NodeContext::task_index)
      .def_rw("cluster_spec", &NodeContext::cluster_spec)
      .def_rw("bind_host", &NodeContext::bind_host)
      .def_rw("coordinator_host", &NodeContext::coordinator_host)
      .def_rw("coordinator_port", &NodeContext::coordinator_port)
      .def_prop_rw(
          "secret", [](const NodeContext& c) { return ToBytes(c.secret); },
          [](NodeContext& c, nb::bytes b) { c.secret = FromBytes(b); })
      .def_prop_rw(
          "connect_timeout", [](const NodeContext& c) { return DurationToSeconds(c.connect_timeout); },
          [](NodeContext& c, double s) { c.connect_timeout = SecondsToDuration(s); })
      .def_prop_rw(
          "input_mode", [](const NodeContext& c) { return static_cast<int>(c.input_mode); },
          [](NodeContext& c, int mode) { c.input_mode = static_cast<InputMode>(mode); })
      .def_rw("feed_ring", &NodeContext::feed_ring)
      .def_rw("default_fs", &NodeContext::default_fs)
      .def_rw("hdfs_http_address", &NodeContext::hdfs_http_address)
      .def_rw("working_dir", &NodeContext::working_dir)
      .def_rw("log_dir", &NodeContext::log_dir)
      .def_rw("traceback_path", &NodeContext::traceback_path)
      .def_rw("gpus", &NodeContext::gpus)
      .def_prop_rw(
          "payload", [](const NodeContext& c) { return ToBytes(c.payload); },
          [](NodeContext& c, nb::bytes b) { c.payload = FromBytes(b); })
      .def_prop_ro("num_workers", &NodeContext::num_workers)
      .def_prop_ro("training_rank", &NodeContext::training_rank)
      .def("__eq__", [](const NodeContext& a, const NodeContext& b) { return a == b; })
      .def("__repr__", [](const NodeContext& c) {
        return "NodeContext(job_id='" + c.job_id + "', executor_id=" + std::to_string(c.executor_id) +
               ", job_name='" + c.job_name + "', task_index=" + std::to_string(c.task_index) + ")";
      });

  m.def(
      "encode_node_startup",
      [](const NodeContext& c) { return ToBytes(ValueOrThrow(node::EncodeStartup(c))); }, "context"_a,
      "The start-up message for `context`; InvalidArgument if a field cannot be encoded.");
  m.def(
      "decode_node_startup",
      [](nb::bytes data) { return ValueOrThrow(node::DecodeStartup(std::string_view(data.c_str(), data.size()))); },
      "data"_a, "Parses a start-up message; Corruption or InvalidArgument (another version).");
  m.def(
      "read_node_startup", [](int fd) { return ValueOrThrow(ReadNodeContext(fd)); }, "fd"_a,
      nb::call_guard<nb::gil_scoped_release>(),
      "Reads a start-up message from descriptor `fd` until end of file (does not close it).");
  m.def(
      "node_communicator_options",
      [](const NodeContext& c, const collective::CommunicatorOptions& options) {
        return ValueOrThrow(NodeCommunicatorOptions(c, options));
      },
      "context"_a, "options"_a,
      "`options` with rank, size, host, name, bind_host, secret and prefix filled from the node's "
      "context (Node::OpenCommunicator's rule); InvalidArgument for a node that does not train.");
  m.attr("STARTUP_FD_ENV") = kStartupFdEnv;
}

}  // namespace ember::python
