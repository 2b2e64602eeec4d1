// Glob, ReadFile, AtomicWriteFile, MappingCache and ResolveFileSystem over the in-memory
// and local file systems.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <map>
#include <string>

#include "ember/fs.h"
#include "fs/fault_fs.h"

namespace ember::fs {
namespace {

std::span<const uint8_t> Bytes(const std::string& s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

void Write(FileSystem& fs, const std::string& path, const std::string& data) {
  auto f = fs.NewWritableFile(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE((*f)->Append(Bytes(data)).ok());
  ASSERT_TRUE((*f)->Close().ok());
}

class GlobTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* p : {"/d/part-0", "/d/part-1", "/d/part-10", "/d/_SUCCESS", "/d/.crc", "/d/sub/x",
                          "/e/a/f1", "/e/b/f1", "/e/b/f2", "/e/c.txt"}) {
      Write(*fs_, p, p);
    }
  }
  std::vector<std::string> G(const std::string& pattern) {
    auto r = Glob(*fs_, pattern);
    EXPECT_TRUE(r.ok()) << pattern << ": " << r.status().ToString();
    return r.ok() ? *r : std::vector<std::string>{};
  }
  std::shared_ptr<FileSystem> fs_ = NewMemoryFileSystem();
};

using V = std::vector<std::string>;

TEST_F(GlobTest, StarQuestionAndBrackets) {
  EXPECT_EQ(G("/d/part-*"), (V{"/d/part-0", "/d/part-1", "/d/part-10"}));
  EXPECT_EQ(G("/d/part-?"), (V{"/d/part-0", "/d/part-1"}));
  EXPECT_EQ(G("/d/part-[1-9]*"), (V{"/d/part-1", "/d/part-10"}));
}

TEST_F(GlobTest, WildcardInTheMiddleMatchesDirectoriesOnly) {
  EXPECT_EQ(G("/e/*/f1"), (V{"/e/a/f1", "/e/b/f1"}));
  EXPECT_EQ(G("/e/*/f*"), (V{"/e/a/f1", "/e/b/f1", "/e/b/f2"}));
}

TEST_F(GlobTest, DirectoryListsItsVisibleFiles) {
  // _SUCCESS and .crc skipped, the subdirectory too.
  EXPECT_EQ(G("/d"), (V{"/d/part-0", "/d/part-1", "/d/part-10"}));
  EXPECT_EQ(G("/d/"), (V{"/d/part-0", "/d/part-1", "/d/part-10"}));
}

TEST_F(GlobTest, RecursiveDirectoryListsTheFilesOfItsVisibleSubdirectories) {
  Write(*fs_, "/d/sub/deeper/y", "y");
  Write(*fs_, "/d/_temporary/0/part-9", "z");  // a writer's leftovers: hidden, as Spark's readers skip them
  Write(*fs_, "/d/.hidden/w", "w");
  auto r = Glob(*fs_, "/d", /*recursive=*/true);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (V{"/d/part-0", "/d/part-1", "/d/part-10", "/d/sub/deeper/y", "/d/sub/x"}));
  r = Glob(*fs_, "/e/*", /*recursive=*/true);  // a wildcard's directories descend too
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, (V{"/e/a/f1", "/e/b/f1", "/e/b/f2", "/e/c.txt"}));
  EXPECT_EQ(G("/d"), (V{"/d/part-0", "/d/part-1", "/d/part-10"}));  // not recursive: as before
}

TEST_F(GlobTest, StarDoesNotMatchALeadingDot) {
  EXPECT_EQ(G("/d/*"), (V{"/d/_SUCCESS", "/d/part-0", "/d/part-1", "/d/part-10", "/d/sub/x"}));
}

TEST_F(GlobTest, LiteralPathReturnedIfItExists) { EXPECT_EQ(G("/e/c.txt"), (V{"/e/c.txt"})); }

TEST_F(GlobTest, NothingMatchingIsNotFoundNamingThePattern) {
  for (const char* p : {"/d/nope-*", "/nope/*", "/e/c.txt/x", "/missing"}) {
    auto r = Glob(*fs_, p);
    ASSERT_FALSE(r.ok()) << p;
    EXPECT_EQ(r.status().code(), StatusCode::kNotFound) << r.status().ToString();
    EXPECT_NE(r.status().message().find(p), std::string::npos) << r.status().ToString();
  }
  EXPECT_EQ(Glob(*fs_, "relative/*").status().code(), StatusCode::kInvalidArgument);
}

TEST(ReadFileTest, ReadsWholeFileAcrossChunks) {
  auto fs = NewMemoryFileSystem();
  std::string big(3 * (1 << 20) + 17, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  Write(*fs, "/big", big);
  auto r = ReadFile(*fs, "/big");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(*r, big);
  EXPECT_EQ(ReadFile(*fs, "/missing").status().code(), StatusCode::kNotFound);
}

TEST(AtomicWriteFileTest, ReplacesAndLeavesNoTemporary) {
  auto fs = NewMemoryFileSystem();
  ASSERT_TRUE(AtomicWriteFile(*fs, "/dir/f", Bytes("one")).ok());
  ASSERT_TRUE(AtomicWriteFile(*fs, "/dir/f", Bytes("two")).ok());
  EXPECT_EQ(ReadFile(*fs, "/dir/f").ValueOr(""), "two");
  auto list = fs->List("/dir");
  ASSERT_TRUE(list.ok());
  ASSERT_EQ(list->size(), 1u);
  EXPECT_EQ((*list)[0].name, "f");
}

TEST(AtomicWriteFileTest, LocalFileSystem) {
  char tmpl[] = "/tmp/ember-fs-util-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto fs = LocalFileSystem();
  ASSERT_TRUE(AtomicWriteFile(*fs, dir + "/f", Bytes("old")).ok());
  ASSERT_TRUE(AtomicWriteFile(*fs, dir + "/f", Bytes("new")).ok());
  EXPECT_EQ(ReadFile(*fs, dir + "/f").ValueOr(""), "new");
  EXPECT_EQ(fs->List(dir).ValueOr({}).size(), 1u);
  ASSERT_TRUE(fs->DeleteRecursively(dir).ok());
}

std::string Text(const std::shared_ptr<const ReadOnlyMemoryRegion>& r) {
  return {reinterpret_cast<const char*>(r->data().data()), r->data().size()};
}

TEST(MappingCacheTest, AnUnchangedFileIsMappedOnce) {
  auto fs = NewMemoryFileSystem();
  Write(*fs, "/a", "aaaa");
  MappingCache cache;
  auto first = cache.Map(*fs, "/a");
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = cache.Map(*fs, "/a");
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(first->get(), second->get());  // the same mapping
  EXPECT_EQ(cache.hits(), 1u);
  EXPECT_EQ(cache.mapped_bytes(), 4u);
}

TEST(MappingCacheTest, AChangedFileIsMappedAnew) {
  auto fs = NewMemoryFileSystem();
  Write(*fs, "/a", "old");
  MappingCache cache;
  auto before = cache.Map(*fs, "/a");
  ASSERT_TRUE(before.ok());
  Write(*fs, "/a", "rewritten");
  auto after = cache.Map(*fs, "/a");
  ASSERT_TRUE(after.ok());
  EXPECT_EQ(Text(*after), "rewritten");
  EXPECT_EQ(Text(*before), "old");  // a holder's region stays valid
  EXPECT_EQ(cache.hits(), 0u);
  EXPECT_EQ(cache.mapped_bytes(), 9u);
}

TEST(MappingCacheTest, KeepsFilesUntilItsBytesAreMapped) {
  auto fs = NewMemoryFileSystem();
  Write(*fs, "/a", std::string(40, 'a'));
  Write(*fs, "/b", std::string(40, 'b'));
  Write(*fs, "/c", std::string(40, 'c'));
  MappingCache cache(100);
  for (int pass = 0; pass < 3; ++pass) {
    for (const char* f : {"/a", "/b", "/c"}) {
      auto r = cache.Map(*fs, f);
      ASSERT_TRUE(r.ok());
      EXPECT_EQ(Text(*r), std::string(40, f[1]));  // c too, mapped for its caller
    }
  }
  EXPECT_EQ(cache.mapped_bytes(), 80u);  // a and b; c did not fit
  EXPECT_EQ(cache.hits(), 4u);           // a and b in passes 2 and 3
  EXPECT_EQ(cache.Map(*fs, "/missing").status().code(), StatusCode::kNotFound);
}

TEST(MappingCacheTest, AFileSystemThatMapsNothingIsNotAskedAgain) {
  FaultInjectionFileSystem fs(NewMemoryFileSystem());  // reads through streams only
  Write(fs, "/a", "aaaa");
  MappingCache cache;
  auto a = cache.Map(fs, "/a");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, nullptr);
  // No Stat now (it would cost a NameNode request per file on HDFS): a
  // missing file is not even noticed; the stream that reads it will be.
  auto missing = cache.Map(fs, "/missing");
  ASSERT_TRUE(missing.ok()) << missing.status().ToString();
  EXPECT_EQ(*missing, nullptr);
  EXPECT_EQ(cache.mapped_bytes(), 0u);
}

TEST(MappingCacheTest, LocalFilesAndAFileReplacedByRename) {
  char tmpl[] = "/tmp/ember-fs-util-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto fs = LocalFileSystem();
  ASSERT_TRUE(AtomicWriteFile(*fs, dir + "/f", Bytes("one")).ok());
  MappingCache cache;
  auto a = cache.Map(*fs, dir + "/f");
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_EQ(Text(*a), "one");
  ASSERT_TRUE(AtomicWriteFile(*fs, dir + "/f", Bytes("three")).ok());
  auto b = cache.Map(*fs, dir + "/f");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(Text(*b), "three");
  ASSERT_TRUE(fs->DeleteRecursively(dir).ok());
}

TEST(ResolveTest, MapsSchemesToFileSystems) {
  ResolveOptions o;
  auto r = ResolveFileSystem("/a/b", o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->fs, LocalFileSystem());
  EXPECT_EQ(r->path, "/a/b");
  for (const char* u : {"file:///a/b", "file:/a/b", "file://localhost/a/b"}) {
    r = ResolveFileSystem(u, o);
    ASSERT_TRUE(r.ok()) << u << ": " << r.status().ToString();
    EXPECT_EQ(r->fs, LocalFileSystem());
    EXPECT_EQ(r->path, "/a/b");
  }
  o.default_fs = "file:///";
  EXPECT_EQ(ResolveFileSystem("/x", o)->fs, LocalFileSystem());
}

TEST(ResolveTest, HdfsUrisAndTheCache) {
  ResolveOptions o;
  o.default_fs = "hdfs://nn:8020";
  o.hdfs_http_addresses["nn:8020"] = "nn-http:50070";
  auto bare = ResolveFileSystem("/a/b", o);
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ(bare->fs->scheme(), "hdfs");
  EXPECT_EQ(bare->path, "/a/b");
  EXPECT_EQ(bare->fs->Uri("/a/b"), "hdfs://nn:8020/a/b");
  auto full = ResolveFileSystem("hdfs://nn:8020/c", o);
  auto noauth = ResolveFileSystem("hdfs:///d", o);
  ASSERT_TRUE(full.ok() && noauth.ok());
  EXPECT_EQ(full->fs, bare->fs);  // one FileSystem per address
  EXPECT_EQ(noauth->fs, bare->fs);
  EXPECT_EQ(noauth->path, "/d");
  // Not in hdfs_http_addresses: the host with Hadoop 3's port 9870.
  auto other = ResolveFileSystem("hdfs://other:8020/e", o);
  ASSERT_TRUE(other.ok());
  EXPECT_NE(other->fs, bare->fs);
  EXPECT_EQ(other->fs->Uri("/e"), "hdfs://other:8020/e");
  auto web = ResolveFileSystem("webhdfs://w:9870/f", o);
  ASSERT_TRUE(web.ok());
  EXPECT_EQ(web->fs->Uri("/f"), "webhdfs://w:9870/f");
  EXPECT_EQ(web->path, "/f");
}

TEST(ResolveTest, RootsSpellUrisOfTheSameFileSystem) {
  ResolveOptions o;
  EXPECT_EQ(ResolveFileSystem("/a", o)->Uri("/b"), "/b");  // a bare path on a local default stays bare
  for (const char* u : {"file:///a", "file:/a", "file://localhost/a"}) {
    EXPECT_EQ(ResolveFileSystem(u, o)->Uri("/b"), "file:///b") << u;
  }
  o.default_fs = "hdfs://nn:8020";
  EXPECT_EQ(ResolveFileSystem("/a", o)->Uri("/b"), "hdfs://nn:8020/b");
  EXPECT_EQ(ResolveFileSystem("hdfs:///a", o)->Uri("/b"), "hdfs://nn:8020/b");
  EXPECT_EQ(ResolveFileSystem("webhdfs://w:9870/a", o)->Uri("/b"), "webhdfs://w:9870/b");
}

// Issue 18: with fs.defaultFS on HDFS, globbing file:///dir/* gave "/dir/x",
// which the reader then looked for on HDFS.  The matches keep the pattern's
// scheme and resolve to the local files again.
TEST(ResolveTest, GlobOfAFileUriStaysLocalWhereDefaultFsIsHdfs) {
  char tmpl[] = "/tmp/ember-fs-util-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  auto local = LocalFileSystem();
  Write(*local, dir + "/part-0", "zero");
  Write(*local, dir + "/part-1", "one");
  Write(*local, dir + "/_SUCCESS", "");
  ResolveOptions o;
  o.default_fs = "hdfs://nn.invalid:8020";  // never reached
  for (const std::string& pattern : {"file://" + dir, "file://" + dir + "/part-*", "file:" + dir + "/part-?"}) {
    auto uris = GlobUris(pattern, o);
    ASSERT_TRUE(uris.ok()) << pattern << ": " << uris.status().ToString();
    EXPECT_EQ(*uris, (std::vector<std::string>{"file://" + dir + "/part-0", "file://" + dir + "/part-1"})) << pattern;
    for (const std::string& u : *uris) {
      auto r = ResolveFileSystem(u, o);
      ASSERT_TRUE(r.ok()) << u << ": " << r.status().ToString();
      EXPECT_EQ(r->fs, local) << u;
      auto data = ReadFile(*r->fs, r->path);
      ASSERT_TRUE(data.ok()) << data.status().ToString();
      EXPECT_EQ(*data, u.ends_with("0") ? "zero" : "one");
    }
  }
  // A bare pattern on a local default keeps giving bare paths.
  auto bare = GlobUris(dir + "/part-*", ResolveOptions{});
  ASSERT_TRUE(bare.ok()) << bare.status().ToString();
  EXPECT_EQ(*bare, (std::vector<std::string>{dir + "/part-0", dir + "/part-1"}));
  auto none = GlobUris("file://" + dir + "/nothing-*", o);
  EXPECT_EQ(none.status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(local->DeleteRecursively(dir).ok());
}

TEST(JobResolveOptionsTest, TheHttpAddressIsFiledUnderTheDefaultFsAuthority) {
  ResolveOptions o = JobResolveOptions("hdfs://nn:8020/", "web:50070");
  EXPECT_EQ(o.default_fs, "hdfs://nn:8020/");
  EXPECT_EQ(o.hdfs_http_addresses, (std::map<std::string, std::string>{{"nn:8020", "web:50070"}}));
  EXPECT_EQ(JobResolveOptions("hdfs://nn:8020", "web:50070").hdfs_http_addresses.at("nn:8020"), "web:50070");
  EXPECT_TRUE(JobResolveOptions("hdfs://nn:8020", "").hdfs_http_addresses.empty());  // the default: port 9870
  EXPECT_TRUE(JobResolveOptions("file:///", "web:50070").hdfs_http_addresses.empty());
  EXPECT_TRUE(JobResolveOptions("", "").default_fs.empty());
}

TEST(QualifyPathTest, AUriWithASchemeIsKeptAsItIs) {
  ResolveOptions o;
  o.default_fs = "hdfs://nn:8020";
  for (const char* u : {"file:///tmp/x", "file:/tmp/x", "hdfs://other:9000/x", "s3a://bucket/x", "viewfs://c/x"}) {
    auto q = QualifyPath(u, o, "/work");
    ASSERT_TRUE(q.ok()) << u << ": " << q.status().ToString();
    EXPECT_EQ(*q, u);
  }
}

TEST(QualifyPathTest, PathsWithoutASchemeGoOnTheDefaultFileSystem) {
  ResolveOptions o;  // no default_fs: local
  auto Q = [&](const std::string& p) {
    auto q = QualifyPath(p, o, "/work/dir");
    EXPECT_TRUE(q.ok()) << p << ": " << q.status().ToString();
    return q.ok() ? *q : std::string();
  };
  EXPECT_EQ(Q("/tmp/x"), "file:///tmp/x");
  EXPECT_EQ(Q("//tmp/x"), "file:///tmp/x");
  EXPECT_EQ(Q("data/x"), "file:///work/dir/data/x");
  EXPECT_EQ(Q("./a/../b/"), "file:///work/dir/b");
  EXPECT_EQ(Q("../../../up"), "file:///up");
  o.default_fs = "file:///";
  EXPECT_EQ(Q("/tmp/x"), "file:///tmp/x");
  o.default_fs = "file://";  // TFoS's defaultFS for local files
  EXPECT_EQ(Q("rel"), "file:///work/dir/rel");
  o.default_fs = "hdfs://nn:8020/";
  o.hdfs_user = "alice";
  EXPECT_EQ(Q("/data"), "hdfs://nn:8020/data");
  EXPECT_EQ(Q("data/part-0"), "hdfs://nn:8020/user/alice/data/part-0");
  o.default_fs = "viewfs://cluster";
  EXPECT_EQ(Q("d"), "viewfs://cluster/user/alice/d");
}

TEST(QualifyPathTest, Errors) {
  ResolveOptions o;
  EXPECT_EQ(QualifyPath("", o, "/w").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QualifyPath("rel", o, "").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(QualifyPath("rel", o, "not/absolute").status().code(), StatusCode::kInvalidArgument);
  o.default_fs = "nn:8020";
  auto q = QualifyPath("/x", o, "/w");
  EXPECT_EQ(q.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(q.status().message().find("nn:8020"), std::string::npos) << q.status().ToString();
}

TEST(ResolveTest, SchemesAreCaseInsensitiveAndOnlyRfc3986Names) {
  ResolveOptions o;
  o.default_fs = "hdfs://nn.invalid:8020";
  auto r = ResolveFileSystem("FILE:///a", o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->fs, LocalFileSystem());
  EXPECT_EQ(r->path, "/a");
  o.default_fs = "FILE:///";
  EXPECT_EQ(ResolveFileSystem("/a", o)->fs, LocalFileSystem());
  // Not a scheme (a space): a relative path, refused as before.
  EXPECT_EQ(ResolveFileSystem("a b:/x", o).status().code(), StatusCode::kInvalidArgument);
}

TEST(ResolveTest, UnresolvableUrisAreInvalidArgument) {
  ResolveOptions o;
  for (const char* u : {"mem:///x", "s3://bucket/x", "relative/path", "hdfs:///x", "file://host/x", "webhdfs:///x"}) {
    auto r = ResolveFileSystem(u, o);
    ASSERT_FALSE(r.ok()) << u;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << u;
    EXPECT_NE(r.status().message().find(u), std::string::npos) << r.status().ToString();
  }
}

}  // namespace
}  // namespace ember::fs
