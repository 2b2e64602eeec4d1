#include "node/startup.h"

#include <limits>
#include <utility>

#include "common/codec.h"
#include "ember/roles.h"

namespace ember::node {
namespace {

constexpr size_t kMaxField = std::numeric_limits<uint32_t>::max();

Status CheckLength(std::string_view field, size_t size) {
  if (size > kMaxField) {
    return Status::InvalidArgument("start-up message: " + std::string(field) + " is " +
                                   std::to_string(size) + " bytes or entries; at most 4 GiB fit");
  }
  return Status::OK();
}

// Reads one field, naming it in the error.
template <typename T, typename Get>
Status Field(codec::Reader& r, const char* name, T* out, Get get) {
  Status st = (r.*get)(out);
  return st.ok() ? st : st.WithContext(std::string("start-up message field ") + name);
}

Status NonNegative(const char* name, int64_t value, size_t offset) {
  if (value >= 0) return Status::OK();
  return Status::Corruption("start-up message field " + std::string(name) + " before offset " +
                            std::to_string(offset) + " is negative (" + std::to_string(value) + ")");
}

Status DecodeClusterSpec(codec::Reader& r, std::map<std::string, std::vector<std::string>>* out) {
  uint32_t roles = 0;
  EMBER_RETURN_NOT_OK(Field(r, "cluster_spec", &roles, &codec::Reader::GetU32));
  out->clear();
  const std::string* previous = nullptr;
  for (uint32_t i = 0; i < roles; ++i) {  // each pass consumes >= 8 bytes or fails
    std::string role;
    uint32_t n = 0;
    EMBER_RETURN_NOT_OK(Field(r, "cluster_spec role", &role, &codec::Reader::GetString));
    if (previous != nullptr && !(*previous < role)) {
      return Status::Corruption("start-up message field cluster_spec: role \"" + role +
                                "\" before offset " + std::to_string(r.offset()) +
                                " is not after \"" + *previous + "\" (roles must be sorted, unique)");
    }
    EMBER_RETURN_NOT_OK(Field(r, "cluster_spec address count", &n, &codec::Reader::GetU32));
    std::vector<std::string> addresses;
    for (uint32_t j = 0; j < n; ++j) {  // each pass consumes >= 4 bytes or fails
      std::string address;
      EMBER_RETURN_NOT_OK(Field(r, "cluster_spec address", &address, &codec::Reader::GetString));
      addresses.push_back(std::move(address));
    }
    auto it = out->emplace(std::move(role), std::move(addresses)).first;
    previous = &it->first;
  }
  return Status::OK();
}

// training_rank and training_size: derived from the cluster spec by the one
// rule (ember/roles.h) and carried for programs that do not link the core; a
// message whose numbers disagree with its spec is Corruption, so that every
// reader sees the same ranks.
Status DecodeTrainingRank(codec::Reader& r, const NodeContext& c) {
  int32_t rank = 0, size = 0;
  EMBER_RETURN_NOT_OK(Field(r, "training_rank", &rank, &codec::Reader::GetI32));
  EMBER_RETURN_NOT_OK(Field(r, "training_size", &size, &codec::Reader::GetI32));
  const int want_rank = c.training_rank().value_or(-1);
  const int want_size = c.num_workers();
  if (rank != want_rank || size != want_size) {
    return Status::Corruption("start-up message fields training_rank " + std::to_string(rank) +
                              " and training_size " + std::to_string(size) + " before offset " +
                              std::to_string(r.offset()) + " disagree with its cluster spec, which makes " +
                              c.job_name + ":" + std::to_string(c.task_index) + " rank " +
                              std::to_string(want_rank) + " of " + std::to_string(want_size));
  }
  return Status::OK();
}

}  // namespace

Result<std::string> EncodeStartup(const NodeContext& c) {
  if (c.executor_id < 0 || c.task_index < 0) {
    return Status::InvalidArgument("start-up message: executor_id " + std::to_string(c.executor_id) +
                                   " and task_index " + std::to_string(c.task_index) +
                                   " must not be negative");
  }
  if (c.coordinator_port < 0 || c.coordinator_port > 65535) {
    return Status::InvalidArgument("start-up message: coordinator_port " +
                                   std::to_string(c.coordinator_port) + " is not a TCP port");
  }
  if (c.input_mode != InputMode::kTensorFlow && c.input_mode != InputMode::kSpark) {
    return Status::InvalidArgument("start-up message: input_mode " +
                                   std::to_string(static_cast<int>(c.input_mode)) +
                                   " is neither 0 (TENSORFLOW) nor 1 (SPARK)");
  }
  if (c.connect_timeout.count() < 0) {
    return Status::InvalidArgument("start-up message: connect_timeout is negative");
  }
  for (auto [name, size] : {std::pair<const char*, size_t>{"job_id", c.job_id.size()},
                            {"job_name", c.job_name.size()},
                            {"bind_host", c.bind_host.size()},
                            {"coordinator_host", c.coordinator_host.size()},
                            {"secret", c.secret.size()},
                            {"feed_ring", c.feed_ring.size()},
                            {"default_fs", c.default_fs.size()},
                            {"hdfs_http_address", c.hdfs_http_address.size()},
                            {"working_dir", c.working_dir.size()},
                            {"log_dir", c.log_dir.size()},
                            {"traceback_path", c.traceback_path.size()},
                            {"payload", c.payload.size()},
                            {"cluster_spec", c.cluster_spec.size()},
                            {"gpus", c.gpus.size()}}) {
    EMBER_RETURN_NOT_OK(CheckLength(name, size));
  }

  codec::Writer w;
  w.PutRaw(std::string_view(kStartupMagic, sizeof(kStartupMagic)));
  w.PutU16(kStartupVersion);
  w.PutString(c.job_id);
  w.PutI32(c.executor_id);
  w.PutString(c.job_name);
  w.PutI32(c.task_index);
  w.PutU32(static_cast<uint32_t>(c.cluster_spec.size()));
  for (const auto& [role, addresses] : c.cluster_spec) {
    EMBER_RETURN_NOT_OK(CheckLength("cluster_spec role", role.size()));
    EMBER_RETURN_NOT_OK(CheckLength("cluster_spec addresses", addresses.size()));
    w.PutString(role);
    w.PutU32(static_cast<uint32_t>(addresses.size()));
    for (const auto& a : addresses) {
      EMBER_RETURN_NOT_OK(CheckLength("cluster_spec address", a.size()));
      w.PutString(a);
    }
  }
  w.PutI32(c.training_rank().value_or(-1));
  w.PutI32(c.num_workers());
  w.PutString(c.bind_host);
  w.PutString(c.coordinator_host);
  w.PutI32(c.coordinator_port);
  w.PutString(c.secret);
  w.PutI64(c.connect_timeout.count());
  w.PutU8(static_cast<uint8_t>(c.input_mode));
  w.PutString(c.feed_ring);
  w.PutString(c.default_fs);
  w.PutString(c.hdfs_http_address);
  w.PutString(c.working_dir);
  w.PutString(c.log_dir);
  w.PutString(c.traceback_path);
  w.PutU32(static_cast<uint32_t>(c.gpus.size()));
  for (const auto& g : c.gpus) {
    EMBER_RETURN_NOT_OK(CheckLength("gpus entry", g.size()));
    w.PutString(g);
  }
  w.PutString(c.payload);
  return w.Release();
}

Result<NodeContext> DecodeStartup(std::string_view bytes) {
  codec::Reader r(bytes);  // offsets in errors count from the message's first byte
  if (bytes.size() < sizeof(kStartupMagic) ||
      bytes.substr(0, sizeof(kStartupMagic)) != std::string_view(kStartupMagic, sizeof(kStartupMagic))) {
    return Status::Corruption("not an Ember node start-up message (" + std::to_string(bytes.size()) +
                              " bytes without the \"EMBN\" magic); was this program started by "
                              "ember.Cluster.run?");
  }
  uint32_t magic = 0;
  EMBER_RETURN_NOT_OK(r.GetU32(&magic));
  uint16_t version = 0;
  EMBER_RETURN_NOT_OK(Field(r, "version", &version, &codec::Reader::GetU16));
  if (version != kStartupVersion) {
    return Status::InvalidArgument("node start-up message version " + std::to_string(version) +
                                   ", but this node understands version " +
                                   std::to_string(kStartupVersion) +
                                   ": the launcher and the node come from different Ember builds");
  }
  NodeContext c;
  int32_t port = 0;
  int64_t timeout_ms = 0;
  uint8_t mode = 0;
  EMBER_RETURN_NOT_OK(Field(r, "job_id", &c.job_id, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "executor_id", &c.executor_id, &codec::Reader::GetI32));
  EMBER_RETURN_NOT_OK(NonNegative("executor_id", c.executor_id, r.offset()));
  EMBER_RETURN_NOT_OK(Field(r, "job_name", &c.job_name, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "task_index", &c.task_index, &codec::Reader::GetI32));
  EMBER_RETURN_NOT_OK(NonNegative("task_index", c.task_index, r.offset()));
  EMBER_RETURN_NOT_OK(DecodeClusterSpec(r, &c.cluster_spec));
  EMBER_RETURN_NOT_OK(DecodeTrainingRank(r, c));
  EMBER_RETURN_NOT_OK(Field(r, "bind_host", &c.bind_host, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "coordinator_host", &c.coordinator_host, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "coordinator_port", &port, &codec::Reader::GetI32));
  if (port < 0 || port > 65535) {
    return Status::Corruption("start-up message field coordinator_port " + std::to_string(port) +
                              " is not a TCP port");
  }
  c.coordinator_port = port;
  EMBER_RETURN_NOT_OK(Field(r, "secret", &c.secret, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "connect_timeout", &timeout_ms, &codec::Reader::GetI64));
  EMBER_RETURN_NOT_OK(NonNegative("connect_timeout", timeout_ms, r.offset()));
  c.connect_timeout = Duration(timeout_ms);
  EMBER_RETURN_NOT_OK(Field(r, "input_mode", &mode, &codec::Reader::GetU8));
  if (mode > static_cast<uint8_t>(InputMode::kSpark)) {
    return Status::Corruption("start-up message field input_mode " + std::to_string(mode) +
                              " is neither 0 (TENSORFLOW) nor 1 (SPARK)");
  }
  c.input_mode = static_cast<InputMode>(mode);
  EMBER_RETURN_NOT_OK(Field(r, "feed_ring", &c.feed_ring, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "default_fs", &c.default_fs, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "hdfs_http_address", &c.hdfs_http_address, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "working_dir", &c.working_dir, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "log_dir", &c.log_dir, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(Field(r, "traceback_path", &c.traceback_path, &codec::Reader::GetString));
  uint32_t gpus = 0;
  EMBER_RETURN_NOT_OK(Field(r, "gpus", &gpus, &codec::Reader::GetU32));
  for (uint32_t i = 0; i < gpus; ++i) {  // each pass consumes >= 4 bytes or fails
    std::string gpu;
    EMBER_RETURN_NOT_OK(Field(r, "gpus entry", &gpu, &codec::Reader::GetString));
    c.gpus.push_back(std::move(gpu));
  }
  EMBER_RETURN_NOT_OK(Field(r, "payload", &c.payload, &codec::Reader::GetString));
  EMBER_RETURN_NOT_OK(r.ExpectEnd().WithContext("start-up message"));
  return c;
}

}  // namespace ember::node
