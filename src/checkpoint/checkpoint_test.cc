// CheckpointManager (include/ember/checkpoint.h) over the in-memory and the
// local file systems: round trips, keep-K, replacement, readers during saves.
// Faults and damage: checkpoint_fault_test.cc.
#include "ember/checkpoint.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "ember/deadline.h"

namespace ember::checkpoint {
namespace {

using testing::Blobs;
using testing::SaveMap;
using testing::Steps;

class CheckpointTest : public ::testing::TestWithParam<std::string> {
 public:
  void SetUp() override {
    if (GetParam() == "local") {
      fs_ = fs::LocalFileSystem();
      char tmpl[] = "/tmp/ember_ckpt_test_XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      root_ = tmpl;
    } else {
      fs_ = fs::NewMemoryFileSystem();
      root_ = "/root";
    }
    dir_ = root_ + "/ckpts";
  }
  void TearDown() override {
    if (fs_) {
      EXPECT_TRUE(fs_->DeleteRecursively(root_).ok());
    }
  }

  std::unique_ptr<CheckpointManager> Open(int keep = 3) {
    CheckpointOptions o;
    o.keep = keep;
    auto m = CheckpointManager::Open(fs_, dir_, o);
    EXPECT_TRUE(m.ok()) << m.status().ToString();
    return m.ok() ? std::move(*m) : nullptr;
  }

  std::vector<std::string> Entries() {
    std::vector<std::string> out;
    auto l = fs_->List(dir_);
    EXPECT_TRUE(l.ok());
    if (l.ok()) {
      for (const auto& e : *l) out.push_back(e.name);
    }
    return out;
  }

  std::shared_ptr<fs::FileSystem> fs_;
  std::string root_, dir_;
};

TEST_P(CheckpointTest, SaveThenRestoreRoundTrips) {
  auto m = Open();
  ASSERT_TRUE(m);
  EXPECT_FALSE(m->Latest()->has_value());
  auto none = m->Restore();
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  EXPECT_NE(none.status().message().find(m->uri()), std::string::npos) << none.status().ToString();

  std::string big(3 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7919 % 251);
  ASSERT_TRUE(SaveMap(*m, 7, {{"model.npz", big}, {"empty", ""}, {"meta", "epoch=7"}}).ok());

  auto latest = m->Latest();
  ASSERT_TRUE(latest.ok() && latest->has_value());
  EXPECT_EQ((*latest)->step, 7);
  ASSERT_EQ((*latest)->blobs.size(), 3u);
  EXPECT_EQ((*latest)->blobs[0].name, "empty");  // sorted by name
  auto c = m->Restore();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->step, 7);
  EXPECT_EQ(c->blobs, (Blobs{{"model.npz", big}, {"empty", ""}, {"meta", "epoch=7"}}));
  EXPECT_EQ(Entries(), std::vector<std::string>{"ckpt-0000000007"});  // no temporary left

  // A second manager (a restarted process) sees the same.
  auto again = Open();
  auto c2 = again->Restore();
  ASSERT_TRUE(c2.ok());
  EXPECT_EQ(c2->blobs, c->blobs);
}

TEST_P(CheckpointTest, KeepsTheNewestK) {
  auto m = Open(/*keep=*/2);
  for (int64_t step : {3, 1, 10, 5, 20}) {
    ASSERT_TRUE(SaveMap(*m, step, {{"x", std::to_string(step)}}).ok());
  }
  // Kept by step, not by age: 10 and 20 (5 was saved after 10 but is older).
  EXPECT_EQ(Steps(*m), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(Entries(), (std::vector<std::string>{"ckpt-0000000010", "ckpt-0000000020"}));
  RestoreOptions o;
  o.step = 10;
  auto c = m->Restore(o);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->blobs.at("x"), "10");
  o.step = 5;
  EXPECT_EQ(m->Restore(o).status().code(), StatusCode::kNotFound);
}

TEST_P(CheckpointTest, SavingAStepAgainReplacesIt) {
  auto m = Open();
  ASSERT_TRUE(SaveMap(*m, 1, {{"x", "one"}}).ok());
  ASSERT_TRUE(SaveMap(*m, 2, {{"x", "first"}, {"y", "gone later"}}).ok());
  ASSERT_TRUE(SaveMap(*m, 2, {{"x", "second"}}).ok());
  EXPECT_EQ(Steps(*m), (std::vector<int64_t>{1, 2}));
  auto c = m->Restore();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->blobs, (Blobs{{"x", "second"}}));
  EXPECT_EQ(Entries(), (std::vector<std::string>{"ckpt-0000000001", "ckpt-0000000002"}));
}

TEST_P(CheckpointTest, RefusesBadArguments) {
  CheckpointOptions o;
  o.keep = 0;
  EXPECT_EQ(CheckpointManager::Open(fs_, dir_, o).status().code(), StatusCode::kInvalidArgument);
  auto m = Open();
  EXPECT_EQ(SaveMap(*m, -1, {{"x", "1"}}).code(), StatusCode::kInvalidArgument);
  for (const char* name : {"", ".x", "MANIFEST", "a/b", "../a"}) {
    Status st = SaveMap(*m, 1, {{name, "1"}});
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << name;
  }
  std::vector<BlobRef> twice = {{"a", "1"}, {"a", "2"}};
  EXPECT_EQ(m->Save(1, twice).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Entries().empty());
}

TEST_P(CheckpointTest, IgnoresWhatIsNotACompleteCheckpoint) {
  auto m = Open();
  ASSERT_TRUE(SaveMap(*m, 1, {{"x", "one"}}).ok());
  // What a chief killed during a Save leaves, and other debris.
  testing::WriteFile(*fs_, dir_ + "/.tmp-ckpt-5-123-4-0/x", "half");
  testing::WriteFile(*fs_, dir_ + "/.tmp-ckpt-6-123-4-1/x", "whole");
  testing::WriteFile(*fs_, dir_ + "/.tmp-ckpt-6-123-4-1/MANIFEST", "ember-checkpoint 1\n");
  testing::WriteFile(*fs_, dir_ + "/ckpt-0000000000/x", "no manifest");
  testing::WriteFile(*fs_, dir_ + "/ckpt-0000000009/MANIFEST", "ember-checkpoint 1\nstep 9\ncrc 00000000\n");
  testing::WriteFile(*fs_, dir_ + "/ckpt-9/x", "not our name");
  testing::WriteFile(*fs_, dir_ + "/notes.txt", "the user's file");
  EXPECT_EQ(Steps(*m), std::vector<int64_t>{1});
  auto c = m->Restore();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->step, 1);

  // The next Save deletes the temporaries and the invalid checkpoint older
  // than the newest; ckpt-9 and the user's file are not its own names.
  ASSERT_TRUE(SaveMap(*m, 2, {{"x", "two"}}).ok());
  EXPECT_EQ(Entries(), (std::vector<std::string>{"ckpt-0000000001", "ckpt-0000000002", "ckpt-0000000009",
                                                 "ckpt-9", "notes.txt"}));
  ASSERT_TRUE(SaveMap(*m, 10, {{"x", "ten"}}).ok());
  EXPECT_EQ(Steps(*m), (std::vector<int64_t>{1, 2, 10}));
  EXPECT_EQ(Entries(), (std::vector<std::string>{"ckpt-0000000001", "ckpt-0000000002", "ckpt-0000000010",
                                                 "ckpt-9", "notes.txt"}));
}

// One chief saves while readers restore the newest checkpoint over and over.
// Every restore must be a whole, verified checkpoint, never older than one the
// same reader saw before.  A reader often loses the checkpoint it is reading
// (the saver deletes it) and must then read the newer one.  Over the
// in-memory file system (whose List is a snapshot, as HDFS's LISTSTATUS of a
// small directory is) a reader always finds one.  A local listing is a
// readdir(3) scan, no snapshot: one that a preempted reader spreads over
// several saves can miss every checkpoint, so there NotFound is allowed,
// never a damaged or mixed checkpoint (docs/architecture.md, "Checkpoints").
void ReadersDuringSaves(CheckpointTest* t, int keep) {
  auto saver = t->Open(keep);
  constexpr int64_t kSteps = 40;
  std::atomic<bool> done{false};
  std::atomic<int> restored{0}, missed{0};
  auto content = [](int64_t step) {
    return Blobs{{"a", std::string(1000 + step * 37, static_cast<char>('a' + step % 26))},
                 {"b", std::to_string(step)}};
  };
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      auto m = t->Open(keep);  // its own manager, as another process would have
      int64_t last = -1;
      while (!done.load()) {
        auto c = m->Restore();
        if (!c.ok()) {
          EXPECT_EQ(c.status().code(), StatusCode::kNotFound) << "reader " << r << ": " << c.status().ToString();
          if (last != -1) missed.fetch_add(1);
          continue;
        }
        EXPECT_GE(c->step, last);
        last = c->step;
        EXPECT_EQ(c->blobs, content(c->step));
        restored.fetch_add(1);
      }
    });
  }
  // At least kSteps saves, and on until the readers restored 30 times (10 s at most).
  const Deadline deadline = Deadline::After(Duration(10000));
  int64_t step = 0;
  while (step < kSteps || (restored.load() < 30 && !deadline.expired())) {
    ++step;
    Status st = SaveMap(*saver, step, content(step));
    EXPECT_TRUE(st.ok()) << st.ToString();
    if (!st.ok()) break;  // (the readers are still joined)
  }
  done.store(true);
  for (auto& th : readers) th.join();
  EXPECT_GE(restored.load(), 30);
  if (t->GetParam() == "memory") {
    EXPECT_EQ(missed.load(), 0);
  }
  EXPECT_EQ(Steps(*saver).back(), step);
}

TEST_P(CheckpointTest, ReadersDuringSavesSeeWholeCheckpoints) { ReadersDuringSaves(this, 2); }
TEST_P(CheckpointTest, ReadersDuringSavesKeepingOneSeeWholeCheckpoints) { ReadersDuringSaves(this, 1); }

INSTANTIATE_TEST_SUITE_P(Backends, CheckpointTest, ::testing::Values("local", "memory"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace ember::checkpoint
