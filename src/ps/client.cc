#include <algorithm>
#include <cstring>
#include <mutex>
#include <system_error>
#include <thread>
#include <unordered_map>

#include "common/fd.h"
#include "ember/ps.h"
#include "ps/codec.h"
#include "ps/frames.h"
#include "ps/hash.h"
#include "ps/shm_link.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"

namespace ember::ps {

std::vector<Slice> Place(const std::string& tensor, size_t count, int shards, size_t split_at) {
  if (shards <= 1 || count < split_at || count < static_cast<size_t>(shards)) {
    const int s = shards <= 1 ? 0 : static_cast<int>(SplitMix64(Fnv1a64(tensor)) % static_cast<uint64_t>(shards));
    return {Slice{s, 0, count}};
  }
  std::vector<Slice> out;
  for (int i = 0; i < shards; ++i) {
    out.push_back(Slice{i, count * static_cast<size_t>(i) / static_cast<size_t>(shards),
                        count * static_cast<size_t>(i + 1) / static_cast<size_t>(shards)});
  }
  return out;
}

int RowShard(int64_t id, int shards) {
  return shards <= 1 ? 0 : static_cast<int>(SplitMix64(static_cast<uint64_t>(id)) % static_cast<uint64_t>(shards));
}

namespace {

struct Conn {
  std::string address;  // "host:port"
  Fd fd;
  std::unique_ptr<ShmLink> link;  // requests and replies through shared memory (the shard is on this host)
  Status broken;        // sticky: the connection's state is unknown after a failed exchange
};

struct Call {
  int shard = 0;
  Request request;
  std::span<const float> values;  // sent after the request's head, from where they are (else request.values)
  std::vector<std::span<const float>> parts;  // kPushMany: the updates, each from where it is
};

// The replies of a round trip, decoded as views of their messages (kept here: frames, or leases
// of the reply ring).
struct Replies {
  std::vector<LinkMessage> messages;
  std::vector<Reply> replies;
  const Reply& operator[](size_t i) const { return replies[i]; }
  size_t size() const { return replies.size(); }
};

// `n` floats of a reply's trailing values into `out`.
void CopyFloats(const Reply& r, float* out) {
  if (!r.values_bytes.empty()) std::memcpy(out, r.values_bytes.data(), r.values_bytes.size());
}
size_t FloatCount(const Reply& r) { return r.values_bytes.size() / sizeof(float); }

}  // namespace

struct Client::Impl {
  ClientOptions options;
  std::vector<Conn> shards;
  std::mutex mu;  // one call at a time

  std::string Who(int s) const { return "ps:" + std::to_string(s) + " at " + shards[s].address; }

  // Sends every call's request, then reads each reply: one round trip over all the shards.
  // Each shard gets at most one request per round trip.
  Result<Replies> RoundTrip(const char* what, const std::string& name, std::vector<Call> calls) {
    const Deadline deadline = Deadline::After(options.timeout);
    auto where = [&](int s) { return std::string(what) + " of '" + name + "' on " + Who(s); };
    for (const Call& c : calls) {
      Conn& conn = shards[c.shard];
      if (!conn.broken.ok()) return conn.broken;
    }
    auto breaks = [&](int s, const Status& st) {
      shards[s].broken = Status(st.code(), "the connection to " + Who(s) + " broke in " + where(s) + ": " +
                                           st.message() + " (the shard died, restarted or stalled; this worker "
                                           "cannot use it again)");
      return shards[s].broken;
    };
    // Each shard's request and reply on a thread of its own (this one for the first), so the
    // shards' links carry their halves at once rather than in turn; every shard that got its
    // request has its reply read, whatever another shard did, so no connection is left holding
    // a reply nobody read.
    const size_t n = calls.size();
    Replies replies;
    replies.messages.resize(n);  // the replies' views point into these: never reallocated
    replies.replies.resize(n);
    std::vector<Status> broke(n);  // transport failures: that shard's connection is unusable
    auto exchange = [&](size_t i) {
      const Call& c = calls[i];
      std::vector<std::span<const float>> floats = c.parts;
      if (floats.empty()) floats.push_back(c.values.empty() ? std::span<const float>(c.request.values) : c.values);
      size_t count = 0;
      for (auto f : floats) count += f.size();
      const std::string head = EncodeRequestHead(c.request, count);
      std::vector<std::string_view> parts{head};
      for (auto f : floats) parts.emplace_back(reinterpret_cast<const char*>(f.data()), f.size() * sizeof(float));
      Conn& conn = shards[c.shard];
      LinkMessage& m = replies.messages[i];
      if (conn.link) {
        Status st = conn.link->Send(kRequestFrame, parts, deadline);
        if (!st.ok()) {
          broke[i] = st;
          return;
        }
        auto got = conn.link->Receive(kReplyFrame, options.max_message_bytes, deadline);
        if (!got.ok()) {
          broke[i] = got.status();
          return;
        }
        m = std::move(*got);
      } else {
        const int fd = conn.fd.get();
        Status st = tcp::WriteFrameParts(fd, kRequestFrame, parts, deadline, Who(c.shard));
        if (!st.ok()) {
          broke[i] = st;
          return;
        }
        auto frame = tcp::ReadFrame(fd, options.max_message_bytes, deadline, Who(c.shard));
        if (!frame.ok()) {
          broke[i] = frame.status();
          return;
        }
        if (frame->type != kReplyFrame) {
          broke[i] = Status::Corruption("frame type " + std::to_string(frame->type) + " is not a reply");
          return;
        }
        m.frame = std::move(frame->payload);
      }
      auto reply = DecodeReply(c.request.kind, m.payload(), /*copy_values=*/false);
      if (!reply.ok()) {
        broke[i] = reply.status();
        return;
      }
      replies.replies[i] = std::move(*reply);
    };
    std::vector<std::thread> threads;
    for (size_t i = 1; i < n; ++i) {
      try {
        threads.emplace_back(exchange, i);
      } catch (const std::system_error&) {
        exchange(i);  // no thread to be had: this one does it
      }
    }
    if (n > 0) exchange(0);
    for (auto& t : threads) t.join();
    Status first;
    for (size_t i = 0; i < n; ++i) {
      if (broke[i].ok()) continue;
      Status b = breaks(calls[i].shard, broke[i]);
      if (first.ok()) first = b;
    }
    if (!first.ok()) return first;
    for (size_t i = 0; i < n; ++i) {
      if (!replies.replies[i].status.ok()) return replies.replies[i].status.WithContext(where(calls[i].shard));
    }
    return replies;
  }
};

namespace {
// Offers the shard a reply ring (ps/shm_link.h): on the shard's host it answers with its request
// ring and `conn` gets a link; elsewhere it answers "" and `conn` stays on TCP.
Status OfferSharedMemory(Conn& conn, const ClientOptions& options, const std::string& who) {
  const Deadline deadline = Deadline::After(options.connect_timeout);
  auto in = ShmLink::CreateReplyRing(ShmLink::NewRingName(), options.shm_ring_bytes);
  if (!in.ok()) return Status::OK();  // no room in /dev/shm, say: TCP does the job
  const int fd = conn.fd.get();
  EMBER_RETURN_NOT_OK(tcp::WriteFrame(fd, kShmOfferFrame, EncodeShmOffer({(*in)->name(), options.shm_ring_bytes}),
                                      deadline, who));
  EMBER_ASSIGN_OR_RAISE(tcp::Frame f, tcp::ReadFrame(fd, 4096, deadline, who));
  if (f.type != kShmAnswerFrame) {
    return Status::Corruption("frame type " + std::to_string(f.type) + " where the shared-memory answer was due");
  }
  EMBER_ASSIGN_OR_RAISE(std::string ring, DecodeShmAnswer(f.payload));
  if (ring.empty()) return Status::OK();  // another host: TCP
  EMBER_ASSIGN_OR_RAISE(auto out, ShmLink::OpenPeerRing(ring, /*peer_is_shard=*/true));
  conn.link = std::make_unique<ShmLink>(in.MoveValueUnsafe(), std::move(out), fd, who);
  return Status::OK();
}
}  // namespace

bool Client::shared_memory(int shard) const {
  return shard >= 0 && shard < num_shards() && impl_->shards[static_cast<size_t>(shard)].link != nullptr;
}

Client::Client() : impl_(new Impl) {}
Client::~Client() = default;

Result<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  if (options.shards.empty()) return Status::InvalidArgument("ps client: no shard addresses");
  std::unique_ptr<Client> client(new Client());
  Impl& impl = *client->impl_;
  impl.options = options;
  for (size_t s = 0; s < options.shards.size(); ++s) {
    const std::string& address = options.shards[s];
    const size_t colon = address.rfind(':');
    int port = 0;
    try {
      port = colon == std::string::npos ? 0 : std::stoi(address.substr(colon + 1));
    } catch (...) {
      port = 0;
    }
    if (port <= 0 || port > 65535) {
      return Status::InvalidArgument("ps client: shard " + std::to_string(s) + "'s address '" + address +
                                     "' is not host:port");
    }
    Conn conn;
    conn.address = address;
    const std::string who = "parameter server ps:" + std::to_string(s) + " at " + address;
    auto fd = tcp::Dial(address.substr(0, colon), port, options.secret, Deadline::After(options.connect_timeout), who);
    if (!fd.ok()) {
      return fd.status().WithContext(options.name + " connecting to " + who +
                                     " (is its ps node running, and is the address reachable from here?)");
    }
    conn.fd = std::move(*fd);
    if (options.shm_ring_bytes > 0) {
      EMBER_RETURN_NOT_OK(OfferSharedMemory(conn, options, who).WithContext(options.name + " connecting to " + who));
    }
    impl.shards.push_back(std::move(conn));
  }
  return client;
}

int Client::num_shards() const { return static_cast<int>(impl_->shards.size()); }

Status Client::CreateDense(const std::string& tensor, std::span<const float> initial, const RuleOptions& rule) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<Call> calls;
  for (const Slice& s : Place(tensor, initial.size(), num_shards())) {
    Call c{s.shard, {}};
    c.request.kind = Kind::kCreateDense;
    c.request.name = tensor;
    c.request.rule = rule;
    c.values = initial.subspan(s.begin, s.end - s.begin);
    calls.push_back(std::move(c));
  }
  return impl_->RoundTrip("create", tensor, std::move(calls)).status();
}

Result<Versions> Client::PullDense(const std::string& tensor, std::span<float> out) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto slices = Place(tensor, out.size(), num_shards());
  std::vector<Call> calls;
  for (const Slice& s : slices) {
    Call c{s.shard, {}};
    c.request.kind = Kind::kPullDense;
    c.request.name = tensor;
    calls.push_back(std::move(c));
  }
  EMBER_ASSIGN_OR_RAISE(auto replies, impl_->RoundTrip("pull", tensor, std::move(calls)));
  Versions v;
  for (size_t i = 0; i < slices.size(); ++i) {
    const Slice& s = slices[i];
    if (FloatCount(replies[i]) != s.end - s.begin) {
      return Status::InvalidArgument("pull of '" + tensor + "' (" + std::to_string(out.size()) + " elements) from " +
                                     impl_->Who(s.shard) + ": the shard holds " + std::to_string(FloatCount(replies[i])) +
                                     " of its elements, expected " + std::to_string(s.end - s.begin) +
                                     " (the workers disagree on the tensor's size)");
    }
    CopyFloats(replies[i], out.data() + s.begin);
    v.per_slice.push_back(replies[i].pull.version);
  }
  return v;
}

Result<ClientPushResult> Client::PushDense(const std::string& tensor, std::span<const float> update,
                                           const Versions& base) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  const auto slices = Place(tensor, update.size(), num_shards());
  if (base.per_slice.size() != slices.size()) {
    return Status::InvalidArgument("push to '" + tensor + "': " + std::to_string(base.per_slice.size()) +
                                   " base versions for " + std::to_string(slices.size()) +
                                   " slices (pass the Versions its pull returned)");
  }
  std::vector<Call> calls;
  for (size_t i = 0; i < slices.size(); ++i) {
    Call c{slices[i].shard, {}};
    c.request.kind = Kind::kPushDense;
    c.request.name = tensor;
    c.request.base_version = base.per_slice[i];
    c.values = update.subspan(slices[i].begin, slices[i].end - slices[i].begin);
    calls.push_back(std::move(c));
  }
  EMBER_ASSIGN_OR_RAISE(auto replies, impl_->RoundTrip("push", tensor, std::move(calls)));
  ClientPushResult out;
  for (size_t i = 0; i < slices.size(); ++i) {
    const PushResult& p = replies[i].push;
    (p.applied ? out.applied : out.rejected) += 1;
    out.max_staleness = std::max(out.max_staleness, p.staleness);
    out.versions.per_slice.push_back(p.version);
    if (FloatCount(replies[i]) > 0) {
      if (out.reply.empty()) out.reply.assign(update.size(), 0.0f);
      if (FloatCount(replies[i]) != slices[i].end - slices[i].begin) {
        return Status::Internal("push to '" + tensor + "': " + impl_->Who(slices[i].shard) + " replied with " +
                                std::to_string(FloatCount(replies[i])) + " elements for a slice of " +
                                std::to_string(slices[i].end - slices[i].begin));
      }
      CopyFloats(replies[i], out.reply.data() + slices[i].begin);
    }
  }
  return out;
}

Status Client::CreateTable(const std::string& table, const TableOptions& options) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<Call> calls;
  for (int s = 0; s < num_shards(); ++s) {
    Call c{s, {}};
    c.request.kind = Kind::kCreateTable;
    c.request.name = table;
    c.request.table = options;
    calls.push_back(std::move(c));
  }
  return impl_->RoundTrip("create table", table, std::move(calls)).status();
}

namespace {
// ids grouped by their shard, with each id's position in the caller's order.
// A call's row ids by shard, each distinct id once (a skewed batch repeats its hot ids: at
// Zipf 1.2, 4096 ids hold about 1,360 distinct ones): a pull fetches each once and copies it to
// every position that asked; a push sends each once with the sum of its updates (the same
// result for the add and sgd rules, which apply a repeated id's updates in turn).
struct Grouped {
  std::vector<std::vector<int64_t>> ids;       // per shard: distinct ids, in first-seen order
  std::vector<std::pair<int, size_t>> slot;    // per caller position: (shard, index in ids[shard])
};
Grouped GroupRows(std::span<const int64_t> ids, int shards) {
  Grouped g;
  g.ids.resize(static_cast<size_t>(shards));
  g.slot.resize(ids.size());
  std::unordered_map<int64_t, std::pair<int, size_t>> seen;
  seen.reserve(ids.size());
  for (size_t k = 0; k < ids.size(); ++k) {
    auto [it, fresh] = seen.try_emplace(ids[k]);
    if (fresh) {
      const int s = RowShard(ids[k], shards);
      it->second = {s, g.ids[static_cast<size_t>(s)].size()};
      g.ids[static_cast<size_t>(s)].push_back(ids[k]);
    }
    g.slot[k] = it->second;
  }
  return g;
}
}  // namespace

Status Client::PullRows(const std::string& table, std::span<const int64_t> ids, int dim, std::span<float> out) {
  if (dim <= 0 || out.size() != ids.size() * static_cast<size_t>(dim)) {
    return Status::InvalidArgument("pull of " + std::to_string(ids.size()) + " rows of '" + table + "' (dim " +
                                   std::to_string(dim) + ") into " + std::to_string(out.size()) + " floats");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  Grouped g = GroupRows(ids, num_shards());
  std::vector<Call> calls;
  for (int s = 0; s < num_shards(); ++s) {
    if (g.ids[s].empty()) continue;
    Call c{s, {}};
    c.request.kind = Kind::kPullRows;
    c.request.name = table;
    c.request.ids = g.ids[s];
    calls.push_back(std::move(c));
  }
  std::vector<int> order;
  for (const Call& c : calls) order.push_back(c.shard);
  EMBER_ASSIGN_OR_RAISE(auto replies, impl_->RoundTrip("pull rows", table, std::move(calls)));
  const size_t d = static_cast<size_t>(dim);
  std::vector<const char*> rows(static_cast<size_t>(num_shards()), nullptr);
  for (size_t i = 0; i < order.size(); ++i) {
    const int s = order[i];
    const size_t got = FloatCount(replies[i]);
    if (got != g.ids[s].size() * d) {
      return Status::InvalidArgument("pull rows of '" + table + "' from " + impl_->Who(s) + ": the table's rows are " +
                                     std::to_string(g.ids[s].empty() ? 0 : got / g.ids[s].size()) +
                                     " floats, not dim " + std::to_string(dim));
    }
    rows[static_cast<size_t>(s)] = replies[i].values_bytes.data();
  }
  for (size_t k = 0; k < ids.size(); ++k) {
    const auto [s, j] = g.slot[k];
    std::memcpy(out.data() + k * d, rows[static_cast<size_t>(s)] + j * d * sizeof(float), d * sizeof(float));
  }
  return Status::OK();
}

Status Client::PushRows(const std::string& table, std::span<const int64_t> ids, int dim,
                        std::span<const float> update) {
  if (dim <= 0 || update.size() != ids.size() * static_cast<size_t>(dim)) {
    return Status::InvalidArgument("push of " + std::to_string(ids.size()) + " rows of '" + table + "' (dim " +
                                   std::to_string(dim) + ") from " + std::to_string(update.size()) + " floats");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  Grouped g = GroupRows(ids, num_shards());
  const size_t d = static_cast<size_t>(dim);
  std::vector<std::vector<float>> sums(static_cast<size_t>(num_shards()));
  for (int s = 0; s < num_shards(); ++s) sums[static_cast<size_t>(s)].assign(g.ids[s].size() * d, 0.0f);
  for (size_t k = 0; k < ids.size(); ++k) {
    const auto [s, j] = g.slot[k];
    float* to = sums[static_cast<size_t>(s)].data() + j * d;
    const float* from = update.data() + k * d;
    for (size_t i = 0; i < d; ++i) to[i] += from[i];
  }
  std::vector<Call> calls;
  for (int s = 0; s < num_shards(); ++s) {
    if (g.ids[s].empty()) continue;
    Call c{s, {}};
    c.request.kind = Kind::kPushRows;
    c.request.name = table;
    c.request.ids = std::move(g.ids[s]);
    c.request.values = std::move(sums[static_cast<size_t>(s)]);
    calls.push_back(std::move(c));
  }
  return impl_->RoundTrip("push rows", table, std::move(calls)).status();
}

Result<std::vector<ShardStats>> Client::Stats() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<Call> calls;
  for (int s = 0; s < num_shards(); ++s) {
    Call c{s, {}};
    c.request.kind = Kind::kStats;
    calls.push_back(std::move(c));
  }
  EMBER_ASSIGN_OR_RAISE(auto replies, impl_->RoundTrip("stats", "", std::move(calls)));
  std::vector<ShardStats> out;
  for (auto& r : replies.replies) out.push_back(std::move(r.stats));
  return out;
}

Result<ClockResult> Client::Clock(int64_t clock, int64_t staleness, int64_t warmup, int workers) {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Call c{0, {}};
  c.request.kind = Kind::kClock;
  c.request.name = impl_->options.name;
  c.request.clock = clock;
  c.request.bound = clock <= warmup ? 0 : staleness;
  c.request.workers = workers;
  // The shard answers (with the slowest worker's name) before this call's own deadline.
  const int64_t timeout = impl_->options.timeout.count();
  c.request.wait_ms = timeout > 4000 ? timeout - 2000 : timeout * 3 / 4;
  std::vector<Call> calls;
  calls.push_back(std::move(c));
  EMBER_ASSIGN_OR_RAISE(auto replies, impl_->RoundTrip("clock", impl_->options.name, std::move(calls)));
  return replies[0].clock;
}

Status Client::Leave() {
  std::lock_guard<std::mutex> lock(impl_->mu);
  Call c{0, {}};
  c.request.kind = Kind::kLeave;
  c.request.name = impl_->options.name;
  std::vector<Call> calls;
  calls.push_back(std::move(c));
  return impl_->RoundTrip("leave", impl_->options.name, std::move(calls)).status();
}

namespace {
// Where the slices of several tensors go: per shard, the (tensor, slice) pairs it holds, in order.
struct ManyPlan {
  std::vector<std::vector<Slice>> slices;                    // per tensor, Place's
  std::vector<std::vector<std::pair<size_t, size_t>>> at;    // per shard: (tensor, slice index)
};

ManyPlan PlanMany(const std::vector<std::string>& tensors, const std::vector<size_t>& counts, int shards) {
  ManyPlan plan;
  plan.at.resize(static_cast<size_t>(shards));
  for (size_t t = 0; t < tensors.size(); ++t) {
    plan.slices.push_back(Place(tensors[t], counts[t], shards));
    for (size_t i = 0; i < plan.slices[t].size(); ++i) {
      plan.at[static_cast<size_t>(plan.slices[t][i].shard)].emplace_back(t, i);
    }
  }
  return plan;
}

std::string ManyName(const std::vector<std::string>& tensors) {
  return tensors.size() == 1 ? tensors[0] : std::to_string(tensors.size()) + " tensors";
}
}  // namespace

Result<std::vector<Versions>> Client::PullDenseMany(const std::vector<std::string>& tensors,
                                                    const std::vector<std::span<float>>& outs) {
  if (tensors.size() != outs.size() || tensors.size() > kMaxManyTensors) {
    return Status::InvalidArgument("pull of " + std::to_string(tensors.size()) + " tensors into " +
                                   std::to_string(outs.size()) + " buffers (at most " +
                                   std::to_string(kMaxManyTensors) + " at once)");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<size_t> counts;
  for (const auto& o : outs) counts.push_back(o.size());
  const ManyPlan plan = PlanMany(tensors, counts, num_shards());
  std::vector<Call> calls;
  std::vector<int> shard_of_call;
  for (int s = 0; s < num_shards(); ++s) {
    if (plan.at[static_cast<size_t>(s)].empty()) continue;
    Call c{s, {}, {}};
    c.request.kind = Kind::kPullMany;
    for (auto [t, i] : plan.at[static_cast<size_t>(s)]) c.request.names.push_back(tensors[t]);
    calls.push_back(std::move(c));
    shard_of_call.push_back(s);
  }
  const std::string what = ManyName(tensors);
  EMBER_ASSIGN_OR_RAISE(auto replies, impl_->RoundTrip("pull", what, std::move(calls)));
  std::vector<Versions> versions(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) versions[t].per_slice.resize(plan.slices[t].size());
  for (size_t k = 0; k < shard_of_call.size(); ++k) {
    const int s = shard_of_call[k];
    const Reply& r = replies[k];
    const auto& entries = plan.at[static_cast<size_t>(s)];
    if (r.pulls.size() != entries.size()) {
      return Status::Internal("pull of " + what + " from " + impl_->Who(s) + ": " + std::to_string(r.pulls.size()) +
                              " replies for " + std::to_string(entries.size()) + " tensors");
    }
    size_t at = 0;
    for (size_t e = 0; e < entries.size(); ++e) {
      const auto [t, i] = entries[e];
      const Slice& slice = plan.slices[t][i];
      if (static_cast<size_t>(r.counts[e]) != slice.end - slice.begin) {
        return Status::InvalidArgument("pull of '" + tensors[t] + "' (" + std::to_string(counts[t]) +
                                       " elements) from " + impl_->Who(s) + ": the shard holds " +
                                       std::to_string(r.counts[e]) + " of its elements, expected " +
                                       std::to_string(slice.end - slice.begin) +
                                       " (the workers disagree on the tensor's size)");
      }
      std::memcpy(outs[t].data() + slice.begin, r.values_bytes.data() + at * sizeof(float),
                  (slice.end - slice.begin) * sizeof(float));
      at += slice.end - slice.begin;
      versions[t].per_slice[i] = r.pulls[e].version;
    }
  }
  return versions;
}

Result<std::vector<ClientPushResult>> Client::PushDenseMany(const std::vector<std::string>& tensors,
                                                            const std::vector<std::span<const float>>& updates,
                                                            const std::vector<Versions>& bases) {
  if (tensors.size() != updates.size() || tensors.size() != bases.size() || tensors.size() > kMaxManyTensors) {
    return Status::InvalidArgument("push of " + std::to_string(tensors.size()) + " tensors with " +
                                   std::to_string(updates.size()) + " updates and " + std::to_string(bases.size()) +
                                   " base versions (one each; at most " + std::to_string(kMaxManyTensors) + ")");
  }
  std::lock_guard<std::mutex> lock(impl_->mu);
  std::vector<size_t> counts;
  for (const auto& u : updates) counts.push_back(u.size());
  const ManyPlan plan = PlanMany(tensors, counts, num_shards());
  for (size_t t = 0; t < tensors.size(); ++t) {
    if (bases[t].per_slice.size() != plan.slices[t].size()) {
      return Status::InvalidArgument("push to '" + tensors[t] + "': " + std::to_string(bases[t].per_slice.size()) +
                                     " base versions for " + std::to_string(plan.slices[t].size()) +
                                     " slices (pass the Versions its pull returned)");
    }
  }
  std::vector<Call> calls;
  std::vector<int> shard_of_call;
  for (int s = 0; s < num_shards(); ++s) {
    if (plan.at[static_cast<size_t>(s)].empty()) continue;
    Call c{s, {}, {}};
    c.request.kind = Kind::kPushMany;
    for (auto [t, i] : plan.at[static_cast<size_t>(s)]) {
      const Slice& slice = plan.slices[t][i];
      c.request.names.push_back(tensors[t]);
      c.request.bases.push_back(bases[t].per_slice[i]);
      c.request.counts.push_back(static_cast<int64_t>(slice.end - slice.begin));
      c.parts.push_back(updates[t].subspan(slice.begin, slice.end - slice.begin));
    }
    calls.push_back(std::move(c));
    shard_of_call.push_back(s);
  }
  const std::string what = ManyName(tensors);
  EMBER_ASSIGN_OR_RAISE(auto replies, impl_->RoundTrip("push", what, std::move(calls)));
  std::vector<ClientPushResult> out(tensors.size());
  for (size_t t = 0; t < tensors.size(); ++t) out[t].versions.per_slice.resize(plan.slices[t].size());
  for (size_t k = 0; k < shard_of_call.size(); ++k) {
    const int s = shard_of_call[k];
    const Reply& r = replies[k];
    const auto& entries = plan.at[static_cast<size_t>(s)];
    if (r.pushes.size() != entries.size()) {
      return Status::Internal("push of " + what + " to " + impl_->Who(s) + ": " + std::to_string(r.pushes.size()) +
                              " replies for " + std::to_string(entries.size()) + " tensors");
    }
    size_t at = 0;
    for (size_t e = 0; e < entries.size(); ++e) {
      const auto [t, i] = entries[e];
      const Slice& slice = plan.slices[t][i];
      const PushResult& p = r.pushes[e];
      ClientPushResult& o = out[t];
      (p.applied ? o.applied : o.rejected) += 1;
      o.max_staleness = std::max(o.max_staleness, p.staleness);
      o.versions.per_slice[i] = p.version;
      const size_t n = static_cast<size_t>(r.counts[e]);
      if (n > 0) {
        if (n != slice.end - slice.begin) {
          return Status::Internal("push to '" + tensors[t] + "': " + impl_->Who(s) + " replied with " +
                                  std::to_string(n) + " elements for a slice of " +
                                  std::to_string(slice.end - slice.begin));
        }
        if (o.reply.empty()) o.reply.assign(counts[t], 0.0f);
        std::memcpy(o.reply.data() + slice.begin, r.values_bytes.data() + at * sizeof(float), n * sizeof(float));
      }
      at += n;
    }
  }
  return out;
}

}  // namespace ember::ps
