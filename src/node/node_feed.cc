// Node::OpenFeed, apart from node.cc: a node program that never reads the
// feed links no feed code.
#include <string>
#include <utility>

#include "ember/feed.h"
#include "ember/node.h"

namespace ember {

Result<std::unique_ptr<feed::Consumer>> Node::OpenFeed(feed::ConsumerOptions options) const {
  if (context_.feed_ring.empty()) {
    if (context_.input_mode != InputMode::kSpark) {
      return Status::InvalidArgument(
          "node " + label() + ": OpenFeed needs Cluster.run(..., input_mode=InputMode.SPARK); this "
          "job uses InputMode.TENSORFLOW, where a node reads its own data");
    }
    return Status::InvalidArgument("node " + label() +
                                   " is not fed: only chief, master and worker nodes receive data "
                                   "in InputMode.SPARK");
  }
  if (options.node == feed::ConsumerOptions{}.node) options.node = label();
  return feed::Consumer::Open(context_.feed_ring, std::move(options));
}

}  // namespace ember
