// The roles of a job's nodes, and the rules that follow from them, once.
//
// The coordinator assigns roles from executor ids (AssignRole); a node, its
// launcher and the driver derive the rest from the cluster spec: which roles
// train (and are fed, and join collectives), a training node's rank among
// them, and which node is the job's chief (rank 0: it saves, prints and runs
// TensorBoard).  Python binds these functions (python/src/roles_binding.cc)
// instead of repeating them.
//
// Every function here is pure and thread-safe.
#pragma once

#include <array>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ember/result.h"

namespace ember {

// The shape of a job, as TFoS spells it.  Roles are assigned from the
// executor id (0..num_nodes-1), never from arrival order:
//   [0, num_ps)                 -> "ps"
//   next one if master_node set -> master_node ("chief" or "master")
//   next one if eval_node       -> "evaluator"
//   the rest                    -> "worker"
// task_index counts from 0 within each role.
struct ClusterLayout {
  int num_nodes = 1;
  int num_ps = 0;
  std::string master_node;  // "" (none), "chief" or "master"
  bool eval_node = false;
};

struct RoleAssignment {
  std::string job_name;
  int task_index = 0;
};

// Validates `layout` (num_nodes >= 1, enough nodes for the roles asked for,
// master_node one of "", "chief", "master") and returns the role of
// `executor_id`.  InvalidArgument names the offending field.
Result<RoleAssignment> AssignRole(const ClusterLayout& layout, int executor_id);

// {role: ["host:port", ...]} for every node of a job, each list ordered by
// task index (the TF cluster spec).
using ClusterSpec = std::map<std::string, std::vector<std::string>>;

// Every role a node can have.
inline constexpr std::array<std::string_view, 5> kRoles = {"ps", "chief", "master", "evaluator",
                                                            "worker"};
// The roles that train: they are fed in InputMode.SPARK and join collectives
// (TFoS counts them as "workers").  In rank order: the chief/master comes
// first, then the workers by task index.
inline constexpr std::array<std::string_view, 3> kTrainingRoles = {"chief", "master", "worker"};

// True for "chief", "master" and "worker".
bool IsTrainingRole(std::string_view job_name);

// The number of training nodes in `spec` (TFoS's num_workers): the size of
// the job's collectives.
int TrainingSize(const ClusterSpec& spec);

// The rank of node `job_name`:`task_index` among the training nodes (see
// kTrainingRoles), as collectives number them; nullopt for a ps or evaluator
// node, and for a node that `spec` does not list.
std::optional<int> TrainingRank(const ClusterSpec& spec, std::string_view job_name, int task_index);

// The training nodes' "host:port" addresses in rank order (element r is rank
// r's): what torch.distributed's MASTER_ADDR/LOCAL_RANK are read from.
std::vector<std::string> TrainingAddresses(const ClusterSpec& spec);

}  // namespace ember
