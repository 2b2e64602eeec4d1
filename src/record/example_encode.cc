// EncodeExamples: columnar buffers -> serialized tf.Examples.
//
// Protobuf nests lengths, so each row is sized bottom-up (list payload,
// list message, Feature, map entry, Features) and then written top-down in
// one pass; nothing is allocated per value.
#include <algorithm>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "ember/example.h"
#include "record/example_wire.h"

namespace ember::example {
namespace {

using wire::PutTag;
using wire::PutVarint;
using wire::VarintSize;

Status Validate(const ColumnView& c, size_t rows) {
  auto bad = [&](const std::string& what) {
    return Status::InvalidArgument("column '" + std::string(c.name) + "': " + what);
  };
  if (c.name.empty()) return Status::InvalidArgument("a column has no name");
  if (c.row_splits.size() != rows + 1) {
    return bad("row_splits has " + std::to_string(c.row_splits.size()) + " entries, expected " +
               std::to_string(rows + 1));
  }
  if (!c.present.empty() && c.present.size() != rows) {
    return bad("present has " + std::to_string(c.present.size()) + " entries for " + std::to_string(rows) + " rows");
  }
  size_t nvalues = 0;
  switch (c.kind) {
    case FeatureKind::kFloat: nvalues = c.floats.size(); break;
    case FeatureKind::kInt64: nvalues = c.ints.size(); break;
    case FeatureKind::kBytes:
      // No offsets at all is zero values: Arrow lets an array of length 0
      // have an empty offsets buffer (Spark's Arrow batches do, for a list
      // column whose every row is []).
      if (c.bytes_offsets.empty()) break;
      nvalues = c.bytes_offsets.size() - 1;
      for (size_t j = 0; j < nvalues; ++j) {
        if (c.bytes_offsets[j] < 0 || c.bytes_offsets[j] > c.bytes_offsets[j + 1]) {
          return bad("bytes_offsets decrease at value " + std::to_string(j));
        }
      }
      if (static_cast<uint64_t>(c.bytes_offsets.back()) > c.bytes_data.size()) {
        return bad("bytes_offsets run past bytes_data");
      }
      break;
    default: return bad("unknown kind");
  }
  if (c.row_splits[0] < 0) return bad("row_splits[0] is negative");
  for (size_t i = 0; i < rows; ++i) {
    if (c.row_splits[i] > c.row_splits[i + 1]) return bad("row_splits decrease at row " + std::to_string(i));
  }
  if (static_cast<uint64_t>(c.row_splits[rows]) > nvalues) {
    return bad("row_splits end at " + std::to_string(c.row_splits[rows]) + ", past the " +
               std::to_string(nvalues) + " values");
  }
  return Status::OK();
}

// Bytes of the list message's payload (its fields) for row values [b, e).
size_t ListPayloadSize(const ColumnView& c, size_t b, size_t e) {
  switch (c.kind) {
    case FeatureKind::kFloat: {
      size_t n = (e - b) * 4;
      return n == 0 ? 0 : 1 + VarintSize(n) + n;
    }
    case FeatureKind::kInt64: {
      if (e == b) return 0;
      size_t n = 0;
      for (size_t j = b; j < e; ++j) n += VarintSize(static_cast<uint64_t>(c.ints[j]));
      return 1 + VarintSize(n) + n;
    }
    case FeatureKind::kBytes: {
      size_t n = 0;
      for (size_t j = b; j < e; ++j) {
        size_t len = static_cast<size_t>(c.bytes_offsets[j + 1] - c.bytes_offsets[j]);
        n += 1 + VarintSize(len) + len;
      }
      return n;
    }
  }
  return 0;
}

void PutListPayload(const ColumnView& c, size_t b, size_t e, std::string* out) {
  switch (c.kind) {
    case FeatureKind::kFloat:
      if (e > b) {
        PutTag(out, 1, wire::kLen);
        PutVarint(out, (e - b) * 4);
        out->append(reinterpret_cast<const char*>(c.floats.data() + b), (e - b) * 4);  // little-endian host
      }
      break;
    case FeatureKind::kInt64:
      if (e > b) {
        size_t n = 0;
        for (size_t j = b; j < e; ++j) n += VarintSize(static_cast<uint64_t>(c.ints[j]));
        PutTag(out, 1, wire::kLen);
        PutVarint(out, n);
        for (size_t j = b; j < e; ++j) PutVarint(out, static_cast<uint64_t>(c.ints[j]));
      }
      break;
    case FeatureKind::kBytes:
      for (size_t j = b; j < e; ++j) {
        size_t len = static_cast<size_t>(c.bytes_offsets[j + 1] - c.bytes_offsets[j]);
        PutTag(out, 1, wire::kLen);
        PutVarint(out, len);
        out->append(reinterpret_cast<const char*>(c.bytes_data.data() + c.bytes_offsets[j]), len);
      }
      break;
  }
}

}  // namespace

Status EncodeExamples(std::span<const ColumnView> columns, std::string* out, std::vector<int64_t>* offsets) {
  size_t rows = columns.empty() ? 0 : columns[0].row_splits.size() - (columns[0].row_splits.empty() ? 0 : 1);
  for (const ColumnView& c : columns) EMBER_RETURN_NOT_OK(Validate(c, rows));
  std::vector<size_t> order(columns.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return columns[a].name < columns[b].name; });
  for (size_t k = 1; k < order.size(); ++k) {
    if (columns[order[k]].name == columns[order[k - 1]].name) {
      return Status::InvalidArgument("column '" + std::string(columns[order[k]].name) + "' given twice");
    }
  }
  offsets->push_back(static_cast<int64_t>(out->size()));
  std::vector<size_t> list_sizes(columns.size());
  for (size_t r = 0; r < rows; ++r) {
    size_t features_size = 0;
    for (size_t i : order) {
      const ColumnView& c = columns[i];
      if (!c.present.empty() && !c.present[r]) continue;
      size_t b = static_cast<size_t>(c.row_splits[r]), e = static_cast<size_t>(c.row_splits[r + 1]);
      size_t list = ListPayloadSize(c, b, e);
      list_sizes[i] = list;
      size_t feature = 1 + VarintSize(list) + list;
      size_t entry = 1 + VarintSize(c.name.size()) + c.name.size() + 1 + VarintSize(feature) + feature;
      features_size += 1 + VarintSize(entry) + entry;
    }
    out->reserve(out->size() + 1 + VarintSize(features_size) + features_size);
    PutTag(out, 1, wire::kLen);  // Example.features
    PutVarint(out, features_size);
    for (size_t i : order) {
      const ColumnView& c = columns[i];
      if (!c.present.empty() && !c.present[r]) continue;
      size_t b = static_cast<size_t>(c.row_splits[r]), e = static_cast<size_t>(c.row_splits[r + 1]);
      size_t list = list_sizes[i];
      size_t feature = 1 + VarintSize(list) + list;
      size_t entry = 1 + VarintSize(c.name.size()) + c.name.size() + 1 + VarintSize(feature) + feature;
      PutTag(out, 1, wire::kLen);  // Features.feature map entry
      PutVarint(out, entry);
      PutTag(out, 1, wire::kLen);  // key
      PutVarint(out, c.name.size());
      out->append(c.name);
      PutTag(out, 2, wire::kLen);  // value: Feature
      PutVarint(out, feature);
      PutTag(out, static_cast<uint32_t>(c.kind), wire::kLen);  // bytes_list / float_list / int64_list
      PutVarint(out, list);
      PutListPayload(c, b, e, out);
    }
    offsets->push_back(static_cast<int64_t>(out->size()));
  }
  return Status::OK();
}

}  // namespace ember::example
