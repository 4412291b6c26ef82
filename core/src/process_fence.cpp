// SPDX-License-Identifier: MIT
#include "lavaflow/core/detail/process_fence.hpp"

#include <linux/membarrier.h>
#include <sys/syscall.h>
#include <unistd.h>

namespace lavaflow::detail {

ProcessFence::ProcessFence() noexcept
    : expedited_(::syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0) {}

bool ProcessFence::heavy() const noexcept {
  if (!expedited_) {
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
  }
  // The global command is slow (it waits for every CPU to pass a quiescent state) but also fences
  // the light side: a second chance rather than a silent gap.
  return ::syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0 ||
         ::syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL, 0, 0) == 0;
}

}  // namespace lavaflow::detail
