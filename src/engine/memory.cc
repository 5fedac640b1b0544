#include "stoker/memory.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <new>

#include "stoker/cuda/cuda.h"

namespace stoker {

void* allocate_host(MemoryKind kind, size_t bytes) {
  if (kind == MemoryKind::kPinned) return cuda::alloc_pinned(bytes);
  constexpr size_t kAlign = 4096;
  void* ptr = std::aligned_alloc(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  if (ptr == nullptr) throw std::bad_alloc();
  return ptr;
}

void free_host(MemoryKind kind, void* ptr, size_t bytes) {
  if (ptr == nullptr) return;
  if (kind == MemoryKind::kPinned)
    cuda::free_pinned(ptr, bytes);
  else
    std::free(ptr);
}

size_t physical_memory_bytes() {
  return static_cast<size_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

int usable_cores() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace stoker
