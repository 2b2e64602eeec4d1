#include "transport/tcp/splice.h"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace ember::tcp {
namespace {

// Bytes read from `from` and not yet written to `to`: buf[head, tail).
struct Direction {
  int from, to;
  const std::string& from_name;
  const std::string& to_name;
  std::vector<char> buf;
  size_t head = 0, tail = 0;
  bool eof = false;  // `from` closed
  uint64_t moved = 0;

  size_t pending() const { return tail - head; }
  bool room() const { return pending() < buf.size(); }

  // One recv(2) into the free space; EOF sets `eof`.
  Status Fill() {
    if (tail == buf.size()) {  // room() holds: the free space is at the front
      std::memmove(buf.data(), buf.data() + head, pending());
      tail -= head;
      head = 0;
    }
    for (;;) {
      const ssize_t r = ::recv(from, buf.data() + tail, buf.size() - tail, 0);
      if (r > 0) {
        tail += static_cast<size_t>(r);
        return Status::OK();
      }
      if (r == 0) {
        eof = true;
        return Status::OK();
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
      return Status::FromErrno(errno, "read from " + from_name);
    }
  }

  // One send(2) of the pending bytes.
  Status Drain() {
    for (;;) {
      const ssize_t w = ::send(to, buf.data() + head, pending(), MSG_NOSIGNAL);
      if (w >= 0) {
        head += static_cast<size_t>(w);
        moved += static_cast<uint64_t>(w);
        if (head == tail) head = tail = 0;
        return Status::OK();
      }
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::OK();
      return Status::FromErrno(errno, "write to " + to_name);
    }
  }
};

constexpr short kReadable = POLLIN | POLLHUP | POLLERR;
constexpr short kWritable = POLLOUT | POLLHUP | POLLERR;

}  // namespace

SpliceResult Splice(int a, int b, const std::string& a_name, const std::string& b_name,
                    const SpliceOptions& options) {
  const size_t cap = std::max<size_t>(options.buffer_bytes, 1);
  Direction ab{a, b, a_name, b_name, std::vector<char>(cap)};
  Direction ba{b, a, b_name, a_name, std::vector<char>(cap)};
  SpliceResult result;
  const auto finish = [&](Status status) {
    result.a_to_b = ab.moved;
    result.b_to_a = ba.moved;
    result.status = std::move(status);
    return result;
  };
  // Once a side closed: the direction whose bytes are still flushed, by `drain`.
  Direction* closing = nullptr;
  Deadline drain = Deadline::Infinite();
  for (;;) {
    if (closing != nullptr && closing->pending() == 0) {
      result.closed_by = closing->from_name;
      return finish(Status::OK());
    }
    short ev_a = 0, ev_b = 0;
    if (closing == nullptr) {
      if (ab.room()) ev_a |= POLLIN;
      if (ba.room()) ev_b |= POLLIN;
    }
    if (ab.pending() > 0 && (closing == nullptr || closing == &ab)) ev_b |= POLLOUT;
    if (ba.pending() > 0 && (closing == nullptr || closing == &ba)) ev_a |= POLLOUT;
    // A socket we wait on for nothing is left out (fd -1), so its POLLHUP
    // cannot spin the loop while its direction waits for buffer room.
    pollfd fds[2] = {{ev_a != 0 ? a : -1, ev_a, 0}, {ev_b != 0 ? b : -1, ev_b, 0}};
    const int n = ::poll(fds, 2, drain.PollTimeoutMs());
    if (n < 0) {
      if (errno == EINTR) continue;
      return finish(Status::FromErrno(errno, "poll " + a_name + " and " + b_name));
    }
    if (n == 0) {
      return finish(Status::DeadlineExceeded(
          closing->to_name + " did not take the last " + std::to_string(closing->pending()) + " bytes from " +
          closing->from_name + " within " + FormatDuration(options.drain_timeout) + " after it closed"));
    }
    if ((fds[0].revents | fds[1].revents) & POLLNVAL) {
      return finish(Status::IOError("splice of " + a_name + " and " + b_name + ": a descriptor is not open"));
    }
    if ((ev_a & POLLIN) && (fds[0].revents & kReadable)) {
      if (Status st = ab.Fill(); !st.ok()) return finish(std::move(st));
    }
    if ((ev_b & POLLIN) && (fds[1].revents & kReadable)) {
      if (Status st = ba.Fill(); !st.ok()) return finish(std::move(st));
    }
    if ((ev_b & POLLOUT) && (fds[1].revents & kWritable)) {
      if (Status st = ab.Drain(); !st.ok()) return finish(std::move(st));
    }
    if ((ev_a & POLLOUT) && (fds[0].revents & kWritable)) {
      if (Status st = ba.Drain(); !st.ok()) return finish(std::move(st));
    }
    if (closing == nullptr && (ab.eof || ba.eof)) {
      closing = ab.eof ? &ab : &ba;
      drain = Deadline::After(options.drain_timeout);
    }
  }
}

}  // namespace ember::tcp
