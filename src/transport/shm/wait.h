// WaitShared: the one way Ember waits on state that other processes change
// in shared memory (the shared-memory ring, ring.h; a collective group's
// segment, collective/shm_group.h).  Such a wait cannot count on being
// woken: the process on the other side may die or abort at any moment.  So
// it sleeps on the event itself (a process-shared condition variable or a
// futex word) in slices of at most `slice`, and before every slice looks, in
// this order, at:
//   1. poll():    the condition and the user's abort word; a status ends the
//                 wait with it (OK: the condition holds);
//   2. peer():    the liveness of the process it waits on (ProcessGone); a
//                 status ends the wait with it;
//   3. deadline:  expired() words the DeadlineExceeded, naming what was
//                 waited for;
// then sleep(ms) blocks for at most one slice (SliceMs).  `deadline` is read
// every round, so poll() may extend it (a wait that restarts on progress).
// Every status is worded by the caller, who knows what it waited for.
//
// A template, so the collectives' hot path pays no allocation or indirect
// call for it.  Thread-safe as far as the callables are.
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>

#include <pthread.h>

#include "ember/deadline.h"
#include "ember/status.h"

namespace ember::shm {

// True once process `pid` is gone (kill(pid, 0) fails with ESRCH); a pid of
// 0 or less (not known yet) is never gone.
bool ProcessGone(int64_t pid);

// How long one slice may sleep: `slice`, cut to what is left of `deadline`,
// at least 1 ms.
int64_t SliceMs(const Deadline& deadline, Duration slice);

// Sleeps on a process-shared condition variable (CLOCK_MONOTONIC) whose
// robust mutex `mu` the caller holds, for at most `ms`.  If the mutex's
// owner died, marks it consistent (the caller's data must stay consistent
// at every point a holder can die).
void CondWaitMs(pthread_cond_t* cv, pthread_mutex_t* mu, int64_t ms);

// Sleeps while the process-shared futex `word` holds `expected`, for at
// most `ms`; FutexWake wakes every sleeper.
void FutexWaitMs(std::atomic<uint32_t>* word, uint32_t expected, int64_t ms);
void FutexWake(std::atomic<uint32_t>* word);

// peer() for a wait that watches no process (a consumer does not watch
// its producers).
inline std::optional<Status> NoPeer() { return std::nullopt; }

template <typename Poll, typename Peer, typename Expired, typename Sleep>
Status WaitShared(const Deadline& deadline, Duration slice, Poll&& poll, Peer&& peer, Expired&& expired,
                  Sleep&& sleep) {
  for (;;) {
    if (std::optional<Status> done = poll()) return *std::move(done);
    if (std::optional<Status> gone = peer()) return *std::move(gone);
    if (deadline.expired()) return expired();
    sleep(SliceMs(deadline, slice));
  }
}

}  // namespace ember::shm
