#include "ember/deadline.h"

#include <gtest/gtest.h>

#include <thread>

#include "common/logging.h"

namespace ember {
namespace {

TEST(DeadlineTest, AfterCountsDown) {
  Deadline d = Deadline::After(Duration(200));
  EXPECT_FALSE(d.expired());
  EXPECT_FALSE(d.infinite());
  EXPECT_LE(d.remaining(), Duration(200));
  EXPECT_GT(d.remaining(), Duration(0));
  EXPECT_GT(d.PollTimeoutMs(), 0);
}

TEST(DeadlineTest, ExpiresAndClampsAtZero) {
  Deadline d = Deadline::After(Duration(5));
  std::this_thread::sleep_for(Duration(10));
  EXPECT_TRUE(d.expired());
  EXPECT_EQ(d.remaining(), Duration(0));
  EXPECT_EQ(d.PollTimeoutMs(), 0);
  EXPECT_TRUE(Deadline::After(Duration(-5)).expired());
}

TEST(DeadlineTest, Infinite) {
  for (Deadline d : {Deadline::Infinite(), Deadline::After(Duration::max())}) {
    EXPECT_TRUE(d.infinite());
    EXPECT_FALSE(d.expired());
    EXPECT_EQ(d.remaining(), Duration::max());
    EXPECT_EQ(d.PollTimeoutMs(), -1);
  }
}

TEST(DeadlineTest, FormatDuration) {
  EXPECT_EQ(FormatDuration(Duration(10000)), "10s");
  EXPECT_EQ(FormatDuration(Duration(250)), "250ms");
  EXPECT_EQ(FormatDuration(Duration(0)), "0ms");
}

TEST(LoggingTest, SinkAndLevel) {
  std::vector<std::pair<LogLevel, std::string>> lines;
  SetLogSink([&](LogLevel l, std::string_view m) { lines.emplace_back(l, std::string(m)); });
  const LogLevel old = GetLogLevel();
  SetLogLevel(LogLevel::kWarn);
  EMBER_LOG(INFO) << "hidden";
  EMBER_LOG(WARN) << "shown " << 42;
  EMBER_LOG(ERROR) << "also";
  SetLogLevel(old);
  SetLogSink(nullptr);
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].first, LogLevel::kWarn);
  EXPECT_EQ(lines[0].second, "shown 42");
  EXPECT_EQ(LogLevelName(lines[1].first), "ERROR");
}

}  // namespace
}  // namespace ember
