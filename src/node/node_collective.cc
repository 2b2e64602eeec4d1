// Node::OpenCommunicator and the rule that fills a node's communicator
// options, apart from node.cc like OpenFeed: a program without collectives
// does not link them.
#include <string>
#include <utility>

#include "ember/collective.h"
#include "ember/node.h"
#include "ember/roles.h"

namespace ember {

Result<collective::CommunicatorOptions> NodeCommunicatorOptions(const NodeContext& context,
                                                                collective::CommunicatorOptions options) {
  const std::string label = context.job_name + ":" + std::to_string(context.task_index);
  std::optional<int> rank = context.training_rank();
  if (!rank) {
    if (!IsTrainingRole(context.job_name)) {
      return Status::InvalidArgument("node " + label +
                                     " is not a training node; collectives join only "
                                     "chief/master/worker nodes");
    }
    return Status::InvalidArgument("node " + label +
                                   " is not in its cluster spec; collectives need every training "
                                   "node's address (a start-up message from Cluster.run has them)");
  }
  const std::string& address = context.cluster_spec.at(context.job_name)[context.task_index];
  options.rank = *rank;
  options.size = context.num_workers();
  options.host = address.substr(0, address.rfind(':'));
  options.name = label;
  options.bind_host = context.bind_host.empty() ? options.host : context.bind_host;
  options.secret = context.secret;
  options.prefix = "ember-" + (context.job_id.empty() ? std::string("job") : context.job_id) + "-c0";
  return options;
}

Result<std::unique_ptr<collective::Communicator>> Node::OpenCommunicator(
    collective::CommunicatorOptions options) const {
  EMBER_ASSIGN_OR_RAISE(options, NodeCommunicatorOptions(context_, std::move(options)));
  ClientOptions client_options;
  client_options.connect_timeout = context_.connect_timeout;
  auto client = CoordinatorClient::Connect(context_.coordinator_host, context_.coordinator_port,
                                           context_.secret, client_options);
  if (!client.ok()) return client.status().WithContext("node " + label() + ": collectives' store");
  auto store = collective::NewCoordinatorStore(std::shared_ptr<CoordinatorClient>(client.MoveValueUnsafe()));
  auto comm = collective::Communicator::Create(options, std::move(store));
  if (!comm.ok()) return comm.status().WithContext("node " + label());
  return comm;
}

}  // namespace ember
