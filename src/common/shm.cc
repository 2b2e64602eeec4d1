#include "common/shm.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace ember {

SharedMemory::~SharedMemory() {
  (void)Close();
  (void)Unlink();
}

SharedMemory::SharedMemory(SharedMemory&& other) noexcept
    : name_(std::move(other.name_)),
      fd_(std::move(other.fd_)),
      size_(other.size_),
      owner_(std::exchange(other.owner_, false)) {}

SharedMemory& SharedMemory::operator=(SharedMemory&& other) noexcept {
  if (this != &other) {
    (void)Close();
    (void)Unlink();
    name_ = std::move(other.name_);
    fd_ = std::move(other.fd_);
    size_ = other.size_;
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

Result<SharedMemory> SharedMemory::Create(const std::string& name, size_t bytes) {
  Fd fd(::shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  if (!fd.valid()) {
    if (errno == EEXIST) return Status::AlreadyExists("shared memory " + name + " already exists");
    return Status::FromErrno(errno, "shm_open(" + name + ")");
  }
  // Owner from here on: an early return unlinks the name.
  SharedMemory shm(name, std::move(fd), bytes, /*owner=*/true);
  if (::ftruncate(shm.fd(), static_cast<off_t>(bytes)) != 0) {
    return Status::FromErrno(errno, "ftruncate shared memory " + name + " to " + std::to_string(bytes) + " bytes");
  }
  return shm;
}

Result<SharedMemory> SharedMemory::Open(const std::string& name) {
  Fd fd(::shm_open(name.c_str(), O_RDWR | O_CLOEXEC, 0));
  if (!fd.valid()) {
    if (errno == ENOENT) return Status::NotFound("shared memory " + name + " does not exist");
    return Status::FromErrno(errno, "shm_open(" + name + ")");
  }
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return Status::FromErrno(errno, "fstat shared memory " + name);
  return SharedMemory(name, std::move(fd), static_cast<size_t>(st.st_size), /*owner=*/false);
}

Status SharedMemory::Unlink() {
  if (!owner_) return Status::OK();
  owner_ = false;
  if (::shm_unlink(name_.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "shm_unlink(" + name_ + ")");
  }
  return Status::OK();
}

Mapping::Mapping(Mapping&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

Mapping& Mapping::operator=(Mapping&& other) noexcept {
  if (this != &other) {
    (void)Close();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

Result<Mapping> Mapping::Map(int fd, size_t bytes, const std::string& what) {
  // MAP_POPULATE: one call maps every page now.  A ring is reopened by every feeding task
  // and written all over; faulting its pages in one at a time cost more than the copies.
  void* mem = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (mem == MAP_FAILED) return Status::FromErrno(errno, "mmap " + what);
  return Mapping(mem, bytes);
}

Result<Mapping> Mapping::MapFileReadOnly(int fd, size_t bytes, const std::string& what) {
  void* mem = ::mmap(nullptr, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
  if (mem == MAP_FAILED) return Status::FromErrno(errno, "mmap " + what);
  (void)::madvise(mem, bytes, MADV_SEQUENTIAL);  // a hint: its failure changes nothing
  return Mapping(mem, bytes);
}

Status Mapping::Close() {
  void* data = std::exchange(data_, nullptr);
  const size_t size = std::exchange(size_, 0);
  if (data == nullptr) return Status::OK();
  if (::munmap(data, size) != 0) return Status::FromErrno(errno, "munmap");
  return Status::OK();
}

void* Mapping::Leak() {
  size_ = 0;
  return std::exchange(data_, nullptr);
}

Status UnlinkSharedMemoryName(const std::string& name) {
  if (::shm_unlink(name.c_str()) != 0 && errno != ENOENT) {
    return Status::FromErrno(errno, "shm_unlink(" + name + ")");
  }
  return Status::OK();
}

}  // namespace ember
