// TCP helpers.  Every socket is created CLOEXEC and non-blocking; all I/O
// waits in poll(2) under a Deadline, so no call blocks past its deadline.
// Writes use MSG_NOSIGNAL: a closed peer yields an error, never SIGPIPE.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <string_view>

#include "ember/deadline.h"
#include "common/fd.h"
#include "ember/result.h"

namespace ember::tcp {

// Binds and listens on host:port (port 0 picks a free port).  IOError names
// the address.
Result<Fd> Listen(const std::string& host, int port, int backlog = 128);

// The port a bound socket listens on.
Result<int> LocalPort(int fd);

// "ip:port" of the peer ("[ip]:port" for IPv6), or "unknown peer".
std::string PeerAddress(int fd);

// Accepts one connection (non-blocking, CLOEXEC, TCP_NODELAY).  Waits up to
// `deadline`; DeadlineExceeded if none arrives.
Result<Fd> Accept(int listen_fd, Deadline deadline);

// A server's accept loop step: waits until a connection arrives on
// `listen_fd` or `wake_fd` turns readable (the server is stopping).  Returns
// the accepted connection, or an invalid Fd once woken.  A failed accept
// (e.g. EMFILE) is logged as "<what> accept failed: ..." and retried after
// 10 ms, so the loop never spins.
Fd AcceptUntilWoken(int listen_fd, int wake_fd, const char* what);

// Connects to host:port, trying each resolved address, within `deadline`
// (non-blocking connect + poll).  IOError with the errno text on refusal,
// DeadlineExceeded on timeout.  The socket has TCP_NODELAY set.
Result<Fd> Connect(const std::string& host, int port, Deadline deadline);

Status SetNoDelay(int fd);

// Reads exactly `n` bytes.  Unavailable if the peer closes first (naming how
// many bytes had arrived), DeadlineExceeded on timeout, IOError otherwise.
// `what` names the read in messages, e.g. "handshake from 10.0.0.2:4711".
Status ReadExactly(int fd, void* buf, size_t n, Deadline deadline, const std::string& what);

// Writes all `n` bytes; errors as ReadExactly.
Status WriteAll(int fd, const void* buf, size_t n, Deadline deadline, const std::string& what);
// Writes every part in order, as one stream of bytes (sendmsg over the parts: no copy into one
// buffer first); errors as ReadExactly.
Status WriteAllParts(int fd, std::span<const std::string_view> parts, Deadline deadline, const std::string& what);

}  // namespace ember::tcp
