#include "common/codec.h"

#include <bit>
#include <string>

namespace ember::codec {

void Writer::PutF64(double v) { PutLE(std::bit_cast<uint64_t>(v), 8); }

void Writer::PutString(std::string_view s) {
  PutU32(static_cast<uint32_t>(s.size()));
  buf_.append(s);
}

void Writer::PutMap(const std::map<std::string, double>& m) {
  PutU32(static_cast<uint32_t>(m.size()));
  for (const auto& [k, v] : m) {
    PutString(k);
    PutF64(v);
  }
}

Status Reader::Need(size_t n, const char* what) const {
  if (n > remaining()) {
    return Status::Corruption("truncated message: " + std::string(what) + " at offset " +
                              std::to_string(pos_) + " needs " + std::to_string(n) +
                              " bytes, " + std::to_string(remaining()) + " left");
  }
  return Status::OK();
}

uint64_t Reader::TakeLE(int bytes) {
  uint64_t v = 0;
  for (int i = 0; i < bytes; ++i) {
    v |= static_cast<uint64_t>(static_cast<uint8_t>(data_[pos_ + i])) << (8 * i);
  }
  pos_ += bytes;
  return v;
}

Status Reader::GetU8(uint8_t* out) {
  EMBER_RETURN_NOT_OK(Need(1, "u8"));
  *out = static_cast<uint8_t>(TakeLE(1));
  return Status::OK();
}
Status Reader::GetU16(uint16_t* out) {
  EMBER_RETURN_NOT_OK(Need(2, "u16"));
  *out = static_cast<uint16_t>(TakeLE(2));
  return Status::OK();
}
Status Reader::GetU32(uint32_t* out) {
  EMBER_RETURN_NOT_OK(Need(4, "u32"));
  *out = static_cast<uint32_t>(TakeLE(4));
  return Status::OK();
}
Status Reader::GetI32(int32_t* out) {
  EMBER_RETURN_NOT_OK(Need(4, "i32"));
  *out = static_cast<int32_t>(static_cast<uint32_t>(TakeLE(4)));
  return Status::OK();
}
Status Reader::GetU64(uint64_t* out) {
  EMBER_RETURN_NOT_OK(Need(8, "u64"));
  *out = TakeLE(8);
  return Status::OK();
}
Status Reader::GetI64(int64_t* out) {
  EMBER_RETURN_NOT_OK(Need(8, "i64"));
  *out = static_cast<int64_t>(TakeLE(8));
  return Status::OK();
}
Status Reader::GetF64(double* out) {
  EMBER_RETURN_NOT_OK(Need(8, "f64"));
  *out = std::bit_cast<double>(TakeLE(8));
  return Status::OK();
}

Status Reader::GetString(std::string* out) {
  uint32_t len = 0;
  EMBER_RETURN_NOT_OK(GetU32(&len));
  EMBER_RETURN_NOT_OK(Need(len, "string body"));  // checked before allocating
  out->assign(data_.substr(pos_, len));
  pos_ += len;
  return Status::OK();
}

Status Reader::GetBytes(size_t n, const char* what, std::string_view* out) {
  EMBER_RETURN_NOT_OK(Need(n, what));
  *out = data_.substr(pos_, n);
  pos_ += n;
  return Status::OK();
}

Status Reader::GetMap(std::map<std::string, double>* out) {
  uint32_t count = 0;
  EMBER_RETURN_NOT_OK(GetU32(&count));
  // Each entry takes at least 12 bytes (empty key + f64): reject impossible
  // counts up front so a hostile count cannot make us loop for long.
  if (count > remaining() / 12) {
    return Status::Corruption("map entry count " + std::to_string(count) + " at offset " +
                              std::to_string(pos_ - 4) + " exceeds the " +
                              std::to_string(remaining()) + " bytes left");
  }
  out->clear();
  for (uint32_t i = 0; i < count; ++i) {
    std::string key;
    double value = 0;
    EMBER_RETURN_NOT_OK(GetString(&key));
    EMBER_RETURN_NOT_OK(GetF64(&value));
    (*out)[std::move(key)] = value;
  }
  return Status::OK();
}

Status Reader::ExpectEnd() const {
  if (remaining() != 0) {
    return Status::Corruption(std::to_string(remaining()) + " unexpected trailing bytes at offset " +
                              std::to_string(pos_));
  }
  return Status::OK();
}

}  // namespace ember::codec
