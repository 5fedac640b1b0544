// Host memory for batch buffers: pageable, or pinned (page-locked) for fast copies to a GPU.
//
// Pinned memory comes from the CUDA driver (include/stoker/cuda/cuda.h: libcuda.so.1, loaded at run time):
// Stoker builds and runs without CUDA, and pinned memory is used only when a driver and a device
// are present. It is exactly the bytes asked for (no power-of-two rounding).
//
// Thread safety: all functions are safe to call from any thread.
#pragma once

#include <cstddef>

namespace stoker {

enum class MemoryKind { kPageable, kPinned };

// Allocates `bytes` bytes aligned to 4096. Throws std::bad_alloc on failure, and Error when pinned
// memory is asked for without CUDA.
void* allocate_host(MemoryKind kind, size_t bytes);
// REQUIRES: `ptr` came from allocate_host(kind, bytes).
void free_host(MemoryKind kind, void* ptr, size_t bytes);

// Physical memory of the machine in bytes.
size_t physical_memory_bytes();
// Cores this process may run on (its CPU affinity), at least 1.
int usable_cores();

}  // namespace stoker
