#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "ember/roles.h"

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

const ClusterSpec kSpec = {{"ps", {"h:1"}},
                           {"chief", {"h:2"}},
                           {"evaluator", {"h:3"}},
                           {"worker", {"h:4", "h:5"}}};

TEST(RolesTest, TrainingRanksCountChiefThenWorkers) {
  EXPECT_EQ(TrainingSize(kSpec), 3);
  EXPECT_EQ(TrainingRank(kSpec, "chief", 0), 0);
  EXPECT_EQ(TrainingRank(kSpec, "worker", 0), 1);
  EXPECT_EQ(TrainingRank(kSpec, "worker", 1), 2);
  EXPECT_EQ(TrainingAddresses(kSpec), (std::vector<std::string>{"h:2", "h:4", "h:5"}));
  const ClusterSpec master = {{"master", {"m:1"}}, {"worker", {"w:1"}}};
  EXPECT_EQ(TrainingRank(master, "master", 0), 0);
  EXPECT_EQ(TrainingRank(master, "worker", 0), 1);
  EXPECT_EQ(TrainingSize(ClusterSpec{}), 0);
}

TEST(RolesTest, PsEvaluatorAndUnlistedNodesHaveNoTrainingRank) {
  EXPECT_EQ(TrainingRank(kSpec, "ps", 0), std::nullopt);
  EXPECT_EQ(TrainingRank(kSpec, "evaluator", 0), std::nullopt);
  EXPECT_EQ(TrainingRank(kSpec, "worker", 2), std::nullopt);
  EXPECT_EQ(TrainingRank(kSpec, "worker", -1), std::nullopt);
  EXPECT_EQ(TrainingRank(kSpec, "boss", 0), std::nullopt);
  EXPECT_TRUE(IsTrainingRole("master"));
  EXPECT_FALSE(IsTrainingRole("evaluator"));
}

TEST(RolesTest, AssignedRolesAreKnownRoles) {
  ClusterLayout l = Layout(6, 2, "master", true);
  for (int id = 0; id < l.num_nodes; ++id) {
    Result<RoleAssignment> r = AssignRole(l, id);
    ASSERT_TRUE(r.ok());
    EXPECT_NE(std::find(kRoles.begin(), kRoles.end(), r->job_name), kRoles.end()) << r->job_name;
  }
}

}  // namespace
}  // namespace ember
