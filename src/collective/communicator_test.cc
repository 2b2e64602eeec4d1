// The Communicator over N ranks as N threads (Gloo's style), over an
// in-memory Store, in every topology it composes: one host (shared memory),
// TCP only, and several "hosts" (ranks given different host names, so the
// shared-memory groups and the leaders' TCP ring both run).
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "collective/reduce.h"
#include "ember/collective.h"

namespace ember::collective {
namespace {

#define ASSERT_OK(expr)                              \
  do {                                               \
    const ::ember::Status _s = (expr);               \
    ASSERT_TRUE(_s.ok()) << #expr << ": " << _s.ToString(); \
  } while (0)

const std::string kSecret = "0123456789abcdef-collective";

std::string UniquePrefix() {
  static std::atomic<int> n{0};
  return "ember-test-" + std::to_string(getpid()) + "-c" + std::to_string(n++);
}

struct Topology {
  const char* name;
  std::vector<std::string> hosts;  // host of each rank
  Transport transport = Transport::kAuto;
};

std::vector<Topology> Topologies() {
  return {
      {"one_rank", {"h0"}},
      {"tcp_one_rank", {"h0"}, Transport::kTcp},  // no ring to build (it once crashed on its first call)
      {"shm2", {"h0", "h0"}},
      {"shm4", {"h0", "h0", "h0", "h0"}},
      {"tcp3", {"h0", "h0", "h0"}, Transport::kTcp},
      {"hosts2x2", {"h0", "h0", "h1", "h1"}},
      {"hosts_mixed", {"h0", "h1", "h0", "h2", "h1"}},  // ranks of a host not contiguous
  };
}

// Runs fn(rank, comm) on size threads; fails the test on Create errors.
void RunRanks(const Topology& topo, const std::function<void(int, Communicator&)>& fn,
              size_t shm_buffer_bytes = 64 << 10) {
  auto store = NewInMemoryStore();
  const std::string prefix = UniquePrefix();
  const int size = static_cast<int>(topo.hosts.size());
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions o;
      o.rank = r;
      o.size = size;
      o.host = topo.hosts[r];
      o.bind_host = topo.hosts[r];
      o.name = "worker:" + std::to_string(r);
      o.secret = kSecret;
      o.prefix = prefix;
      o.transport = topo.transport;
      o.connect_timeout = Duration(10000);
      o.timeout = Duration(10000);
      o.shm_buffer_bytes = shm_buffer_bytes;
      o.tcp_chunk_bytes = 16 << 10;
      auto comm = Communicator::Create(o, store);
      ASSERT_TRUE(comm.ok()) << "rank " << r << ": " << comm.status().ToString();
      fn(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

// Host names are resolved by TCP: map "h0", "h1" to loopback.  The
// Communicator uses `host` both as the address and the shm grouping key, so
// the tests give every "host" a distinct loopback address.
std::vector<Topology> Loopback(std::vector<Topology> ts) {
  for (auto& t : ts) {
    for (auto& h : t.hosts) h = "127.0.0." + std::to_string(1 + std::stoi(h.substr(1)));
  }
  return ts;
}

class CommunicatorTest : public ::testing::TestWithParam<Topology> {};
// Failures need a peer: the topologies of more than one rank.
class CommunicatorFailureTest : public ::testing::TestWithParam<Topology> {};

TEST_P(CommunicatorTest, AllreduceEveryOpMatchesReferenceAndIsIdenticalEverywhere) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}, size_t{100003}}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax}) {
      std::vector<std::vector<float>> results(size);
      RunRanks(topo, [&](int r, Communicator& c) {
        std::vector<float> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>((i * 7 + r * 13) % 101) * 0.25f - 3.0f;
        ASSERT_OK(c.Allreduce(v.data(), count, DataType::kFloat32, op));
        results[r] = v;
      });
      for (int r = 0; r < size; ++r) {
        ASSERT_EQ(results[r].size(), count) << topo.name << ": rank " << r << " has no result";
      }
      for (size_t i = 0; i < count; ++i) {
        double sum = 0, mn = 1e30, mx = -1e30;
        for (int r = 0; r < size; ++r) {
          const double x = static_cast<float>((i * 7 + r * 13) % 101) * 0.25f - 3.0f;
          sum += x, mn = std::min(mn, x), mx = std::max(mx, x);
        }
        const double want = op == ReduceOp::kSum ? sum : op == ReduceOp::kAverage ? sum / size
                                                     : op == ReduceOp::kMin     ? mn
                                                                                : mx;
        ASSERT_NEAR(results[0][i], want, 1e-3) << topo.name << " op " << ReduceOpName(op) << " i=" << i;
      }
      for (int r = 1; r < size && count > 0; ++r) {
        ASSERT_EQ(std::memcmp(results[0].data(), results[r].data(), count * sizeof(float)), 0)
            << topo.name << ": rank " << r << " differs from rank 0";
      }
    }
  }
}

TEST_P(CommunicatorTest, IntegerAndHalfTypes) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  RunRanks(topo, [&](int r, Communicator& c) {
    std::vector<int64_t> a(513, r + 1);
    ASSERT_OK(c.Allreduce(a.data(), a.size(), DataType::kInt64, ReduceOp::kSum));
    for (auto x : a) ASSERT_EQ(x, size * (size + 1) / 2);
    std::vector<int32_t> b(33, 10 * (r + 1));
    ASSERT_OK(c.Allreduce(b.data(), b.size(), DataType::kInt32, ReduceOp::kAverage));
    for (auto x : b) ASSERT_EQ(x, 10 * (size + 1) / 2);
    std::vector<double> d(77, r);
    ASSERT_OK(c.Allreduce(d.data(), d.size(), DataType::kFloat64, ReduceOp::kMax));
    for (auto x : d) ASSERT_EQ(x, size - 1);
    std::vector<uint16_t> h(100, 0x3c00);  // float16 1.0
    ASSERT_OK(c.Allreduce(h.data(), h.size(), DataType::kFloat16, ReduceOp::kSum));
    for (auto x : h) ASSERT_EQ(x, FloatToFloat16(static_cast<float>(size)));
    std::vector<uint16_t> bf(100, 0x3f80);  // bfloat16 1.0
    ASSERT_OK(c.Allreduce(bf.data(), bf.size(), DataType::kBFloat16, ReduceOp::kAverage));
    for (auto x : bf) ASSERT_EQ(x, 0x3f80);
  });
}

TEST_P(CommunicatorTest, FusedAllreduceOfManyBuffers) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  RunRanks(topo, [&](int r, Communicator& c) {
    std::vector<std::vector<float>> bufs;
    for (int k = 0; k < 20; ++k) bufs.emplace_back(k * 37 % 50, static_cast<float>(r + k));
    std::vector<std::span<std::byte>> spans;
    for (auto& b : bufs) spans.emplace_back(reinterpret_cast<std::byte*>(b.data()), b.size() * sizeof(float));
    ASSERT_OK(c.AllreduceFused(spans, DataType::kFloat32, ReduceOp::kSum));
    for (int k = 0; k < 20; ++k) {
      for (float x : bufs[k]) ASSERT_EQ(x, static_cast<float>(size * k + size * (size - 1) / 2));
    }
  });
}

TEST_P(CommunicatorTest, BroadcastFromEveryRoot) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  RunRanks(topo, [&](int r, Communicator& c) {
    for (int root = 0; root < size; ++root) {
      std::vector<int32_t> v(100001, r == root ? root * 1000 + 7 : -1);
      ASSERT_OK(c.Broadcast(v.data(), v.size(), DataType::kInt32, root));
      for (auto x : v) ASSERT_EQ(x, root * 1000 + 7) << "root " << root << " at rank " << r;
    }
  });
}

TEST_P(CommunicatorTest, AllgatherEqualAndVarying) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  RunRanks(topo, [&](int r, Communicator& c) {
    std::vector<int64_t> mine(3, r), all(3 * size, -1);
    ASSERT_OK(c.Allgather(mine.data(), mine.size(), all.data(), DataType::kInt64));
    for (int k = 0; k < 3 * size; ++k) ASSERT_EQ(all[k], k / 3);
    // rank r gives r*2 elements (rank 0 none)
    std::vector<float> v(r * 2, static_cast<float>(r));
    std::vector<std::byte> out;
    std::vector<uint64_t> counts;
    ASSERT_OK(c.AllgatherV(v.data(), v.size(), DataType::kFloat32, &out, &counts));
    ASSERT_EQ(counts.size(), static_cast<size_t>(size));
    const float* f = reinterpret_cast<const float*>(out.data());
    size_t pos = 0;
    for (int q = 0; q < size; ++q) {
      ASSERT_EQ(counts[q], static_cast<uint64_t>(q * 2));
      for (int k = 0; k < q * 2; ++k) ASSERT_EQ(f[pos++], static_cast<float>(q));
    }
    ASSERT_EQ(pos * sizeof(float), out.size());
  });
}

TEST_P(CommunicatorTest, ReduceScatterAndBarrier) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  RunRanks(topo, [&](int r, Communicator& c) {
    const size_t block = 1001;
    std::vector<float> in(block * size);
    for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i % 17 + r);
    std::vector<float> out(block, -1);
    ASSERT_OK(c.ReduceScatter(in.data(), out.data(), block, DataType::kFloat32, ReduceOp::kSum));
    for (size_t i = 0; i < block; ++i) {
      const size_t g = r * block + i;
      ASSERT_EQ(out[i], static_cast<float>(size * (g % 17) + size * (size - 1) / 2)) << "rank " << r << " i " << i;
    }
    ASSERT_OK(c.Barrier());
  });
}

TEST_P(CommunicatorTest, AsyncCallsRunInIssueOrder) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  RunRanks(topo, [&](int r, Communicator& c) {
    std::vector<std::vector<float>> bufs(8);
    std::vector<std::unique_ptr<Work>> works;
    for (int k = 0; k < 8; ++k) {
      bufs[k].assign(1000 * (k + 1), static_cast<float>(k));
      works.push_back(c.AllreduceAsync(bufs[k].data(), bufs[k].size(), DataType::kFloat32, ReduceOp::kSum));
    }
    std::vector<double> blocking(5, 1.0);  // queued behind the async calls
    ASSERT_OK(c.Allreduce(blocking.data(), blocking.size(), DataType::kFloat64, ReduceOp::kSum));
    for (double x : blocking) ASSERT_EQ(x, size);
    for (int k = 0; k < 8; ++k) {
      ASSERT_OK(works[k]->Wait());
      for (float x : bufs[k]) ASSERT_EQ(x, static_cast<float>(size * k));
    }
  });
}

TEST_P(CommunicatorFailureTest, MismatchedCallsFailOnEveryRankNamingThem) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  std::vector<Status> got(size);
  RunRanks(topo, [&](int r, Communicator& c) {
    std::vector<float> v(r == size - 1 ? 11 : 10, 1.0f);  // the last rank gives one more element
    CallOptions o;
    o.timeout = Duration(5000);
    got[r] = c.Allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, o);
    // The communicator is broken afterwards: the same error at once.
    Status again = c.Barrier(o);
    EXPECT_FALSE(again.ok());
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_FALSE(got[r].ok()) << "rank " << r;
    EXPECT_TRUE(got[r].code() == StatusCode::kInvalidArgument || got[r].code() == StatusCode::kAborted)
        << got[r].ToString();
    EXPECT_NE(got[r].message().find("rank"), std::string::npos) << got[r].ToString();
  }
}

TEST_P(CommunicatorFailureTest, AbortReachesEveryRank) {
  const Topology topo = GetParam();
  const int size = static_cast<int>(topo.hosts.size());
  std::vector<Status> got(size);
  RunRanks(topo, [&](int r, Communicator& c) {
    // Everyone is in before the abort (which may still catch a peer finishing the barrier).
    if (Status b = c.Barrier(); !b.ok()) {
      got[r] = b;
      return;
    }
    if (r == size - 1) {
      c.Abort("user gave up");
      got[r] = c.Barrier();
      return;
    }
    CallOptions o;
    o.timeout = Duration(5000);
    std::vector<float> v(10, 1.0f);
    got[r] = c.Allreduce(v.data(), v.size(), DataType::kFloat32, ReduceOp::kSum, o);
  });
  for (int r = 0; r < size; ++r) {
    ASSERT_FALSE(got[r].ok()) << "rank " << r;
    EXPECT_NE(got[r].code(), StatusCode::kDeadlineExceeded)
        << "rank " << r << " waited for its deadline instead of learning of the abort: " << got[r].ToString();
  }
}

INSTANTIATE_TEST_SUITE_P(Topologies, CommunicatorTest, ::testing::ValuesIn(Loopback(Topologies())),
                         [](const auto& info) { return std::string(info.param.name); });
std::vector<Topology> MultiRank() {
  std::vector<Topology> out;
  for (auto& t : Loopback(Topologies())) {
    if (t.hosts.size() > 1) out.push_back(t);
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(Topologies, CommunicatorFailureTest, ::testing::ValuesIn(MultiRank()),
                         [](const auto& info) { return std::string(info.param.name); });

TEST(CommunicatorCreate, MissingRanksAreNamed) {
  auto store = NewInMemoryStore();
  CommunicatorOptions o;
  o.rank = 0;
  o.size = 3;
  o.secret = kSecret;
  o.prefix = UniquePrefix();
  o.bind_host = "127.0.0.1";
  o.connect_timeout = Duration(300);
  auto comm = Communicator::Create(o, store);
  ASSERT_FALSE(comm.ok());
  EXPECT_EQ(comm.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(comm.status().message().find("rank(s) 1, 2"), std::string::npos) << comm.status().ToString();
}

TEST(CommunicatorCreate, BadOptions) {
  auto store = NewInMemoryStore();
  CommunicatorOptions o;
  o.secret = kSecret;
  o.rank = 2;
  o.size = 2;
  EXPECT_EQ(Communicator::Create(o, store).status().code(), StatusCode::kInvalidArgument);
  o.rank = 0;
  o.secret = "short";
  EXPECT_EQ(Communicator::Create(o, store).status().code(), StatusCode::kInvalidArgument);
}

TEST(CommunicatorDescribe, NamesRankHostAndPid) {
  auto store = NewInMemoryStore();
  CommunicatorOptions o;
  o.secret = kSecret;
  o.name = "chief:0";
  o.host = "127.0.0.1";
  o.prefix = UniquePrefix();
  auto comm = Communicator::Create(o, store);
  ASSERT_TRUE(comm.ok()) << comm.status().ToString();
  EXPECT_EQ((*comm)->Describe(0), "rank 0 (chief:0 on 127.0.0.1, pid " + std::to_string(getpid()) + ")");
}

}  // namespace
}  // namespace ember::collective
