// RelayAgent: the client's side of the coordinator relay (ember/coordinator.h).
//
// Threads: a reader on the control connection (one RelayOpen{id} per node
// that dialled the relay: it starts that tunnel's thread, and joins the
// tunnels that finished), a heartbeat writer (the control connection's only
// writer after Connect), and one thread per tunnel: dial the relay's agent
// port, say RelayData{id}, dial the coordinator, splice the two.
//
// Close(), or the control connection ending, shuts every socket down under
// `mu` (so each blocked thread wakes); a socket's descriptor is published in
// `mu` only while its owner holds it open, so a shutdown never hits a reused
// descriptor.
#include <sys/socket.h>

#include <atomic>
#include <list>
#include <memory>
#include <thread>
#include <vector>

#include "common/fd.h"
#include "common/finished.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "coordinator/codec.h"
#include "coordinator/relay.h"
#include "ember/coordinator.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/splice.h"

namespace ember {
namespace {

using coord::MsgType;
constexpr Duration kAgentWriteTimeout{5000};
constexpr const char* kAgentName = "relay agent";

// One tunnel's thread and the descriptors Close() must shut down (-1 while
// not held).  The descriptors are guarded by Impl::mu.
struct AgentTunnel {
  uint64_t id = 0;
  std::thread thread;
  std::atomic<bool> finished{false};
  int relay_fd = -1;
  int coordinator_fd = -1;
};

}  // namespace

struct RelayAgent::Impl {
  std::string relay_host;
  int agent_port = 0;
  std::string relay_address;  // "host:port" of the relay's agent port
  std::string agent_secret;   // coord::RelayAgentSecret(secret)
  std::string secret;
  std::string coordinator_host;
  int coordinator_port = 0;
  std::string coordinator_address;
  RelayAgentOptions options;
  Fd control;  // closed only by Close(), after every thread is joined
  std::thread reader, heartbeat;

  Mutex close_mu;  // serializes Close()
  bool closed GUARDED_BY(close_mu) = false;

  mutable Mutex mu;
  CondVar cv;                            // stopping
  bool stopping GUARDED_BY(mu) = false;  // Close() began, or the control connection ended
  Status status GUARDED_BY(mu);
  std::list<std::unique_ptr<AgentTunnel>> tunnels GUARDED_BY(mu);
  RelayAgentStats stats GUARDED_BY(mu);

  // Shuts the control connection and every tunnel down; their threads wake.
  void ShutdownAllLocked() EXCLUSIVE_LOCKS_REQUIRED(mu) {
    ::shutdown(control.get(), SHUT_RDWR);
    for (const auto& t : tunnels) {
      if (t->relay_fd >= 0) ::shutdown(t->relay_fd, SHUT_RDWR);
      if (t->coordinator_fd >= 0) ::shutdown(t->coordinator_fd, SHUT_RDWR);
    }
  }

  // The control connection ended: the first reason is kept, the tunnels close.
  void Stop(Status why) LOCKS_EXCLUDED(mu) {
    MutexLock lock(&mu);
    if (stopping) return;
    stopping = true;
    status = std::move(why);
    EMBER_LOG(WARN) << kAgentName << ": " << status.message() << "; closing its tunnels";
    ShutdownAllLocked();
    cv.SignalAll();
  }

  void ReaderLoop() LOCKS_EXCLUDED(mu);
  void HeartbeatLoop() LOCKS_EXCLUDED(mu);
  void StartTunnel(uint64_t id) LOCKS_EXCLUDED(mu);
  void RunTunnel(AgentTunnel* tunnel) LOCKS_EXCLUDED(mu);
  // Publishes `fd` in `*slot` for ShutdownAllLocked; false once stopping.
  bool Hold(int fd, int* slot) LOCKS_EXCLUDED(mu);
  void ReapFinished() LOCKS_EXCLUDED(mu);
};

RelayAgent::RelayAgent() : impl_(std::make_unique<Impl>()) {}
RelayAgent::~RelayAgent() { Close(); }

Result<std::unique_ptr<RelayAgent>> RelayAgent::Connect(const std::string& relay_host, int agent_port,
                                                        const std::string& secret,
                                                        const std::string& coordinator_host, int coordinator_port,
                                                        const RelayAgentOptions& options) {
  if (secret.size() < 16) {
    return Status::InvalidArgument("the job secret must be at least 16 bytes, got " +
                                   std::to_string(secret.size()));
  }
  if (options.connect_timeout.count() <= 0 || options.heartbeat_interval.count() <= 0) {
    return Status::InvalidArgument("RelayAgentOptions: connect_timeout and heartbeat_interval must be positive");
  }
  std::unique_ptr<RelayAgent> agent(new RelayAgent());
  Impl& impl = *agent->impl_;
  impl.relay_host = relay_host;
  impl.agent_port = agent_port;
  impl.relay_address = relay_host + ":" + std::to_string(agent_port);
  EMBER_ASSIGN_OR_RAISE(impl.agent_secret, coord::RelayAgentSecret(secret));
  impl.secret = secret;
  impl.coordinator_host = coordinator_host;
  impl.coordinator_port = coordinator_port;
  impl.coordinator_address = coordinator_host + ":" + std::to_string(coordinator_port);
  impl.options = options;

  const Deadline deadline = Deadline::After(options.connect_timeout);
  const std::string within = " within " + FormatDuration(options.connect_timeout) + ": ";
  bool connect_failed = false;
  Result<Fd> fd = tcp::Dial(relay_host, agent_port, impl.agent_secret, deadline, impl.relay_address, &connect_failed);
  if (!fd.ok()) {
    const Status& st = fd.status();
    if (st.code() == StatusCode::kUnauthenticated) {
      return Status::Unauthenticated("the coordinator relay at " + impl.relay_address +
                                     " does not take this job's agent key (another job's relay?): " + st.message());
    }
    return Status::Unavailable("cannot reach the coordinator relay at " + impl.relay_address + within +
                               st.message() +
                               (connect_failed ? ". Is the relay running, and can this client reach the "
                                                 "executor it runs on?"
                                               : ""));
  }
  Status said = tcp::WriteFrame(fd->get(), static_cast<uint16_t>(MsgType::kRelayControl),
                                coord::Encode(coord::RelayControlMessage{}), deadline, impl.relay_address);
  if (!said.ok()) {
    return Status::Unavailable("cannot open the control connection to the coordinator relay at " +
                               impl.relay_address + ": " + said.message());
  }
  impl.control = fd.MoveValueUnsafe();
  impl.reader = std::thread(&Impl::ReaderLoop, &impl);
  impl.heartbeat = std::thread(&Impl::HeartbeatLoop, &impl);
  EMBER_LOG(INFO) << "Ember relay agent connected to the coordinator relay at " << impl.relay_address
                  << "; its tunnels lead to the coordinator at " << impl.coordinator_address;
  return agent;
}

bool RelayAgent::ok() const { return status().ok(); }

Status RelayAgent::status() const {
  MutexLock lock(&impl_->mu);
  return impl_->status;
}

RelayAgentStats RelayAgent::stats() const {
  MutexLock lock(&impl_->mu);
  return impl_->stats;
}

void RelayAgent::Close() {
  Impl& impl = *impl_;
  MutexLock close_lock(&impl.close_mu);
  if (impl.closed) return;
  impl.closed = true;
  {
    MutexLock lock(&impl.mu);
    if (!impl.stopping) {
      impl.stopping = true;
      impl.status = Status::Cancelled("the relay agent was closed");
    }
    impl.ShutdownAllLocked();
    impl.cv.SignalAll();
  }
  if (impl.heartbeat.joinable()) impl.heartbeat.join();
  if (impl.reader.joinable()) impl.reader.join();
  std::list<std::unique_ptr<AgentTunnel>> tunnels;
  {
    MutexLock lock(&impl.mu);
    tunnels.swap(impl.tunnels);  // no new ones: the reader is gone
  }
  for (auto& t : tunnels) t->thread.join();
  (void)impl.control.Close();
}

void RelayAgent::Impl::ReaderLoop() {
  for (;;) {
    Result<tcp::Frame> frame =
        tcp::ReadFrame(control.get(), coord::kMaxRelayFrameBytes, Deadline::Infinite(), relay_address);
    if (!frame.ok()) {
      const Status& st = frame.status();
      if (st.code() == StatusCode::kUnavailable) {
        return Stop(Status::Unavailable("the coordinator relay at " + relay_address + " closed its connection"));
      }
      return Stop(Status::Unavailable("the control connection to the coordinator relay at " + relay_address +
                                      " failed: " + st.message()));
    }
    if (frame->type != static_cast<uint16_t>(MsgType::kRelayOpen)) {
      return Stop(Status::Corruption("the coordinator relay at " + relay_address + " sent " +
                                     std::string(coord::MsgTypeName(frame->type)) + " (type " +
                                     std::to_string(frame->type) +
                                     ") on the control connection, where only RelayOpen belongs"));
    }
    Result<coord::RelayOpenPush> open = coord::DecodeRelayOpen(frame->payload);
    if (!open.ok()) {
      return Stop(open.status().WithContext("from the coordinator relay at " + relay_address));
    }
    ReapFinished();
    StartTunnel(open->tunnel_id);
  }
}

void RelayAgent::Impl::HeartbeatLoop() {
  const std::string beat = coord::Encode(coord::HeartbeatMessage{});
  MutexLock lock(&mu);
  while (!stopping) {
    const Deadline next = Deadline::After(options.heartbeat_interval);
    while (!stopping && cv.WaitUntil(&mu, next.when())) {
    }
    if (stopping) break;
    lock.Unlock();
    Status sent = tcp::WriteFrame(control.get(), static_cast<uint16_t>(MsgType::kHeartbeat), beat,
                                  Deadline::After(kAgentWriteTimeout), relay_address);
    if (!sent.ok()) {
      Stop(Status::Unavailable("cannot send a heartbeat to the coordinator relay at " + relay_address + ": " +
                               sent.message()));
    }
    lock.Lock();
  }
}

void RelayAgent::Impl::StartTunnel(uint64_t id) {
  auto tunnel = std::make_unique<AgentTunnel>();
  tunnel->id = id;
  AgentTunnel* raw = tunnel.get();
  MutexLock lock(&mu);
  if (stopping) return;
  tunnels.push_back(std::move(tunnel));
  raw->thread = std::thread(&Impl::RunTunnel, this, raw);
}

bool RelayAgent::Impl::Hold(int fd, int* slot) {
  MutexLock lock(&mu);
  if (stopping) return false;
  *slot = fd;
  return true;
}

void RelayAgent::Impl::RunTunnel(AgentTunnel* tunnel) {
  const std::string what = "tunnel " + std::to_string(tunnel->id);
  Status failed;
  Fd relay, coordinator;
  Result<Fd> dialled = tcp::Dial(relay_host, agent_port, agent_secret, Deadline::After(options.connect_timeout),
                                 relay_address);
  if (!dialled.ok()) {
    failed = dialled.status().WithContext("cannot dial the coordinator relay at " + relay_address);
  } else {
    relay = dialled.MoveValueUnsafe();
    failed = tcp::WriteFrame(relay.get(), static_cast<uint16_t>(MsgType::kRelayData),
                             coord::Encode(coord::RelayDataMessage{.tunnel_id = tunnel->id}),
                             Deadline::After(kAgentWriteTimeout), relay_address);
  }
  if (failed.ok() && Hold(relay.get(), &tunnel->relay_fd)) {
    dialled = tcp::Dial(coordinator_host, coordinator_port, secret, Deadline::After(options.connect_timeout),
                        coordinator_address);
    if (!dialled.ok()) {
      failed = dialled.status().WithContext("cannot dial the coordinator at " + coordinator_address);
    } else {
      coordinator = dialled.MoveValueUnsafe();
    }
  }
  if (failed.ok() && coordinator.valid() && Hold(coordinator.get(), &tunnel->coordinator_fd)) {
    {
      MutexLock lock(&mu);
      ++stats.tunnels_opened;
      ++stats.tunnels_active;
    }
    const tcp::SpliceResult r = tcp::Splice(relay.get(), coordinator.get(), "the coordinator relay at " +
                                            relay_address + " (" + what + ")", "the coordinator at " +
                                            coordinator_address);
    EMBER_LOG(DEBUG) << kAgentName << ": " << what << " ended ("
                     << (r.status.ok() ? r.closed_by + " closed" : r.status.message()) << "; " << r.a_to_b
                     << " bytes to the coordinator, " << r.b_to_a << " back)";
    MutexLock lock(&mu);
    --stats.tunnels_active;
  } else if (!failed.ok()) {
    // The relay closes the node's connection when this one closes (or when its open_timeout passes).
    EMBER_LOG(WARN) << kAgentName << ": " << what << " not opened: " << failed.message();
  }
  {
    MutexLock lock(&mu);
    tunnel->relay_fd = tunnel->coordinator_fd = -1;  // before the descriptors close, below
  }
  if (relay.valid()) ::shutdown(relay.get(), SHUT_RDWR);
  if (coordinator.valid()) ::shutdown(coordinator.get(), SHUT_RDWR);
  (void)relay.Close();
  (void)coordinator.Close();
  tunnel->finished = true;
}

void RelayAgent::Impl::ReapFinished() {
  std::vector<std::unique_ptr<AgentTunnel>> done;
  {
    MutexLock lock(&mu);
    done = TakeFinished(tunnels);
  }
  JoinAll(done);
}

}  // namespace ember
