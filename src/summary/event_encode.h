// Protocol-buffer encoding of tensorflow.Event and the messages under it,
// only the fields Ember writes.  Hand-written rather than generated from
// TensorBoard's .proto files (docs/architecture.md, "Summaries", says why);
// the field numbers below are those of tensorflow/core/util/event.proto,
// tensorflow/core/framework/summary.proto, tensor.proto, tensor_shape.proto
// and types.proto, which are frozen (wire compatibility is their contract).
//
// Each Encode* appends one serialized Event to `out`.  Internal to
// src/summary.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace ember::summary {

namespace field {
// Event
constexpr uint32_t kEventWallTime = 1;     // double
constexpr uint32_t kEventStep = 2;         // int64
constexpr uint32_t kEventFileVersion = 3;  // string
constexpr uint32_t kEventSummary = 5;      // Summary
// Summary
constexpr uint32_t kSummaryValue = 1;  // repeated Summary.Value
// Summary.Value
constexpr uint32_t kValueTag = 1;          // string
constexpr uint32_t kValueSimpleValue = 2;  // float
constexpr uint32_t kValueImage = 4;        // Summary.Image
constexpr uint32_t kValueHisto = 5;        // HistogramProto
constexpr uint32_t kValueTensor = 8;       // TensorProto
constexpr uint32_t kValueMetadata = 9;     // SummaryMetadata
// Summary.Image
constexpr uint32_t kImageHeight = 1;        // int32
constexpr uint32_t kImageWidth = 2;         // int32
constexpr uint32_t kImageColorspace = 3;    // int32
constexpr uint32_t kImageEncoded = 4;       // bytes
// HistogramProto
constexpr uint32_t kHistoMin = 1;          // double
constexpr uint32_t kHistoMax = 2;          // double
constexpr uint32_t kHistoNum = 3;          // double
constexpr uint32_t kHistoSum = 4;          // double
constexpr uint32_t kHistoSumSquares = 5;   // double
constexpr uint32_t kHistoBucketLimit = 6;  // repeated double, packed
constexpr uint32_t kHistoBucket = 7;       // repeated double, packed
// SummaryMetadata and its PluginData
constexpr uint32_t kMetadataPluginData = 1;  // PluginData
constexpr uint32_t kMetadataDataClass = 4;   // enum DataClass
constexpr uint32_t kPluginName = 1;          // string
constexpr uint32_t kPluginContent = 2;       // bytes
// TensorProto
constexpr uint32_t kTensorDtype = 1;      // enum DataType
constexpr uint32_t kTensorShape = 2;      // TensorShapeProto (empty: a scalar)
constexpr uint32_t kTensorStringVal = 8;  // repeated bytes
}  // namespace field

constexpr std::string_view kFileVersion = "brain.Event:2";
constexpr int kDtString = 7;          // tensorflow.DataType DT_STRING
constexpr int kDataClassTensor = 2;   // SummaryMetadata DATA_CLASS_TENSOR

// HistogramProto's fields.
struct Histogram {
  double min = 0, max = 0, num = 0, sum = 0, sum_squares = 0;
  std::vector<double> bucket_limit;  // upper edge of each bucket, ascending
  std::vector<double> bucket;        // count in each bucket
};

// The first event of every file: wall time and file_version.
void EncodeFileVersionEvent(double wall_time, std::string* out);
// Summary.Value.simple_value (a float, as TF1 writes it).
void EncodeScalarEvent(double wall_time, int64_t step, std::string_view tag, float value,
                       std::string* out);
void EncodeHistogramEvent(double wall_time, int64_t step, std::string_view tag, const Histogram& h,
                          std::string* out);
// A DT_STRING scalar tensor with plugin_name "text" (the text plugin's form).
void EncodeTextEvent(double wall_time, int64_t step, std::string_view tag, std::string_view text,
                     std::string* out);
void EncodeImageEvent(double wall_time, int64_t step, std::string_view tag, std::string_view encoded,
                      int height, int width, int channels, std::string* out);

}  // namespace ember::summary
