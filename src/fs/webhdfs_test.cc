// The FileSystem contract against a real HDFS (NameNode + DataNode on
// loopback).  Run through the harness, which starts HDFS and sets
// EMBER_TEST_HDFS_HTTP_ADDRESS / EMBER_TEST_HDFS_DEFAULT_FS:
//   python python/tests/hdfs_cluster.py -- build/core/src/webhdfs_test
// (ctest runs it so: `ctest -L hdfs`).  Without them every test fails.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "ember/fs.h"

namespace ember::fs {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

std::string Pattern(size_t n, int seed) {
  std::string s(n, '\0');
  for (size_t i = 0; i < n; ++i) s[i] = static_cast<char>((i * 131 + seed) % 251);
  return s;
}

class WebHdfsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* http = std::getenv("EMBER_TEST_HDFS_HTTP_ADDRESS");
    const char* dfs = std::getenv("EMBER_TEST_HDFS_DEFAULT_FS");
    if (http == nullptr || dfs == nullptr) {
      GTEST_FAIL() << "no HDFS: EMBER_TEST_HDFS_HTTP_ADDRESS and EMBER_TEST_HDFS_DEFAULT_FS are not set. "
                      "Run this binary under the harness that starts one: "
                      "python python/tests/hdfs_cluster.py -- <this binary>  (or `ctest -L hdfs`)";
    }
    options_.http_address = http;
    options_.default_fs = dfs;
    options_.read_chunk_bytes = 1000;  // several requests per file
    options_.write_chunk_bytes = 777;
    options_.connect_timeout = Duration(5000);
    options_.io_timeout = Duration(30000);
    auto fs = NewHdfsFileSystem(options_);
    ASSERT_TRUE(fs.ok()) << fs.status().ToString();
    fs_ = *fs;
    dir_ = std::string("/t/") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
    ASSERT_TRUE(fs_->DeleteRecursively(dir_).ok());
    ASSERT_TRUE(fs_->CreateDir(dir_).ok());
  }
  void TearDown() override {
    if (fs_) {
      EXPECT_TRUE(fs_->DeleteRecursively(dir_).ok());
    }
  }

  void Write(const std::string& path, const std::string& data, size_t piece = 100) {
    auto f = fs_->NewWritableFile(path);
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    for (size_t i = 0; i < data.size(); i += piece) {
      ASSERT_TRUE((*f)->Append(Bytes(data.substr(i, piece))).ok());
    }
    Status st = (*f)->Close();
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  std::string Read(const std::string& path) { return ReadFile(*fs_, path).ValueOr("<error>"); }

  HdfsOptions options_;
  std::shared_ptr<FileSystem> fs_;
  std::string dir_;
};

TEST_F(WebHdfsTest, LargeFileRoundTripsAcrossChunks) {
  const std::string data = Pattern(10007, 1);  // 13 write chunks, 11 read chunks
  Write(dir_ + "/big", data, 333);
  auto info = fs_->Stat(dir_ + "/big");
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->size, data.size());
  EXPECT_FALSE(info->is_dir);
  EXPECT_EQ(info->name, "big");
  EXPECT_GT(info->mtime_ms, 1600000000000);
  // Sequential reads of an odd size, and a Skip across a chunk boundary.
  auto seq = fs_->NewSequentialFile(dir_ + "/big");
  ASSERT_TRUE(seq.ok()) << seq.status().ToString();
  std::string got(123, '\0');
  auto n = (*seq)->Read({reinterpret_cast<uint8_t*>(got.data()), got.size()});
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(got.substr(0, *n), data.substr(0, 123));
  ASSERT_TRUE((*seq)->Skip(2000).ok());
  std::string rest(20000, '\0');
  n = (*seq)->Read({reinterpret_cast<uint8_t*>(rest.data()), rest.size()});
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(rest.substr(0, *n), data.substr(2123));
  n = (*seq)->Read({reinterpret_cast<uint8_t*>(rest.data()), rest.size()});
  EXPECT_EQ(n.ValueOr(99), 0u);
  EXPECT_EQ(Read(dir_ + "/big"), data);
}

TEST_F(WebHdfsTest, RandomAccessAtOffsetsFromManyThreads) {
  const std::string data = Pattern(5000, 2);
  Write(dir_ + "/r", data, 5000);
  auto f = fs_->NewRandomAccessFile(dir_ + "/r");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ((*f)->Size().ValueOr(0), 5000u);
  std::string buf(700, '\0');
  std::span<uint8_t> span(reinterpret_cast<uint8_t*>(buf.data()), buf.size());
  EXPECT_EQ((*f)->ReadAt(4700, span).ValueOr(0), 300u);  // short only at the end
  EXPECT_EQ(buf.substr(0, 300), data.substr(4700));
  EXPECT_EQ((*f)->ReadAt(5000, span).ValueOr(1), 0u);
  EXPECT_EQ((*f)->ReadAt(9999, span).ValueOr(1), 0u);
  std::vector<std::thread> threads;
  std::atomic<int> good{0};
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t off = t * 97; off < 4000; off += 1111) {
        std::string b(500, '\0');
        auto r = (*f)->ReadAt(off, {reinterpret_cast<uint8_t*>(b.data()), b.size()});
        if (r.ok() && *r == 500 && b == data.substr(off, 500)) ++good;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(good.load(), 16);
}

TEST_F(WebHdfsTest, EmptyFileAndOverwrite) {
  Write(dir_ + "/e", "");
  EXPECT_EQ(fs_->Stat(dir_ + "/e").ValueOr(FileInfo{"", 9}).size, 0u);
  EXPECT_EQ(Read(dir_ + "/e"), "");
  Write(dir_ + "/e", "long old contents");
  Write(dir_ + "/e", "new");  // truncates
  EXPECT_EQ(Read(dir_ + "/e"), "new");
  // Append after Close is refused.
  auto f = fs_->NewWritableFile(dir_ + "/c");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_TRUE((*f)->Close().ok());
  EXPECT_EQ((*f)->Append(Bytes("x")).code(), StatusCode::kInvalidArgument);
}

TEST_F(WebHdfsTest, FlushMakesBytesReadable) {
  auto f = fs_->NewWritableFile(dir_ + "/deep/er/f");  // parents made
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append(Bytes("abc")).ok());
  ASSERT_TRUE((*f)->Sync().ok());
  EXPECT_EQ(Read(dir_ + "/deep/er/f"), "abc");
  ASSERT_TRUE((*f)->Append(Bytes("def")).ok());
  ASSERT_TRUE((*f)->Close().ok());
  EXPECT_EQ(Read(dir_ + "/deep/er/f"), "abcdef");
}

TEST_F(WebHdfsTest, ErrorsNameTheUriAndOffset) {
  const std::string missing = options_.default_fs + dir_ + "/missing";
  for (auto st : {fs_->NewSequentialFile(dir_ + "/missing").status(),
                  fs_->NewRandomAccessFile(dir_ + "/missing").status(), fs_->Stat(dir_ + "/missing").status(),
                  fs_->List(dir_ + "/missing").status()}) {
    EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
    EXPECT_NE(st.message().find(missing), std::string::npos) << st.ToString();
  }
  auto dir_as_file = fs_->NewSequentialFile(dir_);
  EXPECT_EQ(dir_as_file.status().code(), StatusCode::kIOError);
  EXPECT_NE(dir_as_file.status().message().find(options_.default_fs + dir_ + ": is a directory"), std::string::npos)
      << dir_as_file.status().ToString();
  // A file deleted under an open reader: the error names the offset.
  Write(dir_ + "/gone", Pattern(3000, 3));
  auto f = fs_->NewRandomAccessFile(dir_ + "/gone");
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE(fs_->Delete(dir_ + "/gone").ok());
  std::string buf(10, '\0');
  auto r = (*f)->ReadAt(2500, {reinterpret_cast<uint8_t*>(buf.data()), buf.size()});
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
  EXPECT_NE(r.status().message().find(options_.default_fs + dir_ + "/gone: OPEN at offset 2500"), std::string::npos)
      << r.status().ToString();
  // List of a file is not a directory listing.
  Write(dir_ + "/plain", "x");
  EXPECT_EQ(fs_->List(dir_ + "/plain").status().code(), StatusCode::kIOError);
  EXPECT_FALSE(fs_->CreateDir(dir_ + "/plain").ok());
}

TEST_F(WebHdfsTest, RenameReplacesAnExistingFile) {
  Write(dir_ + "/a", "new");
  Write(dir_ + "/b", "old old old");
  Status st = fs_->Rename(dir_ + "/a", dir_ + "/b");
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Read(dir_ + "/b"), "new");
  EXPECT_EQ(fs_->Stat(dir_ + "/a").status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(fs_->Rename(dir_ + "/b", dir_ + "/c").ok());  // to a new name
  EXPECT_EQ(Read(dir_ + "/c"), "new");
  st = fs_->Rename(dir_ + "/nope", dir_ + "/d");
  EXPECT_EQ(st.code(), StatusCode::kNotFound) << st.ToString();
  EXPECT_NE(st.message().find(options_.default_fs + dir_ + "/nope"), std::string::npos) << st.ToString();
}

TEST_F(WebHdfsTest, DirectoriesListAndDelete) {
  ASSERT_TRUE(fs_->CreateDir(dir_ + "/x/y").ok());
  ASSERT_TRUE(fs_->CreateDir(dir_ + "/x/y").ok());  // exists: fine
  Write(dir_ + "/x/b", "bb");
  Write(dir_ + "/x/a", "a");
  auto list = fs_->List(dir_ + "/x");
  ASSERT_TRUE(list.ok()) << list.status().ToString();
  ASSERT_EQ(list->size(), 3u);
  EXPECT_EQ((*list)[0].name, "a");
  EXPECT_EQ((*list)[1].name, "b");
  EXPECT_EQ((*list)[1].size, 2u);
  EXPECT_TRUE((*list)[2].is_dir);
  EXPECT_EQ(fs_->Delete(dir_ + "/x").code(), StatusCode::kIOError);  // not empty
  ASSERT_TRUE(fs_->Delete(dir_ + "/x/a").ok());
  EXPECT_EQ(fs_->Delete(dir_ + "/x/a").code(), StatusCode::kNotFound);
  ASSERT_TRUE(fs_->DeleteRecursively(dir_ + "/x").ok());
  ASSERT_TRUE(fs_->DeleteRecursively(dir_ + "/x").ok());  // missing: fine
  EXPECT_EQ(fs_->Stat(dir_ + "/x").status().code(), StatusCode::kNotFound);
}

TEST_F(WebHdfsTest, UrisGlobAndAtomicWrite) {
  Write(dir_ + "/part-0", "p0");
  Write(dir_ + "/part-1", "p1");
  Write(dir_ + "/_SUCCESS", "");
  // A URI naming this file system is accepted; another one is not.
  EXPECT_TRUE(fs_->Stat(options_.default_fs + dir_ + "/part-0").ok());
  EXPECT_TRUE(fs_->Stat("webhdfs://" + options_.http_address + dir_ + "/part-0").ok());
  EXPECT_EQ(fs_->Stat("hdfs://elsewhere:1" + dir_).status().code(), StatusCode::kInvalidArgument);
  auto g = Glob(*fs_, dir_);
  ASSERT_TRUE(g.ok()) << g.status().ToString();
  EXPECT_EQ(*g, (std::vector<std::string>{dir_ + "/part-0", dir_ + "/part-1"}));
  ASSERT_TRUE(AtomicWriteFile(*fs_, dir_ + "/part-0", Bytes("replaced")).ok());
  EXPECT_EQ(Read(dir_ + "/part-0"), "replaced");
  EXPECT_EQ(fs_->List(dir_).ValueOr({}).size(), 3u);  // no temporary left
  // ResolveFileSystem: hdfs://, hdfs:/// and webhdfs:// reach the same files.
  ResolveOptions ro;
  ro.default_fs = options_.default_fs;
  const std::string authority = options_.default_fs.substr(7);
  ro.hdfs_http_addresses[authority] = options_.http_address;
  for (const std::string& uri : {options_.default_fs + dir_ + "/part-1", "hdfs://" + dir_ + "/part-1",
                                dir_ + "/part-1", "webhdfs://" + options_.http_address + dir_ + "/part-1"}) {
    auto r = ResolveFileSystem(uri, ro);
    ASSERT_TRUE(r.ok()) << uri << ": " << r.status().ToString();
    EXPECT_EQ(ReadFile(*r->fs, r->path).ValueOr("<error>"), "p1") << uri;
  }
}

TEST_F(WebHdfsTest, NameNodeNotThereIsUnavailableQuickly) {
  // A port that was free a moment ago: nothing listens there.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  socklen_t len = sizeof(a);
  ASSERT_EQ(getsockname(s, reinterpret_cast<sockaddr*>(&a), &len), 0);
  close(s);
  HdfsOptions o = options_;
  o.http_address = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  o.default_fs = "hdfs://127.0.0.1:1";
  o.connect_timeout = Duration(2000);
  auto fs = NewHdfsFileSystem(o);
  ASSERT_TRUE(fs.ok());
  const auto t0 = std::chrono::steady_clock::now();
  auto st = (*fs)->Stat("/x").status();
  const auto took = std::chrono::steady_clock::now() - t0;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("hdfs://127.0.0.1:1/x"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find(o.http_address), std::string::npos) << st.ToString();
  EXPECT_LT(took, std::chrono::milliseconds(2000));
  auto w = (*fs)->NewWritableFile("/x");  // made lazily: the CREATE fails at Close
  ASSERT_TRUE(w.ok());
  EXPECT_EQ((*w)->Close().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace ember::fs
