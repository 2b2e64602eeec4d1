#include "feed/feed_ring.h"

namespace ember::feed {

shm::RingWords FeedRingWords() {
  shm::RingWords w;
  w.ring = "feed ring";
  w.message = "feed message";
  w.consumer = "the node";
  w.producer = "another feeding task";
  w.not_found = " (has the node started?)";
  w.too_large = "; send smaller batches";
  w.stalled = "is not consuming its feed; raise feed_timeout or check the node's log";
  w.terminated = "the node terminated its feed";
  w.closed = "the node closed its feed";
  return w;
}

Result<std::unique_ptr<shm::Ring>> OpenFeedRing(const std::string& name) {
  return shm::Ring::Open(name, FeedRingWords());
}

Result<std::unique_ptr<shm::Ring>> CreateFeedRing(const std::string& name, size_t capacity) {
  return shm::Ring::Create(name, capacity, FeedRingWords());
}

}  // namespace ember::feed
