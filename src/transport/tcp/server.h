// tcp::Server: the one TCP server of Ember.  The coordinator and each node's
// feed server are its users; collectives and the parameter server plug in
// the same way.  It binds the listener and serves each authenticated
// connection on its own thread: a tcp::Acceptor in serve mode
// (acceptor.h), which runs the handshake with the job's secret before a
// user's handler ever sees a connection, bounds the connections still in
// the handshake (max_pending_handshakes, pending.h), logs and counts
// rejections, and joins finished connection threads as they end.
//
// Close() stops accepting, shuts every connection down (waking handlers
// blocked on the socket) and joins every thread.
#pragma once

#include <memory>
#include <string>

#include "ember/deadline.h"
#include "transport/tcp/acceptor.h"
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

class Server {
 public:
  // Runs on the connection's thread once the peer passed the handshake.
  // When it returns, the connection is shut down.  It must return promptly
  // once the connection is shut down (reads fail then; see OnShutdown()).
  using Handler = Acceptor::Handler;

  // Binds, listens and starts accepting.  InvalidArgument for a secret
  // shorter than 16 bytes, a non-positive handshake_timeout or a zero cap;
  // IOError naming the address if it cannot be bound.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options, Handler handler);

  // Close()s.
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const { return acceptor_->port(); }
  const ServerOptions& options() const { return options_; }
  ServerStats stats() const { return acceptor_->stats(); }

  // Stops accepting, shuts every connection down (running their OnShutdown
  // hooks), and joins the accept thread and every connection thread.
  // Idempotent and thread-safe: a second caller returns once the first has
  // finished.  Must not be called from a handler (it would join itself).
  void Close() { acceptor_->Close(); }

 private:
  Server(const ServerOptions& options, std::unique_ptr<Acceptor> acceptor);

  const ServerOptions options_;
  const std::unique_ptr<Acceptor> acceptor_;
};

}  // namespace ember::tcp
