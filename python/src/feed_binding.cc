// Bindings of the data feed: shm::Ring (same host), FeedServer and FeedClient
// (other hosts).  Type conversion only: payloads go in as any buffer-protocol
// object (bytes, memoryview, numpy, pyarrow.Buffer) without a copy and come
// out as uint8 numpy arrays that own the received bytes (no copy either);
// durations cross as float seconds; failures as the exceptions of module.cc.
// Every call that can block releases the GIL.
#include <Python.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bindings.h"
#include "feed/feed_client.h"
#include "feed/feed_server.h"
#include "feed/messages.h"
#include "transport/shm/ring.h"

namespace ember::python {
namespace {

using namespace nb::literals;
using feed::FeedClient;
using feed::FeedKind;
using feed::FeedServer;
using feed::FeedServerOptions;
using shm::Ring;
using Release = nb::call_guard<nb::gil_scoped_release>;

std::string BytesToString(const nb::bytes& b) { return std::string(b.c_str(), b.size()); }

// A read-only view of a buffer-protocol object's bytes.  Construct and
// destroy it with the GIL held; the bytes may be read without it (the view
// keeps the object alive).
class BufferView {
 public:
  explicit BufferView(nb::handle obj) {
    if (PyObject_GetBuffer(obj.ptr(), &view_, PyBUF_SIMPLE) != 0) throw nb::python_error();
  }
  ~BufferView() { PyBuffer_Release(&view_); }
  BufferView(const BufferView&) = delete;
  BufferView& operator=(const BufferView&) = delete;

  std::span<const uint8_t> bytes() const {
    return {static_cast<const uint8_t*>(view_.buf), static_cast<size_t>(view_.len)};
  }

 private:
  Py_buffer view_{};
};

// Moves `bytes` into a 1-D uint8 numpy array that owns them (via a capsule).
nb::object OwnedArray(std::vector<uint8_t> bytes) {
  auto holder = std::make_unique<std::vector<uint8_t>>(std::move(bytes));
  if (holder->capacity() == 0) holder->reserve(1);  // a real data pointer even when empty
  uint8_t* data = holder->data();
  const size_t size = holder->size();
  nb::capsule owner(holder.get(), [](void* p) noexcept { delete static_cast<std::vector<uint8_t>*>(p); });
  holder.release();  // the capsule owns it now
  return nb::cast(nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(data, {size}, owner));
}

// shm::Ring as Python holds it.  Python code may close() a ring while another
// thread is blocked in read()/write() on it (the GIL is released there), and
// shm::Ring::Close() must not unmap under them: calls hold `mu_` shared,
// close() exclusively, after aborting a consumer's ring so that its blocked
// reader returns.
class PyShmRing {
 public:
  PyShmRing(std::unique_ptr<shm::Ring> ring, bool consumer)
      : name_(ring->name()), capacity_(ring->capacity()), consumer_(consumer), ring_(std::move(ring)) {}

  // Runs f(ring) under the shared lock; Aborted if closed.  Call without the GIL.
  template <typename F>
  auto Use(F&& f) {
    std::shared_lock<std::shared_mutex> lock(mu_);
    if (!ring_) throw StatusError(Status::Aborted("feed ring " + name_ + " is closed"));
    return f(*ring_);
  }

  // Call without the GIL.
  void Close() {
    {
      std::shared_lock<std::shared_mutex> lock(mu_);
      if (ring_ && consumer_) ring_->Abort("the node closed its feed");
    }
    std::unique_lock<std::shared_mutex> lock(mu_);
    if (ring_) ring_->Close();
    ring_.reset();
  }

  const std::string& name() const { return name_; }
  size_t capacity() const { return capacity_; }

 private:
  const std::string name_;
  const size_t capacity_;
  const bool consumer_;
  std::shared_mutex mu_;
  std::unique_ptr<shm::Ring> ring_;
};

void BindShmRing(nb::module_& m) {
  nb::class_<PyShmRing>(m, "ShmRing",
                        "A node's bounded shared-memory feed ring (many producers, one consumer).\n"
                        "Thread-safe; close() may be called while another thread reads or writes.")
      .def_static(
          "create",
          [](const std::string& name, size_t capacity) {
            return std::make_unique<PyShmRing>(ValueOrThrow(shm::Ring::Create(name, capacity)), /*consumer=*/true);
          },
          "name"_a, "capacity"_a, Release(),
          "Creates ring `name` (\"/ember-...\") of `capacity` bytes; the caller is its consumer.\n"
          "AlreadyExists if it exists; close() unlinks it.")
      .def_static(
          "open",
          [](const std::string& name) {
            return std::make_unique<PyShmRing>(ValueOrThrow(shm::Ring::Open(name)), /*consumer=*/false);
          },
          "name"_a, Release(), "Opens an existing ring as a producer.  NotFound if there is none.")
      .def_static("max_payload", &shm::Ring::MaxPayload, "capacity"_a,
                  "Largest payload one message may carry in a ring of `capacity` bytes.")
      .def_prop_ro("name", &PyShmRing::name)
      .def_prop_ro("capacity", &PyShmRing::capacity)
      .def(
          "write",
          [](PyShmRing& self, uint32_t kind, nb::handle payload, double timeout) {
            BufferView view(payload);  // released with the GIL held, after `release` ends
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.Use([&](shm::Ring& r) {
                return r.Write(kind, view.bytes(), Deadline::After(SecondsToDuration(timeout)));
              });
            }
            ThrowIfError(st);
          },
          "kind"_a, "payload"_a, "timeout"_a,
          "Producer: appends one message; `payload` is any contiguous buffer (not copied first).\n"
          "Blocks while the ring is full: DeadlineExceeded after `timeout` seconds; Aborted if the\n"
          "node failed; Cancelled if it terminated its feed; InvalidArgument if too large.")
      .def(
          "read",
          [](PyShmRing& self, double timeout) {
            uint32_t kind = 0;
            std::vector<uint8_t> payload;
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.Use([&](shm::Ring& r) {
                return r.Read(&kind, &payload, Deadline::After(SecondsToDuration(timeout)));
              });
            }
            ThrowIfError(st);
            return nb::make_tuple(kind, OwnedArray(std::move(payload)));
          },
          "timeout"_a,
          "Consumer: (kind, payload) of the next message; payload is a uint8 numpy array that owns\n"
          "its bytes.  DeadlineExceeded if none arrives within `timeout` seconds.")
      .def(
          "lock_session",
          [](PyShmRing& self, double idle_timeout) {
            ThrowIfError(self.Use([&](shm::Ring& r) { return r.LockSession(SecondsToDuration(idle_timeout)); }));
          },
          "idle_timeout"_a, Release(),
          "Producer: takes the ring's session lock (keeps this producer's messages contiguous).\n"
          "Must be released by unlock_session() on the same thread.")
      .def(
          "unlock_session", [](PyShmRing& self) { self.Use([](shm::Ring& r) { r.UnlockSession(); }); }, Release(),
          "Releases the session lock taken by lock_session() on this thread; no-op if not held.")
      .def(
          "health", [](PyShmRing& self) { ThrowIfError(self.Use([](shm::Ring& r) { return r.Health(); })); },
          Release(), "Producer: raises Aborted/Cancelled as write() would now, else returns None.")
      .def(
          "abort", [](PyShmRing& self, const std::string& reason) { self.Use([&](shm::Ring& r) { r.Abort(reason); }); },
          "reason"_a, Release(), "Consumer: fails blocked and future writes with Aborted(`reason`).")
      .def(
          "terminate", [](PyShmRing& self) { self.Use([](shm::Ring& r) { r.Terminate(); }); }, Release(),
          "Consumer: drops queued data; producers' writes then raise Cancelled (stop quietly).")
      .def("close", &PyShmRing::Close, Release(),
           "Releases the ring (a consumer also aborts and unlinks it).  Idempotent.");
}

void BindFeedServer(nb::module_& m) {
  nb::class_<FeedServer>(m, "FeedServer",
                         "Relays authenticated TCP feed connections from other hosts into a node's ring.")
      .def_static(
          "start",
          [](const std::string& ring_name, nb::bytes secret, std::string bind_host, int port,
             std::string result_ring_prefix, size_t result_ring_capacity, double handshake_timeout,
             double idle_timeout, size_t max_message_bytes) {
            FeedServerOptions options;
            options.ring_name = ring_name;
            options.secret = BytesToString(secret);
            options.bind_host = std::move(bind_host);
            options.port = port;
            options.result_ring_prefix = std::move(result_ring_prefix);
            options.result_ring_capacity = result_ring_capacity;
            options.handshake_timeout = SecondsToDuration(handshake_timeout);
            options.idle_timeout = SecondsToDuration(idle_timeout);
            options.max_message_bytes = max_message_bytes;
            nb::gil_scoped_release release;
            return ValueOrThrow(FeedServer::Start(options));
          },
          "ring_name"_a, "secret"_a, "bind_host"_a = "0.0.0.0", "port"_a = 0,
          "result_ring_prefix"_a = "/ember-results", "result_ring_capacity"_a = size_t{4} << 20,
          "handshake_timeout"_a = 10.0, "idle_timeout"_a = 600.0, "max_message_bytes"_a = size_t{64} << 20,
          "Opens the node's ring `ring_name` and listens (port 0: any free port).")
      .def_prop_ro("port", &FeedServer::port)
      .def(
          "stats",
          [](const FeedServer& s) {
            const feed::FeedServerStats st = s.stats();
            nb::dict d;
            d["connections_accepted"] = st.connections_accepted;
            d["connections_rejected"] = st.connections_rejected;
            d["messages_relayed"] = st.messages_relayed;
            d["bytes_relayed"] = st.bytes_relayed;
            d["results_sent"] = st.results_sent;
            return d;
          },
          "Counters: connections accepted/rejected, messages and bytes relayed, results sent.")
      .def("close", &FeedServer::Close, Release(), "Drops every connection and joins all threads.  Idempotent.");
}

void BindFeedClient(nb::module_& m) {
  nb::class_<FeedClient>(m, "FeedClient",
                         "A feeding task's connection to a node's feed server on another host.\n"
                         "One thread may write while another reads; close() is thread-safe.")
      .def_static(
          "connect",
          [](const std::string& host, int port, nb::bytes secret, double timeout, size_t max_message_bytes) {
            std::string key = BytesToString(secret);
            nb::gil_scoped_release release;
            return ValueOrThrow(FeedClient::Connect(host, port, key, SecondsToDuration(timeout), max_message_bytes));
          },
          "host"_a, "port"_a, "secret"_a, "timeout"_a = 10.0, "max_message_bytes"_a = size_t{64} << 20,
          "Connects and authenticates.  Unavailable (naming host:port) or Unauthenticated on failure.")
      .def(
          "write",
          [](FeedClient& self, uint32_t kind, nb::handle payload, double timeout) {
            BufferView view(payload);  // released with the GIL held, after `release` ends
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.Write(static_cast<FeedKind>(kind), view.bytes(), Deadline::After(SecondsToDuration(timeout)));
            }
            ThrowIfError(st);
          },
          "kind"_a, "payload"_a, "timeout"_a,
          "Sends one message (any contiguous buffer, not copied first).  Cancelled if the node\n"
          "terminated its feed; Aborted with the node's reason if it failed.")
      .def(
          "read",
          [](FeedClient& self, double timeout) {
            FeedKind kind{};
            std::vector<uint8_t> payload;
            Status st;
            {
              nb::gil_scoped_release release;
              st = self.Read(&kind, &payload, Deadline::After(SecondsToDuration(timeout)));
            }
            ThrowIfError(st);
            return nb::make_tuple(static_cast<uint32_t>(kind), OwnedArray(std::move(payload)));
          },
          "timeout"_a,
          "(kind, payload) of the next result message (RESULTS, END_RESULTS or ERROR, whose payload\n"
          "is the reason as UTF-8).  DeadlineExceeded, with nothing consumed, after `timeout` seconds.")
      .def_prop_ro("peer", &FeedClient::peer)
      .def("close", &FeedClient::Close, Release(), "Closes the connection.  Idempotent.");
}

}  // namespace

void BindFeed(nb::module_& m) {
  BindShmRing(m);
  BindFeedServer(m);
  BindFeedClient(m);
}

}  // namespace ember::python
