// RecordReader / RecordWriter: round trips over every compression, and the
// reader's answers to truncated and corrupted files.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>

#include <random>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "ember/fs.h"
#include "ember/record.h"

namespace ember::record {
namespace {

std::vector<std::string> SampleRecords() {
  std::vector<std::string> recs = {"", "a", "hello world", std::string(1000, 'x')};
  std::mt19937 rng(7);
  for (int i = 0; i < 50; ++i) {
    std::string r(rng() % 3000, '\0');
    for (auto& c : r) c = static_cast<char>(rng());
    recs.push_back(std::move(r));
  }
  recs.push_back(std::string(300000, 'y'));  // larger than the reader's buffer
  return recs;
}

void WriteFile(fs::FileSystem& fs, const std::string& path, const std::vector<std::string>& recs,
               WriterOptions opts = {}) {
  auto f = fs.NewWritableFile(path);
  ASSERT_TRUE(f.ok());
  auto w = RecordWriter::Open(std::move(*f), opts);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  for (const auto& r : recs) ASSERT_TRUE((*w)->Write(r).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_EQ((*w)->records_written(), recs.size());
  EXPECT_EQ((*w)->Write("late").code(), StatusCode::kInvalidArgument);
}

// Reads all records, streamed or in place from a mapping; the status of the
// first failure (OK at a clean end).
Status ReadWith(fs::FileSystem& fs, const std::string& path, std::vector<std::string>* out, ReaderOptions opts,
                ReaderStats* stats, bool mapped) {
  Result<std::unique_ptr<RecordReader>> r = Status::Internal("unset");
  if (mapped) {
    auto region = fs.MapReadOnly(path);
    if (!region.ok()) return region.status();
    r = RecordReader::Open(std::move(*region), opts);
  } else {
    auto f = fs.NewSequentialFile(path);
    if (!f.ok()) return f.status();
    r = RecordReader::Open(std::move(*f), opts);
  }
  if (!r.ok()) return r.status();
  std::string_view rec;
  for (;;) {
    auto more = (*r)->Next(&rec);
    if (!more.ok()) {
      if (stats) *stats = (*r)->stats();
      return more.status();
    }
    if (!*more) break;
    out->emplace_back(rec);
  }
  auto again = (*r)->Next(&rec);  // stays at the end
  EXPECT_TRUE(again.ok() && !*again);
  if (stats) *stats = (*r)->stats();
  return Status::OK();
}

// ReadWith, streamed; for an uncompressed file also in place from a mapping,
// which must give the same records, status and counts.
Status ReadAll(fs::FileSystem& fs, const std::string& path, std::vector<std::string>* out,
               ReaderOptions opts = {}, ReaderStats* stats = nullptr) {
  const size_t before = out->size();
  ReaderStats streamed;
  Status st = ReadWith(fs, path, out, opts, &streamed, false);
  if (stats) *stats = streamed;
  const Compression c = opts.compression == Compression::kAuto ? CompressionFromPath(path) : opts.compression;
  if (c != Compression::kNone) return st;
  std::vector<std::string> in_place;
  ReaderStats mapped;
  Status mst = ReadWith(fs, path, &in_place, opts, &mapped, true);
  EXPECT_EQ(mst, st) << "mapped: " << mst.ToString() << " streamed: " << st.ToString();
  EXPECT_TRUE(std::equal(in_place.begin(), in_place.end(), out->begin() + before, out->end()))
      << "mapped and streamed reads differ";
  EXPECT_EQ(mapped.records, streamed.records);
  EXPECT_EQ(mapped.skipped_records, streamed.skipped_records);
  EXPECT_EQ(mapped.skipped_bytes, streamed.skipped_bytes);
  return st;
}

std::string Slurp(fs::FileSystem& fs, const std::string& path) {
  auto f = fs.NewSequentialFile(path);
  std::string out;
  uint8_t buf[65536];
  for (;;) {
    auto n = (*f)->Read(buf);
    if (!n.ok() || *n == 0) break;
    out.append(reinterpret_cast<char*>(buf), *n);
  }
  return out;
}

void Put(fs::FileSystem& fs, const std::string& path, const std::string& bytes) {
  auto f = fs.NewWritableFile(path);
  ASSERT_TRUE(f.ok());
  ASSERT_TRUE((*f)->Append({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}).ok());
  ASSERT_TRUE((*f)->Close().ok());
}

class RoundTrip : public ::testing::TestWithParam<Compression> {};

TEST_P(RoundTrip, EveryRecordComesBack) {
  auto fs = fs::NewMemoryFileSystem();
  auto recs = SampleRecords();
  WriterOptions wo;
  wo.compression = GetParam();
  WriteFile(*fs, "/r", recs, wo);
  std::vector<std::string> got;
  ReaderOptions ro;
  ro.compression = GetParam();
  ro.buffer_bytes = 1024;  // many refills
  ASSERT_TRUE(ReadAll(*fs, "/r", &got, ro).ok());
  EXPECT_EQ(got, recs);
}

TEST_P(RoundTrip, FlushMakesRecordsReadableBeforeClose) {
  auto fs = fs::NewMemoryFileSystem();
  auto f = fs->NewWritableFile("/f");
  ASSERT_TRUE(f.ok());
  WriterOptions wo;
  wo.compression = GetParam();
  auto w = RecordWriter::Open(std::move(*f), wo);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write("one").ok());
  ASSERT_TRUE((*w)->Write("two").ok());
  ASSERT_TRUE((*w)->Flush().ok());
  // A reader sees both records; a compressed stream is not finished yet, so
  // it then reports the truncation (or, with skip_corrupt, ends there).
  std::vector<std::string> got;
  ReaderOptions ro;
  ro.compression = GetParam();
  ro.skip_corrupt = true;
  ASSERT_TRUE(ReadAll(*fs, "/f", &got, ro).ok());
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two"}));
  ASSERT_TRUE((*w)->Close().ok());
}

INSTANTIATE_TEST_SUITE_P(Compressions, RoundTrip,
                         ::testing::Values(Compression::kNone, Compression::kGzip, Compression::kZlib),
                         [](const auto& info) { return std::string(CompressionName(info.param)); });

TEST(Record, CompressionFromTheName) {
  EXPECT_EQ(CompressionFromPath("/a/b.tfrecord"), Compression::kNone);
  EXPECT_EQ(CompressionFromPath("/a/b.tfrecord.gz"), Compression::kGzip);
  EXPECT_EQ(CompressionFromPath("/a/b.GZIP"), Compression::kGzip);
  EXPECT_EQ(CompressionFromPath("/a/b.zlib"), Compression::kZlib);
  auto fs = fs::NewMemoryFileSystem();
  WriteFile(*fs, "/x.tfrecord.gz", {"abc", "def"});
  std::string raw = Slurp(*fs, "/x.tfrecord.gz");
  ASSERT_GE(raw.size(), 2u);
  EXPECT_EQ(static_cast<uint8_t>(raw[0]), 0x1f);  // gzip magic
  EXPECT_EQ(static_cast<uint8_t>(raw[1]), 0x8b);
  std::vector<std::string> got;
  ASSERT_TRUE(ReadAll(*fs, "/x.tfrecord.gz", &got).ok());
  EXPECT_EQ(got, (std::vector<std::string>{"abc", "def"}));
  EXPECT_EQ(ParseCompression("GZIP").ValueOr(Compression::kNone), Compression::kGzip);
  EXPECT_EQ(ParseCompression("").ValueOr(Compression::kGzip), Compression::kNone);
  EXPECT_FALSE(ParseCompression("lz4").ok());
}

TEST(Record, FramingIsTensorFlows) {
  // Header: little-endian length, then the masked CRC32C of those 8 bytes.
  std::string framed = FrameRecord("abc");
  ASSERT_EQ(framed.size(), 12u + 3 + 4);
  EXPECT_EQ(framed.substr(0, 8), std::string("\x03\0\0\0\0\0\0\0", 8));
  uint32_t lcrc;
  std::memcpy(&lcrc, framed.data() + 8, 4);
  EXPECT_EQ(crc32c::Unmask(lcrc), crc32c::Value(std::string_view(framed.data(), 8)));
  uint32_t dcrc;
  std::memcpy(&dcrc, framed.data() + 15, 4);
  EXPECT_EQ(dcrc, crc32c::Mask(crc32c::Value(std::string_view("abc"))));
  auto fs = fs::NewMemoryFileSystem();
  WriteFile(*fs, "/f", {"abc"});
  EXPECT_EQ(Slurp(*fs, "/f"), framed);
}

TEST(Record, OffsetsOfRecords) {
  auto fs = fs::NewMemoryFileSystem();
  WriteFile(*fs, "/f", {"aa", "bbbb", "c"});
  auto f = fs->NewSequentialFile("/f");
  auto r = RecordReader::Open(std::move(*f));
  ASSERT_TRUE(r.ok());
  std::string_view rec;
  std::vector<uint64_t> offsets;
  while (*(*r)->Next(&rec)) offsets.push_back((*r)->last_offset());
  EXPECT_EQ(offsets, (std::vector<uint64_t>{0, 18, 38}));
  EXPECT_EQ((*r)->stats().records, 3u);
}

// Cutting an uncompressed file at any byte gives the whole records before
// the cut and then Corruption naming the file and the cut record's offset.
TEST(Record, TruncationAtEveryByte) {
  auto fs = fs::NewMemoryFileSystem();
  std::vector<std::string> recs = {"first", "", "third record", std::string(40, 'z')};
  std::vector<uint64_t> starts;
  std::string whole;
  for (const auto& r : recs) {
    starts.push_back(whole.size());
    whole += FrameRecord(r);
  }
  for (size_t cut = 0; cut < whole.size(); ++cut) {
    Put(*fs, "/t", whole.substr(0, cut));
    std::vector<std::string> got;
    Status st = ReadAll(*fs, "/t", &got);
    size_t complete = 0;
    while (complete < recs.size() && starts[complete] + 16 + recs[complete].size() <= cut) ++complete;
    ASSERT_EQ(got.size(), complete) << "cut at " << cut;
    if (complete < recs.size() && cut > starts[complete]) {
      ASSERT_EQ(st.code(), StatusCode::kCorruption) << "cut at " << cut;
      EXPECT_NE(st.message().find("mem:///t"), std::string::npos) << st.ToString();
      EXPECT_NE(st.message().find("at offset " + std::to_string(starts[complete])), std::string::npos)
          << "cut at " << cut << ": " << st.ToString();
    } else {
      EXPECT_TRUE(st.ok()) << "cut at " << cut << ": " << st.ToString();
    }
    // skip_corrupt keeps the complete records and counts the tail.
    got.clear();
    ReaderOptions skip;
    skip.skip_corrupt = true;
    ReaderStats stats;
    ASSERT_TRUE(ReadAll(*fs, "/t", &got, skip, &stats).ok());
    EXPECT_EQ(got.size(), complete);
    EXPECT_EQ(stats.skipped_bytes, cut - (complete < recs.size() ? starts[complete] : whole.size()));
  }
}

TEST(Record, TruncatedCompressedFilesFailCleanly) {
  for (Compression c : {Compression::kGzip, Compression::kZlib}) {
    auto fs = fs::NewMemoryFileSystem();
    WriterOptions wo;
    wo.compression = c;
    WriteFile(*fs, "/c", {"alpha", "beta", std::string(500, 'g')}, wo);
    std::string whole = Slurp(*fs, "/c");
    for (size_t cut = 0; cut < whole.size(); ++cut) {
      Put(*fs, "/t", whole.substr(0, cut));
      std::vector<std::string> got;
      ReaderOptions ro;
      ro.compression = c;
      Status st = ReadAll(*fs, "/t", &got, ro);
      if (cut == 0) {
        EXPECT_TRUE(st.ok());  // an empty file holds no records, compressed or not
        continue;
      }
      ASSERT_EQ(st.code(), StatusCode::kCorruption) << CompressionName(c) << " cut at " << cut;
      EXPECT_NE(st.message().find("mem:///t"), std::string::npos) << st.ToString();
      EXPECT_LE(got.size(), 3u);
    }
  }
}

TEST(Record, DataCrcFlipIsCorruptionOrSkipped) {
  auto fs = fs::NewMemoryFileSystem();
  std::string whole = FrameRecord("good1") + FrameRecord("bad!!") + FrameRecord("good2");
  const size_t second = FrameRecord("good1").size();
  std::string flipped = whole;
  flipped[second + 12 + 2] ^= 0x01;  // a data byte of the second record
  Put(*fs, "/f", flipped);
  std::vector<std::string> got;
  Status st = ReadAll(*fs, "/f", &got);
  ASSERT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("data CRC"), std::string::npos);
  EXPECT_NE(st.message().find("at offset " + std::to_string(second)), std::string::npos) << st.ToString();
  EXPECT_EQ(got, (std::vector<std::string>{"good1"}));

  got.clear();
  ReaderOptions skip;
  skip.skip_corrupt = true;
  ReaderStats stats;
  ASSERT_TRUE(ReadAll(*fs, "/f", &got, skip, &stats).ok());
  EXPECT_EQ(got, (std::vector<std::string>{"good1", "good2"}));
  EXPECT_EQ(stats.skipped_records, 1u);
  EXPECT_EQ(stats.skipped_bytes, FrameRecord("bad!!").size());
  EXPECT_EQ(stats.records, 2u);
}

TEST(Record, LengthCrcFlipResynchronises) {
  auto fs = fs::NewMemoryFileSystem();
  std::string a = FrameRecord("first"), b = FrameRecord("second"), c = FrameRecord("third");
  std::string flipped = a + b + c;
  flipped[a.size() + 1] ^= 0x40;  // the second record's length
  Put(*fs, "/f", flipped);
  std::vector<std::string> got;
  Status st = ReadAll(*fs, "/f", &got);
  ASSERT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("length CRC at offset " + std::to_string(a.size())), std::string::npos)
      << st.ToString();

  got.clear();
  ReaderOptions skip;
  skip.skip_corrupt = true;
  ReaderStats stats;
  ASSERT_TRUE(ReadAll(*fs, "/f", &got, skip, &stats).ok());
  EXPECT_EQ(got, (std::vector<std::string>{"first", "third"}));
  EXPECT_EQ(stats.skipped_records, 1u);
  EXPECT_EQ(stats.skipped_bytes, b.size());
}

TEST(Record, EveryBitFlipIsCaughtOrSkipped) {
  auto fs = fs::NewMemoryFileSystem();
  std::string whole = FrameRecord("alpha") + FrameRecord("beta") + FrameRecord("gamma");
  for (size_t i = 0; i < whole.size() * 8; ++i) {
    std::string f = whole;
    f[i / 8] ^= static_cast<char>(1 << (i % 8));
    Put(*fs, "/f", f);
    std::vector<std::string> got;
    Status st = ReadAll(*fs, "/f", &got);
    EXPECT_EQ(st.code(), StatusCode::kCorruption) << "bit " << i;
    got.clear();
    ReaderOptions skip;
    skip.skip_corrupt = true;
    ReaderStats stats;
    ASSERT_TRUE(ReadAll(*fs, "/f", &got, skip, &stats).ok()) << "bit " << i;
    EXPECT_EQ(got.size(), 2u) << "bit " << i;  // exactly the damaged record is lost
    EXPECT_EQ(stats.skipped_records, 1u) << "bit " << i;
  }
}

TEST(Record, HugeLengthIsBoundedNotAllocated) {
  auto fs = fs::NewMemoryFileSystem();
  // A header claiming 2^40 bytes with a valid length CRC, then little data.
  std::string h(12, '\0');
  uint64_t len = uint64_t{1} << 40;
  std::memcpy(h.data(), &len, 8);
  uint32_t crc = crc32c::Mask(crc32c::Value(std::string_view(h.data(), 8)));
  std::memcpy(h.data() + 8, &crc, 4);
  Put(*fs, "/f", h + "tiny");
  std::vector<std::string> got;
  Status st = ReadAll(*fs, "/f", &got);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("exceeds max_record_bytes"), std::string::npos) << st.ToString();
  ReaderOptions ro;
  ro.max_record_bytes = uint64_t{1} << 50;
  st = ReadAll(*fs, "/f", &got, ro);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("truncated record"), std::string::npos) << st.ToString();
}

TEST(Record, MappedCompressedFileIsRefused) {
  auto fs = fs::NewMemoryFileSystem();
  WriterOptions wo;
  wo.compression = Compression::kGzip;
  WriteFile(*fs, "/c.gz", {"one"}, wo);
  auto region = fs->MapReadOnly("/c.gz");
  ASSERT_TRUE(region.ok());
  auto r = RecordReader::Open(std::move(*region));  // kAuto: gzip by its name
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("mem:///c.gz"), std::string::npos) << r.status().ToString();
}

TEST(Record, ErrorIsSticky) {
  auto fs = fs::NewMemoryFileSystem();
  Put(*fs, "/f", "garbage that is not a record");
  auto f = fs->NewSequentialFile("/f");
  auto r = RecordReader::Open(std::move(*f));
  ASSERT_TRUE(r.ok());
  std::string_view rec;
  auto a = (*r)->Next(&rec);
  auto b = (*r)->Next(&rec);
  ASSERT_FALSE(a.ok());
  EXPECT_EQ(a.status(), b.status());
}

TEST(Record, ConcatenatedGzipMembersReadAsOne) {
  auto fs = fs::NewMemoryFileSystem();
  WriterOptions wo;
  wo.compression = Compression::kGzip;
  WriteFile(*fs, "/a", {"one", "two"}, wo);
  WriteFile(*fs, "/b", {"three"}, wo);
  Put(*fs, "/ab.gz", Slurp(*fs, "/a") + Slurp(*fs, "/b"));
  std::vector<std::string> got;
  ASSERT_TRUE(ReadAll(*fs, "/ab.gz", &got).ok());
  EXPECT_EQ(got, (std::vector<std::string>{"one", "two", "three"}));
}

// gzip of `plain` made with zlib directly (not with the writer under test).
std::string Gzip(const std::string& plain) {
  z_stream z{};
  EXPECT_EQ(deflateInit2(&z, 6, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY), Z_OK);
  std::string out(deflateBound(&z, plain.size()) + 64, '\0');
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(plain.data()));
  z.avail_in = static_cast<uInt>(plain.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  deflateEnd(&z);
  return out;
}

TEST(Record, CorruptInsideGzipNamesTheUncompressedOffset) {
  auto fs = fs::NewMemoryFileSystem();
  const std::string ok = FrameRecord("ok");
  std::string plain = ok + FrameRecord("bad");
  plain[ok.size() + 12] ^= 1;
  Put(*fs, "/d.gz", Gzip(plain));
  std::vector<std::string> got;
  Status st = ReadAll(*fs, "/d.gz", &got);
  ASSERT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("at offset " + std::to_string(ok.size()) + " of the uncompressed stream (gzip)"),
            std::string::npos)
      << st.ToString();
  EXPECT_EQ(got, (std::vector<std::string>{"ok"}));
}

TEST(Record, GarbageGzipIsCorruptionWithCompressedOffset) {
  auto fs = fs::NewMemoryFileSystem();
  std::string gz = Gzip(FrameRecord(std::string(2000, 'q')));
  gz[gz.size() / 2] ^= 0x55;
  Put(*fs, "/g.gz", gz);
  std::vector<std::string> got;
  Status st = ReadAll(*fs, "/g.gz", &got);
  ASSERT_EQ(st.code(), StatusCode::kCorruption) << st.ToString();
  EXPECT_NE(st.message().find("mem:///g.gz"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace ember::record
