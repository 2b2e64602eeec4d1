#include "transport/tcp/acceptor.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <utility>
#include <vector>

#include "common/finished.h"
#include "common/logging.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ember::tcp {

// A connection and the thread serving it.  `finished` is the thread's last
// write; after it the accept thread may join it.
struct Acceptor::Entry {
  std::shared_ptr<Connection> conn;
  std::thread thread;
  std::atomic<bool> finished{false};
};

Connection::Connection(uint64_t id, Fd fd, std::string peer)
    : id_(id), fd_(std::move(fd)), peer_(std::move(peer)) {}

void Connection::Shutdown() {
  shut_down_ = true;
  MutexLock lock(&hook_mu_);
  if (fd_.valid()) ::shutdown(fd_.get(), SHUT_RDWR);
  if (hook_) hook_();
}

void Connection::OnShutdown(std::function<void()> hook) {
  MutexLock lock(&hook_mu_);
  hook_ = std::move(hook);
  if (hook_ && shut_down_) hook_();
}

Fd Connection::Release() {
  MutexLock lock(&hook_mu_);
  return std::move(fd_);
}

Status ValidateAcceptorOptions(const AcceptorOptions& options) {
  if (options.secret.size() < 16) {
    return Status::InvalidArgument(options.name + ": the job secret must be at least 16 bytes, got " +
                                   std::to_string(options.secret.size()));
  }
  if (options.handshake_timeout.count() <= 0 || options.max_pending_handshakes == 0) {
    return Status::InvalidArgument(options.name + ": handshake_timeout and max_pending_handshakes must be positive");
  }
  return Status::OK();
}

Result<std::unique_ptr<Acceptor>> Acceptor::Serve(const AcceptorOptions& options, Fd listener, Handler handler) {
  return Start(options, std::move(listener), std::move(handler), nullptr);
}

Result<std::unique_ptr<Acceptor>> Acceptor::HandOver(const AcceptorOptions& options, Fd listener, Admit admit) {
  return Start(options, std::move(listener), nullptr, std::move(admit));
}

Result<std::unique_ptr<Acceptor>> Acceptor::Start(const AcceptorOptions& options, Fd listener, Handler handler,
                                                  Admit admit) {
  EMBER_RETURN_NOT_OK(ValidateAcceptorOptions(options));
  EMBER_ASSIGN_OR_RAISE(int port, LocalPort(listener.get()));
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC | O_NONBLOCK) != 0) return Status::FromErrno(errno, options.name + ": pipe2");
  std::unique_ptr<Acceptor> acceptor(new Acceptor(options, std::move(handler), std::move(admit), std::move(listener),
                                                  port, Fd(pipe_fds[0]), Fd(pipe_fds[1])));
  acceptor->accept_thread_ = std::thread(&Acceptor::AcceptLoop, acceptor.get());
  return acceptor;
}

Acceptor::Acceptor(const AcceptorOptions& options, Handler handler, Admit admit, Fd listener, int port,
                   Fd wake_read, Fd wake_write)
    : options_(options),
      handler_(std::move(handler)),
      admit_(std::move(admit)),
      listen_fd_(std::move(listener)),
      port_(port),
      wake_read_(std::move(wake_read)),
      wake_write_(std::move(wake_write)),
      pending_(options.max_pending_handshakes) {}

Acceptor::~Acceptor() { Close(); }

ServerStats Acceptor::stats() const {
  ServerStats s;
  s.accepted = accepted_.load();
  s.rejected = rejected_.load();
  s.dropped_pending = dropped_.load();
  return s;
}

void Acceptor::Wake() {
  const char byte = 1;
  // A full pipe already holds a wake-up; nothing is lost.
  (void)!::write(wake_write_.get(), &byte, 1);
}

void Acceptor::AcceptLoop() {
  for (;;) {
    Fd fd = AcceptUntilWoken(listen_fd_.get(), wake_read_.get(), options_.name.c_str());
    if (fd.valid()) {
      Enter(std::move(fd));
      continue;
    }
    char buf[64];
    while (::read(wake_read_.get(), buf, sizeof(buf)) > 0) {
    }
    {
      MutexLock lock(&mu_);
      if (closing_) return;
    }
    ReapFinished();
  }
}

void Acceptor::Enter(Fd fd) {
  std::string peer = PeerAddress(fd.get());
  MutexLock lock(&mu_);
  if (closing_) return;
  auto entry = std::make_unique<Entry>();
  entry->conn = std::make_shared<Connection>(next_id_++, std::move(fd), std::move(peer));
  // Counted before its thread starts, so Finish() always finds it (or its drop).
  (void)pending_.Start(entry->conn->id(), entry->conn->fd(), entry->conn->peer());
  Entry* raw = entry.get();
  entries_.push_back(std::move(entry));
  raw->thread = std::thread(&Acceptor::Run, this, raw);
}

void Acceptor::Run(Entry* entry) {
  Connection& conn = *entry->conn;
  // The connection leaves the pending set once the peer proved the secret, before it is told
  // so: from then on it cannot be dropped.
  bool dropped = false;
  auto verified = [&]() -> Status {
    dropped = pending_.Finish(conn.id());
    return dropped ? Status::Unavailable("dropped from the handshake") : Status::OK();
  };
  const Deadline deadline = Deadline::After(options_.handshake_timeout);
  Status hs = ServerHandshake(conn.fd(), options_.secret, deadline, conn.peer(), verified);
  if (!hs.ok() && !dropped) dropped = pending_.Finish(conn.id());
  if (hs.ok()) {
    if (handler_) {
      ++accepted_;
      handler_(conn);
    } else {
      HandOverConnection(conn, deadline);
    }
  } else if (dropped && !conn.shut_down()) {
    const uint64_t n = ++dropped_;
    if ((n & (n - 1)) == 0) {  // 1, 2, 4, ...: a flood must not flood the log too
      EMBER_LOG(WARN) << options_.name << ": dropped the pending handshake of " << conn.peer()
                      << " to admit a newer connection: " << options_.max_pending_handshakes
                      << " connections were in the handshake (max_pending_handshakes; a flood of "
                         "unauthenticated connections?); "
                      << n << " dropped so far";
    }
  } else {
    Reject(conn, "rejected unauthenticated connection from ", hs);
  }
  conn.OnShutdown(nullptr);
  conn.Shutdown();
  entry->finished = true;
  Wake();  // the accept thread joins us
}

void Acceptor::HandOverConnection(Connection& conn, Deadline deadline) {
  Status admitted = admit_(conn.fd(), conn.peer(), deadline);
  if (!admitted.ok()) {
    Reject(conn, "rejected connection from ", admitted);
    return;
  }
  ++accepted_;
  Fd fd = conn.Release();
  MutexLock lock(&mu_);
  if (closing_) return;  // fd closes here; Close() is shutting everything down
  ready_.push_back(std::move(fd));
  taken_cv_.SignalAll();
}

void Acceptor::Reject(const Connection& conn, const char* what, const Status& why) {
  if (!conn.shut_down()) {  // once closing, a failure is just the shutdown
    EMBER_LOG(WARN) << options_.name << ": " << what << conn.peer() << ": " << why.message();
    MutexLock lock(&mu_);
    last_rejection_ = conn.peer() + ": " + why.ToString();
  }
  ++rejected_;  // after the log line: a caller that sees the count finds the line too
}

Result<Fd> Acceptor::Take(Deadline deadline) {
  if (!admit_) return Status::Internal(options_.name + ": Take() on an acceptor that serves its connections");
  MutexLock lock(&mu_);
  while (ready_.empty() && !closing_) {
    if (deadline.infinite()) {
      taken_cv_.Wait(&mu_);
    } else if (!taken_cv_.WaitUntil(&mu_, deadline.when())) {
      break;
    }
  }
  if (!ready_.empty()) {
    Fd fd = std::move(ready_.front());
    ready_.pop_front();
    return fd;
  }
  if (closing_) return Status::Aborted(options_.name + " is closed");
  return Status::DeadlineExceeded(options_.name + ": no connection was admitted before the deadline");
}

std::string Acceptor::last_rejection() const {
  MutexLock lock(&mu_);
  return last_rejection_;
}

void Acceptor::ReapFinished() {
  std::vector<std::unique_ptr<Entry>> done;
  {
    MutexLock lock(&mu_);
    done = TakeFinished(entries_);
  }
  JoinAll(done);
}

void Acceptor::Close() {
  MutexLock close_lock(&close_mu_);
  if (closed_) return;
  closed_ = true;
  {
    MutexLock lock(&mu_);
    closing_ = true;
    taken_cv_.SignalAll();
  }
  Wake();
  if (accept_thread_.joinable()) accept_thread_.join();
  std::list<std::unique_ptr<Entry>> entries;
  {
    MutexLock lock(&mu_);
    entries.swap(entries_);  // no new ones: the accept thread is gone
  }
  for (auto& e : entries) e->conn->Shutdown();
  for (auto& e : entries) e->thread.join();
  std::deque<Fd> untaken;
  {
    MutexLock lock(&mu_);
    untaken.swap(ready_);
  }
  (void)listen_fd_.Close();
}

}  // namespace ember::tcp
