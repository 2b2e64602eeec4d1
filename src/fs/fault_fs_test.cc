// FaultInjectionFileSystem, and AtomicWriteFile under each of its faults:
// the old file must survive every one.
#include "fs/fault_fs.h"

#include <gtest/gtest.h>

#include <string>

namespace ember::fs {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class FaultFsTest : public ::testing::Test {
 protected:
  std::shared_ptr<FileSystem> base_ = NewMemoryFileSystem();
  FaultInjectionFileSystem fault_{base_};
};

TEST_F(FaultFsTest, FailsTheNthCallOnly) {
  fault_.FailNth(FaultOp::kAppend, 2);
  auto f = fault_.NewWritableFile("/f");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Append(Bytes("a")).ok());
  Status st = (*f)->Append(Bytes("b"));
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_NE(st.message().find("injected"), std::string::npos) << st.ToString();
  EXPECT_TRUE((*f)->Append(Bytes("c")).ok());
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_EQ(ReadFile(*base_, "/f").ValueOr(""), "ac");
  EXPECT_EQ(fault_.count(FaultOp::kAppend), 3);
}

TEST_F(FaultFsTest, TornWriteKeepsAPrefix) {
  fault_.FailAppendAfterBytes(5);
  auto f = fault_.NewWritableFile("/f");
  ASSERT_TRUE(f.ok());
  EXPECT_TRUE((*f)->Append(Bytes("abc")).ok());
  EXPECT_EQ((*f)->Append(Bytes("defgh")).code(), StatusCode::kIOError);
  EXPECT_TRUE((*f)->Append(Bytes("X")).ok());  // one-shot
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_EQ(ReadFile(*base_, "/f").ValueOr(""), "abcdeX");
}

TEST_F(FaultFsTest, CrashDropsWhatWasNotSynced) {
  auto f = fault_.NewWritableFile("/synced");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append(Bytes("durable")).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Append(Bytes("-lost")).ok());
  auto g = fault_.NewWritableFile("/never");
  ASSERT_TRUE(g.ok());
  ASSERT_TRUE((*g)->Append(Bytes("gone")).ok());
  ASSERT_TRUE((*g)->Close().ok());  // closed but never synced
  ASSERT_TRUE(fault_.Crash().ok());
  EXPECT_EQ(ReadFile(*base_, "/synced").ValueOr("?"), "durable");
  EXPECT_EQ(base_->Stat("/never").status().code(), StatusCode::kNotFound);
  EXPECT_EQ((*f)->Append(Bytes("x")).code(), StatusCode::kIOError);  // dead after the crash
}

TEST_F(FaultFsTest, RenameCarriesSyncState) {
  auto f = fault_.NewWritableFile("/tmp1");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append(Bytes("abc")).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Close().ok());
  ASSERT_TRUE(fault_.Rename("/tmp1", "/final").ok());
  ASSERT_TRUE(fault_.Crash().ok());
  EXPECT_EQ(ReadFile(*base_, "/final").ValueOr("?"), "abc");
}

// The old file survives whichever step of AtomicWriteFile fails, and no
// temporary is left behind.
struct Fault {
  const char* name;
  FaultOp op;
  int nth;         // 0: a torn write instead
  bool crash;      // then crash
};

class AtomicWriteUnderFaults : public ::testing::TestWithParam<Fault> {};

TEST_P(AtomicWriteUnderFaults, OldFileIntact) {
  const Fault& f = GetParam();
  auto base = NewMemoryFileSystem();
  FaultInjectionFileSystem fault(base);
  ASSERT_TRUE(AtomicWriteFile(fault, "/dir/ckpt", Bytes("old contents")).ok());
  if (f.nth > 0) {
    fault.FailNth(f.op, f.nth);
  } else {
    fault.FailAppendAfterBytes(4);
  }
  Status st = AtomicWriteFile(fault, "/dir/ckpt", Bytes("new contents, longer"));
  EXPECT_EQ(st.code(), StatusCode::kIOError) << f.name;
  EXPECT_NE(st.message().find("/dir/ckpt"), std::string::npos) << st.ToString();
  if (f.crash) {
    ASSERT_TRUE(fault.Crash().ok());
  }
  EXPECT_EQ(ReadFile(*base, "/dir/ckpt").ValueOr("?"), "old contents") << f.name;
  auto list = base->List("/dir");
  ASSERT_TRUE(list.ok());
  EXPECT_EQ(list->size(), 1u) << f.name << ": a temporary was left";
}

INSTANTIATE_TEST_SUITE_P(
    AllFaults, AtomicWriteUnderFaults,
    ::testing::Values(Fault{"append", FaultOp::kAppend, 1, false}, Fault{"sync", FaultOp::kSync, 1, false},
                      Fault{"close", FaultOp::kClose, 1, false}, Fault{"rename", FaultOp::kRename, 1, false},
                      Fault{"torn", FaultOp::kAppend, 0, false}, Fault{"append_crash", FaultOp::kAppend, 1, true},
                      Fault{"sync_crash", FaultOp::kSync, 1, true}, Fault{"rename_crash", FaultOp::kRename, 1, true}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(AtomicWriteCrashTest, SyncedAndRenamedSurvivesACrash) {
  auto base = NewMemoryFileSystem();
  FaultInjectionFileSystem fault(base);
  ASSERT_TRUE(AtomicWriteFile(fault, "/c", Bytes("v1")).ok());
  ASSERT_TRUE(fault.Crash().ok());
  EXPECT_EQ(ReadFile(*base, "/c").ValueOr("?"), "v1");
}

}  // namespace
}  // namespace ember::fs
