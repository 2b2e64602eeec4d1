// libFuzzer target for the coordinator's payload parsers (what a node or the
// server reads from an authenticated peer): a reply header and a registration.
// Neither may crash, read out of bounds or over-allocate; what parses must
// re-encode to what parses the same (a registration: to the same bytes).  Built with -DEMBER_BUILD_FUZZERS=ON
// under clang (`make fuzz`).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "coordinator/protocol.h"
#include "common/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);

  uint32_t request_id = 0;
  ember::Status status;
  std::string body;
  if (ember::coord::DecodeReply(bytes, &request_id, &status, &body).ok()) {
    // An OK status drops its message, so compare what decodes again, not the bytes.
    const std::string again = ember::coord::EncodeReply(request_id, status, body);
    uint32_t id2 = 0;
    ember::Status status2;
    std::string body2;
    if (!ember::coord::DecodeReply(again, &id2, &status2, &body2).ok() || id2 != request_id ||
        status2.code() != status.code() || status2.message() != status.message() || body2 != body) {
      std::abort();
    }
  }

  ember::codec::Reader r(bytes);
  ember::Registration reg;
  if (ember::coord::DecodeRegistration(r, &reg).ok()) {
    ember::codec::Writer w;
    ember::coord::EncodeRegistration(w, reg);
    if (w.data() != bytes) std::abort();
  }
  return 0;
}
