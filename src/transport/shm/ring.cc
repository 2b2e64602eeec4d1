#include "transport/shm/ring.h"

#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <ctime>

#include "common/fd.h"

namespace ember::shm {

namespace {
constexpr uint64_t kMagic = 0x31474e4952424d45ull;  // "EMBRING1"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kWrapMarker = 0xffffffffu;  // rest of the ring up to its end is unused
constexpr size_t kRecordHeader = 8;           // u32 payload length, u32 kind
constexpr size_t kMinCapacity = 4096;
constexpr size_t kReasonBytes = 256;
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

Ring::Ring(std::string name, bool owner, RingHeader* header, size_t mapped_bytes)
    : name_(std::move(name)), owner_(owner), header_(header), mapped_bytes_(mapped_bytes) {}

Ring::~Ring() { Close(); }

size_t Ring::capacity() const { return header_ ? header_->capacity : 0; }

Result<std::unique_ptr<Ring>> Ring::Create(const std::string& name, size_t capacity) {
  capacity = Align8(capacity);
  if (capacity < kMinCapacity) {
    return Status::InvalidArgument("feed ring " + name + ": capacity " + std::to_string(capacity) +
                                   " is below the minimum of 4096 bytes");
  }
  Fd fd(shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) return Status::AlreadyExists("feed ring " + name + " already exists");
    return Status::FromErrno(errno, "shm_open(" + name + ")");
  }
  const size_t bytes = sizeof(RingHeader) + capacity;
  if (ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    Status st = Status::FromErrno(errno, "ftruncate feed ring " + name + " to " + std::to_string(bytes) + " bytes");
    shm_unlink(name.c_str());
    return st;
  }
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mem == MAP_FAILED) {
    Status st = Status::FromErrno(errno, "mmap feed ring " + name);
    shm_unlink(name.c_str());
    return st;
  }
  auto* h = static_cast<RingHeader*>(mem);
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
  return std::unique_ptr<Ring>(new Ring(name, /*owner=*/true, h, bytes));
}

Result<std::unique_ptr<Ring>> Ring::Open(const std::string& name) {
  Fd fd(shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) {
    if (errno == ENOENT) return Status::NotFound("feed ring " + name + " does not exist (has the node started?)");
    return Status::FromErrno(errno, "shm_open(" + name + ")");
  }
  struct stat st;
  if (fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "fstat feed ring " + name);
  const size_t bytes = static_cast<size_t>(st.st_size);
  if (bytes < sizeof(RingHeader) + kMinCapacity) {
    return Status::Corruption("feed ring " + name + " is " + std::to_string(bytes) + " bytes, too small to be a ring");
  }
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mem == MAP_FAILED) return Status::FromErrno(errno, "mmap feed ring " + name);
  auto* h = static_cast<RingHeader*>(mem);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->magic != kMagic || h->version != kVersion || sizeof(RingHeader) + h->capacity != bytes) {
    munmap(mem, bytes);
    return Status::Corruption("feed ring " + name + " is not an Ember feed ring of version " +
                              std::to_string(kVersion));
  }
  return std::unique_ptr<Ring>(new Ring(name, /*owner=*/false, h, bytes));
}

Status Ring::Write(uint32_t kind, std::span<const uint8_t> payload, Deadline deadline) {
  if (header_ == nullptr) return Status::Aborted("feed ring " + name_ + " is closed");
  RingHeader* h = header_;
  const uint64_t cap = h->capacity;
  if (payload.size() > MaxPayload(cap)) {
    return Status::InvalidArgument("feed message of " + std::to_string(payload.size()) +
                                   " bytes exceeds the ring's limit of " + std::to_string(MaxPayload(cap)) +
                                   " bytes (" + name_ + "); send smaller batches");
  }
  const uint64_t record = kRecordHeader + Align8(payload.size());
  RobustLock lock(&h->mu);
  for (;;) {
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
      uint8_t* dst = h->data + h->head % cap;
      const uint32_t len = static_cast<uint32_t>(payload.size());
      std::memcpy(dst, &len, 4);
      std::memcpy(dst + 4, &kind, 4);
      if (!payload.empty()) std::memcpy(dst + kRecordHeader, payload.data(), payload.size());
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
  if (header_ == nullptr) return Status::Aborted("feed ring " + name_ + " is closed");
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
      return Status::OK();
    }
    RobustLock lock(&h->mu);
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
  if (header_ == nullptr || !session_held_) return;
  session_held_ = false;
  pthread_mutex_unlock(&header_->session_mu);
  RobustLock lock(&header_->mu);
  pthread_cond_broadcast(&header_->not_full);
}

Status Ring::Read(uint32_t* kind, std::vector<uint8_t>* payload, Deadline deadline) {
  if (header_ == nullptr) return Status::Aborted("feed ring " + name_ + " is closed");
  RingHeader* h = header_;
  const uint64_t cap = h->capacity;
  RobustLock lock(&h->mu);
  for (;;) {
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
  if (header_ == nullptr) return;
  RobustLock lock(&header_->mu);
  if (!header_->aborted) {
    header_->aborted = 1;
    SetReason(header_, reason);
  }
  pthread_cond_broadcast(&header_->not_full);
  pthread_cond_broadcast(&header_->not_empty);
}

Status Ring::Health() {
  if (header_ == nullptr) return Status::Aborted("feed ring " + name_ + " is closed");
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
  if (header_ == nullptr) return;
  RobustLock lock(&header_->mu);
  header_->terminated = 1;
  header_->tail = header_->head;  // drop what is queued
  pthread_cond_broadcast(&header_->not_full);
}

void Ring::Close() {
  if (header_ == nullptr) return;
  // A locked robust mutex must not outlive its mapping: glibc's robust list
  // would write to unmapped memory.
  UnlockSession();
  if (owner_) {
    Abort("the node closed its feed");
    shm_unlink(name_.c_str());
  }
  munmap(header_, mapped_bytes_);
  header_ = nullptr;
}

}  // namespace ember::shm
