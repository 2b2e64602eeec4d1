// CheckpointManager (include/ember/checkpoint.h): Save through a temporary
// directory and one Rename; List/Restore trust only complete checkpoints.
#include "ember/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <random>
#include <set>
#include <utility>

#include "checkpoint/manifest.h"
#include "common/crc32c.h"
#include "common/logging.h"
#include "common/mutex.h"

namespace ember::checkpoint {
namespace {

// How often Restore starts over when the checkpoint it was reading is deleted
// under it.  Each start-over means a newer checkpoint was committed, so this
// bounds work, not time; a saver that keeps 1 and saves faster than a whole
// checkpoint can be read would exhaust it.
constexpr int kMaxRestoreAttempts = 16;

std::span<const uint8_t> Bytes(std::string_view s) {
  return {reinterpret_cast<const uint8_t*>(s.data()), s.size()};
}

}  // namespace

class CheckpointManager::Impl {
 public:
  Impl(std::shared_ptr<fs::FileSystem> fs, std::string dir, CheckpointOptions options)
      : fs_(std::move(fs)),
        dir_(std::move(dir)),
        uri_(fs_->Uri(dir_)),
        options_(options),
        salt_(std::random_device{}()) {}

  const std::string& uri() const { return uri_; }

  Status Save(int64_t step, std::span<const BlobRef> blobs) {
    if (step < 0) return Status::InvalidArgument("checkpoint " + uri_ + ": negative step " + std::to_string(step));
    std::vector<const BlobRef*> sorted;
    for (const auto& b : blobs) {
      if (!ValidBlobName(b.name)) {
        return Status::InvalidArgument("checkpoint " + uri_ + ": invalid blob name \"" + b.name +
                                       "\" (1-128 of [A-Za-z0-9._-], not starting with '.', not MANIFEST)");
      }
      sorted.push_back(&b);
    }
    std::sort(sorted.begin(), sorted.end(), [](auto* a, auto* b) { return a->name < b->name; });
    for (size_t i = 1; i < sorted.size(); ++i) {
      if (sorted[i]->name == sorted[i - 1]->name) {
        return Status::InvalidArgument("checkpoint " + uri_ + ": blob \"" + sorted[i]->name + "\" given twice");
      }
    }

    MutexLock lock(&save_mu_);
    const std::string tmp = TempPath(std::to_string(step));
    Status st = WriteAndCommit(step, sorted, tmp);
    if (!st.ok()) {
      (void)fs_->DeleteRecursively(tmp);  // best effort; the next Save retries
      return st.WithContext("saving checkpoint step " + std::to_string(step) + " in " + uri_);
    }
    Prune();
    return Status::OK();
  }

  // Lists again while a checkpoint listed by name is gone by the time its
  // MANIFEST is read (the saver moved it away), so a List racing a Save
  // never misses both the old and the new checkpoint.
  Result<std::vector<CheckpointInfo>> List() const {
    for (int attempt = 1;; ++attempt) {
      auto entries = fs_->List(dir_);
      if (!entries.ok()) {
        if (entries.status().code() == StatusCode::kNotFound) return std::vector<CheckpointInfo>{};
        return entries.status().WithContext("listing checkpoints in " + uri_);
      }
      std::vector<CheckpointInfo> out;
      bool gone = false;
      for (const auto& e : *entries) {
        if (!e.is_dir) continue;
        EMBER_ASSIGN_OR_RAISE(std::optional<CheckpointInfo> info, ReadInfo(e.name, &gone));
        if (info) out.push_back(std::move(*info));
      }
      if (gone && attempt < kMaxRestoreAttempts) continue;
      std::sort(out.begin(), out.end(), [](const auto& a, const auto& b) { return a.step < b.step; });
      return out;
    }
  }

  Result<Checkpoint> Restore(const RestoreOptions& options) const {
    const std::string which =
        options.step ? "checkpoint of step " + std::to_string(*options.step) : "complete checkpoint";
    for (int attempt = 0; attempt < kMaxRestoreAttempts; ++attempt) {
      EMBER_ASSIGN_OR_RAISE(std::vector<CheckpointInfo> all, List());
      std::vector<const CheckpointInfo*> candidates;  // newest first
      for (auto it = all.rbegin(); it != all.rend(); ++it) {
        const bool wanted = !options.step || it->step == *options.step ||
                            (options.fall_back_to_older && it->step < *options.step);
        if (wanted) candidates.push_back(&*it);
      }
      if (candidates.empty() || (options.step && candidates[0]->step != *options.step)) {
        return Status::NotFound("no " + which + " in " + uri_);
      }
      Status first_error;
      bool vanished = false;
      for (const CheckpointInfo* c : candidates) {
        auto r = ReadVerified(*c);
        if (r.ok()) return r;
        if (Vanished(*c)) {
          vanished = true;  // deleted by the saver: list again
          break;
        }
        if (r.status().code() != StatusCode::kCorruption || !options.fall_back_to_older) return r.status();
        EMBER_LOG(WARN) << "skipping checkpoint " << c->uri << ": " << r.status().ToString();
        if (first_error.ok()) first_error = r.status();
      }
      if (!vanished) return first_error;
    }
    return Status::Unavailable("restoring from " + uri_ + ": checkpoints were deleted faster than one could be read (" +
                               std::to_string(kMaxRestoreAttempts) + " tries); is the saver's keep too small?");
  }

 private:
  std::string Join(const std::string& name) const { return dir_ == "/" ? "/" + name : dir_ + "/" + name; }

  // A fresh temporary directory name, unique across processes and Saves.
  std::string TempPath(const std::string& tag) EXCLUSIVE_LOCKS_REQUIRED(save_mu_) {
    return Join(std::string(kTempPrefix) + tag + "-" + std::to_string(::getpid()) + "-" +
                std::to_string(salt_ % 1000000) + "-" + std::to_string(temps_++));
  }

  Status WriteAndCommit(int64_t step, const std::vector<const BlobRef*>& sorted, const std::string& tmp)
      EXCLUSIVE_LOCKS_REQUIRED(save_mu_) {
    EMBER_RETURN_NOT_OK(fs_->CreateDir(tmp));
    Manifest m;
    m.step = step;
    for (const BlobRef* b : sorted) {
      EMBER_RETURN_NOT_OK(WriteWhole(tmp + "/" + b->name, b->data));
      m.blobs.push_back(BlobInfo{b->name, b->data.size(), crc32c::Value(b->data)});
    }
    // Last: a temporary directory with a MANIFEST holds every blob.
    EMBER_RETURN_NOT_OK(WriteWhole(tmp + "/" + kManifestName, EncodeManifest(m)));
    return Commit(tmp, Join(CheckpointDirName(step)));
  }

  // Writes `data` as the new file `path`: one Append, then Sync, then Close.
  Status WriteWhole(const std::string& path, std::string_view data) {
    EMBER_ASSIGN_OR_RAISE(auto file, fs_->NewWritableFile(path));
    EMBER_RETURN_NOT_OK(file->Append(Bytes(data)));
    if (options_.sync) EMBER_RETURN_NOT_OK(file->Sync());
    return file->Close();
  }

  // Makes `tmp` visible as `final`.  An earlier checkpoint at `final` (the
  // same step saved again) is moved aside first, under a temporary name, so
  // that a crash in between leaves only temporaries besides the older steps.
  Status Commit(const std::string& tmp, const std::string& final_path) EXCLUSIVE_LOCKS_REQUIRED(save_mu_) {
    auto existing = fs_->Stat(final_path);
    if (existing.ok()) {
      const std::string aside = TempPath("replaced");
      EMBER_RETURN_NOT_OK(fs_->Rename(final_path, aside));
      Status st = fs_->Rename(tmp, final_path);
      if (!st.ok()) {
        (void)fs_->Rename(aside, final_path);  // put the old one back if we can
        return st;
      }
      (void)fs_->DeleteRecursively(aside);  // else the next Save's Prune
      return Status::OK();
    }
    if (existing.status().code() != StatusCode::kNotFound) return existing.status();
    return fs_->Rename(tmp, final_path);
  }

  // Deletes all but the newest `keep` complete checkpoints, every temporary,
  // and final-named directories without a valid MANIFEST older than the
  // newest complete one.  Errors are logged: the Save itself succeeded.
  void Prune() EXCLUSIVE_LOCKS_REQUIRED(save_mu_) {
    auto complete = List();
    if (!complete.ok()) {
      EMBER_LOG(WARN) << "checkpoint " << uri_ << ": not deleting old checkpoints: " << complete.status().ToString();
      return;
    }
    std::set<int64_t> kept;
    const size_t n = complete->size(), keep = static_cast<size_t>(options_.keep);
    for (size_t i = 0; i < n; ++i) {
      if (i + keep >= n) {
        kept.insert((*complete)[i].step);
      } else {
        // Out of sight in one step first: a reader sees it whole or not at
        // all, never a directory whose files are half deleted.
        const std::string gone = TempPath("deleted");
        Status st = fs_->Rename((*complete)[i].path, gone);
        if (st.ok()) {
          Remove(gone);
        } else {
          EMBER_LOG(WARN) << "checkpoint: cannot delete " << (*complete)[i].uri << ": " << st.ToString();
        }
      }
    }
    std::set<int64_t> complete_steps;
    for (const auto& c : *complete) complete_steps.insert(c.step);
    const int64_t newest = kept.empty() ? -1 : *kept.rbegin();
    auto entries = fs_->List(dir_);
    if (!entries.ok()) {
      EMBER_LOG(WARN) << "checkpoint " << uri_ << ": not deleting temporaries: " << entries.status().ToString();
      return;
    }
    for (const auto& e : *entries) {
      auto step = StepOfDirName(e.name);
      if (e.name.starts_with(kTempPrefix) || (step && !complete_steps.count(*step) && *step < newest)) {
        Remove(Join(e.name));
      }
    }
  }

  void Remove(const std::string& path) {
    Status st = fs_->DeleteRecursively(path);
    if (!st.ok()) {
      EMBER_LOG(WARN) << "checkpoint: cannot delete " << fs_->Uri(path) << ": " << st.ToString();
    }
  }

  // The checkpoint in directory entry `name`, or nullopt if it is not a
  // complete one.  An error only when the file system fails (not for a
  // missing or invalid MANIFEST): a checkpoint must not look absent because
  // a server did not answer.
  // Sets *gone when the directory itself no longer exists.
  Result<std::optional<CheckpointInfo>> ReadInfo(const std::string& name, bool* gone) const {
    auto step = StepOfDirName(name);
    if (!step) return std::optional<CheckpointInfo>();
    const std::string path = Join(name);
    const std::string manifest_path = path + "/" + kManifestName;
    auto size = fs_->Stat(manifest_path);
    if (!size.ok()) {
      if (size.status().code() != StatusCode::kNotFound) return size.status();
      auto dir = fs_->Stat(path);
      if (!dir.ok() && dir.status().code() == StatusCode::kNotFound) *gone = true;
      return std::optional<CheckpointInfo>();
    }
    if (size->is_dir || size->size > kMaxManifestBytes) return std::optional<CheckpointInfo>();
    auto bytes = fs::ReadFile(*fs_, manifest_path);
    if (!bytes.ok()) {
      if (bytes.status().code() != StatusCode::kNotFound) return bytes.status();
      *gone = true;
      return std::optional<CheckpointInfo>();
    }
    auto m = ParseManifest(*bytes, fs_->Uri(manifest_path));
    if (!m.ok() || m->step != *step) {
      EMBER_LOG(DEBUG) << "not a complete checkpoint: " << fs_->Uri(path) << ": "
                       << (m.ok() ? "its MANIFEST names step " + std::to_string(m->step) : m.status().ToString());
      return std::optional<CheckpointInfo>();
    }
    return std::optional<CheckpointInfo>(CheckpointInfo{*step, path, fs_->Uri(path), std::move(m->blobs)});
  }

  Result<Checkpoint> ReadVerified(const CheckpointInfo& info) const {
    Checkpoint out;
    out.step = info.step;
    out.uri = info.uri;
    for (const BlobInfo& b : info.blobs) {
      const std::string path = info.path + "/" + b.name;
      const std::string uri = fs_->Uri(path);
      auto data = fs::ReadFile(*fs_, path);
      if (!data.ok()) {
        if (data.status().code() == StatusCode::kNotFound) {
          return Status::Corruption(uri + ": checkpoint blob missing (listed in its MANIFEST)");
        }
        return data.status();
      }
      if (data->size() != b.size) {
        return Status::Corruption(uri + ": checkpoint blob has " + std::to_string(data->size()) +
                                  " bytes, its MANIFEST says " + std::to_string(b.size));
      }
      if (crc32c::Value(*data) != b.crc32c) {
        return Status::Corruption(uri + ": checkpoint blob fails its CRC32C check (damaged after it was saved)");
      }
      out.blobs.emplace(b.name, std::move(*data));
    }
    return out;
  }

  // True if `c`'s directory is gone (or no longer complete).
  bool Vanished(const CheckpointInfo& c) const {
    auto st = fs_->Stat(c.path + "/" + kManifestName);
    return !st.ok() && st.status().code() == StatusCode::kNotFound;
  }

  const std::shared_ptr<fs::FileSystem> fs_;
  const std::string dir_;
  const std::string uri_;
  const CheckpointOptions options_;
  const uint64_t salt_;
  Mutex save_mu_;  // one Save at a time
  uint64_t temps_ GUARDED_BY(save_mu_) = 0;
};

Result<std::unique_ptr<CheckpointManager>> CheckpointManager::Open(std::shared_ptr<fs::FileSystem> fs,
                                                                   const std::string& dir,
                                                                   CheckpointOptions options) {
  if (!fs) return Status::InvalidArgument("CheckpointManager::Open: no file system");
  if (options.keep < 1) {
    return Status::InvalidArgument("checkpoint " + fs->Uri(dir) + ": keep must be at least 1, not " +
                                   std::to_string(options.keep));
  }
  std::string d = dir;
  while (d.size() > 1 && d.back() == '/') d.pop_back();
  Status st = fs->CreateDir(d);
  if (!st.ok()) return st.WithContext("creating checkpoint directory " + fs->Uri(d));
  return std::unique_ptr<CheckpointManager>(
      new CheckpointManager(std::make_unique<Impl>(std::move(fs), std::move(d), options)));
}

CheckpointManager::CheckpointManager(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
CheckpointManager::~CheckpointManager() = default;

Status CheckpointManager::Save(int64_t step, std::span<const BlobRef> blobs) { return impl_->Save(step, blobs); }
Result<std::vector<CheckpointInfo>> CheckpointManager::List() const { return impl_->List(); }
Result<std::optional<CheckpointInfo>> CheckpointManager::Latest() const {
  EMBER_ASSIGN_OR_RAISE(auto all, impl_->List());
  if (all.empty()) return std::optional<CheckpointInfo>();
  return std::optional<CheckpointInfo>(std::move(all.back()));
}
Result<Checkpoint> CheckpointManager::Restore(const RestoreOptions& options) const { return impl_->Restore(options); }
const std::string& CheckpointManager::uri() const { return impl_->uri(); }

}  // namespace ember::checkpoint
