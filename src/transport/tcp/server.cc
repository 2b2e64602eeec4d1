#include "transport/tcp/server.h"

#include <utility>

#include "transport/tcp/socket.h"

namespace ember::tcp {

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options, Handler handler) {
  AcceptorOptions a;
  a.name = options.name;
  a.secret = options.secret;
  a.handshake_timeout = options.handshake_timeout;
  a.max_pending_handshakes = options.max_pending_handshakes;
  EMBER_RETURN_NOT_OK(ValidateAcceptorOptions(a));  // before binding: bad options never take the port
  EMBER_ASSIGN_OR_RAISE(Fd listener, Listen(options.bind_host, options.port));
  EMBER_ASSIGN_OR_RAISE(std::unique_ptr<Acceptor> acceptor, Acceptor::Serve(a, std::move(listener), std::move(handler)));
  return std::unique_ptr<Server>(new Server(options, std::move(acceptor)));
}

Server::Server(const ServerOptions& options, std::unique_ptr<Acceptor> acceptor)
    : options_(options), acceptor_(std::move(acceptor)) {}

Server::~Server() { Close(); }

}  // namespace ember::tcp
