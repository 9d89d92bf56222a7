// How much memory the host can still give, for decisions such as copying weights out of a checkpoint's
// memory map, which must never leave the system short.
#pragma once

#include <cstdint>

namespace gemma4rt {

// MemAvailable of /proc/meminfo in bytes (free memory plus what the kernel can reclaim, such as cached
// file pages); 0 where there is none to read.
uint64_t available_host_memory();

// Memory a load leaves free for everything else when it takes some for copies it could do without.
constexpr uint64_t kHostMemoryReserve = uint64_t{2} << 30;

}  // namespace gemma4rt
