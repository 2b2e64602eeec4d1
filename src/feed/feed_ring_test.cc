// The feed words its rings' errors (feed_ring.h): what users and the Python
// tests read stays the feed's ("feed ring", "the node", "raise feed_timeout").
#include "feed/feed_ring.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

namespace ember::feed {
namespace {

std::string UniqueName() {
  static std::atomic<int> n{0};
  return "/ember-feed-ring-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
}

TEST(FeedRing, ErrorsSpeakOfTheFeed) {
  auto missing = OpenFeedRing(UniqueName());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("does not exist (has the node started?)"), std::string::npos)
      << missing.status().ToString();

  // The node's ring as the launcher makes it (no words of its own), fed through the feed's.
  auto node = shm::Ring::Create(UniqueName(), 4096);
  ASSERT_TRUE(node.ok());
  auto producer = OpenFeedRing((*node)->name());
  ASSERT_TRUE(producer.ok());
  const std::vector<uint8_t> huge(shm::Ring::MaxPayload(4096) + 1, 1);
  Status st = (*producer)->Write(1, huge, Deadline::After(Duration(0)));
  EXPECT_EQ(st.message().rfind("feed message of ", 0), 0u) << st.ToString();
  EXPECT_NE(st.message().find("; send smaller batches"), std::string::npos) << st.ToString();
  const std::vector<uint8_t> body(1000, 7);
  while ((st = (*producer)->Write(1, body, Deadline::After(Duration(20)))).ok()) {
  }
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(st.message(), "feed ring " + (*node)->name() + " stayed full until the deadline: the node (pid " +
                              std::to_string(getpid()) +
                              ") is not consuming its feed; raise feed_timeout or check the node's log");
  (*node)->Close();
  st = (*producer)->Write(1, body, Deadline::After(Duration(0)));
  EXPECT_EQ(st.message(), "feed ring " + (*node)->name() + ": the node closed its feed");
}

TEST(FeedRing, TerminatedIsTheNodesWordsToo) {
  auto node = CreateFeedRing(UniqueName(), 4096);
  ASSERT_TRUE(node.ok());
  auto producer = OpenFeedRing((*node)->name());
  ASSERT_TRUE(producer.ok());
  (*node)->Terminate();
  Status st = (*producer)->Write(1, std::vector<uint8_t>(8, 1), Deadline::After(Duration(0)));
  EXPECT_EQ(st.code(), StatusCode::kCancelled);
  EXPECT_EQ(st.message(), "feed ring " + (*node)->name() + ": the node terminated its feed");
}

}  // namespace
}  // namespace ember::feed
