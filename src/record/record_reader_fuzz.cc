// libFuzzer target for the TFRecord reader (ember/record.h): a file's bytes
// are untrusted.  The first byte picks the compression and skip_corrupt; the
// rest is the file.  Whatever the bytes, the reader returns records or an
// error and never reads out of bounds; a record it returns, framed again,
// must read back as the same record.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ember/fs.h"
#include "ember/record.h"

using namespace ember;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const record::Compression kCompressions[] = {record::Compression::kNone, record::Compression::kGzip,
                                                      record::Compression::kZlib};
  record::ReaderOptions options;
  options.compression = kCompressions[data[0] % 3];
  options.skip_corrupt = (data[0] & 4) != 0;
  options.buffer_bytes = 64 + (data[0] >> 3);  // small buffers: records span reads
  options.max_record_bytes = 1 << 20;
  auto fs = fs::NewMemoryFileSystem();
  {
    auto w = fs->NewWritableFile("/f");
    if (!w.ok() || !(*w)->Append({data + 1, size - 1}).ok() || !(*w)->Close().ok()) std::abort();
  }
  auto file = fs->NewSequentialFile("/f");
  if (!file.ok()) std::abort();
  auto reader = record::RecordReader::Open(std::move(*file), options);
  if (!reader.ok()) return 0;
  std::string_view rec;
  for (int i = 0; i < 10000; ++i) {
    auto more = (*reader)->Next(&rec);
    if (!more.ok() || !*more) break;
    if (options.compression == record::Compression::kNone && !options.skip_corrupt) {
      // Uncompressed and strict: the record sits framed in the input as-is.
      const std::string framed = record::FrameRecord(rec);
      const std::string_view input(reinterpret_cast<const char*>(data + 1), size - 1);
      if (input.substr((*reader)->last_offset(), framed.size()) != framed) std::abort();
    }
  }
  return 0;
}
