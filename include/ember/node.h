// A node of an Ember job, seen from inside: what the launcher told it and
// the services it may use.  Any executable can be a node:
//
//   ember.Cluster.run(spark, ["./my_trainer", "--lr=0.1"], num_executors=2, ...)
//
// starts ./my_trainer on every node.  The launcher (the node's Spark task)
// hands the process its context as one typed start-up message (docs/wire.md,
// "Node start-up") on an inherited pipe whose descriptor is named by the
// environment variable EMBER_STARTUP_FD; the job's secret therefore never
// appears in argv or the environment.  The process's stdin is /dev/null; its
// stdout and stderr lines reach the driver.  Exit status 0 means the node
// finished; anything else fails the job with the tail of its stderr.
//
//   int main(int argc, char** argv) {
//     auto node = ember::Node::FromEnvironment();
//     if (!node.ok()) { fprintf(stderr, "%s\n", node.status().ToString().c_str()); return 1; }
//     (*node)->Report({{"step", 1}, {"loss", 0.5}});
//   }
//
// Python nodes (main_fun) receive the same message; ember.Context is built
// from it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ember/collective.h"
#include "ember/coordinator.h"
#include "ember/feed.h"
#include "ember/result.h"
#include "ember/status.h"
#include "ember/summary.h"

namespace ember {

// How data reaches the nodes; the numbers are those of Python's ember.InputMode.
enum class InputMode : uint8_t {
  kTensorFlow = 0,  // the node reads its own data
  kSpark = 1,       // the driver feeds a DataFrame/RDD through the node's feed ring
};

// Everything the launcher tells a node.  A plain value type.
struct NodeContext {
  std::string job_id;       // unique id of the job (also EMBER_JOB_ID in the environment)
  int executor_id = 0;      // 0..num_nodes-1, the node's Spark partition
  std::string job_name;     // role: "ps", "chief", "master", "evaluator" or "worker"
  int task_index = 0;       // index within the role
  // {role: ["host:port", ...]} for every node of the job, each list ordered by task index.
  ClusterSpec cluster_spec;  // ember/roles.h
  // Where the node's own listeners (collectives, feed server, TensorBoard)
  // bind: the job's spark.ember.node.bind, else the node's address in
  // cluster_spec; "0.0.0.0" for every interface (docs/network.md).  Empty
  // means the node's address in cluster_spec.
  std::string bind_host;
  std::string coordinator_host;
  int coordinator_port = 0;
  std::string secret;       // the job's secret: authenticates the node to the coordinator
  Duration connect_timeout{10000};  // how long a connection to the coordinator may take
  InputMode input_mode = InputMode::kTensorFlow;
  // Name of this node's feed ring (InputMode::kSpark, training roles only); empty if not fed.
  std::string feed_ring;
  std::string default_fs;   // the driver's Hadoop fs.defaultFS, e.g. "file:///"
  // The NameNode's WebHDFS address, "host:port" (the driver's Hadoop
  // dfs.namenode.http-address), when default_fs is hdfs://; else empty.
  std::string hdfs_http_address;
  std::string working_dir;  // the driver's working directory
  std::string log_dir;      // fully qualified log directory (TensorBoard); empty if none
  // Where a Python node writes its traceback when main_fun fails; a binary may
  // write its own error text there too (the launcher prefers it over stderr).
  std::string traceback_path;
  // The node's GPUs, as its process's CUDA_VISIBLE_DEVICES lists them (the
  // addresses Spark assigned its task, ember/gpu.h VisibleDevices); inside the
  // process they are CUDA devices 0..gpus.size()-1.  Empty: no GPU was asked for.
  std::vector<std::string> gpus;
  // Opaque to the core: a Python node's cloudpickled (main_fun, args); empty for a binary.
  std::string payload;

  // Number of training nodes (chief + master + worker), as TFoS counts
  // workers: the size of the job's collectives (TrainingSize, ember/roles.h).
  int num_workers() const;
  // This node's rank among the training nodes (TrainingRank, ember/roles.h);
  // nullopt for a ps or evaluator node.  The start-up message carries both
  // numbers too, for programs that do not link the core.
  std::optional<int> training_rank() const;

  bool operator==(const NodeContext&) const = default;
};

// The options of the communicator of `context`'s training nodes (see
// Node::OpenCommunicator): `options` with rank, size, host, name, bind_host,
// secret and prefix filled from the context.  InvalidArgument, naming the
// node, if it is not a training node or the cluster spec does not list it.
Result<collective::CommunicatorOptions> NodeCommunicatorOptions(
    const NodeContext& context, collective::CommunicatorOptions options = {});

// The environment variable naming the start-up pipe's descriptor.
inline constexpr const char kStartupFdEnv[] = "EMBER_STARTUP_FD";

namespace node {

// The start-up message for `context` (docs/wire.md, "Node start-up"), what
// a launcher writes to the pipe; its training rank and size are computed
// from its cluster spec.  InvalidArgument if a field cannot be represented
// (negative ids or timeout, a port outside 0..65535, a string or list over
// 4 GiB).
Result<std::string> EncodeStartup(const NodeContext& context);

// Parses a whole message.  Corruption (naming the field and offset) for bad
// magic, truncation, trailing bytes, out-of-range values, unsorted roles or
// a training rank/size that disagrees with the cluster spec;
// InvalidArgument for another version, naming both.
Result<NodeContext> DecodeStartup(std::string_view bytes);

}  // namespace node

// Reads one start-up message from `fd` until end of file and decodes it.
// Does not close `fd`.  IOError if the read fails; Corruption or
// InvalidArgument (a different version) if the bytes are not a message.
Result<NodeContext> ReadNodeContext(int fd);

// The running node: its context and a connection to the job's coordinator.
// Thread-safe: every method may be called from any thread.
class Node {
 public:
  // For a process started by the launcher: reads the start-up message from
  // the descriptor named by EMBER_STARTUP_FD (closing it, and removing the
  // variable from the environment so child processes do not see it), then
  // Open()s the node.  InvalidArgument if the variable is unset (the program
  // was not started by Cluster.run) or malformed; otherwise as ReadNodeContext
  // and Open.
  static Result<std::unique_ptr<Node>> FromEnvironment();

  // Connects to the coordinator named in `context` (within
  // context.connect_timeout) as a secondary connection of the node's executor
  // id.  Unavailable or Unauthenticated as CoordinatorClient::Connect.
  static Result<std::unique_ptr<Node>> Open(NodeContext context);

  ~Node();
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const NodeContext& context() const { return context_; }
  // "worker:1": the node's name in error messages.
  std::string label() const;

  // Progress for the driver's live display (step, loss, samples, ...).
  // One-way: OK means it was sent.
  Status Report(const std::map<std::string, double>& metrics);

  // The job's key/value store (shared by every node and the driver).
  // KvGet waits up to `timeout` for `key` to be set (DeadlineExceeded naming
  // the key); Aborted if the job aborts meanwhile.
  Status KvSet(const std::string& key, const std::string& value);
  Result<std::string> KvGet(const std::string& key, Duration timeout);

  // Waits until every node of the job has entered barrier `name`.  Each name
  // completes once.  DeadlineExceeded names the nodes missing; Aborted if the
  // job aborts.
  Status Barrier(const std::string& name, Duration timeout);

  // This node's end of InputMode::kSpark: a consumer of its feed ring, which
  // cluster.train()/cluster.inference() on the driver fill (ember/feed.h).
  // options.node is set to label() when left at its default.  Call once: a
  // ring has one consumer.  InvalidArgument naming the reason if this node is
  // not fed (the job is not InputMode::kSpark, or its role is ps/evaluator);
  // otherwise as feed::Consumer::Open.  Defined in node_feed.cc, so that a
  // program not reading the feed does not link the feed.
  Result<std::unique_ptr<feed::Consumer>> OpenFeed(feed::ConsumerOptions options = {}) const;

  // The job's training nodes (chief/master/worker) as one collective
  // communicator (ember/collective.h), the same one a Python node's
  // ctx.communicator() opens: rank = TrainingRank (ember/roles.h), size =
  // num_workers(), ranks meet in the coordinator's key/value store (over a
  // connection of the communicator's own) under the prefix
  // "ember-<job_id>-c0", each rank published at its host in the cluster
  // spec.  From `options` only transport, timeouts and buffer sizes are
  // used; rank, size, host, name, bind_host, secret and prefix come from the
  // context.  Every training node must call it (Create meets the others
  // within options.connect_timeout); call it once per node: a second
  // communicator would meet under the same prefix.  The caller owns the
  // communicator.  InvalidArgument if this node is a ps or evaluator
  // node; otherwise as CoordinatorClient::Connect and Communicator::Create.
  // Defined in node_collective.cc.
  Result<std::unique_ptr<collective::Communicator>> OpenCommunicator(
      collective::CommunicatorOptions options = {}) const;

  // A TensorBoard event writer (ember/summary.h) in this node's own
  // directory, summary::NodeLogDir(log_dir, job_name, task_index), e.g.
  // "hdfs://nn:8020/logs/worker_1": the log dir is resolved with the job's
  // default_fs and the NameNode's HTTP address, so it may be on HDFS.  The
  // caller owns the writer and must Close() it.  InvalidArgument if the job
  // has no log dir (Cluster.run(..., log_dir=...)); otherwise as
  // summary::EventWriter::Open.  Defined in node_summary.cc.
  Result<std::unique_ptr<summary::EventWriter>> OpenSummaryWriter(
      summary::EventWriterOptions options = {}) const;

 private:
  Node(NodeContext context, std::unique_ptr<CoordinatorClient> client);
  const NodeContext context_;
  const std::unique_ptr<CoordinatorClient> client_;
};

}  // namespace ember
