#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <thread>

#include "common/logging.h"

namespace ember::tcp {
namespace {

std::string HostPort(const std::string& host, int port) {
  return host + ":" + std::to_string(port);
}

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoPtr = std::unique_ptr<addrinfo, AddrInfoDeleter>;

Result<AddrInfoPtr> Resolve(const std::string& host, int port, bool passive) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  addrinfo* res = nullptr;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &res);
  if (rc != 0) {
    return Status::IOError("cannot resolve " + HostPort(host, port) + ": " + gai_strerror(rc));
  }
  return AddrInfoPtr(res);
}

// Waits for `events` on fd.  OK when ready, DeadlineExceeded on timeout.
Status WaitFor(int fd, short events, Deadline deadline, const std::string& what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, deadline.PollTimeoutMs());
    if (rc > 0) return Status::OK();  // errors/hangup surface on the next syscall
    if (rc == 0) return Status::DeadlineExceeded(what + ": timed out");
    if (errno != EINTR) return Status::FromErrno(errno, what + ": poll");
  }
}

}  // namespace

Status SetNoDelay(int fd) {
  int one = 1;
  if (::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) != 0) {
    return Status::FromErrno(errno, "setsockopt(TCP_NODELAY)");
  }
  return Status::OK();
}

Result<Fd> Listen(const std::string& host, int port, int backlog) {
  EMBER_ASSIGN_OR_RAISE(AddrInfoPtr addrs, Resolve(host, port, /*passive=*/true));
  Status last = Status::IOError("no address to listen on for " + HostPort(host, port));
  for (addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) {
      last = Status::FromErrno(errno, "socket for " + HostPort(host, port));
      continue;
    }
    int one = 1;
    (void)::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      last = Status::FromErrno(errno, "bind " + HostPort(host, port));
      continue;
    }
    if (::listen(fd.get(), backlog) != 0) {
      last = Status::FromErrno(errno, "listen on " + HostPort(host, port));
      continue;
    }
    return fd;
  }
  return last;
}

Result<int> LocalPort(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) {
    return Status::FromErrno(errno, "getsockname");
  }
  if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  if (ss.ss_family == AF_INET6) return ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port);
  return Status::Internal("getsockname: not an IP socket");
}

std::string PeerAddress(int fd) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return "unknown peer";
  char ip[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    auto* sin = reinterpret_cast<sockaddr_in*>(&ss);
    ::inet_ntop(AF_INET, &sin->sin_addr, ip, sizeof(ip));
    return std::string(ip) + ":" + std::to_string(ntohs(sin->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    auto* sin6 = reinterpret_cast<sockaddr_in6*>(&ss);
    ::inet_ntop(AF_INET6, &sin6->sin6_addr, ip, sizeof(ip));
    return "[" + std::string(ip) + "]:" + std::to_string(ntohs(sin6->sin6_port));
  }
  return "unknown peer";
}

Result<Fd> Accept(int listen_fd, Deadline deadline) {
  for (;;) {
    Fd fd(::accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (fd.valid()) {
      (void)SetNoDelay(fd.get());  // best effort: latency only
      return fd;
    }
    if (errno == EINTR || errno == ECONNABORTED) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::FromErrno(errno, "accept");
    EMBER_RETURN_NOT_OK(WaitFor(listen_fd, POLLIN, deadline, "accept"));
  }
}

Fd AcceptUntilWoken(int listen_fd, int wake_fd, const char* what) {
  for (;;) {
    pollfd fds[2] = {{listen_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) continue;  // EINTR
    if (fds[1].revents != 0) return Fd();
    Result<Fd> fd = Accept(listen_fd, Deadline::After(Duration(0)));
    if (fd.ok()) return fd.MoveValueUnsafe();
    if (fd.status().code() != StatusCode::kDeadlineExceeded) {
      EMBER_LOG(WARN) << what << " accept failed: " << fd.status().message();
      std::this_thread::sleep_for(Duration(10));  // e.g. EMFILE: do not spin
    }
  }
}

Result<Fd> Connect(const std::string& host, int port, Deadline deadline) {
  const std::string where = "connect to " + HostPort(host, port);
  EMBER_ASSIGN_OR_RAISE(AddrInfoPtr addrs, Resolve(host, port, /*passive=*/false));
  Status last = Status::IOError(where + ": no address");
  for (addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
    Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
    if (!fd.valid()) {
      last = Status::FromErrno(errno, where);
      continue;
    }
    if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      if (errno != EINPROGRESS && errno != EINTR) {
        last = Status::FromErrno(errno, where);
        continue;
      }
      Status waited = WaitFor(fd.get(), POLLOUT, deadline, where);
      if (!waited.ok()) return waited;  // out of time: no point trying other addresses
      int err = 0;
      socklen_t len = sizeof(err);
      if (::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
      if (err != 0) {
        last = Status::FromErrno(err, where);
        continue;
      }
    }
    (void)SetNoDelay(fd.get());
    return fd;
  }
  return last;
}

Status ReadExactly(int fd, void* buf, size_t n, Deadline deadline, const std::string& what) {
  auto* p = static_cast<char*>(buf);
  size_t got = 0;
  while (got < n) {
    const ssize_t r = ::recv(fd, p + got, n - got, 0);
    if (r > 0) {
      got += static_cast<size_t>(r);
      continue;
    }
    if (r == 0) {
      return Status::Unavailable(what + ": connection closed by peer after " + std::to_string(got) +
                                 " of " + std::to_string(n) + " bytes");
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::FromErrno(errno, what);
    EMBER_RETURN_NOT_OK(WaitFor(fd, POLLIN, deadline, what));
  }
  return Status::OK();
}

Status WriteAllParts(int fd, std::span<const std::string_view> parts, Deadline deadline, const std::string& what) {
  constexpr size_t kMaxIov = 64;
  size_t part = 0, offset = 0;  // the first byte not yet sent: parts[part][offset]
  while (part < parts.size()) {
    if (offset == parts[part].size()) {
      ++part;
      offset = 0;
      continue;
    }
    iovec iov[kMaxIov];
    size_t n = 0;
    for (size_t i = part; i < parts.size() && n < kMaxIov; ++i) {
      const size_t skip = i == part ? offset : 0;
      if (parts[i].size() == skip) continue;
      iov[n].iov_base = const_cast<char*>(parts[i].data() + skip);
      iov[n].iov_len = parts[i].size() - skip;
      ++n;
    }
    msghdr m{};
    m.msg_iov = iov;
    m.msg_iovlen = n;
    const ssize_t r = ::sendmsg(fd, &m, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::FromErrno(errno, what);
      EMBER_RETURN_NOT_OK(WaitFor(fd, POLLOUT, deadline, what));
      continue;
    }
    size_t sent = static_cast<size_t>(r);
    while (sent > 0 && part < parts.size()) {
      const size_t left = parts[part].size() - offset;
      if (sent < left) {
        offset += sent;
        sent = 0;
      } else {
        sent -= left;
        ++part;
        offset = 0;
      }
    }
  }
  return Status::OK();
}

Status WriteAll(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what) {
  const auto* p = static_cast<const char*>(buf);
  size_t sent = 0;
  while (sent < n) {
    const ssize_t r = ::send(fd, p + sent, n - sent, MSG_NOSIGNAL);
    if (r >= 0) {
      sent += static_cast<size_t>(r);
      continue;
    }
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return Status::FromErrno(errno, what);
    EMBER_RETURN_NOT_OK(WaitFor(fd, POLLOUT, deadline, what));
  }
  return Status::OK();
}

}  // namespace ember::tcp
