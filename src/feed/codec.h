// The feed's messages (docs/wire.md, "Feed"): one (kind, payload) pair per
// message, the same through a node's shm::Ring and over a TCP feed
// connection (kind = frame type).  Every decoder parses untrusted bytes with
// codec::Reader: bounds-checked, Corruption naming the message, field and
// offset.  Integers little-endian; Arrow IPC streams are opaque bytes.
//
// Payload layouts:
//   kBatch           u32 partition | u32 epoch | u32 task attempt | u32 reserved (0) |
//                    i64 rows | Arrow IPC stream  (header 24 bytes: keeps the stream 8-aligned)
//   kEndPartition    u32 partition | u32 epoch | u32 n (>= 1) | n x i64 rows sent to node 0..n-1
//   kEndFeed         (empty)
//   kBeginPartition  u32 partition | u32 epoch | u32 flags | u32 length | result ring name
//   kResults         i64 rows | Arrow IPC stream                        (node -> task)
//   kEndResults      i64 rows answered                                  (node -> task)
//   kError           UTF-8 text                                         (node/server -> task)
//   kEndEpoch        u32 epoch | u32 partitions
//   kHello           u32 version (1) | i64 idle_timeout ms  (TCP only: a producer's first frame)
// Epoch kInferenceEpoch marks inference partitions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ember/feed.h"
#include "ember/result.h"

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
  kHello = 9,
  kFlush = 10,    // producer -> feed server: answer kFlushed once every earlier frame is in the ring
  kFlushed = 11,  // feed server -> producer
  kAwaitEpoch = 12,  // driver -> feed server: has the node begun training epoch N?
  kEpochState = 13,  // feed server -> driver: the answer (after at most about a second)
};

// "kBatch", ...; "unknown" otherwise.
const char* KindName(uint32_t kind);

// The epoch number of inference partitions: never one of train()'s epochs.
inline constexpr uint32_t kInferenceEpoch = 0xFFFFFFFFu;
inline constexpr uint32_t kBeginWantsResults = 1u;
inline constexpr size_t kResultsHeaderBytes = 8;
inline constexpr uint32_t kHelloVersion = 1;

struct BatchHeader {
  uint32_t partition = 0;
  uint32_t epoch = 0;
  uint32_t attempt = 0;
  int64_t rows = 0;
};
// Writes the header into out[0, kBatchHeaderBytes).  out.size() >= kBatchHeaderBytes.
void EncodeBatchHeader(const BatchHeader& h, std::span<uint8_t> out);
std::vector<uint8_t> EncodeBatch(const BatchHeader& h, std::span<const uint8_t> ipc);
// A kBatch payload as parts: `header` (kBatchHeaderBytes, filled in later by
// EncodeBatchHeader), then the IPC stream's parts.  Returns the stream's size.
size_t BatchParts(std::span<const std::span<const uint8_t>> ipc, std::span<uint8_t> header,
                  std::vector<std::span<const uint8_t>>* parts);
// The IPC stream is payload.subspan(kBatchHeaderBytes).
Result<BatchHeader> DecodeBatch(std::span<const uint8_t> payload);

struct EndPartitionMsg {
  uint32_t partition = 0;
  uint32_t epoch = 0;
  std::vector<int64_t> node_rows;  // >= 1 entries, each >= 0
};
std::vector<uint8_t> EncodeEndPartition(const EndPartitionMsg& m);
Result<EndPartitionMsg> DecodeEndPartition(std::span<const uint8_t> payload);

struct EndEpochMsg {
  uint32_t epoch = 0;
  uint32_t partitions = 0;
};
std::vector<uint8_t> EncodeEndEpoch(const EndEpochMsg& m);
Result<EndEpochMsg> DecodeEndEpoch(std::span<const uint8_t> payload);

Status DecodeEndFeed(std::span<const uint8_t> payload);

// kAwaitEpoch: the driver asks whether the node began training epoch `epoch`
// (or a later one).  The server answers with kEpochState once it has, or
// after a short while with begun = false and how far the node has read, so
// the driver can tell a busy node from one that stopped reading; it answers
// kError "Cancelled: ..." if the node terminated its feed.
struct AwaitEpochMsg {
  uint32_t epoch = 0;
};
std::vector<uint8_t> EncodeAwaitEpoch(const AwaitEpochMsg& m);
Result<AwaitEpochMsg> DecodeAwaitEpoch(std::span<const uint8_t> payload);

struct EpochStateMsg {
  bool begun = false;
  uint64_t read_bytes = 0;  // the node's ring read position
};
std::vector<uint8_t> EncodeEpochState(const EpochStateMsg& m);
Result<EpochStateMsg> DecodeEpochState(std::span<const uint8_t> payload);

struct BeginPartition {
  uint32_t partition = 0;
  uint32_t epoch = 0;
  uint32_t flags = 0;
  std::string result_ring;  // empty over TCP; the feed server fills it in
  bool wants_results() const { return (flags & kBeginWantsResults) != 0; }
};
std::vector<uint8_t> EncodeBeginPartition(const BeginPartition& m);
Result<BeginPartition> DecodeBeginPartition(std::span<const uint8_t> payload);

std::vector<uint8_t> EncodeResults(int64_t rows, std::span<const uint8_t> ipc);
// Returns the rows; the IPC stream is payload.subspan(kResultsHeaderBytes).
Result<int64_t> DecodeResults(std::span<const uint8_t> payload);

std::vector<uint8_t> EncodeEndResults(int64_t rows);
Result<int64_t> DecodeEndResults(std::span<const uint8_t> payload);

std::vector<uint8_t> EncodeError(std::string_view text);
Result<std::string> DecodeError(std::span<const uint8_t> payload);

struct Hello {
  Duration idle_timeout{600000};
};
std::vector<uint8_t> EncodeHello(const Hello& m);
Result<Hello> DecodeHello(std::span<const uint8_t> payload);

// Decodes `payload` as message `kind` and discards it: OK if well formed.
// What the fuzz target and the feed server's validation use.
Status ValidateMessage(uint32_t kind, std::span<const uint8_t> payload);

inline std::string_view AsChars(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}
inline std::span<const uint8_t> AsBytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace ember::feed
