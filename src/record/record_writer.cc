// RecordWriter: TFRecord framing into a ByteSink (raw, gzip or zlib).
#include <endian.h>

#include <cstring>
#include <string>

#include "common/crc32c.h"
#include "ember/record.h"
#include "record/zlib_stream.h"

namespace ember::record {

class RecordWriter::Impl {
 public:
  Impl(std::unique_ptr<fs::WritableFile> file, Compression c) : file_(std::move(file)), compression_(c) {}
  ~Impl() { (void)Close(); }

  Status Init(const WriterOptions& options) {
    EMBER_ASSIGN_OR_RAISE(sink_, NewByteSink(file_.get(), compression_, options.compression_level,
                                             options.buffer_bytes));
    return Status::OK();
  }

  Status Write(std::span<const uint8_t> data) {
    if (closed_) return Status::InvalidArgument("write to closed record file " + file_->uri());
    EMBER_RETURN_NOT_OK(error_);
    uint8_t header[12];
    uint64_t len = htole64(data.size());
    std::memcpy(header, &len, 8);
    uint32_t lcrc = htole32(crc32c::Mask(crc32c::Value(header, 8)));
    std::memcpy(header + 8, &lcrc, 4);
    uint8_t footer[4];
    uint32_t dcrc = htole32(crc32c::Mask(crc32c::Value(data)));
    std::memcpy(footer, &dcrc, 4);
    Status st = sink_->Append(header);
    if (st.ok()) st = sink_->Append(data);
    if (st.ok()) st = sink_->Append(footer);
    if (!st.ok()) return error_ = st;  // the stream is broken past this point
    ++records_;
    return Status::OK();
  }

  Status Flush() {
    if (closed_) return Status::OK();
    EMBER_RETURN_NOT_OK(error_);
    return error_ = sink_->Flush();
  }

  Status Close() {
    if (closed_) return error_;
    closed_ = true;
    Status st = error_;
    if (st.ok() && sink_) st = sink_->Finish();
    Status close_st = file_->Close();
    if (st.ok()) st = close_st;
    return error_ = st;
  }

  uint64_t records() const { return records_; }
  const std::string& uri() const { return file_->uri(); }

 private:
  std::unique_ptr<fs::WritableFile> file_;
  Compression compression_;
  std::unique_ptr<ByteSink> sink_;
  uint64_t records_ = 0;
  bool closed_ = false;
  Status error_;
};

Result<std::unique_ptr<RecordWriter>> RecordWriter::Open(std::unique_ptr<fs::WritableFile> file,
                                                         const WriterOptions& options) {
  if (!file) return Status::InvalidArgument("RecordWriter::Open: no file");
  Compression c = options.compression == Compression::kAuto ? CompressionFromPath(file->uri())
                                                            : options.compression;
  auto impl = std::make_unique<Impl>(std::move(file), c);
  EMBER_RETURN_NOT_OK(impl->Init(options));
  return std::unique_ptr<RecordWriter>(new RecordWriter(std::move(impl)));
}

RecordWriter::RecordWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RecordWriter::~RecordWriter() = default;
Status RecordWriter::Write(std::span<const uint8_t> record) { return impl_->Write(record); }
Status RecordWriter::Flush() { return impl_->Flush(); }
Status RecordWriter::Close() { return impl_->Close(); }
uint64_t RecordWriter::records_written() const { return impl_->records(); }
const std::string& RecordWriter::uri() const { return impl_->uri(); }

}  // namespace ember::record
