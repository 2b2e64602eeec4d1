#include <algorithm>
#include <atomic>
#include <set>

#include "common/logging.h"
#include "ember/ps.h"
#include "ps/codec.h"
#include "ps/frames.h"
#include "ps/shm_link.h"
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
    std::unique_ptr<ShmLink> link;  // once the worker took shared memory
    for (;;) {
      LinkMessage request;
      if (link) {
        auto m = link->Receive(kRequestFrame, options.max_message_bytes, Deadline::Infinite());
        if (!m.ok()) {
          if (m.status().code() == StatusCode::kCorruption) {
            EMBER_LOG(WARN) << options.name << ": dropping the connection of " << peer << ": " << m.status().message();
          }
          return;  // the peer left (Unavailable), or Close() shut the socket
        }
        request = std::move(*m);
      } else {
        auto frame = tcp::ReadFrame(c.fd(), options.max_message_bytes, Deadline::Infinite(), peer);
        if (!frame.ok()) {
          if (frame.status().code() == StatusCode::kCorruption) {
            EMBER_LOG(WARN) << options.name << ": dropping the connection of " << peer << ": "
                            << frame.status().message();
          }
          return;  // the peer left (Unavailable), or Close() shut the socket
        }
        if (frame->type == kShmOfferFrame) {
          Status s = AnswerShmOffer(c, frame->payload, peer, &link);
          if (!s.ok()) {
            EMBER_LOG(WARN) << options.name << ": dropping the connection of " << peer << ": " << s.message();
            return;
          }
          continue;
        }
        if (frame->type != kRequestFrame) {
          EMBER_LOG(WARN) << options.name << ": dropping the connection of " << peer << ": frame type "
                          << frame->type << " is not a PS request";
          return;
        }
        request.frame = std::move(frame->payload);
      }
      // The reply's floats go out from where they are (head + values, one sendmsg or ring write);
      // over shared memory a pull goes from the tensor into the ring under its lock, over TCP it
      // is copied first, so no lock waits on a socket.  A reply that cannot be written within a
      // minute: the worker stopped reading; drop it.
      const Deadline deadline = Deadline::After(Duration(60000));
      std::string worker;
      const Served served = ServeTo(
          *shard, request.payload(),
          [&](std::span<const std::string_view> parts) {
            return link ? link->Send(kReplyFrame, parts, deadline)
                        : tcp::WriteFrameParts(c.fd(), kReplyFrame, parts, deadline, peer);
          },
          /*pull_in_place=*/link != nullptr, owner, &worker);
      request = {};  // the request's ring bytes are free again
      if (served.replied.ok() && served.kind == Kind::kClock) clocked.insert(worker);
      if (served.kind == Kind::kLeave) clocked.erase(worker);
      if (!served.sent.ok()) return;
    }
  }

  // A worker on this host offers its reply ring: open it and answer with a request ring of our
  // own (then `link` is set), or with "" when the ring is not here (another host, another
  // /dev/shm) or cannot be made, and the connection stays on TCP.  A malformed offer is an error.
  Status AnswerShmOffer(tcp::Connection& c, std::string_view payload, const std::string& peer,
                        std::unique_ptr<ShmLink>* link) {
    EMBER_ASSIGN_OR_RAISE(ShmOffer offer, DecodeShmOffer(payload));
    std::string answer;
    auto out = ShmLink::OpenPeerRing(offer.ring, /*peer_is_shard=*/false);
    std::unique_ptr<shm::Ring> in;
    if (out.ok()) {
      const size_t bytes = std::clamp<uint64_t>(offer.request_bytes, 64 << 10, options.max_message_bytes + (1 << 20));
      auto created = ShmLink::CreateRequestRing(ShmLink::NewRingName(), bytes);
      if (created.ok()) {
        in = created.MoveValueUnsafe();
        answer = in->name();
      } else {
        EMBER_LOG(WARN) << options.name << ": " << peer << " stays on TCP: " << created.status().message();
      }
    } else if (out.status().code() != StatusCode::kNotFound) {
      EMBER_LOG(WARN) << options.name << ": " << peer << " stays on TCP: " << out.status().message();
    }
    EMBER_RETURN_NOT_OK(tcp::WriteFrame(c.fd(), kShmAnswerFrame, EncodeShmAnswer(answer),
                                        Deadline::After(options.handshake_timeout), peer));
    if (in) *link = std::make_unique<ShmLink>(std::move(in), out.MoveValueUnsafe(), c.fd(), peer);
    return Status::OK();
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
