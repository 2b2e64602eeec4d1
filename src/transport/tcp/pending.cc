#include "transport/tcp/pending.h"

#include <sys/socket.h>

#include <algorithm>
#include <map>

namespace ember::tcp {
namespace {

// "ip:port" or "[ip]:port" -> "ip".
std::string HostOf(const std::string& peer) {
  if (!peer.empty() && peer.front() == '[') {
    const size_t close = peer.find(']');
    return close == std::string::npos ? peer : peer.substr(1, close - 1);
  }
  const size_t colon = peer.rfind(':');
  return colon == std::string::npos ? peer : peer.substr(0, colon);
}

}  // namespace

PendingHandshakes::PendingHandshakes(size_t cap) : cap_(std::max<size_t>(cap, 1)) {}

std::string PendingHandshakes::Start(uint64_t id, int fd, const std::string& peer) {
  MutexLock lock(&mu_);
  std::string dropped_peer;
  if (pending_.size() >= cap_) {
    // The address holding the most slots; among its connections, the oldest.
    std::map<std::string, size_t> per_host;
    size_t most = 0;
    for (const Entry& e : pending_) most = std::max(most, ++per_host[e.host]);
    auto victim = std::find_if(pending_.begin(), pending_.end(),
                               [&](const Entry& e) { return per_host[e.host] == most; });
    ::shutdown(victim->fd, SHUT_RDWR);
    dropped_peer = victim->peer;
    dropped_ids_.push_back(victim->id);
    ++dropped_;
    pending_.erase(victim);
  }
  pending_.push_back({id, fd, HostOf(peer), peer});
  return dropped_peer;
}

bool PendingHandshakes::Finish(uint64_t id) {
  MutexLock lock(&mu_);
  auto it = std::find_if(pending_.begin(), pending_.end(), [&](const Entry& e) { return e.id == id; });
  if (it != pending_.end()) {
    pending_.erase(it);
    return false;
  }
  auto d = std::find(dropped_ids_.begin(), dropped_ids_.end(), id);
  if (d == dropped_ids_.end()) return false;
  dropped_ids_.erase(d);
  return true;
}

void PendingHandshakes::ShutdownAll() {
  MutexLock lock(&mu_);
  for (const Entry& e : pending_) ::shutdown(e.fd, SHUT_RDWR);
}

size_t PendingHandshakes::pending() const {
  MutexLock lock(&mu_);
  return pending_.size();
}

uint64_t PendingHandshakes::dropped() const {
  MutexLock lock(&mu_);
  return dropped_;
}

}  // namespace ember::tcp
