// Producers and consumers of the feed (ember/feed.h) on threads, over real
// shm rings and over TCP through a node's FeedServer (feed_test_fixture.h).
#include <dirent.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include <gtest/gtest.h>

#include "common/test_util.h"

#include "ember/device.h"
#include "ember/feed.h"
#include "feed/codec.h"
#include "feed/feed_client.h"
#include "feed/feed_server.h"
#include "feed/feed_test_fixture.h"
#include "transport/shm/ring.h"

namespace ember::feed {
namespace {

INSTANTIATE_TEST_SUITE_P(Transports, FeedTest, ::testing::Values(Via::kShm, Via::kTcp),
                         [](const auto& info) { return info.param == Via::kShm ? "Shm" : "Tcp"; });

TEST_P(FeedTest, EveryNodeYieldsTheSameBatchesFromUnevenConcurrentPartitions) {
  StartNodes(3);
  const std::vector<int64_t> counts = {0, 17, 1000, 3, 0, 250, 1, 64};
  std::vector<std::vector<int64_t>> sent(counts.size());
  std::vector<std::vector<std::vector<int64_t>>> got(3);
  std::vector<std::thread> threads;
  for (int k = 0; k < 3; ++k) {
    threads.emplace_back([&, k] {
      auto c = OpenConsumer(k);
      got[k] = ConsumeEpoch(*c, 8);
    });
  }
  std::vector<std::thread> producers;
  int64_t start = 0;
  for (size_t p = 0; p < counts.size(); ++p) {  // several feeding tasks at once
    producers.emplace_back([&, p, start] { sent[p] = FeedPartition(p, 0, start, counts[p], 5 + p); });
    start += counts[p];
  }
  for (auto& t : producers) t.join();
  EndEpochAll(0, counts.size());
  for (auto& t : threads) t.join();
  std::vector<int64_t> totals(3, 0);
  for (const auto& s : sent) {
    ASSERT_EQ(s.size(), 3u);
    EXPECT_LE(*std::max_element(s.begin(), s.end()) - *std::min_element(s.begin(), s.end()), 1);
    for (int k = 0; k < 3; ++k) totals[k] += s[k];
  }
  const int64_t least = *std::min_element(totals.begin(), totals.end());
  std::set<int64_t> seen;
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(static_cast<int64_t>(got[k].size()), least / 8) << "worker:" << k;
    for (const auto& b : got[k]) {
      EXPECT_EQ(b.size(), 8u);
      for (int64_t v : b) EXPECT_TRUE(seen.insert(v).second) << "row " << v << " went to two nodes";
    }
  }
}

// A runtime that records what it page-locks (Consumer::PageLockRows).
class RecordingRuntime : public device::Runtime {
 public:
  std::string Describe() const override { return "recording runtime"; }
  Status SetDevice(int) override { return Status::OK(); }
  Result<void*> AllocHost(size_t) override { return Status::InvalidArgument("AllocHost"); }
  void FreeHost(void*) override {}
  Status RegisterHost(void* p, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu);
    locked[p] = bytes;
    ++registered;
    return Status::OK();
  }
  Status UnregisterHost(void* p) override {
    std::lock_guard<std::mutex> lock(mu);
    EXPECT_EQ(locked.erase(p), 1u) << "unregistered memory that was not registered";
    ++unregistered;
    EXPECT_EQ(device_syncs, unregistered) << "unregistered before the device's copies finished";
    return Status::OK();
  }
  Result<device::Stream> NewStream() override { return Status::InvalidArgument("NewStream"); }
  void FreeStream(device::Stream) override {}
  Result<device::Event> NewEvent() override { return Status::InvalidArgument("NewEvent"); }
  void FreeEvent(device::Event) override {}
  Status CopyAsync(void*, const void*, size_t, device::CopyKind, device::Stream) override {
    return Status::InvalidArgument("CopyAsync");
  }
  Status RecordEvent(device::Event, device::Stream) override { return Status::OK(); }
  Status WaitEvent(device::Event) override { return Status::OK(); }
  Result<bool> QueryEvent(device::Event) override { return true; }
  Result<std::string> DeviceIdentity(int) override { return std::string("fake"); }
  Status Synchronize(device::Stream) override { return Status::OK(); }
  Status SynchronizeDevice() override {
    std::lock_guard<std::mutex> lock(mu);
    ++device_syncs;
    return Status::OK();
  }

  // Whether [p, p + n) lies in page-locked memory.
  bool Locked(const void* p, size_t n) {
    std::lock_guard<std::mutex> lock(mu);
    for (const auto& [base, bytes] : locked) {
      const auto* b = static_cast<const uint8_t*>(base);
      const auto* q = static_cast<const uint8_t*>(p);
      if (q >= b && q + n <= b + bytes) return true;
    }
    return false;
  }
  std::mutex mu;
  std::map<void*, size_t> locked;
  int registered = 0;
  int unregistered = 0;
  int device_syncs = 0;
};

// Rows handed out while PageLockRows is in force lie in page-locked memory
// (straight copies to a GPU); UnlockRows gives it all back; rows read after
// it are handed out as before.
TEST_P(FeedTest, PageLockedRowsLieInRegisteredMemoryUntilUnlocked) {
  StartNodes(1);
  auto runtime = std::make_shared<RecordingRuntime>();
  auto c = OpenConsumer(0);
  ASSERT_TRUE(c->PageLockRows(runtime).ok());
  FeedPartition(0, 0, 0, 40, 10);
  EndEpochAll(0, 1);
  ASSERT_TRUE(c->BeginEpoch().ok());
  auto first = c->NextEpochBatch(10, true);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  ASSERT_FALSE(first->empty());
  for (const RowRange& r : *first) {
    EXPECT_TRUE(runtime->Locked(r.message.data(), r.message.size())) << "a handed-out range is pageable";
  }
  EXPECT_EQ(Values(*first).front(), 0);
  c->UnlockRows();
  EXPECT_TRUE(runtime->locked.empty());
  auto second = c->NextEpochBatch(10, true);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(Count(*second), 10);
  for (const RowRange& r : *second) EXPECT_FALSE(runtime->Locked(r.message.data(), r.message.size()));
  EXPECT_EQ(runtime->registered, 1);
  first->clear();
  second->clear();
  c.reset();
  EXPECT_TRUE(runtime->locked.empty());
}

// A reader that keeps every row makes reads revoke its leases again and
// again; each revoke gives the page-locked view back (after a device sync)
// and locks the next, until page-locking stops for the pass.
TEST_P(FeedTest, PageLockingStopsWhenReadsKeepRevokingHeldRows) {
  StartNodes(1, 1 << 16);
  auto runtime = std::make_shared<RecordingRuntime>();
  auto c = OpenConsumer(0);
  ASSERT_TRUE(c->PageLockRows(runtime).ok());
  constexpr int kMessages = 60;
  std::thread producer([&] {
    auto p = Producer::Open(Endpoints(), 0, 0, 0, Options());
    ASSERT_TRUE(p.ok()) << p.status().ToString();
    for (int i = 0; i < kMessages; ++i) {
      std::vector<uint8_t> bytes(6000, static_cast<uint8_t>(i));
      ASSERT_TRUE((*p)->SendBatch(0, bytes, 1).ok()) << i;
    }
    ASSERT_TRUE((*p)->EndPartition().ok());
  });
  std::vector<RowRange> kept;
  for (int i = 0; i < kMessages; ++i) {
    auto r = c->Next(1, false);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ(r->front().ipc()[0], static_cast<uint8_t>(i));
    kept.push_back(r->front());
  }
  producer.join();
  for (int i = 0; i < kMessages; ++i) EXPECT_EQ(kept[i].ipc()[100], static_cast<uint8_t>(i)) << i;
  EXPECT_EQ(runtime->registered, 5);  // the first view and one after each of 4 revokes
  EXPECT_TRUE(runtime->locked.empty());
  EXPECT_EQ(runtime->device_syncs, 5);
}

TEST_P(FeedTest, PageLockRowsNeedsARuntime) {
  StartNodes(1);
  auto c = OpenConsumer(0);
  Status st = c->PageLockRows(nullptr);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("worker:0"), std::string::npos) << st.ToString();
}

TEST_P(FeedTest, AnEpochEndsOnlyWhenTheDriverSaysHowManyPartitionsItHad) {
  StartNodes(2);
  FeedPartition(0, 0, 0, 12);
  auto c = OpenConsumer(0, true, Duration(500));
  ASSERT_TRUE(c->BeginEpoch().ok());
  auto first = c->NextEpochBatch(4, true);
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(Count(*first), 4);  // 5 of its 6 rows are provably usable before the epoch ends
  auto second = c->NextEpochBatch(4, true);
  ASSERT_EQ(second.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(second.status().message().find("worker:0"), std::string::npos);
  EndEpochAll(0, 1);
  auto other = OpenConsumer(1);
  auto batches = ConsumeEpoch(*other, 4, /*drop_remainder=*/false);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1].size(), 2u);
}

TEST_P(FeedTest, NextEpochBatchesHandsOutRunsOfWholeBatchesThenTheLastSmallerOne) {
  StartNodes(1);
  FeedPartition(0, 0, 0, 50);  // messages of 7 rows: runs span messages
  FeedPartition(1, 1, 100, 50);
  EndEpochAll(0, 1);
  EndEpochAll(1, 1);
  auto c = OpenConsumer(0);
  for (bool drop_remainder : {false, true}) {
    ASSERT_TRUE(c->BeginEpoch().ok());
    std::vector<int64_t> counts, values;
    for (;;) {
      auto run = c->NextEpochBatches(4, 5, drop_remainder);
      ASSERT_TRUE(run.ok()) << run.status().ToString();
      if (run->empty()) break;
      counts.push_back(Count(*run));
      for (int64_t v : Values(*run)) values.push_back(v);
    }
    // Runs hold whole batches (as many as the messages read so far allow, at most 5), then
    // the last smaller batch unless dropped.
    ASSERT_FALSE(counts.empty());
    for (size_t i = 0; i + 1 < counts.size(); ++i) {
      EXPECT_TRUE(counts[i] % 4 == 0 && counts[i] <= 20) << counts[i];
    }
    EXPECT_EQ(counts.back(), drop_remainder ? counts.back() - counts.back() % 4 : 2);
    EXPECT_GT(*std::max_element(counts.begin(), counts.end()), 4) << "no run of several batches";
    const int64_t base = drop_remainder ? 100 : 0;
    ASSERT_EQ(values.size(), drop_remainder ? 48u : 50u);
    for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(values[i], base + static_cast<int64_t>(i));
  }
  EXPECT_EQ(c->NextEpochBatches(4, 0, true).status().code(), StatusCode::kInvalidArgument);
}

TEST_P(FeedTest, SendBatchPartsArrivesAsOneBatch) {
  StartNodes(2);
  auto producer = Producer::Open(Endpoints(), 0, 0, 0, Options());
  ASSERT_TRUE(producer.ok()) << producer.status().ToString();
  const std::vector<uint8_t> ipc = Ipc(1000);
  const std::span<const uint8_t> whole(ipc);
  const std::span<const uint8_t> parts[] = {whole.first(3), {}, whole.subspan(3)};
  ASSERT_TRUE((*producer)->SendBatchParts(0, parts, 5).ok());
  ASSERT_TRUE((*producer)->SendBatchParts(1, parts, 5).ok());
  const std::vector<uint8_t> big((*producer)->MaxBatchBytes(0) + 1);
  const std::span<const uint8_t> too_big[] = {whole, std::span<const uint8_t>(big).subspan(8)};
  EXPECT_EQ((*producer)->SendBatchParts(0, too_big, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*producer)->sent(), (std::vector<int64_t>{5, 5}));
  ASSERT_TRUE((*producer)->EndPartition().ok());
  EndEpochAll(0, 1);
  for (int k = 0; k < 2; ++k) {
    auto c = OpenConsumer(k);
    auto batches = ConsumeEpoch(*c, 5);
    ASSERT_EQ(batches.size(), 1u);
    EXPECT_EQ(batches[0], (std::vector<int64_t>{1000, 1001, 1002, 1003, 1004}));
  }
}

TEST_P(FeedTest, ANodeWithNoRowsOfATinyEpochStillStepsThroughIt) {
  StartNodes(2);
  FeedPartition(0, 0, 0, 1);
  EndEpochAll(0, 1);
  FeedPartition(0, 1, 100, 10);
  EndEpochAll(1, 1);
  EndFeedAll();
  for (int k = 0; k < 2; ++k) {
    auto c = OpenConsumer(k);
    std::vector<size_t> sizes;
    for (int e = 0; e < 3; ++e) sizes.push_back(ConsumeEpoch(*c, 2).size());
    EXPECT_EQ(sizes, (std::vector<size_t>{0, 2, 0})) << "worker:" << k;
    EXPECT_TRUE(c->ShouldStop());
  }
}

TEST_P(FeedTest, ARetriedFeedingTaskDoesNotUnbalanceTheNodes) {
  StartNodes(2);
  {  // attempt 0 dies after writing 40 rows to node 0 only
    auto producer = Producer::Open({Endpoints()[0]}, 0, 0, 0, Options());
    ASSERT_TRUE(producer.ok());
    ASSERT_TRUE((*producer)->SendBatch(0, Ipc(1000), 40).ok());
  }
  // A dead task's last frames reach the node whenever its relay gets to them: nothing orders
  // two TCP connections (a finished partition is ordered by its Flush; a dead one never
  // flushes).  Let it land first, so the values below are predictable.
  if (GetParam() == Via::kTcp) {
    ASSERT_TRUE(ember::testing::WaitUntil([&] { return nodes_[0]->server->stats().messages_relayed >= 1; }));
  }
  FeedPartition(0, 0, 0, 100, 10, /*attempt=*/1);
  EndEpochAll(0, 1);
  EndFeedAll();
  for (int k = 0; k < 2; ++k) {
    auto c = OpenConsumer(k);
    auto batches = ConsumeEpoch(*c, 8);
    EXPECT_EQ(batches.size(), 50u / 8) << "worker:" << k;
    if (k == 0) {
      EXPECT_EQ(batches[0][0], 1000);  // the failed attempt's rows come first
    }
  }
}

TEST_P(FeedTest, AConsumerThatStopsEarlyGetsTheNextEpoch) {
  StartNodes(1);
  for (uint32_t e = 0; e < 2; ++e) {
    FeedPartition(0, e, e * 100, 10);
    EndEpochAll(e, 1);
  }
  EndFeedAll();
  auto c = OpenConsumer(0);
  for (uint32_t e = 0; e < 2; ++e) {
    auto epoch = c->BeginEpoch();
    ASSERT_TRUE(epoch.ok() && *epoch);
    EXPECT_EQ(**epoch, e);
    auto b = c->NextEpochBatch(4, true);
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(Values(*b)[0], e * 100);  // one step, then stop pulling
  }
  auto rest = c->Next(5, false);
  ASSERT_TRUE(rest.ok());
  EXPECT_TRUE(rest->empty());
  EXPECT_TRUE(c->ShouldStop());
}

TEST_P(FeedTest, ValidationEpochsAreReadAfterTheirTrainingEpochAndSkippedByTrainingReads) {
  StartNodes(2);
  FeedPartition(0, 0, 0, 16);
  EndEpochAll(0, 1);
  FeedPartition(0, ValidationEpoch(0), 1000, 8);
  EndEpochAll(ValidationEpoch(0), 1);
  FeedPartition(0, 1, 2000, 16);
  EndEpochAll(1, 1);
  EndFeedAll();
  // worker:0 validates after its training epoch.
  auto c = OpenConsumer(0);
  ASSERT_EQ(ConsumeEpoch(*c, 4).size(), 2u);
  auto v = c->BeginEpoch(EpochKind::kValidation);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  ASSERT_TRUE(v->has_value());
  EXPECT_EQ(**v, ValidationEpoch(0));
  auto rows = c->NextEpochBatch(100, false);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(Count(*rows), 4);
  EXPECT_GE(Values(*rows)[0], 1000);
  EXPECT_LT(Values(*rows)[0], 2000);
  // Asking for validation where a training epoch comes next names the node and the epoch.
  auto wrong = c->BeginEpoch(EpochKind::kValidation);
  ASSERT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("worker:0"), std::string::npos);
  EXPECT_NE(wrong.status().message().find("training epoch 1"), std::string::npos);
  // worker:1 reads training epochs only: the validation epoch is skipped.
  auto other = OpenConsumer(1);
  ASSERT_EQ(ConsumeEpoch(*other, 4).size(), 2u);
  auto second = ConsumeEpoch(*other, 4);
  ASSERT_EQ(second.size(), 2u);
  EXPECT_GE(second[0][0], 2000);
}

TEST_P(FeedTest, NextSkipsValidationRows) {
  StartNodes(1);
  FeedPartition(0, 0, 0, 5);
  EndEpochAll(0, 1);
  FeedPartition(0, ValidationEpoch(0), 1000, 5);
  EndEpochAll(ValidationEpoch(0), 1);
  FeedPartition(0, 1, 2000, 5);
  EndEpochAll(1, 1);
  EndFeedAll();
  auto c = OpenConsumer(0);
  std::vector<int64_t> got;
  for (;;) {
    auto r = c->Next(3, false);
    ASSERT_TRUE(r.ok());
    if (r->empty()) break;
    for (int64_t v : Values(*r)) got.push_back(v);
  }
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 2, 3, 4, 2000, 2001, 2002, 2003, 2004}));
}

TEST_P(FeedTest, AwaitEpochReturnsOnceEveryNodeBeganTheEpochOrEndedItsFeed) {
  StartNodes(2);
  FeedPartition(0, 0, 0, 16);
  EndEpochAll(0, 1);
  FeedPartition(0, 1, 100, 16);
  EndEpochAll(1, 1);
  std::atomic<bool> done{false};
  Result<std::vector<NodeEpochState>> states = Status::Internal("not run");
  std::thread driver([&] {
    states = AwaitEpoch(Endpoints(), 0, Options());
    done = true;
  });
  auto c0 = OpenConsumer(0);
  auto c1 = OpenConsumer(1);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load()) << "no node began epoch 0 yet";
  ASSERT_EQ(ConsumeEpoch(*c0, 4).size(), 2u);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  EXPECT_FALSE(done.load()) << "worker:1 has not begun epoch 0";
  ASSERT_TRUE(c1->BeginEpoch().ok());
  driver.join();
  ASSERT_TRUE(states.ok()) << states.status().ToString();
  EXPECT_EQ(*states, (std::vector<NodeEpochState>{NodeEpochState::kBegun, NodeEpochState::kBegun}));
  // worker:0 begins epoch 1; worker:1 ends its feed (early stopping) instead.
  ASSERT_TRUE(c0->BeginEpoch().ok());
  c1->Terminate();
  auto next = AwaitEpoch(Endpoints(), 1, Options());
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_EQ(*next, (std::vector<NodeEpochState>{NodeEpochState::kBegun, NodeEpochState::kTerminated}));
  // A node whose feed server is gone is reported as such; the caller asks how it ended.
  NodeEndpoint gone{2, "worker:2", UniqueName("gone"), "127.0.0.1", 1, 1 << 20};
  auto with_gone = AwaitEpoch({Endpoints()[0], gone}, 1, Options());
  ASSERT_TRUE(with_gone.ok()) << with_gone.status().ToString();
  EXPECT_EQ((*with_gone)[1], NodeEpochState::kGone);
}

TEST_P(FeedTest, AwaitEpochNamesTheNodeThatReadsNothing) {
  StartNodes(1);
  FeedPartition(0, 0, 0, 8);
  EndEpochAll(0, 1);
  FeedOptions o = Options();
  o.idle_timeout = Duration(1500);
  const auto start = Clock::now();
  auto r = AwaitEpoch(Endpoints(), 0, o);
  const auto took = Clock::now() - start;
  ASSERT_EQ(r.status().code(), StatusCode::kDeadlineExceeded) << r.status().ToString();
  EXPECT_NE(r.status().message().find("worker:0"), std::string::npos) << r.status().ToString();
  EXPECT_NE(r.status().message().find("epoch 0"), std::string::npos) << r.status().ToString();
  EXPECT_GE(took, std::chrono::milliseconds(1400));
  EXPECT_LT(took, std::chrono::seconds(8));
}

TEST_P(FeedTest, NextHandsOutRowsAcrossMessagesLikeTfos) {
  StartNodes(1);
  FeedPartition(0, 0, 0, 10, 3);
  EndEpochAll(0, 1);
  EndFeedAll();
  auto c = OpenConsumer(0);
  std::vector<int64_t> sizes;
  for (int64_t n : {2, 4, 10}) sizes.push_back(Count(*c->Next(n, false)));
  EXPECT_EQ(sizes, (std::vector<int64_t>{2, 4, 4}));
  EXPECT_TRUE(c->ShouldStop());
}

TEST_P(FeedTest, TerminateStopsProducersQuietly) {
  StartNodes(1);
  auto c = OpenConsumer(0);
  c->Terminate();
  auto producer = Producer::Open(Endpoints(), 0, 0, 0, Options());
  ASSERT_TRUE(producer.ok());
  Status st;
  // Over TCP the node's feed server says so a moment later.
  const auto until = Clock::now() + std::chrono::seconds(3);
  for (int i = 0; st.ok() && !(*producer)->all_cancelled() && Clock::now() < until; ++i) {
    st = (*producer)->SendBatch(0, Ipc(i), 1);
    if (GetParam() == Via::kTcp) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE((*producer)->all_cancelled());
  EXPECT_TRUE((*producer)->EndPartition().ok());
  EXPECT_TRUE(c->ShouldStop());
  auto epoch = c->BeginEpoch();
  ASSERT_TRUE(epoch.ok());
  EXPECT_FALSE(epoch->has_value());
}

TEST_P(FeedTest, ANodeThatEndedIsSkippedAndReportedGone) {
  StartNodes(1);
  NodeEndpoint ended{1, "worker:1", UniqueName("gone"), "127.0.0.1", 1, 1 << 20};
  auto producer = Producer::Open({Endpoints()[0], ended}, 0, 0, 0, Options());
  ASSERT_TRUE(producer.ok()) << producer.status().ToString();
  std::vector<int64_t> split = (*producer)->Split(10);
  ASSERT_TRUE((*producer)->SendBatch(0, Ipc(0), split[0]).ok());
  ASSERT_TRUE((*producer)->SendBatch(1, Ipc(5), split[1]).ok());
  ASSERT_TRUE((*producer)->EndPartition().ok());
  EXPECT_EQ((*producer)->sent(), (std::vector<int64_t>{5, 5}));
  EXPECT_FALSE((*producer)->gone(0));
  EXPECT_TRUE((*producer)->gone(1));
  auto told = EndEpoch({Endpoints()[0], ended}, 0, 1, Options());
  ASSERT_TRUE(told.ok());
  ASSERT_EQ(told->size(), 2u);
  EXPECT_EQ((*told)[0], "");
  EXPECT_NE((*told)[1].find("cannot reach the node's feed server"), std::string::npos) << (*told)[1];
  // Inference needs its node's answers: there, a node that cannot be reached is an error.
  auto infer = InferenceProducer::Open(ended, 0, Options());
  ASSERT_EQ(infer.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(infer.status().message().find("worker:1"), std::string::npos) << infer.status().message();
}

// ------------------------------------------------------------------ inference
// A node loop in TFoS style: Next(4) until ShouldStop, answering each batch
// with answer(rows) result rows.
struct NodeLoop {
  std::thread thread;
  std::vector<Status> errors;
};

void RunNode(Consumer* c, std::function<int64_t(int64_t)> answer, std::vector<Status>* errors) {
  while (!c->ShouldStop()) {
    auto rows = c->Next(4, true);
    if (!rows.ok()) {
      errors->push_back(rows.status());
      if (rows.status().code() == StatusCode::kDeadlineExceeded) return;
      continue;
    }
    const int64_t n = Count(*rows);
    if (n == 0) continue;
    const int64_t m = answer(n);
    auto plan = c->PlanResults(m);
    if (!plan.ok()) {
      errors->push_back(plan.status());
      continue;
    }
    int64_t first = Values(*rows)[0];
    for (int64_t k : *plan) {
      Status st = c->SendResults(Ipc(first * 10), k);
      if (!st.ok()) errors->push_back(st);
      first += k;
    }
  }
}

// Feeds rows [0, rows) to node 0 as partition `p` and collects the answers.
Status Infer(InferenceProducer& prod, int64_t rows, int64_t chunk, std::vector<int64_t>* answers) {
  Status writer_status;
  std::thread writer([&] {
    writer_status = prod.Begin();
    for (int64_t at = 0; writer_status.ok() && at < rows; at += chunk) {
      writer_status = prod.SendBatch(Ipc(at), std::min(chunk, rows - at));
    }
    if (writer_status.ok()) writer_status = prod.End();
    prod.ReleaseSession();
  });
  Status st;
  for (;;) {
    auto r = prod.NextResult();
    if (!r.ok()) {
      st = r.status();
      break;
    }
    if (!r->has_value()) break;
    for (int64_t i = 0; i < (*r)->rows; ++i) answers->push_back(FirstValue((*r)->ipc()) + i);
  }
  if (!st.ok()) prod.Close();
  writer.join();
  return st.ok() ? writer_status : st;
}

TEST_P(FeedTest, InferenceRoundTripAnswersEveryRowInOrder) {
  StartNodes(1);
  auto c = OpenConsumer(0, /*train_mode=*/false);
  std::vector<Status> node_errors;
  std::thread node([&] { RunNode(c.get(), [](int64_t n) { return n; }, &node_errors); });
  for (uint32_t p = 0; p < 3; ++p) {
    auto prod = InferenceProducer::Open(Endpoints()[0], p, Options());
    ASSERT_TRUE(prod.ok()) << prod.status().ToString();
    std::vector<int64_t> answers;
    Status st = Infer(**prod, 10, 3, &answers);
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_EQ(answers.size(), 10u);
    EXPECT_EQ((*prod)->rows_answered(), 10);
  }
  EndFeedAll();
  node.join();
  EXPECT_TRUE(node_errors.empty()) << node_errors[0].ToString();
}

TEST_P(FeedTest, InferenceTooManyResultsNamesNodeAndPartition) {
  StartNodes(1);
  auto c = OpenConsumer(0, false);
  std::vector<Status> node_errors;
  std::thread node([&] { RunNode(c.get(), [](int64_t n) { return n + 1; }, &node_errors); });
  auto prod = InferenceProducer::Open(Endpoints()[0], 4, Options());
  ASSERT_TRUE(prod.ok());
  std::vector<int64_t> answers;
  Status st = Infer(**prod, 6, 3, &answers);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("worker:0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("partition 4"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("one result per input row"), std::string::npos) << st.message();
  EndFeedAll();
  node.join();
  ASSERT_FALSE(node_errors.empty());
  EXPECT_EQ(node_errors[0].code(), StatusCode::kInvalidArgument);
}

TEST_P(FeedTest, InferenceTooFewResultsNamesNodeAndPartition) {
  StartNodes(1);
  auto c = OpenConsumer(0, false);
  std::vector<Status> node_errors;
  std::thread node([&] { RunNode(c.get(), [](int64_t n) { return n - 1; }, &node_errors); });
  auto prod = InferenceProducer::Open(Endpoints()[0], 2, Options());
  ASSERT_TRUE(prod.ok());
  std::vector<int64_t> answers;
  Status st = Infer(**prod, 8, 4, &answers);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("worker:0"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("partition 2"), std::string::npos) << st.message();
  EndFeedAll();
  node.join();
}

TEST_P(FeedTest, ANodeFailureDuringInferenceIsReportedWithTheNodesReasonPromptly) {
  StartNodes(1);
  auto prod = InferenceProducer::Open(Endpoints()[0], 0, Options());
  ASSERT_TRUE(prod.ok());
  ASSERT_TRUE((*prod)->Begin().ok());
  ASSERT_TRUE((*prod)->SendBatch(Ipc(0), 3).ok());
  ASSERT_TRUE((*prod)->End().ok());
  const auto start = Clock::now();
  std::thread launcher([&] {  // the node never answers; its launcher sees it die
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    nodes_[0]->ring->Abort("node worker:0 failed (killed by signal 9)");
  });
  auto r = (*prod)->NextResult();
  launcher.join();
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
  EXPECT_NE(r.status().message().find("node worker:0 failed (killed by signal 9)"), std::string::npos)
      << r.status().message();
  EXPECT_NE(r.status().message().find("partition 0"), std::string::npos) << r.status().message();
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
}

// Regression: a node killed during inference, then its feeding task killed
// (Spark SIGKILLs the Python workers of a failed stage), left the task's
// result ring in /dev/shm: the node drops the name only once it has mapped
// the ring.  Result rings are named after their node, and the node's
// launcher removes what is left when the node has ended.
TEST_P(FeedTest, ResultRingsOfADeadNodeAreRemovedByName) {
  StartNodes(2);
  auto prod = InferenceProducer::Open(Endpoints()[0], 7, Options());
  ASSERT_TRUE(prod.ok());
  ASSERT_TRUE((*prod)->Begin().ok());  // over shm: the result ring exists now, named for worker:0
  const std::string node0 = nodes_[0]->ring->name().substr(1), node1 = nodes_[1]->ring->name().substr(1);
  auto names_of = [](const std::string& node_ring_no_slash) {
    std::vector<std::string> out;
    const std::string prefix = node_ring_no_slash + "-results";
    if (DIR* d = opendir("/dev/shm")) {
      while (const dirent* e = readdir(d)) {
        if (std::string_view(e->d_name).substr(0, prefix.size()) == prefix) out.emplace_back(e->d_name);
      }
      closedir(d);
    }
    return out;
  };
  std::unique_ptr<shm::Ring> other;  // a result ring of worker:1 stays
  auto made = shm::Ring::Create(ResultRingPrefix(nodes_[1]->ring->name()) + "-r1-test", 1 << 16);
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  other = made.MoveValueUnsafe();
  if (GetParam() == Via::kShm) {
    EXPECT_EQ(names_of(node0).size(), 1u);
  }
  EXPECT_EQ(names_of(node1).size(), 1u);
  ASSERT_TRUE(RemoveResultRings(nodes_[0]->ring->name()).ok());
  EXPECT_TRUE(names_of(node0).empty());
  EXPECT_EQ(names_of(node1).size(), 1u);
  ASSERT_TRUE(RemoveResultRings(nodes_[1]->ring->name()).ok());
  EXPECT_TRUE(names_of(node1).empty());
  ASSERT_TRUE(RemoveResultRings("/no-such-node").ok());  // nothing to remove: fine
  nodes_[0]->ring->Abort("node worker:0 failed (killed by signal 9)");
}

TEST_P(FeedTest, TheProducersIdleTimeoutReachesTheNodeSide) {
  // The node's feed server would wait 10 minutes on a full ring; the
  // producer's 300 ms (its kHello) is what applies to its connection.
  StartNodes(1, 1 << 16, Duration(600000));
  const std::vector<uint8_t> big(MaxBatchBytes(1 << 16, size_t{64} << 20), 1);
  const auto start = Clock::now();
  if (GetParam() == Via::kShm) {
    FeedOptions o = Options();
    o.idle_timeout = Duration(300);
    auto producer = Producer::Open(Endpoints(), 0, 0, 0, o);
    ASSERT_TRUE(producer.ok());
    Status st;
    for (int i = 0; i < 4 && st.ok(); ++i) st = (*producer)->SendBatch(0, big, 1);  // nobody reads
    EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded) << st.ToString();
    EXPECT_NE(st.message().find("worker:0"), std::string::npos) << st.message();
  } else {
    auto client = FeedClient::Connect("127.0.0.1", nodes_[0]->server->port(), kSecret, Duration(5000),
                                      size_t{64} << 20, Duration(300));
    ASSERT_TRUE(client.ok());
    // Three messages: two fill the ring, the third blocks the server, not this socket.
    for (int i = 0; i < 3; ++i) {
      ASSERT_TRUE((*client)->Write(FeedKind::kBatch, EncodeBatch({0, 0, 0, 1}, big), Deadline::After(Duration(5000))).ok());
    }
    FeedKind kind{};
    std::vector<uint8_t> payload;
    ASSERT_TRUE((*client)->Read(&kind, &payload, Deadline::After(Duration(5000))).ok());
    EXPECT_EQ(kind, FeedKind::kError);
    EXPECT_EQ(std::string(AsChars(payload)).rfind("DeadlineExceeded: ", 0), 0u) << std::string(AsChars(payload));
  }
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(4));
}

TEST_P(FeedTest, OversizeBatchesAreRefusedWithTheLimit) {
  StartNodes(1, 1 << 16);
  auto producer = Producer::Open(Endpoints(), 0, 0, 0, Options());
  ASSERT_TRUE(producer.ok());
  const size_t max = (*producer)->MaxBatchBytes(0);
  EXPECT_EQ(max, MaxBatchBytes(1 << 16, Options().max_message_bytes));
  std::vector<uint8_t> too_big(max + 1, 0);
  Status st = (*producer)->SendBatch(0, too_big, 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("send fewer rows"), std::string::npos);
  EXPECT_EQ((*producer)->sent()[0], 0);
  std::vector<uint8_t> fits(max, 0);
  EXPECT_TRUE((*producer)->SendBatch(0, fits, 2).ok());
}

}  // namespace
}  // namespace ember::feed

// The node reads messages in place (ring leases).  A node that keeps every
// batch it got alive must neither stall its producers (leases past the
// consumer's bound are revoked into private copies) nor see its kept bytes
// change when the ring reuses them.
namespace ember::feed {
namespace {

// An "IPC stream" of `bytes` bytes: the first row's value, then a pattern of it.
std::vector<uint8_t> PaddedIpc(int64_t first, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  std::memcpy(v.data(), &first, 8);
  for (size_t i = 8; i < bytes; ++i) v[i] = static_cast<uint8_t>(first * 7 + i);
  return v;
}

TEST_P(FeedTest, KeepingEveryBatchOfAnEpochBiggerThanTheRingNeitherStallsNorCorrupts) {
  constexpr size_t kRing = 16 << 10;
  constexpr size_t kIpc = 1000;
  constexpr int64_t kRows = 10, kMessages = 200;  // 200 KB through a 16 KiB ring
  StartNodes(1, kRing);
  std::thread feeder([&] {
    auto producer = Producer::Open(Endpoints(), 0, 0, 0, Options());
    ASSERT_TRUE(producer.ok()) << producer.status().ToString();
    for (int64_t m = 0; m < kMessages; ++m) {
      ASSERT_TRUE((*producer)->SendBatch(0, PaddedIpc(m * kRows, kIpc), kRows).ok()) << m;
    }
    ASSERT_TRUE((*producer)->EndPartition().ok());
    EndEpochAll(0, 1);
  });
  auto c = OpenConsumer(0);
  ASSERT_TRUE(c->BeginEpoch().ok());
  std::vector<RowRange> kept;
  for (;;) {
    auto batch = c->NextEpochBatch(25, false);
    ASSERT_TRUE(batch.ok()) << batch.status().ToString();
    if (batch->empty()) break;
    for (RowRange& r : *batch) kept.push_back(std::move(r));
  }
  feeder.join();
  std::vector<int64_t> values = Values(kept);
  ASSERT_EQ(values.size(), static_cast<size_t>(kRows * kMessages));
  for (size_t i = 0; i < values.size(); ++i) ASSERT_EQ(values[i], static_cast<int64_t>(i));
  for (const RowRange& r : kept) {
    auto want = PaddedIpc(FirstValue(r.ipc()), kIpc);
    ASSERT_TRUE(std::equal(want.begin(), want.end(), r.ipc().begin(), r.ipc().end())) << FirstValue(r.ipc());
  }
  // Ranges outlive the consumer and its ring.
  c.reset();
  nodes_[0]->server->Close();
  nodes_[0]->ring->Close();
  EXPECT_EQ(FirstValue(kept.back().ipc()), (kMessages - 1) * kRows);
}

}  // namespace
}  // namespace ember::feed
