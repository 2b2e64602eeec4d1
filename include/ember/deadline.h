// Duration, the one unit of every timeout in the public headers, and
// Deadline: a point on the steady clock by which something must finish.
// Value types; thread-compatible.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace ember {

using Duration = std::chrono::milliseconds;

class Deadline {
 public:
  using Clock = std::chrono::steady_clock;

  // `d` from now.  Negative durations give an already expired deadline;
  // durations too large to represent give Infinite().
  static Deadline After(Duration d) {
    const auto now = Clock::now();
    if (d.count() > 0 && d > std::chrono::duration_cast<Duration>(Clock::time_point::max() - now)) {
      return Infinite();
    }
    return Deadline(now + d);
  }
  static Deadline At(Clock::time_point when) { return Deadline(when); }
  static Deadline Infinite() { return Deadline(Clock::time_point::max()); }

  bool infinite() const { return when_ == Clock::time_point::max(); }
  Clock::time_point when() const { return when_; }
  bool expired() const { return !infinite() && Clock::now() >= when_; }

  // Time left, never negative; Duration::max() when infinite.
  Duration remaining() const {
    if (infinite()) return Duration::max();
    const auto left = when_ - Clock::now();
    if (left <= Clock::duration::zero()) return Duration::zero();
    return std::chrono::ceil<Duration>(left);
  }

  // Timeout argument for poll(2): -1 when infinite, else remaining ms
  // rounded up and clamped to int.
  int PollTimeoutMs() const {
    if (infinite()) return -1;
    const int64_t ms = remaining().count();
    return ms > INT32_MAX ? INT32_MAX : static_cast<int>(ms);
  }

  friend bool operator<(const Deadline& a, const Deadline& b) { return a.when_ < b.when_; }

 private:
  explicit Deadline(Clock::time_point when) : when_(when) {}
  Clock::time_point when_;
};

// "250ms", "10s": short human text for timeouts in error messages.
inline std::string FormatDuration(Duration d) {
  const int64_t ms = d.count();
  if (ms != 0 && ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace ember
