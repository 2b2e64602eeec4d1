// InferenceProducer: one partition to one node, its answers back, checked.
#include <dirent.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <mutex>
#include <random>
#include <string>
#include <vector>

#include "common/thread_annotations.h"
#include "ember/feed.h"
#include "feed/codec.h"
#include "feed/feed_ring.h"
#include "feed/link.h"

namespace ember::feed {
namespace {

// While waiting for results over shared memory, the node's health is checked
// this often (the node's launcher aborts its ring when it fails).
constexpr Duration kHealthTick{100};

std::atomic<uint64_t> g_result_rings{0};

std::string ResultRingName(const NodeEndpoint& node, uint32_t partition) {
  static const uint32_t salt = std::random_device{}();
  return ResultRingPrefix(node.ring) + "-r" + std::to_string(partition) + "-" + std::to_string(getpid()) + "-" +
         std::to_string(salt) + "-" + std::to_string(g_result_rings++);
}

// A kError frame's text from a feed server reads "<StatusCode name>: <message>"
// (its own failure: the node died, a timeout); a node's own error is plain text.
Status ServerErrorStatus(const std::string& text) {
  for (int c = 1; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    const std::string prefix = std::string(StatusCodeName(static_cast<StatusCode>(c))) + ": ";
    if (text.rfind(prefix, 0) == 0) return Status(static_cast<StatusCode>(c), text.substr(prefix.size()));
  }
  return Status::OK();
}

}  // namespace

std::string ResultRingPrefix(std::string_view node_ring) { return std::string(node_ring) + "-results"; }

Status RemoveResultRings(std::string_view node_ring) {
  // POSIX shared memory names live in /dev/shm on Linux, without the "/".
  std::string prefix = ResultRingPrefix(node_ring);
  if (!prefix.empty() && prefix[0] == '/') prefix.erase(0, 1);
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return Status::FromErrno(errno, "listing /dev/shm for result rings of " + std::string(node_ring));
  std::vector<std::string> names;
  while (const dirent* e = readdir(dir)) {
    const std::string_view name = e->d_name;
    if (name.substr(0, prefix.size()) == prefix) names.emplace_back(name);
  }
  closedir(dir);
  for (const std::string& name : names) shm_unlink(("/" + name).c_str());  // gone already: fine
  return Status::OK();
}

class InferenceProducer::Impl {
 public:
  FeedOptions options;
  uint32_t partition = 0;
  std::unique_ptr<Link> link;
  std::unique_ptr<shm::Ring> results;  // shm only: the ring the node answers into
  std::atomic<int64_t> sent{0};
  std::atomic<int64_t> answered{0};
  std::atomic<bool> end_sent{false};
  std::atomic<bool> closed{false};
  bool session_held = false;  // writer thread only
  bool done = false;          // reader thread only

  std::string Where() const { return "inference: " + NodeText(link->node) + ", partition " + std::to_string(partition); }

  Status Mismatch(int64_t node_total) const {
    return Status::InvalidArgument(Where() + " answered " + std::to_string(node_total) + " rows but was sent " +
                                   std::to_string(sent.load()) + ": exactly one result per input row is required");
  }

  Status Send(std::span<const uint8_t> payload, FeedKind kind) {
    const std::span<const uint8_t> parts[1] = {payload};
    return Send(parts, kind);
  }
  Status Send(std::span<const std::span<const uint8_t>> parts, FeedKind kind) {
    if (closed) return Status::Aborted(Where() + ": the feeding task closed the partition");
    Status st = link->WriteParts(kind, parts, options);
    if (st.ok() && link->cancelled) {
      return Status::Cancelled(Where() + ": the node terminated its feed before answering");
    }
    return st;
  }

  Status CheckSize(size_t ipc_bytes, int64_t rows) const {
    if (rows < 0) return Status::InvalidArgument("negative row count " + std::to_string(rows));
    if (link->max_payload < kBatchHeaderBytes || ipc_bytes > link->max_payload - kBatchHeaderBytes) {
      return Status::InvalidArgument("a batch of " + std::to_string(rows) + " rows is " + std::to_string(ipc_bytes) +
                                     " bytes of Arrow IPC, more than one message to " + NodeText(link->node) +
                                     " may carry: send fewer rows");
    }
    return Status::OK();
  }

  Status ReadMessage(uint32_t* kind, std::vector<uint8_t>* payload);
};

InferenceProducer::InferenceProducer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

InferenceProducer::~InferenceProducer() {
  Close();
  if (impl_->results) impl_->results->Close();
  if (impl_->link->ring) impl_->link->ring->Close();
}

Result<std::unique_ptr<InferenceProducer>> InferenceProducer::Open(const NodeEndpoint& node, uint32_t partition,
                                                                   const FeedOptions& options) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->partition = partition;
  Result<std::unique_ptr<Link>> link = Link::Open(node, options, /*may_be_gone=*/false);
  if (!link.ok()) {
    return link.status().WithContext("inference of partition " + std::to_string(partition) + " cannot reach " +
                                     NodeText(node));
  }
  impl->link = link.MoveValueUnsafe();
  if (impl->link->local()) {
    EMBER_ASSIGN_OR_RAISE(impl->results, CreateFeedRing(ResultRingName(impl->link->node, partition), options.result_ring_bytes));
  }
  return std::unique_ptr<InferenceProducer>(new InferenceProducer(std::move(impl)));
}

size_t InferenceProducer::MaxBatchBytes() const {
  const size_t payload = impl_->link->max_payload;
  return payload > kBatchHeaderBytes ? payload - kBatchHeaderBytes : 0;
}

Status InferenceProducer::Begin() {
  Impl& s = *impl_;
  if (s.link->local()) {
    Status st = s.link->ring->LockSession(s.options.idle_timeout);
    if (!st.ok()) return st.WithContext(s.Where());
    s.session_held = true;
  }
  BeginPartition begin;
  begin.partition = s.partition;
  begin.epoch = kInferenceEpoch;
  begin.flags = kBeginWantsResults;
  if (s.results) begin.result_ring = s.results->name();
  return s.Send(EncodeBeginPartition(begin), FeedKind::kBeginPartition);
}

Status InferenceProducer::SendBatch(std::span<const uint8_t> ipc, int64_t rows) {
  EMBER_RETURN_NOT_OK(impl_->CheckSize(ipc.size(), rows));
  impl_->sent += rows;  // before the node can answer them
  return impl_->Send(EncodeBatch({impl_->partition, kInferenceEpoch, 0, rows}, ipc), FeedKind::kBatch);
}

Status InferenceProducer::SendBatchInPlace(std::span<uint8_t> message, int64_t rows) {
  if (message.size() < kBatchHeaderBytes) {
    return Status::InvalidArgument("SendBatchInPlace needs " + std::to_string(kBatchHeaderBytes) +
                                   " bytes of room before the IPC stream");
  }
  EMBER_RETURN_NOT_OK(impl_->CheckSize(message.size() - kBatchHeaderBytes, rows));
  impl_->sent += rows;
  EncodeBatchHeader({impl_->partition, kInferenceEpoch, 0, rows}, message);
  return impl_->Send(message, FeedKind::kBatch);
}

Status InferenceProducer::SendBatchParts(std::span<const std::span<const uint8_t>> ipc, int64_t rows) {
  std::vector<std::span<const uint8_t>> parts;
  uint8_t header[kBatchHeaderBytes];
  EMBER_RETURN_NOT_OK(impl_->CheckSize(BatchParts(ipc, header, &parts), rows));
  impl_->sent += rows;
  EncodeBatchHeader({impl_->partition, kInferenceEpoch, 0, rows}, header);
  return impl_->Send(parts, FeedKind::kBatch);
}

Status InferenceProducer::End() {
  Impl& s = *impl_;
  s.end_sent = true;  // before the node can see the end and answer it
  Status st = s.Send(EncodeEndPartition({s.partition, kInferenceEpoch, {s.sent.load()}}), FeedKind::kEndPartition);
  ReleaseSession();
  return st;
}

void InferenceProducer::ReleaseSession() {
  if (impl_->session_held) {
    impl_->link->ring->UnlockSession();
    impl_->session_held = false;
  }
}

Status InferenceProducer::Impl::ReadMessage(uint32_t* kind, std::vector<uint8_t>* payload) {
  const Deadline idle = Deadline::After(options.idle_timeout);
  if (!results) {
    FeedKind k{};
    Status st = link->client->Read(&k, payload, idle);
    *kind = static_cast<uint32_t>(k);
    return st;
  }
  for (;;) {
    Status st = results->Read(kind, payload, std::min(idle, Deadline::After(kHealthTick)));
    if (st.code() != StatusCode::kDeadlineExceeded) return st;
    // The node answers only while it lives: its launcher aborts its ring when it fails.
    Status health = link->ring->Health();
    if (health.code() == StatusCode::kCancelled) {
      return Status::Cancelled("the node terminated its feed before answering every row");
    }
    EMBER_RETURN_NOT_OK(health);
    if (idle.expired()) {
      return Status::DeadlineExceeded("no results for " + FormatDuration(options.idle_timeout) +
                                      " (FeedOptions.idle_timeout, Python's feed_timeout)");
    }
  }
}

Result<std::optional<ResultBatch>> InferenceProducer::NextResult() {
  Impl& s = *impl_;
  if (s.done) return std::optional<ResultBatch>();
  if (s.closed) return Status::Aborted(s.Where() + ": the feeding task closed the partition");
  uint32_t kind = 0;
  auto payload = std::make_shared<std::vector<uint8_t>>();
  Status st = s.ReadMessage(&kind, payload.get());
  if (!st.ok()) return st.WithContext(s.Where());
  switch (static_cast<FeedKind>(kind)) {
    case FeedKind::kResults: {
      Result<int64_t> rows = DecodeResults(*payload);
      if (!rows.ok()) return rows.status().WithContext(s.Where());
      const int64_t answered = s.answered += *rows;
      if (answered > s.sent.load()) return s.Mismatch(answered);
      ResultBatch out;
      out.rows = *rows;
      out.ipc_offset = kResultsHeaderBytes;
      out.message = std::move(payload);
      return std::optional<ResultBatch>(std::move(out));
    }
    case FeedKind::kEndResults: {
      Result<int64_t> total = DecodeEndResults(*payload);
      if (!total.ok()) return total.status().WithContext(s.Where());
      if (!s.end_sent || *total != s.answered.load() || *total != s.sent.load()) {
        return s.Mismatch(std::max(*total, s.answered.load()));
      }
      s.done = true;
      return std::optional<ResultBatch>();
    }
    case FeedKind::kError: {
      const std::string text(AsChars(*payload));
      if (!s.results) {  // over TCP the feed server's own failures come this way too
        Status server = ServerErrorStatus(text);
        if (!server.ok()) return server.WithContext(s.Where());
      }
      return Status::InvalidArgument(s.Where() + ": " + text);
    }
    default:
      return Status::Corruption(s.Where() + ": the node sent a message of kind " + std::to_string(kind) + " (" +
                                KindName(kind) + ") among its results");
  }
}

int64_t InferenceProducer::rows_sent() const { return impl_->sent.load(); }
int64_t InferenceProducer::rows_answered() const { return impl_->answered.load(); }

void InferenceProducer::Close() {
  if (impl_->closed.exchange(true)) return;
  if (impl_->results) impl_->results->Abort("the feeding task stopped reading results");
  impl_->link->Interrupt();
}

}  // namespace ember::feed
