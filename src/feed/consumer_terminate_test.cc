// Consumer::Terminate() on one thread while another reads the same consumer:
// TFoS programs read their DataFeed in tf.data's generator thread while the
// main thread calls DataFeed.terminate().  The read ends as at the end of the
// feed (woken if it was blocked on the empty ring), producers stop quietly,
// and the rows already handed out stay valid.  Data races are ThreadSanitizer's
// to find (make test-tsan), leaks LeakSanitizer's (the ASan build).
//
// No assertion here depends on timing: the consumers' read_timeout is a
// minute, so a read that Terminate() failed to end fails the test with
// DeadlineExceeded, and either order of the two threads must end the same way.
#include <sys/syscall.h>
#include <unistd.h>

#include <condition_variable>
#include <fstream>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include <gtest/gtest.h>

#include "ember/feed.h"
#include "feed/feed_test_fixture.h"

namespace ember::feed {
namespace {

constexpr Duration kLongRead{60000};  // a read Terminate() does not end fails, not passes

class TerminateTest : public FeedTest {};

INSTANTIATE_TEST_SUITE_P(Transports, TerminateTest, ::testing::Values(Via::kShm, Via::kTcp),
                         [](const auto& info) { return info.param == Via::kShm ? "Shm" : "Tcp"; });

// Whether thread `tid` of this process is asleep (in the ring's wait, for a
// reader on an empty ring).
bool Asleep(pid_t tid) {
  std::ifstream stat("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const size_t close = line.rfind(')');  // "tid (name) S ..."
  return close != std::string::npos && close + 2 < line.size() && line[close + 2] == 'S';
}

// Runs `read` on a reader thread and calls c.Terminate() on this one once the
// reader is inside the call, preferably asleep in it (waited for up to 10 s,
// then terminated anyway: the outcome must not depend on it).
template <typename T>
Result<T> ReadWhileAnotherThreadTerminates(Consumer& c, const std::function<Result<T>()>& read) {
  std::promise<pid_t> entered;
  std::optional<Result<T>> got;
  std::thread reader([&] {
    entered.set_value(static_cast<pid_t>(::syscall(SYS_gettid)));
    got.emplace(read());
  });
  std::future<pid_t> started = entered.get_future();
  if (started.wait_for(std::chrono::seconds(60)) == std::future_status::ready) {
    const pid_t tid = started.get();
    const auto until = Clock::now() + std::chrono::seconds(10);
    while (!Asleep(tid) && Clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  } else {
    ADD_FAILURE() << "the reader thread did not start within 60 s";
  }
  c.Terminate();
  reader.join();
  return std::move(*got);
}

// After a Terminate: every read ends at once, and producers are told.
void ExpectEnded(Consumer& c, const std::vector<NodeEndpoint>& nodes, const FeedOptions& options) {
  EXPECT_TRUE(c.ShouldStop());
  auto next = c.Next(5, false);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_TRUE(next->empty());
  auto epoch = c.BeginEpoch();
  ASSERT_TRUE(epoch.ok()) << epoch.status().ToString();
  EXPECT_FALSE(epoch->has_value());
  auto batch = c.NextEpochBatch(5, false);
  ASSERT_TRUE(batch.ok()) << batch.status().ToString();
  EXPECT_TRUE(batch->empty());
  auto states = AwaitEpoch(nodes, 0, options);
  ASSERT_TRUE(states.ok()) << states.status().ToString();
  EXPECT_EQ(*states, std::vector<NodeEpochState>(nodes.size(), NodeEpochState::kTerminated));
}

TEST_P(TerminateTest, ANextBlockedOnAnEmptyRingEndsWithNoRows) {
  StartNodes(1);
  auto c = OpenConsumer(0, true, kLongRead);
  auto got = ReadWhileAnotherThreadTerminates<std::vector<RowRange>>(*c, [&] { return c->Next(10, false); });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->empty());
  ExpectEnded(*c, Endpoints(), Options());
}

TEST_P(TerminateTest, ABeginEpochBlockedOnAnEmptyRingEndsWithNoEpoch) {
  StartNodes(1);
  auto c = OpenConsumer(0, true, kLongRead);
  auto got = ReadWhileAnotherThreadTerminates<std::optional<uint32_t>>(*c, [&] { return c->BeginEpoch(); });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->has_value());
  ExpectEnded(*c, Endpoints(), Options());
}

TEST_P(TerminateTest, ANextEpochBatchWaitingForItsRowsEndsWithNoRows) {
  StartNodes(1);
  FeedPartition(0, 0, 0, 5);  // 5 rows of epoch 0, whose end never comes: a batch of 8 waits
  auto c = OpenConsumer(0, true, kLongRead);
  auto epoch = c->BeginEpoch();
  ASSERT_TRUE(epoch.ok()) << epoch.status().ToString();
  ASSERT_EQ(*epoch, std::optional<uint32_t>(0));
  auto got = ReadWhileAnotherThreadTerminates<std::vector<RowRange>>(*c, [&] { return c->NextEpochBatch(8, false); });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_TRUE(got->empty());
  ExpectEnded(*c, Endpoints(), Options());
}

TEST_P(TerminateTest, APeekRowBlockedOnAnEmptyRingEndsWithNoRow) {
  StartNodes(1);
  auto c = OpenConsumer(0, true, kLongRead);
  auto got = ReadWhileAnotherThreadTerminates<std::optional<RowRange>>(*c, [&] { return c->PeekRow(); });
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(got->has_value());
  ExpectEnded(*c, Endpoints(), Options());
}

// A producer streams partition 0 of epoch 0 (4 rows a batch, values counting
// up from 0) into a small ring until the node cancels it, while `read` pulls
// rows on a reader thread; this thread terminates the feed once the reader
// has read 2,000 rows.  `read` returns no rows at the end.  Closes `c`.
void StreamWhileTerminating(std::unique_ptr<Consumer>& c, const std::vector<NodeEndpoint>& nodes,
                            const FeedOptions& options, const std::function<Result<std::vector<RowRange>>()>& read) {
  Status send_st, end_st;
  bool cancelled = false;
  std::thread producer([&] {
    auto prod = Producer::Open(nodes, 0, 0, 0, options);
    if (!prod.ok()) {
      send_st = prod.status();
      return;
    }
    const Deadline until = Deadline::After(kLongRead);
    for (int64_t i = 0; send_st.ok() && !(*prod)->all_cancelled() && !until.expired(); ++i) {
      send_st = (*prod)->SendBatch(0, Ipc(4 * i), 4);
    }
    cancelled = (*prod)->all_cancelled();
    end_st = (*prod)->EndPartition();
  });

  std::mutex mu;
  std::condition_variable progressed;
  int64_t rows_read = 0;  // guarded by mu
  Status read_st;
  bool in_order = true;
  int64_t next_value = 0;
  RowRange last;
  std::thread reader([&] {
    for (;;) {
      Result<std::vector<RowRange>> got = read();
      if (!got.ok()) {
        read_st = got.status();
        break;
      }
      if (got->empty()) break;
      for (int64_t v : Values(*got)) in_order = in_order && v == next_value++;
      last = got->back();
      {
        std::lock_guard<std::mutex> lock(mu);
        rows_read += Count(*got);
      }
      progressed.notify_all();
    }
  });
  {
    std::unique_lock<std::mutex> lock(mu);
    EXPECT_TRUE(progressed.wait_for(lock, std::chrono::seconds(60), [&] { return rows_read >= 2000; }))
        << "the reader read " << rows_read << " rows in 60 s; terminating anyway";
  }
  c->Terminate();
  reader.join();
  producer.join();

  EXPECT_TRUE(read_st.ok()) << read_st.ToString();
  EXPECT_TRUE(in_order) << "rows came out of order or changed";
  EXPECT_GE(next_value, 2000);
  EXPECT_TRUE(send_st.ok()) << send_st.ToString();  // the producer stopped quietly ...
  EXPECT_TRUE(cancelled) << "the producer was not told the node terminated its feed";  // ... because it was told
  EXPECT_TRUE(end_st.ok()) << end_st.ToString();
  ExpectEnded(*c, nodes, options);
  // The last rows handed out stay valid after the feed ended, and after the consumer is gone.
  c.reset();
  ASSERT_GT(last.rows, 0);
  EXPECT_EQ(FirstValue(last.ipc()) + last.offset + last.rows, next_value);
}

TEST_P(TerminateTest, AReaderBusyWithNextEndsWhereTheTerminateFindsIt) {
  StartNodes(1, 1 << 16);
  auto c = OpenConsumer(0, true, kLongRead);
  StreamWhileTerminating(c, Endpoints(), Options(), [&] { return c->Next(3, false); });
}

TEST_P(TerminateTest, AReaderBusyWithEpochBatchesEndsWhereTheTerminateFindsIt) {
  StartNodes(1, 1 << 16);
  auto c = OpenConsumer(0, true, kLongRead);
  bool begun = false;
  StreamWhileTerminating(c, Endpoints(), Options(), [&]() -> Result<std::vector<RowRange>> {
    if (!begun) {  // on the reader thread: epoch 0 comes once the producer streams
      EMBER_ASSIGN_OR_RAISE(std::optional<uint32_t> epoch, c->BeginEpoch());
      if (epoch != std::optional<uint32_t>(0)) return Status::Internal("began no epoch 0");
      begun = true;
    }
    return c->NextEpochBatches(3, 4, false);
  });
}

}  // namespace
}  // namespace ember::feed
