// tcp::Acceptor's hand-over mode (serve mode is tested through tcp::Server,
// server_test.cc): admitted sockets are queued for Take(), refused ones are
// logged and closed, and the handshake cap holds as in serve mode.
#include "transport/tcp/acceptor.h"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "common/test_util.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ember::tcp {
namespace {

using ember::testing::WaitUntil;

const std::string kSecret = "0123456789abcdef-acceptor-test";
constexpr uint16_t kHello = 0x0101;

Deadline Soon() { return Deadline::After(Duration(5000)); }

AcceptorOptions Options() {
  AcceptorOptions o;
  o.name = "test acceptor";
  o.secret = kSecret;
  o.handshake_timeout = Duration(3000);
  o.max_pending_handshakes = 4;
  return o;
}

// Admits a peer whose first frame is a hello saying "let me in".
Status AdmitHello(int fd, const std::string& peer, Deadline deadline) {
  EMBER_ASSIGN_OR_RAISE(Frame f, ReadFrame(fd, 64, deadline, peer));
  if (f.type != kHello || f.payload != "let me in") return Status::InvalidArgument("not a hello: " + f.payload);
  return WriteFrame(fd, kHello, "welcome", deadline, peer);
}

std::unique_ptr<Acceptor> StartHandOver() {
  auto listener = Listen("127.0.0.1", 0);
  EXPECT_TRUE(listener.ok());
  auto acceptor = Acceptor::HandOver(Options(), listener.MoveValueUnsafe(), AdmitHello);
  EXPECT_TRUE(acceptor.ok()) << acceptor.status().ToString();
  return acceptor.MoveValueUnsafe();
}

// Dials, authenticates and says `hello`; the reply frame's payload ("" if none).
Result<Fd> DialAndSay(int port, const std::string& hello, std::string* reply) {
  EMBER_ASSIGN_OR_RAISE(Fd fd, Dial("127.0.0.1", port, kSecret, Soon(), "test acceptor"));
  EMBER_RETURN_NOT_OK(WriteFrame(fd.get(), kHello, hello, Soon(), "test acceptor"));
  Result<Frame> f = ReadFrame(fd.get(), 64, Soon(), "test acceptor");
  *reply = f.ok() ? f->payload : "";
  return fd;
}

TEST(TcpAcceptorTest, HandOverGivesTheAdmittedSocketToTake) {
  auto acceptor = StartHandOver();
  std::string reply;
  auto client = DialAndSay(acceptor->port(), "let me in", &reply);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ(reply, "welcome");
  Result<Fd> taken = acceptor->Take(Soon());
  ASSERT_TRUE(taken.ok()) << taken.status().ToString();
  // The socket is the caller's now: it outlives the acceptor and still talks to the client.
  acceptor->Close();
  ASSERT_TRUE(WriteFrame(taken->get(), 9, "after close", Soon(), "client").ok());
  auto f = ReadFrame(client->get(), 64, Soon(), "acceptor");
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->payload, "after close");
  EXPECT_EQ(acceptor->stats().accepted, 1u);
}

TEST(TcpAcceptorTest, RefusedAndUnauthenticatedPeersAreLoggedAndNeverTaken) {
  ember::testing::WarningCapture log;
  auto acceptor = StartHandOver();
  const int port = acceptor->port();
  // Wrong secret: fails the handshake.
  auto wrong = Dial("127.0.0.1", port, "another-secret-0123456789", Soon(), "test acceptor");
  EXPECT_EQ(wrong.status().code(), StatusCode::kUnauthenticated) << wrong.status().ToString();
  // The client learns its verdict before the acceptor's thread records the rejection: wait
  // for it, so that the next rejection is the last one (each peer has a thread of its own).
  EXPECT_TRUE(WaitUntil([&] { return acceptor->stats().rejected == 1; })) << acceptor->stats().rejected;
  // Right secret, wrong hello: refused by admit, the socket closed.
  std::string reply;
  auto refused = DialAndSay(port, "something else", &reply);
  ASSERT_TRUE(refused.ok());
  EXPECT_EQ(reply, "");
  EXPECT_TRUE(WaitUntil([&] { return acceptor->stats().rejected == 2; })) << acceptor->stats().rejected;
  EXPECT_EQ(log.Count("test acceptor: rejected unauthenticated connection from 127.0.0.1:"), 1);
  EXPECT_EQ(log.Count("test acceptor: rejected connection from 127.0.0.1:"), 1);
  EXPECT_NE(acceptor->last_rejection().find("not a hello: something else"), std::string::npos)
      << acceptor->last_rejection();
  Result<Fd> none = acceptor->Take(Deadline::After(Duration(100)));
  EXPECT_EQ(none.status().code(), StatusCode::kDeadlineExceeded) << none.status().ToString();
  // A good peer still gets in.
  ASSERT_TRUE(DialAndSay(port, "let me in", &reply).ok());
  EXPECT_TRUE(acceptor->Take(Soon()).ok());
}

TEST(TcpAcceptorTest, CloseWakesABlockedTake) {
  auto acceptor = StartHandOver();
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    acceptor->Close();
  });
  Result<Fd> r = acceptor->Take(Deadline::Infinite());
  closer.join();
  EXPECT_EQ(r.status().code(), StatusCode::kAborted) << r.status().ToString();
}

TEST(TcpAcceptorTest, TakeInServeModeIsAnError) {
  auto listener = Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  auto acceptor = Acceptor::Serve(Options(), listener.MoveValueUnsafe(), [](Connection&) {});
  ASSERT_TRUE(acceptor.ok());
  EXPECT_EQ((*acceptor)->Take(Soon()).status().code(), StatusCode::kInternal);
}

TEST(TcpAcceptorTest, OptionsAreValidated) {
  AcceptorOptions o = Options();
  o.secret = "short";
  auto listener = Listen("127.0.0.1", 0);
  ASSERT_TRUE(listener.ok());
  EXPECT_EQ(Acceptor::HandOver(o, listener.MoveValueUnsafe(), AdmitHello).status().code(),
            StatusCode::kInvalidArgument);
  o = Options();
  o.max_pending_handshakes = 0;
  EXPECT_EQ(ValidateAcceptorOptions(o).code(), StatusCode::kInvalidArgument);
}

// Silent peers fill the handshake slots (4) many times over; the real peer
// is still admitted and taken within one handshake timeout.
TEST(TcpAcceptorTest, HandOverFloodOfSilentPeersDoesNotKeepTheRealOneOut) {
  auto acceptor = StartHandOver();
  const int port = acceptor->port();
  std::vector<Fd> silent;
  for (int i = 0; i < 40; ++i) {
    auto fd = Connect("127.0.0.1", port, Soon());
    ASSERT_TRUE(fd.ok());
    silent.push_back(fd.MoveValueUnsafe());
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::string reply;
  auto client = DialAndSay(port, "let me in", &reply);
  ASSERT_TRUE(client.ok()) << client.status().ToString();
  EXPECT_EQ(reply, "welcome");
  EXPECT_TRUE(acceptor->Take(Soon()).ok());
  EXPECT_LT(std::chrono::steady_clock::now() - t0, Options().handshake_timeout);
  EXPECT_TRUE(WaitUntil([&] { return acceptor->stats().dropped_pending >= 1; }));
}

}  // namespace
}  // namespace ember::tcp
