// tcp::Server: the one TCP server of Ember.  The coordinator and each node's
// feed server are its users; collectives and the parameter server plug in
// the same way.  It owns the listener, the accept thread and one thread per
// connection, and runs the authenticated handshake (handshake.h) with the
// job's secret before a user's handler ever sees a connection:
//
//   accept ──> [connection thread] handshake ──> handler(conn)
//     │                              │
//     └─ max_pending_handshakes      └─ failed: logged as "<name>: rejected
//        already pending: the           unauthenticated connection from
//        new one is admitted, an        <peer>: <why>", counted
//        old one dropped (pending.h),
//        counted
//
// At most max_pending_handshakes connections may be in the handshake at
// once, so peers that connect and say nothing cost a bounded number of
// threads for at most handshake_timeout each; a new connection is never
// refused for it, so a flood of such peers cannot lock the job's own
// clients out (PendingHandshakes says which one is dropped).  Authenticated
// connections are not capped (their number is the job's business).
//
// Threads: one accept thread, one per connection.  A connection's thread
// runs the handshake, then the handler; when the handler returns, the
// connection is shut down and the thread ends; the accept thread joins
// finished threads as soon as they end.  Close() stops accepting, shuts
// every connection down (waking handlers blocked on the socket) and joins
// every thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>

#include "ember/deadline.h"
#include "common/fd.h"
#include "common/mutex.h"
#include "transport/tcp/pending.h"
#include "ember/result.h"

namespace ember::tcp {

struct ServerOptions {
  std::string name = "tcp server";  // prefixes log lines: "coordinator", "feed server"
  std::string bind_host = "0.0.0.0";
  int port = 0;        // 0 picks a free port; see Server::port()
  std::string secret;  // the job's secret, at least 16 bytes
  Duration handshake_timeout{5000};  // a peer must finish the handshake within this
  // Connections in the handshake at once; a connection beyond this is
  // admitted and an older pending one dropped (counted in dropped_pending).
  size_t max_pending_handshakes = 64;
};

struct ServerStats {
  uint64_t accepted = 0;          // passed the handshake (handed to the handler)
  uint64_t rejected = 0;          // failed the handshake
  uint64_t dropped_pending = 0;   // dropped in the handshake to make room for a newer one
};

// One authenticated connection, handed to the handler on its own thread.
// The socket is non-blocking (use socket.h / frame.h with deadlines).
// Thread-safe: Shutdown() and OnShutdown() may be called from any thread;
// a user may keep the Connection (shared_from_this()) past the handler, for
// example to write replies from another thread: the descriptor stays open
// until the last reference goes, so it is never reused under a writer.
class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(uint64_t id, Fd fd, std::string peer);
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  uint64_t id() const { return id_; }    // unique per server, from 1
  int fd() const { return fd_.get(); }
  const std::string& peer() const { return peer_; }  // "ip:port"

  // shutdown(2)s both directions, so blocked reads and writes on the socket
  // fail at once, then runs the OnShutdown hook if one is set.  Idempotent;
  // never closes the descriptor.
  void Shutdown();
  // True once Shutdown() was called (e.g. by Server::Close()).
  bool shut_down() const { return shut_down_.load(); }

  // Sets a hook Shutdown() runs (on the thread calling it) for handlers that
  // also wait on something other than the socket: the hook wakes them.
  // Runs at once if the connection is already shut down; nullptr clears it.
  // A hook that refers to the handler's own objects must be cleared before
  // they die (the server clears it only after the handler returned).  The
  // hook runs under a lock: it must not call back into this Connection.
  void OnShutdown(std::function<void()> hook);

 private:
  friend class Server;
  const uint64_t id_;
  Fd fd_;
  const std::string peer_;
  std::atomic<bool> shut_down_{false};
  Mutex hook_mu_;
  std::function<void()> hook_ GUARDED_BY(hook_mu_);
};

class Server {
 public:
  // Runs on the connection's thread once the peer passed the handshake.
  // When it returns, the connection is shut down.  It must return promptly
  // once the connection is shut down (reads fail then; see OnShutdown()).
  using Handler = std::function<void(Connection&)>;

  // Binds, listens and starts accepting.  InvalidArgument for a secret
  // shorter than 16 bytes, a non-positive handshake_timeout or a zero cap;
  // IOError naming the address if it cannot be bound.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, Handler handler);

  // Close()s.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return port_; }
  const ServerOptions& options() const { return options_; }
  ServerStats stats() const;

  // Stops accepting, shuts every connection down (running their OnShutdown
  // hooks), and joins the accept thread and every connection thread.
  // Idempotent and thread-safe: a second caller returns once the first has
  // finished.  Must not be called from a handler (it would join itself).
  void Close();

 private:
  struct Entry;

  Server(const ServerOptions& options, Handler handler, Fd listener, int port, Fd wake_read, Fd wake_write);
  void AcceptLoop();
  void Admit(Fd fd) LOCKS_EXCLUDED(mu_);
  void Serve(Entry* entry);
  void Wake();
  void ReapFinished() LOCKS_EXCLUDED(mu_);

  const ServerOptions options_;
  const Handler handler_;
  Fd listen_fd_;
  const int port_;
  // A byte here wakes the accept thread: to stop (closing_) or to join a
  // connection thread that just finished.
  Fd wake_read_, wake_write_;
  std::thread accept_thread_;

  Mutex close_mu_;  // serializes Close()
  bool closed_ GUARDED_BY(close_mu_) = false;

  mutable Mutex mu_;
  bool closing_ GUARDED_BY(mu_) = false;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::list<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);  // live and unreaped connections

  PendingHandshakes pending_;
  std::atomic<uint64_t> accepted_{0}, rejected_{0}, dropped_{0};
};

}  // namespace ember::tcp
