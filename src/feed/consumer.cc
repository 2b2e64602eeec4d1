// Consumer: the node's end of the feed.  See ember/feed.h for the contract
// and feed/epoch.h for the equal-rows bound.
#include <algorithm>
#include <atomic>
#include <deque>
#include <map>
#include <set>

#include "ember/deadline.h"
#include "common/logging.h"
#include "common/mutex.h"
#include "common/shm.h"
#include "common/thread_annotations.h"
#include "ember/device.h"
#include "ember/feed.h"
#include "feed/codec.h"
#include "feed/epoch.h"
#include "feed/feed_ring.h"
#include "transport/shm/ring.h"

namespace ember::feed {
namespace {

// Messages are leased from the ring (read in place, ring.h).  Leases that
// pin more than this share of the ring are revoked (copied once into private
// pages), so a node that keeps every batch alive never stalls its producers.
constexpr uint64_t kPinnedShare = 2;  // capacity / kPinnedShare
constexpr int kMaxPageLockedRevokes = 4;  // then page-locking stops for the pass

// One partition being fed to this node (inference: its rows get answers).
struct Session {
  uint32_t partition = 0;
  uint32_t epoch = 0;
  std::unique_ptr<shm::Ring> result_ring;  // inference: where the answers go
  int64_t received = 0;  // rows that arrived
  int64_t handed = 0;    // rows handed out
  int64_t answered = 0;  // results sent back
  std::optional<int64_t> rows;  // the total, known at kEndPartition
  bool ended() const { return rows.has_value(); }
};

// Arrival-ordered: rows of a batch message (shrinking as they are handed
// out), or a partition's end.
struct Event {
  bool is_rows = false;
  std::shared_ptr<Session> session;
  uint32_t epoch = 0;
  std::shared_ptr<const void> owner;  // keeps `message` valid
  std::span<const uint8_t> message;
  uint64_t message_id = 0;
  int64_t offset = 0;
  int64_t rows = 0;
};

}  // namespace

class Consumer::Impl {
 public:
  ConsumerOptions options;
  std::unique_ptr<shm::Ring> ring;
  std::deque<Event> events;
  std::map<std::pair<uint32_t, uint32_t>, std::shared_ptr<Session>> sessions;  // (partition, epoch)
  std::deque<std::shared_ptr<Session>> open_sessions;  // inference, awaiting answers, in order
  std::map<uint32_t, EpochBound> epochs;
  bool end_of_feed = false;
  // Terminate() may come from any thread while the reading thread is inside a
  // call (TFoS: tf.data's generator thread reads, the user's thread calls
  // DataFeed.terminate()).  It only sets this flag and terminates the ring,
  // which wakes a read blocked there; the reading thread owns everything
  // else, and acts on the flag in Terminated().
  std::atomic<bool> terminate_requested{false};
  bool terminated = false;  // the reading thread's: the flag seen and acted on
  std::set<uint32_t> finished_epochs;       // claimed by BeginEpoch: their remainder is dropped
  std::optional<uint32_t> current_epoch;    // the one NextEpochBatch hands out now
  int64_t epoch_taken = 0;
  uint64_t next_message_id = 1;
  uint32_t mark = 0;  // the training epoch begun + 1, as published in the ring (Ring::SetMark)
  bool page_locked = false;     // PageLockRows in force
  int page_locked_revokes = 0;  // revokes since PageLockRows

  std::string Node() const { return "node " + options.node; }

  // The reading thread: true once Terminate() was called (on any thread); the
  // first time, drops what was queued (the leases go back to the ring).
  bool Terminated() {
    if (!terminated && terminate_requested.load(std::memory_order_acquire)) {
      terminated = true;
      events.clear();
    }
    return terminated;
  }

  bool Stale(const Event& e) const { return finished_epochs.count(e.epoch) && current_epoch != e.epoch; }

  // Reads and handles one message; false at the end of the feed.
  Result<bool> ReadMessage();
  Status Handle(uint32_t kind, std::shared_ptr<const void> owner, std::span<const uint8_t> payload);
  std::shared_ptr<Session> GetSession(uint32_t partition, uint32_t epoch);
  Result<std::vector<RowRange>> Take(int64_t n, bool stop_at_partition, std::optional<uint32_t> epoch);
  // The next epoch with news, skipping (and dropping) validation epochs for
  // kTraining; of any kind for std::nullopt (a peek that drops nothing).
  Result<std::optional<uint32_t>> NextEpoch(std::optional<EpochKind> kind);
  // Tells the driver this node began training epoch `epoch` (AwaitEpoch).
  void MarkBegun(uint32_t epoch) {
    if (epoch == kInferenceEpoch || !IsTrainingEpoch(epoch) || epoch + 1 <= mark) return;
    mark = epoch + 1;
    ring->SetMark(mark);
  }

  Status CheckAnswered();
  Status CheckPreviousAnswered(const Session* session);
  Status Send(Session* session, FeedKind kind, std::span<const uint8_t> payload);
  Status MaybeFinish(const std::shared_ptr<Session>& session);
  Status FailSession(const std::shared_ptr<Session>& session, const std::string& message);
  void CloseSession(const std::shared_ptr<Session>& session);
};

Result<bool> Consumer::Impl::ReadMessage() {
  if (end_of_feed || Terminated()) return false;
  if (ring->pinned_bytes() > ring->capacity() / kPinnedShare) {
    EMBER_RETURN_NOT_OK(ring->RevokeLeases().WithContext(Node()));
    if (page_locked && ++page_locked_revokes > kMaxPageLockedRevokes) {
      // Each revoke gives the page-locked memory back and locks a fresh view
      // (a device sync and milliseconds per MiB): a reader that keeps rows
      // this long is better served by staging copies.
      ring->ClearViewHooks();
      page_locked = false;
      EMBER_LOG(WARN) << Node() << ": rows were kept past half the feed ring " << page_locked_revokes
                      << " times while page-locked; the feed's memory is no longer page-locked for this "
                         "pass (batches are staged instead). Keep fewer batches, or raise feed_ring_bytes";
    }
  }
  std::shared_ptr<const shm::RingLease> lease;
  Status st = ring->ReadLease(&lease, Deadline::After(options.read_timeout));
  if (st.code() == StatusCode::kDeadlineExceeded) {
    return Status::DeadlineExceeded(Node() + ": no data arrived from Spark for " +
                                    FormatDuration(options.read_timeout) +
                                    ". Call cluster.train()/cluster.inference() on the driver, or pass a larger "
                                    "timeout to ctx.get_data_feed()");
  }
  if (st.code() == StatusCode::kCancelled) {  // the ring was terminated (by Terminate() on another thread)
    terminate_requested.store(true, std::memory_order_release);
    Terminated();
    return false;
  }
  if (!st.ok()) return st.WithContext(Node());
  const uint32_t kind = lease->kind();
  const std::span<const uint8_t> payload = lease->payload();
  EMBER_RETURN_NOT_OK(Handle(kind, std::move(lease), payload));
  return true;
}

std::shared_ptr<Session> Consumer::Impl::GetSession(uint32_t partition, uint32_t epoch) {
  auto& s = sessions[{partition, epoch}];
  if (!s) {  // training: no kBeginPartition; sessions only track markers
    s = std::make_shared<Session>();
    s->partition = partition;
    s->epoch = epoch;
  }
  return s;
}

Status Consumer::Impl::Handle(uint32_t kind, std::shared_ptr<const void> owner, std::span<const uint8_t> payload) {
  auto where = [&](const Status& st) { return st.WithContext(Node()); };
  switch (static_cast<FeedKind>(kind)) {
    case FeedKind::kBatch: {
      Result<BatchHeader> h = DecodeBatch(payload);
      if (!h.ok()) return where(h.status());
      if (h->rows == 0) return Status::OK();
      std::shared_ptr<Session> session = GetSession(h->partition, h->epoch);
      session->received += h->rows;
      if (h->epoch != kInferenceEpoch) epochs[h->epoch].AddRows(h->partition, h->rows, h->attempt);
      Event e;
      e.is_rows = true;
      e.session = std::move(session);
      e.epoch = h->epoch;
      e.owner = std::move(owner);
      e.message = payload;
      e.message_id = next_message_id++;
      e.rows = h->rows;
      events.push_back(std::move(e));
      return Status::OK();
    }
    case FeedKind::kEndPartition: {
      Result<EndPartitionMsg> m = DecodeEndPartition(payload);
      if (!m.ok()) return where(m.status());
      std::shared_ptr<Session> session = GetSession(m->partition, m->epoch);
      session->rows = session->received;
      if (m->epoch != kInferenceEpoch) EMBER_RETURN_NOT_OK(where(epochs[m->epoch].EndPartition(m->partition, m->node_rows)));
      Event e;
      e.session = session;
      e.epoch = m->epoch;
      events.push_back(std::move(e));
      auto it = sessions.find({m->partition, m->epoch});
      if (it != sessions.end() && it->second == session && !session->result_ring) sessions.erase(it);
      return MaybeFinish(session);
    }
    case FeedKind::kBeginPartition: {
      Result<BeginPartition> m = DecodeBeginPartition(payload);
      if (!m.ok()) return where(m.status());
      auto session = std::make_shared<Session>();
      session->partition = m->partition;
      session->epoch = m->epoch;
      if (m->wants_results()) {
        Result<std::unique_ptr<shm::Ring>> results = OpenFeedRing(m->result_ring);
        if (!results.ok()) {
          return where(results.status().WithContext("opening the result ring of partition " +
                                                    std::to_string(m->partition)));
        }
        session->result_ring = results.MoveValueUnsafe();
        // Both ends have it mapped now: drop its name, so that a feeding task killed before it
        // could close the ring (Spark kills a failed job's other tasks) leaves nothing in
        // /dev/shm.  The producer's own unlink then finds no name, which is fine.
        (void)UnlinkSharedMemoryName(m->result_ring);
        open_sessions.push_back(session);
      }
      sessions[{m->partition, m->epoch}] = std::move(session);
      return Status::OK();
    }
    case FeedKind::kEndEpoch: {
      Result<EndEpochMsg> m = DecodeEndEpoch(payload);
      if (!m.ok()) return where(m.status());
      epochs[m->epoch].SetPartitions(m->partitions);
      return Status::OK();
    }
    case FeedKind::kEndFeed:
      EMBER_RETURN_NOT_OK(where(DecodeEndFeed(payload)));
      end_of_feed = true;
      return Status::OK();
    default:
      return Status::Corruption(Node() + ": unexpected feed message of kind " + std::to_string(kind) + " (" +
                                KindName(kind) + ") in its ring");
  }
}

Result<std::vector<RowRange>> Consumer::Impl::Take(int64_t n, bool stop_at_partition, std::optional<uint32_t> epoch) {
  if (!epoch) current_epoch.reset();  // rows outside an epoch iteration: claimed epochs' rest is dropped
  if (!options.train_mode) EMBER_RETURN_NOT_OK(CheckAnswered());
  std::vector<RowRange> out;
  int64_t count = 0;
  while (count < n) {
    if (Terminated()) break;  // what this call took stays handed out; the next call gets nothing
    if (events.empty()) {
      EMBER_ASSIGN_OR_RAISE(bool more, ReadMessage());
      if (!more) break;
      continue;
    }
    Event& e = events.front();
    if (Stale(e) || (!epoch && e.epoch != kInferenceEpoch && !IsTrainingEpoch(e.epoch))) {
      events.pop_front();  // rows of a claimed epoch, or (read outside epochs) validation rows
      continue;
    }
    if (!epoch) MarkBegun(e.epoch);
    if (!e.is_rows) {
      events.pop_front();
      if (stop_at_partition && count > 0) break;
      if (!options.train_mode) EMBER_RETURN_NOT_OK(CheckAnswered());  // that partition is now fully handed out
      continue;
    }
    if (epoch && e.epoch != *epoch) break;
    if (!options.train_mode) EMBER_RETURN_NOT_OK(CheckPreviousAnswered(e.session.get()));
    const int64_t k = std::min(n - count, e.rows);
    RowRange r;
    r.owner = e.owner;
    r.message = e.message;
    r.ipc_offset = kBatchHeaderBytes;
    r.message_id = e.message_id;
    r.offset = e.offset;
    r.rows = k;
    r.partition = e.session->partition;
    r.epoch = e.epoch;
    out.push_back(std::move(r));
    e.session->handed += k;
    count += k;
    if (k == e.rows) {
      events.pop_front();
    } else {
      e.offset += k;
      e.rows -= k;
    }
  }
  return out;
}

Result<std::optional<uint32_t>> Consumer::Impl::NextEpoch(std::optional<EpochKind> kind) {
  current_epoch.reset();
  for (;;) {
    if (Terminated()) return std::optional<uint32_t>();
    while (!events.empty() && Stale(events.front())) events.pop_front();
    std::optional<uint32_t> next;
    for (const Event& e : events) {
      if (e.epoch == kInferenceEpoch || Stale(e)) continue;
      if (kind == EpochKind::kTraining && !IsTrainingEpoch(e.epoch)) {
        finished_epochs.insert(e.epoch);  // a validation epoch this node does not read: dropped
        continue;
      }
      next = e.epoch;
      break;
    }
    if (next) {
      if (kind == EpochKind::kValidation && IsTrainingEpoch(*next)) {
        return Status::InvalidArgument(
            Node() + " asked for validation rows, but the next rows fed are those of training epoch " +
            std::to_string(*next) + ": pass validation_data to cluster.train() on the driver, and read the "
            "validation rows after each training epoch");
      }
      return next;
    }
    EMBER_ASSIGN_OR_RAISE(bool more, ReadMessage());
    if (!more) return std::optional<uint32_t>();
  }
}

// Asking for more rows while a partition whose every row was handed out still
// lacks answers breaks "one result per row": fail that partition now (its
// feeding task would otherwise wait for answers that never come).
Status Consumer::Impl::CheckAnswered() {
  for (const auto& s : std::vector<std::shared_ptr<Session>>(open_sessions.begin(), open_sessions.end())) {
    if (s->ended() && s->handed == *s->rows && s->answered < s->handed) {
      const std::string msg = Node() + " answered " + std::to_string(s->answered) + " of the " +
                              std::to_string(*s->rows) + " rows of partition " + std::to_string(s->partition) +
                              " and asked for more rows: inference needs exactly one result per input row "
                              "(call batch_results for every batch)";
      EMBER_RETURN_NOT_OK(FailSession(s, msg));
      return Status::InvalidArgument(msg);
    }
  }
  return Status::OK();
}

Status Consumer::Impl::CheckPreviousAnswered(const Session* session) {
  for (const auto& older : open_sessions) {
    if (older.get() == session) return Status::OK();
    if (older->ended() && older->answered < older->handed) {
      const std::string msg = Node() + " answered " + std::to_string(older->answered) + " of the " +
                              std::to_string(*older->rows) + " rows of partition " + std::to_string(older->partition) +
                              " before taking rows of partition " + std::to_string(session->partition) +
                              ": inference needs exactly one result per input row (call batch_results for every "
                              "batch)";
      std::shared_ptr<Session> keep = older;
      EMBER_RETURN_NOT_OK(FailSession(keep, msg));
      return Status::InvalidArgument(msg);
    }
  }
  return Status::OK();
}

// Writes to the session's feeding task.  If that task is gone (it failed, or
// Spark killed it and will run the partition again), the answers have nowhere
// to go: they are dropped and the node carries on.
Status Consumer::Impl::Send(Session* session, FeedKind kind, std::span<const uint8_t> payload) {
  if (!session->result_ring) return Status::OK();
  Status st = session->result_ring->Write(static_cast<uint32_t>(kind), payload,
                                          Deadline::After(options.result_timeout));
  if (st.code() == StatusCode::kAborted) {
    session->result_ring->Close();
    session->result_ring.reset();
    return Status::OK();
  }
  if (!st.ok()) {
    return st.WithContext(Node() + ": answering partition " + std::to_string(session->partition));
  }
  return st;
}

Status Consumer::Impl::MaybeFinish(const std::shared_ptr<Session>& session) {
  if (!session->ended() || session->answered != *session->rows) return Status::OK();
  if (std::find(open_sessions.begin(), open_sessions.end(), session) == open_sessions.end()) return Status::OK();
  Status st = Send(session.get(), FeedKind::kEndResults, EncodeEndResults(*session->rows));
  CloseSession(session);
  return st;
}

Status Consumer::Impl::FailSession(const std::shared_ptr<Session>& session, const std::string& message) {
  Status st = Send(session.get(), FeedKind::kError, EncodeError(message));
  CloseSession(session);
  return st;
}

void Consumer::Impl::CloseSession(const std::shared_ptr<Session>& session) {
  if (session->result_ring) {
    session->result_ring->Close();
    session->result_ring.reset();
  }
  auto it = sessions.find({session->partition, session->epoch});
  if (it != sessions.end() && it->second == session) sessions.erase(it);
  open_sessions.erase(std::remove(open_sessions.begin(), open_sessions.end(), session), open_sessions.end());
}

// ---------------------------------------------------------------- Consumer
Consumer::Consumer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Consumer::~Consumer() { Close(); }

Result<std::unique_ptr<Consumer>> Consumer::Open(const std::string& ring_name, ConsumerOptions options) {
  auto impl = std::make_unique<Impl>();
  EMBER_ASSIGN_OR_RAISE(impl->ring, OpenFeedRing(ring_name));
  impl->options = std::move(options);
  return std::unique_ptr<Consumer>(new Consumer(std::move(impl)));
}

const ConsumerOptions& Consumer::options() const { return impl_->options; }
void Consumer::set_train_mode(bool train_mode) { impl_->options.train_mode = train_mode; }
void Consumer::set_read_timeout(Duration timeout) { impl_->options.read_timeout = timeout; }

Result<std::vector<RowRange>> Consumer::Next(int64_t max_rows, bool stop_at_partition) {
  if (max_rows <= 0) return Status::InvalidArgument("batch size must be positive, got " + std::to_string(max_rows));
  return impl_->Take(max_rows, stop_at_partition, std::nullopt);
}

Result<std::optional<uint32_t>> Consumer::BeginEpoch(EpochKind kind) {
  Impl& s = *impl_;
  EMBER_ASSIGN_OR_RAISE(std::optional<uint32_t> epoch, s.NextEpoch(kind));
  if (!epoch) return epoch;
  s.finished_epochs.insert(*epoch);  // from now on, whatever the consumer leaves of it is dropped
  s.current_epoch = epoch;
  s.epoch_taken = 0;
  s.MarkBegun(*epoch);
  return epoch;
}

Result<std::vector<RowRange>> Consumer::NextEpochBatch(int64_t batch_size, bool drop_remainder) {
  return NextEpochBatches(batch_size, 1, drop_remainder);
}

Result<std::vector<RowRange>> Consumer::NextEpochBatches(int64_t batch_size, int64_t max_batches,
                                                         bool drop_remainder) {
  Impl& s = *impl_;
  if (batch_size <= 0) return Status::InvalidArgument("batch_size must be positive, got " + std::to_string(batch_size));
  if (max_batches <= 0) {
    return Status::InvalidArgument("max_batches must be positive, got " + std::to_string(max_batches));
  }
  if (s.Terminated() || !s.current_epoch) return std::vector<RowRange>();
  const uint32_t epoch = *s.current_epoch;
  EpochBound& info = s.epochs[epoch];
  while (!info.complete() && info.usable() - s.epoch_taken < batch_size) {
    EMBER_ASSIGN_OR_RAISE(bool more, s.ReadMessage());
    if (!more) return std::vector<RowRange>();  // terminated, or the feed ended in the middle of the epoch
  }
  const int64_t left = info.usable() - s.epoch_taken;
  if (left < (drop_remainder ? batch_size : 1)) {
    s.current_epoch.reset();
    return std::vector<RowRange>();
  }
  // Whole batches (as many as are provably there, up to max_batches), else the last smaller one.
  const int64_t want = left >= batch_size ? std::min(left / batch_size, max_batches) * batch_size : left;
  EMBER_ASSIGN_OR_RAISE(std::vector<RowRange> out, s.Take(want, false, epoch));
  int64_t got = 0;
  for (const RowRange& r : out) got += r.rows;
  if (got < want) {
    if (s.Terminated()) return std::vector<RowRange>();
    return Status::Internal(s.Node() + ": epoch " + std::to_string(epoch) + " holds " + std::to_string(left) +
                            " unread rows by its markers but only " + std::to_string(got) +
                            " arrived (a feed protocol error; please report it)");
  }
  s.epoch_taken += got;
  return out;
}

Result<std::optional<RowRange>> Consumer::PeekRow() {
  Impl& s = *impl_;
  for (;;) {
    EMBER_ASSIGN_OR_RAISE(std::optional<uint32_t> epoch, s.NextEpoch(std::nullopt));
    if (!epoch) return std::optional<RowRange>();
    for (const Event& e : s.events) {
      if (e.is_rows && !s.Stale(e)) {
        RowRange r;
        r.owner = e.owner;
        r.message = e.message;
        r.ipc_offset = kBatchHeaderBytes;
        r.message_id = e.message_id;
        r.offset = e.offset;
        r.rows = 1;
        r.partition = e.session->partition;
        r.epoch = e.epoch;
        return std::optional<RowRange>(std::move(r));
      }
    }
    EMBER_ASSIGN_OR_RAISE(bool more, s.ReadMessage());
    if (!more) return std::optional<RowRange>();
  }
}

bool Consumer::ShouldStop() const {
  const Impl& s = *impl_;
  if (s.terminate_requested.load(std::memory_order_acquire)) return true;  // set before `terminated`
  if (!s.end_of_feed) return false;
  return std::none_of(s.events.begin(), s.events.end(), [&](const Event& e) { return e.is_rows && !s.Stale(e); });
}

Result<std::vector<int64_t>> Consumer::PlanResults(int64_t rows) {
  Impl& s = *impl_;
  if (rows < 0) return Status::InvalidArgument("negative result count " + std::to_string(rows));
  std::vector<int64_t> plan;
  int64_t left = rows;
  int64_t pending = 0;
  for (const auto& session : s.open_sessions) {
    const int64_t p = session->handed - session->answered;
    pending += p;
    if (p <= 0 || left == 0) continue;
    const int64_t k = std::min(left, p);
    plan.push_back(k);
    left -= k;
  }
  if (left > 0) {
    const std::string msg = s.Node() + " sent " + std::to_string(rows) + " results but only " +
                            std::to_string(pending) +
                            " input rows were awaiting an answer: inference needs exactly one result per input row";
    if (!s.open_sessions.empty()) {
      std::shared_ptr<Session> last = s.open_sessions.back();
      EMBER_RETURN_NOT_OK(s.FailSession(last, msg));
    }
    return Status::InvalidArgument(msg);
  }
  return plan;
}

Status Consumer::SendResults(std::span<const uint8_t> ipc, int64_t rows) {
  Impl& s = *impl_;
  if (rows <= 0) return rows == 0 ? Status::OK() : Status::InvalidArgument("negative result count");
  auto it = std::find_if(s.open_sessions.begin(), s.open_sessions.end(),
                         [](const auto& session) { return session->answered < session->handed; });
  if (it == s.open_sessions.end() || rows > (*it)->handed - (*it)->answered) {
    const int64_t awaits = it == s.open_sessions.end() ? 0 : (*it)->handed - (*it)->answered;
    return Status::InvalidArgument(s.Node() + ": " + std::to_string(rows) +
                                   " results for a partition awaiting " + std::to_string(awaits) +
                                   " (divide results with PlanResults first)");
  }
  std::shared_ptr<Session> session = *it;
  EMBER_RETURN_NOT_OK(s.Send(session.get(), FeedKind::kResults, EncodeResults(rows, ipc)));
  session->answered += rows;
  return s.MaybeFinish(session);
}

// Any thread, while another reads: touches only the flag and the ring (both
// thread-safe); the reading thread drops its own state (Impl::Terminated).
void Consumer::Terminate() {
  impl_->terminate_requested.store(true, std::memory_order_release);
  impl_->ring->Terminate();  // producers stop; a read blocked on the empty ring ends (Cancelled)
}

Status Consumer::PageLockRows(std::shared_ptr<device::Runtime> runtime) {
  if (!runtime) return Status::InvalidArgument(impl_->Node() + ": PageLockRows needs a device runtime");
  shm::Ring::ViewHooks hooks;
  hooks.on_map = [runtime](void* base, size_t bytes) { return runtime->RegisterHost(base, bytes); };
  hooks.on_unmap = [runtime, node = impl_->Node()](void* base) {
    // Copies from rows whose leases are still held may be in flight (a
    // revoke comes while the reader keeps rows): let them end first.
    Status st = runtime->SynchronizeDevice();
    if (st.ok()) st = runtime->UnregisterHost(base);
    if (!st.ok()) {
      EMBER_LOG(WARN) << node << ": giving back page-locked feed memory: " << st.ToString();
    }
  };
  EMBER_RETURN_NOT_OK(impl_->ring->SetViewHooks(std::move(hooks)).WithContext(impl_->Node()));
  impl_->page_locked = true;
  impl_->page_locked_revokes = 0;
  return Status::OK();
}

void Consumer::UnlockRows() {
  impl_->ring->ClearViewHooks();
  impl_->page_locked = false;
}

void Consumer::Close() {
  Impl& s = *impl_;
  for (auto& [key, session] : s.sessions) {
    if (session->result_ring) session->result_ring->Close();
  }
  s.sessions.clear();
  s.open_sessions.clear();
  if (s.ring) s.ring->Close();
}

}  // namespace ember::feed
