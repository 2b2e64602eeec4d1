// Helpers shared by the gtests (never linked into the core).
#pragma once

#include <chrono>
#include <condition_variable>
#include <initializer_list>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "ember/deadline.h"
#include "common/logging.h"

namespace ember::testing {

// Collects the warning (and error) lines the core logs while it lives, e.g.
// a server's line about a rejected peer.  Thread-safe.
class WarningCapture {
 public:
  WarningCapture() {
    SetLogSink([this](LogLevel level, std::string_view msg) {
      std::lock_guard<std::mutex> lock(mu_);
      if (level >= LogLevel::kWarn) lines_.emplace_back(msg);
    });
  }
  ~WarningCapture() { SetLogSink(nullptr); }
  WarningCapture(const WarningCapture&) = delete;
  WarningCapture& operator=(const WarningCapture&) = delete;

  // How many captured lines contain `needle`.
  int Count(const std::string& needle) {
    std::lock_guard<std::mutex> lock(mu_);
    int n = 0;
    for (const auto& l : lines_) n += l.find(needle) != std::string::npos;
    return n;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

// Collects every line the core logs while it lives, as "<LEVEL> <message>", and waits for one.
// Thread-safe.
class LogCapture {
 public:
  LogCapture() {
    SetLogSink([this](LogLevel level, std::string_view msg) {
      std::lock_guard<std::mutex> lock(mu_);
      lines_.push_back(std::string(LogLevelName(level)) + " " + std::string(msg));
      cv_.notify_all();
    });
  }
  ~LogCapture() { SetLogSink(nullptr); }
  LogCapture(const LogCapture&) = delete;
  LogCapture& operator=(const LogCapture&) = delete;

  // Waits for a line containing every one of `needles`; returns it, or "" on timeout.
  std::string WaitFor(std::initializer_list<std::string> needles, Duration timeout = Duration(10000)) {
    std::unique_lock<std::mutex> lock(mu_);
    std::string found;
    cv_.wait_for(lock, timeout, [&] {
      for (const auto& l : lines_) {
        bool all = true;
        for (const auto& n : needles) all = all && l.find(n) != std::string::npos;
        if (all) {
          found = l;
          return true;
        }
      }
      return false;
    });
    return found;
  }
  std::string WaitFor(const std::string& needle, Duration timeout = Duration(10000)) {
    return WaitFor({needle}, timeout);
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::string> lines_;
};

// Whether `pred()` turns true within `limit`, looking every 5 ms (tests of
// counters that other threads bump have nothing to block on).
template <typename Pred>
bool WaitUntil(Pred pred, Duration limit = Duration(5000)) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (pred()) return true;
    std::this_thread::sleep_for(Duration(5));
  }
  return pred();
}

}  // namespace ember::testing
