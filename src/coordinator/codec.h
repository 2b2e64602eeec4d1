// The coordinator's messages (docs/wire.md, "Messages"): one typed struct and
// one Encode/Decode pair per message kind, the only place their byte layouts
// are written.  A message travels as one frame (transport/tcp/frame.h) whose
// type is the struct's kType; the client (client.cc) and the server
// (server_requests.cc, server.cc) only fill and read these structs.
//
// Every payload starts with a u32 request id chosen by the client.  Requests
// that expect a reply use a non-zero id, echoed by the server's Reply;
// one-way messages (Log, Report, Heartbeat) and server pushes (Abort, Stop)
// carry 0 (not checked on decode).
//
// Every decoder parses untrusted bytes (a peer that passed the handshake may
// still be buggy) with codec::Reader: bounds-checked, never allocating more
// than the payload could hold, the payload consumed whole.  Failures are
// Corruption "malformed <Kind> message: <field, offset>", or "malformed
// <Kind> reply" for a reply body.  Fuzzed by protocol_fuzz.
//
// Payload layouts (docs/wire.md has the field encodings):
//   Register   u32 id | i32 executor_id | string host | i32 port | i64 pid | i64 timeout_ms
//   Attach     u32 id | i32 executor_id
//   Barrier    u32 id | string name | i64 timeout_ms
//   KvSet      u32 id | string key | string value
//   KvGet      u32 id | string key | i64 timeout_ms
//   Log        u32 0  | string stream | string line
//   Report     u32 0  | map metrics
//   Heartbeat  u32 0
//   Done       u32 id
//   Fail       u32 id | string error
//   Reply      u32 id | u8 status code | string message | body
//   Abort      u32 0  | string reason
//   Stop       u32 0  | string reason
// The coordinator relay's (relay.h), agent <-> relay only:
//   RelayControl  u32 0 | u16 relay version
//   RelayData     u32 0 | u64 tunnel id
//   RelayOpen     u32 0 | u64 tunnel id
// Reply bodies (when the status is OK; empty otherwise):
//   Register   Registration: string job_name | i32 task_index | string cluster_spec_json |
//              i32 num_nodes | u32 count | count x node
//   KvGet      string value
//   others     empty
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "ember/coordinator.h"
#include "ember/result.h"

namespace ember::coord {

enum class MsgType : uint16_t {
  // client -> server
  kRegister = 1,
  kAttach = 2,
  kBarrier = 3,
  kKvSet = 4,
  kKvGet = 5,
  kLog = 6,
  kReport = 7,
  kHeartbeat = 8,
  kDone = 9,
  kFail = 10,
  // relay agent -> coordinator relay (relay.h): the first frame of an agent's connection
  kRelayControl = 32,
  kRelayData = 33,
  // server -> client
  kReply = 64,
  kAbort = 65,
  kStop = 66,
  // coordinator relay -> relay agent, on the control connection
  kRelayOpen = 80,
};

// "Register", ...; "unknown" otherwise.
std::string_view MsgTypeName(uint16_t type);

// ---- client -> server ----------------------------------------------------

// Makes the connection the node's lifeline; answered once every node is in.
struct RegisterRequest {
  static constexpr MsgType kType = MsgType::kRegister;
  uint32_t request_id = 0;
  NodeAddress self;
  Duration timeout{0};  // how long the server parks the request (it clamps)
};
std::string Encode(const RegisterRequest& m);
Result<RegisterRequest> DecodeRegister(std::string_view payload);

struct AttachRequest {
  static constexpr MsgType kType = MsgType::kAttach;
  uint32_t request_id = 0;
  int32_t executor_id = 0;
};
std::string Encode(const AttachRequest& m);
Result<AttachRequest> DecodeAttach(std::string_view payload);

struct BarrierRequest {
  static constexpr MsgType kType = MsgType::kBarrier;
  uint32_t request_id = 0;
  std::string name;
  Duration timeout{0};
};
std::string Encode(const BarrierRequest& m);
Result<BarrierRequest> DecodeBarrier(std::string_view payload);

struct KvSetRequest {
  static constexpr MsgType kType = MsgType::kKvSet;
  uint32_t request_id = 0;
  std::string key;    // docs/wire.md, "Key/value namespace"
  std::string value;  // opaque bytes
};
std::string Encode(const KvSetRequest& m);
Result<KvSetRequest> DecodeKvSet(std::string_view payload);

struct KvGetRequest {
  static constexpr MsgType kType = MsgType::kKvGet;
  uint32_t request_id = 0;
  std::string key;
  Duration timeout{0};
};
std::string Encode(const KvGetRequest& m);
Result<KvGetRequest> DecodeKvGet(std::string_view payload);

struct LogMessage {  // one-way
  static constexpr MsgType kType = MsgType::kLog;
  uint32_t request_id = 0;
  std::string stream;  // "stdout" / "stderr"
  std::string line;
};
std::string Encode(const LogMessage& m);
Result<LogMessage> DecodeLog(std::string_view payload);

struct ReportMessage {  // one-way
  static constexpr MsgType kType = MsgType::kReport;
  uint32_t request_id = 0;
  std::map<std::string, double> metrics;
};
std::string Encode(const ReportMessage& m);
// Accepts keys in any order (a later duplicate wins); Encode writes them sorted.
Result<ReportMessage> DecodeReport(std::string_view payload);

struct HeartbeatMessage {  // one-way
  static constexpr MsgType kType = MsgType::kHeartbeat;
  uint32_t request_id = 0;
};
std::string Encode(const HeartbeatMessage& m);
Result<HeartbeatMessage> DecodeHeartbeat(std::string_view payload);

struct DoneRequest {
  static constexpr MsgType kType = MsgType::kDone;
  uint32_t request_id = 0;
};
std::string Encode(const DoneRequest& m);
Result<DoneRequest> DecodeDone(std::string_view payload);

struct FailRequest {
  static constexpr MsgType kType = MsgType::kFail;
  uint32_t request_id = 0;
  std::string error;
};
std::string Encode(const FailRequest& m);
Result<FailRequest> DecodeFail(std::string_view payload);

// ---- server -> client ----------------------------------------------------

struct Reply {
  static constexpr MsgType kType = MsgType::kReply;
  uint32_t request_id = 0;
  Status status;     // an OK status travels without its message
  std::string body;  // per request kind (below); empty unless status is OK
};
std::string Encode(const Reply& m);
// Corruption for a status code this build does not know.
Result<Reply> DecodeReply(std::string_view payload);

struct AbortPush {
  static constexpr MsgType kType = MsgType::kAbort;
  uint32_t request_id = 0;
  std::string reason;  // names node, role, host and error
};
std::string Encode(const AbortPush& m);
Result<AbortPush> DecodeAbort(std::string_view payload);

struct StopPush {
  static constexpr MsgType kType = MsgType::kStop;
  uint32_t request_id = 0;
  std::string reason;
};
std::string Encode(const StopPush& m);
Result<StopPush> DecodeStop(std::string_view payload);

// ---- relay agent <-> coordinator relay (relay.h) ------------------------

// The relay protocol's version: RelayControl carries it, the relay refuses another.
inline constexpr uint16_t kRelayVersion = 1;

// The first frame of the agent's control connection.
struct RelayControlMessage {
  static constexpr MsgType kType = MsgType::kRelayControl;
  uint32_t request_id = 0;
  uint16_t version = kRelayVersion;
};
std::string Encode(const RelayControlMessage& m);
Result<RelayControlMessage> DecodeRelayControl(std::string_view payload);

// The first frame of an agent's data connection: it carries tunnel `tunnel_id`.
struct RelayDataMessage {
  static constexpr MsgType kType = MsgType::kRelayData;
  uint32_t request_id = 0;
  uint64_t tunnel_id = 0;
};
std::string Encode(const RelayDataMessage& m);
Result<RelayDataMessage> DecodeRelayData(std::string_view payload);

// Relay -> agent: a node connected; open a data connection for `tunnel_id`.
struct RelayOpenPush {
  static constexpr MsgType kType = MsgType::kRelayOpen;
  uint32_t request_id = 0;
  uint64_t tunnel_id = 0;
};
std::string Encode(const RelayOpenPush& m);
Result<RelayOpenPush> DecodeRelayOpen(std::string_view payload);

// Reply bodies.  Register's: the Registration (nodes ordered by executor_id).
std::string EncodeRegisterReply(const Registration& reg);
Result<Registration> DecodeRegisterReply(std::string_view body);
// KvGet's: the value.
std::string EncodeKvGetReply(std::string_view value);
Result<std::string> DecodeKvGetReply(std::string_view body);

// Decodes `payload` as message `type` (either direction) and discards it: OK
// if well formed, Corruption "unknown message type" for a type not above.
Status ValidateMessage(uint16_t type, std::string_view payload);

}  // namespace ember::coord
