// The GPU rules of include/ember/gpu.h.  NVML is loaded with dlopen at run
// time (the NVIDIA driver ships libnvidia-ml.so.1), never linked, so builds
// and CPU hosts need no CUDA.
#include "ember/gpu.h"

#include <dlfcn.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <memory>
#include <set>

namespace ember::gpu {
namespace {

std::string Join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& s : items) out += (out.empty() ? "" : ",") + s;
  return out;
}

std::optional<size_t> Index(const std::string& s) {
  if (s.empty() || s.size() > 6 || !std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    return std::nullopt;
  }
  return static_cast<size_t>(std::stoul(s));
}

bool IsUuid(std::string_view id) { return id.rfind("GPU-", 0) == 0 || id.rfind("MIG-", 0) == 0; }

// NVML's C API, the few calls used (nvml.h; stable since CUDA 6).
using NvmlReturn = int;
using NvmlDevice = struct NvmlDeviceOpaque*;
constexpr NvmlReturn kNvmlSuccess = 0;
constexpr unsigned kNvmlUuidBytes = 96;  // NVML_DEVICE_UUID_V2_BUFFER_SIZE

struct DlClose {
  void operator()(void* handle) const { dlclose(handle); }
};

}  // namespace

std::vector<std::string> SplitVisibleDevices(std::string_view value) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= value.size()) {
    size_t end = value.find(',', start);
    if (end == std::string_view::npos) end = value.size();
    std::string_view item = value.substr(start, end - start);
    while (!item.empty() && (item.front() == ' ' || item.front() == '\t')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\t')) item.remove_suffix(1);
    if (!item.empty()) out.emplace_back(item);
    start = end + 1;
  }
  return out;
}

Result<std::vector<std::string>> VisibleDevices(const std::vector<std::string>& assigned,
                                                std::optional<std::string_view> preset) {
  if (assigned.empty()) {
    return Status::InvalidArgument("no GPU address was assigned to the task");
  }
  if (std::set<std::string>(assigned.begin(), assigned.end()).size() != assigned.size()) {
    return Status::InvalidArgument("the task was assigned GPU addresses " + Join(assigned) +
                                   ", which repeat an address");
  }
  if (!preset.has_value()) return assigned;
  const std::vector<std::string> entries = SplitVisibleDevices(*preset);
  const std::string shown = "the executor's CUDA_VISIBLE_DEVICES=\"" + std::string(*preset) + "\"";
  if (entries.empty() || (entries.size() == 1 && (entries[0] == "-1" || entries[0] == "NoDevFiles"))) {
    return Status::InvalidArgument(
        "Spark assigned GPU " + Join(assigned) + " to the task, but " + shown +
        " hides every GPU. Unset it in the executors' environment, or let it list the GPUs of "
        "the worker's discovery script");
  }
  const std::set<std::string> listed(entries.begin(), entries.end());
  size_t in_preset = 0;
  for (const auto& a : assigned) in_preset += listed.count(a);
  if (in_preset == assigned.size()) return assigned;
  if (in_preset == 0) {
    std::vector<std::string> remapped;
    for (const auto& a : assigned) {
      std::optional<size_t> i = Index(a);
      if (!i || *i >= entries.size()) break;
      remapped.push_back(entries[*i]);
    }
    if (remapped.size() == assigned.size()) return remapped;
  }
  return Status::InvalidArgument(
      "Spark assigned GPU " + Join(assigned) + " to the task, but " + shown +
      " neither lists every one of them nor has as many entries as the addresses count (an "
      "address is either a GPU the executor lists, or its index in that list). Make the "
      "workers' discovery script print the GPUs the executors see, or unset "
      "CUDA_VISIBLE_DEVICES in their environment");
}

Status CheckDistinct(const std::vector<NodeGpus>& nodes) {
  std::map<std::string, const NodeGpus*> holder;  // GPU key -> first node holding it
  for (const auto& node : nodes) {
    for (const auto& id : node.ids) {
      const std::string key = IsUuid(id) ? id : node.host + "\n" + id;
      auto [it, fresh] = holder.emplace(key, &node);
      if (fresh || it->second == &node) continue;
      const std::string gpu = IsUuid(id) ? "GPU " + id : "GPU " + id + " of host " + node.host;
      return Status::InvalidArgument(
          "nodes " + it->second->node + " and " + node.node + " were both given " + gpu +
          ": Spark scheduled two tasks on one GPU. The workers of one host must declare "
          "distinct GPUs (each worker's spark.worker.resource.gpu.discoveryScript or "
          "resourcesFile); to share GPUs on purpose, ask for a fractional amount "
          "(gpus_per_node=0.5)");
    }
  }
  return Status::OK();
}

Result<std::vector<std::string>> Uuids(const std::vector<std::string>& visible, const NvmlOptions& options) {
  std::unique_ptr<void, DlClose> lib(dlopen(options.library.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (!lib) {
    const char* why = dlerror();
    return Status::NotFound("cannot load NVML (" + options.library + "): " + (why ? why : "unknown error"));
  }
  auto init = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib.get(), "nvmlInit_v2"));
  auto shutdown = reinterpret_cast<NvmlReturn (*)()>(dlsym(lib.get(), "nvmlShutdown"));
  auto by_index = reinterpret_cast<NvmlReturn (*)(unsigned, NvmlDevice*)>(
      dlsym(lib.get(), "nvmlDeviceGetHandleByIndex_v2"));
  auto uuid = reinterpret_cast<NvmlReturn (*)(NvmlDevice, char*, unsigned)>(
      dlsym(lib.get(), "nvmlDeviceGetUUID"));
  auto error = reinterpret_cast<const char* (*)(NvmlReturn)>(dlsym(lib.get(), "nvmlErrorString"));
  if (!init || !shutdown || !by_index || !uuid) {
    return Status::NotFound(options.library + " lacks the NVML calls Ember uses (nvmlInit_v2, "
                            "nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetUUID)");
  }
  auto says = [&](NvmlReturn r) {
    const char* text = error ? error(r) : nullptr;
    return std::string(text ? text : "error ") + (text ? "" : std::to_string(r));
  };
  if (NvmlReturn r = init(); r != kNvmlSuccess) {
    return Status::NotFound("NVML (" + options.library + ") did not start: " + says(r));
  }
  std::vector<std::string> out;
  Status status;
  for (const auto& entry : visible) {
    if (IsUuid(entry)) {
      out.push_back(entry);
      continue;
    }
    std::optional<size_t> index = Index(entry);
    NvmlDevice device = nullptr;
    char text[kNvmlUuidBytes] = {};
    NvmlReturn r = kNvmlSuccess;
    if (!index) {
      status = Status::InvalidArgument("CUDA_VISIBLE_DEVICES entry \"" + entry +
                                       "\" is neither a GPU index nor a GPU UUID");
    } else if ((r = by_index(static_cast<unsigned>(*index), &device)) != kNvmlSuccess ||
               (r = uuid(device, text, sizeof(text))) != kNvmlSuccess) {
      status = Status::IOError("NVML has no GPU " + entry + " on this host: " + says(r));
    } else {
      out.emplace_back(text, strnlen(text, sizeof(text)));
    }
    if (!status.ok()) break;
  }
  shutdown();
  if (!status.ok()) return status;
  return out;
}

}  // namespace ember::gpu
