// Link: a producer's way to one node, its shm::Ring (same host) or a
// FeedClient to its feed server (other hosts).  Internal to src/feed.
#pragma once

#include <memory>
#include <span>
#include <string>

#include "ember/deadline.h"
#include "ember/feed.h"
#include "feed/codec.h"
#include "feed/feed_client.h"
#include "transport/shm/ring.h"

namespace ember::feed {

struct Link {
  NodeEndpoint node;
  std::unique_ptr<shm::Ring> ring;      // set when the node's ring is on this host
  std::unique_ptr<FeedClient> client;   // else this
  bool gone = false;       // could not be reached at all
  bool cancelled = false;  // the node terminated its feed (or is gone): writes are skipped
  size_t max_payload = 0;  // largest message payload to this node

  bool local() const { return ring != nullptr; }

  // Reaches `node`.  With `may_be_gone`, a node that cannot be reached at
  // all is returned gone() instead of failing.
  static Result<std::unique_ptr<Link>> Open(const NodeEndpoint& node, const FeedOptions& options, bool may_be_gone);

  // Writes one message within idle_timeout.  Cancelled (the node terminated
  // its feed) marks the link cancelled and returns OK; skipped once
  // cancelled.  Other errors name the node.
  Status Write(FeedKind kind, std::span<const uint8_t> payload, const FeedOptions& options);
  // As Write, the payload in consecutive parts: copied straight into the
  // ring (Ring::WriteParts); over TCP joined into one frame first.
  Status WriteParts(FeedKind kind, std::span<const std::span<const uint8_t>> parts, const FeedOptions& options);

  // Over TCP: waits until the feed server has put every message written so
  // far into the node's ring (FeedClient::Flush); a no-op for a ring, whose
  // writes are in place when they return.  Errors as Write.
  Status Flush(const FeedOptions& options);

  // Wakes blocked calls (a client's socket); leaves the ring mapped.
  void Interrupt();
};

// "node worker:0 (10.0.0.5)"
inline std::string NodeText(const NodeEndpoint& node) { return "node " + node.Describe(); }

}  // namespace ember::feed
