// The coordinator relay over real loopback TCP: a CoordinatorServer, a
// CoordinatorRelay, a RelayAgent pointing at the server, and nodes
// (CoordinatorClients) dialling the relay's node port; plus hand-made peers
// (a fake agent, a wrong-key peer) for the refusals.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/codec.h"
#include "common/logging.h"
#include "common/test_util.h"
#include "coordinator/codec.h"
#include "coordinator/relay.h"
#include "ember/coordinator.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ember {
namespace {

const std::string kSecret = "relay-test-secret-0123456789";
constexpr Duration kLong{10000};

bool Contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

using testing::LogCapture;

std::unique_ptr<CoordinatorServer> StartServer(int nodes) {
  CoordinatorOptions o;
  o.bind_host = "127.0.0.1";
  o.secret = kSecret;
  o.layout.num_nodes = nodes;
  auto s = CoordinatorServer::Start(o);
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? s.MoveValueUnsafe() : nullptr;
}

RelayOptions Options() {
  RelayOptions o;
  o.bind_host = "127.0.0.1";
  o.secret = kSecret;
  o.handshake_timeout = Duration(2000);
  o.agent_timeout = Duration(2000);
  o.open_timeout = Duration(5000);
  return o;
}

std::unique_ptr<CoordinatorRelay> StartRelay(const RelayOptions& o = Options()) {
  auto r = CoordinatorRelay::Start(o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? r.MoveValueUnsafe() : nullptr;
}

// An agent for `relay`, tunnelling to `server`; returns once the relay has it.
std::unique_ptr<RelayAgent> ConnectAgent(CoordinatorRelay& relay, const CoordinatorServer& server) {
  RelayAgentOptions o;
  o.connect_timeout = Duration(5000);
  o.heartbeat_interval = Duration(50);
  auto a = RelayAgent::Connect("127.0.0.1", relay.agent_port(), kSecret, "127.0.0.1", server.port(), o);
  EXPECT_TRUE(a.ok()) << a.status().ToString();
  EXPECT_TRUE(testing::WaitUntil([&] { return relay.stats().agent_connected; }));
  return a.ok() ? a.MoveValueUnsafe() : nullptr;
}

// A job's three parts, connected: a server for `nodes` nodes, a relay and its agent.  Tests name
// them with references, not a structured binding: their lambdas capture them (clang < 16 cannot).
struct RelayedJob {
  std::unique_ptr<CoordinatorServer> server;
  std::unique_ptr<CoordinatorRelay> relay;
  std::unique_ptr<RelayAgent> agent;  // destroyed first, as locals declared in this order would be
};

RelayedJob StartRelayedJob(int nodes, const RelayOptions& o = Options()) {
  RelayedJob job{StartServer(nodes), StartRelay(o), nullptr};
  if (job.server && job.relay) job.agent = ConnectAgent(*job.relay, *job.server);
  return job;
}

std::unique_ptr<CoordinatorClient> ConnectNode(int port) {
  ClientOptions co;
  co.connect_timeout = Duration(5000);
  co.heartbeat_interval = Duration(100);
  auto c = CoordinatorClient::Connect("127.0.0.1", port, kSecret, co);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? c.MoveValueUnsafe() : nullptr;
}

NodeAddress Addr(int id) { return {id, "127.0.0.1", 20000 + id, 1000 + id}; }

// n nodes register through the relay (Register blocks until all are in).
std::vector<std::unique_ptr<CoordinatorClient>> RegisterAll(int relay_port, int n) {
  std::vector<std::unique_ptr<CoordinatorClient>> clients(n);
  std::vector<std::thread> threads;
  for (int i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      clients[i] = ConnectNode(relay_port);
      if (!clients[i]) return;
      auto reg = clients[i]->Register(Addr(i), kLong);
      EXPECT_TRUE(reg.ok()) << reg.status().ToString();
      if (reg.ok()) {
        EXPECT_EQ(reg->num_nodes, n);
        EXPECT_TRUE(Contains(reg->cluster_spec_json, "127.0.0.1:" + std::to_string(20000 + i)))
            << reg->cluster_spec_json;
      }
    });
  }
  for (auto& t : threads) t.join();
  return clients;
}

// A hand-made agent-port peer with the derived key.
Fd DialAgentPort(int port) {
  auto key = coord::RelayAgentSecret(kSecret);
  EXPECT_TRUE(key.ok());
  auto fd = tcp::Dial("127.0.0.1", port, *key, Deadline::After(kLong), "relay");
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
  return fd.ok() ? fd.MoveValueUnsafe() : Fd();
}

template <class M>
void Send(int fd, const M& m) {
  ASSERT_TRUE(tcp::WriteFrame(fd, static_cast<uint16_t>(M::kType), coord::Encode(m), Deadline::After(kLong),
                              "relay")
                  .ok());
}

// ---- through the relay, a job runs as if connected directly ----

TEST(RelayTest, NodesRegisterMeetAndLogThroughTheRelay) {
  RelayOptions o = Options();
  o.agent_timeout = Duration(1000);  // the agent's 50 ms heartbeats hold the lease throughout
  RelayedJob job = StartRelayedJob(2, o);
  ASSERT_TRUE(job.server && job.relay && job.agent);
  auto& server = job.server;
  auto& relay = job.relay;
  auto& agent = job.agent;

  auto clients = RegisterAll(relay->node_port(), 2);
  ASSERT_TRUE(clients[0] && clients[1]);
  EXPECT_TRUE(server->WaitForRegistration(kLong).ok());
  EXPECT_EQ(relay->stats().tunnels_opened, 2u);
  EXPECT_EQ(relay->stats().tunnels_active, 2u);
  EXPECT_EQ(agent->stats().tunnels_active, 2u);

  ASSERT_TRUE(clients[0]->KvSet("ember/test", std::string("v\0w", 3)).ok());
  auto value = clients[1]->KvGet("ember/test", kLong);
  ASSERT_TRUE(value.ok()) << value.status().ToString();
  EXPECT_EQ(*value, std::string("v\0w", 3));

  std::vector<std::thread> threads;
  for (auto& c : clients) {
    threads.emplace_back([&c] { EXPECT_TRUE(c->Barrier("after-kv", kLong).ok()); });
  }
  for (auto& t : threads) t.join();

  ASSERT_TRUE(clients[1]->Log("stdout", "hello through the relay").ok());
  bool logged = false;
  const Deadline deadline = Deadline::After(kLong);
  while (!logged && !deadline.expired()) {
    for (const Event& e : server->PollEvents(Duration(200))) {
      logged = logged || (e.kind == Event::Kind::kLog && e.text == "hello through the relay" && e.executor_id == 1);
    }
  }
  EXPECT_TRUE(logged);

  for (auto& c : clients) EXPECT_TRUE(c->Done().ok());
  EXPECT_TRUE(server->WaitForNodes({}, kLong).ok());
  EXPECT_FALSE(relay->Wait(Duration(0)).has_value());  // heartbeats kept the agent's lease
  EXPECT_TRUE(agent->ok());
}

TEST(RelayTest, ANodeThatDisconnectsIsLostAtTheServer) {
  RelayedJob job = StartRelayedJob(2);
  ASSERT_TRUE(job.server && job.relay && job.agent);
  auto& server = job.server;
  auto& relay = job.relay;
  auto clients = RegisterAll(relay->node_port(), 2);
  ASSERT_TRUE(clients[0] && clients[1]);
  clients[1].reset();  // closes without Done/Fail
  auto push = clients[0]->NextPush(kLong);
  ASSERT_TRUE(push.has_value());
  EXPECT_EQ(push->kind, CoordinatorClient::Push::Kind::kAbort);
  EXPECT_TRUE(Contains(push->reason, "connection to node worker:1 (executor 1, host 127.0.0.1, pid 1001) lost "
                                     "without an exit report"))
      << push->reason;
  EXPECT_EQ(server->WaitForNodes({}, kLong).code(), StatusCode::kAborted);
  EXPECT_EQ(server->Nodes()[1].state, NodeInfo::State::kLost);
  EXPECT_TRUE(testing::WaitUntil([&] { return relay->stats().tunnels_active == 1; }));
}

// ---- the relay's end ----

TEST(RelayTest, AgentCloseEndsTheRelayAndClosesItsNodes) {
  RelayedJob job = StartRelayedJob(1);
  ASSERT_TRUE(job.server && job.relay && job.agent);
  auto& relay = job.relay;
  auto& agent = job.agent;
  auto clients = RegisterAll(relay->node_port(), 1);
  ASSERT_TRUE(clients[0]);

  const auto start = Deadline::Clock::now();
  agent->Close();
  std::optional<Status> why = relay->Wait(kLong);
  ASSERT_TRUE(why.has_value());
  EXPECT_TRUE(why->ok()) << why->ToString();
  EXPECT_LT(Deadline::Clock::now() - start, Duration(1000));
  EXPECT_EQ(agent->status().code(), StatusCode::kCancelled);

  auto push = clients[0]->NextPush(kLong);  // the node sees its coordinator go away
  ASSERT_TRUE(push.has_value());
  EXPECT_EQ(push->kind, CoordinatorClient::Push::Kind::kAbort);
  EXPECT_TRUE(Contains(push->reason, "127.0.0.1:" + std::to_string(relay->node_port()))) << push->reason;
  EXPECT_EQ(clients[0]->KvSet("k", "v").code(), StatusCode::kUnavailable);
  // A node dialling now finds nothing listening, or is closed at once.
  auto late = CoordinatorClient::Connect("127.0.0.1", relay->node_port(), kSecret, {.connect_timeout = Duration(500)});
  if (late.ok()) {
    EXPECT_EQ((*late)->Register(Addr(0), Duration(1000)).status().code(), StatusCode::kUnavailable);
  }
}

TEST(RelayTest, ANodeThatComesBeforeTheAgentWaitsForIt) {
  // The client's agent dials the relay only after the relay reported its ports; a node that
  // is faster (or an agent's control frame still on its way) must not be turned away.
  auto server = StartServer(1);
  ASSERT_TRUE(server);
  auto relay = StartRelay();
  ASSERT_TRUE(relay);
  auto node = ConnectNode(relay->node_port());
  ASSERT_TRUE(node);
  Result<Registration> reg = Status::Internal("not run");
  std::thread registering([&] { reg = node->Register(Addr(0), kLong); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto agent = ConnectAgent(*relay, *server);
  ASSERT_TRUE(agent);
  registering.join();
  EXPECT_TRUE(reg.ok()) << reg.status().ToString();
  EXPECT_EQ(relay->stats().nodes_refused, 0u);
}

TEST(RelayTest, NoAgentWithinAgentTimeoutEndsTheRelayAndNodesAreClosedMeanwhile) {
  LogCapture logs;
  RelayOptions o = Options();
  o.agent_timeout = Duration(1500);
  auto relay = StartRelay(o);
  ASSERT_TRUE(relay);
  // Before the timeout, a node passes the handshake and waits for the agent; when the relay
  // ends for want of one, the node is closed.
  auto node = ConnectNode(relay->node_port());
  ASSERT_TRUE(node);
  auto reg = node->Register(Addr(0), Duration(5000));
  EXPECT_EQ(reg.status().code(), StatusCode::kUnavailable) << reg.status().ToString();
  EXPECT_NE(logs.WaitFor({"WARN", "closed the connection of node 127.0.0.1:", "the relay has ended"}), "");
  EXPECT_EQ(relay->stats().nodes_refused, 1u);

  std::optional<Status> why = relay->Wait(kLong);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(why->message(), "no agent connected to the relay at 127.0.0.1:" +
                                           std::to_string(relay->agent_port()) + " within 1500ms"))
      << why->message();
}

TEST(RelayTest, ASilentAgentLosesItsLease) {
  RelayOptions o = Options();
  o.agent_timeout = Duration(400);
  auto relay = StartRelay(o);
  ASSERT_TRUE(relay);
  Fd fake = DialAgentPort(relay->agent_port());
  Send(fake.get(), coord::RelayControlMessage{});
  ASSERT_TRUE(testing::WaitUntil([&] { return relay->stats().agent_connected; }));
  const std::string self = "127.0.0.1:" + std::to_string(*tcp::LocalPort(fake.get()));
  std::optional<Status> why = relay->Wait(kLong);
  ASSERT_TRUE(why.has_value());
  EXPECT_EQ(why->code(), StatusCode::kDeadlineExceeded);
  EXPECT_TRUE(Contains(why->message(), "the relay's agent at " + self + " was silent for 400ms")) << why->message();
  char byte;  // and its control connection is closed
  EXPECT_FALSE(tcp::ReadExactly(fake.get(), &byte, 1, Deadline::After(kLong), "relay").ok());
}

TEST(RelayTest, RelayCloseIsSeenByTheAgentAndItsTunnelsClose) {
  RelayedJob job = StartRelayedJob(1);
  ASSERT_TRUE(job.server && job.relay && job.agent);
  auto& server = job.server;
  auto& relay = job.relay;
  auto& agent = job.agent;
  auto clients = RegisterAll(relay->node_port(), 1);
  ASSERT_TRUE(clients[0]);
  const int agent_port = relay->agent_port();
  relay->Close();
  EXPECT_EQ(relay->Wait(Duration(0)).value().code(), StatusCode::kCancelled);
  ASSERT_TRUE(testing::WaitUntil([&] { return !agent->ok(); }));
  EXPECT_EQ(agent->status().code(), StatusCode::kUnavailable);
  // "... closed its connection", or "... failed: Connection reset by peer" when a heartbeat was
  // still unread as the relay closed it.
  EXPECT_TRUE(Contains(agent->status().message(), "the coordinator relay at 127.0.0.1:" + std::to_string(agent_port)))
      << agent->status().ToString();
  // The tunnel's connection to the server closed too: the server lost the node.
  auto end = server->WaitForNodeEnd(0, kLong);
  ASSERT_TRUE(end.ok()) << end.status().ToString();
  EXPECT_EQ(end->state, NodeInfo::State::kLost);
  EXPECT_TRUE(testing::WaitUntil([&] { return agent->stats().tunnels_active == 0; }));
  EXPECT_EQ(agent->stats().tunnels_opened, 1u);
}

// ---- refusals ----

TEST(RelayTest, WrongKeysAreRefusedOnBothPorts) {
  LogCapture logs;
  auto server = StartServer(1);
  auto relay = StartRelay();
  ASSERT_TRUE(server && relay);
  // Another job's secret, on either port.
  auto node = CoordinatorClient::Connect("127.0.0.1", relay->node_port(), "another-jobs-secret-xyz");
  EXPECT_EQ(node.status().code(), StatusCode::kUnauthenticated) << node.status().ToString();
  auto agent = RelayAgent::Connect("127.0.0.1", relay->agent_port(), "another-jobs-secret-xyz", "127.0.0.1",
                                   server->port());
  EXPECT_EQ(agent.status().code(), StatusCode::kUnauthenticated) << agent.status().ToString();
  EXPECT_TRUE(Contains(agent.status().message(), "coordinator relay at 127.0.0.1:" +
                                                     std::to_string(relay->agent_port())))
      << agent.status().message();
  // The job's own secret does not open the agent port: a node cannot pass for the agent...
  auto as_agent = tcp::Dial("127.0.0.1", relay->agent_port(), kSecret, Deadline::After(kLong), "relay");
  EXPECT_EQ(as_agent.status().code(), StatusCode::kUnauthenticated) << as_agent.status().ToString();
  auto client_on_agent_port = CoordinatorClient::Connect("127.0.0.1", relay->agent_port(), kSecret);
  EXPECT_EQ(client_on_agent_port.status().code(), StatusCode::kUnauthenticated);
  // ...nor does the agent's key open the node port.
  auto key = coord::RelayAgentSecret(kSecret);
  ASSERT_TRUE(key.ok());
  EXPECT_EQ(key->size(), 32u);
  auto as_node = tcp::Dial("127.0.0.1", relay->node_port(), *key, Deadline::After(kLong), "relay");
  EXPECT_EQ(as_node.status().code(), StatusCode::kUnauthenticated);
  EXPECT_NE(logs.WaitFor({"coordinator relay (agent port): rejected unauthenticated connection", "bad HMAC"}), "");
  EXPECT_NE(logs.WaitFor({"coordinator relay (node port): rejected unauthenticated connection", "bad HMAC"}), "");
  EXPECT_FALSE(relay->stats().agent_connected);
  // The relay still takes its real agent.
  auto real = ConnectAgent(*relay, *server);
  ASSERT_TRUE(real);
  EXPECT_TRUE(real->ok());
}

TEST(RelayTest, AgentPortPeersMustSayWhatTheyAre) {
  LogCapture logs;
  RelayedJob job = StartRelayedJob(1);
  ASSERT_TRUE(job.server && job.relay && job.agent);
  auto& relay = job.relay;
  auto& agent = job.agent;

  Fd odd = DialAgentPort(relay->agent_port());  // a Heartbeat is no first frame
  Send(odd.get(), coord::HeartbeatMessage{});
  const std::string odd_peer = "127.0.0.1:" + std::to_string(*tcp::LocalPort(odd.get()));
  EXPECT_NE(logs.WaitFor({"ERROR", odd_peer, "its first frame is Heartbeat (type 8), not RelayControl or RelayData"}),
            "");

  Fd second = DialAgentPort(relay->agent_port());  // one control connection at a time
  Send(second.get(), coord::RelayControlMessage{});
  const std::string second_peer = "127.0.0.1:" + std::to_string(*tcp::LocalPort(second.get()));
  EXPECT_NE(logs.WaitFor({"ERROR", "refused a second control connection from " + second_peer}), "");

  Fd stray = DialAgentPort(relay->agent_port());  // data for a tunnel nobody asked for
  Send(stray.get(), coord::RelayDataMessage{.tunnel_id = 4242});
  EXPECT_NE(logs.WaitFor({"ERROR", "for tunnel 4242: no node waits for it"}), "");

  Fd old = DialAgentPort(relay->agent_port());  // another relay version
  Send(old.get(), coord::RelayControlMessage{.version = 7});
  EXPECT_NE(logs.WaitFor({"ERROR", "speaks relay version 7"}), "");

  Fd big = DialAgentPort(relay->agent_port());  // frames beyond the relay's small cap
  codec::Writer header;
  header.PutU32(1 << 20);
  header.PutU16(static_cast<uint16_t>(coord::MsgType::kRelayControl));
  header.PutU16(tcp::kProtocolVersion);
  ASSERT_TRUE(tcp::WriteAll(big.get(), header.data().data(), header.data().size(), Deadline::After(kLong), "w").ok());
  EXPECT_NE(logs.WaitFor({"ERROR", "frame of 1048576 bytes", "exceeds"}), "");

  // The real agent kept its place, and a job still runs through it.
  EXPECT_TRUE(agent->ok());
  EXPECT_FALSE(relay->Wait(Duration(0)).has_value());
  auto clients = RegisterAll(relay->node_port(), 1);
  ASSERT_TRUE(clients[0]);
  EXPECT_TRUE(clients[0]->Done().ok());
}

// A fake agent that reads the relay's RelayOpen but opens no tunnel.
TEST(RelayTest, ANodeWithoutATunnelIsClosedAfterOpenTimeoutAndParkingIsBounded) {
  LogCapture logs;
  RelayOptions o = Options();
  o.open_timeout = Duration(600);
  o.max_parked = 1;
  o.agent_timeout = Duration(5000);
  auto relay = StartRelay(o);
  ASSERT_TRUE(relay);
  Fd fake = DialAgentPort(relay->agent_port());
  Send(fake.get(), coord::RelayControlMessage{});
  ASSERT_TRUE(testing::WaitUntil([&] { return relay->stats().agent_connected; }));

  auto parked = ConnectNode(relay->node_port());
  ASSERT_TRUE(parked);
  auto frame = tcp::ReadFrame(fake.get(), 64, Deadline::After(kLong), "relay");
  ASSERT_TRUE(frame.ok()) << frame.status().ToString();
  ASSERT_EQ(frame->type, static_cast<uint16_t>(coord::MsgType::kRelayOpen));
  auto open = coord::DecodeRelayOpen(frame->payload);
  ASSERT_TRUE(open.ok());
  EXPECT_EQ(open->tunnel_id, 1u);

  auto over = ConnectNode(relay->node_port());  // the one parking place is taken
  ASSERT_TRUE(over);
  EXPECT_NE(logs.WaitFor({"ERROR", "1 node connections already wait for their tunnel (max_parked)"}), "");
  EXPECT_EQ(over->Register(Addr(1), Duration(2000)).status().code(), StatusCode::kUnavailable);

  EXPECT_NE(logs.WaitFor({"WARN", "closed the connection of node 127.0.0.1:",
                          "the agent opened no tunnel for it within open_timeout (600ms)"}),
            "");
  EXPECT_EQ(parked->Register(Addr(0), Duration(2000)).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(relay->stats().nodes_refused, 2u);
  EXPECT_EQ(relay->stats().tunnels_opened, 0u);
}

// The agent cannot reach its coordinator: each node's connection closes at once.
TEST(RelayTest, ATunnelWhoseCoordinatorIsGoneClosesTheNode) {
  LogCapture logs;
  int gone;
  {
    auto l = tcp::Listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    gone = *tcp::LocalPort(l->get());
  }
  auto relay = StartRelay();
  ASSERT_TRUE(relay);
  auto agent = RelayAgent::Connect("127.0.0.1", relay->agent_port(), kSecret, "127.0.0.1", gone,
                                   {.connect_timeout = Duration(2000)});
  ASSERT_TRUE(agent.ok()) << agent.status().ToString();
  ASSERT_TRUE(testing::WaitUntil([&] { return relay->stats().agent_connected; }));
  auto node = ConnectNode(relay->node_port());
  ASSERT_TRUE(node);
  EXPECT_EQ(node->Register(Addr(0), Duration(5000)).status().code(), StatusCode::kUnavailable);
  EXPECT_NE(logs.WaitFor({"WARN", "relay agent: tunnel 1 not opened: cannot dial the coordinator at 127.0.0.1:" +
                                      std::to_string(gone)}),
            "");
  EXPECT_TRUE((*agent)->ok());  // the agent serves the next node all the same
  EXPECT_EQ((*agent)->stats().tunnels_opened, 0u);
}

TEST(RelayTest, StartAndConnectValidateTheirOptions) {
  RelayOptions o = Options();
  o.secret = "short";
  EXPECT_EQ(CoordinatorRelay::Start(o).status().code(), StatusCode::kInvalidArgument);
  o = Options();
  o.max_parked = 0;
  EXPECT_EQ(CoordinatorRelay::Start(o).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(RelayAgent::Connect("127.0.0.1", 1, "short", "127.0.0.1", 1).status().code(),
            StatusCode::kInvalidArgument);
  // Nothing listens: Unavailable naming the relay.
  int port;
  {
    auto l = tcp::Listen("127.0.0.1", 0);
    ASSERT_TRUE(l.ok());
    port = *tcp::LocalPort(l->get());
  }
  auto a = RelayAgent::Connect("127.0.0.1", port, kSecret, "127.0.0.1", 1, {.connect_timeout = Duration(500)});
  EXPECT_EQ(a.status().code(), StatusCode::kUnavailable);
  EXPECT_TRUE(Contains(a.status().message(), "cannot reach the coordinator relay at 127.0.0.1:" + std::to_string(port)))
      << a.status().message();
}

}  // namespace
}  // namespace ember
