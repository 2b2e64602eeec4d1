#include "ember/node.h"

#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>
#include <utility>

#include "common/fd.h"
#include "node/startup.h"

namespace ember {

Result<NodeContext> ReadNodeContext(int fd) {
  std::string bytes;
  char buf[64 * 1024];
  while (true) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::FromErrno(errno, "read the node start-up message from descriptor " +
                                          std::to_string(fd));
    }
    bytes.append(buf, static_cast<size_t>(n));
  }
  return node::DecodeStartup(bytes);
}

Result<std::unique_ptr<Node>> Node::FromEnvironment() {
  const char* value = ::getenv(kStartupFdEnv);
  if (value == nullptr || *value == '\0') {
    return Status::InvalidArgument(std::string(kStartupFdEnv) +
                                   " is not set: this program must be started as an Ember node, "
                                   "by ember.Cluster.run(spark, [\"/path/to/program\", ...], ...)");
  }
  char* end = nullptr;
  errno = 0;
  long fd = ::strtol(value, &end, 10);
  if (errno != 0 || *end != '\0' || fd < 0 || fd > 1 << 20) {
    return Status::InvalidArgument(std::string(kStartupFdEnv) + "=\"" + value +
                                   "\" is not a file descriptor number");
  }
  Fd owned(static_cast<int>(fd));  // read once, then closed
  ::unsetenv(kStartupFdEnv);
  EMBER_ASSIGN_OR_RAISE(NodeContext context, ReadNodeContext(owned.get()));
  EMBER_RETURN_NOT_OK(owned.Close());
  return Open(std::move(context));
}

Result<std::unique_ptr<Node>> Node::Open(NodeContext context) {
  ClientOptions options;
  options.connect_timeout = context.connect_timeout;
  const std::string label = context.job_name + ":" + std::to_string(context.task_index);
  auto client = CoordinatorClient::Connect(context.coordinator_host, context.coordinator_port,
                                           context.secret, options);
  if (!client.ok()) return client.status().WithContext("node " + label);
  std::unique_ptr<CoordinatorClient> c = client.MoveValueUnsafe();
  EMBER_RETURN_NOT_OK(c->Attach(context.executor_id).WithContext("node " + label));
  return std::unique_ptr<Node>(new Node(std::move(context), std::move(c)));
}

Node::Node(NodeContext context, std::unique_ptr<CoordinatorClient> client)
    : context_(std::move(context)), client_(std::move(client)) {}

Node::~Node() { client_->Close(); }

std::string Node::label() const {
  return context_.job_name + ":" + std::to_string(context_.task_index);
}

Status Node::Report(const std::map<std::string, double>& metrics) {
  return client_->Report(metrics);
}

Status Node::KvSet(const std::string& key, const std::string& value) {
  return client_->KvSet(key, value);
}

Result<std::string> Node::KvGet(const std::string& key, Duration timeout) {
  return client_->KvGet(key, timeout);
}

Status Node::Barrier(const std::string& name, Duration timeout) {
  return client_->Barrier(name, timeout);
}

}  // namespace ember
