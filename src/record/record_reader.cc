// RecordReader: TFRecord framing over a ByteSource (raw, gzip or zlib).
//
// The reader keeps the uncompressed stream in one buffer, [pos_, end_)
// unread; a record is returned as a view into it, so the common case copies
// nothing after the file read (or inflate).  The buffer grows only as far as
// bytes actually arrive, so a hostile length in a header cannot make it
// allocate more than the file holds.
#include <endian.h>

#include <algorithm>
#include <cctype>
#include <cstring>
#include <string>
#include <vector>

#include "common/crc32c.h"
#include "ember/record.h"
#include "record/zlib_stream.h"

namespace ember::record {

namespace {

constexpr size_t kHeaderBytes = 12;  // uint64 length + uint32 masked CRC
constexpr size_t kFooterBytes = 4;   // uint32 masked CRC of the data

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return le64toh(v);
}
uint32_t LoadU32(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return le32toh(v);
}

// Records ahead whose header framing prefetches.  On bench/records_threads.py's
// file: none read at 0.82x the speed of 4 ahead; 12 to 24 alike, 5-10 % past 4.
constexpr size_t kPrefetchRecords = 16;

bool DataCrcOk(const uint8_t* data, size_t length) {
  return crc32c::Value(data, length) == crc32c::Unmask(LoadU32(data + length));
}

std::string BadDataCrc(uint64_t length) { return "bad data CRC (record of " + std::to_string(length) + " bytes)"; }

bool HeaderOk(const uint8_t* p) { return crc32c::Unmask(LoadU32(p + 8)) == crc32c::Value(p, 8); }

bool EndsWith(std::string_view s, std::string_view suffix) {
  if (s.size() < suffix.size()) return false;
  for (size_t i = 0; i < suffix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(s[s.size() - suffix.size() + i])) != suffix[i]) return false;
  }
  return true;
}

}  // namespace

Compression CompressionFromPath(std::string_view path) {
  if (EndsWith(path, ".gz") || EndsWith(path, ".gzip")) return Compression::kGzip;
  if (EndsWith(path, ".zlib")) return Compression::kZlib;
  return Compression::kNone;
}

std::string_view CompressionName(Compression c) {
  switch (c) {
    case Compression::kAuto: return "auto";
    case Compression::kNone: return "none";
    case Compression::kGzip: return "gzip";
    case Compression::kZlib: return "zlib";
  }
  return "?";
}

Result<Compression> ParseCompression(std::string_view name) {
  std::string n(name);
  for (auto& ch : n) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  if (n == "" || n == "none") return Compression::kNone;
  if (n == "gzip" || n == "gz") return Compression::kGzip;
  if (n == "zlib") return Compression::kZlib;
  if (n == "auto") return Compression::kAuto;
  return Status::InvalidArgument("unknown compression '" + std::string(name) +
                                 "' (expected none, gzip, zlib or auto)");
}

std::string FrameRecord(std::string_view data) {
  std::string out(kHeaderBytes + data.size() + kFooterBytes, '\0');
  uint64_t len = htole64(data.size());
  std::memcpy(out.data(), &len, 8);
  uint32_t lcrc = htole32(crc32c::Mask(crc32c::Value(reinterpret_cast<const uint8_t*>(out.data()), 8)));
  std::memcpy(out.data() + 8, &lcrc, 4);
  if (!data.empty()) std::memcpy(out.data() + kHeaderBytes, data.data(), data.size());
  uint32_t dcrc = htole32(crc32c::Mask(crc32c::Value(data)));
  std::memcpy(out.data() + kHeaderBytes + data.size(), &dcrc, 4);
  return out;
}

Status CheckDataCrc(std::string_view record, const std::string& uri, uint64_t offset) {
  if (DataCrcOk(reinterpret_cast<const uint8_t*>(record.data()), record.size())) return Status::OK();
  // Worded as RecordReader's Corrupt() words it for an uncompressed stream.
  return Status::Corruption(uri + ": " + BadDataCrc(record.size()) + " at offset " + std::to_string(offset));
}

class RecordReader::Impl {
 public:
  Impl(std::unique_ptr<fs::SequentialFile> file, const ReaderOptions& options, Compression c)
      : file_(std::move(file)), options_(options), compression_(c) {
    buffer_.resize(std::max<size_t>(options.buffer_bytes, 64));
    base_ = buffer_.data();
  }

  // In place over a mapped file: the whole stream is there from the start.
  Impl(std::shared_ptr<const fs::ReadOnlyMemoryRegion> region, const ReaderOptions& options)
      : region_(std::move(region)), options_(options), compression_(Compression::kNone),
        check_data_crc_(options.check_data_crc || options.skip_corrupt) {
    base_ = region_->data().data();
    end_ = region_->data().size();
    source_done_ = true;
  }

  Status Init() {
    if (region_ != nullptr) return Status::OK();
    EMBER_ASSIGN_OR_RAISE(source_, NewByteSource(file_.get(), compression_, options_.buffer_bytes));
    return Status::OK();
  }

  Result<bool> Next(std::string_view* record) {
    if (!error_.ok()) return error_;
    if (eof_) return false;
    Result<bool> r = NextImpl(record);
    if (!r.ok()) error_ = r.status();
    else if (!*r) eof_ = true;
    return r;
  }

  uint64_t last_offset() const { return last_offset_; }
  const ReaderStats& stats() const { return stats_; }
  const std::string& uri() const { return region_ != nullptr ? region_->uri() : file_->uri(); }
  Compression compression() const { return compression_; }

 private:
  Result<bool> NextImpl(std::string_view* record) {
    for (;;) {
      const uint64_t start = stream_offset_;
      EMBER_ASSIGN_OR_RAISE(bool have_header, Ensure(kHeaderBytes));
      if (!have_header) {
        size_t left = end_ - pos_;
        if (left == 0) return false;
        if (options_.skip_corrupt) return SkipTail();
        return Corrupt(start, "truncated record header (" + std::to_string(left) + " of 12 bytes)");
      }
      const uint8_t* h = base_ + pos_;
      if (!HeaderOk(h)) {
        if (!options_.skip_corrupt) return Corrupt(start, "bad length CRC");
        EMBER_ASSIGN_OR_RAISE(bool found, Resync());
        if (!found) return false;
        continue;
      }
      const uint64_t length = LoadU64(h);
      if (length > options_.max_record_bytes) {
        if (!options_.skip_corrupt) {
          return Corrupt(start, "record length " + std::to_string(length) + " exceeds max_record_bytes " +
                                    std::to_string(options_.max_record_bytes));
        }
        EMBER_ASSIGN_OR_RAISE(bool found, Resync());
        if (!found) return false;
        continue;
      }
      const size_t total = kHeaderBytes + static_cast<size_t>(length) + kFooterBytes;
      EMBER_ASSIGN_OR_RAISE(bool have_all, Ensure(total));
      if (!have_all) {
        if (options_.skip_corrupt) return SkipTail();
        return Corrupt(start, "truncated record: header says " + std::to_string(length) +
                                  " data bytes, the stream ends " + std::to_string(end_ - pos_) +
                                  " bytes after the record's start");
      }
      const uint8_t* data = base_ + pos_ + kHeaderBytes;
      // Framing touches one line per record, the next header: a miss to
      // memory each time, in the reading's serial part.  Records of a file
      // tend to have one size, so the header a few records on is most
      // likely there; fetching it now hides the miss.
      if (const size_t ahead = pos_ + kPrefetchRecords * total; ahead < end_) __builtin_prefetch(base_ + ahead);
      if (check_data_crc_ && !DataCrcOk(data, length)) {
        if (!options_.skip_corrupt) return Corrupt(start, BadDataCrc(length));
        ++stats_.skipped_records;
        stats_.skipped_bytes += total;
        Consume(total);
        continue;
      }
      Consume(total);
      last_offset_ = start;
      ++stats_.records;
      *record = std::string_view(reinterpret_cast<const char*>(data), length);
      return true;
    }
  }

  // After a bad header at pos_: drops bytes until an offset whose header
  // checks out; false if the stream ends first (all counted as skipped).
  Result<bool> Resync() {
    ++stats_.skipped_records;
    for (;;) {
      Consume(1);
      ++stats_.skipped_bytes;
      EMBER_ASSIGN_OR_RAISE(bool have, Ensure(kHeaderBytes));
      if (!have) {
        stats_.skipped_bytes += end_ - pos_;
        Consume(end_ - pos_);
        return false;
      }
      if (HeaderOk(base_ + pos_)) return true;
    }
  }

  Result<bool> SkipTail() {
    ++stats_.skipped_records;
    stats_.skipped_bytes += end_ - pos_;
    Consume(end_ - pos_);
    return false;
  }

  Status Corrupt(uint64_t offset, const std::string& what) {
    std::string msg = uri() + ": " + what + " at offset " + std::to_string(offset);
    if (compression_ != Compression::kNone) {
      msg += " of the uncompressed stream (" + std::string(CompressionName(compression_)) + ")";
    }
    return Status::Corruption(std::move(msg));
  }

  void Consume(size_t n) {
    pos_ += n;
    stream_offset_ += n;
  }

  // Makes [pos_, pos_ + n) valid; false if the stream ends first (what
  // arrived stays in [pos_, end_)).
  Result<bool> Ensure(size_t n) {
    while (end_ - pos_ < n) {
      if (source_done_) return false;
      if (pos_ > 0) {  // compact
        std::memmove(buffer_.data(), buffer_.data() + pos_, end_ - pos_);
        end_ -= pos_;
        pos_ = 0;
      }
      if (end_ == buffer_.size()) {
        // Grow towards n, at most doubling, so memory tracks bytes received.
        buffer_.resize(std::max(std::min(n, buffer_.size() * 2), buffer_.size() + 1));
        base_ = buffer_.data();
      }
      std::span<uint8_t> space(buffer_.data() + end_, buffer_.size() - end_);
      Result<size_t> got = source_->Read(space);
      if (!got.ok()) {
        if (options_.skip_corrupt && got.status().code() == StatusCode::kCorruption) {
          // A broken compressed stream ends the readable part.
          source_done_ = true;
          continue;
        }
        return got.status();
      }
      if (*got == 0) source_done_ = true;
      end_ += *got;
    }
    return true;
  }

  std::unique_ptr<fs::SequentialFile> file_;  // streamed, or
  std::shared_ptr<const fs::ReadOnlyMemoryRegion> region_;  // mapped
  ReaderOptions options_;
  // A streamed record's footer is gone after the next read: only a mapped
  // region leaves the data CRC to the caller (and never when skipping).
  bool check_data_crc_ = true;
  Compression compression_;
  std::unique_ptr<ByteSource> source_;
  std::vector<uint8_t> buffer_;
  const uint8_t* base_ = nullptr;  // buffer_'s bytes, or the mapped file's
  size_t pos_ = 0, end_ = 0;
  uint64_t stream_offset_ = 0;  // stream offset of buffer_[pos_]
  uint64_t last_offset_ = 0;
  bool source_done_ = false;
  bool eof_ = false;
  Status error_;
  ReaderStats stats_;
};

Result<std::unique_ptr<RecordReader>> RecordReader::Open(std::unique_ptr<fs::SequentialFile> file,
                                                         const ReaderOptions& options) {
  if (!file) return Status::InvalidArgument("RecordReader::Open: no file");
  Compression c = options.compression == Compression::kAuto ? CompressionFromPath(file->uri())
                                                            : options.compression;
  auto impl = std::make_unique<Impl>(std::move(file), options, c);
  EMBER_RETURN_NOT_OK(impl->Init());
  return std::unique_ptr<RecordReader>(new RecordReader(std::move(impl)));
}

Result<std::unique_ptr<RecordReader>> RecordReader::Open(std::shared_ptr<const fs::ReadOnlyMemoryRegion> region,
                                                         const ReaderOptions& options) {
  if (!region) return Status::InvalidArgument("RecordReader::Open: no region");
  Compression c = options.compression == Compression::kAuto ? CompressionFromPath(region->uri())
                                                            : options.compression;
  if (c != Compression::kNone) {
    return Status::InvalidArgument("RecordReader::Open: " + region->uri() + " is " +
                                   std::string(CompressionName(c)) + "-compressed; read it as a stream");
  }
  return std::unique_ptr<RecordReader>(new RecordReader(std::make_unique<Impl>(std::move(region), options)));
}

RecordReader::RecordReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RecordReader::~RecordReader() = default;
Result<bool> RecordReader::Next(std::string_view* record) { return impl_->Next(record); }
uint64_t RecordReader::last_offset() const { return impl_->last_offset(); }
const ReaderStats& RecordReader::stats() const { return impl_->stats(); }
const std::string& RecordReader::uri() const { return impl_->uri(); }
Compression RecordReader::compression() const { return impl_->compression(); }

}  // namespace ember::record
