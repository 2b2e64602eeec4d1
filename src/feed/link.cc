#include "feed/link.h"

#include <algorithm>
#include <vector>

#include "feed/feed_ring.h"

namespace ember::feed {

Result<std::unique_ptr<Link>> Link::Open(const NodeEndpoint& node, const FeedOptions& options, bool may_be_gone) {
  auto link = std::make_unique<Link>();
  link->node = node;
  if (options.transport != Transport::kTcp) {
    Result<std::unique_ptr<shm::Ring>> ring = OpenFeedRing(node.ring);
    if (ring.ok()) {
      link->ring = ring.MoveValueUnsafe();
    } else if (ring.status().code() != StatusCode::kNotFound || options.transport == Transport::kShm) {
      return ring.status().WithContext("feeding " + NodeText(node));
    }
  }
  if (link->ring == nullptr) {
    Result<std::unique_ptr<FeedClient>> client =
        FeedClient::Connect(node.host, node.port, options.secret, options.connect_timeout, options.max_message_bytes,
                            options.idle_timeout);
    if (client.ok()) {
      link->client = client.MoveValueUnsafe();
    } else if (client.status().code() == StatusCode::kUnavailable && may_be_gone) {
      link->gone = link->cancelled = true;
    } else {
      return client.status().WithContext("feeding " + NodeText(node));
    }
  }
  const uint64_t capacity = link->ring ? link->ring->capacity() : node.ring_capacity;
  link->max_payload = std::min<size_t>(shm::Ring::MaxPayload(capacity), options.max_message_bytes);
  return link;
}

Status Link::Write(FeedKind kind, std::span<const uint8_t> payload, const FeedOptions& options) {
  const std::span<const uint8_t> parts[1] = {payload};
  return WriteParts(kind, parts, options);
}

Status Link::WriteParts(FeedKind kind, std::span<const std::span<const uint8_t>> parts, const FeedOptions& options) {
  if (cancelled) return Status::OK();
  const Deadline deadline = Deadline::After(options.idle_timeout);
  Status st;
  if (ring) {
    st = ring->WriteParts(static_cast<uint32_t>(kind), parts, deadline);
  } else if (parts.size() == 1) {
    st = client->Write(kind, parts[0], deadline);
  } else {
    std::vector<uint8_t> joined;
    size_t size = 0;
    for (const auto& part : parts) size += part.size();
    joined.reserve(size);
    for (const auto& part : parts) joined.insert(joined.end(), part.begin(), part.end());
    st = client->Write(kind, joined, deadline);
  }
  if (st.code() == StatusCode::kCancelled) {
    cancelled = true;
    return Status::OK();
  }
  if (!st.ok()) return st.WithContext("feeding " + NodeText(node));
  return st;
}

Status Link::Flush(const FeedOptions& options) {
  if (cancelled || !client) return Status::OK();
  Status st = client->Flush(Deadline::After(options.idle_timeout));
  if (st.code() == StatusCode::kCancelled) {
    cancelled = true;
    return Status::OK();
  }
  if (!st.ok()) return st.WithContext("feeding " + NodeText(node));
  return st;
}

void Link::Interrupt() {
  if (client) client->Close();
}

}  // namespace ember::feed
