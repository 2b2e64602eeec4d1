// The fixture of the feed's gtests (producer_consumer_test.cc,
// consumer_terminate_test.cc): nodes as their launchers set them up (a ring
// and a FeedServer), producers over shm or TCP, consumers.  A stand-in for
// Arrow: a batch's "IPC stream" is the i64 value of its first row; row i of
// it is that value + i.  A test file instantiates its own suite over Via.
#pragma once

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "ember/feed.h"
#include "feed/feed_server.h"
#include "transport/shm/ring.h"

namespace ember::feed {

using Clock = std::chrono::steady_clock;
inline const std::string kSecret = "feed-test-secret-0123456789";

inline std::string UniqueName(const std::string& what) {
  static std::atomic<int> counter{0};
  return "/ember-pctest-" + std::to_string(getpid()) + "-" + what + std::to_string(counter++);
}

inline std::vector<uint8_t> Ipc(int64_t first) {
  std::vector<uint8_t> v(8);
  std::memcpy(v.data(), &first, 8);
  return v;
}

inline int64_t FirstValue(std::span<const uint8_t> ipc) {
  int64_t v = 0;
  std::memcpy(&v, ipc.data(), 8);
  return v;
}

inline std::vector<int64_t> Values(const std::vector<RowRange>& ranges) {
  std::vector<int64_t> out;
  for (const RowRange& r : ranges) {
    for (int64_t i = 0; i < r.rows; ++i) out.push_back(FirstValue(r.ipc()) + r.offset + i);
  }
  return out;
}

inline int64_t Count(const std::vector<RowRange>& ranges) {
  int64_t n = 0;
  for (const RowRange& r : ranges) n += r.rows;
  return n;
}

// A node as its launcher sets it up: the ring, and (tcp) the feed server.
struct TestNode {
  std::unique_ptr<shm::Ring> ring;
  std::unique_ptr<FeedServer> server;
  NodeEndpoint endpoint;
};

enum class Via { kShm, kTcp };

class FeedTest : public ::testing::TestWithParam<Via> {
 protected:
  void StartNodes(int n, size_t capacity = 1 << 20, Duration server_idle = Duration(600000)) {
    for (int k = 0; k < n; ++k) {
      auto node = std::make_unique<TestNode>();
      auto ring = shm::Ring::Create(UniqueName("node"), capacity);
      ASSERT_TRUE(ring.ok()) << ring.status().ToString();
      node->ring = ring.MoveValueUnsafe();
      FeedServerOptions o;
      o.bind_host = "127.0.0.1";
      o.secret = kSecret;
      o.ring_name = node->ring->name();
      o.result_ring_prefix = ResultRingPrefix(node->ring->name());
      o.result_ring_capacity = 1 << 16;
      o.idle_timeout = server_idle;
      auto server = FeedServer::Start(o);
      ASSERT_TRUE(server.ok()) << server.status().ToString();
      node->server = server.MoveValueUnsafe();
      node->endpoint = NodeEndpoint{k, "worker:" + std::to_string(k), node->ring->name(), "127.0.0.1",
                                    node->server->port(), capacity};
      nodes_.push_back(std::move(node));
    }
  }

  void TearDown() override {
    for (auto& n : nodes_) n->server->Close();
    nodes_.clear();
  }

  FeedOptions Options() const {
    FeedOptions o;
    o.secret = kSecret;
    o.transport = GetParam() == Via::kShm ? Transport::kAuto : Transport::kTcp;  // auto: the ring is here
    o.connect_timeout = Duration(5000);
    o.idle_timeout = Duration(10000);
    o.result_ring_bytes = 1 << 16;
    return o;
  }

  std::vector<NodeEndpoint> Endpoints() const {
    std::vector<NodeEndpoint> out;
    for (auto& n : nodes_) out.push_back(n->endpoint);
    return out;
  }

  std::unique_ptr<Consumer> OpenConsumer(int k, bool train_mode = true, Duration read_timeout = Duration(10000)) {
    ConsumerOptions o;
    o.node = "worker:" + std::to_string(k);
    o.train_mode = train_mode;
    o.read_timeout = read_timeout;
    auto c = Consumer::Open(nodes_[k]->ring->name(), o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.MoveValueUnsafe();
  }

  // Feeds rows [start, start + rows) as partition `p` in chunks; returns sent.
  std::vector<int64_t> FeedPartition(uint32_t p, uint32_t epoch, int64_t start, int64_t rows, int64_t chunk = 7,
                                     uint32_t attempt = 0) {
    auto producer = Producer::Open(Endpoints(), p, epoch, attempt, Options());
    EXPECT_TRUE(producer.ok()) << producer.status().ToString();
    if (!producer.ok()) return {};
    Producer& prod = **producer;
    for (int64_t at = 0; at < rows; at += chunk) {
      const int64_t n = std::min(chunk, rows - at);
      int64_t offset = 0;
      std::vector<int64_t> split = prod.Split(n);
      for (size_t k = 0; k < split.size(); ++k) {
        if (split[k] == 0) continue;
        EXPECT_TRUE(prod.SendBatch(k, Ipc(start + at + offset), split[k]).ok());
        offset += split[k];
      }
    }
    EXPECT_TRUE(prod.EndPartition().ok());
    return prod.sent();
  }

  void EndEpochAll(uint32_t epoch, uint32_t partitions) {
    auto r = EndEpoch(Endpoints(), epoch, partitions, Options());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  void EndFeedAll() {
    auto r = EndFeed(Endpoints(), Options());
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }

  std::vector<std::unique_ptr<TestNode>> nodes_;
};

// Consumes one epoch in batches of `batch`; returns the batches' values.
inline std::vector<std::vector<int64_t>> ConsumeEpoch(Consumer& c, int64_t batch, bool drop_remainder = true) {
  std::vector<std::vector<int64_t>> out;
  auto epoch = c.BeginEpoch();
  EXPECT_TRUE(epoch.ok()) << epoch.status().ToString();
  if (!epoch.ok() || !*epoch) return out;
  for (;;) {
    auto b = c.NextEpochBatch(batch, drop_remainder);
    EXPECT_TRUE(b.ok()) << b.status().ToString();
    if (!b.ok() || b->empty()) return out;
    out.push_back(Values(*b));
  }
}

}  // namespace ember::feed
