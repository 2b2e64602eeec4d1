#include "collective/device_calls.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

namespace ember::collective {
namespace {

constexpr size_t kRecordBytes = 256;  // per rank: [NCCL loaded][device identity, NUL-padded]
constexpr size_t kIdMessageBytes = 136;  // [rank 0 made an id][7 pad][ncclUniqueId, 128 bytes]

bool IsInteger(DataType t) { return t == DataType::kInt32 || t == DataType::kInt64; }

}  // namespace

DeviceCalls::DeviceCalls(const CommunicatorOptions& options, std::vector<std::vector<int>> hosts, std::string self,
                         HostCollectives host)
    : options_(options), hosts_(std::move(hosts)), self_(std::move(self)), host_(std::move(host)) {
  for (size_t h = 0; h < hosts_.size(); ++h) {
    auto it = std::find(hosts_[h].begin(), hosts_[h].end(), options_.rank);
    if (it != hosts_[h].end()) {
      host_index_ = static_cast<int>(h);
      local_rank_ = static_cast<int>(it - hosts_[h].begin());
    }
  }
}

DeviceCalls::~DeviceCalls() {
  for (auto& [ordinal, state] : states_) {
    state.staging.reset();
    if (state.comm != nullptr && nccl_ != nullptr) nccl_->Abort(state.comm);  // never blocks on peers
    if (runtime_ != nullptr) {
      if (state.done != nullptr) runtime_->FreeEvent(state.done);
      if (state.stream != nullptr) runtime_->FreeStream(state.stream);
    }
  }
}

CallOptions DeviceCalls::Remaining(Deadline deadline) {
  CallOptions o;
  o.timeout = std::max(deadline.remaining(), Duration(1));
  return o;
}

std::string DeviceCalls::Where(int ordinal) const { return self_ + ", CUDA device " + std::to_string(ordinal); }

std::string DeviceCalls::PathOf(int ordinal) const {
  auto it = states_.find(ordinal);
  if (it == states_.end()) return "";
  return it->second.nccl ? "nccl" : it->second.hierarchical ? "hierarchical" : "staged";
}

Result<DeviceCalls::State*> DeviceCalls::Open(device::Device d, Deadline deadline) {
  if (auto s = host_.broken(); !s.ok()) return s;
  if (d.kind != device::Kind::kCuda) return Status::InvalidArgument("collective call: unknown device kind");
  auto it = states_.find(d.ordinal);
  if (it != states_.end()) return &it->second;
  // A rank that cannot take part breaks the communicator: the others fail at once, naming it.
  if (runtime_ == nullptr) {
    runtime_ = options_.device_runtime;
    if (runtime_ == nullptr) {
      auto loaded = device::LoadCuda(options_.cuda);
      if (!loaded.ok()) return host_.fail(loaded.status().WithContext(Where(d.ordinal)));
      runtime_ = *loaded;
    }
  }
  State state;
  if (auto s = Decide(d.ordinal, &state, deadline); !s.ok()) {
    if (state.comm != nullptr) nccl_->Abort(state.comm);
    if (state.done != nullptr) runtime_->FreeEvent(state.done);
    if (state.stream != nullptr) runtime_->FreeStream(state.stream);
    return s;
  }
  return &states_.emplace(d.ordinal, std::move(state)).first->second;
}

Status DeviceCalls::AwaitReady(device::Device d, Deadline deadline) {
  if (d.ready == nullptr) return Status::OK();
  auto pause = std::chrono::microseconds(10);
  while (true) {
    auto passed = runtime_->QueryEvent(d.ready);
    if (!passed.ok()) return host_.fail(passed.status().WithContext(Where(d.ordinal) + ": the caller's ready event"));
    if (*passed) return Status::OK();
    if (deadline.expired()) {
      // This rank never joins the call: the others fail at once, naming it, rather than at their deadline.
      return host_.fail(Status::DeadlineExceeded(
          Where(d.ordinal) + ": the work that writes the buffer (queued on the caller's stream before the call) "
          "did not finish within the call's timeout; a kernel before the collective is stuck or the timeout is "
          "too short for it"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(500));
  }
}

Status DeviceCalls::Decide(int ordinal, State* state, Deadline deadline) {
  const int size = options_.size;
  auto identity = runtime_->DeviceIdentity(ordinal);
  if (!identity.ok()) return host_.fail(identity.status().WithContext(Where(ordinal)));
  bool can_nccl = options_.use_nccl && size > 1;
  if (can_nccl && nccl_ == nullptr) {
    nccl_ = options_.nccl;
    if (nccl_ == nullptr) {
      auto loaded = LoadNccl(options_.nccl_libraries);
      if (loaded.ok()) nccl_ = *loaded;  // absent: this rank stages, and so does every rank
    }
  }
  can_nccl = can_nccl && nccl_ != nullptr;
  std::vector<char> mine(kRecordBytes, '\0'), all(kRecordBytes * size, '\0');
  mine[0] = can_nccl ? 1 : 0;
  std::memcpy(mine.data() + 1, identity->data(), std::min(identity->size(), kRecordBytes - 2));
  if (auto s = host_.allgather(mine.data(), kRecordBytes / 8, all.data(), DataType::kInt64, Remaining(deadline));
      !s.ok()) {
    return s;
  }
  // NCCL where every rank loaded it and the ranks of each host are on GPUs of their own (PCI bus
  // ids repeat across hosts: distinct within a host is what counts).
  bool use = true, several_on_a_host = false;
  for (const auto& ranks : hosts_) {
    std::set<std::string> devices;
    for (int r : ranks) {
      const char* record = all.data() + r * kRecordBytes;
      use = use && record[0] == 1;
      devices.insert(std::string(record + 1, strnlen(record + 1, kRecordBytes - 1)));
    }
    use = use && devices.size() == ranks.size();
    several_on_a_host = several_on_a_host || ranks.size() > 1;
  }
  const bool hierarchical = hosts_.size() > 1;
  if (!use || (hierarchical && !several_on_a_host)) return Status::OK();  // hosts of one rank: NCCL adds nothing

  // The ids: every rank's record, made by the leader (lowest rank) of each host of 2+ ranks;
  // a host whose leader could not make one stages, and so does every rank.
  const auto& ranks = hosts_[host_index_];
  std::vector<char> id(kIdMessageBytes, '\0'), ids(kIdMessageBytes * size, '\0');
  const bool makes_id = hierarchical ? local_rank_ == 0 && ranks.size() > 1 : options_.rank == 0;
  if (makes_id) {
    auto made = nccl_->UniqueId();
    if (made.ok() && made->size() == kIdMessageBytes - 8) {
      id[0] = 1;
      std::memcpy(id.data() + 8, made->data(), made->size());
    }
  }
  if (!hierarchical) {
    if (auto s = host_.broadcast(id.data(), kIdMessageBytes / 8, DataType::kInt64, 0, Remaining(deadline)); !s.ok()) {
      return s;
    }
    if (id[0] != 1) return Status::OK();  // rank 0 could not make an id: every rank stages
  } else {
    if (auto s = host_.allgather(id.data(), kIdMessageBytes / 8, ids.data(), DataType::kInt64, Remaining(deadline));
        !s.ok()) {
      return s;
    }
    for (const auto& h : hosts_) {
      if (h.size() > 1 && ids[h.front() * kIdMessageBytes] != 1) return Status::OK();
    }
    std::memcpy(id.data(), ids.data() + ranks.front() * kIdMessageBytes, kIdMessageBytes);
  }
  auto stream = runtime_->NewStream();
  if (!stream.ok()) return host_.fail(stream.status().WithContext(Where(ordinal)));
  state->stream = *stream;
  auto done = runtime_->NewEvent();
  if (!done.ok()) return host_.fail(done.status().WithContext(Where(ordinal)));
  state->done = *done;
  if (!hierarchical || ranks.size() > 1) {
    if (auto s = runtime_->SetDevice(ordinal); !s.ok()) return host_.fail(s.WithContext(Where(ordinal)));
    const int n = hierarchical ? static_cast<int>(ranks.size()) : size;
    const int me = hierarchical ? local_rank_ : options_.rank;
    auto comm = nccl_->InitRank(std::string(id.data() + 8, kIdMessageBytes - 8), n, me);
    if (!comm.ok()) return host_.fail(comm.status().WithContext(Where(ordinal) + ": joining NCCL"));
    state->comm = *comm;
  }
  state->nccl = !hierarchical;
  state->hierarchical = hierarchical;
  return Status::OK();
}

Status DeviceCalls::Staged(int ordinal, State* state, void* data, size_t count, DataType dtype, bool copy_in,
                           bool copy_back, Deadline deadline,
                           const std::function<Status(void*, size_t, CallOptions)>& call) {
  const size_t elem = SizeOf(dtype);
  if (state->staging == nullptr) {
    auto opened = DeviceStaging::Open(runtime_, ordinal, options_.device_chunk_bytes);
    if (!opened.ok()) return host_.fail(opened.status().WithContext(Where(ordinal) + ": staging buffers"));
    state->staging = std::move(*opened);
  }
  auto outcome = state->staging->Run(data, count * elem, copy_in, copy_back, [&](void* host, size_t bytes) {
    return call(host, bytes / elem, Remaining(deadline));
  });
  if (outcome.runtime_failed) return host_.fail(outcome.status.WithContext(Where(ordinal)));
  return outcome.status;
}

Status DeviceCalls::CheckPeers(const char* what, uint64_t kind, DataType dtype, uint64_t op_or_root, size_t count,
                               Deadline deadline) {
  // The descriptor check (and liveness) through the host transports: NCCL itself would hang on
  // a mismatched call, and cannot name a dead rank.
  const int size = options_.size;
  int64_t mine[4] = {static_cast<int64_t>(kind), static_cast<int64_t>(dtype), static_cast<int64_t>(op_or_root),
                     static_cast<int64_t>(count)};
  std::vector<int64_t> all(4 * size);
  if (auto s = host_.allgather(mine, 4, all.data(), DataType::kInt64, Remaining(deadline)); !s.ok()) return s;
  for (int r = 1; r < size; ++r) {
    if (!std::equal(all.begin() + 4 * r, all.begin() + 4 * r + 4, all.begin())) {
      auto describe = [&](int q) {
        return "rank " + std::to_string(q) + " called " + what + " (kind " + std::to_string(all[4 * q]) +
               ") of " + std::to_string(all[4 * q + 3]) + " " + DataTypeName(static_cast<DataType>(all[4 * q + 1])) +
               " elements, op/root " + std::to_string(all[4 * q + 2]);
      };
      return host_.fail(Status::InvalidArgument("collective calls on CUDA memory do not match: " + describe(0) +
                                                ", " + describe(r)));
    }
  }
  return Status::OK();
}

Status DeviceCalls::NcclRun(int ordinal, State* state, const char* what, DataType dtype, size_t count,
                            Deadline deadline, const std::function<Status()>& enqueue) {
  auto broken = [&](Status s) {
    nccl_->Abort(state->comm);
    state->comm = nullptr;
    return host_.fail(s.WithContext(Where(ordinal)));
  };
  if (state->comm == nullptr) return host_.fail(Status::Internal(Where(ordinal) + ": its NCCL communicator is gone"));
  if (auto s = runtime_->SetDevice(ordinal); !s.ok()) return host_.fail(s.WithContext(Where(ordinal)));
  if (auto s = enqueue(); !s.ok()) return broken(s);
  if (auto s = runtime_->RecordEvent(state->done, state->stream); !s.ok()) return broken(s);
  auto pause = std::chrono::microseconds(20);
  while (true) {
    auto ready = runtime_->QueryEvent(state->done);
    if (!ready.ok()) return broken(ready.status());
    // A peer's failure can end the kernels early: the result counts only without an async error.
    if (auto s = nccl_->AsyncError(state->comm); !s.ok()) return broken(s);
    if (*ready) return Status::OK();
    if (deadline.expired()) {
      return broken(Status::DeadlineExceeded(
          std::string("NCCL ") + what + " of " + std::to_string(count) + " " + DataTypeName(dtype) +
          " elements did not complete within the call's timeout: a rank died or stalled in it (NCCL cannot say "
          "which; the other ranks' errors name theirs). The NCCL communicator was aborted"));
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

Status DeviceCalls::NcclCall(int ordinal, State* state, const char* what, uint64_t kind, DataType dtype,
                             uint64_t op_or_root, size_t count, Deadline deadline,
                             const std::function<Status()>& enqueue) {
  if (auto s = CheckPeers(what, kind, dtype, op_or_root, count, deadline); !s.ok()) return s;
  return NcclRun(ordinal, state, what, dtype, count, deadline, enqueue);
}

Status DeviceCalls::HierarchicalAllreduce(int ordinal, State* state, void* data, size_t count, DataType dtype,
                                          ReduceOp op, Deadline deadline) {
  if (auto s = CheckPeers("allreduce", 1, dtype, static_cast<uint64_t>(op), count, deadline); !s.ok()) return s;
  // Sums (and averages, divided once by the job's size on the host) add up the host's sum from its
  // leader and zeros from the rest; min and max take the host's result from every rank (all equal).
  const bool additive = op == ReduceOp::kSum || op == ReduceOp::kAverage;
  const ReduceOp in_host = additive ? ReduceOp::kSum : op;
  if (state->comm != nullptr) {
    auto s = NcclRun(ordinal, state, "allreduce (inside the host)", dtype, count, deadline,
                     [&] { return nccl_->Allreduce(state->comm, data, count, dtype, in_host, state->stream); });
    if (!s.ok()) return s;
  }
  const bool leader = local_rank_ == 0;
  const size_t elem = SizeOf(dtype);
  auto s = Staged(ordinal, state, data, count, dtype, leader || !additive, leader, deadline,
                  [&](void* host, size_t n, CallOptions chunk) {
                    if (!leader && additive) std::memset(host, 0, n * elem);
                    return host_.allreduce(host, n, dtype, op, chunk);
                  });
  if (!s.ok() || state->comm == nullptr) return s;
  return NcclRun(ordinal, state, "broadcast (inside the host)", dtype, count, deadline,
                 [&] { return nccl_->Broadcast(state->comm, data, count, dtype, 0, state->stream); });
}

Status DeviceCalls::HierarchicalBroadcast(int ordinal, State* state, void* data, size_t count, DataType dtype,
                                          int root, Deadline deadline) {
  if (auto s = CheckPeers("broadcast", 2, dtype, static_cast<uint64_t>(root), count, deadline); !s.ok()) return s;
  // Root -> every host's memory (the host collectives), each host's leader -> its GPU, then NCCL
  // from the leader to the rest of the host.
  const bool is_root = options_.rank == root, leader = local_rank_ == 0;
  auto s = Staged(ordinal, state, data, count, dtype, is_root, leader && !is_root, deadline,
                  [&](void* host, size_t n, CallOptions chunk) { return host_.broadcast(host, n, dtype, root, chunk); });
  if (!s.ok() || state->comm == nullptr) return s;
  return NcclRun(ordinal, state, "broadcast (inside the host)", dtype, count, deadline,
                 [&] { return nccl_->Broadcast(state->comm, data, count, dtype, 0, state->stream); });
}

Status DeviceCalls::Allreduce(device::Device d, void* data, size_t count, DataType dtype, ReduceOp op,
                              Deadline deadline) {
  if (count > 0 && data == nullptr) return Status::InvalidArgument("allreduce: null device buffer");
  auto state = Open(d, deadline);
  if (!state.ok()) return state.status();
  if (auto s = AwaitReady(d, deadline); !s.ok()) return s;
  if ((*state)->hierarchical) return HierarchicalAllreduce(d.ordinal, *state, data, count, dtype, op, deadline);
  // NCCL's average of integers is not C's truncating division: those stage.
  if ((*state)->nccl && !(IsInteger(dtype) && op == ReduceOp::kAverage)) {
    return NcclCall(d.ordinal, *state, "allreduce", 1, dtype, static_cast<uint64_t>(op), count, deadline, [&] {
      return nccl_->Allreduce((*state)->comm, data, count, dtype, op, (*state)->stream);
    });
  }
  return Staged(d.ordinal, *state, data, count, dtype, true, true, deadline,
                [&](void* host, size_t n, CallOptions chunk) { return host_.allreduce(host, n, dtype, op, chunk); });
}

Status DeviceCalls::Broadcast(device::Device d, void* data, size_t count, DataType dtype, int root,
                              Deadline deadline) {
  if (count > 0 && data == nullptr) return Status::InvalidArgument("broadcast: null device buffer");
  if (root < 0 || root >= options_.size) {
    return Status::InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank");
  }
  auto state = Open(d, deadline);
  if (!state.ok()) return state.status();
  if (auto s = AwaitReady(d, deadline); !s.ok()) return s;
  if ((*state)->hierarchical) return HierarchicalBroadcast(d.ordinal, *state, data, count, dtype, root, deadline);
  if ((*state)->nccl) {
    return NcclCall(d.ordinal, *state, "broadcast", 2, dtype, static_cast<uint64_t>(root), count, deadline, [&] {
      return nccl_->Broadcast((*state)->comm, data, count, dtype, root, (*state)->stream);
    });
  }
  const bool is_root = options_.rank == root;
  return Staged(d.ordinal, *state, data, count, dtype, is_root, !is_root, deadline,
                [&](void* host, size_t n, CallOptions chunk) { return host_.broadcast(host, n, dtype, root, chunk); });
}

}  // namespace ember::collective
