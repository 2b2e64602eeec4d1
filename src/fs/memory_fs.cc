// NewMemoryFileSystem: fs::FileSystem held in memory, for tests.
//
// One mutex guards the namespace (files by path, directories); each file's
// bytes sit behind their own mutex so readers and a writer of different files
// do not contend.  Written bytes become visible to readers on Flush, Sync or
// Close, like a real file's buffered bytes.  Paths may carry "mem://".
#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "ember/fs.h"

namespace ember::fs {
namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

struct MemFile {
  Mutex mu;
  std::string data GUARDED_BY(mu);
  int64_t mtime_ms GUARDED_BY(mu) = 0;
};

// "mem:///a//b/" -> "/a/b"; "" and "/" -> "/".  InvalidArgument if relative.
Result<std::string> Normalize(const std::string& in) {
  std::string p = in;
  if (p.compare(0, 6, "mem://") == 0) p = p.substr(6);
  if (p.empty() || p[0] != '/') return Status::InvalidArgument("mem: path must be absolute: " + in);
  std::string out;
  for (char c : p) {
    if (c == '/' && !out.empty() && out.back() == '/') continue;
    out.push_back(c);
  }
  if (out.size() > 1 && out.back() == '/') out.pop_back();
  return out;
}

std::string Parent(const std::string& p) {
  size_t slash = p.rfind('/');
  return slash == 0 ? "/" : p.substr(0, slash);
}

std::string BaseName(const std::string& p) { return p == "/" ? "/" : p.substr(p.rfind('/') + 1); }

std::string MemUri(const std::string& p) { return "mem://" + p; }

class MemSequentialFile final : public SequentialFile {
 public:
  MemSequentialFile(std::shared_ptr<MemFile> file, std::string uri)
      : file_(std::move(file)), uri_(std::move(uri)) {}
  Result<size_t> Read(std::span<uint8_t> buffer) override {
    MemFile* f = file_.get();  // one expression for the lock and the data (-Wthread-safety)
    MutexLock lock(&f->mu);
    const size_t size = f->data.size();
    size_t n = pos_ >= size ? 0 : std::min<uint64_t>(buffer.size(), size - pos_);
    if (n > 0) std::memcpy(buffer.data(), f->data.data() + pos_, n);
    pos_ += n;
    return n;
  }
  Status Skip(uint64_t n) override {
    pos_ += n;
    return Status::OK();
  }
  const std::string& uri() const override { return uri_; }

 private:
  std::shared_ptr<MemFile> file_;
  std::string uri_;
  uint64_t pos_ = 0;
};

class MemRandomAccessFile final : public RandomAccessFile {
 public:
  MemRandomAccessFile(std::shared_ptr<MemFile> file, std::string uri)
      : file_(std::move(file)), uri_(std::move(uri)) {}
  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> buffer) const override {
    MemFile* f = file_.get();
    MutexLock lock(&f->mu);
    const size_t size = f->data.size();
    size_t n = offset >= size ? 0 : std::min<uint64_t>(buffer.size(), size - offset);
    if (n > 0) std::memcpy(buffer.data(), f->data.data() + offset, n);
    return n;
  }
  Result<uint64_t> Size() const override {
    MutexLock lock(&file_->mu);
    return static_cast<uint64_t>(file_->data.size());
  }
  const std::string& uri() const override { return uri_; }

 private:
  std::shared_ptr<MemFile> file_;
  std::string uri_;
};

class MemWritableFile final : public WritableFile {
 public:
  MemWritableFile(std::shared_ptr<MemFile> file, std::string uri)
      : file_(std::move(file)), uri_(std::move(uri)) {}
  ~MemWritableFile() override { (void)Close(); }
  Status Append(std::span<const uint8_t> data) override {
    if (closed_) return Status::InvalidArgument("append to closed file " + uri_);
    pending_.append(reinterpret_cast<const char*>(data.data()), data.size());
    return Status::OK();
  }
  Status Flush() override {
    MutexLock lock(&file_->mu);
    file_->data += pending_;
    file_->mtime_ms = NowMs();
    pending_.clear();
    return Status::OK();
  }
  Status Sync() override {
    if (closed_) return Status::InvalidArgument("sync of closed file " + uri_);
    return Flush();
  }
  Status Close() override {
    if (closed_) return Status::OK();
    closed_ = true;
    return Flush();
  }
  const std::string& uri() const override { return uri_; }

 private:
  std::shared_ptr<MemFile> file_;
  std::string uri_;
  std::string pending_;
  bool closed_ = false;
};

// A snapshot of a file's bytes at MapReadOnly time.
class MemRegion final : public ReadOnlyMemoryRegion {
 public:
  MemRegion(std::string data, std::string uri) : data_(std::move(data)), uri_(std::move(uri)) {}
  std::span<const uint8_t> data() const override {
    return {reinterpret_cast<const uint8_t*>(data_.data()), data_.size()};
  }
  const std::string& uri() const override { return uri_; }

 private:
  const std::string data_;
  const std::string uri_;
};

class MemoryFs final : public FileSystem {
 public:
  MemoryFs() { dirs_.insert("/"); }

  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    EMBER_ASSIGN_OR_RAISE(auto file, Find(p, "open"));
    return std::unique_ptr<SequentialFile>(new MemSequentialFile(std::move(file), MemUri(p)));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    EMBER_ASSIGN_OR_RAISE(auto file, Find(p, "open"));
    return std::unique_ptr<RandomAccessFile>(new MemRandomAccessFile(std::move(file), MemUri(p)));
  }

  Result<std::shared_ptr<const ReadOnlyMemoryRegion>> MapReadOnly(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    EMBER_ASSIGN_OR_RAISE(auto file, Find(p, "open"));
    MutexLock lock(&file->mu);
    return std::shared_ptr<const ReadOnlyMemoryRegion>(std::make_shared<MemRegion>(file->data, MemUri(p)));
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    MutexLock lock(&mu_);
    if (dirs_.count(p)) return Status::InvalidArgument("create " + MemUri(p) + ": is a directory");
    EMBER_RETURN_NOT_OK(CreateDirLocked(Parent(p)));
    auto file = std::make_shared<MemFile>();
    {
      MutexLock flock(&file->mu);
      file->mtime_ms = NowMs();
    }
    files_[p] = file;
    return std::unique_ptr<WritableFile>(new MemWritableFile(std::move(file), MemUri(p)));
  }

  Result<FileInfo> Stat(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    MutexLock lock(&mu_);
    if (dirs_.count(p)) return FileInfo{BaseName(p), 0, true, 0};
    auto it = files_.find(p);
    if (it == files_.end()) return Status::NotFound("stat " + MemUri(p) + ": no such file");
    MutexLock flock(&it->second->mu);
    return FileInfo{BaseName(p), it->second->data.size(), false, it->second->mtime_ms};
  }

  Result<std::vector<FileInfo>> List(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    MutexLock lock(&mu_);
    if (!dirs_.count(p)) {
      if (files_.count(p)) return Status::InvalidArgument("list " + MemUri(p) + ": not a directory");
      return Status::NotFound("list " + MemUri(p) + ": no such directory");
    }
    std::vector<FileInfo> out;
    for (const auto& d : dirs_) {
      if (d != "/" && Parent(d) == p) out.push_back(FileInfo{BaseName(d), 0, true, 0});
    }
    for (const auto& [name, file] : files_) {
      if (Parent(name) != p) continue;
      MutexLock flock(&file->mu);
      out.push_back(FileInfo{BaseName(name), file->data.size(), false, file->mtime_ms});
    }
    std::sort(out.begin(), out.end(),
              [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
    return out;
  }

  Status CreateDir(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    MutexLock lock(&mu_);
    return CreateDirLocked(p);
  }

  Status Delete(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    MutexLock lock(&mu_);
    if (files_.erase(p)) return Status::OK();
    if (!dirs_.count(p)) return Status::NotFound("delete " + MemUri(p) + ": no such file");
    if (p == "/" || HasChildrenLocked(p)) {
      return Status::IOError("delete " + MemUri(p) + ": directory not empty");
    }
    dirs_.erase(p);
    return Status::OK();
  }

  Status DeleteRecursively(const std::string& path) override {
    EMBER_ASSIGN_OR_RAISE(std::string p, Normalize(path));
    MutexLock lock(&mu_);
    const std::string prefix = p == "/" ? "/" : p + "/";
    files_.erase(p);
    for (auto it = files_.lower_bound(prefix); it != files_.end() && it->first.starts_with(prefix);) {
      it = files_.erase(it);
    }
    for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && it->starts_with(prefix);) {
      it = dirs_.erase(it);
    }
    if (p != "/") dirs_.erase(p);
    dirs_.insert("/");
    return Status::OK();
  }

  Status Rename(const std::string& from, const std::string& to) override {
    EMBER_ASSIGN_OR_RAISE(std::string f, Normalize(from));
    EMBER_ASSIGN_OR_RAISE(std::string t, Normalize(to));
    MutexLock lock(&mu_);
    const std::string what = "rename " + MemUri(f) + " to " + MemUri(t);
    if (dirs_.count(f)) return RenameDirLocked(f, t, what);
    auto it = files_.find(f);
    if (it == files_.end()) return Status::NotFound(what + ": no such file");
    if (dirs_.count(t)) return Status::IOError(what + ": is a directory");
    if (!dirs_.count(Parent(t))) return Status::NotFound(what + ": no such directory");
    auto file = std::move(it->second);
    files_.erase(it);
    files_[t] = std::move(file);
    return Status::OK();
  }

  std::string scheme() const override { return "mem"; }
  std::string Uri(const std::string& path) const override {
    auto p = Normalize(path);
    return p.ok() ? MemUri(*p) : path;
  }

 private:
  Result<std::shared_ptr<MemFile>> Find(const std::string& p, const char* what) {
    MutexLock lock(&mu_);
    auto it = files_.find(p);
    if (it != files_.end()) return it->second;
    if (dirs_.count(p)) return Status::InvalidArgument(std::string(what) + " " + MemUri(p) + ": is a directory");
    return Status::NotFound(std::string(what) + " " + MemUri(p) + ": no such file");
  }

  Status CreateDirLocked(const std::string& p) EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (std::string d = p; d != "/"; d = Parent(d)) {
      if (files_.count(d)) return Status::IOError("create directory " + MemUri(p) + ": " + MemUri(d) + " is a file");
    }
    for (std::string d = p; d != "/" && !dirs_.count(d); d = Parent(d)) dirs_.insert(d);
    return Status::OK();
  }

  // A directory and everything under it moves in one step (POSIX and HDFS
  // rename(2) semantics): `t` must not be a file, nor a non-empty directory,
  // nor inside `f`; an empty directory at `t` is replaced.
  Status RenameDirLocked(const std::string& f, const std::string& t, const std::string& what)
      EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (f == "/" || t == f || t.starts_with(f + "/")) return Status::InvalidArgument(what + ": into itself");
    if (files_.count(t)) return Status::IOError(what + ": is a file");
    if (dirs_.count(t) && HasChildrenLocked(t)) return Status::IOError(what + ": directory not empty");
    if (!dirs_.count(Parent(t))) return Status::NotFound(what + ": no such directory");
    const std::string prefix = f + "/";
    std::vector<std::pair<std::string, std::shared_ptr<MemFile>>> moved_files;
    for (auto it = files_.lower_bound(prefix); it != files_.end() && it->first.starts_with(prefix);) {
      moved_files.emplace_back(t + it->first.substr(f.size()), std::move(it->second));
      it = files_.erase(it);
    }
    std::vector<std::string> moved_dirs;
    for (auto it = dirs_.lower_bound(prefix); it != dirs_.end() && it->starts_with(prefix);) {
      moved_dirs.push_back(t + it->substr(f.size()));
      it = dirs_.erase(it);
    }
    dirs_.erase(f);
    dirs_.insert(t);
    for (auto& d : moved_dirs) dirs_.insert(std::move(d));
    for (auto& [path, file] : moved_files) files_[path] = std::move(file);
    return Status::OK();
  }

  bool HasChildrenLocked(const std::string& p) EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const std::string prefix = p + "/";
    auto f = files_.lower_bound(prefix);
    if (f != files_.end() && f->first.starts_with(prefix)) return true;
    auto d = dirs_.lower_bound(prefix);
    return d != dirs_.end() && d->starts_with(prefix);
  }

  Mutex mu_;
  std::map<std::string, std::shared_ptr<MemFile>> files_ GUARDED_BY(mu_);
  std::set<std::string> dirs_ GUARDED_BY(mu_);
};

}  // namespace

std::shared_ptr<FileSystem> NewMemoryFileSystem() { return std::make_shared<MemoryFs>(); }

}  // namespace ember::fs
