// Checkpoints: a training step's state, saved all-or-nothing to a directory
// on any fs::FileSystem (local, HDFS), the newest K kept, read back verified.
//
// A checkpoint is a step number and a set of named blobs (byte strings:
// model weights, optimizer state, anything the caller serializes).  On disk
// (docs/architecture.md, "Checkpoints"):
//
//   <dir>/ckpt-0000000042/MANIFEST       step, each blob's size and CRC32C
//   <dir>/ckpt-0000000042/<blob name>    the blob's bytes
//   <dir>/.tmp-ckpt-43-<nonce>/...       a Save in progress (or a dead one)
//
// Save writes every blob and then the MANIFEST into a fresh temporary
// directory, syncs each file, and makes the whole checkpoint visible with one
// Rename of that directory to its final name.  Rename is atomic on the local
// file system and on HDFS, so a reader lists a checkpoint complete or not at
// all; a Save that fails at any point (or a process killed during it) leaves
// at most a temporary directory, which readers ignore and the next Save
// deletes.
//
// A checkpoint is *complete* when its directory has its final name and a
// MANIFEST that parses (its own checksum matches) and names the directory's
// step.  Restore also checks every blob's size and CRC32C against the
// MANIFEST, so bytes damaged after the Save are refused (Corruption naming
// the file), never handed to the caller.
//
// One process saves to a directory at a time (the chief); any number of
// processes may List and Restore while it saves.
//
// Thread safety: a CheckpointManager is safe for concurrent use from many
// threads without external synchronization; Saves through one manager run
// one at a time.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ember/fs.h"
#include "ember/result.h"
#include "ember/status.h"

namespace ember::checkpoint {

// Value type.
struct CheckpointOptions {
  // How many complete checkpoints a Save leaves, the newest ones (by step);
  // each successful Save deletes the older ones.  At least 1.
  int keep = 3;
  // Sync every file before the checkpoint is made visible, so a machine that
  // crashes right after Save still has the bytes (on HDFS: the DataNodes
  // hold them).  Off only for tests and scratch directories.
  bool sync = true;
};

// One blob of a Save: its name and its bytes, borrowed for the call.  A name
// is 1 to 128 characters of [A-Za-z0-9._-], not starting with '.', and not
// "MANIFEST"; it is the blob's file name in the checkpoint's directory.
struct BlobRef {
  std::string name;
  std::string_view data;
};

// What a MANIFEST says about one blob.  Value type.
struct BlobInfo {
  std::string name;
  uint64_t size = 0;
  uint32_t crc32c = 0;  // of the blob's bytes (not masked)
};

// One complete checkpoint as listed (its MANIFEST read; blobs not read).
struct CheckpointInfo {
  int64_t step = 0;
  std::string path;             // its directory in the file system
  std::string uri;              // the same as a URI, for messages
  std::vector<BlobInfo> blobs;  // sorted by name
};

// A restored checkpoint: every blob read and verified.
struct Checkpoint {
  int64_t step = 0;
  std::string uri;                           // its directory
  std::map<std::string, std::string> blobs;  // by name
};

// Value type.
struct RestoreOptions {
  // The step to restore; unset: the newest complete checkpoint.
  std::optional<int64_t> step;
  // When the checkpoint chosen fails verification (a blob's size or CRC32C
  // is wrong, a blob file is missing), restore the next older complete one
  // instead, logging a warning that names what was skipped.  Off: return the
  // Corruption.  With `step` set, older means older than that step.
  bool fall_back_to_older = false;
};

class CheckpointManager {
 public:
  // Creates `dir` (and its parents) in `fs` if missing.  Nothing else is
  // read or changed: stale temporaries are deleted by the next Save.
  // InvalidArgument if options.keep < 1; the file system's error (naming
  // the URI) if `dir` cannot be created.  The manager shares ownership of
  // `fs`.
  static Result<std::unique_ptr<CheckpointManager>> Open(std::shared_ptr<fs::FileSystem> fs,
                                                         const std::string& dir,
                                                         CheckpointOptions options = {});

  ~CheckpointManager();
  CheckpointManager(const CheckpointManager&) = delete;
  CheckpointManager& operator=(const CheckpointManager&) = delete;

  // Saves `blobs` as the checkpoint of `step` (>= 0), all-or-nothing; an
  // earlier checkpoint of the same step is replaced.  Then deletes every
  // complete checkpoint but the newest `keep` and every temporary directory
  // left by an earlier Save.
  //
  // On success the checkpoint is complete and listed.  On failure (the
  // file system's error, with context naming the step and the directory's
  // URI) the complete checkpoints are those there were before the call, and
  // the temporary directory is deleted if the file system allows.  A failure
  // while deleting old checkpoints after the commit is only logged: the
  // checkpoint itself is saved.  InvalidArgument for a negative step or an
  // invalid or repeated blob name.
  Status Save(int64_t step, std::span<const BlobRef> blobs);

  // The complete checkpoints, oldest (smallest step) first.  Entries that
  // are not complete checkpoints (temporaries, a directory without a valid
  // MANIFEST, other files) are skipped.  NotFound-free: an empty directory
  // gives an empty list; a missing one too (it may be deleted under us).
  Result<std::vector<CheckpointInfo>> List() const;

  // The newest complete checkpoint, or nullopt when there is none.
  Result<std::optional<CheckpointInfo>> Latest() const;

  // Reads back the checkpoint chosen by `options`, every blob verified
  // against the MANIFEST.  NotFound (naming the directory) when there is no
  // complete checkpoint (of that step); Corruption naming the blob's file
  // when a blob's size or CRC32C does not match or its file is missing.
  // Without a step, a checkpoint deleted while it is read (the saver kept
  // only newer ones) is not an error: the then-newest one is read instead.
  Result<Checkpoint> Restore(const RestoreOptions& options = {}) const;

  // The directory's URI.
  const std::string& uri() const;

 private:
  class Impl;
  explicit CheckpointManager(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace ember::checkpoint
