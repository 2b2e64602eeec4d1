#include "transport/shm/ring.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <numeric>
#include <span>
#include <set>
#include <tuple>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace ember::shm {
namespace {

std::string UniqueName() {
  static std::atomic<int> counter{0};
  return "/ember-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

std::vector<uint8_t> Bytes(uint32_t seq, size_t n) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seq * 31 + i);
  return v;
}

Deadline Soon() { return Deadline::After(Duration(5000)); }

TEST(Ring, RoundTripKeepsKindsPayloadsAndOrder) {
  auto ring = Ring::Create(UniqueName(), 1 << 16);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok()) << producer.status().ToString();

  ASSERT_TRUE((*producer)->Write(7, Bytes(1, 100), Soon()).ok());
  ASSERT_TRUE((*producer)->Write(8, {}, Soon()).ok());
  ASSERT_TRUE((*producer)->Write(9, Bytes(3, 5), Soon()).ok());

  uint32_t kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(kind, 7u);
  EXPECT_EQ(payload, Bytes(1, 100));
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(kind, 8u);
  EXPECT_TRUE(payload.empty());
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(kind, 9u);
  EXPECT_EQ(payload, Bytes(3, 5));
}

TEST(Ring, TheConsumersMarkOnlyGrowsAndProducersSeeItWithTheReadPosition) {
  auto ring = Ring::Create(UniqueName(), 1 << 16);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok()) << producer.status().ToString();
  RingProgress p;
  ASSERT_TRUE((*producer)->Progress(&p).ok());
  EXPECT_EQ(p.mark, 0u);
  EXPECT_EQ(p.read, 0u);
  (*ring)->SetMark(5);
  (*ring)->SetMark(3);  // ignored: the mark only grows
  ASSERT_TRUE((*producer)->Write(1, Bytes(1, 100), Soon()).ok());
  uint32_t kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  ASSERT_TRUE((*producer)->Progress(&p).ok());
  EXPECT_EQ(p.mark, 5u);
  EXPECT_GT(p.read, 100u);  // the message and its header were read
  (*ring)->Terminate();
  EXPECT_EQ((*producer)->Progress(&p).code(), StatusCode::kCancelled);
}

TEST(Ring, EmptyRingReadTimesOut) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  uint32_t kind;
  std::vector<uint8_t> payload;
  Status st = (*ring)->Read(&kind, &payload, Deadline::After(Duration(50)));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
}

TEST(Ring, FullRingGivesBackpressureThenDeadline) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  const size_t n = 1000;
  int written = 0;
  Status st;
  while ((st = (*producer)->Write(1, Bytes(written, n), Deadline::After(Duration(50)))).ok()) ++written;
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
  EXPECT_NE(st.message().find("the consumer (pid " + std::to_string(getpid()) + ") is not reading it"),
            std::string::npos)
      << st.ToString();
  EXPECT_GE(written, 3);
  // Reading one message frees room for exactly the next write.
  uint32_t kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(payload, Bytes(0, n));
  EXPECT_TRUE((*producer)->Write(1, Bytes(written, n), Soon()).ok());
}

TEST(Ring, RejectsOversizedMessage) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  std::vector<uint8_t> big(Ring::MaxPayload(4096) + 1);
  Status st = (*ring)->Write(1, big, Soon());
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  std::vector<uint8_t> max(Ring::MaxPayload(4096));
  EXPECT_TRUE((*ring)->Write(1, max, Soon()).ok());
}

TEST(Ring, WrapsAroundWithVaryingSizes) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  const int kMessages = 3000;
  std::thread producer([&] {
    auto p = Ring::Open((*ring)->name());
    ASSERT_TRUE(p.ok());
    for (int i = 0; i < kMessages; ++i) {
      ASSERT_TRUE((*p)->Write(i, Bytes(i, (i * 37) % 1500), Soon()).ok());
    }
  });
  uint32_t kind;
  std::vector<uint8_t> payload;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok()) << i;
    ASSERT_EQ(kind, static_cast<uint32_t>(i));
    ASSERT_EQ(payload, Bytes(i, (i * 37) % 1500)) << i;
  }
  producer.join();
}

TEST(Ring, ManyProducersEachKeepTheirOrder) {
  auto ring = Ring::Create(UniqueName(), 8192);
  ASSERT_TRUE(ring.ok());
  const int kProducers = 4, kEach = 500;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      auto w = Ring::Open((*ring)->name());
      ASSERT_TRUE(w.ok());
      for (int i = 0; i < kEach; ++i) {
        uint32_t seq = static_cast<uint32_t>(i);
        std::vector<uint8_t> body(sizeof(seq) + 64);
        std::memcpy(body.data(), &seq, sizeof(seq));
        ASSERT_TRUE((*w)->Write(p, body, Soon()).ok());
      }
    });
  }
  std::vector<uint32_t> next(kProducers, 0);
  uint32_t kind;
  std::vector<uint8_t> payload;
  for (int i = 0; i < kProducers * kEach; ++i) {
    ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
    ASSERT_LT(kind, static_cast<uint32_t>(kProducers));
    uint32_t seq;
    std::memcpy(&seq, payload.data(), sizeof(seq));
    ASSERT_EQ(seq, next[kind]) << "producer " << kind;
    ++next[kind];
  }
  for (auto& t : producers) t.join();
}

TEST(Ring, AbortWakesBlockedProducerWithReason) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  while ((*producer)->Write(1, Bytes(0, 1000), Deadline::After(Duration(10))).ok()) {
  }
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*ring)->Abort("node worker:1 failed");
  });
  EXPECT_TRUE((*producer)->Health().ok());
  Status st = (*producer)->Write(1, Bytes(0, 1000), Soon());
  aborter.join();
  EXPECT_EQ((*producer)->Health().code(), StatusCode::kAborted);
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("node worker:1 failed"), std::string::npos) << st.ToString();
}

TEST(Ring, TerminateCancelsProducersQuietly) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  while ((*producer)->Write(1, Bytes(0, 1000), Deadline::After(Duration(10))).ok()) {
  }
  std::thread terminator([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    (*ring)->Terminate();
  });
  Status st = (*producer)->Write(1, Bytes(0, 1000), Soon());
  terminator.join();
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
  EXPECT_EQ((*producer)->LockSession(Duration(100)).code(), StatusCode::kCancelled);
  EXPECT_EQ((*producer)->Health().code(), StatusCode::kCancelled);
  uint32_t kind;
  std::vector<uint8_t> payload;
  EXPECT_EQ((*ring)->Read(&kind, &payload, Deadline::After(Duration(20))).code(), StatusCode::kCancelled);
}

// A node that terminated its feed and then exited (TFoS's terminate()) closes
// its ring: producers of a later epoch must still see Cancelled and skip it,
// not Aborted ("the node closed its feed"), which failed cluster.train.
TEST(Ring, TerminatedThenClosedRingStillCancelsProducersQuietly) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  (*ring)->Terminate();
  (*ring)->Close();
  Status st = (*producer)->Write(1, Bytes(0, 100), Soon());
  EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
  EXPECT_EQ((*producer)->Health().code(), StatusCode::kCancelled);
}

// Terminate() on one thread while the consumer reads on another (a tf.data
// generator thread reading, the user's thread calling DataFeed.terminate()):
// the read ends with Cancelled whichever comes first, never with the
// deadline; a lease taken before stays readable.
TEST(Ring, TerminateFromAnotherThreadEndsABlockedRead) {
  auto ring = Ring::Create(UniqueName(), 1 << 16);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  ASSERT_TRUE((*producer)->Write(7, Bytes(3, 100), Soon()).ok());
  std::shared_ptr<const RingLease> kept;
  ASSERT_TRUE((*ring)->ReadLease(&kept, Soon()).ok());
  Status lease_st, read_st;
  std::thread reader([&] {
    std::shared_ptr<const RingLease> lease;
    lease_st = (*ring)->ReadLease(&lease, Deadline::After(Duration(120000)));  // the empty ring: blocks
    uint32_t kind;
    std::vector<uint8_t> payload;
    read_st = (*ring)->Read(&kind, &payload, Deadline::After(Duration(120000)));
  });
  (*ring)->Terminate();
  reader.join();
  EXPECT_EQ(lease_st.code(), StatusCode::kCancelled) << lease_st.ToString();
  EXPECT_NE(lease_st.message().find("terminated"), std::string::npos) << lease_st.ToString();
  EXPECT_EQ(read_st.code(), StatusCode::kCancelled) << read_st.ToString();
  EXPECT_EQ(std::vector<uint8_t>(kept->payload().begin(), kept->payload().end()), Bytes(3, 100));
  EXPECT_EQ((*producer)->Write(7, Bytes(3, 10), Soon()).code(), StatusCode::kCancelled);
}

TEST(Ring, CreateOpenErrorsNameTheRing) {
  const std::string name = UniqueName();
  auto missing = Ring::Open(name);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find(name), std::string::npos);

  auto ring = Ring::Create(name, 4096);
  ASSERT_TRUE(ring.ok());
  EXPECT_EQ(Ring::Create(name, 4096).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(Ring::Create(UniqueName(), 100).status().code(), StatusCode::kInvalidArgument);

  // A segment that is not a ring is refused, not trusted.
  const std::string bogus = UniqueName();
  int fd = shm_open(bogus.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, 1 << 16), 0);
  close(fd);
  EXPECT_EQ(Ring::Open(bogus).status().code(), StatusCode::kCorruption);
  shm_unlink(bogus.c_str());
}

TEST(Ring, CloseUnlinksTheName) {
  const std::string name = UniqueName();
  {
    auto ring = Ring::Create(name, 4096);
    ASSERT_TRUE(ring.ok());
  }
  EXPECT_EQ(Ring::Open(name).status().code(), StatusCode::kNotFound);
}

TEST(Ring, ProducerInAnotherProcess) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  const int kMessages = 500;
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto p = Ring::Open((*ring)->name());
    if (!p.ok()) _exit(2);
    for (int i = 0; i < kMessages; ++i) {
      if (!(*p)->Write(i, Bytes(i, 300), Soon()).ok()) _exit(3);
    }
    _exit(0);
  }
  uint32_t kind;
  std::vector<uint8_t> payload;
  for (int i = 0; i < kMessages; ++i) {
    ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok()) << i;
    ASSERT_EQ(payload, Bytes(i, 300));
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(Ring, WritePartsJoinsThePartsIntoOneMessage) {
  auto ring = Ring::Create(UniqueName(), 1 << 16);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  const std::vector<uint8_t> a = Bytes(1, 13), b = Bytes(2, 1000), c = Bytes(3, 3);
  const std::span<const uint8_t> parts[] = {a, {}, b, c};
  ASSERT_TRUE((*producer)->WriteParts(5, parts, Soon()).ok());
  ASSERT_TRUE((*producer)->WriteParts(6, {}, Soon()).ok());
  const std::vector<uint8_t> big(Ring::MaxPayload(1 << 16));
  const std::span<const uint8_t> too_big[] = {b, big};
  EXPECT_EQ((*producer)->WriteParts(7, too_big, Soon()).code(), StatusCode::kInvalidArgument);

  uint32_t kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(kind, 5u);
  std::vector<uint8_t> joined = a;
  joined.insert(joined.end(), b.begin(), b.end());
  joined.insert(joined.end(), c.begin(), c.end());
  EXPECT_EQ(payload, joined);
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(kind, 6u);
  EXPECT_TRUE(payload.empty());
  EXPECT_EQ((*ring)->Read(&kind, &payload, Deadline::After(Duration(50))).code(), StatusCode::kDeadlineExceeded);
}

// A producer that dies while copying a message into the ring (here: its second part is
// unreadable memory, so the copy faults halfway with the ring's lock held) publishes nothing;
// the lock passes on and the ring goes on carrying other producers' messages.
TEST(Ring, ProducerDyingMidCopyPublishesNothing) {
  auto ring = Ring::Create(UniqueName(), 8192);
  ASSERT_TRUE(ring.ok());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    struct sigaction sa {};
    sa.sa_handler = [](int) { _exit(42); };  // dies holding the ring's lock
    sigaction(SIGSEGV, &sa, nullptr);
    sigaction(SIGBUS, &sa, nullptr);
    auto w = Ring::Open((*ring)->name());
    if (!w.ok() || !(*w)->Write(1, Bytes(1, 100), Soon()).ok()) _exit(2);
    void* page = mmap(nullptr, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) _exit(3);
    const std::vector<uint8_t> first = Bytes(2, 500);
    const std::span<const uint8_t> parts[] = {first, {static_cast<const uint8_t*>(page), 1000}};
    (void)(*w)->WriteParts(2, parts, Soon());
    _exit(4);  // not reached: the copy faults
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 42) << status;

  auto w = Ring::Open((*ring)->name());
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write(3, Bytes(3, 700), Soon()).ok());
  uint32_t kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(kind, 1u);
  EXPECT_EQ(payload, Bytes(1, 100));
  ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(kind, 3u) << "the half-copied message was published";
  EXPECT_EQ(payload, Bytes(3, 700));
  EXPECT_EQ((*ring)->Read(&kind, &payload, Deadline::After(Duration(50))).code(), StatusCode::kDeadlineExceeded);
  // Round the ring a few times: its space is whole.
  for (uint32_t i = 0; i < 50; ++i) {
    ASSERT_TRUE((*w)->Write(10 + i, Bytes(i, 900), Soon()).ok());
    ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
    ASSERT_EQ(kind, 10 + i);
    ASSERT_EQ(payload, Bytes(i, 900));
  }
}

TEST(Ring, ProducerSeesConsumerProcessDeath) {
  const std::string name = UniqueName();
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // The consumer creates the ring, then dies without closing it.
    auto r = Ring::Create(name, 4096);
    char c = r.ok() ? 1 : 0;
    if (write(ready[1], &c, 1) != 1) _exit(1);
    pause();
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 1);
  close(ready[0]);
  close(ready[1]);
  auto producer = Ring::Open(name);
  ASSERT_TRUE(producer.ok());
  while ((*producer)->Write(1, Bytes(0, 1000), Deadline::After(Duration(10))).ok()) {
  }
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  const auto start = std::chrono::steady_clock::now();
  Status st = (*producer)->Write(1, Bytes(0, 1000), Deadline::After(Duration(10000)));
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("has exited"), std::string::npos) << st.ToString();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  shm_unlink(name.c_str());
}

TEST(Ring, SessionKeepsOneProducersMessagesContiguous) {
  auto ring = Ring::Create(UniqueName(), 8192);
  ASSERT_TRUE(ring.ok());
  const int kProducers = 3, kSessions = 20, kPerSession = 5;
  std::vector<std::thread> producers;
  for (int p = 0; p < kProducers; ++p) {
    producers.emplace_back([&, p] {
      auto w = Ring::Open((*ring)->name());
      ASSERT_TRUE(w.ok());
      for (int s = 0; s < kSessions; ++s) {
        ASSERT_TRUE((*w)->LockSession(Duration(5000)).ok());
        for (int i = 0; i < kPerSession; ++i) ASSERT_TRUE((*w)->Write(p, Bytes(i, 200), Soon()).ok());
        (*w)->UnlockSession();
      }
    });
  }
  uint32_t kind;
  std::vector<uint8_t> payload;
  for (int n = 0; n < kProducers * kSessions; ++n) {
    ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
    const uint32_t owner = kind;
    for (int i = 1; i < kPerSession; ++i) {
      ASSERT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
      ASSERT_EQ(kind, owner) << "session of producer " << owner << " was interleaved";
    }
  }
  for (auto& t : producers) t.join();
}

TEST(Ring, SessionPassesOnWhenHolderDies) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto w = Ring::Open((*ring)->name());
    if (!w.ok() || !(*w)->LockSession(Duration(1000)).ok()) _exit(2);
    _exit(0);  // dies holding the session
  }
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  auto w = Ring::Open((*ring)->name());
  ASSERT_TRUE(w.ok());
  Status st = (*w)->LockSession(Duration(1000));
  EXPECT_TRUE(st.ok()) << st.ToString();
  (*w)->UnlockSession();
}

TEST(Ring, SessionWaitTimesOutOnlyWhenNodeIsIdle) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto holder = Ring::Open((*ring)->name());
  ASSERT_TRUE(holder.ok());
  ASSERT_TRUE((*holder)->LockSession(Duration(1000)).ok());
  std::thread waiter([&] {
    auto w = Ring::Open((*ring)->name());
    ASSERT_TRUE(w.ok());
    Status st = (*w)->LockSession(Duration(200));
    EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
    EXPECT_NE(st.message().find("consumed nothing"), std::string::npos) << st.ToString();
  });
  waiter.join();
  (*holder)->UnlockSession();
}

// ---- many threads: N producers x 1 consumer per ring, several rings at once ----

struct MpscParam {
  int producers;
  int rings;
  size_t message_bytes;
};

class RingMpsc : public ::testing::TestWithParam<MpscParam> {};

// Each ring has its own consumer thread and `producers` producer threads;
// half the producers share one Ring object (threads of one process), the
// others open their own.  Every message arrives once, each producer's in
// order, with its bytes intact.
TEST_P(RingMpsc, EveryMessageArrivesOnceInProducerOrder) {
  const MpscParam param = GetParam();
  const int kEach = 300;
  std::vector<std::unique_ptr<Ring>> consumers, shared;
  for (int r = 0; r < param.rings; ++r) {
    auto ring = Ring::Create(UniqueName(), 16384);
    ASSERT_TRUE(ring.ok()) << ring.status().ToString();
    auto opened = Ring::Open((*ring)->name());
    ASSERT_TRUE(opened.ok());
    consumers.push_back(ring.MoveValueUnsafe());
    shared.push_back(opened.MoveValueUnsafe());
  }
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int r = 0; r < param.rings; ++r) {
    for (int p = 0; p < param.producers; ++p) {
      threads.emplace_back([&, r, p] {
        std::unique_ptr<Ring> own;
        Ring* w = shared[r].get();
        if (p % 2 == 1) {
          auto opened = Ring::Open(consumers[r]->name());
          if (!opened.ok()) return (void)++failures;
          own = opened.MoveValueUnsafe();
          w = own.get();
        }
        for (int i = 0; i < kEach; ++i) {
          std::vector<uint8_t> body = Bytes(static_cast<uint32_t>(i), param.message_bytes);
          const uint32_t seq = static_cast<uint32_t>(i);
          std::memcpy(body.data(), &seq, sizeof(seq));
          if (!w->Write(static_cast<uint32_t>(p), body, Soon()).ok()) return (void)++failures;
        }
      });
    }
  }
  std::vector<std::thread> readers;
  for (int r = 0; r < param.rings; ++r) {
    readers.emplace_back([&, r] {
      std::vector<uint32_t> next(param.producers, 0);
      uint32_t kind;
      std::vector<uint8_t> payload;
      for (int i = 0; i < param.producers * kEach; ++i) {
        if (!consumers[r]->Read(&kind, &payload, Soon()).ok() || kind >= static_cast<uint32_t>(param.producers)) {
          ++failures;
          return;
        }
        uint32_t seq;
        std::memcpy(&seq, payload.data(), sizeof(seq));
        std::vector<uint8_t> expected = Bytes(seq, param.message_bytes);
        std::memcpy(expected.data(), &seq, sizeof(seq));
        if (seq != next[kind] || payload != expected) {
          ++failures;
          return;
        }
        ++next[kind];
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& t : readers) t.join();
  EXPECT_EQ(failures.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Sizes, RingMpsc,
                         ::testing::Values(MpscParam{1, 1, 8}, MpscParam{4, 1, 100}, MpscParam{8, 1, 1000},
                                           MpscParam{3, 3, 64}, MpscParam{2, 4, 3000}),
                         [](const ::testing::TestParamInfo<MpscParam>& info) {
                           return std::to_string(info.param.producers) + "x" + std::to_string(info.param.rings) +
                                  "rings_" + std::to_string(info.param.message_bytes) + "B";
                         });

// ---- Close() while other threads use the same object ----

using std::chrono::steady_clock;

// Runs `call` on a thread, lets it block, closes `ring` from this thread and
// returns what the call returned; fails the test if either took long.
template <typename Call>
Status CloseDuring(Ring* ring, Call call) {
  std::atomic<bool> started{false};
  Status result;
  steady_clock::time_point returned;
  std::thread t([&] {
    started = true;
    result = call();
    returned = steady_clock::now();
  });
  while (!started) std::this_thread::yield();
  std::this_thread::sleep_for(Duration(50));  // let it block
  const auto closing = steady_clock::now();
  ring->Close();
  const auto closed = steady_clock::now();
  t.join();
  EXPECT_LT(closed - closing, Duration(1000)) << "Close() waited too long for the blocked call";
  EXPECT_LT(returned - closing, Duration(1000)) << "the blocked call did not return promptly";
  return result;
}

TEST(RingClose, DuringBlockedReadReturnsClosed) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  Status st = CloseDuring(ring->get(), [&] {
    uint32_t kind;
    std::vector<uint8_t> payload;
    return (*ring)->Read(&kind, &payload, Deadline::After(Duration(10000)));
  });
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("closed"), std::string::npos) << st.ToString();
}

TEST(RingClose, DuringBlockedWriteOnFullRingReturnsClosed) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  const std::vector<uint8_t> body(1000, 7);
  while ((*producer)->Write(1, body, Deadline::After(Duration(0))).ok()) {
  }
  Status st = CloseDuring(producer->get(), [&] { return (*producer)->Write(1, body, Deadline::After(Duration(10000))); });
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("closed"), std::string::npos) << st.ToString();
  // The consumer's ring is untouched by a producer's Close().
  uint32_t kind;
  std::vector<uint8_t> payload;
  EXPECT_TRUE((*ring)->Read(&kind, &payload, Soon()).ok());
}

TEST(RingClose, DuringSessionWaitReturnsClosed) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto holder = Ring::Open((*ring)->name());
  auto waiter = Ring::Open((*ring)->name());
  ASSERT_TRUE(holder.ok() && waiter.ok());
  ASSERT_TRUE((*holder)->LockSession(Duration(1000)).ok());
  Status st = CloseDuring(waiter->get(), [&] { return (*waiter)->LockSession(Duration(10000)); });
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  (*holder)->UnlockSession();
}

TEST(RingClose, ConsumerCloseWakesProducersOnTheirOwnObjects) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  const std::vector<uint8_t> body(1000, 7);
  while ((*producer)->Write(1, body, Deadline::After(Duration(0))).ok()) {
  }
  std::thread t([&] {
    Status st = (*producer)->Write(1, body, Deadline::After(Duration(10000)));
    EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
    EXPECT_NE(st.message().find("the consumer closed the ring"), std::string::npos) << st.ToString();
  });
  std::this_thread::sleep_for(Duration(50));
  (*ring)->Close();
  t.join();
}

// The ring speaks its user's words (RingWords), and each side its own: a
// producer words the consumer's Close() and a stalled consumer as it was told,
// whatever words the consumer's side was created with.
TEST(RingWords, EachSideWordsItsErrorsAsItsUserSaid) {
  RingWords consumer_words;
  consumer_words.ring = "result ring";
  auto ring = Ring::Create(UniqueName(), 4096, consumer_words);
  ASSERT_TRUE(ring.ok());
  RingWords words;
  words.ring = "test ring";
  words.message = "test message";
  words.consumer = "the reader";
  words.too_large = "; try less";
  words.stalled = "is asleep; wake it";
  words.closed = "the reader went home";
  auto producer = Ring::Open((*ring)->name(), words);
  ASSERT_TRUE(producer.ok());
  const std::vector<uint8_t> huge(Ring::MaxPayload(4096) + 1, 1);
  Status st = (*producer)->Write(1, huge, Deadline::After(Duration(0)));
  EXPECT_EQ(st.message().rfind("test message of ", 0), 0u) << st.ToString();
  EXPECT_NE(st.message().find("; try less"), std::string::npos) << st.ToString();
  const std::vector<uint8_t> body(1000, 7);
  while ((st = (*producer)->Write(1, body, Deadline::After(Duration(20)))).ok()) {
  }
  EXPECT_EQ(st.message(), "test ring " + (*ring)->name() + " stayed full until the deadline: the reader (pid " +
                              std::to_string(getpid()) + ") is asleep; wake it");
  (*ring)->Close();
  st = (*producer)->Write(1, body, Deadline::After(Duration(0)));
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_EQ(st.message(), "test ring " + (*ring)->name() + ": the reader went home");
  auto missing = Ring::Open(UniqueName(), words);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message().rfind("test ring /", 0), 0u) << missing.status().ToString();
}

TEST(RingClose, CallsAfterCloseReturnClosedAndCloseIsIdempotent) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  (*ring)->Close();
  (*ring)->Close();
  uint32_t kind;
  std::vector<uint8_t> payload;
  EXPECT_EQ((*ring)->Read(&kind, &payload, Soon()).code(), StatusCode::kAborted);
  EXPECT_EQ((*ring)->Write(1, {}, Soon()).code(), StatusCode::kAborted);
  EXPECT_EQ((*ring)->Health().code(), StatusCode::kAborted);
  EXPECT_EQ((*ring)->LockSession(Duration(10)).code(), StatusCode::kAborted);
  (*ring)->UnlockSession();
  (*ring)->Abort("late");
  (*ring)->Terminate();
  EXPECT_EQ((*ring)->capacity(), 4096u);
}

// Readers, writers and health checks hammer one consumer object and one
// shared producer object while two threads close them; nothing may crash or
// touch unmapped memory (ASan/TSan builds), and every call ends.
TEST(RingClose, ConcurrentCloseUnderLoad) {
  for (int round = 0; round < 5; ++round) {
    auto ring = Ring::Create(UniqueName(), 8192);
    ASSERT_TRUE(ring.ok());
    auto producer = Ring::Open((*ring)->name());
    ASSERT_TRUE(producer.ok());
    std::atomic<bool> stop{false};
    std::vector<std::thread> threads;
    for (int i = 0; i < 3; ++i) {
      threads.emplace_back([&] {
        const std::vector<uint8_t> body(200, 1);
        while (!stop) (void)(*producer)->Write(2, body, Deadline::After(Duration(200)));
      });
    }
    threads.emplace_back([&] {
      uint32_t kind;
      std::vector<uint8_t> payload;
      while (!stop) (void)(*ring)->Read(&kind, &payload, Deadline::After(Duration(200)));
    });
    threads.emplace_back([&] {
      while (!stop) (void)(*producer)->Health();
    });
    std::this_thread::sleep_for(Duration(20 + 10 * round));
    std::thread closer1([&] { (*producer)->Close(); });
    std::thread closer2([&] { (*ring)->Close(); });
    closer1.join();
    closer2.join();
    stop = true;
    for (auto& t : threads) t.join();
  }
}

}  // namespace
}  // namespace ember::shm

// ------------------------------------------------------------------ leases
namespace ember::shm {
namespace {

std::shared_ptr<const RingLease> Lease(Ring& ring) {
  std::shared_ptr<const RingLease> lease;
  Status st = ring.ReadLease(&lease, Soon());
  EXPECT_TRUE(st.ok()) << st.ToString();
  return lease;
}

bool Same(const std::shared_ptr<const RingLease>& lease, uint32_t seq, size_t n) {
  auto want = Bytes(seq, n);
  return lease && lease->payload().size() == n && std::equal(want.begin(), want.end(), lease->payload().begin());
}

// kind + 1000-byte payload = 1008 bytes a record.
constexpr size_t kMsg = 1000;
constexpr uint64_t kRecord = 1008;

TEST(RingLease, ReadsInPlaceAndTailMovesOnlyToTheOldestUnreleased) {
  auto ring = Ring::Create(UniqueName(), 1 << 16);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE((*producer)->Write(10 + i, Bytes(i, kMsg), Soon()).ok());
  auto a = Lease(**ring), b = Lease(**ring), c = Lease(**ring);
  EXPECT_EQ(a->kind(), 10u);
  EXPECT_EQ(c->kind(), 12u);
  EXPECT_TRUE(Same(a, 0, kMsg) && Same(b, 1, kMsg) && Same(c, 2, kMsg));
  EXPECT_EQ((*ring)->pinned_bytes(), 3 * kRecord);
  b.reset();  // out of order: a still pins everything from its start
  EXPECT_EQ((*ring)->pinned_bytes(), 3 * kRecord);
  a.reset();  // tail moves past a and the released b, to c
  EXPECT_EQ((*ring)->pinned_bytes(), kRecord);
  EXPECT_TRUE(Same(c, 2, kMsg));
  c.reset();
  EXPECT_EQ((*ring)->pinned_bytes(), 0u);
}

TEST(RingLease, HeldLeaseBlocksProducersUntilReleasedFromAnotherThread) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  // Four records fill the 4 KiB ring; all leased, none released.
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE((*producer)->Write(1, Bytes(i, kMsg), Soon()).ok());
  std::vector<std::shared_ptr<const RingLease>> held;
  for (int i = 0; i < 4; ++i) held.push_back(Lease(**ring));
  EXPECT_EQ((*producer)->Write(1, Bytes(9, kMsg), Deadline::After(Duration(100))).code(),
            StatusCode::kDeadlineExceeded);
  std::atomic<bool> written{false};
  std::thread writer([&] {
    EXPECT_TRUE((*producer)->Write(1, Bytes(4, kMsg), Soon()).ok());
    written = true;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(written.load());
  held[1].reset();  // not the oldest: no room yet
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_FALSE(written.load());
  std::thread releaser([&] { held[0].reset(); });  // released on another thread
  releaser.join();
  writer.join();
  EXPECT_TRUE(written.load());
  // Wrapped around: the new record sits at the ring's start, leases 2 and 3 intact.
  EXPECT_TRUE(Same(held[2], 2, kMsg) && Same(held[3], 3, kMsg));
  auto wrapped = Lease(**ring);
  EXPECT_TRUE(Same(wrapped, 4, kMsg));
}

// The case a node's feed met (a scratch inference variant, 2026-11-28): the reader keeps one
// large message leased (below its revoke bound of half the ring) and waits for more, while the
// producer's next message must wrap past the ring's end and needs more than is free.  Without the
// reader freeing the room, both would wait for their deadlines.
TEST(RingLease, AReaderWithNothingToReadFreesTheRoomAWaitingProducerNeeds) {
  constexpr size_t kCap = 1 << 16;
  auto ring = Ring::Create(UniqueName(), kCap);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  constexpr size_t kFirst = 20000, kBig = 28000;  // records of 20,008 and 28,008 bytes
  ASSERT_TRUE((*producer)->Write(1, Bytes(1, kFirst), Soon()).ok());
  Lease(**ring).reset();  // read and released: the tail moves to 20,008
  ASSERT_TRUE((*producer)->Write(2, Bytes(2, kBig), Soon()).ok());
  auto held = Lease(**ring);  // kept, as a node keeps its last batch while it asks for the next
  ASSERT_LT((*ring)->pinned_bytes(), kCap / 2);  // below any revoke bound a reader keeps
  // The next record starts at 48,016 with 17,520 bytes to the end: it wraps, and needs
  // 17,520 + 28,008 = 45,528 bytes, more than the 37,528 free.
  EXPECT_EQ((*producer)->Write(3, Bytes(3, kBig), Deadline::After(Duration(200))).code(),
            StatusCode::kDeadlineExceeded);  // with no reader waiting, the leases stand
  std::thread writer([&] { EXPECT_TRUE((*producer)->Write(3, Bytes(3, kBig), Soon()).ok()); });
  auto next = Lease(**ring);  // the reader waits for the next message: the room is freed for it
  writer.join();
  ASSERT_TRUE(next != nullptr);
  EXPECT_EQ(next->kind(), 3u);
  EXPECT_TRUE(Same(next, 3, kBig));
  EXPECT_TRUE(Same(held, 2, kBig));  // the held lease still reads its bytes (now private pages)
  next.reset();
  EXPECT_EQ((*ring)->pinned_bytes(), 0u);  // the revoked lease pins nothing
  std::shared_ptr<const RingLease> none;
  EXPECT_EQ((*ring)->ReadLease(&none, Deadline::After(Duration(50))).code(), StatusCode::kDeadlineExceeded);
}

TEST(RingLease, RevokeKeepsBytesAndFreesTheRing) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  std::vector<std::shared_ptr<const RingLease>> held;
  // Three laps of the ring, every lease kept: each lap, the held leases are revoked.
  for (uint32_t i = 0; i < 12; ++i) {
    ASSERT_TRUE((*producer)->Write(1, Bytes(i, kMsg), Soon()).ok()) << i;
    held.push_back(Lease(**ring));
    if ((*ring)->pinned_bytes() >= 3 * kRecord) {
      ASSERT_TRUE((*ring)->RevokeLeases().ok());
      EXPECT_EQ((*ring)->pinned_bytes(), 0u);
    }
  }
  for (uint32_t i = 0; i < 12; ++i) EXPECT_TRUE(Same(held[i], i, kMsg)) << i;
  held.clear();  // releasing revoked leases changes nothing
  EXPECT_EQ((*ring)->pinned_bytes(), 0u);
}

// The view hooks (a GPU consumer page-locks lease views): every view made is
// mapped once and unmapped once, before its pages are swapped (revoke), when
// the hooks are cleared, or when its last lease goes; the bytes stay right.
TEST(RingLease, ViewHooksSeeEveryViewMappedAndUnmappedOnce) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  std::mutex mu;
  std::vector<std::string> log;
  std::set<void*> live;
  auto event = [&](const std::string& what, void* base) {
    std::lock_guard<std::mutex> lock(mu);
    log.push_back(what);
    if (what == "map") {
      EXPECT_TRUE(live.insert(base).second) << "mapped twice";
    } else {
      EXPECT_EQ(live.erase(base), 1u) << "unmapped a view that was not mapped";
    }
  };
  const uint8_t* revoked_at = nullptr;
  Ring::ViewHooks hooks;
  hooks.on_map = [&](void* base, size_t bytes) {
    EXPECT_GE(bytes, 4096u);
    event("map", base);
    return Status::OK();
  };
  hooks.on_unmap = [&](void* base) {
    // Before the swap: a lease's bytes are still the ring's at this point.
    if (revoked_at != nullptr) {
      EXPECT_EQ(revoked_at[0], 0);
    }
    event("unmap", base);
  };
  ASSERT_TRUE((*ring)->SetViewHooks(hooks).ok());
  ASSERT_TRUE((*producer)->Write(1, Bytes(0, kMsg), Soon()).ok());
  auto a = Lease(**ring);
  ASSERT_TRUE((*producer)->Write(1, Bytes(1, kMsg), Soon()).ok());
  auto b = Lease(**ring);  // the same view
  EXPECT_EQ(log, (std::vector<std::string>{"map"}));
  revoked_at = a->payload().data();
  ASSERT_TRUE((*ring)->RevokeLeases().ok());
  revoked_at = nullptr;
  EXPECT_EQ(log, (std::vector<std::string>{"map", "unmap"}));
  EXPECT_TRUE(Same(a, 0, kMsg) && Same(b, 1, kMsg));
  ASSERT_TRUE((*producer)->Write(1, Bytes(2, kMsg), Soon()).ok());
  auto c = Lease(**ring);  // a fresh view, hooked
  EXPECT_EQ(log.size(), 3u);
  a.reset();
  b.reset();  // the revoked view goes; it was unmapped already
  EXPECT_EQ(log.size(), 3u);
  (*ring)->ClearViewHooks();
  EXPECT_EQ(log, (std::vector<std::string>{"map", "unmap", "map", "unmap"}));
  ASSERT_TRUE((*producer)->Write(1, Bytes(3, kMsg), Soon()).ok());
  auto d = Lease(**ring);  // no hooks: nothing
  EXPECT_TRUE(Same(c, 2, kMsg) && Same(d, 3, kMsg));
  ASSERT_TRUE((*ring)->SetViewHooks(hooks).ok());  // the current view, at once
  EXPECT_EQ(log.size(), 5u);
  c.reset();
  d.reset();
  ring->reset();  // the view's last holder: unmapped as it goes
  EXPECT_EQ(log.size(), 6u);
  EXPECT_TRUE(live.empty());
}

// A view the hook refuses stays as it is: leases still read right.
TEST(RingLease, AFailedViewHookLeavesTheViewWorking) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  int unmapped = 0;
  Ring::ViewHooks hooks;
  hooks.on_map = [](void*, size_t) { return Status::IOError("cudaHostRegister: fake refusal"); };
  hooks.on_unmap = [&](void*) { ++unmapped; };
  ASSERT_TRUE((*ring)->SetViewHooks(hooks).ok());
  ASSERT_TRUE((*producer)->Write(1, Bytes(7, kMsg), Soon()).ok());
  auto a = Lease(**ring);
  EXPECT_TRUE(Same(a, 7, kMsg));
  a.reset();
  ring->reset();
  EXPECT_EQ(unmapped, 0);
}

TEST(RingLease, RevokeWhileAnotherThreadReadsTheLease) {
  auto ring = Ring::Create(UniqueName(), 1 << 16);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  ASSERT_TRUE((*producer)->Write(1, Bytes(5, 20000), Soon()).ok());
  auto lease = Lease(**ring);
  std::atomic<bool> stop{false};
  std::atomic<int> bad{0};
  std::thread reader([&] {
    while (!stop) {
      if (!Same(lease, 5, 20000)) ++bad;
    }
  });
  ASSERT_TRUE((*ring)->RevokeLeases().ok());
  // The freed bytes are overwritten while the reader keeps checking.
  for (uint32_t i = 0; i < 6; ++i) {
    ASSERT_TRUE((*producer)->Write(1, Bytes(100 + i, 20000), Soon()).ok());
    std::vector<uint8_t> out;
    uint32_t kind;
    ASSERT_TRUE((*ring)->Read(&kind, &out, Soon()).ok());
  }
  stop = true;
  reader.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST(RingLease, CloseTerminateAbortWithLeasesOutstanding) {
  auto ring = Ring::Create(UniqueName(), 1 << 16);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  auto consumer = Ring::Open((*ring)->name());  // the node's Consumer opens the launcher's ring
  ASSERT_TRUE(consumer.ok());
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE((*producer)->Write(1, Bytes(i, kMsg), Soon()).ok());
  auto a = Lease(**consumer);
  (*consumer)->Terminate();  // drops what is queued; the lease stays valid
  EXPECT_EQ((*producer)->Write(1, Bytes(7, kMsg), Soon()).code(), StatusCode::kCancelled);
  std::shared_ptr<const RingLease> none;
  (*consumer)->Abort("stop");
  EXPECT_EQ((*consumer)->ReadLease(&none, Soon()).code(), StatusCode::kAborted);
  (*consumer)->Close();
  consumer->reset();  // the Ring object is gone; the lease still maps its bytes
  (*ring)->Close();
  EXPECT_TRUE(Same(a, 0, kMsg));
  a.reset();  // releasing after Close touches only what the lease kept mapped
}

TEST(RingLease, AConsumerClosedWithLeasesLeavesTheRingToTheNextConsumer) {
  auto ring = Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  ASSERT_TRUE((*producer)->Write(1, Bytes(0, kMsg), Soon()).ok());
  ASSERT_TRUE((*producer)->Write(1, Bytes(1, kMsg), Soon()).ok());
  auto first = Ring::Open((*ring)->name());
  ASSERT_TRUE(first.ok());
  auto kept = Lease(**first);
  (*first)->Close();  // its lease stays valid but no longer pins the ring
  auto next = Ring::Open((*ring)->name());
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(Same(Lease(**next), 1, kMsg));  // carries on after what the first one read
  // Three laps' worth of writes reuse every byte, the kept lease's included.
  for (uint32_t i = 2; i < 12; ++i) {
    ASSERT_TRUE((*producer)->Write(1, Bytes(i, kMsg), Soon()).ok()) << i;
    EXPECT_TRUE(Same(Lease(**next), i, kMsg)) << i;
  }
  EXPECT_TRUE(Same(kept, 0, kMsg));
}

TEST(RingLease, ManyMessagesReleasedOnOtherThreads) {
  auto ring = Ring::Create(UniqueName(), 1 << 14);
  ASSERT_TRUE(ring.ok());
  auto producer = Ring::Open((*ring)->name());
  ASSERT_TRUE(producer.ok());
  constexpr uint32_t kCount = 2000;
  std::thread writer([&] {
    for (uint32_t i = 0; i < kCount; ++i) ASSERT_TRUE((*producer)->Write(i, Bytes(i, 100 + i % 700), Soon()).ok());
  });
  std::mutex mu;
  std::vector<std::shared_ptr<const RingLease>> queue;
  std::atomic<bool> done{false};
  std::thread releaser([&] {
    for (;;) {
      std::vector<std::shared_ptr<const RingLease>> batch;
      {
        std::lock_guard<std::mutex> lock(mu);
        batch.swap(queue);
      }
      for (auto& l : batch) l.reset();
      if (done && batch.empty()) return;
      std::this_thread::yield();
    }
  });
  int bad = 0;
  for (uint32_t i = 0; i < kCount; ++i) {
    if ((*ring)->pinned_bytes() > (1 << 12)) {
      ASSERT_TRUE((*ring)->RevokeLeases().ok());
    }
    auto lease = Lease(**ring);
    if (!lease || lease->kind() != i || !Same(lease, i, 100 + i % 700)) ++bad;
    std::lock_guard<std::mutex> lock(mu);
    queue.push_back(std::move(lease));
  }
  done = true;
  writer.join();
  releaser.join();
  EXPECT_EQ(bad, 0);
  EXPECT_EQ((*ring)->pinned_bytes(), 0u);
}

}  // namespace
}  // namespace ember::shm
