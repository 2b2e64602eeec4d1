// PendingHandshakes: the bound on connections still in their authenticated
// handshake, shared by every acceptor of Ember (tcp::Server, the collective
// ring's).  It bounds what unauthenticated peers cost (threads, descriptors)
// without letting them lock the job's own clients out.
//
// When `cap` connections are pending and another arrives, the new one is
// admitted and an old one is dropped to make room (sshd's MaxStartups drops
// at random; we drop by rule): the oldest pending connection of the source
// address that holds the most pending slots.  A flood from one address thus
// evicts its own connections first, and a legitimate client, which finishes
// the handshake in one round trip, is dropped only if `cap` newer
// connections arrive from its own address within that round trip.  Clients
// dial again when dropped (tcp::Dial, handshake.h), so even that costs a
// retry, not the job.
//
// Dropping shuts the socket down (shutdown(2)); the connection's own thread
// sees its handshake fail at once and ends.  The owner of a descriptor must
// call Finish() before closing it, so a drop never shuts a reused number.
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/mutex.h"

namespace ember::tcp {

class PendingHandshakes {
 public:
  explicit PendingHandshakes(size_t cap);
  PendingHandshakes(const PendingHandshakes&) = delete;
  PendingHandshakes& operator=(const PendingHandshakes&) = delete;

  // Counts connection `id` (descriptor `fd`, peer "ip:port") as pending.  If
  // `cap` were pending already, drops one (see above) and returns its peer
  // ("" when none was dropped).
  std::string Start(uint64_t id, int fd, const std::string& peer) LOCKS_EXCLUDED(mu_);

  // Connection `id`'s handshake ended (passed or failed).  True if it had
  // been dropped to make room (its failure is that drop, not the peer's).
  bool Finish(uint64_t id) LOCKS_EXCLUDED(mu_);

  // Shuts every pending connection down (an acceptor that is stopping).
  void ShutdownAll() LOCKS_EXCLUDED(mu_);

  size_t cap() const { return cap_; }
  size_t pending() const LOCKS_EXCLUDED(mu_);
  uint64_t dropped() const LOCKS_EXCLUDED(mu_);

 private:
  struct Entry {
    uint64_t id;
    int fd;
    std::string host;  // the peer's address without its port
    std::string peer;
  };

  const size_t cap_;
  mutable Mutex mu_;
  std::vector<Entry> pending_ GUARDED_BY(mu_);  // in arrival order
  std::vector<uint64_t> dropped_ids_ GUARDED_BY(mu_);  // dropped, Finish() not yet called
  uint64_t dropped_ GUARDED_BY(mu_) = 0;
};

}  // namespace ember::tcp
