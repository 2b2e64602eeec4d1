#include "coordinator/codec.h"

#include "common/codec.h"

namespace ember::coord {
namespace {

constexpr uint8_t kMaxStateValue = static_cast<uint8_t>(NodeInfo::State::kLost);
constexpr uint8_t kMaxCodeValue = static_cast<uint8_t>(StatusCode::kInternal);
// A node takes at least 33 bytes on the wire (three empty strings).
constexpr size_t kMinNodeBytes = 4 + 4 + 4 + 8 + 4 + 4 + 1 + 4;

// u32 request id, then what `fields` writes.
template <class M, class Fields>
std::string EncodeWith(const M& m, Fields fields) {
  codec::Writer w;
  w.PutU32(m.request_id);
  fields(w);
  return w.Release();
}

// The inverse: the id, the fields, nothing after them.  Errors name the kind.
template <class M, class Fields>
Result<M> DecodeWith(std::string_view payload, Fields fields) {
  codec::Reader r(payload);
  M m;
  Status st = r.GetU32(&m.request_id);
  if (st.ok()) st = fields(r, m);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) {
    return st.WithContext("malformed " + std::string(MsgTypeName(uint16_t(M::kType))) + " message");
  }
  return m;
}

Status GetDuration(codec::Reader& r, Duration* out) {
  int64_t ms = 0;
  EMBER_RETURN_NOT_OK(r.GetI64(&ms));
  *out = Duration(ms);
  return Status::OK();
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
  const size_t state_at = r.offset();
  EMBER_RETURN_NOT_OK(r.GetU8(&state));
  EMBER_RETURN_NOT_OK(r.GetString(&n->error));
  if (state > kMaxStateValue) {
    return Status::Corruption("node state " + std::to_string(state) + " at offset " +
                              std::to_string(state_at) + " is not a known state");
  }
  n->address.executor_id = id;
  n->address.port = port;
  n->role.task_index = task;
  n->state = static_cast<NodeInfo::State>(state);
  return Status::OK();
}

// The reason of Abort and Stop.
template <class M>
Result<M> DecodePush(std::string_view payload) {
  return DecodeWith<M>(payload, [](codec::Reader& r, M& m) { return r.GetString(&m.reason); });
}

template <class M>
Status Check(const Result<M>& m) {
  return m.status();
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
    case MsgType::kRelayControl: return "RelayControl";
    case MsgType::kRelayData: return "RelayData";
    case MsgType::kRelayOpen: return "RelayOpen";
  }
  return "unknown";
}

std::string Encode(const RegisterRequest& m) {
  return EncodeWith(m, [&](codec::Writer& w) {
    w.PutI32(m.self.executor_id);
    w.PutString(m.self.host);
    w.PutI32(m.self.port);
    w.PutI64(m.self.pid);
    w.PutI64(m.timeout.count());
  });
}

Result<RegisterRequest> DecodeRegister(std::string_view payload) {
  return DecodeWith<RegisterRequest>(payload, [](codec::Reader& r, RegisterRequest& m) {
    int32_t eid = 0, port = 0;
    EMBER_RETURN_NOT_OK(r.GetI32(&eid));
    EMBER_RETURN_NOT_OK(r.GetString(&m.self.host));
    EMBER_RETURN_NOT_OK(r.GetI32(&port));
    EMBER_RETURN_NOT_OK(r.GetI64(&m.self.pid));
    EMBER_RETURN_NOT_OK(GetDuration(r, &m.timeout));
    m.self.executor_id = eid;
    m.self.port = port;
    return Status::OK();
  });
}

std::string Encode(const AttachRequest& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutI32(m.executor_id); });
}

Result<AttachRequest> DecodeAttach(std::string_view payload) {
  return DecodeWith<AttachRequest>(
      payload, [](codec::Reader& r, AttachRequest& m) { return r.GetI32(&m.executor_id); });
}

std::string Encode(const BarrierRequest& m) {
  return EncodeWith(m, [&](codec::Writer& w) {
    w.PutString(m.name);
    w.PutI64(m.timeout.count());
  });
}

Result<BarrierRequest> DecodeBarrier(std::string_view payload) {
  return DecodeWith<BarrierRequest>(payload, [](codec::Reader& r, BarrierRequest& m) {
    EMBER_RETURN_NOT_OK(r.GetString(&m.name));
    return GetDuration(r, &m.timeout);
  });
}

std::string Encode(const KvSetRequest& m) {
  return EncodeWith(m, [&](codec::Writer& w) {
    w.PutString(m.key);
    w.PutString(m.value);
  });
}

Result<KvSetRequest> DecodeKvSet(std::string_view payload) {
  return DecodeWith<KvSetRequest>(payload, [](codec::Reader& r, KvSetRequest& m) {
    EMBER_RETURN_NOT_OK(r.GetString(&m.key));
    return r.GetString(&m.value);
  });
}

std::string Encode(const KvGetRequest& m) {
  return EncodeWith(m, [&](codec::Writer& w) {
    w.PutString(m.key);
    w.PutI64(m.timeout.count());
  });
}

Result<KvGetRequest> DecodeKvGet(std::string_view payload) {
  return DecodeWith<KvGetRequest>(payload, [](codec::Reader& r, KvGetRequest& m) {
    EMBER_RETURN_NOT_OK(r.GetString(&m.key));
    return GetDuration(r, &m.timeout);
  });
}

std::string Encode(const LogMessage& m) {
  return EncodeWith(m, [&](codec::Writer& w) {
    w.PutString(m.stream);
    w.PutString(m.line);
  });
}

Result<LogMessage> DecodeLog(std::string_view payload) {
  return DecodeWith<LogMessage>(payload, [](codec::Reader& r, LogMessage& m) {
    EMBER_RETURN_NOT_OK(r.GetString(&m.stream));
    return r.GetString(&m.line);
  });
}

std::string Encode(const ReportMessage& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutMap(m.metrics); });
}

Result<ReportMessage> DecodeReport(std::string_view payload) {
  return DecodeWith<ReportMessage>(
      payload, [](codec::Reader& r, ReportMessage& m) { return r.GetMap(&m.metrics); });
}

std::string Encode(const HeartbeatMessage& m) {
  return EncodeWith(m, [](codec::Writer&) {});
}

Result<HeartbeatMessage> DecodeHeartbeat(std::string_view payload) {
  return DecodeWith<HeartbeatMessage>(payload,
                                      [](codec::Reader&, HeartbeatMessage&) { return Status::OK(); });
}

std::string Encode(const DoneRequest& m) {
  return EncodeWith(m, [](codec::Writer&) {});
}

Result<DoneRequest> DecodeDone(std::string_view payload) {
  return DecodeWith<DoneRequest>(payload, [](codec::Reader&, DoneRequest&) { return Status::OK(); });
}

std::string Encode(const FailRequest& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutString(m.error); });
}

Result<FailRequest> DecodeFail(std::string_view payload) {
  return DecodeWith<FailRequest>(
      payload, [](codec::Reader& r, FailRequest& m) { return r.GetString(&m.error); });
}

std::string Encode(const Reply& m) {
  return EncodeWith(m, [&](codec::Writer& w) {
    w.PutU8(static_cast<uint8_t>(m.status.code()));
    w.PutString(m.status.message());
    w.PutRaw(m.body);
  });
}

Result<Reply> DecodeReply(std::string_view payload) {
  // The body is the rest of the payload, so this one takes no ExpectEnd.
  codec::Reader r(payload);
  Reply m;
  uint8_t code = 0;
  std::string message;
  Status st = r.GetU32(&m.request_id);
  const size_t code_at = r.offset();
  if (st.ok()) st = r.GetU8(&code);
  if (st.ok()) st = r.GetString(&message);
  if (st.ok() && code > kMaxCodeValue) {
    st = Status::Corruption("status code " + std::to_string(code) + " at offset " +
                            std::to_string(code_at) + " is not a known code");
  }
  if (!st.ok()) return st.WithContext("malformed Reply message");
  m.status = Status(static_cast<StatusCode>(code), std::move(message));
  m.body.assign(r.rest());
  return m;
}

std::string Encode(const AbortPush& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutString(m.reason); });
}

Result<AbortPush> DecodeAbort(std::string_view payload) { return DecodePush<AbortPush>(payload); }

std::string Encode(const StopPush& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutString(m.reason); });
}

Result<StopPush> DecodeStop(std::string_view payload) { return DecodePush<StopPush>(payload); }

std::string Encode(const RelayControlMessage& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutU16(m.version); });
}

Result<RelayControlMessage> DecodeRelayControl(std::string_view payload) {
  return DecodeWith<RelayControlMessage>(
      payload, [](codec::Reader& r, RelayControlMessage& m) { return r.GetU16(&m.version); });
}

std::string Encode(const RelayDataMessage& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutU64(m.tunnel_id); });
}

Result<RelayDataMessage> DecodeRelayData(std::string_view payload) {
  return DecodeWith<RelayDataMessage>(
      payload, [](codec::Reader& r, RelayDataMessage& m) { return r.GetU64(&m.tunnel_id); });
}

std::string Encode(const RelayOpenPush& m) {
  return EncodeWith(m, [&](codec::Writer& w) { w.PutU64(m.tunnel_id); });
}

Result<RelayOpenPush> DecodeRelayOpen(std::string_view payload) {
  return DecodeWith<RelayOpenPush>(
      payload, [](codec::Reader& r, RelayOpenPush& m) { return r.GetU64(&m.tunnel_id); });
}

std::string EncodeRegisterReply(const Registration& reg) {
  codec::Writer w;
  w.PutString(reg.role.job_name);
  w.PutI32(reg.role.task_index);
  w.PutString(reg.cluster_spec_json);
  w.PutI32(reg.num_nodes);
  w.PutU32(static_cast<uint32_t>(reg.nodes.size()));
  for (const NodeInfo& n : reg.nodes) EncodeNode(w, n);
  return w.Release();
}

Result<Registration> DecodeRegisterReply(std::string_view body) {
  codec::Reader r(body);
  Registration reg;
  const auto fields = [&]() -> Status {
    int32_t task = 0, num_nodes = 0;
    uint32_t count = 0;
    EMBER_RETURN_NOT_OK(r.GetString(&reg.role.job_name));
    EMBER_RETURN_NOT_OK(r.GetI32(&task));
    EMBER_RETURN_NOT_OK(r.GetString(&reg.cluster_spec_json));
    EMBER_RETURN_NOT_OK(r.GetI32(&num_nodes));
    const size_t count_at = r.offset();
    EMBER_RETURN_NOT_OK(r.GetU32(&count));
    if (count > r.remaining() / kMinNodeBytes) {  // bounded before allocating
      return Status::Corruption("node count " + std::to_string(count) + " at offset " +
                                std::to_string(count_at) + " but only " +
                                std::to_string(r.remaining()) + " bytes follow");
    }
    reg.role.task_index = task;
    reg.num_nodes = num_nodes;
    reg.nodes.resize(count);
    for (NodeInfo& n : reg.nodes) EMBER_RETURN_NOT_OK(DecodeNode(r, &n));
    return r.ExpectEnd();
  };
  if (Status st = fields(); !st.ok()) return st.WithContext("malformed Register reply");
  return reg;
}

std::string EncodeKvGetReply(std::string_view value) {
  codec::Writer w;
  w.PutString(value);
  return w.Release();
}

Result<std::string> DecodeKvGetReply(std::string_view body) {
  codec::Reader r(body);
  std::string value;
  Status st = r.GetString(&value);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return st.WithContext("malformed KvGet reply");
  return value;
}

Status ValidateMessage(uint16_t type, std::string_view payload) {
  switch (static_cast<MsgType>(type)) {
    case MsgType::kRegister: return Check(DecodeRegister(payload));
    case MsgType::kAttach: return Check(DecodeAttach(payload));
    case MsgType::kBarrier: return Check(DecodeBarrier(payload));
    case MsgType::kKvSet: return Check(DecodeKvSet(payload));
    case MsgType::kKvGet: return Check(DecodeKvGet(payload));
    case MsgType::kLog: return Check(DecodeLog(payload));
    case MsgType::kReport: return Check(DecodeReport(payload));
    case MsgType::kHeartbeat: return Check(DecodeHeartbeat(payload));
    case MsgType::kDone: return Check(DecodeDone(payload));
    case MsgType::kFail: return Check(DecodeFail(payload));
    case MsgType::kReply: return Check(DecodeReply(payload));
    case MsgType::kAbort: return Check(DecodeAbort(payload));
    case MsgType::kStop: return Check(DecodeStop(payload));
    case MsgType::kRelayControl: return Check(DecodeRelayControl(payload));
    case MsgType::kRelayData: return Check(DecodeRelayData(payload));
    case MsgType::kRelayOpen: return Check(DecodeRelayOpen(payload));
  }
  return Status::Corruption("unknown message type " + std::to_string(type));
}

}  // namespace ember::coord
