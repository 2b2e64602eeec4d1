// Ember's collectives: allreduce, broadcast, allgather, reduce-scatter and
// barrier over the training nodes of a job, for synchronous data-parallel
// training (the Keras optimizer wrapper and the PyTorch hooks sit on these).
//
// A Communicator joins `size` ranks.  Ranks meet through a Store (the
// coordinator's key/value store in a job; an in-memory one in tests), where
// each publishes its host and the port of its collective listener.  Ranks
// that share a host reduce through shared memory; hosts are joined by a
// chunked, pipelined TCP ring between one leader per host, every connection
// authenticated with the job's secret (transport/tcp/handshake.h).  Which
// algorithm a call takes is internal and chosen by size (docs/architecture.md).
//
//   CommunicatorOptions o;
//   o.rank = 1; o.size = 4; o.host = "10.0.0.2"; o.secret = job_secret;
//   ASSIGN_OR_RAISE(auto comm, Communicator::Create(o, store));
//   std::vector<float> grads = ...;
//   RETURN_NOT_OK(comm->Allreduce(grads.data(), grads.size(), DataType::kFloat32,
//                                 ReduceOp::kAverage));
//
// Every rank must make the same calls in the same order with the same
// sizes, types and ops (allgather sizes may differ).  A call that does not
// match is detected and fails on every rank with InvalidArgument naming the
// ranks and both calls, never a wrong sum or a hang.  A rank that dies or
// stalls makes every other rank's call fail within its timeout, naming the
// rank (its index, host and pid); the communicator is then broken: every
// later call returns the same error.
//
// Results are bitwise identical on every rank (each element is reduced in
// rank order by one rank, then copied), so replicas stay in sync.
// bfloat16 and float16 are reduced in float32 and rounded once.
//
// Thread-safety: calls on one Communicator are issued in one order; the
// blocking calls and the *Async calls may be made from any thread, and they
// run in the order they were made.  Abort() may be called at any time.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ember/deadline.h"
#include "ember/device.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember {

class CoordinatorClient;  // ember/coordinator.h

namespace collective {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat64 = 1,
  kBFloat16 = 2,
  kFloat16 = 3,
  kInt32 = 4,
  kInt64 = 5,
};

// Bytes per element; 0 for a value outside the enum.
size_t SizeOf(DataType dtype);
// "float32", "bfloat16", ...
const char* DataTypeName(DataType dtype);

enum class ReduceOp : uint8_t {
  kSum = 0,
  kAverage = 1,  // sum / size; integers truncate toward zero (C division)
  kMin = 2,
  kMax = 3,
};
const char* ReduceOpName(ReduceOp op);

// Where ranks meet.  Gloo's rendezvous Store: Set a key once, Get waits for
// a key.  Implementations are thread-safe.
class Store {
 public:
  virtual ~Store() = default;
  virtual Status Set(const std::string& key, const std::string& value) = 0;
  // Waits until `key` is set.  DeadlineExceeded naming the key after
  // `timeout`; Aborted if the job is aborted while waiting.
  virtual Result<std::string> Get(const std::string& key, Duration timeout) = 0;
};

// A Store in this process (N ranks as N threads in tests).
std::shared_ptr<Store> NewInMemoryStore();

// The job's store: the coordinator's key/value store reached through
// `client` (a node's own connection).  Keys are set once per job.
std::shared_ptr<Store> NewCoordinatorStore(std::shared_ptr<CoordinatorClient> client);

// NCCL's calls, as the Communicator uses them between the distinct GPUs of
// one host: loaded at run time (LoadNccl), never linked; tests substitute a
// fake.  A comm is NCCL's ncclComm_t.  Calls queue work on `stream` and
// return before it ran (NCCL's contract); thread-safe as NCCL is.
class Nccl {
 public:
  virtual ~Nccl() = default;
  virtual std::string Describe() const = 0;  // "NCCL 2.27.3 (libnccl.so.2)"
  // A new ncclUniqueId, as bytes (rank 0 makes it; every rank inits with it).
  virtual Result<std::string> UniqueId() = 0;
  // Joins the communicator of `size` ranks named by `id`; blocks until every
  // rank joined.  Runs on the calling thread's current device.
  virtual Result<void*> InitRank(const std::string& id, int size, int rank) = 0;
  virtual Status Allreduce(void* comm, void* data, size_t count, DataType dtype, ReduceOp op,
                           device::Stream stream) = 0;
  virtual Status Broadcast(void* comm, void* data, size_t count, DataType dtype, int root,
                           device::Stream stream) = 0;
  // An error NCCL found asynchronously (a peer gone, a network failure), or OK.
  virtual Status AsyncError(void* comm) = 0;
  // Ends `comm`'s work in flight and frees it (ncclCommAbort).
  virtual void Abort(void* comm) = 0;
};

// libnccl, loaded now from the first of `libraries` that loads (one the
// process already loaded first, e.g. PyTorch's).  NotFound, naming what was
// tried, where none loads.
Result<std::shared_ptr<Nccl>> LoadNccl(const std::vector<std::string>& libraries = {"libnccl.so.2"});

enum class Transport : uint8_t {
  kAuto = 0,  // shared memory between ranks on one host, TCP between hosts
  kTcp = 1,   // TCP ring between every rank, even on one host (benchmarks, tests)
};

struct CommunicatorOptions {
  int rank = 0;
  int size = 1;
  // The address other hosts reach this rank at; ranks with equal `host`
  // share a machine (and shared memory).  Also names the rank in errors.
  std::string host = "127.0.0.1";
  // Words naming this rank in errors besides its index, e.g. "worker:1".
  std::string name;
  std::string bind_host = "0.0.0.0";  // where the TCP listener binds (port chosen by the OS)
  std::string secret;                 // the job's secret, at least 16 bytes
  // Keys in the Store and shared-memory names start with this; unique per
  // communicator on a host (e.g. "ember-<job id>-c0").
  std::string prefix = "ember-collective";
  Transport transport = Transport::kAuto;
  Duration connect_timeout{60000};  // Create(): meeting the other ranks
  Duration timeout{300000};         // default for each call (CallOptions)
  // Per-rank shared-memory buffer, bytes (rounded to 4 KiB); calls larger
  // than this run in chunks.
  size_t shm_buffer_bytes = 8 << 20;
  // Threads per rank for the shared-memory copies and reductions of calls of
  // 1 MiB and more (the calling thread counts): 0 = the cores this process
  // may use divided by the ranks on its host, at most 8; 1 = none.
  int shm_threads = 0;
  // TCP ring: bytes per pipelined chunk.
  size_t tcp_chunk_bytes = 256 << 10;
  // Calls on accelerator memory (the *On calls) stage the buffer through two
  // page-locked host chunks of this many bytes, the copies of one chunk
  // overlapping the host collective on the next.  Every rank must use the
  // same value (the chunks are calls of their own).
  size_t device_chunk_bytes = 4 << 20;
  // The accelerator runtime; null: the CUDA runtime, loaded (ember/device.h
  // LoadCuda with `cuda`) at the first call on CUDA memory.
  std::shared_ptr<device::Runtime> device_runtime;
  device::CudaOptions cuda;
  // Calls on CUDA memory use NCCL instead of staging when every rank is on
  // one host, each on a GPU of its own, and every rank loads NCCL (decided
  // once per device, at its first call, the same on every rank).  False:
  // always stage.  `nccl` substitutes NCCL (tests); null: LoadNccl(nccl_libraries).
  bool use_nccl = true;
  std::shared_ptr<Nccl> nccl;
  std::vector<std::string> nccl_libraries = {"libnccl.so.2"};
};

struct CallOptions {
  // How long the call may take; zero means CommunicatorOptions::timeout.
  Duration timeout{0};
};

// A call in flight (the *Async methods).  Wait() may be called once, from
// any thread; destroying a Work that was not waited for waits for it.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the call ended; its status.
  virtual Status Wait() = 0;
  // True once the call ended (Wait() would not block).
  virtual bool Done() const = 0;
};

class Communicator {
 public:
  // Meets the other ranks through `store` and connects to them (within
  // options.connect_timeout).  InvalidArgument for bad options (rank out of
  // range, short secret, duplicate ranks); DeadlineExceeded naming the ranks
  // that did not show up.
  static Result<std::unique_ptr<Communicator>> Create(const CommunicatorOptions& options,
                                                      std::shared_ptr<Store> store);
  // Aborts calls still in flight ("communicator closed") and releases
  // sockets and shared memory.
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "rank 1 (worker:1 on 10.0.0.2, pid 4711)"
  virtual std::string Describe(int rank) const = 0;

  // In place over `count` elements at `data`.
  virtual Status Allreduce(void* data, size_t count, DataType dtype, ReduceOp op,
                           CallOptions options = {}) = 0;
  // Several buffers of one dtype reduced as one fused call (one round of
  // synchronization): the way to reduce a model's many small gradients.
  virtual Status AllreduceFused(std::span<const std::span<std::byte>> buffers, DataType dtype,
                                ReduceOp op, CallOptions options = {}) = 0;
  // `count` elements of rank `root`'s `data` land in every rank's `data`.
  virtual Status Broadcast(void* data, size_t count, DataType dtype, int root,
                           CallOptions options = {}) = 0;
  // Every rank gives `count` elements; `out` receives size() * count
  // elements in rank order.
  virtual Status Allgather(const void* in, size_t count, void* out, DataType dtype,
                           CallOptions options = {}) = 0;
  // Ranks may give different counts: `out` is resized to the concatenation
  // in rank order, `counts` (if not null) to each rank's count.
  virtual Status AllgatherV(const void* in, size_t count, DataType dtype, std::vector<std::byte>* out,
                            std::vector<uint64_t>* counts, CallOptions options = {}) = 0;
  // `in` holds size() * count elements; rank r's `out` receives the
  // reduction of block r (count elements).
  virtual Status ReduceScatter(const void* in, void* out, size_t count, DataType dtype, ReduceOp op,
                               CallOptions options = {}) = 0;
  virtual Status Barrier(CallOptions options = {}) = 0;

  // Asynchronous twins: the call is queued (run in issue order on the
  // communicator's thread); buffers must stay valid until Wait() returns.
  virtual std::unique_ptr<Work> AllreduceAsync(void* data, size_t count, DataType dtype, ReduceOp op,
                                               CallOptions options = {}) = 0;
  virtual std::unique_ptr<Work> BroadcastAsync(void* data, size_t count, DataType dtype, int root,
                                               CallOptions options = {}) = 0;

  // The same calls on a buffer in `device`'s memory.  Host memory takes the
  // calls above.  CUDA memory is staged through page-locked host memory
  // (CommunicatorOptions::device_chunk_bytes), with the same contract,
  // deadline and results as a host buffer.  The buffer must be ready (the
  // streams that wrote it synchronized); it holds the result when the call
  // returns.  Every rank must pass the same kind of memory to a call (a
  // mismatch fails as a mismatched call).  A rank whose runtime cannot be
  // loaded or fails breaks the communicator, so every rank's call fails
  // naming it (NotFound or IOError on that rank).
  virtual Status AllreduceOn(device::Device device, void* data, size_t count, DataType dtype, ReduceOp op,
                             CallOptions options = {}) = 0;
  virtual Status BroadcastOn(device::Device device, void* data, size_t count, DataType dtype, int root,
                             CallOptions options = {}) = 0;
  virtual std::unique_ptr<Work> AllreduceOnAsync(device::Device device, void* data, size_t count, DataType dtype,
                                                 ReduceOp op, CallOptions options = {}) = 0;

  // Breaks the communicator: calls in flight and later calls on every rank
  // fail with Aborted carrying `reason` (other ranks learn it through the
  // transports, naming this rank).  Idempotent.
  virtual void Abort(const std::string& reason) = 0;
};

}  // namespace collective
}  // namespace ember
