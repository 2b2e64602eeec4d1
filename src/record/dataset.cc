#include "ember/dataset.h"

#include <deque>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace ember::record {

// One reading thread fills `ready_` (at most max(prefetch, 1) batches);
// Next() takes from it.  With prefetch 0 there is no thread: Next() reads.
class ExampleDataset::Impl {
 public:
  Impl(std::shared_ptr<fs::FileSystem> fs, std::vector<std::string> paths, DatasetOptions options,
       example::ExampleDecoder decoder)
      : fs_(std::move(fs)), paths_(std::move(paths)), options_(std::move(options)), decoder_(std::move(decoder)) {}

  ~Impl() { Close(); }

  void Start() {
    if (options_.prefetch > 0) thread_ = std::thread([this] { Run(); });
  }

  Result<std::optional<std::vector<example::FeatureColumn>>> Next() {
    if (options_.prefetch == 0) {
      MutexLock lock(&mu_);
      if (closed_) return Status::Cancelled("dataset closed");
      if (!failure_.ok()) return failure_;
      if (ended_) return std::optional<std::vector<example::FeatureColumn>>();
      lock.Unlock();
      auto batch = ReadBatch();
      lock.Lock();
      if (!batch.ok()) failure_ = batch.status();
      else if (!batch->has_value()) ended_ = true;
      else stats_.rows += (**batch)[0].num_rows();
      return batch;
    }
    MutexLock lock(&mu_);
    while (ready_.empty() && failure_.ok() && !ended_ && !closed_) changed_.Wait(&mu_);
    if (closed_) return Status::Cancelled("dataset closed");
    if (!ready_.empty()) {
      std::vector<example::FeatureColumn> batch = std::move(ready_.front());
      ready_.pop_front();
      stats_.rows += batch[0].num_rows();
      changed_.SignalAll();
      return std::optional<std::vector<example::FeatureColumn>>(std::move(batch));
    }
    if (!failure_.ok()) return failure_;
    return std::optional<std::vector<example::FeatureColumn>>();
  }

  void Close() {
    {
      MutexLock lock(&mu_);
      closed_ = true;
      changed_.SignalAll();
    }
    if (thread_.joinable()) thread_.join();
  }

  DatasetStats stats() const {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // The reading thread: batches into ready_ until the end, an error or Close.
  void Run() {
    for (;;) {
      {
        MutexLock lock(&mu_);
        while (!closed_ && ready_.size() >= static_cast<size_t>(options_.prefetch)) changed_.Wait(&mu_);
        if (closed_) return;
      }
      auto batch = ReadBatch();  // file I/O and decoding outside the lock
      MutexLock lock(&mu_);
      if (!batch.ok()) {
        failure_ = batch.status();
      } else if (!batch->has_value()) {
        ended_ = true;
      } else {
        ready_.push_back(std::move(**batch));
      }
      changed_.SignalAll();
      if (!failure_.ok() || ended_) return;
    }
  }

  // The next record of this shard, or false at the end of the last file.
  // Only the reading thread (or Next() without one) calls it.
  Result<bool> NextRecord(std::string_view* record) {
    for (;;) {
      if (reader_ == nullptr) {
        if (next_path_ == paths_.size()) return false;
        const std::string& path = paths_[next_path_++];
        EMBER_ASSIGN_OR_RAISE(auto file, fs_->NewSequentialFile(path));
        EMBER_ASSIGN_OR_RAISE(reader_, RecordReader::Open(std::move(file), options_.reader));
        MutexLock lock(&mu_);
        ++stats_.files;
      }
      EMBER_ASSIGN_OR_RAISE(bool more, reader_->Next(record));
      if (!more) {
        MutexLock lock(&mu_);
        stats_.skipped_records += reader_->stats().skipped_records;
        reader_.reset();
        continue;
      }
      const int64_t index = records_++;
      if (options_.num_shards > 1 && index % options_.num_shards != options_.shard_index) continue;
      return true;
    }
  }

  Result<std::optional<std::vector<example::FeatureColumn>>> ReadBatch() {
    std::string_view record;
    while (decoder_.num_rows() < static_cast<size_t>(options_.batch_size)) {
      EMBER_ASSIGN_OR_RAISE(bool more, NextRecord(&record));
      if (!more) break;
      Status st = decoder_.Add(record);
      if (!st.ok()) {
        return Status(st.code(), reader_->uri() + ": the record at byte " + std::to_string(reader_->last_offset()) +
                                     ": " + st.message());
      }
    }
    {
      MutexLock lock(&mu_);
      stats_.records = static_cast<uint64_t>(records_);
    }
    const size_t rows = decoder_.num_rows();
    if (rows == 0 || (options_.drop_remainder && rows < static_cast<size_t>(options_.batch_size))) {
      decoder_.Finish();  // drops a short remainder
      return std::optional<std::vector<example::FeatureColumn>>();
    }
    return std::optional<std::vector<example::FeatureColumn>>(decoder_.Finish());
  }

  const std::shared_ptr<fs::FileSystem> fs_;
  const std::vector<std::string> paths_;
  const DatasetOptions options_;

  // Owned by the reading thread (or by Next() when prefetch is 0).
  example::ExampleDecoder decoder_;
  std::unique_ptr<RecordReader> reader_;
  size_t next_path_ = 0;
  int64_t records_ = 0;

  mutable Mutex mu_;
  CondVar changed_;
  std::deque<std::vector<example::FeatureColumn>> ready_ GUARDED_BY(mu_);
  Status failure_ GUARDED_BY(mu_);
  bool ended_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  DatasetStats stats_ GUARDED_BY(mu_);
  std::thread thread_;
};

Result<std::unique_ptr<ExampleDataset>> ExampleDataset::Open(std::shared_ptr<fs::FileSystem> fs,
                                                             std::vector<std::string> paths,
                                                             DatasetOptions options) {
  if (fs == nullptr) return Status::InvalidArgument("ExampleDataset: no file system");
  if (options.schema.empty()) return Status::InvalidArgument("ExampleDataset: the schema names no feature");
  if (options.batch_size < 1) {
    return Status::InvalidArgument("ExampleDataset: batch_size " + std::to_string(options.batch_size) +
                                   " is not positive");
  }
  if (options.num_shards < 1 || options.shard_index < 0 || options.shard_index >= options.num_shards) {
    return Status::InvalidArgument("ExampleDataset: shard " + std::to_string(options.shard_index) + " of " +
                                   std::to_string(options.num_shards) + " does not exist");
  }
  if (options.prefetch < 0) return Status::InvalidArgument("ExampleDataset: prefetch is negative");
  EMBER_ASSIGN_OR_RAISE(example::ExampleDecoder decoder, example::ExampleDecoder::Make(options.schema));
  auto impl = std::make_unique<Impl>(std::move(fs), std::move(paths), std::move(options), std::move(decoder));
  impl->Start();
  return std::unique_ptr<ExampleDataset>(new ExampleDataset(std::move(impl)));
}

ExampleDataset::ExampleDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExampleDataset::~ExampleDataset() = default;

Result<std::optional<std::vector<example::FeatureColumn>>> ExampleDataset::Next() { return impl_->Next(); }
void ExampleDataset::Close() { impl_->Close(); }
DatasetStats ExampleDataset::stats() const { return impl_->stats(); }

}  // namespace ember::record
