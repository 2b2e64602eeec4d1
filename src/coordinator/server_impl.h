// CoordinatorServer internals, shared by server.cc (lifecycle, driver-side
// API, accept and monitor threads) and server_requests.cc (per-connection
// reader threads and request handlers).
//
// Threads: one accept thread, one monitor thread (waiter deadlines and
// heartbeats), one reader thread per connection.  All job state sits behind
// `mu`.  Nothing writes to a socket while holding `mu`: handlers collect
// frames into an Outbox and send them after unlocking, each connection's
// writes serialized by its own `write_mu`.
#pragma once

#include <atomic>
#include <condition_variable>
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

#include "common/deadline.h"
#include "common/fd.h"
#include "common/thread_annotations.h"
#include "coordinator/protocol.h"
#include "ember/coordinator.h"

namespace ember {

using Clock = std::chrono::steady_clock;

// One accepted connection.  The fd is only shut down (never closed) while
// the reader thread may still use it; it is closed when the Conn dies.
struct Conn {
  uint64_t id = 0;
  Fd fd;
  std::string peer;
  std::mutex write_mu;  // serializes frames written to fd
  std::thread reader;   // joined by the reaper or Close(), never by itself
  std::atomic<bool> finished{false};
  // Guarded by Impl::mu:
  bool authenticated = false;
  int executor_id = -1;   // set by Register or Attach
  bool lifeline = false;  // this connection registered the node

  void Shutdown();  // wakes the reader; safe from any thread
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
  Fd listen_fd;
  int port = 0;
  Fd wake_read, wake_write;  // a byte on wake_write stops the accept thread
  std::thread accept_thread;
  std::thread monitor_thread;

  mutable std::mutex mu;
  std::condition_variable state_cv;   // nodes, abort, close changed
  std::condition_variable events_cv;  // events appended
  bool closed GUARDED_BY(mu) = false;
  uint64_t next_conn_id GUARDED_BY(mu) = 1;
  std::vector<std::shared_ptr<Conn>> conns GUARDED_BY(mu);
  std::map<int, NodeInfo> nodes GUARDED_BY(mu);
  std::map<int, Clock::time_point> last_seen GUARDED_BY(mu);  // lifeline traffic
  bool all_registered GUARDED_BY(mu) = false;
  std::string cluster_spec GUARDED_BY(mu);
  bool aborted GUARDED_BY(mu) = false;
  std::string abort_reason GUARDED_BY(mu);
  std::string first_failure GUARDED_BY(mu);  // message of the first kFailed/kLost node
  std::map<std::string, std::set<int>> barriers GUARDED_BY(mu);
  std::map<std::string, std::string> kv GUARDED_BY(mu);
  std::list<Waiter> waiters GUARDED_BY(mu);
  std::deque<Event> events GUARDED_BY(mu);

  // server.cc
  void AcceptLoop();
  void MonitorLoop();
  void ReapFinished();
  void Send(Outbox& out);
  void ExpireWaiters(Clock::time_point now, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void CheckHeartbeats(Clock::time_point now, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void AbortLocked(const std::string& reason, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void NodeFailedLocked(int executor_id, NodeInfo::State state, const std::string& error,
                        Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void AddEvent(Event e) EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::string MissingNodesLocked(const std::set<int>& present) const EXCLUSIVE_LOCKS_REQUIRED(mu);
  std::string RegisteredSummaryLocked() const EXCLUSIVE_LOCKS_REQUIRED(mu);
  Registration RegistrationFor(int executor_id) const EXCLUSIVE_LOCKS_REQUIRED(mu);

  // server_requests.cc
  void ServeConnection(std::shared_ptr<Conn> conn);
  Status HandleFrame(const std::shared_ptr<Conn>& conn, uint16_t type, std::string_view payload,
                     Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void OnDisconnect(const std::shared_ptr<Conn>& conn, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
  void Reply(const std::shared_ptr<Conn>& conn, uint32_t request_id, const Status& status,
             std::string_view body, Outbox& out) EXCLUSIVE_LOCKS_REQUIRED(mu);
};

}  // namespace ember
