#include <gtest/gtest.h>

#include "ember/coordinator.h"

namespace ember {
namespace {

ClusterLayout Layout(int nodes, int ps = 0, std::string master = "", bool eval = false) {
  ClusterLayout l;
  l.num_nodes = nodes;
  l.num_ps = ps;
  l.master_node = std::move(master);
  l.eval_node = eval;
  return l;
}

std::string Role(const ClusterLayout& l, int id) {
  Result<RoleAssignment> r = AssignRole(l, id);
  if (!r.ok()) return r.status().ToString();
  return r->job_name + ":" + std::to_string(r->task_index);
}

TEST(RolesTest, TfosOrder) {
  ClusterLayout l = Layout(6, 2, "chief", true);
  EXPECT_EQ(Role(l, 0), "ps:0");
  EXPECT_EQ(Role(l, 1), "ps:1");
  EXPECT_EQ(Role(l, 2), "chief:0");
  EXPECT_EQ(Role(l, 3), "evaluator:0");
  EXPECT_EQ(Role(l, 4), "worker:0");
  EXPECT_EQ(Role(l, 5), "worker:1");
}

TEST(RolesTest, WorkersOnlyAndMaster) {
  ClusterLayout l = Layout(2, 0);
  EXPECT_EQ(Role(l, 0), "worker:0");
  EXPECT_EQ(Role(l, 1), "worker:1");
  l.master_node = "master";
  EXPECT_EQ(Role(l, 0), "master:0");
  EXPECT_EQ(Role(l, 1), "worker:0");
}

TEST(RolesTest, InvalidLayoutsNameTheField) {
  EXPECT_NE(Role(Layout(0, 0), 0).find("num_nodes"), std::string::npos);
  EXPECT_NE(Role(Layout(2, 0, "boss"), 0).find("master_node"), std::string::npos);
  EXPECT_NE(Role(Layout(2, 2, "", true), 0).find("too small"),
            std::string::npos);
  EXPECT_NE(Role(Layout(2, -1), 0).find("num_ps"), std::string::npos);
  EXPECT_NE(Role(Layout(2, 0), 2).find("out of range"), std::string::npos);
  EXPECT_NE(Role(Layout(2, 0), -1).find("out of range"), std::string::npos);
}

}  // namespace
}  // namespace ember
