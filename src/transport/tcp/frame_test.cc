#include "transport/tcp/frame.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <thread>

#include "common/codec.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/test_util.h"

namespace ember::tcp {
namespace {

using testing::LoopbackPair;

TEST(SocketTest, ListenOnPortZeroPicksAPort) {
  Result<Fd> l = Listen("127.0.0.1", 0);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  Result<int> port = LocalPort(l->get());
  ASSERT_TRUE(port.ok());
  EXPECT_GT(*port, 0);
}

TEST(SocketTest, ConnectRefusedIsIOError) {
  int port;
  {
    Result<Fd> l = Listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    port = *LocalPort(l->get());
  }  // closed: nothing listens there now
  Result<Fd> c = Connect("127.0.0.1", port, Deadline::After(Duration(2000)));
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kIOError);
  EXPECT_NE(c.status().message().find("Connection refused"), std::string::npos);
}

TEST(SocketTest, ReadTimesOutAndReportsPeerClose) {
  auto [a, b] = LoopbackPair();
  char buf[4];
  Status st = ReadExactly(a.get(), buf, 4, Deadline::After(Duration(30)), "test read");
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  ASSERT_TRUE(WriteAll(b.get(), "ab", 2, Deadline::After(Duration(1000)), "w").ok());
  ASSERT_TRUE(b.Close().ok());
  st = ReadExactly(a.get(), buf, 4, Deadline::After(Duration(1000)), "test read");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("after 2 of 4 bytes"), std::string::npos) << st.message();
}

TEST(SocketTest, WriteToClosedPeerIsErrorNotSigpipe) {
  auto [a, b] = LoopbackPair();
  ASSERT_TRUE(b.Close().ok());
  std::string big(1 << 20, 'x');
  Status st;
  for (int i = 0; i < 10 && st.ok(); ++i) {
    st = WriteAll(a.get(), big.data(), big.size(), Deadline::After(Duration(2000)), "w");
  }
  EXPECT_FALSE(st.ok());
}

TEST(FrameTest, RoundTrip) {
  auto [a, b] = LoopbackPair();
  ASSERT_TRUE(WriteFrame(b.get(), 42, "payload", Deadline::After(Duration(1000)), "a").ok());
  ASSERT_TRUE(WriteFrame(b.get(), 7, "", Deadline::After(Duration(1000)), "a").ok());
  Result<Frame> f = ReadFrame(a.get(), 100, Deadline::After(Duration(1000)), "b");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->type, 42);
  EXPECT_EQ(f->payload, "payload");
  f = ReadFrame(a.get(), 100, Deadline::After(Duration(1000)), "b");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->type, 7);
  EXPECT_EQ(f->payload, "");
}

TEST(FrameTest, APayloadInPartsIsTheSameFrameAsInOneBuffer) {
  auto [a, b] = LoopbackPair();
  // Empty parts, and 8 MiB: more than the socket takes at once, so sendmsg returns partway
  // through a part and the rest follows after the reader drained some.
  std::string big(8 << 20, '\0');
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 131 + 7);
  const std::string_view parts[] = {"", "head|", "", std::string_view(big), "|tail", ""};
  Status written;
  std::thread writer([&, fd = b.get()] {
    written = WriteFrameParts(fd, 9, parts, Deadline::After(Duration(20000)), "a");
  });
  Result<Frame> f = ReadFrame(a.get(), 16 << 20, Deadline::After(Duration(20000)), "b");
  writer.join();
  ASSERT_TRUE(written.ok()) << written.ToString();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->type, 9);
  EXPECT_TRUE(f->payload == "head|" + big + "|tail");
  const std::string_view none[] = {"", ""};
  ASSERT_TRUE(WriteFrameParts(b.get(), 3, none, Deadline::After(Duration(1000)), "a").ok());
  f = ReadFrame(a.get(), 100, Deadline::After(Duration(1000)), "b");
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(f->payload, "");
}

TEST(FrameTest, HeaderLayout) {
  const std::string bytes = EncodeFrame(0x0102, "xyz");
  EXPECT_EQ(bytes, std::string("\x03\x00\x00\x00\x02\x01\x01\x00xyz", 11));
}

TEST(FrameTest, OversizedFrameIsCorruptionNamingSizeAndPeer) {
  auto [a, b] = LoopbackPair();
  ASSERT_TRUE(WriteFrame(b.get(), 1, std::string(101, 'x'), Deadline::After(Duration(1000)), "a").ok());
  Result<Frame> f = ReadFrame(a.get(), 100, Deadline::After(Duration(1000)), "10.1.2.3:99");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_NE(f.status().message().find("101 bytes from 10.1.2.3:99"), std::string::npos)
      << f.status().message();
}

TEST(FrameTest, UnknownVersionIsCorruption) {
  auto [a, b] = LoopbackPair();
  codec::Writer w;
  w.PutU32(0);
  w.PutU16(1);
  w.PutU16(9);
  ASSERT_TRUE(WriteAll(b.get(), w.data().data(), w.data().size(), Deadline::After(Duration(1000)), "w").ok());
  Result<Frame> f = ReadFrame(a.get(), 100, Deadline::After(Duration(1000)), "peer");
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), StatusCode::kCorruption);
  EXPECT_NE(f.status().message().find("version 9"), std::string::npos);
}

}  // namespace
}  // namespace ember::tcp
