// WebHDFS answers parsed without a server (webhdfs.h).
#include <gtest/gtest.h>

#include "fs/webhdfs.h"

namespace ember::fs::internal {
namespace {

TEST(WebHdfsJson, FileStatus) {
  auto r = ParseFileStatus(
      R"({"FileStatus":{"length":42,"modificationTime":1700000000123,"pathSuffix":"","type":"FILE"}})", "x");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->name, "x");
  EXPECT_EQ(r->size, 42u);
  EXPECT_FALSE(r->is_dir);
  EXPECT_EQ(r->mtime_ms, 1700000000123);
}

TEST(WebHdfsJson, FileStatusesSortedByName) {
  auto r = ParseFileStatuses(R"({"FileStatuses":{"FileStatus":[
      {"length":0,"pathSuffix":"b","type":"DIRECTORY"},{"length":3,"pathSuffix":"a","type":"FILE"}]}})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->size(), 2u);
  EXPECT_EQ((*r)[0].name, "a");
  EXPECT_TRUE((*r)[1].is_dir);
}

TEST(WebHdfsJson, MalformedIsCorruption) {
  for (const char* bad : {"", "{", "[]", R"({"FileStatus":{"length":"x","pathSuffix":"","type":"FILE"}})",
                          R"({"FileStatus":{"length":-1,"pathSuffix":"","type":"FILE"}})", R"({"boolean":1})"}) {
    EXPECT_EQ(ParseFileStatus(bad, "n").status().code(), StatusCode::kCorruption) << bad;
    EXPECT_EQ(ParseFileStatuses(bad).status().code(), StatusCode::kCorruption) << bad;
    EXPECT_EQ(ParseBoolean(bad).status().code(), StatusCode::kCorruption) << bad;
  }
  EXPECT_EQ(ParseBoolean(R"({"boolean":true})").ValueOr(false), true);
}

TEST(WebHdfsJson, RemoteExceptionMapsToCodes) {
  Status st = ErrorFromResponse(
      404, R"({"RemoteException":{"exception":"FileNotFoundException","message":"File /nope not found."}})",
      "hdfs://nn/nope: OPEN");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
  EXPECT_EQ(st.message(), "hdfs://nn/nope: OPEN: FileNotFoundException: File /nope not found.");
  EXPECT_EQ(ErrorFromResponse(403, R"({"RemoteException":{"exception":"SafeModeException","message":"m"}})", "c").code(),
            StatusCode::kUnavailable);
  EXPECT_EQ(ErrorFromResponse(403, R"({"RemoteException":{"exception":"AccessControlException","message":"m"}})", "c").code(),
            StatusCode::kIOError);
  st = ErrorFromResponse(500, "<html>oops</html>", "ctx");
  EXPECT_EQ(st.code(), StatusCode::kIOError);
  EXPECT_EQ(st.message(), "ctx: HTTP 500: <html>oops</html>");
}

}  // namespace
}  // namespace ember::fs::internal
