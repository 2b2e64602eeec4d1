// Ember's coordinator: the rendezvous every node of a job meets at.
//
// The driver starts one CoordinatorServer per job.  Each node's launcher (the
// Spark task that owns the node process) connects a CoordinatorClient,
// registers, and receives the cluster spec once every expected node is in.
// The server then serves barriers and a small key/value store, collects
// logs, progress reports and exit reports, watches heartbeats, and on any
// node failure broadcasts an abort so every node stops within seconds.
//
// Every connection starts with the authenticated handshake of transport/tcp/handshake.h
// (HMAC-SHA256 challenge-response over the per-job secret).  A peer that
// fails it is logged and dropped before any payload is parsed.
//
// Messages and their encodings are documented in docs/wire.md.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ember/deadline.h"
#include "ember/result.h"
#include "ember/roles.h"
#include "ember/status.h"

namespace ember {

// What a node tells the coordinator about itself when it registers.
struct NodeAddress {
  int executor_id = 0;
  std::string host;  // address other nodes use to reach this node
  int port = 0;      // port reserved for the framework's server (TF gRPC)
  int64_t pid = 0;   // the launcher's pid, for error messages
};

// A registered node as the server sees it.
struct NodeInfo {
  NodeAddress address;
  RoleAssignment role;
  enum class State { kRegistered, kRunning, kDone, kFailed, kLost } state =
      State::kRegistered;
  std::string error;  // for kFailed/kLost: what happened, with traceback
};

// What Register() returns once every expected node is in.
struct Registration {
  RoleAssignment role;
  // TF-style cluster spec: {"ps": ["h:p", ...], "chief": [...], "worker": [...],
  // "evaluator": [...]}; each list ordered by task_index.  JSON text.
  std::string cluster_spec_json;
  int num_nodes = 0;
  std::vector<NodeInfo> nodes;  // every node, ordered by executor_id
};

// Something the driver should know about; drained with PollEvents().
struct Event {
  enum class Kind {
    kLog,         // text = one line of the node's stdout/stderr; stream = "stdout"/"stderr"
    kProgress,    // metrics = what the node reported (step, loss, samples, ...)
    kRegistered,  // a node registered
    kNodeDone,    // node exited cleanly
    kNodeFailed,  // node reported a failure or was lost; text = error
    kNodeDeparted,  // a worker failed or was lost within tolerated_worker_losses: the job goes
                    // on without it; text = error
    kAbort,       // the server broadcast an abort; text = reason
  } kind = Kind::kLog;
  int executor_id = -1;
  std::string job_name;
  int task_index = -1;
  std::string stream;
  std::string text;
  std::map<std::string, double> metrics;
};

struct CoordinatorOptions {
  std::string bind_host = "0.0.0.0";
  int port = 0;        // 0 = any free port
  std::string secret;  // per-job secret, at least 16 bytes; required
  ClusterLayout layout;
  Duration handshake_timeout{5000};     // a peer must finish the handshake within this
  Duration heartbeat_timeout{30000};    // a registered node silent this long is lost
  size_t max_message_bytes = 16 << 20;  // larger frames are rejected
  // Asynchronous jobs (parameter servers) may go on without some workers: up to this many
  // nodes of role "worker" may fail or be lost without aborting the job.  Each such node
  // departs (Event kNodeDeparted): barriers and WaitForNodes stop waiting for it, nobody is
  // told to abort.  Past the count, and for every other role, a failure aborts as usual.
  // A node registering under a departed worker's executor id replaces it (Event kRegistered,
  // text "replaces <the old node>"): the job is whole again, the cluster spec holds the new
  // address, and the old node's connections are ignored from then on.
  int tolerated_worker_losses = 0;
};

// Thread-safe: every method may be called from any thread.
class CoordinatorServer {
 public:
  // Binds, listens and starts serving on background threads.
  // Fails with InvalidArgument for a bad layout or a short secret, IOError if
  // the address cannot be bound.
  static Result<std::unique_ptr<CoordinatorServer>> Start(const CoordinatorOptions& options);

  // Stops serving, closes every connection, joins every thread.  Idempotent.
  ~CoordinatorServer();
  void Close();

  int port() const;

  // Blocks until all layout.num_nodes nodes have registered.  On timeout
  // returns DeadlineExceeded naming each missing executor id and its expected
  // role, and the nodes that did register (role, host); the caller, who
  // knows the whole wait, says how long it was.  Returns the abort
  // reason (Aborted) if the job was aborted while waiting.
  Status WaitForRegistration(Duration timeout);

  // Snapshot of every node that registered, ordered by executor_id.
  std::vector<NodeInfo> Nodes() const;

  // Cluster spec JSON (see Registration); empty until everyone registered.
  std::string ClusterSpecJson() const;

  // The value nodes stored under `key` (KvSet), or nullopt; never waits.
  std::optional<std::string> KvGet(const std::string& key) const;

  // Blocks until a node has stored `key` (KvSet) and returns the value.
  // Wakes at once when the job fails: Aborted with the first node failure
  // (naming node, host and error) or the abort reason; Cancelled after
  // Close(); DeadlineExceeded naming the key if `timeout` passes first.
  Result<std::string> WaitForKey(const std::string& key, Duration timeout);

  // Blocks until node `executor_id` has ended (kDone, kFailed or kLost) and
  // returns its final info.  Aborted (the abort reason) if the job is
  // aborted first, Cancelled after Close(), DeadlineExceeded naming the node
  // and its state, InvalidArgument for an id outside the layout.
  Result<NodeInfo> WaitForNodeEnd(int executor_id, Duration timeout);

  // Returns queued events, waiting up to `timeout` for the first one.
  // Returns an empty vector on timeout or after Close().
  std::vector<Event> PollEvents(Duration timeout);

  // Blocks until every node whose role is in `job_names` (all nodes if empty)
  // is kDone (or departed: a tolerated worker loss).  Returns the first failure (Aborted, naming node, host and
  // error) as soon as any node fails (or the abort reason after Abort()),
  // or DeadlineExceeded naming the nodes still running.
  Status WaitForNodes(const std::vector<std::string>& job_names, Duration timeout);

  // Broadcasts Stop to nodes whose role is in `job_names` (all if empty):
  // their launchers end the node process and report kDone.
  void StopNodes(const std::vector<std::string>& job_names);

  // Marks the job aborted and broadcasts Abort(reason) to every node.
  void Abort(const std::string& reason);

 private:
  CoordinatorServer();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct ClientOptions {
  Duration connect_timeout{10000};      // connect + handshake
  Duration heartbeat_interval{2000};    // sent by a background thread once registered
  size_t max_message_bytes = 16 << 20;
};

// A connection to the coordinator.  Thread-safe: requests may be issued from
// several threads; each waits for its own reply.  Pushed messages (Abort,
// Stop) are queued and read with NextPush().
class CoordinatorClient {
 public:
  // Connects and authenticates.  Unavailable (naming host:port and what to
  // check) if nothing listens or the deadline passes; Unauthenticated if the
  // server does not prove the secret.
  static Result<std::unique_ptr<CoordinatorClient>> Connect(const std::string& host, int port,
                                                            const std::string& secret,
                                                            const ClientOptions& options = {});
  ~CoordinatorClient();
  void Close();  // idempotent

  // Registers this node and waits (up to `timeout`) for every other node.
  // After success this connection is the node's lifeline: heartbeats start,
  // and losing it without Done()/Fail() counts as the node being lost.
  // DeadlineExceeded names the nodes still missing; InvalidArgument if the
  // executor id is out of range or already taken; Aborted if the job aborted.
  Result<Registration> Register(const NodeAddress& self, Duration timeout);

  // Secondary connection from the node's own process: identifies the
  // connection as belonging to `executor_id` without changing its state.
  Status Attach(int executor_id);

  // Waits until all num_nodes nodes have entered barrier `name` (departed nodes, tolerated
  // worker losses, are not waited for).  Needs a
  // registered or attached connection.  Each name completes once; entering a
  // completed barrier returns at once.
  Status Barrier(const std::string& name, Duration timeout);

  Status KvSet(const std::string& key, const std::string& value);
  // Waits until `key` is set; DeadlineExceeded names the key.
  Result<std::string> KvGet(const std::string& key, Duration timeout);

  // One-way: OK means the message was written to the socket, not that the
  // server processed it.
  Status Log(const std::string& stream, const std::string& line);
  Status Report(const std::map<std::string, double>& metrics);

  // Final reports; the server then expects the connection to close.
  Status Done();
  Status Fail(const std::string& error);

  struct Push {
    enum class Kind { kAbort, kStop } kind;
    std::string reason;
  };
  // Waits up to `timeout` for a pushed message.  Returns nullopt on timeout.
  // If the connection to the server is lost, returns kAbort with a reason
  // naming the coordinator's address.
  std::optional<Push> NextPush(Duration timeout);

 private:
  CoordinatorClient();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// ---- the coordinator's endpoint inside the job -----------------------------
//
// Where the executors cannot dial the client that runs the CoordinatorServer
// (Spark Connect, NAT, firewalls) but the client can dial out to them, a
// CoordinatorRelay runs in a process on an executor and a RelayAgent in the
// client, next to the server:
//
//   node ──dial──> relay node port   relay agent port <──dial── agent ──dial──> coordinator
//        (job secret)                   (derived secret)                (job secret)
//
// The agent holds one control connection to the relay.  For each node that
// dials the relay's node port (exactly as it would dial the coordinator: same
// secret, same handshake) the relay asks the agent, on the control
// connection, to open a tunnel; the agent dials the relay's agent port again
// for it, dials the coordinator, and both sides copy bytes until either end
// closes.  After the two handshakes the coordinator's protocol is plain
// frames, so the node and the server talk end to end as if connected
// directly; a node that disconnects reaches the server as a disconnect.  The
// agent port takes a key derived from the job's secret
// (HMAC-SHA256(secret, "ember-relay-agent")), so a node can never pass for the
// agent.  docs/wire.md, "Coordinator relay", has the messages.

struct RelayOptions {
  std::string bind_host = "0.0.0.0";
  int node_port = 0;   // nodes dial this one; 0 = any free port
  int agent_port = 0;  // the client's agent dials this one; 0 = any free port
  std::string secret;  // the job's secret, at least 16 bytes; required
  Duration handshake_timeout{5000};  // a peer on either port must finish the handshake (and say
                                     // what it is, on the agent port) within this
  // The agent's lease: its control connection must arrive within this of Start(), and the
  // relay ends when the connection is silent this long (the agent heartbeats every
  // RelayAgentOptions::heartbeat_interval).
  Duration agent_timeout{30000};
  // A node waits at most this for the agent's control connection (when it is not up yet: the
  // agent dials after the relay reported its ports), then as long for its tunnel; else it is closed.
  Duration open_timeout{30000};
  size_t max_parked = 256;       // nodes waiting for their tunnel at once; more are closed
};

struct RelayStats {
  bool agent_connected = false;  // the agent's control connection is up (and the relay has not ended)
  uint64_t tunnels_opened = 0;  // node connections joined to the coordinator
  uint64_t tunnels_active = 0;  // of those, still open
  uint64_t nodes_refused = 0;   // node connections closed without a tunnel: no agent,
                                // max_parked reached, open_timeout passed, or the relay ended
};

// Runs on an executor.  Thread-safe: every method may be called from any thread.
class CoordinatorRelay {
 public:
  // Binds both ports and starts serving on background threads.  InvalidArgument
  // for a secret shorter than 16 bytes or a non-positive timeout or cap; IOError
  // naming the address if a port cannot be bound.
  static Result<std::unique_ptr<CoordinatorRelay>> Start(const RelayOptions& options);

  // Close()s.
  ~CoordinatorRelay();
  CoordinatorRelay(const CoordinatorRelay&) = delete;
  CoordinatorRelay& operator=(const CoordinatorRelay&) = delete;

  int node_port() const;
  int agent_port() const;

  // Blocks until the relay has ended, up to `timeout`, and returns why; nullopt
  // if it is still running when `timeout` passes.  The relay ends, closing every
  // node connection and tunnel (the nodes then see their coordinator go away), with:
  //   OK                when the agent closed its control connection (RelayAgent::Close());
  //   DeadlineExceeded  "no agent connected to the relay at <host>:<agent_port> within <N>s",
  //                     or "the relay's agent at <peer> was silent for <N>s";
  //   Unavailable       the control connection failed (reset, not closed);
  //   Corruption        the agent sent a frame the relay does not take;
  //   Cancelled         after Close().
  std::optional<Status> Wait(Duration timeout);

  RelayStats stats() const;

  // Ends the relay (if it has not ended), closes both ports and every
  // connection, and joins every thread.  Idempotent.
  void Close();

 private:
  CoordinatorRelay();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

struct RelayAgentOptions {
  Duration connect_timeout{10000};    // each dial (relay or coordinator), connect + handshake
  Duration heartbeat_interval{1000};  // keep well below the relay's agent_timeout
};

struct RelayAgentStats {
  uint64_t tunnels_opened = 0;  // tunnels joined to the coordinator
  uint64_t tunnels_active = 0;  // of those, still open
};

// Runs in the client, next to the CoordinatorServer.  Thread-safe.
class RelayAgent {
 public:
  // Dials the relay's agent port with the key derived from `secret`, takes the
  // control connection and serves the relay's tunnel requests on background
  // threads, each tunnel dialling the coordinator at
  // coordinator_host:coordinator_port with `secret`.  Unavailable (naming the
  // relay's address) if it cannot be reached within connect_timeout;
  // Unauthenticated if it does not take the key (another job's relay);
  // InvalidArgument for a secret shorter than 16 bytes or a non-positive interval.
  static Result<std::unique_ptr<RelayAgent>> Connect(const std::string& relay_host, int agent_port,
                                                     const std::string& secret,
                                                     const std::string& coordinator_host, int coordinator_port,
                                                     const RelayAgentOptions& options = {});

  // Close()s.
  ~RelayAgent();
  RelayAgent(const RelayAgent&) = delete;
  RelayAgent& operator=(const RelayAgent&) = delete;

  // OK while the control connection is up.  Unavailable "the coordinator relay
  // at <host>:<port> closed its connection" once the relay ended (or the read
  // error that ended it); the agent's tunnels are closed then.  Cancelled after
  // Close() when nothing failed before.
  bool ok() const;
  Status status() const;

  RelayAgentStats stats() const;

  // Closes the control connection (the relay then ends with OK) and every
  // tunnel, and joins every thread.  Idempotent.
  void Close();

 private:
  RelayAgent();
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember
