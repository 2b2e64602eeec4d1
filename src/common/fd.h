// Fd: owns one POSIX file descriptor and closes it on destruction.
// Move-only; not thread-safe (one owner at a time).
#pragma once

#include <utility>

#include "ember/status.h"

namespace ember {

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(Fd&& other) noexcept : fd_(other.Detach()) {}
  Fd& operator=(Fd&& other) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }

  // Closes the descriptor.  Idempotent: a second call (or a call on an empty
  // Fd) returns OK.  The descriptor is released even when close(2) reports
  // an error (Linux semantics), so retrying is never needed.
  Status Close();

  // Gives up ownership without closing; returns the descriptor (-1 if none).
  [[nodiscard]] int Detach() { return std::exchange(fd_, -1); }

 private:
  int fd_ = -1;
};

}  // namespace ember
