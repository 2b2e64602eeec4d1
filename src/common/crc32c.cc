// CRC32C: SSE4.2 path (x86-64, three interleaved streams) chosen at run
// time, slicing-by-8 fallback.
//
// Hand-written because Debian bookworm packages no CRC32C library (no
// libcrc32c-dev; its Abseil 20220623 predates absl/crc).  Both paths are
// checked against RFC 3720's vectors and against each other in crc32c_test.
#include "common/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace ember::crc32c {
namespace {

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected Castagnoli polynomial

// kTables[k][b]: CRC of byte b followed by k zero bytes (slicing-by-8).
struct Tables {
  uint32_t t[8][256];
  constexpr Tables() : t{} {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ ((c & 1) ? kPoly : 0);
      t[0][b] = c;
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 1; k < 8; ++k) t[k][b] = (t[k - 1][b] >> 8) ^ t[0][t[k - 1][b] & 0xff];
    }
  }
};
constexpr Tables kTables;

inline uint64_t LoadLE64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);  // x86-64 and every target we build for are little-endian
  return v;
}

// Shifting a CRC over zeros (Mark Adler's crc32c.c): the 3-way interleaved
// path computes three independent CRCs of adjacent blocks, then moves the
// first two past the blocks that follow them.  Moving a CRC past `len` zero
// bytes is linear over GF(2): a 32x32 bit matrix, applied through four
// 256-entry tables (one per byte of the CRC).
using ShiftTable = std::array<std::array<uint32_t, 256>, 4>;

uint32_t MatrixTimes(const uint32_t* mat, uint32_t vec) {
  uint32_t sum = 0;
  for (; vec != 0; vec >>= 1, ++mat) {
    if (vec & 1) sum ^= *mat;
  }
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* mat) {
  for (int n = 0; n < 32; ++n) square[n] = MatrixTimes(mat, mat[n]);
}

// The tables that shift a CRC past `len` zero bytes.  Built once at
// start-up: clarity over speed.
ShiftTable MakeShiftTable(size_t len) {
  uint32_t op[32], sq[32];
  op[0] = kPoly;  // one zero bit: the register shifts right, the polynomial folds in
  for (int n = 1; n < 32; ++n) op[n] = 1u << (n - 1);
  for (int i = 0; i < 3; ++i) {  // 2, 4, then 8 bits: one zero byte
    MatrixSquare(sq, op);
    std::memcpy(op, sq, sizeof(op));
  }
  uint32_t result[32], tmp[32];
  for (int n = 0; n < 32; ++n) result[n] = 1u << n;  // the identity
  for (size_t l = len; l != 0; l >>= 1) {  // result = op^len by squaring
    if (l & 1) {
      for (int n = 0; n < 32; ++n) tmp[n] = MatrixTimes(op, result[n]);
      std::memcpy(result, tmp, sizeof(tmp));
    }
    MatrixSquare(sq, op);
    std::memcpy(op, sq, sizeof(op));
  }
  ShiftTable t;
  for (uint32_t n = 0; n < 256; ++n) {
    for (int k = 0; k < 4; ++k) t[k][n] = MatrixTimes(result, n << (8 * k));
  }
  return t;
}

inline uint32_t Shift(const ShiftTable& t, uint32_t crc) {
  return t[0][crc & 0xff] ^ t[1][(crc >> 8) & 0xff] ^ t[2][(crc >> 16) & 0xff] ^ t[3][crc >> 24];
}

// Block sizes of the interleaved loops: long blocks for big buffers, short
// ones so a ~800-byte record (Fashion-MNIST's) still takes the 3-way path.
constexpr size_t kLong = 8192;
constexpr size_t kShort = 256;

#if defined(__x86_64__)
// The `crc32` instruction has a latency of 3 cycles and a throughput of 1
// per cycle: one dependent stream runs at a third of what three
// independent streams reach.  Buffers of at least 3 blocks are cut into
// three adjacent blocks whose CRCs advance together and are then joined.
template <size_t kBlock>
__attribute__((target("sse4.2"))) inline void Interleave3(uint64_t* crc, const uint8_t** p, size_t* n,
                                                          const ShiftTable& shift) {
  while (*n >= 3 * kBlock) {
    uint64_t c0 = *crc, c1 = 0, c2 = 0;
    const uint8_t* q = *p;
    const uint8_t* end = q + kBlock;
    do {
      c0 = _mm_crc32_u64(c0, LoadLE64(q));
      c1 = _mm_crc32_u64(c1, LoadLE64(q + kBlock));
      c2 = _mm_crc32_u64(c2, LoadLE64(q + 2 * kBlock));
      q += 8;
    } while (q < end);
    c0 = Shift(shift, static_cast<uint32_t>(c0)) ^ c1;
    c0 = Shift(shift, static_cast<uint32_t>(c0)) ^ c2;
    *crc = c0;
    *p += 3 * kBlock;
    *n -= 3 * kBlock;
  }
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const uint8_t* p, size_t n) {
  static const ShiftTable kShiftLong = MakeShiftTable(kLong);
  static const ShiftTable kShiftShort = MakeShiftTable(kShort);
  uint64_t c = crc ^ 0xffffffffu;
  while (n > 0 && (reinterpret_cast<uintptr_t>(p) & 7) != 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  Interleave3<kLong>(&c, &p, &n, kShiftLong);
  Interleave3<kShort>(&c, &p, &n, kShiftShort);
  while (n >= 8) {
    c = _mm_crc32_u64(c, LoadLE64(p));
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = _mm_crc32_u8(static_cast<uint32_t>(c), *p++);
    --n;
  }
  return static_cast<uint32_t>(c) ^ 0xffffffffu;
}
#endif

bool DetectHardware() {
#if defined(__x86_64__)
  return __builtin_cpu_supports("sse4.2");
#else
  return false;
#endif
}

const bool g_hardware = DetectHardware();

}  // namespace

uint32_t ExtendPortable(uint32_t crc, const uint8_t* p, size_t n) {
  const auto& t = kTables.t;
  uint32_t c = crc ^ 0xffffffffu;
  while (n >= 8) {
    uint64_t v = LoadLE64(p) ^ c;
    c = t[7][v & 0xff] ^ t[6][(v >> 8) & 0xff] ^ t[5][(v >> 16) & 0xff] ^ t[4][(v >> 24) & 0xff] ^
        t[3][(v >> 32) & 0xff] ^ t[2][(v >> 40) & 0xff] ^ t[1][(v >> 48) & 0xff] ^ t[0][v >> 56];
    p += 8;
    n -= 8;
  }
  while (n > 0) {
    c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
    --n;
  }
  return c ^ 0xffffffffu;
}

uint32_t ExtendHardware(uint32_t crc, const uint8_t* p, size_t n) {
#if defined(__x86_64__)
  return ExtendSse42(crc, p, n);
#else
  return ExtendPortable(crc, p, n);
#endif
}

bool HardwareAvailable() { return g_hardware; }

uint32_t Extend(uint32_t crc, const uint8_t* data, size_t n) {
  return g_hardware ? ExtendHardware(crc, data, n) : ExtendPortable(crc, data, n);
}

}  // namespace ember::crc32c
