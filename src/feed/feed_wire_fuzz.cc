// libFuzzer target for the feed payload parsers that see untrusted bytes
// (the feed server parses kBeginPartition / kEndPartition from the network).
#include <cstddef>
#include <cstdint>
#include <algorithm>
#include <cstdlib>
#include <span>

#include "feed/feed_wire.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::span<const uint8_t> bytes(data, size);
  ember::Result<ember::feed::BeginPartition> begin = ember::feed::ParseBeginPartition(bytes);
  if (begin.ok()) {
    // What parses exactly must re-encode to the same bytes.
    std::vector<uint8_t> again = ember::feed::EncodeBeginPartition(*begin);
    if (again.size() != size || !std::equal(again.begin(), again.end(), data)) std::abort();
  }
  uint32_t partition = 0, epoch = 0;
  (void)ember::feed::ParsePartitionPrefix(bytes, &partition, &epoch);
  return 0;
}
