// shm::WaitShared: the one wait on state other processes change (ring.cc,
// collective/shm_group.cc).  Order of looks: condition/abort word, peer,
// deadline; sleeps block on the event and end when it is signalled.
#include "transport/shm/wait.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>

namespace ember::shm {
namespace {

using Clock = std::chrono::steady_clock;

int64_t MsSince(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count();
}

TEST(ShmWait, SliceIsCutToTheDeadline) {
  EXPECT_EQ(SliceMs(Deadline::Infinite(), Duration(100)), 100);
  EXPECT_EQ(SliceMs(Deadline::After(Duration(10000)), Duration(100)), 100);
  EXPECT_LE(SliceMs(Deadline::After(Duration(30)), Duration(100)), 30);
  EXPECT_EQ(SliceMs(Deadline::After(Duration(0)), Duration(100)), 1);  // never a busy spin
}

TEST(ShmWait, ProcessGoneOnlyForAReapedProcess) {
  EXPECT_FALSE(ProcessGone(0));  // unknown yet
  EXPECT_FALSE(ProcessGone(::getpid()));
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(ProcessGone(child));
}

// A futex wake ends the sleep at once, however long the slice.
TEST(ShmWait, FutexWakeEndsTheWait) {
  std::atomic<uint32_t> word{0};
  std::thread waker([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    word.store(1);
    FutexWake(&word);
  });
  const auto t0 = Clock::now();
  int sleeps = 0;
  Status s = WaitShared(
      Deadline::After(Duration(10000)), Duration(5000),
      [&]() -> std::optional<Status> { return word.load() == 1 ? std::optional<Status>(Status::OK()) : std::nullopt; },
      NoPeer, [] { return Status::DeadlineExceeded("word"); },
      [&](int64_t ms) {
        ++sleeps;
        FutexWaitMs(&word, 0, ms);
      });
  waker.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(MsSince(t0), 2000);
  EXPECT_LE(sleeps, 2);
}

// The abort word (poll) wins over a dead peer, a dead peer over the deadline.
TEST(ShmWait, OrderOfLooksIsPollThenPeerThenDeadline) {
  const Deadline past = Deadline::After(Duration(0));
  auto never = [](int64_t) { ADD_FAILURE() << "slept"; };
  Status s = WaitShared(
      past, Duration(50), [] { return std::optional<Status>(Status::Aborted("abort word")); },
      [] { return std::optional<Status>(Status::Aborted("peer gone")); }, [] { return Status::DeadlineExceeded("x"); },
      never);
  EXPECT_EQ(s.message(), "abort word");
  s = WaitShared(
      past, Duration(50), [] { return std::optional<Status>(); },
      [] { return std::optional<Status>(Status::Aborted("peer gone")); }, [] { return Status::DeadlineExceeded("x"); },
      never);
  EXPECT_EQ(s.message(), "peer gone");
  s = WaitShared(past, Duration(50), [] { return std::optional<Status>(); }, NoPeer,
                 [] { return Status::DeadlineExceeded("the word"); }, never);
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(s.message(), "the word");
}

// A peer that dies during the wait ends it within a slice, not at the deadline.
TEST(ShmWait, DeadPeerEndsTheWaitWithinASlice) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::usleep(100 * 1000);
    ::_exit(0);
  }
  std::thread reaper([&] {
    int status = 0;
    (void)::waitpid(child, &status, 0);
  });
  std::atomic<uint32_t> word{0};
  const auto t0 = Clock::now();
  Status s = WaitShared(
      Deadline::After(Duration(10000)), Duration(20), [] { return std::optional<Status>(); },
      [&]() -> std::optional<Status> {
        if (ProcessGone(child)) return Status::Aborted("peer " + std::to_string(child) + " is gone");
        return std::nullopt;
      },
      [] { return Status::DeadlineExceeded("x"); }, [&](int64_t ms) { FutexWaitMs(&word, 0, ms); });
  reaper.join();
  EXPECT_EQ(s.code(), StatusCode::kAborted) << s.ToString();
  EXPECT_LT(MsSince(t0), 3000);
}

// poll() may extend the deadline it is given (a wait that restarts on progress).
TEST(ShmWait, PollMayExtendTheDeadline) {
  Deadline deadline = Deadline::After(Duration(30));
  int rounds = 0;
  const auto t0 = Clock::now();
  Status s = WaitShared(
      deadline, Duration(10),
      [&]() -> std::optional<Status> {
        if (++rounds < 5) deadline = Deadline::After(Duration(30));  // progress
        return std::nullopt;
      },
      NoPeer, [] { return Status::DeadlineExceeded("idle"); },
      [](int64_t ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); });
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded);
  EXPECT_GE(rounds, 5);
  EXPECT_GE(MsSince(t0), 60);
}

}  // namespace
}  // namespace ember::shm
