// The data feed of InputMode.SPARK: Spark tasks (producers) push record
// batches to the training nodes (consumers); for inference the nodes answer
// with one result row per input row, which flow back to the task that sent
// the inputs.  This header is the whole contract; docs/wire.md gives the
// bytes of every message and docs/architecture.md the invariants.
//
// Record batches are opaque Arrow IPC streams (schema + one record batch),
// made and read by the caller (pyarrow in Ember's Python layer).  Every
// message header carries the batch's row count, so the feed never parses
// Arrow.
//
// Transport: a node on the producer's host is reached through its
// shared-memory ring, a node on another host through its authenticated TCP
// feed server, which relays into the same ring.  Both carry the same
// messages.
//
// The invariants this layer keeps, in one place:
//  * Training: every feeding task splits its partition over all nodes,
//    keeping the rows each node got from the partition within one of each
//    other (SplitRows), and ends it with an end-of-partition marker to every
//    node carrying every node's count.  The driver ends an epoch by telling
//    every node how many partitions it had (EndEpoch).  A Consumer therefore
//    knows, before the epoch ends, a lower bound on the smallest epoch total
//    over all nodes, exact at the end, and hands out exactly that many rows:
//    every node yields the same number of batches per epoch.
//  * A retried feeding task (Spark task attempt) sends its partition again;
//    its rows are counted apart and the partition is credited with its
//    largest attempt.
//  * Validation (Cluster.train's validation_data): after training epoch e
//    the driver feeds a validation epoch numbered ValidationEpoch(e), under
//    the same equal-rows rule.  A node reads it with
//    BeginEpoch(EpochKind::kValidation); a node that reads only training
//    epochs skips validation epochs (their rows are dropped).
//  * Pipelining: the driver feeds training epoch e+1 only once every node
//    began epoch e (AwaitEpoch), so it runs at most one epoch ahead of the
//    slowest node, and an early stop wastes at most one fed epoch.
//  * Inference: a partition goes wholly to one node under the ring's session
//    lock; the node must answer exactly one result row per input row, in
//    order; both ends check it and name node and partition when it fails.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ember/deadline.h"
#include "ember/result.h"

namespace ember::device {
class Runtime;
}  // namespace ember::device

namespace ember::feed {

// Training epochs are numbered from 0 and stay below kValidationEpochBit;
// the validation epoch fed after training epoch e is e | kValidationEpochBit.
inline constexpr uint32_t kValidationEpochBit = 1u << 30;
inline constexpr uint32_t ValidationEpoch(uint32_t training_epoch) { return training_epoch | kValidationEpochBit; }
inline constexpr bool IsTrainingEpoch(uint32_t epoch) { return (epoch & kValidationEpochBit) == 0; }

enum class EpochKind {
  kTraining = 0,
  kValidation = 1,
};

// How a producer reaches a node.
enum class Transport {
  kAuto = 0,  // the node's ring when it exists on this host, else TCP
  kShm = 1,   // the ring only (NotFound if it is not on this host)
  kTcp = 2,   // the node's TCP feed server only
};

// A producer's options.  Value type.
struct FeedOptions {
  // The job's secret (>= 16 bytes), proved to a node's TCP feed server.
  std::string secret;
  Transport transport = Transport::kAuto;
  // Reaching a node: opening its ring, or connecting to its feed server
  // including the authenticated handshake.
  Duration connect_timeout{30000};
  // The longest any wait may make no progress: a write blocked on a full
  // ring or socket, the session lock while the node consumes nothing, a
  // result that does not come.  Sent to the node's feed server in the
  // connection's kHello, which applies it to its side of the connection.
  Duration idle_timeout{600000};
  // Largest message accepted from or sent to a feed server.
  size_t max_message_bytes = size_t{64} << 20;
  // Inference over shared memory: the size of the result ring a producer
  // creates (named after the node's ring, see ResultRingPrefix).
  size_t result_ring_bytes = size_t{32} << 20;
};

// Result rings (inference) are named after the node they belong to:
// "<ResultRingPrefix(node_ring)>-...", both those a feeding task on the
// node's host creates and those the node's TCP feed server creates for
// remote tasks.  `node_ring` is NodeEndpoint::ring ("/<job>-<executor>").
std::string ResultRingPrefix(std::string_view node_ring);

// Unlinks the names of the result rings of the node whose ring is
// `node_ring`: a name is normally dropped by the node once both ends have
// the ring mapped, so what is left belongs to partitions whose node ended
// first and whose feeding task was killed (Spark SIGKILLs the Python workers
// of a failed stage's tasks).  Mappings stay valid.  Call once the node has
// ended (its launcher does).  IOError naming /dev/shm if it cannot be listed.
Status RemoveResultRings(std::string_view node_ring);

// The name of the shm ring of node `executor_id` of job `job_id`:
// "/<job_id>-<executor_id>".  Its result rings start with ResultRingPrefix
// of it.
std::string NodeRingName(std::string_view job_id, int64_t executor_id);

// Where a node's feed is.  Value type; the launcher publishes it in the
// coordinator's key/value store as Encode()'s bytes.
struct NodeEndpoint {
  int64_t executor_id = 0;
  std::string name;       // "worker:0": what errors call the node
  std::string ring;       // its shm ring, "/<job>-<executor>"
  std::string host;       // its feed server
  int port = 0;
  uint64_t ring_capacity = uint64_t{64} << 20;  // bounds one message (see MaxBatchBytes)

  // Versioned binary form (docs/wire.md, "Feed endpoint").
  std::string Encode() const;
  // Corruption naming the field on malformed bytes.
  static Result<NodeEndpoint> Decode(std::string_view bytes);

  // "worker:0 (10.0.0.5)"
  std::string Describe() const;
  bool operator==(const NodeEndpoint&) const = default;
};

// How the next `rows` rows of a partition go to the nodes: out[k] rows to
// node k.  `sent[k]` is what node k already got from this partition; with
// the result every node stays within one row of the others.  The odd rows go
// first to the nodes already ahead, then in turn from node `first`
// (partition % nodes, so odd rows spread over the nodes).  `sent` non-empty.
std::vector<int64_t> SplitRows(int64_t rows, std::span<const int64_t> sent, size_t first);

// Largest Arrow IPC stream one batch message may carry to a node whose
// ring has `ring_capacity` bytes, or over a connection limited to
// `max_message_bytes`.
size_t MaxBatchBytes(uint64_t ring_capacity, size_t max_message_bytes);

// Bytes a caller reserves in front of an IPC stream for SendBatchInPlace.
inline constexpr size_t kBatchHeaderBytes = 24;

// One feeding task's partition of one training epoch, to every node.
//
// Thread-compatible: one thread at a time.
class Producer {
 public:
  // Reaches every node (options.transport).  A node that cannot be reached
  // at all (no ring here, its feed server refuses) has ended, as TFoS
  // allows: it is marked gone() and skipped; the driver checks with the
  // coordinator that it did end.  Unauthenticated and InvalidArgument fail.
  static Result<std::unique_ptr<Producer>> Open(std::vector<NodeEndpoint> nodes, uint32_t partition,
                                                uint32_t epoch, uint32_t attempt, const FeedOptions& options);
  ~Producer();  // Close()s
  Producer(const Producer&) = delete;
  Producer& operator=(const Producer&) = delete;

  size_t num_nodes() const;
  // SplitRows(rows, sent(), partition % num_nodes()); records nothing.
  std::vector<int64_t> Split(int64_t rows) const;
  // Largest IPC stream SendBatch accepts for `node`.
  size_t MaxBatchBytes(size_t node) const;

  // Sends `rows` rows (an IPC stream) to `node` and counts them in sent().
  // InvalidArgument, with nothing sent, if `ipc` exceeds MaxBatchBytes(node):
  // send fewer rows.  A node that terminated its feed (cancelled()) or is
  // gone is skipped quietly, its rows still counted.  Aborted with the
  // node's reason if it failed; DeadlineExceeded after idle_timeout without
  // progress; errors name the node.
  Status SendBatch(size_t node, std::span<const uint8_t> ipc, int64_t rows);
  // As SendBatch, without copying: `message` is kBatchHeaderBytes of room,
  // which this call fills in, then the IPC stream.
  Status SendBatchInPlace(size_t node, std::span<uint8_t> message, int64_t rows);
  // As SendBatch, the IPC stream given as consecutive parts (what an Arrow
  // IPC writer emits: small metadata pieces and the record batch's own
  // buffers).  The parts are copied once, straight into the node's ring
  // (over TCP, joined into one frame); the caller keeps them.
  Status SendBatchParts(size_t node, std::span<const std::span<const uint8_t>> ipc, int64_t rows);

  // Ends the partition at every node with every node's count.  Call once,
  // after the last batch.
  Status EndPartition();

  // Rows sent (counted) to each node.
  const std::vector<int64_t>& sent() const;
  bool gone(size_t node) const;       // could not be reached at Open
  bool cancelled(size_t node) const;  // terminated its feed, or gone
  bool all_cancelled() const;         // every node: the rest may be skipped

  // Releases rings and connections.  Idempotent.
  void Close();

  class Impl;

 private:
  explicit Producer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// A result message of an inference partition: `rows` result rows as an
// Arrow IPC stream.  The bytes are shared-owned, so callers may keep them.
struct ResultBatch {
  std::shared_ptr<const std::vector<uint8_t>> message;
  size_t ipc_offset = 0;  // the IPC stream is message[ipc_offset:]
  int64_t rows = 0;
  std::span<const uint8_t> ipc() const {
    return std::span<const uint8_t>(*message).subspan(ipc_offset);
  }
};

// One feeding task's inference partition: every row goes to one node, whose
// answers come back in input order.
//
// Thread-safety: Begin, SendBatch(InPlace|Parts), End and ReleaseSession on one
// thread (the ring's session lock is a robust mutex owned by a thread);
// NextResult on another thread at the same time; Close from any thread,
// waking a blocked NextResult.
class InferenceProducer {
 public:
  // Reaches the node (options.transport); over shared memory also creates
  // the result ring.  Unavailable naming the node if it cannot be reached.
  static Result<std::unique_ptr<InferenceProducer>> Open(const NodeEndpoint& node, uint32_t partition,
                                                         const FeedOptions& options);
  ~InferenceProducer();  // Close()s
  InferenceProducer(const InferenceProducer&) = delete;
  InferenceProducer& operator=(const InferenceProducer&) = delete;

  size_t MaxBatchBytes() const;

  // Takes the node's session (waiting while another task holds it and the
  // node consumes) and opens the partition.
  Status Begin();
  // As Producer::SendBatch; the rows count towards the answers required.
  Status SendBatch(std::span<const uint8_t> ipc, int64_t rows);
  Status SendBatchInPlace(std::span<uint8_t> message, int64_t rows);
  Status SendBatchParts(std::span<const std::span<const uint8_t>> ipc, int64_t rows);
  // Ends the partition and releases the session.
  Status End();
  // Releases the session if held (after a failure).  Idempotent.
  void ReleaseSession();

  // The next result batch, or std::nullopt once the node answered every
  // row sent (its end-of-results count checked).  Errors name node and
  // partition: InvalidArgument if the node answered more rows than it was
  // sent, or ended with a different count, or reported it could not answer
  // (its error text); Aborted with the node's reason if it failed;
  // DeadlineExceeded if nothing came for idle_timeout.  Notices the node's
  // failure within ~100 ms while waiting.
  Result<std::optional<ResultBatch>> NextResult();

  int64_t rows_sent() const;
  int64_t rows_answered() const;

  // Aborts the result ring (a node writing results is told the task is
  // gone), drops the connection.  Idempotent.
  void Close();

  class Impl;

 private:
  explicit InferenceProducer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// What FeedHost::Start needs.  Value type.
struct FeedHostOptions {
  std::string job_id;        // the ring is NodeRingName(job_id, executor_id)
  int64_t executor_id = 0;
  std::string name;          // the node, as errors call it ("executor 3", "worker:0")
  std::string host;          // where producers on other hosts reach it (the endpoint's host)
  std::string bind_host = "0.0.0.0";  // the address its feed server listens on
  std::string secret;        // the job's secret (>= 16 bytes)
  uint64_t ring_bytes = uint64_t{64} << 20;
  // How long the feed server lets a ring write, a session wait or a socket
  // write make no progress, until a producer's own (FeedOptions) arrives.
  Duration idle_timeout{600000};
};

// A training node's feed, hosted by its launcher for the node's life: the
// shm ring the node reads (Consumer::Open(endpoint().ring)) and the TCP
// feed server that relays producers on other hosts into it.  The launcher
// outlives the node, so when the node ends, producers learn at once: its
// failure (Abort) makes their writes fail with its reason, a normal end
// (Terminate) makes them stop quietly.
//
// Thread-safe.
class FeedHost {
 public:
  // Creates the ring and starts the server on a free port.  AlreadyExists
  // if the ring exists; InvalidArgument for bad options; IOError if the
  // address cannot be bound.
  static Result<std::unique_ptr<FeedHost>> Start(const FeedHostOptions& options);
  ~FeedHost();  // Close()s
  FeedHost(const FeedHost&) = delete;
  FeedHost& operator=(const FeedHost&) = delete;

  // What producers need (publish endpoint().Encode()).
  const NodeEndpoint& endpoint() const;

  // The node failed: blocked and later writes fail with Aborted(`reason`).
  void Abort(const std::string& reason);
  // The node ended its feed: queued data is dropped, producers stop quietly.
  void Terminate();

  // Stops the server (dropping its connections), removes the ring and what
  // is left of the node's result rings (RemoveResultRings).  Idempotent.
  void Close();

  struct Impl;

 private:
  explicit FeedHost(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Driver: tells every node that `epoch` had `partitions` partitions
// (EndEpoch) or that no more data will come (EndFeed), over TCP so it works
// wherever the driver runs.  Returns, per node, why it could not be reached
// ("" if it was told; the caller decides whether it ended): the connection
// failed, or its server kept closing the handshake; a node that terminated
// its feed or is going away while being told counts as told.
// Unauthenticated fails.
Result<std::vector<std::string>> EndEpoch(const std::vector<NodeEndpoint>& nodes, uint32_t epoch,
                                          uint32_t partitions, const FeedOptions& options);
Result<std::vector<std::string>> EndFeed(const std::vector<NodeEndpoint>& nodes, const FeedOptions& options);

// Driver: waits until every node has begun training epoch `epoch` (or a
// later one), ended its feed, or gone away; one answer per node.  A node
// that is still reading (a long epoch) is waited for as long as it reads;
// DeadlineExceeded, naming the node and epoch, once it has read nothing
// for options.idle_timeout.
enum class NodeEpochState {
  kBegun = 0,
  kTerminated = 1,  // the node ended its feed (DataFeed.terminate)
  kGone = 2,        // unreachable or going away: the caller asks how it ended
};
Result<std::vector<NodeEpochState>> AwaitEpoch(const std::vector<NodeEndpoint>& nodes, uint32_t epoch,
                                               const FeedOptions& options);

// The node's end.  Value type for its options.
struct ConsumerOptions {
  std::string node = "node";  // "worker:0", for errors
  // False for inference: rows stop at partition ends and every row handed
  // out must be answered.
  bool train_mode = true;
  // How long a read may wait for the next message before DeadlineExceeded.
  Duration read_timeout{3600000};
  // How long a result write may make no progress (a full result ring).
  Duration result_timeout{600000};
};

// Rows handed out: rows [offset, offset + rows) of the record batch in a
// received batch message.  The bytes are shared-owned: `message` stays valid
// and unchanged while any copy of `owner` lives, so a caller may keep (and
// wrap without copying) them past later calls, and drop them on any thread.
// The owner is a lease on the node's ring (the bytes read in place) or a
// buffer; holding many leases costs the node one copy of them, not a stall.
struct RowRange {
  std::shared_ptr<const void> owner;
  std::span<const uint8_t> message;  // the whole batch message
  size_t ipc_offset = 0;  // the IPC stream is message[ipc_offset:]
  uint64_t message_id = 0;  // the same for every range of one message
  int64_t offset = 0;
  int64_t rows = 0;
  uint32_t partition = 0;
  uint32_t epoch = 0;
  std::span<const uint8_t> ipc() const { return message.subspan(ipc_offset); }
};

// Reads a node's ring: decodes every message, keeps partition sessions, the
// equal-rows bound of every epoch and the exactly-one-result rule.
//
// Thread-compatible, with one exception: one thread at a time reads (every
// method but Terminate), and Terminate() may be called from any thread at
// any time, also while another thread is inside a read (TFoS programs read
// in tf.data's generator thread while the main thread terminates the feed).
class Consumer {
 public:
  // Opens the node's ring `ring_name` (made by the node's launcher).
  static Result<std::unique_ptr<Consumer>> Open(const std::string& ring_name, ConsumerOptions options);
  ~Consumer();  // Close()s
  Consumer(const Consumer&) = delete;
  Consumer& operator=(const Consumer&) = delete;

  const ConsumerOptions& options() const;
  void set_train_mode(bool train_mode);
  void set_read_timeout(Duration timeout);

  // Up to `max_rows` rows in arrival order, in as few ranges as messages
  // allow; rows of validation epochs are skipped (dropped).  Fewer only at the end of the feed, after terminate, or (with
  // `stop_at_partition`, inference) at a partition's end.  Empty at the end
  // of the feed.  DeadlineExceeded naming the node after read_timeout
  // without a message.  Inference: InvalidArgument if an earlier partition
  // whose rows were all handed out still lacks answers (its task is told).
  Result<std::vector<RowRange>> Next(int64_t max_rows, bool stop_at_partition);

  // Starts the next training epoch this node has news of (rows or a
  // partition end: a node may get no rows of a tiny epoch yet steps through
  // it like its peers).  Whatever remains of the epoch started before is
  // dropped.  std::nullopt at the end of the feed or after Terminate.
  // kTraining skips validation epochs on the way (their rows are dropped);
  // kValidation wants the validation epoch fed after the training epoch
  // just read: InvalidArgument naming the epoch if the next one is a
  // training epoch (no validation_data was given to the driver's train()).
  // Beginning training epoch e tells the driver (AwaitEpoch) it may feed e+1.
  Result<std::optional<uint32_t>> BeginEpoch(EpochKind kind = EpochKind::kTraining);
  // The next `batch_size` rows of the epoch BeginEpoch started, handed out
  // only once provably every node has them; with !drop_remainder a last
  // smaller batch.  Empty at the epoch's end (every node then handed out the
  // same total), at the end of the feed or after Terminate.
  Result<std::vector<RowRange>> NextEpochBatch(int64_t batch_size, bool drop_remainder);
  // As NextEpochBatch, up to `max_batches` batches in one call: waits for
  // the first as NextEpochBatch does, then adds as many whole batches as
  // every node provably has already; the ranges cover a multiple of
  // `batch_size` rows, or only the epoch's last smaller batch.  The caller
  // cuts them (one call per run of batches instead of one per batch).
  Result<std::vector<RowRange>> NextEpochBatches(int64_t batch_size, int64_t max_batches, bool drop_remainder);
  // The first unread row of the next epoch, reading ahead; std::nullopt at
  // the end of the feed.  Hands nothing out.
  Result<std::optional<RowRange>> PeekRow();

  // True once terminated (at once after Terminate() on any thread), or the
  // feed ended and every row was read.
  bool ShouldStop() const;

  // Inference: how the next `rows` results divide over the partitions
  // awaiting answers, oldest first.  InvalidArgument if fewer rows await
  // (the newest partition's task is told, and fails with the same text).
  Result<std::vector<int64_t>> PlanResults(int64_t rows);
  // Answers the next `rows` rows of the oldest partition awaiting answers
  // with `ipc` (an IPC stream of exactly `rows` rows); ends the partition
  // (its end-of-results count) once fully answered.  InvalidArgument if
  // `rows` exceeds what it awaits (call PlanResults first).  If the task
  // that fed the partition is gone, the answers are dropped quietly.
  Status SendResults(std::span<const uint8_t> ipc, int64_t rows);

  // Stops the feed early (TFoS DataFeed.terminate): queued data is dropped and
  // producers stop quietly (their writes, and the driver's AwaitEpoch, see
  // Cancelled / kTerminated).  Any thread, without waiting for a read in
  // progress on another: unless that read already has all it asked for, it
  // ends as at the end of the feed, woken if it was blocked on the empty
  // ring (Next: the rows it had taken, maybe none; NextEpochBatch(es): no
  // rows; BeginEpoch, PeekRow: std::nullopt), and every later read does so
  // at once.  Terminate itself only flags the Consumer and terminates the
  // ring; the reading thread drops its queued messages on its next read.
  // Rows already handed out stay valid.  Idempotent.
  void Terminate();
  // Releases the ring and result rings.  Idempotent.
  void Close();

  // Page-locks, with `runtime` (CUDA's cudaHostRegister), the memory that
  // handed-out rows point into, so copies of them to a GPU run straight at
  // the bus's speed, asynchronously, with no staging copy (the rows were
  // written there by Spark's tasks: they land in page-locked memory).  Stays
  // in force for later reads until UnlockRows.  The caller's promise: it
  // keeps the rows (their RowRange owners) until every copy from them
  // finished; released rows go back to producers.  Before page-locked memory
  // is given back -- UnlockRows, a read that revokes held leases (their pages
  // become private copies), the last lease of a view dropped -- the device is
  // synchronized, so copies still running from held rows end first.  Where
  // the runtime refuses, the rows stay pageable (logged once); where the
  // reader keeps rows so long that reads keep revoking (over 4 times), page-
  // locking stops until the next PageLockRows (logged).  The reading thread.
  Status PageLockRows(std::shared_ptr<device::Runtime> runtime);
  void UnlockRows();

  class Impl;

 private:
  explicit Consumer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::feed
