// The feed over TCP: each (kind, payload) message is one net frame whose
// type is the FeedKind (net/frame.h, docs/wire.md "Feed").  These helpers
// move payloads straight between the socket and the caller's buffer, without
// the std::string copies of tcp::ReadFrame/WriteFrame, and encode the one
// payload the feed server rewrites (kBeginPartition).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/deadline.h"
#include "ember/result.h"
#include "feed/messages.h"

namespace ember::feed {

// Writes one frame within `deadline`; errors as tcp::WriteAll, naming `peer`.
// Not thread-safe per fd: callers serialize writers.
Status SendFeedFrame(int fd, FeedKind kind, std::span<const uint8_t> payload, Deadline deadline,
                     const std::string& peer);

// Reads one frame into *kind / *payload (resized).  Corruption, with the
// payload left unread, if the protocol version differs or the length exceeds
// `max_payload_bytes`; Unavailable if the peer closed the connection.  The
// kind is not checked against FeedKind: that is the caller's protocol.
Status RecvFeedFrame(int fd, size_t max_payload_bytes, Deadline deadline, const std::string& peer,
                     uint32_t* kind, std::vector<uint8_t>* payload);

// kBeginPartition's payload (messages.h).
struct BeginPartition {
  uint32_t partition = 0;
  uint32_t epoch = 0;
  uint32_t flags = 0;
  std::string result_ring;  // empty over TCP; the feed server fills it in
  bool wants_results() const { return (flags & kBeginWantsResults) != 0; }
};

// Corruption (naming the field) on a truncated or over-long payload.
Result<BeginPartition> ParseBeginPartition(std::span<const uint8_t> payload);
std::vector<uint8_t> EncodeBeginPartition(const BeginPartition& begin);

// The leading "u32 partition | u32 epoch" of kBatch and kEndPartition.
// Corruption if the payload is shorter than 8 bytes.
Status ParsePartitionPrefix(std::span<const uint8_t> payload, uint32_t* partition, uint32_t* epoch);

}  // namespace ember::feed
