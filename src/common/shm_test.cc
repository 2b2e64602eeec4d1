#include "common/shm.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

namespace ember {
namespace {

std::string UniqueName() {
  static std::atomic<int> counter{0};
  return "/ember-shm-test-" + std::to_string(getpid()) + "-" + std::to_string(counter++);
}

bool NameExists(const std::string& name) {
  const int fd = ::shm_open(name.c_str(), O_RDONLY | O_CLOEXEC, 0);
  if (fd < 0) return false;
  ::close(fd);
  return true;
}

TEST(SharedMemoryTest, CreateMapOpenShareTheBytes) {
  const std::string name = UniqueName();
  auto owner = SharedMemory::Create(name, 8192);
  ASSERT_TRUE(owner.ok()) << owner.status().ToString();
  EXPECT_TRUE(owner->owner());
  EXPECT_EQ(owner->size(), 8192u);
  auto a = Mapping::Map(owner->fd(), owner->size(), name);
  ASSERT_TRUE(a.ok()) << a.status().ToString();
  std::memcpy(a->data(), "ember", 6);

  auto opener = SharedMemory::Open(name);
  ASSERT_TRUE(opener.ok()) << opener.status().ToString();
  EXPECT_FALSE(opener->owner());
  EXPECT_EQ(opener->size(), 8192u);
  auto b = Mapping::Map(opener->fd(), opener->size(), name);
  ASSERT_TRUE(b.ok());
  EXPECT_STREQ(static_cast<const char*>(b->data()), "ember");
  // Closing the descriptors leaves the mappings usable.
  EXPECT_TRUE(owner->Close().ok());
  EXPECT_TRUE(opener->Close().ok());
  EXPECT_TRUE(opener->Close().ok());
  static_cast<char*>(b->data())[0] = 'E';
  EXPECT_STREQ(static_cast<const char*>(a->data()), "Ember");
}

TEST(SharedMemoryTest, CreateIsExclusive) {
  const std::string name = UniqueName();
  auto first = SharedMemory::Create(name, 4096);
  ASSERT_TRUE(first.ok());
  auto second = SharedMemory::Create(name, 4096);
  EXPECT_EQ(second.status().code(), StatusCode::kAlreadyExists);
  EXPECT_NE(second.status().message().find(name), std::string::npos) << second.status().ToString();
  EXPECT_TRUE(NameExists(name));  // the failed Create did not unlink the first one's name
}

TEST(SharedMemoryTest, OpenOfMissingNameIsNotFound) {
  auto missing = SharedMemory::Open(UniqueName());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status().ToString();
}

TEST(SharedMemoryTest, OwnerUnlinksOnDestructionOpenerNever) {
  const std::string name = UniqueName();
  {
    auto owner = SharedMemory::Create(name, 4096);
    ASSERT_TRUE(owner.ok());
    {
      auto opener = SharedMemory::Open(name);
      ASSERT_TRUE(opener.ok());
      EXPECT_TRUE(opener->Unlink().ok());  // no-op for an opener
    }
    EXPECT_TRUE(NameExists(name));
  }
  EXPECT_FALSE(NameExists(name));
}

TEST(SharedMemoryTest, UnlinkIsIdempotentAndMovesCarryOwnership) {
  const std::string name = UniqueName();
  auto created = SharedMemory::Create(name, 4096);
  ASSERT_TRUE(created.ok());
  SharedMemory moved = created.MoveValueUnsafe();
  SharedMemory target;
  target = std::move(moved);
  EXPECT_FALSE(moved.owner());  // NOLINT(bugprone-use-after-move): moved-from is defined here
  EXPECT_TRUE(target.owner());
  EXPECT_TRUE(NameExists(name));
  EXPECT_TRUE(target.Unlink().ok());
  EXPECT_FALSE(NameExists(name));
  EXPECT_TRUE(target.Unlink().ok());
  // Someone else's segment of the same name is not ours to remove.
  auto other = SharedMemory::Create(name, 4096);
  ASSERT_TRUE(other.ok());
  EXPECT_TRUE(target.Unlink().ok());
  EXPECT_TRUE(NameExists(name));
}

TEST(MappingTest, CloseIsIdempotentMoveOnlyAndLeakKeepsTheMemory) {
  auto shm = SharedMemory::Create(UniqueName(), 4096);
  ASSERT_TRUE(shm.ok());
  auto mapped = Mapping::Map(shm->fd(), 4096, "test");
  ASSERT_TRUE(mapped.ok());
  Mapping m = mapped.MoveValueUnsafe();
  EXPECT_TRUE(m.valid());
  Mapping n(std::move(m));
  EXPECT_FALSE(m.valid());  // NOLINT(bugprone-use-after-move)
  EXPECT_TRUE(m.Close().ok());
  EXPECT_EQ(n.size(), 4096u);
  EXPECT_TRUE(n.Close().ok());
  EXPECT_FALSE(n.valid());
  EXPECT_TRUE(n.Close().ok());

  auto again = Mapping::Map(shm->fd(), 4096, "test");
  ASSERT_TRUE(again.ok());
  void* p = again->Leak();
  EXPECT_FALSE(again->valid());
  static_cast<char*>(p)[0] = 1;  // still mapped
  EXPECT_EQ(::munmap(p, 4096), 0);
}

TEST(MappingTest, MapFailureNamesWhat) {
  auto bad = Mapping::Map(-1, 4096, "segment /x");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("segment /x"), std::string::npos) << bad.status().ToString();
}

}  // namespace
}  // namespace ember
