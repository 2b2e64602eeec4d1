// Node::OpenSummaryWriter, apart from node.cc like OpenFeed.
#include <string>
#include <utility>

#include "ember/fs.h"
#include "ember/node.h"
#include "ember/summary.h"

namespace ember {

Result<std::unique_ptr<summary::EventWriter>> Node::OpenSummaryWriter(
    summary::EventWriterOptions options) const {
  if (context_.log_dir.empty()) {
    return Status::InvalidArgument("node " + label() +
                                   ": no log dir for summaries; pass log_dir to Cluster.run");
  }
  const fs::ResolveOptions resolve = fs::JobResolveOptions(context_.default_fs, context_.hdfs_http_address);
  const std::string dir = summary::NodeLogDir(context_.log_dir, context_.job_name, context_.task_index);
  EMBER_ASSIGN_OR_RAISE(fs::Resolved r, fs::ResolveFileSystem(dir, resolve));
  auto writer = summary::EventWriter::Open(r.fs, r.path, std::move(options));
  if (!writer.ok()) return writer.status().WithContext("node " + label());
  return writer;
}

}  // namespace ember
