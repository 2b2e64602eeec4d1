// Collectives on accelerator memory, staged through page-locked host memory:
// the buffer is moved in chunks, and the copy of chunk i+1 to the host runs
// on a stream while the host collective works on chunk i (and chunk i goes
// back while chunk i+1 is reduced).  The path when no device-to-device
// library can run: one GPU shared by several ranks, no NCCL, ranks mixing
// host and device buffers.  Used by CommunicatorImpl; one call at a time.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "ember/device.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::collective {

class DeviceStaging {
 public:
  // Two pinned chunks of `chunk_bytes` (rounded down to 8 bytes) and a stream
  // on device `ordinal` of `runtime`.
  static Result<std::unique_ptr<DeviceStaging>> Open(std::shared_ptr<device::Runtime> runtime, int ordinal,
                                                     size_t chunk_bytes);
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  // How a staged call ended.
  struct Outcome {
    Status status;
    bool runtime_failed = false;  // the runtime (a copy, a wait) failed, not `op`
  };

  // Runs `op(host, bytes)` on each chunk of the `bytes` at device address
  // `data`, in order; with `copy_in` the chunk holds the device's bytes
  // first, with `copy_back` the device gets the chunk's bytes after `op`.
  // Stops at the first failure; nothing is in flight when it returns.
  Outcome Run(void* data, size_t bytes, bool copy_in, bool copy_back,
              const std::function<Status(void* host, size_t bytes)>& op);

  size_t chunk_bytes() const { return chunk_; }
  int ordinal() const { return ordinal_; }

 private:
  DeviceStaging(std::shared_ptr<device::Runtime> runtime, int ordinal, size_t chunk)
      : runtime_(std::move(runtime)), ordinal_(ordinal), chunk_(chunk) {}

  std::shared_ptr<device::Runtime> runtime_;
  int ordinal_;
  size_t chunk_;
  device::Stream stream_ = nullptr;
  void* host_[2] = {nullptr, nullptr};
  device::Event ready_[2] = {nullptr, nullptr};
};

}  // namespace ember::collective
