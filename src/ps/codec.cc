#include "ps/codec.h"

#include <bit>
#include <cstring>

#include "common/codec.h"

namespace ember::ps {
namespace {

static_assert(std::endian::native == std::endian::little, "the PS wire is little-endian; so are Ember's hosts");

constexpr uint8_t kScaleByStaleness = 1, kHogwild = 2;
constexpr uint8_t kMaxStatusCode = static_cast<uint8_t>(StatusCode::kInternal);

template <typename T>
void PutArray(codec::Writer& w, const std::vector<T>& v) {
  w.PutI64(static_cast<int64_t>(v.size()));
  w.PutRaw(std::string_view(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T)));
}

std::string_view FloatBytes(std::span<const float> v) {
  return {reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)};
}

// n x T, n checked against the bytes left before anything is allocated.
template <typename T>
Status GetArray(codec::Reader& r, const char* what, std::vector<T>* out) {
  int64_t n = 0;
  EMBER_RETURN_NOT_OK(r.GetI64(&n));
  if (n < 0 || static_cast<uint64_t>(n) > r.remaining() / sizeof(T)) {
    return Status::Corruption(std::string("PS message: ") + what + " count " + std::to_string(n) + " at offset " +
                              std::to_string(r.offset() - 8) + " does not fit the " + std::to_string(r.remaining()) +
                              " bytes left");
  }
  std::string_view bytes;
  EMBER_RETURN_NOT_OK(r.GetBytes(static_cast<size_t>(n) * sizeof(T), what, &bytes));
  out->resize(static_cast<size_t>(n));
  if (n > 0) std::memcpy(out->data(), bytes.data(), bytes.size());
  return Status::OK();
}

}  // namespace

void PutF32(codec::Writer& w, float v) { w.PutU32(std::bit_cast<uint32_t>(v)); }

Status GetF32(codec::Reader& r, float* out) {
  uint32_t bits = 0;
  EMBER_RETURN_NOT_OK(r.GetU32(&bits));
  *out = std::bit_cast<float>(bits);
  return Status::OK();
}

// n x f32 as a view of the message (`view`), and copied into `out` when `copy`.
Status GetFloats(codec::Reader& r, const char* what, bool copy, std::vector<float>* out, std::string_view* view) {
  int64_t n = 0;
  EMBER_RETURN_NOT_OK(r.GetI64(&n));
  if (n < 0 || static_cast<uint64_t>(n) > r.remaining() / sizeof(float)) {
    return Status::Corruption(std::string("PS message: ") + what + " count " + std::to_string(n) + " at offset " +
                              std::to_string(r.offset() - 8) + " does not fit the " + std::to_string(r.remaining()) +
                              " bytes left");
  }
  EMBER_RETURN_NOT_OK(r.GetBytes(static_cast<size_t>(n) * sizeof(float), what, view));
  if (copy) {
    out->resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(out->data(), view->data(), view->size());
  }
  return Status::OK();
}

Status GetRule(codec::Reader& r, Rule* out) {
  uint32_t v = 0;
  EMBER_RETURN_NOT_OK(r.GetU32(&v));
  if (v > static_cast<uint32_t>(Rule::kElastic)) {
    return Status::Corruption("PS message: unknown rule " + std::to_string(v) + " at offset " +
                              std::to_string(r.offset() - 4));
  }
  *out = static_cast<Rule>(v);
  return Status::OK();
}

void PutFloats(codec::Writer& w, std::span<const float> v) {
  w.PutI64(static_cast<int64_t>(v.size()));
  w.PutRaw(FloatBytes(v));
}


const char* KindName(Kind kind) {
  switch (kind) {
    case Kind::kCreateDense: return "create_dense";
    case Kind::kPullDense: return "pull_dense";
    case Kind::kPushDense: return "push_dense";
    case Kind::kCreateTable: return "create_table";
    case Kind::kPullRows: return "pull_rows";
    case Kind::kPushRows: return "push_rows";
    case Kind::kStats: return "stats";
    case Kind::kClock: return "clock";
    case Kind::kLeave: return "leave";
    case Kind::kPullMany: return "pull_many";
    case Kind::kPushMany: return "push_many";
  }
  return "unknown";
}

std::string EncodeRequestHead(const Request& r, size_t values) {
  codec::Writer w;
  w.PutU8(static_cast<uint8_t>(r.kind));
  switch (r.kind) {
    case Kind::kCreateDense:
      w.PutString(r.name);
      w.PutU32(static_cast<uint32_t>(r.rule.rule));
      PutF32(w, r.rule.lr);
      PutF32(w, r.rule.beta1);
      PutF32(w, r.rule.beta2);
      PutF32(w, r.rule.epsilon);
      PutF32(w, r.rule.alpha);
      w.PutU8((r.rule.scale_by_staleness ? kScaleByStaleness : 0) | (r.rule.hogwild ? kHogwild : 0));
      w.PutI64(r.rule.staleness_bound);
      w.PutI64(static_cast<int64_t>(values));
      break;
    case Kind::kPullDense:
      w.PutString(r.name);
      break;
    case Kind::kPushDense:
      w.PutString(r.name);
      w.PutI64(r.base_version);
      w.PutI64(static_cast<int64_t>(values));
      break;
    case Kind::kCreateTable:
      w.PutString(r.name);
      w.PutI32(r.table.dim);
      w.PutI64(static_cast<int64_t>(r.table.seed));
      PutF32(w, r.table.init_scale);
      w.PutU32(static_cast<uint32_t>(r.table.rule));
      PutF32(w, r.table.lr);
      break;
    case Kind::kPullRows:
      w.PutString(r.name);
      PutArray(w, r.ids);
      break;
    case Kind::kPushRows:
      w.PutString(r.name);
      PutArray(w, r.ids);
      w.PutI64(static_cast<int64_t>(values));
      break;
    case Kind::kStats:
      break;
    case Kind::kClock:
      w.PutString(r.name);
      w.PutI64(r.clock);
      w.PutI64(r.bound);
      w.PutI32(r.workers);
      w.PutI64(r.wait_ms);
      break;
    case Kind::kLeave:
      w.PutString(r.name);
      break;
    case Kind::kPullMany:
      w.PutU32(static_cast<uint32_t>(r.names.size()));
      for (const auto& n : r.names) w.PutString(n);
      break;
    case Kind::kPushMany:
      w.PutU32(static_cast<uint32_t>(r.names.size()));
      for (size_t i = 0; i < r.names.size(); ++i) {
        w.PutString(r.names[i]);
        w.PutI64(r.bases[i]);
        w.PutI64(r.counts[i]);
      }
      w.PutI64(static_cast<int64_t>(values));
      break;
  }
  return w.Release();
}

namespace {
// A "many" message's u32 entry count, each entry at least `min_entry_bytes`.
Status GetManyCount(codec::Reader& r, size_t min_entry_bytes, uint32_t* n) {
  EMBER_RETURN_NOT_OK(r.GetU32(n));
  if (*n > kMaxManyTensors || *n > r.remaining() / min_entry_bytes) {
    return Status::Corruption("PS message: " + std::to_string(*n) + " tensors at offset " +
                              std::to_string(r.offset() - 4) + " (at most " + std::to_string(kMaxManyTensors) +
                              ", and they must fit the " + std::to_string(r.remaining()) + " bytes left)");
  }
  return Status::OK();
}

// The per-entry counts of a "many" message against its floats.
Status CheckCounts(const std::vector<int64_t>& counts, size_t floats) {
  uint64_t sum = 0;
  for (int64_t c : counts) {
    if (c < 0) return Status::Corruption("PS message: a negative count");
    sum += static_cast<uint64_t>(c);
    if (sum > floats) break;
  }
  if (sum != floats) {
    return Status::Corruption("PS message: the counts add up to " + std::to_string(sum) + " floats, not the " +
                              std::to_string(floats) + " sent");
  }
  return Status::OK();
}
}  // namespace

std::string EncodeRequest(const Request& r) {
  if (r.values.empty() && !r.values_bytes.empty()) {
    std::string out = EncodeRequestHead(r, r.values_bytes.size() / sizeof(float));
    out.append(r.values_bytes);
    return out;
  }
  std::string out = EncodeRequestHead(r, r.values.size());
  out.append(FloatBytes(r.values));
  return out;
}

std::span<const float> RequestFloats(const Request& q, std::vector<float>* scratch) {
  if (q.values_bytes.empty()) return q.values;
  const size_t n = q.values_bytes.size() / sizeof(float);
  if (reinterpret_cast<uintptr_t>(q.values_bytes.data()) % alignof(float) == 0) {
    return {reinterpret_cast<const float*>(q.values_bytes.data()), n};
  }
  if (scratch->size() < n) scratch->resize(n);
  std::memcpy(scratch->data(), q.values_bytes.data(), n * sizeof(float));
  return {scratch->data(), n};
}

Result<Request> DecodeRequest(std::string_view bytes, bool copy_values) {
  codec::Reader r(bytes);
  Request q;
  uint8_t kind = 0;
  EMBER_RETURN_NOT_OK(r.GetU8(&kind));
  if (kind < static_cast<uint8_t>(Kind::kCreateDense) || kind > static_cast<uint8_t>(Kind::kPushMany)) {
    return Status::Corruption("PS request: unknown kind " + std::to_string(kind) + " at offset 0");
  }
  q.kind = static_cast<Kind>(kind);
  if (q.kind != Kind::kStats && q.kind != Kind::kPullMany && q.kind != Kind::kPushMany) {
    EMBER_RETURN_NOT_OK(r.GetString(&q.name));
  }
  switch (q.kind) {
    case Kind::kCreateDense: {
      EMBER_RETURN_NOT_OK(GetRule(r, &q.rule.rule));
      EMBER_RETURN_NOT_OK(GetF32(r, &q.rule.lr));
      EMBER_RETURN_NOT_OK(GetF32(r, &q.rule.beta1));
      EMBER_RETURN_NOT_OK(GetF32(r, &q.rule.beta2));
      EMBER_RETURN_NOT_OK(GetF32(r, &q.rule.epsilon));
      EMBER_RETURN_NOT_OK(GetF32(r, &q.rule.alpha));
      uint8_t flags = 0;
      EMBER_RETURN_NOT_OK(r.GetU8(&flags));
      if ((flags & ~(kScaleByStaleness | kHogwild)) != 0) {
        return Status::Corruption("PS request: unknown flags " + std::to_string(flags) + " at offset " +
                                  std::to_string(r.offset() - 1));
      }
      q.rule.scale_by_staleness = (flags & kScaleByStaleness) != 0;
      q.rule.hogwild = (flags & kHogwild) != 0;
      EMBER_RETURN_NOT_OK(r.GetI64(&q.rule.staleness_bound));
      EMBER_RETURN_NOT_OK(GetArray(r, "initial values", &q.values));
      break;
    }
    case Kind::kPullDense:
      break;
    case Kind::kPushDense:
      EMBER_RETURN_NOT_OK(r.GetI64(&q.base_version));
      EMBER_RETURN_NOT_OK(GetFloats(r, "update", copy_values, &q.values, &q.values_bytes));
      break;
    case Kind::kCreateTable: {
      int64_t seed = 0;
      EMBER_RETURN_NOT_OK(r.GetI32(&q.table.dim));
      EMBER_RETURN_NOT_OK(r.GetI64(&seed));
      q.table.seed = static_cast<uint64_t>(seed);
      EMBER_RETURN_NOT_OK(GetF32(r, &q.table.init_scale));
      EMBER_RETURN_NOT_OK(GetRule(r, &q.table.rule));
      EMBER_RETURN_NOT_OK(GetF32(r, &q.table.lr));
      break;
    }
    case Kind::kPullRows:
      EMBER_RETURN_NOT_OK(GetArray(r, "ids", &q.ids));
      break;
    case Kind::kPushRows:
      EMBER_RETURN_NOT_OK(GetArray(r, "ids", &q.ids));
      EMBER_RETURN_NOT_OK(GetFloats(r, "rows", copy_values, &q.values, &q.values_bytes));
      break;
    case Kind::kStats:
    case Kind::kLeave:
      break;
    case Kind::kClock:
      EMBER_RETURN_NOT_OK(r.GetI64(&q.clock));
      EMBER_RETURN_NOT_OK(r.GetI64(&q.bound));
      EMBER_RETURN_NOT_OK(r.GetI32(&q.workers));
      EMBER_RETURN_NOT_OK(r.GetI64(&q.wait_ms));
      break;
    case Kind::kPullMany: {
      uint32_t n = 0;
      EMBER_RETURN_NOT_OK(GetManyCount(r, 4, &n));
      q.names.resize(n);
      for (auto& name : q.names) EMBER_RETURN_NOT_OK(r.GetString(&name));
      break;
    }
    case Kind::kPushMany: {
      uint32_t n = 0;
      EMBER_RETURN_NOT_OK(GetManyCount(r, 20, &n));
      q.names.resize(n);
      q.bases.resize(n);
      q.counts.resize(n);
      for (uint32_t i = 0; i < n; ++i) {
        EMBER_RETURN_NOT_OK(r.GetString(&q.names[i]));
        EMBER_RETURN_NOT_OK(r.GetI64(&q.bases[i]));
        EMBER_RETURN_NOT_OK(r.GetI64(&q.counts[i]));
      }
      EMBER_RETURN_NOT_OK(GetFloats(r, "updates", copy_values, &q.values, &q.values_bytes));
      EMBER_RETURN_NOT_OK(CheckCounts(q.counts, q.values_bytes.size() / sizeof(float)));
      break;
    }
  }
  EMBER_RETURN_NOT_OK(r.ExpectEnd());
  if (copy_values) q.values_bytes = {};  // the copy stands alone: no view of the caller's bytes
  return q;
}

std::string EncodeReplyHead(Kind kind, const Reply& p, size_t values, std::span<const size_t> counts) {
  codec::Writer w;
  w.PutU8(static_cast<uint8_t>(p.status.code()));
  w.PutString(p.status.ok() ? std::string_view() : std::string_view(p.status.message()));
  if (!p.status.ok()) return w.Release();
  switch (kind) {
    case Kind::kPullDense:
      w.PutI64(p.pull.version);
      w.PutI64(static_cast<int64_t>(values));
      break;
    case Kind::kPushDense:
      w.PutU8(p.push.applied ? 1 : 0);
      w.PutI64(p.push.version);
      w.PutI64(p.push.staleness);
      w.PutI64(static_cast<int64_t>(values));
      break;
    case Kind::kPullRows:
      w.PutI64(static_cast<int64_t>(values));
      break;
    case Kind::kStats:
      w.PutI64(p.stats.pushes_applied);
      w.PutI64(p.stats.pushes_rejected);
      w.PutI64(p.stats.rows);
      w.PutU32(static_cast<uint32_t>(p.stats.staleness_histogram.size()));
      for (int64_t h : p.stats.staleness_histogram) w.PutI64(h);
      break;
    case Kind::kClock:
      w.PutI64(p.clock.clock);
      w.PutI64(p.clock.min_clock);
      w.PutI64(p.clock.waited_us);
      break;
    case Kind::kPullMany:
      w.PutU32(static_cast<uint32_t>(p.pulls.size()));
      for (size_t i = 0; i < p.pulls.size(); ++i) {
        w.PutI64(p.pulls[i].version);
        w.PutI64(static_cast<int64_t>(counts.empty() ? p.pulls[i].values.size() : counts[i]));
      }
      w.PutI64(static_cast<int64_t>(values));
      break;
    case Kind::kPushMany:
      w.PutU32(static_cast<uint32_t>(p.pushes.size()));
      for (const auto& push : p.pushes) {
        w.PutU8(push.applied ? 1 : 0);
        w.PutI64(push.version);
        w.PutI64(push.staleness);
        w.PutI64(static_cast<int64_t>(push.reply.size()));
      }
      w.PutI64(static_cast<int64_t>(values));
      break;
    default:
      break;
  }
  return w.Release();
}

const std::vector<float>& ReplyValues(Kind kind, const Reply& p) {
  static const std::vector<float> kNone;
  if (!p.status.ok()) return kNone;
  switch (kind) {
    case Kind::kPullDense: return p.pull.values;
    case Kind::kPushDense: return p.push.reply;
    case Kind::kPullRows: return p.rows;
    default: return kNone;
  }
}

std::vector<std::string_view> ReplyParts(Kind kind, const Reply& p) {
  std::vector<std::string_view> parts;
  if (!p.status.ok()) return parts;
  if (kind == Kind::kPullMany) {
    for (const auto& pull : p.pulls) parts.push_back(FloatBytes(pull.values));
  } else if (kind == Kind::kPushMany) {
    for (const auto& push : p.pushes) parts.push_back(FloatBytes(push.reply));
  } else {
    parts.push_back(FloatBytes(ReplyValues(kind, p)));
  }
  return parts;
}

std::string EncodeReply(Kind kind, const Reply& p) {
  size_t bytes = 0;
  const auto parts = ReplyParts(kind, p);
  for (auto part : parts) bytes += part.size();
  std::string out = EncodeReplyHead(kind, p, bytes / sizeof(float));
  for (auto part : parts) out.append(part);
  return out;
}

Result<Reply> DecodeReply(Kind kind, std::string_view bytes, bool copy_values) {
  codec::Reader r(bytes);
  Reply p;
  uint8_t code = 0;
  std::string message;
  EMBER_RETURN_NOT_OK(r.GetU8(&code));
  if (code > kMaxStatusCode) {
    return Status::Corruption("PS reply: unknown status code " + std::to_string(code) + " at offset 0");
  }
  EMBER_RETURN_NOT_OK(r.GetString(&message));
  if (code != 0) {
    p.status = Status(static_cast<StatusCode>(code), std::move(message));
    EMBER_RETURN_NOT_OK(r.ExpectEnd());
    return p;
  }
  switch (kind) {
    case Kind::kPullDense:
      EMBER_RETURN_NOT_OK(r.GetI64(&p.pull.version));
      EMBER_RETURN_NOT_OK(GetFloats(r, "values", copy_values, &p.pull.values, &p.values_bytes));
      break;
    case Kind::kPushDense: {
      uint8_t applied = 0;
      EMBER_RETURN_NOT_OK(r.GetU8(&applied));
      p.push.applied = applied != 0;
      EMBER_RETURN_NOT_OK(r.GetI64(&p.push.version));
      EMBER_RETURN_NOT_OK(r.GetI64(&p.push.staleness));
      EMBER_RETURN_NOT_OK(GetFloats(r, "reply", copy_values, &p.push.reply, &p.values_bytes));
      break;
    }
    case Kind::kPullRows:
      EMBER_RETURN_NOT_OK(GetFloats(r, "rows", copy_values, &p.rows, &p.values_bytes));
      break;
    case Kind::kStats: {
      EMBER_RETURN_NOT_OK(r.GetI64(&p.stats.pushes_applied));
      EMBER_RETURN_NOT_OK(r.GetI64(&p.stats.pushes_rejected));
      EMBER_RETURN_NOT_OK(r.GetI64(&p.stats.rows));
      uint32_t k = 0;
      EMBER_RETURN_NOT_OK(r.GetU32(&k));
      if (k > r.remaining() / 8) {
        return Status::Corruption("PS reply: histogram of " + std::to_string(k) + " buckets does not fit the " +
                                  std::to_string(r.remaining()) + " bytes left");
      }
      p.stats.staleness_histogram.resize(k);
      for (auto& h : p.stats.staleness_histogram) EMBER_RETURN_NOT_OK(r.GetI64(&h));
      break;
    }
    case Kind::kClock:
      EMBER_RETURN_NOT_OK(r.GetI64(&p.clock.clock));
      EMBER_RETURN_NOT_OK(r.GetI64(&p.clock.min_clock));
      EMBER_RETURN_NOT_OK(r.GetI64(&p.clock.waited_us));
      break;
    case Kind::kPullMany:
    case Kind::kPushMany: {
      const bool pulls = kind == Kind::kPullMany;
      uint32_t n = 0;
      EMBER_RETURN_NOT_OK(GetManyCount(r, pulls ? 16 : 25, &n));
      p.counts.resize(n);
      if (pulls) p.pulls.resize(n); else p.pushes.resize(n);
      for (uint32_t i = 0; i < n; ++i) {
        if (pulls) {
          EMBER_RETURN_NOT_OK(r.GetI64(&p.pulls[i].version));
        } else {
          uint8_t applied = 0;
          EMBER_RETURN_NOT_OK(r.GetU8(&applied));
          p.pushes[i].applied = applied != 0;
          EMBER_RETURN_NOT_OK(r.GetI64(&p.pushes[i].version));
          EMBER_RETURN_NOT_OK(r.GetI64(&p.pushes[i].staleness));
        }
        EMBER_RETURN_NOT_OK(r.GetI64(&p.counts[i]));
      }
      std::vector<float> all;
      EMBER_RETURN_NOT_OK(GetFloats(r, "values", /*copy=*/false, &all, &p.values_bytes));
      EMBER_RETURN_NOT_OK(CheckCounts(p.counts, p.values_bytes.size() / sizeof(float)));
      if (copy_values) {
        size_t at = 0;
        for (uint32_t i = 0; i < n; ++i) {
          auto& out = pulls ? p.pulls[i].values : p.pushes[i].reply;
          out.resize(static_cast<size_t>(p.counts[i]));
          if (!out.empty()) std::memcpy(out.data(), p.values_bytes.data() + at * sizeof(float), out.size() * sizeof(float));
          at += out.size();
        }
      }
      break;
    }
    default:
      break;
  }
  EMBER_RETURN_NOT_OK(r.ExpectEnd());
  return p;
}

std::string Serve(Shard& shard, std::string_view request) {
  Reply p;
  const Kind kind = Serve(shard, request, &p);
  return EncodeReply(kind, p);
}

namespace {
// Serve's work on a request already decoded (without copy_values): DecodeRequest once per request.
Kind ServeRequest(Shard& shard, const Result<Request>& q, Reply* reply, uint64_t owner, std::string* worker) {
  thread_local std::vector<float> scratch;  // updates not aligned in the message are copied here
  Reply& p = *reply;
  if (!q.ok()) {
    p.status = q.status().WithContext(shard.name());
    return Kind::kStats;  // an error reply has the same shape for every kind
  }
  switch (q->kind) {
    case Kind::kCreateDense:
      p.status = shard.CreateDense(q->name, q->values, q->rule);
      break;
    case Kind::kPullDense: {
      auto got = shard.PullDense(q->name);
      if (got.ok()) p.pull = std::move(*got); else p.status = got.status();
      break;
    }
    case Kind::kPushDense: {
      auto got = shard.PushDense(q->name, RequestFloats(*q, &scratch), q->base_version);
      if (got.ok()) p.push = std::move(*got); else p.status = got.status();
      break;
    }
    case Kind::kCreateTable:
      p.status = shard.CreateTable(q->name, q->table);
      break;
    case Kind::kPullRows: {
      auto got = shard.PullRows(q->name, q->ids);
      if (got.ok()) p.rows = std::move(*got); else p.status = got.status();
      break;
    }
    case Kind::kPushRows:
      p.status = shard.PushRows(q->name, q->ids, RequestFloats(*q, &scratch));
      break;
    case Kind::kStats:
      p.stats = shard.Stats();
      break;
    case Kind::kClock: {
      const Deadline deadline = q->wait_ms < 0 ? Deadline::Infinite() : Deadline::After(Duration(q->wait_ms));
      auto got = shard.Clock(q->name, q->clock, q->bound, q->workers, deadline, owner);
      if (got.ok()) p.clock = *got; else p.status = got.status();
      break;
    }
    case Kind::kLeave:
      shard.Leave(q->name, "left", owner);
      break;
    case Kind::kPullMany:
      for (const auto& name : q->names) {
        auto got = shard.PullDense(name);
        if (!got.ok()) {
          p.status = got.status();
          p.pulls.clear();
          break;
        }
        p.pulls.push_back(std::move(*got));
      }
      break;
    case Kind::kPushMany: {
      // Every name and size is checked before anything is applied.
      for (size_t i = 0; i < q->names.size() && p.status.ok(); ++i) {
        auto count = shard.DenseCount(q->names[i]);
        if (!count.ok()) {
          p.status = count.status();
        } else if (static_cast<int64_t>(*count) != q->counts[i]) {
          p.status = Status::InvalidArgument(shard.name() + ": push to tensor '" + q->names[i] + "' of " +
                                             std::to_string(q->counts[i]) + " elements; it holds " +
                                             std::to_string(*count));
        }
      }
      size_t at = 0;
      const std::span<const float> updates = p.status.ok() ? RequestFloats(*q, &scratch) : std::span<const float>();
      for (size_t i = 0; i < q->names.size() && p.status.ok(); ++i) {
        const auto n = static_cast<size_t>(q->counts[i]);
        auto got = shard.PushDense(q->names[i], updates.subspan(at, n), q->bases[i]);
        at += n;
        if (got.ok()) p.pushes.push_back(std::move(*got)); else p.status = got.status();
      }
      if (!p.status.ok()) p.pushes.clear();
      break;
    }
  }
  if (worker != nullptr && (q->kind == Kind::kClock || q->kind == Kind::kLeave)) *worker = q->name;
  return q->kind;
}
}  // namespace

Kind Serve(Shard& shard, std::string_view request, Reply* reply, uint64_t owner, std::string* worker) {
  return ServeRequest(shard, DecodeRequest(request, /*copy_values=*/false), reply, owner, worker);  // updates in place
}

Served ServeTo(Shard& shard, std::string_view request, const ReplySender& send, bool pull_in_place, uint64_t owner,
              std::string* worker) {
  auto q = DecodeRequest(request, /*copy_values=*/false);
  Served out;
  if (pull_in_place && q.ok() && (q->kind == Kind::kPullDense || q->kind == Kind::kPullMany)) {
    out.kind = q->kind;
    const std::vector<std::string> one{q->name};
    const std::vector<std::string>& names = out.kind == Kind::kPullDense ? one : q->names;
    bool called = false;
    out.replied = shard.ReadDense(names, [&](std::span<const std::span<const float>> values,
                                             std::span<const int64_t> versions) {
      called = true;
      Reply r;
      std::vector<size_t> counts;
      std::vector<std::string_view> parts(1);
      size_t total = 0;
      for (size_t i = 0; i < values.size(); ++i) {
        if (out.kind == Kind::kPullMany) r.pulls.push_back(PullResult{{}, versions[i]});
        counts.push_back(values[i].size());
        total += values[i].size();
        parts.push_back(FloatBytes(values[i]));
      }
      if (out.kind == Kind::kPullDense) r.pull.version = versions[0];
      const std::string head = EncodeReplyHead(out.kind, r, total, counts);
      parts[0] = head;
      out.sent = send(parts);
      return Status::OK();
    });
    if (!called) {  // the shard refused (a missing tensor): its error, as Serve replies it
      Reply r;
      r.status = out.replied;
      const std::string head = EncodeReplyHead(out.kind, r, 0);
      const std::string_view parts[1] = {head};
      out.sent = send(parts);
    }
    return out;
  }
  Reply reply;
  out.kind = ServeRequest(shard, q, &reply, owner, worker);
  out.replied = reply.status;
  std::vector<std::string_view> parts = ReplyParts(out.kind, reply);
  size_t bytes = 0;
  for (auto part : parts) bytes += part.size();
  const std::string head = EncodeReplyHead(out.kind, reply, bytes / sizeof(float));
  parts.insert(parts.begin(), head);
  out.sent = send(parts);
  return out;
}

bool IsPsRingName(std::string_view name) {
  const std::string_view prefix(kPsRingPrefix);
  if (name.size() <= prefix.size() || name.size() > prefix.size() + 48 || name.substr(0, prefix.size()) != prefix) {
    return false;
  }
  for (char c : name.substr(prefix.size())) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || c == '-')) return false;
  }
  return true;
}

std::string EncodeShmOffer(const ShmOffer& offer) {
  codec::Writer w;
  w.PutString(offer.ring);
  w.PutI64(static_cast<int64_t>(offer.request_bytes));
  return w.Release();
}

Result<ShmOffer> DecodeShmOffer(std::string_view bytes) {
  codec::Reader r(bytes);
  ShmOffer offer;
  EMBER_RETURN_NOT_OK(r.GetString(&offer.ring));
  if (!IsPsRingName(offer.ring)) {
    return Status::Corruption("PS shared-memory offer: '" + offer.ring.substr(0, 64) + "' is not a PS ring's name");
  }
  int64_t request_bytes = 0;
  EMBER_RETURN_NOT_OK(r.GetI64(&request_bytes));
  if (request_bytes <= 0) {
    return Status::Corruption("PS shared-memory offer: request ring bytes " + std::to_string(request_bytes) +
                              " at offset " + std::to_string(r.offset() - 8));
  }
  offer.request_bytes = static_cast<uint64_t>(request_bytes);
  EMBER_RETURN_NOT_OK(r.ExpectEnd());
  return offer;
}

std::string EncodeShmAnswer(const std::string& ring) {
  codec::Writer w;
  w.PutString(ring);
  return w.Release();
}

Result<std::string> DecodeShmAnswer(std::string_view bytes) {
  codec::Reader r(bytes);
  std::string ring;
  EMBER_RETURN_NOT_OK(r.GetString(&ring));
  if (!ring.empty() && !IsPsRingName(ring)) {
    return Status::Corruption("PS shared-memory answer: '" + ring.substr(0, 64) + "' is not a PS ring's name");
  }
  EMBER_RETURN_NOT_OK(r.ExpectEnd());
  return ring;
}

}  // namespace ember::ps
