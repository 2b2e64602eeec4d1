#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "ember/ps.h"
#include "ps/codec.h"

namespace ember::ps {
namespace {

RuleOptions With(Rule rule, float lr = 0.5f) {
  RuleOptions o;
  o.rule = rule;
  o.lr = lr;
  return o;
}

TEST(ShardTest, EachRuleUpdatesAsItsAlgorithmSays) {
  Shard s("ps:0");
  ASSERT_TRUE(s.CreateDense("assign", std::vector<float>{1, 2}, With(Rule::kAssign)).ok());
  ASSERT_TRUE(s.CreateDense("add", std::vector<float>{1, 2}, With(Rule::kAdd)).ok());
  ASSERT_TRUE(s.CreateDense("sgd", std::vector<float>{1, 2}, With(Rule::kSgd)).ok());
  RuleOptions elastic = With(Rule::kElastic);
  elastic.alpha = 0.25f;
  ASSERT_TRUE(s.CreateDense("easgd", std::vector<float>{0, 4}, elastic).ok());

  EXPECT_EQ(s.PushDense("assign", std::vector<float>{7, 8}, 0)->version, 1);
  EXPECT_EQ(s.PullDense("assign")->values, (std::vector<float>{7, 8}));
  ASSERT_TRUE(s.PushDense("add", std::vector<float>{0.5f, -1}, 0).ok());
  EXPECT_EQ(s.PullDense("add")->values, (std::vector<float>{1.5f, 1}));
  ASSERT_TRUE(s.PushDense("sgd", std::vector<float>{2, -2}, 0).ok());
  EXPECT_EQ(s.PullDense("sgd")->values, (std::vector<float>{0, 3}));  // w -= 0.5 * g

  // EASGD: the worker sends its weights x; e = alpha (x - center); center += e; e comes back.
  auto e = s.PushDense("easgd", std::vector<float>{4, 0}, 0);
  ASSERT_TRUE(e.ok());
  EXPECT_EQ(e->reply, (std::vector<float>{1, -1}));
  EXPECT_EQ(s.PullDense("easgd")->values, (std::vector<float>{1, 3}));
}

TEST(ShardTest, AdamMatchesTheTextbookUpdate) {
  Shard s("ps:0");
  RuleOptions o = With(Rule::kAdam, 0.1f);
  ASSERT_TRUE(s.CreateDense("w", std::vector<float>{1.0f}, o).ok());
  double w = 1.0, m = 0, v = 0;
  for (int t = 1; t <= 3; ++t) {
    const double g = 0.5 * t;
    ASSERT_TRUE(s.PushDense("w", std::vector<float>{static_cast<float>(g)}, t - 1).ok());
    m = 0.9 * m + 0.1 * g;
    v = 0.999 * v + 0.001 * g * g;
    const double lr_t = 0.1 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
    w -= lr_t * m / (std::sqrt(v) + 1e-7);
  }
  EXPECT_NEAR(s.PullDense("w")->values[0], w, 1e-5);
}

TEST(ShardTest, StaleUpdatesAreRejectedPastTheBoundOrScaledByDynSgd) {
  Shard s("ps:1");
  RuleOptions bounded = With(Rule::kAdd);
  bounded.staleness_bound = 1;
  ASSERT_TRUE(s.CreateDense("w", std::vector<float>{0}, bounded).ok());
  ASSERT_TRUE(s.PushDense("w", std::vector<float>{1}, 0)->applied);   // staleness 0
  ASSERT_TRUE(s.PushDense("w", std::vector<float>{1}, 0)->applied);   // 1: at the bound
  auto late = s.PushDense("w", std::vector<float>{100}, 0);           // 2: past it
  ASSERT_TRUE(late.ok());
  EXPECT_FALSE(late->applied);
  EXPECT_EQ(late->staleness, 2);
  EXPECT_EQ(s.PullDense("w")->values, (std::vector<float>{2}));
  EXPECT_EQ(s.PullDense("w")->version, 2);
  ShardStats st = s.Stats();
  EXPECT_EQ(st.pushes_applied, 2);
  EXPECT_EQ(st.pushes_rejected, 1);
  EXPECT_EQ(st.staleness_histogram[0], 1);
  EXPECT_EQ(st.staleness_histogram[1], 1);

  RuleOptions dyn = With(Rule::kSgd, 1.0f);
  dyn.scale_by_staleness = true;
  ASSERT_TRUE(s.CreateDense("d", std::vector<float>{0}, dyn).ok());
  ASSERT_TRUE(s.PushDense("d", std::vector<float>{-1}, 0).ok());  // staleness 0: w += 1
  ASSERT_TRUE(s.PushDense("d", std::vector<float>{-1}, 0).ok());  // staleness 1: w += 1/2
  EXPECT_EQ(s.PullDense("d")->values, (std::vector<float>{1.5f}));

  RuleOptions dyn_add = With(Rule::kAdd);  // dist-keras's DynSGD: deltas scaled by 1/(staleness+1)
  dyn_add.scale_by_staleness = true;
  ASSERT_TRUE(s.CreateDense("a", std::vector<float>{0}, dyn_add).ok());
  ASSERT_TRUE(s.PushDense("a", std::vector<float>{1}, 0).ok());  // staleness 0: w += 1
  ASSERT_TRUE(s.PushDense("a", std::vector<float>{3}, 0).ok());  // staleness 1: w += 3/2
  EXPECT_EQ(s.PullDense("a")->values, (std::vector<float>{2.5f}));

  auto future = s.PushDense("d", std::vector<float>{1}, 99);
  EXPECT_EQ(future.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(future.status().message().find("version 99"), std::string::npos) << future.status().ToString();
}

Deadline Soon(int ms = 2000) { return Deadline::After(Duration(ms)); }

TEST(ShardClockTest, SspHoldsTheFastWorkerWithinTheBoundOfTheSlowest) {
  Shard s("ps:0");
  // Two workers, bound 1.  Worker 0 may not pass before worker 1 ticked at all.
  auto early = s.Clock("worker:0", 1, 1, 2, Deadline::After(Duration(50)));
  EXPECT_EQ(early.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(early.status().message().find("only 1 did (worker:0)"), std::string::npos) << early.status().ToString();
  ASSERT_TRUE(s.Clock("worker:1", 1, 1, 2, Soon()).ok());
  ASSERT_TRUE(s.Clock("worker:0", 2, 1, 2, Soon()).ok());  // 2 - 1 <= 1
  auto ahead = s.Clock("worker:0", 3, 1, 2, Deadline::After(Duration(50)));  // 3 - 1 > 1: waits
  EXPECT_EQ(ahead.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(ahead.status().message().find("waited for worker:1 at clock 1 (staleness bound 1)"), std::string::npos)
      << ahead.status().ToString();

  // The wait ends the moment the slow worker catches up.
  std::thread fast([&] {
    auto r = s.Clock("worker:0", 3, 1, 2, Soon(10000));
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) {
      EXPECT_EQ(r->min_clock, 2);
      EXPECT_GT(r->waited_us, 10000);
    }
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(s.Clock("worker:1", 2, 1, 2, Soon()).ok());
  fast.join();

  auto back = s.Clock("worker:1", 1, 1, 2, Soon());
  EXPECT_EQ(back.status().code(), StatusCode::kInvalidArgument);
}

TEST(ShardClockTest, BspWaitsForEveryoneAndADepartedWorkerIsNotWaitedFor) {
  Shard s("ps:0");
  ASSERT_TRUE(s.Clock("worker:0", 0, 0, 3, Deadline::After(Duration(1))).status().code() ==
              StatusCode::kDeadlineExceeded);
  std::vector<std::thread> ts;
  std::atomic<int> passed{0};
  for (int w = 1; w < 3; ++w) {
    ts.emplace_back([&, w] {
      auto r = s.Clock("worker:" + std::to_string(w), 1, 0, 3, Soon(10000));
      EXPECT_TRUE(r.ok()) << r.status().ToString();
      passed += 1;
    });
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(passed.load(), 0);  // worker:0 is still at clock 0
  s.Leave("worker:0", "its connection closed");  // it died: the others go on
  for (auto& t : ts) t.join();
  EXPECT_EQ(passed.load(), 2);
  EXPECT_EQ(s.Departed().at("worker:0"), "its connection closed");

  // A replacement (or the same name back) joins at the slowest live clock, not behind it.
  auto joined = s.Clock("worker:0", 0, 0, 3, Soon());
  ASSERT_TRUE(joined.ok()) << joined.status().ToString();
  EXPECT_EQ(joined->clock, 1);
  EXPECT_EQ(s.Clocks().size(), 3u);
  EXPECT_EQ(s.Departed().count("worker:0"), 0u);

  // Fully asynchronous (bound < 0): recorded, never waits.
  EXPECT_TRUE(s.Clock("worker:1", 50, -1, 3, Deadline::After(Duration(0))).ok());
  // Closing the server wakes every wait.
  std::thread waiting([&] {
    EXPECT_EQ(s.Clock("worker:1", 60, 0, 3, Soon(10000)).status().code(), StatusCode::kUnavailable);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  s.StopWaits();
  waiting.join();
}

TEST(ShardTest, MistakesAreNamedAndChangeNothing) {
  Shard s("ps:2");
  ASSERT_TRUE(s.CreateDense("w", std::vector<float>{1, 2, 3}, With(Rule::kSgd)).ok());
  EXPECT_TRUE(s.CreateDense("w", std::vector<float>{9, 9, 9}, With(Rule::kSgd)).ok());  // again: a no-op
  EXPECT_EQ(s.PullDense("w")->values, (std::vector<float>{1, 2, 3}));
  Status other = s.CreateDense("w", std::vector<float>{1, 2}, With(Rule::kAdd));
  EXPECT_EQ(other.code(), StatusCode::kAlreadyExists);
  EXPECT_NE(other.message().find("3 elements and rule sgd"), std::string::npos) << other.ToString();

  auto wrong = s.PushDense("w", std::vector<float>{1, 2}, 0);
  EXPECT_EQ(wrong.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(wrong.status().message().find("'w' of 2 elements; it holds 3"), std::string::npos);
  EXPECT_EQ(s.PullDense("w")->version, 0);
  auto missing = s.PullDense("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("ps:2 holds no tensor 'nope'"), std::string::npos);
  RuleOptions hog = With(Rule::kAdam);
  hog.hogwild = true;
  EXPECT_EQ(s.CreateDense("h", std::vector<float>{1}, hog).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.CreateDense("e", std::vector<float>{}, With(Rule::kSgd)).code(), StatusCode::kInvalidArgument);
}

TEST(ShardTest, RowsAreCreatedOnFirstTouchTheSameEverywhereAndUpdated) {
  TableOptions t;
  t.dim = 4;
  t.seed = 42;
  t.init_scale = 0.5f;
  t.lr = 0.1f;
  Shard a("ps:0"), b("ps:1");
  ASSERT_TRUE(a.CreateTable("emb", t).ok());
  ASSERT_TRUE(b.CreateTable("emb", t).ok());
  auto ra = a.PullRows("emb", std::vector<int64_t>{7, -3, 7});
  auto rb = b.PullRows("emb", std::vector<int64_t>{-3});
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(ra->size(), 12u);
  EXPECT_EQ(std::vector<float>(ra->begin() + 4, ra->begin() + 8), *rb);  // a row is a function of (seed, id)
  EXPECT_EQ(std::vector<float>(ra->begin(), ra->begin() + 4), std::vector<float>(ra->begin() + 8, ra->end()));
  for (float v : *ra) EXPECT_TRUE(v >= -0.5f && v < 0.5f) << v;
  EXPECT_EQ(a.Stats().rows, 2);

  std::vector<float> g(8, 1.0f);  // id 7 twice: both applied
  ASSERT_TRUE(a.PushRows("emb", std::vector<int64_t>{7, 7}, g).ok());
  auto after = a.PullRows("emb", std::vector<int64_t>{7});
  for (int j = 0; j < 4; ++j) EXPECT_NEAR((*after)[j], (*ra)[j] - 0.2f, 1e-6f);

  EXPECT_EQ(a.PushRows("emb", std::vector<int64_t>{1}, std::vector<float>(3)).code(), StatusCode::kInvalidArgument);
  TableOptions other = t;
  other.dim = 8;
  EXPECT_EQ(a.CreateTable("emb", other).code(), StatusCode::kAlreadyExists);
  other.dim = 1 << 30;
  EXPECT_EQ(a.CreateTable("huge", other).code(), StatusCode::kInvalidArgument);
}

TEST(ShardTest, ConcurrentPushesAllLandUnderTheLock) {
  Shard s("ps:0");
  ASSERT_TRUE(s.CreateDense("w", std::vector<float>(1000, 0.0f), With(Rule::kAdd)).ok());
  TableOptions t;
  t.dim = 2;
  t.rule = Rule::kAdd;
  t.init_scale = 0;
  ASSERT_TRUE(s.CreateTable("emb", t).ok());
  std::vector<std::thread> workers;
  for (int k = 0; k < 4; ++k) {
    workers.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        auto pulled = s.PullDense("w");
        ASSERT_TRUE(pulled.ok());
        ASSERT_TRUE(s.PushDense("w", std::vector<float>(1000, 1.0f), pulled->version).ok());
        ASSERT_TRUE(s.PushRows("emb", std::vector<int64_t>{i % 5}, std::vector<float>{1, 2}).ok());
      }
    });
  }
  for (auto& w : workers) w.join();
  EXPECT_EQ(s.PullDense("w")->values, std::vector<float>(1000, 800.0f));
  EXPECT_EQ(s.PullDense("w")->version, 800);
  auto rows = s.PullRows("emb", std::vector<int64_t>{0, 1, 2, 3, 4});
  for (int id = 0; id < 5; ++id) {
    EXPECT_EQ((*rows)[2 * id], 160.0f);
    EXPECT_EQ((*rows)[2 * id + 1], 320.0f);
  }
  int64_t taken = 0;
  for (int64_t h : s.Stats().staleness_histogram) taken += h;
  EXPECT_EQ(taken, 800);
}

TEST(ShardTest, ASnapshotRestoresEveryTensorTableVersionAndMoment) {
  Shard a("ps:0");
  RuleOptions adam = With(Rule::kAdam, 0.1f);
  adam.staleness_bound = 4;
  ASSERT_TRUE(a.CreateDense("w", std::vector<float>{1, 2, 3}, adam).ok());
  ASSERT_TRUE(a.PushDense("w", std::vector<float>{1, 1, 1}, 0).ok());
  ASSERT_TRUE(a.CreateDense("b", std::vector<float>{5}, With(Rule::kAdd)).ok());
  TableOptions t;
  t.dim = 3;
  t.seed = 9;
  ASSERT_TRUE(a.CreateTable("emb", t).ok());
  ASSERT_TRUE(a.PushRows("emb", std::vector<int64_t>{4, -8}, std::vector<float>(6, 1.0f)).ok());
  const auto blobs = a.Snapshot();
  EXPECT_EQ(blobs.size(), 3u);

  Shard b("ps:0");
  ASSERT_TRUE(b.CreateDense("stale", std::vector<float>{0}, With(Rule::kAdd)).ok());
  ASSERT_TRUE(b.Restore(blobs).ok());
  EXPECT_EQ(b.PullDense("stale").status().code(), StatusCode::kNotFound);  // replaced, not merged
  EXPECT_EQ(b.PullDense("w")->values, a.PullDense("w")->values);
  EXPECT_EQ(b.PullDense("w")->version, 1);
  EXPECT_EQ(*b.PullRows("emb", std::vector<int64_t>{4, -8}), *a.PullRows("emb", std::vector<int64_t>{4, -8}));
  EXPECT_EQ(b.Stats().rows, 2);
  // The same next Adam step on both: the moments and step count came along.
  ASSERT_TRUE(a.PushDense("w", std::vector<float>{0.5f, -1, 2}, 1).ok());
  ASSERT_TRUE(b.PushDense("w", std::vector<float>{0.5f, -1, 2}, 1).ok());
  EXPECT_EQ(b.PullDense("w")->values, a.PullDense("w")->values);
  EXPECT_TRUE(b.CreateDense("w", std::vector<float>{0, 0, 0}, adam).ok());  // its rule came back
  EXPECT_EQ(b.CreateDense("w", std::vector<float>{0, 0, 0}, With(Rule::kSgd)).code(), StatusCode::kAlreadyExists);

  // Malformed bytes: Corruption naming the blob, and the shard unchanged.
  auto broken = blobs;
  broken["dense/w"].resize(broken["dense/w"].size() - 3);
  Status s = b.Restore(broken);
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_NE(s.message().find("blob 'dense/w'"), std::string::npos) << s.ToString();
  EXPECT_TRUE(b.PullDense("b").ok());
  EXPECT_EQ(b.Restore({{"other/x", ""}}).code(), StatusCode::kCorruption);
}

// The wire: every request and reply round-trips, and Serve is the shard's behaviour.
TEST(PsCodecTest, ServeAppliesRequestsAndRepliesAsTheShardDoes) {
  Shard s("ps:0");
  Request create;
  create.kind = Kind::kCreateDense;
  create.name = "w";
  create.rule = With(Rule::kSgd, 0.25f);
  create.rule.staleness_bound = 3;
  create.values = {1, 2, 3};
  auto back = DecodeRequest(EncodeRequest(create));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->values, create.values);
  EXPECT_EQ(back->rule.staleness_bound, 3);
  EXPECT_EQ(back->rule.lr, 0.25f);
  ASSERT_TRUE(DecodeReply(Kind::kCreateDense, Serve(s, EncodeRequest(create)))->status.ok());

  Request push;
  push.kind = Kind::kPushDense;
  push.name = "w";
  push.values = {4, 4, 4};
  auto pushed = DecodeReply(Kind::kPushDense, Serve(s, EncodeRequest(push)));
  ASSERT_TRUE(pushed.ok() && pushed->status.ok());
  EXPECT_TRUE(pushed->push.applied);
  EXPECT_EQ(pushed->push.version, 1);

  Request pull;
  pull.kind = Kind::kPullDense;
  pull.name = "w";
  auto pulled = DecodeReply(Kind::kPullDense, Serve(s, EncodeRequest(pull)));
  ASSERT_TRUE(pulled.ok());
  EXPECT_EQ(pulled->pull.values, (std::vector<float>{0, 1, 2}));

  Request table;
  table.kind = Kind::kCreateTable;
  table.name = "emb";
  table.table.dim = 3;
  table.table.seed = 0xfeedfacecafebeefULL;
  ASSERT_TRUE(DecodeReply(Kind::kCreateTable, Serve(s, EncodeRequest(table)))->status.ok());
  Request rows;
  rows.kind = Kind::kPullRows;
  rows.name = "emb";
  rows.ids = {5, 6};
  auto got = DecodeReply(Kind::kPullRows, Serve(s, EncodeRequest(rows)));
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(got->rows, *s.PullRows("emb", std::vector<int64_t>{5, 6}));

  Request stats;
  stats.kind = Kind::kStats;
  auto st = DecodeReply(Kind::kStats, Serve(s, EncodeRequest(stats)));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->stats.pushes_applied, 1);
  EXPECT_EQ(st->stats.rows, 2);

  // Errors travel as statuses: the shard's own words.
  pull.name = "nope";
  auto missing = DecodeReply(Kind::kPullDense, Serve(s, EncodeRequest(pull)));
  ASSERT_TRUE(missing.ok());
  EXPECT_EQ(missing->status.code(), StatusCode::kNotFound);
  EXPECT_NE(missing->status.message().find("'nope'"), std::string::npos);
}

TEST(PsCodecTest, MalformedBytesAreCorruptionNamingTheFieldAndApplyNothing) {
  Shard s("ps:0");
  Request push;
  push.kind = Kind::kCreateDense;
  push.name = "w";
  push.values = {1, 2};
  std::string bytes = EncodeRequest(push);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    auto r = DecodeRequest(std::string_view(bytes).substr(0, cut));
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption) << "cut at " << cut;
  }
  // A count that claims more floats than the message holds: refused before allocating.
  std::string lying = bytes;
  lying[lying.size() - 16] = 0x7f;  // the low byte of the count of 2 floats: now 127
  auto r = DecodeRequest(lying);
  EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  EXPECT_NE(r.status().message().find("initial values count"), std::string::npos) << r.status().ToString();
  EXPECT_EQ(DecodeRequest(bytes + "x").status().code(), StatusCode::kCorruption);  // trailing bytes
  EXPECT_EQ(DecodeRequest(std::string(1, '\x63')).status().code(), StatusCode::kCorruption);  // unknown kind

  auto reply = DecodeReply(Kind::kStats, Serve(s, lying));
  ASSERT_TRUE(reply.ok());
  EXPECT_EQ(reply->status.code(), StatusCode::kCorruption);
  EXPECT_NE(reply->status.message().find("ps:0"), std::string::npos) << reply->status.ToString();
  EXPECT_EQ(s.PullDense("w").status().code(), StatusCode::kNotFound);  // nothing was created
}

TEST(PsCodecTest, ManyTensorMessagesRoundTripAndCountsMustAddUp) {
  Shard s("ps:0");
  ASSERT_TRUE(s.CreateDense("a", std::vector<float>{1, 2}, With(Rule::kAdd)).ok());
  ASSERT_TRUE(s.CreateDense("b", std::vector<float>{3}, With(Rule::kAdd)).ok());
  Request push;
  push.kind = Kind::kPushMany;
  push.names = {"a", "b"};
  push.bases = {0, 0};
  push.counts = {2, 1};
  push.values = {10, 20, 30};
  const std::string bytes = EncodeRequest(push);
  auto decoded = DecodeRequest(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(decoded->names, push.names);
  EXPECT_EQ(decoded->counts, push.counts);
  EXPECT_EQ(EncodeRequest(*decoded), bytes);
  auto applied = DecodeReply(Kind::kPushMany, Serve(s, bytes));
  ASSERT_TRUE(applied.ok() && applied->status.ok());
  EXPECT_EQ(applied->pushes.size(), 2u);
  Request pull;
  pull.kind = Kind::kPullMany;
  pull.names = {"b", "a"};
  auto pulled = DecodeReply(Kind::kPullMany, Serve(s, EncodeRequest(pull)));
  ASSERT_TRUE(pulled.ok() && pulled->status.ok());
  EXPECT_EQ(pulled->pulls[0].values, (std::vector<float>{33}));
  EXPECT_EQ(pulled->pulls[1].values, (std::vector<float>{11, 22}));
  EXPECT_EQ(pulled->pulls[1].version, 1);

  push.counts = {2, 2};  // says 4 floats, sends 3
  auto lying = DecodeRequest(EncodeRequest(push));
  EXPECT_EQ(lying.status().code(), StatusCode::kCorruption);
  EXPECT_NE(lying.status().message().find("add up to 4 floats, not the 3"), std::string::npos)
      << lying.status().ToString();
  push.counts = {2, -1};
  EXPECT_EQ(DecodeRequest(EncodeRequest(push)).status().code(), StatusCode::kCorruption);
  EXPECT_EQ(s.PullDense("b")->values, (std::vector<float>{33}));  // nothing more applied
}

TEST(PsCodecTest, UpdatesAreReadInPlaceWhenAlignedElseCopiedIntoTheScratch) {
  Request push;
  push.kind = Kind::kPushDense;
  push.name = "w";
  push.values = {1.5f, -2.0f, 3.25f};
  const std::string bytes = EncodeRequest(push);
  // The same bytes at every offset of an aligned buffer: in place where the floats land aligned.
  alignas(8) char buffer[256];
  int in_place = 0, copied = 0;
  for (size_t shift = 0; shift < 4; ++shift) {
    std::memcpy(buffer + shift, bytes.data(), bytes.size());
    auto q = DecodeRequest(std::string_view(buffer + shift, bytes.size()), /*copy_values=*/false);
    ASSERT_TRUE(q.ok()) << q.status().ToString();
    EXPECT_TRUE(q->values.empty());
    EXPECT_EQ(EncodeRequest(*q), bytes);
    std::vector<float> scratch;
    auto floats = RequestFloats(*q, &scratch);
    EXPECT_EQ(std::vector<float>(floats.begin(), floats.end()), push.values);
    const bool aligned = reinterpret_cast<const char*>(floats.data()) == q->values_bytes.data();
    (aligned ? in_place : copied) += 1;
    EXPECT_EQ(aligned, scratch.empty());
  }
  EXPECT_EQ(in_place, 1);
  EXPECT_EQ(copied, 3);
  // Copied on decode, the request holds no view of the caller's bytes.
  auto owned = DecodeRequest(bytes);
  ASSERT_TRUE(owned.ok());
  EXPECT_TRUE(owned->values_bytes.empty());
  EXPECT_EQ(owned->values, push.values);
}

TEST(PsCodecTest, ServeToSendsServesBytesAndPullsInPlaceUnderTheTensorsLocks) {
  auto make = [] {
    auto s = std::make_unique<Shard>("ps:0");
    EXPECT_TRUE(s->CreateDense("a", std::vector<float>{1, 2}, With(Rule::kAdd)).ok());
    RuleOptions hog = With(Rule::kAdd);
    hog.hogwild = true;
    EXPECT_TRUE(s->CreateDense("h", std::vector<float>{5}, hog).ok());
    return s;
  };
  auto shard = make(), twin = make();
  Request pull;
  pull.kind = Kind::kPullDense;
  pull.name = "a";
  Request many;
  many.kind = Kind::kPullMany;
  many.names = {"h", "a", "a"};  // a Hogwild tensor (no lock) and one twice (locked once)
  Request missing = many;
  missing.names = {"a", "nope"};
  Request push;
  push.kind = Kind::kPushDense;
  push.name = "a";
  push.values = {1, 1};
  for (const Request& r : {pull, many, missing, push, pull}) {
    const std::string bytes = EncodeRequest(r);
    std::string got;
    const Served served = ServeTo(*twin, bytes, [&](std::span<const std::string_view> parts) {
      for (auto part : parts) got.append(part);
      return Status::OK();
    }, /*pull_in_place=*/true);
    EXPECT_EQ(served.kind, r.kind);
    EXPECT_TRUE(served.sent.ok());
    EXPECT_EQ(got, Serve(*shard, bytes)) << KindName(r.kind);
    EXPECT_EQ(served.replied.ok(), r.names != missing.names) << served.replied.ToString();
  }
  // While a pull is being sent, its tensor's lock is held: a push waits for it.
  std::atomic<bool> sending{false}, pushed{false};
  std::thread pusher;
  ServeTo(*twin, EncodeRequest(pull), [&](std::span<const std::string_view>) {
    pusher = std::thread([&] {
      sending = true;
      EXPECT_TRUE(twin->PushDense("a", std::vector<float>{1, 1}, 0).ok());
      pushed = true;
    });
    while (!sending) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_FALSE(pushed.load()) << "a push changed the tensor while its pull was being sent";
    return Status::OK();
  }, /*pull_in_place=*/true);
  pusher.join();
  EXPECT_TRUE(pushed.load());
  // A failed send is reported, not retried.
  const Served failed = ServeTo(*twin, EncodeRequest(pull), [](std::span<const std::string_view>) {
    return Status::Aborted("the worker closed its ring");
  }, /*pull_in_place=*/true);
  EXPECT_EQ(failed.sent.code(), StatusCode::kAborted);
  EXPECT_TRUE(failed.replied.ok());
}

}  // namespace
}  // namespace ember::ps
