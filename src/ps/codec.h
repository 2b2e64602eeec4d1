// The parameter server's messages (docs/ps.md, "Wire"): one request and its reply per frame of
// the job's authenticated TCP transport (or a shared-memory ring on one host).  Decoders parse
// untrusted bytes with codec::Reader: bounds-checked, Corruption naming the field and offset,
// no allocation larger than the message could hold.  Integers and floats little-endian.
//
// Request: u8 kind, then
//   kCreateDense  string tensor | u32 rule | f32 lr | f32 beta1 | f32 beta2 | f32 epsilon |
//                 f32 alpha | u8 flags (1: scale_by_staleness, 2: hogwild) | i64 staleness_bound |
//                 floats (initial values)
//   kPullDense    string tensor
//   kPushDense    string tensor | i64 base_version | floats
//   kCreateTable  string table | i32 dim | i64 seed | f32 init_scale | u32 rule | f32 lr
//   kPullRows     string table | ids
//   kPushRows     string table | ids | floats
//   kStats        (nothing)
//   floats: u64 n | n x f32;  ids: u64 n | n x i64
// Reply: u8 status code | string message (empty when OK) | on OK, by the request's kind:
//   kPullDense    i64 version | floats
//   kPushDense    u8 applied | i64 version | i64 staleness | floats (kElastic's difference)
//   kPullRows     floats
//   kStats        i64 applied | i64 rejected | i64 rows | u32 k | k x i64 (staleness histogram)
//   the others    nothing
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ember/ps.h"
#include "ember/result.h"

namespace ember::ps {

enum class Kind : uint8_t {
  kCreateDense = 1,
  kPullDense = 2,
  kPushDense = 3,
  kCreateTable = 4,
  kPullRows = 5,
  kPushRows = 6,
  kStats = 7,
};
const char* KindName(Kind kind);

struct Request {
  Kind kind = Kind::kStats;
  std::string name;             // tensor or table
  RuleOptions rule;             // kCreateDense
  TableOptions table;           // kCreateTable
  int64_t base_version = 0;     // kPushDense
  std::vector<int64_t> ids;     // kPullRows, kPushRows
  std::vector<float> values;    // kCreateDense, kPushDense, kPushRows
};

struct Reply {
  Status status;
  PullResult pull;              // kPullDense
  PushResult push;              // kPushDense
  std::vector<float> rows;      // kPullRows
  ShardStats stats;             // kStats
};

std::string EncodeRequest(const Request& r);
Result<Request> DecodeRequest(std::string_view bytes);
std::string EncodeReply(Kind kind, const Reply& r);
// The reply to a request of `kind`.  A reply carrying an error decodes to OK with that status in
// `status`; a malformed reply is Corruption.
Result<Reply> DecodeReply(Kind kind, std::string_view bytes);

// The shard's side of one request: decodes it, applies it to `shard`, and encodes the reply (a
// malformed request gets a Corruption reply; nothing is applied).  The whole server logic.
std::string Serve(Shard& shard, std::string_view request);

}  // namespace ember::ps
