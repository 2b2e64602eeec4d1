// libFuzzer target for a checkpoint's MANIFEST (checkpoint/manifest.h): the
// file's bytes are untrusted.  Whatever they are, ParseManifest returns a
// manifest or Corruption and never reads out of bounds; a manifest it
// accepts is canonical: encoding it again gives the same bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "checkpoint/manifest.h"

using namespace ember;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto m = checkpoint::ParseManifest(bytes, "fuzz");
  if (m.ok()) {
    if (checkpoint::EncodeManifest(*m) != bytes) std::abort();
    for (const auto& b : m->blobs) {
      if (!checkpoint::ValidBlobName(b.name)) std::abort();
    }
  } else if (m.status().code() != StatusCode::kCorruption) {
    std::abort();
  }
  return 0;
}
