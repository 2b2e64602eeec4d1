// CoordinatorRelay: the coordinator's endpoint inside the job (ember/coordinator.h).
//
// Two tcp::Servers, one per port, each serving a connection on its own
// thread after the handshake:
//   node port   ServeNode: park the node's connection (nothing of it read;
//               first waiting for the control connection if it is not up),
//               send RelayOpen{id} on the control connection, wait for the
//               agent's data connection of that id (open_timeout), then splice
//               the two on this thread.
//   agent port  ServeAgent: the first frame says what the connection is.
//               RelayControl: the control connection (ServeControl reads the
//               heartbeats); RelayData{id}: pair with parked node `id`, then
//               wait while the node's thread splices.
// and a monitor thread that holds the agent's lease (agent_timeout before the
// control connection arrives, and of silence on it), and that, once the relay
// ended, closes both servers: every node connection and tunnel goes down.
//
// All state sits behind `mu`.  Nothing writes to a socket or shuts one down
// while holding `mu` (Connection::Shutdown runs hooks under its own lock).
#include <map>
#include <memory>
#include <optional>
#include <thread>

#include "common/logging.h"
#include "common/mutex.h"
#include "coordinator/codec.h"
#include "coordinator/relay.h"
#include "ember/coordinator.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/server.h"
#include "transport/tcp/splice.h"

namespace ember {
namespace {

using Clock = std::chrono::steady_clock;
using coord::MsgType;
constexpr Duration kOpenWriteTimeout{5000};  // a RelayOpen the agent does not take this long ends its lease
// The data connection's thread waits while the node's thread splices; the end
// of the splice wakes it.  Its wait re-checks this often all the same.
constexpr Duration kRecheck{1000};
constexpr const char* kRelayName = "coordinator relay";

// A node connection and, once the agent opened it, its tunnel.  The fields
// are guarded by Impl::mu.
struct Tunnel {
  uint64_t id = 0;
  std::shared_ptr<tcp::Connection> node;
  std::shared_ptr<tcp::Connection> data;  // the agent's data connection, once paired
  bool done = false;                      // the splice ended
};

}  // namespace

struct CoordinatorRelay::Impl {
  RelayOptions options;
  std::string agent_address;  // "<bind_host>:<agent_port>", for messages
  std::unique_ptr<tcp::Server> node_server, agent_server;
  std::thread monitor;
  Clock::time_point started;

  Mutex close_mu;  // serializes Close()
  bool closed GUARDED_BY(close_mu) = false;

  mutable Mutex mu;
  CondVar cv;  // ended, control, last_heard's owner, pairings, tunnel ends
  bool ended GUARDED_BY(mu) = false;
  Status end_status GUARDED_BY(mu);
  bool closing GUARDED_BY(mu) = false;  // Close() began
  std::shared_ptr<tcp::Connection> control GUARDED_BY(mu);
  Clock::time_point last_heard GUARDED_BY(mu);  // the control connection's last frame
  uint64_t next_tunnel GUARDED_BY(mu) = 1;
  std::map<uint64_t, std::shared_ptr<Tunnel>> parked GUARDED_BY(mu);  // waiting for their data connection
  RelayStats stats GUARDED_BY(mu);

  Mutex control_write_mu;  // one RelayOpen frame at a time on the control connection

  // The first reason wins; wakes every wait.
  void EndLocked(Status why) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    if (ended) return;
    ended = true;
    end_status = std::move(why);
    cv.SignalAll();
    if (end_status.ok()) {
      EMBER_LOG(INFO) << kRelayName << ": the agent closed its control connection; the relay ends";
    } else if (end_status.code() != StatusCode::kCancelled) {
      EMBER_LOG(ERROR) << kRelayName << " ends: " << end_status.message();
    }
  }
  void End(Status why) LOCKS_EXCLUDED(mu) {
    MutexLock lock(&mu);
    EndLocked(std::move(why));
  }

  void MonitorLoop() LOCKS_EXCLUDED(mu);
  void ServeNode(tcp::Connection& link) LOCKS_EXCLUDED(mu);
  void ServeAgent(tcp::Connection& link) LOCKS_EXCLUDED(mu);
  void ServeControl(tcp::Connection& link) LOCKS_EXCLUDED(mu);
  void ServeData(tcp::Connection& link, uint64_t tunnel_id) LOCKS_EXCLUDED(mu);
  void Refuse(const std::string& peer, const std::string& why, bool error) LOCKS_EXCLUDED(mu);
};

CoordinatorRelay::CoordinatorRelay() : impl_(std::make_unique<Impl>()) {}
CoordinatorRelay::~CoordinatorRelay() { Close(); }

Result<std::unique_ptr<CoordinatorRelay>> CoordinatorRelay::Start(const RelayOptions& options) {
  if (options.secret.size() < 16) {
    return Status::InvalidArgument("RelayOptions.secret must be at least 16 bytes, got " +
                                   std::to_string(options.secret.size()));
  }
  if (options.handshake_timeout.count() <= 0 || options.agent_timeout.count() <= 0 ||
      options.open_timeout.count() <= 0 || options.max_parked == 0) {
    return Status::InvalidArgument(
        "RelayOptions: handshake_timeout, agent_timeout, open_timeout and max_parked must be positive");
  }
  EMBER_ASSIGN_OR_RAISE(std::string agent_secret, coord::RelayAgentSecret(options.secret));
  std::unique_ptr<CoordinatorRelay> relay(new CoordinatorRelay());
  Impl& impl = *relay->impl_;
  impl.options = options;
  impl.started = Clock::now();

  tcp::ServerOptions nodes;
  nodes.name = std::string(kRelayName) + " (node port)";
  nodes.bind_host = options.bind_host;
  nodes.port = options.node_port;
  nodes.secret = options.secret;
  nodes.handshake_timeout = options.handshake_timeout;
  EMBER_ASSIGN_OR_RAISE(impl.node_server,
                        tcp::Server::Start(nodes, [&impl](tcp::Connection& c) { impl.ServeNode(c); }));
  tcp::ServerOptions agents = nodes;
  agents.name = std::string(kRelayName) + " (agent port)";
  agents.port = options.agent_port;
  agents.secret = std::move(agent_secret);
  EMBER_ASSIGN_OR_RAISE(impl.agent_server,
                        tcp::Server::Start(agents, [&impl](tcp::Connection& c) { impl.ServeAgent(c); }));
  impl.agent_address = options.bind_host + ":" + std::to_string(impl.agent_server->port());
  impl.monitor = std::thread(&Impl::MonitorLoop, &impl);
  EMBER_LOG(INFO) << "Ember coordinator relay listening on " << options.bind_host << ":"
                  << impl.node_server->port() << " for nodes and on " << impl.agent_address
                  << " for its agent";
  return relay;
}

int CoordinatorRelay::node_port() const { return impl_->node_server->port(); }
int CoordinatorRelay::agent_port() const { return impl_->agent_server->port(); }

std::optional<Status> CoordinatorRelay::Wait(Duration timeout) {
  Impl& impl = *impl_;
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(&impl.mu);
  while (!impl.ended && impl.cv.WaitUntil(&impl.mu, deadline.when())) {
  }
  if (!impl.ended) return std::nullopt;
  return impl.end_status;
}

RelayStats CoordinatorRelay::stats() const {
  MutexLock lock(&impl_->mu);
  RelayStats s = impl_->stats;
  s.agent_connected = impl_->control != nullptr && !impl_->ended;
  return s;
}

void CoordinatorRelay::Close() {
  Impl& impl = *impl_;
  MutexLock close_lock(&impl.close_mu);
  if (impl.closed) return;
  impl.closed = true;
  {
    MutexLock lock(&impl.mu);
    impl.closing = true;
    impl.EndLocked(Status::Cancelled("the coordinator relay was closed"));
  }
  if (impl.monitor.joinable()) impl.monitor.join();
  if (impl.node_server) impl.node_server->Close();
  if (impl.agent_server) impl.agent_server->Close();
}

// The agent's lease, then the relay's end.
void CoordinatorRelay::Impl::MonitorLoop() {
  MutexLock lock(&mu);
  const auto first_by = started + options.agent_timeout;
  while (!ended && !control && cv.WaitUntil(&mu, first_by)) {
  }
  if (!ended && !control) {
    EndLocked(Status::DeadlineExceeded("no agent connected to the relay at " + agent_address + " within " +
                                       FormatDuration(options.agent_timeout)));
  }
  while (!ended) {
    const auto silent_by = last_heard + options.agent_timeout;
    if (Clock::now() >= silent_by) {
      EndLocked(Status::DeadlineExceeded("the relay's agent at " + control->peer() + " was silent for " +
                                         FormatDuration(options.agent_timeout)));
      break;
    }
    (void)cv.WaitUntil(&mu, silent_by);
  }
  if (closing) return;  // Close() closes the servers
  lock.Unlock();
  // Every node connection and tunnel goes down: the nodes see their
  // coordinator go away, as when a driver dies.
  node_server->Close();
  agent_server->Close();
}

void CoordinatorRelay::Impl::Refuse(const std::string& peer, const std::string& why, bool error) {
  {
    MutexLock lock(&mu);
    ++stats.nodes_refused;
  }
  if (error) {
    EMBER_LOG(ERROR) << kRelayName << ": closed the connection of node " << peer << ": " << why;
  } else {
    EMBER_LOG(WARN) << kRelayName << ": closed the connection of node " << peer << ": " << why;
  }
}

void CoordinatorRelay::Impl::ServeNode(tcp::Connection& link) {
  const std::string& peer = link.peer();
  auto tunnel = std::make_shared<Tunnel>();
  std::shared_ptr<tcp::Connection> agent;
  {
    MutexLock lock(&mu);
    // The agent dials right after the relay reported its ports, and its control connection may
    // be still on its way: a node waits for it as long as it would wait for its tunnel.  (Once
    // the agent has left, the relay has ended.)
    const Deadline arrive = Deadline::After(options.open_timeout);
    while (!control && !ended && cv.WaitUntil(&mu, arrive.when())) {
    }
    if (ended) {
      lock.Unlock();
      return Refuse(peer, "the relay has ended", false);
    }
    if (!control) {
      lock.Unlock();
      return Refuse(peer, "no agent connected to the relay within open_timeout (" +
                              FormatDuration(options.open_timeout) + "; the client's RelayAgent has not dialled " +
                              agent_address + ")", false);
    }
    if (parked.size() >= options.max_parked) {
      lock.Unlock();
      return Refuse(peer, std::to_string(options.max_parked) +
                              " node connections already wait for their tunnel (max_parked)", true);
    }
    tunnel->id = next_tunnel++;
    tunnel->node = link.shared_from_this();
    parked[tunnel->id] = tunnel;
    agent = control;
  }
  Status asked;
  {
    MutexLock write_lock(&control_write_mu);
    asked = tcp::WriteFrame(agent->fd(), static_cast<uint16_t>(MsgType::kRelayOpen),
                            coord::Encode(coord::RelayOpenPush{.tunnel_id = tunnel->id}),
                            Deadline::After(kOpenWriteTimeout), agent->peer());
  }
  if (!asked.ok()) {
    End(Status::Unavailable("cannot ask the relay's agent at " + agent->peer() + " for a tunnel: " +
                            asked.message()));
    {
      MutexLock lock(&mu);
      parked.erase(tunnel->id);
    }
    return Refuse(peer, "the agent did not take the tunnel request", false);
  }

  const Deadline deadline = Deadline::After(options.open_timeout);
  std::shared_ptr<tcp::Connection> data;
  {
    MutexLock lock(&mu);
    while (!tunnel->data && !ended && cv.WaitUntil(&mu, deadline.when())) {
    }
    data = tunnel->data;
    if (!data) {
      parked.erase(tunnel->id);
      const bool was_ended = ended;
      lock.Unlock();
      return Refuse(peer, was_ended ? "the relay ended before its tunnel opened"
                                    : "the agent opened no tunnel for it within open_timeout (" +
                                          FormatDuration(options.open_timeout) + ")",
                    false);
    }
  }
  const tcp::SpliceResult r =
      tcp::Splice(link.fd(), data->fd(), "node " + peer, "the agent's tunnel " + data->peer());
  link.Shutdown();
  data->Shutdown();
  {
    MutexLock lock(&mu);
    tunnel->done = true;
    --stats.tunnels_active;
    cv.SignalAll();
  }
  EMBER_LOG(DEBUG) << kRelayName << ": tunnel " << tunnel->id << " of node " << peer << " ended ("
                   << (r.status.ok() ? r.closed_by + " closed" : r.status.message()) << "; " << r.a_to_b
                   << " bytes to the coordinator, " << r.b_to_a << " back)";
}

void CoordinatorRelay::Impl::ServeAgent(tcp::Connection& link) {
  Result<tcp::Frame> first = tcp::ReadFrame(link.fd(), coord::kMaxRelayFrameBytes,
                                            Deadline::After(options.handshake_timeout), link.peer());
  if (!first.ok()) {
    if (!link.shut_down()) {
      EMBER_LOG(ERROR) << kRelayName << ": closed the agent-port connection from " << link.peer()
                       << " before its first frame: " << first.status().message();
    }
    return;
  }
  const std::string_view kind = coord::MsgTypeName(first->type);
  if (first->type == static_cast<uint16_t>(MsgType::kRelayControl)) {
    Result<coord::RelayControlMessage> m = coord::DecodeRelayControl(first->payload);
    if (m.ok() && m->version != coord::kRelayVersion) {
      m = Status::InvalidArgument("it speaks relay version " + std::to_string(m->version) + ", this relay " +
                                  std::to_string(coord::kRelayVersion) +
                                  " (client and executors must run the same Ember version)");
    }
    if (!m.ok()) {
      EMBER_LOG(ERROR) << kRelayName << ": refused the control connection from " << link.peer() << ": "
                       << m.status().message();
      return;
    }
    return ServeControl(link);
  }
  if (first->type == static_cast<uint16_t>(MsgType::kRelayData)) {
    Result<coord::RelayDataMessage> m = coord::DecodeRelayData(first->payload);
    if (!m.ok()) {
      EMBER_LOG(ERROR) << kRelayName << ": refused the data connection from " << link.peer() << ": "
                       << m.status().message();
      return;
    }
    return ServeData(link, m->tunnel_id);
  }
  EMBER_LOG(ERROR) << kRelayName << ": closed the agent-port connection from " << link.peer()
                   << ": its first frame is " << kind << " (type " << first->type
                   << "), not RelayControl or RelayData";
}

void CoordinatorRelay::Impl::ServeControl(tcp::Connection& link) {
  {
    MutexLock lock(&mu);
    if (ended) return;
    if (control) {
      const std::string holder = control->peer();
      lock.Unlock();
      EMBER_LOG(ERROR) << kRelayName << ": refused a second control connection from " << link.peer()
                       << ": the agent at " << holder << " holds the control connection";
      return;
    }
    control = link.shared_from_this();
    last_heard = Clock::now();
    cv.SignalAll();
  }
  EMBER_LOG(INFO) << kRelayName << ": agent connected from " << link.peer();
  for (;;) {
    Result<tcp::Frame> frame =
        tcp::ReadFrame(link.fd(), coord::kMaxRelayFrameBytes, Deadline::Infinite(), link.peer());
    if (!frame.ok()) {
      const Status& st = frame.status();
      if (st.code() == StatusCode::kUnavailable) {
        End(Status::OK());  // the agent closed it
      } else if (st.code() == StatusCode::kCorruption) {
        End(st);
      } else {
        End(Status::Unavailable("the control connection of the relay's agent at " + link.peer() +
                                " failed: " + st.message()));
      }
      return;
    }
    if (frame->type != static_cast<uint16_t>(MsgType::kHeartbeat)) {
      return End(Status::Corruption("the relay's agent at " + link.peer() + " sent " +
                                    std::string(coord::MsgTypeName(frame->type)) + " (type " +
                                    std::to_string(frame->type) +
                                    ") on its control connection, where only Heartbeat belongs"));
    }
    if (Status st = coord::DecodeHeartbeat(frame->payload).status(); !st.ok()) {
      return End(st.WithContext("from the relay's agent at " + link.peer()));
    }
    MutexLock lock(&mu);
    last_heard = Clock::now();
  }
}

void CoordinatorRelay::Impl::ServeData(tcp::Connection& link, uint64_t tunnel_id) {
  MutexLock lock(&mu);
  if (ended) return;
  auto it = parked.find(tunnel_id);
  if (it == parked.end()) {
    lock.Unlock();
    EMBER_LOG(ERROR) << kRelayName << ": closed the data connection from " << link.peer() << " for tunnel "
                     << tunnel_id << ": no node waits for it (it passed open_timeout, or never was)";
    return;
  }
  std::shared_ptr<Tunnel> tunnel = it->second;
  parked.erase(it);
  tunnel->data = link.shared_from_this();
  ++stats.tunnels_opened;
  ++stats.tunnels_active;
  cv.SignalAll();
  // The node's thread splices; this connection lives until it is done.  The
  // splice ends when either socket is shut down, which the relay's end does.
  while (!tunnel->done) (void)cv.WaitUntil(&mu, Deadline::After(kRecheck).when());
}

}  // namespace ember
