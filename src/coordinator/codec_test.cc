// The coordinator codec: every message kind's bytes (pinned to docs/wire.md),
// round trips, and Corruption naming the kind for truncated and over-long
// payloads.
#include "coordinator/codec.h"

#include <gtest/gtest.h>

#include <cmath>

#include "common/codec.h"
#include "coordinator/kv_keys.h"

namespace ember::coord {
namespace {

bool Contains(const std::string& s, std::string_view part) { return s.find(part) != std::string::npos; }

// Every strict prefix of `bytes` and `bytes` plus one byte fail to decode,
// with Corruption naming `what` ("malformed KvSet message").
template <class Decode>
void ExpectCutsAndExtrasRejected(const std::string& bytes, Decode decode, std::string_view what,
                                 bool check_extra = true) {
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto back = decode(std::string_view(bytes).substr(0, cut));
    ASSERT_FALSE(back.ok()) << what << " cut at " << cut;
    EXPECT_EQ(back.status().code(), StatusCode::kCorruption) << what << " cut at " << cut;
    EXPECT_TRUE(Contains(back.status().message(), what)) << back.status().message();
  }
  if (!check_extra) return;
  auto longer = decode(bytes + '\x01');
  ASSERT_FALSE(longer.ok()) << what << " with a trailing byte";
  EXPECT_EQ(longer.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(longer.status().message(), what)) << longer.status().message();
  EXPECT_TRUE(Contains(longer.status().message(), "trailing")) << longer.status().message();
}

// The layout written by hand, as docs/wire.md gives it: the codec must produce exactly this.
TEST(CoordinatorCodec, RegisterBytesAndRoundTrip) {
  RegisterRequest m{7, {3, "host-a", 2222, 4242}, Duration(60000)};
  codec::Writer w;
  w.PutU32(7);
  w.PutI32(3);
  w.PutString("host-a");
  w.PutI32(2222);
  w.PutI64(4242);
  w.PutI64(60000);
  const std::string bytes = Encode(m);
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeRegister(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->request_id, 7u);
  EXPECT_EQ(back->self.executor_id, 3);
  EXPECT_EQ(back->self.host, "host-a");
  EXPECT_EQ(back->self.port, 2222);
  EXPECT_EQ(back->self.pid, 4242);
  EXPECT_EQ(back->timeout, Duration(60000));
  ExpectCutsAndExtrasRejected(bytes, DecodeRegister, "malformed Register message");
}

TEST(CoordinatorCodec, AttachBytesAndRoundTrip) {
  codec::Writer w;
  w.PutU32(2);
  w.PutI32(-1);
  const std::string bytes = Encode(AttachRequest{2, -1});
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeAttach(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->request_id, 2u);
  EXPECT_EQ(back->executor_id, -1);
  ExpectCutsAndExtrasRejected(bytes, DecodeAttach, "malformed Attach message");
}

TEST(CoordinatorCodec, BarrierBytesAndRoundTrip) {
  codec::Writer w;
  w.PutU32(9);
  w.PutString("epoch-1");
  w.PutI64(-5);  // negative on the wire; the server clamps
  const std::string bytes = Encode(BarrierRequest{9, "epoch-1", Duration(-5)});
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeBarrier(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->name, "epoch-1");
  EXPECT_EQ(back->timeout, Duration(-5));
  ExpectCutsAndExtrasRejected(bytes, DecodeBarrier, "malformed Barrier message");
}

TEST(CoordinatorCodec, KvSetBytesAndRoundTrip) {
  const std::string value("\x00\xff" "binary", 8);
  codec::Writer w;
  w.PutU32(11);
  w.PutString("ember/feed/0");
  w.PutString(value);
  const std::string bytes = Encode(KvSetRequest{11, "ember/feed/0", value});
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeKvSet(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->key, "ember/feed/0");
  EXPECT_EQ(back->value, value);
  ExpectCutsAndExtrasRejected(bytes, DecodeKvSet, "malformed KvSet message");
}

TEST(CoordinatorCodec, KvGetBytesAndRoundTrip) {
  codec::Writer w;
  w.PutU32(12);
  w.PutString("k");
  w.PutI64(1500);
  const std::string bytes = Encode(KvGetRequest{12, "k", Duration(1500)});
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeKvGet(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->key, "k");
  EXPECT_EQ(back->timeout, Duration(1500));
  ExpectCutsAndExtrasRejected(bytes, DecodeKvGet, "malformed KvGet message");
}

TEST(CoordinatorCodec, LogBytesAndRoundTrip) {
  codec::Writer w;
  w.PutU32(0);
  w.PutString("stderr");
  w.PutString("Traceback (most recent call last):");
  const std::string bytes = Encode(LogMessage{0, "stderr", "Traceback (most recent call last):"});
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeLog(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->stream, "stderr");
  EXPECT_EQ(back->line, "Traceback (most recent call last):");
  ExpectCutsAndExtrasRejected(bytes, DecodeLog, "malformed Log message");
}

TEST(CoordinatorCodec, ReportBytesAndRoundTrip) {
  const std::map<std::string, double> metrics{{"step", 10}, {"loss", 0.25}, {"nan", NAN}};
  codec::Writer w;
  w.PutU32(0);
  w.PutMap(metrics);
  const std::string bytes = Encode(ReportMessage{0, metrics});
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeReport(bytes);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->metrics.size(), 3u);
  EXPECT_EQ(back->metrics.at("loss"), 0.25);
  EXPECT_TRUE(std::isnan(back->metrics.at("nan")));
  ExpectCutsAndExtrasRejected(bytes, DecodeReport, "malformed Report message");
  // A count the payload cannot hold is refused before allocating.
  std::string huge = bytes;
  huge[4] = huge[5] = huge[6] = huge[7] = '\xff';
  EXPECT_EQ(DecodeReport(huge).status().code(), StatusCode::kCorruption);
}

TEST(CoordinatorCodec, HeartbeatDoneAndFail) {
  EXPECT_EQ(Encode(HeartbeatMessage{}), std::string(4, '\0'));
  ASSERT_TRUE(DecodeHeartbeat(std::string(4, '\0')).ok());
  ExpectCutsAndExtrasRejected(Encode(HeartbeatMessage{}), DecodeHeartbeat, "malformed Heartbeat message");

  codec::Writer done;
  done.PutU32(5);
  EXPECT_EQ(Encode(DoneRequest{5}), done.data());
  auto d = DecodeDone(done.data());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->request_id, 5u);
  ExpectCutsAndExtrasRejected(done.data(), DecodeDone, "malformed Done message");

  codec::Writer fail;
  fail.PutU32(6);
  fail.PutString("boom");
  EXPECT_EQ(Encode(FailRequest{6, "boom"}), fail.data());
  auto f = DecodeFail(fail.data());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->error, "boom");
  ExpectCutsAndExtrasRejected(fail.data(), DecodeFail, "malformed Fail message");
}

TEST(CoordinatorCodec, ReplyBytesAndRoundTrip) {
  codec::Writer w;
  w.PutU32(3);
  w.PutU8(static_cast<uint8_t>(StatusCode::kDeadlineExceeded));
  w.PutString("too slow");
  const std::string bytes = Encode(Reply{3, Status::DeadlineExceeded("too slow"), ""});
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeReply(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->request_id, 3u);
  EXPECT_EQ(back->status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(back->status.message(), "too slow");
  EXPECT_TRUE(back->body.empty());
  // The body is the rest of the payload, so only cuts into the header are errors.
  const std::string with_body = Encode(Reply{4, Status::OK(), EncodeKvGetReply("v")});
  auto ok = DecodeReply(with_body);
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(ok->status.ok());
  EXPECT_EQ(ok->body, EncodeKvGetReply("v"));
  ExpectCutsAndExtrasRejected(bytes, DecodeReply, "malformed Reply message", /*check_extra=*/false);
  std::string unknown = bytes;
  unknown[4] = static_cast<char>(200);
  auto bad = DecodeReply(unknown);
  ASSERT_EQ(bad.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(bad.status().message(), "malformed Reply message: status code 200 at offset 4"))
      << bad.status().message();
}

TEST(CoordinatorCodec, AbortAndStopPushes) {
  codec::Writer w;
  w.PutU32(0);
  w.PutString("node worker:1 failed");
  EXPECT_EQ(Encode(AbortPush{0, "node worker:1 failed"}), w.data());
  EXPECT_EQ(Encode(StopPush{0, "node worker:1 failed"}), w.data());  // one layout, two kinds
  auto a = DecodeAbort(w.data());
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->reason, "node worker:1 failed");
  auto s = DecodeStop(w.data());
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->reason, "node worker:1 failed");
  ExpectCutsAndExtrasRejected(w.data(), DecodeAbort, "malformed Abort message");
  ExpectCutsAndExtrasRejected(w.data(), DecodeStop, "malformed Stop message");
}

TEST(CoordinatorCodec, RelayMessagesBytesAndRoundTrip) {
  codec::Writer control;
  control.PutU32(0);
  control.PutU16(1);
  EXPECT_EQ(Encode(RelayControlMessage{}), control.data());  // the version defaults to kRelayVersion
  auto c = DecodeRelayControl(control.data());
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->version, kRelayVersion);
  EXPECT_EQ(Encode(*c), control.data());
  ExpectCutsAndExtrasRejected(control.data(), DecodeRelayControl, "malformed RelayControl message");

  codec::Writer data;
  data.PutU32(0);
  data.PutI64(int64_t{0x0102030405060708});
  EXPECT_EQ(Encode(RelayDataMessage{0, 0x0102030405060708}), data.data());
  auto d = DecodeRelayData(data.data());
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->tunnel_id, 0x0102030405060708u);
  ExpectCutsAndExtrasRejected(data.data(), DecodeRelayData, "malformed RelayData message");

  // RelayOpen has RelayData's layout; u64 ids keep their top bit.
  const RelayOpenPush open{0, ~uint64_t{0} - 1};
  auto o = DecodeRelayOpen(Encode(open));
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(o->tunnel_id, open.tunnel_id);
  EXPECT_EQ(Encode(RelayOpenPush{0, 7}), Encode(RelayDataMessage{0, 7}));
  ExpectCutsAndExtrasRejected(Encode(open), DecodeRelayOpen, "malformed RelayOpen message");
}

Registration SampleRegistration() {
  Registration reg;
  reg.role = {"chief", 0};
  reg.cluster_spec_json = "{\"chief\":[\"h:5\"],\"worker\":[\"g:6\"]}";
  reg.num_nodes = 2;
  reg.nodes.resize(2);
  reg.nodes[0].address = {0, "h", 5, 77};
  reg.nodes[0].role = {"chief", 0};
  reg.nodes[0].state = NodeInfo::State::kRunning;
  reg.nodes[1].address = {1, "g", 6, 78};
  reg.nodes[1].role = {"worker", 0};
  reg.nodes[1].state = NodeInfo::State::kLost;
  reg.nodes[1].error = "gone";
  return reg;
}

TEST(CoordinatorCodec, RegisterReplyRoundTripAndTruncation) {
  const Registration reg = SampleRegistration();
  const std::string bytes = EncodeRegisterReply(reg);
  codec::Writer w;
  w.PutString("chief");
  w.PutI32(0);
  w.PutString(reg.cluster_spec_json);
  w.PutI32(2);
  w.PutU32(2);
  for (const NodeInfo& n : reg.nodes) {
    w.PutI32(n.address.executor_id);
    w.PutString(n.address.host);
    w.PutI32(n.address.port);
    w.PutI64(n.address.pid);
    w.PutString(n.role.job_name);
    w.PutI32(n.role.task_index);
    w.PutU8(static_cast<uint8_t>(n.state));
    w.PutString(n.error);
  }
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeRegisterReply(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->role.job_name, "chief");
  EXPECT_EQ(back->cluster_spec_json, reg.cluster_spec_json);
  EXPECT_EQ(back->num_nodes, 2);
  ASSERT_EQ(back->nodes.size(), 2u);
  EXPECT_EQ(back->nodes[0].address.pid, 77);
  EXPECT_EQ(back->nodes[0].state, NodeInfo::State::kRunning);
  EXPECT_EQ(back->nodes[1].state, NodeInfo::State::kLost);
  EXPECT_EQ(back->nodes[1].error, "gone");
  ExpectCutsAndExtrasRejected(bytes, DecodeRegisterReply, "malformed Register reply");
}

TEST(CoordinatorCodec, RegisterReplyRejectsUnknownStateAndHugeCount) {
  Registration reg = SampleRegistration();
  reg.nodes.resize(1);
  std::string bytes = EncodeRegisterReply(reg);
  // The node's state byte sits before its error string (4 bytes, empty).
  std::string bad_state = bytes;
  bad_state[bad_state.size() - 5] = 9;
  auto state = DecodeRegisterReply(bad_state);
  ASSERT_EQ(state.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(state.status().message(), "node state 9")) << state.status().message();
  // The count is refused before allocating anything.
  const size_t count_at = 4 + 5 + 4 + 4 + reg.cluster_spec_json.size() + 4;
  std::string huge = bytes;
  huge[count_at] = huge[count_at + 1] = huge[count_at + 2] = huge[count_at + 3] = '\xff';
  auto count = DecodeRegisterReply(huge);
  ASSERT_EQ(count.status().code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(count.status().message(), "node count 4294967295")) << count.status().message();
}

TEST(CoordinatorCodec, KvGetReplyRoundTripAndTruncation) {
  const std::string value("\x00model-bytes", 12);
  const std::string bytes = EncodeKvGetReply(value);
  codec::Writer w;
  w.PutString(value);
  EXPECT_EQ(bytes, w.data());
  auto back = DecodeKvGetReply(bytes);
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(*back, value);
  ExpectCutsAndExtrasRejected(bytes, DecodeKvGetReply, "malformed KvGet reply");
}

TEST(CoordinatorCodec, ValidateMessageKnowsEveryKind) {
  const std::pair<MsgType, std::string> samples[] = {
      {MsgType::kRegister, Encode(RegisterRequest{1, {0, "h", 1, 2}, Duration(3)})},
      {MsgType::kAttach, Encode(AttachRequest{1, 0})},
      {MsgType::kBarrier, Encode(BarrierRequest{1, "b", Duration(1)})},
      {MsgType::kKvSet, Encode(KvSetRequest{1, "k", "v"})},
      {MsgType::kKvGet, Encode(KvGetRequest{1, "k", Duration(1)})},
      {MsgType::kLog, Encode(LogMessage{0, "stdout", "x"})},
      {MsgType::kReport, Encode(ReportMessage{0, {{"a", 1}}})},
      {MsgType::kHeartbeat, Encode(HeartbeatMessage{})},
      {MsgType::kDone, Encode(DoneRequest{1})},
      {MsgType::kFail, Encode(FailRequest{1, "e"})},
      {MsgType::kReply, Encode(Reply{1, Status::OK(), ""})},
      {MsgType::kAbort, Encode(AbortPush{0, "r"})},
      {MsgType::kStop, Encode(StopPush{0, "r"})},
      {MsgType::kRelayControl, Encode(RelayControlMessage{})},
      {MsgType::kRelayData, Encode(RelayDataMessage{0, 1})},
      {MsgType::kRelayOpen, Encode(RelayOpenPush{0, 1})},
  };
  for (const auto& [type, bytes] : samples) {
    const auto t = static_cast<uint16_t>(type);
    EXPECT_NE(MsgTypeName(t), "unknown");
    EXPECT_TRUE(ValidateMessage(t, bytes).ok()) << MsgTypeName(t);
    Status truncated = ValidateMessage(t, std::string_view(bytes).substr(0, 3));
    EXPECT_EQ(truncated.code(), StatusCode::kCorruption);
    EXPECT_TRUE(Contains(truncated.message(), std::string(MsgTypeName(t)))) << truncated.message();
  }
  Status unknown = ValidateMessage(63, std::string(4, '\0'));
  EXPECT_EQ(unknown.code(), StatusCode::kCorruption);
  EXPECT_TRUE(Contains(unknown.message(), "unknown message type 63"));
  EXPECT_EQ(MsgTypeName(63), "unknown");
}

// The spellings docs/wire.md lists (and python/tests/test_flood.py reads).
TEST(KvKeys, CollectiveKeysAsDocumented) {
  EXPECT_EQ(kv::CollectiveRankKey("ember-j1-c0", 2), "ember-j1-c0/rank/2");
  EXPECT_EQ(kv::CollectiveShmKey("ember-j1-c0", 4), "ember-j1-c0/shm/4");
  EXPECT_EQ(kv::CollectivePortKey("ember-j1-c0", 0), "ember-j1-c0/port/0");
}

}  // namespace
}  // namespace ember::coord
