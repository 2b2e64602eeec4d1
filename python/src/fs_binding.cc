// ember._ember's file-system functions (include/ember/fs.h) and ResolveOptions:
// every path is a URI resolved by the core (local, file://, hdfs://, webhdfs://).
// Conversion only; the GIL is released around every call (HDFS calls are HTTP).
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <string>

#include "bindings.h"
#include "ember/fs.h"

namespace ember::python {
namespace {

fs::Resolved Resolve(const std::string& uri, const fs::ResolveOptions& options) {
  return ValueOrThrow(fs::ResolveFileSystem(uri, options));
}

}  // namespace

void BindFileSystem(nb::module_& m) {
  nb::class_<fs::ResolveOptions>(m, "ResolveOptions", "How URIs map to file systems (ember/fs.h).")
      .def(nb::init<>())
      .def_rw("default_fs", &fs::ResolveOptions::default_fs)
      .def_rw("hdfs_http_addresses", &fs::ResolveOptions::hdfs_http_addresses)
      .def_rw("hdfs_user", &fs::ResolveOptions::hdfs_user)
      .def_prop_rw(
          "connect_timeout", [](const fs::ResolveOptions& o) { return DurationToSeconds(o.connect_timeout); },
          [](fs::ResolveOptions& o, double s) { o.connect_timeout = SecondsToDuration(s); })
      .def_prop_rw(
          "io_timeout", [](const fs::ResolveOptions& o) { return DurationToSeconds(o.io_timeout); },
          [](fs::ResolveOptions& o, double s) { o.io_timeout = SecondsToDuration(s); });

  m.def("fs_job_resolve_options", &fs::JobResolveOptions, nb::arg("default_fs"), nb::arg("hdfs_http_address"),
        "ResolveOptions for fs.defaultFS `default_fs` with the NameNode's WebHDFS `host:port` filed "
        "under its authority (ember/fs.h JobResolveOptions); \"\" for the default port 9870.");
  m.def(
      "fs_qualify",
      [](const std::string& path, const fs::ResolveOptions& options, const std::string& working_dir) {
        return ValueOrThrow(fs::QualifyPath(path, options, working_dir));
      },
      nb::arg("path"), nb::arg("resolve"), nb::arg("working_dir"),
      "The fully qualified URI of `path` (ember/fs.h QualifyPath): a URI with a scheme as it is, "
      "a path on resolve.default_fs.");
  m.def(
      "fs_rename",
      [](const std::string& from, const std::string& to, const fs::ResolveOptions& options) {
        fs::Resolved a = Resolve(from, options);
        fs::Resolved b = Resolve(to, options);
        if (a.fs != b.fs) ThrowIfError(Status::InvalidArgument("rename " + from + " to " + to + ": two file systems"));
        ThrowIfError(a.fs->Rename(a.path, b.path));
      },
      nb::call_guard<nb::gil_scoped_release>(), nb::arg("src"), nb::arg("dst"), nb::arg("resolve"));
  m.def(
      "fs_delete_recursively",
      [](const std::string& uri, const fs::ResolveOptions& options) {
        fs::Resolved r = Resolve(uri, options);
        ThrowIfError(r.fs->DeleteRecursively(r.path));
      },
      nb::call_guard<nb::gil_scoped_release>(), nb::arg("uri"), nb::arg("resolve"));
  m.def(
      "fs_create_dir",
      [](const std::string& uri, const fs::ResolveOptions& options) {
        fs::Resolved r = Resolve(uri, options);
        ThrowIfError(r.fs->CreateDir(r.path));
      },
      nb::call_guard<nb::gil_scoped_release>(), nb::arg("uri"), nb::arg("resolve"));
  m.def(
      "fs_write_file",
      [](const std::string& uri, nb::bytes data, const fs::ResolveOptions& options) {
        std::string bytes(data.c_str(), data.size());
        nb::gil_scoped_release release;
        fs::Resolved r = Resolve(uri, options);
        ThrowIfError(fs::AtomicWriteFile(
            *r.fs, r.path, {reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()}));
      },
      nb::arg("uri"), nb::arg("data"), nb::arg("resolve"), "Writes a whole file all-or-nothing.");
  m.def(
      "fs_read_file",
      [](const std::string& uri, const fs::ResolveOptions& options) {
        std::string data;
        {
          nb::gil_scoped_release release;
          fs::Resolved r = Resolve(uri, options);
          data = ValueOrThrow(fs::ReadFile(*r.fs, r.path));
        }
        return nb::bytes(data.data(), data.size());
      },
      nb::arg("uri"), nb::arg("resolve"));
  nb::class_<fs::FileInfo>(m, "FileInfo", "What Stat says of a file or directory (ember/fs.h).")
      .def_ro("name", &fs::FileInfo::name)
      .def_ro("size", &fs::FileInfo::size)
      .def_ro("is_dir", &fs::FileInfo::is_dir)
      .def_ro("mtime_ms", &fs::FileInfo::mtime_ms);
  // A file read at any offset (Arrow's Parquet reader reads footers and column chunks so).
  nb::class_<fs::RandomAccessFile>(m, "RandomAccessFile", "A file read at any offset (ember/fs.h).")
      .def_prop_ro("uri", &fs::RandomAccessFile::uri)
      .def_prop_ro("size", [](const fs::RandomAccessFile& f) {
        nb::gil_scoped_release release;
        return ValueOrThrow(f.Size());
      })
      .def(
          "read_at",
          [](const fs::RandomAccessFile& f, uint64_t offset, size_t n) {
            std::string data(n, '\0');
            size_t got = 0;
            {
              nb::gil_scoped_release release;
              got = ValueOrThrow(f.ReadAt(offset, {reinterpret_cast<uint8_t*>(data.data()), n}));
            }
            return nb::bytes(data.data(), got);
          },
          nb::arg("offset"), nb::arg("n"), "Up to `n` bytes at `offset` (fewer only at the end of the file).");
  m.def(
      "fs_open_random_access",
      [](const std::string& uri, const fs::ResolveOptions& options) {
        fs::Resolved r = Resolve(uri, options);
        return ValueOrThrow(r.fs->NewRandomAccessFile(r.path));
      },
      nb::call_guard<nb::gil_scoped_release>(), nb::arg("uri"), nb::arg("resolve"),
      "A RandomAccessFile of `uri`; NotFound if missing.");
  m.def(
      "fs_stat",
      [](const std::string& uri, const fs::ResolveOptions& options) {
        fs::Resolved r = Resolve(uri, options);
        return ValueOrThrow(r.fs->Stat(r.path));
      },
      nb::call_guard<nb::gil_scoped_release>(), nb::arg("uri"), nb::arg("resolve"),
      "FileInfo of `uri`; NotFound if missing.");
  m.def(
      "fs_list",
      [](const std::string& uri, const fs::ResolveOptions& options) {
        fs::Resolved r = Resolve(uri, options);
        std::vector<std::string> names;
        for (const fs::FileInfo& info : ValueOrThrow(r.fs->List(r.path))) names.push_back(info.name);
        return names;
      },
      nb::call_guard<nb::gil_scoped_release>(), nb::arg("uri"), nb::arg("resolve"),
      "Names in directory `uri`, sorted.");
}

}  // namespace ember::python
