#include "core/weight_buffer.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/error.h"

namespace gemma4rt::detail {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;
// Below this a buffer keeps to ordinary aligned memory: a huge page would be mostly empty.
constexpr size_t kHugePageThreshold = size_t{1} << 20;

size_t mapped_bytes(size_t bytes) { return (bytes + kPage - 1) / kPage * kPage; }

}  // namespace

void* allocate_weight_storage(size_t count, size_t element_bytes, const char* what) {
  // Half the address space is more than any system maps, and keeps the page rounding below from wrapping.
  if (element_bytes != 0 && count > std::numeric_limits<size_t>::max() / 2 / element_bytes) {
    fail("out of memory allocating {} elements of {} bytes for {}: more than the address space", count, element_bytes, what);
  }
  const size_t bytes = count * element_bytes;
  if (bytes < kHugePageThreshold) {
    void* pointer = std::aligned_alloc(64, (bytes + 63) / 64 * 64);
    if (pointer == nullptr) fail("out of memory allocating {} bytes for {}", bytes, what);
    return pointer;
  }
  // Map a huge page more than needed, keep the 2 MiB-aligned part and give back the rest, so every
  // whole 2 MiB of the buffer can be one huge page.
  const size_t size = mapped_bytes(bytes);
  void* reserved = ::mmap(nullptr, size + kHugePage, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (reserved == MAP_FAILED) fail("out of memory allocating {} bytes for {}: {}", bytes, what, std::strerror(errno));
  const auto start = reinterpret_cast<uintptr_t>(reserved);
  const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > start) ::munmap(reserved, aligned - start);
  const uintptr_t end = start + size + kHugePage;
  if (end > aligned + size) ::munmap(reinterpret_cast<void*>(aligned + size), end - (aligned + size));
  // Advice only: without transparent huge pages the buffer simply stays on ordinary pages.
  ::madvise(reinterpret_cast<void*>(aligned), size, MADV_HUGEPAGE);
  return reinterpret_cast<void*>(aligned);
}

void free_weight_storage(void* pointer, size_t bytes) {
  if (pointer == nullptr) return;
  if (bytes < kHugePageThreshold) return std::free(pointer);
  ::munmap(pointer, mapped_bytes(bytes));
}

}  // namespace gemma4rt::detail
