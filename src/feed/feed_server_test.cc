// FeedServer + FeedClient over loopback TCP into a real shm::Ring: the
// consumer thread in each test plays the node.
#include "feed/feed_server.h"

#include <dirent.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "common/logging.h"
#include "common/test_util.h"
#include "feed/feed_client.h"
#include "feed/feed_wire.h"
#include "feed/codec.h"
#include "transport/shm/ring.h"
#include "transport/tcp/socket.h"

namespace ember::feed {
namespace {

using ember::testing::WaitUntil;

using Clock = std::chrono::steady_clock;
const std::string kSecret = "feed-test-secret-0123456789";

std::string TestPrefix() { return "ember-ftest-" + std::to_string(getpid()); }

std::string UniqueRingName() {
  static std::atomic<int> counter{0};
  return "/" + TestPrefix() + "-node-" + std::to_string(counter++);
}

// Names in /dev/shm this test process created.
std::vector<std::string> OurShmSegments() {
  std::vector<std::string> out;
  DIR* dir = opendir("/dev/shm");
  if (dir == nullptr) return out;
  while (dirent* e = readdir(dir)) {
    if (std::string(e->d_name).rfind(TestPrefix(), 0) == 0) out.push_back(e->d_name);
  }
  closedir(dir);
  return out;
}

Deadline Soon() { return Deadline::After(Duration(5000)); }

void PutU32(std::vector<uint8_t>* v, uint32_t x) {
  for (int i = 0; i < 4; ++i) v->push_back(static_cast<uint8_t>(x >> (8 * i)));
}
uint32_t GetU32(const std::vector<uint8_t>& v, size_t at) {
  uint32_t x;
  std::memcpy(&x, v.data() + at, 4);
  return x;
}

// kBatch with the task attempt field carrying `seq` (offset 8) and a body
// of seq-derived bytes standing in for the Arrow IPC stream.
std::vector<uint8_t> Batch(uint32_t partition, uint32_t seq, size_t body) {
  std::vector<uint8_t> ipc;
  for (size_t i = 0; i < body; ++i) ipc.push_back(static_cast<uint8_t>(seq * 7 + i));
  return EncodeBatch({partition, 0, seq, body > 0 ? 1 : 0}, ipc);
}

std::vector<uint8_t> EndPartition(uint32_t partition, int64_t rows) {
  return EncodeEndPartition({partition, 0, {rows}});
}

std::vector<uint8_t> Begin(uint32_t partition, bool results) {
  BeginPartition b;
  b.partition = partition;
  b.flags = results ? kBeginWantsResults : 0;
  return EncodeBeginPartition(b);
}

std::string Text(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }


class FeedServerTest : public ::testing::Test {
 protected:
  void StartNode(size_t ring_capacity, Duration idle_timeout = Duration(3000)) {
    auto ring = shm::Ring::Create(UniqueRingName(), ring_capacity);
    ASSERT_TRUE(ring.ok()) << ring.status().ToString();
    ring_ = ring.MoveValueUnsafe();
    FeedServerOptions o;
    o.bind_host = "127.0.0.1";
    o.secret = kSecret;
    o.ring_name = ring_->name();
    o.result_ring_prefix = "/" + TestPrefix() + "-results";
    o.result_ring_capacity = 1 << 16;
    o.handshake_timeout = Duration(500);
    o.idle_timeout = idle_timeout;
    idle_timeout_ = idle_timeout;
    auto server = FeedServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = server.MoveValueUnsafe();
  }

  std::unique_ptr<FeedClient> Connect() {
    auto c = FeedClient::Connect("127.0.0.1", server_->port(), kSecret, Duration(2000), size_t{64} << 20,
                                 idle_timeout_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? c.MoveValueUnsafe() : nullptr;
  }

  void TearDown() override {
    if (server_) server_->Close();
    server_.reset();
    ring_.reset();
    EXPECT_TRUE(OurShmSegments().empty()) << "leaked shm segment: " << OurShmSegments()[0];
  }

  std::unique_ptr<shm::Ring> ring_;  // the node's, read by the test's consumer
  std::unique_ptr<FeedServer> server_;
  Duration idle_timeout_{3000};  // the server's, and what Connect's kHello asks for
};

TEST_F(FeedServerTest, TrainingRelayKeepsOrderKindsAndBytes) {
  StartNode(1 << 18);  // MaxPayload ~128 KiB: frames above the 64 KiB coalescing limit too
  constexpr uint32_t kMessages = 600;
  auto size_of = [](uint32_t seq) { return (seq * 7919u) % 120000u; };
  std::thread consumer([&] {
    uint32_t kind;
    std::vector<uint8_t> payload;
    for (uint32_t seq = 0; seq < kMessages; ++seq) {
      ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());
      ASSERT_EQ(kind, static_cast<uint32_t>(FeedKind::kBatch));
      ASSERT_EQ(payload, Batch(1, seq, size_of(seq))) << "message " << seq;
    }
    ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());
    EXPECT_EQ(kind, static_cast<uint32_t>(FeedKind::kEndPartition));
    EXPECT_EQ(payload, EndPartition(1, kMessages));
    ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());
    EXPECT_EQ(kind, static_cast<uint32_t>(FeedKind::kEndEpoch));
    EXPECT_EQ(payload, std::vector<uint8_t>(8, 1));
    ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());
    EXPECT_EQ(kind, static_cast<uint32_t>(FeedKind::kEndFeed));
    EXPECT_TRUE(payload.empty());
  });
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  for (uint32_t seq = 0; seq < kMessages; ++seq) {
    ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(1, seq, size_of(seq)), Soon()).ok());
  }
  ASSERT_TRUE(client->Write(FeedKind::kEndPartition, EndPartition(1, kMessages), Soon()).ok());
  ASSERT_TRUE(client->Write(FeedKind::kEndEpoch, std::vector<uint8_t>(8, 1), Soon()).ok());
  ASSERT_TRUE(client->Write(FeedKind::kEndFeed, {}, Soon()).ok());
  consumer.join();
  // The consumer can read a message before the relaying thread counts it.
  EXPECT_TRUE(WaitUntil([&] { return server_->stats().messages_relayed == kMessages + 3; }))
      << server_->stats().messages_relayed;
  EXPECT_EQ(server_->stats().connections_accepted, 1u);
}

TEST_F(FeedServerTest, FullRingBlocksTheClientUntilTheNodeReads) {
  StartNode(1 << 16, Duration(5000));
  constexpr uint32_t kMessages = 2000;  // 32 MB: more than ring + socket buffers hold
  std::atomic<uint32_t> written{0};
  std::thread writer([&] {
    auto client = Connect();
    ASSERT_NE(client, nullptr);
    for (uint32_t seq = 0; seq < kMessages; ++seq) {
      Status st = client->Write(FeedKind::kBatch, Batch(2, seq, 16 * 1024), Soon());
      ASSERT_TRUE(st.ok()) << st.ToString();
      written = seq + 1;
    }
  });
  // Nobody reads: the writer must stall short of the end.
  uint32_t last = 0;
  bool stalled = false;
  for (int i = 0; i < 100 && !stalled; ++i) {
    std::this_thread::sleep_for(Duration(150));
    const uint32_t now = written;
    stalled = now == last && now < kMessages;
    last = now;
  }
  ASSERT_TRUE(stalled) << "writer never blocked; wrote " << written.load();
  const uint64_t relayed_when_stalled = server_->stats().messages_relayed;
  EXPECT_LT(relayed_when_stalled, kMessages);
  // The node reads again: everything arrives, in order.
  uint32_t kind;
  std::vector<uint8_t> payload;
  for (uint32_t seq = 0; seq < kMessages; ++seq) {
    ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok()) << "message " << seq;
    ASSERT_EQ(GetU32(payload, 8), seq);
  }
  writer.join();
  EXPECT_EQ(written.load(), kMessages);
}

// Regression (flaky FeedTest.AConsumerThatStopsEarlyGetsTheNextEpoch/Tcp): a producer's last
// messages could still be on their way into the ring, relayed by this connection's thread,
// when the next epoch's rows arrived on another connection and overtook them.  Flush returns
// only once every earlier message is in the ring; while the node reads nothing it cannot.
TEST_F(FeedServerTest, FlushReturnsOnlyOnceEveryMessageIsInTheRing) {
  StartNode(1 << 16, Duration(5000));
  constexpr uint32_t kMessages = 20;  // 320 KB: past the ring, into the socket's buffers
  uint32_t kind;
  std::vector<uint8_t> payload;
  {
    auto client = Connect();
    ASSERT_NE(client, nullptr);
    for (uint32_t seq = 0; seq < kMessages; ++seq) {
      ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(3, seq, 16 * 1024), Soon()).ok());
    }
    // The node reads nothing: the relay cannot finish, so neither can Flush.
    Status early = client->Flush(Deadline::After(Duration(300)));
    EXPECT_EQ(early.code(), StatusCode::kDeadlineExceeded) << early.ToString();
    EXPECT_TRUE(early.message().find("did not confirm") != std::string::npos) << early.ToString();
    EXPECT_FALSE(client->Write(FeedKind::kEndFeed, {}, Soon()).ok()) << "a timed-out Flush leaves the stream unusable";
    for (uint32_t seq = 0; seq < kMessages; ++seq) ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());
  }
  // A slow node: once Flush returns, every message is in the ring (read, or readable at once).
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::atomic<bool> stop{false};
  std::atomic<uint32_t> read{0};
  std::thread node([&] {
    uint32_t k;
    std::vector<uint8_t> p;
    while (!stop) {
      if (ring_->Read(&k, &p, Deadline::After(Duration(20))).ok()) ++read;
      std::this_thread::sleep_for(Duration(5));
    }
  });
  for (uint32_t seq = 0; seq < kMessages; ++seq) {
    ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(4, seq, 16 * 1024), Soon()).ok());
  }
  Status st = client->Flush(Soon());
  stop = true;
  node.join();
  ASSERT_TRUE(st.ok()) << st.ToString();
  uint32_t in_ring = 0;
  while (ring_->Read(&kind, &payload, Deadline::After(Duration(0))).ok()) ++in_ring;
  EXPECT_EQ(read + in_ring, kMessages) << read.load() << " read before Flush returned";
}

// The node's side of inference: answers each batch with a kResults naming
// (partition, seq) and each partition with kEndResults.  Checks that the
// messages of one partition are contiguous in the node's ring.
void RunNode(shm::Ring* ring, int partitions, std::atomic<int>* interleavings) {
  std::unique_ptr<shm::Ring> results;
  int open_partition = -1;
  int64_t rows = 0;
  uint32_t kind;
  std::vector<uint8_t> payload;
  for (int done = 0; done < partitions;) {
    ASSERT_TRUE(ring->Read(&kind, &payload, Soon()).ok());
    switch (static_cast<FeedKind>(kind)) {
      case FeedKind::kBeginPartition: {
        auto begin = DecodeBeginPartition(payload);
        ASSERT_TRUE(begin.ok()) << begin.status().ToString();
        if (open_partition != -1) ++*interleavings;
        open_partition = static_cast<int>(begin->partition);
        ASSERT_TRUE(begin->wants_results());
        ASSERT_EQ(begin->result_ring.rfind("/" + TestPrefix() + "-results-", 0), 0u) << begin->result_ring;
        auto opened = shm::Ring::Open(begin->result_ring);
        ASSERT_TRUE(opened.ok()) << opened.status().ToString();
        results = opened.MoveValueUnsafe();
        rows = 0;
        break;
      }
      case FeedKind::kBatch: {
        if (static_cast<int>(GetU32(payload, 0)) != open_partition) ++*interleavings;
        std::vector<uint8_t> answer;
        PutU32(&answer, GetU32(payload, 0));
        PutU32(&answer, GetU32(payload, 8));
        ASSERT_TRUE(results->Write(static_cast<uint32_t>(FeedKind::kResults), answer, Soon()).ok());
        ++rows;
        break;
      }
      case FeedKind::kEndPartition: {
        if (static_cast<int>(GetU32(payload, 0)) != open_partition) ++*interleavings;
        std::vector<uint8_t> end(8);
        std::memcpy(end.data(), &rows, 8);
        ASSERT_TRUE(results->Write(static_cast<uint32_t>(FeedKind::kEndResults), end, Soon()).ok());
        results.reset();
        open_partition = -1;
        ++done;
        break;
      }
      default:
        FAIL() << "unexpected kind " << kind;
    }
  }
}

// A remote inference task: for each partition sends Begin, batches, End on
// one thread while another reads the answers, which must come back in order.
void RunInferenceTask(FeedClient* client, std::vector<uint32_t> partitions, uint32_t batches) {
  std::thread reader([&] {
    FeedKind kind;
    std::vector<uint8_t> payload;
    for (uint32_t p : partitions) {
      for (uint32_t seq = 0; seq < batches; ++seq) {
        ASSERT_TRUE(client->Read(&kind, &payload, Soon()).ok());
        ASSERT_EQ(kind, FeedKind::kResults) << Text(payload);
        ASSERT_EQ(GetU32(payload, 0), p);
        ASSERT_EQ(GetU32(payload, 4), seq);
      }
      ASSERT_TRUE(client->Read(&kind, &payload, Soon()).ok());
      ASSERT_EQ(kind, FeedKind::kEndResults);
      int64_t rows;
      std::memcpy(&rows, payload.data(), 8);
      EXPECT_EQ(rows, batches);
    }
  });
  for (uint32_t p : partitions) {
    ASSERT_TRUE(client->Write(FeedKind::kBeginPartition, Begin(p, true), Soon()).ok());
    for (uint32_t seq = 0; seq < batches; ++seq) {
      ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(p, seq, 3000), Soon()).ok());
    }
    ASSERT_TRUE(client->Write(FeedKind::kEndPartition, EndPartition(p, batches), Soon()).ok());
  }
  reader.join();
}

TEST_F(FeedServerTest, InferenceRoundTripThroughAResultRing) {
  StartNode(1 << 16);
  std::atomic<int> interleavings{0};
  std::thread node(RunNode, ring_.get(), 1, &interleavings);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  RunInferenceTask(client.get(), {3}, 5);
  node.join();
  // The client can read the last answer before the pump thread counts it.
  EXPECT_TRUE(WaitUntil([&] { return server_->stats().results_sent == 6u; })) << server_->stats().results_sent;
  client->Close();
  // The result ring is gone once its partition is answered.
  EXPECT_TRUE(WaitUntil([] { return OurShmSegments().size() == 1; })) << OurShmSegments().size();
}

TEST_F(FeedServerTest, ConcurrentInferenceProducersKeepPartitionsContiguous) {
  StartNode(1 << 15);  // small ring: the producers really contend
  std::atomic<int> interleavings{0};
  std::thread node(RunNode, ring_.get(), 6, &interleavings);
  auto a = Connect();
  auto b = Connect();
  ASSERT_TRUE(a && b);
  std::thread ta(RunInferenceTask, a.get(), std::vector<uint32_t>{10, 11, 12}, 40);
  std::thread tb(RunInferenceTask, b.get(), std::vector<uint32_t>{20, 21, 22}, 40);
  ta.join();
  tb.join();
  node.join();
  EXPECT_EQ(interleavings.load(), 0);
}

TEST_F(FeedServerTest, NodeAbortReachesAReadingClientPromptly) {
  StartNode(1 << 16, Duration(30000));  // "promptly" must not mean "at idle_timeout"
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Write(FeedKind::kBeginPartition, Begin(4, true), Soon()).ok());
  ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(4, 0, 100), Soon()).ok());
  uint32_t kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());  // begin
  ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());  // batch
  const auto aborted_at = Clock::now();
  ring_->Abort("node worker:0 failed");
  FeedKind got;
  ASSERT_TRUE(client->Read(&got, &payload, Soon()).ok());
  EXPECT_LT(Clock::now() - aborted_at, Duration(2000));
  EXPECT_EQ(got, FeedKind::kError);
  EXPECT_NE(Text(payload).find("node worker:0 failed"), std::string::npos) << Text(payload);
  Status st = client->Write(FeedKind::kBatch, Batch(4, 1, 100), Soon());
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("node worker:0 failed"), std::string::npos) << st.ToString();
}

TEST_F(FeedServerTest, NodeAbortFailsAnIdleTrainingWriter) {
  StartNode(1 << 16, Duration(30000));
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(5, 0, 100), Soon()).ok());
  ASSERT_TRUE(WaitUntil([&] { return server_->stats().messages_relayed == 1; }));
  const auto aborted_at = Clock::now();
  ring_->Abort("node worker:1 failed");
  // A writer that comes back now and then (the next batch is slow to make)
  // fails on its first write after the server's kError arrives.
  Status st;
  for (uint32_t seq = 1; st.ok() && Clock::now() - aborted_at < Duration(5000); ++seq) {
    std::this_thread::sleep_for(Duration(50));
    st = client->Write(FeedKind::kBatch, Batch(5, seq, 100), Soon());
  }
  EXPECT_LT(Clock::now() - aborted_at, Duration(2000));
  EXPECT_EQ(st.code(), StatusCode::kAborted) << st.ToString();
  EXPECT_NE(st.message().find("node worker:1 failed"), std::string::npos) << st.ToString();
}

TEST_F(FeedServerTest, NodeAbortUnblocksAWriterStuckOnAFullRing) {
  StartNode(1 << 14, Duration(10000));
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::atomic<bool> done{false};
  Status last;
  Clock::time_point failed_at;
  std::thread writer([&] {
    for (uint32_t seq = 0;; ++seq) {
      Status st = client->Write(FeedKind::kBatch, Batch(6, seq, 4000), Soon());
      if (!st.ok()) {
        failed_at = Clock::now();
        last = st;
        break;
      }
    }
    done = true;
  });
  ASSERT_TRUE(WaitUntil([&] { return server_->stats().messages_relayed >= 3; }));
  std::this_thread::sleep_for(Duration(300));  // let the writer block on the full ring and sockets
  EXPECT_FALSE(done.load());
  const auto aborted_at = Clock::now();
  ring_->Abort("node worker:2 failed");
  writer.join();
  EXPECT_LT(failed_at - aborted_at, Duration(2000));
  EXPECT_EQ(last.code(), StatusCode::kAborted) << last.ToString();
  EXPECT_NE(last.message().find("node worker:2 failed"), std::string::npos) << last.ToString();
}

TEST_F(FeedServerTest, NodeTerminateCancelsTheWriterQuietly) {
  StartNode(1 << 14);
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  std::thread writer([&] {
    Status st;
    for (uint32_t seq = 0; st.ok(); ++seq) st = client->Write(FeedKind::kBatch, Batch(6, seq, 4000), Soon());
    EXPECT_EQ(st.code(), StatusCode::kCancelled) << st.ToString();
    EXPECT_NE(st.message().find("terminated"), std::string::npos) << st.ToString();
  });
  ASSERT_TRUE(WaitUntil([&] { return server_->stats().messages_relayed >= 2; }));
  ring_->Terminate();
  writer.join();
}

TEST_F(FeedServerTest, ProtocolErrorsComeBackAsKError) {
  StartNode(1 << 16);
  struct Case {
    FeedKind kind;
    std::vector<uint8_t> payload;
    std::string expect;
  };
  std::vector<uint8_t> named = Begin(1, true);
  BeginPartition with_name;
  with_name.flags = kBeginWantsResults;
  with_name.result_ring = "/elsewhere";
  const std::vector<Case> cases = {
      {FeedKind::kResults, {}, "not one a producer sends"},
      {FeedKind::kBeginPartition, {1, 2, 3}, "malformed kBeginPartition"},
      {FeedKind::kBeginPartition, EncodeBeginPartition(with_name), "must be empty"},
      {FeedKind::kEndPartition, {1}, "malformed kEndPartition"},
  };
  for (const Case& c : cases) {
    auto client = Connect();
    ASSERT_NE(client, nullptr);
    ASSERT_TRUE(client->Write(c.kind, c.payload, Soon()).ok());
    FeedKind kind;
    std::vector<uint8_t> payload;
    ASSERT_TRUE(client->Read(&kind, &payload, Soon()).ok());
    EXPECT_EQ(kind, FeedKind::kError);
    EXPECT_NE(Text(payload).find(c.expect), std::string::npos) << Text(payload);
    EXPECT_FALSE(client->Read(&kind, &payload, Soon()).ok());  // then the server hangs up
  }
  // A second kBeginPartition before kEndPartition, on one connection.
  auto client = Connect();
  ASSERT_TRUE(client->Write(FeedKind::kBeginPartition, Begin(7, false), Soon()).ok());
  ASSERT_TRUE(client->Write(FeedKind::kBeginPartition, Begin(8, false), Soon()).ok());
  FeedKind kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(client->Read(&kind, &payload, Soon()).ok());
  EXPECT_NE(Text(payload).find("send kEndPartition first"), std::string::npos) << Text(payload);
  // The session lock went with the connection: a new producer gets it.
  client.reset();
  auto next = Connect();
  ASSERT_TRUE(next->Write(FeedKind::kBeginPartition, Begin(9, false), Soon()).ok());
  uint32_t k;
  for (int seen_nine = 0; !seen_nine;) {
    ASSERT_TRUE(ring_->Read(&k, &payload, Soon()).ok());
    seen_nine = k == static_cast<uint32_t>(FeedKind::kBeginPartition) && GetU32(payload, 0) == 9;
  }
}

TEST_F(FeedServerTest, BadPeersAreRejectedAndOthersStillServed) {
  ember::testing::WarningCapture log;
  StartNode(1 << 16);
  const int port = server_->port();
  // Wrong secret.
  auto wrong = FeedClient::Connect("127.0.0.1", port, "not-the-job-secret-xxxxxxxx", Duration(2000));
  ASSERT_FALSE(wrong.ok());
  EXPECT_NE(wrong.status().message().find("secret"), std::string::npos) << wrong.status().ToString();
  // Garbage bytes instead of the handshake.
  auto garbage = tcp::Connect("127.0.0.1", port, Soon());
  ASSERT_TRUE(garbage.ok());
  std::string junk(200, '\x5a');
  ASSERT_TRUE(tcp::WriteAll(garbage->get(), junk.data(), junk.size(), Soon(), "junk").ok());
  // A silent peer, held open past the handshake timeout.
  auto silent = tcp::Connect("127.0.0.1", port, Soon());
  ASSERT_TRUE(silent.ok());
  // Meanwhile a real producer is served.
  auto client = Connect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(1, 0, 10), Soon()).ok());
  uint32_t kind;
  std::vector<uint8_t> payload;
  ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(payload, Batch(1, 0, 10));
  EXPECT_TRUE(WaitUntil([&] { return server_->stats().connections_rejected == 3; }))
      << server_->stats().connections_rejected;
  EXPECT_EQ(log.Count("feed server: rejected unauthenticated connection from 127.0.0.1:"), 3);
  EXPECT_EQ(server_->stats().messages_relayed, 1u);  // nothing from the bad peers
  ASSERT_TRUE(client->Write(FeedKind::kBatch, Batch(1, 1, 10), Soon()).ok());
  ASSERT_TRUE(ring_->Read(&kind, &payload, Soon()).ok());
  EXPECT_EQ(payload, Batch(1, 1, 10));
}

TEST_F(FeedServerTest, ConnectErrorsNameTheServer) {
  StartNode(1 << 16);
  const int port = server_->port();
  server_->Close();
  auto c = FeedClient::Connect("127.0.0.1", port, kSecret, Duration(1000));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(c.status().message().find("127.0.0.1:" + std::to_string(port)), std::string::npos)
      << c.status().ToString();
}

TEST_F(FeedServerTest, CloseIsPromptWhileConnectionsBlock) {
  StartNode(1 << 14, Duration(60000));
  // One producer holds the session and is stuck on the full ring; a second
  // waits for the session; the node reads nothing.
  auto holder = Connect();
  auto waiter = Connect();
  ASSERT_TRUE(holder && waiter);
  std::atomic<bool> holder_done{false};
  std::thread t([&] {
    (void)holder->Write(FeedKind::kBeginPartition, Begin(1, true), Soon());
    for (uint32_t seq = 0; seq < 100; ++seq) {
      if (!holder->Write(FeedKind::kBatch, Batch(1, seq, 4000), Soon()).ok()) break;
    }
    holder_done = true;
  });
  ASSERT_TRUE(WaitUntil([&] { return server_->stats().messages_relayed >= 2; }));
  ASSERT_TRUE(waiter->Write(FeedKind::kBeginPartition, Begin(2, true), Soon()).ok());
  std::this_thread::sleep_for(Duration(200));
  const auto start = Clock::now();
  server_->Close();
  EXPECT_LT(Clock::now() - start, Duration(1500));
  FeedKind kind;
  std::vector<uint8_t> payload;
  EXPECT_FALSE(waiter->Read(&kind, &payload, Soon()).ok() && kind != FeedKind::kError);
  holder->Close();  // wakes the writer if it is still blocked in a send
  t.join();
}

}  // namespace
}  // namespace ember::feed
