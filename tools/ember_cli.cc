// ember: command-line tool.
//
//   ember records count  [options] <path>...   records per file and in total
//   ember records head   [options] [-n N] <path>...   the first N records, as tf.Examples
//   ember records verify [options] <path>...   check every CRC; counts, first bad offset
//   ember records schema [options] [-n N] <path>...   features inferred from N records
//
// Options: --compression=auto|none|gzip|zlib (default: from each file's
// name), --default-fs=URI (where paths without a scheme live, e.g.
// hdfs://nn:8020; default local), --namenode-http=[AUTHORITY=]HOST:PORT
// (the WebHDFS address of the NameNode at hdfs://AUTHORITY, Hadoop's
// dfs.namenode.http-address; without AUTHORITY, of every hdfs:// NameNode
// named by --default-fs or a path; default: its host, port 9870).  The
// Python entry point `ember` (python/ember/_cli.py) fills both from
// $HADOOP_CONF_DIR.  A path may be a file, a directory (its files, skipping
// _* and .*) or a glob pattern; local or hdfs:// alike.
// Exit status 0 on success, 1 on a bad file, 2 on bad usage; errors go to
// stderr.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "ember/example.h"
#include "ember/fs.h"
#include "ember/record.h"

namespace ember::cli {
namespace {

struct Options {
  record::Compression compression = record::Compression::kAuto;
  fs::ResolveOptions resolve;
  int64_t n = -1;  // head: 5; schema: 1000
  std::vector<std::string> paths;
};

// The one place the CLI maps a URI to a file system, by the core's rule
// (fs::QualifyPath): a relative path is relative to the working directory
// when paths without a scheme are local, to the user's home otherwise.
Result<fs::Resolved> OpenFs(const std::string& uri, const Options& o) {
  if (uri.empty() || uri[0] == '/') return fs::ResolveFileSystem(uri, o.resolve);
  char cwd[4096];
  const std::string working_dir = getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "";
  EMBER_ASSIGN_OR_RAISE(std::string qualified, fs::QualifyPath(uri, o.resolve, working_dir));
  return fs::ResolveFileSystem(qualified, o.resolve);
}

// Expands each argument (file, directory or pattern) to files.
Result<std::vector<std::pair<fs::Resolved, std::string>>> Expand(const Options& o) {
  std::vector<std::pair<fs::Resolved, std::string>> out;
  for (const auto& arg : o.paths) {
    EMBER_ASSIGN_OR_RAISE(fs::Resolved r, OpenFs(arg, o));
    EMBER_ASSIGN_OR_RAISE(std::vector<std::string> files, fs::Glob(*r.fs, r.path));
    for (auto& f : files) out.emplace_back(fs::Resolved{r.fs, f, r.root}, r.Uri(f));
  }
  return out;
}

Result<std::unique_ptr<record::RecordReader>> OpenReader(const fs::Resolved& r, const Options& o,
                                                         bool skip_corrupt = false) {
  EMBER_ASSIGN_OR_RAISE(auto file, r.fs->NewSequentialFile(r.path));
  record::ReaderOptions ro;
  ro.compression = o.compression;
  ro.skip_corrupt = skip_corrupt;
  if (ro.compression == record::Compression::kAuto) ro.compression = record::CompressionFromPath(r.path);
  return record::RecordReader::Open(std::move(file), ro);
}

int Fail(const Status& st) {
  std::cerr << "ember: " << st.ToString() << "\n";
  return 1;
}

int Count(const Options& o) {
  auto files = Expand(o);
  if (!files.ok()) return Fail(files.status());
  uint64_t total = 0;
  for (const auto& [r, uri] : *files) {
    auto reader = OpenReader(r, o);
    if (!reader.ok()) return Fail(reader.status());
    uint64_t n = 0;
    std::string_view rec;
    for (;;) {
      auto more = (*reader)->Next(&rec);
      if (!more.ok()) return Fail(more.status());
      if (!*more) break;
      ++n;
    }
    std::cout << uri << "\t" << n << "\n";
    total += n;
  }
  if (files->size() > 1) std::cout << "total\t" << total << "\n";
  return 0;
}

std::string Printable(std::string_view b, size_t max = 40) {
  std::string s;
  for (size_t i = 0; i < b.size() && i < max; ++i) {
    unsigned char c = static_cast<unsigned char>(b[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '"') {
      s.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      s += buf;
    }
  }
  if (b.size() > max) s += "...";
  return "\"" + s + "\"";
}

// One Example as text: "  name: kind[n] = v, v, ..." (first 8 values).
void PrintExample(std::string_view rec) {
  example::SchemaInferrer inf;
  Status st = inf.Add(rec);
  std::vector<example::FeatureSpec> schema;
  if (st.ok()) {
    for (const auto& f : inf.Finish()) schema.push_back({f.name, f.kind});
  }
  std::vector<std::string_view> one = {rec};
  auto cols = st.ok() ? example::DecodeExamples(one, schema) : Result<std::vector<example::FeatureColumn>>(st);
  if (!cols.ok()) {
    std::cout << "  (not a tf.Example, " << rec.size() << " bytes: " << Printable(rec) << ")\n";
    return;
  }
  if (cols->empty()) std::cout << "  (no features)\n";
  for (const auto& c : *cols) {
    size_t n = c.num_values();
    std::cout << "  " << c.name << ": " << example::KindName(c.kind) << "[" << n << "] =";
    for (size_t j = 0; j < n && j < 8; ++j) {
      std::cout << (j ? ", " : " ");
      switch (c.kind) {
        case example::FeatureKind::kFloat: std::cout << c.floats[j]; break;
        case example::FeatureKind::kInt64: std::cout << c.ints[j]; break;
        case example::FeatureKind::kBytes:
          std::cout << Printable(std::string_view(reinterpret_cast<const char*>(c.bytes_data.data()) + c.bytes_offsets[j],
                                                  static_cast<size_t>(c.bytes_offsets[j + 1] - c.bytes_offsets[j])));
          break;
      }
    }
    if (n > 8) std::cout << ", ...";
    std::cout << "\n";
  }
}

int Head(const Options& o) {
  auto files = Expand(o);
  if (!files.ok()) return Fail(files.status());
  int64_t left = o.n < 0 ? 5 : o.n;
  for (const auto& [r, uri] : *files) {
    if (left == 0) break;
    auto reader = OpenReader(r, o);
    if (!reader.ok()) return Fail(reader.status());
    std::string_view rec;
    for (int64_t i = 0; left > 0; ++i, --left) {
      auto more = (*reader)->Next(&rec);
      if (!more.ok()) return Fail(more.status());
      if (!*more) break;
      std::cout << uri << " record " << i << " (offset " << (*reader)->last_offset() << ", " << rec.size()
                << " bytes)\n";
      PrintExample(rec);
    }
  }
  return 0;
}

int Verify(const Options& o) {
  auto files = Expand(o);
  if (!files.ok()) return Fail(files.status());
  int rc = 0;
  for (const auto& [r, uri] : *files) {
    // Strict pass: the first error, with its offset.
    auto reader = OpenReader(r, o);
    if (!reader.ok()) return Fail(reader.status());
    std::string_view rec;
    Status first;
    uint64_t n = 0, bytes = 0;
    for (;;) {
      auto more = (*reader)->Next(&rec);
      if (!more.ok()) {
        first = more.status();
        break;
      }
      if (!*more) break;
      ++n;
      bytes += rec.size();
    }
    if (first.ok()) {
      std::cout << "ok\t" << uri << "\t" << n << " records\t" << bytes << " data bytes\n";
      continue;
    }
    rc = 1;
    // Second pass skipping what is corrupt, to count the damage.
    auto skip = OpenReader(r, o, /*skip_corrupt=*/true);
    if (!skip.ok()) return Fail(skip.status());
    for (;;) {
      auto more = (*skip)->Next(&rec);
      if (!more.ok() || !*more) break;
    }
    const auto& s = (*skip)->stats();
    std::cout << "CORRUPT\t" << uri << "\t" << s.records << " good records\t" << s.skipped_records
              << " corrupt regions\t" << s.skipped_bytes << " bytes skipped\n";
    std::cerr << "ember: first error: " << first.ToString() << "\n";
  }
  return rc;
}

int Schema(const Options& o) {
  auto files = Expand(o);
  if (!files.ok()) return Fail(files.status());
  int64_t left = o.n < 0 ? 1000 : o.n;
  example::SchemaInferrer inf;
  for (const auto& [r, uri] : *files) {
    if (left == 0) break;
    auto reader = OpenReader(r, o);
    if (!reader.ok()) return Fail(reader.status());
    std::string_view rec;
    for (; left > 0; --left) {
      auto more = (*reader)->Next(&rec);
      if (!more.ok()) return Fail(more.status());
      if (!*more) break;
      Status st = inf.Add(rec);
      if (!st.ok()) return Fail(st.WithContext(uri + " record at offset " + std::to_string((*reader)->last_offset())));
    }
  }
  const int64_t rows = static_cast<int64_t>(inf.num_rows());
  std::cout << "# " << rows << " records sampled\n";
  std::cout << "name\tkind\tshape\tmin_len\tmax_len\tpresent\n";
  for (const auto& f : inf.Finish()) {
    std::string shape;
    if (f.min_length == f.max_length) {
      shape = f.min_length == 1 ? "scalar" : "fixed[" + std::to_string(f.min_length) + "]";
    } else {
      shape = "list";
    }
    if (f.present_rows < rows) shape += " nullable";
    std::cout << f.name << "\t" << example::KindName(f.kind) << "\t" << shape << "\t" << f.min_length << "\t"
              << f.max_length << "\t" << f.present_rows << "/" << rows << "\n";
  }
  return 0;
}

int Usage() {
  std::cerr << "usage: ember records count|head|verify|schema [--compression=auto|none|gzip|zlib]\n"
               "                     [--default-fs=URI] [--namenode-http=[AUTHORITY=]HOST:PORT] [-n N] <path>...\n";
  return 2;
}

// The authority of an hdfs:// URI ("nn:8020" of "hdfs://nn:8020/a"), else "".
std::string HdfsAuthority(const std::string& uri) {
  constexpr std::string_view kScheme = "hdfs://";
  if (uri.rfind(kScheme, 0) != 0) return "";
  return uri.substr(kScheme.size(), uri.find('/', kScheme.size()) - kScheme.size());
}

}  // namespace

int Main(int argc, char** argv) {
  if (argc < 3 || std::strcmp(argv[1], "records") != 0) return Usage();
  const std::string cmd = argv[2];
  Options o;
  std::string any_namenode_http;  // --namenode-http=HOST:PORT, for every NameNode
  for (int i = 3; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-n" && i + 1 < argc) {
      char* end = nullptr;
      o.n = std::strtoll(argv[++i], &end, 10);
      if (*end != '\0' || o.n < 0) return Usage();
    } else if (a.rfind("--compression=", 0) == 0) {
      auto c = record::ParseCompression(a.substr(14));
      if (!c.ok()) return Fail(c.status()) + 1;
      o.compression = *c;
    } else if (a.rfind("--default-fs=", 0) == 0) {
      o.resolve.default_fs = a.substr(13);
    } else if (a.rfind("--namenode-http=", 0) == 0) {
      const std::string v = a.substr(16);
      const size_t eq = v.find('=');
      if (v.empty() || eq == 0 || eq + 1 == v.size()) return Usage();
      if (eq == std::string::npos) {
        any_namenode_http = v;
      } else {
        o.resolve.hdfs_http_addresses[v.substr(0, eq)] = v.substr(eq + 1);
      }
    } else if (a == "-h" || a == "--help") {
      return Usage();
    } else if (!a.empty() && a[0] == '-') {
      std::cerr << "ember: unknown option " << a << "\n";
      return Usage();
    } else {
      o.paths.push_back(a);
    }
  }
  if (o.paths.empty()) return Usage();
  if (!any_namenode_http.empty()) {
    std::vector<std::string> uris = o.paths;
    uris.push_back(o.resolve.default_fs);
    for (const auto& uri : uris) {
      const std::string authority = HdfsAuthority(uri);
      if (!authority.empty()) o.resolve.hdfs_http_addresses.emplace(authority, any_namenode_http);
    }
  }
  if (cmd == "count") return Count(o);
  if (cmd == "head") return Head(o);
  if (cmd == "verify") return Verify(o);
  if (cmd == "schema") return Schema(o);
  return Usage();
}

}  // namespace ember::cli

int main(int argc, char** argv) { return ember::cli::Main(argc, argv); }
