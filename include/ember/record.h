// TFRecord files: a sequence of records, each framed as
//
//   uint64 length        (little-endian)
//   uint32 masked_crc32c(length bytes)
//   byte   data[length]
//   uint32 masked_crc32c(data)
//
// (masked CRC32C as in LevelDB's util/crc32c.h; docs/record_format.md), the
// whole file optionally gzip- or zlib-compressed.  Files written here are
// read by tf.data.TFRecordDataset and the other way round.
//
// Readers and writers take a file object from an fs::FileSystem, never a
// path.  tf.Example encoding and decoding is in ember/example.h.
//
// Thread safety: a RecordReader or RecordWriter is used by one thread at a
// time.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "ember/fs.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::record {

enum class Compression : uint8_t {
  kAuto,  // from the file's name: CompressionFromPath(file.uri())
  kNone,
  kGzip,  // RFC 1952 (TF's "GZIP")
  kZlib,  // RFC 1950 (TF's "ZLIB")
};

// ".gz"/".gzip" -> kGzip, ".zlib" -> kZlib, anything else -> kNone.
Compression CompressionFromPath(std::string_view path);
// "none", "gzip", "zlib", "auto" (for messages and options from strings).
std::string_view CompressionName(Compression c);
// Accepts the names above (case-insensitive) and TF's "" / "GZIP" / "ZLIB".
Result<Compression> ParseCompression(std::string_view name);

struct ReaderOptions {
  Compression compression = Compression::kAuto;
  // Bytes read from the file per call (and the initial record buffer).
  size_t buffer_bytes = 256 << 10;
  // Instead of failing: skip records whose data CRC is wrong; after a wrong
  // length CRC, scan forward byte by byte to the next offset whose 12-byte
  // header checks out; end quietly at a truncated last record.  What was
  // skipped is counted in ReaderStats.
  bool skip_corrupt = false;
  // False: Next() checks only the header's CRC; the caller checks each
  // record's data CRC itself (the 4 masked bytes after the record's view).
  // Only for a mapped region with skip_corrupt off, where that footer stays
  // readable (ExampleDataset's decoding workers check it next to the decode).
  bool check_data_crc = true;
  // A header's length above this is corruption, even with a good CRC (it
  // bounds memory on hostile input).
  uint64_t max_record_bytes = uint64_t{1} << 31;
};

struct ReaderStats {
  uint64_t records = 0;          // records returned
  uint64_t skipped_records = 0;  // corrupt regions skipped (skip_corrupt)
  uint64_t skipped_bytes = 0;    // bytes in them
};

// The data CRC of `record`, a view into a mapped region returned by a
// RecordReader with check_data_crc off (its 4 masked CRC bytes follow it
// there): OK, or the Corruption the reader itself would have returned,
// naming `uri` and the record's `offset` (RecordReader::last_offset()).
Status CheckDataCrc(std::string_view record, const std::string& uri, uint64_t offset);

// Reads records one after the other.
class RecordReader {
 public:
  // Takes the file; fails only on bad options (e.g. zlib refusing to start).
  static Result<std::unique_ptr<RecordReader>> Open(std::unique_ptr<fs::SequentialFile> file,
                                                     const ReaderOptions& options = {});
  // Reads records in place from a mapped file (FileSystem::MapReadOnly):
  // Next()'s views stay valid as long as `region` lives, not only until the
  // next call.  InvalidArgument unless options.compression resolves to
  // kNone (a compressed file is read through a SequentialFile).
  static Result<std::unique_ptr<RecordReader>> Open(std::shared_ptr<const fs::ReadOnlyMemoryRegion> region,
                                                     const ReaderOptions& options = {});
  ~RecordReader();
  RecordReader(const RecordReader&) = delete;
  RecordReader& operator=(const RecordReader&) = delete;

  // Reads the next record into `*record`, a view valid until the next call
  // (or the reader's end).  Returns true for a record, false at the clean
  // end of the file (and on every later call).  Corruption for a bad CRC,
  // a truncated record or a bad compressed stream, naming the file's URI
  // and the byte offset where the record starts; for a compressed file that
  // offset counts bytes of the uncompressed stream, and the message says so.
  // After an error the reader is done: later calls return the same error.
  Result<bool> Next(std::string_view* record);

  // Offset of the start of the record Next last returned (uncompressed
  // stream for compressed files).
  uint64_t last_offset() const;
  const ReaderStats& stats() const;
  const std::string& uri() const;
  Compression compression() const;

 private:
  class Impl;
  explicit RecordReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

struct WriterOptions {
  Compression compression = Compression::kAuto;
  int compression_level = -1;  // zlib's 0..9; -1 is zlib's default (6)
  size_t buffer_bytes = 256 << 10;  // compressed output buffered before Append
};

// Writes records.  Close() must be called and checked: the destructor closes
// but drops the status (and a file not Closed may hold any prefix).
class RecordWriter {
 public:
  static Result<std::unique_ptr<RecordWriter>> Open(std::unique_ptr<fs::WritableFile> file,
                                                     const WriterOptions& options = {});
  ~RecordWriter();
  RecordWriter(const RecordWriter&) = delete;
  RecordWriter& operator=(const RecordWriter&) = delete;

  Status Write(std::span<const uint8_t> record);
  Status Write(std::string_view record) {
    return Write({reinterpret_cast<const uint8_t*>(record.data()), record.size()});
  }
  // Everything written so far reaches the file (a compressed stream is
  // sync-flushed, so a reader sees every record written, before Close).
  Status Flush();
  // Finishes the compressed stream and closes the file.  Idempotent; Write
  // after Close is InvalidArgument.
  Status Close();

  uint64_t records_written() const;
  const std::string& uri() const;

 private:
  class Impl;
  explicit RecordWriter(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// The framing of one record (header + data + CRC), as written to the
// uncompressed stream; for tests and tools.
std::string FrameRecord(std::string_view data);

}  // namespace ember::record
