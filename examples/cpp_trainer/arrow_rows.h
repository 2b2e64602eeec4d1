// Fashion-MNIST rows out of the feed's Arrow IPC payloads, and predictions
// back into one.  The feed hands rows out as ranges of received record
// batches (ember::feed::RowRange); this is the only file that knows Arrow
// (Arrow C++ as shipped in the pyarrow wheel).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ember/feed.h"
#include "ember/result.h"

namespace arrow {
class RecordBatch;
}

namespace cpp_trainer {

// Images and labels of some rows: pixels is rows x 784 bytes.
struct Examples {
  std::vector<uint8_t> pixels;
  std::vector<int64_t> labels;  // 0 where the rows carry no label
  bool has_labels = true;       // false once a range without a "label" column was appended
  size_t rows() const { return labels.size(); }
};

// Decodes the columns "image" (binary, 784 bytes a row) and "label"
// (integer 0..9; absent is allowed when `need_labels` is false) of the rows
// of `ranges`, appending to `out`.  Keeps the last message decoded, as
// consecutive ranges often share one.  Not thread-safe.
class RowDecoder {
 public:
  ember::Status Append(const std::vector<ember::feed::RowRange>& ranges, bool need_labels,
                       Examples* out);

 private:
  uint64_t message_id_ = 0;
  std::shared_ptr<const void> owner_;  // keeps batch_'s bytes alive
  std::shared_ptr<arrow::RecordBatch> batch_;
};

// An Arrow IPC stream (schema + one record batch) with one int64 column
// "prediction".
ember::Result<std::string> EncodePredictions(std::span<const int64_t> predictions);

}  // namespace cpp_trainer
