// CheckpointManager under injected faults (fs/fault_fs.h) and damaged files:
// a Save that fails at any point never leaves a checkpoint that Restore would
// pick, and a blob damaged after its Save is refused.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/checkpoint_test_util.h"
#include "common/test_util.h"
#include "ember/checkpoint.h"
#include "fs/fault_fs.h"

namespace ember::checkpoint {
namespace {

using fs::FaultOp;
using testing::Blobs;
using testing::SaveMap;
using testing::Steps;

const Blobs kV1 = {{"model", std::string(5000, 'm')}, {"opt", std::string(300, 'o')}, {"meta", "1"}};
const Blobs kV2 = {{"model", std::string(5000, 'M')}, {"opt", std::string(301, 'O')}, {"meta", "2"}};
const char kDir[] = "/job/ckpt";

struct Fixture {
  std::shared_ptr<fs::FileSystem> base = fs::NewMemoryFileSystem();
  std::shared_ptr<fs::FaultInjectionFileSystem> fault = std::make_shared<fs::FaultInjectionFileSystem>(base);
  std::unique_ptr<CheckpointManager> m;

  explicit Fixture(int keep = 1, bool sync = true) {
    CheckpointOptions o;
    o.keep = keep;
    o.sync = sync;
    auto r = CheckpointManager::Open(fault, kDir, o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (r.ok()) m = std::move(*r);
  }

  std::vector<std::string> Entries() {
    std::vector<std::string> out;
    auto l = base->List(kDir);
    if (l.ok()) {
      for (const auto& e : *l) out.push_back(e.name);
    }
    return out;
  }
};

// Calls of `op` one Save of kV2 makes after a Save of kV1 at `first_step`.
int CallsPerSave(FaultOp op, int64_t first_step, int64_t second_step) {
  Fixture f;
  EXPECT_TRUE(SaveMap(*f.m, first_step, kV1).ok());
  const int before = f.fault->count(op);
  EXPECT_TRUE(SaveMap(*f.m, second_step, kV2).ok());
  return f.fault->count(op) - before;
}

// Step 1 is saved; then the Save of `second_step` fails at each call of each
// kind it makes.  Step 1 must stay what Latest and Restore return, nothing
// but it may be left, and the next Save must work.
void FailEveryCall(int64_t second_step) {
  for (FaultOp op : {FaultOp::kAppend, FaultOp::kSync, FaultOp::kClose, FaultOp::kRename}) {
    const int calls = CallsPerSave(op, 1, second_step);
    ASSERT_GT(calls, 0);
    for (int n = 1; n <= calls; ++n) {
      SCOPED_TRACE("op " + std::to_string(static_cast<int>(op)) + " call " + std::to_string(n));
      Fixture f;
      ASSERT_TRUE(SaveMap(*f.m, 1, kV1).ok());
      f.fault->FailNth(op, n);
      ember::testing::WarningCapture warnings;
      Status st = SaveMap(*f.m, second_step, kV2);
      if (st.ok()) {
        // The fault hit the deletion of step 1 after the commit: the new
        // checkpoint is saved, the old one stays until the next Save.
        EXPECT_EQ(op, FaultOp::kRename);
        EXPECT_EQ(warnings.Count("cannot delete"), 1);
        EXPECT_EQ(Steps(*f.m), (std::vector<int64_t>{1, second_step}));
        auto c = f.m->Restore();
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        EXPECT_EQ(c->blobs, kV2);
        ASSERT_TRUE(SaveMap(*f.m, 3, kV2).ok());
        EXPECT_EQ(f.Entries(), std::vector<std::string>{"ckpt-0000000003"});
        continue;
      }
      EXPECT_NE(st.message().find("injected"), std::string::npos) << st.ToString();
      EXPECT_NE(st.message().find("step " + std::to_string(second_step)), std::string::npos) << st.ToString();
      EXPECT_NE(st.message().find(f.m->uri()), std::string::npos) << st.ToString();

      auto latest = f.m->Latest();
      ASSERT_TRUE(latest.ok() && latest->has_value());
      EXPECT_EQ((*latest)->step, 1);
      auto c = f.m->Restore();
      ASSERT_TRUE(c.ok()) << c.status().ToString();
      EXPECT_EQ(c->step, 1);
      EXPECT_EQ(c->blobs, kV1);
      EXPECT_EQ(f.Entries(), std::vector<std::string>{"ckpt-0000000001"});

      f.fault->ClearFaults();
      ASSERT_TRUE(SaveMap(*f.m, 3, kV2).ok());
      EXPECT_EQ(Steps(*f.m), std::vector<int64_t>{3});
      EXPECT_EQ(f.Entries(), std::vector<std::string>{"ckpt-0000000003"});
    }
  }
}

TEST(CheckpointFault, FailureAtAnyCallKeepsThePreviousCheckpoint) { FailEveryCall(2); }

TEST(CheckpointFault, FailureWhileReplacingAStepKeepsTheOldOne) {
  EXPECT_EQ(CallsPerSave(FaultOp::kRename, 1, 1), 2);  // old aside, new in
  FailEveryCall(1);
}

TEST(CheckpointFault, TornWriteAtAnyByteKeepsThePreviousCheckpoint) {
  for (uint64_t k = 0; k < 5000; k += 53) {
    SCOPED_TRACE("torn after " + std::to_string(k));
    Fixture f;
    ASSERT_TRUE(SaveMap(*f.m, 1, kV1).ok());
    f.fault->FailAppendAfterBytes(k);
    Status st = SaveMap(*f.m, 2, kV2);
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find("torn"), std::string::npos) << st.ToString();
    auto c = f.m->Restore();
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ(c->blobs, kV1);
    EXPECT_EQ(f.Entries(), std::vector<std::string>{"ckpt-0000000001"});
  }
}

TEST(CheckpointFault, SyncedCheckpointsSurviveACrash) {
  Fixture f(/*keep=*/3);
  ASSERT_TRUE(SaveMap(*f.m, 1, kV1).ok());
  ASSERT_TRUE(SaveMap(*f.m, 2, kV2).ok());
  ASSERT_TRUE(f.fault->Crash().ok());
  auto c = f.m->Restore();
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->step, 2);
  EXPECT_EQ(c->blobs, kV2);
}

// Without sync, a crash loses the files' bytes; what is left must look like
// no checkpoint, not like a damaged one (the MANIFEST goes with the blobs).
TEST(CheckpointFault, UnsyncedCheckpointsLostInACrashAreNotListed) {
  Fixture f(/*keep=*/3, /*sync=*/false);
  ASSERT_TRUE(SaveMap(*f.m, 1, kV1).ok());
  ASSERT_TRUE(f.fault->Crash().ok());
  EXPECT_TRUE(Steps(*f.m).empty());
  EXPECT_EQ(f.m->Restore().status().code(), StatusCode::kNotFound);
}

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto r = CheckpointManager::Open(fs_, kDir, {});
    ASSERT_TRUE(r.ok());
    m_ = std::move(*r);
    ASSERT_TRUE(SaveMap(*m_, 1, kV1).ok());
    ASSERT_TRUE(SaveMap(*m_, 2, kV2).ok());
  }
  std::string Blob(const std::string& name) { return std::string(kDir) + "/ckpt-0000000002/" + name; }

  // Restore() fails with Corruption naming `name`'s file and saying `why`;
  // with fall_back_to_older it restores step 1 and logs a warning.
  void ExpectRefused(const std::string& name, const std::string& why) {
    auto c = m_->Restore();
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
    EXPECT_NE(c.status().message().find(fs_->Uri(Blob(name))), std::string::npos) << c.status().ToString();
    EXPECT_NE(c.status().message().find(why), std::string::npos) << c.status().ToString();
    RestoreOptions exact;
    exact.step = 2;
    EXPECT_EQ(m_->Restore(exact).status().code(), StatusCode::kCorruption);

    ember::testing::WarningCapture warnings;
    RestoreOptions fall_back;
    fall_back.fall_back_to_older = true;
    auto older = m_->Restore(fall_back);
    ASSERT_TRUE(older.ok()) << older.status().ToString();
    EXPECT_EQ(older->step, 1);
    EXPECT_EQ(older->blobs, kV1);
    EXPECT_EQ(warnings.Count("ckpt-0000000002"), 1);
  }

  std::shared_ptr<fs::FileSystem> fs_ = fs::NewMemoryFileSystem();
  std::unique_ptr<CheckpointManager> m_;
};

TEST_F(CorruptionTest, AFlippedByteIsRefused) {
  std::string bytes = *fs::ReadFile(*fs_, Blob("model"));
  bytes[1234] ^= 0x10;
  testing::WriteFile(*fs_, Blob("model"), bytes);
  ExpectRefused("model", "CRC32C");
}

TEST_F(CorruptionTest, ATruncatedBlobIsRefused) {
  testing::WriteFile(*fs_, Blob("opt"), "O");
  ExpectRefused("opt", "301");
}

TEST_F(CorruptionTest, AMissingBlobIsRefused) {
  ASSERT_TRUE(fs_->Delete(Blob("meta")).ok());
  ExpectRefused("meta", "missing");
}

TEST_F(CorruptionTest, ADamagedManifestHidesTheCheckpoint) {
  std::string bytes = *fs::ReadFile(*fs_, Blob("MANIFEST"));
  bytes[20] ^= 1;
  testing::WriteFile(*fs_, Blob("MANIFEST"), bytes);
  EXPECT_EQ(Steps(*m_), std::vector<int64_t>{1});
  auto c = m_->Restore();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->step, 1);
}

}  // namespace
}  // namespace ember::checkpoint
