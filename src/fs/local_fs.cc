// LocalFileSystem: fs::FileSystem over POSIX calls.
//
// Every descriptor is O_CLOEXEC (nodes fork trainers) and owned by an Fd.
// Errors name the path and the OS's text; reads name the byte offset.
#include <dirent.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "common/fd.h"
#include "common/shm.h"
#include "ember/fs.h"

namespace ember::fs {
namespace {

constexpr size_t kWriteBufferBytes = 64 << 10;

// NotFound for ENOENT/ENOTDIR, IOError otherwise; "<what> <path>: <errno text>".
Status PathError(int err, const std::string& what, const std::string& path) {
  Status st = Status::FromErrno(err, what + " " + path);
  if (err == ENOENT || err == ENOTDIR) return Status::NotFound(st.message());
  return st;
}

// "file:///a/b" -> "/a/b"; other paths unchanged.
std::string StripScheme(const std::string& path) {
  constexpr std::string_view kPrefix = "file://";
  if (path.compare(0, kPrefix.size(), kPrefix) == 0) return path.substr(kPrefix.size());
  return path;
}

class LocalSequentialFile final : public SequentialFile {
 public:
  LocalSequentialFile(Fd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}

  Result<size_t> Read(std::span<uint8_t> buffer) override {
    size_t done = 0;
    while (done < buffer.size()) {
      ssize_t n = ::read(fd_.get(), buffer.data() + done, buffer.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "read " + path_ + " at offset " + std::to_string(offset_));
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
      offset_ += static_cast<uint64_t>(n);
    }
    return done;
  }

  Status Skip(uint64_t n) override {
    if (::lseek(fd_.get(), static_cast<off_t>(n), SEEK_CUR) < 0) {
      return Status::FromErrno(errno, "seek " + path_ + " at offset " + std::to_string(offset_));
    }
    offset_ += n;
    return Status::OK();
  }

  const std::string& uri() const override { return path_; }

 private:
  Fd fd_;
  std::string path_;
  uint64_t offset_ = 0;
};

class LocalRandomAccessFile final : public RandomAccessFile {
 public:
  LocalRandomAccessFile(Fd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}

  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> buffer) const override {
    size_t done = 0;
    while (done < buffer.size()) {
      ssize_t n = ::pread(fd_.get(), buffer.data() + done, buffer.size() - done,
                          static_cast<off_t>(offset + done));
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno,
                                 "read " + path_ + " at offset " + std::to_string(offset + done));
      }
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

  Result<uint64_t> Size() const override {
    struct stat st;
    if (::fstat(fd_.get(), &st) != 0) return Status::FromErrno(errno, "stat " + path_);
    return static_cast<uint64_t>(st.st_size);
  }

  const std::string& uri() const override { return path_; }

 private:
  Fd fd_;
  std::string path_;
};

class LocalRegion final : public ReadOnlyMemoryRegion {
 public:
  LocalRegion(Mapping mapping, std::string path) : mapping_(std::move(mapping)), path_(std::move(path)) {}
  std::span<const uint8_t> data() const override {
    return {static_cast<const uint8_t*>(mapping_.data()), mapping_.size()};
  }
  const std::string& uri() const override { return path_; }
  void WillRead(size_t offset, size_t n) const override {
    const size_t size = mapping_.size();
    size_t end = std::min(size, offset + n);
    // Populated once: a mapping kept for the next pass (fs::MappingCache)
    // would otherwise have its page tables walked again for nothing.
    // Hints come in file order, so one high-water mark says what was done.
    size_t done = populated_to_.load(std::memory_order_relaxed);
    offset = std::max(offset, done);
    if (offset >= end) return;
    while (done < end && !populated_to_.compare_exchange_weak(done, end, std::memory_order_relaxed)) {
    }
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t start = offset / page * page;
    // A hint: an old kernel without MADV_POPULATE_READ (5.14) refuses it,
    // and the pages then fault in as they are read.
    (void)::madvise(static_cast<uint8_t*>(mapping_.data()) + start, end - start, MADV_POPULATE_READ);
  }

 private:
  Mapping mapping_;  // unmapped when the last reader lets go
  mutable std::atomic<size_t> populated_to_{0};  // WillRead's high-water mark
  std::string path_;
};

class LocalWritableFile final : public WritableFile {
 public:
  LocalWritableFile(Fd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {
    buffer_.reserve(kWriteBufferBytes);
  }
  ~LocalWritableFile() override { (void)Close(); }

  Status Append(std::span<const uint8_t> data) override {
    if (closed_) return Status::InvalidArgument("append to closed file " + path_);
    if (buffer_.size() + data.size() <= kWriteBufferBytes) {
      buffer_.insert(buffer_.end(), data.begin(), data.end());
      return Status::OK();
    }
    EMBER_RETURN_NOT_OK(Flush());
    if (data.size() >= kWriteBufferBytes) return WriteAll(data);  // large: skip the copy
    buffer_.insert(buffer_.end(), data.begin(), data.end());
    return Status::OK();
  }

  Status Flush() override {
    if (closed_) return Status::OK();
    Status st = WriteAll(buffer_);
    buffer_.clear();
    return st;
  }

  Status Sync() override {
    if (closed_) return Status::InvalidArgument("sync of closed file " + path_);
    EMBER_RETURN_NOT_OK(Flush());
    if (::fsync(fd_.get()) != 0) return Status::FromErrno(errno, "fsync " + path_);
    return Status::OK();
  }

  Status Close() override {
    if (closed_) return Status::OK();
    Status st = Flush();
    closed_ = true;
    Status close_st = fd_.Close();
    if (!close_st.ok() && st.ok()) st = close_st.WithContext("close " + path_);
    return st;
  }

  const std::string& uri() const override { return path_; }

 private:
  Status WriteAll(std::span<const uint8_t> data) {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = ::write(fd_.get(), data.data() + done, data.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "write " + path_ + " at offset " + std::to_string(written_));
      }
      done += static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
    return Status::OK();
  }

  Fd fd_;
  std::string path_;
  std::vector<uint8_t> buffer_;
  uint64_t written_ = 0;
  bool closed_ = false;
};

FileInfo InfoFromStat(std::string name, const struct stat& st) {
  FileInfo info;
  info.name = std::move(name);
  info.is_dir = S_ISDIR(st.st_mode);
  info.size = info.is_dir ? 0 : static_cast<uint64_t>(st.st_size);
  info.mtime_ms = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000 + st.st_mtim.tv_nsec / 1000000;
  return info;
}

class LocalFs final : public FileSystem {
 public:
  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& uri) override {
    std::string path = StripScheme(uri);
    EMBER_ASSIGN_OR_RAISE(Fd fd, OpenRead(path));
    return std::unique_ptr<SequentialFile>(new LocalSequentialFile(std::move(fd), path));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& uri) override {
    std::string path = StripScheme(uri);
    EMBER_ASSIGN_OR_RAISE(Fd fd, OpenRead(path));
    return std::unique_ptr<RandomAccessFile>(new LocalRandomAccessFile(std::move(fd), path));
  }

  Result<std::shared_ptr<const ReadOnlyMemoryRegion>> MapReadOnly(const std::string& uri) override {
    std::string path = StripScheme(uri);
    EMBER_ASSIGN_OR_RAISE(Fd fd, OpenRead(path));
    struct stat st;
    if (::fstat(fd.get(), &st) != 0) return PathError(errno, "stat", path);
    Mapping mapping;  // an empty file maps nothing (mmap refuses 0 bytes)
    if (st.st_size > 0) {
      EMBER_ASSIGN_OR_RAISE(mapping, Mapping::MapFileReadOnly(fd.get(), static_cast<size_t>(st.st_size), path));
    }
    return std::shared_ptr<const ReadOnlyMemoryRegion>(std::make_shared<LocalRegion>(std::move(mapping), path));
  }

  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& uri) override {
    std::string path = StripScheme(uri);
    std::string parent = std::filesystem::path(path).parent_path().string();
    if (!parent.empty()) EMBER_RETURN_NOT_OK(CreateDir(parent));
    int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return PathError(errno, "create", path);
    return std::unique_ptr<WritableFile>(new LocalWritableFile(Fd(fd), path));
  }

  Result<FileInfo> Stat(const std::string& uri) override {
    std::string path = StripScheme(uri);
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PathError(errno, "stat", path);
    return InfoFromStat(std::filesystem::path(path).filename().string(), st);
  }

  Result<std::vector<FileInfo>> List(const std::string& uri) override {
    std::string path = StripScheme(uri);
    int dfd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return PathError(errno, "list", path);
    DIR* dir = ::fdopendir(dfd);
    if (dir == nullptr) {
      int err = errno;
      ::close(dfd);
      return PathError(err, "list", path);
    }
    std::vector<FileInfo> out;
    Status st;
    errno = 0;
    while (struct dirent* e = ::readdir(dir)) {
      std::string name = e->d_name;
      if (name == "." || name == "..") continue;
      struct stat s;
      if (::fstatat(dfd, e->d_name, &s, 0) != 0) {
        if (errno == ENOENT) continue;  // deleted while listing
        st = PathError(errno, "stat", path + "/" + name);
        break;
      }
      out.push_back(InfoFromStat(std::move(name), s));
      errno = 0;
    }
    if (st.ok() && errno != 0) st = PathError(errno, "list", path);
    ::closedir(dir);  // closes dfd
    EMBER_RETURN_NOT_OK(st);
    std::sort(out.begin(), out.end(),
              [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
    return out;
  }

  Status CreateDir(const std::string& uri) override {
    std::string path = StripScheme(uri);
    std::error_code ec;
    std::filesystem::create_directories(path, ec);
    if (ec) return PathError(ec.value(), "create directory", path);
    return Status::OK();
  }

  Status Delete(const std::string& uri) override {
    std::string path = StripScheme(uri);
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return PathError(errno, "delete", path);
    int rc = S_ISDIR(st.st_mode) ? ::rmdir(path.c_str()) : ::unlink(path.c_str());
    if (rc != 0) return PathError(errno, "delete", path);
    return Status::OK();
  }

  Status DeleteRecursively(const std::string& uri) override {
    std::string path = StripScheme(uri);
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
    if (ec && ec.value() != ENOENT) return PathError(ec.value(), "delete recursively", path);
    return Status::OK();
  }

  Status Rename(const std::string& from_uri, const std::string& to_uri) override {
    std::string from = StripScheme(from_uri), to = StripScheme(to_uri);
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PathError(errno, "rename " + from + " to", to);
    }
    return Status::OK();
  }

  std::string scheme() const override { return "file"; }
  std::string Uri(const std::string& path) const override { return StripScheme(path); }

 private:
  static Result<Fd> OpenRead(const std::string& path) {
    int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PathError(errno, "open", path);
    struct stat st;
    if (::fstat(fd, &st) == 0 && S_ISDIR(st.st_mode)) {
      ::close(fd);
      return Status::InvalidArgument("open " + path + ": is a directory");
    }
    return Fd(fd);
  }
};

}  // namespace

std::shared_ptr<FileSystem> LocalFileSystem() {
  static const std::shared_ptr<FileSystem> fs = std::make_shared<LocalFs>();
  return fs;
}

}  // namespace ember::fs
