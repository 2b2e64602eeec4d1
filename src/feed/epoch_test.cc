// The equal-rows bound of one epoch (feed/epoch.h) and SplitRows.
#include "feed/epoch.h"

#include <gtest/gtest.h>

#include <random>

#include "ember/feed.h"

namespace ember::feed {
namespace {

TEST(EpochBound, UsableRowsIsALowerBoundThatBecomesExact) {
  EpochBound e;
  e.AddRows(0, 5, 0);  // partition 0 still arriving: others get at least 4 of it
  EXPECT_EQ(e.usable(), 4);
  EXPECT_FALSE(e.complete());
  ASSERT_TRUE(e.EndPartition(0, std::vector<int64_t>{5, 4}).ok());
  EXPECT_EQ(e.usable(), 4);
  e.AddRows(1, 1, 0);  // 1 row of partition 1: another node may get none
  EXPECT_EQ(e.usable(), 4);
  ASSERT_TRUE(e.EndPartition(1, std::vector<int64_t>{1, 2}).ok());
  EXPECT_EQ(e.usable(), 6);
  EXPECT_FALSE(e.complete());
  e.SetPartitions(2);  // the driver's kEndEpoch
  EXPECT_TRUE(e.complete());
}

TEST(EpochBound, CreditsARetriedPartitionWithItsLargestAttempt) {
  EpochBound e;
  e.AddRows(0, 50, 0);  // a failed attempt delivered this node's whole share (of 100 rows)
  e.AddRows(0, 30, 1);  // the retry is under way: the other node still gets only 50
  EXPECT_EQ(e.usable(), 49);
  ASSERT_TRUE(e.EndPartition(0, std::vector<int64_t>{50, 50}).ok());
  e.AddRows(0, 20, 1);  // a late speculative duplicate changes nothing
  EXPECT_EQ(e.usable(), 50);
}

TEST(EpochBound, ANodeCountThatChangesIsCorruption) {
  EpochBound e;
  ASSERT_TRUE(e.EndPartition(0, std::vector<int64_t>{1, 1}).ok());
  EXPECT_EQ(e.EndPartition(1, std::vector<int64_t>{1, 1, 1}).code(), StatusCode::kCorruption);
}

class SplitRowsTest : public ::testing::TestWithParam<int> {};

TEST_P(SplitRowsTest, KeepsEveryNodeWithinOneRow) {
  const int n = GetParam();
  std::mt19937 rng(n);
  for (int partition = 0; partition < 20; ++partition) {
    std::vector<int64_t> sent(n, 0);
    for (int i = 0; i < 12; ++i) {
      const int64_t rows = rng() % 50;
      std::vector<int64_t> split = SplitRows(rows, sent, partition % n);
      int64_t sum = 0;
      for (int k = 0; k < n; ++k) {
        EXPECT_GE(split[k], 0);
        sum += split[k];
        sent[k] += split[k];
      }
      EXPECT_EQ(sum, rows);
      EXPECT_LE(*std::max_element(sent.begin(), sent.end()) - *std::min_element(sent.begin(), sent.end()), 1);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Nodes, SplitRowsTest, ::testing::Values(1, 2, 3, 4));

TEST(SplitRows, SpreadsTheOddRowsOverTheNodes) {
  // One odd row per partition: partition p gives it to node p % n, so totals stay even.
  std::vector<int64_t> totals(3, 0);
  for (int p = 0; p < 9; ++p) {
    std::vector<int64_t> split = SplitRows(7, std::vector<int64_t>{0, 0, 0}, p % 3);
    for (int k = 0; k < 3; ++k) totals[k] += split[k];
  }
  EXPECT_EQ(totals, (std::vector<int64_t>{21, 21, 21}));
  // Node 0 is ahead: the row goes on.
  EXPECT_EQ(SplitRows(1, std::vector<int64_t>{1, 0, 0}, 0), (std::vector<int64_t>{0, 1, 0}));
}

}  // namespace
}  // namespace ember::feed
