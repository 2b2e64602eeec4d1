// CoordinatorServer: per-connection reader threads and request handlers.
// Message layouts: docs/wire.md.
#include <algorithm>

#include "common/logging.h"
#include "coordinator/server_impl.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/socket.h"

namespace ember {
namespace {

using coord::MsgType;
constexpr int64_t kMaxWaitMs = int64_t{7} * 24 * 3600 * 1000;  // clamp for client-sent timeouts

Duration ClampTimeout(int64_t ms) { return Duration(std::clamp<int64_t>(ms, 0, kMaxWaitMs)); }

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
                                    const Status& status, std::string_view body, Outbox& out) {
  out.push_back({conn, MsgType::kReply, coord::EncodeReply(request_id, status, body)});
}

void CoordinatorServer::Impl::OnDisconnect(const std::shared_ptr<Conn>& conn, Outbox& out) {
  waiters.remove_if([&](const Waiter& w) { return w.conn == conn; });
  if (closed || !conn->lifeline) return;
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
  codec::Reader r(payload);
  uint32_t rid = 0;
  EMBER_RETURN_NOT_OK(r.GetU32(&rid));
  const auto now = Clock::now();
  if (conn->lifeline) last_seen[conn->executor_id] = now;  // any traffic proves liveness
  const int num_nodes = options.layout.num_nodes;
  const auto node_event = [&](Event::Kind kind) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    Event e;
    e.kind = kind;
    e.executor_id = conn->executor_id;
    auto it = nodes.find(conn->executor_id);
    if (it != nodes.end()) {
      e.job_name = it->second.role.job_name;
      e.task_index = it->second.role.task_index;
    }
    return e;
  };
  const auto need_identity = [&](std::string_view what) {
    return Status::InvalidArgument(std::string(what) + " from " + conn->peer +
                                   " before Register or Attach");
  };

  switch (static_cast<MsgType>(type)) {
    case MsgType::kRegister: {
      int32_t eid = 0, port = 0;
      int64_t pid = 0, timeout_ms = 0;
      std::string host;
      EMBER_RETURN_NOT_OK(r.GetI32(&eid));
      EMBER_RETURN_NOT_OK(r.GetString(&host));
      EMBER_RETURN_NOT_OK(r.GetI32(&port));
      EMBER_RETURN_NOT_OK(r.GetI64(&pid));
      EMBER_RETURN_NOT_OK(r.GetI64(&timeout_ms));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      if (aborted) {
        Reply(conn, rid, Status::Aborted(abort_reason), {}, out);
        break;
      }
      if (conn->executor_id >= 0) {
        Reply(conn, rid, Status::InvalidArgument("this connection already speaks for executor " +
                                                 std::to_string(conn->executor_id)), {}, out);
        break;
      }
      Result<RoleAssignment> role = AssignRole(options.layout, eid);
      if (!role.ok()) {
        Reply(conn, rid, role.status(), {}, out);
        break;
      }
      if (auto it = nodes.find(eid); it != nodes.end()) {
        Reply(conn, rid, Status::InvalidArgument(
                             "executor " + std::to_string(eid) + " is already registered by " +
                             coord::DescribeNode(it->second) + "; refused the second claim from " +
                             host + " pid " + std::to_string(pid)), {}, out);
        break;
      }
      NodeInfo& node = nodes[eid];
      node.address = NodeAddress{eid, host, port, pid};
      node.role = *role;
      conn->executor_id = eid;
      conn->lifeline = true;
      last_seen[eid] = now;
      AddEvent(node_event(Event::Kind::kRegistered));
      EMBER_LOG(INFO) << "registered " << coord::DescribeNode(node) << " (" << nodes.size()
                      << " of " << num_nodes << ")";
      if (static_cast<int>(nodes.size()) < num_nodes) {
        waiters.push_back({Waiter::Kind::kRegister, conn, rid, now + ClampTimeout(timeout_ms), "",
                           ClampTimeout(timeout_ms)});
        break;
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
      waiters.push_back({Waiter::Kind::kRegister, conn, rid, now, "", Duration(0)});
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (it->kind != Waiter::Kind::kRegister) {
          ++it;
          continue;
        }
        codec::Writer body;
        coord::EncodeRegistration(body, RegistrationFor(it->conn->executor_id));
        Reply(it->conn, it->request_id, Status::OK(), body.data(), out);
        it = waiters.erase(it);
      }
      break;
    }
    case MsgType::kAttach: {
      int32_t eid = 0;
      EMBER_RETURN_NOT_OK(r.GetI32(&eid));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      Status st;
      if (conn->executor_id >= 0) {
        st = Status::InvalidArgument("this connection already speaks for executor " +
                                     std::to_string(conn->executor_id));
      } else if (!nodes.count(eid)) {
        st = Status::InvalidArgument("cannot attach to executor " + std::to_string(eid) +
                                     ": it has not registered");
      } else {
        conn->executor_id = eid;
      }
      Reply(conn, rid, st, {}, out);
      break;
    }
    case MsgType::kBarrier: {
      std::string name;
      int64_t timeout_ms = 0;
      EMBER_RETURN_NOT_OK(r.GetString(&name));
      EMBER_RETURN_NOT_OK(r.GetI64(&timeout_ms));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      if (aborted) {
        Reply(conn, rid, Status::Aborted(abort_reason), {}, out);
      } else if (conn->executor_id < 0) {
        Reply(conn, rid, need_identity("Barrier '" + name + "'"), {}, out);
      } else {
        std::set<int>& arrived = barriers[name];
        arrived.insert(conn->executor_id);
        if (static_cast<int>(arrived.size()) < num_nodes) {
          waiters.push_back({Waiter::Kind::kBarrier, conn, rid, now + ClampTimeout(timeout_ms),
                             name, ClampTimeout(timeout_ms)});
          break;
        }
        Reply(conn, rid, Status::OK(), {}, out);
        for (auto it = waiters.begin(); it != waiters.end();) {
          if (it->kind == Waiter::Kind::kBarrier && it->name == name) {
            Reply(it->conn, it->request_id, Status::OK(), {}, out);
            it = waiters.erase(it);
          } else {
            ++it;
          }
        }
      }
      break;
    }
    case MsgType::kKvSet: {
      std::string key, value;
      EMBER_RETURN_NOT_OK(r.GetString(&key));
      EMBER_RETURN_NOT_OK(r.GetString(&value));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      codec::Writer body;
      body.PutString(value);
      for (auto it = waiters.begin(); it != waiters.end();) {
        if (it->kind == Waiter::Kind::kKvGet && it->name == key) {
          Reply(it->conn, it->request_id, Status::OK(), body.data(), out);
          it = waiters.erase(it);
        } else {
          ++it;
        }
      }
      kv[key] = std::move(value);
      state_cv.SignalAll();  // CoordinatorServer::WaitForKey
      Reply(conn, rid, Status::OK(), {}, out);
      break;
    }
    case MsgType::kKvGet: {
      std::string key;
      int64_t timeout_ms = 0;
      EMBER_RETURN_NOT_OK(r.GetString(&key));
      EMBER_RETURN_NOT_OK(r.GetI64(&timeout_ms));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      if (auto it = kv.find(key); it != kv.end()) {
        codec::Writer body;
        body.PutString(it->second);
        Reply(conn, rid, Status::OK(), body.data(), out);
      } else if (aborted) {
        Reply(conn, rid, Status::Aborted(abort_reason), {}, out);
      } else {
        waiters.push_back({Waiter::Kind::kKvGet, conn, rid, now + ClampTimeout(timeout_ms), key,
                           ClampTimeout(timeout_ms)});
      }
      break;
    }
    case MsgType::kLog: {
      Event e = node_event(Event::Kind::kLog);
      EMBER_RETURN_NOT_OK(r.GetString(&e.stream));
      EMBER_RETURN_NOT_OK(r.GetString(&e.text));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      AddEvent(std::move(e));
      break;
    }
    case MsgType::kReport: {
      Event e = node_event(Event::Kind::kProgress);
      EMBER_RETURN_NOT_OK(r.GetMap(&e.metrics));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      AddEvent(std::move(e));
      break;
    }
    case MsgType::kHeartbeat:
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      break;
    case MsgType::kDone: {
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      if (conn->executor_id < 0) {
        Reply(conn, rid, need_identity("Done"), {}, out);
        break;
      }
      NodeInfo& node = nodes.at(conn->executor_id);
      if (node.state == NodeInfo::State::kRegistered || node.state == NodeInfo::State::kRunning) {
        node.state = NodeInfo::State::kDone;
        AddEvent(node_event(Event::Kind::kNodeDone));
        EMBER_LOG(INFO) << "node " << coord::DescribeNode(node) << " finished";
        state_cv.SignalAll();
      }
      Reply(conn, rid, Status::OK(), {}, out);
      break;
    }
    case MsgType::kFail: {
      std::string error;
      EMBER_RETURN_NOT_OK(r.GetString(&error));
      EMBER_RETURN_NOT_OK(r.ExpectEnd());
      if (conn->executor_id < 0) {
        Reply(conn, rid, need_identity("Fail"), {}, out);
        break;
      }
      Reply(conn, rid, Status::OK(), {}, out);  // before the abort push it triggers
      NodeFailedLocked(conn->executor_id, NodeInfo::State::kFailed, error, out);
      break;
    }
    default:
      return Status::Corruption("unknown message type " + std::to_string(type) + " from " +
                                conn->peer);
  }
  return Status::OK();
}

}  // namespace ember
