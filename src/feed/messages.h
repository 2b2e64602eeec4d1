// The data feed's message kinds.  The same (kind, payload) messages travel
// through a node's shm::Ring (same host) and over an authenticated TCP feed
// connection (other hosts; kind = frame type).  See docs/wire.md, "Feed".
//
// Payload layouts (integers little-endian):
//   kBatch           u32 partition | u32 epoch | u32 task attempt |
//                    Arrow IPC stream (schema + 1 record batch)
//   kEndPartition    u32 partition | u32 epoch | u32 n | n x i64 rows of this partition sent
//                    to node 0..n-1 (every feeding task sends one to every node, even with
//                    0 rows, so every node learns every node's total)
//   kEndEpoch        u32 epoch | u32 partitions the epoch had  (driver -> node, after the
//                    epoch's Spark job ended: the epoch is complete once that many
//                    kEndPartition markers of it have arrived)
//   kEndFeed         (empty)  no more data for this node, ever
//   kBeginPartition  u32 partition | u32 epoch | u32 flags | u32 name length | result ring name
//                    flags bit 0: results wanted (inference).  Over TCP the name is
//                    empty and the node's feed server makes a local result ring.
//   kResults         Arrow IPC stream: output rows, in input order        (node -> task)
//   kEndResults      i64 rows answered                                    (node -> task)
//   kError           UTF-8 text: why the node cannot answer                (node -> task)
#pragma once

#include <cstdint>

namespace ember::feed {

enum class FeedKind : uint32_t {
  kBatch = 1,
  kEndPartition = 2,
  kEndFeed = 3,
  kBeginPartition = 4,
  kResults = 5,
  kEndResults = 6,
  kError = 7,
  kEndEpoch = 8,
};

inline constexpr uint32_t kBeginWantsResults = 1u;

}  // namespace ember::feed
