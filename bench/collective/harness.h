// The allreduce benchmark's process harness, shared by the Ember and Gloo
// drivers (bench/allreduce.py runs them).  Nothing here is part of Ember.
//
// The harness process forks one process per rank (each optionally entering a
// network namespace first), then serves commands from stdin, one per line,
// answering each with one JSON line on stdout:
//
//   run <bytes> <warmup> <min_iters> <min_secs>
//       every rank: `warmup` verified allreduces (sum, in place, of the
//       harness's --dtype: float32 by default, bfloat16 or float16) of
//       bytes/sizeof(dtype) elements, then agree on an iteration count (the ranks' largest
//       warm-up median, through the contender's own max-allreduce) and time
//       max(min_iters, min_secs / that) verified allreduces one by one.
//       -> {"bytes":..,"iters":..,"median_s":<slowest rank's median>,"rank_median_s":[..]}
//   memcpy <bytes> <reps>      in the harness process: median GB/s of memcpy
//       -> {"memcpy_bytes":..,"gbps":..}
//   quit
//
// Buffers are refilled before every call (untimed) with rank-dependent small
// integers, x[i] = (rank+1) * (1 + i%13 + k%13) for call k, and every rank
// checks every element of every result (untimed): a contender that returns a
// wrong sum fails the run, it cannot post a time.  Any failure prints
// {"error": "..."} and the harness exits non-zero.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace bench {

// The element types a run can allreduce (--dtype).
enum class Dtype { kFloat32, kBFloat16, kFloat16 };

struct RankEnv {
  int rank = 0;
  int size = 1;
  std::string host = "127.0.0.1";  // this rank's address
  std::string tmpdir;              // private to this harness run, removed at exit
  std::string run_id;              // unique per harness run (pid based)
  bool tcp = false;                // --tcp: a contender's TCP-only variant
  std::string variant;             // --variant VALUE, contender specific
  Dtype dtype = Dtype::kFloat32;   // --dtype float32|bfloat16|float16
  int threads = 0;                 // --threads N: threads per rank, where a contender has them (0: its default)
};

// One rank's end of a contender.  Methods return "" on success, else an error message.
class Contender {
 public:
  virtual ~Contender() = default;
  // In place over `count` elements of `dtype` (16-bit ones as their bits):
  // sum, or max when `max`.  A contender without `dtype` returns an error.
  virtual std::string Allreduce(void* data, size_t count, Dtype dtype, bool max) = 0;
};

// Builds a rank's contender after fork (and after entering its namespace).
// Connects to the other ranks; nullptr with *error set on failure.
using ContenderFactory = std::function<std::unique_ptr<Contender>(const RankEnv&, std::string* error)>;

// Parses the harness flags, forks the ranks (each calls `factory`), serves
// stdin's commands; the process's exit code.  State made before the call
// (e.g. a shared mapping) is inherited by every rank.
int HarnessMain(int argc, char** argv, const char* name, ContenderFactory factory);

}  // namespace bench
