// libFuzzer target for the node start-up message decoder (node/startup.h):
// the bytes a node process reads from its launcher's pipe.  It may not crash,
// read out of bounds or over-allocate; whatever decodes re-encodes to the
// same bytes (the encoding is canonical).  Built with -DEMBER_BUILD_FUZZERS=ON
// under clang (`make fuzz`).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "node/startup.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto context = ember::node::DecodeStartup(bytes);
  if (context.ok()) {
    auto again = ember::node::EncodeStartup(*context);
    if (!again.ok() || *again != bytes) std::abort();
  }
  return 0;
}
