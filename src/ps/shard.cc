#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <shared_mutex>

#include <cstring>

#include "common/codec.h"
#include "ember/ps.h"
#include "ps/codec.h"
#include "ps/hash.h"

namespace ember::ps {
namespace {

constexpr size_t kHistogramBuckets = 17;  // staleness 0..15, and 16 or more
constexpr int kMaxDim = 1 << 20;                 // floats per row (4 MiB)
constexpr size_t kMaxPullFloats = size_t{1} << 28;  // one pull's rows (1 GiB)

bool Finite(float v) { return std::isfinite(v); }

std::string Describe(const RuleOptions& o) {
  std::string s = RuleName(o.rule);
  if (o.hogwild) s += " (hogwild)";
  return s;
}

struct Dense {
  RuleOptions options;
  std::mutex mu;                       // not taken with options.hogwild
  std::vector<float> w;
  std::vector<float> m, v;             // kAdam moments
  int64_t step = 0;                    // kAdam
  std::atomic<int64_t> version{0};
};

// A sparse table: its rows in one block (`dim` floats each, in creation order) and an
// open-addressing index from id to row (power-of-two slots, linear probing, at most half full):
// one cache miss per lookup, no per-row allocation.
struct Table {
  TableOptions options;
  std::mutex mu;
  std::vector<float> data;     // row r at data[r * dim]
  std::vector<int64_t> ids;    // row r's id
  std::vector<int64_t> slots;  // row + 1 per slot (0: empty)
  int shift = 64;              // slot of id = SplitMix64(id) >> shift (the high bits: the shard
                               // placement uses the low ones, RowShard)

  size_t size() const { return ids.size(); }
  size_t dim() const { return static_cast<size_t>(options.dim); }

  // The row of `id`, or -1.
  int64_t Find(int64_t id) const {
    if (slots.empty()) return -1;
    const size_t mask = slots.size() - 1;
    for (size_t s = static_cast<size_t>(SplitMix64(static_cast<uint64_t>(id)) >> shift);; s = (s + 1) & mask) {
      const int64_t r = slots[s];
      if (r == 0) return -1;
      if (ids[static_cast<size_t>(r - 1)] == id) return r - 1;
    }
  }

  void Index(int64_t row) {
    const size_t mask = slots.size() - 1;
    size_t s = static_cast<size_t>(SplitMix64(static_cast<uint64_t>(ids[static_cast<size_t>(row)])) >> shift);
    while (slots[s] != 0) s = (s + 1) & mask;
    slots[s] = row + 1;
  }

  // Appends a row for `id` (not present) with `values` (dim floats), or its initial values.
  int64_t Add(int64_t id, const void* values) {
    if (2 * (size() + 1) > slots.size()) {  // grow: double the slots, re-index every row
      const size_t n = std::max<size_t>(64, 2 * slots.size());
      slots.assign(n, 0);
      shift = 64 - std::countr_zero(n);
      for (size_t r = 0; r < size(); ++r) Index(static_cast<int64_t>(r));
    }
    const int64_t row = static_cast<int64_t>(size());
    ids.push_back(id);
    data.resize(data.size() + dim());
    float* out = data.data() + static_cast<size_t>(row) * dim();
    if (values != nullptr) {
      std::memcpy(out, values, dim() * sizeof(float));
    } else {
      for (int j = 0; j < options.dim; ++j) out[j] = InitialRowValue(options.seed, id, j, options.init_scale);
    }
    Index(row);
    return row;
  }
};

}  // namespace

const char* RuleName(Rule rule) {
  switch (rule) {
    case Rule::kAssign: return "assign";
    case Rule::kAdd: return "add";
    case Rule::kSgd: return "sgd";
    case Rule::kAdam: return "adam";
    case Rule::kElastic: return "elastic";
  }
  return "unknown";
}

float InitialRowValue(uint64_t seed, int64_t id, int j, float scale) {
  const uint64_t h = SplitMix64(SplitMix64(seed ^ SplitMix64(static_cast<uint64_t>(id))) + static_cast<uint64_t>(j));
  const double unit = static_cast<double>(h >> 11) * (1.0 / 9007199254740992.0);  // [0, 1), 53 bits
  return static_cast<float>((2.0 * unit - 1.0) * scale);
}

struct Shard::Impl {
  std::string name;
  mutable std::shared_mutex mu;  // the maps; each entry has its own lock
  std::map<std::string, std::unique_ptr<Dense>> dense;
  std::map<std::string, std::unique_ptr<Table>> tables;
  std::vector<std::unique_ptr<Dense>> retired_dense;   // replaced by Restore
  std::vector<std::unique_ptr<Table>> retired_tables;
  std::atomic<int64_t> applied{0}, rejected{0}, rows{0};
  std::array<std::atomic<int64_t>, kHistogramBuckets> histogram{};

  // SSP/BSP clocks (Shard::Clock).
  mutable std::mutex clock_mu;
  std::condition_variable clock_cv;
  std::map<std::string, int64_t> live;        // worker -> clock
  std::map<std::string, uint64_t> owners;     // worker -> who ticked it last
  std::map<std::string, std::string> departed;  // worker -> why it left
  std::set<std::string> seen;                 // every worker that ever ticked
  bool stopping = false;

  // The slowest live worker (clock_mu held); live must not be empty.
  std::pair<std::string, int64_t> Slowest() const {
    auto it = std::min_element(live.begin(), live.end(), [](const auto& a, const auto& b) { return a.second < b.second; });
    return *it;
  }

  Dense* FindDense(const std::string& tensor) const {
    std::shared_lock lock(mu);
    auto it = dense.find(tensor);
    return it == dense.end() ? nullptr : it->second.get();
  }
  Table* FindTable(const std::string& table) const {
    std::shared_lock lock(mu);
    auto it = tables.find(table);
    return it == tables.end() ? nullptr : it->second.get();
  }
  Status NoTensor(const std::string& what, const std::string& tensor) const {
    return Status::NotFound(name + " holds no " + what + " '" + tensor + "' (create it first)");
  }
};

Shard::Shard(std::string name) : impl_(new Impl) { impl_->name = std::move(name); }
Shard::~Shard() = default;

const std::string& Shard::name() const { return impl_->name; }

Status Shard::CreateDense(const std::string& tensor, std::span<const float> initial, const RuleOptions& options) {
  if (initial.empty()) return Status::InvalidArgument(impl_->name + ": tensor '" + tensor + "' has no elements");
  if (options.hogwild && options.rule != Rule::kAdd && options.rule != Rule::kSgd) {
    return Status::InvalidArgument(impl_->name + ": tensor '" + tensor + "': hogwild (no lock) is for the add and "
                                   "sgd rules only, not " + RuleName(options.rule));
  }
  if (!Finite(options.lr) || !Finite(options.alpha) || !Finite(options.beta1) || !Finite(options.beta2) ||
      !Finite(options.epsilon)) {
    return Status::InvalidArgument(impl_->name + ": tensor '" + tensor + "': a rule option is not finite");
  }
  if (RuleName(options.rule) == std::string("unknown")) {
    return Status::InvalidArgument(impl_->name + ": tensor '" + tensor + "': unknown rule " +
                                   std::to_string(static_cast<uint32_t>(options.rule)));
  }
  std::unique_lock lock(impl_->mu);
  auto it = impl_->dense.find(tensor);
  if (it != impl_->dense.end()) {
    const Dense& d = *it->second;
    if (d.w.size() == initial.size() && d.options.rule == options.rule && d.options.hogwild == options.hogwild) {
      return Status::OK();
    }
    return Status::AlreadyExists(impl_->name + ": tensor '" + tensor + "' exists with " + std::to_string(d.w.size()) +
                                 " elements and rule " + Describe(d.options) + "; asked for " +
                                 std::to_string(initial.size()) + " and " + Describe(options));
  }
  auto d = std::make_unique<Dense>();
  d->options = options;
  d->w.assign(initial.begin(), initial.end());
  if (options.rule == Rule::kAdam) {
    d->m.assign(initial.size(), 0.0f);
    d->v.assign(initial.size(), 0.0f);
  }
  impl_->dense.emplace(tensor, std::move(d));
  return Status::OK();
}

Result<size_t> Shard::DenseCount(const std::string& tensor) const {
  Dense* d = impl_->FindDense(tensor);
  if (d == nullptr) return impl_->NoTensor("tensor", tensor);
  return d->w.size();  // fixed at creation
}

Result<PullResult> Shard::PullDense(const std::string& tensor) const {
  PullResult out;
  const std::string names[1] = {tensor};
  EMBER_RETURN_NOT_OK(ReadDense(names, [&](std::span<const std::span<const float>> values,
                                           std::span<const int64_t> versions) {
    out.values.assign(values[0].begin(), values[0].end());
    out.version = versions[0];
    return Status::OK();
  }));
  return out;
}

Status Shard::ReadDense(std::span<const std::string> tensors, const DenseReader& read) const {
  std::vector<Dense*> dense(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    dense[i] = impl_->FindDense(tensors[i]);
    if (dense[i] == nullptr) return impl_->NoTensor("tensor", tensors[i]);
  }
  // Each distinct locked tensor once, in address order: two readers of the same tensors cannot
  // deadlock, and pushes take one lock at a time.
  std::vector<Dense*> order;
  for (Dense* d : dense) {
    if (!d->options.hogwild) order.push_back(d);  // Hogwild: racy by design, no lock
  }
  std::sort(order.begin(), order.end());
  order.erase(std::unique(order.begin(), order.end()), order.end());
  for (Dense* d : order) d->mu.lock();
  std::vector<std::span<const float>> values(dense.size());
  std::vector<int64_t> versions(dense.size());
  for (size_t i = 0; i < dense.size(); ++i) {
    values[i] = dense[i]->w;
    versions[i] = dense[i]->version.load();
  }
  Status s = read(values, versions);
  for (auto it = order.rbegin(); it != order.rend(); ++it) (*it)->mu.unlock();
  return s;
}

Result<PushResult> Shard::PushDense(const std::string& tensor, std::span<const float> update, int64_t base_version) {
  Dense* d = impl_->FindDense(tensor);
  if (d == nullptr) return impl_->NoTensor("tensor", tensor);
  if (update.size() != d->w.size()) {
    return Status::InvalidArgument(impl_->name + ": push to tensor '" + tensor + "' of " +
                                   std::to_string(update.size()) + " elements; it holds " +
                                   std::to_string(d->w.size()));
  }
  std::unique_lock<std::mutex> lock(d->mu, std::defer_lock);
  if (!d->options.hogwild) lock.lock();
  const int64_t version = d->version.load();
  if (base_version < 0 || base_version > version) {
    return Status::InvalidArgument(impl_->name + ": push to tensor '" + tensor + "' based on version " +
                                   std::to_string(base_version) + ", but the tensor is at version " +
                                   std::to_string(version) + " (pull first)");
  }
  PushResult out;
  out.staleness = version - base_version;
  const RuleOptions& o = d->options;
  if (o.staleness_bound >= 0 && out.staleness > o.staleness_bound) {
    impl_->rejected.fetch_add(1);
    out.version = version;
    return out;
  }
  float* w = d->w.data();
  const size_t n = d->w.size();
  switch (o.rule) {
    case Rule::kAssign:
      std::copy(update.begin(), update.end(), w);
      break;
    case Rule::kAdd:
      if (o.scale_by_staleness) {  // DynSGD on deltas (dist-keras)
        const float scale = 1.0f / static_cast<float>(out.staleness + 1);
        for (size_t i = 0; i < n; ++i) w[i] += scale * update[i];
      } else {
        for (size_t i = 0; i < n; ++i) w[i] += update[i];
      }
      break;
    case Rule::kSgd: {
      const float lr = o.scale_by_staleness ? o.lr / static_cast<float>(out.staleness + 1) : o.lr;
      for (size_t i = 0; i < n; ++i) w[i] -= lr * update[i];
      break;
    }
    case Rule::kAdam: {
      d->step += 1;
      const double t = static_cast<double>(d->step);
      const float lr_t = static_cast<float>(o.lr * std::sqrt(1.0 - std::pow(o.beta2, t)) / (1.0 - std::pow(o.beta1, t)));
      float* m = d->m.data();
      float* v = d->v.data();
      for (size_t i = 0; i < n; ++i) {
        const float g = update[i];
        m[i] = o.beta1 * m[i] + (1.0f - o.beta1) * g;
        v[i] = o.beta2 * v[i] + (1.0f - o.beta2) * g * g;
        w[i] -= lr_t * m[i] / (std::sqrt(v[i]) + o.epsilon);
      }
      break;
    }
    case Rule::kElastic:
      out.reply.resize(n);
      for (size_t i = 0; i < n; ++i) {
        const float e = o.alpha * (update[i] - w[i]);
        out.reply[i] = e;
        w[i] += e;
      }
      break;
  }
  out.applied = true;
  out.version = d->version.fetch_add(1) + 1;
  impl_->applied.fetch_add(1);
  impl_->histogram[std::min<size_t>(static_cast<size_t>(out.staleness), kHistogramBuckets - 1)].fetch_add(1);
  return out;
}

Status Shard::CreateTable(const std::string& table, const TableOptions& options) {
  if (options.dim <= 0 || options.dim > kMaxDim) {
    return Status::InvalidArgument(impl_->name + ": table '" + table + "' needs 0 < dim <= " +
                                   std::to_string(kMaxDim) + ", got " + std::to_string(options.dim));
  }
  if (options.rule != Rule::kSgd && options.rule != Rule::kAdd) {
    return Status::InvalidArgument(impl_->name + ": table '" + table + "': rows take the sgd or add rule, not " +
                                   RuleName(options.rule));
  }
  if (!Finite(options.lr) || !Finite(options.init_scale)) {
    return Status::InvalidArgument(impl_->name + ": table '" + table + "': lr and init_scale must be finite");
  }
  std::unique_lock lock(impl_->mu);
  auto it = impl_->tables.find(table);
  if (it != impl_->tables.end()) {
    const TableOptions& t = it->second->options;
    if (t.dim == options.dim && t.seed == options.seed && t.init_scale == options.init_scale &&
        t.rule == options.rule && t.lr == options.lr) {
      return Status::OK();
    }
    return Status::AlreadyExists(impl_->name + ": table '" + table + "' exists with dim " + std::to_string(t.dim) +
                                 " and rule " + RuleName(t.rule) + "; asked for dim " + std::to_string(options.dim) +
                                 " and rule " + RuleName(options.rule) + " (or another seed, scale or lr)");
  }
  auto t = std::make_unique<Table>();
  t->options = options;
  impl_->tables.emplace(table, std::move(t));
  return Status::OK();
}

namespace {
// Row `id` of `t` (t.mu held), created from the initializer on first touch.  Valid until the
// next row is created.
float* Row(Table& t, int64_t id, std::atomic<int64_t>& created) {
  int64_t r = t.Find(id);
  if (r < 0) {
    r = t.Add(id, nullptr);
    created.fetch_add(1);
  }
  return t.data.data() + static_cast<size_t>(r) * t.dim();
}
}  // namespace

Result<std::vector<float>> Shard::PullRows(const std::string& table, std::span<const int64_t> ids) {
  Table* t = impl_->FindTable(table);
  if (t == nullptr) return impl_->NoTensor("table", table);
  const size_t dim = static_cast<size_t>(t->options.dim);
  if (ids.size() > kMaxPullFloats / dim) {
    return Status::InvalidArgument(impl_->name + ": a pull of " + std::to_string(ids.size()) + " rows of table '" +
                                   table + "' (dim " + std::to_string(dim) + ") is over " +
                                   std::to_string(kMaxPullFloats) + " floats; pull fewer rows at a time");
  }
  std::vector<float> out(ids.size() * dim);
  std::lock_guard<std::mutex> lock(t->mu);
  for (size_t k = 0; k < ids.size(); ++k) {
    std::memcpy(out.data() + k * dim, Row(*t, ids[k], impl_->rows), dim * sizeof(float));
  }
  return out;
}

Status Shard::PushRows(const std::string& table, std::span<const int64_t> ids, std::span<const float> update) {
  Table* t = impl_->FindTable(table);
  if (t == nullptr) return impl_->NoTensor("table", table);
  const size_t dim = static_cast<size_t>(t->options.dim);
  if (update.size() != ids.size() * dim) {
    return Status::InvalidArgument(impl_->name + ": push to table '" + table + "' of " + std::to_string(ids.size()) +
                                   " ids needs " + std::to_string(ids.size() * dim) + " floats (dim " +
                                   std::to_string(dim) + "), got " + std::to_string(update.size()));
  }
  const float scale = t->options.rule == Rule::kSgd ? -t->options.lr : 1.0f;
  std::lock_guard<std::mutex> lock(t->mu);
  for (size_t k = 0; k < ids.size(); ++k) {
    float* row = Row(*t, ids[k], impl_->rows);
    const float* u = update.data() + k * dim;
    for (size_t j = 0; j < dim; ++j) row[j] += scale * u[j];
  }
  impl_->applied.fetch_add(1);
  return Status::OK();
}

namespace {

constexpr uint32_t kSnapshotFormat = 1;

Status GetFormat(codec::Reader& r) {
  uint32_t format = 0;
  EMBER_RETURN_NOT_OK(r.GetU32(&format));
  if (format != kSnapshotFormat) return Status::Corruption("snapshot format " + std::to_string(format));
  return Status::OK();
}

std::string EncodeDense(const Dense& d) {
  codec::Writer w;
  const RuleOptions& o = d.options;
  w.PutU32(kSnapshotFormat);
  w.PutU32(static_cast<uint32_t>(o.rule));
  for (float f : {o.lr, o.beta1, o.beta2, o.epsilon, o.alpha}) PutF32(w, f);
  w.PutU8((o.scale_by_staleness ? 1 : 0) | (o.hogwild ? 2 : 0));
  w.PutI64(o.staleness_bound);
  w.PutI64(d.version.load());
  w.PutI64(d.step);
  PutFloats(w, d.w);
  PutFloats(w, d.m);
  PutFloats(w, d.v);
  return w.Release();
}

Status DecodeDense(std::string_view bytes, Dense* d) {
  codec::Reader r(bytes);
  EMBER_RETURN_NOT_OK(GetFormat(r));
  RuleOptions& o = d->options;
  EMBER_RETURN_NOT_OK(GetRule(r, &o.rule));
  for (float* f : {&o.lr, &o.beta1, &o.beta2, &o.epsilon, &o.alpha}) EMBER_RETURN_NOT_OK(GetF32(r, f));
  uint8_t flags = 0;
  EMBER_RETURN_NOT_OK(r.GetU8(&flags));
  o.scale_by_staleness = (flags & 1) != 0;
  o.hogwild = (flags & 2) != 0;
  int64_t version = 0;
  EMBER_RETURN_NOT_OK(r.GetI64(&o.staleness_bound));
  EMBER_RETURN_NOT_OK(r.GetI64(&version));
  EMBER_RETURN_NOT_OK(r.GetI64(&d->step));
  if (version < 0) return Status::Corruption("negative version");
  d->version = version;
  std::string_view view;
  for (std::vector<float>* v : {&d->w, &d->m, &d->v}) {
    EMBER_RETURN_NOT_OK(GetFloats(r, "values", /*copy=*/true, v, &view));
  }
  if (d->w.empty() || (o.rule == Rule::kAdam && (d->m.size() != d->w.size() || d->v.size() != d->w.size()))) {
    return Status::Corruption("the values and moments do not match");
  }
  return r.ExpectEnd();
}

std::string EncodeTable(const Table& t) {
  codec::Writer w;
  const TableOptions& o = t.options;
  w.PutU32(kSnapshotFormat);
  w.PutI32(o.dim);
  w.PutI64(static_cast<int64_t>(o.seed));
  PutF32(w, o.init_scale);
  w.PutU32(static_cast<uint32_t>(o.rule));
  PutF32(w, o.lr);
  w.PutI64(static_cast<int64_t>(t.size()));
  for (size_t r = 0; r < t.size(); ++r) {
    w.PutI64(t.ids[r]);
    w.PutRaw(std::string_view(reinterpret_cast<const char*>(t.data.data() + r * t.dim()), t.dim() * sizeof(float)));
  }
  return w.Release();
}

Status DecodeTable(std::string_view bytes, Table* t) {
  codec::Reader r(bytes);
  EMBER_RETURN_NOT_OK(GetFormat(r));
  TableOptions& o = t->options;
  int64_t seed = 0;
  EMBER_RETURN_NOT_OK(r.GetI32(&o.dim));
  EMBER_RETURN_NOT_OK(r.GetI64(&seed));
  o.seed = static_cast<uint64_t>(seed);
  EMBER_RETURN_NOT_OK(GetF32(r, &o.init_scale));
  EMBER_RETURN_NOT_OK(GetRule(r, &o.rule));
  EMBER_RETURN_NOT_OK(GetF32(r, &o.lr));
  if (o.dim <= 0 || o.dim > kMaxDim) return Status::Corruption("dim " + std::to_string(o.dim));
  int64_t rows = 0;
  EMBER_RETURN_NOT_OK(r.GetI64(&rows));
  const size_t row_bytes = 8 + static_cast<size_t>(o.dim) * sizeof(float);
  if (rows < 0 || static_cast<uint64_t>(rows) > r.remaining() / row_bytes) {
    return Status::Corruption("row count " + std::to_string(rows) + " does not fit the bytes left");
  }
  t->data.reserve(static_cast<size_t>(rows) * t->dim());
  t->ids.reserve(static_cast<size_t>(rows));
  for (int64_t k = 0; k < rows; ++k) {
    int64_t id = 0;
    std::string_view row;
    EMBER_RETURN_NOT_OK(r.GetI64(&id));
    EMBER_RETURN_NOT_OK(r.GetBytes(static_cast<size_t>(o.dim) * sizeof(float), "row", &row));
    if (t->Find(id) >= 0) return Status::Corruption("row " + std::to_string(id) + " appears twice");
    t->Add(id, row.data());
  }
  return r.ExpectEnd();
}

}  // namespace

std::map<std::string, std::string> Shard::Snapshot() const {
  std::map<std::string, std::string> out;
  std::shared_lock lock(impl_->mu);
  for (const auto& [name, d] : impl_->dense) {
    std::unique_lock<std::mutex> l(d->mu, std::defer_lock);
    if (!d->options.hogwild) l.lock();
    out["dense/" + name] = EncodeDense(*d);
  }
  for (const auto& [name, t] : impl_->tables) {
    std::lock_guard<std::mutex> l(t->mu);
    out["table/" + name] = EncodeTable(*t);
  }
  return out;
}

Status Shard::Restore(const std::map<std::string, std::string>& blobs) {
  std::map<std::string, std::unique_ptr<Dense>> dense;
  std::map<std::string, std::unique_ptr<Table>> tables;
  int64_t rows = 0;
  for (const auto& [key, bytes] : blobs) {
    Status s;
    if (key.rfind("dense/", 0) == 0) {
      auto d = std::make_unique<Dense>();
      s = DecodeDense(bytes, d.get());
      if (s.ok()) dense.emplace(key.substr(6), std::move(d));
    } else if (key.rfind("table/", 0) == 0) {
      auto t = std::make_unique<Table>();
      s = DecodeTable(bytes, t.get());
      if (s.ok()) {
        rows += static_cast<int64_t>(t->size());
        tables.emplace(key.substr(6), std::move(t));
      }
    } else {
      s = Status::Corruption("not a tensor or table blob");
    }
    if (!s.ok()) {
      return Status::Corruption(impl_->name + ": restoring blob '" + key + "' (" + std::to_string(bytes.size()) +
                                " bytes): " + s.message() + "; the shard is unchanged");
    }
  }
  std::unique_lock lock(impl_->mu);
  // Calls in flight may hold the entries being replaced (looked up, then used without the map's
  // lock): they stay alive, retired, until the shard goes.
  for (auto& [name, d] : impl_->dense) impl_->retired_dense.push_back(std::move(d));
  for (auto& [name, t] : impl_->tables) impl_->retired_tables.push_back(std::move(t));
  impl_->dense = std::move(dense);
  impl_->tables = std::move(tables);
  impl_->rows = rows;
  return Status::OK();
}

Result<ClockResult> Shard::Clock(const std::string& worker, int64_t clock, int64_t bound, int workers,
                                 Deadline deadline, uint64_t owner) {
  const auto started = std::chrono::steady_clock::now();
  Impl& m = *impl_;
  std::unique_lock<std::mutex> lock(m.clock_mu);
  if (m.stopping) return Status::Unavailable(m.name + " is closing");
  if (clock < 0) return Status::InvalidArgument(m.name + ": " + worker + " ticked to clock " + std::to_string(clock));
  auto it = m.live.find(worker);
  int64_t mine = clock;
  if (it == m.live.end()) {  // joins (or comes back): never behind the slowest live worker
    if (!m.live.empty()) mine = std::max(mine, m.Slowest().second);
    m.departed.erase(worker);
    m.seen.insert(worker);
    m.live[worker] = mine;
  } else {
    if (clock < it->second) {
      return Status::InvalidArgument(m.name + ": " + worker + " ticked back from clock " + std::to_string(it->second) +
                                     " to " + std::to_string(clock));
    }
    it->second = clock;
  }
  m.owners[worker] = owner;
  m.clock_cv.notify_all();
  auto ready = [&] {
    if (m.stopping) return true;
    if (!m.live.count(worker)) return true;  // left meanwhile (another connection said so)
    return bound < 0 || (static_cast<int>(m.seen.size()) >= workers && m.Slowest().second >= mine - bound);
  };
  if (deadline.infinite()) {
    m.clock_cv.wait(lock, ready);
  } else if (!m.clock_cv.wait_for(lock, deadline.remaining(), ready)) {
    if (static_cast<int>(m.seen.size()) < workers) {
      std::string names;
      for (const auto& w : m.seen) names += (names.empty() ? "" : ", ") + w;
      return Status::DeadlineExceeded(m.name + ": " + worker + " at clock " + std::to_string(mine) +
                                      " waited for " + std::to_string(workers) + " workers to tick; only " +
                                      std::to_string(m.seen.size()) + " did (" + names +
                                      "): did every worker start, and does each tick the clock?");
    }
    const auto [slow, at] = m.Slowest();
    return Status::DeadlineExceeded(m.name + ": " + worker + " at clock " + std::to_string(mine) + " waited for " +
                                    slow + " at clock " + std::to_string(at) + " (staleness bound " +
                                    std::to_string(bound) + "): is " + slow +
                                    " alive? A worker that ends must leave() so the others stop waiting for it");
  }
  if (m.stopping) return Status::Unavailable(m.name + " is closing");
  ClockResult out;
  out.clock = mine;
  out.min_clock = m.live.empty() ? mine : m.Slowest().second;
  out.waited_us = std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::steady_clock::now() - started).count();
  return out;
}

bool Shard::Leave(const std::string& worker, const std::string& why, uint64_t owner) {
  std::lock_guard<std::mutex> lock(impl_->clock_mu);
  if (!impl_->live.count(worker) || (owner != 0 && impl_->owners[worker] != owner)) return false;
  impl_->live.erase(worker);
  impl_->owners.erase(worker);
  impl_->departed[worker] = why.empty() ? "left" : why;
  impl_->clock_cv.notify_all();
  return true;
}

std::map<std::string, int64_t> Shard::Clocks() const {
  std::lock_guard<std::mutex> lock(impl_->clock_mu);
  return impl_->live;
}

std::map<std::string, std::string> Shard::Departed() const {
  std::lock_guard<std::mutex> lock(impl_->clock_mu);
  return impl_->departed;
}

void Shard::StopWaits() {
  std::lock_guard<std::mutex> lock(impl_->clock_mu);
  impl_->stopping = true;
  impl_->clock_cv.notify_all();
}

ShardStats Shard::Stats() const {
  ShardStats s;
  s.pushes_applied = impl_->applied.load();
  s.pushes_rejected = impl_->rejected.load();
  s.rows = impl_->rows.load();
  for (const auto& h : impl_->histogram) s.staleness_histogram.push_back(h.load());
  return s;
}

}  // namespace ember::ps
