// Coordinator rules that are not byte layouts: how errors name a node, and
// the TF cluster spec a Registration carries (docs/wire.md, "Cluster spec
// JSON").  The messages themselves are in coordinator/codec.h.
#pragma once

#include <string>
#include <vector>

#include "ember/coordinator.h"

namespace ember::coord {

// "worker:1 (executor 2, host h, pid 77)".
std::string DescribeNode(const NodeInfo& node);

// TF cluster spec JSON for `nodes`: keys in TFoS role order (ps, chief,
// master, evaluator, worker), only roles present, each list by task_index.
std::string ClusterSpecJson(const std::vector<NodeInfo>& nodes);

}  // namespace ember::coord
