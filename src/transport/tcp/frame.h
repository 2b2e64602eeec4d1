// Framing: every message on an Ember connection (after the handshake) is
//   u32 payload length (LE) | u16 message type (LE) | u16 protocol version (LE) | payload
// See docs/wire.md.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "ember/deadline.h"
#include "ember/result.h"

namespace ember::tcp {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 8;

struct Frame {
  uint16_t type = 0;
  std::string payload;
};

// Encodes header + payload into one buffer (one send per frame).
std::string EncodeFrame(uint16_t type, std::string_view payload);

// Writes one frame within `deadline`.  Not thread-safe per fd: callers
// serialize writers.  `peer` names the other side in errors.
Status WriteFrame(int fd, uint16_t type, std::string_view payload, Deadline deadline,
                  const std::string& peer);

// WriteFrame of a payload given as parts (written with one sendmsg: no copy into one buffer).
Status WriteFrameParts(int fd, uint16_t type, std::span<const std::string_view> payload, Deadline deadline,
                       const std::string& peer);

// Reads one frame within `deadline`.  Corruption (naming the size, the limit
// and `peer`) if the declared length exceeds `max_payload_bytes` or the
// version is not kProtocolVersion; the payload is then not read.
// Unavailable if the peer closed the connection.
Result<Frame> ReadFrame(int fd, size_t max_payload_bytes, Deadline deadline,
                        const std::string& peer);

}  // namespace ember::tcp
