// Accelerator memory, as the collectives see it: a GPU runtime's few calls
// (pinned host memory, a stream, asynchronous copies, events) behind an
// interface, and the CUDA runtime loaded at run time (dlopen), so that builds
// and CPU hosts never need CUDA.  Tests substitute a fake runtime.
//
// Thread-safety: a Runtime may be used from several threads; a Stream or an
// Event is used by one thread at a time (the collectives' call thread).
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "ember/result.h"
#include "ember/status.h"

namespace ember::device {

// Where a buffer lives.
enum class Kind : uint8_t {
  kHost = 0,
  kCuda = 1,
};

using Stream = void*;  // the runtime's stream handle (cudaStream_t)
using Event = void*;   // the runtime's event handle (cudaEvent_t)

struct Device {
  Kind kind = Kind::kHost;
  int ordinal = 0;  // the runtime's device number inside the process (CUDA: after CUDA_VISIBLE_DEVICES)
  // An event of the caller's runtime, recorded on the caller's stream after the work that writes
  // the buffer (null: that work already finished).  A call reads the buffer only once the event
  // passed, waiting for it in the thread that runs the call: an async call returns at once and
  // the caller's stream runs on (gradient buckets reduce while backward still runs).  The caller
  // keeps the event alive until the call ended.
  Event ready = nullptr;
};

enum class CopyKind : uint8_t {
  kDeviceToHost = 0,
  kHostToDevice = 1,
};

class Runtime {
 public:
  virtual ~Runtime() = default;
  // E.g. "CUDA runtime 12040 (libcudart.so.12)".
  virtual std::string Describe() const = 0;
  // Makes `ordinal` the calling thread's current device.
  virtual Status SetDevice(int ordinal) = 0;
  // Page-locked host memory (fast, asynchronous copies); freed with FreeHost.
  virtual Result<void*> AllocHost(size_t bytes) = 0;
  virtual void FreeHost(void* p) = 0;
  // Page-locks `bytes` of existing host memory at `p` (a shared-memory
  // mapping, say) for every device, so copies from it run as fast and as
  // asynchronously as from AllocHost memory; UnregisterHost(p) undoes it and
  // must come before the memory is unmapped or its pages are replaced, and
  // after every copy from it finished (SynchronizeDevice).
  virtual Status RegisterHost(void* p, size_t bytes) = 0;
  virtual Status UnregisterHost(void* p) = 0;
  // A stream of the current device that does not wait on the default stream.
  virtual Result<Stream> NewStream() = 0;
  virtual void FreeStream(Stream s) = 0;
  virtual Result<Event> NewEvent() = 0;
  virtual void FreeEvent(Event e) = 0;
  // Queues a copy of `bytes` on `stream`; returns before it ran.
  virtual Status CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) = 0;
  // Marks the point `stream` has reached; WaitEvent blocks the calling thread
  // until the stream passed it.
  virtual Status RecordEvent(Event e, Stream stream) = 0;
  virtual Status WaitEvent(Event e) = 0;
  // Whether the stream passed `e` (does not block).
  virtual Result<bool> QueryEvent(Event e) = 0;
  // The physical device behind `ordinal` (CUDA: its PCI bus id, e.g.
  // "0000:3B:00.0"): the same string in every process that sees it.
  virtual Result<std::string> DeviceIdentity(int ordinal) = 0;
  // Blocks until everything queued on `stream` ran.
  virtual Status Synchronize(Stream stream) = 0;
  // Blocks until everything queued on the calling thread's current device,
  // on every stream, ran (cudaDeviceSynchronize).
  virtual Status SynchronizeDevice() = 0;
};

struct CudaOptions {
  // dlopen names (or paths) tried in order: first one of them the process
  // already loaded (PyTorch's, TensorFlow's, CuPy's runtime), else the first
  // that loads.
  std::vector<std::string> libraries = {"libcudart.so.12", "libcudart.so.13", "libcudart.so.11.0", "libcudart.so"};
};

// The CUDA runtime (libcudart), loaded now.  NotFound, naming the libraries
// tried and dlerror's words, where none loads (a host without CUDA).
Result<std::shared_ptr<Runtime>> LoadCuda(const CudaOptions& options = {});

}  // namespace ember::device
