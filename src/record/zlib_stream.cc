#include "record/zlib_stream.h"

#include <algorithm>
#include <string>

namespace ember::record {
namespace {

class RawSource final : public ByteSource {
 public:
  explicit RawSource(fs::SequentialFile* file) : file_(file) {}
  Result<size_t> Read(std::span<uint8_t> buffer) override { return file_->Read(buffer); }

 private:
  fs::SequentialFile* file_;
};

// zlib's inflate over the file.  Concatenated gzip members (as `cat a.gz
// b.gz` makes) are read as one stream.
class InflateSource final : public ByteSource {
 public:
  InflateSource(fs::SequentialFile* file, Compression c, size_t buffer_bytes)
      : file_(file), compression_(c), in_(std::max<size_t>(buffer_bytes, 4096)) {}
  ~InflateSource() override {
    if (initialised_) inflateEnd(&z_);
  }

  Status Init() {
    // gzip: 15 + 32 accepts a gzip or zlib header (TF's reader does the same).
    int bits = compression_ == Compression::kGzip ? 15 + 32 : 15;
    if (inflateInit2(&z_, bits) != Z_OK) return Status::Internal("inflateInit2 failed for " + file_->uri());
    initialised_ = true;
    return Status::OK();
  }

  // Bytes inflated before an error are returned first; the error comes on
  // the next call (so a reader gets every whole record before the damage).
  Result<size_t> Read(std::span<uint8_t> buffer) override {
    if (!error_.ok()) return error_;
    if (done_) return size_t{0};
    z_.next_out = buffer.data();
    z_.avail_out = static_cast<uInt>(std::min<size_t>(buffer.size(), 1u << 30));
    const uInt want = z_.avail_out;
    Status st = Inflate();
    size_t got = want - z_.avail_out;
    if (!st.ok()) {
      error_ = st;
      if (got == 0) return st;
    }
    return got;
  }

 private:
  Status Inflate() {
    while (z_.avail_out > 0) {
      if (z_.avail_in == 0) {
        EMBER_ASSIGN_OR_RAISE(size_t n, file_->Read(in_));
        if (n == 0) {
          // The end of the file: clean between gzip members or in an empty file.
          if (!in_stream_ || consumed_before_ + in_used_ == 0) {
            done_ = true;
            return Status::OK();
          }
          return Error("truncated " + std::string(CompressionName(compression_)) + " stream");
        }
        consumed_before_ += in_used_;
        in_used_ = n;
        z_.next_in = in_.data();
        z_.avail_in = static_cast<uInt>(n);
      }
      if (!in_stream_) {
        inflateReset(&z_);
        in_stream_ = true;
      }
      int rc = inflate(&z_, Z_NO_FLUSH);
      if (rc == Z_STREAM_END) {
        in_stream_ = false;
        // zlib streams are single; gzip may hold several members.
        if (compression_ == Compression::kZlib) {
          done_ = true;
          return Status::OK();
        }
        continue;
      }
      if (rc == Z_BUF_ERROR && z_.avail_in == 0) continue;  // needs more input
      if (rc != Z_OK) {
        return Error(std::string(CompressionName(compression_)) + " data error: " +
                     (z_.msg ? z_.msg : zError(rc)));
      }
    }
    return Status::OK();
  }

  Status Error(const std::string& what) {
    uint64_t offset = consumed_before_ + (in_used_ - z_.avail_in);
    return Status::Corruption(file_->uri() + ": " + what + " at compressed offset " +
                              std::to_string(offset));
  }

  fs::SequentialFile* file_;
  Compression compression_;
  std::vector<uint8_t> in_;
  z_stream z_{};
  bool initialised_ = false;
  bool in_stream_ = true;
  bool done_ = false;
  Status error_;  // sticky, after the bytes before it were returned
  uint64_t consumed_before_ = 0;  // compressed bytes of earlier input chunks
  size_t in_used_ = 0;            // size of the current input chunk
};

class RawSink final : public ByteSink {
 public:
  explicit RawSink(fs::WritableFile* file) : file_(file) {}
  Status Append(std::span<const uint8_t> data) override { return file_->Append(data); }
  Status Flush() override { return file_->Flush(); }
  Status Finish() override { return Status::OK(); }

 private:
  fs::WritableFile* file_;
};

class DeflateSink final : public ByteSink {
 public:
  DeflateSink(fs::WritableFile* file, Compression c, size_t buffer_bytes)
      : file_(file), compression_(c), out_(std::max<size_t>(buffer_bytes, 4096)) {}
  ~DeflateSink() override {
    if (initialised_) deflateEnd(&z_);
  }

  Status Init(int level) {
    int bits = compression_ == Compression::kGzip ? 15 + 16 : 15;
    if (deflateInit2(&z_, level, Z_DEFLATED, bits, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
      return Status::InvalidArgument("deflateInit2 refused compression level " + std::to_string(level) +
                                     " for " + file_->uri());
    }
    initialised_ = true;
    return Status::OK();
  }

  Status Append(std::span<const uint8_t> data) override {
    // zlib takes uInt lengths: feed at most 1 GiB per call.
    while (!data.empty()) {
      size_t n = std::min<size_t>(data.size(), 1u << 30);
      z_.next_in = const_cast<Bytef*>(data.data());
      z_.avail_in = static_cast<uInt>(n);
      EMBER_RETURN_NOT_OK(Deflate(Z_NO_FLUSH));
      data = data.subspan(n);
    }
    return Status::OK();
  }

  Status Flush() override {
    EMBER_RETURN_NOT_OK(Deflate(Z_SYNC_FLUSH));
    EMBER_RETURN_NOT_OK(Drain());
    return file_->Flush();
  }

  Status Finish() override {
    EMBER_RETURN_NOT_OK(Deflate(Z_FINISH));
    return Drain();
  }

 private:
  // Runs deflate until the input is consumed (and, for a flush, until zlib
  // has no more output), writing full output buffers to the file.
  Status Deflate(int flush) {
    for (;;) {
      z_.next_out = out_.data() + out_used_;
      z_.avail_out = static_cast<uInt>(out_.size() - out_used_);
      int rc = deflate(&z_, flush);
      out_used_ = out_.size() - z_.avail_out;
      if (rc == Z_STREAM_ERROR) return Status::Internal("deflate failed for " + file_->uri());
      if (out_used_ == out_.size()) {
        EMBER_RETURN_NOT_OK(Drain());
        continue;
      }
      // Output space is left: zlib is done with this input / flush.
      if (flush == Z_FINISH && rc != Z_STREAM_END) continue;
      return Status::OK();
    }
  }

  Status Drain() {
    if (out_used_ == 0) return Status::OK();
    Status st = file_->Append({out_.data(), out_used_});
    out_used_ = 0;
    return st;
  }

  fs::WritableFile* file_;
  Compression compression_;
  std::vector<uint8_t> out_;
  size_t out_used_ = 0;
  z_stream z_{};
  bool initialised_ = false;
};

}  // namespace

Result<std::unique_ptr<ByteSource>> NewByteSource(fs::SequentialFile* file, Compression compression,
                                                  size_t buffer_bytes) {
  if (compression == Compression::kNone) return std::unique_ptr<ByteSource>(new RawSource(file));
  auto src = std::make_unique<InflateSource>(file, compression, buffer_bytes);
  EMBER_RETURN_NOT_OK(src->Init());
  return std::unique_ptr<ByteSource>(std::move(src));
}

Result<std::unique_ptr<ByteSink>> NewByteSink(fs::WritableFile* file, Compression compression, int level,
                                              size_t buffer_bytes) {
  if (compression == Compression::kNone) return std::unique_ptr<ByteSink>(new RawSink(file));
  auto sink = std::make_unique<DeflateSink>(file, compression, buffer_bytes);
  EMBER_RETURN_NOT_OK(sink->Init(level));
  return std::unique_ptr<ByteSink>(std::move(sink));
}

}  // namespace ember::record
