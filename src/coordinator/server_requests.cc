// CoordinatorServer: per-connection reader threads and request handlers.
// Each frame is decoded by coordinator/codec.h, handled by one On() per
// request kind (state change, replies into the Outbox), and the replies are
// encoded by the codec too.
#include <algorithm>

#include "common/logging.h"
#include "coordinator/server_impl.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/socket.h"

namespace ember {
namespace {

using coord::MsgType;
constexpr int64_t kMaxWaitMs = int64_t{7} * 24 * 3600 * 1000;  // clamp for client-sent timeouts

Duration ClampTimeout(Duration d) { return Duration(std::clamp<int64_t>(d.count(), 0, kMaxWaitMs)); }

Status NeedIdentity(const Conn& conn, std::string_view what) {
  return Status::InvalidArgument(std::string(what) + " from " + conn.peer +
                                 " before Register or Attach");
}

}  // namespace

// Runs on the connection's thread (tcp::Server), after the handshake.
void CoordinatorServer::Impl::ServeConnection(tcp::Connection& link) {
  auto conn = std::make_shared<Conn>();
  conn->link = link.shared_from_this();
  conn->peer = link.peer();
  {
    MutexLock lock(&mu);
    if (closed) return;
    conns.push_back(conn);
  }
  for (;;) {
    Result<tcp::Frame> frame = tcp::ReadFrame(conn->fd(), options.max_message_bytes,
                                              Deadline::Infinite(), conn->peer);
    if (!frame.ok()) {
      if (frame.status().code() == StatusCode::kCorruption) {
        EMBER_LOG(WARN) << "dropping connection from " << conn->peer << ": "
                        << frame.status().message();
      }
      break;
    }
    Outbox out;
    Status st;
    {
      MutexLock lock(&mu);
      if (closed) break;
      st = HandleFrame(conn, frame->type, frame->payload, out);
    }
    Send(out);
    if (!st.ok()) {
      EMBER_LOG(WARN) << "dropping connection from " << conn->peer << ": " << st.message();
      break;
    }
  }
  conn->Shutdown();
  Outbox out;
  {
    MutexLock lock(&mu);
    OnDisconnect(conn, out);
    conns.erase(std::remove(conns.begin(), conns.end(), conn), conns.end());
  }
  Send(out);
}

void CoordinatorServer::Impl::Reply(const std::shared_ptr<Conn>& conn, uint32_t request_id,
                                    const Status& status, std::string body, Outbox& out) {
  out.push_back({conn, MsgType::kReply,
                 coord::Encode(coord::Reply{request_id, status, std::move(body)})});
}

void CoordinatorServer::Impl::OnDisconnect(const std::shared_ptr<Conn>& conn, Outbox& out) {
  waiters.remove_if([&](const Waiter& w) { return w.conn == conn; });
  if (closed || !conn->lifeline || conn->stale) return;
  const NodeInfo& node = nodes.at(conn->executor_id);
  if (node.state == NodeInfo::State::kRegistered || node.state == NodeInfo::State::kRunning) {
    NodeFailedLocked(conn->executor_id, NodeInfo::State::kLost,
                     "connection to node " + coord::DescribeNode(node) +
                         " lost without an exit report",
                     out);
  }
}

Status CoordinatorServer::Impl::HandleFrame(const std::shared_ptr<Conn>& conn, uint16_t type,
                                            std::string_view payload, Outbox& out) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kRegister: return Handle(conn, coord::DecodeRegister(payload), out);
    case MsgType::kAttach: return Handle(conn, coord::DecodeAttach(payload), out);
    case MsgType::kBarrier: return Handle(conn, coord::DecodeBarrier(payload), out);
    case MsgType::kKvSet: return Handle(conn, coord::DecodeKvSet(payload), out);
    case MsgType::kKvGet: return Handle(conn, coord::DecodeKvGet(payload), out);
    case MsgType::kLog: return Handle(conn, coord::DecodeLog(payload), out);
    case MsgType::kReport: return Handle(conn, coord::DecodeReport(payload), out);
    case MsgType::kHeartbeat: return Handle(conn, coord::DecodeHeartbeat(payload), out);
    case MsgType::kDone: return Handle(conn, coord::DecodeDone(payload), out);
    case MsgType::kFail: return Handle(conn, coord::DecodeFail(payload), out);
    default:
      return Status::Corruption("unknown message type " + std::to_string(type) + " from " +
                                conn->peer);
  }
}

template <class Request>
Status CoordinatorServer::Impl::Handle(const std::shared_ptr<Conn>& conn, Result<Request> request,
                                       Outbox& out) {
  if (!request.ok()) return request.status();
  const auto now = Clock::now();
  if (conn->lifeline && !conn->stale) last_seen[conn->executor_id] = now;  // any traffic proves liveness
  On(conn, *request, now, out);
  return Status::OK();
}

Event CoordinatorServer::Impl::NodeEvent(const Conn& conn, Event::Kind kind) const {
  Event e;
  e.kind = kind;
  e.executor_id = conn.executor_id;
  if (auto it = nodes.find(conn.executor_id); it != nodes.end()) {
    e.job_name = it->second.role.job_name;
    e.task_index = it->second.role.task_index;
  }
  return e;
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::RegisterRequest& m,
                                 Clock::time_point now, Outbox& out) {
  const int eid = m.self.executor_id;
  if (aborted) return Reply(conn, m.request_id, Status::Aborted(abort_reason), {}, out);
  if (conn->executor_id >= 0) {
    return Reply(conn, m.request_id,
                 Status::InvalidArgument("this connection already speaks for executor " +
                                         std::to_string(conn->executor_id)),
                 {}, out);
  }
  Result<RoleAssignment> role = AssignRole(options.layout, eid);
  if (!role.ok()) return Reply(conn, m.request_id, role.status(), {}, out);
  if (auto it = nodes.find(eid); it != nodes.end() && departed.count(eid) && all_registered) {
    // A replacement for a departed worker (a tolerated loss) joins the running job.
    NodeInfo& node = it->second;
    const std::string was = coord::DescribeNode(node);
    for (const auto& c : conns) {
      if (c->executor_id == eid) c->stale = true;  // the dead node's connections speak no more
    }
    node.address = m.self;
    node.state = NodeInfo::State::kRunning;
    node.error.clear();
    departed.erase(eid);
    conn->executor_id = eid;
    conn->lifeline = true;
    last_seen[eid] = now;
    std::vector<NodeInfo> all;
    for (const auto& [id, n] : nodes) all.push_back(n);
    cluster_spec = coord::ClusterSpecJson(all);
    Event e = NodeEvent(*conn, Event::Kind::kRegistered);
    e.text = "replaces " + was;
    AddEvent(std::move(e));
    EMBER_LOG(INFO) << "registered " << coord::DescribeNode(node) << ", replacing " << was;
    state_cv.SignalAll();
    return Reply(conn, m.request_id, Status::OK(), coord::EncodeRegisterReply(RegistrationFor(eid)), out);
  }
  if (auto it = nodes.find(eid); it != nodes.end()) {
    return Reply(conn, m.request_id,
                 Status::InvalidArgument("executor " + std::to_string(eid) +
                                         " is already registered by " +
                                         coord::DescribeNode(it->second) +
                                         "; refused the second claim from " + m.self.host +
                                         " pid " + std::to_string(m.self.pid)),
                 {}, out);
  }
  NodeInfo& node = nodes[eid];
  node.address = m.self;
  node.role = *role;
  conn->executor_id = eid;
  conn->lifeline = true;
  last_seen[eid] = now;
  AddEvent(NodeEvent(*conn, Event::Kind::kRegistered));
  const int num_nodes = options.layout.num_nodes;
  EMBER_LOG(INFO) << "registered " << coord::DescribeNode(node) << " (" << nodes.size() << " of "
                  << num_nodes << ")";
  if (static_cast<int>(nodes.size()) < num_nodes) {
    waiters.push_back({Waiter::Kind::kRegister, conn, m.request_id, now + ClampTimeout(m.timeout), "",
                       ClampTimeout(m.timeout)});
    return;
  }
  all_registered = true;
  std::vector<NodeInfo> all;
  for (auto& [id, n] : nodes) {
    n.state = NodeInfo::State::kRunning;
    last_seen[id] = now;
    all.push_back(n);
  }
  cluster_spec = coord::ClusterSpecJson(all);
  state_cv.SignalAll();
  waiters.push_back({Waiter::Kind::kRegister, conn, m.request_id, now, "", Duration(0)});
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->kind != Waiter::Kind::kRegister) {
      ++it;
      continue;
    }
    Reply(it->conn, it->request_id, Status::OK(),
          coord::EncodeRegisterReply(RegistrationFor(it->conn->executor_id)), out);
    it = waiters.erase(it);
  }
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::AttachRequest& m,
                                 Clock::time_point, Outbox& out) {
  Status st;
  if (conn->executor_id >= 0) {
    st = Status::InvalidArgument("this connection already speaks for executor " +
                                 std::to_string(conn->executor_id));
  } else if (!nodes.count(m.executor_id)) {
    st = Status::InvalidArgument("cannot attach to executor " + std::to_string(m.executor_id) +
                                 ": it has not registered");
  } else {
    conn->executor_id = m.executor_id;
  }
  Reply(conn, m.request_id, st, {}, out);
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::BarrierRequest& m,
                                 Clock::time_point now, Outbox& out) {
  if (aborted) return Reply(conn, m.request_id, Status::Aborted(abort_reason), {}, out);
  if (conn->executor_id < 0) {
    return Reply(conn, m.request_id, NeedIdentity(*conn, "Barrier '" + m.name + "'"), {}, out);
  }
  barriers[m.name].insert(conn->executor_id);
  if (!BarrierCompleteLocked(m.name)) {
    waiters.push_back({Waiter::Kind::kBarrier, conn, m.request_id, now + ClampTimeout(m.timeout),
                       m.name, ClampTimeout(m.timeout)});
    return;
  }
  Reply(conn, m.request_id, Status::OK(), {}, out);
  ReleaseBarriersLocked(out);
}

bool CoordinatorServer::Impl::BarrierCompleteLocked(const std::string& name) {
  std::set<int> present = barriers[name];
  present.insert(departed.begin(), departed.end());
  return static_cast<int>(present.size()) >= options.layout.num_nodes;
}

void CoordinatorServer::Impl::ReleaseBarriersLocked(Outbox& out) {
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->kind == Waiter::Kind::kBarrier && BarrierCompleteLocked(it->name)) {
      Reply(it->conn, it->request_id, Status::OK(), {}, out);
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::KvSetRequest& m,
                                 Clock::time_point, Outbox& out) {
  for (auto it = waiters.begin(); it != waiters.end();) {
    if (it->kind == Waiter::Kind::kKvGet && it->name == m.key) {
      Reply(it->conn, it->request_id, Status::OK(), coord::EncodeKvGetReply(m.value), out);
      it = waiters.erase(it);
    } else {
      ++it;
    }
  }
  kv[m.key] = std::move(m.value);
  state_cv.SignalAll();  // CoordinatorServer::WaitForKey
  Reply(conn, m.request_id, Status::OK(), {}, out);
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::KvGetRequest& m,
                                 Clock::time_point now, Outbox& out) {
  if (auto it = kv.find(m.key); it != kv.end()) {
    Reply(conn, m.request_id, Status::OK(), coord::EncodeKvGetReply(it->second), out);
  } else if (aborted) {
    Reply(conn, m.request_id, Status::Aborted(abort_reason), {}, out);
  } else {
    waiters.push_back({Waiter::Kind::kKvGet, conn, m.request_id, now + ClampTimeout(m.timeout),
                       m.key, ClampTimeout(m.timeout)});
  }
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::LogMessage& m,
                                 Clock::time_point, Outbox&) {
  Event e = NodeEvent(*conn, Event::Kind::kLog);
  e.stream = std::move(m.stream);
  e.text = std::move(m.line);
  AddEvent(std::move(e));
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::ReportMessage& m,
                                 Clock::time_point, Outbox&) {
  Event e = NodeEvent(*conn, Event::Kind::kProgress);
  e.metrics = std::move(m.metrics);
  AddEvent(std::move(e));
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>&, coord::HeartbeatMessage&,
                                 Clock::time_point, Outbox&) {}  // Handle noted the traffic

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::DoneRequest& m,
                                 Clock::time_point, Outbox& out) {
  if (conn->executor_id < 0) return Reply(conn, m.request_id, NeedIdentity(*conn, "Done"), {}, out);
  if (conn->stale) return Reply(conn, m.request_id, Status::OK(), {}, out);  // a replaced node's
  NodeInfo& node = nodes.at(conn->executor_id);
  if (node.state == NodeInfo::State::kRegistered || node.state == NodeInfo::State::kRunning) {
    node.state = NodeInfo::State::kDone;
    AddEvent(NodeEvent(*conn, Event::Kind::kNodeDone));
    EMBER_LOG(INFO) << "node " << coord::DescribeNode(node) << " finished";
    state_cv.SignalAll();
  }
  Reply(conn, m.request_id, Status::OK(), {}, out);
}

void CoordinatorServer::Impl::On(const std::shared_ptr<Conn>& conn, coord::FailRequest& m,
                                 Clock::time_point, Outbox& out) {
  if (conn->executor_id < 0) return Reply(conn, m.request_id, NeedIdentity(*conn, "Fail"), {}, out);
  if (conn->stale) return Reply(conn, m.request_id, Status::OK(), {}, out);  // a replaced node's
  Reply(conn, m.request_id, Status::OK(), {}, out);  // before the abort push it triggers
  NodeFailedLocked(conn->executor_id, NodeInfo::State::kFailed, m.error, out);
}

}  // namespace ember
