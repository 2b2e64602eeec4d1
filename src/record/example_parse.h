// The shared walk over tf.Example bytes (decoder and schema inference).
// Internal to src/record.  Errors are bare Corruption texts; callers add the
// row and feature.
#pragma once

#include <string_view>

#include "ember/example.h"
#include "record/example_wire.h"

namespace ember::example::parse {

// Calls on_feature(key, feature_bytes) for every map entry of every
// Features of the Example (protobuf merges repeated message fields, so
// several `features` fields are one map).  Returns false if malformed.
template <typename F>
bool ForEachFeature(std::string_view example, F&& on_feature) {
  wire::Cursor ex(example);
  wire::Field f;
  while (!ex.done()) {
    if (!ex.Next(&f)) return false;
    if (f.number != 1 || f.type != wire::kLen) continue;  // unknown field: skipped
    wire::Cursor feats(f.bytes);
    wire::Field e;
    while (!feats.done()) {
      if (!feats.Next(&e)) return false;
      if (e.number != 1 || e.type != wire::kLen) continue;
      std::string_view key, value;  // a missing value is an empty Feature
      wire::Cursor entry(e.bytes);
      wire::Field kv;
      while (!entry.done()) {
        if (!entry.Next(&kv)) return false;
        if (kv.type != wire::kLen) continue;
        if (kv.number == 1) key = kv.bytes;
        else if (kv.number == 2) value = kv.bytes;
      }
      on_feature(key, value);
    }
  }
  return true;
}

// Which list a Feature holds: protobuf's oneof keeps the last kind set, and
// repeated occurrences of that field since the last other kind merge.
struct Resolved {
  int kind = 0;  // 0: no kind set (an empty Feature); else a FeatureKind
  size_t from = 0;  // byte offset in the Feature where that run starts
  // The list, when the Feature is that one field and nothing else (what
  // every writer emits): ForEachList then walks nothing again.
  bool single = false;
  std::string_view list;
};

inline bool Resolve(std::string_view feature, Resolved* out) {
  wire::Cursor c(feature);
  wire::Field f;
  const auto* base = reinterpret_cast<const uint8_t*>(feature.data());
  size_t field_start = 0;
  int fields = 0;
  *out = Resolved{};
  while (!c.done()) {
    field_start = static_cast<size_t>(c.pos() - base);
    if (!c.Next(&f)) return false;
    ++fields;
    if (f.type != wire::kLen || f.number < 1 || f.number > 3) continue;
    if (static_cast<int>(f.number) != out->kind) {
      out->kind = static_cast<int>(f.number);
      out->from = field_start;
    }
    out->list = f.bytes;
  }
  out->single = fields == 1 && out->kind != 0;
  return true;
}

// Calls on_list(list_bytes) for each occurrence of the resolved kind.
template <typename F>
bool ForEachList(std::string_view feature, const Resolved& r, F&& on_list) {
  if (r.single) return on_list(r.list);
  wire::Cursor c(feature.substr(r.from));
  wire::Field f;
  while (!c.done()) {
    if (!c.Next(&f)) return false;
    if (f.type == wire::kLen && static_cast<int>(f.number) == r.kind) {
      if (!on_list(f.bytes)) return false;
    }
  }
  return true;
}

// Visits the values of one list message of `kind`: on_bytes(string_view),
// on_floats(const char* le_bytes, count) for a packed run or one value,
// on_int(int64_t).  Returns false if malformed.
template <typename B, typename Fl, typename I>
bool ForEachValue(std::string_view list, int kind, B&& on_bytes, Fl&& on_floats, I&& on_int) {
  wire::Cursor c(list);
  wire::Field f;
  while (!c.done()) {
    if (!c.Next(&f)) return false;
    if (f.number != 1) continue;
    if (kind == static_cast<int>(FeatureKind::kBytes)) {
      if (f.type == wire::kLen) on_bytes(f.bytes);
    } else if (kind == static_cast<int>(FeatureKind::kFloat)) {
      if (f.type == wire::kLen) {
        if (f.bytes.size() % 4 != 0) return false;
        on_floats(f.bytes.data(), f.bytes.size() / 4);
      } else if (f.type == wire::kFixed32) {
        uint32_t bits = static_cast<uint32_t>(f.varint);
        on_floats(reinterpret_cast<const char*>(&bits), 1);
      }
    } else {
      if (f.type == wire::kLen) {
        const auto* p = reinterpret_cast<const uint8_t*>(f.bytes.data());
        const auto* end = p + f.bytes.size();
        while (p != end) {
          uint64_t v;
          if (!wire::ReadVarint(p, end, &v)) return false;
          on_int(static_cast<int64_t>(v));
        }
      } else if (f.type == wire::kVarint) {
        on_int(static_cast<int64_t>(f.varint));
      }
    }
  }
  return true;
}

// The number of values in a list message of `kind`; -1 if malformed.
inline int64_t CountValues(std::string_view list, int kind) {
  int64_t n = 0;
  wire::Cursor c(list);
  wire::Field f;
  while (!c.done()) {
    if (!c.Next(&f)) return -1;
    if (f.number != 1) continue;
    if (kind == static_cast<int>(FeatureKind::kBytes)) {
      n += f.type == wire::kLen;
    } else if (kind == static_cast<int>(FeatureKind::kFloat)) {
      if (f.type == wire::kLen) {
        if (f.bytes.size() % 4 != 0) return -1;
        n += static_cast<int64_t>(f.bytes.size() / 4);
      } else {
        n += f.type == wire::kFixed32;
      }
    } else {
      if (f.type == wire::kLen) {
        if (!f.bytes.empty() && (static_cast<uint8_t>(f.bytes.back()) & 0x80)) return -1;
        n += static_cast<int64_t>(wire::CountVarints(f.bytes));
      } else {
        n += f.type == wire::kVarint;
      }
    }
  }
  return n;
}

}  // namespace ember::example::parse
