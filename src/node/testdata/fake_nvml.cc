// A fake NVML for gpu_test: the few calls ember::gpu::Uuids makes, answering
// for four GPUs whose UUIDs are "GPU-fake-<index>".  Loaded with dlopen, as
// the NVIDIA driver's libnvidia-ml.so.1 would be.
#include <cstdio>

namespace {
struct Device {
  unsigned index;
};
Device devices[4] = {{0}, {1}, {2}, {3}};
int started = 0;
}  // namespace

extern "C" {
__attribute__((visibility("default"))) int nvmlInit_v2() {
  ++started;
  return 0;
}
__attribute__((visibility("default"))) int nvmlShutdown() {
  --started;
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetHandleByIndex_v2(unsigned index, Device** out) {
  if (started <= 0) return 1;  // NVML_ERROR_UNINITIALIZED
  if (index >= 4) return 2;    // NVML_ERROR_INVALID_ARGUMENT
  *out = &devices[index];
  return 0;
}
__attribute__((visibility("default"))) int nvmlDeviceGetUUID(Device* device, char* uuid, unsigned length) {
  std::snprintf(uuid, length, "GPU-fake-%u", device->index);
  return 0;
}
__attribute__((visibility("default"))) const char* nvmlErrorString(int result) {
  return result == 2 ? "Invalid Argument" : result == 1 ? "Uninitialized" : "Unknown Error";
}
}
