// The Communicator: meets the other ranks through the Store, groups them by
// host, and composes the backends:
//
//   one host, kAuto:  ShmGroup over every rank
//   kTcp:             TcpRing over every rank
//   several hosts:    ShmGroup per host (when it has more than one rank) and a
//                     TcpRing over one leader per host (its lowest rank);
//                     e.g. allreduce = local allreduce, leaders' ring
//                     allreduce, local broadcast from the leader
//
// Every call gets a sequence number (the same on every rank) and a
// descriptor the backends check against their peers'.  kAverage runs as a
// sum, divided once at the end on every rank, so results stay bitwise
// identical.  The first failure breaks the communicator: it is remembered,
// the other backends are aborted with it (so peers in other groups learn at
// once instead of at their deadline), and every later call returns it.
//
// Calls run in issue order: a blocking call runs on the caller's thread when
// nothing is queued, otherwise it queues behind the async calls and waits;
// the async calls run on one worker thread, started on first use.
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <thread>

#include "collective/backend.h"
#include "collective/call.h"
#include "collective/reduce.h"
#include "collective/shm_group.h"
#include "collective/device_calls.h"
#include "collective/tcp_ring.h"
#include "common/codec.h"
#include "ember/deadline.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "coordinator/kv_keys.h"
#include "ember/collective.h"

namespace ember::collective {
namespace {

constexpr size_t kFusionBytes = 64 << 20;  // AllreduceFused packs up to this much per round

struct RankInfo {
  std::string host;
  std::string name;
  int64_t pid = 0;
};

std::string EncodeRankInfo(const RankInfo& info) {
  codec::Writer w;
  w.PutString(info.host);
  w.PutString(info.name);
  w.PutI64(info.pid);
  return w.Release();
}

Status DecodeRankInfo(const std::string& bytes, RankInfo* info) {
  codec::Reader r(bytes);
  if (auto s = r.GetString(&info->host); !s.ok()) return s;
  if (auto s = r.GetString(&info->name); !s.ok()) return s;
  if (auto s = r.GetI64(&info->pid); !s.ok()) return s;
  return r.remaining() == 0 ? Status::OK() : Status::Corruption("trailing bytes");
}

// One queued call and its outcome (the *Async handles).
class Task : public Work {
 public:
  explicit Task(std::function<Status()> fn) : fn_(std::move(fn)) {}
  ~Task() override { (void)Wait(); }

  Status Wait() override {
    MutexLock lock(&mu_);
    while (!done_) cv_.Wait(&mu_);
    return status_;
  }
  bool Done() const override {
    MutexLock lock(&mu_);
    return done_;
  }
  // Runs the call; Finish() then publishes its status.  Two steps, so the
  // worker can mark itself idle before a waiter wakes (see WorkerLoop).
  Status Execute() { return fn_(); }
  // Publishes the outcome: of Execute(), or of a Task that never ran.
  void Finish(Status s) {
    MutexLock lock(&mu_);
    status_ = std::move(s);
    done_ = true;
    cv_.SignalAll();
  }

 private:
  std::function<Status()> fn_;
  mutable Mutex mu_;
  CondVar cv_;
  bool done_ GUARDED_BY(mu_) = false;
  Status status_ GUARDED_BY(mu_);
};

class CommunicatorImpl : public Communicator {
 public:
  CommunicatorImpl(const CommunicatorOptions& options, std::vector<RankInfo> ranks)
      : options_(options), ranks_(std::move(ranks)) {}
  ~CommunicatorImpl() override;

  Status Setup(std::shared_ptr<Store> store, Deadline deadline);

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  std::string Describe(int rank) const override;

  Status Allreduce(void* data, size_t count, DataType dtype, ReduceOp op, CallOptions options) override {
    return Run([=, this] { return DoAllreduce(data, count, dtype, op, options); });
  }
  Status AllreduceFused(std::span<const std::span<std::byte>> buffers, DataType dtype, ReduceOp op,
                        CallOptions options) override {
    return Run([=, this] { return DoAllreduceFused(buffers, dtype, op, options); });
  }
  Status Broadcast(void* data, size_t count, DataType dtype, int root, CallOptions options) override {
    return Run([=, this] { return DoBroadcast(data, count, dtype, root, options); });
  }
  Status Allgather(const void* in, size_t count, void* out, DataType dtype, CallOptions options) override {
    return Run([=, this] {
      std::vector<uint64_t> counts(size(), count);
      return DoAllgather(in, counts, out, dtype, options);
    });
  }
  Status AllgatherV(const void* in, size_t count, DataType dtype, std::vector<std::byte>* out,
                    std::vector<uint64_t>* counts, CallOptions options) override {
    return Run([=, this] { return DoAllgatherV(in, count, dtype, out, counts, options); });
  }
  Status ReduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                       CallOptions options) override {
    return Run([=, this] { return DoReduceScatter(in, out, count, dtype, op, options); });
  }
  Status Barrier(CallOptions options) override {
    return Run([=, this] { return DoBarrier(options); });
  }
  std::unique_ptr<Work> AllreduceAsync(void* data, size_t count, DataType dtype, ReduceOp op,
                                       CallOptions options) override {
    return Enqueue([=, this] { return DoAllreduce(data, count, dtype, op, options); });
  }
  std::unique_ptr<Work> BroadcastAsync(void* data, size_t count, DataType dtype, int root,
                                       CallOptions options) override {
    return Enqueue([=, this] { return DoBroadcast(data, count, dtype, root, options); });
  }
  Status AllreduceOn(device::Device d, void* data, size_t count, DataType dtype, ReduceOp op,
                     CallOptions options) override {
    if (d.kind == device::Kind::kHost) return Allreduce(data, count, dtype, op, options);
    return Run([=, this] { return DoAllreduceOn(d, data, count, dtype, op, options); });
  }
  Status BroadcastOn(device::Device d, void* data, size_t count, DataType dtype, int root,
                     CallOptions options) override {
    if (d.kind == device::Kind::kHost) return Broadcast(data, count, dtype, root, options);
    return Run([=, this] { return DoBroadcastOn(d, data, count, dtype, root, options); });
  }
  std::unique_ptr<Work> AllreduceOnAsync(device::Device d, void* data, size_t count, DataType dtype, ReduceOp op,
                                         CallOptions options) override {
    if (d.kind == device::Kind::kHost) return AllreduceAsync(data, count, dtype, op, options);
    return Enqueue([=, this] { return DoAllreduceOn(d, data, count, dtype, op, options); });
  }
  void Abort(const std::string& reason) override;

 private:
  // --- ordering of calls
  Status Run(std::function<Status()> fn);
  std::unique_ptr<Work> Enqueue(std::function<Status()> fn);
  void WorkerLoop();

  // --- the calls (one at a time, see Run)
  Status DoAllreduce(void* data, size_t count, DataType dtype, ReduceOp op, CallOptions options);
  Status DoAllreduceFused(std::span<const std::span<std::byte>> buffers, DataType dtype, ReduceOp op,
                          CallOptions options);
  Status DoBroadcast(void* data, size_t count, DataType dtype, int root, CallOptions options);
  Status DoAllgather(const void* in, const std::vector<uint64_t>& counts, void* out, DataType dtype,
                     CallOptions options);
  Status DoAllgatherV(const void* in, size_t count, DataType dtype, std::vector<std::byte>* out,
                      std::vector<uint64_t>* counts, CallOptions options);
  Status DoReduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                         CallOptions options);
  Status DoBarrier(CallOptions options);
  // Device memory (DeviceCalls: NCCL or staged).
  Status DoAllreduceOn(device::Device d, void* data, size_t count, DataType dtype, ReduceOp op,
                       CallOptions options);
  Status DoBroadcastOn(device::Device d, void* data, size_t count, DataType dtype, int root, CallOptions options);
  // Calls on accelerator memory (device_calls.h), made at the first one.
  DeviceCalls& Device();

  // Starts a call: the broken status if any, else a descriptor with the next seq.
  Status Begin(Kind kind, DataType dtype, ReduceOp op, uint64_t count, int root, CallDesc* desc);
  Deadline DeadlineFor(CallOptions options) const {
    return Deadline::After(options.timeout.count() > 0 ? options.timeout : options_.timeout);
  }
  // Remembers the first failure and aborts the backends with it.
  Status Fail(Status s);
  // Allreduce over the backends, in place, no division.
  Status ReduceAll(const CallDesc& desc, void* data, Deadline deadline);
  Status BroadcastAll(const CallDesc& desc, void* data, Deadline deadline);

  bool is_leader() const { return local_rank_ == 0; }

  const CommunicatorOptions options_;
  const std::vector<RankInfo> ranks_;

  // Topology, fixed by Setup().
  std::vector<std::vector<int>> hosts_;  // global ranks per host, hosts ordered by their lowest rank
  int host_ = 0;                         // this rank's index in hosts_
  int local_rank_ = 0;                   // index in hosts_[host_]
  std::unique_ptr<ShmGroup> local_;      // ranks of this host (kAuto, more than one rank here)
  std::unique_ptr<TcpRing> ring_;        // kTcp: every rank; kAuto: the hosts' leaders (this rank leads)
  bool ring_over_all_ = false;

  uint64_t seq_ = 0;  // only touched by the call that runs (Run/WorkerLoop serialize)
  // Calls on device memory; only touched by the call that runs.  Declared after the backends it
  // uses (destroyed before them).
  std::unique_ptr<DeviceCalls> device_;

  Mutex broken_mu_;
  Status broken_ GUARDED_BY(broken_mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::shared_ptr<Task>> queue_ GUARDED_BY(mu_);
  bool running_ GUARDED_BY(mu_) = false;  // a call is executing (inline or on the worker)
  bool stopping_ GUARDED_BY(mu_) = false;
  std::thread worker_;
};

// A Work that shares ownership of the Task with the queue.
class TaskHandle : public Work {
 public:
  explicit TaskHandle(std::shared_ptr<Task> task) : task_(std::move(task)) {}
  Status Wait() override { return task_->Wait(); }
  bool Done() const override { return task_->Done(); }

 private:
  std::shared_ptr<Task> task_;
};

CommunicatorImpl::~CommunicatorImpl() {
  // Closing between calls is how a rank leaves: the backends tell peers it
  // left (a peer still finishing the last call is not disturbed).  A call
  // still running (async) is woken by an abort.
  std::deque<std::shared_ptr<Task>> orphans;
  bool busy = false;
  {
    MutexLock lock(&mu_);
    stopping_ = true;
    busy = running_ || !queue_.empty();
    cv_.SignalAll();
  }
  if (busy) Abort("communicator closed during a call");
  if (worker_.joinable()) worker_.join();
  {
    MutexLock lock(&mu_);
    orphans.swap(queue_);
  }
  for (auto& t : orphans) t->Finish(Status::Aborted("communicator closed before the call ran"));
}

std::string CommunicatorImpl::Describe(int r) const {
  if (r < 0 || r >= size()) return "rank " + std::to_string(r);
  const RankInfo& info = ranks_[r];
  std::string s = "rank " + std::to_string(r) + " (";
  if (!info.name.empty()) s += info.name + " ";
  return s + "on " + info.host + ", pid " + std::to_string(info.pid) + ")";
}

Status CommunicatorImpl::Setup(std::shared_ptr<Store> store, Deadline deadline) {
  // Hosts in order of their lowest rank; ranks in order within each.
  std::map<std::string, int> host_index;
  for (int r = 0; r < size(); ++r) {
    auto [it, fresh] = host_index.emplace(ranks_[r].host, static_cast<int>(hosts_.size()));
    if (fresh) hosts_.emplace_back();
    hosts_[it->second].push_back(r);
  }
  host_ = host_index[options_.host];
  const auto& mine = hosts_[host_];
  local_rank_ = static_cast<int>(std::find(mine.begin(), mine.end(), rank()) - mine.begin());

  auto names = [this](const std::vector<int>& members) {
    std::vector<std::string> out;
    for (int r : members) out.push_back(Describe(r));
    return out;
  };

  const bool tcp_only = options_.transport == Transport::kTcp;
  if (!tcp_only && mine.size() > 1) {
    ShmGroupOptions so;
    // shm names allow no '/' after the first; the prefix is the job's.
    so.name = "/" + options_.prefix + "-shm" + std::to_string(mine.front());
    std::replace(so.name.begin() + 1, so.name.end(), '/', '-');
    so.rank = local_rank_;
    so.size = static_cast<int>(mine.size());
    so.rank_names = names(mine);
    so.buffer_bytes = options_.shm_buffer_bytes;
    so.threads = options_.shm_threads;
    const std::string ready_key = kv::CollectiveShmKey(options_.prefix, mine.front());
    if (local_rank_ == 0) {
      auto group = ShmGroup::Create(so);
      if (!group.ok()) return group.status();
      local_ = std::move(*group);
      if (auto s = store->Set(ready_key, so.name); !s.ok()) return s;
    } else {
      auto ready = store->Get(ready_key, deadline.remaining());
      if (!ready.ok()) {
        return Status(ready.status().code(), Describe(rank()) + ": the shared-memory group of host " +
                                                 options_.host + " was not created by " + Describe(mine.front()) +
                                                 ": " + ready.status().message());
      }
      auto group = ShmGroup::Open(so);
      if (!group.ok()) return group.status();
      local_ = std::move(*group);
    }
    if (auto s = local_->Connect(deadline); !s.ok()) return s;
  }

  std::vector<int> ring_members;
  if (tcp_only && size() > 1) {  // one rank alone has no ring: the single-rank paths serve it
    ring_over_all_ = true;
    for (int r = 0; r < size(); ++r) ring_members.push_back(r);
  } else if (hosts_.size() > 1 && local_rank_ == 0) {
    for (const auto& h : hosts_) ring_members.push_back(h.front());
  }
  if (ring_members.size() > 1) {
    // The ring's ranks and size follow from the topology, so its listener
    // is made now and its port published; then every member's port is read.
    TcpRingOptions to;
    to.rank = static_cast<int>(std::find(ring_members.begin(), ring_members.end(), rank()) - ring_members.begin());
    to.size = static_cast<int>(ring_members.size());
    to.rank_names = names(ring_members);
    to.secret = options_.secret;
    to.bind_host = options_.bind_host;
    to.ring_id = options_.prefix;
    to.chunk_bytes = options_.tcp_chunk_bytes;
    auto ring = TcpRing::Listen(to);
    if (!ring.ok()) return ring.status();
    ring_ = std::move(*ring);
    const std::string my_port = std::to_string(ring_->port());
    if (auto s = store->Set(kv::CollectivePortKey(options_.prefix, rank()), my_port); !s.ok()) return s;
    std::vector<std::pair<std::string, int>> addresses;
    for (int r : ring_members) {
      auto port = store->Get(kv::CollectivePortKey(options_.prefix, r), deadline.remaining());
      if (!port.ok()) {
        return Status(port.status().code(), Describe(rank()) + ": " + Describe(r) +
                                                " did not open its TCP listener: " + port.status().message());
      }
      addresses.emplace_back(ranks_[r].host, std::atoi(port->c_str()));
    }
    if (auto s = ring_->Connect(addresses, deadline); !s.ok()) return s;
  }
  return Status::OK();
}

// ------------------------------------------------------------------ ordering

Status CommunicatorImpl::Run(std::function<Status()> fn) {
  {
    MutexLock lock(&mu_);
    if (queue_.empty() && !running_) {
      running_ = true;
      lock.Unlock();
      Status s = fn();
      lock.Lock();
      running_ = false;
      cv_.SignalAll();
      return s;
    }
  }
  // Calls are queued: this one runs after them, on the worker.
  auto task = std::make_shared<Task>(std::move(fn));
  {
    MutexLock lock(&mu_);
    queue_.push_back(task);
    cv_.SignalAll();
  }
  return task->Wait();
}

std::unique_ptr<Work> CommunicatorImpl::Enqueue(std::function<Status()> fn) {
  auto task = std::make_shared<Task>(std::move(fn));
  MutexLock lock(&mu_);
  if (stopping_) {
    task->Finish(Status::Aborted("communicator closed"));
    return std::make_unique<TaskHandle>(task);
  }
  queue_.push_back(task);
  if (!worker_.joinable()) worker_ = std::thread([this] { WorkerLoop(); });
  cv_.SignalAll();
  return std::make_unique<TaskHandle>(task);
}

void CommunicatorImpl::WorkerLoop() {
  MutexLock lock(&mu_);
  while (true) {
    while (!stopping_ && (queue_.empty() || running_)) cv_.Wait(&mu_);
    if (stopping_) return;
    auto task = queue_.front();
    queue_.pop_front();
    running_ = true;
    lock.Unlock();
    Status s = task->Execute();
    lock.Lock();
    running_ = false;  // before the waiter wakes: it may close the communicator at once
    cv_.SignalAll();
    lock.Unlock();
    task->Finish(std::move(s));
    lock.Lock();
  }
}

// ------------------------------------------------------------------ failure

Status CommunicatorImpl::Fail(Status s) {
  {
    MutexLock lock(&broken_mu_);
    if (!broken_.ok()) return broken_;
    broken_ = s;
  }
  const std::string reason = Describe(rank()) + " failed: " + s.message();
  if (local_) local_->Abort(reason);
  if (ring_) ring_->Abort(reason);
  return s;
}

void CommunicatorImpl::Abort(const std::string& reason) {
  {
    MutexLock lock(&broken_mu_);
    if (!broken_.ok()) return;
    broken_ = Status::Aborted(Describe(rank()) + " aborted: " + reason);
  }
  if (local_) local_->Abort(reason);
  if (ring_) ring_->Abort(reason);
}

Status CommunicatorImpl::Begin(Kind kind, DataType dtype, ReduceOp op, uint64_t count, int root, CallDesc* desc) {
  {
    MutexLock lock(&broken_mu_);
    if (!broken_.ok()) return broken_;
  }
  if (SizeOf(dtype) == 0) return Status::InvalidArgument("collective call: unknown dtype");
  if (static_cast<uint8_t>(op) > static_cast<uint8_t>(ReduceOp::kMax)) {
    return Status::InvalidArgument("collective call: unknown reduce op");
  }
  desc->seq = ++seq_;
  desc->kind = kind;
  desc->dtype = dtype;
  desc->op = op;
  desc->count = count;
  desc->root = root;
  return Status::OK();
}

// ------------------------------------------------------------------ calls

Status CommunicatorImpl::ReduceAll(const CallDesc& desc, void* data, Deadline deadline) {
  if (ring_over_all_) return ring_->Allreduce(desc, data, deadline);
  if (local_) {
    if (auto s = local_->Allreduce(desc, data, deadline); !s.ok()) return s;
  }
  if (hosts_.size() > 1) {
    if (ring_) {
      if (auto s = ring_->Allreduce(desc, data, deadline); !s.ok()) return s;
    }
    if (local_) {
      CallDesc b = desc;
      b.kind = Kind::kBroadcast;
      b.root = 0;
      if (auto s = local_->Broadcast(b, data, deadline); !s.ok()) return s;
    }
  }
  return Status::OK();
}

// ------------------------------------------------------------------ device memory

DeviceCalls& CommunicatorImpl::Device() {
  if (device_ == nullptr) {
    HostCollectives host;
    host.allreduce = [this](void* data, size_t count, DataType dtype, ReduceOp op, CallOptions o) {
      return DoAllreduce(data, count, dtype, op, o);
    };
    host.broadcast = [this](void* data, size_t count, DataType dtype, int root, CallOptions o) {
      return DoBroadcast(data, count, dtype, root, o);
    };
    host.allgather = [this](const void* in, size_t count, void* out, DataType dtype, CallOptions o) {
      return DoAllgather(in, std::vector<uint64_t>(size(), count), out, dtype, o);
    };
    host.fail = [this](Status st) { return Fail(std::move(st)); };
    host.broken = [this]() {
      MutexLock lock(&broken_mu_);
      return broken_;
    };
    device_ = std::make_unique<DeviceCalls>(options_, hosts_, Describe(rank()), std::move(host));
  }
  return *device_;
}

Status CommunicatorImpl::DoAllreduceOn(device::Device d, void* data, size_t count, DataType dtype, ReduceOp op,
                                       CallOptions options) {
  if (SizeOf(dtype) == 0) return Status::InvalidArgument("collective call: unknown dtype");
  return Device().Allreduce(d, data, count, dtype, op, DeadlineFor(options));
}

Status CommunicatorImpl::DoBroadcastOn(device::Device d, void* data, size_t count, DataType dtype, int root,
                                       CallOptions options) {
  if (SizeOf(dtype) == 0) return Status::InvalidArgument("collective call: unknown dtype");
  return Device().Broadcast(d, data, count, dtype, root, DeadlineFor(options));
}

// ------------------------------------------------------------------ host memory

Status CommunicatorImpl::DoAllreduce(void* data, size_t count, DataType dtype, ReduceOp op, CallOptions options) {
  CallDesc desc;
  if (auto s = Begin(Kind::kAllreduce, dtype, op, count, 0, &desc); !s.ok()) return s;
  if (count > 0 && data == nullptr) return Status::InvalidArgument("allreduce: null buffer");
  if (auto s = ReduceAll(desc, data, DeadlineFor(options)); !s.ok()) return Fail(s);
  if (op == ReduceOp::kAverage) DivideBy(dtype, data, count, size());
  return Status::OK();
}

Status CommunicatorImpl::DoAllreduceFused(std::span<const std::span<std::byte>> buffers, DataType dtype,
                                          ReduceOp op, CallOptions options) {
  const size_t elem = SizeOf(dtype);
  if (elem == 0) return Status::InvalidArgument("allreduce: unknown dtype");
  for (const auto& b : buffers) {
    if (b.size() % elem != 0) {
      return Status::InvalidArgument("fused allreduce: a buffer of " + std::to_string(b.size()) +
                                     " bytes is not a whole number of " + DataTypeName(dtype) + " elements");
    }
  }
  const Deadline deadline = DeadlineFor(options);
  std::vector<std::byte> fused;
  size_t i = 0;
  while (i < buffers.size()) {
    // One round: as many whole buffers as fit kFusionBytes (at least one).
    size_t j = i, bytes = 0;
    while (j < buffers.size() && (j == i || bytes + buffers[j].size() <= kFusionBytes)) bytes += buffers[j++].size();
    if (j == i + 1) {  // a single buffer: reduce it where it is
      CallDesc desc;
      if (auto s = Begin(Kind::kAllreduce, dtype, op, bytes / elem, 0, &desc); !s.ok()) return s;
      if (auto s = ReduceAll(desc, buffers[i].data(), deadline); !s.ok()) return Fail(s);
      if (op == ReduceOp::kAverage) DivideBy(dtype, buffers[i].data(), bytes / elem, size());
    } else {
      fused.resize(bytes);
      size_t off = 0;
      for (size_t k = i; k < j; ++k) {
        if (!buffers[k].empty()) std::memcpy(fused.data() + off, buffers[k].data(), buffers[k].size());
        off += buffers[k].size();
      }
      CallDesc desc;
      if (auto s = Begin(Kind::kAllreduce, dtype, op, bytes / elem, 0, &desc); !s.ok()) return s;
      if (auto s = ReduceAll(desc, fused.data(), deadline); !s.ok()) return Fail(s);
      if (op == ReduceOp::kAverage) DivideBy(dtype, fused.data(), bytes / elem, size());
      off = 0;
      for (size_t k = i; k < j; ++k) {
        if (!buffers[k].empty()) std::memcpy(buffers[k].data(), fused.data() + off, buffers[k].size());
        off += buffers[k].size();
      }
    }
    i = j;
  }
  return Status::OK();
}

Status CommunicatorImpl::BroadcastAll(const CallDesc& desc, void* data, Deadline deadline) {
  if (ring_over_all_) return ring_->Broadcast(desc, data, deadline);
  const int root = desc.root;
  int root_host = 0;
  for (size_t h = 0; h < hosts_.size(); ++h) {
    if (std::find(hosts_[h].begin(), hosts_[h].end(), root) != hosts_[h].end()) root_host = static_cast<int>(h);
  }
  const auto& roots = hosts_[root_host];
  CallDesc d = desc;
  if (host_ == root_host && local_) {  // root -> its host's leader (and the rest of its host)
    d.root = static_cast<int>(std::find(roots.begin(), roots.end(), root) - roots.begin());
    if (auto s = local_->Broadcast(d, data, deadline); !s.ok()) return s;
  }
  if (hosts_.size() > 1) {
    if (ring_) {  // leaders: root's host -> every host
      d.root = root_host;
      if (auto s = ring_->Broadcast(d, data, deadline); !s.ok()) return s;
    }
    if (host_ != root_host && local_) {  // leader -> its host
      d.root = 0;
      if (auto s = local_->Broadcast(d, data, deadline); !s.ok()) return s;
    }
  }
  return Status::OK();
}

Status CommunicatorImpl::DoBroadcast(void* data, size_t count, DataType dtype, int root, CallOptions options) {
  CallDesc desc;
  if (auto s = Begin(Kind::kBroadcast, dtype, ReduceOp::kSum, count, root, &desc); !s.ok()) return s;
  if (root < 0 || root >= size()) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank (size " +
                                   std::to_string(size()) + ")");
  }
  if (count > 0 && data == nullptr) return Status::InvalidArgument("broadcast: null buffer");
  if (auto s = BroadcastAll(desc, data, DeadlineFor(options)); !s.ok()) return Fail(s);
  return Status::OK();
}

Status CommunicatorImpl::DoAllgather(const void* in, const std::vector<uint64_t>& counts, void* out,
                                     DataType dtype, CallOptions options) {
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  CallDesc desc;
  if (auto s = Begin(Kind::kAllgather, dtype, ReduceOp::kSum, total, 0, &desc); !s.ok()) return s;
  if (total > 0 && out == nullptr) return Status::InvalidArgument("allgather: null output buffer");
  const Deadline deadline = DeadlineFor(options);
  const size_t elem = SizeOf(dtype);
  if (ring_over_all_) {
    if (auto s = ring_->Allgather(desc, in, counts, out, deadline); !s.ok()) return Fail(s);
    return Status::OK();
  }
  if (hosts_.size() == 1) {
    if (local_) {
      if (auto s = local_->Allgather(desc, in, counts, out, deadline); !s.ok()) return Fail(s);
    } else if (total > 0) {
      std::memcpy(out, in, total * elem);
    }
    return Status::OK();
  }
  // Several hosts: gather per host, then across leaders in host order, then
  // hand the whole to the host's ranks, and finally put blocks in rank order.
  std::vector<uint64_t> offset(size() + 1, 0);  // rank order
  for (int r = 0; r < size(); ++r) offset[r + 1] = offset[r] + counts[r];
  std::vector<std::byte> by_host(total * elem);
  const auto& mine = hosts_[host_];
  std::vector<uint64_t> local_counts;
  uint64_t local_total = 0;
  for (int r : mine) local_counts.push_back(counts[r]), local_total += counts[r];
  uint64_t host_offset = 0;  // where this host's block starts in by_host
  std::vector<uint64_t> host_counts;
  for (size_t h = 0; h < hosts_.size(); ++h) {
    uint64_t c = 0;
    for (int r : hosts_[h]) c += counts[r];
    if (static_cast<int>(h) < host_) host_offset += c;
    host_counts.push_back(c);
  }
  std::byte* local_block = by_host.data() + host_offset * elem;
  if (local_) {
    CallDesc d = desc;
    d.count = local_total;
    if (auto s = local_->Allgather(d, in, local_counts, local_block, deadline); !s.ok()) return Fail(s);
  } else if (local_total > 0) {
    std::memcpy(local_block, in, local_total * elem);
  }
  if (ring_) {
    if (auto s = ring_->Allgather(desc, local_block, host_counts, by_host.data(), deadline); !s.ok()) return Fail(s);
  }
  if (local_) {
    CallDesc b = desc;
    b.kind = Kind::kBroadcast;
    b.root = 0;
    if (auto s = local_->Broadcast(b, by_host.data(), deadline); !s.ok()) return Fail(s);
  }
  uint64_t pos = 0;
  for (const auto& h : hosts_) {
    for (int r : h) {
      if (counts[r] > 0) {
        std::memcpy(static_cast<std::byte*>(out) + offset[r] * elem, by_host.data() + pos * elem, counts[r] * elem);
      }
      pos += counts[r];
    }
  }
  return Status::OK();
}

Status CommunicatorImpl::DoAllgatherV(const void* in, size_t count, DataType dtype, std::vector<std::byte>* out,
                                      std::vector<uint64_t>* counts_out, CallOptions options) {
  // First every rank's count (an equal allgather of one int64), then the data.
  std::vector<uint64_t> counts(size());
  const uint64_t mine = count;
  if (auto s = DoAllgather(&mine, std::vector<uint64_t>(size(), 1), counts.data(), DataType::kInt64, options);
      !s.ok()) {
    return s;
  }
  uint64_t total = 0;
  for (uint64_t c : counts) total += c;
  out->resize(total * SizeOf(dtype));
  if (auto s = DoAllgather(in, counts, out->data(), dtype, options); !s.ok()) return s;
  if (counts_out) *counts_out = std::move(counts);
  return Status::OK();
}

Status CommunicatorImpl::DoReduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                                         CallOptions options) {
  CallDesc desc;
  if (auto s = Begin(Kind::kReduceScatter, dtype, op, count, 0, &desc); !s.ok()) return s;
  if (count > 0 && (in == nullptr || out == nullptr)) return Status::InvalidArgument("reduce-scatter: null buffer");
  const Deadline deadline = DeadlineFor(options);
  const size_t block = count * SizeOf(dtype);
  Backend* only = ring_over_all_ ? static_cast<Backend*>(ring_.get())
                                 : (hosts_.size() == 1 ? static_cast<Backend*>(local_.get()) : nullptr);
  if (only != nullptr) {
    if (auto s = only->ReduceScatter(desc, in, out, deadline); !s.ok()) return Fail(s);
  } else if (size() == 1) {
    if (block > 0) std::memcpy(out, in, block);
  } else {
    // Several hosts: reduce everything, keep this rank's block.
    std::vector<std::byte> all(block * size());
    if (!all.empty()) std::memcpy(all.data(), in, all.size());
    CallDesc d = desc;
    d.kind = Kind::kAllreduce;
    d.count = count * size();
    if (auto s = ReduceAll(d, all.data(), deadline); !s.ok()) return Fail(s);
    if (block > 0) std::memcpy(out, all.data() + block * rank(), block);
  }
  if (op == ReduceOp::kAverage) DivideBy(dtype, out, count, size());
  return Status::OK();
}

Status CommunicatorImpl::DoBarrier(CallOptions options) {
  CallDesc desc;
  if (auto s = Begin(Kind::kBarrier, DataType::kFloat32, ReduceOp::kSum, 0, 0, &desc); !s.ok()) return s;
  const Deadline deadline = DeadlineFor(options);
  if (ring_over_all_) {
    if (auto s = ring_->Barrier(desc, deadline); !s.ok()) return Fail(s);
    return Status::OK();
  }
  if (local_) {
    if (auto s = local_->Barrier(desc, deadline); !s.ok()) return Fail(s);
  }
  if (hosts_.size() > 1) {
    if (ring_) {
      if (auto s = ring_->Barrier(desc, deadline); !s.ok()) return Fail(s);
    }
    if (local_) {
      if (auto s = local_->Barrier(desc, deadline); !s.ok()) return Fail(s);
    }
  }
  return Status::OK();
}

}  // namespace

Result<std::unique_ptr<Communicator>> Communicator::Create(const CommunicatorOptions& options,
                                                           std::shared_ptr<Store> store) {
  if (options.size < 1) return Status::InvalidArgument("communicator: size must be at least 1");
  if (options.rank < 0 || options.rank >= options.size) {
    return Status::InvalidArgument("communicator: rank " + std::to_string(options.rank) + " is outside 0.." +
                                   std::to_string(options.size - 1));
  }
  if (options.secret.size() < 16) return Status::InvalidArgument("communicator: the secret must have at least 16 bytes");
  if (options.host.empty()) return Status::InvalidArgument("communicator: host must not be empty");
  if (options.prefix.empty()) return Status::InvalidArgument("communicator: prefix must not be empty");
  if (!store) return Status::InvalidArgument("communicator: no store");
  const Deadline deadline = Deadline::After(options.connect_timeout);

  RankInfo self{options.host, options.name, static_cast<int64_t>(getpid())};
  if (auto s = store->Set(kv::CollectiveRankKey(options.prefix, options.rank), EncodeRankInfo(self)); !s.ok()) {
    return s;
  }

  std::vector<RankInfo> ranks(options.size);
  std::vector<int> missing;
  Status first_error;
  for (int r = 0; r < options.size; ++r) {
    auto v = store->Get(kv::CollectiveRankKey(options.prefix, r), missing.empty() ? deadline.remaining() : Duration(0));
    if (!v.ok()) {
      if (v.status().code() != StatusCode::kDeadlineExceeded) return v.status();
      missing.push_back(r);
      continue;
    }
    if (auto s = DecodeRankInfo(*v, &ranks[r]); !s.ok()) {
      return Status::Corruption("communicator: the card of rank " + std::to_string(r) + " in the store is malformed: " +
                                s.message());
    }
  }
  if (!missing.empty()) {
    std::string list;
    for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
    return Status::DeadlineExceeded("communicator " + options.prefix + ": rank " + std::to_string(options.rank) +
                                    " waited " + FormatDuration(options.connect_timeout) + " for rank(s) " + list +
                                    " of " + std::to_string(options.size) +
                                    " to join; they never created their communicator (did every node call it?)");
  }
  auto comm = std::make_unique<CommunicatorImpl>(options, std::move(ranks));
  if (auto s = comm->Setup(store, deadline); !s.ok()) return s;
  return std::unique_ptr<Communicator>(std::move(comm));
}

}  // namespace ember::collective
