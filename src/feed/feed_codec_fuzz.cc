// libFuzzer target for every decoder of the feed's messages (feed/codec.h)
// and of the feed endpoint: each sees bytes from the network or from another
// process.  The first byte picks the message kind; what decodes must
// re-encode to the same bytes.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string_view>

#include "ember/feed.h"
#include "feed/codec.h"

namespace {

using namespace ember::feed;

void Same(const std::vector<uint8_t>& again, std::span<const uint8_t> bytes) {
  if (again.size() != bytes.size() || !std::equal(again.begin(), again.end(), bytes.begin())) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t pick = data[0] % 13;
  std::span<const uint8_t> bytes(data + 1, size - 1);
  switch (pick) {
    case 1: {
      auto h = DecodeBatch(bytes);
      if (h.ok()) {
        std::vector<uint8_t> again(bytes.begin(), bytes.end());
        EncodeBatchHeader(*h, again);
        // The reserved field is ignored on decode; everything else must survive.
        auto h2 = DecodeBatch(again);
        if (!h2.ok() || h2->rows != h->rows || h2->partition != h->partition || h2->epoch != h->epoch ||
            h2->attempt != h->attempt) {
          std::abort();
        }
      }
      break;
    }
    case 2: {
      auto m = DecodeEndPartition(bytes);
      if (m.ok()) Same(EncodeEndPartition(*m), bytes);
      break;
    }
    case 3:
      (void)DecodeEndFeed(bytes);
      break;
    case 4: {
      auto m = DecodeBeginPartition(bytes);
      if (m.ok()) Same(EncodeBeginPartition(*m), bytes);
      break;
    }
    case 5: {
      auto rows = DecodeResults(bytes);
      if (rows.ok()) Same(EncodeResults(*rows, bytes.subspan(kResultsHeaderBytes)), bytes);
      break;
    }
    case 6: {
      auto rows = DecodeEndResults(bytes);
      if (rows.ok()) Same(EncodeEndResults(*rows), bytes);
      break;
    }
    case 7: {
      auto text = DecodeError(bytes);
      if (text.ok()) Same(EncodeError(*text), bytes);
      break;
    }
    case 8: {
      auto m = DecodeEndEpoch(bytes);
      if (m.ok()) Same(EncodeEndEpoch(*m), bytes);
      break;
    }
    case 9: {
      auto m = DecodeHello(bytes);
      if (m.ok()) Same(EncodeHello(*m), bytes);
      break;
    }
    case 10: {
      auto e = NodeEndpoint::Decode(AsChars(bytes));
      if (e.ok()) {
        const std::string again = e->Encode();
        if (again != AsChars(bytes)) std::abort();
      }
      break;
    }
    case 11: {
      auto m = DecodeAwaitEpoch(bytes);
      if (m.ok()) Same(EncodeAwaitEpoch(*m), bytes);
      break;
    }
    case 12: {
      auto m = DecodeEpochState(bytes);
      if (m.ok()) Same(EncodeEpochState(*m), bytes);
      break;
    }
    default:
      (void)ValidateMessage(data[0], bytes);
      break;
  }
  return 0;
}
