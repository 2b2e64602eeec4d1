// CoordinatorClient: one authenticated connection to the coordinator.
//
// Threads: the caller's threads send requests (writes serialized by
// write_mu) and wait on their own Pending slot; a reader thread dispatches
// replies by request id and queues pushes; a heartbeat thread runs once
// Register succeeded.
#include <sys/socket.h>

#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <stop_token>
#include <thread>

#include "ember/deadline.h"
#include "common/fd.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "coordinator/codec.h"
#include "ember/coordinator.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ember {
namespace {

using coord::MsgType;
constexpr Duration kReplyGrace{5000};       // beyond a request's own timeout
constexpr Duration kRequestTimeout{30000};  // requests that do not wait server-side
constexpr Duration kCallWriteTimeout{10000};
constexpr Duration kMinHeartbeat{10};

// timeout + kReplyGrace without overflow.
Duration WithGrace(Duration timeout) {
  return timeout > Duration::max() - kReplyGrace ? Duration::max() : timeout + kReplyGrace;
}

struct Pending {
  bool done = false;
  Status status;
  std::string body;
};

}  // namespace

struct CoordinatorClient::Impl {
  std::string address;  // "host:port", for messages
  ClientOptions options;
  Fd fd;
  std::thread reader;
  std::jthread heartbeat;
  std::mutex write_mu;  // one frame at a time on fd

  Mutex mu;
  CondVar cv;  // pending replies, pushes, loss
  uint32_t next_id GUARDED_BY(mu) = 1;
  std::map<uint32_t, std::shared_ptr<Pending>> pending GUARDED_BY(mu);
  std::deque<Push> pushes GUARDED_BY(mu);
  bool lost GUARDED_BY(mu) = false;  // the connection died under us
  std::string lost_reason GUARDED_BY(mu);
  bool closed GUARDED_BY(mu) = false;

  std::mutex hb_mu;
  std::condition_variable_any hb_cv;

  Status Write(MsgType type, std::string_view payload) {
    std::lock_guard<std::mutex> lock(write_mu);
    return tcp::WriteFrame(fd.get(), static_cast<uint16_t>(type), payload,
                           Deadline::After(kCallWriteTimeout), address);
  }

  // A one-way message (coord::LogMessage, ...): request id 0, no reply.
  template <class Message>
  Status SendOneWay(const Message& message) {
    {
      MutexLock lock(&mu);
      if (lost) return Status::Unavailable(lost_reason);
      if (closed) return Status::Cancelled("the coordinator client was closed");
    }
    return Write(Message::kType, coord::Encode(message));
  }

  // Sends `request` (coord::RegisterRequest, ...) under a fresh request id and
  // waits up to `wait` for its reply; returns the reply's body.
  template <class Request>
  Result<std::string> Call(Request request, Duration wait) {
    constexpr MsgType type = Request::kType;
    auto slot = std::make_shared<Pending>();
    uint32_t id;
    {
      MutexLock lock(&mu);
      if (lost) return Status::Unavailable(lost_reason);
      if (closed) return Status::Cancelled("the coordinator client was closed");
      id = next_id++;
      if (next_id == 0) next_id = 1;  // 0 marks one-way messages and pushes
      pending[id] = slot;
    }
    request.request_id = id;
    Status sent = Write(type, coord::Encode(request));
    MutexLock lock(&mu);
    if (!sent.ok()) {
      pending.erase(id);
      return Status::Unavailable("cannot send " + std::string(coord::MsgTypeName(uint16_t(type))) +
                                 " to the Ember coordinator at " + address + ": " + sent.message());
    }
    const Deadline deadline = Deadline::After(wait);
    while (!slot->done && cv.WaitUntil(&mu, deadline.when())) {
    }
    if (!slot->done) {
      pending.erase(id);
      return Status::DeadlineExceeded("no reply to " +
                                      std::string(coord::MsgTypeName(uint16_t(type))) +
                                      " from the Ember coordinator at " + address + " within " +
                                      FormatDuration(wait));
    }
    if (!slot->status.ok()) return slot->status;
    return std::move(slot->body);
  }

  void FailAll(const Status& why) {
    MutexLock lock(&mu);
    if (!closed && !lost) {
      lost = true;
      lost_reason = "lost the connection to the Ember coordinator at " + address + ": " +
                    why.message();
    }
    const Status st = closed ? Status::Cancelled("the coordinator client was closed")
                             : Status::Unavailable(lost_reason);
    for (auto& [id, slot] : pending) {
      slot->done = true;
      slot->status = st;
    }
    pending.clear();
    cv.SignalAll();
  }

  void QueuePush(Push push) {
    MutexLock lock(&mu);
    pushes.push_back(std::move(push));
    cv.SignalAll();
  }

  void ReaderLoop() {
    for (;;) {
      Result<tcp::Frame> frame =
          tcp::ReadFrame(fd.get(), options.max_message_bytes, Deadline::Infinite(), address);
      if (!frame.ok()) return FailAll(frame.status());
      const auto type = static_cast<MsgType>(frame->type);
      if (type == MsgType::kReply) {
        Result<coord::Reply> reply = coord::DecodeReply(frame->payload);
        if (!reply.ok()) return FailAll(reply.status());
        MutexLock lock(&mu);
        auto it = pending.find(reply->request_id);
        if (it == pending.end()) continue;  // its caller gave up waiting
        it->second->done = true;
        it->second->status = std::move(reply->status);
        it->second->body = std::move(reply->body);
        pending.erase(it);
        cv.SignalAll();
      } else if (type == MsgType::kAbort) {
        Result<coord::AbortPush> abort = coord::DecodeAbort(frame->payload);
        if (!abort.ok()) return FailAll(abort.status());
        QueuePush({Push::Kind::kAbort, std::move(abort->reason)});
      } else if (type == MsgType::kStop) {
        Result<coord::StopPush> stop = coord::DecodeStop(frame->payload);
        if (!stop.ok()) return FailAll(stop.status());
        QueuePush({Push::Kind::kStop, std::move(stop->reason)});
      } else {
        return FailAll(Status::Corruption("unknown message type " + std::to_string(frame->type)));
      }
    }
  }

  void HeartbeatLoop(std::stop_token stop) {
    const Duration interval = std::max(options.heartbeat_interval, kMinHeartbeat);
    std::unique_lock<std::mutex> lock(hb_mu);
    while (!hb_cv.wait_for(lock, stop, interval, [] { return false; }) &&
           !stop.stop_requested()) {
      lock.unlock();
      (void)SendOneWay(coord::HeartbeatMessage{});  // a dead link shows in the reader
      lock.lock();
    }
  }
};

CoordinatorClient::CoordinatorClient() : impl_(std::make_unique<Impl>()) {}
CoordinatorClient::~CoordinatorClient() { Close(); }

Result<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    const std::string& host, int port, const std::string& secret, const ClientOptions& options) {
  const std::string address = host + ":" + std::to_string(port);
  const Deadline deadline = Deadline::After(options.connect_timeout);
  const std::string within = " within " + FormatDuration(options.connect_timeout) + ": ";
  bool connect_failed = false;
  Result<Fd> fd = tcp::Dial(host, port, secret, deadline, address, &connect_failed);
  if (!fd.ok() && connect_failed) {
    std::string why = fd.status().message();
    const std::string prefix = "connect to " + address + ": ";
    if (why.rfind(prefix, 0) == 0) why = why.substr(prefix.size());
    return Status::Unavailable("cannot reach the Ember coordinator at " + address + within + why +
                               ". Is the driver running and reachable from this executor "
                               "(firewall, spark.driver.host)?");
  }
  if (fd.status().code() == StatusCode::kUnauthenticated) return fd.status();
  if (!fd.ok()) {
    return Status::Unavailable("cannot complete the handshake with the Ember coordinator at " +
                               address + within + fd.status().message());
  }
  std::unique_ptr<CoordinatorClient> client(new CoordinatorClient());
  Impl& impl = *client->impl_;
  impl.address = address;
  impl.options = options;
  impl.fd = fd.MoveValueUnsafe();
  impl.reader = std::thread(&Impl::ReaderLoop, &impl);
  return client;
}

void CoordinatorClient::Close() {
  Impl& impl = *impl_;
  {
    MutexLock lock(&impl.mu);
    if (impl.closed) return;
    impl.closed = true;
  }
  ::shutdown(impl.fd.get(), SHUT_RDWR);  // wakes the reader and any blocked write
  if (impl.heartbeat.joinable()) {
    impl.heartbeat.request_stop();
    impl.heartbeat.join();
  }
  if (impl.reader.joinable()) impl.reader.join();
  impl.FailAll(Status::Cancelled("closed"));
  (void)impl.fd.Close();
}

Result<Registration> CoordinatorClient::Register(const NodeAddress& self, Duration timeout) {
  EMBER_ASSIGN_OR_RAISE(std::string body,
                        impl_->Call(coord::RegisterRequest{.self = self, .timeout = timeout},
                                    WithGrace(timeout)));
  Result<Registration> reg = coord::DecodeRegisterReply(body);
  if (!reg.ok()) {
    return reg.status().WithContext("reply from the Ember coordinator at " + impl_->address);
  }
  if (!impl_->heartbeat.joinable()) {
    impl_->heartbeat = std::jthread([impl = impl_.get()](std::stop_token st) {
      impl->HeartbeatLoop(std::move(st));
    });
  }
  return reg;
}

Status CoordinatorClient::Attach(int executor_id) {
  return impl_->Call(coord::AttachRequest{.executor_id = executor_id}, kRequestTimeout).status();
}

Status CoordinatorClient::Barrier(const std::string& name, Duration timeout) {
  return impl_->Call(coord::BarrierRequest{.name = name, .timeout = timeout}, WithGrace(timeout))
      .status();
}

Status CoordinatorClient::KvSet(const std::string& key, const std::string& value) {
  return impl_->Call(coord::KvSetRequest{.key = key, .value = value}, kRequestTimeout).status();
}

Result<std::string> CoordinatorClient::KvGet(const std::string& key, Duration timeout) {
  EMBER_ASSIGN_OR_RAISE(std::string body, impl_->Call(coord::KvGetRequest{.key = key, .timeout = timeout},
                                                      WithGrace(timeout)));
  Result<std::string> value = coord::DecodeKvGetReply(body);
  if (!value.ok()) {
    return value.status().WithContext("reply from the Ember coordinator at " + impl_->address);
  }
  return value;
}

Status CoordinatorClient::Log(const std::string& stream, const std::string& line) {
  return impl_->SendOneWay(coord::LogMessage{.stream = stream, .line = line});
}

Status CoordinatorClient::Report(const std::map<std::string, double>& metrics) {
  return impl_->SendOneWay(coord::ReportMessage{.metrics = metrics});
}

Status CoordinatorClient::Done() {
  return impl_->Call(coord::DoneRequest{}, kRequestTimeout).status();
}

Status CoordinatorClient::Fail(const std::string& error) {
  return impl_->Call(coord::FailRequest{.error = error}, kRequestTimeout).status();
}

std::optional<CoordinatorClient::Push> CoordinatorClient::NextPush(Duration timeout) {
  Impl& impl = *impl_;
  const Deadline deadline = Deadline::After(timeout);
  MutexLock lock(&impl.mu);
  while (impl.pushes.empty() && !impl.lost && !impl.closed && impl.cv.WaitUntil(&impl.mu, deadline.when())) {
  }
  if (!impl.pushes.empty()) {
    Push p = std::move(impl.pushes.front());
    impl.pushes.pop_front();
    return p;
  }
  if (impl.lost) return Push{Push::Kind::kAbort, impl.lost_reason};  // sticky once lost
  return std::nullopt;
}

}  // namespace ember
