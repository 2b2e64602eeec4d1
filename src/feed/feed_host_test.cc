// FeedHost (ember/feed.h): a node's ring and feed server as its launcher
// holds them, through the public contract only.
#include <sys/stat.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "ember/feed.h"
#include "feed/feed_test_fixture.h"

namespace ember::feed {
namespace {

FeedHostOptions HostOptions(const std::string& job, int64_t executor) {
  FeedHostOptions o;
  o.job_id = job;
  o.executor_id = executor;
  o.name = "executor " + std::to_string(executor);
  o.host = "127.0.0.1";
  o.bind_host = "127.0.0.1";
  o.secret = kSecret;
  o.ring_bytes = 1 << 20;
  return o;
}

std::string JobName() { return UniqueName("host").substr(1); }

bool ShmNameExists(const std::string& name) {
  struct stat st {};
  return stat(("/dev/shm" + name).c_str(), &st) == 0;
}

FeedOptions TcpOptions() {
  FeedOptions o;
  o.secret = kSecret;
  o.transport = Transport::kTcp;
  o.connect_timeout = Duration(10000);
  o.idle_timeout = Duration(10000);
  return o;
}

TEST(FeedHostTest, NamesTheRingAndPublishesWhereProducersReachIt) {
  EXPECT_EQ(NodeRingName("job-7", 3), "/job-7-3");
  const std::string job = JobName();
  auto host = FeedHost::Start(HostOptions(job, 2));
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  const NodeEndpoint& ep = (*host)->endpoint();
  EXPECT_EQ(ep.ring, NodeRingName(job, 2));
  EXPECT_EQ(ep.executor_id, 2);
  EXPECT_EQ(ep.name, "executor 2");
  EXPECT_EQ(ep.host, "127.0.0.1");
  EXPECT_GT(ep.port, 0);
  EXPECT_GE(ep.ring_capacity, uint64_t{1} << 20);
  auto again = FeedHost::Start(HostOptions(job, 2));
  EXPECT_EQ(again.status().code(), StatusCode::kAlreadyExists) << again.status().ToString();
  (*host)->Close();
  EXPECT_FALSE(ShmNameExists(ep.ring));
  (*host)->Close();  // idempotent
}

TEST(FeedHostTest, RefusesOptionsItCannotUseAndLeavesNoRing) {
  FeedHostOptions o = HostOptions(JobName(), 0);
  o.secret = "short";
  auto host = FeedHost::Start(o);
  EXPECT_EQ(host.status().code(), StatusCode::kInvalidArgument) << host.status().ToString();
  EXPECT_FALSE(ShmNameExists(NodeRingName(o.job_id, 0)));
  o = HostOptions("a/b", 0);
  EXPECT_EQ(FeedHost::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = HostOptions(JobName(), 0);
  o.host.clear();
  EXPECT_EQ(FeedHost::Start(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(FeedHostTest, RelaysAProducerOnAnotherHostIntoTheNodesRing) {
  auto host = FeedHost::Start(HostOptions(JobName(), 0));
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  const NodeEndpoint ep = (*host)->endpoint();
  auto consumer = Consumer::Open(ep.ring, ConsumerOptions{});
  ASSERT_TRUE(consumer.ok()) << consumer.status().ToString();
  auto producer = Producer::Open({ep}, /*partition=*/0, /*epoch=*/0, /*attempt=*/0, TcpOptions());
  ASSERT_TRUE(producer.ok()) << producer.status().ToString();
  const std::vector<uint8_t> ipc = Ipc(100);
  ASSERT_TRUE((*producer)->SendBatch(0, ipc, 5).ok());
  ASSERT_TRUE((*producer)->EndPartition().ok());
  auto told = EndEpoch({ep}, 0, 1, TcpOptions());
  ASSERT_TRUE(told.ok()) << told.status().ToString();
  EXPECT_EQ(*told, std::vector<std::string>{""});
  auto epoch = (*consumer)->BeginEpoch();
  ASSERT_TRUE(epoch.ok() && epoch->has_value()) << epoch.status().ToString();
  auto batch = (*consumer)->NextEpochBatch(5, true);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_EQ(Values(*batch), (std::vector<int64_t>{100, 101, 102, 103, 104}));
}

TEST(FeedHostTest, AbortTellsABlockedProducerTheNodesReasonAndTerminateStopsItQuietly) {
  for (bool failed : {true, false}) {
    FeedHostOptions o = HostOptions(JobName(), 1);
    o.ring_bytes = 64 << 10;
    auto host = FeedHost::Start(o);
    ASSERT_TRUE(host.ok()) << host.status().ToString();
    auto producer = Producer::Open({(*host)->endpoint()}, 0, 0, 0, TcpOptions());
    ASSERT_TRUE(producer.ok()) << producer.status().ToString();
    Status last;
    std::thread writer([&] {  // nobody reads: the ring fills and the writes block
      std::vector<uint8_t> big(16 << 10);
      for (int i = 0; i < 1000 && last.ok(); ++i) last = (*producer)->SendBatch(0, big, 1);
      if (last.ok()) last = Status::Internal("the writes never blocked");
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    if (failed) {
      (*host)->Abort("node worker:1 failed (exit status 3)");
    } else {
      (*host)->Terminate();
    }
    writer.join();
    if (failed) {
      EXPECT_EQ(last.code(), StatusCode::kAborted) << last.ToString();
      EXPECT_NE(last.message().find("node worker:1 failed (exit status 3)"), std::string::npos) << last.ToString();
    } else {
      // A terminated node is skipped quietly: the producer's writes succeed, uncounted by the node.
      EXPECT_EQ(last.code(), StatusCode::kInternal) << last.ToString();
      EXPECT_TRUE((*producer)->cancelled(0));
    }
    (*producer)->Close();
    (*host)->Close();
  }
}

TEST(FeedHostTest, CloseRemovesResultRingsLeftByKilledTasks) {
  auto host = FeedHost::Start(HostOptions(JobName(), 0));
  ASSERT_TRUE(host.ok()) << host.status().ToString();
  const std::string left = ResultRingPrefix((*host)->endpoint().ring) + "-r0-left";
  auto ring = shm::Ring::Create(left, 1 << 16);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  ASSERT_TRUE(ShmNameExists(left));
  (*host)->Close();
  EXPECT_FALSE(ShmNameExists(left));
  (*ring)->Close();
}

}  // namespace
}  // namespace ember::feed
