#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace ember::crc32c {
namespace {

// RFC 3720 section B.4 and LevelDB's util/crc32c_test.cc.
TEST(Crc32c, StandardResults) {
  uint8_t buf[32];
  std::memset(buf, 0, sizeof(buf));
  EXPECT_EQ(0x8a9136aau, Value(buf, sizeof(buf)));
  std::memset(buf, 0xff, sizeof(buf));
  EXPECT_EQ(0x62a8ab43u, Value(buf, sizeof(buf)));
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(i);
  EXPECT_EQ(0x46dd794eu, Value(buf, sizeof(buf)));
  for (int i = 0; i < 32; ++i) buf[i] = static_cast<uint8_t>(31 - i);
  EXPECT_EQ(0x113fdb5cu, Value(buf, sizeof(buf)));

  const uint8_t iscsi[48] = {
      0x01, 0xc0, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
      0x14, 0x00, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x14, 0x00, 0x00, 0x00, 0x18,
      0x28, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
  };
  EXPECT_EQ(0xd9963a56u, Value(iscsi, sizeof(iscsi)));
  EXPECT_EQ(0xe3069283u, Value(std::string_view("123456789")));
}

TEST(Crc32c, Values) { EXPECT_NE(Value(std::string_view("a")), Value(std::string_view("foo"))); }

TEST(Crc32c, Extend) {
  EXPECT_EQ(Value(std::string_view("hello world")),
            Extend(Value(std::string_view("hello ")), reinterpret_cast<const uint8_t*>("world"), 5));
}

TEST(Crc32c, Mask) {
  uint32_t crc = Value(std::string_view("foo"));
  EXPECT_NE(crc, Mask(crc));
  EXPECT_NE(crc, Mask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Mask(crc)));
  EXPECT_EQ(crc, Unmask(Unmask(Mask(Mask(crc)))));
}

// The hardware and portable paths agree on every length and alignment.
TEST(Crc32c, HardwareMatchesPortable) {
  std::mt19937 rng(42);
  std::vector<uint8_t> buf(4096 + 16);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  if (!HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  for (size_t align = 0; align < 16; ++align) {
    for (size_t n = 0; n <= 300; ++n) {
      uint32_t init = static_cast<uint32_t>(rng());
      ASSERT_EQ(ExtendPortable(init, buf.data() + align, n), ExtendHardware(init, buf.data() + align, n))
          << "align " << align << " n " << n;
    }
    ASSERT_EQ(ExtendPortable(0, buf.data() + align, 4096), ExtendHardware(0, buf.data() + align, 4096));
  }
}

// Lengths around the interleaved paths' block edges (3 x 256 and 3 x 8192
// bytes) and well past them, where partial CRCs are shifted and joined.
TEST(Crc32c, InterleavedBlocksMatchPortable) {
  if (!HardwareAvailable()) GTEST_SKIP() << "no SSE4.2 on this CPU";
  std::mt19937 rng(7);
  std::vector<uint8_t> buf(3 * 8192 * 3 + 64);
  for (auto& b : buf) b = static_cast<uint8_t>(rng());
  for (size_t edge : {size_t{3 * 256}, size_t{3 * 8192}, size_t{2 * 3 * 8192}}) {
    for (size_t n = edge - 9; n <= edge + 9; ++n) {
      for (size_t align : {0, 3, 8}) {
        uint32_t init = static_cast<uint32_t>(rng());
        ASSERT_EQ(ExtendPortable(init, buf.data() + align, n), ExtendHardware(init, buf.data() + align, n))
            << "align " << align << " n " << n;
      }
    }
  }
  ASSERT_EQ(ExtendPortable(0, buf.data(), buf.size()), ExtendHardware(0, buf.data(), buf.size()));
  // Extending in pieces gives the CRC of the whole.
  uint32_t c = 0;
  for (size_t at = 0; at < buf.size(); at += 1000) c = Extend(c, buf.data() + at, std::min<size_t>(1000, buf.size() - at));
  EXPECT_EQ(Value(buf.data(), buf.size()), c);
}

TEST(Crc32c, PortableStandardResult) {
  EXPECT_EQ(0xe3069283u, ExtendPortable(0, reinterpret_cast<const uint8_t*>("123456789"), 9));
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(0x8a9136aau, ExtendPortable(0, zeros.data(), zeros.size()));
}

}  // namespace
}  // namespace ember::crc32c
