#include "transport/tcp/handshake.h"

#include <gtest/gtest.h>

#include <sys/socket.h>

#include <thread>

#include "transport/tcp/socket.h"
#include "transport/tcp/test_util.h"

namespace ember::tcp {
namespace {

using testing::LoopbackPair;
const std::string kSecret = "0123456789abcdef-secret";

struct Outcome {
  Status server, client;
};

Outcome RunHandshake(const std::string& server_secret, const std::string& client_secret) {
  auto [s, c] = LoopbackPair();
  Outcome out;
  std::thread t([&, fd = s.get()] {
    out.server = ServerHandshake(fd, server_secret, Deadline::After(Duration(2000)), "client");
    if (!out.server.ok()) ::shutdown(fd, SHUT_RDWR);  // the server closes on failure
  });
  out.client = ClientHandshake(c.get(), client_secret, Deadline::After(Duration(2000)), "server");
  t.join();
  return out;
}

TEST(HandshakeTest, MatchingSecretsSucceed) {
  Outcome o = RunHandshake(kSecret, kSecret);
  EXPECT_TRUE(o.server.ok()) << o.server.ToString();
  EXPECT_TRUE(o.client.ok()) << o.client.ToString();
}

TEST(HandshakeTest, WrongSecretRejectedBothWays) {
  Outcome o = RunHandshake(kSecret, "another-secret-of-16+");
  EXPECT_EQ(o.server.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(o.server.message(), "bad HMAC");
  EXPECT_EQ(o.client.code(), StatusCode::kUnauthenticated);
}

// Regression: a feed server whose node was exiting closed the connection after
// the client's HMAC, and the driver reported "the job secret does not match".
TEST(HandshakeTest, ServerClosingBeforeVerdictIsUnavailableNotUnauthenticated) {
  auto [s, c] = LoopbackPair();
  std::thread t([fd = s.get()] {
    std::string hello(kHandshakeMagic, sizeof(kHandshakeMagic));
    hello += std::string("\x01\x00", 2) + std::string(kNonceBytes, 'n');
    ASSERT_TRUE(WriteAll(fd, hello.data(), hello.size(), Deadline::After(Duration(1000)), "w").ok());
    unsigned char reply[kNonceBytes + kMacBytes];
    ASSERT_TRUE(ReadExactly(fd, reply, sizeof(reply), Deadline::After(Duration(1000)), "r").ok());
    ::shutdown(fd, SHUT_RDWR);  // goes away without a verdict
  });
  Status st = ClientHandshake(c.get(), kSecret, Deadline::After(Duration(2000)), "server");
  t.join();
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("closed the connection during the handshake"), std::string::npos);
}

TEST(HandshakeTest, SilentClientTimesOut) {
  auto [s, c] = LoopbackPair();
  const auto start = Deadline::Clock::now();
  Status st = ServerHandshake(s.get(), kSecret, Deadline::After(Duration(100)), "client");
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_LT(Deadline::Clock::now() - start, Duration(2000));
}

TEST(HandshakeTest, ClientRejectsNonEmberServer) {
  auto [s, c] = LoopbackPair();
  const std::string junk(38, 'J');
  ASSERT_TRUE(WriteAll(s.get(), junk.data(), junk.size(), Deadline::After(Duration(1000)), "w").ok());
  Status st = ClientHandshake(c.get(), kSecret, Deadline::After(Duration(1000)), "server");
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_NE(st.message().find("not an Ember server"), std::string::npos);
}

}  // namespace
}  // namespace ember::tcp
