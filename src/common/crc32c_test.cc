#include "common/crc32c.h"

#include <gtest/gtest.h>

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

TEST(Crc32c, PortableStandardResult) {
  EXPECT_EQ(0xe3069283u, ExtendPortable(0, reinterpret_cast<const uint8_t*>("123456789"), 9));
  std::vector<uint8_t> zeros(32, 0);
  EXPECT_EQ(0x8a9136aau, ExtendPortable(0, zeros.data(), zeros.size()));
}

}  // namespace
}  // namespace ember::crc32c
