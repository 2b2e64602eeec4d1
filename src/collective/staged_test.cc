// Collectives on "device" memory through a fake accelerator runtime: its
// device memory is host memory, and its copies run later, in stream order, on
// a thread of its own (as a GPU's copy engine does), so the staging pipeline's
// ordering, slot reuse and failures are exercised without a GPU.  The CUDA
// runtime itself is loaded only on GPU hosts (scripts/gpu_check.sh).
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <latch>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "collective/staged.h"
#include "ember/collective.h"
#include "ember/device.h"

namespace ember::collective {
namespace {

const std::string kSecret = "0123456789abcdef-collective";

std::string UniquePrefix() {
  static std::atomic<int> n{0};
  return "ember-staged-" + std::to_string(getpid()) + "-c" + std::to_string(n++);
}

// One stream; operations run in order on a copy thread, each a little late.
class FakeRuntime : public device::Runtime {
 public:
  FakeRuntime() : engine_([this] { Loop(); }) {}
  ~FakeRuntime() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    engine_.join();
  }
  std::string Describe() const override { return "fake runtime"; }
  Status SetDevice(int) override { return Status::OK(); }
  Result<void*> AllocHost(size_t bytes) override {
    ++host_allocs;
    return static_cast<void*>(new std::byte[bytes]);
  }
  void FreeHost(void* p) override {
    --host_allocs;
    delete[] static_cast<std::byte*>(p);
  }
  Status RegisterHost(void*, size_t) override { return Status::OK(); }
  Status UnregisterHost(void*) override { return Status::OK(); }
  Result<device::Stream> NewStream() override { return static_cast<device::Stream>(this); }
  void FreeStream(device::Stream) override {}
  Result<device::Event> NewEvent() override { return static_cast<device::Event>(new uint64_t(0)); }
  void FreeEvent(device::Event e) override { delete static_cast<uint64_t*>(e); }
  Status CopyAsync(void* dst, const void* src, size_t bytes, device::CopyKind kind, device::Stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    const bool to_host = kind == device::CopyKind::kDeviceToHost;
    log.push_back(std::string(to_host ? "in " : "out ") + std::to_string(bytes));
    if (fail_copy_at >= 0 && copies_++ == fail_copy_at) return Status::IOError("cudaMemcpyAsync failed: fake error");
    queue_.push_back([=] {
      std::this_thread::sleep_for(std::chrono::microseconds(200));
      std::memcpy(dst, src, bytes);
    });
    ++queued_;
    cv_.notify_all();
    return Status::OK();
  }
  Status RecordEvent(device::Event e, device::Stream) override {
    std::lock_guard<std::mutex> lock(mu_);
    *static_cast<uint64_t*>(e) = queued_;  // passed once that many operations ran
    return Status::OK();
  }
  Status WaitEvent(device::Event e) override {
    std::unique_lock<std::mutex> lock(mu_);
    const uint64_t mark = *static_cast<uint64_t*>(e);
    cv_.wait(lock, [&] { return done_ >= mark; });
    log.push_back("wait");
    return Status::OK();
  }
  Result<bool> QueryEvent(device::Event e) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = foreign_.find(e); it != foreign_.end()) return it->second->load();
    return done_ >= *static_cast<uint64_t*>(e);
  }
  // An event of "the caller's stream" (not this fake's one queue): it passes when `*passed` is set.
  device::Event ForeignEvent(std::atomic<bool>* passed) {
    std::lock_guard<std::mutex> lock(mu_);
    auto e = static_cast<device::Event>(passed);
    foreign_[e] = passed;
    return e;
  }
  Result<std::string> DeviceIdentity(int ordinal) override { return identity + ":" + std::to_string(ordinal); }
  Status Synchronize(device::Stream) override {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ >= queued_; });
    return Status::OK();
  }
  Status SynchronizeDevice() override { return Synchronize(nullptr); }
  // Queues `op` on the stream (an NCCL kernel, for the fake NCCL).
  void Enqueue(std::function<void()> op) {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(op));
    ++queued_;
    cv_.notify_all();
  }
  void Note(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu_);
    log.push_back(what);
  }

  std::vector<std::string> log;  // guarded by mu_ while calls run
  int fail_copy_at = -1;         // this copy (0-based) fails
  std::string identity = "fake-gpu";  // ranks with equal identities share a "GPU"
  std::atomic<int> host_allocs{0};

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;
      auto op = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      op();
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  std::map<device::Event, std::atomic<bool>*> foreign_;
  uint64_t queued_ = 0, done_ = 0;
  int copies_ = 0;
  bool stop_ = false;
  std::thread engine_;
};

TEST(DeviceStagingTest, ChunksOverlapTheirCopiesAndLandInOrder) {
  auto rt = std::make_shared<FakeRuntime>();
  auto staging = DeviceStaging::Open(rt, 0, 64);
  ASSERT_TRUE(staging.ok()) << staging.status().ToString();
  std::vector<float> device(100);  // 400 bytes: 6 chunks of 64 and one of 16
  for (size_t i = 0; i < device.size(); ++i) device[i] = static_cast<float>(i);
  int chunk = 0;
  auto outcome = (*staging)->Run(device.data(), device.size() * sizeof(float), true, true,
                                 [&](void* host, size_t bytes) {
                                   rt->Note("op " + std::to_string(chunk++));
                                   auto* f = static_cast<float*>(host);
                                   for (size_t i = 0; i < bytes / sizeof(float); ++i) f[i] *= 2;
                                   return Status::OK();
                                 });
  ASSERT_TRUE(outcome.status.ok()) << outcome.status.ToString();
  for (size_t i = 0; i < device.size(); ++i) ASSERT_EQ(device[i], 2.0f * static_cast<float>(i)) << i;
  // Chunk 1 was on its way to the host before chunk 0 was worked on.
  const auto& log = rt->log;
  EXPECT_EQ(log[0], "in 64");
  EXPECT_EQ(log[1], "in 64");
  EXPECT_EQ(log[2], "wait");
  EXPECT_EQ(log[3], "op 0");
  EXPECT_EQ(log[4], "out 64");
  EXPECT_EQ(log[5], "in 64");  // chunk 2 reuses chunk 0's slot, after chunk 0 went back
  EXPECT_EQ(chunk, 7);
  EXPECT_EQ(std::count(log.begin(), log.end(), "in 16"), 1);
  EXPECT_EQ(std::count(log.begin(), log.end(), "out 16"), 1);
  staging->reset();
  EXPECT_EQ(rt->host_allocs.load(), 0);
}

TEST(DeviceStagingTest, AFailedOpStopsWithNothingInFlight) {
  auto rt = std::make_shared<FakeRuntime>();
  auto staging = DeviceStaging::Open(rt, 0, 64);
  ASSERT_TRUE(staging.ok());
  std::vector<float> device(100, 1.0f);
  int chunk = 0;
  auto outcome = (*staging)->Run(device.data(), 400, true, true, [&](void*, size_t) {
    return ++chunk == 3 ? Status::Aborted("peer gone") : Status::OK();
  });
  EXPECT_EQ(outcome.status.code(), StatusCode::kAborted);
  EXPECT_FALSE(outcome.runtime_failed);
  EXPECT_EQ(chunk, 3);
}

// N ranks as N threads, each with its own fake runtime (its own "GPU").
void RunRanks(int size, const std::function<void(int, Communicator&, FakeRuntime&)>& fn,
              std::function<void(int, FakeRuntime&)> setup = nullptr, Duration timeout = Duration(20000)) {
  auto store = NewInMemoryStore();
  const std::string prefix = UniquePrefix();
  std::latch set_up(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      auto rt = std::make_shared<FakeRuntime>();
      if (setup) setup(r, *rt);
      CommunicatorOptions o;
      o.rank = r;
      o.size = size;
      o.host = "h0";
      o.secret = kSecret;
      o.prefix = prefix;
      o.timeout = timeout;
      o.device_chunk_bytes = 256;
      o.device_runtime = rt;
      auto comm = Communicator::Create(o, store);
      // Every rank is set up (and out of the barrier: a rank that fails the moment its barrier
      // returned would fail a peer still finishing it) before one may break it.  Every rank
      // arrives at the latch, failed or not (the barrier has the call's deadline).
      Status barrier = comm.ok() ? (*comm)->Barrier() : comm.status();
      set_up.arrive_and_wait();
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      ASSERT_TRUE(barrier.ok()) << barrier.ToString();
      fn(r, **comm, *rt);
    });
  }
  for (auto& t : threads) t.join();
}

constexpr device::Device kCuda0{device::Kind::kCuda, 0};

TEST(DeviceCollectiveTest, AllreduceAndBroadcastOnDeviceMemoryMatchHostResults) {
  RunRanks(3, [](int r, Communicator& c, FakeRuntime&) {
    std::vector<float> device(1001), host(1001);
    for (size_t i = 0; i < device.size(); ++i) device[i] = host[i] = static_cast<float>(r * 1000 + i) * 0.25f;
    ASSERT_TRUE(c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kAverage).ok());
    ASSERT_TRUE(c.Allreduce(host.data(), host.size(), DataType::kFloat32, ReduceOp::kAverage).ok());
    EXPECT_EQ(std::memcmp(device.data(), host.data(), host.size() * sizeof(float)), 0);

    std::vector<uint16_t> bf16(777, static_cast<uint16_t>(0x3f80 + r));  // bfloat16 bits near 1.0
    std::vector<uint16_t> bf16_host = bf16;
    ASSERT_TRUE(c.AllreduceOn(kCuda0, bf16.data(), bf16.size(), DataType::kBFloat16, ReduceOp::kSum).ok());
    ASSERT_TRUE(c.Allreduce(bf16_host.data(), bf16_host.size(), DataType::kBFloat16, ReduceOp::kSum).ok());
    EXPECT_EQ(bf16, bf16_host);

    std::vector<int64_t> b(300, r);
    ASSERT_TRUE(c.BroadcastOn(kCuda0, b.data(), b.size(), DataType::kInt64, 2).ok());
    EXPECT_EQ(b, std::vector<int64_t>(300, 2));

    std::vector<double> async(500, r + 1.0);
    auto work = c.AllreduceOnAsync(kCuda0, async.data(), async.size(), DataType::kFloat64, ReduceOp::kSum);
    ASSERT_TRUE(work->Wait().ok());
    EXPECT_EQ(async, std::vector<double>(500, 6.0));
  });
}

TEST(DeviceCollectiveTest, ACallReadsTheBufferOnlyAfterTheCallersReadyEventPassed) {
  RunRanks(2, [](int r, Communicator& c, FakeRuntime& rt) {
    // The caller's stream is still writing the buffer when the async call is made.
    std::vector<float> buffer(1000, -1.0f);
    std::atomic<bool> written{false};
    std::thread caller_stream([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      std::fill(buffer.begin(), buffer.end(), r + 1.0f);
      written = true;
    });
    const device::Device d{device::Kind::kCuda, 0, rt.ForeignEvent(&written)};
    auto work = c.AllreduceOnAsync(d, buffer.data(), buffer.size(), DataType::kFloat32, ReduceOp::kSum);
    Status s = work->Wait();
    caller_stream.join();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(buffer, std::vector<float>(1000, 3.0f));  // not the stale -1s

    std::vector<int64_t> b(300, -1);
    std::atomic<bool> b_written{false};
    std::thread writer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::fill(b.begin(), b.end(), 7 + r);
      b_written = true;
    });
    s = c.BroadcastOn({device::Kind::kCuda, 0, rt.ForeignEvent(&b_written)}, b.data(), b.size(), DataType::kInt64, 1);
    writer.join();
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(b, std::vector<int64_t>(300, 8));
  });
}

TEST(DeviceCollectiveTest, AReadyEventThatNeverPassesFailsEveryRankNamingTheRank) {
  std::vector<Status> got(2);
  std::vector<double> seconds(2);
  RunRanks(
      2,
      [&](int r, Communicator& c, FakeRuntime& rt) {
        std::vector<float> buffer(100, 1.0f);
        std::atomic<bool> never{false};
        device::Device d{device::Kind::kCuda, 0, r == 0 ? rt.ForeignEvent(&never) : nullptr};
        CallOptions o;
        o.timeout = Duration(r == 0 ? 300 : 30000);
        const auto start = std::chrono::steady_clock::now();
        got[r] = c.AllreduceOn(d, buffer.data(), buffer.size(), DataType::kFloat32, ReduceOp::kSum, o);
        seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      nullptr, Duration(60000));
  EXPECT_EQ(got[0].code(), StatusCode::kDeadlineExceeded) << got[0].ToString();
  EXPECT_NE(got[0].message().find("the work that writes the buffer"), std::string::npos) << got[0].ToString();
  EXPECT_NE(got[0].message().find("CUDA device 0"), std::string::npos) << got[0].ToString();
  EXPECT_FALSE(got[1].ok());
  EXPECT_NE(got[1].message().find("rank 0"), std::string::npos) << got[1].ToString();
  EXPECT_LT(seconds[1], 20.0) << "rank 1 waited for its own timeout instead of learning of rank 0";
}

TEST(DeviceCollectiveTest, AFailedCopyFailsEveryRankAtOnceNamingTheRank) {
  std::vector<Status> got(3);
  std::vector<double> seconds(3);
  RunRanks(
      3,
      [&](int r, Communicator& c, FakeRuntime&) {
        std::vector<float> device(1000, 1.0f);
        const auto start = std::chrono::steady_clock::now();
        got[r] = c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kSum);
        seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      },
      [](int r, FakeRuntime& rt) {
        if (r == 1) rt.fail_copy_at = 3;  // rank 1's fourth copy: mid-call
      },
      Duration(60000));
  EXPECT_EQ(got[1].code(), StatusCode::kIOError) << got[1].ToString();
  EXPECT_NE(got[1].message().find("CUDA device 0"), std::string::npos) << got[1].ToString();
  EXPECT_NE(got[1].message().find("fake error"), std::string::npos) << got[1].ToString();
  for (int r : {0, 2}) {
    EXPECT_FALSE(got[r].ok());
    EXPECT_NE(got[r].message().find("rank 1"), std::string::npos) << got[r].ToString();
    EXPECT_LT(seconds[r], 30.0) << "rank " << r << " waited for its timeout instead of learning of rank 1";
  }
}

TEST(DeviceCollectiveTest, WithoutACudaRuntimeEveryRankFailsNamingTheRankThatHasNone) {
  auto store = NewInMemoryStore();
  const std::string prefix = UniquePrefix();
  std::vector<Status> got(2, Status::Internal("the rank did not run"));
  std::latch set_up(2);
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions o;
      o.rank = r;
      o.size = 2;
      o.host = "h0";
      o.secret = kSecret;
      o.prefix = prefix;
      o.timeout = Duration(60000);
      o.cuda.libraries = {"libember-no-such-cudart.so"};
      std::shared_ptr<FakeRuntime> fake;
      if (r == 0) o.device_runtime = fake = std::make_shared<FakeRuntime>();  // rank 0 has a runtime
      auto comm = Communicator::Create(o, store);
      // Both ranks are set up, and out of the barrier, before rank 1 breaks it (breaking it the
      // moment its own barrier returned would fail rank 0's, still finishing).
      Status barrier = comm.ok() ? (*comm)->Barrier() : comm.status();
      set_up.arrive_and_wait();
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      ASSERT_TRUE(barrier.ok()) << barrier.ToString();
      std::vector<float> device(100, 1.0f);
      got[r] = (*comm)->AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kSum);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(got[1].code(), StatusCode::kNotFound) << got[1].ToString();
  EXPECT_NE(got[1].message().find("libember-no-such-cudart.so"), std::string::npos) << got[1].ToString();
  EXPECT_FALSE(got[0].ok());
  EXPECT_NE(got[0].message().find("rank 1"), std::string::npos) << got[0].ToString();
}

// NCCL in one process: each rank's call is an operation on that rank's fake
// stream that meets the other ranks' (a barrier), and the last to arrive
// reduces into every rank's buffer.  Abort releases a stream stuck waiting.
class FakeNccl : public Nccl {
 public:
  struct Group {
    std::mutex mu;
    std::condition_variable cv;
    int size = 0;
    uint64_t generation = 0;
    std::vector<void*> buffers;
    int arrived = 0;
    bool aborted = false;
  };
  struct Comm {
    Group* group;
    int rank;
    FakeRuntime* runtime;
  };

  std::string Describe() const override { return "fake NCCL"; }
  Result<std::string> UniqueId() override {
    std::string id(128, '\0');
    const std::string name = "fake-nccl-" + std::to_string(next_id_++);
    std::memcpy(id.data(), name.data(), name.size());
    return id;
  }
  Result<void*> InitRank(const std::string& id, int size, int rank) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto& g = groups_[id];
    if (!g) g = std::make_unique<Group>();
    {
      std::lock_guard<std::mutex> group_lock(g->mu);  // Meet reads them under the group's lock
      g->size = size;
      g->buffers.resize(size);
    }
    // The rank's runtime: its thread's (RunNcclRanks), else by rank (a communicator of every rank).
    FakeRuntime* rt = thread_runtime != nullptr ? thread_runtime : runtime_for_rank.at(rank);
    comms_.push_back(std::make_unique<Comm>(Comm{g.get(), rank, rt}));
    ++inits;
    sizes.push_back(size);
    return static_cast<void*>(comms_.back().get());
  }
  Status Allreduce(void* comm, void* data, size_t count, DataType dtype, ReduceOp op, device::Stream) override {
    ++calls;
    auto* c = static_cast<Comm*>(comm);
    if (c->rank == stall_rank) return Status::OK();  // a rank that never takes part
    c->runtime->Enqueue([c, data, count, dtype, op] {
      Meet(c, data, [&](const std::vector<void*>& all) {
        for (size_t i = 0; i < count; ++i) {
          if (dtype == DataType::kFloat32) {
            float sum = 0;
            for (void* b : all) sum += static_cast<float*>(b)[i];
            if (op == ReduceOp::kAverage) sum /= static_cast<float>(all.size());
            if (op == ReduceOp::kMax) {
              sum = static_cast<float*>(all[0])[i];
              for (void* b : all) sum = std::max(sum, static_cast<float*>(b)[i]);
            }
            for (void* b : all) static_cast<float*>(b)[i] = sum;
          } else {
            int64_t sum = 0;
            for (void* b : all) sum += static_cast<int64_t*>(b)[i];
            for (void* b : all) static_cast<int64_t*>(b)[i] = sum;
          }
        }
      });
    });
    return Status::OK();
  }
  Status Broadcast(void* comm, void* data, size_t count, DataType dtype, int root, device::Stream) override {
    ++calls;
    auto* c = static_cast<Comm*>(comm);
    c->runtime->Enqueue([c, data, count, dtype, root] {
      Meet(c, data, [&](const std::vector<void*>& all) {
        for (size_t r = 0; r < all.size(); ++r) {
          if (static_cast<int>(r) != root) std::memcpy(all[r], all[root], count * SizeOf(dtype));
        }
      });
    });
    return Status::OK();
  }
  // A peer's abort reaches the others as an asynchronous error, as in NCCL.
  Status AsyncError(void* comm) override {
    Group* g = static_cast<Comm*>(comm)->group;
    std::lock_guard<std::mutex> lock(g->mu);
    return g->aborted ? Status::IOError("fake NCCL: a peer aborted the communicator") : Status::OK();
  }
  void Abort(void* comm) override {
    ++aborts;
    Group* g = static_cast<Comm*>(comm)->group;
    std::lock_guard<std::mutex> lock(g->mu);
    g->aborted = true;
    g->cv.notify_all();
  }

  std::map<int, FakeRuntime*> runtime_for_rank;  // set before the ranks start
  static thread_local FakeRuntime* thread_runtime;  // the calling rank's, where its thread set it
  int stall_rank = -1;
  std::atomic<int> calls{0}, aborts{0}, inits{0};
  std::vector<int> sizes;  // of each InitRank (guarded by mu_)

 private:
  static void Meet(Comm* c, void* data, const std::function<void(const std::vector<void*>&)>& reduce) {
    Group* g = c->group;
    std::unique_lock<std::mutex> lock(g->mu);
    const uint64_t generation = g->generation;
    g->buffers[c->rank] = data;
    if (++g->arrived == g->size) {
      reduce(g->buffers);
      g->arrived = 0;
      ++g->generation;
      g->cv.notify_all();
      return;
    }
    g->cv.wait(lock, [&] { return g->generation != generation || g->aborted; });
  }

  std::mutex mu_;
  std::map<std::string, std::unique_ptr<Group>> groups_;
  std::vector<std::unique_ptr<Comm>> comms_;
  std::atomic<int> next_id_{0};
};

thread_local FakeRuntime* FakeNccl::thread_runtime = nullptr;

// N ranks as threads, each with its own fake runtime whose "GPU" is `identity(rank)`, all
// sharing one fake NCCL (unless `nccl_for(rank)` gives none: that rank cannot load NCCL).
// `host(rank)`: its host ("h0" for all by default; others are loopback addresses 127.0.0.N).
void RunNcclRanks(int size, FakeNccl& nccl, const std::function<std::string(int)>& identity,
                  const std::function<void(int, Communicator&)>& fn, const std::function<bool(int)>& has_nccl,
                  Duration timeout = Duration(20000), std::function<std::string(int)> host = nullptr) {
  auto store = NewInMemoryStore();
  const std::string prefix = UniquePrefix();
  std::vector<std::shared_ptr<FakeRuntime>> runtimes;
  for (int r = 0; r < size; ++r) {
    runtimes.push_back(std::make_shared<FakeRuntime>());
    runtimes.back()->identity = identity(r);
    nccl.runtime_for_rank[r] = runtimes.back().get();
  }
  std::latch set_up(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      CommunicatorOptions o;
      o.rank = r;
      o.size = size;
      o.host = host ? host(r) : "h0";
      if (host) o.bind_host = o.host;
      o.secret = kSecret;
      o.prefix = prefix;
      o.timeout = timeout;
      o.device_chunk_bytes = 256;
      o.device_runtime = runtimes[r];
      FakeNccl::thread_runtime = runtimes[r].get();
      o.use_nccl = has_nccl(r);
      o.nccl = std::shared_ptr<Nccl>(&nccl, [](Nccl*) {});
      auto comm = Communicator::Create(o, store);
      Status barrier = comm.ok() ? (*comm)->Barrier() : comm.status();
      set_up.arrive_and_wait();  // every rank out of the barrier before one may break the group
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      ASSERT_TRUE(barrier.ok()) << barrier.ToString();
      fn(r, **comm);
    });
  }
  for (auto& t : threads) t.join();
}

TEST(NcclPathTest, RanksOnGpusOfTheirOwnUseNcclAndGetTheHostResults) {
  FakeNccl nccl;
  RunNcclRanks(
      3, nccl, [](int r) { return "gpu-" + std::to_string(r); },
      [](int r, Communicator& c) {
        std::vector<float> device(1001), host(1001);
        for (size_t i = 0; i < device.size(); ++i) device[i] = host[i] = static_cast<float>(r + 1) * 0.5f;
        ASSERT_TRUE(c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kAverage).ok());
        ASSERT_TRUE(c.Allreduce(host.data(), host.size(), DataType::kFloat32, ReduceOp::kAverage).ok());
        EXPECT_EQ(device, host);
        std::vector<int64_t> b(300, r);
        ASSERT_TRUE(c.BroadcastOn(kCuda0, b.data(), b.size(), DataType::kInt64, 1).ok());
        EXPECT_EQ(b, std::vector<int64_t>(300, 1));
        // Integer averages truncate as C does: those stage, NCCL is not asked.
        std::vector<int64_t> avg(10, r);  // 0 + 1 + 2 = 3: average 1
        ASSERT_TRUE(c.AllreduceOn(kCuda0, avg.data(), avg.size(), DataType::kInt64, ReduceOp::kAverage).ok());
        EXPECT_EQ(avg, std::vector<int64_t>(10, 1));
      },
      [](int) { return true; });
  EXPECT_EQ(nccl.calls.load(), 6);  // 3 ranks x (allreduce + broadcast); the integer average staged
}

TEST(NcclPathTest, RanksSharingAGpuOrLackingNcclStageAllTogether) {
  for (bool shared : {true, false}) {
    FakeNccl nccl;
    RunNcclRanks(
        2, nccl, [&](int r) { return shared ? std::string("gpu-0") : "gpu-" + std::to_string(r); },
        [](int r, Communicator& c) {
          std::vector<float> device(500, static_cast<float>(r + 1));
          ASSERT_TRUE(c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kSum).ok());
          EXPECT_EQ(device, std::vector<float>(500, 3.0f));
        },
        [&](int r) { return shared || r == 0; });  // distinct GPUs, but rank 1 has no NCCL
    EXPECT_EQ(nccl.calls.load(), 0) << (shared ? "one GPU shared" : "a rank without NCCL");
  }
}

// Three hosts: ranks 0-2 on one, 3-4 on another, 5 alone; PCI ids repeat across hosts (as on
// identical machines), distinct inside each.
std::string HostOf(int r) { return r < 3 ? "127.0.0.1" : r < 5 ? "127.0.0.2" : "127.0.0.3"; }
std::string GpuOf(int r) { return "gpu-" + std::to_string(r < 3 ? r : r < 5 ? r - 3 : 0); }

TEST(NcclPathTest, RanksOnSeveralHostsUseNcclInsideEachHostAndGetTheHostResults) {
  FakeNccl nccl;
  RunNcclRanks(
      6, nccl, GpuOf,
      [](int r, Communicator& c) {
        // Values whose sums are exact in any order: the hierarchy sums in another order than the host path.
        std::vector<float> avg(1001), avg_host(1001), mx(333), mx_host(333);
        for (size_t i = 0; i < avg.size(); ++i) avg[i] = avg_host[i] = (r + 1) * 0.5f + static_cast<float>(i % 7);
        for (size_t i = 0; i < mx.size(); ++i) mx[i] = mx_host[i] = static_cast<float>((r * 37 + i) % 11);
        std::vector<int64_t> sum(700), sum_host(700), iavg(90), iavg_host(90);
        for (size_t i = 0; i < sum.size(); ++i) sum[i] = sum_host[i] = r * 1000 + static_cast<int64_t>(i);
        for (size_t i = 0; i < iavg.size(); ++i) iavg[i] = iavg_host[i] = r * 7 - static_cast<int64_t>(i);
        for (int round = 0; round < 2; ++round) {  // the path is set up once, then reused
          ASSERT_TRUE(c.AllreduceOn(kCuda0, avg.data(), avg.size(), DataType::kFloat32, ReduceOp::kAverage).ok());
          ASSERT_TRUE(c.Allreduce(avg_host.data(), avg_host.size(), DataType::kFloat32, ReduceOp::kAverage).ok());
          EXPECT_EQ(avg, avg_host) << "rank " << r;
        }
        ASSERT_TRUE(c.AllreduceOn(kCuda0, mx.data(), mx.size(), DataType::kFloat32, ReduceOp::kMax).ok());
        ASSERT_TRUE(c.Allreduce(mx_host.data(), mx_host.size(), DataType::kFloat32, ReduceOp::kMax).ok());
        EXPECT_EQ(mx, mx_host) << "rank " << r;
        ASSERT_TRUE(c.AllreduceOn(kCuda0, sum.data(), sum.size(), DataType::kInt64, ReduceOp::kSum).ok());
        ASSERT_TRUE(c.Allreduce(sum_host.data(), sum_host.size(), DataType::kInt64, ReduceOp::kSum).ok());
        EXPECT_EQ(sum, sum_host) << "rank " << r;
        ASSERT_TRUE(c.AllreduceOn(kCuda0, iavg.data(), iavg.size(), DataType::kInt64, ReduceOp::kAverage).ok());
        ASSERT_TRUE(c.Allreduce(iavg_host.data(), iavg_host.size(), DataType::kInt64, ReduceOp::kAverage).ok());
        EXPECT_EQ(iavg, iavg_host) << "rank " << r;
        for (int root : {4, 0, 5}) {  // a host's second rank, a leader, a host of one rank
          std::vector<int64_t> b(300, r == root ? 100 + root : -1);
          Status st = c.BroadcastOn(kCuda0, b.data(), b.size(), DataType::kInt64, root);
          ASSERT_TRUE(st.ok()) << "rank " << r << ", root " << root << ": " << st.ToString();
          EXPECT_EQ(b, std::vector<int64_t>(300, 100 + root)) << "rank " << r << ", root " << root;
        }
        // No rank tears its NCCL communicator down (the fake's abort reaches every peer) while another
        // still waits for the last call's result.
        EXPECT_TRUE(c.Barrier().ok());
      },
      [](int) { return true; }, Duration(20000), HostOf);
  // One NCCL communicator per host of 2+ ranks (3 + 2 ranks joined), none for the host of one.
  EXPECT_EQ(nccl.inits.load(), 5);
  std::vector<int> sizes = nccl.sizes;
  std::sort(sizes.begin(), sizes.end());
  EXPECT_EQ(sizes, (std::vector<int>{2, 2, 3, 3, 3}));
  EXPECT_GT(nccl.calls.load(), 0);
}

TEST(NcclPathTest, SeveralHostsStageWhereAHostsRanksShareAGpuOrARankLacksNccl) {
  for (int variant : {0, 1}) {
    FakeNccl nccl;
    RunNcclRanks(
        4, nccl, [&](int r) { return variant == 0 && r >= 2 ? std::string("gpu-0") : "gpu-" + std::to_string(r % 2); },
        [](int r, Communicator& c) {
          std::vector<float> device(500, static_cast<float>(r + 1));
          ASSERT_TRUE(c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kSum).ok());
          EXPECT_EQ(device, std::vector<float>(500, 10.0f));
        },
        [&](int r) { return variant == 0 || r != 3; }, Duration(20000),
        [](int r) { return std::string(r < 2 ? "127.0.0.1" : "127.0.0.2"); });
    EXPECT_EQ(nccl.inits.load(), 0) << (variant == 0 ? "two ranks of a host on one GPU" : "a rank without NCCL");
  }
}

TEST(NcclPathTest, MismatchedCallsFailOnEveryRankBeforeNcclIsAsked) {
  FakeNccl nccl;
  std::vector<Status> got(2);
  RunNcclRanks(
      2, nccl, [](int r) { return "gpu-" + std::to_string(r); },
      [&](int r, Communicator& c) {
        std::vector<float> device(100 - r, 1.0f);
        got[r] = c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kSum);
      },
      [](int) { return true; });
  for (int r = 0; r < 2; ++r) {
    EXPECT_FALSE(got[r].ok()) << r;
    EXPECT_NE(got[r].ToString().find("do not match"), std::string::npos) << got[r].ToString();
  }
  EXPECT_EQ(nccl.calls.load(), 0);
}

TEST(NcclPathTest, ARankStalledInNcclFailsTheOthersAtTheirDeadline) {
  FakeNccl nccl;
  nccl.stall_rank = 1;
  std::vector<Status> got(2);
  std::vector<double> seconds(2);
  std::atomic<bool> rank0_done{false};
  RunNcclRanks(
      2, nccl, [](int r) { return "gpu-" + std::to_string(r); },
      [&](int r, Communicator& c) {
        std::vector<float> device(100, 1.0f);
        CallOptions o;
        o.timeout = Duration(1500);
        const auto start = std::chrono::steady_clock::now();
        got[r] = c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kSum, o);
        seconds[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (r == 0) rank0_done = true;
        // The stalled rank stays (its communicator alive) until rank 0 has given up.
        for (int i = 0; r == 1 && !rank0_done && i < 2000; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      },
      [](int) { return true; });
  EXPECT_EQ(got[0].code(), StatusCode::kDeadlineExceeded) << got[0].ToString();
  EXPECT_NE(got[0].ToString().find("NCCL allreduce of 100 float32 elements did not complete"), std::string::npos)
      << got[0].ToString();
  EXPECT_LT(seconds[0], 10.0);
  EXPECT_GE(nccl.aborts.load(), 1);
}

TEST(NcclPathTest, APeerThatAbortsFailsTheOthersWithNcclsError) {
  FakeNccl nccl;
  nccl.stall_rank = 1;  // rank 1 returns at once and closes its communicator (NCCL comm aborted)
  std::vector<Status> got(2);
  RunNcclRanks(
      2, nccl, [](int r) { return "gpu-" + std::to_string(r); },
      [&](int r, Communicator& c) {
        std::vector<float> device(100, 1.0f);
        CallOptions o;
        o.timeout = Duration(20000);
        got[r] = c.AllreduceOn(kCuda0, device.data(), device.size(), DataType::kFloat32, ReduceOp::kSum, o);
      },
      [](int) { return true; });
  EXPECT_EQ(got[0].code(), StatusCode::kIOError) << got[0].ToString();
  EXPECT_NE(got[0].ToString().find("a peer aborted"), std::string::npos) << got[0].ToString();
}

TEST(CudaRuntimeTest, AnAbsentLibraryIsNotFoundNamingIt) {
  auto rt = device::LoadCuda(device::CudaOptions{{"libember-no-such-cudart.so"}});
  ASSERT_FALSE(rt.ok());
  EXPECT_EQ(rt.status().code(), StatusCode::kNotFound);
  EXPECT_NE(rt.status().message().find("libember-no-such-cudart.so"), std::string::npos);
  EXPECT_NE(rt.status().message().find("nvidia-cuda-runtime-cu12"), std::string::npos);
}

}  // namespace
}  // namespace ember::collective
