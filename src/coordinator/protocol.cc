#include "coordinator/protocol.h"

#include <algorithm>
#include <cstdio>

namespace ember::coord {
namespace {

constexpr const char* kRoleOrder[] = {"ps", "chief", "master", "evaluator", "worker"};
constexpr uint8_t kMaxStateValue = static_cast<uint8_t>(NodeInfo::State::kLost);
constexpr uint8_t kMaxCodeValue = static_cast<uint8_t>(StatusCode::kInternal);

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

void EncodeNode(codec::Writer& w, const NodeInfo& n) {
  w.PutI32(n.address.executor_id);
  w.PutString(n.address.host);
  w.PutI32(n.address.port);
  w.PutI64(n.address.pid);
  w.PutString(n.role.job_name);
  w.PutI32(n.role.task_index);
  w.PutU8(static_cast<uint8_t>(n.state));
  w.PutString(n.error);
}

Status DecodeNode(codec::Reader& r, NodeInfo* n) {
  int32_t id = 0, port = 0, task = 0;
  uint8_t state = 0;
  EMBER_RETURN_NOT_OK(r.GetI32(&id));
  EMBER_RETURN_NOT_OK(r.GetString(&n->address.host));
  EMBER_RETURN_NOT_OK(r.GetI32(&port));
  EMBER_RETURN_NOT_OK(r.GetI64(&n->address.pid));
  EMBER_RETURN_NOT_OK(r.GetString(&n->role.job_name));
  EMBER_RETURN_NOT_OK(r.GetI32(&task));
  EMBER_RETURN_NOT_OK(r.GetU8(&state));
  EMBER_RETURN_NOT_OK(r.GetString(&n->error));
  if (state > kMaxStateValue) {
    return Status::Corruption("node state " + std::to_string(state) + " is not a known state");
  }
  n->address.executor_id = id;
  n->address.port = port;
  n->role.task_index = task;
  n->state = static_cast<NodeInfo::State>(state);
  return Status::OK();
}

}  // namespace

std::string_view MsgTypeName(uint16_t type) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kRegister: return "Register";
    case MsgType::kAttach: return "Attach";
    case MsgType::kBarrier: return "Barrier";
    case MsgType::kKvSet: return "KvSet";
    case MsgType::kKvGet: return "KvGet";
    case MsgType::kLog: return "Log";
    case MsgType::kReport: return "Report";
    case MsgType::kHeartbeat: return "Heartbeat";
    case MsgType::kDone: return "Done";
    case MsgType::kFail: return "Fail";
    case MsgType::kReply: return "Reply";
    case MsgType::kAbort: return "Abort";
    case MsgType::kStop: return "Stop";
  }
  return "unknown";
}

std::string DescribeNode(const NodeInfo& n) {
  return n.role.job_name + ":" + std::to_string(n.role.task_index) + " (executor " +
         std::to_string(n.address.executor_id) + ", host " + n.address.host + ", pid " +
         std::to_string(n.address.pid) + ")";
}

std::string EncodeReply(uint32_t request_id, const Status& status, std::string_view body) {
  codec::Writer w;
  w.PutU32(request_id);
  w.PutU8(static_cast<uint8_t>(status.code()));
  w.PutString(status.message());
  w.PutRaw(body);
  return w.Release();
}

Status DecodeReply(std::string_view payload, uint32_t* request_id, Status* status,
                   std::string* body) {
  codec::Reader r(payload);
  uint8_t code = 0;
  std::string message;
  EMBER_RETURN_NOT_OK(r.GetU32(request_id));
  EMBER_RETURN_NOT_OK(r.GetU8(&code));
  EMBER_RETURN_NOT_OK(r.GetString(&message));
  if (code > kMaxCodeValue) {
    return Status::Corruption("reply carries unknown status code " + std::to_string(code));
  }
  *status = Status(static_cast<StatusCode>(code), std::move(message));
  body->assign(r.rest());
  return Status::OK();
}

void EncodeRegistration(codec::Writer& w, const Registration& reg) {
  w.PutString(reg.role.job_name);
  w.PutI32(reg.role.task_index);
  w.PutString(reg.cluster_spec_json);
  w.PutI32(reg.num_nodes);
  w.PutU32(static_cast<uint32_t>(reg.nodes.size()));
  for (const NodeInfo& n : reg.nodes) EncodeNode(w, n);
}

Status DecodeRegistration(codec::Reader& r, Registration* reg) {
  int32_t task = 0, num_nodes = 0;
  uint32_t count = 0;
  EMBER_RETURN_NOT_OK(r.GetString(&reg->role.job_name));
  EMBER_RETURN_NOT_OK(r.GetI32(&task));
  EMBER_RETURN_NOT_OK(r.GetString(&reg->cluster_spec_json));
  EMBER_RETURN_NOT_OK(r.GetI32(&num_nodes));
  EMBER_RETURN_NOT_OK(r.GetU32(&count));
  // A node takes at least 33 bytes on the wire; bound the count before looping.
  if (count > r.remaining() / 33) {
    return Status::Corruption("registration lists " + std::to_string(count) +
                              " nodes but only " + std::to_string(r.remaining()) + " bytes follow");
  }
  reg->role.task_index = task;
  reg->num_nodes = num_nodes;
  reg->nodes.resize(count);
  for (NodeInfo& n : reg->nodes) EMBER_RETURN_NOT_OK(DecodeNode(r, &n));
  return r.ExpectEnd();
}

std::string ClusterSpecJson(const std::vector<NodeInfo>& nodes) {
  std::string out = "{";
  bool first_role = true;
  for (const char* role : kRoleOrder) {
    std::vector<const NodeInfo*> members;
    for (const NodeInfo& n : nodes) {
      if (n.role.job_name == role) members.push_back(&n);
    }
    if (members.empty()) continue;
    std::sort(members.begin(), members.end(), [](const NodeInfo* a, const NodeInfo* b) {
      return a->role.task_index < b->role.task_index;
    });
    if (!first_role) out += ",";
    first_role = false;
    AppendJsonString(&out, role);
    out += ":[";
    for (size_t i = 0; i < members.size(); ++i) {
      if (i) out += ",";
      AppendJsonString(&out, members[i]->address.host + ":" + std::to_string(members[i]->address.port));
    }
    out += "]";
  }
  out += "}";
  return out;
}

}  // namespace ember::coord
