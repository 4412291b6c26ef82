// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// An asymmetric fence for the store-then-load pattern (Dekker) between a frequent and a rare
/// thread of one process. Not for applications.

#include <atomic>

namespace lavaflow::detail {

/// Two threads each store a flag and then load the other's: a fence between the store and the
/// load on both sides makes one of them see the other. Where one side runs rarely (admitting a
/// consumer, closing a pool) and the other on every message or return, the rare side fences every
/// thread of the process with membarrier(), and the frequent side's fence is a compiler fence
/// only. Where the kernel (or a seccomp filter) refuses membarrier, both sides fence themselves.
class ProcessFence {
 public:
  /// Registers the process for expedited membarrier (idempotent).
  ProcessFence() noexcept;

  /// The frequent side, between its store and its load.
  void light() const noexcept {
    if (expedited_)
      std::atomic_signal_fence(std::memory_order_seq_cst);
    else
      std::atomic_thread_fence(std::memory_order_seq_cst);
  }

  /// The rare side, between its store and its load. False when no fence could be made (the
  /// kernel refused a membarrier it had accepted the registration for): the caller must not rely
  /// on the other side's store being seen.
  [[nodiscard]] bool heavy() const noexcept;

  /// Whether the light side is a compiler fence only.
  [[nodiscard]] bool expedited() const noexcept { return expedited_; }

 private:
  bool expedited_ = false;
};

}  // namespace lavaflow::detail
