#include "feed/feed_client.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>

#include "feed/feed_wire.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ember::feed {
namespace {

// How long a failed Write waits for the server's kError (which says why the
// server dropped the connection) before reporting the socket error.
constexpr Duration kErrorGrace{500};

bool IsResultKind(uint32_t kind) {
  const auto k = static_cast<FeedKind>(kind);
  return k == FeedKind::kResults || k == FeedKind::kEndResults || k == FeedKind::kError ||
         k == FeedKind::kFlushed || k == FeedKind::kEpochState;
}

}  // namespace

FeedClient::FeedClient(Fd fd, std::string peer, size_t max_message_bytes)
    : fd_(std::move(fd)), peer_(std::move(peer)), max_message_bytes_(max_message_bytes) {}

FeedClient::~FeedClient() { Close(); }

Result<std::unique_ptr<FeedClient>> FeedClient::Connect(const std::string& host, int port, const std::string& secret,
                                                        Duration timeout, size_t max_message_bytes,
                                                        Duration idle_timeout) {
  const std::string peer = host + ":" + std::to_string(port);
  const Deadline deadline = Deadline::After(timeout);
  bool connect_failed = false;
  Result<Fd> fd = tcp::Dial(host, port, secret, deadline, "feed server " + peer, &connect_failed);
  if (!fd.ok() && connect_failed) {
    return Status::Unavailable("cannot reach the node's feed server at " + peer + ": " + fd.status().message() +
                               "; check that the node is still running and that this host can reach " + peer +
                               " (firewall, bind address)");
  }
  if (fd.status().code() == StatusCode::kUnauthenticated) {
    return Status::Unauthenticated("feed server at " + peer + " rejected the handshake: " + fd.status().message() +
                                   "; does this task carry the job's secret?");
  }
  if (!fd.ok()) {
    return Status::Unavailable("handshake with the feed server at " + peer + " failed: " + fd.status().message());
  }
  Status hello = SendFeedFrame(fd->get(), FeedKind::kHello, EncodeHello({idle_timeout}), deadline, peer);
  if (!hello.ok()) {
    return Status::Unavailable("feed server at " + peer + " dropped the connection after the handshake: " +
                               hello.message());
  }
  return std::unique_ptr<FeedClient>(new FeedClient(fd.MoveValueUnsafe(), peer, max_message_bytes));
}

Status FeedClient::ErrorStatus() const {
  // The server's own errors read "<code name>: <message>"; Cancelled means
  // the node terminated its feed (docs/wire.md, "Feed").
  constexpr std::string_view kCancelled = "Cancelled: ";
  if (std::string_view(error_text_).substr(0, kCancelled.size()) == kCancelled) {
    return Status::Cancelled("the node's feed server at " + peer_ + ": " + error_text_.substr(kCancelled.size()));
  }
  return Status::Aborted("the node's feed server at " + peer_ + " reported: " + error_text_);
}

Status FeedClient::CheckUsable() const {
  if (closed_) return Status::Unavailable("feed connection to " + peer_ + " is closed");
  if (error_seen_) return ErrorStatus();
  if (!broken_.ok()) return broken_;
  return Status::OK();
}

void FeedClient::MarkBroken(const Status& status) {
  MutexLock lock(&state_mu_);
  if (broken_.ok()) broken_ = status.WithContext("feed connection to " + peer_ + " is unusable after an earlier error");
}

Status FeedClient::Write(FeedKind kind, std::span<const uint8_t> payload, Deadline deadline) {
  std::lock_guard<std::mutex> lock(write_mu_);
  {
    MutexLock state(&state_mu_);
    EMBER_RETURN_NOT_OK(CheckUsable());
  }
  EMBER_RETURN_NOT_OK(TakePendingError(Duration(0)));
  Status st = SendFeedFrame(fd_.get(), kind, payload, deadline, peer_);
  if (st.ok()) return st;
  if (st.code() == StatusCode::kInvalidArgument) return st;  // nothing was sent
  // The server usually says why it dropped us; prefer its reason.
  EMBER_RETURN_NOT_OK(TakePendingError(st.code() == StatusCode::kDeadlineExceeded ? Duration(0) : kErrorGrace));
  {
    MutexLock state(&state_mu_);
    if (error_seen_) return ErrorStatus();  // a concurrent Read got it
  }
  MarkBroken(st);
  return st;
}

Status FeedClient::Flush(Deadline deadline) {
  EMBER_RETURN_NOT_OK(Write(FeedKind::kFlush, {}, deadline));
  FeedKind kind = FeedKind::kError;
  std::vector<uint8_t> payload;
  Status st = Read(&kind, &payload, deadline);
  if (st.code() == StatusCode::kDeadlineExceeded) {
    const Status late = Status::DeadlineExceeded(
        "the node's feed server at " + peer_ +
        " did not confirm in time that it relayed every message into the node's ring (the node is not reading its feed)");
    MarkBroken(late);  // its kFlushed may still come and must not answer a later Flush
    return late;
  }
  EMBER_RETURN_NOT_OK(st);
  if (kind == FeedKind::kFlushed) return Status::OK();
  if (kind == FeedKind::kError) {
    MutexLock state(&state_mu_);
    return ErrorStatus();
  }
  const Status bad = Status::Corruption("feed server at " + peer_ + " answered kFlush with a message of kind " +
                                        std::string(KindName(static_cast<uint32_t>(kind))));
  MarkBroken(bad);
  return bad;
}

Status FeedClient::AwaitEpoch(uint32_t epoch, Deadline deadline, EpochStateMsg* state) {
  EMBER_RETURN_NOT_OK(Write(FeedKind::kAwaitEpoch, EncodeAwaitEpoch({epoch}), deadline));
  FeedKind kind = FeedKind::kError;
  std::vector<uint8_t> payload;
  Status st = Read(&kind, &payload, deadline);
  if (st.code() == StatusCode::kDeadlineExceeded) {
    const Status late = Status::DeadlineExceeded("the node's feed server at " + peer_ +
                                                 " did not answer whether the node began epoch " +
                                                 std::to_string(epoch) + " in time");
    MarkBroken(late);
    return late;
  }
  EMBER_RETURN_NOT_OK(st);
  if (kind == FeedKind::kError) {
    MutexLock lock(&state_mu_);
    return ErrorStatus();
  }
  Result<EpochStateMsg> m = kind == FeedKind::kEpochState
                                ? DecodeEpochState(payload)
                                : Result<EpochStateMsg>(Status::Corruption(
                                      "feed server at " + peer_ + " answered kAwaitEpoch with a message of kind " +
                                      std::string(KindName(static_cast<uint32_t>(kind)))));
  if (!m.ok()) {
    MarkBroken(m.status());
    return m.status();
  }
  *state = *m;
  return Status::OK();
}

Status FeedClient::TakePendingError(Duration wait) {
  std::unique_lock<std::mutex> reading(read_mu_, std::try_to_lock);
  if (!reading.owns_lock()) return Status::OK();  // the reader will see it
  const Deadline deadline = Deadline::After(wait);
  for (;;) {
    uint8_t header[tcp::kFrameHeaderBytes];
    const ssize_t n = ::recv(fd_.get(), header, sizeof(header), MSG_PEEK | MSG_DONTWAIT);
    if (n == static_cast<ssize_t>(sizeof(header))) {
      const uint32_t type = header[4] | (uint32_t{header[5]} << 8);
      if (static_cast<FeedKind>(type) != FeedKind::kError) return Status::OK();  // results for the reader
      uint32_t kind = 0;
      std::vector<uint8_t> text;
      Status st = RecvFeedFrame(fd_.get(), max_message_bytes_, Deadline::After(kErrorGrace), peer_, &kind, &text);
      if (!st.ok()) return Status::OK();  // let the caller report its own error
      MutexLock state(&state_mu_);
      error_seen_ = true;
      error_unread_ = true;
      error_text_.assign(text.begin(), text.end());
      return ErrorStatus();
    }
    if (n == 0) return Status::OK();  // closed without a reason
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return Status::OK();
    if (deadline.expired()) return Status::OK();
    pollfd p{fd_.get(), POLLIN, 0};
    (void)::poll(&p, 1, std::max(1, std::min(10, deadline.PollTimeoutMs())));
  }
}

Status FeedClient::Read(FeedKind* kind, std::vector<uint8_t>* payload, Deadline deadline) {
  std::lock_guard<std::mutex> lock(read_mu_);
  {
    MutexLock state(&state_mu_);
    if (error_unread_) {
      error_unread_ = false;
      *kind = FeedKind::kError;
      payload->assign(error_text_.begin(), error_text_.end());
      return Status::OK();
    }
    if (closed_) return Status::Unavailable("feed connection to " + peer_ + " is closed");
    if (!broken_.ok()) return broken_;
  }
  // Wait for a frame to begin first, so a timeout consumes nothing.
  for (;;) {
    pollfd p{fd_.get(), POLLIN, 0};
    const int rc = ::poll(&p, 1, deadline.PollTimeoutMs());
    if (rc > 0) break;
    if (rc == 0) return Status::DeadlineExceeded("no result from the node's feed server at " + peer_ + " in time");
    if (errno != EINTR) return Status::FromErrno(errno, "poll feed connection to " + peer_);
  }
  uint32_t k = 0;
  Status st = RecvFeedFrame(fd_.get(), max_message_bytes_, deadline, peer_, &k, payload);
  if (st.ok() && !IsResultKind(k)) {
    st = Status::Corruption("feed server at " + peer_ + " sent a message of kind " + std::to_string(k) +
                            ", not a result");
  }
  if (!st.ok()) {
    MarkBroken(st);
    return st;
  }
  *kind = static_cast<FeedKind>(k);
  if (*kind == FeedKind::kError) {
    MutexLock state(&state_mu_);
    error_seen_ = true;
    error_text_.assign(payload->begin(), payload->end());
  }
  return Status::OK();
}

void FeedClient::Close() {
  std::lock_guard<std::mutex> closing(close_mu_);
  {
    MutexLock state(&state_mu_);
    if (closed_) return;
    closed_ = true;
  }
  ::shutdown(fd_.get(), SHUT_RDWR);  // wakes a blocked Write or Read
  std::scoped_lock lock(write_mu_, read_mu_);
  (void)fd_.Close();
}

}  // namespace ember::feed
