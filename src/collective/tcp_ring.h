// TcpRing: a collective backend joining `size` ranks by a ring of
// authenticated TCP connections (between hosts; on one host when the user
// forces Transport::kTcp).  Rank r connects to rank (r+1) % size ("next")
// and accepts rank (r-1) % size ("prev"); data flows r -> next, so every
// rank has one connection it sends on and one it receives from (size 2
// too: two connections, one each way).  Abort frames also travel backwards.
//
// Algorithms (each transfer split in chunk_bytes frames and pipelined: a
// rank sends chunk c of ring step t+1 as soon as it has reduced chunk c of
// step t, while poll(2) keeps both sockets moving, so no two ranks ever
// block on each other's sends):
//   * Allreduce above small_bytes: ring reduce-scatter over `size`
//     segments, then ring allgather.  Segment k is reduced along one fixed
//     path (ranks k+1, k+2, ..., k) and then copied, so every rank holds the
//     same bits.  bfloat16/float16 partial sums are rounded at every hop.
//   * Allreduce at or below small_bytes: every buffer travels around the
//     ring (size-1 hops) and each rank reduces all of them in rank order
//     (ReduceN), rounding once: half the hops of the ring, for latency.
//   * Broadcast: a pipelined chain from the root along the ring.
//   * Allgather (counts may differ, zero too): ring allgather.
//   * ReduceScatter: ring reduce-scatter shifted so rank r ends with block r.
//   * Barrier: a ring allgather of one byte per rank.
//
// Wire format (after the handshake of transport/tcp/handshake.h; every
// message is a frame.h frame: u32 payload length | u16 type | u16 version 1
// | payload, little-endian; docs/wire.md "Collectives: TCP ring"):
//   0x0701 hello      connector -> acceptor, first frame after the handshake:
//                     i32 ring size | i32 from rank | i32 to rank | string ring_id
//                     (u32 length + bytes, at most 256)
//   0x0702 hello-ack  acceptor -> connector: the same fields seen from the
//                     acceptor (from = its rank, to = the connector's)
//   0x0703 reject     acceptor -> connector, then close: string reason
//   0x0710 call       first frame of every call, r -> next: the 24-byte
//                     CallDesc (call.h); the receiver checks it against its own
//   0x0711 data       r -> next: a chunk of the call's data; its length is
//                     fixed by the schedule both ends compute from the
//                     descriptor (never larger than chunk_bytes), and any
//                     other length or type is Corruption
//   0x0712 abort      either direction, at a frame boundary: u8 status code |
//                     i32 origin rank | string message (at most 1 KiB); the
//                     receiver fails with that status and forwards the frame
//                     to its other neighbour, so every rank learns the cause.
// A receiver reads only fixed-size headers and payloads whose lengths it
// checked (hello/reject at most 512 bytes, abort at most 2 KiB).
//
// Failures: a mismatched call fails on every rank with InvalidArgument
// naming both ranks and calls (the detector aborts the ring with it); a
// peer that closes its connection -> Aborted "rank 2 (...) closed the
// connection during allreduce #7 (...)"; a peer that does not start a call
// in time -> DeadlineExceeded naming it; Abort(reason) -> peers fail
// Aborted "rank k (...) aborted: <reason>".  After any failure the ring is
// broken and every later call returns the first error at once.
//
// Thread-safety: calls are made by one thread at a time (backend.h);
// Abort() may be called from any thread at any time.
#pragma once

#include <atomic>
#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include <sys/uio.h>

#include "collective/backend.h"
#include "ember/deadline.h"
#include "common/fd.h"
#include "common/mutex.h"
#include "transport/tcp/acceptor.h"
#include "ember/result.h"

namespace ember::collective {

struct TcpRingOptions {
  int rank = 0, size = 1;  // within the ring
  // size entries naming ranks in errors: "rank 1 (worker:1 on 10.0.0.2, pid 4711)";
  // empty: "rank <r>".
  std::vector<std::string> rank_names;
  std::string secret;  // job secret (>= 16 bytes)
  std::string bind_host = "0.0.0.0";
  // Names this ring in the hello, so a connection meant for another ring
  // (another communicator of the job) is rejected.  At most 256 bytes.
  std::string ring_id;
  size_t chunk_bytes = 256 << 10;  // pipelining granularity (4 KiB .. 64 MiB)
  // Allreduces of at most this many bytes take the latency algorithm
  // (measured on a busy 2-core box: the ring wins from 4 KiB up at 2 ranks).
  size_t small_bytes = 4 << 10;
  Duration handshake_timeout{5000};
};

class TcpRing : public Backend {
 public:
  // Validates the options and binds a listener (port chosen by the OS); the
  // communicator publishes port().  InvalidArgument for bad options, IOError
  // if the address cannot be bound.
  static Result<std::unique_ptr<TcpRing>> Listen(const TcpRingOptions& options);
  // Closes the connections (peers in a call fail naming this rank).  No
  // call may be in flight on another thread.
  ~TcpRing() override;
  TcpRing(const TcpRing&) = delete;
  TcpRing& operator=(const TcpRing&) = delete;

  int port() const { return port_; }

  // addresses[r] = {host, port} of every ring rank.  Connects to the next
  // rank and accepts the previous one (every accepted connection runs the
  // handshake on its own thread, at most 8 at once; the hello must name
  // this ring and the previous rank, anything else is rejected and logged),
  // within `deadline`.  DeadlineExceeded/Unavailable naming the rank not
  // reached; Unauthenticated if the next rank does not share the secret.
  // Call once; the listener is closed when it returns.
  Status Connect(const std::vector<std::pair<std::string, int>>& addresses, Deadline deadline);

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  // "rank 1 (worker:1 ...)" as given in rank_names.
  const std::string& Describe(int rank) const { return names_[rank]; }

  Status Allreduce(const CallDesc& desc, void* data, Deadline deadline) override;
  Status Broadcast(const CallDesc& desc, void* data, Deadline deadline) override;
  Status Allgather(const CallDesc& desc, const void* in, std::span<const uint64_t> counts, void* out,
                   Deadline deadline) override;
  Status ReduceScatter(const CallDesc& desc, const void* in, void* out, Deadline deadline) override;
  Status Barrier(const CallDesc& desc, Deadline deadline) override;
  void Abort(const std::string& reason) override;

 private:
  struct Plan;
  struct CallState;

  TcpRing(const TcpRingOptions& options, Fd listener, int port, Fd wake);

  int next() const { return (options_.rank + 1) % options_.size; }
  int prev() const { return (options_.rank + options_.size - 1) % options_.size; }

  // Marks a call in flight; the ring's error if it is broken.
  Status BeginCall() LOCKS_EXCLUDED(mu_);
  // Ends it: records a failure as the ring's error; returns what the caller returns.
  Status EndCall(Status status) LOCKS_EXCLUDED(mu_);
  // Runs `plan` (call frame first) under `deadline`: sends what is ready,
  // receives what has arrived, and waits for the sockets, until every frame
  // moved or the call failed.
  Status Run(const CallDesc& desc, Plan& plan, Deadline deadline);
  // Run()'s steps on the call's state; a status returned ends the call.
  std::optional<Status> SendReady(CallState& c, bool* want_out);  // every frame whose data is ready
  std::optional<Status> ReceiveReady(CallState& c);  // what has arrived; reduces complete chunks
  std::optional<Status> Finish(CallState& c);  // all moved: OK, unless an abort frame came (nullopt: read it)
  std::optional<Status> Wait(CallState& c, bool want_out);  // poll: sockets, Abort(), deadline
  std::optional<Status> ReadBack(CallState& c);  // an abort frame from next (the only backward traffic)
  // A failure found here: every neighbour learns it.
  Status Fail(CallState& c, Status s);
  // An abort frame that arrived on `from_fd`: passed on to the other side.
  Status ReceivedAbort(CallState& c, const std::string& payload, int from_fd, const std::string& from);
  Status IoFailure(CallState& c, int err, const std::string& who, const char* what);
  // The unsent rest of a frame cut in the middle, so an abort frame can follow it.
  std::vector<iovec> Tail(CallState& c);
  // Breaks the ring after a failure detected here or received: sends an
  // abort frame to the neighbours chosen, shuts the sockets' write sides.
  // `mid_frame` is the unsent tail of the frame in progress on the send
  // connection, finished first when possible.
  void SendAbort(const std::string& payload, bool to_next, bool to_prev, std::span<const iovec> mid_frame);

  // Connect()'s steps.  The listener, handed to an acceptor that admits
  // the previous rank's connection (handshake, then AdmitPrev).
  Result<std::unique_ptr<tcp::Acceptor>> AcceptPrev(Deadline deadline);
  // On the acceptor's thread: reads the hello; acks the previous rank of
  // this ring, once; rejects anything else (reject frame, then an error).
  Status AdmitPrev(int fd, const std::string& peer, Deadline deadline);
  // Dials the next rank (tcp::Dial) and exchanges hellos, retrying until
  // `deadline` while it is not reachable.
  Status ConnectNext(const std::string& host, int port, Deadline deadline);
  // The dialling side's hello; *refused when next answered but refused us
  // (another ring, or not the rank expected): dialling again cannot help.
  Status ExchangeHello(int fd, const std::string& who, Deadline deadline, bool* refused);
  std::string Where() const;  // "tcp ring rank 0 (...)"

  const TcpRingOptions options_;
  std::vector<std::string> names_;
  Fd listener_;  // until Connect() hands it to its acceptor
  const int port_;
  std::atomic<bool> prev_claimed_{false};  // Connect(): the previous rank's connection was admitted
  Fd wake_;         // eventfd: Abort() wakes a call blocked in poll
  Fd send_fd_;      // to next
  Fd recv_fd_;      // from prev

  // Call-thread state (one call at a time).
  std::vector<std::byte> inbox_;  // bytes read from recv_fd_ ahead of their use
  size_t inbox_begin_ = 0, inbox_end_ = 0;
  std::vector<std::byte> staging_;  // a received chunk before it is reduced
  std::vector<std::byte> scratch_;  // small allreduce / reduce-scatter working space

  Mutex mu_;
  Status error_ GUARDED_BY(mu_);  // the first failure; the ring is broken once set
  bool connected_ GUARDED_BY(mu_) = false;
  bool in_call_ GUARDED_BY(mu_) = false;
  // Set by Abort() during a call: the call thread sends this abort payload.
  std::string abort_payload_ GUARDED_BY(mu_);
};

}  // namespace ember::collective
