// Coordinator tests: N nodes as N threads in one process over real loopback
// TCP.  Waits use deadlines (NextPush, WaitFor*, PollEvents), not sleeps.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "common/test_util.h"
#include "coordinator/codec.h"
#include "coordinator/protocol.h"
#include "ember/coordinator.h"
#include "common/codec.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ember {
namespace {

using namespace std::chrono_literals;
const std::string kSecret = "test-secret-0123456789";
constexpr Duration kLong{10000};  // generous upper bound for waits that should succeed

using testing::LogCapture;

ClusterLayout Layout(int nodes, int ps = 0, std::string master = "", bool eval = false) {
  ClusterLayout l;
  l.num_nodes = nodes;
  l.num_ps = ps;
  l.master_node = std::move(master);
  l.eval_node = eval;
  return l;
}

CoordinatorOptions Options(ClusterLayout layout) {
  CoordinatorOptions o;
  o.bind_host = "127.0.0.1";
  o.secret = kSecret;
  o.layout = std::move(layout);
  o.handshake_timeout = Duration(2000);
  return o;
}

std::unique_ptr<CoordinatorServer> StartServer(const CoordinatorOptions& o) {
  auto s = CoordinatorServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? s.MoveValueUnsafe() : nullptr;
}

std::unique_ptr<CoordinatorClient> ConnectClient(int port, ClientOptions co = {},
                                                 const std::string& secret = kSecret) {
  co.connect_timeout = Duration(5000);
  auto c = CoordinatorClient::Connect("127.0.0.1", port, secret, co);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? c.MoveValueUnsafe() : nullptr;
}

NodeAddress Addr(int id) { return {id, "127.0.0.1", 20000 + id, 1000 + id}; }

// Connects and registers n nodes concurrently (Register blocks until all are in).
std::vector<std::unique_ptr<CoordinatorClient>> RegisterAll(int port, int n,
                                                            const ClientOptions& co = {}) {
  std::vector<std::unique_ptr<CoordinatorClient>> clients(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      clients[i] = ConnectClient(port, co);
      if (!clients[i]) return;
      auto reg = clients[i]->Register(Addr(i), kLong);
      EXPECT_TRUE(reg.ok()) << reg.status().ToString();
    });
  }
  for (auto& t : threads) t.join();
  return clients;
}

// A complete 2-node job on `port`: register, barrier, done.
void RunSmallJob(CoordinatorServer& server) {
  auto clients = RegisterAll(server.port(), 2);
  std::vector<std::thread> threads;
  for (auto& c : clients) {
    threads.emplace_back([&c] {
      ASSERT_TRUE(c);
      EXPECT_TRUE(c->Barrier("b", kLong).ok());
      EXPECT_TRUE(c->Done().ok());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_TRUE(server.WaitForNodes({}, kLong).ok());
}

bool Contains(const std::string& hay, const std::string& needle) {
  return hay.find(needle) != std::string::npos;
}

// ---------------------------------------------------------------------------

ClusterLayout LayoutFor(int n) {
  ClusterLayout l;
  l.num_nodes = n;
  l.num_ps = n >= 2 ? 1 : 0;
  if (n >= 3) l.master_node = "chief";
  l.eval_node = n >= 4;
  return l;
}

class ClusterTest : public ::testing::TestWithParam<int> {};

TEST_P(ClusterTest, RegisterBarrierKvDone) {
  const int n = GetParam();
  const ClusterLayout layout = LayoutFor(n);
  auto server = StartServer(Options(layout));
  ASSERT_TRUE(server);
  std::vector<std::string> specs(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      auto c = ConnectClient(server->port());
      ASSERT_TRUE(c);
      auto reg = c->Register(Addr(i), kLong);
      ASSERT_TRUE(reg.ok()) << reg.status().ToString();
      auto want = AssignRole(layout, i);
      ASSERT_TRUE(want.ok());
      EXPECT_EQ(reg->role.job_name, want->job_name);
      EXPECT_EQ(reg->role.task_index, want->task_index);
      EXPECT_EQ(reg->num_nodes, n);
      ASSERT_EQ(static_cast<int>(reg->nodes.size()), n);
      for (int j = 0; j < n; ++j) EXPECT_EQ(reg->nodes[j].address.executor_id, j);
      specs[i] = reg->cluster_spec_json;
      EXPECT_TRUE(c->Barrier("after-register", kLong).ok());
      // Waiting get: each node reads its neighbour's key, which may not be set yet.
      EXPECT_TRUE(c->KvSet("addr/" + std::to_string(i), "v" + std::to_string(i)).ok());
      auto v = c->KvGet("addr/" + std::to_string((i + 1) % n), kLong);
      ASSERT_TRUE(v.ok()) << v.status().ToString();
      EXPECT_EQ(*v, "v" + std::to_string((i + 1) % n));
      EXPECT_TRUE(c->Barrier("end", kLong).ok());
      EXPECT_TRUE(c->Done().ok());
    });
  }
  EXPECT_TRUE(server->WaitForRegistration(kLong).ok());
  for (auto& t : threads) t.join();
  EXPECT_TRUE(server->WaitForNodes({}, kLong).ok());
  for (const auto& s : specs) EXPECT_EQ(s, server->ClusterSpecJson());
  // The driver reads what nodes stored without waiting.
  EXPECT_EQ(server->KvGet("addr/0").value_or("missing"), "v0");
  EXPECT_FALSE(server->KvGet("no-such-key").has_value());
  if (n == 4) {
    EXPECT_EQ(specs[0],
              "{\"ps\":[\"127.0.0.1:20000\"],\"chief\":[\"127.0.0.1:20001\"],"
              "\"evaluator\":[\"127.0.0.1:20002\"],\"worker\":[\"127.0.0.1:20003\"]}");
  }
  auto nodes = server->Nodes();
  ASSERT_EQ(static_cast<int>(nodes.size()), n);
  for (const auto& node : nodes) EXPECT_EQ(node.state, NodeInfo::State::kDone);
  int registered = 0, done = 0;
  for (const auto& e : server->PollEvents(Duration(0))) {
    registered += e.kind == Event::Kind::kRegistered;
    done += e.kind == Event::Kind::kNodeDone;
    EXPECT_NE(e.kind, Event::Kind::kAbort);
  }
  EXPECT_EQ(registered, n);
  EXPECT_EQ(done, n);
}

INSTANTIATE_TEST_SUITE_P(Sizes, ClusterTest, ::testing::Values(1, 2, 3, 4, 8, 16));

TEST(CoordinatorTest, StartValidatesOptions) {
  CoordinatorOptions o = Options(Layout(2, 0));
  o.secret = "short";
  EXPECT_EQ(CoordinatorServer::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = Options(Layout(1, 2));
  EXPECT_EQ(CoordinatorServer::Start(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(CoordinatorTest, RegisterDeadlineNamesMissingExecutor) {
  auto server = StartServer(Options(Layout(3, 1)));
  ASSERT_TRUE(server);
  // Clients outlive both threads: a node that gives up and disconnects is
  // lost, which would abort the other's wait before its own deadline.
  std::vector<std::unique_ptr<CoordinatorClient>> clients(2);
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i) {
    threads.emplace_back([&, i] {
      clients[i] = ConnectClient(server->port());
      ASSERT_TRUE(clients[i]);
      auto reg = clients[i]->Register(Addr(i), Duration(200));
      ASSERT_EQ(reg.status().code(), StatusCode::kDeadlineExceeded) << reg.status().ToString();
      const std::string& m = reg.status().message();
      EXPECT_TRUE(Contains(m, "registration: 1 of 3 nodes missing: executor 2 (worker:1)")) << m;
      EXPECT_TRUE(Contains(m, "registered: ps:0@127.0.0.1, worker:0@127.0.0.1")) << m;
    });
  }
  for (auto& t : threads) t.join();
}

TEST(CoordinatorTest, WaitForRegistrationNamesMissingNodes) {
  auto server = StartServer(Options(Layout(3, 1)));
  ASSERT_TRUE(server);
  auto c = ConnectClient(server->port());
  ASSERT_TRUE(c);
  std::thread t([&] { (void)c->Register(Addr(0), kLong); });
  // Wait until the first node is in, then time out on the rest.
  for (auto d = Deadline::After(kLong); server->Nodes().empty() && !d.expired();) {
    server->PollEvents(Duration(50));
  }
  Status st = server->WaitForRegistration(Duration(100));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(st.message(), "2 of 3 nodes missing: executor 1 (worker:0), executor 2 (worker:1)"))
      << st.message();
  EXPECT_TRUE(Contains(st.message(), "registered: ps:0@127.0.0.1")) << st.message();
  server->Close();  // fails the parked Register
  t.join();
}

TEST(CoordinatorTest, InvalidRegistrationsAreRejected) {
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto a = ConnectClient(server->port());
  auto b = ConnectClient(server->port());
  ASSERT_TRUE(a && b);
  Result<Registration> ra = Status::Internal("not run");
  std::thread t([&] { ra = a->Register(Addr(0), kLong); });
  for (auto d = Deadline::After(kLong); server->Nodes().empty() && !d.expired();) {
    server->PollEvents(Duration(50));
  }
  auto dup = b->Register(Addr(0), kLong);
  EXPECT_EQ(dup.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(dup.status().message(), "already registered")) << dup.status().message();
  auto out = b->Register(Addr(5), kLong);
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(Contains(out.status().message(), "out of range")) << out.status().message();
  auto rb = b->Register(Addr(1), kLong);  // the same connection may still register properly
  EXPECT_TRUE(rb.ok()) << rb.status().ToString();
  t.join();
  EXPECT_TRUE(ra.ok()) << ra.status().ToString();
  EXPECT_TRUE(a->Done().ok());
  EXPECT_TRUE(b->Done().ok());
  EXPECT_TRUE(server->WaitForNodes({}, kLong).ok());
}

TEST(CoordinatorTest, BarrierAndKvGetDeadlinesNameWhatIsMissing) {
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 2);
  Status st = clients[0]->Barrier("sync", Duration(100));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(st.message(), "barrier 'sync': 1 of 2 nodes missing: executor 1 (worker:1)"))
      << st.message();
  auto v = clients[1]->KvGet("nope", Duration(100));
  EXPECT_EQ(v.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(v.status().message(), "key 'nope'")) << v.status().message();
  for (auto& c : clients) EXPECT_TRUE(c->Done().ok());
}

TEST(CoordinatorTest, FailedNodeAbortsEveryone) {
  auto server = StartServer(Options(Layout(3, 0)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 3);
  ASSERT_TRUE(clients[1]->Fail("Traceback: ValueError: boom").ok());
  for (int i : {0, 2}) {
    auto push = clients[i]->NextPush(Duration(2000));
    ASSERT_TRUE(push.has_value()) << "client " << i << " got no abort";
    EXPECT_EQ(push->kind, CoordinatorClient::Push::Kind::kAbort);
    EXPECT_TRUE(Contains(push->reason, "worker:1 (executor 1, host 127.0.0.1")) << push->reason;
    EXPECT_TRUE(Contains(push->reason, "ValueError: boom")) << push->reason;
  }
  Status st = server->WaitForNodes({}, kLong);
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_TRUE(Contains(st.message(), "worker:1 (executor 1, host 127.0.0.1")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "boom")) << st.message();
  bool failed = false, aborted = false;
  for (const auto& e : server->PollEvents(Duration(0))) {
    failed |= e.kind == Event::Kind::kNodeFailed && e.executor_id == 1 && e.job_name == "worker";
    aborted |= e.kind == Event::Kind::kAbort;
  }
  EXPECT_TRUE(failed && aborted);
  // After the abort, waiting requests are refused with the reason.
  EXPECT_EQ(clients[0]->Barrier("late", kLong).code(), StatusCode::kAborted);
  EXPECT_EQ(clients[2]->KvGet("missing", kLong).status().code(), StatusCode::kAborted);
  auto late = ConnectClient(server->port());
  ASSERT_TRUE(late);
  EXPECT_EQ(late->Register(Addr(0), kLong).status().code(), StatusCode::kAborted);
}

TEST(CoordinatorTest, ToleratedWorkerLossesDepartAndTheJobGoesOnUntilOneTooMany) {
  CoordinatorOptions o = Options(Layout(4, 0));
  o.tolerated_worker_losses = 1;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 4);
  // Three nodes wait at a barrier; the fourth (a worker) fails instead of entering it.
  std::vector<std::thread> waiting;
  for (int i : {0, 1, 3}) {
    waiting.emplace_back([&, i] { EXPECT_TRUE(clients[i]->Barrier("b", kLong).ok()) << "node " << i; });
  }
  ASSERT_TRUE(clients[2]->Fail("Traceback: MemoryError").ok());
  for (auto& t : waiting) t.join();  // the barrier no longer waits for the departed worker
  EXPECT_FALSE(clients[0]->NextPush(Duration(200)).has_value());  // nobody was told to abort
  bool departed = false;
  for (const auto& e : server->PollEvents(Duration(0))) {
    EXPECT_NE(e.kind, Event::Kind::kAbort);
    EXPECT_NE(e.kind, Event::Kind::kNodeFailed);
    if (e.kind == Event::Kind::kNodeDeparted) {
      departed = true;
      EXPECT_EQ(e.executor_id, 2);
      EXPECT_EQ(e.job_name, "worker");
      EXPECT_TRUE(Contains(e.text, "MemoryError")) << e.text;
    }
  }
  EXPECT_TRUE(departed);
  EXPECT_EQ(server->Nodes()[2].state, NodeInfo::State::kFailed);
  ASSERT_TRUE(clients[0]->Done().ok());
  ASSERT_TRUE(clients[1]->Done().ok());
  // WaitForNodes waits for the live ones only.
  Status st = server->WaitForNodes({}, Duration(200));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(st.message(), "1 of 4 nodes still running")) << st.message();
  // A second loss is one too many: the job aborts, naming it.
  clients[3].reset();
  st = server->WaitForNodes({}, kLong);
  EXPECT_EQ(st.code(), StatusCode::kAborted);
  EXPECT_TRUE(Contains(st.message(), "executor 3")) << st.message();
}

TEST(CoordinatorTest, AReplacementTakesADepartedWorkersPlaceAndTheOldConnectionNoLongerCounts) {
  CoordinatorOptions o = Options(Layout(3, 0));
  o.tolerated_worker_losses = 1;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 3);
  ASSERT_TRUE(clients[2]->Fail("Traceback: MemoryError").ok());
  ASSERT_TRUE(server->WaitForNodeEnd(2, kLong).ok());
  // A taken slot that did not depart is still refused.
  auto intruder = ConnectClient(server->port());
  ASSERT_TRUE(intruder);
  EXPECT_EQ(intruder->Register(Addr(1), kLong).status().code(), StatusCode::kInvalidArgument);
  // The replacement registers under the departed worker's executor id: at once, job whole again.
  auto fresh = ConnectClient(server->port());
  ASSERT_TRUE(fresh);
  NodeAddress a = Addr(2);
  a.port = 31000;
  a.pid = 4242;
  auto reg = fresh->Register(a, kLong);
  ASSERT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(reg->role.job_name, "worker");
  EXPECT_TRUE(Contains(reg->cluster_spec_json, "127.0.0.1:31000")) << reg->cluster_spec_json;
  EXPECT_EQ(server->Nodes()[2].state, NodeInfo::State::kRunning);
  EXPECT_EQ(server->Nodes()[2].address.pid, 4242);
  bool replaced = false;
  for (const auto& e : server->PollEvents(Duration(0))) {
    replaced |= e.kind == Event::Kind::kRegistered && e.executor_id == 2 && Contains(e.text, "replaces worker");
  }
  EXPECT_TRUE(replaced);
  // The dead node's connection closing now changes nothing; barriers wait for the new node again.
  clients[2].reset();
  EXPECT_FALSE(clients[0]->NextPush(Duration(200)).has_value());
  std::vector<std::thread> ts;
  for (auto* c : {clients[0].get(), clients[1].get(), fresh.get()}) {
    ts.emplace_back([c] { EXPECT_TRUE(c->Barrier("after", kLong).ok()); });
  }
  for (auto& t : ts) t.join();
  for (auto* c : {clients[0].get(), clients[1].get(), fresh.get()}) ASSERT_TRUE(c->Done().ok());
  EXPECT_TRUE(server->WaitForNodes({}, kLong).ok());
}

TEST(CoordinatorTest, DisconnectWithoutExitReportIsLost) {
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 2);
  clients[1].reset();  // connection closes without Done/Fail
  auto push = clients[0]->NextPush(Duration(2000));
  ASSERT_TRUE(push.has_value());
  EXPECT_EQ(push->kind, CoordinatorClient::Push::Kind::kAbort);
  EXPECT_TRUE(Contains(push->reason,
                       "connection to node worker:1 (executor 1, host 127.0.0.1, pid 1001) lost "
                       "without an exit report"))
      << push->reason;
  EXPECT_EQ(server->WaitForNodes({}, kLong).code(), StatusCode::kAborted);
  EXPECT_EQ(server->Nodes()[1].state, NodeInfo::State::kLost);
}

TEST(CoordinatorTest, SilentNodeIsLostAfterHeartbeatTimeout) {
  CoordinatorOptions o = Options(Layout(2, 0));
  o.heartbeat_timeout = Duration(800);  // 16 missed beats of the live node before a false alarm
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  ClientOptions beating, silent;
  beating.heartbeat_interval = Duration(50);
  silent.heartbeat_interval = Duration(60000);
  std::unique_ptr<CoordinatorClient> a, b;
  std::thread ta([&] {
    a = ConnectClient(server->port(), beating);
    EXPECT_TRUE(a && a->Register(Addr(0), kLong).ok());
  });
  std::thread tb([&] {
    b = ConnectClient(server->port(), silent);
    EXPECT_TRUE(b && b->Register(Addr(1), kLong).ok());
  });
  ta.join();
  tb.join();
  ASSERT_TRUE(a && b);
  auto push = a->NextPush(Duration(3000));
  ASSERT_TRUE(push.has_value());
  EXPECT_EQ(push->kind, CoordinatorClient::Push::Kind::kAbort);
  EXPECT_TRUE(Contains(push->reason, "worker:1 (executor 1")) << push->reason;
  EXPECT_TRUE(Contains(push->reason, "sent no heartbeat")) << push->reason;
  auto nodes = server->Nodes();
  EXPECT_EQ(nodes[0].state, NodeInfo::State::kRunning);
  EXPECT_EQ(nodes[1].state, NodeInfo::State::kLost);
}

TEST(CoordinatorTest, StopNodesReachesOnlyNamedRoles) {
  auto server = StartServer(Options(Layout(3, 1)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 3);
  server->StopNodes({"ps"});
  auto push = clients[0]->NextPush(Duration(2000));
  ASSERT_TRUE(push.has_value());
  EXPECT_EQ(push->kind, CoordinatorClient::Push::Kind::kStop);
  // A Barrier round trip after StopNodes returns proves the workers' queues
  // are settled: the server wrote the Stop frames before the barrier replies.
  std::thread t1([&] { EXPECT_TRUE(clients[1]->Barrier("settle", kLong).ok()); });
  std::thread t2([&] { EXPECT_TRUE(clients[2]->Barrier("settle", kLong).ok()); });
  EXPECT_TRUE(clients[0]->Barrier("settle", kLong).ok());
  t1.join();
  t2.join();
  EXPECT_FALSE(clients[1]->NextPush(Duration(0)).has_value());
  EXPECT_FALSE(clients[2]->NextPush(Duration(0)).has_value());
  EXPECT_TRUE(clients[0]->Done().ok());
  EXPECT_TRUE(server->WaitForNodes({"ps"}, kLong).ok());
  server->StopNodes({"worker"});
  for (int i : {1, 2}) {
    auto p = clients[i]->NextPush(Duration(2000));
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->kind, CoordinatorClient::Push::Kind::kStop);
    EXPECT_TRUE(clients[i]->Done().ok());
  }
  EXPECT_TRUE(server->WaitForNodes({}, kLong).ok());
}

TEST(CoordinatorTest, WaitForNodesTimeoutNamesRunningNodes) {
  auto server = StartServer(Options(Layout(2, 1)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 2);
  EXPECT_TRUE(clients[1]->Done().ok());
  EXPECT_TRUE(server->WaitForNodes({"worker"}, kLong).ok());
  Status st = server->WaitForNodes({}, Duration(50));
  EXPECT_EQ(st.code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(st.message(), "1 of 2 nodes still running")) << st.message();
  EXPECT_TRUE(Contains(st.message(), "ps:0 (executor 0, host 127.0.0.1")) << st.message();
  EXPECT_TRUE(clients[0]->Done().ok());
}

TEST(CoordinatorTest, LogsAndReportsBecomeEvents) {
  auto server = StartServer(Options(Layout(1, 0)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 1);
  EXPECT_TRUE(clients[0]->Log("stdout", "epoch 1").ok());
  EXPECT_TRUE(clients[0]->Report({{"step", 3}, {"loss", 0.5}}).ok());
  bool log = false, progress = false;
  for (auto d = Deadline::After(kLong); !(log && progress) && !d.expired();) {
    for (const auto& e : server->PollEvents(Duration(100))) {
      if (e.kind == Event::Kind::kLog) {
        log = e.stream == "stdout" && e.text == "epoch 1" && e.job_name == "worker";
      }
      if (e.kind == Event::Kind::kProgress) progress = e.metrics.at("step") == 3;
    }
  }
  EXPECT_TRUE(log && progress);
  EXPECT_TRUE(clients[0]->Done().ok());
}

TEST(CoordinatorTest, AttachIdentifiesASecondConnection) {
  auto server = StartServer(Options(Layout(1, 0)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 1);
  auto side = ConnectClient(server->port());
  ASSERT_TRUE(side);
  EXPECT_EQ(side->Attach(3).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(side->Attach(0).ok());
  EXPECT_TRUE(side->Barrier("b", kLong).ok());  // counts as executor 0
  side.reset();                                  // not the lifeline: no loss
  EXPECT_TRUE(clients[0]->Done().ok());
  EXPECT_TRUE(server->WaitForNodes({}, kLong).ok());
}

TEST(CoordinatorTest, DriverAbortFailsWaitersAndPushes) {
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto c = ConnectClient(server->port());
  ASSERT_TRUE(c);
  Result<Registration> reg = Status::Internal("not run");
  std::thread t([&] { reg = c->Register(Addr(0), kLong); });
  for (auto d = Deadline::After(kLong); server->Nodes().empty() && !d.expired();) {
    server->PollEvents(Duration(50));
  }
  server->Abort("the driver was interrupted");
  t.join();
  EXPECT_EQ(reg.status().code(), StatusCode::kAborted);
  EXPECT_EQ(reg.status().message(), "the driver was interrupted");
  auto push = c->NextPush(Duration(2000));
  ASSERT_TRUE(push.has_value());
  EXPECT_EQ(push->reason, "the driver was interrupted");
  EXPECT_EQ(server->WaitForRegistration(kLong).code(), StatusCode::kAborted);
}

TEST(CoordinatorTest, LosingTheServerBecomesAnAbortPush) {
  auto server = StartServer(Options(Layout(1, 0)));
  ASSERT_TRUE(server);
  const int port = server->port();
  auto clients = RegisterAll(port, 1);
  server->Close();
  auto push = clients[0]->NextPush(Duration(2000));
  ASSERT_TRUE(push.has_value());
  EXPECT_EQ(push->kind, CoordinatorClient::Push::Kind::kAbort);
  EXPECT_TRUE(Contains(push->reason, "Ember coordinator at 127.0.0.1:" + std::to_string(port)))
      << push->reason;
  EXPECT_EQ(clients[0]->Done().code(), StatusCode::kUnavailable);
}

// ---- hostile or broken peers: each is dropped and logged; the job goes on ----

TEST(CoordinatorTest, GarbagePeerIsRejectedAndJobContinues) {
  LogCapture logs;
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto raw = tcp::Connect("127.0.0.1", server->port(), Deadline::After(kLong));
  ASSERT_TRUE(raw.ok());
  const std::string junk(64, '\x5a');
  ASSERT_TRUE(tcp::WriteAll(raw->get(), junk.data(), junk.size(), Deadline::After(kLong), "w").ok());
  const std::string self = "127.0.0.1:" + std::to_string(*tcp::LocalPort(raw->get()));
  EXPECT_NE(logs.WaitFor("rejected unauthenticated connection from " + self + ": bad HMAC"), "");
  RunSmallJob(*server);
}

TEST(CoordinatorTest, WrongSecretIsRejectedAndJobContinues) {
  LogCapture logs;
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto bad = CoordinatorClient::Connect("127.0.0.1", server->port(), "a-different-secret-xyz");
  EXPECT_EQ(bad.status().code(), StatusCode::kUnauthenticated) << bad.status().ToString();
  EXPECT_NE(logs.WaitFor("bad HMAC"), "");
  RunSmallJob(*server);
}

TEST(CoordinatorTest, SilentPeerTimesOutWithoutBlockingTheJob) {
  LogCapture logs;
  CoordinatorOptions o = Options(Layout(2, 0));
  o.handshake_timeout = Duration(300);
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto raw = tcp::Connect("127.0.0.1", server->port(), Deadline::After(kLong));
  ASSERT_TRUE(raw.ok());
  RunSmallJob(*server);  // runs while the silent peer holds its connection
  EXPECT_NE(logs.WaitFor("did not complete the handshake"), "");
  char byte;  // the server hung up on us
  Status st = tcp::ReadExactly(raw->get(), &byte, 1, Deadline::After(kLong), "r");
  // The 38-byte server hello arrives first; then EOF.
  char hello[37];
  if (st.ok()) st = tcp::ReadExactly(raw->get(), hello, sizeof(hello), Deadline::After(kLong), "r");
  if (st.ok()) st = tcp::ReadExactly(raw->get(), &byte, 1, Deadline::After(kLong), "r");
  EXPECT_FALSE(st.ok());
}

TEST(CoordinatorTest, OversizedFrameIsRejectedAndJobContinues) {
  LogCapture logs;
  CoordinatorOptions o = Options(Layout(2, 0));
  o.max_message_bytes = 1024;
  auto server = StartServer(o);
  ASSERT_TRUE(server);
  auto raw = tcp::Connect("127.0.0.1", server->port(), Deadline::After(kLong));
  ASSERT_TRUE(raw.ok());
  ASSERT_TRUE(tcp::ClientHandshake(raw->get(), kSecret, Deadline::After(kLong), "server").ok());
  codec::Writer header;
  header.PutU32(1 << 30);
  header.PutU16(static_cast<uint16_t>(coord::MsgType::kLog));
  header.PutU16(tcp::kProtocolVersion);
  ASSERT_TRUE(tcp::WriteAll(raw->get(), header.data().data(), header.data().size(),
                            Deadline::After(kLong), "w").ok());
  EXPECT_NE(logs.WaitFor("frame of 1073741824 bytes from 127.0.0.1:"), "");
  RunSmallJob(*server);
  for (const auto& e : server->PollEvents(Duration(0))) EXPECT_NE(e.kind, Event::Kind::kAbort);
}

TEST(CoordinatorTest, ConnectWithoutListenerIsUnavailable) {
  int port;
  {
    auto l = tcp::Listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    port = *tcp::LocalPort(l->get());
  }
  ClientOptions co;
  co.connect_timeout = Duration(1000);
  const auto start = Deadline::Clock::now();
  auto c = CoordinatorClient::Connect("127.0.0.1", port, kSecret, co);
  EXPECT_LT(Deadline::Clock::now() - start, Duration(1500));
  ASSERT_EQ(c.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(c.status().message(), "cannot reach the Ember coordinator at 127.0.0.1:" +
                                                 std::to_string(port) + " within 1s: Connection refused"))
      << c.status().message();
  EXPECT_TRUE(Contains(c.status().message(), "spark.driver.host")) << c.status().message();
}

// ---- protocol helpers ----

// The driver's blocking waits wake at the event itself, never on a polling tick.
TEST(CoordinatorTest, WaitForKeyWakesWhenANodeStoresIt) {
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 2);
  EXPECT_EQ(server->WaitForKey("ember/k", Duration(30)).status().code(),
            StatusCode::kDeadlineExceeded);
  std::thread setter([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(clients[1]->KvSet("ember/k", "v1").ok());
  });
  const auto start = Deadline::Clock::now();
  Result<std::string> v = server->WaitForKey("ember/k", kLong);
  setter.join();
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, "v1");
  EXPECT_LT(Deadline::Clock::now() - start, 5s);
  for (auto& c : clients) EXPECT_TRUE(c->Done().ok());
}

TEST(CoordinatorTest, WaitForKeyFailsAtOnceWhenANodeFails) {
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  auto clients = RegisterAll(server->port(), 2);
  std::thread failer([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(clients[0]->Fail("Traceback: RuntimeError: no url").ok());
  });
  const auto start = Deadline::Clock::now();
  Result<std::string> v = server->WaitForKey("never/set", kLong);
  failer.join();
  EXPECT_EQ(v.status().code(), StatusCode::kAborted);
  EXPECT_TRUE(Contains(v.status().message(), "worker:0 (executor 0")) << v.status().message();
  EXPECT_TRUE(Contains(v.status().message(), "no url")) << v.status().message();
  EXPECT_LT(Deadline::Clock::now() - start, 5s);
}

TEST(CoordinatorTest, WaitForNodeEndReturnsTheFinalState) {
  auto server = StartServer(Options(Layout(2, 0)));
  ASSERT_TRUE(server);
  EXPECT_EQ(server->WaitForNodeEnd(2, kLong).status().code(), StatusCode::kInvalidArgument);
  auto clients = RegisterAll(server->port(), 2);
  Result<NodeInfo> running = server->WaitForNodeEnd(1, Duration(30));
  EXPECT_EQ(running.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(running.status().message(), "worker:1 (executor 1")) << running.status().message();
  std::thread done([&] {
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(clients[1]->Done().ok());
  });
  Result<NodeInfo> info = server->WaitForNodeEnd(1, kLong);
  done.join();
  ASSERT_TRUE(info.ok()) << info.status().ToString();
  EXPECT_EQ(info->state, NodeInfo::State::kDone);
  EXPECT_TRUE(clients[0]->Fail("boom").ok());
  Result<NodeInfo> failed = server->WaitForNodeEnd(0, kLong);
  ASSERT_TRUE(failed.ok()) << failed.status().ToString();
  EXPECT_EQ(failed->state, NodeInfo::State::kFailed);
  EXPECT_TRUE(Contains(failed->error, "boom"));
}

TEST(ProtocolTest, ClusterSpecEscapesAndOrders) {
  std::vector<NodeInfo> nodes(3);
  nodes[0].address = {0, "w\"1", 1, 0};
  nodes[0].role = {"worker", 1};
  nodes[1].address = {1, "h\\\n", 2, 0};
  nodes[1].role = {"worker", 0};
  nodes[2].address = {2, "p", 3, 0};
  nodes[2].role = {"ps", 0};
  EXPECT_EQ(coord::ClusterSpecJson(nodes),
            "{\"ps\":[\"p:3\"],\"worker\":[\"h\\\\\\n:2\",\"w\\\"1:1\"]}");
}

}  // namespace
}  // namespace ember
