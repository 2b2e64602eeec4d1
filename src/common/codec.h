// A tiny binary codec for wire payloads (docs/wire.md).  All integers are
// little-endian; f64 is the IEEE-754 bit pattern as a u64; a string is a u32
// byte count then the bytes; a map<string,f64> is a u32 entry count then
// (string, f64) pairs.
//
// Reader parses untrusted bytes: every read is bounds-checked and returns
// Corruption (naming the field's offset) on truncation or a length that runs
// past the buffer; it never allocates more than the buffer could hold.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "ember/status.h"

namespace ember::codec {

class Writer {
 public:
  void PutU8(uint8_t v) { buf_.push_back(static_cast<char>(v)); }
  void PutU16(uint16_t v) { PutLE(v, 2); }
  void PutU32(uint32_t v) { PutLE(v, 4); }
  void PutI32(int32_t v) { PutLE(static_cast<uint32_t>(v), 4); }
  void PutU64(uint64_t v) { PutLE(v, 8); }
  void PutI64(int64_t v) { PutLE(static_cast<uint64_t>(v), 8); }
  void PutF64(double v);
  void PutString(std::string_view s);
  void PutMap(const std::map<std::string, double>& m);
  void PutRaw(std::string_view bytes) { buf_.append(bytes); }

  const std::string& data() const { return buf_; }
  std::string Release() { return std::move(buf_); }

 private:
  void PutLE(uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) buf_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
  }
  std::string buf_;
};

// Reads from a view; the bytes must outlive the Reader.
class Reader {
 public:
  explicit Reader(std::string_view data) : data_(data) {}

  [[nodiscard]] Status GetU8(uint8_t* out);
  [[nodiscard]] Status GetU16(uint16_t* out);
  [[nodiscard]] Status GetU32(uint32_t* out);
  [[nodiscard]] Status GetI32(int32_t* out);
  [[nodiscard]] Status GetU64(uint64_t* out);
  [[nodiscard]] Status GetI64(int64_t* out);
  [[nodiscard]] Status GetF64(double* out);
  [[nodiscard]] Status GetString(std::string* out);
  [[nodiscard]] Status GetMap(std::map<std::string, double>* out);
  // The next `n` bytes as a view into the buffer (Corruption naming `what` if fewer are left).
  [[nodiscard]] Status GetBytes(size_t n, const char* what, std::string_view* out);

  // Corruption if any bytes are left unread (a message must be consumed whole).
  [[nodiscard]] Status ExpectEnd() const;

  size_t offset() const { return pos_; }
  size_t remaining() const { return data_.size() - pos_; }
  std::string_view rest() const { return data_.substr(pos_); }

 private:
  Status Need(size_t n, const char* what) const;
  uint64_t TakeLE(int bytes);
  std::string_view data_;
  size_t pos_ = 0;
};

}  // namespace ember::codec
