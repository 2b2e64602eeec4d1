// ember::device::LoadCuda: the CUDA runtime's C API, the dozen calls the
// collectives' staging uses, resolved with dlsym from libcudart.  Nothing is
// linked against CUDA, so the build and CPU hosts need none.
#include <dlfcn.h>

#include <string>
#include <vector>

#include "ember/device.h"

namespace ember::device {
namespace {

using CudaError = int;  // cudaError_t; 0 is cudaSuccess
constexpr unsigned kHostAllocDefault = 0;
constexpr unsigned kHostRegisterPortable = 1;  // pinned for every CUDA context
constexpr unsigned kStreamNonBlocking = 1;
constexpr unsigned kEventDisableTiming = 2;
constexpr int kMemcpyHostToDevice = 1;
constexpr int kMemcpyDeviceToHost = 2;
constexpr CudaError kErrorNotReady = 600;  // cudaErrorNotReady

struct Api {
  CudaError (*SetDevice)(int);
  CudaError (*HostAlloc)(void**, size_t, unsigned);
  CudaError (*FreeHost)(void*);
  CudaError (*HostRegister)(void*, size_t, unsigned);
  CudaError (*HostUnregister)(void*);
  CudaError (*StreamCreateWithFlags)(void**, unsigned);
  CudaError (*StreamDestroy)(void*);
  CudaError (*EventCreateWithFlags)(void**, unsigned);
  CudaError (*EventDestroy)(void*);
  CudaError (*EventRecord)(void*, void*);
  CudaError (*EventSynchronize)(void*);
  CudaError (*EventQuery)(void*);
  CudaError (*DeviceGetPCIBusId)(char*, int, int);
  CudaError (*MemcpyAsync)(void*, const void*, size_t, int, void*);
  CudaError (*StreamSynchronize)(void*);
  CudaError (*DeviceSynchronize)();
  CudaError (*RuntimeGetVersion)(int*);
  const char* (*GetErrorString)(CudaError);
};

class CudaRuntime : public Runtime {
 public:
  CudaRuntime(void* handle, std::string library, Api api, int version)
      : handle_(handle), library_(std::move(library)), api_(api), version_(version) {}
  // The library stays loaded: CUDA's own teardown at exit must find it.
  ~CudaRuntime() override = default;

  std::string Describe() const override {
    return "CUDA runtime " + std::to_string(version_) + " (" + library_ + ")";
  }
  Status SetDevice(int ordinal) override {
    return Check(api_.SetDevice(ordinal), "cudaSetDevice(" + std::to_string(ordinal) + ")");
  }
  Result<void*> AllocHost(size_t bytes) override {
    void* p = nullptr;
    if (auto s = Check(api_.HostAlloc(&p, bytes, kHostAllocDefault),
                       "cudaHostAlloc(" + std::to_string(bytes) + " bytes)");
        !s.ok()) {
      return s;
    }
    return p;
  }
  void FreeHost(void* p) override { api_.FreeHost(p); }
  Status RegisterHost(void* p, size_t bytes) override {
    return Check(api_.HostRegister(p, bytes, kHostRegisterPortable),
                 "cudaHostRegister(" + std::to_string(bytes) + " bytes)");
  }
  Status UnregisterHost(void* p) override { return Check(api_.HostUnregister(p), "cudaHostUnregister"); }
  Result<Stream> NewStream() override {
    void* s = nullptr;
    if (auto st = Check(api_.StreamCreateWithFlags(&s, kStreamNonBlocking), "cudaStreamCreateWithFlags"); !st.ok()) {
      return st;
    }
    return s;
  }
  void FreeStream(Stream s) override { api_.StreamDestroy(s); }
  Result<Event> NewEvent() override {
    void* e = nullptr;
    if (auto st = Check(api_.EventCreateWithFlags(&e, kEventDisableTiming), "cudaEventCreateWithFlags"); !st.ok()) {
      return st;
    }
    return e;
  }
  void FreeEvent(Event e) override { api_.EventDestroy(e); }
  Status CopyAsync(void* dst, const void* src, size_t bytes, CopyKind kind, Stream stream) override {
    const bool to_host = kind == CopyKind::kDeviceToHost;
    return Check(api_.MemcpyAsync(dst, src, bytes, to_host ? kMemcpyDeviceToHost : kMemcpyHostToDevice, stream),
                 std::string("cudaMemcpyAsync (") + (to_host ? "device to host, " : "host to device, ") +
                     std::to_string(bytes) + " bytes)");
  }
  Status RecordEvent(Event e, Stream stream) override { return Check(api_.EventRecord(e, stream), "cudaEventRecord"); }
  Status WaitEvent(Event e) override { return Check(api_.EventSynchronize(e), "cudaEventSynchronize"); }
  Result<bool> QueryEvent(Event e) override {
    CudaError r = api_.EventQuery(e);
    if (r == kErrorNotReady) return false;
    if (auto s = Check(r, "cudaEventQuery"); !s.ok()) return s;
    return true;
  }
  Result<std::string> DeviceIdentity(int ordinal) override {
    char bus[64] = {};
    if (auto s = Check(api_.DeviceGetPCIBusId(bus, sizeof(bus), ordinal),
                       "cudaDeviceGetPCIBusId(" + std::to_string(ordinal) + ")");
        !s.ok()) {
      return s;
    }
    return std::string(bus);
  }
  Status Synchronize(Stream stream) override {
    return Check(api_.StreamSynchronize(stream), "cudaStreamSynchronize");
  }
  Status SynchronizeDevice() override { return Check(api_.DeviceSynchronize(), "cudaDeviceSynchronize"); }

 private:
  Status Check(CudaError e, const std::string& what) const {
    if (e == 0) return Status::OK();
    const char* text = api_.GetErrorString ? api_.GetErrorString(e) : nullptr;
    return Status::IOError(what + " failed: CUDA error " + std::to_string(e) + (text ? std::string(" (") + text + ")" : ""));
  }

  void* handle_;
  std::string library_;
  Api api_;
  int version_;
};

template <typename F>
bool Resolve(void* handle, const char* name, F* out) {
  *out = reinterpret_cast<F>(dlsym(handle, name));
  return *out != nullptr;
}

}  // namespace

Result<std::shared_ptr<Runtime>> LoadCuda(const CudaOptions& options) {
  std::string tried;
  // A runtime the process already loaded (PyTorch's, TensorFlow's) first, so that Ember uses
  // the same one as the framework that made the buffers; then the first that loads.
  for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (const auto& name : options.libraries) {
      void* handle = dlopen(name.c_str(), flags);
      if (handle == nullptr) {
        if (!(flags & RTLD_NOLOAD)) {
          const char* why = dlerror();
          tried += (tried.empty() ? "" : "; ") + std::string(why ? why : name.c_str());
        }
        continue;
      }
      Api api{};
      bool ok = Resolve(handle, "cudaSetDevice", &api.SetDevice) && Resolve(handle, "cudaHostAlloc", &api.HostAlloc) &&
                Resolve(handle, "cudaFreeHost", &api.FreeHost) &&
                Resolve(handle, "cudaHostRegister", &api.HostRegister) &&
                Resolve(handle, "cudaHostUnregister", &api.HostUnregister) &&
                Resolve(handle, "cudaStreamCreateWithFlags", &api.StreamCreateWithFlags) &&
                Resolve(handle, "cudaStreamDestroy", &api.StreamDestroy) &&
                Resolve(handle, "cudaEventCreateWithFlags", &api.EventCreateWithFlags) &&
                Resolve(handle, "cudaEventDestroy", &api.EventDestroy) &&
                Resolve(handle, "cudaEventRecord", &api.EventRecord) &&
                Resolve(handle, "cudaEventSynchronize", &api.EventSynchronize) &&
                Resolve(handle, "cudaEventQuery", &api.EventQuery) &&
                Resolve(handle, "cudaDeviceGetPCIBusId", &api.DeviceGetPCIBusId) &&
                Resolve(handle, "cudaMemcpyAsync", &api.MemcpyAsync) &&
                Resolve(handle, "cudaStreamSynchronize", &api.StreamSynchronize) &&
                Resolve(handle, "cudaDeviceSynchronize", &api.DeviceSynchronize) &&
                Resolve(handle, "cudaRuntimeGetVersion", &api.RuntimeGetVersion) &&
                Resolve(handle, "cudaGetErrorString", &api.GetErrorString);
      if (!ok) {
        tried += (tried.empty() ? "" : "; ") + name + " lacks a CUDA runtime call Ember uses";
        dlclose(handle);
        continue;
      }
      int version = 0;
      api.RuntimeGetVersion(&version);
      return std::shared_ptr<Runtime>(std::make_shared<CudaRuntime>(handle, name, api, version));
    }
  }
  return Status::NotFound("the CUDA runtime could not be loaded (" + tried +
                          "); on a GPU host install the NVIDIA driver and the CUDA runtime (e.g. the "
                          "nvidia-cuda-runtime-cu12 wheel, which PyTorch brings), or pass host memory");
}

}  // namespace ember::device
