// Protobuf wire format, just what tf.Example needs: bounds-checked reading
// of untrusted bytes and writing of varints.  Internal to src/record.
//
// Every reader returns false on malformed input (a varint running past the
// end or longer than 10 bytes, a length past the end, a group or an unknown
// wire type, field number 0) and never reads outside [p, end).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace ember::example::wire {

enum WireType : uint8_t { kVarint = 0, kFixed64 = 1, kLen = 2, kFixed32 = 5 };

struct Field {
  uint32_t number = 0;
  uint8_t type = 0;
  uint64_t varint = 0;    // kVarint; the raw bits for kFixed32/kFixed64
  std::string_view bytes; // kLen
};

inline bool ReadVarint(const uint8_t*& p, const uint8_t* end, uint64_t* out) {
  if (p != end && *p < 0x80) {  // one byte: tags, short lengths, small ints
    *out = *p++;
    return true;
  }
  uint64_t v = 0;
  for (int shift = 0; shift < 70; shift += 7) {
    if (p == end) return false;
    uint8_t b = *p++;
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) {
      *out = v;
      return true;
    }
  }
  return false;  // more than 10 bytes
}

// Iterates the fields of one message.
class Cursor {
 public:
  explicit Cursor(std::string_view msg)
      : p_(reinterpret_cast<const uint8_t*>(msg.data())), end_(p_ + msg.size()) {}

  bool done() const { return p_ == end_; }
  // Bytes from the message's start to the cursor.
  const uint8_t* pos() const { return p_; }

  // Reads the next field; false if malformed.  Precondition: !done().
  // Always inlined: it is the decoder's innermost step.
  [[gnu::always_inline]] bool Next(Field* f) {
    uint64_t key;
    if (!ReadVarint(p_, end_, &key)) return false;
    f->number = static_cast<uint32_t>(key >> 3);
    f->type = static_cast<uint8_t>(key & 7);
    if (f->number == 0 || (key >> 3) > 0x1fffffff) return false;
    switch (f->type) {
      case kVarint:
        return ReadVarint(p_, end_, &f->varint);
      case kFixed64:
        if (end_ - p_ < 8) return false;
        std::memcpy(&f->varint, p_, 8);
        p_ += 8;
        return true;
      case kFixed32: {
        if (end_ - p_ < 4) return false;
        uint32_t v;
        std::memcpy(&v, p_, 4);
        f->varint = v;
        p_ += 4;
        return true;
      }
      case kLen: {
        uint64_t len;
        if (!ReadVarint(p_, end_, &len)) return false;
        if (len > static_cast<uint64_t>(end_ - p_)) return false;
        f->bytes = std::string_view(reinterpret_cast<const char*>(p_), len);
        p_ += len;
        return true;
      }
      default:
        return false;  // groups (3, 4) and 6, 7
    }
  }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

inline size_t VarintSize(uint64_t v) {
  size_t n = 1;
  while (v >= 0x80) {
    v >>= 7;
    ++n;
  }
  return n;
}

inline void PutVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

inline void PutTag(std::string* out, uint32_t number, WireType type) {
  PutVarint(out, (static_cast<uint64_t>(number) << 3) | type);
}

// Count of varints in a packed run (bytes without the continuation bit);
// exact when the run is well formed.
inline size_t CountVarints(std::string_view packed) {
  size_t n = 0;
  for (unsigned char c : packed) n += (c & 0x80) == 0;
  return n;
}

}  // namespace ember::example::wire
