#include "collective/tcp_ring.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <list>
#include <optional>
#include <thread>

#include "collective/reduce.h"
#include "common/codec.h"
#include "common/logging.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/pending.h"
#include "transport/tcp/socket.h"

namespace ember::collective {
namespace {

constexpr uint16_t kHello = 0x0701;
constexpr uint16_t kHelloAck = 0x0702;
constexpr uint16_t kHelloReject = 0x0703;
constexpr uint16_t kCall = 0x0710;
constexpr uint16_t kData = 0x0711;
constexpr uint16_t kAbort = 0x0712;

constexpr size_t kMaxHelloBytes = 512;
constexpr size_t kMaxAbortBytes = 2048;
constexpr size_t kMaxPendingHandshakes = 8;
constexpr Duration kAbortSendTimeout{200};  // best effort: a stalled peer does not hold us
constexpr size_t kInboxBytes = 64 << 10;
constexpr size_t kDirectReadBytes = 16 << 10;  // larger reads skip the inbox
constexpr int kMaxIov = 32;
constexpr size_t kSendBatchBytes = 1 << 20;

int Mod(int a, int n) { return ((a % n) + n) % n; }

std::string Ms(Deadline::Clock::duration d) {
  return FormatDuration(std::chrono::duration_cast<Duration>(d));
}

void EncodeHeader(uint16_t type, size_t len, std::byte out[tcp::kFrameHeaderBytes]) {
  const uint32_t l = static_cast<uint32_t>(len);
  const uint8_t h[8] = {uint8_t(l), uint8_t(l >> 8), uint8_t(l >> 16), uint8_t(l >> 24),
                        uint8_t(type), uint8_t(type >> 8), uint8_t(tcp::kProtocolVersion),
                        uint8_t(tcp::kProtocolVersion >> 8)};
  std::memcpy(out, h, 8);
}

// Accepts the previous rank during Connect: one thread accepts, one thread
// per accepted connection runs the handshake and reads the hello (at most
// kMaxPendingHandshakes at once: beyond that an older pending one is dropped,
// tcp::PendingHandshakes, so a flood cannot shut the previous rank out).
class PrevAcceptor {
 public:
  PrevAcceptor(int listen_fd, const TcpRingOptions& o, const std::vector<std::string>& names, Deadline deadline)
      : listen_fd_(listen_fd), o_(o), names_(names), deadline_(deadline), pending_(kMaxPendingHandshakes) {}
  ~PrevAcceptor() { Stop(); }

  Status Start() {
    int p[2];
    if (::pipe2(p, O_CLOEXEC | O_NONBLOCK) != 0) return Status::FromErrno(errno, "pipe2");
    wake_r_ = Fd(p[0]);
    wake_w_ = Fd(p[1]);
    accept_thread_ = std::thread([this] { AcceptLoop(); });
    return Status::OK();
  }

  // The authenticated connection from the previous rank, or DeadlineExceeded.
  Result<Fd> Wait(Deadline deadline) {
    MutexLock lock(&mu_);
    while (!prev_.valid()) {
      if (deadline.infinite()) {
        cv_.Wait(&mu_);
      } else if (!cv_.WaitUntil(&mu_, deadline.when())) {
        break;
      }
    }
    if (prev_.valid()) return std::move(prev_);
    return Status::DeadlineExceeded(last_rejection_.empty() ? "" : " (last rejected connection: " + last_rejection_ + ")");
  }

  void Stop() {
    if (!accept_thread_.joinable()) return;
    {
      MutexLock lock(&mu_);
      stopping_ = true;
    }
    pending_.ShutdownAll();  // wakes handshakes in progress
    const char b = 1;
    (void)!::write(wake_w_.get(), &b, 1);
    accept_thread_.join();
    std::list<Worker> workers;
    {
      MutexLock lock(&mu_);
      workers.swap(workers_);
    }
    for (auto& w : workers) w.thread.join();
  }

 private:
  struct Worker {
    std::thread thread;
    bool done = false;
  };

  std::string Who() const { return "tcp ring " + names_[o_.rank]; }

  void AcceptLoop() {
    for (;;) {
      Fd fd = tcp::AcceptUntilWoken(listen_fd_, wake_r_.get(), Who().c_str());
      MutexLock lock(&mu_);
      ReapLocked();
      if (!fd.valid() || stopping_) return;
      const uint64_t id = next_id_++;
      const std::string dropped = pending_.Start(id, fd.get(), tcp::PeerAddress(fd.get()));
      if (!dropped.empty()) {
        const uint64_t n = pending_.dropped();
        if ((n & (n - 1)) == 0) {  // 1, 2, 4, ...: a flood must not flood the log too
          EMBER_LOG(WARN) << Who() << ": dropped the pending handshake of " << dropped
                          << " to admit a newer connection: " << kMaxPendingHandshakes
                          << " were pending (a flood of unauthenticated connections?); " << n << " dropped so far";
        }
      }
      workers_.emplace_back();
      Worker* w = &workers_.back();
      w->thread = std::thread([this, w, id, f = std::move(fd)]() mutable { Handshake(std::move(f), id, w); });
    }
  }

  void ReapLocked() EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (auto it = workers_.begin(); it != workers_.end();) {
      if (it->done) {
        it->thread.join();
        it = workers_.erase(it);
      } else {
        ++it;
      }
    }
  }

  void Handshake(Fd fd, uint64_t id, Worker* self) {
    const std::string peer = tcp::PeerAddress(fd.get());
    bool dropped = false;
    Status s = Admit(fd, peer, id, &dropped);
    if (!s.ok() && !dropped) dropped = pending_.Finish(id);
    MutexLock lock(&mu_);
    if (!s.ok()) {
      if (!stopping_ && !dropped) {
        EMBER_LOG(WARN) << Who() << ": rejected connection from " << peer << ": " << s.message();
        last_rejection_ = peer + ": " + s.ToString();
      }
    }
    if (s.ok()) {
      prev_ = std::move(fd);
      cv_.SignalAll();
    }
    self->done = true;
    // fd (if not handed over) closes here, after it left pending_, so a drop never shuts a reused number.
  }

  // Handshake and hello; OK once the connection is the previous rank's.
  Status Admit(const Fd& fd, const std::string& peer, uint64_t id, bool* dropped) {
    Deadline d = std::min(deadline_, Deadline::After(o_.handshake_timeout));
    // Out of the pending set once the peer proved the secret, before it is told so.
    auto verified = [&]() -> Status {
      *dropped = pending_.Finish(id);
      return *dropped ? Status::Unavailable("dropped from the handshake") : Status::OK();
    };
    EMBER_RETURN_NOT_OK(tcp::ServerHandshake(fd.get(), o_.secret, d, peer, verified));
    EMBER_ASSIGN_OR_RAISE(tcp::Frame f, tcp::ReadFrame(fd.get(), kMaxHelloBytes, d, peer));
    Hello h;
    Status s = f.type == kHello ? DecodeHello(f.payload, &h)
                                : Status::Corruption("expected a hello frame, got type " + std::to_string(f.type));
    const int prev = Mod(o_.rank - 1, o_.size);
    if (s.ok() && (h.size != o_.size || h.ring_id != o_.ring_id || h.from != prev || h.to != o_.rank)) {
      s = Status::InvalidArgument("hello from rank " + std::to_string(h.from) + " of a ring of " +
                                  std::to_string(h.size) + " (id '" + h.ring_id + "') for rank " +
                                  std::to_string(h.to) + "; this is rank " + std::to_string(o_.rank) + " of " +
                                  std::to_string(o_.size) + " (id '" + o_.ring_id + "') expecting rank " +
                                  std::to_string(prev));
    }
    if (s.ok()) {
      MutexLock lock(&mu_);
      if (claimed_ || stopping_) s = Status::AlreadyExists("rank " + std::to_string(prev) + " is already connected");
      claimed_ = true;
    }
    if (!s.ok()) {
      (void)tcp::WriteFrame(fd.get(), kHelloReject, EncodeHello({0, 0, 0, s.message().substr(0, 256)}), d, peer);
      return s;
    }
    return tcp::WriteFrame(fd.get(), kHelloAck, EncodeHello({o_.size, o_.rank, prev, o_.ring_id}), d, peer);
  }

  const int listen_fd_;
  const TcpRingOptions& o_;
  const std::vector<std::string>& names_;
  const Deadline deadline_;
  Fd wake_r_, wake_w_;
  std::thread accept_thread_;

  Mutex mu_;
  CondVar cv_;
  Fd prev_ GUARDED_BY(mu_);
  bool claimed_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t next_id_ = 1;  // the accept thread's only
  tcp::PendingHandshakes pending_;
  std::list<Worker> workers_ GUARDED_BY(mu_);
  std::string last_rejection_ GUARDED_BY(mu_);
};

}  // namespace

// What one call moves: frames this rank sends to next and receives from
// prev, in stream order.  A send waits for the receive it forwards.
struct TcpRing::Plan {
  struct Send {
    const std::byte* p;
    size_t len;
    uint16_t type;
    int dep;  // index into recvs that must be complete first, or -1
  };
  struct Recv {
    std::byte* dst;
    size_t len;
    uint16_t type;
    bool reduce;  // reduce into dst (else copy)
  };
  struct Seg {
    size_t off, len;
  };

  Plan(DataType dtype, ReduceOp op, size_t chunk_bytes) : dtype(dtype), op(op), elem(SizeOf(dtype)) {
    chunk = std::max(elem, chunk_bytes / elem * elem);
    sends.push_back({call_out, kCallDescBytes, kCall, -1});
    recvs.push_back({call_in, kCallDescBytes, kCall, false});
  }

  // Ring steps: at step s this rank sends segment (start - s) and receives
  // segment (start - s - 1), each cut in chunks; chunk c of a send waits for
  // chunk c of the previous step's receive (`deps`, the same segment).
  // Returns the last step's receive indices.
  std::vector<int> AddPass(const std::vector<Seg>& segs, std::byte* base, int start, int steps, bool reduce,
                           std::vector<int> deps) {
    const int n = static_cast<int>(segs.size());
    for (int s = 0; s < steps; ++s) {
      const Seg& out = segs[Mod(start - s, n)];
      for (size_t off = 0, c = 0; off < out.len; off += chunk, ++c) {
        sends.push_back({base + out.off + off, std::min(chunk, out.len - off), kData,
                         c < deps.size() ? deps[c] : -1});
      }
      const Seg& in = segs[Mod(start - s - 1, n)];
      deps.clear();
      for (size_t off = 0; off < in.len; off += chunk) {
        deps.push_back(static_cast<int>(recvs.size()));
        recvs.push_back({base + in.off + off, std::min(chunk, in.len - off), kData, reduce});
      }
    }
    return deps;
  }

  // `count` elements cut in n near-equal segments.
  std::vector<Seg> EvenSegments(size_t count, int n) const {
    std::vector<Seg> segs(n);
    for (int k = 0; k < n; ++k) {
      const size_t b = count * k / n, e = count * (k + 1) / n;
      segs[k] = {b * elem, (e - b) * elem};
    }
    return segs;
  }

  const DataType dtype;
  const ReduceOp op;
  const size_t elem;
  size_t chunk;
  std::byte call_out[kCallDescBytes];
  std::byte call_in[kCallDescBytes];
  std::vector<Send> sends;
  std::vector<Recv> recvs;
};

Result<std::unique_ptr<TcpRing>> TcpRing::Listen(const TcpRingOptions& o) {
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    return Status::InvalidArgument("tcp ring: rank " + std::to_string(o.rank) + " out of range for size " +
                                   std::to_string(o.size));
  }
  if (!o.rank_names.empty() && o.rank_names.size() != static_cast<size_t>(o.size)) {
    return Status::InvalidArgument("tcp ring: " + std::to_string(o.rank_names.size()) + " rank names for " +
                                   std::to_string(o.size) + " ranks");
  }
  if (o.secret.size() < 16) return Status::InvalidArgument("tcp ring: the secret must have at least 16 bytes");
  if (o.ring_id.size() > kMaxRingIdBytes) return Status::InvalidArgument("tcp ring: ring_id over 256 bytes");
  if (o.chunk_bytes < 4096 || o.chunk_bytes > (64u << 20)) {
    return Status::InvalidArgument("tcp ring: chunk_bytes " + std::to_string(o.chunk_bytes) +
                                   " outside 4 KiB .. 64 MiB");
  }
  if (o.handshake_timeout.count() <= 0) return Status::InvalidArgument("tcp ring: handshake_timeout must be positive");
  EMBER_ASSIGN_OR_RAISE(Fd listener, tcp::Listen(o.bind_host, 0));
  EMBER_ASSIGN_OR_RAISE(int port, tcp::LocalPort(listener.get()));
  Fd wake(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!wake.valid()) return Status::FromErrno(errno, "tcp ring: eventfd");
  return std::unique_ptr<TcpRing>(new TcpRing(o, std::move(listener), port, std::move(wake)));
}

TcpRing::TcpRing(const TcpRingOptions& o, Fd listener, int port, Fd wake)
    : options_(o), listener_(std::move(listener)), port_(port), wake_(std::move(wake)) {
  for (int r = 0; r < o.size; ++r) {
    names_.push_back(o.rank_names.empty() ? "rank " + std::to_string(r) : o.rank_names[r]);
  }
}

TcpRing::~TcpRing() = default;

std::string TcpRing::Where() const { return "tcp ring " + names_[options_.rank]; }

Status TcpRing::Connect(const std::vector<std::pair<std::string, int>>& addresses, Deadline deadline) {
  const int n = options_.size;
  if (addresses.size() != static_cast<size_t>(n)) {
    return Status::InvalidArgument(Where() + ": " + std::to_string(addresses.size()) + " addresses for " +
                                   std::to_string(n) + " ranks");
  }
  if (n > 1) {
    const auto start = Deadline::Clock::now();
    PrevAcceptor acceptor(listener_.get(), options_, names_, deadline);
    EMBER_RETURN_NOT_OK(acceptor.Start());
    EMBER_RETURN_NOT_OK(ConnectNext(addresses[next()].first, addresses[next()].second, deadline));
    Result<Fd> prev = acceptor.Wait(deadline);
    acceptor.Stop();
    if (!prev.ok()) {
      return Status::DeadlineExceeded(Where() + ": " + names_[this->prev()] + " did not connect within " +
                                      Ms(Deadline::Clock::now() - start) + prev.status().message());
    }
    recv_fd_ = prev.MoveValueUnsafe();
    inbox_.resize(kInboxBytes);
    staging_.resize(options_.chunk_bytes);
  }
  (void)listener_.Close();
  MutexLock lock(&mu_);
  connected_ = true;
  return error_;
}

Status TcpRing::ConnectNext(const std::string& host, int port, Deadline deadline) {
  const int n = next();
  const std::string who = names_[n] + " at " + host + ":" + std::to_string(port);
  const auto start = Deadline::Clock::now();
  Duration backoff{5};
  Status last;
  for (;;) {
    Result<Fd> fd = tcp::Connect(host, port, deadline);
    if (fd.ok()) {
      const Deadline d = std::min(deadline, Deadline::After(options_.handshake_timeout));
      Status s = tcp::ClientHandshake(fd->get(), options_.secret, d, who);
      if (s.code() == StatusCode::kUnauthenticated) return s.WithContext(Where() + ": connecting to " + who);
      if (s.ok()) s = tcp::WriteFrame(fd->get(), kHello, EncodeHello({options_.size, options_.rank, n, options_.ring_id}), d, who);
      Result<tcp::Frame> reply = s.ok() ? tcp::ReadFrame(fd->get(), kMaxHelloBytes, d, who) : Result<tcp::Frame>(s);
      if (reply.ok()) {
        Hello h;
        s = DecodeHello(reply->payload, &h);
        if (s.ok() && reply->type == kHelloReject) {
          return Status::Unavailable(Where() + ": " + who + " rejected the connection: " + h.ring_id);
        }
        if (s.ok() && (reply->type != kHelloAck || h.size != options_.size || h.from != n ||
                       h.to != options_.rank || h.ring_id != options_.ring_id)) {
          return Status::Unavailable(Where() + ": " + who + " is not " + names_[n] + " of this ring");
        }
        if (s.ok()) {
          send_fd_ = fd.MoveValueUnsafe();
          return Status::OK();
        }
      } else {
        s = reply.status();
      }
      last = s;
    } else {
      last = fd.status();
    }
    if (deadline.expired()) {
      return Status::DeadlineExceeded(Where() + ": could not reach " + who + " within " +
                                      Ms(Deadline::Clock::now() - start) + ": " + last.ToString());
    }
    // Nothing to block on for a peer not yet listening: back off and retry.
    std::this_thread::sleep_for(std::min(backoff, deadline.remaining()));
    backoff = std::min(backoff * 2, Duration(200));
  }
}

Status TcpRing::BeginCall() {
  MutexLock lock(&mu_);
  if (!error_.ok()) return error_;
  if (!connected_) return Status::InvalidArgument(Where() + ": call before Connect()");
  in_call_ = true;
  return Status::OK();
}

Status TcpRing::EndCall(Status status) {
  MutexLock lock(&mu_);
  in_call_ = false;
  if (!abort_payload_.empty() && status.ok()) {
    SendAbort(abort_payload_, true, true, {});  // Abort() came too late for the call to see it
  }
  abort_payload_.clear();
  if (error_.ok() && !status.ok()) error_ = status;
  return error_.ok() ? status : error_;
}

void TcpRing::Abort(const std::string& reason) {
  MutexLock lock(&mu_);
  if (!error_.ok()) return;
  error_ = Status::Aborted(reason);
  const std::string payload = EncodeAbort(Status::Aborted(names_[options_.rank] + " aborted: " + reason), options_.rank);
  if (in_call_) {
    abort_payload_ = payload;
    const uint64_t one = 1;
    (void)!::write(wake_.get(), &one, sizeof(one));
  } else if (connected_ && options_.size > 1) {
    SendAbort(payload, true, true, {});
  }
}

void TcpRing::SendAbort(const std::string& payload, bool to_next, bool to_prev, std::span<const iovec> mid_frame) {
  const Deadline d = Deadline::After(kAbortSendTimeout);
  if (to_next) {
    bool boundary = true;
    for (const iovec& v : mid_frame) {
      boundary = boundary && tcp::WriteAll(send_fd_.get(), v.iov_base, v.iov_len, d, "abort").ok();
    }
    if (boundary) (void)tcp::WriteFrame(send_fd_.get(), kAbort, payload, d, names_[next()]);
  }
  if (to_prev) (void)tcp::WriteFrame(recv_fd_.get(), kAbort, payload, d, names_[prev()]);
  // EOF after the abort frame; the descriptors stay open (closing with
  // unread bytes would reset the connection and could drop the frame).
  ::shutdown(send_fd_.get(), SHUT_WR);
  ::shutdown(recv_fd_.get(), SHUT_WR);
}

Status TcpRing::Run(const CallDesc& desc, Plan& plan, Deadline deadline) {
  {
    codec::Writer w;
    EncodeCallDesc(desc, &w);
    std::memcpy(plan.call_out, w.data().data(), kCallDescBytes);
  }
  const auto start = Deadline::Clock::now();
  const int sfd = send_fd_.get(), rfd = recv_fd_.get();
  const std::string& prev_name = names_[prev()];
  const std::string& next_name = names_[next()];

  size_t si = 0, soff = 0;  // next frame to send, bytes of it sent (header included)
  size_t ri = 0;            // next frame to receive
  std::byte rhdr[8];
  size_t rhave = 0, rgot = 0;  // header bytes, payload bytes of the frame being received
  uint16_t rtype = 0;
  size_t rlen = 0;
  std::byte* rdst = nullptr;
  std::string abort_in;
  std::byte bhdr[8];  // an abort frame arriving backwards from next
  size_t bhave = 0, bgot = 0;
  std::string back;
  bool back_closed = false;
  bool timed_out = false;
  Deadline grace = deadline;

  // The unsent rest of a frame cut in the middle, so an abort frame can follow it.
  std::byte tail_hdr[8];
  auto tail = [&]() -> std::vector<iovec> {
    std::vector<iovec> v;
    if (soff == 0 || si >= plan.sends.size()) return v;
    const auto& op = plan.sends[si];
    EncodeHeader(op.type, op.len, tail_hdr);
    if (soff < 8) v.push_back({tail_hdr + soff, 8 - soff});
    const size_t p = soff > 8 ? soff - 8 : 0;
    v.push_back({const_cast<std::byte*>(op.p) + p, op.len - p});
    return v;
  };
  // A failure found here: every neighbour learns it.
  auto fail = [&](Status s) {
    const auto t = tail();
    SendAbort(EncodeAbort(s, options_.rank), true, true, t);
    return s;
  };
  // An abort frame that arrived on `from_fd`: passed on to the other side.
  auto received_abort = [&](const std::string& payload, int from_fd, const std::string& from) {
    int origin = -1;
    Status s = DecodeAbort(payload, options_.size, &origin);
    if (s.code() == StatusCode::kCorruption) return fail(s.WithContext(Where() + ": from " + from));
    const auto t = tail();
    // Onward only, and not back to where it started.
    const bool from_prev = from_fd == rfd;
    SendAbort(payload, from_prev && next() != origin, !from_prev && prev() != origin, t);
    return s;
  };
  auto io_failure = [&](int err, const std::string& who, const char* what) {
    if (err == 0 || err == EPIPE || err == ECONNRESET) {
      return fail(Status::Aborted(who + " closed the connection during " + desc.ToString() + " (seen by " +
                                  names_[options_.rank] + ")"));
    }
    return fail(Status::Aborted(Where() + ": " + what + " " + who + " failed during " + desc.ToString() + ": " +
                                std::strerror(err)));
  };

  // Only abort frames travel backwards (next -> this rank): reads what has
  // arrived of one; its status once whole.
  auto read_back = [&]() -> std::optional<Status> {
    for (;;) {
      const bool in_header = bhave < 8;
      std::byte* dst = in_header ? bhdr + bhave : reinterpret_cast<std::byte*>(back.data()) + bgot;
      const size_t want = in_header ? 8 - bhave : back.size() - bgot;
      const ssize_t r = want == 0 ? 0 : ::recv(sfd, dst, want, MSG_DONTWAIT);
      if (want > 0 && r < 0 && errno == EINTR) continue;
      if (want > 0 && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::nullopt;
      if (want > 0 && r <= 0) {
        // next may close once it has all it needs of this call: an error
        // only while this rank still has data for it.
        if (si == plan.sends.size()) {
          back_closed = true;
          return std::nullopt;
        }
        return io_failure(r == 0 ? 0 : errno, next_name, "reading from");
      }
      if (in_header) {
        bhave += static_cast<size_t>(r);
        if (bhave < 8) continue;
        codec::Reader hr(std::string_view(reinterpret_cast<const char*>(bhdr), 8));
        uint32_t len = 0;
        uint16_t type = 0, version = 0;
        (void)hr.GetU32(&len);
        (void)hr.GetU16(&type);
        (void)hr.GetU16(&version);
        if (type != kAbort || version != tcp::kProtocolVersion || len > kMaxAbortBytes) {
          return fail(Status::Corruption(Where() + ": unexpected frame from " + next_name + " (type " +
                                         std::to_string(type) + ", " + std::to_string(len) + " bytes)"));
        }
        back.assign(len, '\0');
        bgot = 0;
        continue;
      }
      bgot += static_cast<size_t>(r);
      if (bgot == back.size()) return received_abort(back, sfd, next_name);
    }
  };

  bool final_check = false;
  for (;;) {
    // Send every frame whose data is ready, several per syscall.
    bool want_out = false;
    const size_t ri_at_send = ri;
    while (si < plan.sends.size()) {
      iovec iov[kMaxIov];
      std::byte hdrs[kMaxIov / 2][8];
      int niov = 0;
      size_t total = 0;
      for (size_t k = si, off = soff; k < plan.sends.size() && niov + 2 <= kMaxIov && total < kSendBatchBytes;
           ++k, off = 0) {
        const auto& op = plan.sends[k];
        if (op.dep >= static_cast<int>(ri)) break;
        std::byte* h = hdrs[niov / 2];
        EncodeHeader(op.type, op.len, h);
        if (off < 8) iov[niov++] = {h + off, 8 - off};
        const size_t p = off > 8 ? off - 8 : 0;
        iov[niov++] = {const_cast<std::byte*>(op.p) + p, op.len - p};
        total += 8 + op.len - off;
      }
      if (niov == 0) break;
      msghdr m{};
      m.msg_iov = iov;
      m.msg_iovlen = niov;
      const ssize_t w = ::sendmsg(sfd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (w < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) {
          want_out = true;
          break;
        }
        return io_failure(errno, next_name, "sending to");
      }
      for (size_t left = static_cast<size_t>(w); left > 0;) {
        const size_t rest = 8 + plan.sends[si].len - soff;
        if (left >= rest) {
          left -= rest;
          ++si;
          soff = 0;
        } else {
          soff += left;
          left = 0;
        }
      }
      if (static_cast<size_t>(w) < total) {
        want_out = true;
        break;
      }
    }

    // Receive whatever has arrived; reduce each chunk as it completes.
    while (ri < plan.recvs.size()) {
      const bool in_header = rhave < 8;
      std::byte* dst = in_header ? rhdr + rhave : rdst + rgot;
      const size_t want = in_header ? 8 - rhave : rlen - rgot;
      size_t got = 0;
      if (want > 0) {
        if (inbox_begin_ < inbox_end_) {
          got = std::min(want, inbox_end_ - inbox_begin_);
          std::memcpy(dst, inbox_.data() + inbox_begin_, got);
          inbox_begin_ += got;
        } else {
          const bool direct = want >= kDirectReadBytes;
          const ssize_t r = ::recv(rfd, direct ? dst : inbox_.data(), direct ? want : inbox_.size(), MSG_DONTWAIT);
          if (r < 0 && errno == EINTR) continue;
          if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          if (r <= 0) return io_failure(r == 0 ? 0 : errno, prev_name, "receiving from");
          if (direct) {
            got = static_cast<size_t>(r);
          } else {
            inbox_begin_ = 0;
            inbox_end_ = static_cast<size_t>(r);
            continue;
          }
        }
      }
      if (in_header) {
        rhave += got;
        if (rhave < 8) continue;
        codec::Reader hr(std::string_view(reinterpret_cast<const char*>(rhdr), 8));
        uint32_t len = 0;
        uint16_t version = 0;
        (void)hr.GetU32(&len);
        (void)hr.GetU16(&rtype);
        (void)hr.GetU16(&version);
        rlen = len;
        rgot = 0;
        const auto& op = plan.recvs[ri];
        if (version == tcp::kProtocolVersion && rtype == kAbort && rlen <= kMaxAbortBytes) {
          abort_in.resize(rlen);
          rdst = reinterpret_cast<std::byte*>(abort_in.data());
        } else if (version == tcp::kProtocolVersion && rtype == op.type && rlen == op.len) {
          rdst = op.reduce ? staging_.data() : op.dst;
        } else {
          return fail(Status::Corruption(Where() + ": unexpected frame from " + prev_name + " during " +
                                         desc.ToString() + ": type " + std::to_string(rtype) + ", version " +
                                         std::to_string(version) + ", " + std::to_string(rlen) +
                                         " bytes; expected type " + std::to_string(op.type) + ", " +
                                         std::to_string(op.len) + " bytes"));
        }
        continue;
      }
      rgot += got;
      if (rgot < rlen) continue;
      // A whole frame.
      rhave = 0;
      if (rtype == kAbort) return received_abort(abort_in, rfd, prev_name);
      const auto& op = plan.recvs[ri];
      if (op.type == kCall) {
        codec::Reader cr(std::string_view(reinterpret_cast<const char*>(op.dst), kCallDescBytes));
        CallDesc theirs;
        Status s = DecodeCallDesc(&cr, &theirs);
        if (!s.ok()) return fail(s.WithContext(Where() + ": call frame from " + prev_name));
        s = CheckSameCall(desc, names_[options_.rank], theirs, prev_name);
        if (!s.ok()) return fail(s);
      } else if (op.reduce) {
        ReduceInto(plan.dtype, plan.op, op.dst, staging_.data(), op.len / plan.elem);
      }
      ++ri;
    }

    if (si == plan.sends.size() && ri == plan.recvs.size()) {
      if (timed_out) {
        return fail(Status::DeadlineExceeded(desc.ToString() + " timed out on " + names_[options_.rank] + " after " +
                                             Ms(Deadline::Clock::now() - start)));
      }
      if (final_check) return Status::OK();
      // A rank that arrives late can find all its data waiting although the
      // others already failed: look for an abort frame before succeeding.
      final_check = true;
      pollfd f[2] = {{sfd, POLLIN, 0}, {rfd, POLLIN, 0}};
      if (::poll(f, 2, 0) <= 0) return Status::OK();
      if (f[0].revents != 0 && !back_closed) {
        if (auto st = read_back()) return *st;
      }
      std::byte h[8];
      size_t have = std::min<size_t>(8, inbox_end_ - inbox_begin_);
      if (have > 0) {
        std::memcpy(h, inbox_.data() + inbox_begin_, have);
      } else if (f[1].revents != 0) {
        const ssize_t r = ::recv(rfd, h, 8, MSG_PEEK | MSG_DONTWAIT);
        have = r > 0 ? static_cast<size_t>(r) : 0;
      }
      const uint16_t next_type = have == 8 ? static_cast<uint16_t>(uint8_t(h[4]) | uint8_t(h[5]) << 8) : 0;
      if (next_type != kAbort) return Status::OK();
      plan.recvs.push_back({nullptr, 0, kAbort, false});  // read it like any frame
      continue;
    }
    // Frames just received may have released sends.
    if (ri != ri_at_send && !want_out && si < plan.sends.size()) continue;
    // Wait for the sockets, an abort frame from next, or Abort().
    pollfd fds[3] = {{back_closed ? -1 : sfd, static_cast<short>(POLLIN | (want_out ? POLLOUT : 0)), 0},
                     {rfd, static_cast<short>(ri < plan.recvs.size() ? POLLIN : 0), 0},
                     {wake_.get(), POLLIN, 0}};
    const int rc = ::poll(fds, 3, (timed_out ? grace : deadline).PollTimeoutMs());
    if (rc < 0 && errno != EINTR) return fail(Status::FromErrno(errno, Where() + ": poll"));
    if (rc == 0) {
      const auto elapsed = Ms(Deadline::Clock::now() - start);
      if (ri == 0) {
        return fail(Status::DeadlineExceeded(prev_name + " did not start " + desc.ToString() + " within " + elapsed +
                                             " (seen by " + names_[options_.rank] + ")"));
      }
      if (!timed_out) {
        // prev is in the call but stalled behind someone: an abort frame
        // naming the rank that stalls is probably on its way.
        timed_out = true;
        const auto budget = std::chrono::duration_cast<Duration>(deadline.when() - start) / 2;
        grace = Deadline::After(std::clamp(budget, Duration(20), Duration(250)));
        continue;
      }
      return fail(Status::DeadlineExceeded(
          desc.ToString() + " timed out on " + names_[options_.rank] + " after " + elapsed + ": waiting " +
          (ri < plan.recvs.size() ? "for data from " + prev_name : "for " + next_name + " to take data")));
    }
    if (rc < 0) continue;
    if (fds[2].revents != 0) {
      std::string payload;
      {
        MutexLock lock(&mu_);
        payload = std::move(abort_payload_);
        abort_payload_.clear();
      }
      const auto t = tail();
      if (!payload.empty()) SendAbort(payload, true, true, t);
      MutexLock lock(&mu_);
      return error_;
    }
    if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
      if (auto st = read_back()) return *st;
    }
  }
}

Status TcpRing::Allreduce(const CallDesc& desc, void* data, Deadline deadline) {
  EMBER_RETURN_NOT_OK(BeginCall());
  const int n = options_.size, r = options_.rank;
  if (n == 1) return EndCall(Status::OK());
  Plan plan(desc.dtype, desc.op, options_.chunk_bytes);
  auto* base = static_cast<std::byte*>(data);
  const size_t bytes = desc.bytes();
  Status s;
  if (bytes <= options_.small_bytes) {
    // Every buffer around the ring, then one reduction in rank order.
    scratch_.resize(bytes * n);
    if (bytes > 0) std::memcpy(scratch_.data() + bytes * r, data, bytes);
    std::vector<Plan::Seg> segs(n);
    for (int k = 0; k < n; ++k) segs[k] = {bytes * k, bytes};
    plan.AddPass(segs, scratch_.data(), r, n - 1, /*reduce=*/false, {});
    s = Run(desc, plan, deadline);
    if (s.ok() && bytes > 0) {
      std::vector<const void*> srcs(n);
      for (int k = 0; k < n; ++k) srcs[k] = scratch_.data() + bytes * k;
      ReduceN(desc.dtype, desc.op, data, srcs.data(), n, desc.count);
    }
  } else {
    const auto segs = plan.EvenSegments(desc.count, n);
    auto deps = plan.AddPass(segs, base, r, n - 1, /*reduce=*/true, {});  // rank r ends owning segment r+1
    plan.AddPass(segs, base, r + 1, n - 1, /*reduce=*/false, std::move(deps));
    s = Run(desc, plan, deadline);
  }
  return EndCall(std::move(s));
}

Status TcpRing::Broadcast(const CallDesc& desc, void* data, Deadline deadline) {
  EMBER_RETURN_NOT_OK(BeginCall());
  const int n = options_.size;
  if (desc.root < 0 || desc.root >= n) {
    return EndCall(Status::InvalidArgument(Where() + ": broadcast root " + std::to_string(desc.root) +
                                           " out of range for " + std::to_string(n) + " ranks"));
  }
  if (n == 1) return EndCall(Status::OK());
  Plan plan(desc.dtype, desc.op, options_.chunk_bytes);
  auto* base = static_cast<std::byte*>(data);
  const int d = Mod(options_.rank - desc.root, n);  // hops from the root
  for (size_t off = 0; off < desc.bytes(); off += plan.chunk) {
    const size_t len = std::min(plan.chunk, desc.bytes() - off);
    int dep = -1;
    if (d != 0) {
      dep = static_cast<int>(plan.recvs.size());
      plan.recvs.push_back({base + off, len, kData, false});
    }
    if (d != n - 1) plan.sends.push_back({base + off, len, kData, dep});
  }
  return EndCall(Run(desc, plan, deadline));
}

Status TcpRing::Allgather(const CallDesc& desc, const void* in, std::span<const uint64_t> counts, void* out,
                          Deadline deadline) {
  EMBER_RETURN_NOT_OK(BeginCall());
  const int n = options_.size, r = options_.rank;
  if (counts.size() != static_cast<size_t>(n)) {
    return EndCall(Status::InvalidArgument(Where() + ": allgather with " + std::to_string(counts.size()) +
                                           " counts for " + std::to_string(n) + " ranks"));
  }
  Plan plan(desc.dtype, desc.op, options_.chunk_bytes);
  std::vector<Plan::Seg> segs(n);
  size_t off = 0;
  for (int k = 0; k < n; ++k) {
    segs[k] = {off, counts[k] * plan.elem};
    off += segs[k].len;
  }
  if (off != desc.bytes()) {
    return EndCall(Status::InvalidArgument(Where() + ": allgather counts sum to " + std::to_string(off / plan.elem) +
                                           " elements, not the call's " + std::to_string(desc.count)));
  }
  auto* base = static_cast<std::byte*>(out);
  if (segs[r].len > 0) std::memmove(base + segs[r].off, in, segs[r].len);
  if (n == 1) return EndCall(Status::OK());
  plan.AddPass(segs, base, r, n - 1, /*reduce=*/false, {});
  return EndCall(Run(desc, plan, deadline));
}

Status TcpRing::ReduceScatter(const CallDesc& desc, const void* in, void* out, Deadline deadline) {
  EMBER_RETURN_NOT_OK(BeginCall());
  const int n = options_.size, r = options_.rank;
  const size_t block = desc.bytes();
  if (n == 1) {
    if (block > 0) std::memmove(out, in, block);
    return EndCall(Status::OK());
  }
  Plan plan(desc.dtype, desc.op, options_.chunk_bytes);
  scratch_.resize(block * n);  // `in` stays untouched
  if (block > 0) std::memcpy(scratch_.data(), in, block * n);
  std::vector<Plan::Seg> segs(n);
  for (int k = 0; k < n; ++k) segs[k] = {block * k, block};
  plan.AddPass(segs, scratch_.data(), r - 1, n - 1, /*reduce=*/true, {});  // ends owning block r
  Status s = Run(desc, plan, deadline);
  if (s.ok() && block > 0) std::memcpy(out, scratch_.data() + block * r, block);
  return EndCall(std::move(s));
}

Status TcpRing::Barrier(const CallDesc& desc, Deadline deadline) {
  EMBER_RETURN_NOT_OK(BeginCall());
  const int n = options_.size, r = options_.rank;
  if (n == 1) return EndCall(Status::OK());
  // One byte from every rank reaches every rank: all have entered.
  Plan plan(DataType::kFloat32, ReduceOp::kSum, options_.chunk_bytes);
  plan.chunk = 1;
  scratch_.assign(n, std::byte{1});
  std::vector<Plan::Seg> segs(n);
  for (int k = 0; k < n; ++k) segs[k] = {static_cast<size_t>(k), 1};
  plan.AddPass(segs, scratch_.data(), r, n - 1, /*reduce=*/false, {});
  return EndCall(Run(desc, plan, deadline));
}

}  // namespace ember::collective
