// CoordinatorServer internals, shared by server.cc (lifecycle, driver-side
// API, monitor thread) and server_requests.cc (per-connection handler and
// request handlers).  Bytes are coordinator/codec.h's business: handlers see
// decoded requests and hand back replies to encode.
//
// Threads: the transport's (tcp::Server: accept thread, handshake, one
// thread per connection, which runs ServeConnection), and one monitor
// thread (waiter deadlines and heartbeats).  All job state sits behind
// `mu`.  Nothing writes to a socket while holding `mu`: handlers collect
// frames into an Outbox and send them after unlocking, each connection's
// writes serialized by its own `write_mu`.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "ember/deadline.h"
#include "common/mutex.h"
#include "coordinator/codec.h"
#include "coordinator/protocol.h"
#include "ember/coordinator.h"
#include "transport/tcp/server.h"

namespace ember {

using Clock = std::chrono::steady_clock;

// One authenticated connection, in Impl::conns while its handler runs.  The
// socket is only shut down (never closed) while anyone may still use it:
// `link` keeps it open as long as an Outbox holds this Conn.
struct Conn {
  std::shared_ptr<tcp::Connection> link;
  std::string peer;
  std::mutex write_mu;  // serializes frames written to the socket
  // Guarded by Impl::mu:
  int executor_id = -1;   // set by Register or Attach
  bool lifeline = false;  // this connection registered the node
  bool stale = false;     // its node departed and a replacement registered: ignored from then on

  int fd() const { return link->fd(); }
  void Shutdown() { link->Shutdown(); }  // wakes the handler; safe from any thread
};

struct Outgoing {
  std::shared_ptr<Conn> conn;
  coord::MsgType type;
  std::string payload;
};
using Outbox = std::vector<Outgoing>;

// A request parked until something else happens (or its deadline passes).
struct Waiter {
  enum class Kind { kRegister, kBarrier, kKvGet } kind;
  std::shared_ptr<Conn> conn;
  uint32_t request_id = 0;
  Clock::time_point deadline;
  std::string name;  // barrier name or kv key
  Duration timeout{0};
};

struct CoordinatorServer::Impl {
  CoordinatorOptions options;
  std::unique_ptr<tcp::Server> server;
  std::thread monitor_thread;

  mutable Mutex mu;
  CondVar state_cv;   // nodes, abort, close changed
  CondVar events_cv;  // events appended
  bool closed GUARDED_BY(mu) = false;
  std::vector<std::shared_ptr<Conn>> conns GUARDED_BY(mu);  // authenticated, handler running
  std::map<int, NodeInfo> nodes GUARDED_BY(mu);
  std::map<int, Clock::time_point> last_seen GUARDED_BY(mu);  // lifeline traffic
  bool all_registered GUARDED_BY(mu) = false;
  std::string cluster_spec GUARDED_BY(mu);
  bool aborted GUARDED_BY(mu) = false;
  std::string abort_reason GUARDED_BY(mu);
  std::string first_failure GUARDED_BY(mu);  // message of the first kFailed/kLost node
  std::map<std::string, std::set<int>> barriers GUARDED_BY(mu);
  std::set<int> departed GUARDED_BY(mu);  // tolerated worker losses (options.tolerated_worker_losses)
  std::map<std::string, std::string> kv GUARDED_BY(mu);
  std::list<Waiter> waiters GUARDED_BY(mu);
  std::deque<Event> events GUARDED_BY(mu);

  // server.cc
  void MonitorLoop();
  void Send(Outbox& out);
  void ExpireWaiters(Clock::time_point now, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void CheckHeartbeats(Clock::time_point now, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void AbortLocked(const std::string& reason, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void NodeFailedLocked(int executor_id, NodeInfo::State state, const std::string& error,
                        Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void AddEvent(Event e) EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Whether barrier `name` has every node (those that entered, and the departed).
  bool BarrierCompleteLocked(const std::string& name) EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Replies OK to the waiters of every barrier that is complete now.
  void ReleaseBarriersLocked(Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::string MissingNodesLocked(const std::set<int>& present) const EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::string RegisteredSummaryLocked() const EXCLUSIVE_LOCKS_REQUIRED(mu);
  Registration RegistrationFor(int executor_id) const EXCLUSIVE_LOCKS_REQUIRED(mu);

  // server_requests.cc
  void ServeConnection(tcp::Connection& link);
  // Decodes one frame and runs its handler; an error drops the connection.
  Status HandleFrame(const std::shared_ptr<Conn>& conn, uint16_t type, std::string_view payload,
                     Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  template <class Request>
  Status Handle(const std::shared_ptr<Conn>& conn, Result<Request> request, Outbox& out)
      EXCLUSIVE_LOCKS_REQUIRED(mu);
  // One handler per request kind: the state change and the replies.
  void On(const std::shared_ptr<Conn>& conn, coord::RegisterRequest& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::AttachRequest& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::BarrierRequest& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::KvSetRequest& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::KvGetRequest& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::LogMessage& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::ReportMessage& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::HeartbeatMessage& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::DoneRequest& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void On(const std::shared_ptr<Conn>& conn, coord::FailRequest& m, Clock::time_point now,
          Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  Event NodeEvent(const Conn& conn, Event::Kind kind) const EXCLUSIVE_LOCKS_REQUIRED(mu);
  void OnDisconnect(const std::shared_ptr<Conn>& conn, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  // Queues a Reply frame to `conn`.
  void Reply(const std::shared_ptr<Conn>& conn, uint32_t request_id, const Status& status,
             std::string body, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace ember
