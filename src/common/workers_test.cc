#include "common/workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "common/mutex.h"

namespace ember {
namespace {

TEST(WorkersTest, EveryPieceRunsOnceInEveryJob) {
  for (int threads : {1, 2, 4}) {
    Workers w(threads);
    EXPECT_EQ(w.threads(), threads);
    for (int job = 0; job < 200; ++job) {
      const int n = 1 + job % 9;
      std::vector<std::atomic<int>> ran(n);
      w.Run(n, [&](int i) { ran[i].fetch_add(1); });
      for (int i = 0; i < n; ++i) ASSERT_EQ(ran[i].load(), 1) << "job " << job << " piece " << i;
    }
    w.Run(0, [](int) { ADD_FAILURE() << "no piece to run"; });
  }
}

TEST(WorkersTest, PiecesRunOnSeveralThreads) {
  Workers w(3);
  Mutex mu;
  std::set<std::thread::id> seen;
  std::atomic<int> inside{0};
  // Each piece waits until all three are inside at once: only possible on three threads.
  w.Run(3, [&](int) {
    inside.fetch_add(1);
    while (inside.load() < 3) std::this_thread::yield();
    MutexLock lock(&mu);
    seen.insert(std::this_thread::get_id());
  });
  EXPECT_EQ(seen.size(), 3u);
  EXPECT_TRUE(seen.count(std::this_thread::get_id()));
}

TEST(WorkersTest, SplitCoversTheRangeOnAlignedBounds) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{1000}, size_t{4097}}) {
    for (int pieces : {1, 2, 3, 8}) {
      size_t next = 0;
      for (int i = 0; i < pieces; ++i) {
        const Workers::Range r = Workers::Split(count, pieces, i, 16);
        EXPECT_EQ(r.begin, next) << count << " / " << pieces << " piece " << i;
        EXPECT_LE(r.begin, r.end);
        if (r.end != count) {
          EXPECT_EQ(r.end % 16, 0u);
        }
        next = r.end;
      }
      EXPECT_EQ(next, count) << count << " / " << pieces;
    }
  }
}

}  // namespace
}  // namespace ember
