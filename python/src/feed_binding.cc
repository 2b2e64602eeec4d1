// Bindings of the data feed's public contract (ember/feed.h: options,
// endpoints, the node's FeedHost, producers, consumer).  Type conversion only:
// payloads go in as any buffer-protocol object (bytes, memoryview, numpy,
// pyarrow.Buffer) without a copy and come out as read-only uint8 numpy arrays
// that share-own the received bytes (no copy either); durations cross as
// float seconds; failures as the exceptions of module.cc.  Every call that
// can block releases the GIL.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "ember/device.h"
#include "ember/feed.h"

namespace ember::python {
namespace {

using namespace nb::literals;
using Release = nb::call_guard<nb::gil_scoped_release>;

// A read-only view of a buffer-protocol object's bytes.  Construct and
// destroy it with the GIL held; the bytes may be read without it (the view
// keeps the object alive).
class BufferView {
 public:
  explicit BufferView(nb::handle obj, bool writable = false) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
      throw nb::python_error();
    }
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  std::span<const uint8_t> bytes() const {
    return {static_cast<const uint8_t*>(view_.buf), static_cast<size_t>(view_.len)};
  }
  std::span<uint8_t> mutable_bytes() const {
    return {static_cast<uint8_t*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
};

// Read-only views of a sequence of buffer-protocol objects (the parts of one
// message).  Construct and destroy it with the GIL held; parts() may be read
// without it.
class BufferViews {
 public:
  explicit BufferViews(nb::handle sequence) {
    nb::object items = nb::steal(PySequence_Fast(sequence.ptr(), "parts must be a sequence of buffers"));
    if (!items.is_valid()) throw nb::python_error();
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(items.ptr());
    views_.reserve(static_cast<size_t>(n));
    parts_.reserve(static_cast<size_t>(n));
    for (Py_ssize_t i = 0; i < n; ++i) {
      Py_buffer view{};
      if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(items.ptr(), i), &view, PyBUF_SIMPLE) != 0) {
        for (Py_buffer& held : views_) PyBuffer_Release(&held);  // no destructor after a throw
        throw nb::python_error();
      }
      views_.push_back(view);
      parts_.emplace_back(static_cast<const uint8_t*>(view.buf), static_cast<size_t>(view.len));
    }
  }
  ~BufferViews() {
    for (Py_buffer& view : views_) PyBuffer_Release(&view);
  }
  BufferViews(const BufferViews&) = delete;
  BufferViews& operator=(const BufferViews&) = delete;

  std::span<const std::span<const uint8_t>> parts() const { return parts_; }

 private:
  std::vector<Py_buffer> views_;
  std::vector<std::span<const uint8_t>> parts_;
};

// A read-only uint8 numpy view of bytes[offset:] that keeps `bytes` alive.
nb::object SharedArray(std::shared_ptr<const std::vector<uint8_t>> bytes, size_t offset) {
  auto* holder = new std::shared_ptr<const std::vector<uint8_t>>(std::move(bytes));
  nb::capsule owner(holder, [](void* p) noexcept { delete static_cast<std::shared_ptr<const std::vector<uint8_t>>*>(p); });
  const std::vector<uint8_t>& v = **holder;
  static const uint8_t kEmpty = 0;
  const uint8_t* data = offset < v.size() ? v.data() + offset : &kEmpty;
  const size_t size = offset < v.size() ? v.size() - offset : 0;
  return nb::cast(nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(data, {size}, owner));
}

// `bytes` as a read-only uint8 numpy array that keeps `owner` (a ring lease
// or a buffer) alive until the array and every view of it (pyarrow buffers,
// numpy slices) are collected, on whichever thread drops the last one.
nb::object SharedArray(std::shared_ptr<const void> owner, std::span<const uint8_t> bytes) {
  auto* holder = new std::shared_ptr<const void>(std::move(owner));
  nb::capsule capsule(holder, [](void* p) noexcept { delete static_cast<std::shared_ptr<const void>*>(p); });
  static const uint8_t kEmpty = 0;
  const uint8_t* data = bytes.empty() ? &kEmpty : bytes.data();
  return nb::cast(nb::ndarray<nb::numpy, const uint8_t, nb::ndim<1>>(data, {bytes.size()}, capsule));
}

void BindFeedHost(nb::module_& m) {
  using feed::FeedHost;
  using feed::FeedHostOptions;
  m.def("node_ring_name", &feed::NodeRingName, "job_id"_a, "executor_id"_a,
        "The shm ring of node `executor_id` of job `job_id` (ember/feed.h NodeRingName).");
  nb::class_<FeedHost>(m, "FeedHost",
                       "A training node's feed, held by its launcher: the ring the node reads and the TCP\n"
                       "feed server relaying producers on other hosts into it (ember/feed.h FeedHost).")
      .def_static(
          "start",
          [](const std::string& job_id, int64_t executor_id, const std::string& name, const std::string& host,
             const std::string& bind_host, nb::bytes secret, std::optional<uint64_t> ring_bytes,
             std::optional<double> idle_timeout) {
            FeedHostOptions options;  // its defaults stand where Python passes None
            options.job_id = job_id;
            options.executor_id = executor_id;
            options.name = name;
            options.host = host;
            options.bind_host = bind_host;
            options.secret = BytesToString(secret);
            if (ring_bytes) options.ring_bytes = *ring_bytes;
            if (idle_timeout) options.idle_timeout = SecondsToDuration(*idle_timeout);
            nb::gil_scoped_release release;
            return ValueOrThrow(FeedHost::Start(options));
          },
          "job_id"_a, "executor_id"_a, "name"_a, "host"_a, "bind_host"_a, "secret"_a, "ring_bytes"_a = nb::none(),
          "idle_timeout"_a = nb::none(),
          "Creates the node's ring and starts its feed server on a free port of `bind_host`;\n"
          "`host` is where producers on other hosts reach it.  None: the core's default.")
      .def_prop_ro("endpoint", &FeedHost::endpoint, "Where producers reach the node (publish endpoint.encode()).")
      .def("abort", &FeedHost::Abort, "reason"_a, Release(),
           "The node failed: blocked and later writes of producers fail with Aborted(`reason`).")
      .def("terminate", &FeedHost::Terminate, Release(),
           "The node ended its feed: queued data is dropped, producers stop quietly.")
      .def("close", &FeedHost::Close, Release(),
           "Stops the server, removes the ring and the node's leftover result rings.  Idempotent.");
}

// A Duration member as float seconds.
template <typename T>
void SecondsField(nb::class_<T>& cls, const char* name, Duration T::*field, const char* doc) {
  cls.def_prop_rw(
      name, [field](const T& self) { return DurationToSeconds(self.*field); },
      [field](T& self, double seconds) { self.*field = SecondsToDuration(seconds); }, doc);
}

nb::list Ranges(const std::vector<feed::RowRange>& ranges) {
  nb::list out;
  for (const feed::RowRange& r : ranges) out.append(nb::cast(r));
  return out;
}

void BindFeedContract(nb::module_& m) {
  using feed::Consumer;
  using feed::ConsumerOptions;
  using feed::FeedOptions;
  using feed::InferenceProducer;
  using feed::NodeEndpoint;
  using feed::Producer;
  using feed::Transport;

  m.attr("BATCH_HEADER_BYTES") = feed::kBatchHeaderBytes;
  m.def("validation_epoch", &feed::ValidationEpoch, "training_epoch"_a,
        "The number of the validation epoch fed after training epoch `training_epoch` (ember/feed.h).");

  nb::enum_<Transport>(m, "Transport", "How a producer reaches a node (ember/feed.h).")
      .value("AUTO", Transport::kAuto)
      .value("SHM", Transport::kShm)
      .value("TCP", Transport::kTcp);

  auto options = nb::class_<FeedOptions>(m, "FeedOptions", "A producer's options (ember/feed.h FeedOptions).")
                     .def(nb::init<>())
                     .def_prop_rw(
                         "secret", [](const FeedOptions& o) { return nb::bytes(o.secret.data(), o.secret.size()); },
                         [](FeedOptions& o, nb::bytes b) { o.secret = BytesToString(b); })
                     .def_rw("transport", &FeedOptions::transport)
                     .def_rw("max_message_bytes", &FeedOptions::max_message_bytes)
                     .def_rw("result_ring_bytes", &FeedOptions::result_ring_bytes);
  SecondsField(options, "connect_timeout", &FeedOptions::connect_timeout,
               "Seconds to reach a node (its ring, or its feed server including the handshake).");
  SecondsField(options, "idle_timeout", &FeedOptions::idle_timeout,
               "Seconds any wait may make no progress; sent to the node's feed server too.");
  options
      .def("__getstate__",
           [](const FeedOptions& o) {
             return nb::make_tuple(nb::bytes(o.secret.data(), o.secret.size()), static_cast<int>(o.transport),
                                   o.connect_timeout.count(), o.idle_timeout.count(), o.max_message_bytes,
                                   o.result_ring_bytes);
           })
      .def("__setstate__", [](FeedOptions& o, nb::tuple t) {
        new (&o) FeedOptions();
        o.secret = BytesToString(nb::cast<nb::bytes>(t[0]));
        o.transport = static_cast<Transport>(nb::cast<int>(t[1]));
        o.connect_timeout = Duration(nb::cast<int64_t>(t[2]));
        o.idle_timeout = Duration(nb::cast<int64_t>(t[3]));
        o.max_message_bytes = nb::cast<size_t>(t[4]);
        o.result_ring_bytes = nb::cast<size_t>(t[5]);
      });

  nb::class_<NodeEndpoint>(m, "NodeEndpoint", "Where a node's feed is (ember/feed.h NodeEndpoint).")
      .def(nb::init<>())
      .def(
          "__init__",
          [](NodeEndpoint* e, int64_t executor_id, std::string name, std::string ring, std::string host, int port,
             std::optional<uint64_t> ring_capacity) {
            new (e) NodeEndpoint();
            e->executor_id = executor_id;
            e->name = std::move(name);
            e->ring = std::move(ring);
            e->host = std::move(host);
            e->port = port;
            if (ring_capacity) e->ring_capacity = *ring_capacity;
          },
          "executor_id"_a, "name"_a, "ring"_a, "host"_a, "port"_a, "ring_capacity"_a = nb::none())
      .def_rw("executor_id", &NodeEndpoint::executor_id)
      .def_rw("name", &NodeEndpoint::name)
      .def_rw("ring", &NodeEndpoint::ring)
      .def_rw("host", &NodeEndpoint::host)
      .def_rw("port", &NodeEndpoint::port)
      .def_rw("ring_capacity", &NodeEndpoint::ring_capacity)
      .def("encode", [](const NodeEndpoint& e) { std::string b = e.Encode(); return nb::bytes(b.data(), b.size()); },
           "The versioned binary form the launcher publishes (docs/wire.md).")
      .def_static(
          "decode", [](nb::bytes b) { return ValueOrThrow(NodeEndpoint::Decode(BytesToString(b))); }, "data"_a,
          "Corruption naming the field on malformed bytes.")
      .def("describe", &NodeEndpoint::Describe)
      .def("__eq__", [](const NodeEndpoint& a, const NodeEndpoint& b) { return a == b; })
      .def("__repr__", [](const NodeEndpoint& e) { return "NodeEndpoint(" + e.Describe() + ", ring " + e.ring + ")"; })
      .def("__getstate__", [](const NodeEndpoint& e) { std::string b = e.Encode(); return nb::bytes(b.data(), b.size()); })
      .def("__setstate__", [](NodeEndpoint& e, nb::bytes b) {
        new (&e) NodeEndpoint(ValueOrThrow(NodeEndpoint::Decode(BytesToString(b))));
      });

  m.def(
      "split_rows",
      [](int64_t rows, const std::vector<int64_t>& sent, size_t first) { return feed::SplitRows(rows, sent, first); },
      "rows"_a, "sent"_a, "first"_a, "How the next `rows` rows of a partition go to the nodes (ember/feed.h SplitRows).");
  m.def("max_batch_bytes", &feed::MaxBatchBytes, "ring_capacity"_a, "max_message_bytes"_a);
  nb::class_<Producer>(m, "FeedProducer",
                       "One feeding task's partition of one training epoch, to every node (ember/feed.h Producer).\n"
                       "Not thread-safe.")
      .def_static(
          "open",
          [](std::vector<NodeEndpoint> nodes, uint32_t partition, uint32_t epoch, uint32_t attempt,
             const FeedOptions& options) {
            return ValueOrThrow(Producer::Open(std::move(nodes), partition, epoch, attempt, options));
          },
          "nodes"_a, "partition"_a, "epoch"_a, "attempt"_a, "options"_a, Release())
      .def_prop_ro("num_nodes", &Producer::num_nodes)
      .def("split", &Producer::Split, "rows"_a)
      .def("max_batch_bytes", &Producer::MaxBatchBytes, "node"_a)
      .def(
          "send_batch",
          [](Producer& self, size_t node, nb::handle ipc, int64_t rows) {
            BufferView view(ipc);
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.SendBatch(node, view.bytes(), rows);
            }
            ThrowIfError(st);
          },
          "node"_a, "ipc"_a, "rows"_a)
      .def(
          "send_batch_in_place",
          [](Producer& self, size_t node, nb::handle message, int64_t rows) {
            BufferView view(message, /*writable=*/true);
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.SendBatchInPlace(node, view.mutable_bytes(), rows);
            }
            ThrowIfError(st);
          },
          "node"_a, "message"_a, "rows"_a,
          "`message`: a writable buffer of BATCH_HEADER_BYTES of room, then the IPC stream.")
      .def(
          "send_batch_parts",
          [](Producer& self, size_t node, nb::handle parts, int64_t rows) {
            BufferViews views(parts);
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.SendBatchParts(node, views.parts(), rows);
            }
            ThrowIfError(st);
          },
          "node"_a, "parts"_a, "rows"_a,
          "`parts`: the IPC stream as a sequence of buffers (what an Arrow IPC writer emits), copied\n"
          "once, straight into the node's ring.")
      .def("end_partition", [](Producer& self) { ThrowIfError(self.EndPartition()); }, Release())
      .def_prop_ro("sent", &Producer::sent)
      .def("gone", &Producer::gone, "node"_a)
      .def("cancelled", &Producer::cancelled, "node"_a)
      .def("all_cancelled", &Producer::all_cancelled)
      .def("close", &Producer::Close, Release());

  nb::class_<feed::ResultBatch>(m, "ResultBatch", "Result rows of an inference partition, as Arrow IPC bytes.")
      .def_ro("rows", &feed::ResultBatch::rows)
      .def("ipc", [](const feed::ResultBatch& r) { return SharedArray(r.message, r.ipc_offset); },
           "The IPC stream as a read-only uint8 numpy array (no copy).");

  nb::class_<InferenceProducer>(m, "InferenceProducer",
                                "One feeding task's inference partition (ember/feed.h InferenceProducer).\n"
                                "begin/send/end/release_session on one thread, next_result on another.")
      .def_static(
          "open",
          [](const NodeEndpoint& node, uint32_t partition, const FeedOptions& options) {
            return ValueOrThrow(InferenceProducer::Open(node, partition, options));
          },
          "node"_a, "partition"_a, "options"_a, Release())
      .def("max_batch_bytes", &InferenceProducer::MaxBatchBytes)
      .def("begin", [](InferenceProducer& self) { ThrowIfError(self.Begin()); }, Release())
      .def(
          "send_batch_in_place",
          [](InferenceProducer& self, nb::handle message, int64_t rows) {
            BufferView view(message, /*writable=*/true);
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.SendBatchInPlace(view.mutable_bytes(), rows);
            }
            ThrowIfError(st);
          },
          "message"_a, "rows"_a)
      .def(
          "send_batch_parts",
          [](InferenceProducer& self, nb::handle parts, int64_t rows) {
            BufferViews views(parts);
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.SendBatchParts(views.parts(), rows);
            }
            ThrowIfError(st);
          },
          "parts"_a, "rows"_a)
      .def("end", [](InferenceProducer& self) { ThrowIfError(self.End()); }, Release())
      .def("release_session", &InferenceProducer::ReleaseSession, Release())
      .def(
          "next_result",
          [](InferenceProducer& self) {
            Result<std::optional<feed::ResultBatch>> r = [&] {
              nb::gil_scoped_release release;
              return self.NextResult();
            }();
            return ValueOrThrow(std::move(r));
          },
          "The next ResultBatch, or None once every row was answered (counts checked).")
      .def_prop_ro("rows_sent", &InferenceProducer::rows_sent)
      .def_prop_ro("rows_answered", &InferenceProducer::rows_answered)
      .def("close", &InferenceProducer::Close, Release());

  m.def(
      "feed_end_epoch",
      [](const std::vector<NodeEndpoint>& nodes, uint32_t epoch, uint32_t partitions, const FeedOptions& options) {
        return ValueOrThrow(feed::EndEpoch(nodes, epoch, partitions, options));
      },
      "nodes"_a, "epoch"_a, "partitions"_a, "options"_a, Release(),
      "Tells every node the epoch's partition count; returns, per node, why it could not be reached ('' if told).");
  m.def(
      "feed_end_feed",
      [](const std::vector<NodeEndpoint>& nodes, const FeedOptions& options) {
        return ValueOrThrow(feed::EndFeed(nodes, options));
      },
      "nodes"_a, "options"_a, Release(), "Tells every node no more data will come; returns, per node, why it could not be reached ('' if told).");
  m.def(
      "feed_await_epoch",
      [](const std::vector<NodeEndpoint>& nodes, uint32_t epoch, const FeedOptions& options) {
        std::vector<feed::NodeEpochState> states = ValueOrThrow(feed::AwaitEpoch(nodes, epoch, options));
        std::vector<std::string> out;
        for (feed::NodeEpochState s : states) {
          out.push_back(s == feed::NodeEpochState::kBegun        ? "begun"
                        : s == feed::NodeEpochState::kTerminated ? "terminated"
                                                                  : "gone");
        }
        return out;
      },
      "nodes"_a, "epoch"_a, "options"_a, Release(),
      "Waits until every node began training epoch `epoch`, ended its feed, or went away: 'begun', "
      "'terminated' or 'gone' per node.  DeadlineExceeded once a node read nothing for the idle timeout.");

  auto copts = nb::class_<ConsumerOptions>(m, "ConsumerOptions", "The node's end (ember/feed.h ConsumerOptions).")
                   .def(nb::init<>())
                   .def_rw("node", &ConsumerOptions::node)
                   .def_rw("train_mode", &ConsumerOptions::train_mode);
  SecondsField(copts, "read_timeout", &ConsumerOptions::read_timeout, "Seconds a read may wait for a message.");
  SecondsField(copts, "result_timeout", &ConsumerOptions::result_timeout,
               "Seconds a result write may make no progress.");

  nb::class_<feed::RowRange>(m, "RowRange", "Rows [offset, offset + rows) of a received record batch.")
      .def_ro("message_id", &feed::RowRange::message_id)
      .def_ro("offset", &feed::RowRange::offset)
      .def_ro("rows", &feed::RowRange::rows)
      .def_ro("partition", &feed::RowRange::partition)
      .def_ro("epoch", &feed::RowRange::epoch)
      .def("ipc", [](const feed::RowRange& r) { return SharedArray(r.owner, r.ipc()); },
           "The whole batch's IPC stream as a read-only uint8 numpy array (no copy).");

  nb::class_<Consumer>(m, "FeedConsumer", "The node's end of the feed (ember/feed.h Consumer).  Not thread-safe.")
      .def_static(
          "open",
          [](const std::string& ring, const ConsumerOptions& options) {
            return ValueOrThrow(Consumer::Open(ring, options));
          },
          "ring"_a, "options"_a, Release())
      .def_prop_rw(
          "train_mode", [](const Consumer& c) { return c.options().train_mode; }, &Consumer::set_train_mode)
      .def_prop_rw(
          "read_timeout", [](const Consumer& c) { return DurationToSeconds(c.options().read_timeout); },
          [](Consumer& c, double s) { c.set_read_timeout(SecondsToDuration(s)); })
      .def(
          "next",
          [](Consumer& self, int64_t max_rows, bool stop_at_partition) {
            Result<std::vector<feed::RowRange>> r = [&] {
              nb::gil_scoped_release release;
              return self.Next(max_rows, stop_at_partition);
            }();
            return Ranges(ValueOrThrow(std::move(r)));
          },
          "max_rows"_a, "stop_at_partition"_a)
      .def(
          "begin_epoch",
          [](Consumer& self, bool validation) {
            Result<std::optional<uint32_t>> r = [&] {
              nb::gil_scoped_release release;
              return self.BeginEpoch(validation ? feed::EpochKind::kValidation : feed::EpochKind::kTraining);
            }();
            return ValueOrThrow(std::move(r));
          },
          "validation"_a = false)
      .def(
          "next_epoch_batch",
          [](Consumer& self, int64_t batch_size, bool drop_remainder) {
            Result<std::vector<feed::RowRange>> r = [&] {
              nb::gil_scoped_release release;
              return self.NextEpochBatch(batch_size, drop_remainder);
            }();
            return Ranges(ValueOrThrow(std::move(r)));
          },
          "batch_size"_a, "drop_remainder"_a)
      .def(
          "next_epoch_batches",
          [](Consumer& self, int64_t batch_size, int64_t max_batches, bool drop_remainder) {
            Result<std::vector<feed::RowRange>> r = [&] {
              nb::gil_scoped_release release;
              return self.NextEpochBatches(batch_size, max_batches, drop_remainder);
            }();
            return Ranges(ValueOrThrow(std::move(r)));
          },
          "batch_size"_a, "max_batches"_a, "drop_remainder"_a)
      .def(
          "peek_row",
          [](Consumer& self) {
            Result<std::optional<feed::RowRange>> r = [&] {
              nb::gil_scoped_release release;
              return self.PeekRow();
            }();
            return ValueOrThrow(std::move(r));
          })
      .def("should_stop", &Consumer::ShouldStop)
      .def(
          "plan_results",
          [](Consumer& self, int64_t rows) {
            Result<std::vector<int64_t>> r = [&] {
              nb::gil_scoped_release release;
              return self.PlanResults(rows);
            }();
            return ValueOrThrow(std::move(r));
          },
          "rows"_a)
      .def(
          "send_results",
          [](Consumer& self, nb::handle ipc, int64_t rows) {
            BufferView view(ipc);
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.SendResults(view.bytes(), rows);
            }
            ThrowIfError(st);
          },
          "ipc"_a, "rows"_a)
      .def("terminate", &Consumer::Terminate, Release())
      .def(
          "page_lock_rows",
          [](Consumer& self) {
            std::shared_ptr<device::Runtime> runtime = ValueOrThrow(device::LoadCuda());
            ThrowIfError(self.PageLockRows(runtime));
            return runtime->Describe();
          },
          Release(),
          "Page-locks (CUDA) the memory rows are handed out in, for straight copies to a GPU; "
          "every copy from them must finish before the next read and before unlock_rows().  "
          "Returns the runtime used; NotFoundError without a CUDA runtime.")
      .def("unlock_rows", &Consumer::UnlockRows, Release())
      .def("close", &Consumer::Close, Release());
}

}  // namespace

void BindFeed(nb::module_& m) {
  BindFeedHost(m);
  BindFeedContract(m);
}

}  // namespace ember::python
