#include "ember/dataset.h"

#include <algorithm>
#include <cstring>
#include <deque>
#include <map>
#include <thread>
#include <utility>

#include "common/mutex.h"

namespace ember::record {

// Decoding runs on `decode_threads` workers, a group of batches at a time.
// A worker claims the next group's sequence number, gathers its records
// under gather_mu_ (files are read and framed, CRCs checked, in order, by
// one worker at a time): whole batches until about kGroupBytes of records,
// read in place from a mapped file or copied into the worker's arena.  It
// then decodes them with its own ExampleDecoder outside every lock while the
// next worker gathers.  Groups land in `done_` by sequence number and Next()
// hands their batches out in that order, so an error (a bad record, a
// missing file) surfaces after every batch before it.  Threads meet once
// per group, not per batch: each meeting can cost a context switch.  With
// prefetch 0 there are no threads: Next() gathers and decodes a group.
//
// Lock order: gather_mu_ before mu_.
namespace {
constexpr size_t kGroupBytes = 1 << 20;  // records gathered per group, about
constexpr size_t kGroupBatches = 64;     // batches per group, at most
constexpr size_t kAheadBytes = 4 << 20;  // of a mapped file, mapped ahead of the gathering
}  // namespace

class ExampleDataset::Impl {
 public:
  Impl(std::shared_ptr<fs::FileSystem> fs, std::vector<std::string> paths, DatasetOptions options,
       std::vector<example::ExampleDecoder> decoders)
      : fs_(std::move(fs)), paths_(std::move(paths)), options_(std::move(options)),
        capacity_(static_cast<int64_t>(std::max(options_.prefetch, 1)) + static_cast<int64_t>(decoders.size()) - 1) {
    workers_.reserve(decoders.size());
    for (auto& d : decoders) workers_.push_back(Worker{std::move(d), {}, {}, {}, {}, {}});
  }

  ~Impl() { Close(); }

  void Start() {
    if (options_.prefetch == 0) return;
    for (size_t w = 0; w < workers_.size(); ++w) threads_.emplace_back([this, w] { Work(w); });
  }

  Result<std::optional<std::vector<example::FeatureColumn>>> Next() {
    MutexLock lock(&mu_);
    while (current_.empty() && !closed_ && failure_.ok() && !ended_) {
      if (options_.prefetch == 0) {
        ++claimed_;
        lock.Unlock();
        Group g = Produce(0);
        lock.Lock();
        done_.emplace(g.seq, std::move(g));
      }
      while (!closed_ && !done_.contains(next_out_)) ready_.Wait(&mu_);
      if (closed_) break;
      current_ = std::move(done_.extract(next_out_++).mapped().batches);
      room_.Signal();  // for one more group
    }
    if (closed_) return Status::Cancelled("dataset closed");
    if (!failure_.ok()) return failure_;
    if (ended_) return std::optional<std::vector<example::FeatureColumn>>();
    Batch b = std::move(current_.front());
    current_.pop_front();
    if (!b.status.ok()) {
      failure_ = b.status;
      return failure_;
    }
    if (b.columns.empty()) {
      ended_ = true;
      return std::optional<std::vector<example::FeatureColumn>>();
    }
    stats_.rows += b.columns[0].num_rows();
    return std::optional<std::vector<example::FeatureColumn>>(std::move(b.columns));
  }

  void Close() {
    {
      MutexLock lock(&mu_);
      closed_ = true;
      room_.SignalAll();
      ready_.SignalAll();
    }
    for (auto& t : threads_) {
      if (t.joinable()) t.join();
    }
  }

  DatasetStats stats() const {
    MutexLock lock(&mu_);
    return stats_;
  }

 private:
  // A batch in sequence: its columns, or the error at that point of the
  // files, or neither (the end).
  struct Batch {
    Status status;
    std::vector<example::FeatureColumn> columns;
  };
  // The batches one worker made of one gathering, in order; the last may
  // be an error or the end.
  struct Group {
    int64_t seq = 0;
    std::deque<Batch> batches;
  };

  // What one worker owns: the records it gathered, where each came from,
  // its decoder.  A record of a mapped file is read in place (the group
  // keeps the mapping alive); one of a streamed file is copied into `arena`,
  // since the reader's buffer moves on.
  struct Piece {
    const uint8_t* mapped;  // the record in a mapped file, or nullptr: in arena
    size_t offset, size;     // in arena
  };
  struct Worker {
    example::ExampleDecoder decoder;
    std::vector<uint8_t> arena;
    std::vector<Piece> pieces;
    std::vector<std::pair<size_t, uint64_t>> origins;  // (index in uris, byte offset) per record
    std::vector<std::string> uris;  // the files this group's records came from
    uint64_t file = 0;              // the last one's number (files_ when it was opened)
    std::vector<std::shared_ptr<const fs::ReadOnlyMemoryRegion>> regions;  // mapped files they lie in
  };

  void Work(size_t w) {
    for (;;) {
      {
        MutexLock lock(&mu_);
        while (!closed_ && !gather_done_ && claimed_ - next_out_ >= capacity_) room_.Wait(&mu_);
        if (closed_ || gather_done_) return;
        ++claimed_;
      }
      Group g = Produce(w);
      MutexLock lock(&mu_);
      const bool awaited = g.seq == next_out_;  // Next() waits for no other
      done_.emplace(g.seq, std::move(g));
      if (awaited) ready_.Signal();
    }
  }

  // Gathers the next group's records (in sequence, under gather_mu_), then
  // decodes them on this thread.
  Group Produce(size_t w) {
    Worker& worker = workers_[w];
    Group g;
    size_t first_row = 0;
    Status gathered;
    bool stopped = false;  // this group ends the sequence (an error or the end)
    Ahead ahead;           // pages this worker maps for the gatherings to come
    {
      MutexLock gather(&gather_mu_);
      g.seq = next_seq_++;
      if (gather_stopped_) {
        stopped = true;
        // Nothing gathered: Decode must not see this worker's last group again
        // (its records may lie in a mapping released since).
        worker.pieces.clear();
      } else {
        first_row = rows_gathered_;
        gathered = Gather(&worker);
        const size_t batch = static_cast<size_t>(options_.batch_size);
        stopped = !gathered.ok() || worker.pieces.size() % batch != 0 || worker.pieces.empty();
        gather_stopped_ = stopped;
        rows_gathered_ += worker.pieces.size();
        ahead = NextAhead();
        MutexLock lock(&mu_);
        stats_.records = static_cast<uint64_t>(records_);
        stats_.files = files_;
        stats_.skipped_records = skipped_;
        if (stopped) {
          gather_done_ = true;
          room_.SignalAll();  // idle workers leave
        }
      }
    }
    if (ahead.region != nullptr) ahead.region->WillRead(ahead.offset, ahead.bytes);
    // A failed gathering keeps its whole batches: the error takes the place
    // of the batch it interrupted, as it would have without groups.
    Decode(&worker, first_row, options_.drop_remainder || !gathered.ok(), &g.batches);
    if (stopped) g.batches.push_back(Batch{gathered, {}});  // the error, or the end
    return g;
  }

  // Pages of the mapped file ahead of the gathering: mapped by a worker
  // outside every lock (FileSystem's WillRead), so the gathering, which is
  // serial, takes no page faults.
  struct Ahead {
    std::shared_ptr<const fs::ReadOnlyMemoryRegion> region;
    size_t offset = 0, bytes = 0;
  };
  Ahead NextAhead() EXCLUSIVE_LOCKS_REQUIRED(gather_mu_) {
    if (region_ == nullptr || reader_ == nullptr) return {};
    const size_t at = static_cast<size_t>(reader_->last_offset());
    if (mapped_ahead_to_ >= at + kAheadBytes) return {};
    const size_t from = std::max(mapped_ahead_to_, at + kGroupBytes);
    mapped_ahead_to_ = at + 2 * kAheadBytes;
    return Ahead{region_, from, mapped_ahead_to_ - from};
  }

  // Whole batches of this shard's records, in place or into the arena,
  // until about kGroupBytes; fewer than a batch's rows only at the end.
  Status Gather(Worker* worker) EXCLUSIVE_LOCKS_REQUIRED(gather_mu_) {
    worker->arena.clear();
    worker->pieces.clear();
    worker->origins.clear();
    worker->uris.clear();
    worker->regions.clear();
    const size_t batch = static_cast<size_t>(options_.batch_size);
    size_t bytes = 0;
    std::string_view record;
    for (;;) {
      if (worker->pieces.size() % batch == 0 && !worker->pieces.empty() &&
          (bytes >= kGroupBytes || worker->pieces.size() >= kGroupBatches * batch)) {
        return Status::OK();
      }
      EMBER_ASSIGN_OR_RAISE(bool more, NextRecord(&record));
      if (!more) return Status::OK();
      bytes += record.size();
      if (worker->uris.empty() || worker->file != files_) {  // files_ numbers the open file
        worker->file = files_;
        worker->uris.push_back(reader_->uri());
        if (region_ != nullptr) worker->regions.push_back(region_);
      }
      worker->origins.emplace_back(worker->uris.size() - 1, reader_->last_offset());
      if (region_ != nullptr) {
        worker->pieces.push_back({reinterpret_cast<const uint8_t*>(record.data()), 0, record.size()});
        continue;
      }
      const size_t at = worker->arena.size();
      if (at + record.size() > worker->arena.capacity()) {
        worker->arena.reserve(std::max(at + record.size(), 2 * worker->arena.capacity()));
      }
      worker->arena.resize(at + record.size());
      if (!record.empty()) std::memcpy(worker->arena.data() + at, record.data(), record.size());
      worker->pieces.push_back({nullptr, at, record.size()});
    }
  }

  // The gathered records as batches; a record that does not decode ends
  // the group with its error (naming file and offset), after the batches
  // before its own.  A last short batch is kept unless `whole_only`.
  void Decode(Worker* worker, size_t first_row, bool whole_only, std::deque<Batch>* out) {
    const size_t batch = static_cast<size_t>(options_.batch_size);
    size_t end = worker->pieces.size();
    if (whole_only) end -= end % batch;
    worker->decoder.set_first_row(first_row);
    for (size_t i = 0; i < end; ++i) {
      const Piece& p = worker->pieces[i];
      const uint8_t* bytes = p.mapped != nullptr ? p.mapped : worker->arena.data() + p.offset;
      const std::string_view record(reinterpret_cast<const char*>(bytes), p.size);
      if (p.mapped != nullptr && !options_.reader.skip_corrupt) {  // the reader left its data CRC to us
        const auto& [uri, offset] = worker->origins[i];
        if (Status crc = CheckDataCrc(record, worker->uris[uri], offset); !crc.ok()) {
          worker->decoder.Finish();  // drops the rows of this batch
          out->push_back(Batch{std::move(crc), {}});
          break;
        }
      }
      Status st = worker->decoder.Add(record);
      if (!st.ok()) {
        worker->decoder.Finish();  // drops the rows of this batch
        const auto& [uri, offset] = worker->origins[i];
        out->push_back(Batch{Status(st.code(), worker->uris[uri] + ": the record at byte " + std::to_string(offset) +
                                                   ": " + st.message()),
                             {}});
        break;
      }
      if (worker->decoder.num_rows() == batch || i + 1 == end) out->push_back(Batch{Status::OK(), worker->decoder.Finish()});
    }
    worker->regions.clear();  // a mapping goes once no group reads it
  }

  // The next record of this shard, or false at the end of the last file.
  // The view is valid until the next call, or while region_ lives.
  Result<bool> NextRecord(std::string_view* record) EXCLUSIVE_LOCKS_REQUIRED(gather_mu_) {
    for (;;) {
      if (reader_ == nullptr) {
        if (next_path_ == paths_.size()) return false;
        const std::string& path = paths_[next_path_++];
        const Compression c = options_.reader.compression == Compression::kAuto ? CompressionFromPath(path)
                                                                                : options_.reader.compression;
        region_.reset();
        mapped_ahead_to_ = 0;
        if (c == Compression::kNone && options_.map_files) {
          if (options_.mapping_cache != nullptr) {
            EMBER_ASSIGN_OR_RAISE(region_, options_.mapping_cache->Map(*fs_, path));
          } else {
            EMBER_ASSIGN_OR_RAISE(region_, fs_->MapReadOnly(path));
          }
        }
        if (region_ != nullptr) {
          // Data CRCs are checked by the decoding worker, record by record
          // next to its decode (the bytes are then in that core's cache once);
          // the gathering, which is serial, checks headers only.
          ReaderOptions reader = options_.reader;
          reader.check_data_crc = reader.skip_corrupt;
          EMBER_ASSIGN_OR_RAISE(reader_, RecordReader::Open(region_, reader));
        } else {
          EMBER_ASSIGN_OR_RAISE(auto file, fs_->NewSequentialFile(path));
          EMBER_ASSIGN_OR_RAISE(reader_, RecordReader::Open(std::move(file), options_.reader));
        }
        ++files_;
      }
      EMBER_ASSIGN_OR_RAISE(bool more, reader_->Next(record));
      if (!more) {
        skipped_ += reader_->stats().skipped_records;
        reader_.reset();
        region_.reset();
        continue;
      }
      const int64_t index = records_++;
      if (options_.num_shards > 1 && index % options_.num_shards != options_.shard_index) continue;
      return true;
    }
  }

  const std::shared_ptr<fs::FileSystem> fs_;
  const std::vector<std::string> paths_;
  const DatasetOptions options_;
  const int64_t capacity_;  // groups claimed but not yet taken by Next(), at most

  // Worker w's state, touched only by its thread (or by Next() without threads).
  std::vector<Worker> workers_;

  // The files, in order: read by one gathering worker at a time.
  Mutex gather_mu_;
  std::unique_ptr<RecordReader> reader_ GUARDED_BY(gather_mu_);
  std::shared_ptr<const fs::ReadOnlyMemoryRegion> region_ GUARDED_BY(gather_mu_);  // reader_'s, if mapped
  size_t mapped_ahead_to_ GUARDED_BY(gather_mu_) = 0;  // region_'s offset a worker mapped up to
  size_t next_path_ GUARDED_BY(gather_mu_) = 0;
  int64_t records_ GUARDED_BY(gather_mu_) = 0;
  uint64_t files_ GUARDED_BY(gather_mu_) = 0;
  uint64_t skipped_ GUARDED_BY(gather_mu_) = 0;
  size_t rows_gathered_ GUARDED_BY(gather_mu_) = 0;
  int64_t next_seq_ GUARDED_BY(gather_mu_) = 0;
  bool gather_stopped_ GUARDED_BY(gather_mu_) = false;

  // Each wake-up costs a context switch (~5 us, thousands of batches a
  // second): waiters are woken only for what they wait for.
  mutable Mutex mu_;
  CondVar room_;   // workers: a group was taken (or the end, or Close)
  CondVar ready_;  // Next(): the group it waits for is done (or Close)
  std::map<int64_t, Group> done_ GUARDED_BY(mu_);  // by sequence number
  std::deque<Batch> current_ GUARDED_BY(mu_);      // what Next() hands out first
  int64_t claimed_ GUARDED_BY(mu_) = 0;   // groups a worker has started
  int64_t next_out_ GUARDED_BY(mu_) = 0;  // the group Next() takes next
  bool gather_done_ GUARDED_BY(mu_) = false;  // no batch after those claimed
  Status failure_ GUARDED_BY(mu_);
  bool ended_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  DatasetStats stats_ GUARDED_BY(mu_);
  std::vector<std::thread> threads_;
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
  if (options.decode_threads < 1) return Status::InvalidArgument("ExampleDataset: decode_threads must be >= 1");
  std::vector<example::ExampleDecoder> decoders;
  const int workers = options.prefetch == 0 ? 1 : options.decode_threads;
  for (int i = 0; i < workers; ++i) {
    EMBER_ASSIGN_OR_RAISE(example::ExampleDecoder decoder, example::ExampleDecoder::Make(options.schema));
    decoders.push_back(std::move(decoder));
  }
  auto impl = std::make_unique<Impl>(std::move(fs), std::move(paths), std::move(options), std::move(decoders));
  impl->Start();
  return std::unique_ptr<ExampleDataset>(new ExampleDataset(std::move(impl)));
}

ExampleDataset::ExampleDataset(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ExampleDataset::~ExampleDataset() = default;

Result<std::optional<std::vector<example::FeatureColumn>>> ExampleDataset::Next() { return impl_->Next(); }
void ExampleDataset::Close() { impl_->Close(); }
DatasetStats ExampleDataset::stats() const { return impl_->stats(); }

}  // namespace ember::record
