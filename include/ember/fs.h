// FileSystem: where Ember's core reads and writes files (LevelDB's Env is
// the model).  Readers and writers in the core (TFRecords, TensorBoard
// events, checkpoints) take a FileSystem or one of its file objects, never a
// path they open themselves, so tests swap in the in-memory or the
// fault-injecting one, and an `hdfs://` path needs nothing but its URI.
//
// Back ends: the local file system, HDFS over WebHDFS (HTTP; no libhdfs,
// no JVM, no CLASSPATH), and an in-memory one for tests.  ResolveFileSystem
// picks one from a path or URI.
//
// Errors name the file (its full URI) and, for reads, the byte offset.
// NotFound for a missing file or directory; IOError for what the OS or the
// server refused; Unavailable when a server cannot be reached.
//
// Thread safety: a FileSystem is safe for concurrent use from many threads;
// a file object is used by one thread at a time.
#pragma once

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "ember/deadline.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember {

namespace fs {

// Reads a file from its start (or from an offset given at open) to its end.
class SequentialFile {
 public:
  virtual ~SequentialFile() = default;
  // Reads up to buffer.size() bytes into `buffer`; returns how many, fewer
  // only at the end of the file, 0 once at the end.
  virtual Result<size_t> Read(std::span<uint8_t> buffer) = 0;
  // Skips `n` bytes (past the end: the next Read returns 0).
  virtual Status Skip(uint64_t n) = 0;
  // The file's URI as opened ("/data/x", "hdfs://nn:8020/data/x"), for errors.
  virtual const std::string& uri() const = 0;
};

// Reads at any offset.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  // Reads up to buffer.size() bytes at `offset`; returns how many, fewer
  // only at the end of the file.  Safe to call from several threads at once.
  virtual Result<size_t> ReadAt(uint64_t offset, std::span<uint8_t> buffer) const = 0;
  virtual Result<uint64_t> Size() const = 0;
  virtual const std::string& uri() const = 0;
};

// Writes a new file.  Bytes may be buffered until Flush, Sync or Close.
// A file that was not Close()d successfully may be missing, empty or hold
// any prefix of what was appended: writers that need all-or-nothing write a
// temporary name and Rename it (see AtomicWriteFile).
class WritableFile {
 public:
  virtual ~WritableFile() = default;  // closes, dropping the status; call Close()
  virtual Status Append(std::span<const uint8_t> data) = 0;
  // Hands buffered bytes to the OS / the server (readable by others after).
  virtual Status Flush() = 0;
  // Flush, then make the bytes durable (fsync; HDFS: the DataNodes hold them).
  virtual Status Sync() = 0;
  // Flushes and closes.  Idempotent; Append after Close is InvalidArgument.
  virtual Status Close() = 0;
  virtual const std::string& uri() const = 0;
};

// A whole file's bytes in memory, read-only: a mapping of a local file, so
// readers take records in place instead of copying them out of the OS.
class ReadOnlyMemoryRegion {
 public:
  virtual ~ReadOnlyMemoryRegion() = default;
  // Valid while this object lives; empty for an empty file.
  virtual std::span<const uint8_t> data() const = 0;
  virtual const std::string& uri() const = 0;
  // A hint that [offset, offset + n) is read soon: a mapped file maps those
  // pages now, on the calling thread, so whoever touches them first takes
  // no page faults.  Does nothing where there is nothing to prepare.
  virtual void WillRead(size_t offset, size_t n) const {
    (void)offset;
    (void)n;
  }
};

struct FileInfo {
  std::string name;  // the last path component
  uint64_t size = 0;
  bool is_dir = false;
  int64_t mtime_ms = 0;  // modification time, ms since the epoch
};

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Paths passed to a FileSystem are absolute within it ("/data/x"); a URI
  // prefix is accepted if it names this file system.
  virtual Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) = 0;
  virtual Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) = 0;
  // Creates or truncates `path`; its parent directories are created.
  virtual Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) = 0;
  // The whole of `path` as one region, or nullptr when this file system
  // cannot map files (HDFS; the fault-injecting one, whose faults live in
  // its streams): then read it with NewSequentialFile.  The local file
  // system mmaps; the in-memory one snapshots.  Caution: a local file
  // truncated while mapped makes reading its lost part fault (SIGBUS), so
  // map only inputs that are not rewritten in place.
  virtual Result<std::shared_ptr<const ReadOnlyMemoryRegion>> MapReadOnly(const std::string& path) {
    return std::shared_ptr<const ReadOnlyMemoryRegion>();
  }

  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // The entries of directory `path`, sorted by name.  NotFound if missing.
  virtual Result<std::vector<FileInfo>> List(const std::string& path) = 0;
  // Creates `path` and missing parents; OK if it exists as a directory.
  virtual Status CreateDir(const std::string& path) = 0;
  // Deletes a file or an empty directory; NotFound if missing.
  virtual Status Delete(const std::string& path) = 0;
  // Deletes a file or a directory with everything under it; OK if missing.
  virtual Status DeleteRecursively(const std::string& path) = 0;
  // Renames `from` to `to`, replacing a file at `to`.  Atomic on the local
  // file system and on HDFS (a reader sees the old or the new file, never a
  // part); the in-memory one too.  A directory is renamed with everything
  // under it in the same one step (a reader lists all of it under one name
  // or the other); `to` must then be missing or an empty directory
  // (IOError otherwise), as rename(2) and HDFS's rename require.
  virtual Status Rename(const std::string& from, const std::string& to) = 0;

  // "file", "hdfs", "mem": for messages.
  virtual std::string scheme() const = 0;
  // The URI of `path` in this file system ("hdfs://nn:8020/x"), for messages.
  virtual std::string Uri(const std::string& path) const = 0;
};

// Mapped files kept between passes over the same files (a dataset's
// epochs): a pass that finds its file here maps nothing again, and the pages
// the last pass touched are still in the page tables, so the kernel's
// mapping work is paid once (the read went 1.26x as fast; docs/benchmarks.md,
// issue 8).  An entry is reused only while Stat() gives the size and
// modification time it was mapped with; otherwise the file is mapped anew.
// Files are kept until `max_bytes` are mapped; past that a file is mapped
// for its caller alone (no eviction: a pass over more files than fit would
// evict each before its next use, where keeping the first ones gives those
// a hit every pass).  A region handed out stays valid for as long as its
// holder keeps it.  Thread-safe.
//
// Kept mappings count in the process's resident size (RSS) as far as their
// pages were read, between passes too: a memory monitor that counts RSS
// (YARN's pmem check) sees them, though the kernel can reclaim those pages
// as any page cache.  They also hold their files: a file deleted while kept
// keeps its disk space until the cache lets go of it (at the next Map of a
// changed file, or with the cache).
class MappingCache {
 public:
  explicit MappingCache(uint64_t max_bytes = uint64_t{4} << 30) : max_bytes_(max_bytes) {}

  // `path` of `fs` mapped (FileSystem::MapReadOnly), or nullptr where `fs`
  // does not map files.
  Result<std::shared_ptr<const ReadOnlyMemoryRegion>> Map(FileSystem& fs, const std::string& path);

  uint64_t mapped_bytes() const;
  uint64_t hits() const;  // Map calls that found a valid entry

 private:
  struct Entry {
    std::string key;  // scheme + path
    FileInfo info;    // when mapped
    uint64_t bytes;   // the region's
    std::shared_ptr<const ReadOnlyMemoryRegion> region;
  };
  const uint64_t max_bytes_;
  mutable std::mutex mu_;
  std::list<Entry> entries_;
  uint64_t bytes_ = 0;
  uint64_t hits_ = 0;
  std::set<std::string> unmapped_schemes_;  // file systems whose MapReadOnly gave nullptr
};

// The local file system (POSIX).  One shared instance.
std::shared_ptr<FileSystem> LocalFileSystem();

// A new, empty in-memory file system (tests).  Files live as long as it does.
std::shared_ptr<FileSystem> NewMemoryFileSystem();

// HDFS through its WebHDFS REST API (libcurl).  Value type for options.
struct HdfsOptions {
  // The NameNode's HTTP address, "host:port" (dfs.namenode.http-address).
  std::string http_address;
  // What `hdfs://host:port` URIs name, "hdfs://host:port" (fs.defaultFS);
  // used for messages and to accept such URIs.
  std::string default_fs;
  std::string user;  // user.name for HDFS's simple authentication
  Duration connect_timeout{30000};  // one TCP connect to the NameNode or a DataNode
  Duration io_timeout{120000};      // one request making no progress
  size_t read_chunk_bytes = 8 << 20;   // bytes per ranged OPEN request
  size_t write_chunk_bytes = 8 << 20;  // bytes buffered before a CREATE/APPEND
};
Result<std::shared_ptr<FileSystem>> NewHdfsFileSystem(HdfsOptions options);

// How ResolveFileSystem maps URIs to file systems.  Value type.
struct ResolveOptions {
  // fs.defaultFS of the Spark / Hadoop configuration: where a path with no
  // scheme lives ("file:///" or "" for local, "hdfs://nn:8020").
  std::string default_fs;
  // NameNode HTTP addresses by NameNode URI authority ("nn:8020" ->
  // "nn:9870"), from dfs.namenode.http-address; when an `hdfs://` authority
  // is missing here, its host with port 9870 (Hadoop 3's default).
  std::map<std::string, std::string> hdfs_http_addresses;
  std::string hdfs_user;  // empty: the process's user name
  Duration connect_timeout{30000};
  Duration io_timeout{120000};
};

// The ResolveOptions of a job whose fs.defaultFS is `default_fs` and whose
// NameNode serves WebHDFS at `hdfs_http_address` ("host:port", Hadoop's
// dfs.namenode.http-address; empty for the default above): the address is
// filed under default_fs's URI authority ("nn:8020" of "hdfs://nn:8020/"),
// where ResolveFileSystem looks it up for that NameNode's hdfs:// URIs and
// for hdfs:///x.  Ignored when default_fs has no authority.  The other
// fields keep their defaults.
ResolveOptions JobResolveOptions(const std::string& default_fs, const std::string& hdfs_http_address);

// Resolves `uri` ("/a/b", "file:///a/b", "hdfs://nn:8020/a/b", "hdfs:///a/b",
// "webhdfs://nn:9870/a/b", "mem://..." is not resolvable) to its file system
// and the path within it.  The one rule of where a path lives: a URI with a
// scheme is kept as it is, whatever default_fs says ("file:///a" is local
// where default_fs is hdfs://); a path with no scheme lives in default_fs.
// InvalidArgument for a relative path or an unknown scheme.
struct Resolved {
  std::shared_ptr<FileSystem> fs;
  std::string path;
  // How URIs of this file system begin: "file://", "hdfs://nn:8020",
  // "webhdfs://nn:9870"; "" for a path with no scheme on a local default_fs.
  std::string root;
  // The URI of `p`, another path of `fs`, that resolves back to `fs` under
  // these options as `uri` did: a file:// URI's neighbours stay file://.
  std::string Uri(const std::string& p) const { return root + p; }
};
Result<Resolved> ResolveFileSystem(const std::string& uri, const ResolveOptions& options);

// The fully qualified URI of `path`, by the same rule (TFoS's hdfs_path,
// Hadoop's Path.makeQualified): a URI with a scheme is kept as it is; an
// absolute path is put on default_fs ("/x" is "file:///x" on a local one,
// "hdfs://nn:8020/x" on HDFS); a relative path is resolved against
// `working_dir` (absolute, normalized: "a/../b" is "<working_dir>/b") on a
// local default_fs and against the user's home, /user/<hdfs_user or the
// process's user>, on any other.  InvalidArgument for an empty path, a
// default_fs that is not a URI, or a relative path with no working_dir.
Result<std::string> QualifyPath(const std::string& path, const ResolveOptions& options,
                                const std::string& working_dir);

// The URIs of the files `pattern` (a path or URI with Glob's wildcards, or a
// directory) names, sorted.  Each keeps the pattern's scheme
// (Resolved::Uri), so it names the same file under `options` again.
// InvalidArgument as ResolveFileSystem; NotFound when nothing matches.
// `recursive`: as Glob's.
Result<std::vector<std::string>> GlobUris(const std::string& pattern, const ResolveOptions& options,
                                          bool recursive = false);

// Helpers over any FileSystem.

// Paths matching `pattern`, sorted: `*`, `?` and `[...]` in any component
// (fnmatch(3) rules per component); a pattern without them is returned as
// is if it exists.  A directory pattern lists the directory's files
// (skipping names starting with "_" or ".", as Spark's outputs have
// _SUCCESS).  With `recursive`, a directory lists the files of its visible
// subdirectories too, at any depth (a table's Hive-style partition
// directories, "/t/date=2026-11-27/part-0").  NotFound naming the pattern
// when nothing matches.
Result<std::vector<std::string>> Glob(FileSystem& fs, const std::string& pattern, bool recursive = false);

// Reads a whole file.
Result<std::string> ReadFile(FileSystem& fs, const std::string& path);

// Writes `data` to `path` all-or-nothing: a temporary name in the same
// directory, Sync, Close, then Rename.  On failure the temporary is deleted
// and `path` is unchanged.
Status AtomicWriteFile(FileSystem& fs, const std::string& path, std::span<const uint8_t> data);

}  // namespace fs
}  // namespace ember
