#include "common/fd.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

namespace ember {
namespace {

bool IsOpen(int fd) { return ::fcntl(fd, F_GETFD) != -1; }

TEST(FdTest, ClosesOnDestruction) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  {
    Fd r(fds[0]), w(fds[1]);
    EXPECT_TRUE(r.valid());
  }
  EXPECT_FALSE(IsOpen(fds[0]));
  EXPECT_FALSE(IsOpen(fds[1]));
}

TEST(FdTest, CloseIsIdempotent) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  Fd r(fds[0]), w(fds[1]);
  EXPECT_TRUE(r.Close().ok());
  EXPECT_FALSE(r.valid());
  EXPECT_TRUE(r.Close().ok());
  EXPECT_TRUE(Fd().Close().ok());
}

TEST(FdTest, DetachReleasesOwnership) {
  int fds[2];
  ASSERT_EQ(::pipe2(fds, O_CLOEXEC), 0);
  int raw;
  {
    Fd r(fds[0]);
    raw = r.Detach();
    EXPECT_FALSE(r.valid());
  }
  EXPECT_TRUE(IsOpen(raw));
  ::close(raw);
  ::close(fds[1]);
}

TEST(FdTest, MoveTransfersAndAssignmentClosesOld) {
  int a[2], b[2];
  ASSERT_EQ(::pipe2(a, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(b, O_CLOEXEC), 0);
  Fd x(a[0]);
  Fd y(std::move(x));
  EXPECT_FALSE(x.valid());  // NOLINT(bugprone-use-after-move): moved-from is empty by contract
  EXPECT_EQ(y.get(), a[0]);
  Fd z(b[0]);
  z = std::move(y);
  EXPECT_FALSE(IsOpen(b[0]));
  EXPECT_EQ(z.get(), a[0]);
  ::close(a[1]);
  ::close(b[1]);
}

}  // namespace
}  // namespace ember
