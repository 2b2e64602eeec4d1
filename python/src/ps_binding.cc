// ember._ember.Ps*: the parameter server (include/ember/ps.h).  Conversion only; ember/ps.py is
// the Python API.  Arrays are C-contiguous float32 (values) and int64 (row ids) numpy arrays,
// read and filled in place; the GIL is released around every call that talks to a shard.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <map>

#include <span>

#include "bindings.h"
#include "ember/ps.h"

namespace ember::python {
namespace {

using namespace nb::literals;
using Floats = nb::ndarray<float, nb::device::cpu, nb::c_contig>;
using Ids = nb::ndarray<int64_t, nb::device::cpu, nb::c_contig, nb::ndim<1>>;

std::span<float> Span(Floats& a) { return {a.data(), a.size()}; }
std::span<const int64_t> Span(const Ids& a) { return {a.data(), a.size()}; }

ps::Rule RuleOf(const std::string& name) {
  for (auto r : {ps::Rule::kAssign, ps::Rule::kAdd, ps::Rule::kSgd, ps::Rule::kAdam, ps::Rule::kElastic}) {
    if (name == ps::RuleName(r)) return r;
  }
  throw StatusError(Status::InvalidArgument("unknown PS rule '" + name +
                                            "' (assign, add, sgd, adam, elastic)"));
}

}  // namespace

void BindPs(nb::module_& m) {
  nb::class_<ps::RuleOptions>(m, "PsRuleOptions", "A dense tensor's update rule (include/ember/ps.h).")
      .def(nb::init<>())
      .def_prop_rw(
          "rule", [](const ps::RuleOptions& o) { return std::string(ps::RuleName(o.rule)); },
          [](ps::RuleOptions& o, const std::string& name) { o.rule = RuleOf(name); })
      .def_rw("lr", &ps::RuleOptions::lr)
      .def_rw("beta1", &ps::RuleOptions::beta1)
      .def_rw("beta2", &ps::RuleOptions::beta2)
      .def_rw("epsilon", &ps::RuleOptions::epsilon)
      .def_rw("alpha", &ps::RuleOptions::alpha)
      .def_rw("scale_by_staleness", &ps::RuleOptions::scale_by_staleness)
      .def_rw("staleness_bound", &ps::RuleOptions::staleness_bound)
      .def_rw("hogwild", &ps::RuleOptions::hogwild);

  nb::class_<ps::TableOptions>(m, "PsTableOptions", "A sparse table's options (include/ember/ps.h).")
      .def(nb::init<>())
      .def_rw("dim", &ps::TableOptions::dim)
      .def_rw("seed", &ps::TableOptions::seed)
      .def_rw("init_scale", &ps::TableOptions::init_scale)
      .def_prop_rw(
          "rule", [](const ps::TableOptions& o) { return std::string(ps::RuleName(o.rule)); },
          [](ps::TableOptions& o, const std::string& name) { o.rule = RuleOf(name); })
      .def_rw("lr", &ps::TableOptions::lr);

  nb::class_<ps::ShardStats>(m, "PsShardStats")
      .def_ro("pushes_applied", &ps::ShardStats::pushes_applied)
      .def_ro("pushes_rejected", &ps::ShardStats::pushes_rejected)
      .def_ro("staleness_histogram", &ps::ShardStats::staleness_histogram)
      .def_ro("rows", &ps::ShardStats::rows);

  nb::class_<ps::ClockResult>(m, "PsClockResult")
      .def_ro("clock", &ps::ClockResult::clock)
      .def_ro("min_clock", &ps::ClockResult::min_clock)
      .def_ro("waited_us", &ps::ClockResult::waited_us);

  nb::class_<ps::Server>(m, "PsServer", "Serves one parameter-server shard over the job's transport.")
      .def_static(
          "start",
          [](const std::string& name, nb::bytes secret, const std::string& bind_host, int port) {
            ps::ServerOptions o;
            o.name = name;
            o.secret = std::string(secret.c_str(), secret.size());
            o.bind_host = bind_host;
            o.port = port;
            nb::gil_scoped_release release;
            return ValueOrThrow(ps::Server::Start(o));
          },
          "name"_a, "secret"_a, "bind_host"_a = "0.0.0.0", "port"_a = 0)
      .def_prop_ro("port", &ps::Server::port)
      .def("stats", [](ps::Server& s) { return s.shard().Stats(); })
      .def("clocks", [](ps::Server& s) { return s.shard().Clocks(); })
      .def("departed", [](ps::Server& s) { return s.shard().Departed(); })
      .def(
          "snapshot",
          [](ps::Server& s) {
            std::map<std::string, std::string> blobs;
            {
              nb::gil_scoped_release release;
              blobs = s.shard().Snapshot();
            }
            nb::dict out;
            for (const auto& [k, v] : blobs) out[nb::str(k.c_str())] = nb::bytes(v.data(), v.size());
            return out;
          },
          "The shard's tensors and tables as {name: bytes} (include/ember/ps.h Shard::Snapshot).")
      .def(
          "restore",
          [](ps::Server& s, const nb::dict& blobs) {
            std::map<std::string, std::string> in;
            for (auto [k, v] : blobs) {
              nb::bytes b = nb::cast<nb::bytes>(v);
              in[nb::cast<std::string>(k)] = std::string(b.c_str(), b.size());
            }
            nb::gil_scoped_release release;
            ThrowIfError(s.shard().Restore(in));
          },
          "blobs"_a, "Replaces the shard's state with a snapshot's.")
      .def("close", &ps::Server::Close, nb::call_guard<nb::gil_scoped_release>());

  nb::class_<ps::Versions>(m, "PsVersions", "The versions a pull saw; hand them to the push based on it.")
      .def_ro("per_slice", &ps::Versions::per_slice);

  nb::class_<ps::ClientPushResult>(m, "PsPushResult")
      .def_ro("applied", &ps::ClientPushResult::applied)
      .def_ro("rejected", &ps::ClientPushResult::rejected)
      .def_ro("max_staleness", &ps::ClientPushResult::max_staleness)
      .def_ro("reply", &ps::ClientPushResult::reply)
      .def_ro("versions", &ps::ClientPushResult::versions);

  nb::class_<ps::Client>(m, "PsClient", "A worker's connections to every shard.  Thread-safe.")
      .def_static(
          "connect",
          [](const std::vector<std::string>& shards, nb::bytes secret, const std::string& name, double timeout,
             double connect_timeout, std::optional<size_t> shm_ring_bytes) {
            ps::ClientOptions o;
            o.shards = shards;
            o.secret = std::string(secret.c_str(), secret.size());
            o.name = name;
            o.timeout = SecondsToDuration(timeout);
            o.connect_timeout = SecondsToDuration(connect_timeout);
            if (shm_ring_bytes) o.shm_ring_bytes = *shm_ring_bytes;
            nb::gil_scoped_release release;
            return ValueOrThrow(ps::Client::Connect(o));
          },
          "shards"_a, "secret"_a, "name"_a = "worker", "timeout"_a = 60.0, "connect_timeout"_a = 60.0,
          "shm_ring_bytes"_a = nb::none(),
          "shm_ring_bytes: each shared-memory ring's bytes for shards on this host (0: TCP only; None: "
          "ember/ps.h's default)")
      .def_prop_ro("num_shards", &ps::Client::num_shards)
      .def("shared_memory", &ps::Client::shared_memory, "shard"_a,
           "Whether shard `shard` is reached through shared memory (it is on this host).")
      .def(
          "create_dense",
          [](ps::Client& c, const std::string& tensor, Floats initial, const ps::RuleOptions& rule) {
            nb::gil_scoped_release release;
            ThrowIfError(c.CreateDense(tensor, Span(initial), rule));
          },
          "tensor"_a, "initial"_a, "rule"_a)
      .def(
          "pull_dense",
          [](ps::Client& c, const std::string& tensor, Floats out) {
            nb::gil_scoped_release release;
            return ValueOrThrow(c.PullDense(tensor, Span(out)));
          },
          "tensor"_a, "out"_a)
      .def(
          "push_dense",
          [](ps::Client& c, const std::string& tensor, Floats update, const ps::Versions& base) {
            nb::gil_scoped_release release;
            return ValueOrThrow(c.PushDense(tensor, Span(update), base));
          },
          "tensor"_a, "update"_a, "base"_a)
      .def(
          "pull_dense_many",
          [](ps::Client& c, const std::vector<std::string>& tensors, std::vector<Floats> outs) {
            std::vector<std::span<float>> spans;
            for (auto& o : outs) spans.push_back(Span(o));
            nb::gil_scoped_release release;
            return ValueOrThrow(c.PullDenseMany(tensors, spans));
          },
          "tensors"_a, "outs"_a)
      .def(
          "push_dense_many",
          [](ps::Client& c, const std::vector<std::string>& tensors, std::vector<Floats> updates,
             const std::vector<ps::Versions>& bases) {
            std::vector<std::span<const float>> spans;
            for (auto& u : updates) spans.push_back(Span(u));
            nb::gil_scoped_release release;
            return ValueOrThrow(c.PushDenseMany(tensors, spans, bases));
          },
          "tensors"_a, "updates"_a, "bases"_a)
      .def(
          "create_table",
          [](ps::Client& c, const std::string& table, const ps::TableOptions& options) {
            nb::gil_scoped_release release;
            ThrowIfError(c.CreateTable(table, options));
          },
          "table"_a, "options"_a)
      .def(
          "pull_rows",
          [](ps::Client& c, const std::string& table, Ids ids, int dim, Floats out) {
            nb::gil_scoped_release release;
            ThrowIfError(c.PullRows(table, Span(ids), dim, Span(out)));
          },
          "table"_a, "ids"_a, "dim"_a, "out"_a)
      .def(
          "push_rows",
          [](ps::Client& c, const std::string& table, Ids ids, int dim, Floats update) {
            nb::gil_scoped_release release;
            ThrowIfError(c.PushRows(table, Span(ids), dim, Span(update)));
          },
          "table"_a, "ids"_a, "dim"_a, "update"_a)
      .def(
          "stats",
          [](ps::Client& c) {
            nb::gil_scoped_release release;
            return ValueOrThrow(c.Stats());
          })
      .def(
          "clock",
          [](ps::Client& c, int64_t clock, int64_t staleness, int64_t warmup, int workers) {
            nb::gil_scoped_release release;
            return ValueOrThrow(c.Clock(clock, staleness, warmup, workers));
          },
          "clock"_a, "staleness"_a, "warmup"_a, "workers"_a)
      .def("leave", [](ps::Client& c) {
        nb::gil_scoped_release release;
        ThrowIfError(c.Leave());
      });
}

}  // namespace ember::python
