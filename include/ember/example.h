// tf.Example in columnar form: decode many serialized Examples straight into
// one buffer per feature, and encode such buffers back into Examples.  No
// object per value and no map per record (docs/architecture.md says why not
// libprotobuf).
//
// The messages (tensorflow/core/example/{example,feature}.proto):
//   Example  { Features features = 1; }
//   Features { map<string, Feature> feature = 1; }
//   Feature  { oneof kind { BytesList bytes_list = 1; FloatList float_list = 2;
//                           Int64List int64_list = 3; } }
//   BytesList { repeated bytes value = 1; }
//   FloatList { repeated float value = 1 [packed = true]; }
//   Int64List { repeated int64 value = 1 [packed = true]; }
// The decoder accepts packed and unpacked repeated fields and skips unknown
// fields, as protobuf parsers do; a key given twice keeps its last value.
//
// A column for N rows holds a row's values at [row_splits[i],
// row_splits[i+1]) of its values, so scalars, fixed-size and variable-size
// lists share one layout (Arrow's list<T>, tf.RaggedTensor's row_splits).
// present[i] is 0 when row i's Example lacks the feature (null), 1 when it
// has it, even with an empty list.
//
// Thread safety: decoders and inferrers are used by one thread at a time;
// the free functions are thread-safe.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "ember/result.h"
#include "ember/status.h"

namespace ember::example {

enum class FeatureKind : uint8_t { kBytes = 1, kFloat = 2, kInt64 = 3 };  // Feature's field numbers

// "bytes", "float", "int64".
std::string_view KindName(FeatureKind kind);
Result<FeatureKind> ParseKind(std::string_view name);

struct FeatureSpec {
  std::string name;
  FeatureKind kind = FeatureKind::kFloat;
  // >= 0: every present row must hold exactly this many values (a scalar is
  // 1); -1: any number.
  int64_t fixed_length = -1;
  // kBytes, >= 0: every value must be exactly this many bytes (a raw array
  // per record, e.g. an image's pixels); -1: any size.
  int64_t value_bytes = -1;
};

// The decoded values of one feature over N rows; owns its buffers.
struct FeatureColumn {
  std::string name;
  FeatureKind kind = FeatureKind::kFloat;
  std::vector<float> floats;        // kFloat: the values, row after row
  std::vector<int64_t> ints;        // kInt64
  std::vector<uint8_t> bytes_data;  // kBytes: the values' bytes, concatenated
  std::vector<int64_t> bytes_offsets{0};  // kBytes: value j is [offsets[j], offsets[j+1])
  std::vector<int64_t> row_splits{0};     // N + 1 offsets into the values
  std::vector<uint8_t> present;           // N flags

  size_t num_rows() const { return present.size(); }
  size_t num_values() const;
};

// A borrowed column (e.g. numpy arrays), the encoder's input.
struct ColumnView {
  std::string_view name;
  FeatureKind kind = FeatureKind::kFloat;
  std::span<const float> floats;
  std::span<const int64_t> ints;
  std::span<const uint8_t> bytes_data;
  // kBytes: num values + 1 entries, or none for no values (as Arrow allows
  // for an array of length 0).
  std::span<const int64_t> bytes_offsets;
  std::span<const int64_t> row_splits;     // num rows + 1
  std::span<const uint8_t> present;        // num rows, or empty: every row present
};
ColumnView View(const FeatureColumn& column);

// Decodes Examples into columns for `schema`; features not in the schema
// are skipped unparsed.
class ExampleDecoder {
 public:
  // InvalidArgument for an empty or duplicate feature name.
  static Result<ExampleDecoder> Make(std::vector<FeatureSpec> schema);

  // Appends one row per call.  On error (naming the row index, counting all
  // rows this decoder was given, and the feature) nothing of the row is
  // kept: Corruption for malformed bytes, InvalidArgument for a feature of
  // the wrong kind or a fixed length not met.
  Status Add(std::string_view serialized);
  // Returns the columns, in schema order, and starts over with no rows.
  std::vector<FeatureColumn> Finish();
  size_t num_rows() const { return rows_; }
  // Error messages count rows from `row` on (rows other decoders were
  // given first); Finish() otherwise advances the count by its rows.
  void set_first_row(size_t row) { row_base_ = row - rows_; }

 private:
  ExampleDecoder() = default;
  Status DecodeFeature(size_t index, std::string_view feature, bool present);
  std::vector<FeatureSpec> schema_;
  std::vector<FeatureColumn> columns_;
  std::vector<std::pair<std::string, size_t>> sorted_names_;  // name -> schema index
  std::vector<std::string_view> slots_;   // this row's Feature bytes per schema entry
  std::vector<uint8_t> slot_set_;
  size_t rows_ = 0;  // rows in columns_
  size_t row_base_ = 0;  // rows handed out by earlier Finish() calls, for messages
};

// Decodes `records` (one row each) in one call.
Result<std::vector<FeatureColumn>> DecodeExamples(std::span<const std::string_view> records,
                                                  std::vector<FeatureSpec> schema);

// What a sample of records holds per feature.
struct InferredFeature {
  std::string name;
  FeatureKind kind = FeatureKind::kBytes;  // kBytes when no row gave a kind
  int64_t min_length = 0;  // over rows holding the feature
  int64_t max_length = 0;
  int64_t present_rows = 0;  // rows holding it (fewer than the sample: nullable)
};

class SchemaInferrer {
 public:
  // Corruption for malformed bytes, InvalidArgument when a feature's kind
  // differs from earlier rows (naming the row and the feature).
  Status Add(std::string_view serialized);
  // The features seen, sorted by name.
  std::vector<InferredFeature> Finish() const;
  size_t num_rows() const { return rows_; }

 private:
  std::vector<InferredFeature> features_;  // sorted by name
  std::vector<uint8_t> kind_known_;        // per feature: some row gave its kind
  size_t rows_ = 0;
};

// Encodes rows of `columns` (all with the same number of rows) as Examples,
// appended to `out` one after another, with `offsets` (num rows + 1,
// starting at out's size before the call) marking them.  Features are
// written sorted by name; a null row omits the feature.  InvalidArgument
// (naming the column) for inconsistent buffers.
Status EncodeExamples(std::span<const ColumnView> columns, std::string* out, std::vector<int64_t>* offsets);

}  // namespace ember::example
