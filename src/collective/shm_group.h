// ShmGroup: the ranks of one host reduce through one POSIX shared-memory
// segment (the collective Backend for ranks that share a machine; the
// Communicator puts a TCP ring between hosts on top).  The design follows
// DeepSpeed's CPU shared-memory allreduce: every rank copies its data into
// its own shared buffer, then reads its peers' buffers directly, so a call
// costs a copy in, one reduction pass and (for large calls) a copy out, with
// no message passing at all.
//
// Segment layout (one segment per group; every offset 4 KiB-aligned):
//
//   Header     magic, version, size, buffer bytes; the abort word, the rank
//              that aborted and its reason (first writer wins)
//   Slot[size] one 128-byte slot per rank (two cache lines, so neighbours'
//              counters never share a prefetched pair):
//                arrived   uint32 step counter, the futex word
//                waiters   threads sleeping on `arrived` (wake only if > 0)
//                pid       the rank's process (liveness: kill(pid, 0))
//                left      0, or why the rank left (failed / closed)
//                desc[2]   the rank's current call, by step parity
//   Buffers    per rank two buffers of `buffer_bytes`, used by step parity
//
// Step protocol.  All work is a sequence of steps; every rank takes the same
// steps (the calls match; the first step of each call checks that).  Step t:
//   1. write my part into my buffer[t % 2] (and my call into desc[t % 2]);
//   2. publish arrived = t (seq_cst store; FUTEX_WAKE if waiters != 0);
//   3. wait until every rank's arrived >= t (acquire; compared with
//      wrap-around arithmetic, so the counters never need resetting);
//   4. read any rank's buffer[t % 2].
// A rank overwrites buffer[t % 2] next at step t + 2, which it starts only
// after every rank arrived at t + 1, that is after every rank finished
// reading at step t: double buffering makes a second barrier per step
// unnecessary.  (A rank may also write its buffer[(t + 1) % 2] after step
// 3 of step t: everybody finished reading that one at step t - 1.)
//
// Algorithms, per chunk of at most buffer_bytes:
//   allreduce, small chunk: one step; every rank reduces all buffers in rank
//     order into its output.
//   allreduce, large chunk: reduce-scatter then allgather, two steps: rank r
//     reduces slice r of every buffer[t % 2] into slice r of its own
//     buffer[(t + 1) % 2]; after step t + 1 every rank copies slice j from
//     rank j.  Each element is reduced in rank order by one rank, so every
//     rank gets the same bits either way.
//   broadcast: the root copies in, everybody else copies out; one step.
//   allgather: each rank copies its next piece in, everybody copies every
//     piece out; one step per buffer's worth of the largest contribution.
//   reduce-scatter: each rank copies a piece of every block in, rank r
//     reduces piece r of every buffer into its output; one step.
//   barrier: one step with no data.
//
// Waiting: a short spin, then shm::WaitShared (transport/shm/wait.h):
// FUTEX_WAIT (process-shared) on the awaited rank's counter in slices of at
// most 50 ms; between slices the waiter looks at the abort word and the
// awaited rank's `left`, its pid, and the deadline.  The waiter increments `waiters` before re-reading the counter
// and the writer reads `waiters` after storing it (both seq_cst), so a
// wake-up is never lost and an uncontended step makes no system call.
// A rank publishes `arrived` before it can leave or exit, so a look reads
// the counter again after `left` and the pid (LookAtPeer): a peer that
// finished the step and closed at once is seen as arrived, never as having
// closed "before" the step, however the waiter's reads interleave with it.
//
// Lifetime of the name: group rank 0 creates the segment, the others open
// it, and once Connect() saw every rank attached rank 0 unlinks the name,
// so nothing is left in /dev/shm however the processes end.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "collective/backend.h"
#include "common/mutex.h"
#include "common/workers.h"
#include "common/shm.h"
#include "ember/result.h"

namespace ember::collective {

struct ShmGroupOptions {
  std::string name;                     // segment name, "/..." (e.g. "/ember-<job>-c0-shm-<host>")
  int rank = 0, size = 1;               // within this host's group
  std::vector<std::string> rank_names;  // empty, or size entries naming each rank in errors,
                                        // e.g. "rank 1 (worker:1 on 10.0.0.2, pid 4711)"
  // Per-rank data buffer (two of them per rank), rounded up to 4 KiB; larger
  // calls run in chunks.  Only the creator's value counts.
  size_t buffer_bytes = 8 << 20;
  // Threads per rank for the copies and reductions of calls of at least
  // kParallelBytes (the caller's thread counts): 0 picks the host's cores
  // divided by the ranks on it, at most kMaxThreads (1 for a group of one);
  // 1 runs them on the calling thread alone.  A big host's memory bandwidth
  // needs several cores per rank when the ranks are few.
  int threads = 0;
};

namespace shm_group_internal {

// Slot::left: whether a rank is still in the group, and if not, why it left.
constexpr uint32_t kInGroup = 0, kLeftFailed = 1, kLeftClosed = 2;

// What a rank waiting for a peer to reach step `target` makes of one look.
enum class PeerSeen { kWaiting, kArrived, kLeftFailed, kLeftClosed, kGone };

// One look at a peer: arrived() is its step counter (acquire), left() its
// Slot::left (acquire), gone() whether its process is gone (kill(pid, 0)).
// A peer stores its counter before it leaves or exits, so the counter is read
// again after `left` and the pid: if the peer had left, or its process was
// gone, by then, that read shows whether it reached `target` first.  (Read
// only before them, the counter misses a peer that arrived and closed in
// between, and the waiter reports it as having closed before the step.)  The
// first read saves the system call when the peer is there.
template <typename Arrived, typename Left, typename Gone>
PeerSeen LookAtPeer(uint32_t target, Arrived&& arrived, Left&& left, Gone&& gone) {
  auto reached = [&] { return static_cast<int32_t>(arrived() - target) >= 0; };
  if (reached()) return PeerSeen::kArrived;
  const uint32_t why = left();
  const bool dead = why == kInGroup && gone();
  if (reached()) return PeerSeen::kArrived;
  if (why == kLeftClosed) return PeerSeen::kLeftClosed;
  if (why != kInGroup) return PeerSeen::kLeftFailed;
  return dead ? PeerSeen::kGone : PeerSeen::kWaiting;
}

}  // namespace shm_group_internal

class ShmGroup : public Backend {
 public:
  // Group rank 0: creates and initializes the segment.  InvalidArgument for
  // bad options (size outside 1..256, rank out of range, a name not
  // starting with '/', rank_names of the wrong length); AlreadyExists if the
  // name exists; IOError if it cannot be created.
  static Result<std::unique_ptr<ShmGroup>> Create(const ShmGroupOptions& options);
  // The other ranks, after rank 0's Create returned.  NotFound if there is
  // no such segment; InvalidArgument if it is not a group of options.size.
  static Result<std::unique_ptr<ShmGroup>> Open(const ShmGroupOptions& options);

  // Tells peers still waiting on this rank that it left (they fail at once
  // instead of at their deadline), and unmaps.
  ~ShmGroup() override;

  // Every rank, once: announces this rank and waits until every rank has
  // (DeadlineExceeded naming the missing ranks).  Then rank 0 removes the
  // segment's name.  Calls are valid only after Connect succeeded.
  Status Connect(Deadline deadline);

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const { return name_; }
  size_t buffer_bytes() const { return buffer_bytes_; }

  // Backend: see backend.h.  Not thread-safe among themselves (one call at a
  // time, as the Communicator guarantees); Abort() is thread-safe.
  Status Allreduce(const CallDesc& desc, void* data, Deadline deadline) override;
  Status Broadcast(const CallDesc& desc, void* data, Deadline deadline) override;
  Status Allgather(const CallDesc& desc, const void* in, std::span<const uint64_t> counts, void* out,
                   Deadline deadline) override;
  Status ReduceScatter(const CallDesc& desc, const void* in, void* out, Deadline deadline) override;
  Status Barrier(const CallDesc& desc, Deadline deadline) override;
  void Abort(const std::string& reason) override;

  // Allreduce chunks up to this many bytes take the one-step path (every
  // rank reduces everything); larger ones reduce-scatter + allgather.
  static constexpr size_t kSmallAllreduceBytes = 256 << 10;
  // Copies and reductions of fewer bytes run on the calling thread alone.
  static constexpr size_t kParallelBytes = 1 << 20;
  static constexpr int kMaxThreads = 8;
  // What options.threads == 0 picks for `size` ranks on a host of `cores`.
  static int AutoThreads(int size, unsigned cores);
  int threads() const { return workers_.threads(); }

 private:
  struct Header;
  struct Slot;
  struct Call;  // the call in progress: descriptor, deadline, extra check word

  ShmGroup(const ShmGroupOptions& options, SharedMemory shm, Mapping mapping, size_t buffer_bytes);
  static Result<std::unique_ptr<ShmGroup>> Attach(const ShmGroupOptions& options, bool create);

  std::string Describe(int rank) const;
  char* Buffer(int rank, uint32_t parity) const;
  uint32_t NextParity() const { return (step_ + 1) & 1u; }

  // Runs one call: the sticky error first, then `body`, recording its failure.
  template <typename Body>
  Status Run(const CallDesc& desc, Deadline deadline, uint64_t extra, Body body);
  // Steps 2 and 3 of the protocol (see top); on the call's first step also
  // publishes and checks the descriptors.
  Status Step(Call* call);
  Status WaitFor(int k, uint32_t target, const Call* call);
  // fn(lo, hi) over [0, count) elements of `es` bytes: at once on this thread
  // when small (or no workers), else in cache-line-aligned pieces over them.
  template <typename Fn>
  void ForPieces(size_t count, size_t es, Fn fn);
  // Copy and ReduceN over the workers when large.
  void ParallelCopy(char* dst, const char* src, size_t bytes);
  void ParallelReduce(DataType dtype, ReduceOp op, char* dst, const char* const* srcs, size_t count);
  // dst[x] = Buffer(owner of x, parity)[x] for x in [0, count) elements, where
  // `begin(k)` is where rank k's slice starts (allreduce's allgather half).
  template <typename Begin>
  void ParallelGatherSlices(char* dst, uint32_t parity, size_t es, size_t count, Begin begin);
  Status CheckDescriptors(const Call& call, uint32_t parity) const;
  Status AbortedByPeer() const;
  // Records `s` as the group's error unless one is recorded; marks this rank
  // as left so waiting peers fail at once.  Returns the recorded error.
  Status Fail(const Status& s);
  void WakeAll();

  const std::string name_;
  const int rank_;
  const int size_;
  const std::vector<std::string> rank_names_;
  const size_t buffer_bytes_;
  const int spin_;  // pause iterations before sleeping

  SharedMemory shm_;  // rank 0 owns the name until Connect() removes it
  Mapping mapping_;
  Header* header_;
  Slot* slots_;
  char* data_;

  // The calling thread's state (calls are never concurrent).
  uint32_t step_ = 0;  // last step this rank published
  bool in_step_ = false;  // step_ has not completed (yet, or it failed)
  bool connected_ = false;
  std::vector<const void*> srcs_;  // size_ source pointers for the reductions
  std::vector<const char*> slice_srcs_;  // size_ slice pointers (allreduce)
  Workers workers_;

  Mutex mu_;
  Status error_ GUARDED_BY(mu_);  // the first failure; sticky
  std::atomic<bool> failed_{false};  // error_ is set (read without the lock)
};

}  // namespace ember::collective
