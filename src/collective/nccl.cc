// ember::collective::LoadNccl: NCCL's C API, the calls the Communicator uses,
// resolved with dlsym from libnccl.  Nothing links NCCL, so the build and CPU
// hosts need none.
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

#include "ember/collective.h"

namespace ember::collective {
namespace {

using NcclResult = int;  // ncclResult_t; 0 is ncclSuccess
constexpr NcclResult kInProgress = 7;  // ncclInProgress: not an error
struct UniqueIdBytes {
  char internal[128];  // NCCL_UNIQUE_ID_BYTES
};

struct Api {
  NcclResult (*GetUniqueId)(UniqueIdBytes*);
  NcclResult (*CommInitRank)(void**, int, UniqueIdBytes, int);
  NcclResult (*AllReduce)(const void*, void*, size_t, int, int, void*, void*);
  NcclResult (*Broadcast)(const void*, void*, size_t, int, int, void*, void*);
  NcclResult (*CommGetAsyncError)(void*, NcclResult*);
  NcclResult (*CommAbort)(void*);
  NcclResult (*GetVersion)(int*);
  const char* (*GetErrorString)(NcclResult);
};

// ncclDataType_t and ncclRedOp_t values (nccl.h, stable since NCCL 2.0; ncclAvg since 2.10).
int NcclType(DataType t) {
  switch (t) {
    case DataType::kInt32: return 2;
    case DataType::kInt64: return 4;
    case DataType::kFloat16: return 6;
    case DataType::kFloat32: return 7;
    case DataType::kFloat64: return 8;
    case DataType::kBFloat16: return 9;
  }
  return -1;
}

int NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return 0;
    case ReduceOp::kMax: return 2;
    case ReduceOp::kMin: return 3;
    case ReduceOp::kAverage: return 4;
  }
  return -1;
}

class NcclLibrary : public Nccl {
 public:
  NcclLibrary(std::string library, Api api, int version) : library_(std::move(library)), api_(api), version_(version) {}

  std::string Describe() const override {
    return "NCCL " + std::to_string(version_ / 10000) + "." + std::to_string(version_ / 100 % 100) + "." +
           std::to_string(version_ % 100) + " (" + library_ + ")";
  }
  Result<std::string> UniqueId() override {
    UniqueIdBytes id{};
    if (auto s = Check(api_.GetUniqueId(&id), "ncclGetUniqueId"); !s.ok()) return s;
    return std::string(id.internal, sizeof(id.internal));
  }
  Result<void*> InitRank(const std::string& id, int size, int rank) override {
    if (id.size() != sizeof(UniqueIdBytes)) {
      return Status::InvalidArgument("NCCL unique id of " + std::to_string(id.size()) + " bytes, not 128");
    }
    UniqueIdBytes bytes;
    std::memcpy(bytes.internal, id.data(), sizeof(bytes.internal));
    void* comm = nullptr;
    if (auto s = Check(api_.CommInitRank(&comm, size, bytes, rank), "ncclCommInitRank"); !s.ok()) return s;
    return comm;
  }
  Status Allreduce(void* comm, void* data, size_t count, DataType dtype, ReduceOp op,
                   device::Stream stream) override {
    return Check(api_.AllReduce(data, data, count, NcclType(dtype), NcclOp(op), comm, stream), "ncclAllReduce");
  }
  Status Broadcast(void* comm, void* data, size_t count, DataType dtype, int root, device::Stream stream) override {
    return Check(api_.Broadcast(data, data, count, NcclType(dtype), root, comm, stream), "ncclBroadcast");
  }
  Status AsyncError(void* comm) override {
    NcclResult r = 0;
    if (auto s = Check(api_.CommGetAsyncError(comm, &r), "ncclCommGetAsyncError"); !s.ok()) return s;
    return r == kInProgress ? Status::OK() : Check(r, "NCCL (asynchronous)");
  }
  void Abort(void* comm) override { api_.CommAbort(comm); }

 private:
  Status Check(NcclResult r, const std::string& what) const {
    if (r == 0) return Status::OK();
    const char* text = api_.GetErrorString ? api_.GetErrorString(r) : nullptr;
    return Status::IOError(what + " failed: NCCL error " + std::to_string(r) +
                           (text ? std::string(" (") + text + ")" : ""));
  }

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

Result<std::shared_ptr<Nccl>> LoadNccl(const std::vector<std::string>& libraries) {
  std::string tried;
  for (int flags : {RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD, RTLD_NOW | RTLD_LOCAL}) {
    for (const auto& name : libraries) {
      void* handle = dlopen(name.c_str(), flags);
      if (handle == nullptr) {
        if (!(flags & RTLD_NOLOAD)) {
          const char* why = dlerror();
          tried += (tried.empty() ? "" : "; ") + std::string(why ? why : name.c_str());
        }
        continue;
      }
      Api api{};
      bool ok = Resolve(handle, "ncclGetUniqueId", &api.GetUniqueId) &&
                Resolve(handle, "ncclCommInitRank", &api.CommInitRank) &&
                Resolve(handle, "ncclAllReduce", &api.AllReduce) && Resolve(handle, "ncclBroadcast", &api.Broadcast) &&
                Resolve(handle, "ncclCommGetAsyncError", &api.CommGetAsyncError) &&
                Resolve(handle, "ncclCommAbort", &api.CommAbort) && Resolve(handle, "ncclGetVersion", &api.GetVersion) &&
                Resolve(handle, "ncclGetErrorString", &api.GetErrorString);
      if (!ok) {
        tried += (tried.empty() ? "" : "; ") + name + " lacks an NCCL call Ember uses";
        dlclose(handle);
        continue;
      }
      int version = 0;
      api.GetVersion(&version);
      // The library stays loaded: NCCL's own threads must outlive every comm.
      return std::shared_ptr<Nccl>(std::make_shared<NcclLibrary>(name, api, version));
    }
  }
  return Status::NotFound("NCCL could not be loaded (" + tried +
                          "); on a GPU host install it (e.g. the nvidia-nccl-cu12 wheel, which PyTorch brings)");
}

}  // namespace ember::collective
