#include <atomic>
#include <set>

#include "common/logging.h"
#include "ember/ps.h"
#include "ps/codec.h"
#include "ps/frames.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/server.h"

namespace ember::ps {

struct Server::Impl {
  ServerOptions options;
  std::unique_ptr<Shard> shard;
  std::unique_ptr<tcp::Server> tcp;
  std::atomic<uint64_t> next_owner{0};  // names each connection for the clocks

  // One connection: a request frame in, its reply frame out, until the peer leaves or Close().
  void ServeConnection(tcp::Connection& c) {
    const std::string peer = "worker at " + c.peer();
    // The workers that ticked a clock over this connection and have not left: when it ends,
    // they died (or were stopped), and the others stop waiting for them.
    std::set<std::string> clocked;
    const uint64_t owner = next_owner.fetch_add(1) + 1;
    struct LeaveAll {
      Impl& impl;
      std::set<std::string>& clocked;
      std::string peer;
      uint64_t owner;
      ~LeaveAll() {
        for (const auto& w : clocked) {
          if (impl.shard->Leave(w, "its connection (" + peer + ") closed without leave(): it died or was stopped",
                                owner)) {
            EMBER_LOG(WARN) << impl.options.name << ": " << w << " (" << peer
                            << ") went without leaving; the other workers no longer wait for it";
          }
        }
      }
    } leave_all{*this, clocked, peer, owner};
    for (;;) {
      auto frame = tcp::ReadFrame(c.fd(), options.max_message_bytes, Deadline::Infinite(), peer);
      if (!frame.ok()) {
        if (frame.status().code() == StatusCode::kCorruption) {
          EMBER_LOG(WARN) << options.name << ": dropping the connection of " << peer << ": "
                          << frame.status().message();
        }
        return;  // the peer left (Unavailable), or Close() shut the socket
      }
      if (frame->type != kRequestFrame) {
        EMBER_LOG(WARN) << options.name << ": dropping the connection of " << peer << ": frame type "
                        << frame->type << " is not a PS request";
        return;
      }
      // The reply's floats go out from where they are (head + values, one sendmsg).
      Reply reply;
      std::string worker;
      const Kind kind = Serve(*shard, frame->payload, &reply, owner, &worker);
      if (reply.status.ok() && kind == Kind::kClock) clocked.insert(worker);
      if (kind == Kind::kLeave) clocked.erase(worker);
      std::vector<std::string_view> parts = ReplyParts(kind, reply);
      size_t bytes = 0;
      for (auto part : parts) bytes += part.size();
      const std::string head = EncodeReplyHead(kind, reply, bytes / sizeof(float));
      parts.insert(parts.begin(), head);
      // A reply that cannot be written within a minute: the worker stopped reading; drop it.
      if (!tcp::WriteFrameParts(c.fd(), kReplyFrame, parts, Deadline::After(Duration(60000)), peer).ok()) return;
    }
  }
};

Server::Server() : impl_(new Impl) {}
Server::~Server() { Close(); }

Result<std::unique_ptr<Server>> Server::Start(const ServerOptions& options) {
  std::unique_ptr<Server> server(new Server());
  Impl& impl = *server->impl_;
  impl.options = options;
  impl.shard = std::make_unique<Shard>(options.name);
  tcp::ServerOptions t;
  t.name = "parameter server " + options.name;
  t.bind_host = options.bind_host;
  t.port = options.port;
  t.secret = options.secret;
  t.handshake_timeout = options.handshake_timeout;
  EMBER_ASSIGN_OR_RAISE(impl.tcp, tcp::Server::Start(t, [&impl](tcp::Connection& c) { impl.ServeConnection(c); }));
  EMBER_LOG(INFO) << "Ember parameter server " << options.name << " listening on " << options.bind_host << ":"
                  << impl.tcp->port();
  return server;
}

int Server::port() const { return impl_->tcp->port(); }
Shard& Server::shard() { return *impl_->shard; }

void Server::Close() {
  if (impl_->shard) impl_->shard->StopWaits();  // connection threads blocked in a clock wait return
  if (impl_->tcp) impl_->tcp->Close();
}

}  // namespace ember::ps
