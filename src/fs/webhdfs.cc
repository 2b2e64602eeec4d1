// HDFS over WebHDFS: NewHdfsFileSystem (ember/fs.h), on libcurl (http.h) and
// nlohmann::json (the answers; parsed without exceptions).
#include "fs/webhdfs.h"

#include <pwd.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "fs/http.h"

namespace ember::fs {
namespace internal {
namespace {

using Json = nlohmann::json;

// nlohmann's parse without exceptions: a discarded value on bad input.
Json ParseJson(std::string_view text) { return Json::parse(text.begin(), text.end(), nullptr, false); }

const Json* Member(const Json& j, const char* key) {
  if (!j.is_object()) return nullptr;
  auto it = j.find(key);
  return it == j.end() ? nullptr : &*it;
}

bool GetInt(const Json& j, const char* key, int64_t* out) {
  const Json* v = Member(j, key);
  if (v == nullptr || !v->is_number_integer()) return false;
  *out = v->get<int64_t>();
  return true;
}

bool GetString(const Json& j, const char* key, std::string* out) {
  const Json* v = Member(j, key);
  if (v == nullptr || !v->is_string()) return false;
  *out = v->get<std::string>();
  return true;
}

Result<FileInfo> FileInfoOf(const Json& st, const std::string& name_if_empty) {
  FileInfo info;
  int64_t length = 0, mtime = 0;
  std::string type, suffix;
  if (!GetInt(st, "length", &length) || !GetString(st, "type", &type) ||
      !GetString(st, "pathSuffix", &suffix) || length < 0) {
    return Status::Corruption("WebHDFS FileStatus without length, type or pathSuffix: " +
                              st.dump().substr(0, 200));
  }
  GetInt(st, "modificationTime", &mtime);
  info.name = suffix.empty() ? name_if_empty : suffix;
  info.size = static_cast<uint64_t>(length);
  info.is_dir = type == "DIRECTORY";
  info.mtime_ms = mtime;
  return info;
}

std::string Excerpt(std::string_view body) {
  std::string s(body.substr(0, 200));
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

}  // namespace

Result<FileInfo> ParseFileStatus(std::string_view json, const std::string& name_if_empty) {
  const Json j = ParseJson(json);
  const Json* st = Member(j, "FileStatus");
  if (st == nullptr) return Status::Corruption("not a WebHDFS FileStatus answer: " + Excerpt(json));
  return FileInfoOf(*st, name_if_empty);
}

Result<std::vector<FileInfo>> ParseFileStatuses(std::string_view json) {
  const Json j = ParseJson(json);
  const Json* outer = Member(j, "FileStatuses");
  const Json* list = outer ? Member(*outer, "FileStatus") : nullptr;
  if (list == nullptr || !list->is_array()) {
    return Status::Corruption("not a WebHDFS FileStatuses answer: " + Excerpt(json));
  }
  std::vector<FileInfo> out;
  out.reserve(list->size());
  for (const Json& st : *list) {
    EMBER_ASSIGN_OR_RAISE(FileInfo info, FileInfoOf(st, ""));
    out.push_back(std::move(info));
  }
  std::sort(out.begin(), out.end(), [](const FileInfo& a, const FileInfo& b) { return a.name < b.name; });
  return out;
}

Result<bool> ParseBoolean(std::string_view json) {
  const Json j = ParseJson(json);
  const Json* b = Member(j, "boolean");
  if (b == nullptr || !b->is_boolean()) return Status::Corruption("not a WebHDFS boolean answer: " + Excerpt(json));
  return b->get<bool>();
}

Status ErrorFromResponse(long http_status, std::string_view body, const std::string& context) {
  const Json j = ParseJson(body);
  const Json* re = Member(j, "RemoteException");
  std::string exception, message;
  if (re != nullptr && GetString(*re, "exception", &exception)) {
    GetString(*re, "message", &message);
    const std::string msg = context + ": " + exception + ": " + message;
    if (exception == "FileNotFoundException") return Status::NotFound(msg);
    if (exception == "FileAlreadyExistsException") return Status::AlreadyExists(msg);
    if (exception == "StandbyException" || exception == "SafeModeException" ||
        exception == "RetriableException") {
      return Status::Unavailable(msg);
    }
    return Status::IOError(msg);
  }
  const std::string msg = context + ": HTTP " + std::to_string(http_status) +
                          (body.empty() ? "" : ": " + Excerpt(body));
  if (http_status == 404) return Status::NotFound(msg);
  if (http_status == 503) return Status::Unavailable(msg);
  return Status::IOError(msg);
}

namespace {

// What all objects of one file system share: options, URLs, a client pool.
class WebHdfs {
 public:
  WebHdfs(HdfsOptions options, std::string user)
      : options_(std::move(options)),
        user_(std::move(user)),
        pool_(Timeouts()) {}

  const HdfsOptions& options() const { return options_; }
  HttpTimeouts Timeouts() const { return {options_.connect_timeout, options_.io_timeout}; }
  HttpClientPool& pool() { return pool_; }

  std::string Uri(const std::string& path) const {
    if (!options_.default_fs.empty()) return options_.default_fs + path;
    return "webhdfs://" + options_.http_address + path;
  }

  // The URL of `op` on `path`; `params` is "&k=v..." (already encoded).
  std::string Url(const std::string& path, const char* op, const std::string& params = "") const {
    return "http://" + options_.http_address + "/webhdfs/v1" + UrlEncode(path, true) + "?op=" + op +
           "&user.name=" + UrlEncode(user_, false) + params;
  }

  // "hdfs://nn:8020/x: OPEN at offset 5 (WebHDFS at nn:9870)"-style context.
  std::string Context(const std::string& path, const char* op, int64_t offset = -1) const {
    std::string c = Uri(path) + ": " + op;
    if (offset >= 0) c += " at offset " + std::to_string(offset);
    return c + " (WebHDFS at " + options_.http_address + ")";
  }

  // A NameNode request answering JSON with 200 (a metadata operation).
  Result<std::string> Call(HttpMethod method, const std::string& path, const char* op,
                           const std::string& params = "") {
    EMBER_ASSIGN_OR_RAISE(auto lease, pool_.Take());
    auto r = (*lease)->Send(method, Url(path, op, params));
    if (!r.ok()) return r.status().WithContext(Context(path, op));
    if (r->status != 200) return ErrorFromResponse(r->status, r->body, Context(path, op));
    return std::move(r->body);
  }

  Result<FileInfo> Stat(const std::string& path) {
    EMBER_ASSIGN_OR_RAISE(std::string body, Call(HttpMethod::kGet, path, "GETFILESTATUS"));
    auto info = ParseFileStatus(body, path.substr(path.rfind('/') + 1));
    if (!info.ok()) return info.status().WithContext(Context(path, "GETFILESTATUS"));
    return info;
  }

  // Reads [offset, offset + buf.size()) with one ranged OPEN (NameNode, then
  // the DataNode it redirects to); returns the bytes read.
  Result<size_t> ReadRange(HttpClient& client, const std::string& path, uint64_t offset,
                           std::span<uint8_t> buf) {
    const std::string params = "&offset=" + std::to_string(offset) + "&length=" + std::to_string(buf.size());
    auto r = client.Send(HttpMethod::kGet, Url(path, "OPEN", params), {}, buf, /*follow_redirects=*/true);
    const auto off = static_cast<int64_t>(offset);
    if (!r.ok()) return r.status().WithContext(Context(path, "OPEN", off));
    if (r->status != 200) return ErrorFromResponse(r->status, r->body, Context(path, "OPEN", off));
    return r->sink_bytes;
  }

  // CREATE (overwrite) or APPEND `data` to `path`: the NameNode answers 307
  // with a DataNode's Location, which gets the bytes (so no data goes to the
  // NameNode, as WebHDFS asks).  The DataNode closes its stream before it
  // answers, so the bytes are on the DataNodes when this returns.
  Status Write(HttpClient& client, const std::string& path, bool create, std::span<const uint8_t> data) {
    const char* op = create ? "CREATE" : "APPEND";
    const HttpMethod method = create ? HttpMethod::kPut : HttpMethod::kPost;
    const std::string params = create ? "&overwrite=true" : "";
    auto r = client.Send(method, Url(path, op, params));
    if (!r.ok()) return r.status().WithContext(Context(path, op));
    if (r->status != 307 || r->location.empty()) {
      if (r->status == 307) return Status::IOError(Context(path, op) + ": redirect without a Location");
      return ErrorFromResponse(r->status, r->body, Context(path, op));
    }
    auto w = client.Send(method, r->location, data);
    if (!w.ok()) return w.status().WithContext(Context(path, op));
    if (w->status != (create ? 201 : 200)) return ErrorFromResponse(w->status, w->body, Context(path, op));
    return Status::OK();
  }

 private:
  const HdfsOptions options_;
  const std::string user_;
  HttpClientPool pool_;
};

class HdfsSequentialFile final : public SequentialFile {
 public:
  HdfsSequentialFile(std::shared_ptr<WebHdfs> hdfs, std::string path, uint64_t size,
                     std::unique_ptr<HttpClient> client)
      : hdfs_(std::move(hdfs)), path_(std::move(path)), uri_(hdfs_->Uri(path_)), size_(size),
        client_(std::move(client)) {}

  Result<size_t> Read(std::span<uint8_t> buffer) override {
    size_t done = 0;
    while (done < buffer.size()) {
      if (chunk_pos_ == chunk_.size()) {
        // Refill: one ranged OPEN of read_chunk_bytes (fewer at the end).
        if (pos_ >= size_) break;
        const uint64_t want = std::min<uint64_t>(hdfs_->options().read_chunk_bytes, size_ - pos_);
        chunk_.resize(want);
        chunk_pos_ = 0;
        auto n = hdfs_->ReadRange(*client_, path_, pos_, chunk_);
        if (!n.ok()) {
          chunk_.clear();
          return n.status();
        }
        chunk_.resize(*n);
        if (*n == 0) {
          size_ = pos_;  // the file shrank: this is its end
          break;
        }
      }
      const size_t n = std::min(buffer.size() - done, chunk_.size() - chunk_pos_);
      std::memcpy(buffer.data() + done, chunk_.data() + chunk_pos_, n);
      chunk_pos_ += n;
      pos_ += n;
      done += n;
    }
    return done;
  }

  Status Skip(uint64_t n) override {
    const uint64_t in_chunk = std::min<uint64_t>(n, chunk_.size() - chunk_pos_);
    chunk_pos_ += in_chunk;
    if (n > in_chunk) {  // beyond the buffered bytes: drop them, read from the new offset
      chunk_.clear();
      chunk_pos_ = 0;
    }
    pos_ += n;
    return Status::OK();
  }

  const std::string& uri() const override { return uri_; }

 private:
  const std::shared_ptr<WebHdfs> hdfs_;
  const std::string path_, uri_;
  uint64_t size_;     // from GETFILESTATUS at open; reads stop there
  uint64_t pos_ = 0;  // offset of the next byte Read returns
  std::vector<uint8_t> chunk_;
  size_t chunk_pos_ = 0;  // chunk_[chunk_pos_] is the byte at pos_
  std::unique_ptr<HttpClient> client_;
};

class HdfsRandomAccessFile final : public RandomAccessFile {
 public:
  HdfsRandomAccessFile(std::shared_ptr<WebHdfs> hdfs, std::string path, uint64_t size)
      : hdfs_(std::move(hdfs)), path_(std::move(path)), uri_(hdfs_->Uri(path_)), size_(size) {}

  // One ranged OPEN per call, on a client from the file system's pool (so
  // concurrent calls each have their own connection).
  Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> buffer) const override {
    if (offset >= size_ || buffer.empty()) return size_t{0};
    const size_t want = static_cast<size_t>(std::min<uint64_t>(buffer.size(), size_ - offset));
    EMBER_ASSIGN_OR_RAISE(auto lease, hdfs_->pool().Take());
    size_t done = 0;
    while (done < want) {  // a DataNode may end a range early at a block boundary
      EMBER_ASSIGN_OR_RAISE(size_t n, hdfs_->ReadRange(*lease->operator->(), path_, offset + done,
                                                       buffer.subspan(done, want - done)));
      if (n == 0) break;
      done += n;
    }
    return done;
  }

  Result<uint64_t> Size() const override { return size_; }
  const std::string& uri() const override { return uri_; }

 private:
  const std::shared_ptr<WebHdfs> hdfs_;
  const std::string path_, uri_;
  const uint64_t size_;  // from GETFILESTATUS at open
};

class HdfsWritableFile final : public WritableFile {
 public:
  HdfsWritableFile(std::shared_ptr<WebHdfs> hdfs, std::string path, std::unique_ptr<HttpClient> client)
      : hdfs_(std::move(hdfs)), path_(std::move(path)), uri_(hdfs_->Uri(path_)), client_(std::move(client)) {}
  ~HdfsWritableFile() override { (void)Close(); }

  Status Append(std::span<const uint8_t> data) override {
    if (closed_) return Status::InvalidArgument(uri_ + ": Append after Close");
    buffer_.insert(buffer_.end(), data.begin(), data.end());
    if (buffer_.size() >= hdfs_->options().write_chunk_bytes) return Flush();
    return Status::OK();
  }

  // The first request CREATEs the file (overwriting one that exists), later
  // ones APPEND; each sends what is buffered, in write_chunk_bytes pieces.
  Status Flush() override {
    if (closed_) return Status::InvalidArgument(uri_ + ": Flush after Close");
    const size_t chunk = std::max<size_t>(1, hdfs_->options().write_chunk_bytes);
    size_t sent = 0;
    Status st;
    do {
      const size_t n = std::min(chunk, buffer_.size() - sent);
      st = hdfs_->Write(*client_, path_, !created_, std::span<const uint8_t>(buffer_).subspan(sent, n));
      if (!st.ok()) break;
      created_ = true;
      sent += n;
    } while (sent < buffer_.size());
    buffer_.erase(buffer_.begin(), buffer_.begin() + static_cast<ptrdiff_t>(sent));
    return st;
  }

  // WebHDFS closes the DataNode stream at the end of every request, so what
  // Flush sent is on the DataNodes already.
  Status Sync() override { return Flush(); }

  Status Close() override {
    if (closed_) return Status::OK();
    Status st = Flush();
    closed_ = true;
    buffer_.clear();
    return st;
  }

  const std::string& uri() const override { return uri_; }

 private:
  const std::shared_ptr<WebHdfs> hdfs_;
  const std::string path_, uri_;
  std::unique_ptr<HttpClient> client_;
  std::vector<uint8_t> buffer_;
  bool created_ = false;  // a CREATE succeeded; next requests APPEND
  bool closed_ = false;
};

class HdfsFileSystem final : public FileSystem {
 public:
  explicit HdfsFileSystem(std::shared_ptr<WebHdfs> hdfs) : hdfs_(std::move(hdfs)) {}

  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    EMBER_ASSIGN_OR_RAISE(uint64_t size, FileSize(path));
    EMBER_ASSIGN_OR_RAISE(auto client, HttpClient::Make(hdfs_->Timeouts()));
    return std::unique_ptr<SequentialFile>(new HdfsSequentialFile(hdfs_, path, size, std::move(client)));
  }

  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    EMBER_ASSIGN_OR_RAISE(uint64_t size, FileSize(path));
    return std::unique_ptr<RandomAccessFile>(new HdfsRandomAccessFile(hdfs_, path, size));
  }

  // The file is created by the first Flush/Sync/Close (a CREATE with the
  // first chunk of data: no APPEND for files of one chunk); WebHDFS's CREATE
  // makes the parent directories.
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    if (path == "/") return Status::InvalidArgument(hdfs_->Uri(path) + ": cannot write the root directory");
    EMBER_ASSIGN_OR_RAISE(auto client, HttpClient::Make(hdfs_->Timeouts()));
    return std::unique_ptr<WritableFile>(new HdfsWritableFile(hdfs_, path, std::move(client)));
  }

  Result<FileInfo> Stat(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    return hdfs_->Stat(path);
  }

  Result<std::vector<FileInfo>> List(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    EMBER_ASSIGN_OR_RAISE(std::string body, hdfs_->Call(HttpMethod::kGet, path, "LISTSTATUS"));
    auto list = ParseFileStatuses(body);
    if (!list.ok()) return list.status().WithContext(hdfs_->Context(path, "LISTSTATUS"));
    // LISTSTATUS of a file answers the file itself, with an empty name.
    if (list->size() == 1 && (*list)[0].name.empty() && !(*list)[0].is_dir) {
      return Status::IOError(hdfs_->Context(path, "LISTSTATUS") + ": not a directory");
    }
    return list;
  }

  Status CreateDir(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    EMBER_ASSIGN_OR_RAISE(std::string body, hdfs_->Call(HttpMethod::kPut, path, "MKDIRS"));
    return BooleanOk(path, "MKDIRS", body, Status::IOError(hdfs_->Context(path, "MKDIRS") + ": refused"));
  }

  Status Delete(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    EMBER_ASSIGN_OR_RAISE(std::string body, hdfs_->Call(HttpMethod::kDelete, path, "DELETE", "&recursive=false"));
    // false: nothing was there (a non-empty directory is a RemoteException).
    return BooleanOk(path, "DELETE", body, Status::NotFound(hdfs_->Context(path, "DELETE") + ": no such file or directory"));
  }

  Status DeleteRecursively(const std::string& p) override {
    EMBER_ASSIGN_OR_RAISE(std::string path, PathOf(p));
    if (path == "/") return Status::InvalidArgument(hdfs_->Uri(path) + ": refusing to delete the root directory");
    EMBER_ASSIGN_OR_RAISE(std::string body, hdfs_->Call(HttpMethod::kDelete, path, "DELETE", "&recursive=true"));
    return BooleanOk(path, "DELETE", body, Status::OK());  // false: it was not there, which is fine
  }

  // HDFS's plain rename (op=RENAME) refuses an existing destination
  // (answers false).  With renameoptions=OVERWRITE the NameNode runs
  // rename2(src, dst, OVERWRITE) instead: one NameNode transaction that
  // replaces a file at `to`, so a reader sees the old or the new file, never
  // neither and never a part (no delete-then-rename window).
  Status Rename(const std::string& f, const std::string& t) override {
    EMBER_ASSIGN_OR_RAISE(std::string from, PathOf(f));
    EMBER_ASSIGN_OR_RAISE(std::string to, PathOf(t));
    auto r = hdfs_->Call(HttpMethod::kPut, from, "RENAME",
                         "&destination=" + UrlEncode(to, true) + "&renameoptions=OVERWRITE");
    if (!r.ok()) return r.status().WithContext("rename to " + hdfs_->Uri(to));
    return Status::OK();
  }

  std::string scheme() const override { return "hdfs"; }
  std::string Uri(const std::string& path) const override {
    auto p = PathOf(path);
    return hdfs_->Uri(p.ok() ? *p : path);
  }

 private:
  // `p` as an absolute path in this file system: a URI prefix naming it
  // (default_fs, "hdfs://" with no authority, "webhdfs://<http_address>") is
  // stripped; "//" collapsed, a trailing "/" dropped.
  Result<std::string> PathOf(const std::string& p) const {
    std::string rest = p;
    const auto& o = hdfs_->options();
    const std::string webhdfs = "webhdfs://" + o.http_address;
    auto strip = [&rest](const std::string& prefix) {
      if (prefix.empty() || rest.compare(0, prefix.size(), prefix) != 0) return false;
      if (rest.size() > prefix.size() && rest[prefix.size()] != '/') return false;
      rest = rest.substr(prefix.size());
      return true;
    };
    if (rest.find("://") != std::string::npos &&
        !(strip(o.default_fs) || strip(webhdfs) || strip("hdfs://"))) {
      return Status::InvalidArgument(p + " is not in the HDFS file system " + hdfs_->Uri(""));
    }
    if (rest.empty()) rest = "/";
    if (rest[0] != '/') return Status::InvalidArgument("not an absolute HDFS path: " + p);
    std::string out;
    for (char c : rest) {
      if (c == '/' && !out.empty() && out.back() == '/') continue;
      out.push_back(c);
    }
    if (out.size() > 1 && out.back() == '/') out.pop_back();
    return out;
  }

  Result<uint64_t> FileSize(const std::string& path) {
    EMBER_ASSIGN_OR_RAISE(FileInfo info, hdfs_->Stat(path));
    if (info.is_dir) return Status::IOError(hdfs_->Uri(path) + ": is a directory, not a file");
    return info.size;
  }

  Status BooleanOk(const std::string& path, const char* op, const std::string& body, Status if_false) {
    auto b = ParseBoolean(body);
    if (!b.ok()) return b.status().WithContext(hdfs_->Context(path, op));
    return *b ? Status::OK() : if_false;
  }

  const std::shared_ptr<WebHdfs> hdfs_;
};

}  // namespace

std::string ProcessUserName() {
  struct passwd pw;
  struct passwd* found = nullptr;
  char buf[4096];
  if (getpwuid_r(geteuid(), &pw, buf, sizeof(buf), &found) == 0 && found != nullptr) return found->pw_name;
  return "uid" + std::to_string(geteuid());
}

}  // namespace internal

Result<std::shared_ptr<FileSystem>> NewHdfsFileSystem(HdfsOptions options) {
  if (options.http_address.empty() || options.http_address.find('/') != std::string::npos) {
    return Status::InvalidArgument("HdfsOptions.http_address must be \"host:port\"; got \"" +
                                   options.http_address + "\"");
  }
  while (!options.default_fs.empty() && options.default_fs.back() == '/') options.default_fs.pop_back();
  std::string user = options.user.empty() ? internal::ProcessUserName() : options.user;
  auto hdfs = std::make_shared<internal::WebHdfs>(std::move(options), std::move(user));
  return std::shared_ptr<FileSystem>(std::make_shared<internal::HdfsFileSystem>(std::move(hdfs)));
}

}  // namespace ember::fs
