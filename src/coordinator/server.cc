// CoordinatorServer: lifecycle, the driver-side API, the monitor thread.
#include <algorithm>

#include "common/logging.h"
#include "coordinator/server_impl.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/socket.h"

namespace ember {
namespace {

constexpr Duration kMonitorTick{20};
constexpr Duration kWriteTimeout{5000};  // a peer that does not drain its socket this long is dropped
constexpr size_t kMaxQueuedEvents = 1 << 16;  // oldest dropped beyond this

std::string RoleName(const RoleAssignment& r) {
  return r.job_name + ":" + std::to_string(r.task_index);
}

}  // namespace

CoordinatorServer::CoordinatorServer() : impl_(std::make_unique<Impl>()) {}

CoordinatorServer::~CoordinatorServer() { Close(); }

Result<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(
    const CoordinatorOptions& options) {
  if (options.secret.size() < 16) {
    return Status::InvalidArgument("CoordinatorOptions.secret must be at least 16 bytes, got " +
                                   std::to_string(options.secret.size()));
  }
  EMBER_RETURN_NOT_OK(AssignRole(options.layout, 0).status());
  if (options.max_message_bytes < 64) {
    return Status::InvalidArgument("CoordinatorOptions.max_message_bytes must be >= 64");
  }
  std::unique_ptr<CoordinatorServer> server(new CoordinatorServer());
  Impl& impl = *server->impl_;
  impl.options = options;
  tcp::ServerOptions transport;
  transport.name = "coordinator";
  transport.bind_host = options.bind_host;
  transport.port = options.port;
  transport.secret = options.secret;
  transport.handshake_timeout = options.handshake_timeout;
  EMBER_ASSIGN_OR_RAISE(impl.server,
                        tcp::Server::Start(transport, [&impl](tcp::Connection& c) { impl.ServeConnection(c); }));
  impl.monitor_thread = std::thread(&Impl::MonitorLoop, &impl);
  EMBER_LOG(INFO) << "Ember coordinator listening on " << options.bind_host << ":" << impl.server->port()
                  << " for " << options.layout.num_nodes << " nodes";
  return server;
}

void CoordinatorServer::Close() {
  Impl& impl = *impl_;
  {
    MutexLock lock(&impl.mu);
    if (impl.closed) return;
    impl.closed = true;
    impl.waiters.clear();
  }
  impl.state_cv.SignalAll();
  impl.events_cv.SignalAll();
  if (impl.monitor_thread.joinable()) impl.monitor_thread.join();
  // Shuts every connection down and joins their threads; handlers see
  // `closed` and leave without touching job state.
  if (impl.server) impl.server->Close();
}

int CoordinatorServer::port() const { return impl_->server->port(); }

void CoordinatorServer::Impl::MonitorLoop() {
  MutexLock lock(&mu);
  while (!closed) {
    state_cv.WaitFor(&mu, kMonitorTick);
    if (closed) break;
    Outbox out;
    const auto now = Clock::now();
    ExpireWaiters(now, out);
    CheckHeartbeats(now, out);
    lock.Unlock();
    Send(out);
    lock.Lock();
  }
}

void CoordinatorServer::Impl::Send(Outbox& out) {
  for (Outgoing& o : out) {
    std::lock_guard<std::mutex> lock(o.conn->write_mu);
    Status st = tcp::WriteFrame(o.conn->fd(), static_cast<uint16_t>(o.type), o.payload,
                                Deadline::After(kWriteTimeout), o.conn->peer);
    if (!st.ok()) {
      EMBER_LOG(INFO) << "dropping connection from " << o.conn->peer << ": " << st.message();
      o.conn->Shutdown();
    }
  }
  out.clear();
}

void CoordinatorServer::Impl::AddEvent(Event e) {
  if (events.size() >= kMaxQueuedEvents) events.pop_front();
  events.push_back(std::move(e));
  events_cv.SignalAll();
}

std::string CoordinatorServer::Impl::MissingNodesLocked(const std::set<int>& present) const {
  const int n = options.layout.num_nodes;
  std::string list;
  int missing = 0;
  for (int id = 0; id < n; ++id) {
    if (present.count(id)) continue;
    ++missing;
    if (!list.empty()) list += ", ";
    list += "executor " + std::to_string(id);
    Result<RoleAssignment> role = AssignRole(options.layout, id);
    if (role.ok()) list += " (" + RoleName(*role) + ")";
  }
  return std::to_string(missing) + " of " + std::to_string(n) + " nodes missing: " + list;
}

std::string CoordinatorServer::Impl::RegisteredSummaryLocked() const {
  std::string out;
  for (const auto& [id, node] : nodes) {
    if (!out.empty()) out += ", ";
    out += RoleName(node.role) + "@" + node.address.host;
  }
  return out.empty() ? "none" : out;
}

Registration CoordinatorServer::Impl::RegistrationFor(int executor_id) const {
  Registration reg;
  reg.role = nodes.at(executor_id).role;
  reg.cluster_spec_json = cluster_spec;
  reg.num_nodes = options.layout.num_nodes;
  for (const auto& [id, node] : nodes) reg.nodes.push_back(node);
  return reg;
}

void CoordinatorServer::Impl::ExpireWaiters(Clock::time_point now, Outbox& out) {
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->deadline > now) {
      ++it;
      continue;
    }
    std::string msg;
    const std::string waited = " (waited " + FormatDuration(it->timeout) + ")";
    switch (it->kind) {
      case Waiter::Kind::kRegister: {
        std::set<int> present;
        for (const auto& [id, node] : nodes) present.insert(id);
        msg = "registration: " + MissingNodesLocked(present) + "; registered: " +
              RegisteredSummaryLocked() + waited;
        break;
      }
      case Waiter::Kind::kBarrier:
        msg = "barrier '" + it->name + "': " + MissingNodesLocked(barriers[it->name]) + waited;
        break;
      case Waiter::Kind::kKvGet:
        msg = "key '" + it->name + "' was not set within " + FormatDuration(it->timeout);
        break;
    }
    Reply(it->conn, it->request_id, Status::DeadlineExceeded(msg), {}, out);
    it = waiters.erase(it);
  }
}

void CoordinatorServer::Impl::CheckHeartbeats(Clock::time_point now, Outbox& out) {
  const Duration limit = options.heartbeat_timeout;
  for (auto& [id, node] : nodes) {
    if (node.state != NodeInfo::State::kRunning) continue;
    const auto silent = std::chrono::duration_cast<Duration>(now - last_seen[id]);
    if (silent <= limit) continue;
    NodeFailedLocked(id, NodeInfo::State::kLost,
                     "node " + coord::DescribeNode(node) + " sent no heartbeat for " +
                         FormatDuration(silent) + " (heartbeat_timeout " + FormatDuration(limit) +
                         ")",
                     out);
  }
}

void CoordinatorServer::Impl::AbortLocked(const std::string& reason, Outbox& out) {
  if (aborted || closed) return;
  aborted = true;
  abort_reason = reason;
  EMBER_LOG(ERROR) << reason;
  Event e;
  e.kind = Event::Kind::kAbort;
  e.text = reason;
  AddEvent(std::move(e));
  for (const Waiter& w : waiters) Reply(w.conn, w.request_id, Status::Aborted(reason), {}, out);
  waiters.clear();
  const std::string push = coord::Encode(coord::AbortPush{.reason = reason});
  for (const auto& c : conns) out.push_back({c, coord::MsgType::kAbort, push});
  state_cv.SignalAll();
}

void CoordinatorServer::Impl::NodeFailedLocked(int executor_id, NodeInfo::State state,
                                               const std::string& error, Outbox& out) {
  NodeInfo& node = nodes.at(executor_id);
  if (node.state == NodeInfo::State::kDone || node.state == NodeInfo::State::kFailed ||
      node.state == NodeInfo::State::kLost) {
    return;  // already final
  }
  node.state = state;
  node.error = error;
  const std::string what = state == NodeInfo::State::kFailed
                               ? "node " + coord::DescribeNode(node) + " failed: " + error
                               : error;
  Event e;
  e.kind = Event::Kind::kNodeFailed;
  e.executor_id = executor_id;
  e.job_name = node.role.job_name;
  e.task_index = node.role.task_index;
  e.text = what;
  if (node.role.job_name == "worker" && static_cast<int>(departed.size()) < options.tolerated_worker_losses &&
      first_failure.empty() && !aborted) {
    // A tolerated loss: the job goes on without this worker.
    departed.insert(executor_id);
    EMBER_LOG(WARN) << what << "; the job goes on without it (" << departed.size() << " of "
                    << options.tolerated_worker_losses << " tolerated worker losses)";
    e.kind = Event::Kind::kNodeDeparted;
    AddEvent(std::move(e));
    ReleaseBarriersLocked(out);
    state_cv.SignalAll();
    return;
  }
  AddEvent(std::move(e));
  if (first_failure.empty()) first_failure = what;
  AbortLocked("Ember job aborted: " + what, out);
  state_cv.SignalAll();
}

// ---- driver-side API ----

Status CoordinatorServer::WaitForRegistration(Duration timeout) {
  Impl& impl = *impl_;
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(&impl.mu);
  while (!(impl.all_registered || impl.aborted || impl.closed) &&
         impl.state_cv.WaitUntil(&impl.mu, deadline.when())) {
  }
  if (impl.all_registered) return Status::OK();
  if (impl.aborted) return Status::Aborted(impl.abort_reason);
  if (impl.closed) return Status::Cancelled("the coordinator was closed");
  std::set<int> present;
  for (const auto& [id, node] : impl.nodes) present.insert(id);
  return Status::DeadlineExceeded("registration: " + impl.MissingNodesLocked(present) +
                                  "; registered: " + impl.RegisteredSummaryLocked());
}

std::vector<NodeInfo> CoordinatorServer::Nodes() const {
  MutexLock lock(&impl_->mu);
  std::vector<NodeInfo> out;
  for (const auto& [id, node] : impl_->nodes) out.push_back(node);
  return out;
}

std::string CoordinatorServer::ClusterSpecJson() const {
  MutexLock lock(&impl_->mu);
  return impl_->cluster_spec;
}

std::optional<std::string> CoordinatorServer::KvGet(const std::string& key) const {
  MutexLock lock(&impl_->mu);
  auto it = impl_->kv.find(key);
  if (it == impl_->kv.end()) return std::nullopt;
  return it->second;
}

Result<std::string> CoordinatorServer::WaitForKey(const std::string& key, Duration timeout) {
  Impl& impl = *impl_;
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(&impl.mu);
  while (!(impl.kv.count(key) != 0 || !impl.first_failure.empty() || impl.aborted || impl.closed) &&
         impl.state_cv.WaitUntil(&impl.mu, deadline.when())) {
  }
  if (auto it = impl.kv.find(key); it != impl.kv.end()) return it->second;
  if (!impl.first_failure.empty()) return Status::Aborted(impl.first_failure);
  if (impl.aborted) return Status::Aborted(impl.abort_reason);
  if (impl.closed) return Status::Cancelled("the coordinator was closed");
  return Status::DeadlineExceeded("no node stored key '" + key + "'");
}

Result<NodeInfo> CoordinatorServer::WaitForNodeEnd(int executor_id, Duration timeout) {
  Impl& impl = *impl_;
  if (executor_id < 0 || executor_id >= impl.options.layout.num_nodes) {
    return Status::InvalidArgument("executor id " + std::to_string(executor_id) +
                                   " is outside the job's " +
                                   std::to_string(impl.options.layout.num_nodes) + " nodes");
  }
  const auto ended = [&]() EXCLUSIVE_LOCKS_REQUIRED(impl.mu) {
    auto it = impl.nodes.find(executor_id);
    return it != impl.nodes.end() && it->second.state != NodeInfo::State::kRegistered &&
           it->second.state != NodeInfo::State::kRunning;
  };
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(&impl.mu);
  while (!(ended() || impl.aborted || impl.closed) && impl.state_cv.WaitUntil(&impl.mu, deadline.when())) {
  }
  if (ended()) return impl.nodes.at(executor_id);
  if (impl.aborted) return Status::Aborted(impl.abort_reason);
  if (impl.closed) return Status::Cancelled("the coordinator was closed");
  auto it = impl.nodes.find(executor_id);
  return Status::DeadlineExceeded(
      it == impl.nodes.end() ? "executor " + std::to_string(executor_id) + " never registered"
                             : coord::DescribeNode(it->second) + " is still running");
}

std::vector<Event> CoordinatorServer::PollEvents(Duration timeout) {
  Impl& impl = *impl_;
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(&impl.mu);
  while (impl.events.empty() && !impl.closed && impl.events_cv.WaitUntil(&impl.mu, deadline.when())) {
  }
  if (impl.closed) return {};
  std::vector<Event> out(std::make_move_iterator(impl.events.begin()),
                         std::make_move_iterator(impl.events.end()));
  impl.events.clear();
  return out;
}

Status CoordinatorServer::WaitForNodes(const std::vector<std::string>& job_names,
                                       Duration timeout) {
  Impl& impl = *impl_;
  const auto selected = [&](const std::string& job) {
    return job_names.empty() ||
           std::find(job_names.begin(), job_names.end(), job) != job_names.end();
  };
  std::string still_running;
  int running = 0, total = 0;
  const auto all_done = [&]() EXCLUSIVE_LOCKS_REQUIRED(impl.mu) {
    still_running.clear();
    running = total = 0;
    for (int id = 0; id < impl.options.layout.num_nodes; ++id) {
      Result<RoleAssignment> role = AssignRole(impl.options.layout, id);
      if (!role.ok() || !selected(role->job_name)) continue;
      ++total;
      auto it = impl.nodes.find(id);
      if (it != impl.nodes.end() && it->second.state == NodeInfo::State::kDone) continue;
      if (impl.departed.count(id)) continue;  // a tolerated worker loss
      ++running;
      if (!still_running.empty()) still_running += ", ";
      still_running += it != impl.nodes.end()
                           ? coord::DescribeNode(it->second)
                           : RoleName(*role) + " (executor " + std::to_string(id) +
                                 ", not registered)";
    }
    return running == 0;
  };
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(&impl.mu);
  while (!(!impl.first_failure.empty() || impl.aborted || impl.closed || all_done()) &&
         impl.state_cv.WaitUntil(&impl.mu, deadline.when())) {
  }
  if (!impl.first_failure.empty()) return Status::Aborted(impl.first_failure);
  if (impl.aborted) return Status::Aborted(impl.abort_reason);
  if (all_done()) return Status::OK();
  if (impl.closed) return Status::Cancelled("the coordinator was closed");
  return Status::DeadlineExceeded(std::to_string(running) + " of " + std::to_string(total) +
                                  " nodes still running: " + still_running);
}

void CoordinatorServer::StopNodes(const std::vector<std::string>& job_names) {
  Impl& impl = *impl_;
  Outbox out;
  {
    MutexLock lock(&impl.mu);
    const std::string push = coord::Encode(coord::StopPush{.reason = "stopped by the driver"});
    for (const auto& c : impl.conns) {
      if (c->executor_id < 0) continue;
      auto it = impl.nodes.find(c->executor_id);
      if (it == impl.nodes.end()) continue;
      const std::string& job = it->second.role.job_name;
      if (!job_names.empty() &&
          std::find(job_names.begin(), job_names.end(), job) == job_names.end()) {
        continue;
      }
      out.push_back({c, coord::MsgType::kStop, push});
    }
  }
  impl.Send(out);
}

void CoordinatorServer::Abort(const std::string& reason) {
  Outbox out;
  {
    MutexLock lock(&impl_->mu);
    impl_->AbortLocked(reason, out);
  }
  impl_->Send(out);
}

}  // namespace ember
