// A checkpoint's MANIFEST and the names in a checkpoint directory
// (include/ember/checkpoint.h).  The MANIFEST is text, one record per line,
// so a person can read it with `cat` / `hdfs dfs -cat`:
//
//   ember-checkpoint 1
//   step 42
//   blob model.npz 1048576 1a2b3c4d
//   blob optimizer.npz 2048 0badf00d
//   crc 89abcdef
//
// Blob lines are sorted by name, sizes decimal, CRC32Cs 8 lower-case hex
// digits; the last line is the CRC32C of every byte before it, so a torn or
// damaged MANIFEST never parses.  ParseManifest reads untrusted bytes (a file
// anyone could have written): it accepts exactly what EncodeManifest writes
// and fuzzing covers it (manifest_fuzz.cc).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "ember/checkpoint.h"
#include "ember/result.h"

namespace ember::checkpoint {

inline constexpr char kManifestName[] = "MANIFEST";
inline constexpr size_t kMaxManifestBytes = 1 << 20;  // a MANIFEST larger than this is refused
inline constexpr size_t kMaxBlobNameLength = 128;

struct Manifest {
  int64_t step = 0;
  std::vector<BlobInfo> blobs;  // sorted by name, names unique
};

// True if `name` may name a blob (see BlobRef).
bool ValidBlobName(std::string_view name);

// `m` as MANIFEST bytes.  `m.blobs` must be sorted by name with valid,
// unique names and m.step >= 0.
std::string EncodeManifest(const Manifest& m);

// The manifest in `bytes`, or Corruption naming `uri` and what is wrong.
Result<Manifest> ParseManifest(std::string_view bytes, const std::string& uri);

// "ckpt-0000000042": a complete checkpoint's directory name (the step,
// at least 10 digits, zero-padded so names sort by step).
std::string CheckpointDirName(int64_t step);

// The step of a final directory name, or nullopt for any other name (only
// the exact form CheckpointDirName writes is accepted).
std::optional<int64_t> StepOfDirName(std::string_view name);

// Temporary directories start with this prefix (hidden: Glob skips them).
inline constexpr char kTempPrefix[] = ".tmp-ckpt-";

}  // namespace ember::checkpoint
