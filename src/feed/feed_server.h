// FeedServer: the TCP end of a node's data feed, for feeding tasks on other
// hosts.  Each node's launcher runs one; it relays every message a remote
// producer (FeedClient) sends into the node's shm::Ring, exactly as a local
// producer would write it, and for inference pumps the node's answers back.
//
// Connections are served by tcp::Server (transport/tcp/server.h): the
// authenticated handshake comes first, and a peer that fails it is logged
// with its address and dropped before any frame is parsed.  Then, per frame (type = FeedKind, docs/wire.md "Feed"):
//   kBeginPartition  takes the ring's session lock (held until the matching
//                    kEndPartition is forwarded).  With the results flag it
//                    creates a local result ring, writes its name into the
//                    payload it forwards, and queues the ring on the
//                    connection's pump, which sends everything the node
//                    writes there (kResults, kEndResults, kError) back over
//                    the socket, one partition after another, in order.
//   kHello           (first frame only, optional) the producer's idle timeout:
//                    replaces idle_timeout for this connection, so the
//                    user's feed_timeout reaches the node side.
//   kBatch, kEndPartition, kEndEpoch, kEndFeed   validated (feed/codec.h),
//                    forwarded unchanged.
//   kFlush           answered with kFlushed once every earlier frame is in the ring.
//   kAwaitEpoch      (the driver) answered with kEpochState within about a
//                    second: whether the node began the training epoch, and
//                    how far it has read (shm::Ring::Progress).
//   anything else    a protocol error.
// A failure (the node aborted its ring or died, a ring write or session wait
// made no progress for idle_timeout, a malformed frame) goes back to the
// producer as one kError frame carrying "<status code name>: <message>";
// then the connection is closed.  "Cancelled: ..." means the node
// terminated its feed (shm::Ring::Terminate), which producers treat as "stop
// quietly".  A node failure or terminate is noticed within ~100 ms even
// while the producer sends nothing.
//
// Each connection opens the node's ring itself, so the session lock is held
// by that connection's thread, as shm::Ring requires.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "ember/deadline.h"
#include "ember/result.h"

namespace ember::feed {

struct FeedServerOptions {
  std::string bind_host = "0.0.0.0";
  int port = 0;  // 0 picks a free port; see FeedServer::port()
  std::string secret;  // the job's secret, >= 16 bytes
  // The node's ring (shm::Ring::Create'd by the node); opened as a producer.
  std::string ring_name;
  // Result rings are named <prefix>-<pid>-<server>-<connection>-<partition>-<seq>.
  std::string result_ring_prefix = "/ember-results";
  size_t result_ring_capacity = size_t{4} << 20;
  Duration handshake_timeout{10000};
  // How long a blocked ring write, a session wait or a socket write may make
  // no progress before the connection is failed, until a producer's kHello
  // sets its own for its connection.
  Duration idle_timeout{600000};
  size_t max_message_bytes = size_t{64} << 20;  // largest frame accepted
};

// Counters for tests and logs.
struct FeedServerStats {
  uint64_t connections_accepted = 0;  // passed the handshake
  uint64_t connections_rejected = 0;  // failed the handshake
  uint64_t messages_relayed = 0;      // into the node's ring
  uint64_t bytes_relayed = 0;         // payload bytes into the node's ring
  uint64_t results_sent = 0;          // frames pumped back to producers
};

class FeedServer {
 public:
  // Opens the node's ring and starts listening.  InvalidArgument for bad
  // options; NotFound if the ring does not exist; IOError if the address
  // cannot be bound.
  static Result<std::unique_ptr<FeedServer>> Start(const FeedServerOptions& options);

  // Close()s, joining every thread.
  ~FeedServer();
  FeedServer(const FeedServer&) = delete;
  FeedServer& operator=(const FeedServer&) = delete;

  int port() const;
  FeedServerStats stats() const;

  // Stops accepting, drops every connection (releasing their session locks
  // and result rings) and joins all threads.  A connection blocked on a full
  // ring notices within ~100 ms; one waiting for the session lock within
  // ~100 ms of the node last consuming (shm::Ring::LockSession keeps waiting
  // while the holder makes progress).  Idempotent and thread-safe.
  void Close();

  struct Impl;

 private:
  FeedServer();
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::feed
