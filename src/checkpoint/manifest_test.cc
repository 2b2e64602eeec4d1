// The MANIFEST format and the directory names (checkpoint/manifest.h).
#include "checkpoint/manifest.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include "common/crc32c.h"

namespace ember::checkpoint {
namespace {

Manifest Sample() {
  Manifest m;
  m.step = 42;
  m.blobs = {{"model.npz", 1048576, 0x1a2b3c4d}, {"optimizer.npz", 0, 0}, {"z_meta", 7, 0xffffffff}};
  return m;
}

TEST(Manifest, RoundTrips) {
  const std::string bytes = EncodeManifest(Sample());
  EXPECT_TRUE(bytes.starts_with("ember-checkpoint 1\nstep 42\nblob model.npz 1048576 1a2b3c4d\n")) << bytes;
  auto m = ParseManifest(bytes, "mem:///c/MANIFEST");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->step, 42);
  ASSERT_EQ(m->blobs.size(), 3u);
  EXPECT_EQ(m->blobs[0].name, "model.npz");
  EXPECT_EQ(m->blobs[0].size, 1048576u);
  EXPECT_EQ(m->blobs[0].crc32c, 0x1a2b3c4du);
  EXPECT_EQ(m->blobs[2].crc32c, 0xffffffffu);
  Manifest empty;
  EXPECT_TRUE(ParseManifest(EncodeManifest(empty), "u").ok());
}

TEST(Manifest, EveryTruncationIsRefused) {
  const std::string bytes = EncodeManifest(Sample());
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto m = ParseManifest(bytes.substr(0, n), "mem:///c/MANIFEST");
    ASSERT_FALSE(m.ok()) << "prefix of " << n << " bytes parsed";
    EXPECT_EQ(m.status().code(), StatusCode::kCorruption);
    EXPECT_NE(m.status().message().find("mem:///c/MANIFEST"), std::string::npos) << m.status().ToString();
  }
}

TEST(Manifest, EveryChangedByteIsRefused) {
  const std::string bytes = EncodeManifest(Sample());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (int bit = 0; bit < 8; ++bit) {
      std::string bad = bytes;
      bad[i] = static_cast<char>(bad[i] ^ (1 << bit));
      EXPECT_FALSE(ParseManifest(bad, "u").ok()) << "byte " << i << " bit " << bit;
    }
  }
}

TEST(Manifest, RefusesWhatEncodeNeverWrites) {
  // Invalid bodies under a valid checksum line: each must still be refused.
  for (const std::string& body : {
           std::string("ember-checkpoint 2\nstep 1\n"),
           std::string("ember-checkpoint 1\nstep -1\n"),
           std::string("ember-checkpoint 1\nstep 01\n"),
           std::string("ember-checkpoint 1\nstep 99999999999999999999\n"),
           std::string("ember-checkpoint 1\n"),
           std::string("ember-checkpoint 1\nstep 1\nblob ../x 1 00000000\n"),
           std::string("ember-checkpoint 1\nstep 1\nblob MANIFEST 1 00000000\n"),
           std::string("ember-checkpoint 1\nstep 1\nblob b 1 00000000\nblob a 1 00000000\n"),
           std::string("ember-checkpoint 1\nstep 1\nblob a 1 00000000\nblob a 1 00000000\n"),
           std::string("ember-checkpoint 1\nstep 1\nblob a +1 00000000\n"),
           std::string("ember-checkpoint 1\nstep 1\nblob a 1 0000000G\n"),
           std::string("ember-checkpoint 1\nstep 1\nblob a 1 00000000 extra\n"),
           std::string("ember-checkpoint 1\nstep  1\n"),
       }) {
    char line[32];
    std::snprintf(line, sizeof(line), "crc %08x\n", crc32c::Value(body));
    auto r = ParseManifest(body + line, "u");
    EXPECT_FALSE(r.ok()) << body;
    EXPECT_EQ(r.status().code(), StatusCode::kCorruption);
  }
  // The same check accepts a valid body signed this way (the test's signing is right).
  const std::string good = "ember-checkpoint 1\nstep 1\nblob a 1 00000000\n";
  char line[32];
  std::snprintf(line, sizeof(line), "crc %08x\n", crc32c::Value(good));
  EXPECT_TRUE(ParseManifest(good + line, "u").ok());
}

TEST(DirNames, OneNamePerStep) {
  EXPECT_EQ(CheckpointDirName(42), "ckpt-0000000042");
  EXPECT_EQ(CheckpointDirName(12345678901LL), "ckpt-12345678901");
  EXPECT_EQ(StepOfDirName("ckpt-0000000042"), 42);
  EXPECT_EQ(StepOfDirName("ckpt-12345678901"), 12345678901LL);
  EXPECT_EQ(StepOfDirName("ckpt-42"), std::nullopt);
  EXPECT_EQ(StepOfDirName("ckpt-00000000042"), std::nullopt);
  EXPECT_EQ(StepOfDirName("ckpt-00000000-1"), std::nullopt);
  EXPECT_EQ(StepOfDirName(".tmp-ckpt-42-1-2-3"), std::nullopt);
  EXPECT_EQ(StepOfDirName("ckpt-000000004x"), std::nullopt);
}

TEST(BlobNames, Valid) {
  EXPECT_TRUE(ValidBlobName("model.npz"));
  EXPECT_TRUE(ValidBlobName("a-b_C.9"));
  EXPECT_FALSE(ValidBlobName(""));
  EXPECT_FALSE(ValidBlobName(".hidden"));
  EXPECT_FALSE(ValidBlobName("MANIFEST"));
  EXPECT_FALSE(ValidBlobName("a/b"));
  EXPECT_FALSE(ValidBlobName("a b"));
  EXPECT_FALSE(ValidBlobName(std::string(129, 'a')));
  EXPECT_TRUE(ValidBlobName(std::string(128, 'a')));
}

}  // namespace
}  // namespace ember::checkpoint
