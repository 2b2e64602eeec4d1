// TcpRing: N ranks as N threads over loopback (and one test across two
// network namespaces), against references computed here.
#include "collective/tcp_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <thread>

#include "collective/reduce.h"
#include "common/test_util.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ember::collective {
namespace {

using Clock = std::chrono::steady_clock;
const std::string kSecret = "0123456789abcdef-tcp-ring-test";

std::string Name(int r) { return "rank " + std::to_string(r) + " (worker:" + std::to_string(r) + ")"; }

TcpRingOptions Options(int rank, int size, size_t chunk = 256 << 10) {
  TcpRingOptions o;
  o.rank = rank;
  o.size = size;
  o.secret = kSecret;
  o.bind_host = "127.0.0.1";
  o.ring_id = "test";
  o.chunk_bytes = chunk;
  for (int r = 0; r < size; ++r) o.rank_names.push_back(Name(r));
  return o;
}

// Runs fn(rank) on n threads and joins them.
void OnRanks(int n, const std::function<void(int)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(fn, r);
  for (auto& t : threads) t.join();
}

using Ring = std::vector<std::unique_ptr<TcpRing>>;

Ring MakeRing(int n, size_t chunk = 256 << 10, const std::function<void(TcpRingOptions&)>& tweak = nullptr) {
  Ring ring(n);
  std::vector<std::pair<std::string, int>> addrs;
  for (int r = 0; r < n; ++r) {
    TcpRingOptions o = Options(r, n, chunk);
    if (tweak) tweak(o);
    auto l = TcpRing::Listen(o);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    ring[r] = l.MoveValueUnsafe();
    addrs.emplace_back("127.0.0.1", ring[r]->port());
  }
  OnRanks(n, [&](int r) {
    Status s = ring[r]->Connect(addrs, Deadline::After(Duration(10000)));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  return ring;
}

CallDesc Desc(uint64_t seq, Kind kind, DataType dtype = DataType::kFloat32, ReduceOp op = ReduceOp::kSum,
              uint64_t count = 0, int root = 0) {
  CallDesc d;
  d.seq = seq;
  d.kind = kind;
  d.dtype = dtype;
  d.op = op;
  d.count = count;
  d.root = root;
  return d;
}

Deadline Soon(int ms = 20000) { return Deadline::After(Duration(ms)); }

// Small integers: every sum of up to 8 of them is exact in every dtype.
double Value(int rank, size_t i) { return static_cast<double>(static_cast<int>((i * 7 + rank * 13) % 17) - 8); }

void Put(DataType dt, void* p, size_t i, double v) {
  switch (dt) {
    case DataType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case DataType::kFloat64: static_cast<double*>(p)[i] = v; return;
    case DataType::kBFloat16: static_cast<uint16_t*>(p)[i] = FloatToBFloat16(static_cast<float>(v)); return;
    case DataType::kFloat16: static_cast<uint16_t*>(p)[i] = FloatToFloat16(static_cast<float>(v)); return;
    case DataType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case DataType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
  }
}

std::vector<std::byte> Input(DataType dt, size_t count, int rank) {
  std::vector<std::byte> b(count * SizeOf(dt));
  for (size_t i = 0; i < count; ++i) Put(dt, b.data(), i, Value(rank, i));
  return b;
}

std::vector<std::byte> Expected(DataType dt, ReduceOp op, size_t count, int n) {
  std::vector<std::byte> b(count * SizeOf(dt));
  for (size_t i = 0; i < count; ++i) {
    double acc = Value(0, i);
    for (int r = 1; r < n; ++r) {
      const double v = Value(r, i);
      acc = op == ReduceOp::kSum ? acc + v : op == ReduceOp::kMin ? std::min(acc, v) : std::max(acc, v);
    }
    Put(dt, b.data(), i, acc);
  }
  return b;
}

// Allreduce on every rank of `ring`; checks the reference and identical bits.
void CheckAllreduce(Ring& ring, uint64_t seq, DataType dt, ReduceOp op, size_t count) {
  const int n = static_cast<int>(ring.size());
  std::vector<std::vector<std::byte>> bufs(n);
  for (int r = 0; r < n; ++r) bufs[r] = Input(dt, count, r);
  OnRanks(n, [&](int r) {
    Status s = ring[r]->Allreduce(Desc(seq, Kind::kAllreduce, dt, op, count), bufs[r].data(), Soon());
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  const auto want = Expected(dt, op, count, n);
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(bufs[r] == want) << "rank " << r << " of " << n << ": " << DataTypeName(dt) << " "
                                 << ReduceOpName(op) << " of " << count << " elements differs from the reference";
  }
}

TEST(TcpRing, SizeOneIsTrivial) {
  Ring ring = MakeRing(1);
  std::vector<float> v = {1, 2, 3};
  EXPECT_TRUE(ring[0]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 3), v.data(), Soon()).ok());
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  std::vector<float> out(3);
  const uint64_t counts[] = {3};
  EXPECT_TRUE(ring[0]->Allgather(Desc(2, Kind::kAllgather, DataType::kFloat32, ReduceOp::kSum, 3), v.data(), counts,
                                 out.data(), Soon()).ok());
  EXPECT_EQ(out, v);
  EXPECT_TRUE(ring[0]->ReduceScatter(Desc(3, Kind::kReduceScatter, DataType::kFloat32, ReduceOp::kSum, 3), v.data(),
                                     out.data(), Soon()).ok());
  EXPECT_TRUE(ring[0]->Broadcast(Desc(4, Kind::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 3), v.data(), Soon()).ok());
  EXPECT_TRUE(ring[0]->Barrier(Desc(5, Kind::kBarrier), Soon()).ok());
}

TEST(TcpRing, AllreduceSizesAndRankCounts) {
  for (int n : {2, 3, 4}) {
    Ring ring = MakeRing(n);
    uint64_t seq = 0;
    for (size_t count : {0, 1, 2, 3, 7, 1000, 8193, 65537, 300001}) {
      SCOPED_TRACE("n=" + std::to_string(n) + " count=" + std::to_string(count));
      CheckAllreduce(ring, ++seq, DataType::kFloat32, ReduceOp::kSum, count);
    }
  }
}

TEST(TcpRing, AllreduceEightRanksSmall) {
  Ring ring = MakeRing(8, 4096);
  uint64_t seq = 0;
  for (size_t count : {0, 1, 5, 1000, 20001}) CheckAllreduce(ring, ++seq, DataType::kFloat32, ReduceOp::kSum, count);
}

TEST(TcpRing, AllreduceEveryDtypeAndOp) {
  Ring ring = MakeRing(3, 4096);
  uint64_t seq = 0;
  for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kInt32, DataType::kInt64, DataType::kBFloat16,
                      DataType::kFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax}) {
      for (size_t count : {5, 3001, 40001}) {  // the latency path and the ring, odd sizes
        SCOPED_TRACE(std::string(DataTypeName(dt)) + " " + ReduceOpName(op) + " " + std::to_string(count));
        CheckAllreduce(ring, ++seq, dt, op, count);
      }
    }
  }
}

TEST(TcpRing, Allreduce64MiB) {
  for (int n : {2, 3}) {
    Ring ring = MakeRing(n);
    CheckAllreduce(ring, 1, DataType::kFloat32, ReduceOp::kSum, (64 << 20) / 4);
  }
}

// Random floats round differently in every order: all ranks still hold the same bits.
TEST(TcpRing, AllreduceResultsAreBitwiseIdentical) {
  const int n = 4;
  Ring ring = MakeRing(n, 4096);
  uint64_t seq = 0;
  for (size_t count : {100, 100003}) {
    for (DataType dt : {DataType::kFloat32, DataType::kBFloat16}) {
      std::vector<std::vector<std::byte>> bufs(n);
      std::vector<double> sum(count, 0.0), mag(count, 0.0);
      for (int r = 0; r < n; ++r) {
        std::mt19937 rng(r * 31 + static_cast<int>(count));
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        bufs[r].resize(count * SizeOf(dt));
        for (size_t i = 0; i < count; ++i) {
          const float v = u(rng) * (i % 3 == 0 ? 1e4f : 1e-3f);
          Put(dt, bufs[r].data(), i, v);
          sum[i] += dt == DataType::kFloat32 ? v : BFloat16ToFloat(FloatToBFloat16(v));
          mag[i] += std::abs(v);
        }
      }
      ++seq;
      OnRanks(n, [&](int r) {
        EXPECT_TRUE(ring[r]->Allreduce(Desc(seq, Kind::kAllreduce, dt, ReduceOp::kSum, count), bufs[r].data(), Soon()).ok());
      });
      for (int r = 1; r < n; ++r) ASSERT_TRUE(bufs[r] == bufs[0]) << "rank " << r << " differs from rank 0";
      for (size_t i = 0; i < count; i += 97) {
        const double got = dt == DataType::kFloat32 ? reinterpret_cast<float*>(bufs[0].data())[i]
                                                    : BFloat16ToFloat(reinterpret_cast<uint16_t*>(bufs[0].data())[i]);
        // Each of the n-1 partial sums rounds once: error below n ulps of the largest magnitude.
        ASSERT_NEAR(got, sum[i], mag[i] * n * (dt == DataType::kFloat32 ? 0x1p-23 : 0x1p-7)) << i;
      }
    }
  }
}

TEST(TcpRing, BroadcastFromEveryRoot) {
  const int n = 4;
  Ring ring = MakeRing(n, 4096);
  uint64_t seq = 0;
  for (size_t count : {0, 1, 2500, 300001}) {
    for (int root = 0; root < n; ++root) {
      std::vector<std::vector<std::byte>> bufs(n);
      for (int r = 0; r < n; ++r) bufs[r] = Input(DataType::kInt32, count, r);
      ++seq;
      OnRanks(n, [&](int r) {
        Status s = ring[r]->Broadcast(Desc(seq, Kind::kBroadcast, DataType::kInt32, ReduceOp::kSum, count, root),
                                      bufs[r].data(), Soon());
        EXPECT_TRUE(s.ok()) << s.ToString();
      });
      const auto want = Input(DataType::kInt32, count, root);
      for (int r = 0; r < n; ++r) ASSERT_TRUE(bufs[r] == want) << "root " << root << " rank " << r << " count " << count;
    }
  }
}

TEST(TcpRing, AllgatherEqualAndVaryingCounts) {
  const int n = 4;
  Ring ring = MakeRing(n, 4096);
  uint64_t seq = 0;
  for (std::vector<uint64_t> counts : std::vector<std::vector<uint64_t>>{
           {1000, 1000, 1000, 1000}, {0, 5, 0, 70001}, {0, 0, 0, 0}, {3, 1, 4, 1}}) {
    uint64_t total = 0;
    for (auto c : counts) total += c;
    std::vector<std::vector<std::byte>> ins(n), outs(n, std::vector<std::byte>(total * 8));
    std::vector<std::byte> want;
    for (int r = 0; r < n; ++r) {
      ins[r] = Input(DataType::kInt64, counts[r], r + 100);
      want.insert(want.end(), ins[r].begin(), ins[r].end());
    }
    ++seq;
    OnRanks(n, [&](int r) {
      Status s = ring[r]->Allgather(Desc(seq, Kind::kAllgather, DataType::kInt64, ReduceOp::kSum, total), ins[r].data(),
                                    counts, outs[r].data(), Soon());
      EXPECT_TRUE(s.ok()) << s.ToString();
    });
    for (int r = 0; r < n; ++r) ASSERT_TRUE(outs[r] == want) << "rank " << r << " total " << total;
  }
}

TEST(TcpRing, ReduceScatterGivesRankItsBlock) {
  for (int n : {2, 3, 4}) {
    Ring ring = MakeRing(n, 4096);
    uint64_t seq = 0;
    for (size_t count : {0, 1, 50001}) {
      std::vector<std::vector<std::byte>> ins(n), outs(n, std::vector<std::byte>(count * 4));
      for (int r = 0; r < n; ++r) ins[r] = Input(DataType::kFloat32, count * n, r);
      auto copies = ins;
      ++seq;
      OnRanks(n, [&](int r) {
        Status s = ring[r]->ReduceScatter(Desc(seq, Kind::kReduceScatter, DataType::kFloat32, ReduceOp::kMax, count),
                                          ins[r].data(), outs[r].data(), Soon());
        EXPECT_TRUE(s.ok()) << s.ToString();
      });
      const auto all = Expected(DataType::kFloat32, ReduceOp::kMax, count * n, n);
      for (int r = 0; r < n; ++r) {
        ASSERT_TRUE(std::equal(outs[r].begin(), outs[r].end(), all.begin() + r * count * 4)) << "n " << n << " rank " << r;
        ASSERT_TRUE(ins[r] == copies[r]) << "input modified";
      }
    }
  }
}

TEST(TcpRing, BarrierWaitsForEveryRank) {
  const int n = 4;
  Ring ring = MakeRing(n);
  std::atomic<int> entered{0};
  OnRanks(n, [&](int r) {
    for (int round = 1; round <= 3; ++round) {
      std::this_thread::sleep_for(Duration(r * 5));
      entered.fetch_add(1);
      Status s = ring[r]->Barrier(Desc(round, Kind::kBarrier), Soon());
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_GE(entered.load(), n * round) << "rank " << r << " left barrier " << round << " early";
      // Nobody enters the next round before everyone left this one's check? Not needed:
      // the count only grows, so >= n*round holds.
    }
  });
}

// Many consecutive calls of every kind, small chunks: the streams stay in step.
TEST(TcpRing, ManyMixedCalls) {
  const int n = 3;
  Ring ring = MakeRing(n, 4096);
  std::mt19937 rng(7);
  for (uint64_t seq = 1; seq <= 120; ++seq) {
    const int kind = static_cast<int>(rng() % 4);
    const size_t count = rng() % 3 == 0 ? rng() % 50000 : rng() % 300;
    if (kind == 0) {
      CheckAllreduce(ring, seq, DataType::kInt32, ReduceOp::kSum, count);
    } else if (kind == 1) {
      const int root = static_cast<int>(rng() % n);
      std::vector<std::vector<std::byte>> bufs(n);
      for (int r = 0; r < n; ++r) bufs[r] = Input(DataType::kFloat64, count, r);
      OnRanks(n, [&](int r) {
        EXPECT_TRUE(ring[r]->Broadcast(Desc(seq, Kind::kBroadcast, DataType::kFloat64, ReduceOp::kSum, count, root),
                                       bufs[r].data(), Soon()).ok());
      });
      for (int r = 0; r < n; ++r) ASSERT_TRUE(bufs[r] == bufs[root]);
    } else if (kind == 2) {
      OnRanks(n, [&](int r) { EXPECT_TRUE(ring[r]->Barrier(Desc(seq, Kind::kBarrier), Soon()).ok()); });
    } else {
      std::vector<uint64_t> counts = {count, count / 2, 0};
      const uint64_t total = count + count / 2;
      std::vector<std::vector<std::byte>> outs(n, std::vector<std::byte>(total * 2));
      OnRanks(n, [&](int r) {
        auto in = Input(DataType::kFloat16, counts[r], r);
        EXPECT_TRUE(ring[r]->Allgather(Desc(seq, Kind::kAllgather, DataType::kFloat16, ReduceOp::kSum, total), in.data(),
                                       counts, outs[r].data(), Soon()).ok());
      });
      for (int r = 1; r < n; ++r) ASSERT_TRUE(outs[r] == outs[0]);
    }
  }
}

// ---- failures ----

// Runs `call(rank)` on every rank listed, returning each status and how long it took.
struct Outcome {
  Status status;
  Duration took{0};
};
std::vector<Outcome> Calls(int n, const std::vector<int>& ranks, const std::function<Status(int)>& call) {
  std::vector<Outcome> out(n);
  std::vector<std::thread> threads;
  for (int r : ranks) {
    threads.emplace_back([&, r] {
      const auto t0 = Clock::now();
      out[r].status = call(r);
      out[r].took = std::chrono::duration_cast<Duration>(Clock::now() - t0);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

TEST(TcpRing, MismatchedCountFailsEveryRankNamingBoth) {
  const int n = 3;
  Ring ring = MakeRing(n);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(100000));
  auto out = Calls(n, {0, 1, 2}, [&](int r) {
    const uint64_t count = r == 1 ? 99999 : 100000;
    return ring[r]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, count), bufs[r].data(), Soon());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r].status.code(), StatusCode::kInvalidArgument) << r << ": " << out[r].status.ToString();
    EXPECT_NE(out[r].status.message().find("mismatched collective calls"), std::string::npos) << out[r].status.ToString();
    EXPECT_NE(out[r].status.message().find("rank 1 (worker:1)"), std::string::npos) << out[r].status.ToString();
    EXPECT_NE(out[r].status.message().find("99999"), std::string::npos) << out[r].status.ToString();
  }
  // Broken: later calls fail at once with the first error.
  Status again = ring[0]->Barrier(Desc(2, Kind::kBarrier), Soon());
  EXPECT_EQ(again, out[0].status);
}

TEST(TcpRing, MismatchedKindFailsEveryRank) {
  const int n = 4;
  Ring ring = MakeRing(n);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(10));
  auto out = Calls(n, {0, 1, 2, 3}, [&](int r) {
    if (r == 2) return ring[r]->Broadcast(Desc(1, Kind::kBroadcast, DataType::kFloat32, ReduceOp::kSum, 10), bufs[r].data(), Soon());
    return ring[r]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 10), bufs[r].data(), Soon());
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(out[r].status.code(), StatusCode::kInvalidArgument) << r << ": " << out[r].status.ToString();
    EXPECT_NE(out[r].status.message().find("broadcast #1"), std::string::npos) << out[r].status.ToString();
    EXPECT_NE(out[r].status.message().find("rank 2 (worker:2)"), std::string::npos) << out[r].status.ToString();
  }
}

TEST(TcpRing, RankThatNeverCallsIsNamed) {
  for (size_t count : {10, 1000000}) {  // latency path and ring
    const int n = 3;
    Ring ring = MakeRing(n);
    std::vector<std::vector<float>> bufs(n, std::vector<float>(count));
    auto out = Calls(n, {0, 1}, [&](int r) {
      return ring[r]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, count), bufs[r].data(),
                                Deadline::After(Duration(300)));
    });
    for (int r : {0, 1}) {
      EXPECT_EQ(out[r].status.code(), StatusCode::kDeadlineExceeded) << out[r].status.ToString();
      EXPECT_NE(out[r].status.message().find("rank 2 (worker:2) did not start allreduce #1"), std::string::npos)
          << out[r].status.ToString();
      EXPECT_LT(out[r].took.count(), 1500) << out[r].status.ToString();
    }
    // The absent rank learns it too.
    Status late = ring[2]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, count),
                                     bufs[2].data(), Soon(2000));
    EXPECT_EQ(late.code(), StatusCode::kDeadlineExceeded) << late.ToString();
  }
}

TEST(TcpRing, AbortWhileIdleReachesEveryRank) {
  const int n = 4;
  Ring ring = MakeRing(n);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(1 << 20));
  std::thread aborter([&] {
    std::this_thread::sleep_for(Duration(50));
    ring[1]->Abort("boom");
  });
  auto out = Calls(n, {0, 2, 3}, [&](int r) {
    return ring[r]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1 << 20), bufs[r].data(), Soon());
  });
  aborter.join();
  for (int r : {0, 2, 3}) {
    EXPECT_EQ(out[r].status.code(), StatusCode::kAborted) << out[r].status.ToString();
    EXPECT_NE(out[r].status.message().find("rank 1 (worker:1) aborted: boom"), std::string::npos) << out[r].status.ToString();
  }
  EXPECT_EQ(ring[1]->Barrier(Desc(1, Kind::kBarrier), Soon()), Status::Aborted("boom"));
}

TEST(TcpRing, AbortDuringCallWakesItAndReachesEveryRank) {
  const int n = 3;
  Ring ring = MakeRing(n, 4096);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(1 << 20));
  std::thread aborter([&] {
    std::this_thread::sleep_for(Duration(100));
    ring[1]->Abort("operator said stop");
  });
  // Rank 2 never calls, so 0 and 1 block until the abort.
  auto out = Calls(n, {0, 1}, [&](int r) {
    return ring[r]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1 << 20), bufs[r].data(), Soon());
  });
  aborter.join();
  EXPECT_EQ(out[1].status, Status::Aborted("operator said stop"));
  EXPECT_EQ(out[0].status.code(), StatusCode::kAborted) << out[0].status.ToString();
  EXPECT_NE(out[0].status.message().find("rank 1 (worker:1) aborted: operator said stop"), std::string::npos)
      << out[0].status.ToString();
  EXPECT_LT(out[0].took.count(), 2000);
  Status late = ring[2]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1 << 20),
                                   bufs[2].data(), Soon(2000));
  EXPECT_EQ(late.code(), StatusCode::kAborted) << late.ToString();
  EXPECT_NE(late.message().find("aborted: operator said stop"), std::string::npos) << late.ToString();
}

TEST(TcpRing, DestroyedRankIsNamedByItsNeighbours) {
  const int n = 3;
  Ring ring = MakeRing(n, 4096);
  std::vector<std::vector<float>> bufs(n, std::vector<float>(1 << 20));
  std::thread killer([&] {
    std::this_thread::sleep_for(Duration(100));
    ring[2].reset();
  });
  auto out = Calls(n, {0, 1}, [&](int r) {
    return ring[r]->Allreduce(Desc(1, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, 1 << 20), bufs[r].data(), Soon());
  });
  killer.join();
  for (int r : {0, 1}) {
    EXPECT_EQ(out[r].status.code(), StatusCode::kAborted) << out[r].status.ToString();
    EXPECT_NE(out[r].status.message().find("rank 2 (worker:2) closed the connection during allreduce #1"),
              std::string::npos)
        << out[r].status.ToString();
    EXPECT_LT(out[r].took.count(), 2000);
  }
}

TEST(TcpRing, WrongSecretAndWrongHelloAreRejectedThenPrevConnects) {
  testing::WarningCapture warnings;
  const int n = 2;
  Ring ring(n);
  std::vector<std::pair<std::string, int>> addrs;
  for (int r = 0; r < n; ++r) {
    ring[r] = TcpRing::Listen(Options(r, n)).MoveValueUnsafe();
    addrs.emplace_back("127.0.0.1", ring[r]->port());
  }
  std::thread rogue([&] {
    auto fd = tcp::Connect("127.0.0.1", ring[0]->port(), Soon(2000));
    ASSERT_TRUE(fd.ok());
    Status s = tcp::ClientHandshake(fd->get(), "not-the-secret-at-all", Soon(2000), "rank 0");
    EXPECT_EQ(s.code(), StatusCode::kUnauthenticated) << s.ToString();
    // Right secret, wrong ring.
    auto fd2 = tcp::Connect("127.0.0.1", ring[0]->port(), Soon(2000));
    ASSERT_TRUE(fd2.ok());
    ASSERT_TRUE(tcp::ClientHandshake(fd2->get(), kSecret, Soon(2000), "rank 0").ok());
    codec::Writer w;
    w.PutI32(2);
    w.PutI32(1);
    w.PutI32(0);
    w.PutString("another ring");
    ASSERT_TRUE(tcp::WriteFrame(fd2->get(), 0x0701, w.data(), Soon(2000), "rank 0").ok());
    auto reply = tcp::ReadFrame(fd2->get(), 512, Soon(2000), "rank 0");
    ASSERT_TRUE(reply.ok()) << reply.status().ToString();
    EXPECT_EQ(reply->type, 0x0703);
  });
  // Rank 1 connects only after the rogue is done.
  std::thread r0([&] { EXPECT_TRUE(ring[0]->Connect(addrs, Soon(5000)).ok()); });
  rogue.join();
  EXPECT_TRUE(ring[1]->Connect(addrs, Soon(5000)).ok());
  r0.join();
  // The acceptor's words (tcp::Acceptor): the wrong secret fails the handshake, the wrong ring its hello.
  EXPECT_EQ(warnings.Count("rejected unauthenticated connection from"), 1);
  EXPECT_EQ(warnings.Count("rejected connection from"), 1);
  CheckAllreduce(ring, 1, DataType::kFloat32, ReduceOp::kSum, 1000);
}

// 200 silent or slow-drip connections to each rank's listener while the
// ring connects (issue 18): each holds a handshake slot until a newer one
// drops it, so the previous rank still gets in and the ring connects well
// within one handshake_timeout; then its results are exact.
TEST(TcpRing, FloodOfUnauthenticatedConnectionsDoesNotKeepThePreviousRankOut) {
  testing::WarningCapture warnings;
  const int n = 3;
  Ring ring(n);
  std::vector<std::pair<std::string, int>> addrs;
  for (int r = 0; r < n; ++r) {
    ring[r] = TcpRing::Listen(Options(r, n)).MoveValueUnsafe();
    addrs.emplace_back("127.0.0.1", ring[r]->port());
  }
  std::atomic<int> flood_connected{0};
  std::vector<std::vector<Fd>> held(n);
  std::vector<std::thread> flooders;
  for (int r = 0; r < n; ++r) {
    flooders.emplace_back([&, r] {
      for (int i = 0; i < 200; ++i) {
        auto fd = tcp::Connect("127.0.0.1", addrs[r].second, Soon(3000));
        if (!fd.ok()) break;  // the ring connected and closed its listener
        if (i % 2 == 1) {
          const char byte = 'x';
          (void)tcp::WriteAll(fd->get(), &byte, 1, Soon(1000), "drip");
        }
        ++flood_connected;
        held[r].push_back(fd.MoveValueUnsafe());
      }
    });
  }
  // The flood is under way before the ring connects (the listeners' backlogs hold it until the
  // acceptors start); otherwise a fast connect on a busy box can close the listeners first.
  EXPECT_TRUE(ember::testing::WaitUntil([&] { return flood_connected.load() >= 8 * n; }));
  const auto t0 = Clock::now();
  OnRanks(n, [&](int r) {
    Status s = ring[r]->Connect(addrs, Soon(20000));
    EXPECT_TRUE(s.ok()) << s.ToString();
  });
  const auto took = Clock::now() - t0;
  for (auto& t : flooders) t.join();
  EXPECT_LT(took, Options(0, n).handshake_timeout) << "the flood slowed the ring's connect";
  EXPECT_GE(flood_connected.load(), 8);
  CheckAllreduce(ring, 1, DataType::kFloat32, ReduceOp::kSum, 100000);
  CheckAllreduce(ring, 2, DataType::kBFloat16, ReduceOp::kSum, 4097);
}

TEST(TcpRing, ConnectNamesTheRankNotReached) {
  TcpRingOptions o = Options(0, 3);
  auto ring = TcpRing::Listen(o).MoveValueUnsafe();
  int dead_port;
  {
    auto l = tcp::Listen("127.0.0.1", 0).MoveValueUnsafe();
    dead_port = tcp::LocalPort(l.get()).ValueOr(1);
  }  // closed: connections are refused
  const auto t0 = Clock::now();
  Status s = ring->Connect({{"127.0.0.1", ring->port()}, {"127.0.0.1", dead_port}, {"127.0.0.1", dead_port}},
                           Deadline::After(Duration(300)));
  EXPECT_EQ(s.code(), StatusCode::kDeadlineExceeded) << s.ToString();
  EXPECT_NE(s.message().find("could not reach rank 1 (worker:1)"), std::string::npos) << s.ToString();
  EXPECT_LT(std::chrono::duration_cast<Duration>(Clock::now() - t0).count(), 1500);
}

// ---- two network namespaces joined by a veth pair ----

int Sh(const std::string& cmd, std::string* out = nullptr) {
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  if (p == nullptr) return -1;
  char buf[256];
  std::string text;
  while (fgets(buf, sizeof(buf), p) != nullptr) text += buf;
  if (out) *out = text;
  return ::pclose(p);
}

class Namespaces {
 public:
  Namespaces() {
    const std::string id = std::to_string(::getpid() % 100000);
    a_ = "ember-ring-" + id + "-a";
    b_ = "ember-ring-" + id + "-b";
    const std::string va = "embr" + id + "a", vb = "embr" + id + "b";
    const int x = static_cast<int>(::getpid() % 250) + 1;
    ip_a_ = "10.213." + std::to_string(x) + ".1";
    ip_b_ = "10.213." + std::to_string(x) + ".2";
    const std::vector<std::string> steps = {
        "ip netns add " + a_,
        "ip netns add " + b_,
        "ip link add " + va + " type veth peer name " + vb,
        "ip link set " + va + " netns " + a_,
        "ip link set " + vb + " netns " + b_,
        "ip -n " + a_ + " addr add " + ip_a_ + "/24 dev " + va,
        "ip -n " + b_ + " addr add " + ip_b_ + "/24 dev " + vb,
        "ip -n " + a_ + " link set " + va + " up",
        "ip -n " + b_ + " link set " + vb + " up",
        "ip -n " + a_ + " link set lo up",
        "ip -n " + b_ + " link set lo up",
    };
    for (const auto& s : steps) {
      std::string out;
      if (Sh(s, &out) != 0) {
        error_ = "'" + s + "' failed: " + out;
        return;
      }
    }
  }
  ~Namespaces() {  // deleting a namespace deletes its end of the veth, and so the pair
    Sh("ip netns del " + a_);
    Sh("ip netns del " + b_);
  }
  const std::string& error() const { return error_; }
  std::string path(int i) const { return "/run/netns/" + (i == 0 ? a_ : b_); }
  const std::string& ip(int i) const { return i == 0 ? ip_a_ : ip_b_; }

 private:
  std::string a_, b_, ip_a_, ip_b_, error_;
};

TEST(TcpRingNetns, AllreduceAcrossTwoNamespaces) {
  Namespaces ns;
  if (!ns.error().empty()) GTEST_SKIP() << "network namespaces unavailable: " << ns.error();
  const int n = 2;
  std::vector<std::unique_ptr<TcpRing>> ring(n);
  std::vector<std::pair<std::string, int>> addrs(n);
  std::atomic<int> listening{0};
  std::vector<Status> results(n);
  // setns(CLONE_NEWNET) moves only the calling thread: each rank is a thread
  // living in its own namespace, with every socket (and the acceptor thread
  // it starts) created there.
  OnRanks(n, [&](int r) {
    Fd nsfd(::open(ns.path(r).c_str(), O_RDONLY | O_CLOEXEC));
    if (!nsfd.valid() || ::setns(nsfd.get(), CLONE_NEWNET) != 0) {
      results[r] = Status::FromErrno(errno, "setns " + ns.path(r));
      listening.fetch_add(1);
      return;
    }
    TcpRingOptions o = Options(r, n);
    o.bind_host = ns.ip(r);
    auto l = TcpRing::Listen(o);
    if (!l.ok()) {
      results[r] = l.status();
      listening.fetch_add(1);
      return;
    }
    ring[r] = l.MoveValueUnsafe();
    addrs[r] = {ns.ip(r), ring[r]->port()};
    listening.fetch_add(1);
    while (listening.load() < n) std::this_thread::yield();
    if (!ring[1 - r]) return;
    Status s = ring[r]->Connect(addrs, Soon(5000));
    for (uint64_t seq = 1; s.ok() && seq <= 3; ++seq) {
      const size_t count = seq == 1 ? 1 : seq == 2 ? 5000 : 1000003;
      auto buf = Input(DataType::kFloat32, count, r);
      s = ring[r]->Allreduce(Desc(seq, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, count), buf.data(), Soon());
      if (s.ok() && buf != Expected(DataType::kFloat32, ReduceOp::kSum, count, n)) {
        s = Status::Internal("wrong sum for " + std::to_string(count) + " elements");
      }
    }
    results[r] = s;
    ring[r].reset();  // sockets closed on the thread still in the namespace
  });
  for (int r = 0; r < n; ++r) EXPECT_TRUE(results[r].ok()) << "rank " << r << ": " << results[r].ToString();
}

// ---- measurement (run by hand: --gtest_also_run_disabled_tests --gtest_filter='*Bench*') ----

// Prints µs per call and GB/s for 2 ranks, float32; then both allreduce
// algorithms forced, to place small_bytes.
void Bench(const char* label, size_t small_bytes, const std::vector<size_t>& sizes) {
  const int n = 2;
  Ring ring = MakeRing(n, 256 << 10, [&](TcpRingOptions& o) { o.small_bytes = small_bytes; });
  uint64_t seq = 0;
  for (size_t bytes : sizes) {
    const size_t count = bytes / 4;
    std::vector<std::vector<float>> bufs(n, std::vector<float>(count, 1.0f));
    const int iters = bytes <= (64 << 10) ? 2000 : bytes <= (4 << 20) ? 100 : 10;
    std::vector<double> us(n);
    OnRanks(n, [&](int r) {
      for (int i = 0; i < 5; ++i) {
        (void)ring[r]->Allreduce(Desc(seq + 1 + i, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, count),
                                 bufs[r].data(), Soon());
      }
      const auto t0 = Clock::now();
      for (int i = 0; i < iters; ++i) {
        Status s = ring[r]->Allreduce(Desc(seq + 6 + i, Kind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, count),
                                      bufs[r].data(), Soon(60000));
        if (!s.ok()) ADD_FAILURE() << s.ToString();
      }
      us[r] = std::chrono::duration<double, std::micro>(Clock::now() - t0).count() / iters;
    });
    seq += 6 + iters;
    const double t = std::max(us[0], us[1]);
    std::printf("%-8s allreduce float32 %9zu B: %10.1f us  algbw %6.2f GB/s  busbw %6.2f GB/s\n", label, bytes, t,
                bytes / t / 1e3, bytes / t / 1e3 * 2 * (n - 1) / n);
  }
}

TEST(TcpRing, DISABLED_Bench) {
  Bench("default", TcpRingOptions().small_bytes, {4, 4 << 10, 64 << 10, 1 << 20, 4 << 20, 64 << 20});
  Bench("ring", 0, {4, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20});
  Bench("gather", size_t{1} << 40, {4, 4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20});
}

}  // namespace
}  // namespace ember::collective
