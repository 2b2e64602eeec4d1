// tcp::Acceptor: the one accept loop of Ember.  It owns a listener, the
// accept thread, a wake pipe and one thread per accepted connection, and
// runs the authenticated handshake (handshake.h) with the job's secret
// before anything else is read from a connection:
//
//   accept ──> [connection thread] handshake ──> serve mode:     handler(conn)
//     │                              │           hand-over mode: admit(fd) ──> Take()
//     └─ max_pending_handshakes      └─ failed: logged as "<name>: rejected
//        already pending: the           unauthenticated connection from
//        new one is admitted, an        <peer>: <why>", counted
//        old one dropped (pending.h),
//        counted
//
// Two modes, one loop:
//   * Serve (tcp::Server, server.h): each authenticated connection is served
//     by `handler` on its own thread; when the handler returns, the
//     connection is shut down.  The coordinator and the feed server.
//   * HandOver: each authenticated connection is checked by `admit` on its
//     own thread (say, a hello naming who the peer is, with the handshake's
//     deadline); an admitted socket is queued for Take(), a refused one is
//     logged as "<name>: rejected connection from <peer>: <why>" and closed.
//     The collective ring, which wants the one socket from its previous rank.
//
// At most max_pending_handshakes connections may be in the handshake at
// once, so peers that connect and say nothing cost a bounded number of
// threads for at most handshake_timeout each; a new connection is never
// refused for it, so a flood of such peers cannot lock the job's own
// clients out (PendingHandshakes says which one is dropped).  Authenticated
// connections are not capped (their number is the job's business).
//
// Threads: the accept thread joins connection threads as soon as they end.
// Close() stops accepting, shuts every connection down (waking handlers
// blocked on the socket), joins every thread and closes the listener and
// sockets queued but not taken.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
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

struct AcceptorOptions {
  std::string name = "tcp acceptor";  // prefixes log lines: "coordinator", "tcp ring rank 1 (...)"
  std::string secret;                 // the job's secret, at least 16 bytes
  Duration handshake_timeout{5000};   // a peer must finish the handshake (and admit) within this
  // Connections in the handshake at once; a connection beyond this is
  // admitted and an older pending one dropped (counted in dropped_pending).
  size_t max_pending_handshakes = 64;
};

// InvalidArgument, prefixed with options.name, for a secret shorter than 16
// bytes, a non-positive handshake_timeout or a zero cap.
Status ValidateAcceptorOptions(const AcceptorOptions& options);

struct ServerStats {
  uint64_t accepted = 0;          // passed the handshake (and admit): handed to the handler or queued
  uint64_t rejected = 0;          // failed the handshake, or refused by admit
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

  uint64_t id() const { return id_; }    // unique per acceptor, from 1
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
  friend class Acceptor;
  // Hand-over mode: the socket leaves the connection (Shutdown() no longer
  // touches it).  Under hook_mu_, so a concurrent Shutdown() sees it or not.
  Fd Release();

  const uint64_t id_;
  Fd fd_;  // written only by Release(), under hook_mu_
  const std::string peer_;
  std::atomic<bool> shut_down_{false};
  Mutex hook_mu_;
  std::function<void()> hook_ GUARDED_BY(hook_mu_);
};

class Acceptor {
 public:
  // Serve mode: runs on the connection's thread once the peer passed the
  // handshake.  When it returns, the connection is shut down.  It must
  // return promptly once the connection is shut down (reads fail then; see
  // OnShutdown()).
  using Handler = std::function<void(Connection&)>;
  // Hand-over mode: runs on the connection's thread once the peer passed the
  // handshake, under the handshake's `deadline`.  OK queues the socket for
  // Take(); an error refuses it (logged, counted in rejected, the socket
  // closed).  May read and write `fd`; must not keep it.
  using Admit = std::function<Status(int fd, const std::string& peer, Deadline deadline)>;

  // Takes `listener` (bound and listening) and starts accepting.
  // ValidateAcceptorOptions()'s errors; IOError if the wake pipe cannot be made.
  static Result<std::unique_ptr<Acceptor>> Serve(const AcceptorOptions& options, Fd listener, Handler handler);
  static Result<std::unique_ptr<Acceptor>> HandOver(const AcceptorOptions& options, Fd listener, Admit admit);

  // Close()s.
  ~Acceptor();
  Acceptor(const Acceptor&) = delete;
  Acceptor& operator=(const Acceptor&) = delete;

  int port() const { return port_; }
  const AcceptorOptions& options() const { return options_; }
  ServerStats stats() const;

  // Hand-over mode: the next admitted socket, in the order admitted; the
  // caller owns it.  DeadlineExceeded if none was admitted by `deadline`
  // (last_rejection() may say why); Aborted once Close() began; Internal in
  // serve mode.  Thread-safe.
  Result<Fd> Take(Deadline deadline) LOCKS_EXCLUDED(mu_);
  // "<peer>: <status>" of the last connection refused in the handshake or
  // by admit while not closing; "" if none.
  std::string last_rejection() const LOCKS_EXCLUDED(mu_);

  // Stops accepting, shuts every connection down (running their OnShutdown
  // hooks), joins the accept thread and every connection thread, and closes
  // the listener and any socket queued but not taken.  Idempotent and
  // thread-safe: a second caller returns once the first has finished.  Must
  // not be called from a handler or admit (it would join itself).
  void Close();

 private:
  struct Entry;

  Acceptor(const AcceptorOptions& options, Handler handler, Admit admit, Fd listener, int port, Fd wake_read,
           Fd wake_write);
  static Result<std::unique_ptr<Acceptor>> Start(const AcceptorOptions& options, Fd listener, Handler handler,
                                                 Admit admit);
  void AcceptLoop();
  void Enter(Fd fd) LOCKS_EXCLUDED(mu_);
  void Run(Entry* entry);
  // Hand-over mode, after the handshake: admit_, then queue or refuse.
  void HandOverConnection(Connection& conn, Deadline deadline) LOCKS_EXCLUDED(mu_);
  void Reject(const Connection& conn, const char* what, const Status& why) LOCKS_EXCLUDED(mu_);
  void Wake();
  void ReapFinished() LOCKS_EXCLUDED(mu_);

  const AcceptorOptions options_;
  const Handler handler_;  // serve mode
  const Admit admit_;      // hand-over mode
  Fd listen_fd_;
  const int port_;
  // A byte here wakes the accept thread: to stop (closing_) or to join a
  // connection thread that just finished.
  Fd wake_read_, wake_write_;
  std::thread accept_thread_;

  Mutex close_mu_;  // serializes Close()
  bool closed_ GUARDED_BY(close_mu_) = false;

  mutable Mutex mu_;
  CondVar taken_cv_;  // signalled when ready_ grows or closing_ is set
  bool closing_ GUARDED_BY(mu_) = false;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
  std::list<std::unique_ptr<Entry>> entries_ GUARDED_BY(mu_);  // live and unreaped connections
  std::deque<Fd> ready_ GUARDED_BY(mu_);                         // hand-over: admitted, not taken
  std::string last_rejection_ GUARDED_BY(mu_);

  PendingHandshakes pending_;
  std::atomic<uint64_t> accepted_{0}, rejected_{0}, dropped_{0};
};

}  // namespace ember::tcp
