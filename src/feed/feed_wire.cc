#include "feed/feed_wire.h"

#include <cstring>

#include "common/codec.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/socket.h"

namespace ember::feed {
namespace {

// Below this a frame goes out in one send (header and payload copied
// together); above it the payload is sent from the caller's buffer.
constexpr size_t kCoalesceBytes = 64 * 1024;

}  // namespace

Status SendFeedFrame(int fd, FeedKind kind, std::span<const uint8_t> payload, Deadline deadline,
                     const std::string& peer) {
  if (payload.size() > UINT32_MAX) {
    return Status::InvalidArgument("feed message of " + std::to_string(payload.size()) + " bytes for " +
                                   peer + " exceeds the u32 frame length");
  }
  if (static_cast<uint32_t>(kind) > UINT16_MAX) {
    return Status::InvalidArgument("feed message kind " + std::to_string(static_cast<uint32_t>(kind)) +
                                   " does not fit the u16 frame type");
  }
  const std::string what = "write feed frame to " + peer;
  if (payload.size() <= kCoalesceBytes) {
    const std::string bytes = tcp::EncodeFrame(static_cast<uint16_t>(kind), AsChars(payload));
    return tcp::WriteAll(fd, bytes.data(), bytes.size(), deadline, what);
  }
  codec::Writer header;  // the layout of tcp::EncodeFrame, without the payload copy
  header.PutU32(static_cast<uint32_t>(payload.size()));
  header.PutU16(static_cast<uint16_t>(kind));
  header.PutU16(tcp::kProtocolVersion);
  EMBER_RETURN_NOT_OK(tcp::WriteAll(fd, header.data().data(), header.data().size(), deadline, what));
  return tcp::WriteAll(fd, payload.data(), payload.size(), deadline, what);
}

Status RecvFeedFrame(int fd, size_t max_payload_bytes, Deadline deadline, const std::string& peer,
                     uint32_t* kind, std::vector<uint8_t>* payload) {
  char header[tcp::kFrameHeaderBytes];
  EMBER_RETURN_NOT_OK(tcp::ReadExactly(fd, header, sizeof(header), deadline, "read feed frame from " + peer));
  codec::Reader r(std::string_view(header, sizeof(header)));
  uint32_t length = 0;
  uint16_t type = 0;
  uint16_t version = 0;
  EMBER_RETURN_NOT_OK(r.GetU32(&length));
  EMBER_RETURN_NOT_OK(r.GetU16(&type));
  EMBER_RETURN_NOT_OK(r.GetU16(&version));
  if (version != tcp::kProtocolVersion) {
    return Status::Corruption("feed frame from " + peer + " has protocol version " + std::to_string(version) +
                              "; this build speaks version " + std::to_string(tcp::kProtocolVersion));
  }
  if (length > max_payload_bytes) {
    return Status::Corruption("feed frame of " + std::to_string(length) + " bytes from " + peer +
                              " exceeds max_message_bytes (" + std::to_string(max_payload_bytes) + ")");
  }
  *kind = type;
  payload->resize(length);
  if (length == 0) return Status::OK();
  return tcp::ReadExactly(fd, payload->data(), length, deadline, "read feed frame payload from " + peer);
}

}  // namespace ember::feed
