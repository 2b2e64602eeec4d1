// FeedHost (ember/feed.h): a node's ring and the feed server on it, held by
// the node's launcher.  The ring's name and its result rings' prefix are
// decided here, once.
#include <memory>
#include <string>
#include <utility>

#include "common/logging.h"
#include "common/mutex.h"
#include "ember/feed.h"
#include "feed/feed_ring.h"
#include "feed/feed_server.h"
#include "transport/shm/ring.h"

namespace ember::feed {

std::string NodeRingName(std::string_view job_id, int64_t executor_id) {
  return "/" + std::string(job_id) + "-" + std::to_string(executor_id);
}

struct FeedHost::Impl {
  NodeEndpoint endpoint;
  Mutex mu;
  std::unique_ptr<shm::Ring> ring GUARDED_BY(mu);
  std::unique_ptr<FeedServer> server GUARDED_BY(mu);
};

FeedHost::FeedHost(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

FeedHost::~FeedHost() { Close(); }

Result<std::unique_ptr<FeedHost>> FeedHost::Start(const FeedHostOptions& options) {
  if (options.job_id.empty() || options.job_id.find('/') != std::string::npos) {
    return Status::InvalidArgument("FeedHostOptions.job_id must be a non-empty name without '/', got \"" +
                                   options.job_id + "\"");
  }
  if (options.host.empty()) return Status::InvalidArgument("FeedHostOptions.host is empty: say where producers reach the node");
  const std::string ring_name = NodeRingName(options.job_id, options.executor_id);
  EMBER_ASSIGN_OR_RAISE(std::unique_ptr<shm::Ring> ring, CreateFeedRing(ring_name, options.ring_bytes));
  FeedServerOptions server_options;
  server_options.bind_host = options.bind_host;
  server_options.secret = options.secret;
  server_options.ring_name = ring_name;
  server_options.result_ring_prefix = ResultRingPrefix(ring_name);
  server_options.idle_timeout = options.idle_timeout;
  Result<std::unique_ptr<FeedServer>> server = FeedServer::Start(server_options);
  if (!server.ok()) {
    ring->Close();  // the consumer's Close unlinks the name
    return server.status();
  }
  auto impl = std::make_unique<Impl>();
  impl->endpoint.executor_id = options.executor_id;
  impl->endpoint.name = options.name;
  impl->endpoint.ring = ring_name;
  impl->endpoint.host = options.host;
  impl->endpoint.port = (*server)->port();
  impl->endpoint.ring_capacity = ring->capacity();
  {
    MutexLock lock(&impl->mu);
    impl->ring = std::move(ring);
    impl->server = server.MoveValueUnsafe();
  }
  return std::unique_ptr<FeedHost>(new FeedHost(std::move(impl)));
}

const NodeEndpoint& FeedHost::endpoint() const { return impl_->endpoint; }

void FeedHost::Abort(const std::string& reason) {
  MutexLock lock(&impl_->mu);
  if (impl_->ring) impl_->ring->Abort(reason);
}

void FeedHost::Terminate() {
  MutexLock lock(&impl_->mu);
  if (impl_->ring) impl_->ring->Terminate();
}

void FeedHost::Close() {
  std::unique_ptr<FeedServer> server;
  std::unique_ptr<shm::Ring> ring;
  {
    MutexLock lock(&impl_->mu);
    server = std::move(impl_->server);
    ring = std::move(impl_->ring);
  }
  if (server == nullptr && ring == nullptr) return;
  if (server) server->Close();  // first: it tells connections how the node ended, from the ring
  if (ring) ring->Close();
  // Result rings whose feeding task was killed before the node could map them.
  const Status removed = RemoveResultRings(impl_->endpoint.ring);
  if (!removed.ok()) {
    EMBER_LOG(WARN) << "node " << impl_->endpoint.name << ": " << removed.ToString();
  }
}

}  // namespace ember::feed
