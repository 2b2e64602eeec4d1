#include "common/fd.h"

#include <errno.h>
#include <unistd.h>

#include <string>

namespace ember {

Fd::~Fd() { (void)Close(); }

Fd& Fd::operator=(Fd&& other) noexcept {
  if (this != &other) {
    (void)Close();
    fd_ = other.Detach();
  }
  return *this;
}

Status Fd::Close() {
  const int fd = std::exchange(fd_, -1);
  if (fd < 0) return Status::OK();
  // Never retry on EINTR: on Linux the descriptor is already gone.
  if (::close(fd) != 0 && errno != EINTR) {
    return Status::FromErrno(errno, "close fd " + std::to_string(fd));
  }
  return Status::OK();
}

}  // namespace ember
