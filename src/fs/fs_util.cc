// Glob, ReadFile, AtomicWriteFile and MappingCache over any FileSystem (ember/fs.h).
#include <fnmatch.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <random>
#include <set>

#include "ember/fs.h"

namespace ember::fs {
namespace {

bool HasWildcard(const std::string& s) { return s.find_first_of("*?[") != std::string::npos; }

std::vector<std::string> SplitPath(const std::string& p) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < p.size()) {
    const size_t j = p.find('/', i);
    const size_t end = j == std::string::npos ? p.size() : j;
    if (end > i) parts.push_back(p.substr(i, end - i));
    i = end + 1;
  }
  return parts;
}

std::string Join(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

bool Hidden(const std::string& name) { return !name.empty() && (name[0] == '_' || name[0] == '.'); }

}  // namespace

Result<std::vector<std::string>> Glob(FileSystem& fs, const std::string& pattern, bool recursive) {
  if (pattern.empty() || pattern[0] != '/') {
    return Status::InvalidArgument("glob pattern must be an absolute path: \"" + pattern + "\"");
  }
  const std::vector<std::string> parts = SplitPath(pattern);
  // Expand one component at a time; only components with wildcards list.
  std::vector<std::string> candidates{"/"};
  for (size_t i = 0; i < parts.size() && !candidates.empty(); ++i) {
    const bool last = i + 1 == parts.size();
    std::vector<std::string> next;
    for (const std::string& dir : candidates) {
      if (!HasWildcard(parts[i])) {
        next.push_back(Join(dir, parts[i]));
        continue;
      }
      auto entries = fs.List(dir);
      if (!entries.ok()) {
        if (entries.status().code() == StatusCode::kNotFound) continue;
        return entries.status();
      }
      for (const FileInfo& e : *entries) {
        // FNM_PERIOD: a wildcard does not match a leading '.', as in the shell.
        if ((last || e.is_dir) && fnmatch(parts[i].c_str(), e.name.c_str(), FNM_PERIOD) == 0) {
          next.push_back(Join(dir, e.name));
        }
      }
    }
    candidates = std::move(next);
  }
  std::set<std::string> out;
  for (const std::string& c : candidates) {
    auto info = fs.Stat(c);
    if (!info.ok()) {
      if (info.status().code() == StatusCode::kNotFound) continue;
      return info.status();
    }
    if (!info->is_dir) {
      out.insert(c);
      continue;
    }
    // The directory's visible files; with `recursive`, those of its visible subdirectories too.
    std::vector<std::string> dirs{c};
    while (!dirs.empty()) {
      const std::string dir = std::move(dirs.back());
      dirs.pop_back();
      EMBER_ASSIGN_OR_RAISE(auto entries, fs.List(dir));
      for (const FileInfo& e : entries) {
        if (Hidden(e.name)) continue;
        if (!e.is_dir) {
          out.insert(Join(dir, e.name));
        } else if (recursive) {
          dirs.push_back(Join(dir, e.name));
        }
      }
    }
  }
  if (out.empty()) return Status::NotFound("no files match " + fs.Uri(pattern));
  return std::vector<std::string>(out.begin(), out.end());
}

Result<std::string> ReadFile(FileSystem& fs, const std::string& path) {
  EMBER_ASSIGN_OR_RAISE(auto file, fs.NewSequentialFile(path));
  std::string data;
  constexpr size_t kChunk = 1 << 20;
  while (true) {
    const size_t old = data.size();
    data.resize(old + kChunk);
    auto n = file->Read(std::span<uint8_t>(reinterpret_cast<uint8_t*>(data.data()) + old, kChunk));
    if (!n.ok()) return n.status();
    data.resize(old + *n);
    if (*n < kChunk) break;
  }
  return data;
}

Status AtomicWriteFile(FileSystem& fs, const std::string& path, std::span<const uint8_t> data) {
  const auto slash = path.rfind('/');
  if (slash == std::string::npos || slash + 1 == path.size()) {
    return Status::InvalidArgument("AtomicWriteFile needs an absolute file path: \"" + path + "\"");
  }
  // A hidden name (Glob skips it) unique across processes and threads.
  static std::atomic<uint64_t> counter{0};
  static const uint64_t salt = std::random_device{}();
  const std::string tmp = path.substr(0, slash + 1) + "." + path.substr(slash + 1) + ".tmp-" +
                          std::to_string(getpid()) + "-" + std::to_string(salt % 1000000) + "-" +
                          std::to_string(counter.fetch_add(1));
  Status st = [&]() -> Status {
    EMBER_ASSIGN_OR_RAISE(auto file, fs.NewWritableFile(tmp));
    EMBER_RETURN_NOT_OK(file->Append(data));
    EMBER_RETURN_NOT_OK(file->Sync());
    EMBER_RETURN_NOT_OK(file->Close());
    return fs.Rename(tmp, path);
  }();
  if (!st.ok()) {
    (void)fs.Delete(tmp);  // best effort; NotFound when it was never made
    return st.WithContext("writing " + fs.Uri(path));
  }
  return Status::OK();
}

Result<std::shared_ptr<const ReadOnlyMemoryRegion>> MappingCache::Map(FileSystem& fs, const std::string& path) {
  std::string key = fs.scheme() + ":" + path;
  {
    // A file system that maps nothing (HDFS) is not asked for its files'
    // status again, which would cost a request to the NameNode per file.
    std::lock_guard<std::mutex> lock(mu_);
    if (unmapped_schemes_.contains(fs.scheme())) return std::shared_ptr<const ReadOnlyMemoryRegion>();
  }
  // The status before the mapping: a file replaced in between is then
  // mapped anew on the next call, never taken for the old one.
  EMBER_ASSIGN_OR_RAISE(FileInfo info, fs.Stat(path));
  std::shared_ptr<const ReadOnlyMemoryRegion> stale;  // unmapped outside the lock
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = entries_.begin(); it != entries_.end(); ++it) {
      if (it->key != key) continue;
      if (it->info.size == info.size && it->info.mtime_ms == info.mtime_ms) {
        ++hits_;
        return it->region;
      }
      bytes_ -= it->bytes;
      stale = std::move(it->region);
      entries_.erase(it);
      break;
    }
  }
  stale.reset();
  // Mapped outside the lock: a big file's mmap must not hold up the others.
  EMBER_ASSIGN_OR_RAISE(auto region, fs.MapReadOnly(path));
  std::lock_guard<std::mutex> lock(mu_);
  if (region == nullptr) {
    unmapped_schemes_.insert(fs.scheme());
    return region;
  }
  const uint64_t bytes = region->data().size();
  if (bytes_ + bytes > max_bytes_) return region;  // full: the caller's alone
  for (const Entry& e : entries_) {
    if (e.key == key) return region;  // another pass mapped it meanwhile: keep theirs
  }
  entries_.push_back(Entry{std::move(key), info, bytes, region});
  bytes_ += bytes;
  return region;
}

uint64_t MappingCache::mapped_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

uint64_t MappingCache::hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return hits_;
}

}  // namespace ember::fs
