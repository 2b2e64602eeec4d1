#include "transport/shm/wait.h"

#include <linux/futex.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <ctime>

namespace ember::shm {

bool ProcessGone(int64_t pid) { return pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH; }

int64_t SliceMs(const Deadline& deadline, Duration slice) {
  if (deadline.infinite()) return slice.count();
  return std::clamp<int64_t>(deadline.remaining().count(), 1, slice.count());
}

void CondWaitMs(pthread_cond_t* cv, pthread_mutex_t* mu, int64_t ms) {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  ts.tv_nsec += (ms % 1000) * 1000000;
  ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000;
  ts.tv_nsec %= 1000000000;
  if (pthread_cond_timedwait(cv, mu, &ts) == EOWNERDEAD) pthread_mutex_consistent(mu);
}

void FutexWaitMs(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms) {
  timespec ts{static_cast<time_t>(ms / 1000), static_cast<long>((ms % 1000) * 1000000)};
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}

void FutexWake(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

}  // namespace ember::shm
