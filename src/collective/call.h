// What one collective call is, as every rank must agree on it.  Backends
// carry it with the data (shared-memory slots, TCP frame headers) and compare
// it with their own, so a mismatched call is named instead of producing a
// wrong sum or a hang.
#pragma once

#include <cstdint>
#include <string>

#include "common/codec.h"
#include "ember/collective.h"

namespace ember::collective {

enum class Kind : uint8_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kAllgather = 3,  // equal and varying sizes (count = total elements of the output)
  kReduceScatter = 4,
  kBarrier = 5,
};
const char* KindName(Kind kind);

struct CallDesc {
  uint64_t seq = 0;  // call number on the communicator, from 1 (the same on every rank)
  Kind kind = Kind::kBarrier;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;  // reductions only; backends see kSum/kMin/kMax
  uint64_t count = 0;  // elements: allreduce/broadcast the buffer; allgather the whole output;
                       // reduce-scatter the output block of one rank
  int32_t root = 0;    // broadcast only

  bool operator==(const CallDesc&) const = default;
  // "allreduce #12 (float32 sum, 1000 elements)"
  std::string ToString() const;
  // Bytes of the call's buffer (count * element size).
  size_t bytes() const { return count * SizeOf(dtype); }
};

// Fixed-size wire form (docs/wire.md, "Collectives"): 24 bytes.
inline constexpr size_t kCallDescBytes = 24;
void EncodeCallDesc(const CallDesc& desc, codec::Writer* w);
// Corruption if the bytes are not a call descriptor (unknown kind/dtype/op).
Status DecodeCallDesc(codec::Reader* r, CallDesc* desc);

// InvalidArgument "mismatched collective calls: <mine_name> made <mine>, <theirs_name> made <theirs>",
// or OK when they agree.
Status CheckSameCall(const CallDesc& mine, const std::string& mine_name, const CallDesc& theirs,
                     const std::string& theirs_name);

// The TCP ring's control messages (tcp_ring.h has the frame types and the
// rules; docs/wire.md "Collectives: TCP ring").
inline constexpr size_t kMaxRingIdBytes = 256;
inline constexpr size_t kMaxReasonBytes = 1024;

// hello / hello-ack: i32 ring size | i32 from rank | i32 to rank | string ring_id
struct Hello {
  int32_t size = 0, from = 0, to = 0;
  std::string ring_id;
};
std::string EncodeHello(const Hello& hello);
// Corruption if `bytes` are not exactly one hello.
Status DecodeHello(std::string_view bytes, Hello* hello);

// abort: u8 status code | i32 origin rank | string message (cut to kMaxReasonBytes)
std::string EncodeAbort(const Status& status, int origin);
// The status an abort frame carries (its code and message), with the origin
// rank; Corruption for an unknown code or an origin outside 0..size-1.
Status DecodeAbort(std::string_view bytes, int size, int* origin);

}  // namespace ember::collective
