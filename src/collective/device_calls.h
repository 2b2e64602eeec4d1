// The Communicator's calls on accelerator memory (CommunicatorOptions,
// include/ember/collective.h), per device, decided once at the device's first
// call and the same on every rank:
//
//   NCCL     every rank on one host, each on a GPU of its own (distinct PCI bus
//            ids), and every rank loaded NCCL: device-to-device, on a stream
//            of ours, waited for with the call's deadline (a rank that dies
//            mid-call: the NCCL comm is aborted and the communicator broken).
//            Every call first checks its descriptor against the other ranks'
//            through the host transports, so a mismatched call fails on every
//            rank, as on the host path, and a dead rank is named there.
//   hierarchical  ranks on several hosts, every rank loaded NCCL, the ranks of
//            each host on GPUs of their own (Horovod's hierarchical allreduce):
//            NCCL inside each host (one communicator per host of 2+ ranks), the
//            host's lowest rank staging the host's result through the host
//            collectives (shared memory, then the hosts' leaders' TCP ring; the
//            other ranks of the host put zeros in for sums), and an NCCL
//            broadcast from that rank to the rest of its host.
//   staged   otherwise (one GPU shared by ranks, no NCCL, hosts of one rank):
//            DeviceStaging through pinned host chunks and the host collectives.
//
// The decision exchanges each rank's (NCCL loaded, device identity) through
// the host transports.  Used by CommunicatorImpl on its call thread
// (one call at a time); not thread-safe by itself.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "collective/staged.h"
#include "ember/collective.h"
#include "ember/deadline.h"
#include "ember/device.h"

namespace ember::collective {

// The host-memory side of the Communicator that device calls are built on.
struct HostCollectives {
  std::function<Status(void* data, size_t count, DataType dtype, ReduceOp op, CallOptions options)> allreduce;
  std::function<Status(void* data, size_t count, DataType dtype, int root, CallOptions options)> broadcast;
  // Every rank gives `count` elements; `out` holds size * count.
  std::function<Status(const void* in, size_t count, void* out, DataType dtype, CallOptions options)> allgather;
  // Breaks the communicator with `s` (every rank's calls then fail naming this rank); returns it.
  std::function<Status(Status s)> fail;
  // The communicator's broken status, or OK.
  std::function<Status()> broken;
};

class DeviceCalls {
 public:
  // `hosts`: the global ranks of each host (every rank in exactly one).  `self`: how errors name this rank.
  DeviceCalls(const CommunicatorOptions& options, std::vector<std::vector<int>> hosts, std::string self,
              HostCollectives host);
  ~DeviceCalls();

  Status Allreduce(device::Device d, void* data, size_t count, DataType dtype, ReduceOp op, Deadline deadline);
  Status Broadcast(device::Device d, void* data, size_t count, DataType dtype, int root, Deadline deadline);

  // "nccl", "hierarchical" or "staged" for a device that made a call; "" before its first.
  std::string PathOf(int ordinal) const;

 private:
  struct State {
    bool nccl = false;                 // every rank in one NCCL communicator
    bool hierarchical = false;         // NCCL per host, the host collectives between hosts
    void* comm = nullptr;              // NCCL (hierarchical: this host's; none on a host of one rank)
    device::Stream stream = nullptr;   // NCCL's stream
    device::Event done = nullptr;
    std::unique_ptr<DeviceStaging> staging;  // made at the first staged call
  };

  Result<State*> Open(device::Device d, Deadline deadline);
  // Waits (polling, until `deadline`) for the caller's `d.ready` event: the buffer's writers ran.
  Status AwaitReady(device::Device d, Deadline deadline);
  Status Decide(int ordinal, State* state, Deadline deadline);
  Status Staged(int ordinal, State* state, void* data, size_t count, DataType dtype, bool copy_in, bool copy_back,
                Deadline deadline, const std::function<Status(void*, size_t, CallOptions)>& call);
  // The descriptor check before an NCCL call, then the call and its wait.
  Status NcclCall(int ordinal, State* state, const char* what, uint64_t kind, DataType dtype, uint64_t op_or_root,
                  size_t count, Deadline deadline, const std::function<Status()>& enqueue);
  // Every rank's call against the others' (through the host transports): a mismatch fails every rank.
  Status CheckPeers(const char* what, uint64_t kind, DataType dtype, uint64_t op_or_root, size_t count,
                    Deadline deadline);
  // Enqueues an NCCL operation on the state's stream and waits for it (deadline, peers' async errors).
  Status NcclRun(int ordinal, State* state, const char* what, DataType dtype, size_t count, Deadline deadline,
                 const std::function<Status()>& enqueue);
  Status HierarchicalAllreduce(int ordinal, State* state, void* data, size_t count, DataType dtype, ReduceOp op,
                               Deadline deadline);
  Status HierarchicalBroadcast(int ordinal, State* state, void* data, size_t count, DataType dtype, int root,
                               Deadline deadline);
  static CallOptions Remaining(Deadline deadline);
  std::string Where(int ordinal) const;

  const CommunicatorOptions options_;
  const std::vector<std::vector<int>> hosts_;
  int host_index_ = 0;  // this rank's index in hosts_
  int local_rank_ = 0;  // its index in hosts_[host_]
  const std::string self_;
  HostCollectives host_;
  std::shared_ptr<device::Runtime> runtime_;
  std::shared_ptr<Nccl> nccl_;
  std::map<int, State> states_;
};

}  // namespace ember::collective
