#include "core/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

namespace gemma4rt {

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("{}: cannot open: {}", path.string(), std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int saved = errno;
    ::close(fd);
    fail("{}: cannot stat: {}", path.string(), std::strerror(saved));
  }
  size_ = static_cast<size_t>(info.st_size);
  if (size_ > 0) {
    void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (mapping == MAP_FAILED) {
      const int saved = errno;
      ::close(fd);
      fail("{}: cannot mmap {} bytes: {}", path.string(), size_, std::strerror(saved));
    }
    data_ = static_cast<const std::byte*>(mapping);
    // Pages read in through this mapping come in huge folios the kernel maps whole, so decode, which
    // streams every weight each token, needs a TLB entry per 2 MiB of checkpoint instead of per 4 KiB
    // (pages already cached keep the size they were read with, and the CPU backend copies the weights it
    // would read in place where memory allows: prepared_weight.cc). Advice only: ignored where unsupported.
    ::madvise(mapping, size_, MADV_HUGEPAGE);
  }
  ::close(fd);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::byte*>(data_), size_);
}

}  // namespace gemma4rt
