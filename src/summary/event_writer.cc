// EventWriter (include/ember/summary.h): events encoded by event_encode.cc,
// framed by record::RecordWriter, flushed by a background thread.
//
// One mutex guards the record writer and the writer's state.  Add* encodes
// outside it (the costly part) and takes it only to hand the bytes to the
// file object, so concurrent callers and the flush thread serialize on the
// file alone.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <utility>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "ember/record.h"
#include "ember/summary.h"
#include "summary/event_encode.h"
#include "summary/histogram.h"

namespace ember::summary {
namespace {

double WallTime() {
  using namespace std::chrono;
  return duration<double>(system_clock::now().time_since_epoch()).count();
}

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

// TF2's file name: events.out.tfevents.<secs>.<host>.<pid>.<n><suffix>.
std::string EventFileName(const std::string& suffix) {
  static std::atomic<uint64_t> counter{0};
  const auto secs = static_cast<long long>(WallTime());
  return "events.out.tfevents." + std::to_string(secs) + "." + HostName() + "." +
         std::to_string(getpid()) + "." + std::to_string(counter.fetch_add(1)) + suffix;
}

}  // namespace

class EventWriter::Impl {
 public:
  Impl(std::string path, std::string uri, std::unique_ptr<record::RecordWriter> writer)
      : path_(std::move(path)), uri_(std::move(uri)), writer_(std::move(writer)) {}

  ~Impl() { (void)Close(); }

  void StartFlushThread(Duration period) {
    MutexLock closing(&close_mu_);
    if (period.count() > 0) flusher_ = std::thread([this, period] { FlushLoop(period); });
  }

  // Hands one encoded event to the file.
  Status Write(std::string_view event) {
    MutexLock lock(&mu_);
    EMBER_RETURN_NOT_OK(CheckOpen());
    Status st = writer_->Write(event);
    if (!st.ok()) return Fail(st);
    dirty_ = true;
    return Status::OK();
  }

  Status Flush() {
    MutexLock lock(&mu_);
    EMBER_RETURN_NOT_OK(CheckOpen());
    return FlushLocked();
  }

  Status Close() {
    MutexLock closing(&close_mu_);  // a second Close waits for the first's result
    {
      MutexLock lock(&mu_);
      if (closed_) return close_status_;
      closed_ = true;  // Add* and Flush fail from here on; the thread stops
      cv_.SignalAll();
    }
    if (flusher_.joinable()) flusher_.join();
    MutexLock lock(&mu_);
    Status st = error_;
    Status closed = writer_->Close();  // flushes
    if (st.ok() && !closed.ok()) st = Named(closed);
    close_status_ = st;
    return st;
  }

  const std::string& path() const { return path_; }
  const std::string& uri() const { return uri_; }
  uint64_t events() const {
    MutexLock lock(&mu_);
    return writer_->records_written();
  }

 private:
  Status CheckOpen() EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (closed_) return Status::InvalidArgument("event file " + uri_ + " is closed");
    return error_;
  }

  // `st`, its message naming the file if it does not yet.
  Status Named(const Status& st) const {
    return st.message().find(uri_) == std::string::npos ? st.WithContext("event file " + uri_) : st;
  }

  // Keeps the first write error: every later call returns it.
  Status Fail(const Status& st) EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok()) error_ = Named(st);
    return error_;
  }

  // Flushes only when events arrived since the last flush: on HDFS every
  // flush is a request to the NameNode and a DataNode, even an empty one.
  Status FlushLocked() EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    EMBER_RETURN_NOT_OK(error_);
    if (!dirty_) return Status::OK();
    Status st = writer_->Flush();
    if (!st.ok()) return Fail(st);
    dirty_ = false;
    return st;
  }

  // Flushes every `period` until Close; waits on cv_ with a deadline, so
  // Close wakes it at once.  A flush error is kept for the next call.
  void FlushLoop(Duration period) {
    MutexLock lock(&mu_);
    auto next = std::chrono::steady_clock::now() + period;
    while (!closed_) {
      if (cv_.WaitUntil(&mu_, next)) continue;  // woken (Close, or spuriously)
      if (closed_) break;
      if (error_.ok()) (void)FlushLocked();
      next = std::chrono::steady_clock::now() + period;
    }
  }

  const std::string path_;
  const std::string uri_;
  mutable Mutex mu_;
  CondVar cv_;
  std::unique_ptr<record::RecordWriter> writer_ GUARDED_BY(mu_);
  bool closed_ GUARDED_BY(mu_) = false;
  bool dirty_ GUARDED_BY(mu_) = false;   // events written since the last flush
  Status error_ GUARDED_BY(mu_);         // the first write error
  Status close_status_ GUARDED_BY(mu_);  // what Close returned
  Mutex close_mu_;  // held through Close; taken before mu_
  std::thread flusher_ GUARDED_BY(close_mu_);  // joined by Close
};

Result<std::unique_ptr<EventWriter>> EventWriter::Open(std::shared_ptr<fs::FileSystem> fs,
                                                       const std::string& log_dir,
                                                       EventWriterOptions options) {
  if (fs == nullptr) return Status::InvalidArgument("EventWriter::Open: no file system");
  if (log_dir.empty()) return Status::InvalidArgument("EventWriter::Open: empty log dir");
  EMBER_RETURN_NOT_OK(fs->CreateDir(log_dir));
  std::string dir = log_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  std::string path = (dir == "/" ? "" : dir) + "/" + EventFileName(options.file_suffix);
  std::string uri = fs->Uri(path);
  EMBER_ASSIGN_OR_RAISE(auto file, fs->NewWritableFile(path));
  record::WriterOptions record_options;
  record_options.compression = record::Compression::kNone;  // TensorBoard reads plain records
  EMBER_ASSIGN_OR_RAISE(auto records, record::RecordWriter::Open(std::move(file), record_options));
  std::string first;
  EncodeFileVersionEvent(WallTime(), &first);
  Status st = records->Write(first);
  if (st.ok()) st = records->Flush();
  if (!st.ok()) {
    (void)records->Close();
    return st.message().find(uri) == std::string::npos ? st.WithContext("event file " + uri) : st;
  }
  auto impl = std::make_unique<Impl>(std::move(path), std::move(uri), std::move(records));
  impl->StartFlushThread(options.flush_period);
  return std::unique_ptr<EventWriter>(new EventWriter(std::move(impl)));
}

EventWriter::EventWriter(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
EventWriter::~EventWriter() = default;

namespace {
Status CheckTag(std::string_view tag) {
  if (tag.empty()) return Status::InvalidArgument("summary tag is empty");
  return Status::OK();
}
}  // namespace

Status EventWriter::AddScalar(std::string_view tag, double value, int64_t step) {
  EMBER_RETURN_NOT_OK(CheckTag(tag));
  std::string event;
  EncodeScalarEvent(WallTime(), step, tag, static_cast<float>(value), &event);
  return impl_->Write(event);
}

Status EventWriter::AddHistogram(std::string_view tag, std::span<const double> values, int64_t step) {
  EMBER_RETURN_NOT_OK(CheckTag(tag));
  Histogram h;
  if (!BuildHistogram(values, &h)) {
    return Status::InvalidArgument("histogram " + std::string(tag) + ": NaN or infinite value");
  }
  std::string event;
  EncodeHistogramEvent(WallTime(), step, tag, h, &event);
  return impl_->Write(event);
}

Status EventWriter::AddText(std::string_view tag, std::string_view text, int64_t step) {
  EMBER_RETURN_NOT_OK(CheckTag(tag));
  std::string event;
  EncodeTextEvent(WallTime(), step, tag, text, &event);
  return impl_->Write(event);
}

Status EventWriter::AddImage(std::string_view tag, std::string_view encoded, int height, int width,
                             int channels, int64_t step) {
  EMBER_RETURN_NOT_OK(CheckTag(tag));
  if (height <= 0 || width <= 0 || (channels != 1 && channels != 3 && channels != 4)) {
    return Status::InvalidArgument("image " + std::string(tag) + ": bad size or channels");
  }
  std::string event;
  EncodeImageEvent(WallTime(), step, tag, encoded, height, width, channels, &event);
  return impl_->Write(event);
}

std::string NodeLogDir(const std::string& log_dir, const std::string& job_name, int task_index) {
  std::string dir = log_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (dir != "/" && !dir.empty()) dir += '/';
  return dir + job_name + "_" + std::to_string(task_index);
}

Status EventWriter::Flush() { return impl_->Flush(); }
Status EventWriter::Close() { return impl_->Close(); }
const std::string& EventWriter::uri() const { return impl_->uri(); }
const std::string& EventWriter::path() const { return impl_->path(); }
uint64_t EventWriter::events_written() const { return impl_->events(); }

}  // namespace ember::summary
