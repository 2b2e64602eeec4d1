// Workers: a few persistent threads that run the pieces of one job together
// with the calling thread: a parallel loop for memory-bound work (the large
// copies and reductions of the shared-memory collectives), where one core
// cannot draw a big host's memory bandwidth.  One job at a time; the pieces
// of a job run in any order on any of the threads.
//
//   Workers w(4);                      // the caller and 3 threads
//   w.Run(8, [&](int i) { Work(i); });  // returns once Work(0..7) all ran
//
// Thread-compatible: Run is called by one thread at a time (the owner).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace ember {

class Workers {
 public:
  // `threads` counts the caller: <= 1 starts no thread and Run runs inline.
  explicit Workers(int threads);
  ~Workers();  // stops and joins the threads
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;

  int threads() const { return static_cast<int>(threads_.size()) + 1; }

  // Runs fn(0) .. fn(n - 1) over the threads and the caller; returns once
  // every one returned.  `fn` must not throw.
  void Run(int n, const std::function<void(int)>& fn);

  // Splits [0, count) into at most `pieces` ranges whose bounds (but the
  // last) are multiples of `align`; the range of piece `i`.
  struct Range {
    size_t begin = 0, end = 0;
  };
  static Range Split(size_t count, int pieces, int i, size_t align);

 private:
  void Loop();
  // Takes pieces of the current job until none is left.
  void Drain(const std::function<void(int)>* fn, int n);

  Mutex mu_;
  CondVar wake_;  // a new job, or stop
  CondVar done_;  // the last piece of a job finished
  uint64_t job_ GUARDED_BY(mu_) = 0;
  bool stop_ GUARDED_BY(mu_) = false;
  const std::function<void(int)>* fn_ GUARDED_BY(mu_) = nullptr;
  int n_ GUARDED_BY(mu_) = 0;
  int busy_ GUARDED_BY(mu_) = 0;  // threads inside the current job
  std::atomic<int> next_{0};      // the next piece to take
  std::atomic<int> left_{0};      // pieces not yet finished
  std::vector<std::thread> threads_;
};

}  // namespace ember
