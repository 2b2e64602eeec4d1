// RAII handles for POSIX shared memory (shm_open(3)) and memory mappings
// (mmap(2)).  Arrow's style: one class per OS handle, move-only, with an
// idempotent Close(); nothing here knows what the bytes mean (the shm ring
// in transport/shm/ does).
//
// Neither class is thread-safe: one owner at a time, as for Fd.
#pragma once

#include <cstddef>
#include <string>

#include "common/fd.h"
#include "ember/result.h"

namespace ember {

// One named shared-memory object.  The creator is its owner: the name is
// removed by Unlink() or, at the latest, by the owner's destructor, so a
// failed setup never leaves a stray /dev/shm entry.  An opener never
// unlinks.  Closing the descriptor does not affect mappings made from it.
class SharedMemory {
 public:
  SharedMemory() = default;
  ~SharedMemory();
  SharedMemory(SharedMemory&& other) noexcept;
  SharedMemory& operator=(SharedMemory&& other) noexcept;
  SharedMemory(const SharedMemory&) = delete;
  SharedMemory& operator=(const SharedMemory&) = delete;

  // Creates `name` ("/name", see shm_open(3)) exclusively with mode 0600 and
  // sizes it to `bytes`.  AlreadyExists if the name exists; IOError (naming
  // the segment) if it cannot be created or sized, in which case nothing is
  // left behind.
  static Result<SharedMemory> Create(const std::string& name, size_t bytes);

  // Opens an existing object read-write.  NotFound if there is none.
  // size() is its current size.
  static Result<SharedMemory> Open(const std::string& name);

  const std::string& name() const { return name_; }
  int fd() const { return fd_.get(); }
  size_t size() const { return size_; }
  bool owner() const { return owner_; }

  // Closes the descriptor.  Idempotent.
  Status Close() { return fd_.Close(); }

  // Owner: removes the name (already-removed is OK).  Opener: no-op.
  // Idempotent; existing mappings stay valid.
  Status Unlink();

 private:
  SharedMemory(std::string name, Fd fd, size_t size, bool owner)
      : name_(std::move(name)), fd_(std::move(fd)), size_(size), owner_(owner) {}

  std::string name_;
  Fd fd_;
  size_t size_ = 0;
  bool owner_ = false;  // true until Unlink() succeeded
};

// One mapping (read-write MAP_SHARED, or a read-only file's), unmapped on
// Close() or destruction.
class Mapping {
 public:
  Mapping() = default;
  ~Mapping() { (void)Close(); }
  Mapping(Mapping&& other) noexcept;
  Mapping& operator=(Mapping&& other) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;

  // Maps `bytes` of `fd` from offset 0.  IOError naming `what` on failure.
  static Result<Mapping> Map(int fd, size_t bytes, const std::string& what);
  // Maps `bytes` (> 0) of a file opened for reading, read-only, for one
  // front-to-back pass (MADV_SEQUENTIAL: the kernel reads ahead).
  static Result<Mapping> MapFileReadOnly(int fd, size_t bytes, const std::string& what);

  void* data() const { return data_; }
  size_t size() const { return size_; }
  bool valid() const { return data_ != nullptr; }

  // Unmaps.  Idempotent.
  Status Close();

  // Gives up ownership without unmapping: the memory stays mapped for the
  // life of the process.  For memory that may still be referenced from
  // outside this object's control (e.g. a robust mutex another thread holds).
  void* Leak();

 private:
  Mapping(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Removes the name of segment `name` (shm_unlink); mappings of it live on
// until unmapped.  OK if there is no such name.  For the last party to open
// a segment by name: once every mapping exists, the name is only a leak
// waiting for a process to die before its owner unlinks it.
Status UnlinkSharedMemoryName(const std::string& name);

}  // namespace ember
