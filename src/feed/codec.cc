#include "feed/codec.h"

#include <cstring>

#include "common/codec.h"

namespace ember::feed {
namespace {

std::vector<uint8_t> ToBytes(const std::string& s) { return {s.begin(), s.end()}; }

void StoreLE(uint8_t* out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<uint8_t>(v >> (8 * i));
}

// Corruption naming the message kind; the Reader's own text names field and offset.
Status Malformed(const Status& st, const char* kind) {
  return st.WithContext(std::string("malformed ") + kind + " message");
}

Status NonNegative(int64_t v, const char* field, size_t offset, const char* kind) {
  if (v >= 0) return Status::OK();
  return Status::Corruption(std::string("malformed ") + kind + " message: " + field + " at offset " +
                            std::to_string(offset) + " is negative (" + std::to_string(v) + ")");
}

}  // namespace

const char* KindName(uint32_t kind) {
  switch (static_cast<FeedKind>(kind)) {
    case FeedKind::kBatch: return "kBatch";
    case FeedKind::kEndPartition: return "kEndPartition";
    case FeedKind::kEndFeed: return "kEndFeed";
    case FeedKind::kBeginPartition: return "kBeginPartition";
    case FeedKind::kResults: return "kResults";
    case FeedKind::kEndResults: return "kEndResults";
    case FeedKind::kError: return "kError";
    case FeedKind::kEndEpoch: return "kEndEpoch";
    case FeedKind::kHello: return "kHello";
    case FeedKind::kFlush: return "kFlush";
    case FeedKind::kFlushed: return "kFlushed";
    case FeedKind::kAwaitEpoch: return "kAwaitEpoch";
    case FeedKind::kEpochState: return "kEpochState";
  }
  return "unknown";
}

void EncodeBatchHeader(const BatchHeader& h, std::span<uint8_t> out) {
  uint8_t* p = out.data();
  StoreLE(p, h.partition, 4);
  StoreLE(p + 4, h.epoch, 4);
  StoreLE(p + 8, h.attempt, 4);
  StoreLE(p + 12, 0, 4);
  StoreLE(p + 16, static_cast<uint64_t>(h.rows), 8);
}

std::vector<uint8_t> EncodeBatch(const BatchHeader& h, std::span<const uint8_t> ipc) {
  std::vector<uint8_t> out(kBatchHeaderBytes + ipc.size());
  EncodeBatchHeader(h, out);
  if (!ipc.empty()) std::memcpy(out.data() + kBatchHeaderBytes, ipc.data(), ipc.size());
  return out;
}

size_t BatchParts(std::span<const std::span<const uint8_t>> ipc, std::span<uint8_t> header,
                  std::vector<std::span<const uint8_t>>* parts) {
  parts->clear();
  parts->reserve(ipc.size() + 1);
  parts->push_back(header.first(kBatchHeaderBytes));
  size_t size = 0;
  for (const auto& part : ipc) {
    parts->push_back(part);
    size += part.size();
  }
  return size;
}

Result<BatchHeader> DecodeBatch(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  BatchHeader h;
  uint32_t reserved = 0;
  Status st = r.GetU32(&h.partition);
  if (st.ok()) st = r.GetU32(&h.epoch);
  if (st.ok()) st = r.GetU32(&h.attempt);
  if (st.ok()) st = r.GetU32(&reserved);
  const size_t rows_at = r.offset();
  if (st.ok()) st = r.GetI64(&h.rows);
  if (!st.ok()) return Malformed(st, "kBatch");
  EMBER_RETURN_NOT_OK(NonNegative(h.rows, "rows", rows_at, "kBatch"));
  if (h.rows > 0 && r.remaining() == 0) {
    return Status::Corruption("malformed kBatch message: " + std::to_string(h.rows) +
                              " rows but no Arrow IPC stream after the header at offset " +
                              std::to_string(kBatchHeaderBytes));
  }
  return h;
}

std::vector<uint8_t> EncodeEndPartition(const EndPartitionMsg& m) {
  codec::Writer w;
  w.PutU32(m.partition);
  w.PutU32(m.epoch);
  w.PutU32(static_cast<uint32_t>(m.node_rows.size()));
  for (int64_t rows : m.node_rows) w.PutI64(rows);
  return ToBytes(w.data());
}

Result<EndPartitionMsg> DecodeEndPartition(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  EndPartitionMsg m;
  uint32_t n = 0;
  Status st = r.GetU32(&m.partition);
  if (st.ok()) st = r.GetU32(&m.epoch);
  const size_t n_at = r.offset();
  if (st.ok()) st = r.GetU32(&n);
  if (!st.ok()) return Malformed(st, "kEndPartition");
  if (n == 0 || r.remaining() != uint64_t{n} * 8) {  // checked before allocating
    return Status::Corruption("malformed kEndPartition message: node count " + std::to_string(n) +
                              " at offset " + std::to_string(n_at) + " does not match the " +
                              std::to_string(r.remaining()) + " bytes of row counts after it");
  }
  m.node_rows.resize(n);
  for (uint32_t k = 0; k < n; ++k) {
    const size_t at = r.offset();
    Status st2 = r.GetI64(&m.node_rows[k]);  // cannot run short: the size was checked
    if (!st2.ok()) return Malformed(st2, "kEndPartition");
    EMBER_RETURN_NOT_OK(NonNegative(m.node_rows[k], "row count", at, "kEndPartition"));
  }
  return m;
}

std::vector<uint8_t> EncodeEndEpoch(const EndEpochMsg& m) {
  codec::Writer w;
  w.PutU32(m.epoch);
  w.PutU32(m.partitions);
  return ToBytes(w.data());
}

Result<EndEpochMsg> DecodeEndEpoch(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  EndEpochMsg m;
  Status st = r.GetU32(&m.epoch);
  if (st.ok()) st = r.GetU32(&m.partitions);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return Malformed(st, "kEndEpoch");
  return m;
}

Status DecodeEndFeed(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  Status st = r.ExpectEnd();
  return st.ok() ? st : Malformed(st, "kEndFeed");
}

std::vector<uint8_t> EncodeAwaitEpoch(const AwaitEpochMsg& m) {
  codec::Writer w;
  w.PutU32(m.epoch);
  return ToBytes(w.data());
}

Result<AwaitEpochMsg> DecodeAwaitEpoch(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  AwaitEpochMsg m;
  Status st = r.GetU32(&m.epoch);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return Malformed(st, "kAwaitEpoch");
  return m;
}

std::vector<uint8_t> EncodeEpochState(const EpochStateMsg& m) {
  codec::Writer w;
  w.PutU8(m.begun ? 1 : 0);
  w.PutI64(static_cast<int64_t>(m.read_bytes));
  return ToBytes(w.data());
}

Result<EpochStateMsg> DecodeEpochState(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  uint8_t begun = 0;
  int64_t read = 0;
  Status st = r.GetU8(&begun);
  if (st.ok()) st = r.GetI64(&read);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return Malformed(st, "kEpochState");
  if (begun > 1) return Status::Corruption("malformed kEpochState message: begun at offset 0 is " + std::to_string(begun));
  EpochStateMsg m;
  m.begun = begun == 1;
  m.read_bytes = static_cast<uint64_t>(read);
  return m;
}

std::vector<uint8_t> EncodeBeginPartition(const BeginPartition& m) {
  codec::Writer w;
  w.PutU32(m.partition);
  w.PutU32(m.epoch);
  w.PutU32(m.flags);
  w.PutString(m.result_ring);
  return ToBytes(w.data());
}

Result<BeginPartition> DecodeBeginPartition(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  BeginPartition m;
  Status st = r.GetU32(&m.partition);
  if (st.ok()) st = r.GetU32(&m.epoch);
  if (st.ok()) st = r.GetU32(&m.flags);
  if (st.ok()) st = r.GetString(&m.result_ring);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return Malformed(st, "kBeginPartition");
  return m;
}

std::vector<uint8_t> EncodeResults(int64_t rows, std::span<const uint8_t> ipc) {
  std::vector<uint8_t> out(kResultsHeaderBytes + ipc.size());
  StoreLE(out.data(), static_cast<uint64_t>(rows), 8);
  if (!ipc.empty()) std::memcpy(out.data() + kResultsHeaderBytes, ipc.data(), ipc.size());
  return out;
}

Result<int64_t> DecodeResults(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  int64_t rows = 0;
  Status st = r.GetI64(&rows);
  if (!st.ok()) return Malformed(st, "kResults");
  EMBER_RETURN_NOT_OK(NonNegative(rows, "rows", 0, "kResults"));
  if (rows > 0 && r.remaining() == 0) {
    return Status::Corruption("malformed kResults message: " + std::to_string(rows) +
                              " rows but no Arrow IPC stream after the header at offset 8");
  }
  return rows;
}

std::vector<uint8_t> EncodeEndResults(int64_t rows) {
  codec::Writer w;
  w.PutI64(rows);
  return ToBytes(w.data());
}

Result<int64_t> DecodeEndResults(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  int64_t rows = 0;
  Status st = r.GetI64(&rows);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return Malformed(st, "kEndResults");
  EMBER_RETURN_NOT_OK(NonNegative(rows, "rows", 0, "kEndResults"));
  return rows;
}

std::vector<uint8_t> EncodeError(std::string_view text) { return {text.begin(), text.end()}; }

Result<std::string> DecodeError(std::span<const uint8_t> payload) { return std::string(AsChars(payload)); }

std::vector<uint8_t> EncodeHello(const Hello& m) {
  codec::Writer w;
  w.PutU32(kHelloVersion);
  w.PutI64(m.idle_timeout.count());
  return ToBytes(w.data());
}

Result<Hello> DecodeHello(std::span<const uint8_t> payload) {
  codec::Reader r(AsChars(payload));
  uint32_t version = 0;
  int64_t ms = 0;
  Status st = r.GetU32(&version);
  if (st.ok() && version != kHelloVersion) {
    return Status::Corruption("kHello of version " + std::to_string(version) + "; this build speaks version " +
                              std::to_string(kHelloVersion));
  }
  if (st.ok()) st = r.GetI64(&ms);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return Malformed(st, "kHello");
  if (ms <= 0) {
    return Status::Corruption("malformed kHello message: idle_timeout at offset 4 must be positive, got " +
                              std::to_string(ms) + " ms");
  }
  Hello h;
  h.idle_timeout = Duration(ms);
  return h;
}

Status ValidateMessage(uint32_t kind, std::span<const uint8_t> payload) {
  switch (static_cast<FeedKind>(kind)) {
    case FeedKind::kBatch: return DecodeBatch(payload).status();
    case FeedKind::kEndPartition: return DecodeEndPartition(payload).status();
    case FeedKind::kEndFeed: return DecodeEndFeed(payload);
    case FeedKind::kBeginPartition: return DecodeBeginPartition(payload).status();
    case FeedKind::kResults: return DecodeResults(payload).status();
    case FeedKind::kEndResults: return DecodeEndResults(payload).status();
    case FeedKind::kError: return DecodeError(payload).status();
    case FeedKind::kEndEpoch: return DecodeEndEpoch(payload).status();
    case FeedKind::kHello: return DecodeHello(payload).status();
    case FeedKind::kAwaitEpoch: return DecodeAwaitEpoch(payload).status();
    case FeedKind::kEpochState: return DecodeEpochState(payload).status();
    case FeedKind::kFlush:
    case FeedKind::kFlushed: {
      codec::Reader r(AsChars(payload));
      Status st = r.ExpectEnd();
      return st.ok() ? st : Malformed(st, KindName(kind));
    }
  }
  return Status::Corruption("unknown feed message kind " + std::to_string(kind));
}

// ---------------------------------------------------------------- endpoint
namespace {
constexpr uint8_t kEndpointVersion = 1;
}

std::string NodeEndpoint::Encode() const {
  codec::Writer w;
  w.PutU8(kEndpointVersion);
  w.PutI64(executor_id);
  w.PutString(name);
  w.PutString(ring);
  w.PutString(host);
  w.PutI32(port);
  w.PutI64(static_cast<int64_t>(ring_capacity));
  return w.Release();
}

Result<NodeEndpoint> NodeEndpoint::Decode(std::string_view bytes) {
  codec::Reader r(bytes);
  uint8_t version = 0;
  Status st = r.GetU8(&version);
  if (st.ok() && version != kEndpointVersion) {
    return Status::Corruption("feed endpoint of version " + std::to_string(version) + "; this build reads version " +
                              std::to_string(kEndpointVersion));
  }
  NodeEndpoint e;
  int32_t port = 0;
  int64_t capacity = 0;
  if (st.ok()) st = r.GetI64(&e.executor_id);
  if (st.ok()) st = r.GetString(&e.name);
  if (st.ok()) st = r.GetString(&e.ring);
  if (st.ok()) st = r.GetString(&e.host);
  if (st.ok()) st = r.GetI32(&port);
  if (st.ok()) st = r.GetI64(&capacity);
  if (st.ok()) st = r.ExpectEnd();
  if (!st.ok()) return st.WithContext("malformed feed endpoint");
  if (port < 0 || port > 65535 || capacity < 0) {
    return Status::Corruption("malformed feed endpoint of node " + e.name + ": port " + std::to_string(port) +
                              ", ring capacity " + std::to_string(capacity));
  }
  e.port = port;
  e.ring_capacity = static_cast<uint64_t>(capacity);
  return e;
}

std::string NodeEndpoint::Describe() const { return name + " (" + host + ")"; }

}  // namespace ember::feed
