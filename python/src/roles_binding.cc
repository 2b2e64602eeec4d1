// Bindings of include/ember/roles.h: the roles of a job's nodes and the
// training-rank rules, so that Python asks the core instead of repeating
// them.  Type conversion only.
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "ember/roles.h"

namespace ember::python {
namespace {

using namespace nb::literals;

template <size_t N>
nb::tuple Names(const std::array<std::string_view, N>& names) {
  nb::list out;
  for (std::string_view n : names) out.append(nb::str(n.data(), n.size()));
  return nb::tuple(out);
}

}  // namespace

void BindRoles(nb::module_& m) {
  nb::class_<ClusterLayout>(m, "ClusterLayout",
                            "The shape of a job: how many nodes, and which roles they take.")
      .def(
          "__init__",
          [](ClusterLayout* self, int num_nodes, int num_ps, std::string master_node,
             bool eval_node) {
            new (self) ClusterLayout{num_nodes, num_ps, std::move(master_node), eval_node};
          },
          "num_nodes"_a = 1, "num_ps"_a = 0, "master_node"_a = "", "eval_node"_a = false)
      .def_rw("num_nodes", &ClusterLayout::num_nodes)
      .def_rw("num_ps", &ClusterLayout::num_ps)
      .def_rw("master_node", &ClusterLayout::master_node)
      .def_rw("eval_node", &ClusterLayout::eval_node)
      .def("__repr__", [](const ClusterLayout& l) {
        return "ClusterLayout(num_nodes=" + std::to_string(l.num_nodes) +
               ", num_ps=" + std::to_string(l.num_ps) + ", master_node='" + l.master_node +
               "', eval_node=" + (l.eval_node ? "True" : "False") + ")";
      });

  nb::class_<RoleAssignment>(m, "RoleAssignment")
      .def_ro("job_name", &RoleAssignment::job_name)
      .def_ro("task_index", &RoleAssignment::task_index)
      .def("__repr__", [](const RoleAssignment& r) {
        return "RoleAssignment('" + r.job_name + "', " + std::to_string(r.task_index) + ")";
      });

  m.def(
      "assign_role",
      [](const ClusterLayout& layout, int executor_id) {
        return ValueOrThrow(AssignRole(layout, executor_id));
      },
      "layout"_a, "executor_id"_a,
      "Role of `executor_id` in `layout`; InvalidArgument names a bad layout field.");

  m.attr("ROLES") = Names(kRoles);
  m.attr("TRAINING_ROLES") = Names(kTrainingRoles);
  m.def("is_training_role", [](const std::string& job_name) { return IsTrainingRole(job_name); },
        "job_name"_a, "True for the roles that train: chief, master and worker.");
  m.def("training_size", &TrainingSize, "cluster_spec"_a,
        "The number of training nodes (chief + master + worker) in `cluster_spec`.");
  m.def(
      "training_rank",
      [](const ClusterSpec& spec, const std::string& job_name, int task_index) {
        return TrainingRank(spec, job_name, task_index);
      },
      "cluster_spec"_a, "job_name"_a, "task_index"_a,
      "A node's rank among the training nodes (chief/master first, then workers by task index); "
      "None for ps and evaluator nodes and for a node `cluster_spec` does not list.");
  m.def("training_addresses", &TrainingAddresses, "cluster_spec"_a,
        "The training nodes' \"host:port\" in rank order.");
}

}  // namespace ember::python
