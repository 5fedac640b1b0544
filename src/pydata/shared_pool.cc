#include "stoker/pydata/shared_pool.h"

#include <utility>

#include "stoker/errors.h"

namespace stoker::python {
namespace {

constexpr size_t kPage = 4096;

size_t arena_bytes(size_t buffer_bytes, size_t budget_bytes) {
  if (buffer_bytes == 0 || buffer_bytes > budget_bytes)
    throw InvalidArgument("SharedPool: need 0 < buffer_bytes <= budget_bytes");
  return budget_bytes / buffer_bytes * ((buffer_bytes + kPage - 1) / kPage * kPage);
}

}  // namespace

SharedPool::SharedPool(size_t buffer_bytes, size_t budget_bytes, bool pinned)
    : arena_(SharedArena::create(arena_bytes(buffer_bytes, budget_bytes))),
      pool_(BatchPool::create_shared(buffer_bytes, budget_bytes, arena_,
                                     pinned ? MemoryKind::kPinned : MemoryKind::kPageable)) {}

std::shared_ptr<Lease> SharedPool::acquire(std::chrono::milliseconds timeout) {
  Buffer b = pool_->acquire_for(std::stop_token(), timeout);
  if (!b) return nullptr;
  auto lease = std::make_shared<Lease>();
  lease->offset = arena_->offset_of(b.get());
  std::byte* data = b.get();
  if (pinned()) {  // registered pages stay mapped: the buffer goes back as it is
    lease->buffer = std::move(b);
    return lease;
  }
  lease->buffer = Buffer(
      data, [inner = std::move(b), arena = arena_, offset = lease->offset,
             bytes = pool_->buffer_bytes()](std::byte*) { arena->drop_pages(offset, bytes); });
  return lease;
}

}  // namespace stoker::python
