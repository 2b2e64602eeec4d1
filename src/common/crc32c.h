// CRC32C (Castagnoli, polynomial 0x1EDC6F41, reflected 0x82F63B78), the
// checksum of TFRecord framing.  The interface is LevelDB's util/crc32c.h.
//
// The SSE4.2 `crc32` instruction is used when the CPU has it (checked once,
// at first use); otherwise a portable slicing-by-8 table.  Both give the same
// values.  All functions are pure and thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace ember::crc32c {

// The CRC32C of concat(A, data[0, n)), where `init_crc` is the CRC32C of
// some string A.  Extend(0, data, n) is the CRC32C of data[0, n).
uint32_t Extend(uint32_t init_crc, const uint8_t* data, size_t n);

inline uint32_t Extend(uint32_t init_crc, std::span<const uint8_t> data) {
  return Extend(init_crc, data.data(), data.size());
}

// The CRC32C of data[0, n).
inline uint32_t Value(const uint8_t* data, size_t n) { return Extend(0, data, n); }
inline uint32_t Value(std::span<const uint8_t> data) { return Extend(0, data.data(), data.size()); }
inline uint32_t Value(std::string_view data) {
  return Extend(0, reinterpret_cast<const uint8_t*>(data.data()), data.size());
}

constexpr uint32_t kMaskDelta = 0xa282ead8ul;

// A masked representation of `crc`.  Computing the CRC of a string that
// contains embedded CRCs is problematic, so stored CRCs are masked
// (rotate right 15 bits, add a constant): TFRecord stores masked CRCs.
inline uint32_t Mask(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + kMaskDelta; }

// The crc whose masked representation is `masked_crc`.
inline uint32_t Unmask(uint32_t masked_crc) {
  uint32_t rot = masked_crc - kMaskDelta;
  return ((rot >> 17) | (rot << 15));
}

// For tests: whether the hardware path is in use, and each path by name.
bool HardwareAvailable();
uint32_t ExtendPortable(uint32_t init_crc, const uint8_t* data, size_t n);
// Precondition: HardwareAvailable().
uint32_t ExtendHardware(uint32_t init_crc, const uint8_t* data, size_t n);

}  // namespace ember::crc32c
