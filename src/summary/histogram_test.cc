// BuildHistogram against what TF1's tensorflow/core/lib/histogram/histogram.cc makes.
#include "summary/histogram.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <vector>

namespace ember::summary {
namespace {

TEST(HistogramTest, DefaultLimitsAreTensorFlows) {
  const std::vector<double>& l = DefaultBucketLimits();
  // 1e-12 * 1.1^k < 1e20 for k = 0..773: 774 positive edges, DBL_MAX, mirrored, and 0.
  ASSERT_EQ(l.size(), 2u * 775 + 1);
  EXPECT_EQ(l.front(), -DBL_MAX);
  EXPECT_EQ(l.back(), DBL_MAX);
  EXPECT_EQ(l[775], 0.0);
  EXPECT_EQ(l[776], 1e-12);
  for (size_t i = 1; i < l.size(); ++i) ASSERT_LT(l[i - 1], l[i]) << i;
  for (size_t i = 0; i < l.size(); ++i) ASSERT_EQ(l[i], -l[l.size() - 1 - i]) << i;
}

TEST(HistogramTest, EmptyRunsCollapseIntoOneBucket) {
  Histogram h;
  const std::vector<double> values = {0.0, 1.0};
  ASSERT_TRUE(BuildHistogram(values, &h));
  // [-DBL_MAX .. 0) empty -> one bucket ending at 0; 0.0 lands in [0, 1e-12);
  // empties up to the bucket holding 1.0; 1.0; empties up to DBL_MAX.
  ASSERT_EQ(h.bucket.size(), 5u);
  EXPECT_EQ(h.bucket_limit[0], 0.0);
  EXPECT_EQ(h.bucket[0], 0.0);
  EXPECT_EQ(h.bucket_limit[1], 1e-12);
  EXPECT_EQ(h.bucket[1], 1.0);
  EXPECT_EQ(h.bucket[2], 0.0);
  EXPECT_GT(h.bucket_limit[3], 1.0);
  EXPECT_LT(h.bucket_limit[3], 1.1);
  EXPECT_EQ(h.bucket[3], 1.0);
  EXPECT_EQ(h.bucket_limit[4], DBL_MAX);
  EXPECT_EQ(h.bucket[4], 0.0);
}

TEST(HistogramTest, EmptyHistogramIsTensorFlows) {
  Histogram h;
  ASSERT_TRUE(BuildHistogram({}, &h));
  EXPECT_EQ(h.min, DBL_MAX);
  EXPECT_EQ(h.max, -DBL_MAX);
  EXPECT_EQ(h.num, 0.0);
  EXPECT_EQ(h.bucket_limit, std::vector<double>{DBL_MAX});
  EXPECT_EQ(h.bucket, std::vector<double>{0.0});
}

TEST(HistogramTest, ExtremesLandInTheEndBuckets) {
  Histogram h;
  const std::vector<double> values = {-DBL_MAX, DBL_MAX, 1e30};
  ASSERT_TRUE(BuildHistogram(values, &h));
  EXPECT_EQ(h.num, 3.0);
  EXPECT_EQ(h.bucket.back(), 2.0);  // 1e30 and DBL_MAX: [1e20.., DBL_MAX]
  EXPECT_EQ(h.bucket_limit.back(), DBL_MAX);
}

}  // namespace
}  // namespace ember::summary
