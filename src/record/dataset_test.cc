#include "ember/dataset.h"

#include <gtest/gtest.h>

#include <numeric>
#include <tuple>
#include <string>
#include <vector>

namespace ember::record {
namespace {

using example::FeatureKind;
using example::FeatureSpec;

// Writes `rows` Examples {id: int64 scalar = first_id + i, pixels: 3 bytes} to `path`.
void WriteExamples(fs::FileSystem& fs, const std::string& path, int64_t first_id, int64_t rows) {
  std::vector<int64_t> ids(rows);
  std::iota(ids.begin(), ids.end(), first_id);
  std::vector<int64_t> splits(rows + 1);
  std::iota(splits.begin(), splits.end(), 0);
  std::vector<uint8_t> pixels;
  std::vector<int64_t> pixel_offsets{0};
  for (int64_t i = 0; i < rows; ++i) {
    for (int b = 0; b < 3; ++b) pixels.push_back(static_cast<uint8_t>(first_id + i + b));
    pixel_offsets.push_back(static_cast<int64_t>(pixels.size()));
  }
  example::ColumnView id;
  id.name = "id";
  id.kind = FeatureKind::kInt64;
  id.ints = ids;
  id.row_splits = splits;
  example::ColumnView px;
  px.name = "pixels";
  px.kind = FeatureKind::kBytes;
  px.bytes_data = pixels;
  px.bytes_offsets = pixel_offsets;
  px.row_splits = splits;
  std::vector<example::ColumnView> cols{id, px};
  std::string out;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(example::EncodeExamples(cols, &out, &offsets).ok());
  auto file = fs.NewWritableFile(path);
  ASSERT_TRUE(file.ok()) << file.status().ToString();
  auto writer = RecordWriter::Open(std::move(*file), {.compression = Compression::kNone});
  ASSERT_TRUE(writer.ok());
  for (int64_t i = 0; i < rows; ++i) {
    ASSERT_TRUE((*writer)->Write(std::string_view(out).substr(offsets[i], offsets[i + 1] - offsets[i])).ok());
  }
  ASSERT_TRUE((*writer)->Close().ok());
}

DatasetOptions Options(int64_t batch, int prefetch, int threads = 2) {
  DatasetOptions o;
  o.decode_threads = threads;
  o.schema = {FeatureSpec{"id", FeatureKind::kInt64, 1}, FeatureSpec{"pixels", FeatureKind::kBytes, 1}};
  o.batch_size = batch;
  o.prefetch = prefetch;
  return o;
}

// All ids of a dataset, batch sizes in `sizes`.
std::vector<int64_t> Drain(ExampleDataset& ds, std::vector<size_t>* sizes) {
  std::vector<int64_t> ids;
  for (;;) {
    auto batch = ds.Next();
    EXPECT_TRUE(batch.ok()) << batch.status().ToString();
    if (!batch.ok() || !batch->has_value()) break;
    const auto& cols = **batch;
    sizes->push_back(cols[0].num_rows());
    ids.insert(ids.end(), cols[0].ints.begin(), cols[0].ints.end());
    EXPECT_EQ(cols[1].bytes_data[0], static_cast<uint8_t>(cols[0].ints[0]));
  }
  return ids;
}

// (prefetch depth, decode threads, files mapped)
class DatasetTest : public ::testing::TestWithParam<std::tuple<int, int, bool>> {
 protected:
  void SetUp() override {
    fs_ = fs::NewMemoryFileSystem();
    WriteExamples(*fs_, "/d/a", 0, 10);
    WriteExamples(*fs_, "/d/b", 10, 0);  // an empty file
    WriteExamples(*fs_, "/d/c", 10, 7);
  }
  int Prefetch() const { return std::get<0>(GetParam()); }
  int Threads() const { return std::get<1>(GetParam()); }
  DatasetOptions Options(int64_t batch) const {
    DatasetOptions o = ember::record::Options(batch, Prefetch(), Threads());
    o.map_files = std::get<2>(GetParam());
    return o;
  }
  std::shared_ptr<fs::FileSystem> fs_;
};

TEST_P(DatasetTest, ReadsEveryFileInOrderInBatches) {
  auto ds = ExampleDataset::Open(fs_, {"/d/a", "/d/b", "/d/c"}, Options(4));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  std::vector<size_t> sizes;
  std::vector<int64_t> ids = Drain(**ds, &sizes);
  std::vector<int64_t> want(17);
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(sizes, (std::vector<size_t>{4, 4, 4, 4, 1}));  // batches span files
  EXPECT_EQ((*ds)->stats().files, 3u);
  EXPECT_EQ((*ds)->stats().rows, 17u);
  auto again = (*ds)->Next();  // stays at the end
  ASSERT_TRUE(again.ok());
  EXPECT_FALSE(again->has_value());
}

TEST_P(DatasetTest, DropRemainderAndShards) {
  DatasetOptions o = Options(4);
  o.drop_remainder = true;
  o.num_shards = 3;
  o.shard_index = 1;
  auto ds = ExampleDataset::Open(fs_, {"/d/a", "/d/b", "/d/c"}, o);
  ASSERT_TRUE(ds.ok());
  std::vector<size_t> sizes;
  // Records 1, 4, 7, 10, 13, 16 of the whole sequence; the last 2 make no whole batch.
  EXPECT_EQ(Drain(**ds, &sizes), (std::vector<int64_t>{1, 4, 7, 10}));
  EXPECT_EQ(sizes, (std::vector<size_t>{4}));
}

TEST_P(DatasetTest, MissingFileNamedWhenReached) {
  auto ds = ExampleDataset::Open(fs_, {"/d/a", "/d/nope"}, Options(100));
  ASSERT_TRUE(ds.ok());
  auto batch = (*ds)->Next();
  ASSERT_FALSE(batch.ok());
  EXPECT_EQ(batch.status().code(), StatusCode::kNotFound);
  EXPECT_NE(batch.status().message().find("/d/nope"), std::string::npos) << batch.status().ToString();
  EXPECT_FALSE((*ds)->Next().ok());  // the error sticks
}

TEST_P(DatasetTest, RecordNotMatchingTheSchemaNamesFileAndOffset) {
  DatasetOptions o = Options(100);
  o.schema[0].kind = FeatureKind::kFloat;  // "id" is int64 in the files
  auto ds = ExampleDataset::Open(fs_, {"/d/a"}, o);
  ASSERT_TRUE(ds.ok());
  auto batch = (*ds)->Next();
  ASSERT_FALSE(batch.ok());
  const std::string& m = batch.status().message();
  EXPECT_NE(m.find("/d/a"), std::string::npos) << m;
  EXPECT_NE(m.find("at byte 0"), std::string::npos) << m;
  EXPECT_NE(m.find("id"), std::string::npos) << m;
}

TEST_P(DatasetTest, CloseWhileTheReaderWaitsForRoom) {
  auto ds = ExampleDataset::Open(fs_, {"/d/a", "/d/c"}, Options(1));
  ASSERT_TRUE(ds.ok());
  ASSERT_TRUE((*ds)->Next().ok());  // the reading thread fills its queue and waits
  (*ds)->Close();
  auto after = (*ds)->Next();
  ASSERT_FALSE(after.ok());
  EXPECT_EQ(after.status().code(), StatusCode::kCancelled);
}

// Many small batches over several files with every worker busy: the
// batches come out in file order, each whole.
TEST_P(DatasetTest, ManyBatchesKeepFileOrder) {
  for (int f = 0; f < 5; ++f) WriteExamples(*fs_, "/m/" + std::to_string(f), f * 1000, 997);
  auto ds = ExampleDataset::Open(fs_, {"/m/0", "/m/1", "/m/2", "/m/3", "/m/4"}, Options(7));
  ASSERT_TRUE(ds.ok());
  std::vector<size_t> sizes;
  std::vector<int64_t> ids = Drain(**ds, &sizes);
  std::vector<int64_t> want;
  for (int f = 0; f < 5; ++f) {
    for (int64_t i = 0; i < 997; ++i) want.push_back(f * 1000 + i);
  }
  EXPECT_EQ(ids, want);
  EXPECT_EQ(sizes.size(), (5 * 997 + 6) / 7);
  EXPECT_EQ((*ds)->stats().rows, 5u * 997);
}

// A corrupt record fails the batch holding it, after every batch before it
// was handed out whole, and names the file and the record's offset.
// Writes 50 examples to `path` with record 30's data CRC broken; returns
// the size of one record (all have the same size here).
size_t WriteWithCorruptRecord30(fs::FileSystem& fs, const std::string& path) {
  WriteExamples(fs, path, 0, 50);
  auto file = fs.NewRandomAccessFile(path);
  EXPECT_TRUE(file.ok());
  const uint64_t size = *(*file)->Size();
  std::string bytes(size, '\0');
  EXPECT_EQ(*(*file)->ReadAt(0, {reinterpret_cast<uint8_t*>(bytes.data()), bytes.size()}), size);
  const size_t record = size / 50;
  bytes[30 * record + 20] ^= 0x40;  // inside record 30's data: its CRC fails
  auto out = fs.NewWritableFile(path);
  EXPECT_TRUE(out.ok());
  EXPECT_TRUE((*out)->Append({reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}).ok());
  EXPECT_TRUE((*out)->Close().ok());
  return record;
}

// A mapped file's data CRCs are checked by the decoding workers, a streamed
// file's by the reader: the error reads the same either way.
TEST_P(DatasetTest, CorruptRecordFailsAfterTheBatchesBeforeIt) {
  const size_t record = WriteWithCorruptRecord30(*fs_, "/x/a");
  auto ds = ExampleDataset::Open(fs_, {"/x/a"}, Options(4));
  ASSERT_TRUE(ds.ok());
  std::vector<int64_t> ids;
  Status failure;
  for (;;) {
    auto batch = (*ds)->Next();
    if (!batch.ok()) {
      failure = batch.status();
      break;
    }
    ASSERT_TRUE(batch->has_value()) << "the corrupt record was not reported";
    for (int64_t id : (**batch)[0].ints) ids.push_back(id);
  }
  std::vector<int64_t> want(28);  // batches 0..6 are records 0..27; record 30 is in batch 7
  std::iota(want.begin(), want.end(), 0);
  EXPECT_EQ(ids, want);
  EXPECT_EQ(failure.code(), StatusCode::kCorruption) << failure.ToString();
  EXPECT_NE(failure.message().find("/x/a"), std::string::npos) << failure.ToString();
  EXPECT_NE(failure.message().find("offset " + std::to_string(30 * record)), std::string::npos) << failure.ToString();
  EXPECT_NE(failure.message().find("bad data CRC"), std::string::npos) << failure.ToString();
  EXPECT_FALSE((*ds)->Next().ok());  // the error sticks
}

TEST_P(DatasetTest, SkipCorruptDropsTheBadRecordAndCountsIt) {
  WriteWithCorruptRecord30(*fs_, "/x/a");
  DatasetOptions o = Options(4);
  o.reader.skip_corrupt = true;
  auto ds = ExampleDataset::Open(fs_, {"/x/a"}, o);
  ASSERT_TRUE(ds.ok());
  std::vector<size_t> sizes;
  std::vector<int64_t> ids = Drain(**ds, &sizes);
  std::vector<int64_t> want(50);
  std::iota(want.begin(), want.end(), 0);
  want.erase(want.begin() + 30);
  EXPECT_EQ(ids, want);
  EXPECT_EQ((*ds)->stats().skipped_records, 1u);
}

// Passes that share a MappingCache (a dataset per epoch) map each file
// once and read the same rows every pass; a file rewritten between passes
// is read as it is now.
TEST_P(DatasetTest, PassesSharingAMappingCacheMapEachFileOnce) {
  auto cache = std::make_shared<fs::MappingCache>();
  DatasetOptions o = Options(4);
  o.mapping_cache = cache;
  std::vector<int64_t> want(17);
  std::iota(want.begin(), want.end(), 0);
  for (int pass = 0; pass < 3; ++pass) {
    auto ds = ExampleDataset::Open(fs_, {"/d/a", "/d/b", "/d/c"}, o);
    ASSERT_TRUE(ds.ok());
    std::vector<size_t> sizes;
    EXPECT_EQ(Drain(**ds, &sizes), want) << "pass " << pass;
  }
  if (!o.map_files) {
    EXPECT_EQ(cache->hits(), 0u);
    return;
  }
  EXPECT_EQ(cache->hits(), 6u);  // passes 2 and 3, three files each
  WriteExamples(*fs_, "/d/c", 100, 3);
  auto ds = ExampleDataset::Open(fs_, {"/d/c"}, o);
  ASSERT_TRUE(ds.ok());
  std::vector<size_t> sizes;
  EXPECT_EQ(Drain(**ds, &sizes), (std::vector<int64_t>{100, 101, 102}));
}

// Workers that claim a group after the last one was gathered end it with
// nothing of their own earlier groups (whose mappings are gone by then):
// regression test for a use-after-free that ASan found only at the end of
// a dataset with several workers.  Many short datasets make that race likely.
TEST_P(DatasetTest, IdleWorkersAtTheEndDecodeNothingStale) {
  std::vector<std::string> files;
  for (int f = 0; f < 4; ++f) {
    files.push_back("/s/" + std::to_string(f));
    WriteExamples(*fs_, files.back(), f * 1000, 150);  // two groups of 64 one-row batches and a bit
  }
  for (int i = 0; i < 40; ++i) {
    auto ds = ExampleDataset::Open(fs_, files, Options(1));
    ASSERT_TRUE(ds.ok());
    std::vector<size_t> sizes;
    std::vector<int64_t> ids = Drain(**ds, &sizes);
    ASSERT_EQ(ids.size(), 600u);
  }
}

INSTANTIATE_TEST_SUITE_P(PrefetchAndThreads, DatasetTest,
                         ::testing::Combine(::testing::Values(0, 1, 3), ::testing::Values(1, 2, 4),
                                            ::testing::Bool()));

TEST(Dataset, RejectsBadOptions) {
  auto fs = fs::NewMemoryFileSystem();
  EXPECT_EQ(ExampleDataset::Open(fs, {}, Options(0, 1)).status().code(), StatusCode::kInvalidArgument);
  DatasetOptions o = Options(4, 1);
  o.shard_index = 2;
  o.num_shards = 2;
  EXPECT_EQ(ExampleDataset::Open(fs, {}, o).status().code(), StatusCode::kInvalidArgument);
  o = Options(4, 1);
  o.schema.clear();
  EXPECT_EQ(ExampleDataset::Open(fs, {}, o).status().code(), StatusCode::kInvalidArgument);
  o = Options(4, 1, 0);
  EXPECT_EQ(ExampleDataset::Open(fs, {}, o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace ember::record
