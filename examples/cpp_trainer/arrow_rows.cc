#include "arrow_rows.h"

#include <arrow/api.h>
#include <arrow/io/memory.h>
#include <arrow/ipc/reader.h>
#include <arrow/ipc/writer.h>

#include "softmax.h"

namespace cpp_trainer {
namespace {

ember::Status FromArrow(const arrow::Status& st, const std::string& what) {
  return st.ok() ? ember::Status::OK() : ember::Status::Corruption(what + ": " + st.ToString());
}

// The bytes of row `i` of a binary-like column.
bool ImageBytes(const arrow::Array& column, int64_t i, std::string_view* out) {
  switch (column.type_id()) {
    case arrow::Type::BINARY:
      *out = static_cast<const arrow::BinaryArray&>(column).GetView(i);
      return true;
    case arrow::Type::LARGE_BINARY:
      *out = static_cast<const arrow::LargeBinaryArray&>(column).GetView(i);
      return true;
    case arrow::Type::FIXED_SIZE_BINARY:
      *out = static_cast<const arrow::FixedSizeBinaryArray&>(column).GetView(i);
      return true;
    default:
      return false;
  }
}

bool Label(const arrow::Array& column, int64_t i, int64_t* out) {
  switch (column.type_id()) {
    case arrow::Type::INT64: *out = static_cast<const arrow::Int64Array&>(column).Value(i); return true;
    case arrow::Type::INT32: *out = static_cast<const arrow::Int32Array&>(column).Value(i); return true;
    case arrow::Type::INT16: *out = static_cast<const arrow::Int16Array&>(column).Value(i); return true;
    case arrow::Type::INT8: *out = static_cast<const arrow::Int8Array&>(column).Value(i); return true;
    case arrow::Type::UINT8: *out = static_cast<const arrow::UInt8Array&>(column).Value(i); return true;
    default: return false;
  }
}

}  // namespace

ember::Status RowDecoder::Append(const std::vector<ember::feed::RowRange>& ranges, bool need_labels,
                                 Examples* out) {
  for (const auto& range : ranges) {
    if (batch_ == nullptr || range.message_id != message_id_) {
      std::span<const uint8_t> ipc = range.ipc();
      auto buffer = std::make_shared<arrow::Buffer>(ipc.data(), static_cast<int64_t>(ipc.size()));
      auto reader = arrow::ipc::RecordBatchStreamReader::Open(
          std::make_shared<arrow::io::BufferReader>(buffer));
      EMBER_RETURN_NOT_OK(FromArrow(reader.status(), "open a fed Arrow IPC stream"));
      std::shared_ptr<arrow::RecordBatch> batch;
      EMBER_RETURN_NOT_OK(FromArrow((*reader)->ReadNext(&batch), "read a fed record batch"));
      if (batch == nullptr) return ember::Status::Corruption("a fed Arrow IPC stream has no record batch");
      batch_ = std::move(batch);
      owner_ = range.owner;
      message_id_ = range.message_id;
    }
    auto image = batch_->GetColumnByName("image");
    auto label = batch_->GetColumnByName("label");
    if (image == nullptr || (need_labels && label == nullptr)) {
      return ember::Status::InvalidArgument("fed rows need the columns image (784 bytes) and label; got " +
                                            batch_->schema()->ToString());
    }
    if (range.offset < 0 || range.rows < 0 || range.offset + range.rows > batch_->num_rows()) {
      return ember::Status::Internal("row range outside its record batch");
    }
    if (label == nullptr) out->has_labels = false;
    for (int64_t i = range.offset; i < range.offset + range.rows; ++i) {
      std::string_view bytes;
      if (!ImageBytes(*image, i, &bytes) || bytes.size() != static_cast<size_t>(kPixels)) {
        return ember::Status::InvalidArgument("column image must hold 784 bytes a row (type " +
                                              image->type()->ToString() + ")");
      }
      out->pixels.insert(out->pixels.end(), bytes.begin(), bytes.end());
      int64_t y = 0;
      if (label != nullptr && (!Label(*label, i, &y) || y < 0 || y >= kClasses)) {
        return ember::Status::InvalidArgument("column label must hold integers 0..9 (type " +
                                              label->type()->ToString() + ")");
      }
      out->labels.push_back(y);
    }
  }
  return ember::Status::OK();
}

ember::Result<std::string> EncodePredictions(std::span<const int64_t> predictions) {
  arrow::Int64Builder builder;
  EMBER_RETURN_NOT_OK(FromArrow(builder.AppendValues(predictions.data(), predictions.size()), "predictions"));
  std::shared_ptr<arrow::Array> array;
  EMBER_RETURN_NOT_OK(FromArrow(builder.Finish(&array), "predictions"));
  auto schema = arrow::schema({arrow::field("prediction", arrow::int64())});
  auto batch = arrow::RecordBatch::Make(schema, array->length(), {array});
  auto sink = arrow::io::BufferOutputStream::Create();
  EMBER_RETURN_NOT_OK(FromArrow(sink.status(), "result stream"));
  auto writer = arrow::ipc::MakeStreamWriter(*sink, schema);
  EMBER_RETURN_NOT_OK(FromArrow(writer.status(), "result stream"));
  EMBER_RETURN_NOT_OK(FromArrow((*writer)->WriteRecordBatch(*batch), "write results"));
  EMBER_RETURN_NOT_OK(FromArrow((*writer)->Close(), "write results"));
  auto buffer = (*sink)->Finish();
  EMBER_RETURN_NOT_OK(FromArrow(buffer.status(), "write results"));
  return (*buffer)->ToString();
}

}  // namespace cpp_trainer
