#include "ps/shm_link.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <random>
#include <vector>

#include "common/shm.h"
#include "ps/codec.h"
#include "transport/tcp/frame.h"

namespace ember::ps {
namespace {

// How often a reader blocked on its ring looks at the connection (its peer's liveness).
constexpr Duration kLivenessSlice{100};

shm::RingWords Words(bool shard_reads) {
  shm::RingWords w;
  w.ring = shard_reads ? "PS request ring" : "PS reply ring";
  w.message = shard_reads ? "PS request" : "PS reply";
  w.consumer = shard_reads ? "the parameter server" : "the worker";
  w.producer = shard_reads ? "the worker" : "the parameter server";
  w.stalled = "is not reading it";
  w.terminated = "the ring was stopped";
  w.closed = shard_reads ? "the parameter server closed the connection" : "the worker closed the connection";
  return w;
}

}  // namespace

std::string_view LinkMessage::payload() const {
  if (lease) {  // past the pad (checked by Receive)
    auto p = lease->payload();
    return std::string_view(reinterpret_cast<const char*>(p.data()), p.size()).substr(1 + p[0]);
  }
  return frame;
}

std::string ShmLink::NewRingName() {
  static thread_local std::mt19937_64 rng(std::random_device{}() ^ (static_cast<uint64_t>(::getpid()) << 32));
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s%x-%016llx", kPsRingPrefix, static_cast<unsigned>(::getpid()),
                static_cast<unsigned long long>(rng()));
  return buf;
}

Result<std::unique_ptr<shm::Ring>> ShmLink::CreateReplyRing(const std::string& name, size_t bytes) {
  return shm::Ring::Create(name, bytes, Words(false));
}

Result<std::unique_ptr<shm::Ring>> ShmLink::CreateRequestRing(const std::string& name, size_t bytes) {
  return shm::Ring::Create(name, bytes, Words(true));
}

Result<std::unique_ptr<shm::Ring>> ShmLink::OpenPeerRing(const std::string& name, bool peer_is_shard) {
  EMBER_ASSIGN_OR_RAISE(std::unique_ptr<shm::Ring> ring, shm::Ring::Open(name, Words(peer_is_shard)));
  (void)UnlinkSharedMemoryName(name);  // mapped on both sides now: a killed process leaves no name
  return ring;
}

ShmLink::ShmLink(std::unique_ptr<shm::Ring> in, std::unique_ptr<shm::Ring> out, int fd, std::string peer)
    : in_(std::move(in)), out_(std::move(out)), fd_(fd), peer_(std::move(peer)) {}

ShmLink::~ShmLink() { Close(); }

void ShmLink::Close() {
  if (in_) in_->Close();
  if (out_) out_->Close();
}

Status ShmLink::Send(uint16_t frame_type, std::span<const std::string_view> parts, Deadline deadline) {
  size_t bytes = 0;
  for (auto p : parts) bytes += p.size();
  // Ring payloads start 8-byte aligned: pad so that 1 + p + the first part's size is a multiple of 4.
  static constexpr uint8_t kPad[4] = {0, 0, 0, 0};
  const size_t first = parts.empty() ? 0 : parts[0].size();
  const uint8_t pad = static_cast<uint8_t>((4 - (1 + first) % 4) % 4);
  if (1 + pad + bytes <= shm::Ring::MaxPayload(out_->capacity())) {
    std::vector<std::span<const uint8_t>> spans;
    spans.reserve(parts.size() + 2);
    spans.emplace_back(&pad, 1);
    spans.emplace_back(kPad, pad);
    for (auto p : parts) spans.emplace_back(reinterpret_cast<const uint8_t*>(p.data()), p.size());
    return out_->WriteParts(kInPlace, spans, deadline);
  }
  EMBER_RETURN_NOT_OK(out_->Write(kViaSocket, {}, deadline));
  return tcp::WriteFrameParts(fd_, frame_type, parts, deadline, peer_);
}

Result<LinkMessage> ShmLink::Receive(uint16_t frame_type, size_t max_frame_bytes, Deadline deadline) {
  const auto start = Deadline::Clock::now();
  for (;;) {
    LinkMessage m;
    Status s = in_->ReadLease(&m.lease, std::min(deadline, Deadline::After(kLivenessSlice)));
    if (s.ok()) {
      if (m.lease->kind() == kInPlace) {
        const auto p = m.lease->payload();
        if (p.empty() || p[0] > 3 || p.size() < 1u + p[0]) {
          return Status::Corruption(in_->name() + ": a message from " + peer_ + " of " + std::to_string(p.size()) +
                                    " bytes has no valid pad");
        }
        return m;
      }
      if (m.lease->kind() != kViaSocket) {
        return Status::Corruption(in_->name() + ": message kind " + std::to_string(m.lease->kind()) + " from " +
                                  peer_ + " is not a PS message");
      }
      m.lease.reset();
      EMBER_ASSIGN_OR_RAISE(tcp::Frame f, tcp::ReadFrame(fd_, max_frame_bytes, deadline, peer_));
      if (f.type != frame_type) {
        return Status::Corruption("frame type " + std::to_string(f.type) + " from " + peer_ + " where type " +
                                  std::to_string(frame_type) + " was due");
      }
      m.frame = std::move(f.payload);
      return m;
    }
    if (s.code() != StatusCode::kDeadlineExceeded) return s;
    EMBER_RETURN_NOT_OK(PeerGone());
    if (deadline.expired()) {
      return Status::DeadlineExceeded("no message from " + peer_ + " within " +
                                      FormatDuration(std::chrono::duration_cast<Duration>(Deadline::Clock::now() - start)) +
                                      " (shared-memory ring " + in_->name() + ")");
    }
  }
}

Status ShmLink::PeerGone() const {
  pollfd p{fd_, POLLIN | POLLRDHUP, 0};
  int n;
  do {
    n = ::poll(&p, 1, 0);
  } while (n < 0 && errno == EINTR);
  if (n <= 0) return Status::OK();
  bool gone = (p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) != 0;
  if (!gone && (p.revents & POLLIN)) {
    char c;
    const ssize_t r = ::recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    gone = r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
  }
  if (!gone) return Status::OK();
  return Status::Unavailable(peer_ + " closed the connection (it died, left, or is shutting down)");
}

}  // namespace ember::ps
