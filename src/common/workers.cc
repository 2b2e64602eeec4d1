#include "common/workers.h"

#include <algorithm>

namespace ember {

Workers::Workers(int threads) {
  for (int i = 1; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

Workers::~Workers() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  wake_.SignalAll();
  for (std::thread& t : threads_) t.join();
}

Workers::Range Workers::Split(size_t count, int pieces, int i, size_t align) {
  align = std::max<size_t>(align, 1);
  pieces = std::max(pieces, 1);
  const size_t per = (count / static_cast<size_t>(pieces) + align - 1) / align * align;
  const size_t b = std::min(count, per * static_cast<size_t>(i));
  const size_t e = i + 1 >= pieces ? count : std::min(count, per * static_cast<size_t>(i + 1));
  return {b, e};
}

void Workers::Drain(const std::function<void(int)>* fn, int n) {
  for (int i = next_.fetch_add(1, std::memory_order_relaxed); i < n; i = next_.fetch_add(1, std::memory_order_relaxed)) {
    (*fn)(i);
    if (left_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      MutexLock lock(&mu_);  // the owner checks left_ under mu_: no lost wake-up
      done_.SignalAll();
    }
  }
}

void Workers::Run(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (threads_.empty() || n == 1) {
    for (int i = 0; i < n; ++i) fn(i);
    return;
  }
  {
    MutexLock lock(&mu_);
    fn_ = &fn;
    n_ = n;
    next_.store(0, std::memory_order_relaxed);
    left_.store(n, std::memory_order_relaxed);
    ++job_;
  }
  wake_.SignalAll();
  Drain(&fn, n);
  MutexLock lock(&mu_);
  // Every piece finished, and no thread still holds the job (it may be about
  // to read next_ of a job that is over: harmless, but fn_ must outlive it).
  while (left_.load(std::memory_order_acquire) != 0 || busy_ != 0) done_.Wait(&mu_);
  fn_ = nullptr;
}

void Workers::Loop() {
  uint64_t seen = 0;
  MutexLock lock(&mu_);
  while (true) {
    while (!stop_ && job_ == seen) wake_.Wait(&mu_);
    if (stop_) return;
    seen = job_;
    const std::function<void(int)>* fn = fn_;
    const int n = n_;
    if (fn == nullptr) continue;  // the job ended before this thread woke
    ++busy_;
    lock.Unlock();
    Drain(fn, n);
    lock.Lock();
    if (--busy_ == 0) done_.SignalAll();
  }
}

}  // namespace ember
