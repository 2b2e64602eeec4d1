// EventWriter over the in-memory and fault-injecting file systems; what it
// writes is read back by the test decoder (event_test_decode.h).  That real
// TensorFlow and TensorBoard read the same bytes is python/tests/test_summary.py.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <map>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "ember/summary.h"
#include "fs/fault_fs.h"
#include "summary/event_test_decode.h"

namespace ember::summary {
namespace {

using testing::DecodedEvent;
using testing::ReadEvents;

double Now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

EventWriterOptions NoPeriodicFlush() {
  EventWriterOptions o;
  o.flush_period = Duration(0);
  return o;
}

class EventWriterTest : public ::testing::Test {
 protected:
  std::unique_ptr<EventWriter> Open(EventWriterOptions options = NoPeriodicFlush()) {
    auto w = EventWriter::Open(fs_, "/logs/run1", options);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? w.MoveValueUnsafe() : nullptr;
  }
  std::vector<DecodedEvent> Events(const EventWriter& w) {
    auto events = ReadEvents(*fs_, w.path());
    EXPECT_TRUE(events.ok()) << events.status().ToString();
    return events.ValueOr({});
  }

  std::shared_ptr<fs::FileSystem> fs_ = fs::NewMemoryFileSystem();
};

TEST_F(EventWriterTest, FileIsNamedAsTensorFlowNamesItAndStartsWithTheVersion) {
  EventWriterOptions options = NoPeriodicFlush();
  options.file_suffix = ".v2";
  const double before = Now();
  auto w = Open(options);
  ASSERT_NE(w, nullptr);
  const std::string name = w->path().substr(w->path().rfind('/') + 1);
  EXPECT_TRUE(std::regex_match(name, std::regex(R"(events\.out\.tfevents\.\d{10}\.[^/]+\.\d+\.\d+\.v2)")))
      << name;
  EXPECT_EQ(w->path().rfind("/logs/run1/", 0), 0u) << w->path();
  EXPECT_EQ(w->uri(), "mem://" + w->path());
  // Visible at once (Open flushes), before any summary is added.
  std::vector<DecodedEvent> events = Events(*w);
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].file_version, "brain.Event:2");
  EXPECT_GE(events[0].wall_time, std::floor(before));
  EXPECT_LE(events[0].wall_time, Now() + 1);
  EXPECT_TRUE(w->Close().ok());
  // A second writer in the same second gets its own file.
  auto w2 = Open(options);
  ASSERT_NE(w2, nullptr);
  EXPECT_NE(w2->path(), w->path());
}

TEST_F(EventWriterTest, ScalarsRoundTrip) {
  auto w = Open();
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->AddScalar("loss", 0.25, 0).ok());
  ASSERT_TRUE(w->AddScalar("loss", -1.5e3, 1).ok());
  ASSERT_TRUE(w->AddScalar("eval/accuracy", 0.875, 123456789012).ok());
  ASSERT_TRUE(w->AddScalar("neg_step", 3, -7).ok());
  ASSERT_TRUE(w->Close().ok());
  std::vector<DecodedEvent> e = Events(*w);
  ASSERT_EQ(e.size(), 5u);
  EXPECT_EQ(w->events_written(), 5u);
  const std::vector<std::tuple<std::string, int64_t, float>> want = {
      {"loss", 0, 0.25f}, {"loss", 1, -1.5e3f}, {"eval/accuracy", 123456789012, 0.875f}, {"neg_step", -7, 3.0f}};
  for (size_t i = 0; i < want.size(); ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(e[i + 1].tag, std::get<0>(want[i]));
    EXPECT_EQ(e[i + 1].step, std::get<1>(want[i]));
    EXPECT_TRUE(e[i + 1].has_simple_value);
    EXPECT_EQ(e[i + 1].simple_value, std::get<2>(want[i]));
    EXPECT_GE(e[i + 1].wall_time, e[0].wall_time);
  }
}

TEST_F(EventWriterTest, HistogramRoundTrip) {
  auto w = Open();
  ASSERT_NE(w, nullptr);
  const std::vector<double> values = {1.0, 2.0, 2.0, -3.0, 0.0};
  ASSERT_TRUE(w->AddHistogram("weights", values, 5).ok());
  ASSERT_TRUE(w->Close().ok());
  std::vector<DecodedEvent> e = Events(*w);
  ASSERT_EQ(e.size(), 2u);
  const DecodedEvent& h = e[1];
  EXPECT_EQ(h.tag, "weights");
  EXPECT_EQ(h.step, 5);
  ASSERT_TRUE(h.has_histo);
  EXPECT_EQ(h.histo.min, -3.0);
  EXPECT_EQ(h.histo.max, 2.0);
  EXPECT_EQ(h.histo.num, 5.0);
  EXPECT_EQ(h.histo.sum, 2.0);
  EXPECT_EQ(h.histo.sum_squares, 18.0);
  ASSERT_EQ(h.histo.bucket_limit.size(), h.histo.bucket.size());
  double total = 0;
  for (size_t i = 0; i < h.histo.bucket.size(); ++i) {
    total += h.histo.bucket[i];
    if (i > 0) {
      EXPECT_LT(h.histo.bucket_limit[i - 1], h.histo.bucket_limit[i]);
    }
    if (h.histo.bucket[i] == 2.0) {  // the two 2.0s: in the bucket whose upper edge is just above 2
      EXPECT_GT(h.histo.bucket_limit[i], 2.0);
      EXPECT_LT(h.histo.bucket_limit[i], 2.2 + 1e-9);
    }
  }
  EXPECT_EQ(total, 5.0);
}

TEST_F(EventWriterTest, HistogramRefusesNonFiniteValuesNamingTheTag) {
  auto w = Open();
  ASSERT_NE(w, nullptr);
  const std::vector<double> values = {1.0, std::nan("")};
  Status st = w->AddHistogram("layer1/bias", values, 1);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("layer1/bias"), std::string::npos) << st.ToString();
  const std::vector<double> inf = {INFINITY};
  EXPECT_EQ(w->AddHistogram("h", inf, 1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(w->AddHistogram("empty", {}, 2).ok());  // the writer is still fine
  ASSERT_TRUE(w->Close().ok());
  std::vector<DecodedEvent> e = Events(*w);
  ASSERT_EQ(e.size(), 2u);
  EXPECT_EQ(e[1].tag, "empty");
  EXPECT_EQ(e[1].histo.num, 0.0);
}

TEST_F(EventWriterTest, TextAndImageRoundTrip) {
  auto w = Open();
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->AddText("notes", "**hello** from node 0", 3).ok());
  const std::string png("\x89PNG\r\n\x1a\nfake", 12);
  ASSERT_TRUE(w->AddImage("digits", png, 28, 28, 1, 4).ok());
  EXPECT_EQ(w->AddImage("digits", png, 28, 28, 2, 4).code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(w->Close().ok());
  std::vector<DecodedEvent> e = Events(*w);
  ASSERT_EQ(e.size(), 3u);
  EXPECT_EQ(e[1].tag, "notes");
  EXPECT_EQ(e[1].step, 3);
  EXPECT_EQ(e[1].plugin_name, "text");
  EXPECT_EQ(e[1].data_class, kDataClassTensor);
  EXPECT_EQ(e[1].dtype, kDtString);
  EXPECT_TRUE(e[1].has_shape);
  EXPECT_EQ(e[1].string_val, std::vector<std::string>{"**hello** from node 0"});
  EXPECT_EQ(e[2].tag, "digits");
  EXPECT_EQ(e[2].height, 28);
  EXPECT_EQ(e[2].width, 28);
  EXPECT_EQ(e[2].colorspace, 1);
  EXPECT_EQ(e[2].image, png);
}

TEST_F(EventWriterTest, EventsBecomeVisibleOnFlush) {
  auto w = Open();  // no periodic flush
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->AddScalar("loss", 1, 1).ok());
  EXPECT_EQ(Events(*w).size(), 1u);  // still in the file's buffer
  ASSERT_TRUE(w->Flush().ok());
  EXPECT_EQ(Events(*w).size(), 2u);
  ASSERT_TRUE(w->Close().ok());
}

TEST_F(EventWriterTest, FlushesOnItsPeriodBeforeClose) {
  EventWriterOptions options;
  options.flush_period = Duration(20);
  auto w = Open(options);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->AddScalar("loss", 1, 1).ok());
  EXPECT_TRUE(ember::testing::WaitUntil([&] { return Events(*w).size() == 2; }, Duration(5000)));
  ASSERT_TRUE(w->AddScalar("loss", 2, 2).ok());
  EXPECT_TRUE(ember::testing::WaitUntil([&] { return Events(*w).size() == 3; }, Duration(5000)));
  ASSERT_TRUE(w->Close().ok());
}

TEST_F(EventWriterTest, CloseIsIdempotentAndLaterCallsFail) {
  EventWriterOptions options;
  options.flush_period = Duration(3600 * 1000);  // Close must wake the thread, not wait an hour
  auto w = Open(options);
  ASSERT_NE(w, nullptr);
  ASSERT_TRUE(w->AddScalar("loss", 1, 1).ok());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_TRUE(w->Close().ok());
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
  EXPECT_TRUE(w->Close().ok());
  EXPECT_EQ(Events(*w).size(), 2u);  // Close flushed
  Status st = w->AddScalar("loss", 2, 2);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find(w->uri()), std::string::npos) << st.ToString();
  EXPECT_EQ(w->AddText("t", "x", 2).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w->Flush().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w->AddScalar("", 1, 1).code(), StatusCode::kInvalidArgument);
}

TEST_F(EventWriterTest, ConcurrentAddsFromManyThreadsAllArrive) {
  EventWriterOptions options;
  options.flush_period = Duration(1);  // the flush thread races the adders
  auto w = Open(options);
  ASSERT_NE(w, nullptr);
  constexpr int kThreads = 8, kPerThread = 500;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&w, t] {
      const std::vector<double> values = {1.0 * t, 2.0};
      for (int i = 0; i < kPerThread; ++i) {
        EXPECT_TRUE(w->AddScalar("t" + std::to_string(t), i, i).ok());
        if (i % 100 == 0) {
          EXPECT_TRUE(w->AddHistogram("h" + std::to_string(t), values, i).ok());
        }
        if (i % 250 == 0) {
          EXPECT_TRUE(w->Flush().ok());
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(w->Close().ok());
  std::vector<DecodedEvent> e = Events(*w);
  ASSERT_EQ(e.size(), 1u + kThreads * (kPerThread + kPerThread / 100));
  std::map<std::string, std::vector<int64_t>> steps;
  for (size_t i = 1; i < e.size(); ++i) {
    if (e[i].has_simple_value) {
      EXPECT_EQ(e[i].simple_value, static_cast<float>(e[i].step));
      steps[e[i].tag].push_back(e[i].step);
    }
  }
  ASSERT_EQ(steps.size(), static_cast<size_t>(kThreads));
  for (auto& [tag, s] : steps) {
    ASSERT_EQ(s.size(), static_cast<size_t>(kPerThread)) << tag;
    for (int i = 0; i < kPerThread; ++i) EXPECT_EQ(s[i], i) << tag;  // each thread's order kept
  }
}

// Counts the Flush calls reaching the files of a file system (an idle writer
// must not make them: on HDFS each is a request).
class FlushCountingFs final : public fs::FileSystem {
 public:
  explicit FlushCountingFs(std::shared_ptr<fs::FileSystem> base) : base_(std::move(base)) {}
  int flushes() const { return flushes_.load(); }

  Result<std::unique_ptr<fs::WritableFile>> NewWritableFile(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(auto f, base_->NewWritableFile(path));
    return std::unique_ptr<fs::WritableFile>(new File(std::move(f), &flushes_));
  }
  Result<std::unique_ptr<fs::SequentialFile>> NewSequentialFile(const std::string& p) override {
    return base_->NewSequentialFile(p);
  }
  Result<std::unique_ptr<fs::RandomAccessFile>> NewRandomAccessFile(const std::string& p) override {
    return base_->NewRandomAccessFile(p);
  }
  Result<fs::FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  Result<std::vector<fs::FileInfo>> List(const std::string& p) override { return base_->List(p); }
  Status CreateDir(const std::string& p) override { return base_->CreateDir(p); }
  Status Delete(const std::string& p) override { return base_->Delete(p); }
  Status DeleteRecursively(const std::string& p) override { return base_->DeleteRecursively(p); }
  Status Rename(const std::string& a, const std::string& b) override { return base_->Rename(a, b); }
  std::string scheme() const override { return base_->scheme(); }
  std::string Uri(const std::string& p) const override { return base_->Uri(p); }

 private:
  class File final : public fs::WritableFile {
   public:
    File(std::unique_ptr<fs::WritableFile> f, std::atomic<int>* n) : f_(std::move(f)), n_(n) {}
    Status Append(std::span<const uint8_t> d) override { return f_->Append(d); }
    Status Flush() override {
      ++*n_;
      return f_->Flush();
    }
    Status Sync() override { return f_->Sync(); }
    Status Close() override { return f_->Close(); }
    const std::string& uri() const override { return f_->uri(); }

   private:
    std::unique_ptr<fs::WritableFile> f_;
    std::atomic<int>* n_;
  };
  std::shared_ptr<fs::FileSystem> base_;
  std::atomic<int> flushes_{0};
};

TEST(EventWriterIdleTest, AnIdleWriterDoesNotFlush) {
  auto counting = std::make_shared<FlushCountingFs>(fs::NewMemoryFileSystem());
  EventWriterOptions options;
  options.flush_period = Duration(2);
  auto w = EventWriter::Open(counting, "/logs", options);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const int after_open = counting->flushes();  // the file_version event's
  EXPECT_GE(after_open, 1);
  ASSERT_TRUE((*w)->AddScalar("loss", 1, 1).ok());
  EXPECT_TRUE(ember::testing::WaitUntil([&] { return counting->flushes() == after_open + 1; }));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // ~50 periods with nothing new
  EXPECT_EQ(counting->flushes(), after_open + 1);
  EXPECT_TRUE((*w)->Flush().ok());  // nothing new: no flush either
  EXPECT_EQ(counting->flushes(), after_open + 1);
  EXPECT_TRUE((*w)->Close().ok());
}

class EventWriterFaultTest : public ::testing::Test {
 protected:
  std::shared_ptr<fs::FileSystem> base_ = fs::NewMemoryFileSystem();
  std::shared_ptr<fs::FaultInjectionFileSystem> fault_ = std::make_shared<fs::FaultInjectionFileSystem>(base_);
};

TEST_F(EventWriterFaultTest, AFailedWriteIsReportedNamingTheFileAndSticks) {
  EventWriterOptions options;
  options.flush_period = Duration(1);
  auto w = EventWriter::Open(fault_, "/logs", options);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->AddScalar("loss", 1, 1).ok());
  fault_->FailNth(fs::FaultOp::kAppend, 1);
  Status st = (*w)->AddScalar("loss", 2, 2);
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find((*w)->uri()), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("injected"), std::string::npos) << st.ToString();
  // The file has a torn record now: every later call reports the same error.
  EXPECT_EQ((*w)->AddScalar("loss", 3, 3), st);
  EXPECT_EQ((*w)->Flush(), st);
  EXPECT_EQ((*w)->Close(), st);
  EXPECT_EQ((*w)->Close(), st);
}

TEST_F(EventWriterFaultTest, OpenFailsNamingTheFileWhenTheFirstWriteFails) {
  fault_->FailNth(fs::FaultOp::kAppend, 1);
  auto w = EventWriter::Open(fault_, "/logs");
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), StatusCode::kIOError);
  EXPECT_NE(w.status().message().find("mem:///logs/events.out.tfevents."), std::string::npos)
      << w.status().ToString();
}

TEST_F(EventWriterFaultTest, AFailedCloseIsReported) {
  auto w = EventWriter::Open(fault_, "/logs");
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE((*w)->AddScalar("loss", 1, 1).ok());
  fault_->FailNth(fs::FaultOp::kClose, 1);
  Status st = (*w)->Close();
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find((*w)->uri()), std::string::npos) << st.ToString();
  EXPECT_EQ((*w)->Close(), st);
}

TEST(NodeLogDirTest, OneDirectoryPerNode) {
  EXPECT_EQ(NodeLogDir("hdfs://nn:8020/logs", "worker", 1), "hdfs://nn:8020/logs/worker_1");
  EXPECT_EQ(NodeLogDir("/tmp/logs/", "chief", 0), "/tmp/logs/chief_0");
  EXPECT_EQ(NodeLogDir("/", "ps", 2), "/ps_2");
}

TEST(EventWriterOpenTest, RefusesAMissingFileSystemOrDirectory) {
  EXPECT_EQ(EventWriter::Open(nullptr, "/x").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EventWriter::Open(fs::NewMemoryFileSystem(), "").status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ember::summary
