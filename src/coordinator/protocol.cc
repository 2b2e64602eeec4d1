#include "coordinator/protocol.h"

#include <algorithm>
#include <cstdio>

namespace ember::coord {
namespace {

constexpr const char* kRoleOrder[] = {"ps", "chief", "master", "evaluator", "worker"};

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"': *out += "\\\""; break;
      case '\\': *out += "\\\\"; break;
      case '\n': *out += "\\n"; break;
      case '\r': *out += "\\r"; break;
      case '\t': *out += "\\t"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

}  // namespace

std::string DescribeNode(const NodeInfo& n) {
  return n.role.job_name + ":" + std::to_string(n.role.task_index) + " (executor " +
         std::to_string(n.address.executor_id) + ", host " + n.address.host + ", pid " +
         std::to_string(n.address.pid) + ")";
}

std::string ClusterSpecJson(const std::vector<NodeInfo>& nodes) {
  std::string out = "{";
  bool first_role = true;
  for (const char* role : kRoleOrder) {
    std::vector<const NodeInfo*> members;
    for (const NodeInfo& n : nodes) {
      if (n.role.job_name == role) members.push_back(&n);
    }
    if (members.empty()) continue;
    std::sort(members.begin(), members.end(), [](const NodeInfo* a, const NodeInfo* b) {
      return a->role.task_index < b->role.task_index;
    });
    if (!first_role) out += ",";
    first_role = false;
    AppendJsonString(&out, role);
    out += ":[";
    for (size_t i = 0; i < members.size(); ++i) {
      if (i) out += ",";
      AppendJsonString(&out, members[i]->address.host + ":" + std::to_string(members[i]->address.port));
    }
    out += "]";
  }
  out += "}";
  return out;
}

}  // namespace ember::coord
