// The parameter server's shard (issue 21): the tensors one PS shard holds and the server-side
// update rules of asynchronous training.  A Shard lives in one process (a ps node, or the
// driver's host); a server serves it over the job's authenticated transport (next), and
// workers push and pull through a client that cuts tensors over the shards.
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
//   kAdd      w += v                               (DOWNPOUR / Elephas / Hogwild deltas)
//   kSgd      w -= lr * g                          (gradients; with scale_by_staleness,
//                                                   DynSGD: g / (staleness + 1))
//   kAdam     Adam on pushed gradients (lr, beta1, beta2, epsilon), per tensor step count
//   kElastic  EASGD/AEASGD: the push is a worker's weights x; e = alpha * (x - w); w += e;
//             the reply carries e (the worker moves by -e)
// Staleness: an update whose base version is more than `staleness_bound` updates old is
// rejected (bound < 0: every update is taken) and counted; every taken update's staleness goes
// into the shard's histogram.
//
// Thread-safe: every method may be called from any thread.  Dense tensors have a lock each
// (none with `hogwild`: kAdd and kSgd then race by design, as Hogwild does, and only those
// rules may set it); tables have one lock each.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

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
  bool scale_by_staleness = false;  // kSgd: DynSGD
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

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The initial value of element `j` of row `id` of a table with `seed` and `scale`: uniform in
// [-scale, scale), a pure function (splitmix64 of seed, id and j).
float InitialRowValue(uint64_t seed, int64_t id, int j, float scale);

}  // namespace ember::ps
