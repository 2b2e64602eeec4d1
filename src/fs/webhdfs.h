// The WebHDFS file system's answers, parsed (webhdfs.cc holds the file
// system; NewHdfsFileSystem in ember/fs.h makes one).  Split out so the
// parsing of the server's JSON is tested without a server.
//
// WebHDFS (https://hadoop.apache.org/docs/r3.4.1/hadoop-project-dist/hadoop-hdfs/WebHDFS.html):
// every operation is an HTTP request to the NameNode's
// /webhdfs/v1/<path>?op=<OP>&user.name=<user>; reads and writes are
// redirected (307) to a DataNode.  Answers are JSON: {"FileStatus": {...}},
// {"FileStatuses": {"FileStatus": [...]}}, {"boolean": b}; failures are
// {"RemoteException": {"exception": "...", "message": "..."}}.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "ember/fs.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::fs::internal {

// The FileInfo of one FileStatus object (`name` from its pathSuffix, or
// `name_if_empty` when that is empty, as GETFILESTATUS answers).
// Corruption when the JSON text is not a FileStatus answer.
Result<FileInfo> ParseFileStatus(std::string_view json, const std::string& name_if_empty);
// The entries of a LISTSTATUS answer, sorted by name.
Result<std::vector<FileInfo>> ParseFileStatuses(std::string_view json);
// The value of a {"boolean": b} answer.
Result<bool> ParseBoolean(std::string_view json);

// The Status for a failed request: `context` (URI, operation, offset)
// followed by the RemoteException's class and message when the body holds
// one, else the HTTP status and the start of the body.
// FileNotFoundException -> NotFound, FileAlreadyExistsException ->
// AlreadyExists, Standby/SafeMode/Retriable -> Unavailable, else IOError.
Status ErrorFromResponse(long http_status, std::string_view body, const std::string& context);

// The name of the process's effective user ("uid<n>" when it has none), the
// HDFS user when HdfsOptions.user is empty.
std::string ProcessUserName();

}  // namespace ember::fs::internal
