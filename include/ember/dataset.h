// ExampleDataset: batches of tf.Example columns read from TFRecord files,
// what a node's input pipeline pulls (ember.data.tfrecord_dataset in Python,
// or a C++ trainer directly).  Files are read one after another through a
// FileSystem (local or HDFS alike); each batch is decoded straight into
// columns (ember/example.h) on background threads, up to `prefetch` batches
// ahead, so the caller's thread only takes finished batches.
//
// Errors name the file's URI and the byte offset of the record at fault
// (and the feature, for a record that does not match the schema).
//
// Thread safety: one thread calls Next() at a time; the decoding threads are
// internal and stopped by Close() or the destructor.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/example.h"
#include "ember/fs.h"
#include "ember/record.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::record {

struct DatasetOptions {
  std::vector<example::FeatureSpec> schema;
  int64_t batch_size = 128;
  // Drop a last batch smaller than batch_size (synchronous training needs
  // the same batch everywhere).
  bool drop_remainder = false;
  // Keeps records i ≡ shard_index (mod num_shards), counting over the whole
  // sequence of files: the record-level sharding of tf.data's
  // AutoShardPolicy.DATA, for fewer files than nodes.  1 keeps every record.
  int64_t num_shards = 1;
  int64_t shard_index = 0;
  // Decoded batches kept ready ahead of Next(); 0 decodes in Next().
  int prefetch = 2;
  // Threads decoding batches side by side (files are still read in order,
  // one batch at a time); batches come out in file order whatever the
  // count.  Unused with prefetch 0.
  int decode_threads = 2;
  // Read uncompressed files in place where the file system maps them
  // (FileSystem::MapReadOnly: local files), else as streams.  Mapped input
  // must not be truncated while it is read (see MapReadOnly).
  bool map_files = true;
  // Mappings kept from one pass to the next (a dataset per epoch over the
  // same files shares one); null maps each file anew.
  std::shared_ptr<fs::MappingCache> mapping_cache;
  ReaderOptions reader;  // compression, skip_corrupt, buffer size
};

struct DatasetStats {
  uint64_t files = 0;    // files opened so far
  uint64_t records = 0;  // records read (before sharding)
  uint64_t rows = 0;     // rows handed out in batches
  uint64_t skipped_records = 0;  // corrupt records skipped (reader.skip_corrupt)
};

class ExampleDataset {
 public:
  // Starts reading `paths` (in this order) of `fs`.  InvalidArgument for an
  // empty schema, batch_size < 1 or a bad shard; a missing file fails the
  // Next() that reaches it, naming it.
  static Result<std::unique_ptr<ExampleDataset>> Open(std::shared_ptr<fs::FileSystem> fs,
                                                       std::vector<std::string> paths, DatasetOptions options);
  ~ExampleDataset();  // Close()s
  ExampleDataset(const ExampleDataset&) = delete;
  ExampleDataset& operator=(const ExampleDataset&) = delete;

  // The next batch's columns (schema order; batch_size rows, or fewer for
  // the last one), std::nullopt at the end of the files.  After an error
  // every later call returns it again.
  Result<std::optional<std::vector<example::FeatureColumn>>> Next();

  // Stops the reading thread; Next() then returns Cancelled.  Idempotent.
  void Close();

  DatasetStats stats() const;

  class Impl;

 private:
  explicit ExampleDataset(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::record
