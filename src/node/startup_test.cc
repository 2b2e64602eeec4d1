#include "node/startup.h"

#include <gtest/gtest.h>

#include "common/codec.h"

namespace ember::node {
namespace {

NodeContext FullContext() {
  NodeContext c;
  c.job_id = "ember-0123456789ab";
  c.executor_id = 3;
  c.job_name = "worker";
  c.task_index = 1;
  c.cluster_spec = {{"chief", {"h0:1000"}}, {"ps", {"h1:1001"}}, {"worker", {"h2:1002", "h3:1003"}}};
  c.bind_host = "0.0.0.0";
  c.coordinator_host = "driver.example";
  c.coordinator_port = 40123;
  c.secret = std::string("\x00\x01secret\xff", 9);
  c.connect_timeout = Duration(12500);
  c.input_mode = InputMode::kSpark;
  c.feed_ring = "/ember-0123456789ab-3";
  c.default_fs = "hdfs://nn:8020";
  c.hdfs_http_address = "nn:9870";
  c.working_dir = "/home/me/job";
  c.log_dir = "hdfs://nn:8020/logs";
  c.traceback_path = "/tmp/ember-x/traceback.txt";
  c.gpus = {"7", "GPU-5d0e2b9c"};
  c.payload = std::string("\x80\x05pickled\x00", 10);
  return c;
}

TEST(NodeStartupTest, RoundTripsEveryField) {
  const NodeContext c = FullContext();
  auto bytes = EncodeStartup(c);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  EXPECT_EQ(bytes->substr(0, 4), "EMBN");
  auto back = DecodeStartup(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, c);
  EXPECT_EQ(back->num_workers(), 3);
  EXPECT_EQ(back->training_rank(), 2);  // after the chief and worker 0
}

TEST(NodeStartupTest, RoundTripsAnEmptyContext) {
  auto bytes = EncodeStartup(NodeContext{});
  ASSERT_TRUE(bytes.ok());
  auto back = DecodeStartup(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, NodeContext{});
}

TEST(NodeStartupTest, EveryTruncationIsCorruption) {
  auto bytes = EncodeStartup(FullContext());
  ASSERT_TRUE(bytes.ok());
  for (size_t n = 0; n < bytes->size(); ++n) {
    auto r = DecodeStartup(std::string_view(*bytes).substr(0, n));
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes decoded";
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << r.status().ToString();
  }
}

TEST(NodeStartupTest, TrailingBytesAreCorruption) {
  auto bytes = EncodeStartup(FullContext());
  ASSERT_TRUE(bytes.ok());
  auto r = DecodeStartup(*bytes + "x");
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("trailing"), std::string::npos) << r.status().message();
}

TEST(NodeStartupTest, AnotherVersionIsNamed) {
  auto bytes = EncodeStartup(FullContext());
  ASSERT_TRUE(bytes.ok());
  std::string other = *bytes;
  other[4] = static_cast<char>(kStartupVersion + 1);  // u16 version follows the 4-byte magic
  auto r = DecodeStartup(other);
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  const std::string theirs = "version " + std::to_string(kStartupVersion + 1);
  const std::string ours = "version " + std::to_string(kStartupVersion);
  EXPECT_NE(r.status().message().find(theirs), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find(ours), std::string::npos) << r.status().message();
}

TEST(NodeStartupTest, WrongMagicIsCorruption) {
  auto r = DecodeStartup("\x80\x04\x95pickle");  // what the old launcher sent
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("Cluster.run"), std::string::npos);
}

// Hand-built message with chosen values, to check the decoder's range checks.
std::string Message(int32_t executor_id, int32_t port, int64_t timeout_ms, uint8_t mode,
                    std::vector<std::string> roles = {}, int32_t training_rank = -1) {
  codec::Writer w;
  w.PutRaw("EMBN");
  w.PutU16(kStartupVersion);
  w.PutString("job");
  w.PutI32(executor_id);
  w.PutString("worker");
  w.PutI32(0);
  w.PutU32(static_cast<uint32_t>(roles.size()));
  for (const auto& role : roles) {
    w.PutString(role);
    w.PutU32(0);
  }
  w.PutI32(training_rank);
  w.PutI32(0);  // training_size: no addresses in the spec
  w.PutString("");  // bind_host
  w.PutString("host");
  w.PutI32(port);
  w.PutString("secret");
  w.PutI64(timeout_ms);
  w.PutU8(mode);
  for (int i = 0; i < 6; ++i) w.PutString("");  // feed_ring .. traceback_path
  w.PutU32(0);                                   // gpus
  w.PutString("");                               // payload
  return w.Release();
}

TEST(NodeStartupTest, OutOfRangeValuesAreCorruption) {
  ASSERT_TRUE(DecodeStartup(Message(0, 1, 0, 1, {"ps", "worker"})).ok());
  EXPECT_EQ(DecodeStartup(Message(-1, 1, 0, 0)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeStartup(Message(0, 70000, 0, 0)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeStartup(Message(0, 1, -5, 0)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeStartup(Message(0, 1, 0, 2)).status().code(), StatusCode::kCorruption);
  // Roles must be sorted and unique, so that a message has one encoding.
  EXPECT_EQ(DecodeStartup(Message(0, 1, 0, 0, {"worker", "ps"})).status().code(),
            StatusCode::kCorruption);
  EXPECT_EQ(DecodeStartup(Message(0, 1, 0, 0, {"ps", "ps"})).status().code(),
            StatusCode::kCorruption);
}

TEST(NodeStartupTest, ATrainingRankThatDisagreesWithTheSpecIsCorruption) {
  // worker:0 of a spec that lists no worker address has no training rank.
  auto r = DecodeStartup(Message(0, 1, 0, 0, {"worker"}, /*training_rank=*/0));
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("training_rank 0"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("rank -1 of 0"), std::string::npos) << r.status().message();
}

TEST(NodeStartupTest, TrainingRankAndSizeAreDerivedFromTheSpec) {
  NodeContext c = FullContext();
  c.job_name = "ps";
  c.task_index = 0;
  auto bytes = EncodeStartup(c);
  ASSERT_TRUE(bytes.ok()) << bytes.status().ToString();
  auto back = DecodeStartup(*bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->training_rank(), std::nullopt);
  EXPECT_EQ(back->num_workers(), 3);
}

TEST(NodeStartupTest, AHostileGpuCountFailsNamingTheField) {
  NodeContext c = FullContext();
  c.gpus.clear();
  auto bytes = EncodeStartup(c);
  ASSERT_TRUE(bytes.ok());
  // The gpus count sits before the payload (a 4-byte length and its bytes) at the end.
  std::string m = *bytes;
  const size_t at = m.size() - 4 - c.payload.size() - 4;
  m.replace(at, 4, std::string("\xff\xff\xff\x7f", 4));
  auto r = DecodeStartup(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("gpus entry"), std::string::npos) << r.status().ToString();
}

TEST(NodeStartupTest, HostileCountsFailWithoutAllocating) {
  codec::Writer w;
  w.PutRaw("EMBN");
  w.PutU16(kStartupVersion);
  w.PutString("job");
  w.PutI32(0);
  w.PutString("worker");
  w.PutI32(0);
  w.PutU32(0xffffffffu);  // 4 billion roles in a few bytes
  auto r = DecodeStartup(w.data());
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
}

TEST(NodeStartupTest, EncodeRejectsUnrepresentableValues) {
  NodeContext c = FullContext();
  c.coordinator_port = 65536;
  EXPECT_EQ(EncodeStartup(c).status().code(), StatusCode::kInvalidArgument);
  c = FullContext();
  c.executor_id = -1;
  EXPECT_EQ(EncodeStartup(c).status().code(), StatusCode::kInvalidArgument);
  c = FullContext();
  c.connect_timeout = Duration(-1);
  EXPECT_EQ(EncodeStartup(c).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ember::node
