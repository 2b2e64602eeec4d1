// The feed over TCP: each (kind, payload) message is one net frame whose
// type is the FeedKind (net/frame.h, docs/wire.md "Feed").  These helpers
// move payloads straight between the socket and the caller's buffer, without
// the std::string copies of tcp::ReadFrame/WriteFrame.  Message payloads are
// feed/codec.h's.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ember/deadline.h"
#include "ember/result.h"
#include "feed/codec.h"

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

}  // namespace ember::feed
