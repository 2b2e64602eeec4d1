// Test-only decoder of the event files EventWriter writes: the records of a
// file (ember/record.h's reader) parsed into the few fields the tests check.
// Unknown fields fail the decode, so a stray field in the encoder shows up.
#pragma once

#include <cstring>
#include <string>
#include <vector>

#include "ember/fs.h"
#include "ember/record.h"
#include "record/example_wire.h"
#include "summary/event_encode.h"

namespace ember::summary::testing {

struct DecodedEvent {
  double wall_time = 0;
  int64_t step = 0;
  std::string file_version;
  std::string tag;
  bool has_simple_value = false;
  float simple_value = 0;
  bool has_histo = false;
  Histogram histo;
  std::string plugin_name;
  int data_class = 0;
  int dtype = 0;
  bool has_shape = false;
  std::vector<std::string> string_val;
  int height = 0, width = 0, colorspace = 0;
  std::string image;
};

namespace wire = example::wire;

inline double AsDouble(uint64_t bits) {
  double d;
  std::memcpy(&d, &bits, 8);
  return d;
}

inline bool Doubles(std::string_view packed, std::vector<double>* out) {
  if (packed.size() % 8 != 0) return false;
  out->resize(packed.size() / 8);
  if (!packed.empty()) std::memcpy(out->data(), packed.data(), packed.size());
  return true;
}

// Calls on(field) for each field of `msg`; false if malformed or on() says so.
template <typename F>
bool ForFields(std::string_view msg, F on) {
  wire::Cursor c(msg);
  wire::Field f;
  while (!c.done()) {
    if (!c.Next(&f) || !on(f)) return false;
  }
  return true;
}

inline bool DecodeValue(std::string_view msg, DecodedEvent* e) {
  return ForFields(msg, [e](const wire::Field& f) {
    switch (f.number) {
      case field::kValueTag: e->tag = f.bytes; return true;
      case field::kValueSimpleValue: {
        uint32_t bits = static_cast<uint32_t>(f.varint);
        std::memcpy(&e->simple_value, &bits, 4);
        return e->has_simple_value = true;
      }
      case field::kValueHisto:
        e->has_histo = true;
        return ForFields(f.bytes, [e](const wire::Field& h) {
          switch (h.number) {
            case field::kHistoMin: e->histo.min = AsDouble(h.varint); return true;
            case field::kHistoMax: e->histo.max = AsDouble(h.varint); return true;
            case field::kHistoNum: e->histo.num = AsDouble(h.varint); return true;
            case field::kHistoSum: e->histo.sum = AsDouble(h.varint); return true;
            case field::kHistoSumSquares: e->histo.sum_squares = AsDouble(h.varint); return true;
            case field::kHistoBucketLimit: return Doubles(h.bytes, &e->histo.bucket_limit);
            case field::kHistoBucket: return Doubles(h.bytes, &e->histo.bucket);
            default: return false;
          }
        });
      case field::kValueMetadata:
        return ForFields(f.bytes, [e](const wire::Field& m) {
          if (m.number == field::kMetadataDataClass) return (e->data_class = static_cast<int>(m.varint)), true;
          if (m.number != field::kMetadataPluginData) return false;
          return ForFields(m.bytes, [e](const wire::Field& p) {
            if (p.number == field::kPluginName) return (e->plugin_name = p.bytes), true;
            return p.number == field::kPluginContent;
          });
        });
      case field::kValueTensor:
        return ForFields(f.bytes, [e](const wire::Field& t) {
          switch (t.number) {
            case field::kTensorDtype: e->dtype = static_cast<int>(t.varint); return true;
            case field::kTensorShape: return (e->has_shape = t.bytes.empty());  // a scalar
            case field::kTensorStringVal: e->string_val.emplace_back(t.bytes); return true;
            default: return false;
          }
        });
      case field::kValueImage:
        return ForFields(f.bytes, [e](const wire::Field& i) {
          switch (i.number) {
            case field::kImageHeight: e->height = static_cast<int>(i.varint); return true;
            case field::kImageWidth: e->width = static_cast<int>(i.varint); return true;
            case field::kImageColorspace: e->colorspace = static_cast<int>(i.varint); return true;
            case field::kImageEncoded: e->image = i.bytes; return true;
            default: return false;
          }
        });
      default:
        return false;
    }
  });
}

inline bool DecodeEvent(std::string_view msg, DecodedEvent* e) {
  return ForFields(msg, [e](const wire::Field& f) {
    switch (f.number) {
      case field::kEventWallTime: e->wall_time = AsDouble(f.varint); return true;
      case field::kEventStep: e->step = static_cast<int64_t>(f.varint); return true;
      case field::kEventFileVersion: e->file_version = f.bytes; return true;
      case field::kEventSummary: {
        int values = 0;
        bool ok = ForFields(f.bytes, [e, &values](const wire::Field& s) {
          return s.number == field::kSummaryValue && ++values == 1 && DecodeValue(s.bytes, e);
        });
        return ok && values == 1;
      }
      default:
        return false;
    }
  });
}

// Every event of the file at `path`; Corruption if a record or event is bad.
inline Result<std::vector<DecodedEvent>> ReadEvents(fs::FileSystem& fs, const std::string& path) {
  EMBER_ASSIGN_OR_RAISE(auto file, fs.NewSequentialFile(path));
  EMBER_ASSIGN_OR_RAISE(auto reader, record::RecordReader::Open(std::move(file)));
  std::vector<DecodedEvent> out;
  std::string_view rec;
  while (true) {
    EMBER_ASSIGN_OR_RAISE(bool more, reader->Next(&rec));
    if (!more) break;
    DecodedEvent e;
    if (!DecodeEvent(rec, &e)) return Status::Corruption("bad event #" + std::to_string(out.size()));
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace ember::summary::testing
