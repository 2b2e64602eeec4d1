#include "summary/event_encode.h"

#include <bit>
#include <cstring>

namespace ember::summary {
namespace {

enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void PutTag(std::string* out, uint32_t number, WireType type) {
  PutVarint(out, (static_cast<uint64_t>(number) << 3) | type);
}

// Protobuf's fixed-width fields are little-endian, and so are the hosts
// Ember builds for (x86-64, aarch64): doubles are copied as they are.
static_assert(std::endian::native == std::endian::little, "event encoding assumes little-endian");

void PutDouble(std::string* out, uint32_t number, double v) {
  PutTag(out, number, kFixed64);
  char b[8];
  std::memcpy(b, &v, 8);
  out->append(b, 8);
}

void PutFloat(std::string* out, uint32_t number, float v) {
  PutTag(out, number, kFixed32);
  char b[4];
  std::memcpy(b, &v, 4);
  out->append(b, 4);
}

void PutInt(std::string* out, uint32_t number, int64_t v) {
  PutTag(out, number, kVarint);
  PutVarint(out, static_cast<uint64_t>(v));  // negative: ten bytes, as protobuf's int32/int64
}

void PutBytes(std::string* out, uint32_t number, std::string_view bytes) {
  PutTag(out, number, kLen);
  PutVarint(out, bytes.size());
  out->append(bytes);
}

void PutPackedDoubles(std::string* out, uint32_t number, const std::vector<double>& v) {
  PutTag(out, number, kLen);
  PutVarint(out, v.size() * 8);
  const size_t at = out->size();
  out->resize(at + v.size() * 8);
  if (!v.empty()) std::memcpy(out->data() + at, v.data(), v.size() * 8);
}

// An Event holding one Summary holding one Summary.Value, whose serialized
// bytes are `value`.
void PutEvent(double wall_time, int64_t step, std::string_view value, std::string* out) {
  PutDouble(out, field::kEventWallTime, wall_time);
  PutInt(out, field::kEventStep, step);
  const size_t summary_size = 1 + VarintSize(value.size()) + value.size();
  PutTag(out, field::kEventSummary, kLen);
  PutVarint(out, summary_size);
  PutBytes(out, field::kSummaryValue, value);
}

// SummaryMetadata naming `plugin` (content empty: the plugins' version 0).
std::string PluginMetadata(std::string_view plugin, int data_class) {
  std::string plugin_data;
  PutBytes(&plugin_data, field::kPluginName, plugin);
  std::string metadata;
  PutBytes(&metadata, field::kMetadataPluginData, plugin_data);
  PutInt(&metadata, field::kMetadataDataClass, data_class);
  return metadata;
}

}  // namespace

void EncodeFileVersionEvent(double wall_time, std::string* out) {
  PutDouble(out, field::kEventWallTime, wall_time);
  PutBytes(out, field::kEventFileVersion, kFileVersion);
}

void EncodeScalarEvent(double wall_time, int64_t step, std::string_view tag, float value,
                       std::string* out) {
  // The hot path: the Value's size is known, so it is written in place.
  const size_t value_size = 1 + VarintSize(tag.size()) + tag.size() + 5;
  PutDouble(out, field::kEventWallTime, wall_time);
  PutInt(out, field::kEventStep, step);
  PutTag(out, field::kEventSummary, kLen);
  PutVarint(out, 1 + VarintSize(value_size) + value_size);
  PutTag(out, field::kSummaryValue, kLen);
  PutVarint(out, value_size);
  PutBytes(out, field::kValueTag, tag);
  PutFloat(out, field::kValueSimpleValue, value);
}

void EncodeHistogramEvent(double wall_time, int64_t step, std::string_view tag, const Histogram& h,
                          std::string* out) {
  std::string histo;
  PutDouble(&histo, field::kHistoMin, h.min);
  PutDouble(&histo, field::kHistoMax, h.max);
  PutDouble(&histo, field::kHistoNum, h.num);
  PutDouble(&histo, field::kHistoSum, h.sum);
  PutDouble(&histo, field::kHistoSumSquares, h.sum_squares);
  PutPackedDoubles(&histo, field::kHistoBucketLimit, h.bucket_limit);
  PutPackedDoubles(&histo, field::kHistoBucket, h.bucket);
  std::string value;
  PutBytes(&value, field::kValueTag, tag);
  PutBytes(&value, field::kValueHisto, histo);
  PutEvent(wall_time, step, value, out);
}

void EncodeTextEvent(double wall_time, int64_t step, std::string_view tag, std::string_view text,
                     std::string* out) {
  std::string tensor;
  PutInt(&tensor, field::kTensorDtype, kDtString);
  PutBytes(&tensor, field::kTensorShape, "");  // no dims: a scalar
  PutBytes(&tensor, field::kTensorStringVal, text);
  std::string value;
  PutBytes(&value, field::kValueTag, tag);
  PutBytes(&value, field::kValueMetadata, PluginMetadata("text", kDataClassTensor));
  PutBytes(&value, field::kValueTensor, tensor);
  PutEvent(wall_time, step, value, out);
}

void EncodeImageEvent(double wall_time, int64_t step, std::string_view tag, std::string_view encoded,
                      int height, int width, int channels, std::string* out) {
  std::string image;
  PutInt(&image, field::kImageHeight, height);
  PutInt(&image, field::kImageWidth, width);
  PutInt(&image, field::kImageColorspace, channels);
  PutBytes(&image, field::kImageEncoded, encoded);
  std::string value;
  PutBytes(&value, field::kValueTag, tag);
  PutBytes(&value, field::kValueImage, image);
  PutEvent(wall_time, step, value, out);
}

}  // namespace ember::summary
