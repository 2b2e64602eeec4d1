// FeedServer: a tcp::Server user (listener, handshake and connection threads
// are the transport's); one handler per producer connection, one result
// pump per inference connection.  See feed_server.h for the protocol.
#include "feed/feed_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "feed/codec.h"
#include "feed/feed_ring.h"
#include "feed/feed_wire.h"
#include "transport/shm/ring.h"
#include "transport/tcp/server.h"
#include "transport/tcp/socket.h"

namespace ember::feed {
namespace {

// Blocking waits are cut into ticks of this length so that a node failure
// and Close() are noticed promptly.
constexpr Duration kTick{100};
// kAwaitEpoch is answered within this long (begun, or not yet: the driver asks again).
constexpr Duration kAwaitAnswer{1000};
constexpr Duration kAwaitPoll{20};
// After sending kError the server stops writing and drains what the producer
// still sends for this long before closing: closing with unread bytes would
// reset the connection and could destroy the kError in flight.
constexpr Duration kLinger{1000};
constexpr Duration kErrorWriteTimeout{5000};

std::atomic<uint64_t> g_next_server_id{1};

std::span<const uint8_t> TextBytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class Connection;

}  // namespace

struct FeedServer::Impl {
  FeedServerOptions options;
  uint64_t server_id = 0;
  // Listener, handshake and connection threads; runs Serve() per producer.
  std::unique_ptr<tcp::Server> server;
  // The node's ring, for its health only (each connection opens its own to write).
  std::unique_ptr<shm::Ring> node_ring;
  // Live connections, so that Close() can tell their producers how the node
  // ended (its launcher settles the ring, then closes this server) before the
  // transport shuts their sockets.
  Mutex conns_mu;
  std::set<Connection*> conns GUARDED_BY(conns_mu);

  std::atomic<uint64_t> messages{0}, bytes{0}, results{0};

  void Serve(tcp::Connection& link);
};

namespace {

// One producer's connection, alive while the transport runs its handler.
// The handler's thread reads frames and writes the node's ring; the pump
// thread (inference only) drains result rings to the socket.  Socket writes
// from both are serialized by write_mu_.  The transport owns the socket and
// only shuts it down while either thread may use it.
class Connection {
 public:
  Connection(FeedServer::Impl* server, tcp::Connection& link)
      : server_(server), options_(server->options), idle_timeout_(server->options.idle_timeout), link_(link),
        id_(link.id()), fd_(link.fd()), peer_(link.peer()) {
    link_.OnShutdown([this] { Stop(); });  // FeedServer::Close(): wake the pump and the tick loops
    MutexLock lock(&server_->conns_mu);
    server_->conns.insert(this);
  }
  ~Connection() {
    {
      MutexLock lock(&server_->conns_mu);
      server_->conns.erase(this);
    }
    link_.OnShutdown(nullptr);
  }
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  void Serve();
  // Any thread: sends `why` as the connection's one kError (see Fail).
  void Tell(const Status& why) { Fail(why); }

 private:
  // Any thread: makes the connection's threads finish promptly.
  void Stop() {
    stop_ = true;
    WakePump();
    ::shutdown(fd_, SHUT_RDWR);
  }

  Status ReadLoop();
  Status WaitForFrame(bool* eof);
  Status Handle(uint32_t kind, std::vector<uint8_t>* payload);
  Status Begin(std::vector<uint8_t>* payload);
  Status EndPartition(std::span<const uint8_t> payload);
  Status Forward(FeedKind kind, std::span<const uint8_t> payload);
  Status LockSession();
  Status AwaitEpoch(std::span<const uint8_t> payload);
  // Aborted, not Cancelled: producers read Cancelled as "the node terminated its feed".
  Status Closing() const { return Status::Aborted("the node's feed server is shutting down"); }

  void Fail(const Status& status);
  void Linger();

  void QueueResultRing(std::unique_ptr<shm::Ring> ring);
  void WakePump();
  void StopPump();
  void PumpLoop();
  bool DrainResultRing(shm::Ring* results);  // true when the partition's answers all went out
  bool SendToProducer(uint32_t kind, std::span<const uint8_t> payload);

  FeedServer::Impl* const server_;
  const FeedServerOptions& options_;
  // options_.idle_timeout until the producer's kHello says otherwise (its
  // FeedOptions.idle_timeout); set only before the pump thread starts, but
  // read by Fail() from any thread (FeedServer::Close), hence atomic.
  std::atomic<Duration> idle_timeout_;
  Duration IdleTimeout() const { return idle_timeout_.load(std::memory_order_relaxed); }
  bool first_frame_ = true;  // connection thread only
  tcp::Connection& link_;
  const uint64_t id_;
  const int fd_;  // link_'s
  const std::string peer_;
  std::atomic<bool> stop_{false};

  // The node's ring, opened by this connection (a shm::Ring tracks the session
  // lock per object and thread).  Set before, and reset after, the pump runs.
  std::unique_ptr<shm::Ring> ring_;
  // Connection thread only.
  bool session_held_ = false;
  uint32_t session_partition_ = 0;
  uint32_t session_epoch_ = 0;
  uint64_t next_result_seq_ = 0;

  Mutex write_mu_;  // one frame at a time on fd_
  bool error_sent_ GUARDED_BY(write_mu_) = false;  // after the kError nothing more is written

  Mutex pump_mu_;
  CondVar pump_cv_;
  std::deque<std::unique_ptr<shm::Ring>> pending_results_ GUARDED_BY(pump_mu_);
  std::thread pump_;
};

// Runs after the handshake (tcp::Server does it).
void Connection::Serve() {
  EMBER_LOG(DEBUG) << "feed server: producer connected from " << peer_;

  Result<std::unique_ptr<shm::Ring>> ring = OpenFeedRing(options_.ring_name);
  Status st = ring.status();
  if (ring.ok()) {
    ring_ = ring.MoveValueUnsafe();
    st = ReadLoop();
  }
  if (!st.ok()) Fail(stop_ ? Closing() : st);  // once stopping, errors are just the shutdown
  // Another producer may be waiting for the node: release the session first.
  if (session_held_) {
    ring_->UnlockSession();
    session_held_ = false;
  }
  StopPump();
  ring_.reset();
  bool lingers;
  {
    MutexLock lock(&write_mu_);
    lingers = error_sent_;
  }
  if (lingers) Linger();
  ::shutdown(fd_, SHUT_RDWR);
}

Status Connection::ReadLoop() {
  uint32_t kind = 0;
  std::vector<uint8_t> payload;
  for (;;) {
    bool eof = false;
    EMBER_RETURN_NOT_OK(WaitForFrame(&eof));
    if (eof) return Status::OK();
    EMBER_RETURN_NOT_OK(RecvFeedFrame(fd_, options_.max_message_bytes, Deadline::After(IdleTimeout()),
                                      peer_, &kind, &payload));
    EMBER_RETURN_NOT_OK(Handle(kind, &payload));
  }
}

// Waits, tick by tick, until a frame starts (or the producer closed at a
// frame boundary: *eof), checking between ticks that the node still reads.
Status Connection::WaitForFrame(bool* eof) {
  for (;;) {
    if (stop_) return Closing();
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, static_cast<int>(kTick.count()));
    if (rc < 0 && errno != EINTR) return Status::FromErrno(errno, "poll feed connection from " + peer_);
    if (rc > 0) {
      char byte;
      const ssize_t n = ::recv(fd_, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n > 0) return Status::OK();
      if (n == 0) {
        *eof = true;
        return Status::OK();
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return Status::FromErrno(errno, "read feed connection from " + peer_);
      }
    }
    EMBER_RETURN_NOT_OK(ring_->Health());
  }
}

Status Connection::Handle(uint32_t kind, std::vector<uint8_t>* payload) {
  const bool first = first_frame_;
  first_frame_ = false;
  if (static_cast<FeedKind>(kind) == FeedKind::kHello) {
    if (!first) return Status::InvalidArgument("kHello from " + peer_ + " after other frames: it must come first");
    EMBER_ASSIGN_OR_RAISE(Hello hello, DecodeHello(*payload));
    idle_timeout_.store(hello.idle_timeout, std::memory_order_relaxed);  // the producer's FeedOptions.idle_timeout, for this connection
    return Status::OK();
  }
  switch (static_cast<FeedKind>(kind)) {
    case FeedKind::kFlush:
      // Frames are relayed in order on this thread, so every earlier one is in the ring now.
      if (!payload->empty()) return Status::InvalidArgument("kFlush from " + peer_ + " carries a payload");
      if (!SendToProducer(static_cast<uint32_t>(FeedKind::kFlushed), {})) return Closing();
      return Status::OK();
    case FeedKind::kAwaitEpoch:
      return AwaitEpoch(*payload);
    case FeedKind::kBeginPartition:
      return Begin(payload);
    case FeedKind::kEndPartition:
      return EndPartition(*payload);
    case FeedKind::kBatch:
    case FeedKind::kEndFeed:
    case FeedKind::kEndEpoch: {
      Status valid = ValidateMessage(kind, *payload);  // fail here, naming the peer, not in the node
      if (!valid.ok()) return valid.WithContext("feed message from " + peer_);
      return Forward(static_cast<FeedKind>(kind), *payload);
    }
    default:
      return Status::InvalidArgument("feed message of kind " + std::to_string(kind) + " (" + KindName(kind) +
                                     ") from " + peer_ + " is not one a producer sends");
  }
}

Status Connection::Begin(std::vector<uint8_t>* payload) {
  EMBER_ASSIGN_OR_RAISE(BeginPartition begin, DecodeBeginPartition(*payload));
  if (session_held_) {
    return Status::InvalidArgument("kBeginPartition for partition " + std::to_string(begin.partition) + " from " +
                                   peer_ + " while partition " + std::to_string(session_partition_) +
                                   " is still open: send kEndPartition first");
  }
  if (!begin.result_ring.empty()) {
    return Status::InvalidArgument("kBeginPartition from " + peer_ + " names result ring '" + begin.result_ring +
                                   "': over TCP the name must be empty (the node's feed server makes the ring)");
  }
  EMBER_RETURN_NOT_OK(LockSession());
  session_held_ = true;
  session_partition_ = begin.partition;
  session_epoch_ = begin.epoch;
  if (begin.wants_results()) {
    begin.result_ring = options_.result_ring_prefix + "-" + std::to_string(getpid()) + "-" +
                        std::to_string(server_->server_id) + "-" + std::to_string(id_) + "-" +
                        std::to_string(begin.partition) + "-" + std::to_string(next_result_seq_++);
    EMBER_ASSIGN_OR_RAISE(std::unique_ptr<shm::Ring> results,
                          CreateFeedRing(begin.result_ring, options_.result_ring_capacity));
    QueueResultRing(std::move(results));
    *payload = EncodeBeginPartition(begin);
  }
  return Forward(FeedKind::kBeginPartition, *payload);
}

Status Connection::EndPartition(std::span<const uint8_t> payload) {
  Result<EndPartitionMsg> end = DecodeEndPartition(payload);
  if (!end.ok()) return end.status().WithContext("from " + peer_);
  const uint32_t partition = end->partition, epoch = end->epoch;
  if (session_held_ && (partition != session_partition_ || epoch != session_epoch_)) {
    return Status::InvalidArgument("kEndPartition for partition " + std::to_string(partition) + " epoch " +
                                   std::to_string(epoch) + " from " + peer_ + " does not match the open partition " +
                                   std::to_string(session_partition_) + " epoch " + std::to_string(session_epoch_));
  }
  EMBER_RETURN_NOT_OK(Forward(FeedKind::kEndPartition, payload));
  if (session_held_) {
    ring_->UnlockSession();
    session_held_ = false;
  }
  return Status::OK();
}

// Writes into the node's ring, tick by tick so Close() is noticed, failing
// once the ring stays full for idle_timeout.
Status Connection::Forward(FeedKind kind, std::span<const uint8_t> payload) {
  const Deadline idle = Deadline::After(IdleTimeout());
  for (;;) {
    if (stop_) return Closing();
    Status st = ring_->Write(static_cast<uint32_t>(kind), payload, std::min(idle, Deadline::After(kTick)));
    if (st.ok()) {
      ++server_->messages;
      server_->bytes += payload.size();
      return st;
    }
    if (st.code() != StatusCode::kDeadlineExceeded || idle.expired()) return st;
  }
}

// Answers the driver's kAwaitEpoch within kAwaitAnswer: whether the node
// began the epoch, and how far it has read (the driver's idle clock).  A
// node that terminated its feed fails the call with Cancelled, which goes
// back as kError "Cancelled: ..." like every other reason the node stopped.
Status Connection::AwaitEpoch(std::span<const uint8_t> payload) {
  Result<AwaitEpochMsg> m = DecodeAwaitEpoch(payload);
  if (!m.ok()) return m.status().WithContext("from " + peer_);
  const Deadline answer_by = Deadline::After(kAwaitAnswer);
  shm::RingProgress progress;
  for (;;) {
    if (stop_) return Closing();
    EMBER_RETURN_NOT_OK(ring_->Progress(&progress));
    if (progress.mark > m->epoch || answer_by.expired()) break;
    std::this_thread::sleep_for(kAwaitPoll);
  }
  EpochStateMsg state;
  state.begun = progress.mark > m->epoch;
  state.read_bytes = progress.read;
  if (!SendToProducer(static_cast<uint32_t>(FeedKind::kEpochState), EncodeEpochState(state))) return Closing();
  return Status::OK();
}

// shm::Ring::LockSession(idle_timeout) in ticks, so Close() is noticed.  A tick
// only times out when the node consumed nothing during it; a call that ran
// longer saw the node consume, which restarts the idle clock.
Status Connection::LockSession() {
  using Clock = Deadline::Clock;
  Clock::time_point idle_since = Clock::now();
  for (;;) {
    if (stop_) return Closing();
    const Clock::time_point start = Clock::now();
    Status st = ring_->LockSession(kTick);
    if (st.ok() || st.code() != StatusCode::kDeadlineExceeded) return st;
    const Clock::time_point now = Clock::now();
    if (now - start > 2 * kTick) idle_since = now - kTick;
    if (now - idle_since >= IdleTimeout()) {
      return Status::DeadlineExceeded("feed ring " + ring_->name() + ": another feeding task held the node's session for " +
                                      FormatDuration(IdleTimeout()) + " while the node consumed nothing");
    }
  }
}

// Sends `status` to the producer as the connection's one kError frame, as
// "<code name>: <message>" ("Cancelled: ..." when the node terminated its
// feed, which the producer treats as "stop quietly"; docs/wire.md).
void Connection::Fail(const Status& status) {
  stop_ = true;
  WakePump();
  MutexLock lock(&write_mu_);
  if (error_sent_) return;
  error_sent_ = true;
  if (status.code() == StatusCode::kCancelled) {
    EMBER_LOG(INFO) << "feed server: closing connection from " << peer_ << ": " << status.message();
  } else {
    EMBER_LOG(WARN) << "feed server: failing connection from " << peer_ << ": " << status.ToString();
  }
  Status sent = SendFeedFrame(fd_, FeedKind::kError, TextBytes(status.ToString()),
                              Deadline::After(std::min(IdleTimeout(), kErrorWriteTimeout)), peer_);
  if (!sent.ok()) {
    EMBER_LOG(DEBUG) << "feed server: could not tell " << peer_ << ": " << sent.message();
  }
}

void Connection::Linger() {
  ::shutdown(fd_, SHUT_WR);
  const Deadline until = Deadline::After(kLinger);
  char buf[16384];
  while (!until.expired()) {
    pollfd p{fd_, POLLIN, 0};
    const int rc = ::poll(&p, 1, until.PollTimeoutMs());
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) return;
    const ssize_t n = ::recv(fd_, buf, sizeof(buf), MSG_DONTWAIT);
    if (n == 0) return;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return;
  }
}

void Connection::QueueResultRing(std::unique_ptr<shm::Ring> ring) {
  {
    MutexLock lock(&pump_mu_);
    pending_results_.push_back(std::move(ring));
  }
  pump_cv_.Signal();
  if (!pump_.joinable()) pump_ = std::thread(&Connection::PumpLoop, this);
}

void Connection::WakePump() {
  { MutexLock lock(&pump_mu_); }  // a waiter between its check and wait sees stop_
  pump_cv_.SignalAll();
}

void Connection::StopPump() {
  stop_ = true;
  WakePump();
  if (pump_.joinable()) pump_.join();
  MutexLock lock(&pump_mu_);
  for (auto& ring : pending_results_) ring->Abort("the feeding task's connection from " + peer_ + " ended");
  pending_results_.clear();  // closes and unlinks them
}

// Sends the node's answers back, one result ring (partition) after another.
void Connection::PumpLoop() {
  for (;;) {
    std::unique_ptr<shm::Ring> results;
    {
      MutexLock lock(&pump_mu_);
      while (!stop_ && pending_results_.empty()) pump_cv_.Wait(&pump_mu_);
      if (stop_) return;
      results = std::move(pending_results_.front());
      pending_results_.pop_front();
    }
    if (!DrainResultRing(results.get())) {
      results->Abort("the feeding task's connection from " + peer_ + " ended");
      return;
    }
  }
}

bool Connection::DrainResultRing(shm::Ring* results) {
  uint32_t kind = 0;
  std::vector<uint8_t> payload;
  for (;;) {
    if (stop_) return false;
    Status st = results->Read(&kind, &payload, Deadline::After(kTick));
    if (st.code() == StatusCode::kDeadlineExceeded) {
      // The node writes here only while it lives; notice its failure.
      Status health = ring_->Health();
      if (!health.ok()) {
        Fail(health);
        return false;
      }
      continue;
    }
    if (!st.ok()) {
      Fail(st);
      return false;
    }
    const auto k = static_cast<FeedKind>(kind);
    if (k != FeedKind::kResults && k != FeedKind::kEndResults && k != FeedKind::kError) {
      Fail(Status::Internal("the node wrote a message of kind " + std::to_string(kind) + " (" + KindName(kind) +
                            ") into result ring " + results->name()));
      return false;
    }
    if (!SendToProducer(kind, payload)) return false;
    if (k != FeedKind::kResults) return true;
  }
}

bool Connection::SendToProducer(uint32_t kind, std::span<const uint8_t> payload) {
  MutexLock lock(&write_mu_);
  if (error_sent_) return false;
  Status st = SendFeedFrame(fd_, static_cast<FeedKind>(kind), payload,
                            Deadline::After(IdleTimeout()), peer_);
  if (!st.ok()) {
    EMBER_LOG(WARN) << "feed server: dropping connection from " << peer_ << ": " << st.ToString();
    error_sent_ = true;  // the producer is unreachable: nothing more to tell it
    stop_ = true;
    ::shutdown(fd_, SHUT_RDWR);
    return false;
  }
  ++server_->results;
  return true;
}

}  // namespace

void FeedServer::Impl::Serve(tcp::Connection& link) {
  Connection conn(this, link);
  conn.Serve();
}

FeedServer::FeedServer() : impl_(std::make_unique<Impl>()) {}

FeedServer::~FeedServer() { Close(); }

Result<std::unique_ptr<FeedServer>> FeedServer::Start(const FeedServerOptions& options) {
  if (options.secret.size() < 16) {
    return Status::InvalidArgument("FeedServerOptions.secret must be at least 16 bytes, got " +
                                   std::to_string(options.secret.size()));
  }
  const std::string& prefix = options.result_ring_prefix;
  if (prefix.size() < 2 || prefix.size() > 200 || prefix[0] != '/' || prefix.find('/', 1) != std::string::npos) {
    return Status::InvalidArgument("FeedServerOptions.result_ring_prefix must look like \"/name\" (one leading "
                                   "slash, at most 200 bytes), got \"" + prefix + "\"");
  }
  if (options.max_message_bytes < 64) {
    return Status::InvalidArgument("FeedServerOptions.max_message_bytes must be >= 64");
  }
  if (options.idle_timeout.count() <= 0 || options.handshake_timeout.count() <= 0) {
    return Status::InvalidArgument("FeedServerOptions: idle_timeout and handshake_timeout must be positive");
  }
  // Fail early if the node's ring is missing; each connection opens its own.
  EMBER_ASSIGN_OR_RAISE(std::unique_ptr<shm::Ring> node_ring, OpenFeedRing(options.ring_name));
  std::unique_ptr<FeedServer> server(new FeedServer());
  Impl& impl = *server->impl_;
  impl.node_ring = std::move(node_ring);
  impl.options = options;
  impl.server_id = g_next_server_id++;
  tcp::ServerOptions transport;
  transport.name = "feed server";
  transport.bind_host = options.bind_host;
  transport.port = options.port;
  transport.secret = options.secret;
  transport.handshake_timeout = options.handshake_timeout;
  EMBER_ASSIGN_OR_RAISE(impl.server,
                        tcp::Server::Start(transport, [&impl](tcp::Connection& c) { impl.Serve(c); }));
  EMBER_LOG(INFO) << "Ember feed server listening on " << options.bind_host << ":" << impl.server->port() << " for ring "
                  << options.ring_name;
  return server;
}

int FeedServer::port() const { return impl_->server->port(); }

FeedServerStats FeedServer::stats() const {
  FeedServerStats s;
  const tcp::ServerStats transport = impl_->server->stats();
  s.connections_accepted = transport.accepted;
  s.connections_rejected = transport.rejected;
  s.messages_relayed = impl_->messages;
  s.bytes_relayed = impl_->bytes;
  s.results_sent = impl_->results;
  return s;
}

void FeedServer::Close() {
  if (impl_->node_ring) {
    const Status why = impl_->node_ring->Health();
    if (!why.ok()) {  // the node failed or terminated its feed: say so, not "connection closed"
      MutexLock lock(&impl_->conns_mu);
      for (Connection* c : impl_->conns) c->Tell(why);
    }
  }
  // Stops accepting; each connection's Stop() runs as its shutdown hook.
  if (impl_->server) impl_->server->Close();
}

}  // namespace ember::feed
