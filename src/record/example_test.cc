// tf.Example codec: round trips over every kind, the wire forms protobuf
// allows (packed, unpacked, unknown fields, repeated keys), nulls, and the
// errors for wrong kinds, lengths and malformed bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "ember/example.h"
#include "record/example_wire.h"

namespace ember::example {
namespace {

// Hand-built protobuf, to produce forms our encoder never writes.
std::string Tag(uint32_t number, wire::WireType t) {
  std::string s;
  wire::PutTag(&s, number, t);
  return s;
}
std::string Len(uint32_t number, const std::string& payload) {
  std::string s = Tag(number, wire::kLen);
  wire::PutVarint(&s, payload.size());
  return s + payload;
}
std::string Varint(uint32_t number, uint64_t v) {
  std::string s = Tag(number, wire::kVarint);
  wire::PutVarint(&s, v);
  return s;
}
std::string Fixed32(uint32_t number, float f) {
  std::string s = Tag(number, wire::kFixed32);
  s.append(reinterpret_cast<const char*>(&f), 4);
  return s;
}
std::string Entry(const std::string& key, const std::string& feature) {
  return Len(1, Len(1, key) + Len(2, feature));
}
std::string ExampleOf(const std::string& entries) { return Len(1, entries); }

FeatureColumn FloatColumn(std::string name, std::vector<std::vector<float>> rows, std::vector<uint8_t> present) {
  FeatureColumn c;
  c.name = std::move(name);
  c.kind = FeatureKind::kFloat;
  for (size_t i = 0; i < rows.size(); ++i) {
    c.floats.insert(c.floats.end(), rows[i].begin(), rows[i].end());
    c.row_splits.push_back(static_cast<int64_t>(c.floats.size()));
  }
  c.present = std::move(present);
  return c;
}

FeatureColumn IntColumn(std::string name, std::vector<std::vector<int64_t>> rows, std::vector<uint8_t> present) {
  FeatureColumn c;
  c.name = std::move(name);
  c.kind = FeatureKind::kInt64;
  for (const auto& r : rows) {
    c.ints.insert(c.ints.end(), r.begin(), r.end());
    c.row_splits.push_back(static_cast<int64_t>(c.ints.size()));
  }
  c.present = std::move(present);
  return c;
}

FeatureColumn BytesColumn(std::string name, std::vector<std::vector<std::string>> rows, std::vector<uint8_t> present) {
  FeatureColumn c;
  c.name = std::move(name);
  c.kind = FeatureKind::kBytes;
  for (const auto& r : rows) {
    for (const auto& v : r) {
      c.bytes_data.insert(c.bytes_data.end(), v.begin(), v.end());
      c.bytes_offsets.push_back(static_cast<int64_t>(c.bytes_data.size()));
    }
    c.row_splits.push_back(static_cast<int64_t>(c.bytes_offsets.size() - 1));
  }
  c.present = std::move(present);
  return c;
}

void ExpectSameColumn(const FeatureColumn& a, const FeatureColumn& b) {
  EXPECT_EQ(a.name, b.name);
  EXPECT_EQ(a.kind, b.kind);
  EXPECT_EQ(a.floats, b.floats) << a.name;
  EXPECT_EQ(a.ints, b.ints) << a.name;
  EXPECT_EQ(a.bytes_data, b.bytes_data) << a.name;
  EXPECT_EQ(a.bytes_offsets, b.bytes_offsets) << a.name;
  EXPECT_EQ(a.row_splits, b.row_splits) << a.name;
  EXPECT_EQ(a.present, b.present) << a.name;
}

std::vector<std::string_view> Split(const std::string& data, const std::vector<int64_t>& offsets) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    out.emplace_back(data.data() + offsets[i], static_cast<size_t>(offsets[i + 1] - offsets[i]));
  }
  return out;
}

std::vector<FeatureColumn> Sample() {
  return {
      FloatColumn("x", {{1.5f}, {}, {-2.0f, 3.25f, 1e30f}, {0.0f}}, {1, 1, 1, 0}),
      IntColumn("id", {{0}, {-1, INT64_MIN, INT64_MAX}, {300}, {}}, {1, 1, 1, 1}),
      BytesColumn("s", {{"a", "", "ccc"}, {}, {std::string("\0\xff", 2)}, {"z"}}, {1, 0, 1, 1}),
  };
}

TEST(Example, RoundTripEveryKind) {
  auto cols = Sample();
  std::vector<ColumnView> views;
  for (const auto& c : cols) views.push_back(View(c));
  std::string data;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(EncodeExamples(views, &data, &offsets).ok());
  ASSERT_EQ(offsets.size(), 5u);
  auto decoded = DecodeExamples(Split(data, offsets), {{"x", FeatureKind::kFloat},
                                                       {"id", FeatureKind::kInt64},
                                                       {"s", FeatureKind::kBytes}});
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  ASSERT_EQ(decoded->size(), 3u);
  // A null row's values are not written, so they do not come back.
  FeatureColumn want_x = FloatColumn("x", {{1.5f}, {}, {-2.0f, 3.25f, 1e30f}, {}}, {1, 1, 1, 0});
  FeatureColumn want_s = BytesColumn("s", {{"a", "", "ccc"}, {}, {std::string("\0\xff", 2)}, {"z"}}, {1, 0, 1, 1});
  ExpectSameColumn((*decoded)[0], want_x);
  ExpectSameColumn((*decoded)[1], cols[1]);
  ExpectSameColumn((*decoded)[2], want_s);
}

TEST(Example, EncodingSortsFeaturesByName) {
  auto cols = Sample();
  std::vector<ColumnView> ab = {View(cols[0]), View(cols[1]), View(cols[2])};
  std::vector<ColumnView> ba = {View(cols[2]), View(cols[0]), View(cols[1])};
  std::string d1, d2;
  std::vector<int64_t> o1, o2;
  ASSERT_TRUE(EncodeExamples(ab, &d1, &o1).ok());
  ASSERT_TRUE(EncodeExamples(ba, &d2, &o2).ok());
  EXPECT_EQ(d1, d2);
  // Row 0 = features "id", "s", "x" in that order.
  std::string_view row0(d1.data(), static_cast<size_t>(o1[1]));
  EXPECT_LT(row0.find("\x02id"), row0.find("\x01s"));
  EXPECT_LT(row0.find("\x01s"), row0.find("\x01x"));
}

TEST(Example, KnownBytesMatchProtobuf) {
  // Example{features{feature{key:"a" value{int64_list{value:[1, 2]}}}}},
  // as protobuf serialises it.
  auto c = IntColumn("a", {{1, 2}}, {1});
  std::vector<ColumnView> v = {View(c)};
  std::string data;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(EncodeExamples(v, &data, &offsets).ok());
  EXPECT_EQ(data, std::string("\x0a\x0d\x0a\x0b\x0a\x01" "a" "\x12\x06\x1a\x04\x0a\x02\x01\x02", 15));
  EXPECT_EQ(data, ExampleOf(Entry("a", Len(3, Len(1, std::string("\x01\x02", 2))))));
}

TEST(Example, EmptyListIsPresentNotNull) {
  auto c = FloatColumn("e", {{}, {}}, {1, 0});
  std::vector<ColumnView> v = {View(c)};
  std::string data;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(EncodeExamples(v, &data, &offsets).ok());
  auto d = DecodeExamples(Split(data, offsets), {{"e", FeatureKind::kFloat}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[0].present, (std::vector<uint8_t>{1, 0}));
  EXPECT_EQ((*d)[0].row_splits, (std::vector<int64_t>{0, 0, 0}));
}

// Issue 18: a batch whose every row of a string list is [] reaches the
// encoder as Arrow gives it, with no offsets at all (an Arrow array of length
// 0 may have an empty offsets buffer); save_as_tfrecords failed on it.
TEST(Example, EmptyBytesListsWithNoOffsetsRoundTrip) {
  auto c = BytesColumn("as_", {{}, {}, {}}, {1, 1, 0});
  ColumnView v = View(c);
  v.bytes_offsets = {};
  v.bytes_data = {};
  std::vector<ColumnView> views = {v};
  std::string data;
  std::vector<int64_t> offsets;
  Status st = EncodeExamples(views, &data, &offsets);
  ASSERT_TRUE(st.ok()) << st.ToString();
  // The two present rows hold an empty bytes_list; the null row omits it.
  EXPECT_EQ(data.substr(static_cast<size_t>(offsets[0]), static_cast<size_t>(offsets[1] - offsets[0])),
            ExampleOf(Entry("as_", Len(1, ""))));
  // Decoded again (every bytes_list of the batch empty): no values, one
  // offset, the same rows.
  auto d = DecodeExamples(Split(data, offsets), {{"as_", FeatureKind::kBytes}});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  ExpectSameColumn((*d)[0], c);
  EXPECT_EQ((*d)[0].num_values(), 0u);
  EXPECT_EQ((*d)[0].bytes_offsets, (std::vector<int64_t>{0}));
  // No offsets with rows that do hold values is still an error.
  auto x = BytesColumn("x", {{"a"}}, {1});
  ColumnView xv = View(x);
  xv.bytes_offsets = {};
  std::vector<ColumnView> bad = {xv};
  st = EncodeExamples(bad, &data, &offsets);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("'x'"), std::string::npos) << st.ToString();
}

TEST(Example, UnpackedAndPackedAndUnknownFields) {
  // floats: one unpacked, then a packed run of two; ints: unpacked varints
  // around a packed run; unknown fields at every level.
  std::string packed_floats;
  float f2[2] = {2.0f, 3.0f};
  packed_floats.append(reinterpret_cast<const char*>(f2), 8);
  std::string float_list = Fixed32(1, 1.0f) + Varint(9, 5) + Len(1, packed_floats);
  std::string packed_ints;
  wire::PutVarint(&packed_ints, 20);
  wire::PutVarint(&packed_ints, static_cast<uint64_t>(int64_t{-30}));
  std::string int_list = Varint(1, 10) + Len(1, packed_ints) + Len(7, "junk") + Varint(1, 40);
  std::string bytes_list = Len(1, "p") + Fixed32(2, 0.0f) + Len(1, "q");
  std::string ex = ExampleOf(Entry("f", Len(2, float_list) + Varint(8, 1)) + Entry("i", Len(3, int_list)) +
                             Entry("b", Len(1, bytes_list)) + Varint(4, 77)) +
                   Len(2, "unknown example field");
  std::vector<std::string_view> recs = {ex};
  auto d = DecodeExamples(recs, {{"f", FeatureKind::kFloat}, {"i", FeatureKind::kInt64}, {"b", FeatureKind::kBytes}});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)[0].floats, (std::vector<float>{1.0f, 2.0f, 3.0f}));
  EXPECT_EQ((*d)[1].ints, (std::vector<int64_t>{10, 20, -30, 40}));
  EXPECT_EQ((*d)[2].bytes_data, (std::vector<uint8_t>{'p', 'q'}));
  EXPECT_EQ((*d)[2].bytes_offsets, (std::vector<int64_t>{0, 1, 2}));
}

TEST(Example, RepeatedKeyKeepsTheLastAndSplitFeaturesMerge) {
  std::string a1 = Entry("k", Len(3, Len(1, std::string("\x01", 1))));
  std::string a2 = Entry("k", Len(3, Len(1, std::string("\x02", 1))));
  std::string other = Entry("o", Len(3, Len(1, std::string("\x05", 1))));
  // Two `features` fields: protobuf merges their maps.
  std::string ex = ExampleOf(a1 + other) + ExampleOf(a2);
  std::vector<std::string_view> recs = {ex};
  auto d = DecodeExamples(recs, {{"k", FeatureKind::kInt64}, {"o", FeatureKind::kInt64}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[0].ints, (std::vector<int64_t>{2}));
  EXPECT_EQ((*d)[1].ints, (std::vector<int64_t>{5}));
}

TEST(Example, OneofKeepsTheLastKind) {
  // float_list then int64_list: the Feature is an int64 list.
  std::string feature = Len(2, Fixed32(1, 1.0f)) + Len(3, Varint(1, 9));
  std::string ex = ExampleOf(Entry("k", feature));
  std::vector<std::string_view> recs = {ex};
  auto d = DecodeExamples(recs, {{"k", FeatureKind::kInt64}});
  ASSERT_TRUE(d.ok()) << d.status().ToString();
  EXPECT_EQ((*d)[0].ints, (std::vector<int64_t>{9}));
}

TEST(Example, EmptyFeatureIsAnEmptyListOfAnyKind) {
  std::string ex = ExampleOf(Entry("k", ""));
  std::vector<std::string_view> recs = {ex};
  auto d = DecodeExamples(recs, {{"k", FeatureKind::kBytes}});
  ASSERT_TRUE(d.ok());
  EXPECT_EQ((*d)[0].present, (std::vector<uint8_t>{1}));
  EXPECT_EQ((*d)[0].num_values(), 0u);
}

TEST(Example, WrongKindNamesRowAndFeatureAndKeepsNothingOfTheRow) {
  auto a = IntColumn("a", {{1}, {2}}, {1, 1});
  auto b = FloatColumn("b", {{1.0f}, {2.0f}}, {1, 1});
  std::vector<ColumnView> v = {View(a), View(b)};
  std::string data;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(EncodeExamples(v, &data, &offsets).ok());
  auto recs = Split(data, offsets);
  auto dec = ExampleDecoder::Make({{"a", FeatureKind::kInt64}, {"b", FeatureKind::kInt64}});
  ASSERT_TRUE(dec.ok());
  Status st = dec->Add(recs[0]);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 0"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("'b'"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("float"), std::string::npos) << st.ToString();
  EXPECT_EQ(dec->num_rows(), 0u);
  auto cols = dec->Finish();
  EXPECT_TRUE(cols[0].ints.empty());  // "a" of the failed row rolled back
  EXPECT_EQ(cols[0].row_splits, (std::vector<int64_t>{0}));
  EXPECT_TRUE(cols[0].present.empty());
}

TEST(Example, FixedLength) {
  auto c = FloatColumn("v", {{1, 2, 3}, {4, 5}}, {1, 1});
  std::vector<ColumnView> v = {View(c)};
  std::string data;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(EncodeExamples(v, &data, &offsets).ok());
  auto recs = Split(data, offsets);
  auto dec = ExampleDecoder::Make({{"v", FeatureKind::kFloat, 3}});
  ASSERT_TRUE(dec.ok());
  ASSERT_TRUE(dec->Add(recs[0]).ok());
  Status st = dec->Add(recs[1]);
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 1"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("has 2 values, the schema says 3"), std::string::npos) << st.ToString();
  auto cols = dec->Finish();
  EXPECT_EQ(cols[0].floats, (std::vector<float>{1, 2, 3}));
  EXPECT_EQ(cols[0].row_splits, (std::vector<int64_t>{0, 3}));
}

// A raw array per record (RawBytes in Python): a value of another size
// fails its row, naming the feature and both sizes; the column stays whole.
TEST(Example, ValueBytes) {
  auto dec = ExampleDecoder::Make({{"px", FeatureKind::kBytes, 1, 4}});
  ASSERT_TRUE(dec.ok());
  ASSERT_TRUE(dec->Add(ExampleOf(Entry("px", Len(1, Len(1, "abcd"))))).ok());
  Status st = dec->Add(ExampleOf(Entry("px", Len(1, Len(1, "abc")))));
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 1, feature 'px'"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("a value of 3 bytes, the schema says 4"), std::string::npos) << st.ToString();
  ASSERT_TRUE(dec->Add(ExampleOf(Entry("px", Len(1, Len(1, "wxyz"))))).ok());
  auto cols = dec->Finish();
  EXPECT_EQ(std::string(cols[0].bytes_data.begin(), cols[0].bytes_data.end()), "abcdwxyz");
  EXPECT_EQ(cols[0].bytes_offsets, (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(cols[0].row_splits, (std::vector<int64_t>{0, 1, 2}));
  EXPECT_FALSE(ExampleDecoder::Make({{"n", FeatureKind::kInt64, 1, 4}}).ok());  // bytes only
}

TEST(Example, RowIndexCountsAcrossFinish) {
  auto dec = ExampleDecoder::Make({{"k", FeatureKind::kInt64}});
  ASSERT_TRUE(dec.ok());
  ASSERT_TRUE(dec->Add(ExampleOf("")).ok());
  (void)dec->Finish();
  Status st = dec->Add("\xff");
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("row 1"), std::string::npos) << st.ToString();
}

TEST(Example, TruncationAtEveryByteNeverCrashesAndKeepsColumnsWhole) {
  auto cols = Sample();
  std::vector<ColumnView> views;
  for (const auto& c : cols) views.push_back(View(c));
  std::string data;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(EncodeExamples(views, &data, &offsets).ok());
  std::string row2 = data.substr(offsets[2], offsets[3] - offsets[2]);
  for (size_t cut = 0; cut < row2.size(); ++cut) {
    auto dec = ExampleDecoder::Make({{"x", FeatureKind::kFloat}, {"id", FeatureKind::kInt64}, {"s", FeatureKind::kBytes}});
    ASSERT_TRUE(dec.ok());
    Status st = dec->Add(row2.substr(0, cut));
    if (!st.ok()) {
      EXPECT_EQ(st.code(), StatusCode::kCorruption) << cut;
      EXPECT_EQ(dec->num_rows(), 0u);
    }
    for (const auto& c : dec->Finish()) {
      ASSERT_EQ(c.row_splits.size(), c.present.size() + 1);
      ASSERT_EQ(static_cast<size_t>(c.row_splits.back()), c.num_values());
    }
  }
}

TEST(Example, BadSchemas) {
  EXPECT_FALSE(ExampleDecoder::Make({{"", FeatureKind::kFloat}}).ok());
  EXPECT_FALSE(ExampleDecoder::Make({{"a", FeatureKind::kFloat}, {"a", FeatureKind::kInt64}}).ok());
  EXPECT_FALSE(ExampleDecoder::Make({{"a", FeatureKind::kFloat, -2}}).ok());
  EXPECT_EQ(ParseKind("int64").ValueOr(FeatureKind::kBytes), FeatureKind::kInt64);
  EXPECT_FALSE(ParseKind("double").ok());
}

TEST(Example, EncoderRejectsInconsistentBuffers) {
  std::string data;
  std::vector<int64_t> offsets;
  auto c = FloatColumn("v", {{1, 2}}, {1});
  ColumnView v = View(c);
  std::vector<int64_t> bad_splits = {0, 5};
  v.row_splits = bad_splits;
  std::vector<ColumnView> vs = {v};
  Status st = EncodeExamples(vs, &data, &offsets);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("'v'"), std::string::npos);
  auto a = FloatColumn("v", {{1}}, {1});
  auto b = FloatColumn("w", {{1}, {2}}, {1, 1});
  std::vector<ColumnView> mismatched = {View(a), View(b)};
  EXPECT_EQ(EncodeExamples(mismatched, &data, &offsets).code(), StatusCode::kInvalidArgument);
  std::vector<ColumnView> twice = {View(a), View(a)};
  EXPECT_EQ(EncodeExamples(twice, &data, &offsets).code(), StatusCode::kInvalidArgument);
}

TEST(SchemaInference, KindsLengthsAndNulls) {
  auto cols = Sample();
  std::vector<ColumnView> views;
  for (const auto& c : cols) views.push_back(View(c));
  std::string data;
  std::vector<int64_t> offsets;
  ASSERT_TRUE(EncodeExamples(views, &data, &offsets).ok());
  SchemaInferrer inf;
  for (auto r : Split(data, offsets)) ASSERT_TRUE(inf.Add(r).ok());
  auto s = inf.Finish();
  ASSERT_EQ(s.size(), 3u);
  EXPECT_EQ(s[0].name, "id");
  EXPECT_EQ(s[0].kind, FeatureKind::kInt64);
  EXPECT_EQ(s[0].min_length, 0);
  EXPECT_EQ(s[0].max_length, 3);
  EXPECT_EQ(s[0].present_rows, 4);
  EXPECT_EQ(s[1].name, "s");
  EXPECT_EQ(s[1].kind, FeatureKind::kBytes);
  EXPECT_EQ(s[1].present_rows, 3);
  EXPECT_EQ(s[1].min_length, 1);
  EXPECT_EQ(s[1].max_length, 3);
  EXPECT_EQ(s[2].name, "x");
  EXPECT_EQ(s[2].kind, FeatureKind::kFloat);
  EXPECT_EQ(s[2].present_rows, 3);
  EXPECT_EQ(inf.num_rows(), 4u);
}

TEST(SchemaInference, ConflictingKindsNameRowAndFeature) {
  SchemaInferrer inf;
  ASSERT_TRUE(inf.Add(ExampleOf(Entry("k", ""))).ok());  // no kind yet
  ASSERT_TRUE(inf.Add(ExampleOf(Entry("k", Len(3, Varint(1, 1))))).ok());
  Status st = inf.Add(ExampleOf(Entry("k", Len(2, Fixed32(1, 1.0f)))));
  ASSERT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("row 2"), std::string::npos) << st.ToString();
  EXPECT_NE(st.message().find("'k'"), std::string::npos) << st.ToString();
  auto s = inf.Finish();
  ASSERT_EQ(s.size(), 1u);
  EXPECT_EQ(s[0].kind, FeatureKind::kInt64);
  EXPECT_EQ(s[0].present_rows, 2);
  EXPECT_EQ(inf.Add("\x0a\x05").code(), StatusCode::kCorruption);
}

}  // namespace
}  // namespace ember::example
