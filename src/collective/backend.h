// The interface a collective transport implements: shm_group.h (ranks on
// one host, shared memory) and tcp_ring.h (a ring of TCP connections).  The
// Communicator (communicator.cc) picks and composes them; nothing above it
// sees a backend.
//
// Calls are blocking, made by one thread at a time, in the same order on
// every rank of the group (the Communicator guarantees it).  Each takes the
// call's descriptor (call.h), which the backend checks against its peers'
// (InvalidArgument naming both ranks and both calls on a mismatch), and a
// deadline: a peer that does not take part in time yields DeadlineExceeded
// naming it; a peer that died yields Aborted naming it.  After any failure
// the backend is broken: later calls return the first error at once.
//
// Reductions arrive here as kSum, kMin or kMax (the Communicator turns
// kAverage into kSum and a division).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "collective/call.h"
#include "ember/deadline.h"
#include "ember/status.h"

namespace ember::collective {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int rank() const = 0;  // within this group, 0..size()-1
  virtual int size() const = 0;

  // In place over desc.count elements.
  virtual Status Allreduce(const CallDesc& desc, void* data, Deadline deadline) = 0;
  // desc.count elements of rank desc.root's `data` into every rank's `data`.
  virtual Status Broadcast(const CallDesc& desc, void* data, Deadline deadline) = 0;
  // Rank r gives counts[r] elements at `in`; `out` receives all of them in
  // rank order (desc.count = their sum).  Every rank passes the same counts.
  virtual Status Allgather(const CallDesc& desc, const void* in, std::span<const uint64_t> counts, void* out,
                           Deadline deadline) = 0;
  // `in`: size() blocks of desc.count elements; `out`: the reduction of
  // block rank().  `in` is not modified.
  virtual Status ReduceScatter(const CallDesc& desc, const void* in, void* out, Deadline deadline) = 0;
  virtual Status Barrier(const CallDesc& desc, Deadline deadline) = 0;

  // Breaks the group: blocked and later calls here return Aborted(reason),
  // and peers' calls fail naming this rank with `reason`.  Thread-safe,
  // idempotent; may be called while another thread is in a call.
  virtual void Abort(const std::string& reason) = 0;
};

}  // namespace ember::collective
