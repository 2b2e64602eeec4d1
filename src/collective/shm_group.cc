#include "collective/shm_group.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <new>
#include <thread>

#include "collective/reduce.h"
#include "transport/shm/wait.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace ember::collective {
namespace {

constexpr uint64_t kMagic = 0x314d48535245424dull;  // "MBERSHM1"
constexpr uint32_t kVersion = 1;
constexpr size_t kReasonBytes = 1024;
constexpr size_t kPage = 4096;
constexpr int kMaxSize = 256;
constexpr Duration kSlice{50};  // longest sleep between looks at abort, liveness, deadline

// Header::abort_state
constexpr uint32_t kNotAborted = 0, kAbortWriting = 1, kAborted = 2;
using shm_group_internal::kInGroup;
using shm_group_internal::kLeftClosed;
using shm_group_internal::kLeftFailed;
using shm_group_internal::PeerSeen;

size_t RoundUp(size_t v, size_t m) { return (v + m - 1) / m * m; }

void Pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// memcpy that accepts null pointers when there is nothing to copy (a
// zero-element call may pass null buffers).
void Copy(void* dst, const void* src, size_t n) {
  if (n != 0) std::memcpy(dst, src, n);
}

// The cores this process may run on (its CPU affinity: a container's or
// taskset's limit, not the machine's).
unsigned UsableCores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return static_cast<unsigned>(std::max(1, CPU_COUNT(&set)));
  return std::max(1u, std::thread::hardware_concurrency());
}

bool Reached(uint32_t counter, uint32_t target) { return static_cast<int32_t>(counter - target) >= 0; }

// FNV-1a over allgather's per-rank counts: ranks passing different counts
// with the same total would otherwise take different steps.
uint64_t HashCounts(std::span<const uint64_t> counts) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint64_t c : counts) {
    for (int i = 0; i < 8; ++i) h = (h ^ ((c >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  }
  return h;
}

// A CallDesc as it sits in shared memory (plain bytes, fixed layout).
struct SlotDesc {
  uint64_t seq;
  uint64_t count;
  uint64_t extra;  // allgather: HashCounts
  int32_t root;
  uint8_t kind, dtype, op, pad;
};
static_assert(sizeof(SlotDesc) == 32);

SlotDesc ToSlot(const CallDesc& d, uint64_t extra) {
  return SlotDesc{d.seq, d.count, extra, d.root, static_cast<uint8_t>(d.kind), static_cast<uint8_t>(d.dtype),
                  static_cast<uint8_t>(d.op), 0};
}

CallDesc FromSlot(const SlotDesc& s) {
  CallDesc d;
  d.seq = s.seq;
  d.count = s.count;
  d.root = s.root;
  d.kind = static_cast<Kind>(s.kind);
  d.dtype = static_cast<DataType>(s.dtype);
  d.op = static_cast<ReduceOp>(s.op);
  return d;
}

}  // namespace

struct ShmGroup::Header {
  std::atomic<uint64_t> magic;  // stored last (release) by the creator
  uint32_t version;
  int32_t size;
  uint64_t buffer_bytes;
  uint64_t total_bytes;
  std::atomic<uint32_t> abort_state;
  int32_t abort_rank;
  char abort_reason[kReasonBytes];
};

struct alignas(128) ShmGroup::Slot {
  std::atomic<uint32_t> arrived;
  std::atomic<uint32_t> waiters;
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> left;
  std::atomic<uint32_t> left_step;  // the step the rank was in when it left (written before `left`)
  SlotDesc desc[2];
};

struct ShmGroup::Call {
  const CallDesc* desc;  // null while connecting
  Deadline deadline;
  Deadline::Clock::time_point start;
  uint64_t extra = 0;
  bool first = true;  // the next step is the call's first
};

namespace {
size_t HeaderBytes() { return kPage; }
size_t SlotsBytes(int size) { return RoundUp(static_cast<size_t>(size) * 128, kPage); }
size_t TotalBytes(int size, size_t buffer_bytes) {
  return HeaderBytes() + SlotsBytes(size) + static_cast<size_t>(size) * 2 * buffer_bytes;
}
}  // namespace

ShmGroup::ShmGroup(const ShmGroupOptions& o, SharedMemory shm, Mapping mapping, size_t buffer_bytes)
    : name_(o.name),
      rank_(o.rank),
      size_(o.size),
      rank_names_(o.rank_names),
      buffer_bytes_(buffer_bytes),
      // Spin only when every rank can have a core; oversubscribed, a spinning
      // waiter steals the time of the rank it waits for.
      spin_(static_cast<unsigned>(o.size) <= std::max(1u, std::thread::hardware_concurrency()) ? 4000 : 50),
      shm_(std::move(shm)),
      mapping_(std::move(mapping)),
      srcs_(static_cast<size_t>(o.size)),
      slice_srcs_(static_cast<size_t>(o.size)),
      workers_(o.threads > 0 ? std::min(o.threads, kMaxThreads) : AutoThreads(o.size, UsableCores())) {
  static_assert(sizeof(Header) <= kPage && sizeof(Slot) == 128);
  static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);
  char* base = static_cast<char*>(mapping_.data());
  header_ = reinterpret_cast<Header*>(base);
  slots_ = reinterpret_cast<Slot*>(base + HeaderBytes());
  data_ = base + HeaderBytes() + SlotsBytes(size_);
}

int ShmGroup::AutoThreads(int size, unsigned cores) {
  if (size <= 1) return 1;  // a group of one moves no data between ranks
  return std::clamp(static_cast<int>(cores) / size, 1, kMaxThreads);
}

template <typename Fn>
void ShmGroup::ForPieces(size_t count, size_t es, Fn fn) {
  const int t = workers_.threads();
  if (t <= 1 || count * es < kParallelBytes) return fn(size_t{0}, count);
  workers_.Run(t, [&](int i) {
    const Workers::Range r = Workers::Split(count, t, i, 64 / es);  // whole cache lines
    if (r.end > r.begin) fn(r.begin, r.end);
  });
}

void ShmGroup::ParallelCopy(char* dst, const char* src, size_t bytes) {
  ForPieces(bytes, 1, [&](size_t lo, size_t hi) { Copy(dst + lo, src + lo, hi - lo); });
}

void ShmGroup::ParallelReduce(DataType dtype, ReduceOp op, char* dst, const char* const* srcs, size_t count) {
  const size_t es = SizeOf(dtype);
  ForPieces(count, es, [&](size_t lo, size_t hi) {
    std::vector<const void*> piece(static_cast<size_t>(size_));
    for (int k = 0; k < size_; ++k) piece[k] = srcs[k] + lo * es;
    ReduceN(dtype, op, dst + lo * es, piece.data(), size_, hi - lo);
  });
}

template <typename Begin>
void ShmGroup::ParallelGatherSlices(char* dst, uint32_t parity, size_t es, size_t count, Begin begin) {
  ForPieces(count, es, [&](size_t lo, size_t hi) {  // elements [lo, hi), from each slice's owner
    for (int k = 0; k < size_; ++k) {
      const size_t kb = std::max(lo, begin(k)), ke = std::min(hi, begin(k + 1));
      if (kb < ke) Copy(dst + kb * es, Buffer(k, parity) + kb * es, (ke - kb) * es);
    }
  });
}

ShmGroup::~ShmGroup() {
  if (!mapping_.valid()) return;
  Slot& me = slots_[rank_];
  uint32_t expected = kInGroup;
  if (me.left.compare_exchange_strong(expected, kLeftClosed)) shm::FutexWake(&me.arrived);
}

Result<std::unique_ptr<ShmGroup>> ShmGroup::Create(const ShmGroupOptions& options) { return Attach(options, true); }
Result<std::unique_ptr<ShmGroup>> ShmGroup::Open(const ShmGroupOptions& options) { return Attach(options, false); }

Result<std::unique_ptr<ShmGroup>> ShmGroup::Attach(const ShmGroupOptions& o, bool create) {
  if (o.size < 1 || o.size > kMaxSize) {
    return Status::InvalidArgument("shared-memory group: size " + std::to_string(o.size) + " is outside 1.." +
                                   std::to_string(kMaxSize));
  }
  if (o.rank < 0 || o.rank >= o.size) {
    return Status::InvalidArgument("shared-memory group: rank " + std::to_string(o.rank) + " is outside 0.." +
                                   std::to_string(o.size - 1));
  }
  if (o.name.size() < 2 || o.name[0] != '/' || o.name.find('/', 1) != std::string::npos) {
    return Status::InvalidArgument("shared-memory group: bad segment name '" + o.name + "' (want \"/name\")");
  }
  if (!o.rank_names.empty() && o.rank_names.size() != static_cast<size_t>(o.size)) {
    return Status::InvalidArgument("shared-memory group: " + std::to_string(o.rank_names.size()) +
                                   " rank names for " + std::to_string(o.size) + " ranks");
  }
  if (create && o.rank != 0) return Status::InvalidArgument("shared-memory group: only rank 0 creates the segment");

  if (create) {
    const size_t buffer_bytes = RoundUp(std::max<size_t>(o.buffer_bytes, kPage), kPage);
    const size_t total = TotalBytes(o.size, buffer_bytes);
    EMBER_ASSIGN_OR_RAISE(SharedMemory shm, SharedMemory::Create(o.name, total));
    EMBER_ASSIGN_OR_RAISE(Mapping mapping, Mapping::Map(shm.fd(), total, "shared-memory group " + o.name));
    // The segment is zero-filled: construct the atomics in it, then publish.
    char* base = static_cast<char*>(mapping.data());
    Header* h = new (base) Header{};
    h->version = kVersion;
    h->size = o.size;
    h->buffer_bytes = buffer_bytes;
    h->total_bytes = total;
    for (int r = 0; r < o.size; ++r) new (base + HeaderBytes() + static_cast<size_t>(r) * sizeof(Slot)) Slot{};
    h->magic.store(kMagic, std::memory_order_release);
    return std::unique_ptr<ShmGroup>(new ShmGroup(o, std::move(shm), std::move(mapping), buffer_bytes));
  }

  EMBER_ASSIGN_OR_RAISE(SharedMemory shm, SharedMemory::Open(o.name));
  const std::string what = "shared-memory group " + o.name;
  if (shm.size() < HeaderBytes()) return Status::InvalidArgument(what + " is too small to be a group");
  // Map the header first to learn the size, then the whole segment.
  size_t total = 0;
  {
    EMBER_ASSIGN_OR_RAISE(Mapping head, Mapping::Map(shm.fd(), HeaderBytes(), what));
    const Header* h = static_cast<const Header*>(head.data());
    if (h->magic.load(std::memory_order_acquire) != kMagic) {
      return Status::NotFound(what + " is not initialized (yet)");
    }
    if (h->version != kVersion) {
      return Status::InvalidArgument(what + " has version " + std::to_string(h->version) + ", this build " +
                                     std::to_string(kVersion));
    }
    if (h->size != o.size) {
      return Status::InvalidArgument(what + " has " + std::to_string(h->size) + " ranks, expected " +
                                     std::to_string(o.size));
    }
    total = h->total_bytes;
    if (total != TotalBytes(o.size, h->buffer_bytes) || shm.size() < total) {
      return Status::InvalidArgument(what + " has an inconsistent size");
    }
  }
  EMBER_ASSIGN_OR_RAISE(Mapping mapping, Mapping::Map(shm.fd(), total, what));
  const size_t buffer_bytes = static_cast<const Header*>(mapping.data())->buffer_bytes;
  return std::unique_ptr<ShmGroup>(new ShmGroup(o, std::move(shm), std::move(mapping), buffer_bytes));
}

std::string ShmGroup::Describe(int rank) const {
  if (rank >= 0 && static_cast<size_t>(rank) < rank_names_.size()) return rank_names_[static_cast<size_t>(rank)];
  return "rank " + std::to_string(rank);
}

char* ShmGroup::Buffer(int rank, uint32_t parity) const {
  return data_ + (static_cast<size_t>(rank) * 2 + parity) * buffer_bytes_;
}

Status ShmGroup::Connect(Deadline deadline) {
  if (connected_) return Status::OK();
  {
    MutexLock lock(&mu_);
    if (!error_.ok()) return error_;
  }
  slots_[rank_].pid.store(static_cast<int32_t>(getpid()), std::memory_order_relaxed);
  Call call{nullptr, deadline, Deadline::Clock::now()};
  call.first = false;
  Status s = Step(&call);
  if (s.code() == StatusCode::kDeadlineExceeded) {
    std::string missing;
    for (int k = 0; k < size_; ++k) {
      if (Reached(slots_[k].arrived.load(std::memory_order_acquire), 1)) continue;
      missing += (missing.empty() ? "" : ", ") + Describe(k);
    }
    s = Status::DeadlineExceeded("shared-memory group " + name_ + ": " + missing + " did not attach within " +
                                 FormatDuration(std::chrono::round<Duration>(deadline.when() - call.start)));
  }
  if (rank_ == 0) {
    // Every rank has mapped the segment (or will never come): drop the name.
    Status u = shm_.Unlink();
    if (s.ok()) s = u;
  }
  if (!s.ok()) return Fail(s);
  (void)shm_.Close();  // the mapping stays
  connected_ = true;
  return Status::OK();
}

Status ShmGroup::Step(Call* call) {
  const uint32_t t = ++step_;
  in_step_ = true;  // until this step succeeds (see Fail)
  Slot& me = slots_[rank_];
  const bool first = call->first;
  call->first = false;
  if (first) me.desc[t & 1] = ToSlot(*call->desc, call->extra);
  me.arrived.store(t, std::memory_order_seq_cst);
  if (me.waiters.load(std::memory_order_seq_cst) != 0) shm::FutexWake(&me.arrived);
  for (int k = 0; k < size_; ++k) {
    if (k == rank_) continue;
    EMBER_RETURN_NOT_OK(WaitFor(k, t, call));
  }
  if (first) EMBER_RETURN_NOT_OK(CheckDescriptors(*call, t & 1));
  // A rank that arrived and then failed in this very step (it gave up
  // waiting for someone) did not finish the call: neither do we.
  if (header_->abort_state.load(std::memory_order_acquire) == kAborted) return AbortedByPeer();
  for (int k = 0; k < size_; ++k) {
    const Slot& s = slots_[k];
    if (k != rank_ && s.left.load(std::memory_order_acquire) == kLeftFailed &&
        s.left_step.load(std::memory_order_relaxed) == t) {
      return Status::Aborted(Describe(k) + " failed during " +
                             (call->desc ? call->desc->ToString() : std::string("the group's start")) +
                             " and left the group");
    }
  }
  in_step_ = false;
  return Status::OK();
}

Status ShmGroup::CheckDescriptors(const Call& call, uint32_t parity) const {
  for (int k = 0; k < size_; ++k) {
    if (k == rank_) continue;
    const SlotDesc& theirs = slots_[k].desc[parity];
    EMBER_RETURN_NOT_OK(CheckSameCall(*call.desc, Describe(rank_), FromSlot(theirs), Describe(k)));
    if (theirs.extra != call.extra) {
      return Status::InvalidArgument("mismatched collective calls: " + Describe(rank_) + " and " + Describe(k) +
                                     " passed different per-rank counts to " + call.desc->ToString() +
                                     "; every rank must pass the same counts");
    }
  }
  return Status::OK();
}

Status ShmGroup::WaitFor(int k, uint32_t target, const Call* call) {
  Slot& s = slots_[k];
  for (int i = 0; i < spin_; ++i) {
    if (Reached(s.arrived.load(std::memory_order_acquire), target)) return Status::OK();
    Pause();
    if ((i & 255) == 255) sched_yield();
  }
  const std::string what = call->desc ? call->desc->ToString() : "the group's start";
  int32_t pid = 0;
  return shm::WaitShared(
      call->deadline, kSlice,
      // The peer's liveness is part of the look (LookAtPeer orders the reads).
      [&]() -> std::optional<Status> {
        const PeerSeen seen = shm_group_internal::LookAtPeer(
            target, [&] { return s.arrived.load(std::memory_order_acquire); },
            [&] { return s.left.load(std::memory_order_acquire); },
            [&] {
              pid = s.pid.load(std::memory_order_relaxed);
              return shm::ProcessGone(pid);
            });
        if (seen == PeerSeen::kArrived) return Status::OK();
        if (header_->abort_state.load(std::memory_order_acquire) == kAborted) return AbortedByPeer();
        switch (seen) {
          case PeerSeen::kLeftClosed: return Status::Aborted(Describe(k) + " closed the group before " + what);
          case PeerSeen::kLeftFailed: return Status::Aborted(Describe(k) + " failed and left the group before " + what);
          case PeerSeen::kGone:
            return Status::Aborted(Describe(k) + " died (process " + std::to_string(pid) + " is gone) before " + what);
          case PeerSeen::kWaiting:
          case PeerSeen::kArrived: break;
        }
        return std::nullopt;
      },
      shm::NoPeer,
      [&] {
        const auto waited = std::chrono::round<Duration>(call->deadline.when() - call->start);
        return Status::DeadlineExceeded(Describe(k) + " did not reach " + what + " within " +
                                        FormatDuration(waited) + "; it may be stalled, or making a different call");
      },
      [&](int64_t ms) {
        s.waiters.fetch_add(1, std::memory_order_seq_cst);
        const uint32_t v = s.arrived.load(std::memory_order_seq_cst);
        if (!Reached(v, target)) shm::FutexWaitMs(&s.arrived, v, ms);
        s.waiters.fetch_sub(1, std::memory_order_seq_cst);
      });
}

Status ShmGroup::AbortedByPeer() const {
  const int r = header_->abort_rank;
  const char* reason = header_->abort_reason;
  return Status::Aborted(Describe(r) + " aborted: " + std::string(reason, strnlen(reason, kReasonBytes)));
}

Status ShmGroup::Fail(const Status& s) {
  Status first;
  {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = s;
    first = error_;
  }
  failed_.store(true, std::memory_order_release);
  Slot& me = slots_[rank_];
  uint32_t expected = kInGroup;
  // Between steps (a call refused before its first), the rank finished step_
  // and leaves before the next: a peer still finishing step_ must not fail.
  if (me.left.load(std::memory_order_relaxed) == kInGroup) {
    me.left_step.store(in_step_ ? step_ : step_ + 1, std::memory_order_relaxed);
  }
  if (me.left.compare_exchange_strong(expected, kLeftFailed)) shm::FutexWake(&me.arrived);
  return first;
}

void ShmGroup::WakeAll() {
  for (int k = 0; k < size_; ++k) shm::FutexWake(&slots_[k].arrived);
}

void ShmGroup::Abort(const std::string& reason) {
  {
    MutexLock lock(&mu_);
    if (error_.ok()) error_ = Status::Aborted(reason);
  }
  failed_.store(true, std::memory_order_release);
  uint32_t expected = kNotAborted;
  if (header_->abort_state.compare_exchange_strong(expected, kAbortWriting)) {
    header_->abort_rank = rank_;
    const size_t n = std::min(reason.size(), kReasonBytes - 1);
    std::memcpy(header_->abort_reason, reason.data(), n);
    header_->abort_reason[n] = '\0';
    header_->abort_state.store(kAborted, std::memory_order_release);
  }
  WakeAll();
}

template <typename Body>
Status ShmGroup::Run(const CallDesc& desc, Deadline deadline, uint64_t extra, Body body) {
  if (failed_.load(std::memory_order_acquire)) {
    MutexLock lock(&mu_);
    return error_;
  }
  if (!connected_) return Status::Internal("shared-memory group " + name_ + ": call before Connect()");
  if (header_->abort_state.load(std::memory_order_acquire) == kAborted) return Fail(AbortedByPeer());
  if (size_ == 1) return body(nullptr);
  Call call{&desc, deadline, Deadline::Clock::now(), extra};
  Status s = body(&call);
  if (!s.ok()) return Fail(s);
  return Status::OK();
}

Status ShmGroup::Allreduce(const CallDesc& desc, void* data, Deadline deadline) {
  return Run(desc, deadline, 0, [&](Call* call) -> Status {
    if (!call) return Status::OK();
    const size_t es = SizeOf(desc.dtype);
    const size_t total = desc.bytes();
    char* out = static_cast<char*>(data);
    size_t off = 0;
    do {
      const size_t len = std::min(buffer_bytes_, total - off);
      const size_t n = len / es;
      const uint32_t p = NextParity();
      ParallelCopy(Buffer(rank_, p), out + off, len);
      EMBER_RETURN_NOT_OK(Step(call));
      if (len <= kSmallAllreduceBytes) {
        for (int k = 0; k < size_; ++k) srcs_[k] = Buffer(k, p);
        ReduceN(desc.dtype, desc.op, out + off, srcs_.data(), size_, n);
      } else {
        // Slices of whole cache lines; the last ones may be short or empty.
        const size_t line = 64 / es;
        const size_t slice = RoundUp((n + size_ - 1) / size_, line);
        auto begin = [&](int r) { return std::min(n, static_cast<size_t>(r) * slice); };
        const size_t b = begin(rank_), e = begin(rank_ + 1);
        std::vector<const char*>& srcs = slice_srcs_;
        for (int k = 0; k < size_; ++k) srcs[k] = Buffer(k, p) + b * es;
        ParallelReduce(desc.dtype, desc.op, Buffer(rank_, p ^ 1u) + b * es, srcs.data(), e - b);
        EMBER_RETURN_NOT_OK(Step(call));
        ParallelGatherSlices(out + off, p ^ 1u, es, n, begin);
      }
      off += len;
    } while (off < total);
    return Status::OK();
  });
}

Status ShmGroup::Broadcast(const CallDesc& desc, void* data, Deadline deadline) {
  if (desc.root < 0 || desc.root >= size_) {
    return Fail(Status::InvalidArgument("broadcast root " + std::to_string(desc.root) + " is not a rank of a group of " +
                                        std::to_string(size_)));
  }
  return Run(desc, deadline, 0, [&](Call* call) -> Status {
    if (!call) return Status::OK();
    const size_t total = desc.bytes();
    char* buf = static_cast<char*>(data);
    size_t off = 0;
    do {
      const size_t len = std::min(buffer_bytes_, total - off);
      const uint32_t p = NextParity();
      if (rank_ == desc.root) ParallelCopy(Buffer(rank_, p), buf + off, len);
      EMBER_RETURN_NOT_OK(Step(call));
      if (rank_ != desc.root) ParallelCopy(buf + off, Buffer(desc.root, p), len);
      off += len;
    } while (off < total);
    return Status::OK();
  });
}

Status ShmGroup::Allgather(const CallDesc& desc, const void* in, std::span<const uint64_t> counts, void* out,
                           Deadline deadline) {
  const size_t es = SizeOf(desc.dtype);
  uint64_t sum = 0, most = 0;
  for (uint64_t c : counts) {
    sum += c;
    most = std::max(most, c);
  }
  if (counts.size() != static_cast<size_t>(size_) || sum != desc.count) {
    return Fail(Status::InvalidArgument(desc.ToString() + ": " + std::to_string(counts.size()) +
                                        " counts adding up to " + std::to_string(sum) + " for a group of " +
                                        std::to_string(size_)));
  }
  return Run(desc, deadline, HashCounts(counts), [&](Call* call) -> Status {
    if (!call) {
      if (desc.bytes() != 0 && in != out) std::memmove(out, in, desc.bytes());
      return Status::OK();
    }
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    const size_t largest = most * es;
    size_t off = 0;
    do {
      auto piece = [&](int r) {
        const size_t bytes = counts[r] * es;
        return bytes > off ? std::min(buffer_bytes_, bytes - off) : size_t{0};
      };
      const uint32_t p = NextParity();
      Copy(Buffer(rank_, p), src + off, piece(rank_));
      EMBER_RETURN_NOT_OK(Step(call));
      size_t at = 0;
      for (int k = 0; k < size_; ++k) {
        Copy(dst + at + off, Buffer(k, p), piece(k));
        at += counts[k] * es;
      }
      off += buffer_bytes_;
    } while (off < largest);
    return Status::OK();
  });
}

Status ShmGroup::ReduceScatter(const CallDesc& desc, const void* in, void* out, Deadline deadline) {
  return Run(desc, deadline, 0, [&](Call* call) -> Status {
    const size_t es = SizeOf(desc.dtype);
    const char* src = static_cast<const char*>(in);
    char* dst = static_cast<char*>(out);
    if (!call) {
      if (desc.bytes() != 0 && in != out) std::memmove(out, in, desc.bytes());
      return Status::OK();
    }
    // Each buffer holds one piece per rank, every piece cache-line aligned.
    size_t piece_bytes = buffer_bytes_ / size_;
    piece_bytes = piece_bytes >= 64 ? piece_bytes / 64 * 64 : piece_bytes / es * es;
    const size_t chunk = piece_bytes / es;
    const size_t count = desc.count;
    size_t a = 0;
    do {
      const size_t m = std::min(chunk, count - a);
      const uint32_t p = NextParity();
      char* mine = Buffer(rank_, p);
      for (int k = 0; k < size_; ++k) Copy(mine + k * piece_bytes, src + (k * count + a) * es, m * es);
      EMBER_RETURN_NOT_OK(Step(call));
      for (int k = 0; k < size_; ++k) srcs_[k] = Buffer(k, p) + rank_ * piece_bytes;
      ReduceN(desc.dtype, desc.op, dst + a * es, srcs_.data(), size_, m);
      a += m;
    } while (a < count);
    return Status::OK();
  });
}

Status ShmGroup::Barrier(const CallDesc& desc, Deadline deadline) {
  return Run(desc, deadline, 0, [&](Call* call) -> Status { return call ? Step(call) : Status::OK(); });
}

}  // namespace ember::collective
