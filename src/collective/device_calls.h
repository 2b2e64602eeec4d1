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
//   staged   otherwise (one GPU shared by ranks, several hosts, no NCCL):
//            DeviceStaging through pinned host chunks and the host collectives.
//
// The decision exchanges each rank's (NCCL loaded, host, device identity)
// through the host transports.  Used by CommunicatorImpl on its call thread
// (one call at a time); not thread-safe by itself.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

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
  // `one_host`: every rank on this rank's host.  `self`: how errors name this rank.
  DeviceCalls(const CommunicatorOptions& options, bool one_host, std::string self, HostCollectives host);
  ~DeviceCalls();

  Status Allreduce(device::Device d, void* data, size_t count, DataType dtype, ReduceOp op, Deadline deadline);
  Status Broadcast(device::Device d, void* data, size_t count, DataType dtype, int root, Deadline deadline);

  // "nccl" or "staged" for a device that made a call; "" before its first.
  std::string PathOf(int ordinal) const;

 private:
  struct State {
    bool nccl = false;
    void* comm = nullptr;              // NCCL
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
  static CallOptions Remaining(Deadline deadline);
  std::string Where(int ordinal) const;

  const CommunicatorOptions options_;
  const bool one_host_;
  const std::string self_;
  HostCollectives host_;
  std::shared_ptr<device::Runtime> runtime_;
  std::shared_ptr<Nccl> nccl_;
  std::map<int, State> states_;
};

}  // namespace ember::collective
