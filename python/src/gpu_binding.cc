// Bindings of include/ember/gpu.h: the launcher asks the core for a node's
// CUDA_VISIBLE_DEVICES and for the check that no two nodes share a GPU.
// Type conversion only.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "bindings.h"
#include "ember/collective.h"
#include "ember/device.h"
#include "ember/gpu.h"

namespace ember::python {

using namespace nb::literals;

void BindGpu(nb::module_& m) {
  m.def(
      "gpu_visible_devices",
      [](const std::vector<std::string>& assigned, std::optional<std::string> preset) {
        return ValueOrThrow(gpu::VisibleDevices(assigned, preset));
      },
      "assigned"_a, "preset"_a.none(),
      "The node's CUDA_VISIBLE_DEVICES entries for the GPU addresses Spark assigned its task, "
      "given the executor's own CUDA_VISIBLE_DEVICES (None: unset); ember/gpu.h.");
  m.def("gpu_split_visible_devices", &gpu::SplitVisibleDevices, "value"_a);
  m.def(
      "gpu_check_distinct",
      [](const std::vector<std::tuple<std::string, std::string, std::vector<std::string>>>& nodes) {
        std::vector<gpu::NodeGpus> in;
        for (const auto& [node, host, ids] : nodes) in.push_back({node, host, ids});
        ThrowIfError(gpu::CheckDistinct(in));
      },
      "nodes"_a,
      "Raises InvalidArgument naming two nodes (node, host, [gpu ids]) that hold one GPU.");
  m.def(
      "gpu_uuids",
      [](const std::vector<std::string>& visible, std::optional<std::string> library) {
        gpu::NvmlOptions options;
        if (library) options.library = *library;
        return ValueOrThrow(gpu::Uuids(visible, options));
      },
      "visible"_a, "library"_a = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
      "The UUIDs of the GPUs `visible` names, from NVML; NotFoundError where NVML is absent.");
  m.def(
      "cuda_runtime",
      [](std::optional<std::vector<std::string>> libraries) {
        device::CudaOptions options;
        if (libraries) options.libraries = *libraries;
        return ValueOrThrow(device::LoadCuda(options))->Describe();
      },
      "libraries"_a = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
      "Which CUDA runtime the collectives would load for CUDA memory (ember/device.h), e.g. "
      "'CUDA runtime 13000 (libcudart.so.13)'; NotFoundError naming what was tried.");
  m.def(
      "nccl_library",
      [](std::optional<std::vector<std::string>> libraries) {
        auto loaded = libraries ? collective::LoadNccl(*libraries) : collective::LoadNccl();
        return ValueOrThrow(std::move(loaded))->Describe();
      },
      "libraries"_a = nb::none(), nb::call_guard<nb::gil_scoped_release>(),
      "Which NCCL the collectives would use between the GPUs of a host, e.g. 'NCCL 2.27.3 "
      "(libnccl.so.2)'; NotFoundError naming what was tried.");
}

}  // namespace ember::python
