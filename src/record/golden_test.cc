// Files written by real TensorFlow (src/record/testdata, made by
// python/tests/data/make_tfrecord_golden.py) read by Ember, compared with
// the values the script wrote into expected.txt.
#include <gtest/gtest.h>
#include <zlib.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "ember/example.h"
#include "ember/fs.h"
#include "ember/record.h"

#ifndef EMBER_RECORD_TESTDATA
#error "EMBER_RECORD_TESTDATA must name src/record/testdata"
#endif

namespace ember::record {
namespace {

using example::FeatureKind;

struct Expected {
  std::vector<std::tuple<std::string, std::string, size_t>> files;  // name, compression, records
  // (row, feature) -> (kind, values as written by the script); absent = missing
  std::map<std::pair<int, std::string>, std::pair<std::string, std::vector<std::string>>> features;
  std::vector<std::pair<size_t, uint32_t>> payloads;  // length, crc32
  int rows = 0;
};

Expected Load() {
  Expected e;
  std::ifstream in(std::string(EMBER_RECORD_TESTDATA) + "/expected.txt");
  EXPECT_TRUE(in.good());
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    std::string what;
    ss >> what;
    if (what == "file") {
      std::string name, comp;
      size_t n;
      ss >> name >> comp >> n;
      e.files.emplace_back(name, comp, n);
    } else if (what == "feature") {
      int row;
      std::string name, kind, v;
      ss >> row >> name >> kind;
      std::vector<std::string> values;
      while (ss >> v) values.push_back(v);
      e.features[{row, name}] = {kind, values};
      e.rows = std::max(e.rows, row + 1);
    } else if (what == "payload") {
      size_t i, len;
      uint32_t crc;
      ss >> i >> len >> crc;
      e.payloads.emplace_back(len, crc);
    }
  }
  return e;
}

std::vector<std::string> ReadRecords(const std::string& name) {
  auto f = fs::LocalFileSystem()->NewSequentialFile(std::string(EMBER_RECORD_TESTDATA) + "/" + name);
  EXPECT_TRUE(f.ok());
  auto r = RecordReader::Open(std::move(*f));  // compression from the name
  EXPECT_TRUE(r.ok());
  std::vector<std::string> out;
  std::string_view rec;
  for (;;) {
    auto more = (*r)->Next(&rec);
    EXPECT_TRUE(more.ok()) << more.status().ToString();
    if (!more.ok() || !*more) break;
    out.emplace_back(rec);
  }
  return out;
}

std::string Hex(const uint8_t* p, size_t n) {
  static const char* d = "0123456789abcdef";
  std::string s;
  for (size_t i = 0; i < n; ++i) {
    s.push_back(d[p[i] >> 4]);
    s.push_back(d[p[i] & 15]);
  }
  return s.empty() ? "-" : s;
}

TEST(Golden, TensorFlowExamplesDecode) {
  Expected e = Load();
  ASSERT_EQ(e.files.size(), 4u);
  std::map<std::string, FeatureKind> kinds;
  for (const auto& [key, val] : e.features) kinds[key.second] = *example::ParseKind(val.first);
  std::vector<example::FeatureSpec> schema;
  for (const auto& [name, kind] : kinds) schema.push_back({name, kind});

  for (const auto& [name, comp, n] : e.files) {
    if (name.rfind("examples", 0) != 0) continue;
    SCOPED_TRACE(name);
    auto recs = ReadRecords(name);
    ASSERT_EQ(recs.size(), n);
    std::vector<std::string_view> views(recs.begin(), recs.end());
    auto cols = example::DecodeExamples(views, schema);
    ASSERT_TRUE(cols.ok()) << cols.status().ToString();
    for (const auto& c : *cols) {
      for (int row = 0; row < e.rows; ++row) {
        SCOPED_TRACE(c.name + " row " + std::to_string(row));
        auto it = e.features.find({row, c.name});
        if (it == e.features.end()) {
          EXPECT_EQ(c.present[row], 0);
          continue;
        }
        EXPECT_EQ(c.present[row], 1);
        const auto& want = it->second.second;
        size_t b = static_cast<size_t>(c.row_splits[row]), end = static_cast<size_t>(c.row_splits[row + 1]);
        ASSERT_EQ(end - b, want.size());
        for (size_t j = 0; j < want.size(); ++j) {
          switch (c.kind) {
            case FeatureKind::kFloat: EXPECT_EQ(c.floats[b + j], std::stof(want[j])); break;
            case FeatureKind::kInt64: EXPECT_EQ(c.ints[b + j], std::stoll(want[j])); break;
            case FeatureKind::kBytes: {
              size_t lo = static_cast<size_t>(c.bytes_offsets[b + j]);
              size_t hi = static_cast<size_t>(c.bytes_offsets[b + j + 1]);
              EXPECT_EQ(Hex(c.bytes_data.data() + lo, hi - lo), want[j]);
              break;
            }
          }
        }
      }
    }
  }
}

TEST(Golden, SchemaInferredFromTensorFlowFile) {
  auto recs = ReadRecords("examples.tfrecord.gz");
  example::SchemaInferrer inf;
  for (const auto& r : recs) ASSERT_TRUE(inf.Add(r).ok());
  std::map<std::string, example::InferredFeature> by_name;
  for (const auto& f : inf.Finish()) by_name[f.name] = f;
  ASSERT_EQ(by_name.size(), 8u);
  EXPECT_EQ(by_name["label"].kind, FeatureKind::kInt64);
  EXPECT_EQ(by_name["label"].min_length, 1);
  EXPECT_EQ(by_name["label"].max_length, 1);
  EXPECT_EQ(by_name["vec"].kind, FeatureKind::kFloat);
  EXPECT_EQ(by_name["vec"].min_length, 3);
  EXPECT_EQ(by_name["vec"].max_length, 3);
  EXPECT_EQ(by_name["tags"].min_length, 0);
  EXPECT_EQ(by_name["tags"].max_length, 3);
  EXPECT_EQ(by_name["name"].present_rows, 2);
  EXPECT_EQ(by_name["sparse"].present_rows, 1);
  EXPECT_EQ(by_name["empty"].max_length, 0);
  EXPECT_EQ(by_name["empty"].kind, FeatureKind::kFloat);  // TF writes an empty float_list
}

TEST(Golden, ArbitraryPayloads) {
  Expected e = Load();
  auto recs = ReadRecords("payloads.tfrecord");
  ASSERT_EQ(recs.size(), e.payloads.size());
  for (size_t i = 0; i < recs.size(); ++i) {
    EXPECT_EQ(recs[i].size(), e.payloads[i].first);
    uint32_t crc = static_cast<uint32_t>(
        crc32(0, reinterpret_cast<const Bytef*>(recs[i].data()), static_cast<uInt>(recs[i].size())));
    EXPECT_EQ(crc, e.payloads[i].second) << i;
  }
}

}  // namespace
}  // namespace ember::record
