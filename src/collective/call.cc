#include "collective/call.h"

namespace ember::collective {

size_t SizeOf(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat64: return 8;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat16: return 2;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
  }
  return 0;
}

const char* DataTypeName(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat64: return "float64";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat16: return "float16";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
  }
  return "unknown dtype";
}

const char* ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAverage: return "average";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
  }
  return "unknown op";
}

const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kAllreduce: return "allreduce";
    case Kind::kBroadcast: return "broadcast";
    case Kind::kAllgather: return "allgather";
    case Kind::kReduceScatter: return "reduce-scatter";
    case Kind::kBarrier: return "barrier";
  }
  return "unknown call";
}

std::string CallDesc::ToString() const {
  std::string s = std::string(KindName(kind)) + " #" + std::to_string(seq);
  switch (kind) {
    case Kind::kBarrier: return s;
    case Kind::kAllreduce:
    case Kind::kReduceScatter:
      return s + " (" + DataTypeName(dtype) + " " + ReduceOpName(op) + ", " + std::to_string(count) + " elements)";
    case Kind::kBroadcast:
      return s + " (" + DataTypeName(dtype) + ", " + std::to_string(count) + " elements from rank " +
             std::to_string(root) + ")";
    case Kind::kAllgather:
      return s + " (" + DataTypeName(dtype) + ", " + std::to_string(count) + " elements in all)";
  }
  return s;
}

void EncodeCallDesc(const CallDesc& d, codec::Writer* w) {
  w->PutI64(static_cast<int64_t>(d.seq));
  w->PutU8(static_cast<uint8_t>(d.kind));
  w->PutU8(static_cast<uint8_t>(d.dtype));
  w->PutU8(static_cast<uint8_t>(d.op));
  w->PutU8(0);
  w->PutI32(d.root);
  w->PutI64(static_cast<int64_t>(d.count));
}

Status DecodeCallDesc(codec::Reader* r, CallDesc* d) {
  int64_t seq = 0, count = 0;
  uint8_t kind = 0, dtype = 0, op = 0, pad = 0;
  if (auto s = r->GetI64(&seq); !s.ok()) return s;
  if (auto s = r->GetU8(&kind); !s.ok()) return s;
  if (auto s = r->GetU8(&dtype); !s.ok()) return s;
  if (auto s = r->GetU8(&op); !s.ok()) return s;
  if (auto s = r->GetU8(&pad); !s.ok()) return s;
  if (auto s = r->GetI32(&d->root); !s.ok()) return s;
  if (auto s = r->GetI64(&count); !s.ok()) return s;
  if (kind < 1 || kind > 5) return Status::Corruption("collective call: unknown kind " + std::to_string(kind));
  if (dtype > 5) return Status::Corruption("collective call: unknown dtype " + std::to_string(dtype));
  if (op > 3) return Status::Corruption("collective call: unknown reduce op " + std::to_string(op));
  d->seq = static_cast<uint64_t>(seq);
  d->kind = static_cast<Kind>(kind);
  d->dtype = static_cast<DataType>(dtype);
  d->op = static_cast<ReduceOp>(op);
  d->count = static_cast<uint64_t>(count);
  return Status::OK();
}

Status CheckSameCall(const CallDesc& mine, const std::string& mine_name, const CallDesc& theirs,
                     const std::string& theirs_name) {
  if (mine == theirs) return Status::OK();
  return Status::InvalidArgument("mismatched collective calls: " + mine_name + " made " + mine.ToString() + ", " +
                                 theirs_name + " made " + theirs.ToString() +
                                 "; every rank must make the same calls in the same order with the same sizes, "
                                 "types and ops");
}

std::string EncodeHello(const Hello& h) {
  codec::Writer w;
  w.PutI32(h.size);
  w.PutI32(h.from);
  w.PutI32(h.to);
  w.PutString(h.ring_id);
  return w.Release();
}

Status DecodeHello(std::string_view bytes, Hello* h) {
  codec::Reader r(bytes);
  EMBER_RETURN_NOT_OK(r.GetI32(&h->size));
  EMBER_RETURN_NOT_OK(r.GetI32(&h->from));
  EMBER_RETURN_NOT_OK(r.GetI32(&h->to));
  EMBER_RETURN_NOT_OK(r.GetString(&h->ring_id));
  return r.ExpectEnd();
}

std::string EncodeAbort(const Status& status, int origin) {
  codec::Writer w;
  w.PutU8(static_cast<uint8_t>(status.code()));
  w.PutI32(origin);
  w.PutString(std::string_view(status.message()).substr(0, kMaxReasonBytes));
  return w.Release();
}

Status DecodeAbort(std::string_view bytes, int size, int* origin) {
  codec::Reader r(bytes);
  uint8_t code = 0;
  std::string message;
  EMBER_RETURN_NOT_OK(r.GetU8(&code));
  EMBER_RETURN_NOT_OK(r.GetI32(origin));
  EMBER_RETURN_NOT_OK(r.GetString(&message));
  EMBER_RETURN_NOT_OK(r.ExpectEnd());
  if (code == 0 || code > static_cast<uint8_t>(StatusCode::kInternal) || *origin < 0 || *origin >= size) {
    return Status::Corruption("abort frame with status code " + std::to_string(code) + " from rank " +
                              std::to_string(*origin));
  }
  return Status(static_cast<StatusCode>(code), message);
}

}  // namespace ember::collective
