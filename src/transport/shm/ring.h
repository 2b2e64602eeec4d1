// Ring: a bounded multi-producer / single-consumer queue of messages in
// POSIX shared memory, between processes of one host.  The ring knows bytes,
// not what they mean: its errors speak the words its user gives it
// (RingWords; the data feed's are in feed/feed_ring.h).
//
// The consumer Create()s the ring and owns the name; producers Open() it.  Each message is one (kind, payload) pair written
// whole under a process-shared robust mutex, so a producer that dies
// mid-write leaves the ring consistent (its message is never published).
// A full ring blocks producers (backpressure); an empty ring blocks the
// consumer.  Every wait takes a Deadline and also notices when the process
// on the other side has died, so nothing waits forever.
//
// Thread-safe: any number of producer threads/processes; one consumer.
// Terminate() and Abort() may come from any thread, also while the consumer
// is blocked in Read/ReadLease on another: everything is under the ring's
// mutex, and the blocked read wakes.
// Close() is safe while other threads use the ring: it wakes their blocked
// calls, which return Aborted ("... is closed") within moments, waits for
// every call on this object to leave, and only then unmaps the segment.
// Calls made after Close() return the same Aborted status.
//
// Leases (ReadLease) let the consumer read a message in place.  The ring
// keeps a consumer read position apart from `tail`, the end of the bytes
// producers may not reuse: tail is the start of the oldest unreleased lease,
// or the read position when none is left.  A lease held for long pins the
// ring, so the consumer bounds what leases pin (pinned_bytes()) and, past
// its bound, RevokeLeases(): the leased bytes are copied into private pages
// mapped over the very addresses the leases point at, and the ring bytes
// are freed.  Holders never notice; producers never wait on a held lease for
// long: a reader that has read everything while a producer waits for room
// (a message that must wrap past the ring's end can need more than the bound
// leaves free) revokes its leases at once.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ember/deadline.h"
#include "common/mutex.h"
#include "common/shm.h"
#include "ember/result.h"

namespace ember::shm {

struct RingHeader;
class Ring;

// How a ring's errors name it and its sides: the user's words, not the
// transport's.  Every error reads "<ring> <name>: ...".  Each side words the
// errors it returns with its own RingWords (a producer says `closed` when
// it finds the consumer's Close(), whoever created the ring).
struct RingWords {
  std::string ring = "shm ring";                   // "feed ring"
  std::string message = "message";                 // "<message> of N bytes exceeds the ring's limit"
  std::string consumer = "the consumer";           // "<consumer> process (pid N) that reads it has exited"
  std::string producer = "another producer";       // "<producer> held <consumer>'s session for ..."
  std::string not_found = "";                      // after "<ring> <name> does not exist"
  std::string too_large = "";                      // after the size limit: what to do
  std::string stalled = "is not reading it";       // a full ring: "<consumer> (pid N) <stalled>"
  std::string terminated = "the consumer terminated the ring";  // Cancelled after Terminate()
  std::string closed = "the consumer closed the ring";          // Aborted after the consumer's Close()
};

// What a producer can see of the consumer's progress (Ring::Progress).
struct RingProgress {
  uint64_t mark = 0;  // the largest value the consumer passed to SetMark; 0 before any
  uint64_t read = 0;  // bytes the consumer has read so far (grows while it reads)
};

// A message read in place by Ring::ReadLease.  payload() stays valid and
// unchanged for the life of the lease, after Ring::Close() or the Ring's
// destruction too (the lease keeps its own mapping).  Destroying it releases
// the ring bytes, on any thread.  Thread-safe to read from many threads.
class RingLease {
 public:
  ~RingLease();
  RingLease(const RingLease&) = delete;
  RingLease& operator=(const RingLease&) = delete;
  uint32_t kind() const { return kind_; }
  std::span<const uint8_t> payload() const { return payload_; }

 private:
  friend class Ring;
  struct Book;
  struct View;
  RingLease() = default;
  std::shared_ptr<Book> book_;
  std::shared_ptr<View> view_;  // the mapping payload_ points into
  uint64_t generation_ = 0;
  uint64_t index_ = 0;
  uint32_t kind_ = 0;
  std::span<const uint8_t> payload_;
};

class Ring {
 public:
  // Largest payload a ring of `capacity` bytes accepts in one message.
  static size_t MaxPayload(size_t capacity);

  // Creates segment `name` ("/ember-..." style, see shm_open(3)), mode 0600,
  // whose errors speak `words`,
  // failing with AlreadyExists if it exists.  The calling process becomes
  // the consumer; the name is unlinked by Close() or the destructor.
  // capacity is rounded up to a multiple of 8 and must be >= 4 KiB.
  static Result<std::unique_ptr<Ring>> Create(const std::string& name, size_t capacity, RingWords words = {});

  // Opens an existing segment as a producer; errors speak `words`.  NotFound if no such ring;
  // Corruption if the segment is not an Ember ring of this version.
  static Result<std::unique_ptr<Ring>> Open(const std::string& name, RingWords words = {});

  ~Ring();
  Ring(const Ring&) = delete;
  Ring& operator=(const Ring&) = delete;

  const std::string& name() const { return name_; }
  size_t capacity() const;

  // Producer: takes the ring's session lock, which keeps a producer's
  // messages contiguous (the feed's inference: one partition at a time per
  // consumer, so its results go back to the right producer).  Waits while another producer holds
  // it, as long as the consumer keeps reading: DeadlineExceeded only after
  // `idle_timeout` passes with no message consumed.  If the holder died, the
  // lock passes on.  Aborted as for Write().
  Status LockSession(Duration idle_timeout);
  // Releases the session lock taken by LockSession(); no-op if not held.
  // The same thread that locked must unlock (robust mutex semantics).
  void UnlockSession();

  // Producer: appends one message, blocking while the ring is full.
  // InvalidArgument if payload exceeds MaxPayload(capacity());
  // DeadlineExceeded if no room appeared before `deadline` (the consumer is
  // not reading); Aborted if the consumer closed the ring or its process
  // died (message says which).
  Status Write(uint32_t kind, std::span<const uint8_t> payload, Deadline deadline);
  // As Write, the payload given as consecutive parts (say, the pieces an
  // Arrow IPC writer emits, which point into the record batch's own
  // buffers), copied one after another straight into the ring: one copy,
  // no staging buffer.  The copy runs under the ring's lock, like Write's;
  // if the process dies during it (or a part's memory faults), the message
  // is never published and the next user of the ring carries on.
  Status WriteParts(uint32_t kind, std::span<const std::span<const uint8_t>> parts, Deadline deadline);

  // Consumer: takes the next message, blocking while the ring is empty.
  // `payload` is resized and overwritten.  DeadlineExceeded if nothing
  // arrived before `deadline`; Aborted after Abort(); Cancelled after
  // Terminate() (a read blocked on an empty ring wakes and returns it).
  // Where a stream of messages ends is said by message kinds (the user's
  // protocol), not here.
  Status Read(uint32_t* kind, std::vector<uint8_t>* payload, Deadline deadline);
  // Consumer: as Read, without copying: the message stays in the ring, its
  // bytes not reusable by producers, until the lease is destroyed (see the
  // class comment).  Errors as Read; IOError if mapping the lease view fails.
  Status ReadLease(std::shared_ptr<const RingLease>* lease, Deadline deadline);
  // Consumer: bytes producers cannot reuse because of leases (from the
  // oldest unreleased lease to the read position).  0 without leases.
  uint64_t pinned_bytes();
  // Consumer: detaches every outstanding lease from the ring: their pages
  // become private copies (same addresses, same bytes), tail moves to the
  // read position and producers wake.  Costs one copy of pinned_bytes()
  // (rounded out to pages) and a fresh mapping for later leases.  IOError
  // if the kernel refuses a mapping (the leases then stay as they were).
  Status RevokeLeases();

  // Consumer: what to do with each mapping that leases point into (a lease
  // view): `on_map(base, bytes)` once it is made (and now, for the current
  // one), `on_unmap(base)` before its pages are swapped (RevokeLeases, Close)
  // or it is unmapped (its last lease gone), and when the hooks are cleared.
  // A consumer that copies leased bytes to a GPU page-locks the views this
  // way.  A failed on_map leaves that view as it is (logged once).  on_unmap
  // may run on the thread that drops a view's last lease.
  struct ViewHooks {
    std::function<Status(void* base, size_t bytes)> on_map;
    std::function<void(void* base)> on_unmap;
  };
  Status SetViewHooks(ViewHooks hooks);
  // Unmaps (on_unmap) the current view's hook; later views get none.
  void ClearViewHooks();

  // Producer: OK while the consumer accepts messages; otherwise the Aborted
  // or Cancelled status a Write() would return.  Never blocks.  Lets a task
  // that waits elsewhere (for results) notice that the consumer failed.
  Status Health();

  // Consumer: publishes how far it got, in the protocol's own terms (the
  // feed's: the training epoch it began, plus one).  The mark only grows: a
  // smaller value is ignored.  Never blocks for long.
  void SetMark(uint64_t mark);
  // Producer: the consumer's mark and read position, or the status Health()
  // returns when the consumer no longer accepts messages.  Never blocks for
  // long; a waiter polls it (the read position tells a busy consumer from
  // one that stopped reading).
  Status Progress(RingProgress* progress);

  // Consumer: stop accepting messages; blocked and future Write()s return
  // Aborted with `reason`.  Idempotent.
  void Abort(const std::string& reason);

  // Consumer: it wants no more data (the feed's DataFeed.terminate()): the
  // ring is emptied, and blocked and future Write()s and LockSession()s
  // return Cancelled (words.terminated), which producers may treat as "stop
  // quietly"; so do
  // blocked and future Read()s and ReadLease()s (leases already handed out
  // stay valid).  Any thread, also while another reads.  Idempotent.
  void Terminate();

  // Wakes and waits out calls in flight on other threads (see the class
  // comment), revokes outstanding leases (they stay valid; the ring is free
  // for the next consumer), releases the session lock if held, unmaps the
  // segment (once no lease maps it) and, for
  // the consumer, aborts the ring for producers (they say words.closed)
  // and unlinks the name.  If another thread still holds the session lock,
  // the mapping is left in place (a locked robust mutex must not be
  // unmapped).  Idempotent and thread-safe; returns once the ring is closed.
  void Close();

 private:
  class Call;  // counts one call in flight; see Close()

  Ring(std::string name, RingWords words, SharedMemory segment, Mapping mapping);
  Status ClosedStatus() const;
  Status TerminatedStatus() const;  // Cancelled: what producers read as "stop quietly"
  // With h->mu held: the status of a ring closed, aborted or terminated, else OK.
  Status StoppedLocked() const;
  // With h->mu held: Aborted if the consumer's process is gone.
  std::optional<Status> ConsumerGoneLocked() const;
  std::string Prefix() const;  // "<ring> <name>"
  // With h->mu held: tail after a read or a release.
  void UpdateTailLocked();
  // Consumer, under the ring's mutex: steps over wrap markers to the next
  // record; true with its offset and payload length, false if the ring is
  // empty, Corruption if its header does not fit.
  Result<bool> NextRecordLocked(uint64_t* pos, uint32_t* len);
  // With h->mu held: RevokeLeases().
  Status RevokeLeasesLocked();
  // With h->mu held, nothing left to read: revokes the leases if a producer waits for more room
  // than is free.
  Status ReleaseRoomForProducersLocked();
  void HookViewLocked();  // on_map for the book's current view, if hooks are set

  const std::string name_;
  const RingWords words_;
  SharedMemory segment_;  // owner (consumer): unlinked by Close()
  // Shared with leases (through book_), which may outlive Close().
  std::shared_ptr<Mapping> mapping_;
  RingHeader* const header_;  // in mapping_; used only inside a Call
  std::shared_ptr<RingLease::Book> book_;  // the consumer's leases
  ViewHooks view_hooks_;  // guarded by the ring's robust mutex
  bool view_hook_failed_ = false;  // a failed on_map was logged
  const size_t capacity_;

  // Close() safety: a call enters by incrementing in_flight_, then checks
  // closing_; Close() sets closing_, wakes the waits in shared memory and
  // waits for in_flight_ to drop to zero (sequentially consistent, so one
  // side always sees the other).
  std::atomic<bool> closing_{false};
  std::atomic<int> in_flight_{0};
  Mutex close_mu_;  // serializes Close()
  bool closed_ GUARDED_BY(close_mu_) = false;

  // The session lock, by this object (see LockSession()); written only
  // inside Calls, read by Close() after they drained.
  bool session_held_ = false;
  std::thread::id session_thread_;
};

}  // namespace ember::shm
