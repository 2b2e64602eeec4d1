#include "ember/status.h"

#include <errno.h>
#include <gtest/gtest.h>

#include "ember/result.h"

namespace ember {
namespace {

TEST(StatusTest, OkHasEmptyMessage) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), StatusCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.ToString(), "OK");
  EXPECT_EQ(&Status::OK().message(), &Status().message());  // one static empty string
}

TEST(StatusTest, CodeNamesAndToString) {
  EXPECT_EQ(StatusCodeName(StatusCode::kDeadlineExceeded), "DeadlineExceeded");
  EXPECT_EQ(StatusCodeName(StatusCode::kUnauthenticated), "Unauthenticated");
  Status s = Status::NotFound("file x");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.ToString(), "NotFound: file x");
}

TEST(StatusTest, FromErrno) {
  Status s = Status::FromErrno(ECONNREFUSED, "connect to 10.0.0.1:7077");
  EXPECT_EQ(s.code(), StatusCode::kIOError);
  EXPECT_EQ(s.message(), "connect to 10.0.0.1:7077: Connection refused");
}

TEST(StatusTest, WithContextPrepends) {
  Status s = Status::Corruption("bad byte").WithContext("frame from 1.2.3.4:5");
  EXPECT_EQ(s.code(), StatusCode::kCorruption);
  EXPECT_EQ(s.message(), "frame from 1.2.3.4:5: bad byte");
  EXPECT_TRUE(Status::OK().WithContext("x").ok());
}

TEST(StatusTest, EqualityAndCopies) {
  Status a = Status::Aborted("x");
  Status b = a;
  EXPECT_EQ(a, b);
  EXPECT_FALSE(a == Status::Aborted("y"));
  EXPECT_EQ(Status(StatusCode::kOk, "ignored"), Status::OK());
}

Result<int> Half(int x) {
  if (x % 2) return Status::InvalidArgument("odd");
  return x / 2;
}
Status UseHalf(int x, int* out) {
  EMBER_ASSIGN_OR_RAISE(*out, Half(x));
  EMBER_RETURN_NOT_OK(Status::OK());
  return Status::OK();
}

TEST(ResultTest, PropagatesThroughMacros) {
  int v = 0;
  EXPECT_TRUE(UseHalf(4, &v).ok());
  EXPECT_EQ(v, 2);
  EXPECT_EQ(UseHalf(3, &v).code(), StatusCode::kInvalidArgument);
  Result<int> r = Status::OK();  // a bug, reported as Internal
  EXPECT_EQ(r.status().code(), StatusCode::kInternal);
  EXPECT_EQ(r.ValueOr(7), 7);
}

TEST(ResultDeathTest, TakingAMissingValueEndsTheProcessWithItsStatusInEveryBuild) {
  Result<int> r = Status::NotFound("no such node");
  EXPECT_DEATH((void)*r, "holds none: NotFound: no such node");
  EXPECT_DEATH((void)r.MoveValueUnsafe(), "holds none: NotFound: no such node");
}

}  // namespace
}  // namespace ember
