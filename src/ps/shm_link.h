// ShmLink: one side of the shared-memory path between a worker and a shard on one host
// (docs/ps.md, "Shared memory").  Internal to src/ps.
//
// Each side reads one ring (it created it: the consumer) and writes the other's (a producer).
// The worker's reply ring is offered over the authenticated TCP connection (kShmOfferFrame); the
// shard opens it, creates its request ring and answers with that name (kShmAnswerFrame); each
// side then unlinks the name of the ring it opened, so nothing is left in /dev/shm by a killed
// process.  The TCP connection stays: it tells each side that the other is alive (a ring's
// reader cannot see its writer die), and it carries a message too large for the ring (a
// kViaSocket marker in the ring says a frame follows on the socket, so order is kept).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ember/deadline.h"
#include "ember/result.h"
#include "transport/shm/ring.h"

namespace ember::ps {

// A message received: its payload is a view of the lease (in the ring) or of the frame (the socket).
struct LinkMessage {
  std::shared_ptr<const shm::RingLease> lease;
  std::string frame;
  std::string_view payload() const;
};

class ShmLink {
 public:
  // Ring message kinds.
  static constexpr uint32_t kInPlace = 1;    // the message itself
  static constexpr uint32_t kViaSocket = 2;  // the message is the next frame on the socket

  // A fresh ring name (kPsRingPrefix, pid, 64 random bits).
  static std::string NewRingName();
  // The worker's reply ring (it reads it) and the shard's request ring (it reads it).
  static Result<std::unique_ptr<shm::Ring>> CreateReplyRing(const std::string& name, size_t bytes);
  static Result<std::unique_ptr<shm::Ring>> CreateRequestRing(const std::string& name, size_t bytes);
  // Opens the peer's ring to write to it, then unlinks its name (both sides have it mapped).
  static Result<std::unique_ptr<shm::Ring>> OpenPeerRing(const std::string& name, bool peer_is_shard);

  // `fd`: the connection (not owned); `peer`: how errors name the other side.
  ShmLink(std::unique_ptr<shm::Ring> in, std::unique_ptr<shm::Ring> out, int fd, std::string peer);
  ~ShmLink();

  // Sends one message given in parts: into the peer's ring if it fits, else a kViaSocket marker
  // there and a frame of `frame_type` on the socket.  In the ring a kInPlace message is
  // u8 p | p zero bytes | the message, p chosen so the first part ends 4-byte aligned (a
  // request's floats follow its head: the shard reads them in place).  DeadlineExceeded if the peer does not
  // make room in time; Aborted if it closed its ring or its process died.
  Status Send(uint16_t frame_type, std::span<const std::string_view> parts, Deadline deadline);
  // Receives one message: waits on this side's ring in short slices, checking between them that
  // the connection is still open (Unavailable naming the peer when it closed: it died, left,
  // or the server is closing).  A kViaSocket marker reads the next frame of `frame_type`
  // (at most `max_frame_bytes`) from the socket.
  Result<LinkMessage> Receive(uint16_t frame_type, size_t max_frame_bytes, Deadline deadline);
  // Wakes a Receive on another thread, which returns Aborted; later calls fail.  Idempotent.
  void Close();

 private:
  Status PeerGone() const;  // Unavailable if the socket saw its peer close, else OK

  std::unique_ptr<shm::Ring> in_;
  std::unique_ptr<shm::Ring> out_;
  const int fd_;
  const std::string peer_;
};

}  // namespace ember::ps
