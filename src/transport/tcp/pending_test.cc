#include "transport/tcp/pending.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "common/fd.h"

namespace ember::tcp {
namespace {

// A connected socket pair: PendingHandshakes gets `near`; the test reads `far`.
struct Pair {
  Fd near, far;
};

Pair MakePair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  return {Fd(sv[0]), Fd(sv[1])};
}

// True if `far` reads EOF: the near end was shut down.
bool ShutDown(const Pair& p) {
  char c;
  return ::recv(p.far.get(), &c, 1, MSG_DONTWAIT) == 0;
}

TEST(PendingHandshakes, BelowTheCapNothingIsDropped) {
  PendingHandshakes pending(3);
  std::vector<Pair> pairs;
  for (uint64_t id = 1; id <= 3; ++id) {
    pairs.push_back(MakePair());
    EXPECT_EQ(pending.Start(id, pairs.back().near.get(), "10.0.0.1:" + std::to_string(id)), "");
  }
  EXPECT_EQ(pending.pending(), 3u);
  EXPECT_FALSE(pending.Finish(2));
  EXPECT_EQ(pending.pending(), 2u);
  for (const Pair& p : pairs) EXPECT_FALSE(ShutDown(p));
  EXPECT_EQ(pending.dropped(), 0u);
}

// Full: the newcomer is admitted and the oldest pending connection goes.
TEST(PendingHandshakes, FullDropsTheOldestAndAdmitsTheNewcomer) {
  PendingHandshakes pending(2);
  Pair a = MakePair(), b = MakePair(), c = MakePair();
  EXPECT_EQ(pending.Start(1, a.near.get(), "10.0.0.1:1"), "");
  EXPECT_EQ(pending.Start(2, b.near.get(), "10.0.0.1:2"), "");
  EXPECT_EQ(pending.Start(3, c.near.get(), "10.0.0.1:3"), "10.0.0.1:1");
  EXPECT_TRUE(ShutDown(a));
  EXPECT_FALSE(ShutDown(b));
  EXPECT_FALSE(ShutDown(c));
  EXPECT_EQ(pending.pending(), 2u);
  EXPECT_EQ(pending.dropped(), 1u);
  EXPECT_TRUE(pending.Finish(1));   // its handshake failed because it was dropped
  EXPECT_FALSE(pending.Finish(1));  // said once
  EXPECT_FALSE(pending.Finish(3));
}

// A flood from one address evicts its own connections, never an older
// client of another address.
TEST(PendingHandshakes, TheAddressHoldingMostSlotsLosesOne) {
  PendingHandshakes pending(4);
  Pair client = MakePair();
  EXPECT_EQ(pending.Start(1, client.near.get(), "10.0.0.2:5000"), "");
  std::vector<Pair> flood;
  for (uint64_t id = 2; id < 100; ++id) {
    flood.push_back(MakePair());
    const std::string dropped = pending.Start(id, flood.back().near.get(), "10.0.0.66:" + std::to_string(id));
    if (id > 4) {
      EXPECT_EQ(dropped, "10.0.0.66:" + std::to_string(id - 3)) << "connection " << id;
    }
  }
  EXPECT_FALSE(ShutDown(client));
  EXPECT_FALSE(pending.Finish(1));  // the client finished its handshake undisturbed
  EXPECT_EQ(pending.dropped(), 95u);
}

TEST(PendingHandshakes, ShutdownAllWakesEveryPendingConnection) {
  PendingHandshakes pending(8);
  Pair a = MakePair(), b = MakePair(), done = MakePair();
  (void)pending.Start(1, a.near.get(), "[::1]:1");
  (void)pending.Start(2, b.near.get(), "[::1]:2");
  (void)pending.Start(3, done.near.get(), "[::1]:3");
  EXPECT_FALSE(pending.Finish(3));
  pending.ShutdownAll();
  EXPECT_TRUE(ShutDown(a));
  EXPECT_TRUE(ShutDown(b));
  EXPECT_FALSE(ShutDown(done));
}

}  // namespace
}  // namespace ember::tcp
