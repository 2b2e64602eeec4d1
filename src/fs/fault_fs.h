// FaultInjectionFileSystem: wraps a FileSystem and makes chosen operations
// fail, for tests of code that must survive failed writes and crashes
// (AtomicWriteFile, checkpoints).  LevelDB's FaultInjectionTestEnv is the
// model: it remembers how much of each file was Sync()ed and, on a
// simulated crash, drops the rest.
//
//   auto base = NewMemoryFileSystem();
//   FaultInjectionFileSystem fault(base);
//   fault.FailNth(FaultOp::kRename, 1);     // the next Rename fails
//   fault.FailAppendAfterBytes(10);         // a torn write: a file keeps 10 bytes
//   ...; fault.Crash();                     // drops bytes not Sync()ed
//
// Injected failures are IOError with "injected" in the message.  Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common/mutex.h"
#include "common/thread_annotations.h"
#include "ember/fs.h"

namespace ember::fs {

enum class FaultOp { kAppend, kSync, kClose, kRename };

class FaultInjectionFileSystem final : public FileSystem {
 public:
  explicit FaultInjectionFileSystem(std::shared_ptr<FileSystem> base);
  ~FaultInjectionFileSystem() override;

  // The n-th call (1: the next one) of `op` from now fails; the call does
  // nothing to the base file system.  Replaces an earlier FailNth of `op`.
  void FailNth(FaultOp op, int n);
  // An Append that would take any file past `k` bytes writes only up to `k`
  // bytes and fails (a torn write); the file holds that prefix.  One-shot.
  void FailAppendAfterBytes(uint64_t k);
  // Clears every pending fault.
  void ClearFaults();

  // A simulated crash: every file open for writing is closed (its later
  // calls fail), and each file written through this file system since it was
  // made is cut to what was Sync()ed (a file never synced is deleted).
  // Renames are kept (as if the directory were synced).
  Status Crash();

  // How many calls of `op` were made (failed ones included).
  int count(FaultOp op) const;

  Result<std::unique_ptr<SequentialFile>> NewSequentialFile(const std::string& path) override;
  Result<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(const std::string& path) override;
  Result<std::unique_ptr<WritableFile>> NewWritableFile(const std::string& path) override;
  Result<FileInfo> Stat(const std::string& path) override;
  Result<std::vector<FileInfo>> List(const std::string& path) override;
  Status CreateDir(const std::string& path) override;
  Status Delete(const std::string& path) override;
  Status DeleteRecursively(const std::string& path) override;
  Status Rename(const std::string& from, const std::string& to) override;
  std::string scheme() const override { return base_->scheme(); }
  std::string Uri(const std::string& path) const override { return base_->Uri(path); }

 private:
  class File;
  friend class File;

  struct Written {
    uint64_t synced = 0;   // bytes made durable by Sync
    bool ever_synced = false;
  };

  // Counts a call of `op`; an IOError if it is the one to fail.
  Status Check(FaultOp op, const std::string& path);
  // For an Append of `n` bytes to a file holding `size`: how many to write
  // before failing (n when no torn write is due).
  uint64_t TornLimit(uint64_t size, uint64_t n);
  void Synced(const std::string& path, uint64_t size);
  void Opened(File* f);
  void Gone(File* f);

  const std::shared_ptr<FileSystem> base_;
  mutable Mutex mu_;
  std::map<FaultOp, int> calls_ GUARDED_BY(mu_);
  std::map<FaultOp, int> fail_at_ GUARDED_BY(mu_);  // call number that fails
  int64_t torn_after_ GUARDED_BY(mu_) = -1;          // -1: none
  std::map<std::string, Written> written_ GUARDED_BY(mu_);  // by path
  std::set<File*> open_ GUARDED_BY(mu_);
};

}  // namespace ember::fs
