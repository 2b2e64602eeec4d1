// ExampleDecoder: serialized tf.Examples -> one columnar buffer per feature.
//
// Per row: one pass over the Example notes where each schema feature's
// Feature bytes are (features outside the schema are not parsed further);
// then each schema feature appends its values to its column.  A failed row
// is rolled back, so the columns always hold whole rows.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "ember/example.h"
#include "record/example_parse.h"

namespace ember::example {

std::string_view KindName(FeatureKind kind) {
  switch (kind) {
    case FeatureKind::kBytes: return "bytes";
    case FeatureKind::kFloat: return "float";
    case FeatureKind::kInt64: return "int64";
  }
  return "?";
}

Result<FeatureKind> ParseKind(std::string_view name) {
  if (name == "bytes" || name == "bytes_list" || name == "string") return FeatureKind::kBytes;
  if (name == "float" || name == "float_list" || name == "float32") return FeatureKind::kFloat;
  if (name == "int64" || name == "int64_list") return FeatureKind::kInt64;
  return Status::InvalidArgument("unknown feature kind '" + std::string(name) +
                                 "' (expected bytes, float or int64)");
}

size_t FeatureColumn::num_values() const {
  switch (kind) {
    case FeatureKind::kBytes: return bytes_offsets.size() - 1;
    case FeatureKind::kFloat: return floats.size();
    case FeatureKind::kInt64: return ints.size();
  }
  return 0;
}

ColumnView View(const FeatureColumn& c) {
  ColumnView v;
  v.name = c.name;
  v.kind = c.kind;
  v.floats = c.floats;
  v.ints = c.ints;
  v.bytes_data = c.bytes_data;
  v.bytes_offsets = c.bytes_offsets;
  v.row_splits = c.row_splits;
  v.present = c.present;
  return v;
}

Result<ExampleDecoder> ExampleDecoder::Make(std::vector<FeatureSpec> schema) {
  ExampleDecoder d;
  for (size_t i = 0; i < schema.size(); ++i) {
    if (schema[i].name.empty()) return Status::InvalidArgument("feature spec " + std::to_string(i) + " has no name");
    for (size_t j = 0; j < i; ++j) {
      if (schema[j].name == schema[i].name) {
        return Status::InvalidArgument("feature '" + schema[i].name + "' is in the schema twice");
      }
    }
    if (schema[i].fixed_length < -1) {
      return Status::InvalidArgument("feature '" + schema[i].name + "': fixed_length must be >= -1");
    }
    if (schema[i].value_bytes < -1 || (schema[i].value_bytes >= 0 && schema[i].kind != FeatureKind::kBytes)) {
      return Status::InvalidArgument("feature '" + schema[i].name + "': value_bytes must be -1, or >= 0 for bytes");
    }
  }
  d.schema_ = std::move(schema);
  d.columns_.resize(d.schema_.size());
  for (size_t i = 0; i < d.schema_.size(); ++i) {
    d.columns_[i].name = d.schema_[i].name;
    d.columns_[i].kind = d.schema_[i].kind;
  }
  for (size_t i = 0; i < d.schema_.size(); ++i) d.sorted_names_.emplace_back(d.schema_[i].name, i);
  std::sort(d.sorted_names_.begin(), d.sorted_names_.end());
  d.slots_.resize(d.schema_.size());
  d.slot_set_.resize(d.schema_.size());
  return d;
}

Status ExampleDecoder::Add(std::string_view serialized) {
  std::fill(slot_set_.begin(), slot_set_.end(), 0);
  const size_t row = row_base_ + rows_;
  const bool few = schema_.size() <= 8;  // a scan beats the binary search's string compares
  bool ok = parse::ForEachFeature(serialized, [&](std::string_view key, std::string_view value) {
    if (few) {
      for (size_t i = 0; i < schema_.size(); ++i) {
        if (schema_[i].name == key) {
          slots_[i] = value;
          slot_set_[i] = 1;
          return;
        }
      }
      return;
    }
    auto it = std::lower_bound(sorted_names_.begin(), sorted_names_.end(), key,
                               [](const auto& entry, std::string_view k) { return entry.first < k; });
    if (it != sorted_names_.end() && it->first == key) {
      slots_[it->second] = value;
      slot_set_[it->second] = 1;
    }
  });
  if (!ok) return Status::Corruption("Example at row " + std::to_string(row) + ": malformed protobuf");
  for (size_t i = 0; i < schema_.size(); ++i) {
    Status st = DecodeFeature(i, slots_[i], slot_set_[i] != 0);
    if (!st.ok()) {
      // Roll back the features of this row decoded so far.
      for (size_t j = 0; j < i; ++j) {
        FeatureColumn& c = columns_[j];
        c.present.resize(rows_);
        c.row_splits.resize(rows_ + 1);
        const size_t nvalues = static_cast<size_t>(c.row_splits.back());
        c.floats.resize(c.kind == FeatureKind::kFloat ? nvalues : 0);
        c.ints.resize(c.kind == FeatureKind::kInt64 ? nvalues : 0);
        if (c.kind == FeatureKind::kBytes) {
          c.bytes_offsets.resize(nvalues + 1);
          c.bytes_data.resize(static_cast<size_t>(c.bytes_offsets.back()));
        }
      }
      return st;
    }
  }
  ++rows_;
  return Status::OK();
}

Status ExampleDecoder::DecodeFeature(size_t index, std::string_view feature, bool present) {
  const FeatureSpec& spec = schema_[index];
  FeatureColumn& col = columns_[index];
  const size_t row = row_base_ + rows_;
  auto where = [&] { return "Example at row " + std::to_string(row) + ", feature '" + spec.name + "'"; };
  if (!present) {
    col.row_splits.push_back(col.row_splits.back());
    col.present.push_back(0);
    return Status::OK();
  }
  parse::Resolved r;
  if (!parse::Resolve(feature, &r)) return Status::Corruption(where() + ": malformed Feature");
  const size_t before = col.num_values();
  if (r.kind != 0 && r.kind != static_cast<int>(spec.kind)) {
    return Status::InvalidArgument(where() + ": holds a " +
                                   std::string(KindName(static_cast<FeatureKind>(r.kind))) +
                                   " list, the schema says " + std::string(KindName(spec.kind)));
  }
  bool ok = true;
  size_t wrong_size = SIZE_MAX;  // a value's size other than spec.value_bytes
  if (r.kind != 0) {
    ok = parse::ForEachList(feature, r, [&](std::string_view list) {
      if (spec.kind == FeatureKind::kInt64 && list.size() > 16) {  // short lists: push_back's growth will do
        int64_t n = parse::CountValues(list, r.kind);
        if (n < 0) return false;
        // Geometric growth: reserving exactly size + n on every row would
        // reallocate (and copy the column) on every row.
        const size_t want = col.ints.size() + static_cast<size_t>(n);
        if (want > col.ints.capacity()) col.ints.reserve(std::max(want, 2 * col.ints.capacity()));
      }
      return parse::ForEachValue(
          list, r.kind,
          [&](std::string_view b) {
            if (spec.value_bytes >= 0 && b.size() != static_cast<size_t>(spec.value_bytes)) {
              wrong_size = b.size();
              return;
            }
            // insert() from uint8_t pointers is one memmove (from char
            // iterators it would copy byte by byte; resize + memcpy would
            // zero the bytes first).
            const size_t at = col.bytes_data.size();
            if (at + b.size() > col.bytes_data.capacity()) {
              col.bytes_data.reserve(std::max(at + b.size(), 2 * col.bytes_data.capacity()));
            }
            const auto* p = reinterpret_cast<const uint8_t*>(b.data());
            col.bytes_data.insert(col.bytes_data.end(), p, p + b.size());
            col.bytes_offsets.push_back(static_cast<int64_t>(col.bytes_data.size()));
          },
          [&](const char* le, size_t n) {
            const size_t at = col.floats.size();
            col.floats.resize(at + n);
            std::memcpy(col.floats.data() + at, le, n * 4);  // little-endian host
          },
          [&](int64_t v) { col.ints.push_back(v); });
    });
  }
  if (ok && wrong_size != SIZE_MAX) {
    col.bytes_offsets.resize(before + 1);
    col.bytes_data.resize(static_cast<size_t>(col.bytes_offsets.back()));
    return Status::InvalidArgument(where() + ": holds a value of " + std::to_string(wrong_size) +
                                   " bytes, the schema says " + std::to_string(spec.value_bytes));
  }
  const size_t count = col.num_values() - before;
  if (ok && spec.fixed_length >= 0 && count != static_cast<size_t>(spec.fixed_length)) {
    // Undo this feature's values before failing.
    col.floats.resize(spec.kind == FeatureKind::kFloat ? before : 0);
    col.ints.resize(spec.kind == FeatureKind::kInt64 ? before : 0);
    if (spec.kind == FeatureKind::kBytes) {
      col.bytes_offsets.resize(before + 1);
      col.bytes_data.resize(static_cast<size_t>(col.bytes_offsets.back()));
    }
    return Status::InvalidArgument(where() + ": has " + std::to_string(count) + " values, the schema says " +
                                   std::to_string(spec.fixed_length));
  }
  if (!ok) {
    col.floats.resize(spec.kind == FeatureKind::kFloat ? before : 0);
    col.ints.resize(spec.kind == FeatureKind::kInt64 ? before : 0);
    if (spec.kind == FeatureKind::kBytes) {
      col.bytes_offsets.resize(before + 1);
      col.bytes_data.resize(static_cast<size_t>(col.bytes_offsets.back()));
    }
    return Status::Corruption(where() + ": malformed " + std::string(KindName(spec.kind)) + " list");
  }
  col.row_splits.push_back(static_cast<int64_t>(col.num_values()));
  col.present.push_back(1);
  return Status::OK();
}

std::vector<FeatureColumn> ExampleDecoder::Finish() {
  std::vector<FeatureColumn> out = std::move(columns_);
  row_base_ += rows_;
  rows_ = 0;
  columns_.clear();
  columns_.resize(schema_.size());
  for (size_t i = 0; i < schema_.size(); ++i) {
    FeatureColumn& c = columns_[i];
    c.name = schema_[i].name;
    c.kind = schema_[i].kind;
    // The next batch is most likely shaped like this one: size its buffers
    // up front, so they are written once instead of regrown (and copied)
    // while it fills.
    const FeatureColumn& last = out[i];
    c.floats.reserve(last.floats.size());
    c.ints.reserve(last.ints.size());
    c.bytes_data.reserve(last.bytes_data.size());
    c.bytes_offsets.reserve(last.bytes_offsets.size());
    c.row_splits.reserve(last.row_splits.size());
    c.present.reserve(last.present.size());
  }
  return out;
}

Result<std::vector<FeatureColumn>> DecodeExamples(std::span<const std::string_view> records,
                                                  std::vector<FeatureSpec> schema) {
  EMBER_ASSIGN_OR_RAISE(ExampleDecoder d, ExampleDecoder::Make(std::move(schema)));
  for (std::string_view r : records) EMBER_RETURN_NOT_OK(d.Add(r));
  return d.Finish();
}

}  // namespace ember::example
