// The feed's shared-memory rings (transport/shm/ring.h) and the words their
// errors speak: a ring knows bytes, the feed knows that the consumer is the
// node, that producers are feeding tasks and that a full ring means raising
// feed_timeout or reading the node's log.  Every ring the feed opens or
// creates goes through these, so its errors read as the feed's.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "transport/shm/ring.h"
#include "ember/result.h"

namespace ember::feed {

// "feed ring <name>: the node process (pid N) that reads it has exited", ...
shm::RingWords FeedRingWords();

// shm::Ring::Open / Create with FeedRingWords().
Result<std::unique_ptr<shm::Ring>> OpenFeedRing(const std::string& name);
Result<std::unique_ptr<shm::Ring>> CreateFeedRing(const std::string& name, size_t capacity);

}  // namespace ember::feed
