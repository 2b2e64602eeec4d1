// Round trips and corruption of every feed message and of the endpoint.
#include "feed/codec.h"

#include <gtest/gtest.h>

namespace ember::feed {
namespace {

std::vector<uint8_t> Bytes(std::string_view s) { return {s.begin(), s.end()}; }

TEST(FeedCodec, BatchRoundTripKeepsTheIpcAligned) {
  const std::vector<uint8_t> ipc = Bytes("arrow-ipc-bytes");
  std::vector<uint8_t> msg = EncodeBatch({3, 7, 2, 42}, ipc);
  ASSERT_EQ(msg.size(), kBatchHeaderBytes + ipc.size());
  EXPECT_EQ(kBatchHeaderBytes % 8, 0u);
  auto h = DecodeBatch(msg);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_EQ(h->partition, 3u);
  EXPECT_EQ(h->epoch, 7u);
  EXPECT_EQ(h->attempt, 2u);
  EXPECT_EQ(h->rows, 42);
  EXPECT_EQ(std::vector<uint8_t>(msg.begin() + kBatchHeaderBytes, msg.end()), ipc);
}

TEST(FeedCodec, BatchCorruption) {
  std::vector<uint8_t> msg = EncodeBatch({0, 0, 0, 5}, Bytes("x"));
  auto truncated = DecodeBatch(std::span<const uint8_t>(msg).first(20));
  ASSERT_EQ(truncated.status().code(), StatusCode::kCorruption);
  EXPECT_NE(truncated.status().message().find("kBatch"), std::string::npos);
  EXPECT_NE(truncated.status().message().find("offset 16"), std::string::npos) << truncated.status().message();
  auto no_ipc = DecodeBatch(std::span<const uint8_t>(msg).first(kBatchHeaderBytes));
  EXPECT_EQ(no_ipc.status().code(), StatusCode::kCorruption);
  std::vector<uint8_t> negative = EncodeBatch({0, 0, 0, -1}, Bytes("x"));
  auto neg = DecodeBatch(negative);
  ASSERT_EQ(neg.status().code(), StatusCode::kCorruption);
  EXPECT_NE(neg.status().message().find("rows"), std::string::npos);
}

TEST(FeedCodec, EndPartitionRoundTripAndCorruption) {
  auto m = DecodeEndPartition(EncodeEndPartition({4, 1, {5, 4, 0}}));
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->partition, 4u);
  EXPECT_EQ(m->node_rows, (std::vector<int64_t>{5, 4, 0}));
  std::vector<uint8_t> bad = EncodeEndPartition({4, 1, {5, 4}});
  bad.pop_back();
  EXPECT_NE(DecodeEndPartition(bad).status().message().find("node count 2"), std::string::npos);
  EXPECT_EQ(DecodeEndPartition(EncodeEndPartition({0, 0, {}})).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeEndPartition(EncodeEndPartition({0, 0, {1, -2}})).status().code(), StatusCode::kCorruption);
  // A huge count is refused before allocating.
  std::vector<uint8_t> huge = EncodeEndPartition({0, 0, {1}});
  huge[8] = huge[9] = huge[10] = huge[11] = 0xff;
  EXPECT_EQ(DecodeEndPartition(huge).status().code(), StatusCode::kCorruption);
}

TEST(FeedCodec, EndEpochEndFeedAndHello) {
  auto e = DecodeEndEpoch(EncodeEndEpoch({9, 12}));
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->epoch, 9u);
  EXPECT_EQ(e->partitions, 12u);
  std::vector<uint8_t> longer = EncodeEndEpoch({9, 12});
  longer.push_back(0);
  EXPECT_EQ(DecodeEndEpoch(longer).status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(DecodeEndFeed({}).ok());
  EXPECT_EQ(DecodeEndFeed(Bytes("x")).code(), StatusCode::kCorruption);
  auto h = DecodeHello(EncodeHello({Duration(1234)}));
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->idle_timeout, Duration(1234));
  EXPECT_EQ(DecodeHello(EncodeHello({Duration(0)})).status().code(), StatusCode::kCorruption);
  std::vector<uint8_t> v2 = EncodeHello({Duration(5)});
  v2[0] = 2;
  EXPECT_NE(DecodeHello(v2).status().message().find("version 2"), std::string::npos);
}

TEST(FeedCodec, BeginPartitionCarriesTheInferenceSentinel) {
  BeginPartition b;
  b.partition = 6;
  b.epoch = kInferenceEpoch;
  b.flags = kBeginWantsResults;
  b.result_ring = "/ember-r6";
  auto m = DecodeBeginPartition(EncodeBeginPartition(b));
  ASSERT_TRUE(m.ok());
  EXPECT_TRUE(m->wants_results());
  EXPECT_EQ(m->epoch, kInferenceEpoch);
  EXPECT_EQ(m->result_ring, "/ember-r6");
  std::vector<uint8_t> cut = EncodeBeginPartition(b);
  cut.resize(cut.size() - 2);
  EXPECT_NE(DecodeBeginPartition(cut).status().message().find("kBeginPartition"), std::string::npos);
}

TEST(FeedCodec, ResultsEndResultsAndError) {
  std::vector<uint8_t> r = EncodeResults(3, Bytes("ipc"));
  auto rows = DecodeResults(r);
  ASSERT_TRUE(rows.ok());
  EXPECT_EQ(*rows, 3);
  EXPECT_EQ(DecodeResults(std::span<const uint8_t>(r).first(5)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeResults(EncodeResults(2, {})).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(*DecodeEndResults(EncodeEndResults(77)), 77);
  EXPECT_EQ(DecodeEndResults(EncodeEndResults(-1)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(*DecodeError(EncodeError("why")), "why");
  EXPECT_EQ(ValidateMessage(99, {}).code(), StatusCode::kCorruption);
}

TEST(FeedCodec, EndpointRoundTripAndCorruption) {
  NodeEndpoint e{3, "worker:1", "/job-3", "10.0.0.5", 40123, 1 << 20};
  const std::string bytes = e.Encode();
  auto back = NodeEndpoint::Decode(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, e);
  EXPECT_EQ(e.Describe(), "worker:1 (10.0.0.5)");
  for (size_t n = 0; n < bytes.size(); ++n) {
    EXPECT_EQ(NodeEndpoint::Decode(std::string_view(bytes).substr(0, n)).status().code(), StatusCode::kCorruption);
  }
  std::string v2 = bytes;
  v2[0] = 2;
  EXPECT_NE(NodeEndpoint::Decode(v2).status().message().find("version 2"), std::string::npos);
}

}  // namespace
}  // namespace ember::feed
