// cpp_trainer: a C++ Ember node.  Softmax regression on Fashion-MNIST fed by
// Spark (InputMode.SPARK), synchronous model averaging with the job's
// collectives, then inference through the same process.
//
//   ember.Cluster.run(spark, ["build/cpp_trainer/cpp_trainer", "--epochs=3"],
//                     num_executors=2, input_mode=ember.InputMode.SPARK)
//   cluster.train(train_df, num_epochs=3)       # same count as --epochs
//   cluster.inference(test_df, output_schema="prediction long")
//
// The program learns which phase it is in from its own argv: it trains for
// --epochs feed epochs (cluster.train's num_epochs), then answers inference
// rows until the feed ends (cluster.shutdown).  Every node reads the same
// number of batches per epoch (the feed's equal-rows rule), so every node
// reaches each averaging round; a round is one allreduce (average) of the
// parameters over the training nodes' communicator (Node::OpenCommunicator).
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "arrow_rows.h"
#include "ember/node.h"
#include "softmax.h"

namespace cpp_trainer {
namespace {

using ember::Duration;
using ember::Status;

struct Flags {
  int epochs = 3;
  int batch_size = 64;       // per node
  double learning_rate = 0.2;
  double lr_decay = 0.5;     // the learning rate is multiplied by this after every epoch: the
                             // last steps move the model less, so the feed's arrival order matters less
  int sync_every = 50;       // steps between averaging rounds (and at every epoch's end)
};

bool ParseFlags(int argc, char** argv, Flags* flags) {
  for (int i = 1; i < argc; ++i) {
    std::string_view a = argv[i];
    auto value = [&](std::string_view name) -> const char* {
      return a.substr(0, name.size()) == name ? argv[i] + name.size() : nullptr;
    };
    if (const char* v = value("--epochs=")) flags->epochs = std::atoi(v);
    else if (const char* v = value("--batch-size=")) flags->batch_size = std::atoi(v);
    else if (const char* v = value("--learning-rate=")) flags->learning_rate = std::atof(v);
    else if (const char* v = value("--sync-every=")) flags->sync_every = std::atoi(v);
    else if (const char* v = value("--lr-decay=")) flags->lr_decay = std::atof(v);
    else {
      std::fprintf(stderr, "cpp_trainer: unknown argument %s\n", argv[i]);
      return false;
    }
  }
  return flags->epochs >= 0 && flags->batch_size > 0 && flags->sync_every > 0;
}

class Trainer {
 public:
  Trainer(ember::Node& node, ember::feed::Consumer& feed, ember::collective::Communicator& comm, Flags flags)
      : node_(node), feed_(feed), comm_(comm), flags_(flags) {}

  Status Train() {
    // TensorBoard: with a log dir (Cluster.run(..., log_dir=...)) each node writes its own
    // event file under <log_dir>/<job>_<index>, local or HDFS, through the core's writer.
    std::unique_ptr<ember::summary::EventWriter> events;
    if (!node_.context().log_dir.empty()) {
      auto opened = node_.OpenSummaryWriter();
      if (!opened.ok()) return opened.status();
      events = std::move(*opened);
    }
    int64_t step = 0;
    double lr = flags_.learning_rate;
    for (int e = 0; e < flags_.epochs; ++e, lr *= flags_.lr_decay) {
      auto epoch = feed_.BeginEpoch();
      if (!epoch.ok()) return epoch.status();
      if (!epoch->has_value()) {
        return Status::Aborted("the feed ended after " + std::to_string(e) + " of " +
                               std::to_string(flags_.epochs) +
                               " epochs: pass cluster.train(..., num_epochs=N) and --epochs=N alike");
      }
      double loss_sum = 0;
      int64_t batches = 0;
      while (true) {
        auto ranges = feed_.NextEpochBatch(flags_.batch_size, /*drop_remainder=*/true);
        if (!ranges.ok()) return ranges.status();
        if (ranges->empty()) break;  // every node ends the epoch after the same batch
        Examples batch;
        EMBER_RETURN_NOT_OK(decoder_.Append(*ranges, /*need_labels=*/true, &batch));
        const double loss = model_.TrainStep(batch.pixels, batch.labels, lr);
        loss_sum += loss;
        ++batches;
        ++step;
        if (step % flags_.sync_every == 0) {
          EMBER_RETURN_NOT_OK(AverageWithPeers());
          EMBER_RETURN_NOT_OK(node_.Report({{"step", static_cast<double>(step)}, {"loss", loss},
                                            {"samples", static_cast<double>(step * flags_.batch_size)}}));
          if (events) EMBER_RETURN_NOT_OK(events->AddScalar("batch/loss", loss, step));
        }
      }
      EMBER_RETURN_NOT_OK(AverageWithPeers());
      if (events) {
        EMBER_RETURN_NOT_OK(events->AddScalar("epoch/loss", batches ? loss_sum / static_cast<double>(batches) : 0.0, e));
        EMBER_RETURN_NOT_OK(events->AddScalar("epoch/learning_rate", lr, e));
      }
      std::printf("epoch %d/%d (feed epoch %u): %lld batches, mean loss %.4f, %d averaging rounds so far\n",
                  e + 1, flags_.epochs, **epoch, static_cast<long long>(batches),
                  batches ? loss_sum / static_cast<double>(batches) : 0.0, round_);
    }
    return events ? events->Close() : Status::OK();
  }

  // Answers every inference row until the feed ends; returns the rows answered.
  ember::Result<int64_t> Infer() {
    feed_.set_train_mode(false);
    int64_t answered = 0;
    while (true) {
      auto ranges = feed_.Next(1000, /*stop_at_partition=*/true);
      if (!ranges.ok()) return ranges.status();
      if (ranges->empty()) return answered;  // the end of the feed (cluster.shutdown)
      Examples rows;
      EMBER_RETURN_NOT_OK(decoder_.Append(*ranges, /*need_labels=*/false, &rows));
      const std::vector<int64_t> predictions = model_.Predict(rows.pixels);
      auto plan = feed_.PlanResults(static_cast<int64_t>(predictions.size()));
      if (!plan.ok()) return plan.status();
      size_t at = 0;
      for (int64_t n : *plan) {  // one result message per partition awaiting answers
        auto ipc = EncodePredictions(std::span<const int64_t>(predictions).subspan(at, n));
        if (!ipc.ok()) return ipc.status();
        EMBER_RETURN_NOT_OK(feed_.SendResults(
            std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(ipc->data()), ipc->size()), n));
        at += static_cast<size_t>(n);
      }
      answered += static_cast<int64_t>(predictions.size());
      if (rows.has_labels) {  // the test set carries its labels: a node-side check of the accuracy
        labelled_ += static_cast<int64_t>(predictions.size());
        for (size_t i = 0; i < predictions.size(); ++i) correct_ += predictions[i] == rows.labels[i];
      }
    }
  }

  // Of the inference rows that carried a label, the fraction predicted right (-1 if none).
  double labelled_accuracy() const {
    return labelled_ ? static_cast<double>(correct_) / static_cast<double>(labelled_) : -1.0;
  }

 private:
  // Every node's parameters replaced by their mean; the result is bitwise the same on
  // every node (ember/collective.h), so the replicas stay in sync.
  Status AverageWithPeers() {
    std::span<float> params = model_.parameters();
    Status st = comm_.Allreduce(params.data(), params.size(), ember::collective::DataType::kFloat32,
                                ember::collective::ReduceOp::kAverage);
    if (!st.ok()) return st.WithContext("averaging round " + std::to_string(round_));
    ++round_;
    return Status::OK();
  }

  ember::Node& node_;
  ember::feed::Consumer& feed_;
  ember::collective::Communicator& comm_;
  const Flags flags_;
  SoftmaxModel model_;
  RowDecoder decoder_;
  int round_ = 0;
  int64_t labelled_ = 0;
  int64_t correct_ = 0;
};

// Reports a failure: on stderr, and in the node's traceback file, which the
// launcher sends to the driver as the node's error.
int Fail(const ember::NodeContext* context, const Status& status) {
  const std::string text = "cpp_trainer failed: " + status.ToString();
  std::fprintf(stderr, "%s\n", text.c_str());
  if (context != nullptr && !context->traceback_path.empty()) {
    std::ofstream(context->traceback_path) << text << "\n";
  }
  return 1;
}

int Main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // stdout is a pipe: lines reach the driver as printed
  Flags flags;
  if (!ParseFlags(argc, argv, &flags)) {
    std::fprintf(stderr, "usage: cpp_trainer [--epochs=N] [--batch-size=N] [--learning-rate=X] [--lr-decay=X] "
                 "[--sync-every=N]\n");
    return 2;
  }
  auto node = ember::Node::FromEnvironment();
  if (!node.ok()) return Fail(nullptr, node.status());
  const ember::NodeContext& context = (*node)->context();
  auto feed = (*node)->OpenFeed();
  if (!feed.ok()) return Fail(&context, feed.status());
  // Averaging rounds wait for the slowest node's batches (its feed included): the core's
  // default call timeout (5 minutes) could end a round that is only slow.
  ember::collective::CommunicatorOptions comm_options;
  comm_options.timeout = Duration(600000);
  auto comm = (*node)->OpenCommunicator(comm_options);
  if (!comm.ok()) return Fail(&context, comm.status());
  std::printf("%s: %d epochs, batch %d, learning rate %g (x%g an epoch), averaging every %d steps "
              "over %d nodes\n", (*node)->label().c_str(), flags.epochs, flags.batch_size,
              flags.learning_rate, flags.lr_decay, flags.sync_every, context.num_workers());

  Trainer trainer(**node, **feed, **comm, flags);
  if (Status st = trainer.Train(); !st.ok()) return Fail(&context, st);
  auto answered = trainer.Infer();
  if (!answered.ok()) return Fail(&context, answered.status());
  std::printf("inference: answered %lld rows; %.4f right of those with a label\n",
              static_cast<long long>(*answered), trainer.labelled_accuracy());
  return 0;
}

}  // namespace
}  // namespace cpp_trainer

int main(int argc, char** argv) { return cpp_trainer::Main(argc, argv); }
