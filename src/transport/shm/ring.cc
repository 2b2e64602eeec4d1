#include "transport/shm/ring.h"

#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <deque>

#include "common/logging.h"
#include "transport/shm/wait.h"

namespace ember::shm {

namespace {
constexpr uint64_t kMagic = 0x31474e4952424d45ull;  // "EMBRING1"
constexpr uint32_t kVersion = 6;  // 2: 1 KiB abort reason; 3: read position, page-aligned data; 4: consumer mark;
                                  // 5: the consumer's Close() is an abort code, worded by each reader;
                                  // 6: waiting_need (a reader with nothing to read frees leased room)
constexpr uint32_t kWrapMarker = 0xffffffffu;  // rest of the ring up to its end is unused
constexpr size_t kRecordHeader = 8;           // u32 payload length, u32 kind
constexpr size_t kMinCapacity = 4096;
constexpr size_t kReasonBytes = 1024;  // who failed and why (the last line of a traceback)
// Blocked waits wake this often to check that the peer process is alive.
constexpr Duration kLivenessCheck{100};
// RingHeader::aborted
constexpr uint32_t kRunning = 0, kAborted = 1, kClosedByConsumer = 2;

size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }
constexpr size_t kPage = 4096;  // data starts on a page of its own (RevokeLeases remaps data pages)
size_t PageSize() { return static_cast<size_t>(sysconf(_SC_PAGESIZE)); }
size_t PageRound(size_t n) { return (n + PageSize() - 1) & ~(PageSize() - 1); }
}  // namespace

// Lives at the start of the shared segment; the data area follows it.
// head/tail are byte counters that only grow; position = counter % capacity.
struct RingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t reserved;
  uint64_t capacity;
  pthread_mutex_t mu;         // robust, process-shared
  pthread_cond_t not_empty;   // consumer waits; CLOCK_MONOTONIC
  pthread_cond_t not_full;    // producers wait; CLOCK_MONOTONIC
  pthread_mutex_t session_mu; // robust, process-shared; see LockSession()
  uint64_t head;              // next byte producers write     (guarded by mu)
  uint64_t tail;              // end of the bytes producers may not reuse (guarded by mu)
  uint64_t read;              // next byte the consumer reads, >= tail (guarded by mu)
  int64_t consumer_pid;
  uint32_t aborted;           // kRunning, kAborted (abort_reason says why), kClosedByConsumer; guarded by mu
  uint32_t terminated;        // guarded by mu
  uint64_t mark;              // the consumer's progress mark, see SetMark (guarded by mu)
  uint64_t waiting_need;      // room a producer waits for, 0 once one writes (guarded by mu); see
                              // ReleaseRoomForProducersLocked
  char abort_reason[kReasonBytes];
  alignas(kPage) uint8_t data[];
};

// A mapping of the whole segment that leases point into.  RevokeLeases may
// have replaced some of its data pages with private copies; unmapped when
// the last lease into it (or the Book, while current) goes.
struct RingLease::View {
  uint8_t* base = nullptr;
  size_t size = 0;
  // Ring::ViewHooks::on_unmap, while the view is hooked: run once, before the
  // pages are swapped or unmapped.  Guarded by the ring's robust mutex while
  // the book holds the view; the destructor runs when nobody else does.
  std::function<void(void*)> unhook;
  View() = default;
  View(const View&) = delete;
  View& operator=(const View&) = delete;
  void Unhook() {
    if (unhook) {
      std::function<void(void*)> f = std::move(unhook);
      unhook = nullptr;
      f(base);
    }
  }
  ~View() {
    Unhook();
    if (base != nullptr) ::munmap(base, size);
  }
};

// The consumer's leases, shared by its Ring and every lease, so that a lease
// may be released after the Ring is gone.  Fields are guarded by header->mu,
// the ring's robust mutex, which `mapping` keeps mapped.
struct RingLease::Book {
  struct Entry {
    uint64_t start;  // ring byte counters of the record, wrap marker before it excluded
    uint64_t end;
    bool released;
  };
  std::shared_ptr<Mapping> mapping;
  RingHeader* header = nullptr;
  std::shared_ptr<View> view;  // where new leases point; made on the first lease
  uint64_t generation = 0;     // bumped by RevokeLeases: older leases no longer pin
  uint64_t first = 0;          // index of entries.front() since the generation began
  std::deque<Entry> entries;   // in read order
};

namespace {

// Locks a robust mutex.  If the previous owner died holding it, the ring is
// still consistent (head moves only after a message is fully written), so we
// mark the mutex consistent and carry on.
class RobustLock {
 public:
  explicit RobustLock(pthread_mutex_t* mu) : mu_(mu) {
    if (pthread_mutex_lock(mu_) == EOWNERDEAD) pthread_mutex_consistent(mu_);
  }
  ~RobustLock() { pthread_mutex_unlock(mu_); }
  RobustLock(const RobustLock&) = delete;
  RobustLock& operator=(const RobustLock&) = delete;

 private:
  pthread_mutex_t* mu_;
};

void SetReason(RingHeader* h, const std::string& reason) {
  size_t n = std::min(reason.size(), kReasonBytes - 1);
  std::memcpy(h->abort_reason, reason.data(), n);
  h->abort_reason[n] = '\0';
}

}  // namespace

size_t Ring::MaxPayload(size_t capacity) {
  // A record may need the wrap marker's room too; half the ring keeps
  // producers from starving on large messages.
  return Align8(capacity) / 2 - kRecordHeader;
}

RingLease::~RingLease() {
  if (!book_) return;
  RingHeader* h = book_->header;
  RobustLock lock(&h->mu);
  Book& b = *book_;
  if (generation_ != b.generation) return;  // revoked: its bytes are private now
  b.entries[index_ - b.first].released = true;
  while (!b.entries.empty() && b.entries.front().released) {
    b.entries.pop_front();
    ++b.first;
  }
  const uint64_t tail = b.entries.empty() ? h->read : b.entries.front().start;
  if (tail != h->tail) {
    h->tail = tail;
    pthread_cond_broadcast(&h->not_full);
  }
}

// A public method's stay on the ring: while one exists, Close() does not
// unmap.  ok() is false once Close() began; the method then returns
// ClosedStatus() without touching the segment.
class Ring::Call {
 public:
  explicit Call(Ring* ring) : ring_(ring) {
    ring_->in_flight_.fetch_add(1);
    ok_ = !ring_->closing_.load();
  }
  ~Call() {
    if (ring_->in_flight_.fetch_sub(1) == 1 && ring_->closing_.load()) ring_->in_flight_.notify_all();
  }
  Call(const Call&) = delete;
  Call& operator=(const Call&) = delete;
  bool ok() const { return ok_; }

 private:
  Ring* const ring_;
  bool ok_;
};

Ring::Ring(std::string name, RingWords words, SharedMemory segment, Mapping mapping)
    : name_(std::move(name)),
      words_(std::move(words)),
      segment_(std::move(segment)),
      mapping_(std::make_shared<Mapping>(std::move(mapping))),
      header_(static_cast<RingHeader*>(mapping_->data())),
      book_(std::make_shared<RingLease::Book>()),
      capacity_(header_->capacity) {
  book_->mapping = mapping_;
  book_->header = header_;
}

Ring::~Ring() { Close(); }

size_t Ring::capacity() const { return capacity_; }

std::string Ring::Prefix() const { return words_.ring + " " + name_; }

Status Ring::ClosedStatus() const { return Status::Aborted(Prefix() + " is closed"); }
Status Ring::TerminatedStatus() const { return Status::Cancelled(Prefix() + ": " + words_.terminated); }

Status Ring::StoppedLocked() const {
  const RingHeader* h = header_;
  if (closing_) return ClosedStatus();
  if (h->aborted == kClosedByConsumer) return Status::Aborted(Prefix() + ": " + words_.closed);
  if (h->aborted != kRunning) return Status::Aborted(Prefix() + ": " + h->abort_reason);
  if (h->terminated) return TerminatedStatus();
  return Status::OK();
}

std::optional<Status> Ring::ConsumerGoneLocked() const {
  const int64_t pid = header_->consumer_pid;
  if (!ProcessGone(pid)) return std::nullopt;
  return Status::Aborted(Prefix() + ": " + words_.consumer + " process (pid " + std::to_string(pid) +
                         ") that reads it has exited");
}

Result<std::unique_ptr<Ring>> Ring::Create(const std::string& name, size_t capacity, RingWords words) {
  capacity = Align8(capacity);
  if (capacity < kMinCapacity) {
    return Status::InvalidArgument(words.ring + " " + name + ": capacity " + std::to_string(capacity) +
                                   " is below the minimum of 4096 bytes");
  }
  const size_t bytes = sizeof(RingHeader) + capacity;
  Result<SharedMemory> created = SharedMemory::Create(name, bytes);
  if (!created.ok()) {
    if (created.status().code() == StatusCode::kAlreadyExists) {
      return Status::AlreadyExists(words.ring + " " + name + " already exists");
    }
    return created.status();
  }
  SharedMemory segment = created.MoveValueUnsafe();  // unlinks the name if we fail below
  EMBER_ASSIGN_OR_RAISE(Mapping mapping, Mapping::Map(segment.fd(), bytes, words.ring + " " + name));
  (void)segment.Close();  // the mapping keeps the memory; only the name is still needed
  auto* h = static_cast<RingHeader*>(mapping.data());
  h->version = kVersion;
  h->capacity = capacity;
  h->head = h->tail = h->read = 0;
  h->consumer_pid = getpid();
  h->aborted = kRunning;
  h->terminated = 0;
  h->mark = 0;
  h->waiting_need = 0;
  h->abort_reason[0] = '\0';

  pthread_mutexattr_t ma;
  pthread_mutexattr_init(&ma);
  pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
  pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
  pthread_mutex_init(&h->mu, &ma);
  pthread_mutex_init(&h->session_mu, &ma);
  pthread_mutexattr_destroy(&ma);
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setpshared(&ca, PTHREAD_PROCESS_SHARED);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&h->not_empty, &ca);
  pthread_cond_init(&h->not_full, &ca);
  pthread_condattr_destroy(&ca);
  // Publish last: Open() checks the magic before touching anything else.
  std::atomic_thread_fence(std::memory_order_release);
  h->magic = kMagic;
  return std::unique_ptr<Ring>(new Ring(name, std::move(words), std::move(segment), std::move(mapping)));
}

Result<std::unique_ptr<Ring>> Ring::Open(const std::string& name, RingWords words) {
  Result<SharedMemory> opened = SharedMemory::Open(name);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) {
      return Status::NotFound(words.ring + " " + name + " does not exist" + words.not_found);
    }
    return opened.status();
  }
  SharedMemory segment = opened.MoveValueUnsafe();
  const size_t bytes = segment.size();
  if (bytes < sizeof(RingHeader) + kMinCapacity) {
    return Status::Corruption(words.ring + " " + name + " is " + std::to_string(bytes) +
                              " bytes, too small to be a ring");
  }
  EMBER_ASSIGN_OR_RAISE(Mapping mapping, Mapping::Map(segment.fd(), bytes, words.ring + " " + name));
  (void)segment.Close();
  auto* h = static_cast<RingHeader*>(mapping.data());
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kMagic || h->version != kVersion || sizeof(RingHeader) + h->capacity != bytes) {
    return Status::Corruption(words.ring + " " + name + " is not an Ember " + words.ring + " of version " +
                              std::to_string(kVersion));
  }
  return std::unique_ptr<Ring>(new Ring(name, std::move(words), std::move(segment), std::move(mapping)));
}

Status Ring::Write(uint32_t kind, std::span<const uint8_t> payload, Deadline deadline) {
  const std::span<const uint8_t> parts[1] = {payload};
  return WriteParts(kind, parts, deadline);
}

Status Ring::WriteParts(uint32_t kind, std::span<const std::span<const uint8_t>> parts, Deadline deadline) {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RingHeader* h = header_;
  const uint64_t cap = capacity_;
  size_t size = 0;
  for (const auto& part : parts) size += part.size();
  if (size > MaxPayload(cap)) {
    return Status::InvalidArgument(words_.message + " of " + std::to_string(size) +
                                   " bytes exceeds the ring's limit of " + std::to_string(MaxPayload(cap)) +
                                   " bytes (" + name_ + ")" + words_.too_large);
  }
  const uint64_t record = kRecordHeader + Align8(size);
  RobustLock lock(&h->mu);
  return WaitShared(
      deadline, kLivenessCheck,
      [&]() -> std::optional<Status> {
        if (Status stopped = StoppedLocked(); !stopped.ok()) return stopped;
        const uint64_t pos = h->head % cap;
        const uint64_t to_end = cap - pos;
        // A record never straddles the end: if it does not fit, a wrap marker
        // fills the rest and the record starts at offset 0.
        const uint64_t needed = record <= to_end ? record : to_end + record;
        if (cap - (h->head - h->tail) < needed) {
          if (needed > h->waiting_need) {  // a reader with nothing left to read frees what its leases pin
            h->waiting_need = needed;
            pthread_cond_broadcast(&h->not_empty);
          }
          return std::nullopt;
        }
        h->waiting_need = 0;  // head moves: any other waiting producer says again what it needs
        if (record > to_end) {
          uint32_t marker = kWrapMarker;
          std::memcpy(h->data + pos, &marker, sizeof(marker));
          h->head += to_end;
        }
        // The record is published by moving head, after it is whole: a producer that dies
        // while copying leaves head where it was (see RobustLock).
        uint8_t* dst = h->data + h->head % cap;
        const uint32_t len = static_cast<uint32_t>(size);
        std::memcpy(dst, &len, 4);
        std::memcpy(dst + 4, &kind, 4);
        uint8_t* out = dst + kRecordHeader;
        for (const auto& part : parts) {
          if (part.empty()) continue;
          std::memcpy(out, part.data(), part.size());
          out += part.size();
        }
        h->head += record;
        pthread_cond_signal(&h->not_empty);
        return Status::OK();
      },
      [&] { return ConsumerGoneLocked(); },
      [&] {
        return Status::DeadlineExceeded(Prefix() + " stayed full until the deadline: " + words_.consumer + " (pid " +
                                        std::to_string(h->consumer_pid) + ") " + words_.stalled);
      },
      [&](int64_t ms) { CondWaitMs(&h->not_full, &h->mu, ms); });
}

Status Ring::LockSession(Duration idle_timeout) {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RingHeader* h = header_;
  if (session_held_) return Status::Internal(Prefix() + ": LockSession() called twice");
  Deadline deadline = Deadline::After(idle_timeout);
  RobustLock lock(&h->mu);
  uint64_t last_tail = h->tail;
  return WaitShared(
      deadline, kLivenessCheck,
      [&]() -> std::optional<Status> {
        if (Status stopped = StoppedLocked(); !stopped.ok()) return stopped;
        // A try under h->mu never blocks, so it cannot deadlock with a holder taking h->mu.
        int rc = pthread_mutex_trylock(&h->session_mu);
        if (rc == EOWNERDEAD) {  // the previous holder died mid-session
          pthread_mutex_consistent(&h->session_mu);
          rc = 0;
        }
        if (rc == 0) {
          session_held_ = true;
          session_thread_ = std::this_thread::get_id();
          return Status::OK();
        }
        if (h->tail != last_tail) {  // the consumer is consuming: keep waiting
          last_tail = h->tail;
          deadline = Deadline::After(idle_timeout);
        }
        return std::nullopt;
      },
      [&] { return ConsumerGoneLocked(); },
      [&] {
        return Status::DeadlineExceeded(Prefix() + ": " + words_.producer + " held " + words_.consumer +
                                        "'s session for " + FormatDuration(idle_timeout) + " while " +
                                        words_.consumer + " consumed nothing");
      },
      // Session holders signal not_full whenever the consumer frees room;
      // the liveness tick bounds the wait otherwise.
      [&](int64_t ms) { CondWaitMs(&h->not_full, &h->mu, ms); });
}

void Ring::UnlockSession() {
  Call call(this);
  if (!call.ok() || !session_held_) return;
  session_held_ = false;
  pthread_mutex_unlock(&header_->session_mu);
  RobustLock lock(&header_->mu);
  pthread_cond_broadcast(&header_->not_full);
}

Status Ring::Read(uint32_t* kind, std::vector<uint8_t>* payload, Deadline deadline) {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RingHeader* h = header_;
  RobustLock lock(&h->mu);
  return WaitShared(
      deadline, kLivenessCheck,
      [&]() -> std::optional<Status> {
        if (Status stopped = StoppedLocked(); !stopped.ok()) return stopped;  // Terminate() dropped the queue
        uint64_t pos = 0;
        uint32_t len = 0;
        Result<bool> next = NextRecordLocked(&pos, &len);
        if (!next.ok()) return next.status();
        if (!*next) {
          if (Status freed = ReleaseRoomForProducersLocked(); !freed.ok()) return freed;
          return std::nullopt;
        }
        std::memcpy(kind, h->data + pos + 4, 4);
        payload->resize(len);
        if (len > 0) std::memcpy(payload->data(), h->data + pos + kRecordHeader, len);
        h->read += kRecordHeader + Align8(len);
        UpdateTailLocked();
        pthread_cond_broadcast(&h->not_full);
        return Status::OK();
      },
      NoPeer,  // the consumer does not watch its producers: a message or the deadline
      [&] { return Status::DeadlineExceeded(Prefix() + ": no data arrived before the deadline"); },
      [&](int64_t ms) { CondWaitMs(&h->not_empty, &h->mu, ms); });
}

Result<bool> Ring::NextRecordLocked(uint64_t* pos, uint32_t* len) {
  RingHeader* h = header_;
  const uint64_t cap = capacity_;
  while (h->head != h->read) {
    *pos = h->read % cap;
    std::memcpy(len, h->data + *pos, 4);
    if (*len == kWrapMarker) {
      h->read += cap - *pos;
      UpdateTailLocked();
      continue;
    }
    // Only this process writes read and only producers write records, so a
    // record header that does not fit says the segment was overwritten.
    if (*len > MaxPayload(cap) || h->head - h->read < kRecordHeader + Align8(*len)) {
      return Status::Corruption(Prefix() + ": record at offset " + std::to_string(*pos) + " claims " +
                                std::to_string(*len) + " bytes");
    }
    return true;
  }
  return false;
}

// Everything is read, yet a producer waits for room: the room it needs is pinned by this
// reader's leases (below the revoke bound the reader keeps, a message that must wrap past the
// ring's end can need more than what is free).  Neither side would move until a deadline, so
// the reader revokes its leases (their bytes stay, in private pages) and the producer goes on.
Status Ring::ReleaseRoomForProducersLocked() {
  const RingHeader* h = header_;
  if (h->waiting_need == 0 || book_->entries.empty()) return Status::OK();
  if (capacity_ - (h->head - h->tail) >= h->waiting_need) return Status::OK();  // it fits: the producer wakes
  return RevokeLeasesLocked();
}

void Ring::UpdateTailLocked() {
  const RingLease::Book& b = *book_;
  header_->tail = b.entries.empty() ? header_->read : b.entries.front().start;
}

Status Ring::ReadLease(std::shared_ptr<const RingLease>* out, Deadline deadline) {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RingHeader* h = header_;
  RingLease::Book& b = *book_;
  RobustLock lock(&h->mu);
  return WaitShared(
      deadline, kLivenessCheck,
      [&]() -> std::optional<Status> {
        if (Status stopped = StoppedLocked(); !stopped.ok()) return stopped;  // Terminate() dropped the queue
        uint64_t pos = 0;
        uint32_t len = 0;
        Result<bool> next = NextRecordLocked(&pos, &len);
        if (!next.ok()) return next.status();
        if (!*next) {
          if (Status freed = ReleaseRoomForProducersLocked(); !freed.ok()) return freed;
          return std::nullopt;
        }
        if (!b.view) {
          // A second mapping of the same pages (mremap(2) with old_size 0), so
          // that RevokeLeases can swap pages under leases without touching the
          // ring's own mapping.
          const size_t size = PageRound(mapping_->size());
          void* p = ::mremap(mapping_->data(), 0, size, MREMAP_MAYMOVE);
          if (p == MAP_FAILED) return Status::FromErrno(errno, Prefix() + ": mapping a lease view");
          b.view = std::make_shared<RingLease::View>();
          b.view->base = static_cast<uint8_t*>(p);
          b.view->size = size;
          HookViewLocked();
        }
        auto lease = std::shared_ptr<RingLease>(new RingLease());
        lease->book_ = book_;
        lease->view_ = b.view;
        lease->generation_ = b.generation;
        lease->index_ = b.first + b.entries.size();
        std::memcpy(&lease->kind_, h->data + pos + 4, 4);
        const size_t data_offset = static_cast<size_t>(h->data - reinterpret_cast<uint8_t*>(h));
        lease->payload_ = std::span<const uint8_t>(b.view->base + data_offset + pos + kRecordHeader, len);
        const uint64_t record = kRecordHeader + Align8(len);
        b.entries.push_back({h->read, h->read + record, false});
        h->read += record;
        UpdateTailLocked();
        pthread_cond_broadcast(&h->not_full);
        *out = std::move(lease);
        return Status::OK();
      },
      NoPeer,  // the consumer does not watch its producers: a message or the deadline
      [&] { return Status::DeadlineExceeded(Prefix() + ": no data arrived before the deadline"); },
      [&](int64_t ms) { CondWaitMs(&h->not_empty, &h->mu, ms); });
}

uint64_t Ring::pinned_bytes() {
  Call call(this);
  if (!call.ok()) return 0;
  RobustLock lock(&header_->mu);
  return book_->entries.empty() ? 0 : header_->read - book_->entries.front().start;
}

namespace {
// Replaces the pages of `base` covering bytes [from, to) with private copies
// of themselves, in one step (mremap over them), so readers of those
// addresses on other threads see the same bytes throughout.
Status Privatize(uint8_t* base, size_t from, size_t to) {
  const size_t lo = from & ~(PageSize() - 1);
  const size_t len = PageRound(to) - lo;
  void* copy = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED) return Status::FromErrno(errno, "mmap of a lease copy");
  std::memcpy(copy, base + lo, len);
  if (::mremap(copy, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, base + lo) == MAP_FAILED) {
    const int err = errno;
    ::munmap(copy, len);
    return Status::FromErrno(err, "mremap of a lease copy");
  }
  return Status::OK();
}
}  // namespace

void Ring::HookViewLocked() {
  RingLease::View& v = *book_->view;
  if (!view_hooks_.on_map || v.unhook) return;
  Status st = view_hooks_.on_map(v.base, v.size);
  if (st.ok()) {
    v.unhook = view_hooks_.on_unmap;
  } else if (!view_hook_failed_) {
    view_hook_failed_ = true;
    EMBER_LOG(WARN) << Prefix() << ": a lease view was left as it is: " << st.ToString();
  }
}

Status Ring::SetViewHooks(ViewHooks hooks) {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RobustLock lock(&header_->mu);
  if (book_->view) book_->view->Unhook();
  view_hooks_ = std::move(hooks);
  view_hook_failed_ = false;
  if (book_->view) HookViewLocked();
  return Status::OK();
}

void Ring::ClearViewHooks() {
  Call call(this);
  if (!call.ok()) return;
  RobustLock lock(&header_->mu);
  if (book_->view) book_->view->Unhook();
  view_hooks_ = {};
}

Status Ring::RevokeLeases() {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RobustLock lock(&header_->mu);
  return RevokeLeasesLocked();
}

Status Ring::RevokeLeasesLocked() {
  RingHeader* h = header_;
  const uint64_t cap = capacity_;
  RingLease::Book& b = *book_;
  if (b.entries.empty()) return Status::OK();
  // Every current lease lies in [start, read): at most two pieces of the data area.
  const uint64_t start = b.entries.front().start % cap;
  const uint64_t n = h->read - b.entries.front().start;
  const size_t data_offset = static_cast<size_t>(h->data - reinterpret_cast<uint8_t*>(h));
  const uint64_t first_end = std::min<uint64_t>(cap, start + n);
  b.view->Unhook();  // before its pages are swapped: a device must not keep the old ones
  EMBER_RETURN_NOT_OK(Privatize(b.view->base, data_offset + start, data_offset + first_end));
  if (start + n > cap) EMBER_RETURN_NOT_OK(Privatize(b.view->base, data_offset, data_offset + (start + n - cap)));
  b.view.reset();  // later leases get a fresh view; the old one lives on in its leases
  ++b.generation;
  b.first = 0;
  b.entries.clear();
  UpdateTailLocked();
  pthread_cond_broadcast(&h->not_full);
  return Status::OK();
}

void Ring::Abort(const std::string& reason) {
  Call call(this);
  if (!call.ok()) return;
  RobustLock lock(&header_->mu);
  if (header_->aborted == kRunning) {
    header_->aborted = kAborted;
    SetReason(header_, reason);
  }
  pthread_cond_broadcast(&header_->not_full);
  pthread_cond_broadcast(&header_->not_empty);
}

Status Ring::Health() {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RingHeader* h = header_;
  RobustLock lock(&h->mu);
  EMBER_RETURN_NOT_OK(StoppedLocked());
  if (std::optional<Status> gone = ConsumerGoneLocked()) return *gone;
  return Status::OK();
}

void Ring::SetMark(uint64_t mark) {
  Call call(this);
  if (!call.ok()) return;
  RobustLock lock(&header_->mu);
  if (mark > header_->mark) header_->mark = mark;
}

Status Ring::Progress(RingProgress* progress) {
  EMBER_RETURN_NOT_OK(Health());
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RobustLock lock(&header_->mu);
  progress->mark = header_->mark;
  progress->read = header_->read;
  return Status::OK();
}

void Ring::Terminate() {
  Call call(this);
  if (!call.ok()) return;
  RobustLock lock(&header_->mu);
  header_->terminated = 1;
  header_->read = header_->head;  // drop what is queued
  UpdateTailLocked();
  // Producers and a consumer blocked in Read/ReadLease (on this thread or another: the
  // flag is set under mu, which every wait re-checks before it sleeps) wake and return
  // Cancelled.
  pthread_cond_broadcast(&header_->not_full);
  pthread_cond_broadcast(&header_->not_empty);
}

void Ring::Close() {
  MutexLock lock(&close_mu_);
  if (closed_) return;
  closed_ = true;
  if (!mapping_ || !mapping_->valid()) return;  // moved-from parts: nothing mapped
  RingHeader* h = header_;
  closing_ = true;  // no new call touches the segment from here on
  {
    // Every wait below re-checks closing_ under h->mu before it sleeps, so
    // this broadcast cannot slip in between a check and a wait.
    RobustLock shared(&h->mu);
    // Producers elsewhere: the consumer is gone (each words it: RingWords::closed).
    // A ring its consumer terminated stays terminated, so producers keep
    // skipping it quietly (Cancelled) instead of failing on a consumer that
    // ended on purpose.
    if (segment_.owner() && h->aborted == kRunning && !h->terminated) h->aborted = kClosedByConsumer;
    pthread_cond_broadcast(&h->not_full);
    pthread_cond_broadcast(&h->not_empty);
  }
  for (int n = in_flight_.load(); n != 0; n = in_flight_.load()) in_flight_.wait(n);
  {
    // Leases outlive the Ring but must not pin the ring for whoever reads it
    // next (another consumer of the same ring): detach them now.
    RobustLock shared(&h->mu);
    Status st = RevokeLeasesLocked();
    if (!st.ok()) {
      EMBER_LOG(WARN) << Prefix() << ": leases kept pinned at Close: " << st.ToString();
    }
  }
  (void)segment_.Unlink();
  if (session_held_) {
    if (session_thread_ == std::this_thread::get_id()) {
      session_held_ = false;
      pthread_mutex_unlock(&h->session_mu);
      RobustLock shared(&h->mu);
      pthread_cond_broadcast(&h->not_full);
    } else {
      // glibc keeps a locked robust mutex on its owner thread's list and
      // writes to it when that thread locks or exits: never unmap it.
      EMBER_LOG(WARN) << Prefix() << " closed while another thread holds its session lock; "
                      << "the mapping is kept until the process exits";
      (void)mapping_->Leak();
      return;
    }
  }
  // Unmaps now unless leases still hold the mapping (their Book keeps it):
  // then the last lease to go unmaps it.
  book_.reset();
  mapping_.reset();
}

}  // namespace ember::shm
