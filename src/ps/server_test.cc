// ps::Server and ps::Client over real loopback TCP with the job's handshake: shards and workers
// as threads of this process.
#include <gtest/gtest.h>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "ember/ps.h"
#include "ps/codec.h"
#include "ps/frames.h"
#include "ps/shm_link.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"

namespace ember::ps {
namespace {

const std::string kSecret = "0123456789abcdef-parameter-server";
size_t g_ring_bytes = 0;  // the workers' ClientOptions::shm_ring_bytes (PsServerTest's parameter)

struct Shards {
  std::vector<std::unique_ptr<Server>> servers;
  std::vector<std::string> addresses;
};

Shards StartShards(int n) {
  Shards out;
  for (int i = 0; i < n; ++i) {
    ServerOptions o;
    o.name = "ps:" + std::to_string(i);
    o.bind_host = "127.0.0.1";
    o.secret = kSecret;
    auto s = Server::Start(o);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    out.addresses.push_back("127.0.0.1:" + std::to_string((*s)->port()));
    out.servers.push_back(std::move(*s));
  }
  return out;
}

std::unique_ptr<Client> ConnectTo(const Shards& shards, const std::string& name = "worker:0",
                                  Duration timeout = Duration(20000)) {
  ClientOptions o;
  o.shards = shards.addresses;
  o.secret = kSecret;
  o.name = name;
  o.timeout = timeout;
  o.connect_timeout = Duration(10000);
  o.shm_ring_bytes = g_ring_bytes;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

RuleOptions Add() {
  RuleOptions r;
  r.rule = Rule::kAdd;
  return r;
}

TEST(PlaceTest, LargeTensorsAreCutOverEveryShardSmallOnesLiveWholeOnOne) {
  auto big = Place("dense/kernel", 100001, 3);
  ASSERT_EQ(big.size(), 3u);
  EXPECT_EQ(big[0].begin, 0u);
  EXPECT_EQ(big[2].end, 100001u);
  for (size_t i = 1; i < big.size(); ++i) EXPECT_EQ(big[i].begin, big[i - 1].end);
  auto small = Place("dense/bias", 10, 3);
  ASSERT_EQ(small.size(), 1u);
  EXPECT_EQ(small[0].end, 10u);
  EXPECT_EQ(Place("dense/bias", 10, 3)[0].shard, small[0].shard);  // a pure function
  std::vector<int> hits(3);
  for (int i = 0; i < 300; ++i) hits[Place("t" + std::to_string(i), 10, 3)[0].shard]++;
  for (int h : hits) EXPECT_GT(h, 50);  // small tensors spread over the shards
}

// Every PsServerTest runs twice: workers reach the shards through shared memory ("shm": they
// share this host), and over TCP only ("tcp").
class PsServerTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { g_ring_bytes = GetParam() == "shm" ? size_t{4} << 20 : 0; }
  void TearDown() override { g_ring_bytes = 0; }
};
INSTANTIATE_TEST_SUITE_P(Transports, PsServerTest, ::testing::Values("shm", "tcp"),
                         [](const ::testing::TestParamInfo<std::string>& i) { return i.param; });

TEST_P(PsServerTest, WorkersPushAndPullThroughShardsAndEveryUpdateLands) {
  Shards shards = StartShards(2);
  const size_t big = 100000, small = 10;
  {
    auto chief = ConnectTo(shards, "worker:0");
    ASSERT_TRUE(chief->CreateDense("big", std::vector<float>(big, 1.0f), Add()).ok());
    ASSERT_TRUE(chief->CreateDense("small", std::vector<float>(small, 0.0f), Add()).ok());
  }
  // The big tensor is cut over both shards; each holds its half.
  EXPECT_EQ(shards.servers[0]->shard().PullDense("big")->values.size(), big / 2);
  EXPECT_EQ(shards.servers[1]->shard().PullDense("big")->values.size(), big / 2);

  std::vector<std::thread> workers;
  for (int w = 0; w < 3; ++w) {
    workers.emplace_back([&, w] {
      auto c = ConnectTo(shards, "worker:" + std::to_string(w));
      ASSERT_NE(c, nullptr);
      // Every worker may create: the first values win.
      ASSERT_TRUE(c->CreateDense("small", std::vector<float>(small, 5.0f), Add()).ok());
      std::vector<float> values(big), sv(small);
      for (int step = 0; step < 10; ++step) {
        auto v = c->PullDense("big", values);
        ASSERT_TRUE(v.ok()) << v.status().ToString();
        auto pushed = c->PushDense("big", std::vector<float>(big, 0.5f), *v);
        ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
        EXPECT_EQ(pushed->applied, 2);
        auto sv_v = c->PullDense("small", sv);
        ASSERT_TRUE(sv_v.ok());
        ASSERT_TRUE(c->PushDense("small", std::vector<float>(small, 1.0f), *sv_v).ok());
      }
    });
  }
  for (auto& t : workers) t.join();
  auto reader = ConnectTo(shards, "reader");
  std::vector<float> values(big), sv(small);
  auto v = reader->PullDense("big", values);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(values, std::vector<float>(big, 1.0f + 3 * 10 * 0.5f));
  EXPECT_EQ(v->per_slice, (std::vector<int64_t>{30, 30}));
  ASSERT_TRUE(reader->PullDense("small", sv).ok());
  EXPECT_EQ(sv, std::vector<float>(small, 30.0f));
  auto stats = reader->Stats();
  ASSERT_TRUE(stats.ok());
  int64_t applied = 0;
  for (const auto& s : *stats) applied += s.pushes_applied;
  EXPECT_EQ(applied, 30 * 2 + 30);  // big: two slices per push
}

TEST_P(PsServerTest, RowsGoToTheirShardAndComeBackInTheCallersOrder) {
  Shards shards = StartShards(3);
  auto c = ConnectTo(shards);
  TableOptions t;
  t.dim = 8;
  t.seed = 7;
  t.rule = Rule::kAdd;
  ASSERT_TRUE(c->CreateTable("emb", t).ok());
  std::vector<int64_t> ids = {5, 900, -2, 5, 1234567890123, 41};
  std::vector<float> rows(ids.size() * 8);
  ASSERT_TRUE(c->PullRows("emb", ids, 8, rows).ok());
  for (size_t k = 0; k < ids.size(); ++k) {
    for (int j = 0; j < 8; ++j) EXPECT_EQ(rows[k * 8 + j], InitialRowValue(7, ids[k], j, t.init_scale));
    auto on_shard = shards.servers[RowShard(ids[k], 3)]->shard().PullRows("emb", std::vector<int64_t>{ids[k]});
    ASSERT_TRUE(on_shard.ok());
    EXPECT_EQ(std::vector<float>(rows.begin() + k * 8, rows.begin() + (k + 1) * 8), *on_shard);
  }
  std::vector<float> ones(ids.size() * 8, 1.0f);
  ASSERT_TRUE(c->PushRows("emb", ids, 8, ones).ok());
  std::vector<float> after(8);
  ASSERT_TRUE(c->PullRows("emb", std::vector<int64_t>{5}, 8, after).ok());
  for (int j = 0; j < 8; ++j) EXPECT_FLOAT_EQ(after[j], rows[j] + 2.0f);  // id 5 was pushed twice

  Status wrong = c->PullRows("emb", std::vector<int64_t>{5}, 4, std::span<float>(after.data(), 4));
  EXPECT_EQ(wrong.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.message().find("not dim 4"), std::string::npos) << wrong.ToString();
}

TEST_P(PsServerTest, ElasticDifferencesComeBackWholeAcrossSlices) {
  Shards shards = StartShards(2);
  auto c = ConnectTo(shards);
  RuleOptions r;
  r.rule = Rule::kElastic;
  r.alpha = 0.5f;
  const size_t n = 70000;
  ASSERT_TRUE(c->CreateDense("w", std::vector<float>(n, 0.0f), r).ok());
  std::vector<float> center(n);
  auto v = c->PullDense("w", center);
  ASSERT_TRUE(v.ok());
  auto e = c->PushDense("w", std::vector<float>(n, 2.0f), *v);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->reply, std::vector<float>(n, 1.0f));
  ASSERT_TRUE(c->PullDense("w", center).ok());
  EXPECT_EQ(center, std::vector<float>(n, 1.0f));
}

TEST_P(PsServerTest, ErrorsNameTheShardTensorAndCall) {
  Shards shards = StartShards(2);
  auto c = ConnectTo(shards);
  std::vector<float> out(4);
  auto missing = c->PullDense("nope", out);
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("pull of 'nope' on ps:"), std::string::npos) << missing.status().ToString();
  ASSERT_TRUE(c->CreateDense("w", std::vector<float>(4, 0.0f), Add()).ok());
  auto v = c->PullDense("w", out);
  ASSERT_TRUE(v.ok());
  auto sizes = c->PushDense("w", std::vector<float>(3, 0.0f), *v);  // another size places elsewhere or mismatches
  EXPECT_FALSE(sizes.ok());
  // The connection is still good after error replies.
  EXPECT_TRUE(c->PullDense("w", out).ok());
}

TEST_P(PsServerTest, ADeadShardFailsTheNextCallNamingItAndTheOthersStayUsable) {
  Shards shards = StartShards(2);
  auto c = ConnectTo(shards, "worker:0", Duration(5000));
  ASSERT_TRUE(c->CreateDense("big", std::vector<float>(100000, 0.0f), Add()).ok());
  shards.servers[1]->Close();
  std::vector<float> out(100000);
  const auto start = std::chrono::steady_clock::now();
  auto got = c->PullDense("big", out);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("ps:1 at 127.0.0.1:"), std::string::npos) << got.status().ToString();
  EXPECT_NE(got.status().message().find("the shard died"), std::string::npos) << got.status().ToString();
  EXPECT_LT(secs, 4.0) << "the client waited for its timeout instead of seeing the closed connection";
  auto again = c->PullDense("big", out);  // sticky: named again, at once
  EXPECT_NE(again.status().message().find("ps:1"), std::string::npos);
  // A tensor on shard 0 alone is still served.
  ASSERT_TRUE(shards.servers[0]->shard().CreateDense("s0", std::vector<float>{3}, Add()).ok());
}

TEST_P(PsServerTest, SspClocksOverTheWireWarmUpSynchronouslyAndForgetAWorkerWhoseConnectionDrops) {
  Shards shards = StartShards(2);
  auto w0 = ConnectTo(shards, "worker:0", Duration(3000));
  auto w1 = ConnectTo(shards, "worker:1");
  ASSERT_TRUE(w0 && w1);
  // Warm-up (clock <= 2): bound 0 although staleness is 5, so worker:0 cannot run ahead.
  std::thread first([&] { EXPECT_TRUE(w1->Clock(1, 5, 2, 2).ok()); });  // waits for worker:0's tick
  ASSERT_TRUE(w0->Clock(1, 5, 2, 2).ok());
  first.join();
  auto held = w0->Clock(2, 5, 2, 2);
  EXPECT_EQ(held.status().code(), StatusCode::kDeadlineExceeded);
  // The shard's own message (the slowest worker, named) arrives before the client's deadline.
  EXPECT_NE(held.status().message().find("waited for worker:1 at clock 1 (staleness bound 0)"), std::string::npos)
      << held.status().ToString();
  // Past the warm-up the bound is 5.
  auto w0b = ConnectTo(shards, "worker:0");
  ASSERT_TRUE(w0b->Clock(6, 5, 2, 2).ok());
  // worker:1's process dies (its connection closes without leave()): worker:0 goes on.
  w1.reset();
  for (int i = 0; i < 200 && shards.servers[0]->shard().Clocks().count("worker:1"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(shards.servers[0]->shard().Clocks().count("worker:1"), 0u);
  EXPECT_NE(shards.servers[0]->shard().Departed().at("worker:1").find("closed without leave()"), std::string::npos);
  auto on = w0b->Clock(20, 0, 2, 2);
  ASSERT_TRUE(on.ok()) << on.status().ToString();
  EXPECT_EQ(on->min_clock, 20);
  // A replacement took worker:0's name on a new connection: the old connection closing now
  // does not remove it.
  w0.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(shards.servers[0]->shard().Clocks().count("worker:0"), 1u);
  ASSERT_TRUE(w0b->Leave().ok());
  EXPECT_TRUE(shards.servers[0]->shard().Clocks().empty());
}

TEST_P(PsServerTest, ManyTensorsGoInOneRequestPerShardAndComeBackWhole) {
  Shards shards = StartShards(2);
  auto c = ConnectTo(shards);
  ASSERT_TRUE(c);
  // A large tensor cut over both shards, and small ones living whole on one or the other.
  std::vector<std::string> names = {"big", "a", "b", "c", "d"};
  std::vector<std::vector<float>> init = {std::vector<float>(100001, 1.0f), {1, 2}, {3}, {4, 5, 6}, {7}};
  for (size_t t = 0; t < names.size(); ++t) ASSERT_TRUE(c->CreateDense(names[t], init[t], Add()).ok());
  std::vector<std::vector<float>> got(names.size());
  std::vector<std::span<float>> outs;
  for (size_t t = 0; t < names.size(); ++t) {
    got[t].assign(init[t].size(), -1.0f);
    outs.emplace_back(got[t]);
  }
  auto versions = c->PullDenseMany(names, outs);
  ASSERT_TRUE(versions.ok()) << versions.status().ToString();
  EXPECT_EQ(got, init);
  EXPECT_EQ((*versions)[0].per_slice.size(), 2u);
  // Push 1 to every element of every tensor at once; each lands once.
  std::vector<std::vector<float>> ones;
  std::vector<std::span<const float>> updates;
  for (const auto& v : init) ones.emplace_back(v.size(), 1.0f);
  for (const auto& v : ones) updates.emplace_back(v);
  auto pushed = c->PushDenseMany(names, updates, *versions);
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  EXPECT_EQ((*pushed)[0].applied, 2);
  EXPECT_EQ((*pushed)[0].versions.per_slice, (std::vector<int64_t>{1, 1}));
  for (size_t t = 0; t < names.size(); ++t) {
    std::vector<float> one(init[t].size());
    ASSERT_TRUE(c->PullDense(names[t], one).ok());
    for (size_t i = 0; i < one.size(); ++i) ASSERT_EQ(one[i], init[t][i] + 1.0f) << names[t] << "[" << i << "]";
  }
  // A wrong size on one tensor: named, and nothing on that shard is applied.
  std::vector<float> wrong(7, 1.0f);
  updates[3] = wrong;
  auto bad = c->PushDenseMany(names, updates, *versions);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tensor 'c'"), std::string::npos) << bad.status().ToString();
  auto missing = c->PullDenseMany({"a", "nope"}, {outs[1], outs[2]});
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("'nope'"), std::string::npos) << missing.status().ToString();
  // Elastic differences come back per tensor.
  RuleOptions elastic;
  elastic.rule = Rule::kElastic;
  elastic.alpha = 0.5f;
  ASSERT_TRUE(c->CreateDense("e1", std::vector<float>{0, 0}, elastic).ok());
  ASSERT_TRUE(c->CreateDense("e2", std::vector<float>{10}, elastic).ok());
  std::vector<float> e1(2), e2(1);
  auto ev = c->PullDenseMany({"e1", "e2"}, {e1, e2});
  ASSERT_TRUE(ev.ok());
  std::vector<float> x1{2, 4}, x2{0};
  auto moved = c->PushDenseMany({"e1", "e2"}, {x1, x2}, *ev);
  ASSERT_TRUE(moved.ok()) << moved.status().ToString();
  EXPECT_EQ((*moved)[0].reply, (std::vector<float>{1, 2}));
  EXPECT_EQ((*moved)[1].reply, (std::vector<float>{-5}));
}

TEST_P(PsServerTest, StrangersAndMalformedRequestsGetNothing) {
  Shards shards = StartShards(1);
  const int port = shards.servers[0]->port();
  auto stranger = tcp::Dial("127.0.0.1", port, "another-secret-of-16-bytes", Deadline::After(Duration(5000)), "ps:0");
  EXPECT_EQ(stranger.status().code(), StatusCode::kUnauthenticated) << stranger.status().ToString();

  auto fd = tcp::Dial("127.0.0.1", port, kSecret, Deadline::After(Duration(5000)), "ps:0");
  ASSERT_TRUE(fd.ok()) << fd.status().ToString();
  ASSERT_TRUE(tcp::WriteFrame(fd->get(), kRequestFrame, std::string("\x03garbage", 8), Deadline::After(Duration(5000)),
                              "ps:0").ok());
  auto frame = tcp::ReadFrame(fd->get(), 1 << 20, Deadline::After(Duration(5000)), "ps:0");
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  auto reply = DecodeReply(Kind::kStats, frame->payload);
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kCorruption);
  // The connection still serves well-formed requests.
  Request stats;
  stats.kind = Kind::kStats;
  ASSERT_TRUE(tcp::WriteFrame(fd->get(), kRequestFrame, EncodeRequest(stats), Deadline::After(Duration(5000)), "ps:0").ok());
  auto ok = tcp::ReadFrame(fd->get(), 1 << 20, Deadline::After(Duration(5000)), "ps:0");
  ASSERT_TRUE(ok.ok());
  EXPECT_TRUE(DecodeReply(Kind::kStats, ok->payload)->status.ok());

  ClientOptions o;
  o.shards = {"127.0.0.1:1"};
  o.secret = kSecret;
  o.connect_timeout = Duration(2000);
  auto none = Client::Connect(o);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("ps:0 at 127.0.0.1:1"), std::string::npos) << none.status().ToString();
  EXPECT_NE(none.status().message().find("is its ps node running"), std::string::npos);
}

// The PS rings in /dev/shm (their names are unlinked once both sides mapped them).
std::vector<std::string> PsRingNames() {
  std::vector<std::string> out;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind("ember-ps-", 0) == 0) out.emplace_back(e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

TEST(PsShmTest, AWorkerOnTheShardsHostUsesSharedMemoryAndLargerMessagesTakeTheConnection) {
  Shards shards = StartShards(1);
  g_ring_bytes = 64 << 10;  // rings of 64 KiB: a 400 KB tensor does not fit
  auto shm = ConnectTo(shards, "worker:0");
  g_ring_bytes = 0;
  auto tcp = ConnectTo(shards, "worker:1");
  ASSERT_TRUE(shm && tcp);
  EXPECT_TRUE(shm->shared_memory(0));
  EXPECT_FALSE(tcp->shared_memory(0));
  EXPECT_TRUE(PsRingNames().empty()) << "a ring's name outlived the setup: " << PsRingNames()[0];
  const size_t big = 100000;
  std::vector<float> ones(big, 1.0f), out(big);
  ASSERT_TRUE(shm->CreateDense("big", std::vector<float>(big, 0.0f), Add()).ok());
  ASSERT_TRUE(shm->CreateDense("small", std::vector<float>{0, 0, 0}, Add()).ok());
  for (int step = 0; step < 3; ++step) {  // requests and replies alternate between ring and socket
    auto v = shm->PullDense("big", out);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    ASSERT_TRUE(shm->PushDense("big", ones, *v).ok());
    std::vector<float> small(3);
    auto sv = shm->PullDense("small", small);
    ASSERT_TRUE(sv.ok()) << sv.status().ToString();
    ASSERT_TRUE(shm->PushDense("small", std::vector<float>{1, 2, 3}, *sv).ok());
    ASSERT_TRUE(tcp->PushDense("small", std::vector<float>{1, 1, 1}, *sv).ok());
  }
  ASSERT_TRUE(tcp->PullDense("big", out).ok());
  for (float x : out) ASSERT_EQ(x, 3.0f);
  std::vector<float> small(3);
  ASSERT_TRUE(shm->PullDense("small", small).ok());
  EXPECT_EQ(small, (std::vector<float>{6, 9, 12}));
  // Rows through the ring: 2000 ids of 8 floats (64 KB) do not fit either; 10 do.
  TableOptions t;
  t.dim = 8;
  ASSERT_TRUE(shm->CreateTable("emb", t).ok());
  for (size_t n : {size_t{10}, size_t{2000}}) {
    std::vector<int64_t> ids(n);
    for (size_t k = 0; k < n; ++k) ids[k] = static_cast<int64_t>(k * 7919);
    std::vector<float> a(n * 8), b(n * 8);
    ASSERT_TRUE(shm->PullRows("emb", ids, 8, a).ok());
    ASSERT_TRUE(tcp->PullRows("emb", ids, 8, b).ok());
    EXPECT_EQ(a, b);
  }
}

TEST(PsShmTest, AKilledWorkerLeavesNoRingAndTheShardServesTheOthers) {
  Shards shards = StartShards(1);
  g_ring_bytes = 1 << 20;
  auto chief = ConnectTo(shards, "worker:0");
  ASSERT_TRUE(chief && chief->shared_memory(0));
  ASSERT_TRUE(chief->CreateDense("w", std::vector<float>(1000, 0.0f), Add()).ok());
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const pid_t child = ::fork();
  if (child == 0) {  // a worker process: connects, pushes once, says so, then waits to be killed
    ClientOptions o;
    o.shards = shards.addresses;
    o.secret = kSecret;
    o.name = "worker:1";
    o.shm_ring_bytes = 1 << 20;
    auto c = Client::Connect(o);
    std::vector<float> out(1000);
    bool ok = c.ok() && (*c)->shared_memory(0);
    auto v = ok ? (*c)->PullDense("w", out) : Result<Versions>(Status::Internal("no"));
    ok = ok && v.ok() && (*c)->PushDense("w", std::vector<float>(1000, 1.0f), *v).ok();
    const char byte = ok ? 'y' : 'n';
    (void)!::write(ready[1], &byte, 1);
    for (;;) ::pause();
  }
  ::close(ready[1]);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);
  ::close(ready[0]);
  ::kill(child, SIGKILL);
  ::waitpid(child, nullptr, 0);
  g_ring_bytes = 0;
  EXPECT_EQ(byte, 'y') << "the worker process could not push through shared memory";
  EXPECT_TRUE(PsRingNames().empty()) << "the killed worker left " << PsRingNames()[0];
  std::vector<float> out(1000);
  auto v = chief->PullDense("w", out);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(out[0], 1.0f);  // its push landed; the shard goes on serving
  // A stranger's offer that names no PS ring is refused: the connection is dropped.
  auto fd = tcp::Dial("127.0.0.1", shards.servers[0]->port(), kSecret, Deadline::After(Duration(5000)), "ps:0");
  ASSERT_TRUE(fd.ok());
  // (the encoder writes any name; the shard must refuse it)
  ASSERT_TRUE(tcp::WriteFrame(fd->get(), kShmOfferFrame, EncodeShmOffer({"/ember-feed-x", 1 << 20}),
                              Deadline::After(Duration(5000)), "ps:0").ok());
  auto dropped = tcp::ReadFrame(fd->get(), 4096, Deadline::After(Duration(5000)), "ps:0");
  EXPECT_EQ(dropped.status().code(), StatusCode::kUnavailable) << dropped.status().ToString();
  // An offer of a PS ring that is not on this host: the answer is "" and TCP goes on.
  auto fd2 = tcp::Dial("127.0.0.1", shards.servers[0]->port(), kSecret, Deadline::After(Duration(5000)), "ps:0");
  ASSERT_TRUE(fd2.ok());
  ASSERT_TRUE(tcp::WriteFrame(fd2->get(), kShmOfferFrame, EncodeShmOffer({"/ember-ps-elsewhere", 1 << 20}),
                              Deadline::After(Duration(5000)), "ps:0").ok());
  auto answer = tcp::ReadFrame(fd2->get(), 4096, Deadline::After(Duration(5000)), "ps:0");
  ASSERT_TRUE(answer.ok()) << answer.status().ToString();
  EXPECT_EQ(answer->type, kShmAnswerFrame);
  EXPECT_EQ(*DecodeShmAnswer(answer->payload), "");
  Request stats;
  stats.kind = Kind::kStats;
  ASSERT_TRUE(tcp::WriteFrame(fd2->get(), kRequestFrame, EncodeRequest(stats), Deadline::After(Duration(5000)), "ps:0").ok());
  auto ok = tcp::ReadFrame(fd2->get(), 1 << 20, Deadline::After(Duration(5000)), "ps:0");
  ASSERT_TRUE(ok.ok()) << ok.status().ToString();
  EXPECT_TRUE(DecodeReply(Kind::kStats, ok->payload)->status.ok());
}

TEST(PsShmTest, OffersAndAnswersDecodeOnlyPsRingNames) {
  EXPECT_TRUE(IsPsRingName(ShmLink::NewRingName())) << ShmLink::NewRingName();
  EXPECT_NE(ShmLink::NewRingName(), ShmLink::NewRingName());
  for (const char* bad : {"", "/ember-ps-", "/ember-feed-1", "/ember-ps-../x", "/ember-ps-A", "ember-ps-1",
                          "/ember-ps-0123456789012345678901234567890123456789012345678"}) {
    EXPECT_FALSE(IsPsRingName(bad)) << bad;
    EXPECT_EQ(DecodeShmOffer(EncodeShmOffer({bad, 4096})).status().code(), StatusCode::kCorruption) << bad;
  }
  auto offer = DecodeShmOffer(EncodeShmOffer({"/ember-ps-1f-00ab", 1 << 20}));
  ASSERT_TRUE(offer.ok());
  EXPECT_EQ(offer->ring, "/ember-ps-1f-00ab");
  EXPECT_EQ(offer->request_bytes, 1u << 20);
  EXPECT_EQ(DecodeShmOffer(EncodeShmOffer({"/ember-ps-1", 0})).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(DecodeShmOffer(EncodeShmOffer({"/ember-ps-1", 1}) + "x").status().code(), StatusCode::kCorruption);
  EXPECT_EQ(*DecodeShmAnswer(EncodeShmAnswer("")), "");
  EXPECT_EQ(DecodeShmAnswer(EncodeShmAnswer("/dev/shm/x")).status().code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace ember::ps
