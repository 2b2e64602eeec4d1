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
//   kClock        string worker | i64 clock | i64 bound | i32 workers | i64 wait_ms (< 0: no deadline)
//   kLeave        string worker
//   kPullMany     u32 n | n x string tensor
//   kPushMany     u32 n | n x (string tensor | i64 base_version | i64 count) | floats (the n
//                 updates, concatenated; the counts sum to their number)
//   floats: u64 n | n x f32;  ids: u64 n | n x i64
// Reply: u8 status code | string message (empty when OK) | on OK, by the request's kind:
//   kPullDense    i64 version | floats
//   kPushDense    u8 applied | i64 version | i64 staleness | floats (kElastic's difference)
//   kPullRows     floats
//   kStats        i64 applied | i64 rejected | i64 rows | u32 k | k x i64 (staleness histogram)
//   kClock        i64 clock | i64 min_clock | i64 waited_us
//   kPullMany     u32 n | n x (i64 version | i64 count) | floats (the n tensors' values, concatenated)
//   kPushMany     u32 n | n x (u8 applied | i64 version | i64 staleness | i64 count) | floats (the
//                 kElastic differences, concatenated; count 0 for the other rules)
//   the others    nothing
//
// Shared memory (docs/ps.md, "Shared memory"): a worker on the shard's host offers its reply
// ring in a kShmOfferFrame (ps/frames.h), payload: string ring | u64 request ring bytes; the
// shard answers kShmAnswerFrame, payload: string ring (its request ring; empty: stay on TCP).
// Ring names are "/ember-ps-" then 1 to 48 of [0-9a-z-].
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ember/ps.h"
#include "ember/result.h"

namespace ember::codec {
class Reader;
class Writer;
}  // namespace ember::codec

namespace ember::ps {

// Field encodings the wire and the shard's snapshots (shard.cc) share.
void PutF32(codec::Writer& w, float v);  // the bit pattern as u32
Status GetF32(codec::Reader& r, float* out);
Status GetRule(codec::Reader& r, Rule* out);  // u32, Corruption for an unknown rule
void PutFloats(codec::Writer& w, std::span<const float> v);  // i64 n | n x f32
// i64 n | n x f32, n checked against the bytes left: a view of the floats, copied into `out`
// when `copy`.
Status GetFloats(codec::Reader& r, const char* what, bool copy, std::vector<float>* out, std::string_view* view);

enum class Kind : uint8_t {
  kCreateDense = 1,
  kPullDense = 2,
  kPushDense = 3,
  kCreateTable = 4,
  kPullRows = 5,
  kPushRows = 6,
  kStats = 7,
  kClock = 8,
  kLeave = 9,
  kPullMany = 10,
  kPushMany = 11,
};
inline constexpr uint32_t kMaxManyTensors = 1 << 16;  // tensors in one kPullMany / kPushMany
const char* KindName(Kind kind);

struct Request {
  Kind kind = Kind::kStats;
  std::string name;             // tensor or table
  RuleOptions rule;             // kCreateDense
  TableOptions table;           // kCreateTable
  int64_t base_version = 0;     // kPushDense
  std::vector<int64_t> ids;     // kPullRows, kPushRows
  std::vector<float> values;    // kCreateDense, kPushDense, kPushRows
  // DecodeRequest without copy_values: the floats of kPushDense, kPushRows and kPushMany as a
  // view of the decoded bytes (`values` stays empty); EncodeRequest sends them if `values` is empty.
  std::string_view values_bytes;
  int64_t clock = 0;            // kClock
  int64_t bound = -1;           // kClock
  int32_t workers = 0;          // kClock
  int64_t wait_ms = -1;         // kClock: how long the shard may wait (< 0: no deadline)
  std::vector<std::string> names;  // kPullMany, kPushMany
  std::vector<int64_t> bases;      // kPushMany: each update's base version
  std::vector<int64_t> counts;     // kPushMany: each update's floats (in `values`, in order)
};

struct Reply {
  Status status;
  // DecodeReply: the trailing floats (pull values, elastic difference, rows) as a view of the
  // decoded bytes; with copy_values they are also copied into their vector.
  std::string_view values_bytes;
  PullResult pull;              // kPullDense
  PushResult push;              // kPushDense
  std::vector<float> rows;      // kPullRows
  ShardStats stats;             // kStats
  ClockResult clock;            // kClock
  std::vector<PullResult> pulls;   // kPullMany (DecodeReply without copy_values: values empty,
                                   // counts[i] floats of values_bytes each, in order)
  std::vector<PushResult> pushes;  // kPushMany (likewise for the elastic differences)
  std::vector<int64_t> counts;     // DecodeReply of kPullMany / kPushMany: floats per entry
};

std::string EncodeRequest(const Request& r);
// Every field up to the trailing floats' count (`values` of them): the floats, always last, are
// then sent from where they are (EncodeRequest = head + the bytes of r.values).
std::string EncodeRequestHead(const Request& r, size_t values);
Result<Request> DecodeRequest(std::string_view bytes, bool copy_values = true);
// A request's update floats: `values`, or `values_bytes` read in place when 4-byte aligned, else
// copied into `scratch` (kept by the caller, so its memory is reused call after call).
std::span<const float> RequestFloats(const Request& q, std::vector<float>* scratch);
std::string EncodeReply(Kind kind, const Reply& r);
// The floats that follow a reply's head, as byte views of where they are (one per tensor for the
// "many" kinds, else at most one): the server sends head + these.
std::vector<std::string_view> ReplyParts(Kind kind, const Reply& r);
// The same split for replies: head, then the bytes of ReplyValues(kind, r).
// `counts` (kPullMany): each entry's float count, when the entries' values are not in `r`.
std::string EncodeReplyHead(Kind kind, const Reply& r, size_t values, std::span<const size_t> counts = {});
const std::vector<float>& ReplyValues(Kind kind, const Reply& r);
// The reply to a request of `kind`.  A reply carrying an error decodes to OK with that status in
// `status`; a malformed reply is Corruption.  Without copy_values the trailing floats are only
// in `values_bytes` (a view of `bytes`).
Result<Reply> DecodeReply(Kind kind, std::string_view bytes, bool copy_values = true);

// The shared-memory offer and answer (see the top).
struct ShmOffer {
  std::string ring;          // the worker's reply ring
  uint64_t request_bytes = 0;  // the capacity it asks for the shard's request ring
};
std::string EncodeShmOffer(const ShmOffer& offer);
Result<ShmOffer> DecodeShmOffer(std::string_view bytes);
std::string EncodeShmAnswer(const std::string& ring);
Result<std::string> DecodeShmAnswer(std::string_view bytes);  // "" is valid: stay on TCP
// Whether `name` is a PS ring's name (a peer's offer or answer must name one; nothing else of
// /dev/shm is opened on its word).
bool IsPsRingName(std::string_view name);
inline constexpr char kPsRingPrefix[] = "/ember-ps-";

// The shard's side of one request: decodes it, applies it to `shard`, and encodes the reply (a
// malformed request gets a Corruption reply; nothing is applied).  The whole server logic.
std::string Serve(Shard& shard, std::string_view request);
// The same, leaving the reply decoded in `reply` (the server sends it as head + values, with no
// copy of the values into one buffer); returns the kind to encode it as.  `owner` names the
// connection for the clocks (Shard::Clock); `worker` (if given) gets a kClock's or kLeave's
// worker name.
Kind Serve(Shard& shard, std::string_view request, Reply* reply, uint64_t owner = 0, std::string* worker = nullptr);
// The same, the encoded reply (head, then its floats as byte views) handed to `send`: the server's
// one path for both transports.  With `pull_in_place` a pull's floats are the tensors' own, sent
// while their locks are held (Shard::ReadDense), with no copy in between: for a `send` that cannot
// block for long (the shared-memory reply ring, empty while the worker waits for its reply); not
// for a socket, which may.  The bytes are the same as Serve's either way.
using ReplySender = std::function<Status(std::span<const std::string_view> parts)>;
struct Served {
  Kind kind = Kind::kStats;  // what the reply was encoded as
  Status replied;            // the reply's status (the request's outcome)
  Status sent;               // what `send` returned
};
Served ServeTo(Shard& shard, std::string_view request, const ReplySender& send, bool pull_in_place,
               uint64_t owner = 0, std::string* worker = nullptr);

}  // namespace ember::ps
