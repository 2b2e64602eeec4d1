// Byte streams under the TFRecord framing: the file as is, or inflated /
// deflated with zlib (gzip or zlib wrapper).  Internal to src/record.
#pragma once

#include <zlib.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "ember/fs.h"
#include "ember/record.h"

namespace ember::record {

// The uncompressed bytes of a file.
class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Fills up to buffer.size() bytes; 0 only at the end of the stream.
  // Corruption for a malformed or truncated compressed stream, naming the
  // file and the compressed offset.
  virtual Result<size_t> Read(std::span<uint8_t> buffer) = 0;
};

// `compression` is kNone, kGzip or kZlib.  The file must outlive the source.
Result<std::unique_ptr<ByteSource>> NewByteSource(fs::SequentialFile* file, Compression compression,
                                                  size_t buffer_bytes);

// Takes uncompressed bytes, writes them (compressed) to a file.
class ByteSink {
 public:
  virtual ~ByteSink() = default;
  virtual Status Append(std::span<const uint8_t> data) = 0;
  // Hands everything appended so far to the file (sync-flushing a
  // compressed stream) and flushes the file.
  virtual Status Flush() = 0;
  // Ends the stream (gzip/zlib trailer); the file is not closed.
  virtual Status Finish() = 0;
};

Result<std::unique_ptr<ByteSink>> NewByteSink(fs::WritableFile* file, Compression compression,
                                              int level, size_t buffer_bytes);

}  // namespace ember::record
