#include "feed/epoch.h"

#include <algorithm>
#include <string>

namespace ember::feed {

void EpochBound::AddRows(uint32_t partition, int64_t rows, uint32_t attempt) {
  if (ended_.count(partition)) return;
  open_rows_[partition][attempt] += rows;
}

Status EpochBound::EndPartition(uint32_t partition, std::span<const int64_t> node_rows) {
  if (ended_.count(partition)) return Status::OK();
  if (node_totals_.empty()) node_totals_.assign(node_rows.size(), 0);
  if (node_rows.size() != node_totals_.size()) {
    return Status::Corruption("kEndPartition of partition " + std::to_string(partition) + " counts " +
                              std::to_string(node_rows.size()) + " nodes, earlier ones of its epoch counted " +
                              std::to_string(node_totals_.size()));
  }
  for (size_t k = 0; k < node_rows.size(); ++k) node_totals_[k] += node_rows[k];
  ended_.insert(partition);
  open_rows_.erase(partition);
  return Status::OK();
}

bool EpochBound::complete() const { return num_partitions_.has_value() && ended_.size() >= *num_partitions_; }

int64_t EpochBound::usable() const {
  int64_t n = node_totals_.empty() ? 0 : *std::min_element(node_totals_.begin(), node_totals_.end());
  for (const auto& [partition, attempts] : open_rows_) {
    int64_t best = 0;
    for (const auto& [attempt, rows] : attempts) best = std::max(best, rows);
    n += std::max<int64_t>(0, best - 1);
  }
  return n;
}

}  // namespace ember::feed
