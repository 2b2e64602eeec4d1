// FaultInjectionFileSystem; see fault_fs.h.
#include "fs/fault_fs.h"

#include <vector>

namespace ember::fs {
namespace {

const char* OpName(FaultOp op) {
  switch (op) {
    case FaultOp::kAppend: return "Append";
    case FaultOp::kSync: return "Sync";
    case FaultOp::kClose: return "Close";
    case FaultOp::kRename: return "Rename";
  }
  return "?";
}

}  // namespace

// A WritableFile of the base file system, with its calls counted and
// failed on demand.  Used by one thread at a time; the file system must
// outlive it.
class FaultInjectionFileSystem::File final : public WritableFile {
 public:
  File(FaultInjectionFileSystem* fs, std::string path, std::unique_ptr<WritableFile> base)
      : fs_(fs), path_(std::move(path)), base_(std::move(base)) {
    fs_->Opened(this);
  }
  ~File() override { fs_->Gone(this); }

  Status Append(std::span<const uint8_t> data) override {
    if (crashed_) return Crashed();
    EMBER_RETURN_NOT_OK(fs_->Check(FaultOp::kAppend, path_));
    const uint64_t n = fs_->TornLimit(size_, data.size());
    EMBER_RETURN_NOT_OK(base_->Append(data.first(static_cast<size_t>(n))));
    size_ += n;
    if (n < data.size()) {
      return Status::IOError(base_->uri() + ": injected torn write after " + std::to_string(size_) + " bytes");
    }
    return Status::OK();
  }

  Status Flush() override {
    if (crashed_) return Crashed();
    return base_->Flush();
  }

  Status Sync() override {
    if (crashed_) return Crashed();
    EMBER_RETURN_NOT_OK(fs_->Check(FaultOp::kSync, path_));
    EMBER_RETURN_NOT_OK(base_->Sync());
    fs_->Synced(path_, size_);
    return Status::OK();
  }

  Status Close() override {
    if (crashed_) return Crashed();
    if (closed_) return Status::OK();
    EMBER_RETURN_NOT_OK(fs_->Check(FaultOp::kClose, path_));
    closed_ = true;
    return base_->Close();
  }

  const std::string& uri() const override { return base_->uri(); }

  // Crash(): close the base file, fail every later call.
  void CrashNow() {
    (void)base_->Close();
    crashed_ = true;
  }

 private:
  Status Crashed() const { return Status::IOError(base_->uri() + ": file system crashed (injected)"); }

  FaultInjectionFileSystem* const fs_;
  const std::string path_;
  std::unique_ptr<WritableFile> base_;
  uint64_t size_ = 0;  // bytes appended to base_
  bool closed_ = false;
  bool crashed_ = false;
};

FaultInjectionFileSystem::FaultInjectionFileSystem(std::shared_ptr<FileSystem> base) : base_(std::move(base)) {}
FaultInjectionFileSystem::~FaultInjectionFileSystem() = default;

void FaultInjectionFileSystem::FailNth(FaultOp op, int n) {
  MutexLock lock(&mu_);
  fail_at_[op] = calls_[op] + n;
}

void FaultInjectionFileSystem::FailAppendAfterBytes(uint64_t k) {
  MutexLock lock(&mu_);
  torn_after_ = static_cast<int64_t>(k);
}

void FaultInjectionFileSystem::ClearFaults() {
  MutexLock lock(&mu_);
  fail_at_.clear();
  torn_after_ = -1;
}

int FaultInjectionFileSystem::count(FaultOp op) const {
  MutexLock lock(&mu_);
  auto it = calls_.find(op);
  return it == calls_.end() ? 0 : it->second;
}

Status FaultInjectionFileSystem::Check(FaultOp op, const std::string& path) {
  MutexLock lock(&mu_);
  const int call = ++calls_[op];
  auto it = fail_at_.find(op);
  if (it == fail_at_.end() || it->second != call) return Status::OK();
  fail_at_.erase(it);
  return Status::IOError(base_->Uri(path) + ": injected failure of " + OpName(op) + " call " + std::to_string(call));
}

uint64_t FaultInjectionFileSystem::TornLimit(uint64_t size, uint64_t n) {
  MutexLock lock(&mu_);
  if (torn_after_ < 0 || size + n <= static_cast<uint64_t>(torn_after_)) return n;
  const uint64_t keep = size >= static_cast<uint64_t>(torn_after_) ? 0 : torn_after_ - size;
  torn_after_ = -1;
  return keep;
}

void FaultInjectionFileSystem::Synced(const std::string& path, uint64_t size) {
  MutexLock lock(&mu_);
  Written& w = written_[path];
  w.synced = size;
  w.ever_synced = true;
}

void FaultInjectionFileSystem::Opened(File* f) {
  MutexLock lock(&mu_);
  open_.insert(f);
}

void FaultInjectionFileSystem::Gone(File* f) {
  MutexLock lock(&mu_);
  open_.erase(f);
}

Status FaultInjectionFileSystem::Crash() {
  std::map<std::string, Written> written;
  {
    MutexLock lock(&mu_);
    for (File* f : open_) f->CrashNow();
    written.swap(written_);
  }
  for (const auto& [path, w] : written) {
    if (!w.ever_synced) {
      Status st = base_->Delete(path);
      if (!st.ok() && st.code() != StatusCode::kNotFound) return st;
      continue;
    }
    auto info = base_->Stat(path);
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kNotFound) continue;
      return info.status();
    }
    if (info->size <= w.synced) continue;
    // Cut to the synced prefix: read it, write it back.
    EMBER_ASSIGN_OR_RAISE(std::string data, ReadFile(*base_, path));
    data.resize(static_cast<size_t>(w.synced));
    EMBER_ASSIGN_OR_RAISE(auto file, base_->NewWritableFile(path));
    EMBER_RETURN_NOT_OK(file->Append(std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(data.data()), data.size())));
    EMBER_RETURN_NOT_OK(file->Close());
  }
  return Status::OK();
}

Result<std::unique_ptr<SequentialFile>> FaultInjectionFileSystem::NewSequentialFile(const std::string& path) {
  return base_->NewSequentialFile(path);
}

Result<std::unique_ptr<RandomAccessFile>> FaultInjectionFileSystem::NewRandomAccessFile(const std::string& path) {
  return base_->NewRandomAccessFile(path);
}

Result<std::unique_ptr<WritableFile>> FaultInjectionFileSystem::NewWritableFile(const std::string& path) {
  EMBER_ASSIGN_OR_RAISE(auto base, base_->NewWritableFile(path));
  {
    MutexLock lock(&mu_);
    written_[path] = Written{};  // created or truncated: nothing synced yet
  }
  return std::unique_ptr<WritableFile>(new File(this, path, std::move(base)));
}

Result<FileInfo> FaultInjectionFileSystem::Stat(const std::string& path) { return base_->Stat(path); }
Result<std::vector<FileInfo>> FaultInjectionFileSystem::List(const std::string& path) { return base_->List(path); }
Status FaultInjectionFileSystem::CreateDir(const std::string& path) { return base_->CreateDir(path); }

Status FaultInjectionFileSystem::Delete(const std::string& path) {
  EMBER_RETURN_NOT_OK(base_->Delete(path));
  MutexLock lock(&mu_);
  written_.erase(path);
  return Status::OK();
}

Status FaultInjectionFileSystem::DeleteRecursively(const std::string& path) {
  EMBER_RETURN_NOT_OK(base_->DeleteRecursively(path));
  MutexLock lock(&mu_);
  const std::string prefix = path + "/";
  for (auto it = written_.begin(); it != written_.end();) {
    it = (it->first == path || it->first.compare(0, prefix.size(), prefix) == 0) ? written_.erase(it) : std::next(it);
  }
  return Status::OK();
}

Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to) {
  EMBER_RETURN_NOT_OK(Check(FaultOp::kRename, from));
  EMBER_RETURN_NOT_OK(base_->Rename(from, to));
  MutexLock lock(&mu_);
  written_.erase(to);
  auto it = written_.find(from);
  if (it != written_.end()) {
    written_[to] = it->second;
    written_.erase(from);
  }
  // A renamed directory takes the files written under it along.
  const std::string prefix = from + "/";
  for (auto d = written_.lower_bound(prefix); d != written_.end() && d->first.starts_with(prefix);) {
    written_[to + d->first.substr(from.size())] = d->second;
    d = written_.erase(d);
  }
  return Status::OK();
}

}  // namespace ember::fs
