#include "transport/shm/ring.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/logging.h"

namespace ember::shm {

namespace {
constexpr uint64_t kMagic = 0x31474e4952424d45ull;  // "EMBRING1"
constexpr uint32_t kVersion = 2;  // 2: 1 KiB abort reason
constexpr uint32_t kWrapMarker = 0xffffffffu;  // rest of the ring up to its end is unused
constexpr size_t kRecordHeader = 8;           // u32 payload length, u32 kind
constexpr size_t kMinCapacity = 4096;
constexpr size_t kReasonBytes = 1024;  // who failed and why (the last line of a traceback)
// Blocked waits wake this often to check that the peer process is alive.
constexpr int64_t kLivenessCheckMs = 100;

size_t Align8(size_t n) { return (n + 7) & ~size_t{7}; }
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
  uint64_t tail;              // next byte the consumer reads  (guarded by mu)
  int64_t consumer_pid;
  uint32_t aborted;           // guarded by mu
  uint32_t terminated;        // guarded by mu
  char abort_reason[kReasonBytes];
  alignas(64) uint8_t data[];
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

// Waits on `cv` until woken, `deadline`, or the next liveness check.
void TimedWait(pthread_cond_t* cv, pthread_mutex_t* mu, const Deadline& deadline) {
  int64_t wait_ms = kLivenessCheckMs;
  if (!deadline.infinite()) wait_ms = std::min<int64_t>(wait_ms, deadline.remaining().count());
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += (wait_ms % 1000) * 1000000;
  ts.tv_sec += wait_ms / 1000 + ts.tv_nsec / 1000000000;
  ts.tv_nsec %= 1000000000;
  if (pthread_cond_timedwait(cv, mu, &ts) == EOWNERDEAD) pthread_mutex_consistent(mu);
}

bool ProcessAlive(int64_t pid) { return pid <= 0 || kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH; }

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

Ring::Ring(std::string name, SharedMemory segment, Mapping mapping)
    : name_(std::move(name)),
      segment_(std::move(segment)),
      mapping_(std::move(mapping)),
      header_(static_cast<RingHeader*>(mapping_.data())),
      capacity_(header_->capacity) {}

Ring::~Ring() { Close(); }

size_t Ring::capacity() const { return capacity_; }

Status Ring::ClosedStatus() const { return Status::Aborted("feed ring " + name_ + " is closed"); }

Result<std::unique_ptr<Ring>> Ring::Create(const std::string& name, size_t capacity) {
  capacity = Align8(capacity);
  if (capacity < kMinCapacity) {
    return Status::InvalidArgument("feed ring " + name + ": capacity " + std::to_string(capacity) +
                                   " is below the minimum of 4096 bytes");
  }
  const size_t bytes = sizeof(RingHeader) + capacity;
  Result<SharedMemory> created = SharedMemory::Create(name, bytes);
  if (!created.ok()) {
    if (created.status().code() == StatusCode::kAlreadyExists) {
      return Status::AlreadyExists("feed ring " + name + " already exists");
    }
    return created.status();
  }
  SharedMemory segment = created.MoveValueUnsafe();  // unlinks the name if we fail below
  EMBER_ASSIGN_OR_RAISE(Mapping mapping, Mapping::Map(segment.fd(), bytes, "feed ring " + name));
  (void)segment.Close();  // the mapping keeps the memory; only the name is still needed
  auto* h = static_cast<RingHeader*>(mapping.data());
  h->version = kVersion;
  h->capacity = capacity;
  h->head = h->tail = 0;
  h->consumer_pid = getpid();
  h->aborted = 0;
  h->terminated = 0;
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
  return std::unique_ptr<Ring>(new Ring(name, std::move(segment), std::move(mapping)));
}

Result<std::unique_ptr<Ring>> Ring::Open(const std::string& name) {
  Result<SharedMemory> opened = SharedMemory::Open(name);
  if (!opened.ok()) {
    if (opened.status().code() == StatusCode::kNotFound) {
      return Status::NotFound("feed ring " + name + " does not exist (has the node started?)");
    }
    return opened.status();
  }
  SharedMemory segment = opened.MoveValueUnsafe();
  const size_t bytes = segment.size();
  if (bytes < sizeof(RingHeader) + kMinCapacity) {
    return Status::Corruption("feed ring " + name + " is " + std::to_string(bytes) + " bytes, too small to be a ring");
  }
  EMBER_ASSIGN_OR_RAISE(Mapping mapping, Mapping::Map(segment.fd(), bytes, "feed ring " + name));
  (void)segment.Close();
  auto* h = static_cast<RingHeader*>(mapping.data());
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kMagic || h->version != kVersion || sizeof(RingHeader) + h->capacity != bytes) {
    return Status::Corruption("feed ring " + name + " is not an Ember feed ring of version " +
                              std::to_string(kVersion));
  }
  return std::unique_ptr<Ring>(new Ring(name, std::move(segment), std::move(mapping)));
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
    return Status::InvalidArgument("feed message of " + std::to_string(size) +
                                   " bytes exceeds the ring's limit of " + std::to_string(MaxPayload(cap)) +
                                   " bytes (" + name_ + "); send smaller batches");
  }
  const uint64_t record = kRecordHeader + Align8(size);
  RobustLock lock(&h->mu);
  for (;;) {
    if (closing_) return ClosedStatus();
    if (h->aborted) return Status::Aborted("feed ring " + name_ + ": " + h->abort_reason);
    if (h->terminated) return Status::Cancelled("feed ring " + name_ + ": the node terminated its feed");
    const uint64_t pos = h->head % cap;
    const uint64_t to_end = cap - pos;
    // A record never straddles the end: if it does not fit, a wrap marker
    // fills the rest and the record starts at offset 0.
    const uint64_t needed = record <= to_end ? record : to_end + record;
    if (cap - (h->head - h->tail) >= needed) {
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
    }
    if (!ProcessAlive(h->consumer_pid)) {
      return Status::Aborted("feed ring " + name_ + ": the node process (pid " + std::to_string(h->consumer_pid) +
                             ") that reads it has exited");
    }
    if (deadline.expired()) {
      return Status::DeadlineExceeded("feed ring " + name_ + " stayed full until the deadline: the node (pid " +
                                      std::to_string(h->consumer_pid) +
                                      ") is not consuming its feed; raise feed_timeout or check the node's log");
    }
    TimedWait(&h->not_full, &h->mu, deadline);
  }
}

Status Ring::LockSession(Duration idle_timeout) {
  Call call(this);
  if (!call.ok()) return ClosedStatus();
  RingHeader* h = header_;
  uint64_t last_tail;
  {
    RobustLock lock(&h->mu);
    last_tail = h->tail;
  }
  if (session_held_) return Status::Internal("feed ring " + name_ + ": LockSession() called twice");
  Deadline deadline = Deadline::After(idle_timeout);
  for (;;) {
    {
      RobustLock lock(&h->mu);
      if (closing_) return ClosedStatus();
      if (h->aborted) return Status::Aborted("feed ring " + name_ + ": " + h->abort_reason);
      if (h->terminated) return Status::Cancelled("feed ring " + name_ + ": the node terminated its feed");
    }
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
    RobustLock lock(&h->mu);
    if (closing_) return ClosedStatus();
    if (h->tail != last_tail) {  // the node is consuming: keep waiting
      last_tail = h->tail;
      deadline = Deadline::After(idle_timeout);
    }
    if (!ProcessAlive(h->consumer_pid)) {
      return Status::Aborted("feed ring " + name_ + ": the node process (pid " + std::to_string(h->consumer_pid) +
                             ") that reads it has exited");
    }
    if (deadline.expired()) {
      return Status::DeadlineExceeded("feed ring " + name_ + ": another feeding task held the node's session for " +
                                      FormatDuration(idle_timeout) + " while the node consumed nothing");
    }
    // Session holders signal not_full whenever the consumer frees room;
    // the liveness tick bounds the wait otherwise.
    TimedWait(&h->not_full, &h->mu, deadline);
  }
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
  const uint64_t cap = capacity_;
  RobustLock lock(&h->mu);
  for (;;) {
    if (closing_) return ClosedStatus();
    if (h->aborted) return Status::Aborted("feed ring " + name_ + ": " + h->abort_reason);
    if (h->head != h->tail) {
      uint64_t pos = h->tail % cap;
      uint32_t len;
      std::memcpy(&len, h->data + pos, 4);
      if (len == kWrapMarker) {
        h->tail += cap - pos;
        continue;
      }
      // Only this process writes tail and only producers write records, so a
      // record header that does not fit says the segment was overwritten.
      if (len > MaxPayload(cap) || h->head - h->tail < kRecordHeader + Align8(len)) {
        return Status::Corruption("feed ring " + name_ + ": record at offset " + std::to_string(pos) +
                                  " claims " + std::to_string(len) + " bytes");
      }
      std::memcpy(kind, h->data + pos + 4, 4);
      payload->resize(len);
      if (len > 0) std::memcpy(payload->data(), h->data + pos + kRecordHeader, len);
      h->tail += kRecordHeader + Align8(len);
      pthread_cond_broadcast(&h->not_full);
      return Status::OK();
    }
    if (deadline.expired()) {
      return Status::DeadlineExceeded("feed ring " + name_ + ": no data arrived before the deadline");
    }
    TimedWait(&h->not_empty, &h->mu, deadline);
  }
}

void Ring::Abort(const std::string& reason) {
  Call call(this);
  if (!call.ok()) return;
  RobustLock lock(&header_->mu);
  if (!header_->aborted) {
    header_->aborted = 1;
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
  if (h->aborted) return Status::Aborted("feed ring " + name_ + ": " + h->abort_reason);
  if (h->terminated) return Status::Cancelled("feed ring " + name_ + ": the node terminated its feed");
  if (!ProcessAlive(h->consumer_pid)) {
    return Status::Aborted("feed ring " + name_ + ": the node process (pid " + std::to_string(h->consumer_pid) +
                           ") that reads it has exited");
  }
  return Status::OK();
}

void Ring::Terminate() {
  Call call(this);
  if (!call.ok()) return;
  RobustLock lock(&header_->mu);
  header_->terminated = 1;
  header_->tail = header_->head;  // drop what is queued
  pthread_cond_broadcast(&header_->not_full);
}

void Ring::Close() {
  MutexLock lock(&close_mu_);
  if (closed_) return;
  closed_ = true;
  if (!mapping_.valid()) return;  // moved-from parts: nothing mapped
  RingHeader* h = header_;
  closing_ = true;  // no new call touches the segment from here on
  {
    // Every wait below re-checks closing_ under h->mu before it sleeps, so
    // this broadcast cannot slip in between a check and a wait.
    RobustLock shared(&h->mu);
    if (segment_.owner() && !h->aborted) {  // producers elsewhere: the node is gone
      h->aborted = 1;
      SetReason(h, "the node closed its feed");
    }
    pthread_cond_broadcast(&h->not_full);
    pthread_cond_broadcast(&h->not_empty);
  }
  for (int n = in_flight_.load(); n != 0; n = in_flight_.load()) in_flight_.wait(n);
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
      EMBER_LOG(WARN) << "feed ring " << name_ << " closed while another thread holds its session lock; "
                      << "the mapping is kept until the process exits";
      (void)mapping_.Leak();
      return;
    }
  }
  (void)mapping_.Close();
}

}  // namespace ember::shm
