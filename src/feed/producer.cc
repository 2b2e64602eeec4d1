// Producer (training), SplitRows, and the driver's EndEpoch / EndFeed.
#include <algorithm>
#include <numeric>

#include "ember/feed.h"
#include "feed/codec.h"
#include "feed/link.h"

namespace ember::feed {

std::vector<int64_t> SplitRows(int64_t rows, std::span<const int64_t> sent, size_t first) {
  const size_t n = sent.size();
  const int64_t total = std::accumulate(sent.begin(), sent.end(), int64_t{0}) + rows;
  const int64_t base = total / static_cast<int64_t>(n);
  const int64_t extra = total % static_cast<int64_t>(n);
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  // Nodes already ahead first (they must stay ahead), then in turn from `first`.
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (sent[a] != sent[b]) return sent[a] > sent[b];
    return (a + n - first % n) % n < (b + n - first % n) % n;
  });
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) out[i] = base - sent[i];
  for (int64_t i = 0; i < extra; ++i) out[order[i]] += 1;
  return out;
}

size_t MaxBatchBytes(uint64_t ring_capacity, size_t max_message_bytes) {
  const size_t payload = std::min<size_t>(shm::Ring::MaxPayload(ring_capacity), max_message_bytes);
  return payload > kBatchHeaderBytes ? payload - kBatchHeaderBytes : 0;
}

// ---------------------------------------------------------------- Producer
class Producer::Impl {
 public:
  FeedOptions options;
  uint32_t partition = 0, epoch = 0, attempt = 0;
  std::vector<std::unique_ptr<Link>> links;
  std::vector<int64_t> sent;
  bool ended = false;

  Status CheckNode(size_t node) const {
    if (node >= links.size()) {
      return Status::InvalidArgument("node " + std::to_string(node) + " of a producer for " +
                                     std::to_string(links.size()) + " nodes");
    }
    return Status::OK();
  }

  Status CheckSize(size_t node, size_t ipc_bytes, int64_t rows) const {
    if (rows < 0) return Status::InvalidArgument("negative row count " + std::to_string(rows));
    const Link& link = *links[node];
    if (link.max_payload < kBatchHeaderBytes || ipc_bytes > link.max_payload - kBatchHeaderBytes) {
      return Status::InvalidArgument("a batch of " + std::to_string(rows) + " rows is " + std::to_string(ipc_bytes) +
                                     " bytes of Arrow IPC, more than the " +
                                     std::to_string(link.max_payload - std::min(link.max_payload, kBatchHeaderBytes)) +
                                     " one message to " + NodeText(link.node) + " may carry: send fewer rows");
    }
    return Status::OK();
  }
};

Producer::Producer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Producer::~Producer() { Close(); }

Result<std::unique_ptr<Producer>> Producer::Open(std::vector<NodeEndpoint> nodes, uint32_t partition, uint32_t epoch,
                                                 uint32_t attempt, const FeedOptions& options) {
  if (nodes.empty()) return Status::InvalidArgument("a feed producer needs at least one node");
  if (epoch == kInferenceEpoch) {
    return Status::InvalidArgument("epoch " + std::to_string(epoch) + " is reserved for inference");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->partition = partition;
  impl->epoch = epoch;
  impl->attempt = attempt;
  for (const NodeEndpoint& node : nodes) {
    EMBER_ASSIGN_OR_RAISE(std::unique_ptr<Link> link, Link::Open(node, options, /*may_be_gone=*/true));
    impl->links.push_back(std::move(link));
  }
  impl->sent.assign(nodes.size(), 0);
  return std::unique_ptr<Producer>(new Producer(std::move(impl)));
}

size_t Producer::num_nodes() const { return impl_->links.size(); }

std::vector<int64_t> Producer::Split(int64_t rows) const {
  return SplitRows(rows, impl_->sent, impl_->partition % impl_->links.size());
}

size_t Producer::MaxBatchBytes(size_t node) const {
  if (node >= impl_->links.size()) return 0;
  const size_t payload = impl_->links[node]->max_payload;
  return payload > kBatchHeaderBytes ? payload - kBatchHeaderBytes : 0;
}

Status Producer::SendBatch(size_t node, std::span<const uint8_t> ipc, int64_t rows) {
  EMBER_RETURN_NOT_OK(impl_->CheckNode(node));
  EMBER_RETURN_NOT_OK(impl_->CheckSize(node, ipc.size(), rows));
  impl_->sent[node] += rows;
  Link& link = *impl_->links[node];
  if (link.cancelled) return Status::OK();
  const BatchHeader h{impl_->partition, impl_->epoch, impl_->attempt, rows};
  return link.Write(FeedKind::kBatch, EncodeBatch(h, ipc), impl_->options);
}

Status Producer::SendBatchInPlace(size_t node, std::span<uint8_t> message, int64_t rows) {
  EMBER_RETURN_NOT_OK(impl_->CheckNode(node));
  if (message.size() < kBatchHeaderBytes) {
    return Status::InvalidArgument("SendBatchInPlace needs " + std::to_string(kBatchHeaderBytes) +
                                   " bytes of room before the IPC stream");
  }
  EMBER_RETURN_NOT_OK(impl_->CheckSize(node, message.size() - kBatchHeaderBytes, rows));
  impl_->sent[node] += rows;
  Link& link = *impl_->links[node];
  if (link.cancelled) return Status::OK();
  EncodeBatchHeader(BatchHeader{impl_->partition, impl_->epoch, impl_->attempt, rows}, message);
  return link.Write(FeedKind::kBatch, message, impl_->options);
}

Status Producer::SendBatchParts(size_t node, std::span<const std::span<const uint8_t>> ipc, int64_t rows) {
  EMBER_RETURN_NOT_OK(impl_->CheckNode(node));
  std::vector<std::span<const uint8_t>> parts;
  uint8_t header[kBatchHeaderBytes];
  EMBER_RETURN_NOT_OK(impl_->CheckSize(node, BatchParts(ipc, header, &parts), rows));
  impl_->sent[node] += rows;
  Link& link = *impl_->links[node];
  if (link.cancelled) return Status::OK();
  EncodeBatchHeader(BatchHeader{impl_->partition, impl_->epoch, impl_->attempt, rows}, header);
  return link.WriteParts(FeedKind::kBatch, parts, impl_->options);
}

Status Producer::EndPartition() {
  if (impl_->ended) return Status::InvalidArgument("EndPartition called twice");
  impl_->ended = true;
  const std::vector<uint8_t> end = EncodeEndPartition({impl_->partition, impl_->epoch, impl_->sent});
  for (auto& link : impl_->links) EMBER_RETURN_NOT_OK(link->Write(FeedKind::kEndPartition, end, impl_->options));
  // The partition counts as delivered (its Spark task ends, and then the epoch) only once every
  // message is in every node's ring: a TCP relay still draining must not let the next epoch's
  // rows, on another connection, overtake this one's.
  for (auto& link : impl_->links) EMBER_RETURN_NOT_OK(link->Flush(impl_->options));
  return Status::OK();
}

const std::vector<int64_t>& Producer::sent() const { return impl_->sent; }
bool Producer::gone(size_t node) const { return node < impl_->links.size() && impl_->links[node]->gone; }
bool Producer::cancelled(size_t node) const { return node < impl_->links.size() && impl_->links[node]->cancelled; }
bool Producer::all_cancelled() const {
  return std::all_of(impl_->links.begin(), impl_->links.end(), [](const auto& l) { return l->cancelled; });
}

void Producer::Close() {
  for (auto& link : impl_->links) {
    if (link->client) link->client->Close();
    if (link->ring) link->ring->Close();
  }
}

// ---------------------------------------------------------------- driver
namespace {

Result<std::vector<std::string>> TellNodes(const std::vector<NodeEndpoint>& nodes, FeedKind kind,
                                           std::span<const uint8_t> payload, const FeedOptions& options) {
  std::vector<std::string> unreachable(nodes.size());
  for (size_t k = 0; k < nodes.size(); ++k) {
    const NodeEndpoint& node = nodes[k];
    Result<std::unique_ptr<FeedClient>> client = FeedClient::Connect(
        node.host, node.port, options.secret, options.connect_timeout, options.max_message_bytes, options.idle_timeout);
    if (!client.ok()) {
      if (client.status().code() == StatusCode::kUnavailable) {
        unreachable[k] = client.status().message();
        continue;
      }
      return client.status().WithContext("telling " + NodeText(node) + " " + KindName(static_cast<uint32_t>(kind)));
    }
    Status st = (*client)->Write(kind, payload, Deadline::After(options.idle_timeout));
    if (st.ok()) st = (*client)->Flush(Deadline::After(options.idle_timeout));  // in the ring on return
    (*client)->Close();
    // Cancelled, Aborted, Unavailable, IOError: it terminated its feed, finished or is going
    // away (its launcher reports why).
    if (st.code() == StatusCode::kDeadlineExceeded) {
      return st.WithContext("telling " + NodeText(node) + " " + KindName(static_cast<uint32_t>(kind)));
    }
  }
  return unreachable;
}

}  // namespace

Result<std::vector<std::string>> EndEpoch(const std::vector<NodeEndpoint>& nodes, uint32_t epoch,
                                          uint32_t partitions, const FeedOptions& options) {
  return TellNodes(nodes, FeedKind::kEndEpoch, EncodeEndEpoch({epoch, partitions}), options);
}

Result<std::vector<std::string>> EndFeed(const std::vector<NodeEndpoint>& nodes, const FeedOptions& options) {
  return TellNodes(nodes, FeedKind::kEndFeed, {}, options);
}

Result<std::vector<NodeEpochState>> AwaitEpoch(const std::vector<NodeEndpoint>& nodes, uint32_t epoch,
                                               const FeedOptions& options) {
  using Clock = Deadline::Clock;
  constexpr Duration kAnswerGrace{10000};  // the server answers within ~1 s; a slow host gets more
  std::vector<NodeEpochState> out(nodes.size(), NodeEpochState::kBegun);
  for (size_t k = 0; k < nodes.size(); ++k) {
    const NodeEndpoint& node = nodes[k];
    Result<std::unique_ptr<FeedClient>> client = FeedClient::Connect(
        node.host, node.port, options.secret, options.connect_timeout, options.max_message_bytes, options.idle_timeout);
    if (!client.ok()) {
      if (client.status().code() != StatusCode::kUnavailable) {
        return client.status().WithContext("asking " + NodeText(node) + " whether it began epoch " +
                                           std::to_string(epoch));
      }
      out[k] = NodeEpochState::kGone;
      continue;
    }
    uint64_t last_read = 0;
    bool first = true;
    Clock::time_point progress_at = Clock::now();
    for (;;) {
      EpochStateMsg state;
      Status st = (*client)->AwaitEpoch(epoch, Deadline::After(kAnswerGrace), &state);
      if (st.code() == StatusCode::kCancelled) {
        out[k] = NodeEpochState::kTerminated;
        break;
      }
      if (st.code() == StatusCode::kDeadlineExceeded) {
        return st.WithContext("asking " + NodeText(node) + " whether it began epoch " + std::to_string(epoch));
      }
      if (!st.ok()) {  // Aborted, Unavailable, IOError: it finished or is going away (its launcher says why)
        out[k] = NodeEpochState::kGone;
        break;
      }
      if (state.begun) break;
      const Clock::time_point now = Clock::now();
      if (first || state.read_bytes != last_read) {
        first = false;
        last_read = state.read_bytes;
        progress_at = now;
      } else if (now - progress_at >= options.idle_timeout) {
        (*client)->Close();
        return Status::DeadlineExceeded(
            NodeText(node) + " has not begun training epoch " + std::to_string(epoch) + " and read nothing from its " +
            "feed for " + FormatDuration(options.idle_timeout) + "; is main_fun still reading its DataFeed "
            "(epoch_batches, to_tf_dataset, next_batch)? Raise feed_timeout if an epoch takes longer");
      }
    }
    (*client)->Close();
  }
  return out;
}

}  // namespace ember::feed
