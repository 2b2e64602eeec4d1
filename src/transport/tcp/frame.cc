#include "transport/tcp/frame.h"

#include <algorithm>
#include <vector>

#include "common/codec.h"
#include "transport/tcp/socket.h"

namespace ember::tcp {

std::string EncodeFrame(uint16_t type, std::string_view payload) {
  codec::Writer w;
  w.PutU32(static_cast<uint32_t>(payload.size()));
  w.PutU16(type);
  w.PutU16(kProtocolVersion);
  w.PutRaw(payload);
  return w.Release();
}

Status WriteFrame(int fd, uint16_t type, std::string_view payload, Deadline deadline,
                  const std::string& peer) {
  if (payload.size() > UINT32_MAX) {
    return Status::InvalidArgument("frame payload of " + std::to_string(payload.size()) +
                                   " bytes for " + peer + " exceeds the u32 length field");
  }
  const std::string bytes = EncodeFrame(type, payload);
  return WriteAll(fd, bytes.data(), bytes.size(), deadline, "write frame to " + peer);
}

Status WriteFrameParts(int fd, uint16_t type, std::span<const std::string_view> payload, Deadline deadline,
                       const std::string& peer) {
  size_t size = 0;
  for (std::string_view p : payload) size += p.size();
  if (size > UINT32_MAX) {
    return Status::InvalidArgument("frame payload of " + std::to_string(size) + " bytes for " + peer +
                                   " exceeds the u32 length field");
  }
  const std::string header = EncodeFrame(type, std::string_view());
  char h[kFrameHeaderBytes];
  std::copy(header.begin(), header.end(), h);
  for (int i = 0; i < 4; ++i) h[i] = static_cast<char>((size >> (8 * i)) & 0xff);  // the u32 length
  std::vector<std::string_view> parts;
  parts.reserve(payload.size() + 1);
  parts.emplace_back(h, sizeof(h));
  parts.insert(parts.end(), payload.begin(), payload.end());
  return WriteAllParts(fd, parts, deadline, "write frame to " + peer);
}

Result<Frame> ReadFrame(int fd, size_t max_payload_bytes, Deadline deadline,
                        const std::string& peer) {
  char header[kFrameHeaderBytes];
  EMBER_RETURN_NOT_OK(ReadExactly(fd, header, sizeof(header), deadline, "read frame from " + peer));
  codec::Reader r(std::string_view(header, sizeof(header)));
  uint32_t length = 0;
  uint16_t version = 0;
  Frame frame;
  EMBER_RETURN_NOT_OK(r.GetU32(&length));
  EMBER_RETURN_NOT_OK(r.GetU16(&frame.type));
  EMBER_RETURN_NOT_OK(r.GetU16(&version));
  if (version != kProtocolVersion) {
    return Status::Corruption("frame from " + peer + " has protocol version " +
                              std::to_string(version) + "; this build speaks version " +
                              std::to_string(kProtocolVersion));
  }
  if (length > max_payload_bytes) {
    return Status::Corruption("frame of " + std::to_string(length) + " bytes from " + peer +
                              " exceeds max_message_bytes (" + std::to_string(max_payload_bytes) +
                              ")");
  }
  frame.payload.resize(length);
  EMBER_RETURN_NOT_OK(
      ReadExactly(fd, frame.payload.data(), length, deadline, "read frame payload from " + peer));
  return frame;
}

}  // namespace ember::tcp
