// The parameter server (issue 21): the tensors one PS shard holds and the server-side update
// rules of asynchronous training (Shard); the server that serves a shard over the job's
// authenticated TCP transport (Server); and the worker's client, which cuts tensors over the
// shards (Client).  A Shard lives in one process (a ps node, or the driver's host).
//
// Two kinds of state, float32 only:
//   dense tensors  a flat array of `count` floats with a version (the number of updates
//                  applied); workers pull (values, version) and push an update based on the
//                  version they pulled, so the shard knows each update's staleness.
//   sparse tables  rows of `dim` floats by int64 id (embedding tables), each created on first
//                  touch from a deterministic initializer of (seed, id): the same row whichever
//                  shard, process or restart creates it.
//
// Update rules (what a push means, the seeds' async algorithms; docs/ps.md):
//   kAssign   w = v                                (set weights: a chief's initial values)
//   kAdd      w += v                               (DOWNPOUR / ADAG / Elephas / Hogwild deltas;
//                                                   with scale_by_staleness, DynSGD on deltas:
//                                                   v / (staleness + 1))
//   kSgd      w -= lr * g                          (gradients; with scale_by_staleness,
//                                                   DynSGD: g / (staleness + 1))
//   kAdam     Adam on pushed gradients (lr, beta1, beta2, epsilon), per tensor step count
//   kElastic  EASGD/AEASGD: the push is a worker's weights x; e = alpha * (x - w); w += e;
//             the reply carries e (the worker moves by -e)
// Staleness: an update whose base version is more than `staleness_bound` updates old is
// rejected (bound < 0: every update is taken) and counted; every taken update's staleness goes
// into the shard's histogram.
//
// Clocks (SSP / BSP, Ho et al. 2013): each worker ticks a clock per iteration (Shard::Clock);
// a worker at clock c waits until every live worker is at clock >= c - bound (bound 0: BSP;
// the first `warmup` clocks use bound 0, TensorSpark's synchronous warm-up).  Workers join by
// ticking; one that leaves (done, or its connection dropped: dead) is no longer waited for,
// and one that joins late starts at the slowest live worker's clock.  Shard 0 keeps the clocks.
//
// Thread-safe: every method may be called from any thread.  Dense tensors have a lock each
// (none with `hogwild`: kAdd and kSgd then race by design, as Hogwild does, and only those
// rules may set it); tables have one lock each.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ember/deadline.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::ps {

enum class Rule : uint32_t {
  kAssign = 0,
  kAdd = 1,
  kSgd = 2,
  kAdam = 3,
  kElastic = 4,
};
const char* RuleName(Rule rule);

struct RuleOptions {
  Rule rule = Rule::kSgd;
  float lr = 0.01f;
  float beta1 = 0.9f;       // kAdam
  float beta2 = 0.999f;     // kAdam
  float epsilon = 1e-7f;    // kAdam (Keras's default)
  float alpha = 0.1f;       // kElastic: the moving rate (dist-keras's AEASGD: rho * lr)
  bool scale_by_staleness = false;  // kSgd, kAdd: DynSGD (the update / (staleness + 1))
  int64_t staleness_bound = -1;     // < 0: none (fully asynchronous)
  bool hogwild = false;             // no lock (kAdd, kSgd only)
};

struct PullResult {
  std::vector<float> values;
  int64_t version = 0;
};

struct PushResult {
  bool applied = false;     // false: rejected as too stale
  int64_t version = 0;      // the tensor's version after the push
  int64_t staleness = 0;    // the shard's version minus the push's base version, when it arrived
  std::vector<float> reply;  // kElastic: the elastic difference e; empty otherwise
};

struct TableOptions {
  int dim = 0;               // floats per row, > 0
  uint64_t seed = 0;
  float init_scale = 0.05f;  // rows start uniform in [-init_scale, init_scale)
  Rule rule = Rule::kSgd;    // kSgd or kAdd
  float lr = 0.01f;
};

struct ShardStats {
  int64_t pushes_applied = 0;
  int64_t pushes_rejected = 0;           // older than their tensor's staleness bound
  std::vector<int64_t> staleness_histogram;  // [s] taken updates of staleness s; the last counts >= size-1
  int64_t rows = 0;                      // rows created over every table
};

// What a worker's tick saw (Shard::Clock).
struct ClockResult {
  int64_t clock = 0;      // the worker's clock now (a late joiner's is raised to the slowest's)
  int64_t min_clock = 0;  // the slowest live worker's clock when the wait ended
  int64_t waited_us = 0;  // how long the worker waited
};

class Shard {
 public:
  // `name` names the shard in errors (e.g. "ps:0").
  explicit Shard(std::string name);
  ~Shard();
  Shard(const Shard&) = delete;
  Shard& operator=(const Shard&) = delete;

  const std::string& name() const;

  // Creates tensor `tensor` with `initial` values.  Creating it again with the same count and
  // rule is OK and changes nothing (every worker may create; the first values win); another
  // count or rule is AlreadyExists naming both.  InvalidArgument: bad options (hogwild with a
  // rule other than kAdd/kSgd, an empty tensor, lr or alpha not finite).
  Status CreateDense(const std::string& tensor, std::span<const float> initial, const RuleOptions& options);
  // The values and version.  NotFound names the tensor and the shard.
  Result<PullResult> PullDense(const std::string& tensor) const;
  // Calls `read` with the values and versions of `tensors` (in that order), each tensor's lock
  // held (Hogwild's not) until it returns, so the values can be copied straight to where they
  // go (the shared-memory reply ring) with no copy in between.  NotFound, before `read`, names
  // a missing tensor.  `read` must not call the shard.
  using DenseReader =
      std::function<Status(std::span<const std::span<const float>> values, std::span<const int64_t> versions)>;
  Status ReadDense(std::span<const std::string> tensors, const DenseReader& read) const;
  // The tensor's element count.  NotFound names the tensor and the shard.
  Result<size_t> DenseCount(const std::string& tensor) const;
  // Applies `update` by the tensor's rule, based on `base_version` (what the pusher pulled).
  // InvalidArgument: a count that is not the tensor's (both named), a base version from the
  // future.  NotFound: no such tensor.
  Result<PushResult> PushDense(const std::string& tensor, std::span<const float> update, int64_t base_version);

  // Creates table `table`; again with equal options: OK; otherwise AlreadyExists.
  Status CreateTable(const std::string& table, const TableOptions& options);
  // The rows of `ids` (in order, dim floats each), creating missing ones.
  Result<std::vector<float>> PullRows(const std::string& table, std::span<const int64_t> ids);
  // Applies ids.size() rows of dim floats by the table's rule (a repeated id: each in turn).
  // InvalidArgument: update.size() != ids.size() * dim.
  Status PushRows(const std::string& table, std::span<const int64_t> ids, std::span<const float> update);

  ShardStats Stats() const;

  // Records `worker` at `clock` and waits until every live worker is at clock >= clock - bound
  // (bound < 0: no wait) and at least `workers` distinct workers have ticked, or `deadline`:
  // DeadlineExceeded naming the slowest worker and its clock (or the workers not yet seen).
  // A worker not live (new, or back after leaving) joins at max(clock, the slowest live
  // clock).  A clock below the worker's own is InvalidArgument.  Unavailable once StopWaits().
  // `owner` names who ticks (the server: the connection); Leave with an owner only removes a
  // worker that owner ticked last, so a dead worker's connection closing late cannot remove
  // the replacement that took its name.
  Result<ClockResult> Clock(const std::string& worker, int64_t clock, int64_t bound, int workers,
                            Deadline deadline, uint64_t owner = 0);
  // `worker` is no longer waited for (it ended, or `why`: its connection dropped).  Returns
  // whether it was live (and, with an owner != 0, last ticked by `owner`).
  bool Leave(const std::string& worker, const std::string& why = "", uint64_t owner = 0);
  // The live workers and their clocks, and the departed ones with why they left.
  std::map<std::string, int64_t> Clocks() const;
  std::map<std::string, std::string> Departed() const;
  // Every Clock wait returns Unavailable now and after (the server is closing).
  void StopWaits();

  // The shard's state as named blobs, one per tensor ("dense/<name>") and table
  // ("table/<name>"): values, versions, rule options, Adam's moments, every row.  Each blob is
  // taken under its tensor's lock (consistent per tensor, not across them: asynchronous
  // training has no global step to stop at).  For checkpoints (ember.ps.serve).
  std::map<std::string, std::string> Snapshot() const;
  // Replaces the shard's tensors and tables with those of `blobs` (from Snapshot).  Corruption
  // naming the blob and offset on malformed bytes; then nothing changes.
  Status Restore(const std::map<std::string, std::string>& blobs);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ServerOptions {
  std::string name = "ps:0";          // names the shard in errors and logs
  std::string bind_host = "0.0.0.0";
  int port = 0;                       // 0: a free port (Server::port())
  std::string secret;                 // the job's secret (>= 16 bytes): every peer proves it first
  size_t max_message_bytes = size_t{1} << 30;  // a larger request drops its connection
  Duration handshake_timeout{5000};
};

// Serves one Shard: each authenticated connection on its own thread, one request frame and one
// reply frame at a time (ps::Serve).  A malformed request is answered with Corruption and the
// connection kept; a frame over max_message_bytes, or of another type, drops the connection.
class Server {
 public:
  // IOError naming the address if it cannot bind; InvalidArgument for a short secret.
  static Result<std::unique_ptr<Server>> Start(const ServerOptions& options);
  ~Server();  // Close()s
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  int port() const;
  Shard& shard();
  // Stops accepting, shuts every connection down and joins their threads.  Idempotent.
  void Close();

 private:
  Server();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ClientOptions {
  std::vector<std::string> shards;    // "host:port" of shard 0, 1, ... (every worker lists them alike)
  std::string secret;
  std::string name = "worker";        // how the shards' logs and this client's errors name it
  Duration connect_timeout{60000};    // per shard, at Connect
  Duration timeout{60000};            // per call
  size_t max_message_bytes = size_t{1} << 30;
  // A shard on this host is reached through two shared-memory rings of this many bytes each
  // (its requests, this worker's replies; docs/ps.md "Shared memory"); 0: TCP only.  A message
  // larger than a ring goes over the connection.
  size_t shm_ring_bytes = size_t{32} << 20;
};

// Where a dense tensor of `count` elements lives: the shards and the contiguous range of the
// tensor each holds, in order.  Tensors of at least `split_at` elements are cut into
// near-equal ranges over every shard; smaller ones live whole on one shard picked by a hash
// of the name.  A pure function: every worker computes the same placement.
struct Slice {
  int shard = 0;
  size_t begin = 0, end = 0;
};
std::vector<Slice> Place(const std::string& tensor, size_t count, int shards, size_t split_at = 65536);

// The versions a pull saw, one per slice (Place's order); a push hands them back.
struct Versions {
  std::vector<int64_t> per_slice;
};

struct ClientPushResult {
  int applied = 0;                  // slices taken
  int rejected = 0;                 // slices too stale for their bound
  int64_t max_staleness = 0;
  std::vector<float> reply;         // kElastic: the elastic difference, whole tensor; else empty
  // Each slice's version after the push: what the pusher's values are now based on when it
  // applies `reply` itself (kElastic), with no pull.
  Versions versions;
};

// A worker's connections to every shard.  Requests to several shards go out together and their
// replies are read after (one round trip).  Thread-safe: calls are serialized.  Every call has
// `timeout`; an error names the shard (index and address), the tensor and the call.  A broken
// connection (the shard died) fails every later call naming that shard.
class Client {
 public:
  static Result<std::unique_ptr<Client>> Connect(const ClientOptions& options);
  ~Client();
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  int num_shards() const;
  // Whether shard `shard` is reached through shared memory (it is on this host).
  bool shared_memory(int shard) const;
  Status CreateDense(const std::string& tensor, std::span<const float> initial, const RuleOptions& rule);
  // Fills `out` (the tensor's count) and returns the versions it saw.
  Result<Versions> PullDense(const std::string& tensor, std::span<float> out);
  Result<ClientPushResult> PushDense(const std::string& tensor, std::span<const float> update,
                                     const Versions& base);
  // The same for several tensors in one round trip: one request per shard holding every slice
  // it has (a Keras model's variables in one exchange, not two round trips per variable).  A
  // push checks every tensor's name and size on a shard before applying any there.
  Result<std::vector<Versions>> PullDenseMany(const std::vector<std::string>& tensors,
                                              const std::vector<std::span<float>>& outs);
  Result<std::vector<ClientPushResult>> PushDenseMany(const std::vector<std::string>& tensors,
                                                      const std::vector<std::span<const float>>& updates,
                                                      const std::vector<Versions>& bases);
  // Tables live on every shard; row `id` on shard (splitmix64(id) % shards).
  Status CreateTable(const std::string& table, const TableOptions& options);
  // Fills `out` (ids.size() * dim floats, in ids' order).
  Status PullRows(const std::string& table, std::span<const int64_t> ids, int dim, std::span<float> out);
  Status PushRows(const std::string& table, std::span<const int64_t> ids, int dim, std::span<const float> update);
  // Every shard's stats, in shard order.
  Result<std::vector<ShardStats>> Stats();
  // SSP/BSP (shard 0 keeps the clocks): ticks this worker (options.name) to `clock` and waits
  // until the slowest live worker is within the bound: 0 while clock <= `warmup`, then
  // `staleness` (< 0: fully asynchronous, no wait).  `workers`: how many distinct workers
  // must have ticked before anyone passes (the job's worker count).  The wait has the call's
  // timeout; its error names the slowest worker.  Returns the clock to continue from (a late
  // joiner's is raised to the slowest live worker's).
  Result<ClockResult> Clock(int64_t clock, int64_t staleness, int64_t warmup, int workers);
  // This worker has ended: the others no longer wait for it.
  Status Leave();

 private:
  Client();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The shard of table row `id` among `shards`.
int RowShard(int64_t id, int shards);

// The initial value of element `j` of row `id` of a table with `seed` and `scale`: uniform in
// [-scale, scale), a pure function (splitmix64 of seed, id and j).
float InitialRowValue(uint64_t seed, int64_t id, int j, float scale);

}  // namespace ember::ps
