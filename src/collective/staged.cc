#include "collective/staged.h"

#include <algorithm>

namespace ember::collective {

Result<std::unique_ptr<DeviceStaging>> DeviceStaging::Open(std::shared_ptr<device::Runtime> runtime, int ordinal,
                                                           size_t chunk_bytes) {
  chunk_bytes = chunk_bytes / 8 * 8;
  if (chunk_bytes == 0) return Status::InvalidArgument("device staging: the chunk must hold at least 8 bytes");
  std::unique_ptr<DeviceStaging> s(new DeviceStaging(std::move(runtime), ordinal, chunk_bytes));
  device::Runtime& rt = *s->runtime_;
  if (auto st = rt.SetDevice(ordinal); !st.ok()) return st;
  auto stream = rt.NewStream();
  if (!stream.ok()) return stream.status();
  s->stream_ = *stream;
  for (int i = 0; i < 2; ++i) {
    auto host = rt.AllocHost(chunk_bytes);
    if (!host.ok()) return host.status();
    s->host_[i] = *host;
    auto event = rt.NewEvent();
    if (!event.ok()) return event.status();
    s->ready_[i] = *event;
  }
  return s;
}

DeviceStaging::~DeviceStaging() {
  if (runtime_ == nullptr) return;
  if (stream_ != nullptr) {
    (void)runtime_->Synchronize(stream_);
  }
  for (int i = 0; i < 2; ++i) {
    if (ready_[i] != nullptr) runtime_->FreeEvent(ready_[i]);
    if (host_[i] != nullptr) runtime_->FreeHost(host_[i]);
  }
  if (stream_ != nullptr) runtime_->FreeStream(stream_);
}

DeviceStaging::Outcome DeviceStaging::Run(void* data, size_t bytes, bool copy_in, bool copy_back,
                                          const std::function<Status(void*, size_t)>& op) {
  device::Runtime& rt = *runtime_;
  auto* base = static_cast<std::byte*>(data);
  const size_t n = (bytes + chunk_ - 1) / chunk_;
  auto length = [&](size_t i) { return std::min(chunk_, bytes - i * chunk_); };
  // Chunk i's bytes, and its slot free again (the copy back of chunk i-2 ran:
  // the stream runs in order), once ready_[i % 2] has passed.
  auto stage_in = [&](size_t i) -> Status {
    const int slot = static_cast<int>(i % 2);
    if (copy_in) {
      if (auto s = rt.CopyAsync(host_[slot], base + i * chunk_, length(i), device::CopyKind::kDeviceToHost, stream_);
          !s.ok()) {
        return s;
      }
    }
    return rt.RecordEvent(ready_[slot], stream_);
  };
  auto fail = [&](Status s, bool runtime) {
    (void)rt.Synchronize(stream_);  // nothing may still write into the slots or the buffer
    return Outcome{std::move(s), runtime};
  };
  if (n == 0) return {};
  if (auto s = rt.SetDevice(ordinal_); !s.ok()) return fail(s, true);
  for (size_t i = 0; i < std::min<size_t>(n, 2); ++i) {
    if (auto s = stage_in(i); !s.ok()) return fail(s, true);
  }
  for (size_t i = 0; i < n; ++i) {
    const int slot = static_cast<int>(i % 2);
    if (auto s = rt.WaitEvent(ready_[slot]); !s.ok()) return fail(s, true);
    if (auto s = op(host_[slot], length(i)); !s.ok()) return fail(s, false);
    if (copy_back) {
      if (auto s = rt.CopyAsync(base + i * chunk_, host_[slot], length(i), device::CopyKind::kHostToDevice, stream_);
          !s.ok()) {
        return fail(s, true);
      }
    }
    if (i + 2 < n) {
      if (auto s = stage_in(i + 2); !s.ok()) return fail(s, true);
    }
  }
  if (auto s = rt.Synchronize(stream_); !s.ok()) return {s, true};
  return {};
}

}  // namespace ember::collective
