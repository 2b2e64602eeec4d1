// Bindings of include/ember/coordinator.h.  Type conversion only: durations
// cross as float seconds, secrets and kv values as bytes, failures as the
// exceptions of module.cc.  Every call that can block releases the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>
#include <vector>

#include "bindings.h"
#include "ember/coordinator.h"

namespace ember::python {
namespace {

using namespace nb::literals;
using Release = nb::call_guard<nb::gil_scoped_release>;

const char* NodeStateName(NodeInfo::State s) {
  switch (s) {
    case NodeInfo::State::kRegistered: return "REGISTERED";
    case NodeInfo::State::kRunning: return "RUNNING";
    case NodeInfo::State::kDone: return "DONE";
    case NodeInfo::State::kFailed: return "FAILED";
    case NodeInfo::State::kLost: return "LOST";
  }
  return "?";
}

void BindValueTypes(nb::module_& m) {
  nb::class_<NodeAddress>(m, "NodeAddress")
      .def(
          "__init__",
          [](NodeAddress* self, int executor_id, std::string host, int port, int64_t pid) {
            new (self) NodeAddress{executor_id, std::move(host), port, pid};
          },
          "executor_id"_a = 0, "host"_a = "", "port"_a = 0, "pid"_a = 0)
      .def_rw("executor_id", &NodeAddress::executor_id)
      .def_rw("host", &NodeAddress::host)
      .def_rw("port", &NodeAddress::port)
      .def_rw("pid", &NodeAddress::pid);

  nb::class_<NodeInfo> node_info(m, "NodeInfo", "A registered node as the coordinator sees it.");
  nb::enum_<NodeInfo::State>(node_info, "State")
      .value("REGISTERED", NodeInfo::State::kRegistered)
      .value("RUNNING", NodeInfo::State::kRunning)
      .value("DONE", NodeInfo::State::kDone)
      .value("FAILED", NodeInfo::State::kFailed)
      .value("LOST", NodeInfo::State::kLost);
  node_info.def_ro("address", &NodeInfo::address)
      .def_ro("role", &NodeInfo::role)
      .def_ro("state", &NodeInfo::state)
      .def_ro("error", &NodeInfo::error)
      .def("__repr__", [](const NodeInfo& n) {
        return "NodeInfo(" + n.role.job_name + ":" + std::to_string(n.role.task_index) +
               ", executor " + std::to_string(n.address.executor_id) + ", " + n.address.host +
               ":" + std::to_string(n.address.port) + ", " + NodeStateName(n.state) + ")";
      });

  nb::class_<Registration>(m, "Registration", "What register() returns once every node is in.")
      .def_ro("role", &Registration::role)
      .def_ro("cluster_spec_json", &Registration::cluster_spec_json)
      .def_ro("num_nodes", &Registration::num_nodes)
      .def_ro("nodes", &Registration::nodes);

  nb::class_<Event> event(m, "Event", "Something the driver should know about.");
  nb::enum_<Event::Kind>(event, "Kind")
      .value("LOG", Event::Kind::kLog)
      .value("PROGRESS", Event::Kind::kProgress)
      .value("REGISTERED", Event::Kind::kRegistered)
      .value("NODE_DONE", Event::Kind::kNodeDone)
      .value("NODE_FAILED", Event::Kind::kNodeFailed)
      .value("NODE_DEPARTED", Event::Kind::kNodeDeparted)
      .value("ABORT", Event::Kind::kAbort);
  event.def_ro("kind", &Event::kind)
      .def_ro("executor_id", &Event::executor_id)
      .def_ro("job_name", &Event::job_name)
      .def_ro("task_index", &Event::task_index)
      .def_ro("stream", &Event::stream)
      .def_ro("text", &Event::text)
      .def_ro("metrics", &Event::metrics);

  nb::class_<CoordinatorClient::Push> push(m, "Push", "A message the server pushed to a node.");
  nb::enum_<CoordinatorClient::Push::Kind>(push, "Kind")
      .value("ABORT", CoordinatorClient::Push::Kind::kAbort)
      .value("STOP", CoordinatorClient::Push::Kind::kStop);
  push.def_ro("kind", &CoordinatorClient::Push::kind)
      .def_ro("reason", &CoordinatorClient::Push::reason);
}

void BindServer(nb::module_& m) {
  nb::class_<CoordinatorServer>(m, "CoordinatorServer",
                                "The driver's rendezvous server.  Thread-safe.")
      .def_static(
          "start",
          [](nb::bytes secret, const ClusterLayout& layout, std::optional<std::string> bind_host, int port,
             std::optional<double> handshake_timeout, std::optional<double> heartbeat_timeout,
             std::optional<size_t> max_message_bytes, int tolerated_worker_losses) {
            CoordinatorOptions options;  // its defaults stand where Python passes None
            if (bind_host) options.bind_host = std::move(*bind_host);
            options.port = port;
            options.secret = BytesToString(secret);
            options.layout = layout;
            if (handshake_timeout) options.handshake_timeout = SecondsToDuration(*handshake_timeout);
            if (heartbeat_timeout) options.heartbeat_timeout = SecondsToDuration(*heartbeat_timeout);
            if (max_message_bytes) options.max_message_bytes = *max_message_bytes;
            options.tolerated_worker_losses = tolerated_worker_losses;
            nb::gil_scoped_release release;
            return ValueOrThrow(CoordinatorServer::Start(options));
          },
          "secret"_a, "layout"_a, "bind_host"_a = nb::none(), "port"_a = 0,
          "handshake_timeout"_a = nb::none(), "heartbeat_timeout"_a = nb::none(),
          "max_message_bytes"_a = nb::none(), "tolerated_worker_losses"_a = 0,
          "Starts the coordinator (port 0: any free port); None keeps ember/coordinator.h's default.")
      .def_prop_ro("port", &CoordinatorServer::port)
      .def(
          "wait_for_registration",
          [](CoordinatorServer& s, double timeout) {
            ThrowIfError(WaitInterruptibly(timeout, [&](Duration d) { return s.WaitForRegistration(d); }));
          },
          "timeout"_a,
          "Blocks until every node registered; wakes at once on a node failure or an abort.")
      .def("nodes", &CoordinatorServer::Nodes, Release())
      .def("cluster_spec_json", &CoordinatorServer::ClusterSpecJson, Release())
      .def(
          "kv_get",
          [](CoordinatorServer& s, std::string key) -> std::optional<nb::bytes> {
            std::optional<std::string> value;
            {
              nb::gil_scoped_release release;
              value = s.KvGet(key);
            }
            if (!value) return std::nullopt;
            return nb::bytes(value->data(), value->size());
          },
          "key"_a, "The value nodes stored under `key`, or None; never waits.")
      .def(
          "poll_events",
          [](CoordinatorServer& s, double timeout) {
            return s.PollEvents(SecondsToDuration(timeout));
          },
          "timeout"_a, Release())
      .def(
          "wait_for_nodes",
          [](CoordinatorServer& s, std::vector<std::string> job_names, double timeout) {
            ThrowIfError(WaitInterruptibly(timeout, [&](Duration d) { return s.WaitForNodes(job_names, d); }));
          },
          "job_names"_a, "timeout"_a,
          "Blocks until every node of these roles is done; wakes at once on a failure or an abort.")
      .def(
          "wait_for_key",
          [](CoordinatorServer& s, std::string key, double timeout) {
            std::string value;
            ThrowIfError(WaitInterruptibly(timeout, [&](Duration d) {
              Result<std::string> r = s.WaitForKey(key, d);
              if (r.ok()) value = r.MoveValueUnsafe();
              return r.status();
            }));
            return nb::bytes(value.data(), value.size());
          },
          "key"_a, "timeout"_a,
          "The value a node stored under `key`, waiting for it; wakes at once on a failure or an abort.")
      .def(
          "wait_for_node_end",
          [](CoordinatorServer& s, int executor_id, double timeout) {
            NodeInfo info;
            ThrowIfError(WaitInterruptibly(timeout, [&](Duration d) {
              Result<NodeInfo> r = s.WaitForNodeEnd(executor_id, d);
              if (r.ok()) info = r.MoveValueUnsafe();
              return r.status();
            }));
            return info;
          },
          "executor_id"_a, "timeout"_a,
          "The final NodeInfo of a node once it ended (done, failed or lost).")
      .def("stop_nodes", &CoordinatorServer::StopNodes, "job_names"_a, Release())
      .def("abort", &CoordinatorServer::Abort, "reason"_a, Release())
      .def("close", &CoordinatorServer::Close, Release());
}

void BindClient(nb::module_& m) {
  nb::class_<CoordinatorClient>(m, "CoordinatorClient",
                                "A connection to the coordinator.  Thread-safe.")
      .def_static(
          "connect",
          [](std::string host, int port, nb::bytes secret, std::optional<double> connect_timeout,
             std::optional<double> heartbeat_interval, std::optional<size_t> max_message_bytes) {
            ClientOptions options;  // its defaults stand where Python passes None
            if (connect_timeout) options.connect_timeout = SecondsToDuration(*connect_timeout);
            if (heartbeat_interval) options.heartbeat_interval = SecondsToDuration(*heartbeat_interval);
            if (max_message_bytes) options.max_message_bytes = *max_message_bytes;
            std::string key = BytesToString(secret);
            nb::gil_scoped_release release;
            return ValueOrThrow(CoordinatorClient::Connect(host, port, key, options));
          },
          "host"_a, "port"_a, "secret"_a, "connect_timeout"_a = nb::none(),
          "heartbeat_interval"_a = nb::none(), "max_message_bytes"_a = nb::none(),
          "Connects and authenticates; None keeps ember/coordinator.h's default.")
      .def(
          "register",
          [](CoordinatorClient& c, int executor_id, std::string host, int port, int64_t pid,
             double timeout) {
            NodeAddress self{executor_id, std::move(host), port, pid};
            return ValueOrThrow(c.Register(self, SecondsToDuration(timeout)));
          },
          "executor_id"_a, "host"_a, "port"_a, "pid"_a, "timeout"_a, Release())
      .def(
          "attach",
          [](CoordinatorClient& c, int executor_id) { ThrowIfError(c.Attach(executor_id)); },
          "executor_id"_a, Release())
      .def(
          "barrier",
          [](CoordinatorClient& c, std::string name, double timeout) {
            ThrowIfError(c.Barrier(name, SecondsToDuration(timeout)));
          },
          "name"_a, "timeout"_a, Release())
      .def(
          "kv_set",
          [](CoordinatorClient& c, std::string key, nb::bytes value) {
            std::string v = BytesToString(value);
            nb::gil_scoped_release release;
            ThrowIfError(c.KvSet(key, v));
          },
          "key"_a, "value"_a)
      .def(
          "kv_get",
          [](CoordinatorClient& c, std::string key, double timeout) {
            std::string value;
            {
              nb::gil_scoped_release release;
              value = ValueOrThrow(c.KvGet(key, SecondsToDuration(timeout)));
            }
            return nb::bytes(value.data(), value.size());
          },
          "key"_a, "timeout"_a)
      .def(
          "log",
          [](CoordinatorClient& c, std::string stream, std::string line) {
            ThrowIfError(c.Log(stream, line));
          },
          "stream"_a, "line"_a, Release())
      .def(
          "report",
          [](CoordinatorClient& c, std::map<std::string, double> metrics) {
            ThrowIfError(c.Report(metrics));
          },
          "metrics"_a, Release())
      .def("done", [](CoordinatorClient& c) { ThrowIfError(c.Done()); }, Release())
      .def(
          "fail", [](CoordinatorClient& c, std::string error) { ThrowIfError(c.Fail(error)); },
          "error"_a, Release())
      .def(
          "next_push",
          [](CoordinatorClient& c, double timeout) {
            return c.NextPush(SecondsToDuration(timeout));
          },
          "timeout"_a, Release())
      .def("close", &CoordinatorClient::Close, Release());
}

// Seconds (None: without end) to a Deadline.
Deadline DeadlineAfter(std::optional<double> seconds) {
  return seconds ? Deadline::After(SecondsToDuration(*seconds)) : Deadline::Infinite();
}

void BindRelay(nb::module_& m) {
  nb::class_<CoordinatorRelay>(m, "CoordinatorRelay",
                               "The coordinator's endpoint inside the job: nodes dial its node port, the client's "
                               "RelayAgent its agent port.  Thread-safe.")
      .def_static(
          "start",
          [](nb::bytes secret, std::optional<std::string> bind_host, int node_port, int agent_port,
             std::optional<double> agent_timeout, std::optional<double> open_timeout,
             std::optional<double> handshake_timeout, std::optional<size_t> max_parked) {
            RelayOptions options;  // its defaults stand where Python passes None
            options.secret = BytesToString(secret);
            if (bind_host) options.bind_host = std::move(*bind_host);
            options.node_port = node_port;
            options.agent_port = agent_port;
            if (agent_timeout) options.agent_timeout = SecondsToDuration(*agent_timeout);
            if (open_timeout) options.open_timeout = SecondsToDuration(*open_timeout);
            if (handshake_timeout) options.handshake_timeout = SecondsToDuration(*handshake_timeout);
            if (max_parked) options.max_parked = *max_parked;
            nb::gil_scoped_release release;
            return ValueOrThrow(CoordinatorRelay::Start(options));
          },
          "secret"_a, "bind_host"_a = nb::none(), "node_port"_a = 0, "agent_port"_a = 0,
          "agent_timeout"_a = nb::none(), "open_timeout"_a = nb::none(), "handshake_timeout"_a = nb::none(),
          "max_parked"_a = nb::none(),
          "Starts the relay (port 0: any free port); None keeps ember/coordinator.h's default.")
      .def_prop_ro("node_port", &CoordinatorRelay::node_port)
      .def_prop_ro("agent_port", &CoordinatorRelay::agent_port)
      .def_prop_ro(
          "ended", [](CoordinatorRelay& r) { return r.Wait(Duration(0)).has_value(); },
          "Whether the relay has ended (wait() then returns or raises at once).")
      .def(
          "wait",
          [](CoordinatorRelay& r, std::optional<double> timeout) {
            // WaitInterruptibly's slices, with the relay's own answer: an end by DeadlineExceeded
            // (no agent, a silent agent) is not a slice running out.
            const Deadline deadline = DeadlineAfter(timeout);
            constexpr Duration kSlice{250};
            std::optional<Status> why;
            for (;;) {
              {
                nb::gil_scoped_release release;
                why = r.Wait(std::min(deadline.remaining(), kSlice));
              }
              if (why || deadline.expired()) break;
              if (PyErr_CheckSignals() != 0) throw nb::python_error();
            }
            if (!why) {
              ThrowIfError(Status::DeadlineExceeded("the coordinator relay is still running after " +
                                                    FormatDuration(SecondsToDuration(timeout.value_or(0)))));
            }
            ThrowIfError(*why);
          },
          "timeout"_a = nb::none(),
          "Blocks until the relay ended (None: however long); returns None if its agent closed the control "
          "connection, raises why otherwise (DeadlineExceeded: no agent came, or it fell silent; Cancelled: "
          "close()).  Raises DeadlineExceeded 'still running' if `timeout` passes first (see `ended`).")
      .def(
          "stats",
          [](CoordinatorRelay& r) {
            RelayStats s;
            {
              nb::gil_scoped_release release;
              s = r.stats();
            }
            nb::dict d;
            d["agent_connected"] = s.agent_connected;
            d["tunnels_opened"] = s.tunnels_opened;
            d["tunnels_active"] = s.tunnels_active;
            d["nodes_refused"] = s.nodes_refused;
            return d;
          },
          "{agent_connected, tunnels_opened, tunnels_active, nodes_refused}.")
      .def("close", &CoordinatorRelay::Close, Release(),
           "Ends the relay, closes every connection, joins its threads.  Idempotent.");

  nb::class_<RelayAgent>(m, "RelayAgent",
                         "The client's side of the coordinator relay: tunnels the relay's nodes to the local "
                         "coordinator.  Thread-safe.")
      .def_static(
          "connect",
          [](std::string relay_host, int agent_port, nb::bytes secret, std::string coordinator_host,
             int coordinator_port, std::optional<double> connect_timeout, std::optional<double> heartbeat_interval) {
            RelayAgentOptions options;  // its defaults stand where Python passes None
            if (connect_timeout) options.connect_timeout = SecondsToDuration(*connect_timeout);
            if (heartbeat_interval) options.heartbeat_interval = SecondsToDuration(*heartbeat_interval);
            std::string key = BytesToString(secret);
            nb::gil_scoped_release release;
            return ValueOrThrow(
                RelayAgent::Connect(relay_host, agent_port, key, coordinator_host, coordinator_port, options));
          },
          "relay_host"_a, "agent_port"_a, "secret"_a, "coordinator_host"_a, "coordinator_port"_a,
          "connect_timeout"_a = nb::none(), "heartbeat_interval"_a = nb::none(),
          "Dials the relay's agent port and serves its tunnels; None keeps ember/coordinator.h's default.")
      .def_prop_ro("ok", &RelayAgent::ok, "True while the control connection to the relay is up.")
      .def_prop_ro(
          "error",
          [](RelayAgent& a) -> std::optional<std::string> {
            const Status s = a.status();
            if (s.ok()) return std::nullopt;
            return s.message();
          },
          "Why the agent stopped (the relay closed, the connection failed, close()), or None.")
      .def(
          "stats",
          [](RelayAgent& a) {
            const RelayAgentStats s = a.stats();
            nb::dict d;
            d["tunnels_opened"] = s.tunnels_opened;
            d["tunnels_active"] = s.tunnels_active;
            return d;
          },
          "{tunnels_opened, tunnels_active}.")
      .def("close", &RelayAgent::Close, Release(),
           "Closes the control connection (the relay then ends) and every tunnel.  Idempotent.");
}

}  // namespace

void BindCoordinator(nb::module_& m) {
  BindValueTypes(m);
  BindServer(m);
  BindClient(m);
  BindRelay(m);
}

}  // namespace ember::python
