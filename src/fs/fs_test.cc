// The FileSystem contract (include/ember/fs.h), run over the local and the
// in-memory file systems alike.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "ember/fs.h"

namespace ember::fs {
namespace {

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

class FsContractTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (GetParam() == "local") {
      fs_ = LocalFileSystem();
      char tmpl[] = "/tmp/ember_fs_test_XXXXXX";
      ASSERT_NE(::mkdtemp(tmpl), nullptr);
      root_ = tmpl;
    } else {
      fs_ = NewMemoryFileSystem();
      root_ = "/root";
      ASSERT_TRUE(fs_->CreateDir(root_).ok());
    }
  }
  void TearDown() override {
    if (fs_) {
      EXPECT_TRUE(fs_->DeleteRecursively(root_).ok());
    }
  }

  std::string P(const std::string& rel) { return root_ + "/" + rel; }

  void Write(const std::string& path, std::string_view data) {
    auto f = fs_->NewWritableFile(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_TRUE((*f)->Append(Bytes(data)).ok());
    ASSERT_TRUE((*f)->Close().ok());
  }

  std::string ReadAll(const std::string& path) {
    auto f = fs_->NewSequentialFile(path);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (!f.ok()) return "";
    std::string out;
    uint8_t buf[7];  // odd size: many short reads
    for (;;) {
      auto n = (*f)->Read(buf);
      EXPECT_TRUE(n.ok());
      if (!n.ok() || *n == 0) break;
      out.append(reinterpret_cast<char*>(buf), *n);
    }
    return out;
  }

  std::shared_ptr<FileSystem> fs_;
  std::string root_;
};

TEST_P(FsContractTest, WriteThenReadSequential) {
  std::string data;
  for (int i = 0; i < 100000; ++i) data.push_back(static_cast<char>(i * 7));
  auto f = fs_->NewWritableFile(P("a.bin"));
  ASSERT_TRUE(f.ok());
  // Many small appends and one larger than any buffer.
  for (size_t i = 0; i < 1000; ++i) ASSERT_TRUE((*f)->Append(Bytes(std::string_view(data).substr(i * 10, 10))).ok());
  ASSERT_TRUE((*f)->Append(Bytes(std::string_view(data).substr(10000))).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_TRUE((*f)->Close().ok());  // idempotent
  EXPECT_EQ((*f)->Append(Bytes("x")).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ReadAll(P("a.bin")), data);
  auto st = fs_->Stat(P("a.bin"));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->size, data.size());
  EXPECT_FALSE(st->is_dir);
  EXPECT_EQ(st->name, "a.bin");
  EXPECT_GT(st->mtime_ms, 0);
}

TEST_P(FsContractTest, FlushMakesBytesVisible) {
  auto w = fs_->NewWritableFile(P("f"));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(Bytes("hello")).ok());
  ASSERT_TRUE((*w)->Flush().ok());
  EXPECT_EQ(ReadAll(P("f")), "hello");
  ASSERT_TRUE((*w)->Close().ok());
}

TEST_P(FsContractTest, SkipAndEof) {
  Write(P("s"), "0123456789");
  auto f = fs_->NewSequentialFile(P("s"));
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Skip(3).ok());
  uint8_t buf[4];
  auto n = (*f)->Read(buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 4u);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), 4), "3456");
  ASSERT_TRUE((*f)->Skip(100).ok());
  n = (*f)->Read(buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  EXPECT_NE((*f)->uri().find("s"), std::string::npos);
}

TEST_P(FsContractTest, RandomAccess) {
  Write(P("r"), "abcdefghij");
  auto f = fs_->NewRandomAccessFile(P("r"));
  ASSERT_TRUE(f.ok());
  auto size = (*f)->Size();
  ASSERT_TRUE(size.ok());
  EXPECT_EQ(*size, 10u);
  uint8_t buf[4];
  auto n = (*f)->ReadAt(8, buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 2u);
  EXPECT_EQ(buf[0], 'i');
  n = (*f)->ReadAt(20, buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(*n, 0u);
  // Concurrent readers.
  std::vector<std::thread> ts;
  std::atomic<int> bad{0};
  for (int t = 0; t < 4; ++t) {
    ts.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        uint8_t b[1];
        auto r = (*f)->ReadAt((t + i) % 10, b);
        if (!r.ok() || *r != 1 || b[0] != 'a' + (t + i) % 10) ++bad;
      }
    });
  }
  for (auto& t : ts) t.join();
  EXPECT_EQ(bad.load(), 0);
}

TEST_P(FsContractTest, MissingFilesAreNotFoundAndNamed) {
  auto s = fs_->NewSequentialFile(P("nope"));
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), StatusCode::kNotFound);
  EXPECT_NE(s.status().message().find("nope"), std::string::npos) << s.status().ToString();
  EXPECT_EQ(fs_->NewRandomAccessFile(P("nope")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(fs_->Stat(P("nope")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(fs_->List(P("nope")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(fs_->Delete(P("nope")).code(), StatusCode::kNotFound);
  EXPECT_TRUE(fs_->DeleteRecursively(P("nope")).ok());
  EXPECT_EQ(fs_->Rename(P("nope"), P("other")).code(), StatusCode::kNotFound);
}

TEST_P(FsContractTest, WritableCreatesParentsAndTruncates) {
  Write(P("x/y/z/f"), "long content");
  Write(P("x/y/z/f"), "short");
  EXPECT_EQ(ReadAll(P("x/y/z/f")), "short");
  auto st = fs_->Stat(P("x/y"));
  ASSERT_TRUE(st.ok());
  EXPECT_TRUE(st->is_dir);
}

TEST_P(FsContractTest, ListIsSortedWithKinds) {
  Write(P("d/b"), "22");
  Write(P("d/a"), "1");
  Write(P("d/c/inner"), "333");
  ASSERT_TRUE(fs_->CreateDir(P("d/_empty")).ok());
  auto l = fs_->List(P("d"));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_EQ(l->size(), 4u);
  EXPECT_EQ((*l)[0].name, "_empty");
  EXPECT_TRUE((*l)[0].is_dir);
  EXPECT_EQ((*l)[1].name, "a");
  EXPECT_EQ((*l)[1].size, 1u);
  EXPECT_EQ((*l)[2].name, "b");
  EXPECT_EQ((*l)[2].size, 2u);
  EXPECT_EQ((*l)[3].name, "c");
  EXPECT_TRUE((*l)[3].is_dir);
}

TEST_P(FsContractTest, CreateDirIsIdempotentWithParents) {
  ASSERT_TRUE(fs_->CreateDir(P("p/q/r")).ok());
  ASSERT_TRUE(fs_->CreateDir(P("p/q/r")).ok());
  ASSERT_TRUE(fs_->CreateDir(P("p/q")).ok());
  auto l = fs_->List(P("p/q/r"));
  ASSERT_TRUE(l.ok());
  EXPECT_TRUE(l->empty());
  Write(P("file"), "x");
  EXPECT_FALSE(fs_->CreateDir(P("file/sub")).ok());
}

TEST_P(FsContractTest, DeleteFileAndEmptyDirOnly) {
  Write(P("d/f"), "x");
  EXPECT_FALSE(fs_->Delete(P("d")).ok());  // not empty
  ASSERT_TRUE(fs_->Delete(P("d/f")).ok());
  EXPECT_EQ(fs_->Stat(P("d/f")).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(fs_->Delete(P("d")).ok());
  EXPECT_EQ(fs_->Stat(P("d")).status().code(), StatusCode::kNotFound);
}

TEST_P(FsContractTest, DeleteRecursively) {
  Write(P("t/a/b/c"), "1");
  Write(P("t/a/d"), "2");
  Write(P("t2"), "keep");  // a sibling sharing the prefix survives
  ASSERT_TRUE(fs_->DeleteRecursively(P("t")).ok());
  EXPECT_EQ(fs_->Stat(P("t")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(ReadAll(P("t2")), "keep");
}

TEST_P(FsContractTest, RenameReplaces) {
  Write(P("from"), "new");
  Write(P("to"), "old");
  ASSERT_TRUE(fs_->Rename(P("from"), P("to")).ok());
  EXPECT_EQ(ReadAll(P("to")), "new");
  EXPECT_EQ(fs_->Stat(P("from")).status().code(), StatusCode::kNotFound);
}

TEST_P(FsContractTest, RenameDirectoryMovesEverythingUnderIt) {
  Write(P("d/a"), "A");
  Write(P("d/sub/b"), "B");
  Write(P("full/x"), "X");
  ASSERT_TRUE(fs_->Rename(P("d"), P("e")).ok());
  EXPECT_EQ(ReadAll(P("e/a")), "A");
  EXPECT_EQ(ReadAll(P("e/sub/b")), "B");
  EXPECT_EQ(fs_->Stat(P("d")).status().code(), StatusCode::kNotFound);
  EXPECT_EQ(fs_->Stat(P("d/a")).status().code(), StatusCode::kNotFound);
  auto entries = fs_->List(P("e"));
  ASSERT_TRUE(entries.ok());
  ASSERT_EQ(entries->size(), 2u);
  // Onto a non-empty directory: refused, both left as they were.
  EXPECT_FALSE(fs_->Rename(P("e"), P("full")).ok());
  EXPECT_EQ(ReadAll(P("e/a")), "A");
  EXPECT_EQ(ReadAll(P("full/x")), "X");
}

TEST_P(FsContractTest, ReaderOpenBeforeRenameKeepsItsFile) {
  Write(P("a"), "first");
  auto r = fs_->NewRandomAccessFile(P("a"));
  ASSERT_TRUE(r.ok());
  Write(P("b"), "second!");
  ASSERT_TRUE(fs_->Rename(P("b"), P("a")).ok());
  uint8_t buf[16];
  auto n = (*r)->ReadAt(0, buf);
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), *n), "first");
  EXPECT_EQ(ReadAll(P("a")), "second!");
}

// A mapped file holds the bytes it had when mapped, also after its name is
// replaced; an empty file maps to an empty region; a missing one is NotFound.
TEST_P(FsContractTest, MapReadOnly) {
  auto w = fs_->NewWritableFile(P("m"));
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Append(Bytes("mapped bytes")).ok());
  ASSERT_TRUE((*w)->Close().ok());
  auto region = fs_->MapReadOnly(P("m"));
  ASSERT_TRUE(region.ok()) << region.status().ToString();
  ASSERT_NE(*region, nullptr);  // both back ends map
  auto d = (*region)->data();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.data()), d.size()), "mapped bytes");
  EXPECT_NE((*region)->uri().find("m"), std::string::npos);
  auto w2 = fs_->NewWritableFile(P("m2"));
  ASSERT_TRUE(w2.ok());
  ASSERT_TRUE((*w2)->Append(Bytes("other")).ok());
  ASSERT_TRUE((*w2)->Close().ok());
  ASSERT_TRUE(fs_->Rename(P("m2"), P("m")).ok());
  d = (*region)->data();
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(d.data()), d.size()), "mapped bytes");

  auto e = fs_->NewWritableFile(P("empty"));
  ASSERT_TRUE(e.ok());
  ASSERT_TRUE((*e)->Close().ok());
  auto empty = fs_->MapReadOnly(P("empty"));
  ASSERT_TRUE(empty.ok()) << empty.status().ToString();
  EXPECT_TRUE((*empty)->data().empty());

  auto missing = fs_->MapReadOnly(P("nope"));
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("nope"), std::string::npos);
}

TEST_P(FsContractTest, UriAndScheme) {
  EXPECT_EQ(fs_->scheme(), GetParam() == "local" ? "file" : "mem");
  std::string uri = fs_->Uri(P("f"));
  EXPECT_NE(uri.find(P("f")), std::string::npos);
  // A URI with this file system's scheme is accepted as a path.
  std::string prefixed = (GetParam() == "local" ? "file://" : "mem://") + P("u");
  Write(prefixed, "via uri");
  EXPECT_EQ(ReadAll(P("u")), "via uri");
}

TEST_P(FsContractTest, OpeningADirectoryFails) {
  ASSERT_TRUE(fs_->CreateDir(P("dir")).ok());
  EXPECT_FALSE(fs_->NewSequentialFile(P("dir")).ok());
}

INSTANTIATE_TEST_SUITE_P(Backends, FsContractTest, ::testing::Values("local", "memory"),
                         [](const auto& info) { return info.param; });

TEST(LocalFs, ErrorsNameThePathAndErrno) {
  auto fs = LocalFileSystem();
  auto r = fs->NewWritableFile("/proc/ember_no_such_dir/x");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("/proc/ember_no_such_dir"), std::string::npos)
      << r.status().ToString();
}

TEST(LocalFs, SharedInstance) { EXPECT_EQ(LocalFileSystem().get(), LocalFileSystem().get()); }

TEST(MemoryFs, RelativePathIsInvalid) {
  auto fs = NewMemoryFileSystem();
  EXPECT_EQ(fs->NewWritableFile("rel").status().code(), StatusCode::kInvalidArgument);
}

TEST(MemoryFs, InstancesAreSeparate) {
  auto a = NewMemoryFileSystem(), b = NewMemoryFileSystem();
  auto w = a->NewWritableFile("/f");
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_TRUE(a->Stat("/f").ok());
  EXPECT_EQ(b->Stat("/f").status().code(), StatusCode::kNotFound);
}

}  // namespace
}  // namespace ember::fs
