// A node's GPUs: from the addresses Spark assigned its task to the
// CUDA_VISIBLE_DEVICES of its process, and the check that no two nodes of a
// job hold the same physical GPU.
//
// Spark hands each task GPU addresses (TaskContext.resources()["gpu"]) but
// sets nothing in the task's environment; the launcher asks these rules and
// the node process starts with CUDA_VISIBLE_DEVICES set, its GPUs then
// numbered 0..n-1 inside it.  Addresses are what the workers' discovery
// scripts print: nvidia-smi indices (PCI bus order: the node also gets
// CUDA_DEVICE_ORDER=PCI_BUS_ID, so CUDA numbers them the same way) or GPU
// UUIDs.  Pure functions, thread-safe; the NVML lookup loads the driver's
// library at run time, so nothing here needs CUDA to build or run.
#ifndef EMBER_GPU_H_
#define EMBER_GPU_H_

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ember/result.h"
#include "ember/status.h"

namespace ember::gpu {

// The entries of the node's CUDA_VISIBLE_DEVICES for the addresses Spark
// assigned its task (`assigned`, in Spark's order), given the executor's own
// CUDA_VISIBLE_DEVICES (`preset`: nullopt when it is unset).
//
// - No preset: the addresses, as they are.
// - A preset that lists every address (spark-rapids and some container
//   runtimes set the GPUs an executor may use): the addresses, as they are;
//   CUDA_VISIBLE_DEVICES names physical GPUs, so a child narrows its parent's
//   set by naming a subset of it.
// - A preset that lists none of them, where every address is an index into
//   it (a discovery script that numbered the GPUs this executor sees): the
//   preset's entries at those indices ("6,7" with address 1 -> "7").
// InvalidArgument, naming the addresses and the preset, when none of these
// holds (a preset that hides every GPU, an address it lacks, a mix), or when
// `assigned` is empty or repeats an address.
Result<std::vector<std::string>> VisibleDevices(const std::vector<std::string>& assigned,
                                                std::optional<std::string_view> preset);

// The entries of a CUDA_VISIBLE_DEVICES value: comma-separated, blanks
// trimmed, empty entries dropped.
std::vector<std::string> SplitVisibleDevices(std::string_view value);

// One node's GPUs, as the check below compares them.
struct NodeGpus {
  std::string node;              // how errors name it, e.g. "worker:1 (executor 2)"
  std::string host;              // the node's host address
  std::vector<std::string> ids;  // GPU UUIDs ("GPU-..."), else the visible entries
};

// OK when no physical GPU is held by two nodes; otherwise InvalidArgument
// naming both nodes and the GPU, with what to do.  A UUID names one GPU
// anywhere; any other id names a GPU of its node's host.
Status CheckDistinct(const std::vector<NodeGpus>& nodes);

// Where the NVML library is looked for.
struct NvmlOptions {
  std::string library = "libnvidia-ml.so.1";  // dlopen's name or a path
};

// The UUIDs ("GPU-...") of the GPUs that `visible` (entries of a
// CUDA_VISIBLE_DEVICES: nvidia-smi indices or UUIDs) names, asked of NVML.
// NotFound when the library cannot be loaded (a host without the NVIDIA
// driver: the caller then compares the entries themselves); IOError naming
// the entry when NVML cannot answer for it.
Result<std::vector<std::string>> Uuids(const std::vector<std::string>& visible,
                                       const NvmlOptions& options = {});

}  // namespace ember::gpu

#endif  // EMBER_GPU_H_
