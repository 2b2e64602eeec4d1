// EpochBound: what one node knows of one training epoch, and so how many of
// its rows it may hand out while every other node can hand out as many.
//
// Feeding tasks keep the rows each node gets from a partition within one of
// each other, so while partition p is still arriving every other node will
// get at least received[p] - 1 rows of it.  usable() is therefore a lower
// bound on the smallest epoch total over all nodes, exact once every
// partition has ended.
//
// A retried feeding task (Spark task attempt) sends its partition again from
// the start; its rows are counted apart from the failed attempt's, and the
// partition is credited with its largest attempt.  Any attempt gives every
// node at least floor(rows / nodes) rows of the partition, so the bound holds
// as long as the partition has the same rows on every attempt.
//
// Value type; thread-compatible.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <span>
#include <vector>

#include "ember/status.h"

namespace ember::feed {

class EpochBound {
 public:
  // The driver's kEndEpoch: the epoch had `partitions` partitions.
  void SetPartitions(uint32_t partitions) { num_partitions_ = partitions; }
  // Rows of `partition` (task `attempt`) arrived.  Ignored once the
  // partition ended (a late duplicate attempt's rows are extra).
  void AddRows(uint32_t partition, int64_t rows, uint32_t attempt);
  // The partition's kEndPartition: every node's count.  Corruption if the
  // node count differs from earlier markers.  Repeats are ignored.
  Status EndPartition(uint32_t partition, std::span<const int64_t> node_rows);

  bool complete() const;
  int64_t usable() const;

 private:
  std::optional<uint32_t> num_partitions_;
  std::set<uint32_t> ended_;
  std::vector<int64_t> node_totals_;  // over the ended partitions
  std::map<uint32_t, std::map<uint32_t, int64_t>> open_rows_;  // partition -> attempt -> rows
};

}  // namespace ember::feed
