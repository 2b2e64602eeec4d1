#include "common/codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace ember::codec {
namespace {

TEST(CodecTest, RoundTripsEveryType) {
  Writer w;
  w.PutU8(0xab);
  w.PutU16(0xbeef);
  w.PutU32(0xdeadbeef);
  w.PutI32(-7);
  w.PutI64(std::numeric_limits<int64_t>::min());
  w.PutF64(-2.5);
  w.PutString("héllo\0x");
  w.PutString("");
  w.PutMap({{"loss", 0.25}, {"step", 100}});
  Reader r(w.data());
  uint8_t u8;
  uint16_t u16;
  uint32_t u32;
  int32_t i32;
  int64_t i64;
  double f64;
  std::string s1, s2;
  std::map<std::string, double> m;
  ASSERT_TRUE(r.GetU8(&u8).ok());
  ASSERT_TRUE(r.GetU16(&u16).ok());
  ASSERT_TRUE(r.GetU32(&u32).ok());
  ASSERT_TRUE(r.GetI32(&i32).ok());
  ASSERT_TRUE(r.GetI64(&i64).ok());
  ASSERT_TRUE(r.GetF64(&f64).ok());
  ASSERT_TRUE(r.GetString(&s1).ok());
  ASSERT_TRUE(r.GetString(&s2).ok());
  ASSERT_TRUE(r.GetMap(&m).ok());
  EXPECT_TRUE(r.ExpectEnd().ok());
  EXPECT_EQ(u8, 0xab);
  EXPECT_EQ(u16, 0xbeef);
  EXPECT_EQ(u32, 0xdeadbeefu);
  EXPECT_EQ(i32, -7);
  EXPECT_EQ(i64, std::numeric_limits<int64_t>::min());
  EXPECT_EQ(f64, -2.5);
  EXPECT_EQ(s1, "héllo");
  EXPECT_EQ(s2, "");
  EXPECT_EQ(m, (std::map<std::string, double>{{"loss", 0.25}, {"step", 100}}));
}

TEST(CodecTest, LittleEndianLayout) {
  Writer w;
  w.PutU32(0x01020304);
  EXPECT_EQ(w.data(), std::string("\x04\x03\x02\x01", 4));
}

TEST(CodecTest, TruncationIsCorruption) {
  Writer w;
  w.PutI64(5);
  const std::string bytes = w.data().substr(0, 5);
  Reader r(bytes);
  int64_t v;
  Status st = r.GetI64(&v);
  EXPECT_EQ(st.code(), StatusCode::kCorruption);
  EXPECT_NE(st.message().find("offset 0"), std::string::npos) << st.message();
}

TEST(CodecTest, OverlongStringLengthIsCorruption) {
  Writer w;
  w.PutU32(0xffffffff);  // claims 4 GiB
  w.PutRaw("abc");
  Reader r(w.data());
  std::string s;
  EXPECT_EQ(r.GetString(&s).code(), StatusCode::kCorruption);
}

TEST(CodecTest, HostileMapCountIsCorruption) {
  Writer w;
  w.PutU32(1u << 30);
  w.PutString("k");
  w.PutF64(1);
  Reader r(w.data());
  std::map<std::string, double> m;
  EXPECT_EQ(r.GetMap(&m).code(), StatusCode::kCorruption);
}

TEST(CodecTest, TrailingBytesAreCorruption) {
  Reader r("xy");
  uint8_t v;
  ASSERT_TRUE(r.GetU8(&v).ok());
  EXPECT_EQ(r.ExpectEnd().code(), StatusCode::kCorruption);
}

TEST(CodecTest, NanRoundTrips) {
  Writer w;
  w.PutF64(std::nan(""));
  Reader r(w.data());
  double d;
  ASSERT_TRUE(r.GetF64(&d).ok());
  EXPECT_TRUE(std::isnan(d));
}

}  // namespace
}  // namespace ember::codec
