// The C++ node API against a real CoordinatorServer on loopback: launchers
// and nodes are threads of this process.
#include "ember/node.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <unistd.h>

#include <thread>
#include <vector>

#include "node/startup.h"
#include "transport/shm/ring.h"

namespace ember {
namespace {

const std::string kSecret = "node-test-secret-0123456789";
constexpr Duration kLong{10000};

class NodeTest : public ::testing::Test {
 protected:
  // Starts a coordinator for `n` worker nodes and registers them as their
  // launchers would (each Register blocks until all are in).
  void StartJob(int n) {
    CoordinatorOptions o;
    o.bind_host = "127.0.0.1";
    o.secret = kSecret;
    o.layout.num_nodes = n;
    auto server = CoordinatorServer::Start(o);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = server.MoveValueUnsafe();
    launchers_.resize(n);
    std::vector<std::thread> threads;
    for (int i = 0; i < n; ++i) {
      threads.emplace_back([this, i] {
        auto c = CoordinatorClient::Connect("127.0.0.1", server_->port(), kSecret);
        ASSERT_TRUE(c.ok()) << c.status().ToString();
        launchers_[i] = c.MoveValueUnsafe();
        auto reg = launchers_[i]->Register({i, "127.0.0.1", 30000 + i, 100 + i}, kLong);
        ASSERT_TRUE(reg.ok()) << reg.status().ToString();
      });
    }
    for (auto& t : threads) t.join();
  }

  NodeContext ContextOf(int executor_id) const {
    NodeContext c;
    c.job_id = "ember-test";
    c.executor_id = executor_id;
    c.job_name = "worker";
    c.task_index = executor_id;
    c.coordinator_host = "127.0.0.1";
    c.coordinator_port = server_->port();
    c.secret = kSecret;
    c.connect_timeout = Duration(5000);
    return c;
  }

  std::unique_ptr<Node> OpenNode(int executor_id) {
    auto node = Node::Open(ContextOf(executor_id));
    EXPECT_TRUE(node.ok()) << node.status().ToString();
    return node.ok() ? node.MoveValueUnsafe() : nullptr;
  }

  std::unique_ptr<CoordinatorServer> server_;
  std::vector<std::unique_ptr<CoordinatorClient>> launchers_;
};

TEST_F(NodeTest, KeyValueStoreIsSharedAndWaits) {
  StartJob(2);
  auto a = OpenNode(0);
  auto b = OpenNode(1);
  ASSERT_TRUE(a && b);
  std::thread writer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));  // let the reader wait first
    EXPECT_TRUE(a->KvSet("weights/0", std::string("\x00\x01\x02", 3)).ok());
  });
  auto value = b->KvGet("weights/0", kLong);
  writer.join();
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  EXPECT_EQ(*value, std::string("\x00\x01\x02", 3));
  EXPECT_EQ(server_->KvGet("weights/0"), std::string("\x00\x01\x02", 3));

  auto missing = b->KvGet("never", Duration(100));
  EXPECT_EQ(missing.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_NE(missing.status().message().find("never"), std::string::npos);
}

TEST_F(NodeTest, BarrierWaitsForEveryNode) {
  StartJob(3);
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 3; ++i) nodes.push_back(OpenNode(i));
  EXPECT_EQ(nodes[0]->Barrier("early", Duration(100)).code(), StatusCode::kDeadlineExceeded);
  std::vector<std::thread> threads;
  for (auto& n : nodes) {
    threads.emplace_back([&n] { EXPECT_TRUE(n->Barrier("step-1", kLong).ok()); });
  }
  for (auto& t : threads) t.join();
}

TEST_F(NodeTest, ReportsReachTheDriver) {
  StartJob(1);
  auto node = OpenNode(0);
  ASSERT_TRUE(node);
  EXPECT_EQ(node->label(), "worker:0");
  ASSERT_TRUE(node->Report({{"step", 7}, {"loss", 0.25}}).ok());
  bool seen = false;
  for (int i = 0; i < 50 && !seen; ++i) {
    for (const Event& e : server_->PollEvents(Duration(200))) {
      if (e.kind == Event::Kind::kProgress && e.executor_id == 0) {
        EXPECT_EQ(e.metrics.at("step"), 7);
        EXPECT_EQ(e.metrics.at("loss"), 0.25);
        seen = true;
      }
    }
  }
  EXPECT_TRUE(seen);
}

TEST_F(NodeTest, AbortReachesAWaitingNode) {
  StartJob(2);
  auto node = OpenNode(0);
  ASSERT_TRUE(node);
  std::thread aborter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    server_->Abort("worker:1 failed");
  });
  Status st = node->Barrier("never-complete", kLong);
  aborter.join();
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_NE(st.message().find("worker:1 failed"), std::string::npos) << st.message();
}

TEST_F(NodeTest, WrongSecretIsRefused) {
  StartJob(1);
  NodeContext c = ContextOf(0);
  c.secret = "not-the-secret-of-this-job";
  EXPECT_EQ(Node::Open(c).status().code(), StatusCode::kUnauthenticated);
}

TEST_F(NodeTest, FromEnvironmentReadsTheStartupPipe) {
  StartJob(1);
  NodeContext c = ContextOf(0);
  c.payload = std::string(200000, 'p');  // more than a pipe holds: written from a thread
  auto bytes = node::EncodeStartup(c);
  ASSERT_TRUE(bytes.ok());
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  std::thread writer([&] {
    const char* p = bytes->data();
    size_t left = bytes->size();
    while (left > 0) {
      ssize_t n = ::write(fds[1], p, left);
      ASSERT_GT(n, 0);
      p += n;
      left -= static_cast<size_t>(n);
    }
    ::close(fds[1]);
  });
  ::setenv(kStartupFdEnv, std::to_string(fds[0]).c_str(), 1);
  auto node = Node::FromEnvironment();
  writer.join();
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  EXPECT_EQ((*node)->context(), c);
  EXPECT_EQ(::getenv(kStartupFdEnv), nullptr);  // children of the node do not inherit it
  // The pipe was closed (its number may since have been reused, e.g. by the coordinator socket).
  struct stat st;
  EXPECT_TRUE(::fstat(fds[0], &st) != 0 || !S_ISFIFO(st.st_mode));
}

TEST_F(NodeTest, OpenFeedNamesWhyANodeIsNotFed) {
  StartJob(1);
  auto node = OpenNode(0);  // InputMode::kTensorFlow, no ring
  ASSERT_TRUE(node);
  auto feed = node->OpenFeed();
  EXPECT_EQ(feed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(feed.status().message().find("InputMode.SPARK"), std::string::npos) << feed.status().message();

  NodeContext c = ContextOf(0);
  c.input_mode = InputMode::kSpark;  // but a ps/evaluator: no ring
  c.job_name = "ps";
  auto ps = Node::Open(c);
  ASSERT_TRUE(ps.ok());
  feed = (*ps)->OpenFeed();
  EXPECT_EQ(feed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(feed.status().message().find("not fed"), std::string::npos) << feed.status().message();
}

TEST_F(NodeTest, OpenFeedReadsTheNodesRing) {
  StartJob(1);
  const std::string ring_name = "/ember-node-test-" + std::to_string(::getpid());
  auto ring = shm::Ring::Create(ring_name, 1 << 16);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  NodeContext c = ContextOf(0);
  c.input_mode = InputMode::kSpark;
  c.feed_ring = ring_name;
  auto node = Node::Open(c);
  ASSERT_TRUE(node.ok());
  auto feed = (*node)->OpenFeed();
  ASSERT_TRUE(feed.ok()) << feed.status().ToString();
  EXPECT_EQ((*feed)->options().node, "worker:0");  // errors name the node
  (*feed)->set_read_timeout(Duration(100));  // nothing is fed: the read gives up, naming the node
  auto rows = (*feed)->Next(10, false);
  EXPECT_EQ(rows.status().code(), StatusCode::kDeadlineExceeded) << rows.status().ToString();
  EXPECT_NE(rows.status().message().find("worker:0"), std::string::npos) << rows.status().message();
}

TEST(NodeEnvironmentTest, UnsetVariableSaysHowToStartANode) {
  ::unsetenv(kStartupFdEnv);
  auto node = Node::FromEnvironment();
  EXPECT_EQ(node.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(node.status().message().find("Cluster.run"), std::string::npos);
  ::setenv(kStartupFdEnv, "seven", 1);
  EXPECT_EQ(Node::FromEnvironment().status().code(), StatusCode::kInvalidArgument);
  ::unsetenv(kStartupFdEnv);
}

TEST_F(NodeTest, OpenSummaryWriterWritesInTheNodesOwnDirectory) {
  StartJob(2);
  char tmpl[] = "/tmp/ember-node-summary-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  NodeContext c = ContextOf(1);
  c.default_fs = "file:///";
  c.log_dir = "file://" + dir + "/logs";
  auto node = Node::Open(c);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  auto writer = (*node)->OpenSummaryWriter();
  ASSERT_TRUE(writer.ok()) << writer.status().ToString();
  EXPECT_EQ((*writer)->path().rfind(dir + "/logs/worker_1/events.out.tfevents.", 0), 0u) << (*writer)->path();
  ASSERT_TRUE((*writer)->AddScalar("loss", 0.5, 1).ok());
  ASSERT_TRUE((*writer)->Close().ok());
  auto info = fs::LocalFileSystem()->Stat((*writer)->path());
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_GT(info->size, 0u);
  EXPECT_TRUE(fs::LocalFileSystem()->DeleteRecursively(dir).ok());

  c = ContextOf(0);  // no log dir
  auto other = Node::Open(c);
  ASSERT_TRUE(other.ok()) << other.status().ToString();
  auto none = (*other)->OpenSummaryWriter();
  EXPECT_EQ(none.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.status().message().find("log_dir"), std::string::npos) << none.status().ToString();
}

TEST_F(NodeTest, OpenCommunicatorJoinsTheTrainingNodes) {
  StartJob(3);
  // Like a job with one ps: the two workers are ranks 0 and 1, the ps has no rank.
  const ClusterSpec spec = {{"ps", {"127.0.0.1:30002"}}, {"worker", {"127.0.0.1:30000", "127.0.0.1:30001"}}};
  std::vector<std::unique_ptr<Node>> nodes;
  for (int i = 0; i < 2; ++i) {
    NodeContext c = ContextOf(i);
    c.cluster_spec = spec;
    auto node = Node::Open(c);
    ASSERT_TRUE(node.ok()) << node.status().ToString();
    nodes.push_back(node.MoveValueUnsafe());
  }
  std::vector<std::vector<float>> params = {{1.0f, 10.0f}, {3.0f, 30.0f}};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      collective::CommunicatorOptions o;
      o.connect_timeout = kLong;
      auto comm = nodes[i]->OpenCommunicator(o);
      ASSERT_TRUE(comm.ok()) << comm.status().ToString();
      EXPECT_EQ((*comm)->rank(), i);
      EXPECT_EQ((*comm)->size(), 2);
      EXPECT_NE((*comm)->Describe(i).find("worker:" + std::to_string(i)), std::string::npos);
      Status st = (*comm)->Allreduce(params[i].data(), params[i].size(), collective::DataType::kFloat32,
                                     collective::ReduceOp::kAverage);
      EXPECT_TRUE(st.ok()) << st.ToString();
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(params[0], (std::vector<float>{2.0f, 20.0f}));
  EXPECT_EQ(params[1], params[0]);
}

TEST_F(NodeTest, OpenCommunicatorNamesANodeThatDoesNotTrain) {
  StartJob(1);
  NodeContext c = ContextOf(0);
  c.job_name = "ps";
  c.cluster_spec = {{"ps", {"127.0.0.1:30000"}}};
  auto node = Node::Open(c);
  ASSERT_TRUE(node.ok()) << node.status().ToString();
  auto comm = (*node)->OpenCommunicator();
  EXPECT_EQ(comm.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(comm.status().message().find("ps:0 is not a training node"), std::string::npos)
      << comm.status().ToString();

  c = ContextOf(0);  // a worker its cluster spec does not list
  auto options = NodeCommunicatorOptions(c);
  EXPECT_EQ(options.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(options.status().message().find("not in its cluster spec"), std::string::npos)
      << options.status().ToString();
}

TEST(NodeCommunicatorOptionsTest, FilledFromTheContext) {
  NodeContext c;
  c.job_id = "job-7";
  c.job_name = "worker";
  c.task_index = 1;
  c.secret = kSecret;
  c.cluster_spec = {{"chief", {"10.0.0.1:1"}}, {"worker", {"10.0.0.2:2", "10.0.0.3:3"}}};
  collective::CommunicatorOptions in;
  in.transport = collective::Transport::kTcp;
  in.timeout = Duration(1234);
  auto o = NodeCommunicatorOptions(c, in);
  ASSERT_TRUE(o.ok()) << o.status().ToString();
  EXPECT_EQ(o->rank, 2);
  EXPECT_EQ(o->size, 3);
  EXPECT_EQ(o->host, "10.0.0.3");
  EXPECT_EQ(o->bind_host, "10.0.0.3");
  EXPECT_EQ(o->name, "worker:1");
  EXPECT_EQ(o->secret, kSecret);
  EXPECT_EQ(o->prefix, "ember-job-7-c0");
  EXPECT_EQ(o->transport, collective::Transport::kTcp);  // the caller's choices are kept
  EXPECT_EQ(o->timeout, Duration(1234));
}

}  // namespace
}  // namespace ember
