// Mutex, MutexLock, CondVar: std::mutex and std::condition_variable with
// clang thread-safety annotations (LevelDB's port::Mutex).  libstdc++'s
// std::mutex is not a `capability`, so GUARDED_BY(std::mutex) is not
// checked; GUARDED_BY(ember::Mutex) is, by the -Wthread-safety build in
// `make test` (build/tsan).
//
//   Mutex mu_;
//   int n_ GUARDED_BY(mu_);
//   void Add() { MutexLock lock(&mu_); ++n_; }
//
// CondVar has no predicate overloads: clang does not see that a lambda runs
// under the caller's lock, so waits are loops at the call site:
//   while (!done_ && cv_.WaitUntil(&mu_, deadline.when())) {}
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#include "common/thread_annotations.h"

namespace ember {

class CAPABILITY("mutex") Mutex {
 public:
  Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void Lock() ACQUIRE() { mu_.lock(); }
  void Unlock() RELEASE() { mu_.unlock(); }
  // Tells the analysis the caller holds the lock (no run-time check).
  void AssertHeld() ASSERT_EXCLUSIVE_LOCK() {}

 private:
  friend class CondVar;
  std::mutex mu_;
};

// Holds `mu` for the enclosing scope.  Unlock()/Lock() drop and retake it
// inside the scope (e.g. to write to a socket without the lock).
class SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex* mu) ACQUIRE(mu) : mu_(mu) { mu_->Lock(); }
  ~MutexLock() RELEASE() {
    if (held_) mu_->Unlock();
  }
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void Unlock() RELEASE() {
    held_ = false;
    mu_->Unlock();
  }
  void Lock() ACQUIRE() {
    mu_->Lock();
    held_ = true;
  }

 private:
  Mutex* const mu_;
  bool held_ = true;
};

// A condition variable used with one Mutex, which every call names and
// holds (so the analysis checks it):
//   MutexLock lock(&mu_);
//   while (!done_) cv_.Wait(&mu_);
// Waits can wake spuriously; loop on the condition.
class CondVar {
 public:
  CondVar() = default;
  CondVar(const CondVar&) = delete;
  CondVar& operator=(const CondVar&) = delete;

  void Wait(Mutex* mu) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    cv_.wait(lock);
    lock.release();
  }
  // False once `when` has passed (a wake-up, spurious or not, returns true).
  template <typename Clock, typename Dur>
  bool WaitUntil(Mutex* mu, std::chrono::time_point<Clock, Dur> when) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    std::unique_lock<std::mutex> lock(mu->mu_, std::adopt_lock);
    const bool woken = cv_.wait_until(lock, when) == std::cv_status::no_timeout;
    lock.release();
    return woken;
  }
  template <typename Rep, typename Period>
  bool WaitFor(Mutex* mu, std::chrono::duration<Rep, Period> d) EXCLUSIVE_LOCKS_REQUIRED(mu) {
    return WaitUntil(mu, std::chrono::steady_clock::now() + d);
  }
  void Signal() { cv_.notify_one(); }
  void SignalAll() { cv_.notify_all(); }

 private:
  std::condition_variable cv_;
};

}  // namespace ember
