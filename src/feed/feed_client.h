// FeedClient: a feeding task's connection to the feed server of a node on
// another host (feed_server.h).  It carries the same (kind, payload)
// messages a local producer writes into the node's shm::Ring; for inference
// the node's answers (kResults, kEndResults, kError) come back on it.
//
// Thread-compatible with one exception: one writer thread and one reader
// thread may use it at the same time (inference writes input while reading
// results); Write and Read are each serialized internally.  Close() is
// thread-safe and wakes a blocked Write or Read.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "ember/deadline.h"
#include "common/fd.h"
#include "common/mutex.h"
#include "ember/result.h"
#include "feed/codec.h"

namespace ember::feed {

class FeedClient {
 public:
  // Connects to host:port and proves the job's secret within `timeout`.
  // Unavailable (naming host:port and what to check) if the server cannot be
  // reached or is not an Ember feed server; Unauthenticated if the secrets
  // differ.  Frames from the server larger than `max_message_bytes` are
  // refused (Corruption).  The first frame is a kHello carrying
  // `idle_timeout`, which the server applies to its side of the connection.
  static Result<std::unique_ptr<FeedClient>> Connect(const std::string& host, int port,
                                                     const std::string& secret, Duration timeout,
                                                     size_t max_message_bytes = size_t{64} << 20,
                                                     Duration idle_timeout = Duration(600000));

  ~FeedClient();  // Close()s
  FeedClient(const FeedClient&) = delete;
  FeedClient& operator=(const FeedClient&) = delete;

  // Sends one message (the payload is sent from the caller's buffer).
  // Once the server has sent kError: Cancelled if the node terminated its
  // feed (stop feeding quietly), else Aborted carrying the server's text
  // (the node failed, a timeout, a protocol error).  Write notices a pending
  // kError before sending, unless a Read is in progress, which then gets it.
  // DeadlineExceeded if the server (the node) applies backpressure past
  // `deadline`; as with any socket error, the frame may be half sent and the
  // connection is unusable afterwards.
  Status Write(FeedKind kind, std::span<const uint8_t> payload, Deadline deadline);

  // Receives the next message from the server: kResults, kEndResults or
  // kError (whose payload is the UTF-8 reason; the caller decides what it
  // means).  A kError that Write consumed is still returned here once.
  // DeadlineExceeded with nothing consumed if no message began before
  // `deadline` (Read may be retried); Unavailable once the server closed the
  // connection; Corruption for a frame that is not one of those kinds.
  Status Read(FeedKind* kind, std::vector<uint8_t>* payload, Deadline deadline);

  // Asks the server to confirm that every message written so far is in the
  // node's ring (kFlush -> kFlushed), and waits for it until `deadline`.
  // Connections relay in parallel, so without this a later connection's
  // messages (the next epoch's) could reach the ring before this one's last.
  // Errors as Write; DeadlineExceeded if no confirmation came in time.  Not
  // for a connection whose results another thread reads (inference).
  Status Flush(Deadline deadline);

  // Asks whether the node began training epoch `epoch` (kAwaitEpoch ->
  // kEpochState); the server answers within about a second.  Errors as
  // Flush (Cancelled: the node terminated its feed).
  Status AwaitEpoch(uint32_t epoch, Deadline deadline, EpochStateMsg* state);

  // Closes the connection.  Idempotent; later calls return Unavailable.
  void Close();

  // "host:port" of the server.
  const std::string& peer() const { return peer_; }

 private:
  FeedClient(Fd fd, std::string peer, size_t max_message_bytes);

  // Takes a kError the server already sent, if no Read is in progress.
  // Waits up to `wait` for one to arrive.  OK if there is none.
  Status TakePendingError(Duration wait);
  Status ErrorStatus() const EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  Status CheckUsable() const EXCLUSIVE_LOCKS_REQUIRED(state_mu_);
  void MarkBroken(const Status& status);

  Fd fd_;  // closed only by Close(), holding write_mu_ and read_mu_
  const std::string peer_;
  const size_t max_message_bytes_;

  std::mutex close_mu_;  // serializes Close()
  std::mutex write_mu_;  // one Write at a time
  std::mutex read_mu_;   // one Read (or error check) at a time

  mutable Mutex state_mu_;
  bool closed_ GUARDED_BY(state_mu_) = false;
  Status broken_ GUARDED_BY(state_mu_);             // a socket error desynchronized the stream
  bool error_seen_ GUARDED_BY(state_mu_) = false;   // the server sent kError
  std::string error_text_ GUARDED_BY(state_mu_);
  bool error_unread_ GUARDED_BY(state_mu_) = false;  // Write took it; Read has not returned it yet
};

}  // namespace ember::feed
