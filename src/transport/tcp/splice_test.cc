// tcp::Splice over real loopback sockets: two pairs, the splice between their
// inner ends, the test talking through the outer ends.
#include "transport/tcp/splice.h"

#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>

#include <future>
#include <string>
#include <thread>
#include <tuple>

#include "transport/tcp/socket.h"
#include "transport/tcp/test_util.h"

namespace ember::tcp {
namespace {

using testing::LoopbackPair;
constexpr Duration kLong{20000};

// outer_a <-> inner_a ==Splice== inner_b <-> outer_b
struct Spliced {
  Fd outer_a, inner_a, inner_b, outer_b;
  std::future<SpliceResult> result;

  explicit Spliced(SpliceOptions options = {}) {
    std::tie(inner_a, outer_a) = LoopbackPair();
    std::tie(inner_b, outer_b) = LoopbackPair();
    result = std::async(std::launch::async, [this, options] {
      SpliceResult r = Splice(inner_a.get(), inner_b.get(), "side a", "side b", options);
      // What the relay does next: both sockets down, so each peer sees the close.
      ::shutdown(inner_a.get(), SHUT_RDWR);
      ::shutdown(inner_b.get(), SHUT_RDWR);
      return r;
    });
  }
  ~Spliced() {
    if (result.valid()) {
      ::shutdown(inner_a.get(), SHUT_RDWR);
      result.wait();
    }
  }
};

// Reads until EOF (or an error, or `limit` bytes).
std::string ReadToEnd(int fd, size_t limit) {
  std::string out;
  char buf[1 << 16];
  const Deadline deadline = Deadline::After(kLong);
  while (out.size() < limit && !deadline.expired()) {
    const ssize_t r = ::recv(fd, buf, sizeof(buf), 0);
    if (r > 0) {
      out.append(buf, static_cast<size_t>(r));
    } else if (r == 0) {
      break;
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      pollfd p{fd, POLLIN, 0};
      (void)::poll(&p, 1, 100);
    } else if (errno != EINTR) {
      break;
    }
  }
  return out;
}

std::string Pattern(size_t n, unsigned seed) {
  std::string s(n, '\0');
  uint32_t x = seed * 2654435761u + 1;
  for (char& c : s) {
    x = x * 1664525u + 1013904223u;
    c = static_cast<char>(x >> 24);
  }
  return s;
}

TEST(SpliceTest, BytesGoBothWays) {
  Spliced s;
  ASSERT_TRUE(WriteAll(s.outer_a.get(), "ping", 4, Deadline::After(kLong), "a").ok());
  char buf[4];
  ASSERT_TRUE(ReadExactly(s.outer_b.get(), buf, 4, Deadline::After(kLong), "b").ok());
  EXPECT_EQ(std::string(buf, 4), "ping");
  ASSERT_TRUE(WriteAll(s.outer_b.get(), "pong", 4, Deadline::After(kLong), "b").ok());
  ASSERT_TRUE(ReadExactly(s.outer_a.get(), buf, 4, Deadline::After(kLong), "a").ok());
  EXPECT_EQ(std::string(buf, 4), "pong");
  ASSERT_TRUE(s.outer_a.Close().ok());
  SpliceResult r = s.result.get();
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.closed_by, "side a");
  EXPECT_EQ(r.a_to_b, 4u);
  EXPECT_EQ(r.b_to_a, 4u);
}

// Several MB each way at once, through small buffers: neither direction may
// wait on the other (a splice that blocked writing one way while the other
// way filled up would deadlock here).
TEST(SpliceTest, LargeTransfersBothWaysAtOnceDoNotDeadlock) {
  SpliceOptions o;
  o.buffer_bytes = 4096;
  Spliced s(o);
  const size_t n = 8 << 20;
  const std::string to_b = Pattern(n, 1), to_a = Pattern(n, 2);
  // Both writers start before either reader: the socket buffers fill both ways.
  auto write_a = std::async(std::launch::async, [&] {
    return WriteAll(s.outer_a.get(), to_b.data(), n, Deadline::After(kLong), "a");
  });
  auto write_b = std::async(std::launch::async, [&] {
    return WriteAll(s.outer_b.get(), to_a.data(), n, Deadline::After(kLong), "b");
  });
  auto read_b = std::async(std::launch::async, [&] { return ReadToEnd(s.outer_b.get(), n); });
  auto read_a = std::async(std::launch::async, [&] { return ReadToEnd(s.outer_a.get(), n); });
  EXPECT_TRUE(write_a.get().ok());
  EXPECT_TRUE(write_b.get().ok());
  const std::string got_b = read_b.get(), got_a = read_a.get();
  EXPECT_EQ(got_b.size(), n);
  EXPECT_EQ(got_a.size(), n);
  EXPECT_TRUE(got_b == to_b);
  EXPECT_TRUE(got_a == to_a);
  ::shutdown(s.outer_b.get(), SHUT_RDWR);
  SpliceResult r = s.result.get();
  EXPECT_EQ(r.a_to_b, n);
  EXPECT_EQ(r.b_to_a, n);
}

// A side that sends and closes: the other side gets every byte, then EOF.
TEST(SpliceTest, EofReachesTheOtherSideAfterTheLastBytes) {
  Spliced s;
  const std::string last = Pattern(1 << 20, 3);
  auto reader = std::async(std::launch::async, [&] { return ReadToEnd(s.outer_a.get(), SIZE_MAX); });
  ASSERT_TRUE(WriteAll(s.outer_b.get(), last.data(), last.size(), Deadline::After(kLong), "b").ok());
  ASSERT_TRUE(s.outer_b.Close().ok());
  EXPECT_TRUE(reader.get() == last);  // returns only at EOF
  SpliceResult r = s.result.get();
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.closed_by, "side b");
  EXPECT_EQ(r.b_to_a, last.size());
}

// shutdown(2) of a spliced socket from another thread ends the splice.
TEST(SpliceTest, ShutdownFromAnotherThreadEndsIt) {
  Spliced s;
  ASSERT_EQ(s.result.wait_for(std::chrono::milliseconds(50)), std::future_status::timeout);
  ::shutdown(s.inner_b.get(), SHUT_RDWR);
  ASSERT_EQ(s.result.wait_for(kLong), std::future_status::ready);
  SpliceResult r = s.result.get();
  EXPECT_TRUE(r.status.ok()) << r.status.ToString();
  EXPECT_EQ(r.closed_by, "side b");
  // The outer end of a sees its connection close.
  EXPECT_EQ(ReadToEnd(s.outer_a.get(), 1), "");
}

// A reset connection is an error naming the side.
TEST(SpliceTest, ResetIsAnErrorNamingTheSide) {
  Spliced s;
  linger hard{1, 0};  // close sends RST
  ASSERT_EQ(::setsockopt(s.outer_a.get(), SOL_SOCKET, SO_LINGER, &hard, sizeof(hard)), 0);
  ASSERT_TRUE(s.outer_a.Close().ok());
  SpliceResult r = s.result.get();
  EXPECT_EQ(r.status.code(), StatusCode::kIOError) << r.status.ToString();
  EXPECT_NE(r.status.message().find("read from side a"), std::string::npos) << r.status.message();
}

}  // namespace
}  // namespace ember::tcp
