// ResolveFileSystem (ember/fs.h): a URI to its file system and path.
#include <algorithm>
#include <cctype>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/mutex.h"
#include "ember/fs.h"
#include "fs/webhdfs.h"

namespace ember::fs {
namespace {

struct Uri {
  std::string scheme;     // "" for a bare path
  std::string authority;  // "nn:8020", may be empty
  std::string path;       // "/a/b"
};

// The scheme of `s` ("hdfs" of "hdfs://nn/x", "file" of "file:/x"), lower
// case; "" when `s` is a path.  A scheme is RFC 3986's: a letter, then
// letters, digits, '+', '-' or '.', ending at the first ':'.
std::string SchemeOf(const std::string& s) {
  const auto colon = s.find(':');
  if (colon == std::string::npos || colon == 0 || !std::isalpha(static_cast<unsigned char>(s[0]))) return "";
  std::string scheme;
  for (size_t i = 0; i < colon; ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (!std::isalnum(c) && c != '+' && c != '-' && c != '.') return "";
    scheme.push_back(static_cast<char>(std::tolower(c)));
  }
  return scheme;
}

// "scheme://authority/path", "scheme:/path" (Hadoop's "file:/x") or "/path".
Result<Uri> ParseUri(const std::string& s) {
  Uri u;
  u.scheme = SchemeOf(s);
  if (u.scheme.empty()) {
    u.path = s;
    if (u.path.empty() || u.path[0] != '/') return Status::InvalidArgument("not an absolute path or URI: \"" + s + "\"");
    return u;
  }
  const auto colon = u.scheme.size();
  std::string rest = s.substr(colon + 1);
  if (rest.compare(0, 2, "//") == 0) {
    const auto end = rest.find('/', 2);
    u.authority = rest.substr(2, end == std::string::npos ? std::string::npos : end - 2);
    u.path = end == std::string::npos ? "/" : rest.substr(end);
  } else {
    u.path = rest;
  }
  if (u.path.empty() || u.path[0] != '/') return Status::InvalidArgument("not an absolute path or URI: \"" + s + "\"");
  return u;
}

// An absolute path with "." and ".." steps and repeated or trailing '/'
// taken out, as Python's posixpath.normpath does ("/a/./b/../c/" is "/a/c";
// ".." above the root stays at the root).
std::string NormalizePath(const std::string& p) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i <= p.size()) {
    const size_t j = std::min(p.find('/', i), p.size());
    const std::string part = p.substr(i, j - i);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    i = j + 1;
  }
  std::string out;
  for (const std::string& part : parts) out += "/" + part;
  return out.empty() ? "/" : out;
}

// One HDFS FileSystem per (address, options), for the life of the process:
// its connection pool stays warm across ResolveFileSystem calls.
class HdfsCache {
 public:
  Result<std::shared_ptr<FileSystem>> Get(const HdfsOptions& o) {
    const std::string key = o.http_address + "|" + o.default_fs + "|" + o.user + "|" +
                            std::to_string(o.connect_timeout.count()) + "|" + std::to_string(o.io_timeout.count());
    MutexLock lock(&mu_);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    EMBER_ASSIGN_OR_RAISE(auto fs, NewHdfsFileSystem(o));
    cache_.emplace(key, fs);
    return fs;
  }

 private:
  Mutex mu_;
  std::map<std::string, std::shared_ptr<FileSystem>> cache_ GUARDED_BY(mu_);
};

HdfsCache& Cache() {
  static auto* cache = new HdfsCache();  // never destroyed: used until exit
  return *cache;
}

Result<Resolved> Hdfs(const std::string& http_address, const std::string& default_fs,
                      const std::string& path, const ResolveOptions& options) {
  HdfsOptions o;
  o.http_address = http_address;
  o.default_fs = default_fs;
  o.user = options.hdfs_user;
  o.connect_timeout = options.connect_timeout;
  o.io_timeout = options.io_timeout;
  EMBER_ASSIGN_OR_RAISE(auto fs, Cache().Get(o));
  return Resolved{std::move(fs), path, default_fs};
}

}  // namespace

ResolveOptions JobResolveOptions(const std::string& default_fs, const std::string& hdfs_http_address) {
  ResolveOptions options;
  options.default_fs = default_fs;
  if (!hdfs_http_address.empty()) {
    Result<Uri> d = ParseUri(default_fs);
    if (d.ok() && !d->authority.empty()) options.hdfs_http_addresses[d->authority] = hdfs_http_address;
  }
  return options;
}

Result<Resolved> ResolveFileSystem(const std::string& uri, const ResolveOptions& options) {
  EMBER_ASSIGN_OR_RAISE(Uri u, ParseUri(uri));
  if (u.scheme.empty()) {
    const std::string& d = options.default_fs;
    if (d.empty() || SchemeOf(d) == "file") return Resolved{LocalFileSystem(), u.path, ""};
    // default_fs "hdfs://nn:8020" (or "hdfs://nn:8020/"): the path lives there.
    std::string base = d;
    while (!base.empty() && base.back() == '/') base.pop_back();
    if (base.find("://") == std::string::npos) {
      return Status::InvalidArgument("ResolveOptions.default_fs is not a URI: \"" + d + "\"");
    }
    return ResolveFileSystem(base + u.path, options);
  }
  if (u.scheme == "file") {
    if (!u.authority.empty() && u.authority != "localhost") {
      return Status::InvalidArgument(uri + ": a file:// URI names no host (use file:///path)");
    }
    return Resolved{LocalFileSystem(), u.path, "file://"};
  }
  if (u.scheme == "hdfs") {
    std::string authority = u.authority;
    if (authority.empty()) {  // hdfs:///path: the NameNode of default_fs
      auto d = ParseUri(options.default_fs);
      if (!d.ok() || d->scheme != "hdfs" || d->authority.empty()) {
        return Status::InvalidArgument(uri + ": hdfs:/// needs an hdfs://host:port default_fs; it is \"" +
                                       options.default_fs + "\"");
      }
      authority = d->authority;
    }
    std::string http;
    auto it = options.hdfs_http_addresses.find(authority);
    if (it != options.hdfs_http_addresses.end()) {
      http = it->second;
    } else {
      const auto colon = authority.rfind(':');
      http = authority.substr(0, colon) + ":9870";  // Hadoop 3's dfs.namenode.http-address port
    }
    return Hdfs(http, "hdfs://" + authority, u.path, options);
  }
  if (u.scheme == "webhdfs") {
    if (u.authority.empty()) return Status::InvalidArgument(uri + ": webhdfs:// needs host:port");
    return Hdfs(u.authority, "webhdfs://" + u.authority, u.path, options);
  }
  return Status::InvalidArgument(uri + ": no file system for scheme \"" + u.scheme +
                                 "\" (paths, file://, hdfs:// and webhdfs:// are)");
}

Result<std::string> QualifyPath(const std::string& path, const ResolveOptions& options,
                                const std::string& working_dir) {
  if (path.empty()) return Status::InvalidArgument("an empty path names no file");
  if (!SchemeOf(path).empty()) return path;
  const std::string d = options.default_fs.empty() ? "file:///" : options.default_fs;
  auto fs = ParseUri(d);
  if (!fs.ok() || fs->scheme.empty() || d.find("://") == std::string::npos) {
    return Status::InvalidArgument("default_fs \"" + d + "\" is not a URI like file:/// or hdfs://namenode:8020");
  }
  const std::string root = d.substr(0, d.find("://") + 3) + fs->authority;
  if (path[0] == '/') {
    const size_t start = path.find_first_not_of('/');
    return root + "/" + (start == std::string::npos ? "" : path.substr(start));
  }
  if (fs->scheme == "file") {
    if (working_dir.empty() || working_dir[0] != '/') {
      return Status::InvalidArgument("relative path \"" + path + "\" needs an absolute working directory, not \"" +
                                     working_dir + "\"");
    }
    return root + NormalizePath(working_dir + "/" + path);
  }
  const std::string user = options.hdfs_user.empty() ? internal::ProcessUserName() : options.hdfs_user;
  return root + "/user/" + user + "/" + path;
}

Result<std::vector<std::string>> GlobUris(const std::string& pattern, const ResolveOptions& options,
                                          bool recursive) {
  EMBER_ASSIGN_OR_RAISE(Resolved r, ResolveFileSystem(pattern, options));
  EMBER_ASSIGN_OR_RAISE(std::vector<std::string> paths, Glob(*r.fs, r.path, recursive));
  for (std::string& p : paths) p = r.Uri(p);
  return paths;
}

}  // namespace ember::fs
