// Coordinator wire messages (docs/wire.md is the reference; keep in sync).
//
// Every request payload starts with a u32 request id chosen by the client.
// Requests that expect a reply use a non-zero id; the server's Reply echoes
// it.  One-way messages (Log, Report, Heartbeat) use id 0 and get no reply.
// Pushes from the server (Abort, Stop) carry id 0.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ember/coordinator.h"
#include "common/codec.h"

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
  // server -> client
  kReply = 64,
  kAbort = 65,
  kStop = 66,
};

std::string_view MsgTypeName(uint16_t type);

// "worker:1 (executor 2, host h, pid 77)".
std::string DescribeNode(const NodeInfo& node);

// Reply payload: u32 request_id | u8 status code | string message | body.
std::string EncodeReply(uint32_t request_id, const Status& status, std::string_view body);
// Parses the reply header; `body` receives the remaining bytes.
Status DecodeReply(std::string_view payload, uint32_t* request_id, Status* status,
                   std::string* body);

void EncodeRegistration(codec::Writer& w, const Registration& reg);
Status DecodeRegistration(codec::Reader& r, Registration* reg);

// TF cluster spec JSON for `nodes`: keys in TFoS role order (ps, chief,
// master, evaluator, worker), only roles present, each list by task_index.
std::string ClusterSpecJson(const std::vector<NodeInfo>& nodes);

}  // namespace ember::coord
