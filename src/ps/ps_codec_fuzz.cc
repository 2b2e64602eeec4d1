// libFuzzer target: the parameter server's request and reply decoders, the shared-memory offer
// and answer (a peer's ring names), and Serve on a shard,
// must not crash, read out of bounds or over-allocate on arbitrary bytes; whatever decodes
// re-encodes to the same bytes.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "ps/codec.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ember::ps;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto request = DecodeRequest(bytes);
  if (request.ok()) {
    if (EncodeRequest(*request) != bytes) __builtin_trap();
    // Serve it on a shard holding a small tensor and table (a huge table's pulls are bounded by
    // the shard itself; keep the fuzzer's memory small).
    if (!(request->kind == Kind::kCreateTable && request->table.dim > 64)) {
      // Two equal shards: Serve on one, ServeTo with pulls in place on the other must answer the
      // same bytes.
      auto make = [] {
        auto shard = std::make_unique<Shard>("ps:fuzz");
        (void)shard->CreateDense("w", std::vector<float>{1, 2, 3}, RuleOptions{});
        TableOptions t;
        t.dim = 4;
        (void)shard->CreateTable("emb", t);
        return shard;
      };
      auto shard = make(), twin = make();
      // A clock wait would block the fuzzer: a stopped shard answers every wait at once.
      if (request->kind == Kind::kClock && request->wait_ms != 0) {
        shard->StopWaits();
        twin->StopWaits();
      }
      const std::string reply = Serve(*shard, bytes);
      if (!DecodeReply(request->kind, reply).ok()) __builtin_trap();
      std::string in_place;
      (void)ServeTo(*twin, bytes, [&](std::span<const std::string_view> parts) {
        for (auto part : parts) in_place.append(part);
        return ember::Status::OK();
      }, /*pull_in_place=*/true);
      // (a clock's reply carries the microseconds it waited: not the same twice)
      if (request->kind != Kind::kClock && in_place != reply) __builtin_trap();
    }
  }
  if (auto offer = DecodeShmOffer(bytes); offer.ok()) {
    if (!IsPsRingName(offer->ring) || EncodeShmOffer(*offer) != bytes) __builtin_trap();
  }
  if (auto answer = DecodeShmAnswer(bytes); answer.ok()) {
    if ((!answer->empty() && !IsPsRingName(*answer)) || EncodeShmAnswer(*answer) != bytes) __builtin_trap();
  }
  if (size > 0) {
    const Kind kind = static_cast<Kind>(1 + data[0] % 11);
    (void)DecodeReply(kind, bytes.substr(1));
  }
  return 0;
}
