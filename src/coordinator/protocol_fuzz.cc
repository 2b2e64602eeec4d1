// libFuzzer target for every decoder of the coordinator's messages
// (coordinator/codec.h): the server reads the requests from any peer that
// passed the handshake, a node reads the replies and pushes, the relay and
// its agent read each other's Relay* frames.  The first byte
// picks the decoder; none may crash, read out of bounds or over-allocate, and
// what decodes must re-encode to the same bytes (Report and Reply: to bytes
// that decode and re-encode to themselves, since a map's keys may arrive
// unsorted and an OK status drops its message).  Built with
// -DEMBER_BUILD_FUZZERS=ON under clang (`make fuzz`).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "coordinator/codec.h"

namespace {

using namespace ember::coord;

// Decode(bytes) ok => Encode of it gives `bytes` back.
template <class Decode>
void Same(std::string_view bytes, Decode decode) {
  auto m = decode(bytes);
  if (m.ok() && Encode(*m) != bytes) std::abort();
}

// Decode(bytes) ok => its encoding is a fixed point of decode-then-encode.
template <class Decode>
void Stable(std::string_view bytes, Decode decode) {
  auto m = decode(bytes);
  if (!m.ok()) return;
  const std::string once = Encode(*m);
  auto again = decode(once);
  if (!again.ok() || Encode(*again) != once) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t pick = data[0] % 20;
  std::string_view bytes(reinterpret_cast<const char*>(data + 1), size - 1);
  switch (pick) {
    case 0: Same(bytes, DecodeRegister); break;
    case 1: Same(bytes, DecodeAttach); break;
    case 2: Same(bytes, DecodeBarrier); break;
    case 3: Same(bytes, DecodeKvSet); break;
    case 4: Same(bytes, DecodeKvGet); break;
    case 5: Same(bytes, DecodeLog); break;
    case 6: Stable(bytes, DecodeReport); break;
    case 7: Same(bytes, DecodeHeartbeat); break;
    case 8: Same(bytes, DecodeDone); break;
    case 9: Same(bytes, DecodeFail); break;
    case 10: Stable(bytes, DecodeReply); break;
    case 11: Same(bytes, DecodeAbort); break;
    case 12: Same(bytes, DecodeStop); break;
    case 13: {
      auto reg = DecodeRegisterReply(bytes);
      if (reg.ok() && EncodeRegisterReply(*reg) != bytes) std::abort();
      break;
    }
    case 14: {
      auto value = DecodeKvGetReply(bytes);
      if (value.ok() && EncodeKvGetReply(*value) != bytes) std::abort();
      break;
    }
    case 15: Same(bytes, DecodeRelayControl); break;
    case 16: Same(bytes, DecodeRelayData); break;
    case 17: Same(bytes, DecodeRelayOpen); break;
    default: {
      // Any frame type, as the server's and client's dispatch see it.
      if (bytes.size() < 2) break;
      const uint16_t type = static_cast<uint16_t>(static_cast<uint8_t>(bytes[0]) |
                                                  (static_cast<uint8_t>(bytes[1]) << 8));
      (void)ValidateMessage(type, bytes.substr(2));
      break;
    }
  }
  return 0;
}
