#include "collective/tcp_ring.h"

#include <errno.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <thread>

#include "collective/reduce.h"
#include "common/codec.h"
#include "common/logging.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
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
    EMBER_ASSIGN_OR_RAISE(std::unique_ptr<tcp::Acceptor> acceptor, AcceptPrev(deadline));
    EMBER_RETURN_NOT_OK(ConnectNext(addresses[next()].first, addresses[next()].second, deadline));
    Result<Fd> prev = acceptor->Take(deadline);
    const std::string rejected = acceptor->last_rejection();
    acceptor->Close();  // and with it the listener
    if (!prev.ok()) {
      return Status::DeadlineExceeded(Where() + ": " + names_[this->prev()] + " did not connect within " +
                                      Ms(Deadline::Clock::now() - start) +
                                      (rejected.empty() ? "" : " (last rejected connection: " + rejected + ")"));
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

Result<std::unique_ptr<tcp::Acceptor>> TcpRing::AcceptPrev(Deadline deadline) {
  tcp::AcceptorOptions a;
  a.name = Where();
  a.secret = options_.secret;
  a.handshake_timeout = options_.handshake_timeout;
  a.max_pending_handshakes = kMaxPendingHandshakes;
  return tcp::Acceptor::HandOver(a, std::move(listener_), [this, deadline](int fd, const std::string& peer,
                                                                          Deadline handshake) {
    return AdmitPrev(fd, peer, std::min(deadline, handshake));
  });
}

Status TcpRing::AdmitPrev(int fd, const std::string& peer, Deadline d) {
  EMBER_ASSIGN_OR_RAISE(tcp::Frame f, tcp::ReadFrame(fd, kMaxHelloBytes, d, peer));
  Hello h;
  Status s = f.type == kHello ? DecodeHello(f.payload, &h)
                              : Status::Corruption("expected a hello frame, got type " + std::to_string(f.type));
  const int from = prev();
  const TcpRingOptions& o = options_;
  if (s.ok() && (h.size != o.size || h.ring_id != o.ring_id || h.from != from || h.to != o.rank)) {
    s = Status::InvalidArgument("hello from rank " + std::to_string(h.from) + " of a ring of " +
                                std::to_string(h.size) + " (id '" + h.ring_id + "') for rank " + std::to_string(h.to) +
                                "; this is rank " + std::to_string(o.rank) + " of " + std::to_string(o.size) +
                                " (id '" + o.ring_id + "') expecting rank " + std::to_string(from));
  }
  if (s.ok() && prev_claimed_.exchange(true)) {
    s = Status::AlreadyExists("rank " + std::to_string(from) + " is already connected");
  }
  if (!s.ok()) {
    (void)tcp::WriteFrame(fd, kHelloReject, EncodeHello({0, 0, 0, s.message().substr(0, 256)}), d, peer);
    return s;
  }
  return tcp::WriteFrame(fd, kHelloAck, EncodeHello({o.size, o.rank, from, o.ring_id}), d, peer);
}

Status TcpRing::ConnectNext(const std::string& host, int port, Deadline deadline) {
  const int n = next();
  const std::string who = names_[n] + " at " + host + ":" + std::to_string(port);
  const auto start = Deadline::Clock::now();
  Duration backoff{5};
  Status last;
  for (;;) {
    const Deadline d = std::min(deadline, Deadline::After(options_.handshake_timeout));
    Result<Fd> fd = tcp::Dial(host, port, options_.secret, d, who);
    if (fd.ok()) {
      bool refused = false;
      Status s = ExchangeHello(fd->get(), who, d, &refused);
      if (s.ok()) {
        send_fd_ = fd.MoveValueUnsafe();
        return Status::OK();
      }
      if (refused) return s;
      last = s;
    } else if (fd.status().code() == StatusCode::kUnauthenticated) {
      return fd.status().WithContext(Where() + ": connecting to " + who);
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

Status TcpRing::ExchangeHello(int fd, const std::string& who, Deadline d, bool* refused) {
  *refused = false;
  const int n = next();
  const TcpRingOptions& o = options_;
  EMBER_RETURN_NOT_OK(tcp::WriteFrame(fd, kHello, EncodeHello({o.size, o.rank, n, o.ring_id}), d, who));
  EMBER_ASSIGN_OR_RAISE(tcp::Frame reply, tcp::ReadFrame(fd, kMaxHelloBytes, d, who));
  Hello h;
  EMBER_RETURN_NOT_OK(DecodeHello(reply.payload, &h));
  if (reply.type == kHelloReject) {
    *refused = true;
    return Status::Unavailable(Where() + ": " + who + " rejected the connection: " + h.ring_id);
  }
  if (reply.type != kHelloAck || h.size != o.size || h.from != n || h.to != o.rank || h.ring_id != o.ring_id) {
    *refused = true;
    return Status::Unavailable(Where() + ": " + who + " is not " + names_[n] + " of this ring");
  }
  return Status::OK();
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

// Where a call stands: what was sent and received, the frame in progress
// each way, and the timing.  On Run()'s stack: the hot path allocates
// nothing for it.
struct TcpRing::CallState {
  CallState(const CallDesc& d, Plan& p, Deadline dl, int send_fd, int recv_fd, const std::string& prev,
            const std::string& next)
      : desc(d), plan(p), deadline(dl), start(Deadline::Clock::now()), sfd(send_fd), rfd(recv_fd),
        prev_name(prev), next_name(next), grace(dl) {}

  const CallDesc& desc;
  Plan& plan;
  const Deadline deadline;
  const Deadline::Clock::time_point start;
  const int sfd, rfd;
  const std::string& prev_name;
  const std::string& next_name;

  size_t si = 0, soff = 0;  // next frame to send, bytes of it sent (header included)
  std::byte tail_hdr[8];    // header of the frame cut in the middle (Tail())

  size_t ri = 0;  // next frame to receive
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

  bool timed_out = false;  // the deadline passed with data still in flight
  Deadline grace;          // then: how long an abort frame naming the staller gets to arrive
  bool final_check = false;
};

Status TcpRing::Run(const CallDesc& desc, Plan& plan, Deadline deadline) {
  {
    codec::Writer w;
    EncodeCallDesc(desc, &w);
    std::memcpy(plan.call_out, w.data().data(), kCallDescBytes);
  }
  CallState c(desc, plan, deadline, send_fd_.get(), recv_fd_.get(), names_[prev()], names_[next()]);
  for (;;) {
    bool want_out = false;
    const size_t ri_at_send = c.ri;
    if (auto s = SendReady(c, &want_out)) return *s;
    if (auto s = ReceiveReady(c)) return *s;
    if (c.si == plan.sends.size() && c.ri == plan.recvs.size()) {
      if (auto s = Finish(c)) return *s;
      continue;  // an abort frame is on its way: read it like any frame
    }
    // Frames just received may have released sends.
    if (c.ri != ri_at_send && !want_out && c.si < plan.sends.size()) continue;
    if (auto s = Wait(c, want_out)) return *s;
  }
}

std::optional<Status> TcpRing::SendReady(CallState& c, bool* want_out) {
  // Every frame whose data is ready, several per syscall.
  const Plan& plan = c.plan;
  while (c.si < plan.sends.size()) {
    iovec iov[kMaxIov];
    std::byte hdrs[kMaxIov / 2][8];
    int niov = 0;
    size_t total = 0;
    for (size_t k = c.si, off = c.soff; k < plan.sends.size() && niov + 2 <= kMaxIov && total < kSendBatchBytes;
         ++k, off = 0) {
      const auto& op = plan.sends[k];
      if (op.dep >= static_cast<int>(c.ri)) break;
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
    const ssize_t w = ::sendmsg(c.sfd, &m, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        *want_out = true;
        break;
      }
      return IoFailure(c, errno, c.next_name, "sending to");
    }
    for (size_t left = static_cast<size_t>(w); left > 0;) {
      const size_t rest = 8 + plan.sends[c.si].len - c.soff;
      if (left >= rest) {
        left -= rest;
        ++c.si;
        c.soff = 0;
      } else {
        c.soff += left;
        left = 0;
      }
    }
    if (static_cast<size_t>(w) < total) {
      *want_out = true;
      break;
    }
  }
  return std::nullopt;
}

std::optional<Status> TcpRing::ReceiveReady(CallState& c) {
  // Whatever has arrived; each chunk is reduced as it completes.
  const Plan& plan = c.plan;
  while (c.ri < plan.recvs.size()) {
    const bool in_header = c.rhave < 8;
    std::byte* dst = in_header ? c.rhdr + c.rhave : c.rdst + c.rgot;
    const size_t want = in_header ? 8 - c.rhave : c.rlen - c.rgot;
    size_t got = 0;
    if (want > 0) {
      if (inbox_begin_ < inbox_end_) {
        got = std::min(want, inbox_end_ - inbox_begin_);
        std::memcpy(dst, inbox_.data() + inbox_begin_, got);
        inbox_begin_ += got;
      } else {
        const bool direct = want >= kDirectReadBytes;
        const ssize_t r = ::recv(c.rfd, direct ? dst : inbox_.data(), direct ? want : inbox_.size(), MSG_DONTWAIT);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        if (r <= 0) return IoFailure(c, r == 0 ? 0 : errno, c.prev_name, "receiving from");
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
      c.rhave += got;
      if (c.rhave < 8) continue;
      codec::Reader hr(std::string_view(reinterpret_cast<const char*>(c.rhdr), 8));
      uint32_t len = 0;
      uint16_t version = 0;
      (void)hr.GetU32(&len);
      (void)hr.GetU16(&c.rtype);
      (void)hr.GetU16(&version);
      c.rlen = len;
      c.rgot = 0;
      const auto& op = plan.recvs[c.ri];
      if (version == tcp::kProtocolVersion && c.rtype == kAbort && c.rlen <= kMaxAbortBytes) {
        c.abort_in.resize(c.rlen);
        c.rdst = reinterpret_cast<std::byte*>(c.abort_in.data());
      } else if (version == tcp::kProtocolVersion && c.rtype == op.type && c.rlen == op.len) {
        c.rdst = op.reduce ? staging_.data() : op.dst;
      } else {
        return Fail(c, Status::Corruption(Where() + ": unexpected frame from " + c.prev_name + " during " +
                                          c.desc.ToString() + ": type " + std::to_string(c.rtype) + ", version " +
                                          std::to_string(version) + ", " + std::to_string(c.rlen) +
                                          " bytes; expected type " + std::to_string(op.type) + ", " +
                                          std::to_string(op.len) + " bytes"));
      }
      continue;
    }
    c.rgot += got;
    if (c.rgot < c.rlen) continue;
    // A whole frame.
    c.rhave = 0;
    if (c.rtype == kAbort) return ReceivedAbort(c, c.abort_in, c.rfd, c.prev_name);
    const auto& op = plan.recvs[c.ri];
    if (op.type == kCall) {
      codec::Reader cr(std::string_view(reinterpret_cast<const char*>(op.dst), kCallDescBytes));
      CallDesc theirs;
      Status s = DecodeCallDesc(&cr, &theirs);
      if (!s.ok()) return Fail(c, s.WithContext(Where() + ": call frame from " + c.prev_name));
      s = CheckSameCall(c.desc, names_[options_.rank], theirs, c.prev_name);
      if (!s.ok()) return Fail(c, s);
    } else if (op.reduce) {
      ReduceInto(plan.dtype, plan.op, op.dst, staging_.data(), op.len / plan.elem);
    }
    ++c.ri;
  }
  return std::nullopt;
}

std::optional<Status> TcpRing::Finish(CallState& c) {
  if (c.timed_out) {
    return Fail(c, Status::DeadlineExceeded(c.desc.ToString() + " timed out on " + names_[options_.rank] + " after " +
                                            Ms(Deadline::Clock::now() - c.start)));
  }
  if (c.final_check) return Status::OK();
  // A rank that arrives late can find all its data waiting although the
  // others already failed: look for an abort frame before succeeding.
  c.final_check = true;
  pollfd f[2] = {{c.sfd, POLLIN, 0}, {c.rfd, POLLIN, 0}};
  if (::poll(f, 2, 0) <= 0) return Status::OK();
  if (f[0].revents != 0 && !c.back_closed) {
    if (auto st = ReadBack(c)) return *st;
  }
  std::byte h[8];
  size_t have = std::min<size_t>(8, inbox_end_ - inbox_begin_);
  if (have > 0) {
    std::memcpy(h, inbox_.data() + inbox_begin_, have);
  } else if (f[1].revents != 0) {
    const ssize_t r = ::recv(c.rfd, h, 8, MSG_PEEK | MSG_DONTWAIT);
    have = r > 0 ? static_cast<size_t>(r) : 0;
  }
  const uint16_t next_type = have == 8 ? static_cast<uint16_t>(uint8_t(h[4]) | uint8_t(h[5]) << 8) : 0;
  if (next_type != kAbort) return Status::OK();
  c.plan.recvs.push_back({nullptr, 0, kAbort, false});
  return std::nullopt;
}

std::optional<Status> TcpRing::Wait(CallState& c, bool want_out) {
  // The sockets, an abort frame from next, or Abort().
  const Plan& plan = c.plan;
  pollfd fds[3] = {{c.back_closed ? -1 : c.sfd, static_cast<short>(POLLIN | (want_out ? POLLOUT : 0)), 0},
                   {c.rfd, static_cast<short>(c.ri < plan.recvs.size() ? POLLIN : 0), 0},
                   {wake_.get(), POLLIN, 0}};
  const int rc = ::poll(fds, 3, (c.timed_out ? c.grace : c.deadline).PollTimeoutMs());
  if (rc < 0 && errno != EINTR) return Fail(c, Status::FromErrno(errno, Where() + ": poll"));
  if (rc == 0) {
    const auto elapsed = Ms(Deadline::Clock::now() - c.start);
    if (c.ri == 0) {
      return Fail(c, Status::DeadlineExceeded(c.prev_name + " did not start " + c.desc.ToString() + " within " +
                                              elapsed + " (seen by " + names_[options_.rank] + ")"));
    }
    if (!c.timed_out) {
      // prev is in the call but stalled behind someone: an abort frame
      // naming the rank that stalls is probably on its way.
      c.timed_out = true;
      const auto budget = std::chrono::duration_cast<Duration>(c.deadline.when() - c.start) / 2;
      c.grace = Deadline::After(std::clamp(budget, Duration(20), Duration(250)));
      return std::nullopt;
    }
    return Fail(c, Status::DeadlineExceeded(
                       c.desc.ToString() + " timed out on " + names_[options_.rank] + " after " + elapsed +
                       ": waiting " +
                       (c.ri < plan.recvs.size() ? "for data from " + c.prev_name : "for " + c.next_name + " to take data")));
  }
  if (rc < 0) return std::nullopt;
  if (fds[2].revents != 0) {
    std::string payload;
    {
      MutexLock lock(&mu_);
      payload = std::move(abort_payload_);
      abort_payload_.clear();
    }
    const auto t = Tail(c);
    if (!payload.empty()) SendAbort(payload, true, true, t);
    MutexLock lock(&mu_);
    return error_;
  }
  if (fds[0].revents & (POLLIN | POLLERR | POLLHUP)) {
    if (auto st = ReadBack(c)) return *st;
  }
  return std::nullopt;
}

std::optional<Status> TcpRing::ReadBack(CallState& c) {
  // Only abort frames travel backwards (next -> this rank): reads what has
  // arrived of one; its status once whole.
  for (;;) {
    const bool in_header = c.bhave < 8;
    std::byte* dst = in_header ? c.bhdr + c.bhave : reinterpret_cast<std::byte*>(c.back.data()) + c.bgot;
    const size_t want = in_header ? 8 - c.bhave : c.back.size() - c.bgot;
    const ssize_t r = want == 0 ? 0 : ::recv(c.sfd, dst, want, MSG_DONTWAIT);
    if (want > 0 && r < 0 && errno == EINTR) continue;
    if (want > 0 && r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return std::nullopt;
    if (want > 0 && r <= 0) {
      // next may close once it has all it needs of this call: an error
      // only while this rank still has data for it.
      if (c.si == c.plan.sends.size()) {
        c.back_closed = true;
        return std::nullopt;
      }
      return IoFailure(c, r == 0 ? 0 : errno, c.next_name, "reading from");
    }
    if (in_header) {
      c.bhave += static_cast<size_t>(r);
      if (c.bhave < 8) continue;
      codec::Reader hr(std::string_view(reinterpret_cast<const char*>(c.bhdr), 8));
      uint32_t len = 0;
      uint16_t type = 0, version = 0;
      (void)hr.GetU32(&len);
      (void)hr.GetU16(&type);
      (void)hr.GetU16(&version);
      if (type != kAbort || version != tcp::kProtocolVersion || len > kMaxAbortBytes) {
        return Fail(c, Status::Corruption(Where() + ": unexpected frame from " + c.next_name + " (type " +
                                          std::to_string(type) + ", " + std::to_string(len) + " bytes)"));
      }
      c.back.assign(len, '\0');
      c.bgot = 0;
      continue;
    }
    c.bgot += static_cast<size_t>(r);
    if (c.bgot == c.back.size()) return ReceivedAbort(c, c.back, c.sfd, c.next_name);
  }
}

std::vector<iovec> TcpRing::Tail(CallState& c) {
  std::vector<iovec> v;
  if (c.soff == 0 || c.si >= c.plan.sends.size()) return v;
  const auto& op = c.plan.sends[c.si];
  EncodeHeader(op.type, op.len, c.tail_hdr);
  if (c.soff < 8) v.push_back({c.tail_hdr + c.soff, 8 - c.soff});
  const size_t p = c.soff > 8 ? c.soff - 8 : 0;
  v.push_back({const_cast<std::byte*>(op.p) + p, op.len - p});
  return v;
}

Status TcpRing::Fail(CallState& c, Status s) {
  const auto t = Tail(c);
  SendAbort(EncodeAbort(s, options_.rank), true, true, t);
  return s;
}

Status TcpRing::ReceivedAbort(CallState& c, const std::string& payload, int from_fd, const std::string& from) {
  int origin = -1;
  Status s = DecodeAbort(payload, options_.size, &origin);
  if (s.code() == StatusCode::kCorruption) return Fail(c, s.WithContext(Where() + ": from " + from));
  const auto t = Tail(c);
  // Onward only, and not back to where it started.
  const bool from_prev = from_fd == c.rfd;
  SendAbort(payload, from_prev && next() != origin, !from_prev && prev() != origin, t);
  return s;
}

Status TcpRing::IoFailure(CallState& c, int err, const std::string& who, const char* what) {
  if (err == 0 || err == EPIPE || err == ECONNRESET) {
    return Fail(c, Status::Aborted(who + " closed the connection during " + c.desc.ToString() + " (seen by " +
                                   names_[options_.rank] + ")"));
  }
  return Fail(c, Status::Aborted(Where() + ": " + what + " " + who + " failed during " + c.desc.ToString() + ": " +
                                 std::strerror(err)));
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
