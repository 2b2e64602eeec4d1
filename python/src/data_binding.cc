// ember._ember.ExampleDataset: batches of tf.Example columns from TFRecord
// files (include/ember/dataset.h).  Conversion only; ember/data/ builds the
// numpy / tf.data / torch views on top.
//
//   ds = ExampleDataset.open(uris, resolve_options, schema, batch_size, ...)
//   ds.next() -> None at the end, else [(name, kind, values, bytes_offsets,
//                row_splits, present), ...] in schema order: numpy arrays that
//                own the decoded buffers (no copy); values is float32 / int64 /
//                uint8 (the bytes, concatenated; value j is
//                values[bytes_offsets[j]:bytes_offsets[j+1]]), bytes_offsets
//                is None for numbers.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "bindings.h"
#include "ember/dataset.h"
#include "ember/example.h"
#include "ember/record.h"
#include "ember/fs.h"

namespace ember::python {
namespace {

using example::FeatureColumn;
using example::FeatureKind;

// A 1-D numpy array over `v`'s elements, owned through `owner` (the column).
template <typename T>
nb::object View(std::vector<T>& v, const nb::capsule& owner) {
  static T kEmpty{};
  T* data = v.empty() ? &kEmpty : v.data();
  return nb::cast(nb::ndarray<nb::numpy, T, nb::ndim<1>>(data, {v.size()}, owner));
}

// (name, kind, values, bytes_offsets, row_splits, present) of `column`,
// which moves into a capsule that the arrays share.
nb::tuple ColumnToPython(FeatureColumn column) {
  auto* held = new FeatureColumn(std::move(column));
  nb::capsule owner(held, [](void* p) noexcept { delete static_cast<FeatureColumn*>(p); });
  nb::object values, offsets = nb::none();
  switch (held->kind) {
    case FeatureKind::kFloat:
      values = View(held->floats, owner);
      break;
    case FeatureKind::kInt64:
      values = View(held->ints, owner);
      break;
    case FeatureKind::kBytes:
      values = View(held->bytes_data, owner);
      offsets = View(held->bytes_offsets, owner);
      break;
  }
  return nb::make_tuple(held->name, std::string(example::KindName(held->kind)), values, offsets,
                        View(held->row_splits, owner), View(held->present, owner));
}

using SpecTuple = std::tuple<std::string, std::string, int64_t, int64_t>;  // name, kind, fixed_length, value_bytes

std::vector<example::FeatureSpec> ToSchema(const std::vector<SpecTuple>& specs) {
  std::vector<example::FeatureSpec> schema;
  for (const auto& [name, kind, fixed_length, value_bytes] : specs) {
    schema.push_back({name, ValueOrThrow(example::ParseKind(kind)), fixed_length, value_bytes});
  }
  return schema;
}

std::unique_ptr<record::ExampleDataset> OpenDataset(const std::vector<std::string>& uris,
                                                    const fs::ResolveOptions& resolve,
                                                    const std::vector<SpecTuple>& specs,
                                                    int64_t batch_size, bool drop_remainder, int64_t num_shards,
                                                    int64_t shard_index, int prefetch, const std::string& compression,
                                                    bool skip_corrupt, int decode_threads,
                                                    std::shared_ptr<fs::MappingCache> mapping_cache) {
  record::DatasetOptions options;
  options.mapping_cache = std::move(mapping_cache);
  options.schema = ToSchema(specs);
  options.batch_size = batch_size;
  options.drop_remainder = drop_remainder;
  options.num_shards = num_shards;
  options.shard_index = shard_index;
  options.prefetch = prefetch;
  options.decode_threads = decode_threads;
  options.reader.compression = ValueOrThrow(record::ParseCompression(compression));
  options.reader.skip_corrupt = skip_corrupt;
  // Every path must live on one file system (one dataset reads one place).
  std::shared_ptr<fs::FileSystem> filesystem;
  std::vector<std::string> paths;
  for (const std::string& uri : uris) {
    fs::Resolved r = ValueOrThrow(fs::ResolveFileSystem(uri, resolve));
    if (filesystem != nullptr && r.fs != filesystem) {
      ThrowIfError(Status::InvalidArgument("ExampleDataset: " + uri + " is on another file system than " +
                                           uris.front() + "; read each file system with its own dataset"));
    }
    filesystem = r.fs;
    paths.push_back(std::move(r.path));
  }
  if (filesystem == nullptr) filesystem = fs::LocalFileSystem();
  return ValueOrThrow(record::ExampleDataset::Open(std::move(filesystem), std::move(paths), std::move(options)));
}

// URIs of the files `pattern` names (ember/fs.h GlobUris), for datasets.
std::vector<std::string> GlobUris(const std::string& pattern, const fs::ResolveOptions& resolve, bool recursive) {
  return ValueOrThrow(fs::GlobUris(pattern, resolve, recursive));
}

// What the first `sample` records of `uri` hold, for schema inference:
// ([(name, kind, min_length, max_length, present_rows)], rows read).
std::pair<std::vector<std::tuple<std::string, std::string, int64_t, int64_t, int64_t>>, int64_t> InferSchema(
    const std::string& uri, const fs::ResolveOptions& resolve, const std::string& compression, int64_t sample) {
  fs::Resolved r = ValueOrThrow(fs::ResolveFileSystem(uri, resolve));
  record::ReaderOptions options;
  options.compression = ValueOrThrow(record::ParseCompression(compression));
  auto reader = ValueOrThrow(record::RecordReader::Open(ValueOrThrow(r.fs->NewSequentialFile(r.path)), options));
  example::SchemaInferrer inferrer;
  std::string_view rec;
  while (static_cast<int64_t>(inferrer.num_rows()) < sample && ValueOrThrow(reader->Next(&rec))) {
    Status st = inferrer.Add(rec);
    if (!st.ok()) {
      ThrowIfError(Status(st.code(), reader->uri() + ": the record at byte " +
                                         std::to_string(reader->last_offset()) + ": " + st.message()));
    }
  }
  std::vector<std::tuple<std::string, std::string, int64_t, int64_t, int64_t>> out;
  for (const example::InferredFeature& f : inferrer.Finish()) {
    out.emplace_back(f.name, std::string(example::KindName(f.kind)), f.min_length, f.max_length, f.present_rows);
  }
  return {std::move(out), static_cast<int64_t>(inferrer.num_rows())};
}

// Writes tf.Examples from numpy columns into one TFRecord file.
class ExampleWriter {
 public:
  static std::unique_ptr<ExampleWriter> Open(const std::string& uri, const fs::ResolveOptions& resolve,
                                             const std::string& compression) {
    fs::Resolved r = ValueOrThrow(fs::ResolveFileSystem(uri, resolve));
    record::WriterOptions options;
    options.compression = ValueOrThrow(record::ParseCompression(compression));
    if (options.compression == record::Compression::kAuto) options.compression = record::CompressionFromPath(uri);
    auto file = ValueOrThrow(r.fs->NewWritableFile(r.path));
    auto w = std::make_unique<ExampleWriter>();
    w->writer_ = ValueOrThrow(record::RecordWriter::Open(std::move(file), options));
    return w;
  }

  // Encodes and writes the rows of `columns` (see WriteColumns' binding).
  void Write(const std::vector<example::ColumnView>& columns) {
    encoded_.clear();
    offsets_.clear();
    ThrowIfError(example::EncodeExamples(columns, &encoded_, &offsets_));
    const std::string_view all(encoded_);
    for (size_t i = 0; i + 1 < offsets_.size(); ++i) {
      ThrowIfError(writer_->Write(all.substr(offsets_[i], offsets_[i + 1] - offsets_[i])));
    }
  }

  void Close() { ThrowIfError(writer_->Close()); }
  uint64_t records() const { return writer_->records_written(); }

 private:
  std::unique_ptr<record::RecordWriter> writer_;
  std::string encoded_;
  std::vector<int64_t> offsets_;
};

template <typename T>
using In = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// Python columns (name, kind, values, bytes_offsets or None, row_splits,
// present or None) as views for the encoder.  The arrays (or the converted
// copies nanobind makes of ill-typed ones) are held in `keep` for the call.
struct Kept {
  std::vector<In<float>> f;
  std::vector<In<int64_t>> i;
  std::vector<In<uint8_t>> u;
};
std::vector<example::ColumnView> ToViews(const nb::list& columns, Kept* keep) {
  std::vector<example::ColumnView> views;
  for (nb::handle item : columns) {
    nb::tuple t = nb::cast<nb::tuple>(item);
    if (t.size() != 6) ThrowIfError(Status::InvalidArgument("a column is a 6-tuple"));
    example::ColumnView v;
    v.name = nb::cast<std::string_view>(t[0]);
    v.kind = ValueOrThrow(example::ParseKind(nb::cast<std::string_view>(t[1])));
    switch (v.kind) {
      case FeatureKind::kFloat: {
        const auto& a = keep->f.emplace_back(nb::cast<In<float>>(t[2]));
        v.floats = {a.data(), a.shape(0)};
        break;
      }
      case FeatureKind::kInt64: {
        const auto& a = keep->i.emplace_back(nb::cast<In<int64_t>>(t[2]));
        v.ints = {a.data(), a.shape(0)};
        break;
      }
      case FeatureKind::kBytes: {
        const auto& a = keep->u.emplace_back(nb::cast<In<uint8_t>>(t[2]));
        v.bytes_data = {a.data(), a.shape(0)};
        const auto& o = keep->i.emplace_back(nb::cast<In<int64_t>>(t[3]));
        v.bytes_offsets = {o.data(), o.shape(0)};
        break;
      }
    }
    const auto& splits = keep->i.emplace_back(nb::cast<In<int64_t>>(t[4]));
    v.row_splits = {splits.data(), splits.shape(0)};
    if (!t[5].is_none()) {
      const auto& p = keep->u.emplace_back(nb::cast<In<uint8_t>>(t[5]));
      v.present = {p.data(), p.shape(0)};
    }
    views.push_back(v);
  }
  return views;
}

}  // namespace

void BindDataset(nb::module_& m) {
  m.def("fs_glob", &GlobUris, nb::call_guard<nb::gil_scoped_release>(), nb::arg("pattern"), nb::arg("resolve"),
        nb::arg("recursive") = false,
        "URIs of the files a path, directory or glob names, keeping its scheme (ember/fs.h GlobUris); "
        "`recursive`: a directory's subdirectories too.");
  m.def("infer_example_schema", &InferSchema, nb::call_guard<nb::gil_scoped_release>(), nb::arg("uri"),
        nb::arg("resolve"), nb::arg("compression"), nb::arg("sample"),
        "([(name, kind, min_length, max_length, present_rows)], rows) of a file's first records.");
  nb::class_<fs::MappingCache>(m, "MappingCache",
                               "Mapped files kept from one pass to the next (ember/fs.h MappingCache).")
      .def(nb::init<uint64_t>(), nb::arg("max_bytes") = uint64_t{4} << 30)
      .def_prop_ro("mapped_bytes", &fs::MappingCache::mapped_bytes)
      .def_prop_ro("hits", &fs::MappingCache::hits);
  nb::class_<record::ExampleDataset>(m, "ExampleDataset",
                                     "Batches of tf.Example columns from TFRecord files (ember/dataset.h).")
      .def_static("open", &OpenDataset, nb::call_guard<nb::gil_scoped_release>(),  // may reach a NameNode
                  nb::arg("uris"), nb::arg("resolve"), nb::arg("schema"), nb::arg("batch_size"),
                  nb::arg("drop_remainder"), nb::arg("num_shards"), nb::arg("shard_index"), nb::arg("prefetch"),
                  nb::arg("compression"), nb::arg("skip_corrupt"),
                  nb::arg("decode_threads") = record::DatasetOptions{}.decode_threads,
                  nb::arg("mapping_cache").none() = nb::none())
      .def("next",
           [](record::ExampleDataset& self) -> nb::object {
             std::optional<std::vector<FeatureColumn>> batch;
             {
               nb::gil_scoped_release release;
               batch = ValueOrThrow(self.Next());
             }
             if (!batch.has_value()) return nb::none();
             nb::list out;
             for (FeatureColumn& c : *batch) out.append(ColumnToPython(std::move(c)));
             return out;
           })
      .def("close", &record::ExampleDataset::Close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("stats", [](const record::ExampleDataset& self) {
        record::DatasetStats s = self.stats();
        nb::dict d;
        d["files"] = s.files;
        d["records"] = s.records;
        d["rows"] = s.rows;
        d["skipped_records"] = s.skipped_records;
        return d;
      });
  nb::class_<ExampleWriter>(m, "ExampleWriter", "tf.Examples from numpy columns into one TFRecord file.")
      .def_static("open", &ExampleWriter::Open, nb::call_guard<nb::gil_scoped_release>(), nb::arg("uri"),
                  nb::arg("resolve"), nb::arg("compression"))
      .def("write",
           [](ExampleWriter& self, const nb::list& columns) {
             Kept keep;  // released (with the GIL held) after the encoder is done
             std::vector<example::ColumnView> views = ToViews(columns, &keep);
             nb::gil_scoped_release release;
             self.Write(views);
           },
           nb::arg("columns"))
      .def("close", &ExampleWriter::Close, nb::call_guard<nb::gil_scoped_release>())
      .def_prop_ro("records", &ExampleWriter::records);
}

}  // namespace ember::python
