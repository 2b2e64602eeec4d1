// NodeContext's derived facts, apart from node.cc so that the start-up codec
// (and its fuzz target) links them without the coordinator client.
#include "ember/node.h"
#include "ember/roles.h"

namespace ember {

int NodeContext::num_workers() const { return TrainingSize(cluster_spec); }

std::optional<int> NodeContext::training_rank() const {
  return TrainingRank(cluster_spec, job_name, task_index);
}

}  // namespace ember
