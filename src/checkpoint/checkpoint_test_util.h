// Helpers of the checkpoint gtests.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "ember/checkpoint.h"
#include "ember/fs.h"

namespace ember::checkpoint::testing {

using Blobs = std::map<std::string, std::string>;

// Saves `blobs` (by name) as `step`.
inline Status SaveMap(CheckpointManager& m, int64_t step, const Blobs& blobs) {
  std::vector<BlobRef> refs;
  for (const auto& [name, data] : blobs) refs.push_back(BlobRef{name, data});
  return m.Save(step, refs);
}

// The steps List() returns, oldest first (empty on error, which fails the test).
inline std::vector<int64_t> Steps(const CheckpointManager& m) {
  std::vector<int64_t> out;
  auto all = m.List();
  EXPECT_TRUE(all.ok()) << all.status().ToString();
  if (all.ok()) {
    for (const auto& c : *all) out.push_back(c.step);
  }
  return out;
}

// Writes a whole file directly (debris a crashed process could leave).
inline void WriteFile(fs::FileSystem& fs, const std::string& path, const std::string& data) {
  auto f = fs.NewWritableFile(path);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  ASSERT_TRUE((*f)->Append({reinterpret_cast<const uint8_t*>(data.data()), data.size()}).ok());
  ASSERT_TRUE((*f)->Close().ok());
}

}  // namespace ember::checkpoint::testing
